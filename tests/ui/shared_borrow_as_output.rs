// A shared borrow (`&y`) is read-only: it cannot be a launcher's output.

use cuda_core::DeviceBuffer;

fn write(x: DeviceBuffer<f32>, y: DeviceBuffer<f32>) {
    let _ = kernels::ops::scale(&x, 2.0f32, &y);
}

fn main() {
    let _ = write;
}

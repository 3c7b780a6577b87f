// A buffer moved into an op belongs to the op: it cannot be used again while the GPU may write it.

use cuda_core::DeviceBuffer;

fn write(buf: DeviceBuffer<f32>) {
    let op = kernels::ops::fill(buf, 1.0f32);
    let _ = buf.len();
    drop(op);
}

fn main() {
    let _ = write;
}

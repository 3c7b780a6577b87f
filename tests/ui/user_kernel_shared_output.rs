// A shared borrow cannot be a kernel's output.

use cuda_async::kernel::Launcher;
use cuda_core::DeviceBuffer;

fn build(k: &Launcher<(f32,), (f32,), (u64,)>, x: &DeviceBuffer<f32>, y: &DeviceBuffer<f32>) {
    let _op = k.op((x,), (y,), (4u64,));
}

fn main() {
    let _ = build;
}

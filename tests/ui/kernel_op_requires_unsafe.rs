// `KernelOp::new` (the general form under `Launcher`) carries the same promise: building one
// without `unsafe` must not compile.

use cuda_async::kernel::KernelOp;
use cuda_core::DeviceBuffer;

fn build(x: &DeviceBuffer<f32>, y: &mut DeviceBuffer<f32>) {
    let _op = KernelOp::new("copy", (x,), (y,), |ctx, (x,), (y,)| Ok(y.copy_from_device(ctx.stream(), x)?));
}

fn main() {
    let _ = build;
}

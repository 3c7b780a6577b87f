// Inside a `KernelOp` launch, inputs are `&DeviceBuffer`: writing through one (here a fill, which
// needs `&mut`) does not compile.

use cuda_async::kernel::KernelOp;
use cuda_core::DeviceBuffer;

fn build(x: &DeviceBuffer<f32>, y: &mut DeviceBuffer<f32>) {
    // SAFETY: not reached: this file must not compile.
    let _op = unsafe {
        KernelOp::new("bad", (x,), (y,), |ctx, (x,), (_y,)| {
            x.fill(ctx.stream(), 0.0)?;
            Ok(())
        })
    };
}

fn main() {
    let _ = build;
}

// Positive control: user-kernel launches over existing buffers (borrowed, owned, shared inputs)
// are GraphNodes, also with several outputs, chained with `then`, and from `KernelOp`.
// Compile-only: `main` launches nothing.

use cuda_async::kernel::{KernelOp, Launcher};
use cuda_async::DeviceOpExt;
use cuda_core::DeviceBuffer;
use std::sync::Arc;

fn needs_node<T: cuda_async::GraphNode>(_: T) {}

fn record(
    k: &Launcher<(f32, f32), (f32,), (f32, u64)>,
    two: &Launcher<(f32,), (f32, f64), ()>,
    x: DeviceBuffer<f32>,
    mut y: DeviceBuffer<f32>,
    mut s: DeviceBuffer<f64>,
) {
    needs_node(k.op((&x, &x), (&mut y,), (1.0, 4)));
    needs_node(two.op((&x,), (&mut y, &mut s), ()));
    needs_node(k.op((&x, &x), (&mut y,), (1.0, 4)).then(|(y,)| k.op((&x, &x), (y,), (2.0, 4))));
    // SAFETY: compile-only; the closure copies x into y (a GraphNode-safe copy between existing
    // buffers).
    needs_node(unsafe {
        KernelOp::new("copy", (&x,), (&mut y,), |ctx, (x,), (y,)| Ok(y.copy_from_device(ctx.stream(), x)?))
    });
    let shared = Arc::new(x);
    needs_node(k.op((shared.clone(), shared), (y,), (1.0, 4)));
}

fn main() {
    let _ = record;
}

// Positive control: launchers and copies over existing buffers (borrowed, owned, shared) ARE
// GraphNodes, also chained with `then` and joined with `zip!`. Compile-only: `main` launches
// nothing.

use cuda_async::DeviceOpExt;
use cuda_core::DeviceBuffer;
use kernels::ops;
use std::sync::Arc;

fn needs_node<T: cuda_async::GraphNode>(_: T) {}

fn record(x: DeviceBuffer<f32>, mut y: DeviceBuffer<f32>, mut s: DeviceBuffer<f64>) {
    needs_node(ops::axpy(1.0f32, &x, &mut y));
    needs_node(cuda_async::memory::copy(&x, &mut y));
    needs_node(ops::fill(&mut y, 0.0f32));
    needs_node(ops::scale(&x, 2.0f32, &mut y));
    needs_node(ops::add(&x, &x, &mut y));
    needs_node(ops::mul(&x, &x, &mut y));
    needs_node(ops::sum(&x, &mut s));
    needs_node(ops::axpy(1.0f32, &x, &mut y).then(|y| ops::scale(&x, 3.0f32, y)));
    let joined = cuda_async::zip!(ops::fill(&mut y, 1.0f32), ops::sum(&x, &mut s));
    needs_node(joined.then(|(y, _)| ops::fill(y, 0.0)));
    let shared = Arc::new(x);
    needs_node(ops::mul(shared.clone(), shared, y));
}

fn main() {
    let _ = record;
}

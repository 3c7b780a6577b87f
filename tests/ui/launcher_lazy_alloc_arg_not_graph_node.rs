// A kernel launch is a GraphNode only if every argument op is one: a lazily allocated output
// (`zeros`) hidden inside the launcher makes the whole op a non-GraphNode.

use cuda_core::DeviceBuffer;

fn needs_node<T: cuda_async::GraphNode>(_: T) {}

fn record(x: &DeviceBuffer<f32>) {
    needs_node(kernels::ops::axpy(1.0f32, x, cuda_async::memory::zeros::<f32>(16)));
}

fn main() {
    let _ = record;
}

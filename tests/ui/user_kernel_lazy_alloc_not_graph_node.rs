// A user kernel's launch is a GraphNode only when every argument op is one: a lazily allocated
// output (`zeros`) makes it none, so it cannot be recorded into a graph.

use cuda_async::kernel::Launcher;
use cuda_core::DeviceBuffer;

fn needs_node<T: cuda_async::GraphNode>(_: T) {}

fn build(k: &Launcher<(f32,), (f32,), (u64,)>, x: &DeviceBuffer<f32>) {
    needs_node(k.op((x,), (cuda_async::memory::zeros::<f32>(4),), (4u64,)));
}

fn main() {
    let _ = build;
}

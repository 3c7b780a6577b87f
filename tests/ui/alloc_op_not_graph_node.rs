// An allocating memory op (`zeros`) is not a GraphNode: it cannot be recorded into a graph.

fn needs_node<T: cuda_async::GraphNode>(_: T) {}

fn main() {
    needs_node(cuda_async::memory::zeros::<f32>(16));
}

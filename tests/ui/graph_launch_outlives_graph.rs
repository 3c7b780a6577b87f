// A replay (`Launch`) borrows its graph: it cannot be kept, or run, after the graph is dropped.

use cuda_async::DeviceOpExt;
use cuda_core::{DeviceBuffer, Stream};

fn replay_after_drop(s: &Stream, y: &mut DeviceBuffer<f32>) -> cuda_async::Result<()> {
    let graph = kernels::ops::fill(y, 1.0f32).graph_on(s)?;
    let launch = graph.launch();
    drop(graph);
    launch.sync_on(s)?;
    Ok(())
}

fn main() {
    let _ = replay_after_drop;
}

// `Scope::record` (in `CudaGraph::scope`) and `graph_on` accept only GraphNode ops: an upload into a new buffer
// (`from_host`) allocates, so it cannot be captured.

use cuda_async::{CudaGraph, DeviceOpExt};
use cuda_core::Stream;

fn capture(s: &Stream) -> cuda_async::Result<()> {
    let _graph = CudaGraph::scope(s, |sc| sc.record(cuda_async::memory::from_host(vec![1.0f32])))?;
    let _graph = cuda_async::memory::zeros::<f32>(4).graph_on(s)?;
    Ok(())
}

fn main() {
    let _ = capture;
}

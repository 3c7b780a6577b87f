// A scope records only GraphNode ops: an allocating op (`zeros`) cannot be recorded into a graph.

use cuda_async::CudaGraph;
use cuda_core::Stream;

fn record(s: &Stream) -> cuda_async::Result<()> {
    let _graph = CudaGraph::scope(s, |sc| {
        let _buf = sc.record(cuda_async::memory::zeros::<f32>(4))?;
        Ok(())
    })?;
    Ok(())
}

fn main() {
    let _ = record;
}

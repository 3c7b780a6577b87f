// A replay of a graph is not a GraphNode: it cannot be recorded into another graph's scope.

use cuda_async::CudaGraph;
use cuda_core::Stream;

fn nest(s: &Stream, inner: &CudaGraph<()>) -> cuda_async::Result<()> {
    let _outer = CudaGraph::scope(s, |sc| {
        sc.record(inner.launch())?;
        Ok(())
    })?;
    Ok(())
}

fn main() {
    let _ = nest;
}

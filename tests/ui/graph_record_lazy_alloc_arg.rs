// A launcher whose output is a lazily allocated buffer (`zeros`) is not a GraphNode, so a scope
// cannot record it: the allocation cannot hide inside a kernel argument.

use cuda_async::CudaGraph;
use cuda_core::{DeviceBuffer, Stream};

fn record(s: &Stream, x: &DeviceBuffer<f32>) -> cuda_async::Result<()> {
    let _graph = CudaGraph::scope(s, |sc| {
        let _y = sc.record(kernels::ops::axpy(1.0f32, x, cuda_async::memory::zeros::<f32>(4)))?;
        Ok(())
    })?;
    Ok(())
}

fn main() {
    let _ = record;
}

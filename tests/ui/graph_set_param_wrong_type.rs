// A parameter handle is typed by the kernel parameter it changes: an `f32` factor cannot be set
// to an `f64`.

use cuda_async::CudaGraph;
use cuda_core::{DeviceBuffer, Stream};

fn retune(s: &Stream, x: &DeviceBuffer<f32>, y: &mut DeviceBuffer<f32>) -> cuda_async::Result<()> {
    let graph = CudaGraph::scope(s, |sc| Ok(sc.record_param(kernels::ops::scale(x, 2.0f32, y))?.1))?;
    let handle = graph.output().cloned().expect("handle");
    graph.set_param(&handle, 3.0f64)?;
    Ok(())
}

fn main() {
    let _ = retune;
}

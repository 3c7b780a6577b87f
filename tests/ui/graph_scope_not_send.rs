// A `Scope` belongs to the capturing thread: it is not `Send`, so neither it nor a `&mut` to it can
// move to another thread (work queued there would not be captured, or would break the capture).

use cuda_async::graph::Scope;
use cuda_async::CudaGraph;
use cuda_core::{DeviceBuffer, Stream};

fn assert_send<T: Send>() {}

fn record_from_another_thread(s: &Stream, y: &mut DeviceBuffer<f32>) -> cuda_async::Result<()> {
    let _graph = CudaGraph::scope(s, |sc| {
        std::thread::scope(|t| {
            t.spawn(|| sc.record(kernels::ops::fill(y, 1.0f32)).map(|_| ()));
        });
        Ok(())
    })?;
    Ok(())
}

fn main() {
    assert_send::<Scope<'static>>();
    let _ = record_from_another_thread;
}

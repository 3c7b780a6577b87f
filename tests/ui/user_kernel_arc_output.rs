// An `Arc`-shared buffer can be read by many, so it cannot be a kernel's output: only `&mut` and
// owned buffers (or lazy ops yielding them) are `BufferMut`.

use cuda_async::kernel::Launcher;
use cuda_core::DeviceBuffer;
use std::sync::Arc;

fn build(k: &Launcher<(f32,), (f32,), (u64,)>, x: &DeviceBuffer<f32>, y: Arc<DeviceBuffer<f32>>) {
    let _op = k.op((x,), (y,), (4u64,));
}

fn main() {
    let _ = build;
}

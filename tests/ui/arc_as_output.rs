// An `Arc<DeviceBuffer>` is shared, so it can be read by a kernel but never written to.

use cuda_core::DeviceBuffer;
use std::sync::Arc;

fn write(buf: DeviceBuffer<f32>) {
    let _ = kernels::ops::fill(Arc::new(buf), 1.0f32);
}

fn main() {
    let _ = write;
}

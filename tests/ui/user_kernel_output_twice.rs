// Two outputs of one launch must never alias: the same `&mut` buffer passed twice is refused by
// the borrow checker.

use cuda_async::kernel::Launcher;
use cuda_core::DeviceBuffer;

fn build(k: &Launcher<(), (f32, f32), (u64,)>, y: &mut DeviceBuffer<f32>) {
    let _op = k.op((), (&mut *y, &mut *y), (4u64,));
}

fn main() {
    let _ = build;
}

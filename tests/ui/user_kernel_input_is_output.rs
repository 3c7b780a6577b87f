// One buffer cannot be both an input (read) and an output (written) of a launch: the borrow
// checker refuses `&x` and `&mut x` together.

use cuda_async::kernel::Launcher;
use cuda_core::DeviceBuffer;

fn build(k: &Launcher<(f32,), (f32,), (u64,)>, mut x: DeviceBuffer<f32>) {
    let _op = k.op((&x,), (&mut x,), (4u64,));
}

fn main() {
    let _ = build;
}

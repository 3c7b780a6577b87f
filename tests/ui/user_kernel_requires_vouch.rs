// A user kernel becomes launchable only through `Kernel::vouch`, the one `unsafe` promise that it
// reads only its inputs and writes only its outputs within the lengths its check accepts. Calling
// it without `unsafe` must not compile.

use cuda_async::kernel::{Kernel, Launcher};
use cuda_core::LaunchConfig;

fn main() {
    let k = Kernel::from_ptx("", "twice");
    let _twice: Launcher<(f32,), (f32,), (u64,)> =
        k.vouch(|l| Ok(LaunchConfig::for_elements(l.inputs[0], 256)));
}

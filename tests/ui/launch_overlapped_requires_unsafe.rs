// A programmatic dependent launch may start before the kernel ahead of it has finished: only a
// kernel that waits (`griddepcontrol.wait`) before touching memory may be launched that way, which
// the compiler cannot check. `Function::launch_overlapped` is therefore `unsafe`.

use cuda_core::{Device, LaunchConfig};

fn main() -> cuda_core::Result<()> {
    let dev = Device::new(0)?;
    let s = dev.new_stream()?;
    let m = dev.compile_module("k.cu", "extern \"C\" __global__ void k() {}", &[])?;
    let f = m.function("k")?;
    f.launch_overlapped(&s, LaunchConfig::for_elements(1, 32), (0u32,))?;
    Ok(())
}

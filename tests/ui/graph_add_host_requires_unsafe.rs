// A host node's closure runs inside a CUDA driver callback, where any CUDA call (including the drop
// of a buffer it owns) may deadlock the driver. `add_host` is therefore `unsafe`: safe code cannot
// add one.

use cuda_core::{Device, Graph};

fn main() -> cuda_core::Result<()> {
    let mut g = Graph::new(&Device::new(0)?)?;
    g.builder().add_host(|| {}, &[])?;
    Ok(())
}

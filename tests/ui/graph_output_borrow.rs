// A graph whose output holds `&mut y` keeps `y` mutably borrowed for as long as the graph lives:
// `y` can neither be written through another path nor dropped while the graph can still replay.

use cuda_async::DeviceOpExt;
use cuda_core::{DeviceBuffer, Stream};

fn write_while_captured(s: &Stream, mut y: DeviceBuffer<f32>) -> cuda_async::Result<()> {
    let graph = kernels::ops::fill(&mut y, 1.0f32).graph_on(s)?;
    y.fill(s, 2.0f32)?;
    graph.launch().sync_on(s)?;
    Ok(())
}

fn drop_while_captured(s: &Stream, mut y: DeviceBuffer<f32>) -> cuda_async::Result<()> {
    let graph = kernels::ops::fill(&mut y, 1.0f32).graph_on(s)?;
    drop(y);
    graph.launch().sync_on(s)?;
    Ok(())
}

fn main() {
    let _ = write_while_captured;
    let _ = drop_while_captured;
}

// A fused product reads its input rows while other blocks write the output: the output must not
// be the input. The launchers take inputs by `&` and the output by `&mut`, so passing one buffer
// as both is a borrow error.

use cuda_core::{Device, DeviceBuffer};
use half::bf16;
use kernels::gemv::{Gemv, GemvShape};

fn main() -> cuda_core::Result<()> {
    let s = Device::new(0)?.new_stream()?;
    let g = Gemv::get(s.device())?;
    let w = DeviceBuffer::from_host(&s, &[bf16::ONE; 64])?;
    let mut h = DeviceBuffer::from_host(&s, &[bf16::ONE; 8])?;
    g.residual(&s, &h, &w, &mut h, GemvShape { rows: 1, in_dim: 8, out_dim: 8 })?;
    Ok(())
}

// The decode attention kernel writes the KV cache at slots read from device memory: two rows with
// one slot would race. The caller must promise distinct slots, so `rope_attention` is `unsafe`.

use cuda_core::{Device, DeviceBuffer};
use half::bf16;
use kernels::llama::{AttnBuffers, AttnScratch, AttnShape, LlamaKernels};

fn main() -> cuda_core::Result<()> {
    let s = Device::new(0)?.new_stream()?;
    let k = LlamaKernels::get(s.device())?;
    let shape = AttnShape { batch: 1, heads: 1, kv_heads: 1, head_dim: 32, slots: 1, max_seq: 1, scale: 1.0 };
    let qkv = DeviceBuffer::<bf16>::zeros(&s, 96)?;
    let (mut kc, mut vc) = (DeviceBuffer::<bf16>::zeros(&s, 32)?, DeviceBuffer::<bf16>::zeros(&s, 32)?);
    let (slots, positions) = (DeviceBuffer::from_host(&s, &[0u32])?, DeviceBuffer::from_host(&s, &[0u32])?);
    let inv = DeviceBuffer::<f32>::zeros(&s, 16)?;
    let mut out = DeviceBuffer::<bf16>::zeros(&s, 32)?;
    let mut partial = DeviceBuffer::<f32>::zeros(&s, shape.partial_len())?;
    let mut counters = DeviceBuffer::<u32>::zeros(&s, shape.counters_len())?;
    let io = AttnBuffers { qkv: &qkv, k_cache: &mut kc, v_cache: &mut vc, slots: &slots, positions: &positions, inv_freq: &inv };
    let scratch = AttnScratch { partial: &mut partial, counters: &mut counters };
    k.rope_attention(&s, io, &mut out, scratch, shape)?;
    Ok(())
}

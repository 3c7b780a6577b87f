//! One decode step of a batch as a [`DeviceOp`]: embedding, the layers, the output projection,
//! the greedy argmax and the per-row sampler (which leaves greedy rows' argmax as it is), over
//! preallocated buffers. Captured once per batch-size bucket by the
//! graph cache ([`super::model`]), run eagerly for the warm-up before each capture.

use super::config::LlamaConfig;
use super::weights::DeviceWeights;
use cuda_async::{DeviceOp, ExecutionContext, GraphNode, Result};
use cuda_core::blas::{Blas, Linear};
use cuda_core::{DeviceBuffer, Stream};
use half::bf16;
use kernels::gemv::{Gemv, GemvShape};
use kernels::llama::{AttnBuffers, AttnScratch, AttnShape, LlamaKernels, RmsNorm, INACTIVE};
use kernels::sample::{SampleParams, Sampler};

/// The key/value cache of every layer: `[slots][kv_heads][max_seq][head_dim]` per layer.
pub struct KvCache {
    pub(crate) k: Vec<DeviceBuffer<bf16>>,
    pub(crate) v: Vec<DeviceBuffer<bf16>>,
    pub(crate) slots: usize,
    pub(crate) max_seq: usize,
}

impl KvCache {
    /// A zeroed cache for `slots` sequences of up to `max_seq` positions, on `stream`.
    pub(crate) fn new(
        stream: &Stream,
        cfg: &LlamaConfig,
        slots: usize,
        max_seq: usize,
    ) -> cuda_core::Result<KvCache> {
        let len = slots
            .checked_mul(cfg.kv_heads)
            .and_then(|n| n.checked_mul(max_seq))
            .and_then(|n| n.checked_mul(cfg.head_dim))
            .filter(|&n| n <= u32::MAX as usize * 4)
            .ok_or_else(|| {
                cuda_core::Error::InvalidArgument(format!(
                    "a KV cache of {slots} x {max_seq} positions is too large"
                ))
            })?;
        let mut k = super::config::per_layer(cfg.layers)?;
        let mut v = super::config::per_layer(cfg.layers)?;
        for _ in 0..cfg.layers {
            k.push(DeviceBuffer::zeros(stream, len)?);
            v.push(DeviceBuffer::zeros(stream, len)?);
        }
        Ok(KvCache { k, v, slots, max_seq })
    }

    /// Bytes of device memory the cache takes.
    pub fn bytes(&self) -> usize {
        self.k.iter().chain(&self.v).map(DeviceBuffer::size_bytes).sum()
    }
}

/// The device buffers of one batch-size bucket: inputs (`tokens`, `slots`, `positions`, the
/// sampling `params`), the activations, the logits and the chosen tokens.
pub struct StepBuffers {
    pub(crate) batch: usize,
    pub(crate) tokens: DeviceBuffer<u32>,
    /// Written only by the model from host-checked values: real slots distinct, the rest
    /// [`INACTIVE`] (the contract of [`LlamaKernels::rope_attention`]).
    pub(crate) slots: DeviceBuffer<u32>,
    pub(crate) positions: DeviceBuffer<u32>,
    /// Per-row sampling parameters (zeroed: every row greedy until the model stages others).
    pub(crate) params: DeviceBuffer<SampleParams>,
    h: DeviceBuffer<bf16>,
    xn: DeviceBuffer<bf16>,
    qkv: DeviceBuffer<bf16>,
    attn: DeviceBuffer<bf16>,
    gu: DeviceBuffer<bf16>,
    act: DeviceBuffer<bf16>,
    pub(crate) logits: DeviceBuffer<f32>,
    pub(crate) next: DeviceBuffer<u32>,
    argmax_scratch: DeviceBuffer<u64>,
    attn_partial: DeviceBuffer<f32>,
    attn_counters: DeviceBuffer<u32>,
}

impl StepBuffers {
    /// Buffers for `batch` rows, every row inactive.
    pub(crate) fn new(stream: &Stream, cfg: &LlamaConfig, batch: usize) -> cuda_core::Result<StepBuffers> {
        // Every length with checked arithmetic: `batch` comes from the options, unbounded.
        let len = |per_row: Option<usize>, what: &str| {
            per_row.and_then(|n| n.checked_mul(batch)).ok_or_else(|| {
                cuda_core::Error::InvalidArgument(format!(
                    "the {what} buffer of a bucket of {batch} rows overflows usize"
                ))
            })
        };
        let z = |n: usize, what: &str| DeviceBuffer::<bf16>::zeros(stream, len(Some(n), what)?);
        let partial_per_row = cfg
            .kv_heads
            .checked_mul(kernels::llama::ATTN_SPLITS)
            .and_then(|n| n.checked_mul(cfg.heads / cfg.kv_heads))
            .and_then(|n| n.checked_mul(cfg.head_dim.checked_add(2)?));
        Ok(StepBuffers {
            batch,
            tokens: DeviceBuffer::zeros(stream, batch)?,
            slots: DeviceBuffer::filled(stream, batch, INACTIVE)?,
            positions: DeviceBuffer::zeros(stream, batch)?,
            params: DeviceBuffer::zeros(stream, batch)?,
            h: z(cfg.hidden, "hidden")?,
            xn: z(cfg.hidden, "normed hidden")?,
            qkv: z(cfg.qkv_dim(), "q/k/v")?,
            attn: z(cfg.attn_dim(), "attention")?,
            gu: z(cfg.intermediate.saturating_mul(2), "gate/up")?,
            act: z(cfg.intermediate, "activation")?,
            logits: DeviceBuffer::zeros(stream, len(Some(cfg.vocab), "logits")?)?,
            next: DeviceBuffer::zeros(stream, batch)?,
            argmax_scratch: DeviceBuffer::zeros(
                stream,
                len(Some(kernels::llama::ARGMAX_SPLIT), "argmax scratch")?,
            )?,
            attn_partial: DeviceBuffer::zeros(stream, len(partial_per_row, "attention partials")?)?,
            attn_counters: DeviceBuffer::zeros(stream, len(Some(cfg.kv_heads), "attention counters")?)?,
        })
    }

    /// Bytes of device memory these buffers take.
    pub fn bytes(&self) -> usize {
        let b16 = [&self.h, &self.xn, &self.qkv, &self.attn, &self.gu, &self.act];
        let b32 = [&self.tokens, &self.slots, &self.positions, &self.next];
        b16.iter().map(|b| b.size_bytes()).sum::<usize>()
            + b32.iter().map(|b| b.size_bytes()).sum::<usize>()
            + self.logits.size_bytes()
            + self.params.size_bytes()
            + self.argmax_scratch.size_bytes()
            + self.attn_partial.size_bytes()
            + self.attn_counters.size_bytes()
    }
}

/// The device work of one decode step for the rows in `buf` (see the module docs). Per layer:
/// RMSNorm, the stacked q/k/v product, rotary + cache append + attention, the output product
/// added into the residual, RMSNorm, the stacked gate/up product, SwiGLU, and the down product
/// added into the residual.
///
/// With `gemv` (small batches: [`Gemv::fits`]) each product is one fused launch that also does
/// the RMSNorm before it, the SwiGLU after it or the residual add (5 launches per layer);
/// otherwise the products are cuBLAS GEMMs (residual adds as `beta = 1`) beside separate norm
/// and SwiGLU launches (9 per layer). The choice is made per product, by its input width.
///
/// The step ends with the greedy argmax into `buf.next`, then the sampler, which overwrites
/// `next[r]` for the rows whose `buf.params[r]` asks for sampling ([`Sampler::sample`]).
pub(crate) struct DecodeStep<'a> {
    pub cfg: &'a LlamaConfig,
    pub w: &'a DeviceWeights,
    pub inv_freq: &'a DeviceBuffer<f32>,
    pub kv: &'a mut KvCache,
    pub buf: &'a mut StepBuffers,
    pub blas: &'a Blas,
    pub kernels: &'static LlamaKernels,
    pub gemv: Option<&'static Gemv>,
    pub sampler: &'static Sampler,
}

impl DeviceOp for DecodeStep<'_> {
    type Output = ();

    fn execute(self, ctx: &ExecutionContext<'_>) -> Result<()> {
        let DecodeStep { cfg, w, inv_freq, kv, buf, blas, kernels: k, gemv, sampler } = self;
        let s = ctx.stream();
        let (b, h, eps) = (buf.batch, cfg.hidden, cfg.rms_eps as f32);
        let lin = |in_dim, out_dim, accumulate| Linear { rows: b, in_dim, out_dim, accumulate };
        let gemv_shape = |in_dim, out_dim| GemvShape { rows: b, in_dim, out_dim };
        let norm = |weight| RmsNorm { weight, eps };
        let fused = |in_dim: usize| {
            let g = gemv.filter(|_| Gemv::fits(b, in_dim))?;
            // SAFETY: `Gemv::preloading`'s contract. This step queues its work on `s` alone,
            // with no event wait or join between its launches, and its first kernel, `embed`, is
            // not an overlapped launch (`LlamaKernels::embed` launches plainly). So every path of
            // a product's dependencies reaches `embed` through this step's own kernels, and the
            // kernels it can overlap are `embed` and those: `embed` writes `buf.h`; the products,
            // the attention, the cuBLAS GEMMs, RMSNorms and SiLU·up of the unfused widths, the
            // argmax and the sampler write `buf`'s other buffers and the KV cache (`kv`). None
            // writes a weight: `w` is borrowed shared for the whole step, and no kernel of the
            // crate writes through a shared borrow. (A graph of this step is no different: its
            // first node waits for all earlier work of the stream it is launched on.)
            Some(unsafe { g.preloading() })
        };
        let shape = AttnShape {
            batch: b as u32,
            heads: cfg.heads as u32,
            kv_heads: cfg.kv_heads as u32,
            head_dim: cfg.head_dim as u32,
            slots: kv.slots as u32,
            max_seq: kv.max_seq as u32,
            scale: 1.0 / (cfg.head_dim as f32).sqrt(),
        };
        k.embed(s, &buf.tokens, &w.embed, &mut buf.h, h)?;
        for (l, lw) in w.layers.iter().enumerate() {
            if let Some(g) = fused(h) {
                g.norm(s, &buf.h, norm(&lw.attn_norm), &lw.wqkv, &mut buf.qkv, gemv_shape(h, cfg.qkv_dim()))?;
            } else {
                k.rmsnorm(s, &buf.h, norm(&lw.attn_norm), &mut buf.xn, b, h)?;
                blas.linear(s, &buf.xn, &lw.wqkv, &mut buf.qkv, lin(h, cfg.qkv_dim(), false))?;
            }
            let io = AttnBuffers {
                qkv: &buf.qkv,
                k_cache: &mut kv.k[l],
                v_cache: &mut kv.v[l],
                slots: &buf.slots,
                positions: &buf.positions,
                inv_freq,
            };
            let scratch = AttnScratch { partial: &mut buf.attn_partial, counters: &mut buf.attn_counters };
            // SAFETY: `buf.slots` is written only by `LlamaModel` from host values it checked:
            // real slots distinct and in range, every other row INACTIVE (see `StepBuffers`);
            // the counters were allocated zeroed and every launch leaves them zero.
            unsafe {
                k.rope_attention(s, io, &mut buf.attn, scratch, shape)?;
            }
            if let Some(g) = fused(cfg.attn_dim()) {
                g.residual(s, &buf.attn, &lw.wo, &mut buf.h, gemv_shape(cfg.attn_dim(), h))?;
            } else {
                blas.linear(s, &buf.attn, &lw.wo, &mut buf.h, lin(cfg.attn_dim(), h, true))?;
            }
            if let Some(g) = fused(h) {
                g.norm_swiglu(
                    s,
                    &buf.h,
                    norm(&lw.mlp_norm),
                    &lw.w_gate_up,
                    &mut buf.act,
                    gemv_shape(h, cfg.intermediate),
                )?;
            } else {
                k.rmsnorm(s, &buf.h, norm(&lw.mlp_norm), &mut buf.xn, b, h)?;
                blas.linear(s, &buf.xn, &lw.w_gate_up, &mut buf.gu, lin(h, 2 * cfg.intermediate, false))?;
                k.silu_mul(s, &buf.gu, &mut buf.act, b, cfg.intermediate)?;
            }
            if let Some(g) = fused(cfg.intermediate) {
                g.residual(s, &buf.act, &lw.w_down, &mut buf.h, gemv_shape(cfg.intermediate, h))?;
            } else {
                blas.linear(s, &buf.act, &lw.w_down, &mut buf.h, lin(cfg.intermediate, h, true))?;
            }
        }
        if let Some(g) = fused(h) {
            g.norm_f32(
                s,
                &buf.h,
                norm(&w.final_norm),
                w.output(),
                &mut buf.logits,
                gemv_shape(h, cfg.vocab),
            )?;
        } else {
            k.rmsnorm(s, &buf.h, norm(&w.final_norm), &mut buf.xn, b, h)?;
            blas.linear(s, &buf.xn, w.output(), &mut buf.logits, lin(h, cfg.vocab, false))?;
        }
        k.argmax(s, &buf.logits, &mut buf.argmax_scratch, &mut buf.next, cfg.vocab)?;
        sampler.sample(s, &buf.logits, &buf.params, &mut buf.next, b, cfg.vocab)?;
        Ok(())
    }
}

// SAFETY: `execute` queues only kernel launches (the sampler's included: it allocates nothing)
// and cuBLAS GEMMs over buffers that exist before it runs; the GEMMs use the handle's preallocated workspace, so nothing is allocated, freed or
// synchronised.
unsafe impl GraphNode for DecodeStep<'_> {}

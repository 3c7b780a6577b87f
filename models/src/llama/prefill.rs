//! Chunked prefill: a prompt (or several prompts' pieces, packed) processed as one CUDA graph
//! replay per chunk-size bucket ([`ModelOptions::prefill_buckets`]): GEMMs over all the chunk's
//! rows, the rotary key + cache append of every row ([`LlamaKernels::rope_append`]), then a
//! causal attention over the cache ([`LlamaKernels::attention_cached`]), and the LM head only for
//! the rows whose next token is wanted (gathered by [`LlamaKernels::gather_rows`]).
//!
//! A child module of `model` (it reaches [`LlamaModel`]'s fields); its graphs share the decode
//! buckets' memory budget and least-recently-used eviction.

#[allow(unused_imports)] // only named by the docs' links (the API is in `run`)
use super::LlamaModel;
use super::{BucketInfo, ModelOptions};
use crate::llama::config::LlamaConfig;
use crate::llama::sampling::Sampling;
use crate::llama::step::KvCache;
use crate::llama::weights::DeviceWeights;
use cuda_async::{CudaGraph, DeviceError, DeviceOp, ExecutionContext, GraphNode, Result};
use cuda_core::blas::{Blas, Linear};
use cuda_core::{DeviceBuffer, PinnedBuffer, Stream};
use half::bf16;
use kernels::llama::{AttnBuffers, AttnScratch, AttnShape, LlamaKernels, RmsNorm, INACTIVE};
use kernels::sample::{SampleParams, Sampler};
use std::collections::BTreeMap;

/// One piece of a prompt for [`LlamaModel::prefill`]: `tokens` fed to the sequence in `slot` at
/// positions `start..start + tokens.len()`.
///
/// ```
/// use models::llama::PrefillSeq;
/// // The first 3 tokens of a prompt in slot 2; its next token is not wanted yet.
/// let piece = PrefillSeq { slot: 2, start: 0, tokens: &[1, 2, 3], want_next: false };
/// assert_eq!(piece.tokens.len(), 3);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PrefillSeq<'a> {
    /// The KV-cache slot of the sequence (`< slots`; distinct across the pieces of one call).
    pub slot: u32,
    /// The position of the first token: exactly [`LlamaModel::slot_len`] of the slot (`0` begins
    /// a sequence; the slot is not reset otherwise, use [`LlamaModel::release_slot`] for that).
    pub start: u32,
    /// The tokens (at least one, each `< vocab`; `start + len <= max_seq`).
    pub tokens: &'a [u32],
    /// Compute the greedy next token after the piece's last token (and its logits,
    /// [`LlamaModel::last_prefill_logits`]).
    pub want_next: bool,
}

fn refuse(msg: String) -> DeviceError {
    DeviceError::shape("LlamaModel::prefill", msg)
}

/// The smallest of the (sorted) `buckets` holding `tokens` rows.
pub(super) fn bucket_for(buckets: &[usize], tokens: usize) -> Result<usize> {
    buckets.iter().copied().find(|&b| b >= tokens).ok_or_else(|| {
        refuse(format!(
            "{tokens} tokens exceed the largest prefill bucket ({})",
            buckets.last().copied().unwrap_or(0)
        ))
    })
}

/// What one prefill call runs: its chunk bucket and the rows of the logit gather.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Plan {
    /// The chunk bucket (rows of the graph).
    pub chunk: usize,
    /// The rows of the chunk's inputs, padded with inactive rows: (token, slot, position).
    pub rows: Vec<(u32, u32, u32)>,
    /// The chunk row of each wanted piece's last token, padded with [`INACTIVE`] to
    /// `logit_rows(chunk, slots)`.
    pub logit_idx: Vec<u32>,
    /// The number of pieces that want a next token.
    pub wanted: usize,
    /// The sampling parameters of each logit row (the wanted pieces in order, counter = the
    /// position of the piece's last token), padded with greedy rows.
    pub params: Vec<SampleParams>,
}

/// The logit rows of a chunk bucket: `min(chunk, slots)` (no call wants more next tokens than it
/// has pieces, and pieces have distinct slots).
pub(super) fn logit_rows(chunk: usize, slots: usize) -> usize {
    chunk.min(slots)
}

/// Checks `seqs` against the model's state (every rule of [`PrefillSeq`]) and lays them out in
/// their chunk bucket: `bucket` if given (a configured prefill bucket holding them), else the
/// smallest holding them. Pure: the CPU tests drive it directly.
pub(super) fn plan(
    seqs: &[PrefillSeq<'_>],
    sampling: Option<&[Sampling]>,
    opts: &ModelOptions,
    filled: &[u32],
    vocab: usize,
    bucket: Option<usize>,
) -> Result<Plan> {
    if seqs.is_empty() {
        return Err(refuse("a prefill needs at least one piece".into()));
    }
    if let Some(sampling) = sampling {
        if sampling.len() != seqs.len() {
            return Err(refuse(format!(
                "{} sampling parameters for {} pieces (one per piece)",
                sampling.len(),
                seqs.len()
            )));
        }
        for (i, x) in sampling.iter().enumerate() {
            x.validate().map_err(|e| refuse(format!("piece {i}: {e}")))?;
        }
    }
    let mut total = 0usize;
    let mut seen = vec![false; filled.len()];
    for (i, p) in seqs.iter().enumerate() {
        if p.tokens.is_empty() {
            return Err(refuse(format!("piece {i} (slot {}) has no tokens", p.slot)));
        }
        let Some(&len) = filled.get(p.slot as usize) else {
            return Err(refuse(format!("slot {} out of range (the model has {})", p.slot, filled.len())));
        };
        if std::mem::replace(&mut seen[p.slot as usize], true) {
            return Err(refuse(format!("slot {} appears in two pieces of one prefill", p.slot)));
        }
        if p.start != len {
            return Err(refuse(format!(
                "slot {} holds {len} positions; a piece must start there, not at {}",
                p.slot, p.start
            )));
        }
        let end = (p.start as usize).checked_add(p.tokens.len());
        if end.is_none_or(|e| e > opts.max_seq) {
            return Err(refuse(format!(
                "slot {}: {} tokens from position {} do not fit {} positions",
                p.slot,
                p.tokens.len(),
                p.start,
                opts.max_seq
            )));
        }
        if let Some(&t) = p.tokens.iter().find(|&&t| t as usize >= vocab) {
            return Err(refuse(format!("token {t} (slot {}) is outside the vocabulary ({vocab})", p.slot)));
        }
        total = total.saturating_add(p.tokens.len());
    }
    let chunk = match bucket {
        None => bucket_for(&opts.prefill_buckets, total)?,
        Some(b) if b >= total && opts.prefill_buckets.contains(&b) => b,
        Some(b) => {
            return Err(refuse(format!(
                "bucket {b} is not a configured prefill bucket ({:?}) holding {total} tokens",
                opts.prefill_buckets
            )))
        }
    };
    let wanted = seqs.iter().filter(|p| p.want_next).count();
    let l = logit_rows(chunk, opts.slots);
    if wanted > l {
        return Err(refuse(format!("{wanted} pieces want a next token; bucket {chunk} has {l} logit rows")));
    }
    let mut rows = Vec::with_capacity(chunk);
    let mut logit_idx = Vec::with_capacity(l);
    let mut params = Vec::with_capacity(l);
    for (i, p) in seqs.iter().enumerate() {
        for (j, &t) in p.tokens.iter().enumerate() {
            rows.push((t, p.slot, p.start + j as u32)); // start + len <= max_seq < 2^32: no wrap
        }
        if p.want_next {
            logit_idx.push(rows.len() as u32 - 1); // rows.len() <= chunk <= MAX_BATCH
            let last = p.start + p.tokens.len() as u32 - 1;
            params.push(sampling.map_or(SampleParams::GREEDY, |x| x[i].params(last)));
        }
    }
    rows.resize(chunk, (0, INACTIVE, 0));
    logit_idx.resize(l, INACTIVE);
    params.resize(l, SampleParams::GREEDY);
    Ok(Plan { chunk, rows, logit_idx, wanted, params })
}

/// The device buffers of one chunk bucket of `chunk` rows: inputs (tokens, slots, positions), the
/// activations of every row, and for `L = min(chunk, slots)` logit rows the gather index, the
/// gathered hidden rows, the logits, the chosen tokens (`next`, where a sampler may overwrite
/// the argmax) and the argmax scratch.
pub struct PrefillBuffers {
    pub(crate) chunk: usize,
    pub(crate) logit_rows: usize,
    pub(crate) tokens: DeviceBuffer<u32>,
    /// Written only by the model from host-checked values: active (slot, position) pairs
    /// distinct (the contract of [`LlamaKernels::rope_append`]), the rest [`INACTIVE`].
    pub(crate) slots: DeviceBuffer<u32>,
    pub(crate) positions: DeviceBuffer<u32>,
    pub(crate) logit_idx: DeviceBuffer<u32>,
    h: DeviceBuffer<bf16>,
    xn: DeviceBuffer<bf16>,
    qkv: DeviceBuffer<bf16>,
    attn: DeviceBuffer<bf16>,
    gu: DeviceBuffer<bf16>,
    act: DeviceBuffer<bf16>,
    last_h: DeviceBuffer<bf16>,
    last_xn: DeviceBuffer<bf16>,
    pub(crate) logits: DeviceBuffer<f32>,
    pub(crate) next: DeviceBuffer<u32>,
    /// The sampling parameters of the logit rows (greedy rows keep the argmax).
    pub(crate) params: DeviceBuffer<SampleParams>,
    argmax_scratch: DeviceBuffer<u64>,
    attn_partial: DeviceBuffer<f32>,
    attn_counters: DeviceBuffer<u32>,
}

impl PrefillBuffers {
    /// Buffers for `chunk` rows and `logit_rows` logit rows, every row inactive.
    pub(crate) fn new(
        stream: &Stream,
        cfg: &LlamaConfig,
        chunk: usize,
        logit_rows: usize,
    ) -> cuda_core::Result<PrefillBuffers> {
        let len = |per_row: Option<usize>, rows: usize, what: &str| {
            per_row.and_then(|n| n.checked_mul(rows)).ok_or_else(|| {
                cuda_core::Error::InvalidArgument(format!(
                    "the {what} buffer of a prefill bucket of {chunk} rows overflows usize"
                ))
            })
        };
        let z = |n: usize, rows: usize, what: &str| {
            DeviceBuffer::<bf16>::zeros(stream, len(Some(n), rows, what)?)
        };
        let partial_per_row = cfg
            .kv_heads
            .checked_mul(kernels::llama::ATTN_SPLITS)
            .and_then(|n| n.checked_mul(cfg.heads / cfg.kv_heads))
            .and_then(|n| n.checked_mul(cfg.head_dim.checked_add(2)?));
        let l = logit_rows;
        Ok(PrefillBuffers {
            chunk,
            logit_rows,
            tokens: DeviceBuffer::zeros(stream, chunk)?,
            slots: DeviceBuffer::filled(stream, chunk, INACTIVE)?,
            positions: DeviceBuffer::zeros(stream, chunk)?,
            logit_idx: DeviceBuffer::filled(stream, l, INACTIVE)?,
            h: z(cfg.hidden, chunk, "hidden")?,
            xn: z(cfg.hidden, chunk, "normed hidden")?,
            qkv: z(cfg.qkv_dim(), chunk, "q/k/v")?,
            attn: z(cfg.attn_dim(), chunk, "attention")?,
            gu: z(cfg.intermediate.saturating_mul(2), chunk, "gate/up")?,
            act: z(cfg.intermediate, chunk, "activation")?,
            last_h: z(cfg.hidden, l, "gathered hidden")?,
            last_xn: z(cfg.hidden, l, "gathered normed hidden")?,
            logits: DeviceBuffer::zeros(stream, len(Some(cfg.vocab), l, "logits")?)?,
            next: DeviceBuffer::zeros(stream, l)?,
            params: DeviceBuffer::zeros(stream, l)?,
            argmax_scratch: DeviceBuffer::zeros(
                stream,
                len(Some(kernels::llama::ARGMAX_SPLIT), l, "argmax")?,
            )?,
            attn_partial: DeviceBuffer::zeros(stream, len(partial_per_row, chunk, "attention partials")?)?,
            attn_counters: DeviceBuffer::zeros(
                stream,
                len(Some(cfg.kv_heads), chunk, "attention counters")?,
            )?,
        })
    }

    /// Bytes of device memory these buffers take.
    pub fn bytes(&self) -> usize {
        let b16 =
            [&self.h, &self.xn, &self.qkv, &self.attn, &self.gu, &self.act, &self.last_h, &self.last_xn];
        let b32 =
            [&self.tokens, &self.slots, &self.positions, &self.logit_idx, &self.next, &self.attn_counters];
        b16.iter().map(|b| b.size_bytes()).sum::<usize>()
            + b32.iter().map(|b| b.size_bytes()).sum::<usize>()
            + self.logits.size_bytes()
            + self.argmax_scratch.size_bytes()
            + self.params.size_bytes()
            + self.attn_partial.size_bytes()
    }
}

/// The bytes a prefill bucket of `chunk` rows and `l` logit rows will take (saturating: only
/// compared with the budget).
fn estimate_bytes(c: &LlamaConfig, chunk: usize, l: usize) -> usize {
    let group = c.heads / c.kv_heads.max(1);
    let per_row = [c.hidden, c.hidden, c.qkv_dim(), c.attn_dim(), c.intermediate.saturating_mul(3)]
        .into_iter()
        .fold(0usize, usize::saturating_add)
        .saturating_mul(2);
    let partials = kernels::llama::ATTN_SPLITS
        .saturating_mul(group)
        .saturating_mul(c.head_dim.saturating_add(2))
        .saturating_add(1)
        .saturating_mul(c.kv_heads)
        .saturating_mul(4);
    let per_logit_row = [
        c.hidden.saturating_mul(4),
        c.vocab.saturating_add(2).saturating_mul(4),
        kernels::llama::ARGMAX_SPLIT.saturating_mul(8),
        std::mem::size_of::<SampleParams>(),
    ]
    .into_iter()
    .fold(0usize, usize::saturating_add);
    per_row
        .saturating_add(partials)
        .saturating_add(12)
        .saturating_mul(chunk)
        .saturating_add(per_logit_row.saturating_mul(l))
}

/// The device work of one prefill chunk over `buf` (see the module docs). Per layer: RMSNorm, the
/// stacked q/k/v GEMM over the chunk's rows, the rotary key + cache append, the cached causal
/// attention, the output GEMM added into the residual, RMSNorm, the gate/up GEMM, SwiGLU, and the
/// down GEMM added into the residual; then the gather of the logit rows, RMSNorm, the LM head
/// over those rows, the greedy argmax into `buf.next` and the sampler, which overwrites the rows
/// whose `buf.params` ask for sampling.
pub(crate) struct PrefillStep<'a> {
    pub cfg: &'a LlamaConfig,
    pub w: &'a DeviceWeights,
    pub inv_freq: &'a DeviceBuffer<f32>,
    pub kv: &'a mut KvCache,
    pub buf: &'a mut PrefillBuffers,
    pub blas: &'a Blas,
    pub kernels: &'static LlamaKernels,
    pub sampler: &'static Sampler,
}

impl DeviceOp for PrefillStep<'_> {
    type Output = ();

    fn execute(self, ctx: &ExecutionContext<'_>) -> Result<()> {
        let PrefillStep { cfg, w, inv_freq, kv, buf, blas, kernels: k, sampler } = self;
        let s = ctx.stream();
        let (c, l, h, eps) = (buf.chunk, buf.logit_rows, cfg.hidden, cfg.rms_eps as f32);
        let lin = |rows, in_dim, out_dim, accumulate| Linear { rows, in_dim, out_dim, accumulate };
        let norm = |weight| RmsNorm { weight, eps };
        let shape = AttnShape {
            batch: c as u32,
            heads: cfg.heads as u32,
            kv_heads: cfg.kv_heads as u32,
            head_dim: cfg.head_dim as u32,
            slots: kv.slots as u32,
            max_seq: kv.max_seq as u32,
            scale: 1.0 / (cfg.head_dim as f32).sqrt(),
        };
        k.embed(s, &buf.tokens, &w.embed, &mut buf.h, h)?;
        for (layer, lw) in w.layers.iter().enumerate() {
            k.rmsnorm(s, &buf.h, norm(&lw.attn_norm), &mut buf.xn, c, h)?;
            blas.linear(s, &buf.xn, &lw.wqkv, &mut buf.qkv, lin(c, h, cfg.qkv_dim(), false))?;
            let (kc, vc) = (&mut kv.k[layer], &mut kv.v[layer]);
            let (slots, positions) = (&buf.slots, &buf.positions);
            let io = AttnBuffers { qkv: &buf.qkv, k_cache: kc, v_cache: vc, slots, positions, inv_freq };
            // SAFETY: `buf.slots`/`buf.positions` are written only by `LlamaModel::prefill` from
            // a checked `Plan`: active slots distinct across pieces, positions distinct within a
            // piece, so the active (slot, position) pairs are distinct; the rest INACTIVE.
            unsafe { k.rope_append(s, io, shape)? };
            let io = AttnBuffers {
                qkv: &buf.qkv,
                k_cache: &kv.k[layer],
                v_cache: &kv.v[layer],
                slots,
                positions,
                inv_freq,
            };
            let scratch = AttnScratch { partial: &mut buf.attn_partial, counters: &mut buf.attn_counters };
            // SAFETY: the counters were allocated zeroed and every launch leaves them zero; the
            // cached kernel only reads the caches (appended by the launch above).
            unsafe {
                k.attention_cached(s, io, &mut buf.attn, scratch, shape)?;
            }
            blas.linear(s, &buf.attn, &lw.wo, &mut buf.h, lin(c, cfg.attn_dim(), h, true))?;
            k.rmsnorm(s, &buf.h, norm(&lw.mlp_norm), &mut buf.xn, c, h)?;
            blas.linear(s, &buf.xn, &lw.w_gate_up, &mut buf.gu, lin(c, h, 2 * cfg.intermediate, false))?;
            k.silu_mul(s, &buf.gu, &mut buf.act, c, cfg.intermediate)?;
            blas.linear(s, &buf.act, &lw.w_down, &mut buf.h, lin(c, cfg.intermediate, h, true))?;
        }
        k.gather_rows(s, &buf.h, &buf.logit_idx, &mut buf.last_h, h)?;
        k.rmsnorm(s, &buf.last_h, norm(&w.final_norm), &mut buf.last_xn, l, h)?;
        blas.linear(s, &buf.last_xn, w.output(), &mut buf.logits, lin(l, h, cfg.vocab, false))?;
        k.argmax(s, &buf.logits, &mut buf.argmax_scratch, &mut buf.next, cfg.vocab)?;
        sampler.sample(s, &buf.logits, &buf.params, &mut buf.next, l, cfg.vocab)?;
        Ok(())
    }
}

// SAFETY: `execute` queues only kernel launches and cuBLAS GEMMs over buffers that exist before
// it runs; the GEMMs use the handle's preallocated workspace, so nothing is allocated, freed or
// synchronised.
unsafe impl GraphNode for PrefillStep<'_> {}

/// One captured chunk bucket with its page-locked staging buffers.
pub(super) struct PrefillBucket {
    buf: PrefillBuffers,
    graph: CudaGraph<()>,
    in_tokens: PinnedBuffer<u32>,
    in_slots: PinnedBuffer<u32>,
    in_positions: PinnedBuffer<u32>,
    in_logit_idx: PinnedBuffer<u32>,
    in_params: PinnedBuffer<SampleParams>,
    out_next: PinnedBuffer<u32>,
    pub(super) info: BucketInfo,
    pub(super) last_used: u64,
}

impl PrefillBucket {
    /// Writes a plan into the staging buffers (after waiting for any copy still reading them).
    fn write(&mut self, plan: &Plan) -> Result<()> {
        let (t, s, p) = (
            self.in_tokens.as_mut_slice()?,
            self.in_slots.as_mut_slice()?,
            self.in_positions.as_mut_slice()?,
        );
        for (i, &(tok, slot, pos)) in plan.rows.iter().enumerate() {
            (t[i], s[i], p[i]) = (tok, slot, pos);
        }
        self.in_logit_idx.as_mut_slice()?.copy_from_slice(&plan.logit_idx);
        self.in_params.as_mut_slice()?.copy_from_slice(&plan.params);
        Ok(())
    }
}

/// The prefill graphs of a model and what its last prefill left.
#[derive(Default)]
pub(super) struct PrefillCache {
    pub(super) buckets: BTreeMap<usize, PrefillBucket>,
    /// (chunk bucket, pieces that wanted a next token) of the last prefill that ran.
    last: Option<(usize, usize)>,
}

#[path = "prefill_run.rs"]
mod run;

#[cfg(test)]
#[path = "prefill_tests.rs"]
mod tests;

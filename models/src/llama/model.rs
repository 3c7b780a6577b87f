//! [`LlamaModel`]: weights, KV cache and a graph cache of decode steps per batch-size bucket.

use super::config::LlamaConfig;
use super::sampling::Sampling;
use super::step::{DecodeStep, KvCache, StepBuffers};
use super::weights::{DeviceWeights, HostWeights, LoadError};
use cuda_async::{value, CudaGraph, DeviceError, DeviceOp, DeviceOpExt, Module, Result};
use cuda_core::blas::Blas;
use cuda_core::{DeviceBuffer, PinnedBuffer, Stream};
use kernels::gemv::Gemv;
use kernels::llama::{LlamaKernels, INACTIVE};
use kernels::sample::{SampleParams, Sampler};
use std::collections::BTreeMap;
use std::path::Path;
use std::time::Instant;

#[path = "prefill.rs"]
mod prefill;
pub use prefill::{PrefillBuffers, PrefillSeq};

/// One row of a decode step: feed `token` at `position` of the sequence in cache `slot`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Row {
    /// The KV-cache slot of the sequence (`< slots`; distinct within a step).
    pub slot: u32,
    /// The token's position in its sequence (`< max_seq`, at most the slot's current length).
    pub position: u32,
    /// The token id (`< vocab`).
    pub token: u32,
}

/// How a [`LlamaModel`] is laid out: the KV cache's size, the batch-size buckets and how much
/// device memory their captured graphs may take.
///
/// | field | default | |
/// |---|---|---|
/// | [`slots`](Self::slots) | `64` | sequences in flight at once |
/// | [`max_seq`](Self::max_seq) | `1024` | positions per sequence (prompt + generated) |
/// | [`buckets`](Self::buckets) | `[1, 2, 4, 8, 16, 32, 64]` | batch sizes captured as graphs |
/// | [`graph_budget_bytes`](Self::graph_budget_bytes) | `usize::MAX` (no limit) | memory for captured buckets |
/// | [`fused_small_batch`](Self::fused_small_batch) | `true` | fused bf16 products for small buckets |
/// | [`prefill_buckets`](Self::prefill_buckets) | `[16, 32, 64, 128, 256, 512]` | prompt chunk sizes captured as graphs |
///
/// The KV cache, allocated by [`LlamaModel::new`], takes `config.kv_bytes(slots * max_seq)` bytes
/// ([`LlamaConfig::kv_bytes`]): with the defaults and Llama 3.2 1B, 64 × 1024 positions × 32 KiB =
/// 2 GiB. Lower `slots` or `max_seq` for a smaller footprint:
///
/// ```
/// use models::llama::ModelOptions;
/// let opts = ModelOptions { slots: 8, max_seq: 512, ..Default::default() };
/// assert_eq!(opts.buckets, [1, 2, 4, 8, 16, 32, 64]);
/// ```
///
/// [`LlamaModel::new`] refuses options with no slots, no positions, no buckets or a bucket of 0,
/// no prefill buckets, a prefill bucket of 0 or above 65535 rows (and sorts and deduplicates
/// both lists of buckets).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelOptions {
    /// KV-cache slots: sequences that can be in flight at once (a [`Row::slot`] is `< slots`).
    /// Default `64`. The KV cache grows linearly with it.
    pub slots: usize,
    /// Positions per slot: the longest sequence, prompt plus generated tokens (a
    /// [`Row::position`] is `< max_seq`). Default `1024`. The KV cache grows linearly with it.
    pub max_seq: usize,
    /// Batch-size buckets, each captured as one graph (a step of `n` rows runs in the smallest
    /// bucket `>= n`, the rest padded with inactive rows; a step of more rows than the largest
    /// bucket is refused). Default `[1, 2, 4, 8, 16, 32, 64]`. Buckets are captured on first use
    /// or all at once by [`LlamaModel::capture_all`].
    pub buckets: Vec<usize>,
    /// Device memory the captured buckets may take together (their buffers plus what
    /// instantiating the graph took); the least recently used buckets are evicted beyond it (and
    /// recaptured when used again). Default `usize::MAX`: no limit, nothing is evicted.
    pub graph_budget_bytes: usize,
    /// Run the products of small buckets ([`kernels::gemv::Gemv::fits`]) as fused launches
    /// (RMSNorm, SwiGLU and residual adds inside the product) instead of cuBLAS GEMMs beside
    /// separate elementwise launches. Default `true`; turn it off only for comparisons.
    pub fused_small_batch: bool,
    /// Chunk-size buckets of [`LlamaModel::prefill`], each captured as one graph on first use: a
    /// prefill of `n` tokens (all its pieces together) runs in the smallest bucket `>= n`, the
    /// rest padded with inactive rows; more tokens than the largest bucket are refused (split
    /// the prompt into pieces). Default `[16, 32, 64, 128, 256, 512]`. They share
    /// [`graph_budget_bytes`](Self::graph_budget_bytes) and its eviction with the decode buckets.
    pub prefill_buckets: Vec<usize>,
}

impl Default for ModelOptions {
    fn default() -> Self {
        ModelOptions {
            slots: 64,
            max_seq: 1024,
            buckets: vec![1, 2, 4, 8, 16, 32, 64],
            graph_budget_bytes: usize::MAX,
            fused_small_batch: true,
            prefill_buckets: vec![16, 32, 64, 128, 256, 512],
        }
    }
}

/// What one captured bucket costs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BucketInfo {
    /// Rows per step.
    pub batch: usize,
    /// Bytes of the bucket's buffers (activations, logits, inputs).
    pub buffer_bytes: usize,
    /// Device memory that capture and instantiation took beyond the buffers (the drop in free
    /// memory across them, which the driver reports in pages: 0 when it fit in reserved pages).
    pub graph_bytes: usize,
    /// Milliseconds to capture and instantiate the step (after an eager warm-up).
    pub capture_ms: f64,
    /// Replays so far.
    pub replays: u64,
}

struct Bucket {
    buf: StepBuffers,
    graph: CudaGraph<()>,
    in_tokens: PinnedBuffer<u32>,
    in_slots: PinnedBuffer<u32>,
    in_positions: PinnedBuffer<u32>,
    in_params: PinnedBuffer<SampleParams>,
    out_next: PinnedBuffer<u32>,
    info: BucketInfo,
    last_used: u64,
}

impl Bucket {
    /// Writes `rows` and their sampling parameters (greedy without `sampling`) into the staging
    /// buffers, padding the bucket with inactive greedy rows (after waiting for any copy still
    /// reading them).
    fn write_rows(&mut self, rows: &[Row], sampling: Option<&[Sampling]>) -> Result<()> {
        let (tokens, slots, positions, params) = (
            self.in_tokens.as_mut_slice()?,
            self.in_slots.as_mut_slice()?,
            self.in_positions.as_mut_slice()?,
            self.in_params.as_mut_slice()?,
        );
        for i in 0..tokens.len() {
            let r = rows.get(i);
            tokens[i] = r.map_or(0, |r| r.token);
            slots[i] = r.map_or(INACTIVE, |r| r.slot);
            positions[i] = r.map_or(0, |r| r.position);
            let s = sampling.and_then(|s| s.get(i)).copied().unwrap_or(Sampling::GREEDY);
            params[i] = r.map_or(SampleParams::GREEDY, |r| s.params(r.position));
        }
        Ok(())
    }
}

/// Queues the copies of a bucket's staged inputs into its device buffers.
fn copy_in(
    s: &Stream,
    buf: &mut StepBuffers,
    tokens: &mut PinnedBuffer<u32>,
    slots: &mut PinnedBuffer<u32>,
    positions: &mut PinnedBuffer<u32>,
    params: &mut PinnedBuffer<SampleParams>,
) -> Result<()> {
    tokens.copy_to_device_async(s, &mut buf.tokens)?;
    slots.copy_to_device_async(s, &mut buf.slots)?;
    positions.copy_to_device_async(s, &mut buf.positions)?;
    params.copy_to_device_async(s, &mut buf.params)?;
    Ok(())
}

/// A Llama-style decoder whose decode step is one CUDA graph replay per batch-size bucket.
///
/// A step ([`LlamaModel::step`], [`LlamaModel::step_async`], or [`Module::forward`]) checks its
/// rows on the host (slots distinct and in range, positions in range and contiguous per slot,
/// tokens in the vocabulary), writes them into page-locked staging buffers, and queues on the
/// model's stream three small copies in, one replay of the bucket's graph and one copy out of the
/// chosen tokens. Positions and lengths are device data the graph reads when it runs, so nothing
/// is recaptured between steps. Buckets are captured on first use (or all at once with
/// [`LlamaModel::capture_all`]) and evicted least recently used first when their memory exceeds
/// [`ModelOptions::graph_budget_bytes`].
///
/// ```no_run
/// use models::llama::{DeviceWeights, LlamaConfig, LlamaModel, ModelOptions, Row};
/// # fn main() -> cuda_async::Result<()> {
/// let stream = cuda_core::Device::new(0)?.new_stream()?;
/// let cfg = LlamaConfig::small();
/// let weights = DeviceWeights::random(&stream, &cfg, 7, 0.02)?;
/// let mut model = LlamaModel::new(&stream, cfg, weights, ModelOptions { slots: 4, max_seq: 64, ..Default::default() })?;
/// let next = model.step(&[Row { slot: 0, position: 0, token: 1 }, Row { slot: 1, position: 0, token: 5 }])?;
/// assert_eq!(next.len(), 2);
/// # Ok(()) }
/// ```
pub struct LlamaModel {
    cfg: LlamaConfig,
    weights: DeviceWeights,
    inv_freq: DeviceBuffer<f32>,
    kv: KvCache,
    blas: Blas,
    kernels: &'static LlamaKernels,
    gemv: Option<&'static Gemv>,
    sampler: &'static Sampler,
    stream: Stream,
    opts: ModelOptions,
    buckets: BTreeMap<usize, Bucket>,
    filled: Vec<u32>,
    tick: u64,
    pub(super) last_rows: Option<(usize, usize)>,
    evictions: u64,
    prefill: prefill::PrefillCache,
}

impl std::fmt::Debug for LlamaModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LlamaModel")
            .field("config", &self.cfg)
            .field("options", &self.opts)
            .field("captured", &self.buckets.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

fn misuse(msg: String) -> DeviceError {
    DeviceError::shape("LlamaModel::step", msg)
}

impl LlamaModel {
    /// A model over `weights` on `stream`: allocates the KV cache, loads the kernels and a cuBLAS
    /// handle. Nothing is captured yet.
    ///
    /// # Errors
    /// Invalid options (no slots, no positions, no buckets, a bucket of 0) or configuration;
    /// weights that do not match the configuration ([`DeviceWeights::check`]: another number of
    /// layers, a weight of another size, `lm_head` against `tie_embeddings`), as
    /// [`DeviceError::Shape`]; [`cuda_core::Error::LibraryMissing`] without cuBLAS; allocation and
    /// compilation errors.
    pub fn new(
        stream: &Stream,
        cfg: LlamaConfig,
        weights: DeviceWeights,
        mut opts: ModelOptions,
    ) -> Result<LlamaModel> {
        cfg.validate()?;
        weights.check(&cfg).map_err(|e| match e {
            super::weights::LoadError::Config(e) => e,
            e => DeviceError::shape("LlamaModel::new", e.to_string()),
        })?;
        opts.buckets.sort_unstable();
        opts.buckets.dedup();
        if opts.slots == 0 || opts.max_seq == 0 || opts.buckets.is_empty() || opts.buckets[0] == 0 {
            return Err(DeviceError::shape(
                "LlamaModel::new",
                format!("invalid options {opts:?}: slots, max_seq and buckets must be positive"),
            ));
        }
        let largest = kernels::llama::MAX_BATCH;
        // Decode buckets have the kernels' row limit too (found by review: a larger one was
        // accepted and every step that landed in it failed at capture).
        if opts.buckets.last().is_some_and(|&b| b > largest) {
            return Err(DeviceError::shape(
                "LlamaModel::new",
                format!("invalid buckets {:?}: each 1 to {largest}", opts.buckets),
            ));
        }
        opts.prefill_buckets.sort_unstable();
        opts.prefill_buckets.dedup();
        if opts.prefill_buckets.first().is_none_or(|&b| b == 0)
            || opts.prefill_buckets.last().is_some_and(|&b| b > largest)
        {
            return Err(DeviceError::shape(
                "LlamaModel::new",
                format!(
                    "invalid prefill buckets {:?}: at least one, each 1 to {largest}",
                    opts.prefill_buckets
                ),
            ));
        }
        if opts.slots >= INACTIVE as usize || opts.max_seq > u32::MAX as usize {
            return Err(DeviceError::shape("LlamaModel::new", "slots and max_seq must fit in 32 bits"));
        }
        let kernels = LlamaKernels::get(stream.device())?;
        let gemv = if opts.fused_small_batch { Some(Gemv::get(stream.device())?) } else { None };
        let sampler = Sampler::get(stream.device())?;
        let blas = Blas::new(stream)?;
        let kv = KvCache::new(stream, &cfg, opts.slots, opts.max_seq)?;
        let inv_freq = DeviceBuffer::from_host(stream, &cfg.inv_freq())?;
        Ok(LlamaModel {
            filled: vec![0; opts.slots],
            cfg,
            weights,
            inv_freq,
            kv,
            blas,
            kernels,
            gemv,
            sampler,
            stream: stream.clone(),
            opts,
            buckets: BTreeMap::new(),
            tick: 0,
            last_rows: None,
            evictions: 0,
            prefill: prefill::PrefillCache::default(),
        })
    }

    /// Loads a Hugging Face model folder in one call: reads `dir/config.json`
    /// ([`LlamaConfig::from_hf_json`]), reads and checks `dir/model.safetensors`
    /// ([`HostWeights::from_safetensors`]), copies the weights to the device on `stream` and
    /// builds the model ([`LlamaModel::new`]). The same as those four calls, with one error type.
    ///
    /// The folder is what `huggingface-cli download` (or `snapshot_download`) leaves for a
    /// Llama-architecture checkpoint stored as one safetensors file (e.g. Llama 3.2 1B). Sharded
    /// checkpoints (`model-00001-of-0000N.safetensors` with an index) are not read: the missing
    /// `model.safetensors` is reported as [`LoadError::Io`]. The tokenizer is not read either.
    ///
    /// ```no_run
    /// use models::llama::{LlamaModel, ModelOptions, Row};
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let stream = cuda_core::Device::new(0)?.new_stream()?;
    /// let opts = ModelOptions { slots: 8, max_seq: 512, ..Default::default() };
    /// // `Err(LoadError)` for a missing file, a bad config.json or weights that do not fit it.
    /// let mut model = LlamaModel::from_hf_dir(&stream, "Llama-3.2-1B", opts)?;
    /// // Slot 0, position 0: the first token of a prompt (128000 is Llama 3's BOS).
    /// let next = model.step(&[Row { slot: 0, position: 0, token: 128000 }])?;
    /// println!("next token: {}", next[0]);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`LoadError::Io`] when `config.json` or `model.safetensors` cannot be read;
    /// [`LoadError::Config`] when `config.json` is not a supported Llama configuration; the
    /// weight errors of [`HostWeights::from_safetensors`] ([`LoadError::Format`],
    /// [`LoadError::Missing`], [`LoadError::Shape`], [`LoadError::Dtype`],
    /// [`LoadError::LayerCount`]); [`LoadError::Device`] when uploading or building the model
    /// fails (allocation, kernel compilation, [`cuda_core::Error::LibraryMissing`] without
    /// cuBLAS, invalid `opts`).
    pub fn from_hf_dir(
        stream: &Stream,
        dir: impl AsRef<Path>,
        opts: ModelOptions,
    ) -> std::result::Result<LlamaModel, LoadError> {
        let dir = dir.as_ref();
        let config_path = dir.join("config.json");
        let text = std::fs::read_to_string(&config_path)
            .map_err(|source| LoadError::Io { path: config_path.display().to_string(), source })?;
        let cfg = LlamaConfig::from_hf_json(&text).map_err(LoadError::Config)?;
        let host = HostWeights::from_safetensors(&dir.join("model.safetensors"), &cfg)?;
        let weights = host.upload(stream).map_err(|e| LoadError::Device(e.into()))?;
        drop(host);
        LlamaModel::new(stream, cfg, weights, opts).map_err(LoadError::Device)
    }

    /// The configuration.
    pub fn config(&self) -> &LlamaConfig {
        &self.cfg
    }

    /// The options (buckets sorted).
    pub fn options(&self) -> &ModelOptions {
        &self.opts
    }

    /// The stream every step runs on.
    pub fn stream(&self) -> &Stream {
        &self.stream
    }

    /// The weights.
    pub fn weights(&self) -> &DeviceWeights {
        &self.weights
    }

    /// Bytes of the KV cache.
    pub fn kv_bytes(&self) -> usize {
        self.kv.bytes()
    }

    /// The captured buckets, smallest first.
    pub fn buckets(&self) -> Vec<BucketInfo> {
        self.buckets.values().map(|b| BucketInfo { replays: b.graph.replays(), ..b.info }).collect()
    }

    /// Buckets evicted so far to stay within the budget.
    pub fn evictions(&self) -> u64 {
        self.evictions
    }

    /// The length of the sequence in `slot` (positions written so far), or `None` for a slot
    /// out of range.
    pub fn slot_len(&self, slot: u32) -> Option<u32> {
        self.filled.get(slot as usize).copied()
    }

    /// Forgets the sequence in `slot`: its next step must start at position 0. (The cache rows
    /// are not cleared: a step only reads positions its sequence has written.)
    ///
    /// # Errors
    /// A slot out of range ([`DeviceError::Shape`]).
    pub fn release_slot(&mut self, slot: u32) -> Result<()> {
        let f =
            self.filled.get_mut(slot as usize).ok_or_else(|| misuse(format!("slot {slot} out of range")))?;
        *f = 0;
        Ok(())
    }

    /// The smallest bucket that holds `rows` rows.
    fn bucket_for(&self, rows: usize) -> Result<usize> {
        self.opts.buckets.iter().copied().find(|&b| b >= rows).ok_or_else(|| {
            misuse(format!(
                "{rows} rows exceed the largest bucket ({})",
                self.opts.buckets.last().copied().unwrap_or(0)
            ))
        })
    }

    /// The bytes a bucket of `batch` rows will take (saturating: only compared with the budget).
    fn estimate_bytes(&self, batch: usize) -> usize {
        let c = &self.cfg;
        let group = c.heads / c.kv_heads;
        let activations = [c.hidden, c.hidden, c.qkv_dim(), c.attn_dim(), c.intermediate.saturating_mul(3)]
            .into_iter()
            .fold(0usize, usize::saturating_add);
        let partials = kernels::llama::ATTN_SPLITS
            .saturating_mul(group)
            .saturating_mul(c.head_dim.saturating_add(2))
            .saturating_add(1)
            .saturating_mul(c.kv_heads);
        [
            activations.saturating_mul(2),
            c.vocab.saturating_add(4).saturating_mul(4),
            kernels::llama::ARGMAX_SPLIT.saturating_mul(8),
            std::mem::size_of::<SampleParams>(),
            partials.saturating_mul(4),
        ]
        .into_iter()
        .fold(0usize, usize::saturating_add)
        .saturating_mul(batch)
    }

    /// Captures every decode bucket and then every prefill bucket now (up to the budget), so that
    /// no step or prefill pays for a capture.
    ///
    /// # Errors
    /// As for [`LlamaModel::step`]'s captures.
    pub fn capture_all(&mut self) -> Result<()> {
        for b in self.opts.buckets.clone() {
            self.ensure(b)?;
        }
        for c in self.opts.prefill_buckets.clone() {
            self.ensure_prefill(c)?;
        }
        Ok(())
    }

    /// Makes sure bucket `batch` is captured, evicting least recently used buckets first if the
    /// budget needs it.
    fn ensure(&mut self, batch: usize) -> Result<()> {
        self.tick += 1;
        if let Some(b) = self.buckets.get_mut(&batch) {
            b.last_used = self.tick;
            return Ok(());
        }
        let need = self.estimate_bytes(batch);
        // Decode and prefill buckets share the budget (see `prefill_run.rs`).
        while self.graph_bytes_used().saturating_add(need) > self.opts.graph_budget_bytes {
            if !self.evict_lru() {
                break;
            }
        }
        let LlamaModel { cfg, weights, inv_freq, kv, blas, kernels, gemv, sampler, stream, .. } = self;
        let (gemv, sampler) = (*gemv, *sampler);
        let mut buf = StepBuffers::new(stream, cfg, batch)?;
        let dev = stream.device();
        // Warm-up: every row inactive (no cache access); loads cuBLAS's kernels and picks its
        // algorithms outside the capture.
        DecodeStep { cfg, w: weights, inv_freq, kv, buf: &mut buf, blas, kernels, gemv, sampler }
            .sync_on(stream)?;
        let free_before = dev.memory_info()?.0;
        let t = Instant::now();
        let graph = CudaGraph::scope(stream, |s| {
            s.record(DecodeStep {
                cfg,
                w: weights,
                inv_freq,
                kv,
                buf: &mut buf,
                blas,
                kernels,
                gemv,
                sampler,
            })?;
            Ok(())
        })?;
        let capture_ms = t.elapsed().as_secs_f64() * 1e3;
        let free_after = dev.memory_info()?.0;
        let pinned = || PinnedBuffer::new(dev, batch, 0u32);
        let info = BucketInfo {
            batch,
            buffer_bytes: buf.bytes(),
            graph_bytes: free_before.saturating_sub(free_after),
            capture_ms,
            replays: 0,
        };
        let bucket = Bucket {
            buf,
            graph,
            in_tokens: pinned()?,
            in_slots: PinnedBuffer::new(dev, batch, INACTIVE)?,
            in_positions: pinned()?,
            in_params: PinnedBuffer::new(dev, batch, SampleParams::GREEDY)?,
            out_next: pinned()?,
            info,
            last_used: self.tick,
        };
        self.buckets.insert(batch, bucket);
        Ok(())
    }

    /// The bucket a step of `rows` rows runs in: the smallest configured bucket that holds them.
    ///
    /// # Errors
    /// More rows than the largest bucket ([`DeviceError::Shape`]).
    pub fn bucket_of(&self, rows: usize) -> Result<usize> {
        self.bucket_for(rows)
    }

    /// Checks `rows` and returns the bucket to run them in: `bucket` if given (it must be a
    /// configured bucket that holds them), else the smallest that holds them.
    fn check_rows(&self, rows: &[Row], bucket: Option<usize>) -> Result<usize> {
        if rows.is_empty() {
            return Err(misuse("a step needs at least one row".into()));
        }
        let bucket = match bucket {
            None => self.bucket_for(rows.len())?,
            Some(b) if b >= rows.len() && self.opts.buckets.contains(&b) => b,
            Some(b) => {
                return Err(misuse(format!(
                    "bucket {b} is not a configured bucket ({:?}) holding {} rows",
                    self.opts.buckets,
                    rows.len()
                )))
            }
        };
        let mut seen = vec![false; self.opts.slots];
        for r in rows {
            let Some(len) = self.filled.get(r.slot as usize) else {
                return Err(misuse(format!(
                    "slot {} out of range (the model has {})",
                    r.slot, self.opts.slots
                )));
            };
            if std::mem::replace(&mut seen[r.slot as usize], true) {
                return Err(misuse(format!("slot {} appears twice in one step", r.slot)));
            }
            if r.position as usize >= self.opts.max_seq {
                return Err(misuse(format!(
                    "position {} is beyond the cache ({} positions per slot)",
                    r.position, self.opts.max_seq
                )));
            }
            if r.position > *len {
                return Err(misuse(format!(
                    "slot {} holds {len} positions; position {} would skip some",
                    r.slot, r.position
                )));
            }
            if r.token as usize >= self.cfg.vocab {
                return Err(misuse(format!(
                    "token {} is outside the vocabulary ({})",
                    r.token, self.cfg.vocab
                )));
            }
        }
        Ok(bucket)
    }

    /// Checks the rows, captures their bucket if needed, stages them with their sampling
    /// parameters (every row greedy without `sampling`, which the caller has checked), and
    /// returns the step's op (copies in, replay, copy out) with the bucket it runs in.
    fn stage(
        &mut self,
        rows: &[Row],
        sampling: Option<&[Sampling]>,
        bucket: Option<usize>,
    ) -> Result<(usize, impl DeviceOp<Output = ()> + '_)> {
        // Forgotten first: a refused step must not leave the previous step's logits readable as
        // its own (found by review: the rows were checked before `begin` forgot them).
        self.last_rows = None;
        let batch = self.check_rows(rows, bucket)?;
        self.ensure(batch)?;
        self.begin(rows);
        let b = self.buckets.get_mut(&batch).ok_or_else(|| misuse("bucket vanished".into()))?;
        b.write_rows(rows, sampling)?;
        let Bucket { buf, graph, in_tokens, in_slots, in_positions, in_params, out_next, .. } = b;
        let op = value(())
            .and_then_with_context(move |(), ctx| {
                copy_in(ctx.stream(), buf, in_tokens, in_slots, in_positions, in_params)?;
                Ok(&buf.next)
            })
            .then(move |next| graph.launch().map(move |()| next))
            .and_then_with_context(move |next, ctx| Ok(out_next.copy_from_device_async(ctx.stream(), next)?));
        Ok((batch, op))
    }

    /// Before `rows`' work is queued: forgets the last step's results (until this one completes,
    /// [`LlamaModel::last_logits`] refuses rather than show another step's rows) and shortens
    /// each row's slot to the row's position. A row that rewinds (`position < slot_len`)
    /// overwrites that cache position, so if its step fails or its future is dropped, the
    /// positions after it no longer belong to the sequence the slot held: a later step must feed
    /// them again rather than read them. (Rows at `position == slot_len` change nothing here.)
    fn begin(&mut self, rows: &[Row]) {
        self.last_rows = None;
        for r in rows {
            let len = &mut self.filled[r.slot as usize];
            *len = (*len).min(r.position);
        }
    }

    /// Records that `rows` were written to the cache and that the step of `batch` rows finished:
    /// called only after its work ran, so a step that failed, or whose future was dropped before
    /// it finished, never lets a later step read a position that was not written (it may be fed
    /// again instead).
    fn commit(&mut self, rows: &[Row], batch: usize) {
        for r in rows {
            self.filled[r.slot as usize] = r.position + 1;
        }
        self.last_rows = Some((batch, rows.len()));
    }

    fn read_next(&self, n: usize) -> Result<Vec<u32>> {
        let (batch, _) = self.last_rows.ok_or_else(|| misuse("no step has completed".into()))?;
        let b = self.buckets.get(&batch).ok_or_else(|| misuse("bucket evicted".into()))?;
        let next = b.out_next.as_slice()?[..n].to_vec();
        in_vocab(next.iter().copied(), self.cfg.vocab)?;
        Ok(next)
    }

    /// Runs one decode step for `rows` (one replay of their bucket's graph) and returns the
    /// greedy next token of each row, blocking until it is ready.
    ///
    /// # Errors
    /// [`DeviceError::Shape`] for rows that break the rules of [`Row`] (or more rows than the
    /// largest bucket); capture, copy and driver errors.
    pub fn step(&mut self, rows: &[Row]) -> Result<Vec<u32>> {
        self.run_step(rows, None, None)
    }

    /// One step of `rows` (sampled per `sampling`, already checked by the caller, else greedy) in
    /// `bucket` or the smallest that holds them, blocking until the tokens are ready.
    pub(super) fn run_step(
        &mut self,
        rows: &[Row],
        sampling: Option<&[Sampling]>,
        bucket: Option<usize>,
    ) -> Result<Vec<u32>> {
        let stream = self.stream.clone();
        let (batch, op) = self.stage(rows, sampling, bucket)?;
        op.sync_on(&stream)?;
        self.commit(rows, batch);
        self.read_next(rows.len())
    }

    /// [`LlamaModel::run_step`] in the smallest bucket, resolving once the tokens are ready.
    pub(super) async fn run_step_async(
        &mut self,
        rows: &[Row],
        sampling: Option<&[Sampling]>,
    ) -> Result<Vec<u32>> {
        let stream = self.stream.clone();
        let (batch, op) = self.stage(rows, sampling, None)?;
        op.on(&stream).await?;
        self.commit(rows, batch);
        self.read_next(rows.len())
    }

    /// [`LlamaModel::step`] in a given bucket (padded with inactive rows) instead of the smallest
    /// that holds the rows. A row's result depends only on the row and the bucket's kernels, not
    /// on the other rows: a sequence replayed alone in the buckets it was served in gives its
    /// served tokens bit for bit (`llama-server` checks this).
    ///
    /// # Errors
    /// `bucket` not one of [`ModelOptions::buckets`] or smaller than `rows.len()`
    /// ([`DeviceError::Shape`]); as for [`LlamaModel::step`].
    pub fn step_in_bucket(&mut self, rows: &[Row], bucket: usize) -> Result<Vec<u32>> {
        self.run_step(rows, None, Some(bucket))
    }

    /// [`LlamaModel::step`] that resolves once the tokens are ready, without blocking the
    /// executor thread.
    ///
    /// # Errors
    /// As for [`LlamaModel::step`].
    pub async fn step_async(&mut self, rows: &[Row]) -> Result<Vec<u32>> {
        self.run_step_async(rows, None).await
    }

    /// [`LlamaModel::step`] without the graph: the same device work launched kernel by kernel
    /// (for comparisons and timing). Uses (and captures, if needed) the rows' bucket buffers.
    ///
    /// # Errors
    /// As for [`LlamaModel::step`].
    pub fn step_eager(&mut self, rows: &[Row]) -> Result<Vec<u32>> {
        self.last_rows = None; // as in `stage`
        let batch = self.check_rows(rows, None)?;
        self.ensure(batch)?;
        self.begin(rows);
        let LlamaModel { cfg, weights, inv_freq, kv, blas, kernels, gemv, sampler, stream, buckets, .. } =
            self;
        let b = buckets.get_mut(&batch).ok_or_else(|| misuse("bucket vanished".into()))?;
        b.write_rows(rows, None)?;
        let Bucket { buf, in_tokens, in_slots, in_positions, in_params, .. } = b;
        copy_in(stream, buf, in_tokens, in_slots, in_positions, in_params)?;
        DecodeStep { cfg, w: weights, inv_freq, kv, buf: &mut b.buf, blas, kernels, gemv: *gemv, sampler }
            .sync_on(stream)?;
        b.out_next.copy_from_device_async(stream, &b.buf.next)?;
        let next = b.out_next.as_slice()?[..rows.len()].to_vec();
        self.commit(rows, batch);
        // As `read_next` checks the graph step's tokens (found by review: all-NaN logits gave
        // u32::MAX here, handed out as a token).
        in_vocab(next.iter().copied(), self.cfg.vocab)?;
        Ok(next)
    }

    /// The logits (`f32`, `[rows][vocab]`) of the last step's rows.
    ///
    /// # Errors
    /// No step has completed yet (or the last one failed, or its future was dropped before it
    /// finished), or its bucket was evicted since; copy errors.
    pub fn last_logits(&self) -> Result<Vec<f32>> {
        let (batch, n) = self.last_rows.ok_or_else(|| misuse("no step has completed".into()))?;
        let b = self.buckets.get(&batch).ok_or_else(|| misuse("bucket evicted".into()))?;
        let mut all = vec![0f32; b.buf.logits.len()];
        b.buf.logits.copy_to_host(&self.stream, &mut all)?;
        all.truncate(n * self.cfg.vocab);
        Ok(all)
    }

    /// Feeds `tokens` to `slot` from position 0, one step per token (the prompt, teacher-forced),
    /// and returns each step's logits (`[tokens.len()][vocab]`). The slot is reset first.
    ///
    /// # Errors
    /// As for [`LlamaModel::step`].
    pub fn forced_logits(&mut self, slot: u32, tokens: &[u32]) -> Result<Vec<Vec<f32>>> {
        self.release_slot(slot)?;
        let mut out = Vec::with_capacity(tokens.len());
        for (p, &t) in tokens.iter().enumerate() {
            self.step(&[Row { slot, position: p as u32, token: t }])?;
            out.push(self.last_logits()?);
        }
        Ok(out)
    }

    /// Greedy generation in `slot`: feeds the prompt, then `n` tokens chosen by argmax; returns
    /// the generated tokens. The slot is reset first.
    ///
    /// # Errors
    /// An empty prompt, a prompt plus `n` longer than the cache, and as for [`LlamaModel::step`].
    pub fn generate(&mut self, slot: u32, prompt: &[u32], n: usize) -> Result<Vec<u32>> {
        // `checked_add`: a huge `n` must be refused, not wrap past the check (found by review).
        if prompt.is_empty() || prompt.len().checked_add(n).is_none_or(|t| t > self.opts.max_seq) {
            return Err(misuse(format!(
                "a prompt of {} tokens plus {n} generated does not fit {} positions (or the prompt is empty)",
                prompt.len(),
                self.opts.max_seq
            )));
        }
        self.release_slot(slot)?;
        let mut next = 0;
        for (p, &t) in prompt.iter().enumerate() {
            next = self.step(&[Row { slot, position: p as u32, token: t }])?[0];
        }
        let mut out = Vec::with_capacity(n);
        for i in 0..n {
            out.push(next);
            if i + 1 < n {
                next = self.step(&[Row { slot, position: (prompt.len() + i) as u32, token: next }])?[0];
            }
        }
        Ok(out)
    }
}

/// Not [`cuda_async::graph::Replicable`]: a step reads the KV cache that the sequence's earlier
/// steps wrote, so `cuda_async::Replicas<LlamaModel>` (which sends each pass to any free replica)
/// does not compile. Serve several models by routing each sequence to the model holding its slot.
impl Module for LlamaModel {
    /// The rows of one decode step.
    type Input = Vec<Row>;
    /// The greedy next token of each row.
    type Output = Vec<u32>;

    fn forward(&mut self, input: Vec<Row>) -> Result<Vec<u32>> {
        self.step(&input)
    }

    async fn forward_async(&mut self, input: Vec<Row>) -> Result<Vec<u32>> {
        self.step_async(&input).await
    }
}

/// Refuses tokens outside the vocabulary among a step's or prefill's results: the argmax of a row
/// whose logits are all NaN (NaN or infinite weights) is `u32::MAX`. Found by review: such a token
/// was handed out, and a server fed it back in its next step.
pub(super) fn in_vocab(tokens: impl IntoIterator<Item = u32>, vocab: usize) -> Result<()> {
    match tokens.into_iter().find(|&t| t as usize >= vocab) {
        Some(t) => Err(DeviceError::shape(
            "reading a step's tokens",
            format!("token {t} is outside the vocabulary of {vocab} (NaN logits: NaN or infinite weights?)"),
        )),
        None => Ok(()),
    }
}

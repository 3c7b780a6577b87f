//! [`LlamaEngine`]: the [`Engine`] over `models::llama::LlamaModel`, owned by a dedicated thread
//! (the model is not `Sync`) and driven over channels.
//!
//! A decode call is one replay of the decode graph of the rows' bucket
//! ([`LlamaModel::step_sampled_in_bucket`]); a prefill call is one replay of the chunk graph of the
//! pieces' prefill bucket ([`LlamaModel::prefill_sampled_in_bucket`]): GEMMs over every prompt
//! token of the call and a causal attention over the cache. Sampled rows and pieces draw their
//! tokens on the GPU inside those graphs, from counters that depend only on the request's seed and
//! the position, so a replay of a request alone along its recorded buckets gives its tokens bit for
//! bit.

use crate::engine::{
    DecodeRow, Engine, EngineError, EngineLimits, PrefillPiece, PrefillResult, ReplayPath, StepResult,
};
use models::llama::{LlamaModel, PrefillSeq, Row};
use std::sync::mpsc;
use tokio::sync::oneshot;

type Reply<T> = oneshot::Sender<Result<T, EngineError>>;

/// Where a served model's weights come from.
#[derive(Debug, Clone, PartialEq)]
pub enum ModelSource {
    /// A Hugging Face folder (`config.json`, `model.safetensors`).
    HfDir(std::path::PathBuf),
    /// Random weights drawn on the GPU from `seed`, in the shape `"small"`
    /// (`LlamaConfig::small`) or `"1b"` (`LlamaConfig::llama_3_2_1b`).
    Seeded {
        /// `"small"` or `"1b"`.
        shape: String,
        /// The weights' seed.
        seed: u64,
    },
}

/// Builds the model on device 0 from `source` with `opts` and captures every decode and
/// prefill bucket ([`LlamaModel::capture_all`]), so that no request pays for a capture. Meant to
/// run on the engine's thread (as [`LlamaEngine::start`]'s `build`).
///
/// # Errors
/// The device, loading, option or capture error, as text.
pub fn build_model(source: &ModelSource, opts: models::llama::ModelOptions) -> Result<LlamaModel, String> {
    let e = |e: &dyn std::fmt::Display| e.to_string();
    let stream = cuda_core::Device::new(0).and_then(|d| d.new_stream()).map_err(|x| e(&x))?;
    let mut m = match source {
        ModelSource::HfDir(dir) => LlamaModel::from_hf_dir(&stream, dir, opts).map_err(|x| e(&x))?,
        ModelSource::Seeded { shape, seed } => {
            let cfg = match shape.as_str() {
                "small" => models::llama::LlamaConfig::small(),
                "1b" => models::llama::LlamaConfig::llama_3_2_1b(),
                other => return Err(format!("unknown shape {other:?} (small or 1b)")),
            };
            let w = models::llama::DeviceWeights::random(&stream, &cfg, *seed, 0.02).map_err(|x| e(&x))?;
            LlamaModel::new(&stream, cfg, w, opts).map_err(|x| e(&x))?
        }
    };
    m.capture_all().map_err(|x| e(&x))?;
    Ok(m)
}

enum Cmd {
    Decode(Vec<DecodeRow>, Reply<StepResult>),
    Prefill(Vec<PrefillPiece>, Reply<PrefillResult>),
    Release(u32),
    Replay(u32, ReplayPath, Reply<Vec<u32>>),
}

/// The GPU engine: a handle to the thread that owns the model.
#[derive(Debug)]
pub struct LlamaEngine {
    tx: mpsc::Sender<Cmd>,
    limits: EngineLimits,
}

impl std::fmt::Debug for Cmd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Cmd")
    }
}

fn dev(what: &'static str) -> impl Fn(cuda_async::DeviceError) -> EngineError {
    move |e| EngineError::Device { what, msg: e.to_string() }
}

impl LlamaEngine {
    /// Starts the model thread: `build` runs there and makes the model; `prefill_tokens` is
    /// the prompt-token budget of a prefill call.
    ///
    /// ```no_run
    /// use models::llama::{DeviceWeights, LlamaConfig, LlamaModel, ModelOptions};
    /// let engine = server::llama_engine::LlamaEngine::start(|| {
    ///     let stream = cuda_core::Device::new(0).map_err(|e| e.to_string())?.new_stream().map_err(|e| e.to_string())?;
    ///     let cfg = LlamaConfig::small();
    ///     let w = DeviceWeights::random(&stream, &cfg, 7, 0.02).map_err(|e| e.to_string())?;
    ///     LlamaModel::new(&stream, cfg, w, ModelOptions { slots: 8, max_seq: 256, ..Default::default() }).map_err(|e| e.to_string())
    /// }, 256).unwrap();
    /// ```
    ///
    /// # Errors
    /// [`EngineError::Device`] with `build`'s message when it fails; [`EngineError::Stopped`]
    /// if the thread cannot start.
    pub fn start<F>(build: F, prefill_tokens: u32) -> Result<LlamaEngine, EngineError>
    where
        F: FnOnce() -> Result<LlamaModel, String> + Send + 'static,
    {
        let (tx, rx) = mpsc::channel::<Cmd>();
        let (ltx, lrx) = mpsc::channel();
        std::thread::Builder::new()
            .name("llama-engine".into())
            .spawn(move || {
                let mut model = match build() {
                    Ok(m) => m,
                    Err(msg) => {
                        let _ = ltx.send(Err(EngineError::Device { what: "building the model", msg }));
                        return;
                    }
                };
                let o = model.options();
                let largest = o.buckets.last().copied().unwrap_or(1) as u32;
                let largest_chunk = o.prefill_buckets.last().copied().unwrap_or(1) as u32;
                let limits = EngineLimits {
                    slots: o.slots as u32,
                    max_seq: o.max_seq as u32,
                    vocab: model.config().vocab as u32,
                    max_decode_rows: largest.min(o.slots as u32),
                    // A chunk of C rows has min(C, slots) logit rows; every piece has a token,
                    // so the pieces of one call never exceed that.
                    max_prefill_pieces: largest_chunk.min(o.slots as u32),
                    prefill_tokens: prefill_tokens.clamp(1, largest_chunk),
                };
                let _ = ltx.send(Ok(limits));
                while let Ok(cmd) = rx.recv() {
                    match cmd {
                        Cmd::Decode(rows, r) => drop(r.send(decode(&mut model, &rows))),
                        Cmd::Prefill(p, r) => drop(r.send(prefill(&mut model, &p))),
                        Cmd::Release(slot) => drop(model.release_slot(slot)),
                        Cmd::Replay(slot, path, r) => drop(r.send(replay(&mut model, slot, &path))),
                    }
                }
            })
            .map_err(|_| EngineError::Stopped)?;
        let limits = lrx.recv().map_err(|_| EngineError::Stopped)??;
        Ok(LlamaEngine { tx, limits })
    }

    async fn call<T>(&self, make: impl FnOnce(Reply<T>) -> Cmd) -> Result<T, EngineError> {
        let (tx, rx) = oneshot::channel();
        self.tx.send(make(tx)).map_err(|_| EngineError::Stopped)?;
        rx.await.map_err(|_| EngineError::Stopped)?
    }
}

fn sampling(s: &crate::engine::Sampling) -> models::llama::Sampling {
    models::llama::Sampling { temperature: s.temperature, top_p: s.top_p, top_k: s.top_k, seed: s.seed }
}

/// One replay of the decode graph of `bucket` for `rows`.
fn step(model: &mut LlamaModel, rows: &[DecodeRow], bucket: usize) -> Result<Vec<u32>, EngineError> {
    metrics::counter!(crate::metrics::GRAPH_REPLAYS).increment(1);
    let r: Vec<Row> =
        rows.iter().map(|r| Row { slot: r.slot, position: r.position, token: r.token }).collect();
    let s: Vec<_> = rows.iter().map(|r| sampling(&r.sampling)).collect();
    model.step_sampled_in_bucket(&r, &s, bucket).map_err(dev("a decode step"))
}

fn decode(model: &mut LlamaModel, rows: &[DecodeRow]) -> Result<StepResult, EngineError> {
    let bucket = model.bucket_of(rows.len()).map_err(dev("choosing a bucket"))?;
    Ok(StepResult { tokens: step(model, rows, bucket)?, bucket: bucket as u32 })
}

fn prefill(model: &mut LlamaModel, pieces: &[PrefillPiece]) -> Result<PrefillResult, EngineError> {
    let tokens = pieces.iter().map(|p| p.tokens.len()).sum();
    let bucket = model.prefill_bucket_of(tokens).map_err(dev("choosing a prefill bucket"))?;
    Ok(PrefillResult { next: prefill_in(model, pieces, bucket)?, bucket: bucket as u32 })
}

/// One replay of the chunk graph of prefill bucket `bucket` for `pieces`.
fn prefill_in(
    model: &mut LlamaModel,
    pieces: &[PrefillPiece],
    bucket: usize,
) -> Result<Vec<Option<u32>>, EngineError> {
    metrics::counter!(crate::metrics::GRAPH_REPLAYS).increment(1);
    let seqs: Vec<PrefillSeq<'_>> = pieces
        .iter()
        .map(|p| PrefillSeq { slot: p.slot, start: p.start, tokens: &p.tokens, want_next: p.want_next })
        .collect();
    let s: Vec<_> = pieces.iter().map(|p| sampling(&p.sampling)).collect();
    model.prefill_sampled_in_bucket(&seqs, &s, bucket).map_err(dev("a prefill"))
}

fn replay(model: &mut LlamaModel, slot: u32, path: &ReplayPath) -> Result<Vec<u32>, EngineError> {
    model.release_slot(slot).map_err(dev("releasing a slot"))?;
    let result = replay_in(model, slot, path);
    model.release_slot(slot).map_err(dev("releasing a slot"))?;
    result
}

fn replay_in(model: &mut LlamaModel, slot: u32, path: &ReplayPath) -> Result<Vec<u32>, EngineError> {
    let sampling = path.sampling.unwrap_or(crate::engine::Sampling::GREEDY);
    let mut out = Vec::new();
    for p in &path.prefill {
        let piece =
            PrefillPiece { slot, start: p.start, tokens: p.tokens.clone(), want_next: p.want_next, sampling };
        out.extend(prefill_in(model, &[piece], p.bucket as usize)?.into_iter().flatten());
    }
    for d in &path.decode {
        let token = *out
            .last()
            .ok_or(EngineError::Invalid { what: "replaying a path", msg: "no token to feed".into() })?;
        let row = DecodeRow { slot, position: d.position, token, sampling };
        out.push(step(model, &[row], d.bucket as usize)?[0]);
    }
    Ok(out)
}

impl Engine for LlamaEngine {
    fn limits(&self) -> EngineLimits {
        self.limits.clone()
    }

    async fn decode(&mut self, rows: &[DecodeRow]) -> Result<StepResult, EngineError> {
        let rows = rows.to_vec();
        self.call(|r| Cmd::Decode(rows, r)).await
    }

    async fn prefill(&mut self, pieces: &[PrefillPiece]) -> Result<PrefillResult, EngineError> {
        let pieces = pieces.to_vec();
        self.call(|r| Cmd::Prefill(pieces, r)).await
    }

    fn release(&mut self, slot: u32) {
        let _ = self.tx.send(Cmd::Release(slot));
    }

    async fn replay(&mut self, slot: u32, path: &ReplayPath) -> Result<Vec<u32>, EngineError> {
        let path = path.clone();
        self.call(|r| Cmd::Replay(slot, path, r)).await
    }
}

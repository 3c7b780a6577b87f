//! The model behind the batcher: the [`Engine`] trait, its rows and pieces, and the path a request
//! was served on ([`ReplayPath`]).

use std::future::Future;

/// How the next token of a row is chosen. `temperature == 0` is greedy (argmax).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Sampling {
    /// Softmax temperature (`>= 0`, finite); `0` picks the argmax.
    pub temperature: f32,
    /// Nucleus mass in `(0, 1]`.
    pub top_p: f32,
    /// Keep the `top_k` most likely tokens (`0` = off).
    pub top_k: u32,
    /// The request's seed: the draw at a position depends only on it and the logits.
    pub seed: u64,
}

impl Sampling {
    /// Greedy decoding (temperature 0).
    pub const GREEDY: Sampling = Sampling { temperature: 0.0, top_p: 1.0, top_k: 0, seed: 0 };

    /// Whether this picks the argmax.
    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0
    }

    /// The rules every engine's sampler holds a setting to (the model's `Sampling::validate`):
    /// a finite temperature `>= 0`, a finite `top_p` in `(0, 1]`.
    ///
    /// # Errors
    /// A message naming the bad parameter.
    pub fn validate(&self) -> Result<(), String> {
        if !self.temperature.is_finite() || self.temperature < 0.0 {
            return Err(format!("temperature {} must be finite and >= 0", self.temperature));
        }
        if !self.top_p.is_finite() || self.top_p <= 0.0 || self.top_p > 1.0 {
            return Err(format!("top_p {} must be finite, > 0 and <= 1", self.top_p));
        }
        Ok(())
    }
}

/// One row of a decode step: feed `token` at `position` of the sequence in `slot`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DecodeRow {
    /// KV-cache slot (distinct within a step).
    pub slot: u32,
    /// Position of `token` in its sequence.
    pub position: u32,
    /// The token fed.
    pub token: u32,
    /// How this row's next token is chosen.
    pub sampling: Sampling,
}

/// A run of prompt tokens of one sequence, fed from position `start`.
#[derive(Debug, Clone, PartialEq)]
pub struct PrefillPiece {
    /// KV-cache slot (distinct within a call).
    pub slot: u32,
    /// Position of `tokens[0]`.
    pub start: u32,
    /// The tokens (at least one).
    pub tokens: Vec<u32>,
    /// Whether the token after the piece is wanted (the piece ends the prompt).
    pub want_next: bool,
    /// How that next token is chosen.
    pub sampling: Sampling,
}

/// What an engine can do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineLimits {
    /// KV-cache slots (sequences in flight).
    pub slots: u32,
    /// Positions per slot (prompt + generated).
    pub max_seq: u32,
    /// Vocabulary size.
    pub vocab: u32,
    /// Most rows in one decode step.
    pub max_decode_rows: u32,
    /// Most pieces in one prefill call.
    pub max_prefill_pieces: u32,
    /// Prompt tokens per prefill call.
    pub prefill_tokens: u32,
}

/// The result of one decode step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepResult {
    /// The next token of each row, in row order.
    pub tokens: Vec<u32>,
    /// The bucket (padded batch size) the step ran in.
    pub bucket: u32,
}

/// The result of one prefill call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrefillResult {
    /// Per piece, in order: `Some(next token)` where `want_next`, else `None`.
    pub next: Vec<Option<u32>>,
    /// The bucket the call ran in.
    pub bucket: u32,
}

/// A failure of the engine.
#[derive(Debug, Clone, thiserror::Error)]
pub enum EngineError {
    /// The rows or pieces break the engine's rules (a bug of the caller).
    #[error("invalid input to the engine ({what}): {msg}")]
    Invalid {
        /// What was being done.
        what: &'static str,
        /// Why it was refused.
        msg: String,
    },
    /// The device failed.
    #[error("device error while {what}: {msg}")]
    Device {
        /// What was being done.
        what: &'static str,
        /// The driver's or model's message.
        msg: String,
    },
    /// The engine's thread is gone.
    #[error("the engine has stopped")]
    Stopped,
    /// Too much of a kind of work is queued already (replays: at most
    /// `crate::batcher::MAX_QUEUED_REPLAYS`); try again later.
    #[error("busy: {0}")]
    Busy(&'static str),
}

/// One prefill piece of a served request, with the bucket its call ran in.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PrefillRecord {
    /// Position of the first token.
    pub start: u32,
    /// The tokens.
    pub tokens: Vec<u32>,
    /// Whether the piece produced the first generated token.
    pub want_next: bool,
    /// The bucket of the call.
    pub bucket: u32,
}

/// One decode step of a served request: the position fed and the step's bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DecodeRecord {
    /// Position of the fed token.
    pub position: u32,
    /// The bucket of the step.
    pub bucket: u32,
}

/// The path a request was served on: replaying it alone along the same pieces and buckets gives
/// the same tokens, since a row does not depend on its neighbours within a bucket.
#[derive(Debug, Clone, PartialEq, Default, serde::Serialize, serde::Deserialize)]
pub struct ReplayPath {
    /// The prefill pieces, in order.
    pub prefill: Vec<PrefillRecord>,
    /// The decode steps, in order.
    pub decode: Vec<DecodeRecord>,
    /// The sampling parameters (the same for every step).
    pub sampling: Option<Sampling>,
}

/// A model the batcher drives. Rows of one call have distinct slots; a slot's positions are fed
/// in order, starting from 0 after [`Engine::release`].
pub trait Engine: Send + 'static {
    /// The engine's limits.
    fn limits(&self) -> EngineLimits;

    /// One decode step: the next token of each row.
    ///
    /// # Errors
    /// Invalid rows, device failures.
    fn decode(&mut self, rows: &[DecodeRow]) -> impl Future<Output = Result<StepResult, EngineError>> + Send;

    /// One prefill call over `pieces`.
    ///
    /// # Errors
    /// Invalid pieces, device failures.
    fn prefill(
        &mut self,
        pieces: &[PrefillPiece],
    ) -> impl Future<Output = Result<PrefillResult, EngineError>> + Send;

    /// Forgets the sequence in `slot`.
    fn release(&mut self, slot: u32);

    /// Replays `path` alone in the free `slot` (same pieces in the same buckets, each decode
    /// step in its recorded bucket, feeding its own tokens) and returns the generated tokens:
    /// the token after the last prefill piece, then one per decode step. The slot is released
    /// afterwards.
    ///
    /// # Errors
    /// A path that does not fit the engine, device failures.
    fn replay(
        &mut self,
        slot: u32,
        path: &ReplayPath,
    ) -> impl Future<Output = Result<Vec<u32>, EngineError>> + Send;
}

//! [`FakeEngine`]: a deterministic CPU engine for tests: the next token is a hash of the slot's
//! history (and, for sampled rows, of the seed and position; optionally of the bucket).

use crate::engine::{
    DecodeRow, Engine, EngineError, EngineLimits, PrefillPiece, PrefillResult, ReplayPath, Sampling,
    StepResult,
};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// A deterministic engine on the CPU.
///
/// ```
/// use server::fake::FakeEngine;
/// use server::engine::Sampling;
/// let toks = FakeEngine::expected(2048, &[5, 6, 7], Sampling::GREEDY, 4, &[]);
/// assert_eq!(toks.len(), 4);
/// ```
#[derive(Debug)]
pub struct FakeEngine {
    limits: EngineLimits,
    history: Vec<Vec<u32>>,
    delay: Duration,
    /// Whether `delay` is kept to the microsecond (a blocking-pool thread sleeps and then spins)
    /// instead of a tokio sleep (millisecond timer granularity).
    precise: bool,
    bucket_sensitive: bool,
    steps: Arc<AtomicU64>,
}

fn mix(mut h: u64, x: u64) -> u64 {
    h ^= x.wrapping_add(0x9e37_79b9_7f4a_7c15).wrapping_add(h << 6).wrapping_add(h >> 2);
    h = (h ^ (h >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h = (h ^ (h >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

impl FakeEngine {
    /// An engine of `slots` slots of `max_seq` positions, vocabulary `vocab`, decode buckets the
    /// powers of two up to `slots`, and `prefill_tokens` prompt tokens per prefill call.
    pub fn new(slots: u32, max_seq: u32, vocab: u32, prefill_tokens: u32) -> FakeEngine {
        FakeEngine {
            limits: EngineLimits {
                slots,
                max_seq,
                vocab,
                max_decode_rows: slots,
                max_prefill_pieces: slots,
                prefill_tokens,
            },
            history: vec![Vec::new(); slots as usize],
            delay: Duration::ZERO,
            precise: false,
            bucket_sensitive: false,
            steps: Arc::new(AtomicU64::new(0)),
        }
    }

    /// Sleeps `delay` in every call (a GPU step's duration).
    pub fn with_delay(mut self, delay: Duration) -> FakeEngine {
        self.delay = delay;
        self
    }

    /// Like [`FakeEngine::with_delay`], but the delay is kept to the microsecond: each call waits on
    /// a blocking-pool thread that sleeps until shortly before the end and spins the rest, as a
    /// model thread waiting on the GPU would (a tokio sleep rounds up to the timer's millisecond).
    /// For timing the batcher itself (`llama-batch-bench --fake --fake-step-us N`).
    pub fn with_precise_delay(mut self, delay: Duration) -> FakeEngine {
        self.delay = delay;
        self.precise = true;
        self
    }

    /// Mixes the bucket into every token, so a replay in another bucket gives other tokens.
    pub fn bucket_sensitive(mut self, on: bool) -> FakeEngine {
        self.bucket_sensitive = on;
        self
    }

    /// A counter of decode and prefill calls (shared; it keeps counting after the engine moves).
    pub fn step_counter(&self) -> Arc<AtomicU64> {
        self.steps.clone()
    }

    /// The token after `history` (all tokens fed so far) under `sampling`, in `bucket` (`0`
    /// when the engine is not bucket sensitive).
    pub fn next_token(vocab: u32, history: &[u32], sampling: Sampling, bucket: u32) -> u32 {
        let mut h = 0x1234_5678u64;
        for &t in history {
            h = mix(h, u64::from(t));
        }
        if !sampling.is_greedy() {
            h = mix(h, sampling.seed);
            h = mix(h, history.len() as u64);
            h = mix(h, u64::from(sampling.temperature.to_bits()));
        }
        h = mix(h, u64::from(bucket));
        (h % u64::from(vocab.max(1))) as u32
    }

    /// The `n` tokens a bucket-insensitive engine generates after `prompt`, stopping early after
    /// any token of `eos` (included).
    pub fn expected(vocab: u32, prompt: &[u32], sampling: Sampling, n: usize, eos: &[u32]) -> Vec<u32> {
        let mut hist = prompt.to_vec();
        let mut out = Vec::new();
        while out.len() < n {
            let t = FakeEngine::next_token(vocab, &hist, sampling, 0);
            out.push(t);
            hist.push(t);
            if eos.contains(&t) {
                break;
            }
        }
        out
    }

    fn bucket_for(&self, n: usize) -> u32 {
        (n.max(1) as u32).next_power_of_two().min(self.limits.slots.next_power_of_two())
    }

    fn feed(&mut self, what: &'static str, slot: u32, position: u32, token: u32) -> Result<(), EngineError> {
        let bad = |msg: String| EngineError::Invalid { what, msg };
        if token >= self.limits.vocab {
            return Err(bad(format!("token {token} outside the vocabulary")));
        }
        if position >= self.limits.max_seq {
            return Err(bad(format!("position {position} beyond max_seq")));
        }
        let h =
            self.history.get_mut(slot as usize).ok_or_else(|| bad(format!("slot {slot} out of range")))?;
        if position as usize > h.len() {
            return Err(bad(format!(
                "slot {slot} holds {} positions; position {position} skips some",
                h.len()
            )));
        }
        h.truncate(position as usize);
        h.push(token);
        Ok(())
    }

    fn decode_in(&mut self, rows: &[DecodeRow], bucket: u32) -> Result<Vec<u32>, EngineError> {
        let mut seen = std::collections::HashSet::new();
        if rows.is_empty() || rows.len() > self.limits.max_decode_rows as usize {
            return Err(EngineError::Invalid { what: "a decode step", msg: format!("{} rows", rows.len()) });
        }
        let mut out = Vec::with_capacity(rows.len());
        for r in rows {
            if !seen.insert(r.slot) {
                return Err(EngineError::Invalid {
                    what: "a decode step",
                    msg: format!("slot {} twice", r.slot),
                });
            }
            self.feed("a decode step", r.slot, r.position, r.token)?;
            let b = if self.bucket_sensitive { bucket } else { 0 };
            out.push(FakeEngine::next_token(
                self.limits.vocab,
                &self.history[r.slot as usize],
                r.sampling,
                b,
            ));
        }
        Ok(out)
    }

    fn prefill_in(&mut self, pieces: &[PrefillPiece], bucket: u32) -> Result<Vec<Option<u32>>, EngineError> {
        let mut out = Vec::with_capacity(pieces.len());
        for p in pieces {
            if p.tokens.is_empty() {
                return Err(EngineError::Invalid { what: "a prefill call", msg: "an empty piece".into() });
            }
            for (i, &t) in p.tokens.iter().enumerate() {
                let pos = p.start.checked_add(i as u32).ok_or(EngineError::Invalid {
                    what: "a prefill call",
                    msg: "position overflow".into(),
                })?;
                self.feed("a prefill call", p.slot, pos, t)?;
            }
            let b = if self.bucket_sensitive { bucket } else { 0 };
            out.push(p.want_next.then(|| {
                FakeEngine::next_token(self.limits.vocab, &self.history[p.slot as usize], p.sampling, b)
            }));
        }
        Ok(out)
    }

    async fn pause(&self) {
        self.steps.fetch_add(1, Ordering::Relaxed);
        self.wait_delay().await;
    }

    /// Waits `delay` (a GPU step's duration) without counting a step.
    async fn wait_delay(&self) {
        if self.delay.is_zero() {
            return;
        }
        if !self.precise {
            tokio::time::sleep(self.delay).await;
            return;
        }
        let delay = self.delay;
        let wait = move || {
            let end = std::time::Instant::now() + delay;
            if let Some(coarse) = delay.checked_sub(Duration::from_micros(200)) {
                std::thread::sleep(coarse);
            }
            while std::time::Instant::now() < end {
                std::hint::spin_loop();
            }
        };
        if tokio::task::spawn_blocking(wait).await.is_err() {
            // The blocking pool is gone (runtime shutting down): nothing left to time.
        }
    }
}

impl Engine for FakeEngine {
    fn limits(&self) -> EngineLimits {
        self.limits.clone()
    }

    async fn decode(&mut self, rows: &[DecodeRow]) -> Result<StepResult, EngineError> {
        self.pause().await;
        let bucket = self.bucket_for(rows.len());
        Ok(StepResult { tokens: self.decode_in(rows, bucket)?, bucket })
    }

    async fn prefill(&mut self, pieces: &[PrefillPiece]) -> Result<PrefillResult, EngineError> {
        self.pause().await;
        let total: usize = pieces.iter().map(|p| p.tokens.len()).sum();
        if pieces.is_empty() || total > self.limits.prefill_tokens as usize {
            return Err(EngineError::Invalid { what: "a prefill call", msg: format!("{total} tokens") });
        }
        let bucket = self.bucket_for(pieces.len());
        Ok(PrefillResult { next: self.prefill_in(pieces, bucket)?, bucket })
    }

    fn release(&mut self, slot: u32) {
        if let Some(h) = self.history.get_mut(slot as usize) {
            h.clear();
        }
    }

    async fn replay(&mut self, slot: u32, path: &ReplayPath) -> Result<Vec<u32>, EngineError> {
        self.release(slot);
        let sampling = path.sampling.unwrap_or(Sampling::GREEDY);
        let mut out = Vec::new();
        for p in &path.prefill {
            let piece = PrefillPiece {
                slot,
                start: p.start,
                tokens: p.tokens.clone(),
                want_next: p.want_next,
                sampling,
            };
            if let Some(t) = self.prefill_in(&[piece], p.bucket)?[0] {
                out.push(t);
            }
            // The GPU engine replays one graph per recorded piece and step: a replay costs as
            // many steps' time (not counted as steps).
            self.wait_delay().await;
        }
        for d in &path.decode {
            let token = *out.last().ok_or(EngineError::Invalid {
                what: "replaying a path",
                msg: "a decode step before any generated token".into(),
            })?;
            out.push(
                self.decode_in(&[DecodeRow { slot, position: d.position, token, sampling }], d.bucket)?[0],
            );
            self.wait_delay().await;
        }
        self.release(slot);
        Ok(out)
    }
}

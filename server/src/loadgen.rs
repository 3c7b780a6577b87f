//! The in-process load of `llama-batch-bench`: clients submitting random prompts straight to the
//! batcher, some sampled, some cancelled, with same-path verification.

use crate::batcher::{BatcherHandle, Event, GenRequest, SubmitError};
use crate::engine::Sampling;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use std::time::{Duration, Instant};

/// The load.
#[derive(Debug, Clone, PartialEq)]
pub struct LoadConfig {
    /// Concurrent clients.
    pub clients: usize,
    /// Requests each client sends, one after another.
    pub requests_per_client: usize,
    /// Prompt length (random token ids).
    pub prompt_tokens: usize,
    /// `max_tokens` of every request.
    pub max_tokens: u32,
    /// Fraction of requests sampled (the rest greedy).
    pub sampled_fraction: f64,
    /// Fraction of requests cancelled after a random number of tokens.
    pub cancel_fraction: f64,
    /// Seed of every choice.
    pub seed: u64,
    /// Replay every completed stream and compare.
    pub verify: bool,
}

/// Percentiles in milliseconds.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Percentiles {
    /// Median.
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Mean.
    pub mean: f64,
}

impl Percentiles {
    /// Of `v` (seconds), in milliseconds; zeros when empty.
    pub fn of_seconds(v: &mut [f64]) -> Percentiles {
        if v.is_empty() {
            return Percentiles::default();
        }
        v.sort_by(f64::total_cmp);
        let at = |q: f64| v[((q * (v.len() - 1) as f64).round() as usize).min(v.len() - 1)] * 1e3;
        Percentiles {
            p50: at(0.5),
            p90: at(0.9),
            p99: at(0.99),
            mean: v.iter().sum::<f64>() / v.len() as f64 * 1e3,
        }
    }
}

/// The same-path check.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Verify {
    /// Streams replayed.
    pub streams: usize,
    /// Tokens compared.
    pub tokens_checked: usize,
    /// Tokens equal to the replay's.
    pub tokens_equal: usize,
    /// Streams with any difference (including length).
    pub mismatched_streams: usize,
}

/// What a load run measured.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct LoadOutcome {
    /// Requests that ran to their end.
    pub completed: usize,
    /// Requests cancelled by their client.
    pub cancelled: usize,
    /// Requests refused or aborted.
    pub errors: usize,
    /// Tokens received.
    pub generated_tokens: usize,
    /// Wall time of the run.
    pub wall_s: f64,
    /// Time to first token.
    pub ttft_ms: Percentiles,
    /// Gaps between consecutive tokens of a stream.
    pub tpot_ms: Percentiles,
    /// The same-path check, when asked.
    pub verify: Option<Verify>,
}

struct One {
    id: String,
    tokens: Vec<u32>,
    ttft: Option<f64>,
    gaps: Vec<f64>,
    completed: bool,
    cancelled: bool,
    error: bool,
}

/// Whether request `r` of client `c` is sampled and after how many tokens it is cancelled.
pub fn choice(cfg: &LoadConfig, c: usize, r: usize) -> (Option<Sampling>, Option<u32>, rand::rngs::StdRng) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(
        cfg.seed ^ ((c as u64) << 32 | r as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15),
    );
    let sampled = rng.random::<f64>() < cfg.sampled_fraction;
    let cancel = rng.random::<f64>() < cfg.cancel_fraction;
    let after = rng.random_range(1..cfg.max_tokens.max(2));
    let sampling = sampled.then(|| Sampling { temperature: 0.8, top_p: 0.95, top_k: 50, seed: rng.random() });
    (sampling, cancel.then_some(after), rng)
}

async fn one(h: BatcherHandle, cfg: LoadConfig, c: usize, r: usize, vocab: u32) -> One {
    let (sampling, cancel_after, mut rng) = choice(&cfg, c, r);
    let lo = 5.min(vocab.saturating_sub(1));
    let prompt: Vec<u32> =
        (0..cfg.prompt_tokens.max(1)).map(|_| rng.random_range(lo..vocab.max(lo + 1))).collect();
    let id = format!("bench-{c}-{r}");
    let req = GenRequest {
        id: id.clone(),
        prompt,
        max_tokens: cfg.max_tokens,
        sampling: sampling.unwrap_or(Sampling::GREEDY),
    };
    let mut o = One {
        id,
        tokens: Vec::new(),
        ttft: None,
        gaps: Vec::new(),
        completed: false,
        cancelled: false,
        error: false,
    };
    let start = Instant::now();
    let mut rx = loop {
        match h.submit(req.clone()) {
            Ok(rx) => break rx,
            Err(SubmitError::QueueFull(_)) => tokio::time::sleep(Duration::from_millis(5)).await,
            Err(_) => {
                o.error = true;
                return o;
            }
        }
    };
    let mut last = start;
    while let Some(ev) = rx.recv().await {
        match ev {
            Event::Token(t) => {
                let now = Instant::now();
                if o.tokens.is_empty() {
                    o.ttft = Some((now - start).as_secs_f64());
                } else {
                    o.gaps.push((now - last).as_secs_f64());
                }
                last = now;
                o.tokens.push(t);
                if cancel_after.is_some_and(|n| o.tokens.len() as u32 >= n) {
                    o.cancelled = true;
                    return o; // dropping `rx` cancels
                }
            }
            Event::Done(crate::batcher::Finish::Aborted(_)) => {
                o.error = true;
                return o;
            }
            Event::Done(_) => {
                o.completed = true;
                return o;
            }
        }
    }
    o.error = true;
    o
}

/// Runs the load against `h` and, with `verify`, replays every completed stream (the batcher
/// must keep at least `clients * requests_per_client` paths).
///
/// # Errors
/// A replay that fails in the engine.
pub async fn run(h: &BatcherHandle, cfg: &LoadConfig) -> Result<LoadOutcome, crate::engine::EngineError> {
    let vocab = h.limits().vocab;
    let t0 = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..cfg.clients {
        let (h, cfg) = (h.clone(), cfg.clone());
        tasks.push(tokio::spawn(async move {
            let mut v = Vec::new();
            for r in 0..cfg.requests_per_client {
                v.push(one(h.clone(), cfg.clone(), c, r, vocab).await);
            }
            v
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        match t.await {
            Ok(v) => all.extend(v),
            Err(_) => all.push(One {
                id: String::new(),
                tokens: vec![],
                ttft: None,
                gaps: vec![],
                completed: false,
                cancelled: false,
                error: true,
            }),
        }
    }
    let wall_s = t0.elapsed().as_secs_f64();
    let mut ttft: Vec<f64> = all.iter().filter_map(|o| o.ttft).collect();
    let mut gaps: Vec<f64> = all.iter().flat_map(|o| o.gaps.iter().copied()).collect();
    let mut out = LoadOutcome {
        completed: all.iter().filter(|o| o.completed).count(),
        cancelled: all.iter().filter(|o| o.cancelled).count(),
        errors: all.iter().filter(|o| o.error).count(),
        generated_tokens: all.iter().map(|o| o.tokens.len()).sum(),
        wall_s,
        ttft_ms: Percentiles::of_seconds(&mut ttft),
        tpot_ms: Percentiles::of_seconds(&mut gaps),
        verify: None,
    };
    if cfg.verify {
        let mut v = Verify::default();
        for o in all.iter().filter(|o| o.completed) {
            let Some(rep) = h.replay(&o.id).await? else {
                v.streams += 1;
                v.mismatched_streams += 1;
                continue;
            };
            v.streams += 1;
            v.tokens_checked += o.tokens.len().max(rep.replayed.len());
            let eq = o.tokens.iter().zip(&rep.replayed).filter(|(a, b)| a == b).count();
            v.tokens_equal += eq;
            if eq != o.tokens.len() || o.tokens.len() != rep.replayed.len() {
                v.mismatched_streams += 1;
            }
        }
        out.verify = Some(v);
    }
    Ok(out)
}

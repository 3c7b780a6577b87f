//! The JSON written by `llama-load --json` (schema fixed: `mode`, counts, throughput, latency
//! summaries, the replay check and the gauges after the load, the command).

use super::stats::Summary;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The load's result (`mode: "http"`; `llama-batch-bench` writes the same with `"inprocess"`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct LoadReport {
    /// `"http"`.
    pub mode: String,
    /// Concurrent clients.
    pub clients: usize,
    /// Requests sent (clients × requests per client).
    pub requests: usize,
    /// Prompt length, tokens.
    pub prompt_tokens: usize,
    /// `max_tokens` of every request.
    pub max_tokens: usize,
    /// Share of sampled requests asked for.
    pub sampled_fraction: f64,
    /// Share of cancelled requests asked for.
    pub cancel_fraction: f64,
    /// Streams that ran to `[DONE]` and passed the checks.
    pub completed: usize,
    /// Streams dropped on purpose.
    pub cancelled: usize,
    /// Requests that failed (HTTP error, timeout, bad stream, failed check).
    pub errors: usize,
    /// Tokens received over all streams (cancelled ones included).
    pub generated_tokens: u64,
    /// Wall time of the load, seconds.
    pub wall_s: f64,
    /// `generated_tokens / wall_s`.
    pub tokens_per_s: f64,
    /// Time to first token, ms.
    pub ttft_ms: Summary,
    /// Time per output token (gaps between tokens), ms.
    pub tpot_ms: Summary,
    /// The replay check (`null` without `--verify`).
    pub verify: Option<VerifyReport>,
    /// Gauges of `/metrics` after the load.
    pub metrics_after: MetricsAfter,
    /// The command line.
    pub command: String,
}

/// The replay check: every completed stream's ids against `POST /debug/replay`'s.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct VerifyReport {
    /// Streams replayed.
    pub streams: usize,
    /// Streamed tokens compared.
    pub tokens_checked: u64,
    /// Of those, equal at the same position in the replay.
    pub tokens_equal: u64,
    /// Streams whose replay differs (any token, or the length).
    pub mismatched_streams: usize,
}

/// Selected gauges of `/metrics` after the load (`null`: not found or not scraped).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct MetricsAfter {
    /// Requests running.
    pub running: Option<f64>,
    /// Requests queued.
    pub queued: Option<f64>,
    /// KV-cache slots in use.
    pub kv_slots_used: Option<f64>,
    /// Every sample of the three gauges as scraped (name with labels -> value).
    pub gauges: BTreeMap<String, f64>,
}

impl MetricsAfter {
    /// The gauges that are missing or not 0, as a message; `None` when all three are 0.
    pub fn not_idle(&self) -> Option<String> {
        let bad: Vec<String> =
            [("running", self.running), ("queued", self.queued), ("kv slots used", self.kv_slots_used)]
                .into_iter()
                .filter(|(_, v)| *v != Some(0.0))
                .map(|(n, v)| v.map_or(format!("{n}: not found"), |v| format!("{n} = {v}")))
                .collect();
        (!bad.is_empty()).then(|| bad.join(", "))
    }
}

impl LoadReport {
    /// Why the run failed, one message per failure (empty: it passed): errors, replay mismatches,
    /// gauges not back to 0.
    pub fn failures(&self) -> Vec<String> {
        let mut f = Vec::new();
        if self.errors > 0 {
            f.push(format!("{} of {} requests failed", self.errors, self.requests));
        }
        if let Some(v) = &self.verify {
            if v.mismatched_streams > 0 || v.tokens_equal != v.tokens_checked {
                f.push(format!(
                    "replay: {} of {} streams differ ({} of {} tokens equal)",
                    v.mismatched_streams, v.streams, v.tokens_equal, v.tokens_checked
                ));
            }
        }
        if let Some(m) = self.metrics_after.not_idle() {
            f.push(format!("gauges after the load: {m}"));
        }
        f
    }

    /// A few lines for a person.
    pub fn summary(&self) -> String {
        let ms = |s: &Summary| {
            let f = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v:.2}"));
            format!("p50 {} p90 {} p99 {} mean {} ms", f(s.p50), f(s.p90), f(s.p99), f(s.mean))
        };
        let mut s = format!(
            "{} requests ({} clients): {} completed, {} cancelled, {} errors; {} tokens in {:.2} s = {:.0} tokens/s\n\
             TTFT {}\nTPOT {}\n",
            self.requests,
            self.clients,
            self.completed,
            self.cancelled,
            self.errors,
            self.generated_tokens,
            self.wall_s,
            self.tokens_per_s,
            ms(&self.ttft_ms),
            ms(&self.tpot_ms)
        );
        if let Some(v) = &self.verify {
            s += &format!(
                "verify: {} streams, {} of {} tokens equal, {} mismatched streams\n",
                v.streams, v.tokens_equal, v.tokens_checked, v.mismatched_streams
            );
        }
        let m = &self.metrics_after;
        s += &format!(
            "after: running {:?}, queued {:?}, kv slots used {:?}\n",
            m.running, m.queued, m.kv_slots_used
        );
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_has_exactly_the_schema_keys() {
        let r = LoadReport {
            mode: "http".into(),
            clients: 2,
            requests: 4,
            prompt_tokens: 8,
            max_tokens: 16,
            sampled_fraction: 0.5,
            cancel_fraction: 0.25,
            completed: 3,
            cancelled: 1,
            errors: 0,
            generated_tokens: 55,
            wall_s: 1.0,
            tokens_per_s: 55.0,
            ttft_ms: Summary::of(&[1.0]),
            tpot_ms: Summary::of(&[]),
            verify: None,
            metrics_after: MetricsAfter {
                running: Some(0.0),
                queued: Some(0.0),
                kv_slots_used: Some(0.0),
                ..Default::default()
            },
            command: "llama-load".into(),
        };
        let v = serde_json::to_value(&r).unwrap();
        let keys: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
        assert_eq!(
            keys,
            [
                "mode",
                "clients",
                "requests",
                "prompt_tokens",
                "max_tokens",
                "sampled_fraction",
                "cancel_fraction",
                "completed",
                "cancelled",
                "errors",
                "generated_tokens",
                "wall_s",
                "tokens_per_s",
                "ttft_ms",
                "tpot_ms",
                "verify",
                "metrics_after",
                "command"
            ]
        );
        let stat_keys: Vec<&str> = v["ttft_ms"].as_object().unwrap().keys().map(String::as_str).collect();
        assert_eq!(stat_keys, ["p50", "p90", "p99", "mean"]);
        assert!(v["verify"].is_null() && v["tpot_ms"]["p50"].is_null());
        assert_eq!(serde_json::from_value::<LoadReport>(v).unwrap(), r);
        assert!(r.failures().is_empty());
        let mut bad = r.clone();
        bad.verify =
            Some(VerifyReport { streams: 3, tokens_checked: 40, tokens_equal: 39, mismatched_streams: 1 });
        bad.metrics_after.running = Some(2.0);
        bad.metrics_after.queued = None;
        bad.errors = 1;
        let f = bad.failures().join("; ");
        assert!(
            f.contains("1 of 4 requests") && f.contains("1 of 3 streams") && f.contains("running = 2"),
            "{f}"
        );
        assert!(f.contains("queued: not found"), "{f}");
        let v = serde_json::to_value(&bad).unwrap();
        let vk: Vec<&str> = v["verify"].as_object().unwrap().keys().map(String::as_str).collect();
        assert_eq!(vk, ["streams", "tokens_checked", "tokens_equal", "mismatched_streams"]);
    }
}

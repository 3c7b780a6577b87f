//! The Prometheus metrics (`GET /metrics`): names, and the process-wide recorder.

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use std::sync::OnceLock;

/// Gauge: requests waiting for a slot.
pub const QUEUE: &str = "llama_queue_depth";
/// Gauge: sequences holding a slot.
pub const RUNNING: &str = "llama_running_sequences";
/// Gauge: KV-cache slots in use.
pub const SLOTS_USED: &str = "llama_kv_slots_used";
/// Histogram (seconds): from submission to the first token.
pub const TTFT: &str = "llama_time_to_first_token_seconds";
/// Histogram (seconds): between consecutive tokens of a sequence.
pub const TPOT: &str = "llama_time_per_output_token_seconds";
/// Counter: tokens generated (tokens/s is its rate).
pub const GENERATED: &str = "llama_generated_tokens_total";
/// Counter: engine calls by `kind` (decode, prefill, replay).
pub const STEPS: &str = "llama_engine_steps_total";
/// Counter: graph replays of the model (one per decode step of the GPU engine).
pub const GRAPH_REPLAYS: &str = "llama_graph_replays_total";
/// Counter: errors by `kind`.
pub const ERRORS: &str = "llama_errors_total";
/// Counter: requests by `outcome` (length, stop, cancelled, aborted, rejected).
pub const REQUESTS: &str = "llama_requests_total";

/// The process-wide Prometheus recorder, installed on first use (later calls share it).
///
/// ```
/// let h = server::metrics::recorder();
/// metrics::counter!(server::metrics::GENERATED).increment(1);
/// assert!(h.render().contains("llama_generated_tokens_total"));
/// ```
pub fn recorder() -> PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let buckets = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];
            let builder = PrometheusBuilder::new()
                .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), &buckets)
                .unwrap_or_else(|_| PrometheusBuilder::new());
            let recorder = builder.build_recorder();
            let handle = recorder.handle();
            // Another recorder may already be installed (a host program's): then ours only
            // renders what it was given, and the caller's recorder gets the values.
            let _ = metrics::set_global_recorder(recorder);
            // Histogram samples pile up in the recorder until upkeep folds them into the buckets
            // (a render does it too): without it a server nobody scrapes grows by about 17 bytes
            // per generated token, found by red-team review. One thread for the process.
            let h = handle.clone();
            let _ = std::thread::Builder::new().name(UPKEEP_THREAD.into()).spawn(move || loop {
                std::thread::sleep(UPKEEP_EVERY);
                h.run_upkeep();
            });
            handle
        })
        .clone()
}

/// The name of the thread that runs the recorder's upkeep every [`UPKEEP_EVERY`].
pub const UPKEEP_THREAD: &str = "llama-metrics-upkeep";

/// How often the recorder's upkeep runs.
pub const UPKEEP_EVERY: std::time::Duration = std::time::Duration::from_secs(2);

#[cfg(test)]
mod tests {
    /// The upkeep thread runs once the recorder exists (Linux: the threads' names in /proc).
    #[cfg(target_os = "linux")]
    #[test]
    fn the_recorder_starts_its_upkeep_thread() {
        let _ = super::recorder();
        let names = || -> Vec<String> {
            std::fs::read_dir("/proc/self/task")
                .unwrap()
                .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
                .map(|n| n.trim().to_string())
                .collect()
        };
        // Linux keeps 15 bytes of a thread's name; the new thread names itself as it starts.
        let want = &super::UPKEEP_THREAD[..15];
        let start = std::time::Instant::now();
        while !names().iter().any(|n| n == want) {
            assert!(start.elapsed().as_secs() < 5, "no upkeep thread among {:?}", names());
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }
}

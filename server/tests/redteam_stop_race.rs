//! A client that reports what it was served (`truncate_served`, as the HTTP layer does when a stop
//! string matches) and then drops its receiver ended normally: counted "stop", never "cancelled",
//! however its two steps interleave with the batcher's reaping. Found by review: 2,000 such
//! clients on the FakeEngine gave 210–451 "cancelled" when the batcher emptied its inbox before
//! looking at the receivers. In a process of its own (the metrics recorder is process-wide).

use server::batcher::{spawn, BatcherConfig, Event, GenRequest};
use server::engine::Sampling;
use server::fake::FakeEngine;
use std::time::Duration;

fn outcome(text: &str, which: &str) -> f64 {
    let key = format!("llama_requests_total{{outcome=\"{which}\"}} ");
    text.lines().filter_map(|l| l.strip_prefix(&key)).filter_map(|v| v.trim().parse::<f64>().ok()).sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn served_then_closed_is_a_stop_never_a_cancellation() {
    let metrics = server::metrics::recorder();
    let n = 2000usize;
    let cfg = BatcherConfig { eos: vec![], max_queue: 1 << 20, ..BatcherConfig::default() };
    let (h, task) = spawn(FakeEngine::new(16, 256, 2048, 64), cfg);
    let mut jobs = Vec::new();
    for i in 0..n {
        let h = h.clone();
        jobs.push(tokio::spawn(async move {
            let id = format!("r{i}");
            let prompt = vec![1 + (i as u32 % 100), 2, 3];
            let mut rx = h
                .submit(GenRequest { id: id.clone(), prompt, max_tokens: 200, sampling: Sampling::GREEDY })
                .unwrap();
            let want = 3 + i % 7;
            let mut got = 0;
            while got < want {
                match rx.recv().await {
                    Some(Event::Token(_)) => got += 1,
                    other => panic!("request {i}: {other:?} after {got} tokens"),
                }
            }
            h.truncate_served(&id, got);
            drop(rx);
        }));
    }
    for j in jobs {
        j.await.unwrap();
    }
    h.shutdown(Duration::from_secs(5));
    tokio::time::timeout(Duration::from_secs(30), task).await.unwrap().unwrap();
    let text = metrics.render();
    let (stop, cancelled) = (outcome(&text, "stop"), outcome(&text, "cancelled"));
    // A sequence may reach max_tokens before its client (one task of 2,000) gets to report: the
    // batcher then ends it as "length" first. Never "cancelled".
    let length = outcome(&text, "length");
    let all: Vec<&str> = text.lines().filter(|l| l.starts_with("llama_requests_total")).collect();
    assert_eq!((stop + length, cancelled), (n as f64, 0.0), "{all:?}");
}

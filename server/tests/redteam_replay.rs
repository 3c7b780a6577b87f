//! Red team, `/debug/replay` under a flood (found by review: replays ran back to back while more
//! arrived, so no decode or prefill round ran, and replays whose client had left still ran). Now
//! at most one replay runs per scheduling round, generation gets at least as long as the last
//! replay took before the next one starts, abandoned replays are skipped, and at most
//! `MAX_QUEUED_REPLAYS` wait (more are answered 503).
//!
//! The fake engine's steps take 1 ms, so a replay of a 200-token path takes about 200 ms, as a
//! single-row graph replay per token would. Measured before the fix: a 20-token stream took
//! 3.6 s during a flood of four looping clients (about 40 ms alone), and 5.9 s after 30 replays
//! whose clients left at once.

mod common;
use common::{start, Opts};
use serde_json::json;
use std::time::{Duration, Instant};

async fn stream_time(s: &common::Srv) -> Duration {
    let t = Instant::now();
    let body = json!({"prompt": [5, 6, 7], "max_tokens": 20, "temperature": 0, "stream": true, "stop": []});
    let (code, text) = s.post("/v1/completions", &body).await;
    assert_eq!(code, 200, "{text}");
    t.elapsed()
}

/// A server whose steps take 1 ms, with `slots` slots, after one request of `tokens` greedy
/// tokens; that request's id (its path is kept for replay).
async fn served(slots: u32, tokens: usize) -> (common::Srv, String) {
    let s = start(Opts { slots, delay_us: 1000, max_seq: 256, ..Opts::default() }).await;
    let prompt = common::no_eos_prompt(3, 3, tokens);
    let body = json!({"prompt": prompt, "max_tokens": tokens, "temperature": 0, "stop": []});
    let (code, v) = s.json("/v1/completions", &body).await;
    assert_eq!(code, 200, "{v}");
    let id = v["id"].as_str().unwrap().to_string();
    (s, id)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn replay_flood_does_not_stall_generation() {
    let (s, id) = served(Opts::default().slots, 200).await;
    let (code, r) = s.json("/debug/replay", &json!({"id": id})).await;
    assert_eq!((code, r["equal"].as_bool()), (200, Some(true)), "{r}");
    let base = stream_time(&s).await;

    // Four clients replaying in a loop for 3 s; a stream started during the flood.
    let stop_at = Instant::now() + Duration::from_secs(3);
    let mut loops = vec![];
    for _ in 0..4 {
        let (c, b, id) = (s.c.clone(), s.base.clone(), id.clone());
        loops.push(tokio::spawn(async move {
            let mut n = 0u32;
            while Instant::now() < stop_at {
                let r = c.post(format!("{b}/debug/replay")).json(&json!({"id": id})).send().await.unwrap();
                assert!(r.status() == 200 || r.status() == 503, "replay answered {}", r.status());
                r.text().await.unwrap();
                n += 1;
            }
            n
        }));
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let during = stream_time(&s).await;
    let mut replays = 0;
    for h in loops {
        replays += h.await.unwrap();
    }
    assert!(replays >= 4, "the flood's replays were served too ({replays})");
    // At most one replay (~200 ms) before each stretch of generation as long as it.
    assert!(
        during < base + Duration::from_millis(1500),
        "a stream took {during:?} during the flood ({base:?} alone)"
    );

    // Replays whose clients leave at once are skipped, not run.
    for _ in 0..30 {
        let (c, b, id) = (s.c.clone(), s.base.clone(), id.clone());
        let req = c.post(format!("{b}/debug/replay")).json(&json!({"id": id})).send();
        let _ = tokio::time::timeout(Duration::from_millis(20), req).await;
    }
    let after = stream_time(&s).await;
    assert!(
        after < base + Duration::from_millis(800),
        "a stream took {after:?} after 30 abandoned replays ({base:?} alone)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn replays_beyond_the_queue_bound_are_refused() {
    let (s, id) = served(Opts::default().slots, 100).await;
    let n = 3 * server::batcher::MAX_QUEUED_REPLAYS;
    let mut all = vec![];
    for _ in 0..n {
        let (c, b, id) = (s.c.clone(), s.base.clone(), id.clone());
        all.push(tokio::spawn(async move {
            c.post(format!("{b}/debug/replay"))
                .json(&json!({"id": id}))
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        }));
    }
    let mut codes = vec![];
    for h in all {
        codes.push(h.await.unwrap());
    }
    let busy = codes.iter().filter(|&&c| c == 503).count();
    assert!(codes.iter().all(|&c| c == 200 || c == 503), "{codes:?}");
    assert!(busy > 0 && busy < n, "{n} concurrent replays: {busy} refused as busy ({codes:?})");
}

/// One slot: a replay held back by the gate must not keep the only slot reserved (found by review:
/// the request waited for the whole flood while the batcher spun with nothing to run).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_slot_is_shared_between_requests_and_replays() {
    let (s, id) = served(1, 100).await;
    let stop_at = Instant::now() + Duration::from_secs(3);
    let mut loops = vec![];
    for _ in 0..3 {
        let (c, b, id) = (s.c.clone(), s.base.clone(), id.clone());
        loops.push(tokio::spawn(async move {
            while Instant::now() < stop_at {
                c.post(format!("{b}/debug/replay"))
                    .json(&json!({"id": id}))
                    .send()
                    .await
                    .unwrap()
                    .text()
                    .await
                    .unwrap();
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let t = Instant::now();
    let (code, v) =
        s.json("/v1/completions", &json!({"prompt": [5, 6, 7], "max_tokens": 5, "stop": []})).await;
    let took = t.elapsed();
    for h in loops {
        h.await.unwrap();
    }
    assert_eq!(code, 200, "{v}");
    assert!(
        took < Duration::from_millis(1500),
        "a 5-token request took {took:?} during the flood, with one slot"
    );
}

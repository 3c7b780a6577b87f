//! Request outcomes in `/metrics` (`llama_requests_total{outcome}`), on the FakeEngine, in a
//! process of their own (the recorder is process-wide): found by red-team review, a request ended
//! by a stop string was counted as cancelled, and a non-streamed request aborted at shutdown was
//! counted as both aborted and rejected. Also: a chat conversation longer than the context names
//! `messages`, not `prompt`.

mod common;

use common::{check_error, start, Opts};
use serde_json::{json, Value};
use std::time::Duration;

async fn outcomes(s: &common::Srv) -> std::collections::HashMap<String, f64> {
    let text = s.c.get(format!("{}/metrics", s.base)).send().await.unwrap().text().await.unwrap();
    text.lines()
        .filter_map(|l| l.strip_prefix("llama_requests_total{outcome=\""))
        .filter_map(|l| {
            let (k, v) = l.split_once("\"} ")?;
            Some((k.to_string(), v.trim().parse().ok()?))
        })
        .collect()
}

fn delta(
    a: &std::collections::HashMap<String, f64>,
    b: &std::collections::HashMap<String, f64>,
    k: &str,
) -> f64 {
    b.get(k).copied().unwrap_or(0.0) - a.get(k).copied().unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn outcomes_are_counted_once_and_for_what_they_are() {
    let s = start(Opts { slots: 2, delay_us: 500, ..Opts::default() }).await;
    let p = common::no_eos_prompt(11, 6, 80);
    let body = json!({"prompt": p, "max_tokens": 80, "temperature": 0});
    let (_, whole) = s.json("/v1/completions", &body).await;
    let text = whole["choices"][0]["text"].as_str().unwrap().to_string();
    let mid: String = text.chars().skip(text.chars().count() / 3).take(3).collect();
    // Let the batcher retire the first request before counting.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let before = outcomes(&s).await;
    let mut sb = body.clone();
    sb["stop"] = json!(mid);
    for stream in [false, true] {
        sb["stream"] = json!(stream);
        let (code, t) = s.post("/v1/completions", &sb).await;
        assert_eq!(code, 200, "{t}");
        if !stream {
            let v: Value = serde_json::from_str(&t).unwrap();
            assert_eq!(v["choices"][0]["finish_reason"], "stop");
        }
    }
    let start_wait = std::time::Instant::now();
    let mut after = outcomes(&s).await;
    while delta(&before, &after, "stop") < 2.0 && start_wait.elapsed() < Duration::from_secs(5) {
        tokio::time::sleep(Duration::from_millis(20)).await;
        after = outcomes(&s).await;
    }
    assert_eq!(delta(&before, &after, "stop"), 2.0, "{before:?} -> {after:?}");
    assert_eq!(delta(&before, &after, "cancelled"), 0.0, "{before:?} -> {after:?}");

    // A non-streamed request aborted by the shutdown's short grace: one "aborted", no "rejected".
    let before = outcomes(&s).await;
    let long = common::no_eos_prompt(12, 4, 1000);
    let (c, base) = (s.c.clone(), s.base.clone());
    let job = tokio::spawn(async move {
        let r = c
            .post(format!("{base}/v1/completions"))
            .json(&json!({"prompt": long, "max_tokens": 200, "temperature": 0}))
            .send()
            .await
            .unwrap();
        (r.status().as_u16(), r.text().await.unwrap())
    });
    tokio::time::sleep(Duration::from_millis(30)).await;
    s.h.shutdown(Duration::from_millis(10));
    let (code, t) = tokio::time::timeout(Duration::from_secs(5), job).await.unwrap().unwrap();
    assert_eq!(code, 500, "{t}");
    let after = outcomes(&s).await;
    assert_eq!(delta(&before, &after, "aborted"), 1.0, "{before:?} -> {after:?}");
    assert_eq!(delta(&before, &after, "rejected"), 0.0, "{before:?} -> {after:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chat_longer_than_the_context_names_messages() {
    let s = start(Opts { max_seq: 64, ..Opts::default() }).await;
    let long = "word ".repeat(400);
    let (code, t) =
        s.post("/v1/chat/completions", &json!({"messages": [{"role": "user", "content": long}]})).await;
    check_error(code, &t, 400, Some("messages"));
}

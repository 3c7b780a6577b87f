//! Red team, load: 200 concurrent clients with mixed lengths, the queue bound, graceful
//! shutdown with streams in flight, replay of every finished request, auth on every /v1 route,
//! and the Prometheus exposition.

mod common;

use common::{check_error, frames, start, stream_ids, Opts, VOCAB};
use serde_json::{json, Value};
use server::engine::Sampling;
use server::fake::FakeEngine;
use std::time::Duration;

fn prompt(i: u32, len: usize) -> Vec<u32> {
    (0..len as u32).map(|k| 5 + (i.wrapping_mul(2654435761).wrapping_add(k * 131)) % (VOCAB - 5)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_hundred_clients_get_their_tokens_and_replays_match() {
    let s = start(Opts {
        slots: 16,
        max_seq: 256,
        delay_us: 300,
        max_queue: 256,
        prefill: 48,
        ..Opts::default()
    })
    .await;
    let eos = s.tok.eos_ids().to_vec();
    let mut jobs = Vec::new();
    for i in 0..200u32 {
        let len = 1 + (i as usize * 37) % 90;
        let n = 1 + (i * 13) % 70;
        let sampling = if i % 2 == 0 {
            Sampling::GREEDY
        } else {
            Sampling { temperature: 0.8, top_p: 1.0, top_k: 0, seed: u64::from(i) }
        };
        let p = prompt(i, len);
        let want = FakeEngine::expected(VOCAB, &p, sampling, n as usize, &eos);
        let stream = i % 3 != 0;
        let mut body = json!({"prompt": p, "max_tokens": n, "temperature": sampling.temperature, "seed": sampling.seed, "return_token_ids": true, "stream": stream});
        if stream {
            body["stream_options"] = json!({"include_usage": true});
        }
        let (c, base) = (s.c.clone(), s.base.clone());
        jobs.push(tokio::spawn(async move {
            let r = c.post(format!("{base}/v1/completions")).json(&body).send().await.unwrap();
            assert_eq!(r.status(), 200);
            let text = r.text().await.unwrap();
            let (id, ids, usage) = if stream {
                let fs = frames(&text);
                let usage = fs.last().unwrap()["usage"].clone();
                (fs[0]["id"].as_str().unwrap().to_string(), stream_ids(&text), usage)
            } else {
                let v: Value = serde_json::from_str(&text).unwrap();
                let ids: Vec<u32> = serde_json::from_value(v["choices"][0]["token_ids"].clone()).unwrap();
                (v["id"].as_str().unwrap().to_string(), ids, v["usage"].clone())
            };
            assert_eq!(ids, want, "client {i}");
            assert_eq!(usage["prompt_tokens"], len);
            assert_eq!(usage["completion_tokens"], want.len());
            (id, ids)
        }));
    }
    let t0 = std::time::Instant::now();
    let mut done = Vec::new();
    for j in jobs {
        done.push(j.await.unwrap());
    }
    assert!(t0.elapsed() < Duration::from_secs(20));
    for (id, ids) in &done {
        let (code, r) = s.json("/debug/replay", &json!({"id": id})).await;
        assert_eq!(code, 200, "{r}");
        assert_eq!(r["token_ids"], json!(ids), "{id}");
        assert_eq!(r["equal"], true);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stop_string_request_replays_to_what_its_client_was_sent() {
    let s = start(Opts { slots: 2, delay_us: 500, ..Opts::default() }).await;
    let p = common::no_eos_prompt(11, 6, 80);
    let body = json!({"prompt": p, "max_tokens": 80, "temperature": 0, "return_token_ids": true});
    let (_, whole) = s.json("/v1/completions", &body).await;
    let text = whole["choices"][0]["text"].as_str().unwrap().to_string();
    // A stop string from the middle of the text: the stream ends there.
    let mid: String = text.chars().skip(text.chars().count() / 3).take(3).collect();
    let mut sb = body.clone();
    sb["stop"] = json!(mid);
    for stream in [false, true] {
        sb["stream"] = json!(stream);
        let (code, t) = s.post("/v1/completions", &sb).await;
        assert_eq!(code, 200);
        let (id, ids) = if stream {
            (frames(&t)[0]["id"].as_str().unwrap().to_string(), stream_ids(&t))
        } else {
            let v: Value = serde_json::from_str(&t).unwrap();
            assert_eq!(v["choices"][0]["finish_reason"], "stop");
            (
                v["id"].as_str().unwrap().to_string(),
                serde_json::from_value(v["choices"][0]["token_ids"].clone()).unwrap(),
            )
        };
        assert!(ids.len() < 80);
        let (code, r) = s.json("/debug/replay", &json!({"id": id})).await;
        assert_eq!(code, 200, "{r}");
        assert_eq!(r["served_token_ids"], json!(ids), "stream {stream}");
        assert_eq!(r["equal"], true);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_queue_bound_refuses_with_retry_after() {
    let s = start(Opts { slots: 2, delay_us: 1000, max_queue: 5, ..Opts::default() }).await;
    let mut jobs = Vec::new();
    for i in 0..40u32 {
        let (c, base) = (s.c.clone(), s.base.clone());
        let body = json!({"prompt": prompt(i, 3), "max_tokens": 20, "temperature": 0});
        jobs.push(tokio::spawn(async move {
            let r = c.post(format!("{base}/v1/completions")).json(&body).send().await.unwrap();
            let code = r.status().as_u16();
            let ra = r.headers().get("retry-after").map(|v| v.to_str().unwrap().to_string());
            (code, ra, r.text().await.unwrap())
        }));
    }
    let (mut ok, mut busy) = (0, 0);
    for j in jobs {
        let (code, ra, text) = j.await.unwrap();
        match code {
            200 => ok += 1,
            503 => {
                busy += 1;
                assert_eq!(ra.as_deref(), Some("1"));
                check_error(code, &text, 503, None);
            }
            _ => panic!("{code}: {text}"),
        }
    }
    assert!(ok >= 7 && busy > 0, "{ok} served, {busy} refused");
    assert_eq!(s.h.queue_depth(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn graceful_shutdown_finishes_streams_in_flight_then_exits() {
    let mut s = start(Opts { slots: 4, delay_us: 1000, ..Opts::default() }).await;
    let p = common::no_eos_prompt(5, 4, 60);
    let mut jobs = Vec::new();
    for _ in 0..6 {
        let (c, base) = (s.c.clone(), s.base.clone());
        let body = json!({"prompt": p, "max_tokens": 60, "temperature": 0, "stream": true, "return_token_ids": true});
        jobs.push(tokio::spawn(async move {
            c.post(format!("{base}/v1/completions")).json(&body).send().await.unwrap().text().await.unwrap()
        }));
    }
    tokio::time::sleep(Duration::from_millis(15)).await;
    s.h.shutdown(Duration::from_secs(10));
    let (code, text) = s.post("/v1/completions", &json!({"prompt": "x"})).await;
    check_error(code, &text, 503, None);
    let _ = s.stop_http.take().unwrap().send(());
    let want = FakeEngine::expected(VOCAB, &p, Sampling::GREEDY, 60, &[]);
    for j in jobs {
        let body = j.await.unwrap();
        assert_eq!(stream_ids(&body), want);
        assert_eq!(frames(&body).last().unwrap()["choices"][0]["finish_reason"], "length");
    }
    tokio::time::timeout(Duration::from_secs(2), s.http.take().unwrap()).await.unwrap().unwrap().unwrap();
    tokio::time::timeout(Duration::from_secs(2), s.task.take().unwrap()).await.unwrap().unwrap();

    // With a short grace the streams in flight end with an error frame, then [DONE].
    let mut s = start(Opts { slots: 2, delay_us: 1000, ..Opts::default() }).await;
    let p = common::no_eos_prompt(6, 4, 1000);
    let body = json!({"prompt": p, "max_tokens": 200, "temperature": 0, "stream": true});
    let (c, base) = (s.c.clone(), s.base.clone());
    let job = tokio::spawn(async move {
        c.post(format!("{base}/v1/completions")).json(&body).send().await.unwrap().text().await.unwrap()
    });
    tokio::time::sleep(Duration::from_millis(20)).await;
    s.h.shutdown(Duration::from_millis(20));
    let _ = s.stop_http.take().unwrap().send(());
    let body = tokio::time::timeout(Duration::from_secs(2), job).await.unwrap().unwrap();
    let fs = frames(&body);
    assert!(fs.last().unwrap()["error"]["message"].is_string(), "{body}");
    tokio::time::timeout(Duration::from_secs(2), s.http.take().unwrap()).await.unwrap().unwrap().unwrap();
    tokio::time::timeout(Duration::from_secs(2), s.task.take().unwrap()).await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bearer_auth_on_every_v1_route() {
    let s = start(Opts { key: Some("sekrit"), ..Opts::default() }).await;
    let routes = [
        ("POST", "/v1/completions", json!({"prompt": "x", "max_tokens": 1})),
        (
            "POST",
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "x"}], "max_tokens": 1}),
        ),
        ("GET", "/v1/models", json!(null)),
        ("POST", "/debug/replay", json!({"id": "nope"})),
        ("GET", "/v1/completions", json!(null)),
        ("POST", "/v1/embeddings", json!({"input": "x"})),
        ("GET", "/v1/", json!(null)),
    ];
    for (m, path, body) in &routes {
        for auth in [
            None,
            Some("Bearer wrong"),
            Some("sekrit"),
            Some("Basic sekrit"),
            Some("Bearer sekrit2"),
            Some("Bearer  sekrit"),
        ] {
            let mut r = s.c.request(m.parse().unwrap(), format!("{}{path}", s.base));
            if let Some(a) = auth {
                r = r.header("authorization", a);
            }
            if !body.is_null() {
                r = r.json(body);
            }
            let r = r.send().await.unwrap();
            let code = r.status().as_u16();
            check_error(code, &r.text().await.unwrap(), 401, None);
        }
        for auth in ["Bearer sekrit", "bearer sekrit"] {
            let mut r =
                s.c.request(m.parse().unwrap(), format!("{}{path}", s.base)).header("authorization", auth);
            if !body.is_null() {
                r = r.json(body);
            }
            let code = r.send().await.unwrap().status().as_u16();
            assert_ne!(code, 401, "{m} {path} with {auth}");
        }
    }
    for open in ["/health", "/metrics"] {
        assert_eq!(s.c.get(format!("{}{open}", s.base)).send().await.unwrap().status(), 200);
    }
}

/// Checks the Prometheus text exposition format (0.0.4) line by line.
fn check_exposition(text: &str) {
    let name_ok = |n: &str| {
        !n.is_empty()
            && n.chars().enumerate().all(|(i, c)| {
                c.is_ascii_alphabetic() || c == '_' || c == ':' || (i > 0 && c.is_ascii_digit())
            })
    };
    let mut typed = std::collections::HashMap::new();
    for line in text.lines() {
        if line.is_empty() {
            continue;
        }
        if let Some(rest) = line.strip_prefix("# ") {
            let mut w = rest.splitn(3, ' ');
            let kw = w.next().unwrap();
            let name = w.next().unwrap_or_else(|| panic!("{line}"));
            assert!(name_ok(name), "{line}");
            if kw == "TYPE" {
                let t = w.next().unwrap();
                assert!(["counter", "gauge", "histogram", "summary", "untyped"].contains(&t), "{line}");
                assert!(typed.insert(name.to_string(), t.to_string()).is_none(), "TYPE twice: {line}");
            }
            continue;
        }
        let (series, value) = line.rsplit_once(' ').unwrap_or_else(|| panic!("{line}"));
        assert!(value.parse::<f64>().is_ok() || ["+Inf", "-Inf", "NaN"].contains(&value), "{line}");
        let (name, labels) = match series.split_once('{') {
            Some((n, l)) => (n, Some(l.strip_suffix('}').unwrap_or_else(|| panic!("{line}")))),
            None => (series, None),
        };
        assert!(name_ok(name), "{line}");
        let base = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| name.strip_suffix(s))
            .filter(|b| typed.contains_key(*b))
            .unwrap_or(name);
        assert!(typed.contains_key(base), "no TYPE before {line}");
        if let Some(l) = labels {
            for kv in l.split("\",").filter(|x| !x.is_empty()) {
                let (k, v) = kv.split_once('=').unwrap_or_else(|| panic!("{line}"));
                assert!(name_ok(k) && v.starts_with('"'), "{line}");
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_are_valid_prometheus_text() {
    let s = start(Opts::default()).await;
    let _ = s.post("/v1/completions", &json!({"prompt": "hi", "max_tokens": 3})).await;
    let _ = s.post("/v1/completions", &json!({"prompt": "hi", "n": 3})).await;
    let r = s.c.get(format!("{}/metrics", s.base)).send().await.unwrap();
    assert!(r.headers()["content-type"].to_str().unwrap().starts_with("text/plain"));
    let text = r.text().await.unwrap();
    check_exposition(&text);
    for name in [
        "llama_queue_depth",
        "llama_kv_slots_used",
        "llama_time_to_first_token_seconds_bucket",
        "llama_requests_total",
    ] {
        assert!(text.contains(name), "{name}\n{text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn a_huge_text_prompt_does_not_stall_other_streams() {
    // One runtime worker for the server, the batcher and this client: tokenising 400 kB takes
    // long (about a second unoptimised); done on the worker it froze every stream meanwhile.
    let s = start(Opts { slots: 2, delay_us: 1000, max_body: 1 << 20, ..Opts::default() }).await;
    let p = common::no_eos_prompt(8, 4, 200);
    let body = json!({"prompt": p, "max_tokens": 200, "temperature": 0, "stream": true});
    let mut r = s.c.post(format!("{}/v1/completions", s.base)).json(&body).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let _ = r.chunk().await.unwrap();
    let big: String = (0..80_000).map(|i| ["hello ", "world ", "x1 ", "\n"][i % 4]).collect();
    let (c, base) = (s.c.clone(), s.base.clone());
    let huge = tokio::spawn(async move {
        let r = c.post(format!("{base}/v1/completions")).json(&json!({"prompt": big})).send().await.unwrap();
        r.status().as_u16()
    });
    let (mut worst, mut last, mut n) = (Duration::ZERO, std::time::Instant::now(), 0);
    while let Some(_chunk) = r.chunk().await.unwrap() {
        worst = worst.max(last.elapsed());
        last = std::time::Instant::now();
        n += 1;
    }
    assert!(n > 100);
    assert_eq!(huge.await.unwrap(), 400); // far beyond the context
    assert!(worst < Duration::from_millis(250), "a stream stalled {worst:?}");
}

//! HTTP end to end on the FakeEngine over 127.0.0.1:0 with a real client (reqwest).

use serde_json::{json, Value};
use server::batcher::{spawn, BatcherConfig, BatcherHandle};
use server::engine::Sampling;
use server::fake::FakeEngine;
use server::http::{router, AppState, ServerConfig};
use server::tokenizer::TextTokenizer;
use std::sync::Arc;
use std::time::Duration;

const VOCAB: u32 = 2048;

struct Srv {
    base: String,
    h: BatcherHandle,
    tok: Arc<TextTokenizer>,
    c: reqwest::Client,
}

async fn start(slots: u32, max_seq: u32, delay_us: u64, max_queue: usize, key: Option<&str>) -> Srv {
    let tok = Arc::new(TextTokenizer::fixture().unwrap());
    let eng = FakeEngine::new(slots, max_seq, VOCAB, 32).with_delay(Duration::from_micros(delay_us));
    let cfg = BatcherConfig { max_queue, prefill_chunk: 32, eos: tok.eos_ids().to_vec(), paths_kept: 1000 };
    let (h, _task) = spawn(eng, cfg);
    let state = Arc::new(AppState {
        batcher: h.clone(),
        tok: tok.clone(),
        cfg: ServerConfig {
            model_name: "fake".into(),
            api_key: key.map(str::to_string),
            max_body_bytes: 4096,
            debug_replay: true,
            conn: Default::default(),
        },
        metrics: server::metrics::recorder(),
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, router(state)).await.unwrap() });
    Srv { base, h, tok, c: reqwest::Client::new() }
}

impl Srv {
    async fn post(&self, path: &str, body: Value) -> (u16, reqwest::header::HeaderMap, String) {
        let r = self.c.post(format!("{}{path}", self.base)).json(&body).send().await.unwrap();
        let (s, h) = (r.status().as_u16(), r.headers().clone());
        (s, h, r.text().await.unwrap())
    }

    async fn json(&self, path: &str, body: Value) -> (u16, Value) {
        let (s, _, t) = self.post(path, body).await;
        (s, serde_json::from_str(&t).unwrap_or_else(|e| panic!("{e}: {t}")))
    }
}

/// The `data:` payloads of an SSE body, checking the framing; the last must be `[DONE]`.
fn frames(body: &str) -> Vec<Value> {
    assert!(body.ends_with("data: [DONE]\n\n"), "{body:?}");
    let parts: Vec<&str> = body.split_terminator("\n\n").collect();
    assert_eq!(parts.last(), Some(&"data: [DONE]"));
    parts[..parts.len() - 1]
        .iter()
        .map(|p| {
            serde_json::from_str(p.strip_prefix("data: ").unwrap_or_else(|| panic!("bad frame {p:?}")))
                .unwrap()
        })
        .collect()
}

fn check_error(status: u16, body: &Value, want_status: u16, param: Option<&str>) {
    assert_eq!(status, want_status, "{body}");
    let e = &body["error"];
    assert!(e["message"].as_str().is_some_and(|m| !m.is_empty()), "{body}");
    assert!(e["type"].is_string() && e["code"].is_string(), "{body}");
    assert!(e.as_object().unwrap().contains_key("param"), "{body}");
    if let Some(p) = param {
        assert_eq!(e["param"], p, "{body}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn validation_errors_leave_other_streams_alone() {
    let s = start(4, 64, 2000, 16, None).await;
    // A long stream runs while the bad requests come in.
    let p: Vec<u32> = (10..20).collect();
    let stream = {
        let (c, base) = (s.c.clone(), s.base.clone());
        let body = json!({"prompt": p, "max_tokens": 40, "temperature": 0, "stream": true, "return_token_ids": true});
        tokio::spawn(async move {
            c.post(format!("{base}/v1/completions")).json(&body).send().await.unwrap().text().await.unwrap()
        })
    };
    let cases: Vec<(Value, u16, Option<&str>)> = vec![
        (json!({"prompt": "hi", "bogus": 1}), 400, None),
        (json!({"prompt": "hi", "temperature": -0.5}), 400, Some("temperature")),
        (json!({"prompt": "hi", "top_p": 0}), 400, Some("top_p")),
        (json!({"prompt": "hi", "top_p": 1.5}), 400, Some("top_p")),
        (json!({"prompt": "hi", "max_tokens": 0}), 400, Some("max_tokens")),
        (json!({"prompt": "hi", "max_tokens": 1_000_000_000_000i64}), 400, Some("max_tokens")),
        (json!({"prompt": "hi", "n": 2}), 400, Some("n")),
        (json!({"prompt": "hi", "stop": ["a", "b", "c", "d", "e"]}), 400, Some("stop")),
        (json!({"prompt": (0..70).map(|i| 10 + i).collect::<Vec<u32>>()}), 400, Some("prompt")),
        (json!({"prompt": [5, 99999]}), 400, Some("prompt")),
        (json!({"prompt": ""}), 400, Some("prompt")),
        (json!({"prompt": "hi", "stream_options": {"include_usage": true}}), 400, Some("stream_options")),
        (json!({"max_tokens": 3}), 400, None),
    ];
    for (body, st, param) in cases {
        let (code, v) = s.json("/v1/completions", body.clone()).await;
        check_error(code, &v, st, param);
    }
    let (code, v) = s
        .json("/v1/chat/completions", json!({"messages": [{"role": "user", "content": "x", "extra": 1}]}))
        .await;
    check_error(code, &v, 400, None);
    let (code, v) = s.json("/v1/chat/completions", json!({"messages": []})).await;
    check_error(code, &v, 400, Some("messages"));
    // Malformed JSON, NaN (not JSON), wrong content type, a body too large.
    let raw = |body: &'static str, ct: &'static str| {
        s.c.post(format!("{}/v1/completions", s.base)).header("content-type", ct).body(body).send()
    };
    for (body, ct, want) in [
        ("{\"prompt\": \"hi\"", "application/json", 400),
        ("{\"prompt\": \"hi\", \"temperature\": NaN}", "application/json", 400),
        ("{\"prompt\": \"hi\"}", "text/plain", 415),
    ] {
        let r = raw(body, ct).await.unwrap();
        let code = r.status().as_u16();
        check_error(code, &r.json().await.unwrap(), want, None);
    }
    let big = json!({"prompt": "x".repeat(10_000)});
    let (code, v) = s.json("/v1/completions", big).await;
    check_error(code, &v, 413, None);
    // The stream was not disturbed.
    let body = stream.await.unwrap();
    let ids: Vec<u64> = frames(&body)
        .iter()
        .flat_map(|f| f["choices"][0]["token_ids"].as_array().unwrap().clone())
        .map(|x| x.as_u64().unwrap())
        .collect();
    let want = FakeEngine::expected(VOCAB, &p, Sampling::GREEDY, 40, s.tok.eos_ids());
    assert_eq!(ids, want.iter().map(|&x| u64::from(x)).collect::<Vec<_>>());
    // And the server still serves.
    let (code, v) = s.json("/v1/completions", json!({"prompt": "ok", "max_tokens": 2})).await;
    assert_eq!(code, 200, "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn streamed_text_equals_non_streamed_and_sse_framing() {
    let s = start(4, 512, 100, 16, None).await;
    for (path, body) in [
        ("/v1/completions", json!({"prompt": "Once upon a time", "max_tokens": 50, "temperature": 0})),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 50, "temperature": 0}),
        ),
        (
            "/v1/completions",
            json!({"prompt": [7, 8, 9], "max_tokens": 30, "temperature": 0.9, "seed": 5, "top_p": 0.8, "top_k": 40}),
        ),
    ] {
        let chat = path.contains("chat");
        let (code, whole) = s.json(path, body.clone()).await;
        assert_eq!(code, 200, "{whole}");
        let mut sb = body.clone();
        sb["stream"] = json!(true);
        sb["stream_options"] = json!({"include_usage": true});
        let (code, headers, text) = s.post(path, sb).await;
        assert_eq!(code, 200);
        assert!(headers["content-type"].to_str().unwrap().starts_with("text/event-stream"));
        let fs = frames(&text);
        let usage = fs.last().unwrap();
        assert_eq!(usage["choices"], json!([]));
        assert_eq!(usage["usage"], whole["usage"]);
        let chunks = &fs[..fs.len() - 1];
        let mut streamed = String::new();
        for c in chunks {
            assert!(c["id"].as_str().unwrap().starts_with(if chat { "chatcmpl-" } else { "cmpl-" }));
            assert_eq!(c["object"], if chat { "chat.completion.chunk" } else { "text_completion" });
            let ch = &c["choices"][0];
            streamed.push_str(if chat {
                ch["delta"]["content"].as_str().unwrap_or("")
            } else {
                ch["text"].as_str().unwrap()
            });
        }
        let last = &chunks.last().unwrap()["choices"][0];
        let w = &whole["choices"][0];
        assert_eq!(last["finish_reason"], w["finish_reason"]);
        assert!(chunks[..chunks.len() - 1].iter().all(|c| c["choices"][0]["finish_reason"].is_null()));
        let whole_text =
            if chat { w["message"]["content"].as_str().unwrap() } else { w["text"].as_str().unwrap() };
        assert_eq!(streamed, whole_text);
        let u = &whole["usage"];
        assert_eq!(
            u["total_tokens"],
            u["prompt_tokens"].as_u64().unwrap() + u["completion_tokens"].as_u64().unwrap()
        );
        if chat {
            assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn token_ids_stop_strings_and_replay() {
    let s = start(4, 512, 100, 16, None).await;
    let p: Vec<u32> = vec![100, 200, 300, 400];
    let want = FakeEngine::expected(VOCAB, &p, Sampling::GREEDY, 60, s.tok.eos_ids());
    let body = json!({"prompt": p, "max_tokens": 60, "temperature": 0, "return_token_ids": true});
    let (_, whole) = s.json("/v1/completions", body.clone()).await;
    let ids: Vec<u32> = serde_json::from_value(whole["choices"][0]["token_ids"].clone()).unwrap();
    assert_eq!(ids, want);
    assert_eq!(whole["usage"]["completion_tokens"], want.len());
    // Streamed: one chunk per token, each carrying exactly its id.
    let mut sb = body.clone();
    sb["stream"] = json!(true);
    let (_, _, text) = s.post("/v1/completions", sb).await;
    let per: Vec<Vec<u32>> = frames(&text)
        .iter()
        .map(|f| serde_json::from_value(f["choices"][0]["token_ids"].clone()).unwrap())
        .collect();
    assert!(per.iter().filter(|v| !v.is_empty()).all(|v| v.len() == 1), "{per:?}");
    assert_eq!(per.concat(), want);
    // Same-path replay of the non-streamed request.
    let (code, r) = s.json("/debug/replay", json!({"id": whole["id"]})).await;
    assert_eq!(code, 200, "{r}");
    assert_eq!(r["token_ids"], json!(want));
    let (code, r) = s.json("/debug/replay", json!({"id": "nope"})).await;
    check_error(code, &r, 404, None);
    // A stop string across a token boundary: text of tokens k and k+1 around their joint.
    let text = whole["choices"][0]["text"].as_str().unwrap().to_string();
    let dec = |n: usize| s.tok.decode(&want[..n]).unwrap();
    let cut = (5..want.len() - 2).find(|&k| {
        let (a, b) = (dec(k), dec(k + 1));
        b.len() > a.len()
            && a.len() >= 2
            && a.chars().all(|c| c != '\u{FFFD}')
            && text.starts_with(&b)
            && b.is_char_boundary(a.len())
            && text[..a.len() - 1].find(&text[a.len() - 1..=a.len()]).is_none()
            && text.is_char_boundary(a.len() - 1)
            && text.is_char_boundary(a.len() + 1)
    });
    let k = cut.expect("no usable token boundary in the generated text");
    let at = dec(k).len();
    let stop = text[at - 1..at + 1].to_string();
    let mut sb = body.clone();
    sb["stop"] = json!([stop.clone(), "never-appears"]);
    let (_, st) = s.json("/v1/completions", sb.clone()).await;
    assert_eq!(st["choices"][0]["finish_reason"], "stop");
    assert_eq!(st["choices"][0]["text"], text[..at - 1]);
    sb["stream"] = json!(true);
    let (_, _, t) = s.post("/v1/completions", sb).await;
    let streamed: String =
        frames(&t).iter().map(|f| f["choices"][0]["text"].as_str().unwrap().to_string()).collect();
    assert_eq!(streamed, text[..at - 1]);
    assert!(!streamed.contains(&stop));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn queue_full_auth_models_health_metrics() {
    let s = start(1, 1024, 3000, 1, Some("sekrit")).await;
    let auth = |r: reqwest::RequestBuilder| r.bearer_auth("sekrit");
    // Without the key: 401.
    let r =
        s.c.post(format!("{}/v1/completions", s.base)).json(&json!({"prompt": "x"})).send().await.unwrap();
    let code = r.status().as_u16();
    check_error(code, &r.json().await.unwrap(), 401, None);
    let r = auth(s.c.get(format!("{}/v1/models", s.base))).send().await.unwrap();
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["data"][0]["id"], "fake");
    // One slot busy, one waiting: the next gets 503 with Retry-After.
    // A prompt whose 500 greedy tokens contain no end-of-sequence token.
    let p = (5..VOCAB)
        .find(|&p| FakeEngine::expected(VOCAB, &[p, p], Sampling::GREEDY, 500, s.tok.eos_ids()).len() == 500)
        .unwrap();
    let long = json!({"prompt": [p, p], "max_tokens": 500, "temperature": 0, "stream": true});
    let mut a = auth(s.c.post(format!("{}/v1/completions", s.base))).json(&long).send().await.unwrap();
    let _ = a.chunk().await.unwrap(); // admitted and generating
    let b = {
        let req = auth(s.c.post(format!("{}/v1/completions", s.base))).json(&long);
        tokio::spawn(async move {
            let r = req.send().await.unwrap();
            let code = r.status().as_u16();
            // Hold the stream to its end: dropping it would cancel b.
            let body = r.text().await.unwrap();
            (code, body)
        })
    };
    for _ in 0..200 {
        if s.h.queue_depth() == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let r = auth(s.c.post(format!("{}/v1/completions", s.base)))
        .json(&json!({"prompt": "x"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 503);
    assert_eq!(r.headers()["retry-after"], "1");
    let code = r.status().as_u16();
    check_error(code, &r.json().await.unwrap(), 503, None);
    drop(a); // disconnect: frees the slot for b
    let (code, body) = b.await.unwrap();
    assert_eq!(code, 200);
    assert_eq!(frames(&body).last().unwrap()["choices"][0]["finish_reason"], "length");
    let h: Value = s.c.get(format!("{}/health", s.base)).send().await.unwrap().json().await.unwrap();
    assert_eq!(h["status"], "ok");
    let m = s.c.get(format!("{}/metrics", s.base)).send().await.unwrap().text().await.unwrap();
    for name in [
        "llama_queue_depth",
        "llama_running_sequences",
        "llama_time_to_first_token_seconds_bucket",
        "llama_time_per_output_token_seconds",
        "llama_generated_tokens_total",
        "llama_kv_slots_used",
        "llama_engine_steps_total",
        "llama_errors_total",
        "llama_requests_total",
    ] {
        assert!(m.contains(name), "{name} missing from\n{m}");
    }
    // Shutdown: health and new requests answer 503.
    s.h.shutdown(Duration::from_millis(100));
    let r = s.c.get(format!("{}/health", s.base)).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 503);
    let r = auth(s.c.post(format!("{}/v1/completions", s.base)))
        .json(&json!({"prompt": "x"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 503);
}

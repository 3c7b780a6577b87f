//! End to end: `run_load` against a fake OpenAI-style SSE server on 127.0.0.1:0 (hyper), with
//! faults the checks must catch (a replay that differs, a usage count that is off by one, a gauge
//! left up).

use super::plan::tests_support::options;
use super::run_load;
use bytes::Bytes;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::{Request, Response};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

type Body = http_body_util::combinators::BoxBody<Bytes, Infallible>;

#[derive(Default, Clone, Copy)]
struct Faults {
    corrupt_replay: bool,
    usage_off_by_one: bool,
    stuck_gauge: bool,
}

#[derive(Default)]
struct Fake {
    faults: Faults,
    next_id: AtomicU64,
    running: AtomicI64,
    served: Mutex<HashMap<String, Vec<u32>>>,
}

const VOCAB: u32 = 50;

/// The fake model: token `k` of a request, never 0 or 1 (no EOS), below VOCAB.
fn token(prompt: &[u32], seed: u64, k: usize) -> u32 {
    let s: u64 = prompt.iter().map(|&t| u64::from(t)).sum::<u64>() + seed * 7 + k as u64 * 31;
    2 + (s % u64::from(VOCAB - 2)) as u32
}

fn full(status: u16, v: Value) -> Response<Body> {
    let mut r = Response::new(Full::new(Bytes::from(v.to_string())).boxed());
    *r.status_mut() = hyper::StatusCode::from_u16(status).unwrap();
    r
}

async fn handle(fake: Arc<Fake>, req: Request<Incoming>) -> Result<Response<Body>, Infallible> {
    let (method, path) = (req.method().clone(), req.uri().path().to_string());
    let body: Value = {
        let b = req.into_body().collect().await.map(|c| c.to_bytes()).unwrap_or_default();
        serde_json::from_slice(&b).unwrap_or(Value::Null)
    };
    Ok(match (method.as_str(), path.as_str()) {
        ("GET", "/v1/models") => full(200, json!({"object": "list", "data": [{"id": "fake-model"}]})),
        ("GET", "/metrics") => {
            let running = fake.running.load(Ordering::SeqCst) + i64::from(fake.faults.stuck_gauge);
            let text = format!(
                "# TYPE fake_requests_running gauge\nfake_requests_running {running}\n\
                 fake_requests_queued 0\nfake_kv_slots_used {running}\nfake_requests_total 9\n"
            );
            Response::new(Full::new(Bytes::from(text)).boxed())
        }
        ("POST", "/debug/replay") => {
            let id = body["id"].as_str().unwrap_or("").to_string();
            match fake.served.lock().unwrap().get(&id).cloned() {
                Some(mut ids) => {
                    if fake.faults.corrupt_replay {
                        let last = ids.len() - 1;
                        ids[last] = 2 + (ids[last] + 1 - 2) % (VOCAB - 2);
                    }
                    full(200, json!({"id": id, "token_ids": ids}))
                }
                None => full(404, json!({"error": {"message": "unknown id", "type": "not_found"}})),
            }
        }
        ("POST", "/v1/completions") => completion(fake, &body),
        _ => full(404, json!({"error": {"message": "no route"}})),
    })
}

fn completion(fake: Arc<Fake>, body: &Value) -> Response<Body> {
    let prompt: Vec<u32> = serde_json::from_value(body["prompt"].clone()).unwrap_or_default();
    let max = body["max_tokens"].as_u64().unwrap_or(0) as usize;
    let ok = body["stream"] == true
        && body["return_token_ids"] == true
        && body["stream_options"]["include_usage"] == true
        && body["model"] == "fake-model"
        && !prompt.is_empty();
    if !ok {
        return full(400, json!({"error": {"message": "bad request", "type": "invalid_request_error"}}));
    }
    let seed = if body["temperature"].as_f64() == Some(0.0) { 0 } else { body["seed"].as_u64().unwrap_or(1) };
    let id = format!("cmpl-{}", fake.next_id.fetch_add(1, Ordering::SeqCst));
    let ids: Vec<u32> = (0..max).map(|k| token(&prompt, seed, k)).collect();
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(4);
    fake.running.fetch_add(1, Ordering::SeqCst);
    let faults = fake.faults;
    tokio::spawn(async move {
        let mut events = Vec::new();
        // One or two tokens per chunk; an empty-token chunk first (role-like).
        events.push(json!({"id": id, "object": "text_completion", "choices": [{"index": 0, "text": "", "token_ids": [], "finish_reason": null}]}));
        for (i, group) in ids.chunks(1 + (prompt[0] as usize % 2)).enumerate() {
            let last = (i + 1) * group.len() >= ids.len();
            events.push(json!({"id": id, "object": "text_completion",
                "choices": [{"index": 0, "text": "x", "token_ids": group, "finish_reason": if last { json!("length") } else { Value::Null }}]}));
        }
        let n = ids.len() + usize::from(faults.usage_off_by_one);
        events.push(json!({"id": id, "object": "text_completion", "choices": [],
            "usage": {"prompt_tokens": prompt.len(), "completion_tokens": n, "total_tokens": prompt.len() + n}}));
        let mut text: Vec<String> = events.iter().map(|e| format!("data: {e}\n\n")).collect();
        text.push("data: [DONE]\n\n".into());
        fake.served.lock().unwrap().insert(id.clone(), ids);
        'send: for t in text {
            // Each event in two frames, split inside the JSON.
            let (a, b) = t.as_bytes().split_at(t.len() / 2);
            for part in [a, b] {
                if tx.send(Bytes::copy_from_slice(part)).await.is_err() {
                    break 'send; // the client went away
                }
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        drop(tx);
        fake.running.fetch_sub(1, Ordering::SeqCst);
    });
    let stream = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|b| (Ok::<_, Infallible>(Frame::data(b)), rx))
    });
    let mut r = Response::new(BodyExt::boxed(StreamBody::new(stream)));
    r.headers_mut().insert("content-type", "text/event-stream".parse().unwrap());
    r
}

/// Starts the fake server; returns its base URL.
async fn start(faults: Faults) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let fake = Arc::new(Fake { faults, ..Default::default() });
    tokio::spawn(async move {
        loop {
            let Ok((sock, _)) = listener.accept().await else { return };
            let fake = Arc::clone(&fake);
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req| handle(Arc::clone(&fake), req));
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(sock), svc)
                    .await;
            });
        }
    });
    format!("http://{addr}")
}

fn args(url: &str) -> super::LoadOptions {
    options(&[
        "--url",
        url,
        "--clients",
        "4",
        "--requests-per-client",
        "3",
        "--prompt-tokens",
        "5",
        "--max-tokens",
        "12",
        "--sampled-fraction",
        "0.5",
        "--cancel-fraction",
        "0.25",
        "--vocab",
        "50",
        "--seed",
        "7",
        "--verify",
        "--timeout-s",
        "20",
        "--settle-s",
        "2",
    ])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_correct_server_passes() {
    let url = start(Faults::default()).await;
    let r = run_load(&args(&url), "test".into()).await.unwrap();
    assert_eq!(r.failures(), Vec::<String>::new(), "{}", r.summary());
    assert_eq!((r.requests, r.completed, r.cancelled, r.errors), (12, 9, 3, 0));
    assert!(r.generated_tokens >= 9 * 12 + 3 && r.generated_tokens < 12 * 12, "{}", r.generated_tokens);
    let v = r.verify.clone().unwrap();
    assert_eq!((v.streams, v.tokens_checked, v.tokens_equal, v.mismatched_streams), (9, 108, 108, 0));
    assert_eq!((r.metrics_after.running, r.metrics_after.kv_slots_used), (Some(0.0), Some(0.0)));
    assert!(r.ttft_ms.p50.is_some() && r.tpot_ms.p99.is_some() && r.tokens_per_s > 0.0);
    assert_eq!(r.mode, "http");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn faults_are_caught() {
    let url = start(Faults { corrupt_replay: true, ..Default::default() }).await;
    let r = run_load(&args(&url), "test".into()).await.unwrap();
    let v = r.verify.clone().unwrap();
    assert_eq!((v.mismatched_streams, v.tokens_equal, v.tokens_checked), (9, 99, 108));
    assert!(r.failures().iter().any(|f| f.contains("replay")), "{:?}", r.failures());

    let url = start(Faults { usage_off_by_one: true, ..Default::default() }).await;
    let r = run_load(&args(&url), "test".into()).await.unwrap();
    assert_eq!((r.completed, r.cancelled, r.errors), (0, 3, 9), "{}", r.summary());

    let url = start(Faults { stuck_gauge: true, ..Default::default() }).await;
    let mut o = args(&url);
    o.settle_s = 0.2;
    let r = run_load(&o, "test".into()).await.unwrap();
    assert!(r.failures().iter().any(|f| f.contains("running = 1")), "{:?}", r.failures());

    assert!(run_load(&args("http://192.168.0.1:8000"), "test".into()).await.is_err(), "loopback only");
    let mut o = args(&url);
    o.model = Some("other-model".into());
    let r = run_load(&o, "test".into()).await.unwrap();
    assert_eq!(r.errors, 12, "HTTP 400 answers are errors");
}

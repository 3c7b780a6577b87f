//! Shutdown in bounded time (`server::shutdown::serve_until`, what `llama-serve` runs on SIGTERM),
//! on the FakeEngine: a client that never finishes its request cannot keep the process alive, and
//! during the grace period new requests are answered 503 with `Retry-After` (not refused) while
//! the streams in flight finish.

mod common;

use common::{frames, no_eos_prompt, stream_ids, VOCAB};
use serde_json::json;
use server::batcher::{spawn, BatcherConfig, BatcherHandle};
use server::engine::Sampling;
use server::fake::FakeEngine;
use server::http::{AppState, ServerConfig};
use server::tokenizer::TextTokenizer;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::AsyncWriteExt;

struct Until {
    base: String,
    addr: std::net::SocketAddr,
    h: BatcherHandle,
    signal: Option<tokio::sync::oneshot::Sender<()>>,
    served: tokio::task::JoinHandle<std::io::Result<()>>,
}

async fn start(slots: u32, delay_us: u64, grace: Duration) -> Until {
    let tok = Arc::new(TextTokenizer::fixture().unwrap());
    let eng = FakeEngine::new(slots, 256, VOCAB, 32).with_delay(Duration::from_micros(delay_us));
    let cfg = BatcherConfig { max_queue: 64, prefill_chunk: 32, eos: tok.eos_ids().to_vec(), paths_kept: 0 };
    let (h, task) = spawn(eng, cfg);
    let state = Arc::new(AppState {
        batcher: h.clone(),
        tok,
        cfg: ServerConfig {
            model_name: "fake".into(),
            api_key: None,
            max_body_bytes: 1 << 16,
            debug_replay: false,
            conn: Default::default(),
        },
        metrics: server::metrics::recorder(),
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let signal = async move {
        let _ = rx.await;
    };
    let served = tokio::spawn(server::shutdown::serve_until(listener, state, signal, grace, task));
    Until { base: format!("http://{addr}"), addr, h, signal: Some(tx), served }
}

/// Found by red-team review: a connection holding half a request head (or a body that never
/// comes) kept axum's graceful shutdown waiting forever, so SIGTERM never ended the process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_never_finishes_its_request_cannot_keep_the_server_alive() {
    let mut u = start(2, 200, Duration::from_millis(100)).await;
    let mut half_head = tokio::net::TcpStream::connect(u.addr).await.unwrap();
    half_head.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\n").await.unwrap();
    let mut short_body = tokio::net::TcpStream::connect(u.addr).await.unwrap();
    short_body
        .write_all(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"prompt\":")
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    let t = Instant::now();
    let _ = u.signal.take().unwrap().send(());
    let r = tokio::time::timeout(Duration::from_secs(6), &mut u.served).await;
    assert!(r.is_ok(), "serve_until still running {:?} after the signal", t.elapsed());
    r.unwrap().unwrap().unwrap();
    assert!(
        t.elapsed() <= Duration::from_millis(100) + server::shutdown::CLOSE_BOUND + Duration::from_secs(1)
    );
    assert!(u.h.is_draining());
    drop((half_head, short_body));
}

/// Found by red-team review: on the signal the listener closed at once, so a client arriving
/// during the grace period got a refused connection instead of the promised 503 + Retry-After.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn during_the_grace_new_requests_get_503_and_streams_in_flight_finish() {
    let mut u = start(2, 2000, Duration::from_secs(10)).await;
    let c = reqwest::Client::new();
    let p = no_eos_prompt(9, 4, 60);
    let body =
        json!({"prompt": p, "max_tokens": 60, "temperature": 0, "stream": true, "return_token_ids": true});
    let (c2, base) = (c.clone(), u.base.clone());
    let job = tokio::spawn(async move {
        c2.post(format!("{base}/v1/completions")).json(&body).send().await.unwrap().text().await.unwrap()
    });
    tokio::time::sleep(Duration::from_millis(30)).await;
    let _ = u.signal.take().unwrap().send(());
    tokio::time::sleep(Duration::from_millis(20)).await;
    let r = c.post(format!("{}/v1/completions", u.base)).json(&json!({"prompt": "x"})).send().await;
    let r = r.expect("a request during the grace period must be answered, not refused");
    assert_eq!(r.status().as_u16(), 503);
    assert_eq!(r.headers().get("retry-after").and_then(|v| v.to_str().ok()), Some("1"));
    let health = c.get(format!("{}/health", u.base)).send().await.unwrap();
    assert_eq!(health.status().as_u16(), 503);
    let streamed = tokio::time::timeout(Duration::from_secs(5), job).await.unwrap().unwrap();
    assert_eq!(stream_ids(&streamed), FakeEngine::expected(VOCAB, &p, Sampling::GREEDY, 60, &[]));
    assert_eq!(frames(&streamed).last().unwrap()["choices"][0]["finish_reason"], "length");
    tokio::time::timeout(Duration::from_secs(5), &mut u.served).await.unwrap().unwrap().unwrap();
}

/// Found by review: a grace of `Duration::MAX` (the usual way to say "no bound") panicked twice:
/// in the batcher (`Instant::now() + grace`, cutting every stream at once) and in the future that
/// stops the server (`grace + BATCHER_MARGIN`, so `serve_until` panicked). Now the stream in flight
/// finishes whole, requests during the grace get their 503, and `serve_until` returns once the
/// batcher is done.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unbounded_grace_lets_streams_finish() {
    let mut u = start(2, 2000, Duration::MAX).await;
    let c = reqwest::Client::new();
    let p = no_eos_prompt(11, 4, 40);
    let body =
        json!({"prompt": p, "max_tokens": 40, "temperature": 0, "stream": true, "return_token_ids": true});
    let (c2, base) = (c.clone(), u.base.clone());
    let job = tokio::spawn(async move {
        c2.post(format!("{base}/v1/completions")).json(&body).send().await.unwrap().text().await.unwrap()
    });
    tokio::time::sleep(Duration::from_millis(30)).await;
    let _ = u.signal.take().unwrap().send(());
    tokio::time::sleep(Duration::from_millis(20)).await;
    let r = c.post(format!("{}/v1/completions", u.base)).json(&json!({"prompt": "x"})).send().await;
    assert_eq!(r.expect("a request during the grace period must be answered").status().as_u16(), 503);
    let streamed = tokio::time::timeout(Duration::from_secs(5), job).await.unwrap().unwrap();
    assert_eq!(stream_ids(&streamed), FakeEngine::expected(VOCAB, &p, Sampling::GREEDY, 40, &[]));
    assert_eq!(frames(&streamed).last().unwrap()["choices"][0]["finish_reason"], "length");
    let served = tokio::time::timeout(Duration::from_secs(5), &mut u.served).await;
    served.expect("serve_until still running after its streams ended").unwrap().unwrap();
}

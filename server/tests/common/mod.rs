//! Shared by the red-team tests: a server on the FakeEngine over 127.0.0.1:0, a raw HTTP/1.1
//! client (for bodies reqwest will not send and for disconnecting at a chosen point), SSE parsing.

#![allow(dead_code)]

use serde_json::Value;
use server::batcher::{spawn, BatcherConfig, BatcherHandle};
use server::fake::FakeEngine;
use server::http::{AppState, ServerConfig};
use server::tokenizer::TextTokenizer;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

pub const VOCAB: u32 = 2048;

/// How to build a test server.
#[derive(Clone)]
pub struct Opts {
    pub slots: u32,
    pub max_seq: u32,
    pub delay_us: u64,
    pub max_queue: usize,
    pub key: Option<&'static str>,
    pub prefill: u32,
    pub eos: Option<Vec<u32>>,
    pub max_body: usize,
    pub conn: server::listen::ConnLimits,
}

impl Default for Opts {
    fn default() -> Self {
        Opts {
            slots: 4,
            max_seq: 256,
            delay_us: 200,
            max_queue: 64,
            key: None,
            prefill: 32,
            eos: None,
            max_body: 1 << 16,
            conn: Default::default(),
        }
    }
}

pub struct Srv {
    pub base: String,
    pub addr: std::net::SocketAddr,
    pub h: BatcherHandle,
    pub tok: Arc<TextTokenizer>,
    pub c: reqwest::Client,
    pub steps: Arc<AtomicU64>,
    pub task: Option<tokio::task::JoinHandle<()>>,
    pub stop_http: Option<tokio::sync::oneshot::Sender<()>>,
    pub http: Option<tokio::task::JoinHandle<std::io::Result<()>>>,
}

pub async fn start(o: Opts) -> Srv {
    let tok = Arc::new(TextTokenizer::fixture().unwrap());
    let eng =
        FakeEngine::new(o.slots, o.max_seq, VOCAB, o.prefill).with_delay(Duration::from_micros(o.delay_us));
    let steps = eng.step_counter();
    let eos = o.eos.clone().unwrap_or_else(|| tok.eos_ids().to_vec());
    let cfg = BatcherConfig { max_queue: o.max_queue, prefill_chunk: o.prefill, eos, paths_kept: 10_000 };
    let (h, task) = spawn(eng, cfg);
    let state = Arc::new(AppState {
        batcher: h.clone(),
        tok: tok.clone(),
        cfg: ServerConfig {
            model_name: "fake".into(),
            api_key: o.key.map(str::to_string),
            max_body_bytes: o.max_body,
            debug_replay: true,
            conn: o.conn,
        },
        metrics: server::metrics::recorder(),
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let http = tokio::spawn(server::http::serve(listener, state, async move {
        let _ = stop_rx.await;
    }));
    Srv {
        base: format!("http://{addr}"),
        addr,
        h,
        tok,
        c: reqwest::Client::new(),
        steps,
        task: Some(task),
        stop_http: Some(stop_tx),
        http: Some(http),
    }
}

impl Srv {
    pub async fn post(&self, path: &str, body: &Value) -> (u16, String) {
        let r = self.c.post(format!("{}{path}", self.base)).json(body).send().await.unwrap();
        let s = r.status().as_u16();
        (s, r.text().await.unwrap())
    }

    pub async fn json(&self, path: &str, body: &Value) -> (u16, Value) {
        let (s, t) = self.post(path, body).await;
        (s, serde_json::from_str(&t).unwrap_or_else(|e| panic!("{e}: {s} {t:?}")))
    }

    /// Sends `head` (request line and headers, without the blank line) and `body` raw, reads
    /// the whole response; returns the status and the body (de-chunked when chunked).
    pub async fn raw(&self, head: &str, body: &[u8]) -> (u16, String) {
        let mut s = tokio::net::TcpStream::connect(self.addr).await.unwrap();
        let mut req = format!("{head}\r\nHost: x\r\nConnection: close\r\n\r\n").into_bytes();
        req.extend_from_slice(body);
        s.write_all(&req).await.unwrap();
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out).await;
        parse_response(&out)
    }
}

/// Status and (de-chunked) body of a raw HTTP/1.1 response.
pub fn parse_response(raw: &[u8]) -> (u16, String) {
    let text = String::from_utf8_lossy(raw).to_string();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or_else(|| panic!("no response head: {text:?}"));
    let status: u16 = head.split(' ').nth(1).unwrap().parse().unwrap();
    let chunked = head.to_ascii_lowercase().contains("transfer-encoding: chunked");
    if !chunked {
        return (status, body.to_string());
    }
    let mut out = String::new();
    let mut rest = body;
    while let Some((len, tail)) = rest.split_once("\r\n") {
        let n = usize::from_str_radix(len.trim(), 16).unwrap_or(0);
        if n == 0 {
            break;
        }
        out.push_str(&tail[..n]);
        rest = &tail[n + 2..];
    }
    (status, out)
}

/// The `data:` payloads of an SSE body, checking the framing; the last must be `[DONE]`.
pub fn frames(body: &str) -> Vec<Value> {
    assert!(body.ends_with("data: [DONE]\n\n"), "{body:?}");
    let parts: Vec<&str> = body.split_terminator("\n\n").collect();
    assert_eq!(parts.iter().filter(|p| **p == "data: [DONE]").count(), 1, "{body:?}");
    parts[..parts.len() - 1]
        .iter()
        .map(|p| {
            serde_json::from_str(p.strip_prefix("data: ").unwrap_or_else(|| panic!("bad frame {p:?}")))
                .unwrap()
        })
        .collect()
}

/// The token ids of a streamed body (requests with `return_token_ids`).
pub fn stream_ids(body: &str) -> Vec<u32> {
    frames(body)
        .iter()
        .filter(|f| f["choices"].as_array().is_some_and(|c| !c.is_empty()))
        .flat_map(|f| serde_json::from_value::<Vec<u32>>(f["choices"][0]["token_ids"].clone()).unwrap())
        .collect()
}

/// An OpenAI error body with `want` status (and `param`, when given).
pub fn check_error(status: u16, body: &str, want: u16, param: Option<&str>) {
    assert_eq!(status, want, "{body}");
    let v: Value = serde_json::from_str(body).unwrap_or_else(|e| panic!("not JSON ({e}): {body:?}"));
    let e = &v["error"];
    assert!(e["message"].as_str().is_some_and(|m| !m.is_empty()), "{body}");
    assert!(e["type"].is_string() && e["code"].is_string(), "{body}");
    assert!(e.as_object().unwrap().contains_key("param"), "{body}");
    if let Some(p) = param {
        assert_eq!(e["param"], p, "{body}");
    }
}

/// A prompt of `len` ids whose `n` greedy tokens contain no end-of-sequence id (1, 4).
pub fn no_eos_prompt(seed: u32, len: usize, n: usize) -> Vec<u32> {
    (seed..)
        .map(|s| {
            (0..len as u32)
                .map(|i| 5 + (s.wrapping_mul(2654435761).wrapping_add(i * 97)) % (VOCAB - 5))
                .collect::<Vec<u32>>()
        })
        .find(|p| FakeEngine::expected(VOCAB, p, server::engine::Sampling::GREEDY, n, &[1, 4]).len() == n)
        .unwrap()
}

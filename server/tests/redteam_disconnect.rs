//! Red team, disconnects: a client that goes away at any point of its request frees its slot
//! within a step or two, and the queue, slots and gauges all come back to 0. (One test in its
//! own binary: the Prometheus gauges are process-wide.)

mod common;

use common::{start, Opts};
use serde_json::json;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

fn gauge(name: &str) -> f64 {
    let text = server::metrics::recorder().render();
    text.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|r| r.strip_prefix(' ')))
        .map_or(0.0, |v| v.trim().parse().unwrap())
}

async fn open(addr: std::net::SocketAddr, body: &serde_json::Value) -> TcpStream {
    let b = body.to_string();
    let mut s = TcpStream::connect(addr).await.unwrap();
    let req = format!(
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{b}",
        b.len()
    );
    s.write_all(req.as_bytes()).await.unwrap();
    s
}

/// Reads until `n` bytes have come (or the end).
async fn read_n(s: &mut TcpStream, n: usize) -> Vec<u8> {
    let mut out = Vec::new();
    let mut buf = [0u8; 1];
    while out.len() < n {
        match s.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(_) => out.push(buf[0]),
        }
    }
    out
}

/// Waits until nothing runs, waits or holds a slot; returns the engine calls it took.
async fn settles(s: &common::Srv, what: &str) -> u64 {
    let t0 = Instant::now();
    let at = s.steps.load(Ordering::SeqCst);
    loop {
        let idle = s.h.queue_depth() == 0
            && gauge("llama_kv_slots_used") == 0.0
            && gauge("llama_running_sequences") == 0.0
            && gauge("llama_queue_depth") == 0.0;
        if idle {
            return s.steps.load(Ordering::SeqCst) - at;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(3),
            "{what}: no settle\n{}",
            server::metrics::recorder().render()
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn disconnects_at_every_point_leak_nothing() {
    let s = start(Opts { slots: 2, max_seq: 2048, delay_us: 2000, max_queue: 8, ..Opts::default() }).await;
    let p = common::no_eos_prompt(1, 4, 1500);
    let long = json!({"prompt": p, "max_tokens": 1500, "temperature": 0, "stream": true});

    // Mid-stream: after a few frames the client closes; the slot is free within a couple of
    // steps (the write that finds the socket closed, then the reap).
    for frames in [1usize, 5] {
        let mut c = open(s.addr, &long).await;
        let got = read_n(&mut c, 400).await;
        let text = String::from_utf8_lossy(&got);
        assert!(text.matches("data: ").count() >= frames.min(1), "{text}");
        drop(c);
        let n = settles(&s, "mid-stream").await;
        assert!(n <= 4, "{n} engine calls after a mid-stream disconnect");
    }

    // Before the first token: two slots busy, the third request waits in the queue.
    let mut busy = Vec::new();
    for _ in 0..2 {
        let mut c = open(s.addr, &long).await;
        read_n(&mut c, 300).await;
        busy.push(c);
    }
    let queued = open(s.addr, &long).await;
    let t0 = Instant::now();
    while s.h.queue_depth() != 1 {
        assert!(t0.elapsed() < Duration::from_secs(2));
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    drop(queued);
    let t0 = Instant::now();
    while s.h.queue_depth() != 0 {
        assert!(t0.elapsed() < Duration::from_millis(500), "a queued client that left still waits");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    drop(busy);
    settles(&s, "busy").await;

    // A non-streamed request whose client leaves while it generates.
    let mut nb = long.clone();
    nb["stream"] = json!(false);
    let c = open(s.addr, &nb).await;
    tokio::time::sleep(Duration::from_millis(30)).await;
    assert_eq!(gauge("llama_running_sequences"), 1.0);
    drop(c);
    let n = settles(&s, "non-streamed").await;
    assert!(n <= 4, "{n} engine calls after a non-streamed disconnect");

    // Every byte offset of a short stream with a usage chunk: before the headers end, in the
    // first chunk, in the usage chunk, just before [DONE].
    let short = json!({"prompt": p, "max_tokens": 6, "temperature": 0, "stream": true, "stream_options": {"include_usage": true}});
    let mut whole = open(s.addr, &short).await;
    let all = read_n(&mut whole, 1 << 20).await;
    drop(whole);
    let text = String::from_utf8_lossy(&all).to_string();
    assert!(text.contains("\"usage\"") && text.trim_end().ends_with("0"), "{text}");
    let step = (all.len() / 40).max(1);
    for cut in (0..all.len()).step_by(step).chain([all.len() - 20, all.len() - 40]) {
        let mut c = open(s.addr, &short).await;
        read_n(&mut c, cut).await;
        drop(c);
    }
    settles(&s, "short cuts").await;

    // Nothing leaked: both slots serve at once, with the expected tokens.
    let body = json!({"prompt": p, "max_tokens": 30, "temperature": 0, "return_token_ids": true});
    let (a, b) = tokio::join!(s.json("/v1/completions", &body), s.json("/v1/completions", &body));
    assert_eq!(a.0, 200);
    assert_eq!(a.1["choices"][0]["token_ids"], b.1["choices"][0]["token_ids"]);
    settles(&s, "end").await;
    let m = server::metrics::recorder().render();
    assert!(m.contains("outcome=\"cancelled\""), "{m}");
}

//! Red team, connections (found by review): `axum::serve` ran hyper without a timer, so a request
//! head that never finished kept its connection for ever, and nothing bounded the connections open.
//! About 1,000 half-sent heads exhausted the process's file descriptors; `accept` then failed and
//! every new client hung. Now each connection holds one of `ConnLimits::max_connections` permits,
//! a head that has not arrived within `ConnLimits::header_read_timeout` closes its connection, and
//! a body that has not arrived within `ConnLimits::body_read_timeout` fails its request.

mod common;
use common::{start, Opts};
use server::listen::ConnLimits;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// More half-sent heads than the connection bound: a well-formed request sent after them is
/// answered once the heads' timeout has freed the permits, and each half-sent connection is closed
/// by the server. Without the timeout (the old server) every attacker connection stays open and
/// the request is not answered within the bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn half_sent_heads_time_out_and_free_their_connections() {
    let conn = ConnLimits {
        max_connections: 16,
        header_read_timeout: Duration::from_millis(500),
        body_read_timeout: Duration::from_secs(30),
    };
    let s = start(Opts { conn, ..Opts::default() }).await;
    let mut attackers = Vec::new();
    for _ in 0..24 {
        let mut c = tokio::net::TcpStream::connect(s.addr).await.unwrap();
        c.write_all(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n").await.unwrap();
        attackers.push(c);
    }
    let t = Instant::now();
    let (code, body) =
        tokio::time::timeout(Duration::from_secs(10), s.post("/v1/models", &serde_json::json!({})))
            .await
            .unwrap_or((0, "no answer within 10 s".into()));
    // `/v1/models` is a GET route: a POST is answered 405, which is an answer.
    assert!(code == 405 || code == 200, "{code}: {body}");
    assert!(t.elapsed() < Duration::from_secs(5), "answered after {:?}", t.elapsed());
    // ... and not before the heads' timeout freed a permit: the bound held it back.
    assert!(t.elapsed() >= Duration::from_millis(400), "answered after {:?}, within the bound", t.elapsed());
    // Every half-sent connection was closed by the server (its read sees the end, or a reset).
    for (i, mut c) in attackers.into_iter().enumerate() {
        let mut buf = [0u8; 256];
        let r = tokio::time::timeout(Duration::from_secs(5), c.read(&mut buf)).await;
        assert!(r.is_ok(), "attacker connection {i} still open after its head's timeout");
    }
}

/// A complete head, then part of its body and nothing more: the request is answered (400,
/// `invalid_body`) once the body's time is up, instead of holding its connection for ever (the
/// old server never answered).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_body_that_stops_arriving_fails_its_request() {
    let conn = ConnLimits {
        max_connections: 16,
        header_read_timeout: Duration::from_secs(30),
        body_read_timeout: Duration::from_millis(500),
    };
    let s = start(Opts { conn, ..Opts::default() }).await;
    let mut c = tokio::net::TcpStream::connect(s.addr).await.unwrap();
    c.write_all(
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"prompt\": ",
    )
    .await
    .unwrap();
    let t = Instant::now();
    let mut buf = vec![0u8; 4096];
    let n = tokio::time::timeout(Duration::from_secs(5), c.read(&mut buf))
        .await
        .expect("no answer within 5 s to a body that stopped arriving")
        .unwrap();
    let text = String::from_utf8_lossy(&buf[..n]);
    assert!(text.starts_with("HTTP/1.1 400"), "{text}");
    assert!(text.contains("invalid_body") && text.contains("did not arrive"), "{text}");
    assert!(
        t.elapsed() >= Duration::from_millis(400),
        "answered after {:?}, before the body's time",
        t.elapsed()
    );
    // A well-formed request is answered as before.
    let (code, v) =
        s.json("/v1/completions", &serde_json::json!({"prompt": [5, 6, 7], "max_tokens": 2})).await;
    assert_eq!(code, 200, "{v}");
}

/// Found by review: `header_read_timeout: Duration::MAX` (or `--header-timeout-s` past 2^63) made
/// hyper's `now + timeout` panic in every connection's task, so the server answered nothing. Longer
/// timeouts are now cut to `listen::MAX_TIMEOUT`: requests are answered, bodies read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unbounded_timeouts_still_answer() {
    let conn = ConnLimits {
        max_connections: 16,
        header_read_timeout: Duration::MAX,
        body_read_timeout: Duration::MAX,
    };
    let s = start(Opts { conn, ..Opts::default() }).await;
    let (code, body) = tokio::time::timeout(Duration::from_secs(10), s.raw("GET /health HTTP/1.1", b""))
        .await
        .expect("no answer within 10 s");
    assert_eq!(code, 200, "{body}");
    let req = serde_json::json!({"prompt": [1, 2, 3], "max_tokens": 2, "temperature": 0});
    let (code, body) = tokio::time::timeout(Duration::from_secs(10), s.post("/v1/completions", &req))
        .await
        .expect("no answer within 10 s");
    assert_eq!(code, 200, "{body}");
}

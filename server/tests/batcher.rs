//! The batcher on the FakeEngine: expected tokens under concurrency, FIFO admission,
//! cancellation, the bounded queue, shutdown, and same-path replay.

use server::batcher::{spawn, BatcherConfig, BatcherHandle, Event, Finish, GenRequest, SubmitError};
use server::engine::{Engine, Sampling};
use server::fake::FakeEngine;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use tokio::sync::mpsc::UnboundedReceiver;

const VOCAB: u32 = 2048;

fn req(id: &str, prompt: Vec<u32>, max_tokens: u32, sampling: Sampling) -> GenRequest {
    GenRequest { id: id.into(), prompt, max_tokens, sampling }
}

async fn drain(mut rx: UnboundedReceiver<Event>) -> (Vec<u32>, Finish) {
    let mut toks = Vec::new();
    loop {
        match rx.recv().await {
            Some(Event::Token(t)) => toks.push(t),
            Some(Event::Done(f)) => return (toks, f),
            None => panic!("stream ended without Done"),
        }
    }
}

fn prompt(seed: u32, len: usize) -> Vec<u32> {
    (0..len as u32).map(|i| 5 + (seed.wrapping_mul(2654435761).wrapping_add(i * 97)) % (VOCAB - 5)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn many_concurrent_requests_get_the_expected_tokens() {
    let eng = FakeEngine::new(8, 256, VOCAB, 24).with_delay(Duration::from_micros(300));
    let eos = vec![1u32, 4];
    let (h, task) =
        spawn(eng, BatcherConfig { max_queue: 100, prefill_chunk: 24, eos: eos.clone(), paths_kept: 0 });
    let mut jobs = Vec::new();
    for i in 0..40u32 {
        let len = 1 + (i as usize * 7) % 60; // prompts longer than a prefill chunk span rounds
        let n = 1 + (i * 5) % 40;
        let s = if i % 2 == 0 {
            Sampling::GREEDY
        } else {
            Sampling { temperature: 0.7, top_p: 0.9, top_k: 20, seed: u64::from(i) * 31 }
        };
        let p = prompt(i, len);
        let want = FakeEngine::expected(VOCAB, &p, s, n as usize, &eos);
        let rx = h.submit(req(&format!("r{i}"), p, n, s)).unwrap();
        jobs.push(tokio::spawn(async move { (drain(rx).await, want, n) }));
    }
    for j in jobs {
        let ((got, fin), want, n) = j.await.unwrap();
        assert_eq!(got, want);
        let ended_eos = want.last().is_some_and(|t| eos.contains(t));
        assert_eq!(fin, if ended_eos { Finish::Eos } else { Finish::Length }, "n = {n}");
    }
    h.shutdown(Duration::ZERO);
    task.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admission_is_fifo() {
    // Two slots, ten requests: first tokens must come in submission order.
    let eng = FakeEngine::new(2, 256, VOCAB, 64).with_delay(Duration::from_millis(1));
    let (h, task) =
        spawn(eng, BatcherConfig { max_queue: 100, prefill_chunk: 64, eos: vec![], paths_kept: 0 });
    let mut rxs = Vec::new();
    for i in 0..10u32 {
        rxs.push(h.submit(req(&format!("f{i}"), prompt(i, 4), 6, Sampling::GREEDY)).unwrap());
    }
    let order = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut jobs = Vec::new();
    for (i, mut rx) in rxs.into_iter().enumerate() {
        let order = order.clone();
        jobs.push(tokio::spawn(async move {
            let mut first = true;
            while let Some(ev) = rx.recv().await {
                if first && matches!(ev, Event::Token(_)) {
                    order.lock().unwrap().push((Instant::now(), i));
                    first = false;
                }
            }
        }));
    }
    for j in jobs {
        j.await.unwrap();
    }
    let mut o = order.lock().unwrap().clone();
    o.sort();
    let idx: Vec<usize> = o.iter().map(|x| x.1).collect();
    // Pairs share a round (two slots); across pairs the order is strict.
    for w in idx.chunks(2).collect::<Vec<_>>().windows(2) {
        assert!(w[0].iter().max() < w[1].iter().min(), "{idx:?}");
    }
    h.shutdown(Duration::ZERO);
    task.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_stream_frees_its_slot_within_one_step() {
    let eng = FakeEngine::new(1, 1024, VOCAB, 64).with_delay(Duration::from_millis(5));
    let steps = eng.step_counter();
    let (h, task) =
        spawn(eng, BatcherConfig { max_queue: 10, prefill_chunk: 64, eos: vec![], paths_kept: 0 });
    let mut a = h.submit(req("a", prompt(1, 3), 900, Sampling::GREEDY)).unwrap();
    for _ in 0..3 {
        assert!(matches!(a.recv().await, Some(Event::Token(_))));
    }
    let b = h.submit(req("b", prompt(2, 3), 2, Sampling::GREEDY)).unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await;
    let at_drop = steps.load(Ordering::SeqCst);
    drop(a);
    let (toks, fin) = drain(b).await;
    let after = steps.load(Ordering::SeqCst);
    assert_eq!((toks.len(), fin), (2, Finish::Length));
    // The step in flight at the drop, then B's prefill and one decode: at most 3 more calls.
    assert!(after - at_drop <= 3, "{} engine calls after the drop", after - at_drop);
    h.shutdown(Duration::ZERO);
    task.await.unwrap();
}

async fn wait_first(rx: &mut UnboundedReceiver<Event>) {
    assert!(matches!(rx.recv().await, Some(Event::Token(_))));
}

#[tokio::test]
async fn a_full_queue_refuses() {
    let eng = FakeEngine::new(1, 512, VOCAB, 64).with_delay(Duration::from_millis(2));
    let (h, task) = spawn(eng, BatcherConfig { max_queue: 2, prefill_chunk: 64, eos: vec![], paths_kept: 0 });
    let mut a = h.submit(req("a", prompt(1, 3), 200, Sampling::GREEDY)).unwrap();
    wait_first(&mut a).await; // a holds the only slot
    let b = h.submit(req("b", prompt(2, 3), 2, Sampling::GREEDY)).unwrap();
    let c = h.submit(req("c", prompt(3, 3), 2, Sampling::GREEDY)).unwrap();
    assert_eq!(h.queue_depth(), 2);
    assert_eq!(h.submit(req("d", prompt(4, 3), 2, Sampling::GREEDY)).unwrap_err(), SubmitError::QueueFull(2));
    drop(a);
    assert_eq!(drain(b).await.0.len(), 2);
    assert_eq!(drain(c).await.0.len(), 2);
    assert!(h.submit(req("e", prompt(5, 3), 2, Sampling::GREEDY)).is_ok());
    // Invalid requests are refused before the queue.
    let bad = |p: Vec<u32>, n| h.submit(req("x", p, n, Sampling::GREEDY)).unwrap_err();
    assert!(matches!(bad(vec![], 1), SubmitError::Invalid(_)));
    assert!(matches!(bad(vec![VOCAB], 1), SubmitError::Invalid(_)));
    assert!(matches!(bad(vec![5], 0), SubmitError::Invalid(_)));
    assert!(matches!(bad(vec![5; 500], 13), SubmitError::Invalid(_)));
    // Sampling settings no sampler accepts are refused per request (the model checks a step's
    // settings as a whole: one such request would fail every sequence batched with it).
    let sampled = |temperature: f32, top_p: f32| {
        h.submit(req("y", vec![5], 1, Sampling { temperature, top_p, top_k: 0, seed: 1 })).unwrap_err()
    };
    for (t, p) in
        [(f32::NAN, 1.0), (-1.0, 1.0), (f32::INFINITY, 1.0), (1.0, 0.0), (1.0, f32::NAN), (1.0, 1.5)]
    {
        assert!(matches!(sampled(t, p), SubmitError::Invalid(ref m) if m.starts_with("sampling")), "{t} {p}");
    }
    h.shutdown(Duration::from_secs(5));
    task.await.unwrap();
}

#[tokio::test]
async fn shutdown_drains_then_aborts() {
    let eng = FakeEngine::new(2, 1024, VOCAB, 64).with_delay(Duration::from_millis(1));
    let (h, task) =
        spawn(eng, BatcherConfig { max_queue: 10, prefill_chunk: 64, eos: vec![], paths_kept: 0 });
    let short = h.submit(req("s", prompt(1, 3), 20, Sampling::GREEDY)).unwrap();
    let mut long = h.submit(req("l", prompt(2, 3), 1000, Sampling::GREEDY)).unwrap();
    wait_first(&mut long).await;
    h.shutdown(Duration::from_millis(150));
    assert!(h.is_draining());
    assert_eq!(h.submit(req("n", prompt(3, 3), 2, Sampling::GREEDY)).unwrap_err(), SubmitError::ShuttingDown);
    // The short stream finishes within the grace period; the long one is aborted after it.
    assert_eq!(
        drain(short).await,
        (FakeEngine::expected(VOCAB, &prompt(1, 3), Sampling::GREEDY, 20, &[]), Finish::Length)
    );
    let (toks, fin) = drain(long).await;
    assert!(matches!(fin, Finish::Aborted(_)), "{fin:?}");
    assert!(toks.len() < 999);
    tokio::time::timeout(Duration::from_secs(5), task).await.unwrap().unwrap();
}

async fn replays_match(h: &BatcherHandle, ids: &[String]) {
    for id in ids {
        let o = h.replay(id).await.unwrap().unwrap_or_else(|| panic!("no path for {id}"));
        assert!(!o.served.is_empty());
        assert_eq!(o.served, o.replayed, "{id}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn same_path_replay_on_a_bucket_sensitive_engine() {
    // Tokens depend on the bucket: a replay in other buckets (or other pieces) would differ.
    let eng =
        FakeEngine::new(8, 256, VOCAB, 16).with_delay(Duration::from_micros(200)).bucket_sensitive(true);
    let (h, task) =
        spawn(eng, BatcherConfig { max_queue: 100, prefill_chunk: 16, eos: vec![], paths_kept: 100 });
    let mut jobs = Vec::new();
    let mut ids = Vec::new();
    for i in 0..20u32 {
        let s = if i % 3 == 0 {
            Sampling { temperature: 1.0, top_p: 1.0, top_k: 0, seed: 77 + u64::from(i) }
        } else {
            Sampling::GREEDY
        };
        let id = format!("p{i}");
        ids.push(id.clone());
        let rx = h.submit(req(&id, prompt(i, 1 + (i as usize * 11) % 40), 3 + i % 17, s)).unwrap();
        jobs.push(tokio::spawn(drain(rx)));
    }
    let mut served = Vec::new();
    for j in jobs {
        served.push(j.await.unwrap().0);
    }
    replays_match(&h, &ids).await;
    for (id, toks) in ids.iter().zip(&served) {
        assert_eq!(&h.replay(id).await.unwrap().unwrap().served, toks);
    }
    assert!(h.replay("unknown").await.unwrap().is_none());
    h.shutdown(Duration::ZERO);
    task.await.unwrap();

    // The check can fail: the same path with one bucket changed gives other tokens.
    let mut e = FakeEngine::new(8, 256, VOCAB, 16).bucket_sensitive(true);
    let (h2, t2) = spawn(
        FakeEngine::new(8, 256, VOCAB, 16).bucket_sensitive(true),
        BatcherConfig { paths_kept: 10, ..Default::default() },
    );
    let _ = drain(h2.submit(req("q", prompt(9, 5), 6, Sampling::GREEDY)).unwrap()).await;
    let _ = (h2.replay("q").await.unwrap().unwrap(), ());
    let mut path = server::engine::ReplayPath {
        prefill: vec![server::engine::PrefillRecord {
            start: 0,
            tokens: prompt(9, 5),
            want_next: true,
            bucket: 1,
        }],
        decode: (5..10).map(|p| server::engine::DecodeRecord { position: p, bucket: 1 }).collect(),
        sampling: Some(Sampling::GREEDY),
    };
    let a = e.replay(0, &path).await.unwrap();
    path.decode[2].bucket = 2;
    let b = e.replay(0, &path).await.unwrap();
    assert_eq!(a[..3], b[..3]);
    assert_ne!(a[3..], b[3..]);
    h2.shutdown(Duration::ZERO);
    t2.await.unwrap();
}

/// `FakeEngine::with_precise_delay` keeps an engine call to its delay: of 21 decode calls of
/// 300 µs, none is shorter and the median is under 800 µs. `with_delay` (a tokio sleep, whose
/// deadline the timer rounds up to its next millisecond) makes each back-to-back call a millisecond
/// or more, which is what `llama-batch-bench --fake --fake-step-us` would otherwise time instead
/// of the batcher. (The median, not the sum: a busy machine may delay a few calls.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn precise_delay_is_kept() {
    let delay = Duration::from_micros(300);
    let mut e = FakeEngine::new(4, 64, 2048, 64).with_precise_delay(delay);
    let row = server::engine::DecodeRow { slot: 0, position: 0, token: 5, sampling: Sampling::GREEDY };
    let mut took = Vec::new();
    for p in 0..21u32 {
        let t = Instant::now();
        e.decode(&[server::engine::DecodeRow { position: p, ..row }]).await.expect("decode");
        took.push(t.elapsed());
    }
    took.sort();
    assert!(took[0] >= delay, "a 300 µs call took {:?}", took[0]);
    assert!(
        took[10] < Duration::from_micros(800),
        "median of 300 µs calls: {:?} (rounded to the timer?)",
        took[10]
    );
}

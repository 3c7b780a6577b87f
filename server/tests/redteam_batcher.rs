//! Red team, the batcher's state machine: more sequences than decode rows (rotation without
//! starvation), prompts spanning several prefill rounds, EOS as the first token, a request
//! cancelled with its prefill half done, the context's end.

use server::batcher::{spawn, BatcherConfig, Event, Finish, GenRequest};
use server::engine::{
    DecodeRow, Engine, EngineError, EngineLimits, PrefillPiece, PrefillResult, ReplayPath, Sampling,
    StepResult,
};
use server::fake::FakeEngine;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::mpsc::UnboundedReceiver;

const VOCAB: u32 = 2048;

/// A FakeEngine with fewer decode rows than slots, logging each call.
struct Narrow {
    inner: FakeEngine,
    rows: u32,
    log: Arc<Mutex<Vec<Call>>>,
}

#[derive(Debug, Clone)]
enum Call {
    Decode(Vec<u32>),
    Prefill(Vec<(u32, u32, usize)>),
}

impl Engine for Narrow {
    fn limits(&self) -> EngineLimits {
        EngineLimits { max_decode_rows: self.rows, ..self.inner.limits() }
    }
    async fn decode(&mut self, rows: &[DecodeRow]) -> Result<StepResult, EngineError> {
        assert!(rows.len() <= self.rows as usize, "{} rows", rows.len());
        self.log.lock().unwrap().push(Call::Decode(rows.iter().map(|r| r.slot).collect()));
        self.inner.decode(rows).await
    }
    async fn prefill(&mut self, pieces: &[PrefillPiece]) -> Result<PrefillResult, EngineError> {
        self.log
            .lock()
            .unwrap()
            .push(Call::Prefill(pieces.iter().map(|p| (p.slot, p.start, p.tokens.len())).collect()));
        self.inner.prefill(pieces).await
    }
    fn release(&mut self, slot: u32) {
        self.inner.release(slot)
    }
    async fn replay(&mut self, slot: u32, path: &ReplayPath) -> Result<Vec<u32>, EngineError> {
        self.inner.replay(slot, path).await
    }
}

fn req(id: &str, prompt: Vec<u32>, max_tokens: u32) -> GenRequest {
    GenRequest { id: id.into(), prompt, max_tokens, sampling: Sampling::GREEDY }
}

fn prompt(seed: u32, len: usize) -> Vec<u32> {
    (0..len as u32).map(|i| 5 + (seed.wrapping_mul(2654435761).wrapping_add(i * 97)) % (VOCAB - 5)).collect()
}

async fn drain(mut rx: UnboundedReceiver<Event>) -> (Vec<u32>, Finish) {
    let mut toks = Vec::new();
    loop {
        match rx.recv().await {
            Some(Event::Token(t)) => toks.push(t),
            Some(Event::Done(f)) => return (toks, f),
            None => panic!("ended without Done"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rotation_serves_every_sequence_without_starvation() {
    let log = Arc::new(Mutex::new(Vec::new()));
    // A 5 ms step: the seven submissions (microseconds apart) all arrive long before the first
    // request's 40 steps end, however the threads are scheduled, so all seven decode together.
    let inner = FakeEngine::new(7, 512, VOCAB, 64).with_delay(Duration::from_millis(5));
    let eng = Narrow { inner, rows: 3, log: log.clone() };
    let (h, task) =
        spawn(eng, BatcherConfig { max_queue: 64, prefill_chunk: 64, eos: vec![], paths_kept: 64 });
    let mut jobs = Vec::new();
    for i in 0..7u32 {
        let p = prompt(i, 3 + i as usize);
        let n = 40 + 7 * i;
        let want = FakeEngine::expected(VOCAB, &p, Sampling::GREEDY, n as usize, &[]);
        let rx = h.submit(req(&format!("r{i}"), p, n)).unwrap();
        jobs.push(tokio::spawn(async move { (drain(rx).await, want) }));
    }
    for j in jobs {
        let ((got, fin), want) = j.await.unwrap();
        assert_eq!((got, fin), (want, Finish::Length));
    }
    for i in 0..7 {
        let o = h.replay(&format!("r{i}")).await.unwrap().unwrap();
        assert_eq!(o.served, o.replayed);
    }
    // While all seven decode, every slot waits at most ceil(7 / 3) steps between its turns.
    let decodes: Vec<Vec<u32>> = log
        .lock()
        .unwrap()
        .iter()
        .filter_map(|c| if let Call::Decode(s) = c { Some(s.clone()) } else { None })
        .collect();
    // The window where all seven are decoding: from the step by which each has run once to the
    // last turn of the first to finish.
    let mut seen = std::collections::HashSet::new();
    let start = decodes
        .iter()
        .position(|d| {
            seen.extend(d.iter().copied());
            seen.len() == 7
        })
        .unwrap()
        + 1;
    let end = (0..7u32).map(|s| decodes.iter().rposition(|d| d.contains(&s)).unwrap()).min().unwrap();
    assert!(end - start > 30, "{start}..{end}");
    for slot in 0..7u32 {
        let turns: Vec<usize> = (start..end).filter(|&i| decodes[i].contains(&slot)).collect();
        let mut gaps: Vec<usize> = turns.windows(2).map(|w| w[1] - w[0]).collect();
        gaps.push(turns[0] + 1 - start);
        assert!(gaps.iter().all(|&g| g <= 3), "slot {slot}: turns {turns:?} in {start}..{end}");
    }
    h.shutdown(Duration::ZERO);
    task.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_prompts_span_rounds_and_a_half_prefilled_cancel_frees_the_slot() {
    let log = Arc::new(Mutex::new(Vec::new()));
    let eng = Narrow {
        inner: FakeEngine::new(2, 512, VOCAB, 16).with_delay(Duration::from_millis(2)),
        rows: 2,
        log: log.clone(),
    };
    let (h, task) = spawn(eng, BatcherConfig { max_queue: 8, prefill_chunk: 16, eos: vec![], paths_kept: 8 });
    // 100 prompt tokens at 16 a round: 7 rounds; cancel after the second.
    let long = h.submit(req("long", prompt(1, 100), 5)).unwrap();
    let waiting = h.submit(req("w", prompt(2, 40), 5)).unwrap();
    let next = h.submit(req("next", prompt(3, 5), 3)).unwrap();
    loop {
        let n = log.lock().unwrap().iter().filter(|c| matches!(c, Call::Prefill(_))).count();
        if n >= 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    drop(long);
    let (w, fin) = drain(waiting).await;
    assert_eq!(
        (w, fin),
        (FakeEngine::expected(VOCAB, &prompt(2, 40), Sampling::GREEDY, 5, &[]), Finish::Length)
    );
    let (t, _) = drain(next).await;
    assert_eq!(t, FakeEngine::expected(VOCAB, &prompt(3, 5), Sampling::GREEDY, 3, &[]));
    // The cancelled prompt was never fed to its end, and no piece exceeded the chunk.
    let calls = log.lock().unwrap().clone();
    let pieces: Vec<(u32, u32, usize)> = calls
        .iter()
        .filter_map(|c| if let Call::Prefill(p) = c { Some(p.clone()) } else { None })
        .flatten()
        .collect();
    assert!(pieces.iter().all(|p| p.2 <= 16));
    assert!(!pieces.iter().any(|&(_, start, len)| start as usize + len == 100), "{pieces:?}");
    h.shutdown(Duration::ZERO);
    task.await.unwrap();
}

#[tokio::test]
async fn eos_as_the_first_token_and_the_context_end() {
    let p = prompt(4, 6);
    let first = FakeEngine::expected(VOCAB, &p, Sampling::GREEDY, 1, &[])[0];
    let (h, task) = spawn(
        FakeEngine::new(2, 32, VOCAB, 8),
        BatcherConfig { max_queue: 8, prefill_chunk: 8, eos: vec![first], paths_kept: 8 },
    );
    let (t, fin) = drain(h.submit(req("e", p.clone(), 10)).unwrap()).await;
    assert_eq!((t, fin), (vec![first], Finish::Eos));
    let o = h.replay("e").await.unwrap().unwrap();
    assert_eq!(o.served, o.replayed);
    // A prompt of max_seq - 1 tokens gets exactly one token; one of max_seq is refused.
    let q = prompt(5, 31);
    let (t, fin) = drain(h.submit(req("c", q.clone(), 1)).unwrap()).await;
    assert_eq!(t.len(), 1);
    assert!(fin == Finish::Length || fin == Finish::Eos);
    assert!(h.submit(req("x", prompt(5, 32), 1)).is_err());
    assert!(h.submit(req("x", q, 2)).is_err());
    h.shutdown(Duration::ZERO);
    task.await.unwrap();
}

#[tokio::test]
async fn a_burst_on_an_idle_server_fills_the_free_slots_before_the_queue_bound() {
    let (h, task) = spawn(
        FakeEngine::new(8, 64, VOCAB, 16).with_delay(Duration::from_millis(1)),
        BatcherConfig { max_queue: 2, prefill_chunk: 16, eos: vec![], paths_kept: 0 },
    );
    // Ten at once (no await between): eight take the free slots, two wait, the eleventh is refused.
    let rxs: Vec<_> = (0..10u32).map(|i| h.submit(req(&format!("b{i}"), prompt(i, 3), 4)).unwrap()).collect();
    assert_eq!(
        h.submit(req("over", prompt(99, 3), 4)).unwrap_err(),
        server::batcher::SubmitError::QueueFull(2)
    );
    for rx in rxs {
        assert_eq!(drain(rx).await.0.len(), 4);
    }
    // With max_queue 0 a request is still served while a slot is free.
    let (h0, t0) =
        spawn(FakeEngine::new(2, 64, VOCAB, 16), BatcherConfig { max_queue: 0, ..Default::default() });
    assert_eq!(drain(h0.submit(req("z", prompt(1, 3), 2)).unwrap()).await.0.len(), 2);
    h0.shutdown(Duration::ZERO);
    t0.await.unwrap();
    h.shutdown(Duration::ZERO);
    task.await.unwrap();
}

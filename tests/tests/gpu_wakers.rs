//! GPU suite for user wakers on the completion engine: a waker is user code, and one that blocks
//! in `wake()` — sleeping, or waiting for another op of the same engine shard — must not stop the
//! engine from completing other awaited ops. Every test forces one engine thread per device, so
//! that every op shares the stalled waker's shard.

use cuda_async::scheduling::{set_await_spin_policy, set_completion_policy, AwaitSpin, CompletionPolicy};
use cuda_async::DeviceOpExt;
use cuda_async_tests::ops::SpinWrite;
use cuda_async_tests::{ensure, Suite, TestResult};
use cuda_core::{Device, DeviceBuffer, Stream};
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::task::{Context, Wake, Waker};
use std::time::{Duration, Instant};

fn dev() -> Result<Device, cuda_core::Error> {
    Device::new(0)
}

/// One engine thread, and no first-poll spin (every await is handed to the engine).
struct OneShard;

impl OneShard {
    fn set() -> OneShard {
        set_completion_policy(CompletionPolicy { engines: 1, ..CompletionPolicy::default() });
        set_await_spin_policy(AwaitSpin::NEVER);
        OneShard
    }
}

impl Drop for OneShard {
    fn drop(&mut self) {
        set_completion_policy(CompletionPolicy::default());
        set_await_spin_policy(AwaitSpin::default());
    }
}

/// A waker that sleeps in `wake()`.
struct Sleeper(Duration);

impl Wake for Sleeper {
    fn wake(self: Arc<Self>) {
        std::thread::sleep(self.0);
    }
}

/// Awaits a 30 ms kernel on `s` from a current-thread runtime; how long the await took.
fn await_on(s: &Stream, ns: u64) -> Result<Duration, cuda_async_tests::Failed> {
    let mut buf = DeviceBuffer::<f32>::zeros(s, 1024)?;
    s.synchronize()?;
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let t0 = Instant::now();
    rt.block_on(SpinWrite { buf: &mut buf, ns, v: 2.0 }.into_op().on(s))?;
    let took = t0.elapsed();
    ensure(buf.to_vec()?.iter().all(|&v| v == 2.0), "the awaited kernel's result")?;
    Ok(took)
}

/// A waker that sleeps 3 s on the engine thread holds up an unrelated await (a 30 ms kernel on
/// another stream, same shard) by at most a few milliseconds, not 3 s; the stalled op itself is
/// already complete (a poll sees `Ready` while its waker still sleeps).
fn sleeping_waker_does_not_hold_up_other_awaits() -> TestResult {
    let d = dev()?;
    let _policy = OneShard::set();
    let (a, b) = (Stream::new(&d)?, Stream::new(&d)?);
    let mut buf = DeviceBuffer::<f32>::zeros(&a, 1024)?;
    a.synchronize()?;
    let before = cuda_async::waker_takeovers();
    let waker = Waker::from(Arc::new(Sleeper(Duration::from_secs(3))));
    let mut stalled = SpinWrite { buf: &mut buf, ns: 5_000_000, v: 1.0 }.into_op().on(&a);
    let mut cx = Context::from_waker(&waker);
    ensure(std::pin::Pin::new(&mut stalled).poll(&mut cx).is_pending(), "a 5 ms kernel is pending at first")?;
    // Its waker runs (and sleeps 3 s) about 5 ms from now, on the engine thread.
    let took = await_on(&b, 30_000_000)?;
    ensure(
        took < Duration::from_millis(600),
        format!("an unrelated 30 ms await took {took:?} behind a sleeping waker"),
    )?;
    ensure(cuda_async::waker_takeovers() > before, "the engine's watchdog did not take the shard over")?;
    let noop = Waker::noop();
    ensure(
        std::pin::Pin::new(&mut stalled).poll(&mut Context::from_waker(noop)).is_ready(),
        "the stalled op is complete while its waker sleeps",
    )?;
    drop(stalled);
    ensure(buf.to_vec()?.iter().all(|&v| v == 1.0), "the stalled op's result")
}

/// A waker that waits for another task's await of an op on the same shard: before the engine
/// could take a stuck shard over, this deadlocked (the other op was never completed, because the
/// only thread that could complete it was blocked in this waker). Now both finish promptly.
struct WaitsForOther {
    rx: Mutex<Option<mpsc::Receiver<()>>>,
    got: mpsc::Sender<Option<Duration>>,
}

impl Wake for WaitsForOther {
    fn wake(self: Arc<Self>) {
        let Some(rx) = self.rx.lock().unwrap_or_else(|p| p.into_inner()).take() else { return };
        let t0 = Instant::now();
        // Bounded, so that the old deadlock shows as a slow test, not a hung suite.
        let ok = rx.recv_timeout(Duration::from_secs(10)).is_ok();
        let _ = self.got.send(ok.then(|| t0.elapsed()));
    }
}

fn waker_waiting_for_another_op_of_its_shard() -> TestResult {
    let d = dev()?;
    let _policy = OneShard::set();
    let (a, b) = (Stream::new(&d)?, Stream::new(&d)?);
    let mut buf = DeviceBuffer::<f32>::zeros(&a, 1024)?;
    a.synchronize()?;
    let (tx, rx) = mpsc::channel();
    let (got_tx, got_rx) = mpsc::channel();
    let waker = Waker::from(Arc::new(WaitsForOther { rx: Mutex::new(Some(rx)), got: got_tx }));
    let mut first = SpinWrite { buf: &mut buf, ns: 5_000_000, v: 1.0 }.into_op().on(&a);
    ensure(
        std::pin::Pin::new(&mut first).poll(&mut Context::from_waker(&waker)).is_pending(),
        "a 5 ms kernel is pending at first",
    )?;
    // Another thread awaits a 30 ms op (same shard), then releases the first op's waker.
    let t0 = Instant::now();
    let other = std::thread::spawn(move || -> Result<Duration, String> {
        let took = await_on(&b, 30_000_000).map_err(|e| format!("{e:?}"))?;
        let _ = tx.send(());
        Ok(took)
    });
    let waited = got_rx.recv_timeout(Duration::from_secs(30)).map_err(|_| "the waker never returned")?;
    let took = other.join().map_err(|_| "the awaiting thread panicked")??;
    let waited = waited.ok_or("the waker waited 10 s for the other op: the shard deadlocked")?;
    ensure(took < Duration::from_millis(600), format!("the other await took {took:?}"))?;
    ensure(t0.elapsed() < Duration::from_secs(2), format!("both done after {:?}", t0.elapsed()))?;
    eprintln!("the waker waited {waited:?}; the other await took {took:?}");
    drop(first);
    ensure(buf.to_vec()?.iter().all(|&v| v == 1.0), "the first op's result")
}

/// A waker that counts its wake.
struct Count(Arc<AtomicUsize>);

impl Wake for Count {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

/// 32 ops complete in the same sweeps as one whose waker sleeps 2 s (all on one stream, queued
/// behind it): every one of their wakers runs within a few milliseconds, not after the sleep.
fn wakers_queued_behind_a_stuck_one_still_run() -> TestResult {
    let d = dev()?;
    let _policy = OneShard::set();
    let s = Stream::new(&d)?;
    let mut bufs: Vec<DeviceBuffer<f32>> =
        (0..33).map(|_| DeviceBuffer::zeros(&s, 256)).collect::<Result<_, _>>()?;
    s.synchronize()?;
    let woken = Arc::new(AtomicUsize::new(0));
    let sleeper = Waker::from(Arc::new(Sleeper(Duration::from_secs(2))));
    let counter = Waker::from(Arc::new(Count(woken.clone())));
    let mut futs = Vec::new();
    for (i, buf) in bufs.iter_mut().enumerate() {
        // The first one spins 10 ms; the rest are short and finish right behind it.
        let ns = if i == 0 { 10_000_000 } else { 10_000 };
        let mut f = Box::pin(SpinWrite { buf, ns, v: i as f32 }.into_op().on(&s));
        let w = if i == 0 { &sleeper } else { &counter };
        ensure(f.as_mut().poll(&mut Context::from_waker(w)).is_pending(), "pending at first")?;
        futs.push(f);
    }
    let t0 = Instant::now();
    while woken.load(Ordering::SeqCst) < 32 {
        ensure(
            t0.elapsed() < Duration::from_millis(800),
            format!("{} of 32 wakers ran within 800 ms behind a sleeping one", woken.load(Ordering::SeqCst)),
        )?;
        std::thread::sleep(Duration::from_micros(200));
    }
    drop(futs);
    for (i, b) in bufs.iter().enumerate() {
        ensure(b.to_vec()?.iter().all(|&v| v == i as f32), format!("op {i}'s result"))?;
    }
    Ok(())
}

/// A waker that panics does not stop the engine: later awaits on its shard complete.
struct Panics;

impl Wake for Panics {
    fn wake(self: Arc<Self>) {
        panic!("a waker that panics (on purpose)");
    }
}

fn panicking_waker_does_not_stop_the_engine() -> TestResult {
    let d = dev()?;
    let _policy = OneShard::set();
    let (a, b) = (Stream::new(&d)?, Stream::new(&d)?);
    let mut buf = DeviceBuffer::<f32>::zeros(&a, 1024)?;
    a.synchronize()?;
    let waker = Waker::from(Arc::new(Panics));
    let mut f = SpinWrite { buf: &mut buf, ns: 2_000_000, v: 1.0 }.into_op().on(&a);
    ensure(
        std::pin::Pin::new(&mut f).poll(&mut Context::from_waker(&waker)).is_pending(),
        "pending at first",
    )?;
    std::thread::sleep(Duration::from_millis(20));
    for _ in 0..3 {
        let took = await_on(&b, 5_000_000)?;
        ensure(took < Duration::from_millis(500), format!("an await after a panicking waker took {took:?}"))?;
    }
    Ok(())
}

/// A waker whose `Drop` panics when an engine thread drops it (and counts that drop).
struct DropPanics(Arc<AtomicUsize>);

impl Wake for DropPanics {
    fn wake(self: Arc<Self>) {}
}

impl Drop for DropPanics {
    fn drop(&mut self) {
        if std::thread::current().name() == Some("cuda-async-completion") {
            self.0.fetch_add(1, Ordering::SeqCst);
            panic!("a waker whose drop panics on the engine thread (on purpose)");
        }
    }
}

/// An early-wake alarm that never fired holds the last handle of a waker whose `Drop` panics: the
/// engine drops the completed op's record outside its sweep, with the panic caught, and later
/// awaits of the shard complete. Found by review: the sweep dropped the record in place, the panic
/// ended the shard's only thread outside the watchdog's view, and every later await hung.
fn a_waker_whose_drop_panics_does_not_stop_the_engine() -> TestResult {
    let d = dev()?;
    let _policy = OneShard::set();
    // The default await policy: its early wake is what keeps a clone of the task's waker.
    set_await_spin_policy(AwaitSpin::default());
    let (a, b) = (Stream::new(&d)?, Stream::new(&d)?);
    let mut buf = DeviceBuffer::<f32>::zeros(&a, 1024)?;
    a.synchronize()?;
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    // A lone 5 ms await: the engine predicts about 5 ms for the next one.
    rt.block_on(SpinWrite { buf: &mut buf, ns: 5_000_000, v: 1.0 }.into_op().on(&a))?;
    let drops = Arc::new(AtomicUsize::new(0));
    let bomb = Waker::from(Arc::new(DropPanics(drops.clone())));
    // A 1 ms op: its alarm (due about 100 us before 5 ms) takes a clone of the bomb.
    let mut f = SpinWrite { buf: &mut buf, ns: 1_000_000, v: 2.0 }.into_op().on(&a);
    ensure(
        std::pin::Pin::new(&mut f).poll(&mut Context::from_waker(&bomb)).is_pending(),
        "pending at first",
    )?;
    // Polled again with another waker, then dropped with the bomb: the alarm holds the last handle.
    let _ = std::pin::Pin::new(&mut f).poll(&mut Context::from_waker(Waker::noop()));
    drop(bomb);
    drop(f);
    let t0 = Instant::now();
    while drops.load(Ordering::SeqCst) == 0 && t0.elapsed() < Duration::from_secs(2) {
        std::thread::sleep(Duration::from_millis(1));
    }
    ensure(
        drops.load(Ordering::SeqCst) == 1,
        "the alarm's waker was dropped on the engine thread (else this test missed the path)",
    )?;
    // Later awaits of the shard complete (each on a thread waited for at most 5 s: a dead engine
    // thread would leave them pending for ever).
    for _ in 0..3 {
        let (tx, rx) = mpsc::channel();
        let b = b.clone();
        std::thread::spawn(move || {
            let _ = tx.send(await_on(&b, 5_000_000).map_err(|e| format!("{e:?}")));
        });
        let took = rx
            .recv_timeout(Duration::from_secs(5))
            .map_err(|_| "an await after the panicking drop never completed: the engine thread died")??;
        ensure(took < Duration::from_millis(500), format!("an await after a panicking drop took {took:?}"))?;
    }
    ensure(buf.to_vec()?.iter().all(|&v| v == 2.0), "the dropped future's op still ran")
}

fn main() {
    let mut s = Suite::new();
    s.gpu_alone("sleeping_waker_does_not_hold_up_other_awaits", sleeping_waker_does_not_hold_up_other_awaits)
        .gpu_alone("waker_waiting_for_another_op_of_its_shard", waker_waiting_for_another_op_of_its_shard)
        .gpu_alone("wakers_queued_behind_a_stuck_one_still_run", wakers_queued_behind_a_stuck_one_still_run)
        .gpu_alone("panicking_waker_does_not_stop_the_engine", panicking_waker_does_not_stop_the_engine)
        .gpu_alone(
            "a_waker_whose_drop_panics_does_not_stop_the_engine",
            a_waker_whose_drop_panics_does_not_stop_the_engine,
        );
    s.run()
}

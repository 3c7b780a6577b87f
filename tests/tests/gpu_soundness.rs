//! Adversarial GPU suite: attacks on the "no undefined behaviour from safe code" promise, one test
//! per class (capture forks, host-node closure lifetimes, capture bookkeeping across threads, CUDA
//! from callback threads, pools / scopes / shared ops that could hang), each asserting the exact
//! outcome: a correct result checked against a host reference, or a named error. Every attack runs
//! under a time bound ([`bounded`]): a hang is a failure, never a pass.
//!
//! Run under `compute-sanitizer` memcheck and racecheck by `scripts/sanitize.sh` (nothing skipped).
//! `cross_device_misuse` needs two GPUs: on one it is reported ignored (`SKIPPED`), never passed.
//! Ignored without a GPU; fails without one when CUDA_ASYNC_REQUIRE_GPU=1.

use cuda_async::{
    memory, CudaGraph, DeviceError, DeviceOp, DeviceOpExt, ExecutionContext, GraphNode, GraphPool,
    RecapturePath,
};
use cuda_async_tests::ops::{test_kernels, AddScalar, SpinWrite};
use cuda_async_tests::{ensure, random_f32, rng, Failed, Suite, TestResult, POISON_F32};
use cuda_core::{
    CaptureMode, CaptureStatus, Device, DeviceBuffer, Error, Event, Function, LaunchConfig, Stream,
};
use rand::Rng;
use std::future::Future;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::{mpsc, Arc, Barrier, Mutex, OnceLock};
use std::time::Duration;

const MS: u64 = 1_000_000;

/// Runs `f` on its own thread and fails with "hang" if it has not finished within `secs`.
fn bounded(secs: u64, f: fn() -> TestResult) -> TestResult {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let r = std::panic::catch_unwind(f).unwrap_or_else(|_| Err("the attack panicked".into()));
        let _ = tx.send(r);
    });
    match rx.recv_timeout(Duration::from_secs(secs)) {
        Ok(r) => r,
        Err(_) => Err(format!("hang: not finished within {secs} s").into()),
    }
}

fn setup() -> Result<(Device, Stream), Failed> {
    let d = Device::new(0)?;
    test_kernels(&d)?;
    cuda_async::scheduling::default_policy()?;
    Ok((d, Stream::new(&d)?))
}

fn is_capture<T>(r: &Result<T, Error>) -> bool {
    matches!(r, Err(Error::Capture(_)))
}

fn is_async_capture<T>(r: &Result<T, DeviceError>) -> bool {
    matches!(r, Err(DeviceError::Core(Error::Capture(_))))
}

fn all_eq(v: &[f32], want: f32) -> bool {
    v.iter().all(|&x| x == want)
}

// ---------------------------------------------------------------------------------------------
// 1. Capture forks

/// (1a) With `cuda-core` alone: while `s` captures, waits that would pull another stream into the
/// capture, or the capture onto outside work, and host waits on an event recorded in the capture
/// are refused; the capture ends normally and replays right; a stale tag keeps refusing until the
/// event is recorded again outside a capture.
fn fork_refused_core() -> TestResult {
    let (d, s) = setup()?;
    let other = Stream::new(&d)?;
    let n = 4096;
    let mut y = DeviceBuffer::filled(&s, n, 1.0f32)?;
    let outside = Event::new(&d, false)?;
    outside.record(&other)?;
    s.begin_capture(CaptureMode::ThreadLocal)?;
    AddScalar { buf: &mut y, v: 2.0 }.execute_on_capture(&s)?;
    let ev = Event::new(&d, false)?;
    ev.record(&s)?;
    ensure(is_capture(&other.wait_event(&ev)), "other.wait_event(capture event) must be refused")?;
    ensure(is_capture(&other.wait_stream(&s)), "other.wait_stream(capturing) must be refused")?;
    ensure(is_capture(&s.wait_stream(&other)), "capturing.wait_stream(other) must be refused")?;
    ensure(is_capture(&s.wait_event(&outside)), "capturing.wait_event(outside event) must be refused")?;
    ensure(is_capture(&ev.query()) && is_capture(&ev.synchronize()), "host waits on a capture event")?;
    ensure(s.wait_event(&ev).is_ok(), "the capturing stream may wait on its own capture's event")?;
    let g = s.end_capture()?;
    ensure(
        s.capture_status()? == CaptureStatus::None && other.capture_status()? == CaptureStatus::None,
        "status",
    )?;
    ensure(is_capture(&other.wait_event(&ev)), "a stale capture tag is still refused")?;
    let exec = g.instantiate(Default::default())?;
    exec.launch(&other)?;
    other.synchronize()?;
    ensure(all_eq(&y.to_vec()?, 3.0), "the capture recorded exactly the add, replayed once")?;
    ev.record(&other)?;
    ensure(ev.query().is_ok() && s.wait_event(&ev).is_ok(), "re-recorded outside: usable again")?;
    ensure(all_eq(&y.to_vec()?, 3.0), "nothing ran twice")
}

/// Queues `AddScalar` on a stream this thread is capturing (a helper for the cuda-core tests).
trait OnCapture: DeviceOp + Sized {
    fn execute_on_capture(self, s: &Stream) -> Result<Self::Output, DeviceError> {
        // SAFETY: the output is a `&mut` buffer handle; it is only read after the replay below,
        // through access-tracked copies.
        unsafe { self.async_on(s) }
    }
}
impl<O: DeviceOp> OnCapture for O {}

/// (1b) Inside `CudaGraph::scope` and inside a `map` closure recorded by `graph_on`, a fork of the
/// capturing stream onto another stream is refused; the graphs hold only what was recorded on the
/// capturing stream and replay right.
fn fork_refused_in_scope_and_closure() -> TestResult {
    let (d, s) = setup()?;
    let other = Stream::new(&d)?;
    let n = 4096;
    let mut y = DeviceBuffer::filled(&s, n, 0.0f32)?;
    let mut z = DeviceBuffer::filled(&other, n, 5.0f32)?;
    let mut fork_err = None;
    let g = CudaGraph::scope(&s, |sc| {
        sc.record(AddScalar { buf: &mut y, v: 1.0 })?;
        fork_err = Some(other.wait_stream(&s));
        // Work queued on `other` now runs eagerly (it was never pulled into the capture).
        Ok(())
    })?;
    ensure(fork_err.as_ref().is_some_and(is_capture), format!("fork in a scope: {fork_err:?}"))?;
    AddScalar { buf: &mut z, v: 1.0 }.sync_on(&other)?;
    ensure(all_eq(&z.to_vec()?, 6.0), "the other stream runs eagerly")?;
    ensure(all_eq(&y.to_vec()?, 0.0), "nothing recorded ran at capture time")?;
    g.launch().sync_on(&other)?;
    ensure(all_eq(&y.to_vec()?, 1.0), "the recorded add replays")?;
    drop(g);
    let (other2, s2) = (other.clone(), s.clone());
    let seen: Arc<Mutex<Option<Result<(), Error>>>> = Arc::new(Mutex::new(None));
    let seen2 = seen.clone();
    let g = AddScalar { buf: &mut y, v: 1.0 }
        .into_op()
        .map(move |b| {
            *seen2.lock().unwrap_or_else(|e| e.into_inner()) = Some(other2.wait_stream(&s2));
            b
        })
        .graph_on(&s)?;
    let seen = seen.lock().unwrap_or_else(|e| e.into_inner()).take();
    ensure(seen.as_ref().is_some_and(is_capture), format!("fork in a recorded closure: {seen:?}"))?;
    let y_now = g.output().map(|b| b.to_vec()).transpose()?.unwrap_or_default();
    ensure(all_eq(&z.to_vec()?, 6.0) && all_eq(&y_now, 1.0), "nothing ran at capture time")?;
    g.launch().sync_on(&other)?;
    drop(g);
    ensure(all_eq(&y.to_vec()?, 2.0), "the recorded add replays")
}

// ---------------------------------------------------------------------------------------------
// 2. Host-node closures

/// A graph: a slow kernel writing `buf`, then a host node whose closure owns a vector and adds its
/// checksum to `sum` (and counts its runs in `runs`).
fn graph_with_host_node(
    s: &Stream,
    buf: &mut DeviceBuffer<f32>,
    data: Vec<u64>,
    sum: Arc<AtomicU64>,
    runs: Arc<AtomicUsize>,
) -> Result<CudaGraph<()>, Failed> {
    use cuda_async::GraphBodyExt;
    let mut g = cuda_core::Graph::new(s.device())?;
    {
        let mut b = g.builder();
        let (_, spin) = b.add_op(SpinWrite { buf, ns: 60 * MS, v: 1.0 }, &[])?;
        let closure = move || {
            sum.fetch_add(data.iter().sum::<u64>(), SeqCst);
            runs.fetch_add(1, SeqCst);
        };
        // SAFETY: the closure only reads its own vector and adds to atomics: no CUDA call (and its
        // captures hold no CUDA values), returns at once.
        unsafe { b.add_host(closure, &[spin])? };
    }
    Ok(CudaGraph::from_graph(s, g, Default::default())?)
}

/// (2) A graph with a host node dropped right after an asynchronous launch — `enqueue`, a
/// `launch()` future polled once then dropped, and `update_from` while a replay is queued — still
/// runs each queued closure exactly once with its data intact.
fn host_closure_outlives_queued_replays() -> TestResult {
    let (_d, s) = setup()?;
    let mut r = rng();
    for round in 0..3 {
        let data: Vec<u64> = (0..10_000).map(|_| r.random_range(0..1_000_000)).collect();
        let want: u64 = data.iter().sum();
        let (sum, runs) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicUsize::new(0)));
        let mut buf = DeviceBuffer::filled(&s, 1024, POISON_F32)?;
        let mut g = graph_with_host_node(&s, &mut buf, data.clone(), sum.clone(), runs.clone())?;
        match round {
            0 => g.enqueue(&s)?,
            1 => {
                let mut fut = std::pin::pin!(g.launch().on(&s));
                let waker = std::task::Waker::noop();
                let _ = fut.as_mut().poll(&mut std::task::Context::from_waker(waker));
            }
            _ => {
                g.enqueue(&s)?;
                // Same topology, new closure data: the queued replay must still call the old one.
                let other: Vec<u64> = data.iter().map(|v| v + 1).collect();
                let mut buf2 = DeviceBuffer::filled(&s, 1024, POISON_F32)?;
                let mut g2 = cuda_core::Graph::new(s.device())?;
                {
                    use cuda_async::GraphBodyExt;
                    let mut b = g2.builder();
                    let (_, spin) = b.add_op(SpinWrite { buf: &mut buf2, ns: 60 * MS, v: 1.0 }, &[])?;
                    let (sum2, runs2) = (sum.clone(), runs.clone());
                    let closure = move || {
                        sum2.fetch_add(other.iter().sum::<u64>(), SeqCst);
                        runs2.fetch_add(1, SeqCst);
                    };
                    // SAFETY: as in `graph_with_host_node`.
                    unsafe { b.add_host(closure, &[spin])? };
                }
                let verdict = g.update_from(g2)?;
                ensure(verdict == cuda_core::ExecUpdate::Updated, format!("update verdict {verdict:?}"))?;
            }
        }
        drop(g);
        // Reuse freed host memory hard while the replay is still queued.
        let junk: Vec<Vec<u64>> = (0..64).map(|i| vec![i; 10_000]).collect();
        s.synchronize()?;
        std::thread::sleep(Duration::from_millis(20));
        drop(junk);
        ensure(
            runs.load(SeqCst) == 1,
            format!("round {round}: the closure ran {} times", runs.load(SeqCst)),
        )?;
        ensure(sum.load(SeqCst) == want, format!("round {round}: the closure saw corrupted data"))?;
        ensure(all_eq(&buf.to_vec()?, 1.0), "the kernel before the host node ran")?;
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// 3. Capture bookkeeping across threads

/// (3a) `end_capture` from another thread is refused and the capture goes on; (3b) another
/// thread's launch and copy on the capturing stream, and its use of a buffer homed on it, are
/// refused (never "Ok but recorded into someone else's graph"); the owner ends the capture and it
/// replays exactly what the owner recorded.
fn other_threads_cannot_touch_a_capture() -> TestResult {
    let (d, s) = setup()?;
    let n = 4096;
    let mut y = DeviceBuffer::filled(&s, n, 0.0f32)?;
    let mut homed = DeviceBuffer::filled(&s, n, 3.0f32)?;
    s.begin_capture(CaptureMode::ThreadLocal)?;
    AddScalar { buf: &mut y, v: 1.0 }.execute_on_capture(&s)?;
    let outcome = std::thread::scope(|t| {
        t.spawn(|| -> Result<Vec<(&'static str, bool)>, Failed> {
            let mine = Stream::new(&d)?;
            let mut own = DeviceBuffer::filled(&mine, n, 0.0f32)?;
            Ok(vec![
                ("end_capture from another thread", is_capture(&s.end_capture().map(|_| ()))),
                (
                    "launch on the capturing stream",
                    is_async_capture(&AddScalar { buf: &mut own, v: 1.0 }.sync_on(&s)),
                ),
                ("memset of a buffer homed on it", is_capture(&homed.memset_zero(&mine))),
                ("copy from it on my stream", is_capture(&own.copy_from_device(&mine, &homed))),
                ("record an event on it", is_capture(&Event::new(&d, false)?.record(&s))),
                ("synchronize it", is_capture(&s.synchronize())),
            ])
        })
        .join()
        .unwrap_or_else(|_| Err("worker panicked".into()))
    })?;
    for (what, ok) in &outcome {
        if !ok {
            let _ = s.end_capture();
            return Err(format!("{what}: not refused").into());
        }
    }
    ensure(s.capture_status()? == CaptureStatus::Active, "the capture went on")?;
    let g = s.end_capture()?;
    ensure(g.node_count()? == 1, format!("only the owner's add was recorded: {} nodes", g.node_count()?))?;
    let exec = g.instantiate(Default::default())?;
    exec.launch(&s)?;
    ensure(all_eq(&y.to_vec()?, 1.0) && all_eq(&homed.to_vec()?, 3.0), "results")
}

/// (3c) Stress: one thread captures scopes on `s` in a loop while another keeps launching `+1` on
/// `s` into its own buffer homed on `s`. Each launch either returns `Ok` and runs, or is refused:
/// the buffer ends at exactly the number of `Ok` launches; every graph replays right.
fn capture_vs_launch_stress() -> TestResult {
    let (_d, s) = setup()?;
    let n = 1024;
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let s2 = s.clone();
    let stop2 = stop.clone();
    let mut mine = DeviceBuffer::filled(&s, n, 0.0f32)?;
    let launcher = std::thread::spawn(move || -> Result<(u64, u64), Failed> {
        let (mut ok, mut refused) = (0u64, 0u64);
        while !stop2.load(SeqCst) {
            // Enqueue only (no host wait): `Ok` must mean "queued and will run", `Err` "not queued".
            // SAFETY: the output (`&mut mine`) is only read after the loop, through `to_vec`, which
            // is ordered after every queued add.
            match unsafe { (AddScalar { buf: &mut mine, v: 1.0 }).async_on(&s2) } {
                Ok(_) => {
                    ok += 1;
                    // Bound the backlog (a capture in progress refuses the wait: fine, later).
                    if ok % 16 == 0 {
                        match s2.synchronize() {
                            Ok(()) | Err(Error::Capture(_)) => {}
                            Err(e) => return Err(format!("synchronize: {e}").into()),
                        }
                    }
                }
                Err(DeviceError::Core(Error::Capture(_))) => refused += 1,
                Err(e) => return Err(format!("unexpected error: {e}").into()),
            }
        }
        let v = mine.to_vec()?;
        ensure(all_eq(&v, ok as f32), format!("buffer {} but {ok} launches returned Ok", v[0]))?;
        Ok((ok, refused))
    });
    let mut y = DeviceBuffer::filled(&s, n, 0.0f32)?;
    let mut replays = 0.0f32;
    for i in 0..100 {
        let g = match CudaGraph::scope(&s, |sc| {
            sc.record(AddScalar { buf: &mut y, v: 1.0 })?;
            Ok(())
        }) {
            Ok(g) => g,
            // The launcher may hold the stream at the instant the scope begins: refused, retry.
            Err(DeviceError::Core(Error::Capture(_))) => continue,
            Err(e) => return Err(format!("capture {i}: {e}").into()),
        };
        g.launch().sync_on(&s)?;
        replays += 1.0;
    }
    stop.store(true, SeqCst);
    let (ok, refused) = launcher.join().map_err(|_| "launcher panicked")??;
    eprintln!("launcher: {ok} launches ran, {refused} refused; {replays} captures replayed");
    ensure(all_eq(&y.to_vec()?, replays), "every captured add replayed exactly once")
}

/// (3d) A stream dropped while capturing (its last handle) ends the capture; afterwards new
/// streams (whose raw handles the driver may reuse) order cross-stream work correctly.
fn dropped_capturing_stream_leaves_no_state() -> TestResult {
    let (d, s) = setup()?;
    let n = 1 << 16;
    for _ in 0..5 {
        let c = Stream::new(&d)?;
        c.begin_capture(CaptureMode::ThreadLocal)?;
        drop(c);
        let (x, y) = (Stream::new(&d)?, Stream::new(&d)?);
        let xh = random_f32(&mut rng(), n);
        let mut buf = DeviceBuffer::from_host(&x, &xh)?;
        SpinWrite { buf: &mut buf, ns: 20 * MS, v: 4.0 }
            .into_op()
            .then(|b| AddScalar { buf: b, v: 1.0 })
            .sync_on(&y)?;
        ensure(all_eq(&buf.to_vec()?, 5.0), "cross-stream work after a dropped capture")?;
    }
    ensure(s.query().is_ok(), "the device is fine")
}

// ---------------------------------------------------------------------------------------------
// 4. CUDA from callback threads

/// A waker that calls CUDA when woken and remembers the thread it ran on.
struct CudaWaker {
    probe: Stream,
    threads: Mutex<Vec<Option<String>>>,
    woken: AtomicUsize,
}

impl std::task::Wake for CudaWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref()
    }
    fn wake_by_ref(self: &Arc<Self>) {
        // CUDA calls inside a driver callback would deadlock or fail; here they must just work.
        let ok = self.probe.query().is_ok() && self.probe.synchronize().is_ok();
        self.threads
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(Some(std::thread::current().name().unwrap_or("?").to_string()).filter(|_| ok));
        self.woken.fetch_add(1, SeqCst);
    }
}

/// (4) A waker that calls CUDA (query, synchronize) when woken: the future of a slow op completes,
/// the waker ran on the library's completion thread, and its CUDA calls succeeded.
fn waker_may_call_cuda() -> TestResult {
    let (d, s) = setup()?;
    let w = Arc::new(CudaWaker {
        probe: Stream::new(&d)?,
        threads: Mutex::new(Vec::new()),
        woken: AtomicUsize::new(0),
    });
    let waker = std::task::Waker::from(w.clone());
    let mut buf = DeviceBuffer::filled(&s, 4096, POISON_F32)?;
    // A first poll can find the work already done: its driver calls may be held up by the driver
    // while another thread synchronizes the device or unloads a module (other tests run in
    // parallel), and then the waker is never needed. Such an attempt proves nothing here: try
    // again, up to 20 times, until the waker was used.
    for _attempt in 0..20 {
        let mut fut = std::pin::pin!(SpinWrite { buf: &mut buf, ns: 30 * MS, v: 2.0 }.on(&s));
        let mut cx = std::task::Context::from_waker(&waker);
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            if let std::task::Poll::Ready(r) = fut.as_mut().poll(&mut cx) {
                r?;
                break;
            }
            ensure(std::time::Instant::now() < deadline, "the future never completed")?;
            while w.woken.load(SeqCst) == 0 && std::time::Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        if w.woken.load(SeqCst) > 0 {
            break;
        }
    }
    let threads = w.threads.lock().unwrap_or_else(|e| e.into_inner()).clone();
    ensure(!threads.is_empty(), "the waker was woken")?;
    for t in &threads {
        ensure(
            t.as_deref() == Some("cuda-async-completion"),
            format!("woken on {t:?} (None: a CUDA call failed)"),
        )?;
    }
    ensure(all_eq(&buf.to_vec()?, 2.0), "the op ran")
}

// ---------------------------------------------------------------------------------------------
// 5. No overlap, no hang

const TIMED_SRC: &str = r#"
extern "C" __global__ void timed(unsigned long long* t, unsigned long long slot, unsigned long long ns) {
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    now = start;
    while (now - start < ns) { __nanosleep(1000); asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now)); }
    t[2 * slot] = start;
    t[2 * slot + 1] = now;
}
"#;

fn timed_kernel(d: &Device) -> Result<&'static Function, Error> {
    static F: OnceLock<Function> = OnceLock::new();
    if let Some(f) = F.get() {
        return Ok(f);
    }
    let f = d.compile_module("gpu_soundness_timed.cu", TIMED_SRC, &[])?.function("timed")?;
    Ok(F.get_or_init(|| f))
}

/// Writes the GPU start/end time of its kernel into `t[2*slot..2*slot+2]` after spinning `ns`.
struct Timed<'a> {
    t: &'a mut DeviceBuffer<u64>,
    slot: u64,
    ns: u64,
}

impl DeviceOp for Timed<'_> {
    type Output = ();
    fn execute(self, ctx: &ExecutionContext<'_>) -> cuda_async::Result<()> {
        if (2 * self.slot + 2) as usize > self.t.len() {
            return Err(DeviceError::shape("timed", "slot out of range"));
        }
        let f = timed_kernel(ctx.device())?;
        let cfg = LaunchConfig { grid: (1, 1, 1), block: (1, 1, 1), shared_mem_bytes: 0 };
        // SAFETY: matches timed(u64*, u64, u64); writes t[2*slot..2*slot+2], checked in range.
        unsafe { f.launch(ctx.stream(), cfg, (&mut *self.t, self.slot, self.ns))? };
        Ok(())
    }
}

// SAFETY: one kernel launch over an existing buffer: no allocation, free or synchronisation.
unsafe impl GraphNode for Timed<'_> {}

/// (5a) Two graphs of one `GraphPool`, each a kernel that records its GPU start/end time into its
/// own buffer, replayed from two threads at once on their own streams: no two replays overlap.
fn graph_pool_replays_never_overlap() -> TestResult {
    let (d, s) = setup()?;
    timed_kernel(&d)?;
    let reps = 20u64;
    let pool = GraphPool::new(&d)?;
    let mut ta = DeviceBuffer::<u64>::zeros(&s, 2 * reps as usize)?;
    let mut tb = DeviceBuffer::<u64>::zeros(&s, 2 * reps as usize)?;
    {
        let mut graphs: Vec<Vec<CudaGraph<()>>> = Vec::new();
        for t in [&mut ta, &mut tb] {
            // One graph per slot (a graph writes a fixed slot).
            let mut gs = Vec::new();
            let t: &mut DeviceBuffer<u64> = t;
            for slot in 0..reps {
                let mut g = Timed { t: &mut *t, slot, ns: 2 * MS }.graph_on(&s)?;
                g.join_pool(&pool);
                gs.push(g);
            }
            graphs.push(gs);
        }
        replay_from_two_threads(&d, [&graphs[0], &graphs[1]])?;
    }
    no_replays_overlap([&ta, &tb], "two pool replays")
}

/// Replays each set of graphs in order from its own thread on its own stream, both threads
/// starting together, and waits for both.
fn replay_from_two_threads(d: &Device, sets: [&[CudaGraph<()>]; 2]) -> TestResult {
    let barrier = Barrier::new(2);
    std::thread::scope(|sc| -> TestResult {
        let hs: Vec<_> = sets
            .into_iter()
            .map(|gs| {
                let barrier = &barrier;
                sc.spawn(move || -> TestResult {
                    let mine = Stream::new(d)?;
                    barrier.wait();
                    for g in gs {
                        g.enqueue(&mine)?;
                    }
                    mine.synchronize()?;
                    Ok(())
                })
            })
            .collect();
        for h in hs {
            h.join().map_err(|_| "replayer panicked")??;
        }
        Ok(())
    })
}

/// The GPU start/end times `Timed` replays wrote (a pair per slot) all show a replay that ran and
/// spun, and no two of them overlap.
fn no_replays_overlap(bufs: [&DeviceBuffer<u64>; 2], what: &str) -> TestResult {
    let mut times: Vec<(u64, u64)> = Vec::new();
    for t in bufs {
        times.extend(t.to_vec()?.chunks(2).map(|c| (c[0], c[1])));
    }
    ensure(times.iter().all(|&(a, b)| a > 0 && b >= a + MS), "every replay ran and spun")?;
    times.sort();
    for w in times.windows(2) {
        ensure(w[0].1 <= w[1].0, format!("{what} overlapped: {:?} and {:?}", w[0], w[1]))?;
    }
    Ok(())
}

/// (5a') A graph that joined two pools stays in both across rebuilds: each of 20 graphs joins
/// pools `p1` and `p2` and is then captured anew (`reset_and_recapture`, or `recapture_scope`
/// with another topology); replays of those and of 20 graphs of `p1` or `p2` alone, from two
/// threads on their own streams, never overlap (GPU timestamps). Found by review: only the last
/// pool joined was remembered, so the rebuilt executables were serialised through `p2` alone and
/// ran beside `p1`'s other graphs.
fn graph_pools_survive_recapture() -> TestResult {
    let (d, s) = setup()?;
    timed_kernel(&d)?;
    let reps = 20u64;
    let (p1, p2) = (GraphPool::new(&d)?, GraphPool::new(&d)?);
    let mut ta = DeviceBuffer::<u64>::zeros(&s, 2 * reps as usize)?;
    let mut tb = DeviceBuffer::<u64>::zeros(&s, 2 * reps as usize)?;
    let mut scratch = DeviceBuffer::<u64>::zeros(&s, 2)?;
    {
        let mut a: Vec<CudaGraph<()>> = Vec::new();
        for slot in 0..reps {
            let mut g = Timed { t: &mut scratch, slot: 0, ns: MS / 10 }.graph_on(&s)?;
            g.join_pool(&p1);
            g.join_pool(&p2);
            if slot % 2 == 0 {
                g.reset_and_recapture(Timed { t: &mut ta, slot, ns: 2 * MS })?;
            } else {
                // Two nodes where there was one: the update is refused and `recapture` builds a
                // new executable (the other rebuild path).
                let path = g.recapture_scope(|sc| {
                    sc.record(Timed { t: &mut ta, slot, ns: 2 * MS })?;
                    sc.record(Timed { t: &mut scratch, slot: 0, ns: MS / 10 })
                })?;
                ensure(matches!(path, RecapturePath::Reinstantiated { .. }), format!("rebuilt: {path:?}"))?;
            }
            a.push(g);
        }
        // Half of the other graphs in each pool: keeping any single pool of `a`'s lets some of
        // its replays run beside them.
        let mut b: Vec<CudaGraph<()>> = Vec::new();
        for slot in 0..reps {
            let mut g = Timed { t: &mut tb, slot, ns: 2 * MS }.graph_on(&s)?;
            g.join_pool(if slot % 2 == 0 { &p1 } else { &p2 });
            b.push(g);
        }
        replay_from_two_threads(&d, [&a, &b])?;
    }
    no_replays_overlap([&ta, &tb], "replays of a shared pool")
}

/// (5b) A scope that waits for another thread running `sync_on` on an unrelated stream completes
/// (no process-wide lock), and both results are right.
fn scope_waiting_for_another_thread() -> TestResult {
    let (d, s) = setup()?;
    let n = 4096;
    let mut y = DeviceBuffer::filled(&s, n, 0.0f32)?;
    let g = CudaGraph::scope(&s, |sc| {
        sc.record(AddScalar { buf: &mut y, v: 1.0 })?;
        let r = std::thread::scope(|t| {
            t.spawn(|| -> Result<Vec<f32>, Failed> {
                let other = Stream::new(&d)?;
                let mut z = DeviceBuffer::filled(&other, n, 1.0f32)?;
                AddScalar { buf: &mut z, v: 2.0 }.sync_on(&other)?;
                Ok(z.to_vec()?)
            })
            .join()
        });
        match r {
            Ok(Ok(v)) if all_eq(&v, 3.0) => Ok(()),
            other => {
                Err(DeviceError::Misuse(format!("the other thread's op: {:?}", other.map(|r| r.is_ok()))))
            }
        }
    })?;
    g.launch().sync_on(&s)?;
    ensure(all_eq(&y.to_vec()?, 1.0), "the scope's graph")
}

/// (5c) A shared op whose producer executes a clone of itself gets `DeviceError::Lock` at once
/// (no self-deadlock); then a cross-thread cycle — X's producer runs Y while Y's producer runs X —
/// fails with `Lock` on at least one side instead of hanging.
fn shared_cycles_are_errors() -> TestResult {
    let (_d, s) = setup()?;
    type Cell = Arc<Mutex<Option<Box<dyn FnOnce(&ExecutionContext<'_>) -> cuda_async::Result<()> + Send>>>>;
    // Self cycle.
    let slot: Cell = Arc::new(Mutex::new(None));
    let slot2 = slot.clone();
    let x = memory::zeros::<f32>(16)
        .and_then_with_context(move |b, ctx| {
            if let Some(f) = slot2.lock().unwrap_or_else(|e| e.into_inner()).take() {
                f(ctx)?;
            }
            Ok(b)
        })
        .shared();
    let x_clone = x.clone();
    *slot.lock().unwrap_or_else(|e| e.into_inner()) =
        Some(Box::new(move |ctx| x_clone.execute(ctx).map(|_| ())));
    let r = x.sync_on(&s);
    ensure(
        matches!(&r, Err(DeviceError::Shared(e)) if matches!(**e, DeviceError::Lock(_)))
            || matches!(&r, Err(DeviceError::Lock(_))),
        format!("self cycle: {:?}", r.as_ref().err()),
    )?;
    // Cross-thread cycle.
    let barrier = Arc::new(Barrier::new(2));
    let (cx, cy): (Cell, Cell) = (Arc::new(Mutex::new(None)), Arc::new(Mutex::new(None)));
    let make = |cell: Cell, barrier: Arc<Barrier>| {
        memory::zeros::<f32>(16)
            .and_then_with_context(move |b, ctx| {
                barrier.wait();
                if let Some(f) = cell.lock().unwrap_or_else(|e| e.into_inner()).take() {
                    f(ctx)?;
                }
                Ok(b)
            })
            .shared()
    };
    let (x, y) = (make(cx.clone(), barrier.clone()), make(cy.clone(), barrier.clone()));
    let (xc, yc) = (x.clone(), y.clone());
    *cx.lock().unwrap_or_else(|e| e.into_inner()) = Some(Box::new(move |ctx| yc.execute(ctx).map(|_| ())));
    *cy.lock().unwrap_or_else(|e| e.into_inner()) = Some(Box::new(move |ctx| xc.execute(ctx).map(|_| ())));
    let d = *s.device();
    let hy = std::thread::spawn(move || y.sync_on(&Stream::new(&d)?).map(|_| ()));
    let rx = x.sync_on(&s).map(|_| ());
    let ry = hy.join().map_err(|_| "thread panicked")?;
    let lock = |r: &cuda_async::Result<()>| {
        matches!(r, Err(DeviceError::Lock(_)))
            || matches!(r, Err(DeviceError::Shared(e)) if matches!(**e, DeviceError::Lock(_)))
    };
    ensure(lock(&rx) || lock(&ry), format!("cross-thread cycle: {rx:?} / {ry:?}"))
}

/// (6) A panic inside a scope after recording ends the capture; the stream and the buffers are
/// intact and the next capture on the same stream works.
fn panic_inside_a_scope() -> TestResult {
    let (_d, s) = setup()?;
    let n = 4096;
    let mut y = DeviceBuffer::filled(&s, n, 2.0f32)?;
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let _ = CudaGraph::<()>::scope(&s, |sc| {
            sc.record(AddScalar { buf: &mut y, v: 1.0 })?;
            panic!("boom inside a scope");
        });
    }));
    ensure(r.is_err(), "the panic propagated")?;
    ensure(s.capture_status()? == CaptureStatus::None && !s.is_being_captured(), "capture ended")?;
    ensure(all_eq(&y.to_vec()?, 2.0), "nothing recorded ran")?;
    let g = AddScalar { buf: &mut y, v: 3.0 }.graph_on(&s)?;
    g.launch().sync_on(&s)?;
    drop(g);
    ensure(all_eq(&y.to_vec()?, 5.0), "the next capture works")
}

/// (7) `GraphBodyExt::add_recorded` from several threads at once (each records on a private
/// stream): every graph gets its own nodes and replays right. The 20 nodes of a graph all add to
/// one buffer and are added with no explicit dependency: the builder's implicit edges order them
/// (without them the adds race and lose updates).
fn add_recorded_from_threads() -> TestResult {
    use cuda_async::GraphBodyExt;
    let (d, _s) = setup()?;
    let results: Vec<TestResult> = std::thread::scope(|t| {
        (0..4)
            .map(|k| {
                t.spawn(move || -> TestResult {
                    let s = Stream::new(&d)?;
                    let mut y = DeviceBuffer::filled(&s, 2048, 0.0f32)?;
                    let mut g = cuda_core::Graph::new(&d)?;
                    for _ in 0..20 {
                        g.builder().add_recorded(&[], |sc| {
                            sc.record(AddScalar { buf: &mut y, v: k as f32 })?;
                            Ok(())
                        })?;
                    }
                    ensure(g.node_count()? == 20, "20 nodes")?;
                    let exec = g.instantiate(Default::default())?;
                    exec.launch(&s)?;
                    drop(exec);
                    drop(g);
                    ensure(all_eq(&y.to_vec()?, 20.0 * k as f32), format!("thread {k}"))
                })
            })
            .collect::<Vec<_>>()
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("panicked".into())))
            .collect()
    });
    results.into_iter().collect()
}

/// (8) Cross-device misuse, on two GPUs: a kernel op run on a stream of device 0 with a buffer of
/// device 1 is refused (`DeviceMismatch`). Needs two GPUs: on one it is reported ignored (it used
/// to pass on one GPU without exercising a second device).
fn cross_device_misuse() -> TestResult {
    let (d, s) = setup()?;
    let d1 = Device::new(1)?;
    test_kernels(&d1)?;
    ensure(d != d1, "distinct devices")?;
    let s1 = Stream::new(&d1)?;
    let mut b1 = DeviceBuffer::filled(&s1, 16, 0.0f32)?;
    let r = AddScalar { buf: &mut b1, v: 1.0 }.sync_on(&s);
    ensure(matches!(r, Err(DeviceError::Core(Error::DeviceMismatch { .. }))), format!("{r:?}"))?;
    ensure(all_eq(&b1.to_vec()?, 0.0), "the refused op wrote nothing")
}

/// (8b) The first ordinal past the last device (device 1 on a one-GPU machine) is refused with
/// `InvalidDevice` naming it and the count, not another error or a panic; the boundary case of
/// `gpu_core::bad_device_ordinal` (which asks for `count + 3`). One GPU is enough.
fn first_missing_ordinal_is_refused() -> TestResult {
    let n = cuda_core::device_count()?;
    let r = Device::new(n);
    ensure(
        matches!(r, Err(Error::InvalidDevice { ordinal, count }) if ordinal == n && count == n),
        format!("Device::new({n}) with {n} devices: {r:?}"),
    )
}

/// (9) Explicitly built nodes that touch one buffer with no explicit edge between them are ordered
/// by the builder: ten `+1` kernel nodes, a copy of the buffer (reads 10), a memset of it to 100
/// (waits for the copy), forty more `+1` nodes: the copy holds 10 and the buffer 140.
fn builder_orders_conflicting_nodes() -> TestResult {
    use cuda_async::GraphBodyExt;
    let (d, s) = setup()?;
    let n = 1 << 16;
    let mut y = DeviceBuffer::filled(&s, n, 0.0f32)?;
    let mut z = DeviceBuffer::filled(&s, n, POISON_F32)?;
    let mut g = cuda_core::Graph::new(&d)?;
    {
        let mut b = g.builder();
        for i in 0..50 {
            b.add_op(AddScalar { buf: &mut y, v: 1.0 }, &[])?;
            if i == 9 {
                b.add_copy(&y, &mut z, &[])?;
                b.add_memset(&mut y, 100.0f32, &[])?;
            }
        }
    }
    let exec = g.instantiate(Default::default())?;
    exec.launch(&s)?;
    drop(exec);
    drop(g);
    ensure(all_eq(&z.to_vec()?, 10.0), "the copy read the buffer after exactly ten adds")?;
    ensure(all_eq(&y.to_vec()?, 140.0), "memset after the copy, then forty adds")
}

/// (10) A conditional body counts as writing what it touches: a node added after an IF node (with
/// no explicit edge) that writes the buffer the body writes waits for the whole conditional. The
/// body spins 20 ms then sets 5; the later node adds 1: ordered, the result is 6 (unordered, 5).
fn conditional_body_orders_later_nodes() -> TestResult {
    use cuda_async::GraphBodyExt;
    let (d, s) = setup()?;
    let mut y = DeviceBuffer::filled(&s, 4096, POISON_F32)?;
    let mut g = cuda_core::Graph::new(&d)?;
    {
        let mut b = g.builder();
        let cond = b.conditional(Some(true))?;
        b.add_if::<DeviceError>(&cond, &[], |body| {
            body.add_op(SpinWrite { buf: &mut y, ns: 20 * MS, v: 5.0 }, &[])?;
            Ok(())
        })?;
        b.add_op(AddScalar { buf: &mut y, v: 1.0 }, &[])?;
    }
    let exec = g.instantiate(Default::default())?;
    exec.launch(&s)?;
    drop(exec);
    drop(g);
    ensure(all_eq(&y.to_vec()?, 6.0), "the node after the IF body ran after it")
}

/// (11) Recapture while replays are queued: a graph (30 ms spin then a write, plus `+1` on a
/// counter) is replayed without waiting, recaptured with a new value (an in-place update), and
/// replayed again on another stream: both replays ran, in order, each exactly once.
fn recapture_with_queued_replays() -> TestResult {
    let (d, s) = setup()?;
    let (s2, s3) = (Stream::new(&d)?, Stream::new(&d)?);
    let mut y = DeviceBuffer::filled(&s, 4096, POISON_F32)?;
    let mut c = DeviceBuffer::filled(&s, 16, 0.0f32)?;
    let mut g = CudaGraph::scope(&s, |sc| {
        sc.record(SpinWrite { buf: &mut y, ns: 30 * MS, v: 1.0 })?;
        sc.record(AddScalar { buf: &mut c, v: 1.0 })?;
        Ok(())
    })?;
    // SAFETY: a replay yields `()`; the buffers it writes are read below through `to_vec`, which
    // is ordered after every replay.
    unsafe { g.launch().async_on(&s2)? };
    let path = g.recapture_scope(|sc| {
        sc.record(SpinWrite { buf: &mut y, ns: 30 * MS, v: 2.0 })?;
        sc.record(AddScalar { buf: &mut c, v: 1.0 })?;
        Ok(())
    })?;
    // SAFETY: as above.
    unsafe { g.launch().async_on(&s3)? };
    drop(g);
    eprintln!("recapture path: {path:?}");
    ensure(all_eq(&c.to_vec()?, 2.0), "two replays, each exactly once")?;
    ensure(all_eq(&y.to_vec()?, 2.0), "the second replay (new value) ran after the first")
}

fn main() {
    let mut s = Suite::new();
    s.gpu("fork_refused_core", || bounded(60, fork_refused_core))
        .gpu("fork_refused_in_scope_and_closure", || bounded(60, fork_refused_in_scope_and_closure))
        .gpu("host_closure_outlives_queued_replays", || bounded(120, host_closure_outlives_queued_replays))
        .gpu("other_threads_cannot_touch_a_capture", || bounded(60, other_threads_cannot_touch_a_capture))
        .gpu("capture_vs_launch_stress", || bounded(300, capture_vs_launch_stress))
        .gpu("dropped_capturing_stream_leaves_no_state", || {
            bounded(60, dropped_capturing_stream_leaves_no_state)
        })
        .gpu("waker_may_call_cuda", || bounded(60, waker_may_call_cuda))
        .gpu("graph_pool_replays_never_overlap", || bounded(120, graph_pool_replays_never_overlap))
        .gpu("graph_pools_survive_recapture", || bounded(120, graph_pools_survive_recapture))
        .gpu("scope_waiting_for_another_thread", || bounded(60, scope_waiting_for_another_thread))
        .gpu("shared_cycles_are_errors", || bounded(60, shared_cycles_are_errors))
        .gpu("panic_inside_a_scope", || bounded(60, panic_inside_a_scope))
        .gpu("add_recorded_from_threads", || bounded(120, add_recorded_from_threads))
        .gpus(2, "cross_device_misuse", || bounded(60, cross_device_misuse))
        .gpu("first_missing_ordinal_is_refused", || bounded(60, first_missing_ordinal_is_refused))
        .gpu("builder_orders_conflicting_nodes", || bounded(60, builder_orders_conflicting_nodes))
        .gpu("conditional_body_orders_later_nodes", || bounded(60, conditional_body_orders_later_nodes))
        .gpu("recapture_with_queued_replays", || bounded(60, recapture_with_queued_replays));
    s.run()
}

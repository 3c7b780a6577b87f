//! GPU suite for capture membership and device-wide operations racing captures (soundness round
//! 3): an object that took part in a capture never comes back looking untouched, an explicitly
//! built graph cannot pull a launch into someone's open capture, a graph keeps its kernels' code
//! loaded, and device-wide operations never overlap a capture on another thread.

use cuda_async::DeviceOpExt;
use cuda_async_tests::ops::SpinWrite;
use cuda_async_tests::{ensure, Suite, TestResult};
use cuda_core::{
    CaptureMode, CaptureStatus, Device, DeviceBuffer, Error, Event, Graph, LaunchConfig, PinnedBuffer, Stream,
};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn dev() -> Result<Device, cuda_core::Error> {
    Device::new(0)
}

/// Allocates on `s`, fills, reads back, on another thread (the capturing thread's own allocations
/// are refused by the driver in the thread-local and global modes): the stream is not part of any
/// capture (an allocation pulled into a capture would be graph memory, and the fill would never
/// run).
fn stream_runs_eagerly(s: &Stream, v: u32, what: &str) -> TestResult {
    ensure(s.capture_status()? == CaptureStatus::None, format!("{what}: the stream joined a capture"))?;
    let run = || -> TestResult {
        let mut buf = DeviceBuffer::<u32>::zeros(s, 4096)?;
        buf.fill(s, v)?;
        let host = buf.to_vec()?;
        ensure(host.iter().all(|&x| x == v), format!("{what}: the fill did not run"))
    };
    std::thread::scope(|sc| sc.spawn(run).join())
        .map_err(|_| format!("{what}: the checking thread panicked"))?
}

/// Runs `body` inside a capture of `s` begun in `mode`, always ending the capture; the graph and
/// the body's result.
fn captured(
    s: &Stream,
    mode: CaptureMode,
    body: impl FnOnce() -> TestResult,
) -> Result<Graph, cuda_async_tests::Failed> {
    s.begin_capture(mode)?;
    let r = body();
    let g = s.end_capture();
    r?;
    Ok(g?)
}

/// Pooled events recorded inside a capture and dropped there are never handed out again: every
/// pooled event taken afterwards (more than the pool holds) can be waited on by another stream
/// without that stream joining the capture, and work there runs. Under every capture mode.
fn pooled_event_from_a_capture_is_not_recycled() -> TestResult {
    let d = dev()?;
    for mode in [CaptureMode::ThreadLocal, CaptureMode::Global, CaptureMode::Relaxed] {
        let (capturing, other) = (Stream::new(&d)?, Stream::new(&d)?);
        let mut kept = DeviceBuffer::<u32>::zeros(&capturing, 256)?;
        capturing.synchronize()?;
        let graph = captured(&capturing, mode, || {
            kept.fill(&capturing, 5)?;
            // Several events recorded inside the capture, all dropped (back to the pool, before
            // the fix).
            for _ in 0..8 {
                let ev = Event::pooled(&d)?;
                ev.record(&capturing)?;
            }
            // Every event the pool hands out now, never recorded: a wait on it must be a no-op.
            let fresh: Vec<_> = (0..300).map(|_| Event::pooled(&d)).collect::<Result<_, _>>()?;
            for ev in &fresh {
                other.wait_event(ev)?;
                ensure(
                    other.capture_status()? == CaptureStatus::None,
                    format!("{mode:?}: a wait on a pooled event pulled another stream into the capture"),
                )?;
            }
            // Another thread's allocation and launch there (the driver refuses allocations on
            // every thread during a global capture: an error, checked after the capture instead).
            if mode != CaptureMode::Global {
                stream_runs_eagerly(&other, 9, &format!("{mode:?}, after waiting on pooled events"))?;
            }
            Ok(())
        })?;
        stream_runs_eagerly(&other, 8, &format!("{mode:?}, after the capture"))?;
        let exec = graph.instantiate(Default::default())?;
        exec.launch(&capturing)?;
        ensure(kept.to_vec()?.iter().all(|&x| x == 5), format!("{mode:?}: the capture's replay"))?;
    }
    Ok(())
}

/// An event recorded inside a capture cannot be waited on by another stream even after the capture
/// ended (it still names the capture's nodes), through the public wait; re-recording it eagerly
/// makes it an ordinary event again, and then it may go back to the pool.
fn captured_event_stays_refused_until_re_recorded() -> TestResult {
    let d = dev()?;
    let (capturing, other) = (Stream::new(&d)?, Stream::new(&d)?);
    let ev = Event::pooled(&d)?;
    let mut during = Ok(());
    drop(captured(&capturing, CaptureMode::ThreadLocal, || {
        ev.record(&capturing)?;
        during = other.wait_event(&ev);
        Ok(())
    })?);
    let after = other.wait_event(&ev);
    ensure(matches!(during, Err(Error::Capture(_))), format!("wait during the capture: {during:?}"))?;
    ensure(matches!(after, Err(Error::Capture(_))), format!("wait after the capture: {after:?}"))?;
    ensure(matches!(ev.query(), Err(Error::Capture(_))), "query of a captured event")?;
    ev.record(&capturing)?; // eagerly now
    other.wait_event(&ev)?;
    ev.synchronize()?;
    drop(ev); // untagged: back to the pool
    stream_runs_eagerly(&other, 3, "after re-recording")
}

/// Event nodes of explicitly built graphs: an event recorded inside an open capture is refused when
/// added, and one recorded inside a capture after it was added makes instantiation and launch
/// refuse, leaving the capture intact (it ends normally and its graph replays).
fn event_nodes_cannot_join_an_open_capture() -> TestResult {
    let d = dev()?;
    for node in ["wait", "record"] {
        let (capturing, launcher) = (Stream::new(&d)?, Stream::new(&d)?);
        let mut kept = DeviceBuffer::<u32>::zeros(&capturing, 256)?;
        let ev = Arc::new(Event::new(&d, false)?);
        let mut g = Graph::new(&d)?;
        {
            let mut b = g.builder();
            let add = |b: &mut cuda_core::GraphBody<'_>| match node {
                "wait" => b.add_event_wait(&ev, &[]),
                _ => b.add_event_record(&ev, &[]),
            };
            // An exec made while the event is untagged (its launch is checked again below).
            add(&mut b)?;
        }
        let exec = g.instantiate(Default::default())?;
        capturing.synchronize()?;
        let mut g2 = Graph::new(&d)?;
        let graph = captured(&capturing, CaptureMode::ThreadLocal, || {
            kept.fill(&capturing, 7)?;
            ev.record(&capturing)?; // the event now belongs to the capture
            let added = {
                let mut b = g2.builder();
                match node {
                    "wait" => b.add_event_wait(&ev, &[]),
                    _ => b.add_event_record(&ev, &[]),
                }
            };
            let inst = g.instantiate(Default::default());
            // Launched from another thread (the capturing thread's own instantiations and
            // launches are the driver's to refuse in this mode).
            let launched = std::thread::scope(|sc| sc.spawn(|| exec.launch(&launcher)).join())
                .map_err(|_| "the launching thread panicked")?;
            ensure(matches!(added, Err(Error::Capture(_))), format!("{node}: adding the node: {added:?}"))?;
            ensure(
                matches!(inst, Err(Error::Capture(_))),
                format!("{node}: instantiating: {:?}", inst.err()),
            )?;
            ensure(matches!(launched, Err(Error::Capture(_))), format!("{node}: launching: {launched:?}"))?;
            ensure(
                capturing.capture_status()? == CaptureStatus::Active,
                format!("{node}: the capture broke"),
            )?;
            stream_runs_eagerly(&launcher, 4, &format!("{node}: the launching stream"))
        })?;
        let replay = graph.instantiate(Default::default())?;
        replay.launch(&capturing)?;
        ensure(kept.to_vec()?.iter().all(|&x| x == 7), format!("{node}: the capture's replay"))?;
        // Recorded eagerly again, the event is usable by event nodes.
        ev.record(&launcher)?;
        exec.launch(&launcher)?;
        launcher.synchronize()?;
    }
    Ok(())
}

const INC_SRC: &str = r#"extern "C" __global__ void inc_by(unsigned int* x, unsigned int n, unsigned int v) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += v;
}"#;

/// A captured graph keeps the module of every kernel it launches loaded: the module and function
/// are dropped right after the capture, other modules are loaded and dropped meanwhile, and replays
/// still run the right code.
fn captured_graph_keeps_its_kernels_loaded() -> TestResult {
    let d = dev()?;
    let s = Stream::new(&d)?;
    let n = 1 << 16;
    let mut x = DeviceBuffer::<u32>::zeros(&s, n)?;
    s.synchronize()?;
    let graph = {
        let m = d.compile_module("inc_by_keep.cu", INC_SRC, &[])?;
        let f = m.function("inc_by")?;
        captured(&s, CaptureMode::ThreadLocal, || {
            // SAFETY: inc_by(u32*, u32, u32) writes x[0..n] only.
            unsafe { f.launch(&s, LaunchConfig::for_elements(n, 256), (&mut x, n as u32, 3u32))? };
            Ok(())
        })?
        // `m` and `f` are dropped here: only the graph refers to the kernel now.
    };
    for _ in 0..4 {
        let other =
            d.compile_module("inc_by_other.cu", &INC_SRC.replace("x[i] += v", "x[i] = 0xdead"), &[])?;
        drop(other.function("inc_by")?);
    }
    let exec = graph.instantiate(Default::default())?;
    drop(graph);
    for _ in 0..5 {
        exec.launch(&s)?;
    }
    let host = x.to_vec()?;
    ensure(host.iter().all(|&v| v == 15), format!("5 replays of +3 gave {:?}", &host[..4]))
}

/// `Device::synchronize` is refused while this thread (or any) has a capture open, and the capture
/// is unharmed.
fn device_sync_refused_during_a_capture() -> TestResult {
    let d = dev()?;
    let s = Stream::new(&d)?;
    let mut x = DeviceBuffer::<u32>::zeros(&s, 1024)?;
    s.synchronize()?;
    let (mut refused, mut status) = (Ok(()), CaptureStatus::None);
    let graph = captured(&s, CaptureMode::Global, || {
        x.fill(&s, 2)?;
        refused = d.synchronize();
        status = s.capture_status()?;
        Ok(())
    })?;
    ensure(matches!(refused, Err(Error::Capture(_))), format!("synchronize during a capture: {refused:?}"))?;
    ensure(status == CaptureStatus::Active, "the capture was invalidated")?;
    graph.instantiate(Default::default())?.launch(&s)?;
    ensure(x.to_vec()?.iter().all(|&v| v == 2), "the replay")?;
    d.synchronize()?;
    Ok(())
}

/// A capture that begins while a device synchronisation is in flight waits for it: the
/// synchronisation (of a 300 ms kernel) returns before the capture begins, and both succeed.
fn capture_waits_for_an_inflight_device_sync() -> TestResult {
    let d = dev()?;
    let (busy, cap) = (Stream::new(&d)?, Stream::new(&d)?);
    let k = d.compile_module("spin_sync.cu", SPIN_SRC, &[])?.function("spin")?;
    let one = LaunchConfig { grid: (1, 1, 1), block: (1, 1, 1), shared_mem_bytes: 0 };
    // SAFETY: spin(u64) touches no memory.
    unsafe { k.launch(&busy, one, (300_000_000u64,))? };
    let t0 = Instant::now();
    let synced_at = std::thread::scope(|sc| {
        let h = sc.spawn(|| d.synchronize().map(|()| t0.elapsed()));
        std::thread::sleep(Duration::from_millis(50));
        let r = (|| -> cuda_core::Result<Duration> {
            cap.begin_capture(CaptureMode::ThreadLocal)?;
            let began = t0.elapsed();
            drop(cap.end_capture()?);
            Ok(began)
        })();
        (h.join(), r)
    });
    let (sync, began) = synced_at;
    let synced = sync.map_err(|_| "the synchronising thread panicked")??;
    let began = began?;
    ensure(synced >= Duration::from_millis(250), format!("the device sync returned after {synced:?}"))?;
    ensure(began >= synced, format!("the capture began at {began:?}, during the device sync ({synced:?})"))
}

const SPIN_SRC: &str = r#"extern "C" __global__ void spin(unsigned long long ns) {
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    now = start;
    while (now - start < ns) { __nanosleep(1000); asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now)); }
}"#;

const CHILD: &str = "CUDA_ASYNC_TEST_CAPTURE_RACE_CHILD";

/// The racing part, run in a child process (a crash must fail the test, not end the suite): for
/// at least 3 s (on until both sides raced 100 times, at most 30 s), threads that begin, record into and end captures (and instantiate and replay
/// their graphs) race threads that synchronize the device and enable peer access on it. Every
/// device-wide call returns `Ok` or `Error::Capture`; every capture ends with a graph whose replay
/// is right. Prints `RACE-OK` and the counts.
fn race_child(mode: &str) -> TestResult {
    let d = dev()?;
    let mode = match mode {
        "global" => CaptureMode::Global,
        "relaxed" => CaptureMode::Relaxed,
        _ => CaptureMode::ThreadLocal,
    };
    let stop = AtomicBool::new(false);
    let (syncs, refused, captures) = (AtomicUsize::new(0), AtomicUsize::new(0), AtomicUsize::new(0));
    let driver_refused = AtomicUsize::new(0);
    let deadline = Instant::now() + Duration::from_secs(3);
    std::thread::scope(|sc| -> TestResult {
        let mut hs = Vec::new();
        for t in 0..3u32 {
            let (stop, captures, driver_refused) = (&stop, &captures, &driver_refused);
            hs.push(sc.spawn(move || -> TestResult {
                let s = Stream::new(&d)?;
                let mut x = DeviceBuffer::<u32>::zeros(&s, 1 << 12)?;
                s.synchronize()?;
                let mut k = 0u32;
                while !stop.load(Ordering::Relaxed) {
                    k += 1;
                    let mut round = || -> cuda_core::Result<()> {
                        s.begin_capture(mode)?;
                        let filled = x.fill(&s, k + t);
                        let g = s.end_capture();
                        filled?;
                        g?.instantiate(Default::default())?.launch(&s)?;
                        if k.is_multiple_of(64) {
                            let v = x.to_vec()?;
                            if v.iter().any(|&e| e != k + t) {
                                return Err(Error::InvalidArgument(format!("a replay's result: {}", v[0])));
                            }
                        }
                        Ok(())
                    };
                    match round() {
                        Ok(()) => {
                            captures.fetch_add(1, Ordering::Relaxed);
                        }
                        // `Global` never puts the driver into global mode (where this very
                        // loop crashed it in cuStreamSynchronize or cuGraphInstantiateWithFlags,
                        // or got its calls refused): every round must succeed in every mode.
                        Err(e) => {
                            driver_refused.fetch_add(1, Ordering::Relaxed);
                            return Err(e.into());
                        }
                    }
                }
                s.synchronize()?;
                Ok(())
            }));
        }
        // Threads that only synchronise the device (the call that crashed), and one that also
        // does the other device-wide calls.
        for t in 0..3 {
            let (stop, syncs, refused) = (&stop, &syncs, &refused);
            hs.push(sc.spawn(move || -> TestResult {
                while !stop.load(Ordering::Relaxed) {
                    match d.synchronize() {
                        Ok(()) => syncs.fetch_add(1, Ordering::Relaxed),
                        Err(Error::Capture(_)) => refused.fetch_add(1, Ordering::Relaxed),
                        Err(e) => return Err(format!("device synchronize: {e}").into()),
                    };
                    if t != 0 {
                        continue;
                    }
                    d.enable_peer_access(&d)?;
                    let _ = d.memory_info()?;
                    // Pools are created, trimmed and destroyed only while no capture is open (a
                    // pool destroyed during a global capture crashed the raw driver).
                    match cuda_core::MemPool::new(&d) {
                        Ok(pool) => match pool.trim_to(0) {
                            Ok(()) | Err(Error::Capture(_)) => {}
                            Err(e) => return Err(format!("pool trim: {e}").into()),
                        },
                        Err(Error::Capture(_)) => {}
                        Err(e) => return Err(format!("pool create: {e}").into()),
                    }
                }
                Ok(())
            }));
        }
        // At least 3 s, and on until both sides have raced more than 100 times (a host shared
        // with a dozen sanitizer processes once managed only 70 captures in 3 s), but no more
        // than 30 s (the parent gives the child 60).
        let enough = || {
            captures.load(Ordering::Relaxed) > 100
                && syncs.load(Ordering::Relaxed) + refused.load(Ordering::Relaxed) > 100
        };
        while Instant::now() < deadline || (!enough() && Instant::now() < deadline + Duration::from_secs(27))
        {
            std::thread::sleep(Duration::from_millis(10));
        }
        stop.store(true, Ordering::Relaxed);
        for h in hs {
            h.join().map_err(|_| "a racing thread panicked")??;
        }
        Ok(())
    })?;
    let (s, r, c) = (syncs.into_inner(), refused.into_inner(), captures.into_inner());
    ensure(c > 100 && s + r > 100, format!("too little racing: {c} captures, {s} syncs, {r} refused"))?;
    d.synchronize()?;
    let dr = driver_refused.into_inner();
    println!("RACE-OK {c} captures ({dr} failed), {s} device syncs, {r} refused");
    Ok(())
}

/// `Device::synchronize` racing captures on other threads, in every capture mode: no crash (this
/// was a SIGSEGV inside the driver within a second), each call `Ok` or refused, every capture
/// right. Each mode runs in a child process so that a crash is reported as this test's failure.
fn device_sync_racing_captures_does_not_crash() -> TestResult {
    dev()?;
    for mode in ["thread-local", "global", "relaxed"] {
        let exe = std::env::current_exe()?;
        let mut child =
            Command::new(exe).env(CHILD, mode).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn()?;
        let deadline = Instant::now() + Duration::from_secs(60);
        while child.try_wait()?.is_none() {
            if Instant::now() > deadline {
                let _ = child.kill();
                return Err(format!("{mode}: the racing child did not finish within 60 s").into());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let out = child.wait_with_output()?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        eprintln!("child ({mode}): {} {}", stdout.trim(), String::from_utf8_lossy(&out.stderr).trim());
        ensure(
            out.status.success() && stdout.contains("RACE-OK"),
            format!("{mode}: the racing child failed: {:?}", out.status),
        )?;
    }
    Ok(())
}

/// A shared op first executed inside a capture (where its work is only recorded) is refused and
/// not cached: a later execution outside the capture runs the work, and its result is right.
fn shared_op_first_run_inside_a_capture_is_refused() -> TestResult {
    let d = dev()?;
    let s = Stream::new(&d)?;
    let buf = DeviceBuffer::<f32>::zeros(&s, 1024)?;
    s.synchronize()?;
    let sh = SpinWrite { buf, ns: 0, v: 3.0 }.into_op().shared();
    let mut inside = None;
    drop(captured(&s, CaptureMode::ThreadLocal, || {
        inside = Some(sh.clone().sync_on(&s).map(|_| ()));
        Ok(())
    })?);
    ensure(matches!(inside, Some(Err(_))), format!("inside the capture: {inside:?}"))?;
    let out = sh.sync_on(&s)?;
    ensure(out.to_vec()?.iter().all(|&v| v == 3.0), "the shared op's work did not run after the capture")
}

/// The last handle of a capturing stream dropped on another thread than the capturing one: if the
/// driver still held the capture, device-wide operations would stay refused; if it ended it (the
/// H100's driver 580 does), they run again. Either way, 1,000 device synchronisations afterwards
/// neither crash nor return anything but `Ok` or a refusal.
fn capturing_stream_dropped_on_another_thread_keeps_the_gate_closed() -> TestResult {
    let exe = std::env::current_exe()?;
    let out = Command::new(exe).env(CHILD, "drop-elsewhere").output()?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    eprintln!("child: {} {}", stdout.trim(), String::from_utf8_lossy(&out.stderr).trim());
    ensure(out.status.success() && stdout.contains("DROP-OK"), format!("the child failed: {:?}", out.status))
}

/// The child of [`capturing_stream_dropped_on_another_thread_keeps_the_gate_closed`] (the abandoned
/// capture stays open in the driver for the rest of the process).
fn drop_elsewhere_child() -> TestResult {
    let d = dev()?;
    let s = Stream::new(&d)?;
    let s2 = s.clone();
    s.begin_capture(CaptureMode::Global)?;
    drop(s);
    std::thread::spawn(move || drop(s2)).join().map_err(|_| "the dropping thread panicked")?;
    let mut refused = 0;
    for _ in 0..1000 {
        match d.synchronize() {
            Ok(()) => {}
            Err(Error::Capture(_)) => refused += 1,
            Err(e) => return Err(format!("device synchronize after the drop: {e}").into()),
        }
    }
    // A capture on another stream still works (and, once no capture is left, so does the device).
    let s3 = Stream::new(&d)?;
    drop(captured(&s3, CaptureMode::ThreadLocal, || Ok(()))?);
    println!("DROP-OK ({refused} of 1000 device synchronisations refused)");
    Ok(())
}

/// A stream dropped while it captures work on its own buffers (the buffers dropped first, as at
/// the end of a scope): the capture kept those buffers, and they kept the stream, so before the
/// fix the capture stayed open in the driver for the rest of the process — this thread's
/// allocations then failed with `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED` and device-wide calls
/// stayed refused. Now the last reachable handle's drop ends it.
fn stream_dropped_mid_capture_ends_its_capture() -> TestResult {
    let d = dev()?;
    for mode in [CaptureMode::ThreadLocal, CaptureMode::Relaxed] {
        {
            let s = Stream::new(&d)?;
            let mut a = DeviceBuffer::<u32>::zeros(&s, 1024)?;
            let mut b = DeviceBuffer::<u32>::zeros(&s, 1024)?;
            s.synchronize()?;
            s.begin_capture(mode)?;
            a.fill(&s, 1)?;
            b.fill(&s, 2)?;
            drop(b);
            drop(a);
            // `s` dropped here, mid-capture.
        }
        let t = Stream::new(&d)?;
        let mut x = DeviceBuffer::<u32>::zeros(&t, 4096)?;
        x.fill(&t, 5)?;
        ensure(x.to_vec()?.iter().all(|&v| v == 5), format!("{mode:?}: work after the drop"))?;
        d.synchronize().map_err(|e| format!("{mode:?}: device synchronize after the drop: {e}"))?;
    }
    Ok(())
}

/// Page-locked memory on a thread that has a capture open (found by review: `PinnedBuffer::new`
/// and its drop called `cuMemHostAlloc` / waited and called `cuMemFreeHost`, which the driver
/// forbids a capturing thread in the thread-local and global modes, failing the call and
/// invalidating the capture). Now the allocation is refused with `Error::Capture` before the driver
/// sees it, a buffer dropped there (its copy still pending) is freed later on the reaper thread,
/// and the capture stays valid: it ends, and its graph replays. No drop error is counted. Mutation
/// to try: drop `driver::this_thread_captures` from `PinnedBuffer`'s drop (`pinned-drop-in-capture`).
/// Not yet run on a GPU.
fn page_locked_memory_on_a_capturing_thread() -> TestResult {
    let d = dev()?;
    for mode in [CaptureMode::ThreadLocal, CaptureMode::Global, CaptureMode::Relaxed] {
        let s = Stream::new(&d)?;
        let mut x = DeviceBuffer::<f32>::filled(&s, 1 << 20, 5.0)?;
        let mut host = PinnedBuffer::new(&d, 1 << 20, 0f32)?;
        // A copy into the buffer still pending when it is dropped inside the capture.
        // SAFETY: `x` is never read on the host while the spin writes it.
        unsafe { SpinWrite { buf: &mut x, ns: 20_000_000, v: 7.0 }.async_on(&s)? };
        host.copy_from_device_async(&s, &x)?;
        let before = cuda_core::drop_errors().0;
        s.begin_capture(mode)?;
        let refused = PinnedBuffer::new(&d, 4096, 0u8);
        drop(host);
        let filled = x.fill(&s, 9.0);
        let g = s.end_capture();
        ensure(
            matches!(refused, Err(Error::Capture(_))),
            format!("{mode:?}: allocation refused, got {:?}", refused.map(|_| ())),
        )?;
        filled?;
        let g = g.map_err(|e| format!("{mode:?}: the capture was left valid, got {e}"))?;
        let exec = g.instantiate(Default::default())?;
        exec.launch(&s)?;
        s.synchronize()?;
        ensure(x.to_vec()?.iter().all(|&v| v == 9.0), format!("{mode:?}: the captured fill ran"))?;
        // The reaper has freed the dropped buffer once its copy completed.
        std::thread::sleep(Duration::from_millis(50));
        let after = cuda_core::drop_errors();
        ensure(after.0 == before, format!("{mode:?}: drop errors {before} -> {after:?}"))?;
    }
    Ok(())
}

/// Spins the calling thread for `us` microseconds.
fn spin_us(us: u64) {
    let t = Instant::now();
    while t.elapsed() < Duration::from_micros(us) {
        std::hint::spin_loop();
    }
}

/// Waits that a stream makes outside its enqueue lock (`Stream::synchronize`, `Stream::query`,
/// the wait of a blocking copy) never meet a capture that another thread begins on the same
/// stream: the capture is refused while such a wait is in flight. Without that (the red-team
/// attack of 2026-11-28), a capture begun between a copy's enqueue and its wait made the wait fail
/// (and broke the capture), and `copy_to_host` into page-locked memory returned an error while the
/// driver could still write into the caller's slice. One thread begins and ends thread-local
/// captures in a loop; this one fills a buffer, copies it into page-locked memory, synchronizes
/// and queries, for two seconds. Every capture must end without error, every copy must read the
/// value just filled or be refused before anything was queued (the memory then stays as it was),
/// and every synchronize and query must succeed or be refused as capturing.
fn blocking_waits_never_meet_a_capture() -> TestResult {
    let d = dev()?;
    let s = Stream::new(&d)?;
    let n = 1 << 14;
    let mut src = DeviceBuffer::<f32>::zeros(&s, n)?;
    let mut pinned = PinnedBuffer::new(&d, n, -1.0f32)?;
    s.synchronize()?;
    let stop = Arc::new(AtomicBool::new(false));
    let capturer = {
        let (s, stop) = (s.clone(), stop.clone());
        std::thread::spawn(move || -> Result<(u64, u64), String> {
            let (mut begun, mut refused) = (0u64, 0u64);
            while !stop.load(Ordering::Relaxed) {
                match s.begin_capture(CaptureMode::ThreadLocal) {
                    Ok(()) => {
                        begun += 1;
                        spin_us(20);
                        s.end_capture().map_err(|e| {
                            format!("capture {begun} ended with an error (a wait broke it): {e}")
                        })?;
                    }
                    Err(Error::Capture(_)) => refused += 1,
                    Err(e) => return Err(format!("begin_capture: {e}")),
                }
                spin_us(3);
            }
            Ok((begun, refused))
        })
    };
    let (mut copies, mut refused_copies, mut waits) = (0u64, 0u64, 0u64);
    let mut outcome: TestResult = Ok(());
    let t = Instant::now();
    let mut v = 0.0f32;
    while t.elapsed() < Duration::from_secs(2) && outcome.is_ok() {
        v += 1.0;
        match src.fill(&s, v) {
            Ok(()) => {}
            Err(Error::Capture(_)) => continue,
            Err(e) => return Err(format!("fill: {e}").into()),
        }
        let before = pinned.as_slice()?[n - 1];
        match src.copy_to_host(&s, pinned.as_mut_slice()?) {
            Ok(()) => {
                copies += 1;
                let h = pinned.as_slice()?;
                if h[0] != v || h[n - 1] != v {
                    outcome =
                        Err(format!("copy {copies}: read {} .. {} after filling {v}", h[0], h[n - 1]).into());
                }
            }
            Err(Error::Capture(_)) => {
                refused_copies += 1;
                // Refused before anything was queued: nothing may write into the memory now.
                let now = pinned.as_slice()?[n - 1];
                std::thread::sleep(Duration::from_micros(200));
                let later = pinned.as_slice()?[n - 1];
                if now != before || later != before {
                    outcome = Err(format!(
                        "a refused copy_to_host left the memory being written: {before} before, {now} on return, {later} later"
                    )
                    .into());
                }
            }
            Err(e) => outcome = Err(format!("copy_to_host failed after queueing: {e}").into()),
        }
        for (what, r) in [("synchronize", s.synchronize().map(|_| ())), ("query", s.query().map(|_| ()))] {
            match r {
                Ok(()) => waits += 1,
                Err(Error::Capture(_)) => {}
                Err(e) => outcome = Err(format!("{what}: {e}").into()),
            }
        }
    }
    stop.store(true, Ordering::Relaxed);
    let captures = capturer.join().map_err(|_| "the capturing thread panicked")?;
    outcome?;
    let (begun, refused) = captures?;
    eprintln!(
        "{copies} copies read right, {refused_copies} refused before queueing; {waits} synchronize/query; \
         {begun} captures begun and ended cleanly, {refused} refused"
    );
    ensure(begun >= 10 && copies >= 10, "the two threads interleaved too little to test anything")
}

/// `copy_from_host` from page-locked memory (which the driver copies asynchronously, when the
/// stream reaches the copy) returns only once the copy has read it: changing the memory right
/// after it returns cannot change what arrives. The copy is queued behind a 200 ms kernel, so
/// that without the wait the change would land first. A pageable source is staged by the driver
/// and needs no wait (its time is printed, not checked).
fn pinned_source_is_read_before_copy_from_host_returns() -> TestResult {
    let d = dev()?;
    let s = Stream::new(&d)?;
    let n = 1 << 16;
    let mut gate = DeviceBuffer::<f32>::zeros(&s, 1)?;
    let mut dst = DeviceBuffer::<f32>::filled(&s, n, -1.0)?;
    let mut host = PinnedBuffer::new(&d, n, 0.0f32)?;
    for (i, x) in host.as_mut_slice()?.iter_mut().enumerate() {
        *x = i as f32;
    }
    s.synchronize()?;
    // SAFETY: `gate` is read only through `to_vec` below, which is ordered after the kernel.
    unsafe { SpinWrite { buf: &mut gate, ns: 200_000_000, v: 1.0 }.async_on(&s)? };
    let t = Instant::now();
    dst.copy_from_host(&s, host.as_slice()?)?;
    let waited = t.elapsed();
    host.as_mut_slice()?.fill(7.0);
    let got = dst.to_vec()?;
    let wrong = got.iter().enumerate().filter(|&(i, &x)| x != i as f32).count();
    ensure(
        wrong == 0,
        format!(
            "{wrong} of {n} elements arrived as changed after copy_from_host returned (element 0: {})",
            got[0]
        ),
    )?;
    ensure(
        waited >= Duration::from_millis(150),
        format!("copy_from_host from page-locked memory returned after {waited:?}, before the 200 ms kernel ahead of it ended"),
    )?;
    ensure(gate.to_vec()? == vec![1.0], "the kernel ahead ran")?;
    // SAFETY: as above.
    unsafe { SpinWrite { buf: &mut gate, ns: 200_000_000, v: 2.0 }.async_on(&s)? };
    let page: Vec<f32> = (0..n).map(|i| (2 * i) as f32).collect();
    let t = Instant::now();
    dst.copy_from_host(&s, &page)?;
    let staged = t.elapsed();
    drop(page);
    eprintln!("copy_from_host returned after {waited:?} from page-locked memory, {staged:?} from pageable memory (200 ms kernel ahead of each)");
    let got = dst.to_vec()?;
    ensure(got.iter().enumerate().all(|(i, &x)| x == (2 * i) as f32), "the pageable copy")
}

/// A blocking copy on a stream that is not being captured, made by a thread that is capturing
/// another stream, completes before it returns: the driver refuses a capturing thread's
/// synchronisations (thread-local mode), so the copy's wait is made with the thread's capture mode
/// relaxed for the call (`Stream::sync_for_copy`). Without that, the copy was queued, its wait
/// failed, and `copy_to_host` into page-locked memory returned an error while the copy could still
/// write the caller's slice (found by a review of the 2026-11-28 fix); `copy_from_host` from
/// page-locked memory likewise. A 50 ms kernel queued ahead of the copies keeps them pending when
/// the wait begins. (Whether the driver refuses the plain wait here is what the mutation
/// `scripts/mutations/copy-wait-not-relaxed.patch` shows: with it, this test must fail.)
fn blocking_copies_while_this_thread_captures_another_stream() -> TestResult {
    let d = dev()?;
    let (s, s2) = (Stream::new(&d)?, Stream::new(&d)?);
    let n = 1 << 16;
    let src = DeviceBuffer::<f32>::filled(&s2, n, 3.0)?;
    let mut dst = DeviceBuffer::<f32>::filled(&s2, n, -1.0)?;
    let mut marker = DeviceBuffer::<f32>::zeros(&s2, 1)?;
    let mut pinned = PinnedBuffer::new(&d, n, 0.0f32)?;
    let mut pinned_src = PinnedBuffer::new(&d, n, 5.0f32)?;
    // The test kernel is loaded before the capture (a module load there would be refused).
    SpinWrite { buf: &mut marker, ns: 0, v: 0.0 }.sync_on(&s2)?;
    s.synchronize()?;
    s.begin_capture(CaptureMode::ThreadLocal)?;
    let during = (|| -> TestResult {
        // SAFETY: `marker` is read only through `to_vec` after the capture, ordered after the kernel.
        unsafe { SpinWrite { buf: &mut marker, ns: 50_000_000, v: 1.0 }.async_on(&s2)? };
        match src.copy_to_host(&s2, pinned.as_mut_slice()?) {
            Ok(()) => {
                let h = pinned.as_slice()?;
                ensure(
                    h.iter().all(|&x| x == 3.0),
                    format!("copy_to_host returned with {} .. {}", h[0], h[n - 1]),
                )?;
            }
            Err(Error::Capture(_)) => {
                let h = pinned.as_slice()?;
                ensure(h.iter().all(|&x| x == 0.0), "a refused copy_to_host left data in the memory")?;
                std::thread::sleep(Duration::from_millis(100));
                ensure(pinned.as_slice()?.iter().all(|&x| x == 0.0), "a refused copy_to_host still wrote")?;
            }
            Err(e) => return Err(format!("copy_to_host failed after queueing: {e}").into()),
        }
        // SAFETY: as above.
        unsafe { SpinWrite { buf: &mut marker, ns: 50_000_000, v: 2.0 }.async_on(&s2)? };
        match dst.copy_from_host(&s2, pinned_src.as_slice()?) {
            Ok(()) | Err(Error::Capture(_)) => {}
            Err(e) => return Err(format!("copy_from_host failed after queueing: {e}").into()),
        }
        pinned_src.as_mut_slice()?.fill(9.0);
        Ok(())
    })();
    let ended = s.end_capture();
    during?;
    ended?;
    let got = dst.to_vec()?;
    ensure(
        got.iter().all(|&x| x == 5.0) || got.iter().all(|&x| x == -1.0),
        format!(
            "copy_from_host's destination holds {} .. {}: the source changed under the copy",
            got[0],
            got[n - 1]
        ),
    )?;
    ensure(marker.to_vec()? == vec![2.0], "the kernels ahead of the copies ran")
}

/// A user's event queried, waited on and timed on one thread while another thread records it
/// into captures and eagerly again: every query, wait and timing succeeds or is refused as captured
/// (`Error::Capture`), and every capture ends cleanly. The check of the event's capture tag and the
/// driver call are one step for queries and timings (under the tag lock), and a record into a
/// capture is refused while a wait is in flight; without that, a record between the check and the
/// call made the call fail in the driver and could break the capture (found by the review of
/// 2026-11-28; not yet run on a GPU when written).
fn event_waits_never_meet_a_capture_record() -> TestResult {
    let d = dev()?;
    let (s, s2) = (Stream::new(&d)?, Stream::new(&d)?);
    let ev = Arc::new(Event::new(&d, true)?);
    let start = Event::new(&d, true)?;
    start.record(&s2)?;
    ev.record(&s2)?;
    s2.synchronize()?;
    let stop = Arc::new(AtomicBool::new(false));
    let recorder = {
        let (ev, stop, s, s2) = (ev.clone(), stop.clone(), s.clone(), s2.clone());
        std::thread::spawn(move || -> Result<(u64, u64), String> {
            let (mut captured, mut refused) = (0u64, 0u64);
            while !stop.load(Ordering::Relaxed) {
                match s.begin_capture(CaptureMode::ThreadLocal) {
                    Ok(()) => {
                        match ev.record(&s) {
                            Ok(()) => captured += 1,
                            Err(Error::Capture(_)) => refused += 1,
                            Err(e) => return Err(format!("record into the capture: {e}")),
                        }
                        spin_us(10);
                        s.end_capture().map_err(|e| format!("a capture ended with an error: {e}"))?;
                    }
                    Err(Error::Capture(_)) => {}
                    Err(e) => return Err(format!("begin_capture: {e}")),
                }
                ev.record(&s2).map_err(|e| format!("eager record: {e}"))?;
                spin_us(5);
            }
            Ok((captured, refused))
        })
    };
    let (mut ok, mut refused_here) = (0u64, 0u64);
    let t = Instant::now();
    let mut outcome: TestResult = Ok(());
    while t.elapsed() < Duration::from_secs(2) && outcome.is_ok() {
        for (what, r) in [
            ("query", ev.query().map(|_| ())),
            ("synchronize", ev.synchronize()),
            ("elapsed_ms", Event::elapsed_ms(&start, &ev).map(|_| ())),
        ] {
            match r {
                Ok(()) => ok += 1,
                Err(Error::Capture(_)) => refused_here += 1,
                // A timing may find the eagerly re-recorded event not complete yet.
                Err(Error::Driver { code, .. })
                    if what == "elapsed_ms"
                        && code == cudarc::driver::sys::CUresult::CUDA_ERROR_NOT_READY as u32 => {}
                Err(e) => outcome = Err(format!("{what}: {e}").into()),
            }
        }
    }
    stop.store(true, Ordering::Relaxed);
    let rec = recorder.join().map_err(|_| "the recording thread panicked")?;
    outcome?;
    let (captured, refused) = rec?;
    eprintln!(
        "{ok} queries, waits and timings made, {refused_here} refused as captured; {captured} records into captures, {refused} refused while a wait was in flight"
    );
    ensure(ok >= 10 && captured >= 10, "the two threads interleaved too little to test anything")
}

fn main() {
    if let Ok(mode) = std::env::var(CHILD) {
        let run = if mode == "drop-elsewhere" { drop_elsewhere_child() } else { race_child(&mode) };
        match run {
            Ok(()) => std::process::exit(0),
            Err(e) => {
                eprintln!("race child: {e:?}");
                std::process::exit(1)
            }
        }
    }
    let mut s = Suite::new();
    s.gpu("pooled_event_from_a_capture_is_not_recycled", pooled_event_from_a_capture_is_not_recycled)
        .gpu("captured_event_stays_refused_until_re_recorded", captured_event_stays_refused_until_re_recorded)
        .gpu("event_nodes_cannot_join_an_open_capture", event_nodes_cannot_join_an_open_capture)
        .gpu("captured_graph_keeps_its_kernels_loaded", captured_graph_keeps_its_kernels_loaded)
        .gpu("device_sync_refused_during_a_capture", device_sync_refused_during_a_capture)
        .gpu_alone("capture_waits_for_an_inflight_device_sync", capture_waits_for_an_inflight_device_sync)
        .gpu_alone("device_sync_racing_captures_does_not_crash", device_sync_racing_captures_does_not_crash)
        .gpu(
            "shared_op_first_run_inside_a_capture_is_refused",
            shared_op_first_run_inside_a_capture_is_refused,
        )
        .gpu("stream_dropped_mid_capture_ends_its_capture", stream_dropped_mid_capture_ends_its_capture)
        .gpu("page_locked_memory_on_a_capturing_thread", page_locked_memory_on_a_capturing_thread)
        .gpu(
            "capturing_stream_dropped_on_another_thread_keeps_the_gate_closed",
            capturing_stream_dropped_on_another_thread_keeps_the_gate_closed,
        )
        .gpu_alone("blocking_waits_never_meet_a_capture", blocking_waits_never_meet_a_capture)
        .gpu(
            "pinned_source_is_read_before_copy_from_host_returns",
            pinned_source_is_read_before_copy_from_host_returns,
        )
        .gpu(
            "blocking_copies_while_this_thread_captures_another_stream",
            blocking_copies_while_this_thread_captures_another_stream,
        )
        .gpu_alone("event_waits_never_meet_a_capture_record", event_waits_never_meet_a_capture_record);
    s.run()
}

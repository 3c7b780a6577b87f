//! GPU suite for `cuda_core::interop`: a cudarc `CudaSlice` wrapped as a `DeviceBuffer`, used by
//! this project's ops and handed back (ordered with cudarc's stream on both sides); a raw device
//! pointer wrapped with an owner that is released only after the last use (also when a graph
//! recorded work on it); the wrap's argument checks.
//! Ignored without a GPU; fails without one when CUDA_ASYNC_REQUIRE_GPU=1.

use cuda_async::{CudaGraph, DeviceOpExt};
use cuda_async_tests::ops::SpinWrite;
use cuda_async_tests::{assert_close, ensure, random_f32, rng, Suite, TestResult, POISON_F32};
use cuda_core::{Device, DeviceBuffer, Stream};
use cudarc::driver::{sys, CudaContext};
use kernels::ops;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn f64s(v: &[f32]) -> Vec<f64> {
    v.iter().map(|&e| e as f64).collect()
}

fn ctx() -> Result<Arc<CudaContext>, String> {
    CudaContext::new(0).map_err(|e| e.to_string())
}

/// cudarc uploads behind a slow kernel on its stream; wrapping orders our use after the upload;
/// a slow write of ours, then the hand-back orders cudarc's download after it.
fn cudarc_round_trip() -> TestResult {
    let d = Device::new(0)?;
    let ctx = ctx()?;
    let (sa, sb) = (Stream::new(&d)?, Stream::new(&d)?);
    // SAFETY: `sa` outlives `cs` and everything cudarc queues on it (declared first, dropped last);
    // the buffers shared between the libraries are ordered by the wrap and the hand-back.
    let cs = unsafe { sa.as_cudarc(&ctx)? };
    let mut busy = DeviceBuffer::<f32>::zeros(&sa, 1 << 16)?;
    // SAFETY: `busy` is never read on the host.
    unsafe { SpinWrite { buf: &mut busy, ns: 50_000_000, v: 1.0 }.async_on(&sa)? };
    let n = 1 << 20;
    let xh = random_f32(&mut rng(), n);
    let slice = cs.clone_htod(&xh).map_err(|e| e.to_string())?; // queued behind the spin
                                                                // SAFETY: nothing else touches `slice` while it is wrapped.
    let mut wrapped = unsafe { DeviceBuffer::from_cudarc(slice, &sb)? };
    let mut out = DeviceBuffer::filled(&sb, n, POISON_F32)?;
    ops::scale(&wrapped, 2.0f32, &mut out).sync_on(&sb)?;
    assert_close(&out.to_vec()?, &f64s(&xh).iter().map(|v| 2.0 * v).collect::<Vec<_>>(), 0.0)?;
    // SAFETY: `wrapped` is read on the host only through cudarc, after the hand-back's ordering.
    unsafe { SpinWrite { buf: &mut wrapped, ns: 50_000_000, v: 3.0 }.async_on(&sb)? };
    let slice = wrapped.into_cudarc()?;
    let back = cs.clone_dtoh(&slice).map_err(|e| e.to_string())?;
    ensure(back.iter().all(|&v| v == 3.0), "cudarc's download ran after our write")?;
    drop(slice);
    sa.synchronize()?;
    Ok(())
}

/// Owns a raw `cuMemAlloc` allocation; records when it is freed.
struct RawAlloc {
    ptr: sys::CUdeviceptr,
    freed: Arc<AtomicBool>,
}

impl Drop for RawAlloc {
    fn drop(&mut self) {
        if let Ok(ctx) = CudaContext::new(0) {
            let _ = ctx.bind_to_thread();
            // SAFETY: our own allocation, freed once, with its (primary) context bound.
            let _ = unsafe { cudarc::driver::result::free_sync(self.ptr) };
        }
        self.freed.store(true, Ordering::SeqCst);
    }
}

fn raw_alloc(bytes: usize) -> Result<RawAlloc, String> {
    ctx()?.bind_to_thread().map_err(|e| e.to_string())?;
    // SAFETY: the primary context is bound; freed by `RawAlloc`'s drop.
    let ptr = unsafe { cudarc::driver::result::malloc_sync(bytes) }.map_err(|e| e.to_string())?;
    Ok(RawAlloc { ptr, freed: Arc::new(AtomicBool::new(false)) })
}

fn wait_for(flag: &AtomicBool, within: Duration) -> bool {
    let start = Instant::now();
    while !flag.load(Ordering::SeqCst) && start.elapsed() < within {
        std::thread::sleep(Duration::from_millis(2));
    }
    flag.load(Ordering::SeqCst)
}

/// A raw pointer with its owner: used by ops, handed back with an event, read by cudarc.
fn raw_round_trip() -> TestResult {
    let s = Stream::new(&Device::new(0)?)?;
    let n = 100_001;
    let owner = raw_alloc(n * 4)?;
    let (ptr, freed) = (owner.ptr, owner.freed.clone());
    // SAFETY: `ptr` is a fresh primary-context allocation of n f32, owned by `owner`, touched
    // only through the buffer while wrapped.
    let mut buf = unsafe { DeviceBuffer::<f32>::from_raw_parts(ptr, n, &s, owner)? };
    ops::fill(&mut buf, 1.5f32).sync_on(&s)?;
    // SAFETY: read on the host only after the returned event.
    unsafe { SpinWrite { buf: &mut buf, ns: 30_000_000, v: 2.5 }.async_on(&s)? };
    let owner = buf.into_owner::<RawAlloc>()?;
    ensure(!freed.load(Ordering::SeqCst), "handing back does not release the owner")?;
    let mut host = vec![0.0f32; n];
    // SAFETY: `owner.ptr` holds n f32 and every use of ours completed (`into_owner` waited).
    unsafe { cudarc::driver::result::memcpy_dtoh_sync(&mut host, owner.ptr) }.map_err(|e| e.to_string())?;
    ensure(host.iter().all(|&v| v == 2.5), "the hand-back waited for every use")?;
    drop(owner);
    ensure(freed.load(Ordering::SeqCst), "the owner was handed back")?;

    // The unsynced hand-back: the owner at once, with an event behind every use.
    let owner = raw_alloc(n * 4)?;
    let ptr = owner.ptr;
    // SAFETY: as above.
    let mut buf = unsafe { DeviceBuffer::<f32>::from_raw_parts(ptr, n, &s, owner)? };
    // SAFETY: read on the host only after the returned event.
    unsafe { SpinWrite { buf: &mut buf, ns: 30_000_000, v: 4.5 }.async_on(&s)? };
    // SAFETY: the memory is read (and freed, by the owner's drop) only after the event completed.
    let (owner, ev) = unsafe { buf.into_owner_unsynced::<RawAlloc>()? };
    ev.synchronize()?;
    // SAFETY: `owner.ptr` holds n f32 and every use of ours completed (the event).
    unsafe { cudarc::driver::result::memcpy_dtoh_sync(&mut host, owner.ptr) }.map_err(|e| e.to_string())?;
    ensure(host.iter().all(|&v| v == 4.5), "the event covers every use")
}

/// Safe code may drop a handed-back owner at once: `into_owner` returns a cudarc slice only after
/// a slow kernel of ours on it has completed, so cudarc's reads on its own (unordered) stream see
/// the kernel's values and its free (and a fresh allocation reusing the memory) cannot race the
/// kernel. Mutation caught: `into_owner` returning before the uses complete (cudarc reads zeros,
/// and the kernel's late write corrupts the fresh allocation).
fn owner_handed_back_after_uses() -> TestResult {
    let ctx = ctx()?;
    let cs = ctx.new_stream().map_err(|e| e.to_string())?;
    let s = Stream::new(&Device::new(0)?)?;
    let n = 1 << 16;
    let slice = cs.alloc_zeros::<f32>(n).map_err(|e| e.to_string())?;
    // SAFETY: nothing else touches `slice` while it is wrapped; device 0's primary context.
    let mut buf = unsafe { DeviceBuffer::from_cudarc(slice, &s)? };
    // SAFETY: `buf` is read on the host only through cudarc, after the hand-back.
    unsafe { SpinWrite { buf: &mut buf, ns: 100_000_000, v: 9.0 }.async_on(&s)? };
    let slice = buf.into_owner::<cudarc::driver::CudaSlice<f32>>()?;
    // cudarc's stream never waited for ours: only the hand-back's own wait orders this read.
    let seen = cs.clone_dtoh(&slice).map_err(|e| e.to_string())?;
    ensure(seen.iter().all(|&v| v == 9.0), "the owner came back after the kernel completed")?;
    drop(slice); // freed on cudarc's stream
    let fresh = cs.clone_htod(&vec![1.0f32; n]).map_err(|e| e.to_string())?;
    s.synchronize()?;
    let back = cs.clone_dtoh(&fresh).map_err(|e| e.to_string())?;
    ensure(back.iter().all(|&v| v == 1.0), "no late write of ours reached reused memory")
}

/// Dropped while a slow kernel still writes it, the owner is released only after the kernel;
/// recorded into a graph, only after the graph is gone.
fn owner_released_after_last_use() -> TestResult {
    let s = Stream::new(&Device::new(0)?)?;
    let n = 4096;
    let owner = raw_alloc(n * 4)?;
    let (ptr, freed) = (owner.ptr, owner.freed.clone());
    // SAFETY: as in `raw_round_trip`.
    let mut buf = unsafe { DeviceBuffer::<f32>::from_raw_parts(ptr, n, &s, owner)? };
    // SAFETY: never read on the host.
    unsafe { SpinWrite { buf: &mut buf, ns: 200_000_000, v: 1.0 }.async_on(&s)? };
    drop(buf);
    std::thread::sleep(Duration::from_millis(20));
    ensure(!freed.load(Ordering::SeqCst), "released while the kernel still ran")?;
    s.synchronize()?;
    ensure(wait_for(&freed, Duration::from_secs(5)), "released after the last use")?;

    let owner = raw_alloc(n * 4)?;
    let (ptr, freed) = (owner.ptr, owner.freed.clone());
    // SAFETY: as in `raw_round_trip`.
    let buf = unsafe { DeviceBuffer::<f32>::from_raw_parts(ptr, n, &s, owner)? };
    kernels::Kernels::get(s.device())?;
    let mut graph = CudaGraph::scope(&s, |scope| scope.record(ops::fill(buf, 4.0f32)))?;
    graph.launch().sync_on(&s)?;
    let buf = graph.take_output().ok_or("the graph's output")?;
    ensure(buf.to_vec()?.iter().all(|&v| v == 4.0), "the graph wrote the wrapped memory")?;
    drop(buf);
    graph.launch().sync_on(&s)?; // the graph still writes the memory: it must be alive
    std::thread::sleep(Duration::from_millis(20));
    ensure(!freed.load(Ordering::SeqCst), "released while a graph could still replay")?;
    drop(graph);
    s.synchronize()?;
    ensure(wait_for(&freed, Duration::from_secs(5)), "released once the graph is gone")
}

/// The wrap's checks: null and misaligned pointers, and a hand-back with the wrong owner type.
fn wrap_checks() -> TestResult {
    let s = Stream::new(&Device::new(0)?)?;
    // SAFETY: refused before any use.
    let null = unsafe { DeviceBuffer::<f32>::from_raw_parts(0, 4, &s, ()) };
    ensure(matches!(null, Err(cuda_core::Error::InvalidArgument(_))), "a null pointer is refused")?;
    let owner = raw_alloc(64)?;
    // SAFETY: refused before any use (misaligned for f64).
    let odd = unsafe { DeviceBuffer::<f64>::from_raw_parts(owner.ptr + 4, 2, &s, ()) };
    ensure(matches!(odd, Err(cuda_core::Error::InvalidArgument(_))), "a misaligned pointer is refused")?;
    // Aligned for the type but not to 16 bytes: the crate's kernels load 16 bytes at a time.
    // SAFETY: refused before any use.
    let short = unsafe { DeviceBuffer::<half::bf16>::from_raw_parts(owner.ptr + 2, 8, &s, ()) };
    ensure(
        matches!(short, Err(cuda_core::Error::InvalidArgument(_))),
        "a pointer not 16-byte aligned is refused (cuda_core::interop::WRAP_ALIGN)",
    )?;
    let freed = owner.freed.clone();
    // SAFETY: a live allocation of 16 f32 owned by `owner`.
    let buf = unsafe { DeviceBuffer::<f32>::from_raw_parts(owner.ptr, 16, &s, owner)? };
    let wrong = buf.into_owner::<String>();
    ensure(wrong.is_err(), "the wrong owner type is refused")?;
    s.synchronize()?;
    ensure(wait_for(&freed, Duration::from_secs(5)), "the refused buffer still released its owner")
}

/// A cudarc stream under a capture begun through cudarc's safe `begin_capture` cannot be waited
/// for: the wait would pull our stream into cudarc's capture, so that our allocations, copies and
/// launches would be recorded into cudarc's graph instead of run. Refused, and our stream keeps
/// running work while cudarc's capture is open. Mutation caught: the wait queued anyway (our
/// stream then captures: the upload's synchronisation below fails).
fn cudarc_capture_not_joined() -> TestResult {
    let ctx = ctx()?;
    let cs = ctx.new_stream().map_err(|e| e.to_string())?;
    let s = Stream::new(&Device::new(0)?)?;
    let mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
    cs.begin_capture(mode).map_err(|e| e.to_string())?;
    let refused = s.wait_for_cudarc(&cs);
    let refused_order = s.order_cudarc_after(&cs);
    let xh = random_f32(&mut rng(), 4099);
    let used = DeviceBuffer::from_host(&s, &xh).and_then(|x| x.to_vec());
    let graph = cs.end_capture(sys::CUgraphInstantiate_flags(0)).map_err(|e| e.to_string())?;
    drop(graph);
    ensure(
        matches!(refused, Err(cuda_core::Error::Capture(_))),
        format!("waiting for a capturing cudarc stream is refused, got {refused:?}"),
    )?;
    ensure(
        matches!(refused_order, Err(cuda_core::Error::Capture(_))),
        format!("ordering a capturing cudarc stream after ours is refused, got {refused_order:?}"),
    )?;
    ensure(used.ok() == Some(xh), "our stream ran its work outside cudarc's capture")?;
    // Once cudarc's capture has ended, both directions work again.
    s.wait_for_cudarc(&cs)?;
    s.order_cudarc_after(&cs)?;
    cs.synchronize().map_err(|e| e.to_string())?;
    s.synchronize()?;
    Ok(())
}

/// Handing a buffer back to cudarc while the slice's stream is under a capture begun through
/// cudarc's safe `begin_capture` is refused with `Error::Capture`, before any wait is queued into
/// that capture: cudarc's capture stays valid (its end succeeds). Mutation caught: the wait
/// queued anyway (a wait on an event recorded outside the capture: the driver refuses it and
/// invalidates cudarc's capture, so `end_capture` fails, and the hand-back fails with a driver
/// error instead of `Error::Capture`).
fn into_cudarc_refused_while_cudarc_captures() -> TestResult {
    let ctx = ctx()?;
    let cs = ctx.new_stream().map_err(|e| e.to_string())?;
    let s = Stream::new(&Device::new(0)?)?;
    let slice = cs.clone_htod(&[1.0f32; 64]).map_err(|e| e.to_string())?;
    // SAFETY: nothing else touches `slice` while it is wrapped.
    let mut buf = unsafe { DeviceBuffer::from_cudarc(slice, &s)? };
    // A use that outlasts cudarc's capture: the refused slice is released after it, not during
    // the capture (where cudarc's free would be recorded).
    // SAFETY: `buf` is never read on the host.
    unsafe { SpinWrite { buf: &mut buf, ns: 50_000_000, v: 2.0 }.async_on(&s)? };
    let mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
    cs.begin_capture(mode).map_err(|e| e.to_string())?;
    let refused = buf.into_cudarc();
    let ended = cs.end_capture(sys::CUgraphInstantiate_flags(0)).map(drop).map_err(|e| e.to_string());
    ensure(
        matches!(refused, Err(cuda_core::Error::Capture(_))),
        format!("handing back to a capturing cudarc stream is refused, got {:?}", refused.map(|_| ())),
    )?;
    ensure(ended.is_ok(), format!("cudarc's capture was left valid, got {ended:?}"))?;
    s.synchronize()?;
    cs.synchronize().map_err(|e| e.to_string())?;
    Ok(())
}

/// As above, but with no use of ours outlasting cudarc's capture, so that the slice's drop comes
/// (on the reaper) while cudarc's capture is still open: once for a hand-back refused there, once
/// for a wrapped buffer simply dropped there. Found by review: that drop ran cudarc's free on the
/// slice's stream, into the user's capture. Now the slice is leaked while its stream is captured
/// (one drop error counted each time, awaited before the capture ends, so the drop provably came
/// during it), and cudarc's capture ends cleanly. Mutation: `refused-slice-freed-in-capture`
/// (the slice dropped without the check), and `drop-leak-uncounted` (only driver errors counted:
/// the first GPU run found the leak, an `Error::Capture`, uncounted, and this test failing).
fn refused_slice_is_not_freed_into_cudarcs_capture() -> TestResult {
    let ctx = ctx()?;
    let cs = ctx.new_stream().map_err(|e| e.to_string())?;
    let s = Stream::new(&Device::new(0)?)?;
    let modes = [
        sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED,
        sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
    ];
    for mode in modes {
        for hand_back in [true, false] {
            let what =
                format!("{mode:?}, {}", if hand_back { "refused hand-back" } else { "dropped buffer" });
            let slice = cs.clone_htod(&[1.0f32; 64]).map_err(|e| e.to_string())?;
            cs.synchronize().map_err(|e| e.to_string())?;
            // SAFETY: nothing else touches `slice` while it is wrapped.
            let buf = unsafe { DeviceBuffer::from_cudarc(slice, &s)? };
            s.synchronize()?;
            let before = cuda_core::drop_errors().0;
            cs.begin_capture(mode).map_err(|e| e.to_string())?;
            let refused = if hand_back {
                Some(buf.into_cudarc())
            } else {
                drop(buf);
                None
            };
            // The reaper drops the slice during the capture (our use of it is complete): one drop
            // error, the leak, is counted.
            let t = Instant::now();
            while cuda_core::drop_errors().0 == before && t.elapsed() < Duration::from_secs(5) {
                std::thread::sleep(Duration::from_millis(1));
            }
            let counted = cuda_core::drop_errors().0 - before;
            let ended = cs.end_capture(sys::CUgraphInstantiate_flags(0)).map(drop).map_err(|e| e.to_string());
            if let Some(refused) = refused {
                ensure(
                    matches!(refused, Err(cuda_core::Error::Capture(_))),
                    format!("{what}: refused, got {:?}", refused.map(|_| ())),
                )?;
            }
            ensure(
                counted == 1,
                format!("{what}: the leak during the capture counted {counted} drop errors"),
            )?;
            ensure(ended.is_ok(), format!("{what}: cudarc's capture was left valid, got {ended:?}"))?;
            cs.synchronize().map_err(|e| e.to_string())?;
        }
    }
    Ok(())
}

/// Found by review: `Device::bind` trusted its record of the last bind, so after cudarc's safe
/// `CudaContext::new_non_primary` (which makes its own context current) a stream, event or module
/// created by this crate landed in cudarc's context, labelled as device 0's, and dangled once that
/// context was destroyed. They must land in device 0's primary context and outlive cudarc's.
fn objects_land_in_our_context_after_cudarc_switches_it() -> TestResult {
    let d = Device::new(0)?;
    let warm = Stream::new(&d)?; // this thread's bind record now says "ours"
    let foreign = CudaContext::new_non_primary(0, 0).map_err(|e| e.to_string())?;
    let cur = cudarc::driver::result::ctx::get_current().map_err(|e| e.to_string())?;
    ensure(cur.is_some_and(|c| c != d.cu_context()), "cudarc did not make its own context current")?;
    let s = Stream::new(&d)?;
    let mut ctx: sys::CUcontext = std::ptr::null_mut();
    // SAFETY: `s` is a live stream; `ctx` is a valid out-pointer.
    unsafe { sys::cuStreamGetCtx(s.raw(), &mut ctx) }.result().map_err(|e| e.to_string())?;
    ensure(
        ctx == d.cu_context(),
        "a stream created after cudarc's switch is not in device 0's primary context",
    )?;
    let ev = cuda_core::Event::new(&d, false)?;
    let x = DeviceBuffer::filled(&s, 4096, 1.5f32)?;
    drop(foreign); // destroys cudarc's context
    let mut y = DeviceBuffer::filled(&s, 4096, POISON_F32)?;
    ops::scale(&x, 2.0f32, &mut y).sync_on(&s)?;
    ev.record(&s)?;
    ev.synchronize()?;
    ensure(y.to_vec()?.iter().all(|&v| v == 3.0), "work on the stream after cudarc's context is gone")?;
    warm.synchronize()?;
    Ok(())
}

/// Every call binds the device's context first (`Device::bind`), also the calls that only use
/// existing handles, which the driver would run in their handles' context anyway: with cudarc's
/// own context made current before each of them, each call runs, gives the right result and
/// leaves the device's context current. (Skipping the bind on those calls, tried in `86a4058`,
/// fails here.) Rounds with ours current first, so that the last round creates nothing.
fn every_call_binds_while_another_context_is_current() -> TestResult {
    let d = Device::new(0)?;
    let (s, s2) = (Stream::new(&d)?, Stream::new(&d)?);
    let n = 4096;
    let x = DeviceBuffer::filled(&s, n, 1.5f32)?;
    let mut y = DeviceBuffer::filled(&s, n, POISON_F32)?;
    let mut z = DeviceBuffer::filled(&s, n, POISON_F32)?;
    let ev = cuda_core::Event::new(&d, false)?;
    let g = CudaGraph::scope(&s, |sc| Ok(sc.record_param(ops::scale(&x, 1.0f32, &mut z))?.1))?;
    let factor = g.output().cloned().ok_or("no parameter handle")?;
    let foreign = CudaContext::new_non_primary(0, 0).map_err(|e| e.to_string())?;
    d.bind()?; // cuCtxCreate made cudarc's context current: the first rounds start from ours
    let current = || cudarc::driver::result::ctx::get_current().map_err(|e| e.to_string());
    for round in 0..4 {
        let last = round == 3;
        // In the last round: cudarc's context current before each call, ours after it.
        let theirs = || -> TestResult {
            if last {
                foreign.bind_to_thread().map_err(|e| e.to_string())?;
                ensure(current()? == Some(foreign.cu_ctx()), "cudarc's context is not current")?;
            }
            Ok(())
        };
        let ours = |call: &str| -> TestResult {
            if last {
                ensure(current()? == Some(d.cu_context()), format!("{call} left another context current"))?;
            }
            Ok(())
        };
        // On another stream than the buffers' home: a cross-stream wait before, a mark after.
        theirs()?;
        ops::scale(&x, 2.0f32, &mut y).sync_on(&s2)?;
        ours("a launch and its synchronize")?;
        theirs()?;
        ev.record(&s2)?;
        ours("Event::record")?;
        theirs()?;
        s.wait_event(&ev)?;
        ours("Stream::wait_event")?;
        theirs()?;
        ev.synchronize()?;
        ours("Event::synchronize")?;
        theirs()?;
        ensure(ev.query()?, "the recorded event is not complete after its synchronize")?;
        ours("Event::query")?;
        theirs()?;
        g.set_param(&factor, 3.0f32)?;
        ours("CudaGraph::set_param")?;
        theirs()?;
        g.launch().sync_on(&s)?;
        ours("a graph launch and its synchronize")?;
        theirs()?;
        s.synchronize()?;
        ours("Stream::synchronize")?;
        theirs()?;
        ensure(s2.query()?, "the stream is not idle after its synchronize")?;
        ours("Stream::query")?;
    }
    ensure(y.to_vec()?.iter().all(|&v| v == 3.0), "the launch with cudarc's context current")?;
    drop(g);
    ensure(
        z.to_vec()?.iter().all(|&v| v == 4.5),
        "the replay, its factor set with cudarc's context current",
    )?;
    drop(foreign);
    Ok(())
}

/// A thread whose current context is destroyed under it: cudarc's safe `CudaContext` (a context
/// of its own) is made current here, then its last handle is dropped on another thread, which
/// destroys it (cudarc's drop binds it there first). This thread's current context is then a dead
/// one. Every call of this crate must still work here: it binds the device's context before
/// each call (`Device::bind`), whatever the thread had current.
fn calls_after_the_current_context_is_destroyed_elsewhere() -> TestResult {
    let d = Device::new(0)?;
    let s = Stream::new(&d)?;
    let n = 4096;
    let x = DeviceBuffer::filled(&s, n, 1.5f32)?;
    let mut y = DeviceBuffer::filled(&s, n, POISON_F32)?;
    ops::scale(&x, 2.0f32, &mut y).sync_on(&s)?; // the kernel's module is loaded: nothing to create
    ensure(y.to_vec()?.iter().all(|&v| v == 3.0), "before the switch")?;
    for call in 0..3 {
        let foreign = CudaContext::new_non_primary(0, 0).map_err(|e| e.to_string())?;
        foreign.bind_to_thread().map_err(|e| e.to_string())?;
        let dead = foreign.cu_ctx();
        std::thread::spawn(move || drop(foreign)).join().map_err(|_| "the dropping thread panicked")?;
        // The scenario happened: the context current here is dead (documented: using it fails
        // with CUDA_ERROR_CONTEXT_IS_DESTROYED).
        // SAFETY: no pointer arguments; it only reports on the current context.
        let sync = unsafe { sys::cuCtxSynchronize() };
        ensure(
            sync != sys::CUresult::CUDA_SUCCESS,
            "cudarc's context was not destroyed (a synchronize of the current context succeeded)",
        )?;
        // What the driver now reports as current here (the dead handle, none, or an error).
        let now = cudarc::driver::result::ctx::get_current();
        eprintln!(
            "call {call}: current after the destruction: {}",
            match now {
                Ok(Some(c)) if c == dead => "the destroyed context".to_string(),
                Ok(Some(_)) => "another context".to_string(),
                Ok(None) => "none".to_string(),
                Err(e) => format!("an error ({e})"),
            }
        );
        let f = 4.0 + call as f32;
        match call {
            // A call on existing handles first.
            0 => {
                ops::scale(&x, f, &mut y).sync_on(&s)?;
            }
            // A creating call first: the stream must land in the device's primary context.
            1 => {
                let s2 = Stream::new(&d)?;
                let mut ctx: sys::CUcontext = std::ptr::null_mut();
                // SAFETY: `s2` is a live stream; `ctx` is a valid out-pointer.
                unsafe { sys::cuStreamGetCtx(s2.raw(), &mut ctx) }.result().map_err(|e| e.to_string())?;
                ensure(
                    ctx == d.cu_context(),
                    "a stream created after the destruction is not in device 0's context",
                )?;
                ops::scale(&x, f, &mut y).sync_on(&s2)?;
                s2.synchronize()?;
            }
            // An awaited op.
            _ => {
                let rt = tokio::runtime::Builder::new_current_thread().enable_time().build()?;
                rt.block_on(ops::scale(&x, f, &mut y).on(&s))?;
            }
        }
        let want = 1.5 * f;
        ensure(y.to_vec()?.iter().all(|&v| v == want), format!("call {call}: every y equals {want}"))?;
    }
    Ok(())
}

fn main() {
    let mut s = Suite::new();
    s.gpu("cudarc_round_trip", cudarc_round_trip)
        .gpu("raw_round_trip", raw_round_trip)
        .gpu("owner_released_after_last_use", owner_released_after_last_use)
        .gpu("wrap_checks", wrap_checks)
        .gpu("owner_handed_back_after_uses", owner_handed_back_after_uses)
        .gpu("cudarc_capture_not_joined", cudarc_capture_not_joined)
        .gpu("into_cudarc_refused_while_cudarc_captures", into_cudarc_refused_while_cudarc_captures)
        .gpu(
            "refused_slice_is_not_freed_into_cudarcs_capture",
            refused_slice_is_not_freed_into_cudarcs_capture,
        )
        .gpu(
            "objects_land_in_our_context_after_cudarc_switches_it",
            objects_land_in_our_context_after_cudarc_switches_it,
        )
        .gpu(
            "every_call_binds_while_another_context_is_current",
            every_call_binds_while_another_context_is_current,
        )
        .gpu(
            "calls_after_the_current_context_is_destroyed_elsewhere",
            calls_after_the_current_context_is_destroyed_elsewhere,
        );
    s.run()
}

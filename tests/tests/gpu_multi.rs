//! GPU suite for several devices: enumeration, peer access, copies between devices (direct,
//! host-staged, same device), NCCL collectives (per rank, grouped, captured), and misuse.
//!
//! What one GPU can and cannot show: the one-GPU tests run on any GPU (the staged path forced on
//! one device; NCCL on a **one-rank** communicator). With one rank every collective is a copy of
//! the input (sum, max, min and product of one value are that value; a gather of one block is the
//! block), so the `one_rank_smoke_*` tests check API plumbing only (lengths, dtypes accepted,
//! grouping, capture and the communicator's lifetime): a wrong reduction operator, a wrong dtype
//! mapping or a dropped communicator would pass them. Reductions across ranks are checked only by
//! the two-GPU tests (`all_reduce_two_devices`, `captured_all_reduce_two_devices`,
//! `collectives_two_devices`: every operator and collective with values that tell them apart, in
//! seven dtypes), which are reported as ignored (`SKIPPED (needs 2 GPUs, found N)`) on a machine
//! with fewer. Ignored without a GPU; fails without one when CUDA_ASYNC_REQUIRE_GPU=1.

use cuda_async::{memory, nccl as ops, CudaGraph, DeviceOpExt};
use cuda_async_tests::{ensure, random_f32, rng, Suite, TestResult, POISON_F32};
use cuda_core::memory::PeerCopyOptions;
use cuda_core::nccl::{grouped, Collective, Communicator, NcclScalar, ReduceOp};
use cuda_core::{CaptureMode, Device, DeviceBuffer, Error, InstantiateFlags, PeerPath, Stream};
use half::{bf16, f16};

const N: usize = (1 << 20) + 7;
const STAGED: PeerCopyOptions = PeerCopyOptions { force_staged: true };

fn dev(i: usize) -> Result<Device, Error> {
    Device::new(i)
}

fn device_enumeration() -> TestResult {
    let n = Device::count()?;
    let all = Device::all()?;
    ensure(n >= 1 && all.len() == n, format!("count {n}, all {}", all.len()))?;
    for (i, d) in all.iter().enumerate() {
        ensure(d.ordinal() == i, "ordinal order")?;
        ensure(!d.can_access_peer(d)?, "a device is not its own peer")?;
        d.enable_peer_access(d)?; // a no-op on itself
        for p in all.iter().filter(|p| *p != d) {
            let can = p.can_access_peer(d)?;
            eprintln!("device {} -> {}: peer access {}", p.ordinal(), d.ordinal(), can);
            if can {
                p.enable_peer_access(d)?;
                p.enable_peer_access(d)?; // idempotent
            }
        }
    }
    Ok(())
}

/// A copy through the peer API between two streams of one device, direct and forced through host
/// memory; then a write of the source queued right after must not change what was copied.
fn peer_copy_one_device() -> TestResult {
    let d = dev(0)?;
    let (sa, sb) = (d.new_stream()?, d.new_stream()?);
    let host = random_f32(&mut rng(), N);
    for (opts, want) in [(PeerCopyOptions::default(), PeerPath::SameDevice), (STAGED, PeerPath::Staged)] {
        let mut src = DeviceBuffer::from_host(&sa, &host)?;
        let mut dst = DeviceBuffer::<f32>::filled(&sb, N, POISON_F32)?;
        let path = dst.copy_from_peer_with(&sb, &src, opts)?;
        ensure(path == want, format!("path {path:?}, expected {want:?}"))?;
        src.fill(&sa, 0.0)?; // must wait for the copy's read
        ensure(dst.to_vec()? == host, format!("{want:?}: copy differs from the source"))?;
        ensure(src.to_vec()?.iter().all(|&v| v == 0.0), "the write after the copy")?;
    }
    // Through the cuda-async op, into a poisoned buffer.
    let src = DeviceBuffer::from_host(&sa, &host)?;
    let mut dst = DeviceBuffer::<f32>::filled(&sb, N, POISON_F32)?;
    memory::copy_peer(&src, &mut dst).sync_on(&sb)?;
    ensure(dst.to_vec()? == host, "copy_peer op")
}

/// Misuse on one device: lengths, a capturing stream, bad communicator groups and shapes.
fn misuse_one_device() -> TestResult {
    let d = dev(0)?;
    let s = d.new_stream()?;
    let a = DeviceBuffer::<f32>::zeros(&s, 8)?;
    let mut b = DeviceBuffer::<f32>::zeros(&s, 9)?;
    let r = b.copy_from_peer(&s, &a);
    ensure(matches!(r, Err(Error::LengthMismatch { .. })), format!("length: {r:?}"))?;
    let mut c = DeviceBuffer::<f32>::zeros(&s, 8)?;
    s.begin_capture(CaptureMode::ThreadLocal)?;
    let r = c.copy_from_peer_with(&s, &a, STAGED);
    let graph = s.end_capture()?;
    ensure(matches!(r, Err(Error::Capture(_))), format!("staged copy under capture: {r:?}"))?;
    ensure(graph.node_count()? == 0, "nothing recorded")?;
    let r = Communicator::init_all(&[d, d]);
    ensure(matches!(r, Err(Error::InvalidArgument(_))), format!("duplicate device: {r:?}"))?;
    ensure(matches!(Communicator::init_all(&[]), Err(Error::InvalidArgument(_))), "empty group")?;
    let comm = Communicator::init_all(&[d])?.remove(0);
    let r = comm.all_reduce(&s, &a, &mut b, ReduceOp::Sum);
    ensure(matches!(r, Err(Error::LengthMismatch { .. })), format!("all-reduce lengths: {r:?}"))?;
    let r = comm.broadcast(&s, &a, &mut c, 1);
    ensure(matches!(r, Err(Error::InvalidArgument(_))), format!("root: {r:?}"))?;
    let mut ranks = [grouped::Rank { comm: &comm, stream: &s, send: &a, recv: &mut c }];
    s.begin_capture(CaptureMode::ThreadLocal)?;
    let r = grouped::all_reduce(&mut ranks, ReduceOp::Sum);
    s.end_capture()?;
    ensure(matches!(r, Err(Error::Capture(_))), format!("grouped under capture: {r:?}"))?;
    let r = grouped::run::<f32>(Collective::AllGather, &mut []);
    ensure(matches!(r, Err(Error::InvalidArgument(_))), format!("no ranks: {r:?}"))?;
    // The group is still usable after all of that.
    let x = DeviceBuffer::from_host(&s, &[1.0f32, 2.0])?;
    let mut y = DeviceBuffer::<f32>::zeros(&s, 2)?;
    comm.all_reduce(&s, &x, &mut y, ReduceOp::Sum)?;
    ensure(y.to_vec()? == vec![1.0, 2.0], "usable after the errors")
}

/// One-rank smoke test: every collective on a one-rank communicator is a copy, checked against
/// the host values, with the output poisoned first, per rank, grouped and through the ops. Shows
/// that the calls are made with the right buffers and lengths; cannot tell one reduction operator
/// or (beyond the element size) one dtype from another: see `collectives_two_devices`.
fn one_rank_smoke_collectives() -> TestResult {
    let d = dev(0)?;
    let s = d.new_stream()?;
    let comm = Communicator::init_all(&[d])?.remove(0);
    ensure(comm.size() == 1 && comm.rank() == 0 && comm.device() == &d, format!("{comm:?}"))?;
    eprintln!("NCCL {:?}", cuda_core::nccl::version()?);
    let host = random_f32(&mut rng(), N);
    let x = DeviceBuffer::from_host(&s, &host)?;
    let kinds = [
        Collective::AllReduce(ReduceOp::Sum),
        Collective::AllReduce(ReduceOp::Max),
        Collective::AllGather,
        Collective::ReduceScatter(ReduceOp::Sum),
        Collective::Broadcast { root: 0 },
    ];
    for kind in kinds {
        let mut y = DeviceBuffer::<f32>::filled(&s, N, POISON_F32)?;
        comm.collective(&s, kind, &x, &mut y)?;
        ensure(y.to_vec()? == host, format!("{kind:?}: output differs from the input"))?;
        let mut y = DeviceBuffer::<f32>::filled(&s, N, POISON_F32)?;
        grouped::run(kind, &mut [grouped::Rank { comm: &comm, stream: &s, send: &x, recv: &mut y }])?;
        ensure(y.to_vec()? == host, format!("grouped {kind:?}: output differs"))?;
        let y = ops::collective(&comm, kind, &x, memory::full(N, POISON_F32)).sync_on(&s)?;
        ensure(y.to_vec()? == host, format!("op {kind:?}: output differs"))?;
    }
    // 16-bit types: bit-exact copies.
    let hb: Vec<bf16> = host.iter().map(|&v| bf16::from_f32(v)).collect();
    let xb = DeviceBuffer::from_host(&s, &hb)?;
    let mut yb = DeviceBuffer::<bf16>::filled(&s, N, bf16::NAN)?;
    comm.all_reduce(&s, &xb, &mut yb, ReduceOp::Sum)?;
    ensure(yb.to_vec()?.iter().zip(&hb).all(|(a, b)| a.to_bits() == b.to_bits()), "bf16 all-reduce")?;
    let hh: Vec<f16> = host.iter().map(|&v| f16::from_f32(v)).collect();
    let xh = DeviceBuffer::from_host(&s, &hh)?;
    let mut yh = DeviceBuffer::<f16>::filled(&s, N, f16::NAN)?;
    comm.all_gather(&s, &xh, &mut yh)?;
    ensure(yh.to_vec()?.iter().zip(&hh).all(|(a, b)| a.to_bits() == b.to_bits()), "f16 all-gather")
}

/// One-rank smoke test of capture: a captured one-rank all-reduce (a copy) replays with new
/// inputs, also after every communicator handle is dropped. Plumbing only: with one rank a replay
/// is a copy, and a communicator freed too early is not reliably detected (nothing must meet
/// another rank); `captured_all_reduce_two_devices` is the test where it matters.
fn one_rank_smoke_captured() -> TestResult {
    let d = dev(0)?;
    let s = d.new_stream()?;
    let comm = Communicator::init_all(&[d])?.remove(0);
    let mut r = rng();
    let mut x = DeviceBuffer::<f32>::zeros(&s, N)?;
    let graph: CudaGraph<DeviceBuffer<f32>> =
        ops::all_reduce(&comm, &x, DeviceBuffer::filled(&s, N, POISON_F32)?, ReduceOp::Sum).graph_on(&s)?;
    drop(comm);
    for replay in 0..2 {
        let host = random_f32(&mut r, N);
        x.copy_from_host(&s, &host)?;
        graph.launch().sync_on(&s)?;
        let out = graph.output().ok_or("no output")?.to_vec()?;
        ensure(out == host, format!("replay {replay}: output differs from the input"))?;
    }
    // The same through cuda-core's raw capture.
    let comm = Communicator::init_all(&[d])?.remove(0);
    let mut y = DeviceBuffer::<f32>::filled(&s, N, POISON_F32)?;
    s.begin_capture(CaptureMode::ThreadLocal)?;
    let queued = comm.all_reduce(&s, &x, &mut y, ReduceOp::Sum);
    let g = s.end_capture()?;
    queued?;
    drop(comm);
    let exec = g.instantiate_and_upload(InstantiateFlags::NONE, &s)?;
    drop(g);
    let host = random_f32(&mut r, N);
    x.copy_from_host(&s, &host)?;
    exec.launch(&s)?;
    ensure(y.to_vec()? == host, "raw captured all-reduce")
}

/// Runs without a GPU too: NCCL either loads (and reports a version) or every entry point returns
/// an error naming the library or the missing driver — never a panic.
fn no_nccl_is_a_clear_error() -> TestResult {
    match cuda_core::nccl::version() {
        Ok(v) => eprintln!("NCCL {v:?}"),
        Err(e @ Error::LibraryMissing { .. }) => {
            ensure(e.to_string().contains("libnccl"), format!("unclear: {e}"))?
        }
        Err(e) => return Err(format!("unexpected error kind: {e}").into()),
    }
    match Device::new(0) {
        Ok(d) => {
            let r = Communicator::init_all(&[d]);
            ensure(
                r.is_ok() || matches!(r, Err(Error::LibraryMissing { .. } | Error::Library { .. })),
                format!("{r:?}"),
            )
        }
        Err(e) => {
            let r = Device::count().map(|_| ()).and(Device::all().map(|_| ()));
            ensure(r.is_err(), "no device, yet Device::all succeeded")?;
            ensure(matches!(e, Error::NoDriver { .. } | Error::NoDevice { .. }), format!("{e}"))
        }
    }
}

// ---- two GPUs ----

fn two() -> Result<(Device, Device, Stream, Stream), Error> {
    let (a, b) = (dev(0)?, dev(1)?);
    Ok((a, b, a.new_stream()?, b.new_stream()?))
}

/// A -> B and B -> A, direct (when possible) and staged, into poisoned buffers; the source is
/// overwritten right after the copy (which must have read it first).
fn peer_copy_two_devices() -> TestResult {
    let (a, b, sa, sb) = two()?;
    let host = random_f32(&mut rng(), N);
    for opts in [PeerCopyOptions::default(), STAGED] {
        for (from, to, sf, st) in [(a, b, &sa, &sb), (b, a, &sb, &sa)] {
            let mut src = DeviceBuffer::from_host(sf, &host)?;
            let mut dst = DeviceBuffer::<f32>::filled(st, N, POISON_F32)?;
            let path = dst.copy_from_peer_with(st, &src, opts)?;
            eprintln!("{} -> {}: {path:?}", from.ordinal(), to.ordinal());
            ensure(path != PeerPath::SameDevice && (opts != STAGED || path == PeerPath::Staged), "path")?;
            src.fill(sf, 0.0)?;
            ensure(
                dst.to_vec()? == host,
                format!("{} -> {} {path:?}: copy differs", from.ordinal(), to.ordinal()),
            )?;
        }
    }
    Ok(())
}

/// Everything but the peer copy still refuses buffers of another device.
fn cross_device_misuse() -> TestResult {
    let (_, _, sa, sb) = two()?;
    let x = DeviceBuffer::<f32>::zeros(&sa, 8)?;
    let mut y = DeviceBuffer::<f32>::zeros(&sb, 8)?;
    let r = y.copy_from_device(&sb, &x);
    ensure(matches!(r, Err(Error::DeviceMismatch { .. })), format!("copy_from_device: {r:?}"))?;
    let r = y.copy_from_peer(&sa, &x);
    ensure(
        matches!(r, Err(Error::DeviceMismatch { .. })),
        format!("peer copy on the source's stream: {r:?}"),
    )?;
    // Pinned-host copies (the staging of cuda-async's uploads and downloads) check the device
    // buffer's device against the stream's (found by review: they compared lengths only).
    let mut host = cuda_core::PinnedBuffer::<f32>::new(sa.device(), 8, 0.0)?;
    let r = host.copy_from_device_async(&sb, &x);
    ensure(matches!(r, Err(Error::DeviceMismatch { .. })), format!("pinned download: {r:?}"))?;
    let r = host.copy_to_device_async(&sa, &mut y);
    ensure(matches!(r, Err(Error::DeviceMismatch { .. })), format!("pinned upload: {r:?}"))?;
    // Events of two devices are not timed against each other (two clocks; left by an earlier
    // review, refused since the sixth 2026-11-28 session; not yet run on two GPUs).
    let (ea, eb) = (cuda_core::Event::new(sa.device(), true)?, cuda_core::Event::new(sb.device(), true)?);
    ea.record(&sa)?;
    eb.record(&sb)?;
    eb.synchronize()?;
    ea.synchronize()?;
    let r = cuda_core::Event::elapsed_ms(&ea, &eb);
    ensure(matches!(r, Err(Error::DeviceMismatch { .. })), format!("elapsed time across devices: {r:?}"))?;
    // A graph node reading a buffer of another device is refused (found by review: the safe
    // set-conditional node took a flag of another device).
    let flag = DeviceBuffer::from_host(&sb, &[1u32])?;
    let mut g = cuda_core::Graph::new(sa.device())?;
    let r = {
        let mut b = g.builder();
        let c = b.conditional(None)?;
        b.add_set_conditional(&c, &flag, &[])
    };
    ensure(
        matches!(r, Err(Error::DeviceMismatch { .. })),
        format!("set-conditional flag of another device: {r:?}"),
    )?;
    let comms = Communicator::init_all(&Device::all()?[..2])?;
    let r = comms[0].all_reduce(&sa, &x, &mut y, ReduceOp::Sum);
    ensure(
        matches!(r, Err(Error::DeviceMismatch { .. })),
        format!("collective with a peer's buffer: {r:?}"),
    )?;
    let mut z = DeviceBuffer::<f32>::zeros(&sa, 8)?;
    let r = comms[1].all_reduce(&sa, &x, &mut z, ReduceOp::Sum);
    ensure(matches!(r, Err(Error::DeviceMismatch { .. })), format!("collective on another device: {r:?}"))?;
    let r = grouped::all_reduce(
        &mut [grouped::Rank { comm: &comms[0], stream: &sa, send: &x, recv: &mut z }],
        ReduceOp::Sum,
    );
    ensure(matches!(r, Err(Error::InvalidArgument(_))), format!("grouped with a missing rank: {r:?}"))
}

/// All-reduce over two devices equals the host sum: grouped from one thread, then per rank from
/// two threads, after a refused single-thread issue and a refused length mismatch.
fn all_reduce_two_devices() -> TestResult {
    let (_, _, sa, sb) = two()?;
    let comms = Communicator::init_all(&Device::all()?[..2])?;
    let mut r = rng();
    let (h0, h1) = (random_f32(&mut r, N), random_f32(&mut r, N));
    let want: Vec<f32> = h0.iter().zip(&h1).map(|(a, b)| a + b).collect();
    let (x0, x1) = (DeviceBuffer::from_host(&sa, &h0)?, DeviceBuffer::from_host(&sb, &h1)?);
    let mut y0 = DeviceBuffer::<f32>::filled(&sa, N, POISON_F32)?;
    let mut y1 = DeviceBuffer::<f32>::filled(&sb, N, POISON_F32)?;
    grouped::all_reduce(
        &mut [
            grouped::Rank { comm: &comms[1], stream: &sb, send: &x1, recv: &mut y1 },
            grouped::Rank { comm: &comms[0], stream: &sa, send: &x0, recv: &mut y0 },
        ],
        ReduceOp::Sum,
    )?;
    ensure(y0.to_vec()? == want && y1.to_vec()? == want, "grouped all-reduce != host sum")?;
    y0.fill(&sa, POISON_F32)?;
    y1.fill(&sb, POISON_F32)?;
    // Rank 0 from this thread; rank 1 from this thread too is refused (it could hang).
    comms[0].all_reduce(&sa, &x0, &mut y0, ReduceOp::Sum)?;
    let refused = comms[1].all_reduce(&sb, &x1, &mut y1, ReduceOp::Sum);
    ensure(
        matches!(refused, Err(Error::InvalidArgument(_))),
        format!("same thread, second rank: {refused:?}"),
    )?;
    std::thread::scope(|t| -> TestResult {
        t.spawn(|| -> TestResult {
            let mut short = DeviceBuffer::<f32>::zeros(&sb, N - 1)?;
            let x1s = DeviceBuffer::<f32>::zeros(&sb, N - 1)?;
            let r = comms[1].all_reduce(&sb, &x1s, &mut short, ReduceOp::Sum);
            ensure(
                matches!(r, Err(Error::InvalidArgument(_))),
                format!("length mismatch across ranks: {r:?}"),
            )?;
            Ok(comms[1].all_reduce(&sb, &x1, &mut y1, ReduceOp::Sum)?)
        })
        .join()
        .map_err(|_| "rank 1 thread panicked")?
    })?;
    ensure(y0.to_vec()? == want && y1.to_vec()? == want, "per-rank all-reduce != host sum")
}

/// Each rank captures its all-reduce on its own thread; both graphs are replayed twice with new
/// inputs, and every replay equals the host sum. The communicators' first collective is the
/// captured one: first run on two GPUs (two H200s), it failed with `ncclInternalError` ("failed to
/// peer with device: operation not permitted when stream is capturing"), NCCL connecting the ranks
/// on first use inside the capture; `NCCL_RUNTIME_CONNECT=0` is now part of the module's required
/// environment. Mutation: `runtime-connect-on` (the variable dropped from the policy).
fn captured_all_reduce_two_devices() -> TestResult {
    let (_, _, sa, sb) = two()?;
    let comms = Communicator::init_all(&Device::all()?[..2])?;
    let streams = [sa, sb];
    let mut xs = [DeviceBuffer::<f32>::zeros(&streams[0], N)?, DeviceBuffer::<f32>::zeros(&streams[1], N)?];
    let graphs = std::thread::scope(|t| {
        let handles: Vec<_> = (0..2)
            .map(|i| {
                let (comm, s, x) = (&comms[i], &streams[i], &xs[i]);
                t.spawn(move || {
                    let out = DeviceBuffer::<f32>::filled(s, N, POISON_F32)?;
                    ops::all_reduce(comm, x, out, ReduceOp::Sum).graph_on(s)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().map_err(|_| "capture thread panicked")).collect::<Vec<_>>()
    });
    let mut gs = Vec::new();
    for g in graphs {
        gs.push(g??);
    }
    drop(comms);
    let mut r = rng();
    for replay in 0..2 {
        let (h0, h1) = (random_f32(&mut r, N), random_f32(&mut r, N));
        xs[0].copy_from_host(&streams[0], &h0)?;
        xs[1].copy_from_host(&streams[1], &h1)?;
        // Both queued before either is waited for: they meet on the GPUs.
        for (g, s) in gs.iter().zip(&streams) {
            // SAFETY: the outputs are only read below, through `to_vec`, which waits for the replay.
            unsafe { g.launch().async_on(s)? };
        }
        let want: Vec<f32> = h0.iter().zip(&h1).map(|(a, b)| a + b).collect();
        for (i, g) in gs.iter().enumerate() {
            let out = g.output().ok_or("no output")?.to_vec()?;
            ensure(out == want, format!("replay {replay}, rank {i}: != host sum"))?;
        }
    }
    Ok(())
}

/// An element type for [`collectives_two_devices`]: built from small integers (exact in every
/// type used), compared exactly.
trait Val: NcclScalar + Copy + PartialEq + std::fmt::Debug + Send + Sync {
    const NAME: &'static str;
    fn of(v: f64) -> Self;
}

macro_rules! val {
    ($($t:ty, $name:literal, |$v:ident| $e:expr);* $(;)?) => {$(
        impl Val for $t {
            const NAME: &'static str = $name;
            fn of($v: f64) -> Self { $e }
        }
    )*};
}
val!(
    f32, "f32", |v| v as f32;
    f64, "f64", |v| v;
    bf16, "bf16", |v| bf16::from_f64(v);
    f16, "f16", |v| f16::from_f64(v);
    i32, "i32", |v| v as i32;
    i64, "i64", |v| v as i64;
    u8, "u8", |v| v as u8;
);

/// A collective, rank 0's and rank 1's inputs, and what each rank must receive.
type Case = (Collective, Vec<f64>, Vec<f64>, [Vec<f64>; 2]);

/// Every collective and reduction operator over two ranks in type `T`, grouped from one thread,
/// into poisoned outputs, against host values computed from inputs chosen so that sum, product,
/// max and min differ (rank 0: `i % 7 + 1`, rank 1: `(3i) % 5 + 2`), gathers and reduce-scatters
/// check the rank order of blocks, and a broadcast from root 1 differs from one from root 0.
fn two_rank_collectives<T: Val>(comms: &[Communicator], sa: &Stream, sb: &Stream) -> TestResult {
    let n = 1000;
    let a: Vec<f64> = (0..2 * n).map(|i| (i % 7 + 1) as f64).collect();
    let b: Vec<f64> = (0..2 * n).map(|i| ((3 * i) % 5 + 2) as f64).collect();
    let poison = T::of(123.0);
    let conv = |v: &[f64]| v.iter().map(|&x| T::of(x)).collect::<Vec<T>>();
    let zip = |f: fn(f64, f64) -> f64| a.iter().zip(&b).map(|(&x, &y)| f(x, y)).collect::<Vec<f64>>();
    let mut ops = vec![
        (ReduceOp::Sum, zip(|x, y| x + y)),
        (ReduceOp::Prod, zip(|x, y| x * y)),
        (ReduceOp::Max, zip(f64::max)),
        (ReduceOp::Min, zip(f64::min)),
    ];
    if matches!(T::NAME, "f32" | "f64") {
        ops.push((ReduceOp::Avg, zip(|x, y| (x + y) / 2.0)));
    }
    let mut cases: Vec<Case> = Vec::new();
    for (op, want) in &ops {
        cases.push((
            Collective::AllReduce(*op),
            a[..n].to_vec(),
            b[..n].to_vec(),
            [want[..n].to_vec(), want[..n].to_vec()],
        ));
        // Reduce-scatter: each rank sends 2n, rank r gets block r of the reduction.
        cases.push((
            Collective::ReduceScatter(*op),
            a.clone(),
            b.clone(),
            [want[..n].to_vec(), want[n..].to_vec()],
        ));
    }
    let gathered: Vec<f64> = a[..n].iter().chain(&b[..n]).copied().collect();
    cases.push((Collective::AllGather, a[..n].to_vec(), b[..n].to_vec(), [gathered.clone(), gathered]));
    cases.push((
        Collective::Broadcast { root: 1 },
        a[..n].to_vec(),
        b[..n].to_vec(),
        [b[..n].to_vec(), b[..n].to_vec()],
    ));
    cases.push((
        Collective::Broadcast { root: 0 },
        a[..n].to_vec(),
        b[..n].to_vec(),
        [a[..n].to_vec(), a[..n].to_vec()],
    ));
    for (kind, s0, s1, want) in cases {
        let (x0, x1) = (DeviceBuffer::from_host(sa, &conv(&s0))?, DeviceBuffer::from_host(sb, &conv(&s1))?);
        let mut y0 = DeviceBuffer::<T>::from_host(sa, &vec![poison; want[0].len()])?;
        let mut y1 = DeviceBuffer::<T>::from_host(sb, &vec![poison; want[1].len()])?;
        grouped::run(
            kind,
            &mut [
                grouped::Rank { comm: &comms[0], stream: sa, send: &x0, recv: &mut y0 },
                grouped::Rank { comm: &comms[1], stream: sb, send: &x1, recv: &mut y1 },
            ],
        )?;
        for (r, (y, w)) in [(y0.to_vec()?, &want[0]), (y1.to_vec()?, &want[1])].into_iter().enumerate() {
            let w = conv(w);
            if let Some(i) = (0..w.len()).find(|&i| y[i] != w[i]) {
                return Err(format!(
                    "{} {kind:?}, rank {r}: [{i}] = {:?}, expected {:?}",
                    T::NAME,
                    y[i],
                    w[i]
                )
                .into());
            }
        }
    }
    Ok(())
}

/// Every collective (all-reduce and reduce-scatter with sum, product, max, min, and average for
/// floats; all-gather; broadcast from each root) over two ranks, in f32, f64, bf16, f16, i32, i64
/// and u8, with values that tell the operators, the block order and the roots apart: what the
/// one-rank smoke tests cannot show. Two GPUs.
fn collectives_two_devices() -> TestResult {
    let (_, _, sa, sb) = two()?;
    let comms = Communicator::init_all(&Device::all()?[..2])?;
    two_rank_collectives::<f32>(&comms, &sa, &sb)?;
    two_rank_collectives::<f64>(&comms, &sa, &sb)?;
    two_rank_collectives::<bf16>(&comms, &sa, &sb)?;
    two_rank_collectives::<f16>(&comms, &sa, &sb)?;
    two_rank_collectives::<i32>(&comms, &sa, &sb)?;
    two_rank_collectives::<i64>(&comms, &sa, &sb)?;
    two_rank_collectives::<u8>(&comms, &sa, &sb)
}

fn main() {
    // NCCL's policy variables (see `cuda_core::nccl`): set here, before any thread starts, where
    // changing the environment cannot race another thread's `getenv`.
    for var in cuda_core::nccl::POLICY_VARS {
        if std::env::var_os(var).is_none() {
            std::env::set_var(var, "0");
        }
    }
    if std::env::var_os(cuda_core::nccl::MIXING_VAR).is_none() {
        std::env::set_var(cuda_core::nccl::MIXING_VAR, "1");
    }
    let mut s = Suite::new();
    s.gpu("device_enumeration", device_enumeration)
        .gpu("peer_copy_one_device", peer_copy_one_device)
        .gpu("misuse_one_device", misuse_one_device)
        .gpu("one_rank_smoke_collectives", one_rank_smoke_collectives)
        .gpu("one_rank_smoke_captured", one_rank_smoke_captured)
        .cpu("no_nccl_is_a_clear_error", no_nccl_is_a_clear_error)
        .gpus(2, "peer_copy_two_devices", peer_copy_two_devices)
        .gpus(2, "cross_device_misuse", cross_device_misuse)
        .gpus(2, "all_reduce_two_devices", all_reduce_two_devices)
        .gpus(2, "captured_all_reduce_two_devices", captured_all_reduce_two_devices)
        .gpus(2, "collectives_two_devices", collectives_two_devices);
    s.run()
}

//! GPU suite for per-allocation access tracking (`cuda-core/src/track/access.rs`): readers on
//! several streams run concurrently and never serialise on the home stream, a write waits for every
//! reader and the last writer, a read waits for the last writer, the free waits for readers on
//! other streams, and work on independent buffers homed on one stream overlaps.
//!
//! Every ordering test uses a slow kernel (it spins for tens of milliseconds before touching memory)
//! and a result that a missing wait would change; the overlap tests read the GPU's global timer at
//! the start and end of each kernel. Random inputs, NaN-poisoned outputs. Ignored without a GPU;
//! fails without one when CUDA_ASYNC_REQUIRE_GPU=1.

use cuda_async::{join_concurrent, zip, zip_concurrent, CudaGraph, DeviceOp, DeviceOpExt, ExecutionContext};
use cuda_async_tests::graph_kernels::graph_kernels;
use cuda_async_tests::ops::{AddScalar, SpinWrite};
use cuda_async_tests::{ensure, random_f32, rng, Suite, TestResult, POISON_F32};
use cuda_core::{Device, DeviceBuffer, Function, LaunchConfig, Stream};
use std::sync::OnceLock;

const SRC: &str = r#"
__device__ unsigned long long now() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
// Spins `ns`, then out[i] = in[i] * k; block 0 thread 0 writes its start and end time to t[0..2].
extern "C" __global__ void timed_scale(float* out, const float* in, unsigned long long n, float k,
                                       unsigned long long ns, unsigned long long* t) {
    unsigned long long start = now(), cur = start;
    while (cur - start < ns) { __nanosleep(1000); cur = now(); }
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x)
        out[i] = in[i] * k;
    if (blockIdx.x == 0 && threadIdx.x == 0) { t[0] = start; t[1] = now(); }
}
// Spins `ns`, then x[i] = x[i] * a + b (not idempotent).
extern "C" __global__ void slow_affine(float* x, unsigned long long n, float a, float b, unsigned long long ns) {
    unsigned long long start = now(), cur = start;
    while (cur - start < ns) { __nanosleep(1000); cur = now(); }
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x)
        x[i] = x[i] * a + b;
}
"#;

struct K {
    timed_scale: Function,
    slow_affine: Function,
}

fn k(d: &Device) -> Result<&'static K, cuda_core::Error> {
    static KS: OnceLock<K> = OnceLock::new();
    if let Some(k) = KS.get() {
        return Ok(k);
    }
    let m = d.compile_module("gpu_access.cu", SRC, &[])?;
    Ok(KS.get_or_init(|| K {
        timed_scale: m.function("timed_scale").expect("kernel"),
        slow_affine: m.function("slow_affine").expect("kernel"),
    }))
}

/// A small grid (so two kernels fit on the GPU at once).
fn cfg(n: usize) -> LaunchConfig {
    let mut c = LaunchConfig::for_elements(n, 256);
    c.grid.0 = c.grid.0.min(8);
    c
}

const MS: u64 = 1_000_000;

/// `out = in * k` after spinning `ns`, with the kernel's GPU start/end time in `t`.
fn timed_scale(
    s: &Stream,
    out: &mut DeviceBuffer<f32>,
    input: &DeviceBuffer<f32>,
    kf: f32,
    ns: u64,
    t: &mut DeviceBuffer<u64>,
) -> TestResult {
    let n = out.len();
    let f = &k(s.device())?.timed_scale;
    ensure(input.len() == n && t.len() == 2, "lengths")?;
    // SAFETY: matches timed_scale(float*, const float*, u64, float, u64, u64*); writes out[0..n]
    // and t[0..2] (t has 2 elements), reads in[0..n] (lengths checked above).
    unsafe { f.launch(s, cfg(n), (out, input, n as u64, kf, ns, t))? };
    Ok(())
}

/// `x = x * a + b` after spinning `ns`.
fn slow_affine(s: &Stream, x: &mut DeviceBuffer<f32>, a: f32, b: f32, ns: u64) -> TestResult {
    let n = x.len();
    let f = &k(s.device())?.slow_affine;
    // SAFETY: matches slow_affine(float*, u64, float, float, u64); touches x[0..n] only.
    unsafe { f.launch(s, cfg(n), (x, n as u64, a, b, ns))? };
    Ok(())
}

fn overlap(a: &[u64], b: &[u64]) -> bool {
    a[0] < b[1] && b[0] < a[1]
}

fn scaled(x: &[f32], k: f32) -> Vec<f32> {
    x.iter().map(|v| v * k).collect()
}

fn setup() -> Result<(Device, Stream, Vec<Stream>), cuda_async_tests::Failed> {
    let d = Device::new(0)?;
    k(&d)?;
    let home = Stream::new(&d)?;
    let others = (0..3).map(|_| Stream::new(&d)).collect::<Result<Vec<_>, _>>()?;
    Ok((d, home, others))
}

/// Two slow readers of one buffer (homed on a third stream) on two streams run at the same time:
/// with home-stream joins the second would wait for the first.
fn readers_run_concurrently() -> TestResult {
    let (_d, h, o) = setup()?;
    let n = 2048;
    let xh = random_f32(&mut rng(), n);
    let w = DeviceBuffer::from_host(&h, &xh)?;
    let (mut a, mut b) = (DeviceBuffer::filled(&h, n, POISON_F32)?, DeviceBuffer::filled(&h, n, POISON_F32)?);
    let (mut ta, mut tb) = (DeviceBuffer::<u64>::zeros(&h, 2)?, DeviceBuffer::<u64>::zeros(&h, 2)?);
    h.synchronize()?;
    timed_scale(&o[0], &mut a, &w, 2.0, 50 * MS, &mut ta)?;
    timed_scale(&o[1], &mut b, &w, 3.0, 50 * MS, &mut tb)?;
    let (ta, tb) = (ta.to_vec()?, tb.to_vec()?);
    ensure(a.to_vec()? == scaled(&xh, 2.0) && b.to_vec()? == scaled(&xh, 3.0), "reader outputs")?;
    ensure(overlap(&ta, &tb), format!("the two readers did not overlap: {ta:?} vs {tb:?}"))
}

/// A fast write on a third stream, queued right after two readers on two other streams, waits
/// for both: the readers see the old contents. Twice: first the *first* reader is the slow one
/// (80 ms; the second reads at once), then the second. A tracker that remembered only the latest
/// reader fails the first round, one that remembered only the earliest fails the second.
///
/// Mutation it catches: in `AccessState::add_read` (`cuda-core/src/track/access.rs`), replacing
/// the per-stream list by the latest mark only (`self.reads.clear(); self.reads.push(mark)`).
fn write_waits_for_every_reader() -> TestResult {
    let (_d, h, o) = setup()?;
    let n = 4096;
    for (first_ns, second_ns) in [(80 * MS, 0), (0, 80 * MS)] {
        let xh = random_f32(&mut rng(), n);
        let mut w = DeviceBuffer::from_host(&h, &xh)?;
        let (mut a, mut b) =
            (DeviceBuffer::filled(&h, n, POISON_F32)?, DeviceBuffer::filled(&h, n, POISON_F32)?);
        let (mut ta, mut tb) = (DeviceBuffer::<u64>::zeros(&h, 2)?, DeviceBuffer::<u64>::zeros(&h, 2)?);
        h.synchronize()?;
        timed_scale(&o[0], &mut a, &w, 1.0, first_ns, &mut ta)?;
        timed_scale(&o[1], &mut b, &w, 1.0, second_ns, &mut tb)?;
        slow_affine(&o[2], &mut w, -1.0, 5.0, 0)?; // w = 5 - w, right away unless it waits
        let which = if first_ns > 0 { "first" } else { "second" };
        ensure(a.to_vec()? == xh, format!("slow {which} reader: the first reader saw the later write"))?;
        ensure(b.to_vec()? == xh, format!("slow {which} reader: the second reader saw the later write"))?;
        let want: Vec<f32> = xh.iter().map(|v| v * -1.0 + 5.0).collect();
        ensure(w.to_vec()? == want, "the write ran exactly once after the reads")?;
    }
    Ok(())
}

/// A slow write on one stream, then a read on another: the read sees the written values.
fn read_waits_for_the_last_write() -> TestResult {
    let (_d, h, o) = setup()?;
    let n = 4096;
    let xh = random_f32(&mut rng(), n);
    let mut w = DeviceBuffer::from_host(&h, &xh)?;
    let mut a = DeviceBuffer::filled(&h, n, POISON_F32)?;
    let mut ta = DeviceBuffer::<u64>::zeros(&h, 2)?;
    h.synchronize()?;
    slow_affine(&o[0], &mut w, 2.0, 1.0, 40 * MS)?;
    timed_scale(&o[1], &mut a, &w, 1.0, 0, &mut ta)?;
    let want: Vec<f32> = xh.iter().map(|v| v * 2.0 + 1.0).collect();
    ensure(a.to_vec()? == want, "the read did not wait for the write on another stream")?;
    // Two more writes on two streams, in order: each waits for the previous one.
    slow_affine(&o[1], &mut w, 3.0, 0.0, 20 * MS)?;
    slow_affine(&o[2], &mut w, 1.0, -1.0, 0)?;
    let want2: Vec<f32> = want.iter().map(|v| v * 3.0 - 1.0).collect();
    ensure(w.to_vec()? == want2, "two writes on two streams ran out of order")
}

/// The free of a buffer waits for a slow reader on another stream: a buffer allocated right after
/// the drop (likely at the same address) and filled with a pattern does not leak into the read,
/// and the read sees the old contents.
fn free_waits_for_a_reader_elsewhere() -> TestResult {
    let (_d, h, o) = setup()?;
    let n = 1 << 16;
    let xh = random_f32(&mut rng(), n);
    let w = DeviceBuffer::from_host(&h, &xh)?;
    let mut a = DeviceBuffer::filled(&o[0], n, POISON_F32)?;
    let mut ta = DeviceBuffer::<u64>::zeros(&o[0], 2)?;
    h.synchronize()?;
    o[0].synchronize()?;
    timed_scale(&o[0], &mut a, &w, 1.0, 50 * MS, &mut ta)?;
    let addr = w.device_ptr();
    drop(w);
    let reuse = DeviceBuffer::filled(&h, n, -7.0f32)?;
    eprintln!("freed {addr:#x}, reallocated at {:#x}", reuse.device_ptr());
    ensure(a.to_vec()? == xh, "the read saw memory reused after the free")?;
    ensure(reuse.to_vec()?.iter().all(|&v| v == -7.0), "the new buffer holds its pattern")
}

/// Two slow kernels on two streams, each writing its own buffer (both buffers homed on a third
/// stream), overlap in time: independent buffers are not ordered through their shared home stream.
fn independent_buffers_overlap() -> TestResult {
    let (_d, h, o) = setup()?;
    let n = 2048;
    let xh = random_f32(&mut rng(), n);
    let x = DeviceBuffer::from_host(&h, &xh)?;
    let (mut a, mut b) = (DeviceBuffer::filled(&h, n, POISON_F32)?, DeviceBuffer::filled(&h, n, POISON_F32)?);
    let (mut ta, mut tb) = (DeviceBuffer::<u64>::zeros(&h, 2)?, DeviceBuffer::<u64>::zeros(&h, 2)?);
    h.synchronize()?;
    let t0 = std::time::Instant::now();
    timed_scale(&o[0], &mut a, &x, 2.0, 100 * MS, &mut ta)?;
    timed_scale(&o[1], &mut b, &x, -1.0, 100 * MS, &mut tb)?;
    o[0].synchronize()?;
    o[1].synchronize()?;
    let wall = t0.elapsed();
    let (ta, tb) = (ta.to_vec()?, tb.to_vec()?);
    ensure(a.to_vec()? == scaled(&xh, 2.0) && b.to_vec()? == scaled(&xh, -1.0), "outputs")?;
    eprintln!("two 100 ms kernels on two streams: {:.1} ms wall", wall.as_secs_f64() * 1e3);
    ensure(overlap(&ta, &tb), format!("independent kernels did not overlap: {ta:?} vs {tb:?}"))?;
    ensure(wall.as_millis() < 190, format!("two 100 ms kernels took {wall:?}: serialised"))
}

/// Reads on the home stream after a write on another stream, then a write on the home stream after
/// reads on other streams: every mix of home and foreign uses keeps the order of a single stream.
fn home_and_foreign_uses_mix() -> TestResult {
    let (_d, h, o) = setup()?;
    let n = 4096;
    let xh = random_f32(&mut rng(), n);
    let mut w = DeviceBuffer::from_host(&h, &xh)?;
    let mut a = DeviceBuffer::filled(&h, n, POISON_F32)?;
    let mut t = DeviceBuffer::<u64>::zeros(&h, 2)?;
    slow_affine(&o[0], &mut w, 2.0, 0.0, 30 * MS)?; // foreign write
    timed_scale(&h, &mut a, &w, 1.0, 0, &mut t)?; // home read: waits for it
    let want: Vec<f32> = xh.iter().map(|v| v * 2.0).collect();
    ensure(a.to_vec()? == want, "home read after a foreign write")?;
    let mut b = DeviceBuffer::filled(&h, n, POISON_F32)?;
    let mut tb = DeviceBuffer::<u64>::zeros(&h, 2)?;
    timed_scale(&o[1], &mut b, &w, 1.0, 40 * MS, &mut tb)?; // slow foreign read
    slow_affine(&h, &mut w, 1.0, 1.0, 0)?; // home write: waits for the foreign read
    ensure(b.to_vec()? == want, "a home write overtook a foreign read")?;
    let want2: Vec<f32> = want.iter().map(|v| v + 1.0).collect();
    ensure(w.to_vec()? == want2, "home write result")
}

/// `zip_concurrent!` of two slow independent writes takes the time of one (they run on two streams
/// of the policy), while `zip!` runs them back to back; both give the same results, and the
/// caller's `sync_on` returns only after both branches.
fn zip_concurrent_overlaps() -> TestResult {
    let (d, h, _o) = setup()?;
    cuda_async_tests::ops::test_kernels(&d)?;
    let n = 2048;
    let (mut a, mut b) = (DeviceBuffer::filled(&h, n, POISON_F32)?, DeviceBuffer::filled(&h, n, POISON_F32)?);
    let t0 = std::time::Instant::now();
    zip_concurrent!(
        SpinWrite { buf: &mut a, ns: 100 * MS, v: 1.0 },
        SpinWrite { buf: &mut b, ns: 100 * MS, v: 2.0 }
    )
    .then(|(a, b)| zip!(AddScalar { buf: a, v: 0.5 }, AddScalar { buf: b, v: 0.25 }))
    .sync_on(&h)?;
    let concurrent = t0.elapsed();
    ensure(
        a.to_vec()?.iter().all(|&v| v == 1.5) && b.to_vec()?.iter().all(|&v| v == 2.25),
        "concurrent results",
    )?;
    let t1 = std::time::Instant::now();
    zip!(SpinWrite { buf: &mut a, ns: 100 * MS, v: 3.0 }, SpinWrite { buf: &mut b, ns: 100 * MS, v: 4.0 })
        .sync_on(&h)?;
    let serial = t1.elapsed();
    ensure(a.to_vec()?.iter().all(|&v| v == 3.0) && b.to_vec()?.iter().all(|&v| v == 4.0), "serial results")?;
    eprintln!(
        "two 100 ms kernels: zip_concurrent! {:.1} ms, zip! {:.1} ms",
        concurrent.as_secs_f64() * 1e3,
        serial.as_secs_f64() * 1e3
    );
    ensure(concurrent.as_millis() < 180, format!("zip_concurrent! took {concurrent:?}: not concurrent"))?;
    ensure(serial.as_millis() >= 200, format!("zip! took {serial:?}: expected back to back"))
}

/// Copies `n` floats from a raw device address (invisible to access tracking: nothing orders this
/// read after earlier writes of that memory except the stream it runs on) into `dst`.
struct RawCopy<'a> {
    src: u64,
    dst: &'a mut DeviceBuffer<f32>,
}

impl DeviceOp for RawCopy<'_> {
    type Output = ();
    fn execute(self, ctx: &ExecutionContext<'_>) -> cuda_async::Result<()> {
        let k = graph_kernels(ctx.device())?;
        let n = self.dst.len();
        // SAFETY: matches copy_raw(const float*, float*, u64); every caller passes the address of
        // a live buffer of at least `n` floats that outlives the queued copy (the tests synchronise
        // before dropping it); writes dst[0..n] only.
        unsafe { k.copy_raw.launch(ctx.stream(), cfg(n), (self.src, &mut *self.dst, n as u64))? };
        Ok(())
    }
}

/// Queues, on `s`, a copy of the buffer at raw address `src` into `dst` (untracked read).
fn raw_copy(s: &Stream, src: u64, dst: &mut DeviceBuffer<f32>) -> TestResult {
    RawCopy { src, dst }.sync_on(s)?;
    Ok(())
}

/// Queues, on `s`, `x = x * a + b` after spinning `ns`, on the buffer at raw address `x` (the
/// write is invisible to access tracking).
fn raw_slow_affine(s: &Stream, x: u64, n: usize, a: f32, b: f32, ns: u64) -> TestResult {
    let f = &k(s.device())?.slow_affine;
    // SAFETY: matches slow_affine(float*, u64, float, float, u64); the caller passes the address of
    // a live buffer of `n` floats that outlives the kernel (the tests synchronise before dropping).
    unsafe { f.launch(s, cfg(n), (x, n as u64, a, b, ns))? };
    Ok(())
}

const JOIN_NS: u64 = 100 * MS;

/// The join of `zip_concurrent!` and `join_concurrent` with nothing else to order it: branches
/// spin 100 ms then write their buffers; right after the op completes on the caller's stream
/// (`sync_on` returned, or `.await` resolved), copies *on the caller's stream* read those buffers
/// through raw addresses, which access tracking does not see. Only the join (the caller's stream
/// waiting for every branch) orders these copies after the branches: without it `sync_on`
/// returns at once and the copies read the old zeros while the branches still spin. The op must
/// also take about one spin, not several (the branches really ran on other streams; if they ran
/// inline on the caller's stream the join would order nothing and this test would prove nothing).
///
/// Mutation it catches: `Fork::join` in `cuda-async/src/combinators/concurrent.rs` returning
/// `Ok(())` without the `self.caller.wait_stream(b)` calls.
fn concurrent_ops_join_back() -> TestResult {
    let (d, h, _o) = setup()?;
    cuda_async_tests::ops::test_kernels(&d)?;
    graph_kernels(&d)?;
    let n = 2048;
    let check = |what: &str, h: &Stream, bufs: &[&DeviceBuffer<f32>], t: std::time::Duration| -> TestResult {
        // Raw reads on the caller's stream, queued right after the op reported completion.
        let mut seen = Vec::new();
        for b in bufs {
            let mut c = DeviceBuffer::filled(h, n, POISON_F32)?;
            raw_copy(h, b.device_ptr(), &mut c)?;
            seen.push(c.to_vec()?);
        }
        for (i, v) in seen.iter().enumerate() {
            let want = 1.0 + i as f32;
            ensure(
                v.iter().all(|&x| x == want),
                format!("{what}: branch {i} not finished when the op completed (read {})", v[0]),
            )?;
        }
        eprintln!("{what}: {:.1} ms", t.as_secs_f64() * 1e3);
        ensure(
            t.as_nanos() as u64 >= JOIN_NS * 9 / 10,
            format!("{what}: completed after {t:?}, before the branches"),
        )?;
        ensure(
            (t.as_nanos() as u64) < JOIN_NS * 18 / 10,
            format!("{what}: took {t:?}: the branches did not run concurrently on other streams"),
        )
    };
    let zeros = |h: &Stream| DeviceBuffer::filled(h, n, 0.0f32);
    // zip_concurrent!, completed by sync_on.
    let (mut a, mut b) = (zeros(&h)?, zeros(&h)?);
    h.synchronize()?;
    let t = std::time::Instant::now();
    zip_concurrent!(
        SpinWrite { buf: &mut a, ns: JOIN_NS, v: 1.0 },
        SpinWrite { buf: &mut b, ns: JOIN_NS, v: 2.0 }
    )
    .sync_on(&h)?;
    check("zip_concurrent! sync_on", &h, &[&a, &b], t.elapsed())?;
    // zip_concurrent!, completed by .await.
    let (mut a, mut b) = (zeros(&h)?, zeros(&h)?);
    h.synchronize()?;
    let t = std::time::Instant::now();
    futures::executor::block_on(
        zip_concurrent!(
            SpinWrite { buf: &mut a, ns: JOIN_NS, v: 1.0 },
            SpinWrite { buf: &mut b, ns: JOIN_NS, v: 2.0 }
        )
        .on(&h),
    )?;
    check("zip_concurrent! await", &h, &[&a, &b], t.elapsed())?;
    // join_concurrent of three, completed by sync_on.
    let mut bufs = [zeros(&h)?, zeros(&h)?, zeros(&h)?];
    h.synchronize()?;
    let t = std::time::Instant::now();
    join_concurrent(bufs.iter_mut().enumerate().map(|(i, buf)| SpinWrite {
        buf,
        ns: JOIN_NS,
        v: 1.0 + i as f32,
    }))
    .sync_on(&h)?;
    let el = t.elapsed();
    check("join_concurrent sync_on", &h, &bufs.iter().collect::<Vec<_>>(), el)?;
    // join_concurrent, completed by .await.
    let mut bufs = [zeros(&h)?, zeros(&h)?];
    h.synchronize()?;
    let t = std::time::Instant::now();
    futures::executor::block_on(
        join_concurrent(bufs.iter_mut().enumerate().map(|(i, buf)| SpinWrite {
            buf,
            ns: JOIN_NS,
            v: 1.0 + i as f32,
        }))
        .on(&h),
    )?;
    let el = t.elapsed();
    check("join_concurrent await", &h, &bufs.iter().collect::<Vec<_>>(), el)
}

/// The fork of `zip_concurrent!` and `join_concurrent` with nothing else to order it: the caller's
/// stream spins 100 ms then writes 7 into `x` through its raw address (access tracking does not
/// see it); the concurrent branches then copy `x` through its raw address into buffers homed on an
/// unrelated idle stream. Only the fork (every branch waits for the caller's stream first) orders
/// the copies after the write: without it they read the old zeros.
///
/// Mutation it catches: in `Fork::new` (`cuda-async/src/combinators/concurrent.rs`), removing the
/// `b.wait_stream(caller)?` of each branch.
fn concurrent_ops_fork_after_the_caller() -> TestResult {
    let (d, h, o) = setup()?;
    graph_kernels(&d)?;
    let n = 2048;
    for which in ["zip_concurrent!", "join_concurrent"] {
        let x = DeviceBuffer::filled(&h, n, 0.0f32)?;
        // Homed on o[0], which stays idle: their first (foreign) use waits only for o[0].
        let mut outs =
            [DeviceBuffer::filled(&o[0], n, POISON_F32)?, DeviceBuffer::filled(&o[0], n, POISON_F32)?];
        h.synchronize()?;
        o[0].synchronize()?;
        raw_slow_affine(&h, x.device_ptr(), n, 0.0, 7.0, JOIN_NS)?;
        let src = x.device_ptr();
        if which == "zip_concurrent!" {
            let (c0, c1) = outs.split_at_mut(1);
            zip_concurrent!(RawCopy { src, dst: &mut c0[0] }, RawCopy { src, dst: &mut c1[0] })
                .sync_on(&h)?;
        } else {
            join_concurrent(outs.iter_mut().map(|dst| RawCopy { src, dst })).sync_on(&h)?;
        }
        for (i, c) in outs.iter().enumerate() {
            let v = c.to_vec()?;
            ensure(
                v.iter().all(|&x| x == 7.0),
                format!("{which}: branch {i} ran before the caller's earlier work (read {})", v[0]),
            )?;
        }
        h.synchronize()?;
        drop(x);
    }
    Ok(())
}

/// Recorded into a graph, `zip_concurrent!` runs its ops one after the other on the capturing
/// stream (no fork of the capture); every replay applies both, exactly once.
fn zip_concurrent_in_a_capture() -> TestResult {
    let (d, h, _o) = setup()?;
    cuda_async_tests::ops::test_kernels(&d)?;
    let n = 4096;
    let (mut a, mut b) = (DeviceBuffer::filled(&h, n, 0.0f32)?, DeviceBuffer::filled(&h, n, 0.0f32)?);
    let g = CudaGraph::scope(&h, |sc| {
        sc.record(zip_concurrent!(AddScalar { buf: &mut a, v: 1.0 }, AddScalar { buf: &mut b, v: 2.0 }))?;
        Ok(())
    })?;
    ensure(g.graph().node_count()? == 2, "two kernel nodes")?;
    for _ in 0..3 {
        g.launch().sync_on(&h)?;
    }
    drop(g);
    ensure(a.to_vec()?.iter().all(|&v| v == 3.0) && b.to_vec()?.iter().all(|&v| v == 6.0), "three replays")
}

/// Data movement into existing buffers through a staging pool: random data up and down, poisoned
/// targets, buffers reused by the pool (no new page-locked allocation), and a host read of a
/// download queued behind a slow write waits for it.
fn staging_round_trips() -> TestResult {
    use cuda_async::staging::{download, upload, upload_pinned, StagingPool};
    let (d, h, o) = setup()?;
    cuda_async_tests::ops::test_kernels(&d)?;
    let pool = StagingPool::<f32>::new(&d);
    let n = 10_000;
    let mut x = DeviceBuffer::filled(&h, n, POISON_F32)?;
    for round in 0..3 {
        let data = random_f32(&mut rng(), n);
        upload(data.clone(), &mut x).sync_on(&o[round % 3])?;
        let mut host = pool.get(n)?;
        host.as_mut_slice()?.fill(POISON_F32);
        download(&x, &mut host).sync_on(&o[(round + 1) % 3])?;
        ensure(host.as_slice()? == data.as_slice(), format!("round {round}: download"))?;
        // Up again from the page-locked buffer into a poisoned second buffer.
        let mut y = DeviceBuffer::filled(&h, n, POISON_F32)?;
        upload_pinned(&mut host, &mut y).sync_on(&h)?;
        ensure(y.to_vec()? == data, format!("round {round}: upload_pinned"))?;
    }
    ensure(pool.idle() == 1, format!("the pool reused one buffer: {} idle", pool.idle()))?;
    // A download queued behind a slow write on another stream: the host read waits for both.
    let mut host = pool.get(n)?;
    // SAFETY: the output (`&mut x`) is only used by the download below, which access tracking
    // orders after the write.
    unsafe { SpinWrite { buf: &mut x, ns: 40 * MS, v: 11.0 }.async_on(&o[0])? };
    download(&x, &mut host).sync_on(&o[1])?;
    ensure(host.as_slice()?.iter().all(|&v| v == 11.0), "the download on another stream saw the slow write")
}

/// A use that drops a foreign mark and then records a new event in the same wait loop still waits
/// for every stream it must. Found by review: `wait_before` remembered waited events by address;
/// dropping the destination's last write mark freed its event, the `Arc` of the source's home
/// mark then reused the address, and the wait on the source's home stream (its allocation and
/// upload behind a busy queue) was skipped as done. Repeated with fresh buffers, since it hangs on
/// the allocator's reuse.
fn a_freed_mark_never_stands_in_for_a_new_wait() -> TestResult {
    let d = Device::new(0)?;
    let (h, h2, x) = (d.new_stream()?, d.new_stream()?, d.new_stream()?);
    let n = 1 << 16;
    for round in 0..20u32 {
        let mut dst = DeviceBuffer::<f32>::zeros(&h, n)?;
        dst.fill(&x, 7.0)?; // dst's write mark (on x) is the only holder of its event
        let mut busy = DeviceBuffer::<f32>::zeros(&h2, 1024)?;
        // SAFETY: the output (the buffer's handle) is not read before the work is done: `busy`
        // is only dropped, which the free orders after the spin.
        unsafe { SpinWrite { buf: &mut busy, ns: 20_000_000, v: 1.0 }.async_on(&h2)? }; // h2 busy for 20 ms
        let want = vec![round as f32 + 0.5; n];
        let src = DeviceBuffer::from_host(&h2, &want)?; // queued behind the spin
        dst.copy_from_device(&h, &src)?; // must wait for h2 (src's home), not only for x
        ensure(dst.to_vec()? == want, format!("round {round}: the copy read its source before its upload"))?;
    }
    Ok(())
}

/// Marks that hold the last handles of a stream being captured are dropped after the locks of the
/// use that retires them. Found by review: dropped under the home stream's lock, the last handle's
/// drop abandoned the capture, whose kept allocation (homed on that same stream) then took the
/// lock again: a deadlock of one thread. Run on a thread and waited for at most 20 s.
fn retired_marks_are_dropped_after_the_locks() -> TestResult {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let run = || -> TestResult {
            let d = Device::new(0)?;
            let (h, y) = (d.new_stream()?, d.new_stream()?);
            let mut b = DeviceBuffer::<u32>::zeros(&h, 1024)?;
            let mut out = DeviceBuffer::<u32>::zeros(&h, 1024)?;
            out.copy_from_device(&y, &b)?; // marks on y in `b` and `out` hold handles of y
            let mut c = DeviceBuffer::<u32>::zeros(&h, 1024)?;
            y.begin_capture(cuda_core::CaptureMode::ThreadLocal)?;
            c.fill(&y, 1)?; // the capture keeps `c` (homed on h)
            drop(c);
            drop(y); // not abandoned yet: the marks still hold y
            out.fill(&h, 0)?; // retires out's write mark on y
            b.fill(&h, 0)?; // retires b's read mark: the last handle of y
            h.synchronize()?;
            ensure(b.to_vec()? == vec![0; 1024] && out.to_vec()? == vec![0; 1024], "the fills ran")
        };
        let _ = tx.send(run().map_err(|e| format!("{e:?}")));
    });
    match rx.recv_timeout(std::time::Duration::from_secs(20)) {
        Ok(r) => r.map_err(|e| e.into()),
        Err(_) => Err("a use that retired the last handle of a capturing stream deadlocked".into()),
    }
}

fn main() {
    let mut s = Suite::new();
    // The tests that time overlap run alone: another test's kernels can fill the GPU and
    // serialise two kernels that would otherwise run side by side.
    s.gpu_alone("readers_run_concurrently", readers_run_concurrently)
        .gpu("write_waits_for_every_reader", write_waits_for_every_reader)
        .gpu("read_waits_for_the_last_write", read_waits_for_the_last_write)
        .gpu("free_waits_for_a_reader_elsewhere", free_waits_for_a_reader_elsewhere)
        .gpu_alone("independent_buffers_overlap", independent_buffers_overlap)
        .gpu("home_and_foreign_uses_mix", home_and_foreign_uses_mix)
        .gpu_alone("zip_concurrent_overlaps", zip_concurrent_overlaps)
        .gpu_alone("concurrent_ops_join_back", concurrent_ops_join_back)
        .gpu("concurrent_ops_fork_after_the_caller", concurrent_ops_fork_after_the_caller)
        .gpu("zip_concurrent_in_a_capture", zip_concurrent_in_a_capture)
        .gpu("staging_round_trips", staging_round_trips)
        .gpu("a_freed_mark_never_stands_in_for_a_new_wait", a_freed_mark_never_stands_in_for_a_new_wait)
        .gpu("retired_marks_are_dropped_after_the_locks", retired_marks_are_dropped_after_the_locks);
    s.run()
}

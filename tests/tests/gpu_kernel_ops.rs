//! GPU suite for the `kernels::ops` launchers: every launcher with every argument form (`&`/`&mut`,
//! owned, `Arc`, lazy input and lazy output ops), yielded handles, chains through every entry point
//! (`sync_on`, `sync`, `block_on`, `.await`), empty buffers, length mismatches, and recording
//! `GraphNode` launchers into a CUDA graph.
//! Ignored without a GPU; fails without one when CUDA_ASYNC_REQUIRE_GPU=1.

use cuda_async::memory::{from_host, full, to_host, zeros};
use cuda_async::{zip, DeviceError, DeviceOpExt, GraphNode};
use cuda_async_tests::{assert_close, ensure, random_f32, random_f64, rng, Suite, TestResult, POISON_F32};
use cuda_core::{CaptureMode, Device, DeviceBuffer, InstantiateFlags, Stream};
use kernels::{ops, Element, Kernels};
use rand::rngs::StdRng;
use std::future::IntoFuture;
use std::sync::Arc;

/// An element type under test: how inputs are drawn, the poison written into outputs, and the
/// relative tolerance against `f64` host references.
struct Ty<T> {
    gen: fn(&mut StdRng, usize) -> Vec<T>,
    poison: T,
    tol: f64,
}

const F32: Ty<f32> = Ty { gen: random_f32, poison: POISON_F32, tol: 1e-6 };
const F64: Ty<f64> = Ty { gen: random_f64, poison: f64::NAN, tol: 1e-14 };

/// Sizes: one element, a partial block, and more elements than the capped grid covers at once.
const SIZES: [usize; 3] = [1, 4097, (1 << 22) + 5];

trait El: Element + Into<f64> {}
impl<T: Element + Into<f64>> El for T {}

/// Random inputs `x`, `y` and scalars `alpha`, `beta`, with their `f64` images for references.
struct Data<T> {
    xh: Vec<T>,
    yh: Vec<T>,
    alpha: T,
    beta: T,
    x: Vec<f64>,
    y: Vec<f64>,
    a: f64,
    b: f64,
}

impl<T: El> Data<T> {
    fn new(ty: &Ty<T>, r: &mut StdRng, n: usize) -> Self {
        let (xh, yh, s) = ((ty.gen)(r, n), (ty.gen)(r, n), (ty.gen)(r, 2));
        let f = |v: &[T]| v.iter().map(|&e| e.into()).collect::<Vec<f64>>();
        Data { x: f(&xh), y: f(&yh), a: s[0].into(), b: s[1].into(), xh, yh, alpha: s[0], beta: s[1] }
    }
    fn zip(&self, f: impl Fn(f64, f64) -> f64) -> Vec<f64> {
        self.x.iter().zip(&self.y).map(|(&p, &q)| f(p, q)).collect()
    }
    fn scaled(&self) -> Vec<f64> {
        self.x.iter().map(|v| self.a * v).collect()
    }
    fn axpy(&self) -> Vec<f64> {
        self.zip(|p, q| self.a * p + q)
    }
    fn sum(&self) -> f64 {
        self.x.iter().sum()
    }
}

fn dev() -> Result<Device, cuda_core::Error> {
    Device::new(0)
}

fn poisoned<T: El>(s: &Stream, n: usize, ty: &Ty<T>) -> Result<DeviceBuffer<T>, cuda_core::Error> {
    DeviceBuffer::filled(s, n, ty.poison)
}

/// `got[0]` is the sum `want` of `n` values exact in `f64`, up to accumulation-order rounding.
fn check_sum(got: &DeviceBuffer<f64>, want: f64, n: usize) -> TestResult {
    check_sum_tol(got, want, n, 0.0)
}

/// As [`check_sum`], with the summands themselves off by up to `rel` relative (rounded in `T`).
fn check_sum_tol(got: &DeviceBuffer<f64>, want: f64, n: usize, rel: f64) -> TestResult {
    let got = got.to_vec()?;
    ensure(got.len() == 1, format!("sum output has {} elements", got.len()))?;
    let ok = (got[0] - want).abs() <= 1e-12 * (n as f64).max(1.0) + rel * want.abs();
    ensure(ok, format!("sum n={n}: got {}, want {want}", got[0]))
}

/// Inputs by `&`, outputs by `&mut`; each op yields the very `&mut` it was given.
fn borrowed<T: El>(ty: &Ty<T>) -> TestResult {
    let d = dev()?;
    let s = Stream::new(&d)?;
    let mut r = rng();
    for n in SIZES {
        let dt = Data::new(ty, &mut r, n);
        let x = DeviceBuffer::from_host(&s, &dt.xh)?;
        let y = DeviceBuffer::from_host(&s, &dt.yh)?;
        let mut out = poisoned(&s, n, ty)?;
        let ptr = out.device_ptr();

        let got = ops::fill(&mut out, dt.alpha).sync_on(&s)?.device_ptr();
        ensure(got == ptr, "fill must yield its output")?;
        assert_close(&out.to_vec()?, &vec![dt.a; n], 0.0)?;

        out.fill(&s, ty.poison)?;
        let got = ops::scale(&x, dt.alpha, &mut out).sync_on(&s)?.device_ptr();
        ensure(got == ptr, "scale must yield its output")?;
        assert_close(&out.to_vec()?, &dt.scaled(), ty.tol)?;

        out.fill(&s, ty.poison)?;
        let got = ops::add(&x, &y, &mut out).sync_on(&s)?.device_ptr();
        ensure(got == ptr, "add must yield its output")?;
        assert_close(&out.to_vec()?, &dt.zip(|p, q| p + q), ty.tol)?;

        out.fill(&s, ty.poison)?;
        let got = ops::mul(&x, &y, &mut out).sync_on(&s)?.device_ptr();
        ensure(got == ptr, "mul must yield its output")?;
        assert_close(&out.to_vec()?, &dt.zip(|p, q| p * q), ty.tol)?;

        let mut yy = DeviceBuffer::from_host(&s, &dt.yh)?;
        let yptr = yy.device_ptr();
        let got = ops::axpy(dt.alpha, &x, &mut yy).sync_on(&s)?.device_ptr();
        ensure(got == yptr, "axpy must yield y")?;
        assert_close(&yy.to_vec()?, &dt.axpy(), ty.tol)?;

        let mut total = DeviceBuffer::<f64>::filled(&s, 1, f64::NAN)?;
        ops::sum(&x, &mut total).sync_on(&s)?;
        check_sum(&total, dt.sum(), n)?;
        // A second sum into the same output overwrites it rather than accumulating.
        ops::sum(&y, &mut total).sync_on(&s)?;
        check_sum(&total, dt.y.iter().sum(), n)?;
    }
    Ok(())
}

/// Owned buffers, `Arc` inputs, lazy input ops and lazy output ops, read back through `to_host`.
fn argument_forms<T: El>(ty: &Ty<T>) -> TestResult {
    let d = dev()?;
    let s = Stream::new(&d)?;
    let mut r = rng();
    for n in SIZES {
        let dt = Data::new(ty, &mut r, n);

        // Owned input and owned output; the output comes back.
        let x = DeviceBuffer::from_host(&s, &dt.xh)?;
        let out = ops::scale(x, dt.alpha, poisoned(&s, n, ty)?).sync()?;
        assert_close(&out.to_vec()?, &dt.scaled(), ty.tol)?;

        // Owned output written by fill, on the caller's stream.
        let out = ops::fill(poisoned(&s, n, ty)?, dt.beta).sync_on(&s)?;
        assert_close(&out.to_vec()?, &vec![dt.b; n], 0.0)?;

        // The same Arc twice as inputs; the op drops its handles once executed.
        let xa = Arc::new(DeviceBuffer::from_host(&s, &dt.xh)?);
        let out = ops::mul(xa.clone(), Arc::clone(&xa), poisoned(&s, n, ty)?).sync_on(&s)?;
        assert_close(&out.to_vec()?, &dt.zip(|p, _| p * p), ty.tol)?;
        ensure(Arc::strong_count(&xa) == 1, "executed op still holds an Arc")?;

        // Lazy inputs (owned and borrowed host data) and a lazy output, read back via to_host.
        let host = ops::add(from_host(dt.xh.clone()), from_host(&dt.yh), full(n, ty.poison))
            .then(to_host)
            .sync_on(&s)?;
        assert_close(host.as_slice()?, &dt.zip(|p, q| p + q), ty.tol)?;

        // Lazy zeroed output with an Arc input: y = alpha * x + 0.
        let y = ops::axpy(dt.alpha, xa.clone(), zeros(n)).sync()?;
        assert_close(&y.to_vec()?, &dt.scaled(), ty.tol)?;

        // Lazy output of fill, and lazy input of sum into a `&mut` output.
        let host = ops::fill(full(n, ty.poison), dt.alpha).then(to_host).sync()?;
        assert_close(host.as_slice()?, &vec![dt.a; n], 0.0)?;
        let mut total = DeviceBuffer::<f64>::filled(&s, 1, f64::NAN)?;
        ops::sum(from_host(dt.xh.clone()), &mut total).sync_on(&s)?;
        check_sum(&total, dt.sum(), n)?;
        let total = ops::sum(xa, full(1, f64::NAN)).sync()?;
        check_sum(&total, dt.sum(), n)?;

        // `&mut` input (it is also readable) and an owned y updated in place.
        let mut xm = DeviceBuffer::from_host(&s, &dt.xh)?;
        let y = ops::axpy(dt.alpha, &mut xm, DeviceBuffer::from_host(&s, &dt.yh)?).sync_on(&s)?;
        assert_close(&y.to_vec()?, &dt.axpy(), ty.tol)?;
    }
    Ok(())
}

/// `axpy(..).then(|y| scale(y, ..))` through every entry point, and chains over `&mut` buffers.
fn chains<T: El>(ty: &Ty<T>) -> TestResult {
    let d = dev()?;
    let s = Stream::new(&d)?;
    let mut r = rng();
    let n = SIZES[2];
    let dt = Data::new(ty, &mut r, n);
    let x = DeviceBuffer::from_host(&s, &dt.xh)?;
    let (alpha, beta, poison) = (dt.alpha, dt.beta, ty.poison);
    let want: Vec<f64> = dt.x.iter().map(|v| dt.b * (dt.a * v)).collect();
    let chain =
        || ops::axpy(alpha, &x, zeros(n)).then(move |y| ops::scale(y, beta, full(n, poison))).then(to_host);

    let h = chain().sync_on(&s)?;
    assert_close(h.as_slice()?, &want, ty.tol)?;
    let h = chain().sync()?;
    assert_close(h.as_slice()?, &want, ty.tol)?;
    let h = futures::executor::block_on(chain().into_future())?;
    assert_close(h.as_slice()?, &want, ty.tol)?;
    let h = futures::executor::block_on(async { chain().await })?;
    assert_close(h.as_slice()?, &want, ty.tol)?;

    // In place over borrowed buffers: y <- alpha x + y twice, then out <- beta y.
    let mut y = DeviceBuffer::from_host(&s, &dt.yh)?;
    let mut out = poisoned(&s, n, ty)?;
    let out_ref = &mut out;
    ops::axpy(alpha, &x, &mut y)
        .then(|y| ops::axpy(alpha, &x, y))
        .then(move |y| ops::scale(y, beta, out_ref))
        .sync_on(&s)?;
    let y2 = dt.zip(|p, q| 2.0 * dt.a * p + q);
    assert_close(&y.to_vec()?, &y2, ty.tol)?;
    assert_close(&out.to_vec()?, &y2.iter().map(|v| dt.b * v).collect::<Vec<_>>(), ty.tol)?;

    // A sum at the end of a chain of elementwise ops, awaited.
    let total = futures::executor::block_on(
        ops::mul(&x, &x, zeros(n)).then(|sq| ops::sum(sq, full(1, f64::NAN))).into_future(),
    )?;
    // Each square is rounded to T (relative error <= tol) before the f64 sum of non-negatives.
    check_sum_tol(&total, dt.x.iter().map(|v| v * v).sum(), n, ty.tol)
}

/// Every launcher over empty buffers succeeds and launches nothing; the sum of nothing is 0.
fn empty_buffers<T: El>(ty: &Ty<T>) -> TestResult {
    let d = dev()?;
    let s = Stream::new(&d)?;
    let e = DeviceBuffer::<T>::from_host(&s, &[])?;
    let mut out = DeviceBuffer::<T>::from_host(&s, &[])?;
    ops::fill(&mut out, ty.poison).sync_on(&s)?;
    ops::scale(&e, ty.poison, &mut out).sync_on(&s)?;
    ops::axpy(ty.poison, &e, &mut out).sync_on(&s)?;
    ops::add(&e, &e, &mut out).sync_on(&s)?;
    ops::mul(&e, zeros(0), &mut out).sync_on(&s)?;
    ensure(out.to_vec()?.is_empty(), "empty output")?;
    let total = ops::sum(&e, full(1, f64::NAN)).sync_on(&s)?;
    ensure(total.to_vec()? == [0.0], "sum of nothing")
}

/// The error must be a shape error from `op`.
fn expect_shape<O>(res: Result<O, DeviceError>, op: &str) -> TestResult {
    match res {
        Err(DeviceError::Shape { op: got, detail }) if got == op => {
            ensure(!detail.is_empty(), format!("{op}: empty shape detail"))
        }
        Err(e) => Err(format!("{op}: expected a shape error from {op}, got {e}").into()),
        Ok(_) => Err(format!("{op}: a length mismatch must fail").into()),
    }
}

/// Mismatched lengths are refused before anything is launched: outputs keep their poison, and the
/// stream and device stay usable.
fn length_mismatch<T: El>(ty: &Ty<T>) -> TestResult {
    let d = dev()?;
    let s = Stream::new(&d)?;
    let mut r = rng();
    let n = 1000;
    let dt = Data::new(ty, &mut r, n);
    let x = DeviceBuffer::from_host(&s, &dt.xh)?;
    let short = DeviceBuffer::from_host(&s, &dt.yh[..n - 1])?;
    let mut out = poisoned(&s, n, ty)?;
    let mut short_out = poisoned(&s, n - 1, ty)?;

    expect_shape(ops::scale(&x, dt.alpha, &mut short_out).sync_on(&s), "scale")?;
    expect_shape(ops::axpy(dt.alpha, &short, &mut out).sync_on(&s), "axpy")?;
    expect_shape(ops::add(&x, &short, &mut out).sync_on(&s), "add")?;
    expect_shape(ops::add(&x, &x, &mut short_out).sync_on(&s), "add")?;
    expect_shape(ops::mul(&short, &x, &mut out).sync_on(&s), "mul")?;
    expect_shape(ops::sum(&x, &mut DeviceBuffer::<f64>::zeros(&s, 2)?).sync_on(&s), "sum")?;
    expect_shape(ops::sum(&x, zeros(0)).sync(), "sum")?;
    // Lazy arguments are executed first, then checked: also through sync() and .await.
    expect_shape(ops::axpy(dt.alpha, &x, zeros(n + 1)).sync(), "axpy")?;
    expect_shape(
        futures::executor::block_on(ops::mul(from_host(dt.xh.clone()), &short, zeros(n)).into_future()),
        "mul",
    )?;
    // A failing op in a chain stops the chain: the closure after it never runs.
    let ran = std::sync::atomic::AtomicBool::new(false);
    let res = ops::add(&x, &short, &mut out)
        .then(|o| {
            ran.store(true, std::sync::atomic::Ordering::SeqCst);
            ops::fill(o, dt.alpha)
        })
        .sync_on(&s);
    expect_shape(res, "add")?;
    ensure(!ran.load(std::sync::atomic::Ordering::SeqCst), "the chain went on after an error")?;

    ensure(out.to_vec()?.iter().all(|v| Into::<f64>::into(*v).is_nan()), "a refused op wrote its output")?;
    ensure(
        short_out.to_vec()?.iter().all(|v| Into::<f64>::into(*v).is_nan()),
        "a refused op wrote its output",
    )?;
    // Still usable afterwards.
    ops::scale(&x, dt.alpha, &mut out).sync_on(&s)?;
    assert_close(&out.to_vec()?, &dt.scaled(), ty.tol)
}

/// Queues a [`GraphNode`] op on a capturing stream: only graph-replayable work may get here.
///
/// # Safety
/// As for `async_on`: the op's output must not be used before the captured work has run.
unsafe fn record<O: GraphNode>(op: O, s: &Stream) -> Result<O::Output, DeviceError> {
    // SAFETY: forwarded to the caller.
    unsafe { op.async_on(s) }
}

/// GraphNode launchers over existing buffers record into a CUDA graph (kernels loaded beforehand),
/// queue nothing but kernel and memset nodes, and replay correctly.
fn graph_capture() -> TestResult {
    let d = dev()?;
    let s = Stream::new(&d)?;
    let mut r = rng();
    let n = 100_003;
    let dt = Data::new(&F32, &mut r, n);
    let x = DeviceBuffer::from_host(&s, &dt.xh)?;
    let mut y = DeviceBuffer::from_host(&s, &dt.yh)?;
    let mut out = poisoned(&s, n, &F32)?;
    let mut total = DeviceBuffer::<f64>::filled(&s, 1, f64::NAN)?;
    Kernels::get(&d)?; // compile and load before recording
    s.synchronize()?;
    s.begin_capture(CaptureMode::ThreadLocal)?;
    let op = zip!(
        ops::axpy(dt.alpha, &x, &mut y).then(|y| ops::scale(y, dt.beta, &mut out)),
        ops::sum(&x, &mut total)
    );
    // SAFETY: nothing reads the outputs before the graph has run and the stream synchronised.
    let queued = unsafe { record(op, &s) }.map(|_| ());
    let g = s.end_capture()?;
    queued?;
    ensure(g.node_count()? == 4, format!("axpy, scale, memset, sum: 4 nodes, got {}", g.node_count()?))?;
    let exec = g.instantiate_and_upload(InstantiateFlags::NONE, &s)?;
    for _ in 0..3 {
        exec.launch(&s)?;
    }
    s.synchronize()?;
    let y3 = dt.zip(|p, q| 3.0 * dt.a * p + q);
    assert_close(&y.to_vec()?, &y3, 1e-5)?;
    assert_close(&out.to_vec()?, &y3.iter().map(|v| dt.b * v).collect::<Vec<_>>(), 1e-5)?;
    check_sum(&total, dt.sum(), n)
}

fn main() {
    let mut s = Suite::new();
    s.gpu("borrowed_f32", || borrowed(&F32))
        .gpu("borrowed_f64", || borrowed(&F64))
        .gpu("argument_forms_f32", || argument_forms(&F32))
        .gpu("argument_forms_f64", || argument_forms(&F64))
        .gpu("chains_f32", || chains(&F32))
        .gpu("chains_f64", || chains(&F64))
        .gpu("empty_buffers_f32", || empty_buffers(&F32))
        .gpu("empty_buffers_f64", || empty_buffers(&F64))
        .gpu("length_mismatch_f32", || length_mismatch(&F32))
        .gpu("length_mismatch_f64", || length_mismatch(&F64))
        .gpu("graph_capture", graph_capture);
    s.run()
}

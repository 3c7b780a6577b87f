//! GPU suite for the `linear` kernel (`Kernels::linear`, `ops::linear`) and the MLP models of
//! `cuda-async-examples`: the kernel against an f64 host reference with a rigorous rounding bound
//! (shapes that are not multiples of 32, empty dimensions, more row tiles than one grid covers,
//! ReLU on and off, f32 and f64, poisoned outputs), the op's argument forms, chains and graph
//! capture, length checks, and the models: graph == eager == host reference at batch 1 and 16,
//! `forward_async` on a current-thread runtime, tasks sharing one model, and refused inputs.
//! Ignored without a GPU; fails without one when CUDA_ASYNC_REQUIRE_GPU=1.

use cuda_async::memory::{to_host, zeros};
use cuda_async::{CudaGraph, DeviceError, DeviceOpExt, Module};
use cuda_async_tests::{ensure, random_f32, random_f64, rng, Suite, TestResult};
use cuda_core::{Device, DeviceBuffer, Stream};
use kernels::ops::{self, LinearShape};
use kernels::{Element, Kernels};
use models::mlp::{max_abs_diff, max_rel_error, EagerMlp, GraphMlp, MlpWeights, DIMS};
use rand::rngs::StdRng;
use rand::Rng;
use std::sync::Arc;

/// The models' bound: error relative to the reference's scale.
const TOL: f64 = 1e-4;

fn dev() -> Result<Device, cuda_core::Error> {
    Device::new(0)
}

trait El: Element + Into<f64> {}
impl<T: Element + Into<f64>> El for T {}

/// An element type under test: how inputs are drawn, the poison written into outputs, and the
/// unit roundoff of its arithmetic.
struct Ty<T> {
    gen: fn(&mut StdRng, usize) -> Vec<T>,
    poison: T,
    u: f64,
}

const F32: Ty<f32> = Ty { gen: random_f32, poison: f32::NAN, u: f32::EPSILON as f64 / 2.0 };
const F64: Ty<f64> = Ty { gen: random_f64, poison: f64::NAN, u: f64::EPSILON / 2.0 };

fn shape(batch: usize, in_dim: usize, out_dim: usize, relu: bool) -> LinearShape {
    LinearShape { batch, in_dim, out_dim, relu }
}

/// `(batch, in_dim, out_dim)`: single elements, non-multiples of 32 in every dimension, the MLP's
/// square layer, empty dimensions, and more row tiles (of 4) than a grid's 65535 rows of blocks.
const SHAPES: [(usize, usize, usize); 12] = [
    (1, 1, 1),
    (1, 1024, 1024),
    (3, 33, 7),
    (4, 100, 65),
    (5, 129, 31),
    (16, 1024, 1000),
    (17, 31, 257),
    (7, 97, 1),
    (2, 0, 5),
    (0, 8, 8),
    (6, 8, 0),
    (300_001, 3, 2),
];

/// The f64 reference of a layer and, per element, a bound on the kernel's rounding error: each
/// lane sums about `in_dim / 32` products in order (fused multiply-adds), then 5 shuffle levels
/// and the bias add, so the error is at most `gamma(in_dim/32 + 7) * (|b| + sum |x w|)` with
/// `gamma(n) = n u / (1 - n u)`; ReLU does not increase it.
fn reference<T: El>(x: &[T], w: &[T], b: &[T], s: LinearShape, u: f64) -> (Vec<f64>, Vec<f64>) {
    let n = (s.in_dim.div_ceil(32) + 7) as f64;
    let gamma = n * u / (1.0 - n * u);
    let (mut want, mut bound) = (Vec::new(), Vec::new());
    for r in 0..s.batch {
        let xr = &x[r * s.in_dim..(r + 1) * s.in_dim];
        for o in 0..s.out_dim {
            let wr = &w[o * s.in_dim..(o + 1) * s.in_dim];
            let (mut acc, mut mag) = (b[o].into(), b[o].into().abs());
            for (&xi, &wi) in xr.iter().zip(wr) {
                let p = xi.into() * wi.into();
                acc += p;
                mag += p.abs();
            }
            want.push(if s.relu { acc.max(0.0) } else { acc });
            bound.push(gamma * mag + 1e-300);
        }
    }
    (want, bound)
}

/// `got` within `bound` of `want` elementwise; NaN never passes.
fn check_bound<T: El>(got: &[T], want: &[f64], bound: &[f64], what: &str) -> TestResult {
    ensure(got.len() == want.len(), format!("{what}: {} outputs, expected {}", got.len(), want.len()))?;
    for (i, ((&g, &w), &e)) in got.iter().zip(want).zip(bound).enumerate() {
        let g: f64 = g.into();
        let ok = (g - w).abs() <= e; // false for NaN
        ensure(ok, format!("{what}: element {i}: got {g}, expected {w} (bound {e:.3e})"))?;
    }
    Ok(())
}

/// Every shape, with and without ReLU, through `Kernels::linear` and `ops::linear`, into outputs
/// poisoned with NaN (so an unwritten element fails).
fn linear_vs_host<T: El>(ty: &Ty<T>) -> TestResult {
    let d = dev()?;
    let s = Stream::new(&d)?;
    let k = Kernels::get(&d)?;
    let mut r = rng();
    for (batch, in_dim, out_dim) in SHAPES {
        let xh = (ty.gen)(&mut r, batch * in_dim);
        let wh = (ty.gen)(&mut r, out_dim * in_dim);
        let bh = (ty.gen)(&mut r, out_dim);
        let x = DeviceBuffer::from_host(&s, &xh)?;
        let w = DeviceBuffer::from_host(&s, &wh)?;
        let b = DeviceBuffer::from_host(&s, &bh)?;
        for relu in [false, true] {
            let sh = shape(batch, in_dim, out_dim, relu);
            let (want, bound) = reference(&xh, &wh, &bh, sh, ty.u);
            let what = format!("{sh:?}");

            let mut y = DeviceBuffer::filled(&s, batch * out_dim, ty.poison)?;
            k.linear(&s, &x, &w, &b, &mut y, sh)?;
            check_bound(&y.to_vec()?, &want, &bound, &format!("Kernels::linear {what}"))?;

            y.fill(&s, ty.poison)?;
            let ptr = y.device_ptr();
            let got = ops::linear(&x, &w, &b, &mut y, sh).sync_on(&s)?.device_ptr();
            ensure(got == ptr, "ops::linear must yield its output")?;
            check_bound(&y.to_vec()?, &want, &bound, &format!("ops::linear {what}"))?;
        }
    }
    Ok(())
}

/// Owned, lazy and `Arc` arguments, a two-layer chain read by `to_host`, and the op recorded into
/// a graph over borrowed buffers, replayed after the input changed.
fn linear_forms_and_graph() -> TestResult {
    let d = dev()?;
    let s = Stream::new(&d)?;
    let mut r = rng();
    let (batch, d0, d1, d2) = (5, 70, 45, 33);
    let (s1, s2) = (shape(batch, d0, d1, true), shape(batch, d1, d2, false));
    let xh = random_f32(&mut r, batch * d0);
    let (w1h, b1h) = (random_f32(&mut r, d1 * d0), random_f32(&mut r, d1));
    let (w2h, b2h) = (random_f32(&mut r, d2 * d1), random_f32(&mut r, d2));
    let mut x = DeviceBuffer::from_host(&s, &xh)?;
    let w1 = Arc::new(DeviceBuffer::from_host(&s, &w1h)?);
    let b1 = DeviceBuffer::from_host(&s, &b1h)?;
    let w2 = DeviceBuffer::from_host(&s, &w2h)?;
    let b2 = DeviceBuffer::from_host(&s, &b2h)?;
    let u = F32.u;

    // Lazy zeroed output, `Arc` weights, owned bias: yields the new buffer.
    let (want1, bound1) = reference(&xh, &w1h, &b1h, s1, u);
    let y = ops::linear(&x, w1.clone(), DeviceBuffer::from_host(&s, &b1h)?, zeros(batch * d1), s1).sync()?;
    check_bound(&y.to_vec()?, &want1, &bound1, "lazy output")?;

    // Two layers in one chain, read back through to_host. The second layer's bound uses the
    // first layer's f64 output, so widen it by the first layer's error carried through |w2|.
    let host = ops::linear(&x, &*w1, &b1, zeros(batch * d1), s1)
        .then(|h| ops::linear(h, &w2, &b2, zeros(batch * d2), s2))
        .then(to_host)
        .sync_on(&s)?;
    // The device's hidden values are off from want1 by at most bound1 plus the rounding to f32.
    let h1: Vec<f32> = want1.iter().map(|&v| v as f32).collect();
    let (want2, bound2) = reference(&h1, &w2h, &b2h, s2, u);
    let max = |v: &[f64]| v.iter().fold(0.0f64, |m, &e| m.max(e.abs()));
    let carried = 2.0 * (max(&bound1) + u * max(&want1));
    let bound2: Vec<f64> = bound2
        .iter()
        .enumerate()
        .map(|(i, &e)| {
            let o = i % d2;
            let wsum: f64 = w2h[o * d1..(o + 1) * d1].iter().map(|&v| f64::from(v).abs()).sum();
            2.0 * e + carried * wsum
        })
        .collect();
    check_bound(host.as_slice()?, &want2, &bound2, "two-layer chain")?;

    // Captured over borrowed buffers; replays follow the input buffer's contents.
    Kernels::get(&d)?;
    let mut h = DeviceBuffer::filled(&s, batch * d1, f32::NAN)?;
    let mut out = DeviceBuffer::filled(&s, batch * d2, f32::NAN)?;
    s.synchronize()?;
    let graph = CudaGraph::scope(&s, |sc| {
        let h = sc.record(ops::linear(&x, &*w1, &b1, &mut h, s1))?;
        sc.record(ops::linear(&*h, &w2, &b2, &mut out, s2))?;
        Ok(())
    })?;
    ensure(graph.graph().node_count()? == 2, "two kernel nodes")?;
    for round in 0..3 {
        let xh = if round == 0 { xh.clone() } else { random_f32(&mut r, batch * d0) };
        x.copy_from_host(&s, &xh)?;
        graph.launch().sync_on(&s)?;
        let (want1, bound1) = reference(&xh, &w1h, &b1h, s1, u);
        check_bound(&h.to_vec()?, &want1, &bound1, &format!("graph layer 1, round {round}"))?;
        let (want2, bound2) = reference(&h.to_vec()?, &w2h, &b2h, s2, u);
        check_bound(&out.to_vec()?, &want2, &bound2, &format!("graph layer 2, round {round}"))?;
    }
    Ok(())
}

/// The error must be a shape error from `op`.
fn expect_shape<O>(res: Result<O, DeviceError>, op: &str) -> TestResult {
    match res {
        Err(DeviceError::Shape { op: got, detail }) if got == op => {
            ensure(!detail.is_empty(), format!("{op}: empty shape detail"))
        }
        Err(e) => Err(format!("expected a shape error from {op}, got {e}").into()),
        Ok(_) => Err(format!("{op}: a length mismatch must fail").into()),
    }
}

/// Wrong lengths and impossible shapes are refused before launching: outputs keep their poison.
fn linear_length_mismatch() -> TestResult {
    let d = dev()?;
    let s = Stream::new(&d)?;
    let k = Kernels::get(&d)?;
    let (batch, i, o) = (3, 40, 20);
    let sh = shape(batch, i, o, true);
    let buf = |n: usize| DeviceBuffer::filled(&s, n, 0.5f32);
    let (x, w, b) = (buf(batch * i)?, buf(o * i)?, buf(o)?);
    let (x_short, w_long, b_short) = (buf(batch * i - 1)?, buf(o * i + 1)?, buf(o - 1)?);
    let mut y = DeviceBuffer::filled(&s, batch * o, f32::NAN)?;
    let mut y_short = DeviceBuffer::filled(&s, batch * o - 1, f32::NAN)?;

    expect_shape(ops::linear(&x_short, &w, &b, &mut y, sh).sync_on(&s), "linear")?;
    expect_shape(ops::linear(&x, &w_long, &b, &mut y, sh).sync_on(&s), "linear")?;
    expect_shape(ops::linear(&x, &w, &b_short, &mut y, sh).sync_on(&s), "linear")?;
    expect_shape(ops::linear(&x, &w, &b, &mut y_short, sh).sync_on(&s), "linear")?;
    expect_shape(ops::linear(&x, &w, &b, zeros(batch * o + 1), sh).sync(), "linear")?;
    expect_shape(ops::linear(&x, &w, &b, &mut y, shape(batch, o, i, true)).sync_on(&s), "linear")?;
    let huge = shape(1 << 31, 0, 0, false);
    expect_shape(ops::linear(&x, &w, &b, &mut y, huge).sync_on(&s), "linear")?;

    let direct = |r: cuda_core::Result<()>, what: &str, want_len: bool| -> TestResult {
        match r {
            Err(cuda_core::Error::LengthMismatch { .. }) if want_len => Ok(()),
            Err(cuda_core::Error::InvalidArgument(_)) if !want_len => Ok(()),
            other => Err(format!("Kernels::linear {what}: unexpected {other:?}").into()),
        }
    };
    direct(k.linear(&s, &x_short, &w, &b, &mut y, sh), "short x", true)?;
    direct(k.linear(&s, &x, &w_long, &b, &mut y, sh), "long w", true)?;
    direct(k.linear(&s, &x, &w, &b_short, &mut y, sh), "short b", true)?;
    direct(k.linear(&s, &x, &w, &b, &mut y_short, sh), "short y", true)?;
    direct(k.linear(&s, &x, &w, &b, &mut y, huge), "huge batch", false)?;
    direct(k.linear(&s, &x, &w, &b, &mut y, shape(1, usize::MAX, 1, false)), "huge in_dim", false)?;

    ensure(y.to_vec()?.iter().all(|v| v.is_nan()), "a refused launch wrote its output")?;
    ensure(y_short.to_vec()?.iter().all(|v| v.is_nan()), "a refused launch wrote its output")?;
    // Still usable: 0.5 + 40 * 0.25 = 10.5 everywhere.
    ops::linear(&x, &w, &b, &mut y, sh).sync_on(&s)?;
    ensure(y.to_vec()?.iter().all(|&v| v == 10.5), "after the refusals, a valid launch computes 10.5")
}

fn random_input(r: &mut StdRng, n: usize) -> Vec<f32> {
    (0..n).map(|_| r.random_range(-1.0f32..1.0)).collect()
}

/// Graph forward == eager forward == f64 host reference at batch 1 and 16 (two inputs each, so
/// replays must read the new input), through `Module::forward`, `GraphMlp::run` and the
/// eager chain over preallocated buffers.
fn mlp_graph_eager_host() -> TestResult {
    let d = dev()?;
    let s = Stream::new(&d)?;
    let mut r = rng();
    let weights = Arc::new(MlpWeights::random(&s, r.random(), &DIMS)?);
    ensure(weights.num_layers() == 4 && weights.in_dim() == 1024, "4 layers of width 1024")?;
    let eager = EagerMlp::new(weights.clone(), s.clone());
    for batch in [1, 16] {
        let mut graph = GraphMlp::new(weights.clone(), &s, batch)?;
        ensure(graph.graph().graph().node_count()? == 4, "one kernel node per layer")?;
        ensure(graph.input_len() == batch * 1024 && graph.output_len() == batch * 1024, "buffer sizes")?;
        for round in 0..2 {
            let input = random_input(&mut r, batch * 1024);
            let want = weights.host_forward_f64(&input, batch);
            let e = eager.forward(&input)?;
            let g = Module::forward(&mut graph, input.clone())?;
            let g2 = graph.run(&input)?;
            let what = format!("batch {batch}, round {round}");
            let (err_e, err_g) = (max_rel_error(&e, &want), max_rel_error(&g, &want));
            ensure(err_e < TOL, format!("{what}: eager error {err_e:.3e}"))?;
            ensure(err_g < TOL, format!("{what}: graph error {err_g:.3e}"))?;
            let scale = want.iter().fold(1.0f64, |m, v| m.max(v.abs()));
            let diff = max_abs_diff(&g, &e) / scale;
            ensure(diff <= 1e-6, format!("{what}: graph vs eager {diff:.3e}"))?;
            ensure(g == g2, format!("{what}: two replays on one input differ"))?;
            ensure(want.iter().any(|&v| v.abs() > 0.05), format!("{what}: outputs are all ~0"))?;

            // The layers alone, over preallocated buffers, give the graph's output too.
            let dx = DeviceBuffer::from_host(&s, &input)?;
            let mut acts = weights.alloc_activations(&s, batch)?;
            let last = weights.layers_into(&dx, &mut acts, batch)?.sync_on(&s)?.to_vec()?;
            ensure(max_abs_diff(&last, &g) / scale <= 1e-6, format!("{what}: layers_into vs graph"))?;
            // The graph's own output buffer holds the last pass's output.
            ensure(graph.output_buffer().to_vec()? == g2, format!("{what}: output buffer"))?;
        }
    }
    Ok(())
}

/// `forward_async` (graph and eager) on a current-thread runtime, interleaved with blocking
/// passes, on a non-square model.
fn mlp_forward_async_current_thread() -> TestResult {
    let d = dev()?;
    let s = Stream::new(&d)?;
    let mut r = rng();
    let weights = Arc::new(MlpWeights::random(&s, r.random(), &[300, 257, 129, 64, 10])?);
    let batch = 3;
    let mut graph = GraphMlp::new(weights.clone(), &s, batch)?;
    let eager = EagerMlp::new(weights.clone(), s.clone());
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    for round in 0..4 {
        let input = random_input(&mut r, batch * 300);
        let want = weights.host_forward_f64(&input, batch);
        let (g, e) = rt.block_on(async {
            let g = graph.forward_async(input.clone()).await?;
            let e = eager.forward_async(&input).await?;
            Ok::<_, DeviceError>((g, e))
        })?;
        let b = graph.run(&input)?;
        ensure(g.len() == batch * 10, "output length")?;
        for (what, out) in [("graph forward_async", &g), ("eager forward_async", &e), ("blocking run", &b)] {
            let err = max_rel_error(out, &want);
            ensure(err < TOL, format!("round {round}: {what}: error {err:.3e}"))?;
        }
        ensure(g == b, format!("round {round}: async and blocking graph passes differ"))?;
    }
    Ok(())
}

/// Eight tokio tasks on a multi-thread runtime share one model behind a tokio mutex; every output
/// matches its precomputed reference.
fn mlp_shared_by_tasks() -> TestResult {
    let d = dev()?;
    let s = Stream::new(&d)?;
    let mut r = rng();
    let weights = Arc::new(MlpWeights::random(&s, r.random(), &[256, 512, 128, 128, 32])?);
    let batch = 2;
    let (tasks, passes) = (8, 4);
    let jobs: Vec<Vec<(Vec<f32>, Vec<f64>)>> = (0..tasks)
        .map(|_| {
            (0..passes)
                .map(|_| {
                    let x = random_input(&mut r, batch * 256);
                    let want = weights.host_forward_f64(&x, batch);
                    (x, want)
                })
                .collect()
        })
        .collect();
    let model = Arc::new(tokio::sync::Mutex::new(GraphMlp::new(weights, &s, batch)?));
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(4).enable_all().build()?;
    let results = rt.block_on(async {
        let handles: Vec<_> = jobs
            .into_iter()
            .map(|task| {
                let model = model.clone();
                tokio::spawn(async move {
                    let mut worst = 0.0f64;
                    for (x, want) in task {
                        let out = model.lock().await.forward_async(x).await?;
                        worst = worst.max(max_rel_error(&out, &want));
                        tokio::task::yield_now().await;
                    }
                    Ok::<f64, DeviceError>(worst)
                })
            })
            .collect();
        let mut out = Vec::new();
        for h in handles {
            out.push(h.await);
        }
        out
    });
    ensure(results.len() == tasks, "every task reported")?;
    for (k, res) in results.into_iter().enumerate() {
        let worst = res??;
        ensure(worst < TOL, format!("task {k}: error {worst:.3e}"))?;
    }
    Ok(())
}

/// Inputs of the wrong length and impossible models are refused with errors, and the models stay
/// usable.
fn mlp_refusals() -> TestResult {
    let d = dev()?;
    let s = Stream::new(&d)?;
    let mut r = rng();
    // The last two: weights past isize::MAX bytes, and 4 EiB (past any address space), whose
    // element counts fit usize: refused, not a panic or an aborted process.
    for dims in [&[4usize][..], &[], &[4, 0, 2], &[(1 << 31) - 1, (1 << 31) - 1], &[1 << 30, 1 << 30]] {
        ensure(MlpWeights::random(&s, 1, dims).is_err(), format!("dims {dims:?} must be refused"))?;
    }
    let weights = Arc::new(MlpWeights::random(&s, r.random(), &[64, 48, 16])?);
    ensure(GraphMlp::new(weights.clone(), &s, 0).is_err(), "a batch of 0 must be refused")?;
    let mut graph = GraphMlp::new(weights.clone(), &s, 2)?;
    let eager = EagerMlp::new(weights.clone(), s.clone());
    expect_shape(graph.forward(vec![0.0; 64 * 2 + 1]), "GraphMlp::forward")?;
    expect_shape(graph.forward(vec![0.0; 64]), "GraphMlp::forward")?;
    expect_shape(graph.run(&[]), "GraphMlp::forward")?;
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    expect_shape(rt.block_on(graph.forward_async(vec![0.0; 3])), "GraphMlp::forward")?;
    expect_shape(eager.forward(&[0.0; 65]), "EagerMlp::forward")?;
    expect_shape(eager.forward(&[]), "EagerMlp::forward")?;
    let dx = DeviceBuffer::from_host(&s, &[0.0f32; 128])?;
    let mut acts = weights.alloc_activations(&s, 2)?;
    expect_shape(weights.layers_into(&dx, &mut acts[..1], 2).map(drop), "MlpWeights::layers_into")?;
    expect_shape(weights.layers_into(&dx, &mut acts, 3)?.sync_on(&s), "linear")?;
    // Still usable after the refusals.
    let input = random_input(&mut r, 128);
    let want = weights.host_forward_f64(&input, 2);
    let err = max_rel_error(&graph.forward(input.clone())?, &want);
    ensure(err < TOL, format!("graph after refusals: error {err:.3e}"))?;
    let err = max_rel_error(&eager.forward(&input)?, &want);
    ensure(err < TOL, format!("eager after refusals: error {err:.3e}"))
}

/// `LinearShape::lens` and the error helpers, on the host.
fn host_helpers() -> TestResult {
    let l = shape(3, 5, 7, true).lens()?;
    ensure((l.x, l.w, l.b, l.y) == (15, 35, 7, 21), format!("lens {l:?}"))?;
    ensure(shape(1 << 31, 1, 1, false).lens().is_err(), "batch above i32::MAX")?;
    ensure(shape(1, 1, (1 << 31) - 1, false).lens().is_ok(), "out_dim of i32::MAX")?;
    let big = (1usize << 31) - 1;
    let overflow = shape(big, big, big, false).lens();
    ensure(overflow.is_err() == (usize::BITS < 64), format!("overflow check {overflow:?}"))?;
    ensure(max_rel_error(&[1.0, 2.0], &[1.0, 2.0]) == 0.0, "equal")?;
    ensure(max_rel_error(&[1.5, -4.0], &[1.0, -4.0]) == 0.125, "diff 0.5 over scale 4")?;
    ensure(max_rel_error(&[0.5], &[0.0]) == 0.5, "scale at least 1")?;
    ensure(max_rel_error(&[f32::NAN], &[0.0]) == f64::INFINITY, "NaN never passes")?;
    ensure(max_rel_error(&[1.0], &[1.0, 2.0]) == f64::INFINITY, "length mismatch")?;
    ensure(max_abs_diff(&[1.0, f32::INFINITY], &[1.0, 0.0]) == f64::INFINITY, "inf diff")?;
    ensure(max_abs_diff(&[1.0, 3.0], &[1.0, 2.5]) == 0.5, "abs diff")
}

fn main() {
    let mut s = Suite::new();
    s.cpu("host_helpers", host_helpers);
    s.gpu("linear_vs_host_f32", || linear_vs_host(&F32))
        .gpu("linear_vs_host_f64", || linear_vs_host(&F64))
        .gpu("linear_forms_and_graph", linear_forms_and_graph)
        .gpu("linear_length_mismatch", linear_length_mismatch)
        .gpu("mlp_graph_eager_host", mlp_graph_eager_host)
        .gpu("mlp_forward_async_current_thread", mlp_forward_async_current_thread)
        .gpu("mlp_shared_by_tasks", mlp_shared_by_tasks)
        .gpu("mlp_refusals", mlp_refusals);
    s.run()
}

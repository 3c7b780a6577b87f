//! GPU suite of the tensor-core products of batched decode steps (`kernels::mma`): every kind
//! against an `f64` host reference that rounds where Hugging Face's bf16 modules round, on random
//! inputs, with NaN-poisoned outputs, at row counts of each compiled size and between them, widths
//! that are and are not multiples of the kernels' 64-wide chunks and 16-row tiles, and inputs long
//! enough to be split over blocks (the scratch's partial sums); the same bits on every launch and
//! in a graph replay; the preloading launches bit-equal to the plain ones; a product that waits
//! for the weights the product ahead of it writes; refused shapes and scratches. Ignored without a
//! GPU; fails without one when CUDA_ASYNC_REQUIRE_GPU=1.

use cuda_async::{CudaGraph, DeviceOp, DeviceOpExt, ExecutionContext, GraphNode};
use cuda_async_tests::{ensure, rng, Failed, Suite, TestResult};
use cuda_core::{Device, DeviceBuffer, Stream};
use half::bf16;
use kernels::gemv::GemvShape;
use kernels::mma::{Mma, MmaKind, MmaScratch, ScratchNeed, MMA_MAX_OUT};
use rand::Rng;

fn stream() -> Result<Stream, Failed> {
    Ok(Device::new(0)?.new_stream()?)
}

fn bf(v: f64) -> f64 {
    bf16::from_f64(v).to_f64()
}

fn f(v: &[bf16]) -> Vec<f64> {
    v.iter().map(|b| b.to_f64()).collect()
}

/// One shape's random inputs and host reference.
struct Case {
    rows: usize,
    in_dim: usize,
    out: usize,
    x: Vec<bf16>,
    w: Vec<bf16>, // 2 * out rows (gate then up); the other kinds use the first out rows
    y0: Vec<bf16>,
}

impl Case {
    fn new(rows: usize, in_dim: usize, out: usize) -> Case {
        let mut rng = rng();
        let mut randn = |n: usize, scale: f64| -> Vec<bf16> {
            (0..n).map(|_| bf16::from_f64(scale * rng.random_range(-1.0f64..1.0))).collect()
        };
        Case {
            rows,
            in_dim,
            out,
            x: randn(rows * in_dim, 2.0),
            w: randn(2 * out * in_dim, 0.05),
            y0: randn(rows * out, 1.0),
        }
    }

    fn shape(&self) -> GemvShape {
        GemvShape { rows: self.rows, in_dim: self.in_dim, out_dim: self.out }
    }

    /// The f64 dot product of x row r and weight row o.
    fn dot(&self, r: usize, o: usize) -> f64 {
        let (x, w) = (&self.x[r * self.in_dim..(r + 1) * self.in_dim], &self.w[o * self.in_dim..]);
        x.iter().zip(w).map(|(a, b)| a.to_f64() * b.to_f64()).sum()
    }

    /// The bound on |f32 sum - f64 sum| for output (r, o): f32 accumulation over `in` terms in any
    /// order, about in * 2^-24 times the sum of |terms|, with a margin of 4.
    fn sum_err(&self, r: usize, o: usize) -> f64 {
        let (x, w) = (&self.x[r * self.in_dim..(r + 1) * self.in_dim], &self.w[o * self.in_dim..]);
        let abs: f64 = x.iter().zip(w).map(|(a, b)| (a.to_f64() * b.to_f64()).abs()).sum();
        4.0 * self.in_dim as f64 * f64::from(f32::EPSILON) * abs + 1e-30
    }
}

/// `got` (rounded to bf16 by the kernel) equals `want_exact` rounded the same way, or one bf16
/// step away where the f32 sum could have fallen on the other side of a rounding boundary.
fn close_bf16(got: f64, lo: f64, hi: f64) -> bool {
    got.is_finite() && (bf(lo) <= got && got <= bf(hi))
}

fn check_kind(s: &Stream, m: &Mma, c: &Case, kind: MmaKind, preload: bool) -> Result<Vec<u32>, Failed> {
    let (rows, out) = (c.rows, c.out);
    let shape = c.shape();
    let mut scratch = MmaScratch::new(s, m.scratch_needed(kind, shape)?)?;
    let x = DeviceBuffer::from_host(s, &c.x)?;
    let w = match kind {
        MmaKind::SwiGlu => DeviceBuffer::from_host(s, &c.w)?,
        _ => DeviceBuffer::from_host(s, &c.w[..out * c.in_dim])?,
    };
    let what = format!("{kind:?}, {rows} rows x {} -> {out}", c.in_dim);
    // SAFETY: `w` was uploaded by a copy and no kernel writes it.
    let p = unsafe { m.preloading() };
    if kind == MmaKind::F32 {
        let mut y = DeviceBuffer::from_host(s, &vec![f32::NAN; rows * out])?;
        if preload {
            p.f32_out(s, &x, &w, &mut y, &mut scratch, shape)?;
        } else {
            m.f32_out(s, &x, &w, &mut y, &mut scratch, shape)?;
        }
        let got = y.to_vec()?;
        for (i, &g) in got.iter().enumerate() {
            let (r, o) = (i / out, i % out);
            let (want, err) = (c.dot(r, o), c.sum_err(r, o));
            ensure(
                (f64::from(g) - want).abs() <= err,
                format!("{what}: element {i}: got {g}, expected {want} (allowed {err:.2e})"),
            )?;
        }
        return Ok(got.iter().map(|v| v.to_bits()).collect());
    }
    let mut y = DeviceBuffer::from_host(
        s,
        &if kind == MmaKind::Residual { c.y0.clone() } else { vec![bf16::NAN; rows * out] },
    )?;
    match (kind, preload) {
        (MmaKind::Plain, false) => m.plain(s, &x, &w, &mut y, &mut scratch, shape)?,
        (MmaKind::Plain, true) => p.plain(s, &x, &w, &mut y, &mut scratch, shape)?,
        (MmaKind::SwiGlu, false) => m.swiglu(s, &x, &w, &mut y, &mut scratch, shape)?,
        (MmaKind::SwiGlu, true) => p.swiglu(s, &x, &w, &mut y, &mut scratch, shape)?,
        (_, false) => m.residual(s, &x, &w, &mut y, &mut scratch, shape)?,
        (_, true) => p.residual(s, &x, &w, &mut y, &mut scratch, shape)?,
    }
    let got = f(&y.to_vec()?);
    let y0 = f(&c.y0);
    for (i, &g) in got.iter().enumerate() {
        let (r, o) = (i / out, i % out);
        // Each value the kernel rounds lies within the f32 error of the f64 one; the reference is
        // the range of the epilogue over both ends (monotone in each rounded input).
        let range = |o: usize| {
            let (d, e) = (c.dot(r, o), c.sum_err(r, o));
            (d - e, d + e)
        };
        let (lo, hi) = match kind {
            MmaKind::Plain => range(o),
            MmaKind::Residual => {
                let (a, b) = range(o);
                (y0[i] + bf(a), y0[i] + bf(b))
            }
            _ => {
                let ((ga, gb), (ua, ub)) = (range(o), range(o + out));
                let act = |g: f64, u: f64| bf(bf(bf(g) / (1.0 + (-bf(g)).exp())) * bf(u));
                // silu is not monotone below about -1.28: take every corner and the minimum.
                let corners = [act(ga, ua), act(ga, ub), act(gb, ua), act(gb, ub)];
                let lo = corners.iter().copied().fold(f64::INFINITY, f64::min);
                let hi = corners.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let below =
                    if ga < -1.278 && gb > -1.278 { act(-1.278, ua).min(act(-1.278, ub)) } else { lo };
                (lo.min(below), hi)
            }
        };
        ensure(
            close_bf16(g, lo.min(hi), hi.max(lo)),
            format!("{what}: element {i} (row {r}, output {o}): got {g}, expected within [{lo}, {hi}]"),
        )?;
    }
    Ok(y.to_vec()?.iter().map(|v| u32::from(v.to_bits())).collect())
}

/// Every kind against the host, plain and preloaded (bit-equal), at shapes that cover: each
/// compiled tile count (16, 32, 64 rows) and row counts between them, outputs that do not fill the
/// last 16-row tile, inputs that are not a multiple of 64, and inputs long enough to be split over
/// blocks (the partial sums through the scratch; checked to happen).
fn products_match_host() -> TestResult {
    let s = stream()?;
    let m = Mma::get(s.device())?;
    let mut split_seen = false;
    for &(rows, in_dim, out) in &[
        (9, 256, 100),
        (16, 2048, 384),
        (17, 8, 3),
        (33, 1032, 40),
        (64, 8192, 64),
        (64, 2048, 520),
        (48, 4096, 24),
    ] {
        let c = Case::new(rows, in_dim, out);
        for kind in [MmaKind::Plain, MmaKind::F32, MmaKind::SwiGlu, MmaKind::Residual] {
            split_seen |= m.scratch_needed(kind, c.shape())?.part > 0;
            let plain = check_kind(&s, m, &c, kind, false)?;
            let pre = check_kind(&s, m, &c, kind, true)?;
            ensure(plain == pre, format!("{kind:?} {rows}x{in_dim}->{out}: preloaded differs from plain"))?;
        }
    }
    ensure(split_seen, "no shape split its inputs over blocks: the scratch path went untested")
}

/// Two plain products through one scratch, as one lazy op (recorded into a graph).
struct TwoProducts<'a> {
    m: &'a Mma,
    x: [&'a DeviceBuffer<bf16>; 2],
    w: [&'a DeviceBuffer<bf16>; 2],
    y: [&'a mut DeviceBuffer<bf16>; 2],
    scratch: &'a mut MmaScratch,
    shapes: [GemvShape; 2],
}

impl DeviceOp for TwoProducts<'_> {
    type Output = ();

    fn execute(self, ctx: &ExecutionContext<'_>) -> cuda_async::Result<()> {
        let TwoProducts { m, x, w, y: [y0, y1], scratch, shapes } = self;
        m.plain(ctx.stream(), x[0], w[0], y0, scratch, shapes[0])?;
        m.plain(ctx.stream(), x[1], w[1], y1, scratch, shapes[1])?;
        Ok(())
    }
}

// SAFETY: `execute` queues two kernel launches over buffers that exist before it runs; nothing
// is allocated, freed or synchronised.
unsafe impl GraphNode for TwoProducts<'_> {}

/// A split product run again and again through one scratch, by different shapes in turn, in a
/// graph replayed 5 times and eagerly, gives the same bits every time: the counters are left zero
/// by every launch, and the partial sums are added in a fixed order.
fn same_bits_every_launch() -> TestResult {
    let s = stream()?;
    let m = Mma::get(s.device())?;
    let a = Case::new(64, 8192, 64);
    let b = Case::new(32, 4096, 200);
    let need =
        m.scratch_needed(MmaKind::Residual, a.shape())?.max(m.scratch_needed(MmaKind::Plain, b.shape())?);
    ensure(need.part > 0, "the shape did not split: this test needs the scratch path")?;
    let mut scratch = MmaScratch::new(&s, need)?;
    let (xa, wa) = (DeviceBuffer::from_host(&s, &a.x)?, DeviceBuffer::from_host(&s, &a.w[..64 * 8192])?);
    let (xb, wb) = (DeviceBuffer::from_host(&s, &b.x)?, DeviceBuffer::from_host(&s, &b.w[..200 * 4096])?);
    let mut ya = DeviceBuffer::from_host(&s, &vec![bf16::ZERO; 64 * 64])?;
    let mut yb = DeviceBuffer::from_host(&s, &vec![bf16::NAN; 32 * 200])?;
    m.plain(&s, &xa, &wa, &mut ya, &mut scratch, a.shape())?;
    let first_a = ya.to_vec()?;
    m.plain(&s, &xb, &wb, &mut yb, &mut scratch, b.shape())?;
    let first_b = yb.to_vec()?;
    for round in 0..10 {
        ya.copy_from_host(&s, &vec![bf16::NAN; 64 * 64])?;
        yb.copy_from_host(&s, &vec![bf16::NAN; 32 * 200])?;
        m.plain(&s, &xa, &wa, &mut ya, &mut scratch, a.shape())?;
        m.plain(&s, &xb, &wb, &mut yb, &mut scratch, b.shape())?;
        ensure(ya.to_vec()? == first_a && yb.to_vec()? == first_b, format!("round {round}: other bits"))?;
    }
    ya.copy_from_host(&s, &vec![bf16::NAN; 64 * 64])?;
    let graph = CudaGraph::scope(&s, |g| {
        g.record(TwoProducts {
            m,
            x: [&xa, &xb],
            w: [&wa, &wb],
            y: [&mut ya, &mut yb],
            scratch: &mut scratch,
            shapes: [a.shape(), b.shape()],
        })?;
        Ok(())
    })?;
    for replay in 0..5 {
        graph.launch().sync_on(&s)?;
        ensure(ya.to_vec()? == first_a && yb.to_vec()? == first_b, format!("replay {replay}: other bits"))?;
    }
    Ok(())
}

/// A product whose weights the product queued just ahead of it writes (safe code may chain them
/// so) must read them as written: its launch overlaps that product, so it may load nothing before
/// its wait. Product A writes B's whole weight matrix (NaN until then); B must equal the host's
/// product over A's output, 20 times over. Mutation: the plain products loading early fail.
fn products_wait_for_weights_written_ahead() -> TestResult {
    let s = stream()?;
    let m = Mma::get(s.device())?;
    let (rows_a, in_a, out_a) = (16usize, 64usize, 8192usize);
    let (rows_b, in_b, out_b) = (16usize, 2048usize, 64usize); // B's weight: rows_a * out_a values
    let a = Case::new(rows_a, in_a, out_a);
    let xb = Case::new(rows_b, in_b, 1).x;
    let xbf = f(&xb);
    let (dxa, dwa) = (DeviceBuffer::from_host(&s, &a.x)?, DeviceBuffer::from_host(&s, &a.w[..out_a * in_a])?);
    let dxb = DeviceBuffer::from_host(&s, &xb)?;
    let shape_a = GemvShape { rows: rows_a, in_dim: in_a, out_dim: out_a };
    let shape_b = GemvShape { rows: rows_b, in_dim: in_b, out_dim: out_b };
    let need = m.scratch_needed(MmaKind::Plain, shape_a)?.max(m.scratch_needed(MmaKind::Plain, shape_b)?);
    let mut scratch = MmaScratch::new(&s, need)?;
    for round in 0..20 {
        let mut wb = DeviceBuffer::from_host(&s, &vec![bf16::NAN; rows_a * out_a])?;
        let mut yb = DeviceBuffer::from_host(&s, &vec![bf16::NAN; rows_b * out_b])?;
        s.synchronize()?;
        m.plain(&s, &dxa, &dwa, &mut wb, &mut scratch, shape_a)?;
        m.plain(&s, &dxb, &wb, &mut yb, &mut scratch, shape_b)?;
        let (w, y) = (f(&wb.to_vec()?), f(&yb.to_vec()?));
        for (i, &got) in y.iter().enumerate() {
            let (r, o) = (i / out_b, i % out_b);
            let terms = (0..in_b).map(|k| w[o * in_b + k] * xbf[r * in_b + k]);
            let want: f64 = terms.clone().sum();
            let err = 4.0 * in_b as f64 * f64::from(f32::EPSILON) * terms.map(f64::abs).sum::<f64>();
            ensure(
                close_bf16(got, want - err, want + err),
                format!("round {round}: output {i} is {got}, the product over A's output is {want}"),
            )?;
        }
    }
    Ok(())
}

/// Shapes and scratches the launchers refuse, before launching anything.
fn refusals() -> TestResult {
    let s = stream()?;
    let m = Mma::get(s.device())?;
    let mut scratch = MmaScratch::new(&s, ScratchNeed::default())?;
    let buf = |n: usize| DeviceBuffer::from_host(&s, &vec![bf16::ONE; n]);
    for (rows, in_dim) in [(0usize, 64usize), (65, 64), (16, 12), (16, 0)] {
        let (x, w, mut y) = (buf(rows * in_dim)?, buf(4 * in_dim)?, buf(rows * 4)?);
        let shape = GemvShape { rows, in_dim, out_dim: 4 };
        ensure(
            m.plain(&s, &x, &w, &mut y, &mut scratch, shape).is_err() && !Mma::fits(rows, in_dim),
            format!("{rows} rows of {in_dim} accepted"),
        )?;
    }
    // Wrong lengths.
    let shape = GemvShape { rows: 16, in_dim: 64, out_dim: 4 };
    let (x, w, mut y) = (buf(16 * 64)?, buf(4 * 64)?, buf(16 * 4)?);
    let mut short = buf(16 * 4 - 1)?;
    ensure(m.plain(&s, &x, &w, &mut short, &mut scratch, shape).is_err(), "a short output accepted")?;
    ensure(
        m.plain(&s, &buf(16 * 64 - 8)?, &w, &mut y, &mut scratch, shape).is_err(),
        "a short input accepted",
    )?;
    ensure(
        m.swiglu(&s, &x, &w, &mut y, &mut scratch, shape).is_err(),
        "SwiGLU with half its weight accepted",
    )?;
    // A scratch smaller than a split product needs.
    let big = GemvShape { rows: 64, in_dim: 8192, out_dim: 64 };
    let need = m.scratch_needed(MmaKind::Plain, big)?;
    ensure(need.part > 0, "64 x 8192 -> 64 did not split")?;
    let (xb, wb, mut yb) = (buf(64 * 8192)?, buf(64 * 8192)?, buf(64 * 64)?);
    let mut small = MmaScratch::new(&s, ScratchNeed { part: need.part - 1, counters: need.counters })?;
    ensure(m.plain(&s, &xb, &wb, &mut yb, &mut small, big).is_err(), "a scratch one partial short accepted")?;
    let mut small = MmaScratch::new(&s, ScratchNeed { part: need.part, counters: need.counters - 1 })?;
    ensure(m.plain(&s, &xb, &wb, &mut yb, &mut small, big).is_err(), "a scratch one counter short accepted")?;
    // More outputs than the kernels' 32-bit indices allow.
    let huge = GemvShape { rows: 16, in_dim: 8, out_dim: MMA_MAX_OUT + 1 };
    ensure(
        m.scratch_needed(MmaKind::Plain, huge).is_err(),
        "an output count past the 32-bit bound was accepted",
    )?;
    s.synchronize()?;
    Ok(())
}

fn main() {
    let mut s = Suite::new();
    s.gpu("products_match_host", products_match_host)
        .gpu("same_bits_every_launch", same_bits_every_launch)
        .gpu("products_wait_for_weights_written_ahead", products_wait_for_weights_written_ahead)
        .gpu("refusals", refusals);
    s.run()
}

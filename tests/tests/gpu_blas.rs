//! GPU suite for `cuda_core::blas::Blas::linear` (cuBLAS `y = x · wᵀ`, optionally `y += …`)
//! against an f64 host reference on random inputs, every output poisoned first: the documented
//! type pairs, shapes that are no multiples of anything, the fused residual add, the empty
//! products (no rows, no outputs, no inputs), a product captured into a graph and replayed with
//! new inputs, and the refusals. Ignored without a GPU; fails without one when
//! CUDA_ASYNC_REQUIRE_GPU=1.

use cuda_async_tests::{ensure, rng, Failed, Suite, TestResult};
use cuda_core::blas::{Blas, BlasScalar, Linear};
use cuda_core::{CaptureMode, Device, DeviceBuffer, DeviceRepr, Error, InstantiateFlags, Stream};
use half::{bf16, f16};
use rand::Rng;

fn stream() -> Result<Stream, Failed> {
    Ok(Device::new(0)?.new_stream()?)
}

/// A scalar of the tests: conversions to and from `f64`, and its unit roundoff.
trait El: BlasScalar + DeviceRepr + Copy + Default + std::fmt::Debug {
    /// Unit roundoff.
    const EPS: f64;
    /// Half the smallest subnormal: the absolute rounding error near zero.
    const TINY: f64;
    fn from_f64(v: f64) -> Self;
    fn to_f64(self) -> f64;
}
impl El for f32 {
    const EPS: f64 = f32::EPSILON as f64 / 2.0;
    const TINY: f64 = 7.006e-46; // 2^-150
    fn from_f64(v: f64) -> Self {
        v as f32
    }
    fn to_f64(self) -> f64 {
        self as f64
    }
}
impl El for bf16 {
    const EPS: f64 = 1.0 / 256.0;
    const TINY: f64 = 4.592e-41; // 2^-134
    fn from_f64(v: f64) -> Self {
        bf16::from_f64(v)
    }
    fn to_f64(self) -> f64 {
        bf16::to_f64(self)
    }
}
impl El for f16 {
    const EPS: f64 = 1.0 / 2048.0;
    const TINY: f64 = 2.981e-8; // 2^-25
    fn from_f64(v: f64) -> Self {
        f16::from_f64(v)
    }
    fn to_f64(self) -> f64 {
        f16::to_f64(self)
    }
}

fn random<T: El>(r: &mut impl Rng, n: usize) -> Vec<T> {
    (0..n).map(|_| T::from_f64(r.random_range(-1.0..1.0))).collect()
}

/// Checks `got` against `y0 (if accumulating) + x · wᵀ` in f64 from the inputs as stored: the
/// f32 accumulation of `in_dim` products is within `in_dim · u32 · Σ|x w|` (with a factor 4 for
/// cuBLAS's blocked orders), plus the output's own rounding of `|y|` (near zero: half its smallest
/// subnormal), plus a sixteenth of a unit roundoff of `U` on `Σ|x w|` in case cuBLAS rounds
/// split-K partial sums to `U` (tight enough that a lost residual add fails at every shape).
fn check<T: El, U: El>(x: &[T], w: &[T], y0: &[U], got: &[U], sh: Linear, what: &str) -> TestResult {
    let u32_ = f32::EPSILON as f64 / 2.0;
    for r in 0..sh.rows {
        for o in 0..sh.out_dim {
            let (mut sum, mut abs) = (0f64, 0f64);
            for i in 0..sh.in_dim {
                let p = x[r * sh.in_dim + i].to_f64() * w[o * sh.in_dim + i].to_f64();
                sum += p;
                abs += p.abs();
            }
            let base = if sh.accumulate { y0[r * sh.out_dim + o].to_f64() } else { 0.0 };
            let want = base + sum;
            let g = got[r * sh.out_dim + o].to_f64();
            let tol = 4.0 * sh.in_dim as f64 * u32_ * abs + U::EPS * (want.abs() + abs / 16.0) + U::TINY;
            ensure(
                (g - want).abs() <= tol,
                format!("{what} {sh:?}: y[{r}][{o}] = {g}, the host's {want} (tolerance {tol:.3e})"),
            )?;
        }
    }
    Ok(())
}

/// One product on random inputs, `y` poisoned with NaN (or random when accumulating).
fn one<T: El, U: El>(s: &Stream, blas: &Blas, r: &mut impl Rng, sh: Linear, what: &str) -> TestResult {
    let x = random::<T>(r, sh.rows * sh.in_dim);
    let w = random::<T>(r, sh.out_dim * sh.in_dim);
    let y0: Vec<U> = if sh.accumulate {
        random::<U>(r, sh.rows * sh.out_dim)
    } else {
        vec![U::from_f64(f64::NAN); sh.rows * sh.out_dim]
    };
    let (dx, dw) = (DeviceBuffer::from_host(s, &x)?, DeviceBuffer::from_host(s, &w)?);
    let mut dy = DeviceBuffer::from_host(s, &y0)?;
    blas.linear(s, &dx, &dw, &mut dy, sh)?;
    check(&x, &w, &y0, &dy.to_vec()?, sh, what)
}

const SHAPES: [(usize, usize, usize); 7] =
    [(1, 1, 1), (1, 2048, 96), (3, 17, 5), (7, 1000, 33), (16, 64, 513), (64, 2048, 96), (129, 31, 257)];

/// Every documented type pair, every shape, with and without the residual add.
fn linear_vs_host() -> TestResult {
    let s = stream()?;
    let blas = Blas::new(&s)?;
    let mut r = rng();
    for (rows, in_dim, out_dim) in SHAPES {
        for accumulate in [false, true] {
            let sh = Linear { rows, in_dim, out_dim, accumulate };
            one::<f32, f32>(&s, &blas, &mut r, sh, "f32 -> f32")?;
            one::<bf16, f32>(&s, &blas, &mut r, sh, "bf16 -> f32")?;
            one::<bf16, bf16>(&s, &blas, &mut r, sh, "bf16 -> bf16")?;
            one::<f16, f32>(&s, &blas, &mut r, sh, "f16 -> f32")?;
            one::<f16, f16>(&s, &blas, &mut r, sh, "f16 -> f16")?;
        }
    }
    Ok(())
}

/// No rows or no outputs: nothing is written. No inputs (`in_dim == 0`): the empty sum, so
/// `y = 0` over the poison, or `y` unchanged when accumulating (cuBLAS itself refuses the
/// leading dimension 0 this shape gives it).
fn empty_products() -> TestResult {
    let s = stream()?;
    let blas = Blas::new(&s)?;
    let mut r = rng();
    for (rows, out_dim) in [(0usize, 5usize), (4, 0), (0, 0)] {
        let x = DeviceBuffer::<f32>::zeros(&s, rows * 3)?;
        let w = DeviceBuffer::<f32>::zeros(&s, out_dim * 3)?;
        let mut y = DeviceBuffer::<f32>::zeros(&s, rows * out_dim)?;
        blas.linear(&s, &x, &w, &mut y, Linear { rows, in_dim: 3, out_dim, accumulate: false })?;
    }
    for accumulate in [false, true] {
        for (rows, out_dim) in [(1usize, 1usize), (5, 7), (64, 300)] {
            let sh = Linear { rows, in_dim: 0, out_dim, accumulate };
            one::<f32, f32>(&s, &blas, &mut r, sh, "in_dim 0, f32")?;
            one::<bf16, f32>(&s, &blas, &mut r, sh, "in_dim 0, bf16 -> f32")?;
            one::<bf16, bf16>(&s, &blas, &mut r, sh, "in_dim 0, bf16")?;
        }
    }
    Ok(())
}

/// Captured into a graph (the product and an `in_dim == 0` one), replayed three times with new
/// inputs copied in between: each replay computes from the inputs of its time.
fn captured_and_replayed() -> TestResult {
    let s = stream()?;
    let blas = Blas::new(&s)?;
    let mut r = rng();
    let sh = Linear { rows: 5, in_dim: 300, out_dim: 77, accumulate: false };
    let empty = Linear { rows: 3, in_dim: 0, out_dim: 4, accumulate: false };
    let w = random::<bf16>(&mut r, sh.out_dim * sh.in_dim);
    let (mut dx, dw) =
        (DeviceBuffer::<bf16>::zeros(&s, sh.rows * sh.in_dim)?, DeviceBuffer::from_host(&s, &w)?);
    let mut dy = DeviceBuffer::<f32>::zeros(&s, sh.rows * sh.out_dim)?;
    let (ex, ew) = (DeviceBuffer::<bf16>::zeros(&s, 0)?, DeviceBuffer::<bf16>::zeros(&s, 0)?);
    let mut ey = DeviceBuffer::<f32>::zeros(&s, empty.rows * empty.out_dim)?;
    s.begin_capture(CaptureMode::ThreadLocal)?;
    let recorded =
        blas.linear(&s, &dx, &dw, &mut dy, sh).and_then(|()| blas.linear(&s, &ex, &ew, &mut ey, empty));
    let g = s.end_capture()?;
    recorded?;
    let exec = g.instantiate_and_upload(InstantiateFlags::NONE, &s)?;
    for round in 0..3 {
        let x = random::<bf16>(&mut r, sh.rows * sh.in_dim);
        dx.copy_from_host(&s, &x)?;
        dy.copy_from_host(&s, &vec![f32::NAN; sh.rows * sh.out_dim])?;
        ey.copy_from_host(&s, &vec![f32::NAN; empty.rows * empty.out_dim])?;
        exec.launch(&s)?;
        check(&x, &w, &[], &dy.to_vec()?, sh, &format!("replay {round}"))?;
        ensure(
            ey.to_vec()?.iter().all(|&v| v == 0.0),
            format!("replay {round}: the empty product left {:?}", ey.to_vec()?),
        )?;
    }
    Ok(())
}

/// Lengths that do not fit the shape, dimensions past cuBLAS's `int`, and a type pair outside
/// the documented ones are refused, and nothing is written.
fn refusals() -> TestResult {
    let s = stream()?;
    let blas = Blas::new(&s)?;
    let x = DeviceBuffer::from_host(&s, &[1.0f32; 6])?;
    let w = DeviceBuffer::from_host(&s, &[1.0f32; 6])?;
    let mut y = DeviceBuffer::from_host(&s, &[f32::NAN; 4])?;
    let sh = Linear { rows: 2, in_dim: 3, out_dim: 2, accumulate: false };
    let bad = [
        Linear { rows: 3, ..sh },
        Linear { in_dim: 2, ..sh },
        Linear { out_dim: 3, ..sh },
        Linear { rows: i32::MAX as usize + 1, ..sh },
        Linear { in_dim: usize::MAX, ..sh },
    ];
    for b in bad {
        match blas.linear(&s, &x, &w, &mut y, b) {
            Err(Error::LengthMismatch { .. } | Error::InvalidArgument(_)) => {}
            other => return Err(format!("{b:?}: expected a refusal, got {other:?}").into()),
        }
    }
    let xb = DeviceBuffer::from_host(&s, &[bf16::ONE; 6])?;
    let wb = DeviceBuffer::from_host(&s, &[bf16::ONE; 6])?;
    let mut yh = DeviceBuffer::from_host(&s, &[f16::NAN; 4])?;
    let pair = blas.linear(&s, &xb, &wb, &mut yh, sh);
    ensure(matches!(pair, Err(Error::InvalidArgument(_))), format!("bf16 -> f16: {pair:?}"))?;
    let mut yb = DeviceBuffer::from_host(&s, &[bf16::NAN; 4])?;
    let pair = blas.linear(&s, &x, &w, &mut yb, sh);
    ensure(matches!(pair, Err(Error::InvalidArgument(_))), format!("f32 -> bf16: {pair:?}"))?;
    ensure(y.to_vec()?.iter().all(|v| v.is_nan()), "a refused product wrote y")?;
    ensure(
        yh.to_vec()?.iter().all(|v| v.is_nan()) && yb.to_vec()?.iter().all(|v| v.is_nan()),
        "a refused pair wrote",
    )?;
    // The handle still works.
    blas.linear(&s, &x, &w, &mut y, sh)?;
    ensure(y.to_vec()? == [3.0; 4], "the product after the refusals")
}

fn main() {
    let mut s = Suite::new();
    s.gpu("linear_vs_host", linear_vs_host)
        .gpu("empty_products", empty_products)
        .gpu("captured_and_replayed", captured_and_replayed)
        .gpu("refusals", refusals);
    s.run()
}

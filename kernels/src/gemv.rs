//! Small-batch bf16 matrix-vector products for decode (`cuda/gemv.cu`), with RMSNorm, SwiGLU and
//! the residual add fused in: at 1 to [`GEMV_MAX_ROWS`] rows a product is bound by reading the
//! weights once, so each launch streams its weight matrix with 16-byte loads (one warp per output
//! row) and does the elementwise work around it in the same launch.
//!
//! Every launcher checks the devices, the row count, the 16-byte alignment of rows (`in % 8 ==
//! 0`), the shared memory the staged input rows need ([`Gemv::fits`]) and every buffer length
//! before launching; the kernels touch exactly the elements those lengths describe.
//!
//! ```no_run
//! use cuda_core::{Device, DeviceBuffer};
//! use half::bf16;
//! use kernels::gemv::{Gemv, GemvShape};
//! # fn main() -> cuda_core::Result<()> {
//! let s = Device::new(0)?.new_stream()?;
//! let g = Gemv::get(s.device())?;
//! let x = DeviceBuffer::from_host(&s, &[bf16::ONE; 16])?; // 1 row of 16
//! let w = DeviceBuffer::from_host(&s, &[bf16::from_f32(0.5); 32])?; // 2 outputs x 16 inputs
//! let mut y = DeviceBuffer::from_host(&s, &[bf16::ONE; 2])?;
//! g.residual(&s, &x, &w, &mut y, GemvShape { rows: 1, in_dim: 16, out_dim: 2 })?; // y = 1 + 16 * 0.5
//! assert_eq!(y.to_vec()?, vec![bf16::from_f32(9.0); 2]);
//! # Ok(()) }
//! ```

use crate::checks::{dim, len_check, mul, same_device};
use crate::llama::RmsNorm;
use cuda_core::{Device, DeviceBuffer, Error, Function, LaunchConfig, PerDevice, Result, Stream};
use half::bf16;

/// CUDA C source of the products (`bf16.cuh` + `gemv.cu`).
pub const GEMV_SRC: &str = include_str!("../cuda/gemv.cu");

/// The most rows one launch takes.
pub const GEMV_MAX_ROWS: usize = 8;
/// The most shared memory the staged input rows may take (`R * in * 2` bytes, `R` the row count
/// rounded up to 1, 2, 4 or 8): the default 48 KiB per block less 1 KiB for the kernels' static
/// shared memory (at most 768 bytes), so no opt-in is needed.
pub const GEMV_MAX_SHARED: usize = 47 << 10;
/// The most output rows of one product: the kernels' 32-bit row indices (`o + out` for SwiGLU,
/// and the grid-stride loop's next index) must not wrap.
pub const GEMV_MAX_OUT: usize = (u32::MAX / 4) as usize;
const WARPS: u32 = 8;
/// 16-byte loads per lane in flight per round (`GEMV_UNROLL`).
const UNROLL: usize = 8;

/// One kernel per compiled row count (1, 2, 4, 8).
struct ByRows([Function; 4]);

impl ByRows {
    fn load(m: &cuda_core::CudaModule, name: &str) -> Result<ByRows> {
        let f = |r: usize| m.function(&format!("{name}_r{r}"));
        Ok(ByRows([f(1)?, f(2)?, f(4)?, f(8)?]))
    }
}

/// The fused small-batch products, loaded on one device.
pub struct Gemv {
    device: Device,
    max_blocks: u32,
    preload: Early,
    norm: ByRows,
    norm_f32: ByRows,
    norm_swiglu: ByRows,
    residual: ByRows,
}

/// The compiled row count for `rows` (1, 2, 4 or 8) and its index.
fn bucket(rows: usize) -> Option<(usize, usize)> {
    [1usize, 2, 4, 8].iter().copied().enumerate().find(|&(_, r)| r >= rows).map(|(i, r)| (r, i))
}

/// The dimensions of one fused product ([`Gemv::norm`], [`Gemv::norm_f32`],
/// [`Gemv::norm_swiglu`], [`Gemv::residual`]): `rows` input rows of `in_dim` features mapped to
/// `out_dim` features per row. Every launcher checks the shape before launching anything, and each
/// buffer's length against it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GemvShape {
    /// Rows of the input and the output (the batch): `1..=`[`GEMV_MAX_ROWS`], checked
    /// ([`Gemv::fits`]).
    pub rows: usize,
    /// Features per input row (columns of `x` and of the weight): a positive multiple of 8 (rows
    /// of 16-byte loads) whose staged rows fit [`GEMV_MAX_SHARED`] bytes, checked
    /// ([`Gemv::fits`]).
    pub in_dim: usize,
    /// Features per output row (columns of `y`): at most [`GEMV_MAX_OUT`], checked; `0` launches
    /// nothing. The weight has `out_dim` rows, or `2 * out_dim` (gate then up) for
    /// [`Gemv::norm_swiglu`].
    pub out_dim: usize,
}

/// The buffers of a fused RMSNorm + product (`Gemv::norm_launch`); `Y` is the output's element
/// type, the one the variant's kernel writes.
struct NormIo<'a, Y: cuda_core::DeviceRepr> {
    x: &'a DeviceBuffer<bf16>,
    norm: RmsNorm<'a>,
    w: &'a DeviceBuffer<bf16>,
    y: &'a mut DeviceBuffer<Y>,
}

impl Gemv {
    /// The kernels on `device`, compiled (or read from the cache) and loaded on first use.
    ///
    /// # Errors
    /// NVRTC and module-loading errors ([`Error::NvrtcMissing`] without `libnvrtc`).
    pub fn get(device: &Device) -> Result<&'static Gemv> {
        static LOADED: PerDevice<Gemv> = PerDevice::new();
        LOADED.get_or_try_init(device, || {
            let p = crate::programs::gemv();
            let m = device.compile_module(p.name, &p.source, &p.options)?;
            Ok(Gemv {
                device: *device,
                max_blocks: device.multiprocessor_count()?.saturating_mul(8).max(1),
                preload: preload_setting(),
                norm: ByRows::load(&m, "gemv_norm")?,
                norm_f32: ByRows::load(&m, "gemv_norm_f32")?,
                norm_swiglu: ByRows::load(&m, "gemv_norm_swiglu")?,
                residual: ByRows::load(&m, "gemv_residual")?,
            })
        })
    }

    /// Whether a product over `rows` rows of `in_dim` inputs can run here: `1 <= rows <=`
    /// [`GEMV_MAX_ROWS`], `in_dim` a positive multiple of 8, and the staged rows within
    /// [`GEMV_MAX_SHARED`].
    pub fn fits(rows: usize, in_dim: usize) -> bool {
        match bucket(rows) {
            Some((r, _)) => {
                // Checked: a huge `in_dim` must not wrap to a size that fits (found by review).
                rows > 0
                    && in_dim > 0
                    && in_dim.is_multiple_of(8)
                    && r.checked_mul(in_dim)
                        .and_then(|n| n.checked_mul(2))
                        .is_some_and(|b| b <= GEMV_MAX_SHARED)
            }
            None => false,
        }
    }

    /// Checks the stream's and buffers' devices and the shape; returns the kernel index and the
    /// launch configuration for `out` output rows (the grid-stride loop covers them all).
    fn plan(
        &self,
        s: &Stream,
        during: &'static str,
        devices: &[&Device],
        rows: usize,
        in_dim: usize,
        out: usize,
    ) -> Result<(usize, LaunchConfig, [u32; 4])> {
        same_device(&self.device, s, during, devices)?;
        if !Gemv::fits(rows, in_dim) {
            return Err(Error::InvalidArgument(format!(
                "{during}: {rows} rows of {in_dim} inputs: needs 1..={GEMV_MAX_ROWS} rows, inputs a multiple of 8, and the rows within {GEMV_MAX_SHARED} bytes of shared memory"
            )));
        }
        let (r, idx) =
            bucket(rows).ok_or_else(|| Error::InvalidArgument(format!("{during}: {rows} rows")))?;
        if out > GEMV_MAX_OUT {
            return Err(Error::InvalidArgument(format!("{during}: {out} outputs exceed {GEMV_MAX_OUT}")));
        }
        // Warps per output row: enough that each warp's share of a row is one batch of
        // UNROLL loads per lane (a long row, e.g. the down projection, is otherwise read in
        // several dependent rounds), at most 8. Measured on the H100 (bench-decode), splitting
        // rows further to fill more blocks did not pay.
        let split = (in_dim / 8).div_ceil(32 * UNROLL).clamp(1, WARPS as usize).next_power_of_two();
        let blocks = (out * split).div_ceil(WARPS as usize).min(self.max_blocks as usize).max(1);
        let cfg = LaunchConfig {
            grid: (dim(blocks, "fused product blocks")?, 1, 1),
            block: (WARPS * 32, 1, 1),
            shared_mem_bytes: dim(r * in_dim * 2, "fused product shared memory")?,
        };
        // The kernel's `unsigned` arguments: rows <= 8, in_dim within the shared memory and
        // out <= GEMV_MAX_OUT (checked above), so these conversions cannot fail; checked anyway.
        let args = [dim(rows, "rows")?, dim(in_dim, "in")?, dim(out, "out")?, dim(split, "split")?];
        Ok((idx, cfg, args))
    }

    /// The launch of [`Gemv::norm`], [`Gemv::norm_f32`] and [`Gemv::norm_swiglu`] (and of
    /// [`Preloading`]'s), as `v` says.
    fn norm_launch<Y: cuda_core::DeviceRepr>(
        &self,
        v: NormVariant<'_>,
        s: &Stream,
        io: NormIo<'_, Y>,
        shape: GemvShape,
    ) -> Result<()> {
        let NormVariant { kernels, during, w_rows, early } = v;
        let NormIo { x, norm, w, y } = io;
        let RmsNorm { weight: norm_w, eps } = norm;
        let GemvShape { rows, in_dim, out_dim: out } = shape;
        let (idx, cfg, [rows32, in32, out32, split]) =
            self.plan(s, during, &[x.device(), norm_w.device(), w.device(), y.device()], rows, in_dim, out)?;
        len_check("fused product: x must hold rows * in", mul(rows, in_dim)?, x.len())?;
        len_check("fused product: the norm weight must hold in", in_dim, norm_w.len())?;
        len_check("fused product: w must hold its rows * in", mul(w_rows, in_dim)?, w.len())?;
        len_check("fused product: y must hold rows * out", mul(rows, out)?, y.len())?;
        if out == 0 {
            return Ok(());
        }
        // SAFETY: matches `NAME_rR(const bf16_t* x, const bf16_t* nw, float eps, const bf16_t* w,
        // void* y, unsigned rows, unsigned in, unsigned out, unsigned split, unsigned early)` with rows <= R and
        // split in {1, 2, 4, 8} (`plan`): the kernel
        // reads x[0..rows*in], nw[0..in], w[0..w_rows*in] and writes y[0..rows*out] (each length
        // checked above; y's element type is the one the kernel writes, as the callers pair
        // them), with in % 8 == 0 and allocations 256-byte aligned for its 16-byte loads, and
        // R * in * 2 bytes of dynamic shared memory (within the default limit, `plan`). `y` is
        // borrowed mutably, so no other launch can touch it. Overlapped launch: every block runs
        // PDL_WAIT() before its first load or store, except the L2 prefetches of `w` and, with
        // `early` (only from `Preloading`, whose contract says that no kernel this launch can
        // overlap writes `w`), loads of `w`.
        unsafe {
            kernels.0[idx].launch_overlapped(
                s,
                cfg,
                (x, norm_w, eps, w, y, rows32, in32, out32, split, early.0),
            )
        }
    }

    /// `y = bf16(RMSNorm(x) · wᵀ)`: `x[rows][in]`, `norm.weight[in]`, `w[out][in]`, `y[rows][out]`
    /// (`rows`, `in` = `shape.in_dim` and `out` = `shape.out_dim`).
    ///
    /// # Errors
    /// A shape [`Gemv::fits`] refuses or with `out >` [`GEMV_MAX_OUT`], lengths that do not fit
    /// it, devices that differ, driver errors.
    pub fn norm(
        &self,
        s: &Stream,
        x: &DeviceBuffer<bf16>,
        norm: RmsNorm<'_>,
        w: &DeviceBuffer<bf16>,
        y: &mut DeviceBuffer<bf16>,
        shape: GemvShape,
    ) -> Result<()> {
        self.plain().norm(s, x, norm, w, y, shape)
    }

    /// `y = RMSNorm(x) · wᵀ` in `f32` (logits): shapes as [`Gemv::norm`].
    ///
    /// # Errors
    /// As for [`Gemv::norm`].
    pub fn norm_f32(
        &self,
        s: &Stream,
        x: &DeviceBuffer<bf16>,
        norm: RmsNorm<'_>,
        w: &DeviceBuffer<bf16>,
        y: &mut DeviceBuffer<f32>,
        shape: GemvShape,
    ) -> Result<()> {
        self.plain().norm_f32(s, x, norm, w, y, shape)
    }

    /// SwiGLU after a fused RMSNorm: `[g | u] = bf16(RMSNorm(x) · w_gate_upᵀ)` with
    /// `w_gate_up[2 * inter][in]` (gate rows first), `y[r][i] = bf16(bf16(silu(g)) * u)`,
    /// `y[rows][inter]`; here `shape.out_dim` is `inter`, the width of `y` (half the rows of
    /// `w_gate_up`).
    ///
    /// # Errors
    /// As for [`Gemv::norm`]; also `2 * inter` overflowing `usize`.
    pub fn norm_swiglu(
        &self,
        s: &Stream,
        x: &DeviceBuffer<bf16>,
        norm: RmsNorm<'_>,
        w_gate_up: &DeviceBuffer<bf16>,
        y: &mut DeviceBuffer<bf16>,
        shape: GemvShape,
    ) -> Result<()> {
        self.plain().norm_swiglu(s, x, norm, w_gate_up, y, shape)
    }

    /// `y = bf16(y + bf16(x · wᵀ))` (a product added into the residual stream, rounded as
    /// Hugging Face's bf16 modules round): `x[rows][in]`, `w[out][in]`, `y[rows][out]` (`rows`,
    /// `in` = `shape.in_dim` and `out` = `shape.out_dim`).
    ///
    /// # Errors
    /// As for [`Gemv::norm`].
    pub fn residual(
        &self,
        s: &Stream,
        x: &DeviceBuffer<bf16>,
        w: &DeviceBuffer<bf16>,
        y: &mut DeviceBuffer<bf16>,
        shape: GemvShape,
    ) -> Result<()> {
        self.plain().residual(s, x, w, y, shape)
    }

    /// The products with the plain order (every load after the wait): what [`Gemv`]'s own
    /// methods launch.
    fn plain(&self) -> Preloading<'_> {
        Preloading { g: self, early: Early::NO }
    }

    /// The launch of [`Gemv::residual`] (and of [`Preloading`]'s).
    fn residual_launch(
        &self,
        s: &Stream,
        x: &DeviceBuffer<bf16>,
        w: &DeviceBuffer<bf16>,
        y: &mut DeviceBuffer<bf16>,
        shape: GemvShape,
        early: Early,
    ) -> Result<()> {
        let GemvShape { rows, in_dim, out_dim: out } = shape;
        let (idx, cfg, [rows32, in32, out32, split]) = self.plan(
            s,
            "fused product + residual",
            &[x.device(), w.device(), y.device()],
            rows,
            in_dim,
            out,
        )?;
        len_check("fused product: x must hold rows * in", mul(rows, in_dim)?, x.len())?;
        len_check("fused product: w must hold out * in", mul(out, in_dim)?, w.len())?;
        len_check("fused product: y must hold rows * out", mul(rows, out)?, y.len())?;
        if out == 0 {
            return Ok(());
        }
        // SAFETY: matches `gemv_residual_rR(const bf16_t* x, const bf16_t* w, bf16_t* y, unsigned
        // rows, unsigned in, unsigned out, unsigned split, unsigned early)` with rows <= R, split in {1, 2, 4, 8}: reads x[0..rows*in], w[0..out*in],
        // reads and writes y[0..rows*out] (each element by one thread), lengths checked above;
        // x and y are distinct buffers (one borrowed shared, the other mutably); in % 8 == 0 and
        // the shared memory as in `norm_launch`; overlapped launch as there (PDL_WAIT() before
        // any load or store but those of `w` with `early`, which only `Preloading` sets).
        unsafe {
            self.residual.0[idx].launch_overlapped(s, cfg, (x, w, y, rows32, in32, out32, split, early.0))
        }
    }

    /// The same products, each loading its first weights before it waits for the kernel queued
    /// ahead of it (programmatic dependent launch), so that they arrive while that kernel
    /// finishes: at one row of the Llama-3.2-1B shape this took a decode step from 1.346 to 1.270
    /// ms on an H100 (`bench-decode`, `docs/results/bench-decode-ab-p{0,1}-w4-h100.json`).
    ///
    /// ```no_run
    /// use cuda_core::{Device, DeviceBuffer};
    /// use half::bf16;
    /// use kernels::gemv::{Gemv, GemvShape};
    /// # fn main() -> cuda_core::Result<()> {
    /// let s = Device::new(0)?.new_stream()?;
    /// let g = Gemv::get(s.device())?;
    /// // Uploaded by a copy, written by no kernel afterwards.
    /// let w = DeviceBuffer::from_host(&s, &[bf16::from_f32(0.5); 32])?;
    /// let x = DeviceBuffer::from_host(&s, &[bf16::ONE; 16])?;
    /// let mut y = DeviceBuffer::from_host(&s, &[bf16::ONE; 2])?;
    /// // SAFETY: the only weight passed, `w`, is written by no kernel at all.
    /// let p = unsafe { g.preloading() };
    /// p.residual(&s, &x, &w, &mut y, GemvShape { rows: 1, in_dim: 16, out_dim: 2 })?;
    /// assert_eq!(y.to_vec()?, vec![bf16::from_f32(9.0); 2]);
    /// # Ok(()) }
    /// ```
    ///
    /// # Safety
    /// A launch made through the returned value may start while kernels it depends on still
    /// run: on every path of its dependencies (the stream's order, and any event wait or stream
    /// join, e.g. a capture's fork and join), every kernel back to that path's last operation that
    /// is not an overlapped launch (that operation included, when it is a kernel). None of those
    /// kernels may write a weight (`w`, `w_gate_up`) passed to a product launched through the
    /// returned value, or the product may read the weight as it was before that write. Other
    /// work is ordered as usual, and the inputs and outputs (`x`, `y`, the norm's weight) as for
    /// the plain products.
    ///
    /// Setting the environment variable `CUDA_ASYNC_GEMV_PRELOAD` to `0` before the kernels load
    /// turns the early loads off (the returned value then launches the plain products), to
    /// measure what they buy.
    pub unsafe fn preloading(&self) -> Preloading<'_> {
        Preloading { g: self, early: self.preload }
    }

    /// Whether [`Gemv::preloading`] loads weights early here (`CUDA_ASYNC_GEMV_PRELOAD` was not
    /// `0` when the kernels loaded).
    pub fn preloads(&self) -> bool {
        self.preload.0 != 0
    }
}

/// The early loads unless `CUDA_ASYNC_GEMV_PRELOAD` is `0`.
fn preload_setting() -> Early {
    match std::env::var("CUDA_ASYNC_GEMV_PRELOAD") {
        Ok(v) if v.trim() == "0" => Early::NO,
        _ => Early::YES,
    }
}

/// Which fused RMSNorm product `Gemv::norm_launch` makes: the variant's kernel set, what it is
/// called in errors, the rows its weight holds (`out`, or `2 * out` for SwiGLU) and whether it
/// loads weights early.
struct NormVariant<'k> {
    kernels: &'k ByRows,
    during: &'static str,
    w_rows: usize,
    early: Early,
}

/// Whether a product loads its first weights before its wait for the kernel ahead (the kernels'
/// `early` argument).
#[derive(Clone, Copy)]
struct Early(u32);

impl Early {
    const NO: Early = Early(0);
    const YES: Early = Early(1);
}

/// The products of [`Gemv`] with their first weight loads issued before the wait for the kernel
/// ahead, made by [`Gemv::preloading`], whose contract covers every launch made through it.
#[derive(Clone, Copy)]
pub struct Preloading<'a> {
    g: &'a Gemv,
    early: Early,
}

impl<'a> Preloading<'a> {
    fn variant(&self, kernels: &'a ByRows, during: &'static str, w_rows: usize) -> NormVariant<'a> {
        NormVariant { kernels, during, w_rows, early: self.early }
    }

    /// [`Gemv::norm`], loading weights early.
    ///
    /// # Errors
    /// As for [`Gemv::norm`].
    pub fn norm(
        &self,
        s: &Stream,
        x: &DeviceBuffer<bf16>,
        norm: RmsNorm<'_>,
        w: &DeviceBuffer<bf16>,
        y: &mut DeviceBuffer<bf16>,
        shape: GemvShape,
    ) -> Result<()> {
        let io = NormIo { x, norm, w, y };
        let during = "fused RMSNorm + product";
        self.g.norm_launch(self.variant(&self.g.norm, during, shape.out_dim), s, io, shape)
    }

    /// [`Gemv::norm_f32`], loading weights early.
    ///
    /// # Errors
    /// As for [`Gemv::norm`].
    pub fn norm_f32(
        &self,
        s: &Stream,
        x: &DeviceBuffer<bf16>,
        norm: RmsNorm<'_>,
        w: &DeviceBuffer<bf16>,
        y: &mut DeviceBuffer<f32>,
        shape: GemvShape,
    ) -> Result<()> {
        let io = NormIo { x, norm, w, y };
        let during = "fused RMSNorm + product (f32)";
        self.g.norm_launch(self.variant(&self.g.norm_f32, during, shape.out_dim), s, io, shape)
    }

    /// [`Gemv::norm_swiglu`], loading weights early.
    ///
    /// # Errors
    /// As for [`Gemv::norm_swiglu`].
    pub fn norm_swiglu(
        &self,
        s: &Stream,
        x: &DeviceBuffer<bf16>,
        norm: RmsNorm<'_>,
        w_gate_up: &DeviceBuffer<bf16>,
        y: &mut DeviceBuffer<bf16>,
        shape: GemvShape,
    ) -> Result<()> {
        let w_rows = mul(shape.out_dim, 2)?;
        let io = NormIo { x, norm, w: w_gate_up, y };
        let during = "fused RMSNorm + gate/up product + SwiGLU";
        self.g.norm_launch(self.variant(&self.g.norm_swiglu, during, w_rows), s, io, shape)
    }

    /// [`Gemv::residual`], loading weights early.
    ///
    /// # Errors
    /// As for [`Gemv::norm`].
    pub fn residual(
        &self,
        s: &Stream,
        x: &DeviceBuffer<bf16>,
        w: &DeviceBuffer<bf16>,
        y: &mut DeviceBuffer<bf16>,
        shape: GemvShape,
    ) -> Result<()> {
        self.g.residual_launch(s, x, w, y, shape, self.early)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fits_never_wraps() {
        assert!(Gemv::fits(1, 2048));
        assert!(!Gemv::fits(1, 1 << 63), "a size that wraps to 0 does not fit");
        assert!(!Gemv::fits(1, usize::MAX - 7), "nor one near usize::MAX");
        assert!(!Gemv::fits(0, 2048) && !Gemv::fits(1, 0) && !Gemv::fits(1, 12));
    }
}

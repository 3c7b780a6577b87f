//! Tensor-core bf16 products for batched decode steps (`cuda/mma.cu`): 9 to [`MMA_MAX_ROWS`]
//! rows, where [`crate::gemv`]'s FMA products stop paying and a GEMM library's tiles, made for
//! large matrices, leave most of the weight stream's bandwidth unused. Each product still reads its
//! weight matrix once; the SwiGLU, the residual add and the f32 output are fused into its epilogue
//! (the RMSNorm before a product is not: a block reads only its slice of the inputs, and the norm
//! needs whole rows).
//!
//! The kernels run on `mma.sync` (compute capability 8.0 and newer; [`Mma::get`] refuses older
//! devices). A product whose inputs are split over several blocks adds the blocks' partial sums
//! in a fixed order through an [`MmaScratch`], so its result does not depend on which block
//! finishes first: the same inputs give the same bits on every launch and replay.
//!
//! Every launcher checks the devices, the shape ([`Mma::fits`], [`MMA_MAX_OUT`]), every buffer
//! length and the scratch's capacity before launching; the kernels touch exactly the elements
//! those lengths describe.
//!
//! ```no_run
//! use cuda_core::{Device, DeviceBuffer};
//! use half::bf16;
//! use kernels::gemv::GemvShape;
//! use kernels::mma::{Mma, MmaKind, MmaScratch};
//! # fn main() -> cuda_core::Result<()> {
//! let s = Device::new(0)?.new_stream()?;
//! let m = Mma::get(s.device())?;
//! let shape = GemvShape { rows: 16, in_dim: 64, out_dim: 32 };
//! let x = DeviceBuffer::from_host(&s, &[bf16::ONE; 16 * 64])?;
//! let w = DeviceBuffer::from_host(&s, &[bf16::from_f32(0.5); 32 * 64])?;
//! let mut y = DeviceBuffer::from_host(&s, &[bf16::ONE; 16 * 32])?;
//! let mut scratch = MmaScratch::new(&s, m.scratch_needed(MmaKind::Residual, shape)?)?;
//! m.residual(&s, &x, &w, &mut y, &mut scratch, shape)?; // y = 1 + 64 * 0.5
//! assert_eq!(y.to_vec()?, vec![bf16::from_f32(33.0); 16 * 32]);
//! # Ok(()) }
//! ```

use crate::checks::{dim, len_check, mul, same_device, MAX_GRID_X};
use crate::gemv::{preload_setting, Early, GemvShape};
use cuda_core::{Device, DeviceBuffer, Error, Function, LaunchConfig, PerDevice, Result, Stream};
use half::bf16;

/// The most rows one launch takes (eight tiles of 8).
pub const MMA_MAX_ROWS: usize = 64;
/// The most inputs per row: the kernels' 32-bit input offsets (a slice's end plus the prefetch
/// distance) must not wrap.
pub const MMA_MAX_IN: usize = 1 << 24;
/// The most outputs of one product: the kernels' 32-bit output indices (`o + out` for SwiGLU)
/// must not wrap.
pub const MMA_MAX_OUT: usize = (u32::MAX / 4) as usize;
/// Warps per block (`MMA_WARPS`).
const WARPS: usize = 8;

/// What a product's epilogue does with the sums (the four kernel families of `mma.cu`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MmaKind {
    /// `y = bf16(x · wᵀ)` ([`Mma::plain`]).
    Plain,
    /// `y = x · wᵀ` in `f32` ([`Mma::f32_out`]).
    F32,
    /// `y = bf16(bf16(silu(g)) · u)`, `[g | u] = bf16(x · w_gate_upᵀ)` ([`Mma::swiglu`]).
    SwiGlu,
    /// `y = bf16(y + bf16(x · wᵀ))` ([`Mma::residual`]).
    Residual,
}

impl MmaKind {
    fn index(self) -> usize {
        self as usize
    }

    /// Weight rows per 16-row tile's outputs: a SwiGLU tile holds 8 gate and 8 up rows.
    fn tiles(self, out: usize) -> usize {
        match self {
            MmaKind::SwiGlu => out.div_ceil(8),
            _ => out.div_ceil(16),
        }
    }

    fn during(self) -> &'static str {
        match self {
            MmaKind::Plain => "tensor-core product",
            MmaKind::F32 => "tensor-core product (f32)",
            MmaKind::SwiGlu => "tensor-core gate/up product + SwiGLU",
            MmaKind::Residual => "tensor-core product + residual",
        }
    }
}

/// One kernel per compiled tile count (2, 4, 8 tiles of 8 rows).
struct ByTiles([Function; 3]);

impl ByTiles {
    fn load(m: &cuda_core::CudaModule, name: &str) -> Result<ByTiles> {
        let f = |n: usize| m.function(&format!("{name}_n{n}"));
        Ok(ByTiles([f(2)?, f(4)?, f(8)?]))
    }
}

/// The index of the kernel for `rows` (16, 32 or 64 rows compiled).
fn tiles_index(rows: usize) -> usize {
    match rows {
        0..=16 => 0,
        17..=32 => 1,
        _ => 2,
    }
}

/// How a product's inputs are split: `kw` warps of a block share a tile, `splits` blocks share a
/// tile group, each slice `kslice` inputs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Split {
    kw: usize,
    splits: usize,
    kslice: usize,
    groups: usize,
}

/// The scratch one launch needs ([`Mma::scratch_needed`]): `part` f32 partial sums and `counters`
/// arrival counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ScratchNeed {
    /// f32 partial sums.
    pub part: usize,
    /// Arrival counters (one per tile group).
    pub counters: usize,
}

impl ScratchNeed {
    /// The larger of each field: a scratch for both launches.
    pub fn max(self, other: ScratchNeed) -> ScratchNeed {
        ScratchNeed { part: self.part.max(other.part), counters: self.counters.max(other.counters) }
    }
}

/// The workspace of the products whose inputs are split over several blocks: the blocks' f32
/// partial sums and one arrival counter per tile group.
///
/// The counters are zero between launches, and that is what makes a split product right: the
/// last block of a group to arrive (the one that counts `splits - 1`) adds the partials and
/// resets its counter to zero. So the counters are allocated zeroed, are written by no kernel but
/// these products, and cannot be reached from outside this type; every launch through it is
/// ordered after the previous one (it is borrowed mutably, and the launches are tracked as writes
/// of both buffers, so another stream waits for them).
pub struct MmaScratch {
    part: DeviceBuffer<f32>,
    counters: DeviceBuffer<u32>,
}

impl MmaScratch {
    /// A scratch of `need.part` partial sums and `need.counters` counters (zeroed), at least one
    /// of each.
    ///
    /// # Errors
    /// Allocation errors.
    pub fn new(stream: &Stream, need: ScratchNeed) -> Result<MmaScratch> {
        Ok(MmaScratch {
            part: DeviceBuffer::zeros(stream, need.part.max(1))?,
            counters: DeviceBuffer::zeros(stream, need.counters.max(1))?,
        })
    }

    /// Bytes of device memory the scratch takes.
    pub fn bytes(&self) -> usize {
        self.part.size_bytes() + self.counters.size_bytes()
    }

    /// What the scratch holds.
    pub fn capacity(&self) -> ScratchNeed {
        ScratchNeed { part: self.part.len(), counters: self.counters.len() }
    }
}

/// The tensor-core products, loaded on one device.
pub struct Mma {
    device: Device,
    sms: usize,
    preload: Early,
    kernels: [ByTiles; 4],
}

impl Mma {
    /// The kernels on `device`, compiled (or read from the cache) and loaded on first use.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] on a device of compute capability below 8.0 (no bf16
    /// `mma.sync`); NVRTC and module-loading errors ([`Error::NvrtcMissing`] without `libnvrtc`).
    pub fn get(device: &Device) -> Result<&'static Mma> {
        static LOADED: PerDevice<Mma> = PerDevice::new();
        LOADED.get_or_try_init(device, || {
            let (major, minor) = device.compute_capability()?;
            if major < 8 {
                return Err(Error::InvalidArgument(format!(
                    "the tensor-core products need compute capability 8.0 or newer; device {} has {major}.{minor}",
                    device.ordinal()
                )));
            }
            let p = crate::programs::gemv();
            let m = device.compile_module(p.name, &p.source, &p.options)?;
            Ok(Mma {
                device: *device,
                sms: device.multiprocessor_count()?.max(1) as usize,
                preload: preload_setting(),
                kernels: [
                    ByTiles::load(&m, "mma_plain")?,
                    ByTiles::load(&m, "mma_f32")?,
                    ByTiles::load(&m, "mma_swiglu")?,
                    ByTiles::load(&m, "mma_residual")?,
                ],
            })
        })
    }

    /// Whether a product over `rows` rows of `in_dim` inputs can run: `1 <= rows <=`
    /// [`MMA_MAX_ROWS`] and `in_dim` a positive multiple of 8 (16-byte loads) up to
    /// [`MMA_MAX_IN`]. (Below 9 rows [`crate::gemv::Gemv`] is the faster choice.)
    pub fn fits(rows: usize, in_dim: usize) -> bool {
        (1..=MMA_MAX_ROWS).contains(&rows) && in_dim > 0 && in_dim.is_multiple_of(8) && in_dim <= MMA_MAX_IN
    }

    /// The split of a product's inputs: enough warps in flight to stream the weights at the
    /// memory's rate (about 16 per multiprocessor), as few splits as that allows, and slices of
    /// at least 256 inputs. Depends on the shape and the device only.
    fn split(&self, kind: MmaKind, rows: usize, in_dim: usize, out: usize) -> Split {
        let tiles = kind.tiles(out).max(1);
        let chunks = in_dim.div_ceil(64);
        let target = self.sms * 16; // warps
                                    // Warps per tile: 2 by default (two tiles' x rows per L1 line pair), more when the
                                    // tiles alone do not fill the GPU.
        let kw = if tiles * 2 >= target || chunks < 8 { 2.min(chunks.max(1)) } else { 2 };
        let kw = kw.clamp(1, WARPS);
        let per_block = WARPS / kw;
        let groups = tiles.div_ceil(per_block);
        let want = target.div_ceil(groups * WARPS).max(1);
        // Slices of at least 4 chunks (256 inputs), at most 16 splits.
        let max_splits = (chunks / (4 * kw)).max(1);
        let splits = want.min(max_splits).min(16).next_power_of_two().min(16);
        let splits = if splits > max_splits { (splits / 2).max(1) } else { splits };
        let slices = splits * kw;
        let kslice = in_dim.div_ceil(slices).div_ceil(64) * 64;
        let _ = rows;
        Split { kw, splits, kslice, groups }
    }

    /// The scratch a product of `kind` and `shape` needs ([`MmaScratch::new`]); zero when its
    /// inputs are not split over blocks.
    ///
    /// # Errors
    /// A shape [`Mma::fits`] refuses, or sizes that overflow.
    pub fn scratch_needed(&self, kind: MmaKind, shape: GemvShape) -> Result<ScratchNeed> {
        let GemvShape { rows, in_dim, out_dim } = shape;
        self.check_shape(kind.during(), shape)?;
        let sp = self.split(kind, rows, in_dim, out_dim);
        if sp.splits == 1 || out_dim == 0 {
            return Ok(ScratchNeed::default());
        }
        let width = mul(kind.tiles(out_dim), 16)?;
        Ok(ScratchNeed { part: mul(mul(sp.splits, rows)?, width)?, counters: sp.groups })
    }

    fn check_shape(&self, during: &'static str, shape: GemvShape) -> Result<()> {
        let GemvShape { rows, in_dim, out_dim } = shape;
        if !Mma::fits(rows, in_dim) {
            return Err(Error::InvalidArgument(format!(
                "{during}: {rows} rows of {in_dim} inputs: needs 1..={MMA_MAX_ROWS} rows and inputs a positive multiple of 8 up to {MMA_MAX_IN}"
            )));
        }
        if out_dim > MMA_MAX_OUT {
            return Err(Error::InvalidArgument(format!("{during}: {out_dim} outputs exceed {MMA_MAX_OUT}")));
        }
        Ok(())
    }

    /// `y = bf16(x · wᵀ)`: `x[rows][in]`, `w[out][in]`, `y[rows][out]` (`rows`, `in` =
    /// `shape.in_dim`, `out` = `shape.out_dim`).
    ///
    /// # Errors
    /// A shape [`Mma::fits`] refuses or with `out >` [`MMA_MAX_OUT`], lengths that do not fit it,
    /// a scratch smaller than [`Mma::scratch_needed`], devices that differ, driver errors.
    pub fn plain(
        &self,
        s: &Stream,
        x: &DeviceBuffer<bf16>,
        w: &DeviceBuffer<bf16>,
        y: &mut DeviceBuffer<bf16>,
        scratch: &mut MmaScratch,
        shape: GemvShape,
    ) -> Result<()> {
        self.launch(MmaKind::Plain, Early::NO, s, Io { x, w, y, scratch }, shape)
    }

    /// `y = x · wᵀ` in `f32` (logits): shapes as [`Mma::plain`].
    ///
    /// # Errors
    /// As for [`Mma::plain`].
    pub fn f32_out(
        &self,
        s: &Stream,
        x: &DeviceBuffer<bf16>,
        w: &DeviceBuffer<bf16>,
        y: &mut DeviceBuffer<f32>,
        scratch: &mut MmaScratch,
        shape: GemvShape,
    ) -> Result<()> {
        self.launch(MmaKind::F32, Early::NO, s, Io { x, w, y, scratch }, shape)
    }

    /// SwiGLU: `[g | u] = bf16(x · w_gate_upᵀ)` with `w_gate_up[2 * inter][in]` (gate rows
    /// first), `y[r][i] = bf16(bf16(silu(g)) * u)`, `y[rows][inter]`; `shape.out_dim` is `inter`.
    ///
    /// # Errors
    /// As for [`Mma::plain`]; also `2 * inter` overflowing `usize`.
    pub fn swiglu(
        &self,
        s: &Stream,
        x: &DeviceBuffer<bf16>,
        w_gate_up: &DeviceBuffer<bf16>,
        y: &mut DeviceBuffer<bf16>,
        scratch: &mut MmaScratch,
        shape: GemvShape,
    ) -> Result<()> {
        self.launch(MmaKind::SwiGlu, Early::NO, s, Io { x, w: w_gate_up, y, scratch }, shape)
    }

    /// `y = bf16(y + bf16(x · wᵀ))` (added into the residual stream as Hugging Face's bf16
    /// modules round): shapes as [`Mma::plain`].
    ///
    /// # Errors
    /// As for [`Mma::plain`].
    pub fn residual(
        &self,
        s: &Stream,
        x: &DeviceBuffer<bf16>,
        w: &DeviceBuffer<bf16>,
        y: &mut DeviceBuffer<bf16>,
        scratch: &mut MmaScratch,
        shape: GemvShape,
    ) -> Result<()> {
        self.launch(MmaKind::Residual, Early::NO, s, Io { x, w, y, scratch }, shape)
    }

    /// The same products, each loading its first weights before it waits for the kernel queued
    /// ahead of it (programmatic dependent launch), as [`crate::gemv::Gemv::preloading`].
    ///
    /// # Safety
    /// [`crate::gemv::Gemv::preloading`]'s contract: no kernel a launch made through the returned
    /// value can overlap (on every path of its dependencies, every kernel back to that path's last
    /// operation that is not an overlapped launch, that operation included when it is a kernel)
    /// may write a weight passed to it. `CUDA_ASYNC_GEMV_PRELOAD=0` turns the early loads off.
    pub unsafe fn preloading(&self) -> MmaPreloading<'_> {
        MmaPreloading { m: self, early: self.preload }
    }

    fn launch<Y: cuda_core::DeviceRepr>(
        &self,
        kind: MmaKind,
        early: Early,
        s: &Stream,
        io: Io<'_, Y>,
        shape: GemvShape,
    ) -> Result<()> {
        let Io { x, w, y, scratch } = io;
        let during = kind.during();
        let GemvShape { rows, in_dim, out_dim: out } = shape;
        same_device(
            &self.device,
            s,
            during,
            &[x.device(), w.device(), y.device(), scratch.part.device(), scratch.counters.device()],
        )?;
        self.check_shape(during, shape)?;
        let w_rows = if kind == MmaKind::SwiGlu { mul(out, 2)? } else { out };
        len_check("tensor-core product: x must hold rows * in", mul(rows, in_dim)?, x.len())?;
        len_check("tensor-core product: w must hold its rows * in", mul(w_rows, in_dim)?, w.len())?;
        len_check("tensor-core product: y must hold rows * out", mul(rows, out)?, y.len())?;
        let need = self.scratch_needed(kind, shape)?;
        let cap = scratch.capacity();
        if need.part > cap.part || need.counters > cap.counters {
            return Err(Error::InvalidArgument(format!(
                "{during}: the scratch holds {} partial sums and {} counters; this product needs {} and {} (Mma::scratch_needed)",
                cap.part, cap.counters, need.part, need.counters
            )));
        }
        if out == 0 {
            return Ok(());
        }
        let sp = self.split(kind, rows, in_dim, out);
        if sp.groups > MAX_GRID_X {
            return Err(Error::InvalidArgument(format!("{during}: {} blocks exceed the grid", sp.groups)));
        }
        let cfg = LaunchConfig {
            grid: (dim(sp.groups, "tile groups")?, dim(sp.splits, "splits")?, 1),
            block: ((WARPS * 32) as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        let args = (
            x,
            w,
            &mut *y,
            &mut scratch.part,
            &mut scratch.counters,
            dim(rows, "rows")?,
            dim(in_dim, "in")?,
            dim(out, "out")?,
            dim(sp.kw, "warps per tile")?,
            dim(sp.splits, "splits")?,
            dim(sp.kslice, "slice")?,
            early.0,
        );
        // SAFETY: matches `mma_K_nN(const bf16_t* x, const bf16_t* w, void* y, float* part,
        // unsigned* counters, unsigned rows, unsigned in, unsigned out, unsigned kw, unsigned
        // splits, unsigned kslice, unsigned early)` with rows <= 8 * N (`tiles_index`), kw in {1,
        // 2, 4, 8} and splits * kw * kslice >= in (`split`). The kernel reads x[0..rows*in] and
        // w[0..w_rows*in] (16-byte loads: in % 8 == 0, allocations 256-byte aligned), writes
        // y[0..rows*out] (y's element type is the one kind's kernel writes: f32 for F32, bf16
        // otherwise, as the public methods pair them; Residual reads each element first, one
        // thread per element), and with splits > 1 part[0..splits*rows*16*tiles] and
        // counters[0..groups] (capacity checked above), which are zero on entry (MmaScratch's
        // invariant) and left zero. x, w and y are distinct buffers (shared borrows and one
        // mutable borrow), so are the scratch's. Overlapped launch: every block runs PDL_WAIT()
        // before its first load or store, except loads of `w` with `early`, which only
        // `MmaPreloading` sets under `Mma::preloading`'s contract.
        unsafe { self.kernels[kind.index()].0[tiles_index(rows)].launch_overlapped(s, cfg, args) }
    }
}

/// The buffers of one product.
struct Io<'a, Y: cuda_core::DeviceRepr> {
    x: &'a DeviceBuffer<bf16>,
    w: &'a DeviceBuffer<bf16>,
    y: &'a mut DeviceBuffer<Y>,
    scratch: &'a mut MmaScratch,
}

/// The products of [`Mma`] with their first weight loads issued before the wait for the kernel
/// ahead, made by [`Mma::preloading`], whose contract covers every launch made through it.
#[derive(Clone, Copy)]
pub struct MmaPreloading<'a> {
    m: &'a Mma,
    early: Early,
}

impl MmaPreloading<'_> {
    /// [`Mma::plain`], loading weights early.
    ///
    /// # Errors
    /// As for [`Mma::plain`].
    pub fn plain(
        &self,
        s: &Stream,
        x: &DeviceBuffer<bf16>,
        w: &DeviceBuffer<bf16>,
        y: &mut DeviceBuffer<bf16>,
        scratch: &mut MmaScratch,
        shape: GemvShape,
    ) -> Result<()> {
        self.m.launch(MmaKind::Plain, self.early, s, Io { x, w, y, scratch }, shape)
    }

    /// [`Mma::f32_out`], loading weights early.
    ///
    /// # Errors
    /// As for [`Mma::plain`].
    pub fn f32_out(
        &self,
        s: &Stream,
        x: &DeviceBuffer<bf16>,
        w: &DeviceBuffer<bf16>,
        y: &mut DeviceBuffer<f32>,
        scratch: &mut MmaScratch,
        shape: GemvShape,
    ) -> Result<()> {
        self.m.launch(MmaKind::F32, self.early, s, Io { x, w, y, scratch }, shape)
    }

    /// [`Mma::swiglu`], loading weights early.
    ///
    /// # Errors
    /// As for [`Mma::swiglu`].
    pub fn swiglu(
        &self,
        s: &Stream,
        x: &DeviceBuffer<bf16>,
        w_gate_up: &DeviceBuffer<bf16>,
        y: &mut DeviceBuffer<bf16>,
        scratch: &mut MmaScratch,
        shape: GemvShape,
    ) -> Result<()> {
        self.m.launch(MmaKind::SwiGlu, self.early, s, Io { x, w: w_gate_up, y, scratch }, shape)
    }

    /// [`Mma::residual`], loading weights early.
    ///
    /// # Errors
    /// As for [`Mma::plain`].
    pub fn residual(
        &self,
        s: &Stream,
        x: &DeviceBuffer<bf16>,
        w: &DeviceBuffer<bf16>,
        y: &mut DeviceBuffer<bf16>,
        scratch: &mut MmaScratch,
        shape: GemvShape,
    ) -> Result<()> {
        self.m.launch(MmaKind::Residual, self.early, s, Io { x, w, y, scratch }, shape)
    }
}

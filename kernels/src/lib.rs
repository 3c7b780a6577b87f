//! CUDA C kernels compiled at run time by NVRTC, with typed, safe launchers.
//!
//! The sources are embedded in the binary (`include_str!`) and compiled once per device through
//! `cuda-core`'s kernel cache (memory, then disk). Each launcher checks lengths and devices, takes
//! inputs by `&` and outputs by `&mut`, and launches a grid-stride kernel that touches exactly the
//! elements `0..len`, so safe callers cannot cause an out-of-bounds access or a data race.
//!
//! Sizes: the elementwise kernels and the sum take the element count as a 64-bit integer and
//! index and stride in 64 bits over a grid capped at 32 blocks per multiprocessor, so they work on
//! buffers of any length, more than `u32::MAX` elements included. The decoder kernels
//! ([`llama`], [`gemv`]) and [`Kernels::linear`] state their limits in their docs; a size beyond
//! one is refused with [`Error::InvalidArgument`] naming the size and the limit, before anything is
//! launched.
//! The fully connected layer [`Kernels::linear`] (lazy form: [`ops::linear`]) checks each of its
//! buffers against a [`LinearShape`] instead and writes exactly its output matrix.

#![warn(missing_docs)]

use cuda_core::{Device, DeviceBuffer, DeviceRepr, Error, Function, LaunchConfig, PerDevice, Result, Stream};

mod checks;
pub mod gemv;
pub mod llama;
pub mod ops;
pub mod prefill;
pub mod programs;
pub mod sample;

/// The `half` crate, whose `bf16` is the element type of the decoder kernels ([`llama`],
/// [`gemv`]): the same as `cuda_core::half`.
pub use cuda_core::half;

/// CUDA C source of the elementwise kernels.
pub const ELEMENTWISE_SRC: &str = include_str!("../cuda/elementwise.cu");
/// CUDA C source of the reduction kernels.
pub const REDUCE_SRC: &str = include_str!("../cuda/reduce.cu");
/// CUDA C source of the fully connected layer kernel ([`Kernels::linear`]).
pub const LINEAR_SRC: &str = include_str!("../cuda/linear.cu");

/// Threads per block of every launcher.
pub const BLOCK: u32 = 256;

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for f64 {}
}

/// Element types the kernels are instantiated for: `f32` and `f64`.
pub trait Element: DeviceRepr + sealed::Sealed {
    /// Selects this type's kernels.
    fn kernels(k: &Kernels) -> &TypedKernels;
}
impl Element for f32 {
    fn kernels(k: &Kernels) -> &TypedKernels {
        &k.f32
    }
}
impl Element for f64 {
    fn kernels(k: &Kernels) -> &TypedKernels {
        &k.f64
    }
}

/// The kernels of one element type.
pub struct TypedKernels {
    pub(crate) fill: Function,
    pub(crate) scale: Function,
    scale_by: Function,
    pub(crate) axpy: Function,
    add: Function,
    mul: Function,
    sum: Function,
    pub(crate) linear: Function,
}

/// All kernels, loaded on one device.
pub struct Kernels {
    device: Device,
    max_blocks: u32,
    f32: TypedKernels,
    f64: TypedKernels,
}

impl TypedKernels {
    fn load(
        ew: &cuda_core::CudaModule,
        red: &cuda_core::CudaModule,
        lin: &cuda_core::CudaModule,
        s: &str,
    ) -> Result<Self> {
        Ok(TypedKernels {
            fill: ew.function(&format!("fill_{s}"))?,
            scale: ew.function(&format!("scale_{s}"))?,
            scale_by: ew.function(&format!("scale_by_{s}"))?,
            axpy: ew.function(&format!("axpy_{s}"))?,
            add: ew.function(&format!("add_{s}"))?,
            mul: ew.function(&format!("mul_{s}"))?,
            sum: red.function(&format!("sum_{s}"))?,
            linear: lin.function(&format!("linear_{s}"))?,
        })
    }
}

impl Kernels {
    /// The kernels on `device`, compiled (or read from the cache) and loaded on first use, then
    /// kept for the life of the process.
    pub fn get(device: &Device) -> Result<&'static Kernels> {
        static LOADED: PerDevice<Kernels> = PerDevice::new();
        LOADED.get_or_try_init(device, || {
            let compile = |p: programs::Program| device.compile_module(p.name, &p.source, &p.options);
            let ew = compile(programs::elementwise())?;
            let red = compile(programs::reduce())?;
            let lin = compile(programs::linear())?;
            let sms = device.multiprocessor_count()?;
            Ok(Kernels {
                device: *device,
                max_blocks: sms.saturating_mul(32).max(1),
                f32: TypedKernels::load(&ew, &red, &lin, "f32")?,
                f64: TypedKernels::load(&ew, &red, &lin, "f64")?,
            })
        })
    }

    /// The device these kernels are loaded on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The launch configuration used for `n` elements: 256-thread blocks, a grid capped at 32
    /// blocks per multiprocessor (the kernels' 64-bit grid-stride loops cover the rest, so any
    /// `n` a buffer can hold works, including more than `u32::MAX` elements).
    pub fn config(&self, n: usize) -> LaunchConfig {
        checks::grid_stride(n, BLOCK, self.max_blocks)
    }

    fn check(&self, stream: &Stream, during: &'static str, lens: &[usize]) -> Result<usize> {
        if stream.device() != &self.device {
            return Err(Error::DeviceMismatch {
                during,
                expected: self.device.ordinal(),
                actual: stream.device().ordinal(),
            });
        }
        let n = lens[0];
        if let Some(&bad) = lens.iter().find(|&&l| l != n) {
            return Err(Error::LengthMismatch { during, expected: n, actual: bad });
        }
        Ok(n)
    }

    /// `out[i] = value` for every element.
    pub fn fill<T: Element>(&self, stream: &Stream, out: &mut DeviceBuffer<T>, value: T) -> Result<()> {
        let n = self.check(stream, "fill kernel", &[out.len()])?;
        if n == 0 {
            return Ok(());
        }
        // SAFETY: matches `fill_<T>(T* out, T value, unsigned long long n)`; the kernel writes
        // exactly out[0..n] and `out` is borrowed mutably.
        unsafe { T::kernels(self).fill.launch(stream, self.config(n), (out, value, n as u64)) }
    }

    /// `out[i] = alpha * x[i]`.
    pub fn scale<T: Element>(
        &self,
        stream: &Stream,
        x: &DeviceBuffer<T>,
        alpha: T,
        out: &mut DeviceBuffer<T>,
    ) -> Result<()> {
        let n = self.check(stream, "scale kernel", &[x.len(), out.len()])?;
        if n == 0 {
            return Ok(());
        }
        // SAFETY: matches `scale_<T>(const T* x, T alpha, T* out, n)`; reads x[0..n], writes
        // out[0..n]; `out` is exclusive and cannot alias `x` (borrow rules).
        unsafe { T::kernels(self).scale.launch(stream, self.config(n), (x, alpha, out, n as u64)) }
    }

    /// `out[i] = alpha[0] * x[i]`, with the factor read from device memory when the kernel runs
    /// (so a captured graph follows changes to it). `alpha` must hold exactly one element.
    pub fn scale_by<T: Element>(
        &self,
        stream: &Stream,
        x: &DeviceBuffer<T>,
        alpha: &DeviceBuffer<T>,
        out: &mut DeviceBuffer<T>,
    ) -> Result<()> {
        self.check(stream, "scale_by kernel", &[1, alpha.len()])?;
        let n = self.check(stream, "scale_by kernel", &[x.len(), out.len()])?;
        if n == 0 {
            return Ok(());
        }
        // SAFETY: matches `scale_by_<T>(const T* x, const T* alpha, T* out, n)`; reads alpha[0]
        // (length checked) and x[0..n], writes out[0..n]; `out` is exclusive.
        unsafe { T::kernels(self).scale_by.launch(stream, self.config(n), (x, alpha, out, n as u64)) }
    }

    /// `y[i] = alpha * x[i] + y[i]`.
    pub fn axpy<T: Element>(
        &self,
        stream: &Stream,
        alpha: T,
        x: &DeviceBuffer<T>,
        y: &mut DeviceBuffer<T>,
    ) -> Result<()> {
        let n = self.check(stream, "axpy kernel", &[x.len(), y.len()])?;
        if n == 0 {
            return Ok(());
        }
        // SAFETY: matches `axpy_<T>(T alpha, const T* x, T* y, n)`; in-bounds, `y` exclusive.
        unsafe { T::kernels(self).axpy.launch(stream, self.config(n), (alpha, x, y, n as u64)) }
    }

    /// `out[i] = a[i] + b[i]`.
    pub fn add<T: Element>(
        &self,
        stream: &Stream,
        a: &DeviceBuffer<T>,
        b: &DeviceBuffer<T>,
        out: &mut DeviceBuffer<T>,
    ) -> Result<()> {
        self.binary(stream, "add kernel", &T::kernels(self).add, a, b, out)
    }

    /// `out[i] = a[i] * b[i]`.
    pub fn mul<T: Element>(
        &self,
        stream: &Stream,
        a: &DeviceBuffer<T>,
        b: &DeviceBuffer<T>,
        out: &mut DeviceBuffer<T>,
    ) -> Result<()> {
        self.binary(stream, "mul kernel", &T::kernels(self).mul, a, b, out)
    }

    fn binary<T: Element>(
        &self,
        stream: &Stream,
        during: &'static str,
        f: &Function,
        a: &DeviceBuffer<T>,
        b: &DeviceBuffer<T>,
        out: &mut DeviceBuffer<T>,
    ) -> Result<()> {
        let n = self.check(stream, during, &[a.len(), b.len(), out.len()])?;
        if n == 0 {
            return Ok(());
        }
        // SAFETY: matches `<op>_<T>(const T* a, const T* b, T* out, n)`; in-bounds, `out` exclusive.
        unsafe { f.launch(stream, self.config(n), (a, b, out, n as u64)) }
    }

    /// `out[0] = sum(x)`, accumulated in `f64`. `out` must hold exactly one element.
    pub fn sum<T: Element>(
        &self,
        stream: &Stream,
        x: &DeviceBuffer<T>,
        out: &mut DeviceBuffer<f64>,
    ) -> Result<()> {
        self.check(stream, "sum kernel", &[1, out.len()])?;
        let n = x.len();
        out.memset_zero(stream)?;
        if n == 0 {
            return Ok(());
        }
        // SAFETY: matches `sum_<T>(const T* x, double* out, n)`; reads x[0..n], adds into out[0]
        // (zeroed above on the same stream); block size 256 is a multiple of 32.
        unsafe { T::kernels(self).sum.launch(stream, self.config(n), (x, out, n as u64)) }
    }

    /// A fully connected layer: `y[r, o] = act(b[o] + sum_i x[r, i] * w[o, i])` for every row
    /// `r < shape.batch` and output feature `o < shape.out_dim`, with `act` = ReLU (`max(0, .)`)
    /// when `shape.relu`, else the identity. Row-major `x[batch][in_dim]`, `w[out_dim][in_dim]`
    /// (PyTorch's `nn.Linear` layout), `b[out_dim]`, `y[batch][out_dim]`. Accumulates in `T`
    /// (`f32` for `f32`).
    ///
    /// Checks, before launching anything: the stream and the four buffers are on these kernels'
    /// device ([`Error::DeviceMismatch`]); every dimension is at most `i32::MAX` and the element counts do
    /// not overflow ([`Error::InvalidArgument`]); `x.len() == batch * in_dim`,
    /// `w.len() == out_dim * in_dim`, `b.len() == out_dim` and `y.len() == batch * out_dim`
    /// ([`Error::LengthMismatch`]). With `batch == 0` or `out_dim == 0` nothing is launched; with
    /// `in_dim == 0`, `y` gets the (activated) bias.
    ///
    /// One warp computes one output feature for a tile of up to four rows (see
    /// `cuda/linear.cu`); every element of `y` is written exactly once, nothing else is.
    pub fn linear<T: Element>(
        &self,
        stream: &Stream,
        x: &DeviceBuffer<T>,
        w: &DeviceBuffer<T>,
        b: &DeviceBuffer<T>,
        y: &mut DeviceBuffer<T>,
        shape: LinearShape,
    ) -> Result<()> {
        const DURING: &str = "linear kernel";
        let lens = shape.lens()?;
        self.check(stream, DURING, &[lens.y])?; // the stream's device (one length: always agrees)
        for buf_device in [x.device(), w.device(), b.device(), y.device()] {
            if buf_device != stream.device() {
                return Err(Error::DeviceMismatch {
                    during: DURING,
                    expected: stream.device().ordinal(),
                    actual: buf_device.ordinal(),
                });
            }
        }
        for (during, expected, actual) in [
            ("linear kernel: x must hold batch * in_dim elements", lens.x, x.len()),
            ("linear kernel: w must hold out_dim * in_dim elements", lens.w, w.len()),
            ("linear kernel: b must hold out_dim elements", lens.b, b.len()),
            ("linear kernel: y must hold batch * out_dim elements", lens.y, y.len()),
        ] {
            if expected != actual {
                return Err(Error::LengthMismatch { during, expected, actual });
            }
        }
        if shape.batch == 0 || shape.out_dim == 0 {
            return Ok(());
        }
        let warps = BLOCK / 32;
        // Dimensions are <= i32::MAX (checked by `lens`), so these fit in u32 (checked anyway).
        let blocks_x = checks::dim(shape.out_dim.div_ceil(warps as usize), "linear kernel blocks")?;
        let tiles = shape.batch.div_ceil(LINEAR_ROWS);
        let cfg = LaunchConfig {
            grid: (blocks_x, checks::dim(tiles.min(checks::MAX_GRID_Y), "linear kernel tiles")?, 1),
            block: (BLOCK, 1, 1),
            shared_mem_bytes: 0,
        };
        let (batch, in_dim, out_dim) = (
            checks::dim(shape.batch, "linear kernel batch")?,
            checks::dim(shape.in_dim, "linear kernel in_dim")?,
            checks::dim(shape.out_dim, "linear kernel out_dim")?,
        );
        // SAFETY: matches `linear_<T>(const T* x, const T* w, const T* b, T* y, unsigned batch,
        // unsigned in_dim, unsigned out_dim, int relu)`. The lengths of all four buffers were
        // checked against the dimensions above, and the kernel reads x[0..batch*in_dim],
        // w[0..out_dim*in_dim], b[0..out_dim] and writes only y[0..batch*out_dim] (rows tiled by
        // LINEAR_ROWS, the same constant as the kernel's; any grid is correct); `y` is borrowed
        // mutably, so it aliases none of the inputs. BLOCK is a multiple of 32, as the kernel needs.
        unsafe {
            T::kernels(self).linear.launch(
                stream,
                cfg,
                (x, w, b, y, batch, in_dim, out_dim, i32::from(shape.relu)),
            )
        }
    }
}

/// Batch rows per warp tile of the linear kernel (`LINEAR_ROWS` in `cuda/linear.cu`).
const LINEAR_ROWS: usize = 4;

/// The dimensions of a fully connected layer ([`Kernels::linear`], [`ops::linear`]): `batch` rows
/// of `in_dim` inputs mapped to `out_dim` outputs, with ReLU applied to the outputs when `relu`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LinearShape {
    /// Rows of `x` and `y`.
    pub batch: usize,
    /// Features per input row (columns of `x` and of `w`).
    pub in_dim: usize,
    /// Features per output row (rows of `w`, elements of `b`, columns of `y`).
    pub out_dim: usize,
    /// Whether ReLU is applied to the outputs.
    pub relu: bool,
}

/// The element counts a [`LinearShape`] requires of its four buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinearLens {
    /// `batch * in_dim`.
    pub x: usize,
    /// `out_dim * in_dim`.
    pub w: usize,
    /// `out_dim`.
    pub b: usize,
    /// `batch * out_dim`.
    pub y: usize,
}

impl LinearShape {
    /// The element counts of `x`, `w`, `b` and `y`, or [`Error::InvalidArgument`] when a
    /// dimension exceeds `i32::MAX` (the kernel's index arithmetic) or a count overflows `usize`.
    pub fn lens(&self) -> Result<LinearLens> {
        let limit = i32::MAX as usize;
        if self.batch > limit || self.in_dim > limit || self.out_dim > limit {
            return Err(Error::InvalidArgument(format!(
                "linear layer {self:?}: every dimension must be at most {limit}"
            )));
        }
        let mul = |a: usize, b: usize| {
            a.checked_mul(b).ok_or_else(|| {
                Error::InvalidArgument(format!("linear layer {self:?}: {a} * {b} elements overflow"))
            })
        };
        Ok(LinearLens {
            x: mul(self.batch, self.in_dim)?,
            w: mul(self.out_dim, self.in_dim)?,
            b: self.out_dim,
            y: mul(self.batch, self.out_dim)?,
        })
    }
}

//! cuBLAS matrix products on this crate's streams and buffers (feature `cublas`, on by default).
//!
//! `libcublas.so` is loaded at run time, like the driver: the crate builds with no CUDA toolkit,
//! and [`Blas::new`] returns [`Error::LibraryMissing`] naming the library where it is absent.
//!
//! A [`Blas`] owns a cuBLAS handle and a workspace buffer of its own. Every product goes through
//! [`Stream::enqueue_external`], so it is ordered like a kernel launch with every other use of the
//! buffers it touches (inputs read, output and workspace written), on whatever stream those ran,
//! and, while the stream is captured, recorded into the graph, which then keeps the buffers and
//! the workspace alive. The workspace is set on every call, so cuBLAS never allocates while a
//! stream is captured. Handles are never destroyed: a dropped `Blas` returns its handle to a
//! per-device pool, so the cuBLAS kernels that captured graphs refer to stay loaded.
//!
//! ```no_run
//! use cuda_core::blas::{Blas, Linear};
//! use cuda_core::{Device, DeviceBuffer};
//! use half::bf16;
//! # fn main() -> cuda_core::Result<()> {
//! let s = Device::new(0)?.new_stream()?;
//! let blas = Blas::new(&s)?;
//! // y[2][3] = x[2][4] · w[3][4]ᵀ, as PyTorch's `nn.Linear` (no bias).
//! let x = DeviceBuffer::from_host(&s, &[bf16::ONE; 8])?;
//! let w = DeviceBuffer::from_host(&s, &[bf16::ONE; 12])?;
//! let mut y = DeviceBuffer::<f32>::zeros(&s, 6)?;
//! blas.linear(&s, &x, &w, &mut y, Linear { rows: 2, in_dim: 4, out_dim: 3, accumulate: false })?;
//! assert_eq!(y.to_vec()?, vec![4.0; 6]);
//! # Ok(()) }
//! ```

use crate::device::Device;
use crate::error::{Error, Result};
use crate::memory::{Access, DeviceBuffer, DeviceRepr};
use crate::stream::Stream;
use cudarc::cublas::sys;
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::Mutex;

mod result;

/// Bytes of the workspace each [`Blas`] gives cuBLAS (NVIDIA recommends 32 MiB on Hopper).
pub const WORKSPACE_BYTES: usize = 32 << 20;

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for half::f16 {}
    impl Sealed for half::bf16 {}
}

/// Element types of cuBLAS products: `f32`, `half::f16`, `half::bf16`.
pub trait BlasScalar: DeviceRepr + sealed::Sealed {
    /// cuBLAS's name of this type.
    const DATA_TYPE: sys::cudaDataType;
}
impl BlasScalar for f32 {
    const DATA_TYPE: sys::cudaDataType = sys::cudaDataType::CUDA_R_32F;
}
impl BlasScalar for half::f16 {
    const DATA_TYPE: sys::cudaDataType = sys::cudaDataType::CUDA_R_16F;
}
impl BlasScalar for half::bf16 {
    const DATA_TYPE: sys::cudaDataType = sys::cudaDataType::CUDA_R_16BF;
}

/// The shape of a fully connected product, row-major as PyTorch's `nn.Linear` without bias:
/// `y[r][o] = sum_i x[r][i] * w[o][i]` (plus the old `y[r][o]` when `accumulate`), for
/// `r < rows`, `o < out_dim`. Accumulates in `f32`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Linear {
    /// Rows of `x` and `y`.
    pub rows: usize,
    /// Columns of `x` and of `w`.
    pub in_dim: usize,
    /// Rows of `w`, columns of `y`.
    pub out_dim: usize,
    /// Add the product to `y` (`beta = 1`) instead of overwriting it: a fused residual add.
    pub accumulate: bool,
}

impl Linear {
    /// Checks the dimensions (each at most `i32::MAX`, cuBLAS's `int`) and the buffer lengths
    /// `x = rows * in_dim`, `w = out_dim * in_dim`, `y = rows * out_dim`.
    fn check(&self, x: usize, w: usize, y: usize) -> Result<(i32, i32, i32)> {
        let dim = |v: usize| {
            i32::try_from(v)
                .map_err(|_| Error::InvalidArgument(format!("cuBLAS product {self:?}: {v} exceeds i32::MAX")))
        };
        let (rows, k, n) = (dim(self.rows)?, dim(self.in_dim)?, dim(self.out_dim)?);
        let mul = |a: usize, b: usize| {
            a.checked_mul(b).ok_or_else(|| {
                Error::InvalidArgument(format!("cuBLAS product {self:?}: {a} * {b} overflows"))
            })
        };
        for (during, expected, actual) in [
            ("cuBLAS product: x must hold rows * in_dim elements", mul(self.rows, self.in_dim)?, x),
            ("cuBLAS product: w must hold out_dim * in_dim elements", mul(self.out_dim, self.in_dim)?, w),
            ("cuBLAS product: y must hold rows * out_dim elements", mul(self.rows, self.out_dim)?, y),
        ] {
            if expected != actual {
                return Err(Error::LengthMismatch { during, expected, actual });
            }
        }
        Ok((rows, k, n))
    }
}

/// A cuBLAS handle (kept in the per-device pool, never destroyed).
struct Handle(sys::cublasHandle_t);
// SAFETY: a cuBLAS handle may be used from any thread, one call at a time; `Blas` serialises its
// calls with a mutex, and the pool hands each handle to one `Blas` at a time.
unsafe impl Send for Handle {}

static POOL: Mutex<Option<HashMap<usize, Vec<Handle>>>> = Mutex::new(None);

/// Loads `libcublas` once, or says which names were tried.
fn load() -> Result<()> {
    static PRESENT: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    if *PRESENT.get_or_init(result::library_present) {
        return Ok(());
    }
    Err(Error::LibraryMissing {
        library: "libcublas.so (cuBLAS)",
        searched: cudarc::get_lib_name_candidates("cublas").join(", "),
    })
}

fn take_handle(device: &Device) -> Result<Handle> {
    let pooled = POOL
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get_or_insert_with(HashMap::new)
        .get_mut(&device.ordinal())
        .and_then(Vec::pop);
    if let Some(h) = pooled {
        return Ok(h);
    }
    device.bind()?;
    // SAFETY: the library is loaded (`Blas::new` called `load`) and the device's primary context
    // is current (bound above).
    let raw = unsafe { result::create() }?;
    Ok(Handle(raw))
}

/// A cuBLAS handle with its own workspace, for products on streams of one device (see the module
/// docs for ordering and capture). Calls through one `Blas` are serialised; use one per stream
/// that runs products concurrently (they share nothing then).
pub struct Blas {
    device: Device,
    handle: Mutex<Option<Handle>>,
    workspace: DeviceBuffer<u8>,
}

impl std::fmt::Debug for Blas {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Blas").field("device", &self.device.ordinal()).finish_non_exhaustive()
    }
}

impl Blas {
    /// A handle for `stream`'s device, with a [`WORKSPACE_BYTES`] workspace allocated on `stream`.
    ///
    /// # Errors
    /// [`Error::LibraryMissing`] without `libcublas`; [`Error::Library`] if cuBLAS cannot create a
    /// handle; [`Error::Capture`] on a capturing stream (the workspace allocation); driver errors.
    pub fn new(stream: &Stream) -> Result<Blas> {
        load()?;
        let workspace = DeviceBuffer::zeros(stream, WORKSPACE_BYTES)?;
        let handle = take_handle(stream.device())?;
        Ok(Blas { device: *stream.device(), handle: Mutex::new(Some(handle)), workspace })
    }

    /// The device this handle works on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// `y = x · wᵀ` (or `y += x · wᵀ` with `shape.accumulate`) on `stream`: see [`Linear`].
    /// Inputs of type `T`, output `U` (`U = T`, or `f32` for 16-bit `T`), `f32` accumulation. An
    /// empty inner dimension (`in_dim == 0`) gives `y = 0` (`y` unchanged with `accumulate`).
    ///
    /// ```no_run
    /// # fn main() -> cuda_core::Result<()> {
    /// use cuda_core::blas::{Blas, Linear};
    /// use cuda_core::{Device, DeviceBuffer};
    /// let s = Device::new(0)?.new_stream()?;
    /// let blas = Blas::new(&s)?;
    /// let x = DeviceBuffer::from_host(&s, &[1.0f32, 2.0])?; // 1 x 2
    /// let w = DeviceBuffer::from_host(&s, &[1.0f32, 1.0, 0.0, 1.0])?; // 2 x 2: rows [1, 1], [0, 1]
    /// let mut y = DeviceBuffer::from_host(&s, &[10.0f32, 20.0])?;
    /// blas.linear(&s, &x, &w, &mut y, Linear { rows: 1, in_dim: 2, out_dim: 2, accumulate: true })?;
    /// assert_eq!(y.to_vec()?, [13.0, 22.0]); // y += x · wᵀ: a fused residual add
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::LengthMismatch`] or [`Error::InvalidArgument`] for buffers that do not fit
    /// `shape`, or an output type that is neither `T` nor `f32`; [`Error::DeviceMismatch`] for
    /// a stream or buffer of another device; [`Error::Library`] if cuBLAS refuses the product;
    /// [`Error::Capture`] if another thread captures `stream`; driver errors of the ordering.
    pub fn linear<T: BlasScalar, U: BlasScalar>(
        &self,
        stream: &Stream,
        x: &DeviceBuffer<T>,
        w: &DeviceBuffer<T>,
        y: &mut DeviceBuffer<U>,
        shape: Linear,
    ) -> Result<()> {
        let (rows, k, n) = shape.check(x.len(), w.len(), y.len())?;
        if stream.device() != &self.device {
            return Err(Error::DeviceMismatch {
                during: "a cuBLAS product on a stream of another device than the handle's",
                expected: self.device.ordinal(),
                actual: stream.device().ordinal(),
            });
        }
        // Also for the empty products below, which queue nothing.
        if let Some(other) = [x.device(), w.device(), y.device()].into_iter().find(|d| *d != &self.device) {
            return Err(Error::DeviceMismatch {
                during: "a cuBLAS product with a buffer of another device than the handle's",
                expected: self.device.ordinal(),
                actual: other.ordinal(),
            });
        }
        // The pairs documented above; cuBLAS's answer to others would depend on the shape (the
        // empty products below never reach it).
        if T::DATA_TYPE != U::DATA_TYPE && U::DATA_TYPE != sys::cudaDataType::CUDA_R_32F {
            return Err(Error::InvalidArgument(format!(
                "cuBLAS product {shape:?}: output type {:?} for inputs {:?} (the output must be the input type or f32)",
                U::DATA_TYPE,
                T::DATA_TYPE
            )));
        }
        if rows == 0 || n == 0 {
            return Ok(());
        }
        if k == 0 {
            // An empty sum: `y = 0`, or `y` unchanged when accumulating. cuBLAS refuses the
            // leading dimension 0 that this shape would give it.
            return if shape.accumulate { Ok(()) } else { y.memset_zero(stream) };
        }
        let (alpha, beta) = (1.0f32, if shape.accumulate { 1.0f32 } else { 0.0 });
        let uses = [
            (x.allocation(), Access::Read),
            (w.allocation(), Access::Read),
            (y.allocation(), Access::Write),
            (self.workspace.allocation(), Access::Write),
        ];
        let (xp, wp, yp, ws) = (x.device_ptr(), w.device_ptr(), y.device_ptr(), self.workspace.device_ptr());
        let guard = self.handle.lock().unwrap_or_else(|e| e.into_inner());
        let handle = guard
            .as_ref()
            .map(|h| h.0)
            .ok_or_else(|| Error::InvalidArgument("cuBLAS handle already released".into()))?;
        // SAFETY: the closure queues only cuBLAS work on the raw stream: one GEMM that reads
        // x[0..rows*k] and w[0..n*k] and writes y[0..rows*n] (lengths checked above), plus the
        // workspace, all listed in `uses` with their access; `y` is borrowed mutably and the
        // workspace is this handle's, used under the handle's mutex. The workspace is set, so
        // cuBLAS allocates nothing; it calls nothing of this crate and does not block.
        unsafe {
            stream.enqueue_external(&uses, |raw| {
                result::set_stream(handle, raw as sys::cudaStream_t)?;
                result::set_workspace(handle, ws as *mut c_void, WORKSPACE_BYTES)?;
                // Column-major view: C(n x rows) = op(A)(n x k) · B(k x rows) with A = w as a
                // k x n matrix (lda = k) transposed, B = x as k x rows (ldb = k), C = y (ldc = n).
                result::gemm_ex(
                    handle,
                    sys::cublasOperation_t::CUBLAS_OP_T,
                    sys::cublasOperation_t::CUBLAS_OP_N,
                    n,
                    rows,
                    k,
                    &alpha as *const f32 as *const c_void,
                    wp as *const c_void,
                    T::DATA_TYPE,
                    k,
                    xp as *const c_void,
                    T::DATA_TYPE,
                    k,
                    &beta as *const f32 as *const c_void,
                    yp as *mut c_void,
                    U::DATA_TYPE,
                    n,
                    sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                    sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
                )
            })
        }
    }
}

impl Drop for Blas {
    fn drop(&mut self) {
        // The handle goes back to the pool, never destroyed (see the module docs); the workspace
        // is freed after every use queued or recorded so far, as every buffer is.
        let handle = self.handle.get_mut().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(h) = handle {
            let mut pool = POOL.lock().unwrap_or_else(|e| e.into_inner());
            pool.get_or_insert_with(HashMap::new).entry(self.device.ordinal()).or_default().push(h);
        }
    }
}

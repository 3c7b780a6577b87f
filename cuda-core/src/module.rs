//! Loaded code: modules and the kernel functions in them. Launching them is in `launch.rs`.

use crate::device::Device;
use crate::driver::result;
use crate::error::{Error, Result};
use cudarc::driver::sys;
use std::ffi::CString;
use std::sync::Arc;

/// A kernel attribute, as the driver names it (`CU_FUNC_ATTRIBUTE_*`).
pub use sys::CUfunction_attribute as FunctionAttribute;

struct ModuleInner {
    device: Device,
    raw: sys::CUmodule,
}

// SAFETY: module handles may be used from any thread of the process.
unsafe impl Send for ModuleInner {}
// SAFETY: immutable after load; cuModuleGetFunction is thread-safe.
unsafe impl Sync for ModuleInner {}

impl Drop for ModuleInner {
    fn drop(&mut self) {
        // A kernel of this module may still be queued or running: wait for the device to go idle
        // before unloading, so no launch ever runs code that was unloaded. This blocks, which is
        // why modules are normally loaded once and kept (the `kernels` crate caches them).
        // Both in one device-wide step (never overlapping a capture, see `driver::device_wide`):
        // no capture can begin between the synchronisation and the unload. While a capture is
        // open anywhere, the module is leaked instead (a drop cannot wait or fail).
        if self.device.bind().is_err() {
            return;
        }
        let raw = self.raw;
        let unloaded =
            crate::driver::device_wide("unloading a module while a stream capture is active", || {
                // SAFETY: this device's context is current; no capture is open (the gate).
                unsafe { result::ctx_synchronize() }?;
                // SAFETY: we own the module; every launch from it has completed (synchronized above)
                // and no Function outlives this (each holds an Arc to us).
                unsafe { result::module_unload(raw) }
            });
        crate::error::note_drop(unloaded);
    }
}

/// A loaded module (PTX or CUBIN). Cloning gives another handle; the module is unloaded when the
/// last handle and the last [`Function`] from it are dropped.
///
/// ```no_run
/// # fn main() -> cuda_core::Result<()> {
/// use cuda_core::Device;
/// let dev = Device::new(0)?;
/// let m = dev.compile_module("k.cu", r#"extern "C" __global__ void k(int* x) { *x = 1; }"#, &[])?;
/// let k = m.function("k")?;
/// drop(m); // `k` keeps the module loaded
/// assert_eq!(k.device(), &dev);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct CudaModule {
    inner: Arc<ModuleInner>,
}

impl std::fmt::Debug for CudaModule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CudaModule({:p})", self.inner.raw)
    }
}

impl CudaModule {
    /// Loads a module from PTX text.
    ///
    /// ```no_run
    /// # fn main() -> cuda_core::Result<()> {
    /// use cuda_core::{CudaModule, Device};
    /// let ptx = r#"
    /// .version 7.0
    /// .target sm_70
    /// .address_size 64
    /// .visible .entry nop(.param .u32 n) { ret; }
    /// "#;
    /// let m = CudaModule::from_ptx(&Device::new(0)?, ptx)?; // JIT-compiled for the device
    /// let nop = m.function("nop")?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for PTX with a NUL byte or beginning with a binary image's
    /// magic (which the driver would read as that image); driver errors (e.g. PTX for a newer
    /// architecture).
    pub fn from_ptx(device: &Device, ptx: &str) -> Result<CudaModule> {
        crate::module_image::check_ptx(ptx)?;
        let c =
            CString::new(ptx).map_err(|_| Error::InvalidArgument("PTX text contains a NUL byte".into()))?;
        Self::load(device, c.as_bytes_with_nul())
    }

    /// Loads a module from a CUBIN (or fatbin) image.
    ///
    /// The driver reads an image by the sizes in its own headers, so the image is checked first:
    /// an ELF cubin or a fatbin whose every header, table, section and entry lies within `image`
    /// (see `module_image`); anything else, e.g. a truncated file, is refused rather than read past
    /// its end.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for an empty image, one that is neither an ELF cubin nor a
    /// fatbin, or one whose headers reach past its end; driver errors (e.g. an image for another
    /// architecture).
    pub fn from_cubin(device: &Device, image: &[u8]) -> Result<CudaModule> {
        let aligned = crate::module_image::checked_binary(image)?;
        // SAFETY: reinterpreting u64s as bytes of the same total length.
        let bytes = unsafe { std::slice::from_raw_parts(aligned.as_ptr().cast(), aligned.len() * 8) };
        Self::load(device, bytes)
    }

    /// The check [`CudaModule::from_cubin`] applies before handing an image to the driver, alone
    /// (no device needed): `Ok` for an ELF cubin or a fatbin whose every header, table, section
    /// and entry lies within `image`.
    ///
    /// ```
    /// use cuda_core::CudaModule;
    /// assert!(CudaModule::check_image(b"not an image").is_err());
    /// assert!(CudaModule::check_image(&[]).is_err());
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] naming what is wrong with the image.
    pub fn check_image(image: &[u8]) -> Result<()> {
        crate::module_image::checked_binary(image).map(drop)
    }

    fn load(device: &Device, image: &[u8]) -> Result<CudaModule> {
        device.bind()?;
        // SAFETY: `image` is a NUL-terminated PTX string or an aligned binary image that lives
        // across the call; the context is bound.
        let raw = unsafe { result::module_load_data(image.as_ptr().cast()) }?;
        Ok(CudaModule { inner: Arc::new(ModuleInner { device: *device, raw }) })
    }

    /// Looks up a kernel by its (`extern "C"`) name.
    ///
    /// ```no_run
    /// # fn main() -> cuda_core::Result<()> {
    /// let dev = cuda_core::Device::new(0)?;
    /// let m = dev.compile_module("k.cu", r#"extern "C" __global__ void k(int* x) { *x = 1; }"#, &[])?;
    /// let k = m.function("k")?; // the `extern "C"` name: no C++ mangling
    /// assert!(m.function("missing").is_err());
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a name with a NUL byte; driver errors (`CUDA_ERROR_NOT_FOUND`
    /// for a missing kernel).
    pub fn function(&self, name: &str) -> Result<Function> {
        let c = CString::new(name)
            .map_err(|_| Error::InvalidArgument("kernel name contains a NUL byte".into()))?;
        self.inner.device.bind()?;
        // SAFETY: live module.
        let raw = unsafe { result::module_get_function(self.inner.raw, &c) }?;
        Ok(Function { _module: self.inner.clone(), raw, device: self.inner.device })
    }

    /// The device the module was loaded on.
    pub fn device(&self) -> &Device {
        &self.inner.device
    }
}

/// A kernel in a loaded module. Keeps its module loaded.
///
/// ```no_run
/// # fn main() -> cuda_core::Result<()> {
/// use cuda_core::{Device, FunctionAttribute};
/// let dev = Device::new(0)?;
/// let f = dev.compile_module("k.cu", r#"extern "C" __global__ void k(int* x) { *x = 1; }"#, &[])?
///     .function("k")?;
/// let max = f.attribute(FunctionAttribute::CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK)?;
/// assert!(max > 0);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Function {
    _module: Arc<ModuleInner>,
    raw: sys::CUfunction,
    device: Device,
}

// SAFETY: function handles may be used from any thread; launches are thread-safe in the driver.
unsafe impl Send for Function {}
// SAFETY: as above; immutable.
unsafe impl Sync for Function {}

impl std::fmt::Debug for Function {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Function({:p})", self.raw)
    }
}

impl Function {
    /// The raw handle, valid while `self` lives.
    pub fn raw(&self) -> sys::CUfunction {
        self.raw
    }

    /// The device the function's module is loaded on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Reads a function attribute (e.g. `CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK`).
    ///
    /// # Errors
    /// Driver errors.
    pub fn attribute(&self, attr: FunctionAttribute) -> Result<i32> {
        // SAFETY: live function (its module is kept loaded by `self`).
        unsafe { result::func_get_attribute(attr, self.raw) }
    }
}

//! `Kernel`: a kernel of the user's, from CUDA C, PTX or a cubin/fatbin, loaded once per device.

use crate::Result;
use cuda_core::{CudaModule, Device, Function};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Where a kernel's code comes from.
#[derive(Clone, Debug)]
enum Code {
    /// CUDA C, compiled by NVRTC through `cuda-core`'s memory and disk cache.
    Cuda { program: String, source: String, options: Vec<String> },
    /// PTX text, JIT-compiled by the driver.
    Ptx(String),
    /// A cubin or fatbin image built offline.
    Cubin(Arc<[u8]>),
}

/// A kernel of your own: its code (CUDA C, PTX or a cubin/fatbin) and its `extern "C"` name,
/// compiled or loaded on first use per device and kept loaded for the life of the `Kernel` (and of
/// every op and graph that launched it).
///
/// Building one does no work; [`Kernel::function`] loads it. To launch it as a lazy op, vouch for
/// it once with [`Kernel::vouch`].
///
/// ```
/// use cuda_async::kernel::Kernel;
/// const SRC: &str = r#"extern "C" __global__ void twice(const float* x, float* y, unsigned long long n) {
///     unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
///     if (i < n) y[i] = 2.0f * x[i];
/// }"#;
/// let k = Kernel::from_cuda("twice.cu", SRC, "twice", &["--use_fast_math"]); // nothing compiled yet
/// assert_eq!(k.name(), "twice");
/// ```
#[derive(Clone)]
pub struct Kernel {
    inner: Arc<Inner>,
}

struct Inner {
    name: String,
    code: Code,
    loaded: Mutex<HashMap<usize, Function>>,
}

impl std::fmt::Debug for Kernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match &self.inner.code {
            Code::Cuda { program, .. } => format!("CUDA C {program}"),
            Code::Ptx(_) => "PTX".into(),
            Code::Cubin(image) => format!("cubin of {} bytes", image.len()),
        };
        write!(f, "Kernel({} from {kind})", self.inner.name)
    }
}

impl Kernel {
    fn new(name: &str, code: Code) -> Kernel {
        Kernel { inner: Arc::new(Inner { name: name.into(), code, loaded: Mutex::default() }) }
    }

    /// The kernel `name` of the CUDA C `source` (the program named `program` in NVRTC's messages),
    /// compiled for each device's architecture with `options` on first use, through `cuda-core`'s
    /// kernel cache (in memory, and on disk across runs: see [`cuda_core::nvrtc::KernelCache`]).
    /// Declare the kernel `extern "C"` so that its name is not mangled.
    pub fn from_cuda(program: &str, source: &str, name: &str, options: &[&str]) -> Kernel {
        let options = options.iter().map(|o| o.to_string()).collect();
        Kernel::new(name, Code::Cuda { program: program.into(), source: source.into(), options })
    }

    /// The kernel `name` (its `.entry` name) of the PTX text `ptx`, JIT-compiled by the driver on
    /// first use per device.
    pub fn from_ptx(ptx: &str, name: &str) -> Kernel {
        Kernel::new(name, Code::Ptx(ptx.into()))
    }

    /// The kernel `name` of a cubin or fatbin `image` built offline (e.g. `nvcc -cubin` or
    /// `-fatbin`, or [`cuda_core::nvrtc::compile_cubin`]), loaded on first use per device. An image
    /// for another architecture fails then, with the driver's error.
    pub fn from_cubin(image: &[u8], name: &str) -> Kernel {
        Kernel::new(name, Code::Cubin(image.into()))
    }

    /// The kernel's name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The kernel loaded on `device`: compiled or loaded on the first call per device, then the
    /// same [`Function`] (which keeps its module loaded).
    ///
    /// # Errors
    /// [`cuda_core::Error::NvrtcMissing`] or [`cuda_core::Error::Compile`] (with NVRTC's log) for
    /// CUDA C; [`cuda_core::Error::InvalidArgument`] for PTX with a NUL byte or an empty image;
    /// driver errors for code the device cannot load and for a name not in the module.
    pub fn function(&self, device: &Device) -> Result<Function> {
        let mut loaded = self.inner.loaded.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(f) = loaded.get(&device.ordinal()) {
            return Ok(f.clone());
        }
        let module = match &self.inner.code {
            Code::Cuda { program, source, options } => device.compile_module(program, source, options)?,
            Code::Ptx(ptx) => CudaModule::from_ptx(device, ptx)?,
            Code::Cubin(image) => CudaModule::from_cubin(device, image)?,
        };
        let f = module.function(&self.inner.name)?;
        loaded.insert(device.ordinal(), f.clone());
        Ok(f)
    }
}

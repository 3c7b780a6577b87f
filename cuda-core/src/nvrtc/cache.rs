//! A two-level cache of compiled kernels: in the process, and on disk.
//!
//! The key is a SHA-256 over the source, the options, the target architecture, the NVRTC version
//! and this crate's cache format version. Disk entries carry a header and a SHA-256 of their
//! payload; a truncated, corrupt or unreadable entry is ignored and recompiled (and rewritten),
//! never a crash. Writes go to a temporary file that is renamed into place, so concurrent
//! processes never see half-written entries.

use super::compile::{compile_cubin, nvrtc_version};
use crate::device::Device;
use crate::error::Result;
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

const MAGIC: &[u8; 8] = b"CUASYNC1";

/// Where a compiled image came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheOrigin {
    /// Compiled by NVRTC now.
    Compiled,
    /// Found in this process's memory cache.
    Memory,
    /// Read from the disk cache.
    Disk,
}

/// A compiled CUBIN image and where it came from.
#[derive(Debug, Clone)]
pub struct CompiledKernel {
    /// The CUBIN bytes.
    pub image: Arc<Vec<u8>>,
    /// Whether it was compiled, or found in memory or on disk.
    pub origin: CacheOrigin,
}

/// A kernel cache. [`KernelCache::global`] is the process-wide one; separate instances are useful
/// in tests or to pick another folder.
///
/// ```no_run
/// # fn main() -> cuda_core::Result<()> {
/// use cuda_core::nvrtc::{CacheOrigin, KernelCache};
/// use cuda_core::{CudaModule, Device};
/// let dev = Device::new(0)?;
/// let cache = KernelCache::memory_only();
/// let src = r#"extern "C" __global__ void k(int* x) { *x = 1; }"#;
/// let first = cache.compile(&dev, "k.cu", src, &[])?;
/// assert_eq!(first.origin, CacheOrigin::Compiled);
/// assert_eq!(cache.compile(&dev, "k.cu", src, &[])?.origin, CacheOrigin::Memory);
/// let k = CudaModule::from_cubin(&dev, &first.image)?.function("k")?;
/// # Ok(()) }
/// ```
pub struct KernelCache {
    dir: Option<PathBuf>,
    memory: Mutex<HashMap<[u8; 32], Arc<Vec<u8>>>>,
}

impl KernelCache {
    /// A cache keeping entries in `dir` (created on demand) and in memory.
    ///
    /// ```
    /// use cuda_core::nvrtc::KernelCache;
    /// let cache = KernelCache::with_dir(std::env::temp_dir().join("my-kernels"));
    /// assert!(cache.dir().is_some_and(|d| d.ends_with("my-kernels")));
    /// assert_eq!(KernelCache::memory_only().dir(), None);
    /// ```
    pub fn with_dir(dir: impl Into<PathBuf>) -> KernelCache {
        KernelCache { dir: Some(dir.into()), memory: Mutex::new(HashMap::new()) }
    }

    /// A cache that keeps entries in memory only.
    pub fn memory_only() -> KernelCache {
        KernelCache { dir: None, memory: Mutex::new(HashMap::new()) }
    }

    /// The default folder: `$CUDA_ASYNC_CACHE_DIR`, else `$XDG_CACHE_HOME/cuda-async/kernels`, else
    /// `$HOME/.cache/cuda-async/kernels`; `None` when none of these is set. Setting
    /// `CUDA_ASYNC_CACHE_DIR` to an empty string disables the disk cache.
    pub fn default_dir() -> Option<PathBuf> {
        if let Some(d) = std::env::var_os("CUDA_ASYNC_CACHE_DIR") {
            return (!d.is_empty()).then(|| PathBuf::from(d));
        }
        if let Some(d) = std::env::var_os("XDG_CACHE_HOME").filter(|d| !d.is_empty()) {
            return Some(PathBuf::from(d).join("cuda-async/kernels"));
        }
        std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/cuda-async/kernels"))
    }

    /// The process-wide cache, in [`KernelCache::default_dir`].
    pub fn global() -> &'static KernelCache {
        static G: OnceLock<KernelCache> = OnceLock::new();
        G.get_or_init(|| KernelCache { dir: Self::default_dir(), memory: Mutex::new(HashMap::new()) })
    }

    /// The disk folder, if any.
    pub fn dir(&self) -> Option<&Path> {
        self.dir.as_deref()
    }

    /// The file a key is stored in, if this cache has a folder.
    fn entry_path(&self, key: &[u8; 32]) -> Option<PathBuf> {
        let hex: String = key.iter().map(|b| format!("{b:02x}")).collect();
        self.dir.as_ref().map(|d| d.join(format!("{hex}.cubin")))
    }

    /// The disk file that holds (or would hold) this compilation, for inspection and tests.
    ///
    /// # Errors
    /// I/O errors creating the cache folder; driver errors reading the device's architecture.
    pub fn entry_file(&self, device: &Device, source: &str, options: &[String]) -> Result<Option<PathBuf>> {
        Ok(self.entry_path(&key(source, options, &device.sm_arch()?)?))
    }

    /// Compiles `source` for `device`'s architecture, or returns the cached image.
    pub fn compile(
        &self,
        device: &Device,
        program: &str,
        source: &str,
        options: &[String],
    ) -> Result<CompiledKernel> {
        let arch = device.sm_arch()?;
        let key = key(source, options, &arch)?;
        if let Some(img) = self.memory.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
            return Ok(CompiledKernel { image: img.clone(), origin: CacheOrigin::Memory });
        }
        let path = self.entry_path(&key);
        let (image, origin) = match path.as_deref().and_then(read_entry) {
            Some(img) => (Arc::new(img), CacheOrigin::Disk),
            None => {
                let img = Arc::new(compile_cubin(program, source, &arch, options)?);
                if let Some(p) = &path {
                    // A cache that cannot be written only costs a recompile next time.
                    let _ = write_entry(p, &img);
                }
                (img, CacheOrigin::Compiled)
            }
        };
        self.memory.lock().unwrap_or_else(|e| e.into_inner()).insert(key, image.clone());
        Ok(CompiledKernel { image, origin })
    }

    /// Drops the in-memory entries (the disk stays), so the next compile consults the disk.
    pub fn clear_memory(&self) {
        self.memory.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }
}

fn key(source: &str, options: &[String], arch: &str) -> Result<[u8; 32]> {
    let (major, minor) = nvrtc_version()?;
    let mut h = Sha256::new();
    h.update(MAGIC);
    h.update(format!("nvrtc {major}.{minor}\0arch {arch}\0").as_bytes());
    for o in options {
        h.update(o.as_bytes());
        h.update([0]);
    }
    h.update([1]);
    h.update(source.as_bytes());
    Ok(h.finalize().into())
}

fn read_entry(path: &Path) -> Option<Vec<u8>> {
    let data = std::fs::read(path).ok()?;
    let header = MAGIC.len() + 32;
    if data.len() <= header || &data[..MAGIC.len()] != MAGIC {
        return None;
    }
    let payload = &data[header..];
    let digest: [u8; 32] = Sha256::digest(payload).into();
    (digest[..] == data[MAGIC.len()..header]).then(|| payload.to_vec())
}

fn write_entry(path: &Path, image: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let tmp = dir.join(format!(".tmp-{}-{:?}", std::process::id(), std::thread::current().id()));
    let mut data = Vec::with_capacity(MAGIC.len() + 32 + image.len());
    data.extend_from_slice(MAGIC);
    data.extend_from_slice(&Sha256::digest(image));
    data.extend_from_slice(image);
    std::fs::write(&tmp, &data)?;
    std::fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_round_trip_and_corruption_is_rejected() {
        let dir = std::env::temp_dir().join(format!("cuda-core-cache-test-{}", std::process::id()));
        let p = dir.join("x.cubin");
        write_entry(&p, b"hello cubin").unwrap();
        assert_eq!(read_entry(&p).as_deref(), Some(&b"hello cubin"[..]));
        let mut data = std::fs::read(&p).unwrap();
        let last = data.len() - 1;
        data[last] ^= 0xff;
        std::fs::write(&p, &data).unwrap();
        assert_eq!(read_entry(&p), None, "flipped byte must be detected");
        std::fs::write(&p, &data[..10]).unwrap();
        assert_eq!(read_entry(&p), None, "truncated entry must be detected");
        std::fs::write(&p, b"").unwrap();
        assert_eq!(read_entry(&p), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

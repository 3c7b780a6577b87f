//! A two-level cache of compiled kernels: in the process, and on disk.
//!
//! The key is a SHA-256 over the source, the options, the target architecture, the NVRTC version
//! and this crate's cache format version. Disk entries carry a header and a SHA-256 of their
//! payload; a truncated, corrupt or unreadable entry is ignored and recompiled (and rewritten),
//! never a crash. Writes go to a temporary file that is renamed into place, so concurrent
//! processes never see half-written entries.
//!
//! # Trust boundary
//! An entry read from disk is loaded as a module and its kernels run on the GPU in this process.
//! So **whoever can write the cache folder can run code on the GPU in every process that uses
//! it**: the folder must be as trusted as the binary itself. The payload checksum guards against
//! truncation and corruption only, not against a malicious writer (who can write a matching
//! checksum). On Unix the cache therefore refuses, with a warning on stderr (once per cache), and
//! compiles instead of reading, a folder or an entry that is owned by another user or that is
//! group- or world-writable; it creates its folders `0700` and its entries `0600`. Only the folder
//! and its entries are checked, not the folders above it: keep the cache under a directory only
//! you can write (the default, `~/.cache`, is). Elsewhere no such check is made.

use super::compile::{compile_cubin, nvrtc_version};
use crate::device::Device;
use crate::error::Result;
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

/// An entry's first bytes; then SHA-256 of (the entry's file name, `\0`, the payload), then the
/// payload. Version 2 binds the digest to the file name (the key): a payload installed under
/// another key's name (two writers' temporary files colliding, e.g. containers that share a cache
/// folder) reads as a miss.
const MAGIC: &[u8; 8] = b"CUASYNC2";

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
/// Its folder must be as trusted as the binary: whoever can write it can run code on the GPU in
/// the processes that use it. On Unix the cache therefore refuses (with a warning on stderr, and
/// compiles instead) a folder or an entry that is owned by another user or is group- or
/// world-writable, and creates its folders `0700` and its entries `0600`; the folders above are not
/// checked, so keep it under a directory only you can write (the default, `~/.cache`, is).
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
    /// Whether an untrusted folder or entry was reported already.
    warned: AtomicBool,
}

impl KernelCache {
    /// A cache keeping entries in `dir` (created on demand, `0700` on Unix) and in memory. `dir`
    /// must be as trusted as the binary (see [`KernelCache`] for the checks made on Unix).
    ///
    /// ```
    /// use cuda_core::nvrtc::KernelCache;
    /// let cache = KernelCache::with_dir(std::env::temp_dir().join("my-kernels"));
    /// assert!(cache.dir().is_some_and(|d| d.ends_with("my-kernels")));
    /// assert_eq!(KernelCache::memory_only().dir(), None);
    /// ```
    pub fn with_dir(dir: impl Into<PathBuf>) -> KernelCache {
        KernelCache {
            dir: Some(dir.into()),
            memory: Mutex::new(HashMap::new()),
            warned: AtomicBool::new(false),
        }
    }

    /// A cache that keeps entries in memory only.
    pub fn memory_only() -> KernelCache {
        KernelCache { dir: None, memory: Mutex::new(HashMap::new()), warned: AtomicBool::new(false) }
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
        G.get_or_init(|| KernelCache {
            dir: Self::default_dir(),
            memory: Mutex::new(HashMap::new()),
            warned: AtomicBool::new(false),
        })
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
    pub fn entry_file(
        &self,
        device: &Device,
        program: &str,
        source: &str,
        options: &[String],
    ) -> Result<Option<PathBuf>> {
        Ok(self.entry_path(&key(program, source, options, &device.sm_arch()?)?))
    }

    /// Compiles `source` for `device`'s architecture, or returns the cached image.
    ///
    /// A compilation that may read headers from disk (an include path or pre-included file among
    /// `options`, or any mention of `include` in `source` other than a built-in `#include <...>`
    /// alone on its line) is never cached: the key covers only the text given here (the program
    /// name, source, options, architecture and NVRTC version).
    pub fn compile(
        &self,
        device: &Device,
        program: &str,
        source: &str,
        options: &[String],
    ) -> Result<CompiledKernel> {
        let arch = device.sm_arch()?;
        if reads_files(source, options) {
            // Not cached: the key covers the text given here, not headers read from disk.
            let image = Arc::new(compile_cubin(program, source, &arch, options)?);
            return Ok(CompiledKernel { image, origin: CacheOrigin::Compiled });
        }
        let key = key(program, source, options, &arch)?;
        if let Some(img) = self.memory.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
            return Ok(CompiledKernel { image: img.clone(), origin: CacheOrigin::Memory });
        }
        let path = self.entry_path(&key);
        let entry = path.as_deref().map_or(Entry::Miss, read_entry);
        let (image, origin) = match entry {
            Entry::Hit(img) => (Arc::new(img), CacheOrigin::Disk),
            Entry::Miss | Entry::Untrusted(_) => {
                let img = Arc::new(compile_cubin(program, source, &arch, options)?);
                match (&entry, &path) {
                    (Entry::Untrusted(why), _) if !self.warned.swap(true, Ordering::Relaxed) => {
                        eprintln!(
                            "cuda-core: warning: not using the kernel cache: {why}; compiling instead \
                             (whoever can write the cache can run code on the GPU in this process)"
                        );
                    }
                    (Entry::Untrusted(_), _) => {}
                    // A cache that cannot be written only costs a recompile next time.
                    (_, Some(p)) => drop(write_entry(p, &img)),
                    _ => {}
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

/// Whether compiling `source` with `options` may read files (headers) that the cache key cannot
/// cover: an include path or pre-included file among the options, or any mention of `include` in
/// the source other than an angle-bracket `#include <...>` alone on its line. Such compilations
/// are not cached, in memory or on disk. Found by review: a header changed on disk was ignored
/// (same key), and the old binary launched for a kernel whose arguments the caller had vouched for
/// against the new one. The rule is deliberately blunt: a second review read files from disk
/// through forms a directive parser would have to get exactly right — a computed `#include H`, a
/// comment or a line splice before or inside the directive, the `%:` digraph, `#include_next`,
/// `__has_include` — so any line that mentions `include` (a comment's word too) makes the
/// compilation uncached, which costs a compile, never a wrong binary. Angle-bracket includes
/// without an include path resolve to NVRTC's built-in headers, which the key's NVRTC version
/// covers (an absolute or `..` path in one is not allowed for that).
///
/// Options are judged as bluntly (a third review: NVRTC trims an option's leading white space, so
/// `" --pre-include=h.h"` read a file past a prefix check): any option that starts with `-I` once
/// trimmed, or mentions `include` or `pch` in any case, makes the compilation uncached. So does a
/// `??/` anywhere in the source (a trigraph line splice, honoured before C++17: `#inc??/` then
/// `lude "h.h"` read a file with `-std=c++14`).
///
/// A review of that found more: an option string may hold several options (`"-DX -I./d"`), an
/// option may name a file of options (`--options-file`, `-optf`, also passed on to ptxas), a
/// backslash followed by white space before the line's end splices lines in GNU and C++23 modes,
/// and `#embed` reads a file. So every white-space-separated word of every option is judged, and
/// a source with a lone carriage return, a backslash before trailing white space, or a
/// preprocessor-looking line that mentions `embed` is uncached too.
fn reads_files(source: &str, options: &[String]) -> bool {
    let reads = |word: &str| {
        let low = word.to_ascii_lowercase();
        let bare = low.trim_start_matches('-');
        bare.starts_with('i') || ["include", "pch", "optf", "options-file"].iter().any(|w| low.contains(w))
    };
    if options.iter().flat_map(|o| o.split_whitespace()).any(reads) || source.contains("??/") {
        return true;
    }
    let lone_cr = source.replace("\r\n", "").contains('\r');
    let white_splice = source.lines().any(|l| {
        let t = l.trim_end();
        t.len() < l.len() && t.ends_with('\\')
    });
    let embed = source
        .lines()
        .any(|l| l.contains("embed") && (l.contains('#') || l.contains("%:") || l.contains("??=")));
    if lone_cr || white_splice || embed {
        return true;
    }
    let spliced = source.replace("\\\r\n", "").replace("\\\n", "");
    let builtin = |l: &str| {
        let Some(r) = l.trim().strip_prefix('#').map(str::trim_start).and_then(|r| r.strip_prefix("include"))
        else {
            return false;
        };
        let r = r.trim();
        let Some(name) = r.strip_prefix('<').and_then(|r| r.strip_suffix('>')) else {
            return false;
        };
        !name.is_empty()
            && !name.starts_with('/')
            && !name.contains("..")
            && !name.contains(['<', '>', '"', '\\'])
            && !name.contains("include")
    };
    spliced.lines().any(|l| l.contains("include") && !builtin(l))
}

fn key(program: &str, source: &str, options: &[String], arch: &str) -> Result<[u8; 32]> {
    Ok(key_with(nvrtc_version()?, program, source, options, arch))
}

/// The cache key. The program name, every option and the source go in with their lengths first,
/// so that no two different inputs hash the same bytes (found by review: options joined with NUL
/// let `["-DA\0\x01s"]` with source `""` collide with `["-DA"]` with source `"s"`). The program
/// name is part of what NVRTC compiles (`__FILE__` expands to it; found by a second review: two
/// programs of one source but different names, each vouched for its own, shared one binary).
fn key_with(
    (major, minor): (i32, i32),
    program: &str,
    source: &str,
    options: &[String],
    arch: &str,
) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(MAGIC);
    h.update(format!("nvrtc {major}.{minor}\0arch {arch}\0").as_bytes());
    h.update((program.len() as u64).to_le_bytes());
    h.update(program.as_bytes());
    h.update((options.len() as u64).to_le_bytes());
    for o in options {
        h.update((o.len() as u64).to_le_bytes());
        h.update(o.as_bytes());
    }
    h.update((source.len() as u64).to_le_bytes());
    h.update(source.as_bytes());
    h.finalize().into()
}

/// What the disk holds for a key.
#[derive(Debug, PartialEq, Eq)]
enum Entry {
    /// A valid entry's payload.
    Hit(Vec<u8>),
    /// No entry, or a truncated, corrupt or unreadable one.
    Miss,
    /// The folder or the entry is not trusted (owner or permissions), for this reason.
    Untrusted(String),
}

/// Why a folder or file owned by `uid` with permission bits `mode` is not trusted by a process of
/// effective user `euid`, if it is not: another owner, or writable by group or others.
#[cfg_attr(not(unix), allow(dead_code))]
fn untrusted(path: &Path, uid: u32, mode: u32, euid: u32) -> Option<String> {
    if uid != euid {
        Some(format!("{} is owned by uid {uid}, not by this process's user (uid {euid})", path.display()))
    } else if mode & 0o022 != 0 {
        Some(format!("{} is group- or world-writable (mode {:o})", path.display(), mode & 0o7777))
    } else {
        None
    }
}

#[cfg(unix)]
fn check_trust(path: &Path, meta: &std::fs::Metadata) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    // SAFETY: geteuid has no preconditions and cannot fail.
    let euid = unsafe { libc::geteuid() };
    untrusted(path, meta.uid(), meta.mode(), euid)
}

#[cfg(not(unix))]
fn check_trust(_path: &Path, _meta: &std::fs::Metadata) -> Option<String> {
    None
}

fn read_entry(path: &Path) -> Entry {
    use std::io::Read;
    let dir = path.parent().unwrap_or(Path::new("."));
    let Ok(dir_meta) = std::fs::metadata(dir) else { return Entry::Miss };
    if let Some(why) = check_trust(dir, &dir_meta) {
        return Entry::Untrusted(why);
    }
    let Ok(mut file) = std::fs::File::open(path) else { return Entry::Miss };
    // Checked on the opened file, so the bytes read are those of the file checked.
    let Ok(meta) = file.metadata() else { return Entry::Miss };
    if let Some(why) = check_trust(path, &meta) {
        return Entry::Untrusted(why);
    }
    let mut data = Vec::new();
    if file.read_to_end(&mut data).is_err() {
        return Entry::Miss;
    }
    let header = MAGIC.len() + 32;
    if data.len() <= header || &data[..MAGIC.len()] != MAGIC {
        return Entry::Miss;
    }
    let payload = &data[header..];
    let digest = entry_digest(path, payload);
    if digest[..] == data[MAGIC.len()..header] {
        Entry::Hit(payload.to_vec())
    } else {
        Entry::Miss
    }
}

/// The digest stored in an entry: of its file name and its payload (see [`MAGIC`]).
fn entry_digest(path: &Path, payload: &[u8]) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(path.file_name().map(|n| n.as_encoded_bytes()).unwrap_or_default());
    h.update([0]);
    h.update(payload);
    h.finalize().into()
}

fn write_entry(path: &Path, image: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let dir = path.parent().unwrap_or(Path::new("."));
    let mut builder = std::fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
    builder.create(dir)?;
    // A name no other writer uses (process ids and thread ids repeat across containers sharing
    // the folder), created exclusively: a clash fails this write instead of sharing the file.
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let nanos =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    let unique = Sha256::digest(format!(
        "{}-{:?}-{nanos}-{}-{:p}",
        std::process::id(),
        std::thread::current().id(),
        N.fetch_add(1, Ordering::Relaxed),
        &N
    ));
    let tmp = dir.join(format!(".tmp-{:x}", u128::from_be_bytes(unique[..16].try_into().unwrap_or([0; 16]))));
    let mut data = Vec::with_capacity(MAGIC.len() + 32 + image.len());
    data.extend_from_slice(MAGIC);
    data.extend_from_slice(&entry_digest(path, image));
    data.extend_from_slice(image);
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let written = options.open(&tmp).and_then(|mut f| f.write_all(&data));
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    std::fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("cuda-core-cache-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    #[test]
    fn keys_of_different_inputs_differ() {
        let o = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let k = |src: &str, opts: &[&str]| key_with((13, 0), "k.cu", src, &o(opts), "sm_90");
        assert_ne!(k("", &["-DA\0\x01s"]), k("s", &["-DA"]), "a NUL inside an option");
        assert_ne!(k("", &["-DA", "-DB"]), k("", &["-DA\0-DB"]));
        assert_ne!(k("x", &[]), k("x", &[""]));
        assert_eq!(k("x", &["-DA"]), k("x", &["-DA"]));
        assert_ne!(
            key_with((13, 0), "k.cu", "x", &[], "sm_90"),
            key_with((13, 1), "k.cu", "x", &[], "sm_90")
        );
        // The program name: `__FILE__` expands to it, so one source under two names is two binaries.
        assert_ne!(
            key_with((13, 0), "a.cu", "x", &[], "sm_90"),
            key_with((13, 0), "b.cu", "x", &[], "sm_90")
        );
        assert_ne!(
            key_with((13, 0), "a.cu", "x", &[], "sm_90"),
            key_with((13, 0), "a.c", "ux", &[], "sm_90")
        );
    }

    #[test]
    fn compilations_that_read_headers_from_disk_are_not_cached() {
        let o = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert!(reads_files("", &o(&["-I/inc"])));
        assert!(reads_files("", &o(&["--include-path=/inc"])));
        assert!(reads_files("", &o(&["--pre-include=a.h"])));
        // The third review's forms: leading white space, a separate `-include` pair, an include
        // path that overrides a built-in header, a trigraph splice, a precompiled header.
        assert!(reads_files("", &o(&[" --pre-include=h.h"])));
        assert!(reads_files("", &o(&["\t-include=h.h"])));
        assert!(reads_files("", &o(&[" -include", "h.h"])));
        assert!(reads_files("#include <cuda_fp16.h>\n", &o(&[" -I./d"])));
        assert!(reads_files("", &o(&["--pch"])));
        assert!(reads_files("#inc??/\nlude \"h.h\"\n", &o(&["-std=c++14"])));
        // ... and the review of that: several options in one string, files of options, splices
        // with white space or a lone carriage return, `#embed`.
        assert!(reads_files("", &o(&["-DX -I./d"])));
        assert!(reads_files("", &o(&["--I./d"])));
        assert!(reads_files("", &o(&["--options-file=o.txt"])));
        assert!(reads_files("", &o(&["-Xptxas", "-optf=o.txt"])));
        assert!(reads_files("#inc\\ \nlude \"h.h\"\n", &[]));
        assert!(reads_files("#inc\\\rlude \"h.h\"\n", &[]));
        assert!(reads_files("const char d[] = {\n#embed \"d.bin\"\n};\n", &[]));
        // Our own programs stay cached: -std=c++17, a built-in include, words like `embedding`.
        assert!(!reads_files(
            "#include <cuda_bf16.h>\n// the embedding gather\nint x;\n",
            &o(&["-std=c++17"])
        ));
        assert!(reads_files("#include \"shape.h\"\n", &[]));
        assert!(reads_files("  #  include   \"shape.h\"\n", &[]));
        assert!(!reads_files("#include <cuda_fp16.h>\n", &o(&["-DN=4", "--use_fast_math"])));
        assert!(!reads_files("  #  include <cuda/std/cstdint>  \nint x;\n", &[]));
        // Forms found by the second review to read a file with NVRTC 13, none of which a quoted-
        // include check saw: any mention of `include` outside a built-in angle include is uncached.
        for src in [
            "#define H \"shape.h\"\n#include H\n",
            "/**/ #include \"shape.h\"\n",
            "#inc\\\nlude \"shape.h\"\n",
            "%:include \"shape.h\"\n",
            "#include_next \"shape.h\"\n",
            "#if __has_include(\"shape.h\")\n#endif\n",
            "#include </etc/shape.h>\n",
            "#include <../shape.h>\n",
            "#include <cuda_fp16.h> // and \"x.h\"\n",
            "// see #include \"x.h\" in the docs\n",
        ] {
            assert!(reads_files(src, &[]), "{src:?}");
        }
    }

    #[test]
    fn entries_round_trip_and_corruption_is_rejected() {
        let dir = temp("corrupt");
        let p = dir.join("x.cubin");
        write_entry(&p, b"hello cubin").unwrap();
        assert_eq!(read_entry(&p), Entry::Hit(b"hello cubin".to_vec()));
        let mut data = std::fs::read(&p).unwrap();
        let last = data.len() - 1;
        data[last] ^= 0xff;
        std::fs::write(&p, &data).unwrap();
        assert_eq!(read_entry(&p), Entry::Miss, "flipped byte must be detected");
        std::fs::write(&p, &data[..10]).unwrap();
        assert_eq!(read_entry(&p), Entry::Miss, "truncated entry must be detected");
        std::fs::write(&p, b"").unwrap();
        assert_eq!(read_entry(&p), Entry::Miss);
        assert_eq!(read_entry(&dir.join("absent.cubin")), Entry::Miss);
        assert_eq!(read_entry(&dir.join("no-such-dir/absent.cubin")), Entry::Miss);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Found by review: the digest covered the payload only, so a payload installed under
    /// another key's name (two writers' temporary files colliding) read back as a hit: another
    /// source's kernels launched under this one's signatures.
    #[test]
    fn an_entry_under_another_keys_name_is_a_miss() {
        let dir = temp("rename");
        let (a, b) = (dir.join("aaaa.cubin"), dir.join("bbbb.cubin"));
        write_entry(&a, b"image of a").unwrap();
        write_entry(&b, b"image of b").unwrap();
        assert_eq!(read_entry(&a), Entry::Hit(b"image of a".to_vec()));
        std::fs::rename(&a, &b).unwrap();
        assert_eq!(read_entry(&b), Entry::Miss, "a's entry under b's name must not be a hit");
        let left: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().starts_with(".tmp-"))
            .collect();
        assert!(left.is_empty(), "temporary files left behind: {left:?}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn trust_rule_refuses_other_owners_and_shared_write() {
        let p = Path::new("/c/x.cubin");
        assert_eq!(untrusted(p, 1000, 0o100600, 1000), None);
        assert_eq!(untrusted(p, 1000, 0o40700, 1000), None);
        assert_eq!(untrusted(p, 1000, 0o40755, 1000), None, "readable by others is fine");
        let other = untrusted(p, 0, 0o40700, 1000).unwrap();
        assert!(other.contains("owned by uid 0") && other.contains("1000"), "{other}");
        assert!(untrusted(p, 1000, 0o40700, 0).is_some(), "root does not trust a user's folder");
        for mode in [0o40770, 0o40707, 0o40777, 0o100620, 0o100602, 0o41777] {
            let why = untrusted(p, 1000, mode, 1000).unwrap_or_else(|| panic!("{mode:o}"));
            assert!(why.contains("writable"), "{why}");
        }
    }

    #[cfg(unix)]
    #[test]
    fn untrusted_folders_and_entries_are_not_read() {
        use std::os::unix::fs::PermissionsExt;
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        let set = |p: &Path, m: u32| std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap();
        let dir = temp("trust");
        let p = dir.join("x.cubin");
        write_entry(&p, b"cubin").unwrap();
        // Created private, whatever the umask.
        assert_eq!(mode(&dir), 0o700);
        assert_eq!(mode(&p), 0o600);
        assert_eq!(read_entry(&p), Entry::Hit(b"cubin".to_vec()));
        for m in [0o770, 0o777, 0o1777, 0o720] {
            set(&dir, m);
            assert!(matches!(read_entry(&p), Entry::Untrusted(ref w) if w.contains("writable")), "dir {m:o}");
        }
        set(&dir, 0o755);
        assert_eq!(read_entry(&p), Entry::Hit(b"cubin".to_vec()));
        for m in [0o620, 0o602, 0o666] {
            set(&p, m);
            assert!(matches!(read_entry(&p), Entry::Untrusted(_)), "file {m:o}");
        }
        set(&p, 0o644);
        assert_eq!(read_entry(&p), Entry::Hit(b"cubin".to_vec()));
        // A rewrite of an entry gives it private permissions again.
        write_entry(&p, b"cubin 2").unwrap();
        assert_eq!(mode(&p), 0o600);
        assert_eq!(read_entry(&p), Entry::Hit(b"cubin 2".to_vec()));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

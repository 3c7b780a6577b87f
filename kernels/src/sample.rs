//! Sampling the next token of each row from `f32` logits on the GPU (`cuda/sample.cu`), with
//! per-row temperature, top-k, top-p and a seed, after a greedy argmax has filled the output:
//! greedy rows (temperature `<= 0`) keep the argmax's token, sampled rows are overwritten. The
//! launcher allocates nothing, so it can be recorded into a CUDA graph (the decode step of
//! `models::llama` does).
//!
//! How a sampled row is drawn (see `cuda/sample.cu` for the details):
//! - weights `exp((l - max) / T)` over the non-NaN logits; NaN logits are never chosen, `-inf`
//!   logits weigh 0 (also at `T = +inf`, where every finite logit weighs 1). If the
//!   largest logit is `+inf`, the pick is uniform among the `+inf` logits. A row with no
//!   non-NaN logit, or whose largest logit is `-inf`, keeps the argmax's answer.
//! - top-k keeps the `k` largest logits, **and every logit equal to the k-th largest**; top-p then
//!   keeps the smallest set of largest logits whose mass reaches `top_p` of the top-k mass, **and
//!   every logit equal to the smallest one it needs**. Both thresholds are found without sorting,
//!   by bisection over the order-preserving integer image of the float (`-0.0` is read as
//!   `+0.0`).
//! - `u` in `[0, 1)` depends only on `(seed, counter)` ([`uniform`] computes it on the host);
//!   the token is the first kept index whose running mass exceeds `u` times the kept mass. Every
//!   sum is taken in an order fixed by the vocabulary size alone, so a row's token does not
//!   depend on the other rows, their number or the launch.
//!
//! ```no_run
//! use cuda_core::{Device, DeviceBuffer};
//! use kernels::sample::{SampleParams, Sampler};
//! # fn main() -> cuda_core::Result<()> {
//! let s = Device::new(0)?.new_stream()?;
//! let logits = DeviceBuffer::from_host(&s, &[0.0f32, 1.0, 2.0, 0.5])?;
//! let params = DeviceBuffer::from_host(
//!     &s,
//!     &[SampleParams { temperature: 0.8, top_p: 0.9, top_k: 0, counter: 0, seed: 42 }],
//! )?;
//! let mut next = DeviceBuffer::from_host(&s, &[2u32])?; // the argmax
//! Sampler::get(s.device())?.sample(&s, &logits, &params, &mut next, 1, 4)?;
//! assert!(next.to_vec()?[0] < 4);
//! # Ok(()) }
//! ```

use crate::checks::{at_most, dim, len_check, mul, same_device};
use cuda_core::{Device, DeviceBuffer, DeviceRepr, Function, LaunchConfig, PerDevice, Result, Stream};

/// CUDA C source of the sampling kernel.
pub const SAMPLE_SRC: &str = include_str!("../cuda/sample.cu");

/// Threads per block of the sampling kernel (`SAMPLE_THREADS`): one block samples one row.
pub const SAMPLE_THREADS: u32 = 1024;
/// The largest vocabulary [`Sampler::sample`] takes (`u32::MAX - 1`): token ids fit a `u32` and
/// `u32::MAX` stays free (the argmax's answer for an all-NaN row).
pub const SAMPLE_MAX_VOCAB: usize = u32::MAX as usize - 1;
/// The most rows one [`Sampler::sample`] launch takes (the kernel's `unsigned rows`); the grid is
/// capped at [`SAMPLE_MAX_BLOCKS`] and the kernel loops over further rows.
pub const SAMPLE_MAX_ROWS: usize = u32::MAX as usize;
/// The most blocks of one launch.
pub const SAMPLE_MAX_BLOCKS: usize = 65_535;

/// The sampling parameters of one row, laid out as the kernel's `SampleParams` (24 bytes).
///
/// `temperature <= 0` (or NaN) means greedy: the row keeps the argmax. `top_k == 0` means no
/// top-k; `top_p >= 1` (or NaN) means no top-p. The draw depends only on `seed` and `counter`.
/// Stage these with a host copy (e.g. a pinned buffer): [`DeviceBuffer::fill`] refuses 24-byte
/// elements.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct SampleParams {
    /// Softmax temperature; `<= 0` is greedy.
    pub temperature: f32,
    /// Nucleus mass in `(0, 1]`; `>= 1` keeps everything.
    pub top_p: f32,
    /// Keep the `top_k` largest logits (ties with the last included); `0` keeps everything.
    pub top_k: u32,
    /// Which draw of the seed's stream this is (the model uses the row's position).
    pub counter: u32,
    /// The random stream's seed.
    pub seed: u64,
}

impl SampleParams {
    /// A greedy row: temperature 0, `top_p` 1, everything else 0 (an all-zero value, as a zeroed
    /// buffer holds, is greedy too).
    pub const GREEDY: SampleParams =
        SampleParams { temperature: 0.0, top_p: 1.0, top_k: 0, counter: 0, seed: 0 };
}

// SAFETY: `#[repr(C)]` of two f32, two u32 and a u64 in that order: 24 bytes with no padding
// (offsets 0, 4, 8, 12, 16; alignment 8), no pointers, and every bit pattern is a valid value.
unsafe impl DeviceRepr for SampleParams {}

fn splitmix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// The kernel's `u` in `[0, 1)` for `(seed, counter)`: 53 bits of
/// `splitmix64(splitmix64(seed) + counter)`. The same on the host as on the device.
///
/// ```
/// let u = kernels::sample::uniform(42, 7);
/// assert!((0.0..1.0).contains(&u));
/// assert_eq!(u, kernels::sample::uniform(42, 7));
/// ```
pub fn uniform(seed: u64, counter: u32) -> f64 {
    let h = splitmix64(splitmix64(seed).wrapping_add(u64::from(counter)));
    (h >> 11) as f64 * (1.0 / 9_007_199_254_740_992.0)
}

/// The sampling kernel, loaded on one device.
pub struct Sampler {
    device: Device,
    f: Function,
}

impl Sampler {
    /// The kernel on `device`, compiled (or read from the cache) and loaded on first use.
    ///
    /// # Errors
    /// NVRTC and module-loading errors ([`cuda_core::Error::NvrtcMissing`] without `libnvrtc`).
    pub fn get(device: &Device) -> Result<&'static Sampler> {
        static LOADED: PerDevice<Sampler> = PerDevice::new();
        LOADED.get_or_try_init(device, || {
            let p = crate::programs::sample();
            let m = device.compile_module(p.name, &p.source, &p.options)?;
            Ok(Sampler { device: *device, f: m.function("sample_rows_f32")? })
        })
    }

    /// Samples `next[r]` for every row `r < rows` whose `params[r].temperature > 0` from
    /// `logits[r][0..vocab]` (see the module docs); other rows keep `next[r]` as it is. Allocates
    /// nothing and queues one launch (nothing for `rows == 0` or `vocab == 0`).
    ///
    /// # Errors
    /// [`cuda_core::Error::InvalidArgument`] for `vocab >` [`SAMPLE_MAX_VOCAB`] or `rows >`
    /// [`SAMPLE_MAX_ROWS`] (checked first, with overflow-checked `rows * vocab`);
    /// [`cuda_core::Error::LengthMismatch`] unless `logits` holds `rows * vocab`, `params` and
    /// `next` `rows` elements; [`cuda_core::Error::DeviceMismatch`] for a stream or buffer of
    /// another device; driver errors.
    pub fn sample(
        &self,
        stream: &Stream,
        logits: &DeviceBuffer<f32>,
        params: &DeviceBuffer<SampleParams>,
        next: &mut DeviceBuffer<u32>,
        rows: usize,
        vocab: usize,
    ) -> Result<()> {
        const DURING: &str = "sample kernel";
        same_device(&self.device, stream, DURING, &[logits.device(), params.device(), next.device()])?;
        at_most(DURING, "vocab", vocab, SAMPLE_MAX_VOCAB)?;
        at_most(DURING, "rows", rows, SAMPLE_MAX_ROWS)?;
        len_check("sample kernel: logits must hold rows * vocab", mul(rows, vocab)?, logits.len())?;
        len_check("sample kernel: params must hold rows", rows, params.len())?;
        len_check("sample kernel: next must hold rows", rows, next.len())?;
        if rows == 0 || vocab == 0 {
            return Ok(());
        }
        let cfg = LaunchConfig {
            grid: (dim(rows.min(SAMPLE_MAX_BLOCKS), "sample kernel blocks")?, 1, 1),
            block: (SAMPLE_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let rows32 = dim(rows, "sample kernel rows")?;
        // SAFETY: matches `sample_rows_f32(const float* logits, const SampleParams* params,
        // unsigned* next, unsigned rows, unsigned long long vocab)`; `SampleParams` has the
        // kernel's layout (24 bytes, `#[repr(C)]`). Block b handles rows b, b + grid, ... < rows
        // (64-bit row index and offsets): it reads params[r] and logits[r * vocab .. (r + 1) *
        // vocab] and writes only next[r], all within the lengths checked above; `next` is borrowed
        // mutably, so it aliases neither input. The block size is the kernel's SAMPLE_THREADS,
        // which its reductions assume, and its shared memory is static (about 9 KiB).
        unsafe { self.f.launch(stream, cfg, (logits, params, &mut *next, rows32, vocab as u64)) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{align_of, offset_of, size_of};

    #[test]
    fn params_have_the_kernels_layout() {
        assert_eq!(size_of::<SampleParams>(), 24);
        assert_eq!(align_of::<SampleParams>(), 8);
        assert_eq!(offset_of!(SampleParams, temperature), 0);
        assert_eq!(offset_of!(SampleParams, top_p), 4);
        assert_eq!(offset_of!(SampleParams, top_k), 8);
        assert_eq!(offset_of!(SampleParams, counter), 12);
        assert_eq!(offset_of!(SampleParams, seed), 16);
        const { assert!(SampleParams::GREEDY.temperature <= 0.0) };
    }

    #[test]
    fn uniform_is_in_range_and_depends_on_seed_and_counter() {
        let draws: Vec<f64> = (0..1000).map(|c| uniform(7, c)).collect();
        assert!(draws.iter().all(|u| (0.0..1.0).contains(u)));
        let mean = draws.iter().sum::<f64>() / draws.len() as f64;
        assert!((mean - 0.5).abs() < 0.05, "mean {mean}");
        assert_ne!(uniform(7, 3), uniform(8, 3));
        assert_ne!(uniform(7, 3), uniform(7, 4));
        // splitmix64's published first output for state 0 (the increment added first).
        assert_eq!(splitmix64(0), 0xE220_A839_7B1D_CDAF);
    }

    #[test]
    fn the_kernel_source_matches_the_constants() {
        assert!(SAMPLE_SRC.contains(&format!("#define SAMPLE_THREADS {SAMPLE_THREADS}")));
        assert!(SAMPLE_SRC.contains("0x9E3779B97F4A7C15ull"));
        assert!(SAMPLE_SRC.contains("0xBF58476D1CE4E5B9ull"));
        assert!(SAMPLE_SRC.contains("0x94D049BB133111EBull"));
    }
}

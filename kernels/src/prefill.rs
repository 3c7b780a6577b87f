//! The chunked-prefill kernels (`cuda/prefill.cu`), launched through [`LlamaKernels`]: the rotary
//! key + KV-cache append of every row of a chunk ([`LlamaKernels::rope_append`], ahead of
//! [`LlamaKernels::attention_cached`]) and the gather of the rows whose logits are wanted
//! ([`LlamaKernels::gather_rows`]). Same conventions as [`crate::llama`]: 64-bit offsets,
//! [`INACTIVE`](crate::llama::INACTIVE) rows, device-side indices checked in the kernel, every length checked here.
//!
//! ```no_run
//! use cuda_core::{Device, DeviceBuffer};
//! use half::bf16;
//! use kernels::llama::{LlamaKernels, INACTIVE};
//! # fn main() -> cuda_core::Result<()> {
//! let s = Device::new(0)?.new_stream()?;
//! let k = LlamaKernels::get(s.device())?;
//! let h = DeviceBuffer::from_host(&s, &[bf16::ONE, bf16::ONE, bf16::ZERO, bf16::ZERO])?; // 2 rows of 2
//! let idx = DeviceBuffer::from_host(&s, &[1u32, 0, INACTIVE])?;
//! let mut out = DeviceBuffer::<bf16>::zeros(&s, 6)?;
//! k.gather_rows(&s, &h, &idx, &mut out, 2)?;
//! assert_eq!(out.to_vec()?[..2], [bf16::ZERO, bf16::ZERO]);
//! # Ok(()) }
//! ```

use crate::checks::{len_check, mul};
use crate::llama::{embed_config, AttnBuffers, AttnShape, LlamaKernels};
use cuda_core::{DeviceBuffer, LaunchConfig, Result, Stream};
use half::bf16;

/// Threads per [`LlamaKernels::rope_append`] block (over one head's dimensions).
const APPEND_THREADS: u32 = 64;
/// The most blocks in each grid dimension of a [`LlamaKernels::rope_append`] launch; the kernel
/// loops (64-bit) over further rows and heads.
const APPEND_MAX_BLOCKS: usize = 65_535;

/// The launch configuration of [`LlamaKernels::rope_append`]: block (key/value head, row),
/// `min(kv_heads, 65535)` x `min(rows, 65535)` blocks (at least 1 each) of 64 threads.
pub fn rope_append_config(rows: usize, kv_heads: usize) -> LaunchConfig {
    let x = kv_heads.clamp(1, APPEND_MAX_BLOCKS) as u32;
    let y = rows.clamp(1, APPEND_MAX_BLOCKS) as u32;
    LaunchConfig { grid: (x, y, 1), block: (APPEND_THREADS, 1, 1), shared_mem_bytes: 0 }
}

impl LlamaKernels {
    /// For every row `r < rows` (`rows = io.slots.len()`): rotates the row's new key by
    /// `positions[r]` exactly as [`LlamaKernels::rope_attention`] does (cos/sin and the result
    /// rounded to bf16) and writes key and value to the caches at `(slots[r], positions[r])`.
    /// The buffers are `io`'s ([`AttnBuffers`]): `qkv[r]` holds `[q | k | v]`, the caches are
    /// `[slots][kv_heads][max_seq][head_dim]`, `inv_freq[head_dim / 2]`; `shape.batch` is not
    /// used (the rows are `slots.len()`, any number). Rows of slot [`INACTIVE`](crate::llama::INACTIVE), and rows whose slot or position is out of range,
    /// write nothing. Queued ahead of [`LlamaKernels::attention_cached`] over the same rows.
    ///
    /// # Errors
    /// An invalid shape ([`AttnShape::validate`] with `batch` ignored); `positions` not `rows`,
    /// `qkv` not `rows * (heads + 2 kv_heads) * head_dim`, a cache not
    /// [`AttnShape::cache_len`], `inv_freq` not `head_dim / 2`; devices; driver errors.
    ///
    /// # Safety
    /// The `(slots[r], positions[r])` pairs of the rows that write (active, in range) must be
    /// distinct whenever the kernel runs (also at every replay of a graph it is captured into):
    /// two rows writing the same cache entry from different blocks are a data race. Device
    /// memory cannot be checked from here; `models::llama` checks the values on the host.
    pub unsafe fn rope_append(
        &self,
        s: &Stream,
        io: AttnBuffers<'_, &mut DeviceBuffer<bf16>>,
        shape: AttnShape,
    ) -> Result<()> {
        const DURING: &str = "rope append";
        let AttnBuffers { qkv, k_cache, v_cache, slots, positions, inv_freq } = io;
        let devices = [
            qkv.device(),
            k_cache.device(),
            v_cache.device(),
            slots.device(),
            positions.device(),
            inv_freq.device(),
        ];
        self.same_device(s, DURING, &devices)?;
        let rows = slots.len();
        // `batch` is not this launch's row count (which may exceed MAX_BATCH: the kernel loops).
        AttnShape { batch: 1, ..shape }.validate()?;
        len_check("rope append: positions must hold rows", rows, positions.len())?;
        len_check(
            "rope append: qkv must hold rows * (heads + 2 kv_heads) * head_dim",
            mul(rows, shape.qkv_row())?,
            qkv.len(),
        )?;
        len_check(
            "rope append: k_cache must hold slots * kv_heads * max_seq * head_dim",
            shape.cache_len(),
            k_cache.len(),
        )?;
        len_check(
            "rope append: v_cache must hold slots * kv_heads * max_seq * head_dim",
            shape.cache_len(),
            v_cache.len(),
        )?;
        len_check(
            "rope append: inv_freq must hold head_dim / 2",
            shape.head_dim as usize / 2,
            inv_freq.len(),
        )?;
        if rows == 0 {
            return Ok(());
        }
        let cfg = rope_append_config(rows, shape.kv_heads as usize);
        // SAFETY: matches `rope_append_bf16(const bf16_t* qkv, bf16_t* k_cache, bf16_t* v_cache,
        // const unsigned* slots, const unsigned* positions, const float* inv_freq, unsigned long
        // long rows, AttnShape)`; reads qkv[0..rows * qkv_row], slots/positions[0..rows],
        // inv_freq[0..head_dim/2] (lengths checked, the shape validated: no offset overflows);
        // writes cache entries only for slot < slots and pos < max_seq (checked in the kernel),
        // with 64-bit offsets and grid-stride loops (any grid is correct). The caller guarantees
        // distinct (slot, position) pairs, so no two blocks write one entry; both caches are
        // exclusive here.
        unsafe {
            self.rope_append.launch(
                s,
                cfg,
                (qkv, k_cache, v_cache, slots, positions, inv_freq, rows as u64, shape),
            )
        }
    }

    /// `out[i] = h[idx[i]]` for `i < idx.len()` (rows of `cols` bf16 values: `h[rows][cols]`,
    /// `out[idx.len()][cols]`); an index [`INACTIVE`](crate::llama::INACTIVE) gives a zero row, any other index `>= rows`
    /// a NaN row. Takes the rows whose logits are wanted before the final norm and LM head.
    ///
    /// # Errors
    /// `cols == 0`, `h` not a multiple of `cols`, `out` not `idx.len() * cols`; devices; driver
    /// errors.
    pub fn gather_rows(
        &self,
        s: &Stream,
        h: &DeviceBuffer<bf16>,
        idx: &DeviceBuffer<u32>,
        out: &mut DeviceBuffer<bf16>,
        cols: usize,
    ) -> Result<()> {
        self.same_device(s, "row gather", &[h.device(), idx.device(), out.device()])?;
        if cols == 0 || !h.len().is_multiple_of(cols) {
            return Err(cuda_core::Error::InvalidArgument(format!(
                "row gather: {} values are not rows of {cols}",
                h.len()
            )));
        }
        let n = idx.len();
        len_check("row gather: out must hold idx.len() * cols", mul(n, cols)?, out.len())?;
        if n == 0 {
            return Ok(());
        }
        let rows = h.len() / cols;
        let cfg = embed_config(n, cols);
        // SAFETY: matches `gather_rows_bf16(const bf16_t* h, const unsigned* idx, bf16_t* out,
        // unsigned long long n, unsigned long long rows, unsigned long long cols)`; reads
        // idx[0..n] and rows idx[i] < rows of h (checked in the kernel; rows * cols = h.len()),
        // writes out[0..n * cols] (checked); 64-bit grid-stride loops; `out` is exclusive.
        unsafe { self.gather_rows.launch(s, cfg, (h, idx, out, n as u64, rows as u64, cols as u64)) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rope_append_config_caps_the_grid() {
        assert_eq!(rope_append_config(100_000, 8).grid, (8, 65_535, 1));
        assert_eq!(rope_append_config(0, 0).grid, (1, 1, 1));
        assert_eq!(rope_append_config(3, 1 << 40).grid, (65_535, 3, 1));
        assert_eq!(rope_append_config(3, 2).block, (64, 1, 1));
    }
}

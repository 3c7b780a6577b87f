//! The kernels of a Llama-style decoder in bf16 (`cuda/llama.cu`): embedding gather, RMSNorm,
//! rotary embedding fused with the KV-cache append and grouped-query attention, SwiGLU, greedy
//! argmax, and a device-side normal initialiser. The matrix products are cuBLAS's
//! ([`cuda_core::blas`]).
//!
//! Each launcher checks the stream's and the buffers' devices and every buffer length against the
//! shape it is given before launching anything. Indices that live in device memory (token ids,
//! cache slots, positions) cannot be checked on the host: the kernels check them against the
//! shape and give the row NaN outputs instead of touching memory out of bounds.
//!
//! ```no_run
//! use cuda_core::{Device, DeviceBuffer};
//! use half::bf16;
//! use kernels::llama::{LlamaKernels, RmsNorm};
//! # fn main() -> cuda_core::Result<()> {
//! let s = Device::new(0)?.new_stream()?;
//! let k = LlamaKernels::get(s.device())?;
//! let x = DeviceBuffer::from_host(&s, &[bf16::from_f32(3.0); 8])?;
//! let w = DeviceBuffer::from_host(&s, &[bf16::ONE; 8])?;
//! let mut y = DeviceBuffer::<bf16>::zeros(&s, 8)?;
//! k.rmsnorm(&s, &x, RmsNorm { weight: &w, eps: 1e-5 }, &mut y, 1, 8)?; // each element / rms(x) = 1
//! assert!(y.to_vec()?.iter().all(|v| (v.to_f32() - 1.0).abs() < 1e-2));
//! # Ok(()) }
//! ```

use crate::checks::{at_most, dim, grid_stride, len_check, mul, same_device, MAX_GRID_X, MAX_GRID_Y};
use cuda_core::{
    Device, DeviceBuffer, DeviceRepr, Error, Function, KernelParam, LaunchConfig, PerDevice, Result, Stream,
};
use half::bf16;

/// CUDA C source of the decoder kernels (compiled after [`BF16_SRC`]).
pub const LLAMA_SRC: &str = include_str!("../cuda/llama.cu");
/// CUDA C source of the bf16 helpers the decoder kernels share (`cuda/bf16.cuh`).
pub const BF16_SRC: &str = include_str!("../cuda/bf16.cuh");
/// CUDA C source of the chunked-prefill kernels (`cuda/prefill.cu`, compiled after
/// [`LLAMA_SRC`] in the same module; launchers in [`crate::prefill`]).
pub const PREFILL_SRC: &str = include_str!("../cuda/prefill.cu");

/// The largest head dimension the attention kernel supports (`MAX_HD` in `cuda/llama.cu`).
pub const MAX_HEAD_DIM: usize = 128;
/// The largest number of query heads per key/value head (`MAX_GROUP`).
pub const MAX_GROUP: usize = 8;
/// The slot value of an inactive (padding) row in [`LlamaKernels::rope_attention`].
pub const INACTIVE: u32 = u32::MAX;
/// The largest hidden size [`LlamaKernels::rmsnorm`] supports (256 threads x 8 x `NORM_VEC`).
pub const MAX_NORM_HIDDEN: usize = 8192;
/// Blocks per row of the first argmax stage (`ARGMAX_SPLIT`).
pub const ARGMAX_SPLIT: usize = 64;
/// Warps per attention block (`ATTN_WARPS`).
const ATTN_WARPS: u32 = 4;
/// Warps per block of the wide decode attention (`rope_attention_g4_hd64_w8_bf16`): one round of
/// 256 positions, so that a context of up to 256 positions needs no split (and no cross-block
/// combine). It runs where the shape fits (at most 4 query heads per key/value head, `head_dim` <=
/// 64: the Llama 3.2 models) and the rows alone do not fill the GPU (the launch splits rows:
/// fewer than two blocks per multiprocessor), unless the environment variable
/// `CUDA_ASYNC_ATTN_WARPS` is `4` when the kernels load (to measure it against the four-warp
/// kernel). Measured on the H100 (`bench-decode`, Llama-3.2-1B shape, context 128–192): 16 rows
/// 1.575 → 1.539 ms a step, 1 row 1.270 → 1.255 ms; at 64 rows, where the launch does not split,
/// it was slower (2.007 → 2.153 ms: idle warps holding block slots), so it does not run there.
pub const ATTN_WIDE_WARPS: u32 = 8;
/// Blocks per (row, key/value head) of the split attention (`ATTN_SPLITS`).
pub const ATTN_SPLITS: usize = 16;
/// The fewest positions one split of the attention takes by default: a row of `len` positions
/// uses `min(grid splits, ceil(len / ATTN_SPLIT_MIN))` of its blocks (one round of the block's
/// four warps, 32 positions each; twice as many, one round of its eight, for the wide kernel
/// [`ATTN_WIDE_WARPS`]), so a short context pays no cross-block combine. The
/// environment variable `CUDA_ASYNC_ATTN_SPLIT_MIN` (a positive integer, read when the kernels
/// load on a device) overrides it, to measure the policy (`bench-decode` records it); `1` gives
/// the policy of earlier builds (every block of the grid takes a slice).
pub const ATTN_SPLIT_MIN: u32 = 128;
/// The tiled cached attention ([`LlamaKernels::attention_cached`] where the shape fits): rows per
/// block (`PT_ROWS` in `cuda/prefill.cu`), threads per block, and the shapes it is compiled for.
const TILED_ROWS: u32 = 8;
const TILED_THREADS: u32 = 128;
const TILED_MAX_GROUP: u32 = 4;
const TILED_HEAD_DIM: u32 = 64;
/// The most rows one [`LlamaKernels::rope_attention`] or [`LlamaKernels::argmax`] launch takes
/// (one grid row per batch row: `gridDim.y <= 65535`).
pub const MAX_BATCH: usize = 65_535;
/// The largest [`AttnShape::max_seq`] (`2^31 - 1`): the attention kernel's 32-bit position
/// arithmetic (`pos + 1 + ATTN_SPLITS`, the position loop's next index) cannot wrap below it.
pub const MAX_SEQ: usize = i32::MAX as usize;
/// The largest [`AttnShape::kv_heads`] (`2^31 - 1`, the largest `gridDim.x`).
pub const MAX_KV_HEADS: usize = MAX_GRID_X;
/// The largest vocabulary [`LlamaKernels::argmax`] takes (`2^31 - 1`): its 32-bit index
/// arithmetic cannot wrap below it, and index `u32::MAX` stays free for "all NaN".
pub const MAX_VOCAB: usize = i32::MAX as usize;
/// The most blocks an embedding, RMSNorm, SwiGLU or initialiser launch uses in one grid dimension;
/// the kernels loop (in 64 bits) over further rows and elements.
const MAX_ROW_BLOCKS: u32 = 65_535;

/// The shape of one attention launch ([`LlamaKernels::rope_attention`]); laid out as the kernel's
/// `AttnShape`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttnShape {
    /// Rows (sequences) of the batch.
    pub batch: u32,
    /// Query heads.
    pub heads: u32,
    /// Key/value heads (`heads` is a multiple of it, at most [`MAX_GROUP`] times).
    pub kv_heads: u32,
    /// Dimensions per head: a multiple of 32, at most [`MAX_HEAD_DIM`].
    pub head_dim: u32,
    /// Cache slots (sequences) per layer.
    pub slots: u32,
    /// Positions per slot.
    pub max_seq: u32,
    /// The score scale, `1 / sqrt(head_dim)`.
    pub scale: f32,
}

// SAFETY: `#[repr(C)]`, six `u32` and one `f32`: no padding, no pointers, every bit pattern valid.
unsafe impl DeviceRepr for AttnShape {}

impl AttnShape {
    /// Checks the shape: `heads` a positive multiple of `kv_heads`, at most [`MAX_GROUP`] per group;
    /// `head_dim` a positive multiple of 32 up to [`MAX_HEAD_DIM`]; `slots` and `max_seq`
    /// positive; `batch <=` [`MAX_BATCH`], `kv_heads <=` [`MAX_KV_HEADS`], `max_seq <=`
    /// [`MAX_SEQ`]; and the element counts of every buffer ([`AttnShape::cache_len`],
    /// [`AttnShape::partial_len`], ...) within `usize`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] naming what is out of range (and the limit).
    pub fn validate(&self) -> Result<()> {
        const DURING: &str = "rope attention";
        at_most(DURING, "batch", self.batch as usize, MAX_BATCH)?;
        at_most(DURING, "kv_heads", self.kv_heads as usize, MAX_KV_HEADS)?;
        at_most(DURING, "max_seq", self.max_seq as usize, MAX_SEQ)?;
        let group = (self.heads / self.kv_heads.max(1)) as usize;
        let counts = [
            [self.batch as usize, self.qkv_row(), 1, 1, 1],
            [self.batch as usize, self.heads as usize, self.head_dim as usize, 1, 1],
            [self.batch as usize, self.kv_heads as usize, ATTN_SPLITS, group, self.head_dim as usize + 2],
            [self.slots as usize, self.kv_heads as usize, self.max_seq as usize, self.head_dim as usize, 1],
        ];
        for c in counts {
            if c.iter().try_fold(1usize, |a, &b| a.checked_mul(b)).is_none() {
                return Err(Error::InvalidArgument(format!(
                    "attention shape {self:?}: {} elements overflow usize",
                    c.map(|v| v.to_string()).join(" * ")
                )));
            }
        }
        let ok = self.heads > 0
            && self.kv_heads > 0
            && self.heads.is_multiple_of(self.kv_heads)
            && (self.heads / self.kv_heads) as usize <= MAX_GROUP
            && self.head_dim > 0
            && self.head_dim.is_multiple_of(32)
            && self.head_dim as usize <= MAX_HEAD_DIM
            && self.slots > 0
            && self.max_seq > 0;
        if ok {
            return Ok(());
        }
        Err(Error::InvalidArgument(format!(
            "attention shape {self:?}: heads must be a positive multiple of kv_heads (at most {MAX_GROUP} per group), head_dim a multiple of 32 up to {MAX_HEAD_DIM}, slots and max_seq positive"
        )))
    }

    /// Elements of `qkv` per row: `(heads + 2 * kv_heads) * head_dim`, saturating at `usize::MAX`
    /// (three `u32` values can overflow it; [`AttnShape::validate`] refuses such a shape).
    pub fn qkv_row(&self) -> usize {
        (self.heads as usize)
            .saturating_add((self.kv_heads as usize).saturating_mul(2))
            .saturating_mul(self.head_dim as usize)
    }

    /// Elements of the attention's `partial` scratch:
    /// `batch * kv_heads * ATTN_SPLITS * group * (head_dim + 2)`, saturating at `usize::MAX`
    /// (no buffer is that long, and [`AttnShape::validate`] refuses such a shape).
    pub fn partial_len(&self) -> usize {
        let group = (self.heads / self.kv_heads.max(1)) as usize;
        [self.kv_heads as usize, ATTN_SPLITS, group, self.head_dim as usize + 2]
            .into_iter()
            .fold(self.batch as usize, usize::saturating_mul)
    }

    /// Elements of the attention's `counters` scratch: `batch * kv_heads` (cannot overflow).
    pub fn counters_len(&self) -> usize {
        self.batch as usize * self.kv_heads as usize
    }

    /// Elements of one layer's key (or value) cache: `slots * kv_heads * max_seq * head_dim`,
    /// saturating at `usize::MAX` (no buffer is that long, and [`AttnShape::validate`] refuses
    /// such a shape).
    pub fn cache_len(&self) -> usize {
        [self.kv_heads as usize, self.max_seq as usize, self.head_dim as usize]
            .into_iter()
            .fold(self.slots as usize, usize::saturating_mul)
    }
}

/// An RMSNorm's parameters (Hugging Face's `LlamaRMSNorm`): its learned per-feature weight and
/// the epsilon added to the mean square. Taken by [`LlamaKernels::rmsnorm`] and by the fused
/// products of [`crate::gemv`].
#[derive(Clone, Copy)]
pub struct RmsNorm<'a> {
    /// The per-feature weight, `hidden` bf16 values (the width of the normalised rows; each
    /// launcher checks the length against its shape).
    pub weight: &'a DeviceBuffer<bf16>,
    /// Added to the mean of the squares before the reciprocal square root (the model's
    /// `rms_norm_eps`); not checked.
    pub eps: f32,
}

/// The rows and the key/value caches of one attention launch ([`LlamaKernels::rope_attention`],
/// [`LlamaKernels::attention_cached`], [`LlamaKernels::rope_append`]). `C` is how the caches are
/// borrowed: `&mut DeviceBuffer<bf16>` where the launch appends to them, `&DeviceBuffer<bf16>`
/// where it only reads them. `rows` below is the launch's row count: [`AttnShape::batch`] for the
/// attention launches, `slots.len()` for [`LlamaKernels::rope_append`]. Every length is checked
/// against the launch's [`AttnShape`] and row count before anything is launched; the values in
/// `slots` and `positions` live in device memory and are checked by the kernels.
pub struct AttnBuffers<'a, C> {
    /// Each row's projected `[q | k | v]`: `rows * (heads + 2 * kv_heads) * head_dim` bf16
    /// values ([`AttnShape::qkv_row`] per row).
    pub qkv: &'a DeviceBuffer<bf16>,
    /// One layer's key cache, `[slots][kv_heads][max_seq][head_dim]` ([`AttnShape::cache_len`]
    /// values).
    pub k_cache: C,
    /// One layer's value cache, laid out as `k_cache`.
    pub v_cache: C,
    /// Each row's cache slot (`rows` values): below [`AttnShape::slots`], or [`INACTIVE`] for a
    /// padding row.
    pub slots: &'a DeviceBuffer<u32>,
    /// Each row's position in its slot (`rows` values): below [`AttnShape::max_seq`].
    pub positions: &'a DeviceBuffer<u32>,
    /// The rotary inverse frequencies, `head_dim / 2` values.
    pub inv_freq: &'a DeviceBuffer<f32>,
}

/// The split-K workspace of one attention launch ([`LlamaKernels::rope_attention`],
/// [`LlamaKernels::attention_cached`]); lengths checked against the launch's [`AttnShape`].
pub struct AttnScratch<'a> {
    /// The blocks' partial results, [`AttnShape::partial_len`] values.
    pub partial: &'a mut DeviceBuffer<f32>,
    /// One counter per (row, key/value head), [`AttnShape::counters_len`] values: zero before the
    /// first launch that uses them (as `DeviceBuffer::zeros` gives); every launch leaves them
    /// zero again.
    pub counters: &'a mut DeviceBuffer<u32>,
}

/// The decoder kernels, loaded on one device.
pub struct LlamaKernels {
    pub(crate) device: Device,
    pub(crate) max_blocks: u32,
    sms: u32,
    /// Positions per attention split at least, when `CUDA_ASYNC_ATTN_SPLIT_MIN` sets it (else
    /// one round of the kernel's warps).
    split_min: Option<u32>,
    /// Whether the decode attention uses the wide kernel where the shape fits.
    wide: bool,
    embed: Function,
    rmsnorm: Function,
    silu_mul: Function,
    attention: Function,
    /// The same kernel compiled for `group <= 4`, `head_dim <= 64` (half the registers).
    attention_small: Function,
    /// The same with eight warps a block ([`ATTN_WIDE_WARPS`]).
    attention_wide: Function,
    /// The attention over keys and values already in the cache (`APPENDED`), both builds.
    attention_cached: Function,
    attention_cached_small: Function,
    /// The tiled cached attention of a chunk (group <= 4, head_dim 64).
    attention_tiled: Function,
    pub(crate) rope_append: Function,
    pub(crate) gather_rows: Function,
    argmax_partial: Function,
    argmax_final: Function,
    randn: Function,
}

impl LlamaKernels {
    /// The kernels on `device`, compiled (or read from the cache) and loaded on first use.
    ///
    /// # Errors
    /// NVRTC and module-loading errors ([`Error::NvrtcMissing`] without `libnvrtc`).
    pub fn get(device: &Device) -> Result<&'static LlamaKernels> {
        static LOADED: PerDevice<LlamaKernels> = PerDevice::new();
        LOADED.get_or_try_init(device, || {
            let p = crate::programs::llama();
            let m = device.compile_module(p.name, &p.source, &p.options)?;
            Ok(LlamaKernels {
                device: *device,
                max_blocks: device.multiprocessor_count()?.saturating_mul(8).max(1),
                sms: device.multiprocessor_count()?.max(1),
                split_min: attention_split_min(),
                wide: std::env::var("CUDA_ASYNC_ATTN_WARPS").map_or(true, |v| v.trim() != "4"),
                embed: m.function("embed_bf16")?,
                rmsnorm: m.function("rmsnorm_bf16")?,
                silu_mul: m.function("silu_mul_bf16")?,
                attention: m.function("rope_attention_bf16")?,
                attention_small: m.function("rope_attention_g4_hd64_bf16")?,
                attention_wide: m.function("rope_attention_g4_hd64_w8_bf16")?,
                attention_cached: m.function("attention_cached_bf16")?,
                attention_cached_small: m.function("attention_cached_g4_hd64_bf16")?,
                attention_tiled: m.function("attention_tiled_g4_hd64_bf16")?,
                rope_append: m.function("rope_append_bf16")?,
                gather_rows: m.function("gather_rows_bf16")?,
                argmax_partial: m.function("argmax_partial_f32")?,
                argmax_final: m.function("argmax_final")?,
                randn: m.function("randn_bf16")?,
            })
        })
    }

    /// The fewest positions per split of the decode attention ([`LlamaKernels::rope_attention`])
    /// in a launch that splits rows, for the Llama 3.2 shapes: one round of the kernel's warps
    /// ([`ATTN_SPLIT_MIN`], twice that with the wide kernel), or the value of
    /// `CUDA_ASYNC_ATTN_SPLIT_MIN` when the kernels loaded. (Other shapes, and the cached
    /// attention, use four warps and [`ATTN_SPLIT_MIN`] unless the variable is set.)
    ///
    /// ```no_run
    /// # fn main() -> cuda_core::Result<()> {
    /// let dev = cuda_core::Device::new(0)?;
    /// assert!(kernels::llama::LlamaKernels::get(&dev)?.attention_split_min() >= 1);
    /// # Ok(()) }
    /// ```
    pub fn attention_split_min(&self) -> u32 {
        self.split_min.unwrap_or(if self.wide { 32 * ATTN_WIDE_WARPS } else { ATTN_SPLIT_MIN })
    }

    /// Warps per block of the decode attention for the Llama 3.2 shapes where a launch splits
    /// rows: [`ATTN_WIDE_WARPS`], or 4 when `CUDA_ASYNC_ATTN_WARPS` was `4` as the kernels loaded
    /// (launches that do not split use four warps).
    ///
    /// ```no_run
    /// # fn main() -> cuda_core::Result<()> {
    /// let dev = cuda_core::Device::new(0)?;
    /// assert!([4, 8].contains(&kernels::llama::LlamaKernels::get(&dev)?.attention_warps()));
    /// # Ok(()) }
    /// ```
    pub fn attention_warps(&self) -> u32 {
        if self.wide {
            ATTN_WIDE_WARPS
        } else {
            ATTN_WARPS
        }
    }

    pub(crate) fn same_device(
        &self,
        stream: &Stream,
        during: &'static str,
        devices: &[&Device],
    ) -> Result<()> {
        same_device(&self.device, stream, during, devices)
    }

    /// `h[b] = table[tokens[b]]` for `b < batch` (`table[vocab][hidden]`, `h[batch][hidden]`); a
    /// token id `>= vocab` gives a NaN row. No size limit: the kernel indexes and strides in 64
    /// bits over a capped grid ([`embed_config`]).
    ///
    /// # Errors
    /// Lengths that do not fit (`tokens = batch`, `h = batch * hidden`, `table` a multiple of
    /// `hidden`), devices that differ, driver errors.
    pub fn embed(
        &self,
        s: &Stream,
        tokens: &DeviceBuffer<u32>,
        table: &DeviceBuffer<bf16>,
        h: &mut DeviceBuffer<bf16>,
        hidden: usize,
    ) -> Result<()> {
        const DURING: &str = "embedding gather";
        self.same_device(s, DURING, &[tokens.device(), table.device(), h.device()])?;
        let batch = tokens.len();
        len_check("embedding gather: h must hold batch * hidden", mul(batch, hidden)?, h.len())?;
        if hidden == 0 || !table.len().is_multiple_of(hidden) {
            return Err(Error::InvalidArgument(format!(
                "embedding table of {} values is not [vocab][{hidden}]",
                table.len()
            )));
        }
        let vocab = table.len() / hidden;
        if batch == 0 {
            return Ok(());
        }
        let cfg = embed_config(batch, hidden);
        // SAFETY: matches `embed_bf16(const unsigned*, const bf16_t*, bf16_t*, unsigned long long
        // batch, unsigned long long hidden, unsigned long long vocab)`; reads tokens[0..batch],
        // table rows < vocab (checked in the kernel), writes h[0..batch*hidden] (lengths checked
        // above; batch * hidden does not overflow); all indices and strides are 64-bit, so any
        // grid is correct; `h` is exclusive.
        unsafe { self.embed.launch(s, cfg, (tokens, table, h, batch as u64, hidden as u64, vocab as u64)) }
    }

    /// `out[r] = w * x[r] / rms(x[r])` for `r < rows` (Hugging Face's `LlamaRMSNorm`, bf16
    /// rounding as there), with `w` = `norm.weight` and `norm.eps` added to the mean square;
    /// `x[rows][hidden]`, `out[rows][hidden]`. Any number of rows (one block per row over a
    /// capped grid, [`rmsnorm_config`]); `hidden` a multiple of 8 up to [`MAX_NORM_HIDDEN`].
    ///
    /// # Errors
    /// `x` and `out` not `rows * hidden`, `w` not `hidden`; `hidden` not a multiple of 8 or above
    /// [`MAX_NORM_HIDDEN`]; devices that differ; driver errors.
    pub fn rmsnorm(
        &self,
        s: &Stream,
        x: &DeviceBuffer<bf16>,
        norm: RmsNorm<'_>,
        out: &mut DeviceBuffer<bf16>,
        rows: usize,
        hidden: usize,
    ) -> Result<()> {
        let RmsNorm { weight: w, eps } = norm;
        self.same_device(s, "RMSNorm", &[x.device(), w.device(), out.device()])?;
        let n = mul(rows, hidden)?;
        len_check("RMSNorm: x must hold rows * hidden", n, x.len())?;
        len_check("RMSNorm: out must hold rows * hidden", n, out.len())?;
        len_check("RMSNorm: w must hold hidden", hidden, w.len())?;
        if n == 0 {
            return Ok(());
        }
        if !hidden.is_multiple_of(8) || hidden > MAX_NORM_HIDDEN {
            return Err(Error::InvalidArgument(format!(
                "RMSNorm: hidden {hidden} must be a multiple of 8 up to {MAX_NORM_HIDDEN}"
            )));
        }
        let cfg = rmsnorm_config(rows);
        // SAFETY: matches `rmsnorm_bf16(const bf16_t* x, const bf16_t* w, bf16_t* out, unsigned
        // long long rows, unsigned hidden, float eps)`; block-uniform 64-bit loop over rows (any
        // grid is correct); reads x[0..rows*hidden], w[0..hidden], writes
        // out[0..rows*hidden] (checked) in 16-byte vectors: hidden % 8 == 0 keeps every row
        // 16-byte aligned (allocations are 256-byte aligned), and hidden <= 256 threads * 8 *
        // NORM_VEC is what one block covers; `out` is exclusive.
        unsafe { self.rmsnorm.launch(s, cfg, (x, w, out, rows as u64, dim(hidden, "hidden")?, eps)) }
    }

    /// `out[r][i] = silu(gu[r][i]) * gu[r][inter + i]` (SwiGLU over the stacked gate and up
    /// projections). No size limit: 64-bit indices over a capped grid.
    ///
    /// # Errors
    /// `gu` not `rows * 2 * inter` or `out` not `rows * inter`; devices; driver errors.
    pub fn silu_mul(
        &self,
        s: &Stream,
        gu: &DeviceBuffer<bf16>,
        out: &mut DeviceBuffer<bf16>,
        rows: usize,
        inter: usize,
    ) -> Result<()> {
        self.same_device(s, "SwiGLU", &[gu.device(), out.device()])?;
        let n = mul(rows, inter)?;
        len_check("SwiGLU: gu must hold rows * 2 * inter", mul(n, 2)?, gu.len())?;
        len_check("SwiGLU: out must hold rows * inter", n, out.len())?;
        if n == 0 {
            return Ok(());
        }
        let cfg = grid_stride(n, 256, self.max_blocks);
        // SAFETY: matches `silu_mul_bf16(const bf16_t* gu, bf16_t* out, unsigned long long rows,
        // unsigned long long inter)`; 64-bit grid-stride loop (any grid is correct); reads
        // gu[0..2*rows*inter], writes out[0..rows*inter] (checked, no overflow); exclusive out.
        unsafe { self.silu_mul.launch(s, cfg, (gu, out, rows as u64, inter as u64)) }
    }

    /// Rotary embedding + KV-cache append + grouped-query attention for one layer: for each row
    /// `b < shape.batch`, rotates its new key and queries by position `positions[b]`, writes key
    /// and value to the caches at `(slots[b], positions[b])`, and attends over positions
    /// `0..=positions[b]` of that slot, writing `out[b][heads * head_dim]`. The buffers are
    /// `io`'s ([`AttnBuffers`]): `qkv[b]` holds `[q | k | v]`, the caches are
    /// `[slots][kv_heads][max_seq][head_dim]`, `inv_freq[head_dim / 2]`. Slot [`INACTIVE`] marks
    /// a padding row (zero output, no cache access); any other slot or position out of range
    /// gives the row NaN outputs and touches no cache memory. `scratch` is the split-K workspace
    /// ([`AttnScratch`]: `partial` of [`AttnShape::partial_len`] and `counters` of
    /// [`AttnShape::counters_len`], zeroed before the first launch: every launch leaves the
    /// counters zero again).
    ///
    /// # Errors
    /// An invalid shape ([`AttnShape::validate`], which also refuses `batch >` [`MAX_BATCH`],
    /// `kv_heads >` [`MAX_KV_HEADS`] and `max_seq >` [`MAX_SEQ`]), lengths that do not fit it,
    /// devices that differ, driver errors.
    ///
    /// # Safety
    /// `scratch.counters` must hold zeros before the first launch that uses it (as
    /// `DeviceBuffer::zeros` gives; each launch restores them). The entries of `slots` other than
    /// [`INACTIVE`] (`io.slots`) must be distinct whenever the kernel runs
    /// (also at every replay of a graph it is captured into): two rows with one slot would write
    /// and read the same cache rows from different blocks, a data race. Device memory cannot be
    /// checked from here; callers that fill `slots` themselves (as `models::llama` does) check
    /// it on the host.
    pub unsafe fn rope_attention(
        &self,
        s: &Stream,
        io: AttnBuffers<'_, &mut DeviceBuffer<bf16>>,
        out: &mut DeviceBuffer<bf16>,
        scratch: AttnScratch<'_>,
        shape: AttnShape,
    ) -> Result<()> {
        // SAFETY: the caller upholds this function's contract, which is the helper's for
        // `appended == false`.
        unsafe { self.attention_launch(s, io, out, scratch, shape, false) }
    }

    /// The attention of [`LlamaKernels::rope_attention`] for rows whose key and value are already
    /// in the cache at `(slots[b], positions[b])` (appended by [`LlamaKernels::rope_append`] in an
    /// earlier launch): the queries are rotated here as there, nothing is appended, and position
    /// `positions[b]` is read from the cache like the positions before it. The caches are only
    /// read, so rows of one slot at consecutive positions may share a launch (a chunk of a
    /// prompt): each reads positions up to its own, all written before the launch. Same buffers,
    /// [`AttnShape`], [`INACTIVE`] rows (zeros) and out-of-range guards (NaN rows) as
    /// [`LlamaKernels::rope_attention`]. Where the shape allows (at most 4 query heads per
    /// key/value head, `head_dim` 64: the Llama 3.2 models) a tiled kernel runs instead of the
    /// per-row one: a block takes 8 rows of the chunk and reads each 64-position tile of keys and
    /// values once for all of them (`scratch` is then unused); a row's result does not depend on
    /// the rows that share its block. Other shapes use the per-row kernel with its splitting policy.
    ///
    /// # Errors
    /// As for [`LlamaKernels::rope_attention`].
    ///
    /// # Safety
    /// `scratch.counters` must hold zeros before the first launch that uses it (as
    /// `DeviceBuffer::zeros` gives; each launch restores them). Slots may repeat.
    pub unsafe fn attention_cached(
        &self,
        s: &Stream,
        io: AttnBuffers<'_, &DeviceBuffer<bf16>>,
        out: &mut DeviceBuffer<bf16>,
        scratch: AttnScratch<'_>,
        shape: AttnShape,
    ) -> Result<()> {
        // SAFETY: the caller upholds the counters' contract; with `appended` the kernel never
        // writes the caches (they are passed as shared references), so repeated slots share
        // only reads.
        unsafe { self.attention_launch(s, io, out, scratch, shape, true) }
    }

    /// The launch of [`LlamaKernels::rope_attention`] (`appended == false`) or
    /// [`LlamaKernels::attention_cached`] (`appended == true`).
    ///
    /// # Safety
    /// The counters are zero before the first launch; without `appended`, the active slots are
    /// distinct whenever the kernel runs.
    unsafe fn attention_launch<K>(
        &self,
        s: &Stream,
        io: AttnBuffers<'_, K>,
        out: &mut DeviceBuffer<bf16>,
        scratch: AttnScratch<'_>,
        shape: AttnShape,
        appended: bool,
    ) -> Result<()>
    where
        K: std::ops::Deref<Target = DeviceBuffer<bf16>> + KernelParam,
    {
        let AttnBuffers { qkv, k_cache, v_cache, slots, positions, inv_freq } = io;
        let AttnScratch { partial, counters } = scratch;
        let devices = [
            qkv.device(),
            k_cache.device(),
            v_cache.device(),
            slots.device(),
            positions.device(),
            inv_freq.device(),
            out.device(),
            partial.device(),
            counters.device(),
        ];
        self.same_device(s, "rope attention", &devices)?;
        shape.validate()?;
        let batch = shape.batch as usize;
        len_check(
            "rope attention: qkv must hold batch * (heads + 2 kv_heads) * head_dim",
            mul(batch, shape.qkv_row())?,
            qkv.len(),
        )?;
        len_check(
            "rope attention: k_cache must hold slots * kv_heads * max_seq * head_dim",
            shape.cache_len(),
            k_cache.len(),
        )?;
        len_check(
            "rope attention: v_cache must hold slots * kv_heads * max_seq * head_dim",
            shape.cache_len(),
            v_cache.len(),
        )?;
        len_check("rope attention: slots must hold batch", batch, slots.len())?;
        len_check("rope attention: positions must hold batch", batch, positions.len())?;
        len_check(
            "rope attention: inv_freq must hold head_dim / 2",
            shape.head_dim as usize / 2,
            inv_freq.len(),
        )?;
        len_check(
            "rope attention: out must hold batch * heads * head_dim",
            mul(batch, shape.heads as usize * shape.head_dim as usize)?,
            out.len(),
        )?;
        len_check(
            "rope attention: partial must hold AttnShape::partial_len",
            shape.partial_len(),
            partial.len(),
        )?;
        len_check(
            "rope attention: counters must hold batch * kv_heads",
            shape.counters_len(),
            counters.len(),
        )?;
        if batch == 0 {
            return Ok(());
        }
        if appended && shape.heads / shape.kv_heads <= TILED_MAX_GROUP && shape.head_dim == TILED_HEAD_DIM {
            let cfg = LaunchConfig {
                grid: (shape.kv_heads, shape.batch.div_ceil(TILED_ROWS), 1),
                block: (TILED_THREADS, 1, 1),
                shared_mem_bytes: 0,
            };
            // SAFETY: the kernel matches `attention_tiled_g4_hd64_bf16(const bf16_t* qkv, const
            // bf16_t* k_cache, const bf16_t* v_cache, const unsigned* slots, const unsigned*
            // positions, const float* inv_freq, bf16_t* out, AttnShape)`; every length was checked
            // against `shape` above and the kernel checks slots[b] < slots and positions[b] <
            // max_seq before touching the caches, which it only reads (`appended`: they are shared
            // references). Each block writes only the outputs of its own rows and key/value head.
            // Overlapped launch: every block runs PDL_WAIT() before touching memory.
            return unsafe {
                self.attention_tiled.launch_overlapped(
                    s,
                    cfg,
                    (qkv, k_cache, v_cache, slots, positions, inv_freq, out, shape),
                )
            };
        }
        // Splits per (row, head): enough blocks for about two per multiprocessor, at most
        // ATTN_SPLITS (1 when the rows alone fill the GPU: no partials, no combining). Each row
        // uses only those of them that get split_min positions or more (the kernel decides from
        // its position, which only the device knows at a graph's replay).
        let blocks = shape.kv_heads as usize * batch;
        let splits = (2 * self.sms as usize).div_ceil(blocks).clamp(1, ATTN_SPLITS) as u32;
        // The kernel compiled for the Llama 3.2 group and head size, where the shape fits it.
        let small = shape.heads / shape.kv_heads <= 4 && shape.head_dim <= 64;
        let (f, warps) = match (appended, small) {
            (false, true) if self.wide && splits > 1 => (&self.attention_wide, ATTN_WIDE_WARPS),
            (false, true) => (&self.attention_small, ATTN_WARPS),
            (false, false) => (&self.attention, ATTN_WARPS),
            (true, true) => (&self.attention_cached_small, ATTN_WARPS),
            (true, false) => (&self.attention_cached, ATTN_WARPS),
        };
        let split_min = self.split_min.unwrap_or(32 * warps);
        let cfg = LaunchConfig {
            grid: (shape.kv_heads, shape.batch, splits),
            block: (warps * 32, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: every one of these kernels matches `rope_attention_bf16(const bf16_t* qkv, bf16_t* k_cache, bf16_t*
        // v_cache, const unsigned* slots, const unsigned* positions, const float* inv_freq,
        // bf16_t* out, float* partial, unsigned* counters, AttnShape, unsigned split_min)` (any
        // split_min is valid: the kernel takes 0 as 1), launched with `warps * 32` threads, the W
        // it was compiled for (its `m_s`/`l_s` and position loop assume blockDim.x == W * 32); every length was checked
        // against `shape` above, and the kernel checks slots[b] < slots and positions[b] < max_seq
        // before touching the caches. Blocks of one (row, head) share only their own slice of
        // `partial` and counter (fenced, combined by the last block, which resets the counter to
        // the zero it started from; `counters` is zeroed by the caller before the first launch and
        // exclusive here). Without `appended` the caller guarantees distinct slots (no two rows
        // share cache rows) and within a row only split 0 writes position pos, which no block
        // reads from the cache; with `appended` (the cached kernels) no block writes the caches.
        // Overlapped launch: every block runs PDL_WAIT() before touching memory.
        unsafe {
            f.launch_overlapped(
                s,
                cfg,
                (qkv, k_cache, v_cache, slots, positions, inv_freq, out, partial, counters, shape, split_min),
            )
        }
    }

    /// `out[r] = argmax(logits[r])` for `r < rows` (`logits[rows][vocab]`; the first index on
    /// ties, `-0.0` and `+0.0` being equal; NaNs never win; a row of NaNs gives `u32::MAX`). Two launches: [`ARGMAX_SPLIT`] blocks per row write
    /// their best pair into `scratch[rows][ARGMAX_SPLIT]`, then one block per row picks.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for `rows >` [`MAX_BATCH`] or `vocab >` [`MAX_VOCAB`] (checked
    /// first); `out` not `rows`, `logits` not `rows * vocab`, `scratch` not `rows * ARGMAX_SPLIT`;
    /// devices; driver errors.
    pub fn argmax(
        &self,
        s: &Stream,
        logits: &DeviceBuffer<f32>,
        scratch: &mut DeviceBuffer<u64>,
        out: &mut DeviceBuffer<u32>,
        vocab: usize,
    ) -> Result<()> {
        self.same_device(s, "argmax", &[logits.device(), scratch.device(), out.device()])?;
        let rows = out.len();
        at_most("argmax", "rows", rows, MAX_BATCH)?;
        at_most("argmax", "vocab", vocab, MAX_VOCAB)?;
        len_check("argmax: logits must hold rows * vocab", mul(rows, vocab)?, logits.len())?;
        len_check("argmax: scratch must hold rows * ARGMAX_SPLIT", mul(rows, ARGMAX_SPLIT)?, scratch.len())?;
        if rows == 0 {
            return Ok(());
        }
        let r32 = dim(rows, "rows")?;
        let cfg =
            LaunchConfig { grid: (ARGMAX_SPLIT as u32, r32, 1), block: (256, 1, 1), shared_mem_bytes: 0 };
        // SAFETY: matches `argmax_partial_f32(const float* logits, unsigned long long* partial,
        // unsigned rows, unsigned vocab)`; block (x, r) reads its slice of logits[r] (r < rows,
        // lengths checked) and writes partial[r * ARGMAX_SPLIT + x]; `scratch` is exclusive.
        // rows <= MAX_BATCH fits gridDim.y; vocab <= MAX_VOCAB keeps the kernel's 32-bit slice
        // bounds and loop index from wrapping.
        unsafe { self.argmax_partial.launch(s, cfg, (logits, &mut *scratch, r32, dim(vocab, "vocab")?))? };
        let cfg = LaunchConfig { grid: (r32, 1, 1), block: (ARGMAX_SPLIT as u32, 1, 1), shared_mem_bytes: 0 };
        // SAFETY: matches `argmax_final(const unsigned long long* partial, unsigned* out, unsigned
        // rows)`; reads partial[0..rows*ARGMAX_SPLIT], writes out[0..rows]; `out` is exclusive.
        unsafe { self.argmax_final.launch(s, cfg, (&*scratch, out, r32)) }
    }

    /// Fills `w` with `bf16(mean + std * z)`, `z` standard normal from a counter-based hash of
    /// `(seed, index)`: deterministic, fast for billions of weights.
    ///
    /// # Errors
    /// A buffer of another device; driver errors.
    pub fn randn(
        &self,
        s: &Stream,
        w: &mut DeviceBuffer<bf16>,
        seed: u64,
        mean: f32,
        std: f32,
    ) -> Result<()> {
        self.same_device(s, "randn", &[w.device()])?;
        let n = w.len();
        if n == 0 {
            return Ok(());
        }
        let cfg = grid_stride(n, 256, self.max_blocks.saturating_mul(4));
        // SAFETY: matches `randn_bf16(bf16_t* w, unsigned long long n, unsigned long long seed,
        // float mean, float std)`; writes w[0..n]; exclusive.
        unsafe { self.randn.launch(s, cfg, (w, n as u64, seed, mean, std)) }
    }
}

/// The launch configuration of [`LlamaKernels::embed`]: 256-thread blocks,
/// `min(ceil(hidden / 256), 65535)` blocks across a row and `min(batch, 65535)` rows of blocks
/// (at least 1 each); the kernel loops in 64 bits over further columns and rows.
pub fn embed_config(batch: usize, hidden: usize) -> LaunchConfig {
    let cap = MAX_ROW_BLOCKS as usize;
    let x = hidden.div_ceil(256).clamp(1, cap) as u32; // <= 65535
    let y = batch.clamp(1, cap.min(MAX_GRID_Y)) as u32; // <= 65535
    LaunchConfig { grid: (x, y, 1), block: (256, 1, 1), shared_mem_bytes: 0 }
}

/// The launch configuration of [`LlamaKernels::rmsnorm`]: one 256-thread block per row, at most
/// 65535 blocks (at least 1); each block loops in 64 bits over further rows.
pub fn rmsnorm_config(rows: usize) -> LaunchConfig {
    let blocks = rows.clamp(1, MAX_ROW_BLOCKS as usize) as u32; // <= 65535
    LaunchConfig { grid: (blocks, 1, 1), block: (256, 1, 1), shared_mem_bytes: 0 }
}

/// A positive `CUDA_ASYNC_ATTN_SPLIT_MIN`, if set (any other value is ignored: the policy only
/// moves work between blocks, every value gives correct results).
fn attention_split_min() -> Option<u32> {
    std::env::var("CUDA_ASYNC_ATTN_SPLIT_MIN")
        .ok()
        .and_then(|v| v.trim().parse::<u32>().ok())
        .filter(|&n| n >= 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape() -> AttnShape {
        AttnShape { batch: 4, heads: 8, kv_heads: 2, head_dim: 64, slots: 2, max_seq: 16, scale: 0.125 }
    }

    #[test]
    fn embed_config_caps_both_grid_dimensions() {
        // A batch beyond gridDim.y's 65535 and a row beyond u32::MAX columns: capped, the kernel
        // loops over the rest.
        let cfg = embed_config(100_000, (1 << 32) + 8);
        assert_eq!(cfg.grid, (65_535, 65_535, 1));
        assert_eq!(embed_config(3, 64).grid, (1, 3, 1));
        assert_eq!(embed_config(0, 0).grid, (1, 1, 1));
        assert_eq!(embed_config(65_535, 256 * 7 + 1).grid, (8, 65_535, 1));
    }

    #[test]
    fn rmsnorm_config_caps_the_grid() {
        assert_eq!(rmsnorm_config(70_000).grid, (65_535, 1, 1));
        assert_eq!(rmsnorm_config(1 << 40).grid, (65_535, 1, 1));
        assert_eq!(rmsnorm_config(5).grid, (5, 1, 1));
        assert_eq!(rmsnorm_config(0).grid, (1, 1, 1));
    }

    #[test]
    fn attention_shape_limits() {
        assert!(shape().validate().is_ok());
        let at = |f: fn(&mut AttnShape)| {
            let mut s = shape();
            f(&mut s);
            s.validate()
        };
        assert!(at(|s| s.batch = MAX_BATCH as u32).is_ok());
        let e = at(|s| s.batch = MAX_BATCH as u32 + 1).unwrap_err().to_string();
        assert!(e.contains("batch = 65536") && e.contains("65535"), "{e}");
        assert!(at(|s| s.max_seq = MAX_SEQ as u32).is_ok());
        let e = at(|s| s.max_seq = MAX_SEQ as u32 + 1).unwrap_err().to_string();
        assert!(e.contains("max_seq") && e.contains(&MAX_SEQ.to_string()), "{e}");
        assert!(at(|s| s.max_seq = u32::MAX).is_err());
        let e = at(|s| {
            s.kv_heads = MAX_KV_HEADS as u32 + 1;
            s.heads = s.kv_heads;
        })
        .unwrap_err()
        .to_string();
        assert!(e.contains("kv_heads"), "{e}");
    }

    #[test]
    fn attention_lengths_saturate_and_are_refused() {
        // slots * kv_heads * max_seq * head_dim = 2^32 * 2^31 * (2^31 - 1) * 128 overflows usize.
        let huge = AttnShape {
            batch: 1,
            heads: i32::MAX as u32,
            kv_heads: i32::MAX as u32,
            head_dim: 128,
            slots: u32::MAX,
            max_seq: MAX_SEQ as u32,
            scale: 0.1,
        };
        assert_eq!(huge.cache_len(), usize::MAX);
        let e = huge.validate().unwrap_err().to_string();
        assert!(e.contains("overflow"), "{e}");
        // partial: batch * kv_heads * 16 * 8 * 130 with batch and kv_heads at their limits fits.
        let big = AttnShape {
            batch: 65_535,
            heads: 8,
            kv_heads: 1,
            head_dim: 128,
            slots: 1,
            max_seq: 1,
            scale: 0.1,
        };
        assert_eq!(big.partial_len(), 65_535 * 16 * 8 * 130);
        assert_eq!(big.cache_len(), 128);
        // qkv_row is computed in 64 bits (the kernel does the same): no wrap at heads near 2^32.
        let wide = AttnShape { heads: u32::MAX - 7, kv_heads: (u32::MAX - 7) / 8, ..big };
        assert_eq!(wide.qkv_row(), ((u32::MAX - 7) as usize + 2 * ((u32::MAX - 7) / 8) as usize) * 128);
        // Three u32 values whose product passes 2^64: qkv_row saturates, and validate refuses the
        // shape instead of panicking on the overflow (in a debug build) before its range checks.
        // (kv_heads within its limit, so that validate reaches the element counts.)
        let absurd = AttnShape { heads: u32::MAX, kv_heads: 8, head_dim: u32::MAX, batch: 1, ..big };
        assert!(absurd.validate().is_err());
        assert_eq!(absurd.qkv_row(), usize::MAX);
    }
}

//! GPU suite for the kernels' size limits: launches whose sizes reach past what 32-bit index
//! arithmetic or one grid dimension can cover must either work (checked against host references,
//! outputs poisoned first) or be refused with [`Error::InvalidArgument`] naming the size and the
//! limit, before anything is launched.
//!
//! The largest test (`elementwise_beyond_u32_elements`) holds two `f32` buffers of just over 2^32
//! elements (32 GiB); the others need little memory. Ignored without a GPU; fails without one when
//! CUDA_ASYNC_REQUIRE_GPU=1.

use cuda_async_tests::{ensure, Failed, Suite, TestResult};
use cuda_core::{Device, DeviceBuffer, Error, Stream};
use half::bf16;
use kernels::llama::{
    AttnBuffers, AttnScratch, AttnShape, LlamaKernels, RmsNorm, MAX_BATCH, MAX_SEQ, MAX_VOCAB,
};
use kernels::Kernels;

fn stream() -> Result<Stream, Failed> {
    Ok(Device::new(0)?.new_stream()?)
}

/// Just over 2^32 elements: an index, a count or a stride kept in 32 bits wraps.
const HUGE: usize = (1 << 32) + 4099;

/// `k.sum` of `x`, read back.
fn sum(s: &Stream, k: &Kernels, x: &DeviceBuffer<f32>) -> Result<f64, Failed> {
    let mut out = DeviceBuffer::<f64>::filled(s, 1, f64::NAN)?;
    k.sum(s, x, &mut out)?;
    Ok(out.to_vec()?[0])
}

/// fill, scale, scale_by, axpy and sum over 2^32 + 4099 `f32` elements, the buffers poisoned with
/// NaN first: each result's exact sum (small integers, accumulated in f64) shows that every
/// element, the last ones included, was written once with the right value (a NaN left anywhere
/// makes the sum NaN). Catches an element count truncated to 32 bits (the sum would be 4099 or
/// NaN) and a 32-bit loop index or stride in the kernels (it wraps: a hang or a NaN tail).
fn elementwise_beyond_u32_elements() -> TestResult {
    let s = stream()?;
    let k = Kernels::get(s.device())?;
    let n = HUGE as f64;
    let mut a = DeviceBuffer::<f32>::filled(&s, HUGE, f32::NAN)?;
    k.fill(&s, &mut a, 1.0)?;
    let got = sum(&s, k, &a)?;
    ensure(got == n, format!("fill(1) + sum over {HUGE}: got {got}, expected {n}"))?;

    let mut b = DeviceBuffer::<f32>::filled(&s, HUGE, f32::NAN)?;
    k.scale(&s, &a, 2.0, &mut b)?;
    let got = sum(&s, k, &b)?;
    ensure(got == 2.0 * n, format!("scale(2): got {got}, expected {}", 2.0 * n))?;

    b.fill(&s, f32::NAN)?;
    let alpha = DeviceBuffer::from_host(&s, &[3.0f32])?;
    k.scale_by(&s, &a, &alpha, &mut b)?;
    let got = sum(&s, k, &b)?;
    ensure(got == 3.0 * n, format!("scale_by(3): got {got}, expected {}", 3.0 * n))?;

    k.axpy(&s, 1.0, &a, &mut b)?;
    let got = sum(&s, k, &b)?;
    ensure(got == 4.0 * n, format!("axpy(1, 1, 3): got {got}, expected {}", 4.0 * n))
}

/// Embedding gathers whose grid would exceed a dimension's limit: a batch of 70,000 rows (more
/// than gridDim.y's 65,535) and a row of 65,535 * 256 + 264 columns (more than the capped
/// gridDim.x covers at once). Every row checked against the host, the output poisoned first.
/// Catches a launcher that does not cap the grid (the driver refuses gridDim.y > 65535) and a
/// kernel without its row or column grid-stride loop (rows or columns left poisoned).
fn embed_beyond_the_grid() -> TestResult {
    let s = stream()?;
    let k = LlamaKernels::get(s.device())?;
    let poison = bf16::from_f32(-12345.0);
    for (batch, hidden, vocab) in [(70_000usize, 8usize, 5usize), (3, 65_535 * 256 + 264, 2)] {
        let table_h: Vec<bf16> = (0..vocab * hidden).map(|i| bf16::from_f32((i % 251) as f32)).collect();
        let table = DeviceBuffer::from_host(&s, &table_h)?;
        // Token vocab (out of range) every few rows: a NaN row.
        let tokens_h: Vec<u32> = (0..batch).map(|b| ((b * 7 + 1) % (vocab + 1)) as u32).collect();
        let tokens = DeviceBuffer::from_host(&s, &tokens_h)?;
        let mut h = DeviceBuffer::<bf16>::filled(&s, batch * hidden, poison)?;
        k.embed(&s, &tokens, &table, &mut h, hidden)?;
        let got = h.to_vec()?;
        for (b, &tok) in tokens_h.iter().enumerate() {
            let row = &got[b * hidden..(b + 1) * hidden];
            let t = tok as usize;
            let ok = if t < vocab {
                row == &table_h[t * hidden..(t + 1) * hidden]
            } else {
                row.iter().all(|v| v.is_nan())
            };
            if !ok {
                let bad = row.iter().position(|v| *v == poison);
                return Err(format!(
                    "batch {batch} x hidden {hidden}: row {b} (token {tok}) wrong; first poisoned column {bad:?}"
                )
                .into());
            }
        }
    }
    Ok(())
}

/// RMSNorm over 70,000 rows: more rows than the capped grid (65,535 blocks), so blocks take a
/// second row. Checked against a host reference (bf16 rounding as the kernel's), the output
/// poisoned first. Catches a kernel without its row loop (the last rows stay poisoned) and a
/// launcher that launches one block per row beyond the cap.
fn rmsnorm_beyond_the_grid() -> TestResult {
    let s = stream()?;
    let k = LlamaKernels::get(s.device())?;
    let (rows, hidden, eps) = (70_000usize, 16usize, 1e-5f32);
    let xh: Vec<bf16> =
        (0..rows * hidden).map(|i| bf16::from_f32(((i * 37 % 101) as f32 - 50.0) / 25.0)).collect();
    let wh: Vec<bf16> = (0..hidden).map(|i| bf16::from_f32(0.5 + i as f32 / 16.0)).collect();
    let x = DeviceBuffer::from_host(&s, &xh)?;
    let w = DeviceBuffer::from_host(&s, &wh)?;
    let mut out = DeviceBuffer::<bf16>::filled(&s, rows * hidden, bf16::NAN)?;
    k.rmsnorm(&s, &x, RmsNorm { weight: &w, eps }, &mut out, rows, hidden)?;
    let got = out.to_vec()?;
    for r in 0..rows {
        let xr = &xh[r * hidden..(r + 1) * hidden];
        let ms = xr.iter().map(|v| v.to_f32() * v.to_f32()).sum::<f32>() / hidden as f32;
        let inv = 1.0 / (ms + eps).sqrt();
        for i in 0..hidden {
            let want = wh[i].to_f32() * bf16::from_f32(xr[i].to_f32() * inv).to_f32();
            let g = got[r * hidden + i].to_f32();
            let within = (g - want).abs() <= 2e-2 * want.abs().max(1.0); // false for NaN
            if !within {
                return Err(format!("row {r} element {i}: got {g}, expected {want}").into());
            }
        }
    }
    Ok(())
}

/// `Err(InvalidArgument)` whose message names `what` and `limit`.
fn refused(r: cuda_core::Result<()>, what: &str, limit: usize) -> TestResult {
    match r {
        Err(Error::InvalidArgument(msg)) if msg.contains(what) && msg.contains(&limit.to_string()) => Ok(()),
        other => Err(format!("expected a refusal naming {what} and {limit}, got {other:?}").into()),
    }
}

/// Sizes beyond the documented limits are refused before any length check or launch, so small
/// buffers suffice: argmax over more than [`MAX_BATCH`] rows or a vocabulary above
/// [`MAX_VOCAB`]; attention with `batch > MAX_BATCH` or `max_seq > MAX_SEQ`. Catches a missing
/// check (the call then fails with a length mismatch, or launches) and a check placed after the
/// length checks. The largest accepted sizes are checked in the crate's unit tests.
fn launcher_refusals() -> TestResult {
    let s = stream()?;
    let k = LlamaKernels::get(s.device())?;
    let logits = DeviceBuffer::<f32>::zeros(&s, 1)?;
    let mut scratch = DeviceBuffer::<u64>::zeros(&s, 1)?;
    let mut out = DeviceBuffer::<u32>::zeros(&s, MAX_BATCH + 1)?;
    refused(k.argmax(&s, &logits, &mut scratch, &mut out, 1), "rows", MAX_BATCH)?;
    let mut out1 = DeviceBuffer::<u32>::zeros(&s, 1)?;
    refused(k.argmax(&s, &logits, &mut scratch, &mut out1, MAX_VOCAB + 1), "vocab", MAX_VOCAB)?;
    // Nothing was launched: the outputs keep their zeros.
    ensure(out1.to_vec()? == [0] && scratch.to_vec()? == [0], "a refused argmax wrote")?;

    let ok = AttnShape { batch: 1, heads: 2, kv_heads: 1, head_dim: 32, slots: 1, max_seq: 4, scale: 0.2 };
    for (shape, what, limit) in [
        (AttnShape { batch: MAX_BATCH as u32 + 1, ..ok }, "batch", MAX_BATCH),
        (AttnShape { max_seq: MAX_SEQ as u32 + 1, ..ok }, "max_seq", MAX_SEQ),
        (AttnShape { max_seq: u32::MAX, ..ok }, "max_seq", MAX_SEQ),
    ] {
        let b = |n| DeviceBuffer::<bf16>::zeros(&s, n);
        let (qkv, mut kc, mut vc, mut o) = (b(1)?, b(1)?, b(1)?, b(1)?);
        let u = |n| DeviceBuffer::<u32>::zeros(&s, n);
        let (slots, positions, mut counters) = (u(1)?, u(1)?, u(1)?);
        let inv = DeviceBuffer::<f32>::zeros(&s, 16)?;
        let mut partial = DeviceBuffer::<f32>::zeros(&s, 1)?;
        // SAFETY: the counters are zeroed and there is one row (no two rows share a slot); the
        // shape is refused before anything is launched, which is what this test checks.
        let r = unsafe {
            k.rope_attention(
                &s,
                AttnBuffers {
                    qkv: &qkv,
                    k_cache: &mut kc,
                    v_cache: &mut vc,
                    slots: &slots,
                    positions: &positions,
                    inv_freq: &inv,
                },
                &mut o,
                AttnScratch { partial: &mut partial, counters: &mut counters },
                shape,
            )
        };
        refused(r, what, limit)?;
    }
    Ok(())
}

fn main() {
    let mut s = Suite::new();
    s.gpu("elementwise_beyond_u32_elements", elementwise_beyond_u32_elements)
        .gpu("embed_beyond_the_grid", embed_beyond_the_grid)
        .gpu("rmsnorm_beyond_the_grid", rmsnorm_beyond_the_grid)
        .gpu("launcher_refusals", launcher_refusals);
    s.run()
}

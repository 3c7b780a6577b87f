//! GPU suite for the decode attention kernel (`LlamaKernels::rope_attention`) against an f64
//! host reference: random queries, keys, values and caches, random positions (several 32-position
//! tiles, partial last tiles), several rows and key/value heads, outputs poisoned with NaN first.
//! Shapes are chosen so that the launcher takes both of its paths: many splits per (row, head)
//! combined through `partial` (few rows) and one split writing the output directly (rows x
//! kv_heads >= 2 blocks per multiprocessor). Also checks the cache append at each row's position
//! and that no other cache entry changed. Ignored without a GPU; fails without one when
//! CUDA_ASYNC_REQUIRE_GPU=1.

use cuda_async_tests::{ensure, rng, Failed, Suite, TestResult};
use cuda_core::{Device, DeviceBuffer, Stream};
use half::bf16;
use kernels::llama::{AttnBuffers, AttnScratch, AttnShape, LlamaKernels};
use rand::Rng;

fn stream() -> Result<Stream, Failed> {
    Ok(Device::new(0)?.new_stream()?)
}

fn bf(v: f64) -> f64 {
    bf16::from_f64(v).to_f64()
}

/// The kernel's output for `rows` rows of `shape` at `positions` (slot of row r = r), checked
/// against the host: returns the largest relative error (norm of the difference over norm of
/// the reference, per (row, head)).
fn check(shape: AttnShape, positions: &[u32]) -> TestResult {
    let s = stream()?;
    let k = LlamaKernels::get(s.device())?;
    let mut r = rng();
    let (b, hd, heads, kvh) =
        (shape.batch as usize, shape.head_dim as usize, shape.heads as usize, shape.kv_heads as usize);
    let group = heads / kvh;
    let max_seq = shape.max_seq as usize;
    let mut rb =
        |n: usize| -> Vec<bf16> { (0..n).map(|_| bf16::from_f32(r.random_range(-1.0f32..1.0))).collect() };
    let qkv = rb(b * shape.qkv_row());
    let kc0 = rb(shape.cache_len());
    let vc0 = rb(shape.cache_len());
    let inv: Vec<f32> = (0..hd / 2).map(|i| 500000f32.powf(-(2.0 * i as f32) / hd as f32)).collect();
    let slots: Vec<u32> = (0..b as u32).collect();
    let d_qkv = DeviceBuffer::from_host(&s, &qkv)?;
    let mut d_kc = DeviceBuffer::from_host(&s, &kc0)?;
    let mut d_vc = DeviceBuffer::from_host(&s, &vc0)?;
    let d_slots = DeviceBuffer::from_host(&s, &slots)?;
    let d_pos = DeviceBuffer::from_host(&s, positions)?;
    let d_inv = DeviceBuffer::from_host(&s, &inv)?;
    let mut out = DeviceBuffer::filled(&s, b * heads * hd, bf16::NAN)?;
    let mut partial = DeviceBuffer::<f32>::filled(&s, shape.partial_len(), f32::NAN)?;
    let mut counters = DeviceBuffer::<u32>::zeros(&s, shape.counters_len())?;
    // Twice: the second launch checks that the first left the counters at zero.
    for _ in 0..2 {
        // SAFETY: slots 0..b are distinct and in range; the counters start zeroed.
        unsafe {
            k.rope_attention(
                &s,
                AttnBuffers {
                    qkv: &d_qkv,
                    k_cache: &mut d_kc,
                    v_cache: &mut d_vc,
                    slots: &d_slots,
                    positions: &d_pos,
                    inv_freq: &d_inv,
                },
                &mut out,
                AttnScratch { partial: &mut partial, counters: &mut counters },
                shape,
            )?
        };
    }
    let got = out.to_vec()?;
    let kc = d_kc.to_vec()?;
    let vc = d_vc.to_vec()?;
    ensure(counters.to_vec()?.iter().all(|&c| c == 0), "counters not reset to zero")?;
    let qkv_row = shape.qkv_row();
    let mut worst = 0f64;
    for row in 0..b {
        let pos = positions[row] as usize;
        let x = &qkv[row * qkv_row..(row + 1) * qkv_row];
        let f = |v: bf16| v.to_f64();
        let rot = |v: &[bf16]| -> Vec<f64> {
            let half = hd / 2;
            let mut o = vec![0.0; hd];
            for i in 0..half {
                let ang = (pos as f32 * inv[i]) as f64;
                let (c, sn) = (bf(ang.cos()), bf(ang.sin()));
                let (x1, x2) = (f(v[i]), f(v[i + half]));
                o[i] = bf(x1 * c - x2 * sn);
                o[i + half] = bf(x2 * c + x1 * sn);
            }
            o
        };
        for h in 0..kvh {
            let knew = rot(&x[(heads + h) * hd..(heads + h + 1) * hd]);
            let vnew: Vec<f64> =
                x[(heads + kvh + h) * hd..(heads + kvh + h + 1) * hd].iter().map(|&v| f(v)).collect();
            let base = (row * kvh + h) * max_seq * hd;
            // The append, and nothing else of this head's cache rows changed.
            for p in 0..max_seq {
                for d in 0..hd {
                    let i = base + p * hd + d;
                    let (wk, wv) = if p == pos { (bf(knew[d]), bf(vnew[d])) } else { (f(kc0[i]), f(vc0[i])) };
                    // The appended key may differ by a bf16 step where the device's cos/sin
                    // round the other way; every other entry is exact.
                    let tol = if p == pos { 1.0 / 64.0 * wk.abs().max(1.0 / 64.0) } else { 0.0 };
                    ensure(
                        (f(kc[i]) - wk).abs() <= tol && f(vc[i]) == wv,
                        format!(
                            "cache row {row} head {h} position {p} dim {d}: k {} v {} expected {wk} {wv}",
                            kc[i], vc[i]
                        ),
                    )?;
                }
            }
            for g in 0..group {
                let qh = h * group + g;
                let q: Vec<f64> =
                    rot(&x[qh * hd..(qh + 1) * hd]).iter().map(|v| v * shape.scale as f64).collect();
                let key = |p: usize, d: usize| if p == pos { knew[d] } else { f(kc0[base + p * hd + d]) };
                let val = |p: usize, d: usize| if p == pos { vnew[d] } else { f(vc0[base + p * hd + d]) };
                let scores: Vec<f64> = (0..=pos).map(|p| (0..hd).map(|d| q[d] * key(p, d)).sum()).collect();
                let mx = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let w: Vec<f64> = scores.iter().map(|sc| (sc - mx).exp()).collect();
                let den: f64 = w.iter().sum();
                let (mut diff, mut norm) = (0f64, 0f64);
                for d in 0..hd {
                    let want: f64 = (0..=pos).map(|p| w[p] * val(p, d)).sum::<f64>() / den;
                    let g_ = f(got[(row * heads + qh) * hd + d]);
                    ensure(g_.is_finite(), format!("row {row} head {qh} dim {d}: {g_}"))?;
                    diff += (g_ - want).powi(2);
                    norm += want.powi(2);
                }
                let rel = (diff / norm.max(1e-30)).sqrt();
                worst = worst.max(rel);
                ensure(
                    rel < 1e-2,
                    format!("row {row} head {qh} (position {pos}): relative error {rel:.3e}"),
                )?;
            }
        }
    }
    eprintln!("largest relative error {worst:.3e}");
    Ok(())
}

/// Few rows: many splits per (row, head), combined by the last block through `partial`. Each
/// row uses as many of the grid's splits as give every one `attention_split_min` positions (256
/// with the default eight-warp kernel, 128 with four warps): here 1 (positions 0 and 37: no
/// combine), 2 or 3 (299) and 9 or 16 (2099) in one launch, so blocks of one row return early
/// while those of another combine.
fn split_rows_match_host() -> TestResult {
    let shape =
        AttnShape { batch: 4, heads: 8, kv_heads: 2, head_dim: 64, slots: 4, max_seq: 2100, scale: 0.125 };
    check(shape, &[0, 37, 299, 2099])
}

/// Rows x kv_heads past two blocks per multiprocessor: one split, the block writes the output.
fn unsplit(heads: u32, head_dim: u32) -> TestResult {
    let sms = Device::new(0)?.multiprocessor_count()?;
    let batch = 2 * sms + 3; // kv_heads 1: batch blocks >= 2 per multiprocessor
    let shape = AttnShape { batch, heads, kv_heads: 1, head_dim, slots: batch, max_seq: 80, scale: 0.125 };
    let positions: Vec<u32> = (0..batch).map(|r| (r * 37) % 80).collect();
    check(shape, &positions)
}

/// One split, the kernel compiled for group <= 4 and head_dim <= 64.
fn unsplit_rows_match_host() -> TestResult {
    unsplit(4, 64)
}

/// One split, the general kernel (group 6, head_dim 96: three dims per lane).
fn unsplit_general_rows_match_host() -> TestResult {
    unsplit(6, 96)
}

/// head_dim 128 and a group of 8 (the kernel's limits), few rows.
fn largest_head_and_group_match_host() -> TestResult {
    let shape =
        AttnShape { batch: 2, heads: 16, kv_heads: 2, head_dim: 128, slots: 2, max_seq: 70, scale: 0.088 };
    check(shape, &[69, 33])
}

fn main() {
    let mut s = Suite::new();
    s.gpu("split_rows_match_host", split_rows_match_host)
        .gpu("unsplit_rows_match_host", unsplit_rows_match_host)
        .gpu("unsplit_general_rows_match_host", unsplit_general_rows_match_host)
        .gpu("largest_head_and_group_match_host", largest_head_and_group_match_host);
    s.run()
}

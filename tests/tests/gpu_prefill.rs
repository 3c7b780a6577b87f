//! GPU suite of the chunked prefill. Kernel level: `LlamaKernels::rope_append` followed by
//! `LlamaKernels::attention_cached` against an f64 host reference, with several rows of one slot
//! at consecutive positions in one launch, inactive and out-of-range rows, outputs poisoned with
//! NaN first and the caches checked (written entries right, every other entry unchanged), the
//! appended keys bit-identical to the decode kernel's, and `gather_rows`. Model level
//! (`LlamaConfig::small()`, random weights): a prompt prefilled in one chunk, in several chunks
//! and packed with other sequences against the token-by-token path (`forced_logits`), decode
//! steps after a prefill, a piece alone in its bucket bit for bit, the refusals, the shared
//! graph budget; and the Hugging Face reference of `gpu_llama` (`LLAMA_REF_DIR`, or
//! `scripts/hf_llama_reference.py` run here). Ignored without a GPU; fails without one when
//! CUDA_ASYNC_REQUIRE_GPU=1.

use cuda_async_tests::{ensure, rng, Failed, Suite, TestResult};
use cuda_core::{Device, DeviceBuffer, Stream};
use half::bf16;
use kernels::llama::{AttnBuffers, AttnScratch, AttnShape, LlamaKernels, INACTIVE};
use kernels::sample::uniform;
use models::llama::{
    DeviceWeights, HostWeights, LlamaConfig, LlamaModel, ModelOptions, PrefillSeq, Row, Sampling,
};
use rand::Rng;
use std::path::{Path, PathBuf};

fn stream() -> Result<Stream, Failed> {
    Ok(Device::new(0)?.new_stream()?)
}

fn bf(v: f64) -> f64 {
    bf16::from_f64(v).to_f64()
}

/// `LlamaKernels::attention_cached` with counters the caller zeroed (as `DeviceBuffer::zeros`
/// gives) and keeps exclusive to these launches.
fn cached(
    k: &LlamaKernels,
    s: &Stream,
    io: AttnBuffers<'_, &DeviceBuffer<bf16>>,
    out: &mut DeviceBuffer<bf16>,
    scratch: AttnScratch<'_>,
    shape: AttnShape,
) -> TestResult {
    // SAFETY: every caller zeroes the counters before its first launch and each launch leaves
    // them zero; the cached kernel only reads the caches, so repeated slots are allowed.
    unsafe { k.attention_cached(s, io, out, scratch, shape)? };
    Ok(())
}

/// One chunk of `rows` = (slot, position) through rope_append then attention_cached, checked
/// against the host. Slots may repeat (at distinct positions); positions of a slot not written
/// by the chunk keep the random cache contents (the sequence's earlier positions).
fn check_chunk(shape: AttnShape, rows: &[(u32, u32)]) -> TestResult {
    let s = stream()?;
    let k = LlamaKernels::get(s.device())?;
    let mut r = rng();
    let (b, hd, heads, kvh) =
        (rows.len(), shape.head_dim as usize, shape.heads as usize, shape.kv_heads as usize);
    ensure(shape.batch as usize == b, "shape.batch must be the rows")?;
    let (group, max_seq, slots_n) = (heads / kvh, shape.max_seq as usize, shape.slots as usize);
    let mut rb =
        |n: usize| -> Vec<bf16> { (0..n).map(|_| bf16::from_f32(r.random_range(-1.0f32..1.0))).collect() };
    let qkv = rb(b * shape.qkv_row());
    let kc0 = rb(shape.cache_len());
    let vc0 = rb(shape.cache_len());
    let inv: Vec<f32> = (0..hd / 2).map(|i| 500000f32.powf(-(2.0 * i as f32) / hd as f32)).collect();
    let slots: Vec<u32> = rows.iter().map(|x| x.0).collect();
    let positions: Vec<u32> = rows.iter().map(|x| x.1).collect();
    let d_qkv = DeviceBuffer::from_host(&s, &qkv)?;
    let mut d_kc = DeviceBuffer::from_host(&s, &kc0)?;
    let mut d_vc = DeviceBuffer::from_host(&s, &vc0)?;
    let d_slots = DeviceBuffer::from_host(&s, &slots)?;
    let d_pos = DeviceBuffer::from_host(&s, &positions)?;
    let d_inv = DeviceBuffer::from_host(&s, &inv)?;
    let mut out = DeviceBuffer::filled(&s, b * heads * hd, bf16::NAN)?;
    let mut partial = DeviceBuffer::<f32>::filled(&s, shape.partial_len(), f32::NAN)?;
    let mut counters = DeviceBuffer::<u32>::zeros(&s, shape.counters_len())?;
    // SAFETY: the test's active (slot, position) pairs are distinct.
    unsafe {
        k.rope_append(
            &s,
            AttnBuffers {
                qkv: &d_qkv,
                k_cache: &mut d_kc,
                v_cache: &mut d_vc,
                slots: &d_slots,
                positions: &d_pos,
                inv_freq: &d_inv,
            },
            shape,
        )?
    };
    // Twice: the second launch checks that the first left the counters at zero (and that the
    // attention does not write the caches: the second reads what the first did).
    for _ in 0..2 {
        let io = AttnBuffers {
            qkv: &d_qkv,
            k_cache: &d_kc,
            v_cache: &d_vc,
            slots: &d_slots,
            positions: &d_pos,
            inv_freq: &d_inv,
        };
        cached(k, &s, io, &mut out, AttnScratch { partial: &mut partial, counters: &mut counters }, shape)?;
    }
    let got = out.to_vec()?;
    let (kc, vc) = (d_kc.to_vec()?, d_vc.to_vec()?);
    ensure(counters.to_vec()?.iter().all(|&c| c == 0), "counters not reset to zero")?;
    let f = |v: bf16| v.to_f64();
    let qkv_row = shape.qkv_row();
    // One head rotated by `pos` on the host, and how far the device's result may be from it:
    // both round cos/sin to bf16, but the device's cosf/sinf (2 ulp) may land on the
    // neighbouring bf16 value, a change of at most 2^-7 |c| <= 2^-7 in c (or s), which moves
    // x1 c - x2 s by at most 2^-7 (|x1| + |x2|) before the result's own bf16 rounding (another
    // 2^-7 |result| at most). The tolerance is twice that; the exact check is the comparison
    // with the decode kernel below.
    let rot_tol = |v: &[bf16], pos: usize| -> (Vec<f64>, Vec<f64>) {
        let half = hd / 2;
        let (mut o, mut tol) = (vec![0.0; hd], vec![0.0; hd]);
        for i in 0..half {
            let ang = (pos as f32 * inv[i]) as f64;
            let (c, sn) = (bf(ang.cos()), bf(ang.sin()));
            let (x1, x2) = (f(v[i]), f(v[i + half]));
            o[i] = bf(x1 * c - x2 * sn);
            o[i + half] = bf(x2 * c + x1 * sn);
            for d in [i, i + half] {
                tol[d] = (x1.abs() + x2.abs() + o[d].abs()) / 64.0;
            }
        }
        (o, tol)
    };
    let rot = |v: &[bf16], pos: usize| rot_tol(v, pos).0;
    let active = |row: usize| (rows[row].0 as usize) < slots_n && (rows[row].1 as usize) < max_seq;
    // The host's caches after the append: keys (with their tolerance: 0 where not written) and
    // values (exact).
    let mut want_k: Vec<f64> = kc0.iter().map(|&v| f(v)).collect();
    let mut want_v: Vec<f64> = vc0.iter().map(|&v| f(v)).collect();
    let mut tol_k = vec![0f64; kc0.len()];
    let mut written = vec![false; kc0.len()];
    for row in (0..b).filter(|&row| active(row)) {
        let (slot, pos) = (rows[row].0 as usize, rows[row].1 as usize);
        let x = &qkv[row * qkv_row..(row + 1) * qkv_row];
        for h in 0..kvh {
            let (knew, tol) = rot_tol(&x[(heads + h) * hd..(heads + h + 1) * hd], pos);
            let base = ((slot * kvh + h) * max_seq + pos) * hd;
            for d in 0..hd {
                want_k[base + d] = knew[d];
                tol_k[base + d] = tol[d];
                want_v[base + d] = f(x[(heads + kvh + h) * hd + d]);
                written[base + d] = true;
            }
        }
    }
    for i in 0..kc0.len() {
        // An appended key within its tolerance (see `rot_tol`); values and every entry not
        // written exact.
        ensure(
            (f(kc[i]) - want_k[i]).abs() <= tol_k[i] && f(vc[i]) == want_v[i],
            format!(
                "cache entry {i} (written: {}): k {} v {} expected {} {}",
                written[i], kc[i], vc[i], want_k[i], want_v[i]
            ),
        )?;
    }
    // The attention's reference reads the device's caches (checked above): the keys as appended,
    // not the host's rotation, which may differ by the bf16 steps allowed there.
    let (dev_k, dev_v): (Vec<f64>, Vec<f64>) =
        (kc.iter().map(|&v| f(v)).collect(), vc.iter().map(|&v| f(v)).collect());
    let mut worst = 0f64;
    for row in 0..b {
        let (slot, pos) = (rows[row].0 as usize, rows[row].1 as usize);
        let o = &got[row * heads * hd..(row + 1) * heads * hd];
        if rows[row].0 == INACTIVE {
            ensure(o.iter().all(|&v| v == bf16::ZERO), format!("inactive row {row} not zero"))?;
            continue;
        }
        if !active(row) {
            ensure(o.iter().all(|v| v.is_nan()), format!("out-of-range row {row} not NaN"))?;
            continue;
        }
        let x = &qkv[row * qkv_row..(row + 1) * qkv_row];
        for h in 0..kvh {
            let base = (slot * kvh + h) * max_seq * hd;
            for g in 0..group {
                let qh = h * group + g;
                let q: Vec<f64> =
                    rot(&x[qh * hd..(qh + 1) * hd], pos).iter().map(|v| v * shape.scale as f64).collect();
                let scores: Vec<f64> =
                    (0..=pos).map(|p| (0..hd).map(|d| q[d] * dev_k[base + p * hd + d]).sum()).collect();
                let mx = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let w: Vec<f64> = scores.iter().map(|sc| (sc - mx).exp()).collect();
                let den: f64 = w.iter().sum();
                let (mut diff, mut norm) = (0f64, 0f64);
                for d in 0..hd {
                    let want: f64 = (0..=pos).map(|p| w[p] * dev_v[base + p * hd + d]).sum::<f64>() / den;
                    let g_ = f(o[qh * hd + d]);
                    ensure(g_.is_finite(), format!("row {row} head {qh} dim {d}: {g_}"))?;
                    diff += (g_ - want).powi(2);
                    norm += want.powi(2);
                }
                let rel = (diff / norm.max(1e-30)).sqrt();
                worst = worst.max(rel);
                ensure(
                    rel < 1e-2,
                    format!("row {row} head {qh} (slot {slot} position {pos}): relative error {rel:.3e}"),
                )?;
            }
        }
    }
    eprintln!("largest relative error {worst:.3e}");
    // The appended keys and values are the decode kernel's, bit for bit: each active row alone
    // through rope_attention on the original caches.
    for row in (0..b).filter(|&row| active(row)).take(6) {
        let one = AttnShape { batch: 1, ..shape };
        let q1 = DeviceBuffer::from_host(&s, &qkv[row * qkv_row..(row + 1) * qkv_row])?;
        let mut kc1 = DeviceBuffer::from_host(&s, &kc0)?;
        let mut vc1 = DeviceBuffer::from_host(&s, &vc0)?;
        let sl1 = DeviceBuffer::from_host(&s, &[rows[row].0])?;
        let ps1 = DeviceBuffer::from_host(&s, &[rows[row].1])?;
        let mut o1 = DeviceBuffer::<bf16>::zeros(&s, heads * hd)?;
        let mut p1 = DeviceBuffer::<f32>::zeros(&s, one.partial_len())?;
        let mut c1 = DeviceBuffer::<u32>::zeros(&s, one.counters_len())?;
        // SAFETY: one row; fresh zeroed counters.
        unsafe {
            k.rope_attention(
                &s,
                AttnBuffers {
                    qkv: &q1,
                    k_cache: &mut kc1,
                    v_cache: &mut vc1,
                    slots: &sl1,
                    positions: &ps1,
                    inv_freq: &d_inv,
                },
                &mut o1,
                AttnScratch { partial: &mut p1, counters: &mut c1 },
                one,
            )?
        };
        let (k1, v1) = (kc1.to_vec()?, vc1.to_vec()?);
        let (slot, pos) = (rows[row].0 as usize, rows[row].1 as usize);
        for h in 0..kvh {
            let at = ((slot * kvh + h) * max_seq + pos) * hd;
            ensure(
                k1[at..at + hd] == kc[at..at + hd] && v1[at..at + hd] == vc[at..at + hd],
                format!("row {row} head {h}: rope_append's key/value differ from rope_attention's"),
            )?;
        }
    }
    Ok(())
}

/// Few rows (many splits per row and head): a slot at 12 consecutive positions crossing a
/// 32-position tile, another slot continuing late, an inactive row and out-of-range rows.
fn append_then_cached_attention_split() -> TestResult {
    let shape =
        AttnShape { batch: 0, heads: 8, kv_heads: 2, head_dim: 64, slots: 3, max_seq: 80, scale: 0.125 };
    let mut rows: Vec<(u32, u32)> = (26..38).map(|p| (0, p)).collect();
    rows.extend([(2, 70), (2, 71), (INACTIVE, 5), (3, 4), (1, 80), (1, 0)]);
    check_chunk(AttnShape { batch: rows.len() as u32, ..shape }, &rows)
}

/// head_dim 128 and a group of 8 (the general kernel), a slot from position 0.
fn append_then_cached_attention_general() -> TestResult {
    let shape =
        AttnShape { batch: 0, heads: 16, kv_heads: 2, head_dim: 128, slots: 2, max_seq: 40, scale: 0.088 };
    let mut rows: Vec<(u32, u32)> = (0..9).map(|p| (1, p)).collect();
    rows.push((0, 39));
    check_chunk(AttnShape { batch: rows.len() as u32, ..shape }, &rows)
}

/// Rows x kv_heads past two blocks per multiprocessor: one split per row (no partials); two
/// slots' prompts of many consecutive positions.
fn append_then_cached_attention_unsplit() -> TestResult {
    let sms = Device::new(0)?.multiprocessor_count()? as usize;
    let n = 2 * sms + 4;
    let rows: Vec<(u32, u32)> = (0..n).map(|i| ((i % 2) as u32, (i / 2) as u32)).collect();
    let max_seq = (n / 2 + 3) as u32;
    let shape =
        AttnShape { batch: n as u32, heads: 4, kv_heads: 1, head_dim: 64, slots: 2, max_seq, scale: 0.125 };
    check_chunk(shape, &rows)
}

/// The tiled kernel's long walk (group 4, head_dim 64): a prompt's 70 rows at positions 230..300
/// (five 64-position key tiles, blocks of 8 rows all of one slot), then rows of two other slots
/// sharing blocks (two slot groups in a block), one of them at position 0 (a single key).
fn append_then_cached_attention_long() -> TestResult {
    let shape =
        AttnShape { batch: 0, heads: 8, kv_heads: 2, head_dim: 64, slots: 3, max_seq: 320, scale: 0.125 };
    let mut rows: Vec<(u32, u32)> = (230..300).map(|p| (1, p)).collect();
    rows.extend([(0, 0), (2, 319), (0, 1), (2, 64), (0, 63)]);
    check_chunk(AttnShape { batch: rows.len() as u32, ..shape }, &rows)
}

/// A row's output depends only on the keys and values up to its own position, even when a later
/// row of the same slot shares its block (and so its key tiles): an infinite value at position 20,
/// which only the row at position 40 attends to, leaves the row at position 1 finite and
/// bit-identical to the launch where that value is finite. Found by review of the tiled kernel:
/// its value loop ran over the whole tile, adding 0 x inf = NaN for the keys past a row's position.
fn cached_attention_ignores_keys_past_its_position() -> TestResult {
    let s = stream()?;
    let k = LlamaKernels::get(s.device())?;
    let mut r = rng();
    let shape =
        AttnShape { batch: 2, heads: 8, kv_heads: 2, head_dim: 64, slots: 1, max_seq: 64, scale: 0.125 };
    let (hd, heads) = (64usize, 8usize);
    let mut rb =
        |n: usize| -> Vec<bf16> { (0..n).map(|_| bf16::from_f32(r.random_range(-1.0f32..1.0))).collect() };
    let qkv = rb(2 * shape.qkv_row());
    let kc = rb(shape.cache_len());
    let vc = rb(shape.cache_len());
    let inv: Vec<f32> = (0..hd / 2).map(|i| 500000f32.powf(-(2.0 * i as f32) / hd as f32)).collect();
    let run = |v_at_20: bf16| -> Result<Vec<bf16>, Failed> {
        let mut vc = vc.clone();
        for kvh in 0..2 {
            let at = (kvh * 64 + 20) * hd; // slot 0, key/value head kvh, position 20
            vc[at..at + hd].fill(v_at_20);
        }
        let d_qkv = DeviceBuffer::from_host(&s, &qkv)?;
        let d_kc = DeviceBuffer::from_host(&s, &kc)?;
        let d_vc = DeviceBuffer::from_host(&s, &vc)?;
        let d_slots = DeviceBuffer::from_host(&s, &[0u32, 0])?;
        let d_pos = DeviceBuffer::from_host(&s, &[1u32, 40])?;
        let d_inv = DeviceBuffer::from_host(&s, &inv)?;
        let mut out = DeviceBuffer::filled(&s, 2 * heads * hd, bf16::NAN)?;
        let mut partial = DeviceBuffer::<f32>::filled(&s, shape.partial_len(), f32::NAN)?;
        let mut counters = DeviceBuffer::<u32>::zeros(&s, shape.counters_len())?;
        let io = AttnBuffers {
            qkv: &d_qkv,
            k_cache: &d_kc,
            v_cache: &d_vc,
            slots: &d_slots,
            positions: &d_pos,
            inv_freq: &d_inv,
        };
        cached(k, &s, io, &mut out, AttnScratch { partial: &mut partial, counters: &mut counters }, shape)?;
        Ok(out.to_vec()?)
    };
    let finite = run(bf16::from_f32(0.5))?;
    let poisoned = run(bf16::INFINITY)?;
    let row0 = |o: &[bf16]| o[..heads * hd].iter().map(|v| v.to_bits()).collect::<Vec<_>>();
    ensure(finite[..heads * hd].iter().all(|v| v.is_finite()), "row 0 not finite with finite values")?;
    ensure(
        row0(&finite) == row0(&poisoned),
        "row 0 (position 1) changed when only position 20's value became infinite",
    )?;
    ensure(
        poisoned[heads * hd..].iter().any(|v| !v.is_finite()),
        "row 1 (position 40) ignored the infinite value",
    )
}

/// gather_rows: chosen rows exact, INACTIVE zeros, an out-of-range index NaN.
fn gather_rows_picks_rows() -> TestResult {
    let s = stream()?;
    let k = LlamaKernels::get(s.device())?;
    let (rows, cols) = (5, 96);
    let mut r = rng();
    let h: Vec<bf16> = (0..rows * cols).map(|_| bf16::from_f32(r.random_range(-4.0f32..4.0))).collect();
    let idx = [4u32, INACTIVE, 0, 5, 4];
    let d_h = DeviceBuffer::from_host(&s, &h)?;
    let d_idx = DeviceBuffer::from_host(&s, &idx)?;
    let mut out = DeviceBuffer::filled(&s, idx.len() * cols, bf16::NAN)?;
    k.gather_rows(&s, &d_h, &d_idx, &mut out, cols)?;
    let o = out.to_vec()?;
    let row = |i: usize| &o[i * cols..(i + 1) * cols];
    ensure(row(0) == &h[4 * cols..5 * cols] && row(4) == row(0), "row 4")?;
    ensure(row(2) == &h[..cols], "row 0")?;
    ensure(row(1).iter().all(|&v| v == bf16::ZERO), "inactive row not zero")?;
    ensure(row(3).iter().all(|v| v.is_nan()), "out-of-range row not NaN")?;
    let mut short = DeviceBuffer::<bf16>::zeros(&s, cols)?;
    ensure(k.gather_rows(&s, &d_h, &d_idx, &mut short, cols).is_err(), "short output accepted")
}

fn random_model(s: &Stream, opts: ModelOptions) -> Result<LlamaModel, Failed> {
    let cfg = LlamaConfig::small();
    let w = DeviceWeights::random(s, &cfg, 11, 0.05)?;
    Ok(LlamaModel::new(s, cfg, w, opts)?)
}

fn opts() -> ModelOptions {
    ModelOptions {
        slots: 8,
        max_seq: 64,
        buckets: vec![1, 2, 4, 8],
        prefill_buckets: vec![4, 8, 16, 32],
        ..Default::default()
    }
}

fn argmax(l: &[f32]) -> usize {
    (0..l.len()).fold(0, |b, i| if l[i] > l[b] { i } else { b })
}

/// The largest |a - b| (infinite for NaN or another length).
fn max_abs(a: &[f32], b: &[f32]) -> f64 {
    if a.len() != b.len() {
        return f64::INFINITY;
    }
    a.iter().zip(b).map(|(&x, &y)| (f64::from(x) - f64::from(y)).abs()).fold(0.0, |m, d| {
        if d.is_nan() {
            f64::INFINITY
        } else {
            m.max(d)
        }
    })
}

/// Prefill logits `got` against the token-by-token logits `want` of the same position: within a
/// tolerance that bf16 rounding allows (the two paths round activations after different GEMMs),
/// the same argmax where the reference's top-2 margin is clear, and `token` that argmax.
fn close(what: &str, got: &[f32], want: &[f32], token: Option<u32>) -> TestResult {
    let scale = want.iter().fold(1f64, |m, &v| m.max(f64::from(v).abs()));
    let err = max_abs(got, want);
    let tol = 3e-2 * scale;
    eprintln!("{what}: max |prefill - token by token| {err:.3e} (tolerance {tol:.3e})");
    ensure(err <= tol, format!("{what}: logits differ by {err:.3e} > {tol:.3e}"))?;
    ensure(token == Some(argmax(got) as u32), format!("{what}: token {token:?} is not the logits' argmax"))?;
    let mut sorted: Vec<f32> = want.to_vec();
    sorted.sort_by(|a, b| b.total_cmp(a));
    if f64::from(sorted[0] - sorted[1]) > 2.0 * tol {
        ensure(argmax(got) == argmax(want), format!("{what}: argmax {} vs {}", argmax(got), argmax(want)))?;
    }
    Ok(())
}

fn tokens(n: usize, seed: u32, vocab: usize) -> Vec<u32> {
    (0..n as u32).map(|i| (i * 131 + seed * 977 + 7) % vocab as u32).collect()
}

/// One chunk, several chunks, and packed with another sequence: the next-token logits at the
/// pieces' ends against `forced_logits`; decode steps after the prefill continue the sequence.
fn prefill_matches_token_by_token() -> TestResult {
    let s = stream()?;
    let mut m = random_model(&s, opts())?;
    let v = m.config().vocab;
    let prompt = tokens(21, 1, v);
    let other = tokens(11, 2, v);
    let forced = m.forced_logits(0, &prompt)?;
    let one = |slot, start: usize, end: usize| PrefillSeq {
        slot,
        start: start as u32,
        tokens: &prompt[start..end],
        want_next: true,
    };
    // One chunk (bucket 32).
    ensure(m.prefill_bucket_of(21)? == 32, "bucket of 21 tokens")?;
    let next = m.prefill(&[one(1, 0, 21)])?;
    close("one chunk", &m.last_prefill_logits()?, &forced[20], next[0])?;
    ensure(m.slot_len(1) == Some(21), "slot 1 advanced to 21")?;
    // Several chunks: 7 + 8 + 6 tokens.
    for (a, e) in [(0, 7), (7, 15), (15, 21)] {
        let next = m.prefill(&[one(2, a, e)])?;
        close(&format!("chunk {a}..{e}"), &m.last_prefill_logits()?, &forced[e - 1], next[0])?;
    }
    // Packed: [other 0..5 (no token wanted), prompt 0..9] then [prompt 9..21, other 5..11].
    let first = [PrefillSeq { slot: 3, start: 0, tokens: &other[..5], want_next: false }, one(4, 0, 9)];
    let next = m.prefill(&first)?;
    ensure(next[0].is_none() && next[1].is_some(), format!("packed results {next:?}"))?;
    close("packed first", &m.last_prefill_logits()?, &forced[8], next[1])?;
    let second = [one(4, 9, 21), PrefillSeq { slot: 3, start: 5, tokens: &other[5..], want_next: true }];
    let next = m.prefill(&second)?;
    let l = m.last_prefill_logits()?;
    ensure(l.len() == 2 * v, "two wanted rows of logits")?;
    close("packed second", &l[..v], &forced[20], next[0])?;
    let forced_other = m.forced_logits(5, &other)?;
    close("packed other", &l[v..], &forced_other[10], next[1])?;
    // Decode steps after the prefill (slot 1) against the token-by-token path (slot 0).
    let mut t = next[0].ok_or("no token")?;
    let mut seq = prompt.clone();
    for k in 0..3 {
        seq.push(t);
        let got = m.step(&[Row { slot: 1, position: (21 + k) as u32, token: t }])?[0];
        let lg = m.last_logits()?;
        let want = m.forced_logits(0, &seq)?.pop().ok_or("no logits")?;
        close(&format!("decode step {k} after prefill"), &lg, &want, Some(got))?;
        t = got;
    }
    Ok(())
}

/// A piece's tokens and logits do not depend on its neighbours or its rows in the bucket: the
/// packed results equal the piece replayed alone in the same bucket bit for bit, also for a
/// second piece continuing a sequence, and for the awaited variant.
fn piece_alone_in_bucket_is_bit_identical() -> TestResult {
    let s = stream()?;
    let mut m = random_model(&s, opts())?;
    let v = m.config().vocab;
    let (a, b, c) = (tokens(9, 3, v), tokens(5, 4, v), tokens(14, 5, v));
    // Packed in bucket 16: [b, a] (a's rows start at row 5).
    let packed = m.prefill_in_bucket(
        &[
            PrefillSeq { slot: 1, start: 0, tokens: &b, want_next: true },
            PrefillSeq { slot: 0, start: 0, tokens: &a, want_next: true },
        ],
        16,
    )?;
    let l = m.last_prefill_logits()?;
    let (la, lb) = (l[v..].to_vec(), l[..v].to_vec());
    // A continuation of slot 0 packed behind slot 2's piece.
    let packed2 = m.prefill_in_bucket(
        &[
            PrefillSeq { slot: 2, start: 0, tokens: &c[..10], want_next: true },
            PrefillSeq { slot: 0, start: 9, tokens: &c[10..], want_next: true },
        ],
        16,
    )?;
    let la2 = m.last_prefill_logits()?[v..].to_vec();
    // Alone, in the same bucket.
    m.release_slot(0)?;
    let alone = m.prefill_in_bucket(&[PrefillSeq { slot: 0, start: 0, tokens: &a, want_next: true }], 16)?;
    ensure(alone[0] == packed[1] && m.last_prefill_logits()? == la, "piece a alone differs from packed")?;
    let alone2 =
        m.prefill_in_bucket(&[PrefillSeq { slot: 0, start: 9, tokens: &c[10..], want_next: true }], 16)?;
    ensure(alone2[0] == packed2[1] && m.last_prefill_logits()? == la2, "a's continuation alone differs")?;
    m.release_slot(1)?;
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    // The awaited prefill in bucket 8 (5 tokens: the smallest holding them) ...
    let awaited =
        rt.block_on(m.prefill_async(&[PrefillSeq { slot: 1, start: 0, tokens: &b, want_next: true }]))?;
    let lb8 = m.last_prefill_logits()?;
    m.release_slot(1)?;
    let blocking =
        m.prefill_in_bucket(&[PrefillSeq { slot: 1, start: 0, tokens: &b, want_next: true }], 8)?;
    ensure(awaited == blocking && m.last_prefill_logits()? == lb8, "awaited vs blocking")?;
    // ... and b alone in bucket 16 equals its packed logits.
    m.release_slot(1)?;
    let b16 = m.prefill_in_bucket(&[PrefillSeq { slot: 1, start: 0, tokens: &b, want_next: true }], 16)?;
    ensure(b16[0] == packed[0] && m.last_prefill_logits()? == lb, "piece b alone differs from packed")
}

/// Every broken rule is refused before anything runs, slot lengths unchanged, and the model
/// works after.
fn refusals() -> TestResult {
    let s = stream()?;
    let mut m = random_model(&s, ModelOptions { max_seq: 16, prefill_buckets: vec![4, 8], ..opts() })?;
    m.prefill(&[PrefillSeq { slot: 1, start: 0, tokens: &[1, 2], want_next: false }])?;
    let t = [1u32, 2, 3];
    let q = |slot, start, tokens| PrefillSeq { slot, start, tokens, want_next: true };
    let long = [1u32; 15];
    let bad: Vec<(&str, Vec<PrefillSeq<'_>>)> = vec![
        ("no pieces", vec![]),
        ("no tokens", vec![q(0, 0, &[])]),
        ("slot out of range", vec![q(8, 0, &t)]),
        ("duplicate slot", vec![q(0, 0, &t), q(0, 3, &t)]),
        ("start behind the slot", vec![q(1, 0, &t)]),
        ("start past the slot", vec![q(1, 3, &t)]),
        ("beyond max_seq", vec![q(1, 2, &long)]),
        ("token outside vocabulary", vec![q(0, 0, &[1, 2048])]),
        ("more tokens than the largest bucket", vec![q(0, 0, &long[..9])]),
        ("more tokens than the largest bucket, packed", vec![q(0, 0, &long[..5]), q(2, 0, &long[..4])]),
    ];
    for (what, seqs) in bad {
        let e = m.prefill(&seqs).err().ok_or(format!("{what} was accepted"))?;
        ensure(matches!(e, cuda_async::DeviceError::Shape { .. }), format!("{what}: {e}"))?;
    }
    ensure(m.prefill_in_bucket(&[q(0, 0, &t)], 5).is_err(), "bucket 5 accepted")?;
    ensure(m.prefill_in_bucket(&[q(0, 0, &[1; 5])], 4).is_err(), "5 tokens in bucket 4 accepted")?;
    ensure(m.slot_len(0) == Some(0) && m.slot_len(1) == Some(2), "a refusal moved a slot")?;
    let next = m.prefill(&[q(1, 2, &t), q(0, 0, &t)])?;
    ensure(next.iter().all(Option::is_some) && m.slot_len(1) == Some(5), format!("after refusals: {next:?}"))
}

/// A one-byte budget keeps one graph: decode and prefill buckets evict each other, and a
/// recaptured prefill bucket reproduces its logits exactly.
fn shared_budget_eviction() -> TestResult {
    let s = stream()?;
    let mut m = random_model(&s, ModelOptions { graph_budget_bytes: 1, ..opts() })?;
    let t = [5u32, 6, 7];
    m.prefill(&[PrefillSeq { slot: 0, start: 0, tokens: &t, want_next: true }])?;
    let first = m.last_prefill_logits()?;
    ensure(m.prefill_buckets().len() == 1 && m.buckets().is_empty(), "one prefill bucket")?;
    m.step(&[Row { slot: 1, position: 0, token: 3 }])?;
    ensure(
        m.evictions() == 1 && m.prefill_buckets().is_empty() && m.buckets().len() == 1,
        "prefill evicted",
    )?;
    m.release_slot(0)?;
    m.prefill(&[PrefillSeq { slot: 0, start: 0, tokens: &t, want_next: true }])?;
    ensure(m.evictions() == 2 && m.buckets().is_empty(), "decode bucket evicted")?;
    ensure(m.last_prefill_logits()? == first, "a recaptured prefill bucket reproduces its logits")
}

/// A bucket evicted and captured again takes the last results that lived in it with it: with one
/// decode and one prefill bucket and a budget that holds one, `capture_all` evicts the prefill
/// bucket and captures it again (fresh, its warm-up output in its buffers). Found by review: `last_prefill_logits` (and `last_logits`) then returned the new
/// bucket's warm-up output as the last results. (The decode side, `last_logits`, is cleared the same
/// way; `capture_all` captures decode buckets first, so this sequence cannot leave one recaptured.)
fn eviction_forgets_the_last_results() -> TestResult {
    let s = stream()?;
    let o = ModelOptions { graph_budget_bytes: 1, buckets: vec![1], prefill_buckets: vec![16], ..opts() };
    let mut m = random_model(&s, o)?;
    m.prefill(&[PrefillSeq { slot: 0, start: 0, tokens: &[5, 6, 7], want_next: true }])?;
    let logits = m.last_prefill_logits()?;
    ensure(logits.iter().all(|v| v.is_finite()) && logits.iter().any(|&v| v != 0.0), "the prefill's logits")?;
    m.capture_all()?;
    ensure(
        m.prefill_buckets().len() == 1 && m.buckets().is_empty(),
        "the prefill bucket captured again, last",
    )?;
    let e = m.last_prefill_logits();
    ensure(
        e.is_err(),
        format!("the last prefill's logits after its bucket was recaptured: {:?}", e.map(|l| l.len())),
    )
}

/// The reference directory of `gpu_llama`: `LLAMA_REF_DIR`, or the script's output.
fn reference_dir() -> Result<PathBuf, Failed> {
    if let Ok(d) = std::env::var("LLAMA_REF_DIR") {
        return Ok(d.into());
    }
    let rel = Path::new("scripts/hf_llama_reference.py");
    let mut roots: Vec<PathBuf> =
        std::env::current_dir().map(|d| d.ancestors().map(Path::to_path_buf).collect()).unwrap_or_default();
    roots.push(Path::new(env!("CARGO_MANIFEST_DIR")).join(".."));
    let script =
        roots.iter().map(|r| r.join(rel)).find(|p| p.exists()).ok_or("hf_llama_reference.py not found")?;
    let out = std::env::temp_dir().join(format!("cuda-async-prefill-ref-{}", std::process::id()));
    let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
    let res = std::process::Command::new(&python)
        .arg(&script)
        .args(["--out", &out.display().to_string(), "--shape", "small", "--steps", "16"])
        .output()?;
    ensure(
        res.status.success(),
        format!(
            "the reference script failed (or set LLAMA_REF_DIR): {}",
            String::from_utf8_lossy(&res.stderr)
        ),
    )?;
    Ok(out)
}

/// Hugging Face's logits: each reference prompt prefilled in two chunks, the logits at both
/// chunks' ends within PyTorch bf16's own error of the f32 reference (`gpu_llama`'s criterion).
fn hf_reference_prefill() -> TestResult {
    let dir = reference_dir()?;
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("reference.json"))?)?;
    let bytes = std::fs::read(dir.join("logits.safetensors"))?;
    let st = safetensors::SafeTensors::deserialize(&bytes)?;
    let s = stream()?;
    let cfg = LlamaConfig::from_hf_json(&std::fs::read_to_string(dir.join("config.json"))?)?;
    let w = HostWeights::from_safetensors(&dir.join("model.safetensors"), &cfg)?.upload(&s)?;
    let mut m = LlamaModel::new(&s, cfg, w, ModelOptions { prefill_buckets: vec![8, 16, 32, 64], ..opts() })?;
    let v = m.config().vocab;
    for (i, p) in json["prompts"].as_array().ok_or("no prompts")?.iter().enumerate() {
        let toks: Vec<u32> = p["tokens"]
            .as_array()
            .ok_or("no tokens")?
            .iter()
            .filter_map(|x| x.as_u64())
            .map(|x| x as u32)
            .collect();
        let ids = &toks[..toks.len() - 1];
        let bf16_err = p["bf16_max_abs_err"].as_f64().ok_or("no bf16 error")?;
        let t = st.tensor(&format!("p{i}.f32"))?;
        let want: Vec<f32> =
            t.data().chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
        let cut = ids.len() / 2;
        let slot = i as u32;
        for (a, e) in [(0, cut), (cut, ids.len())] {
            m.prefill(&[PrefillSeq { slot, start: a as u32, tokens: &ids[a..e], want_next: true }])?;
            let err = max_abs(&m.last_prefill_logits()?, &want[(e - 1) * v..e * v]);
            eprintln!("prompt {i} position {}: prefill vs f32 {err:.4e}; PyTorch bf16 {bf16_err:.4e}", e - 1);
            ensure(err <= bf16_err, format!("prompt {i} position {}: {err:.4e} > {bf16_err:.4e}", e - 1))?;
        }
    }
    Ok(())
}

/// Whether `token` is the draw `u` from `logits` at temperature `t` over the `k` largest logits
/// (ties with the k-th kept): the first token in index order whose running probability exceeds
/// `u`, within 1e-5 of its interval's ends (f32 sums on the GPU).
fn drawn_by(logits: &[f32], t: f32, k: usize, u: f64, token: usize) -> bool {
    let mut sorted = logits.to_vec();
    sorted.sort_by(|a, b| b.total_cmp(a));
    let (cut, m) = (sorted[k - 1], f64::from(sorted[0]));
    let w: Vec<f64> = logits
        .iter()
        .map(|&l| if l >= cut { ((f64::from(l) - m) / f64::from(t)).exp() } else { 0.0 })
        .collect();
    let total: f64 = w.iter().sum();
    let Some(&wt) = w.get(token) else { return false };
    let before = w[..token].iter().sum::<f64>() / total;
    wt > 0.0 && before - 1e-5 <= u && u <= before + wt / total + 1e-5
}

/// Sampling inside the prefill graph: greedy parameters give `prefill`'s tokens; a sampled piece
/// draws the same token alone and packed (same bucket, same seed), only from its top-k set, the
/// token the host draws from the piece's logits with `u = uniform(seed, position of the piece's
/// last token)` (the counter a decode step at that position uses), and different seeds draw
/// different tokens (so the sampler runs, with the staged parameters). Mutations caught: the
/// sampler outside the graph or the parameters not staged (greedy tokens), another counter
/// (the piece's start, or last + 1), the seed ignored.
fn prefill_sampled_draws() -> TestResult {
    let s = stream()?;
    let mut m = random_model(&s, opts())?;
    let v = m.config().vocab;
    let (a, b) = (tokens(9, 6, v), tokens(5, 7, v));
    let greedy = m.prefill_in_bucket(&[PrefillSeq { slot: 0, start: 0, tokens: &a, want_next: true }], 16)?;
    let lg = m.last_prefill_logits()?;
    m.release_slot(0)?;
    let greedy2 = m.prefill_sampled_in_bucket(
        &[PrefillSeq { slot: 0, start: 0, tokens: &a, want_next: true }],
        &[Sampling::GREEDY],
        16,
    )?;
    ensure(
        greedy == greedy2 && m.last_prefill_logits()? == lg,
        "greedy prefill_sampled differs from prefill",
    )?;
    let hot = |seed| Sampling { temperature: 1.5, top_p: 1.0, top_k: 5, seed };
    let mut drawn = std::collections::BTreeSet::new();
    for seed in 0..16u64 {
        m.release_slot(0)?;
        m.release_slot(1)?;
        let packed = m.prefill_sampled_in_bucket(
            &[
                PrefillSeq { slot: 1, start: 0, tokens: &b, want_next: true },
                PrefillSeq { slot: 0, start: 0, tokens: &a, want_next: true },
            ],
            &[Sampling::GREEDY, hot(seed)],
            16,
        )?;
        let t = packed[1].ok_or("no token")?;
        let mut sorted = lg.clone();
        sorted.sort_by(|x, y| y.total_cmp(x));
        ensure(lg[t as usize] >= sorted[4], format!("seed {seed}: token {t} is outside the top 5"))?;
        m.release_slot(0)?;
        let alone = m.prefill_sampled_in_bucket(
            &[PrefillSeq { slot: 0, start: 0, tokens: &a, want_next: true }],
            &[hot(seed)],
            16,
        )?;
        ensure(alone[0] == Some(t), format!("seed {seed}: alone {:?} vs packed {t}", alone[0]))?;
        ensure(m.last_prefill_logits()? == lg, format!("seed {seed}: the sampled prefill's logits differ"))?;
        let last = a.len() as u32 - 1;
        ensure(
            drawn_by(&lg, 1.5, 5, uniform(seed, last), t as usize),
            format!("seed {seed}: token {t} is not the draw u = uniform(seed, {last}) from the logits"),
        )?;
        drawn.insert(t);
    }
    ensure(drawn.len() >= 2, format!("16 seeds drew only {drawn:?}: the sampler did not run"))
}

fn main() {
    let mut s = Suite::new();
    s.gpu("append_then_cached_attention_split", append_then_cached_attention_split)
        .gpu("append_then_cached_attention_general", append_then_cached_attention_general)
        .gpu("append_then_cached_attention_unsplit", append_then_cached_attention_unsplit)
        .gpu("append_then_cached_attention_long", append_then_cached_attention_long)
        .gpu(
            "cached_attention_ignores_keys_past_its_position",
            cached_attention_ignores_keys_past_its_position,
        )
        .gpu("gather_rows_picks_rows", gather_rows_picks_rows)
        .gpu("prefill_matches_token_by_token", prefill_matches_token_by_token)
        .gpu("piece_alone_in_bucket_is_bit_identical", piece_alone_in_bucket_is_bit_identical)
        .gpu("refusals", refusals)
        .gpu("shared_budget_eviction", shared_budget_eviction)
        .gpu("eviction_forgets_the_last_results", eviction_forgets_the_last_results)
        .gpu("hf_reference_prefill", hf_reference_prefill)
        .gpu("prefill_sampled_draws", prefill_sampled_draws);
    s.run()
}

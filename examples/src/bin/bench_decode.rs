//! bench-decode: Llama decode latency per token, this project's graph replays vs PyTorch.
//!
//! The Llama-3.2-1B shape with random bf16 weights (or `--small`). For each batch size: fill
//! `--context` positions of `batch` sequences, then time `--steps` decode steps (each returns the
//! batch's greedy tokens to the host), `--reps` times; the median ms/step is the latency of a
//! served token. Reported beside it: eager launches of the same step, capture time and memory per
//! bucket, the share of the HBM bandwidth floor (weights + KV bytes read per step / 3.35 TB/s, the
//! datasheet figure) and the floor at the device-to-device copy bandwidth measured at start,
//! and at batch 1 the step awaited from tokio vs the blocking step (with, as a diagnostic of the
//! gap, the same future polled in a loop on the calling thread: no executor, no park). With Python
//! and torch present,
//! two PyTorch baselines run in the same process tree with the same steps and repetitions, and
//! their figures join the JSON: `scripts/torch_decode_bench.py` (key `torch`) decodes Hugging
//! Face transformers' `LlamaForCausalLM` eager, with a CUDA graph and with
//! `torch.compile(mode="reduce-overhead")`; `scripts/torch_static_decode.py` (key `gpt_fast`) is
//! PyTorch at its best — a hand-written static-cache Llama in the style of gpt-fast, eager, as a
//! CUDA graph, with `torch.compile` reduce-overhead and max-autotune (within a time limit), its
//! tokens checked against its own eager run, and its time to first token for 128/512/2048-token
//! prompts.
//!
//! Time to first token of this project (`--ttft`, batch 1): a prompt of N random ids prefilled
//! through the chunk graphs (`LlamaModel::prefill`: chunks of the largest prefill bucket, each one
//! graph replay of GEMMs over the chunk and a causal attention over the cache), from the host ids to
//! the first token back on the host; median of `--reps` after a warm-up that captures the buckets.
//!
//! Correctness (detects skipped work): graph and eager steps fed the same history choose the
//! same tokens, every timed step's tokens are valid ids, every repetition of a prefill gives the
//! same token, and the shortest prompt's prefill logits agree with the token-by-token decode path
//! (within 3% of the largest |logit|: the two round differently in bf16).

use anyhow::{ensure, Context, Result};
use clap::Parser;
use cuda_core::{Device, DeviceBuffer, Event, Stream};
use models::llama::{DeviceWeights, LlamaConfig, LlamaModel, ModelOptions, PrefillSeq, Row};
use serde_json::json;
use std::time::Instant;

#[derive(Parser)]
#[command(about = "Llama decode ms/token: graph replays vs eager vs PyTorch")]
struct Args {
    #[arg(long)]
    json: Option<String>,
    #[arg(long, default_value = "1,16,64", value_delimiter = ',')]
    batches: Vec<usize>,
    #[arg(long, default_value_t = 128)]
    context: usize,
    #[arg(long, default_value_t = 64)]
    steps: usize,
    #[arg(long, default_value_t = 5)]
    reps: usize,
    /// The small test shape instead of Llama-3.2-1B.
    #[arg(long)]
    small: bool,
    /// Skip the PyTorch baselines.
    #[arg(long)]
    no_torch: bool,
    /// Use cuBLAS GEMMs with separate norm/SwiGLU launches at every batch size (no fused
    /// small-batch products), for comparison.
    #[arg(long)]
    no_fused: bool,
    /// PyTorch modes to run.
    #[arg(long, default_value = "eager,cudagraph,compile")]
    torch_modes: String,
    #[arg(long, default_value = "python3")]
    python: String,
    /// Profile instead of timing: for each batch, fill the context, then run one graph step with
    /// an attached profiler's collection on (`Device::profile`; run under `ncu
    /// --profile-from-start off`); then the same for the prefill of each `--ttft` prompt (a
    /// warm-up and a timed run: ttft's repetitions, collected from the second); and exit.
    #[arg(long)]
    profile: bool,
    /// Variants of the gpt-fast style PyTorch baseline (`scripts/torch_static_decode.py`); empty
    /// skips it.
    #[arg(long, default_value = "eager,cuda_graph,compile_reduce_overhead,compile_max_autotune")]
    torch_static_variants: String,
    /// Seconds per batch size that `torch.compile(mode="max-autotune")` may take (compile and
    /// run) before it is reported as skipped.
    #[arg(long, default_value_t = 240)]
    torch_autotune_limit_s: u64,
    /// Prompt lengths of PyTorch's time-to-first-token measurement (batch 1); empty skips it.
    #[arg(long, default_value = "128,512,2048")]
    torch_ttft: String,
    /// Prompt lengths of this project's time-to-first-token measurement (batch 1, prefill
    /// graphs); empty skips it.
    #[arg(long, default_value = "128,512,2048", value_delimiter = ',')]
    ttft: Vec<usize>,
    /// Build the awaited rows' tokio runtimes with timers only (no I/O driver), as the comparison
    /// benchmarks do, instead of `enable_all` (a server's configuration, the default): an A/B of
    /// what the I/O driver's epoll park costs an awaited step.
    #[arg(long)]
    timers_only: bool,
    /// Interleaved rounds of the awaited-vs-blocking comparison at batch 1 (each round: blocking,
    /// awaited on a current-thread runtime, on a multi-thread one, and with the early wake off,
    /// each 1 + 2 repetitions of `--steps` steps).
    #[arg(long, default_value_t = 7, value_parser = clap::value_parser!(u32).range(1..))]
    await_rounds: u32,
}

/// The awaited rows' runtime: `enable_all` (a server's), or timers only with `--timers-only`.
fn awaited_runtime(timers_only: bool, multi_thread: bool) -> Result<tokio::runtime::Runtime> {
    if timers_only {
        return cuda_async_examples::bench::runtime(multi_thread, Some(2));
    }
    let mut b = if multi_thread {
        let mut b = tokio::runtime::Builder::new_multi_thread();
        b.worker_threads(2);
        b
    } else {
        tokio::runtime::Builder::new_current_thread()
    };
    Ok(b.enable_all().build()?)
}

const HBM_BYTES_PER_S: f64 = 3.35e12;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Fills slots `0..batch` with `context` positions, then times `reps` runs of `steps` steps;
/// returns the median ms/step. `mode`: 0 graph, 1 eager, 2 awaited graph, 3 the awaited graph's
/// future polled in a loop on the calling thread (no runtime: see [`poll_busy`]).
fn decode(
    m: &mut LlamaModel,
    rt: &tokio::runtime::Runtime,
    batch: usize,
    context: usize,
    steps: usize,
    reps: usize,
    mode: u8,
) -> Result<f64> {
    Ok(decode_steps(m, rt, batch, context, steps, reps, mode)?.0)
}

/// [`decode`], returning as well the wall time of every timed step on its own (µs; the
/// repetitions after the first, in order).
fn decode_steps(
    m: &mut LlamaModel,
    rt: &tokio::runtime::Runtime,
    batch: usize,
    context: usize,
    steps: usize,
    reps: usize,
    mode: u8,
) -> Result<(f64, Vec<f64>)> {
    let vocab = m.config().vocab as u32;
    for s in 0..batch as u32 {
        m.release_slot(s)?;
    }
    let mut tokens: Vec<u32> = (0..batch as u32).map(|s| (s * 7919 + 3) % vocab).collect();
    let mut pos = 0usize;
    let one = |m: &mut LlamaModel, tokens: &mut Vec<u32>, pos: usize, mode: u8| -> Result<()> {
        let rows: Vec<Row> =
            (0..batch).map(|s| Row { slot: s as u32, position: pos as u32, token: tokens[s] }).collect();
        *tokens = match mode {
            0 => m.step(&rows)?,
            1 => m.step_eager(&rows)?,
            2 => rt.block_on(m.step_async(&rows))?,
            _ => poll_busy(m.step_async(&rows))?,
        };
        ensure!(tokens.iter().all(|&t| t < vocab), "a step produced an invalid token (NaN logits?)");
        Ok(())
    };
    while pos < context {
        one(m, &mut tokens, pos, 0)?;
        pos += 1;
    }
    let (mut times, mut per_step) = (Vec::new(), Vec::new());
    for r in 0..=reps {
        let t = Instant::now();
        for _ in 0..steps {
            let s = Instant::now();
            one(m, &mut tokens, pos, mode)?;
            if r > 0 {
                per_step.push(s.elapsed().as_secs_f64() * 1e6);
            }
            pos += 1;
        }
        if r > 0 {
            times.push(t.elapsed().as_secs_f64() * 1e3 / steps as f64);
        }
    }
    Ok((median(times), per_step))
}

/// Drives `fut` to completion on the calling thread by polling it in a loop with a waker that does
/// nothing: no executor, no park and no wake-up. A diagnostic of the awaited step's gap: the same
/// future as on a runtime, so what it costs over the blocking step is the async path's own work,
/// and what the runtime's step costs over it is the executor's park, wake and resumption.
fn poll_busy<F: std::future::Future>(fut: F) -> F::Output {
    let mut fut = std::pin::pin!(fut);
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    loop {
        if let std::task::Poll::Ready(v) = fut.as_mut().poll(&mut cx) {
            return v;
        }
        std::hint::spin_loop();
    }
}

/// The device-to-device copy bandwidth of the GPU, counting the bytes read and written: 1 GiB
/// copied, the median of 10 copies timed with events after 2 untimed ones.
fn copy_bandwidth(stream: &Stream) -> Result<f64> {
    let n = 1usize << 30;
    let src = DeviceBuffer::<u8>::zeros(stream, n)?;
    let mut dst = DeviceBuffer::<u8>::zeros(stream, n)?;
    let (a, b) = (Event::new(stream.device(), true)?, Event::new(stream.device(), true)?);
    let mut ms = Vec::new();
    for i in 0..12 {
        a.record(stream)?;
        dst.copy_from_device(stream, &src)?;
        b.record(stream)?;
        b.synchronize()?;
        if i >= 2 {
            ms.push(f64::from(Event::elapsed_ms(&a, &b)?));
        }
    }
    let t = median(ms);
    ensure!(t > 0.0, "a 1 GiB copy took no measurable time");
    Ok(2.0 * n as f64 / (t * 1e-3))
}

/// Runs `f` and returns its result with the calling thread's CPU time over the wall time it took.
fn with_cpu_share(f: impl FnOnce() -> Result<f64>) -> Result<(f64, f64)> {
    fn cpu() -> f64 {
        let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        // SAFETY: a valid out-pointer; CLOCK_THREAD_CPUTIME_ID exists on Linux.
        unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
        ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
    }
    let (c0, t0) = (cpu(), Instant::now());
    let r = f()?;
    Ok((r, (cpu() - c0) / t0.elapsed().as_secs_f64().max(1e-9)))
}

/// A prompt of `n` pseudo-random ids below `vocab`.
fn prompt_ids(n: usize, vocab: u32) -> Vec<u32> {
    (0..n as u32).map(|i| i.wrapping_mul(2_654_435_761).wrapping_add(i) % vocab).collect()
}

/// Time to first token at batch 1 for a prompt of `n` ids (slot 0): prefill in chunks of the
/// largest prefill bucket, the last one wanting the next token; returns the median ms of `reps`
/// runs after one warm-up, and the token (the same in every run, or an error).
fn ttft(m: &mut LlamaModel, n: usize, reps: usize) -> Result<(f64, u32)> {
    ensure!(reps > 0 && n > 0, "time to first token needs a prompt and at least one repetition");
    let vocab = m.config().vocab as u32;
    let prompt = prompt_ids(n, vocab);
    let chunk = m.options().prefill_buckets.last().copied().unwrap_or(1);
    let mut times = Vec::new();
    let mut first = None;
    for r in 0..=reps {
        m.release_slot(0)?;
        let t = Instant::now();
        let mut token = None;
        for (i, piece) in prompt.chunks(chunk).enumerate() {
            let start = (i * chunk) as u32;
            let last = start as usize + piece.len() == n;
            token = m.prefill(&[PrefillSeq { slot: 0, start, tokens: piece, want_next: last }])?[0];
        }
        let ms = t.elapsed().as_secs_f64() * 1e3;
        let token = token.context("the last chunk returned no token")?;
        ensure!(token < vocab, "prefill of {n} ids produced an invalid token (NaN logits?)");
        ensure!(*first.get_or_insert(token) == token, "prefill of {n} ids is not deterministic");
        if r > 0 {
            times.push(ms);
        }
    }
    Ok((median(times), first.unwrap_or(0)))
}

/// The prefill's logits for a prompt of `n` ids agree with the decode path fed token by token:
/// every logit within 6 % of the largest |logit|, and the same argmax wherever the decode path's
/// top-2 margin is clear (above twice that). Returns the largest difference and that tolerance.
///
/// Two bf16 paths that round in different places (GEMMs over the chunk against products row by
/// row, a tiled attention against a per-row one) each sit up to PyTorch bf16's own error from the
/// f32 result; at the Llama-3.2-1B shape with random weights that error is about 0.11 on logits of
/// magnitude ~4 (`gpu_llama::hf_reference_1b_*`), so the two may differ by twice as much. The H100
/// run of the tiled prefill attention measured 0.119 against a largest |logit| of 3.92 (3.0 %),
/// past the 3 % this check had. Work skipped or garbled (a layer missing, a wrong position) moves
/// logits by the order of the logits themselves, and NaN fails.
fn check_prefill(m: &mut LlamaModel, n: usize) -> Result<(f32, f32)> {
    ttft(m, n, 1)?;
    let lp = m.last_prefill_logits()?;
    let vocab = m.config().vocab as u32;
    let prompt = prompt_ids(n, vocab);
    let ld = m.forced_logits(1, &prompt)?.pop().context("no logits")?;
    m.release_slot(1)?;
    let scale = ld.iter().fold(0f32, |a, &x| a.max(x.abs()));
    let diff = lp.iter().zip(&ld).fold(0f32, |a, (x, y)| {
        if x.is_nan() || y.is_nan() {
            f32::INFINITY
        } else {
            a.max((x - y).abs())
        }
    });
    let tol = 0.06 * scale;
    ensure!(
        diff <= tol,
        "prefill vs decode logits differ by {diff} (largest |logit| {scale}, tolerance {tol})"
    );
    let argmax = |l: &[f32]| l.iter().enumerate().fold(0, |b, (i, &v)| if v > l[b] { i } else { b });
    let mut sorted = ld.clone();
    sorted.sort_by(|a, b| b.total_cmp(a));
    if sorted[0] - sorted[1] > 2.0 * tol {
        ensure!(argmax(&lp) == argmax(&ld), "prefill vs decode: argmax {} vs {}", argmax(&lp), argmax(&ld));
    }
    println!("prefill vs decode logits, {n}-token prompt: largest difference {diff:.4} (tolerance {tol:.4})");
    Ok((diff, tol))
}

/// The operating system's share of any await: a thread parks, another spins for `wait` and then
/// unparks it; the median time from the unpark call to the parked thread running again. An
/// awaiting executor thread that went to sleep pays this on every wake-up, whatever wakes it.
fn park_wake_latency_us(wait: std::time::Duration) -> f64 {
    let mut lat = Vec::new();
    for _ in 0..50 {
        let (tx, rx) = std::sync::mpsc::channel::<Instant>();
        let sleeper = std::thread::spawn(move || {
            std::thread::park();
            let woke = Instant::now();
            rx.recv().map(|unparked| woke.saturating_duration_since(unparked)).unwrap_or_default()
        });
        let start = Instant::now();
        while start.elapsed() < wait {
            std::hint::spin_loop();
        }
        let unparked = Instant::now();
        sleeper.thread().unpark();
        let _ = tx.send(unparked);
        lat.push(sleeper.join().unwrap_or_default().as_secs_f64() * 1e6);
    }
    median(lat)
}

/// Runs `scripts/torch_static_decode.py` (the gpt-fast style PyTorch baseline) when it exists
/// and variants are asked for; its JSON, or `null` when it did not run (no Python or torch).
fn torch_static(a: &Args, batches: &str) -> Result<serde_json::Value> {
    let script = "scripts/torch_static_decode.py";
    if a.torch_static_variants.is_empty() || !std::path::Path::new(script).exists() {
        return Ok(serde_json::Value::Null);
    }
    let out = std::env::temp_dir().join(format!("torch-static-{}.json", std::process::id()));
    let st = std::process::Command::new(&a.python)
        .args([script, "--json", &out.display().to_string(), "--shape", if a.small { "small" } else { "1b" }])
        .args(["--batches", batches, "--context", &a.context.to_string(), "--steps", &a.steps.to_string()])
        .args(["--reps", &a.reps.to_string(), "--variants", &a.torch_static_variants])
        .args(["--autotune-limit", &a.torch_autotune_limit_s.to_string(), "--ttft", &a.torch_ttft])
        .status();
    // The script writes its JSON even when a variant fails; a crash leaves none.
    let j: serde_json::Value = match (st, std::fs::read_to_string(&out)) {
        (Ok(s), Ok(text)) => {
            if !s.success() {
                println!("PyTorch static-cache baseline exited with {s}; keeping what it wrote");
            }
            serde_json::from_str(&text)?
        }
        (st, _) => {
            println!("PyTorch static-cache baseline not run: {st:?}");
            return Ok(serde_json::Value::Null);
        }
    };
    let _ = std::fs::remove_file(&out);
    println!(
        "{:>5} {:>14} {:>14} {:>16} {:>16}",
        "batch", "static eager", "static graph", "reduce-overhead", "max-autotune"
    );
    for b in batches.split(',') {
        let get = |v: &str| {
            let e = &j["decode"][v][b];
            e["ms"].as_f64().map_or_else(
                || e.get("skipped").or(e.get("error")).map_or("-".into(), |x| x.to_string()),
                |v| format!("{v:.3}"),
            )
        };
        println!(
            "{b:>5} {:>14} {:>14} {:>16} {:>16}",
            get("eager"),
            get("cuda_graph"),
            get("compile_reduce_overhead"),
            get("compile_max_autotune")
        );
    }
    Ok(j)
}

fn main() -> Result<()> {
    let a = Args::parse();
    let dev = Device::new(0).context("no GPU")?;
    let stream = dev.new_stream()?;
    let cfg = if a.small { LlamaConfig::small() } else { LlamaConfig::llama_3_2_1b() };
    let w = DeviceWeights::random(&stream, &cfg, 5, 0.02)?;
    let longest_prompt = a.ttft.iter().copied().max().unwrap_or(0);
    let max_seq = (a.context + a.steps * (a.reps + 1) + 16).max(longest_prompt + 1);
    let max_batch = a.batches.iter().copied().max().unwrap_or(1);
    let opts = ModelOptions {
        slots: max_batch.max(2),
        max_seq,
        fused_small_batch: !a.no_fused,
        ..Default::default()
    };
    let mut m = LlamaModel::new(&stream, cfg.clone(), w, opts)?;
    m.capture_all()?;
    // The attention's split policy (CUDA_ASYNC_ATTN_SPLIT_MIN overrides the default).
    let split_min = kernels::llama::LlamaKernels::get(&dev)?.attention_split_min();
    let attn_warps = kernels::llama::LlamaKernels::get(&dev)?.attention_warps();
    let preload = kernels::gemv::Gemv::get(&dev)?.preloads();
    println!("attention (launches that split rows): {attn_warps} warps a block, at least {split_min} positions per split; products load weights early: {preload}");
    let rt = awaited_runtime(a.timers_only, false)?;
    if a.profile {
        for &b in &a.batches {
            decode(&mut m, &rt, b, a.context, 1, 1, 0)?;
            let rows: Vec<Row> = (0..b as u32)
                .map(|s| Row { slot: s, position: m.slot_len(s).unwrap_or(0), token: 7 })
                .collect();
            dev.profile(true)?;
            m.step(&rows)?;
            dev.profile(false)?;
            println!("profiled one graph step at batch {b}");
        }
        // Then one prefill of each `--ttft` prompt (its chunk graphs captured by an unprofiled
        // run first).
        for &n in &a.ttft {
            ttft(&mut m, n, 1)?;
            dev.profile(true)?;
            ttft(&mut m, n, 1)?;
            dev.profile(false)?;
            println!("profiled the prefill of a {n}-token prompt");
        }
        return Ok(());
    }

    // Correctness: slot 0 by graph replays, slot 1 by eager launches, same history.
    let (mut g, mut e) = (5u32, 5u32);
    m.release_slot(0)?;
    m.release_slot(1)?;
    for pos in 0..16u32 {
        g = m.step(&[Row { slot: 0, position: pos, token: g }])?[0];
        e = m.step_eager(&[Row { slot: 1, position: pos, token: e }])?[0];
        ensure!(g == e, "graph and eager disagree at position {pos}: {g} vs {e}");
    }

    // The floor at the bandwidth this GPU actually moves (a 1 GiB device-to-device copy, bytes
    // read and written), beside the datasheet's.
    let copy_bw = copy_bandwidth(&stream)?;
    println!(
        "device-to-device copy: {:.2} TB/s (read + written); datasheet HBM bandwidth {:.2} TB/s",
        copy_bw / 1e12,
        HBM_BYTES_PER_S / 1e12
    );
    let mut rows = Vec::new();
    println!(
        "{} on {}, context {} + {} steps, median of {} reps",
        if a.small { "small" } else { "Llama-3.2-1B" },
        dev.name(),
        a.context,
        a.steps,
        a.reps
    );
    println!(
        "{:>5} {:>10} {:>10} {:>10} {:>10} {:>12} {:>9}",
        "batch", "graph ms", "eager ms", "floor ms", "floor %", "copy floor", "tok/s"
    );
    for &b in &a.batches {
        let graph = decode(&mut m, &rt, b, a.context, a.steps, a.reps, 0)?;
        let eager = decode(&mut m, &rt, b, a.context, a.steps, a.reps.min(2), 1)?;
        let kv_len = a.context + a.steps * (a.reps + 1) / 2;
        let bytes = cfg.step_weight_bytes() + b * cfg.kv_bytes(kv_len);
        let floor = bytes as f64 / HBM_BYTES_PER_S * 1e3;
        let copy_floor = bytes as f64 / copy_bw * 1e3;
        println!(
            "{b:>5} {graph:>10.3} {eager:>10.3} {floor:>10.3} {:>9.1}% {copy_floor:>12.3} {:>9.0}",
            100.0 * floor / graph,
            b as f64 * 1e3 / graph
        );
        rows.push(json!({"batch": b, "graph_ms": graph, "eager_ms": eager, "floor_ms": floor, "floor_share": floor / graph,
            "copy_floor_ms": copy_floor, "bytes_per_step": bytes}));
    }
    // Awaited vs blocking at batch 1, interleaved: awaited on a current-thread runtime and on a
    // multi-thread one (block_on drives the step on the calling thread, as a task's poll would),
    // and with the early wake off; the calling thread's CPU time over wall time beside each.
    use cuda_async::scheduling::{await_spin_policy, set_await_spin_policy, AwaitSpin};
    let rt_mt = awaited_runtime(a.timers_only, true)?;
    let spin = await_spin_policy();
    let no_early = AwaitSpin { early_wake: std::time::Duration::ZERO, ..spin };
    let (mut blocking, mut awaited, mut awaited_mt, mut awaited_late) = (vec![], vec![], vec![], vec![]);
    let (mut cpu_bl, mut cpu_aw, mut cpu_late) = (vec![], vec![], vec![]);
    // Every timed step's own wall time (µs), pooled over the rounds: the goal's "median" is the
    // median step, which one slow step (an OS hiccup) does not move as it moves a run's mean.
    let (mut st_bl, mut st_aw, mut st_mt, mut st_late, mut st_busy) =
        (vec![], vec![], vec![], vec![], vec![]);
    let (mut woken, mut missed, mut awaited_steps) = (0u64, 0u64, 0u64);
    for _ in 0..a.await_rounds {
        let mut steps_cpu = |rt: &tokio::runtime::Runtime, mode: u8, into: &mut Vec<f64>| {
            with_cpu_share(|| {
                let (ms, steps) = decode_steps(&mut m, rt, 1, 8, a.steps, 2, mode)?;
                into.extend(steps);
                Ok(ms)
            })
        };
        let (ms, cpu) = steps_cpu(&rt, 0, &mut st_bl)?;
        blocking.push(ms);
        cpu_bl.push(cpu);
        let (w0, m0) = (cuda_async::early_wakes(), cuda_async::early_spin_misses());
        let (ms, cpu) = steps_cpu(&rt, 2, &mut st_aw)?;
        (woken, missed) =
            (woken + cuda_async::early_wakes() - w0, missed + cuda_async::early_spin_misses() - m0);
        // decode() fills 8 positions with blocking steps, then awaits 1 + 2 repetitions of `steps`.
        awaited_steps += 3 * a.steps as u64;
        awaited.push(ms);
        cpu_aw.push(cpu);
        awaited_mt.push(steps_cpu(&rt_mt, 2, &mut st_mt)?.0);
        set_await_spin_policy(no_early);
        let late = steps_cpu(&rt, 2, &mut st_late);
        set_await_spin_policy(spin);
        let (ms, cpu) = late?;
        awaited_late.push(ms);
        cpu_late.push(cpu);
        steps_cpu(&rt, 3, &mut st_busy)?;
    }
    let steps_timed = st_bl.len();
    let (sm_bl, sm_aw, sm_mt, sm_late, sm_busy) =
        (median(st_bl), median(st_aw), median(st_mt), median(st_late), median(st_busy));
    let (bl, aw, aw_mt, aw_late) =
        (median(blocking), median(awaited), median(awaited_mt), median(awaited_late));
    let (cpu_bl, cpu_aw, cpu_late) = (median(cpu_bl), median(cpu_aw), median(cpu_late));
    println!(
        "batch 1, 8 positions, {} rounds: blocking {bl:.4} ms/step, awaited from tokio {aw:.4} ms/step ({:+.1} us; \
         multi-thread runtime {aw_mt:.4}, {:+.1} us; early wake off {aw_late:.4}, {:+.1} us) (medians of the rounds' means)",
        a.await_rounds,
        (aw - bl) * 1e3,
        (aw_mt - bl) * 1e3,
        (aw_late - bl) * 1e3
    );
    println!(
        "median step of {steps_timed} each: blocking {sm_bl:.1} us, awaited {sm_aw:.1} us ({:+.1} us), multi-thread \
         {sm_mt:.1} us ({:+.1} us), early wake off {sm_late:.1} us ({:+.1} us)",
        sm_aw - sm_bl,
        sm_mt - sm_bl,
        sm_late - sm_bl
    );
    println!(
        "the same future polled in a loop on the calling thread (no runtime, no park): median step {sm_busy:.1} us \
         ({:+.1} us over blocking): the rest of the awaited gap is the executor's park, wake and resumption",
        sm_busy - sm_bl
    );
    println!(
        "early wakes: {woken} fired over {awaited_steps} awaited steps, {missed} of them spun out their window before the step ended"
    );
    println!(
        "calling thread on the CPU: blocking {:.0}%, awaited {:.0}%, awaited with the early wake off {:.0}%",
        cpu_bl * 100.0,
        cpu_aw * 100.0,
        cpu_late * 100.0
    );
    let wake_us = park_wake_latency_us(std::time::Duration::from_secs_f64(bl / 1e3));
    println!("OS floor: a thread parked for one step ({bl:.3} ms) runs {wake_us:.1} us after its unpark (median of 50)");
    let mut ttft_ms = serde_json::Map::new();
    let mut prefill_check = serde_json::Value::Null;
    if let Some(&shortest) = a.ttft.iter().min() {
        let (diff, tol) = check_prefill(&mut m, shortest)?;
        prefill_check = json!({ "prompt_tokens": shortest, "max_abs_diff": diff, "tolerance": tol });
    }
    for &n in &a.ttft {
        let (ms, _) = ttft(&mut m, n, a.reps)?;
        println!("time to first token, {n}-token prompt (prefill graphs, batch 1): {ms:.3} ms");
        ttft_ms.insert(n.to_string(), json!(ms));
    }
    let prefill_buckets: Vec<_> = m
        .prefill_buckets()
        .iter()
        .map(|b| json!({"chunk": b.batch, "capture_ms": b.capture_ms, "buffer_bytes": b.buffer_bytes, "graph_bytes": b.graph_bytes}))
        .collect();
    let buckets: Vec<_> = m
        .buckets()
        .iter()
        .map(|b| json!({"batch": b.batch, "capture_ms": b.capture_ms, "buffer_bytes": b.buffer_bytes, "graph_bytes": b.graph_bytes}))
        .collect();
    for b in m.buckets() {
        println!(
            "bucket {:>2}: capture {:6.2} ms, buffers {:7.2} MB, graph +{:.2} MB",
            b.batch,
            b.capture_ms,
            b.buffer_bytes as f64 / 1e6,
            b.graph_bytes as f64 / 1e6
        );
    }
    let mut torch = serde_json::Value::Null;
    let mut gpt_fast = serde_json::Value::Null;
    if !a.no_torch {
        let out = std::env::temp_dir().join(format!("torch-decode-{}.json", std::process::id()));
        let batches = a.batches.iter().map(|b| b.to_string()).collect::<Vec<_>>().join(",");
        drop(m); // free the GPU memory for PyTorch
        stream.synchronize()?;
        let st = std::process::Command::new(&a.python)
            .args([
                "scripts/torch_decode_bench.py",
                "--json",
                &out.display().to_string(),
                "--shape",
                if a.small { "small" } else { "1b" },
            ])
            .args([
                "--batches",
                &batches,
                "--context",
                &a.context.to_string(),
                "--steps",
                &a.steps.to_string(),
                "--reps",
                &a.reps.to_string(),
                "--modes",
                &a.torch_modes,
            ])
            .status();
        match st {
            Ok(s) if s.success() => torch = serde_json::from_str(&std::fs::read_to_string(&out)?)?,
            other => println!("Hugging Face transformers baselines not run: {other:?}"),
        }
        gpt_fast = torch_static(&a, &batches)?;
        if let serde_json::Value::Object(t) = &torch {
            println!(
                "{:>5} {:>10} {:>12} {:>12} {:>12}",
                "batch", "ours ms", "HF eager", "HF graph", "HF compile"
            );
            for r in &rows {
                let b = r["batch"].to_string();
                let get = |mode: &str| {
                    t.get(mode)
                        .and_then(|x| x.get(&b))
                        .and_then(|x| x.get("ms"))
                        .and_then(|x| x.as_f64())
                        .map_or("-".to_string(), |v| format!("{v:.3}"))
                };
                println!(
                    "{b:>5} {:>10.3} {:>12} {:>12} {:>12}",
                    r["graph_ms"].as_f64().unwrap_or(0.0),
                    get("eager"),
                    get("cudagraph"),
                    get("compile")
                );
            }
        }
    }
    let report = json!({
        "bench": "decode", "gpu": dev.name(), "shape": if a.small { "small" } else { "llama-3.2-1b" },
        "context": a.context, "steps": a.steps, "reps": a.reps, "rows": rows, "buckets": buckets,
        "copy_bytes_per_s": copy_bw, "datasheet_bytes_per_s": HBM_BYTES_PER_S,
        "await_vs_blocking_us": (aw - bl) * 1e3, "os_park_wake_us": wake_us, "await_rounds": a.await_rounds,
        "step_median_us": {"blocking": sm_bl, "awaited": sm_aw, "awaited_multi_thread": sm_mt, "awaited_no_early_wake": sm_late, "busy_polled": sm_busy, "steps_each": steps_timed},
        "busy_polled_vs_blocking_step_median_us": sm_busy - sm_bl,
        "await_vs_blocking_step_median_us": sm_aw - sm_bl, "await_multi_thread_vs_blocking_step_median_us": sm_mt - sm_bl,
        "tokio_runtime": if a.timers_only { "timers only, no I/O driver" } else { "enable_all (I/O driver and timers)" },
        "awaited_multi_thread_ms": aw_mt, "await_multi_thread_vs_blocking_us": (aw_mt - bl) * 1e3,
        "awaited_no_early_wake_ms": aw_late, "await_no_early_wake_vs_blocking_us": (aw_late - bl) * 1e3,
        "awaited_steps": awaited_steps, "early_wakes": woken, "early_spin_misses": missed,
        "blocking_cpu_share": cpu_bl, "awaited_cpu_share": cpu_aw, "awaited_no_early_wake_cpu_share": cpu_late, "fused_small_batch": !a.no_fused, "attention_split_min": split_min, "attention_warps": attn_warps, "gemv_preload": preload, "blocking_ms": bl, "awaited_ms": aw, "torch": torch,
        "gpt_fast": gpt_fast, "ttft": ttft_ms, "prefill_buckets": prefill_buckets, "prefill_vs_decode": prefill_check,
    });
    if let Some(p) = &a.json {
        std::fs::write(p, serde_json::to_string_pretty(&report)?)?;
    }
    Ok(())
}

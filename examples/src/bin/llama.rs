//! The main job: a Llama-style bf16 decoder whose decode step is one CUDA graph replay per
//! batch-size bucket.
//!
//! Without `--weights` it runs the small shape (`LlamaConfig::small()`) with weights drawn on the
//! GPU, so it needs no download; `--weights DIR` loads a Hugging Face `config.json` +
//! `model.safetensors` (e.g. from `scripts/hf_llama_reference.py`). It captures every bucket
//! (capture time and memory per bucket), checks that graph replays and eager launches of the same
//! step choose the same tokens for a batch of sequences, generates greedily, and times eager vs
//! graph decode at batch 1, 16 and 64.

use anyhow::{ensure, Context, Result};
use clap::Parser;
use cuda_core::Device;
use models::llama::{DeviceWeights, LlamaConfig, LlamaModel, ModelOptions, Row};
use std::path::PathBuf;
use std::time::Instant;

#[derive(Parser)]
#[command(about = "Llama decode from CUDA graphs: checks and timings")]
struct Args {
    /// A directory with Hugging Face's config.json and model.safetensors (default: the small
    /// shape with random weights).
    #[arg(long)]
    weights: Option<PathBuf>,
    /// Use the Llama-3.2-1B shape with random weights instead of the small one.
    #[arg(long)]
    llama_1b: bool,
    /// Context positions filled before timing.
    #[arg(long, default_value_t = 64)]
    context: usize,
    /// Timed decode steps per batch size.
    #[arg(long, default_value_t = 64)]
    steps: usize,
}

/// Feeds `len` positions of a deterministic token pattern to slots `0..batch`, then times
/// `steps` decode steps with `step`; returns ms per step.
fn time_decode(m: &mut LlamaModel, batch: usize, len: usize, steps: usize, eager: bool) -> Result<f64> {
    let vocab = m.config().vocab as u32;
    for s in 0..batch as u32 {
        m.release_slot(s)?;
    }
    let mut tokens: Vec<u32> = (0..batch as u32).map(|s| (s * 7 + 1) % vocab).collect();
    let run = |m: &mut LlamaModel, pos: usize, tokens: &mut Vec<u32>| -> Result<()> {
        let rows: Vec<Row> =
            (0..batch).map(|s| Row { slot: s as u32, position: pos as u32, token: tokens[s] }).collect();
        *tokens = if eager { m.step_eager(&rows)? } else { m.step(&rows)? };
        Ok(())
    };
    for pos in 0..len {
        run(m, pos, &mut tokens)?;
    }
    let t = Instant::now();
    for pos in len..len + steps {
        run(m, pos, &mut tokens)?;
    }
    Ok(t.elapsed().as_secs_f64() * 1e3 / steps as f64)
}

fn main() -> Result<()> {
    let args = Args::parse();
    let dev = Device::new(0).context("no GPU")?;
    let stream = dev.new_stream()?;
    println!("GPU: {} (compute capability {:?})", dev.name(), dev.compute_capability()?);
    let max_seq = (args.context + args.steps + 1).max(64);
    let opts = ModelOptions { slots: 64, max_seq, ..Default::default() };
    let mut m = match &args.weights {
        // `config.json` + `model.safetensors`, read, checked and uploaded in one call.
        Some(dir) => LlamaModel::from_hf_dir(&stream, dir, opts)?,
        None => {
            let cfg = if args.llama_1b { LlamaConfig::llama_3_2_1b() } else { LlamaConfig::small() };
            let w = DeviceWeights::random(&stream, &cfg, 1234, 0.05)?;
            LlamaModel::new(&stream, cfg, w, opts)?
        }
    };
    let cfg = m.config().clone();
    println!(
        "model: {} layers, hidden {}, {} heads / {} KV heads, vocab {}, {:.1} M parameters, {:.1} MB of bf16 weights",
        cfg.layers,
        cfg.hidden,
        cfg.heads,
        cfg.kv_heads,
        cfg.vocab,
        cfg.parameters() as f64 / 1e6,
        m.weights().bytes() as f64 / 1e6
    );
    m.capture_all()?;
    println!("KV cache: {:.1} MB (64 slots x {max_seq} positions)", m.kv_bytes() as f64 / 1e6);
    for b in m.buckets() {
        println!(
            "bucket {:>2}: captured in {:6.2} ms, buffers {:8.2} MB, graph +{:.2} MB",
            b.batch,
            b.capture_ms,
            b.buffer_bytes as f64 / 1e6,
            b.graph_bytes as f64 / 1e6
        );
    }
    for b in m.prefill_buckets() {
        println!(
            "prefill chunk {:>3}: captured in {:6.2} ms, buffers {:8.2} MB, graph +{:.2} MB",
            b.batch,
            b.capture_ms,
            b.buffer_bytes as f64 / 1e6,
            b.graph_bytes as f64 / 1e6
        );
    }

    // Graph replays and eager launches of the same steps choose the same tokens (8 sequences of
    // different prompts, slots 0..8 by graph and 8..16 eagerly).
    let mut g: Vec<u32> = (0..8).map(|i| (i * 31 + 5) % cfg.vocab as u32).collect();
    let mut e = g.clone();
    for s in 0..16 {
        m.release_slot(s)?;
    }
    for pos in 0..24u32 {
        let rg: Vec<Row> = (0..8).map(|i| Row { slot: i, position: pos, token: g[i as usize] }).collect();
        let re: Vec<Row> = (0..8).map(|i| Row { slot: 8 + i, position: pos, token: e[i as usize] }).collect();
        g = m.step(&rg)?;
        e = m.step_eager(&re)?;
        ensure!(g == e, "position {pos}: graph chose {g:?}, eager {e:?}");
    }
    println!("check: graph replays == eager launches for 8 sequences x 24 steps: ok");
    let gen = m.generate(0, &[1, 2, 3, 4], 16)?;
    println!("greedy continuation of [1, 2, 3, 4]: {gen:?}");

    println!("decode after {} context positions, {} timed steps:", args.context, args.steps);
    println!("{:>6} {:>12} {:>12} {:>8} {:>14}", "batch", "eager ms", "graph ms", "speedup", "graph tok/s");
    for batch in [1usize, 16, 64] {
        let eager = time_decode(&mut m, batch, args.context, args.steps, true)?;
        let graph = time_decode(&mut m, batch, args.context, args.steps, false)?;
        println!(
            "{batch:>6} {eager:>12.3} {graph:>12.3} {:>7.2}x {:>14.0}",
            eager / graph,
            batch as f64 * 1e3 / graph
        );
    }
    Ok(())
}

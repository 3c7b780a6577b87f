//! `llama-batch-bench`: the in-process batcher under the load `llama-load` puts on the HTTP
//! server (random prompts, a sampled and a cancelled fraction), optionally verified against
//! same-path replays, with a JSON report.

use clap::Parser;
use server::batcher::{spawn, BatcherConfig};
use server::fake::FakeEngine;
use server::llama_engine::{build_model, LlamaEngine, ModelSource};
use server::loadgen::{run, LoadConfig};
use std::path::PathBuf;

#[derive(Parser, Debug)]
#[command(name = "llama-batch-bench")]
struct Args {
    #[arg(long, default_value_t = 64)]
    clients: usize,
    #[arg(long, default_value_t = 2)]
    requests_per_client: usize,
    #[arg(long, default_value_t = 128)]
    prompt_tokens: usize,
    #[arg(long, default_value_t = 256)]
    max_tokens: u32,
    #[arg(long, default_value_t = 0.5)]
    sampled_fraction: f64,
    #[arg(long, default_value_t = 0.1)]
    cancel_fraction: f64,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Replay every completed stream alone along its path and compare.
    #[arg(long)]
    verify: bool,
    /// Write the report here.
    #[arg(long)]
    json: Option<PathBuf>,
    /// A Hugging Face folder to serve (as `llama-serve --model`); without it, seeded weights.
    #[arg(long)]
    model: Option<PathBuf>,
    /// Model shape of the seeded weights (without --model).
    #[arg(long, default_value = "small", value_parser = ["small", "1b"])]
    shape: String,
    /// Seed of the seeded weights (`llama-serve --seed`); `--seed` seeds the load.
    #[arg(long, default_value_t = 7)]
    model_seed: u64,
    #[arg(long, default_value_t = 64)]
    slots: usize,
    #[arg(long, default_value_t = 1024)]
    max_seq: usize,
    /// Prompt tokens per scheduling round (`llama-serve --prefill-chunk`).
    #[arg(long, default_value_t = 256)]
    prefill_chunk: u32,
    /// Use the CPU FakeEngine instead of the GPU (for a dry run).
    #[arg(long)]
    fake: bool,
    /// With `--fake`: every engine call (decode step or prefill call) takes this many
    /// microseconds, kept to the microsecond (a model of the GPU step, for timing the batcher's
    /// own overhead and the cost of prefill rounds between decode rounds). Without it, a tokio
    /// sleep of 200 µs (rounded up to the timer's millisecond).
    #[arg(long)]
    fake_step_us: Option<u64>,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    rt.block_on(bench(args))
}

async fn bench(args: Args) -> anyhow::Result<()> {
    let requests = args.clients * args.requests_per_client;
    let bcfg = BatcherConfig {
        max_queue: requests.max(1),
        prefill_chunk: args.prefill_chunk,
        eos: Vec::new(),
        paths_kept: if args.verify { requests } else { 0 },
    };
    let load = LoadConfig {
        clients: args.clients,
        requests_per_client: args.requests_per_client,
        prompt_tokens: args.prompt_tokens,
        max_tokens: args.max_tokens,
        sampled_fraction: args.sampled_fraction,
        cancel_fraction: args.cancel_fraction,
        seed: args.seed,
        verify: args.verify,
    };
    let (outcome, limits) = if args.fake {
        let e = FakeEngine::new(args.slots as u32, args.max_seq as u32, 2048, args.prefill_chunk);
        let e = match args.fake_step_us {
            Some(us) => e.with_precise_delay(std::time::Duration::from_micros(us)),
            None => e.with_delay(std::time::Duration::from_micros(200)),
        };
        let (h, task) = spawn(e, bcfg);
        let o = run(&h, &load).await?;
        h.shutdown(std::time::Duration::ZERO);
        let _ = task.await;
        (o, h.limits().clone())
    } else {
        let source = match &args.model {
            Some(dir) => ModelSource::HfDir(dir.clone()),
            None => ModelSource::Seeded { shape: args.shape.clone(), seed: args.model_seed },
        };
        let opts =
            models::llama::ModelOptions { slots: args.slots, max_seq: args.max_seq, ..Default::default() };
        let engine = LlamaEngine::start(move || build_model(&source, opts), args.prefill_chunk)?;
        let (h, task) = spawn(engine, bcfg);
        let o = run(&h, &load).await?;
        h.shutdown(std::time::Duration::ZERO);
        let _ = task.await;
        (o, h.limits().clone())
    };
    let report = serde_json::json!({
        "mode": "inprocess",
        "clients": args.clients,
        "requests": requests,
        "prompt_tokens": args.prompt_tokens,
        "max_tokens": args.max_tokens,
        "sampled_fraction": args.sampled_fraction,
        "cancel_fraction": args.cancel_fraction,
        "completed": outcome.completed,
        "cancelled": outcome.cancelled,
        "errors": outcome.errors,
        "generated_tokens": outcome.generated_tokens,
        "wall_s": outcome.wall_s,
        "tokens_per_s": outcome.generated_tokens as f64 / outcome.wall_s.max(1e-9),
        "ttft_ms": outcome.ttft_ms,
        "tpot_ms": outcome.tpot_ms,
        "verify": outcome.verify,
        "model": model_json(&args, limits.slots, limits.max_seq),
        "command": std::env::args().collect::<Vec<_>>().join(" "),
    });
    let text = serde_json::to_string_pretty(&report)?;
    println!("{text}");
    if let Some(p) = &args.json {
        std::fs::write(p, text + "\n")?;
    }
    if let Some(v) = &outcome.verify {
        anyhow::ensure!(
            v.mismatched_streams == 0,
            "{} streams differ from their same-path replay",
            v.mismatched_streams
        );
    }
    Ok(())
}

/// What the report says of the model: the seeded shape's name, or for `--model` the folder and
/// the dimensions of its `config.json` (the seeded `--shape` is not used then).
fn model_json(args: &Args, slots: u32, max_seq: u32) -> serde_json::Value {
    let (shape, config) = match (&args.model, args.fake) {
        (_, true) => ("fake".to_string(), serde_json::Value::Null),
        (None, false) => (args.shape.clone(), serde_json::Value::Null),
        (Some(dir), false) => {
            let cfg: serde_json::Value = std::fs::read_to_string(dir.join("config.json"))
                .ok()
                .and_then(|t| serde_json::from_str(&t).ok())
                .unwrap_or(serde_json::Value::Null);
            let keys = [
                "hidden_size",
                "num_hidden_layers",
                "num_attention_heads",
                "num_key_value_heads",
                "intermediate_size",
                "vocab_size",
            ];
            let picked: serde_json::Map<String, serde_json::Value> =
                keys.iter().filter_map(|k| cfg.get(*k).map(|v| (k.to_string(), v.clone()))).collect();
            ("hf-dir".to_string(), serde_json::Value::Object(picked))
        }
    };
    serde_json::json!({
        "shape": shape,
        "config": config,
        "dir": args.model.as_ref().map(|d| d.display().to_string()),
        "slots": slots,
        "max_seq": max_seq,
    })
}

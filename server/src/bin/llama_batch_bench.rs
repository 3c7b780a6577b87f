//! `llama-batch-bench`: the in-process batcher under the load `llama-load` puts on the HTTP
//! server (random prompts, a sampled and a cancelled fraction), optionally verified against
//! same-path replays, with a JSON report.

use clap::Parser;
use server::batcher::{spawn, BatcherConfig};
use server::fake::FakeEngine;
use server::llama_engine::LlamaEngine;
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
    /// Model shape (seeded random weights).
    #[arg(long, default_value = "small", value_parser = ["small", "1b"])]
    shape: String,
    #[arg(long, default_value_t = 64)]
    slots: usize,
    #[arg(long, default_value_t = 1024)]
    max_seq: usize,
    #[arg(long, default_value_t = 512)]
    prefill_chunk: u32,
    /// Use the CPU FakeEngine instead of the GPU (for a dry run).
    #[arg(long)]
    fake: bool,
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
        let e = FakeEngine::new(args.slots as u32, args.max_seq as u32, 2048, args.prefill_chunk)
            .with_delay(std::time::Duration::from_micros(200));
        let (h, task) = spawn(e, bcfg);
        let o = run(&h, &load).await?;
        h.shutdown(std::time::Duration::ZERO);
        let _ = task.await;
        (o, h.limits().clone())
    } else {
        let (shape, slots, max_seq, seed) = (args.shape.clone(), args.slots, args.max_seq, args.seed);
        let engine = LlamaEngine::start(
            move || {
                let stream =
                    cuda_core::Device::new(0).and_then(|d| d.new_stream()).map_err(|e| e.to_string())?;
                let cfg = if shape == "1b" {
                    models::llama::LlamaConfig::llama_3_2_1b()
                } else {
                    models::llama::LlamaConfig::small()
                };
                let w = models::llama::DeviceWeights::random(&stream, &cfg, seed, 0.02)
                    .map_err(|e| e.to_string())?;
                let opts = models::llama::ModelOptions { slots, max_seq, ..Default::default() };
                let mut m =
                    models::llama::LlamaModel::new(&stream, cfg, w, opts).map_err(|e| e.to_string())?;
                m.capture_all().map_err(|e| e.to_string())?;
                Ok(m)
            },
            args.prefill_chunk,
        )?;
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
        "model": {"shape": if args.fake { "fake".to_string() } else { args.shape.clone() }, "slots": limits.slots, "max_seq": limits.max_seq},
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

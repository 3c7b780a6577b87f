//! `llama-serve`: the OpenAI-compatible server. `--model DIR` serves a Hugging Face folder;
//! without it, seeded random weights (`--shape small|1b`) with the fixture tokenizer.

use anyhow::Context;
use clap::Parser;
use server::batcher::{spawn, BatcherConfig};
use server::http::{AppState, ServerConfig};
use server::llama_engine::{build_model, LlamaEngine, ModelSource};
use server::tokenizer::TextTokenizer;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

#[derive(Parser, Debug)]
#[command(name = "llama-serve", about = "OpenAI-compatible streaming server for the Llama decoder")]
struct Args {
    /// A Hugging Face folder (config.json, model.safetensors, tokenizer.json, tokenizer_config.json).
    #[arg(long)]
    model: Option<PathBuf>,
    /// Shape of the seeded random model when no --model is given.
    #[arg(long, default_value = "small", value_parser = ["small", "1b"])]
    shape: String,
    /// Seed of the random weights.
    #[arg(long, default_value_t = 7)]
    seed: u64,
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    #[arg(long, default_value_t = 8000)]
    port: u16,
    /// Bearer key required on /v1/*.
    #[arg(long)]
    api_key: Option<String>,
    /// KV-cache slots (sequences in flight).
    #[arg(long, default_value_t = 32)]
    slots: usize,
    /// Positions per sequence (prompt + generated).
    #[arg(long, default_value_t = 1024)]
    max_seq: usize,
    /// Requests that may wait for a slot (more get 503).
    #[arg(long, default_value_t = 256)]
    max_queue: usize,
    #[arg(long, default_value_t = 1 << 20)]
    max_body_bytes: usize,
    /// Prompt tokens per scheduling round.
    #[arg(long, default_value_t = 256)]
    prefill_chunk: u32,
    #[arg(long)]
    served_model_name: Option<String>,
    /// Record paths and serve POST /debug/replay.
    #[arg(long)]
    debug_replay: bool,
    /// Seconds running streams get to finish on shutdown.
    #[arg(long, default_value_t = 30)]
    shutdown_grace_s: u64,
    /// Connections open at once (more wait in the listen backlog).
    #[arg(long, default_value_t = 512)]
    max_connections: usize,
    /// Seconds a request's head (request line and headers) may take to arrive, and then its body.
    #[arg(long, default_value_t = 30)]
    header_timeout_s: u64,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    rt.block_on(serve(args))
}

async fn serve(args: Args) -> anyhow::Result<()> {
    let tok = match &args.model {
        Some(dir) => TextTokenizer::from_dir(dir)?,
        None => TextTokenizer::fixture()?,
    };
    let opts = models::llama::ModelOptions { slots: args.slots, max_seq: args.max_seq, ..Default::default() };
    let source = match &args.model {
        Some(dir) => ModelSource::HfDir(dir.clone()),
        None => ModelSource::Seeded { shape: args.shape.clone(), seed: args.seed },
    };
    let engine = LlamaEngine::start(move || build_model(&source, opts), args.prefill_chunk)
        .context("starting the model")?;
    let limits = server::engine::Engine::limits(&engine);
    anyhow::ensure!(
        tok.vocab_size() <= limits.vocab as usize,
        "the tokenizer's vocabulary ({}) exceeds the model's ({})",
        tok.vocab_size(),
        limits.vocab
    );
    let name = args.served_model_name.clone().unwrap_or_else(|| match &args.model {
        Some(d) => d.file_name().map_or("model".into(), |n| n.to_string_lossy().into_owned()),
        None => format!("llama-random-{}", args.shape),
    });
    let bcfg = BatcherConfig {
        max_queue: args.max_queue,
        prefill_chunk: args.prefill_chunk,
        eos: tok.eos_ids().to_vec(),
        paths_kept: if args.debug_replay { 10_000 } else { 0 },
    };
    let (handle, task) = spawn(engine, bcfg);
    let state = Arc::new(AppState {
        batcher: handle,
        tok: Arc::new(tok),
        cfg: ServerConfig {
            model_name: name,
            api_key: args.api_key.clone(),
            max_body_bytes: args.max_body_bytes,
            debug_replay: args.debug_replay,
            conn: server::listen::ConnLimits {
                max_connections: args.max_connections.max(1),
                header_read_timeout: std::time::Duration::from_secs(args.header_timeout_s.max(1)),
                body_read_timeout: std::time::Duration::from_secs(args.header_timeout_s.max(1)),
            },
        },
        metrics: server::metrics::recorder(),
    });
    let addr = format!("{}:{}", args.host, args.port);
    let listener = tokio::net::TcpListener::bind(&addr).await.with_context(|| format!("binding {addr}"))?;
    eprintln!("llama-serve: listening on http://{}", listener.local_addr()?);
    let grace = Duration::from_secs(args.shutdown_grace_s);
    let signal = async move {
        shutdown_signal().await;
        eprintln!("llama-serve: shutting down (grace {grace:?})");
    };
    server::shutdown::serve_until(listener, state, signal, grace, task).await?;
    Ok(())
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! { _ = ctrl_c => {}, _ = term => {} }
}

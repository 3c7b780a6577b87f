//! `llama-load`: drives an OpenAI-compatible completion server (`llama-serve`) on loopback with
//! concurrent streamed completions and checks what comes back (see
//! `cuda_async_examples::load`).
//!
//! `llama-load --url http://127.0.0.1:8000 --clients 64 --requests-per-client 2 --prompt-tokens 128
//! --max-tokens 256 --sampled-fraction 0.5 --cancel-fraction 0.1 --seed 1 --vocab 128256 --verify
//! --json load.json --timeout-s 120`
//!
//! Prints a summary, writes the JSON report with `--json`, and exits 1 if any request failed, a
//! replay differed, or the server's gauges were not back to 0 after the load.

use anyhow::{Context, Result};
use clap::Parser;
use cuda_async_examples::load::{run_load, LoadOptions};
use std::path::PathBuf;

/// Load generator and checker for an OpenAI-compatible completion server on loopback.
#[derive(Parser)]
struct Args {
    #[command(flatten)]
    load: LoadOptions,
    /// Also write the report as JSON to PATH
    #[arg(long, value_name = "PATH")]
    json: Option<PathBuf>,
}

fn main() -> Result<()> {
    let a = Args::parse();
    a.load.validate()?;
    let command = std::env::args().collect::<Vec<_>>().join(" ");
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().context("starting tokio")?;
    let report = rt.block_on(run_load(&a.load, command))?;
    print!("{}", report.summary());
    if let Some(path) = &a.json {
        let text = serde_json::to_string_pretty(&report).context("serialising the report")?;
        std::fs::write(path, text + "\n").with_context(|| format!("writing {}", path.display()))?;
        println!("wrote {}", path.display());
    }
    let failures = report.failures();
    if failures.is_empty() {
        println!("llama-load: passed");
        Ok(())
    } else {
        for f in &failures {
            eprintln!("llama-load: FAILED: {f}");
        }
        std::process::exit(1);
    }
}

//! Writes the picture of the MLP's forward graph: the DOT text that the driver prints
//! (`cuGraphDebugDotPrint`, plain and verbose) and, where Graphviz `dot` is installed, an SVG.
//!
//! `cargo run --release -p cuda-async-examples --bin graph-picture -- [--out DIR]` (default `docs`)

use cuda_async_examples::bench::{self, ctx, OptSpec};
use cuda_async_examples::mlp::{GraphMlp, MlpWeights};
use cuda_core::Stream;
use std::path::PathBuf;
use std::process::{Command, ExitCode};
use std::sync::Arc;

const SPEC: &[OptSpec] =
    &[OptSpec { name: "--out", value: "DIR", help: "where to write the files (default docs)" }];

fn main() -> ExitCode {
    bench::main_with("graph-picture", run)
}

fn run() -> Result<(), String> {
    let Some(opts) = bench::Options::from_env_or_usage("graph-picture", "the MLP graph as DOT / SVG", SPEC)?
    else {
        return Ok(());
    };
    let out = PathBuf::from(opts.get("--out").unwrap_or("docs"));
    std::fs::create_dir_all(&out).map_err(|e| format!("creating {}: {e}", out.display()))?;
    let dev = bench::open_device()?;
    let s = Stream::new(&dev).map_err(ctx("Stream::new"))?;
    let weights = Arc::new(MlpWeights::random(&s, 7, &[1024; 5]).map_err(ctx("weights"))?);
    let model = GraphMlp::new(weights, &s, 16).map_err(ctx("GraphMlp::new"))?;
    let graph = model.graph().graph();
    println!(
        "MLP graph: {} nodes of types {:?}",
        graph.node_count().map_err(ctx("nodes"))?,
        graph.node_types().map_err(ctx("types"))?
    );
    for (name, verbose) in [("mlp-graph.dot", false), ("mlp-graph-verbose.dot", true)] {
        let path = out.join(name);
        graph.write_dot(&path, verbose).map_err(ctx("write_dot"))?;
        println!("wrote {}", path.display());
    }
    let svg = out.join("mlp-graph.svg");
    match Command::new("dot").arg("-Tsvg").arg(out.join("mlp-graph.dot")).arg("-o").arg(&svg).status() {
        Ok(st) if st.success() => println!("wrote {}", svg.display()),
        Ok(st) => println!("dot failed ({st}); render {} yourself", out.join("mlp-graph.dot").display()),
        Err(_) => println!("Graphviz `dot` is not installed (apt-get install graphviz); DOT files written"),
    }
    Ok(())
}

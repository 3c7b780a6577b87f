//! Writes the picture of the MLP's forward graph: the DOT text that the driver prints
//! (`cuGraphDebugDotPrint`, plain and verbose) and, where Graphviz `dot` is installed, an SVG.
//!
//! `cargo run --release -p cuda-async-examples --bin graph-picture -- [--out DIR]` (default `docs`)

use anyhow::{Context, Result};
use clap::Parser;
use cuda_async_examples::bench;
use cuda_core::Stream;
use models::mlp::{GraphMlp, MlpWeights};
use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;

/// The MLP graph as DOT / SVG.
#[derive(Parser)]
struct Args {
    /// Where to write the files
    #[arg(long, value_name = "DIR", default_value = "docs")]
    out: PathBuf,
}

fn main() -> Result<()> {
    let out = Args::parse().out;
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    let s = Stream::new(&bench::open_device()?)?;
    let weights = Arc::new(MlpWeights::random(&s, 7, &[1024; 5])?);
    let model = GraphMlp::new(weights, &s, 16)?;
    let graph = model.graph().graph();
    println!("MLP graph: {} nodes of types {:?}", graph.node_count()?, graph.node_types()?);
    for (name, verbose) in [("mlp-graph.dot", false), ("mlp-graph-verbose.dot", true)] {
        graph.write_dot(&out.join(name), verbose)?;
        println!("wrote {}", out.join(name).display());
    }
    let (dot, svg) = (out.join("mlp-graph.dot"), out.join("mlp-graph.svg"));
    match Command::new("dot").arg("-Tsvg").arg(&dot).arg("-o").arg(&svg).status() {
        Ok(st) if st.success() => println!("wrote {}", svg.display()),
        Ok(st) => println!("dot failed ({st}); render {} yourself", dot.display()),
        Err(_) => println!("Graphviz `dot` is not installed (apt-get install graphviz); DOT files written"),
    }
    Ok(())
}

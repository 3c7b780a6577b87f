//! A 4-layer MLP (width 1024, f32) run eagerly and as a replayed CUDA graph: checks both against
//! an f64 host reference at batch 1 and 16, then times them.
//!
//! `cargo run --release -p cuda-async-examples --bin mlp -- [--json PATH] [--repeats N]`
//!
//! Checks (exit code 1 if any fails): the maximum error of each output relative to the
//! reference's scale, `max|out - ref| / max(1, max|ref|)`, is below 1e-4 (f32 accumulation over
//! 1024 terms per layer), and the graph's output equals the eager one to 1e-6 of its scale (same
//! kernels, same launch shapes: it is normally bitwise equal). A second input checks that replays
//! read the new input.
//!
//! Timings (medians over `--repeats` samples after `--warmup` runs; raw column = eager, framework
//! column = graph):
//! - full forward, host wall-clock: input on the host to output on the host. Eager: one chain
//!   `from_host` → 4 × `linear` (each into a fresh `zeros` buffer) → `to_host` (a new page-locked
//!   buffer), `sync_on`. Graph: host memcpy into a page-locked staging buffer, async copy in, one
//!   replay, async copy out, `sync_on`. Also the eager chain read back with a blocking `to_vec`
//!   instead of `to_host`, to show what the per-pass page-locked allocation costs;
//! - layers only, host wall-clock: the 4 launches over preallocated buffers as an eager chain
//!   (`sync_on`) vs one graph replay (`sync_on`);
//! - layers only, GPU time: the same, timed with CUDA events recorded on the stream around it.

use anyhow::{bail, Result};
use clap::Parser;
use cuda_async::{value, DeviceError, DeviceOpExt, ExecutionContext, Module};
use cuda_async_examples::bench::{self, Case, Report, Runner};
use cuda_core::{DeviceBuffer, Event, Stream};
use kernels::Kernels;
use models::mlp::{max_abs_diff, max_rel_error, EagerMlp, GraphMlp, MlpWeights, DIMS};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

/// 4-layer MLP: eager vs CUDA graph, checked and timed.
#[derive(Parser, serde::Serialize)]
struct Args {
    /// Also write the results as JSON to PATH
    #[arg(long, value_name = "PATH")]
    #[serde(skip)]
    json: Option<PathBuf>,
    /// Timed samples per measurement, at least 50
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u64).range(50..))]
    repeats: u64,
    /// Untimed runs of each measurement first
    #[arg(long, default_value_t = 20)]
    warmup: usize,
    /// Seed of the weights and inputs
    #[arg(long, default_value_t = 24301)]
    seed: u64,
}

/// The bound on the error relative to the reference's scale.
const TOL: f64 = 1e-4;
/// The bound on graph vs eager, relative to the eager output's scale.
const SAME_TOL: f64 = 1e-6;
/// Batch sizes checked and timed.
const BATCHES: [usize; 2] = [1, 16];

fn main() -> Result<()> {
    let a = Args::parse();
    let dev = bench::open_device()?;
    let stream = Stream::new(&dev)?;
    let t = Instant::now();
    Kernels::get(&dev)?;
    let compile_ms = t.elapsed().as_secs_f64() * 1e3;
    let weights = Arc::new(MlpWeights::random(&stream, a.seed, &DIMS)?);
    let ((maj, min), (cc_maj, cc_min)) = (cuda_core::driver_version()?, dev.compute_capability()?);
    println!(
        "{} (sm_{cc_maj}{cc_min}), CUDA driver {maj}.{min}; kernels ready in {compile_ms:.1} ms",
        dev.name()
    );
    println!("MLP {DIMS:?}, f32, ReLU between layers; seed {}", a.seed);

    let mut report = Report::new("mlp");
    report.meta("gpu", dev.name());
    report.meta("compute_capability", format!("{cc_maj}.{cc_min}"));
    report.meta("cuda_driver", format!("{maj}.{min}"));
    report.meta("nvidia_kernel_module", bench::nvidia_kernel_module_version());
    report.meta("date_utc", bench::utc_now());
    report.meta("dims", format!("{DIMS:?}"));
    report.meta_from(&a);
    report.meta("tolerance_rel", TOL);
    let mut run = Runner::new(report, a.repeats as usize, a.warmup);

    let mut ok = true;
    for batch in BATCHES {
        let mut rng = StdRng::seed_from_u64(a.seed ^ (batch as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15));
        let eager = EagerMlp::new(weights.clone(), stream.clone());
        let mut graph = GraphMlp::new(weights.clone(), &stream, batch)?;
        if batch == BATCHES[0] {
            run.report.meta("graph_nodes", graph.graph().graph().node_count()?);
        }
        ok &= check(&weights, &eager, &mut graph, &mut rng, &mut run.report)?;
        measure(&weights, &eager, &mut graph, &stream, &mut rng, &mut run)?;
    }
    run.report.meta("all_checks_passed", ok);
    let verdict =
        if ok { Ok("ok".to_string()) } else { Err(anyhow::anyhow!("an output differs from its reference")) };
    if let Err(e) = run.report.publish(verdict, a.json.as_deref()) {
        bail!("FAILED: {e:#} beyond the bound (see above)");
    }
    println!("ok");
    Ok(())
}

fn random_input(rng: &mut StdRng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.random_range(-1.0..1.0)).collect()
}

/// The correctness checks of one batch size; returns whether all passed.
fn check(
    w: &MlpWeights,
    eager: &EagerMlp,
    graph: &mut GraphMlp,
    rng: &mut StdRng,
    report: &mut Report,
) -> Result<bool> {
    let batch = graph.batch();
    let mut ok = true;
    for round in 0..2 {
        let input = random_input(rng, graph.input_len());
        let reference = w.host_forward_f64(&input, batch);
        let e = eager.forward(&input)?;
        let g = graph.forward(input.clone())?;
        let (err_e, err_g) = (max_rel_error(&e, &reference), max_rel_error(&g, &reference));
        let scale = e.iter().fold(1.0f64, |m, &v| m.max(f64::from(v).abs()));
        let diff = max_abs_diff(&g, &e) / scale;
        let bitwise = g.len() == e.len() && g.iter().zip(&e).all(|(a, b)| a.to_bits() == b.to_bits());
        let pass = err_e < TOL && err_g < TOL && diff <= SAME_TOL;
        println!(
            "batch {batch:>2}, input {round}: max rel error vs f64 host: eager {err_e:.2e}, graph {err_g:.2e} \
             (bound {TOL:.0e}); graph vs eager {diff:.2e}{} -> {}",
            if bitwise { " (bitwise equal)" } else { "" },
            if pass { "ok" } else { "MISMATCH" }
        );
        if round == 0 {
            report.meta(&format!("batch{batch}_eager_max_rel_err"), err_e);
            report.meta(&format!("batch{batch}_graph_max_rel_err"), err_g);
            report.meta(&format!("batch{batch}_graph_vs_eager_rel_diff"), diff);
            report.meta(&format!("batch{batch}_graph_bitwise_equal_eager"), bitwise);
        }
        ok &= pass;
    }
    Ok(ok)
}

/// A step of a chain that records `ev` on the chain's stream.
fn record(ev: &Event) -> impl FnOnce((), &ExecutionContext<'_>) -> Result<(), DeviceError> + Send + '_ {
    move |(), ctx| ev.record(ctx.stream()).map_err(DeviceError::from)
}

/// The timings of one batch size.
fn measure(
    w: &MlpWeights,
    eager: &EagerMlp,
    graph: &mut GraphMlp,
    stream: &Stream,
    rng: &mut StdRng,
    run: &mut Runner,
) -> Result<()> {
    let batch = graph.batch();
    let input = random_input(rng, graph.input_len());
    const NOTE: &str = "raw = eager chain, framework = graph replay (ratio < 1: the graph is faster)";

    let case = Case::new(format!("batch {batch}: full forward, host wall"), "us", 1, || {
        graph.run(&input)?;
        Ok(())
    });
    let case = case.raw(|| {
        eager.forward(&input)?;
        Ok(())
    });
    run.run(case.note(NOTE))?;
    let case = Case::new(format!("batch {batch}: eager full forward read by to_vec"), "us", 1, || {
        eager.device_op(&input)?.sync_on(stream)?.to_vec()?;
        Ok(())
    });
    run.run(case.note(
        "the eager chain without to_host: output read by a blocking DeviceBuffer::to_vec (no page-locked \
         allocation per pass)",
    ))?;

    // Layers only, over preallocated buffers holding the same input.
    let dx = DeviceBuffer::from_host(stream, &input)?;
    let mut acts = w.alloc_activations(stream, batch)?;
    let g = &*graph;
    let case = Case::new(format!("batch {batch}: layers only, host wall"), "us", 1, || {
        Ok(g.graph().launch().sync_on(stream)?)
    });
    let case = case.raw(|| {
        w.layers_into(&dx, &mut acts, batch)?.sync_on(stream)?;
        Ok(())
    });
    run.run(
        case.note("4 launches over preallocated buffers (eager chain, sync_on) vs one replay (sync_on)"),
    )?;

    let (start, end) = (Event::new(stream.device(), true)?, Event::new(stream.device(), true)?);
    let elapsed = |s: &Event, e: &Event| -> Result<f64> { Ok(f64::from(Event::elapsed_ms(s, e)?) * 1e-3) };
    let case = Case::new(format!("batch {batch}: layers only, GPU time"), "us", 1, || {
        let replay = value(()).and_then_with_context(record(&start)).then(|()| g.graph().launch());
        replay.and_then_with_context(record(&end)).sync_on(stream)?;
        elapsed(&start, &end)
    });
    let case = case.raw(|| {
        let layers = w.layers_into(&dx, &mut acts, batch)?;
        let chain = value(()).and_then_with_context(record(&start)).then(|()| layers).map(drop);
        chain.and_then_with_context(record(&end)).sync_on(stream)?;
        elapsed(&start, &end)
    });
    run.run(case.note("CUDA events recorded on the stream before and after the layers"))?;
    Ok(())
}

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
//! Timings (medians over `--repeats` samples after `--warmup` runs of each, interleaved):
//! - full forward, host wall-clock: input on the host to output on the host. Eager: one chain
//!   `from_host` → 4 × `linear` (each into a fresh `zeros` buffer) → `to_host` (a new page-locked
//!   buffer), `sync_on`. Graph: host memcpy into a page-locked staging buffer, async copy in, one
//!   replay, async copy out, `sync_on`, copy out of the staging buffer. Also the eager chain read
//!   back with a blocking `to_vec` instead of `to_host`, to show what the per-pass page-locked
//!   allocation costs;
//! - layers only, host wall-clock: the 4 launches over preallocated buffers as an eager chain
//!   (`sync_on`) vs one graph replay (`sync_on`);
//! - layers only, GPU time: the same, timed with CUDA events recorded on the stream around it.

use cuda_async::{value, DeviceError, DeviceOpExt, ExecutionContext, Module};
use cuda_async_examples::bench::{self, OptSpec, Options, Report, Row, SplitMix64, JSON_OPT};
use cuda_async_examples::mlp::{max_abs_diff, max_rel_error, EagerMlp, GraphMlp, MlpWeights, DIMS};
use cuda_core::{Device, DeviceBuffer, Event, Stream};
use kernels::Kernels;
use std::error::Error;
use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

/// The bound on the error relative to the reference's scale.
const TOL: f64 = 1e-4;
/// The bound on graph vs eager, relative to the eager output's scale.
const SAME_TOL: f64 = 1e-6;
/// Batch sizes checked and timed.
const BATCHES: [usize; 2] = [1, 16];

const SPEC: [OptSpec; 4] = [
    JSON_OPT,
    OptSpec {
        name: "--repeats",
        value: "N",
        help: "timed samples per measurement, at least 50 (default 200)",
    },
    OptSpec { name: "--warmup", value: "N", help: "untimed runs of each measurement first (default 20)" },
    OptSpec { name: "--seed", value: "S", help: "seed of the weights and inputs (default 24301)" },
];

fn main() -> ExitCode {
    match run() {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            eprintln!("FAILED: an output differs from its reference beyond the bound (see above)");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn random_input(rng: &mut SplitMix64, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.f32_in(-1.0, 1.0)).collect()
}

/// The correctness checks of one batch size; returns whether all passed.
fn check(
    weights: &MlpWeights,
    eager: &EagerMlp,
    graph: &mut GraphMlp,
    rng: &mut SplitMix64,
    report: &mut Report,
) -> Result<bool, Box<dyn Error>> {
    let batch = graph.batch();
    let mut ok = true;
    for round in 0..2 {
        let input = random_input(rng, graph.input_len());
        let reference = weights.host_forward_f64(&input, batch);
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

/// Wall-clock microseconds of `f`.
fn timed(f: impl FnOnce() -> Result<(), DeviceError>) -> Result<f64, DeviceError> {
    let t = Instant::now();
    f()?;
    Ok(t.elapsed().as_secs_f64() * 1e6)
}

/// A step of a chain that records `ev` on the chain's stream.
fn record(ev: &Event) -> impl FnOnce((), &ExecutionContext<'_>) -> Result<(), DeviceError> + Send + '_ {
    move |(), ctx| ev.record(ctx.stream()).map_err(DeviceError::from)
}

type Sampler<'a> = &'a mut dyn FnMut() -> Result<f64, DeviceError>;

/// Runs every sampler `warmup` times, then takes `repeats` interleaved samples of each.
fn sample(warmup: usize, repeats: usize, fs: &mut [Sampler<'_>]) -> Result<Vec<Vec<f64>>, DeviceError> {
    for f in fs.iter_mut() {
        for _ in 0..warmup {
            f()?;
        }
    }
    bench::rotating(repeats, fs)
}

/// The timings of one batch size, as report rows.
fn measure(
    weights: &MlpWeights,
    eager: &EagerMlp,
    graph: &mut GraphMlp,
    stream: &Stream,
    rng: &mut SplitMix64,
    (warmup, repeats): (usize, usize),
) -> Result<Vec<Row>, Box<dyn Error>> {
    let batch = graph.batch();
    let input = random_input(rng, graph.input_len());
    const NOTE: &str = "raw = eager chain, framework = graph replay (ratio < 1: the graph is faster)";

    // Full forward passes, host to host.
    let mut eager_full = || timed(|| eager.forward(&input).map(drop));
    let mut eager_to_vec = || {
        timed(|| {
            eager.device_op(&input)?.sync_on(stream)?.to_vec()?;
            Ok(())
        })
    };
    let mut graph_full = || timed(|| graph.run(&input).map(drop));
    let full = sample(warmup, repeats, &mut [&mut eager_full, &mut graph_full, &mut eager_to_vec])?;
    let [eager_full, graph_full, eager_to_vec]: [Vec<f64>; 3] =
        full.try_into().map_err(|_| "three sample sets expected")?;

    // Layers only, over preallocated buffers holding the same input.
    let dx = DeviceBuffer::from_host(stream, &input)?;
    let mut acts = weights.alloc_activations(stream, batch)?;
    let (start, end) = (Event::new(stream.device(), true)?, Event::new(stream.device(), true)?);
    let g = &*graph;
    let mut eager_dev = || timed(|| weights.layers_into(&dx, &mut acts, batch)?.sync_on(stream).map(drop));
    let mut graph_dev = || timed(|| g.graph().launch().sync_on(stream));
    let dev = sample(warmup, repeats, &mut [&mut eager_dev, &mut graph_dev])?;
    let [eager_dev, graph_dev]: [Vec<f64>; 2] = dev.try_into().map_err(|_| "two sample sets expected")?;

    let elapsed_us =
        |s: &Event, e: &Event| -> Result<f64, DeviceError> { Ok(f64::from(Event::elapsed_ms(s, e)?) * 1e3) };
    let mut eager_ev = || {
        let layers = weights.layers_into(&dx, &mut acts, batch)?;
        value(())
            .and_then_with_context(record(&start))
            .then(|()| layers)
            .map(drop)
            .and_then_with_context(record(&end))
            .sync_on(stream)?;
        elapsed_us(&start, &end)
    };
    let mut graph_ev = || {
        value(())
            .and_then_with_context(record(&start))
            .then(|()| g.graph().launch())
            .and_then_with_context(record(&end))
            .sync_on(stream)?;
        elapsed_us(&start, &end)
    };
    let ev = sample(warmup, repeats, &mut [&mut eager_ev, &mut graph_ev])?;
    let [eager_ev, graph_ev]: [Vec<f64>; 2] = ev.try_into().map_err(|_| "two sample sets expected")?;

    Ok(vec![
        Row::compare(&format!("batch {batch}: full forward, host wall"), "us", eager_full, graph_full, None)
            .with_note(NOTE),
        Row::single(&format!("batch {batch}: eager full forward read by to_vec"), "us", eager_to_vec).with_note(
            "the eager chain without to_host: output read by a blocking DeviceBuffer::to_vec (no page-locked \
             allocation per pass)",
        ),
        Row::compare(&format!("batch {batch}: layers only, host wall"), "us", eager_dev, graph_dev, None)
            .with_note("4 launches over preallocated buffers (eager chain, sync_on) vs one replay (sync_on)"),
        Row::compare(&format!("batch {batch}: layers only, GPU time"), "us", eager_ev, graph_ev, None)
            .with_note("CUDA events recorded on the stream before and after the layers"),
    ])
}

fn run() -> Result<bool, Box<dyn Error>> {
    let opts = Options::from_env(&SPEC)?;
    if opts.help_requested() {
        print!("{}", bench::usage("mlp", "4-layer MLP: eager vs CUDA graph, checked and timed", &SPEC));
        return Ok(true);
    }
    let repeats = opts.count_or("--repeats", 200, 50)?;
    let warmup = opts.count_or("--warmup", 20, 0)?;
    let seed: u64 = opts.get_or("--seed", 24301)?;
    cuda_core::gpu_available().map_err(|e| format!("no usable CUDA GPU: {e}"))?;

    let dev = Device::new(0)?;
    let stream = Stream::new(&dev)?;
    let t = Instant::now();
    Kernels::get(&dev)?;
    let compile_ms = t.elapsed().as_secs_f64() * 1e3;
    let weights = Arc::new(MlpWeights::random(&stream, seed, &DIMS)?);
    let (maj, min) = cuda_core::driver_version()?;
    let (cc_maj, cc_min) = dev.compute_capability()?;
    println!(
        "{} (sm_{cc_maj}{cc_min}), CUDA driver {maj}.{min}; kernels ready in {compile_ms:.1} ms",
        dev.name()
    );
    println!("MLP {DIMS:?}, f32, ReLU between layers; seed {seed}");

    let mut report = Report::new("mlp");
    report.meta("gpu", dev.name());
    report.meta("compute_capability", format!("{cc_maj}.{cc_min}"));
    report.meta("cuda_driver", format!("{maj}.{min}"));
    report.meta("nvidia_kernel_module", bench::nvidia_kernel_module_version());
    report.meta("date_utc", bench::utc_now());
    report.meta("dims", format!("{DIMS:?}"));
    report.meta("repeats", repeats);
    report.meta("warmup", warmup);
    report.meta("seed", seed);
    report.meta("tolerance_rel", TOL);

    let mut ok = true;
    for batch in BATCHES {
        let mut rng = SplitMix64::new(seed ^ (batch as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15));
        let eager = EagerMlp::new(weights.clone(), stream.clone());
        let mut graph = GraphMlp::new(weights.clone(), &stream, batch)?;
        if batch == BATCHES[0] {
            report.meta("graph_nodes", graph.graph().graph().node_count()?);
        }
        ok &= check(&weights, &eager, &mut graph, &mut rng, &mut report)?;
        let rows = measure(&weights, &eager, &mut graph, &stream, &mut rng, (warmup, repeats))?;
        report.rows.extend(rows);
    }
    report.meta("all_checks_passed", ok);
    print!("{}", report.table());
    if let Some(path) = opts.get("--json") {
        report.write_json(Path::new(path))?;
        println!("wrote {path}");
    }
    if ok {
        println!("ok");
    }
    Ok(ok)
}

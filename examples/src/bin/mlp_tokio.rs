//! One graph-backed MLP (4 layers of width 1024, f32) shared by many tokio tasks: each task runs
//! its own inputs through `Module::forward_async` and checks every output against an f64 host
//! reference (computed before the tasks start, on scoped threads).
//!
//! `cargo run --release -p cuda-async-examples --bin mlp-tokio -- [--tasks 32] [--iters 20]`
//!
//! The model sits behind an `Arc<tokio::sync::Mutex<GraphMlp>>`: a task holds the lock across
//! its awaited pass (the pass owns the model's buffers for its duration), so passes are
//! serialised while the executor threads stay free. Prints the throughput, and for comparison the
//! latency of blocking passes (`GraphMlp::run`) from one thread. Exit code 1 on any mismatch
//! (error relative to the reference's scale >= 1e-4) or error.

use anyhow::{bail, Context, Result};
use clap::Parser;
use cuda_async::Module;
use cuda_async_examples::bench::{self, median, Goal, Report, Row};
use cuda_core::Stream;
use models::mlp::{max_rel_error, GraphMlp, MlpWeights, DIMS};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

/// Tokio tasks sharing one graph-backed MLP.
#[derive(Parser, serde::Serialize)]
struct Args {
    /// Also write the results as JSON to PATH
    #[arg(long, value_name = "PATH")]
    #[serde(skip)]
    json: Option<PathBuf>,
    /// Tokio tasks sharing the model
    #[arg(long, default_value_t = 32, value_parser = bench::at_least_one)]
    tasks: usize,
    /// Forward passes per task, each on its own input
    #[arg(long, default_value_t = 20, value_parser = bench::at_least_one)]
    iters: usize,
    /// Rows per pass
    #[arg(long, default_value_t = 1, value_parser = bench::at_least_one)]
    batch: usize,
    /// Tokio worker threads
    #[arg(long, default_value_t = 4, value_parser = bench::at_least_one)]
    workers: usize,
    /// Seed of the weights and inputs
    #[arg(long, default_value_t = 24301)]
    seed: u64,
}

/// The bound on the error relative to the reference's scale.
const TOL: f64 = 1e-4;

/// One pass of a task: the input and its f64 reference output.
struct Job {
    input: Vec<f32>,
    reference: Vec<f64>,
}

/// Inputs for `tasks` tasks of `iters` passes each, with references computed on scoped threads.
fn make_jobs(weights: &MlpWeights, a: &Args) -> Vec<Vec<Job>> {
    let mut rng = StdRng::seed_from_u64(a.seed ^ 0x7a5c_0000_0000_0001);
    let n = a.batch * weights.in_dim();
    let inputs: Vec<Vec<Vec<f32>>> = (0..a.tasks)
        .map(|_| (0..a.iters).map(|_| (0..n).map(|_| rng.random_range(-1.0..1.0)).collect()).collect())
        .collect();
    let threads = std::thread::available_parallelism().map_or(4, |n| n.get()).min(a.tasks);
    std::thread::scope(|sc| {
        let handles: Vec<_> = inputs
            .chunks(a.tasks.div_ceil(threads))
            .map(|chunk| {
                sc.spawn(move || {
                    let job = |x: &Vec<f32>| Job {
                        input: x.clone(),
                        reference: weights.host_forward_f64(x, a.batch),
                    };
                    chunk.iter().map(|task| task.iter().map(job).collect()).collect::<Vec<Vec<Job>>>()
                })
            })
            .collect();
        // A panic in a reference thread is a bug in this program: propagate it.
        handles.into_iter().flat_map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p))).collect()
    })
}

fn main() -> Result<()> {
    let a = Args::parse();
    let dev = bench::open_device()?;
    let stream = Stream::new(&dev)?;
    let weights = Arc::new(MlpWeights::random(&stream, a.seed, &DIMS)?);
    let mut model = GraphMlp::new(weights.clone(), &stream, a.batch)?;
    let (tasks, iters, workers) = (a.tasks, a.iters, a.workers);
    println!(
        "{}: MLP {DIMS:?}, batch {}; {tasks} tasks x {iters} passes on {workers} tokio workers",
        dev.name(),
        a.batch
    );

    let t = Instant::now();
    let jobs = make_jobs(&weights, &a);
    println!("inputs and f64 references ready in {:.0} ms", t.elapsed().as_secs_f64() * 1e3);

    // Blocking passes from this thread, for comparison (after 20 warm-up passes).
    let probe = &jobs[0][0];
    let mut sequential = Vec::new();
    for k in 0..(20 + iters.max(50)) {
        let t = Instant::now();
        let out = model.run(&probe.input)?;
        if k >= 20 {
            sequential.push(t.elapsed().as_secs_f64() * 1e6);
        }
        let err = max_rel_error(&out, &probe.reference);
        if err >= TOL {
            bail!("FAILED: blocking pass {k}: error {err:.2e} vs the reference");
        }
    }

    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(workers).enable_all().build()?;
    let model = Arc::new(tokio::sync::Mutex::new(model));
    let passes = tasks * iters;
    let t = Instant::now();
    let results = rt.block_on(async {
        let handles: Vec<_> = jobs
            .into_iter()
            .map(|task_jobs| {
                let model = model.clone();
                tokio::spawn(async move {
                    let mut errors = Vec::with_capacity(task_jobs.len());
                    for job in task_jobs {
                        let out = model.lock().await.forward_async(job.input).await?;
                        errors.push(max_rel_error(&out, &job.reference));
                    }
                    Ok::<_, cuda_async::DeviceError>(errors)
                })
            })
            .collect();
        let mut out = Vec::with_capacity(handles.len());
        for h in handles {
            out.push(h.await);
        }
        out
    });
    let wall = t.elapsed().as_secs_f64();

    let (mut done, mut mismatches, mut worst) = (0usize, 0usize, 0.0f64);
    for (k, r) in results.into_iter().enumerate() {
        let errors = r
            .with_context(|| format!("task {k} failed"))?
            .with_context(|| format!("task {k}: forward_async"))?;
        let bad = errors.iter().filter(|&&e| e >= TOL).count();
        let task_worst = errors.iter().copied().fold(0.0, f64::max);
        if bad > 0 {
            eprintln!("task {k}: {bad} of {} outputs off (worst {task_worst:.2e})", errors.len());
        }
        (done, mismatches, worst) = (done + errors.len(), mismatches + bad, worst.max(task_worst));
    }
    let us_per_pass = wall * 1e6 / passes as f64;
    println!(
        "{done} passes in {:.1} ms: {:.0} passes/s ({us_per_pass:.1} us per pass); blocking passes from one \
         thread: median {:.1} us",
        wall * 1e3,
        passes as f64 / wall,
        median(&sequential)
    );
    println!(
        "max error relative to the reference's scale: {worst:.2e} (bound {TOL:.0e}); {mismatches} mismatches"
    );

    let mut report = Report::new("mlp-tokio");
    report.meta("gpu", dev.name());
    report.meta("date_utc", bench::utc_now());
    report.meta("dims", format!("{DIMS:?}"));
    report.meta_from(&a);
    report.meta("passes", done);
    report.meta("mismatches", mismatches);
    report.meta("max_rel_err", worst);
    report.rows.push(Row::new("time per pass", "us", sequential, vec![us_per_pass], Goal::None).with_note(
        "raw = blocking GraphMlp::run from one thread (median); framework = wall time of all tasks' \
         forward_async passes / passes",
    ));
    if let Some(path) = &a.json {
        report.write_json(path)?;
        println!("wrote {}", path.display());
    }
    if done != passes || mismatches > 0 {
        bail!("FAILED: some outputs differ from their references beyond the bound (see above)");
    }
    println!("ok");
    Ok(())
}

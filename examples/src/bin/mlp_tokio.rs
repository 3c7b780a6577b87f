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

use cuda_async::{DeviceError, Module};
use cuda_async_examples::bench::{self, OptSpec, Options, Report, Row, SplitMix64, JSON_OPT};
use cuda_async_examples::mlp::{max_rel_error, GraphMlp, MlpWeights, DIMS};
use cuda_core::{Device, Stream};
use std::error::Error;
use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

/// The bound on the error relative to the reference's scale.
const TOL: f64 = 1e-4;

const SPEC: [OptSpec; 6] = [
    JSON_OPT,
    OptSpec { name: "--tasks", value: "N", help: "tokio tasks sharing the model (default 32)" },
    OptSpec {
        name: "--iters",
        value: "N",
        help: "forward passes per task, each on its own input (default 20)",
    },
    OptSpec { name: "--batch", value: "N", help: "rows per pass (default 1)" },
    OptSpec { name: "--workers", value: "N", help: "tokio worker threads (default 4)" },
    OptSpec { name: "--seed", value: "S", help: "seed of the weights and inputs (default 24301)" },
];

fn main() -> ExitCode {
    match run() {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            eprintln!("FAILED: some outputs differ from their references beyond the bound (see above)");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// One pass of a task: the input and its f64 reference output.
struct Job {
    input: Vec<f32>,
    reference: Vec<f64>,
}

/// What one task saw.
struct TaskResult {
    passes: usize,
    mismatches: usize,
    worst: f64,
}

/// Inputs for `tasks` tasks of `iters` passes each, with references computed on scoped threads.
fn make_jobs(weights: &MlpWeights, tasks: usize, iters: usize, batch: usize, seed: u64) -> Vec<Vec<Job>> {
    let mut rng = SplitMix64::new(seed ^ 0x7a5c_0000_0000_0001);
    let n = batch * weights.in_dim();
    let inputs: Vec<Vec<Vec<f32>>> = (0..tasks)
        .map(|_| (0..iters).map(|_| (0..n).map(|_| rng.f32_in(-1.0, 1.0)).collect()).collect())
        .collect();
    let threads = std::thread::available_parallelism().map_or(4, |n| n.get()).min(tasks.max(1));
    let per = tasks.div_ceil(threads).max(1);
    std::thread::scope(|sc| {
        let handles: Vec<_> = inputs
            .chunks(per)
            .map(|chunk| {
                sc.spawn(move || {
                    chunk
                        .iter()
                        .map(|task| {
                            task.iter()
                                .map(|x| Job {
                                    input: x.clone(),
                                    reference: weights.host_forward_f64(x, batch),
                                })
                                .collect::<Vec<Job>>()
                        })
                        .collect::<Vec<Vec<Job>>>()
                })
            })
            .collect();
        // A panic in a reference thread is a bug in this program: propagate it.
        handles.into_iter().flat_map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p))).collect()
    })
}

fn run() -> Result<bool, Box<dyn Error>> {
    let opts = Options::from_env(&SPEC)?;
    if opts.help_requested() {
        print!("{}", bench::usage("mlp-tokio", "tokio tasks sharing one graph-backed MLP", &SPEC));
        return Ok(true);
    }
    let tasks = opts.count_or("--tasks", 32, 1)?;
    let iters = opts.count_or("--iters", 20, 1)?;
    let batch = opts.count_or("--batch", 1, 1)?;
    let workers = opts.count_or("--workers", 4, 1)?;
    let seed: u64 = opts.get_or("--seed", 24301)?;
    cuda_core::gpu_available().map_err(|e| format!("no usable CUDA GPU: {e}"))?;

    let dev = Device::new(0)?;
    let stream = Stream::new(&dev)?;
    let weights = Arc::new(MlpWeights::random(&stream, seed, &DIMS)?);
    let mut model = GraphMlp::new(weights.clone(), &stream, batch)?;
    println!(
        "{}: MLP {DIMS:?}, batch {batch}; {tasks} tasks x {iters} passes on {workers} tokio workers",
        dev.name()
    );

    let t = Instant::now();
    let jobs = make_jobs(&weights, tasks, iters, batch, seed);
    println!("inputs and f64 references ready in {:.0} ms", t.elapsed().as_secs_f64() * 1e3);

    // Blocking passes from this thread, for comparison (after a few warm-up passes).
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
            eprintln!("blocking pass {k}: error {err:.2e} vs the reference");
            return Ok(false);
        }
    }

    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(workers).enable_all().build()?;
    let model = Arc::new(tokio::sync::Mutex::new(model));
    let passes = tasks * iters;
    let t = Instant::now();
    let results: Vec<Result<TaskResult, String>> = rt.block_on(async {
        let handles: Vec<_> = jobs
            .into_iter()
            .map(|task_jobs| {
                let model = model.clone();
                tokio::spawn(async move {
                    let mut r = TaskResult { passes: 0, mismatches: 0, worst: 0.0 };
                    for job in task_jobs {
                        let out = {
                            let mut m = model.lock().await;
                            m.forward_async(job.input).await?
                        };
                        let err = max_rel_error(&out, &job.reference);
                        r.passes += 1;
                        r.worst = r.worst.max(err);
                        r.mismatches += usize::from(err >= TOL);
                    }
                    Ok::<TaskResult, DeviceError>(r)
                })
            })
            .collect();
        let mut out = Vec::with_capacity(handles.len());
        for h in handles {
            out.push(match h.await {
                Ok(Ok(r)) => Ok(r),
                Ok(Err(e)) => Err(format!("forward_async failed: {e}")),
                Err(e) => Err(format!("task failed: {e}")),
            });
        }
        out
    });
    let wall = t.elapsed().as_secs_f64();

    let (mut done, mut mismatches, mut worst) = (0usize, 0usize, 0.0f64);
    for (k, r) in results.into_iter().enumerate() {
        match r {
            Ok(r) => {
                done += r.passes;
                mismatches += r.mismatches;
                worst = worst.max(r.worst);
                if r.mismatches > 0 {
                    eprintln!(
                        "task {k}: {} of {} outputs off (worst {:.2e})",
                        r.mismatches, r.passes, r.worst
                    );
                }
            }
            Err(e) => return Err(format!("task {k}: {e}").into()),
        }
    }
    let us_per_pass = wall * 1e6 / passes as f64;
    println!(
        "{done} passes in {:.1} ms: {:.0} passes/s ({us_per_pass:.1} us per pass); blocking passes from one \
         thread: median {:.1} us",
        wall * 1e3,
        passes as f64 / wall,
        bench::median(&sequential)
    );
    println!(
        "max error relative to the reference's scale: {worst:.2e} (bound {TOL:.0e}); {mismatches} mismatches"
    );

    let mut report = Report::new("mlp-tokio");
    report.meta("gpu", dev.name());
    report.meta("date_utc", bench::utc_now());
    report.meta("dims", format!("{DIMS:?}"));
    report.meta("batch", batch);
    report.meta("tasks", tasks);
    report.meta("iters_per_task", iters);
    report.meta("workers", workers);
    report.meta("passes", done);
    report.meta("mismatches", mismatches);
    report.meta("max_rel_err", worst);
    report.rows.push(Row::compare("time per pass", "us", sequential, vec![us_per_pass], None).with_note(
        "raw = blocking GraphMlp::run from one thread (median); framework = wall time of all tasks' \
             forward_async passes / passes",
    ));
    if let Some(path) = opts.get("--json") {
        report.write_json(Path::new(path))?;
        println!("wrote {path}");
    }
    let ok = done == passes && mismatches == 0;
    if ok {
        println!("ok");
    }
    Ok(ok)
}

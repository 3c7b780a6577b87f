//! Support for the workspace's GPU test suites.
//!
//! GPU tests run under a custom harness (`libtest-mimic`) so that they can be ignored at run time:
//! - with a GPU, every test runs;
//! - without one, every GPU test is reported as **ignored** (never as passed);
//! - with `CUDA_ASYNC_REQUIRE_GPU=1` and no GPU, every GPU test runs and fails, saying why.
//!
//! A suite runs its tests one at a time unless `--test-threads N` or `RUST_TEST_THREADS` says
//! otherwise (see [`Suite::run`]); the tests start their own threads where concurrency is the
//! point.

#![warn(missing_docs)]

pub mod graph_kernels;
pub mod ops;

pub use libtest_mimic::Failed;
use libtest_mimic::{Arguments, Trial};
use rand::{Rng, SeedableRng};

/// What a test returns; `?` works on any error that implements `Display`.
pub type TestResult = Result<(), Failed>;

/// Whether a GPU is usable, or why not.
pub fn gpu_status() -> Result<usize, String> {
    cuda_core::gpu_available().map_err(|e| e.to_string())
}

/// Held shared by every GPU test, exclusively by [`Suite::gpu_alone`] ones.
static ALONE: std::sync::RwLock<()> = std::sync::RwLock::new(());

/// A list of tests to run with [`Suite::run`].
#[derive(Default)]
pub struct Suite {
    trials: Vec<Trial>,
    /// The number of GPUs each trial needs (0 for CPU tests, 1 for `gpu`).
    needs: Vec<usize>,
}

impl Suite {
    /// An empty suite.
    pub fn new() -> Suite {
        Suite::default()
    }

    /// Adds a test that needs a GPU.
    pub fn gpu(&mut self, name: &str, f: fn() -> TestResult) -> &mut Self {
        self.gpus(1, name, f)
    }

    /// Adds a test that needs at least `n` GPUs. With fewer (but at least one), it prints
    /// `SKIPPED (needs n GPUs, found N)` and is reported as **ignored**, never as passed; with none,
    /// it is treated like every GPU test.
    pub fn gpus(&mut self, n: usize, name: &str, f: fn() -> TestResult) -> &mut Self {
        let shared = move || {
            let _others_may_run = ALONE.read().unwrap_or_else(|p| p.into_inner());
            f()
        };
        self.trials.push(Trial::test(name, shared).with_kind("gpu"));
        self.needs.push(n.max(1));
        self
    }

    /// Adds a GPU test that runs while no other test of this suite runs (the harness runs tests on
    /// several threads): for tests that measure process-wide state, such as the memory in use.
    pub fn gpu_alone(&mut self, name: &str, f: fn() -> TestResult) -> &mut Self {
        let alone = move || {
            let _alone = ALONE.write().unwrap_or_else(|p| p.into_inner());
            f()
        };
        self.trials.push(Trial::test(name, alone).with_kind("gpu"));
        self.needs.push(1);
        self
    }

    /// Adds a test that needs no GPU (it always runs).
    pub fn cpu(&mut self, name: &str, f: fn() -> TestResult) -> &mut Self {
        self.trials.push(Trial::test(name, f));
        self.needs.push(0);
        self
    }

    /// Runs the suite with the command-line arguments and exits with the harness's status.
    pub fn run(self) -> ! {
        let mut args = Arguments::from_args();
        // One test at a time unless asked otherwise (`--test-threads N` or `RUST_TEST_THREADS`):
        // the tests share one device, and several measure device-wide state (pool memory in use,
        // kernels overlapping, a first poll finding its work still running) that other tests'
        // work would change. Run in parallel, `gpu_core`'s pool test and a few others fail now
        // and then for that reason alone; `gpu_alone` tests stay exclusive either way.
        if args.test_threads.is_none() && std::env::var_os("RUST_TEST_THREADS").is_none() {
            args.test_threads = Some(1);
        }
        let status = gpu_status();
        let require = std::env::var("CUDA_ASYNC_REQUIRE_GPU").is_ok_and(|v| v == "1");
        let trials = self
            .trials
            .into_iter()
            .zip(self.needs)
            .map(|(t, need)| match (&status, t.kind() == "gpu") {
                (Err(why), true) if require => {
                    let why = format!("CUDA_ASYNC_REQUIRE_GPU=1 but no GPU is usable: {why}");
                    Trial::test(t.name().to_string(), move || Err(why.into())).with_kind("gpu")
                }
                (Err(_), true) => t.with_ignored_flag(true),
                (Ok(found), true) if *found < need => {
                    eprintln!("{}: SKIPPED (needs {need} GPUs, found {found})", t.name());
                    t.with_ignored_flag(true)
                }
                _ => t,
            })
            .collect();
        if let Err(why) = &status {
            eprintln!("note: GPU tests {}: {why}", if require { "fail" } else { "ignored" });
        }
        libtest_mimic::run(&args, trials).exit()
    }
}

/// A seeded RNG; the seed comes from `CUDA_ASYNC_TEST_SEED` or the clock and is printed, so a
/// failure can be replayed.
pub fn rng() -> rand::rngs::StdRng {
    let seed = std::env::var("CUDA_ASYNC_TEST_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0x5eed)
    });
    eprintln!("(seed {seed}; set CUDA_ASYNC_TEST_SEED to replay)");
    rand::rngs::StdRng::seed_from_u64(seed)
}

/// `n` random `f32` values in [-1, 1), never all zero.
pub fn random_f32(rng: &mut impl Rng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.random_range(-1.0f32..1.0)).collect()
}

/// `n` random `f64` values in [-1, 1).
pub fn random_f64(rng: &mut impl Rng, n: usize) -> Vec<f64> {
    (0..n).map(|_| rng.random_range(-1.0f64..1.0)).collect()
}

/// The poison value written into outputs before a run, so unwritten elements show.
pub const POISON_F32: f32 = f32::NAN;

/// Checks `got` against an `f64` reference elementwise: `|got - want| <= tol * max(1, |want|)`,
/// NaN never passes. Reports the first bad index.
pub fn assert_close<T: Copy + Into<f64>>(got: &[T], want: &[f64], tol: f64) -> TestResult {
    if got.len() != want.len() {
        return Err(format!("length {} != expected {}", got.len(), want.len()).into());
    }
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let g: f64 = g.into();
        let within = (g - w).abs() <= tol * w.abs().max(1.0);
        if !within {
            return Err(format!("element {i}: got {g}, expected {w} (tol {tol})").into());
        }
    }
    Ok(())
}

/// Fails the test with `msg` unless `cond`.
pub fn ensure(cond: bool, msg: impl std::fmt::Display) -> TestResult {
    if cond {
        Ok(())
    } else {
        Err(msg.to_string().into())
    }
}

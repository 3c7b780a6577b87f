//! Support for the workspace's GPU test suites.
//!
//! GPU tests run under a custom harness (`libtest-mimic`) so that they can be ignored at run time.
//! What happens to each test is decided by [`decide`], a pure function of `CUDA_ASYNC_REQUIRE_GPU`,
//! of what GPU detection found ([`Detected`]) and of how many GPUs the test needs:
//! - with enough GPUs, every test runs;
//! - only a **missing** driver or device ([`cuda_core::Error::NoDriver`],
//!   [`cuda_core::Error::NoDevice`]), or fewer GPUs than a test needs, makes a GPU test
//!   **ignored** (never passed);
//! - any other detection error (e.g. `cuInit` failing with `CUDA_ERROR_UNKNOWN`: a broken driver)
//!   makes every GPU test **fail** with that error: a broken machine is not a machine without a GPU;
//! - `CUDA_ASYNC_REQUIRE_GPU=N` (a positive integer) requires N GPUs: a test that needs k ≤ N GPUs
//!   fails, saying why, where it would otherwise be ignored. Tests that need more than N GPUs are
//!   still ignored when the machine has fewer than they need. Unset, empty or `0` requires none;
//!   any other value that is not a positive integer (`yes`, `true`, ...) is read as `1`, so a typo
//!   never turns the requirement off.
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

/// Whether a GPU is usable, or why not (the error's message).
pub fn gpu_status() -> Result<usize, String> {
    cuda_core::gpu_available().map_err(|e| e.to_string())
}

/// The name of the variable that makes GPU tests required.
pub const REQUIRE_GPU_VAR: &str = "CUDA_ASYNC_REQUIRE_GPU";

/// What GPU detection found, classified for the harness.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Detected {
    /// This many GPUs (at least one) are usable.
    Gpus(usize),
    /// No driver or no device: the only outcome that may make GPU tests ignored.
    Absent(String),
    /// Detection failed some other way (a broken driver, `cuInit` failing): GPU tests fail.
    Broken(String),
}

impl Detected {
    /// Classifies the result of [`cuda_core::gpu_available`].
    pub fn classify(result: Result<usize, cuda_core::Error>) -> Detected {
        match result {
            Ok(0) => Detected::Absent("the driver reports 0 devices".into()),
            Ok(n) => Detected::Gpus(n),
            Err(e @ (cuda_core::Error::NoDriver { .. } | cuda_core::Error::NoDevice { .. })) => {
                Detected::Absent(e.to_string())
            }
            Err(e) => Detected::Broken(e.to_string()),
        }
    }

    /// Detects the GPUs of this machine.
    pub fn detect() -> Detected {
        Detected::classify(cuda_core::gpu_available())
    }

    /// The number of usable GPUs (0 when absent or broken).
    pub fn count(&self) -> usize {
        match self {
            Detected::Gpus(n) => *n,
            _ => 0,
        }
    }
}

/// The number of GPUs that the value of `CUDA_ASYNC_REQUIRE_GPU` requires: unset, empty (after
/// trimming) or `0` require none; a positive integer N requires N; any other value requires 1 (a
/// value meant to require GPUs must never turn the requirement off by being misspelled).
pub fn required_gpus(value: Option<&str>) -> usize {
    match value.map(str::trim) {
        None | Some("") => 0,
        Some(v) => v.parse::<usize>().unwrap_or(1),
    }
}

/// What the harness does with one test.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// The test runs.
    Run,
    /// The test is reported as ignored, for this reason.
    Ignore(String),
    /// The test is reported as failed with this message, without running.
    Fail(String),
}

/// Decides what happens to a test that needs `need` GPUs (0 for a CPU test), given the value of
/// `CUDA_ASYNC_REQUIRE_GPU` (`None` when unset; see [`required_gpus`]) and what detection found.
///
/// A CPU test always runs. A GPU test fails when detection is [`Detected::Broken`]; runs when
/// enough GPUs are present; otherwise fails when the variable requires at least `need` GPUs, and is
/// ignored when it does not.
pub fn decide(require: Option<&str>, detected: &Detected, need: usize) -> Verdict {
    if need == 0 {
        return Verdict::Run;
    }
    let found = detected.count();
    let short = match detected {
        Detected::Broken(why) => {
            return Verdict::Fail(format!(
                "GPU detection failed with an error other than a missing driver or device: {why}"
            ))
        }
        Detected::Gpus(n) if *n >= need => return Verdict::Run,
        Detected::Gpus(n) => format!("needs {need} GPUs, found {n}"),
        Detected::Absent(why) => format!("no GPU is usable: {why}"),
    };
    let required = required_gpus(require);
    if need <= required {
        let value = require.unwrap_or_default();
        Verdict::Fail(format!(
            "{REQUIRE_GPU_VAR}={value} requires {required} GPU(s) and this test needs {need}, but {found} \
             found ({short})"
        ))
    } else {
        Verdict::Ignore(short)
    }
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

    /// Adds a test that needs at least `n` GPUs. With fewer, it prints `SKIPPED (needs n GPUs, found
    /// N)` and is reported as **ignored**, never as passed, unless `CUDA_ASYNC_REQUIRE_GPU` requires
    /// at least `n` GPUs: then it fails (see [`decide`]).
    pub fn gpus(&mut self, n: usize, name: &str, f: fn() -> TestResult) -> &mut Self {
        let owned = name.to_string();
        let shared = move || {
            let _others_may_run = ALONE.read().unwrap_or_else(|p| p.into_inner());
            say_failure_now(&owned, f())
        };
        self.trials.push(Trial::test(name, shared).with_kind("gpu"));
        self.needs.push(n.max(1));
        self
    }

    /// Adds a GPU test that runs while no other test of this suite runs (the harness runs tests on
    /// several threads): for tests that measure process-wide state, such as the memory in use.
    pub fn gpu_alone(&mut self, name: &str, f: fn() -> TestResult) -> &mut Self {
        let owned = name.to_string();
        let alone = move || {
            let _alone = ALONE.write().unwrap_or_else(|p| p.into_inner());
            say_failure_now(&owned, f())
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
        install_fault_backtrace();
        let mut args = Arguments::from_args();
        // One test at a time unless asked otherwise (`--test-threads N` or `RUST_TEST_THREADS`):
        // the tests share one device, and several measure device-wide state (pool memory in use,
        // kernels overlapping, a first poll finding its work still running) that other tests'
        // work would change. Run in parallel, `gpu_core`'s pool test and a few others fail now
        // and then for that reason alone; `gpu_alone` tests stay exclusive either way.
        if args.test_threads.is_none() && std::env::var_os("RUST_TEST_THREADS").is_none() {
            args.test_threads = Some(1);
        }
        let detected = Detected::detect();
        let require = std::env::var(REQUIRE_GPU_VAR).ok();
        let mut ignored = 0;
        let mut failed = 0;
        let trials = self
            .trials
            .into_iter()
            .zip(self.needs)
            .map(|(t, need)| match decide(require.as_deref(), &detected, need) {
                Verdict::Run => t,
                Verdict::Ignore(why) => {
                    ignored += 1;
                    if detected.count() > 0 {
                        eprintln!("{}: SKIPPED ({why})", t.name());
                    }
                    t.with_ignored_flag(true)
                }
                Verdict::Fail(why) => {
                    failed += 1;
                    Trial::test(t.name().to_string(), move || Err(why.into())).with_kind("gpu")
                }
            })
            .collect();
        match &detected {
            Detected::Gpus(_) => {}
            Detected::Absent(why) | Detected::Broken(why) => {
                eprintln!("note: {failed} GPU test(s) fail and {ignored} are ignored: {why}")
            }
        }
        libtest_mimic::run(&args, trials).exit()
    }
}

/// Prints a GPU test's failure on stderr the moment it returns, as well as passing it on to the
/// harness (which prints failures only once every test has finished): a later test that hangs
/// until a sanitizer run's time limit kills the process must not take the message with it.
fn say_failure_now(name: &str, r: TestResult) -> TestResult {
    if let Err(e) = &r {
        eprintln!("{name}: FAILED: {}", e.message().unwrap_or("(no message)"));
    }
    r
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

/// With `CUDA_ASYNC_TEST_FAULT_BACKTRACE` set, a SIGSEGV or SIGBUS prints the faulting address, the
/// thread and a backtrace before the process ends (exit 128 + signal). A diagnostic for faults
/// seen only under a tool (racecheck ended `gpu_graph_build::conditional_while_counts_to_n` with a
/// host-side fault and no report; with this handler it showed the fault on a thread that is not
/// the program's, and a core dump placed it in the tool's own library): not async-signal-safe (it allocates), so only for a process
/// that is dying anyway, and off unless asked for. Set to `default`, it instead resets both signals
/// to their default action (no handler at all, not even Rust's stack-overflow one): a diagnostic
/// that tells whether a handler's presence changes such a run.
fn install_fault_backtrace() {
    #[cfg(unix)]
    if std::env::var_os("CUDA_ASYNC_TEST_FAULT_BACKTRACE").is_some_and(|v| v == "default") {
        for sig in [libc::SIGSEGV, libc::SIGBUS] {
            // SAFETY: a zeroed sigaction with SIG_DFL (0) is the default action; the old action is
            // not needed.
            unsafe {
                let mut sa: libc::sigaction = std::mem::zeroed();
                sa.sa_sigaction = libc::SIG_DFL;
                libc::sigaction(sig, &sa, std::ptr::null_mut());
            }
        }
    } else if std::env::var_os("CUDA_ASYNC_TEST_FAULT_BACKTRACE").is_some() {
        extern "C" fn on_fault(sig: libc::c_int, info: *mut libc::siginfo_t, _: *mut libc::c_void) {
            // SAFETY: the kernel passes a valid siginfo_t to an SA_SIGINFO handler.
            let addr = unsafe { (*info).si_addr() } as usize;
            let bt = std::backtrace::Backtrace::force_capture();
            eprintln!(
                "FATAL signal {sig} at address {addr:#x} on thread {:?}\n{bt}",
                std::thread::current().name()
            );
            // SAFETY: ends the process at once; nothing after it runs.
            unsafe { libc::_exit(128 + sig) };
        }
        for sig in [libc::SIGSEGV, libc::SIGBUS] {
            // SAFETY: a zeroed sigaction is a valid "no flags, empty mask" value; the handler has
            // the SA_SIGINFO signature; the old action is not needed.
            unsafe {
                let mut sa: libc::sigaction = std::mem::zeroed();
                sa.sa_sigaction = on_fault as *const () as usize;
                sa.sa_flags = libc::SA_SIGINFO;
                libc::sigaction(sig, &sa, std::ptr::null_mut());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cuda_core::Error;

    fn absent() -> Detected {
        Detected::Absent("no CUDA device found".into())
    }

    fn is_fail(v: &Verdict) -> bool {
        matches!(v, Verdict::Fail(_))
    }

    fn is_ignore(v: &Verdict) -> bool {
        matches!(v, Verdict::Ignore(_))
    }

    #[test]
    fn only_no_driver_and_no_device_classify_as_absent() {
        let no_driver = Error::NoDriver { library: "libcuda.so", searched: "libcuda.so.1".into() };
        assert!(matches!(Detected::classify(Err(no_driver)), Detected::Absent(_)));
        let no_device = Error::NoDevice { reason: "none".into() };
        assert!(matches!(Detected::classify(Err(no_device)), Detected::Absent(_)));
        assert!(matches!(Detected::classify(Ok(0)), Detected::Absent(_)));
        assert_eq!(Detected::classify(Ok(2)), Detected::Gpus(2));
        let unknown = Error::Driver {
            name: "CUDA_ERROR_UNKNOWN",
            code: 999,
            description: "unknown error",
            during: "initialising the driver",
        };
        match Detected::classify(Err(unknown)) {
            Detected::Broken(why) => assert!(why.contains("CUDA_ERROR_UNKNOWN"), "{why}"),
            other => panic!("a cuInit failure must be Broken, got {other:?}"),
        }
        let other = Error::InvalidDevice { ordinal: 3, count: 1 };
        assert!(matches!(Detected::classify(Err(other)), Detected::Broken(_)));
    }

    #[test]
    fn required_gpus_parses_counts_and_reads_other_values_as_one() {
        assert_eq!(required_gpus(None), 0);
        assert_eq!(required_gpus(Some("")), 0);
        assert_eq!(required_gpus(Some("  ")), 0);
        assert_eq!(required_gpus(Some("0")), 0);
        assert_eq!(required_gpus(Some("1")), 1);
        assert_eq!(required_gpus(Some("2")), 2);
        assert_eq!(required_gpus(Some(" 4 ")), 4);
        for v in ["yes", "true", "on", "-1", "1.5", "two"] {
            assert_eq!(required_gpus(Some(v)), 1, "{v}");
        }
    }

    #[test]
    fn cpu_tests_always_run() {
        for env in [None, Some("1"), Some("8")] {
            for d in [absent(), Detected::Broken("x".into()), Detected::Gpus(1)] {
                assert_eq!(decide(env, &d, 0), Verdict::Run);
            }
        }
    }

    #[test]
    fn missing_gpu_is_ignored_unless_required() {
        assert!(is_ignore(&decide(None, &absent(), 1)));
        assert!(is_ignore(&decide(Some(""), &absent(), 1)));
        assert!(is_ignore(&decide(Some("0"), &absent(), 2)));
        let v = decide(Some("1"), &absent(), 1);
        assert!(is_fail(&v), "{v:?}");
        if let Verdict::Fail(why) = v {
            assert!(why.contains("CUDA_ASYNC_REQUIRE_GPU=1") && why.contains("no CUDA device"), "{why}");
        }
        assert!(is_fail(&decide(Some("yes"), &absent(), 1)));
        assert!(is_fail(&decide(Some("true"), &absent(), 1)));
    }

    #[test]
    fn broken_driver_fails_every_gpu_test_whatever_the_variable() {
        let broken = Detected::Broken("CUDA_ERROR_UNKNOWN (999) while initialising".into());
        for env in [None, Some(""), Some("0"), Some("1"), Some("2")] {
            for need in [1, 2, 8] {
                let v = decide(env, &broken, need);
                match v {
                    Verdict::Fail(why) => assert!(why.contains("CUDA_ERROR_UNKNOWN"), "{why}"),
                    other => panic!("{env:?} need {need}: {other:?}"),
                }
            }
        }
    }

    #[test]
    fn enough_gpus_run() {
        for env in [None, Some("1"), Some("2"), Some("yes")] {
            assert_eq!(decide(env, &Detected::Gpus(1), 1), Verdict::Run);
            assert_eq!(decide(env, &Detected::Gpus(2), 2), Verdict::Run);
            assert_eq!(decide(env, &Detected::Gpus(4), 2), Verdict::Run);
        }
    }

    #[test]
    fn multi_gpu_tests_follow_the_required_count() {
        let one = Detected::Gpus(1);
        // Not required: too few GPUs is ignored, with the counts.
        match decide(None, &one, 2) {
            Verdict::Ignore(why) => assert!(why.contains("needs 2 GPUs, found 1"), "{why}"),
            other => panic!("{other:?}"),
        }
        // =1 keeps today's meaning: a two-GPU test on a one-GPU machine is ignored.
        assert!(is_ignore(&decide(Some("1"), &one, 2)));
        assert!(is_ignore(&decide(Some("yes"), &one, 2)));
        // =2 requires two GPUs: it fails on one, and on none.
        assert!(is_fail(&decide(Some("2"), &one, 2)));
        assert!(is_fail(&decide(Some("2"), &absent(), 2)));
        assert!(is_fail(&decide(Some("2"), &absent(), 1)));
        // A test needing more than required and than present stays ignored.
        assert!(is_ignore(&decide(Some("2"), &Detected::Gpus(2), 4)));
        assert!(is_ignore(&decide(Some("2"), &absent(), 3)));
    }
}

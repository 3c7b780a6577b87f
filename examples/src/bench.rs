//! Small shared toolkit for the benchmark programs: the program skeleton (exit code, error
//! context, opening the GPU and describing it), command-line options, statistics, timing loops, a
//! pseudo-random generator, a UTC timestamp, and a report that prints as a table and writes as JSON
//! (by hand, no serde).
//!
//! Everything returns `Result<_, String>`: benchmarks print the message and exit with code 1.

use cuda_core::{Device, Error};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::str::FromStr;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

// ---------------------------------------------------------------------------------------------
// Program skeleton
// ---------------------------------------------------------------------------------------------

/// Runs a benchmark's `run` and turns its result into the exit code: on error, prints
/// `{program}: error: {e}` on stderr and exits with code 1.
pub fn main_with(program: &str, run: impl FnOnce() -> Result<(), String>) -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{program}: error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Turns an error (cuda-core's, cuda-async's...) into a message naming what was being done, for
/// `map_err`.
pub fn ctx<E: std::fmt::Display>(what: &'static str) -> impl FnOnce(E) -> String {
    move |e| format!("{what}: {e}")
}

/// Opens device 0, classifying "no GPU here" clearly (no driver, no device, unusable driver)
/// before anything else touches the driver.
pub fn open_device() -> Result<Device, String> {
    match cuda_core::gpu_available() {
        Ok(_) => {}
        Err(e @ Error::NoDriver { .. }) => return Err(format!("no CUDA driver: {e}")),
        Err(e @ Error::NoDevice { .. }) => return Err(format!("no CUDA device: {e}")),
        Err(e) => return Err(format!("the CUDA driver is unusable: {e}")),
    }
    Device::new(0).map_err(ctx("opening device 0"))
}

/// The start of every benchmark: opens device 0 ([`open_device`]), runs `prepare` on it (e.g. makes
/// it cuda-async's default device), reads what the report says about it ([`GpuInfo::read`]) and
/// prints the banner ([`GpuInfo::print_banner`]).
pub fn open_gpu(
    program: &str,
    prepare: impl FnOnce(&Device) -> Result<(), String>,
) -> Result<(Device, GpuInfo), String> {
    let dev = open_device()?;
    prepare(&dev)?;
    let gpu = GpuInfo::read(&dev)?;
    gpu.print_banner(program);
    Ok((dev, gpu))
}

/// Makes `dev` cuda-async's default device (for [`open_gpu`] in the benchmarks of cuda-async).
pub fn make_async_default(dev: &Device) -> Result<(), String> {
    cuda_async::scheduling::set_default_device(dev.ordinal()).map_err(ctx("setting the default device"))
}

/// What a benchmark prints and reports about the GPU and the CUDA libraries.
#[derive(Debug, Clone)]
pub struct GpuInfo {
    name: String,
    arch: String,
    driver: (u32, u32),
    nvrtc: (i32, i32),
}

impl GpuInfo {
    /// Reads the driver's CUDA version, `dev`'s architecture and NVRTC's version (loading NVRTC).
    pub fn read(dev: &Device) -> Result<GpuInfo, String> {
        let driver = cuda_core::driver_version().map_err(ctx("reading the driver version"))?;
        let arch = dev.sm_arch().map_err(ctx("reading the compute capability"))?;
        let nvrtc = cuda_core::nvrtc::nvrtc_version().map_err(ctx("loading NVRTC"))?;
        Ok(GpuInfo { name: dev.name().to_string(), arch, driver, nvrtc })
    }

    /// Prints `{program}: GPU (arch), driver CUDA x.y, NVRTC x.y`.
    pub fn print_banner(&self, program: &str) {
        let ((dm, dn), (nm, nn)) = (self.driver, self.nvrtc);
        println!("{program}: {} ({}), driver CUDA {dm}.{dn}, NVRTC {nm}.{nn}", self.name, self.arch);
    }

    /// An empty report for `benchmark` whose first metadata are the date, the GPU, its
    /// architecture, the driver's CUDA version, the kernel module's version and NVRTC's version.
    pub fn report(&self, benchmark: &str) -> Report {
        let ((dm, dn), (nm, nn)) = (self.driver, self.nvrtc);
        let mut report = Report::new(benchmark);
        report.meta("date_utc", utc_now());
        report.meta("gpu", self.name.as_str());
        report.meta("arch", self.arch.as_str());
        report.meta("driver_cuda_version", format!("{dm}.{dn}"));
        report.meta("nvidia_kernel_module", nvidia_kernel_module_version());
        report.meta("nvrtc_version", format!("{nm}.{nn}"));
        report
    }
}

// ---------------------------------------------------------------------------------------------
// Command-line options
// ---------------------------------------------------------------------------------------------

/// One `--name VALUE` option a program accepts.
#[derive(Debug, Clone, Copy)]
pub struct OptSpec {
    /// The option, with its dashes, e.g. `--json`.
    pub name: &'static str,
    /// Placeholder for the value in the usage text, e.g. `PATH`.
    pub value: &'static str,
    /// One line of help, including the default if any.
    pub help: &'static str,
}

/// The `--json PATH` option every benchmark accepts.
pub const JSON_OPT: OptSpec =
    OptSpec { name: "--json", value: "PATH", help: "also write the results as JSON to PATH" };

/// Parsed options: every option takes a value (`--name VALUE` or `--name=VALUE`); `-h`/`--help`
/// asks for the usage text.
#[derive(Debug, Clone, Default)]
pub struct Options {
    values: BTreeMap<&'static str, String>,
    help: bool,
}

impl Options {
    /// Parses the process's arguments (without the program name).
    pub fn from_env(spec: &[OptSpec]) -> Result<Options, String> {
        Self::parse(std::env::args().skip(1), spec)
    }

    /// Parses the process's arguments; on `-h`/`--help` prints the usage text for `program` and
    /// returns `None`.
    pub fn from_env_or_usage(
        program: &str,
        about: &str,
        spec: &[OptSpec],
    ) -> Result<Option<Options>, String> {
        let opts = Self::from_env(spec)?;
        if opts.help_requested() {
            print!("{}", usage(program, about, spec));
            return Ok(None);
        }
        Ok(Some(opts))
    }

    /// Parses `args` against `spec`. Unknown options, missing values and repeated options are
    /// errors.
    pub fn parse(args: impl IntoIterator<Item = String>, spec: &[OptSpec]) -> Result<Options, String> {
        let mut out = Options::default();
        let mut it = args.into_iter();
        while let Some(arg) = it.next() {
            if arg == "-h" || arg == "--help" {
                out.help = true;
                continue;
            }
            let (name, inline) = match arg.split_once('=') {
                Some((n, v)) if n.starts_with("--") => (n.to_string(), Some(v.to_string())),
                _ => (arg.clone(), None),
            };
            let Some(s) = spec.iter().find(|s| s.name == name) else {
                return Err(format!("unknown argument `{arg}` (try --help)"));
            };
            let value = match inline {
                Some(v) => v,
                None => it.next().ok_or_else(|| format!("{} needs a value ({})", s.name, s.value))?,
            };
            if out.values.insert(s.name, value).is_some() {
                return Err(format!("{} given more than once", s.name));
            }
        }
        Ok(out)
    }

    /// Whether `-h` or `--help` was given.
    pub fn help_requested(&self) -> bool {
        self.help
    }

    /// The raw value of option `name`, if given.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.values.get(name).map(String::as_str)
    }

    /// The path given with [`JSON_OPT`], if any.
    pub fn json_path(&self) -> Option<PathBuf> {
        self.get(JSON_OPT.name).map(PathBuf::from)
    }

    /// The value of option `name` parsed as `T`, or `default` if not given.
    pub fn get_or<T: FromStr>(&self, name: &str, default: T) -> Result<T, String>
    where
        T::Err: std::fmt::Display,
    {
        match self.get(name) {
            None => Ok(default),
            Some(v) => v.parse().map_err(|e| format!("bad value `{v}` for {name}: {e}")),
        }
    }

    /// Like [`Options::get_or`] for a count that must be at least `min`.
    pub fn count_or(&self, name: &str, default: usize, min: usize) -> Result<usize, String> {
        let v = self.get_or(name, default)?;
        if v < min {
            return Err(format!("{name} must be at least {min}, got {v}"));
        }
        Ok(v)
    }
}

/// The usage text for `program` with `spec`.
pub fn usage(program: &str, about: &str, spec: &[OptSpec]) -> String {
    let mut s = format!("{about}\n\nUsage: {program} [OPTIONS]\n\nOptions:\n");
    let width = spec.iter().map(|o| o.name.len() + o.value.len() + 1).max().unwrap_or(0);
    for o in spec {
        let left = format!("{} {}", o.name, o.value);
        let _ = writeln!(s, "  {left:<width$}  {}", o.help);
    }
    let _ = writeln!(s, "  {:<width$}  print this help", "-h, --help");
    s
}

// ---------------------------------------------------------------------------------------------
// Statistics and timing
// ---------------------------------------------------------------------------------------------

/// The median of `xs` (mean of the two middle values for an even count); NaN if empty.
pub fn median(xs: &[f64]) -> f64 {
    if xs.is_empty() {
        return f64::NAN;
    }
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    let m = v.len() / 2;
    if v.len() % 2 == 1 {
        v[m]
    } else {
        (v[m - 1] + v[m]) / 2.0
    }
}

/// The smallest of `xs`; NaN if empty.
pub fn min(xs: &[f64]) -> f64 {
    xs.iter().copied().reduce(f64::min).unwrap_or(f64::NAN)
}

/// The largest of `xs`; NaN if empty.
pub fn max(xs: &[f64]) -> f64 {
    xs.iter().copied().reduce(f64::max).unwrap_or(f64::NAN)
}

/// Runs `body(state)` `iters` times then `finish(state)` once, and returns the wall-clock
/// microseconds per iteration (the `finish` time included, e.g. a final synchronize). `iters` of 0
/// counts as 1 in the division.
pub fn us_per_iter<S: ?Sized, E>(
    state: &mut S,
    iters: usize,
    mut body: impl FnMut(&mut S) -> Result<(), E>,
    finish: impl FnOnce(&mut S) -> Result<(), E>,
) -> Result<f64, E> {
    let t = Instant::now();
    for _ in 0..iters {
        body(state)?;
    }
    finish(state)?;
    Ok(t.elapsed().as_secs_f64() * 1e6 / iters.max(1) as f64)
}

/// Runs `f` once and returns its result with the elapsed wall-clock milliseconds.
pub fn time_ms<T, E>(f: impl FnOnce() -> Result<T, E>) -> Result<(T, f64), E> {
    let t = Instant::now();
    let v = f()?;
    Ok((v, t.elapsed().as_secs_f64() * 1e3))
}

/// Runs `a` and `b` `repeats` times each, alternating which goes first (`a` first on even
/// repeats, `b` first on odd ones) so that neither side always benefits from the other's warm-up
/// or suffers from its leftovers. Returns the samples of `a` and of `b`.
pub fn alternating<E>(
    repeats: usize,
    mut a: impl FnMut() -> Result<f64, E>,
    mut b: impl FnMut() -> Result<f64, E>,
) -> Result<(Vec<f64>, Vec<f64>), E> {
    let (mut sa, mut sb) = (Vec::with_capacity(repeats), Vec::with_capacity(repeats));
    for r in 0..repeats {
        if r % 2 == 0 {
            sa.push(a()?);
            sb.push(b()?);
        } else {
            sb.push(b()?);
            sa.push(a()?);
        }
    }
    Ok((sa, sb))
}

/// Runs each of `fs` `repeats` times, rotating which goes first: on repeat `r` the order is
/// `fs[r % n], fs[(r + 1) % n], ...`, so that no side always benefits from another's warm-up or
/// suffers from its leftovers. Returns the samples of each function, in the order of `fs`. With two
/// functions the order is that of [`alternating`].
pub fn rotating<E>(
    repeats: usize,
    fs: &mut [&mut dyn FnMut() -> Result<f64, E>],
) -> Result<Vec<Vec<f64>>, E> {
    let n = fs.len();
    let mut out = vec![Vec::with_capacity(repeats); n];
    for r in 0..repeats {
        for k in 0..n {
            let i = (r + k) % n;
            out[i].push(fs[i]()?);
        }
    }
    Ok(out)
}

/// User plus system CPU time of the whole process so far (all threads, driver threads included),
/// in seconds, from `getrusage(RUSAGE_SELF)` (microsecond resolution).
pub fn process_cpu_seconds() -> Result<f64, String> {
    let mut ru = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: `ru` is a valid, writable `rusage`; getrusage fills it in or fails without writing.
    let r = unsafe { libc::getrusage(libc::RUSAGE_SELF, ru.as_mut_ptr()) };
    if r != 0 {
        return Err(format!("getrusage(RUSAGE_SELF) failed: {}", std::io::Error::last_os_error()));
    }
    // SAFETY: zero-initialised plain C struct, filled in by the successful call above.
    let ru = unsafe { ru.assume_init() };
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
    Ok(secs(ru.ru_utime) + secs(ru.ru_stime))
}

/// The NVIDIA kernel module's version (e.g. `580.65.06`), from `/proc/driver/nvidia/version`;
/// `None` where that file is missing or unreadable.
pub fn nvidia_kernel_module_version() -> Option<String> {
    let text = std::fs::read_to_string("/proc/driver/nvidia/version").ok()?;
    parse_nvidia_module_version(text.lines().next()?)
}

/// The first token of the form `digits.digits[.digits...]` in the first line of
/// `/proc/driver/nvidia/version`, whose wording varies ("NVIDIA UNIX x86_64 Kernel Module  580.65.06
/// ..." or "NVIDIA UNIX Open Kernel Module for x86_64  580.65.06 ...").
pub fn parse_nvidia_module_version(line: &str) -> Option<String> {
    line.split_whitespace()
        .find(|t| {
            t.contains('.') && t.split('.').all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
        })
        .map(str::to_string)
}

// ---------------------------------------------------------------------------------------------
// Randomness and time stamps
// ---------------------------------------------------------------------------------------------

/// SplitMix64: a tiny, good-enough generator for benchmark data and unique salts.
#[derive(Debug, Clone)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// A generator with a fixed seed.
    pub fn new(seed: u64) -> Self {
        SplitMix64(seed)
    }

    /// A generator seeded from the clock and the process id (different on every run).
    pub fn from_time() -> Self {
        let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0);
        SplitMix64(nanos ^ (u64::from(std::process::id()) << 32) ^ 0x9e37_79b9_7f4a_7c15)
    }

    /// The current state, to print as the seed that reproduces the following numbers.
    pub fn state(&self) -> u64 {
        self.0
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A uniform `f32` in `[lo, hi)`.
    pub fn f32_in(&mut self, lo: f32, hi: f32) -> f32 {
        let unit = (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32;
        lo + (hi - lo) * unit
    }
}

/// The current UTC time as `YYYY-MM-DDTHH:MM:SSZ`, computed from the system clock.
pub fn utc_now() -> String {
    let secs = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    utc_from_unix(secs)
}

/// Formats seconds since the Unix epoch as `YYYY-MM-DDTHH:MM:SSZ` (proleptic Gregorian, UTC).
pub fn utc_from_unix(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z", rem / 3_600, (rem % 3_600) / 60, rem % 60)
}

// ---------------------------------------------------------------------------------------------
// JSON (hand-written)
// ---------------------------------------------------------------------------------------------

/// A JSON value. Non-finite numbers are written as `null`.
#[derive(Debug, Clone, PartialEq)]
pub enum Json {
    /// `null`
    Null,
    /// `true` / `false`
    Bool(bool),
    /// A number.
    Num(f64),
    /// A string.
    Str(String),
    /// An array.
    Arr(Vec<Json>),
    /// An object; keys keep their order.
    Obj(Vec<(String, Json)>),
}

impl From<bool> for Json {
    fn from(v: bool) -> Self {
        Json::Bool(v)
    }
}
impl From<f64> for Json {
    fn from(v: f64) -> Self {
        Json::Num(v)
    }
}
impl From<u64> for Json {
    fn from(v: u64) -> Self {
        Json::Num(v as f64)
    }
}
impl From<usize> for Json {
    fn from(v: usize) -> Self {
        Json::Num(v as f64)
    }
}
impl From<&str> for Json {
    fn from(v: &str) -> Self {
        Json::Str(v.to_string())
    }
}
impl From<String> for Json {
    fn from(v: String) -> Self {
        Json::Str(v)
    }
}
impl<T: Into<Json>> From<Option<T>> for Json {
    fn from(v: Option<T>) -> Self {
        v.map_or(Json::Null, Into::into)
    }
}
impl From<&[f64]> for Json {
    fn from(v: &[f64]) -> Self {
        Json::Arr(v.iter().map(|&x| Json::Num(x)).collect())
    }
}

impl Json {
    /// The value as compact-ish JSON text, indented by `indent` levels of two spaces.
    pub fn write(&self, out: &mut String, indent: usize) {
        match self {
            Json::Null => out.push_str("null"),
            Json::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
            Json::Num(x) if x.is_finite() => {
                // Rust's shortest round-trip formatting never uses exponents for f64 Display,
                // which is valid JSON (integers print without a fraction).
                let _ = write!(out, "{x}");
            }
            Json::Num(_) => out.push_str("null"),
            Json::Str(s) => write_json_str(out, s),
            Json::Arr(items) => {
                // Arrays of scalars stay on one line; others get one item a line.
                let flat = items.iter().all(|i| !matches!(i, Json::Arr(_) | Json::Obj(_)));
                out.push('[');
                for (k, item) in items.iter().enumerate() {
                    if k > 0 {
                        out.push(',');
                        if flat {
                            out.push(' ');
                        }
                    }
                    if !flat {
                        newline(out, indent + 1);
                    }
                    item.write(out, indent + 1);
                }
                if !flat && !items.is_empty() {
                    newline(out, indent);
                }
                out.push(']');
            }
            Json::Obj(fields) => {
                out.push('{');
                for (k, (key, val)) in fields.iter().enumerate() {
                    if k > 0 {
                        out.push(',');
                    }
                    newline(out, indent + 1);
                    write_json_str(out, key);
                    out.push_str(": ");
                    val.write(out, indent + 1);
                }
                if !fields.is_empty() {
                    newline(out, indent);
                }
                out.push('}');
            }
        }
    }

    /// The value as JSON text with a trailing newline.
    pub fn to_text(&self) -> String {
        let mut s = String::new();
        self.write(&mut s, 0);
        s.push('\n');
        s
    }
}

fn newline(out: &mut String, indent: usize) {
    out.push('\n');
    for _ in 0..indent {
        out.push_str("  ");
    }
}

fn write_json_str(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

// ---------------------------------------------------------------------------------------------
// Report
// ---------------------------------------------------------------------------------------------

/// One measured quantity: the framework's value and, where there is one, the raw baseline's,
/// in the same `unit` (lower is better).
#[derive(Debug, Clone)]
pub struct Row {
    /// What was measured, e.g. `launch throughput`.
    pub name: String,
    /// Unit of `raw` and `framework`, e.g. `us/launch`.
    pub unit: String,
    /// The baseline (median), if there is one.
    pub raw: Option<f64>,
    /// The framework (median).
    pub framework: f64,
    /// The goal: the largest acceptable `framework / raw` ratio, if any.
    pub max_ratio: Option<f64>,
    /// Every baseline sample (empty if none).
    pub raw_samples: Vec<f64>,
    /// Every framework sample.
    pub framework_samples: Vec<f64>,
    /// Free-form remark (may be empty).
    pub note: String,
}

impl Row {
    /// A row comparing raw and framework samples by their medians, with goal `max_ratio`.
    pub fn compare(
        name: &str,
        unit: &str,
        raw_samples: Vec<f64>,
        framework_samples: Vec<f64>,
        max_ratio: Option<f64>,
    ) -> Row {
        Row {
            name: name.to_string(),
            unit: unit.to_string(),
            raw: Some(median(&raw_samples)),
            framework: median(&framework_samples),
            max_ratio,
            raw_samples,
            framework_samples,
            note: String::new(),
        }
    }

    /// A framework-only row (no baseline, no goal), valued by the median of `samples`.
    pub fn single(name: &str, unit: &str, samples: Vec<f64>) -> Row {
        Row {
            name: name.to_string(),
            unit: unit.to_string(),
            raw: None,
            framework: median(&samples),
            max_ratio: None,
            raw_samples: Vec::new(),
            framework_samples: samples,
            note: String::new(),
        }
    }

    /// A row comparing raw and framework samples by their medians, with an absolute goal: the
    /// framework at most `max_extra` (in `unit`) above raw. The goal is stored as the equivalent
    /// ratio `(raw + max_extra) / raw` of the raw median, rounded down to four decimals (stricter by
    /// less than 0.01% of raw), so [`Row::met`], the table and the JSON work unchanged. A raw median
    /// that is not positive gives a NaN goal, which is never met.
    pub fn compare_within(
        name: &str,
        unit: &str,
        raw_samples: Vec<f64>,
        framework_samples: Vec<f64>,
        max_extra: f64,
    ) -> Row {
        let raw = median(&raw_samples);
        let goal = if raw > 0.0 { ((raw + max_extra) / raw * 1e4).floor() / 1e4 } else { f64::NAN };
        Row::compare(name, unit, raw_samples, framework_samples, Some(goal))
    }

    /// A framework-only row with an absolute goal: the framework median at most `limit` (in
    /// `unit`). There is no baseline measurement: the `raw` value holds `limit` and the goal is a
    /// ratio of at most 1, so [`Row::met`], the table and the JSON work unchanged (say so in the
    /// note). `raw_samples` stays empty.
    pub fn within_budget(name: &str, unit: &str, framework_samples: Vec<f64>, limit: f64) -> Row {
        Row {
            name: name.to_string(),
            unit: unit.to_string(),
            raw: Some(limit),
            framework: median(&framework_samples),
            max_ratio: Some(1.0),
            raw_samples: Vec::new(),
            framework_samples,
            note: String::new(),
        }
    }

    /// Sets the note.
    pub fn with_note(mut self, note: impl Into<String>) -> Row {
        self.note = note.into();
        self
    }

    /// `framework / raw`, if there is a baseline.
    pub fn ratio(&self) -> Option<f64> {
        self.raw.map(|r| self.framework / r)
    }

    /// Whether the goal is met; `None` when the row has no goal or no ratio.
    pub fn met(&self) -> Option<bool> {
        match (self.ratio(), self.max_ratio) {
            (Some(r), Some(g)) => Some(r.is_finite() && r <= g),
            _ => None,
        }
    }

    /// The row as a JSON object.
    pub fn to_json(&self) -> Json {
        Json::Obj(vec![
            ("name".into(), self.name.as_str().into()),
            ("unit".into(), self.unit.as_str().into()),
            ("raw".into(), self.raw.into()),
            ("framework".into(), self.framework.into()),
            ("ratio".into(), self.ratio().into()),
            ("goal_max_ratio".into(), self.max_ratio.into()),
            ("met".into(), self.met().into()),
            ("raw_samples".into(), self.raw_samples.as_slice().into()),
            ("framework_samples".into(), self.framework_samples.as_slice().into()),
            ("note".into(), self.note.as_str().into()),
        ])
    }
}

/// A benchmark's results: metadata (GPU, driver, date, parameters...) and rows.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// The benchmark's name, e.g. `bench-core`.
    pub benchmark: String,
    /// Ordered key/value metadata.
    pub meta: Vec<(String, Json)>,
    /// The measurements.
    pub rows: Vec<Row>,
}

/// Formats a value with about four significant digits, no exponent.
pub fn fmt_value(v: f64) -> String {
    if !v.is_finite() {
        return format!("{v}");
    }
    let a = v.abs();
    if a >= 1000.0 {
        format!("{v:.0}")
    } else if a >= 100.0 {
        format!("{v:.1}")
    } else if a >= 10.0 {
        format!("{v:.2}")
    } else if a >= 1.0 {
        format!("{v:.3}")
    } else if a >= 0.01 {
        format!("{v:.4}")
    } else {
        format!("{v:.6}")
    }
}

impl Report {
    /// An empty report for `benchmark`.
    pub fn new(benchmark: &str) -> Report {
        Report { benchmark: benchmark.to_string(), ..Report::default() }
    }

    /// Adds a metadata entry.
    pub fn meta(&mut self, key: &str, value: impl Into<Json>) {
        self.meta.push((key.to_string(), value.into()));
    }

    /// Whether every row that has a goal meets it.
    pub fn all_met(&self) -> bool {
        self.rows.iter().all(|r| r.met() != Some(false))
    }

    /// The metadata and rows as a plain-text table.
    pub fn table(&self) -> String {
        let mut s = String::new();
        let kw = self.meta.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
        for (k, v) in &self.meta {
            let shown = match v {
                Json::Str(t) => t.clone(),
                other => other.to_text().trim_end().to_string(),
            };
            let _ = writeln!(s, "{k:<kw$}  {shown}");
        }
        let header = ["measurement", "unit", "raw", "framework", "ratio", "goal", "met"];
        let cells: Vec<[String; 7]> = self
            .rows
            .iter()
            .map(|r| {
                [
                    r.name.clone(),
                    r.unit.clone(),
                    r.raw.map_or("-".into(), fmt_value),
                    fmt_value(r.framework),
                    r.ratio().map_or("-".into(), |x| format!("{x:.3}")),
                    r.max_ratio.map_or("-".into(), |g| format!("<= {g}")),
                    match r.met() {
                        Some(true) => "yes".into(),
                        Some(false) => "NO".into(),
                        None => "-".into(),
                    },
                ]
            })
            .collect();
        let mut w = header.map(str::len);
        for c in &cells {
            for (i, x) in c.iter().enumerate() {
                w[i] = w[i].max(x.chars().count());
            }
        }
        let line = |s: &mut String, c: &[String]| {
            let _ = write!(s, "{:<w0$}  {:<w1$}", c[0], c[1], w0 = w[0], w1 = w[1]);
            for (i, x) in c.iter().enumerate().skip(2) {
                let _ = write!(s, "  {x:>wi$}", wi = w[i]);
            }
            s.push('\n');
        };
        s.push('\n');
        line(&mut s, &header.map(String::from));
        let total: usize = w.iter().sum::<usize>() + 2 * (w.len() - 1);
        s.push_str(&"-".repeat(total));
        s.push('\n');
        for c in &cells {
            line(&mut s, c);
        }
        for r in self.rows.iter().filter(|r| !r.note.is_empty()) {
            let _ = writeln!(s, "  note ({}): {}", r.name, r.note);
        }
        s
    }

    /// The whole report as a JSON value.
    pub fn to_json(&self) -> Json {
        Json::Obj(vec![
            ("benchmark".into(), self.benchmark.as_str().into()),
            ("meta".into(), Json::Obj(self.meta.clone())),
            ("rows".into(), Json::Arr(self.rows.iter().map(Row::to_json).collect())),
            ("all_met".into(), self.all_met().into()),
        ])
    }

    /// Writes the JSON text to `path` (creating its parent folder if needed).
    pub fn write_json(&self, path: &Path) -> Result<(), String> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
        }
        std::fs::write(path, self.to_json().to_text()).map_err(|e| format!("writing {}: {e}", path.display()))
    }

    /// Adds the outcome of the correctness check as the last metadata entry, prints the table and
    /// whether the goals are met, and writes the JSON to `json` if given.
    pub fn publish(
        &mut self,
        correctness: &Result<String, String>,
        json: Option<&Path>,
    ) -> Result<(), String> {
        let verdict = match correctness {
            Ok(s) => Json::from(s.as_str()),
            Err(e) => Json::from(format!("FAILED: {e}")),
        };
        self.meta("correctness", verdict);
        print!("{}", self.table());
        println!("goals met: {}", if self.all_met() { "yes" } else { "NO" });
        if let Some(path) = json {
            self.write_json(path)?;
            println!("wrote {}", path.display());
        }
        Ok(())
    }
}

/// The benchmark's last word: prints `correctness: {summary}`, or fails with the check's error.
pub fn conclude(correctness: Result<String, String>) -> Result<(), String> {
    correctness.map(|s| println!("correctness: {s}")).map_err(|e| format!("correctness check failed: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_odd_even_empty() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), 2.5);
        assert!(median(&[]).is_nan());
    }

    #[test]
    fn options_parse() {
        let spec = [JSON_OPT, OptSpec { name: "--n", value: "N", help: "" }];
        let args = ["--json", "a.json", "--n=5"].map(String::from);
        let o = Options::parse(args, &spec).unwrap();
        assert_eq!(o.get("--json"), Some("a.json"));
        assert_eq!(o.get_or("--n", 1usize).unwrap(), 5);
        assert_eq!(o.get_or("--missing", 7usize).unwrap(), 7);
        assert!(Options::parse(["--bogus".to_string()], &spec).is_err());
        assert!(Options::parse(["--n".to_string()], &spec).is_err());
        assert!(Options::parse(["--n", "1", "--n", "2"].map(String::from), &spec).is_err());
        assert!(o.count_or("--n", 1, 6).is_err());
        assert_eq!(o.json_path(), Some(PathBuf::from("a.json")));
        assert_eq!(Options::parse([], &spec).unwrap().json_path(), None);
    }

    #[test]
    fn conclude_reports_the_check() {
        assert_eq!(conclude(Ok("fine".into())), Ok(()));
        assert_eq!(conclude(Err("bad".into())), Err("correctness check failed: bad".to_string()));
    }

    #[test]
    fn rotating_orders_and_samples() {
        let log = std::cell::RefCell::new(Vec::new());
        let mut a = || -> Result<f64, ()> {
            log.borrow_mut().push('a');
            Ok(1.0)
        };
        let mut b = || -> Result<f64, ()> {
            log.borrow_mut().push('b');
            Ok(2.0)
        };
        let mut c = || -> Result<f64, ()> {
            log.borrow_mut().push('c');
            Ok(3.0)
        };
        let out = rotating(3, &mut [&mut a, &mut b, &mut c]).unwrap();
        assert_eq!(out, vec![vec![1.0; 3], vec![2.0; 3], vec![3.0; 3]]);
        assert_eq!(log.borrow().iter().collect::<String>(), "abcbcacab");
        let mut fail = || -> Result<f64, &str> { Err("x") };
        assert_eq!(rotating(2, &mut [&mut fail]), Err("x"));
    }

    #[test]
    fn cpu_time_advances() {
        let t0 = process_cpu_seconds().unwrap();
        let mut x = 0u64;
        for i in 0..20_000_000u64 {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(i));
        }
        std::hint::black_box(x);
        let t1 = process_cpu_seconds().unwrap();
        assert!(t0 >= 0.0 && t1 > t0, "{t0} -> {t1}");
    }

    #[test]
    fn nvidia_module_version_formats() {
        let closed =
            "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.65.06  Sun Jul 27 06:54:38 UTC 2025";
        let open = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build";
        assert_eq!(parse_nvidia_module_version(closed).as_deref(), Some("580.65.06"));
        assert_eq!(parse_nvidia_module_version(open).as_deref(), Some("580.159.04"));
        assert_eq!(parse_nvidia_module_version("no version here 1. .2"), None);
    }

    #[test]
    fn utc_dates() {
        assert_eq!(utc_from_unix(0), "1970-01-01T00:00:00Z");
        assert_eq!(utc_from_unix(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(utc_from_unix(1_767_225_599), "2025-12-31T23:59:59Z");
    }

    #[test]
    fn json_text() {
        let j = Json::Obj(vec![
            ("s".into(), "a\"b\\\n\u{1}".into()),
            ("n".into(), Json::Num(1.5)),
            ("i".into(), Json::Num(3.0)),
            ("nan".into(), Json::Num(f64::NAN)),
            ("a".into(), Json::from(&[1.0, 2.0][..])),
            ("e".into(), Json::Arr(vec![])),
        ]);
        assert_eq!(
            j.to_text(),
            "{\n  \"s\": \"a\\\"b\\\\\\n\\u0001\",\n  \"n\": 1.5,\n  \"i\": 3,\n  \"nan\": null,\n  \"a\": [1, 2],\n  \"e\": []\n}\n"
        );
    }

    #[test]
    fn absolute_goals() {
        let r = Row::compare_within("x", "us", vec![2.0, 2.0, 2.0], vec![2.29, 2.29], 0.3);
        assert_eq!(r.max_ratio, Some(1.15));
        assert_eq!(r.met(), Some(true));
        let r = Row::compare_within("x", "us", vec![2.0], vec![2.31], 0.3);
        assert_eq!(r.met(), Some(false));
        let r = Row::compare_within("x", "us", vec![0.0], vec![0.1], 0.3);
        assert_eq!(r.met(), Some(false));
        let r = Row::within_budget("y", "us", vec![1.0, 1.4, 2.0], 1.5);
        assert_eq!((r.raw, r.framework, r.met()), (Some(1.5), 1.4, Some(true)));
        assert!(r.raw_samples.is_empty());
        assert_eq!(Row::within_budget("y", "us", vec![1.6], 1.5).met(), Some(false));
    }

    #[test]
    fn rows_and_goals() {
        let r = Row::compare("x", "us", vec![1.0, 1.0, 1.0], vec![1.01, 1.01, 1.01], Some(1.02));
        assert_eq!(r.met(), Some(true));
        let r = Row::compare("x", "us", vec![1.0], vec![1.1], Some(1.02));
        assert_eq!(r.met(), Some(false));
        let mut rep = Report::new("t");
        rep.rows.push(r);
        rep.rows.push(Row::single("y", "ms", vec![2.0]));
        assert!(!rep.all_met());
        assert!(rep.table().contains("NO"));
    }
}

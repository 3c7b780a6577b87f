//! The comparison runner: a [`Case`] is a framework closure, optionally a raw-driver closure doing
//! the same work, and the number of work units one call does. [`Runner::run`] warms both up, takes
//! `repeats` samples of each (alternating which side goes first), and adds a [`Row`] with the
//! medians of wall time and process CPU time per unit, the ratio framework / raw and whether the
//! goal is met. The [`Report`] prints as a table and writes as JSON.

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::fmt::Write as _;
use std::path::Path;
use std::time::Instant;

/// User + system CPU time of the whole process so far (every thread, the driver's included), s.
pub fn cpu_seconds() -> f64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: a valid, writable timespec; the clock exists on every Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

/// The median (mean of the middle two for an even count); NaN if empty.
pub fn median(xs: &[f64]) -> f64 {
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// What a row must meet.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Goal {
    /// No goal (a diagnostic).
    None,
    /// `framework / raw <= x`.
    MaxRatio(f64),
    /// `framework <= raw + x` (in the row's unit), kept as the ratio `(raw + x) / raw` rounded down
    /// to four decimals so that the table and the JSON stay ratio-based.
    MaxExtra(f64),
}

/// What a side returns: `()` when the runner times the whole call, or the seconds that count when
/// the closure times itself (e.g. to leave a synchronize or a destruction out).
pub trait Timing {
    fn secs(self) -> Option<f64>;
}

impl Timing for () {
    fn secs(self) -> Option<f64> {
        None
    }
}

impl Timing for f64 {
    fn secs(self) -> Option<f64> {
        Some(self)
    }
}

type Body<'a> = Box<dyn FnMut() -> Result<Option<f64>> + 'a>;

fn body<'a, T: Timing>(mut f: impl FnMut() -> Result<T> + 'a) -> Body<'a> {
    Box::new(move || f().map(Timing::secs))
}

/// One comparison: the framework side, optionally the raw side doing the same work, and the units
/// of work one call does (values are reported per unit).
pub struct Case<'a> {
    name: String,
    unit: &'static str,
    units: f64,
    goal: Goal,
    note: String,
    fw: Body<'a>,
    raw: Option<Body<'a>>,
}

impl<'a> Case<'a> {
    /// A case whose framework side is `fw`, doing `units` units of work per call, reported in
    /// `unit` (its prefix, `ns`, `us` or `ms`, sets the scale).
    pub fn new<T: Timing>(
        name: impl Into<String>,
        unit: &'static str,
        units: usize,
        fw: impl FnMut() -> Result<T> + 'a,
    ) -> Self {
        let (goal, note, raw) = (Goal::None, String::new(), None);
        Case { name: name.into(), unit, units: units.max(1) as f64, goal, note, fw: body(fw), raw }
    }

    /// The raw side: the same work through plain driver calls.
    pub fn raw<T: Timing>(mut self, raw: impl FnMut() -> Result<T> + 'a) -> Self {
        self.raw = Some(body(raw));
        self
    }

    /// Sets the goal.
    pub fn goal(mut self, goal: Goal) -> Self {
        self.goal = goal;
        self
    }

    /// Sets the remark printed under the table and kept in the JSON.
    pub fn note(mut self, note: impl Into<String>) -> Self {
        self.note = note.into();
        self
    }
}

/// One measured quantity (lower is better): medians of the samples, in `unit`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Row {
    pub name: String,
    pub unit: String,
    pub raw: Option<f64>,
    #[serde(deserialize_with = "nan_if_null")]
    pub framework: f64,
    pub ratio: Option<f64>,
    pub goal_max_ratio: Option<f64>,
    pub met: Option<bool>,
    #[serde(default, deserialize_with = "nans_if_null")]
    pub raw_samples: Vec<f64>,
    #[serde(default, deserialize_with = "nans_if_null")]
    pub framework_samples: Vec<f64>,
    /// Median process CPU time per unit (absent in files written before it was measured).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub raw_cpu: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub framework_cpu: Option<f64>,
    #[serde(default)]
    pub note: String,
}

/// Reads `null` (how JSON writes a NaN) back as NaN.
fn nan_if_null<'de, D: serde::Deserializer<'de>>(d: D) -> std::result::Result<f64, D::Error> {
    Ok(Option::<f64>::deserialize(d)?.unwrap_or(f64::NAN))
}

fn nans_if_null<'de, D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Vec<f64>, D::Error> {
    Ok(Vec::<Option<f64>>::deserialize(d)?.into_iter().map(|v| v.unwrap_or(f64::NAN)).collect())
}

impl Row {
    /// A row from samples (no raw samples: a framework-only row).
    pub fn new(
        name: &str,
        unit: &str,
        raw_samples: Vec<f64>,
        framework_samples: Vec<f64>,
        goal: Goal,
    ) -> Row {
        let raw = (!raw_samples.is_empty()).then(|| median(&raw_samples));
        let goal_max_ratio = match (goal, raw) {
            (Goal::None, _) => None,
            (Goal::MaxRatio(g), _) => Some(g),
            (Goal::MaxExtra(x), Some(r)) if r > 0.0 => Some(((r + x) / r * 1e4).floor() / 1e4),
            (Goal::MaxExtra(_), _) => Some(f64::NAN),
        };
        let (name, unit, framework) = (name.into(), unit.into(), median(&framework_samples));
        Row::finish(Row {
            name,
            unit,
            raw,
            framework,
            goal_max_ratio,
            raw_samples,
            framework_samples,
            ..Row::default()
        })
    }

    /// An absolute goal with no baseline: the framework median at most `limit`. The raw column
    /// holds the limit (not a measurement) and the goal is a ratio of at most 1.
    pub fn budget(name: &str, unit: &str, framework_samples: Vec<f64>, limit: f64) -> Row {
        let mut row = Row::new(name, unit, vec![], framework_samples, Goal::MaxRatio(1.0));
        row.raw = Some(limit);
        Row::finish(row)
    }

    fn finish(mut self) -> Row {
        self.ratio = self.raw.map(|r| self.framework / r);
        self.met = match (self.ratio, self.goal_max_ratio) {
            (Some(r), Some(g)) => Some(r.is_finite() && r <= g),
            _ => None,
        };
        self
    }

    /// Sets the note.
    pub fn with_note(mut self, note: impl Into<String>) -> Row {
        self.note = note.into();
        self
    }
}

/// A benchmark's results: metadata (GPU, driver, date, parameters, checks) and rows.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Report {
    pub benchmark: String,
    pub meta: Map<String, Value>,
    pub rows: Vec<Row>,
    #[serde(default)]
    pub all_met: bool,
}

/// About four significant digits, no exponent.
pub fn fmt_value(v: f64) -> String {
    let digits = match v.abs() {
        a if !a.is_finite() || a >= 1000.0 => 0,
        a if a >= 100.0 => 1,
        a if a >= 10.0 => 2,
        a if a >= 1.0 => 3,
        a if a >= 0.01 => 4,
        _ => 6,
    };
    format!("{v:.digits$}")
}

impl Report {
    /// An empty report for `benchmark`.
    pub fn new(benchmark: &str) -> Report {
        Report { benchmark: benchmark.into(), ..Report::default() }
    }

    /// Adds a metadata entry.
    pub fn meta(&mut self, key: &str, value: impl Serialize) {
        self.meta.insert(key.into(), serde_json::to_value(value).unwrap_or(Value::Null));
    }

    /// Adds every field of `params` (a struct of options) as a metadata entry.
    pub fn meta_from(&mut self, params: impl Serialize) {
        if let Ok(Value::Object(m)) = serde_json::to_value(params) {
            self.meta.extend(m);
        }
    }

    /// The metadata and rows as a plain-text table.
    pub fn table(&self) -> String {
        let mut s = String::new();
        let kw = self.meta.keys().map(String::len).max().unwrap_or(0);
        for (k, v) in &self.meta {
            let _ = writeln!(s, "{k:<kw$}  {}", v.as_str().map_or_else(|| v.to_string(), str::to_string));
        }
        let opt = |v: Option<f64>| v.map_or("-".to_string(), fmt_value);
        let header = ["measurement", "unit", "raw", "framework", "ratio", "raw cpu", "fw cpu", "goal", "met"];
        let mut lines = vec![header.map(String::from)];
        lines.extend(self.rows.iter().map(|r| {
            [
                r.name.clone(),
                r.unit.clone(),
                opt(r.raw),
                fmt_value(r.framework),
                r.ratio.map_or("-".into(), |x| format!("{x:.3}")),
                opt(r.raw_cpu),
                opt(r.framework_cpu),
                r.goal_max_ratio.map_or("-".into(), |g| format!("<= {g}")),
                r.met.map_or("-", |m| if m { "yes" } else { "NO" }).into(),
            ]
        }));
        let w = lines.iter().map(|c| c[0].len()).max().unwrap_or(0);
        for (i, c) in lines.iter().enumerate() {
            let right: String = c[2..].iter().map(|x| format!("{x:>11}")).collect();
            let _ = writeln!(s, "{}{:<w$}  {:<14}{right}", if i == 0 { "\n" } else { "" }, c[0], c[1]);
            if i == 0 {
                let _ = writeln!(s, "{}", "-".repeat(w + 16 + right.len()));
            }
        }
        for r in self.rows.iter().filter(|r| !r.note.is_empty()) {
            let _ = writeln!(s, "  note ({}): {}", r.name, r.note);
        }
        s
    }

    /// Writes the JSON text to `path`, creating its folder if needed.
    pub fn write_json(&self, path: &Path) -> Result<()> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        let text = serde_json::to_string_pretty(self)? + "\n";
        std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
    }

    /// Records the correctness check's outcome, prints the table and whether the goals are met,
    /// writes the JSON to `json` if given, and fails if the check failed.
    pub fn publish(&mut self, correctness: Result<String>, json: Option<&Path>) -> Result<()> {
        let verdict = correctness.as_ref().map_or_else(|e| format!("FAILED: {e:#}"), Clone::clone);
        self.meta("correctness", verdict);
        self.all_met = self.rows.iter().all(|r| r.met != Some(false));
        print!("{}", self.table());
        println!("goals met: {}", if self.all_met { "yes" } else { "NO" });
        if let Some(path) = json {
            self.write_json(path)?;
            println!("wrote {}", path.display());
        }
        let summary = correctness.context("correctness check failed")?;
        println!("correctness: {summary}");
        Ok(())
    }
}

/// Runs [`Case`]s into a [`Report`].
pub struct Runner {
    /// Timed samples per side.
    pub repeats: usize,
    /// Untimed calls per side before them.
    pub warmup: usize,
    /// The rows so far.
    pub report: Report,
}

impl Runner {
    /// A runner for `report`.
    pub fn new(report: Report, repeats: usize, warmup: usize) -> Runner {
        Runner { repeats: repeats.max(1), warmup, report }
    }

    /// Warms up, samples both sides `repeats` times (alternating which goes first) and adds the
    /// row; returns it.
    pub fn run(&mut self, mut case: Case<'_>) -> Result<&Row> {
        println!("running: {}", case.name);
        let scale = match case.unit.get(..2) {
            Some("ns") => 1e9,
            Some("ms") => 1e3,
            _ => 1e6,
        };
        // Warm-up calls first, then the timed ones; the side that goes first alternates.
        let mut samples: [Vec<(f64, f64)>; 2] = Default::default();
        for r in 0..self.warmup + self.repeats {
            for k in [r % 2, 1 - r % 2] {
                let Some(body) = (if k == 0 { Some(&mut case.fw) } else { case.raw.as_mut() }) else {
                    continue;
                };
                let (cpu0, t) = (cpu_seconds(), Instant::now());
                let own = body().with_context(|| format!("{} ({})", case.name, ["framework", "raw"][k]))?;
                let (wall, cpu) = (own.unwrap_or(t.elapsed().as_secs_f64()), cpu_seconds() - cpu0);
                if r >= self.warmup {
                    samples[k].push((wall * scale / case.units, cpu * scale / case.units));
                }
            }
        }
        let [fw, raw] = samples;
        let split = |v: &[(f64, f64)]| -> (Vec<f64>, Vec<f64>) { v.iter().copied().unzip() };
        let ((fw_wall, fw_cpu), (raw_wall, raw_cpu)) = (split(&fw), split(&raw));
        let mut row = Row::new(&case.name, case.unit, raw_wall, fw_wall, case.goal).with_note(case.note);
        row.framework_cpu = Some(median(&fw_cpu));
        row.raw_cpu = (!raw_cpu.is_empty()).then(|| median(&raw_cpu));
        self.report.rows.push(row);
        Ok(self.report.rows.last().expect("just pushed"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_and_goals() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), 2.5);
        assert!(median(&[]).is_nan());
        let r = Row::new("x", "us", vec![2.0; 3], vec![2.29; 2], Goal::MaxExtra(0.3));
        assert_eq!((r.goal_max_ratio, r.met), (Some(1.15), Some(true)));
        assert_eq!(Row::new("x", "us", vec![2.0], vec![2.31], Goal::MaxExtra(0.3)).met, Some(false));
        assert_eq!(Row::new("x", "us", vec![0.0], vec![0.1], Goal::MaxExtra(0.3)).met, Some(false));
        assert_eq!(Row::new("x", "us", vec![1.0], vec![1.1], Goal::MaxRatio(1.02)).met, Some(false));
        let b = Row::budget("y", "us", vec![1.0, 1.4, 2.0], 1.5);
        assert_eq!((b.raw, b.framework, b.met), (Some(1.5), 1.4, Some(true)));
        let single = Row::new("z", "ms", vec![], vec![2.0], Goal::None);
        assert_eq!((single.raw, single.ratio, single.met), (None, None, None));
    }

    #[test]
    fn runner_samples_both_sides_and_reports() {
        let (mut fw_calls, mut raw_calls) = (0, 0);
        let case = Case::new("c", "us/op", 10, || {
            fw_calls += 1;
            Ok(())
        });
        let case = case.raw(|| {
            raw_calls += 1;
            Ok(1e-5) // seconds for 10 units: 1 us each
        });
        let mut run = Runner::new(Report::new("t"), 3, 2);
        let row = run.run(case.goal(Goal::MaxRatio(2.0))).unwrap().clone();
        assert_eq!(row.raw, Some(1.0));
        assert!(row.framework >= 0.0 && row.framework_cpu.is_some() && row.met == Some(true));
        assert_eq!((fw_calls, raw_calls), (5, 5));
        let failing = Case::new("f", "ms", 1, || -> Result<()> { anyhow::bail!("boom") });
        assert!(format!("{:#}", run.run(failing).unwrap_err()).contains("boom"));
        assert!(run.report.table().contains("yes"));
    }

    #[test]
    fn json_round_trip_and_old_files() {
        let mut rep = Report::new("t");
        rep.meta("gpu", "x");
        rep.rows.push(Row::new("a", "us", vec![1.0], vec![f64::NAN], Goal::None));
        let text = serde_json::to_string(&rep).unwrap();
        assert!(text.contains("\"framework\":null"));
        assert!(serde_json::from_str::<Report>(&text).unwrap().rows[0].framework.is_nan());
        let old = r#"{"benchmark":"b","meta":{},"rows":[{"name":"n","unit":"us","raw":1.0,
            "framework":2.0,"ratio":2.0,"goal_max_ratio":null,"met":null,"raw_samples":[1.0],
            "framework_samples":[2.0],"note":""}],"all_met":true}"#;
        let back: Report = serde_json::from_str(old).unwrap();
        assert_eq!((back.rows[0].ratio, back.rows[0].raw_cpu), (Some(2.0), None));
    }

    #[test]
    fn cpu_time_advances() {
        let t0 = cpu_seconds();
        let mut x = 0u64;
        for i in 0..20_000_000u64 {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(i));
        }
        assert!(cpu_seconds() > t0, "{x}");
    }
}

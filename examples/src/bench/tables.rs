//! Results tables generated from the committed benchmark JSON, so that the pages of
//! `docs/results` cannot drift from the files they quote.
//!
//! A page marks each generated block with two comments:
//!
//! ```text
//! <!-- generated:begin bench-core-h100.json -->
//! ... (written by `bench-plot tables`, never by hand)
//! <!-- generated:end -->
//! ```
//!
//! The begin marker names a JSON file of the same folder and optionally a view after it:
//! nothing for a comparison report (`benchmark`/`meta`/`rows`: the rows with raw, framework,
//! ratio, goal and met, then the metadata and the rows' notes), `decode` for `bench-decode`'s
//! per-batch table against PyTorch and `decode-goals` for the flagship issue's goals against it
//! (in [`super::decode_view`]), `serve` for the serving check's
//! merged report (in [`super::serve_view`]; a page quoting one that does not exist yet is left as
//! committed, so the page can be written before the first run), or a dotted path
//! (`meta.bandwidth`, `buckets`) to an array of objects, shown with one column per key, or
//! `vs:OTHER.json` for the report's ratios beside an earlier report's (in
//! [`super::compare_view`]). [`fill`]
//! rewrites every block of a page; [`diff`] shows what differs between the committed text and the
//! generated one.

use super::runner::{fmt_value, Report, Row};
use anyhow::{bail, Context, Result};
use serde_json::Value;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

const BEGIN: &str = "<!-- generated:begin ";
const END: &str = "<!-- generated:end -->";

/// One generated block of a page: the JSON file it quotes and the view of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Block {
    pub file: String,
    pub view: Option<String>,
}

/// The text of `block` rendered from the parsed JSON `json` (without markers).
pub fn render(block: &Block, json: &Value) -> Result<String> {
    let what = || format!("{} {}", block.file, block.view.as_deref().unwrap_or(""));
    match block.view.as_deref() {
        None => {
            let r: Report = serde_json::from_value(json.clone())
                .with_context(|| format!("{}: not a framework/raw report (name a view)", block.file))?;
            Ok(report_table(&r, &block.file))
        }
        Some("decode") => super::decode_view::decode_table(json, &block.file).with_context(what),
        Some("decode-goals") => super::decode_view::goals_table(json, &block.file).with_context(what),
        Some("serve") => super::serve_view::serve_table(json, &block.file).with_context(what),
        Some(path) => {
            let mut v = json;
            for key in path.split('.') {
                v = v.get(key).with_context(|| format!("{}: no `{path}` (at `{key}`)", block.file))?;
            }
            array_table(json, v, &block.file, path).with_context(what)
        }
    }
}

/// Every block of `page` in order.
pub fn blocks(page: &str) -> Result<Vec<Block>> {
    let mut out = Vec::new();
    fill(page, |b| {
        out.push(b.clone());
        Ok(String::new())
    })?;
    Ok(out)
}

/// `page` with the text between every pair of markers replaced by `gen(block)`; the markers and
/// everything outside them are kept as they are.
pub fn fill(page: &str, mut gen: impl FnMut(&Block) -> Result<String>) -> Result<String> {
    let mut out = String::with_capacity(page.len());
    let mut lines = page.split_inclusive('\n').enumerate();
    while let Some((i, line)) = lines.next() {
        out.push_str(line);
        let t = line.trim();
        if t == END {
            bail!("line {}: `{END}` without a begin marker", i + 1);
        }
        let Some(spec) = t.strip_prefix(BEGIN).and_then(|s| s.strip_suffix("-->")) else {
            continue;
        };
        let mut words = spec.split_whitespace();
        let file = words.next().with_context(|| format!("line {}: a begin marker names no file", i + 1))?;
        let block = Block { file: file.to_string(), view: words.next().map(str::to_string) };
        if words.next().is_some() {
            bail!("line {}: a begin marker takes a file and at most one view", i + 1);
        }
        let text = gen(&block).with_context(|| format!("line {}: {}", i + 1, block.file))?;
        let mut closed = false;
        for (j, inner) in lines.by_ref() {
            if inner.trim() == END {
                out.push('\n');
                out.push_str(&text);
                if !text.is_empty() {
                    out.push('\n');
                }
                out.push_str(inner);
                closed = true;
                break;
            }
            if inner.trim().starts_with(BEGIN) {
                bail!("line {}: a begin marker inside the block opened on line {}", j + 1, i + 1);
            }
        }
        if !closed {
            bail!("line {}: the block of {} has no `{END}`", i + 1, block.file);
        }
    }
    Ok(out)
}

/// A page of a results folder: its committed text and the text with every block regenerated.
pub struct Page {
    pub path: PathBuf,
    pub committed: String,
    pub generated: String,
}

/// Every Markdown page of `dir` (sorted by name) with its blocks regenerated from the JSON files
/// of `dir`, and the JSON files of `dir` that no block quotes.
pub fn regenerate(dir: &Path) -> Result<(Vec<Page>, Vec<String>)> {
    let mut names: Vec<PathBuf> = Vec::new();
    for e in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        names.push(e?.path());
    }
    names.sort();
    let mut json: BTreeMap<String, Option<Value>> = names
        .iter()
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .filter_map(|p| Some((p.file_name()?.to_string_lossy().into_owned(), None)))
        .collect();
    let mut pages = Vec::new();
    for path in names.into_iter().filter(|p| p.extension().is_some_and(|x| x == "md")) {
        let committed =
            std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
        let optional_missing = |b: &Block| {
            b.view.as_deref().is_some_and(|v| super::serve_view::OPTIONAL.contains(&v))
                && !dir.join(&b.file).exists()
        };
        if blocks(&committed).with_context(|| format!("in {}", path.display()))?.iter().any(optional_missing)
        {
            // Its JSON does not exist yet: the page stays as committed.
            pages.push(Page { path, generated: committed.clone(), committed });
            continue;
        }
        let generated = fill(&committed, |b| {
            let slot =
                json.get_mut(&b.file).with_context(|| format!("no {} in {}", b.file, dir.display()))?;
            if slot.is_none() {
                let f = dir.join(&b.file);
                let t = std::fs::read_to_string(&f).with_context(|| format!("reading {}", f.display()))?;
                *slot = Some(serde_json::from_str(&t).with_context(|| format!("parsing {}", f.display()))?);
            }
            let this = slot.clone().context("just loaded")?;
            if let Some(other) = b.view.as_deref().and_then(|v| v.strip_prefix("vs:")) {
                let f = dir.join(other);
                let t = std::fs::read_to_string(&f).with_context(|| format!("reading {}", f.display()))?;
                let old: Value =
                    serde_json::from_str(&t).with_context(|| format!("parsing {}", f.display()))?;
                if let Some(s) = json.get_mut(other) {
                    s.get_or_insert(old.clone());
                }
                return super::compare_view::compare_table(&this, &b.file, &old, other);
            }
            render(b, &this)
        })
        .with_context(|| format!("in {}", path.display()))?;
        pages.push(Page { path, committed, generated });
    }
    let unquoted = json.into_iter().filter(|(_, v)| v.is_none()).map(|(k, _)| k).collect();
    Ok((pages, unquoted))
}

/// A line diff of `old` against `new` (`-` old only, `+` new only, two lines of context around
/// each change), empty when they are equal.
pub fn diff(old: &str, new: &str) -> String {
    let (a, b): (Vec<&str>, Vec<&str>) = (old.lines().collect(), new.lines().collect());
    // Longest common subsequence table, from the ends.
    let mut lcs = vec![vec![0u32; b.len() + 1]; a.len() + 1];
    for i in (0..a.len()).rev() {
        for j in (0..b.len()).rev() {
            lcs[i][j] = if a[i] == b[j] { lcs[i + 1][j + 1] + 1 } else { lcs[i + 1][j].max(lcs[i][j + 1]) };
        }
    }
    let mut ops: Vec<(char, usize, &str)> = Vec::new();
    let (mut i, mut j) = (0, 0);
    while i < a.len() || j < b.len() {
        if i < a.len() && j < b.len() && a[i] == b[j] {
            ops.push((' ', i, a[i]));
            (i, j) = (i + 1, j + 1);
        } else if i < a.len() && (j == b.len() || lcs[i + 1][j] >= lcs[i][j + 1]) {
            ops.push(('-', i, a[i]));
            i += 1;
        } else {
            ops.push(('+', i, b[j]));
            j += 1;
        }
    }
    let near = |k: usize| ops[k.saturating_sub(2)..(k + 3).min(ops.len())].iter().any(|o| o.0 != ' ');
    let mut s = String::new();
    let mut gap = false;
    for (k, (op, line, text)) in ops.iter().enumerate() {
        if near(k) {
            if gap || (k > 0 && s.is_empty()) {
                let _ = writeln!(s, "@@ line {} @@", line + 1);
            }
            let _ = writeln!(s, "{op} {text}");
            gap = false;
        } else {
            gap = true;
        }
    }
    s
}

/// `|` and line breaks would break a Markdown table cell.
fn cell(s: &str) -> String {
    s.replace('|', "\\|").replace('\n', " ")
}

pub(super) fn md_table(header: &[String], rows: &[Vec<String>]) -> String {
    let mut s = format!("| {} |\n", header.join(" | "));
    let _ = writeln!(s, "|{}", " --- |".repeat(header.len()));
    for r in rows {
        let _ = writeln!(s, "| {} |", r.iter().map(|c| cell(c)).collect::<Vec<_>>().join(" | "));
    }
    s
}

pub(super) fn text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Number(n) if n.as_f64() == Some(0.0) => "0".into(),
        Value::Number(n) if n.is_f64() => n.as_f64().map_or_else(|| n.to_string(), fmt_value),
        Value::Null => "—".into(),
        v => v.to_string(),
    }
}

/// The first of `keys` present in `meta`, as text.
fn first(meta: &serde_json::Map<String, Value>, keys: &[&str]) -> Option<String> {
    keys.iter().find_map(|k| meta.get(*k).filter(|v| !v.is_null())).map(text)
}

/// Metadata shown in the run line (not again among the parameters).
const RUN_KEYS: &[&str] = &[
    "gpu",
    "arch",
    "compute_capability",
    "driver_cuda_version",
    "cuda_driver",
    "nvidia_kernel_module",
    "nvrtc_version",
    "date_utc",
    "command",
    "correctness",
];

/// The line naming the run: benchmark, GPU, driver, date, command (when recorded) and the file.
fn run_line(benchmark: &str, meta: &serde_json::Map<String, Value>, file: &str) -> String {
    let mut s = format!("`{benchmark}`");
    if let Some(gpu) = first(meta, &["gpu"]) {
        let _ = write!(s, " on {gpu}");
        if let Some(arch) = first(meta, &["arch", "compute_capability"]) {
            let _ = write!(s, " ({arch})");
        }
    }
    let module = first(meta, &["nvidia_kernel_module"]);
    let cuda = first(meta, &["driver_cuda_version", "cuda_driver"]);
    match (module, cuda) {
        (Some(m), Some(c)) => {
            let _ = write!(s, ", driver {m} (CUDA {c})");
        }
        (Some(d), None) | (None, Some(d)) => {
            let _ = write!(s, ", driver {d}");
        }
        (None, None) => {}
    }
    if let Some(n) = first(meta, &["nvrtc_version"]) {
        let _ = write!(s, ", NVRTC {n}");
    }
    if let Some(d) = first(meta, &["date_utc"]) {
        let _ = write!(s, ", {d}");
    }
    if let Some(c) = first(meta, &["command"]) {
        let _ = write!(s, "; command: `{c}`");
    }
    let _ = write!(s, ". JSON: [`{file}`]({file}).");
    s
}

/// Scalar metadata not in the run line, as `key value` pairs.
fn parameters(meta: &serde_json::Map<String, Value>) -> String {
    let scalar = |v: &Value| !(v.is_object() || v.is_array() || v.is_null());
    let pairs: Vec<String> = meta
        .iter()
        .filter(|(k, v)| !RUN_KEYS.contains(&k.as_str()) && scalar(v))
        .map(|(k, v)| format!("`{k}` {}", text(v)))
        .collect();
    pairs.join(", ")
}

fn goal(r: &Row) -> String {
    r.goal_max_ratio.map_or("—".into(), |g| if g.is_finite() { format!("≤ {g}") } else { "≤ NaN".into() })
}

fn met(r: &Row) -> String {
    r.met.map_or("—", |m| if m { "yes" } else { "**no**" }).into()
}

/// A comparison report: one row per measurement, then the run, the correctness check, the
/// parameters and the rows' notes.
pub fn report_table(r: &Report, file: &str) -> String {
    let opt = |v: Option<f64>| v.map_or("—".to_string(), fmt_value);
    let cpu = r.rows.iter().any(|x| x.raw_cpu.is_some() || x.framework_cpu.is_some());
    let mut header: Vec<String> =
        ["measurement", "unit", "raw", "framework", "ratio", "goal (ratio)", "met"].map(String::from).into();
    if cpu {
        header.extend(["raw CPU", "framework CPU", "CPU ratio"].map(String::from));
    }
    let rows: Vec<Vec<String>> = r
        .rows
        .iter()
        .map(|x| {
            let mut c = vec![
                x.name.clone(),
                x.unit.clone(),
                opt(x.raw),
                fmt_value(x.framework),
                x.ratio.map_or("—".into(), |v| format!("{v:.3}")),
                goal(x),
                met(x),
            ];
            if cpu {
                let ratio = match (x.raw_cpu, x.framework_cpu) {
                    (Some(r), Some(f)) if r > 0.0 => format!("{:.3}", f / r),
                    _ => "—".into(),
                };
                c.extend([opt(x.raw_cpu), opt(x.framework_cpu), ratio]);
            }
            c
        })
        .collect();
    let mut s = md_table(&header, &rows);
    let goals = r.rows.iter().filter(|x| x.met.is_some()).count();
    let missed: Vec<&str> = r.rows.iter().filter(|x| x.met == Some(false)).map(|x| x.name.as_str()).collect();
    let _ = write!(s, "\n{}", run_line(&r.benchmark, &r.meta, file));
    if goals > 0 {
        let _ = write!(s, " Goals met: {} of {goals}", goals - missed.len());
        if missed.is_empty() {
            s.push('.');
        } else {
            let _ = write!(s, "; missed: {}.", missed.join("; "));
        }
    }
    s.push('\n');
    if let Some(c) = first(&r.meta, &["correctness"]) {
        let _ = writeln!(s, "Correctness: {c}.");
    }
    let p = parameters(&r.meta);
    if !p.is_empty() {
        let _ = writeln!(s, "Parameters: {p}.");
    }
    let notes: Vec<&Row> = r.rows.iter().filter(|x| !x.note.is_empty()).collect();
    if !notes.is_empty() {
        s.push_str("\nNotes from the JSON (CPU columns: process CPU time per unit, all threads):\n\n");
        for x in notes {
            let _ = writeln!(s, "- {}: {}", x.name, x.note);
        }
    }
    s
}

/// An array of objects: one row per object, one column per key of the first.
fn array_table(root: &Value, v: &Value, file: &str, path: &str) -> Result<String> {
    let items = v.as_array().with_context(|| format!("`{path}` is not an array"))?;
    let keys: Vec<String> = items
        .first()
        .and_then(Value::as_object)
        .with_context(|| format!("`{path}` is not an array of objects"))?
        .keys()
        .cloned()
        .collect();
    let rows: Vec<Vec<String>> =
        items.iter().map(|it| keys.iter().map(|k| it.get(k).map_or("—".into(), text)).collect()).collect();
    let header: Vec<String> = keys.iter().map(|k| format!("`{k}`")).collect();
    let mut s = md_table(&header, &rows);
    match (root.get("benchmark").and_then(Value::as_str), root.get("meta").and_then(Value::as_object)) {
        (Some(b), Some(meta)) => {
            let _ = writeln!(s, "\nFrom `{path}` of {}", run_line(b, meta, file));
            if let Some(c) = first(meta, &["correctness"]) {
                let _ = writeln!(s, "Correctness: {c}.");
            }
        }
        _ => {
            let _ = writeln!(s, "\nFrom `{path}` of [`{file}`]({file}).");
        }
    }
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::{Goal, Row};

    fn report() -> Value {
        let mut r = Report::new("bench-x");
        r.meta("gpu", "GPU X");
        r.meta("date_utc", "2026-01-01T00:00:00Z");
        r.meta("repeats", 9);
        r.rows.push(Row::new("a | b", "us", vec![2.0], vec![2.1], Goal::MaxRatio(1.02)).with_note("n"));
        r.rows.push(Row::new("c", "ms", vec![], vec![0.5], Goal::None));
        serde_json::to_value(&r).unwrap()
    }

    fn page(body: &str) -> String {
        format!("intro\n<!-- generated:begin x.json -->\n{body}<!-- generated:end -->\nafter\n")
    }

    #[test]
    fn generated_tables_are_deterministic_and_mismatches_show() {
        let json = report();
        let gen = |b: &Block| render(b, &json);
        let once = fill(&page("hand-typed\n"), gen).unwrap();
        assert_eq!(fill(&once, gen).unwrap(), once, "regenerating changes nothing");
        assert_eq!(fill(&page(""), gen).unwrap(), once, "the old block text does not matter");
        assert!(once.starts_with("intro\n") && once.ends_with("<!-- generated:end -->\nafter\n"));
        assert!(once.contains("| a \\| b | us | 2.000 | 2.100 | 1.050 | ≤ 1.02 | **no** |"), "{once}");
        assert!(once.contains("Goals met: 0 of 1; missed: a | b.") && once.contains("`repeats` 9"));
        let edited = once.replace("2.100", "2.000");
        let d = diff(&edited, &fill(&edited, gen).unwrap());
        assert!(
            d.contains("- | a \\| b | us | 2.000 | 2.000") && d.contains("+ | a \\| b | us | 2.000 | 2.100"),
            "{d}"
        );
        assert_eq!(diff(&once, &once), "");
        assert_eq!(blocks(&once).unwrap(), vec![Block { file: "x.json".into(), view: None }]);
    }

    #[test]
    fn malformed_markers_are_errors() {
        let ok = |_: &Block| Ok(String::new());
        assert!(fill("<!-- generated:begin x.json -->\nno end\n", ok).is_err());
        assert!(fill("<!-- generated:end -->\n", ok).is_err());
        assert!(fill("<!-- generated:begin -->\n<!-- generated:end -->\n", ok).is_err());
        let nested =
            "<!-- generated:begin a.json -->\n<!-- generated:begin b.json -->\n<!-- generated:end -->\n";
        assert!(fill(nested, ok).is_err());
        let b = Block { file: "x.json".into(), view: Some("meta.nothing".into()) };
        assert!(render(&b, &report()).is_err());
        let b = Block { file: "x.json".into(), view: Some("rows".into()) };
        assert!(render(&b, &report()).unwrap().contains("| `name` | `unit` |"));
    }

    /// The committed pages of docs/results are what their JSON gives (as `bench-plot tables --check`).
    #[test]
    fn committed_results_pages_match_their_json() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/results");
        let (pages, unquoted) = regenerate(&dir).unwrap();
        for p in &pages {
            assert!(
                p.committed == p.generated,
                "{} differs from its JSON (run `cargo run -p cuda-async-examples --bin bench-plot -- tables`):\n{}",
                p.path.display(),
                diff(&p.committed, &p.generated)
            );
        }
        assert!(unquoted.is_empty(), "JSON quoted by no generated table: {unquoted:?}");
    }
}

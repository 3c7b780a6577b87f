//! The `serve` view of `scripts/serve-check.sh`'s merged report (`serve-h100.json`): the HTTP run
//! (`llama-serve` driven by `llama-load`) and the in-process run (`llama-batch-bench`) side by
//! side, their throughput ratio, and the serving goals with met / not met.
//!
//! The file has `gpu`, `driver`, `date_utc`, `commands` (`serve`, `load`, `batch_bench`),
//! `openai_check`, `failed_checks`, and `http` / `inprocess`: `llama-load`'s JSON schema (`mode`,
//! `clients`, `completed`, `tokens_per_s`, `ttft_ms` / `tpot_ms` with `p50`/`p90`/`p99`/`mean`,
//! `verify`, ...), either `null` when that run wrote nothing.

use super::runner::fmt_value;
use super::tables::{md_table, text};
use anyhow::{Context, Result};
use serde_json::Value;
use std::fmt::Write as _;

/// Views whose JSON file may not exist yet: a page quoting a missing one is left as committed.
pub(super) const OPTIONAL: &[&str] = &["serve"];

fn num(v: &Value, path: &[&str]) -> Option<f64> {
    path.iter().try_fold(v, |v, k| v.get(k)).and_then(Value::as_f64)
}

fn cell(v: Option<f64>) -> String {
    v.map_or("—".into(), fmt_value)
}

/// One row of the measurement table.
fn run_row(name: &str, r: &Value) -> Vec<String> {
    if r.is_null() {
        return std::iter::once(name.to_string()).chain(std::iter::repeat_n("—".to_string(), 9)).collect();
    }
    let count = |k: &str| r.get(k).map_or("—".into(), text);
    let verify = match r.get("verify") {
        Some(v) if v.is_object() => format!(
            "{} / {} ({} streams differ)",
            v.get("tokens_equal").map_or("—".into(), text),
            v.get("tokens_checked").map_or("—".into(), text),
            v.get("mismatched_streams").map_or("—".into(), text)
        ),
        _ => "not run".into(),
    };
    vec![
        format!("{name} ({} streams)", count("clients")),
        num(r, &["tokens_per_s"]).map_or("—".into(), |v| format!("{v:.0}")),
        cell(num(r, &["ttft_ms", "p50"])),
        cell(num(r, &["ttft_ms", "p99"])),
        cell(num(r, &["tpot_ms", "p50"])),
        cell(num(r, &["tpot_ms", "p99"])),
        count("completed"),
        count("cancelled"),
        count("errors"),
        verify,
    ]
}

fn met(m: Option<bool>) -> String {
    m.map_or("—".into(), |m| if m { "met".into() } else { "**not met**".into() })
}

/// The serve report: measurements, ratio, goals, run line.
pub(super) fn serve_table(j: &Value, file: &str) -> Result<String> {
    let http = j.get("http").context("no `http` key (write it with scripts/serve-check.sh)")?;
    let inproc = j.get("inprocess").context("no `inprocess` key")?;
    let header: Vec<String> = [
        "run",
        "tokens/s",
        "TTFT p50 (ms)",
        "TTFT p99 (ms)",
        "TPOT p50 (ms)",
        "TPOT p99 (ms)",
        "completed",
        "cancelled",
        "errors",
        "verify: tokens equal / checked",
    ]
    .map(String::from)
    .into();
    let rows = [
        run_row("HTTP: `llama-serve` + `llama-load`", http),
        run_row("in-process: `llama-batch-bench`", inproc),
    ];
    let mut s = md_table(&header, &rows);

    let tps = num(http, &["tokens_per_s"]);
    let ratio = match (tps, num(inproc, &["tokens_per_s"])) {
        (Some(h), Some(p)) if p > 0.0 => Some(h / p),
        _ => None,
    };
    let _ =
        writeln!(s, "\nHTTP / in-process throughput: {}.\n", ratio.map_or("—".into(), |r| format!("{r:.3}")));

    let streams = http.get("clients").and_then(Value::as_u64);
    let at64 = |v: Option<f64>, goal: f64| match (v, streams) {
        (Some(v), Some(64)) => Some(v >= goal),
        (Some(_), Some(_)) => None,
        _ => Some(false),
    };
    let p99_tpot = num(http, &["tpot_ms", "p99"]);
    let p50_ttft = num(http, &["ttft_ms", "p50"]);
    let exact = |r: &Value| match r.get("verify") {
        Some(v) if v.is_object() => Some(
            v.get("mismatched_streams").and_then(Value::as_u64) == Some(0)
                && v.get("tokens_equal") == v.get("tokens_checked")
                && r.get("errors").and_then(Value::as_u64) == Some(0),
        ),
        _ => Some(false),
    };
    let tps_text =
        tps.map_or("—".into(), |v| format!("{v:.0} tokens/s at {} streams", streams.unwrap_or(0)));
    let goals: Vec<Vec<String>> = vec![
        vec![
            "throughput, HTTP, 64 streams".into(),
            "≥ 30,000 tokens/s".into(),
            tps_text.clone(),
            met(at64(tps, 30_000.0)),
        ],
        vec!["throughput (stretch)".into(), "≥ 40,000 tokens/s".into(), tps_text, met(at64(tps, 40_000.0))],
        vec![
            "TPOT p99, HTTP".into(),
            "≤ 3 ms".into(),
            cell(p99_tpot),
            met(Some(p99_tpot.is_some_and(|v| v <= 3.0))),
        ],
        vec![
            "TTFT p50, HTTP".into(),
            "≤ 60 ms".into(),
            cell(p50_ttft),
            met(Some(p50_ttft.is_some_and(|v| v <= 60.0))),
        ],
        vec![
            "HTTP within 5% of in-process".into(),
            "throughput ratio ≥ 0.95".into(),
            ratio.map_or("—".into(), |r| format!("{r:.3}")),
            met(Some(ratio.is_some_and(|r| r >= 0.95))),
        ],
        vec![
            "replay: every streamed token equal, no errors".into(),
            "HTTP and in-process".into(),
            format!("HTTP {}, in-process {}", met(exact(http)), met(exact(inproc))),
            met(Some(exact(http) == Some(true) && exact(inproc) == Some(true))),
        ],
    ];
    let gh: Vec<String> = ["goal", "target", "measured", "met"].map(String::from).into();
    s.push_str(&md_table(&gh, &goals));
    let n_met = goals.iter().filter(|g| g[3] == "met").count();
    let _ = write!(s, "\nGoals met: {n_met} of {}.", goals.len());
    let field = |k: &str| j.get(k).filter(|v| !v.is_null()).map(text);
    let _ = write!(s, " Run: {}", field("gpu").unwrap_or_else(|| "unknown GPU".into()));
    if let Some(d) = field("driver") {
        let _ = write!(s, ", driver {d}");
    }
    if let Some(d) = field("date_utc") {
        let _ = write!(s, ", {d}");
    }
    let _ = writeln!(s, ". JSON: [`{file}`]({file}).");
    if let Some(o) = field("openai_check") {
        let _ = writeln!(s, "`openai` client check: {o}.");
    }
    match j.get("failed_checks").and_then(Value::as_array) {
        Some(f) if !f.is_empty() => {
            let list: Vec<String> = f.iter().map(text).collect();
            let _ = writeln!(s, "Failed checks: {}.", list.join("; "));
        }
        Some(_) => {
            let _ = writeln!(s, "Failed checks: none.");
        }
        None => {}
    }
    if let Some(c) = j.get("commands").and_then(Value::as_object) {
        s.push_str("\nCommands:\n\n");
        for (k, v) in c {
            let _ = writeln!(s, "- {k}: `{}`", text(v));
        }
    }
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::super::tables::{fill, render, Block};
    use serde_json::json;

    fn run(mode: &str, tps: f64, p99_tpot: f64, mismatched: u64) -> serde_json::Value {
        json!({"mode": mode, "clients": 64, "requests": 128, "prompt_tokens": 128, "max_tokens": 256,
            "sampled_fraction": 0.5, "cancel_fraction": 0.1, "completed": 115, "cancelled": 13, "errors": 0,
            "generated_tokens": 31000, "wall_s": 1.0, "tokens_per_s": tps,
            "ttft_ms": {"p50": 41.5, "p90": 50.0, "p99": 70.25, "mean": 43.0},
            "tpot_ms": {"p50": 1.875, "p90": 2.0, "p99": p99_tpot, "mean": 1.9},
            "verify": {"streams": 115, "tokens_checked": 29440, "tokens_equal": 29440 - mismatched,
                       "mismatched_streams": mismatched},
            "metrics_after": {"running": 0.0, "queued": 0.0, "kv_slots_used": 0.0, "gauges": {}}, "command": "x"})
    }

    #[test]
    fn serve_table_from_a_literal() {
        let j = json!({"benchmark": "serve", "gpu": "GPU X", "driver": "580.1", "date_utc": "2026-01-01T00:00:00Z",
            "commands": {"serve": "llama-serve --model m", "load": "llama-load", "batch_bench": "llama-batch-bench"},
            "openai_check": "13 passed, 0 failed", "failed_checks": [],
            "http": run("http", 31000.0, 2.5, 0), "inprocess": run("inprocess", 32000.0, 2.0, 0)});
        let b = Block { file: "serve-h100.json".into(), view: Some("serve".into()) };
        let t = render(&b, &j).unwrap();
        assert!(t.contains("| HTTP: `llama-serve` + `llama-load` (64 streams) | 31000 | 41.50 | 70.25 | 1.875 | 2.500 | 115 | 13 | 0 | 29440 / 29440 (0 streams differ) |"), "{t}");
        assert!(t.contains("HTTP / in-process throughput: 0.969."), "{t}");
        assert!(
            t.contains(
                "| throughput, HTTP, 64 streams | ≥ 30,000 tokens/s | 31000 tokens/s at 64 streams | met |"
            ),
            "{t}"
        );
        assert!(
            t.contains(
                "| throughput (stretch) | ≥ 40,000 tokens/s | 31000 tokens/s at 64 streams | **not met** |"
            ),
            "{t}"
        );
        assert!(
            t.contains("| TPOT p99, HTTP | ≤ 3 ms | 2.500 | met |")
                && t.contains("| TTFT p50, HTTP | ≤ 60 ms | 41.50 | met |")
        );
        assert!(
            t.contains("| HTTP within 5% of in-process | throughput ratio ≥ 0.95 | 0.969 | met |"),
            "{t}"
        );
        assert!(
            t.contains("Goals met: 5 of 6.")
                && t.contains("GPU X, driver 580.1")
                && t.contains("13 passed, 0 failed")
        );
        // The goals follow the figures: a slow TPOT, a mismatch, a missing in-process run.
        let mut bad = j.clone();
        bad["http"] = run("http", 31000.0, 3.5, 2);
        bad["inprocess"] = serde_json::Value::Null;
        let t = render(&b, &bad).unwrap();
        assert!(t.contains("| TPOT p99, HTTP | ≤ 3 ms | 3.500 | **not met** |"), "{t}");
        assert!(
            t.contains("| HTTP within 5% of in-process | throughput ratio ≥ 0.95 | — | **not met** |"),
            "{t}"
        );
        assert!(t.contains("29438 / 29440 (2 streams differ)") && t.contains("Goals met: 2 of 6."), "{t}");
        assert!(t.contains("| in-process: `llama-batch-bench` | — |"), "{t}");
        let page = "x\n<!-- generated:begin serve-h100.json serve -->\n<!-- generated:end -->\n";
        let once = fill(page, |b| render(b, &j)).unwrap();
        assert_eq!(fill(&once, |b| render(b, &j)).unwrap(), once);
        assert!(render(&b, &json!({"gpu": "x"})).is_err(), "not a serve report");
    }

    /// Before the first run the page is left as committed; once the JSON exists it is generated.
    #[test]
    fn a_missing_serve_json_skips_the_page() {
        let dir = tempfile::tempdir().unwrap();
        let page = "# Serving\n<!-- generated:begin serve-h100.json serve -->\n<!-- generated:end -->\n";
        std::fs::write(dir.path().join("serve.md"), page).unwrap();
        let (pages, unquoted) = super::super::tables::regenerate(dir.path()).unwrap();
        assert_eq!((pages.len(), pages[0].generated.as_str(), unquoted.len()), (1, page, 0));
        let j = json!({"gpu": "G", "http": run("http", 1.0, 1.0, 0), "inprocess": null});
        std::fs::write(dir.path().join("serve-h100.json"), j.to_string()).unwrap();
        let (pages, unquoted) = super::super::tables::regenerate(dir.path()).unwrap();
        assert!(
            pages[0].generated.contains("| HTTP: `llama-serve`") && unquoted.is_empty(),
            "{}",
            pages[0].generated
        );
        // Other views stay strict: a missing file is an error.
        std::fs::write(
            dir.path().join("other.md"),
            page.replace(" serve -->", " -->").replace("serve-h100", "nope"),
        )
        .unwrap();
        assert!(super::super::tables::regenerate(dir.path()).is_err());
    }
}

//! The `decode` view of `bench-decode`'s JSON: ms per step by batch, this project against the
//! PyTorch baselines of the same run — the hand-written static-cache model in the style of
//! gpt-fast (`scripts/torch_static_decode.py`, key `gpt_fast`) and Hugging Face transformers
//! (`scripts/torch_decode_bench.py`, key `torch`) — then PyTorch's time to first token.
//! Files written before a baseline existed render "—" in its columns.

use super::tables::{md_table, text};
use anyhow::{Context, Result};
use serde_json::Value;
use std::fmt::Write as _;

const STATIC: &str = "PyTorch static cache (gpt-fast style)";
const HF: &str = "Hugging Face transformers";

/// (JSON key under `gpt_fast.decode` or `torch`, column header, short name for "vs fastest").
const GPT_FAST: [(&str, &str, &str); 4] = [
    ("eager", "eager", "gpt-fast eager"),
    ("cuda_graph", "CUDA graph", "gpt-fast CUDA graph"),
    ("compile_reduce_overhead", "`torch.compile` reduce-overhead", "gpt-fast reduce-overhead"),
    ("compile_max_autotune", "`torch.compile` max-autotune", "gpt-fast max-autotune"),
];
const HF_MODES: [(&str, &str, &str); 3] = [
    ("eager", "eager", "HF eager"),
    ("cudagraph", "CUDA graph", "HF CUDA graph"),
    ("compile", "`torch.compile` reduce-overhead", "HF compile"),
];

fn num(v: Option<&Value>) -> Option<f64> {
    v.and_then(Value::as_f64)
}

fn ms(v: Option<f64>) -> String {
    v.map_or("—".into(), |x| format!("{x:.3}"))
}

/// A baseline's cell: its ms, or why there is none ("skipped: …", "error"), or "—".
fn baseline_cell(entry: Option<&Value>) -> (String, Option<f64>) {
    match entry {
        Some(e) => match num(e.get("ms")) {
            Some(x) => (ms(Some(x)), Some(x)),
            None if e.get("skipped").is_some() => (format!("skipped: {}", text(&e["skipped"])), None),
            None if e.get("error").is_some() => ("error".into(), None),
            None => ("—".into(), None),
        },
        None => ("—".into(), None),
    }
}

/// `bench-decode`: ms per step by batch, this project against PyTorch from the same run.
pub(super) fn decode_table(j: &Value, file: &str) -> Result<String> {
    let hf = j.get("torch");
    let gf = j.get("gpt_fast");
    let rows = j.get("rows").and_then(Value::as_array).context("no `rows` array")?;
    let mut out = Vec::new();
    for r in rows {
        let batch = r.get("batch").context("a row without `batch`")?.to_string();
        let graph = num(r.get("graph_ms")).context("a row without `graph_ms`")?;
        let mut row = vec![batch.clone(), format!("**{graph:.3}**"), ms(num(r.get("eager_ms")))];
        let mut fastest: Option<(f64, &str)> = None;
        let cols = GPT_FAST
            .iter()
            .map(|&(k, _, short)| (gf.and_then(|g| g.get("decode")?.get(k)?.get(&batch)), short))
            .chain(HF_MODES.iter().map(|&(k, _, short)| (hf.and_then(|t| t.get(k)?.get(&batch)), short)));
        for (entry, short) in cols {
            let (c, v) = baseline_cell(entry);
            row.push(c);
            if let Some(v) = v.filter(|v| fastest.is_none_or(|(f, _)| *v < f)) {
                fastest = Some((v, short));
            }
        }
        row.push(fastest.map_or("—".into(), |(t, who)| {
            if t >= graph {
                format!("{:.2}× faster than {who}", t / graph)
            } else {
                format!("{:.2}× slower than {who}", graph / t)
            }
        }));
        row.push(ms(num(r.get("floor_ms"))));
        row.push(num(r.get("floor_share")).map_or("—".into(), |x| format!("{:.1}%", x * 100.0)));
        row.push(ms(num(r.get("copy_floor_ms"))));
        out.push(row);
    }
    let mut header = vec!["batch".to_string(), "this project (graph)".into(), "eager launches".into()];
    header.extend(GPT_FAST.iter().map(|(_, h, _)| format!("{STATIC} {h}")));
    header.extend(HF_MODES.iter().map(|(_, h, _)| format!("{HF} {h}")));
    header.extend([
        "vs fastest PyTorch".to_string(),
        "bandwidth floor".into(),
        "share of floor".into(),
        "floor at measured copy bandwidth".into(),
    ]);
    let mut s = md_table(&header, &out);
    let str_of = |v: Option<&Value>| v.map_or("—".into(), text);
    let _ = write!(
        s,
        "\n`bench-decode` on {}, shape {}, context {}, {} steps, median of {} repetitions; {HF} with \
         PyTorch {} on {}, {}",
        str_of(j.get("gpu")),
        str_of(j.get("shape")),
        str_of(j.get("context")),
        str_of(j.get("steps")),
        str_of(j.get("reps")),
        str_of(hf.and_then(|t| t.get("torch"))),
        str_of(hf.and_then(|t| t.get("gpu"))),
        hf.and_then(|t| t.get("reps"))
            .map_or("repetitions not recorded".into(), |r| format!("{} repetitions", text(r))),
    );
    if let Some(g) = gf.filter(|g| g.is_object()) {
        let _ = write!(
            s,
            "; {STATIC}: PyTorch {} on {}, {} repetitions, weights {}",
            str_of(g.get("torch_version")),
            str_of(g.get("gpu")),
            str_of(g.get("reps")),
            str_of(g.get("weights")),
        );
    }
    let _ = writeln!(s, ". JSON: [`{file}`]({file}).");
    if let Some(m) = gf.and_then(|g| g.get("matches")).and_then(Value::as_object).filter(|m| !m.is_empty()) {
        let parts: Vec<String> = m
            .iter()
            .flat_map(|(variant, by_batch)| {
                by_batch.as_object().into_iter().flatten().map(move |(b, x)| {
                    let first = x.get("first_diff").filter(|f| !f.is_null());
                    format!(
                        "{variant} batch {b} {}/{}{}",
                        str_of(x.get("equal")),
                        str_of(x.get("of")),
                        first.map_or(String::new(), |f| format!(" (first differing step {})", text(f)))
                    )
                })
            })
            .collect();
        let _ = writeln!(s, "{STATIC} tokens equal to its own eager run's: {}.", parts.join(", "));
    }
    let scalars: Vec<String> = j
        .as_object()
        .into_iter()
        .flatten()
        .filter(|(k, v)| {
            !["bench", "gpu", "shape", "context", "steps", "reps"].contains(&k.as_str()) && !v.is_object()
        })
        .filter(|(_, v)| !v.is_array())
        .map(|(k, v)| format!("`{k}` {}", text(v)))
        .collect();
    if !scalars.is_empty() {
        let _ = writeln!(s, "Other figures of the run: {}.", scalars.join(", "));
    }
    ttft(&mut s, gf, j.get("ttft").and_then(Value::as_object));
    Ok(s)
}

/// Time to first token at batch 1: this project's prefill graphs (`ttft`, when the file has it)
/// beside `gpt_fast.ttft`, a table by prompt length when either is present.
fn ttft(s: &mut String, gf: Option<&Value>, ours: Option<&serde_json::Map<String, Value>>) {
    let t = gf.and_then(|g| g.get("ttft")).and_then(Value::as_object);
    if t.is_none() && ours.is_none() {
        return;
    }
    let mut lens: Vec<(u64, String)> = ["eager", "compile"]
        .iter()
        .filter_map(|k| t?.get(*k)?.as_object())
        .flat_map(|m| m.keys().filter_map(|n| Some((n.parse().ok()?, n.clone()))))
        .chain(ours.into_iter().flat_map(|m| m.keys().filter_map(|n| Some((n.parse().ok()?, n.clone())))))
        .collect();
    lens.sort();
    lens.dedup();
    if lens.is_empty() {
        return;
    }
    let cell = |v: Option<&Value>| {
        v.map_or("—".into(), |v| match v.as_f64() {
            Some(x) => format!("{x:.3}"),
            None => "error".into(),
        })
    };
    let rows: Vec<Vec<String>> = lens
        .iter()
        .map(|(_, n)| {
            let c = |k: &str| cell(t.and_then(|t| t.get(k)).and_then(|m| m.get(n)));
            let mut row = vec![n.clone()];
            if let Some(o) = ours {
                row.push(cell(o.get(n)));
            }
            row.extend([c("eager"), c("compile")]);
            row
        })
        .collect();
    let mut header = vec!["prompt tokens (batch 1)".to_string()];
    if ours.is_some() {
        header.push("this project (prefill graphs), ms to first token".into());
    }
    header.extend([
        format!("{STATIC} eager, ms to first token"),
        format!("{STATIC} `torch.compile` reduce-overhead, ms to first token"),
    ]);
    let ours_text = if ours.is_some() {
        " This project: the prompt in chunks of the largest prefill bucket, each chunk one graph \
         replay (GEMMs over the chunk, causal attention over the cache), the first token back on the \
         host. PyTorch:"
    } else {
        ""
    };
    let _ = write!(
        s,
        "\nTime to first token:{ours_text} prompt ids to the GPU, one forward over the prompt (causal SDPA, \
         logits of the last position), argmax back on the host; median of the repetitions.\n\n{}",
        md_table(&header, &rows)
    );
}

/// The `decode-goals` view: the flagship issue's goals (Llama-3.2-1B shape, H100) against one
/// `bench-decode` run — ms per step at batch 1, 16 and 64, time to first token of a 512-token
/// prompt, the awaited step against the blocking one on both runtimes, and the awaiting thread's
/// CPU share. A figure the file lacks renders "not run". On an H200 (the run's `gpu` names one)
/// batch 1 is held to the H200 goal, 0.74 ms; the issue gives the batched goals for the
/// H100 only, and they are labelled so.
pub(super) fn goals_table(j: &Value, file: &str) -> Result<String> {
    let rows = j.get("rows").and_then(Value::as_array).context("no `rows` array")?;
    let step = |b: u64| {
        rows.iter()
            .find(|r| r.get("batch").and_then(Value::as_u64) == Some(b))
            .and_then(|r| num(r.get("graph_ms")))
    };
    let met = |ok: bool| if ok { "yes".to_string() } else { "**no**".to_string() };
    let mut out: Vec<Vec<String>> = Vec::new();
    let mut push = |goal: &str, got: Option<(String, bool)>| {
        let (g, m) = got.map_or(("—".into(), "not run".into()), |(g, ok)| (g, met(ok)));
        out.push(vec![goal.into(), g, m]);
    };
    let h200 = j.get("gpu").and_then(Value::as_str).is_some_and(|g| g.contains("H200"));
    let goals = if h200 {
        [
            (1, 0.74, "batch 1 ≤ 0.74 ms per token (the H200 goal)"),
            (16, 1.10, "batch 16 ≤ 1.10 ms per step (the H100 goal)"),
            (64, 1.50, "batch 64 ≤ 1.50 ms per step (the H100 goal: ≥ 42,000 tokens/s)"),
        ]
    } else {
        [
            (1, 0.95, "batch 1 ≤ 0.95 ms per token"),
            (16, 1.10, "batch 16 ≤ 1.10 ms per step"),
            (64, 1.50, "batch 64 ≤ 1.50 ms per step (≥ 42,000 tokens/s)"),
        ]
    };
    for (b, limit, goal) in goals {
        push(goal, step(b).map(|v| (format!("{v:.3} ms ({:.0} tokens/s)", b as f64 * 1e3 / v), v <= limit)));
    }
    let torch_512 = num(j.pointer("/gpt_fast/ttft/compile/512"))
        .map_or(String::new(), |t| format!(" (PyTorch `torch.compile` reduce-overhead: {t:.3} ms)"));
    push(
        "a 512-token prompt prefilled (time to first token) in ≤ 4 ms",
        num(j.pointer("/ttft/512")).map(|v| (format!("{v:.3} ms{torch_512}"), v <= 4.0)),
    );
    // Since the per-step timings (`step_median_us`): the median step awaited against the median
    // step blocking, with the older figure (medians of runs' mean steps) beside it; before them,
    // that older figure alone.
    let (cur, multi) = (num(j.get("await_vs_blocking_us")), num(j.get("await_multi_thread_vs_blocking_us")));
    let (step_cur, step_multi) = (
        num(j.get("await_vs_blocking_step_median_us")),
        num(j.get("await_multi_thread_vs_blocking_step_median_us")),
    );
    let awaited = match (step_cur.zip(step_multi), cur.zip(multi)) {
        (Some((c, m)), means) => {
            let n = num(j.pointer("/step_median_us/steps_each"))
                .map_or(String::new(), |n| format!(" of {n:.0} steps each"));
            let means = means.map_or(String::new(), |(a, b)| {
                format!("; medians of runs' mean steps: {a:+.1} / {b:+.1} µs")
            });
            Some((
                format!("{c:+.1} µs current-thread, {m:+.1} µs multi-thread (median steps{n}{means})"),
                c <= 5.0 && m <= 5.0,
            ))
        }
        (None, Some((c, m))) => {
            Some((format!("{c:+.1} µs current-thread, {m:+.1} µs multi-thread"), c <= 5.0 && m <= 5.0))
        }
        (None, None) => None,
    };
    push(
        "a step awaited from tokio within 5 µs of the blocking step (median; current-thread and multi-thread runtimes)",
        awaited,
    );
    push(
        "an idle executor thread does not spin for the whole step (on the CPU for under half of it)",
        num(j.get("awaited_cpu_share")).map(|c| {
            let bl = num(j.get("blocking_cpu_share"))
                .map_or(String::new(), |b| format!(" (blocking: {:.0} %)", b * 100.0));
            (format!("on the CPU {:.0} % of an awaited step{bl}", c * 100.0), c < 0.5)
        }),
    );
    let header = ["goal (Llama-3.2-1B shape)".to_string(), "this run".into(), "met".into()];
    let gpu = j.get("gpu").map_or("—".into(), text);
    Ok(format!(
        "{}
From [`{file}`]({file}) ({gpu}).
",
        md_table(&header, &out)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn run(gpt_fast: Value) -> Value {
        json!({
            "bench": "decode", "gpu": "GPU X", "shape": "llama-3.2-1b", "context": 128, "steps": 64, "reps": 5,
            "rows": [{"batch": 1, "graph_ms": 1.0, "eager_ms": 1.1, "floor_ms": 0.7, "floor_share": 0.7, "copy_floor_ms": 0.78},
                     {"batch": 16, "graph_ms": 2.0, "eager_ms": 2.1, "floor_ms": 0.8, "floor_share": 0.4}],
            "torch": {"torch": "2.11", "gpu": "GPU X", "reps": 5, "eager": {"1": {"ms": 16.0}},
                      "cudagraph": {"1": {"ms": 2.8}}, "compile": {"1": {"ms": 2.4}, "16": {"error": "E"}}},
            "gpt_fast": gpt_fast, "blocking_ms": 1.0,
        })
    }

    #[test]
    fn baselines_render_by_name_and_missing_ones_as_dashes() {
        let j = run(json!({
            "torch_version": "2.11", "gpu": "GPU X", "reps": 5, "weights": "seeded",
            "decode": {"eager": {"1": {"ms": 6.0}, "16": {"ms": 7.0}}, "cuda_graph": {"1": {"ms": 0.8}},
                       "compile_reduce_overhead": {"1": {"ms": 1.5}, "16": {"ms": 2.5}},
                       "compile_max_autotune": {"1": {"skipped": "time limit (240 s)"}}},
            "matches": {"cuda_graph": {"1": {"equal": 384, "of": 384, "first_diff": null}},
                        "compile_reduce_overhead": {"16": {"equal": 10, "of": 6144, "first_diff": 3}}},
            "ttft": {"eager": {"512": 9.0, "128": 5.0}, "compile": {"128": 2.0, "2048": {"error": "OOM"}}},
        }));
        let s = decode_table(&j, "x.json").unwrap();
        assert!(s.contains("PyTorch static cache (gpt-fast style) CUDA graph"), "{s}");
        assert!(s.contains("| floor at measured copy bandwidth |"), "{s}");
        // A row (or a file) without the measured floor shows a dash.
        assert!(s.contains("| 0.800 | 40.0% | — |"), "{s}");
        assert!(s.contains("Hugging Face transformers CUDA graph"), "{s}");
        assert!(
            s.contains(
                "| 1 | **1.000** | 1.100 | 6.000 | 0.800 | 1.500 | skipped: time limit (240 s) | 16.000 | 2.800 \
                 | 2.400 | 1.25× slower than gpt-fast CUDA graph | 0.700 | 70.0% | 0.780 |"
            ),
            "{s}"
        );
        assert!(
            s.contains("| 16 | **2.000** | 2.100 | 7.000 | — | 2.500 | — | — | — | error | 1.25× faster than gpt-fast reduce-overhead |"),
            "{s}"
        );
        assert!(s.contains(
            "cuda_graph batch 1 384/384, compile_reduce_overhead batch 16 10/6144 (first differing step 3)"
        ));
        assert!(s.contains("| 128 | 5.000 | 2.000 |\n| 512 | 9.000 | — |\n| 2048 | — | error |"), "{s}");
        assert!(s.contains("Hugging Face transformers with PyTorch 2.11 on GPU X, 5 repetitions"));
        // Text after the time-to-first-token table would join it: the table comes last.
        assert!(s.ends_with("| 2048 | — | error |\n"), "{s}");
    }

    #[test]
    fn our_time_to_first_token_joins_the_table() {
        let mut j = run(json!({"ttft": {"eager": {"128": 5.0}, "compile": {"128": 2.0}}}));
        j["ttft"] = json!({"128": 1.5, "2048": 9.25});
        let s = decode_table(&j, "x.json").unwrap();
        assert!(s.contains("this project (prefill graphs), ms to first token"), "{s}");
        assert!(s.contains("| 128 | 1.500 | 5.000 | 2.000 |\n| 2048 | 9.250 | — | — |"), "{s}");
    }

    /// On an H200 batch 1 is held to 0.74 ms: 0.9 ms meets the H100 goal but not this one.
    #[test]
    fn an_h200_run_is_held_to_the_h200_goal() {
        let j = json!({"gpu": "NVIDIA H200", "rows": [{"batch": 1, "graph_ms": 0.9}, {"batch": 16, "graph_ms": 1.0}]});
        let s = goals_table(&j, "f.json").unwrap();
        assert!(
            s.contains("| batch 1 ≤ 0.74 ms per token (the H200 goal) | 0.900 ms (1111 tokens/s) | **no** |"),
            "{s}"
        );
        assert!(
            s.contains("| batch 16 ≤ 1.10 ms per step (the H100 goal) | 1.000 ms (16000 tokens/s) | yes |"),
            "{s}"
        );
    }

    #[test]
    fn goals_follow_the_run_and_missing_figures_say_not_run() {
        let j = json!({"gpu": "G", "rows": [{"batch": 1, "graph_ms": 0.9}, {"batch": 64, "graph_ms": 2.0}],
            "ttft": {"512": 3.4}, "await_vs_blocking_us": 4.0, "await_multi_thread_vs_blocking_us": 6.0});
        let s = goals_table(&j, "f.json").unwrap();
        assert!(s.contains("| batch 1 ≤ 0.95 ms per token | 0.900 ms (1111 tokens/s) | yes |"), "{s}");
        assert!(s.contains("| batch 16 ≤ 1.10 ms per step | — | not run |"), "{s}");
        assert!(s.contains("2.000 ms (32000 tokens/s) | **no** |"), "{s}");
        assert!(s.contains("3.400 ms | yes |"), "{s}");
        assert!(s.contains("+4.0 µs current-thread, +6.0 µs multi-thread | **no** |"), "{s}");
        assert!(
            s.contains("does not spin for the whole step (on the CPU for under half of it) | — | not run |"),
            "{s}"
        );
    }

    #[test]
    fn the_awaited_goal_reads_the_median_steps_when_the_run_has_them() {
        let j = json!({"gpu": "G", "rows": [], "await_vs_blocking_us": 9.0, "await_multi_thread_vs_blocking_us": 12.0,
            "step_median_us": {"steps_each": 896.0}, "await_vs_blocking_step_median_us": 3.5,
            "await_multi_thread_vs_blocking_step_median_us": 4.25});
        let s = goals_table(&j, "f.json").unwrap();
        assert!(
            s.contains("+3.5 µs current-thread, +4.2 µs multi-thread (median steps of 896 steps each; medians of runs' mean steps: +9.0 / +12.0 µs) | yes |"),
            "{s}"
        );
        let mut j = j;
        j["await_multi_thread_vs_blocking_step_median_us"] = json!(5.5);
        assert!(goals_table(&j, "f.json").unwrap().contains("multi-thread (median steps of 896 steps each; medians of runs' mean steps: +9.0 / +12.0 µs) | **no** |"));
    }

    #[test]
    fn files_without_the_static_baseline_render() {
        let s = decode_table(&run(Value::Null), "x.json").unwrap();
        assert!(s.contains("| 1 | **1.000** | 1.100 | — | — | — | — | 16.000 | 2.800 | 2.400 | 2.40× faster than HF compile |"), "{s}");
        assert!(!s.contains("Time to first token") && !s.contains("own eager run"), "{s}");
    }
}

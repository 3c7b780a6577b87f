//! The `vs:OTHER.json` view of `bench-plot tables`: the rows of a comparison report beside the same
//! rows of an earlier report of the same benchmark (`OTHER.json`, same folder), ratio by ratio, to
//! show what a change did to the framework/raw ratios (same benchmark program, two runs).

use super::runner::{fmt_value, Report};
use super::tables::md_table;
use anyhow::{ensure, Context, Result};
use serde_json::Value;
use std::fmt::Write as _;

/// The comparison table of `new` (quoted as `file`) against `old` (quoted as `other`).
pub(super) fn compare_table(new: &Value, file: &str, old: &Value, other: &str) -> Result<String> {
    let n: Report =
        serde_json::from_value(new.clone()).with_context(|| format!("{file}: not a comparison report"))?;
    let o: Report =
        serde_json::from_value(old.clone()).with_context(|| format!("{other}: not a comparison report"))?;
    ensure!(n.benchmark == o.benchmark, "{file} is `{}`, {other} is `{}`", n.benchmark, o.benchmark);
    let ratio = |r: Option<f64>| r.filter(|x| x.is_finite()).map_or("—".to_string(), fmt_value);
    let met = |m: Option<bool>| match m {
        Some(true) => "yes",
        Some(false) => "**no**",
        None => "—",
    };
    let mut rows = Vec::new();
    for r in &n.rows {
        let before = o.rows.iter().find(|x| x.name == r.name);
        let (rb, mb) = (before.and_then(|b| b.ratio), before.and_then(|b| b.met));
        let change = match (r.ratio, rb) {
            (Some(a), Some(b)) if a.is_finite() && b.is_finite() && b != 0.0 => {
                format!("{:+.1}%", (a / b - 1.0) * 100.0)
            }
            _ => "—".into(),
        };
        rows.push(vec![
            r.name.clone(),
            ratio(rb),
            ratio(r.ratio),
            change,
            r.goal_max_ratio.map_or("—".into(), |g| format!("≤ {}", fmt_value(g))),
            met(mb).to_string(),
            met(r.met).to_string(),
        ]);
    }
    let header: Vec<String> =
        ["row", "ratio before", "ratio after", "change", "goal", "met before", "met after"]
            .iter()
            .map(|s| s.to_string())
            .collect();
    let mut s = md_table(&header, &rows);
    let date = |r: &Report| {
        r.meta.get("date_utc").and_then(Value::as_str).unwrap_or("date not recorded").to_string()
    };
    let _ = writeln!(
        s,
        "\nRatios are framework / raw (lower is better for times, see each row's unit in its report). \
         Before: [`{other}`]({other}) ({}); after: [`{file}`]({file}) ({}).",
        date(&o),
        date(&n)
    );
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn report(ratio: f64, met: bool) -> Value {
        json!({"benchmark": "b", "meta": {"date_utc": "d"}, "rows": [
            {"name": "r", "unit": "us", "raw": 1.0, "framework": ratio, "ratio": ratio, "goal_max_ratio": 1.1, "met": met}
        ], "all_met": met})
    }

    #[test]
    fn ratios_side_by_side() {
        let t = compare_table(&report(1.2, false), "new.json", &report(1.0, true), "old.json").unwrap();
        assert!(t.contains("| r | 1.000 | 1.200 | +20.0% | ≤ 1.100 | yes | **no** |"), "{t}");
        assert!(t.contains("[`old.json`](old.json)"));
    }

    #[test]
    fn other_benchmark_refused() {
        let mut other = report(1.0, true);
        other["benchmark"] = json!("c");
        assert!(compare_table(&report(1.0, true), "a", &other, "b").is_err());
    }
}

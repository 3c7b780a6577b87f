//! `bench-plot`: the headline ratios (framework / raw, lower is better) of benchmark JSON files as
//! one SVG bar chart, each bar coloured by its goal (green met, red missed, grey no goal) with the
//! goal marked. Reads the files written by `--json` (old and new schema alike) and prints each
//! one's table.
//!
//! `cargo run -p cuda-async-examples --bin bench-plot -- [FILES...] [--out PATH]`
//! (default: `docs/results/*-h100.json` into `docs/results/ratios.svg`)
//!
//! `bench-plot tables [--check] [--dir docs/results]` regenerates the results tables of the
//! folder's Markdown pages from its JSON files (between `<!-- generated:begin FILE [VIEW] -->` and
//! `<!-- generated:end -->`, see `cuda_async_examples::bench::tables`); with `--check` it writes
//! nothing and exits non-zero, showing the differences, if a committed table is not what its JSON
//! gives or a JSON file of the folder is quoted by no table.

use anyhow::{bail, ensure, Context, Result};
use clap::Parser;
use cuda_async_examples::bench::{tables, Report};
use plotters::coord::ranged1d::SegmentValue;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use std::path::PathBuf;

/// Plots the framework / raw ratios of benchmark JSON files as SVG, or (`tables`) generates the
/// results tables of the Markdown pages from the JSON files.
#[derive(Parser)]
#[command(args_conflicts_with_subcommands = true)]
struct Args {
    #[command(subcommand)]
    cmd: Option<Cmd>,
    /// Benchmark JSON files (default: docs/results/*-h100.json)
    files: Vec<PathBuf>,
    /// The SVG to write
    #[arg(long, value_name = "PATH", default_value = "docs/results/ratios.svg")]
    out: PathBuf,
}

#[derive(clap::Subcommand)]
enum Cmd {
    /// Regenerate the tables between the generated:begin/end markers of the pages
    Tables {
        /// Write nothing; exit non-zero if a committed table differs from its JSON
        #[arg(long)]
        check: bool,
        /// The results folder (pages and JSON)
        #[arg(long, value_name = "DIR", default_value = "docs/results")]
        dir: PathBuf,
    },
}

/// One bar: label, ratio, goal, met.
type Bar = (String, f64, Option<f64>, Option<bool>);

fn main() -> Result<()> {
    let mut a = Args::parse();
    if let Some(Cmd::Tables { check, dir }) = a.cmd {
        return make_tables(&dir, check);
    }
    if a.files.is_empty() {
        for e in std::fs::read_dir("docs/results").context("reading docs/results")? {
            let p = e?.path();
            if p.to_string_lossy().ends_with("-h100.json") {
                a.files.push(p);
            }
        }
        a.files.sort();
    }
    let mut reports = Vec::new();
    for f in &a.files {
        let text = std::fs::read_to_string(f).with_context(|| format!("reading {}", f.display()))?;
        // Files of other shapes (e.g. bench-decode's per-batch table) have no framework/raw rows.
        let r: Report = match serde_json::from_str(&text) {
            Ok(r) => r,
            Err(e) => {
                println!("== {}: not a framework/raw report, skipped ({e})", f.display());
                continue;
            }
        };
        println!("== {} ({})\n{}", f.display(), r.benchmark, r.table());
        let gpu = r.meta.get("gpu").and_then(|g| g.as_str()).unwrap_or("unknown GPU").to_string();
        reports.push((r, gpu));
    }
    let mut gpus: Vec<&str> = reports.iter().map(|(_, g)| g.as_str()).collect();
    gpus.dedup();
    let mut bars: Vec<Bar> = Vec::new();
    for (r, gpu) in &reports {
        // CPU-time rows of older files are diagnostics (newer files keep CPU time in columns).
        let rows =
            r.rows.iter().filter(|row| row.ratio.is_some_and(f64::is_finite) && !row.unit.contains("CPU"));
        for row in rows {
            let on = if gpus.len() > 1 { format!(" [{gpu}]") } else { String::new() };
            bars.push((
                format!("{}: {}{on}", r.benchmark, row.name),
                row.ratio.unwrap_or_default(),
                row.goal_max_ratio,
                row.met,
            ));
        }
    }
    ensure!(!bars.is_empty(), "no rows with a ratio in {:?}", a.files);
    let caption = format!(
        "framework / raw, lower is better ({}): green goal met, red missed, grey no goal; black tick = goal",
        gpus.join(", ")
    );
    plot(&bars, &caption, &a.out)?;
    println!("wrote {} ({} bars)", a.out.display(), bars.len());
    Ok(())
}

/// `tables`: regenerates (or with `check`, compares) every page's generated blocks.
fn make_tables(dir: &std::path::Path, check: bool) -> Result<()> {
    let (pages, unquoted) = tables::regenerate(dir)?;
    let mut stale = 0;
    for p in &pages {
        let blocks = tables::blocks(&p.committed)?.len();
        if p.committed == p.generated {
            if blocks > 0 {
                println!("{}: {blocks} generated table(s) up to date", p.path.display());
            }
        } else if check {
            stale += 1;
            println!("{}: differs from its JSON (- committed, + generated):", p.path.display());
            print!("{}", tables::diff(&p.committed, &p.generated));
        } else {
            std::fs::write(&p.path, &p.generated).with_context(|| format!("writing {}", p.path.display()))?;
            println!("{}: wrote {blocks} generated table(s)", p.path.display());
        }
    }
    for f in &unquoted {
        println!("{}: quoted by no generated table", dir.join(f).display());
    }
    if stale > 0 {
        bail!(
            "{stale} page(s) differ from the JSON: run `cargo run -p cuda-async-examples --bin bench-plot -- tables`"
        );
    }
    ensure!(
        unquoted.is_empty(),
        "{} JSON file(s) of {} quoted by no generated table",
        unquoted.len(),
        dir.display()
    );
    Ok(())
}

fn plot(bars: &[Bar], caption: &str, out: &std::path::Path) -> Result<()> {
    let n = bars.len();
    let root = SVGBackend::new(out, (1200, 90 + 24 * n as u32)).into_drawing_area();
    root.fill(&WHITE)?;
    let xmax = bars.iter().flat_map(|b| [b.1, b.2.unwrap_or(0.0)]).fold(1.0, f64::max) * 1.15;
    let mut chart = ChartBuilder::on(&root)
        .caption(caption, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(30)
        .y_label_area_size(560)
        .build_cartesian_2d(0.0..xmax, (0..n).into_segmented())?;
    // Row i is drawn at n - 1 - i, so the first bar is at the top.
    let at = |i: usize| SegmentValue::CenterOf(n - 1 - i);
    let label = |v: &SegmentValue<usize>| match v {
        SegmentValue::CenterOf(k) if *k < n => bars[n - 1 - k].0.clone(),
        _ => String::new(),
    };
    chart
        .configure_mesh()
        .label_style(("sans-serif", 15))
        .disable_y_mesh()
        .y_labels(n)
        .y_label_formatter(&label)
        .x_desc("ratio")
        .draw()?;
    let colour = |met: Option<bool>| match met {
        Some(true) => RGBColor(60, 160, 90),
        Some(false) => RGBColor(210, 70, 60),
        None => RGBColor(150, 150, 150),
    };
    chart.draw_series(bars.iter().enumerate().map(|(i, b)| {
        let (lo, hi) = (SegmentValue::Exact(n - 1 - i), SegmentValue::Exact(n - i));
        let mut r = Rectangle::new([(0.0, lo), (b.1, hi)], colour(b.3).filled());
        r.set_margin(4, 4, 0, 0);
        r
    }))?;
    chart.draw_series(bars.iter().enumerate().filter_map(|(i, b)| {
        let (lo, hi) = (SegmentValue::Exact(n - 1 - i), SegmentValue::Exact(n - i));
        Some(PathElement::new(vec![(b.2?, lo), (b.2?, hi)], BLACK.stroke_width(3)))
    }))?;
    let value = TextStyle::from(("sans-serif", 14).into_font()).pos(Pos::new(HPos::Left, VPos::Center));
    chart.draw_series(
        bars.iter().enumerate().map(|(i, b)| Text::new(format!("  {:.3}", b.1), (b.1, at(i)), value.clone())),
    )?;
    chart.draw_series(LineSeries::new(
        [(1.0, SegmentValue::Exact(0)), (1.0, SegmentValue::Exact(n))],
        &BLUE,
    ))?;
    root.present()?;
    Ok(())
}

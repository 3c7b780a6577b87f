//! The benchmark toolkit: the comparison [`runner`], the tiny counter kernel ([`tiny`]), the raw
//! driver baseline ([`raw`]), and the start of every benchmark (options, GPU, report metadata).

pub mod compare_view;
pub mod decode_view;
pub mod raw;
pub mod runner;
pub mod serve_view;
pub mod tables;
pub mod tiny;

pub use runner::{median, Case, Goal, Report, Row, Runner};

use anyhow::{bail, Context, Result};
use cuda_core::{Device, Error};
use rand::rngs::SmallRng;
use rand::SeedableRng;
use serde::Serialize;
use std::path::PathBuf;

/// The options every comparison benchmark takes.
#[derive(clap::Args, Serialize, Debug, Clone)]
pub struct Common {
    /// Timed samples of each side; medians are reported
    #[arg(long, default_value_t = 9, value_parser = at_least_one)]
    pub repeats: usize,
    /// Untimed calls of each side before the timed samples
    #[arg(long, default_value_t = 1)]
    pub warmup: usize,
    /// Also write the results as JSON to PATH
    #[arg(long, value_name = "PATH")]
    #[serde(skip)]
    pub json: Option<PathBuf>,
}

/// A count of at least 1, for `value_parser`.
pub fn at_least_one(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(0) => Err("must be at least 1".into()),
        r => r.map_err(|e| e.to_string()),
    }
}

/// Opens device 0, saying clearly when there is no usable GPU.
pub fn open_device() -> Result<Device> {
    match cuda_core::gpu_available() {
        Ok(_) => {}
        Err(e @ Error::NoDriver { .. }) => bail!("no CUDA driver: {e}"),
        Err(e @ Error::NoDevice { .. }) => bail!("no CUDA device: {e}"),
        Err(e) => bail!("the CUDA driver is unusable: {e}"),
    }
    Device::new(0).context("opening device 0")
}

/// The start of a comparison benchmark: opens device 0 (made cuda-async's default device if
/// `async_default`), prints the banner, and returns a runner whose report already holds the date,
/// GPU, driver and NVRTC versions and every field of `params` (the parsed options).
pub fn start(
    name: &str,
    params: impl Serialize,
    common: &Common,
    async_default: bool,
) -> Result<(Device, Runner)> {
    let dev = open_device()?;
    if async_default {
        cuda_async::scheduling::set_default_device(dev.ordinal()).context("setting the default device")?;
    }
    let (dm, dn) = cuda_core::driver_version().context("reading the driver version")?;
    let arch = dev.sm_arch().context("reading the compute capability")?;
    let (nm, nn) = cuda_core::nvrtc::nvrtc_version().context("loading NVRTC")?;
    println!("{name}: {} ({arch}), driver CUDA {dm}.{dn}, NVRTC {nm}.{nn}", dev.name());
    let mut report = Report::new(name);
    report.meta("date_utc", utc_now());
    report.meta("gpu", dev.name());
    report.meta("arch", arch);
    report.meta("driver_cuda_version", format!("{dm}.{dn}"));
    report.meta("nvidia_kernel_module", nvidia_kernel_module_version());
    report.meta("nvrtc_version", format!("{nm}.{nn}"));
    report.meta_from(params);
    Ok((dev, Runner::new(report, common.repeats, common.warmup)))
}

/// A tokio runtime for the comparison benchmarks: a current-thread one, or a multi-thread one of
/// `workers` threads (tokio's default count for `None`), with timers and without the I/O driver.
///
/// The benchmarks do no I/O. Since `llama-load`'s HTTP client (reqwest) turned on tokio's `net`
/// feature for this package (2026-11-27), `enable_all` also starts the I/O driver: idle workers
/// then park in `epoll_wait` and are woken through an eventfd, a cost only the framework side of a
/// comparison pays (the raw side uses no tokio) and one the runs before that date did not have.
/// Timers only keeps the comparisons like for like with them.
///
/// # Errors
/// The runtime could not be built.
pub fn runtime(multi_thread: bool, workers: Option<usize>) -> Result<tokio::runtime::Runtime> {
    let mut b = if multi_thread {
        tokio::runtime::Builder::new_multi_thread()
    } else {
        tokio::runtime::Builder::new_current_thread()
    };
    if let (true, Some(n)) = (multi_thread, workers) {
        b.worker_threads(n);
    }
    Ok(b.enable_time().build()?)
}

/// A generator seeded from the clock (different every run); the seed goes into the report.
pub fn rng_from_time(report: &mut Report) -> SmallRng {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    let seed = nanos.as_nanos() as u64 ^ (u64::from(std::process::id()) << 32);
    report.meta("seed", format!("{seed:#018x}"));
    SmallRng::seed_from_u64(seed)
}

/// Now, UTC, as `YYYY-MM-DDTHH:MM:SSZ`.
pub fn utc_now() -> String {
    let now = time::OffsetDateTime::now_utc();
    now.replace_nanosecond(0)
        .unwrap_or(now)
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default()
}

/// The NVIDIA kernel module's version (e.g. `580.65.06`) from `/proc/driver/nvidia/version`.
pub fn nvidia_kernel_module_version() -> Option<String> {
    parse_module_version(std::fs::read_to_string("/proc/driver/nvidia/version").ok()?.lines().next()?)
}

/// The first `digits.digits[.digits]` token of that file's first line (its wording varies).
fn parse_module_version(line: &str) -> Option<String> {
    let version = |t: &&str| {
        t.contains('.') && t.split('.').all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
    };
    line.split_whitespace().find(version).map(str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn module_versions_and_dates() {
        let closed =
            "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.65.06  Sun Jul 27 06:54:38 UTC 2025";
        let open = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build";
        assert_eq!(parse_module_version(closed).as_deref(), Some("580.65.06"));
        assert_eq!(parse_module_version(open).as_deref(), Some("580.159.04"));
        assert_eq!(parse_module_version("no version here 1. .2"), None);
        let d = utc_now();
        assert!(d.len() == 20 && d.ends_with('Z') && d.as_bytes()[10] == b'T', "{d}");
        assert_eq!(at_least_one("0").unwrap_err(), "must be at least 1");
        assert_eq!(at_least_one("3"), Ok(3));
    }
}

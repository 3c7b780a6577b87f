//! `bench-allreduce`: NCCL all-reduce (sum, f32) over the GPUs of this machine, through the
//! framework (`cuda_core::nccl`, `cuda_async::nccl`) and through NCCL called directly (cudarc's
//! `sys` layer), eager and graph-captured, at sizes from 8 KB to 256 MB.
//!
//! Bandwidth as nccl-tests defines it: `algbw = bytes / time`, `busbw = algbw * 2 (n - 1) / n`
//! for `n` ranks (so 0 on one GPU, where the all-reduce is a copy; the time per all-reduce is still
//! meaningful there). Each sample queues `--iters` all-reduces on every rank, then waits.
//!
//! - eager, framework: `cuda_core::nccl::grouped::all_reduce` (one thread drives all ranks);
//!   raw: `ncclGroupStart`, one `ncclAllReduce` per rank, `ncclGroupEnd`.
//! - graph, framework: one `CudaGraph` per rank (`cuda_async::nccl::all_reduce(..).graph_on(..)`,
//!   captured on one thread per rank), replayed on every rank; raw: every rank's stream captured
//!   around one grouped all-reduce (as nccl-tests `-G` does), replayed with `cuGraphLaunch`.
//!
//! Afterwards every output must hold exactly `n (n + 1) / 2` (rank `r` sends `r + 1`).
//!
//! `cargo run --release -p cuda-async-examples --bin bench-allreduce -- --help` lists the options.

use anyhow::{ensure, Context, Result};
use clap::Parser;
use cuda_async::{nccl as ops, CudaGraph, DeviceOpExt};
use cuda_async_examples::bench::{self, Case, Common};
use cuda_core::nccl::{grouped, Communicator, ReduceOp};
use cuda_core::{Device, DeviceBuffer, Stream};
use cudarc::driver::sys as drv;
use cudarc::nccl::sys as nccl;
use serde_json::json;

/// NCCL all-reduce bandwidth: framework vs NCCL called directly, eager and graph-captured.
#[derive(Parser, serde::Serialize)]
struct Args {
    /// Smallest message, bytes
    #[arg(long, default_value_t = 8 << 10)]
    min_bytes: usize,
    /// Largest message, bytes
    #[arg(long, default_value_t = 256 << 20)]
    max_bytes: usize,
    /// Size step factor
    #[arg(long, default_value_t = 4, value_parser = bench::at_least_one)]
    factor: usize,
    /// All-reduces per sample
    #[arg(long, default_value_t = 20, value_parser = bench::at_least_one)]
    iters: usize,
    /// Ranks (GPUs) to use; default: all
    #[arg(long)]
    gpus: Option<usize>,
    #[command(flatten)]
    #[serde(flatten)]
    common: Common,
}

/// One rank's streams (framework and raw) and the raw side's buffers (of the largest size; the
/// raw calls use their first `count` elements).
struct RankBufs {
    stream: Stream,
    raw_stream: Stream,
    raw_send: DeviceBuffer<f32>,
    raw_recv: DeviceBuffer<f32>,
}

fn nccl_ok(r: nccl::ncclResult_t, what: &str) -> Result<()> {
    ensure!(r == nccl::ncclResult_t::ncclSuccess, "{what}: {r:?}");
    Ok(())
}

fn drv_ok(r: drv::CUresult, what: &str) -> Result<()> {
    ensure!(r == drv::CUresult::CUDA_SUCCESS, "{what}: {r:?}");
    Ok(())
}

/// The raw side's grouped all-reduce of `count` elements on every rank.
fn raw_all_reduce(comms: &[nccl::ncclComm_t], ranks: &[RankBufs], count: usize) -> Result<()> {
    // SAFETY: live communicators (destroyed at the end of main) and streams; each rank's buffers
    // hold `count` elements on its device; only this side's own buffers are used, and they are
    // touched by nothing else while the raw side runs.
    unsafe {
        nccl_ok(nccl::ncclGroupStart(), "ncclGroupStart")?;
        for (c, r) in comms.iter().zip(ranks) {
            let res = nccl::ncclAllReduce(
                r.raw_send.device_ptr() as *const _,
                r.raw_recv.device_ptr() as *mut _,
                count,
                nccl::ncclDataType_t::ncclFloat32,
                nccl::ncclRedOp_t::ncclSum,
                *c,
                r.raw_stream.raw() as _,
            );
            nccl_ok(res, "ncclAllReduce")?;
        }
        nccl_ok(nccl::ncclGroupEnd(), "ncclGroupEnd")
    }
}

/// Captures the raw grouped all-reduce on every rank's raw stream into one executable graph each.
fn raw_graphs(comms: &[nccl::ncclComm_t], ranks: &[RankBufs], count: usize) -> Result<Vec<drv::CUgraphExec>> {
    let mode = drv::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
    for r in ranks {
        r.raw_stream.device().bind()?;
        // SAFETY: a live stream of this side only, with nothing queued by anyone else meanwhile.
        drv_ok(unsafe { drv::cuStreamBeginCapture_v2(r.raw_stream.raw(), mode) }, "begin capture")?;
    }
    let issued = raw_all_reduce(comms, ranks, count);
    let mut execs = Vec::new();
    for r in ranks {
        r.raw_stream.device().bind()?;
        let (mut g, mut e) = (std::ptr::null_mut(), std::ptr::null_mut());
        // SAFETY: ends the capture begun above; valid out-pointers; the graph is destroyed once
        // instantiated (the executable graph does not need it).
        unsafe {
            drv_ok(drv::cuStreamEndCapture(r.raw_stream.raw(), &mut g), "end capture")?;
            drv_ok(drv::cuGraphInstantiateWithFlags(&mut e, g, 0), "instantiate")?;
            drv::cuGraphDestroy(g);
        }
        execs.push(e);
    }
    issued?;
    Ok(execs)
}

fn sync_all(ranks: &[RankBufs]) -> Result<()> {
    for r in ranks {
        r.stream.synchronize()?;
        r.raw_stream.synchronize()?;
    }
    Ok(())
}

fn main() -> Result<()> {
    // NCCL's policy variables (see `cuda_core::nccl`): set here, before any thread starts, where
    // changing the environment cannot race another thread's `getenv`.
    for var in cuda_core::nccl::POLICY_VARS {
        if std::env::var_os(var).is_none() {
            std::env::set_var(var, "0");
        }
    }
    if std::env::var_os(cuda_core::nccl::MIXING_VAR).is_none() {
        std::env::set_var(cuda_core::nccl::MIXING_VAR, "1");
    }
    let args = Args::parse();
    let (_, mut run) = bench::start("bench-allreduce", &args, &args.common, false)?;
    let all = Device::all()?;
    let n = args.gpus.unwrap_or(all.len()).min(all.len());
    ensure!(n >= 1, "no GPU");
    let devices = &all[..n];
    let (maj, min, patch) = cuda_core::nccl::version().context("loading NCCL")?;
    println!("{n} rank(s), NCCL {maj}.{min}.{patch}");
    run.report.meta("ranks", n);
    run.report.meta("nccl_version", format!("{maj}.{min}.{patch}"));
    for var in cuda_core::nccl::POLICY_VARS {
        run.report.meta(&var.to_lowercase(), std::env::var(var).unwrap_or_default());
    }
    let comms = Communicator::init_all(devices)?;
    let mut raw_comms = vec![std::ptr::null_mut(); n];
    let ordinals: Vec<i32> = devices.iter().map(|d| d.ordinal() as i32).collect();
    // SAFETY: room for `n` handles; `n` distinct valid ordinals.
    nccl_ok(unsafe { nccl::ncclCommInitAll(raw_comms.as_mut_ptr(), n as i32, ordinals.as_ptr()) }, "init")?;

    let max_count = args.max_bytes / 4;
    let mut ranks = Vec::new();
    for (i, d) in devices.iter().enumerate() {
        let (stream, raw_stream) = (d.new_stream()?, d.new_stream()?);
        let v = (i + 1) as f32;
        let raw_send = DeviceBuffer::filled(&raw_stream, max_count, v)?;
        let raw_recv = DeviceBuffer::zeros(&raw_stream, max_count)?;
        ranks.push(RankBufs { stream, raw_stream, raw_send, raw_recv });
    }
    sync_all(&ranks)?;

    let mut bandwidth = Vec::new();
    let iters = args.iters;
    let mut bytes = args.min_bytes.max(4);
    while bytes <= args.max_bytes {
        let count = bytes / 4;
        // The framework's buffers of exactly `count` elements (its collectives check lengths);
        // rank r sends r + 1, like the raw side.
        let mut views: Vec<(DeviceBuffer<f32>, DeviceBuffer<f32>)> = Vec::new();
        for (i, r) in ranks.iter().enumerate() {
            let send = DeviceBuffer::filled(&r.stream, count, (i + 1) as f32)?;
            let recv = DeviceBuffer::zeros(&r.stream, count)?;
            views.push((send, recv));
        }
        sync_all(&ranks)?;

        // Eager.
        let case = Case::new(format!("eager {bytes} B"), "us/all-reduce", iters, || {
            for _ in 0..iters {
                let mut parts: Vec<_> = views
                    .iter_mut()
                    .zip(&comms)
                    .zip(&ranks)
                    .map(|(((send, recv), comm), r)| grouped::Rank { comm, stream: &r.stream, send, recv })
                    .collect();
                grouped::all_reduce(&mut parts, ReduceOp::Sum)?;
            }
            sync_all(&ranks)
        })
        .raw(|| {
            for _ in 0..iters {
                raw_all_reduce(&raw_comms, &ranks, count)?;
            }
            sync_all(&ranks)
        })
        .note("framework: grouped::all_reduce; raw: ncclGroupStart + ncclAllReduce per rank + ncclGroupEnd");
        let row = run.run(case)?.clone();
        bandwidth.push(bw_entry("eager", bytes, n, row.framework, row.raw));

        // Graph-captured: one graph per rank, captured on one thread per rank.
        let graphs: Vec<CudaGraph<&mut DeviceBuffer<f32>>> = std::thread::scope(|t| {
            let handles: Vec<_> = views
                .iter_mut()
                .zip(&comms)
                .zip(&ranks)
                .map(|(((send, recv), comm), r)| {
                    let send: &DeviceBuffer<f32> = send;
                    t.spawn(move || ops::all_reduce(comm, send, recv, ReduceOp::Sum).graph_on(&r.stream))
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join().map_err(|_| anyhow::anyhow!("capture thread panicked"))?.map_err(Into::into)
                })
                .collect::<Result<Vec<_>>>()
        })?;
        let execs = raw_graphs(&raw_comms, &ranks, count)?;
        let case = Case::new(format!("graph {bytes} B"), "us/all-reduce", iters, || {
            for _ in 0..iters {
                for (g, r) in graphs.iter().zip(&ranks) {
                    // SAFETY: the outputs are only read after `sync_all` below and the check at the end.
                    unsafe { g.launch().async_on(&r.stream)? };
                }
            }
            sync_all(&ranks)
        })
        .raw(|| {
            for _ in 0..iters {
                for (e, r) in execs.iter().zip(&ranks) {
                    r.raw_stream.device().bind()?;
                    // SAFETY: a live executable graph of this side, launched on its own stream.
                    drv_ok(unsafe { drv::cuGraphLaunch(*e, r.raw_stream.raw()) }, "cuGraphLaunch")?;
                }
            }
            sync_all(&ranks)
        })
        .note("framework: a CudaGraph per rank replayed as an op; raw: cuGraphLaunch of each rank's captured grouped all-reduce");
        let row = run.run(case)?.clone();
        bandwidth.push(bw_entry("graph", bytes, n, row.framework, row.raw));
        drop(graphs);
        for e in execs {
            // SAFETY: every launch has completed (sync_all); destroyed once.
            unsafe { drv::cuGraphExecDestroy(e) };
        }
        check_outputs(&views, &ranks, count, n)?;
        bytes = match bytes.checked_mul(args.factor) {
            Some(b) if args.factor > 1 => b,
            _ => break,
        };
    }
    run.report.meta("bandwidth", bandwidth);
    let correctness = (|| -> Result<String> {
        sync_all(&ranks)?;
        Ok(format!("every output of every size and rank held {}", n * (n + 1) / 2))
    })();
    for c in raw_comms {
        // SAFETY: all raw work has completed; destroyed once.
        unsafe { nccl::ncclCommDestroy(c) };
    }
    run.report.publish(correctness, args.common.json.as_deref())
}

/// nccl-tests' algbw and busbw (GB/s) from the median time per all-reduce (µs).
fn bw_entry(mode: &str, bytes: usize, n: usize, fw_us: f64, raw_us: Option<f64>) -> serde_json::Value {
    let algbw = |us: f64| bytes as f64 / (us * 1e-6) / 1e9;
    let factor = 2.0 * (n as f64 - 1.0) / n as f64;
    let raw = raw_us.unwrap_or(f64::NAN);
    println!(
        "  {mode:5} {bytes:>11} B: framework {:.2} GB/s busbw ({:.2} algbw), raw {:.2} GB/s busbw ({:.2} algbw)",
        algbw(fw_us) * factor,
        algbw(fw_us),
        algbw(raw) * factor,
        algbw(raw)
    );
    json!({
        "mode": mode, "bytes": bytes, "ranks": n,
        "framework_us": fw_us, "raw_us": raw_us,
        "framework_algbw_gbps": algbw(fw_us), "framework_busbw_gbps": algbw(fw_us) * factor,
        "raw_algbw_gbps": algbw(raw), "raw_busbw_gbps": algbw(raw) * factor,
    })
}

/// Every framework and raw output of this size holds n (n + 1) / 2.
fn check_outputs(
    views: &[(DeviceBuffer<f32>, DeviceBuffer<f32>)],
    ranks: &[RankBufs],
    count: usize,
    n: usize,
) -> Result<()> {
    let want = (n * (n + 1) / 2) as f32;
    for (i, ((_, recv), r)) in views.iter().zip(ranks).enumerate() {
        let got = recv.to_vec()?;
        ensure!(
            got.iter().all(|&v| v == want),
            "framework output of rank {i} at {count} elements is not {want}"
        );
        r.raw_stream.synchronize()?;
        let raw = r.raw_recv.to_vec()?;
        ensure!(
            raw[..count].iter().all(|&v| v == want),
            "raw output of rank {i} at {count} elements is not {want}"
        );
    }
    Ok(())
}

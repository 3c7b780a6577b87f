//! Your own kernel as a lazy op: a fused `y = a*x + b*y + bias` written in CUDA C, vouched for
//! once, captured in a CUDA graph with `CudaGraph::scope`, replayed and awaited from tokio, and
//! checked against an f64 host reference.
//!
//! `cargo run -p cuda-async-examples --bin own-kernel -- [--n 1000000] [--replays 4]`
//!
//! Exit code 1 on a mismatch (relative error >= 1e-5) or any error. See `docs/own-kernels.md`.

use anyhow::{bail, Result};
use clap::Parser;
use cuda_async::kernel::{Kernel, Launcher, Lens};
use cuda_async::{CudaGraph, DeviceOpExt};
use cuda_core::{Device, DeviceBuffer, LaunchConfig, Stream};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// A fused kernel of the user's, captured into a graph and replayed from tokio.
#[derive(Parser)]
struct Args {
    /// Elements per buffer
    #[arg(long, default_value_t = 1_000_000)]
    n: usize,
    /// Graph replays
    #[arg(long, default_value_t = 4)]
    replays: usize,
}

const SRC: &str = r#"
extern "C" __global__ void axpby_bias(const float* x, const float* bias, float* y, float a, float b,
                                      unsigned long long n) {
    unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + b * y[i] + bias[i];
}
"#;

/// `axpby_bias(x, bias | y | a, b, n)`: inputs `x` and `bias`, output `y`, scalars `a`, `b`, `n`.
type AxpbyBias = Launcher<(f32, f32), (f32,), (f32, f32, u64)>;

fn axpby_bias() -> AxpbyBias {
    let kernel = Kernel::from_cuda("axpby_bias.cu", SRC, "axpby_bias", &[]);
    // SAFETY: the signature is (const float*, const float*, float*, float, float, u64) = inputs,
    // output, scalars; for the lengths the check accepts (x, bias and y all of n elements), the
    // kernel reads only x[..n], bias[..n] and y[..n] and writes only y[..n] (64-bit index).
    unsafe {
        kernel.vouch(|l: &Lens<'_, (f32, f32, u64)>| {
            let n = l.scalars.2;
            if l.inputs.iter().chain(l.outputs).any(|&len| len as u64 != n) {
                return Err(format!(
                    "x, bias and y must hold n = {n} elements; got {:?} and {:?}",
                    l.inputs, l.outputs
                ));
            }
            Ok(LaunchConfig::for_elements(n as usize, 256))
        })
    }
}

fn main() -> Result<()> {
    let args = Args::parse();
    let (n, replays) = (args.n, args.replays);
    if n == 0 {
        bail!("--n must be at least 1");
    }
    let mut rng = StdRng::seed_from_u64(7);
    let mut gen = |n: usize| (0..n).map(|_| rng.random_range(-1.0f32..1.0)).collect::<Vec<f32>>();
    let (xh, bh, yh) = (gen(n), gen(n), gen(n));
    let (a, b) = (1.5f32, -0.25f32);

    let dev = Device::new(0)?;
    let s = Stream::new(&dev)?;
    let op = axpby_bias();
    op.kernel().function(&dev)?; // compile (or load from the cache) before recording

    let x = DeviceBuffer::from_host(&s, &xh)?;
    let bias = DeviceBuffer::from_host(&s, &bh)?;
    let y = DeviceBuffer::from_host(&s, &yh)?;

    // One launch recorded into a graph: `y` moves in and comes back as the graph's output.
    let mut graph = CudaGraph::scope(&s, |scope| scope.record(op.op((&x, &bias), (y,), (a, b, n as u64))))?;

    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    rt.block_on(async {
        for _ in 0..replays {
            graph.launch().await?;
        }
        anyhow::Ok(())
    })?;
    let (y,) = graph.take_output().expect("the graph's output");
    let got = y.to_vec()?;

    let mut want: Vec<f64> = yh.iter().map(|&v| v as f64).collect();
    for _ in 0..replays {
        for i in 0..n {
            want[i] = a as f64 * xh[i] as f64 + b as f64 * want[i] + bh[i] as f64;
        }
    }
    // NaN (an element never written) propagates into `worst` and fails the check.
    let worst = got
        .iter()
        .zip(&want)
        .map(|(&g, &w)| (g as f64 - w).abs() / w.abs().max(1.0))
        .fold(0.0, |m: f64, e| if e.is_nan() || e > m { e } else { m });
    println!("axpby_bias: n = {n}, {replays} replays, max relative error {worst:.2e}");
    if worst.is_nan() || worst >= 1e-5 {
        bail!("mismatch against the f64 reference: {worst:e}");
    }

    // The same launcher, eagerly, with lengths its check refuses: an error, nothing launched.
    let short = DeviceBuffer::<f32>::zeros(&s, n.saturating_sub(1))?;
    let mut y2 = DeviceBuffer::<f32>::zeros(&s, n)?;
    match op.op((&x, &short), (&mut y2,), (a, b, n as u64)).sync_on(&s) {
        Err(e) => println!("refused as expected: {e}"),
        Ok(_) => bail!("a short bias was accepted"),
    }
    Ok(())
}

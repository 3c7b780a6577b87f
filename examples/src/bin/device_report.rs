//! The main job (for now): report the GPU, compile the kernels with NVRTC, run a SAXPY on random
//! data and check it against a host reference in f64.
//!
//! `cargo run --release -p cuda-async-examples --bin device-report`

use cuda_core::{Device, DeviceBuffer, Event, Stream};
use kernels::Kernels;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::process::ExitCode;

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let n = cuda_core::device_count()?;
    let (maj, min) = cuda_core::driver_version()?;
    println!("driver supports CUDA {maj}.{min}; {n} device(s)");
    for i in 0..n {
        let d = Device::new(i)?;
        let (cc_maj, cc_min) = d.compute_capability()?;
        let (free, total) = d.memory_info()?;
        println!(
            "  [{i}] {}: sm_{cc_maj}{cc_min}, {} SMs, {:.1} GiB total, {:.1} GiB free",
            d.name(),
            d.multiprocessor_count()?,
            total as f64 / (1u64 << 30) as f64,
            free as f64 / (1u64 << 30) as f64
        );
    }
    let dev = Device::new(0)?;
    let t = std::time::Instant::now();
    let k = Kernels::get(&dev)?;
    println!(
        "kernels ready in {:.1} ms (NVRTC {:?}, cache in {:?})",
        t.elapsed().as_secs_f64() * 1e3,
        cuda_core::nvrtc::nvrtc_version()?,
        cuda_core::nvrtc::KernelCache::global().dir()
    );

    let s = Stream::new(&dev)?;
    let len = 1 << 24;
    let mut rng = SmallRng::seed_from_u64(0x9e37_79b9_7f4a_7c15);
    let mut rnd = || rng.random_range(-1.0f32..1.0);
    let xh: Vec<f32> = (0..len).map(|_| rnd()).collect();
    let yh: Vec<f32> = (0..len).map(|_| rnd()).collect();
    let alpha = 1.5f32;
    let x = DeviceBuffer::from_host(&s, &xh)?;
    let mut y = DeviceBuffer::from_host(&s, &yh)?;
    let (start, end) = (Event::new(&dev, true)?, Event::new(&dev, true)?);
    start.record(&s)?;
    k.axpy(&s, alpha, &x, &mut y)?;
    end.record(&s)?;
    let got = y.to_vec()?;
    let ms = Event::elapsed_ms(&start, &end)?;
    let max_err = got
        .iter()
        .zip(xh.iter().zip(&yh))
        .map(|(&g, (&x, &y))| (g as f64 - (alpha as f64 * x as f64 + y as f64)).abs())
        .fold(0.0f64, f64::max);
    println!(
        "saxpy over {len} floats: {:.3} ms on the GPU ({:.0} GB/s), max |error| vs f64 host reference {max_err:.2e}",
        ms,
        12.0 * len as f64 / (ms as f64 * 1e6)
    );
    if max_err > 1e-5 {
        return Err(format!("result differs from the host reference by {max_err}").into());
    }
    println!("ok");
    Ok(())
}

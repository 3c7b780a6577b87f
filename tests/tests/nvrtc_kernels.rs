//! Every kernel program of the `kernels` crate ([`kernels::programs::all`]) compiled by NVRTC for
//! the H100's architecture (`sm_90`), with the options the loaders use, on any machine: NVRTC
//! needs no driver and no GPU, so CI (which installs NVRTC from the `nvidia-cuda-nvrtc` wheel, see
//! `.ci/run`) catches a kernel that does not compile — including a kernel whose registers or
//! shared memory exceed the architecture's limits, which NVRTC's assembler refuses — before a GPU
//! host ever loads it. Each compiled image must also hold the entry points its loader asks for
//! and pass the loader's image check (`CudaModule::check_image`).
//!
//! Without `libnvrtc` the tests are ignored, unless `CUDA_ASYNC_REQUIRE_NVRTC` is set (to anything
//! but empty or `0`): then they fail, so CI cannot silently skip them.

use libtest_mimic::{Arguments, Failed, Trial};

/// Entry points each program must define (the names its loader resolves).
fn entries(program: &str) -> Vec<String> {
    let typed = |names: &[&str]| -> Vec<String> {
        names.iter().flat_map(|n| ["f32", "f64"].map(|t| format!("{n}_{t}"))).collect()
    };
    match program {
        "elementwise.cu" => typed(&["fill", "scale", "scale_by", "axpy", "add", "mul"]),
        "reduce.cu" => typed(&["sum"]),
        "linear.cu" => typed(&["linear"]),
        "llama.cu" => [
            "embed_bf16",
            "rmsnorm_bf16",
            "silu_mul_bf16",
            "rope_attention_bf16",
            "rope_attention_g4_hd64_bf16",
            "attention_cached_bf16",
            "attention_cached_g4_hd64_bf16",
            "attention_tiled_g4_hd64_bf16",
            "argmax_partial_f32",
            "argmax_final",
            "randn_bf16",
            "rope_append_bf16",
            "gather_rows_bf16",
        ]
        .map(String::from)
        .to_vec(),
        "gemv.cu" => ["gemv_norm", "gemv_norm_f32", "gemv_norm_swiglu", "gemv_residual"]
            .iter()
            .flat_map(|n| [1, 2, 4, 8].map(|r| format!("{n}_r{r}")))
            .collect(),
        "sample.cu" => vec!["sample_rows_f32".into()],
        _ => Vec::new(),
    }
}

fn required() -> bool {
    std::env::var("CUDA_ASYNC_REQUIRE_NVRTC").is_ok_and(|v| !v.is_empty() && v != "0")
}

fn compile(p: &kernels::programs::Program) -> Result<(), Failed> {
    let cubin = cuda_core::nvrtc::compile_cubin(p.name, &p.source, "sm_90", &p.options)
        .map_err(|e| format!("{}: {e}", p.name))?;
    if cubin.len() < 4 || &cubin[..4] != b"\x7fELF" {
        return Err(
            format!("{}: NVRTC returned {} bytes that are not an ELF image", p.name, cubin.len()).into()
        );
    }
    // The loader's own check (`CudaModule::from_cubin` refuses what it refuses): every image
    // NVRTC makes must pass it, or no kernel would load on the GPU.
    cuda_core::CudaModule::check_image(&cubin)
        .map_err(|e| format!("{}: the loader's image check: {e}", p.name))?;
    // An entry point's name is in the image's symbol table as a NUL-terminated string.
    for e in entries(p.name) {
        let needle = [e.as_bytes(), b"\0"].concat();
        if !cubin.windows(needle.len()).any(|w| w == needle.as_slice()) {
            return Err(format!("{}: no entry point {e} in the compiled image", p.name).into());
        }
    }
    Ok(())
}

fn main() {
    let args = Arguments::from_args();
    let available = cuda_core::nvrtc::nvrtc_version();
    let trials = kernels::programs::all()
        .into_iter()
        .map(|p| {
            let name = format!("nvrtc_sm90::{}", p.name);
            match &available {
                Ok(_) => Trial::test(name, move || compile(&p)),
                Err(e) if required() => {
                    let msg = format!("CUDA_ASYNC_REQUIRE_NVRTC is set but NVRTC is unavailable: {e}");
                    Trial::test(name, move || Err(msg.into()))
                }
                Err(_) => Trial::test(name, || Ok(())).with_ignored_flag(true),
            }
        })
        .collect();
    libtest_mimic::run(&args, trials).exit()
}

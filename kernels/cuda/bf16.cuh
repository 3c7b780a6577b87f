// bf16 helpers shared by the decoder kernels (prepended to llama.cu and gemv.cu by the Rust
// side). bf16 is handled as raw 16-bit patterns (no headers needed): widened to f32 for
// arithmetic, rounded to nearest even on the way back, as PyTorch does.

typedef unsigned short bf16_t;

#define INFINITY __int_as_float(0x7f800000)

__device__ __forceinline__ float bf2f(bf16_t v) { return __uint_as_float(((unsigned)v) << 16); }

__device__ __forceinline__ bf16_t f2bf(float f) {
    unsigned u = __float_as_uint(f);
    if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu)) return (bf16_t)((u >> 16) | 0x40); // NaN stays NaN
    u += 0x7fffu + ((u >> 16) & 1u);
    return (bf16_t)(u >> 16);
}

__device__ __forceinline__ float round_bf(float f) { return bf2f(f2bf(f)); }

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

#define NAN_BF16 ((bf16_t)0x7fc0)

// Programmatic dependent launch (Hopper+): a kernel launched with Function::launch_overlapped may
// start before the kernel queued ahead of it has finished. PDL_WAIT() returns once that kernel has
// completed and its writes are visible: such kernels execute it before touching device memory
// (L2 prefetches excepted). PDL_LAUNCH() lets the next overlapped kernel start launching. Both are
// no-ops in a plain launch and compile to nothing before sm_90.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define PDL_WAIT() asm volatile("griddepcontrol.wait;" ::: "memory")
#define PDL_LAUNCH() asm volatile("griddepcontrol.launch_dependents;" ::: "memory")
#else
#define PDL_WAIT() do {} while (0)
#define PDL_LAUNCH() do {} while (0)
#endif

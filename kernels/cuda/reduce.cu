// Sum reduction. Each block sums a grid-stride slice of `x` in double precision, reduces within
// the block (warp shuffles, then one warp over the per-warp partials), and thread 0 adds the block
// total into `*out` with a double-precision atomicAdd (sm_60+). `*out` must be zeroed first; the
// Rust launcher does that on the same stream. Block size must be a multiple of 32, at most 1024.

template <typename T>
__device__ void sum_impl(const T* __restrict__ x, double* __restrict__ out, unsigned long long n) {
    __shared__ double warp_sums[32];
    double acc = 0.0;
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x)
        acc += (double)x[i];
    for (int off = 16; off > 0; off >>= 1) acc += __shfl_down_sync(0xffffffffu, acc, off);
    const unsigned lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
    if (lane == 0) warp_sums[warp] = acc;
    __syncthreads();
    if (warp == 0) {
        const unsigned nwarps = (blockDim.x + 31u) >> 5;
        acc = lane < nwarps ? warp_sums[lane] : 0.0;
        for (int off = 16; off > 0; off >>= 1) acc += __shfl_down_sync(0xffffffffu, acc, off);
        if (lane == 0) atomicAdd(out, acc);
    }
}

extern "C" __global__ void sum_f32(const float* x, double* out, unsigned long long n) { sum_impl(x, out, n); }
extern "C" __global__ void sum_f64(const double* x, double* out, unsigned long long n) { sum_impl(x, out, n); }

// Fully connected layer: y[r, o] = act(b[o] + sum_i x[r, i] * w[o, i]), act = ReLU when `relu` is
// non-zero, the identity otherwise. Row-major x[batch][in_dim], w[out_dim][in_dim] (PyTorch's
// nn.Linear layout), b[out_dim], y[batch][out_dim]. Instantiated for float (_f32, float
// accumulation) and double (_f64) at the bottom.
//
// Work split: one warp per (output feature o, tile of up to LINEAR_ROWS = 4 batch rows).
// - Lane l reads w[o, l], w[o, l + 32], ...: each step of the warp reads 32 consecutive elements
//   of the weight row (coalesced, four steps' loads issued together); the same indices of the
//   tile's x rows are read alongside, so each weight row is read once per tile, not once per row.
// - Each lane keeps one partial sum per tile row (its in_dim / 32 products, added in index order
//   with fused multiply-adds, in T); the 32 partials are combined with a warp-shuffle tree, and
//   lane 0 adds the bias, applies ReLU and writes the tile's outputs.
// Grid: blockIdx.x (and the warp within the block) picks o; blockIdx.y strides over row tiles
// (so any batch is covered with gridDim.y capped at 65535). Block size must be a multiple of 32.
// The Rust launcher (kernels::Kernels::linear) sizes the grid with the same LINEAR_ROWS and keeps
// every dimension <= 2^31 - 1, so `i + 128` below cannot wrap.
//
// Bounds: `o` is the same for all lanes of a warp, so a warp with o >= out_dim leaves as a whole
// (the shuffles then always see 32 active lanes); w is read only at o < out_dim, i < in_dim; x
// and y only at rows r0 + j < batch. Indices are computed in 64 bits. No thread writes anything
// but y[r, o] with r < batch, o < out_dim, and each such element is written by exactly one lane.

#define LINEAR_ROWS 4

// One warp's work for `R` rows: xr = &x[r0, 0], wr = &w[o, 0], yr = &y[r0, o].
template <typename T, int R>
__device__ void linear_tile(const T* __restrict__ xr, const T* __restrict__ wr, T bias, T* __restrict__ yr,
                            unsigned in_dim, unsigned out_dim, int relu, unsigned lane) {
    T acc[R];
#pragma unroll
    for (int j = 0; j < R; ++j) acc[j] = T(0);
    unsigned i = lane;
    // Four strides at a time, all loads issued before the multiply-adds (i + 96 < in_dim keeps all
    // four in bounds), then the remaining strides one by one. Same summation order either way.
    for (; i + 96u < in_dim; i += 128u) {
        T wv[4];
#pragma unroll
        for (int u = 0; u < 4; ++u) wv[u] = wr[i + 32u * u];
#pragma unroll
        for (int j = 0; j < R; ++j) {
            T xv[4];
#pragma unroll
            for (int u = 0; u < 4; ++u) xv[u] = xr[(unsigned long long)j * in_dim + i + 32u * u];
#pragma unroll
            for (int u = 0; u < 4; ++u) acc[j] += xv[u] * wv[u];
        }
    }
    for (; i < in_dim; i += 32u) {
        const T wv = wr[i];
#pragma unroll
        for (int j = 0; j < R; ++j) acc[j] += xr[(unsigned long long)j * in_dim + i] * wv;
    }
#pragma unroll
    for (int j = 0; j < R; ++j) {
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) acc[j] += __shfl_down_sync(0xffffffffu, acc[j], off);
    }
    if (lane == 0) {
#pragma unroll
        for (int j = 0; j < R; ++j) {
            T v = acc[j] + bias;
            if (relu && v < T(0)) v = T(0);
            yr[(unsigned long long)j * out_dim] = v;
        }
    }
}

template <typename T>
__device__ void linear_impl(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b,
                            T* __restrict__ y, unsigned batch, unsigned in_dim, unsigned out_dim, int relu) {
    const unsigned lane = threadIdx.x & 31u;
    const unsigned long long o =
        (unsigned long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (o >= out_dim) return;  // warp-uniform: the whole warp leaves
    const T* wr = w + o * in_dim;
    const T bias = b[o];
    for (unsigned long long r0 = (unsigned long long)blockIdx.y * LINEAR_ROWS; r0 < batch;
         r0 += (unsigned long long)gridDim.y * LINEAR_ROWS) {
        const unsigned long long left = batch - r0;  // >= 1
        const T* xr = x + r0 * in_dim;
        T* yr = y + r0 * out_dim + o;
        switch (left < LINEAR_ROWS ? (unsigned)left : LINEAR_ROWS) {  // warp-uniform
            case 1: linear_tile<T, 1>(xr, wr, bias, yr, in_dim, out_dim, relu, lane); break;
            case 2: linear_tile<T, 2>(xr, wr, bias, yr, in_dim, out_dim, relu, lane); break;
            case 3: linear_tile<T, 3>(xr, wr, bias, yr, in_dim, out_dim, relu, lane); break;
            default: linear_tile<T, LINEAR_ROWS>(xr, wr, bias, yr, in_dim, out_dim, relu, lane); break;
        }
    }
}

extern "C" __global__ void linear_f32(const float* x, const float* w, const float* b, float* y, unsigned batch,
                                      unsigned in_dim, unsigned out_dim, int relu) {
    linear_impl(x, w, b, y, batch, in_dim, out_dim, relu);
}
extern "C" __global__ void linear_f64(const double* x, const double* w, const double* b, double* y,
                                      unsigned batch, unsigned in_dim, unsigned out_dim, int relu) {
    linear_impl(x, w, b, y, batch, in_dim, out_dim, relu);
}

// Small-batch bf16 products for decode (rows <= 8), with the neighbouring elementwise work fused
// in so that a decoder layer is 5 launches instead of 9:
//
//   gemv_norm_rR        y = bf16(RMSNorm(x) · Wᵀ)                 (q/k/v projection)
//   gemv_norm_f32_rR    y = RMSNorm(x) · Wᵀ in f32                 (output projection → logits)
//   gemv_norm_swiglu_rR y = bf16(bf16(silu(g)) · u), [g | u] = bf16(RMSNorm(x) · [Wg | Wu]ᵀ)
//   gemv_residual_rR    y = bf16(y + bf16(x · Wᵀ))                 (o and down projections)
//
// R in {1, 2, 4, 8} is the compiled row count (rows <= R at run time). W is [out][in] row-major
// (PyTorch's nn.Linear layout); for SwiGLU it is [2 * out][in], the gate rows first. Rounding
// follows Hugging Face's bf16 modules step by step (RMSNorm: bf16(w · bf16(x / rms)); the
// product rounded to bf16 before the residual add).
//
// Layout: each block first stages its input rows (normalised when asked) in shared memory,
// [R][in] bf16 (dynamic shared memory of R * in * 2 bytes, at most 48 KiB, checked by the
// launcher), while its first weight loads are already in flight; then each group of `split`
// warps takes one output row o at a time (grid-stride), streams W[o] once with 16-byte loads
// that bypass L1, and dots it with every input row. in % 8 == 0; out + out (SwiGLU's second
// row index) and every grid-stride index fit in 32 bits (checked by the launcher).
//
// `early` (block-uniform, 0 or 1): with 0, a block only prefetches its first weight row into L2
// before PDL_WAIT() and loads it after; with 1, it loads that row's first chunks into registers
// before PDL_WAIT(), so that they arrive while the kernel ahead finishes. Only for weights that
// no kernel able to overlap this launch writes (the launcher's `Gemv::preloading` contract).

#define GEMV_WARPS 8
#define GEMV_UNROLL 8

enum { PLAIN = 0, F32OUT = 1, SWIGLU = 2, RESIDUAL = 3 };

// A 16-byte load of weights that are read once: not kept in L1. A coherent load (not .nc): under
// an overlapped launch the kernel ahead may have written these weights (safe code can pass a
// product's output as the next product's weights), and griddepcontrol.wait makes its writes
// visible to ordinary loads. Volatile with a memory clobber so that it can never be hoisted above
// PDL_WAIT().
__device__ __forceinline__ uint4 ld_stream(const uint4* p) {
    uint4 v;
    asm volatile("ld.global.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p)
                 : "memory");
    return v;
}

// Prefetches W row o (and row o + out for SwiGLU) into L2, the 128-byte lines first + 32 * k *
// stride of them: no value is read, so it may run before PDL_WAIT().
template <int MODE>
__device__ __forceinline__ void prefetch_row(const bf16_t* w, unsigned o, unsigned out, unsigned in,
                                             unsigned first, unsigned stride) {
    if (o >= out) return;
    unsigned lines = (in * 2 + 127) / 128;
    const char* r0 = (const char*)(w + (size_t)o * in);
    const char* r1 = (const char*)(w + (size_t)(o + out) * in);
    for (unsigned l = first; l < lines; l += stride) {
        asm volatile("prefetch.global.L2 [%0];" ::"l"(r0 + (size_t)l * 128));
        if (MODE == SWIGLU) asm volatile("prefetch.global.L2 [%0];" ::"l"(r1 + (size_t)l * 128));
    }
}

// acc += dot of 8 bf16 pairs packed in two 16-byte vectors.
__device__ __forceinline__ float dot8(float acc, uint4 a, uint4 b) {
    const unsigned* au = (const unsigned*)&a;
    const unsigned* bu = (const unsigned*)&b;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        acc = fmaf(__uint_as_float(au[k] << 16), __uint_as_float(bu[k] << 16), acc);
        acc = fmaf(__uint_as_float(au[k] & 0xffff0000u), __uint_as_float(bu[k] & 0xffff0000u), acc);
    }
    return acc;
}

// Stages rows 0..R of x into xs ([R][in / 8] vectors; rows >= `rows` are zeros). With NORM,
// row r becomes bf16(nw * bf16(x[r] * rsqrt(mean(x[r]^2) + eps))) as LlamaRMSNorm computes it.
template <int R, bool NORM>
__device__ __forceinline__ void stage(const bf16_t* x, const bf16_t* nw, float eps, unsigned rows, unsigned in,
                                      uint4* xs) {
    __shared__ float red[GEMV_WARPS][R];
    unsigned nvec = in / 8;
    float inv[R];
#pragma unroll
    for (int r = 0; r < R; ++r) inv[r] = 1.f;
    if (NORM) {
        float ss[R];
#pragma unroll
        for (int r = 0; r < R; ++r) ss[r] = 0.f;
        for (unsigned c = threadIdx.x; c < nvec; c += blockDim.x) {
#pragma unroll
            for (int r = 0; r < R; ++r) {
                if (r < rows) {
                    uint4 v = ((const uint4*)(x + (size_t)r * in))[c];
                    const bf16_t* e = (const bf16_t*)&v;
#pragma unroll
                    for (int j = 0; j < 8; ++j) ss[r] += bf2f(e[j]) * bf2f(e[j]);
                }
            }
        }
        unsigned warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll
        for (int r = 0; r < R; ++r) {
            float t = warp_sum(ss[r]);
            if (lane == 0) red[warp][r] = t;
        }
        __syncthreads();
#pragma unroll
        for (int r = 0; r < R; ++r) {
            float t = 0.f;
            for (unsigned w = 0; w < GEMV_WARPS; ++w) t += red[w][r];
            inv[r] = rsqrtf(t / (float)in + eps);
        }
    }
    for (unsigned c = threadIdx.x; c < nvec; c += blockDim.x) {
        uint4 wv = NORM ? ((const uint4*)nw)[c] : make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int r = 0; r < R; ++r) {
            uint4 res = make_uint4(0, 0, 0, 0);
            if (r < rows) {
                res = ((const uint4*)(x + (size_t)r * in))[c];
                if (NORM) {
                    bf16_t* e = (bf16_t*)&res;
                    const bf16_t* we = (const bf16_t*)&wv;
#pragma unroll
                    for (int j = 0; j < 8; ++j) e[j] = f2bf(bf2f(we[j]) * round_bf(bf2f(e[j]) * inv[r]));
                }
            }
            xs[(size_t)r * nvec + c] = res;
        }
    }
    __syncthreads();
}

// Loads the GEMV_UNROLL chunks c0 + step * u of W row o (and of row o + out for SwiGLU), where
// they exist.
template <int MODE>
__device__ __forceinline__ void load_chunks(const bf16_t* __restrict__ w, unsigned o, unsigned out, unsigned in,
                                            unsigned c0, unsigned step, uint4* wa, uint4* wb) {
    if (o >= out) return;
    unsigned nvec = in / 8;
    const uint4* w0 = (const uint4*)(w + (size_t)o * in);
    const uint4* w1 = (const uint4*)(w + (size_t)(MODE == SWIGLU ? o + out : o) * in);
#pragma unroll
    for (int u = 0; u < GEMV_UNROLL; ++u) {
        unsigned c = c0 + step * u;
        if (c < nvec) {
            wa[u] = ld_stream(w0 + c);
            if (MODE == SWIGLU) wb[u] = ld_stream(w1 + c);
        }
    }
}

// `split` warps (1, 2, 4 or 8, block-uniform) share each output row: warp `sub` of a group takes
// the 16-byte chunks sub * 32 + lane + 32 * split * k, and the group's partial sums meet in
// shared memory. The host picks split so that narrow products still fill the GPU.
template <int R, int MODE, bool NORM>
__device__ __forceinline__ void gemv(const bf16_t* __restrict__ x, const bf16_t* __restrict__ nw, float eps,
                                     const bf16_t* __restrict__ w, void* y, unsigned rows, unsigned in,
                                     unsigned out, unsigned split, unsigned early) {
    extern __shared__ uint4 xs[];
    __shared__ float part_s[GEMV_WARPS][2][R];
    unsigned nvec = in / 8, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    unsigned per_block = GEMV_WARPS / split, sub = warp % split, step = 32 * split;
    unsigned c_first = sub * 32 + lane;
    uint4 wa[GEMV_UNROLL], wb[GEMV_UNROLL];
    unsigned base = blockIdx.x * per_block;
    // Launched overlapped (Function::launch_overlapped): let the next kernel launch, then start
    // on this warp's first weight row while the kernel ahead finishes (its first chunks loaded
    // with `early`, else pulled towards L2), then wait for it.
    PDL_LAUNCH();
    if (early) {
        load_chunks<MODE>(w, base + warp / split, out, in, c_first, step, wa, wb);
        PDL_WAIT();
    } else {
        prefetch_row<MODE>(w, base + warp / split, out, in, c_first, step);
        PDL_WAIT();
        // The weights do not depend on the input: the first loads are in flight during the staging.
        load_chunks<MODE>(w, base + warp / split, out, in, c_first, step, wa, wb);
    }
    stage<R, NORM>(x, nw, eps, rows, in, xs);
    bool loaded = true;
    for (; base < out; base += gridDim.x * per_block) { // block-uniform
        unsigned o = base + warp / split;
        bool valid = o < out;
        float a0[R], a1[R];
#pragma unroll
        for (int r = 0; r < R; ++r) a0[r] = a1[r] = 0.f;
        for (unsigned c0 = c_first; c0 < nvec; c0 += step * GEMV_UNROLL) {
            if (!loaded) load_chunks<MODE>(w, o, out, in, c0, step, wa, wb);
            loaded = false;
#pragma unroll
            for (int u = 0; u < GEMV_UNROLL; ++u) {
                unsigned c = c0 + step * u;
                if (valid && c < nvec) {
#pragma unroll
                    for (int r = 0; r < R; ++r) {
                        uint4 xv = xs[(size_t)r * nvec + c];
                        a0[r] = dot8(a0[r], wa[u], xv);
                        if (MODE == SWIGLU) a1[r] = dot8(a1[r], wb[u], xv);
                    }
                }
            }
        }
        loaded = false;
#pragma unroll
        for (int r = 0; r < R; ++r) {
            a0[r] = warp_sum(a0[r]);
            if (MODE == SWIGLU) a1[r] = warp_sum(a1[r]);
        }
        if (split > 1) {
            if (lane == 0) {
#pragma unroll
                for (int r = 0; r < R; ++r) {
                    part_s[warp][0][r] = a0[r];
                    part_s[warp][1][r] = a1[r];
                }
            }
            __syncthreads();
            if (sub == 0 && lane == 0) {
#pragma unroll
                for (int r = 0; r < R; ++r) {
                    a0[r] = a1[r] = 0.f;
                    for (unsigned k = 0; k < split; ++k) {
                        a0[r] += part_s[warp + k][0][r];
                        a1[r] += part_s[warp + k][1][r];
                    }
                }
            }
        }
        if (valid && sub == 0 && lane == 0) {
#pragma unroll
            for (int r = 0; r < R; ++r) {
                if (r >= rows) break;
                size_t i = (size_t)r * out + o;
                if (MODE == F32OUT) {
                    ((float*)y)[i] = a0[r];
                } else if (MODE == PLAIN) {
                    ((bf16_t*)y)[i] = f2bf(a0[r]);
                } else if (MODE == RESIDUAL) {
                    bf16_t* yb = (bf16_t*)y;
                    yb[i] = f2bf(bf2f(yb[i]) + round_bf(a0[r]));
                } else {
                    float g = round_bf(a0[r]), u = round_bf(a1[r]);
                    float s = round_bf(g / (1.f + __expf(-g)));
                    ((bf16_t*)y)[i] = f2bf(s * u);
                }
            }
        }
        if (split > 1) __syncthreads(); // part_s is reused by the next row
    }
}

#define GEMV_NORM_KERNEL(NAME, R, MODE)                                                                  \
    extern "C" __global__ void __launch_bounds__(GEMV_WARPS * 32)                                       \
        NAME(const bf16_t* x, const bf16_t* nw, float eps, const bf16_t* w, void* y, unsigned rows,      \
             unsigned in, unsigned out, unsigned split, unsigned early) {                                \
        gemv<R, MODE, true>(x, nw, eps, w, y, rows, in, out, split, early);                              \
    }
#define GEMV_RESIDUAL_KERNEL(NAME, R)                                                                   \
    extern "C" __global__ void __launch_bounds__(GEMV_WARPS * 32)                                       \
        NAME(const bf16_t* x, const bf16_t* w, bf16_t* y, unsigned rows, unsigned in, unsigned out,      \
             unsigned split, unsigned early) {                                                           \
        gemv<R, RESIDUAL, false>(x, nullptr, 0.f, w, y, rows, in, out, split, early);                    \
    }

GEMV_NORM_KERNEL(gemv_norm_r1, 1, PLAIN)
GEMV_NORM_KERNEL(gemv_norm_r2, 2, PLAIN)
GEMV_NORM_KERNEL(gemv_norm_r4, 4, PLAIN)
GEMV_NORM_KERNEL(gemv_norm_r8, 8, PLAIN)
GEMV_NORM_KERNEL(gemv_norm_f32_r1, 1, F32OUT)
GEMV_NORM_KERNEL(gemv_norm_f32_r2, 2, F32OUT)
GEMV_NORM_KERNEL(gemv_norm_f32_r4, 4, F32OUT)
GEMV_NORM_KERNEL(gemv_norm_f32_r8, 8, F32OUT)
GEMV_NORM_KERNEL(gemv_norm_swiglu_r1, 1, SWIGLU)
GEMV_NORM_KERNEL(gemv_norm_swiglu_r2, 2, SWIGLU)
GEMV_NORM_KERNEL(gemv_norm_swiglu_r4, 4, SWIGLU)
GEMV_NORM_KERNEL(gemv_norm_swiglu_r8, 8, SWIGLU)
GEMV_RESIDUAL_KERNEL(gemv_residual_r1, 1)
GEMV_RESIDUAL_KERNEL(gemv_residual_r2, 2)
GEMV_RESIDUAL_KERNEL(gemv_residual_r4, 4)
GEMV_RESIDUAL_KERNEL(gemv_residual_r8, 8)

// Tensor-core bf16 products for 9 to 64 rows (decode steps of 16 to 64 sequences), with the
// neighbouring elementwise work fused into the epilogue: a development kernel of the products lab
// (scripts/dev/mma_lab.cu, which includes it after kernels/cuda/gemv.cu, whose modes, PDL macros
// and streaming load it shares). Not part of the library.
//
// Status (2026-11-28): measured against cuBLAS in the lab on the H100 it is no faster at 16 rows
// and 1.4x to 2x slower at 32 and 64 (docs/results/raw/mma-lab-h100-call1.txt), so the decoder
// keeps cuBLAS above 8 rows. Commit 4cbe5b2 had it in the library (kernels::mma, opt-in) with a GPU
// suite (tests/tests/gpu_mma.rs there); that suite found a wrong result at 64 rows x 8192 inputs
// -> 64 SwiGLU outputs with the inputs split over 16 blocks and two tile groups (an output outside
// the f64 reference's error bound, twice, while the same shape with one tile group passed and the
// SwiGLU output equalled SwiGLU of the plain product of the same weights in another run). Not
// root-caused; the library integration was taken out again. Read the split path below with that
// in mind before reusing it. One lead, unchecked: in that test every product of a shape reads the
// same x values, and the SwiGLU launch is the first of its shape whose buffers were allocated at
// other addresses (its scratch is larger); x is loaded through L1 (`ld_x`, not coherent across
// SMs), so stale L1 lines of a freed buffer at the same address would give exactly sparse wrong
// sums. Loading x with ld.global.cg, or the test with fresh x per launch, would tell.
//
//   mma_plain_nN        y = bf16(x · Wᵀ)                        (q/k/v projection)
//   mma_f32_nN          y = x · Wᵀ in f32                        (output projection → logits)
//   mma_swiglu_nN       y = bf16(bf16(silu(g)) · u), [g | u] = bf16(x · [Wg | Wu]ᵀ)
//   mma_residual_nN     y = bf16(y + bf16(x · Wᵀ))               (o and down projections)
//
// x is [rows][in] bf16 (already normalised where the layer normalises: the RMSNorm is a separate
// launch here, because a block reads only its slice of the inputs), W is [out][in] row-major (for
// SwiGLU [2 * out][in], the gate rows first), N in {2, 4, 8} is the compiled count of 8-row tiles
// (rows <= 8 * N at run time). Rounding is gemv.cu's: f32 sums, bf16 where Hugging Face rounds.
//
// The product is W · xᵀ on mma.sync.m16n8k16 (bf16 in, f32 accumulate): a warp owns a tile of 16
// weight rows (SwiGLU: 8 gate rows and the 8 up rows of the same outputs, so one thread holds
// both halves of its outputs) over a slice of the inputs, with all rows of x as the mma's n side.
// The k order inside each 64-wide chunk is permuted identically for W and x (a dot product does
// not depend on the order of its terms) so that every thread loads 32 contiguous bytes of a weight
// row and of an x row: 16-byte loads, 128 contiguous bytes per weight row and chunk.
//
// Work split (block-uniform arguments): a block is 8 warps, `kw` of them (1, 2, 4 or 8) share one
// tile by splitting its inputs and 8 / kw tiles side by side share the same x slice (through L1);
// the grid is (tile groups, `splits`), and the inputs of one tile are cut into splits * kw slices
// of `kslice` inputs (a multiple of 64). The kw warps of a tile meet in shared memory; with
// splits > 1 each block writes its f32 partial sums to `part` ([splits][rows][16 * tiles]) and the
// last block of a tile group to arrive (counted in `counters[group]`, which it resets to zero)
// adds the partials in split order (deterministic) and applies the epilogue. With splits == 1
// `part` and `counters` are not touched.
//
// `early` (block-uniform): with 1, the first weight chunks are loaded before PDL_WAIT() (the
// launcher's preloading contract, as in gemv.cu).

#define MMA_WARPS 8
#define MMA_DEPTH 4

// A 16-byte load of x (written by the kernel ahead, so after PDL_WAIT(): coherent, cached in L1,
// where the tiles of a block that share the slice find it).
__device__ __forceinline__ uint4 ld_x(const uint4* p) {
    uint4 v;
    asm volatile("ld.global.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ void mma_bf16(float* c, unsigned a0, unsigned a1, unsigned a2, unsigned a3, unsigned b0,
                                         unsigned b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                 "{%0, %1, %2, %3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#endif
}

// The weight rows of tile t held by this thread (row g and row g + 8 of the tile), or -1.
template <int MODE>
__device__ __forceinline__ void tile_rows(unsigned t, unsigned g, unsigned out, long long* r0, long long* r1) {
    if (MODE == SWIGLU) {
        unsigned o = t * 8 + g;
        *r0 = o < out ? (long long)o : -1;
        *r1 = o < out ? (long long)out + o : -1;
    } else {
        unsigned o = t * 16 + g;
        *r0 = o < out ? (long long)o : -1;
        *r1 = o + 8 < out ? (long long)o + 8 : -1;
    }
}

// Loads this thread's 32 bytes of both its weight rows at chunk k0 (zeros past kend or a missing
// row): a[0..1] row g, a[2..3] row g + 8.
__device__ __forceinline__ void load_w(const bf16_t* __restrict__ w, long long r0, long long r1, unsigned in,
                                       unsigned k, unsigned kend, uint4* a) {
    uint4 z = make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        unsigned kk = k + 8 * h;
        a[h] = (r0 >= 0 && kk < kend) ? ld_stream((const uint4*)(w + (size_t)r0 * in + kk)) : z;
        a[2 + h] = (r1 >= 0 && kk < kend) ? ld_stream((const uint4*)(w + (size_t)r1 * in + kk)) : z;
    }
}

// One 64-wide chunk: the thread's weight words a (see load_w) against x rows 8 * n + g at the same
// k positions, four mma k-steps per 8-row tile. Word 2j of a thread's 16 elements holds the
// logical k pair (2c, 2c + 1) of step j and word 2j + 1 the pair (2c + 8, 2c + 9), in W and x
// alike.
template <int N>
__device__ __forceinline__ void chunk(const bf16_t* __restrict__ x, unsigned rows, unsigned in, unsigned k,
                                      unsigned kend, unsigned g, const uint4* a, float (*acc)[4]) {
    const unsigned* ag = (const unsigned*)&a[0];  // row g, words 0..7
    const unsigned* ah = (const unsigned*)&a[2];  // row g + 8
#pragma unroll
    for (int n = 0; n < N; ++n) {
        unsigned r = 8 * n + g;
        uint4 b[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            unsigned kk = k + 8 * h;
            b[h] = (r < rows && kk < kend) ? ld_x((const uint4*)(x + (size_t)r * in + kk)) : make_uint4(0, 0, 0, 0);
        }
        const unsigned* bw = (const unsigned*)&b[0];
#pragma unroll
        for (int j = 0; j < 4; ++j) mma_bf16(acc[n], ag[2 * j], ah[2 * j], ag[2 * j + 1], ah[2 * j + 1], bw[2 * j], bw[2 * j + 1]);
    }
}

template <int MODE>
__device__ __forceinline__ void mma_emit(void* y, unsigned i_row, unsigned o, unsigned out, float v, float u) {
    size_t i = (size_t)i_row * out + o;
    if (MODE == F32OUT) {
        ((float*)y)[i] = v;
    } else if (MODE == PLAIN) {
        ((bf16_t*)y)[i] = f2bf(v);
    } else if (MODE == RESIDUAL) {
        bf16_t* yb = (bf16_t*)y;
        yb[i] = f2bf(bf2f(yb[i]) + round_bf(v));
    } else {
        float gg = round_bf(v), uu = round_bf(u);
        float s = round_bf(gg / (1.f + __expf(-gg)));
        ((bf16_t*)y)[i] = f2bf(s * uu);
    }
}

template <int N, int MODE>
__device__ __forceinline__ void mma_product(const bf16_t* __restrict__ x, const bf16_t* __restrict__ w, void* y,
                                            float* part, unsigned* counters, unsigned rows, unsigned in, unsigned out,
                                            unsigned kw, unsigned splits, unsigned kslice, unsigned early) {
    constexpr int R = 8 * N + 1;  // padded row stride of the shared tiles (no bank conflicts)
    __shared__ float red[MMA_WARPS][16][R];
    __shared__ unsigned last_s;
    unsigned warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
    unsigned ft = MMA_WARPS / kw;  // tiles per block
    unsigned tsub = warp % ft, ksub = warp / ft;
    unsigned tiles = MODE == SWIGLU ? (out + 7) / 8 : (out + 15) / 16;
    unsigned t = blockIdx.x * ft + tsub;
    unsigned slice = blockIdx.y * kw + ksub;
    unsigned kbeg = slice * kslice, kend = min(in, kbeg + kslice);
    long long r0 = -1, r1 = -1;
    if (t < tiles) tile_rows<MODE>(t, g, out, &r0, &r1);
    float acc[N][4];
#pragma unroll
    for (int n = 0; n < N; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;
    uint4 a[MMA_DEPTH][4];
    PDL_LAUNCH();
    unsigned k0 = kbeg + 16 * c;  // this thread's first element of each chunk
    if (early) {
#pragma unroll
        for (int p = 0; p < MMA_DEPTH; ++p) load_w(w, r0, r1, in, k0 + 64 * p, kend, a[p]);
        PDL_WAIT();
    } else {
        PDL_WAIT();
#pragma unroll
        for (int p = 0; p < MMA_DEPTH; ++p) load_w(w, r0, r1, in, k0 + 64 * p, kend, a[p]);
    }
    for (unsigned kc = kbeg; kc < kend; kc += 64 * MMA_DEPTH) {  // warp-uniform
#pragma unroll
        for (int p = 0; p < MMA_DEPTH; ++p) {
            unsigned k = kc + 64 * p;
            if (k < kend) chunk<N>(x, rows, in, k + 16 * c, kend, g, a[p], acc);
            load_w(w, r0, r1, in, k + 16 * c + 64 * MMA_DEPTH, kend, a[p]);
        }
    }
    // Fragment (n, e): weight row g (e < 2) or g + 8, x row 8n + 2c + (e & 1).
#pragma unroll
    for (int n = 0; n < N; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) red[warp][g + 8 * (e >> 1)][8 * n + 2 * c + (e & 1)] = acc[n][e];
    }
    __syncthreads();
    unsigned feats = 16 * ft;               // tile rows of this block, its tiles side by side
    unsigned width = 16 * tiles;            // the partials' row width
    unsigned fbase = blockIdx.x * feats;    // first tile row of this block
    // The block's sum over its kw warps of tile row f (0..feats) and x row r.
    auto block_sum = [&](unsigned f, unsigned r) {
        float v = 0.f;
        for (unsigned s = 0; s < kw; ++s) v += red[s * ft + f / 16][f % 16][r];
        return v;
    };
    if (splits > 1) {
        for (unsigned i = threadIdx.x; i < rows * feats; i += blockDim.x) {
            unsigned r = i / feats, f = i % feats;
            // The last group's tiles past `tiles` hold nothing, and have no room in `part`.
            if (fbase + f < width) part[((size_t)blockIdx.y * rows + r) * width + fbase + f] = block_sum(f, r);
        }
        __threadfence();
        __syncthreads();
        if (threadIdx.x == 0) last_s = atomicAdd(&counters[blockIdx.x], 1u) == splits - 1;
        __syncthreads();
        if (!last_s) return;
        __threadfence();
    }
    auto value = [&](unsigned f, unsigned r) {
        if (splits == 1) return block_sum(f, r);
        float v = 0.f;
        for (unsigned s = 0; s < splits; ++s) v += __ldcg(&part[((size_t)s * rows + r) * width + fbase + f]);
        return v;
    };
    if (MODE == SWIGLU) {
        unsigned half = feats / 2;  // outputs of this block: 8 per tile
        for (unsigned i = threadIdx.x; i < rows * half; i += blockDim.x) {
            unsigned r = i / half, q = i % half, f = 16 * (q / 8) + q % 8;
            unsigned o = blockIdx.x * half + q;
            if (o < out) mma_emit<MODE>(y, r, o, out, value(f, r), value(f + 8, r));
        }
    } else {
        for (unsigned i = threadIdx.x; i < rows * feats; i += blockDim.x) {
            unsigned r = i / feats, f = i % feats, o = fbase + f;
            if (o < out) mma_emit<MODE>(y, r, o, out, value(f, r), 0.f);
        }
    }
    if (splits > 1 && threadIdx.x == 0) counters[blockIdx.x] = 0;
}

#define MMA_KERNEL(NAME, N, MODE)                                                                          \
    extern "C" __global__ void __launch_bounds__(MMA_WARPS * 32)                                           \
        NAME(const bf16_t* x, const bf16_t* w, void* y, float* part, unsigned* counters, unsigned rows,     \
             unsigned in, unsigned out, unsigned kw, unsigned splits, unsigned kslice, unsigned early) {    \
        mma_product<N, MODE>(x, w, y, part, counters, rows, in, out, kw, splits, kslice, early);            \
    }

MMA_KERNEL(mma_plain_n2, 2, PLAIN)
MMA_KERNEL(mma_plain_n4, 4, PLAIN)
MMA_KERNEL(mma_plain_n8, 8, PLAIN)
MMA_KERNEL(mma_f32_n2, 2, F32OUT)
MMA_KERNEL(mma_f32_n4, 4, F32OUT)
MMA_KERNEL(mma_f32_n8, 8, F32OUT)
MMA_KERNEL(mma_swiglu_n2, 2, SWIGLU)
MMA_KERNEL(mma_swiglu_n4, 4, SWIGLU)
MMA_KERNEL(mma_swiglu_n8, 8, SWIGLU)
MMA_KERNEL(mma_residual_n2, 2, RESIDUAL)
MMA_KERNEL(mma_residual_n4, 4, RESIDUAL)
MMA_KERNEL(mma_residual_n8, 8, RESIDUAL)

// gemv_lab: the decode step's products alone, as the decoder runs them (one CUDA graph of
// programmatic-dependent launches, Llama-3.2-1B shape, 16 layers of q/k/v, o, gate/up and down
// products, then the logits product), with the production kernels of kernels/cuda/gemv.cu and
// with variants of them, to find where a batch-1 step's product time goes before changing the
// library. A development tool: nothing in the library or its tests uses it.
//
//   nvcc -O3 -std=c++17 -arch=sm_90 -I kernels/cuda scripts/dev/gemv_lab.cu -o /tmp/gemv_lab
//   /tmp/gemv_lab [ROWS]
//
// Prints, per configuration, the median time of one graph replay over 21 repeats of 20 replays,
// the bytes of weights it reads and the rate (GB/s), and checks every variant's output against
// the production kernels' (bit-equal where the split of a row over warps is the same: the
// unroll changes it, and with it the order of the sums).
#include <cuda_runtime.h>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
#undef INFINITY
#include "bf16.cuh"
#include "gemv.cu"

#define CK(x)                                                                                   \
    do {                                                                                        \
        cudaError_t e_ = (x);                                                                   \
        if (e_ != cudaSuccess) {                                                                \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
            exit(1);                                                                            \
        }                                                                                       \
    } while (0)

// ---- the variant: the production kernel with the unroll as a parameter, optionally issuing its
// first weight loads before PDL_WAIT (EARLY; unsound in the library where a kernel ahead may
// write the weights, measured here to know what it would buy), optionally loading the next row's
// first chunks before the current row's dot products (PIPE).
template <int U, int MODE>
__device__ __forceinline__ void lab_load(const bf16_t* __restrict__ w, unsigned o, unsigned out, unsigned in,
                                         unsigned c0, unsigned step, uint4* wa, uint4* wb) {
    if (o >= out) return;
    unsigned nvec = in / 8;
    const uint4* w0 = (const uint4*)(w + (size_t)o * in);
    const uint4* w1 = (const uint4*)(w + (size_t)(MODE == SWIGLU ? o + out : o) * in);
#pragma unroll
    for (int u = 0; u < U; ++u) {
        unsigned c = c0 + step * u;
        if (c < nvec) {
            wa[u] = ld_stream(w0 + c);
            if (MODE == SWIGLU) wb[u] = ld_stream(w1 + c);
        }
    }
}

template <int R, int MODE, bool NORM, int U, bool EARLY>
__device__ __forceinline__ void lab_gemv(const bf16_t* __restrict__ x, const bf16_t* __restrict__ nw, float eps,
                                         const bf16_t* __restrict__ w, void* y, unsigned rows, unsigned in,
                                         unsigned out, unsigned split) {
    extern __shared__ uint4 xs[];
    __shared__ float part_s[GEMV_WARPS][2][R];
    unsigned nvec = in / 8, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    unsigned per_block = GEMV_WARPS / split, sub = warp % split, step = 32 * split;
    unsigned c_first = sub * 32 + lane;
    uint4 wa[U], wb[U];
    unsigned base = blockIdx.x * per_block;
    PDL_LAUNCH();
    if (EARLY) {
        lab_load<U, MODE>(w, base + warp / split, out, in, c_first, step, wa, wb);
        PDL_WAIT();
    } else {
        prefetch_row<MODE>(w, base + warp / split, out, in, c_first, step);
        PDL_WAIT();
        lab_load<U, MODE>(w, base + warp / split, out, in, c_first, step, wa, wb);
    }
    stage<R, NORM>(x, nw, eps, rows, in, xs);
    bool loaded = true;
    for (; base < out; base += gridDim.x * per_block) {
        unsigned o = base + warp / split;
        bool valid = o < out;
        float a0[R], a1[R];
#pragma unroll
        for (int r = 0; r < R; ++r) a0[r] = a1[r] = 0.f;
        for (unsigned c0 = c_first; c0 < nvec; c0 += step * U) {
            if (!loaded) lab_load<U, MODE>(w, o, out, in, c0, step, wa, wb);
            loaded = false;
#pragma unroll
            for (int u = 0; u < U; ++u) {
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
        if (split > 1) __syncthreads();
    }
}

template <int R, int MODE, int U, bool EARLY>
__global__ void __launch_bounds__(GEMV_WARPS * 32)
    lab_norm(const bf16_t* x, const bf16_t* nw, float eps, const bf16_t* w, void* y, unsigned rows, unsigned in,
             unsigned out, unsigned split) {
    lab_gemv<R, MODE, true, U, EARLY>(x, nw, eps, w, y, rows, in, out, split);
}
template <int R, int U, bool EARLY>
__global__ void __launch_bounds__(GEMV_WARPS * 32)
    lab_residual(const bf16_t* x, const bf16_t* w, bf16_t* y, unsigned rows, unsigned in, unsigned out,
                 unsigned split) {
    lab_gemv<R, RESIDUAL, false, U, EARLY>(x, nullptr, 0.f, w, y, rows, in, out, split);
}

// ---- the harness
struct Shape {
    unsigned hidden = 2048, inter = 8192, qkv = 3072, vocab = 128256, layers = 16;
};

static float bf_host(unsigned short v) {
    unsigned u = (unsigned)v << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

__global__ void fill_rand(bf16_t* p, size_t n, unsigned long long seed, float scale) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        unsigned long long z = seed * 0x9e3779b97f4a7c15ULL + i;
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
        z ^= z >> 31;
        float u = ((float)(z >> 40) / 16777216.f - 0.5f) * 2.f * scale;
        p[i] = f2bf(u);
    }
}

struct Bufs {
    std::vector<bf16_t*> wqkv, wo, wgu, wd, n1, n2;
    bf16_t *head, *nf, *x, *x0, *qkv, *attn, *act;
    float* logits;
};

enum Kind { BASE, VAR };
struct Cfg {
    const char* name;
    int kind;     // BASE: the production kernels; VAR: lab kernels
    int unroll;   // VAR: 4, 8 or 16
    bool early;   // VAR
    int per_sm;   // grid cap: blocks per SM (8 = the library's)
    unsigned mask; // which products: 1 qkv, 2 o, 4 gate/up, 8 down, 16 logits
};

static int g_sms = 132;

static unsigned split_for(unsigned in, int unroll) {
    unsigned s = (in / 8 + 32 * unroll - 1) / (32 * unroll);
    s = std::max(1u, std::min(s, 8u));
    unsigned p = 1;
    while (p < s) p <<= 1;
    return p;
}

template <typename K, typename... A>
static void launch(K kern, unsigned blocks, size_t smem, cudaStream_t s, A... args) {
    cudaLaunchConfig_t c = {};
    c.gridDim = dim3(blocks);
    c.blockDim = dim3(GEMV_WARPS * 32);
    c.dynamicSmemBytes = smem;
    c.stream = s;
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    c.attrs = at;
    c.numAttrs = 1;
    CK(cudaLaunchKernelEx(&c, kern, args...));
}

template <int R>
static void norm_product(const Cfg& k, int mode, cudaStream_t s, const bf16_t* x, const bf16_t* nw,
                         const bf16_t* w, void* y, unsigned rows, unsigned in, unsigned out) {
    int u = k.kind == BASE ? GEMV_UNROLL : k.unroll;
    unsigned split = split_for(in, u);
    unsigned blocks = std::min((out * split + GEMV_WARPS - 1) / GEMV_WARPS, (unsigned)(g_sms * k.per_sm));
    size_t smem = (size_t)R * in * 2;
    float eps = 1e-5f;
#define LAB_NORM_U(MODE, UU)                                                                      \
    do {                                                                                          \
        if (k.early) launch(lab_norm<R, MODE, UU, true>, blocks, smem, s, x, nw, eps, w, y, rows, in, out, split); \
        else launch(lab_norm<R, MODE, UU, false>, blocks, smem, s, x, nw, eps, w, y, rows, in, out, split);       \
    } while (0)
#define LAB_NORM(MODE, BASEK)                                                                     \
    do {                                                                                          \
        if (k.kind == BASE) launch(BASEK, blocks, smem, s, x, nw, eps, w, y, rows, in, out, split, k.early ? 1u : 0u); \
        else if (k.unroll == 4) LAB_NORM_U(MODE, 4);                                              \
        else if (k.unroll == 8) LAB_NORM_U(MODE, 8);                                              \
        else LAB_NORM_U(MODE, 16);                                                                \
    } while (0)
    if (mode == PLAIN) LAB_NORM(PLAIN, gemv_norm_r1);
    else if (mode == F32OUT) LAB_NORM(F32OUT, gemv_norm_f32_r1);
    else LAB_NORM(SWIGLU, gemv_norm_swiglu_r1);
}

template <int R>
static void residual_product(const Cfg& k, cudaStream_t s, const bf16_t* x, const bf16_t* w, bf16_t* y,
                             unsigned rows, unsigned in, unsigned out) {
    int u = k.kind == BASE ? GEMV_UNROLL : k.unroll;
    unsigned split = split_for(in, u);
    unsigned blocks = std::min((out * split + GEMV_WARPS - 1) / GEMV_WARPS, (unsigned)(g_sms * k.per_sm));
    size_t smem = (size_t)R * in * 2;
#define LAB_RES_U(UU)                                                                              \
    do {                                                                                           \
        if (k.early) launch(lab_residual<R, UU, true>, blocks, smem, s, x, w, y, rows, in, out, split);  \
        else launch(lab_residual<R, UU, false>, blocks, smem, s, x, w, y, rows, in, out, split);         \
    } while (0)
    if (k.kind == BASE) launch(gemv_residual_r1, blocks, smem, s, x, w, y, rows, in, out, split, k.early ? 1u : 0u);
    else if (k.unroll == 4) LAB_RES_U(4);
    else if (k.unroll == 8) LAB_RES_U(8);
    else LAB_RES_U(16);
}

static double step_bytes(const Shape& sh, unsigned mask) {
    double h = sh.hidden, b = 0;
    if (mask & 1) b += sh.qkv * h;
    if (mask & 2) b += h * h;
    if (mask & 4) b += 2.0 * sh.inter * h;
    if (mask & 8) b += sh.inter * h;
    b *= sh.layers;
    if (mask & 16) b += (double)sh.vocab * h;
    return b * 2;
}

static void record(const Cfg& k, const Shape& sh, Bufs& B, cudaStream_t s, unsigned rows) {
    for (unsigned l = 0; l < sh.layers; ++l) {
        if (k.mask & 1) norm_product<1>(k, PLAIN, s, B.x, B.n1[l], B.wqkv[l], B.qkv, rows, sh.hidden, sh.qkv);
        if (k.mask & 2) residual_product<1>(k, s, B.attn, B.wo[l], B.x, rows, sh.hidden, sh.hidden);
        if (k.mask & 4) norm_product<1>(k, SWIGLU, s, B.x, B.n2[l], B.wgu[l], B.act, rows, sh.hidden, sh.inter);
        if (k.mask & 8) residual_product<1>(k, s, B.act, B.wd[l], B.x, rows, sh.inter, sh.hidden);
    }
    if (k.mask & 16) norm_product<1>(k, F32OUT, s, B.x, B.nf, B.head, B.logits, rows, sh.hidden, sh.vocab);
}

int main(int argc, char** argv) {
    unsigned rows = 1;
    (void)argc;
    (void)argv;
    Shape sh;
    cudaDeviceProp p;
    CK(cudaGetDeviceProperties(&p, 0));
    g_sms = p.multiProcessorCount;
    printf("%s, %d SMs, L2 %d MiB\n", p.name, g_sms, p.l2CacheSize >> 20);
    Bufs B;
    auto alloc = [](size_t n) {
        bf16_t* q;
        CK(cudaMalloc(&q, n * 2));
        fill_rand<<<1024, 256>>>(q, n, (unsigned long long)(size_t)q, 0.05f);
        return q;
    };
    for (unsigned l = 0; l < sh.layers; ++l) {
        B.wqkv.push_back(alloc((size_t)sh.qkv * sh.hidden));
        B.wo.push_back(alloc((size_t)sh.hidden * sh.hidden));
        B.wgu.push_back(alloc((size_t)2 * sh.inter * sh.hidden));
        B.wd.push_back(alloc((size_t)sh.hidden * sh.inter));
        B.n1.push_back(alloc(sh.hidden));
        B.n2.push_back(alloc(sh.hidden));
    }
    B.head = alloc((size_t)sh.vocab * sh.hidden);
    B.nf = alloc(sh.hidden);
    B.x = alloc((size_t)8 * sh.hidden);
    B.x0 = alloc((size_t)8 * sh.hidden);
    B.qkv = alloc((size_t)8 * sh.qkv);
    B.attn = alloc((size_t)8 * sh.hidden);
    B.act = alloc((size_t)8 * sh.inter);
    CK(cudaMalloc(&B.logits, (size_t)8 * sh.vocab * 4));
    CK(cudaDeviceSynchronize());
    // The copy bandwidth (1 GiB device to device, bytes read + written).
    {
        void *a, *b;
        size_t n = 1ull << 30;
        CK(cudaMalloc(&a, n));
        CK(cudaMalloc(&b, n));
        cudaEvent_t e0, e1;
        CK(cudaEventCreate(&e0));
        CK(cudaEventCreate(&e1));
        float best = 1e9;
        for (int i = 0; i < 5; ++i) {
            CK(cudaEventRecord(e0));
            CK(cudaMemcpy(b, a, n, cudaMemcpyDeviceToDevice));
            CK(cudaEventRecord(e1));
            CK(cudaEventSynchronize(e1));
            float ms;
            CK(cudaEventElapsedTime(&ms, e0, e1));
            best = std::min(best, ms);
        }
        printf("copy bandwidth: %.0f GB/s (read + write)\n", 2.0 * n / best / 1e6);
        CK(cudaFree(a));
        CK(cudaFree(b));
    }
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    std::vector<Cfg> cfgs;
    const char* only[] = {"qkv", "o", "gate/up", "down", "logits"};
    for (int m = 0; m < 5; ++m) {
        static char nm[5][32];
        snprintf(nm[m], 32, "base, %s only", only[m]);
        cfgs.push_back({nm[m], BASE, 8, false, 8, 1u << m});
    }
    cfgs.push_back({"base, all", BASE, 8, false, 8, 31});
    cfgs.push_back({"lab u8 (= base), all", VAR, 8, false, 8, 31});
    for (int ps : {2, 3, 4, 6, 16}) {
        static char nm[8][32];
        static int i = 0;
        snprintf(nm[i], 32, "base, %d blocks/SM cap, all", ps);
        cfgs.push_back({nm[i++], BASE, 8, false, ps, 31});
    }
    cfgs.push_back({"base with early = 1, all", BASE, 8, true, 8, 31});
    cfgs.push_back({"lab u4, all", VAR, 4, false, 8, 31});
    cfgs.push_back({"lab u16, all", VAR, 16, false, 8, 31});
    cfgs.push_back({"lab u8 early loads, all", VAR, 8, true, 8, 31});
    cfgs.push_back({"lab u4 early loads, all", VAR, 4, true, 8, 31});
    for (int m = 0; m < 5; ++m) {
        static char nm[5][40];
        snprintf(nm[m], 40, "lab u8 early, %s only", only[m]);
        cfgs.push_back({nm[m], VAR, 8, true, 8, 1u << m});
    }
    std::vector<float> ref_logits;
    for (const Cfg& k : cfgs) {
        cudaGraph_t g;
        cudaGraphExec_t ge;
        CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
        record(k, sh, B, s, rows);
        CK(cudaStreamEndCapture(s, &g));
        CK(cudaGraphInstantiate(&ge, g, 0));
        CK(cudaMemsetAsync(B.logits, 0xff, (size_t)rows * sh.vocab * 4, s));
        CK(cudaMemcpyAsync(B.x, B.x0, (size_t)rows * sh.hidden * 2, cudaMemcpyDeviceToDevice, s));
        CK(cudaGraphLaunch(ge, s));
        CK(cudaStreamSynchronize(s));
        if (k.mask == 31) { // every product ran: the logits must be the production kernels'
            std::vector<float> lg((size_t)rows * sh.vocab);
            CK(cudaMemcpy(lg.data(), B.logits, lg.size() * 4, cudaMemcpyDeviceToHost));
            if (ref_logits.empty()) ref_logits = lg;
            size_t diff = 0;
            for (size_t i = 0; i < lg.size(); ++i) diff += memcmp(&lg[i], &ref_logits[i], 4) != 0 || lg[i] != lg[i];
            if (diff) printf("  %s: %zu of %zu logits differ from the production kernels'\n", k.name, diff, lg.size());
        }
        for (int i = 0; i < 5; ++i) CK(cudaGraphLaunch(ge, s));
        cudaEvent_t e0, e1;
        CK(cudaEventCreate(&e0));
        CK(cudaEventCreate(&e1));
        std::vector<float> t;
        for (int rep = 0; rep < 21; ++rep) {
            CK(cudaEventRecord(e0, s));
            for (int i = 0; i < 20; ++i) CK(cudaGraphLaunch(ge, s));
            CK(cudaEventRecord(e1, s));
            CK(cudaEventSynchronize(e1));
            float ms;
            CK(cudaEventElapsedTime(&ms, e0, e1));
            t.push_back(ms / 20);
        }
        std::sort(t.begin(), t.end());
        double bytes = step_bytes(sh, k.mask);
        printf("%-36s %8.1f us  %7.1f MB  %6.0f GB/s\n", k.name, t[10] * 1e3, bytes / 1e6, bytes / (t[10] * 1e-3) / 1e9);
        CK(cudaGraphExecDestroy(ge));
        CK(cudaGraphDestroy(g));
    }
    return 0;
}

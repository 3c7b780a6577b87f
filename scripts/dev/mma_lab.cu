// mma_lab: the batched decode step's products (16 to 64 rows, Llama-3.2-1B shape, 16 layers of
// q/k/v, o, gate/up and down products, then the logits product), as cuBLAS GEMMs (what the
// decoder runs today above 8 rows: cublasGemmEx, bf16 in, f32 compute, SiLU·up a separate kernel)
// and as the tensor-core kernels of scripts/dev/mma.cu, each product type alone and all of them,
// one CUDA graph per configuration, to choose the work split and to know what the kernels would
// buy. A development tool: nothing in the library or its tests uses it.
//
//   nvcc -O3 -std=c++17 -arch=sm_90 -I kernels/cuda scripts/dev/mma_lab.cu -lcublas -o /tmp/mma_lab
//   /tmp/mma_lab
//
// Prints, per row count, each product's error against a host f64 reference at 512 sampled outputs
// (both paths), then the median time of one graph replay (21 repeats of 20 replays) for cuBLAS and
// for every split tried, the weight bytes read and the rate.
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
#undef INFINITY
#include "bf16.cuh"
#include "gemv.cu"
#include "mma.cu"

#define CK(x)                                                                                   \
    do {                                                                                        \
        cudaError_t e_ = (x);                                                                   \
        if (e_ != cudaSuccess) {                                                                \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
            exit(1);                                                                            \
        }                                                                                       \
    } while (0)
#define CB(x)                                                                     \
    do {                                                                          \
        cublasStatus_t s_ = (x);                                                  \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                        \
            fprintf(stderr, "%s:%d %s: cuBLAS %d\n", __FILE__, __LINE__, #x, s_); \
            exit(1);                                                              \
        }                                                                         \
    } while (0)

__global__ void fill_rand(bf16_t* p, size_t n, unsigned long long seed, float scale) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        unsigned long long z = (i + 1) * 0x9E3779B97F4A7C15ull ^ seed;
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        z ^= z >> 31;
        float u = (float)(z >> 40) / (float)(1ull << 24);  // [0, 1)
        p[i] = f2bf((2.f * u - 1.f) * scale);
    }
}

__global__ void silu_mul(const bf16_t* gu, bf16_t* y, unsigned rows, unsigned inter) {
    for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < rows * inter; i += gridDim.x * blockDim.x) {
        unsigned r = i / inter, o = i % inter;
        float g = bf2f(gu[(size_t)r * 2 * inter + o]), u = bf2f(gu[(size_t)r * 2 * inter + inter + o]);
        float s = round_bf(g / (1.f + __expf(-g)));
        y[i] = f2bf(s * u);
    }
}

static int g_sms = 132;

struct Prod {
    const char* name;
    int mode;
    unsigned in, out;  // out: outputs (SwiGLU: the intermediate width; W has 2 * out rows)
};

static const unsigned LAYERS = 16, HID = 2048, QKV = 3072, INTER = 8192, VOCAB = 128256;
static const Prod PRODS[5] = {{"qkv", PLAIN, HID, QKV},
                              {"o", RESIDUAL, HID, HID},
                              {"gate/up", SWIGLU, HID, INTER},
                              {"down", RESIDUAL, INTER, HID},
                              {"logits", F32OUT, HID, VOCAB}};

static size_t w_rows(const Prod& p) { return p.mode == SWIGLU ? 2 * (size_t)p.out : p.out; }

struct Split {
    unsigned kw, splits;
};

static unsigned tiles_of(const Prod& p) { return p.mode == SWIGLU ? (p.out + 7) / 8 : (p.out + 15) / 16; }

struct Bufs {
    std::vector<bf16_t*> w[5];  // per product: per layer (logits: one)
    bf16_t *x_h, *x_in, *x_attn, *x_act;  // inputs: normalised h, attention out, SwiGLU out
    bf16_t *qkv, *h, *act, *gu;
    float* logits;
    float* part;
    unsigned* counters;
};

template <typename K, typename... A>
static void launch(K kern, dim3 grid, cudaStream_t s, A... args) {
    cudaLaunchConfig_t c = {};
    c.gridDim = grid;
    c.blockDim = dim3(MMA_WARPS * 32);
    c.stream = s;
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    c.attrs = at;
    c.numAttrs = 1;
    CK(cudaLaunchKernelEx(&c, kern, args...));
}

static void mma(const Prod& p, const Split& sp, cudaStream_t s, const bf16_t* x, const bf16_t* w, void* y, Bufs& B,
                unsigned rows, bool early) {
    unsigned tiles = tiles_of(p), ft = MMA_WARPS / sp.kw;
    unsigned groups = (tiles + ft - 1) / ft;
    unsigned slices = sp.splits * sp.kw;
    unsigned kslice = ((p.in + slices - 1) / slices + 63) / 64 * 64;
    dim3 grid(groups, sp.splits);
    unsigned e = early;
    int n = rows <= 16 ? 2 : rows <= 32 ? 4 : 8;
#define MMA_L(MODE_NAME)                                                                                          \
    do {                                                                                                          \
        if (n == 2) launch(mma_##MODE_NAME##_n2, grid, s, x, w, y, B.part, B.counters, rows, p.in, p.out, sp.kw, sp.splits, kslice, e); \
        else if (n == 4) launch(mma_##MODE_NAME##_n4, grid, s, x, w, y, B.part, B.counters, rows, p.in, p.out, sp.kw, sp.splits, kslice, e); \
        else launch(mma_##MODE_NAME##_n8, grid, s, x, w, y, B.part, B.counters, rows, p.in, p.out, sp.kw, sp.splits, kslice, e); \
    } while (0)
    if (p.mode == PLAIN) MMA_L(plain);
    else if (p.mode == F32OUT) MMA_L(f32);
    else if (p.mode == SWIGLU) MMA_L(swiglu);
    else MMA_L(residual);
}

static void blas(cublasHandle_t hb, const Prod& p, cudaStream_t s, const bf16_t* x, const bf16_t* w, void* y, Bufs& B,
                 unsigned rows) {
    float one = 1.f, zero = 0.f;
    unsigned n = (unsigned)w_rows(p);
    void* c = p.mode == SWIGLU ? (void*)B.gu : y;
    cudaDataType ct = p.mode == F32OUT ? CUDA_R_32F : CUDA_R_16BF;
    CB(cublasGemmEx(hb, CUBLAS_OP_T, CUBLAS_OP_N, n, rows, p.in, &one, w, CUDA_R_16BF, p.in, x, CUDA_R_16BF, p.in,
                    p.mode == RESIDUAL ? &one : &zero, c, ct, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    if (p.mode == SWIGLU) silu_mul<<<512, 256, 0, s>>>(B.gu, (bf16_t*)y, rows, p.out);
}

// The inputs and output of product p (by type).
static void io(Bufs& B, int pi, const bf16_t** x, void** y) {
    switch (pi) {
        case 0: *x = B.x_h; *y = B.qkv; break;
        case 1: *x = B.x_attn; *y = B.h; break;
        case 2: *x = B.x_h; *y = B.act; break;
        case 3: *x = B.x_act; *y = B.h; break;
        default: *x = B.x_h; *y = B.logits; break;
    }
}

static void record(cublasHandle_t hb, int kind, const Split* sp, unsigned mask, Bufs& B, cudaStream_t s, unsigned rows,
                   bool early) {
    for (unsigned l = 0; l < LAYERS; ++l) {
        for (int pi = 0; pi < 4; ++pi) {
            if (!(mask & (1u << pi))) continue;
            const bf16_t* x;
            void* y;
            io(B, pi, &x, &y);
            if (kind == 0) blas(hb, PRODS[pi], s, x, B.w[pi][l], y, B, rows);
            else mma(PRODS[pi], sp[pi], s, x, B.w[pi][l], y, B, rows, early);
        }
    }
    if (mask & 16) {
        const bf16_t* x;
        void* y;
        io(B, 4, &x, &y);
        if (kind == 0) blas(hb, PRODS[4], s, x, B.w[4][0], y, B, rows);
        else mma(PRODS[4], sp[4], s, x, B.w[4][0], y, B, rows, early);
    }
}

static double bytes_of(unsigned mask) {
    double b = 0;
    for (int pi = 0; pi < 5; ++pi)
        if (mask & (1u << pi)) b += (double)w_rows(PRODS[pi]) * PRODS[pi].in * 2 * (pi == 4 ? 1 : LAYERS);
    return b;
}

static float time_graph(cublasHandle_t hb, int kind, const Split* sp, unsigned mask, Bufs& B, cudaStream_t s,
                        unsigned rows, bool early) {
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    record(hb, kind, sp, mask, B, s, rows, early);
    CK(cudaStreamEndCapture(s, &g));
    CK(cudaGraphInstantiate(&ge, g, 0));
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
    CK(cudaGraphExecDestroy(ge));
    CK(cudaGraphDestroy(g));
    CK(cudaEventDestroy(e0));
    CK(cudaEventDestroy(e1));
    return t[10] * 1e3f;  // us
}

static float h2f(bf16_t v) {
    unsigned u = (unsigned)v << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static bf16_t f2h(float f) {
    unsigned u;
    memcpy(&u, &f, 4);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (bf16_t)(u >> 16);
}
static float rb(float f) { return h2f(f2h(f)); }

// Checks one launch of product pi (layer 0) against f64 on 512 sampled outputs; returns the
// largest error in units of the bf16 spacing at the reference (f32 outputs: relative to the
// largest |reference| sampled).
static double check(cublasHandle_t hb, int kind, int pi, const Split& sp, Bufs& B, cudaStream_t s, unsigned rows) {
    const Prod& p = PRODS[pi];
    const bf16_t* x;
    void* y;
    io(B, pi, &x, &y);
    size_t ny = (size_t)rows * p.out;
    size_t esz = p.mode == F32OUT ? 4 : 2;
    std::vector<bf16_t> y0(ny);
    if (p.mode == RESIDUAL) {  // a random residual
        fill_rand<<<256, 256, 0, s>>>((bf16_t*)y, ny, 77, 1.f);
        CK(cudaMemcpyAsync(y0.data(), y, ny * 2, cudaMemcpyDeviceToHost, s));
    } else {
        CK(cudaMemsetAsync(y, 0xff, ny * esz, s));  // NaN poison
    }
    if (kind == 0) blas(hb, p, s, x, B.w[pi][0], y, B, rows);
    else mma(p, sp, s, x, B.w[pi][0], y, B, rows, false);
    CK(cudaStreamSynchronize(s));
    CK(cudaGetLastError());
    std::vector<char> yh(ny * esz);
    CK(cudaMemcpy(yh.data(), y, ny * esz, cudaMemcpyDeviceToHost));
    std::vector<bf16_t> xh((size_t)rows * p.in), wr(p.in), wu(p.in);
    CK(cudaMemcpy(xh.data(), x, xh.size() * 2, cudaMemcpyDeviceToHost));
    size_t nan = 0;
    for (size_t i = 0; i < ny; ++i) {
        float v = esz == 4 ? ((float*)yh.data())[i] : h2f(((bf16_t*)yh.data())[i]);
        nan += v != v;
    }
    double worst = 0, maxref = 0;
    std::vector<std::pair<double, double>> got;
    for (int sIdx = 0; sIdx < 512; ++sIdx) {
        unsigned r = (sIdx * 7) % rows, o = (unsigned)(((size_t)sIdx * 2654435761u) % p.out);
        if (sIdx < 8) o = p.out - 1 - sIdx;  // the last tile
        CK(cudaMemcpy(wr.data(), B.w[pi][0] + (size_t)o * p.in, p.in * 2, cudaMemcpyDeviceToHost));
        if (p.mode == SWIGLU) CK(cudaMemcpy(wu.data(), B.w[pi][0] + ((size_t)p.out + o) * p.in, p.in * 2, cudaMemcpyDeviceToHost));
        double a = 0, b = 0;
        for (unsigned k = 0; k < p.in; ++k) {
            a += (double)h2f(xh[(size_t)r * p.in + k]) * h2f(wr[k]);
            if (p.mode == SWIGLU) b += (double)h2f(xh[(size_t)r * p.in + k]) * h2f(wu[k]);
        }
        double ref;
        if (p.mode == SWIGLU) {
            double g = rb((float)a), u = rb((float)b);
            ref = rb((float)(g / (1 + exp(-g)))) * u;
        } else if (p.mode == RESIDUAL) {
            ref = (double)h2f(y0[(size_t)r * p.out + o]) + rb((float)a);
        } else {
            ref = a;
        }
        size_t i = (size_t)r * p.out + o;
        double v = esz == 4 ? ((float*)yh.data())[i] : h2f(((bf16_t*)yh.data())[i]);
        got.push_back({v, ref});
        maxref = std::max(maxref, fabs(ref));
    }
    for (auto& [v, ref] : got) {
        double unit = esz == 4 ? maxref * 1e-6 : std::max(fabs(ref), 1e-3) / 128.0;  // bf16 spacing (upper bound)
        worst = std::max(worst, fabs(v - ref) / unit);
    }
    if (nan) printf("    %s: %zu NaN outputs\n", p.name, nan);
    return nan ? 1e30 : worst;
}

int main() {
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    g_sms = prop.multiProcessorCount;
    printf("%s, %d SMs, L2 %d MiB\n", prop.name, g_sms, prop.l2CacheSize >> 20);
    Bufs B;
    auto alloc = [](size_t n, float scale) {
        bf16_t* q;
        CK(cudaMalloc(&q, n * 2));
        fill_rand<<<1024, 256>>>(q, n, (unsigned long long)(size_t)q, scale);
        return q;
    };
    for (int pi = 0; pi < 5; ++pi) {
        unsigned nl = pi == 4 ? 1 : LAYERS;
        for (unsigned l = 0; l < nl; ++l) B.w[pi].push_back(alloc(w_rows(PRODS[pi]) * PRODS[pi].in, 0.05f));
    }
    const unsigned MAXR = 64;
    B.x_h = alloc((size_t)MAXR * HID, 1.f);
    B.x_attn = alloc((size_t)MAXR * HID, 1.f);
    B.x_act = alloc((size_t)MAXR * INTER, 0.3f);
    B.qkv = alloc((size_t)MAXR * QKV, 1.f);
    B.h = alloc((size_t)MAXR * HID, 1.f);
    B.act = alloc((size_t)MAXR * INTER, 1.f);
    B.gu = alloc((size_t)MAXR * 2 * INTER, 1.f);
    CK(cudaMalloc(&B.logits, (size_t)MAXR * VOCAB * 4));
    size_t part_floats = (size_t)64 * MAXR * 2 * INTER;
    CK(cudaMalloc(&B.part, part_floats * 4));
    CK(cudaMalloc(&B.counters, 65536 * 4));
    CK(cudaMemset(B.counters, 0, 65536 * 4));
    CK(cudaDeviceSynchronize());
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cublasHandle_t hb;
    CB(cublasCreate(&hb));
    CB(cublasSetStream(hb, s));
    void* ws;
    CK(cudaMalloc(&ws, 32 << 20));
    CB(cublasSetWorkspace(hb, ws, 32 << 20));
    const Split cand[] = {{1, 1}, {2, 1}, {4, 1}, {8, 1}, {1, 2}, {2, 2}, {4, 2}, {8, 2}, {1, 4},
                          {2, 4}, {4, 4}, {2, 8}, {4, 8}, {8, 4}, {2, 16}, {4, 16}, {8, 8}};
    for (unsigned rows : {16u, 32u, 64u}) {
        printf("\n== %u rows ==\n", rows);
        Split best[5];
        float best_t[5];
        Split dflt[5] = {{2, 4}, {2, 4}, {2, 1}, {2, 8}, {1, 1}};
        for (int pi = 0; pi < 5; ++pi) {
            double eb = check(hb, 0, pi, dflt[pi], B, s, rows), em = check(hb, 1, pi, dflt[pi], B, s, rows);
            printf("  %-8s error vs f64 (bf16 spacings; f32: 1e-6 of max): cuBLAS %.2f, mma %.2f\n", PRODS[pi].name, eb, em);
            float tb = time_graph(hb, 0, nullptr, 1u << pi, B, s, rows, false);
            double by = bytes_of(1u << pi);
            printf("  %-8s cuBLAS            %8.1f us  %7.1f MB  %6.0f GB/s\n", PRODS[pi].name, tb, by / 1e6, by / (tb * 1e-6) / 1e9);
            best_t[pi] = 1e30f;
            for (const Split& c : cand) {
                unsigned tiles = tiles_of(PRODS[pi]);
                if ((tiles + MMA_WARPS / c.kw - 1) / (MMA_WARPS / c.kw) * c.splits > 65535 * 4) continue;
                if ((size_t)c.splits * rows * 16 * tiles > part_floats) continue;
                Split sp[5];
                for (auto& q : sp) q = c;
                float t = time_graph(hb, 1, sp, 1u << pi, B, s, rows, true);
                printf("  %-8s mma kw %u splits %2u %8.1f us  %6.0f GB/s\n", PRODS[pi].name, c.kw, c.splits, t, by / (t * 1e-6) / 1e9);
                if (t < best_t[pi]) best_t[pi] = t, best[pi] = c;
            }
            double eb2 = check(hb, 1, pi, best[pi], B, s, rows);
            printf("  %-8s best kw %u splits %u: %.1f us (cuBLAS %.1f), error %.2f\n", PRODS[pi].name, best[pi].kw, best[pi].splits,
                   best_t[pi], tb, eb2);
        }
        float tb = time_graph(hb, 0, nullptr, 31, B, s, rows, false);
        float tm = time_graph(hb, 1, best, 31, B, s, rows, true);
        float tm0 = time_graph(hb, 1, best, 31, B, s, rows, false);
        double by = bytes_of(31);
        printf("  ALL products: cuBLAS %.1f us (%.0f GB/s), mma best %.1f us (%.0f GB/s), without early loads %.1f us\n", tb,
               by / (tb * 1e-6) / 1e9, tm, by / (tm * 1e-6) / 1e9, tm0);
    }
    return 0;
}

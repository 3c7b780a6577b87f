// Per-row sampling of the next token from f32 logits (temperature, top-k, top-p), on the GPU and
// without sorting, so that it can run inside a decode step's CUDA graph right after the greedy
// argmax. One block per row (grid-stride over rows, 64-bit offsets); SAMPLE_THREADS threads.
//
// A row whose temperature is not > 0 is greedy: next[row] (the argmax already there) is left
// untouched. For a sampled row:
//   - weights w_i = exp((l_i - max) / T) over the non-NaN logits (NaN logits weigh nothing and are
//     never chosen; -inf logits weigh 0, also at T = +inf, where every finite logit weighs 1). If the largest logit is +inf, w_i = 1 for the +inf logits and 0 for the rest
//     (the pick is uniform among the +inf logits). A row with no non-NaN logit, or whose largest
//     logit is -inf, keeps the argmax's answer.
//   - the logits are compared through the order-preserving integer image of the float (`key`,
//     -0 read as +0). top-k (k > 0, k < the non-NaN count) keeps the logits whose key is >= the
//     k-th largest key: ties with the k-th largest are all kept. top-p (< 1) keeps, of those, the
//     logits whose key is >= the largest threshold t such that the kept mass above t is >= top_p
//     times the mass kept by top-k: the smallest set of largest logits whose mass reaches top_p,
//     all logits equal to the last one it needs counted. Both thresholds are found by bisection
//     over the 32 bits of the key (32 block reductions of counts, resp. masses).
//   - u in [0, 1) comes from a counter-based hash of (seed, counter) only (`sample_uniform`), never
//     of the row, the batch or the grid; the token is the first kept index (in index order) whose
//     running mass exceeds u * kept mass: per-thread contiguous chunks, a block-wide exclusive
//     prefix sum of the chunk masses, then a scan inside the one chunk that holds the target.
//     Every sum is taken in a fixed order (it depends only on vocab and the block size), so a row
//     gives the same token whatever else is in the batch.
//
// Shared memory: every value one thread writes and another reads is separated by __syncthreads()
// (the reductions start and end with one).

#define SAMPLE_THREADS 1024
#define SAMPLE_WARPS (SAMPLE_THREADS / 32)
// NVRTC has no math.h: +inf spelled out (this file is compiled on its own).
#define SAMPLE_INF __int_as_float(0x7f800000)

struct SampleParams {
    float temperature;
    float top_p;
    unsigned top_k;
    unsigned counter;
    unsigned long long seed;
};

__device__ __forceinline__ unsigned long long sample_splitmix64(unsigned long long x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

// u in [0, 1) with 53 random bits, from (seed, counter) only (mirrored by kernels::sample::uniform).
__device__ __forceinline__ double sample_uniform(unsigned long long seed, unsigned counter) {
    unsigned long long h = sample_splitmix64(sample_splitmix64(seed) + (unsigned long long)counter);
    return (double)(h >> 11) * (1.0 / 9007199254740992.0);
}

// The order-preserving integer image of a non-NaN float (-0 as +0).
__device__ __forceinline__ unsigned sample_key(float v) {
    unsigned b = __float_as_uint(v == 0.f ? 0.f : v);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

struct SumF { __device__ float operator()(float a, float b) const { return a + b; } };
struct SumD { __device__ double operator()(double a, double b) const { return a + b; } };
struct SumU { __device__ unsigned operator()(unsigned a, unsigned b) const { return a + b; } };
struct MaxF { __device__ float operator()(float a, float b) const { return fmaxf(a, b); } };
struct MaxU64 {
    __device__ unsigned long long operator()(unsigned long long a, unsigned long long b) const {
        return a > b ? a : b;
    }
};

template <typename T, typename Op> __device__ __forceinline__ T sample_warp_reduce(T v, Op op) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Block-wide reduction (blockDim.x == SAMPLE_THREADS), the result broadcast to every thread, in
// a fixed order. `sh` holds SAMPLE_WARPS + 1 values. Starts with __syncthreads() (earlier readers
// of `sh` are done before it is written again) and ends with one (the broadcast is written
// before anyone reads it).
template <typename T, typename Op> __device__ T sample_block_reduce(T v, Op op, T identity, T* sh) {
    unsigned warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    v = sample_warp_reduce(v, op);
    __syncthreads();
    if (lane == 0) sh[warp] = v;
    __syncthreads();
    if (warp == 0) {
        T t = lane < SAMPLE_WARPS ? sh[lane] : identity;
        t = sample_warp_reduce(t, op);
        if (lane == 0) sh[SAMPLE_WARPS] = t;
    }
    __syncthreads();
    return sh[SAMPLE_WARPS];
}

// Exclusive prefix sums over the threads of the block, in thread order: `*before` = b_j, the sum of
// the values of threads < j, `*after` = b_{j+1} (b_{SAMPLE_THREADS} = `*total`). The intervals
// [b_j, b_{j+1}) cover [0, total) whatever the rounding: for t in [0, total), the largest j with
// b_j <= t has t < b_{j+1}. `sh` holds SAMPLE_WARPS values, `sb` SAMPLE_THREADS + 1.
__device__ void sample_block_scan(double v, double* before, double* after, double* total, double* sh,
                                  double* sb) {
    unsigned warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    double inc = v;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        double n = __shfl_up_sync(0xffffffffu, inc, o);
        if (lane >= (unsigned)o) inc += n;
    }
    double excl = __shfl_up_sync(0xffffffffu, inc, 1);
    if (lane == 0) excl = 0.0;
    __syncthreads();
    if (lane == 31) sb[warp] = inc; // the warp totals (sb is free: the barrier above)
    __syncthreads();
    if (warp == 0) {
        double ti = lane < SAMPLE_WARPS ? sb[lane] : 0.0;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            double n = __shfl_up_sync(0xffffffffu, ti, o);
            if (lane >= (unsigned)o) ti += n;
        }
        double ex = __shfl_up_sync(0xffffffffu, ti, 1);
        if (lane < SAMPLE_WARPS) sh[lane] = lane == 0 ? 0.0 : ex; // another array than sb
        if (lane == 31) sh[SAMPLE_WARPS] = ti;
    }
    __syncthreads();
    const double b = sh[warp] + excl;
    sb[threadIdx.x] = b; // every reader of the warp totals passed the barrier above
    if (threadIdx.x == 0) sb[SAMPLE_THREADS] = sh[SAMPLE_WARPS];
    __syncthreads();
    *before = b;
    *after = sb[threadIdx.x + 1];
    *total = sb[SAMPLE_THREADS];
    __syncthreads(); // the reads above come before anyone writes sb or sh again
}

// The weight of logit v (0 for NaN and -inf); `m` is the row's largest non-NaN logit (not -inf).
// Never NaN: with T = +inf (inv_t = 0) a -inf logit weighs 0 and a finite one 1 (the limit
// exp(0), also where v - m overflows to -inf), where (v - m) * inv_t alone would give -inf * 0.
// For finite T > 0 this is exactly expf((v - m) * inv_t).
__device__ __forceinline__ float sample_weight(float v, float m, float inv_t, bool inf_mode) {
    if (v != v) return 0.f;
    if (inf_mode) return v == m ? 1.f : 0.f;
    if (v == m) return 1.f;
    if (v == -SAMPLE_INF) return 0.f;
    const float e = (v - m) * inv_t; // v < m: < 0 (maybe -inf) times a positive (maybe inf) factor
    return e == e ? expf(e) : 1.f;  // NaN only as -inf * 0 (T = +inf)
}

extern "C" __global__ void __launch_bounds__(SAMPLE_THREADS)
    sample_rows_f32(const float* logits, const SampleParams* params, unsigned* next, unsigned rows,
                    unsigned long long vocab) {
    __shared__ float sh_f[SAMPLE_WARPS + 1];
    __shared__ unsigned sh_u[SAMPLE_WARPS + 1];
    __shared__ unsigned long long sh_l[SAMPLE_WARPS + 1];
    __shared__ double sh_d[SAMPLE_WARPS + 1];
    __shared__ double sh_b[SAMPLE_THREADS + 1];
    __shared__ unsigned long long chosen;
    const unsigned tid = threadIdx.x;
    for (unsigned long long r = blockIdx.x; r < rows; r += gridDim.x) { // block-uniform
        const SampleParams p = params[r];
        if (!(p.temperature > 0.f)) continue; // greedy (or NaN): keep the argmax
        const float* x = logits + r * vocab;

        // The largest non-NaN logit and the number of non-NaN logits.
        float m = -SAMPLE_INF;
        unsigned valid = 0;
        for (unsigned long long i = tid; i < vocab; i += SAMPLE_THREADS) {
            float v = x[i];
            if (v == v) {
                m = fmaxf(m, v);
                ++valid;
            }
        }
        m = sample_block_reduce(m, MaxF(), -SAMPLE_INF, sh_f);
        valid = sample_block_reduce(valid, SumU(), 0u, sh_u);
        if (valid == 0 || m == -SAMPLE_INF) continue; // keep the argmax (block-uniform values)
        const bool inf_mode = m == SAMPLE_INF;
        const float inv_t = 1.f / p.temperature;

        // top-k: the largest key threshold with at least k non-NaN logits at or above it.
        unsigned tk = 0;
        if (p.top_k != 0 && p.top_k < valid) {
            for (int bit = 31; bit >= 0; --bit) {
                unsigned cand = tk | (1u << bit);
                unsigned c = 0;
                for (unsigned long long i = tid; i < vocab; i += SAMPLE_THREADS) {
                    float v = x[i];
                    c += (v == v && sample_key(v) >= cand) ? 1u : 0u;
                }
                c = sample_block_reduce(c, SumU(), 0u, sh_u);
                if (c >= p.top_k) tk = cand; // block-uniform
            }
        }

        // top-p: the largest threshold whose kept mass (within top-k) reaches top_p of the total.
        unsigned tp = 0;
        if (p.top_p < 1.f) {
            float z = 0.f;
            for (unsigned long long i = tid; i < vocab; i += SAMPLE_THREADS) {
                float v = x[i];
                if (v == v && sample_key(v) >= tk) z += sample_weight(v, m, inv_t, inf_mode);
            }
            z = sample_block_reduce(z, SumF(), 0.f, sh_f);
            const float target = p.top_p * z; // <= z (z >= 1: the largest logit weighs 1)
            for (int bit = 31; bit >= 0; --bit) {
                unsigned cand = tp | (1u << bit);
                unsigned lo = cand > tk ? cand : tk;
                float s = 0.f;
                for (unsigned long long i = tid; i < vocab; i += SAMPLE_THREADS) {
                    float v = x[i];
                    if (v == v && sample_key(v) >= lo) s += sample_weight(v, m, inv_t, inf_mode);
                }
                s = sample_block_reduce(s, SumF(), 0.f, sh_f);
                // The mass is monotone in the threshold (sums of non-negative terms in a fixed
                // order); `s > 0` keeps the largest logit even for top_p <= 0.
                if (s >= target && s > 0.f) tp = cand; // block-uniform
            }
        }
        const unsigned thr = tp > tk ? tp : tk;

        // Inverse CDF over the kept logits in index order: per-thread contiguous chunks.
        const unsigned long long chunk = (vocab + SAMPLE_THREADS - 1) / SAMPLE_THREADS;
        const unsigned long long begin = (unsigned long long)tid * chunk;
        const unsigned long long end = begin + chunk < vocab ? begin + chunk : vocab;
        float mass = 0.f;
        unsigned long long last = 0; // 1 + the last index with positive kept weight (0: none)
        for (unsigned long long i = begin; i < end; ++i) {
            float v = x[i];
            float w = (v == v && sample_key(v) >= thr) ? sample_weight(v, m, inv_t, inf_mode) : 0.f;
            mass += w;
            if (w > 0.f) last = i + 1;
        }
        last = sample_block_reduce(last, MaxU64(), 0ull, sh_l); // >= 1: the largest logit is kept
        double before, after, total;
        sample_block_scan((double)mass, &before, &after, &total, sh_d, sh_b);
        const double target = sample_uniform(p.seed, p.counter) * total;
        if (tid == 0) chosen = ~0ull;
        __syncthreads();
        if (before <= target && target < after) {
            const double t = target - before;
            float run = 0.f;
            unsigned long long pick = ~0ull;
            for (unsigned long long i = begin; i < end; ++i) {
                float v = x[i];
                float w = (v == v && sample_key(v) >= thr) ? sample_weight(v, m, inv_t, inf_mode) : 0.f;
                run += w;
                if (w > 0.f) {
                    pick = i;
                    if ((double)run > t) break;
                }
            }
            // (Rounding may leave t >= run at the chunk's end: its last positive token, `pick`;
            // a chunk without one claims nothing.)
            if (pick != ~0ull) atomicMin(&chosen, pick);
        }
        __syncthreads();
        if (tid == 0) {
            unsigned long long c = chosen;
            // No chunk claimed the target (rounding at the very top): the last kept token.
            next[r] = (unsigned)(c != ~0ull ? c : last - 1);
        }
        // The next row's first reduction starts with __syncthreads(), after thread 0's read of
        // `chosen` (thread 0 also writes it next, so there is no cross-thread hazard on it).
    }
}

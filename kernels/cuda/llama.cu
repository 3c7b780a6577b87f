// Kernels of a Llama-style decoder in bf16 (the ones cuBLAS does not provide): embedding gather,
// RMSNorm, rotary embedding + KV-cache append + grouped-query attention over the cache (fused),
// SwiGLU, and greedy argmax. bf16 is handled as raw 16-bit patterns (no headers needed):
// widened to f32 for arithmetic, rounded to nearest even on the way back, as PyTorch does.
//
// Every index that comes from device memory (token ids, cache slots, positions) is checked here
// against the bounds passed by the host: an out-of-range value never reads or writes outside a
// buffer; the row it belongs to gets NaN outputs instead, which the host-side checks report.

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

// h[b][:] = table[tokens[b]][:] for b < batch; a token >= vocab gives a NaN row.
// Grid: (ceil(hidden / blockDim.x), batch).
extern "C" __global__ void embed_bf16(const unsigned* tokens, const bf16_t* table, bf16_t* h,
                                      unsigned batch, unsigned hidden, unsigned vocab) {
    unsigned b = blockIdx.y;
    if (b >= batch) return;
    unsigned tok = tokens[b];
    for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < hidden; i += gridDim.x * blockDim.x) {
        h[(size_t)b * hidden + i] = tok < vocab ? table[(size_t)tok * hidden + i] : NAN_BF16;
    }
}

// out[r][:] = bf16(w * bf16(x[r] / rms(x[r]))), as Hugging Face's LlamaRMSNorm. One block per row
// (grid.x = rows, any multiple of 32 threads up to 1024).
extern "C" __global__ void rmsnorm_bf16(const bf16_t* x, const bf16_t* w, bf16_t* out, unsigned rows,
                                        unsigned hidden, float eps) {
    __shared__ float partial[32];
    unsigned r = blockIdx.x;
    if (r >= rows) return;
    const bf16_t* xr = x + (size_t)r * hidden;
    float ss = 0.f;
    for (unsigned i = threadIdx.x; i < hidden; i += blockDim.x) {
        float v = bf2f(xr[i]);
        ss += v * v;
    }
    ss = warp_sum(ss);
    unsigned warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
    if (lane == 0) partial[warp] = ss;
    __syncthreads();
    if (warp == 0) {
        float v = lane < warps ? partial[lane] : 0.f;
        v = warp_sum(v);
        if (lane == 0) partial[0] = v;
    }
    __syncthreads();
    float inv = rsqrtf(partial[0] / (float)hidden + eps);
    for (unsigned i = threadIdx.x; i < hidden; i += blockDim.x) {
        out[(size_t)r * hidden + i] = f2bf(bf2f(w[i]) * round_bf(bf2f(xr[i]) * inv));
    }
}

// out[r][i] = bf16(bf16(silu(g)) * u) with g = gu[r][i], u = gu[r][inter + i] (gate and up
// projections computed by one GEMM over the stacked weights). Grid-stride over rows * inter.
extern "C" __global__ void silu_mul_bf16(const bf16_t* gu, bf16_t* out, unsigned rows, unsigned inter) {
    size_t n = (size_t)rows * inter;
    for (size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x; idx < n; idx += (size_t)gridDim.x * blockDim.x) {
        size_t r = idx / inter, i = idx % inter;
        float g = bf2f(gu[r * 2 * inter + i]);
        float u = bf2f(gu[r * 2 * inter + inter + i]);
        float s = round_bf(g / (1.f + __expf(-g)));
        out[idx] = f2bf(s * u);
    }
}

// The shape of one attention launch (passed by value).
struct AttnShape {
    unsigned batch;      // rows of qkv and out
    unsigned heads;      // query heads
    unsigned kv_heads;   // key/value heads (heads % kv_heads == 0, heads / kv_heads <= 8)
    unsigned head_dim;   // multiple of 32, at most 128
    unsigned slots;      // cache slots (sequences) per layer
    unsigned max_seq;    // positions per slot
    float scale;         // 1 / sqrt(head_dim)
};

#define MAX_GROUP 8
#define MAX_HD 128
#define ATTN_WARPS 8

// One block per (kv head, row): applies the rotary embedding to the row's new key and to the
// group of queries that share that key/value head, appends key and value to the cache at
// (slots[b], positions[b]), then attends each query over cache positions 0..=positions[b] with
// an online softmax (f32), writing out[b][head][:] in bf16.
//
// qkv[b] = [q (heads*hd) | k (kv_heads*hd) | v (kv_heads*hd)] (one GEMM over the stacked
// weights); caches k_cache/v_cache[slot][kv_head][pos][hd]; inv_freq[hd/2] the rotary
// frequencies. Slot 0xffffffff marks an inactive row (zero output); any other slot >= slots or a
// position >= max_seq writes nothing to the cache and NaN to the row's output. Block: ATTN_WARPS * 32 threads.
extern "C" __global__ void rope_attention_bf16(const bf16_t* qkv, bf16_t* k_cache, bf16_t* v_cache,
                                               const unsigned* slots, const unsigned* positions,
                                               const float* inv_freq, bf16_t* out, AttnShape s) {
    __shared__ float q_s[MAX_GROUP][MAX_HD];
    __shared__ float m_s[ATTN_WARPS][MAX_GROUP];
    __shared__ float l_s[ATTN_WARPS][MAX_GROUP];
    __shared__ float acc_s[ATTN_WARPS][MAX_GROUP][MAX_HD];

    unsigned kvh = blockIdx.x, b = blockIdx.y;
    if (kvh >= s.kv_heads || b >= s.batch) return;
    unsigned hd = s.head_dim, half = hd / 2, group = s.heads / s.kv_heads;
    unsigned qkv_row = (s.heads + 2 * s.kv_heads) * hd;
    const bf16_t* row = qkv + (size_t)b * qkv_row;
    unsigned slot = slots[b], pos = positions[b];
    bf16_t* o = out + (size_t)b * s.heads * hd + (size_t)kvh * group * hd;
    if (slot == 0xffffffffu) { // an inactive (padding) row: zeros, no cache access
        for (unsigned i = threadIdx.x; i < group * hd; i += blockDim.x) o[i] = 0;
        return;
    }
    if (slot >= s.slots || pos >= s.max_seq) {
        for (unsigned i = threadIdx.x; i < group * hd; i += blockDim.x) o[i] = NAN_BF16;
        return;
    }
    size_t head_base = ((size_t)slot * s.kv_heads + kvh) * s.max_seq * hd;
    // Rotary embedding (Hugging Face's rotate_half convention; cos/sin rounded to bf16 as there).
    for (unsigned i = threadIdx.x; i < half; i += blockDim.x) {
        float ang = (float)pos * inv_freq[i];
        float c = round_bf(cosf(ang)), sn = round_bf(sinf(ang));
        for (unsigned g = 0; g < group; ++g) {
            const bf16_t* q = row + (size_t)(kvh * group + g) * hd;
            float x1 = bf2f(q[i]), x2 = bf2f(q[i + half]);
            q_s[g][i] = round_bf(x1 * c - x2 * sn) * s.scale;
            q_s[g][i + half] = round_bf(x2 * c + x1 * sn) * s.scale;
        }
        const bf16_t* k = row + (size_t)s.heads * hd + (size_t)kvh * hd;
        float k1 = bf2f(k[i]), k2 = bf2f(k[i + half]);
        k_cache[head_base + (size_t)pos * hd + i] = f2bf(k1 * c - k2 * sn);
        k_cache[head_base + (size_t)pos * hd + i + half] = f2bf(k2 * c + k1 * sn);
    }
    const bf16_t* v = row + (size_t)(s.heads + s.kv_heads) * hd + (size_t)kvh * hd;
    for (unsigned i = threadIdx.x; i < hd; i += blockDim.x) v_cache[head_base + (size_t)pos * hd + i] = v[i];
    __syncthreads();

    unsigned warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    unsigned per_lane = hd / 32; // dims per lane: lane handles d = lane + 32 * j
    float m[MAX_GROUP], l[MAX_GROUP], acc[MAX_GROUP][MAX_HD / 32];
    for (unsigned g = 0; g < MAX_GROUP; ++g) {
        m[g] = -INFINITY;
        l[g] = 0.f;
        for (unsigned j = 0; j < MAX_HD / 32; ++j) acc[g][j] = 0.f;
    }
    for (unsigned p = warp; p <= pos; p += ATTN_WARPS) {
        const bf16_t* kp = k_cache + head_base + (size_t)p * hd;
        const bf16_t* vp = v_cache + head_base + (size_t)p * hd;
        float kv[MAX_HD / 32], vv[MAX_HD / 32];
        for (unsigned j = 0; j < MAX_HD / 32; ++j) {
            if (j < per_lane) {
                kv[j] = bf2f(kp[lane + 32 * j]);
                vv[j] = bf2f(vp[lane + 32 * j]);
            }
        }
        for (unsigned g = 0; g < MAX_GROUP; ++g) {
            if (g >= group) break;
            float dot = 0.f;
            for (unsigned j = 0; j < MAX_HD / 32; ++j)
                if (j < per_lane) dot += q_s[g][lane + 32 * j] * kv[j];
            dot = warp_sum(dot);
            float m_new = fmaxf(m[g], dot);
            float corr = __expf(m[g] - m_new), w = __expf(dot - m_new);
            l[g] = l[g] * corr + w;
            for (unsigned j = 0; j < MAX_HD / 32; ++j)
                if (j < per_lane) acc[g][j] = acc[g][j] * corr + w * vv[j];
            m[g] = m_new;
        }
    }
    for (unsigned g = 0; g < group; ++g) {
        if (lane == 0) {
            m_s[warp][g] = m[g];
            l_s[warp][g] = l[g];
        }
        for (unsigned j = 0; j < per_lane; ++j) acc_s[warp][g][lane + 32 * j] = acc[g][j];
    }
    __syncthreads();
    for (unsigned idx = threadIdx.x; idx < group * hd; idx += blockDim.x) {
        unsigned g = idx / hd, d = idx % hd;
        float mx = -INFINITY;
        for (unsigned w = 0; w < ATTN_WARPS; ++w) mx = fmaxf(mx, m_s[w][g]);
        float num = 0.f, den = 0.f;
        for (unsigned w = 0; w < ATTN_WARPS; ++w) {
            if (m_s[w][g] == -INFINITY) continue; // this warp saw no position
            float f = __expf(m_s[w][g] - mx);
            num += f * acc_s[w][g][d];
            den += f * l_s[w][g];
        }
        o[(size_t)g * hd + d] = f2bf(num / den);
    }
}

// out[r] = the index of the largest logits[r][:] (the first one on ties; NaN rows give `vocab`).
// One block per row, blockDim a multiple of 32 up to 1024.
extern "C" __global__ void argmax_f32(const float* logits, unsigned* out, unsigned rows, unsigned vocab) {
    __shared__ float best_v[32];
    __shared__ unsigned best_i[32];
    unsigned r = blockIdx.x;
    if (r >= rows) return;
    const float* x = logits + (size_t)r * vocab;
    float bv = -INFINITY;
    unsigned bi = vocab;
    for (unsigned i = threadIdx.x; i < vocab; i += blockDim.x) {
        float v = x[i];
        if (v > bv || (v == bv && i < bi)) { bv = v; bi = i; }
    }
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        unsigned oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (ov > bv || (ov == bv && oi < bi)) { bv = ov; bi = oi; }
    }
    unsigned warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
    if (lane == 0) { best_v[warp] = bv; best_i[warp] = bi; }
    __syncthreads();
    if (warp == 0) {
        bv = lane < warps ? best_v[lane] : -INFINITY;
        bi = lane < warps ? best_i[lane] : vocab;
        for (int o = 16; o > 0; o >>= 1) {
            float ov = __shfl_xor_sync(0xffffffffu, bv, o);
            unsigned oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (ov > bv || (ov == bv && oi < bi)) { bv = ov; bi = oi; }
        }
        if (lane == 0) out[r] = bi;
    }
}

// Random bf16 weights on the device: w[i] = bf16(mean + std * N(0,1)) from a counter-based hash
// of (seed, i) (Box-Muller over two 24-bit uniforms). Grid-stride over n.
__device__ __forceinline__ unsigned long long mix64(unsigned long long z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

extern "C" __global__ void randn_bf16(bf16_t* w, unsigned long long n, unsigned long long seed, float mean, float std) {
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x) {
        unsigned long long h = mix64(seed * 0x9e3779b97f4a7c15ULL + i);
        float u1 = ((float)(h >> 40) + 1.f) / 16777217.f;
        float u2 = (float)((h >> 16) & 0xffffff) / 16777216.f;
        float z = sqrtf(-2.f * logf(u1)) * cospif(2.f * u2);
        w[i] = f2bf(mean + std * z);
    }
}

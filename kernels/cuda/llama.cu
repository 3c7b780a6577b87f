// Kernels of a Llama-style decoder in bf16 (the ones cuBLAS does not provide): embedding gather,
// RMSNorm, rotary embedding + KV-cache append + grouped-query attention over the cache (fused),
// SwiGLU, and greedy argmax. bf16 is handled as raw 16-bit patterns (no headers needed):
// widened to f32 for arithmetic, rounded to nearest even on the way back, as PyTorch does.
//
// Every index that comes from device memory (token ids, cache slots, positions) is checked here
// against the bounds passed by the host: an out-of-range value never reads or writes outside a
// buffer; the row it belongs to gets NaN outputs instead, which the host-side checks report.

// (bf16_t, bf2f, f2bf, round_bf, warp_sum, warp_max, NAN_BF16 come from bf16.cuh.)

// h[b][:] = table[tokens[b]][:] for b < batch; a token >= vocab gives a NaN row.
// Grid-stride over both: blockIdx.y strides over rows, blockIdx.x * blockDim.x + threadIdx.x over
// columns, all in 64 bits (any grid is correct; the launcher caps it).
extern "C" __global__ void embed_bf16(const unsigned* tokens, const bf16_t* table, bf16_t* h,
                                      unsigned long long batch, unsigned long long hidden,
                                      unsigned long long vocab) {
    for (unsigned long long b = blockIdx.y; b < batch; b += gridDim.y) {
        unsigned long long tok = tokens[b];
        for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < hidden;
             i += (unsigned long long)gridDim.x * blockDim.x) {
            h[b * hidden + i] = tok < vocab ? table[tok * hidden + i] : NAN_BF16;
        }
    }
}

// out[r][:] = bf16(w * bf16(x[r] / rms(x[r]))), as Hugging Face's LlamaRMSNorm. One block per row,
// grid-stride over rows (64-bit row index; any grid is correct, the launcher caps it), 256 threads;
// hidden is a multiple of 8 (16-byte vectors), at most 256 * 8 * 4.
#define NORM_VEC 4
extern "C" __global__ void rmsnorm_bf16(const bf16_t* x, const bf16_t* w, bf16_t* out, unsigned long long rows,
                                        unsigned hidden, float eps) {
    __shared__ float partial[32];
    for (unsigned long long r = blockIdx.x; r < rows; r += gridDim.x) { // block-uniform
        const uint4* xr = (const uint4*)(x + r * hidden);
        unsigned nvec = hidden / 8;
        uint4 v[NORM_VEC];
        float ss = 0.f;
#pragma unroll
        for (unsigned k = 0; k < NORM_VEC; ++k) {
            unsigned i = threadIdx.x + k * blockDim.x;
            v[k] = i < nvec ? xr[i] : make_uint4(0, 0, 0, 0);
            const bf16_t* e = (const bf16_t*)&v[k];
#pragma unroll
            for (int j = 0; j < 8; ++j) ss += bf2f(e[j]) * bf2f(e[j]);
        }
        ss = warp_sum(ss);
        unsigned warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
        if (lane == 0) partial[warp] = ss;
        __syncthreads();
        if (warp == 0) {
            float t = lane < warps ? partial[lane] : 0.f;
            t = warp_sum(t);
            if (lane == 0) partial[0] = t;
        }
        __syncthreads();
        float inv = rsqrtf(partial[0] / (float)hidden + eps);
        const uint4* wv = (const uint4*)w;
        uint4* o = (uint4*)(out + r * hidden);
#pragma unroll
        for (unsigned k = 0; k < NORM_VEC; ++k) {
            unsigned i = threadIdx.x + k * blockDim.x;
            if (i >= nvec) break;
            uint4 wk = wv[i], res;
            const bf16_t* e = (const bf16_t*)&v[k];
            const bf16_t* we = (const bf16_t*)&wk;
            bf16_t* re = (bf16_t*)&res;
#pragma unroll
            for (int j = 0; j < 8; ++j) re[j] = f2bf(bf2f(we[j]) * round_bf(bf2f(e[j]) * inv));
            o[i] = res;
        }
        __syncthreads(); // every thread has read partial[0] before the next row overwrites it
    }
}

// out[r][i] = bf16(bf16(silu(g)) * u) with g = gu[r][i], u = gu[r][inter + i] (gate and up
// projections computed by one GEMM over the stacked weights). Grid-stride over rows * inter, all in
// 64 bits (rows * inter does not overflow: the launcher checks it).
extern "C" __global__ void silu_mul_bf16(const bf16_t* gu, bf16_t* out, unsigned long long rows,
                                         unsigned long long inter) {
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

// The rotary pair (x1, x2) -> (x1 c - x2 s, x2 c + x1 s), each rounded to bf16, in one fixed
// sequence of roundings (intrinsics: never contracted into an FMA, whose choice of operands the
// compiler may make differently in different kernels). The decode kernel, the cached one and
// rope_append (prefill.cu) all rotate through this, so an appended key is the decode kernel's bit
// for bit. (With bf16 inputs and bf16 c, s every product is exact in f32 unless it underflows,
// so this is also what the contracted expressions gave.)
__device__ __forceinline__ void rope_pair(float x1, float x2, float c, float sn, float& o1, float& o2) {
    o1 = round_bf(__fsub_rn(__fmul_rn(x1, c), __fmul_rn(x2, sn)));
    o2 = round_bf(__fadd_rn(__fmul_rn(x2, c), __fmul_rn(x1, sn)));
}

#define MAX_GROUP 8
#define MAX_HD 128
#define ATTN_WARPS 4 // warps per block of the split attention, but for the *_w8 kernels (8)
#define ATTN_SPLITS 16

// Split-K decode attention (as flash-decoding): block (kv head, row, split z) handles one slice of
// the row's positions 0..=pos; the launcher picks the number of splits S = gridDim.z (1 to
// ATTN_SPLITS) so that batch * kv_heads * S blocks fill the GPU. Every block rotates the row's
// queries of that key/value head and its new key (position pos, which no block reads from the
// cache: the new key and value are used from shared memory), split 0 appends key and value to the
// cache at (slots[b], pos). Inside a block each warp takes tiles of 32 positions: lane i scores
// position tile + i against every query of the group (16-byte key loads), the warp updates its
// online softmax, then accumulates the tile's values (lane owns dims lane + 32 j). The warps meet
// in shared memory. With S == 1 the block writes out[b][head][:] in bf16 directly; otherwise each
// block writes its softmax partial (max, sum, weighted values) to `partial`, and the last block of
// the (row, head) to finish — counted in `counters`, which it resets — combines the partials.
//
// qkv[b] = [q (heads*hd) | k (kv_heads*hd) | v (kv_heads*hd)] (one GEMM over the stacked
// weights); caches k_cache/v_cache[slot][kv_head][pos][hd]; inv_freq[hd/2] the rotary
// frequencies; partial[batch][kv_heads][ATTN_SPLITS][group * (hd + 2)]; counters[batch][kv_heads]
// (zero between launches). Slot 0xffffffff marks an inactive row (zero output); any other slot
// >= slots or a position >= max_seq writes nothing to the cache and NaN to the row's output.
// Block: W * 32 threads (W = ATTN_WARPS, or 8 for the *_w8 kernels); grid (kv_heads, batch, S). The launcher keeps batch <= 65535
// (gridDim.y), kv_heads <= 2^31 - 1 and max_seq <= 2^31 - 1, so the 32-bit position arithmetic
// below (len + S - 1, t += W * 32) cannot wrap; buffer offsets are 64-bit.
//
// APPENDED (chunked prefill): the row's key and value are already in the cache at (slot, pos),
// written by `rope_append` in an earlier launch. The kernel then appends nothing and reads
// position pos from the cache like every other; it only rotates the queries. Rows of one slot at
// consecutive positions may then share a launch: every block only reads the caches.
//
// split_min (>= 1; the launcher's policy): a row uses only as many of the grid's splits as give
// each at least split_min positions, S_row = min(gridDim.z, ceil((pos + 1) / split_min)); the
// blocks past S_row of that row return at once (after PDL_WAIT) and take no part in its combine.
// A short row then pays no cross-block combine (S_row == 1) or a small one, while a long row
// still spreads over the whole grid. Every block of a (row, head) reads the same positions[b],
// so they agree on S_row.
template <unsigned G, unsigned HD, bool APPENDED, unsigned W>
__device__ __forceinline__ void rope_attention(const bf16_t* qkv, bf16_t* k_cache, bf16_t* v_cache,
                                               const unsigned* slots, const unsigned* positions,
                                               const float* inv_freq, bf16_t* out, float* partial,
                                               unsigned* counters, AttnShape s, unsigned split_min) {
    __shared__ __align__(16) float q_s[G][HD];
    __shared__ float kn_s[HD], vn_s[HD];
    // The new key's scores against the group's queries, and the new value as a bf16 row: what
    // the lane that meets position pos copies instead of reading the cache.
    __shared__ float knd_s[G];
    __shared__ __align__(16) bf16_t vnb_s[HD];
    // Each warp's softmax weights of its current tile, [position][head], for the value loop.
    __shared__ __align__(16) float wt_s[W][32][G];
    __shared__ float m_s[W][G];
    __shared__ float l_s[W][G];
    // Each warp's tile of values during the position loop ([W][32][HD] bf16), then (after a
    // barrier) the warps' accumulators ([W][G][HD] f32).
    constexpr unsigned VT_BYTES = W * 32 * HD * 2, ACC_BYTES = W * G * HD * 4;
    __shared__ __align__(16) unsigned char tile_s[VT_BYTES > ACC_BYTES ? VT_BYTES : ACC_BYTES];
    auto acc_s = (float (*)[G][HD])tile_s;
    __shared__ bool last_s;

    // Launched overlapped (Function::launch_overlapped): wait for the kernel ahead (it writes
    // qkv) before touching memory.
    PDL_LAUNCH();
    PDL_WAIT();
    unsigned kvh = blockIdx.x, b = blockIdx.y, z = blockIdx.z;
    if (kvh >= s.kv_heads || b >= s.batch || z >= ATTN_SPLITS) return;
    unsigned hd = s.head_dim, half = hd / 2, group = s.heads / s.kv_heads;
    size_t qkv_row = ((size_t)s.heads + 2 * (size_t)s.kv_heads) * hd;
    const bf16_t* row = qkv + (size_t)b * qkv_row;
    unsigned slot = slots[b], pos = positions[b];
    bf16_t* o = out + (size_t)b * s.heads * hd + (size_t)kvh * group * hd;
    if (slot == 0xffffffffu) { // an inactive (padding) row: zeros, no cache access
        if (z == 0)
            for (unsigned i = threadIdx.x; i < group * hd; i += blockDim.x) o[i] = 0;
        return;
    }
    if (slot >= s.slots || pos >= s.max_seq || group > G || hd > HD) { // (the launcher picks G, HD)
        if (z == 0)
            for (unsigned i = threadIdx.x; i < group * hd; i += blockDim.x) o[i] = NAN_BF16;
        return;
    }
    // This row's splits (pos < max_seq <= 2^31 - 1: no wrap; split_min 0 is taken as 1).
    unsigned splits = min(gridDim.z, pos / max(split_min, 1u) + 1);
    if (z >= splits) return; // (z == 0 < splits: the append and the output are never skipped)
    size_t head_base = ((size_t)slot * s.kv_heads + kvh) * s.max_seq * hd;
    // Rotary embedding (Hugging Face's rotate_half convention; cos/sin rounded to bf16 as there).
    for (unsigned i = threadIdx.x; i < half; i += blockDim.x) {
        float ang = (float)pos * inv_freq[i];
        float sa, ca;
        sincosf(ang, &sa, &ca);
        float c = round_bf(ca), sn = round_bf(sa);
        for (unsigned g = 0; g < group; ++g) {
            const bf16_t* q = row + (size_t)(kvh * group + g) * hd;
            float r1, r2;
            rope_pair(bf2f(q[i]), bf2f(q[i + half]), c, sn, r1, r2);
            q_s[g][i] = r1 * s.scale;
            q_s[g][i + half] = r2 * s.scale;
        }
        if (APPENDED) continue;
        const bf16_t* k = row + (size_t)s.heads * hd + (size_t)kvh * hd;
        rope_pair(bf2f(k[i]), bf2f(k[i + half]), c, sn, kn_s[i], kn_s[i + half]);
    }
    const bf16_t* v = row + ((size_t)s.heads + s.kv_heads) * hd + (size_t)kvh * hd;
    if (!APPENDED)
        for (unsigned i = threadIdx.x; i < hd; i += blockDim.x) {
            vn_s[i] = bf2f(v[i]);
            vnb_s[i] = v[i];
        }
    __syncthreads();
    if (!APPENDED && threadIdx.x < 32) { // warp 0: the new key's scores, lanes over the dims
        unsigned lane0 = threadIdx.x;
#pragma unroll
        for (unsigned g = 0; g < G; ++g) {
            if (g >= group) break;
            float d = 0.f;
            for (unsigned i = lane0; i < hd; i += 32) d += q_s[g][i] * kn_s[i];
            d = warp_sum(d);
            if (lane0 == 0) knd_s[g] = d;
        }
    }
    __syncthreads();
    if (!APPENDED && z == 0) {
        for (unsigned i = threadIdx.x; i < hd; i += blockDim.x) {
            k_cache[head_base + (size_t)pos * hd + i] = f2bf(kn_s[i]);
            v_cache[head_base + (size_t)pos * hd + i] = f2bf(vn_s[i]);
        }
    }

    unsigned len = pos + 1, chunk = (len + splits - 1) / splits;
    unsigned lo = min(len, z * chunk), hi = min(len, lo + chunk);
    unsigned warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    unsigned per_lane = hd / 32, nvec = hd / 8; // values: lane owns d = lane + 32 * j
    float m[G], l[G], acc[G][HD / 32];
#pragma unroll
    for (unsigned g = 0; g < G; ++g) {
        m[g] = -INFINITY;
        l[g] = 0.f;
#pragma unroll
        for (unsigned j = 0; j < HD / 32; ++j) acc[g][j] = 0.f;
    }
    const bf16_t* kc = k_cache + head_base;
    const bf16_t* vc = v_cache + head_base;
    bf16_t(*vt)[HD] = (bf16_t(*)[HD])tile_s + warp * 32; // this warp's [32][HD]
    for (unsigned t = lo + warp * 32; t < hi; t += W * 32) {
        // Lane i takes position t + i (every tile has at least lane 0's position): its key and
        // value rows in one round of 16-byte loads; the values go to the warp's tile.
        unsigned p = t + lane;
        bool valid = p < hi;
        float dots[G];
#pragma unroll
        for (unsigned g = 0; g < G; ++g) dots[g] = 0.f;
        if (valid && (APPENDED || p != pos)) {
            const uint4* kp = (const uint4*)(kc + (size_t)p * hd);
            const uint4* vp = (const uint4*)(vc + (size_t)p * hd);
            uint4 kv4[HD / 8];
#pragma unroll
            for (unsigned c = 0; c < HD / 8; ++c) {
                if (c < nvec) {
                    kv4[c] = kp[c];
                    // The value row straight into the tile (no registers held).
                    unsigned dst = (unsigned)__cvta_generic_to_shared((uint4*)vt[lane] + c);
                    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(vp + c) : "memory");
                }
            }
#pragma unroll
            for (unsigned c = 0; c < HD / 8; ++c) {
                if (c >= nvec) break;
                const bf16_t* e = (const bf16_t*)&kv4[c];
#pragma unroll
                for (unsigned g = 0; g < G; ++g) {
                    if (g >= group) break;
                    float4 qa = *(const float4*)&q_s[g][8 * c], qb = *(const float4*)&q_s[g][8 * c + 4];
                    dots[g] += qa.x * bf2f(e[0]) + qa.y * bf2f(e[1]) + qa.z * bf2f(e[2]) + qa.w * bf2f(e[3]) +
                               qb.x * bf2f(e[4]) + qb.y * bf2f(e[5]) + qb.z * bf2f(e[6]) + qb.w * bf2f(e[7]);
                }
            }
        } else if (valid) { // the new key and value, from shared memory
#pragma unroll
            for (unsigned c = 0; c < HD / 8; ++c)
                if (c < nvec) ((uint4*)vt[lane])[c] = ((const uint4*)vnb_s)[c];
#pragma unroll
            for (unsigned g = 0; g < G; ++g)
                if (g < group) dots[g] = knd_s[g];
        } else { // past the slice: a zero row, weighted 0 below
#pragma unroll
            for (unsigned c = 0; c < HD / 8; ++c)
                if (c < nvec) ((uint4*)vt[lane])[c] = make_uint4(0, 0, 0, 0);
        }
        asm volatile("cp.async.wait_all;" ::: "memory");
        __syncwarp();
        // Online softmax over the tile, per query head.
        float w[G];
#pragma unroll
        for (unsigned g = 0; g < G; ++g) {
            if (g >= group) break;
            float sc = valid ? dots[g] : -INFINITY;
            float m_new = fmaxf(m[g], warp_max(sc));
            float corr = __expf(m[g] - m_new);
            w[g] = valid ? __expf(sc - m_new) : 0.f;
            l[g] = l[g] * corr + warp_sum(w[g]);
#pragma unroll
            for (unsigned j = 0; j < HD / 32; ++j) acc[g][j] *= corr;
            m[g] = m_new;
        }
        // Values: every lane walks the tile's 32 positions in shared memory, owning its dims;
        // the weights come from shared memory too (positions past the slice: weight 0, zero
        // row), so the loop has a fixed trip count and unrolls.
#pragma unroll
        for (unsigned g = 0; g < G; ++g) wt_s[warp][lane][g] = g < group ? w[g] : 0.f;
        __syncwarp();
#pragma unroll 8
        for (unsigned i = 0; i < 32; ++i) {
            float vv[HD / 32];
#pragma unroll
            for (unsigned j = 0; j < HD / 32; ++j) vv[j] = j < per_lane ? bf2f(vt[i][lane + 32 * j]) : 0.f;
#pragma unroll
            for (unsigned g = 0; g < G; ++g) {
                if (g >= group) break;
                float wi = wt_s[warp][i][g];
#pragma unroll
                for (unsigned j = 0; j < HD / 32; ++j) acc[g][j] += wi * vv[j];
            }
        }
        __syncwarp(); // the tile and its weights are read before the next ones overwrite them
    }
    __syncthreads(); // every warp is done with its value tile: the space becomes acc_s
#pragma unroll
    for (unsigned g = 0; g < G; ++g) { // constant indices: the arrays stay in registers
        if (g >= group) break;
        if (lane == 0) {
            m_s[warp][g] = m[g];
            l_s[warp][g] = l[g];
        }
#pragma unroll
        for (unsigned j = 0; j < HD / 32; ++j)
            if (j < per_lane) acc_s[warp][g][lane + 32 * j] = acc[g][j];
    }
    __syncthreads();
    // This block's softmax over its slice: per query head, the max, the sum and the weighted values.
    unsigned stride = group * (hd + 2);
    float* part = partial + (((size_t)b * s.kv_heads + kvh) * ATTN_SPLITS) * stride;
    for (unsigned idx = threadIdx.x; idx < group * hd; idx += blockDim.x) {
        unsigned g = idx / hd, d = idx % hd;
        float mx = -INFINITY;
        for (unsigned w = 0; w < W; ++w) mx = fmaxf(mx, m_s[w][g]);
        float num = 0.f, den = 0.f;
        for (unsigned w = 0; w < W; ++w) {
            if (m_s[w][g] == -INFINITY) continue; // this warp saw no position
            float f = __expf(m_s[w][g] - mx);
            num += f * acc_s[w][g][d];
            den += f * l_s[w][g];
        }
        if (splits == 1) { // the whole row: the output
            o[(size_t)g * hd + d] = f2bf(num / den);
            continue;
        }
        float* pz = part + (size_t)z * stride + g * (hd + 2);
        pz[d] = num;
        if (d == 0) {
            pz[hd] = mx;
            pz[hd + 1] = den;
        }
    }
    if (splits == 1) return;
    // The last block of this (row, head) to finish combines the partials.
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned* cnt = counters + (size_t)b * s.kv_heads + kvh;
        last_s = atomicAdd(cnt, 1u) == splits - 1;
        if (last_s) *cnt = 0; // every block of this launch has counted: ready for the next
    }
    __syncthreads();
    if (!last_s) return;
    __threadfence();
    for (unsigned idx = threadIdx.x; idx < group * hd; idx += blockDim.x) {
        unsigned g = idx / hd, d = idx % hd;
        float mz[ATTN_SPLITS];
        float mx = -INFINITY;
#pragma unroll
        for (unsigned zz = 0; zz < ATTN_SPLITS; ++zz) {
            mz[zz] = zz < splits ? __ldcg(part + (size_t)zz * stride + g * (hd + 2) + hd) : -INFINITY;
            mx = fmaxf(mx, mz[zz]);
        }
        float num = 0.f, den = 0.f;
#pragma unroll
        for (unsigned zz = 0; zz < ATTN_SPLITS; ++zz) {
            if (mz[zz] == -INFINITY) continue; // an empty slice (or past the splits)
            const float* pz = part + (size_t)zz * stride + g * (hd + 2);
            float f = __expf(mz[zz] - mx);
            num += f * __ldcg(pz + d);
            den += f * __ldcg(pz + hd + 1);
        }
        o[(size_t)g * hd + d] = f2bf(num / den);
    }
}

// The instantiations: any shape within the limits, and the Llama 3.2 one (group <= 4, head_dim
// <= 64) with half the registers.
#define ROPE_ATTENTION_KERNEL(NAME, G, HD, APPENDED, W)                                                  \
    extern "C" __global__ void __launch_bounds__(W * 32)                                                \
        NAME(const bf16_t* qkv, bf16_t* k_cache, bf16_t* v_cache, const unsigned* slots,                 \
             const unsigned* positions, const float* inv_freq, bf16_t* out, float* partial,             \
             unsigned* counters, AttnShape s, unsigned split_min) {                                      \
        rope_attention<G, HD, APPENDED, W>(qkv, k_cache, v_cache, slots, positions, inv_freq, out,       \
                                           partial, counters, s, split_min);                             \
    }
ROPE_ATTENTION_KERNEL(rope_attention_bf16, MAX_GROUP, MAX_HD, false, ATTN_WARPS)
ROPE_ATTENTION_KERNEL(rope_attention_g4_hd64_bf16, 4, 64, false, ATTN_WARPS)
// Eight warps a block: one round of 256 positions, so a context of up to 256 positions needs no
// split and no cross-block combine.
ROPE_ATTENTION_KERNEL(rope_attention_g4_hd64_w8_bf16, 4, 64, false, 8)
// The cached variants (chunked prefill): the keys and values already appended by rope_append.
ROPE_ATTENTION_KERNEL(attention_cached_bf16, MAX_GROUP, MAX_HD, true, ATTN_WARPS)
ROPE_ATTENTION_KERNEL(attention_cached_g4_hd64_bf16, 4, 64, true, ATTN_WARPS)

// Greedy argmax in two launches. A (logit, index) pair is packed into 64 bits so that the larger
// logit wins and, between equal logits, the smaller index: (orderable float bits << 32) |
// (0xffffffff - index). -0.0 packs as +0.0 (they are equal logits, so the smaller index wins
// between them too). NaN logits never win; an all-NaN row packs to 0 and decodes to 0xffffffff.
__device__ __forceinline__ unsigned long long pack_arg(float v, unsigned i) {
    if (v != v) return 0ull;
    unsigned b = v == 0.f ? 0u : __float_as_uint(v);
    b = (b & 0x80000000u) ? ~b : (b | 0x80000000u);
    return ((unsigned long long)b << 32) | (0xffffffffu - i);
}

__device__ __forceinline__ unsigned long long warp_max_u64(unsigned long long v) {
    for (int o = 16; o > 0; o >>= 1) {
        unsigned long long u = __shfl_xor_sync(0xffffffffu, v, o);
        v = u > v ? u : v;
    }
    return v;
}

// Block-wide max of packed pairs (blockDim a multiple of 32, at most 1024).
__device__ unsigned long long block_max_u64(unsigned long long v) {
    __shared__ unsigned long long part[32];
    unsigned warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
    v = warp_max_u64(v);
    if (lane == 0) part[warp] = v;
    __syncthreads();
    v = lane < warps ? part[lane] : 0ull;
    return warp_max_u64(v);
}

// Stage 1: block (x, r) reduces its share of row r into partial[r][x] (grid (ARGMAX_SPLIT, rows)).
// The launcher keeps rows <= 65535 (gridDim.y) and vocab <= 2^31 - 1, so vocab + ARGMAX_SPLIT - 1,
// lo + per and i + blockDim.x cannot wrap, and no index is 0xffffffff (the all-NaN answer).
#define ARGMAX_SPLIT 64
extern "C" __global__ void argmax_partial_f32(const float* logits, unsigned long long* partial, unsigned rows, unsigned vocab) {
    unsigned r = blockIdx.y;
    if (r >= rows) return;
    unsigned per = (vocab + ARGMAX_SPLIT - 1) / ARGMAX_SPLIT;
    unsigned lo = blockIdx.x * per, hi = min(vocab, lo + per);
    const float* x = logits + (size_t)r * vocab;
    unsigned long long best = 0ull;
    for (unsigned i = lo + threadIdx.x; i < hi; i += blockDim.x) {
        unsigned long long k = pack_arg(x[i], i);
        best = k > best ? k : best;
    }
    best = block_max_u64(best);
    if (threadIdx.x == 0) partial[(size_t)r * ARGMAX_SPLIT + blockIdx.x] = best;
}

// Stage 2: out[r] = the index of row r's largest logit (first on ties; 0xffffffff for a NaN row).
// One block of ARGMAX_SPLIT threads per row.
extern "C" __global__ void argmax_final(const unsigned long long* partial, unsigned* out, unsigned rows) {
    unsigned r = blockIdx.x;
    if (r >= rows) return;
    unsigned long long v = threadIdx.x < ARGMAX_SPLIT ? partial[(size_t)r * ARGMAX_SPLIT + threadIdx.x] : 0ull;
    v = block_max_u64(v);
    if (threadIdx.x == 0) out[r] = 0xffffffffu - (unsigned)(v & 0xffffffffull);
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

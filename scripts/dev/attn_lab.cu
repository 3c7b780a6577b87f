// attn_lab: the decode attention alone (rotary + cache append + grouped-query attention, the
// Llama-3.2-1B shape: 32 query heads, 8 key/value heads, head_dim 64), the production kernels of
// kernels/cuda/llama.cu against a variant that spreads a row's positions over more, smaller blocks
// (issue 18: at batch 1 the production launch is 8 blocks whose warps each run a long dependent
// chain, about 14 us a layer under ncu). A development tool: nothing in the library or its tests
// uses it.
//
//   nvcc -O3 -std=c++17 -arch=sm_90 -I kernels/cuda scripts/dev/attn_lab.cu -o /tmp/attn_lab
//   /tmp/attn_lab
//
// For each batch (1, 16, 64) and position (the row's new token at 160, 320, 1000): random bf16
// q/k/v rows and caches (4 layers' worth, the launches taking them in turn), an L2 flush (a 256
// MiB memset) before every timed launch, the launch bracketed by two events. Prints the median
// microseconds per launch over 4 layers x 40 repeats, and checks every variant's
// output (poisoned with NaN before each variant) against an f64 host reference of the same
// arithmetic (rotary rounded as the kernels round it), and its cache append bit for bit against
// the production kernel's.
//
// The variant (`attn_fine`): grid (kv_heads, batch, Z), 4 warps a block, warp g the group's query
// head g; a row uses S = min(Z, ceil((pos + 1) / P)) blocks, each a slice of the positions;
// within a block lane i takes position i of each 32-position tile (its key row from global
// memory), the warp's online softmax over the tile, then the tile's values with the lane owning
// two dimensions (coalesced 128-byte rows, weights broadcast by shuffle). The block that owns pos
// rotates the new key, uses it and the new value from registers/shared memory and appends both to
// the cache. With S > 1 each block writes (max, sum, weighted values) per query head and the last
// block to finish combines them, as the production kernel does.
#include <cuda_runtime.h>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
#undef INFINITY
#include "bf16.cuh"
#include "llama.cu"

#define CK(x)                                                                                   \
    do {                                                                                        \
        cudaError_t e_ = (x);                                                                   \
        if (e_ != cudaSuccess) {                                                                \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
            exit(1);                                                                            \
        }                                                                                       \
    } while (0)

#define FINE_SPLITS 64 // partial slots per (row, kv head) of the variant

// G = 4 query heads per kv head, head_dim 64 (lane owns dims 2 lane, 2 lane + 1 in the value
// phase). P positions per block slice at least (a multiple of 32).
template <unsigned P>
__global__ void __launch_bounds__(128) attn_fine(const bf16_t* qkv, bf16_t* k_cache, bf16_t* v_cache,
                                                 const unsigned* slots, const unsigned* positions,
                                                 const float* inv_freq, bf16_t* out, float* partial,
                                                 unsigned* counters, AttnShape s) {
    constexpr unsigned G = 4, HD = 64;
    __shared__ __align__(16) float q_s[G][HD];
    __shared__ __align__(16) float kn_s[HD];
    __shared__ bool last_s;
    PDL_LAUNCH();
    PDL_WAIT();
    unsigned kvh = blockIdx.x, b = blockIdx.y, z = blockIdx.z;
    unsigned warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (kvh >= s.kv_heads || b >= s.batch || s.heads / s.kv_heads != G || s.head_dim != HD) return;
    size_t qkv_row = ((size_t)s.heads + 2 * (size_t)s.kv_heads) * HD;
    const bf16_t* row = qkv + (size_t)b * qkv_row;
    unsigned slot = slots[b], pos = positions[b];
    bf16_t* o = out + (size_t)b * s.heads * HD + (size_t)kvh * G * HD;
    if (slot == 0xffffffffu) {
        if (z == 0) o[threadIdx.x] = 0, o[threadIdx.x + 128] = 0;
        return;
    }
    if (slot >= s.slots || pos >= s.max_seq) {
        if (z == 0) o[threadIdx.x] = NAN_BF16, o[threadIdx.x + 128] = NAN_BF16;
        return;
    }
    unsigned len = pos + 1;
    unsigned splits = min(gridDim.z, (len + P - 1) / P);
    if (z >= splits) return;
    unsigned chunk = (len + splits - 1) / splits;
    chunk = (chunk + 31) / 32 * 32; // whole tiles per block but the last
    unsigned lo = min(len, z * chunk), hi = min(len, lo + chunk);
    bool owns_new = lo <= pos && pos < hi;
    size_t head_base = ((size_t)slot * s.kv_heads + kvh) * s.max_seq * HD;
    const bf16_t* kc = k_cache + head_base;
    const bf16_t* vc = v_cache + head_base;
    // Rotary: warp g rotates query head g (lane: the pair lane, lane + 32); the owner's warp 0
    // rotates the new key too.
    {
        float ang = (float)pos * inv_freq[lane];
        float sa, ca;
        sincosf(ang, &sa, &ca);
        float c = round_bf(ca), sn = round_bf(sa);
        const bf16_t* q = row + (size_t)(kvh * G + warp) * HD;
        float r1, r2;
        rope_pair(bf2f(q[lane]), bf2f(q[lane + 32]), c, sn, r1, r2);
        q_s[warp][lane] = r1 * s.scale;
        q_s[warp][lane + 32] = r2 * s.scale;
        if (owns_new && warp == 0) {
            const bf16_t* k = row + (size_t)s.heads * HD + (size_t)kvh * HD;
            rope_pair(bf2f(k[lane]), bf2f(k[lane + 32]), c, sn, kn_s[lane], kn_s[lane + 32]);
        }
    }
    const bf16_t* vnew = row + ((size_t)s.heads + s.kv_heads) * HD + (size_t)kvh * HD;
    __syncthreads();
    if (owns_new && warp == 1) { // the append: rotated key, value as given
        k_cache[head_base + (size_t)pos * HD + lane] = f2bf(kn_s[lane]);
        k_cache[head_base + (size_t)pos * HD + lane + 32] = f2bf(kn_s[lane + 32]);
        ((unsigned*)(v_cache + head_base + (size_t)pos * HD))[lane] = ((const unsigned*)vnew)[lane];
    }
    float knd = 0.f; // the new key's score against this warp's query (as the production kernel)
    if (owns_new) {
        knd = q_s[warp][lane] * kn_s[lane];
        knd += q_s[warp][lane + 32] * kn_s[lane + 32];
        knd = warp_sum(knd);
    }
    float m = -INFINITY, l = 0.f, acc0 = 0.f, acc1 = 0.f;
    for (unsigned t = lo; t < hi; t += 32) {
        unsigned p = t + lane;
        bool valid = p < hi;
        // The tile's value rows, lane's two dims each: 32 coalesced loads issued before the keys'
        // arithmetic (positions past the slice read row lo, weight 0).
        unsigned vv[32];
#pragma unroll
        for (unsigned i = 0; i < 32; ++i) {
            unsigned pi = t + i < hi ? t + i : lo;
            vv[i] = pi == pos ? ((const unsigned*)vnew)[lane] : __ldg((const unsigned*)(vc + (size_t)pi * HD) + lane);
        }
        float sc = -INFINITY;
        if (valid && p != pos) {
            const uint4* kp = (const uint4*)(kc + (size_t)p * HD);
            uint4 kv4[8];
#pragma unroll
            for (unsigned c = 0; c < 8; ++c) kv4[c] = __ldg(kp + c);
            float d = 0.f;
#pragma unroll
            for (unsigned c = 0; c < 8; ++c) {
                const bf16_t* e = (const bf16_t*)&kv4[c];
                float4 qa = *(const float4*)&q_s[warp][8 * c], qb = *(const float4*)&q_s[warp][8 * c + 4];
                d += qa.x * bf2f(e[0]) + qa.y * bf2f(e[1]) + qa.z * bf2f(e[2]) + qa.w * bf2f(e[3]) + qb.x * bf2f(e[4]) +
                     qb.y * bf2f(e[5]) + qb.z * bf2f(e[6]) + qb.w * bf2f(e[7]);
            }
            sc = d;
        } else if (valid) {
            sc = knd;
        }
        float m_new = fmaxf(m, warp_max(sc));
        float corr = __expf(m - m_new);
        float w = valid ? __expf(sc - m_new) : 0.f;
        l = l * corr + warp_sum(w);
        acc0 *= corr;
        acc1 *= corr;
        m = m_new;
#pragma unroll
        for (unsigned i = 0; i < 32; ++i) {
            float wi = __shfl_sync(0xffffffffu, w, i);
            acc0 += wi * bf2f((bf16_t)(vv[i] & 0xffffu));
            acc1 += wi * bf2f((bf16_t)(vv[i] >> 16));
        }
    }
    unsigned og = warp * HD + 2 * lane;
    if (splits == 1) {
        o[og] = f2bf(acc0 / l);
        o[og + 1] = f2bf(acc1 / l);
        return;
    }
    unsigned stride = G * (HD + 2);
    float* part = partial + ((size_t)b * s.kv_heads + kvh) * FINE_SPLITS * stride;
    float* pz = part + (size_t)z * stride + warp * (HD + 2);
    pz[2 * lane] = acc0;
    pz[2 * lane + 1] = acc1;
    if (lane == 0) pz[HD] = m, pz[HD + 1] = l;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned* cnt = counters + (size_t)b * s.kv_heads + kvh;
        last_s = atomicAdd(cnt, 1u) == splits - 1;
        if (last_s) *cnt = 0;
    }
    __syncthreads();
    if (!last_s) return;
    __threadfence();
    float mx = -INFINITY;
    for (unsigned zz = 0; zz < splits; ++zz) mx = fmaxf(mx, __ldcg(part + (size_t)zz * stride + warp * (HD + 2) + HD));
    float num0 = 0.f, num1 = 0.f, den = 0.f;
    for (unsigned zz = 0; zz < splits; ++zz) {
        const float* q = part + (size_t)zz * stride + warp * (HD + 2);
        float mz = __ldcg(q + HD);
        if (mz == -INFINITY) continue;
        float f = __expf(mz - mx);
        float2 a = __ldcg((const float2*)(q + 2 * lane));
        num0 += f * a.x;
        num1 += f * a.y;
        den += f * __ldcg(q + HD + 1);
    }
    o[og] = f2bf(num0 / den);
    o[og + 1] = f2bf(num1 / den);
}

static float bf(unsigned short v) {
    unsigned u = (unsigned)v << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static unsigned short tobf(float f) {
    unsigned u;
    memcpy(&u, &f, 4);
    if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x7fffffu)) return (unsigned short)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (unsigned short)(u >> 16);
}
static float rbf(float f) { return bf(tobf(f)); }

// Uniform in [-2, 2), rounded to bf16 (a fast generator: the 64-row caches hold 2^28 values).
struct Rng {
    unsigned long long x;
    unsigned short next() {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        return tobf((float)((x >> 40) & 0xffffff) / (float)(1 << 24) * 4.f - 2.f);
    }
};

int main() {
    const unsigned L = 4, heads = 32, kvh = 8, hd = 64, max_seq = 1024, reps = 40;
    int sms = 0;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("attn_lab on %s (%d SMs), %u layers per repeat, %u repeats, L2 flushed before each launch\n", prop.name,
           sms, L, reps);
    size_t flush_n = 256u << 20;
    void* flush;
    CK(cudaMalloc(&flush, flush_n));
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    Rng rng{20261128ull};
    int failures = 0;
    for (unsigned batch : {1u, 16u, 64u}) {
        for (unsigned pos : {160u, 320u, 1000u}) {
            AttnShape s{batch, heads, kvh, hd, batch, max_seq, 1.f / sqrtf((float)hd)};
            size_t qkv_n = (size_t)batch * (heads + 2 * kvh) * hd;
            size_t cache_n = (size_t)batch * kvh * max_seq * hd; // one layer
            size_t out_n = (size_t)batch * heads * hd;
            std::vector<unsigned short> qkv(qkv_n * L), kc(cache_n * L), vc(cache_n * L);
            for (auto& v : qkv) v = rng.next();
            for (auto& v : kc) v = rng.next();
            for (auto& v : vc) v = rng.next();
            std::vector<float> inv_freq(hd / 2);
            for (unsigned i = 0; i < hd / 2; ++i) inv_freq[i] = (float)(1.0 / pow(500000.0, 2.0 * i / hd));
            std::vector<unsigned> slots(batch), positions(batch, pos);
            for (unsigned b = 0; b < batch; ++b) slots[b] = b;
            unsigned short *d_qkv, *d_kc, *d_vc, *d_out;
            float *d_if, *d_part;
            unsigned *d_slots, *d_pos, *d_cnt;
            size_t part_n = (size_t)batch * kvh * FINE_SPLITS * 4 * (hd + 2);
            CK(cudaMalloc(&d_qkv, qkv.size() * 2));
            CK(cudaMalloc(&d_kc, kc.size() * 2));
            CK(cudaMalloc(&d_vc, vc.size() * 2));
            CK(cudaMalloc(&d_out, out_n * L * 2));
            CK(cudaMalloc(&d_if, hd / 2 * 4));
            CK(cudaMalloc(&d_part, part_n * 4));
            CK(cudaMalloc(&d_slots, batch * 4));
            CK(cudaMalloc(&d_pos, batch * 4));
            CK(cudaMalloc(&d_cnt, batch * kvh * 4));
            CK(cudaMemcpy(d_qkv, qkv.data(), qkv.size() * 2, cudaMemcpyHostToDevice));
            CK(cudaMemcpy(d_if, inv_freq.data(), hd / 2 * 4, cudaMemcpyHostToDevice));
            CK(cudaMemcpy(d_slots, slots.data(), batch * 4, cudaMemcpyHostToDevice));
            CK(cudaMemcpy(d_pos, positions.data(), batch * 4, cudaMemcpyHostToDevice));
            CK(cudaMemset(d_cnt, 0, batch * kvh * 4));
            // The f64 reference of layer 0, every row: rotary as the kernels round it.
            std::vector<double> ref(out_n);
            std::vector<unsigned short> kpos(batch * kvh * hd), vpos(batch * kvh * hd);
            for (unsigned b = 0; b < batch; ++b) {
                const unsigned short* r = &qkv[(size_t)b * (heads + 2 * kvh) * hd];
                float c[32], sn[32];
                for (unsigned i = 0; i < hd / 2; ++i) {
                    float ang = (float)pos * inv_freq[i];
                    c[i] = rbf(cosf(ang));
                    sn[i] = rbf(sinf(ang));
                }
                auto rope = [&](const unsigned short* x, float* outv) {
                    for (unsigned i = 0; i < hd / 2; ++i) {
                        float x1 = bf(x[i]), x2 = bf(x[i + hd / 2]);
                        outv[i] = rbf(x1 * c[i] - x2 * sn[i]);
                        outv[i + hd / 2] = rbf(x2 * c[i] + x1 * sn[i]);
                    }
                };
                for (unsigned h = 0; h < kvh; ++h) {
                    float kn[64];
                    rope(r + (size_t)heads * hd + h * hd, kn);
                    const unsigned short* vn = r + (size_t)(heads + kvh) * hd + h * hd;
                    for (unsigned d = 0; d < hd; ++d) {
                        kpos[(b * kvh + h) * hd + d] = tobf(kn[d]);
                        vpos[(b * kvh + h) * hd + d] = vn[d];
                    }
                    const unsigned short* kb = &kc[((size_t)b * kvh + h) * max_seq * hd];
                    const unsigned short* vb = &vc[((size_t)b * kvh + h) * max_seq * hd];
                    for (unsigned g = 0; g < 4; ++g) {
                        float q[64];
                        rope(r + (size_t)(h * 4 + g) * hd, q);
                        std::vector<double> sc(pos + 1);
                        double mx = -1e300;
                        for (unsigned p = 0; p <= pos; ++p) {
                            double d = 0;
                            for (unsigned i = 0; i < hd; ++i)
                                d += (double)(q[i] * s.scale) * (p == pos ? kn[i] : bf(kb[(size_t)p * hd + i]));
                            sc[p] = d;
                            mx = std::max(mx, d);
                        }
                        double den = 0;
                        for (auto& v : sc) den += (v = exp(v - mx));
                        for (unsigned d = 0; d < hd; ++d) {
                            double num = 0;
                            for (unsigned p = 0; p <= pos; ++p)
                                num += sc[p] * (p == pos ? bf(vn[d]) : bf(vb[(size_t)p * hd + d]));
                            ref[((size_t)b * heads + h * 4 + g) * hd + d] = num / den;
                        }
                    }
                }
            }
            struct Variant {
                const char* name;
                int kind; // 0: production w8, 1: production w4, 2: fine P=32, 3: fine P=64
                unsigned z;
            };
            unsigned prod_splits = std::min(16u, (unsigned)((2 * sms + batch * kvh - 1) / (batch * kvh)));
            std::vector<Variant> vars = {{"production w8 (split_min 256)", 0, prod_splits},
                                         {"production w4 (split_min 128)", 1, prod_splits},
                                         {"fine P=32 Z=16", 2, 16},
                                         {"fine P=32 Z=32", 2, 32},
                                         {"fine P=64 Z=16", 3, 16},
                                         {"fine P=32 Z=8", 2, 8}};
            std::vector<unsigned short> prod_k, prod_v;
            printf("batch %2u, position %4u:\n", batch, pos);
            for (auto& v : vars) {
                // Fresh caches (the appends of the previous variant undone), poisoned outputs.
                CK(cudaMemcpy(d_kc, kc.data(), kc.size() * 2, cudaMemcpyHostToDevice));
                CK(cudaMemcpy(d_vc, vc.data(), vc.size() * 2, cudaMemcpyHostToDevice));
                CK(cudaMemset(d_out, 0xff, out_n * L * 2));
                std::vector<float> us;
                for (unsigned r = 0; r < reps + 1; ++r) {
                    for (unsigned l = 0; l < L; ++l) {
                        CK(cudaMemsetAsync(flush, r & 0xff, flush_n, st));
                        const unsigned short* q = d_qkv + qkv_n * l;
                        unsigned short *k = d_kc + cache_n * l, *vv = d_vc + cache_n * l, *o = d_out + out_n * l;
                        CK(cudaEventRecord(e0, st));
                        if (v.kind == 0)
                            rope_attention_g4_hd64_w8_bf16<<<dim3(kvh, batch, v.z), 256, 0, st>>>(
                                q, k, vv, d_slots, d_pos, d_if, o, d_part, d_cnt, s, 256);
                        else if (v.kind == 1)
                            rope_attention_g4_hd64_bf16<<<dim3(kvh, batch, v.z), 128, 0, st>>>(
                                q, k, vv, d_slots, d_pos, d_if, o, d_part, d_cnt, s, 128);
                        else if (v.kind == 2)
                            attn_fine<32><<<dim3(kvh, batch, v.z), 128, 0, st>>>(q, k, vv, d_slots, d_pos, d_if, o,
                                                                                 d_part, d_cnt, s);
                        else
                            attn_fine<64><<<dim3(kvh, batch, v.z), 128, 0, st>>>(q, k, vv, d_slots, d_pos, d_if, o,
                                                                                 d_part, d_cnt, s);
                        CK(cudaGetLastError());
                        CK(cudaEventRecord(e1, st));
                        CK(cudaEventSynchronize(e1));
                        float ms;
                        CK(cudaEventElapsedTime(&ms, e0, e1));
                        if (r > 0) us.push_back(ms * 1e3f);
                    }
                }
                std::sort(us.begin(), us.end());
                // Layer 0's output against the reference; its appended rows against production's.
                std::vector<unsigned short> outv(out_n), kgot(cache_n), vgot(cache_n);
                CK(cudaMemcpy(outv.data(), d_out, out_n * 2, cudaMemcpyDeviceToHost));
                CK(cudaMemcpy(kgot.data(), d_kc, cache_n * 2, cudaMemcpyDeviceToHost));
                CK(cudaMemcpy(vgot.data(), d_vc, cache_n * 2, cudaMemcpyDeviceToHost));
                double worst = 0;
                bool nan = false;
                for (size_t i = 0; i < out_n; ++i) {
                    float g = bf(outv[i]);
                    if (!(g == g)) nan = true;
                    double tol = 1e-2 + 1e-2 * fabs(ref[i]);
                    worst = std::max(worst, fabs(g - ref[i]) / tol);
                }
                // The appended rows: the production kernel's are the reference (bit for bit); the
                // host's rotary (libm's sinf/cosf) may differ from sincosf by one bf16 step.
                std::vector<unsigned short> krow, vrow;
                for (unsigned b = 0; b < batch; ++b)
                    for (unsigned h = 0; h < kvh; ++h)
                        for (unsigned d = 0; d < hd; ++d) {
                            size_t at = (((size_t)b * kvh + h) * max_seq + pos) * hd + d;
                            krow.push_back(kgot[at]);
                            vrow.push_back(vgot[at]);
                        }
                if (prod_k.empty()) {
                    prod_k = krow, prod_v = vrow;
                    size_t host_diff = 0;
                    for (size_t i = 0; i < krow.size(); ++i) host_diff += krow[i] != kpos[i] || vrow[i] != vpos[i];
                    printf("  (production append vs the host's rotary: %zu of %zu elements differ)\n", host_diff, krow.size());
                }
                bool append_ok = krow == prod_k && vrow == prod_v;
                bool ok = !nan && worst <= 1.0 && append_ok;
                failures += !ok;
                printf("  %-32s grid z %2u: median %7.2f us (min %7.2f, p90 %7.2f); worst error %.3f of tolerance%s%s\n",
                       v.name, v.z, us[us.size() / 2], us[0], us[us.size() * 9 / 10], worst, nan ? ", NaN" : "",
                       append_ok ? "" : ", APPEND DIFFERS");
            }
            cudaFree(d_qkv), cudaFree(d_kc), cudaFree(d_vc), cudaFree(d_out), cudaFree(d_if), cudaFree(d_part);
            cudaFree(d_slots), cudaFree(d_pos), cudaFree(d_cnt);
        }
    }
    printf("%s\n", failures ? "attn_lab: FAILURES" : "attn_lab: every variant within tolerance");
    return failures ? 1 : 0;
}

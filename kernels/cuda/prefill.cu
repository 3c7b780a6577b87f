// Kernels of the chunked prefill (compiled after bf16.cuh and llama.cu, in the same module):
// the rotary key + KV-cache append of every row of a chunk, ahead of the cached attention
// (attention_tiled_g4_hd64_bf16 below where the shape fits, rope_attention<G, HD, true>
// otherwise), and the gather of the rows whose logits are wanted.

// For every row r < rows with slot = slots[r] and pos = positions[r]: rotate the row's new key by
// pos exactly as rope_attention does (cos/sin rounded to bf16, then rope_pair) and
// write key and value to k_cache/v_cache[slot][kv_head][pos][:]. qkv[r] = [q | k | v] as for the
// attention. Slot 0xffffffff (an inactive row), any other slot >= slots and pos >= max_seq write
// nothing. Block (kv head, row): blockIdx.x strides over key/value heads, blockIdx.y over rows
// (64-bit row index; any grid is correct, the launcher caps it), the threads over the head's
// dimensions. Offsets are 64-bit.
extern "C" __global__ void rope_append_bf16(const bf16_t* qkv, bf16_t* k_cache, bf16_t* v_cache,
                                            const unsigned* slots, const unsigned* positions,
                                            const float* inv_freq, unsigned long long rows, AttnShape s) {
    unsigned hd = s.head_dim, half = hd / 2;
    size_t qkv_row = ((size_t)s.heads + 2 * (size_t)s.kv_heads) * hd;
    for (unsigned long long r = blockIdx.y; r < rows; r += gridDim.y) {
        unsigned slot = slots[r], pos = positions[r];
        if (slot >= s.slots || pos >= s.max_seq) continue; // inactive (0xffffffff) or out of range
        const bf16_t* row = qkv + (size_t)r * qkv_row;
        for (unsigned long long kvh = blockIdx.x; kvh < s.kv_heads; kvh += gridDim.x) {
            size_t at = (((size_t)slot * s.kv_heads + kvh) * s.max_seq + pos) * hd;
            const bf16_t* k = row + (size_t)s.heads * hd + kvh * hd;
            const bf16_t* v = row + ((size_t)s.heads + s.kv_heads) * hd + kvh * hd;
            for (unsigned i = threadIdx.x; i < half; i += blockDim.x) {
                float ang = (float)pos * inv_freq[i];
                float c = round_bf(cosf(ang)), sn = round_bf(sinf(ang));
                float r1, r2;
                rope_pair(bf2f(k[i]), bf2f(k[i + half]), c, sn, r1, r2); // as rope_attention's
                k_cache[at + i] = f2bf(r1);
                k_cache[at + i + half] = f2bf(r2);
            }
            for (unsigned i = threadIdx.x; i < hd; i += blockDim.x) v_cache[at + i] = v[i];
        }
    }
}

// out[i][:] = h[idx[i]][:] for i < n (rows of `cols` bf16 values); idx 0xffffffff gives a zero row,
// any other idx >= rows a NaN row. Grid-stride as embed_bf16: blockIdx.y over output rows,
// blockIdx.x * blockDim.x + threadIdx.x over columns, all in 64 bits.
extern "C" __global__ void gather_rows_bf16(const bf16_t* h, const unsigned* idx, bf16_t* out,
                                            unsigned long long n, unsigned long long rows,
                                            unsigned long long cols) {
    for (unsigned long long i = blockIdx.y; i < n; i += gridDim.y) {
        unsigned long long src = idx[i];
        bool inactive = src == 0xffffffffull;
        for (unsigned long long c = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; c < cols;
             c += (unsigned long long)gridDim.x * blockDim.x) {
            out[i * cols + c] = src < rows ? h[src * cols + c] : (inactive ? (bf16_t)0 : NAN_BF16);
        }
    }
}

// The cached attention of a chunk, tiled (prefill): the keys and values of every row are already
// in the cache (rope_append), as for rope_attention<G, HD, true>, which computes the same thing one
// (row, key/value head) per block and so reads each key once per row. Here a block takes
// PT_ROWS consecutive rows of the launch and one key/value head (grid (kv_heads, ceil(batch /
// PT_ROWS))) and walks the keys in tiles of PT_KEYS positions staged in shared memory once for all
// of its rows that share a slot: PT_ROWS * 4 query vectors against each tile. Compiled for a group
// of at most 4 query heads per key/value head and head_dim 64 (the Llama 3.2 shapes); the launcher
// uses rope_attention<G, HD, true> for any other shape.
//
// Rows: slot 0xffffffff gives zeros, any other slot >= slots or pos >= max_seq NaN (no cache
// access), as in rope_attention. The valid rows are processed in groups of one slot (usually the
// whole block is one group: a chunk of one prompt); each group walks the tiles 0, PT_KEYS, ... up
// to its largest position. A row's arithmetic depends only on its own slot, position, queries
// and cache: a tile past the row's position, or a tile of another group, leaves its softmax state
// untouched (no rescale, no add), so a row gives the same bits whatever rows share its block.
//
// Thread t (PT_THREADS = 128) serves row t / 16 of the block: in the score phase its 4 query
// heads against keys j, j + 16, j + 32, j + 48 of the tile (j = t % 16); in the value phase the
// same 4 heads' output dims 4j .. 4j + 3. The 16 threads of a row reduce the tile's max and sum
// with xor shuffles, so all of them hold the same softmax state (an xor butterfly adds the same
// pairs on every lane).
#define PT_ROWS 8
#define PT_KEYS 64
#define PT_THREADS 128
#define PT_HD 64
#define PT_G 4
#define PT_KPAD (PT_HD + 4) // key rows padded: the 16 lanes of a row read 16 distinct banks

extern "C" __global__ void __launch_bounds__(PT_THREADS)
    attention_tiled_g4_hd64_bf16(const bf16_t* qkv, const bf16_t* k_cache, const bf16_t* v_cache,
                                 const unsigned* slots, const unsigned* positions, const float* inv_freq,
                                 bf16_t* out, AttnShape s) {
    __shared__ __align__(16) float q_s[PT_ROWS * PT_G][PT_HD + 4]; // padded: two rows' loads, two banks
    __shared__ __align__(16) bf16_t k_s[PT_KEYS][PT_KPAD];
    __shared__ __align__(16) bf16_t v_s[PT_KEYS][PT_HD];
    __shared__ float p_s[PT_ROWS * PT_G][PT_KEYS + 1];
    __shared__ unsigned slot_s[PT_ROWS], pos_s[PT_ROWS];
    __shared__ int todo_s[PT_ROWS]; // 1: a valid row not yet computed
    __shared__ unsigned cur_slot_s, cur_max_s;
    __shared__ int any_s;

    PDL_LAUNCH();
    PDL_WAIT();
    unsigned kvh = blockIdx.x, b0 = blockIdx.y * PT_ROWS;
    if (kvh >= s.kv_heads || b0 >= s.batch) return;
    unsigned hd = s.head_dim, half = hd / 2, group = s.heads / s.kv_heads;
    if (hd != PT_HD || group > PT_G) return; // (the launcher never picks this kernel then)
    size_t qkv_row = ((size_t)s.heads + 2 * (size_t)s.kv_heads) * hd;
    unsigned t = threadIdx.x, r = t / 16, j = t % 16;

    // The rows: state, and the zero / NaN outputs of inactive and out-of-range rows.
    if (t < PT_ROWS) {
        unsigned b = b0 + t;
        unsigned slot = b < s.batch ? slots[b] : 0xffffffffu, pos = b < s.batch ? positions[b] : 0;
        slot_s[t] = slot;
        pos_s[t] = pos;
        todo_s[t] = b < s.batch && slot < s.slots && pos < s.max_seq;
    }
    __syncthreads();
    {
        unsigned b = b0 + r;
        if (b < s.batch && !todo_s[r]) {
            bf16_t fill = slot_s[r] == 0xffffffffu ? (bf16_t)0 : NAN_BF16;
            bf16_t* o = out + (size_t)b * s.heads * hd + (size_t)kvh * group * hd;
            for (unsigned i = j; i < group * hd; i += 16) o[i] = fill;
        }
    }
    // Rotated, scaled queries of the valid rows (as rope_attention rotates them).
    for (unsigned idx = t; idx < PT_ROWS * PT_G * (PT_HD / 2); idx += PT_THREADS) {
        unsigned rr = idx / (PT_G * (PT_HD / 2)), g = idx / (PT_HD / 2) % PT_G, i = idx % (PT_HD / 2);
        float r1 = 0.f, r2 = 0.f;
        if (todo_s[rr] && g < group) {
            const bf16_t* q = qkv + (size_t)(b0 + rr) * qkv_row + (size_t)(kvh * group + g) * hd;
            float ang = (float)pos_s[rr] * inv_freq[i];
            float c = round_bf(cosf(ang)), sn = round_bf(sinf(ang));
            rope_pair(bf2f(q[i]), bf2f(q[i + half]), c, sn, r1, r2);
            r1 *= s.scale;
            r2 *= s.scale;
        }
        q_s[rr * PT_G + g][i] = r1;
        q_s[rr * PT_G + g][i + half] = r2;
    }

    for (;;) {
        __syncthreads(); // todo_s and the previous group's use of the tiles are settled
        if (t == 0) {
            int any = 0;
            unsigned cur = 0, mx = 0;
            for (unsigned rr = 0; rr < PT_ROWS; ++rr) {
                if (!todo_s[rr]) continue;
                if (!any) cur = slot_s[rr];
                if (slot_s[rr] == cur) mx = max(mx, pos_s[rr]);
                any = 1;
            }
            any_s = any;
            cur_slot_s = cur;
            cur_max_s = mx;
        }
        __syncthreads();
        if (!any_s) break;
        unsigned cur = cur_slot_s, last = cur_max_s;
        bool mine = todo_s[r] && slot_s[r] == cur; // this thread's row is in the group
        unsigned pos = pos_s[r];
        size_t head_base = ((size_t)cur * s.kv_heads + kvh) * s.max_seq * hd;
        float m[PT_G], l[PT_G], acc[PT_G][4];
#pragma unroll
        for (unsigned g = 0; g < PT_G; ++g) {
            m[g] = -INFINITY;
            l[g] = 0.f;
#pragma unroll
            for (unsigned e = 0; e < 4; ++e) acc[g][e] = 0.f;
        }
        for (unsigned base = 0; base <= last; base += PT_KEYS) { // last < max_seq < 2^31: no wrap
            // The tile: keys and values of positions base .. base + PT_KEYS - 1 (zeros past
            // `last`; each row reads only the positions up to its own).
            for (unsigned idx = t; idx < PT_KEYS * (PT_HD / 8); idx += PT_THREADS) {
                unsigned kk = idx / (PT_HD / 8), c = idx % (PT_HD / 8);
                uint4 kv = make_uint4(0, 0, 0, 0), vv = make_uint4(0, 0, 0, 0);
                if (base + kk <= last) {
                    size_t at = head_base + (size_t)(base + kk) * hd + 8 * c;
                    kv = *(const uint4*)(k_cache + at);
                    vv = *(const uint4*)(v_cache + at);
                }
                uint2* kd = (uint2*)&k_s[kk][8 * c]; // PT_KPAD rows are 8-byte aligned
                kd[0] = make_uint2(kv.x, kv.y);
                kd[1] = make_uint2(kv.z, kv.w);
                *(uint4*)&v_s[kk][8 * c] = vv;
            }
            __syncthreads();
            bool live = mine && base <= pos; // the tile holds keys this row attends to
            // Scores: 4 heads x keys j + 16 e.
            float sc[PT_G][4];
#pragma unroll
            for (unsigned g = 0; g < PT_G; ++g)
#pragma unroll
                for (unsigned e = 0; e < 4; ++e) sc[g][e] = 0.f;
#pragma unroll 4
            for (unsigned d = 0; d < PT_HD; d += 4) {
                float4 qv[PT_G];
#pragma unroll
                for (unsigned g = 0; g < PT_G; ++g) qv[g] = *(const float4*)&q_s[r * PT_G + g][d];
#pragma unroll
                for (unsigned e = 0; e < 4; ++e) {
                    uint2 kw = *(const uint2*)&k_s[j + 16 * e][d];
                    float k0 = __uint_as_float(kw.x << 16), k1 = __uint_as_float(kw.x & 0xffff0000u);
                    float k2 = __uint_as_float(kw.y << 16), k3 = __uint_as_float(kw.y & 0xffff0000u);
#pragma unroll
                    for (unsigned g = 0; g < PT_G; ++g)
                        sc[g][e] = fmaf(qv[g].w, k3, fmaf(qv[g].z, k2, fmaf(qv[g].y, k1, fmaf(qv[g].x, k0, sc[g][e]))));
                }
            }
            // Online softmax per head over the tile (the 16 lanes of the row together).
            float corr[PT_G];
#pragma unroll
            for (unsigned g = 0; g < PT_G; ++g) {
                float mx = -INFINITY;
#pragma unroll
                for (unsigned e = 0; e < 4; ++e) {
                    bool ok = live && base + j + 16 * e <= pos;
                    sc[g][e] = ok ? sc[g][e] : -INFINITY;
                    mx = fmaxf(mx, sc[g][e]);
                }
#pragma unroll
                for (unsigned o = 8; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
                float m_new = fmaxf(m[g], mx); // finite when live (key `base` <= pos is in the tile)
                corr[g] = live ? __expf(m[g] - m_new) : 1.f;
                float sum = 0.f;
#pragma unroll
                for (unsigned e = 0; e < 4; ++e) {
                    float p = live ? __expf(sc[g][e] - m_new) : 0.f;
                    p_s[r * PT_G + g][j + 16 * e] = p;
                    sum += p;
                }
#pragma unroll
                for (unsigned o = 8; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
                if (live) {
                    l[g] = l[g] * corr[g] + sum;
                    m[g] = m_new;
                }
            }
            __syncthreads();
            // Values: dims 4j .. 4j + 3 of the row's 4 heads, keys in order, only this row's
            // (base .. pos): a later key's weight is 0, but 0 times an infinite or NaN value (a
            // later row's overflow, or stale cache between the group's positions) would be NaN.
            if (live) {
                unsigned nk = min((unsigned)PT_KEYS, pos - base + 1); // pos >= base: live
                float a[PT_G][4];
#pragma unroll
                for (unsigned g = 0; g < PT_G; ++g)
#pragma unroll
                    for (unsigned e = 0; e < 4; ++e) a[g][e] = 0.f;
                for (unsigned kk = 0; kk < nk; ++kk) {
                    uint2 vw = *(const uint2*)&v_s[kk][4 * j];
                    float v0 = __uint_as_float(vw.x << 16), v1 = __uint_as_float(vw.x & 0xffff0000u);
                    float v2 = __uint_as_float(vw.y << 16), v3 = __uint_as_float(vw.y & 0xffff0000u);
#pragma unroll
                    for (unsigned g = 0; g < PT_G; ++g) {
                        float p = p_s[r * PT_G + g][kk];
                        a[g][0] = fmaf(p, v0, a[g][0]);
                        a[g][1] = fmaf(p, v1, a[g][1]);
                        a[g][2] = fmaf(p, v2, a[g][2]);
                        a[g][3] = fmaf(p, v3, a[g][3]);
                    }
                }
#pragma unroll
                for (unsigned g = 0; g < PT_G; ++g)
#pragma unroll
                    for (unsigned e = 0; e < 4; ++e) acc[g][e] = acc[g][e] * corr[g] + a[g][e];
            }
            __syncthreads(); // the tile and p_s are read before the next tile overwrites them
        }
        if (mine) {
            bf16_t* o = out + (size_t)(b0 + r) * s.heads * hd + (size_t)kvh * group * hd;
#pragma unroll
            for (unsigned g = 0; g < PT_G; ++g) {
                if (g >= group) break;
#pragma unroll
                for (unsigned e = 0; e < 4; ++e) o[(size_t)g * hd + 4 * j + e] = f2bf(acc[g][e] / l[g]);
            }
        }
        __syncthreads(); // every thread has read todo_s for this group
        if (mine && j == 0) todo_s[r] = 0;
    }
}

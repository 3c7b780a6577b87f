// Kernels of the chunked prefill (compiled after bf16.cuh and llama.cu, in the same module):
// the rotary key + KV-cache append of every row of a chunk, ahead of the cached attention
// (rope_attention<G, HD, true>), and the gather of the rows whose logits are wanted.

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

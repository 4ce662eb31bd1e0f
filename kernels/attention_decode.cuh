/*
 * kernels/attention_decode.cuh - versions 2 to 7 of decode attention: one CTA
 * per (sequence, kv head, split), the whole GQA group of query heads at once,
 * 16-byte loads, split flash-decoding with a reduction kernel (version 6:
 * the loads through a ring in shared memory, decode_piece_v2; version 7:
 * version 6's blocks launched longest row first, dec_block_row). Included by
 * attention.cu and, for its device code alone (MV_DECODE_DEVICE_ONLY), by
 * the decode megakernel; both include kernels/paged_kv.cuh first.
 *
 * Napkin math (Qwen3-0.6B: 16 q heads, 8 kv heads, D = 128). Decode reads
 * every key and value of the context once per kv head: per token 8 heads *
 * 128 * 2 bytes * 2 (K and V) = 4 KB, and does 2 multiply-adds per element
 * per query head of the group (2 here): ~1 flop per byte, while an H200
 * does ~100 bf16 flop (even fp32 FMA: ~15) per byte of HBM bandwidth.
 * Memory-bound: the goal is the copy bandwidth. 256 sequences x 1024 keys:
 * 256 * 1024 * 4 KB = 1.07 GB, ~270 us at 4 TB/s.
 *
 * Little's law: ~4.4 TB/s over 132 SMs is ~33 GB/s = 33 KB/us per SM; with
 * ~1 us of DRAM latency under load each SM must keep ~33 KB of loads in
 * flight. One CTA of 128 threads issues U 16-byte K loads and U V loads per
 * thread before it uses any: 128 * 2U * 16 B = 32 KB for U = 8; with 2-4
 * CTAs resident per SM (registers allow 4 at G <= 2) that is 64-128 KB.
 *
 * Layout of a CTA (128 threads, 4 warps). A key row of one kv head is D bf16
 * = D/8 vectors of 16 bytes, so LPK = D/8 lanes (16 for D = 128, 8 for 64)
 * read one key together, and a warp reads SUB = 32/LPK keys per load.
 * Each group of LPK lanes is a "substream": it owns keys base + u*NSUB + sub
 * (u = 0..U-1) of every tile of TILE = NSUB*U keys (NSUB = 4 warps * SUB),
 * so one load instruction across the CTA reads NSUB consecutive keys.
 * A lane holds the 8 dimensions part*8 .. part*8+7 (part = lane % LPK) of:
 * the G query heads (fp32, pre-multiplied by scale*log2(e)), and of its
 * substream's G accumulators. The score of a key is the lanes' partial dot
 * products summed by log2(LPK) xor-shuffles (every lane of the substream gets
 * it). Each substream keeps its own online softmax (m, l in log2 units);
 * at the end the CTA combines its substreams through shared memory.
 *
 * Split (flash-decoding). num_seqs * num_kv_heads CTAs fill the 132 SMs
 * only with a large batch; 1 sequence is 8 CTAs. The context is cut into
 * num_splits pieces of split_len keys (a multiple of TILE; the last piece
 * runs to the sequence's own end), one CTA each. A piece writes its
 * unnormalised output acc [D], its max m and its sum l to the workspace;
 * the reduction kernel combines the pieces of a (sequence, head):
 *     M = max_k m_k,  out = sum_k 2^(m_k - M) acc_k / sum_k 2^(m_k - M) l_k.
 * A piece that starts past its sequence's context returns at once and
 * writes nothing: the reduction counts the pieces with keys,
 * ceil(context_len / split_len), from context_lens itself.
 */
#pragma once

enum { DEC_WARPS = 4, DEC_THREADS = 32 * DEC_WARPS, DEC_MAX_SMEM_FLOATS = 8192 };

// Keys per tile for head_dim D and U keys per substream.
__host__ __device__ constexpr int dec_tile(int D, int U) { return DEC_WARPS * (32 / (D / 8)) * U; }
// U: loads in flight per lane per tile; fewer when the G accumulators and
// queries take the registers (G = 4, 8).
__host__ __device__ constexpr int dec_unroll(int G) { return G <= 2 ? 8 : 4; }

// 8 bf16 (one 16-byte vector, as uint4) to 8 floats: a bf16 is the high half
// of a float, so each conversion is one shift or one mask.
__device__ __forceinline__ void bf16x8_to_float(const uint4 &v, float f[8]) {
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        f[2 * i] = __uint_as_float(w[i] << 16);
        f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    }
}

//   grid (Hkv * groups_per_kv, num_seqs, num_splits), DEC_THREADS threads.
//   CTA: kv head kvh, query heads h0 .. h0 + G - 1 of its group.
//   ws_o [S, H, num_splits, D], ws_ml [S, H, num_splits, 2] (num_splits > 1).
// The keys of one piece. split_len > 0: that many, the same for every
// sequence (version 2: cut from the launch's max_context_len on the host).
// split_len = -P (versions 3 and 4, P a multiple of the tile): each
// sequence's own context cut into num_splits pieces of whole multiples of P
// keys, at least P, on the device, so a short context in a launch bounded by
// max_model_len (a decode CUDA graph) still spreads over every piece instead
// of filling the first few (version 3: P = the tile; version 4 on a full
// GPU: P = DEC_MIN_PIECE, so that a short row is not cut into tiny pieces).
__device__ __forceinline__ int decode_piece_len(int split_len, int ctx, int num_splits) {
    if (split_len > 0) return split_len;
    const int tile = -split_len, per = (ctx + num_splits - 1) / num_splits;
    return max(tile, (per + tile - 1) / tile * tile);
}

// Where a piece reads its activations from. dec_ld_nc: the read-only path
// (the kernels below: nothing they read is written while they run).
// dec_ld_cg: L2 only, for a persistent kernel (kernels/decode_megakernel.cu)
// that wrote the queries and the new key and value itself, a grid barrier
// earlier: the non-coherent path could still hold a stale line.
struct dec_ld_nc {
    static __device__ __forceinline__ uint4 v16(const bf16 *p) { return __ldg(reinterpret_cast<const uint4 *>(p)); }
    static __device__ __forceinline__ float f32(const float *p) { return *p; }
};
struct dec_ld_cg {
    static __device__ __forceinline__ uint4 v16(const bf16 *p) { return __ldcg(reinterpret_cast<const uint4 *>(p)); }
    static __device__ __forceinline__ float f32(const float *p) { return __ldcg(p); }
};

// How the threads of a piece wait for each other: the whole block (the
// kernels below), or a named barrier of DEC_THREADS threads when the block
// has other warps too (the decode megakernel's producer warp).
struct dec_sync_block {
    static __device__ __forceinline__ void sync() { __syncthreads(); }
};

// What a piece does before its keys. dec_prep_plain: the queries are read
// as they are (chapter 05 normed and rotated them, chapter 06 stored the
// new key and value, kernels earlier). The decode megakernel passes its own
// (kernels/decode_megakernel.cu, rope_prep): the q/k norm and the rotation
// of its queries in the piece, and, in the piece that holds a row's last
// key, that key and its value into the cache, so that they need no phase
// and no grid barrier of their own.
struct dec_prep_plain {
    // qf[g] = this lane's 8 dims of query head h0 + g, times scale*log2(e).
    // `last`: this piece holds row s's last key (kv head kvh). Returns
    // whether the piece's threads must meet (its Sync) before they read any
    // key: a Prep that stores that key returns true in every thread.
    template <int D, int G, class Ld>
    __device__ __forceinline__ bool begin(float (&qf)[G][8], const bf16 *q, long long q_stride, int s, int h0,
                                          int kvh, int part, int tid, bool last, float scale_log2) const {
#pragma unroll
        for (int g = 0; g < G; g++) {
            bf16x8_to_float(Ld::v16(q + (long long)s * q_stride + (long long)(h0 + g) * D + part * 8), qf[g]);
#pragma unroll
            for (int e = 0; e < 8; e++) qf[g][e] *= scale_log2;
        }
        return false;
    }
    // A point of the piece reached (2 its keys done, 3 its results
    // written), for a Prep that keeps a profile; nothing here.
    __device__ __forceinline__ void mark(int) const {}
};

// Shared memory of one piece's combine, in floats: the substreams'
// accumulators [NSUB][G][D], then their m [NSUB][G] and l [NSUB][G].
template <int D, int G>
__host__ __device__ constexpr int dec_piece_smem_floats() {
    return DEC_WARPS * (32 / (D / 8)) * G * (D + 2);
}

// Version 6's ring (STAGES > 0): each thread copies its own 2U vectors of
// a tile (the K and V vectors it would load) into shared memory with
// cp.async, STAGES - 1 tiles ahead of the tile it computes, and reads them
// back from there. Bytes of one CTA's ring:
template <int G, int STAGES>
__host__ __device__ constexpr int dec_ring_bytes() {
    return STAGES * 2 * dec_unroll(G) * DEC_THREADS * 16;
}

// One piece: the G query heads from h0 of kv head kvh (bx: the CTA's x
// index in a grid of Hkv * groups_per_kv), sequence s, piece `split`, by
// DEC_THREADS threads (tid: this one); sm holds dec_piece_smem_floats<D, G>()
// floats. Every thread of the piece calls it (it holds one Sync::sync()).
// STAGES 0: each tile's keys and values are loaded into registers, all of
// them before any is used (versions 2 to 5). STAGES >= 2: they come through
// `ring` (dec_ring_bytes<G, STAGES>() bytes of shared memory, 16-aligned),
// the same vectors into the same registers, so the same bits (versions 6 and 7).
template <int D, int G, class Ld, class Sync = dec_sync_block, class Prep = dec_prep_plain, int STAGES = 0>
__device__ __forceinline__ void decode_piece_v2(int bx, int s, int split, int groups_per_kv, int tid, float *sm,
                                                bf16 *out, const bf16 *q, long long q_stride, const PagedKV &kv,
                                                int H, int Hkv, float scale_log2, int num_splits, int split_len,
                                                float *ws_o, float *ws_ml, const Prep &prep = Prep(),
                                                uint4 *ring = nullptr) {
    static_assert(STAGES == 0 || STAGES >= 2, "a ring of one stage would wait for every tile");
    constexpr int U = dec_unroll(G);
    constexpr int LPK = D / 8;             // lanes per key row
    constexpr int SUB = 32 / LPK;          // keys per warp load
    constexpr int NSUB = DEC_WARPS * SUB;  // substreams per CTA
    constexpr int TILE = NSUB * U;
    static_assert(NSUB * G * D <= DEC_MAX_SMEM_FLOATS, "shared accumulators too large");

    const int kvh = bx / groups_per_kv;
    const int h0 = kvh * (H / Hkv) + (bx % groups_per_kv) * G;  // first query head of this CTA
    const int lane = tid % 32, warp = tid / 32;
    const int sub = warp * SUB + lane / LPK;  // this lane's substream
    const int part = lane % LPK;              // its dims part*8 .. part*8+7

    const int ctx = kv.num_keys(s);
    split_len = decode_piece_len(split_len, ctx, num_splits);
    const int start = split * split_len;
    const int end = split == num_splits - 1 ? ctx : min(ctx, start + split_len);
    if (start >= end) {
        // No keys in this piece. Unsplit, that is a padded sequence with
        // ctx = 0: its output is 0 (as version 1). Split, the reduction
        // ignores the piece.
        if (num_splits == 1)
            for (int e = tid; e < G * D; e += DEC_THREADS)
                out[((long long)s * H + h0 + e / D) * D + e % D] = __float2bfloat16(0.0f);
        return;
    }

    float qf[G][8];  // this lane's 8 dims of the G queries, times scale*log2(e)
    if (prep.template begin<D, G, Ld>(qf, q, q_stride, s, h0, kvh, part, tid, end == ctx, scale_log2)) Sync::sync();
    float m[G], l[G], acc[G][8];
#pragma unroll
    for (int g = 0; g < G; g++) {
        m[g] = -INFINITY;
        l[g] = 0.0f;
#pragma unroll
        for (int e = 0; e < 8; e++) acc[g][e] = 0.0f;
    }

    const long long head_off = (long long)kvh * D + part * 8;
    // The ring: tile t's vector (u, K or V) of thread tid at
    // ring[((t % STAGES) * 2U + 2u + kind) * DEC_THREADS + tid], so that a
    // warp's 32 copies or reads of one (u, kind) are 512 consecutive bytes.
    // A thread reads only what it copied itself: no barrier, only its own
    // wait for its groups. A key past the piece's end is copied as zeros.
    const int num_tiles = (end - start + TILE - 1) / TILE;
    auto fill = [&](int t) {
        if constexpr (STAGES > 0) {
            if (t < num_tiles) {
                const uint32_t dst =
                    (uint32_t)__cvta_generic_to_shared(ring + (t % STAGES) * 2 * U * DEC_THREADS + tid);
#pragma unroll
                for (int u = 0; u < U; u++) {
                    const int j = start + t * TILE + u * NSUB + sub;
                    const long long row = j < end ? kv.key_row(s, j) : 0;
                    cp_async16(dst + (2 * u) * DEC_THREADS * 16, kv.k + row * kv.k_stride + head_off, j < end ? 16 : 0);
                    cp_async16(dst + (2 * u + 1) * DEC_THREADS * 16, kv.v + row * kv.v_stride + head_off,
                               j < end ? 16 : 0);
                }
            }
            cp_async_commit();  // an empty group past the last tile keeps the count of groups in step
        }
    };
    if constexpr (STAGES > 0) {
#pragma unroll
        for (int t = 0; t < STAGES - 1; t++) fill(t);
    }
    for (int t = 0, base = start; base < end; t++, base += TILE) {
        // All of the tile's loads first (2U 16-byte vectors per lane), then the math.
        uint4 kr[U], vr[U];
        if constexpr (STAGES > 0) {
            fill(t + STAGES - 1);
            cp_async_wait<STAGES - 1>();  // this thread's copies of tile t have landed
            const uint4 *st = ring + (t % STAGES) * 2 * U * DEC_THREADS + tid;
#pragma unroll
            for (int u = 0; u < U; u++) {
                kr[u] = st[(2 * u) * DEC_THREADS];
                vr[u] = st[(2 * u + 1) * DEC_THREADS];
            }
        } else {
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int j = base + u * NSUB + sub;
                if (j < end) {
                    const long long row = kv.key_row(s, j);
                    kr[u] = Ld::v16(kv.k + row * kv.k_stride + head_off);
                    vr[u] = Ld::v16(kv.v + row * kv.v_stride + head_off);
                } else {
                    kr[u] = vr[u] = make_uint4(0, 0, 0, 0);
                }
            }
        }
        float sc[U][G];  // scores in log2 units; -inf past the end
#pragma unroll
        for (int u = 0; u < U; u++) {
            float kf[8];
            bf16x8_to_float(kr[u], kf);
#pragma unroll
            for (int g = 0; g < G; g++) {
                float dot = 0.0f;
#pragma unroll
                for (int e = 0; e < 8; e++) dot = fmaf(qf[g][e], kf[e], dot);
#pragma unroll
                for (int o = LPK / 2; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
                sc[u][g] = base + u * NSUB + sub < end ? dot : -INFINITY;
            }
        }
        // Online softmax, once per tile: the new max, one rescale of l and acc.
        float m_use[G];
#pragma unroll
        for (int g = 0; g < G; g++) {
            float m_new = m[g];
#pragma unroll
            for (int u = 0; u < U; u++) m_new = fmaxf(m_new, sc[u][g]);
            // A substream that has seen no key yet keeps m = -inf; 0 then
            // stands in for it so that no -inf - -inf (NaN) is formed.
            m_use[g] = m_new == -INFINITY ? 0.0f : m_new;
            const float rescale = exp2f(m[g] - m_use[g]);
            l[g] *= rescale;
#pragma unroll
            for (int e = 0; e < 8; e++) acc[g][e] *= rescale;
            m[g] = m_new;
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            float vf[8];
            bf16x8_to_float(vr[u], vf);
#pragma unroll
            for (int g = 0; g < G; g++) {
                const float p = exp2f(sc[u][g] - m_use[g]);  // 0 past the end
                l[g] += p;
#pragma unroll
                for (int e = 0; e < 8; e++) acc[g][e] = fmaf(p, vf[e], acc[g][e]);
            }
        }
    }

    prep.mark(2);

    // Combine the CTA's NSUB substreams: each lane's 8 accumulators and its
    // substream's (m, l) to shared memory, then thread t sums element
    // (g, d) = t, t + 128, ... over the substreams, each weighted by 2^(m - M).
    float(*sm_acc)[G][D] = reinterpret_cast<float(*)[G][D]>(sm);
    float(*sm_m)[G] = reinterpret_cast<float(*)[G]>(sm + NSUB * G * D);
    float(*sm_l)[G] = reinterpret_cast<float(*)[G]>(sm + NSUB * G * (D + 1));
#pragma unroll
    for (int g = 0; g < G; g++) {
        float4 *dst = reinterpret_cast<float4 *>(&sm_acc[sub][g][part * 8]);
        dst[0] = make_float4(acc[g][0], acc[g][1], acc[g][2], acc[g][3]);
        dst[1] = make_float4(acc[g][4], acc[g][5], acc[g][6], acc[g][7]);
        if (part == 0) {
            sm_m[sub][g] = m[g];
            sm_l[sub][g] = l[g];
        }
    }
    Sync::sync();
    for (int e = tid; e < G * D; e += DEC_THREADS) {
        const int g = e / D, d = e % D;
        float M = -INFINITY;
#pragma unroll
        for (int k = 0; k < NSUB; k++) M = fmaxf(M, sm_m[k][g]);
        // The piece has a key, so some substream saw one and M is finite;
        // substreams that saw none have m = -inf: weight 0.
        float L = 0.0f, A = 0.0f;
#pragma unroll
        for (int k = 0; k < NSUB; k++) {
            const float w = exp2f(sm_m[k][g] - M);
            L = fmaf(w, sm_l[k][g], L);
            A = fmaf(w, sm_acc[k][g][d], A);
        }
        const int h = h0 + g;
        if (num_splits == 1) {
            out[((long long)s * H + h) * D + d] = __float2bfloat16(A / L);
        } else {
            const long long piece = ((long long)s * H + h) * num_splits + split;
            ws_o[piece * D + d] = A;
            if (d == 0) {
                ws_ml[piece * 2] = M;
                ws_ml[piece * 2 + 1] = L;
            }
        }
    }
    prep.mark(3);
}

#ifndef MV_DECODE_DEVICE_ONLY
#include "kernels/decode_rope_prep.cuh"

// Which row s and piece `split` a block of the grid (x, y = row, z = piece)
// computes. Without an order (versions 2 to 6), row y's piece z. With one
// (version 7), the blocks' (y, z) counted in the order the GPU starts them,
// y fastest, p = y + rows * z, and read as (rank, piece) = (p / num_splits,
// p % num_splits): row row_order[rank]'s pieces one after another, the
// longest row's first. Why: blocks start in that order and a SM takes the
// next one as soon as one of its own ends, so the last blocks to start are
// the tail of the launch. Where rows of mixed lengths start in their own
// order, a long row that starts last runs on alone while the rest of the
// GPU idles (the longest of 2,048 keys takes about 60 us by itself).
// Longest first, the last blocks to start are the shortest, and every SM
// runs out of work at nearly the same time. The piece's keys, its sums and
// their order are what they are without the order: the same bits.
__device__ __forceinline__ void dec_block_row(const int32_t *row_order, int num_splits, int *s, int *split) {
    if (!row_order) {
        *s = blockIdx.y;
        *split = blockIdx.z;
        return;
    }
    const int p = blockIdx.y + gridDim.y * blockIdx.z;
    *s = row_order[p / num_splits];
    *split = p % num_splits;
}

// attention_decode_rope_cuda's arguments on the device: the raw QKV rows
// [rows, qkv_stride] (q at column 0, k at qn, v at qn + Hkv * D) and what
// q/k norm, RoPE and the store read (kernels/decode_rope_prep.cuh).
struct dec_rope_args {
    const bf16 *qkv;
    long long qkv_stride;
    int qn, num_kv_heads, max_position;
    float eps;
    const bf16 *q_norm, *k_norm;
    const float *cos_sin;
    const int32_t *positions, *slot_mapping;
    bf16 *k_cache, *v_cache;
    long long num_slots;
};
struct dec_rope_src {
    const dec_rope_args *a;
    __device__ __forceinline__ void mark(int) const {}
    __device__ __forceinline__ const bf16 *qkv() const { return a->qkv; }
    __device__ __forceinline__ long long qkv_stride() const { return a->qkv_stride; }
    __device__ __forceinline__ int qn() const { return a->qn; }
    __device__ __forceinline__ const int32_t *positions() const { return a->positions; }
    __device__ __forceinline__ const int32_t *slot_mapping() const { return a->slot_mapping; }
    __device__ __forceinline__ const float *cos_sin() const { return a->cos_sin; }
    __device__ __forceinline__ const bf16 *q_norm() const { return a->q_norm; }
    __device__ __forceinline__ const bf16 *k_norm() const { return a->k_norm; }
    __device__ __forceinline__ bf16 *k_cache() const { return a->k_cache; }
    __device__ __forceinline__ bf16 *v_cache() const { return a->v_cache; }
    __device__ __forceinline__ int num_kv_heads() const { return a->num_kv_heads; }
    __device__ __forceinline__ long long num_slots() const { return a->num_slots; }
    __device__ __forceinline__ int max_position() const { return a->max_position; }
    __device__ __forceinline__ float eps() const { return a->eps; }
};

// decode_kernel_v2 with q/k norm, RoPE and the KV store in its pieces
// (groups_per_kv 1: one CTA a kv head). The piece that holds a row's last
// key stores it and then reads it back, so its keys come through L2
// (dec_ld_cg: the read-only path is only for data no thread of the kernel
// writes); every other piece reads through the read-only path as
// decode_kernel_v2 does.
// CTAs a SM the launch bounds ask for: the registers' limit of versions 2
// to 5 (4 at G <= 2, 2 above), and with the ring what shared memory holds
// (2 stages of 32 KB and the combine's 8 KB at G <= 2: 3 in 228 KB).
template <int G, int STAGES>
__host__ __device__ constexpr int dec_min_ctas() {
    return STAGES == 0 ? (G <= 2 ? 4 : 2) : G <= 2 ? 3 : 2;
}

// The ring of versions 6 and 7 (dynamic shared memory, dec_ring_bytes<G, STAGES>();
// none when STAGES is 0).
extern __shared__ __align__(16) uint4 dec_ring[];

// STAGES: 0 for versions 2 to 5, DEC_RING_STAGES for versions 6 and 7 (the ring).
template <int D, int G, int STAGES>
__global__ void __launch_bounds__(DEC_THREADS, dec_min_ctas<G, STAGES>())
decode_kernel_v2_rope(bf16 *out, PagedKV kv, int H, int Hkv, float scale_log2, int num_splits, int split_len,
                      float *ws_o, float *ws_ml, const int32_t *row_order, const __grid_constant__ dec_rope_args ra) {
    pdl_launch_dependents();
    pdl_wait();  // every read below is of activations (kernels/common.cuh: PDL)
    __shared__ __align__(16) float sm[dec_piece_smem_floats<D, G>()];
    const dec_prep_rope<D, dec_rope_src> prep{{&ra}};
    int s, split;
    dec_block_row(row_order, num_splits, &s, &split);
    const int ctx = kv.num_keys(s);
    const int len = decode_piece_len(split_len, ctx, num_splits), start = split * len;
    const int end = split == num_splits - 1 ? ctx : min(ctx, start + len);
    // (The ring's copies go through L2 like dec_ld_cg, so they see the key stored by the Prep.)
    if (start < end && end == ctx)
        decode_piece_v2<D, G, dec_ld_cg, dec_sync_block, dec_prep_rope<D, dec_rope_src>, STAGES>(
            blockIdx.x, s, split, 1, threadIdx.x, sm, out, ra.qkv, ra.qkv_stride, kv, H, Hkv, scale_log2, num_splits,
            split_len, ws_o, ws_ml, prep, dec_ring);
    else
        decode_piece_v2<D, G, dec_ld_nc, dec_sync_block, dec_prep_rope<D, dec_rope_src>, STAGES>(
            blockIdx.x, s, split, 1, threadIdx.x, sm, out, ra.qkv, ra.qkv_stride, kv, H, Hkv, scale_log2, num_splits,
            split_len, ws_o, ws_ml, prep, dec_ring);
}

template <int D, int G, int STAGES>
__global__ void __launch_bounds__(DEC_THREADS, dec_min_ctas<G, STAGES>())
decode_kernel_v2(bf16 *out, const bf16 *q, long long q_stride, PagedKV kv, int H, int Hkv, float scale_log2,
                 int num_splits, int split_len, float *ws_o, float *ws_ml, const int32_t *row_order) {
    pdl_launch_dependents();
    pdl_wait();  // every read below is of activations (kernels/common.cuh: PDL)
    __shared__ __align__(16) float sm[dec_piece_smem_floats<D, G>()];
    int s, split;
    dec_block_row(row_order, num_splits, &s, &split);
    decode_piece_v2<D, G, dec_ld_nc, dec_sync_block, dec_prep_plain, STAGES>(
        blockIdx.x, s, split, gridDim.x / Hkv, threadIdx.x, sm, out, q, q_stride, kv, H, Hkv, scale_log2,
        num_splits, split_len, ws_o, ws_ml, dec_prep_plain(), dec_ring);
}
#endif

// The reduction of the split pieces of (sequence s, head h), output
// dimension d (one thread each). Only the ceil(ctx / split_len) pieces
// that hold keys were written; the others are never read.
template <class Ld>
__device__ __forceinline__ void decode_reduce_one(int h, int s, int d, bf16 *out, const float *ws_o,
                                                  const float *ws_ml, const int32_t *context_lens, int H, int D,
                                                  int num_splits, int split_len) {
    const int ctx = context_lens[s];
    split_len = decode_piece_len(split_len, ctx, num_splits);
    const int used = ctx <= 0 ? 0 : min(num_splits, (ctx + split_len - 1) / split_len);
    const long long first = ((long long)s * H + h) * num_splits;  // piece 0 of this (sequence, head)
    float M = -INFINITY;
    for (int k = 0; k < used; k++) M = fmaxf(M, Ld::f32(ws_ml + (first + k) * 2));
    float L = 0.0f, A = 0.0f;
    for (int k = 0; k < used; k++) {
        const float w = exp2f(Ld::f32(ws_ml + (first + k) * 2) - M);
        L = fmaf(w, Ld::f32(ws_ml + (first + k) * 2 + 1), L);
        A = fmaf(w, Ld::f32(ws_o + (first + k) * D + d), A);
    }
    out[((long long)s * H + h) * D + d] = __float2bfloat16(used ? A / L : 0.0f);
}

// Version 2 of the reduction: the same sums in the same order (so the same
// bits), with every load of up to DEC_REDUCE_BATCH pieces issued before the
// first sum: one trip to L2 where version 1's loops take one or two a piece
// (the decode megakernel's reduction, a latency chain at one row:
// docs/09-engine.md). Lane k of each warp loads piece k's (m, l), the warp
// takes M with a butterfly of fmaxf (exact, so any order gives the same M),
// and each thread reads (m, l) of piece k from lane k in order. Every lane
// of a warp must call it with the same (h, s) (whole warps of d). More
// pieces than DEC_REDUCE_BATCH take version 1's loops.
enum { DEC_REDUCE_BATCH = 16 };
template <class Ld>
__device__ __forceinline__ void decode_reduce_one_v2(int h, int s, int d, bf16 *out, const float *ws_o,
                                                     const float *ws_ml, const int32_t *context_lens, int H, int D,
                                                     int num_splits, int split_len) {
    const int ctx = context_lens[s];
    const int len = decode_piece_len(split_len, ctx, num_splits);
    const int used = ctx <= 0 ? 0 : min(num_splits, (ctx + len - 1) / len);
    if (used > DEC_REDUCE_BATCH) {
        decode_reduce_one<Ld>(h, s, d, out, ws_o, ws_ml, context_lens, H, D, num_splits, split_len);
        return;
    }
    const long long first = ((long long)s * H + h) * num_splits;
    const int lane = threadIdx.x % 32;
    float my_m = -INFINITY, my_l = 0.0f, ok[DEC_REDUCE_BATCH];
    if (lane < used) {
        my_m = Ld::f32(ws_ml + (first + lane) * 2);
        my_l = Ld::f32(ws_ml + (first + lane) * 2 + 1);
    }
#pragma unroll
    for (int k = 0; k < DEC_REDUCE_BATCH; k++) ok[k] = k < used ? Ld::f32(ws_o + (first + k) * D + d) : 0.0f;
    float M = my_m;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, o));
    float L = 0.0f, A = 0.0f;
#pragma unroll
    for (int k = 0; k < DEC_REDUCE_BATCH; k++) {
        const float mk = __shfl_sync(0xffffffffu, my_m, k), lk = __shfl_sync(0xffffffffu, my_l, k);
        if (k < used) {
            const float w = exp2f(mk - M);
            L = fmaf(w, lk, L);
            A = fmaf(w, ok[k], A);
        }
    }
    out[((long long)s * H + h) * D + d] = __float2bfloat16(used ? A / L : 0.0f);
}

#ifndef MV_DECODE_DEVICE_ONLY
// The reduction kernel: grid (H, num_seqs), D threads each (whole warps of
// one (h, s), as version 2 of the reduction needs). RV: the reduction's
// version, 1 (decode versions 2 to 4) or 2 (decode version 5).
template <int RV>
__global__ void __launch_bounds__(128)
decode_reduce_kernel(bf16 *out, const float *ws_o, const float *ws_ml, const int32_t *context_lens, int H, int D,
                     int num_splits, int split_len) {
    pdl_launch_dependents();
    pdl_wait();  // every read below is of activations (kernels/common.cuh: PDL)
    if constexpr (RV == 2)
        decode_reduce_one_v2<dec_ld_nc>(blockIdx.x, blockIdx.y, threadIdx.x, out, ws_o, ws_ml, context_lens, H, D,
                                        num_splits, split_len);
    else
        decode_reduce_one<dec_ld_nc>(blockIdx.x, blockIdx.y, threadIdx.x, out, ws_o, ws_ml, context_lens, H, D,
                                     num_splits, split_len);
}

// How many pieces each sequence's context is cut into (see attention.h):
// enough CTAs for two per SM, no piece shorter than DEC_MIN_PIECE keys (or
// two cache blocks): below that, the pieces' fixed costs (queries, the
// combine, the reduction) outweigh the bytes they read.
enum { DEC_MIN_PIECE = 256 };
static int decode_num_splits(int num_seqs, int num_kv_heads, int max_context_len, int block_size, int num_sms) {
    const long long ctas = (long long)num_seqs * num_kv_heads;
    if (ctas <= 0 || max_context_len <= 0) return 1;
    const long long target = 2LL * (num_sms > 0 ? num_sms : 132);
    long long splits = (target + ctas - 1) / ctas;
    const int min_piece = DEC_MIN_PIECE > 2 * block_size ? DEC_MIN_PIECE : 2 * block_size;
    const long long most = max_context_len / min_piece;
    if (splits > most) splits = most;
    if (splits > ATTN_DECODE_MAX_SPLITS) splits = ATTN_DECODE_MAX_SPLITS;
    return splits < 1 ? 1 : (int)splits;
}

// Version 4's pieces where the batch alone just fills the GPU: from the
// (row, kv head) blocks version 3 leaves unsplit (two a SM) up to four a
// SM, DEC_BALANCE_SPLITS pieces of at least DEC_MIN_PIECE keys, so that no
// block reads more than an eighth of its row's context or DEC_MIN_PIECE
// keys, whichever is longer. Unsplit, a block reads about 34 keys a
// microsecond (chapter 07's 1 x 1024 unsplit), so in a batch of mixed
// lengths the longest row's one block can outlast the rest of the layer's
// attention. Above four blocks a SM the batch's own blocks, started longest
// first (version 7), even out, and the pieces' extra blocks and reduction
// cost more than they save (the band was measured on nano-vllm's workload:
// docs/09-engine.md). up_to: the band's top in blocks a SM,
// DEC_BALANCE_UP_TO but where the experiment switch MV_DECODE_PIECES asks
// for 8 or 0 (no pieces: attention.cu, attention_decode_pieces_up_to).
enum { DEC_BALANCE_SPLITS = 8, DEC_BALANCE_UP_TO = 4 };
static inline int decode_balanced(int num_seqs, int num_kv_heads, int splits, int num_sms, int up_to) {
    const long long ctas = (long long)num_seqs * num_kv_heads, sms = num_sms > 0 ? num_sms : 132;
    return splits == 1 && ctas >= 2 * sms && ctas <= up_to * sms;
}

// row_piece: 0 = pieces cut from max_context_len on the host (version 2);
// > 0 = each row's own context cut on the device into pieces of at least
// row_piece keys, rounded up to whole tiles (versions 3 and 4).
// A kernel's static and dynamic shared memory together past 48 KB must be
// allowed, once per kernel; *allowed: what was allowed so far (a static of
// the caller's, one per kernel: kernels of one signature share a type).
template <typename K>
static int dec_allow_smem(K kernel, int bytes, int *allowed) {
    if (bytes == 0 || *allowed >= bytes) return 0;
    if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes) != cudaSuccess) return -1;
    *allowed = bytes;
    return 0;
}

// STAGES: 0 (versions 2 to 5, and 6 and 7 where the ring does not pay) or
// DEC_RING_STAGES (versions 6 and 7).
template <int D, int G, int STAGES>
static int launch_decode_v2_t(bf16 *out, const bf16 *q, long long q_stride, PagedKV kv, int num_seqs,
                              int max_context_len, int H, int Hkv, float scale, int num_splits, float *workspace,
                              int row_piece, int reduce_v, const int32_t *row_order, const dec_rope_args *rope,
                              cudaStream_t stream) {
    constexpr int TILE = dec_tile(D, dec_unroll(G));
    // Pieces of whole tiles: every piece but the last starts and ends on a tile.
    const int per_piece = (max_context_len + num_splits - 1) / num_splits;
    const int split_len = row_piece > 0   ? -((row_piece + TILE - 1) / TILE * TILE)
                          : per_piece <= 0 ? TILE
                                           : (per_piece + TILE - 1) / TILE * TILE;
    float *ws_o = workspace;
    float *ws_ml = num_splits > 1 ? workspace + (size_t)num_seqs * H * num_splits * D : NULL;
    const int groups_per_kv = H / Hkv / G;
    dim3 grid((unsigned)(Hkv * groups_per_kv), (unsigned)num_seqs, (unsigned)num_splits);
    const float scale_log2 = scale * 1.4426950408889634f;  // exp(x) = 2^(x log2 e): exp2f is one instruction
    const int ring = STAGES ? dec_ring_bytes<G, STAGES>() : 0;
    static int allowed_rope = 0, allowed_plain = 0;  // one pair per (D, G, STAGES)
    if (rope) {
        if (dec_allow_smem(decode_kernel_v2_rope<D, G, STAGES>, ring, &allowed_rope))
            return mv_error("attention decode: %d bytes of shared memory for the ring refused", ring);
        mv_launch(decode_kernel_v2_rope<D, G, STAGES>, grid, dim3(DEC_THREADS), ring, stream, out, kv, H, Hkv,
                  scale_log2, num_splits, split_len, ws_o, ws_ml, row_order, *rope);
    } else {
        if (dec_allow_smem(decode_kernel_v2<D, G, STAGES>, ring, &allowed_plain))
            return mv_error("attention decode: %d bytes of shared memory for the ring refused", ring);
        mv_launch(decode_kernel_v2<D, G, STAGES>, grid, dim3(DEC_THREADS), ring, stream, out, q, q_stride, kv, H, Hkv,
                  scale_log2, num_splits, split_len, ws_o, ws_ml, row_order);
    }
    if (num_splits > 1)
        mv_launch(reduce_v == 2 ? decode_reduce_kernel<2> : decode_reduce_kernel<1>, dim3((unsigned)H, (unsigned)num_seqs),
                  dim3(D), 0, stream, out, (const float *)ws_o, (const float *)ws_ml, kv.context_lens, H, D, num_splits,
                  split_len);
    return 0;
}

// The ring's stages in versions 6 and 7: the tile computed and the next in flight
// (3 stages were no faster in chapter 07's timings: docs/perf-notes.md).
enum { DEC_RING_STAGES = 2 };

// CTAs of kernel k resident on one SM with `smem` bytes of dynamic shared
// memory (at least 1), asked of the runtime once per kernel.
template <typename K>
static int dec_ctas_per_sm(K kernel, int smem, int *cached) {
    if (!*cached) {
        int n = 0;
        if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, DEC_THREADS, smem) != cudaSuccess || n < 1) n = 1;
        *cached = n;
    }
    return *cached;
}

// Version 6: the ring, unless the grid fits on the GPU at once with
// versions 2-5's occupancy (4 CTAs a SM at G <= 2) but not with the ring's
// (3): a second wave would cost more than the ring saves (chapter 07). The
// two paths give the same bits, so the choice changes only the time.
// CTAs a SM of the kernel a launch takes: with the ring (stages > 0) or
// without, with q/k norm and RoPE in its pieces (rope) or without.
template <int D, int G>
static int dec_kernel_ctas_per_sm(int stages, bool rope) {
    static int plain0 = 0, plain2 = 0, rope0 = 0, rope2 = 0;
    const int ring = dec_ring_bytes<G, DEC_RING_STAGES>();
    if (!stages)
        return rope ? dec_ctas_per_sm(decode_kernel_v2_rope<D, G, 0>, 0, &rope0)
                    : dec_ctas_per_sm(decode_kernel_v2<D, G, 0>, 0, &plain0);
    return rope ? dec_ctas_per_sm(decode_kernel_v2_rope<D, G, DEC_RING_STAGES>, ring, &rope2)
                : dec_ctas_per_sm(decode_kernel_v2<D, G, DEC_RING_STAGES>, ring, &plain2);
}

template <int D, int G>
static int dec_ring_stages(long long ctas, bool rope) {
    const long long sms = mv_num_sms();
    return ctas <= dec_kernel_ctas_per_sm<D, G>(0, rope) * sms &&
                   ctas > dec_kernel_ctas_per_sm<D, G>(DEC_RING_STAGES, rope) * sms
               ? 0
               : DEC_RING_STAGES;
}

// row_order (version 7): taken only where the grid needs more than one wave.
// In one wave every block starts at once, so the order would change nothing
// but add a load before each block's first key.
template <int D, int G>
static int launch_decode_v2_g(bf16 *out, const bf16 *q, long long q_stride, PagedKV kv, int num_seqs,
                              int max_context_len, int H, int Hkv, float scale, int num_splits, float *workspace,
                              int row_piece, int reduce_v, int stages, const int32_t *row_order,
                              const dec_rope_args *rope, cudaStream_t stream) {
    const long long ctas = (long long)H / G * num_seqs * num_splits;
    const int st = stages && dec_ring_stages<D, G>(ctas, rope != NULL) ? DEC_RING_STAGES : 0;
    const long long one_wave = (long long)dec_kernel_ctas_per_sm<D, G>(st, rope != NULL) * mv_num_sms();
    const int32_t *order = row_order && ctas > one_wave ? row_order : NULL;
    if (st)
        return launch_decode_v2_t<D, G, DEC_RING_STAGES>(out, q, q_stride, kv, num_seqs, max_context_len, H, Hkv,
                                                         scale, num_splits, workspace, row_piece, reduce_v, order,
                                                         rope, stream);
    return launch_decode_v2_t<D, G, 0>(out, q, q_stride, kv, num_seqs, max_context_len, H, Hkv, scale, num_splits,
                                       workspace, row_piece, reduce_v, order, rope, stream);
}

// G: the largest of 8, 4, 2, 1 that divides the group; a group of another
// size (3, 6, 16...) is served by several CTAs per kv head, each reading K
// and V (the repeats mostly from L2).
template <int D>
static int launch_decode_v2_d(bf16 *out, const bf16 *q, long long q_stride, PagedKV kv, int num_seqs,
                              int max_context_len, int H, int Hkv, float scale, int num_splits, float *workspace,
                              int row_piece, int reduce_v, int stages, const int32_t *row_order,
                              const dec_rope_args *rope, cudaStream_t stream) {
    const int group = H / Hkv;
    if (group % 8 == 0)
        return launch_decode_v2_g<D, 8>(out, q, q_stride, kv, num_seqs, max_context_len, H, Hkv, scale, num_splits,
                                        workspace, row_piece, reduce_v, stages, row_order, rope, stream);
    if (group % 4 == 0)
        return launch_decode_v2_g<D, 4>(out, q, q_stride, kv, num_seqs, max_context_len, H, Hkv, scale, num_splits,
                                        workspace, row_piece, reduce_v, stages, row_order, rope, stream);
    if (group % 2 == 0)
        return launch_decode_v2_g<D, 2>(out, q, q_stride, kv, num_seqs, max_context_len, H, Hkv, scale, num_splits,
                                        workspace, row_piece, reduce_v, stages, row_order, rope, stream);
    return launch_decode_v2_g<D, 1>(out, q, q_stride, kv, num_seqs, max_context_len, H, Hkv, scale, num_splits,
                                    workspace, row_piece, reduce_v, stages, row_order, rope, stream);
}

// stages: 0 (versions 2 to 5, the tile's loads into registers) or
// DEC_RING_STAGES (versions 6 and 7's ring, where it pays: dec_ring_stages).
// row_order: NULL, or version 7's longest-first order of the rows
// (dec_block_row), a permutation of 0 .. num_seqs - 1.
static int launch_decode_v2(bf16 *out, const bf16 *q, long long q_stride, PagedKV kv, int num_seqs,
                            int max_context_len, int H, int Hkv, int D, float scale, int num_splits, float *workspace,
                            int row_piece, int reduce_v, int stages, const int32_t *row_order,
                            const dec_rope_args *rope, cudaStream_t stream) {
    if (D == 128)
        return launch_decode_v2_d<128>(out, q, q_stride, kv, num_seqs, max_context_len, H, Hkv, scale, num_splits,
                                       workspace, row_piece, reduce_v, stages, row_order, rope, stream);
    return launch_decode_v2_d<64>(out, q, q_stride, kv, num_seqs, max_context_len, H, Hkv, scale, num_splits,
                                  workspace, row_piece, reduce_v, stages, row_order, rope, stream);
}
#endif  // MV_DECODE_DEVICE_ONLY

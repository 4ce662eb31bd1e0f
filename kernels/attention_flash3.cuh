/*
 * kernels/attention_flash3.cuh - version 3 of prefill attention: version 2
 * (attention_flash.cuh, read it first: fragments, swizzle, online softmax
 * are the same) with each warp owning 32 query rows instead of 16.
 *
 * Why (counted per CTA of 4 warps, D = 128, per 64 x 64 query-key area):
 *   version 2 (64 queries x 64 keys): 2.1 MFLOP of mma; each warp reads the
 *     whole K and V tile by ldmatrix (32 KB) for its 16 rows: 128 KB of
 *     shared reads + 32 KB of cp.async fills = 160 KB: 13 FLOP per shared
 *     byte; 32 KB from L2 (64 FLOP/B).
 *   version 3 (128 queries x 32 keys per tile): each K and V fragment feeds
 *     both m-tiles of the warp, but Q (32 rows x D) no longer fits in
 *     registers beside 32 rows of O and is re-read per key tile. Per tile:
 *     2.1 MFLOP; per warp Q 8 KB + K 8 KB + V 8 KB = 24 KB, x4 = 96 KB +
 *     16 KB fills = 112 KB: 19 FLOP/B, 1.4x fewer shared bytes per FLOP;
 *     16 KB from L2 (128 FLOP/B: half the L2 traffic).
 * Registers: O 2 x 16 x 128 / 32 = 128 fp32 per thread, S 2 x 16 x 32 / 32
 * = 32. With 64-key tiles (S = 64) ptxas needs 255 and spills ~70 bytes
 * (checked with -Xptxas -v, sm_90); with 32 it fits in 244 without spills:
 * 2 CTAs of 128 threads per SM, as version 2. The price of 32-key tiles:
 * one rescale of O (128 FMUL per thread) and one barrier per 32 keys
 * instead of 64. Shared memory: Q 32 KB + K, V double buffered 32 KB =
 * 64 KB per CTA at D = 128.
 *
 * Three smaller changes:
 *   - The grid is (H, S, query tiles) with the tile index reversed: CUDA
 *     launches x fastest, so every (sequence, head)'s heaviest causal tile
 *     goes first and the one-key-tile ones fill the tail (longest job
 *     first); heads of one GQA group are neighbours (their K/V shared in L2).
 *   - Paged keys: the block table is read once per 16 keys (a block holds
 *     16 or more and a key tile starts at a multiple of 32), all lookups
 *     before the first cp.async. Version 2 reads it once per row, and the
 *     "memory" clobber of each cp.async keeps the next lookup from being
 *     hoisted above it: a dependent load per row in the issue path.
 *   - Causal skipping per warp: a warp whose 32 rows all end before a key
 *     tile (on the diagonal: up to three of the four warps) skips its
 *     mma and softmax for that tile; it still loads and meets the barriers.
 */
#pragma once

enum { F3_BR = 128, F3_BC = 32, F3_WARPS = 4, F3_THREADS = 32 * F3_WARPS, F3_MT = F3_BR / (16 * F3_WARPS) };

// Key rows j0 .. j0+31 of sequence s into one K and one V buffer, rows at or
// past ctx zero-filled. The row of key j0 + 16k + r (r < 16) is
// base[k] + r: two address lookups per tile, made before any copy.
template <int D, class KV>
__device__ __forceinline__ void load_kv_tile3(uint32_t k_dst, uint32_t v_dst, const KV &kv, int s, int kvh, int j0,
                                              int ctx) {
    constexpr int CH = D / 8;
    constexpr int ROWS_PER_I = F3_THREADS / CH;  // 8 (D = 128) or 16 (D = 64): a power of two
    static_assert(16 % ROWS_PER_I == 0 || ROWS_PER_I % 16 == 0, "row groups of 16");
    long long base[F3_BC / 16];
#pragma unroll
    for (int k = 0; k < F3_BC / 16; k++) base[k] = j0 + 16 * k < ctx ? kv.key_row(s, j0 + 16 * k) : 0;
    const int r0 = threadIdx.x / CH, c = threadIdx.x % CH;
#pragma unroll
    for (int i = 0; i < F3_BC * CH / F3_THREADS; i++) {
        const int r = r0 + i * ROWS_PER_I;  // group r / 16 is (i * ROWS_PER_I) / 16 when ROWS_PER_I <= 16
        const int grp = ROWS_PER_I <= 16 ? (i * ROWS_PER_I) / 16 : r / 16;
        const bool valid = j0 + r < ctx;
        const long long row = valid ? base[grp] + (r & 15) : 0;
        cp_async16(k_dst + swz<CH>(r, c), kv.k + row * kv.k_stride + (long long)kvh * D + c * 8, valid ? 16 : 0);
        cp_async16(v_dst + swz<CH>(r, c), kv.v + row * kv.v_stride + (long long)kvh * D + c * 8, valid ? 16 : 0);
    }
}

template <int D, class KV>
__global__ void __launch_bounds__(F3_THREADS, 2)
flash3_prefill_kernel(bf16 *out, const bf16 *q, long long q_stride, KV kv, const int32_t *cu_seqlens_q, int H,
                      int Hkv, float scale_log2) {
    constexpr int CH = D / 8;
    constexpr int KSTEPS = D / 16;
    constexpr int NT_S = F3_BC / 8;
    constexpr int NT_O = D / 8;
    constexpr int MT = F3_MT;  // m-tiles of 16 rows per warp: 2
    constexpr int TILE_BYTES = F3_BC * D * 2;
    extern __shared__ __align__(128) uint8_t smem[];
    const uint32_t sq = smem_u32(smem);      // Q [128, D]
    const uint32_t sk = sq + F3_BR * D * 2;  // K [2][32, D]
    const uint32_t sv = sk + 2 * TILE_BYTES;  // V [2][32, D]

    const int h = blockIdx.x, s = blockIdx.y;
    const int qtile = gridDim.z - 1 - blockIdx.z;  // heaviest tiles launched first
    int first;
    const int n = seq_queries(cu_seqlens_q, s, &first);
    const int m0 = qtile * F3_BR;
    if (m0 >= n) return;
    const int ctx = kv.num_keys(s);
    const int kvh = h / (H / Hkv);
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int g = lane / 4, c4 = lane % 4;
    const int wrow = warp * 16 * MT;  // the warp's first row in the tile

#pragma unroll
    for (int i = 0; i < F3_BR * CH / F3_THREADS; i++) {
        const int idx = threadIdx.x + i * F3_THREADS;
        const int r = idx / CH, c = idx % CH;
        const bool valid = m0 + r < n;
        const bf16 *src = q + (long long)(first + (valid ? m0 + r : 0)) * q_stride + (long long)h * D + c * 8;
        cp_async16(sq + swz<CH>(r, c), src, valid ? 16 : 0);
    }
    const int last_row = min(m0 + F3_BR, n) - 1;
    const int kv_end = ctx - n + last_row + 1;
    const int num_tiles = (kv_end + F3_BC - 1) / F3_BC;
    load_kv_tile3<D>(sk, sv, kv, s, kvh, 0, ctx);
    cp_async_commit();

    float o[MT][NT_O][4];
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int i = 0; i < NT_O; i++) o[mt][i][0] = o[mt][i][1] = o[mt][i][2] = o[mt][i][3] = 0.0f;
    float m_row[MT][2], l_row[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; mt++) m_row[mt][0] = m_row[mt][1] = -INFINITY, l_row[mt][0] = l_row[mt][1] = 0.0f;
    // Query m0 + wrow + 16mt + g (+8) sees keys <= its limit.
    const int lim0 = ctx - n + m0 + wrow + g;
    // The last key any row of this warp sees (rows past n included: harmless).
    const int warp_last = ctx - n + m0 + wrow + 16 * MT - 1;

    // ldmatrix addresses. Chunk c = 8h + u (u < 8) of row R + x (R a multiple
    // of 8) is at swz(x, u) + R * CH * 16 + h * 128: the swizzle only touches
    // the low 3 bits of the chunk. So each thread keeps 4 offsets per operand
    // (u even: 0, 2, 4, 6) and the rest are immediates; computing swz() for
    // every (k-step, n-tile), the compiler hoists dozens of loop-invariant
    // addresses into registers and spills.
    // V fragments are addressed like Q's (rows lane % 16, chunk + lane / 16):
    // one set of offsets, a_off, serves both.
    uint32_t a_off[4], k_off[4];
#pragma unroll
    for (int u = 0; u < 4; u++) {
        a_off[u] = swz<CH>(lane % 16, 2 * u + lane / 16);
        k_off[u] = swz<CH>((lane / 16) * 8 + lane % 8, 2 * u + (lane / 8) % 2);
    }
    const uint32_t qw = sq + wrow * CH * 16;  // the warp's first Q row

    for (int t = 0; t < num_tiles; t++) {
        const int buf = t & 1;
        if (t + 1 < num_tiles) {
            load_kv_tile3<D>(sk + (buf ^ 1) * TILE_BYTES, sv + (buf ^ 1) * TILE_BYTES, kv, s, kvh, (t + 1) * F3_BC,
                             ctx);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        const int j0 = t * F3_BC;
        if (j0 <= warp_last) {  // else every row of this warp is past its diagonal: nothing to add
            const uint32_t kt = sk + buf * TILE_BYTES, vt = sv + buf * TILE_BYTES;
            // S = Q K^T: per k-step, the Q fragments of both m-tiles
            // (ldmatrix from the resident Q tile), then the K fragments of two
            // n-tiles at a time: lanes 0-7 keys 16np+0..7 at d chunk 2kk,
            // lanes 8-15 the same keys at chunk 2kk+1 (b0, b1 of n-tile 2np),
            // lanes 16-31 keys 16np+8..15 (n-tile 2np+1).
            float sc[MT][NT_S][4];
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int nt = 0; nt < NT_S; nt++) sc[mt][nt][0] = sc[mt][nt][1] = sc[mt][nt][2] = sc[mt][nt][3] = 0.0f;
#pragma unroll
            for (int kk = 0; kk < KSTEPS; kk++) {
                uint32_t qf[MT][4];
#pragma unroll
                for (int mt = 0; mt < MT; mt++)
                    ldmatrix_x4(qf[mt], qw + a_off[kk % 4] + mt * 16 * CH * 16 + (kk / 4) * 128);
#pragma unroll
                for (int np = 0; np < NT_S / 2; np++) {
                    uint32_t b[4];
                    ldmatrix_x4(b, kt + k_off[kk % 4] + np * 16 * CH * 16 + (kk / 4) * 128);
#pragma unroll
                    for (int mt = 0; mt < MT; mt++) {
                        mma_bf16_16x8x16(sc[mt][2 * np], qf[mt], b[0], b[1]);
                        mma_bf16_16x8x16(sc[mt][2 * np + 1], qf[mt], b[2], b[3]);
                    }
                }
            }
            // The mask, on tiles past the warp's first row's limit.
            if (j0 + F3_BC - 1 > ctx - n + m0 + wrow) {
#pragma unroll
                for (int mt = 0; mt < MT; mt++)
#pragma unroll
                    for (int nt = 0; nt < NT_S; nt++)
#pragma unroll
                        for (int e = 0; e < 4; e++) {
                            const int j = j0 + nt * 8 + 2 * c4 + (e & 1);
                            if (j > lim0 + 16 * mt + 8 * (e >> 1)) sc[mt][nt][e] = -INFINITY;
                        }
            }
            // Online softmax, as in version 2, per m-tile. A row that sees no
            // key of this tile keeps its max; every row saw key 0 in tile 0
            // (tile 0 is never skipped: j0 = 0 <= warp_last).
            uint32_t pf[MT][F3_BC / 16][4];
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                float rescale[2];
#pragma unroll
                for (int r = 0; r < 2; r++) {
                    float mx = -INFINITY;
#pragma unroll
                    for (int nt = 0; nt < NT_S; nt++) mx = fmaxf(mx, fmaxf(sc[mt][nt][2 * r], sc[mt][nt][2 * r + 1]));
                    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
                    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
                    const float m_new = fmaxf(m_row[mt][r], mx * scale_log2);
                    rescale[r] = exp2f(m_row[mt][r] - m_new);
                    m_row[mt][r] = m_new;
                    l_row[mt][r] *= rescale[r];
                }
#pragma unroll
                for (int i = 0; i < NT_O; i++) {
                    o[mt][i][0] *= rescale[0];
                    o[mt][i][1] *= rescale[0];
                    o[mt][i][2] *= rescale[1];
                    o[mt][i][3] *= rescale[1];
                }
#pragma unroll
                for (int nt = 0; nt < NT_S; nt++) {
                    float p[4];
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        p[e] = exp2f(fmaf(sc[mt][nt][e], scale_log2, -m_row[mt][e >> 1]));
                        l_row[mt][e >> 1] += p[e];
                    }
                    pf[mt][nt / 2][(nt % 2) * 2 + 0] = pack_bf16x2(p[0], p[1]);
                    pf[mt][nt / 2][(nt % 2) * 2 + 1] = pack_bf16x2(p[2], p[3]);
                }
            }
            // O += P V: each V fragment serves both m-tiles.
#pragma unroll
            for (int kp = 0; kp < F3_BC / 16; kp++) {
#pragma unroll
                for (int dn = 0; dn < NT_O; dn += 2) {
                    uint32_t b[4];
                    ldmatrix_x4_trans(b, vt + a_off[(dn % 8) / 2] + kp * 16 * CH * 16 + (dn / 8) * 128);
#pragma unroll
                    for (int mt = 0; mt < MT; mt++) {
                        mma_bf16_16x8x16(o[mt][dn], pf[mt][kp], b[0], b[1]);
                        mma_bf16_16x8x16(o[mt][dn + 1], pf[mt][kp], b[2], b[3]);
                    }
                }
            }
        }
        __syncthreads();
    }

#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int r = 0; r < 2; r++) {
            float l = l_row[mt][r];
            l += __shfl_xor_sync(0xffffffffu, l, 1);
            l += __shfl_xor_sync(0xffffffffu, l, 2);
            const int row = m0 + wrow + 16 * mt + g + 8 * r;
            if (row >= n) continue;
            const float inv = 1.0f / l;
            __nv_bfloat162 *dst =
                reinterpret_cast<__nv_bfloat162 *>(out + ((long long)(first + row) * H + h) * D + 2 * c4);
#pragma unroll
            for (int i = 0; i < NT_O; i++)
                dst[i * 4] = __floats2bfloat162_rn(o[mt][i][2 * r] * inv, o[mt][i][2 * r + 1] * inv);
        }
}

template <int D, class KV>
static int launch_flash3_d(bf16 *out, const bf16 *q, long long q_stride, KV kv, const int32_t *cu_seqlens_q,
                           int num_seqs, int max_seqlen_q, int H, int Hkv, float scale, cudaStream_t stream) {
    const int smem = (F3_BR + 4 * F3_BC) * D * 2;  // Q, then K and V double buffered: 64 KB at D = 128
    if (CUDA_TRY(cudaFuncSetAttribute(flash3_prefill_kernel<D, KV>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      smem)))
        return -1;
    const int tiles = (max_seqlen_q + F3_BR - 1) / F3_BR;
    if (tiles > 65535)
        return mv_error("attention prefill v3: max_seqlen_q %d needs %d query tiles, over the grid's z limit 65535",
                        max_seqlen_q, tiles);
    dim3 grid((unsigned)H, (unsigned)num_seqs, (unsigned)tiles);
    flash3_prefill_kernel<D, KV><<<grid, F3_THREADS, smem, stream>>>(out, q, q_stride, kv, cu_seqlens_q, H, Hkv,
                                                                     scale * 1.4426950408889634f);
    return 0;
}

template <class KV>
static int launch_flash3(bf16 *out, const bf16 *q, long long q_stride, KV kv, const int32_t *cu_seqlens_q,
                         int num_seqs, int max_seqlen_q, int H, int Hkv, int D, float scale, cudaStream_t stream) {
    if (D == 128)
        return launch_flash3_d<128>(out, q, q_stride, kv, cu_seqlens_q, num_seqs, max_seqlen_q, H, Hkv, scale, stream);
    return launch_flash3_d<64>(out, q, q_stride, kv, cu_seqlens_q, num_seqs, max_seqlen_q, H, Hkv, scale, stream);
}

/*
 * kernels/attention_flash.cuh - version 2 of prefill attention:
 * FlashAttention-2 on the tensor cores (mma.sync m16n8k16, bf16 in, fp32
 * accumulators). Included by attention.cu (PagedKV, ContigKV, seq_queries).
 *
 * Napkin math (16 prompts x 1024 tokens, 16 heads, D = 128, causal):
 * 4 * D * H * (16 * 1024 * 1025 / 2) = 68.8 GFLOP, while Q, K, V and O are
 * ~100 MB: ~700 flop per byte, far past the H200's ~100 flop/byte of HBM.
 * Compute-bound: the goal is the tensor cores' rate. At 200 TFLOP/s: 0.34 ms.
 *
 * The CTA: 4 warps (128 threads), a tile of BR = 64 queries of one
 * (sequence, head), 16 rows per warp; grid (query tiles, H, S), the tiles
 * with the most keys (the last ones, causal) launched first.
 *   1. Q tile [64, D] -> shared (cp.async) -> registers, once, as mma A
 *      fragments (ldmatrix.x4): D/16 fragments of 4 registers.
 *   2. Key tiles of BC = 64 keys, K and V [64, D] each, double buffered in
 *      shared memory: tile t + 1 is loaded with cp.async (through the
 *      addressing policy: block table or packed rows; rows past the
 *      context zero-filled) while tile t is computed.
 *   3. S = Q K^T: per warp [16, 64] fp32 in registers, 8 n-tiles of 8 keys;
 *      K fragments by ldmatrix (no .trans: a K row [key][d] is a column of
 *      B = K^T, which is what the "col" B operand wants).
 *   4. Online softmax on the accumulator fragments: thread (g = lane/4,
 *      c = lane%4) holds rows g and g+8 of its warp's 16, columns 2c, 2c+1
 *      of each n-tile; a row's max is the thread's max then two xor-shuffles
 *      across the quad. m in log2 units (scores times scale*log2 e), exp2f.
 *      l is kept per thread (its columns only) and summed over the quad at
 *      the end: every rescale is the same across a quad.
 *   5. O += P V: P rounded to bf16 straight from the S fragments (the C
 *      layout of two n-tiles is the A layout of one k-step: no shuffles),
 *      V fragments by ldmatrix.trans (V [key][d] row-major is B row-major;
 *      .trans gives the "col" layout). O: per warp [16, D] fp32 in registers.
 * Causal tiles: query rows m0 .. m0+63 see keys up to ctx - n + m0 + 63 at
 * most, so the loop stops there; a key tile needs the mask only if its last
 * key is past ctx - n + m0 (the first row's limit): one or two tiles per
 * query tile; the others skip it.
 * Shared memory rows of D bf16 are D/8 16-byte chunks; chunk c of row r is
 * stored at chunk c ^ (r % 8), so the 8 rows one ldmatrix reads (same c)
 * land in 8 different bank groups (no conflicts), and a cp.async of a row's
 * chunks stays conflict-free too.
 */
#pragma once

enum { FL_BR = 64, FL_BC = 64, FL_WARPS = 4, FL_THREADS = 32 * FL_WARPS };

// C[16x8] += A[16x16] B[16x8], bf16 in, fp32 accumulators. Fragments
// (g = lane/4, c = lane%4): A a0 (row g, cols 2c..2c+1), a1 (row g+8),
// a2 (row g, cols 2c+8..), a3 (row g+8, cols 2c+8..); B b0 (rows 2c..2c+1,
// col g), b1 (rows 2c+8..); C c0, c1 (row g, cols 2c, 2c+1), c2, c3 (row g+8).
__device__ __forceinline__ void mma_bf16_16x8x16(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);  // .x (the lower address, lower column) = lo
    return *reinterpret_cast<uint32_t *>(&v);
}

// Load key rows j0 .. j0+63 of sequence s (K and V) into one buffer; rows
// at or past ctx are zero-filled (their V must be 0, not the cache's
// leftovers: a masked weight 0 times a NaN would still be NaN).
template <int D, class KV>
__device__ __forceinline__ void load_kv_tile(uint32_t k_dst, uint32_t v_dst, const KV &kv, int s, int kvh, int j0,
                                             int ctx) {
    constexpr int CH = D / 8;
#pragma unroll
    for (int i = 0; i < FL_BC * CH / FL_THREADS; i++) {
        const int idx = threadIdx.x + i * FL_THREADS;
        const int r = idx / CH, c = idx % CH, j = j0 + r;
        const bool valid = j < ctx;
        const long long row = valid ? kv.key_row(s, j) : 0;
        cp_async16(k_dst + swz<CH>(r, c), kv.k + row * kv.k_stride + (long long)kvh * D + c * 8, valid ? 16 : 0);
        cp_async16(v_dst + swz<CH>(r, c), kv.v + row * kv.v_stride + (long long)kvh * D + c * 8, valid ? 16 : 0);
    }
}

template <int D, class KV>
__global__ void __launch_bounds__(FL_THREADS, 2)
flash_prefill_kernel(bf16 *out, const bf16 *q, long long q_stride, KV kv, const int32_t *cu_seqlens_q, int H,
                     int Hkv, float scale_log2) {
    constexpr int CH = D / 8;           // 16-byte chunks per row
    constexpr int KSTEPS = D / 16;      // k-steps of S = Q K^T (over d)
    constexpr int NT_S = FL_BC / 8;     // n-tiles of S (8 keys each)
    constexpr int NT_O = D / 8;         // n-tiles of O (8 dims each)
    constexpr int TILE_BYTES = FL_BC * D * 2;
    extern __shared__ __align__(128) uint8_t smem[];
    const uint32_t sq = smem_u32(smem);               // Q [64, D]
    const uint32_t sk = sq + FL_BR * D * 2;           // K [2][64, D]
    const uint32_t sv = sk + 2 * TILE_BYTES;          // V [2][64, D]

    const int s = blockIdx.z, h = blockIdx.y;
    const int qtile = gridDim.x - 1 - blockIdx.x;  // the longest (last) query tiles first
    int first;
    const int n = seq_queries(cu_seqlens_q, s, &first);
    const int m0 = qtile * FL_BR;
    if (m0 >= n) return;
    const int ctx = kv.num_keys(s);
    const int kvh = h / (H / Hkv);
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int g = lane / 4, c4 = lane % 4;

    // Q tile: rows m0 .. m0+63 of the sequence (past n: zeros, never stored).
#pragma unroll
    for (int i = 0; i < FL_BR * CH / FL_THREADS; i++) {
        const int idx = threadIdx.x + i * FL_THREADS;
        const int r = idx / CH, c = idx % CH;
        const bool valid = m0 + r < n;
        const bf16 *src = q + (long long)(first + (valid ? m0 + r : 0)) * q_stride + (long long)h * D + c * 8;
        cp_async16(sq + swz<CH>(r, c), src, valid ? 16 : 0);
    }
    // Keys: 0 .. kv_end - 1, where kv_end is one past the last key the last
    // valid row of the tile sees.
    const int last_row = min(m0 + FL_BR, n) - 1;
    const int kv_end = ctx - n + last_row + 1;
    const int num_tiles = (kv_end + FL_BC - 1) / FL_BC;
    load_kv_tile<D>(sk, sv, kv, s, kvh, 0, ctx);
    cp_async_commit();  // group: Q and key tile 0

    uint32_t qf[KSTEPS][4];
    float o[NT_O][4];
#pragma unroll
    for (int i = 0; i < NT_O; i++) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
    float m_row[2] = {-INFINITY, -INFINITY};  // rows g and g+8, log2 units
    float l_row[2] = {0.0f, 0.0f};            // this thread's columns' part of the row sums
    // Row limits: query m0 + warp*16 + g (+8) sees keys <= ctx - n + that row.
    const int row0 = m0 + warp * 16 + g;
    const int limit[2] = {ctx - n + row0, ctx - n + row0 + 8};

    for (int t = 0; t < num_tiles; t++) {
        const int buf = t & 1;
        if (t + 1 < num_tiles) {
            load_kv_tile<D>(sk + (buf ^ 1) * TILE_BYTES, sv + (buf ^ 1) * TILE_BYTES, kv, s, kvh, (t + 1) * FL_BC,
                            ctx);
            cp_async_commit();
            cp_async_wait<1>();  // everything but the newest group: tile t (and Q) are in
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        if (t == 0) {
            // Q fragments, once: k-step kk covers d 16kk .. 16kk+15. Lanes
            // 0-15 address rows 0-15 at chunk 2kk (matrices 0, 1: a0, a1),
            // lanes 16-31 the same rows at chunk 2kk+1 (matrices 2, 3: a2, a3).
#pragma unroll
            for (int kk = 0; kk < KSTEPS; kk++)
                ldmatrix_x4(qf[kk], sq + swz<CH>(warp * 16 + lane % 16, 2 * kk + lane / 16));
        }
        const uint32_t kt = sk + buf * TILE_BYTES, vt = sv + buf * TILE_BYTES;

        // S = Q K^T for this warp's 16 rows and the tile's 64 keys.
        float sc[NT_S][4];
#pragma unroll
        for (int nt = 0; nt < NT_S; nt++) {
            sc[nt][0] = sc[nt][1] = sc[nt][2] = sc[nt][3] = 0.0f;
#pragma unroll
            for (int kk = 0; kk < KSTEPS; kk += 2) {
                // Keys 8nt .. 8nt+7 (lane % 8), d chunks 2kk .. 2kk+3
                // (lane / 8): b0, b1 of k-step kk, then of k-step kk+1.
                uint32_t b[4];
                ldmatrix_x4(b, kt + swz<CH>(nt * 8 + lane % 8, 2 * kk + lane / 8));
                mma_bf16_16x8x16(sc[nt], qf[kk], b[0], b[1]);
                mma_bf16_16x8x16(sc[nt], qf[kk + 1], b[2], b[3]);
            }
        }
        // The causal mask, only on tiles that reach past the first row's limit.
        const int j0 = t * FL_BC;
        if (j0 + FL_BC - 1 > ctx - n + m0) {
#pragma unroll
            for (int nt = 0; nt < NT_S; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int j = j0 + nt * 8 + 2 * c4 + (e & 1);
                    if (j > limit[e >> 1]) sc[nt][e] = -INFINITY;
                }
        }
        // Online softmax. Key 0 is in tile 0 and every row sees it, so
        // after tile 0 each row's max is finite.
        float rescale[2];
#pragma unroll
        for (int r = 0; r < 2; r++) {
            float mx = -INFINITY;
#pragma unroll
            for (int nt = 0; nt < NT_S; nt++) mx = fmaxf(mx, fmaxf(sc[nt][2 * r], sc[nt][2 * r + 1]));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            // A row whose keys in this tile are all masked keeps its max
            // (mx = -inf); it was finite since tile 0.
            const float m_new = fmaxf(m_row[r], mx * scale_log2);
            rescale[r] = exp2f(m_row[r] - m_new);  // 0 on tile 0 (m_row = -inf)
            m_row[r] = m_new;
            l_row[r] *= rescale[r];
        }
#pragma unroll
        for (int i = 0; i < NT_O; i++) {
            o[i][0] *= rescale[0];
            o[i][1] *= rescale[0];
            o[i][2] *= rescale[1];
            o[i][3] *= rescale[1];
        }
        // P = 2^(S * scale * log2 e - m), then to bf16 A fragments: k-step
        // kp (keys 16kp .. 16kp+15) is n-tiles 2kp (a0, a1) and 2kp+1 (a2, a3).
        uint32_t pf[FL_BC / 16][4];
#pragma unroll
        for (int nt = 0; nt < NT_S; nt++) {
            float p[4];
#pragma unroll
            for (int e = 0; e < 4; e++) {
                p[e] = exp2f(fmaf(sc[nt][e], scale_log2, -m_row[e >> 1]));  // masked: 2^-inf = 0
                l_row[e >> 1] += p[e];
            }
            pf[nt / 2][(nt % 2) * 2 + 0] = pack_bf16x2(p[0], p[1]);
            pf[nt / 2][(nt % 2) * 2 + 1] = pack_bf16x2(p[2], p[3]);
        }
        // O += P V. For each pair of d n-tiles (16 dims) and key k-step kp:
        // lanes 0-7 address keys 16kp+0..7, lanes 8-15 keys 16kp+8..15, at
        // the first 8 dims; lanes 16-31 the same keys at the next 8 dims.
#pragma unroll
        for (int kp = 0; kp < FL_BC / 16; kp++) {
#pragma unroll
            for (int dn = 0; dn < NT_O; dn += 2) {
                uint32_t b[4];
                ldmatrix_x4_trans(b, vt + swz<CH>(kp * 16 + lane % 16, dn + lane / 16));
                mma_bf16_16x8x16(o[dn], pf[kp], b[0], b[1]);
                mma_bf16_16x8x16(o[dn + 1], pf[kp], b[2], b[3]);
            }
        }
        __syncthreads();  // buffer `buf` is refilled by the next iteration's load
    }

    // Finish: the quad's partial row sums, then O / l, two bf16 per store.
#pragma unroll
    for (int r = 0; r < 2; r++) {
        l_row[r] += __shfl_xor_sync(0xffffffffu, l_row[r], 1);
        l_row[r] += __shfl_xor_sync(0xffffffffu, l_row[r], 2);
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int row = row0 + 8 * r;
        if (row >= n) continue;
        const float inv = 1.0f / l_row[r];
        __nv_bfloat162 *dst =
            reinterpret_cast<__nv_bfloat162 *>(out + ((long long)(first + row) * H + h) * D + 2 * c4);
#pragma unroll
        for (int i = 0; i < NT_O; i++)
            dst[i * 4] = __floats2bfloat162_rn(o[i][2 * r] * inv, o[i][2 * r + 1] * inv);  // dims 8i + 2c4, +1
    }
}

template <int D, class KV>
static int launch_flash_d(bf16 *out, const bf16 *q, long long q_stride, KV kv, const int32_t *cu_seqlens_q,
                          int num_seqs, int max_seqlen_q, int H, int Hkv, float scale, cudaStream_t stream) {
    const int smem = (FL_BR + 4 * FL_BC) * D * 2;  // Q, then K and V double buffered: 80 KB at D = 128
    // Over 48 KB of dynamic shared memory must be asked for, per function
    // and per device: asked every time (a host-side call, no GPU work), so
    // a second GPU of a tensor-parallel engine gets it too.
    if (CUDA_TRY(cudaFuncSetAttribute(flash_prefill_kernel<D, KV>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem)))
        return -1;
    dim3 grid((unsigned)((max_seqlen_q + FL_BR - 1) / FL_BR), (unsigned)H, (unsigned)num_seqs);
    flash_prefill_kernel<D, KV><<<grid, FL_THREADS, smem, stream>>>(out, q, q_stride, kv, cu_seqlens_q, H, Hkv,
                                                                    scale * 1.4426950408889634f);
    return 0;
}

template <class KV>
static int launch_flash(bf16 *out, const bf16 *q, long long q_stride, KV kv, const int32_t *cu_seqlens_q,
                        int num_seqs, int max_seqlen_q, int H, int Hkv, int D, float scale, cudaStream_t stream) {
    if (D == 128) return launch_flash_d<128>(out, q, q_stride, kv, cu_seqlens_q, num_seqs, max_seqlen_q, H, Hkv, scale, stream);
    return launch_flash_d<64>(out, q, q_stride, kv, cu_seqlens_q, num_seqs, max_seqlen_q, H, Hkv, scale, stream);
}

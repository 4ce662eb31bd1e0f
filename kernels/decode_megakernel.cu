/*
 * kernels/decode_megakernel.cu - the decoder layers of a decode step in one
 * persistent kernel (see decode_megakernel.h for what it computes and where
 * it applies).
 *
 * Napkin math (Qwen3-0.6B, one row, one H200). A layer reads 31.5 MB of
 * weights: 7.5 us at the 4.2 TB/s copy bandwidth, 210 us for 28 layers. As
 * separate kernels the layer is ten dependent launches, and a kernel costs
 * at least ~1.6 us on the chain whatever it moves; a projection's GEMV, a
 * one-shot read that starts cold, gets 31-53% of copy (the engine measures
 * 17.0 us for the four, against 7.5). Here one block per SM runs the whole
 * layer stack. Kernel boundaries become grid barriers, 0.93 us each
 * measured with 132 blocks (tests/gpu/barrier_probe.cu), seven a layer; and
 * the weights no longer start cold: each block's rows of the next
 * projection are copied into its shared memory by the bulk copy engine
 * while the current phases run.
 *
 * One block per SM: 8 consumer warps that compute (two teams of a decode
 * piece's DEC_THREADS while attention runs) and one producer warp whose
 * first lane streams the weights; the two hand each buffer back and forth
 * by mbarriers in shared memory (full / empty). Shared memory:
 *
 *   A    the block's rows of qkv_proj, then of gate_up_proj   (Qwen3-0.6B: 64 / 96 KB)
 *   B    its rows of o_proj, then of down_proj                (32 / 48 KB)
 *   X    the GEMV's input rows [M, K] bf16 (the normed hidden rows, the
 *        attention output, SiluAndMul of gate_up), or the decode pieces'
 *        combine buffers (one per team) while attention runs
 *   P    the GEMV's per-slice sums, when a row's K is split
 *
 * A block's rows of a projection of N rows are row pairs p0 .. p1 - 1 of
 * N / 2, an equal share (15 or 16 pairs of qkv_proj's 2,048 on 132 SMs):
 * contiguous in the weight. The producer walks every projection of every
 * layer in the order the consumers take them, and refills a buffer once the
 * consumers have released it and its gate has opened: thread 0 has arrived
 * at the grid barrier named for that refill (MEGAKERNEL_GATES_DEFAULT; a
 * copy still in flight when thread 0 releases a barrier holds the release
 * back). A is refilled with gate_up after the attention pieces, with the
 * next layer's qkv after gate_up; B with down after o_proj, with the next
 * o_proj after the next qkv (the arrows below: which buffer a phase frees,
 * not when its refill starts). It copies
 * a share in pieces of 4 KB with at most 4 in flight (16 KB a block, 2 MB
 * GPU-wide): a whole share requested at once (up to 96 KB a block, 12.6 MB
 * GPU-wide) would sit in front of every later access of the SM, the grid
 * barrier's polls included (docs/09-engine.md, "A decode megakernel").
 *
 * The phases of a layer and the grid barriers between them:
 *
 *   1  [residual += x] RMSNorm -> X (every block, all M rows: 2 KB each from
 *      L2), qkv GEMV from A -> qkv;  A <- gate_up                     | barrier
 *   2  q/k norm + RoPE (LANES lanes a head), k and v into the cache  | barrier
 *      (MV_MEGAKERNEL_FUSED_ROPE=0 only: by default each decode piece
 *      norms and rotates its own queries, and the piece with a row's new
 *      key stores it and its value: rope_prep, one phase and barrier less)
 *   3  decode pieces (kv head, row, piece)                           | barrier
 *   4  their reduction (head, row), when the context is split        | barrier
 *   5  attn -> X, o_proj GEMV from B -> x;  B <- down                | barrier
 *   6  residual += x, RMSNorm -> X, gate_up GEMV from A -> gate_up;
 *      A <- next qkv                                                 | barrier
 *   7  SiluAndMul(gate_up) -> X, down GEMV from B -> x;  B <- next o | barrier
 *
 * Every block computes the norms itself (a few KB from L2) instead of one
 * block writing the result and all waiting for it: one barrier less per
 * norm. Block 0 writes the updated residual into the other of two residual
 * buffers, since the other blocks are still reading the one it came from.
 *
 * The bits. The GEMV's sum of a row is taken in the order of the GEMV
 * linear_cuda runs at M rows: version 2, linear_gemv_kernel's (per lane its
 * chunks in slab order, the slices' warp sums added in order:
 * linear_gemv_k_split fixes the slices, whichever warp computes which), or,
 * under MV_LINEAR_GEMV=3, version 3's (kernels/gemv_mma.cuh: mk::gemv_mma,
 * with the weight rows padded 64 bytes in shared memory), the
 * norm's in rmsnorm_kernel_v3's (one 8-wide vector per thread, a block sum
 * over the warps: the unused warps add zeros, which changes no bit of a sum
 * of squares), q/k norm and
 * RoPE with chapter 05's helpers in version 6's order (MATH 1: rotate, then
 * scale), SiluAndMul with kernels/activation.cuh's expression and rounding,
 * and attention by chapter 07's own device functions. Activations written in
 * the kernel are read through L2 (__ldcg): a grid barrier does not
 * invalidate the read-only path's cache.
 */
#include "kernels/decode_megakernel.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/check.h"
#include "kernels/activation.cuh"
#include "kernels/attention.h"
#include "kernels/common.cuh"
#include "kernels/gemv_mma.cuh"
#include "kernels/grid_barrier.cuh"
#include "kernels/mbarrier.cuh"
#include "kernels/linear.h"
#include "kernels/rmsnorm.cuh"
#include "kernels/rope_fused.cuh"

typedef __nv_bfloat16 bf16;
#include "kernels/paged_kv.cuh"
#define MV_DECODE_DEVICE_ONLY
#include "kernels/attention_decode.cuh"
#include "kernels/decode_rope_prep.cuh"

namespace mk {

// NW consumer warps compute, in teams of a decode piece's DEC_THREADS while
// attention runs; one more warp, the producer, streams the weights.
// DEFAULT_NW is what the engine runs; MV_MEGAKERNEL_WARPS picks one of
// EXTRA_NW for Qwen3-0.6B's head shape (D 128, G 2), for experiments.
constexpr int DEFAULT_NW = 8, MAX_RING = 8;
template <int NW>
struct cfg {
    static constexpr int CONSUMERS = 32 * NW, THREADS = CONSUMERS + 32, TEAMS = CONSUMERS / DEC_THREADS;
    // Named barriers: 1 the consumers', 2 .. 1 + TEAMS the teams' (16 in hardware).
    static_assert(NW % (DEC_THREADS / 32) == 0 && TEAMS + 2 <= 16, "whole teams, within the named barriers");
};

// The consumers' own barrier (named barrier 1): the producer never waits
// for them there. Built with MV_MK_CSYNC_MBAR (an experiment: chapter 09,
// exercise 12), an mbarrier of the consumers' arrivals in its place, which
// compute-sanitizer's racecheck follows.
#ifdef MV_MK_CSYNC_MBAR
__shared__ uint64_t csync_bar;
template <int NW>
struct csync {
    static __device__ __forceinline__ void sync() { mv_mbar::mbar_arrive_wait(&csync_bar); }
};
#else
template <int NW>
struct csync {
    static __device__ __forceinline__ void sync() {
        asm volatile("bar.sync 1, %0;" ::"n"(cfg<NW>::CONSUMERS) : "memory");
    }
};
#endif

// A team's barrier while attention runs (named barriers 2, 3, ...).
struct team_sync {
    static __device__ __forceinline__ void sync() {
        asm volatile("bar.sync %0, %1;" ::"r"(2 + (int)threadIdx.x / DEC_THREADS), "n"((int)DEC_THREADS) : "memory");
    }
};

struct params {
    megakernel_args_t a;
    int qkv_n, qn;             // qkv rows, nq * D
    int ks_h, ks_qn, ks_i;     // the GEMV's K split for K = H, nq * D, I
    int num_splits, split_len; // decode attention (version 3: split_len = -TILE)
    int groups_per_kv;
    float scale_log2;
    int block_shift;
    long long num_slots;
    unsigned off_b, off_x, off_part, off_bar;  // shared-memory offsets (A at 0)
    int fused_rope;                  // 1: q/k norm + RoPE + KV store in the attention pieces (rope_prep)
    unsigned chunk;                  // bytes a bulk copy of the producer
    int ring;                        // copies it keeps in flight
    unsigned pad;                    // bytes after each row of W in shared memory (GEMV version 3: 64)
    // When the producer may start a refill (MV_MEGAKERNEL_GATES): gated 0,
    // as soon as the consumers release the buffer; 1, also not before the
    // block's thread 0 has arrived at the grid barrier that ends phase slot
    // PHASE_SLOTS l + gate[j], for projection j of layer l.
    int gated;
    int gate[4];
    // 1: SiluAndMul in gate_up's GEMV (MV_MEGAKERNEL_SILU, GEMV version 2
    // only): a block's share is gate rows [p0, p1) and up rows [I + p0, I + p1),
    // each warp's row pair a gate row and its up row, and the GEMV writes
    // SiluAndMul of the two, rounded as silu_and_mul's inputs and output are,
    // to gate_up[M, I]; down then stages its input as a plain copy.
    int silu_epi;
    // 2: the split attention's reduction with all its loads first
    // (decode_reduce_one_v2); 1: decode_reduce_one (MV_MEGAKERNEL_REDUCE).
    int reduce_v;
    // 1: the GEMV with x in registers (gemv_xr, MV_MEGAKERNEL_XREG, the default); 0: mk::gemv.
    int xreg;
};

// ---- the bulk copy engine and its barriers: kernels/mbarrier.cuh (mv_mbar::) -----------

using namespace mv_mbar;

// A block's share of a projection of N rows: row pairs [p0, p1) of N / 2.
__device__ __forceinline__ void share(int N, int *row0, int *rows) {
    const long long pairs = N / 2;
    const long long p0 = pairs * blockIdx.x / gridDim.x, p1 = pairs * (blockIdx.x + 1) / gridDim.x;
    *row0 = (int)(2 * p0);
    *rows = (int)(2 * (p1 - p0));
}

// The weights' two buffers, handed between the producer and the consumers
// by shared-memory mbarriers: full[i], of one arrival, the producer arrives
// at when a projection's rows have landed in buffer i, and the consumers
// wait on; empty[i], of CONSUMERS arrivals, every consumer thread arrives at
// when it is done reading the buffer, and the producer waits on before it
// refills it. The k-th fill of a buffer is phase k of both (parity k & 1):
// neither side can get two fills ahead of the other. The ring[] of barriers
// (the bulk copies' transaction counts) paces the copies.
//
// The gates (params::gate): gate[j], of one arrival, thread 0 arrives at
// once it has arrived at the grid barrier that ends the phase named for
// projection j's refill, and the producer waits on before it starts that
// refill. A layer's phases are numbered 0 qkv, 1 q/k norm + RoPE, 2
// attention pieces, 3 their reduction, 4 o_proj, 5 gate_up, 6 down; phase k
// of layer l is slot PHASE_SLOTS l + k. Each gate's k-th fill is phase k of
// its barrier, as with full and empty: a gate's next arrival comes after
// the phase that reads its projection, which needs the refill it opened.
enum {
    BAR_RING = 0,
    BAR_FULL = MAX_RING,
    BAR_EMPTY = MAX_RING + 2,
    BAR_NORM = MAX_RING + 4,
    BAR_GATE = MAX_RING + 6,
    NUM_BARS = MAX_RING + 10
};
enum { PHASE_SLOTS = 7 };
// The default gates: no refill starts before thread 0 has arrived at the
// grid barrier after the phase that released its buffer (a copy in flight
// there holds the barrier's release back, about 0.8 us), and two wait one
// phase more: qkv after the layer before's gate_up (its release), o_proj
// after qkv (not while the qkv phase stages its norm), gate_up after the
// attention pieces (not while they read the KV cache), down after o_proj
// (its release). Chosen on an H100 (docs/perf-notes.md, runs 69 to 71).
#define MEGAKERNEL_GATES_DEFAULT "-2,0,2,4"

// A buffer as the consumers see it: which rows it holds now, and how many
// fills of it they have read.
struct wbuf {
    uint4 *mem;
    uint64_t *full, *empty;
    unsigned uses;
    int row0, rows;
};

// Wait for the buffer's next projection (of N rows): every consumer thread.
__device__ __forceinline__ void wait(wbuf &b, int N) {
    share(N, &b.row0, &b.rows);
    mbar_wait(b.full, b.uses & 1u);
}

// Done reading it (each thread for itself): the producer may refill it.
__device__ __forceinline__ void release(wbuf &b) {
    mbar_arrive(b.empty);
    b.uses++;
}

// The producer, lane 0 of the last warp (the other lanes have nothing to
// do): every projection of every layer, in the order the consumers take
// them (qkv into buffer 0, o_proj into 1, gate_up into 0, down into 1, then
// the next layer), each block's share in copies of p.chunk bytes with at
// most p.ring in flight. A whole share requested at once (up to 96 KB a
// block, 12.6 MB from all SMs) would sit in front of every other access of
// the SM until it landed, the grid barriers' too.
__device__ void producer(const params &p, uint4 *const bufs[2], uint64_t *bars) {
    const megakernel_args_t &a = p.a;
    const int H = a.hidden, I = a.intermediate, R = p.ring;
    uint64_t *ring = bars + BAR_RING;
    unsigned issued = 0, fills[2] = {0u, 0u};
    for (int l = 0; l < a.num_layers; l++) {
        const megakernel_layer_t ly = a.d_layers[l];
        for (int j = 0; j < 4; j++) {
            const int buf = j & 1;
            const bf16_t *w = j == 0 ? ly.qkv : j == 1 ? ly.o_proj : j == 2 ? ly.gate_up : ly.down;
            const int N = j == 0 ? p.qkv_n : j == 2 ? 2 * I : H, K = j == 1 ? p.qn : j == 3 ? I : H;
            if (fills[buf] > 0) {
                mbar_wait(bars + BAR_EMPTY + buf, (fills[buf] - 1) & 1u);
                // The gate's fills so far: one a layer, from layer 0 for gate_up and
                // down, from layer 1 for qkv and o_proj (their layer 0 fills are first).
                if (p.gated) mbar_wait(bars + BAR_GATE + j, (unsigned)(j >= 2 ? l : l - 1) & 1u);
            }
            int row0, rows;
            share(N, &row0, &rows);
            // Rows padded in shared memory (p.pad bytes after each, GEMV
            // version 3): a row at a time; unpadded: the share as one
            // segment, or with SiluAndMul in gate_up's GEMV two: its gate
            // rows [row0 / 2, + rows / 2) and the same rows of up, I rows on.
            const bool pair_gu = j == 2 && p.silu_epi;
            const unsigned row_bytes = (unsigned)K * 2u, segs = p.pad ? (unsigned)rows : pair_gu ? 2u : 1u;
            const unsigned bytes = p.pad ? row_bytes : (unsigned)(pair_gu ? rows / 2 : rows) * row_bytes;
            const unsigned per_seg = (bytes + p.chunk - 1) / p.chunk;
            const long long first_row = pair_gu ? row0 / 2 : row0;
            const size_t src_step = pair_gu ? (size_t)I * row_bytes : row_bytes;
            const unsigned dst_step = p.pad ? row_bytes + p.pad : bytes;
            const char *src = reinterpret_cast<const char *>(reinterpret_cast<const bf16 *>(w) + first_row * K);
            char *dst = reinterpret_cast<char *>(bufs[buf]);
            const unsigned first = issued;
            for (unsigned r = 0; r < segs; r++)
                for (unsigned c = 0; c < per_seg; c++, issued++) {
                    const unsigned off = c * p.chunk, len = bytes - off < p.chunk ? bytes - off : p.chunk;
                    const unsigned slot = issued % R;
                    if (issued >= (unsigned)R) mbar_wait(ring + slot, (issued / R - 1) & 1u);
                    mbar_expect(ring + slot, len);
                    bulk_copy(dst + r * dst_step + off, src + r * src_step + off, len, ring + slot);
                }
            const unsigned n = issued - first;
            for (unsigned i = n > (unsigned)R ? issued - R : issued - n; i < issued; i++)
                mbar_wait(ring + i % R, (i / R) & 1u);
            mbar_arrive(bars + BAR_FULL + buf);
            fills[buf]++;
        }
    }
}

// ---- the GEMV from shared memory (linear_gemv_kernel's sums) ---------------------------

__device__ __forceinline__ void unpack8(const uint4 &v, float f[8]) { bf16x8_to_float(v, f); }

// out[m][row0 + r] for the block's rows r of W (shared, [rows, K]), from
// xs (shared, [MT][K / 8] vectors). The work items are (row pair, K slice):
// warp w takes items w, w + NW, ...; within a slice, as linear_gemv_kernel
// does, it loads U slabs' chunks of both rows before it uses any (per lane
// its chunks in slab order). A slice's warp sums go to part[] (shared), and
// each output then adds its slices' sums in slice order from 0, as
// linear_gemv_kernel's last step does: the same bits, whichever warp took
// which slice. With one slice the warp writes its sums itself.
//
// One lane's chunk c of a row pair (w0v, w1v) times the MT rows of xs,
// into acc in j order: the order of a row's sum both paths below keep.
template <int MT>
__device__ __forceinline__ void chunk_fma(const uint4 &w0v, const uint4 &w1v, const uint4 *xs, int kc, int c,
                                          float (&acc)[2][MT]) {
    float wf[2][8];
    unpack8(w0v, wf[0]);
    unpack8(w1v, wf[1]);
#pragma unroll
    for (int m = 0; m < MT; m++) {
        float xf[8];
        unpack8(xs[m * kc + c], xf);
#pragma unroll
        for (int r = 0; r < 2; r++)
#pragma unroll
            for (int j = 0; j < 8; j++) acc[r][m] = fmaf(wf[r][j], xf[j], acc[r][m]);
    }
}

// IW > 1 (for tests/gpu/gemv_probe.cu; the kernel runs IW = 1): a warp
// takes IW items at once, w, w + NW, ..., w + (IW - 1) NW, then the next IW,
// all their loads before any of their sums, so that IW independent chains
// of FMAs and shuffles overlap. Each sum keeps its order, so the bits are
// IW = 1's.
//
// SILU (gate_up with SiluAndMul as its epilogue, IW = 1): the buffer
// holds the block's gate rows, then the same rows of up (the producer's two
// segments), so row pair pr is gate row pr and up row pr; each sum is taken
// as before, rounded to bf16 as the GEMV's output would be, and the pair
// gives one output, SiluAndMul's (kernels/activation.cuh, rounded once), at
// out[m][row0 / 2 + pr] of [MT, N] (N = I).
__device__ __forceinline__ bf16 silu_of_sums(float g, float u) {
    return __float2bfloat16(silu_mul_dev(__bfloat162float(__float2bfloat16(g)), __bfloat162float(__float2bfloat16(u))));
}

// A work item's end, shared by mk::gemv and mk::gemv_xr: item `it` (row
// pair pr, its K slice) has its two rows' sums in acc; each is taken over
// the warp (a butterfly: the same bits in every lane) and either written
// (one slice: as the GEMV's output, or with SILU as SiluAndMul of the pair)
// or left in part[] for gemv_slices.
template <int MT, bool SILU>
__device__ __forceinline__ void gemv_item_end(const float (&acc)[2][MT], int it, int pr, int ks, int row0, bf16 *out,
                                              int N, float *part) {
    constexpr int RM = 2 * MT;
    const int lane = threadIdx.x % 32;
    if constexpr (SILU) {
#pragma unroll
        for (int m = 0; m < MT; m++) {
            const float g = warp_sum(acc[0][m]), u = warp_sum(acc[1][m]);
            if (ks == 1) {
                if (lane == m) out[(long long)m * N + row0 / 2 + pr] = silu_of_sums(0.0f + g, 0.0f + u);
            } else if (lane == m) {
                part[it * RM + m] = g;
                part[it * RM + MT + m] = u;
            }
        }
    } else {
#pragma unroll
        for (int r = 0; r < 2; r++)
#pragma unroll
            for (int m = 0; m < MT; m++) {
                const float v = warp_sum(acc[r][m]);
                if (lane != r * MT + m) continue;
                if (ks == 1) out[(long long)m * N + row0 + 2 * pr + r] = __float2bfloat16(0.0f + v);
                else part[it * RM + r * MT + m] = v;
            }
    }
}

// With ks > 1 slices, after every item's end: each output adds its slices'
// sums in slice order from 0, as linear_gemv_kernel's last step does.
template <int MT, int NW, bool SILU>
__device__ __forceinline__ void gemv_slices(int pairs, int ks, int row0, bf16 *out, int N, const float *part) {
    constexpr int RM = 2 * MT;
    if (ks == 1) return;
    csync<NW>::sync();
    if constexpr (SILU) {
        for (int o = threadIdx.x; o < pairs * MT; o += cfg<NW>::CONSUMERS) {
            const int pr = o / MT, m = o % MT;
            float g = 0.0f, u = 0.0f;
            for (int q = 0; q < ks; q++) g += part[(pr * ks + q) * RM + m];
            for (int q = 0; q < ks; q++) u += part[(pr * ks + q) * RM + MT + m];
            out[(long long)m * N + row0 / 2 + pr] = silu_of_sums(g, u);
        }
    } else {
        for (int o = threadIdx.x; o < pairs * RM; o += cfg<NW>::CONSUMERS) {
            const int pr = o / RM, rm = o % RM, r = rm / MT, m = rm % MT;
            float v = 0.0f;
            for (int q = 0; q < ks; q++) v += part[(pr * ks + q) * RM + rm];
            out[(long long)m * N + row0 + 2 * pr + r] = __float2bfloat16(v);
        }
    }
}

template <int MT, int NW, int IW = 1, bool SILU = false>
__device__ __forceinline__ void gemv(const wbuf &b, int K, int ks, const uint4 *xs, bf16 *out, int N, float *part) {
    static_assert(!SILU || IW == 1, "SiluAndMul's epilogue on the one-item path");
    constexpr int U = 4;
    const int kc = K / 8, lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int pairs = b.rows / 2, items = pairs * ks;
    // Where row pair pr's two rows sit: adjacent, or (SILU) gate row pr and up row pr, pairs rows on.
    const long long pair_step = SILU ? kc : 2LL * kc, second = SILU ? (long long)pairs * kc : kc;
    if constexpr (IW > 1) {
        for (int it0 = warp; it0 < items; it0 += NW * IW) {
            int q[IW];
            bool live[IW];
            const uint4 *w0[IW], *w1[IW];
            float acc[IW][2][MT];
#pragma unroll
            for (int i = 0; i < IW; i++) {
                const int it = it0 + i * NW;
                live[i] = it < items;
                const int itc = live[i] ? it : it0, pr = itc / ks;
                q[i] = itc % ks;
                w0[i] = b.mem + (long long)(2 * pr) * kc;
                w1[i] = w0[i] + kc;
#pragma unroll
                for (int r = 0; r < 2; r++)
#pragma unroll
                    for (int m = 0; m < MT; m++) acc[i][r][m] = 0.0f;
            }
            // Step t is slab q + t U ks of each item (the loop of IW = 1, for q = 0 the longest).
            for (int t = 0; t * U * ks * 32 < kc; t++) {
                uint4 wv[IW][U][2];
#pragma unroll
                for (int i = 0; i < IW; i++)
#pragma unroll
                    for (int u = 0; u < U; u++) {
                        const int c = (q[i] + t * U * ks + u * ks) * 32 + lane;
                        const bool ok = live[i] && c < kc;
                        wv[i][u][0] = ok ? w0[i][c] : make_uint4(0, 0, 0, 0);
                        wv[i][u][1] = ok ? w1[i][c] : make_uint4(0, 0, 0, 0);
                    }
#pragma unroll
                for (int i = 0; i < IW; i++)
#pragma unroll
                    for (int u = 0; u < U; u++) {
                        const int c = (q[i] + t * U * ks + u * ks) * 32 + lane;
                        if (live[i] && c < kc) chunk_fma<MT>(wv[i][u][0], wv[i][u][1], xs, kc, c, acc[i]);
                    }
            }
#pragma unroll
            for (int i = 0; i < IW; i++)
                if (live[i])  // the same for every lane of the warp
                    gemv_item_end<MT, false>(acc[i], it0 + i * NW, (it0 + i * NW) / ks, ks, b.row0, out, N, part);
        }
    } else
    for (int it = warp; it < items; it += NW) {
        const int pr = it / ks, q = it % ks;
        const uint4 *w0 = b.mem + pr * pair_step, *w1 = w0 + second;
        float acc[2][MT];
#pragma unroll
        for (int r = 0; r < 2; r++)
#pragma unroll
            for (int m = 0; m < MT; m++) acc[r][m] = 0.0f;
        for (int slab = q; slab * 32 < kc; slab += U * ks) {
            uint4 wv[U][2];
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int c = (slab + u * ks) * 32 + lane;
                wv[u][0] = c < kc ? w0[c] : make_uint4(0, 0, 0, 0);
                wv[u][1] = c < kc ? w1[c] : make_uint4(0, 0, 0, 0);
            }
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int c = (slab + u * ks) * 32 + lane;
                if (c < kc) chunk_fma<MT>(wv[u][0], wv[u][1], xs, kc, c, acc);
            }
        }
        gemv_item_end<MT, SILU>(acc, it, pr, ks, b.row0, out, N, part);
    }
    gemv_slices<MT, NW, SILU>(pairs, ks, b.row0, out, N, part);
}

// ---- the same GEMV with the input in registers (MV_MEGAKERNEL_XREG) ---------------------
//
// mk::gemv loads each lane's chunks of x from shared memory again for every
// item, and converts them to fp32 again: a third of an item's instructions,
// and a load the item's FMAs wait on. But which chunks of x a lane reads
// depends only on the slice q (chunk (q + t ks) 32 + lane, t = 0, 1, ...),
// not on the row pair; and a warp's items it = warp, warp + NW, ... all have
// q = warp % ks when NW is a multiple of ks. So each lane converts its (at
// most GEMV_U) chunks of x once, into registers, and an item is its weight
// loads, the FMAs and the sums. IW items are taken at once (their loads
// first: IW independent chains of FMAs). Every sum is the one mk::gemv takes
// in the same order, so the bits are its bits. It applies when a lane's
// chunks fit (slabs <= U ks, which linear_gemv_k_split gives for K up to
// 32 U 8 GEMV_MAX_WARPS) and NW % ks == 0, at MT <= 2 (the registers);
// xreg_applies says so, and the kernel falls back to mk::gemv otherwise.
__device__ __forceinline__ bool xreg_applies(int K, int ks, int NW, int MT) {
    return MT <= 2 && NW % ks == 0 && (K / 8 + 31) / 32 <= 4 * ks;
}

//
// Not inlined (as gemv_mma): inlined at the kernel's four call sites it
// made the whole kernel slower although it is faster alone (docs/09-engine.md,
// runs 85 and 86). The asserts keep its shared-memory accesses LDS.
template <int MT, int NW, int IW = 1, bool SILU = false>
__device__ __noinline__ void gemv_xr(const wbuf b, int K, int ks, const uint4 *xs, bf16 *out, int N, float *part) {
    __builtin_assume(__isShared(b.mem));
    __builtin_assume(__isShared(xs));
    __builtin_assume(__isShared(part));
    constexpr int U = 4;
    const int kc = K / 8, lane = threadIdx.x % 32, warp = threadIdx.x / 32, q = warp % ks;
    const int pairs = b.rows / 2, items = pairs * ks;
    const long long pair_step = SILU ? kc : 2LL * kc, second = SILU ? (long long)pairs * kc : kc;
    // A warp with no item of the block's share reads no x (as in mk::gemv).
    const bool busy = warp < items;
    float xf[U][MT][8];
    bool okc[U];
#pragma unroll
    for (int t = 0; t < U; t++) {
        const int c = (q + t * ks) * 32 + lane;
        okc[t] = c < kc;
#pragma unroll
        for (int m = 0; m < MT; m++) {
            const uint4 v = busy && okc[t] ? xs[m * kc + c] : make_uint4(0, 0, 0, 0);
            unpack8(v, xf[t][m]);
        }
    }
    for (int it0 = warp; it0 < items; it0 += NW * IW) {
        bool live[IW];
        uint4 wv[IW][U][2];
        float acc[IW][2][MT];
#pragma unroll
        for (int i = 0; i < IW; i++) {
            const int it = it0 + i * NW;
            live[i] = it < items;
            const int pr = (live[i] ? it : it0) / ks;
            const uint4 *w0 = b.mem + pr * pair_step, *w1 = w0 + second;
#pragma unroll
            for (int t = 0; t < U; t++) {
                const int c = (q + t * ks) * 32 + lane;
                wv[i][t][0] = okc[t] && live[i] ? w0[c] : make_uint4(0, 0, 0, 0);
                wv[i][t][1] = okc[t] && live[i] ? w1[c] : make_uint4(0, 0, 0, 0);
            }
#pragma unroll
            for (int r = 0; r < 2; r++)
#pragma unroll
                for (int m = 0; m < MT; m++) acc[i][r][m] = 0.0f;
        }
#pragma unroll
        for (int t = 0; t < U; t++) {
            if (!okc[t]) continue;
#pragma unroll
            for (int i = 0; i < IW; i++) {
                float wf[2][8];
                unpack8(wv[i][t][0], wf[0]);
                unpack8(wv[i][t][1], wf[1]);
#pragma unroll
                for (int m = 0; m < MT; m++)
#pragma unroll
                    for (int r = 0; r < 2; r++)
#pragma unroll
                        for (int j = 0; j < 8; j++) acc[i][r][m] = fmaf(wf[r][j], xf[t][m][j], acc[i][r][m]);
            }
        }
#pragma unroll
        for (int i = 0; i < IW; i++)
            if (live[i])  // the same for every lane of the warp
                gemv_item_end<MT, SILU>(acc[i], it0 + i * NW, (it0 + i * NW) / ks, ks, b.row0, out, N, part);
    }
    gemv_slices<MT, NW, SILU>(pairs, ks, b.row0, out, N, part);
}

// ---- the GEMV from shared memory, version 3 (linear_gemv_mma_kernel's sums) -------------
//
// The block's rows of W (shared, [rows] rows of pitch uint4s: K / 8 and
// the padding, which puts rows g and g + 1 of a tile 64 bytes apart in the
// banks) in tiles of 16; the work items are (tile, slice of K), slices as
// kernels/gemv_mma.cuh fixes them. Warp w takes items w, w + NW, ...; an
// item's loads of up to 8 chunks are written before its MMAs (the compiler
// still interleaves each chunk's loads with its two MMAs: chapter 09). Each
// item's D goes to part[item][16][MT], and each output then adds its S
// slices in order from 0, as linear_gemv_mma_kernel does: the same bits.
// Not inlined: one copy of its code for the kernel's four calls a layer
// (Nsight Compute finds no instruction-fetch stalls to speak of, so this is
// for the code's size and compile time). The asserts keep its
// shared-memory accesses LDS/STS.
template <int MT, int NW>
__device__ __noinline__ void gemv_mma(const wbuf b, int K, int pitch, const uint4 *xs, bf16 *out, int N,
                                      float *part) {
    constexpr int BATCH = 8;
    __builtin_assume(__isShared(b.mem));
    __builtin_assume(__isShared(xs));
    __builtin_assume(__isShared(part));
    int S, per;
    gemv_mma_split(K, &S, &per);
    const int C = (K + 31) / 32, kc = K / 8, lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int g = lane / 4, t = lane % 4, items = (b.rows + GEMV_MMA_ROWS - 1) / GEMV_MMA_ROWS * S;
    for (int it = warp; it < items; it += NW) {
        const int tile = it / S, q = it % S;
        const int r_lo = tile * GEMV_MMA_ROWS + g, r_hi = r_lo + 8;
        const uint4 *w_lo = b.mem + (long long)r_lo * pitch + t, *w_hi = b.mem + (long long)r_hi * pitch + t;
        const uint4 *x = xs + g * kc + t;
        const int c0 = q * per, c1 = min(C, c0 + per);
        float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        for (int cb = c0; cb < c1; cb += BATCH) {
            uint4 lo[BATCH], hi[BATCH], xv[BATCH];
#pragma unroll
            for (int u = 0; u < BATCH; u++) {
                const int c = cb + u;
                const bool ok = c < c1 && c * 32 + 8 * t < K;
                lo[u] = ok && r_lo < b.rows ? w_lo[c * 4] : make_uint4(0, 0, 0, 0);
                hi[u] = ok && r_hi < b.rows ? w_hi[c * 4] : make_uint4(0, 0, 0, 0);
                xv[u] = ok && g < MT ? x[c * 4] : make_uint4(0, 0, 0, 0);
            }
#pragma unroll
            for (int u = 0; u < BATCH; u++)
                if (cb + u < c1) gemv_mma_chunk(d, lo[u], hi[u], xv[u]);
        }
        // D: lane (g, t) holds rows g, g + 8 of tokens 2t, 2t + 1.
        float *pi = part + (long long)it * GEMV_MMA_ROWS * MT;
        if (2 * t < MT) pi[g * MT + 2 * t] = d[0], pi[(g + 8) * MT + 2 * t] = d[2];
        if (2 * t + 1 < MT) pi[g * MT + 2 * t + 1] = d[1], pi[(g + 8) * MT + 2 * t + 1] = d[3];
    }
    csync<NW>::sync();
    for (int o = threadIdx.x; o < b.rows * MT; o += cfg<NW>::CONSUMERS) {
        const int r = o % b.rows, m = o / b.rows, tile = r / GEMV_MMA_ROWS, rr = r % GEMV_MMA_ROWS;
        const float *pt = part + ((long long)tile * S * GEMV_MMA_ROWS + rr) * MT + m;
        float v = 0.0f;
        for (int k = 0; k < S; k++) v += pt[(long long)k * GEMV_MMA_ROWS * MT];
        out[(long long)m * N + b.row0 + r] = __float2bfloat16(v);
    }
}

// The kernel's GEMV: version GV (2 or 3) of the block's rows in b; version
// 2 with x in registers (gemv_xr, one item at a time) where xreg is set and
// it applies.
template <int GV, int MT, int NW, bool SILU = false>
__device__ __forceinline__ void gemv_any(const wbuf &b, int K, int ks, unsigned pad, int xreg, const uint4 *xs,
                                         bf16 *out, int N, float *part) {
    static_assert(!SILU || GV == 2, "SiluAndMul's epilogue in GEMV version 2 only");
    if constexpr (GV == 3) {
        gemv_mma<MT, NW>(b, K, (int)((2u * (unsigned)K + pad) / 16u), xs, out, N, part);
    } else {
        if constexpr (MT <= 2) {
            if (xreg && xreg_applies(K, ks, NW, MT)) {
                gemv_xr<MT, NW, 1, SILU>(b, K, ks, xs, out, N, part);
                return;
            }
        }
        gemv<MT, NW, 1, SILU>(b, K, ks, xs, out, N, part);
    }
}

// ---- RMSNorm (rmsnorm_kernel_v3's sums) ---------------------------------------------------


// The norms' block sums meet at two mbarriers of CONSUMERS arrivals, used in
// turn, each with its own warp sums: call k writes partial[k % 2] and meets
// at norm[k % 2] (phase k / 2). Call k + 2 may overwrite partial[k % 2]
// only once its thread has passed call k + 1's meeting, which every thread
// reaches after its reads of call k. (One named barrier before and one after
// the reads did the same, but compute-sanitizer's racecheck reported
// hazards on partial[] across them here, though not in the same pattern
// alone: tests/gpu/racecheck_probe.cu, sum-producer.)
struct norm_sync {
    uint64_t *bars;  // norm[0], norm[1]
    unsigned calls;
};

// block_inv_rms (kernels/rmsnorm.cuh) over the consumer warps alone: the
// same sums (a warp's, then the warps' in a second warp sum; warps past
// rmsnorm_kernel_v3's add zeros, which changes no bit).
template <int NW>
__device__ __forceinline__ float consumers_inv_rms(float v, int n, float eps, norm_sync &ns) {
    __shared__ float partial[2][NW];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, b = (int)(ns.calls & 1u);
    v = warp_sum(v);
    if (lane == 0) partial[b][warp] = v;
    mbar_arrive(ns.bars + b);
    mbar_wait(ns.bars + b, (ns.calls >> 1) & 1u);
    v = lane < NW ? partial[b][lane] : 0.0f;
    v = warp_sum(v);
    ns.calls++;
    return rsqrtf(v / (float)n + eps);
}

// xs[m] = RMSNorm(v) * w for each row m, v = residual_in[m] (+ x[m] when x
// is given: the fused add, whose sum block 0 stores to residual_out).
// With `rows_out`, block 0 also stores the normed rows there.
// With `ids` (layer 0's norm, the embedding in the kernel): v = row ids[m] of
// `table` [V, H], or zeros for an id outside [0, V) (embedding_cuda's rows),
// which block 0 stores to res_out as the residual.
template <int MT, int NW>
__device__ __forceinline__ void norm_rows(const bf16 *res_in, const bf16 *x, const bf16 *w, bf16 *res_out,
                                          uint4 *xs, bf16 *rows_out, int H, float eps, norm_sync &ns,
                                          const int32_t *ids = NULL, const bf16 *table = NULL, int V = 0) {
    const int nvec = H / 8, i = threadIdx.x;
    // The norm's weight first: it depends on no earlier phase, so its load
    // need not wait behind the block sum's barriers.
    bf16_vec<8> wk;
    if (i < nvec) wk = *reinterpret_cast<const bf16_vec<8> *>(w + i * 8);
    for (int m = 0; m < MT; m++) {
        bf16_vec<8> v;
        float sum_sq = 0.0f;
        if (i < nvec && ids) {
            const long long at = (long long)m * H + i * 8;
            const int id = ids[m];
            const uint4 raw = id >= 0 && id < V ? __ldg(reinterpret_cast<const uint4 *>(table + (long long)id * H) + i)
                                                : make_uint4(0, 0, 0, 0);
            v = *reinterpret_cast<const bf16_vec<8> *>(&raw);
            if (blockIdx.x == 0) *reinterpret_cast<bf16_vec<8> *>(res_out + at) = v;
#pragma unroll
            for (int e = 0; e < 8; e++) {
                float f = __bfloat162float(v.v[e]);
                sum_sq += f * f;
            }
        } else if (i < nvec) {
            const long long at = (long long)m * H + i * 8;
            uint4 raw = dec_ldcg16((x ? x : res_in) + at);
            v = *reinterpret_cast<const bf16_vec<8> *>(&raw);
            if (x) {
                uint4 rraw = dec_ldcg16(res_in + at);
                const bf16_vec<8> r = *reinterpret_cast<const bf16_vec<8> *>(&rraw);
#pragma unroll
                for (int e = 0; e < 8; e++) v.v[e] = __float2bfloat16(__bfloat162float(v.v[e]) + __bfloat162float(r.v[e]));
                if (blockIdx.x == 0) *reinterpret_cast<bf16_vec<8> *>(res_out + at) = v;
            }
#pragma unroll
            for (int e = 0; e < 8; e++) {
                float f = __bfloat162float(v.v[e]);
                sum_sq += f * f;
            }
        }
        const float inv_rms = consumers_inv_rms<NW>(sum_sq, H, eps, ns);
        if (i < nvec) {
            bf16_vec<8> o;
#pragma unroll
            for (int e = 0; e < 8; e++)
                o.v[e] = __float2bfloat16(__bfloat162float(v.v[e]) * inv_rms * __bfloat162float(wk.v[e]));
            xs[m * nvec + i] = *reinterpret_cast<const uint4 *>(&o);
            if (rows_out && blockIdx.x == 0) *reinterpret_cast<bf16_vec<8> *>(rows_out + (long long)m * H + i * 8) = o;
        }
    }
}

// The profile's clock (ns; it steps by 32 ns on these GPUs).
__device__ __forceinline__ unsigned long long globaltimer() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// ---- q/k norm + RoPE + the KV store (qk_norm_rope version 6, store_kvcache) --------------

// norm_rotate (kernels/decode_rope_prep.cuh): qk_norm_rope version 6's arithmetic, which rope_store and
// the attention pieces' dec_prep_rope share.

// A group of LANES lanes per head (D = 16 * LANES), every head of every row.
template <int LANES, int NW>
__device__ __forceinline__ void rope_store(const params &p, const megakernel_layer_t &ly, int M) {
    using namespace rope_fused;
    constexpr int VEC = 8, D = 2 * VEC * LANES, HALF = D / 2, GROUPS = cfg<NW>::CONSUMERS / LANES;
    using vec_t = pack<VEC>;
    using fvec_t = fvec<VEC>;
    const megakernel_args_t &a = p.a;
    const int nq = a.num_heads, nkv = a.num_kv_heads, nh = nq + nkv;
    const int lane = threadIdx.x % LANES, group = threadIdx.x / LANES;
    const unsigned mask = LANES == 32 ? 0xffffffffu : (((1u << LANES) - 1u) << ((threadIdx.x % 32) - lane));
    const int tasks = M * nh;
    for (int base = blockIdx.x * GROUPS; base < tasks; base += gridDim.x * GROUPS) {
        const int t = base + group, live = t < tasks, tt = live ? t : tasks - 1;
        const int m = tt / nh, h = tt % nh, is_q = h < nq;
        bf16 *head = reinterpret_cast<bf16 *>(a.qkv) + (long long)m * p.qkv_n + (is_q ? h * D : p.qn + (h - nq) * D);
        const int pos = a.positions[m];
        check_pos(pos, a.max_position);
        uint4 r1 = dec_ldcg16(head + lane * VEC), r2 = dec_ldcg16(head + HALF + lane * VEC);
        const vec_t x1 = *reinterpret_cast<const vec_t *>(&r1), x2 = *reinterpret_cast<const vec_t *>(&r2);
        const bf16 *w = reinterpret_cast<const bf16 *>(is_q ? ly.q_norm : ly.k_norm);
        const vec_t wa = reinterpret_cast<const vec_t *>(w)[lane];
        const vec_t wb = reinterpret_cast<const vec_t *>(w + HALF)[lane];
        const fvec_t cs = reinterpret_cast<const fvec_t *>(a.cos_sin + (long long)pos * D)[lane];
        const fvec_t sn = reinterpret_cast<const fvec_t *>(a.cos_sin + (long long)pos * D + HALF)[lane];
        float o1[VEC], o2[VEC];
        norm_rotate<LANES>(x1, x2, wa, wb, cs, sn, mask, a.eps, o1, o2);
        const vec_t y1 = put<VEC>(o1), y2 = put<VEC>(o2);
        if (!live) continue;
        if (is_q) {
            reinterpret_cast<vec_t *>(head)[lane] = y1;
            reinterpret_cast<vec_t *>(head + HALF)[lane] = y2;
            continue;
        }
        const int slot = a.slot_mapping[m];
        rope_fused::check_store_slot(slot, p.num_slots);
        if (slot < 0) continue;  // a padding row: its slot is left alone
        const long long at = (long long)slot * nkv * D + (long long)(h - nq) * D;
        bf16 *kc = reinterpret_cast<bf16 *>(ly.k_cache) + at, *vc = reinterpret_cast<bf16 *>(ly.v_cache) + at;
        const bf16 *v = head + nkv * D;  // the v head sits nkv heads after its k head
        const uint4 v1 = dec_ldcg16(v + lane * VEC), v2 = dec_ldcg16(v + HALF + lane * VEC);
        reinterpret_cast<vec_t *>(kc)[lane] = y1;
        reinterpret_cast<vec_t *>(kc + HALF)[lane] = y2;
        reinterpret_cast<uint4 *>(vc + lane * VEC)[0] = v1;
        reinterpret_cast<uint4 *>(vc + HALF + lane * VEC)[0] = v2;
    }
}

// ---- q/k norm + RoPE + the KV store inside the attention pieces -------------------------
//
// MV_MEGAKERNEL_FUSED_ROPE=1 (the default, where a kv head has one piece
// CTA per row and piece: groups_per_kv 1): phase 2 and its barrier are gone.
// The pieces take dec_prep_rope (kernels/decode_rope_prep.cuh, which says
// how), reading the step from the params and the weights and caches from
// the layer; with a timeline, block 0's first piece's times.
struct mk_rope_src {
    const params *p;
    megakernel_layer_t ly;
    unsigned long long *tl;  // the profile's timeline, or NULL
    int L, l;                // the model's layers, this one
    __device__ __forceinline__ void mark(int k) const {
        if (tl && blockIdx.x == 0 && threadIdx.x == 0) tl[MEGAKERNEL_TIMELINE_PIECE(L, l, k)] = globaltimer();
    }
    __device__ __forceinline__ const int32_t *positions() const { return p->a.positions; }
    __device__ __forceinline__ const int32_t *slot_mapping() const { return p->a.slot_mapping; }
    __device__ __forceinline__ const float *cos_sin() const { return p->a.cos_sin; }
    __device__ __forceinline__ const bf16 *q_norm() const { return reinterpret_cast<const bf16 *>(ly.q_norm); }
    __device__ __forceinline__ const bf16 *k_norm() const { return reinterpret_cast<const bf16 *>(ly.k_norm); }
    __device__ __forceinline__ bf16 *k_cache() const { return reinterpret_cast<bf16 *>(ly.k_cache); }
    __device__ __forceinline__ bf16 *v_cache() const { return reinterpret_cast<bf16 *>(ly.v_cache); }
    __device__ __forceinline__ const bf16 *qkv() const { return reinterpret_cast<const bf16 *>(p->a.qkv); }
    __device__ __forceinline__ int qkv_stride() const { return p->qkv_n; }
    __device__ __forceinline__ int qn() const { return p->qn; }
    __device__ __forceinline__ int num_kv_heads() const { return p->a.num_kv_heads; }
    __device__ __forceinline__ long long num_slots() const { return p->num_slots; }
    __device__ __forceinline__ int max_position() const { return p->a.max_position; }
    __device__ __forceinline__ float eps() const { return p->a.eps; }
};
template <int D>
using rope_prep = dec_prep_rope<D, mk_rope_src>;

// ---- attention (chapter 07's decode pieces and reduction) --------------------------------

// The pieces (kv head group, row, piece) go to the teams of DEC_THREADS
// threads: team 0 of every block first, then team 1, ...; each team has its
// own combine buffer (dec_piece_smem_floats) and named barrier.
template <int D, int G, int NW, class Prep>
__device__ __forceinline__ void attention(const params &p, const megakernel_layer_t &ly, int M, float *sm,
                                          const Prep &prep) {
    constexpr int TEAMS = cfg<NW>::TEAMS;
    const int team = threadIdx.x / DEC_THREADS;
    sm += team * dec_piece_smem_floats<D, G>();
    const megakernel_args_t &a = p.a;
    const int nq = a.num_heads, nkv = a.num_kv_heads, nbx = nkv * p.groups_per_kv;
    const long long row = (long long)nkv * D;
    const PagedKV kv = {reinterpret_cast<const bf16 *>(ly.k_cache), reinterpret_cast<const bf16 *>(ly.v_cache), row,
                        row, a.context_lens, a.block_tables, p.block_shift, a.max_blocks};
    float *ws_o = a.attn_ws, *ws_ml = p.num_splits > 1 ? a.attn_ws + (size_t)M * nq * p.num_splits * D : NULL;
    const int tasks = nbx * M * p.num_splits;
    for (int t = team * gridDim.x + blockIdx.x; t < tasks; t += gridDim.x * TEAMS) {
        const int bx = t % nbx, s = (t / nbx) % M, split = t / (nbx * M);
        decode_piece_v2<D, G, dec_ld_cg, team_sync>(bx, s, split, p.groups_per_kv, threadIdx.x % DEC_THREADS, sm,
                                                    reinterpret_cast<bf16 *>(a.attn),
                                                    reinterpret_cast<const bf16 *>(a.qkv), p.qkv_n, kv, nq, nkv,
                                                    p.scale_log2, p.num_splits, p.split_len, ws_o, ws_ml, prep);
        team_sync::sync();  // sm is the team's next piece's
    }
}

template <int D, int NW>
__device__ __forceinline__ void attention_reduce(const params &p, int M, unsigned long long *tl, int l) {
    const megakernel_args_t &a = p.a;
    const int nq = a.num_heads, team = threadIdx.x / DEC_THREADS, tid = threadIdx.x % DEC_THREADS;
    const float *ws_o = a.attn_ws, *ws_ml = a.attn_ws + (size_t)M * nq * p.num_splits * D;
    for (int t = team * gridDim.x + blockIdx.x; t < nq * M; t += gridDim.x * cfg<NW>::TEAMS)
        if (tid < D) {
            if (p.reduce_v == 2)
                decode_reduce_one_v2<dec_ld_cg>(t % nq, t / nq, tid, reinterpret_cast<bf16 *>(a.attn), ws_o, ws_ml,
                                                a.context_lens, nq, D, p.num_splits, p.split_len);
            else
                decode_reduce_one<dec_ld_cg>(t % nq, t / nq, tid, reinterpret_cast<bf16 *>(a.attn), ws_o, ws_ml,
                                             a.context_lens, nq, D, p.num_splits, p.split_len);
        }
    if (tl && blockIdx.x == 0 && threadIdx.x == 0) tl[MEGAKERNEL_TIMELINE_PIECE(a.num_layers, l, 4)] = globaltimer();
}

// ---- the GEMV inputs ------------------------------------------------------------------------

template <int NW>
__device__ __forceinline__ void stage(uint4 *xs, const bf16_t *src, int n16) {
    const uint4 *s = reinterpret_cast<const uint4 *>(src);
    for (int i = threadIdx.x; i < n16; i += cfg<NW>::CONSUMERS) xs[i] = __ldcg(s + i);
}

// xs[m][c] = SiluAndMul of gate_up's row m, chunk c (gemv_x_silu_mul's values).
// A thread issues the loads of up to PER of its vectors before any math:
// one trip to L2 for Qwen3-0.6B's row (384 vectors, 256 threads), where a
// load per vector, each after the last one's store, took two.
template <int NW>
__device__ __forceinline__ void stage_silu(uint4 *xs, const bf16_t *gate_up, int M, int I) {
    constexpr int PER = 4, STEP = cfg<NW>::CONSUMERS;
    const int kc = I / 8, n = M * kc;
    const uint4 *gu = reinterpret_cast<const uint4 *>(gate_up);
    for (int i0 = threadIdx.x; i0 < n; i0 += STEP * PER) {
        uint4 gv[PER], uv[PER];
#pragma unroll
        for (int j = 0; j < PER; j++) {
            const int i = i0 + j * STEP, m = i / kc, c = i % kc;
            gv[j] = i < n ? __ldcg(gu + (long long)m * 2 * kc + c) : make_uint4(0, 0, 0, 0);
            uv[j] = i < n ? __ldcg(gu + (long long)m * 2 * kc + kc + c) : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int j = 0; j < PER; j++) {
            const int i = i0 + j * STEP;
            if (i >= n) break;
            float g[8], u[8];
            unpack8(gv[j], g);
            unpack8(uv[j], u);
            xs[i] = silu_mul_pack8(g, u);
        }
    }
}

// ---- the kernel -----------------------------------------------------------------------------


// The grid barrier that ends phase slot `slot`, and with a timeline the
// times around it (the profile of decode_megakernel.h: each block's arrival,
// once all its threads are there, into the barrier's max; block 0's
// departure). Right after its release, thread 0 opens the gates that name this slot (a refill of layer l < L; qkv's and
// o_proj's from layer 1), so that the producer's copies start once the
// release has gone out, not while it waits for them.
template <int NW>
__device__ __forceinline__ void barrier(grid_barrier_t *gb, unsigned long long *tl, const params &p,
                                        uint64_t *bars, int slot) {
    if (tl) {
        csync<NW>::sync();
        if (threadIdx.x == 0) atomicMax(&tl[2 * gb->epoch], globaltimer());
    }
    csync<NW>::sync();
    gb->epoch++;
    if (threadIdx.x == 0) {
        const unsigned target = grid_barrier_arrive(gb);
        if (p.gated)
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const int d = slot - p.gate[j], l = d / PHASE_SLOTS;
                if (d >= 0 && d % PHASE_SLOTS == 0 && l < p.a.num_layers && (j >= 2 || l >= 1))
                    mbar_arrive(bars + BAR_GATE + j);
            }
        grid_barrier_wait(gb, target);
    }
    csync<NW>::sync();
    if (tl && blockIdx.x == 0 && threadIdx.x == 0) tl[2 * (gb->epoch - 1) + 1] = globaltimer();
}

// With a timeline, block 0's times inside projection j (0 qkv, 1 o_proj,
// 2 gate_up, 3 down) of layer l: k = 0 its input staged, 1 its weights
// landed, 2 its GEMV done (MEGAKERNEL_TIMELINE_MARK).
__device__ __forceinline__ void mark(unsigned long long *tl, int L, int l, int j, int k) {
    if (tl && blockIdx.x == 0 && threadIdx.x == 0) tl[MEGAKERNEL_TIMELINE_MARK(L, l, j, k)] = globaltimer();
}

template <int MT, int D, int G, int NW, int GV>
__global__ void __launch_bounds__(cfg<NW>::THREADS, 1) decode_megakernel(const __grid_constant__ params p) {
    constexpr int CONSUMERS = cfg<NW>::CONSUMERS;
    using sync_c = csync<NW>;
    extern __shared__ __align__(128) unsigned char mk_smem[];
    const megakernel_args_t &a = p.a;
    const int H = a.hidden, I = a.intermediate, L = a.num_layers;
    const float eps = a.eps;
    uint64_t *bars = reinterpret_cast<uint64_t *>(mk_smem + p.off_bar);
    uint4 *const bufs[2] = {reinterpret_cast<uint4 *>(mk_smem), reinterpret_cast<uint4 *>(mk_smem + p.off_b)};
    wbuf A = {bufs[0], bars + BAR_FULL + 0, bars + BAR_EMPTY + 0, 0u, 0, 0};
    wbuf B = {bufs[1], bars + BAR_FULL + 1, bars + BAR_EMPTY + 1, 0u, 0, 0};
    uint4 *xs = reinterpret_cast<uint4 *>(mk_smem + p.off_x);
    float *att = reinterpret_cast<float *>(mk_smem + p.off_x);  // the same bytes, while attention runs
    float *part = reinterpret_cast<float *>(mk_smem + p.off_part);
    if (threadIdx.x == 0)
        for (int i = 0; i < NUM_BARS; i++) mbar_init(&bars[i], i >= BAR_EMPTY && i < BAR_GATE ? CONSUMERS : 1);
#ifdef MV_MK_CSYNC_MBAR
    if (threadIdx.x == 0) mbar_init(&csync_bar, CONSUMERS);
#endif
    __syncthreads();
    if (threadIdx.x >= CONSUMERS) {  // the producer warp's lane 0; its other lanes are done
        if (threadIdx.x == CONSUMERS) producer(p, bufs, bars);
        return;
    }
    grid_barrier_t gb = grid_barrier_make(a.barrier);
    unsigned long long *tl = a.timeline;
    if (tl && blockIdx.x == 0 && threadIdx.x == 0) {
        tl[2 * (MEGAKERNEL_TIMELINE_SLOTS(L) - 1)] = globaltimer();
        tl[2 * (MEGAKERNEL_TIMELINE_SLOTS(L) - 1) + 1] = 1u + (unsigned)p.fused_rope;
    }
    const megakernel_layer_t *layers = a.d_layers;
    bf16 *res[2] = {reinterpret_cast<bf16 *>(a.residual), reinterpret_cast<bf16 *>(a.residual2)};
    const bf16 *x = reinterpret_cast<const bf16 *>(a.x);
    int fused = 0;  // fused adds so far: the residual is res[fused % 2]

    norm_sync ns = {bars + BAR_NORM, 0u};
    // Layer 0's norm, of the embedding (read here from the table with a.input_ids; block 0 writes the residual).
    if (a.input_ids)
        norm_rows<MT, NW>(NULL, NULL, reinterpret_cast<const bf16 *>(layers[0].input_norm), res[0], xs, NULL, H, eps,
                          ns, a.input_ids, reinterpret_cast<const bf16 *>(a.embed), a.vocab);
    else
        norm_rows<MT, NW>(res[0], NULL, reinterpret_cast<const bf16 *>(layers[0].input_norm), NULL, xs, NULL, H, eps,
                          ns);
    for (int l = 0; l < L; l++) {
        const megakernel_layer_t ly = layers[l];
        // 1. input norm, qkv
        if (l > 0) {
            norm_rows<MT, NW>(res[fused % 2], x, reinterpret_cast<const bf16 *>(ly.input_norm), res[(fused + 1) % 2],
                              xs, NULL, H, eps, ns);
            fused++;
        }
        sync_c::sync();
        mark(tl, L, l, 0, 0);
        wait(A, p.qkv_n);
        mark(tl, L, l, 0, 1);
        gemv_any<GV, MT, NW>(A, H, p.ks_h, p.pad, p.xreg, xs, reinterpret_cast<bf16 *>(a.qkv), p.qkv_n, part);
        release(A);
        if (tl) sync_c::sync();  // the profile's GEMV done: all of block 0's warps
        mark(tl, L, l, 0, 2);
        barrier<NW>(&gb, tl, p, bars, PHASE_SLOTS * l + 0);
        if (p.fused_rope) {
            // 2-3. attention, each piece with its queries' q/k norm and RoPE (and the last key's store)
            attention<D, G, NW>(p, ly, MT, att, rope_prep<D>{{&p, ly, tl, L, l}});
        } else {
            // 2. q/k norm, RoPE, KV store
            rope_store<D / 16, NW>(p, ly, MT);
            barrier<NW>(&gb, tl, p, bars, PHASE_SLOTS * l + 1);
            // 3. attention
            attention<D, G, NW>(p, ly, MT, att, dec_prep_plain{});
        }
        barrier<NW>(&gb, tl, p, bars, PHASE_SLOTS * l + 2);
        if (p.num_splits > 1) {
            attention_reduce<D, NW>(p, MT, tl, l);
            barrier<NW>(&gb, tl, p, bars, PHASE_SLOTS * l + 3);
        }
        // 5. o_proj
        stage<NW>(xs, a.attn, MT * p.qn / 8);
        sync_c::sync();
        mark(tl, L, l, 1, 0);
        wait(B, H);
        mark(tl, L, l, 1, 1);
        gemv_any<GV, MT, NW>(B, p.qn, p.ks_qn, p.pad, p.xreg, xs, reinterpret_cast<bf16 *>(a.x), H, part);
        release(B);
        if (tl) sync_c::sync();  // the profile's GEMV done: all of block 0's warps
        mark(tl, L, l, 1, 2);
        barrier<NW>(&gb, tl, p, bars, PHASE_SLOTS * l + 4);
        // 6. post-attention norm, gate_up
        norm_rows<MT, NW>(res[fused % 2], x, reinterpret_cast<const bf16 *>(ly.post_norm), res[(fused + 1) % 2], xs,
                          NULL, H, eps, ns);
        fused++;
        sync_c::sync();
        mark(tl, L, l, 2, 0);
        wait(A, 2 * I);
        mark(tl, L, l, 2, 1);
        if constexpr (GV == 2) {
            if (p.silu_epi) gemv_any<GV, MT, NW, true>(A, H, p.ks_h, p.pad, p.xreg, xs, reinterpret_cast<bf16 *>(a.gate_up), I, part);
            else gemv_any<GV, MT, NW>(A, H, p.ks_h, p.pad, p.xreg, xs, reinterpret_cast<bf16 *>(a.gate_up), 2 * I, part);
        } else {
            gemv_any<GV, MT, NW>(A, H, p.ks_h, p.pad, p.xreg, xs, reinterpret_cast<bf16 *>(a.gate_up), 2 * I, part);
        }
        release(A);
        if (tl) sync_c::sync();  // the profile's GEMV done: all of block 0's warps
        mark(tl, L, l, 2, 2);
        barrier<NW>(&gb, tl, p, bars, PHASE_SLOTS * l + 5);
        // 7. SiluAndMul (already in gate_up's GEMV with p.silu_epi), down
        if (GV == 2 && p.silu_epi) stage<NW>(xs, a.gate_up, MT * I / 8);
        else stage_silu<NW>(xs, a.gate_up, MT, I);
        sync_c::sync();
        mark(tl, L, l, 3, 0);
        wait(B, H);
        mark(tl, L, l, 3, 1);
        gemv_any<GV, MT, NW>(B, I, p.ks_i, p.pad, p.xreg, xs, reinterpret_cast<bf16 *>(a.x), H, part);
        release(B);
        if (tl) sync_c::sync();  // the profile's GEMV done: all of block 0's warps
        mark(tl, L, l, 3, 2);
        barrier<NW>(&gb, tl, p, bars, PHASE_SLOTS * l + 6);
    }
    // The final norm; block 0 writes the normed rows.
    norm_rows<MT, NW>(res[fused % 2], x, reinterpret_cast<const bf16 *>(a.final_norm), res[(fused + 1) % 2], xs,
                      reinterpret_cast<bf16 *>(a.hidden_out), H, eps, ns);
    // The counters back to zero for the next launch (no memset before it):
    // a block counts itself out once past its last grid barrier's wait, and
    // the last one out clears both, when no block can still be polling.
    if (threadIdx.x == 0 && atomicAdd(a.barrier + 1, 1u) == gridDim.x - 1) {
        atomicExch(a.barrier, 0u);
        atomicExch(a.barrier + 1, 0u);
    }
}

typedef void (*kernel_fn)(const params);

template <int D, int G, int NW, int GV = 2>
static kernel_fn pick_mt(int M) {
    switch (M) {
    case 1: return decode_megakernel<1, D, G, NW, GV>;
    case 2: return decode_megakernel<2, D, G, NW, GV>;
    case 4: return decode_megakernel<4, D, G, NW, GV>;
    case 8: return decode_megakernel<8, D, G, NW, GV>;
    default: return NULL;
    }
}

// The kernel for M rows, head_dim D, GQA group G, NW consumer warps and
// GEMV version GV: every shape at DEFAULT_NW with version 2 (linear_cuda's
// GEMV at M <= 4), the EXTRA_NW and version 3 (MV_LINEAR_GEMV=3, for
// comparisons) only at Qwen3-0.6B's D 128, G 2.
constexpr int EXTRA_NW[] = {4, 16};
static kernel_fn pick(int M, int D, int G, int NW, int GV) {
    if (GV == 3) return NW == DEFAULT_NW && D == 128 && G == 2 ? pick_mt<128, 2, DEFAULT_NW, 3>(M) : NULL;
    if (GV != 2) return NULL;
    if (NW != DEFAULT_NW) {
        if (D != 128 || G != 2) return NULL;
        return NW == EXTRA_NW[0] ? pick_mt<128, 2, EXTRA_NW[0]>(M) : NW == EXTRA_NW[1] ? pick_mt<128, 2, EXTRA_NW[1]>(M)
                                                                                     : NULL;
    }
    constexpr int W = DEFAULT_NW;
    if (D == 128)
        return G == 1 ? pick_mt<128, 1, W>(M) : G == 2 ? pick_mt<128, 2, W>(M) : G == 4 ? pick_mt<128, 4, W>(M) : NULL;
    if (D == 64) return G == 1 ? pick_mt<64, 1, W>(M) : G == 2 ? pick_mt<64, 2, W>(M) : G == 4 ? pick_mt<64, 4, W>(M) : NULL;
    return NULL;
}

static int piece_floats(int D, int G) {
    if (D == 128) return G == 1 ? dec_piece_smem_floats<128, 1>() : G == 2 ? dec_piece_smem_floats<128, 2>()
                                                                          : dec_piece_smem_floats<128, 4>();
    return G == 1 ? dec_piece_smem_floats<64, 1>() : G == 2 ? dec_piece_smem_floats<64, 2>()
                                                            : dec_piece_smem_floats<64, 4>();
}

}  // namespace mk

// ---- the host side ------------------------------------------------------------------------

// The G decode attention takes for a GQA group (launch_decode_v2_d).
static int attention_g(int group) { return group % 8 == 0 ? 8 : group % 4 == 0 ? 4 : group % 2 == 0 ? 2 : 1; }

static unsigned round128(size_t n) { return (unsigned)((n + 127) / 128 * 128); }

// Rows of a block's share of a projection of N rows, at most.
static long long share_rows(int N, int blocks) {
    const long long pairs = N / 2;
    return 2 * ((pairs + blocks - 1) / blocks);
}

// Bytes of a block's share of a projection of N rows by K at most, each
// row followed by pad bytes.
static size_t share_bytes(int N, int K, int blocks, unsigned pad = 0) {
    return (size_t)share_rows(N, blocks) * ((size_t)K * 2 + pad);
}

// The GEMV version linear_cuda runs at M rows where it runs one
// (linear_auto_version): 2 below LINEAR_GEMV_MMA_AUTO_MIN_M rows, 3 from it;
// MV_LINEAR_GEMV forces one.
static int gemv_version(int M) {
    const int forced = linear_gemv_forced();
    if (forced == LINEAR_GEMV) return LINEAR_GEMV;
    return M <= GEMV_MMA_COLS && (forced == LINEAR_GEMV_MMA || M >= LINEAR_GEMV_MMA_AUTO_MIN_M)
               ? LINEAR_GEMV_MMA : LINEAR_GEMV;
}

// When the producer may start each refill: MV_MEGAKERNEL_GATES=Q,O,G,D
// (qkv_proj, o_proj, gate_up_proj, down_proj), the phase slot, counted from
// the projection's own layer (0 qkv .. 6 down, negative: the layer before),
// whose grid barrier thread 0 must have reached first; "off": as soon as the
// buffer is free. Projection j is read in phase 0, 4, 5, 6: its gate must
// come before that phase, or the kernel would wait for itself, and after the
// same phase of the layer before, so that a gate never runs two fills ahead.
extern "C" int decode_megakernel_gates(const char *value, int gate[4], int *gated, char *why, size_t why_len) {
    if (!value) value = MEGAKERNEL_GATES_DEFAULT;
    *gated = 0;
    if (!strcmp(value, "off")) return 1;
    const int reads[4] = {0, 4, 5, 6};
    const char *q = value;
    for (int j = 0; j < 4; j++) {
        char *end = NULL;
        const long v = strtol(q, &end, 10);
        if (end == q || v < reads[j] - 6 || v >= reads[j] || (j < 3 ? *end != ',' : *end != 0))
            return (snprintf(why, why_len,
                             "MV_MEGAKERNEL_GATES=%s (off, or four phase slots Q,O,G,D from -6, -2, -1, 0 up to -1, "
                             "3, 4, 5)", value), 0);
        gate[j] = (int)v;
        q = end + 1;
    }
    *gated = 1;
    return 1;
}

typedef struct {
    mk::params p;
    mk::kernel_fn fn;
    size_t smem;
    int blocks, threads;
} plan_t;

static int plan(const megakernel_args_t *a, int M, plan_t *pl, char *why, size_t why_len) {
#define NOPE(...) return (snprintf(why, why_len, __VA_ARGS__), 0)
    int dev = 0, major = 0, sms = 0, optin = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) ||
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) ||
        cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev))
        NOPE("no CUDA device");
    if (major < 9) NOPE("compute capability %d.x: the bulk copies need 9.0", major);
    const int H = a->hidden, I = a->intermediate, nq = a->num_heads, nkv = a->num_kv_heads, D = a->head_dim;
    if (M != 1 && M != 2 && M != 4 && M != 8) NOPE("%d rows (it takes 1, 2, 4 or 8)", M);
    if (a->num_layers < 1 || H < 8 || H % 8 || H > 8 * DEC_THREADS)
        NOPE("hidden size %d (it takes a multiple of 8 up to %d)", H, 8 * DEC_THREADS);
    if (D != 64 && D != 128) NOPE("head_dim %d (it takes 64 or 128)", D);
    if (nq < 1 || nkv < 1 || nq % nkv) NOPE("%d query heads over %d kv heads", nq, nkv);
    const int G = attention_g(nq / nkv);
    if (G > 4) NOPE("a GQA group of %d (decode attention's G = %d; it takes 1, 2, 4)", nq / nkv, G);
    if (I < 8 || I % 8) NOPE("intermediate size %d (it takes a multiple of 8)", I);
    if (a->block_size < 1 || (a->block_size & (a->block_size - 1))) NOPE("block size %d", a->block_size);
    mk::params &p = pl->p;
    memset(&p, 0, sizeof p);
    p.a = *a;
    p.qn = nq * D;
    p.qkv_n = (nq + 2 * nkv) * D;
    p.ks_h = linear_gemv_k_split(H);
    p.ks_qn = linear_gemv_k_split(p.qn);
    p.ks_i = linear_gemv_k_split(I);
    p.num_splits = attention_decode_num_splits(M, nkv, a->max_context_len, a->block_size);
    p.split_len = -dec_tile(D, dec_unroll(G));
    p.groups_per_kv = nq / nkv / G;
    // q/k norm, RoPE and the KV store inside the attention pieces
    // (MV_MEGAKERNEL_FUSED_ROPE=0: their own phase, for comparison). Only
    // where one piece CTA covers a kv head's queries, so that one piece
    // alone stores each new key.
    const char *fr = getenv("MV_MEGAKERNEL_FUSED_ROPE");
    if (fr && strcmp(fr, "0") && strcmp(fr, "1")) NOPE("MV_MEGAKERNEL_FUSED_ROPE=%s (0 or 1)", fr);
    p.fused_rope = !(fr && !strcmp(fr, "0")) && p.groups_per_kv == 1;
    p.scale_log2 = (1.0f / sqrtf((float)D)) * 1.4426950408889634f;
    int shift = 0;
    while ((1 << shift) < a->block_size) shift++;
    p.block_shift = shift;
    p.num_slots = (long long)a->num_blocks * a->block_size;
    const size_t ws = attention_decode_workspace_bytes(M, nq, D, p.num_splits);
    if (ws > 0 && (!a->attn_ws || a->attn_ws_bytes < ws)) NOPE("%d attention pieces need %zu bytes of workspace", p.num_splits, ws);
    const int blocks = sms;
    // The GEMV: the version linear_cuda runs at M rows, for the same bits.
    const int gv = gemv_version(M);
    p.pad = gv == LINEAR_GEMV_MMA ? 64u : 0u;
    // SiluAndMul in gate_up's GEMV (MV_MEGAKERNEL_SILU=0: in down's staging,
    // for comparison) and the reduction's version (MV_MEGAKERNEL_REDUCE=1 or 2).
    const char *silu = getenv("MV_MEGAKERNEL_SILU"), *red = getenv("MV_MEGAKERNEL_REDUCE");
    if (silu && strcmp(silu, "0") && strcmp(silu, "1")) NOPE("MV_MEGAKERNEL_SILU=%s (0 or 1)", silu);
    if (red && strcmp(red, "1") && strcmp(red, "2")) NOPE("MV_MEGAKERNEL_REDUCE=%s (1 or 2)", red);
    p.silu_epi = !(silu && !strcmp(silu, "0")) && gv != LINEAR_GEMV_MMA;
    p.reduce_v = red && !strcmp(red, "1") ? 1 : 2;
    // The GEMV with x in registers (MV_MEGAKERNEL_XREG=1, the default; 0: mk::gemv's loads from shared memory).
    const char *xr = getenv("MV_MEGAKERNEL_XREG");
    if (xr && strcmp(xr, "0") && strcmp(xr, "1")) NOPE("MV_MEGAKERNEL_XREG=%s (0 or 1)", xr);
    p.xreg = !(xr && !strcmp(xr, "0"));
    const size_t bytes_a = share_bytes(p.qkv_n, H, blocks, p.pad) > share_bytes(2 * I, H, blocks, p.pad)
                               ? share_bytes(p.qkv_n, H, blocks, p.pad) : share_bytes(2 * I, H, blocks, p.pad);
    const size_t bytes_b = share_bytes(H, p.qn, blocks, p.pad) > share_bytes(H, I, blocks, p.pad)
                               ? share_bytes(H, p.qn, blocks, p.pad) : share_bytes(H, I, blocks, p.pad);
    int widest = H > p.qn ? H : p.qn;
    if (I > widest) widest = I;
    // The consumer warps (MV_MEGAKERNEL_WARPS, for experiments: mk::pick says which it has).
    const char *warps = getenv("MV_MEGAKERNEL_WARPS");
    const int nw = warps ? atoi(warps) : mk::DEFAULT_NW;
    if (nw < 4 || nw > 16 || nw % 4) NOPE("MV_MEGAKERNEL_WARPS=%s (a multiple of 4 up to 16)", warps);
    pl->threads = 32 * nw + 32;
    size_t bytes_x = (size_t)M * widest * 2;
    const size_t bytes_att = (size_t)mk::piece_floats(D, G) * 4 * (size_t)(nw / 4);  // a buffer per team
    if (bytes_att > bytes_x) bytes_x = bytes_att;
    // The GEMV's slice sums, at most: version 2, (row pairs of a block's
    // share) x (K slices) x 2 x M floats; version 3, (tiles of 16 rows) x
    // (K slices) x 16 x M.
    const int Ns[4] = {p.qkv_n, H, 2 * I, H}, Ks[4] = {H, p.qn, H, I};
    const int slices[4] = {p.ks_h, p.ks_qn, p.ks_h, p.ks_i};
    size_t part_floats = 0;
    for (int j = 0; j < 4; j++) {
        const long long rows = share_rows(Ns[j], blocks);
        int S = slices[j], per = 0;
        if (gv == LINEAR_GEMV_MMA) gemv_mma_split(Ks[j], &S, &per);
        const size_t f = gv == LINEAR_GEMV_MMA
                             ? (size_t)((rows + GEMV_MMA_ROWS - 1) / GEMV_MMA_ROWS) * S * GEMV_MMA_ROWS * M
                             : (size_t)(rows / 2) * S * 2 * M;
        if (f > part_floats) part_floats = f;
    }
    p.off_b = round128(bytes_a);
    p.off_x = p.off_b + round128(bytes_b);
    p.off_part = p.off_x + round128(bytes_x);
    p.off_bar = p.off_part + round128(part_floats * sizeof(float));
    pl->smem = p.off_bar + sizeof(uint64_t) * mk::NUM_BARS;
    // The producer's pacing (MV_MEGAKERNEL_CHUNK bytes a copy, MV_MEGAKERNEL_RING in flight: for experiments).
    // Padded rows (GEMV version 3) go a row at a time (2 to 6 KB for
    // Qwen3-0.6B): 2 KB copies, 8 in flight, the 16 KB of 4 KB x 4.
    const char *chunk = getenv("MV_MEGAKERNEL_CHUNK"), *ring = getenv("MV_MEGAKERNEL_RING");
    const long c = chunk ? atol(chunk) : p.pad ? 2048 : 4096, r = ring ? atol(ring) : p.pad ? 8 : 4;
    // (An mbarrier's transaction count holds less than 1 MiB.)
    if (c < 16 || c >= (1L << 20) || c % 16) NOPE("MV_MEGAKERNEL_CHUNK=%s (a multiple of 16 below 1 MiB)", chunk);
    if (r < 1 || r > mk::MAX_RING) NOPE("MV_MEGAKERNEL_RING=%s (1 to %d)", ring, mk::MAX_RING);
    p.chunk = (unsigned)c;
    p.ring = (int)r;
    // When the producer may start each refill: MV_MEGAKERNEL_GATES=Q,O,G,D
    // (qkv_proj, o_proj, gate_up_proj, down_proj), the phase slot, counted
    // from the projection's own layer (0 qkv .. 6 down, negative: the layer
    // before), whose grid barrier thread 0 must have reached first; "off":
    // as soon as the buffer is free. Each must come before the phase that
    // reads the projection, or the kernel would wait for itself.
    if (!decode_megakernel_gates(getenv("MV_MEGAKERNEL_GATES"), p.gate, &p.gated, why, why_len)) return 0;
    for (int j = 0; p.gated && j < 4; j++) {
        const int phase = (p.gate[j] % mk::PHASE_SLOTS + mk::PHASE_SLOTS) % mk::PHASE_SLOTS;
        if ((phase == 1 && p.fused_rope) || (phase == 3 && p.num_splits <= 1))
            NOPE("MV_MEGAKERNEL_GATES names phase %d, which these steps do not have", phase);
    }
    if (pl->smem > (size_t)optin)
        NOPE("%zu bytes of shared memory a block (the GPU allows %d): the weights' shares are too large", pl->smem,
             optin);
    pl->fn = mk::pick(M, D, G, nw, gv);
    if (!pl->fn) NOPE("no kernel for M %d, D %d, G %d with %d consumer warps and GEMV version %d", M, D, G, nw, gv);
    pl->blocks = blocks;
    return 1;
#undef NOPE
}

extern "C" int decode_megakernel_applies(const megakernel_args_t *a, const megakernel_layer_t *layer0, int M,
                                         char *why, size_t why_len) {
    char local[160];
    if (!why || why_len == 0) why = local, why_len = sizeof local;
    why[0] = 0;
    plan_t pl;
    if (!a || !layer0) return (snprintf(why, why_len, "no arguments"), 0);
    if (!plan(a, M, &pl, why, why_len)) return 0;
    const int H = a->hidden, I = a->intermediate, qn = pl.p.qn, qkv_n = pl.p.qkv_n;
    // The bits are the GEMV's only where linear_cuda would run the GEMV.
    const struct { const bf16_t *x, *w; int N, K; const char *name; } proj[] = {
        {a->hidden_out, layer0->qkv, qkv_n, H, "qkv_proj"}, {a->attn, layer0->o_proj, H, qn, "o_proj"},
        {a->hidden_out, layer0->gate_up, 2 * I, H, "gate_up_proj"}, {a->gate_up, layer0->down, H, I, "down_proj"}};
    const int gv = gemv_version(M);
    for (size_t k = 0; k < sizeof proj / sizeof *proj; k++) {
        const int v = linear_auto_version(NULL, proj[k].x, proj[k].w, M, proj[k].N, proj[k].K);
        if (v != gv)
            return (snprintf(why, why_len, "%s at M = %d runs on %s, not the megakernel's GEMV (%s)", proj[k].name, M,
                             v == LINEAR_CUBLAS ? "cuBLAS" : linear_version_name(v), linear_version_name(gv)),
                    0);
    }
    // RMSNorm version 3 and RoPE version 6 take 8-wide vectors only when aligned.
    const void *aligned[] = {a->residual, a->residual2, a->hidden_out, a->x, a->qkv, a->attn, a->gate_up,
                             layer0->input_norm, layer0->post_norm, layer0->q_norm, layer0->k_norm, a->final_norm,
                             layer0->k_cache, layer0->v_cache};
    for (size_t k = 0; k < sizeof aligned / sizeof *aligned; k++)
        if (!aligned[k] || !mv_aligned(aligned[k], 16)) return (snprintf(why, why_len, "a buffer not 16-byte aligned"), 0);
    if (!a->cos_sin || !mv_aligned(a->cos_sin, 32)) return (snprintf(why, why_len, "cos/sin not 32-byte aligned"), 0);
    int per_sm = 0;
    if (cudaFuncSetAttribute((const void *)pl.fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)pl.smem) ||
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, pl.fn, pl.threads, pl.smem) || per_sm < 1) {
        cudaGetLastError();
        return (snprintf(why, why_len, "one block of %zu bytes of shared memory does not fit an SM", pl.smem), 0);
    }
    return 1;
}

extern "C" int decode_megakernel_cuda(const megakernel_args_t *a, int M, cudaStream_t stream) {
    char why[160];
    plan_t pl;
    if (!a) return mv_error("decode_megakernel_cuda: no arguments");
    if (!plan(a, M, &pl, why, sizeof why)) return mv_error("decode_megakernel_cuda: %s", why);
    if (!a->d_layers || !a->barrier || !a->residual || !a->residual2 || !a->hidden_out || !a->qkv || !a->attn || !a->x ||
        !a->gate_up || !a->final_norm || !a->cos_sin || !a->positions || !a->slot_mapping || !a->context_lens ||
        !a->block_tables)
        return mv_error("decode_megakernel_cuda: a null pointer");
    if (a->input_ids && (!a->embed || a->vocab < 1))
        return mv_error("decode_megakernel_cuda: input_ids without an embedding table of at least one row");
    if (CUDA_TRY(cudaFuncSetAttribute((const void *)pl.fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)pl.smem)) ||
        (a->timeline && CUDA_TRY(cudaMemsetAsync(a->timeline, 0,
                                                 sizeof(unsigned long long) * MEGAKERNEL_TIMELINE_WORDS(a->num_layers),
                                                 stream))))
        return -1;
    void *args[] = {&pl.p};
    return CUDA_TRY(cudaLaunchCooperativeKernel((const void *)pl.fn, dim3((unsigned)pl.blocks), dim3((unsigned)pl.threads),
                                                args, pl.smem, stream));
}

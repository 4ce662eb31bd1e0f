/*
 * kernels/rope.cu - RoPE and fused q_norm/k_norm + RoPE kernels (see rope.h).
 *
 * Napkin math, per token of Qwen3-0.6B (16 q heads, 8 kv heads, D = 128):
 * q and k are 24 * 128 bf16 = 6 KB, read once and written once in place:
 * 12 KB of traffic. The cos/sin row of the token's position is 128 fp32 =
 * 512 bytes more (4%: not counted in the timings' bytes, so the reported
 * GB/s are conservative), shared by all 24 heads. About 6 FLOPs per element
 * (4 for the rotation, 2 more for the norm): far under 1 FLOP/byte, so
 * memory-bound and judged in GB/s against the copy bandwidth.
 *
 * Pairing: element i of a head pairs with element i + D/2 (Hugging Face's
 * rotate_half). Vector j of the first half (elements j*VEC .. j*VEC+VEC-1)
 * pairs element by element with vector j of the second half, and uses
 * cos/sin entries j*VEC .. j*VEC+VEC-1: a thread that loads those four
 * vectors has all it needs, and no thread touches another's elements.
 */
#include "kernels/rope.h"
#include "kernels/versions.h"

#include "common/check.h"
#include "kernels/rmsnorm.cuh"
#include "kernels/rope_fused.cuh"
#include "kernels/kv_store.h"
#include "reference/kv_store.h"
#include "reference/rmsnorm.h"

typedef __nv_bfloat16 bf16;

// N fp32 values moved as one aligned vector (N = 8: 32 bytes, two 16-byte loads).
template <int N>
struct alignas(4 * N) f32_vec {
    float v[N];
};

// A position outside the cache: the host check (rope_validate_positions)
// was skipped. Stop loudly instead of reading outside the cache.
__device__ __forceinline__ void check_position(int pos, int max_pos) {
    if ((unsigned)pos >= (unsigned)max_pos) __trap();
}

// ---- version 1: naive -------------------------------------------------------------
// One thread per (token, head, pair i): reads x[i], x[i + D/2] and the
// token's cos/sin entries i, writes the two rotated values. Heads 0..H-1 are
// q heads, H..H+Hkv-1 k heads. Divisions find the indices; scalar 2-byte
// accesses, 2 bytes apart between neighbouring threads.
__global__ void rope_kernel_v1(bf16 *q, long long q_stride, bf16 *k, long long k_stride,
                               const int32_t *positions, const float *cos_sin, int T, int H, int Hkv,
                               int D, int max_pos) {
    const int half = D / 2;
    const long long per_token = (long long)(H + Hkv) * half;
    const long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (long long)T * per_token) return;
    const long long t = idx / per_token;
    const int rem = (int)(idx % per_token);
    const int h = rem / half, i = rem % half;
    const int pos = positions[t];
    check_position(pos, max_pos);
    bf16 *x = h < H ? q + t * q_stride + (long long)h * D : k + t * k_stride + (long long)(h - H) * D;
    const float c = cos_sin[(long long)pos * D + i], s = cos_sin[(long long)pos * D + half + i];
    const float x1 = __bfloat162float(x[i]), x2 = __bfloat162float(x[i + half]);
    x[i] = __float2bfloat16(x1 * c - x2 * s);
    x[i + half] = __float2bfloat16(x2 * c + x1 * s);
}

// One thread per (token, head) of the QKV buffer's q and k heads: the sum of
// squares over the head, then each pair normalised (x * inv_rms * w, kept in
// fp32) and rotated, rounded once.
__global__ void qk_norm_rope_kernel_v1(bf16 *qkv, const bf16 *q_w, const bf16 *k_w,
                                       const int32_t *positions, const float *cos_sin, int T, int H,
                                       int Hkv, int D, int max_pos, float eps) {
    const long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (long long)T * (H + Hkv)) return;
    const long long t = idx / (H + Hkv);
    const int h = (int)(idx % (H + Hkv));  // q heads, then k heads: they sit side by side in a row
    const long long row = (long long)(H + 2 * Hkv) * D;
    bf16 *x = qkv + t * row + (long long)h * D;
    const bf16 *w = h < H ? q_w : k_w;
    const int pos = positions[t];
    check_position(pos, max_pos);
    float sum_sq = 0.0f;
    for (int i = 0; i < D; i++) {
        float v = __bfloat162float(x[i]);
        sum_sq += v * v;
    }
    const float inv_rms = rsqrtf(sum_sq / D + eps);
    const int half = D / 2;
    const float *c = cos_sin + (long long)pos * D, *s = c + half;
    for (int i = 0; i < half; i++) {
        float x1 = __bfloat162float(x[i]) * inv_rms * __bfloat162float(w[i]);
        float x2 = __bfloat162float(x[i + half]) * inv_rms * __bfloat162float(w[i + half]);
        x[i] = __float2bfloat16(x1 * c[i] - x2 * s[i]);
        x[i + half] = __float2bfloat16(x2 * c[i] + x1 * s[i]);
    }
}

// ---- version 2: fast --------------------------------------------------------------
// Thread (lane, g, z) of a block: token t = blockIdx.x * blockDim.z + z,
// heads h0 .. h0+HPT-1 with h0 = (blockIdx.y * blockDim.y + g) * HPT
// (q heads first, then k heads), and vector pairs j = lane + c * LANES
// (c < CACHE) of each of them. LANES is a power of two (4..32), so the
// LANES threads of a head are an aligned group of lanes of one warp, which
// the norm's shuffle reduction needs. No division per element; the block
// shape is worked out by the launcher.
//
// Why this shape: a head of D = 128 is only 256 bytes; one warp per head
// was instruction-bound at 42% of copy in chapter 02 (docs/perf-notes.md).
// Here 8 lanes cover a head with one 16-byte vector per half each, and each
// thread carries HPT = 4 heads of its token: 8 loads of 16 bytes in flight
// per thread, and the token's cos/sin (two 32-byte fp32 vectors per lane)
// loaded once for the four heads instead of four times.
template <int VEC, int LANES, int CACHE, int HPT, bool NORM>
__global__ void __launch_bounds__(256, 2)
rope_kernel_v2(bf16 *q, long long q_stride, bf16 *k, long long k_stride, const int32_t *positions,
               const float *cos_sin, const bf16 *q_w, const bf16 *k_w, int T, int H, int Hkv, int D,
               int max_pos, float eps) {
    using vec_t = bf16_vec<VEC>;
    using fvec_t = f32_vec<VEC>;
    const int lane = threadIdx.x;
    const long long t = (long long)blockIdx.x * blockDim.z + threadIdx.z;
    const int h0 = (blockIdx.y * blockDim.y + threadIdx.y) * HPT;
    const int nheads = H + Hkv;
    // Both conditions are the same for the LANES threads of a head group,
    // so a group leaves (or stays) whole, and its shuffles stay valid.
    if (t >= T || h0 >= nheads) return;
    const int half = D / 2, nvec = half / VEC;

    // The shuffle mask names exactly this group's lanes: other groups of the
    // warp may have left already (past T or past the last head).
    const int tid = threadIdx.x + LANES * (threadIdx.y + blockDim.y * threadIdx.z);
    const int group_base = (tid % 32) - lane;
    const unsigned mask = LANES == 32 ? 0xffffffffu : (((1u << LANES) - 1u) << group_base);

    const int pos = positions[t];

    // 1. Every data load of the thread (HPT heads x CACHE pairs) goes out first.
    vec_t x1[HPT][CACHE], x2[HPT][CACHE];
#pragma unroll
    for (int r = 0; r < HPT; r++) {
        const int h = h0 + r;
        if (h < nheads) {
            const bf16 *head = h < H ? q + t * q_stride + (long long)h * D : k + t * k_stride + (long long)(h - H) * D;
            const vec_t *first = reinterpret_cast<const vec_t *>(head);
            const vec_t *second = reinterpret_cast<const vec_t *>(head + half);
#pragma unroll
            for (int c = 0; c < CACHE; c++) {
                const int j = lane + c * LANES;
                if (j < nvec) {
                    x1[r][c] = first[j];
                    x2[r][c] = second[j];
                }
            }
        }
    }
    // 2. The token's cos/sin, once for all HPT heads.
    check_position(pos, max_pos);
    const fvec_t *cos_v = reinterpret_cast<const fvec_t *>(cos_sin + (long long)pos * D);
    const fvec_t *sin_v = reinterpret_cast<const fvec_t *>(cos_sin + (long long)pos * D + half);
    fvec_t cs[CACHE], sn[CACHE];
#pragma unroll
    for (int c = 0; c < CACHE; c++) {
        const int j = lane + c * LANES;
        if (j < nvec) {
            cs[c] = cos_v[j];
            sn[c] = sin_v[j];
        }
    }

    // 3. Per head: (norm,) rotate, store.
#pragma unroll
    for (int r = 0; r < HPT; r++) {
        const int h = h0 + r;
        if (h >= nheads) break;  // the same for the whole group
        const bool is_q = h < H;
        bf16 *head = is_q ? q + t * q_stride + (long long)h * D : k + t * k_stride + (long long)(h - H) * D;
        vec_t *first = reinterpret_cast<vec_t *>(head);
        vec_t *second = reinterpret_cast<vec_t *>(head + half);
        // The norm weights (q_norm or k_norm: D bf16, read by every thread
        // block, so L1/L2 hits) are loaded per head rather than kept for
        // all HPT heads: registers are the scarce thing here.
        const vec_t *w1 = reinterpret_cast<const vec_t *>(is_q ? q_w : k_w);
        const vec_t *w2 = reinterpret_cast<const vec_t *>((is_q ? q_w : k_w) + half);
        float inv_rms = 1.0f;
        if constexpr (NORM) {
            float sum_sq = 0.0f;
#pragma unroll
            for (int c = 0; c < CACHE; c++)
                if (lane + c * LANES < nvec)
#pragma unroll
                    for (int e = 0; e < VEC; e++) {
                        const float a = __bfloat162float(x1[r][c].v[e]), b = __bfloat162float(x2[r][c].v[e]);
                        sum_sq += a * a + b * b;
                    }
            inv_rms = group_inv_rms<LANES>(sum_sq, mask, D, eps);  // every lane of the group calls it
        }
#pragma unroll
        for (int c = 0; c < CACHE; c++) {
            const int j = lane + c * LANES;
            if (j < nvec) {
                vec_t o1, o2, wa, wb;
                if constexpr (NORM) {
                    wa = w1[j];
                    wb = w2[j];
                }
#pragma unroll
                for (int e = 0; e < VEC; e++) {
                    float a = __bfloat162float(x1[r][c].v[e]), b = __bfloat162float(x2[r][c].v[e]);
                    if constexpr (NORM) {
                        a = a * inv_rms * __bfloat162float(wa.v[e]);
                        b = b * inv_rms * __bfloat162float(wb.v[e]);
                    }
                    const float co = cs[c].v[e], si = sn[c].v[e];
                    o1.v[e] = __float2bfloat16(a * co - b * si);
                    o2.v[e] = __float2bfloat16(b * co + a * si);
                }
                first[j] = o1;
                second[j] = o2;
            }
        }
    }
}

// ---- version 3: fast, several tokens per thread, cos/sin staged in shared memory ----
// Thread (lane, y, z) of a block: head h = blockIdx.y * blockDim.y + y (q
// heads first, then k heads; blockDim.y divides H + Hkv, so every thread has
// a head), vector pairs j = lane + c * LANES (c < CACHE) of it, and TOK
// tokens t = t0 + r * blockDim.z + z (r < TOK), t0 = blockIdx.x * TOK *
// blockDim.z. The head, and so the q-or-k choice, its pointer and its row
// stride, is fixed per thread: the hot path has no division and no select.
//
// Why this shape (v2 held 4 heads of one token: 112 registers, 126 fused,
// at most 16 warps per SM, 70.7% of copy at T = 32768 on one H200):
//  - TOK tokens of ONE head per thread (4 for Qwen3): the same 8 data loads
//    of 16 bytes in flight per thread as v2, but a thread keeps one head's
//    base pointer and, fused, one weight slice (loaded once, used 4 times).
//  - The cos/sin rows of the block's tokens are loaded once per block into
//    shared memory (2 KB for 4 tokens of D = 128) by all its threads
//    together, and read from there per token: so no thread holds cos/sin
//    for more than the token it is working on, and the registers that v2
//    spent on them are free (see rope_v3_max_threads for the count).
//  - The data stay packed two bf16 to a register until used (bf16_pack).
//  - Blocks of LANES x heads x TZ threads: Qwen3's 24 heads x 8 lanes are
//    192 threads, 6 full warps (v2: 240, a partial warp per block); for
//    other head counts the launcher picks TZ tokens side by side so the
//    block is still a whole number of warps where it can.
// One __syncthreads() (after the cos/sin rows are in shared memory): no
// thread returns before it, out-of-range tokens are skipped by guards.
// bf16 kept packed, two to a 32-bit word, as loaded: v2's bf16_vec holds
// each bf16 as its own 16-bit value, which the compiler spreads over one
// register each and unpacks early (part of v2's 112 registers). Here a
// value is taken out of its word only when it is used: the low bf16 of a
// word is the word shifted up 16 bits, the high one the word with its low
// 16 bits cleared (a bf16 is the top half of an fp32), and two results go
// back into one word with one conversion (cvt.rn.bf16x2.f32: round to
// nearest even, as __float2bfloat16).
template <int VEC>
struct alignas(2 * VEC) bf16_pack {
    uint32_t w[VEC / 2];
};
template <>
struct alignas(2) bf16_pack<1> {  // the scalar fallback: one bf16
    uint16_t h;
};

template <int VEC>
__device__ __forceinline__ float pack_get(const bf16_pack<VEC> &p, int e) {
    if constexpr (VEC == 1) return __uint_as_float((uint32_t)p.h << 16);
    else return (e & 1) ? __uint_as_float(p.w[e / 2] & 0xffff0000u) : __uint_as_float(p.w[e / 2] << 16);
}

template <int VEC>
__device__ __forceinline__ bf16_pack<VEC> pack_from(const float (&f)[VEC]) {
    bf16_pack<VEC> p;
    if constexpr (VEC == 1) {
        p.h = __bfloat16_as_ushort(__float2bfloat16(f[0]));
    } else {
#pragma unroll
        for (int i = 0; i < VEC / 2; i++) {
            const __nv_bfloat162 two = __floats2bfloat162_rn(f[2 * i], f[2 * i + 1]);  // .x = low half
            p.w[i] = (uint32_t)__bfloat16_as_ushort(two.x) | ((uint32_t)__bfloat16_as_ushort(two.y) << 16);
        }
    }
    return p;
}

extern __shared__ __align__(32) float rope_smem[];  // [TZ * TOK, D] fp32: cos row then sin row per token

// Register budget: 65536 per SM. The plain kernel fits 64 registers (4
// tokens held: 32 for the data, the rest addresses and one token's cos/sin
// and results), so blocks of up to 1024 threads; 192-thread blocks then
// fit 5 per SM, 30 warps. The fused one also holds its weight slice and
// needs 72 (at 64 the compiler spilled 24 bytes): blocks of up to 768
// threads, 4 per SM at 192, 24 warps. Either way 96 to 120 KB of loads in
// flight per SM (v2: 60 KB in 2 blocks).
template <bool NORM>
constexpr int rope_v3_max_threads() {
    return NORM ? 768 : 1024;
}

template <int VEC, int LANES, int CACHE, int TOK, bool NORM>
__global__ void __launch_bounds__(rope_v3_max_threads<NORM>())
rope_kernel_v3(bf16 *q, long long q_stride, bf16 *k, long long k_stride, const int32_t *positions,
               const float *cos_sin, const bf16 *q_w, const bf16 *k_w, int T, int H, int D, int max_pos,
               float eps) {
    using vec_t = bf16_pack<VEC>;
    using fvec_t = f32_vec<VEC>;
    constexpr int CV = VEC < 4 ? VEC : 4;  // floats per cos/sin copy (16 bytes at most)
    using cvec_t = f32_vec<CV>;
    const int lane = threadIdx.x;
    const int h = blockIdx.y * blockDim.y + threadIdx.y;
    const int TZ = blockDim.z;
    const long long t0 = (long long)blockIdx.x * TOK * TZ;
    const int half = D / 2, nvec = half / VEC;

    // The LANES threads of a head are consecutive in the block's thread
    // order and start at a multiple of LANES (a power of two <= 32), so they
    // sit in one warp; the shuffle mask names exactly them.
    const int tid = threadIdx.x + LANES * (threadIdx.y + blockDim.y * threadIdx.z);
    const unsigned mask = LANES == 32 ? 0xffffffffu : (((1u << LANES) - 1u) << ((tid % 32) - lane));

    const bool is_q = h < H;
    bf16 *head = is_q ? q + (long long)h * D : k + (long long)(h - H) * D;
    const long long stride = is_q ? q_stride : k_stride;

    // 1. Every data load of the thread (TOK tokens x CACHE pairs) goes out first.
    vec_t x1[TOK][CACHE], x2[TOK][CACHE];
#pragma unroll
    for (int r = 0; r < TOK; r++) {
        const long long t = t0 + (long long)r * TZ + threadIdx.z;
        if (t < T) {
            const vec_t *first = reinterpret_cast<const vec_t *>(head + t * stride);
            const vec_t *second = reinterpret_cast<const vec_t *>(head + t * stride + half);
#pragma unroll
            for (int c = 0; c < CACHE; c++) {
                const int j = lane + c * LANES;
                if (j < nvec) {
                    x1[r][c] = first[j];
                    x2[r][c] = second[j];
                }
            }
        }
    }

    // 2. The block's TZ * TOK cos/sin rows into shared memory, all threads
    // together, CV floats (16 bytes) at a time: Qwen3's 4 rows of 128 fp32
    // are 128 copies for 192 threads, one each. (A division per copy, not
    // per element: for Qwen3 once per thread.)
    {
        const int nthreads = LANES * blockDim.y * TZ, units = D / CV, rows = TOK * TZ;
        for (int i = tid; i < rows * units; i += nthreads) {
            const int s = i / units, u = i - s * units;
            if (t0 + s < T) {
                const int pos = positions[t0 + s];
                check_position(pos, max_pos);
                reinterpret_cast<cvec_t *>(rope_smem + s * D)[u] =
                    reinterpret_cast<const cvec_t *>(cos_sin + (long long)pos * D)[u];
            }
        }
    }
    __syncthreads();

    // The norm weights (fused): this head's slice, loaded once for all TOK tokens.
    vec_t wa[CACHE], wb[CACHE];
    if constexpr (NORM) {
        const vec_t *w1 = reinterpret_cast<const vec_t *>(is_q ? q_w : k_w);
        const vec_t *w2 = reinterpret_cast<const vec_t *>((is_q ? q_w : k_w) + half);
#pragma unroll
        for (int c = 0; c < CACHE; c++) {
            const int j = lane + c * LANES;
            if (j < nvec) {
                wa[c] = w1[j];
                wb[c] = w2[j];
            }
        }
    }

    // 3. Per token: (norm,) rotate with the token's cos/sin from shared memory, store.
#pragma unroll
    for (int r = 0; r < TOK; r++) {
        const int s = r * TZ + threadIdx.z;  // the token's row in rope_smem
        const long long t = t0 + s;
        if (t >= T) break;  // the same for the whole group
        vec_t *first = reinterpret_cast<vec_t *>(head + t * stride);
        vec_t *second = reinterpret_cast<vec_t *>(head + t * stride + half);
        const fvec_t *cos_v = reinterpret_cast<const fvec_t *>(rope_smem + s * D);
        const fvec_t *sin_v = reinterpret_cast<const fvec_t *>(rope_smem + s * D + half);
        float inv_rms = 1.0f;
        if constexpr (NORM) {
            float sum_sq = 0.0f;
#pragma unroll
            for (int c = 0; c < CACHE; c++)
                if (lane + c * LANES < nvec)
#pragma unroll
                    for (int e = 0; e < VEC; e++) {
                        const float a = pack_get(x1[r][c], e), b = pack_get(x2[r][c], e);
                        sum_sq += a * a + b * b;
                    }
            inv_rms = group_inv_rms<LANES>(sum_sq, mask, D, eps);  // every lane of the group calls it
        }
#pragma unroll
        for (int c = 0; c < CACHE; c++) {
            const int j = lane + c * LANES;
            if (j < nvec) {
                const fvec_t cs = cos_v[j], sn = sin_v[j];
                float o1[VEC], o2[VEC];
#pragma unroll
                for (int e = 0; e < VEC; e++) {
                    float a = pack_get(x1[r][c], e), b = pack_get(x2[r][c], e);
                    if constexpr (NORM) {  // the same order of operations as v1 and v2
                        a = a * inv_rms * pack_get(wa[c], e);
                        b = b * inv_rms * pack_get(wb[c], e);
                    }
                    const float co = cs.v[e], si = sn.v[e];
                    o1[e] = a * co - b * si;
                    o2[e] = b * co + a * si;
                }
                first[j] = pack_from<VEC>(o1);
                second[j] = pack_from<VEC>(o2);
            }
        }
    }
}

// ---- version 4: the fused form with 2 tokens per thread and the head size fixed ----
// On one H200 at T = 32768, version 3's plain form runs at 89.6% of copy,
// its fused form at 75.4% in the QKV rows. The fused thread does about twice the plain one's instructions per
// token (sum of squares, 3 shuffles, a division and rsqrt, 32 more
// multiplies, the weights unpacked) with 79 registers: 4 blocks, 24 warps per
// SM, and each warp's 4 tokens are worked through one after the other once
// their loads are in. Version 4 changes three things for the fused form
// (docs/perf-notes.md has the count):
//  - TOK = 2 tokens per thread: half as long a stretch of arithmetic per
//    warp once its loads are in, and half the data registers. nvcc 13.0
//    (sm_90) still takes 64 registers (it keeps a token's 16 unpacked
//    floats from the sum of squares to the rotation); at 56 it spills 8
//    bytes, at 40 over 100. So __launch_bounds__(192, 5): 5 blocks of 192
//    per SM, 30 warps, as the plain form (v3 fused: 4 blocks, 24 warps).
//  - The head size is a template constant (D = 2 * VEC * LANES: one vector
//    pair per lane, which is Qwen3's 128 = 2 x 8 x 8): no lane guards, and
//    group_inv_rms's "/ (float)n" becomes a multiply by 1/128 instead of a
//    full-precision fp32 division. Other head sizes take version 3's path.
//  - Both tokens' sums of squares are taken before either reduction, so the
//    two 3-shuffle reductions are independent and overlap.
// Measured on one H200 (QKV rows, T = 32768): 125.2 us, 76.9% of copy,
// against version 3's 75.4%; at T = 8192, 68.9% against 65.9%. So 30 warps
// per SM instead of 24 bought little; version 6 (the sweep below) shows
// what does.
// The plain form is version 3's unchanged (it met its target: its 64
// registers and 4 tokens per thread are what got it there).
template <int VEC, int LANES, int TOK>
__global__ void __launch_bounds__(192, 5)
qk_norm_rope_kernel_v4(bf16 *q, long long q_stride, bf16 *k, long long k_stride, const int32_t *positions,
                       const float *cos_sin, const bf16 *q_w, const bf16 *k_w, int T, int H, int max_pos,
                       float eps) {
    using vec_t = bf16_pack<VEC>;
    using fvec_t = f32_vec<VEC>;
    constexpr int D = 2 * VEC * LANES, HALF = D / 2;
    constexpr int CV = VEC < 4 ? VEC : 4;  // floats per cos/sin copy (16 bytes at most)
    using cvec_t = f32_vec<CV>;
    const int lane = threadIdx.x;
    const int h = blockIdx.y * blockDim.y + threadIdx.y;
    const int TZ = blockDim.z;
    const long long t0 = (long long)blockIdx.x * TOK * TZ;

    const int tid = threadIdx.x + LANES * (threadIdx.y + blockDim.y * threadIdx.z);
    const unsigned mask = LANES == 32 ? 0xffffffffu : (((1u << LANES) - 1u) << ((tid % 32) - lane));

    const bool is_q = h < H;
    bf16 *head = is_q ? q + (long long)h * D : k + (long long)(h - H) * D;
    const long long stride = is_q ? q_stride : k_stride;

    // 1. The data loads of both tokens, then the weights (L1/L2 hits).
    vec_t x1[TOK], x2[TOK];
#pragma unroll
    for (int r = 0; r < TOK; r++) {
        const long long t = t0 + (long long)r * TZ + threadIdx.z;
        if (t < T) {
            x1[r] = reinterpret_cast<const vec_t *>(head + t * stride)[lane];
            x2[r] = reinterpret_cast<const vec_t *>(head + t * stride + HALF)[lane];
        }
    }
    const bf16 *w = is_q ? q_w : k_w;
    const vec_t wa = reinterpret_cast<const vec_t *>(w)[lane];
    const vec_t wb = reinterpret_cast<const vec_t *>(w + HALF)[lane];

    // 2. The block's TOK * TZ cos/sin rows into shared memory (as version 3).
    {
        constexpr int UNITS = D / CV;
        const int nthreads = LANES * blockDim.y * TZ, rows = TOK * TZ;
        for (int i = tid; i < rows * UNITS; i += nthreads) {
            const int s = i / UNITS, u = i - s * UNITS;
            if (t0 + s < T) {
                const int pos = positions[t0 + s];
                check_position(pos, max_pos);
                reinterpret_cast<cvec_t *>(rope_smem + s * D)[u] =
                    reinterpret_cast<const cvec_t *>(cos_sin + (long long)pos * D)[u];
            }
        }
    }

    // 3. Both tokens' 1/rms, before the barrier: the sums of squares first,
    // then the two group reductions side by side. A token past T has no
    // data; its (unused) sum is of zeros, and all lanes of the group still
    // take part in the shuffles.
    float inv_rms[TOK];
    {
        float sum_sq[TOK];
#pragma unroll
        for (int r = 0; r < TOK; r++) {
            sum_sq[r] = 0.0f;
            if (t0 + (long long)r * TZ + threadIdx.z < T)
#pragma unroll
                for (int e = 0; e < VEC; e++) {
                    const float a = pack_get(x1[r], e), b = pack_get(x2[r], e);
                    sum_sq[r] += a * a + b * b;
                }
        }
#pragma unroll
        for (int r = 0; r < TOK; r++) inv_rms[r] = group_inv_rms<LANES>(sum_sq[r], mask, D, eps);
    }
    __syncthreads();

    // 4. Per token: norm, rotate with the token's cos/sin from shared memory, store.
#pragma unroll
    for (int r = 0; r < TOK; r++) {
        const int s = r * TZ + threadIdx.z;
        const long long t = t0 + s;
        if (t >= T) break;
        const fvec_t cs = reinterpret_cast<const fvec_t *>(rope_smem + s * D)[lane];
        const fvec_t sn = reinterpret_cast<const fvec_t *>(rope_smem + s * D + HALF)[lane];
        float o1[VEC], o2[VEC];
#pragma unroll
        for (int e = 0; e < VEC; e++) {
            // The same order of operations as versions 1 to 3.
            const float a = pack_get(x1[r], e) * inv_rms[r] * pack_get(wa, e);
            const float b = pack_get(x2[r], e) * inv_rms[r] * pack_get(wb, e);
            const float co = cs.v[e], si = sn.v[e];
            o1[e] = a * co - b * si;
            o2[e] = b * co + a * si;
        }
        reinterpret_cast<vec_t *>(head + t * stride)[lane] = pack_from<VEC>(o1);
        reinterpret_cast<vec_t *>(head + t * stride + HALF)[lane] = pack_from<VEC>(o2);
    }
}

// ---- launchers -----------------------------------------------------------------------

// The widest vector (8, 4, 2 or 1 elements) such that half = D/2 splits into
// whole vectors, every row stride keeps rows aligned, and every pointer is
// aligned to the vector (bf16 pointers to 2*VEC bytes, the fp32 cache to
// 4*VEC bytes: its row offsets pos*D and pos*D + D/2 are multiples of VEC
// once D/2 is).
static int pick_vec(int half, long long q_stride, long long k_stride, const void *q, const void *k,
                    const void *q_w, const void *k_w, const float *cos_sin) {
    for (int vec = 8; vec > 1; vec /= 2) {
        if (half % vec || q_stride % vec || k_stride % vec) continue;
        if (!mv_aligned(q, 2 * vec) || !mv_aligned(k, 2 * vec) || !mv_aligned(q_w, 2 * vec) ||
            !mv_aligned(k_w, 2 * vec) || !mv_aligned(cos_sin, 4 * vec))
            continue;
        return vec;
    }
    return 1;
}

template <int VEC, int LANES, int CACHE, int HPT, bool NORM>
static void launch_v2_shape(bf16 *q, long long qs, bf16 *k, long long ks, const int32_t *pos,
                            const float *cs, const bf16 *qw, const bf16 *kw, int T, int H, int Hkv, int D,
                            int max_pos, float eps, cudaStream_t s) {
    // Up to 256 threads per block: head groups along y, tokens along z.
    const int groups = (H + Hkv + HPT - 1) / HPT;
    const int gy = groups < 256 / LANES ? groups : 256 / LANES;
    int tz = 256 / (LANES * gy);
    if (tz > 64) tz = 64;  // blockDim.z is at most 64
    if (tz < 1) tz = 1;
    dim3 block(LANES, gy, tz);
    dim3 grid((unsigned)((T + tz - 1) / tz), (unsigned)((groups + gy - 1) / gy));
    rope_kernel_v2<VEC, LANES, CACHE, HPT, NORM><<<grid, block, 0, s>>>(q, qs, k, ks, pos, cs, qw, kw, T, H, Hkv,
                                                                        D, max_pos, eps);
}

template <int VEC, bool NORM>
static void launch_v2(bf16 *q, long long qs, bf16 *k, long long ks, const int32_t *pos, const float *cs,
                      const bf16 *qw, const bf16 *kw, int T, int H, int Hkv, int D, int max_pos, float eps,
                      cudaStream_t s) {
    // LANES: one vector pair per lane when a half has up to 32 vectors;
    // longer halves give each of 32 lanes CACHE pairs (D <= 512, so at
    // most 256 vectors per half: CACHE <= 8). Fewer heads per thread when
    // each head takes more registers.
    // Shapes a vector width cannot reach (D <= ROPE_MAX_HEAD_DIM bounds
    // nvec by ROPE_MAX_HEAD_DIM / 2 / VEC) are not instantiated at all.
    constexpr int MAX_NVEC = ROPE_MAX_HEAD_DIM / 2 / VEC;
    const int nvec = D / 2 / VEC;
    if (nvec <= 4) launch_v2_shape<VEC, 4, 1, 4, NORM>(q, qs, k, ks, pos, cs, qw, kw, T, H, Hkv, D, max_pos, eps, s);
    else if (nvec <= 8) launch_v2_shape<VEC, 8, 1, 4, NORM>(q, qs, k, ks, pos, cs, qw, kw, T, H, Hkv, D, max_pos, eps, s);
    else if (nvec <= 16) launch_v2_shape<VEC, 16, 1, 4, NORM>(q, qs, k, ks, pos, cs, qw, kw, T, H, Hkv, D, max_pos, eps, s);
    else if (nvec <= 32) launch_v2_shape<VEC, 32, 1, 4, NORM>(q, qs, k, ks, pos, cs, qw, kw, T, H, Hkv, D, max_pos, eps, s);
    else if constexpr (MAX_NVEC > 32) {
        if (nvec <= 64) launch_v2_shape<VEC, 32, 2, 2, NORM>(q, qs, k, ks, pos, cs, qw, kw, T, H, Hkv, D, max_pos, eps, s);
        else if constexpr (MAX_NVEC > 64) {
            if (nvec <= 128) launch_v2_shape<VEC, 32, 4, 1, NORM>(q, qs, k, ks, pos, cs, qw, kw, T, H, Hkv, D, max_pos, eps, s);
            else if constexpr (MAX_NVEC > 128) {
                launch_v2_shape<VEC, 32, 8, 1, NORM>(q, qs, k, ks, pos, cs, qw, kw, T, H, Hkv, D, max_pos, eps, s);
            }
        }
    }
}

template <bool NORM>
static void dispatch_v2(bf16 *q, long long qs, bf16 *k, long long ks, const int32_t *pos, const float *cs,
                        const bf16 *qw, const bf16 *kw, int T, int H, int Hkv, int D, int max_pos, float eps,
                        cudaStream_t s) {
    // Without a norm there are no weights: q stands in for their alignment.
    const void *aw = NORM ? (const void *)qw : (const void *)q, *bw = NORM ? (const void *)kw : (const void *)q;
    switch (pick_vec(D / 2, qs, ks, q, k, aw, bw, cs)) {
    case 8: launch_v2<8, NORM>(q, qs, k, ks, pos, cs, qw, kw, T, H, Hkv, D, max_pos, eps, s); break;
    case 4: launch_v2<4, NORM>(q, qs, k, ks, pos, cs, qw, kw, T, H, Hkv, D, max_pos, eps, s); break;
    case 2: launch_v2<2, NORM>(q, qs, k, ks, pos, cs, qw, kw, T, H, Hkv, D, max_pos, eps, s); break;
    default: launch_v2<1, NORM>(q, qs, k, ks, pos, cs, qw, kw, T, H, Hkv, D, max_pos, eps, s); break;
    }
}

template <int VEC, int LANES, int CACHE, int TOK, bool NORM>
static void launch_v3_tok(dim3 grid, dim3 block, bf16 *q, long long qs, bf16 *k, long long ks, const int32_t *pos,
                          const float *cs, const bf16 *qw, const bf16 *kw, int T, int H, int D, int max_pos,
                          float eps, cudaStream_t s) {
    const size_t smem = sizeof(float) * (size_t)TOK * block.z * (size_t)D;  // <= 8 KB (see launch_v3_shape)
    rope_kernel_v3<VEC, LANES, CACHE, TOK, NORM><<<grid, block, smem, s>>>(q, qs, k, ks, pos, cs, qw, kw, T, H, D,
                                                                           max_pos, eps);
}

template <int VEC, int LANES, int CACHE, bool NORM>
static int launch_v3_shape(bf16 *q, long long qs, bf16 *k, long long ks, const int32_t *pos, const float *cs,
                           const bf16 *qw, const bf16 *kw, int T, int H, int Hkv, int D, int max_pos, float eps,
                           cudaStream_t s) {
    // Heads per block: the largest divisor of H + Hkv that keeps LANES x heads
    // within the kernel's thread limit (all 24 of Qwen3-0.6B's, all 72 of
    // Qwen3-32B's).
    constexpr int MAX_THREADS = rope_v3_max_threads<NORM>();
    const int nheads = H + Hkv;
    int hpb = nheads < MAX_THREADS / LANES ? nheads : MAX_THREADS / LANES;
    while (nheads % hpb) hpb--;
    if (nheads / hpb > 65535)
        return mv_error("rope v3: %d heads need %d blocks along y (at most 65535)", nheads, nheads / hpb);
    // Tokens side by side (z) until the block is a whole number of warps:
    // 24 heads x 8 lanes = 192 threads need none; 5 heads x 4 lanes = 20
    // take 8 tokens (160 threads). Where that would pass the thread limit the
    // last warp stays partial, which is correct, only less efficient.
    int tz = 1;
    while ((LANES * hpb * tz) % 32 && LANES * hpb * tz * 2 <= MAX_THREADS) tz *= 2;
    dim3 block(LANES, hpb, tz);
    // Four tokens per thread when the GPU has enough tokens to fill it that
    // way; fewer tokens (decode, short prefill) take one each, for more
    // blocks. (Only heads of one vector pair per lane take four: CACHE > 1
    // would need more registers.) Shared memory: TOK * tz rows of D fp32;
    // at most 8 KB, since tz * D <= 4 * 128 (LANES = 8), 2 * 256 (16),
    // 8 * 64 (4) or 1 * 512 (32) with VEC = 8, less with narrower vectors.
    if constexpr (CACHE == 1) {
        if ((long long)T >= 4LL * tz * mv_num_sms()) {
            dim3 grid((unsigned)((T + 4LL * tz - 1) / (4LL * tz)), (unsigned)(nheads / hpb));
            launch_v3_tok<VEC, LANES, CACHE, 4, NORM>(grid, block, q, qs, k, ks, pos, cs, qw, kw, T, H, D, max_pos,
                                                      eps, s);
            return 0;
        }
    }
    dim3 grid((unsigned)((T + tz - 1) / tz), (unsigned)(nheads / hpb));
    launch_v3_tok<VEC, LANES, CACHE, 1, NORM>(grid, block, q, qs, k, ks, pos, cs, qw, kw, T, H, D, max_pos, eps, s);
    return 0;
}

template <int VEC, bool NORM>
static int launch_v3(bf16 *q, long long qs, bf16 *k, long long ks, const int32_t *pos, const float *cs,
                     const bf16 *qw, const bf16 *kw, int T, int H, int Hkv, int D, int max_pos, float eps,
                     cudaStream_t s) {
    // LANES as in v2: one vector pair per lane up to 32 vectors per half,
    // then CACHE pairs for each of 32 lanes.
    constexpr int MAX_NVEC = ROPE_MAX_HEAD_DIM / 2 / VEC;
    const int nvec = D / 2 / VEC;
    if (nvec <= 4) return launch_v3_shape<VEC, 4, 1, NORM>(q, qs, k, ks, pos, cs, qw, kw, T, H, Hkv, D, max_pos, eps, s);
    if (nvec <= 8) return launch_v3_shape<VEC, 8, 1, NORM>(q, qs, k, ks, pos, cs, qw, kw, T, H, Hkv, D, max_pos, eps, s);
    if (nvec <= 16) return launch_v3_shape<VEC, 16, 1, NORM>(q, qs, k, ks, pos, cs, qw, kw, T, H, Hkv, D, max_pos, eps, s);
    if (nvec <= 32) return launch_v3_shape<VEC, 32, 1, NORM>(q, qs, k, ks, pos, cs, qw, kw, T, H, Hkv, D, max_pos, eps, s);
    if constexpr (MAX_NVEC > 32) {
        if (nvec <= 64) return launch_v3_shape<VEC, 32, 2, NORM>(q, qs, k, ks, pos, cs, qw, kw, T, H, Hkv, D, max_pos, eps, s);
        if constexpr (MAX_NVEC > 64) {
            if (nvec <= 128) return launch_v3_shape<VEC, 32, 4, NORM>(q, qs, k, ks, pos, cs, qw, kw, T, H, Hkv, D, max_pos, eps, s);
            if constexpr (MAX_NVEC > 128)
                return launch_v3_shape<VEC, 32, 8, NORM>(q, qs, k, ks, pos, cs, qw, kw, T, H, Hkv, D, max_pos, eps, s);
        }
    }
    return mv_error("rope v3: head_dim %d is not supported", D);  // unreachable: rope_validate bounds D
}

template <bool NORM>
static int dispatch_v3(bf16 *q, long long qs, bf16 *k, long long ks, const int32_t *pos, const float *cs,
                       const bf16 *qw, const bf16 *kw, int T, int H, int Hkv, int D, int max_pos, float eps,
                       cudaStream_t s) {
    const void *aw = NORM ? (const void *)qw : (const void *)q, *bw = NORM ? (const void *)kw : (const void *)q;
    switch (pick_vec(D / 2, qs, ks, q, k, aw, bw, cs)) {
    case 8: return launch_v3<8, NORM>(q, qs, k, ks, pos, cs, qw, kw, T, H, Hkv, D, max_pos, eps, s);
    case 4: return launch_v3<4, NORM>(q, qs, k, ks, pos, cs, qw, kw, T, H, Hkv, D, max_pos, eps, s);
    case 2: return launch_v3<2, NORM>(q, qs, k, ks, pos, cs, qw, kw, T, H, Hkv, D, max_pos, eps, s);
    default: return launch_v3<1, NORM>(q, qs, k, ks, pos, cs, qw, kw, T, H, Hkv, D, max_pos, eps, s);
    }
}

// Version 4 of the fused form: the head sizes of one vector pair per lane
// (D = 2 * VEC * LANES) take qk_norm_rope_kernel_v4; any other takes v3.
// The block is version 3's (LANES x heads x tz, a whole number of warps
// where it can), within the kernel's 192 threads.
template <int VEC, int LANES>
static void launch_v4_shape(bf16 *q, long long qs, bf16 *k, long long ks, const int32_t *pos, const float *cs,
                            const bf16 *qw, const bf16 *kw, int T, int H, int Hkv, int max_pos, float eps,
                            cudaStream_t s) {
    constexpr int MAX_THREADS = 192, D = 2 * VEC * LANES;  // the kernel's __launch_bounds__
    const int nheads = H + Hkv;
    int hpb = nheads < MAX_THREADS / LANES ? nheads : MAX_THREADS / LANES;
    while (nheads % hpb) hpb--;
    int tz = 1;
    while ((LANES * hpb * tz) % 32 && LANES * hpb * tz * 2 <= MAX_THREADS) tz *= 2;
    dim3 block(LANES, hpb, tz);
    // Two tokens per thread when that still gives every SM a block; one otherwise.
    // Shared memory: TOK * tz rows of D fp32, at most 2 KB (tz * D <= 256).
    if ((long long)T >= 2LL * tz * mv_num_sms()) {
        dim3 grid((unsigned)((T + 2LL * tz - 1) / (2LL * tz)), (unsigned)(nheads / hpb));
        qk_norm_rope_kernel_v4<VEC, LANES, 2><<<grid, block, sizeof(float) * 2 * tz * D, s>>>(
            q, qs, k, ks, pos, cs, qw, kw, T, H, max_pos, eps);
    } else {
        dim3 grid((unsigned)((T + tz - 1) / tz), (unsigned)(nheads / hpb));
        qk_norm_rope_kernel_v4<VEC, LANES, 1><<<grid, block, sizeof(float) * tz * D, s>>>(
            q, qs, k, ks, pos, cs, qw, kw, T, H, max_pos, eps);
    }
}

// ---- version 6: a member of kernels/rope_fused.cuh, the fused form the engine uses ----
// The fastest member of tests/gpu/rope_sweep.cu goes in ONE line, the
// alias below: rope_v6_config<TOK, MINB, COSSIN, MATH> as the sweep's table
// names them (COSSIN 2 is a diagnostic and cannot be used: the device cache
// has no inv_freq).
template <int TOK_, int MINB_, int COSSIN_, int MATH_>
struct rope_v6_config {
    static_assert(COSSIN_ != 2, "COSSIN 2 needs inv_freq on the device");
    static constexpr int TOK = TOK_, MINB = MINB_, COSSIN = COSSIN_, MATH = MATH_;
};
using ROPE_V6 = rope_v6_config<1, 8, 1, 1>;  // <- the sweep's "tok1 lb(192,8) global->regs rot(x*w)*r"

template <int VEC, int LANES>
static void launch_v6_shape(bf16 *q, long long qs, bf16 *k, long long ks, const int32_t *pos, const float *cs,
                            const bf16 *qw, const bf16 *kw, int T, int H, int Hkv, int max_pos, float eps,
                            cudaStream_t s) {
    // As version 4: TOK tokens per thread while that still gives every SM a block, else one.
    if ((long long)T >= (long long)ROPE_V6::TOK * mv_num_sms())
        rope_fused::launch<VEC, LANES, ROPE_V6::TOK, ROPE_V6::MINB, ROPE_V6::COSSIN, ROPE_V6::MATH>(
            q, qs, k, ks, pos, cs, NULL, qw, kw, T, H, Hkv, max_pos, eps, s);
    else
        rope_fused::launch<VEC, LANES, 1, ROPE_V6::MINB, ROPE_V6::COSSIN, ROPE_V6::MATH>(
            q, qs, k, ks, pos, cs, NULL, qw, kw, T, H, Hkv, max_pos, eps, s);
}

// ---- the dispatch versions 4 and 6 of the fused form share ----------------------
// Pick the vector width VEC (pick_vec: what D, the strides and the pointers
// allow), then the lanes per head so that D = 2 * VEC * LANES; any other head
// size takes version 3's kernel. Shape is a struct naming one version's
// launcher as Shape::run<VEC, LANES>(...) and the smallest VEC it takes.
struct fused_v4_shape {
    static constexpr int MIN_VEC = 1;
    template <int VEC, int LANES>
    static void run(bf16 *q, long long qs, bf16 *k, long long ks, const int32_t *pos, const float *cs,
                    const bf16 *qw, const bf16 *kw, int T, int H, int Hkv, int max_pos, float eps, cudaStream_t s) {
        launch_v4_shape<VEC, LANES>(q, qs, k, ks, pos, cs, qw, kw, T, H, Hkv, max_pos, eps, s);
    }
};
struct fused_v6_shape {
    static constexpr int MIN_VEC = 2;  // rope_fused packs bf16 in pairs
    template <int VEC, int LANES>
    static void run(bf16 *q, long long qs, bf16 *k, long long ks, const int32_t *pos, const float *cs,
                    const bf16 *qw, const bf16 *kw, int T, int H, int Hkv, int max_pos, float eps, cudaStream_t s) {
        launch_v6_shape<VEC, LANES>(q, qs, k, ks, pos, cs, qw, kw, T, H, Hkv, max_pos, eps, s);
    }
};

template <class Shape, int VEC>
static int launch_fused_lanes(bf16 *q, long long qs, bf16 *k, long long ks, const int32_t *pos, const float *cs,
                              const bf16 *qw, const bf16 *kw, int T, int H, int Hkv, int D, int max_pos, float eps,
                              cudaStream_t s) {
    if constexpr (VEC >= Shape::MIN_VEC) {
        if (D == 2 * VEC * 8) {
            Shape::template run<VEC, 8>(q, qs, k, ks, pos, cs, qw, kw, T, H, Hkv, max_pos, eps, s);
            return 0;
        }
        if (D == 2 * VEC * 4) {
            Shape::template run<VEC, 4>(q, qs, k, ks, pos, cs, qw, kw, T, H, Hkv, max_pos, eps, s);
            return 0;
        }
        if (D == 2 * VEC * 16) {
            Shape::template run<VEC, 16>(q, qs, k, ks, pos, cs, qw, kw, T, H, Hkv, max_pos, eps, s);
            return 0;
        }
        if (D == 2 * VEC * 32) {
            Shape::template run<VEC, 32>(q, qs, k, ks, pos, cs, qw, kw, T, H, Hkv, max_pos, eps, s);
            return 0;
        }
    }
    return launch_v3<VEC, true>(q, qs, k, ks, pos, cs, qw, kw, T, H, Hkv, D, max_pos, eps, s);
}

template <class Shape>
static int dispatch_fused(bf16 *q, long long qs, bf16 *k, long long ks, const int32_t *pos, const float *cs,
                          const bf16 *qw, const bf16 *kw, int T, int H, int Hkv, int D, int max_pos, float eps,
                          cudaStream_t s) {
    switch (pick_vec(D / 2, qs, ks, q, k, qw, kw, cs)) {
    case 8: return launch_fused_lanes<Shape, 8>(q, qs, k, ks, pos, cs, qw, kw, T, H, Hkv, D, max_pos, eps, s);
    case 4: return launch_fused_lanes<Shape, 4>(q, qs, k, ks, pos, cs, qw, kw, T, H, Hkv, D, max_pos, eps, s);
    case 2: return launch_fused_lanes<Shape, 2>(q, qs, k, ks, pos, cs, qw, kw, T, H, Hkv, D, max_pos, eps, s);
    default: return launch_fused_lanes<Shape, 1>(q, qs, k, ks, pos, cs, qw, kw, T, H, Hkv, D, max_pos, eps, s);
    }
}

static int check_version(const char *who, int version) {
    if (!rope_version_name(version)) return mv_error("%s: unknown version %d (1, 2, 3, 4 or 6)", who, version);
    return 0;
}

static int check_cache(const char *who, const rope_cache_gpu_t *cache) {
    if (!cache || !cache->d_cos_sin) return mv_error("%s: no cos/sin cache on the device (rope_cache_upload)", who);
    return 0;
}

extern "C" int rope_cache_upload(rope_cache_gpu_t *d_cache, const rope_cache_t *host_cache) {
    d_cache->d_cos_sin = NULL;
    if (!host_cache || !host_cache->cos_sin) return mv_error("rope_cache_upload: no host cache (rope_cache_build)");
    const size_t bytes = sizeof(float) * (size_t)host_cache->max_position * (size_t)host_cache->head_dim;
    if (CUDA_TRY(cudaMalloc((void **)&d_cache->d_cos_sin, bytes))) return -1;
    if (CUDA_TRY(cudaMemcpy(d_cache->d_cos_sin, host_cache->cos_sin, bytes, cudaMemcpyHostToDevice))) {
        cudaFree(d_cache->d_cos_sin);
        d_cache->d_cos_sin = NULL;
        return -1;
    }
    d_cache->max_position = host_cache->max_position;
    d_cache->head_dim = host_cache->head_dim;
    return 0;
}

extern "C" void rope_cache_gpu_free(rope_cache_gpu_t *d_cache) {
    if (d_cache->d_cos_sin) cudaFree(d_cache->d_cos_sin);
    d_cache->d_cos_sin = NULL;
}

extern "C" const char *rope_version_name(int version) {
    return kernel_version_name(ROPE_VERSION_TABLE, version);  // kernels/versions.h
}

extern "C" const char *qk_norm_rope_version_name(int version) {
    return kernel_version_name(QK_NORM_ROPE_VERSION_TABLE, version);  // kernels/versions.h
}

extern "C" int rope_cuda(int version, bf16_t *d_q, long long q_stride, bf16_t *d_k, long long k_stride,
                         const int32_t *d_positions, const rope_cache_gpu_t *cache, int T, int num_heads,
                         int num_kv_heads, int head_dim, cudaStream_t stream) {
    if (check_version("rope_cuda", version) || check_cache("rope_cuda", cache) ||
        rope_validate(T, num_heads, num_kv_heads, head_dim, q_stride, k_stride, cache->head_dim,
                      cache->max_position))
        return -1;
    if (T == 0) return 0;
    if (!d_q || !d_k || !d_positions) return mv_error("rope_cuda: null pointer for a non-empty tensor");
    bf16 *q = (bf16 *)d_q, *k = (bf16 *)d_k;
    if (version == 1) {
        const long long n = (long long)T * (num_heads + num_kv_heads) * (head_dim / 2);
        rope_kernel_v1<<<(unsigned)((n + 255) / 256), 256, 0, stream>>>(
            q, q_stride, k, k_stride, d_positions, cache->d_cos_sin, T, num_heads, num_kv_heads, head_dim,
            cache->max_position);
    } else if (version == 2) {
        dispatch_v2<false>(q, q_stride, k, k_stride, d_positions, cache->d_cos_sin, NULL, NULL, T, num_heads,
                           num_kv_heads, head_dim, cache->max_position, 0.0f, stream);
    } else if (dispatch_v3<false>(q, q_stride, k, k_stride, d_positions, cache->d_cos_sin, NULL, NULL, T, num_heads,
                                  num_kv_heads, head_dim, cache->max_position, 0.0f, stream)) {
        return -1;
    }
    return CUDA_TRY(cudaGetLastError());
}

extern "C" int qk_norm_rope_cuda(int version, bf16_t *d_qkv, const bf16_t *d_q_norm_w,
                                 const bf16_t *d_k_norm_w, const int32_t *d_positions,
                                 const rope_cache_gpu_t *cache, int T, int num_heads, int num_kv_heads,
                                 int head_dim, float eps, cudaStream_t stream) {
    const long long row = (long long)(num_heads + 2LL * num_kv_heads) * head_dim;
    if (check_version("qk_norm_rope_cuda", version) || check_cache("qk_norm_rope_cuda", cache) ||
        rope_validate(T, num_heads, num_kv_heads, head_dim, row, row, cache->head_dim, cache->max_position) ||
        rmsnorm_heads_validate(T, num_heads, head_dim, row, row, eps))
        return -1;
    if (T == 0) return 0;
    if (!d_qkv || !d_q_norm_w || !d_k_norm_w || !d_positions)
        return mv_error("qk_norm_rope_cuda: null pointer for a non-empty tensor");
    bf16 *q = (bf16 *)d_qkv, *k = q + (long long)num_heads * head_dim;
    const bf16 *qw = (const bf16 *)d_q_norm_w, *kw = (const bf16 *)d_k_norm_w;
    if (version == 1) {
        const long long n = (long long)T * (num_heads + num_kv_heads);
        qk_norm_rope_kernel_v1<<<(unsigned)((n + 127) / 128), 128, 0, stream>>>(
            q, qw, kw, d_positions, cache->d_cos_sin, T, num_heads, num_kv_heads, head_dim, cache->max_position, eps);
    } else if (version == 2) {
        dispatch_v2<true>(q, row, k, row, d_positions, cache->d_cos_sin, qw, kw, T, num_heads, num_kv_heads,
                          head_dim, cache->max_position, eps, stream);
    } else if (version == 3) {
        if (dispatch_v3<true>(q, row, k, row, d_positions, cache->d_cos_sin, qw, kw, T, num_heads, num_kv_heads,
                              head_dim, cache->max_position, eps, stream))
            return -1;
    } else {
        // Versions 4 and 6 share one dispatch (dispatch_fused above).
        const int rc = version == 4 ? dispatch_fused<fused_v4_shape>(q, row, k, row, d_positions, cache->d_cos_sin, qw,
                                                                     kw, T, num_heads, num_kv_heads, head_dim,
                                                                     cache->max_position, eps, stream)
                                    : dispatch_fused<fused_v6_shape>(q, row, k, row, d_positions, cache->d_cos_sin, qw,
                                                                     kw, T, num_heads, num_kv_heads, head_dim,
                                                                     cache->max_position, eps, stream);
        if (rc) return -1;
    }
    return CUDA_TRY(cudaGetLastError());
}

// ---- version 6 with the KV cache's store step (rope.h: qk_norm_rope_store_cuda) ----------

extern "C" int qk_norm_rope_store_fused(const bf16_t *d_qkv, const bf16_t *d_q_norm_w, const bf16_t *d_k_norm_w,
                                        const rope_cache_gpu_t *cache, const bf16_t *d_k_cache,
                                        const bf16_t *d_v_cache, int num_heads, int num_kv_heads, int head_dim) {
    const long long row = (long long)(num_heads + 2LL * num_kv_heads) * head_dim;
    const bf16_t *k = d_qkv + (long long)num_heads * head_dim;
    const int lanes = head_dim / 16;
    // Version 6's own choice of 16-byte vectors (pick_vec), and the caches' rows aligned to them.
    return head_dim % 16 == 0 && (lanes == 4 || lanes == 8 || lanes == 16 || lanes == 32) && cache &&
           pick_vec(head_dim / 2, row, row, d_qkv, k, d_q_norm_w, d_k_norm_w, cache->d_cos_sin) == 8 &&
           mv_aligned(d_k_cache, 16) && mv_aligned(d_v_cache, 16);
}

template <int LANES>
static void launch_store(bf16 *q, long long row, bf16 *k, const int32_t *pos, const float *cs, const bf16 *qw,
                         const bf16 *kw, int T, int H, int Hkv, int max_pos, float eps,
                         const rope_fused::store_args &st, cudaStream_t s) {
    // __launch_bounds__(192, 6): 56 registers. Version 6's 40 (MINB 8) spill
    // the v head held from its load to its store (nvcc 13.0, sm_90).
    rope_fused::launch<8, LANES, ROPE_V6::TOK, 6, ROPE_V6::COSSIN, ROPE_V6::MATH, 1>(
        q, row, k, row, pos, cs, NULL, qw, kw, T, H, Hkv, max_pos, eps, s, st);
}

extern "C" int qk_norm_rope_store_cuda(bf16_t *d_qkv, const bf16_t *d_q_norm_w, const bf16_t *d_k_norm_w,
                                       const int32_t *d_positions, const rope_cache_gpu_t *cache, bf16_t *d_k_cache,
                                       bf16_t *d_v_cache, const int32_t *d_slot_mapping, int T, int num_heads,
                                       int num_kv_heads, int head_dim, float eps, int block_size, int num_blocks,
                                       cudaStream_t stream) {
    const long long row = (long long)(num_heads + 2LL * num_kv_heads) * head_dim;
    if (check_cache("qk_norm_rope_store_cuda", cache) ||
        rope_validate(T, num_heads, num_kv_heads, head_dim, row, row, cache->head_dim, cache->max_position) ||
        rmsnorm_heads_validate(T, num_heads, head_dim, row, row, eps) ||
        kv_store_validate(T, num_kv_heads, head_dim, row, row, block_size, num_blocks))
        return -1;
    if (T == 0) return 0;
    if (!d_qkv || !d_q_norm_w || !d_k_norm_w || !d_positions || !d_k_cache || !d_v_cache || !d_slot_mapping)
        return mv_error("qk_norm_rope_store_cuda: null pointer for a non-empty tensor");
    if (d_k_cache == d_v_cache)
        return mv_error("qk_norm_rope_store_cuda: the K and V caches must be different buffers");
    bf16 *q = (bf16 *)d_qkv, *k = q + (long long)num_heads * head_dim;
    if (!qk_norm_rope_store_fused(d_qkv, d_q_norm_w, d_k_norm_w, cache, d_k_cache, d_v_cache, num_heads,
                                  num_kv_heads, head_dim))
        // Any other shape or alignment: the two kernels, which give the same bits.
        return qk_norm_rope_cuda(6, d_qkv, d_q_norm_w, d_k_norm_w, d_positions, cache, T, num_heads, num_kv_heads,
                                 head_dim, eps, stream) ||
               store_kvcache_cuda(KV_STORE_FAST, d_qkv + (long long)num_heads * head_dim, row,
                                  d_qkv + (long long)(num_heads + num_kv_heads) * head_dim, row, d_k_cache,
                                  d_v_cache, d_slot_mapping, T, num_kv_heads, head_dim, block_size, num_blocks,
                                  stream);
    rope_fused::store_args st;
    st.v = k + (long long)num_kv_heads * head_dim;
    st.v_stride = row;
    st.k_cache = (bf16 *)d_k_cache;
    st.v_cache = (bf16 *)d_v_cache;
    st.slot_mapping = d_slot_mapping;
    st.num_slots = (long long)num_blocks * block_size;
    st.num_kv_heads = num_kv_heads;
    const bf16 *qw = (const bf16 *)d_q_norm_w, *kw = (const bf16 *)d_k_norm_w;
    const int H = num_heads, Hkv = num_kv_heads, mp = cache->max_position;
    const float *cs = cache->d_cos_sin;
    switch (head_dim / 16) {
    case 4: launch_store<4>(q, row, k, d_positions, cs, qw, kw, T, H, Hkv, mp, eps, st, stream); break;
    case 8: launch_store<8>(q, row, k, d_positions, cs, qw, kw, T, H, Hkv, mp, eps, st, stream); break;
    case 16: launch_store<16>(q, row, k, d_positions, cs, qw, kw, T, H, Hkv, mp, eps, st, stream); break;
    default: launch_store<32>(q, row, k, d_positions, cs, qw, kw, T, H, Hkv, mp, eps, st, stream); break;
    }
    return CUDA_TRY(cudaGetLastError());
}

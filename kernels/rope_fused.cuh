/*
 * kernels/rope_fused.cuh - a family of fused q_norm/k_norm + RoPE kernels
 * for the experiment of tests/gpu/rope_sweep.cu, and the source of the
 * fused form's version 6 (ROPE_V6 in kernels/rope.cu).
 *
 * The shape is version 4's (kernels/rope.cu): a group of LANES lanes per
 * head, one vector pair of VEC bf16 per lane (D = 2 * VEC * LANES, Qwen3's
 * 128 = 2 x 8 x 8), heads along y, TOK tokens per thread. What varies:
 *
 *   TOK     tokens per thread (1, 2, 4): bytes in flight per thread.
 *   MINB    __launch_bounds__(192, MINB): 1 = no register cap (255), 4 =
 *           85, 5 = 64 (v4), 6 = 56, 8 = 40 registers (spills show as local bytes).
 *   COSSIN  where cos/sin come from:
 *           0  staged in shared memory by the whole block (positions and
 *              rows loaded after the data loads), one __syncthreads (v4);
 *           1  per thread, straight from the global cos/sin row into
 *              registers (positions loaded first, before the data), no
 *              barrier: VEC cos + VEC sin per token, L1/L2 hits after the
 *              token's first head;
 *           2  diagnostic: no cos/sin loads at all; each thread computes
 *              sincosf(pos * inv_freq) (the cache's fp32 angle; sincosf is
 *              within 2 fp32 ulps of the cache's double-rounded value), with
 *              its VEC inv_freq loaded once. Needs the inv_freq table, which
 *              the device cache does not carry: the sweep only.
 *   MATH    0  x * inv_rms * w, then rotate (versions 1 to 4's order);
 *           1  rotate x * w first, then one multiply by inv_rms: by
 *              linearity the same value, but the rotation no longer waits
 *              for the norm's shuffle reduction. Rounding differs by a few
 *              fp32 ulps before the one bf16 rounding: chapter 05's
 *              TOL_GPU_FUSED (half a bf16 ulp + 2e-5 relative, 1e-5 abs)
 *              allows it; it does not demand v1's order of operations.
 *
 *   STORE   0  q and k written back in place (qk_norm_rope_cuda);
 *           1  also the paged KV cache's store step (chapter 06's
 *              store_kvcache_cuda) in the same kernel: a k head's thread
 *              writes its normalised, rotated k to the token's slot as well,
 *              and copies the token's v head there (loaded with the k head),
 *              so that the [T, Hkv, D] k and v are not read again by a
 *              second kernel (qk_norm_rope_store_cuda, kernels/rope.h).
 *
 * Everything lives in namespace rope_fused so that kernels/rope.cu can
 * include this beside its own helpers.
 */
#ifndef MV_KERNELS_ROPE_FUSED_CUH
#define MV_KERNELS_ROPE_FUSED_CUH

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "kernels/common.cuh"
#include "kernels/rmsnorm.cuh"

namespace rope_fused {

typedef __nv_bfloat16 bf16;

template <int N>
struct alignas(4 * N) fvec {
    float v[N];
};

// VEC bf16 kept packed two to a 32-bit word (VEC = 2, 4 or 8).
template <int VEC>
struct alignas(2 * VEC) pack {
    uint32_t w[VEC / 2];
};

template <int VEC>
__device__ __forceinline__ float get(const pack<VEC> &p, int e) {
    return (e & 1) ? __uint_as_float(p.w[e / 2] & 0xffff0000u) : __uint_as_float(p.w[e / 2] << 16);
}

template <int VEC>
__device__ __forceinline__ pack<VEC> put(const float (&f)[VEC]) {
    pack<VEC> p;
#pragma unroll
    for (int i = 0; i < VEC / 2; i++) {
        const __nv_bfloat162 two = __floats2bfloat162_rn(f[2 * i], f[2 * i + 1]);
        p.w[i] = (uint32_t)__bfloat16_as_ushort(two.x) | ((uint32_t)__bfloat16_as_ushort(two.y) << 16);
    }
    return p;
}

// MATH 1's rotation of a vector pair before the norm's 1/rms: a = x1 * wa,
// b = x2 * wb, o1 = a cos - b sin, o2 = b cos + a sin.
template <int VEC>
__device__ __forceinline__ void rotate_scaled(const pack<VEC> &x1, const pack<VEC> &x2, const pack<VEC> &wa,
                                              const pack<VEC> &wb, const float (&co)[VEC], const float (&si)[VEC],
                                              float (&o1)[VEC], float (&o2)[VEC]) {
#pragma unroll
    for (int e = 0; e < VEC; e++) {
        const float a = get(x1, e) * get(wa, e);
        const float b = get(x2, e) * get(wb, e);
        o1[e] = a * co[e] - b * si[e];
        o2[e] = b * co[e] + a * si[e];
    }
}

__device__ __forceinline__ void check_pos(int pos, int max_pos) {
    if ((unsigned)pos >= (unsigned)max_pos) __trap();
}

extern __shared__ __align__(32) float smem[];

constexpr int THREADS = 192;  // the __launch_bounds__ of every member

// STORE = 1's extra arguments: v [T, Hkv, D] (a view into the QKV row), the
// caches [num_slots, Hkv, D] and the slots (chapter 06's layout and rule:
// -1 = skip, anything else outside [0, num_slots) traps).
struct store_args {
    const bf16 *v = nullptr;
    long long v_stride = 0;
    bf16 *k_cache = nullptr, *v_cache = nullptr;
    const int32_t *slot_mapping = nullptr;
    long long num_slots = 0;
    int num_kv_heads = 0;
};

__device__ __forceinline__ void check_store_slot(int slot, long long num_slots) {
    if (slot < -1 || (long long)slot >= num_slots) __trap();
}

template <int VEC, int LANES, int TOK, int MINB, int COSSIN, int MATH, int STORE = 0>
__global__ void __launch_bounds__(THREADS, MINB)
kernel(bf16 *q, long long q_stride, bf16 *k, long long k_stride, const int32_t *positions, const float *cos_sin,
       const float *inv_freq, const bf16 *q_w, const bf16 *k_w, int T, int H, int max_pos, float eps,
       store_args st) {
    pdl_launch_dependents();
    pdl_wait();  // every read below is of activations (kernels/common.cuh: PDL)
    static_assert(VEC == 2 || VEC == 4 || VEC == 8, "VEC");
    using vec_t = pack<VEC>;
    using fvec_t = fvec<VEC>;
    constexpr int D = 2 * VEC * LANES, HALF = D / 2;
    const int lane = threadIdx.x;
    const int h = blockIdx.y * blockDim.y + threadIdx.y;
    const int TZ = blockDim.z;
    const long long t0 = (long long)blockIdx.x * TOK * TZ;
    const int tid = threadIdx.x + LANES * (threadIdx.y + blockDim.y * threadIdx.z);
    const unsigned mask = LANES == 32 ? 0xffffffffu : (((1u << LANES) - 1u) << ((tid % 32) - lane));

    const bool is_q = h < H;
    bf16 *head = is_q ? q + (long long)h * D : k + (long long)(h - H) * D;
    const long long stride = is_q ? q_stride : k_stride;
    bool live[TOK];
#pragma unroll
    for (int r = 0; r < TOK; r++) live[r] = t0 + (long long)r * TZ + threadIdx.z < T;

    // 0. Positions first when this thread needs them itself (COSSIN 1, 2).
    [[maybe_unused]] int pos[TOK];
    if constexpr (COSSIN != 0) {
#pragma unroll
        for (int r = 0; r < TOK; r++) pos[r] = live[r] ? positions[t0 + (long long)r * TZ + threadIdx.z] : 0;
    }

    // STORE: a k head's slots first (they decide whether v is loaded at all).
    [[maybe_unused]] int slot[TOK];
    if constexpr (STORE) {
#pragma unroll
        for (int r = 0; r < TOK; r++) {
            slot[r] = -1;
            if (live[r] && !is_q) {
                slot[r] = st.slot_mapping[t0 + (long long)r * TZ + threadIdx.z];
                check_store_slot(slot[r], st.num_slots);
            }
        }
    }

    // 1. The data loads of all TOK tokens (and, STORE, the v head of each
    // stored token), then the weights (L1/L2 hits).
    vec_t x1[TOK], x2[TOK];
    [[maybe_unused]] vec_t v1[STORE ? TOK : 1], v2[STORE ? TOK : 1];
#pragma unroll
    for (int r = 0; r < TOK; r++) {
        const long long t = t0 + (long long)r * TZ + threadIdx.z;
        if (live[r]) {
            x1[r] = reinterpret_cast<const vec_t *>(head + t * stride)[lane];
            x2[r] = reinterpret_cast<const vec_t *>(head + t * stride + HALF)[lane];
        } else {
#pragma unroll
            for (int i = 0; i < VEC / 2; i++) x1[r].w[i] = x2[r].w[i] = 0u;
        }
        if constexpr (STORE) {
            if (slot[r] >= 0) {
                const bf16 *vh = st.v + t * st.v_stride + (long long)(h - H) * D;
                v1[r] = reinterpret_cast<const vec_t *>(vh)[lane];
                v2[r] = reinterpret_cast<const vec_t *>(vh + HALF)[lane];
            }
        }
    }
    const bf16 *w = is_q ? q_w : k_w;
    const vec_t wa = reinterpret_cast<const vec_t *>(w)[lane];
    const vec_t wb = reinterpret_cast<const vec_t *>(w + HALF)[lane];

    // 2. cos/sin.
    [[maybe_unused]] fvec_t cs[COSSIN == 1 ? TOK : 1], sn[COSSIN == 1 ? TOK : 1];
    [[maybe_unused]] fvec_t ifr;
    if constexpr (COSSIN == 0) {
        constexpr int CV = VEC < 4 ? VEC : 4, UNITS = D / CV;
        using cvec_t = fvec<CV>;
        const int nthreads = LANES * blockDim.y * TZ, rows = TOK * TZ;
        for (int i = tid; i < rows * UNITS; i += nthreads) {
            const int s = i / UNITS, u = i - s * UNITS;
            if (t0 + s < T) {
                const int p = positions[t0 + s];
                check_pos(p, max_pos);
                reinterpret_cast<cvec_t *>(smem + s * D)[u] =
                    reinterpret_cast<const cvec_t *>(cos_sin + (long long)p * D)[u];
            }
        }
    } else if constexpr (COSSIN == 1) {
#pragma unroll
        for (int r = 0; r < TOK; r++) {
            check_pos(pos[r], max_pos);
            cs[r] = reinterpret_cast<const fvec_t *>(cos_sin + (long long)pos[r] * D)[lane];
            sn[r] = reinterpret_cast<const fvec_t *>(cos_sin + (long long)pos[r] * D + HALF)[lane];
        }
    } else {
        ifr = reinterpret_cast<const fvec_t *>(inv_freq)[lane];
#pragma unroll
        for (int r = 0; r < TOK; r++) check_pos(pos[r], max_pos);
    }

    // 3. Sums of squares of all tokens, then their reductions side by side.
    float inv_rms[TOK];
    {
        float ss[TOK];
#pragma unroll
        for (int r = 0; r < TOK; r++) {
            ss[r] = 0.0f;
#pragma unroll
            for (int e = 0; e < VEC; e++) {
                const float a = get(x1[r], e), b = get(x2[r], e);
                ss[r] += a * a + b * b;
            }
        }
#pragma unroll
        for (int r = 0; r < TOK; r++) inv_rms[r] = group_inv_rms<LANES>(ss[r], mask, D, eps);
    }
    if constexpr (COSSIN == 0) __syncthreads();

    // 4. Per token: norm and rotation (in MATH's order), store.
#pragma unroll
    for (int r = 0; r < TOK; r++) {
        if (!live[r]) break;
        const int s = r * TZ + threadIdx.z;
        const long long t = t0 + s;
        float co[VEC], si[VEC];
        if constexpr (COSSIN == 0) {
            const fvec_t c = reinterpret_cast<const fvec_t *>(smem + s * D)[lane];
            const fvec_t n = reinterpret_cast<const fvec_t *>(smem + s * D + HALF)[lane];
#pragma unroll
            for (int e = 0; e < VEC; e++) co[e] = c.v[e], si[e] = n.v[e];
        } else if constexpr (COSSIN == 1) {
#pragma unroll
            for (int e = 0; e < VEC; e++) co[e] = cs[r].v[e], si[e] = sn[r].v[e];
        } else {
#pragma unroll
            for (int e = 0; e < VEC; e++) sincosf((float)pos[r] * ifr.v[e], &si[e], &co[e]);
        }
        float o1[VEC], o2[VEC];
        if constexpr (MATH == 0) {
#pragma unroll
            for (int e = 0; e < VEC; e++) {
                const float a = get(x1[r], e) * inv_rms[r] * get(wa, e);
                const float b = get(x2[r], e) * inv_rms[r] * get(wb, e);
                o1[e] = a * co[e] - b * si[e];
                o2[e] = b * co[e] + a * si[e];
            }
        } else {
            rotate_scaled<VEC>(x1[r], x2[r], wa, wb, co, si, o1, o2);
#pragma unroll
            for (int e = 0; e < VEC; e++) o1[e] *= inv_rms[r], o2[e] *= inv_rms[r];
        }
        reinterpret_cast<vec_t *>(head + t * stride)[lane] = put<VEC>(o1);
        reinterpret_cast<vec_t *>(head + t * stride + HALF)[lane] = put<VEC>(o2);
        if constexpr (STORE) {
            if (slot[r] >= 0) {
                const vec_t y1 = put<VEC>(o1), y2 = put<VEC>(o2);
                // The slot's row is [Hkv, D]; this thread's head is h - H.
                const long long at = ((long long)slot[r] * st.num_kv_heads + (h - H)) * D;
                reinterpret_cast<vec_t *>(st.k_cache + at)[lane] = y1;
                reinterpret_cast<vec_t *>(st.k_cache + at + HALF)[lane] = y2;
                reinterpret_cast<vec_t *>(st.v_cache + at)[lane] = v1[r];
                reinterpret_cast<vec_t *>(st.v_cache + at + HALF)[lane] = v2[r];
            }
        }
    }
}

// The block of version 4 (LANES x heads x tz, whole warps where it can,
// at most THREADS), the grid covering T in slices of TOK * tz tokens.
template <int LANES>
static inline void shape(int T, int H, int Hkv, dim3 *grid, dim3 *block, int tok) {
    const int nheads = H + Hkv;
    int hpb = nheads < THREADS / LANES ? nheads : THREADS / LANES;
    while (nheads % hpb) hpb--;
    int tz = 1;
    while ((LANES * hpb * tz) % 32 && LANES * hpb * tz * 2 <= THREADS) tz *= 2;
    *block = dim3(LANES, hpb, tz);
    *grid = dim3((unsigned)((T + (long long)tok * tz - 1) / ((long long)tok * tz)), (unsigned)(nheads / hpb));
}

// Enqueue one member on QKV-style q/k views. inv_freq (D/2 fp32) only for COSSIN 2.
// STORE = 1 with st: the store step too.
template <int VEC, int LANES, int TOK, int MINB, int COSSIN, int MATH, int STORE = 0>
static inline void launch(bf16 *q, long long qs, bf16 *k, long long ks, const int32_t *pos, const float *cs,
                          const float *inv_freq, const bf16 *qw, const bf16 *kw, int T, int H, int Hkv,
                          int max_pos, float eps, cudaStream_t s, store_args st = store_args()) {
    constexpr int D = 2 * VEC * LANES;
    dim3 grid, block;
    shape<LANES>(T, H, Hkv, &grid, &block, TOK);
    const size_t smem_bytes = COSSIN == 0 ? sizeof(float) * TOK * block.z * D : 0;
    mv_launch(kernel<VEC, LANES, TOK, MINB, COSSIN, MATH, STORE>, grid, block, smem_bytes, s, q, qs, k, ks, pos, cs,
              inv_freq, qw, kw, T, H, max_pos, eps, st);
}

}  // namespace rope_fused

#endif

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

#include "common/check.h"
#include "kernels/rmsnorm.cuh"
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

static int check_version(const char *who, int version) {
    if (version < 1 || version > ROPE_NUM_VERSIONS)
        return mv_error("%s: unknown version %d (1..%d)", who, version, ROPE_NUM_VERSIONS);
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
    switch (version) {
    case 1: return "v1-naive-thread-per-pair";
    case 2: return "v2-vec16-group-per-head-4-heads";
    default: return NULL;
    }
}

extern "C" const char *qk_norm_rope_version_name(int version) {
    switch (version) {
    case 1: return "v1-naive-thread-per-head";
    case 2: return "v2-vec16-group-per-head-4-heads";
    default: return NULL;
    }
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
    } else {
        dispatch_v2<false>(q, q_stride, k, k_stride, d_positions, cache->d_cos_sin, NULL, NULL, T, num_heads,
                           num_kv_heads, head_dim, cache->max_position, 0.0f, stream);
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
    } else {
        dispatch_v2<true>(q, row, k, row, d_positions, cache->d_cos_sin, qw, kw, T, num_heads, num_kv_heads,
                          head_dim, cache->max_position, eps, stream);
    }
    return CUDA_TRY(cudaGetLastError());
}

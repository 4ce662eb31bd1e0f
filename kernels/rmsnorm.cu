/*
 * kernels/rmsnorm.cu - RMSNorm kernels (see rmsnorm.h).
 *
 * Napkin math, per row of n elements: plain reads n bf16 and writes n
 * (4n bytes, plus the weight, which stays in L2/L1 across rows); fused reads
 * x and residual and writes residual and out (8n bytes); about 4 FLOPs per
 * element. Far under 1 FLOP/byte: memory-bound, judged in GB/s against the
 * copy bandwidth. The one thing a fast version must not do is read the row
 * twice from DRAM, so it keeps the row in registers between the sum of
 * squares and the scaling.
 */
#include "kernels/rmsnorm.h"
#include "kernels/versions.h"

#include "common/check.h"
#include "kernels/rmsnorm.cuh"
#include "reference/rmsnorm.h"

typedef __nv_bfloat16 bf16;

// ---- version 1: naive, one thread per row ------------------------------------
// Reads like the CPU reference. Slow on purpose: neighbouring threads touch
// addresses `hidden` elements apart (no coalescing), and a row gets one
// thread however long it is.
__global__ void rmsnorm_kernel_v1(bf16 *out, bf16 *residual, const bf16 *x, const bf16 *w,
                                  int T, int hidden, float eps) {
    int row = blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= T) return;
    const bf16 *xr = x + (long long)row * hidden;
    bf16 *res = residual ? residual + (long long)row * hidden : NULL;
    bf16 *y = out + (long long)row * hidden;
    float sum_sq = 0.0f;
    for (int i = 0; i < hidden; i++) {
        float v = __bfloat162float(xr[i]);
        if (res) {  // fused: residual = bf16(x + residual), then normalise that
            bf16 r = __float2bfloat16(v + __bfloat162float(res[i]));
            res[i] = r;
            v = __bfloat162float(r);
        }
        sum_sq += v * v;
    }
    float inv_rms = rsqrtf(sum_sq / hidden + eps);
    const bf16 *src = res ? res : xr;
    for (int i = 0; i < hidden; i++)
        y[i] = __float2bfloat16(__bfloat162float(src[i]) * inv_rms * __bfloat162float(w[i]));
}

__global__ void rmsnorm_heads_kernel_v1(bf16 *out, long long out_stride, const bf16 *x,
                                        long long x_stride, const bf16 *w, int T, int H, int D,
                                        float eps) {
    long long row = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= (long long)T * H) return;
    long long t = row / H, h = row % H;
    const bf16 *xr = x + t * x_stride + h * D;
    bf16 *y = out + t * out_stride + h * D;
    float sum_sq = 0.0f;
    for (int i = 0; i < D; i++) {
        float v = __bfloat162float(xr[i]);
        sum_sq += v * v;
    }
    float inv_rms = rsqrtf(sum_sq / D + eps);
    for (int i = 0; i < D; i++)  // in place is safe: element i is read before it is written
        y[i] = __float2bfloat16(__bfloat162float(xr[i]) * inv_rms * __bfloat162float(w[i]));
}

// ---- version 2: vec16 ----------------------------------------------------------
// Block per row (plain and fused). Thread k handles vectors k, k + blockDim,
// k + 2*blockDim...; the first CACHE of them stay in registers (cache[][]),
// so a row of up to CACHE * blockDim * VEC elements is read from memory once.
// Longer rows re-read the rest (from L2, mostly) rather than spill.
template <int VEC, int CACHE, bool FUSED>
__global__ void __launch_bounds__(1024)
rmsnorm_kernel_v2(bf16 *out, bf16 *residual, const bf16 *x, const bf16 *w, int hidden, float eps) {
    using vec_t = bf16_vec<VEC>;
    const long long row = blockIdx.x;
    const int nvec = hidden / VEC;
    const vec_t *xr = reinterpret_cast<const vec_t *>(x + row * hidden);
    vec_t *res = FUSED ? reinterpret_cast<vec_t *>(residual + row * hidden) : nullptr;
    vec_t *y = reinterpret_cast<vec_t *>(out + row * hidden);
    const vec_t *wv = reinterpret_cast<const vec_t *>(w);

    // Pass 1: load (and for FUSED add and store the residual), sum of squares.
    vec_t cache[CACHE];
    float sum_sq = 0.0f;
    for (int i = threadIdx.x, k = 0; i < nvec; i += blockDim.x, k++) {
        vec_t v = xr[i];
        if (FUSED) {
            vec_t r = res[i];
#pragma unroll
            for (int e = 0; e < VEC; e++)
                v.v[e] = __float2bfloat16(__bfloat162float(v.v[e]) + __bfloat162float(r.v[e]));
            res[i] = v;  // the rounded sum is both the next residual and what we normalise
        }
#pragma unroll
        for (int e = 0; e < VEC; e++) {
            float f = __bfloat162float(v.v[e]);
            sum_sq += f * f;
        }
        // k is uniform per iteration; with CACHE a compile-time constant and
        // the loop below unrolled, cache[] stays in registers.
#pragma unroll
        for (int c = 0; c < CACHE; c++)
            if (c == k) cache[c] = v;
    }
    const float inv_rms = block_inv_rms(sum_sq, hidden, eps);

    // Pass 2: scale and store. Cached vectors come from registers; any beyond
    // the cache are read again (this thread wrote them in pass 1 if FUSED).
    const vec_t *src = FUSED ? res : xr;
    for (int i = threadIdx.x, k = 0; i < nvec; i += blockDim.x, k++) {
        vec_t v;
        if (k < CACHE) {
#pragma unroll
            for (int c = 0; c < CACHE; c++)
                if (c == k) v = cache[c];
        } else {
            v = src[i];
        }
        vec_t wk = wv[i], o;
#pragma unroll
        for (int e = 0; e < VEC; e++)
            o.v[e] = __float2bfloat16(__bfloat162float(v.v[e]) * inv_rms * __bfloat162float(wk.v[e]));
        y[i] = o;
    }
}

// Warp per head. head_dim is at most 1024 (validated), so a lane holds
// at most a few vectors; CACHE = 4 covers head_dim up to 32 * 4 * VEC.
template <int VEC, int CACHE>
__global__ void rmsnorm_heads_kernel_v2(bf16 *out, long long out_stride, const bf16 *x,
                                        long long x_stride, const bf16 *w, int T, int H, int D,
                                        float eps) {
    using vec_t = bf16_vec<VEC>;
    const int lane = threadIdx.x % 32;
    const long long row = ((long long)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    if (row >= (long long)T * H) return;  // whole warps leave together
    const long long t = row / H, h = row % H;
    const vec_t *xr = reinterpret_cast<const vec_t *>(x + t * x_stride + h * D);
    vec_t *y = reinterpret_cast<vec_t *>(out + t * out_stride + h * D);
    const vec_t *wv = reinterpret_cast<const vec_t *>(w);
    const int nvec = D / VEC;

    vec_t cache[CACHE];
    float sum_sq = 0.0f;
    for (int i = lane, k = 0; i < nvec; i += 32, k++) {
        vec_t v = xr[i];
#pragma unroll
        for (int e = 0; e < VEC; e++) {
            float f = __bfloat162float(v.v[e]);
            sum_sq += f * f;
        }
#pragma unroll
        for (int c = 0; c < CACHE; c++)
            if (c == k) cache[c] = v;
    }
    const float inv_rms = warp_inv_rms(sum_sq, D, eps);
    for (int i = lane, k = 0; i < nvec; i += 32, k++) {
        vec_t v;
        if (k < CACHE) {
#pragma unroll
            for (int c = 0; c < CACHE; c++)
                if (c == k) v = cache[c];
        } else {
            v = xr[i];  // in place is safe: this lane has not written element i yet
        }
        vec_t wk = wv[i], o;
#pragma unroll
        for (int e = 0; e < VEC; e++)
            o.v[e] = __float2bfloat16(__bfloat162float(v.v[e]) * inv_rms * __bfloat162float(wk.v[e]));
        y[i] = o;
    }
}


// ---- version 3: fast -----------------------------------------------------------
// Version 2, measured on an H200 at T = 131072, hidden = 1024: 75% of the
// copy bandwidth, and only 34% for q heads. Its loop gives a thread one
// 16-byte load, waits for it, adds it up, and only then issues the next; a
// 128-thread block of a 1024-wide row has just 2 KB in flight. By Little's
// law an H200 needs about 4.2 TB/s (measured copy) x ~1 us = ~4 MB in flight,
// ~32 KB per SM, to stay busy. Version 3 issues all of a thread's loads before it uses any
// (fixed-size, unrolled, predicated), gives each thread CACHE = 4 vectors
// (a 1024-wide row becomes one warp with 64 bytes per lane in flight), and
// for heads lets each thread carry 4 tokens (see rmsnorm_heads_kernel_v3).
template <int VEC, int CACHE, bool FUSED>
__global__ void __launch_bounds__(1024)
rmsnorm_kernel_v3(bf16 *out, bf16 *residual, const bf16 *x, const bf16 *w, int hidden, float eps) {
    pdl_launch_dependents();
    pdl_wait();  // every read below is of activations (kernels/common.cuh: PDL)
    using vec_t = bf16_vec<VEC>;
    const long long row = blockIdx.x;
    const int nvec = hidden / VEC;
    const vec_t *xr = reinterpret_cast<const vec_t *>(x + row * hidden);
    vec_t *res = FUSED ? reinterpret_cast<vec_t *>(residual + row * hidden) : nullptr;
    vec_t *y = reinterpret_cast<vec_t *>(out + row * hidden);
    const vec_t *wv = reinterpret_cast<const vec_t *>(w);

    // 1. Every load of the cached part goes out before any is used.
    vec_t v[CACHE], r[CACHE];
#pragma unroll
    for (int c = 0; c < CACHE; c++) {
        int i = threadIdx.x + c * blockDim.x;
        if (i < nvec) {
            v[c] = xr[i];
            if (FUSED) r[c] = res[i];
        }
    }
    float sum_sq = 0.0f;
#pragma unroll
    for (int c = 0; c < CACHE; c++) {
        int i = threadIdx.x + c * blockDim.x;
        if (i < nvec) {
            if (FUSED) {
#pragma unroll
                for (int e = 0; e < VEC; e++)
                    v[c].v[e] = __float2bfloat16(__bfloat162float(v[c].v[e]) + __bfloat162float(r[c].v[e]));
                res[i] = v[c];
            }
#pragma unroll
            for (int e = 0; e < VEC; e++) {
                float f = __bfloat162float(v[c].v[e]);
                sum_sq += f * f;
            }
        }
    }
    // 2. Rows longer than CACHE * blockDim vectors: the rest, uncached.
    for (int i = threadIdx.x + CACHE * blockDim.x; i < nvec; i += blockDim.x) {
        vec_t t = xr[i];
        if (FUSED) {
            vec_t rt = res[i];
#pragma unroll
            for (int e = 0; e < VEC; e++)
                t.v[e] = __float2bfloat16(__bfloat162float(t.v[e]) + __bfloat162float(rt.v[e]));
            res[i] = t;
        }
#pragma unroll
        for (int e = 0; e < VEC; e++) {
            float f = __bfloat162float(t.v[e]);
            sum_sq += f * f;
        }
    }
    const float inv_rms = block_inv_rms(sum_sq, hidden, eps);

    // 3. Scale and store.
#pragma unroll
    for (int c = 0; c < CACHE; c++) {
        int i = threadIdx.x + c * blockDim.x;
        if (i < nvec) {
            vec_t wk = wv[i], o;
#pragma unroll
            for (int e = 0; e < VEC; e++)
                o.v[e] = __float2bfloat16(__bfloat162float(v[c].v[e]) * inv_rms * __bfloat162float(wk.v[e]));
            y[i] = o;
        }
    }
    const vec_t *src = FUSED ? res : xr;
    for (int i = threadIdx.x + CACHE * blockDim.x; i < nvec; i += blockDim.x) {
        vec_t t = src[i], wk = wv[i], o;
#pragma unroll
        for (int e = 0; e < VEC; e++)
            o.v[e] = __float2bfloat16(__bfloat162float(t.v[e]) * inv_rms * __bfloat162float(wk.v[e]));
        y[i] = o;
    }
}

// Heads: a group of LANES threads (a power of two, at most 32) per head, the
// block's y dimension over heads, so a block covers whole tokens and finds
// its head and token without dividing. Each thread loads its weight slice
// once and keeps it for all TOK tokens of the block, and issues the loads of
// all TOK tokens before using any. Measured before this shape (one warp per
// head, 4 or 8 heads per warp, a divide per head): 42% of copy on
// contiguous Qwen3 q heads, because a 256-byte head carried as many
// instructions as a 2 KB row.
template <int VEC, int LANES, int CACHE, int TOK>
__global__ void __launch_bounds__(1024)
rmsnorm_heads_kernel_v3(bf16 *out, long long out_stride, const bf16 *x, long long x_stride,
                        const bf16 *w, int T, int H, int D, float eps) {
    using vec_t = bf16_vec<VEC>;
    const int lane = threadIdx.x;                        // position inside the head's group
    const int h = blockIdx.y * blockDim.y + threadIdx.y; // head (blockDim.y divides H)
    const int nvec = D / VEC;
    const long long t0 = (long long)blockIdx.x * TOK;
    // Shuffles need the exact set of lanes present: the block's last warp
    // may be partial when blockDim.x * blockDim.y is not a multiple of 32.
    const int tid = threadIdx.y * LANES + lane, warp_base = tid & ~31;
    const int in_warp = min(32, (int)(blockDim.x * blockDim.y) - warp_base);
    const unsigned mask = in_warp == 32 ? 0xffffffffu : ((1u << in_warp) - 1u);

    const vec_t *wv = reinterpret_cast<const vec_t *>(w);
    vec_t wk[CACHE];
#pragma unroll
    for (int c = 0; c < CACHE; c++)
        if (lane + c * LANES < nvec) wk[c] = wv[lane + c * LANES];

    vec_t v[TOK][CACHE];
#pragma unroll
    for (int r = 0; r < TOK; r++) {
        if (t0 + r < T) {
            const vec_t *xr = reinterpret_cast<const vec_t *>(x + (t0 + r) * x_stride + (long long)h * D);
#pragma unroll
            for (int c = 0; c < CACHE; c++)
                if (lane + c * LANES < nvec) v[r][c] = xr[lane + c * LANES];
        }
    }
#pragma unroll
    for (int r = 0; r < TOK; r++) {
        if (t0 + r >= T) break;  // the same for the whole block
        const vec_t *xr = reinterpret_cast<const vec_t *>(x + (t0 + r) * x_stride + (long long)h * D);
        vec_t *y = reinterpret_cast<vec_t *>(out + (t0 + r) * out_stride + (long long)h * D);
        float sum_sq = 0.0f;
#pragma unroll
        for (int c = 0; c < CACHE; c++)
            if (lane + c * LANES < nvec)
#pragma unroll
                for (int e = 0; e < VEC; e++) {
                    float f = __bfloat162float(v[r][c].v[e]);
                    sum_sq += f * f;
                }
        for (int i = lane + CACHE * LANES; i < nvec; i += LANES) {  // heads past the cache
            vec_t t = xr[i];
#pragma unroll
            for (int e = 0; e < VEC; e++) {
                float f = __bfloat162float(t.v[e]);
                sum_sq += f * f;
            }
        }
        const float inv_rms = group_inv_rms<LANES>(sum_sq, mask, D, eps);
#pragma unroll
        for (int c = 0; c < CACHE; c++) {
            int i = lane + c * LANES;
            if (i < nvec) {
                vec_t o;
#pragma unroll
                for (int e = 0; e < VEC; e++)
                    o.v[e] = __float2bfloat16(__bfloat162float(v[r][c].v[e]) * inv_rms * __bfloat162float(wk[c].v[e]));
                y[i] = o;
            }
        }
        // In place, the tail is safe: a thread reads element i just before
        // writing it, and no other thread touches i.
        for (int i = lane + CACHE * LANES; i < nvec; i += LANES) {
            vec_t t = xr[i], wt = wv[i], o;
#pragma unroll
            for (int e = 0; e < VEC; e++)
                o.v[e] = __float2bfloat16(__bfloat162float(t.v[e]) * inv_rms * __bfloat162float(wt.v[e]));
            y[i] = o;
        }
    }
}

// ---- launchers -------------------------------------------------------------------

// The widest vector (8, 4, 2 or 1 bf16) that divides n and for which every
// pointer and row stride given stays aligned.
static int pick_vec(int n, long long stride_a, long long stride_b, const void *p0, const void *p1,
                    const void *p2, const void *p3) {
    for (int vec = 8; vec > 1; vec /= 2) {
        int bytes = vec * 2;
        if (n % vec || stride_a % vec || stride_b % vec) continue;
        if (!mv_aligned(p0, bytes) || !mv_aligned(p1, bytes) || !mv_aligned(p2, bytes) ||
            !mv_aligned(p3, bytes))
            continue;
        return vec;
    }
    return 1;
}

static const int ROW_CACHE = 4;

template <int VEC, bool FUSED>
static void launch_rows_v2(bf16 *out, bf16 *res, const bf16 *x, const bf16 *w, int T, int hidden,
                           float eps, cudaStream_t s) {
    // One vector per thread while rows are short, up to 1024 threads; longer
    // rows give each thread up to ROW_CACHE vectors held in registers.
    int nvec = hidden / VEC;
    int threads = ((nvec + 31) / 32) * 32;
    if (threads > 1024) threads = 1024;
    rmsnorm_kernel_v2<VEC, ROW_CACHE, FUSED><<<T, threads, 0, s>>>(out, res, x, w, hidden, eps);
}

template <bool FUSED>
static void dispatch_rows_v2(bf16 *out, bf16 *res, const bf16 *x, const bf16 *w, int T, int hidden,
                             float eps, cudaStream_t s) {
    int vec = pick_vec(hidden, 0, 0, out, res ? (const void *)res : (const void *)x, x, w);
    switch (vec) {
    case 8: launch_rows_v2<8, FUSED>(out, res, x, w, T, hidden, eps, s); break;
    case 4: launch_rows_v2<4, FUSED>(out, res, x, w, T, hidden, eps, s); break;
    case 2: launch_rows_v2<2, FUSED>(out, res, x, w, T, hidden, eps, s); break;
    default: launch_rows_v2<1, FUSED>(out, res, x, w, T, hidden, eps, s); break;
    }
}

template <int VEC>
static void launch_heads_v2(bf16 *out, long long os, const bf16 *x, long long xs, const bf16 *w,
                            int T, int H, int D, float eps, cudaStream_t s) {
    const int warps_per_block = 4;
    long long rows = (long long)T * H;
    long long blocks = (rows + warps_per_block - 1) / warps_per_block;
    rmsnorm_heads_kernel_v2<VEC, 4><<<(unsigned)blocks, 32 * warps_per_block, 0, s>>>(out, os, x, xs, w, T, H, D, eps);
}


// Version 3 rows: up to CACHE_V3 vectors per thread, so a row of n vectors
// gets n / 4 threads (at least one warp, at most 1024).
static const int CACHE_V3 = 4;

template <int VEC, bool FUSED>
static void launch_rows_v3(bf16 *out, bf16 *res, const bf16 *x, const bf16 *w, int T, int hidden,
                           float eps, cudaStream_t s) {
    int nvec = hidden / VEC;
    // Few rows (decode): the GPU is far from full, so latency matters more
    // than bytes in flight; spread each row over more threads, one vector
    // each. Many rows: CACHE_V3 vectors per thread.
    int per_thread = T < 32 * mv_num_sms() ? 1 : CACHE_V3;
    int threads = ((nvec + per_thread - 1) / per_thread + 31) / 32 * 32;
    if (threads > 1024) threads = 1024;
    mv_launch(rmsnorm_kernel_v3<VEC, CACHE_V3, FUSED>, dim3((unsigned)T), dim3(threads), 0, s, out, res, x, w, hidden, eps);
}

template <bool FUSED>
static void dispatch_rows_v3(bf16 *out, bf16 *res, const bf16 *x, const bf16 *w, int T, int hidden,
                             float eps, cudaStream_t s) {
    int vec = pick_vec(hidden, 0, 0, out, res ? (const void *)res : (const void *)x, x, w);
    switch (vec) {
    case 8: launch_rows_v3<8, FUSED>(out, res, x, w, T, hidden, eps, s); break;
    case 4: launch_rows_v3<4, FUSED>(out, res, x, w, T, hidden, eps, s); break;
    case 2: launch_rows_v3<2, FUSED>(out, res, x, w, T, hidden, eps, s); break;
    default: launch_rows_v3<1, FUSED>(out, res, x, w, T, hidden, eps, s); break;
    }
}

template <int VEC, int LANES, int CACHE>
static void launch_heads_v3_shape(bf16 *out, long long os, const bf16 *x, long long xs, const bf16 *w,
                                  int T, int H, int D, float eps, cudaStream_t s) {
    // Heads per block: the largest divisor of H that keeps the block at
    // 1024 threads or fewer (all of Qwen3's 16 q or 8 kv heads at once).
    int hpb = H;
    while (hpb * LANES > 1024 || H % hpb) hpb--;
    dim3 block(LANES, hpb);
    // Four tokens per block keep 4 x 16 bytes in flight per thread; decode
    // steps (few tokens) take one token per block, for latency.
    // (Only heads of at most 32 vectors take 4 tokens: longer heads would
    // need more registers than a thread has.)
    if constexpr (CACHE == 1) {
        if (T >= 4 * mv_num_sms()) {
            dim3 grid((unsigned)((T + 3) / 4), (unsigned)(H / hpb));
            rmsnorm_heads_kernel_v3<VEC, LANES, CACHE, 4><<<grid, block, 0, s>>>(out, os, x, xs, w, T, H, D, eps);
            return;
        }
    }
    {
        dim3 grid((unsigned)T, (unsigned)(H / hpb));
        rmsnorm_heads_kernel_v3<VEC, LANES, CACHE, 1><<<grid, block, 0, s>>>(out, os, x, xs, w, T, H, D, eps);
    }
}

template <int VEC>
static void launch_heads_v3(bf16 *out, long long os, const bf16 *x, long long xs, const bf16 *w,
                            int T, int H, int D, float eps, cudaStream_t s) {
    // LANES: enough threads for one vector each, as a power of two (4..32);
    // a head longer than 32 vectors gives each thread up to 4 cached.
    int nvec = D / VEC;
    if (nvec <= 4) launch_heads_v3_shape<VEC, 4, 1>(out, os, x, xs, w, T, H, D, eps, s);
    else if (nvec <= 8) launch_heads_v3_shape<VEC, 8, 1>(out, os, x, xs, w, T, H, D, eps, s);
    else if (nvec <= 16) launch_heads_v3_shape<VEC, 16, 1>(out, os, x, xs, w, T, H, D, eps, s);
    else if (nvec <= 32) launch_heads_v3_shape<VEC, 32, 1>(out, os, x, xs, w, T, H, D, eps, s);
    else launch_heads_v3_shape<VEC, 32, 4>(out, os, x, xs, w, T, H, D, eps, s);
}

static int check_version(const char *who, int version) {
    if (version < 1 || version > RMSNORM_NUM_VERSIONS)
        return mv_error("%s: unknown version %d (1..%d)", who, version, RMSNORM_NUM_VERSIONS);
    return 0;
}

extern "C" const char *rmsnorm_version_name(int version) {
    return kernel_version_name(RMSNORM_VERSION_TABLE, version);  // kernels/versions.h
}

extern "C" int rmsnorm_cuda(int version, bf16_t *d_out, const bf16_t *d_x, const bf16_t *d_w,
                            int T, int hidden, float eps, cudaStream_t stream) {
    if (check_version("rmsnorm_cuda", version) || rmsnorm_validate(T, hidden, eps)) return -1;
    if (T == 0) return 0;
    if (!d_out || !d_x || !d_w) return mv_error("rmsnorm_cuda: null pointer for a non-empty tensor");
    bf16 *out = (bf16 *)d_out;
    const bf16 *x = (const bf16 *)d_x, *w = (const bf16 *)d_w;
    if (version == 1) rmsnorm_kernel_v1<<<(T + 127) / 128, 128, 0, stream>>>(out, NULL, x, w, T, hidden, eps);
    else if (version == 2) dispatch_rows_v2<false>(out, NULL, x, w, T, hidden, eps, stream);
    else dispatch_rows_v3<false>(out, NULL, x, w, T, hidden, eps, stream);
    return CUDA_TRY(cudaGetLastError());
}

extern "C" int fused_add_rmsnorm_cuda(int version, bf16_t *d_out, bf16_t *d_residual,
                                      const bf16_t *d_x, const bf16_t *d_w, int T, int hidden,
                                      float eps, cudaStream_t stream) {
    if (check_version("fused_add_rmsnorm_cuda", version) || rmsnorm_validate(T, hidden, eps)) return -1;
    if (T == 0) return 0;
    if (!d_out || !d_residual || !d_x || !d_w)
        return mv_error("fused_add_rmsnorm_cuda: null pointer for a non-empty tensor");
    if ((const void *)d_residual == (const void *)d_x || d_residual == d_out)
        return mv_error("fused_add_rmsnorm_cuda: residual must not alias x or out");
    bf16 *out = (bf16 *)d_out, *res = (bf16 *)d_residual;
    const bf16 *x = (const bf16 *)d_x, *w = (const bf16 *)d_w;
    if (version == 1) rmsnorm_kernel_v1<<<(T + 127) / 128, 128, 0, stream>>>(out, res, x, w, T, hidden, eps);
    else if (version == 2) dispatch_rows_v2<true>(out, res, x, w, T, hidden, eps, stream);
    else dispatch_rows_v3<true>(out, res, x, w, T, hidden, eps, stream);
    return CUDA_TRY(cudaGetLastError());
}

extern "C" int rmsnorm_heads_cuda(int version, bf16_t *d_out, long long out_stride,
                                  const bf16_t *d_x, long long x_stride, const bf16_t *d_w, int T,
                                  int num_heads, int head_dim, float eps, cudaStream_t stream) {
    if (check_version("rmsnorm_heads_cuda", version) ||
        rmsnorm_heads_validate(T, num_heads, head_dim, x_stride, out_stride, eps))
        return -1;
    if (T == 0) return 0;
    if (!d_out || !d_x || !d_w) return mv_error("rmsnorm_heads_cuda: null pointer for a non-empty tensor");
    if ((const void *)d_out != (const void *)d_x) {
        // Either exactly in place or not overlapping at all: a partial
        // overlap would let one head's output clobber another head's input.
        const char *o = (const char *)d_out, *xb = (const char *)d_x;
        long long span_o = ((long long)(T - 1) * out_stride + (long long)num_heads * head_dim) * 2;
        long long span_x = ((long long)(T - 1) * x_stride + (long long)num_heads * head_dim) * 2;
        if (o < xb + span_x && xb < o + span_o)
            return mv_error("rmsnorm_heads_cuda: out and x overlap without being the same buffer");
    }
    bf16 *out = (bf16 *)d_out;
    const bf16 *x = (const bf16 *)d_x, *w = (const bf16 *)d_w;
    if (version == 1) {
        long long rows = (long long)T * num_heads;
        rmsnorm_heads_kernel_v1<<<(unsigned)((rows + 127) / 128), 128, 0, stream>>>(
            out, out_stride, x, x_stride, w, T, num_heads, head_dim, eps);
    } else if (version == 3) {
        int vec = pick_vec(head_dim, x_stride, out_stride, out, x, w, w);
        switch (vec) {
        case 8: launch_heads_v3<8>(out, out_stride, x, x_stride, w, T, num_heads, head_dim, eps, stream); break;
        case 4: launch_heads_v3<4>(out, out_stride, x, x_stride, w, T, num_heads, head_dim, eps, stream); break;
        case 2: launch_heads_v3<2>(out, out_stride, x, x_stride, w, T, num_heads, head_dim, eps, stream); break;
        default: launch_heads_v3<1>(out, out_stride, x, x_stride, w, T, num_heads, head_dim, eps, stream); break;
        }
    } else {
        int vec = pick_vec(head_dim, x_stride, out_stride, out, x, w, w);
        switch (vec) {
        case 8: launch_heads_v2<8>(out, out_stride, x, x_stride, w, T, num_heads, head_dim, eps, stream); break;
        case 4: launch_heads_v2<4>(out, out_stride, x, x_stride, w, T, num_heads, head_dim, eps, stream); break;
        case 2: launch_heads_v2<2>(out, out_stride, x, x_stride, w, T, num_heads, head_dim, eps, stream); break;
        default: launch_heads_v2<1>(out, out_stride, x, x_stride, w, T, num_heads, head_dim, eps, stream); break;
        }
    }
    return CUDA_TRY(cudaGetLastError());
}

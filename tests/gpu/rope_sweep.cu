/*
 * tests/gpu/rope_sweep.cu - chapter 05's experiment: why did Qwen3's fused
 * q_norm/k_norm + RoPE (versions 3 and 4) stay at ~77% of copy in QKV rows
 * while the plain RoPE made 86%, and which configuration of the fused
 * kernel reaches 85%? (Its answer is version 6.)
 *
 * Runs every member of kernels/rope_fused.cuh (TOK x MINB x COSSIN x MATH,
 * D = 128 as 8 lanes x 2 vectors of 8) on Qwen3-0.6B-shaped QKV rows (16 q
 * heads, 8 kv heads, row of 32 heads x 128) at T = 32768 and T = 8192, with
 * random positions < 40960 and the real cos/sin cache (rope_cache_build,
 * rope_cache_upload), beside the library's fused v4 and v6, the plain v3,
 * the ceilings of the access pattern (touch_kernel) and a cudaMemcpy2D of
 * the same region. Each fused member's output is
 * compared with fused v4's, bf16 for bf16 (ulps = distance between the two
 * bf16 values in the ordered bit patterns), and the v part of every row
 * must be untouched. Times: gpu_time_ms (common/gpu.h), 5 warm-up runs,
 * median of 50, L2 flushed before each; % of copy against
 * measure_ceilings()'s cudaMemcpy, as chapter 05 reports.
 *
 * Build (from the repo root, after `make ... CUDA_ARCH=90` built
 * build/lib/libmv_core.a; -lnccl because common/check.c has NCCL in when the
 * Makefile found nccl.h; leave it out on a build without NCCL):
 *   nvcc -O3 -std=c++17 -arch=sm_90 -lineinfo -I. -DMV_HAVE_CUDA=1 -DMV_HAVE_NCCL=0 \
 *     tests/gpu/rope_sweep.cu build/lib/libmv_core.a -lcublas -lnccl -o build/rope_sweep
 * or simply: bash tests/gpu/rope_sweep.sh (builds, then runs; about 30 s of GPU).
 */
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "common/check.h"
#include "common/gpu.h"
#include "common/rng.h"
#include "kernels/rope.h"
#include "kernels/rope_fused.cuh"
#include "reference/rope.h"

namespace {

constexpr int H = 16, HKV = 8, D = 128, ROW = (H + 2 * HKV) * D, QK = (H + HKV) * D;
constexpr int MAX_POS = 40960;
constexpr float EPS = 1e-6f;
constexpr double THETA = 1e6;

typedef __nv_bfloat16 bf16;

struct ctx_t {
    bf16 *buf;
    const bf16 *qw, *kw;
    const int32_t *pos;
    const float *inv_freq;
    rope_cache_gpu_t cache;
    int T;
    unsigned flip;  // 0: the ceilings' XOR (see touch_kernel)
};

typedef int (*run_fn)(void *, cudaStream_t);

template <int TOK, int MINB, int COSSIN, int MATH>
int run_member(void *p, cudaStream_t s) {
    ctx_t *c = (ctx_t *)p;
    rope_fused::launch<8, 8, TOK, MINB, COSSIN, MATH>(c->buf, ROW, c->buf + H * D, ROW, c->pos, c->cache.d_cos_sin,
                                                       c->inv_freq, c->qw, c->kw, c->T, H, HKV, MAX_POS, EPS, s);
    return CUDA_TRY(cudaGetLastError());
}

// A library version of the fused form (qk_norm_rope_cuda).
template <int V>
int run_fused(void *p, cudaStream_t s) {
    ctx_t *c = (ctx_t *)p;
    return qk_norm_rope_cuda(V, (bf16_t *)c->buf, (const bf16_t *)c->qw, (const bf16_t *)c->kw, c->pos, &c->cache,
                             c->T, H, HKV, D, EPS, s);
}
int run_plain_v3(void *p, cudaStream_t s) {
    ctx_t *c = (ctx_t *)p;
    return rope_cuda(3, (bf16_t *)c->buf, ROW, (bf16_t *)(c->buf + H * D), ROW, c->pos, &c->cache, c->T, H, HKV, D, s);
}

// Ceilings for this access pattern: version 6's shape (one token
// per block of 8 lanes x 24 heads, 16 bytes x 2 per thread, 8 blocks per
// SM) reading each q/k vector of the QKV rows and writing it back XORed
// with `flip` (0 at run time: the data stay as they are; unknown to the
// compiler, which would otherwise drop a store of the value it just loaded,
// and then the load): no norm, no rotation. COSSIN also loads the token's
// cos/sin as version 6 does (an impossible test keeps the loads). What is left between these and
// version 6 is the cost of the math; what is left between them and copy is
// the cost of the access pattern itself.
template <bool COSSIN>
__global__ void __launch_bounds__(192, 8)
touch_kernel(bf16 *buf, const int32_t *positions, const float *cos_sin, unsigned flip) {
    using vec_t = rope_fused::pack<8>;
    using fvec_t = rope_fused::fvec<8>;
    const int lane = threadIdx.x, h = threadIdx.y;
    const long long t = blockIdx.x;
    bf16 *head = buf + t * ROW + (long long)h * D;
    vec_t x1 = reinterpret_cast<const vec_t *>(head)[lane];
    vec_t x2 = reinterpret_cast<const vec_t *>(head + D / 2)[lane];
    if (COSSIN) {
        const int p = positions[t];
        const fvec_t c = reinterpret_cast<const fvec_t *>(cos_sin + (long long)p * D)[lane];
        const fvec_t n = reinterpret_cast<const fvec_t *>(cos_sin + (long long)p * D + D / 2)[lane];
        float sum = 0.0f;
#pragma unroll
        for (int e = 0; e < 8; e++) sum += c.v[e] + n.v[e];
        if (sum == 1234.5f) x1.w[0] ^= 1u;  // never true (|sum| <= 16): keeps all the loads
    }
#pragma unroll
    for (int i = 0; i < 4; i++) x1.w[i] ^= flip, x2.w[i] ^= flip;
    reinterpret_cast<vec_t *>(head)[lane] = x1;
    reinterpret_cast<vec_t *>(head + D / 2)[lane] = x2;
}

template <bool COSSIN>
int run_touch(void *p, cudaStream_t s) {
    ctx_t *c = (ctx_t *)p;
    touch_kernel<COSSIN><<<c->T, dim3(8, H + HKV), 0, s>>>(c->buf, c->pos, c->cache.d_cos_sin, c->flip);
    return CUDA_TRY(cudaGetLastError());
}

struct variant_t {
    int tok, minb, cossin, math;  // -1: a library version or a ceiling (name says which)
    const void *func;             // for the register / occupancy query (NULL: none)
    run_fn run;
    const char *name;
    int offset;  // elements the rows start past a 256-byte boundary (timed only)
};

#define M(t, b, c, x) {t, b, c, x, (const void *)rope_fused::kernel<8, 8, t, b, c, x>, run_member<t, b, c, x>, NULL, 0}
#define MX(t, b, c) M(t, b, c, 0), M(t, b, c, 1)
#define MC(t, b) MX(t, b, 0), MX(t, b, 1), MX(t, b, 2)
#define MB(t) MC(t, 1), MC(t, 4), MC(t, 5), MC(t, 6), MC(t, 8)

const variant_t variants[] = {
    {-1, 0, 0, 0, NULL, run_fused<4>, "library fused v4", 0},
    {-1, 0, 0, 0, NULL, run_fused<6>, "library fused v6", 0},
    {-1, 0, 0, 0, NULL, run_plain_v3, "library PLAIN rope v3 (no norm)", 0},
    {-1, 0, 0, 0, NULL, run_touch<false>, "CEILING read+write back, no math", 0},
    {-1, 0, 0, 0, NULL, run_touch<true>, "CEILING read+write back + cos/sin loads", 0},
    // The same with every row 16 bytes past alignment (8 elements): each
    // token's q/k range then starts and ends in the middle of a 32-byte sector.
    {-1, 0, 0, 0, NULL, run_fused<6>, "+16B library fused v6", 8},
    {-1, 0, 0, 0, NULL, run_plain_v3, "+16B library PLAIN rope v3", 8},
    {-1, 0, 0, 0, NULL, run_touch<false>, "+16B CEILING read+write back", 8},
    // The family (kernels/rope_fused.cuh).
    MB(1), MB(2), MB(4),
};

// Distance between two bf16 values in ulps (ordered bit patterns; +0 == -0).
__device__ __forceinline__ int ord16(uint16_t b) { return (b & 0x8000) ? -(int)(b & 0x7fff) : (int)b; }

struct cmp_t {
    unsigned max_ulp;
    unsigned long long over1, v_changed;
};

__global__ void compare_kernel(const uint16_t *got, const uint16_t *ref, const uint16_t *orig, long long n,
                               cmp_t *out) {
    unsigned mx = 0;
    unsigned long long over = 0, vch = 0;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        const int col = (int)(i % ROW);
        if (col < QK) {
            const uint16_t a = got[i], b = ref[i];
            const bool nan = ((a & 0x7f80) == 0x7f80 && (a & 0x7f)) || ((b & 0x7f80) == 0x7f80 && (b & 0x7f));
            const unsigned u = nan ? 0xffffu : (unsigned)abs(ord16(a) - ord16(b));
            mx = u > mx ? u : mx;
            over += u > 1;
        } else {
            vch += got[i] != orig[i];
        }
    }
    for (int o = 16; o; o >>= 1) {
        mx = max(mx, __shfl_xor_sync(0xffffffffu, mx, o));
        over += __shfl_xor_sync(0xffffffffu, over, o);
        vch += __shfl_xor_sync(0xffffffffu, vch, o);
    }
    if ((threadIdx.x & 31) == 0) {
        atomicMax(&out->max_ulp, mx);
        if (over) atomicAdd(&out->over1, over);
        if (vch) atomicAdd(&out->v_changed, vch);
    }
}

struct row_t {
    const variant_t *v;
    double us;
    int regs, local, blocks;
    cmp_t cmp;
    bool checked;
};

void label(const variant_t *v, char *s, size_t n) {
    if (v->tok == -1) {
        snprintf(s, n, "%s", v->name);
        return;
    }
    static const char *cs[] = {"smem+barrier", "global->regs", "sincosf(diag)"};
    static const char *mt[] = {"x*r*w,rot", "rot(x*w)*r"};
    char lb[16];
    if (v->minb == 1) snprintf(lb, sizeof lb, "none");
    else snprintf(lb, sizeof lb, "192,%d", v->minb);
    snprintf(s, n, "tok%d lb(%s) %s %s", v->tok, lb, cs[v->cossin], mt[v->math]);
}

}  // namespace

int main(int argc, char **argv) {
    const int Ts[] = {32768, 8192};
    const int TMAX = 32768;
    const size_t nmax = (size_t)TMAX * ROW;
    gpu_info_t info;
    if (gpu_probe(&info, 0)) {
        fprintf(stderr, "rope_sweep: no GPU: %s\n", info.why_not);
        return 1;
    }
    ceilings_t ceil;
    measure_ceilings(&ceil, 0);
    printf("rope_sweep: %s, %d SMs; copy %.0f GB/s (cudaMemcpy %zu MiB, read + write)\n", info.name, info.sm_count,
           ceil.copy_gbs, ceil.copy_bytes >> 20);

    // Inputs for the largest T (smaller T use its first rows).
    rng_t rng;
    rng_seed(&rng, 4);
    std::vector<bf16_t> h_in(nmax), h_qw(D), h_kw(D);
    std::vector<int32_t> h_pos(TMAX);
    fill_normal_bf16(&rng, h_in.data(), nmax, 0.0f, 1.0f);
    fill_uniform_bf16(&rng, h_qw.data(), D, 0.5f, 1.5f);
    fill_uniform_bf16(&rng, h_kw.data(), D, 0.5f, 1.5f);
    for (int t = 0; t < TMAX; t++) h_pos[t] = rng_int(&rng, 0, MAX_POS - 1);
    h_pos[0] = MAX_POS - 1;
    MV_CHECK(rope_validate_positions(h_pos.data(), TMAX, MAX_POS));

    rope_config_t cfg = {D, MAX_POS, THETA, ROPE_SCALING_NONE, 0, 0, 0, 0};
    rope_cache_t cache;
    MV_CHECK(rope_cache_build(&cache, &cfg));
    std::vector<float> h_inv(D / 2);
    MV_CHECK(rope_inv_freq(h_inv.data(), &cfg));

    ctx_t c;
    c.flip = argc > 99 ? 1u : 0u;  // 0, from a value the compiler cannot see
    MV_CHECK(rope_cache_upload(&c.cache, &cache));
    bf16 *saved = (bf16 *)gpu_alloc(nmax * 2), *ref = (bf16 *)gpu_alloc(nmax * 2), *dst2d = (bf16 *)gpu_alloc(nmax * 2);
    bf16 *buf0 = (bf16 *)gpu_alloc(nmax * 2 + 256);  // room for the +16B rows
    c.buf = buf0;
    bf16 *w = (bf16 *)gpu_alloc(2 * D * 2);
    c.qw = w;
    c.kw = w + D;
    int32_t *d_pos = (int32_t *)gpu_alloc(sizeof(int32_t) * TMAX);
    float *d_inv = (float *)gpu_alloc(sizeof(float) * D / 2);
    c.pos = d_pos;
    c.inv_freq = d_inv;
    cmp_t *d_cmp = (cmp_t *)gpu_alloc(sizeof(cmp_t));
    gpu_upload(saved, h_in.data(), nmax * 2);
    gpu_upload(w, h_qw.data(), D * 2);
    gpu_upload(w + D, h_kw.data(), D * 2);
    gpu_upload(d_pos, h_pos.data(), sizeof(int32_t) * TMAX);
    gpu_upload(d_inv, h_inv.data(), sizeof(float) * D / 2);

    const timing_opts_t opts = {5, 50, 1};
    const int nvar = (int)(sizeof variants / sizeof variants[0]);
    for (int ti = 0; ti < 2; ti++) {
        const int T = Ts[ti];
        c.T = T;
        const size_t n = (size_t)T * ROW;
        const double bytes = (double)T * QK * 2 * 2;  // q and k read and written (cos/sin not counted, as ch. 05)

        // The reference output: the library's fused v4.
        CUDA_CHECK(cudaMemcpy(c.buf, saved, n * 2, cudaMemcpyDeviceToDevice));
        MV_CHECK(run_fused<4>(&c, 0));
        CUDA_CHECK(cudaDeviceSynchronize());
        CUDA_CHECK(cudaMemcpy(ref, c.buf, n * 2, cudaMemcpyDeviceToDevice));

        gpu_copy2d_t cp = {dst2d, saved, (size_t)ROW * 2, (size_t)QK * 2, (size_t)T};
        const double copy2d_us = gpu_time_ms(gpu_copy2d, &cp, opts) * 1e3;

        std::vector<row_t> rows;
        for (int i = 0; i < nvar; i++) {
            const variant_t *v = &variants[i];
            row_t r = {v, 0, -1, -1, -1, {0, 0, 0}, false};
            if (v->func) {
                cudaFuncAttributes fa;
                CUDA_CHECK(cudaFuncGetAttributes(&fa, v->func));
                r.regs = fa.numRegs;
                r.local = (int)fa.localSizeBytes;
                const size_t smem = v->cossin == 0 ? sizeof(float) * v->tok * D : 0;  // tz = 1 for Qwen3
                CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&r.blocks, v->func, rope_fused::THREADS,
                                                                         smem));
            }
            c.buf = buf0 + v->offset;
            if (v->offset) CUDA_CHECK(cudaMemcpy(c.buf, saved, n * 2, cudaMemcpyDeviceToDevice));
            if (v->run != run_plain_v3 && v->run != run_touch<false> && v->run != run_touch<true> &&
                !v->offset) {  // the plain rope and the ceilings do something else, offset rows are elsewhere: timed only
                CUDA_CHECK(cudaMemcpy(c.buf, saved, n * 2, cudaMemcpyDeviceToDevice));
                MV_CHECK(v->run(&c, 0));
                CUDA_CHECK(cudaMemset(d_cmp, 0, sizeof(cmp_t)));
                compare_kernel<<<4 * info.sm_count, 256>>>((const uint16_t *)c.buf, (const uint16_t *)ref,
                                                          (const uint16_t *)saved, (long long)n, d_cmp);
                CUDA_CHECK(cudaGetLastError());
                CUDA_CHECK(cudaMemcpy(&r.cmp, d_cmp, sizeof(cmp_t), cudaMemcpyDeviceToHost));
                r.checked = true;
            }
            r.us = gpu_time_ms(v->run, &c, opts) * 1e3;
            c.buf = buf0;
            rows.push_back(r);
        }
        std::sort(rows.begin(), rows.end(), [](const row_t &a, const row_t &b) { return a.us < b.us; });

        const double copy_us = bytes / (ceil.copy_gbs * 1e9) * 1e6;
        printf("\n== T=%d: q/k of QKV rows (16+8 heads x 128 of 32), %.0f MB moved; 85%% of copy = %.1f us; "
               "cudaMemcpy2D same region %.1f us (%.1f%%)\n",
               T, bytes / 1e6, copy_us / 0.85, copy2d_us, 100.0 * copy_us / copy2d_us);
        printf("%4s %-44s %4s %5s %6s %5s %8s %6s %6s %6s %9s %s\n", "rank", "variant", "regs", "local", "blk/SM",
               "warps", "us", "GB/s", "%copy", "maxulp", ">1ulp", "");
        int rank = 0;
        for (const row_t &r : rows) {
            char name[96], regs[16] = "-", local[16] = "-", blk[16] = "-", warps[16] = "-", ulp[16] = "-", over[24] = "-";
            label(r.v, name, sizeof name);
            if (r.regs >= 0) {
                snprintf(regs, sizeof regs, "%d", r.regs);
                snprintf(local, sizeof local, "%d", r.local);
                snprintf(blk, sizeof blk, "%d", r.blocks);
                snprintf(warps, sizeof warps, "%d", r.blocks * rope_fused::THREADS / 32);
            }
            const char *mark = "";
            if (r.checked) {
                snprintf(ulp, sizeof ulp, "%u", r.cmp.max_ulp);
                snprintf(over, sizeof over, "%llu", r.cmp.over1);
                if (r.cmp.v_changed) mark = "  V-PART CHANGED";
                else if (r.cmp.max_ulp > 1) mark = "  >1ULP";
            }
            const double gbs = bytes / (r.us * 1e-6) / 1e9;
            printf("%4d %-44s %4s %5s %6s %5s %8.1f %6.0f %6.1f %6s %9s%s%s\n", ++rank, name, regs, local, blk, warps,
                   r.us, gbs, 100.0 * gbs / ceil.copy_gbs, ulp, over, mark,
                   100.0 * gbs / ceil.copy_gbs >= 85.0 ? "  >=85%" : "");
        }
    }
    rope_cache_gpu_free(&c.cache);
    rope_cache_free(&cache);
    gpu_free(saved); gpu_free(ref); gpu_free(dst2d); gpu_free(buf0); gpu_free(w); gpu_free(d_pos); gpu_free(d_inv);
    gpu_free(d_cmp);
    return 0;
}

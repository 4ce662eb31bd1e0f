/*
 * chapters/05-rope/main.c - Chapter 05: rotary position embedding (RoPE),
 * and Qwen3's q_norm/k_norm fused with it.
 *
 * Where it sits in Qwen3: right after the QKV projection. Each q and k head
 * is RMS-normalised over head_dim (q_norm / k_norm) and then rotated by its
 * token's position; v is left alone. In a continuous batch the tokens of
 * one step belong to many sequences, so positions are arbitrary per token,
 * not 0..T-1.
 *
 *   pair (x[i], x[i + D/2]) of a head -> turned by angle pos * inv_freq[i],
 *   inv_freq[i] = theta^(-2i/D) (optionally reshaped by llama3 scaling).
 *
 * What it checks:
 *   1. The CPU reference (reference/rope.c) against hand-computed values
 *      (position 0 is the identity, head_dim 2 in closed form, the llama3
 *      frequency bands), an independent float64 formula (inv_freq, the
 *      cos/sin cache, the rotation, the fused norm + rotation), the
 *      relative-position property <rope(q,m), rope(k,n)> = f(m - n), and
 *      the rejections of bad positions and shapes. Always runs.
 *   2. Every CUDA version (kernels/rope.cu) against the CPU reference, on
 *      seeded random inputs with random, non-contiguous positions up to
 *      max_position - 1: head_dim 20..512, 1..16 heads, odd T, q and k as
 *      views into a QKV row or as separate tensors, pointers 2 bytes off
 *      (the scalar fallback) and 16 bytes off, llama3 scaling; the v part of QKV must stay
 *      bit-for-bit unchanged and guard elements around each buffer must
 *      keep their poison.
 *   3. Timing at Qwen3-0.6B shapes (T = 1, 256, 8192; 16 q and 8 kv heads,
 *      head_dim 128) and at a large shape (over 256 MiB of traffic), as
 *      GB/s and % of the measured copy bandwidth.
 *
 * Build and run:  make && ./build/05-rope [--json FILE] [--help]
 * Exit status: 0 if every check passed, 1 if any failed, 2 on bad arguments.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/bf16.h"
#include "common/check.h"
#include "common/compare.h"
#include "common/harness.h"
#include "common/rng.h"
#include "kernels/versions.h"
#include "reference/rmsnorm.h"
#include "reference/rope.h"
#if MV_HAVE_CUDA
#include "kernels/rope.h"
#endif

// Qwen3-0.6B's config.json: rope_theta, max_position_embeddings, head_dim, rms_norm_eps.
static const double QWEN3_THETA = 1000000.0;
static const int QWEN3_MAX_POS = 40960;
static const int QWEN3_HEAD_DIM = 128;
static const float QWEN3_EPS = 1e-6f;

static rope_config_t qwen3_config(void) {
    rope_config_t c = {QWEN3_HEAD_DIM, QWEN3_MAX_POS, QWEN3_THETA, ROPE_SCALING_NONE, 0, 0, 0, 0};
    return c;
}

// Llama 3.1's rope_scaling: factor 8, low 1, high 4, original 8192, theta 5e5.
static rope_config_t llama3_config(int max_position) {
    rope_config_t c = {128, max_position, 500000.0, ROPE_SCALING_LLAMA3, 8.0, 1.0, 4.0, 8192};
    return c;
}

// ---- tolerances: each with its reason ------------------------------------------
static const tolerance_t TOL_EXACT = {
    0, 0, 0, "position 0 has cos = 1 and sin = 0 exactly, so x*1 - y*0 returns x unchanged"};
static const tolerance_t TOL_HAND = {
    1e-12, 1e-6, 1e-12,
    "hand-computed values (float64) vs fp32 math: a few roundings of 2^-24 relative"};
static const tolerance_t TOL_INV_FREQ = {
    0, 4e-7, 1e-13,
    "fp32 inv_freq vs float64: powf within an ulp, the reciprocal and llama3's few fp32 operations one "
    "rounding each (2^-24 = 6e-8 relative apiece)"};
static const tolerance_t TOL_CACHE = {
    6e-8, 0, 1e-14,
    "cos/sin taken in double of the same fp32 angle and rounded to float: half an fp32 ulp of a value "
    "of at most 1, <= 2^-25 = 3e-8 (slack for the ulp of values near 1)"};
static const tolerance_t TOL_ROTATE_F64 = {
    1e-6, 1e-6, 1e-12,
    "fp32 rotation vs float64 with the same cos/sin: two products and a sum in fp32, each 2^-24 of "
    "|x| <= ~5, so about 1e-6 absolute when the two terms cancel"};
static const tolerance_t TOL_FUSED_F64 = {
    2e-6, 2e-6, 1e-11,
    "fp32 norm + rotation vs float64: 1/rms is computed in double and rounded to float, x*inv*w two fp32 "
    "roundings, then the rotation (above): a few 2^-24 of values up to ~8"};
#if MV_HAVE_CUDA  // the GPU half's tolerances (a CPU-only build would warn they are unused)
static const tolerance_t TOL_GPU = {
    1e-6, BF16_HALF_ULP + 1e-6, (BF16_HALF_ULP + 1e-6) * (BF16_HALF_ULP + 1e-6),
    "output rounded once to bf16: half an ulp, 2^-8 relative; the fp32 rotation may fuse into FMAs on "
    "the GPU, which moves values by ~2^-24 of |x| (atol covers the cancelling pairs)"};
static const tolerance_t TOL_GPU_FUSED = {
    1e-5, BF16_HALF_ULP + 2e-5, (BF16_HALF_ULP + 2e-5) * (BF16_HALF_ULP + 2e-5),
    "normalised value kept in fp32 and fed to the rotation, output rounded once to bf16: 2^-8; the "
    "kernel's fp32 sum of squares in tree order moves 1/rms by up to ~1e-5 (a common factor of the pair, "
    "so relative), and its per-element fp32 roundings ~2^-23 of |x*w| <= 8 (atol, for cancelling pairs)"};
#endif

// ---- 1. the CPU reference on its own ----------------------------------------------

static void check_hand_values(harness_t *h, rng_t *rng) {
    char detail[160];
    // Position 0: cos = 1, sin = 0, the rotation is the identity (exactly).
    {
        rope_config_t cfg = qwen3_config();
        cfg.max_position = 4;
        rope_cache_t cache;
        MV_CHECK(rope_cache_build(&cache, &cfg));
        enum { H = 2, HKV = 1, D = 128 };
        float q[H * D], k[HKV * D];
        double want[(H + HKV) * D];
        fill_normal_f32(rng, q, H * D, 0.0f, 1.0f);
        fill_normal_f32(rng, k, HKV * D, 0.0f, 1.0f);
        for (int i = 0; i < H * D; i++) want[i] = q[i];
        for (int i = 0; i < HKV * D; i++) want[H * D + i] = k[i];
        int32_t pos0 = 0;
        MV_CHECK(rope_cpu(q, H * D, k, HKV * D, &pos0, &cache, 1, H, HKV, D));
        compare_result_t r = compare_f64("pos0 q", q, want, H * D, TOL_EXACT, 0);
        harness_check(h, "cpu", "hand-values", "position 0 = identity (q)", "2x128", r, TOL_EXACT);
        r = compare_f64("pos0 k", k, want + H * D, HKV * D, TOL_EXACT, 0);
        harness_check(h, "cpu", "hand-values", "position 0 = identity (k)", "1x128", r, TOL_EXACT);
        rope_cache_free(&cache);
    }
    // head_dim 2: inv_freq = theta^0 = 1, so the pair turns by `pos` radians:
    // (x1, x2) -> (x1 cos p - x2 sin p, x2 cos p + x1 sin p).
    {
        rope_config_t cfg = {2, 8, 10000.0, ROPE_SCALING_NONE, 0, 0, 0, 0};
        rope_cache_t cache;
        MV_CHECK(rope_cache_build(&cache, &cfg));
        float q[2] = {1.0f, 0.0f}, k[2] = {0.5f, 2.0f};
        int32_t pos[1] = {3};
        double want_q[2] = {cos(3.0), sin(3.0)};
        double want_k[2] = {0.5 * cos(3.0) - 2.0 * sin(3.0), 2.0 * cos(3.0) + 0.5 * sin(3.0)};
        MV_CHECK(rope_cpu(q, 2, k, 2, pos, &cache, 1, 1, 1, 2));
        compare_result_t r = compare_f64("D=2 q", q, want_q, 2, TOL_HAND, 0);
        harness_check(h, "cpu", "hand-values", "head_dim 2 closed form (1,0) at pos 3", "D=2", r, TOL_HAND);
        r = compare_f64("D=2 k", k, want_k, 2, TOL_HAND, 0);
        harness_check(h, "cpu", "hand-values", "head_dim 2 closed form (0.5,2) at pos 3", "D=2", r, TOL_HAND);
        rope_cache_free(&cache);
    }
    // Qwen3's default inv_freq at three easy indices: theta^0, theta^-1/4, theta^-1/2.
    {
        rope_config_t cfg = qwen3_config();
        float inv[64];
        MV_CHECK(rope_inv_freq(inv, &cfg));
        float got[3] = {inv[0], inv[16], inv[32]};
        double want[3] = {1.0, 0.031622776601683794, 0.001};
        compare_result_t r = compare_f64("inv_freq", got, want, 3, TOL_INV_FREQ, 0);
        harness_check(h, "cpu", "hand-values", "qwen3 inv_freq[0,16,32]", "theta=1e6 D=128", r, TOL_INV_FREQ);
    }
    // llama3 (factor 8, low 1, high 4, original 8192, theta 5e5, D 128): the
    // bands by wavelength 2*pi/inv_freq, against values computed by hand
    // (float64) with the rule in reference/rope.c:
    //   i <= 28  wavelength < 2048 (= 8192/4): kept        i = 28: 1956 -> kept
    //   29..34   between: blended,  smooth = (8192/wavelength - 1) / 3
    //   i >= 35  wavelength > 8192 (= 8192/1): divided by 8 i = 35: 8219 -> /8
    {
        rope_config_t cfg = llama3_config(8192);
        float inv[64];
        MV_CHECK(rope_inv_freq(inv, &cfg));
        const int idx[7] = {0, 28, 29, 32, 34, 35, 63};
        const double want[7] = {
            1.0,                    // high: 2*pi < 2048
            0.003211445994752591,   // high: wavelength 1956.5
            0.002166570763503359,   // mid: wavelength 2401.7, smooth 0.8036
            0.0005248461609929547,  // mid: inv = 1/sqrt(5e5), wavelength 4442.9, smooth 0.2813
            0.0001785078127679964,  // mid: wavelength 6695.1, smooth 0.0745
            9.556212353964683e-05,  // low: wavelength 8218.7, / 8
            3.068925988914511e-07,  // low: wavelength 2.56e6, / 8
        };
        float got[7];
        for (int i = 0; i < 7; i++) got[i] = inv[idx[i]];
        compare_result_t r = compare_f64("llama3", got, want, 7, TOL_INV_FREQ, 0);
        harness_check(h, "cpu", "hand-values", "llama3 inv_freq bands", "i=0,28,29,32,34,35,63", r, TOL_INV_FREQ);
        // The band edges themselves: every index classified as the rule says.
        int bad = 0;
        for (int i = 0; i < 64; i++) {
            double base = pow(500000.0, -(2.0 * i) / 128), wl = 2 * M_PI / base, ratio = inv[i] / base;
            if (wl < 2048 && fabs(ratio - 1) > 1e-6) bad++;
            if (wl > 8192 && fabs(ratio - 0.125) > 1e-6) bad++;
            if (wl >= 2048 && wl <= 8192 && !(ratio > 0.125 && ratio < 1)) bad++;
        }
        snprintf(detail, sizeof detail, "%d of 64 frequencies outside their band's rule", bad);
        harness_check_bool(h, "cpu", "hand-values", "llama3: kept / blended / divided by 8 bands", bad == 0, detail);
    }
}

// Float64 inv_freq, written independently of the reference (no llama3).
static double inv_freq_f64(double theta, int i, int D) { return pow(theta, -(2.0 * i) / D); }

static void check_against_f64(harness_t *h, rng_t *rng) {
    // inv_freq and the whole cos/sin cache of Qwen3-0.6B.
    rope_config_t cfg = qwen3_config();
    rope_cache_t cache;
    MV_CHECK(rope_cache_build(&cache, &cfg));
    const int D = cfg.head_dim, half = D / 2;
    float inv[64];
    double inv_d[64];
    MV_CHECK(rope_inv_freq(inv, &cfg));
    for (int i = 0; i < half; i++) inv_d[i] = inv_freq_f64(cfg.theta, i, D);
    compare_result_t r = compare_f64("inv_freq", inv, inv_d, (size_t)half, TOL_INV_FREQ, 0);
    harness_check(h, "cpu", "float64", "inv_freq theta^(-2i/D)", "theta=1e6 D=128", r, TOL_INV_FREQ);

    // The cache against cos/sin in double of the same fp32 angle (the angle's
    // own fp32 rounding is Hugging Face's, see reference/rope.h).
    size_t n = (size_t)cfg.max_position * D;
    double *want = mv_xmalloc(n * sizeof(double));
    for (int p = 0; p < cfg.max_position; p++)
        for (int i = 0; i < half; i++) {
            double angle = (double)((float)p * inv[i]);
            want[(size_t)p * D + i] = cos(angle);
            want[(size_t)p * D + half + i] = sin(angle);
        }
    r = compare_f64("cos/sin cache", cache.cos_sin, want, n, TOL_CACHE, 0);
    harness_check(h, "cpu", "float64", "cos/sin cache, every position", "40960x128", r, TOL_CACHE);
    free(want);

    // The rotation, q and k as views into QKV rows, vs float64 with the same cos/sin.
    enum { T = 7, H = 3, HKV = 2, ROW = (H + 2 * HKV) * 128 };
    float *qkv = mv_xmalloc(sizeof(float) * T * ROW);
    double *ref = mv_xmalloc(sizeof(double) * T * ROW);
    int32_t pos[T];
    fill_normal_f32(rng, qkv, (size_t)T * ROW, 0.0f, 1.0f);
    for (int t = 0; t < T; t++) pos[t] = rng_int(rng, 0, cfg.max_position - 1);
    pos[0] = cfg.max_position - 1;
    for (size_t i = 0; i < (size_t)T * ROW; i++) ref[i] = qkv[i];
    for (int t = 0; t < T; t++) {
        const float *c = cache.cos_sin + (size_t)pos[t] * D, *s = c + half;
        for (int hh = 0; hh < H + HKV; hh++) {  // q heads then k heads, side by side in the row
            double *x = ref + (size_t)t * ROW + (size_t)hh * D;
            for (int i = 0; i < half; i++) {
                double x1 = x[i], x2 = x[i + half];
                x[i] = x1 * c[i] - x2 * s[i];
                x[i + half] = x2 * c[i] + x1 * s[i];
            }
        }
    }
    float *saved = mv_xmalloc(sizeof(float) * T * ROW);
    memcpy(saved, qkv, sizeof(float) * T * ROW);
    MV_CHECK(rope_cpu(qkv, ROW, qkv + H * 128, ROW, pos, &cache, T, H, HKV, 128));
    r = compare_f64("rotation", qkv, ref, (size_t)T * ROW, TOL_ROTATE_F64, 0);
    harness_check(h, "cpu", "float64", "rope_cpu in QKV rows (v untouched)", "T=7 q 3x128 k 2x128", r, TOL_ROTATE_F64);

    // Fused: norm each q/k head in double, then the same rotation.
    float qw[128], kw[128];
    fill_uniform_f32(rng, qw, 128, 0.5f, 1.5f);
    fill_uniform_f32(rng, kw, 128, 0.5f, 1.5f);
    for (size_t i = 0; i < (size_t)T * ROW; i++) ref[i] = saved[i];
    for (int t = 0; t < T; t++) {
        const float *c = cache.cos_sin + (size_t)pos[t] * D, *s = c + half;
        for (int hh = 0; hh < H + HKV; hh++) {
            double *x = ref + (size_t)t * ROW + (size_t)hh * D;
            const float *w = hh < H ? qw : kw;
            double ss = 0;
            for (int i = 0; i < D; i++) ss += x[i] * x[i];
            double inv_rms = 1.0 / sqrt(ss / D + QWEN3_EPS);
            for (int i = 0; i < D; i++) x[i] = x[i] * inv_rms * w[i];
            for (int i = 0; i < half; i++) {
                double x1 = x[i], x2 = x[i + half];
                x[i] = x1 * c[i] - x2 * s[i];
                x[i + half] = x2 * c[i] + x1 * s[i];
            }
        }
    }
    memcpy(qkv, saved, sizeof(float) * T * ROW);
    MV_CHECK(qk_norm_rope_cpu(qkv, qw, kw, pos, &cache, T, H, HKV, 128, QWEN3_EPS));
    r = compare_f64("fused", qkv, ref, (size_t)T * ROW, TOL_FUSED_F64, 0);
    harness_check(h, "cpu", "float64", "qk_norm_rope_cpu (v untouched)", "T=7 q 3x128 k 2x128", r, TOL_FUSED_F64);
    free(qkv); free(ref); free(saved);
    rope_cache_free(&cache);
}

// <rope(q, m), rope(k, n)> for one head, in float64 with exact angles.
static double rotated_dot_f64(const float *q, const float *k, int m, int n, int D, double theta) {
    const int half = D / 2;
    double dot = 0;
    for (int i = 0; i < half; i++) {
        double w = inv_freq_f64(theta, i, D), cm = cos(m * w), sm = sin(m * w), cn = cos(n * w), sn = sin(n * w);
        double q1 = q[i] * cm - q[i + half] * sm, q2 = q[i + half] * cm + q[i] * sm;
        double k1 = k[i] * cn - k[i + half] * sn, k2 = k[i + half] * cn + k[i] * sn;
        dot += q1 * k1 + q2 * k2;
    }
    return dot;
}

// <rope(q, m), rope(k, n)> with the reference (fp32 cache, fp32 rotation).
// rope_cpu turns q and k by the same position, so q and k go in two calls.
static double rotated_dot_ref(const float *q, const float *k, int m, int n, const rope_cache_t *cache) {
    enum { D = 128 };
    float qr[D], kr[D], scratch[D];
    int32_t pm = m, pn = n;
    memcpy(qr, q, sizeof qr);
    memcpy(scratch, k, sizeof scratch);
    MV_CHECK(rope_cpu(qr, D, scratch, D, &pm, cache, 1, 1, 1, D));  // q turned by m
    memcpy(kr, k, sizeof kr);
    memcpy(scratch, q, sizeof scratch);
    MV_CHECK(rope_cpu(scratch, D, kr, D, &pn, cache, 1, 1, 1, D));  // k turned by n
    double dot = 0;
    for (int i = 0; i < D; i++) dot += (double)qr[i] * kr[i];
    return dot;
}

// The score between a query at m and a key at n depends only on m - n:
// rotating both by the same extra s leaves it unchanged. Exact in float64
// (up to rounding); the fp32 reference keeps it to its angle error.
static void check_relative_position(harness_t *h, rng_t *rng) {
    const int D = 128;
    float q[128], k[128];
    fill_normal_f32(rng, q, D, 0.0f, 1.0f);
    fill_normal_f32(rng, k, D, 0.0f, 1.0f);
    double qn = 0, kn = 0;
    for (int i = 0; i < D; i++) qn += (double)q[i] * q[i], kn += (double)k[i] * k[i];
    const double scale = sqrt(qn * kn);  // |q| |k|: the size of any score
    const int triples[6][3] = {{5, 2, 100}, {0, 7, 1000}, {300, 300, 37}, {17, 1000, 2000}, {1, 0, 4000}, {2047, 11, 1}};
    double worst64 = 0, worst_ref = 0;
    rope_config_t cfg = qwen3_config();
    cfg.max_position = 8192;
    rope_cache_t cache;
    MV_CHECK(rope_cache_build(&cache, &cfg));
    for (int j = 0; j < 6; j++) {
        int m = triples[j][0], n = triples[j][1], s = triples[j][2];
        double a = rotated_dot_f64(q, k, m, n, D, QWEN3_THETA), b = rotated_dot_f64(q, k, m + s, n + s, D, QWEN3_THETA);
        worst64 = fmax(worst64, fabs(a - b) / scale);
        double ar = rotated_dot_ref(q, k, m, n, &cache), br = rotated_dot_ref(q, k, m + s, n + s, &cache);
        worst_ref = fmax(worst_ref, fabs(ar - br) / scale);
    }
    // Also: it is *not* independent of m - n (a shift of one changes it).
    double d0 = rotated_dot_f64(q, k, 10, 3, D, QWEN3_THETA), d1 = rotated_dot_f64(q, k, 11, 3, D, QWEN3_THETA);
    char detail[200];
    snprintf(detail, sizeof detail, "max |score(m,n) - score(m+s,n+s)| / (|q||k|) = %.2e (bound 1e-12)", worst64);
    harness_check_bool(h, "cpu", "relative-position", "float64: score depends on m - n only", worst64 < 1e-12, detail);
    // fp32 angles p*inv_freq are off by up to ~p * 2^-23 rad at p < 8192 (<1e-3),
    // and the rotations add ~1e-7 relative: the scores agree to ~1e-3 of |q||k|.
    snprintf(detail, sizeof detail, "max difference / (|q||k|) = %.2e (bound 2e-3, fp32 angles at p < 8192)", worst_ref);
    harness_check_bool(h, "cpu", "relative-position", "reference: score depends on m - n only", worst_ref < 2e-3, detail);
    snprintf(detail, sizeof detail, "score(10,3) = %.6f, score(11,3) = %.6f", d0, d1);
    harness_check_bool(h, "cpu", "relative-position", "and it does depend on m - n", fabs(d0 - d1) > 1e-3 * scale, detail);
    rope_cache_free(&cache);
}

static void expect_error(harness_t *h, const char *what, int rc, const char *must_mention) {
    char detail[320];
    snprintf(detail, sizeof detail, "%s", rc ? mv_last_error() : "accepted (wrong)");
    harness_check_bool(h, "cpu", "reject", what, rc != 0 && strstr(mv_last_error(), must_mention) != NULL, detail);
}

static void check_rejections(harness_t *h) {
    int32_t neg[3] = {4, -1, 7}, big[2] = {0, QWEN3_MAX_POS}, ok[2] = {0, QWEN3_MAX_POS - 1};
    expect_error(h, "position < 0", rope_validate_positions(neg, 3, QWEN3_MAX_POS), "token 1 has position -1");
    expect_error(h, "position >= max_position_embeddings", rope_validate_positions(big, 2, QWEN3_MAX_POS),
                 "token 1 has position 40960");
    harness_check_bool(h, "cpu", "accept", "positions 0 and max_position - 1",
                       rope_validate_positions(ok, 2, QWEN3_MAX_POS) == 0, "");
    rope_config_t cfg = {8, 16, 10000.0, ROPE_SCALING_NONE, 0, 0, 0, 0};
    rope_cache_t cache;
    MV_CHECK(rope_cache_build(&cache, &cfg));
    float q[16] = {0}, k[8] = {0};
    int32_t p16 = 16;
    expect_error(h, "rope_cpu at position max_position", rope_cpu(q, 16, k, 8, &p16, &cache, 1, 2, 1, 8), "position 16");
    int32_t p1 = 1;
    expect_error(h, "head_dim differs from the cache", rope_cpu(q, 16, k, 8, &p1, &cache, 1, 4, 2, 4), "cache");
    expect_error(h, "q row stride < heads*head_dim", rope_cpu(q, 8, k, 8, &p1, &cache, 1, 2, 1, 8), "stride");
    rope_cache_free(&cache);
    rope_config_t odd = {7, 16, 10000.0, ROPE_SCALING_NONE, 0, 0, 0, 0};
    expect_error(h, "odd head_dim", rope_cache_build(&cache, &odd), "even");
    rope_config_t bad = llama3_config(8192);
    bad.high_freq_factor = 0.5;
    expect_error(h, "llama3 high_freq_factor < low_freq_factor", rope_cache_build(&cache, &bad), "low_freq_factor");
}

// ---- 2. and 3. the CUDA versions ------------------------------------------------------
#if MV_HAVE_CUDA
// A case: q and k either as views into QKV rows [T, (H + 2*Hkv) * D] (the
// engine's layout; the fused kernel always works there) or as separate
// contiguous tensors q [T, H, D], k [T, Hkv, D] (held in one buffer, k after q).
typedef struct {
    int T, H, Hkv, D;
    int in_qkv;    // 1: views into QKV rows; 0: contiguous q and k
    int fused;     // 1: qk_norm_rope (in_qkv must be 1); 0: rope
    int misalign;  // shift the buffer by this many elements: 1 (2 bytes: the scalar
                   // fallback), 8 (16 bytes: 16-byte vectors, but rows off 32-byte sectors)
    int llama3;    // llama3 scaling (D = 128) instead of the default rule
    int max_pos;   // cos/sin cache rows (max_position_embeddings)
    double theta;
} rcase_t;

// Poisoned elements before and after each buffer: overruns show. 128 of
// them (256 bytes) keep the data where cudaMalloc puts a buffer, on a
// 256-byte boundary, as the engine's buffers are; misalign moves it off.
// The timings depend on it: with every QKV row 16 bytes off, each token's
// q/k range starts and ends mid-sector, and the fused kernel takes 3%
// longer (one H200, T = 32768: 112.6 against 109.2 us; docs/05-rope.md).
enum { GUARD = 128 };

static long long row_len(const rcase_t *c) {
    return c->in_qkv ? (long long)(c->H + 2 * c->Hkv) * c->D : (long long)(c->H + c->Hkv) * c->D;
}

typedef struct {
    const rcase_t *c;
    int version;
    bf16_t *d_buf;            // the data: QKV rows, or q [T,H,D] then k [T,Hkv,D]
    bf16_t *d_qw, *d_kw;      // [D] norm weights (fused)
    int32_t *d_pos;           // [T]
    rope_cache_gpu_t cache;
} run_ctx_t;

static int run_version(void *p, cudaStream_t s) {
    run_ctx_t *r = p;
    const rcase_t *c = r->c;
    if (c->fused)
        return qk_norm_rope_cuda(r->version, r->d_buf, r->d_qw, r->d_kw, r->d_pos, &r->cache, c->T, c->H, c->Hkv,
                                 c->D, QWEN3_EPS, s);
    if (c->in_qkv) {
        long long row = row_len(c);
        return rope_cuda(r->version, r->d_buf, row, r->d_buf + (long long)c->H * c->D, row, r->d_pos, &r->cache,
                         c->T, c->H, c->Hkv, c->D, s);
    }
    return rope_cuda(r->version, r->d_buf, (long long)c->H * c->D, r->d_buf + (long long)c->T * c->H * c->D,
                     (long long)c->Hkv * c->D, r->d_pos, &r->cache, c->T, c->H, c->Hkv, c->D, s);
}

static void describe(const rcase_t *c, char *shape, size_t n) {
    char off[16] = "";
    if (c->misalign) snprintf(off, sizeof off, " +%dB", 2 * c->misalign);
    snprintf(shape, n, "T=%d q %dx%d k %dx%d %s%s%s", c->T, c->H, c->D, c->Hkv, c->D,
             c->in_qkv ? "in QKV" : "contiguous", off, c->llama3 ? " llama3" : "");
}

// Bytes one run must move: q and k read once and written once, in place.
// (Not counted: the token's cos/sin row, D fp32 = 4% more at Qwen3's
// shapes, and the positions; so the GB/s are slightly conservative.)
static double bytes_moved(const rcase_t *c) { return (double)c->T * (c->H + c->Hkv) * c->D * 2 * 2; }

// Which tokens the CPU checks: all of them, or for large T a sample (the
// first and last 64, and every 61st: a stride prime to any block shape).
static int pick_tokens(int T, int *tok) {
    int n = 0;
    for (int t = 0; t < T; t++)
        if (T <= 4096 || t < 64 || t >= T - 64 || t % 61 == 0) tok[n++] = t;
    return n;
}

// Where token t's elements live in the buffer, as one "row" of the compact
// copy the CPU works on: QKV rows are rows; for contiguous q and k, token t
// is q[t] followed by k[t] in the compact copy.
static void gather_token(const rcase_t *c, const bf16_t *buf, int t, bf16_t *dst) {
    if (c->in_qkv) {
        memcpy(dst, buf + (size_t)t * row_len(c), sizeof(bf16_t) * (size_t)row_len(c));
    } else {
        size_t qn = (size_t)c->H * c->D, kn = (size_t)c->Hkv * c->D;
        memcpy(dst, buf + (size_t)t * qn, sizeof(bf16_t) * qn);
        memcpy(dst + qn, buf + (size_t)c->T * qn + (size_t)t * kn, sizeof(bf16_t) * kn);
    }
}

static int count_guard_changes(const bf16_t *g, int n) {
    int bad = 0;
    for (int i = 0; i < n; i++) bad += g[i] != POISON_BF16;
    return bad;
}

static void check_and_time(harness_t *h, rng_t *rng, const char *case_name, rcase_t c, int do_time,
                           double target_pct) {
    const size_t n = (size_t)c.T * (size_t)row_len(&c);  // elements of the data buffer
    const int D = c.D;
    rope_config_t cfg = {D, c.max_pos, c.theta, ROPE_SCALING_NONE, 0, 0, 0, 0};
    if (c.llama3) cfg = llama3_config(c.max_pos);
    rope_cache_t cache;
    MV_CHECK(rope_cache_build(&cache, &cfg));

    // Inputs: activations ~ N(0, 1) as bf16 (the QKV projection's output);
    // norm weights near 1; positions random over the whole cache, with the
    // extremes 0 and max_pos - 1 always present.
    bf16_t *h_in = mv_xmalloc(n * 2), *h_out = mv_xmalloc(n * 2), *h_qw = mv_xmalloc((size_t)D * 2), *h_kw = mv_xmalloc((size_t)D * 2);
    int32_t *h_pos = mv_xmalloc(sizeof(int32_t) * (size_t)c.T);
    fill_normal_bf16(rng, h_in, n, 0.0f, 1.0f);
    fill_uniform_bf16(rng, h_qw, (size_t)D, 0.5f, 1.5f);
    fill_uniform_bf16(rng, h_kw, (size_t)D, 0.5f, 1.5f);
    for (int t = 0; t < c.T; t++) h_pos[t] = rng_int(rng, 0, c.max_pos - 1);
    h_pos[0] = c.max_pos - 1;
    if (c.T > 1) h_pos[c.T - 1] = 0;
    MV_CHECK(rope_validate_positions(h_pos, c.T, c.max_pos));  // before any kernel runs

    // CPU reference on the checked tokens, in a compact copy: rows of
    // row_len elements, q heads at column 0, k heads at column H*D.
    int *tok = mv_xmalloc(sizeof(int) * (size_t)c.T);
    const int nt = pick_tokens(c.T, tok);
    const size_t row = (size_t)row_len(&c);
    bf16_t *h_rows = mv_xmalloc(sizeof(bf16_t) * (size_t)nt * row), *h_got = mv_xmalloc(sizeof(bf16_t) * (size_t)nt * row);
    float *ref = mv_xmalloc(sizeof(float) * (size_t)nt * row), *qwf = mv_xmalloc(sizeof(float) * (size_t)D),
          *kwf = mv_xmalloc(sizeof(float) * (size_t)D);
    int32_t *pos_s = mv_xmalloc(sizeof(int32_t) * (size_t)nt);
    for (int i = 0; i < nt; i++) {
        gather_token(&c, h_in, tok[i], h_rows + (size_t)i * row);
        pos_s[i] = h_pos[tok[i]];
    }
    bf16_to_float_array(ref, h_rows, (size_t)nt * row);
    bf16_to_float_array(qwf, h_qw, (size_t)D);
    bf16_to_float_array(kwf, h_kw, (size_t)D);
    if (c.fused) MV_CHECK(qk_norm_rope_cpu(ref, qwf, kwf, pos_s, &cache, nt, c.H, c.Hkv, D, QWEN3_EPS));
    else MV_CHECK(rope_cpu(ref, (long long)row, ref + (size_t)c.H * D, (long long)row, pos_s, &cache, nt, c.H, c.Hkv, D));

    // Device buffers: GUARD poisoned elements on each side of the data.
    run_ctx_t r = {&c, 0, NULL, NULL, NULL, NULL, {NULL, 0, 0}};
    const size_t alloc = n + 2 * GUARD + 1;
    bf16_t *base = gpu_alloc(alloc * 2), *saved = gpu_alloc(n * 2 + 2);
    // Weights: q_norm at 0, k_norm at D + 8 (16-byte aligned when D % 8 == 0).
    bf16_t *w_base = gpu_alloc((size_t)(2 * D + 16) * 2);
    r.d_buf = base + GUARD + c.misalign;
    r.d_qw = w_base + c.misalign;
    r.d_kw = w_base + D + 8 + c.misalign;
    r.d_pos = gpu_alloc(sizeof(int32_t) * (size_t)c.T);
    gpu_upload(saved, h_in, n * 2);
    gpu_upload(r.d_qw, h_qw, (size_t)D * 2);
    gpu_upload(r.d_kw, h_kw, (size_t)D * 2);
    gpu_upload(r.d_pos, h_pos, sizeof(int32_t) * (size_t)c.T);
    MV_CHECK(rope_cache_upload(&r.cache, &cache));

    char shape[96], label[96], detail[200];
    describe(&c, shape, sizeof shape);
    const char *what = c.fused ? "qk_norm_rope" : "rope";
    const tolerance_t tol = c.fused ? TOL_GPU_FUSED : TOL_GPU;
    bf16_t guard_lo[GUARD + 1], guard_hi[GUARD + 1];
    for (int v = 1; v <= ROPE_MAX_VERSION; v++) {
        if (!rope_version_name(v)) continue;  // a number no version has (5)
        if (!harness_kernel_wanted(h, v)) continue;  // --kernel N: version N alone
        r.version = v;
        snprintf(label, sizeof label, "%s %s", what, c.fused ? qk_norm_rope_version_name(v) : rope_version_name(v));
        gpu_poison(base, alloc * 2);
        CUDA_CHECK(cudaMemcpy(r.d_buf, saved, n * 2, cudaMemcpyDeviceToDevice));
        MV_CHECK(run_version(&r, 0));
        CUDA_CHECK(cudaDeviceSynchronize());
        gpu_download(h_out, r.d_buf, n * 2);
        for (int i = 0; i < nt; i++) gather_token(&c, h_out, tok[i], h_got + (size_t)i * row);
        compare_result_t cr = compare_bf16(label, h_got, ref, (size_t)nt * row, tol, 0);
        harness_check(h, "gpu", case_name, label, shape, cr, tol);

        // Untouched: the v part of every QKV row, bit for bit; the guards.
        if (c.in_qkv) {
            size_t v_off = (size_t)(c.H + c.Hkv) * D, v_len = (size_t)c.Hkv * D;
            long long changed_rows = 0;
            for (int t = 0; t < c.T; t++)
                changed_rows += memcmp(h_out + (size_t)t * row + v_off, h_in + (size_t)t * row + v_off, v_len * 2) != 0;
            snprintf(detail, sizeof detail, "%lld of %d rows had their v part changed", changed_rows, c.T);
            snprintf(label, sizeof label, "%s v%d: v untouched", what, v);
            harness_check_bool(h, "gpu", case_name, label, changed_rows == 0, detail);
        }
        gpu_download(guard_lo, base, (size_t)(GUARD + c.misalign) * 2);
        gpu_download(guard_hi, r.d_buf + n, (size_t)(GUARD + 1 - c.misalign) * 2);
        int bad = count_guard_changes(guard_lo, GUARD + c.misalign) + count_guard_changes(guard_hi, GUARD + 1 - c.misalign);
        snprintf(detail, sizeof detail, "%d guard elements around the buffer overwritten", bad);
        snprintf(label, sizeof label, "%s v%d: guards kept", what, v);
        harness_check_bool(h, "gpu", case_name, label, bad == 0, detail);

        if (do_time) {
            // In place: each timed run rotates (and normalises) the previous
            // run's result. It moves the same bytes, and rotations and norms
            // keep values O(1), so the runs simply chain.
            timing_opts_t opts = {5, h->quick ? 10 : 50, 1};
            double ms = gpu_time_ms(run_version, &r, opts);
            snprintf(label, sizeof label, "%s %s", what, c.fused ? qk_norm_rope_version_name(v) : rope_version_name(v));
            harness_timing(h, case_name, label, shape, ms, bytes_moved(&c), 0, v == ROPE_FAST ? target_pct : 0);
        }
    }
    if (do_time && c.in_qkv && !c.fused) {
        // The ceiling for this access pattern: cudaMemcpy2D of exactly the
        // region the kernel reads and writes (the q and k part of each QKV
        // row, 3/4 of it for Qwen3), so the strided layout's own cost is
        // seen apart from the kernel's.
        bf16_t *dst = gpu_alloc(n * 2);
        gpu_copy2d_t cp = {dst, r.d_buf, row * 2, (size_t)(c.H + c.Hkv) * D * 2, (size_t)c.T};
        timing_opts_t opts = {5, h->quick ? 10 : 50, 1};
        double ms = gpu_time_ms(gpu_copy2d, &cp, opts);
        harness_timing(h, case_name, "cudaMemcpy2D same region", shape, ms, bytes_moved(&c), 0, 0);
        gpu_free(dst);
    }
    rope_cache_gpu_free(&r.cache);
    gpu_free(base); gpu_free(saved); gpu_free(w_base); gpu_free(r.d_pos);
    rope_cache_free(&cache);
    free(h_in); free(h_out); free(h_qw); free(h_kw); free(h_pos); free(tok); free(h_rows); free(h_got);
    free(ref); free(qwf); free(kwf); free(pos_s);
}
#endif

int main(int argc, char **argv) {
    harness_t h;
    static const harness_kernel_t kernels[] = {
        {"rope", ROPE_VERSION_TABLE}, {"qk_norm_rope", QK_NORM_ROPE_VERSION_TABLE}, {NULL, NULL}};
    harness_begin_kernels(&h, "05-rope",
                          "RoPE (rotate_half, fp32 cos/sin cache, llama3 scaling) and Qwen3's fused q_norm/k_norm + RoPE; "
                          "bf16, fp32 math",
                          argc, argv, kernels);
    rng_t rng;
    rng_seed(&rng, h.seed);

    harness_section(&h, "CPU reference against hand-computed values and a float64 formula");
    check_hand_values(&h, &rng);
    check_against_f64(&h, &rng);
    check_relative_position(&h, &rng);
    check_rejections(&h);

#if MV_HAVE_CUDA
    if (h.use_gpu) {
        harness_section(&h, "CUDA versions against the CPU reference (odd shapes, random positions, views, misaligned)");
        // {T, H, Hkv, D, in_qkv, fused, misalign, llama3, max_pos, theta}
        static const rcase_t cases[] = {
            {1, 1, 1, 64, 1, 0, 0, 0, 2048, 10000.0},     {3, 16, 8, 128, 1, 0, 0, 0, 40960, 1e6},
            {7, 16, 8, 128, 0, 0, 0, 0, 40960, 1e6},      {5, 4, 2, 64, 1, 0, 0, 0, 4096, 10000.0},
            {9, 3, 1, 64, 0, 0, 0, 0, 4096, 10000.0},     {11, 2, 2, 48, 1, 0, 0, 0, 1000, 10000.0},
            {13, 5, 1, 20, 1, 0, 0, 0, 500, 10000.0},     {4, 8, 2, 256, 1, 0, 0, 0, 4096, 1e6},
            {3, 2, 1, 512, 0, 0, 0, 0, 4096, 1e6},        {17, 16, 8, 128, 1, 0, 1, 0, 40960, 1e6},
            {6, 4, 4, 64, 0, 0, 1, 0, 4096, 10000.0},     {31, 8, 8, 128, 1, 0, 0, 1, 131072, 0},
            {1001, 16, 8, 128, 1, 0, 0, 0, 40960, 1e6},   {777, 14, 2, 64, 0, 0, 0, 0, 40960, 1e6},
            {1, 1, 1, 64, 1, 1, 0, 0, 2048, 10000.0},     {3, 16, 8, 128, 1, 1, 0, 0, 40960, 1e6},
            {5, 4, 2, 64, 1, 1, 0, 0, 4096, 10000.0},     {11, 2, 2, 48, 1, 1, 0, 0, 1000, 10000.0},
            {13, 5, 1, 20, 1, 1, 0, 0, 500, 10000.0},     {4, 8, 2, 256, 1, 1, 0, 0, 4096, 1e6},
            {3, 2, 1, 512, 1, 1, 0, 0, 4096, 1e6},        {17, 16, 8, 128, 1, 1, 1, 0, 40960, 1e6},
            {9, 6, 2, 96, 1, 1, 1, 0, 4096, 1e6},         {31, 8, 8, 128, 1, 1, 0, 1, 131072, 0},
            {17, 16, 8, 128, 1, 1, 8, 0, 40960, 1e6},     {1001, 16, 8, 128, 1, 1, 8, 0, 40960, 1e6},
            {17, 16, 8, 128, 1, 0, 8, 0, 40960, 1e6},     {9, 4, 2, 64, 1, 1, 8, 0, 4096, 1e6},
            {1001, 16, 8, 128, 1, 1, 0, 0, 40960, 1e6},   {2999, 7, 1, 128, 1, 1, 0, 0, 40960, 1e6},
        };
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
            check_and_time(&h, &rng, "random", cases[i], 0, 0);

        harness_section(&h, "Qwen3-0.6B shapes and a large shape: check, then time");
        const int qwen_T[] = {1, 256, 8192};
        for (int i = 0; i < 3; i++) {
            rcase_t qkv = {qwen_T[i], 16, 8, 128, 1, 0, 0, 0, QWEN3_MAX_POS, QWEN3_THETA};
            check_and_time(&h, &rng, "qwen3-0.6b", qkv, h.do_timing, 0);
            rcase_t contig = qkv;
            contig.in_qkv = 0;
            check_and_time(&h, &rng, "qwen3-0.6b", contig, h.do_timing, 0);
            rcase_t fused = qkv;
            fused.fused = 1;
            check_and_time(&h, &rng, "qwen3-0.6b", fused, h.do_timing, 0);
        }
        // Large: T = 32768 tokens of Qwen3's 16 q + 8 kv heads of 128: q and
        // k are 32768 * 24 * 128 * 2 bytes = 201 MB, read and written: 403 MB
        // (over 256 MiB). The fast versions must reach 85% of copy on
        // contiguous q/k and, fused, in place in the QKV rows (where a
        // cudaMemcpy2D of the same region is timed beside the plain rope).
        if (h.do_timing) {
            const int big_T = h.quick ? 8192 : 32768;
            rcase_t qkv = {big_T, 16, 8, 128, 1, 0, 0, 0, QWEN3_MAX_POS, QWEN3_THETA};
            rcase_t contig = qkv, fused = qkv;
            contig.in_qkv = 0;
            fused.fused = 1;
            check_and_time(&h, &rng, "large", contig, 1, 85.0);
            check_and_time(&h, &rng, "large", fused, 1, 85.0);
            check_and_time(&h, &rng, "large", qkv, 1, 0);
        }
    }
#endif
    return harness_end(&h);
}

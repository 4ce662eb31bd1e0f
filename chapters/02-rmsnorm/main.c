/*
 * chapters/02-rmsnorm/main.c - Chapter 02: RMSNorm in Qwen3's three forms.
 *
 *   plain      y = x / sqrt(mean(x^2) + eps) * w            (final norm)
 *   fused add  residual = x + residual; y = rmsnorm(residual) (every decoder layer)
 *   per head   q_norm / k_norm over head_dim, in place on the QKV output
 *
 * What it checks:
 *   1. The CPU reference (reference/rmsnorm.c) against hand-computed values
 *      and an independent float64 formula, for all three forms. Always runs.
 *   2. Every CUDA version (kernels/rmsnorm.cu) against the CPU reference on
 *      seeded random inputs: odd, tail, long (past the register cache) and
 *      misaligned shapes; heads normalised in place inside a QKV row, with
 *      the V part checked untouched. Outputs are poisoned before each run.
 *   3. Timing at Qwen3-0.6B shapes (T = 1, 256, 8192; hidden 1024; 16 q and
 *      8 kv heads of head_dim 128) and at large shapes (over 256 MiB of
 *      traffic), as GB/s and % of the measured copy bandwidth.
 *
 * Build and run:  make && ./build/02-rmsnorm [--json FILE] [--help]
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
#if MV_HAVE_CUDA
#include "kernels/rmsnorm.h"
#endif

static const float QWEN3_EPS = 1e-6f;  // config.json: rms_norm_eps

// ---- tolerances: each with its reason ------------------------------------------
static const tolerance_t TOL_HAND = {
    1e-12, 1e-6, 1e-12,
    "hand-computed values vs fp32 reference: the sum of squares is in double, then a "
    "float rsqrt and two float multiplies, each 2^-24 relative"};
static const tolerance_t TOL_F64 = {
    1e-12, 1e-6, 1e-12,
    "fp32 reference vs float64 formula: the reference sums squares in double, so only "
    "the final float scaling (three roundings of 2^-24) differs"};
#if MV_HAVE_CUDA  // the GPU half's tolerances (a CPU-only build would warn they are unused)
static const tolerance_t TOL_GPU = {
    1e-7, BF16_HALF_ULP + 1e-5, (BF16_HALF_ULP + 1e-5) * (BF16_HALF_ULP + 1e-5),
    "output stored as bf16: at most half an ulp, 2^-8 relative; the kernel's fp32 sum "
    "of squares in tree order moves 1/rms by ~1e-6"};
static const tolerance_t TOL_GPU_RESIDUAL = {
    1e-7, BF16_HALF_ULP, BF16_HALF_ULP * BF16_HALF_ULP,
    "residual = bf16(x + residual): the reference does the same fp32 add, so the only "
    "difference is the final bf16 rounding, at most 2^-8 relative"};
static const tolerance_t TOL_GPU_FUSED = {
    1e-7, 3 * BF16_HALF_ULP + 1e-5, 2 * BF16_HALF_ULP * BF16_HALF_ULP,
    "the kernel normalises the residual as stored in bf16 (as Hugging Face does) and rounds "
    "the output: two roundings of 2^-8 plus their small effect on 1/rms, 3*2^-8 per element "
    "at worst; independent roundings keep NMSE under 2*(2^-8)^2"};
#endif

// ---- 1. the CPU reference on its own ----------------------------------------------

static void check_hand_values(harness_t *h) {
    // x = [3, 4], w = [2, 0.5]: mean(x^2) = 12.5, y = x / sqrt(12.5 + 1e-6) * w
    float x1[2] = {3, 4}, w1[2] = {2, 0.5f}, y1[2];
    double e1[2] = {1.6970562069654673, 0.5656854023218224};
    MV_CHECK(rmsnorm_cpu(y1, x1, w1, 1, 2, 1e-6f));
    compare_result_t r = compare_f64("plain", y1, e1, 2, TOL_HAND, 0);
    harness_check(h, "cpu", "hand-values", "reference plain", "T=1 hidden=2", r, TOL_HAND);

    // eps matters: x = [1, 1], eps = 1: y = 1 / sqrt(2)
    float x2[2] = {1, 1}, w2[2] = {1, 1}, y2[2];
    double e2[2] = {0.7071067811865475, 0.7071067811865475};
    MV_CHECK(rmsnorm_cpu(y2, x2, w2, 1, 2, 1.0f));
    r = compare_f64("eps", y2, e2, 2, TOL_HAND, 0);
    harness_check(h, "cpu", "hand-values", "reference eps=1", "T=1 hidden=2", r, TOL_HAND);

    // fused: x + residual = [-0.5, 0.25, 1, 2], mean of squares = 1.328125
    float x3[4] = {-1, 0.5f, 0.25f, 2}, res3[4] = {0.5f, -0.25f, 0.75f, 0}, w3[4] = {1, 1, 1, 1}, y3[4];
    double e3[4] = {-0.4338607523015305, 0.21693037615076524, 0.867721504603061, 1.735443009206122};
    double e3_res[4] = {-0.5, 0.25, 1, 2};
    MV_CHECK(fused_add_rmsnorm_cpu(y3, res3, x3, w3, 1, 4, 1e-6f));
    r = compare_f64("fused", y3, e3, 4, TOL_HAND, 0);
    harness_check(h, "cpu", "hand-values", "reference fused out", "T=1 hidden=4", r, TOL_HAND);
    r = compare_f64("fused residual", res3, e3_res, 4, TOL_HAND, 0);
    harness_check(h, "cpu", "hand-values", "reference fused residual", "T=1 hidden=4", r, TOL_HAND);
}

// rmsnorm of one row in float64, written independently of the reference.
static void row_f64(double *y, const double *x, const float *w, int n, double eps) {
    double ss = 0;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    double inv = 1.0 / sqrt(ss / n + eps);
    for (int i = 0; i < n; i++) y[i] = x[i] * inv * w[i];
}

static void check_against_f64(harness_t *h, rng_t *rng, int T, int hidden) {
    size_t n = (size_t)T * hidden;
    float *x = malloc(n * sizeof(float)), *res = malloc(n * sizeof(float)),
          *w = malloc((size_t)hidden * sizeof(float)), *y = malloc(n * sizeof(float));
    double *xd = malloc(n * sizeof(double)), *yd = malloc(n * sizeof(double)),
           *resd = malloc(n * sizeof(double));
    if (!x || !res || !w || !y || !xd || !yd || !resd) mv_die_at(__FILE__, __LINE__, "malloc", "out of host memory");
    fill_normal_f32(rng, x, n, 0.0f, 1.0f);
    fill_normal_f32(rng, res, n, 0.0f, 2.0f);
    fill_uniform_f32(rng, w, (size_t)hidden, 0.5f, 1.5f);
    char shape[64];
    snprintf(shape, sizeof shape, "T=%d hidden=%d", T, hidden);

    // plain
    for (size_t i = 0; i < n; i++) xd[i] = x[i];
    for (int t = 0; t < T; t++) row_f64(yd + (size_t)t * hidden, xd + (size_t)t * hidden, w, hidden, QWEN3_EPS);
    MV_CHECK(rmsnorm_cpu(y, x, w, T, hidden, QWEN3_EPS));
    compare_result_t r = compare_f64("plain", y, yd, n, TOL_F64, 0);
    harness_check(h, "cpu", "float64", "reference plain", shape, r, TOL_F64);

    // fused: residual' = x + residual, y = rmsnorm(residual')
    for (size_t i = 0; i < n; i++) resd[i] = (double)x[i] + res[i];
    for (int t = 0; t < T; t++) row_f64(yd + (size_t)t * hidden, resd + (size_t)t * hidden, w, hidden, QWEN3_EPS);
    MV_CHECK(fused_add_rmsnorm_cpu(y, res, x, w, T, hidden, QWEN3_EPS));
    r = compare_f64("fused", y, yd, n, TOL_F64, 0);
    harness_check(h, "cpu", "float64", "reference fused out", shape, r, TOL_F64);
    r = compare_f64("fused residual", res, resd, n, TOL_F64, 0);
    harness_check(h, "cpu", "float64", "reference fused residual", shape, r, TOL_F64);

    // per head, in place: the row split into heads of 128 (Qwen3's head_dim)
    // when it divides, else into 4 heads
    if (hidden % 4 == 0) {
        int D = hidden % 128 == 0 ? 128 : hidden / 4, H = hidden / D;
        for (int t = 0; t < T; t++)
            for (int hh = 0; hh < H; hh++)
                row_f64(yd + (size_t)t * hidden + (size_t)hh * D, xd + (size_t)t * hidden + (size_t)hh * D, w, D, QWEN3_EPS);
        memcpy(y, x, n * sizeof(float));
        MV_CHECK(rmsnorm_heads_cpu(y, hidden, y, hidden, w, T, H, D, QWEN3_EPS));
        r = compare_f64("heads", y, yd, n, TOL_F64, 0);
        harness_check(h, "cpu", "float64", "reference heads in place", shape, r, TOL_F64);
    }
    free(x); free(res); free(w); free(y); free(xd); free(yd); free(resd);
}

// ---- 2. and 3. the CUDA versions ------------------------------------------------------
#if MV_HAVE_CUDA
typedef enum { FORM_PLAIN, FORM_FUSED, FORM_HEADS } form_t;

static const char *form_name(form_t f) {
    return f == FORM_PLAIN ? "plain" : f == FORM_FUSED ? "fused-add" : "heads";
}

// A case. For FORM_HEADS the tensor is a QKV projection output
// [T, (H + 2*Hkv) * D]; the q heads (or, with on_k, the k heads) are
// normalised in place, and every other element must stay as it was.
// Hkv = 0 gives a contiguous [T, H, D] tensor instead.
typedef struct {
    form_t form;
    int T, hidden;       // plain / fused
    int H, Hkv, D, on_k; // heads
    int misalign;        // shift device pointers by one element
} case_t;

typedef struct {
    const case_t *c;
    int version;
    bf16_t *d_x, *d_res, *d_out, *d_w;  // buffers (d_res: fused only)
    bf16_t *d_x_saved, *d_res_saved;    // pristine inputs, restored before each timed run
    size_t n_x, n_res;
} run_ctx_t;

static long long row_len(const case_t *c) { return (long long)(c->H + 2 * c->Hkv) * c->D; }

static int run_version(void *p, cudaStream_t s) {
    run_ctx_t *r = p;
    const case_t *c = r->c;
    switch (c->form) {
    case FORM_PLAIN:
        return rmsnorm_cuda(r->version, r->d_out, r->d_x, r->d_w, c->T, c->hidden, QWEN3_EPS, s);
    case FORM_FUSED:
        return fused_add_rmsnorm_cuda(r->version, r->d_out, r->d_res, r->d_x, r->d_w, c->T, c->hidden, QWEN3_EPS, s);
    default: {
        bf16_t *heads = r->d_x + (c->on_k ? (long long)c->H * c->D : 0);
        int nh = c->on_k ? c->Hkv : c->H;
        return rmsnorm_heads_cuda(r->version, heads, row_len(c), heads, row_len(c), r->d_w, c->T, nh, c->D, QWEN3_EPS, s);
    }
    }
}

static void describe(const case_t *c, char *shape, size_t n) {
    if (c->form == FORM_HEADS)
        snprintf(shape, n, "T=%d %s %dx%d %s%s", c->T, c->on_k ? "k" : "q", c->on_k ? c->Hkv : c->H,
                 c->D, c->Hkv ? "in QKV" : "contiguous", c->misalign ? " +1" : "");
    else
        snprintf(shape, n, "T=%d hidden=%d%s", c->T, c->hidden, c->misalign ? " +1 elem" : "");
}

// Bytes one run must move (each input read once, each output written once;
// the weight vector is tiny and stays in cache).
static double bytes_moved(const case_t *c) {
    if (c->form == FORM_PLAIN) return (double)c->T * c->hidden * 2 * 2;
    if (c->form == FORM_FUSED) return (double)c->T * c->hidden * 2 * 4;
    return (double)c->T * (c->on_k ? c->Hkv : c->H) * c->D * 2 * 2;
}

static void check_and_time(harness_t *h, rng_t *rng, const char *case_name, case_t c, int do_time,
                           double target_pct) {
    int heads = c.form == FORM_HEADS;
    size_t n_x = heads ? (size_t)c.T * (size_t)row_len(&c) : (size_t)c.T * c.hidden;
    size_t n_w = heads ? (size_t)c.D : (size_t)c.hidden;
    size_t n_res = c.form == FORM_FUSED ? n_x : 0;

    // Host inputs: activations ~ N(0, 1) and a residual stream ~ N(0, 2)
    // (it grows through the layers); weights near 1 as trained norms are.
    bf16_t *h_x = malloc(n_x * 2), *h_res = malloc(n_res * 2 + 2), *h_w = malloc(n_w * 2);
    bf16_t *h_out = malloc(n_x * 2), *h_res_out = malloc(n_res * 2 + 2);
    float *xf = malloc(n_x * 4), *resf = malloc(n_res * 4 + 4), *wf = malloc(n_w * 4), *ref = malloc(n_x * 4);
    if (!h_x || !h_res || !h_w || !h_out || !h_res_out || !xf || !resf || !wf || !ref)
        mv_die_at(__FILE__, __LINE__, "malloc", "out of host memory");
    fill_normal_bf16(rng, h_x, n_x, 0.0f, 1.0f);
    fill_normal_bf16(rng, h_res, n_res, 0.0f, 2.0f);
    fill_uniform_bf16(rng, h_w, n_w, 0.5f, 1.5f);
    bf16_to_float_array(xf, h_x, n_x);
    bf16_to_float_array(resf, h_res, n_res);
    bf16_to_float_array(wf, h_w, n_w);

    // CPU reference. For heads the reference works on the whole QKV buffer:
    // untouched parts keep their input values, which the kernel must too.
    if (c.form == FORM_PLAIN) MV_CHECK(rmsnorm_cpu(ref, xf, wf, c.T, c.hidden, QWEN3_EPS));
    else if (c.form == FORM_FUSED) MV_CHECK(fused_add_rmsnorm_cpu(ref, resf, xf, wf, c.T, c.hidden, QWEN3_EPS));
    else {
        memcpy(ref, xf, n_x * 4);
        float *base = ref + (c.on_k ? (size_t)c.H * c.D : 0);
        MV_CHECK(rmsnorm_heads_cpu(base, row_len(&c), base, row_len(&c), wf, c.T, c.on_k ? c.Hkv : c.H, c.D, QWEN3_EPS));
    }

    run_ctx_t r = {&c, 0, NULL, NULL, NULL, NULL, NULL, NULL, n_x, n_res};
    bf16_t *x_base = gpu_alloc((n_x + 1) * 2), *out_base = gpu_alloc((n_x + 1) * 2);
    bf16_t *res_base = gpu_alloc((n_res + 1) * 2), *w_base = gpu_alloc((n_w + 1) * 2);
    r.d_x = x_base + c.misalign;
    r.d_out = heads ? r.d_x : out_base + c.misalign;
    r.d_res = res_base + c.misalign;
    r.d_w = w_base + c.misalign;
    r.d_x_saved = gpu_alloc(n_x * 2);
    r.d_res_saved = gpu_alloc(n_res * 2);
    gpu_upload(r.d_x_saved, h_x, n_x * 2);
    gpu_upload(r.d_res_saved, h_res, n_res * 2);
    gpu_upload(r.d_w, h_w, n_w * 2);

    char shape[80];
    describe(&c, shape, sizeof shape);
    char label[96];
    for (int v = 1; v <= RMSNORM_NUM_VERSIONS; v++) {
        if (!harness_kernel_wanted(h, v)) continue;  // --kernel N: version N alone
        r.version = v;
        CUDA_CHECK(cudaMemcpy(r.d_x, r.d_x_saved, n_x * 2, cudaMemcpyDeviceToDevice));
        if (n_res) CUDA_CHECK(cudaMemcpy(r.d_res, r.d_res_saved, n_res * 2, cudaMemcpyDeviceToDevice));
        if (!heads) gpu_poison(out_base, (n_x + 1) * 2);
        MV_CHECK(run_version(&r, 0));
        CUDA_CHECK(cudaDeviceSynchronize());
        gpu_download(h_out, r.d_out, n_x * 2);
        snprintf(label, sizeof label, "%s %s", form_name(c.form), rmsnorm_version_name(v));
        compare_result_t cr = compare_bf16(label, h_out, ref, n_x, c.form == FORM_FUSED ? TOL_GPU_FUSED : TOL_GPU, 0);
        harness_check(h, "gpu", case_name, label, shape, cr, c.form == FORM_FUSED ? TOL_GPU_FUSED : TOL_GPU);
        if (c.form == FORM_FUSED) {
            gpu_download(h_res_out, r.d_res, n_res * 2);
            snprintf(label, sizeof label, "fused-add residual %s", rmsnorm_version_name(v));
            cr = compare_bf16(label, h_res_out, resf, n_res, TOL_GPU_RESIDUAL, 0);
            harness_check(h, "gpu", case_name, label, shape, cr, TOL_GPU_RESIDUAL);
        }
        if (do_time) {
            // The fused and in-place forms change their inputs on every run.
            // A run on the previous run's result moves the same bytes, so the
            // timed runs simply chain: re-normalising a normalised head stays
            // O(1), and the residual grows by one x per run, far from overflow.
            timing_opts_t opts = {5, h->quick ? 10 : 50, 1};
            double ms = gpu_time_ms(run_version, &r, opts);
            snprintf(label, sizeof label, "%s %s", form_name(c.form), rmsnorm_version_name(v));
            harness_timing(h, case_name, label, shape, ms, bytes_moved(&c), 0,
                           v == RMSNORM_FAST ? target_pct : 0);
        }
    }
    if (do_time && heads && c.Hkv) {
        // The ceiling for this access pattern: cudaMemcpy2D of exactly the
        // strided region the kernel reads and writes (q or k part of each
        // QKV row), so the strided layout's own cost is seen apart from
        // the kernel's.
        gpu_copy2d_t cp = {out_base, r.d_x + (c.on_k ? c.H * c.D : 0), (size_t)row_len(&c) * 2,
                           (size_t)(c.on_k ? c.Hkv : c.H) * c.D * 2, (size_t)c.T};
        timing_opts_t opts = {5, h->quick ? 10 : 50, 1};
        double ms = gpu_time_ms(gpu_copy2d, &cp, opts);
        harness_timing(h, case_name, "cudaMemcpy2D same region", shape, ms, bytes_moved(&c), 0, 0);
    }
    gpu_free(x_base); gpu_free(out_base); gpu_free(res_base); gpu_free(w_base);
    gpu_free(r.d_x_saved); gpu_free(r.d_res_saved);
    free(h_x); free(h_res); free(h_w); free(h_out); free(h_res_out);
    free(xf); free(resf); free(wf); free(ref);
}
#endif

int main(int argc, char **argv) {
    harness_t h;
    static const harness_kernel_t kernels[] = {{"rmsnorm", RMSNORM_VERSION_TABLE}, {NULL, NULL}};
    harness_begin_kernels(&h, "02-rmsnorm",
                          "RMSNorm: plain, fused with the residual add, and per head (q_norm/k_norm); bf16, fp32 math",
                          argc, argv, kernels);
    rng_t rng;
    rng_seed(&rng, h.seed);

    harness_section(&h, "CPU reference against hand-computed values and a float64 formula");
    check_hand_values(&h);
    check_against_f64(&h, &rng, 1, 1);
    check_against_f64(&h, &rng, 3, 7);
    check_against_f64(&h, &rng, 17, 1024);
    check_against_f64(&h, &rng, 4, 5120);

#if MV_HAVE_CUDA
    if (h.use_gpu) {
        harness_section(&h, "CUDA versions against the CPU reference (odd, tail, long and misaligned shapes)");
        // {form, T, hidden, H, Hkv, D, on_k, misalign}
        static const case_t cases[] = {
            {FORM_PLAIN, 1, 1, 0, 0, 0, 0, 0},     {FORM_PLAIN, 1, 7, 0, 0, 0, 0, 0},
            {FORM_PLAIN, 3, 64, 0, 0, 0, 0, 0},    {FORM_PLAIN, 5, 1000, 0, 0, 0, 0, 0},
            {FORM_PLAIN, 17, 1027, 0, 0, 0, 0, 0}, {FORM_PLAIN, 33, 4096, 0, 0, 0, 0, 0},
            {FORM_PLAIN, 9, 1024, 0, 0, 0, 0, 1},  {FORM_PLAIN, 3, 40000, 0, 0, 0, 0, 0},
            {FORM_FUSED, 1, 1, 0, 0, 0, 0, 0},     {FORM_FUSED, 2, 7, 0, 0, 0, 0, 0},
            {FORM_FUSED, 5, 1000, 0, 0, 0, 0, 0},  {FORM_FUSED, 17, 1027, 0, 0, 0, 0, 0},
            {FORM_FUSED, 9, 1024, 0, 0, 0, 0, 1},  {FORM_FUSED, 3, 40000, 0, 0, 0, 0, 0},
            {FORM_HEADS, 1, 0, 1, 1, 64, 0, 0},    {FORM_HEADS, 3, 0, 16, 8, 128, 0, 0},
            {FORM_HEADS, 3, 0, 16, 8, 128, 1, 0},  {FORM_HEADS, 5, 0, 4, 2, 96, 0, 0},
            {FORM_HEADS, 4, 0, 3, 1, 100, 1, 0},   {FORM_HEADS, 7, 0, 2, 1, 127, 0, 0},
            {FORM_HEADS, 2, 0, 8, 2, 1024, 0, 0},  {FORM_HEADS, 6, 0, 4, 4, 256, 1, 1},
            {FORM_HEADS, 300, 0, 16, 8, 128, 0, 0}, {FORM_HEADS, 701, 0, 16, 0, 128, 0, 0},
            {FORM_HEADS, 2001, 0, 3, 0, 64, 0, 0},  {FORM_HEADS, 1003, 0, 16, 8, 128, 1, 1},
            // Past 32 x SMs rows, v3 gives each thread 4 vectors: odd, misaligned and long rows there too.
            {FORM_PLAIN, 4300, 1027, 0, 0, 0, 0, 0}, {FORM_PLAIN, 4300, 1024, 0, 0, 0, 0, 1},
            {FORM_FUSED, 4300, 1000, 0, 0, 0, 0, 0}, {FORM_FUSED, 4300, 1024, 0, 0, 0, 0, 1},
            {FORM_PLAIN, 4300, 5120, 0, 0, 0, 0, 0}, {FORM_FUSED, 4300, 6144, 0, 0, 0, 0, 0},
        };
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
            check_and_time(&h, &rng, "random", cases[i], 0, 0);

        harness_section(&h, "Qwen3-0.6B shapes and large shapes: check, then time");
        int qwen_T[] = {1, 256, 8192};
        for (int i = 0; i < 3; i++) {
            check_and_time(&h, &rng, "qwen3-0.6b", (case_t){FORM_PLAIN, qwen_T[i], 1024, 0, 0, 0, 0, 0}, h.do_timing, 0);
            check_and_time(&h, &rng, "qwen3-0.6b", (case_t){FORM_FUSED, qwen_T[i], 1024, 0, 0, 0, 0, 0}, h.do_timing, 0);
            check_and_time(&h, &rng, "qwen3-0.6b", (case_t){FORM_HEADS, qwen_T[i], 0, 16, 8, 128, 0, 0}, h.do_timing, 0);
            check_and_time(&h, &rng, "qwen3-0.6b", (case_t){FORM_HEADS, qwen_T[i], 0, 16, 8, 128, 1, 0}, h.do_timing, 0);
        }
        // Large: 131072 x 1024 plain moves 537 MB, fused 1.07 GB, q heads
        // 537 MB; past 256 MiB the fast versions must reach 85% of copy.
        // Heads are timed twice: on a contiguous [T, 16, 128] tensor (the
        // kernel alone) and in place inside QKV rows (the engine's layout,
        // where only half of each 8 KB row is touched), beside a
        // cudaMemcpy2D of that same region.
        int big_T = h.quick ? 32768 : 131072;
        if (h.do_timing) {
            check_and_time(&h, &rng, "large", (case_t){FORM_PLAIN, big_T, 1024, 0, 0, 0, 0, 0}, 1, 85.0);
            check_and_time(&h, &rng, "large", (case_t){FORM_PLAIN, big_T / 4, 4096, 0, 0, 0, 0, 0}, 1, 85.0);
            check_and_time(&h, &rng, "large", (case_t){FORM_FUSED, big_T, 1024, 0, 0, 0, 0, 0}, 1, 85.0);
            check_and_time(&h, &rng, "large", (case_t){FORM_HEADS, big_T / 2, 0, 16, 0, 128, 0, 0}, 1, 85.0);
            check_and_time(&h, &rng, "large", (case_t){FORM_HEADS, big_T / 2, 0, 16, 8, 128, 0, 0}, 1, 0);
        }
    }
#endif
    return harness_end(&h);
}

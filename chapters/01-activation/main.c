/*
 * chapters/01-activation/main.c - Chapter 01: SiluAndMul, Qwen3's MLP activation.
 *
 * What it checks:
 *   1. The CPU reference (reference/activation.c) against hand-computed values
 *      and an independent float64 formula. This half always runs.
 *   2. Every CUDA version (kernels/activation.cu) against the CPU reference on
 *      seeded random inputs: odd, tail and misaligned shapes, and Qwen3-0.6B's
 *      shapes. Outputs are poisoned before each run.
 *   3. Timing of every version: Qwen3-0.6B shapes (T = 1, 256, 8192 tokens,
 *      I = 3072) and one large shape (over 256 MiB of traffic), as GB/s and
 *      as % of the measured copy bandwidth.
 *
 * Build and run:  make && ./build/01-activation [--json FILE] [--help]
 * Exit status: 0 if every check passed, 1 if any failed, 2 on bad arguments.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "common/bf16.h"
#include "common/check.h"
#include "common/compare.h"
#include "common/harness.h"
#include "common/rng.h"
#include "kernels/versions.h"
#include "reference/activation.h"
#if MV_HAVE_CUDA
#include "kernels/activation.h"
#endif

// ---- tolerances: each with its reason ------------------------------------------
static const tolerance_t TOL_HAND = {
    1e-12, 1e-6, 1e-12,
    "hand-computed values vs fp32 reference: expf, one add, one divide, one multiply, "
    "each within an ulp or two of 2^-24 relative; 1e-6 covers them"};
static const tolerance_t TOL_F64 = {
    1e-12, 1e-6, 1e-12,
    "fp32 reference vs float64 formula on the same inputs: a handful of fp32 roundings "
    "(2^-24 relative each) and no cancellation (1 + exp(-g) > 1)"};
#if MV_HAVE_CUDA  // only the GPU half uses it (a CPU-only build warns otherwise)
static const tolerance_t TOL_GPU = {
    1e-7, BF16_HALF_ULP + 1e-6, BF16_HALF_ULP * BF16_HALF_ULP,
    "kernel output is stored as bf16: rounding to nearest costs at most half an ulp, "
    "2^-8 = 3.9e-3 relative; __expf adds < 1e-6; so NMSE <= (2^-8)^2 = 1.5e-5"};
#endif

// ---- 1. the CPU reference on its own ----------------------------------------------

// silu(g) * u for a few inputs whose value is known in closed form.
static void check_hand_values(harness_t *h) {
    static const struct {
        float gate, up;
        double expected;  // silu(gate) * up, with silu(g) = g / (1 + e^-g)
    } cases[] = {
        {0.0f, 3.0f, 0.0},                      // silu(0) = 0
        {1.0f, 1.0f, 0.7310585786300049},       // e / (e + 1)
        {-1.0f, 2.0f, -0.5378828427399902},     // 2 * (-1 / (1 + e))
        {2.0f, -0.5f, -0.8807970779778823},     // -0.5 * 2e^2 / (e^2 + 1)
        {20.0f, 1.0f, 19.999999958776925},      // ~ g for large g
        {-20.0f, 1.0f, -4.122307236380407e-08}, // ~ g * e^g for very negative g
        {0.5f, -4.0f, -1.2449186624037092},
    };
    int n = (int)(sizeof cases / sizeof cases[0]);
    // One token per case: in[t] = [gate | up] with I = 1.
    float in[2 * 7], out[7];
    double expected[7];
    for (int i = 0; i < n; i++) {
        in[2 * i] = cases[i].gate;
        in[2 * i + 1] = cases[i].up;
        expected[i] = cases[i].expected;
    }
    MV_CHECK(silu_and_mul_cpu(out, in, n, 1));
    compare_result_t r = compare_f64("hand", out, expected, (size_t)n, TOL_HAND, 0);
    harness_check(h, "cpu", "hand-values", "reference", "T=7 I=1", r, TOL_HAND);
}

static void check_against_f64(harness_t *h, rng_t *rng, int T, int I) {
    size_t n_in = (size_t)T * 2 * I, n_out = (size_t)T * I;
    float *in = malloc(n_in * sizeof(float)), *out = malloc(n_out * sizeof(float));
    double *expected = malloc(n_out * sizeof(double));
    if (!in || !out || !expected) mv_die_at(__FILE__, __LINE__, "malloc", "out of host memory");
    fill_uniform_f32(rng, in, n_in, -8.0f, 8.0f);
    poison_host(out, n_out * sizeof(float));
    MV_CHECK(silu_and_mul_cpu(out, in, T, I));
    for (int t = 0; t < T; t++)
        for (int j = 0; j < I; j++) {
            double g = in[(size_t)t * 2 * I + j], u = in[(size_t)t * 2 * I + I + j];
            expected[(size_t)t * I + j] = g / (1.0 + exp(-g)) * u;
        }
    char shape[64];
    snprintf(shape, sizeof shape, "T=%d I=%d", T, I);
    compare_result_t r = compare_f64("reference", out, expected, n_out, TOL_F64, 0);
    harness_check(h, "cpu", "float64", "reference", shape, r, TOL_F64);
    free(in);
    free(out);
    free(expected);
}

// ---- 2. and 3. the CUDA versions ------------------------------------------------------
#if MV_HAVE_CUDA
typedef struct {
    int version, T, I;
    bf16_t *d_out;
    const bf16_t *d_in;
} run_ctx_t;

static int run_version(void *p, cudaStream_t s) {
    run_ctx_t *c = p;
    return silu_and_mul_cuda(c->version, c->d_out, c->d_in, c->T, c->I, s);
}

// One shape: random bf16 inputs, the CPU reference, then every version.
// misalign = 1 shifts both device pointers by one element, so the fast
// kernel must take its narrow-vector path. Returns nothing; records checks.
static void check_and_time(harness_t *h, rng_t *rng, const char *case_name, int T, int I,
                           int misalign, int do_time, double target_pct) {
    size_t n_in = (size_t)T * 2 * I, n_out = (size_t)T * I;
    bf16_t *h_in = malloc(n_in * sizeof(bf16_t) + 2), *h_out = malloc(n_out * sizeof(bf16_t) + 2);
    float *in_f = malloc(n_in * sizeof(float)), *ref = malloc(n_out * sizeof(float) + 4);
    if (!h_in || !h_out || !in_f || !ref) mv_die_at(__FILE__, __LINE__, "malloc", "out of host memory");
    // gate spans silu's curved region and both tails; up is a typical activation.
    for (int t = 0; t < T; t++) {
        fill_uniform_bf16(rng, h_in + (size_t)t * 2 * I, (size_t)I, -8.0f, 8.0f);
        fill_normal_bf16(rng, h_in + (size_t)t * 2 * I + I, (size_t)I, 0.0f, 1.0f);
    }
    bf16_to_float_array(in_f, h_in, n_in);
    MV_CHECK(silu_and_mul_cpu(ref, in_f, T, I));

    bf16_t *d_in_base = gpu_alloc((n_in + 1) * sizeof(bf16_t));
    bf16_t *d_out_base = gpu_alloc((n_out + 1) * sizeof(bf16_t));
    bf16_t *d_in = d_in_base + misalign, *d_out = d_out_base + misalign;
    gpu_upload(d_in, h_in, n_in * sizeof(bf16_t));

    char shape[64];
    snprintf(shape, sizeof shape, "T=%d I=%d%s", T, I, misalign ? " +1 elem" : "");
    for (int v = 1; v <= SILU_AND_MUL_NUM_VERSIONS; v++) {
        if (!harness_kernel_wanted(h, v)) continue;  // --kernel N: version N alone
        run_ctx_t ctx = {v, T, I, d_out, d_in};
        gpu_poison(d_out_base, (n_out + 1) * sizeof(bf16_t));
        MV_CHECK(run_version(&ctx, 0));
        CUDA_CHECK(cudaDeviceSynchronize());
        gpu_download(h_out, d_out, n_out * sizeof(bf16_t));
        compare_result_t r = compare_bf16(silu_and_mul_version_name(v), h_out, ref, n_out, TOL_GPU, 0);
        harness_check(h, "gpu", case_name, silu_and_mul_version_name(v), shape, r, TOL_GPU);
        if (do_time) {
            timing_opts_t opts = {5, h->quick ? 10 : 50, 1};
            double ms = gpu_time_ms(run_version, &ctx, opts);
            // Bytes that must move: read gate and up (2*I), write out (I), bf16.
            double bytes = (double)T * 3 * I * sizeof(bf16_t);
            harness_timing(h, case_name, silu_and_mul_version_name(v), shape, ms, bytes, 0,
                           v == SILU_AND_MUL_FAST ? target_pct : 0);
        }
    }
    gpu_free(d_in_base);
    gpu_free(d_out_base);
    free(h_in);
    free(h_out);
    free(in_f);
    free(ref);
}
#endif

int main(int argc, char **argv) {
    harness_t h;
    static const harness_kernel_t kernels[] = {{"silu_and_mul", SILU_AND_MUL_VERSION_TABLE}, {NULL, NULL}};
    harness_begin_kernels(&h, "01-activation", "SiluAndMul: out[T, I] = silu(gate) * up, bf16 in/out, fp32 math",
                          argc, argv, kernels);
    rng_t rng;
    rng_seed(&rng, h.seed);

    harness_section(&h, "CPU reference against hand-computed values and a float64 formula");
    check_hand_values(&h);
    check_against_f64(&h, &rng, 1, 1);
    check_against_f64(&h, &rng, 3, 7);
    check_against_f64(&h, &rng, 17, 129);
    check_against_f64(&h, &rng, 64, 3072);

#if MV_HAVE_CUDA
    if (h.use_gpu) {
        harness_section(&h, "CUDA versions against the CPU reference (odd, tail and misaligned shapes)");
        static const struct { int T, I, misalign; } shapes[] = {
            {1, 1, 0}, {1, 7, 0}, {2, 8, 0}, {3, 1000, 0}, {5, 3072, 0}, {17, 129, 0},
            {33, 4099, 0}, {64, 3072, 1}, {7, 1022, 1}, {256, 1536, 0},
        };
        for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
            check_and_time(&h, &rng, "random", shapes[i].T, shapes[i].I, shapes[i].misalign, 0, 0);

        harness_section(&h, "Qwen3-0.6B shapes (I = 3072) and a large shape: check, then time");
        int qwen_T[] = {1, 256, 8192};
        for (int i = 0; i < 3; i++) check_and_time(&h, &rng, "qwen3-0.6b", qwen_T[i], 3072, 0, h.do_timing, 0);
        // 32768 x 3 x 3072 x 2 bytes = 604 MB of traffic, far past the L2:
        // here the fast version must reach 85% of the copy bandwidth.
        if (h.do_timing) check_and_time(&h, &rng, "large", h.quick ? 16384 : 32768, 3072, 0, 1, 85.0);
    }
#endif
    return harness_end(&h);
}

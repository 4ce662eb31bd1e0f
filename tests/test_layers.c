/*
 * tests/test_layers.c - Criterion tests of the CPU reference layers of
 * chapters 01 and 02 (SiluAndMul, RMSNorm in its three forms): values
 * computed by hand, float64 formulas, and the shape validation that the CUDA
 * launchers share.
 *
 * Run: make test  (or build/tests/test_layers after make)
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/check.h"
#include "common/rng.h"
#include "reference/activation.h"
#include "reference/rmsnorm.h"

#define EXPECT_NEAR(got, want, tol) \
    cr_expect(fabs((double)(got) - (double)(want)) <= (tol), "got %.9g, want %.9g", (double)(got), (double)(want))

Test(silu_and_mul, hand_values) {
    // in = [gate | up] per token; silu(g) = g / (1 + e^-g)
    float in[6] = {0, 3, 1, 1, -1, 2}, out[3];
    cr_assert_eq(silu_and_mul_cpu(out, in, 3, 1), 0);
    EXPECT_NEAR(out[0], 0.0, 0);                       // silu(0) = 0
    EXPECT_NEAR(out[1], 0.7310585786300049, 1e-7);     // e / (e + 1)
    EXPECT_NEAR(out[2], -0.5378828427399902, 1e-7);    // 2 * (-1 / (1 + e))
}

Test(silu_and_mul, gate_then_up_layout) {
    // Two tokens, I = 2: token t reads gate from in[t][0:2] and up from in[t][2:4].
    float in[8] = {10, 10, 2, 3, 10, 10, -1, 0.5f}, out[4];
    cr_assert_eq(silu_and_mul_cpu(out, in, 2, 2), 0);
    double s10 = 10.0 / (1.0 + exp(-10.0));
    EXPECT_NEAR(out[0], 2 * s10, 1e-5);
    EXPECT_NEAR(out[1], 3 * s10, 1e-5);
    EXPECT_NEAR(out[2], -s10, 1e-5);
    EXPECT_NEAR(out[3], 0.5 * s10, 1e-5);
}

Test(silu_and_mul, matches_float64) {
    rng_t r;
    rng_seed(&r, 5);
    int T = 9, I = 37;
    float *in = malloc(sizeof(float) * T * 2 * I), *out = malloc(sizeof(float) * T * I);
    fill_uniform_f32(&r, in, (size_t)T * 2 * I, -8, 8);
    cr_assert_eq(silu_and_mul_cpu(out, in, T, I), 0);
    for (int t = 0; t < T; t++)
        for (int j = 0; j < I; j++) {
            double g = in[t * 2 * I + j], u = in[t * 2 * I + I + j], want = g / (1 + exp(-g)) * u;
            cr_expect(fabs(out[t * I + j] - want) <= 1e-6 * fabs(want) + 1e-12);
        }
    free(in);
    free(out);
}

Test(silu_and_mul, rejects_bad_shapes) {
    cr_expect_eq(silu_and_mul_validate(-1, 8), -1);
    cr_expect(strstr(mv_last_error(), "T (tokens)") != NULL);
    cr_expect_eq(silu_and_mul_validate(4, 0), -1);
    cr_expect(strstr(mv_last_error(), "intermediate") != NULL);
    cr_expect_eq(silu_and_mul_validate(0, 3072), 0);  // an empty batch is valid
}

Test(rmsnorm, hand_values) {
    // x = [3, 4]: mean(x^2) = 12.5; w = [2, 0.5]
    float x[2] = {3, 4}, w[2] = {2, 0.5f}, y[2];
    cr_assert_eq(rmsnorm_cpu(y, x, w, 1, 2, 1e-6f), 0);
    EXPECT_NEAR(y[0], 1.6970562069654673, 1e-6);
    EXPECT_NEAR(y[1], 0.5656854023218224, 1e-6);
    // eps counts: x = [1, 1], eps = 1 -> 1/sqrt(2)
    float x2[2] = {1, 1}, w2[2] = {1, 1};
    cr_assert_eq(rmsnorm_cpu(y, x2, w2, 1, 2, 1.0f), 0);
    EXPECT_NEAR(y[0], 0.7071067811865475, 1e-7);
}

Test(rmsnorm, fused_add_writes_the_residual_back) {
    float x[4] = {-1, 0.5f, 0.25f, 2}, res[4] = {0.5f, -0.25f, 0.75f, 0}, w[4] = {1, 1, 1, 1}, y[4];
    cr_assert_eq(fused_add_rmsnorm_cpu(y, res, x, w, 1, 4, 1e-6f), 0);
    float want_res[4] = {-0.5f, 0.25f, 1, 2};
    for (int i = 0; i < 4; i++) cr_expect_eq(res[i], want_res[i]);
    EXPECT_NEAR(y[0], -0.4338607523015305, 1e-6);
    EXPECT_NEAR(y[3], 1.735443009206122, 1e-6);
}

Test(rmsnorm, heads_in_place_in_a_strided_row) {
    // One token row [q0 q1 | k0 | v0], head_dim 2: normalise the two q heads in
    // place; k and v stay as they are.
    float row[8] = {3, 4, 1, 1, 7, 7, 9, 9}, w[2] = {1, 1};
    cr_assert_eq(rmsnorm_heads_cpu(row, 8, row, 8, w, 1, 2, 2, 1e-6f), 0);
    EXPECT_NEAR(row[0], 3 / sqrt(12.5 + 1e-6), 1e-6);
    EXPECT_NEAR(row[1], 4 / sqrt(12.5 + 1e-6), 1e-6);
    EXPECT_NEAR(row[2], 1 / sqrt(1 + 1e-6), 1e-6);
    for (int i = 4; i < 8; i++) cr_expect_eq(row[i], i < 6 ? 7 : 9);
}

Test(rmsnorm, matches_float64) {
    rng_t r;
    rng_seed(&r, 9);
    int T = 5, H = 300;
    float *x = malloc(sizeof(float) * T * H), *w = malloc(sizeof(float) * H), *y = malloc(sizeof(float) * T * H);
    fill_normal_f32(&r, x, (size_t)T * H, 0, 3);
    fill_uniform_f32(&r, w, (size_t)H, 0.5f, 1.5f);
    cr_assert_eq(rmsnorm_cpu(y, x, w, T, H, 1e-6f), 0);
    for (int t = 0; t < T; t++) {
        double ss = 0;
        for (int i = 0; i < H; i++) ss += (double)x[t * H + i] * x[t * H + i];
        double inv = 1 / sqrt(ss / H + 1e-6);
        for (int i = 0; i < H; i++) {
            double want = x[t * H + i] * inv * w[i];
            cr_expect(fabs(y[t * H + i] - want) <= 1e-6 * fabs(want) + 1e-12);
        }
    }
    free(x); free(w); free(y);
}

Test(rmsnorm, rejects_bad_shapes_and_eps) {
    cr_expect_eq(rmsnorm_validate(1, 0, 1e-6f), -1);
    cr_expect(strstr(mv_last_error(), "hidden size") != NULL);
    cr_expect_eq(rmsnorm_validate(1, 1024, 0.0f), -1);
    cr_expect(strstr(mv_last_error(), "eps") != NULL);
    cr_expect_eq(rmsnorm_validate(1, 1024, NAN), -1);
    cr_expect_eq(rmsnorm_heads_validate(1, 16, 128, 1024, 2048, 1e-6f), -1);  // 16 heads do not fit a 1024 row
    cr_expect(strstr(mv_last_error(), "stride") != NULL);
    cr_expect_eq(rmsnorm_heads_validate(1, 16, 2000, 32000, 32000, 1e-6f), -1);
    cr_expect(strstr(mv_last_error(), "head_dim") != NULL);
    cr_expect_eq(rmsnorm_heads_validate(3, 16, 128, 4096, 4096, 1e-6f), 0);
}

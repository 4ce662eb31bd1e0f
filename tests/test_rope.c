/*
 * tests/test_rope.c - Criterion tests of chapter 05's CPU rules: the
 * rotation at hand values, inv_freq (default and llama3 bands), the cos/sin
 * cache, position and shape validation, the relative-position property, and
 * the fused q/k norm + RoPE as norm-then-rotate.
 *
 * Run: make test  (or build/tests/test_rope after make)
 */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "common/check.h"
#include "reference/rmsnorm.h"
#include "reference/rope.h"

static rope_config_t qwen3(int max_position) {
    rope_config_t c = {128, max_position, 1000000.0, ROPE_SCALING_NONE, 0, 0, 0, 0};
    return c;
}

static rope_config_t llama3(void) {
    rope_config_t c = {128, 8192, 500000.0, ROPE_SCALING_LLAMA3, 8.0, 1.0, 4.0, 8192};
    return c;
}

Test(rope, position_zero_is_the_identity) {
    rope_config_t cfg = qwen3(4);
    rope_cache_t cache;
    cr_assert_eq(rope_cache_build(&cache, &cfg), 0, "%s", mv_last_error());
    float q[128], k[128], q0[128], k0[128];
    for (int i = 0; i < 128; i++) q[i] = q0[i] = sinf((float)i) * 3, k[i] = k0[i] = cosf((float)i * 0.7f);
    int32_t pos = 0;
    cr_assert_eq(rope_cpu(q, 128, k, 128, &pos, &cache, 1, 1, 1, 128), 0);
    cr_expect_eq(memcmp(q, q0, sizeof q), 0);
    cr_expect_eq(memcmp(k, k0, sizeof k), 0);
    rope_cache_free(&cache);
}

Test(rope, head_dim_two_turns_by_the_position_in_radians) {
    rope_config_t cfg = {2, 8, 10000.0, ROPE_SCALING_NONE, 0, 0, 0, 0};
    rope_cache_t cache;
    cr_assert_eq(rope_cache_build(&cache, &cfg), 0);
    float q[2] = {1, 0}, k[2] = {0.5f, 2};
    int32_t pos = 5;
    cr_assert_eq(rope_cpu(q, 2, k, 2, &pos, &cache, 1, 1, 1, 2), 0);
    cr_expect_float_eq(q[0], (float)cos(5.0), 1e-6);
    cr_expect_float_eq(q[1], (float)sin(5.0), 1e-6);
    cr_expect_float_eq(k[0], (float)(0.5 * cos(5.0) - 2 * sin(5.0)), 1e-6);
    cr_expect_float_eq(k[1], (float)(2 * cos(5.0) + 0.5 * sin(5.0)), 1e-6);
    rope_cache_free(&cache);
}

Test(rope, pairs_are_i_and_i_plus_half) {
    // D = 4: pairs (0, 2) and (1, 3). A vector with only element 0 set turns
    // into elements 0 and 2, never 1.
    rope_config_t cfg = {4, 8, 10000.0, ROPE_SCALING_NONE, 0, 0, 0, 0};
    rope_cache_t cache;
    cr_assert_eq(rope_cache_build(&cache, &cfg), 0);
    float q[4] = {1, 0, 0, 0}, k[4] = {0, 0, 0, 1};
    int32_t pos = 1;
    cr_assert_eq(rope_cpu(q, 4, k, 4, &pos, &cache, 1, 1, 1, 4), 0);
    cr_expect_float_eq(q[0], (float)cos(1.0), 1e-6);
    cr_expect_float_eq(q[2], (float)sin(1.0), 1e-6);
    cr_expect_eq(q[1], 0.0f);
    cr_expect_eq(q[3], 0.0f);
    // k = e3 (second element of pair (1, 3)), inv_freq[1] = 10000^(-1/2) = 0.01
    cr_expect_float_eq(k[1], (float)-sin(0.01), 1e-6);
    cr_expect_float_eq(k[3], (float)cos(0.01), 1e-6);
    rope_cache_free(&cache);
}

Test(rope, default_inv_freq) {
    rope_config_t cfg = qwen3(16);
    float inv[64];
    cr_assert_eq(rope_inv_freq(inv, &cfg), 0);
    cr_expect_float_eq(inv[0], 1.0f, 0);
    cr_expect_float_eq(inv[32], 0.001f, 1e-9);
    for (int i = 0; i < 64; i++) cr_expect_float_eq(inv[i], (float)pow(1e6, -i / 64.0), 4e-7 * pow(1e6, -i / 64.0));
}

Test(rope, llama3_bands) {
    rope_config_t cfg = llama3();
    float inv[64];
    cr_assert_eq(rope_inv_freq(inv, &cfg), 0);
    for (int i = 0; i < 64; i++) {
        double base = pow(500000.0, -i / 64.0), wavelen = 2 * M_PI / base;
        if (wavelen < 2048) cr_expect_float_eq(inv[i], (float)base, 4e-7 * base, "i=%d kept", i);
        else if (wavelen > 8192) cr_expect_float_eq(inv[i], (float)(base / 8), 4e-7 * base / 8, "i=%d / 8", i);
        else {
            double smooth = (8192 / wavelen - 1) / 3, want = (1 - smooth) * base / 8 + smooth * base;
            cr_expect_float_eq(inv[i], (float)want, 1e-6 * want, "i=%d blended", i);
        }
    }
    cr_expect_float_eq(inv[29], 0.002166570763503359f, 1e-9);  // hand-computed, mid band
    cr_expect_float_eq(inv[35], 9.556212353964683e-05f, 1e-11);  // just past 8192: / 8
}

Test(rope, cache_rows_are_cos_then_sin_of_the_fp32_angle) {
    rope_config_t cfg = qwen3(64);
    rope_cache_t cache;
    cr_assert_eq(rope_cache_build(&cache, &cfg), 0);
    float inv[64];
    cr_assert_eq(rope_inv_freq(inv, &cfg), 0);
    for (int p = 0; p < 64; p += 7)
        for (int i = 0; i < 64; i += 5) {
            float angle = (float)p * inv[i];
            cr_expect_float_eq(cache.cos_sin[p * 128 + i], (float)cos(angle), 6e-8);
            cr_expect_float_eq(cache.cos_sin[p * 128 + 64 + i], (float)sin(angle), 6e-8);
        }
    rope_cache_free(&cache);
}

Test(rope, positions_are_validated) {
    int32_t ok[3] = {0, 40959, 7}, neg[2] = {3, -1}, big[3] = {0, 1, 40960};
    cr_expect_eq(rope_validate_positions(ok, 3, 40960), 0);
    cr_expect_eq(rope_validate_positions(neg, 2, 40960), -1);
    cr_expect(strstr(mv_last_error(), "token 1 has position -1") != NULL, "%s", mv_last_error());
    cr_expect_eq(rope_validate_positions(big, 3, 40960), -1);
    cr_expect(strstr(mv_last_error(), "token 2 has position 40960") != NULL, "%s", mv_last_error());
    // rope_cpu itself refuses, and leaves q and k as they were.
    rope_config_t cfg = qwen3(16);
    rope_cache_t cache;
    cr_assert_eq(rope_cache_build(&cache, &cfg), 0);
    float q[128] = {1}, k[128] = {2};
    int32_t p = 16;
    cr_expect_eq(rope_cpu(q, 128, k, 128, &p, &cache, 1, 1, 1, 128), -1);
    cr_expect_eq(q[0], 1.0f);
    cr_expect_eq(k[0], 2.0f);
    rope_cache_free(&cache);
}

Test(rope, shapes_are_validated) {
    cr_expect_eq(rope_validate(1, 2, 1, 128, 256, 128, 128, 16), 0);
    cr_expect_eq(rope_validate(1, 2, 1, 127, 254, 127, 127, 16), -1);   // odd head_dim
    cr_expect_eq(rope_validate(1, 2, 1, 128, 255, 128, 128, 16), -1);   // q stride too small
    cr_expect_eq(rope_validate(1, 2, 1, 64, 128, 64, 128, 16), -1);     // cache of another head_dim
    cr_expect_eq(rope_validate(1, 0, 1, 128, 256, 128, 128, 16), -1);   // no q heads
    rope_config_t bad = llama3();
    bad.factor = 0.5;
    rope_cache_t cache;
    cr_expect_eq(rope_cache_build(&cache, &bad), -1);
    rope_config_t odd = qwen3(16);
    odd.head_dim = 7;
    cr_expect_eq(rope_cache_build(&cache, &odd), -1);
}

// <rope(q, m), rope(k, n)> depends on m - n only.
Test(rope, scores_depend_on_relative_position) {
    rope_config_t cfg = qwen3(4096);
    rope_cache_t cache;
    cr_assert_eq(rope_cache_build(&cache, &cfg), 0);
    float q0[128], k0[128];
    double norm = 0;
    for (int i = 0; i < 128; i++) {
        q0[i] = sinf(i * 1.3f), k0[i] = cosf(i * 0.4f);
        norm += fabs((double)q0[i] * k0[i]);
    }
    double score[2];
    const int m[2] = {10, 2010}, n[2] = {3, 2003};  // same m - n = 7
    for (int j = 0; j < 2; j++) {
        float q[128], k[128], scratch[128];
        memcpy(q, q0, sizeof q);
        memcpy(scratch, k0, sizeof scratch);
        int32_t pm = m[j], pn = n[j];
        cr_assert_eq(rope_cpu(q, 128, scratch, 128, &pm, &cache, 1, 1, 1, 128), 0);
        memcpy(k, k0, sizeof k);
        memcpy(scratch, q0, sizeof scratch);
        cr_assert_eq(rope_cpu(scratch, 128, k, 128, &pn, &cache, 1, 1, 1, 128), 0);
        score[j] = 0;
        for (int i = 0; i < 128; i++) score[j] += (double)q[i] * k[i];
    }
    cr_expect(fabs(score[0] - score[1]) < 1e-3 * norm, "%g vs %g", score[0], score[1]);
    rope_cache_free(&cache);
}

Test(rope, fused_is_norm_then_rotate_and_leaves_v) {
    enum { T = 3, H = 2, HKV = 1, D = 64, ROW = (H + 2 * HKV) * D };
    rope_config_t cfg = {D, 100, 10000.0, ROPE_SCALING_NONE, 0, 0, 0, 0};
    rope_cache_t cache;
    cr_assert_eq(rope_cache_build(&cache, &cfg), 0);
    float qkv[T * ROW], want[T * ROW], qw[D], kw[D];
    for (int i = 0; i < T * ROW; i++) qkv[i] = want[i] = sinf(i * 0.37f) * 2;
    for (int i = 0; i < D; i++) qw[i] = 0.5f + i / 64.0f, kw[i] = 1.5f - i / 64.0f;
    int32_t pos[T] = {99, 0, 42};
    cr_assert_eq(rmsnorm_heads_cpu(want, ROW, want, ROW, qw, T, H, D, 1e-6f), 0);
    cr_assert_eq(rmsnorm_heads_cpu(want + H * D, ROW, want + H * D, ROW, kw, T, HKV, D, 1e-6f), 0);
    cr_assert_eq(rope_cpu(want, ROW, want + H * D, ROW, pos, &cache, T, H, HKV, D), 0);
    cr_assert_eq(qk_norm_rope_cpu(qkv, qw, kw, pos, &cache, T, H, HKV, D, 1e-6f), 0);
    cr_expect_eq(memcmp(qkv, want, sizeof qkv), 0);
    // and a bad position changes nothing at all
    float before[T * ROW];
    memcpy(before, qkv, sizeof qkv);
    int32_t bad[T] = {0, 100, 1};
    cr_expect_eq(qk_norm_rope_cpu(qkv, qw, kw, bad, &cache, T, H, HKV, D, 1e-6f), -1);
    cr_expect_eq(memcmp(qkv, before, sizeof qkv), 0);
    rope_cache_free(&cache);
}

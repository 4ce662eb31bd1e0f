/*
 * tests/test_linear_tp.c - Criterion tests of chapter 03's CPU side: the
 * reference GEMM, the sharding rules, shard loading from checkpoint tensors,
 * and the tp simulation (column shards identical, row partials summing to
 * the unsharded layer).
 *
 * Run: make test  (or build/tests/test_linear_tp after make)
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "chapters/03-linear-tp/linear_tp.h"
#include "common/check.h"
#include "common/rng.h"
#include "reference/linear.h"

static bf16_t *random_bf16(rng_t *r, size_t n, float a) {
    bf16_t *p = malloc(n * sizeof(bf16_t));
    cr_assert_not_null(p);
    fill_uniform_bf16(r, p, n, -a, a);
    return p;
}

Test(linear_cpu, hand_values_with_bias) {
    // x = [[1, 2], [3, -1]]; W = [[1, 0], [0, 1], [1, 1]]; b = [0.5, 0, -1]
    float x[4] = {1, 2, 3, -1}, out[6], wf[6] = {1, 0, 0, 1, 1, 1}, bfl[3] = {0.5f, 0, -1};
    bf16_t w[6], b[3];
    float_to_bf16_array(w, wf, 6);
    float_to_bf16_array(b, bfl, 3);
    cr_assert_eq(linear_cpu(out, x, w, b, 2, 3, 2, 2), 0);
    float want[6] = {1.5f, 2, 2, 3.5f, -1, 1};
    for (int i = 0; i < 6; i++) cr_expect_eq(out[i], want[i], "out[%d] = %g", i, out[i]);
}

Test(linear_cpu, thread_count_does_not_change_results) {
    rng_t r;
    rng_seed(&r, 3);
    int M = 5, N = 77, K = 300;
    float *x = malloc(sizeof(float) * M * K), *a = malloc(sizeof(float) * M * N), *b = malloc(sizeof(float) * M * N);
    fill_normal_f32(&r, x, (size_t)M * K, 0, 1);
    bf16_t *w = random_bf16(&r, (size_t)N * K, 0.05f);
    cr_assert_eq(linear_cpu(a, x, w, NULL, M, N, K, 1), 0);
    cr_assert_eq(linear_cpu(b, x, w, NULL, M, N, K, 7), 0);
    cr_expect_eq(memcmp(a, b, sizeof(float) * M * N), 0);
    free(x); free(a); free(b); free(w);
}

Test(linear_cpu, rejects_bad_shapes) {
    float x[1] = {0}, out[1];
    bf16_t w[1] = {0};
    cr_expect_eq(linear_cpu(out, x, w, NULL, -1, 1, 1, 1), -1);
    cr_expect_eq(linear_cpu(out, x, w, NULL, 1, 0, 1, 1), -1);
    cr_expect_eq(linear_cpu(out, x, w, NULL, 1, 1, 0, 1), -1);
    cr_expect(strstr(mv_last_error(), "in_features") != NULL);
}

Test(sharding, qkv_layout_per_rank) {
    // Qwen3-0.6B at tp = 2: rank 1 holds q heads 8..15, kv heads 4..7.
    tp_linear_t l;
    cr_assert_eq(tp_linear_qkv(&l, 1024, 16, 8, 128, 2, 1), 0);
    cr_expect_eq(l.out_local, 2048);
    tp_segment_t s[3];
    cr_assert_eq(tp_linear_segments(&l, s), 3);
    cr_expect_eq(s[0].local_offset, 0);    cr_expect_eq(s[0].full_offset, 1024); cr_expect_eq(s[0].count, 1024);
    cr_expect_eq(s[1].local_offset, 1024); cr_expect_eq(s[1].full_offset, 2048 + 512); cr_expect_eq(s[1].count, 512);
    cr_expect_eq(s[2].local_offset, 1536); cr_expect_eq(s[2].full_offset, 3072 + 512); cr_expect_eq(s[2].count, 512);
}

Test(sharding, qkv_replicates_kv_heads_when_tp_exceeds_them) {
    // 16 query heads, 8 kv heads at tp = 16: each rank holds 1 query head and
    // the kv head it reads, kv head r / 2 (vLLM's num_kv_head_replicas = 2).
    tp_linear_t l;
    cr_assert_eq(tp_linear_qkv(&l, 1024, 16, 8, 128, 16, 5), 0, "%s", mv_last_error());
    cr_expect_eq(l.kv_heads_local, 1);
    cr_expect_eq(l.kv_replicas, 2);
    cr_expect_eq(l.out_local, 3 * 128);
    tp_segment_t s[3];
    cr_assert_eq(tp_linear_segments(&l, s), 3);
    cr_expect_eq(s[0].full_offset, 5 * 128);         cr_expect_eq(s[0].count, 128);
    cr_expect_eq(s[1].full_offset, 2048 + 2 * 128);  cr_expect_eq(s[1].local_offset, 128);
    cr_expect_eq(s[2].full_offset, 3072 + 2 * 128);  cr_expect_eq(s[2].local_offset, 256);
    // One kv head at tp = 4 (tiny-qwen3-untied): every rank holds it.
    cr_assert_eq(tp_linear_qkv(&l, 64, 4, 1, 128, 4, 3), 0, "%s", mv_last_error());
    cr_assert_eq(tp_linear_segments(&l, s), 3);
    cr_expect_eq(s[1].full_offset, 512);
    cr_expect_eq(s[1].count, 128);
}

Test(sharding, merged_and_row_sizes) {
    tp_linear_t l;
    int parts[2] = {3072, 3072};
    cr_assert_eq(tp_linear_merged_column(&l, 1024, parts, 2, 4, 3), 0);
    cr_expect_eq(l.out_local, 1536);
    cr_assert_eq(tp_linear_row(&l, 3072, 1024, 4, 2), 0);
    cr_expect_eq(l.in_local, 768);
    cr_expect_eq(l.out_local, 1024);
}

Test(sharding, rejects_what_tp_does_not_divide) {
    tp_linear_t l;
    cr_expect_eq(tp_linear_qkv(&l, 1024, 16, 8, 128, 3, 0), -1);
    cr_expect(strstr(mv_last_error(), "num_attention_heads") != NULL);
    // tp 12 divides 24 query heads, but neither divides 8 kv heads nor is a multiple of them.
    cr_expect_eq(tp_linear_qkv(&l, 1024, 24, 8, 128, 12, 0), -1);
    cr_expect(strstr(mv_last_error(), "num_key_value_heads") != NULL);
    cr_expect_eq(tp_linear_column(&l, 1024, 1000, 3, 0), -1);
    cr_expect_eq(tp_linear_row(&l, 1000, 1024, 3, 0), -1);
    cr_expect_eq(tp_linear_column(&l, 1024, 1024, 2, 2), -1);  // rank out of range
    cr_expect(strstr(mv_last_error(), "rank") != NULL);
}

Test(sharding, names_map_to_parts) {
    tp_kind_t k;
    int p;
    cr_assert_eq(tp_part_of("model.layers.0.self_attn.v_proj.weight", &k, &p), 0);
    cr_expect_eq(k, TP_QKV);
    cr_expect_eq(p, 2);
    cr_assert_eq(tp_part_of("gate_proj", &k, &p), 0);
    cr_expect_eq(k, TP_MERGED_COLUMN);
    cr_expect_eq(p, 0);
    cr_assert_eq(tp_part_of("model.layers.1.mlp.down_proj.weight", &k, &p), 0);
    cr_expect_eq(k, TP_ROW);
    cr_expect_eq(tp_part_of("model.layers.1.mlp.xdown_proj.weight", &k, &p), -1);
}

Test(sharding, load_rejects_wrong_shape_naming_the_tensor) {
    tp_linear_t l;
    cr_assert_eq(tp_linear_row(&l, 64, 32, 2, 0), 0);
    bf16_t full[64 * 64] = {0}, local[32 * 32];
    cr_expect_eq(tp_linear_load(&l, "model.layers.4.self_attn.o_proj.weight", 0, full, 64, 64, local), -1);
    cr_expect(strstr(mv_last_error(), "o_proj") != NULL);
    cr_expect(strstr(mv_last_error(), "[64, 64]") != NULL);
}

// Row-parallel: the shard's columns, for every output row.
Test(sharding, row_shard_takes_input_columns) {
    tp_linear_t l;
    cr_assert_eq(tp_linear_row(&l, 4, 2, 2, 1), 0);
    bf16_t full[8], local[4];
    for (int i = 0; i < 8; i++) full[i] = (bf16_t)i;  // W[o][i] = 4o + i
    cr_assert_eq(tp_linear_load(&l, "o_proj", 0, full, 2, 4, local), 0);
    bf16_t want[4] = {2, 3, 6, 7};
    cr_expect_eq(memcmp(local, want, sizeof want), 0);
}

// The whole simulation: merged column shards reassembled are bit-identical
// to the unsharded layer, row partials sum to it within fp32 reordering.
static void simulate(tp_kind_t kind, int tp) {
    rng_t r;
    rng_seed(&r, 11 + tp);
    int M = 3, K = 64, parts[2] = {48, 48};
    tp_linear_t full;
    if (kind == TP_MERGED_COLUMN) cr_assert_eq(tp_linear_merged_column(&full, K, parts, 2, 1, 0), 0);
    else cr_assert_eq(tp_linear_row(&full, K, 40, 1, 0), 0);
    int N = full.out_features;
    bf16_t *w = random_bf16(&r, (size_t)N * K, 0.1f);
    float *x = malloc(sizeof(float) * M * K), *ref = malloc(sizeof(float) * M * N), *got = calloc((size_t)M * N, sizeof(float));
    fill_normal_f32(&r, x, (size_t)M * K, 0, 1);
    cr_assert_eq(linear_cpu(ref, x, w, NULL, M, N, K, 1), 0);
    for (int rank = 0; rank < tp; rank++) {
        tp_linear_t l;
        if (kind == TP_MERGED_COLUMN) cr_assert_eq(tp_linear_merged_column(&l, K, parts, 2, tp, rank), 0);
        else cr_assert_eq(tp_linear_row(&l, K, 40, tp, rank), 0);
        bf16_t *wl = malloc(sizeof(bf16_t) * l.out_local * l.in_local);
        float *xl = malloc(sizeof(float) * M * l.in_local), *yl = malloc(sizeof(float) * M * l.out_local);
        if (kind == TP_MERGED_COLUMN) {
            cr_assert_eq(tp_linear_load(&l, "gate_proj", 0, w, 48, K, wl), 0);
            cr_assert_eq(tp_linear_load(&l, "up_proj", 1, w + 48 * K, 48, K, wl), 0);
            memcpy(xl, x, sizeof(float) * M * K);
        } else {
            cr_assert_eq(tp_linear_load(&l, "down_proj", 0, w, N, K, wl), 0);
            for (int m = 0; m < M; m++) memcpy(xl + m * l.in_local, x + m * K + rank * l.in_local, sizeof(float) * l.in_local);
        }
        cr_assert_eq(linear_cpu(yl, xl, wl, NULL, M, l.out_local, l.in_local, 1), 0);
        if (kind == TP_MERGED_COLUMN) cr_assert_eq(tp_linear_scatter_output(&l, yl, M, got), 0);
        else for (int i = 0; i < M * N; i++) got[i] += yl[i];
        free(wl); free(xl); free(yl);
    }
    for (int i = 0; i < M * N; i++) {
        if (kind == TP_MERGED_COLUMN) cr_expect_eq(got[i], ref[i], "tp=%d [%d]: %g vs %g", tp, i, got[i], ref[i]);
        else cr_expect(fabsf(got[i] - ref[i]) <= 1e-5f + 1e-5f * fabsf(ref[i]), "tp=%d [%d]: %g vs %g", tp, i, got[i], ref[i]);
    }
    free(w); free(x); free(ref); free(got);
}

Test(tp_simulation, merged_column_is_exact) {
    for (int tp = 1; tp <= 8; tp *= 2) simulate(TP_MERGED_COLUMN, tp);
}

Test(tp_simulation, row_partials_sum_to_the_layer) {
    for (int tp = 1; tp <= 8; tp *= 2) simulate(TP_ROW, tp);
}

/*
 * tests/test_attention.c - Criterion tests of chapter 07's CPU reference
 * (reference/attention.c): values computed by hand, the causal mask and its
 * alignment to the end when a prefix is cached, the GQA head mapping, the
 * paged cache against contiguous keys and the float64 formula of
 * chapters/07-attention/attention_cases.c (blocks out of order and shared),
 * decode as the last row of prefill, every block size 16..256 with head_dim
 * 64 and 128 and GQA ratios 1, 2, 4, 5 and 8, threads, and the rejection of
 * bad inputs with their messages.
 *
 * Run: make test  (or build/tests/test_attention after make)
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chapters/07-attention/attention_cases.h"
#include "common/check.h"
#include "common/compare.h"
#include "common/rng.h"
#include "reference/attention.h"

#define EXPECT_NEAR(got, want, tol) \
    cr_expect(fabs((double)(got) - (double)(want)) <= (tol), "got %.9g, want %.9g", (double)(got), (double)(want))

// The paged reference on a whole case; out [T_q, H, D].
static void prefill(const attn_case_t *c, float *out, int num_threads) {
    int rc = attention_prefill_cpu(out, c->q, c->k_cache, c->v_cache, c->cu_seqlens_q, c->context_lens,
                                   c->block_tables, c->num_seqs, c->num_heads, c->num_kv_heads, c->head_dim,
                                   c->block_size, c->num_blocks, c->max_blocks, c->scale, num_threads);
    cr_assert_eq(rc, 0, "%s", mv_last_error());
}

static attn_case_t make_case(uint64_t seed, const attn_seq_spec_t *specs, int S, int H, int Hkv, int D, int bs) {
    rng_t rng;
    rng_seed(&rng, seed);
    attn_case_t c;
    cr_assert_eq(attn_case_make(&c, &rng, specs, S, H, Hkv, D, bs), 0, "%s", mv_last_error());
    return c;
}

// The chapter's ragged mix (attn_specs_ragged) at one block size.
static attn_case_t ragged_case(uint64_t seed, int H, int Hkv, int D, int bs) {
    rng_t rng;
    rng_seed(&rng, seed);
    attn_seq_spec_t specs[ATTN_MIX_SEQS];
    const int S = attn_specs_ragged(specs, &rng, bs);
    return make_case(seed + 1, specs, S, H, Hkv, D, bs);
}

// |got - want| <= 1e-6 |want| + 1e-12 everywhere: the reference sums in
// float64 and rounds each output to float once (2^-24 relative).
static void expect_matches_f64(const float *got, const double *want, size_t n, const char *what) {
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < n; i++)
        if (!(fabs(got[i] - want[i]) <= 1e-6 * fabs(want[i]) + 1e-12) && bad++ == 0) first = i;
    cr_expect_eq(bad, 0, "%s: %zu of %zu elements differ from float64; first [%zu] got %.9g want %.9g", what, bad, n,
                 first, (double)got[first], want[first]);
}

// ---- values computed by hand -----------------------------------------------------

Test(attention, one_query_two_keys_by_hand) {
    // Block size 2, two blocks; the sequence lives in block 1 (table {1, -1}).
    // q = [2, 0], k = [1, 1] and [0.5, 3], scale 0.5: scores 1 and 0.5, so
    // weights e / (e + e^0.5) and e^0.5 / (e + e^0.5).
    const float q[2] = {2, 0};
    float kc[2 * 2 * 2], vc[2 * 2 * 2], out[2];
    poison_host(kc, sizeof kc);
    poison_host(vc, sizeof vc);
    const float k1[4] = {1, 1, 0.5f, 3}, v1[4] = {10, -2, 4, 6};
    memcpy(kc + 4, k1, sizeof k1);
    memcpy(vc + 4, v1, sizeof v1);
    const int32_t cu_q[2] = {0, 1}, ctx[1] = {2}, table[2] = {1, -1};
    cr_assert_eq(attention_prefill_cpu(out, q, kc, vc, cu_q, ctx, table, 1, 1, 1, 2, 2, 2, 2, 0.5f, 1), 0, "%s",
                 mv_last_error());
    const double w0 = exp(1.0) / (exp(1.0) + exp(0.5)), w1 = 1 - w0;
    EXPECT_NEAR(out[0], w0 * 10 + w1 * 4, 1e-6);
    EXPECT_NEAR(out[1], w0 * -2 + w1 * 6, 1e-6);
}

Test(attention, a_single_key_returns_its_value_exactly) {
    // Whatever the score, one key has weight exp(0) / exp(0) = 1.
    rng_t rng;
    rng_seed(&rng, 3);
    enum { H = 4, HKV = 2, D = 64 };
    float q[H * D], kc[4 * HKV * D], vc[4 * HKV * D], out[H * D];
    fill_uniform_f32(&rng, q, H * D, -30, 30);
    fill_uniform_f32(&rng, kc, 4 * HKV * D, -30, 30);
    fill_uniform_f32(&rng, vc, 4 * HKV * D, -5, 5);
    const int32_t ctx[1] = {1}, table[1] = {0};
    cr_assert_eq(attention_decode_cpu(out, q, kc, vc, ctx, table, 1, H, HKV, D, 4, 1, 1, 0.125f, 1), 0);
    for (int h = 0; h < H; h++)
        cr_expect_eq(memcmp(out + h * D, vc + (h / 2) * D, D * sizeof(float)), 0, "head %d", h);
}

Test(attention, equal_scores_average_the_values) {
    // q = 0: every score is 0, every weight 1/ctx.
    enum { D = 4, CTX = 5 };
    const float q[D] = {0};
    float kc[8 * D], vc[8 * D], out[D];
    rng_t rng;
    rng_seed(&rng, 4);
    fill_uniform_f32(&rng, kc, 8 * D, -3, 3);
    fill_uniform_f32(&rng, vc, 8 * D, -3, 3);
    const int32_t ctx[1] = {CTX}, table[2] = {1, 0};  // block size 4: tokens 0..3 in block 1, token 4 in block 0
    cr_assert_eq(attention_decode_cpu(out, q, kc, vc, ctx, table, 1, 1, 1, D, 4, 2, 2, 1.0f, 1), 0);
    for (int d = 0; d < D; d++) {
        double mean = 0;
        for (int j = 0; j < CTX; j++) mean += vc[((j < 4 ? 4 : 0) + j % 4) * D + d] / (double)CTX;
        EXPECT_NEAR(out[d], mean, 1e-6);
    }
}

// ---- the causal mask ---------------------------------------------------------------

Test(attention, a_query_never_sees_later_keys) {
    // One sequence, all 37 tokens new, block size 16. Changing the key and
    // value of token 20 must leave queries 0..19 bit for bit as they were,
    // and change queries 20..36.
    const attn_seq_spec_t spec = {37, 37, -1, 0};
    attn_case_t c = make_case(7, &spec, 1, 2, 1, 64, 16);
    const size_t n = (size_t)37 * 2 * 64, row = 64;
    float *before = mv_xmalloc(n * sizeof(float)), *after = mv_xmalloc(n * sizeof(float));
    prefill(&c, before, 1);
    const size_t slot = (size_t)c.block_tables[20 / 16] * 16 + 20 % 16;
    for (size_t d = 0; d < row; d++) c.k_cache[slot * row + d] += 1.5f, c.v_cache[slot * row + d] -= 2.0f;
    prefill(&c, after, 1);
    const size_t per_token = 2 * 64;
    cr_expect_eq(memcmp(before, after, 20 * per_token * sizeof(float)), 0, "queries 0..19 changed");
    for (int i = 20; i < 37; i++)
        cr_expect_neq(memcmp(before + i * per_token, after + i * per_token, per_token * sizeof(float)), 0,
                      "query %d did not see token 20", i);
    attn_case_free(&c);
    free(before);
    free(after);
}

Test(attention, the_mask_is_aligned_to_the_end_with_a_cached_prefix) {
    // 5 new tokens over a context of 23 (18 cached), block size 16. With
    // q = 0 every visible key weighs the same, so query i returns the mean of
    // the values of tokens 0 .. 18 + i: the mask counts from the end.
    const attn_seq_spec_t spec = {5, 23, -1, 0};
    attn_case_t c = make_case(8, &spec, 1, 1, 1, 8, 16);
    memset(c.q, 0, sizeof(float) * 5 * 8);
    float out[5 * 8], out_contig[5 * 8];
    prefill(&c, out, 1);
    cr_assert_eq(attention_prefill_contiguous_cpu(out_contig, c.q, c.k, c.v, c.cu_seqlens_q, c.cu_seqlens_k, 1, 1, 1, 8,
                                                  c.scale, 1),
                 0);
    for (int i = 0; i < 5; i++)
        for (int d = 0; d < 8; d++) {
            double mean = 0;
            for (int j = 0; j <= 18 + i; j++) mean += c.v[j * 8 + d];
            mean /= 19 + i;
            EXPECT_NEAR(out[i * 8 + d], mean, 1e-6);
            EXPECT_NEAR(out_contig[i * 8 + d], mean, 1e-6);
        }
    attn_case_free(&c);
}

// ---- GQA ---------------------------------------------------------------------------

// Every value of kv head g is g + 1, so the output of query head h is
// exactly (kv head it reads) + 1, whatever the weights.
static void check_gqa_mapping(int H, int Hkv) {
    const attn_seq_spec_t specs[2] = {{3, 9, -1, 0}, {1, 20, -1, 0}};
    attn_case_t c = make_case(9, specs, 2, H, Hkv, 16, 16);
    const size_t slots = (size_t)c.num_blocks * 16;
    for (size_t s = 0; s < slots; s++)
        for (int g = 0; g < Hkv; g++)
            for (int d = 0; d < 16; d++) c.v_cache[(s * Hkv + g) * 16 + d] = (float)(g + 1);
    float *out = mv_xmalloc(sizeof(float) * (size_t)c.T_q * H * 16);
    prefill(&c, out, 0);
    const int group = H / Hkv;
    for (int t = 0; t < c.T_q; t++)
        for (int h = 0; h < H; h++)
            for (int d = 0; d < 16; d++)
                EXPECT_NEAR(out[((size_t)t * H + h) * 16 + d], h / group + 1, 1e-6);
    attn_case_free(&c);
    free(out);
}

Test(attention, query_head_h_reads_kv_head_h_over_group) {
    check_gqa_mapping(8, 2);   // group 4: heads 0..3 -> kv 0, 4..7 -> kv 1 (not h % 2)
    check_gqa_mapping(16, 8);  // Qwen3-0.6B
    check_gqa_mapping(10, 2);  // group 5, as Qwen3-14B's 40 / 8
    check_gqa_mapping(3, 3);   // no grouping
}

// ---- the paged cache, decode, threads ------------------------------------------------

Test(attention, paged_equals_contiguous_and_float64) {
    // The ragged mix: blocks handed out in random order, prefix blocks shared.
    attn_case_t c = ragged_case(10, 4, 2, 64, 16);
    const int S = c.num_seqs;
    cr_assert_gt(c.num_shared, 0, "the mix shares prefix blocks");
    const size_t n = (size_t)c.T_q * 4 * 64;
    float *paged = mv_xmalloc(n * sizeof(float)), *contig = mv_xmalloc(n * sizeof(float));
    double *want = mv_xmalloc(n * sizeof(double));
    poison_host(paged, n * sizeof(float));
    poison_host(contig, n * sizeof(float));
    prefill(&c, paged, 0);
    cr_assert_eq(attention_prefill_contiguous_cpu(contig, c.q, c.k, c.v, c.cu_seqlens_q, c.cu_seqlens_k, S, 4, 2, 64,
                                                  c.scale, 0),
                 0, "%s", mv_last_error());
    cr_assert_eq(attention_f64(want, &c), 0);
    // Same keys in the same order through the same code: the same bits.
    cr_expect_eq(memcmp(paged, contig, n * sizeof(float)), 0, "paged and contiguous differ");
    expect_matches_f64(paged, want, n, "paged vs float64");
    attn_case_free(&c);
    free(paged);
    free(contig);
    free(want);
}

Test(attention, decode_is_the_last_row_of_prefill) {
    attn_case_t c = ragged_case(12, 8, 1, 128, 32);
    const int S = c.num_seqs;
    const size_t n = (size_t)c.T_q * 8 * 128, n_dec = (size_t)S * 8 * 128;
    float *out = mv_xmalloc(n * sizeof(float)), *q_dec = mv_xmalloc(n_dec * sizeof(float));
    float *out_dec = mv_xmalloc(n_dec * sizeof(float)), *last = mv_xmalloc(n_dec * sizeof(float));
    prefill(&c, out, 0);
    attn_case_last_rows(&c, q_dec, c.q, sizeof(float));
    attn_case_last_rows(&c, last, out, sizeof(float));
    poison_host(out_dec, n_dec * sizeof(float));
    cr_assert_eq(attention_decode_cpu(out_dec, q_dec, c.k_cache, c.v_cache, c.context_lens, c.block_tables, S, 8, 1, 128,
                                      32, c.num_blocks, c.max_blocks, c.scale, 0),
                 0, "%s", mv_last_error());
    cr_expect_eq(memcmp(out_dec, last, n_dec * sizeof(float)), 0, "decode differs from prefill's last rows");
    attn_case_free(&c);
    free(out); free(q_dec); free(out_dec); free(last);
}

Test(attention, any_number_of_threads_gives_the_same_bits) {
    attn_case_t c = ragged_case(14, 4, 1, 64, 16);
    const size_t n = (size_t)c.T_q * 4 * 64;
    float *one = mv_xmalloc(n * sizeof(float)), *other = mv_xmalloc(n * sizeof(float));
    prefill(&c, one, 1);
    const int counts[] = {0, 2, 7, 64, 1000};  // 1000: more than the cap and than the (sequence, head) pairs
    for (int i = 0; i < 5; i++) {
        poison_host(other, n * sizeof(float));
        prefill(&c, other, counts[i]);
        cr_expect_eq(memcmp(one, other, n * sizeof(float)), 0, "%d threads differ from 1", counts[i]);
    }
    attn_case_free(&c);
    free(one);
    free(other);
}

// Every block size with both head_dims and every GQA ratio, on a small mix:
// 1 token; a fresh full block; one block + 1 on a shared block; a chunk of a
// long prompt; a fully cached prompt on the long one's blocks.
static void check_block_size(int bs) {
    static const struct { int H, Hkv; } gqa[] = {{2, 2}, {4, 2}, {4, 1}, {8, 1}};  // ratios 1, 2, 4, 8
    const attn_seq_spec_t specs[5] = {
        {1, 1, -1, 0}, {bs, bs, -1, 0}, {2, bs + 1, 1, 1}, {5, 3 * bs + 7, -1, 0}, {1, 2 * bs, 3, 2},
    };
    for (int D = 64; D <= 128; D += 64)
        for (int g = 0; g < 4; g++) {
            attn_case_t c = make_case((uint64_t)(bs * 1000 + D + g), specs, 5, gqa[g].H, gqa[g].Hkv, D, bs);
            const size_t n = (size_t)c.T_q * gqa[g].H * D;
            float *out = mv_xmalloc(n * sizeof(float));
            double *want = mv_xmalloc(n * sizeof(double));
            poison_host(out, n * sizeof(float));
            prefill(&c, out, 0);
            cr_assert_eq(attention_f64(want, &c), 0);
            char what[64];
            snprintf(what, sizeof what, "bs=%d D=%d H=%d/%d", bs, D, gqa[g].H, gqa[g].Hkv);
            expect_matches_f64(out, want, n, what);
            attn_case_free(&c);
            free(out);
            free(want);
        }
}

Test(attention, block_size_16) { check_block_size(16); }
Test(attention, block_size_32) { check_block_size(32); }
Test(attention, block_size_64) { check_block_size(64); }
Test(attention, block_size_128) { check_block_size(128); }
Test(attention, block_size_256) { check_block_size(256); }

Test(attention, empty_batches_and_rows_without_queries) {
    // Block size 2, 3 blocks (6 slots), one head of 2. Sequence 0 has 3
    // cached keys and no query this step; sequence 1 has one key, in block 2.
    float out[4] = {7, 7, 7, 7}, q[2] = {1, 1}, kc[12] = {0}, vc[12] = {0};
    const int32_t cu_q[3] = {0, 0, 1}, ctx[2] = {3, 1}, table[2 * 2] = {0, 1, 2, -1};
    vc[8] = 5, vc[9] = -1;  // slot 4 = block 2, offset 0
    // An empty batch is valid and writes nothing.
    cr_expect_eq(attention_prefill_cpu(out, q, kc, vc, cu_q, ctx, table, 0, 1, 1, 2, 2, 3, 2, 1.0f, 0), 0);
    cr_expect(out[0] == 7 && out[1] == 7);
    cr_expect_eq(attention_prefill_cpu(out, q, kc, vc, cu_q, ctx, table, 2, 1, 1, 2, 2, 3, 2, 1.0f, 0), 0, "%s",
                 mv_last_error());
    cr_expect(out[0] == 5 && out[1] == -1, "got %g %g", out[0], out[1]);
    cr_expect(out[2] == 7 && out[3] == 7, "wrote past the one query row");
}

// ---- bad inputs ----------------------------------------------------------------------

static void expect_error(int rc, const char *must_mention) {
    cr_expect_eq(rc, -1, "accepted; wanted an error mentioning '%s'", must_mention);
    cr_expect(strstr(mv_last_error(), must_mention) != NULL, "'%s' does not mention '%s'", mv_last_error(),
              must_mention);
}

Test(attention, bad_shapes_are_rejected) {
    expect_error(attention_validate_heads(1, 12, 8, 128, 0.1f), "num_heads (12) must be a multiple of num_kv_heads (8)");
    expect_error(attention_validate_heads(1, 0, 1, 128, 0.1f), "num_heads and num_kv_heads must be >= 1, got 0 and 1");
    expect_error(attention_validate_heads(1, 16, 8, 127, 0.1f), "head_dim must be even and in [2, 256], got 127");
    expect_error(attention_validate_heads(1, 16, 8, 0, 0.1f), "got 0");
    expect_error(attention_validate_heads(1, 16, 8, 258, 0.1f), "got 258");
    expect_error(attention_validate_heads(1, 16, 8, 128, 0.0f), "scale must be finite and > 0");
    expect_error(attention_validate_heads(1, 16, 8, 128, NAN), "scale must be finite and > 0");
    expect_error(attention_validate_heads(-1, 16, 8, 128, 0.1f), "num_seqs must be >= 0, got -1");
    cr_expect_eq(attention_validate_heads(0, 16, 8, 256, 0.0625f), 0);
    expect_error(attention_validate_cache(0, 4, 2), "got 0, 4 and 2");
    expect_error(attention_validate_cache(1 << 20, 1 << 12, 1), "do not fit an int32 slot id");
    cr_expect_eq(attention_validate_cache(256, 1000, 160), 0);
}

Test(attention, bad_batches_are_rejected_naming_the_sequence) {
    // Block size 16, 4 blocks, tables 2 wide.
    const int32_t tables[2 * 2] = {0, -1, 1, -1}, ctx[2] = {5, 3};
    const int32_t cu_not0[3] = {1, 5, 9}, cu_down[3] = {0, 5, 4}, cu_ok[3] = {0, 5, 9};
    expect_error(attention_validate_paged_batch(cu_not0, ctx, tables, 2, 16, 4, 2), "cu_seqlens_q[0] must be 0, got 1");
    expect_error(attention_validate_paged_batch(cu_down, ctx, tables, 2, 16, 4, 2),
                 "cu_seqlens_q decreases at sequence 1: cu_seqlens_q[2] = 4 after cu_seqlens_q[1] = 5");
    expect_error(attention_validate_paged_batch(cu_ok, ctx, tables, 2, 16, 4, 2),
                 "sequence 1 has context_len 3 but 4 new tokens");
    const int32_t ctx_long[2] = {40, 4};
    expect_error(attention_validate_paged_batch(cu_ok, ctx_long, tables, 2, 16, 4, 2),
                 "sequence 0 has context_len 40, more than max_blocks*block_size = 32");
    const int32_t ctx_2blocks[2] = {5, 17};
    expect_error(attention_validate_paged_batch(cu_ok, ctx_2blocks, tables, 2, 16, 4, 2),
                 "sequence 1: block_tables[1][1] = -1 (no block), but logical block 1 holds its tokens 16..16 "
                 "(context_len 17)");
    const int32_t tables_past[2 * 2] = {4, -1, 1, -1};
    expect_error(attention_validate_paged_batch(cu_ok, ctx, tables_past, 2, 16, 4, 2),
                 "sequence 0: block_tables[0][0] = 4, outside [0, num_blocks = 4)");
    // -1 past the context is padding, and fine.
    const int32_t ctx_fit[2] = {5, 16};
    cr_expect_eq(attention_validate_paged_batch(cu_ok, ctx_fit, tables, 2, 16, 4, 2), 0, "%s", mv_last_error());
    // Decode (cu_seqlens_q NULL): one new token each, so no empty context.
    const int32_t ctx_empty[2] = {5, 0};
    expect_error(attention_validate_paged_batch(NULL, ctx_empty, tables, 2, 16, 4, 2),
                 "sequence 1 has context_len 0 but 1 new tokens");
    // Contiguous keys: cu_seqlens_k has the same rules, and enough keys.
    const int32_t cu_k_not0[3] = {2, 5, 9}, cu_k_short[3] = {0, 5, 7};
    expect_error(attention_validate_contiguous_batch(cu_ok, cu_k_not0, 2), "cu_seqlens_k[0] must be 0, got 2");
    expect_error(attention_validate_contiguous_batch(cu_ok, cu_k_short, 2), "sequence 1 has 2 keys but 4 queries");
}

Test(attention, a_refused_call_writes_nothing) {
    float out[4], q[4] = {1, 2, 3, 4}, kc[8] = {0}, vc[8] = {0};
    poison_host(out, sizeof out);
    const int32_t cu_q[2] = {0, 2}, ctx[1] = {2}, bad_table[1] = {-1};
    expect_error(attention_prefill_cpu(out, q, kc, vc, cu_q, ctx, bad_table, 1, 1, 1, 2, 4, 1, 1, 1.0f, 0),
                 "block_tables[0][0] = -1");
    expect_error(attention_prefill_cpu(out, q, kc, vc, NULL, ctx, bad_table, 1, 1, 1, 2, 4, 1, 1, 1.0f, 0),
                 "cu_seqlens_q is NULL");
    for (int i = 0; i < 4; i++) {
        uint32_t bits;
        memcpy(&bits, &out[i], sizeof bits);
        cr_expect_eq(bits, POISON_F32_BITS, "out[%d] was written", i);
    }
}

// ---- decode attention version 7's row order (made on the host) ---------------------

Test(attention, the_row_order_is_longest_first_ties_by_row) {
    const int32_t lens[7] = {5, 900, 5, 0, 37, 900, -3};
    int32_t order[7];
    cr_assert_eq(attention_row_order_longest_first(lens, 7, order), 0, "%s", mv_last_error());
    // 900 (rows 1, 5), 37 (row 4), 5 (rows 0, 2), then 0 and -3 (counted as 0: rows 3, 6).
    const int32_t want[7] = {1, 5, 4, 0, 2, 3, 6};
    for (int k = 0; k < 7; k++) cr_expect_eq(order[k], want[k], "order[%d] = %d, want %d", k, order[k], want[k]);
    cr_expect_eq(attention_validate_row_order(order, 7), 0, "%s", mv_last_error());
    cr_expect_eq(attention_row_order_longest_first(lens, 0, NULL), 0);
    expect_error(attention_row_order_longest_first(NULL, 3, order), "NULL given");
    expect_error(attention_row_order_longest_first(lens, -1, order), "num_seqs must be >= 0, got -1");
}

Test(attention, a_row_order_that_is_not_a_permutation_is_refused) {
    const int32_t twice[4] = {2, 0, 2, 1}, outside[4] = {0, 1, 4, 2}, negative[3] = {0, -1, 1};
    expect_error(attention_validate_row_order(twice, 4), "row_order[2] = 2 names row 2 a second time");
    expect_error(attention_validate_row_order(outside, 4), "row_order[2] = 4 is outside [0, 4)");
    expect_error(attention_validate_row_order(negative, 3), "row_order[1] = -1 is outside [0, 3)");
    expect_error(attention_validate_row_order(NULL, 2), "the row order is NULL for 2 rows");
    cr_expect_eq(attention_validate_row_order(NULL, 0), 0);
}

/*
 * chapters/07-attention/main.c - Chapter 07: attention over the paged KV cache.
 *
 * Where it sits in Qwen3: in every decoder layer, after RoPE and the KV store
 * (chapter 06), each query head attends to its sequence's keys in the cache:
 *
 *   O = softmax(Q K^T / sqrt(head_dim) + causal mask) V      per sequence, per head
 *
 * with the mask aligned to the end (query i of n new tokens over a context
 * of ctx keys sees keys 0 .. ctx - n + i: the first ctx - n are a cached
 * prefix or an earlier chunk), GQA (query head h reads kv head h / group),
 * and the keys read through block tables from
 *
 *   k_cache, v_cache [num_blocks, block_size, num_kv_heads, head_dim].
 *
 * Prefill (many query tokens per sequence) and decode (one) are the same
 * computation; reference/attention.h explains it step by step.
 *
 * What it checks:
 *   1. The CPU reference (reference/attention.c) against values computed by
 *      hand: softmax weights of one query over two keys, a single key that
 *      returns its value exactly, equal scores that average the values.
 *   2. The reference against an independent float64 formula that
 *      materialises the whole score matrix (attention_cases.c), on random
 *      ragged batches (attn_specs_ragged: 1 token, one block, one block + 1,
 *      long chunked prefills, prefix hits on shared blocks, a fully cached
 *      prompt, decode tokens) for every block size 16..256, head_dim 64 and
 *      128, and GQA ratios 1, 2, 4 and 8: prefill through the paged cache,
 *      prefill with contiguous keys, and decode; decode must give the last
 *      prefill row of each sequence bit for bit, and three threads the same
 *      bits as one (block sizes 16 and 32). Unused cache slots hold NaN and
 *      outputs are poisoned, so a wrong read or a missed write fails.
 *   3. The rejection of bad inputs, with the message checked.
 * The GPU half (CUDA kernels checked against this reference, then timed)
 * is not written yet.
 *
 * Build and run:  make && ./build/07-attention [--json FILE] [--help]
 * Exit status: 0 if every check passed, 1 if any failed, 2 on bad arguments.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chapters/07-attention/attention_cases.h"
#include "common/check.h"
#include "common/compare.h"
#include "common/harness.h"
#include "common/rng.h"
#include "reference/attention.h"

// ---- tolerances: each with its reason ------------------------------------------
static const tolerance_t TOL_F64 = {
    1e-12, 1e-6, 1e-12,
    "fp32 output of a float64 computation vs a float64 formula: both sum in float64 (in other "
    "orders, ~1e-15 apart); the reference rounds each output to float once, 2^-24 relative"};
static const tolerance_t TOL_EXACT = {0, 0, 0, "a single key has weight exactly 1: its value is copied"};

static void *xmalloc(size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) mv_die_at(__FILE__, __LINE__, "malloc", "out of host memory");
    return p;
}

// ---- 1. values computed by hand ------------------------------------------------------

// One sequence over a cache of one block holding `ctx` keys (block table {0}),
// head_dim 2, one head: the whole output for its n = 1 query.
static void run_one_query(float out[2], const float q[2], const float *kc, const float *vc, int ctx, float scale) {
    const int32_t cu_q[2] = {0, 1}, ctx_lens[1] = {ctx}, table[1] = {0};
    MV_CHECK(attention_prefill_cpu(out, q, kc, vc, cu_q, ctx_lens, table, 1, 1, 1, 2, 4, 1, 1, scale, 1));
}

static void check_hand_values(harness_t *h) {
    float out[2];
    // q = [1, 0], keys [1, 0] and [0, 0], scale 1: scores 1 and 0, weights
    // e/(1+e) and 1/(1+e). Values [1, 2] and [3, -1]:
    // out = (e*[1, 2] + [3, -1]) / (1 + e).
    const float q[2] = {1, 0}, kc[8] = {1, 0, 0, 0}, vc[8] = {1, 2, 3, -1};
    const double e = exp(1.0), want2[2] = {(e + 3) / (1 + e), (2 * e - 1) / (1 + e)};
    run_one_query(out, q, kc, vc, 2, 1.0f);
    harness_check(h, "cpu", "hand-values", "two keys: weights e/(1+e)", "ctx=2 D=2",
                  compare_f64("two keys", out, want2, 2, TOL_F64, 0), TOL_F64);
    // A single key gets weight exp(0)/exp(0) = 1: its value comes back exactly.
    const float vc1[8] = {0.3f, -7.25f};
    const double want1[2] = {0.3f, -7.25f};
    run_one_query(out, q, kc, vc1, 1, 0.125f);
    harness_check(h, "cpu", "hand-values", "one key: its value, exactly", "ctx=1 D=2",
                  compare_f64("one key", out, want1, 2, TOL_EXACT, 0), TOL_EXACT);
    // q = 0: every score is 0, the weights are 1/4 each: the mean of the values.
    const float q0[2] = {0, 0}, kc4[8] = {1, 2, -3, 4, 5, 0.5f, 9, -9}, vc4[8] = {1, 0, 2, 0, 3, 0, 4, 8};
    const double want4[2] = {2.5, 2.0};
    run_one_query(out, q0, kc4, vc4, 4, 1.0f);
    harness_check(h, "cpu", "hand-values", "equal scores: mean of values", "ctx=4 D=2",
                  compare_f64("equal scores", out, want4, 2, TOL_F64, 0), TOL_F64);
}

// ---- 2. random ragged batches against the float64 formula ----------------------------

static int bits_equal(const float *a, const float *b, size_t n) { return memcmp(a, b, n * sizeof(float)) == 0; }

static void check_ragged(harness_t *h, rng_t *rng, int block_size, int H, int Hkv, int D) {
    attn_seq_spec_t specs[ATTN_MIX_SEQS];
    const int S = attn_specs_ragged(specs, rng, block_size);
    attn_case_t c;
    MV_CHECK(attn_case_make(&c, rng, specs, S, H, Hkv, D, block_size));
    const size_t n_out = (size_t)c.T_q * H * D, n_dec = (size_t)S * H * D;
    double *want = xmalloc(sizeof(double) * n_out), *want_dec = xmalloc(sizeof(double) * n_dec);
    float *out = xmalloc(sizeof(float) * n_out), *out_contig = xmalloc(sizeof(float) * n_out);
    float *out_1thread = xmalloc(sizeof(float) * n_out), *out_3threads = xmalloc(sizeof(float) * n_out);
    float *q_dec = xmalloc(sizeof(float) * n_dec), *out_dec = xmalloc(sizeof(float) * n_dec);
    float *last_rows = xmalloc(sizeof(float) * n_dec);
    MV_CHECK(attention_f64(want, &c));

    int max_ctx = 0;
    for (int s = 0; s < S; s++) max_ctx = c.context_lens[s] > max_ctx ? c.context_lens[s] : max_ctx;
    char shape[96];
    snprintf(shape, sizeof shape, "S=%d Tq=%d ctx<=%d H=%d/%d D=%d bs=%d shared=%d", S, c.T_q, max_ctx, H, Hkv, D,
             block_size, c.num_shared);
    const int nb = c.num_blocks, mb = c.max_blocks;

    poison_host(out, sizeof(float) * n_out);
    MV_CHECK(attention_prefill_cpu(out, c.q, c.k_cache, c.v_cache, c.cu_seqlens_q, c.context_lens, c.block_tables,
                                   S, H, Hkv, D, block_size, nb, mb, c.scale, 0));
    harness_check(h, "cpu", "ragged", "prefill, paged", shape, compare_f64("prefill", out, want, n_out, TOL_F64, 0),
                  TOL_F64);

    poison_host(out_contig, sizeof(float) * n_out);
    MV_CHECK(attention_prefill_contiguous_cpu(out_contig, c.q, c.k, c.v, c.cu_seqlens_q, c.cu_seqlens_k, S, H, Hkv,
                                              D, c.scale, 0));
    harness_check(h, "cpu", "ragged", "prefill, contiguous keys", shape,
                  compare_f64("contiguous", out_contig, want, n_out, TOL_F64, 0), TOL_F64);

    // Decode: each sequence's last query token alone, over its whole context.
    attn_case_last_rows(&c, q_dec, c.q, sizeof(float));
    attn_case_last_rows(&c, want_dec, want, sizeof(double));
    attn_case_last_rows(&c, last_rows, out, sizeof(float));
    poison_host(out_dec, sizeof(float) * n_dec);
    MV_CHECK(attention_decode_cpu(out_dec, q_dec, c.k_cache, c.v_cache, c.context_lens, c.block_tables, S, H, Hkv, D,
                                  block_size, nb, mb, c.scale, 0));
    harness_check(h, "cpu", "ragged", "decode, paged", shape, compare_f64("decode", out_dec, want_dec, n_dec, TOL_F64, 0),
                  TOL_F64);

    // The same bits whoever computes them: decode vs prefill's last rows;
    // and (on the smaller block sizes, to keep the run short) one thread vs
    // three: each (sequence, head) is one thread's, in a fixed order.
    const int dec_same = bits_equal(out_dec, last_rows, n_dec);
    int threads_same = 1;
    if (block_size <= 32) {
        poison_host(out_1thread, sizeof(float) * n_out);
        poison_host(out_3threads, sizeof(float) * n_out);
        MV_CHECK(attention_prefill_cpu(out_1thread, c.q, c.k_cache, c.v_cache, c.cu_seqlens_q, c.context_lens,
                                       c.block_tables, S, H, Hkv, D, block_size, nb, mb, c.scale, 1));
        MV_CHECK(attention_prefill_cpu(out_3threads, c.q, c.k_cache, c.v_cache, c.cu_seqlens_q, c.context_lens,
                                       c.block_tables, S, H, Hkv, D, block_size, nb, mb, c.scale, 3));
        threads_same = bits_equal(out_1thread, out, n_out) && bits_equal(out_3threads, out, n_out);
    }
    char detail[160], what[64];
    snprintf(detail, sizeof detail, "decode %s prefill's last rows%s", dec_same ? "==" : "!=",
             block_size > 32 ? "" : threads_same ? "; 1 and 3 threads == the default" : "; 1 or 3 threads differ");
    snprintf(what, sizeof what, "bit for bit, bs=%d H=%d/%d D=%d", block_size, H, Hkv, D);
    harness_check_bool(h, "cpu", "same-bits", what, dec_same && threads_same, detail);

    attn_case_free(&c);
    free(want); free(want_dec); free(out); free(out_contig); free(out_1thread); free(out_3threads);
    free(q_dec); free(out_dec); free(last_rows);
}

// ---- 3. bad inputs -----------------------------------------------------------------

static void expect_error(harness_t *h, const char *what, int rc, const char *must_mention) {
    char detail[320];
    snprintf(detail, sizeof detail, "%s", rc ? mv_last_error() : "accepted (wrong)");
    harness_check_bool(h, "cpu", "reject", what, rc != 0 && strstr(mv_last_error(), must_mention) != NULL, detail);
}

static void check_rejections(harness_t *h) {
    expect_error(h, "num_heads not a multiple of num_kv_heads", attention_validate_heads(1, 12, 8, 128, 0.1f),
                 "multiple of num_kv_heads (8)");
    expect_error(h, "odd head_dim", attention_validate_heads(1, 16, 8, 127, 0.1f), "got 127");
    expect_error(h, "head_dim past 256", attention_validate_heads(1, 16, 8, 512, 0.1f), "got 512");
    const int32_t cu_q[3] = {0, 5, 4}, ctx[2] = {5, 3}, tables[2 * 2] = {0, -1, 1, -1};
    expect_error(h, "cu_seqlens_q decreasing", attention_validate_paged_batch(cu_q, ctx, tables, 2, 16, 4, 2),
                 "decreases at sequence 1");
    const int32_t cu_q2[3] = {0, 5, 9};
    expect_error(h, "context_len < new tokens", attention_validate_paged_batch(cu_q2, ctx, tables, 2, 16, 4, 2),
                 "sequence 1 has context_len 3 but 4 new tokens");
    const int32_t ctx2[2] = {5, 17};
    expect_error(h, "block table -1 inside the context", attention_validate_paged_batch(cu_q2, ctx2, tables, 2, 16, 4, 2),
                 "sequence 1: block_tables[1][1] = -1");
}

int main(int argc, char **argv) {
    harness_t h;
    harness_begin(&h, "07-attention",
                  "attention over the paged KV cache: prefill (prefix hits, chunks) and decode, GQA; fp32 math", argc,
                  argv);
    rng_t rng;
    rng_seed(&rng, h.seed);

    harness_section(&h, "CPU reference against hand-computed values");
    check_hand_values(&h);

    harness_section(&h, "CPU reference against a float64 formula: ragged batches, every block size, D 64/128, GQA 1/2/4/8");
    static const int block_sizes[] = {16, 32, 64, 128, 256};
    static const struct { int H, Hkv; } gqa[] = {{2, 2}, {4, 2}, {4, 1}, {8, 1}};  // ratios 1, 2, 4, 8
    for (int b = 0; b < 5; b++)
        for (int g = 0; g < 4; g++)  // each block size and each ratio meets both head_dims
            check_ragged(&h, &rng, block_sizes[b], gqa[g].H, gqa[g].Hkv, (b + g) % 2 ? 128 : 64);

    harness_section(&h, "CPU reference: bad inputs are rejected, naming the sequence and the value");
    check_rejections(&h);

    h.gpu_note = "the CUDA kernels of chapter 07 are not written yet";
    if (!h.summary) printf("\n== GPU half: %s; only the CPU reference is checked.\n", h.gpu_note);
    return harness_end(&h);
}

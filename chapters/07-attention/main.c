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
 *   4. Every CUDA version (kernels/attention.cu) on the same kinds of ragged
 *      batches against the CPU reference (bf16 in, outputs poisoned first):
 *      prefill through the paged cache and with packed keys (a stride other
 *      than the row), decode unsplit, in 3 pieces (some start past a short
 *      sequence's end), in the automatic number, and told an upper bound of
 *      max_context_len; long sequences (1100 tokens, a chunk after a 1200-token
 *      prefix, up to 64 decode pieces); the launchers' refusals; decode with
 *      q/k norm, RoPE and the KV store in its pieces (attention_decode_rope_cuda)
 *      against qk_norm_rope_store_cuda + decode, bit for bit (output and both
 *      caches, every version, PDL off and on, padding rows, a group that falls
 *      back to the two kernels), and against the CPU reference.
 *   5. Timing at Qwen3-0.6B's heads: decode 256 x 1024 (target: 75% of the
 *      measured copy bandwidth, counting the K and V bytes), 1 x 1024,
 *      1 x 16384 (split against unsplit), 64 x 4096, and batches of mixed
 *      lengths (256 and 64 rows of U[100, 2048] keys: version 4's pieces
 *      against the longest row's one block), and decode with q/k norm, RoPE
 *      and the store in one kernel against the two (8, 64, 256 rows of
 *      U[100, 2048] keys); causal prefill 16 x 1024,
 *      1 x 8192, 64 x 256 in TFLOP/s against the measured GEMM rate. At these
 *      sizes every flash version (2, 3) is checked against version 1 first.
 *
 * Build and run:  make && ./build/07-attention [--json FILE] [--help]
 * Exit status: 0 if every check passed, 1 if any failed, 2 on bad arguments.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chapters/07-attention/attention_cases.h"
#include "common/bf16.h"
#include "common/check.h"
#include "common/compare.h"
#include "common/harness.h"
#include "common/rng.h"
#include "kernels/versions.h"
#include "reference/attention.h"
#include "reference/kv_store.h"
#include "reference/rope.h"

// ---- tolerances: each with its reason ------------------------------------------
static const tolerance_t TOL_F64 = {
    1e-12, 1e-6, 1e-12,
    "fp32 output of a float64 computation vs a float64 formula: both sum in float64 (in other "
    "orders, ~1e-15 apart); the reference rounds each output to float once, 2^-24 relative"};
static const tolerance_t TOL_EXACT = {0, 0, 0, "a single key has weight exactly 1: its value is copied"};

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
    double *want = mv_xmalloc(sizeof(double) * n_out), *want_dec = mv_xmalloc(sizeof(double) * n_dec);
    float *out = mv_xmalloc(sizeof(float) * n_out), *out_contig = mv_xmalloc(sizeof(float) * n_out);
    float *out_1thread = mv_xmalloc(sizeof(float) * n_out), *out_3threads = mv_xmalloc(sizeof(float) * n_out);
    float *q_dec = mv_xmalloc(sizeof(float) * n_dec), *out_dec = mv_xmalloc(sizeof(float) * n_dec);
    float *last_rows = mv_xmalloc(sizeof(float) * n_dec);
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


// ---- 4. the CUDA kernels (kernels/attention.cu) -----------------------------------------
#if MV_HAVE_CUDA
#include "kernels/attention.h"
#include "kernels/pdl.h"

// Naive prefill, naive decode, split decode: fp32 scores, softmax and sums.
static const tolerance_t TOL_GPU = {
    1e-4, BF16_HALF_ULP + 1e-5, (BF16_HALF_ULP + 1e-5) * (BF16_HALF_ULP + 1e-5),
    "output stored as bf16: half an ulp, 2^-8 relative; fp32 scores (D products of |q|~2 by |k|~1, "
    "~1e-6 relative) move each weight by ~1e-6, on values |v| < ~5: ~1e-5 absolute, 1e-4 allowed"};

// The flash prefill rounds the weights P to bf16 before the P V mma (the
// tensor cores take bf16): each weight is off by up to 2^-8 of itself while
// the row sum l keeps the fp32 weights, so an output is off by up to
// 2^-8 * sum_j p_j |v_j| / l <= 2^-8 * max |v|, on top of the output's own
// rounding. The errors of different weights have random signs, so their
// mean square is ~(2^-8)^2/3 of the output's: NMSE bound 4 * (2^-8)^2.
static tolerance_t tol_flash(double max_abs_v) {
    tolerance_t t = {BF16_HALF_ULP * max_abs_v + 1e-4, BF16_HALF_ULP + 1e-5, 4 * BF16_HALF_ULP * BF16_HALF_ULP,
                     "bf16 output (2^-8 relative) + P rounded to bf16 before the PV mma: up to 2^-8 * max|v| "
                     "absolute (max|v| of the case); NMSE ~(2^-8)^2/3 each, 4*(2^-8)^2 allowed"};
    return t;
}

// Version 2 against version 1 on the timed shapes (too large for the CPU
// reference): both are rounded to bf16 from fp32 results, so they may be a
// whole ulp apart (2^-7 relative), plus the flash version's P rounding.
static tolerance_t tol_vs_v1(int flash, double max_abs_v) {
    tolerance_t t = {(flash ? BF16_HALF_ULP * max_abs_v : 0) + 2e-4, 2 * BF16_HALF_ULP + 2e-5,
                     (flash ? 4 : 1) * 4 * BF16_HALF_ULP * BF16_HALF_ULP,
                     "two bf16 roundings (one per version: 2^-7 relative) of fp32 results; for the flash "
                     "version also P in bf16 (2^-8 * max|v| absolute)"};
    return t;
}

// A batch on the device: q as a view into QKV rows (q_stride = (H + 2*Hkv) * D,
// the engine's layout; the other columns poison), the paged caches, and the
// same keys packed for the varlen entry, k and v interleaved in one buffer
// (each with stride 2 * Hkv * D, so a stride other than the row is exercised).
typedef struct {
    int S, H, Hkv, D, bs, nb, mb, T_q, T_k, max_ctx, max_n;
    long long sum_ctx;  // dcase_make_big: the keys decode reads, over every sequence
    long long q_stride, kv_stride;
    bf16_t *q;          // [T_q, q_stride]
    bf16_t *q_dec;      // [S, q_stride]: each sequence's last query row
    bf16_t *kv;         // [T_k, 2 * Hkv * D]: k row, then v row
    bf16_t *k_cache, *v_cache;  // [nb, bs, Hkv, D]
    int32_t *cu_q, *cu_k, *ctx, *tables;
    int32_t *order;     // [S]: the rows longest first (decode version 7)
    bf16_t *out;        // [T_q, H, D]
    bf16_t *out_dec;    // [S, H, D]
    void *ws;           // split decode workspace for ATTN_DECODE_MAX_SPLITS pieces
    size_t ws_bytes;
    double max_abs_v;
} dcase_t;

// rows x cols floats into bf16 rows of `stride` elements at column col0 (host).
static void pack_rows(bf16_t *dst, size_t stride, size_t col0, const float *src, size_t rows, size_t cols) {
    for (size_t r = 0; r < rows; r++)
        for (size_t c = 0; c < cols; c++) dst[r * stride + col0 + c] = float_to_bf16(src[r * cols + c]);
}

static bf16_t *upload_packed(const float *src, size_t rows, size_t cols, size_t stride, size_t col0,
                             const float *src2, size_t col2) {
    bf16_t *h = mv_xmalloc(sizeof(bf16_t) * rows * stride);
    poison_host(h, sizeof(bf16_t) * rows * stride);
    pack_rows(h, stride, col0, src, rows, cols);
    if (src2) pack_rows(h, stride, col2, src2, rows, cols);
    bf16_t *d = gpu_alloc(sizeof(bf16_t) * rows * stride);
    gpu_upload(d, h, sizeof(bf16_t) * rows * stride);
    free(h);
    return d;
}

static int32_t *upload_i32(const int32_t *src, size_t n) {
    int32_t *d = gpu_alloc(sizeof(int32_t) * n);
    gpu_upload(d, src, sizeof(int32_t) * n);
    return d;
}

// The rows' longest-first order (reference/attention.h), on the device.
static int32_t *upload_order(const int32_t *lens, int S) {
    int32_t *order = mv_xmalloc(sizeof(int32_t) * (S > 0 ? S : 1));
    MV_CHECK(attention_row_order_longest_first(lens, S, order));
    MV_CHECK(attention_validate_row_order(order, S));
    int32_t *d = upload_i32(order, (size_t)(S > 0 ? S : 1));
    free(order);
    return d;
}

static void dcase_upload(dcase_t *d, const attn_case_t *c, const float *q_dec) {
    memset(d, 0, sizeof *d);
    d->S = c->num_seqs, d->H = c->num_heads, d->Hkv = c->num_kv_heads, d->D = c->head_dim;
    d->bs = c->block_size, d->nb = c->num_blocks, d->mb = c->max_blocks, d->T_q = c->T_q, d->T_k = c->T_k;
    for (int s = 0; s < c->num_seqs; s++) {
        d->max_ctx = c->context_lens[s] > d->max_ctx ? c->context_lens[s] : d->max_ctx;
        const int n = c->cu_seqlens_q[s + 1] - c->cu_seqlens_q[s];
        d->max_n = n > d->max_n ? n : d->max_n;
    }
    const size_t qrow = (size_t)d->H * d->D, row = (size_t)d->Hkv * d->D;
    d->q_stride = (long long)(qrow + 2 * row);
    d->kv_stride = (long long)(2 * row);
    d->q = upload_packed(c->q, (size_t)d->T_q, qrow, (size_t)d->q_stride, 0, NULL, 0);
    d->q_dec = upload_packed(q_dec, (size_t)d->S, qrow, (size_t)d->q_stride, 0, NULL, 0);
    d->kv = upload_packed(c->k, (size_t)d->T_k, row, 2 * row, 0, c->v, row);
    const size_t slots = (size_t)d->nb * d->bs;  // unused slots hold NaN (attn_case_make): a stray read poisons
    d->k_cache = upload_packed(c->k_cache, slots, row, row, 0, NULL, 0);
    d->v_cache = upload_packed(c->v_cache, slots, row, row, 0, NULL, 0);
    d->cu_q = upload_i32(c->cu_seqlens_q, (size_t)d->S + 1);
    d->cu_k = upload_i32(c->cu_seqlens_k, (size_t)d->S + 1);
    d->ctx = upload_i32(c->context_lens, (size_t)d->S);
    d->order = upload_order(c->context_lens, d->S);
    d->tables = upload_i32(c->block_tables, (size_t)d->S * d->mb);
    d->out = gpu_alloc(sizeof(bf16_t) * (size_t)d->T_q * qrow);
    d->out_dec = gpu_alloc(sizeof(bf16_t) * (size_t)d->S * qrow);
    d->ws_bytes = attention_decode_workspace_bytes(d->S, d->H, d->D, ATTN_DECODE_MAX_SPLITS);
    d->ws = gpu_alloc(d->ws_bytes);
    d->max_abs_v = 0;
    for (size_t i = 0; i < (size_t)d->T_k * row; i++) d->max_abs_v = fmax(d->max_abs_v, fabs(c->v[i]));
}

static void dcase_free(dcase_t *d) {
    gpu_free(d->q); gpu_free(d->q_dec); gpu_free(d->kv); gpu_free(d->k_cache); gpu_free(d->v_cache);
    gpu_free(d->cu_q); gpu_free(d->cu_k); gpu_free(d->ctx); gpu_free(d->tables); gpu_free(d->order);
    gpu_free(d->out); gpu_free(d->out_dec); gpu_free(d->ws);
}

enum { RUN_PAGED, RUN_VARLEN, RUN_DECODE };
typedef struct {
    int kind, version, splits, max_ctx_arg;  // max_ctx_arg: what decode is told max_context_len is
    const dcase_t *d;
    const int32_t *order;  // decode version 7's row order: NULL = the case's longest first (d->order)
} run_t;

static int run_attn(void *p, cudaStream_t stream) {
    const run_t *r = p;
    const dcase_t *d = r->d;
    const float scale = (float)(1.0 / sqrt((double)d->D));
    const long long row = (long long)d->Hkv * d->D;
    switch (r->kind) {
    case RUN_PAGED:
        return attention_prefill_cuda(r->version, d->out, d->q, d->q_stride, d->k_cache, d->v_cache, d->cu_q, d->ctx,
                                      d->tables, d->S, d->max_n, d->H, d->Hkv, d->D, d->bs, d->nb, d->mb, scale,
                                      stream);
    case RUN_VARLEN:
        return attention_prefill_varlen_cuda(r->version, d->out, d->q, d->q_stride, d->kv, d->kv_stride, d->kv + row,
                                             d->kv_stride, d->cu_q, d->cu_k, d->S, d->max_n, d->H, d->Hkv, d->D,
                                             scale, stream);
    default:
        return attention_decode_cuda(r->version, r->splits, d->out_dec, d->q_dec, d->q_stride, d->k_cache, d->v_cache,
                                     d->ctx, d->tables, r->order ? r->order : d->order, d->S, r->max_ctx_arg, d->H,
                                     d->Hkv, d->D, d->bs, d->nb, d->mb, scale, d->ws, d->ws_bytes, stream);
    }
}

static const char *kind_name(int kind) {
    return kind == RUN_PAGED ? "prefill paged" : kind == RUN_VARLEN ? "prefill varlen" : "decode";
}

// Poison the output, run once, and return the output [rows, H, D] on the
// host (caller frees); *n gets its element count.
static bf16_t *run_once(const run_t *r, size_t *n) {
    const dcase_t *d = r->d;
    *n = (size_t)(r->kind == RUN_DECODE ? d->S : d->T_q) * d->H * d->D;
    bf16_t *d_out = r->kind == RUN_DECODE ? d->out_dec : d->out;
    gpu_poison(d_out, *n * sizeof(bf16_t));
    MV_CHECK(run_attn((void *)r, 0));
    CUDA_CHECK(cudaDeviceSynchronize());
    bf16_t *got = mv_xmalloc(*n * sizeof(bf16_t));
    gpu_download(got, d_out, *n * sizeof(bf16_t));
    return got;
}

// Run once and compare with `ref` (float, [rows, H, D]).
// Returns the bf16 output on the host (caller frees) when keep is set; runs
// nothing and returns NULL for a version --kernel left out.
static bf16_t *check_run(harness_t *h, const char *case_name, const run_t *r, const float *ref, tolerance_t tol,
                         const char *shape, int keep) {
    if (!harness_kernel_wanted(h, r->version)) return NULL;  // --kernel N: version N alone
    const dcase_t *d = r->d;
    size_t n;
    bf16_t *got = run_once(r, &n);
    char label[128];
    const char *vname = r->kind == RUN_DECODE ? attention_decode_version_name(r->version)
                                              : attention_prefill_version_name(r->version);
    if (r->kind == RUN_DECODE)
        snprintf(label, sizeof label, "%s %s splits=%d%s", kind_name(r->kind), vname, r->splits,
                 r->splits == 0 ? "(auto)" : "");
    else
        snprintf(label, sizeof label, "%s %s", kind_name(r->kind), vname);
    if (r->kind == RUN_DECODE && r->max_ctx_arg != d->max_ctx) {
        // One row per kind of bound in the tables, whatever the case's lengths.
        const size_t len = strlen(label);
        if (r->max_ctx_arg == d->max_ctx + 1000)
            snprintf(label + len, sizeof label - len, " max_ctx=longest+1000 (bound)");
        else
            snprintf(label + len, sizeof label - len, " max_ctx=%d (bound)", r->max_ctx_arg);
    }
    harness_check(h, "gpu", case_name, label, shape, compare_bf16(label, got, ref, n, tol, 0), tol);
    if (keep) return got;
    free(got);
    return NULL;
}

// Every version and entry point on one case, against the CPU reference.
static void check_gpu_case(harness_t *h, const char *case_name, const attn_case_t *c, int big) {
    const int S = c->num_seqs, H = c->num_heads, D = c->head_dim;
    const size_t n_out = (size_t)c->T_q * H * D, n_dec = (size_t)S * H * D;
    float *ref = mv_xmalloc(sizeof(float) * n_out), *ref_dec = mv_xmalloc(sizeof(float) * n_dec);
    float *q_dec = mv_xmalloc(sizeof(float) * n_dec);
    MV_CHECK(attention_prefill_cpu(ref, c->q, c->k_cache, c->v_cache, c->cu_seqlens_q, c->context_lens,
                                   c->block_tables, S, H, c->num_kv_heads, D, c->block_size, c->num_blocks,
                                   c->max_blocks, c->scale, 0));
    attn_case_last_rows(c, q_dec, c->q, sizeof(float));
    MV_CHECK(attention_decode_cpu(ref_dec, q_dec, c->k_cache, c->v_cache, c->context_lens, c->block_tables, S, H,
                                  c->num_kv_heads, D, c->block_size, c->num_blocks, c->max_blocks, c->scale, 0));
    dcase_t d;
    dcase_upload(&d, c, q_dec);
    char shape[128];
    snprintf(shape, sizeof shape, "S=%d Tq=%d ctx<=%d H=%d/%d D=%d bs=%d shared=%d", S, c->T_q, d.max_ctx, H,
             c->num_kv_heads, D, c->block_size, c->num_shared);
    const tolerance_t tf = tol_flash(d.max_abs_v);
    for (int v = 1; v <= ATTN_PREFILL_NUM_VERSIONS; v++) {
        const tolerance_t tol = v >= 2 ? tf : TOL_GPU;  // versions 2 and up: flash, P in bf16
        run_t r = {RUN_PAGED, v, 0, 0, &d, NULL};
        check_run(h, case_name, &r, ref, tol, shape, 0);
        r.kind = RUN_VARLEN;
        check_run(h, case_name, &r, ref, tol, shape, 0);
    }
    // Decode: version 1; version 2 unsplit, in 3 pieces (odd: pieces that
    // start past a short sequence's end), in the automatic number, and in 3
    // pieces with max_context_len an upper bound (what a CUDA graph passes).
    run_t r = {RUN_DECODE, 1, 0, d.max_ctx, &d, NULL};
    check_run(h, case_name, &r, ref_dec, TOL_GPU, shape, 0);
    // Version 3 the same, and with the bound of a decode graph (pieces cut
    // from each sequence's own context: the bound must change nothing).
    // Version 5 is version 4 with the reduction's loads first, version 6
    // version 4 with its keys and values through a ring in shared memory,
    // version 7 version 6 started longest row first: the bits of all three
    // must be version 4's.
    const int splits[3] = {1, 3, 0};
    for (int v = 2; v <= ATTN_DECODE_NUM_VERSIONS; v++) {
        for (int i = 0; i < 3; i++) {
            r = (run_t){RUN_DECODE, v, splits[i], d.max_ctx, &d, NULL};
            bf16_t *got = check_run(h, case_name, &r, ref_dec, TOL_GPU, shape, v >= 5);
            if (got && harness_kernel_wanted(h, 4)) {
                r.version = 4;
                size_t n;
                bf16_t *want = run_once(&r, &n);
                char what[160];
                snprintf(what, sizeof what, "decode %s splits=%d: the bits of %s, %s", attention_decode_version_name(v),
                         splits[i], attention_decode_version_name(4), shape);
                harness_check_bool(h, "gpu", case_name, what, memcmp(got, want, n * sizeof(bf16_t)) == 0,
                                   v == 5   ? "the reduction's version 2 takes version 1's sums in the same order"
                                   : v == 6 ? "the ring hands each thread the vectors version 4 loads, in its order"
                                            : "the same pieces and sums, started in another order");
                free(want);
            }
            free(got);
        }
        r = (run_t){RUN_DECODE, v, 3, d.max_ctx + 1000, &d, NULL};
        check_run(h, case_name, &r, ref_dec, TOL_GPU, shape, 0);
        if (big) {  // many pieces on a long context
            r = (run_t){RUN_DECODE, v, ATTN_DECODE_MAX_SPLITS, d.max_ctx, &d, NULL};
            check_run(h, case_name, &r, ref_dec, TOL_GPU, shape, 0);
        }
    }
    r = (run_t){RUN_DECODE, 3, 16, 4096 > d.max_ctx ? 4096 : d.max_ctx, &d, NULL};
    check_run(h, case_name, &r, ref_dec, TOL_GPU, shape, 0);
    dcase_free(&d);
    free(ref); free(ref_dec); free(q_dec);
}

static void check_gpu_ragged(harness_t *h, rng_t *rng, int block_size, int H, int Hkv, int D) {
    attn_seq_spec_t specs[ATTN_MIX_SEQS];
    const int S = attn_specs_ragged(specs, rng, block_size);
    attn_case_t c;
    MV_CHECK(attn_case_make(&c, rng, specs, S, H, Hkv, D, block_size));
    check_gpu_case(h, "ragged", &c, 0);
    attn_case_free(&c);
}

// Longer sequences: many key tiles, many query tiles, many split pieces.
// A 1100-token prompt (no prefix), a 300-token chunk after a 1200-token
// prefix, a prefix hit sharing the first one's blocks, a decode token over
// 2500 keys; at Qwen3-0.6B's heads and at D = 64 with GQA 4.
static void check_gpu_long(harness_t *h, rng_t *rng, int block_size, int H, int Hkv, int D, int small) {
    attn_seq_spec_t specs[4] = {
        {small ? 200 : 1100, small ? 200 : 1100, -1, 0},
        {small ? 70 : 300, small ? 330 : 1500, -1, 0},
        {small ? 9 : 37, (small ? 192 : 1024) / block_size * block_size + (small ? 9 : 37), 0,
         (small ? 192 : 1024) / block_size},
        {1, small ? 600 : 2500, -1, 0},
    };
    attn_case_t c;
    MV_CHECK(attn_case_make(&c, rng, specs, 4, H, Hkv, D, block_size));
    check_gpu_case(h, small ? "long (small: --checks-only)" : "long", &c, 1);
    attn_case_free(&c);
}

// Version 7's row order, where the launcher takes it: 160 rows of mixed
// lengths (1,280 blocks of (row, kv head) unsplit, more than one wave on a
// GPU of up to 426 SMs at 3 blocks a SM), unsplit, in 3 pieces and in the
// automatic pieces. Any permutation gives version 4's bits: longest first
// (the engine's), its reverse, and a random one; each also against the CPU.
static void check_gpu_order(harness_t *h, rng_t *rng) {
    enum { S = 160 };
    attn_seq_spec_t specs[S];
    for (int s = 0; s < S; s++) {
        const int ctx = s % 17 == 0 ? rng_int(rng, 600, 900) : rng_int(rng, 1, 300);
        specs[s] = (attn_seq_spec_t){1, ctx, -1, 0};
    }
    attn_case_t c;
    MV_CHECK(attn_case_make(&c, rng, specs, S, 16, 8, 128, 16));
    const size_t n_dec = (size_t)S * 16 * 128;
    float *ref = mv_xmalloc(sizeof(float) * n_dec), *q_dec = mv_xmalloc(sizeof(float) * n_dec);
    attn_case_last_rows(&c, q_dec, c.q, sizeof(float));
    MV_CHECK(attention_decode_cpu(ref, q_dec, c.k_cache, c.v_cache, c.context_lens, c.block_tables, S, 16, 8, 128, 16,
                                  c.num_blocks, c.max_blocks, c.scale, 0));
    dcase_t d;
    dcase_upload(&d, &c, q_dec);
    int32_t order[S], *h_order = mv_xmalloc(sizeof(int32_t) * S);
    gpu_download(h_order, d.order, sizeof(int32_t) * S);
    for (int k = 0; k < S; k++) order[k] = h_order[S - 1 - k];  // shortest first
    int32_t *d_reverse = upload_i32(order, S);
    for (int k = 0; k < S; k++) order[k] = k;
    for (int k = S - 1; k > 0; k--) {
        const int j = rng_int(rng, 0, k);
        const int32_t t = order[k];
        order[k] = order[j], order[j] = t;
    }
    MV_CHECK(attention_validate_row_order(order, S));
    int32_t *d_shuffled = upload_i32(order, S);
    // The engine's order is sorted: each row no shorter than the next.
    int sorted = 1;
    for (int k = 0; k + 1 < S; k++) sorted &= c.context_lens[h_order[k]] >= c.context_lens[h_order[k + 1]];
    harness_check_bool(h, "cpu", "row order", "attention_row_order_longest_first: every row once, longest first",
                       sorted && !attention_validate_row_order(h_order, S), "160 rows of 1..900 keys");
    char shape[96];
    snprintf(shape, sizeof shape, "S=%d ctx=1..900 H=16/8 D=128 bs=16", S);
    const int splits[3] = {1, 3, 0};
    const struct {
        const int32_t *order;
        const char *name;
    } orders[3] = {{NULL, "longest first"}, {d_reverse, "shortest first"}, {d_shuffled, "a random order"}};
    for (int i = 0; i < 3; i++) {
        run_t r4 = {RUN_DECODE, 4, splits[i], d.max_ctx, &d, NULL};
        size_t n;
        bf16_t *want = harness_kernel_wanted(h, 4) && harness_kernel_wanted(h, 7) ? run_once(&r4, &n) : NULL;
        for (int o = 0; o < 3; o++) {
            run_t r = {RUN_DECODE, 7, splits[i], d.max_ctx, &d, orders[o].order};
            char case_name[48];
            snprintf(case_name, sizeof case_name, "row order, %s", orders[o].name);
            bf16_t *got = check_run(h, case_name, &r, ref, TOL_GPU, shape, 1);
            if (got && want) {
                char what[160];
                snprintf(what, sizeof what, "decode %s splits=%d, %s: the bits of %s", attention_decode_version_name(7),
                         splits[i], orders[o].name, attention_decode_version_name(4));
                harness_check_bool(h, "gpu", "row order", what, memcmp(got, want, n * sizeof(bf16_t)) == 0, shape);
            }
            free(got);
        }
        free(want);
    }
    // A bad order is refused on the host, naming the entry.
    order[5] = order[9];
    int rc = attention_validate_row_order(order, S);
    char detail[320];
    snprintf(detail, sizeof detail, "%s", rc ? mv_last_error() : "accepted (wrong)");
    harness_check_bool(h, "cpu", "row order", "attention_validate_row_order: a row named twice is refused",
                       rc && strstr(mv_last_error(), "a second time") != NULL, detail);
    order[5] = S;
    rc = attention_validate_row_order(order, S);
    snprintf(detail, sizeof detail, "%s", rc ? mv_last_error() : "accepted (wrong)");
    harness_check_bool(h, "cpu", "row order", "attention_validate_row_order: a row out of range is refused",
                       rc && strstr(mv_last_error(), "row_order[5] = 160 is outside") != NULL, detail);
    gpu_free(d_reverse);
    gpu_free(d_shuffled);
    free(h_order);
    dcase_free(&d);
    attn_case_free(&c);
    free(ref);
    free(q_dec);
}

static void expect_gpu_error(harness_t *h, const char *what, int rc, const char *must_mention) {
    char detail[320];
    snprintf(detail, sizeof detail, "%s", rc ? mv_last_error() : "accepted (wrong)");
    harness_check_bool(h, "gpu", "reject", what, rc != 0 && strstr(mv_last_error(), must_mention) != NULL, detail);
}

// The launchers refuse what the kernels do not support, before any launch.
static void check_gpu_rejections(harness_t *h) {
    bf16_t *buf = gpu_alloc(1 << 16);
    int32_t *ibuf = gpu_alloc(1 << 12);
    const float sc = 0.088f;
    expect_gpu_error(h, "prefill head_dim 96",
                     attention_prefill_cuda(2, buf, buf, 16 * 96, buf, buf, ibuf, ibuf, ibuf, 1, 1, 16, 8, 96, 16, 4,
                                            1, sc, 0),
                     "head_dim 96 is not supported");
    expect_gpu_error(h, "prefill block_size 8",
                     attention_prefill_cuda(1, buf, buf, 2048, buf, buf, ibuf, ibuf, ibuf, 1, 1, 16, 8, 128, 8, 4, 1,
                                            sc, 0),
                     "block_size 8 is not supported");
    expect_gpu_error(h, "prefill block_size 48",
                     attention_prefill_cuda(1, buf, buf, 2048, buf, buf, ibuf, ibuf, ibuf, 1, 1, 16, 8, 128, 48, 4, 1,
                                            sc, 0),
                     "block_size 48 is not supported");
    expect_gpu_error(h, "prefill version 4",
                     attention_prefill_cuda(4, buf, buf, 2048, buf, buf, ibuf, ibuf, ibuf, 1, 1, 16, 8, 128, 16, 4, 1,
                                            sc, 0),
                     "unknown version 4");
    expect_gpu_error(h, "varlen version 0",
                     attention_prefill_varlen_cuda(0, buf, buf, 2048, buf, 1024, buf, 1024, ibuf, ibuf, 1, 1, 16, 8,
                                                   128, sc, 0),
                     "unknown version 0");
    expect_gpu_error(h, "varlen head_dim 256",
                     attention_prefill_varlen_cuda(1, buf, buf, 4096, buf, 2048, buf, 2048, ibuf, ibuf, 1, 1, 16, 8,
                                                   256, sc, 0),
                     "head_dim 256 is not supported");
    expect_gpu_error(h, "decode version 8",
                     attention_decode_cuda(8, 1, buf, buf, 2048, buf, buf, ibuf, ibuf, NULL, 1, 16, 16, 8, 128, 16, 4,
                                           1, sc, NULL, 0, 0),
                     "unknown version 8");
    expect_gpu_error(h, "decode version 1 asked to split",
                     attention_decode_cuda(1, 3, buf, buf, 2048, buf, buf, ibuf, ibuf, NULL, 1, 16, 16, 8, 128, 16, 4,
                                           1, sc, NULL, 0, 0),
                     "version 1 does not split");
    expect_gpu_error(h, "decode 65 splits",
                     attention_decode_cuda(2, 65, buf, buf, 2048, buf, buf, ibuf, ibuf, NULL, 1, 16, 16, 8, 128, 16, 4,
                                           1, sc, NULL, 0, 0),
                     "num_splits 65 outside");
    expect_gpu_error(h, "decode split without workspace",
                     attention_decode_cuda(2, 3, buf, buf, 2048, buf, buf, ibuf, ibuf, NULL, 1, 16, 16, 8, 128, 16, 4,
                                           1, sc, NULL, 0, 0),
                     "need");
    expect_gpu_error(h, "decode block_size 512",
                     attention_decode_cuda(2, 1, buf, buf, 2048, buf, buf, ibuf, ibuf, NULL, 1, 16, 16, 8, 128, 512, 4,
                                           1, sc, NULL, 0, 0),
                     "block_size 512 is not supported");
    expect_gpu_error(h, "version 2 with a misaligned q row stride",
                     attention_prefill_cuda(2, buf, buf, 2052, buf, buf, ibuf, ibuf, ibuf, 1, 1, 16, 8, 128, 16, 4, 1,
                                            sc, 0),
                     "16-byte");
    // Decode with its prologue refuses before the two kernels' path could
    // store anything: the attention's own refusals come first.
    const rope_cache_gpu_t cache = {(float *)buf, 16, 128};
    const attention_decode_rope_t rope = {buf, buf, ibuf, &cache, ibuf, 1e-6f};
    expect_gpu_error(h, "decode+rope without its arguments",
                     attention_decode_rope_cuda(4, 0, buf, buf, NULL, buf, buf + 4096, ibuf, ibuf, NULL, 1, 16, 16, 8,
                                                128, 16, 4, 1, sc, NULL, 0, 0),
                     "no q/k norm and RoPE arguments");
    expect_gpu_error(h, "decode+rope version 8",
                     attention_decode_rope_cuda(8, 0, buf, buf, &rope, buf, buf + 4096, ibuf, ibuf, NULL, 1, 16, 16, 8,
                                                128, 16, 4, 1, sc, NULL, 0, 0),
                     "unknown version 8");
    expect_gpu_error(h, "decode+rope block_size 8",
                     attention_decode_rope_cuda(4, 0, buf, buf, &rope, buf, buf + 4096, ibuf, ibuf, NULL, 1, 16, 16, 8,
                                                128, 8, 4, 1, sc, NULL, 0, 0),
                     "block_size 8 is not supported");
    expect_gpu_error(h, "decode+rope 65 splits",
                     attention_decode_rope_cuda(4, 65, buf, buf, &rope, buf, buf + 4096, ibuf, ibuf, NULL, 1, 16, 16, 8,
                                                128, 16, 4, 1, sc, NULL, 0, 0),
                     "num_splits 65 outside");
    expect_gpu_error(h, "decode+rope one buffer for K and V",
                     attention_decode_rope_cuda(4, 0, buf, buf, &rope, buf, buf, ibuf, ibuf, NULL, 1, 16, 16, 8, 128,
                                                16, 4, 1, sc, NULL, 0, 0),
                     "different buffers");
    gpu_free(buf);
    gpu_free(ibuf);
}

// ---- 5. timings ------------------------------------------------------------------------

// A large batch built straight on the device (no CPU reference at these
// sizes: version 2 is checked against version 1 instead). Every sequence
// has n new tokens over ctx keys; blocks handed out in a random order.
// min_ctx > 0: decode contexts drawn from U[min_ctx, ctx], a batch of mixed lengths (the cache and the
// prefill arrays still hold ctx a sequence).
static void dcase_make_big(dcase_t *d, rng_t *rng, int S, int n, int ctx, int min_ctx, int H, int Hkv, int D,
                           int bs) {
    memset(d, 0, sizeof *d);
    d->S = S, d->H = H, d->Hkv = Hkv, d->D = D, d->bs = bs, d->max_ctx = ctx, d->max_n = n;
    d->T_q = S * n, d->T_k = S * ctx;
    d->mb = (ctx + bs - 1) / bs;
    d->nb = S * d->mb;
    const size_t row = (size_t)Hkv * D, qrow = (size_t)H * D;
    d->q_stride = (long long)(qrow + 2 * row);
    d->kv_stride = (long long)(2 * row);
    // Random bf16 from a 16 MB pattern, repeated: N(0, 2) for q, N(0, 1) for k and v.
    const size_t pat = (size_t)8 << 20;
    bf16_t *hq = mv_xmalloc(pat * 2), *hk = mv_xmalloc(pat * 2);
    fill_normal_bf16(rng, hq, pat, 0.0f, 2.0f);
    fill_normal_bf16(rng, hk, pat, 0.0f, 1.0f);
    d->max_abs_v = 0;
    for (size_t i = 0; i < pat; i++) d->max_abs_v = fmax(d->max_abs_v, fabs(bf16_to_float(hk[i])));
    struct { bf16_t **p; size_t n; const bf16_t *src; size_t shift; } bufs[5] = {
        {&d->q, (size_t)d->T_q * d->q_stride, hq, 0},
        {&d->q_dec, (size_t)S * d->q_stride, hq, 12345},
        {&d->kv, (size_t)d->T_k * d->kv_stride, hk, 0},
        {&d->k_cache, (size_t)d->nb * bs * row, hk, 777},
        {&d->v_cache, (size_t)d->nb * bs * row, hk, 4242},
    };
    for (int b = 0; b < 5; b++) {
        *bufs[b].p = gpu_alloc(bufs[b].n * 2);
        for (size_t off = 0; off < bufs[b].n; off += pat - bufs[b].shift) {
            const size_t len = bufs[b].n - off < pat - bufs[b].shift ? bufs[b].n - off : pat - bufs[b].shift;
            gpu_upload(*bufs[b].p + off, bufs[b].src + bufs[b].shift, len * 2);
        }
    }
    int32_t *cu_q = mv_xmalloc(sizeof(int32_t) * (S + 1)), *cu_k = mv_xmalloc(sizeof(int32_t) * (S + 1));
    int32_t *lens = mv_xmalloc(sizeof(int32_t) * S), *tables = mv_xmalloc(sizeof(int32_t) * (size_t)d->nb);
    for (int s = 0; s <= S; s++) cu_q[s] = s * n, cu_k[s] = s * ctx;
    d->sum_ctx = 0;
    for (int s = 0; s < S; s++) {
        lens[s] = min_ctx > 0 && min_ctx < ctx ? rng_int(rng, min_ctx, ctx) : ctx;
        d->sum_ctx += lens[s];
    }
    for (int i = 0; i < d->nb; i++) tables[i] = i;
    for (int i = d->nb - 1; i > 0; i--) {
        const int j = rng_int(rng, 0, i);
        const int32_t t = tables[i];
        tables[i] = tables[j];
        tables[j] = t;
    }
    d->cu_q = upload_i32(cu_q, (size_t)S + 1);
    d->cu_k = upload_i32(cu_k, (size_t)S + 1);
    d->ctx = upload_i32(lens, (size_t)S);
    d->order = upload_order(lens, S);
    d->tables = upload_i32(tables, (size_t)d->nb);
    d->out = gpu_alloc(sizeof(bf16_t) * (size_t)d->T_q * qrow);
    d->out_dec = gpu_alloc(sizeof(bf16_t) * (size_t)S * qrow);
    d->ws_bytes = attention_decode_workspace_bytes(S, H, D, ATTN_DECODE_MAX_SPLITS);
    d->ws = gpu_alloc(d->ws_bytes);
    free(hq); free(hk); free(cu_q); free(cu_k); free(lens); free(tables);
}

static double time_run(harness_t *h, run_t *r, int reps) {
    timing_opts_t opts = {reps > 3 ? 5 : 1, h->quick && reps > 10 ? 10 : reps, 1};
    return gpu_time_ms(run_attn, r, opts);
}

// Run r once and return its output as floats (the reference for the fast
// versions at sizes the CPU reference would take too long on).
static float *gpu_reference(const run_t *r) {
    size_t n;
    bf16_t *got = run_once(r, &n);
    float *ref = mv_xmalloc(n * sizeof(float));
    bf16_to_float_array(ref, got, n);
    free(got);
    return ref;
}

// Decode at S x ctx, Qwen3-0.6B heads: version 2 (automatic splits, and
// unsplit when that splits) checked against version 1, then all timed.
// min_ctx > 0: each context drawn from U[min_ctx, ctx] (a batch of mixed
// lengths, as a serving engine's). Bytes: every K and V element of every
// context once, sum(ctx) * Hkv * D * 2 bytes * 2 (q and out are 1/ctx of that).
static void time_decode(harness_t *h, rng_t *rng, int S, int ctx, int min_ctx, double target_pct) {
    const int H = 16, Hkv = 8, D = 128, bs = 16;
    dcase_t d;
    dcase_make_big(&d, rng, S, 1, ctx, min_ctx, H, Hkv, D, bs);
    char case_name[48], shape[112];
    if (min_ctx > 0) snprintf(case_name, sizeof case_name, "decode %dx%d-%d", S, min_ctx, ctx);
    else snprintf(case_name, sizeof case_name, "decode %dx%d", S, ctx);
    const int auto_splits = attention_decode_num_splits(S, Hkv, ctx, bs);
    if (min_ctx > 0)
        snprintf(shape, sizeof shape, "S=%d ctx=U[%d,%d] (sum %lld) H=%d/%d D=%d bs=%d auto splits %d", S, min_ctx, ctx,
                 d.sum_ctx, H, Hkv, D, bs, auto_splits);
    else
        snprintf(shape, sizeof shape, "S=%d ctx=%d H=%d/%d D=%d bs=%d auto splits %d", S, ctx, H, Hkv, D, bs,
                 auto_splits);
    const double bytes = (double)d.sum_ctx * Hkv * D * 2.0 * 2.0;
    run_t r1 = {RUN_DECODE, 1, 0, ctx, &d, NULL};
    float *ref = gpu_reference(&r1);
    const tolerance_t tol = tol_vs_v1(0, d.max_abs_v);
    run_t runs[2] = {{RUN_DECODE, 2, 0, ctx, &d, NULL}, {RUN_DECODE, 2, 1, ctx, &d, NULL}};
    const int nruns = auto_splits > 1 ? 2 : 1;
    for (int i = 0; i < nruns; i++) check_run(h, case_name, &runs[i], ref, tol, shape, 0);
    char label[64];
    snprintf(label, sizeof label, "%s", attention_decode_version_name(1));
    if (harness_kernel_wanted(h, 1)) harness_timing(h, case_name, label, shape, time_run(h, &r1, 20), bytes, 0, 0);
    for (int i = 0; i < nruns && harness_kernel_wanted(h, 2); i++) {
        snprintf(label, sizeof label, "%s, %d split%s", attention_decode_version_name(2),
                 i == 0 ? auto_splits : 1, (i == 0 ? auto_splits : 1) > 1 ? "s" : "");
        harness_timing(h, case_name, label, shape, time_run(h, &runs[i], 50), bytes, 0, i == 0 ? target_pct : 0);
    }
    // As a decode CUDA graph launches it: max_context_len = the engine's
    // max_model_len (4096 here, or the context when longer), and the pieces
    // that bound gives. Version 2 cuts them from the bound, version 3 from
    // each sequence's context; version 4 takes its own automatic count.
    const int bound = ctx > 4096 ? ctx : 4096, graph_splits = attention_decode_num_splits(S, Hkv, bound, bs);
    for (int v = 2; v <= ATTN_DECODE_NUM_VERSIONS; v++) {
        if (!harness_kernel_wanted(h, v)) continue;  // --kernel N: version N alone
        run_t rg = {RUN_DECODE, v, v >= 4 ? 0 : graph_splits, bound, &d, NULL};
        check_run(h, case_name, &rg, ref, tol, shape, 0);
        if (v >= 4) snprintf(label, sizeof label, "%s, automatic, bound %d", attention_decode_version_name(v), bound);
        else
            snprintf(label, sizeof label, "%s, %d split%s, bound %d", attention_decode_version_name(v), graph_splits,
                     graph_splits > 1 ? "s" : "", bound);
        harness_timing(h, case_name, label, shape, time_run(h, &rg, 50), bytes, 0, 0);
    }
    free(ref);
    dcase_free(&d);
}

// ---- 6. decode with q/k norm, RoPE and the KV store (attention_decode_rope_cuda) -----------

// One decode step as the engine runs it: S rows of one new token each, the
// QKV rows raw from the projection, the cache holding every row's earlier
// keys, the new key's slot poisoned. The last row of a batch of three or
// more is a padding row (context 0, slot -1), as a decode graph pads.
typedef struct {
    int S, H, Hkv, D, bs, nb, mb, max_ctx, real;
    long long qkv_stride;
    size_t qkv_n, cache_n;
    bf16_t *h_qkv, *h_kc, *h_vc, *h_w;  // host copies: raw QKV, caches, q_norm then k_norm
    int32_t *lens, *tables, *pos, *slots;
    rope_cache_t cache;
    rope_cache_gpu_t d_cache;
    // two sets of device buffers: [0] the two kernels, [1] the one
    bf16_t *qkv[2], *kc[2], *vc[2], *out[2], *w;
    int32_t *d_lens, *d_tables, *d_pos, *d_slots, *d_order;  // d_order: longest first (version 7)
    void *ws;
    size_t ws_bytes;
} rcase_t;

// big (the timings): the caches filled on the device from a repeated
// pattern, no host copies (rcase_reset then resets QKV and the output only).
static void rcase_make(rcase_t *c, rng_t *rng, int S, int H, int Hkv, int D, int bs, int min_ctx, int max_ctx,
                       int big) {
    memset(c, 0, sizeof *c);
    c->S = S, c->H = H, c->Hkv = Hkv, c->D = D, c->bs = bs, c->max_ctx = max_ctx;
    c->real = S >= 3 ? S - 1 : S;
    c->mb = (max_ctx + bs - 1) / bs;
    c->qkv_stride = (long long)(H + 2 * Hkv) * D;
    c->qkv_n = (size_t)S * c->qkv_stride;
    const size_t kvrow = (size_t)Hkv * D;
    c->lens = mv_xmalloc(sizeof(int32_t) * S);
    c->tables = mv_xmalloc(sizeof(int32_t) * (size_t)S * c->mb);
    c->pos = mv_xmalloc(sizeof(int32_t) * S);
    c->slots = mv_xmalloc(sizeof(int32_t) * S);
    for (int s = 0; s < S; s++)  // row 0: a first token alone; the last of three or more: padding
        c->lens[s] = s >= c->real ? 0 : s == 0 ? 1 : rng_int(rng, min_ctx, max_ctx);
    // Each row's blocks, as many as its context needs, from the pool in random order (2 spare).
    c->nb = 2;
    for (int s = 0; s < S; s++) c->nb += (c->lens[s] + bs - 1) / bs;
    c->cache_n = (size_t)c->nb * bs * kvrow;
    int32_t *perm = mv_xmalloc(sizeof(int32_t) * c->nb);
    for (int i = 0; i < c->nb; i++) perm[i] = i;
    for (int i = c->nb - 1; i > 0; i--) {
        const int j = rng_int(rng, 0, i);
        const int32_t t = perm[i];
        perm[i] = perm[j], perm[j] = t;
    }
    for (int s = 0, next = 0; s < S; s++) {
        for (int b = 0; b < c->mb; b++)
            c->tables[(size_t)s * c->mb + b] = b < (c->lens[s] + bs - 1) / bs ? perm[next++] : 0;
        const int j = c->lens[s] - 1;  // the new token's position and slot
        c->pos[s] = s >= c->real ? 0 : j;
        c->slots[s] = s >= c->real ? -1 : c->tables[(size_t)s * c->mb + j / bs] * bs + j % bs;
    }
    MV_CHECK(kv_store_validate_slots(c->slots, S, (long long)c->nb * bs));
    c->h_qkv = mv_xmalloc(c->qkv_n * 2);
    c->h_w = mv_xmalloc((size_t)2 * D * 2);
    fill_normal_bf16(rng, c->h_qkv, c->qkv_n, 0.0f, 1.0f);
    fill_uniform_bf16(rng, c->h_w, (size_t)2 * D, 0.5f, 1.5f);
    if (!big) {
        c->h_kc = mv_xmalloc(c->cache_n * 2);
        c->h_vc = mv_xmalloc(c->cache_n * 2);
        fill_normal_bf16(rng, c->h_kc, c->cache_n, 0.0f, 1.0f);
        fill_normal_bf16(rng, c->h_vc, c->cache_n, 0.0f, 1.0f);
        for (int s = 0; s < c->real; s++)  // the new keys' slots: poison, until a kernel stores them
            for (size_t e = 0; e < kvrow; e++)
                c->h_kc[(size_t)c->slots[s] * kvrow + e] = c->h_vc[(size_t)c->slots[s] * kvrow + e] = POISON_BF16;
    }
    rope_config_t cfg = {D, max_ctx + 16, 1e6, ROPE_SCALING_NONE, 0, 0, 0, 0};
    MV_CHECK(rope_cache_build(&c->cache, &cfg));
    MV_CHECK(rope_cache_upload(&c->d_cache, &c->cache));
    c->w = gpu_alloc((size_t)2 * D * 2);
    gpu_upload(c->w, c->h_w, (size_t)2 * D * 2);
    const size_t pat = (size_t)4 << 20;  // big: 4 Mi bf16 of N(0, 1), repeated
    bf16_t *hp = big ? mv_xmalloc(pat * 2) : NULL;
    if (big) fill_normal_bf16(rng, hp, pat, 0.0f, 1.0f);
    for (int i = 0; i < 2; i++) {
        c->qkv[i] = gpu_alloc(c->qkv_n * 2);
        c->kc[i] = gpu_alloc(c->cache_n * 2);
        c->vc[i] = gpu_alloc(c->cache_n * 2);
        c->out[i] = gpu_alloc((size_t)S * H * D * 2);
        for (size_t off = 0; big && off < c->cache_n; off += pat) {
            const size_t len = c->cache_n - off < pat ? c->cache_n - off : pat;
            gpu_upload(c->kc[i] + off, hp, len * 2);
            gpu_upload(c->vc[i] + off, hp + (pat - len), len * 2);
        }
    }
    free(hp);
    c->d_lens = upload_i32(c->lens, (size_t)S);
    c->d_order = upload_order(c->lens, S);
    c->d_tables = upload_i32(c->tables, (size_t)S * c->mb);
    c->d_pos = upload_i32(c->pos, (size_t)S);
    c->d_slots = upload_i32(c->slots, (size_t)S);
    c->ws_bytes = attention_decode_workspace_bytes(S, H, D, ATTN_DECODE_MAX_SPLITS);
    c->ws = gpu_alloc(c->ws_bytes ? c->ws_bytes : 16);
    free(perm);
}

static void rcase_free(rcase_t *c) {
    for (int i = 0; i < 2; i++) gpu_free(c->qkv[i]), gpu_free(c->kc[i]), gpu_free(c->vc[i]), gpu_free(c->out[i]);
    gpu_free(c->w); gpu_free(c->d_lens); gpu_free(c->d_tables); gpu_free(c->d_pos); gpu_free(c->d_slots);
    gpu_free(c->d_order);
    gpu_free(c->ws);
    rope_cache_gpu_free(&c->d_cache);
    rope_cache_free(&c->cache);
    free(c->lens); free(c->tables); free(c->pos); free(c->slots);
    free(c->h_qkv); free(c->h_kc); free(c->h_vc); free(c->h_w);
}

// Set i's buffers back to the step's start (raw QKV, the caches, output poisoned).
static void rcase_reset(const rcase_t *c, int i) {
    gpu_upload(c->qkv[i], c->h_qkv, c->qkv_n * 2);
    if (c->h_kc) gpu_upload(c->kc[i], c->h_kc, c->cache_n * 2);
    if (c->h_vc) gpu_upload(c->vc[i], c->h_vc, c->cache_n * 2);
    gpu_poison(c->out[i], (size_t)c->S * c->H * c->D * 2);
}

typedef struct {
    const rcase_t *c;
    int which, version, splits, max_ctx_arg;  // which 0: the two kernels, 1: attention_decode_rope_cuda
} rrun_t;

static int run_rope(void *p, cudaStream_t stream) {
    const rrun_t *r = p;
    const rcase_t *c = r->c;
    const int i = r->which;
    const float scale = (float)(1.0 / sqrt((double)c->D));
    const attention_decode_rope_t rope = {c->w, c->w + c->D, c->d_pos, &c->d_cache, c->d_slots, 1e-6f};
    if (i == 1)
        return attention_decode_rope_cuda(r->version, r->splits, c->out[1], c->qkv[1], &rope, c->kc[1], c->vc[1],
                                          c->d_lens, c->d_tables, c->d_order, c->S, r->max_ctx_arg, c->H, c->Hkv, c->D,
                                          c->bs, c->nb, c->mb, scale, c->ws, c->ws_bytes, stream);
    return qk_norm_rope_store_cuda(c->qkv[0], c->w, c->w + c->D, c->d_pos, &c->d_cache, c->kc[0], c->vc[0], c->d_slots,
                                   c->S, c->H, c->Hkv, c->D, 1e-6f, c->bs, c->nb, stream) ||
           attention_decode_cuda(r->version, r->splits, c->out[0], c->qkv[0], c->qkv_stride, c->kc[0], c->vc[0],
                                 c->d_lens, c->d_tables, c->d_order, c->S, r->max_ctx_arg, c->H, c->Hkv, c->D, c->bs,
                                 c->nb, c->mb, scale, c->ws, c->ws_bytes, stream);
}

static int same_device_bytes(const void *a, const void *b, size_t n) {
    unsigned char *x = mv_xmalloc(n), *y = mv_xmalloc(n);
    gpu_download(x, a, n);
    gpu_download(y, b, n);
    const int same = !memcmp(x, y, n);
    free(x);
    free(y);
    return same;
}

// Every version, unsplit, in 3 pieces, automatic, and with a graph's bound:
// the one kernel against the two (output, K cache, V cache bit for bit),
// PDL off and on; then the one kernel's output against the CPU reference
// on the queries the two kernels normed and the caches the one kernel left.
static void check_decode_rope(harness_t *h, rng_t *rng, int S, int H, int Hkv, int D, int bs, int min_ctx,
                              int max_ctx) {
    rcase_t c;
    rcase_make(&c, rng, S, H, Hkv, D, bs, min_ctx, max_ctx, 0);
    const attention_decode_rope_t rope = {c.w, c.w + D, c.d_pos, &c.d_cache, c.d_slots, 1e-6f};
    char shape[160], what[320], detail[320];
    const size_t out_bytes = (size_t)S * H * D * 2;
    for (int v = 2; v <= ATTN_DECODE_NUM_VERSIONS; v++) {
        if (!harness_kernel_wanted(h, v)) continue;
        const int one = attention_decode_rope_fused(v, c.qkv[1], &rope, c.kc[1], c.vc[1], H, Hkv, D);
        snprintf(shape, sizeof shape, "S=%d (%d padded) ctx %d..%d H=%d/%d D=%d bs=%d (%s)", S, S - c.real,
                 S > 1 ? min_ctx : 1, max_ctx, H, Hkv, D, bs, one ? "one kernel" : "two kernels");
        const int splits[4] = {1, 3, 0, 3}, bound[4] = {max_ctx, max_ctx, max_ctx, max_ctx + 1000};
        for (int k = 0; k < 4; k++) {
            for (int pdl = 0; pdl <= (k == 2 ? mv_pdl_supported() : 0); pdl++) {
                rrun_t r[2] = {{&c, 0, v, splits[k], bound[k]}, {&c, 1, v, splits[k], bound[k]}};
                rcase_reset(&c, 0);
                rcase_reset(&c, 1);
                CUDA_CHECK(cudaDeviceSynchronize());
                if (pdl) MV_CHECK(mv_pdl_set(1));
                const int rc = run_rope(&r[0], 0) || run_rope(&r[1], 0);
                if (pdl) MV_CHECK(mv_pdl_set(0));
                snprintf(what, sizeof what, "decode+rope %s splits=%d%s%s: the bits of qk_norm_rope_store + %s",
                         attention_decode_version_name(v), splits[k], splits[k] == 0 ? "(auto)" : "",
                         bound[k] > max_ctx ? " max_ctx=longest+1000 (bound)" : pdl ? ", PDL" : "",
                         attention_decode_version_name(v));
                if (rc) {
                    snprintf(detail, sizeof detail, "%s: %s", shape, mv_last_error());
                    harness_check_bool(h, "gpu", "decode+rope", what, 0, detail);
                    continue;
                }
                CUDA_CHECK(cudaDeviceSynchronize());
                const int so = same_device_bytes(c.out[0], c.out[1], out_bytes);
                const int sk = same_device_bytes(c.kc[0], c.kc[1], c.cache_n * 2);
                const int sv = same_device_bytes(c.vc[0], c.vc[1], c.cache_n * 2);
                snprintf(detail, sizeof detail, "%s: output %s, K cache %s, V cache %s", shape,
                         so ? "identical" : "DIFFERS", sk ? "identical" : "DIFFERS", sv ? "identical" : "DIFFERS");
                harness_check_bool(h, "gpu", "decode+rope", what, so && sk && sv, detail);
            }
        }
    }
    // Against the CPU (the last run left both sides' buffers): the real rows'
    // queries as the two kernels normed and rotated them (chapter 05 checks
    // those), the caches the one kernel stored into.
    if (harness_kernel_wanted(h, ATTN_DECODE_FAST)) {
        rrun_t r = {&c, 0, ATTN_DECODE_FAST, 0, max_ctx};
        rcase_reset(&c, 0);
        rcase_reset(&c, 1);
        MV_CHECK(run_rope(&r, 0));
        r.which = 1;
        MV_CHECK(run_rope(&r, 0));
        CUDA_CHECK(cudaDeviceSynchronize());
        const size_t qrow = (size_t)H * D, n_out = (size_t)c.real * qrow;
        bf16_t *qkv = mv_xmalloc(c.qkv_n * 2), *kc = mv_xmalloc(c.cache_n * 2), *vc = mv_xmalloc(c.cache_n * 2);
        bf16_t *got = mv_xmalloc(out_bytes);
        gpu_download(qkv, c.qkv[0], c.qkv_n * 2);
        gpu_download(kc, c.kc[1], c.cache_n * 2);
        gpu_download(vc, c.vc[1], c.cache_n * 2);
        gpu_download(got, c.out[1], out_bytes);
        float *q = mv_xmalloc(sizeof(float) * (n_out ? n_out : 1)), *fk = mv_xmalloc(sizeof(float) * c.cache_n);
        float *fv = mv_xmalloc(sizeof(float) * c.cache_n), *ref = mv_xmalloc(sizeof(float) * (n_out ? n_out : 1));
        for (int s = 0; s < c.real; s++) bf16_to_float_array(q + s * qrow, qkv + (size_t)s * c.qkv_stride, qrow);
        bf16_to_float_array(fk, kc, c.cache_n);
        bf16_to_float_array(fv, vc, c.cache_n);
        MV_CHECK(attention_decode_cpu(ref, q, fk, fv, c.lens, c.tables, c.real, H, Hkv, D, bs, c.nb, c.mb,
                                      (float)(1.0 / sqrt((double)D)), 0));
        snprintf(what, sizeof what, "decode+rope %s: the one kernel against the CPU reference",
                 attention_decode_version_name(ATTN_DECODE_FAST));
        harness_check(h, "gpu", "decode+rope", what, shape, compare_bf16(what, got, ref, n_out, TOL_GPU, 0), TOL_GPU);
        free(qkv); free(kc); free(vc); free(got); free(q); free(fk); free(fv); free(ref);
    }
    rcase_free(&c);
}

// Timing at Qwen3-0.6B's heads: the two kernels against the one, as a
// decode graph launches them (version ATTN_DECODE_FAST, automatic pieces,
// the bound 4096). Bytes: the K and V the rows read, plus the QKV rows'
// q and k read and (two kernels) written, k and v stored.
static void time_decode_rope(harness_t *h, rng_t *rng, int S, int min_ctx, int max_ctx) {
    const int H = 16, Hkv = 8, D = 128, bs = 16;
    rcase_t c;
    rcase_make(&c, rng, S, H, Hkv, D, bs, min_ctx, max_ctx, 1);
    long long keys = 0;
    for (int s = 0; s < S; s++) keys += c.lens[s];
    const double bytes = (double)keys * Hkv * D * 2.0 * 2.0;
    char case_name[48], shape[128];
    snprintf(case_name, sizeof case_name, "decode+rope %dx%d-%d", S, min_ctx, max_ctx);
    snprintf(shape, sizeof shape, "S=%d ctx=U[%d,%d] (sum %lld) H=%d/%d D=%d bs=%d bound 4096", S, min_ctx, max_ctx,
             keys, H, Hkv, D, bs);
    const int bound = max_ctx > 4096 ? max_ctx : 4096;
    timing_opts_t opts = {5, h->quick ? 10 : 50, 1};
    for (int i = 0; i < 2; i++) {
        rcase_reset(&c, i);
        rrun_t r = {&c, i, ATTN_DECODE_FAST, 0, bound};
        harness_timing(h, case_name, i ? "attention_decode_rope (one kernel)" : "qk_norm_rope_store + decode",
                       shape, gpu_time_ms(run_rope, &r, opts), bytes, 0, 0);
    }
    rcase_free(&c);
}

// Causal pairs (query, key it sees) of S sequences of n new tokens over ctx
// keys: query i sees ctx - n + i + 1 keys.
static double causal_pairs(int S, int n, int ctx) { return (double)S * ((double)n * (ctx - n) + 0.5 * n * (n + 1.0)); }

// Prefill of S prompts of n tokens (no prefix), Qwen3-0.6B heads: every flash
// version paged and varlen checked against version 1 in the same layout, then timed. FLOPs:
// Q K^T and P V each 2 * D per (query head, causal pair): 4 * D * H * pairs.
static void time_prefill(harness_t *h, rng_t *rng, int S, int n, int naive_reps) {
    const int H = 16, Hkv = 8, D = 128, bs = 16;
    dcase_t d;
    dcase_make_big(&d, rng, S, n, n, 0, H, Hkv, D, bs);
    char case_name[48], shape[96];
    snprintf(case_name, sizeof case_name, "prefill %dx%d", S, n);
    snprintf(shape, sizeof shape, "S=%d n=%d causal H=%d/%d D=%d bs=%d", S, n, H, Hkv, D, bs);
    const double flops = 4.0 * D * H * causal_pairs(S, n, n);
    // The packed keys (d.kv) hold other random values than the paged caches,
    // so each layout is checked against version 1 in the same layout.
    run_t r1 = {RUN_PAGED, 1, 0, 0, &d, NULL}, r1_varlen = {RUN_VARLEN, 1, 0, 0, &d, NULL};
    float *ref = gpu_reference(&r1), *ref_varlen = gpu_reference(&r1_varlen);
    const tolerance_t tol = tol_vs_v1(1, d.max_abs_v);
    char label[64];
    snprintf(label, sizeof label, "paged %s", attention_prefill_version_name(1));
    if (harness_kernel_wanted(h, 1)) harness_timing(h, case_name, label, shape, time_run(h, &r1, naive_reps), 0, flops, 0);
    // Every flash version (2 and up), paged and varlen: checked, then timed.
    for (int v = 2; v <= ATTN_PREFILL_NUM_VERSIONS; v++) {
        if (!harness_kernel_wanted(h, v)) continue;  // --kernel N: version N alone
        run_t paged = {RUN_PAGED, v, 0, 0, &d, NULL}, varlen = {RUN_VARLEN, v, 0, 0, &d, NULL};
        check_run(h, case_name, &paged, ref, tol, shape, 0);
        check_run(h, case_name, &varlen, ref_varlen, tol, shape, 0);
        snprintf(label, sizeof label, "paged %s", attention_prefill_version_name(v));
        harness_timing(h, case_name, label, shape, time_run(h, &paged, 50), 0, flops, 0);
        snprintf(label, sizeof label, "varlen %s", attention_prefill_version_name(v));
        harness_timing(h, case_name, label, shape, time_run(h, &varlen, 50), 0, flops, 0);
    }
    free(ref);
    free(ref_varlen);
    dcase_free(&d);
}
#endif

int main(int argc, char **argv) {
    harness_t h;
    // MV_DECODE_PIECES moves version 4's band (kernels/attention.h); any other
    // value than 0, 4 or 8 is refused here, as the engine refuses it, rather
    // than read as unset.
    const char *pieces = getenv("MV_DECODE_PIECES");
    if (pieces && strcmp(pieces, "0") && strcmp(pieces, "4") && strcmp(pieces, "8")) {
        fprintf(stderr, "07-attention: MV_DECODE_PIECES=%s: it takes 0 (no pieces for version 4's band), 4 (pieces "
                        "up to 4 blocks a SM, the default) or 8 (up to 8)\n", pieces);
        return 2;
    }
    static const harness_kernel_t kernels[] = {
        {"prefill", ATTN_PREFILL_VERSION_TABLE}, {"decode", ATTN_DECODE_VERSION_TABLE}, {NULL, NULL}};
    harness_begin_kernels(&h, "07-attention",
                          "attention over the paged KV cache: prefill (prefix hits, chunks) and decode, GQA; fp32 math",
                          argc, argv, kernels);
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

#if MV_HAVE_CUDA
    if (h.use_gpu) {
        harness_section(&h, "CUDA versions against the CPU reference: the same ragged batches, prefill paged and "
                            "varlen, decode unsplit, in 3 pieces, automatic, with max_context_len an upper bound");
        for (int b = 0; b < 5; b++)
            for (int g = 0; g < 4; g++)
                check_gpu_ragged(&h, &rng, block_sizes[b], gqa[g].H, gqa[g].Hkv, (b + g) % 2 ? 128 : 64);
        harness_section(&h, "CUDA versions on long sequences: many key and query tiles, up to 64 decode pieces");
        // Under --checks-only (compute-sanitizer) the long case shrinks: the
        // sanitizer slows kernels 10-100x.
        check_gpu_long(&h, &rng, 16, 16, 8, 128, h.checks_only);
        check_gpu_long(&h, &rng, 64, 8, 2, 64, h.checks_only);
        harness_section(&h, "Decode version 7's row order: any order gives version 4's bits");
        check_gpu_order(&h, &rng);
        harness_section(&h, "CUDA launchers: bad arguments are refused with a message");
        check_gpu_rejections(&h);
        harness_section(&h, "Decode with q/k norm, RoPE and the KV store (attention_decode_rope_cuda) against "
                            "qk_norm_rope_store + decode, bit for bit, and the CPU reference");
        // {S, H, Hkv, D, bs, min_ctx, max_ctx}: Qwen3-0.6B's heads, the tiny
        // checkpoints' head_dim 64, GQA 1 and 8, a group of 3 (two kernels:
        // one CTA does not cover a kv head), long rows in many pieces, and
        // 160 rows, more blocks than one wave (version 7 takes its order).
        static const struct { int S, H, Hkv, D, bs, lo, hi; } rc[] = {
            {1, 16, 8, 128, 16, 1, 1},   {2, 16, 8, 128, 16, 2, 40},  {9, 16, 8, 128, 16, 2, 300},
            {9, 4, 2, 64, 32, 2, 200},   {5, 4, 4, 128, 16, 2, 100},  {5, 8, 1, 64, 64, 2, 130},
            {5, 6, 2, 64, 16, 2, 90},    {4, 16, 8, 128, 256, 900, 1500}, {160, 16, 8, 128, 16, 2, 300},
        };
        for (size_t i = 0; i < sizeof rc / sizeof rc[0]; i++)
            check_decode_rope(&h, &rng, rc[i].S, rc[i].H, rc[i].Hkv, rc[i].D, rc[i].bs, rc[i].lo, rc[i].hi);
        if (h.do_timing) {
            harness_section(&h, "Decode at Qwen3-0.6B's heads (16 q, 8 kv, D 128): GB/s of K and V read");
            time_decode(&h, &rng, 256, 1024, 0, 75.0);
            time_decode(&h, &rng, 1, 1024, 0, 0);
            time_decode(&h, &rng, 1, 640, 0, 0);
            time_decode(&h, &rng, 1, 16384, 0, 0);
            time_decode(&h, &rng, 64, 4096, 0, 0);
            // Mixed lengths, as nano-vllm's workload has them in decode
            // (prompts and outputs of 100 to 1,024 tokens): the longest
            // row's block against the batch's total.
            time_decode(&h, &rng, 256, 2048, 100, 0);
            time_decode(&h, &rng, 64, 2048, 100, 0);
            harness_section(&h, "Decode with q/k norm, RoPE and the store in its pieces, against the two kernels "
                                "(Qwen3-0.6B's heads, version 4 as a decode graph launches it)");
            time_decode_rope(&h, &rng, 256, 100, 2048);
            time_decode_rope(&h, &rng, 64, 100, 2048);
            time_decode_rope(&h, &rng, 8, 100, 2048);
            harness_section(&h, "Prefill, causal, Qwen3-0.6B's heads: TFLOP/s of 4*D*H*(causal pairs)");
            time_prefill(&h, &rng, 16, 1024, 3);
            time_prefill(&h, &rng, 1, 8192, 1);
            time_prefill(&h, &rng, 64, 256, 5);
        }
    }
#endif
    return harness_end(&h);
}

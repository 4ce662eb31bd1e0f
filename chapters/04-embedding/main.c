/*
 * chapters/04-embedding/main.c - Chapter 04: vocabulary-parallel token
 * embedding and LM head.
 *
 * What it checks:
 *   1. The CPU reference (reference/embedding.c): hand-computed lookups,
 *      rejection of ids outside [0, vocab_size) and of bad cu_seqlens, the
 *      last-token selection; a CPU simulation of tp = 1, 2, 4, 8 with a
 *      vocabulary that tp does not divide (padding), where the summed masked
 *      lookups and the assembled logit slices must equal the unsharded ones
 *      exactly. This half always runs (CI).
 *   2. On the GPU, Qwen3-0.6B's table (151936 x 1024, tied with the LM head)
 *      and a small untied one with padding: with N >= 2 GPUs tp = N over
 *      NCCL (all-reduce of the embedding, logits gathered to rank 0), with
 *      one GPU tp = 1 and tp = 2 with both shards on that GPU. Prefill
 *      projects only each sequence's last token (through cu_seqlens),
 *      decode every token.
 *   3. Timing: the embedding gather in GB/s, the LM head in TFLOP/s and GB/s
 *      at M = 1 to 256, and with 2+ GPUs each rank's slice and the gather.
 *
 * Build and run:  make && ./build/04-embedding [--json FILE] [--help]
 * Exit status: 0 if every check passed, 1 if any failed, 2 on bad arguments.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chapters/04-embedding/vocab_parallel.h"
#include "common/bf16.h"
#include "common/check.h"
#include "common/compare.h"
#include "common/harness.h"
#include "common/rng.h"
#include "reference/embedding.h"
#include "reference/linear.h"
#if MV_HAVE_CUDA
#include "common/tp_group.h"
#include "kernels/embedding.h"
#include "kernels/linear.h"
#endif

static const tolerance_t TOL_EXACT = {0, 0, 0,
    "an embedding lookup copies a row, and adding zero rows from the other ranks is exact; "
    "a logit slice is the same dot product as in the unsharded head: identical results"};

// ---- 1. the CPU half ---------------------------------------------------------------------

static void check_hand_values(harness_t *h) {
    float tf[6] = {1, 2, 3, 4, 5, 6};
    bf16_t table[6];
    float_to_bf16_array(table, tf, 6);
    int32_t ids[3] = {2, 0, 2};
    float out[6];
    double want[6] = {5, 6, 1, 2, 5, 6};
    MV_CHECK(embedding_cpu(out, ids, table, 3, 2, 0, 3));
    harness_check(h, "cpu", "hand-values", "embedding_cpu", "T=3 vocab=3 H=2", compare_f64("emb", out, want, 6, TOL_EXACT, 0), TOL_EXACT);
    // The slice [1, 3) of the same table: id 0 belongs to another rank -> zeros.
    double want_slice[6] = {5, 6, 0, 0, 5, 6};
    MV_CHECK(embedding_cpu(out, ids, table + 2, 3, 2, 1, 3));
    harness_check(h, "cpu", "hand-values", "embedding_cpu masked", "rows [1, 3)", compare_f64("emb", out, want_slice, 6, TOL_EXACT, 0), TOL_EXACT);
    // Last tokens: cu_seqlens {0, 2, 5} picks rows 1 and 4.
    float hidden[10] = {0, 0, 1, 1, 2, 2, 3, 3, 4, 4}, sel[4];
    int32_t cu[3] = {0, 2, 5};
    double want_sel[4] = {1, 1, 4, 4};
    MV_CHECK(gather_last_tokens_cpu(sel, hidden, cu, 2, 5, 2));
    harness_check(h, "cpu", "hand-values", "gather_last_tokens_cpu", "S=2 T=5", compare_f64("sel", sel, want_sel, 4, TOL_EXACT, 0), TOL_EXACT);
}

static void expect_error(harness_t *h, const char *what, int rc, const char *must_mention) {
    char detail[320];
    snprintf(detail, sizeof detail, "%s", rc ? mv_last_error() : "accepted (wrong)");
    harness_check_bool(h, "cpu", "reject", what, rc != 0 && strstr(mv_last_error(), must_mention) != NULL, detail);
}

static void check_rejections(harness_t *h) {
    int32_t bad_neg[3] = {5, -1, 7}, bad_big[2] = {0, 151936}, ok[2] = {0, 151935};
    expect_error(h, "id < 0", embedding_validate_ids(bad_neg, 3, 151936), "position 1");
    expect_error(h, "id >= vocab_size", embedding_validate_ids(bad_big, 2, 151936), "151936");
    harness_check_bool(h, "cpu", "accept", "ids 0 and vocab-1", embedding_validate_ids(ok, 2, 151936) == 0, "");
    int32_t cu_empty[3] = {0, 3, 3}, cu_start[3] = {1, 2, 5}, cu_total[3] = {0, 2, 4};
    expect_error(h, "empty sequence", cu_seqlens_validate(cu_empty, 2, 3), "empty");
    expect_error(h, "cu_seqlens[0] != 0", cu_seqlens_validate(cu_start, 2, 5), "cu_seqlens[0]");
    expect_error(h, "cu_seqlens[S] != T", cu_seqlens_validate(cu_total, 2, 5), "tokens");
    vocab_shard_t v;
    MV_CHECK(vocab_shard_init(&v, 1001, 2, 1));
    bf16_t *t = calloc(1000 * 64, sizeof(bf16_t)), *local = calloc((size_t)v.local_rows * 64, sizeof(bf16_t));
    if (!t || !local) mv_die_at(__FILE__, __LINE__, "calloc", "out of host memory");
    expect_error(h, "table shape", vocab_shard_load(&v, "model.embed_tokens.weight", t, 1000, 64, 64, local), "embed_tokens");
    free(t);
    free(local);
    expect_error(h, "tp rank out of range", vocab_shard_init(&v, 1001, 2, 2), "rank");
}

// tp ranks on the CPU: masked lookups summed, logit slices scattered.
static void simulate_tp(harness_t *h, rng_t *rng, int vocab, int H, int tp, int T) {
    bf16_t *table = malloc((size_t)vocab * H * sizeof(bf16_t));
    int32_t *ids = malloc(sizeof(int32_t) * T);
    float *ref = malloc(sizeof(float) * T * H), *sum = calloc((size_t)T * H, sizeof(float)), *part = malloc(sizeof(float) * T * H);
    float *x = malloc(sizeof(float) * T * H), *logits = malloc(sizeof(float) * T * vocab), *got = malloc(sizeof(float) * T * vocab);
    if (!table || !ids || !ref || !sum || !part || !x || !logits || !got) mv_die_at(__FILE__, __LINE__, "malloc", "out of host memory");
    fill_uniform_bf16(rng, table, (size_t)vocab * H, -1, 1);
    for (int t = 0; t < T; t++) ids[t] = rng_int(rng, 0, vocab - 1);
    ids[0] = 0;
    ids[T - 1] = vocab - 1;  // the first and last rows, where slices begin and end
    MV_CHECK(embedding_cpu(ref, ids, table, T, H, 0, vocab));
    fill_normal_f32(rng, x, (size_t)T * H, 0, 1);
    MV_CHECK(linear_cpu(logits, x, table, NULL, T, vocab, H, 1));
    poison_host(got, sizeof(float) * T * vocab);
    int padded = 0;
    for (int r = 0; r < tp; r++) {
        vocab_shard_t v;
        MV_CHECK(vocab_shard_init(&v, vocab, tp, r));
        padded = v.padded;
        bf16_t *local = malloc((size_t)v.local_rows * H * sizeof(bf16_t));
        float *lg = malloc(sizeof(float) * T * v.local_rows);
        if (!local || !lg) mv_die_at(__FILE__, __LINE__, "malloc", "out of host memory");
        MV_CHECK(vocab_shard_load(&v, "embed_tokens", table, vocab, H, H, local));
        MV_CHECK(embedding_cpu(part, ids, local, T, H, v.start, v.real_end));
        for (size_t i = 0; i < (size_t)T * H; i++) sum[i] += part[i];
        MV_CHECK(linear_cpu(lg, x, local, NULL, T, v.local_rows, H, 1));
        MV_CHECK(vocab_shard_scatter_logits(&v, lg, T, got));
        free(local);
        free(lg);
    }
    char shape[80];
    snprintf(shape, sizeof shape, "tp=%d vocab=%d (padded %d) H=%d T=%d", tp, vocab, padded, H, T);
    harness_check(h, "cpu", "tp-sim", "embedding (sum of ranks)", shape, compare_f32("embedding", sum, ref, (size_t)T * H, TOL_EXACT, 0), TOL_EXACT);
    harness_check(h, "cpu", "tp-sim", "lm head (slices, trimmed)", shape, compare_f32("logits", got, logits, (size_t)T * vocab, TOL_EXACT, 0), TOL_EXACT);
    free(table); free(ids); free(ref); free(sum); free(part); free(x); free(logits); free(got);
}

// ---- 2. and 3. the GPU half ------------------------------------------------------------
#if MV_HAVE_CUDA
static tolerance_t tol_logits(double ref_rms) {
    return (tolerance_t){1e-5 * ref_rms + 1e-6, BF16_HALF_ULP + 1e-5, BF16_HALF_ULP * BF16_HALF_ULP * 1.01,
        "bf16 logits: half an ulp, 2^-8 relative; cuBLAS's fp32 accumulation order differs from "
        "the CPU's by ~sqrt(H) * 2^-24 * sum|x*w|, far below that"};
}

typedef struct {
    const char *name;
    int vocab, H, tied;
} vocab_config_t;

typedef struct {
    vocab_shard_t v[TP_GROUP_MAX];
    bf16_t *d_table[TP_GROUP_MAX];  // [local_rows, H] on rank r's device
    bf16_t *d_lm[TP_GROUP_MAX];     // the LM head slice: == d_table when tied
} vocab_ranks_t;

static void upload_ranks(tp_group_t *g, const vocab_config_t *c, const bf16_t *table, const bf16_t *lm, vocab_ranks_t *vr) {
    for (int r = 0; r < g->size; r++) {
        vocab_shard_t *v = &vr->v[r];
        MV_CHECK(vocab_shard_init(v, c->vocab, g->size, r));
        size_t n = (size_t)v->local_rows * c->H;
        bf16_t *local = malloc(n * sizeof(bf16_t));
        if (!local) mv_die_at(__FILE__, __LINE__, "malloc", "out of host memory");
        MV_CHECK(tp_set_rank(g, r));
        MV_CHECK(vocab_shard_load(v, "model.embed_tokens.weight", table, c->vocab, c->H, c->H, local));
        vr->d_table[r] = gpu_alloc(n * sizeof(bf16_t));
        gpu_upload(vr->d_table[r], local, n * sizeof(bf16_t));
        if (c->tied) {
            vr->d_lm[r] = vr->d_table[r];  // tie_word_embeddings: one buffer serves both
        } else {
            MV_CHECK(vocab_shard_load(v, "lm_head.weight", lm, c->vocab, c->H, c->H, local));
            vr->d_lm[r] = gpu_alloc(n * sizeof(bf16_t));
            gpu_upload(vr->d_lm[r], local, n * sizeof(bf16_t));
        }
        free(local);
    }
    MV_CHECK(tp_set_rank(g, 0));
}

static void free_ranks(tp_group_t *g, const vocab_config_t *c, vocab_ranks_t *vr) {
    for (int r = 0; r < g->size; r++) {
        MV_CHECK(tp_set_rank(g, r));
        if (!c->tied) gpu_free(vr->d_lm[r]);
        gpu_free(vr->d_table[r]);
    }
    MV_CHECK(tp_set_rank(g, 0));
}

static void check_embedding(harness_t *h, rng_t *rng, tp_group_t *g, const char *mode, const vocab_config_t *c,
                            const bf16_t *table, vocab_ranks_t *vr, int T) {
    int32_t *ids = malloc(sizeof(int32_t) * T);
    float *ref = malloc(sizeof(float) * T * c->H);
    bf16_t *got = malloc(sizeof(bf16_t) * T * c->H);
    if (!ids || !ref || !got) mv_die_at(__FILE__, __LINE__, "malloc", "out of host memory");
    for (int t = 0; t < T; t++) ids[t] = rng_int(rng, 0, c->vocab - 1);
    ids[0] = 0;
    ids[T - 1] = c->vocab - 1;
    MV_CHECK(embedding_validate_ids(ids, T, c->vocab));  // before any kernel runs
    MV_CHECK(embedding_cpu(ref, ids, table, T, c->H, 0, c->vocab));
    int32_t *d_ids[TP_GROUP_MAX];
    bf16_t *d_out[TP_GROUP_MAX];
    for (int r = 0; r < g->size; r++) {
        MV_CHECK(tp_set_rank(g, r));
        d_ids[r] = gpu_alloc(sizeof(int32_t) * T);
        d_out[r] = gpu_alloc(sizeof(bf16_t) * T * c->H);
        gpu_upload(d_ids[r], ids, sizeof(int32_t) * T);
        gpu_poison(d_out[r], sizeof(bf16_t) * T * c->H);
        CUDA_CHECK(cudaDeviceSynchronize());
        MV_CHECK(embedding_cuda(d_out[r], d_ids[r], vr->d_table[r], T, c->H, vr->v[r].start, vr->v[r].real_end,
                                g->streams[r]));
    }
    if (g->size > 1) MV_CHECK(tp_all_reduce_bf16(g, d_out, (size_t)T * c->H));
    MV_CHECK(tp_sync(g));
    for (int r = 0; r < g->size; r++) {
        MV_CHECK(tp_set_rank(g, r));
        gpu_download(got, d_out[r], sizeof(bf16_t) * T * c->H);
        char label[96], shape[80];
        snprintf(label, sizeof label, "embedding %s rank %d/%d", mode, r, g->size);
        snprintf(shape, sizeof shape, "%s T=%d", c->name, T);
        harness_check(h, "gpu", "embedding", label, shape, compare_bf16(label, got, ref, (size_t)T * c->H, TOL_EXACT, 0), TOL_EXACT);
        gpu_free(d_ids[r]);
        gpu_free(d_out[r]);
    }
    MV_CHECK(tp_set_rank(g, 0));
    free(ids); free(ref); free(got);
}

// LM head: prefill (cu_seqlens given: last token of each sequence) or decode
// (cu = NULL: every token). Hidden states [T, H] are random; logits [S, vocab]
// end on rank 0.
static void check_lm_head(harness_t *h, rng_t *rng, tp_group_t *g, const char *mode, const vocab_config_t *c,
                          const bf16_t *lm_full, vocab_ranks_t *vr, int T, const int32_t *cu, int S) {
    int M = cu ? S : T;
    bf16_t *hid = malloc(sizeof(bf16_t) * T * c->H), *got = malloc(sizeof(bf16_t) * M * c->vocab);
    float *hf = malloc(sizeof(float) * T * c->H), *sel = malloc(sizeof(float) * M * c->H), *ref = malloc(sizeof(float) * M * c->vocab);
    if (!hid || !got || !hf || !sel || !ref) mv_die_at(__FILE__, __LINE__, "malloc", "out of host memory");
    fill_normal_bf16(rng, hid, (size_t)T * c->H, 0, 1);
    bf16_to_float_array(hf, hid, (size_t)T * c->H);
    if (cu) MV_CHECK(gather_last_tokens_cpu(sel, hf, cu, S, T, c->H));
    else memcpy(sel, hf, sizeof(float) * T * c->H);
    MV_CHECK(linear_cpu(ref, sel, lm_full, NULL, M, c->vocab, c->H, 0));

    bf16_t *d_hid[TP_GROUP_MAX], *d_sel[TP_GROUP_MAX], *d_lg[TP_GROUP_MAX];
    int32_t *d_cu[TP_GROUP_MAX];
    const int L = vr->v[0].local_rows;
    for (int r = 0; r < g->size; r++) {
        MV_CHECK(tp_set_rank(g, r));
        d_hid[r] = gpu_alloc(sizeof(bf16_t) * T * c->H);
        d_sel[r] = gpu_alloc(sizeof(bf16_t) * M * c->H);
        d_lg[r] = gpu_alloc(sizeof(bf16_t) * M * L);
        d_cu[r] = cu ? gpu_alloc(sizeof(int32_t) * (S + 1)) : NULL;
        gpu_upload(d_hid[r], hid, sizeof(bf16_t) * T * c->H);
        if (cu) gpu_upload(d_cu[r], cu, sizeof(int32_t) * (S + 1));
        CUDA_CHECK(cudaDeviceSynchronize());
        const bf16_t *x = d_hid[r];
        if (cu) {
            MV_CHECK(gather_last_tokens_cuda(d_sel[r], d_hid[r], d_cu[r], S, c->H, g->streams[r]));
            x = d_sel[r];
        }
        MV_CHECK(linear_cuda(g->cublas[r], d_lg[r], x, vr->d_lm[r], NULL, M, L, c->H, g->streams[r]));
    }
    MV_CHECK(tp_set_rank(g, 0));
    bf16_t *d_gathered = gpu_alloc(sizeof(bf16_t) * g->size * M * L), *d_logits = gpu_alloc(sizeof(bf16_t) * M * c->vocab);
    gpu_poison(d_logits, sizeof(bf16_t) * M * c->vocab);
    CUDA_CHECK(cudaDeviceSynchronize());
    MV_CHECK(tp_gather_bf16(g, (const bf16_t *const *)d_lg, d_gathered, (size_t)M * L));
    MV_CHECK(vocab_assemble_logits_cuda(&vr->v[0], d_gathered, M, d_logits, g->streams[0]));
    MV_CHECK(tp_sync(g));
    gpu_download(got, d_logits, sizeof(bf16_t) * M * c->vocab);
    double ss = 0;
    for (size_t i = 0; i < (size_t)M * c->vocab; i++) ss += (double)ref[i] * ref[i];
    tolerance_t tol = tol_logits(sqrt(ss / ((double)M * c->vocab)));
    char label[96], shape[96];
    snprintf(label, sizeof label, "lm head %s %s -> rank 0", cu ? "prefill" : "decode", mode);
    snprintf(shape, sizeof shape, "%s %s=%d", c->name, cu ? "seqs" : "M", M);
    harness_check(h, "gpu", "lm-head", label, shape, compare_bf16(label, got, ref, (size_t)M * c->vocab, tol, 0), tol);
    for (int r = 0; r < g->size; r++) {
        MV_CHECK(tp_set_rank(g, r));
        gpu_free(d_hid[r]); gpu_free(d_sel[r]); gpu_free(d_lg[r]); gpu_free(d_cu[r]);
    }
    MV_CHECK(tp_set_rank(g, 0));
    gpu_free(d_gathered); gpu_free(d_logits);
    free(hid); free(got); free(hf); free(sel); free(ref);
}

typedef struct {
    bf16_t *d_out, *d_table, *d_w, *d_x;
    int32_t *d_ids;
    int T, H, vocab;
    cublasHandle_t handle;
} time_ctx_t;

static int run_embedding(void *p, cudaStream_t s) {
    time_ctx_t *c = p;
    return embedding_cuda(c->d_out, c->d_ids, c->d_table, c->T, c->H, 0, c->vocab, s);
}

static int run_lm_head(void *p, cudaStream_t s) {
    time_ctx_t *c = p;
    return linear_cuda(c->handle, c->d_out, c->d_x, c->d_w, NULL, c->T, c->vocab, c->H, s);
}

typedef struct {
    bf16_t *send[TP_GROUP_MAX], *recv;
    size_t count;
} gather_ctx_t;

static int run_gather(tp_group_t *g, void *p) {
    gather_ctx_t *c = p;
    return tp_gather_bf16(g, (const bf16_t *const *)c->send, c->recv, c->count);
}

static void time_all(harness_t *h, rng_t *rng, const vocab_config_t *c, const bf16_t *table, tp_group_t *real) {
    timing_opts_t opts = {5, h->quick ? 10 : 50, 1};
    time_ctx_t t = {0};
    t.H = c->H;
    t.vocab = c->vocab;
    t.d_table = gpu_alloc((size_t)c->vocab * c->H * sizeof(bf16_t));
    gpu_upload(t.d_table, table, (size_t)c->vocab * c->H * sizeof(bf16_t));
    int Ts[] = {1, 256, 8192, 65536};
    char shape[64];
    for (int i = 0; i < 4; i++) {
        t.T = Ts[i];
        int32_t *ids = malloc(sizeof(int32_t) * t.T);
        if (!ids) mv_die_at(__FILE__, __LINE__, "malloc", "out of host memory");
        for (int k = 0; k < t.T; k++) ids[k] = rng_int(rng, 0, c->vocab - 1);
        t.d_ids = gpu_alloc(sizeof(int32_t) * t.T);
        t.d_out = gpu_alloc(sizeof(bf16_t) * t.T * c->H);
        gpu_upload(t.d_ids, ids, sizeof(int32_t) * t.T);
        double ms = gpu_time_ms(run_embedding, &t, opts);
        snprintf(shape, sizeof shape, "T=%d H=%d", t.T, c->H);
        // Bytes: each token's row read and written, plus its id.
        harness_timing(h, "embedding", "embedding_cuda (tp=1)", shape, ms, (double)t.T * (c->H * 4.0 + 4), 0, 0);
        gpu_free(t.d_ids); gpu_free(t.d_out);
        free(ids);
    }
    CUBLAS_CHECK(cublasCreate(&t.handle));
    int Ms[] = {1, 8, 64, 256};
    for (int tp = 1; tp <= 2; tp++) {
        vocab_shard_t v;
        MV_CHECK(vocab_shard_init(&v, c->vocab, tp, 0));
        t.vocab = v.local_rows;
        t.d_w = t.d_table;  // rank 0's slice is the first local_rows rows
        for (int i = 0; i < 4; i++) {
            t.T = Ms[i];
            bf16_t *hx = malloc(sizeof(bf16_t) * t.T * c->H);
            if (!hx) mv_die_at(__FILE__, __LINE__, "malloc", "out of host memory");
            fill_normal_bf16(rng, hx, (size_t)t.T * c->H, 0, 1);
            t.d_x = gpu_alloc(sizeof(bf16_t) * t.T * c->H);
            t.d_out = gpu_alloc(sizeof(bf16_t) * t.T * t.vocab);
            gpu_upload(t.d_x, hx, sizeof(bf16_t) * t.T * c->H);
            double ms = gpu_time_ms(run_lm_head, &t, opts);
            snprintf(shape, sizeof shape, "M=%d vocab=%d H=%d", t.T, t.vocab, c->H);
            double bytes = 2.0 * ((double)t.vocab * c->H + (double)t.T * c->H + (double)t.T * t.vocab);
            harness_timing(h, "lm-head", tp == 1 ? "lm head tp=1" : "lm head tp=2 rank shard", shape, ms, bytes,
                           2.0 * t.T * t.vocab * c->H, 0);
            gpu_free(t.d_x); gpu_free(t.d_out);
            free(hx);
        }
    }
    CUBLAS_CHECK(cublasDestroy(t.handle));
    gpu_free(t.d_table);
    if (real) {  // the logits' trip to rank 0
        for (int i = 0; i < 4; i++) {
            vocab_shard_t v;
            MV_CHECK(vocab_shard_init(&v, c->vocab, real->size, 0));
            gather_ctx_t gc = {{0}, NULL, (size_t)Ms[i] * v.local_rows};
            for (int r = 0; r < real->size; r++) {
                MV_CHECK(tp_set_rank(real, r));
                gc.send[r] = gpu_alloc(gc.count * sizeof(bf16_t));
                CUDA_CHECK(cudaMemset(gc.send[r], 0x3c, gc.count * sizeof(bf16_t)));
            }
            MV_CHECK(tp_set_rank(real, 0));
            gc.recv = gpu_alloc(gc.count * real->size * sizeof(bf16_t));
            double ms = tp_time_ms(real, run_gather, &gc, 5, h->quick ? 10 : 50);
            snprintf(shape, sizeof shape, "M=%d x %d bf16 per rank", Ms[i], v.local_rows);
            char label[64];
            snprintf(label, sizeof label, "nccl gather to rank 0, %d GPUs", real->size);
            // Bytes: what crosses to rank 0 (the other ranks' slices).
            harness_timing(h, "logits-gather", label, shape, ms, (double)gc.count * sizeof(bf16_t) * (real->size - 1), 0, 0);
            for (int r = 0; r < real->size; r++) {
                MV_CHECK(tp_set_rank(real, r));
                gpu_free(gc.send[r]);
            }
            MV_CHECK(tp_set_rank(real, 0));
            gpu_free(gc.recv);
        }
    }
}
#endif

int main(int argc, char **argv) {
    harness_t h;
    // One version of each kernel here (embedding_cuda, gather_last_tokens_cuda,
    // vocab_assemble_logits_cuda; the LM head is chapter 03's linear_cuda):
    // --kernel 1 runs everything, as no --kernel does.
    static const kernel_version_t ONE_VERSION[] = {{1, "v1 (the only version of each kernel here)"}, {0, NULL}};
    static const harness_kernel_t kernels[] = {{"embedding", ONE_VERSION}, {NULL, NULL}};
    harness_begin_kernels(&h, "04-embedding",
                          "vocabulary-parallel embedding and LM head (masked lookups, all-reduce, logits to rank 0)",
                          argc, argv, kernels);
    rng_t rng;
    rng_seed(&rng, h.seed);

    harness_section(&h, "CPU reference: hand values, rejections, tp = 1, 2, 4, 8 simulated");
    check_hand_values(&h);
    check_rejections(&h);
    int tps[] = {1, 2, 4, 8};
    for (int i = 0; i < 4; i++) simulate_tp(&h, &rng, 1001, 64, tps[i], 37);

#if MV_HAVE_CUDA
    if (h.use_gpu) {
        tp_check_groups_t groups;
        MV_CHECK(tp_check_groups_init(&groups, h.gpu.device_count));
        static const vocab_config_t configs[] = {
            {"qwen3-0.6b 151936x1024 tied", 151936, 1024, 1},
            {"small 1001x64 untied", 1001, 64, 0},
        };
        harness_section(&h, groups.real ? "GPU: tp = number of GPUs over NCCL"
                                        : "GPU: tp = 1, and tp = 2 with both shards on this GPU");
        for (int ci = 0; ci < 2; ci++) {
            const vocab_config_t *c = &configs[ci];
            size_t n = (size_t)c->vocab * c->H;
            bf16_t *table = malloc(n * sizeof(bf16_t)), *lm = c->tied ? table : malloc(n * sizeof(bf16_t));
            if (!table || !lm) mv_die_at(__FILE__, __LINE__, "malloc", "out of host memory");
            // Qwen3's embeddings are small (std ~0.03); the scale does not matter for a copy.
            fill_normal_bf16(&rng, table, n, 0, 0.05f);
            if (!c->tied) fill_normal_bf16(&rng, lm, n, 0, 0.05f);
            for (int gi = 0; gi < groups.n; gi++) {
                tp_group_t *g = &groups.group[gi];
                const char *mode = groups.mode[gi];
                vocab_ranks_t vr;
                upload_ranks(g, c, table, lm, &vr);
                if (c->tied)
                    harness_check_bool(&h, "gpu", "tied", mode, vr.d_lm[0] == vr.d_table[0],
                                       "tie_word_embeddings: the LM head uses the embedding's device buffer");
                check_embedding(&h, &rng, g, mode, c, table, &vr, 1);
                check_embedding(&h, &rng, g, mode, c, table, &vr, 333);
                int32_t cu[6] = {0, 1, 8, 24, 57, 157};  // 5 sequences: 1, 7, 16, 33, 100 tokens
                check_lm_head(&h, &rng, g, mode, c, lm, &vr, 157, cu, 5);
                check_lm_head(&h, &rng, g, mode, c, lm, &vr, 8, NULL, 0);
                check_lm_head(&h, &rng, g, mode, c, lm, &vr, 1, NULL, 0);
                free_ranks(g, c, &vr);
            }
            if (ci == 0 && h.do_timing) {
                harness_section(&h, "Timing on GPU 0: Qwen3-0.6B embedding and LM head");
                time_all(&h, &rng, c, table, groups.real ? &groups.group[0] : NULL);
            }
            if (!c->tied) free(lm);
            free(table);
        }
        tp_check_groups_destroy(&groups);
    }
#endif
    return harness_end(&h);
}

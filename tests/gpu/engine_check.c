/*
 * tests/gpu/engine_check.c - the engine's cuda backend against Hugging Face
 * transformers, and the GPU sampler against its CPU reference: build/engine_check.
 *
 * The GPU half of tests/test_engine_cpu.c (which CI runs on the cpu
 * backend). On a GPU machine:
 *     make && ./build/engine_check                # --device cuda
 *     ./build/engine_check --device cpu           # the same cases on the cpu backend
 * One line per case, PASS / NEAR-TIE / SKIP / FAIL; exit 1 if any FAIL.
 *
 * 1. Golden ids: tests/data/tiny-qwen3-* (golden.json, made by
 *    tests/data/make_tiny_qwen3.py in float32) run one request at a time,
 *    all in one batch, with prefix-cache hits, with chunked prefill (16
 *    tokens per step), with preemption, and with the KV cache sized from
 *    --gpu-memory-utilization; plus the first-step logits by NMSE.
 *    The cpu backend must give exactly HF's ids. The cuda backend computes
 *    in bf16, and HF's greedy choice is sometimes a near tie (golden.json
 *    records the top-2 margin of every step: some are below 0.01): a bf16
 *    run may take the other token there, and the rest of that sequence is
 *    then a different (equally valid) continuation. So a cuda case is
 *      PASS      every id equal,
 *      NEAR-TIE  equal up to the first difference, and there HF's top-2
 *                margin is below BF16_MARGIN_TOL (listed, never hidden),
 *      FAIL      any difference where HF's margin was larger.
 *    The CUDA attention kernels take head_dim 64 or 128 and block_size a
 *    power of two in [16, 256]: the three checkpoints have head_dim 64, 128
 *    and 64, so all run on both backends (a checkpoint the cuda backend
 *    refuses is a FAIL with its reason); the block sizes here are 16.
 *    The cuda engines replay decode steps from CUDA graphs, or with
 *    --enforce-eager launch them kernel by kernel (run both).
 * 1b. CUDA graphs against eager launches (graphs on only): every request of
 *    each checkpoint, greedy and then sampled, once with graphs and once
 *    with --enforce-eager: the tokens and every step's logits must be
 *    bit-identical (a 64-bit hash per row). Again with MV_DECODE_ROPE=1:
 *    the graphs' q/k norm, RoPE and KV store inside decode attention
 *    (attention_decode_rope_cuda) against eager's two kernels. And at
 *    Qwen3-0.6B's shapes with random weights, 24 and 64 rows, where the
 *    GEMMs are large enough to show a kernel reading its input too early
 *    (check_graphs_06b).
 * 2. (Not with --enforce-eager or MV_TP_COMM_OF_ONE=1, which do not change
 *    it.) The GPU sampler (kernels/sampling.h), every version (1: bisection,
 *    2: shortlists, the engine's), against its CPU reference
 *    (reference/sampling.h, sample_tokens_cpu) on the same logits: the
 *    same id on every row, exactly (both draw the same numbers: the rule is
 *    written to make that possible), for vocabularies 1, 2, 512, 1000
 *    (strided rows), 4097 and 151936, rows of twenty kinds (ties, -0/+0,
 *    NaN, -inf, +inf, no finite value, huge and subnormal values, a tie
 *    band at the k-th, the top crowded into few threads...) with greedy,
 *    temperatures from 1e-45 to 1e30, top-k and top-p mixed; then rows
 *    aimed at version 2's paths (top_k 1 to 2049, k around the number of
 *    finite logits, top-p alone, tiny top-p) for vocabularies 151936, 4099,
 *    2050, 100 and 3; a second GPU run repeats every id. A row that differs
 *    is a FAIL naming the version, the row, its parameters and both ids.
 *    Then 20000 draws of one row: equal to the reference again, and their
 *    frequencies within FREQ_TOL of the softmax over the kept set. Last,
 *    "sampler timing" lines (information, not verdicts): 256 rows x 151936,
 *    each version's median time for greedy, T 0.6, T 0.6 + top_k 20 and
 *    Qwen3's default (T 0.6, top_k 20, top_p 0.95); a FAIL only if version
 *    2's ids there differ from version 1's.
 * 2b. The sampler's options on the GPU (kernels/sampling_opts.h: min_tokens,
 *    penalties, min_p, logprobs) around both sampler versions, against the
 *    engine's host sampler (sampler_sample_seq) on the same rows: vocabularies
 *    151936 (also strided), 4097, 1000 (strided), 7 and 1, up to 64 rows of
 *    the kinds above with random options (every 6th row all off). The
 *    prepared logits bit for bit equal to the host's row after min_tokens,
 *    penalties and sampling_min_p_mask_cpu; the ids equal; the top logprob
 *    ids equal and the values within LP_REL_TOL / LP_ABS_TOL; d_counts zero
 *    after every run; the three launches in a CUDA graph give the same bits.
 *    Then "sampler options timing" lines (information): 1 and 64 rows of
 *    151936 with every option on, against the sampler alone.
 */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chapters/09-engine/runtime/engine.h"
#include "chapters/09-engine/runtime/sampler.h"
#include "common/check.h"
#include "common/rng.h"
#include "reference/sampling.h"
#include "reference/sampling_math.h"
#if MV_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "kernels/pdl.h"
#include "kernels/sampling.h"
#include "kernels/sampling_opts.h"
#endif

// Tolerances, each with its reason (conventions: never tuned to pass).
// First-step logits vs HF (fp32): cpu differs by summation order only
// (tests/test_engine_cpu.c measures 2e-13..8e-13; bound 1e-9). cuda keeps
// bf16 activations: each rounding has relative error <= 2^-9, a few dozen
// of them in sequence give an NMSE of order 1e-5; a real bug (a wrong norm,
// RoPE off by one) gives > 1e-2. 1e-3 sits between.
#define CPU_LOGITS_NMSE_TOL 1e-9
#define BF16_LOGITS_NMSE_TOL 1e-3
// A greedy step whose HF top-2 margin is below this may flip in bf16. The
// tiny models are trained (tests/data/make_tiny_qwen3.py) so that every
// golden step's margin is >= 4x the measured bf16-vs-fp32 logit error
// (golden.json: min_top2_margin ~5, margin_floor ~0.8), so no golden step
// is below this and any flip is a FAIL; it stays for checkpoints made otherwise.
#define BF16_MARGIN_TOL 0.05
// Sampler frequencies over N_FREQ draws: the standard deviation of a
// frequency is at most 0.5 / sqrt(N_FREQ) = 0.0035; 0.02 is ~6 of them.
#define N_FREQ 20000
#define FREQ_TOL 0.02

static const char *MODELS[] = {"tests/data/tiny-qwen3-tied", "tests/data/tiny-qwen3-untied",
                               "tests/data/tiny-qwen3-mha"};
#define N_MODELS 3
#define MAX_CASES 64
#define MAX_IDS 256

typedef struct {
    int32_t prompt[MAX_IDS], greedy[MAX_IDS];
    double margin[MAX_IDS];
    int n_prompt, n_greedy, n_margins;
    float *first_logits;
    int n_logits;
} gcase_t;

typedef struct {
    gcase_t cases[MAX_CASES];
    int n_cases, max_new_tokens;
} golden_t;

static int n_pass, n_near, n_skip, n_fail;
// --enforce-eager: every engine of the golden checks without CUDA graphs.
static int g_enforce_eager;

static void verdict(const char *v, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void verdict(const char *v, const char *fmt, ...) {
    if (!strcmp(v, "PASS")) n_pass++;
    else if (!strcmp(v, "NEAR-TIE")) n_near++;
    else if (!strcmp(v, "SKIP")) n_skip++;
    else n_fail++;
    va_list ap;
    va_start(ap, fmt);
    printf("%-8s ", v);
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    fflush(stdout);
}

static int json_ids(const cJSON *a, int32_t *out) {
    int n = 0;
    for (const cJSON *v = a ? a->child : NULL; v && n < MAX_IDS; v = v->next) out[n++] = (int32_t)v->valuedouble;
    return n;
}

static int golden_load(const char *dir, golden_t *g) {
    char path[512];
    snprintf(path, sizeof path, "%s/golden.json", dir);
    FILE *f = fopen(path, "rb");
    if (!f) return mv_error("cannot open %s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *text = malloc((size_t)n + 1);
    size_t got = text ? fread(text, 1, (size_t)n, f) : 0;
    fclose(f);
    if (!text || got != (size_t)n) {
        free(text);
        return mv_error("cannot read %s", path);
    }
    text[n] = '\0';
    cJSON *root = cJSON_Parse(text);
    free(text);
    if (!root) return mv_error("%s is not JSON (rerun tests/data/make_tiny_qwen3.py)", path);
    memset(g, 0, sizeof *g);
    g->max_new_tokens = (int)cJSON_GetObjectItemCaseSensitive(root, "max_new_tokens")->valuedouble;
    for (const cJSON *c = cJSON_GetObjectItemCaseSensitive(root, "cases")->child; c && g->n_cases < MAX_CASES;
         c = c->next) {
        gcase_t *gc = &g->cases[g->n_cases++];
        gc->n_prompt = json_ids(cJSON_GetObjectItemCaseSensitive(c, "prompt_token_ids"), gc->prompt);
        gc->n_greedy = json_ids(cJSON_GetObjectItemCaseSensitive(c, "greedy_token_ids"), gc->greedy);
        int k = 0;
        for (const cJSON *m = cJSON_GetObjectItemCaseSensitive(c, "top2_margins")->child; m && k < MAX_IDS; m = m->next)
            gc->margin[k++] = m->valuedouble;
        gc->n_margins = k;
        const cJSON *fl = cJSON_GetObjectItemCaseSensitive(c, "first_logits");
        if (fl) {
            gc->n_logits = cJSON_GetArraySize(fl);
            gc->first_logits = malloc((size_t)gc->n_logits * sizeof(float));
            k = 0;
            for (const cJSON *x = fl->child; x; x = x->next) gc->first_logits[k++] = (float)x->valuedouble;
        }
    }
    cJSON_Delete(root);
    return 0;
}

static void golden_free(golden_t *g) {
    for (int i = 0; i < g->n_cases; i++) free(g->cases[i].first_logits);
}

typedef struct {
    const char *what;
    int max_num_seqs, max_batched, num_blocks, prefix;
    int alone, last_three;
    float gpu_util;  // > 0: size the cache from the GPU's memory (cuda), else a fixed 64 MiB budget
} run_cfg_t;

static engine_t *make_engine(const char *dir, runner_device_t dev, const run_cfg_t *rc) {
    engine_config_t c = engine_config_default(dir);
    c.device = dev;
    c.max_model_len = 128;
    c.max_num_seqs = rc->max_num_seqs;
    c.max_num_batched_tokens = rc->max_batched;
    c.block_size = 16;
    c.num_blocks = rc->num_blocks;
    c.enable_prefix_caching = rc->prefix;
    c.num_threads = 2;
    c.enforce_eager = g_enforce_eager;
    if (rc->gpu_util > 0 && dev == RUNNER_DEVICE_CUDA) c.gpu_memory_utilization = rc->gpu_util;
    else c.kv_cache_bytes = 64LL << 20;
    engine_t *e = NULL;
    if (engine_create(&c, &e)) return NULL;
    return e;
}

// Compare one output with its golden case; returns the verdict's name.
static const char *compare_ids(runner_device_t dev, const gcase_t *gc, const engine_output_t *o, char *note,
                               size_t cap) {
    int n = o->num_tokens < gc->n_greedy ? o->num_tokens : gc->n_greedy;
    for (int k = 0; k < n; k++) {
        if (o->token_ids[k] == gc->greedy[k]) continue;
        snprintf(note, cap, "token %d is %d, transformers says %d (HF top-2 margin %.4g)", k, o->token_ids[k],
                 gc->greedy[k], gc->margin[k]);
        return dev == RUNNER_DEVICE_CUDA && gc->margin[k] < BF16_MARGIN_TOL ? "NEAR-TIE" : "FAIL";
    }
    if (o->num_tokens != gc->n_greedy) {
        snprintf(note, cap, "%d tokens, transformers has %d", o->num_tokens, gc->n_greedy);
        return "FAIL";
    }
    snprintf(note, cap, "%d ids equal", n);
    return "PASS";
}

static void run_golden(const char *dir, runner_device_t dev, const golden_t *g, const run_cfg_t *rc) {
    engine_t *e = make_engine(dir, dev, rc);
    if (!e) {
        verdict("FAIL", "%s %s: engine_create: %s", dir, rc->what, mv_last_error());
        return;
    }
    int first = rc->last_three ? g->n_cases - 3 : 0, n = g->n_cases - first;
    engine_request_t reqs[MAX_CASES];
    engine_output_t outs[MAX_CASES];
    for (int i = 0; i < n; i++) {
        const gcase_t *gc = &g->cases[first + i];
        reqs[i] = (engine_request_t){gc->prompt, gc->n_prompt, {.temperature = 0.0f, .top_k = 0, .top_p = 1.0f, .max_tokens = g->max_new_tokens, .ignore_eos = 1}, 0};
    }
    long long cached = 0, preempted = 0;
    int ok = 1;
    if (rc->alone) {
        for (int i = 0; i < n && ok; i++) {
            ok = engine_generate(e, &reqs[i], 1, &outs[i], NULL, NULL) == 0;
            cached += e->num_cached_tokens;
            preempted += e->num_preemptions;
        }
    } else {
        ok = engine_generate(e, reqs, n, outs, NULL, NULL) == 0;
        cached = e->num_cached_tokens;
        preempted = e->num_preemptions;
    }
    if (!ok) {
        verdict("FAIL", "%s %s: engine_generate: %s", dir, rc->what, mv_last_error());
        engine_free(e);
        return;
    }
    for (int i = 0; i < n; i++) {
        char note[256];
        const char *v = compare_ids(dev, &g->cases[first + i], &outs[i], note, sizeof note);
        verdict(v, "%s %s case %d: %s", dir, rc->what, first + i, note);
    }
    // The case must have exercised what it names.
    if (rc->prefix && rc->last_three && cached < 2 * 32)
        verdict("FAIL", "%s %s: only %lld prompt tokens came from the prefix cache (want >= 64)", dir, rc->what,
                cached);
    if (rc->num_blocks > 0 && preempted == 0) verdict("FAIL", "%s %s: nothing was preempted", dir, rc->what);
    if (rc->gpu_util > 0)
        printf("         %s %s: %d KV blocks, weights %zu B, KV %zu B, scratch %zu B\n", dir, rc->what,
               e->cfg.num_blocks, e->runner->weight_bytes, e->runner->kv_cache_bytes, e->runner->scratch_bytes);
    engine_outputs_free(outs, n);
    engine_free(e);
}

typedef struct {
    float *logits[MAX_CASES];
} capture_t;

static void capture_first(void *ctx, int request, int gen_index, const float *logits, int vocab) {
    capture_t *c = ctx;
    if (gen_index != 0 || request >= MAX_CASES) return;
    c->logits[request] = malloc((size_t)vocab * sizeof(float));
    if (c->logits[request]) memcpy(c->logits[request], logits, (size_t)vocab * sizeof(float));
}

// First-step logits by NMSE, and the ids with the on_logits hook equal to
// the ids without it (the cuda backend samples on the GPU either way).
static void run_logits(const char *dir, runner_device_t dev, const golden_t *g) {
    run_cfg_t rc = {"first-step logits", 16, 512, 0, 0, 0, 0, 0};
    engine_t *e = make_engine(dir, dev, &rc);
    if (!e) {
        verdict("FAIL", "%s logits: engine_create: %s", dir, mv_last_error());
        return;
    }
    engine_request_t reqs[MAX_CASES];
    engine_output_t outs[MAX_CASES], outs2[MAX_CASES];
    for (int i = 0; i < g->n_cases; i++)
        reqs[i] = (engine_request_t){g->cases[i].prompt, g->cases[i].n_prompt, {.temperature = 0.0f, .top_k = 0, .top_p = 1.0f, .max_tokens = g->max_new_tokens, .ignore_eos = 1},
                                     0};
    capture_t cap = {0};
    if (engine_generate(e, reqs, g->n_cases, outs, capture_first, &cap) ||
        engine_generate(e, reqs, g->n_cases, outs2, NULL, NULL)) {
        verdict("FAIL", "%s logits: engine_generate: %s", dir, mv_last_error());
        engine_free(e);
        return;
    }
    const double tol = dev == RUNNER_DEVICE_CUDA ? BF16_LOGITS_NMSE_TOL : CPU_LOGITS_NMSE_TOL;
    const int V = e->model.vocab_size;
    for (int i = 0; i < g->n_cases; i++) {
        const gcase_t *gc = &g->cases[i];
        if (gc->first_logits && cap.logits[i] && gc->n_logits == V) {
            double err = 0, ref = 0;
            int finite = 1;
            for (int k = 0; k < V; k++) {
                finite &= isfinite(cap.logits[i][k]) != 0;
                double d = (double)cap.logits[i][k] - gc->first_logits[k];
                err += d * d;
                ref += (double)gc->first_logits[k] * gc->first_logits[k];
            }
            double nmse = err / ref;
            verdict(finite && nmse < tol ? "PASS" : "FAIL", "%s first-step logits case %d: NMSE %.3g (tol %.0e)%s",
                    dir, i, nmse, tol, finite ? "" : ", NaN/Inf");
        }
        free(cap.logits[i]);
        int same = outs[i].num_tokens == outs2[i].num_tokens &&
                   !memcmp(outs[i].token_ids, outs2[i].token_ids, (size_t)outs[i].num_tokens * sizeof(int32_t));
        if (!same) verdict("FAIL", "%s case %d: the ids with the on_logits hook differ from those without", dir, i);
    }
    engine_outputs_free(outs, g->n_cases);
    engine_outputs_free(outs2, g->n_cases);
    engine_free(e);
}

// ---- CUDA graphs against eager launches ----------------------------------------------
// A decode step replayed from a CUDA graph and the same padded step launched
// kernel by kernel (--enforce-eager) must compute the same bits: every
// sampled row's logits, at every step, and so every token, greedy and
// sampled. The logits are compared through a 64-bit FNV-1a hash of their
// bytes per (request, gen_index).
typedef struct {
    uint64_t hash[MAX_CASES][MAX_IDS];
    int rows;
} logit_hashes_t;

static void hash_logits(void *ctx, int request, int gen_index, const float *logits, int vocab) {
    logit_hashes_t *lh = ctx;
    if (request < 0 || request >= MAX_CASES || gen_index < 0 || gen_index >= MAX_IDS) return;
    uint64_t h = 0xcbf29ce484222325ull;
    const unsigned char *b = (const unsigned char *)logits;
    for (size_t k = 0; k < (size_t)vocab * sizeof(float); k++) h = (h ^ b[k]) * 0x100000001b3ull;
    lh->hash[request][gen_index] = h;
    lh->rows++;
}

// How many of n requests' tokens differ between two runs (*bad_ids), and
// how many of their logit rows (*bad_rows, by the hashes).
static void count_differences(const engine_output_t *a, const engine_output_t *b, const logit_hashes_t *ha,
                              const logit_hashes_t *hb, int n, int *bad_ids, int *bad_rows) {
    *bad_ids = *bad_rows = 0;
    for (int i = 0; i < n; i++) {
        if (a[i].num_tokens != b[i].num_tokens ||
            memcmp(a[i].token_ids, b[i].token_ids, (size_t)a[i].num_tokens * sizeof(int32_t)))
            (*bad_ids)++;
        for (int k = 0; k < MAX_IDS; k++) *bad_rows += ha->hash[i][k] != hb->hash[i][k];
    }
}

// A cuda engine's config with random weights for a directory with a config alone.
static engine_config_t random_weights_config(const char *dir, int max_model_len, int max_num_seqs, int max_batched,
                                             long long kv_cache_bytes) {
    engine_config_t c = engine_config_default(dir);
    c.device = RUNNER_DEVICE_CUDA;
    c.max_model_len = max_model_len;
    c.max_num_seqs = max_num_seqs;
    c.max_num_batched_tokens = max_batched;
    c.block_size = 16;
    c.num_threads = 2;
    c.random_weights = 1;
    c.kv_cache_bytes = kv_cache_bytes;
    return c;
}

// The engine of run_hashed: max_num_seqs rows; random_weights for a
// directory with a config alone (Qwen3-0.6B's shapes: a 256 MiB cache, 1 GiB
// past 8 rows, where 64 sequences of up to 128 tokens need 0.6 GB).
static engine_t *make_graph_engine(const char *dir, int eager, int max_num_seqs, int random_weights) {
    const run_cfg_t rc = {"graphs", max_num_seqs, 512, 0, 1, 0, 0, 0};
    const int saved = g_enforce_eager;
    g_enforce_eager = eager;
    engine_t *e = NULL;
    if (!random_weights) {
        e = make_engine(dir, RUNNER_DEVICE_CUDA, &rc);
    } else {
        engine_config_t c =
            random_weights_config(dir, 128, max_num_seqs, 512, max_num_seqs > 8 ? 1LL << 30 : 256LL << 20);
        c.enforce_eager = eager;
        if (engine_create(&c, &e)) e = NULL;
    }
    g_enforce_eager = saved;
    return e;
}

// Requests first .. first + n - 1 of g (greedy, or sampled and seeded),
// max_num_seqs rows at a time; each sampled row's logits hashed.
static int run_hashed_ex(const char *dir, int eager, int sampled, const golden_t *g, int first, int n,
                         int max_num_seqs, int random_weights, engine_output_t *outs, logit_hashes_t *lh,
                         int *num_graphs, int *megakernel_rows) {
    engine_t *e = make_graph_engine(dir, eager, max_num_seqs, random_weights);
    if (!e) return -1;
    *num_graphs = e->runner->num_graphs;
    if (megakernel_rows) *megakernel_rows = e->runner->megakernel_rows;
    engine_request_t reqs[MAX_CASES];
    for (int i = 0; i < n; i++) {
        const int c = first + i;
        sampling_params_t p = {.temperature = 0.0f, .top_k = 0, .top_p = 1.0f, .max_tokens = g->max_new_tokens, .ignore_eos = 1};
        if (sampled) p = (sampling_params_t){.temperature = 0.8f, .top_k = c % 3 ? 20 : 0, .top_p = c % 2 ? 0.9f : 1.0f, .max_tokens = g->max_new_tokens, .ignore_eos = 1};
        reqs[i] = (engine_request_t){g->cases[c].prompt, g->cases[c].n_prompt, p, 1000u + (uint64_t)c};
    }
    memset(lh, 0, sizeof *lh);
    int rc2 = engine_generate(e, reqs, n, outs, hash_logits, lh);
    engine_free(e);
    return rc2;
}

static int run_hashed(const char *dir, int eager, int sampled, const golden_t *g, engine_output_t *outs,
                      logit_hashes_t *lh, int *num_graphs) {
    return run_hashed_ex(dir, eager, sampled, g, 0, g->n_cases, 16, 0, outs, lh, num_graphs, NULL);
}

// ---- the decode megakernel against the unfused kernels --------------------------------
// The graphs above decode 11 rows at once (a graph of 16), past the
// megakernel's sizes. Here B rows at a time (max_num_seqs B, B requests),
// B = 1, 2, 4, 8: every decode step runs at exactly B rows, through the
// megakernel wherever it takes B (kernels/decode_megakernel.h; the graph
// engines here are made with MV_MEGAKERNEL=1 and MV_MEGAKERNEL_ROWS=2, so
// 1 and 2 rows; the engine's default is 1), and must give the bits of
// the same steps launched kernel by kernel. On a GPU of compute capability
// 9.0 the tiny checkpoints and Qwen3-0.6B's shapes must take it: otherwise
// the check would pass without running it. Since the megakernel is the
// default, the same steps also run from graphs with MV_MEGAKERNEL=0 (the
// unfused kernels at 1 to 8 rows, which no other case reaches), which must
// not take it and must give the same bits too; and at 1 and 2 rows with
// MV_MEGAKERNEL_FUSED_ROPE=0 (the megakernel's q/k norm + RoPE + KV store
// as a phase of their own instead of inside its attention pieces), and with
// MV_MEGAKERNEL_XREG=0 (its GEMV's x read from shared memory for every row
// pair, instead of once into registers).
static int megakernel_expected(void) {
#if MV_HAVE_CUDA
    // Never on the tensor-parallel path, which MV_TP_COMM_OF_ONE=1 takes at tp 1.
    if (getenv("MV_TP_COMM_OF_ONE") && !strcmp(getenv("MV_TP_COMM_OF_ONE"), "1")) return 0;
    int dev = 0, major = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev))
        return 0;
    return major >= 9;
#else
    return 0;
#endif
}

// use: 1 the graphs with MV_MEGAKERNEL=1 (and MV_MEGAKERNEL_ROWS=2), 0 with MV_MEGAKERNEL=0, 2 with
// MV_MEGAKERNEL=1 and MV_MEGAKERNEL_FUSED_ROPE=0, 3 with MV_MEGAKERNEL_XREG=0
// (the GEMV's x from shared memory for every row pair); 2 and 3 at 1 and 2
// rows only.
// Every form with the megakernel also takes steps of 2 rows
// (MV_MEGAKERNEL_ROWS=2; by default it takes only 1).
static const char *const mk_switches[4][2] = {{NULL, NULL},
                                              {"MV_MEGAKERNEL_ROWS=2", NULL},
                                              {"MV_MEGAKERNEL_ROWS=2", "MV_MEGAKERNEL_FUSED_ROPE=0"},
                                              {"MV_MEGAKERNEL_ROWS=2", "MV_MEGAKERNEL_XREG=0"}};
static void mk_switches_set(int use, int on) {
    for (int i = 0; i < 2; i++) {
        const char *kv = mk_switches[use][i];
        if (!kv) continue;
        char name[64];
        const size_t n = strcspn(kv, "=");
        snprintf(name, sizeof name, "%.*s", (int)n, kv);
        if (on) setenv(name, kv + n + 1, 1);
        else unsetenv(name);
    }
}

static void check_megakernel_with(const char *dir, const golden_t *g, int random_weights, int use) {
    static const int batches[] = {1, 2, 4, 8};
    for (size_t bi = 0; bi < sizeof batches / sizeof *batches; bi++) {
        const int B = batches[bi], n = B <= g->n_cases ? B : g->n_cases;
        if (use >= 2 && B > 2) break;
        for (int sampled = 0; sampled < 2; sampled++) {
            engine_output_t a[MAX_CASES], b[MAX_CASES];
            logit_hashes_t *ha = calloc(1, sizeof *ha), *hb = calloc(1, sizeof *hb);
            int graphs = 0, none = 0, mk = 0, dummy = 0;
            const int first = (int)(bi % 3);  // different requests for different B
            const int f = first + n <= g->n_cases ? first : 0;
            const char *was = getenv("MV_MEGAKERNEL");
            char saved[16];
            snprintf(saved, sizeof saved, "%s", was ? was : "");
            setenv("MV_MEGAKERNEL", use ? "1" : "0", 1);
            mk_switches_set(use, 1);
            const int rc_a = !ha || !hb || run_hashed_ex(dir, 0, sampled, g, f, n, B, random_weights, a, ha, &graphs, &mk);
            if (was) setenv("MV_MEGAKERNEL", saved, 1);
            else unsetenv("MV_MEGAKERNEL");
            mk_switches_set(use, 0);
            if (rc_a || run_hashed_ex(dir, 1, sampled, g, f, n, B, random_weights, b, hb, &none, &dummy)) {
                verdict("FAIL", "%s megakernel, %d rows, %s: %s", dir, B, sampled ? "sampled" : "greedy", mv_last_error());
                free(ha), free(hb);
                return;
            }
            int bad_ids, bad_rows;
            count_differences(a, b, ha, hb, n, &bad_ids, &bad_rows);
            const int ran = B <= mk;
            char how[160];
            if (use)
                snprintf(how, sizeof how, "%s%s%s%s%s (megakernel: steps of 1 to %d rows)",
                         ran ? "the megakernel" : "the unfused graph", mk_switches[use][0] ? " with " : "",
                         mk_switches[use][0] ? mk_switches[use][0] : "", mk_switches[use][1] ? " " : "",
                         mk_switches[use][1] ? mk_switches[use][1] : "", mk);
            else
                snprintf(how, sizeof how, "the unfused graph (MV_MEGAKERNEL=0)");
            if (use && mk == 0 && megakernel_expected())
                verdict("FAIL", "%s megakernel: the graphs did not take it (steps of 1 to %d rows)", dir, mk);
            else if (!use && mk != 0)
                verdict("FAIL", "%s megakernel: MV_MEGAKERNEL=0, but the graphs took it (steps of 1 to %d rows)", dir,
                        mk);
            else if (graphs == 0 || none != 0 || bad_ids || bad_rows || ha->rows != hb->rows || ha->rows == 0)
                verdict("FAIL", "%s megakernel, %d rows, %s: %s against eager: %d requests' tokens and %d logit rows "
                        "differ (%d vs %d rows; %d graphs)", dir, B, sampled ? "sampled" : "greedy", how, bad_ids,
                        bad_rows, ha->rows, hb->rows, graphs);
            else
                verdict("PASS", "%s megakernel, %d rows, %s: %s against eager: %d requests, %d logit rows bit-identical",
                        dir, B, sampled ? "sampled" : "greedy", how, n, ha->rows);
            engine_outputs_free(a, n);
            engine_outputs_free(b, n);
            free(ha), free(hb);
        }
    }
}

static void check_megakernel(const char *dir, const golden_t *g, int random_weights) {
    check_megakernel_with(dir, g, random_weights, 1);
    check_megakernel_with(dir, g, random_weights, 0);
    check_megakernel_with(dir, g, random_weights, 2);
    check_megakernel_with(dir, g, random_weights, 3);
}

// Qwen3-0.6B's shapes with random weights: 8 prompts of 20 to 62 ids
// (ids < 1000, a fixed LCG), 24 new tokens each.
static void check_megakernel_06b(void) {
    golden_t *g = calloc(1, sizeof *g);
    if (!g) return;
    uint32_t x = 12345u;
    g->n_cases = 8;
    g->max_new_tokens = 24;
    for (int i = 0; i < g->n_cases; i++) {
        g->cases[i].n_prompt = 20 + 6 * i;
        for (int k = 0; k < g->cases[i].n_prompt; k++) {
            x = x * 1664525u + 1013904223u;
            g->cases[i].prompt[k] = (int32_t)((x >> 8) % 1000u);
        }
    }
    check_megakernel("tests/data/qwen3-0.6b-shape", g, 1);
    free(g);
}

// ---- graphs against eager at Qwen3-0.6B's shapes, past the GEMV's rows ------------------
// The tiny checkpoints' graphs (11 rows, a graph of 16) multiply matrices too
// small to show a kernel that reads its input before the kernel before it
// has written it: edges into cuBLAS's GEMMs made programmatic passed them
// and gave wrong tokens from the first decode steps at Qwen3-0.6B's shapes
// (docs/09-engine.md, "What was tried"). Here 24 and 64 rows of random-weight
// Qwen3-0.6B (prompts of 20 to 62 ids, 16 new tokens each), greedy and
// sampled: the decode graphs (cuBLAS's GEMMs, the edges moved to the
// launch-completion port, decode attention's pieces) against the same steps
// launched kernel by kernel, every logit row bit for bit.
static void check_graphs_06b(void) {
    golden_t *g = calloc(1, sizeof *g);
    if (!g) return;
    uint32_t x = 4242u;
    g->n_cases = 64;
    g->max_new_tokens = 16;
    for (int i = 0; i < g->n_cases; i++) {
        g->cases[i].n_prompt = 20 + (7 * i) % 43;
        for (int k = 0; k < g->cases[i].n_prompt; k++) {
            x = x * 1664525u + 1013904223u;
            g->cases[i].prompt[k] = (int32_t)((x >> 8) % 1000u);
        }
    }
    const char *dir = "tests/data/qwen3-0.6b-shape";
    static const int batches[] = {24, 64};
    for (size_t bi = 0; bi < sizeof batches / sizeof *batches; bi++) {
        const int B = batches[bi];
        for (int sampled = 0; sampled < 2; sampled++) {
            engine_output_t a[MAX_CASES], b[MAX_CASES];
            logit_hashes_t *ha = calloc(1, sizeof *ha), *hb = calloc(1, sizeof *hb);
            int graphs = 0, none = 0;
            const char *what = sampled ? "sampled" : "greedy";
            if (!ha || !hb || run_hashed_ex(dir, 0, sampled, g, 0, B, B, 1, a, ha, &graphs, NULL)) {
                verdict("FAIL", "%s graphs vs eager, %d rows, %s: %s", dir, B, what, mv_last_error());
                free(ha), free(hb);
                continue;
            }
            if (run_hashed_ex(dir, 1, sampled, g, 0, B, B, 1, b, hb, &none, NULL)) {
                verdict("FAIL", "%s graphs vs eager, %d rows, %s (eager): %s", dir, B, what, mv_last_error());
                engine_outputs_free(a, B);
                free(ha), free(hb);
                continue;
            }
            int bad_ids, bad_rows;
            count_differences(a, b, ha, hb, B, &bad_ids, &bad_rows);
            if (graphs == 0 || none != 0 || bad_ids || bad_rows || ha->rows != hb->rows || ha->rows == 0)
                verdict("FAIL", "%s graphs vs eager, %d rows, %s: %d requests' tokens and %d logit rows differ (%d vs "
                        "%d rows; %d graphs)", dir, B, what, bad_ids, bad_rows, ha->rows, hb->rows, graphs);
            else
                verdict("PASS", "%s graphs vs eager, %d rows, %s: %d requests, %d logit rows bit-identical (%d graphs)",
                        dir, B, what, B, ha->rows, graphs);
            engine_outputs_free(a, B);
            engine_outputs_free(b, B);
            free(ha), free(hb);
        }
    }
    free(g);
}

// ---- the megakernel's split attention --------------------------------------------------
// The cases above run with max_model_len 128, where decode attention never
// cuts a row into pieces (pieces of at least 256 keys), so the megakernel's
// split pieces and their reduction do not run there. Here: Qwen3-0.6B's
// shapes with max_model_len 4096, the bench's, so 16 pieces a row at 1 and
// 2 rows, prompts of 640 and 700 ids, 8 new tokens; the graphs with the
// megakernel against the unfused graphs (MV_MEGAKERNEL=0), which cut the
// rows into the same pieces (a decode graph's bound is max_model_len) and
// reduce them with chapter 07's kernel. Every logit row must match bit for bit.
#define SPLIT_PROMPT 700
static int run_split(int B, const int32_t (*prompts)[SPLIT_PROMPT], const int *lens, const char *mk,
                     engine_output_t *outs, logit_hashes_t *lh, int *mk_rows) {
    const char *was = getenv("MV_MEGAKERNEL");
    char saved[32];
    snprintf(saved, sizeof saved, "%s", was ? was : "");
    setenv("MV_MEGAKERNEL", mk, 1);
    setenv("MV_MEGAKERNEL_ROWS", "2", 1);  // the megakernel takes 1 row by default
    engine_config_t c = random_weights_config("tests/data/qwen3-0.6b-shape", 4096, B, 1024, 1LL << 30);
    engine_t *e = NULL;
    int rc = engine_create(&c, &e);
    unsetenv("MV_MEGAKERNEL_ROWS");
    if (was) setenv("MV_MEGAKERNEL", saved, 1);
    else unsetenv("MV_MEGAKERNEL");
    if (rc) return -1;
    *mk_rows = e->runner->megakernel_rows;
    engine_request_t reqs[2];
    for (int i = 0; i < B; i++) {
        const sampling_params_t p = {.temperature = 0.0f, .top_k = 0, .top_p = 1.0f, .max_tokens = 8, .ignore_eos = 1};
        reqs[i] = (engine_request_t){prompts[i], lens[i], p, 0};
    }
    memset(lh, 0, sizeof *lh);
    rc = engine_generate(e, reqs, B, outs, hash_logits, lh);
    engine_free(e);
    return rc;
}

static void check_megakernel_split(void) {
    static int32_t prompts[2][SPLIT_PROMPT];
    const int lens[2] = {640, 700};
    uint32_t x = 777u;
    for (int i = 0; i < 2; i++)
        for (int k = 0; k < lens[i]; k++) {
            x = x * 1664525u + 1013904223u;
            prompts[i][k] = (int32_t)((x >> 8) % 1000u);
        }
    for (int B = 1; B <= 2; B++) {
        engine_output_t ref[2], out[2];
        logit_hashes_t *href = calloc(1, sizeof *href), *h = calloc(1, sizeof *h);
        int none = 0, mk = 0;
        if (!href || !h || run_split(B, prompts, lens, "0", ref, href, &none)) {
            verdict("FAIL", "megakernel split attention, %d rows: the unfused graphs: %s", B, mv_last_error());
            free(href), free(h);
            return;
        }
        if (run_split(B, prompts, lens, "1", out, h, &mk)) {
            verdict("FAIL", "megakernel split attention, %d rows: %s", B, mv_last_error());
            engine_outputs_free(ref, B);
            free(href), free(h);
            continue;
        }
        int bad_ids, bad_rows;
        count_differences(out, ref, h, href, B, &bad_ids, &bad_rows);
        if (megakernel_expected() && mk < B)
            verdict("FAIL", "megakernel split attention, %d rows: the graphs did not take the megakernel (steps of 1 "
                    "to %d rows)", B, mk);
        else if (none != 0 || bad_ids || bad_rows || h->rows != href->rows || h->rows == 0)
            verdict("FAIL", "megakernel split attention, %d rows, against the unfused graphs: %d requests' tokens and "
                    "%d logit rows differ (%d vs %d rows)", B, bad_ids, bad_rows, h->rows, href->rows);
        else
            verdict("PASS", "megakernel split attention (16 pieces a row), %d rows, against the unfused graphs: %d "
                    "logit rows bit-identical", B, h->rows);
        engine_outputs_free(out, B);
        engine_outputs_free(ref, B);
        free(href), free(h);
    }
}

// how: "" or what the runs have in common that the verdict should name.
static void check_graphs_vs_eager(const char *dir, const golden_t *g, const char *how) {
    for (int sampled = 0; sampled < 2; sampled++) {
        char what[160];
        snprintf(what, sizeof what, "%s%s", sampled ? "sampled (T 0.8, top-k 20 / top-p 0.9 mixed, seeded)" : "greedy",
                 how);
        engine_output_t a[MAX_CASES], b[MAX_CASES];
        logit_hashes_t *ha = calloc(1, sizeof *ha), *hb = calloc(1, sizeof *hb);
        int graphs = 0, none = 0;
        if (!ha || !hb || run_hashed(dir, 0, sampled, g, a, ha, &graphs) ||
            run_hashed(dir, 1, sampled, g, b, hb, &none)) {
            verdict("FAIL", "%s graphs vs eager, %s: %s", dir, what, mv_last_error());
            free(ha), free(hb);
            return;
        }
        int bad_ids, bad_rows;
        count_differences(a, b, ha, hb, g->n_cases, &bad_ids, &bad_rows);
        if (graphs == 0 || none != 0)
            verdict("FAIL", "%s graphs vs eager, %s: %d graphs captured with graphs on, %d with --enforce-eager", dir,
                    what, graphs, none);
        else if (bad_ids || bad_rows || ha->rows != hb->rows)
            verdict("FAIL", "%s graphs vs eager, %s: %d requests' tokens and %d logit rows differ (%d vs %d rows)", dir,
                    what, bad_ids, bad_rows, ha->rows, hb->rows);
        else
            verdict("PASS", "%s graphs vs eager, %s: %d requests, %d logit rows bit-identical (%d graphs)", dir, what,
                    g->n_cases, ha->rows, graphs);
        engine_outputs_free(a, g->n_cases);
        engine_outputs_free(b, g->n_cases);
        free(ha), free(hb);
    }
}

// ---- asynchronous scheduling against steps scheduled one after the other ------------------
// The engine plans decode step n + 1 and queues it on the GPU while step n
// runs (engine.h: no_async_scheduling), the row's input id copied on the
// device from step n's sampled ids. The first 8 requests, 8 rows at a time,
// sampled and seeded, eos on, and a stop id for every other request (its 4th
// token in a run without asynchronous scheduling): requests end where the
// scheduler cannot foresee it, and the step planned ahead computes their
// rows once more and drops them. Up to 8 rows every step takes the same
// GEMV path whatever its rows (the decode graphs of 1, 2, 4 and 8 rows, the
// same bits: the megakernel check), so the tokens must be equal, as must
// the finish reasons; and steps must have been planned ahead.
static int run_async(const char *dir, const golden_t *g, int n, int async, const engine_stop_t *stops,
                     engine_output_t *outs, long long *ahead, int *can_launch) {
    run_cfg_t rc = {"async", 8, 256, 0, 1, 0, 0, 0};
    engine_t *e = make_engine(dir, RUNNER_DEVICE_CUDA, &rc);
    if (!e) return -1;
    e->cfg.no_async_scheduling = !async;
    *can_launch = model_runner_can_launch(e->runner);
    engine_request_t reqs[MAX_CASES];
    for (int c = 0; c < n; c++) {
        sampling_params_t p = {.temperature = 0.8f, .top_k = c % 3 ? 20 : 0, .top_p = c % 2 ? 0.9f : 1.0f,
                               .max_tokens = g->max_new_tokens, .ignore_eos = 0};
        reqs[c] = (engine_request_t){g->cases[c].prompt, g->cases[c].n_prompt, p, 2000u + (uint64_t)c};
    }
    const int rc2 = engine_run_stops(e, reqs, stops, n, outs, NULL);
    *ahead = e->num_steps_ahead;
    engine_free(e);
    return rc2;
}

static void check_async(const char *dir, const golden_t *g) {
    const int n = g->n_cases < 8 ? g->n_cases : 8;
    engine_output_t first[MAX_CASES], a[MAX_CASES], b[MAX_CASES];
    engine_stop_t stops[MAX_CASES] = {{0}};
    int32_t stop_id[MAX_CASES];
    long long ahead_first, ahead_sync, ahead_async;
    int can_launch = 0;
    if (run_async(dir, g, n, 0, NULL, first, &ahead_first, &can_launch)) {
        verdict("FAIL", "%s async scheduling: %s", dir, mv_last_error());
        return;
    }
    for (int c = 0; c < n; c += 2)
        if (first[c].num_tokens > 3) {
            stop_id[c] = first[c].token_ids[3];
            stops[c] = (engine_stop_t){.ids = &stop_id[c], .n = 1};
        }
    engine_outputs_free(first, n);
    if (run_async(dir, g, n, 0, stops, a, &ahead_sync, &can_launch) ||
        run_async(dir, g, n, 1, stops, b, &ahead_async, &can_launch)) {
        verdict("FAIL", "%s async scheduling: %s", dir, mv_last_error());
        return;
    }
    int bad = 0, tokens = 0, stopped = 0;
    for (int c = 0; c < n; c++) {
        tokens += b[c].num_tokens;
        stopped += !strcmp(engine_output_finish_reason(&b[c]), "stop");
        bad += a[c].num_tokens != b[c].num_tokens ||
               memcmp(a[c].token_ids, b[c].token_ids, (size_t)a[c].num_tokens * sizeof(int32_t)) ||
               strcmp(engine_output_finish_reason(&a[c]), engine_output_finish_reason(&b[c]));
    }
    // The runner has no asynchronous steps on the tensor-parallel path
    // (MV_TP_COMM_OF_ONE=1): then nothing may be planned ahead.
    if (bad || ahead_sync != 0 || (ahead_async == 0) == can_launch)
        verdict("FAIL", "%s async scheduling: %d of %d requests differ from the run without it; %lld steps planned "
                "ahead with it, %lld without", dir, bad, n, ahead_async, ahead_sync);
    else
        verdict("PASS", "%s async scheduling: %d requests (%d ended by a stop or eos), %d tokens equal to the run "
                "without it; %lld steps planned ahead%s", dir, n, stopped, tokens, ahead_async,
                can_launch ? "" : " (the runner has no asynchronous steps here: the tensor-parallel path)");
    engine_outputs_free(a, n);
    engine_outputs_free(b, n);
}

// ---- two halves of a decode step at once --------------------------------------------------
// MV_DECODE_HALVES=4: every decode step of 4 rows or more runs its layers as
// two chains of kernels on two streams, rows [0, S/2) and [S/2, S) (the cuda
// runner's halves_rows). The golden cases through it (11 requests, 16 rows
// at a time: steps of 11 down to 1 rows, padded to graphs of 16, 8 and 4
// rows, or launched eagerly), and graphs against eager with it, which must
// give the same bits: the same halves, the same kernels. On the
// tensor-parallel path (MV_TP_COMM_OF_ONE=1) the runner never splits a step.
static void check_halves(const char *dir, const golden_t *g) {
    const char *was = getenv("MV_DECODE_HALVES");
    char saved[32] = "";
    if (was) snprintf(saved, sizeof saved, "%s", was);
    setenv("MV_DECODE_HALVES", "4", 1);
    const int tp_path = getenv("MV_TP_COMM_OF_ONE") && !strcmp(getenv("MV_TP_COMM_OF_ONE"), "1");
    engine_t *e = make_graph_engine(dir, g_enforce_eager, 16, 0);
    if (!e) {
        verdict("FAIL", "%s two halves at once: %s", dir, mv_last_error());
    } else {
        const int rows = e->runner->halves_rows;
        engine_free(e);
        if (rows != (tp_path ? 0 : 4))
            verdict("FAIL", "%s two halves at once: MV_DECODE_HALVES=4, the runner splits steps of %d rows or more "
                    "(want %d)", dir, rows, tp_path ? 0 : 4);
        const run_cfg_t rc = {"batched, two halves at once (MV_DECODE_HALVES=4)", 16, 512, 0, 0, 0, 0, 0};
        run_golden(dir, RUNNER_DEVICE_CUDA, g, &rc);
        if (!g_enforce_eager) check_graphs_vs_eager(dir, g, ", two halves at once (MV_DECODE_HALVES=4)");
    }
    if (was) setenv("MV_DECODE_HALVES", saved, 1);
    else unsetenv("MV_DECODE_HALVES");
}

// ---- q/k norm + RoPE + the KV store inside decode attention (MV_DECODE_ROPE=1) ----------
// The unfused decode graphs with attention_decode_rope_cuda in place of
// qk_norm_rope_store_cuda and decode attention: graphs against eager (which
// runs the two kernels) must give the same bits.
static void check_decode_rope(const char *dir, const golden_t *g) {
    const char *was = getenv("MV_DECODE_ROPE");
    char saved[8] = "";
    if (was) snprintf(saved, sizeof saved, "%s", was);
    setenv("MV_DECODE_ROPE", "1", 1);
    check_graphs_vs_eager(dir, g, ", q/k norm + RoPE + KV store inside decode attention (MV_DECODE_ROPE=1)");
    if (was) setenv("MV_DECODE_ROPE", saved, 1);
    else unsetenv("MV_DECODE_ROPE");
}

static void check_goldens(runner_device_t dev) {
    const run_cfg_t runs[] = {
        {"alone", 4, 256, 0, 0, 1, 0, 0},
        {"batched", 16, 512, 0, 0, 0, 0, 0},
        {"prefix-cached", 8, 256, 0, 1, 0, 1, 0},
        {"chunked (16 tokens per step)", 4, 16, 0, 1, 0, 0, 0},
        // 10 blocks of 16 hold the longest request (100 + 12 tokens: 7
        // blocks) and little more: decodes run out, sequences are preempted.
        {"preempted", 8, 128, 10, 1, 0, 0, 0},
        {"cache sized by gpu_memory_utilization 0.02", 16, 512, 0, 1, 0, 0, 0.02f},
        // 0 = the engine's defaults for the device (cpu 16 rows, cuda 256 rows
        // and 8192 tokens per step): all 11 requests in one step.
        {"engine defaults (max_num_seqs, max_num_batched_tokens)", 0, 0, 0, 1, 0, 0, 0},
    };
    for (int m = 0; m < N_MODELS; m++) {
        qwen3_config_t mc;
        if (qwen3_config_load(MODELS[m], &mc)) {
            verdict("FAIL", "%s: %s", MODELS[m], mv_last_error());
            continue;
        }
        golden_t *g = malloc(sizeof *g);
        if (!g || golden_load(MODELS[m], g)) {
            verdict("FAIL", "%s: %s", MODELS[m], g ? mv_last_error() : "out of memory");
            free(g);
            continue;
        }
        double min_margin = 1e30;
        for (int i = 0; i < g->n_cases; i++)
            for (int k = 0; k < g->cases[i].n_margins; k++)
                if (g->cases[i].margin[k] < min_margin) min_margin = g->cases[i].margin[k];
        printf("== %s: %d cases, smallest HF top-2 margin %.4g (NEAR-TIE only below %g)\n", MODELS[m], g->n_cases,
               min_margin, BF16_MARGIN_TOL);
        for (size_t r = 0; r < sizeof runs / sizeof *runs; r++) {
            if (runs[r].gpu_util > 0 && dev != RUNNER_DEVICE_CUDA) continue;
            run_golden(MODELS[m], dev, g, &runs[r]);
        }
        run_logits(MODELS[m], dev, g);
        if (dev == RUNNER_DEVICE_CUDA && !g_enforce_eager) check_graphs_vs_eager(MODELS[m], g, "");
        if (dev == RUNNER_DEVICE_CUDA && !g_enforce_eager) check_decode_rope(MODELS[m], g);
        if (dev == RUNNER_DEVICE_CUDA) check_async(MODELS[m], g);
        if (dev == RUNNER_DEVICE_CUDA) check_halves(MODELS[m], g);
        if (dev == RUNNER_DEVICE_CUDA && !g_enforce_eager) check_megakernel(MODELS[m], g, 0);
        golden_free(g);
        free(g);
    }
    if (dev == RUNNER_DEVICE_CUDA && !g_enforce_eager) check_megakernel_06b();
    if (dev == RUNNER_DEVICE_CUDA && !g_enforce_eager) check_graphs_06b();
    if (dev == RUNNER_DEVICE_CUDA && !g_enforce_eager) check_megakernel_split();
}

// ---- the GPU sampler against the CPU reference ----------------------------------------------
#if MV_HAVE_CUDA

typedef struct {
    float *logits, *temp, *top_p;
    bf16_t *logits16;  // the same logits as bf16 (exact: the checks' rows are bf16 values), for version 4
    int32_t *top_k, *out;
    uint64_t *seed;
    int64_t *gen;
} sbufs_t;

// The rows as bf16 on the device: n values of the host's fp32 rows, which
// the checks make bf16 values (bf16_rows), so nothing is rounded here.
static int upload_bf16(bf16_t *d, const float *h, size_t n) {
    bf16_t *t = mv_xmalloc(n * sizeof *t);
    float_to_bf16_array(t, h, n);
    const int rc = CUDA_TRY(cudaMemcpy(d, t, n * sizeof *t, cudaMemcpyHostToDevice));
    free(t);
    return rc;
}

// Every value of x rounded to bf16, as the LM head writes the engine's
// logits: version 4 reads bf16, so every check's rows are bf16 values and
// all four versions see the same logits. (Values between them still reach
// versions 1 to 4 through the options' penalties: check_sampler_options.)
static void bf16_rows(float *x, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] = bf16_round(x[i]);
}

// The sampler through a workspace (version 3 needs one; 1 and 2 ignore it):
// one buffer for the whole check, grown when a launch needs more rows,
// zeroed when allocated (every launch leaves it zeroed again).
static void *g_sample_ws;
static size_t g_sample_ws_bytes;
static int sample_ws_reserve(int version, int rows) {
    const size_t need = sample_tokens_ws_bytes(version, rows);
    if (need > g_sample_ws_bytes) {
        if (CUDA_TRY(cudaDeviceSynchronize())) return -1;
        cudaFree(g_sample_ws);
        g_sample_ws = NULL, g_sample_ws_bytes = 0;
        if (CUDA_TRY(cudaMalloc(&g_sample_ws, need)) || CUDA_TRY(cudaMemset(g_sample_ws, 0, need))) return -1;
        g_sample_ws_bytes = need;
    }
    return 0;
}

static int sample_ws(int version, int32_t *out, const float *logits, const bf16_t *logits16, long long stride,
                     int rows, int V, const float *temp, const int32_t *top_k, const float *top_p,
                     const uint64_t *seed, const int64_t *gen, cudaStream_t stream) {
    if (sample_ws_reserve(version, rows)) return -1;
    if (version == 4)
        return sample_tokens_bf16_cuda(out, logits16, NULL, NULL, stride, rows, V, temp, top_k, top_p, seed, gen,
                                       g_sample_ws, g_sample_ws_bytes, stream);
    return sample_tokens_ws_cuda(version, out, logits, stride, rows, V, temp, top_k, top_p, seed, gen, g_sample_ws,
                                 g_sample_ws_bytes, stream);
}

// Run GPU sampler version `version` on rows of `stride` floats (vocab used)
// with per-row parameters; ids to out.
static int gpu_sample(int version, const float *logits, long long stride, int rows, int V, const float *temp,
                      const int32_t *top_k, const float *top_p, const uint64_t *seed, const int64_t *gen,
                      int32_t *out) {
    sbufs_t d = {0};
    size_t R = (size_t)rows;
    int rc = CUDA_TRY(cudaMalloc((void **)&d.logits, R * (size_t)stride * sizeof(float))) ||
             CUDA_TRY(cudaMalloc((void **)&d.logits16, R * (size_t)stride * sizeof(bf16_t))) ||
             CUDA_TRY(cudaMalloc((void **)&d.temp, R * sizeof(float))) ||
             CUDA_TRY(cudaMalloc((void **)&d.top_p, R * sizeof(float))) ||
             CUDA_TRY(cudaMalloc((void **)&d.top_k, R * sizeof(int32_t))) ||
             CUDA_TRY(cudaMalloc((void **)&d.out, R * sizeof(int32_t))) ||
             CUDA_TRY(cudaMalloc((void **)&d.seed, R * sizeof(uint64_t))) ||
             CUDA_TRY(cudaMalloc((void **)&d.gen, R * sizeof(int64_t)));
    if (!rc)
        rc = CUDA_TRY(cudaMemcpy(d.logits, logits, R * (size_t)stride * sizeof(float), cudaMemcpyHostToDevice)) ||
             upload_bf16(d.logits16, logits, R * (size_t)stride) ||
             CUDA_TRY(cudaMemcpy(d.temp, temp, R * sizeof(float), cudaMemcpyHostToDevice)) ||
             CUDA_TRY(cudaMemcpy(d.top_p, top_p, R * sizeof(float), cudaMemcpyHostToDevice)) ||
             CUDA_TRY(cudaMemcpy(d.top_k, top_k, R * sizeof(int32_t), cudaMemcpyHostToDevice)) ||
             CUDA_TRY(cudaMemcpy(d.seed, seed, R * sizeof(uint64_t), cudaMemcpyHostToDevice)) ||
             CUDA_TRY(cudaMemcpy(d.gen, gen, R * sizeof(int64_t), cudaMemcpyHostToDevice)) ||
             CUDA_TRY(cudaMemset(d.out, 0x7f, R * sizeof(int32_t)));  // poisoned: an unwritten row shows
    if (!rc)
        rc = sample_ws(version, d.out, d.logits, d.logits16, stride, rows, V, d.temp, d.top_k, d.top_p, d.seed, d.gen,
                       0) ||
             CUDA_TRY(cudaDeviceSynchronize()) ||
             CUDA_TRY(cudaMemcpy(out, d.out, R * sizeof(int32_t), cudaMemcpyDeviceToHost));
    cudaFree(d.logits), cudaFree(d.logits16), cudaFree(d.temp), cudaFree(d.top_p), cudaFree(d.top_k), cudaFree(d.out),
        cudaFree(d.seed), cudaFree(d.gen);
    return rc ? -1 : 0;
}

// The kinds of rows: what each one's logits test. The last four aim at
// version 2 (kernels/sampling.cu: 512 threads, thread t reading ids
// 4t..4t+3, 4t + 2048.. of a 16-byte aligned row, each keeping its 4
// largest): ties at the k-th, the largest logits crowded into few threads
// (a shortlist full at the threshold: one more pass), finite logits in few
// threads (the candidates do not fit: the fallback). Any layout must pass them.
enum {
    ROW_UNIFORM,     // [-4, 4)
    ROW_LM,          // normal(0, 2) with a few spikes above 10: a language model's shape
    ROW_TIE3,        // a three-way tie for the largest value
    ROW_COARSE,      // values on a grid of 1/4, equal pairs: ties everywhere in the order
    ROW_HOLES,       // NaN and -inf sprinkled among normal values
    ROW_ZEROS,       // the largest value is 0, as -0 and +0 at several ids
    ROW_HUGE,        // +-3e38 among normal values: logit - top overflows to -inf
    ROW_SUBNORMAL,   // every value a subnormal float or 0
    ROW_ONE_FINITE,  // one finite value, the rest NaN and -inf
    ROW_CONSTANT,    // every value 1.5
    ROW_FLAT,        // [-0.01, 0.01): top-p keeps most of the row, masses sum near vocab x 2^32
    ROW_SHARP,       // normal(0, 1) and one value 30 above: top-p keeps one token
    ROW_ALL_NAN,     // no finite value: -1
    ROW_ALL_NEG_INF, // no finite value: -1
    ROW_POS_INF,     // a +inf: -1
    ROW_NAN_NEG_INF, // NaN and -inf only: -1
    ROW_TIE_BAND,    // ~500 ids at 3.0 under 10 at 6.0, the rest below 2.5: a k in 11..510 cuts a tie
    ROW_DESCENDING,  // strictly decreasing with the id: the top-k are the lowest ids, 4 a thread
    ROW_CLUSTERED,   // normal(0, 1); 10 at the first 64 ids with (id / 4) % 512 == 0 (one thread reads them
                     // all) and at 64 random ids: equal values, in id order, the first crowded into one thread
    ROW_SPARSE,      // finite (normal(0, 2)) only where (id / 4) % 512 < 12, NaN elsewhere: 12 threads
    ROW_NUM_KINDS
};
static const char *ROW_KIND_NAME[ROW_NUM_KINDS] = {
    "uniform", "lm-like", "3-way tie", "coarse ties", "NaN/-inf holes", "-0/+0 top", "+-3e38", "subnormal",
    "one finite", "constant", "flat", "sharp", "all NaN", "all -inf", "a +inf", "NaN and -inf",
    "500-way tie band", "descending", "clustered top", "sparse finite"};

static void fill_row(rng_t *g, float *x, int V, int kind) {
    for (int i = 0; i < V; i++) {
        float v = rng_uniform(g, -4.0f, 4.0f);
        switch (kind) {
        case ROW_LM: v = rng_normal(g, 0.0f, 2.0f); break;
        case ROW_COARSE: v = roundf(v * 4.0f) / 4.0f; break;
        case ROW_HOLES: v = i % 13 == 5 ? NAN : i % 29 == 3 ? -INFINITY : v; break;
        case ROW_ZEROS: v = v - 10.0f; break;
        case ROW_HUGE: v = i % 7 == 0 ? 3e38f : i % 7 == 1 ? -3e38f : v; break;
        case ROW_SUBNORMAL: v = v * 1e-39f; break;
        case ROW_ONE_FINITE: v = i % 2 ? NAN : -INFINITY; break;
        case ROW_CONSTANT: v = 1.5f; break;
        case ROW_FLAT: v = v / 400.0f; break;
        case ROW_SHARP: v = rng_normal(g, 0.0f, 1.0f); break;
        case ROW_ALL_NAN: v = NAN; break;
        case ROW_ALL_NEG_INF: v = -INFINITY; break;
        case ROW_NAN_NEG_INF: v = i % 3 ? NAN : -INFINITY; break;
        case ROW_TIE_BAND: v = fminf(rng_normal(g, 0.0f, 1.0f), 2.5f); break;
        case ROW_DESCENDING: v = 8.0f - 16.0f * (float)i / (float)V; break;
        case ROW_CLUSTERED: v = rng_normal(g, 0.0f, 1.0f); break;
        case ROW_SPARSE: v = (i / 4) % 512 < 12 ? rng_normal(g, 0.0f, 2.0f) : NAN; break;
        default: break;
        }
        x[i] = v;
    }
    if (kind == ROW_LM)
        for (int j = 0; j < 4; j++) x[rng_int(g, 0, V - 1)] = 10.0f + (float)j;
    if (kind == ROW_COARSE)
        for (int i = 0; i + 1 < V; i += 2) x[i + 1] = x[i];
    if (kind == ROW_TIE3) x[V / 2] = x[V / 3] = x[V - 1] = 9.0f;
    if (kind == ROW_ZEROS)
        for (int i = V / 5; i < V; i += V / 5 + 1) x[i] = (i / 3) % 2 ? -0.0f : 0.0f;
    if (kind == ROW_ONE_FINITE) x[rng_int(g, 0, V - 1)] = 0.75f;
    if (kind == ROW_SHARP) x[rng_int(g, 0, V - 1)] = 30.0f;
    if (kind == ROW_POS_INF) x[rng_int(g, 0, V - 1)] = INFINITY;
    if (kind == ROW_TIE_BAND) {
        for (int j = 0; j < 500; j++) x[rng_int(g, 0, V - 1)] = 3.0f;
        for (int j = 0; j < 10; j++) x[rng_int(g, 0, V - 1)] = 6.0f;
    }
    if (kind == ROW_CLUSTERED) {
        for (int j = 0; j < 64 && 2048 * (j / 4) + j % 4 < V; j++) x[2048 * (j / 4) + j % 4] = 10.0f;
        for (int j = 0; j < 64; j++) x[rng_int(g, 0, V - 1)] = 10.0f;
    }
    bf16_rows(x, (size_t)V);
}

// Every GPU version against the reference (sample_tokens_cpu, the same
// arguments) on the same rows: each version's ids must equal the
// reference's on every row, and a second run must repeat them. One verdict
// per version; a FAIL for each differing row (the first 8) names it, its
// parameters and the ids.
static void compare_with_reference(const char *what, int V, long long stride, int R, const float *l,
                                   const float *temp, const int32_t *tk, const float *tp, const uint64_t *seed,
                                   const int64_t *gen, const int *kind) {
    int32_t *cpu = malloc(R * sizeof *cpu), *gpu = malloc(R * sizeof *gpu), *gpu2 = malloc(R * sizeof *gpu2);
    if (sample_tokens_cpu(cpu, l, stride, R, V, temp, tk, tp, seed, gen)) {
        verdict("FAIL", "sampler %s: CPU reference: %s", what, mv_last_error());
        free(cpu), free(gpu), free(gpu2);
        return;
    }
    int greedy = 0, sampled = 0, none = 0, not_argmax = 0;
    for (int r = 0; r < R; r++) {
        if (cpu[r] < 0) none++;
        else if (temp[r] == 0) greedy++;
        else {
            sampled++;
            not_argmax += cpu[r] != sampling_argmax_cpu(l + (size_t)r * stride, V);
        }
    }
    for (int v = 1; v <= SAMPLING_NUM_VERSIONS; v++) {
        const char *name = sampling_version_name(v);
        if (gpu_sample(v, l, stride, R, V, temp, tk, tp, seed, gen, gpu) ||
            gpu_sample(v, l, stride, R, V, temp, tk, tp, seed, gen, gpu2)) {
            verdict("FAIL", "sampler %s %s: GPU: %s", name, what, mv_last_error());
            continue;
        }
        int bad = 0;
        for (int r = 0; r < R; r++) {
            if (gpu[r] == cpu[r] && gpu2[r] == gpu[r]) continue;
            if (bad++ < 8)
                verdict("FAIL", "sampler %s %s row %d (%s; T %g, top_k %d, top_p %g, seed 0x%llx, gen_index %lld): "
                                "GPU %d (again: %d), CPU reference %d",
                        name, what, r, ROW_KIND_NAME[kind[r]], temp[r], tk[r], tp[r], (unsigned long long)seed[r],
                        (long long)gen[r], gpu[r], gpu2[r], cpu[r]);
        }
        if (bad) verdict("FAIL", "sampler %s %s: %d of %d rows differ from the CPU reference", name, what, bad, R);
        else verdict("PASS", "sampler %s %s: %d rows, every GPU id equal to the CPU reference's and repeatable (%d "
                             "greedy, %d sampled of which %d not the argmax, %d without a finite largest value: -1)",
                     name, what, R, greedy, sampled, not_argmax, none);
    }
    free(cpu), free(gpu), free(gpu2);
}

// One vocabulary size: rows of every kind with mixed parameters (greedy,
// tiny to huge temperatures, top-k from 1 to past the vocabulary, top-p
// from subnormal to off), seeds and gen_index spread over 64 bits.
static void check_sampler_vocab(int V, long long stride, int R, rng_t *g) {
    static const float temps[10] = {0.0f, 1e-45f, 1e-30f, 0.05f, 0.3f, 0.7f, 1.0f, 1.7f, 100.0f, 1e30f};
    static const float tps[8] = {1.0f, 0.999f, 0.95f, 0.9f, 0.5f, 0.05f, 1e-7f, 1e-40f};
    float *l = malloc((size_t)R * (size_t)stride * sizeof *l), *temp = malloc(R * sizeof *temp),
          *tp = malloc(R * sizeof *tp);
    int32_t *tk = malloc(R * sizeof *tk);
    uint64_t *seed = malloc(R * sizeof *seed);
    int64_t *gen = malloc(R * sizeof *gen);
    int *kind = malloc(R * sizeof *kind);
    for (int r = 0; r < R; r++) {
        kind[r] = r % ROW_NUM_KINDS;
        float *x = l + (size_t)r * stride;
        fill_row(g, x, V, kind[r]);
        for (long long i = V; i < stride; i++) x[i] = NAN;  // past the vocabulary: must never be read as a token
        const int ks[7] = {0, 1, 2, 40, V - 1, V, V + 5};
        temp[r] = temps[(r / 3) % 10];
        tk[r] = ks[(r / 7) % 7] < 0 ? 0 : ks[(r / 7) % 7];
        tp[r] = tps[(r / 11) % 8];
        seed[r] = rng_u64(g);
        gen[r] = r % 4 ? (int64_t)(rng_u64(g) >> 24) : r;  // up to 2^40, and small ones
    }
    char what[64];
    snprintf(what, sizeof what, "vocab %d%s", V, stride != V ? " (rows strided)" : "");
    compare_with_reference(what, V, stride, R, l, temp, tk, tp, seed, gen, kind);
    free(l), free(temp), free(tp), free(tk), free(seed), free(gen), free(kind);
}

// Rows aimed at version 2's paths (kernels/sampling.cu): top-k from 1 to
// past its 2048 candidates (1024, 1025: just past 1024; 2048, 2049: its
// bound), k equal to / around the number of finite logits (codes -1, -2,
// -3: n - 1, n, n + 1), ties at the k-th, top-p alone (also where the
// tokens outside the 2048 largest carry most of the mass), tiny top-p,
// top-p 1 with top-k, a top-p target met exactly by a prefix (constant rows: every
// mass 2^32, top_p 0.25 of 20, 0.5 of 8 and of an even count; the cut is
// the first prefix that reaches it, not the one past it), top_k 2 and 3 of
// nearly equal logits (the k-th token often wins), rows without an answer.
// Each case on PATH_ROWS rows of fresh logits, seeds and gen_index.
#define PATH_ROWS 3
typedef struct {
    int kind;
    float temperature;
    int top_k;  // < 0: relative to the row's finite logits n (-1: n - 1, -2: n, -3: n + 1)
    float top_p;
} path_case_t;
static const path_case_t PATH_CASES[] = {
    {ROW_LM, 0.6f, 1, 1.0f},             {ROW_LM, 0.6f, 2, 1.0f},             {ROW_LM, 0.6f, 20, 1.0f},
    {ROW_LM, 0.6f, 20, 0.95f},           {ROW_LM, 0.6f, 50, 0.95f},           {ROW_LM, 1.0f, 1000, 0.95f},
    {ROW_LM, 1.0f, 1024, 0.9f},          {ROW_LM, 1.0f, 1025, 0.9f},          {ROW_LM, 1.0f, 2048, 1.0f},
    {ROW_LM, 1.0f, 2049, 0.95f},         {ROW_LM, 0.6f, 0, 0.95f},            {ROW_LM, 0.6f, 20, 1e-7f},
    {ROW_LM, 0.6f, 0, 1e-7f},            {ROW_LM, 2.0f, 0, 0.005f},           {ROW_UNIFORM, 1.0f, 0, 0.01f},
    {ROW_LM, 0.6f, 0, 1.0f},             {ROW_LM, 0.0f, 20, 0.95f},           {ROW_LM, 0.6f, -1, 0.95f},
    {ROW_LM, 0.6f, -2, 0.95f},           {ROW_TIE_BAND, 0.7f, 20, 1.0f},      {ROW_TIE_BAND, 0.7f, 100, 0.9f},
    {ROW_TIE_BAND, 0.7f, 509, 1.0f},     {ROW_TIE_BAND, 0.7f, 510, 0.95f},    {ROW_TIE_BAND, 0.7f, 511, 1.0f},
    {ROW_TIE_BAND, 2.0f, 0, 0.5f},       {ROW_DESCENDING, 1.0f, 20, 1.0f},    {ROW_DESCENDING, 1.0f, 1025, 0.99f},
    {ROW_DESCENDING, 1.0f, 2048, 1.0f},  {ROW_DESCENDING, 1.0f, 2049, 1.0f},  {ROW_DESCENDING, 0.01f, 0, 0.9f},
    {ROW_CLUSTERED, 0.6f, 20, 0.95f},    {ROW_CLUSTERED, 0.6f, 0, 0.95f},     {ROW_CLUSTERED, 0.6f, 100, 1.0f},
    {ROW_CLUSTERED, 0.6f, 0, 0.5f},      {ROW_CLUSTERED, 1.0f, 0, 0.2f},      {ROW_CONSTANT, 0.6f, 20, 0.25f},
    {ROW_CONSTANT, 0.6f, 0, 0.5f},       {ROW_CONSTANT, 1.0f, 20, 0.25f},     {ROW_CONSTANT, 1.0f, 0, 0.5f},
    {ROW_CONSTANT, 2.0f, 8, 0.5f},       {ROW_DESCENDING, 1.0f, 2, 1.0f},     {ROW_DESCENDING, 1.0f, 3, 0.9f},
    {ROW_SPARSE, 0.6f, 40, 0.95f},       {ROW_SPARSE, 0.6f, 50, 1.0f},        {ROW_SPARSE, 0.6f, -1, 0.95f},
    {ROW_SPARSE, 0.6f, -2, 0.95f},       {ROW_SPARSE, 0.6f, -3, 1.0f},        {ROW_HOLES, 0.6f, -1, 1.0f},
    {ROW_HOLES, 0.6f, -2, 0.9f},         {ROW_HOLES, 0.6f, 20, 0.95f},        {ROW_CONSTANT, 0.6f, 20, 0.95f},
    {ROW_CONSTANT, 0.6f, 0, 0.3f},       {ROW_FLAT, 0.6f, 0, 0.95f},          {ROW_FLAT, 0.6f, 1000, 0.95f},
    {ROW_SHARP, 0.6f, 20, 0.95f},        {ROW_SHARP, 0.6f, 0, 0.95f},         {ROW_COARSE, 0.6f, 20, 0.95f},
    {ROW_TIE3, 0.6f, 2, 1.0f},           {ROW_ZEROS, 0.6f, 20, 0.95f},        {ROW_HUGE, 0.6f, 20, 0.95f},
    {ROW_SUBNORMAL, 0.6f, 20, 0.95f},    {ROW_ONE_FINITE, 0.6f, 20, 0.95f},   {ROW_ONE_FINITE, 0.6f, 1, 1.0f},
    {ROW_POS_INF, 0.6f, 20, 0.95f},      {ROW_ALL_NAN, 0.6f, 20, 0.95f},      {ROW_ALL_NEG_INF, 0.6f, 0, 0.9f},
    {ROW_NAN_NEG_INF, 0.6f, 20, 1.0f},
};
#define N_PATH_CASES ((int)(sizeof PATH_CASES / sizeof *PATH_CASES))

// Greedy rows at a few rows a launch, where version 3 cuts each row into
// up to 32 slices (2 x SMs / rows): every kind of row, 4 rows a launch, so
// that an argmax, a tie (ROW_TIE3: the same largest value at V/3, V/2 and
// V - 1, in different slices), the one finite value (ROW_ONE_FINITE) or a
// +inf (ROW_POS_INF) lands in any slice, and rows without a finite value
// combine to -1.
static void check_sampler_greedy_split(int V, long long stride, rng_t *g) {
    const int R = 4;
    float *l = malloc((size_t)R * (size_t)stride * sizeof *l), temp[4] = {0}, tp[4] = {1.0f, 1.0f, 1.0f, 1.0f};
    int32_t tk[4] = {0};
    uint64_t seed[4];
    int64_t gen[4];
    int kind[4];
    for (int k0 = 0; k0 < ROW_NUM_KINDS; k0 += R) {
        for (int r = 0; r < R; r++) {
            kind[r] = (k0 + r) % ROW_NUM_KINDS;
            float *x = l + (size_t)r * stride;
            fill_row(g, x, V, kind[r]);
            for (long long i = V; i < stride; i++) x[i] = NAN;
            seed[r] = rng_u64(g), gen[r] = r;
        }
        char what[96];
        snprintf(what, sizeof what, "greedy split vocab %d%s, kinds %d-%d", V, stride != V ? " (rows strided)" : "",
                 k0, k0 + R - 1);
        compare_with_reference(what, V, stride, R, l, temp, tk, tp, seed, gen, kind);
    }
    free(l);
}

static void check_sampler_paths(int V, rng_t *g) {
    const int R = N_PATH_CASES * PATH_ROWS;
    float *l = malloc((size_t)R * (size_t)V * sizeof *l), *temp = malloc(R * sizeof *temp),
          *tp = malloc(R * sizeof *tp);
    int32_t *tk = malloc(R * sizeof *tk);
    uint64_t *seed = malloc(R * sizeof *seed);
    int64_t *gen = malloc(R * sizeof *gen);
    int *kind = malloc(R * sizeof *kind);
    for (int r = 0; r < R; r++) {
        const path_case_t *c = &PATH_CASES[r / PATH_ROWS];
        float *x = l + (size_t)r * V;
        fill_row(g, x, V, kind[r] = c->kind);
        int n = 0;
        for (int i = 0; i < V; i++) n += isfinite(x[i]) != 0;
        const int k = c->top_k >= 0 ? c->top_k : n - 1 + (-c->top_k - 1);
        temp[r] = c->temperature, tk[r] = k < 0 ? 0 : k, tp[r] = c->top_p;
        seed[r] = rng_u64(g);
        gen[r] = (int64_t)(rng_u64(g) >> 24);
    }
    char what[64];
    snprintf(what, sizeof what, "paths vocab %d", V);
    compare_with_reference(what, V, V, R, l, temp, tk, tp, seed, gen, kind);
    free(l), free(temp), free(tp), free(tk), free(seed), free(gen), free(kind);
}

// Frequencies: one row of 8 logits drawn N_FREQ times (gen_index 0..N-1):
// every id equal to the reference's, and the frequencies within FREQ_TOL
// of softmax(logits / T) over the reference's kept set, computed in double
// (the distribution both sides must draw from, checked on the GPU's
// output), for every version.
static void check_sampler_frequencies(void) {
    const int V = 8;
    const float base[8] = {1.0f, 0.5f, 0.5f, -0.25f, 2.0f, -3.0f, 0.875f, 1.125f};  // bf16 values
    const float temps[3] = {1.0f, 0.7f, 1.3f};
    const int32_t tks[3] = {0, 5, 0};
    const float tps[3] = {1.0f, 1.0f, 0.8f};
    for (int c = 0; c < 3; c++) {
        float *l = malloc((size_t)N_FREQ * V * sizeof *l), *temp = malloc(N_FREQ * sizeof *temp),
              *tp = malloc(N_FREQ * sizeof *tp);
        int32_t *tk = malloc(N_FREQ * sizeof *tk), *out = malloc(N_FREQ * sizeof *out),
                *want = malloc(N_FREQ * sizeof *want);
        uint64_t *seed = malloc(N_FREQ * sizeof *seed);
        int64_t *gen = malloc(N_FREQ * sizeof *gen);
        for (int r = 0; r < N_FREQ; r++) {
            memcpy(l + (size_t)r * V, base, sizeof base);
            temp[r] = temps[c], tk[r] = tks[c], tp[r] = tps[c], seed[r] = 77, gen[r] = r;
        }
        double prob[8] = {0}, sum = 0;
        sampling_scratch_t s;
        const sampling_row_t row = {.temperature = temps[c], .top_k = tks[c], .top_p = tps[c], .seed = 77, .gen_index = 0};
        int n = 0;
        if (sampling_scratch_init(&s, V) || sampling_kept_cpu(&s, base, &row, &n)) n = 0;
        for (int j = 0; j < n; j++) {
            const int id = sampling_unpack_id(s.order[j]);
            sum += prob[id] = exp(((double)base[id] - 2.0) / temps[c]);
        }
        sampling_scratch_free(&s);
        if (n == 0 || sample_tokens_cpu(want, l, V, N_FREQ, V, temp, tk, tp, seed, gen)) {
            verdict("FAIL", "sampler frequencies: %s", mv_last_error());
            n = 0;
        }
        for (int v = 1; v <= SAMPLING_NUM_VERSIONS && n > 0; v++) {
            if (gpu_sample(v, l, V, N_FREQ, V, temp, tk, tp, seed, gen, out)) {
                verdict("FAIL", "sampler %s frequencies: %s", sampling_version_name(v), mv_last_error());
                continue;
            }
            double freq[8] = {0}, worst = 0;
            int differ = 0;
            for (int r = 0; r < N_FREQ; r++) {
                differ += out[r] != want[r];
                if (out[r] >= 0 && out[r] < V) freq[out[r]] += 1.0 / N_FREQ;
            }
            for (int i = 0; i < V; i++) worst = fmax(worst, fabs(freq[i] - prob[i] / sum));
            verdict(worst < FREQ_TOL && !differ ? "PASS" : "FAIL",
                    "sampler %s frequencies (T %g, top_k %d, top_p %g, %d draws, %d kept): %d ids differ from the "
                    "CPU reference; max |freq - softmax| %.4f (tol %g)",
                    sampling_version_name(v), temps[c], tks[c], tps[c], N_FREQ, n, differ, worst, FREQ_TOL);
        }
        free(l), free(temp), free(tp), free(tk), free(out), free(want), free(seed), free(gen);
    }
}

static int cmp_float(const void *a, const void *b) {
    const float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

// Timing (conventions: check, then time): `rows` rows of `V` logits from
// normal(0, 3) (an LM head's spread: a bell, the top ~13 above the mean),
// each version under four settings, the median of `reps` runs timed with
// CUDA events, each run after a write of twice the L2 (the 155.6 MB of
// logits of 256 x 151936 are 3x the H200's L2 already). Napkin math: one
// read of those logits is 155.6 MB, ~39 us at ~4 TB/s; kernels/sampling.cu
// counts each version's passes. The engine's budget: a greedy step at
// batch 256 takes ~10-12 ms, so sampling should cost well under 0.5 ms
// (5%). Version 2's ids must equal version 1's (FAIL otherwise); the
// timings themselves are information, not a verdict.
static void time_sampler(int rows, int V, int reps, rng_t *g) {
    static const struct {
        const char *what;
        float temperature;
        int top_k;
        float top_p;
    } cfg[4] = {{"greedy", 0.0f, 0, 1.0f},
                {"T 0.6", 0.6f, 0, 1.0f},
                {"T 0.6, top_k 20", 0.6f, 20, 1.0f},
                {"Qwen3 default (T 0.6, top_k 20, top_p 0.95)", 0.6f, 20, 0.95f}};
    const size_t R = (size_t)rows, n = R * (size_t)V;
    float *h_logits = malloc(n * sizeof *h_logits), *h_temp = malloc(R * sizeof *h_temp),
          *h_tp = malloc(R * sizeof *h_tp), *ms = malloc((size_t)reps * sizeof *ms);
    int32_t *h_tk = malloc(R * sizeof *h_tk), *h_ids[SAMPLING_NUM_VERSIONS + 1] = {0};
    uint64_t *h_seed = malloc(R * sizeof *h_seed);
    int64_t *h_gen = malloc(R * sizeof *h_gen);
    for (int v = 1; v <= SAMPLING_NUM_VERSIONS; v++) h_ids[v] = malloc(R * sizeof(int32_t));
    fill_normal_f32(g, h_logits, n, 0.0f, 3.0f);
    bf16_rows(h_logits, n);
    for (size_t r = 0; r < R; r++) h_seed[r] = rng_u64(g), h_gen[r] = (int64_t)(rng_u64(g) >> 40);
    int dev = 0, l2 = 0;
    sbufs_t d = {0};
    void *flush = NULL;
    cudaEvent_t t0 = NULL, t1 = NULL;
    int rc = CUDA_TRY(cudaGetDevice(&dev)) || CUDA_TRY(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev)) ||
             CUDA_TRY(cudaMalloc(&flush, 2 * (size_t)l2 + 1)) ||
             CUDA_TRY(cudaMalloc((void **)&d.logits, n * sizeof(float))) ||
             CUDA_TRY(cudaMalloc((void **)&d.logits16, n * sizeof(bf16_t))) ||
             CUDA_TRY(cudaMalloc((void **)&d.temp, R * sizeof(float))) ||
             CUDA_TRY(cudaMalloc((void **)&d.top_p, R * sizeof(float))) ||
             CUDA_TRY(cudaMalloc((void **)&d.top_k, R * sizeof(int32_t))) ||
             CUDA_TRY(cudaMalloc((void **)&d.out, R * sizeof(int32_t))) ||
             CUDA_TRY(cudaMalloc((void **)&d.seed, R * sizeof(uint64_t))) ||
             CUDA_TRY(cudaMalloc((void **)&d.gen, R * sizeof(int64_t))) || CUDA_TRY(cudaEventCreate(&t0)) ||
             CUDA_TRY(cudaEventCreate(&t1)) ||
             CUDA_TRY(cudaMemcpy(d.logits, h_logits, n * sizeof(float), cudaMemcpyHostToDevice)) ||
             upload_bf16(d.logits16, h_logits, n) ||
             CUDA_TRY(cudaMemcpy(d.seed, h_seed, R * sizeof(uint64_t), cudaMemcpyHostToDevice)) ||
             CUDA_TRY(cudaMemcpy(d.gen, h_gen, R * sizeof(int64_t), cudaMemcpyHostToDevice));
    const double mb = (double)n * sizeof(float) / 1e6;
    for (int c = 0; c < 4 && !rc; c++) {
        for (size_t r = 0; r < R; r++) h_temp[r] = cfg[c].temperature, h_tk[r] = cfg[c].top_k, h_tp[r] = cfg[c].top_p;
        rc = CUDA_TRY(cudaMemcpy(d.temp, h_temp, R * sizeof(float), cudaMemcpyHostToDevice)) ||
             CUDA_TRY(cudaMemcpy(d.top_k, h_tk, R * sizeof(int32_t), cudaMemcpyHostToDevice)) ||
             CUDA_TRY(cudaMemcpy(d.top_p, h_tp, R * sizeof(float), cudaMemcpyHostToDevice));
        double median[SAMPLING_NUM_VERSIONS + 1] = {0}, lo[SAMPLING_NUM_VERSIONS + 1] = {0},
               hi[SAMPLING_NUM_VERSIONS + 1] = {0};
        for (int v = 1; v <= SAMPLING_NUM_VERSIONS && !rc; v++) {
            rc = CUDA_TRY(cudaMemset(d.out, 0x7f, R * sizeof(int32_t))) ||  // poisoned: an unwritten row shows
                 sample_ws(v, d.out, d.logits, d.logits16, V, rows, V, d.temp, d.top_k, d.top_p, d.seed, d.gen, 0) ||
                 CUDA_TRY(cudaMemcpy(h_ids[v], d.out, R * sizeof(int32_t), cudaMemcpyDeviceToHost));  // + warm-up
            for (int i = 0; i < reps && !rc; i++) {
                rc = CUDA_TRY(cudaMemsetAsync(flush, i & 0xff, 2 * (size_t)l2 + 1, 0)) ||
                     CUDA_TRY(cudaEventRecord(t0, 0)) ||
                     sample_ws(v, d.out, d.logits, d.logits16, V, rows, V, d.temp, d.top_k, d.top_p, d.seed, d.gen,
                               0) ||
                     CUDA_TRY(cudaEventRecord(t1, 0)) || CUDA_TRY(cudaEventSynchronize(t1)) ||
                     CUDA_TRY(cudaEventElapsedTime(&ms[i], t0, t1));
            }
            if (rc) break;
            qsort(ms, (size_t)reps, sizeof *ms, cmp_float);
            median[v] = ms[reps / 2], lo[v] = ms[0], hi[v] = ms[reps - 1];
        }
        if (rc) break;
        int differ = 0;
        for (int v = 2; v <= SAMPLING_NUM_VERSIONS; v++)
            for (size_t r = 0; r < R; r++) differ += h_ids[v][r] != h_ids[1][r];
        if (differ)
            verdict("FAIL", "sampler timing %s: %d ids of the later versions differ from version 1's", cfg[c].what,
                    differ);
        const int last = SAMPLING_NUM_VERSIONS;
        printf("sampler timing %d rows x %d, %s: ", rows, V, cfg[c].what);
        for (int v = 1; v <= last; v++)
            printf("%s %.3f ms (%.3f-%.3f)%s", sampling_version_name(v), median[v], lo[v], hi[v], v < last ? ", " : "");
        printf(", median of %d; v1/v%d %.1fx; v3 = one read of the %.1f MB of fp32 logits at %.0f GB/s, v4 of the "
               "%.1f MB of bf16 at %.0f GB/s\n",
               reps, last, median[1] / median[last], mb, mb / median[3], mb / 2, mb / 2 / median[4]);
    }
    if (rc) verdict("FAIL", "sampler timing: %s", mv_last_error());
    if (t0) cudaEventDestroy(t0);
    if (t1) cudaEventDestroy(t1);
    cudaFree(flush), cudaFree(d.logits), cudaFree(d.logits16), cudaFree(d.temp), cudaFree(d.top_p), cudaFree(d.top_k),
        cudaFree(d.out), cudaFree(d.seed), cudaFree(d.gen);
    for (int v = 1; v <= SAMPLING_NUM_VERSIONS; v++) free(h_ids[v]);
    free(h_logits), free(h_temp), free(h_tp), free(ms), free(h_tk), free(h_seed), free(h_gen);
}

// ---- the sampler's options on the GPU (kernels/sampling_opts.h) against the host sampler -------
//
// The host rule is chapters/09-engine/runtime/sampler.c's sampler_sample_seq
// (logprobs of the raw row; min_tokens; penalties; the draw with min_p),
// called as the engine calls it; the GPU runs sampling_prepare_cuda,
// sample_tokens_cuda (versions 1 to 3) and sampling_logprobs_finish_cuda on
// the same rows, and for version 4 sampling_prepare_bf16_cuda and
// sample_tokens_bf16_cuda on their bf16 copy. Required: the prepared logits bit for bit equal to the
// host's row after min_tokens and the penalties, masked by
// sampling_min_p_mask_cpu (a NaN may change its payload: any NaN for a
// NaN); the ids equal; the top ids equal; the log-probabilities within the
// tolerance below; d_counts zero again after every run; rows without
// logprobs leave their d_lp bytes as they were.
//
// Log-probabilities: both sides sum exp(l - top) in double, the host in a
// loop, the GPU in a tree, each term within an ulp of double (glibc's exp
// and CUDA's), so the two sums differ by at most about vocab x 2^-53
// relative (2e-11 at 151936): lse differs by that much, far below a
// float's ulp at any value the logits give. The float results are then
// equal or one ulp apart (when a rounding boundary falls between the two
// doubles): LP_REL_TOL is 2 ulp (a pair straddling a power of two), and
// LP_ABS_TOL covers the 2e-11 near 0 with 50x to spare. -inf must be -inf.
#define LP_REL_TOL 0x1p-22
#define LP_ABS_TOL 1e-9
#define OPTS_MAX_IDS 512  // a row's ids on the GPU: prompt, output (each with bad ids mixed in) and stop ids
#define OPTS_MAX_STOP 4

// One batch of rows: the host's requests and the GPU's inputs made from them.
typedef struct {
    int R, V, ids_per_row;
    long long stride;
    float *logits;            // [R, stride] raw; NaN past V
    sampling_params_t *p;     // [R]
    int32_t *tokens;          // [R, OPTS_MAX_IDS] the host's sequence: num_prompt ids, then the generated
    int *num_prompt, *num_tokens;  // [R]
    int32_t *stop;            // [R, OPTS_MAX_STOP] eos / stop ids (one may lie outside the vocabulary)
    int *num_stop, *kind;     // [R]
    sampling_opts_row_t *opts;  // [R] the GPU's
    int32_t *ids;             // [R, ids_per_row] the GPU's: the same ids, with bad ones mixed in
    float *temp, *top_p;      // [R] the sampler's
    int32_t *top_k;
    uint64_t *seed;
    int64_t *gen;
} opts_batch_t;

// What the host gives for a batch.
typedef struct {
    float *prepared;          // [R, stride] the row after min_tokens, penalties and the min_p mask
    int32_t *id;              // [R] -1: the host sampler found no answer
    int *lp_ok;               // [R] logprobs wanted and the raw row has a finite largest value
    sampler_logprob_t *lp;    // [R]
} opts_expect_t;

static void opts_batch_free(opts_batch_t *b) {
    free(b->logits), free(b->p), free(b->tokens), free(b->num_prompt), free(b->num_tokens), free(b->stop);
    free(b->num_stop), free(b->kind), free(b->opts), free(b->ids), free(b->temp), free(b->top_p), free(b->top_k);
    free(b->seed), free(b->gen);
}

static void opts_batch_alloc(opts_batch_t *b, int R, int V, long long stride, int ids_per_row) {
    const size_t r = (size_t)R;
    *b = (opts_batch_t){.R = R, .V = V, .ids_per_row = ids_per_row, .stride = stride};
    b->logits = mv_xmalloc(r * (size_t)stride * sizeof(float));
    b->p = mv_xmalloc(r * sizeof *b->p);
    b->tokens = mv_xmalloc(r * OPTS_MAX_IDS * sizeof(int32_t));
    b->num_prompt = mv_xmalloc(r * sizeof(int)), b->num_tokens = mv_xmalloc(r * sizeof(int));
    b->stop = mv_xmalloc(r * OPTS_MAX_STOP * sizeof(int32_t));
    b->num_stop = mv_xmalloc(r * sizeof(int)), b->kind = mv_xmalloc(r * sizeof(int));
    b->opts = mv_xmalloc(r * sizeof *b->opts);
    b->ids = mv_xmalloc(r * (size_t)ids_per_row * sizeof(int32_t));
    b->temp = mv_xmalloc(r * sizeof(float)), b->top_p = mv_xmalloc(r * sizeof(float));
    b->top_k = mv_xmalloc(r * sizeof(int32_t));
    b->seed = mv_xmalloc(r * sizeof(uint64_t)), b->gen = mv_xmalloc(r * sizeof(int64_t));
}

// Row r: logits of a fill_row kind (every 17th with only five non-NaN
// values: top_logprobs past them), sampler parameters, and, on all but
// every 6th row (all off), each option on or off at random: min_p, the
// three penalties (values that are not exact binary fractions, so the
// roundings matter), logprobs with 0..20 top ids, min_tokens masking or
// just past. The penalty and stop ids come mostly from a pool holding the
// row's 8 largest, so they change the draw. On every 5th row the GPU's ids
// also carry ids outside the vocabulary, which it must skip (the host
// validates them away: its sequence never has them). Every 7th row crowds
// its 24 largest logits into ids 1024 k, which one thread of the prepare
// kernel reads (kernels/sampling_opts.cu: thread t reads t + 1024 j), and
// asks for 20 top logprobs: more than the 4 packs a thread keeps, so the
// merge must refill its lists from the row (ROW_CLUSTERED does it too, by 4
// threads of 16).
static void opts_make_row(rng_t *g, opts_batch_t *b, int r) {
    static const float temps[5] = {0.0f, 0.3f, 0.6f, 1.0f, 1.5f}, tps[3] = {1.0f, 0.95f, 0.8f};
    static const float mps[6] = {0.01f, 0.05f, 0.1f, 0.3f, 0.5f, 1.0f};
    static const int ks[4] = {0, 1, 20, 50};
    const int V = b->V;
    float *x = b->logits + (size_t)r * b->stride;
    fill_row(g, x, V, b->kind[r] = r % ROW_NUM_KINDS);
    if (r % 17 == 16) {
        for (int i = 0; i < V; i++) x[i] = NAN;
        for (int j = 0; j < 5; j++) x[rng_int(g, 0, V - 1)] = bf16_round(rng_normal(g, 0.0f, 2.0f));
    }
    const int crowded = r % 7 == 3 && V > 1024;
    for (int k = 0; crowded && k < 24 && 1024 * k < V; k++) x[1024 * k] = 12.0f - 0.25f * (float)k;
    for (long long i = V; i < b->stride; i++) x[i] = NAN;
    int32_t pool[24];
    float lp1, lps[8];
    const int n_big = V < 8 ? V : 8;
    if (sampling_logprobs_cpu(x, V, 0, n_big, &lp1, pool, lps))
        for (int j = 0; j < n_big; j++) pool[j] = -1;
    for (int j = 0; j < 24; j++)
        if (j >= n_big || pool[j] < 0) pool[j] = rng_int(g, 0, V - 1);

    sampling_params_t *p = &b->p[r];
    *p = (sampling_params_t){.temperature = temps[rng_int(g, 0, 4)], .top_k = ks[rng_int(g, 0, 3)],
                             .top_p = tps[rng_int(g, 0, 2)], .max_tokens = 1 << 20};
    const int all_off = r % 6 == 0;
    if (!all_off) {
        if (rng_int(g, 0, 1)) p->min_p = mps[rng_int(g, 0, 5)];
        if (rng_int(g, 0, 1)) p->presence_penalty = rng_int(g, 0, 1) ? 0.7f : rng_uniform(g, -2.0f, 2.0f);
        if (rng_int(g, 0, 1)) p->frequency_penalty = rng_int(g, 0, 1) ? 0.3f : rng_uniform(g, -2.0f, 2.0f);
        if (rng_int(g, 0, 1)) p->repetition_penalty = rng_int(g, 0, 1) ? 1.1f : rng_uniform(g, 0.5f, 2.0f);
        if (rng_int(g, 0, 1)) p->logprobs = 1, p->top_logprobs = rng_int(g, 0, V < 20 ? V : 20);
    }
    if (crowded || (b->kind[r] == ROW_CLUSTERED && !all_off)) p->logprobs = 1, p->top_logprobs = V < 20 ? V : 20;
    const int np = rng_int(g, 0, 300), no = rng_int(g, 0, 150), bad = r % 5 == 1;
    int32_t *t = b->tokens + (size_t)r * OPTS_MAX_IDS;
    for (int k = 0; k < np + no; k++) t[k] = rng_int(g, 0, 9) < 7 ? pool[rng_int(g, 0, 23)] : rng_int(g, 0, V - 1);
    b->num_prompt[r] = np, b->num_tokens[r] = np + no;
    int32_t *stop = b->stop + (size_t)r * OPTS_MAX_STOP;
    int ns = 0;
    if (!all_off && rng_int(g, 0, 1)) {
        ns = rng_int(g, 1, OPTS_MAX_STOP);
        for (int k = 0; k < ns; k++) stop[k] = k == 3 ? V + 7 : rng_int(g, 0, 1) ? pool[rng_int(g, 0, 7)] : rng_int(g, 0, V - 1);
        p->min_tokens = rng_int(g, 0, 2) ? no + 1 + rng_int(g, 0, 3) : no;  // masking, or just done
    }
    b->num_stop[r] = ns;

    // The GPU's ids: prompt, output, stop ids, at this row's slot of the id array.
    const int base = r * OPTS_MAX_IDS;
    int32_t *d = b->ids + base;
    int n = 0;
    for (int k = 0; k < np; k++) d[n++] = t[k];
    if (bad) d[n++] = -1, d[n++] = V;
    const int np_gpu = n;
    for (int k = 0; k < no; k++) d[n++] = t[np + k];
    if (bad) d[n++] = V + 100;
    const int no_gpu = n - np_gpu, stop_at = n;
    for (int k = 0; k < ns; k++) d[n++] = stop[k];
    b->opts[r] = (sampling_opts_row_t){.temperature = p->temperature,
                                       .min_p = p->min_p,
                                       .presence = p->presence_penalty,
                                       .frequency = p->frequency_penalty,
                                       .repetition = p->repetition_penalty == 0 ? 1.0f : p->repetition_penalty,
                                       .ids_start = base,
                                       .num_prompt = np_gpu,
                                       .num_output = no_gpu,
                                       .stop_start = base + stop_at,
                                       .num_stop = no < p->min_tokens ? ns : 0,
                                       .top_logprobs = p->logprobs ? p->top_logprobs : -1};
    b->temp[r] = p->temperature, b->top_k[r] = p->top_k, b->top_p[r] = p->top_p;
    b->seed[r] = rng_u64(g), b->gen[r] = no;
}

// The host's answers for every row, as the engine's host sampler gives them.
static int opts_expect(const opts_batch_t *b, opts_expect_t *e) {
    const int R = b->R, V = b->V;
    e->prepared = mv_xmalloc((size_t)R * (size_t)b->stride * sizeof(float));
    e->id = mv_xmalloc((size_t)R * sizeof(int32_t)), e->lp_ok = mv_xmalloc((size_t)R * sizeof(int));
    e->lp = mv_xmalloc((size_t)R * sizeof *e->lp);
    sampler_scratch_t ss;
    if (sampler_scratch_init(&ss, V)) return -1;
    int rc = 0;
    for (int r = 0; r < R && !rc; r++) {
        const float *raw = b->logits + (size_t)r * b->stride;
        float *x = e->prepared + (size_t)r * b->stride;
        const sampling_params_t *p = &b->p[r];
        const sampler_seq_t seq = {b->tokens + (size_t)r * OPTS_MAX_IDS, b->num_prompt[r], b->num_tokens[r],
                                   b->stop + (size_t)r * OPTS_MAX_STOP, b->num_stop[r]};
        sampler_logprob_t *lp = &e->lp[r];
        memcpy(x, raw, (size_t)b->stride * sizeof(float));
        e->id[r] = -1;
        e->lp_ok[r] = p->logprobs;
        if (sampler_sample_seq(&ss, x, p, b->seed[r], &seq, &e->id[r], p->logprobs ? lp : NULL)) {
            // No answer for the draw, or (logprobs) none for the raw row: the draw alone tells which.
            memcpy(x, raw, (size_t)b->stride * sizeof(float));
            if (sampler_sample_seq(&ss, x, p, b->seed[r], &seq, &e->id[r], NULL)) e->id[r] = -1;
            if (p->logprobs) {
                lp->num_top = p->top_logprobs;
                e->lp_ok[r] = !sampling_logprobs_cpu(raw, V, e->id[r] >= 0 ? e->id[r] : 0, p->top_logprobs,
                                                     &lp->logprob, lp->top_ids, lp->top_logprobs);
                if (e->id[r] < 0) lp->logprob = -INFINITY;  // the GPU's for an id of -1
            }
        }
        rc = sampling_min_p_mask_cpu(x, V, p->temperature, p->min_p);
    }
    sampler_scratch_free(&ss);
    return rc;
}

static void opts_expect_free(opts_expect_t *e) { free(e->prepared), free(e->id), free(e->lp_ok), free(e->lp); }

static int lp_close(float gpu, float cpu) {
    if (isnan(gpu) || isnan(cpu)) return 0;
    if (isinf(gpu) || isinf(cpu)) return gpu == cpu;
    return fabs((double)gpu - (double)cpu) <= LP_ABS_TOL + LP_REL_TOL * fabs((double)cpu);
}

// The GPU's buffers for one batch (d_counts zeroed here, once).
typedef struct {
    float *logits, *raw, *temp, *top_p;
    bf16_t *logits16;  // the raw rows as bf16, which version 4 reads (and prepares from)
    int32_t *ids, *top_k, *out;
    uint32_t *counts;
    uint64_t *seed;
    int64_t *gen;
    sampling_opts_row_t *opts;
    sampling_logprobs_t *lp;
} obufs_t;

static void obufs_free(obufs_t *d) {
    cudaFree(d->logits), cudaFree(d->logits16), cudaFree(d->raw), cudaFree(d->temp), cudaFree(d->top_p), cudaFree(d->ids);
    cudaFree(d->top_k), cudaFree(d->out), cudaFree(d->counts), cudaFree(d->seed), cudaFree(d->gen);
    cudaFree(d->opts), cudaFree(d->lp);
    *d = (obufs_t){0};
}

static int obufs_init(obufs_t *d, const opts_batch_t *b) {
    const size_t R = (size_t)b->R, n = R * (size_t)b->stride;
    *d = (obufs_t){0};
    return CUDA_TRY(cudaMalloc((void **)&d->logits, n * sizeof(float))) ||
           CUDA_TRY(cudaMalloc((void **)&d->logits16, n * sizeof(bf16_t))) || upload_bf16(d->logits16, b->logits, n) ||
           CUDA_TRY(cudaMalloc((void **)&d->raw, n * sizeof(float))) ||
           CUDA_TRY(cudaMalloc((void **)&d->temp, R * sizeof(float))) ||
           CUDA_TRY(cudaMalloc((void **)&d->top_p, R * sizeof(float))) ||
           CUDA_TRY(cudaMalloc((void **)&d->ids, R * (size_t)b->ids_per_row * sizeof(int32_t))) ||
           CUDA_TRY(cudaMalloc((void **)&d->top_k, R * sizeof(int32_t))) ||
           CUDA_TRY(cudaMalloc((void **)&d->out, R * sizeof(int32_t))) ||
           CUDA_TRY(cudaMalloc((void **)&d->counts, R * (size_t)b->V * sizeof(uint32_t))) ||
           CUDA_TRY(cudaMalloc((void **)&d->seed, R * sizeof(uint64_t))) ||
           CUDA_TRY(cudaMalloc((void **)&d->gen, R * sizeof(int64_t))) ||
           CUDA_TRY(cudaMalloc((void **)&d->opts, R * sizeof(sampling_opts_row_t))) ||
           CUDA_TRY(cudaMalloc((void **)&d->lp, R * sizeof(sampling_logprobs_t))) ||
           CUDA_TRY(cudaMemset(d->counts, 0, R * (size_t)b->V * sizeof(uint32_t))) ||
           CUDA_TRY(cudaMemcpy(d->temp, b->temp, R * sizeof(float), cudaMemcpyHostToDevice)) ||
           CUDA_TRY(cudaMemcpy(d->top_p, b->top_p, R * sizeof(float), cudaMemcpyHostToDevice)) ||
           CUDA_TRY(cudaMemcpy(d->top_k, b->top_k, R * sizeof(int32_t), cudaMemcpyHostToDevice)) ||
           CUDA_TRY(cudaMemcpy(d->ids, b->ids, R * (size_t)b->ids_per_row * sizeof(int32_t), cudaMemcpyHostToDevice)) ||
           CUDA_TRY(cudaMemcpy(d->seed, b->seed, R * sizeof(uint64_t), cudaMemcpyHostToDevice)) ||
           CUDA_TRY(cudaMemcpy(d->gen, b->gen, R * sizeof(int64_t), cudaMemcpyHostToDevice)) ||
           CUDA_TRY(cudaMemcpy(d->opts, b->opts, R * sizeof(sampling_opts_row_t), cudaMemcpyHostToDevice))
               ? -1
               : 0;
}

// The raw logits up (the fp32 rows; the bf16 copy went up once, in
// obufs_init, since nothing writes it), the outputs poisoned (an unwritten
// id or logprob shows; d_raw NaN). version 4: the fp32 rows poisoned too
// (all bytes 0xff): the prepare kernel must widen each row it changes from
// the bf16 copy, and leave the others alone.
// Ends with a device synchronize: the copies and memsets run on the legacy
// stream, and the graph replays on a non-blocking stream, which does not wait
// for it (a pageable cudaMemcpy may even return before its DMA is done).
static int opts_upload(int version, const obufs_t *d, const opts_batch_t *b) {
    const size_t R = (size_t)b->R, n = R * (size_t)b->stride;
    return (version == 4 ? CUDA_TRY(cudaMemset(d->logits, 0xff, n * sizeof(float)))
                         : CUDA_TRY(cudaMemcpy(d->logits, b->logits, n * sizeof(float), cudaMemcpyHostToDevice))) ||
                   CUDA_TRY(cudaMemset(d->raw, 0xff, n * sizeof(float))) ||
                   CUDA_TRY(cudaMemset(d->out, 0x7f, R * sizeof(int32_t))) ||
                   CUDA_TRY(cudaMemset(d->lp, 0x7f, R * sizeof(sampling_logprobs_t))) ||
                   CUDA_TRY(cudaDeviceSynchronize())
               ? -1
               : 0;
}

static int opts_launch(int version, const obufs_t *d, const opts_batch_t *b, cudaStream_t stream) {
    if (version == 4)  // as the engine calls it (runner_cuda.c, enqueue_sample)
        return sampling_prepare_bf16_cuda(d->logits, d->logits16, b->stride, b->R, b->V, d->opts, d->ids, d->counts,
                                          d->raw, d->lp, stream) ||
                       sample_ws_reserve(4, b->R) ||
                       sample_tokens_bf16_cuda(d->out, d->logits16, d->logits, d->opts, b->stride, b->R, b->V, d->temp,
                                               d->top_k, d->top_p, d->seed, d->gen, g_sample_ws, g_sample_ws_bytes,
                                               stream) ||
                       sampling_logprobs_finish_cuda(d->out, d->raw, b->stride, b->R, d->opts, d->lp, stream)
                   ? -1
                   : 0;
    return sampling_prepare_cuda(d->logits, b->stride, b->R, b->V, d->opts, d->ids, d->counts, d->raw, d->lp,
                                 stream) ||
                   sample_ws(version, d->out, d->logits, NULL, b->stride, b->R, b->V, d->temp, d->top_k, d->top_p,
                             d->seed, d->gen, stream) ||
                   sampling_logprobs_finish_cuda(d->out, d->raw, b->stride, b->R, d->opts, d->lp, stream)
               ? -1
               : 0;
}

// What one GPU run left: the prepared logits, ids, logprobs, and the count of nonzero d_counts words.
typedef struct {
    float *logits;
    int32_t *out;
    sampling_logprobs_t *lp;
    long long counts_left;
} ogot_t;

static int opts_download(const obufs_t *d, const opts_batch_t *b, ogot_t *got) {
    const size_t R = (size_t)b->R, n = R * (size_t)b->stride, nc = R * (size_t)b->V;
    uint32_t *c = mv_xmalloc(nc * sizeof *c);
    const int rc = CUDA_TRY(cudaDeviceSynchronize()) ||
                   CUDA_TRY(cudaMemcpy(got->logits, d->logits, n * sizeof(float), cudaMemcpyDeviceToHost)) ||
                   CUDA_TRY(cudaMemcpy(got->out, d->out, R * sizeof(int32_t), cudaMemcpyDeviceToHost)) ||
                   CUDA_TRY(cudaMemcpy(got->lp, d->lp, R * sizeof(sampling_logprobs_t), cudaMemcpyDeviceToHost)) ||
                   CUDA_TRY(cudaMemcpy(c, d->counts, nc * sizeof *c, cudaMemcpyDeviceToHost));
    got->counts_left = 0;
    for (size_t i = 0; i < nc; i++) got->counts_left += c[i] != 0;
    free(c);
    return rc ? -1 : 0;
}

// Prepared logits against the host's: bits equal (any NaN for a NaN)
// inside the vocabulary, the padding untouched. Version 4 (opts_upload
// poisoned the fp32 rows): a row with an option on is the host's inside
// the vocabulary, and every other value is still the poison (0xffffffff).
// Mismatching rows; the first few are named.
static int opts_compare_logits(int version, const char *what, const opts_batch_t *b, const opts_expect_t *e,
                               const float *got) {
    int bad_rows = 0;
    for (int r = 0; r < b->R; r++) {
        const float *x = got + (size_t)r * b->stride, *want = e->prepared + (size_t)r * b->stride;
        const int untouched = version == 4 && !sampling_opts_row_on(&b->opts[r]);
        for (long long i = 0; i < b->stride; i++) {
            const int poison = version == 4 && (untouched || i >= b->V);
            const int same = poison ? smath_bits(x[i]) == 0xffffffffu
                                    : memcmp(&x[i], &want[i], sizeof *x) == 0 ||
                                          (i < b->V && isnan(x[i]) && isnan(want[i]));
            if (same) continue;
            if (bad_rows < 8)
                verdict("FAIL", "sampler options %s %s row %d (%s) id %lld: prepared logit %.9g (0x%08x), %s %.9g "
                                "(0x%08x)",
                        sampling_version_name(version), what, r, ROW_KIND_NAME[b->kind[r]], i, x[i], smath_bits(x[i]),
                        poison ? "left alone: want the poison" : "the host's", poison ? (double)NAN : (double)want[i],
                        poison ? 0xffffffffu : smath_bits(want[i]));
            bad_rows++;
            break;
        }
    }
    return bad_rows;
}

// Ids and logprobs of one version's run: one verdict each.
static void opts_compare_draws(const char *what, const char *name, const opts_batch_t *b, const opts_expect_t *e,
                               const ogot_t *got) {
    int bad = 0, none = 0;
    for (int r = 0; r < b->R; r++) {
        none += e->id[r] < 0;
        if (got->out[r] == e->id[r]) continue;
        if (bad++ < 8)
            verdict("FAIL", "sampler options %s %s row %d (%s; T %g, top_k %d, top_p %g, min_p %g): GPU id %d, the "
                            "host's %d",
                    name, what, r, ROW_KIND_NAME[b->kind[r]], b->p[r].temperature, b->p[r].top_k, b->p[r].top_p,
                    b->p[r].min_p, got->out[r], e->id[r]);
    }
    verdict(bad ? "FAIL" : "PASS", "sampler options %s %s: ids: %d of %d rows differ from the host sampler's (%d "
                                   "without an answer: -1)",
            name, what, bad, b->R, none);

    sampling_logprobs_t poison;
    memset(&poison, 0x7f, sizeof poison);
    int rows = 0, lp_bad = 0, invalid = 0, untouched_bad = 0, values = 0;
    double worst = 0;
    for (int r = 0; r < b->R; r++) {
        const sampling_logprobs_t *g = &got->lp[r];
        if (b->opts[r].top_logprobs < 0) {
            untouched_bad += memcmp(g, &poison, sizeof poison) != 0;
            continue;
        }
        rows++;
        const sampler_logprob_t *w = &e->lp[r];
        const int n = b->opts[r].top_logprobs;
        char why[160] = "";
        if (!e->lp_ok[r]) {  // the raw row has no finite largest value: the reference's error, lse NaN here
            invalid++;
            if (!isnan(g->lse) || g->num_top != 0) snprintf(why, sizeof why, "lse %g, num_top %d: want NaN, 0", g->lse, g->num_top);
        } else if (g->num_top != n || isnan(g->lse)) {
            snprintf(why, sizeof why, "num_top %d (want %d), lse %g", g->num_top, n, g->lse);
        } else {
            for (int k = 0; k <= n && !why[0]; k++) {
                const float gv = k < n ? g->top_logprobs[k] : g->token_logprob, wv = k < n ? w->top_logprobs[k] : w->logprob;
                if (k < n && g->top_ids[k] != w->top_ids[k])
                    snprintf(why, sizeof why, "top id %d: %d, the host's %d", k, g->top_ids[k], w->top_ids[k]);
                else if (!lp_close(gv, wv))
                    snprintf(why, sizeof why, "%s%d: %.9g, the host's %.9g", k < n ? "top logprob " : "token logprob ",
                             k < n ? k : e->id[r], gv, wv);
                else if (isfinite(wv)) worst = fmax(worst, fabs((double)gv - (double)wv)), values++;
            }
        }
        if (!why[0]) continue;
        if (lp_bad++ < 8) verdict("FAIL", "sampler options %s %s row %d (%s) logprobs: %s", name, what, r, ROW_KIND_NAME[b->kind[r]], why);
    }
    verdict(lp_bad || untouched_bad ? "FAIL" : "PASS",
            "sampler options %s %s: logprobs on %d rows (%d without a finite raw maximum: lse NaN): %d differ (top ids "
            "exact; %d values, max |GPU - host| %.3g, tol %g + %g |x|); %d rows without logprobs written to",
            name, what, rows, invalid, lp_bad, values, worst, LP_ABS_TOL, LP_REL_TOL, untouched_bad);
}

// The three launches captured in a CUDA graph (PDL on where the GPU has
// it, as the engine's decode graphs) replayed twice: the same bits as the
// eager run, and d_counts zero after each replay.
static ogot_t ogot_alloc(const opts_batch_t *b) {
    const size_t R = (size_t)b->R;
    return (ogot_t){mv_xmalloc(R * (size_t)b->stride * sizeof(float)), mv_xmalloc(R * sizeof(int32_t)),
                    mv_xmalloc(R * sizeof(sampling_logprobs_t)), 0};
}
static void ogot_free(ogot_t *got) { free(got->logits), free(got->out), free(got->lp); }

static void opts_check_graph(const char *what, const obufs_t *d, const opts_batch_t *b) {
    const size_t R = (size_t)b->R, n = R * (size_t)b->stride;
    ogot_t eager = ogot_alloc(b), got = ogot_alloc(b);
    cudaStream_t st = NULL;
    cudaGraph_t graph = NULL;
    cudaGraphExec_t exec = NULL;
    const int pdl = mv_pdl_supported();
    int rc = opts_upload(SAMPLING_FAST, d, b) || opts_launch(SAMPLING_FAST, d, b, 0) || opts_download(d, b, &eager) ||
             CUDA_TRY(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking)) || (pdl && mv_pdl_set(1)) ||
             CUDA_TRY(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    if (!rc) {
        const int launch = opts_launch(SAMPLING_FAST, d, b, st);
        rc = CUDA_TRY(cudaStreamEndCapture(st, &graph)) || launch;
    }
    if (pdl) mv_pdl_set(0);
    if (!rc) rc = CUDA_TRY(cudaGraphInstantiate(&exec, graph, 0));
    int differ = 0;
    long long left = 0;
    for (int rep = 0; rep < 2 && !rc; rep++) {
        rc = opts_upload(SAMPLING_FAST, d, b) || CUDA_TRY(cudaGraphLaunch(exec, st)) || CUDA_TRY(cudaStreamSynchronize(st)) ||
             opts_download(d, b, &got);
        if (rc) break;
        left += got.counts_left;
        differ += memcmp(got.logits, eager.logits, n * sizeof(float)) != 0 ||
                  memcmp(got.out, eager.out, R * sizeof(int32_t)) != 0 ||
                  memcmp(got.lp, eager.lp, R * sizeof(sampling_logprobs_t)) != 0;
    }
    if (rc) verdict("FAIL", "sampler options %s in a CUDA graph: %s", what, mv_last_error());
    else
        verdict(differ || left ? "FAIL" : "PASS",
                "sampler options %s in a CUDA graph (PDL %s), replayed twice: %d replays differ from the eager run "
                "(prepared logits, ids, logprobs, bit for bit); %lld d_counts words left nonzero",
                what, pdl ? "on" : "off", differ, left);
    if (exec) cudaGraphExecDestroy(exec);
    if (graph) cudaGraphDestroy(graph);
    if (st) cudaStreamDestroy(st);
    ogot_free(&eager), ogot_free(&got);
}

// One batch: R rows of V logits (rows of `stride` floats) with random
// options; both sampler versions, each run twice (the second on the
// d_counts the first left); then the graph replay for the engine's version.
static void check_options_batch(int V, long long stride, int R, rng_t *g) {
    opts_batch_t b;
    opts_batch_alloc(&b, R, V, stride, OPTS_MAX_IDS);
    for (int r = 0; r < R; r++) opts_make_row(g, &b, r);
    char what[64];
    snprintf(what, sizeof what, "vocab %d%s, %d rows", V, stride != V ? " (rows strided)" : "", R);
    opts_expect_t e = {0};
    obufs_t d = {0};
    ogot_t got = ogot_alloc(&b);
    if (opts_expect(&b, &e) || obufs_init(&d, &b)) {
        verdict("FAIL", "sampler options %s: %s", what, mv_last_error());
    } else {
        int changed = 0, penalized = 0, stopped = 0, masked = 0, all_off = 0;
        for (int r = 0; r < R; r++) {
            const sampling_opts_row_t *o = &b.opts[r];
            changed += memcmp(e.prepared + (size_t)r * stride, b.logits + (size_t)r * stride, stride * sizeof(float)) != 0;
            penalized += o->presence != 0 || o->frequency != 0 || o->repetition != 1;
            stopped += o->num_stop > 0;
            masked += o->temperature > 0 && o->min_p > 0;
            all_off += o->top_logprobs < 0 && o->num_stop == 0 && !(o->presence != 0 || o->frequency != 0 ||
                       o->repetition != 1) && !(o->temperature > 0 && o->min_p > 0);
        }
        int bad_logits = 0, runs = 0;
        long long left = 0;
        for (int v = 1; v <= SAMPLING_NUM_VERSIONS; v++) {
            const char *name = sampling_version_name(v);
            for (int rep = 0; rep < 2; rep++) {
                if (opts_upload(v, &d, &b) || opts_launch(v, &d, &b, 0) || opts_download(&d, &b, &got)) {
                    verdict("FAIL", "sampler options %s %s: GPU: %s", name, what, mv_last_error());
                    break;
                }
                runs++;
                bad_logits += opts_compare_logits(v, what, &b, &e, got.logits);
                left += got.counts_left;
                if (rep == 0) opts_compare_draws(what, name, &b, &e, &got);
            }
        }
        verdict(bad_logits || left ? "FAIL" : "PASS",
                "sampler options %s: prepared logits: %d row mismatches over %d runs against the host's row after "
                "min_tokens, penalties and sampling_min_p_mask_cpu (%d rows changed: %d penalties, %d min_tokens, %d "
                "min_p; %d all off); %lld d_counts words left nonzero",
                what, bad_logits, runs, changed, penalized, stopped, masked, all_off, left);
        if (runs == 2 * SAMPLING_NUM_VERSIONS) opts_check_graph(what, &d, &b);
    }
    obufs_free(&d);
    opts_expect_free(&e);
    opts_batch_free(&b);
    ogot_free(&got);
}

// Timing (information, not a verdict): `rows` rows of V logits from
// normal(0, 3), every option on in every row (Qwen3's default T 0.6, top_k
// 20, top_p 0.95, with min_p 0.05, presence and frequency 0.5, repetition
// 1.1 over 1000 prompt and 200 generated ids, two stop ids masked, 20 top
// logprobs), against the sampler alone (SAMPLING_FAST) on the same rows,
// and with every option off (what a decode graph pays for holding the two
// launches). Before each run, outside the timed region: the logits restored
// (prepare changes them) and a write of twice the L2. The median of `reps`.
// Napkin math (kernels/sampling_opts.cu): about 5 reads and 2 writes of the
// 608 KB row with everything on: 4.3 MB a row.
static void time_sampler_options(int rows, int V, int reps, rng_t *g) {
    const int per_row = 1202;  // 1000 prompt and 200 generated ids (300 distinct), 2 stop ids
    opts_batch_t b;
    opts_batch_alloc(&b, rows, V, V, per_row);
    fill_normal_f32(g, b.logits, (size_t)rows * (size_t)V, 0.0f, 3.0f);
    bf16_rows(b.logits, (size_t)rows * (size_t)V);
    sampling_opts_row_t *off = mv_xmalloc((size_t)rows * sizeof *off);
    for (int r = 0; r < rows; r++) {
        for (int k = 0; k < per_row; k++) b.ids[(size_t)r * per_row + k] = k < 1200 ? rng_int(g, 0, 299) * 401 : rng_int(g, 0, V - 1);
        b.temp[r] = 0.6f, b.top_k[r] = 20, b.top_p[r] = 0.95f, b.seed[r] = rng_u64(g), b.gen[r] = 200;
        off[r] = (sampling_opts_row_t){.temperature = 0.6f, .repetition = 1.0f, .top_logprobs = -1};
        b.opts[r] = (sampling_opts_row_t){.temperature = 0.6f, .min_p = 0.05f, .presence = 0.5f, .frequency = 0.5f,
                                          .repetition = 1.1f, .ids_start = r * per_row, .num_prompt = 1000,
                                          .num_output = 200, .stop_start = r * per_row + 1200, .num_stop = 2,
                                          .top_logprobs = 20};
    }
    obufs_t d = {0};
    float *pristine = NULL, *ms = mv_xmalloc((size_t)reps * sizeof *ms);
    sampling_opts_row_t *d_off = NULL;
    void *flush = NULL;
    cudaEvent_t t0 = NULL, t1 = NULL;
    int dev = 0, l2 = 0;
    const size_t n = (size_t)rows * (size_t)V;
    int rc = obufs_init(&d, &b) || CUDA_TRY(cudaGetDevice(&dev)) ||
             CUDA_TRY(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev)) ||
             CUDA_TRY(cudaMalloc(&flush, 2 * (size_t)l2 + 1)) ||
             CUDA_TRY(cudaMalloc((void **)&pristine, n * sizeof(float))) ||
             CUDA_TRY(cudaMalloc((void **)&d_off, (size_t)rows * sizeof *d_off)) ||
             CUDA_TRY(cudaMemcpy(pristine, b.logits, n * sizeof(float), cudaMemcpyHostToDevice)) ||
             CUDA_TRY(cudaMemcpy(d_off, off, (size_t)rows * sizeof *d_off, cudaMemcpyHostToDevice)) ||
             CUDA_TRY(cudaEventCreate(&t0)) || CUDA_TRY(cudaEventCreate(&t1));
    static const char *what[3] = {"sample alone", "every option on", "every option off"};
    double median[3] = {0};
    for (int c = 0; c < 3 && !rc; c++) {
        obufs_t dc = d;
        if (c == 2) dc.opts = d_off;
        for (int i = -1; i < reps && !rc; i++) {  // i = -1: the warm-up
            rc = CUDA_TRY(cudaMemcpyAsync(dc.logits, pristine, n * sizeof(float), cudaMemcpyDeviceToDevice, 0)) ||
                 CUDA_TRY(cudaMemsetAsync(flush, i & 0xff, 2 * (size_t)l2 + 1, 0)) ||
                 CUDA_TRY(cudaEventRecord(t0, 0)) ||
                 (c == 0 ? sample_ws(SAMPLING_FAST, dc.out, dc.logits, dc.logits16, V, rows, V, dc.temp, dc.top_k,
                                     dc.top_p, dc.seed, dc.gen, 0)
                         : opts_launch(SAMPLING_FAST, &dc, &b, 0)) ||
                 CUDA_TRY(cudaEventRecord(t1, 0)) || CUDA_TRY(cudaEventSynchronize(t1));
            if (!rc && i >= 0) rc = CUDA_TRY(cudaEventElapsedTime(&ms[i], t0, t1));
        }
        if (rc) break;
        qsort(ms, (size_t)reps, sizeof *ms, cmp_float);
        median[c] = ms[reps / 2];
    }
    if (rc) verdict("FAIL", "sampler options timing: %s", mv_last_error());
    else
        printf("sampler options timing %d rows x %d (%s): %s %.3f ms; %s (prepare + sample + finish) %.3f ms, +%.3f "
               "ms; %s %.3f ms; median of %d\n",
               rows, V, sampling_version_name(SAMPLING_FAST), what[0], median[0], what[1], median[1],
               median[1] - median[0], what[2], median[2], reps);
    if (t0) cudaEventDestroy(t0);
    if (t1) cudaEventDestroy(t1);
    cudaFree(flush), cudaFree(pristine), cudaFree(d_off);
    obufs_free(&d);
    opts_batch_free(&b);
    free(off), free(ms);
}

// The options against the host sampler: Qwen3's vocabulary (packed, and
// strided rows not 16-byte aligned), one past a power of two, strided small
// rows, a vocabulary of 7 (top_logprobs past the non-NaN ids) and of 1.
static void check_sampler_options(rng_t *g) {
    check_options_batch(151936, 151936, 64, g);
    check_options_batch(151936, 151939, 16, g);
    check_options_batch(4097, 4097, 64, g);
    check_options_batch(1000, 1003, 64, g);
    check_options_batch(7, 9, 64, g);
    check_options_batch(1, 1, 8, g);
    time_sampler_options(1, 151936, 21, g);
    time_sampler_options(64, 151936, 11, g);
}

// ---- the options through the engine -----------------------------------------------------
// Requests that use min_tokens, the penalties, min_p and logprobs, run by
// the engine on this device (decode steps from CUDA graphs unless
// --enforce-eager; batched, chunked, preempted): every token must be the
// host sampler's (sampler_sample_seq) on the raw logits the on_logits hook
// saw for that step, with the prompt and the tokens before it, and its
// logprobs within LP_ABS_TOL / LP_REL_TOL of the host's (top ids equal).
// This is the engine's wiring of kernels/sampling_opts.h: each row's
// options and ids (sampler_opts_row), the raw rows the hook reads, the
// logprobs copied back, and rows without options beside them.
typedef struct {
    const engine_request_t *reqs;
    const engine_t *e;
    sampler_scratch_t ss;
    float *row;
    int32_t seq[MAX_CASES][MAX_IDS + MAX_IDS];  // prompt, then the host's tokens
    int32_t want[MAX_CASES][MAX_IDS];
    engine_logprob_t want_lp[MAX_CASES][MAX_IDS];
    int times[MAX_CASES][MAX_IDS];
    int bad;
} opt_capture_t;

static void capture_opt_draw(void *ctx, int request, int gen_index, const float *logits, int vocab) {
    opt_capture_t *c = ctx;
    if (request < 0 || request >= MAX_CASES || gen_index < 0 || gen_index >= MAX_IDS || vocab != c->ss.ref.vocab ||
        !logits) {
        c->bad++;
        return;
    }
    const engine_request_t *r = &c->reqs[request];
    const sampling_params_t *p = &r->params;
    int32_t stop[QWEN3_MAX_EOS];
    int n_stop = 0;
    for (int k = 0; gen_index < p->min_tokens && !p->ignore_eos && k < c->e->sched_cfg.num_eos; k++)
        stop[n_stop++] = c->e->sched_cfg.eos_ids[k];
    int32_t *seq = c->seq[request];
    memcpy(seq, r->prompt, (size_t)r->num_prompt * sizeof *seq);
    const sampler_seq_t sq = {seq, r->num_prompt, r->num_prompt + gen_index, stop, n_stop};
    memcpy(c->row, logits, (size_t)vocab * sizeof *c->row);
    engine_logprob_t *lp = &c->want_lp[request][gen_index];
    if (sampler_sample_seq(&c->ss, c->row, p, r->seed, &sq, &c->want[request][gen_index], p->logprobs ? lp : NULL))
        c->bad++;
    seq[r->num_prompt + gen_index] = c->want[request][gen_index];
    c->times[request][gen_index]++;
}

static void check_engine_options_run(const char *dir, runner_device_t dev, const golden_t *g, const run_cfg_t *rc) {
    engine_t *e = make_engine(dir, dev, rc);
    if (!e) {
        verdict("FAIL", "%s options, %s: %s", dir, rc->what, mv_last_error());
        return;
    }
    const sampling_params_t kinds[5] = {
        {.temperature = 3.0f, .top_p = 1.0f, .max_tokens = 12, .ignore_eos = 1, .min_p = 0.02f,
         .presence_penalty = 0.5f, .frequency_penalty = 0.3f, .repetition_penalty = 1.3f, .logprobs = 1,
         .top_logprobs = 5},
        {.temperature = 0.0f, .top_p = 1.0f, .max_tokens = 12, .ignore_eos = 1, .frequency_penalty = 2.0f,
         .repetition_penalty = 1.8f, .logprobs = 1},
        {.temperature = 2.0f, .top_k = 30, .top_p = 0.9f, .max_tokens = 12, .min_tokens = 8, .min_p = 0.1f},
        {.temperature = 2.5f, .top_p = 1.0f, .max_tokens = 12, .ignore_eos = 1, .presence_penalty = -1.0f,
         .logprobs = 1, .top_logprobs = 20},
        {.temperature = 0.7f, .top_k = 20, .top_p = 0.95f, .max_tokens = 12, .ignore_eos = 1}};  // none: plain rows
    const int n = g->n_cases;
    engine_request_t reqs[MAX_CASES];
    engine_output_t outs[MAX_CASES];
    for (int i = 0; i < n; i++)
        reqs[i] = (engine_request_t){g->cases[i].prompt, g->cases[i].n_prompt, kinds[i % 5], 700u + (uint64_t)i};
    opt_capture_t *c = calloc(1, sizeof *c);
    if (!c || sampler_scratch_init(&c->ss, e->model.vocab_size) ||
        !(c->row = malloc((size_t)e->model.vocab_size * sizeof *c->row))) {
        verdict("FAIL", "%s options, %s: out of memory", dir, rc->what);
        engine_free(e);
        free(c);
        return;
    }
    c->reqs = reqs, c->e = e;
    if (engine_generate(e, reqs, n, outs, capture_opt_draw, c)) {
        verdict("FAIL", "%s options, %s: %s", dir, rc->what, mv_last_error());
    } else {
        int tokens = 0, bad_ids = 0, bad_lp = 0, bad_len = 0, with_lp = 0;
        char first[256] = "";
        for (int i = 0; i < n; i++) {
            const sampling_params_t *p = &reqs[i].params;
            if ((p->ignore_eos && outs[i].num_tokens != 12) || outs[i].num_tokens < p->min_tokens ||
                !!outs[i].logprobs != !!p->logprobs)
                bad_len++;
            for (int k = 0; k < outs[i].num_tokens && k < MAX_IDS; k++, tokens++) {
                if (c->times[i][k] != 1 || outs[i].token_ids[k] != c->want[i][k]) {
                    if (!bad_ids++)
                        snprintf(first, sizeof first, "request %d token %d: the engine drew %d, the host %d (%d hook calls)",
                                 i, k, outs[i].token_ids[k], c->want[i][k], c->times[i][k]);
                    continue;
                }
                if (!p->logprobs || !outs[i].logprobs) continue;
                with_lp++;
                const engine_logprob_t *got = &outs[i].logprobs[k], *want = &c->want_lp[i][k];
                int ok = lp_close(got->logprob, want->logprob) && got->num_top == p->top_logprobs;
                for (int j = 0; ok && j < p->top_logprobs; j++)
                    ok = got->top_ids[j] == want->top_ids[j] && lp_close(got->top_logprobs[j], want->top_logprobs[j]);
                if (!ok && !bad_lp++ && !first[0])
                    snprintf(first, sizeof first, "request %d token %d: logprob %.9g, host %.9g", i, k, got->logprob,
                             want->logprob);
            }
        }
        if (c->bad || bad_ids || bad_lp || bad_len)
            verdict("FAIL", "%s options, %s: %d of %d tokens differ from the host sampler, %d logprobs off, %d "
                    "lengths or logprob lists wrong, %d bad hook calls; first: %s", dir, rc->what, bad_ids, tokens,
                    bad_lp, bad_len, c->bad, first);
        else
            verdict("PASS", "%s options, %s: %d tokens of %d requests the host sampler's, %d with logprobs within "
                    "tolerance", dir, rc->what, tokens, n, with_lp);
        engine_outputs_free(outs, n);
    }
    sampler_scratch_free(&c->ss);
    free(c->row);
    free(c);
    engine_free(e);
}

static void check_engine_options(runner_device_t dev) {
    const run_cfg_t runs[] = {
        {"batched", 16, 512, 0, 0, 0, 0, 0},
        {"chunked (16 tokens per step)", 4, 16, 0, 1, 0, 0, 0},
        {"preempted", 8, 128, 10, 1, 0, 0, 0},
    };
    for (int m = 0; m < N_MODELS; m++) {
        golden_t *g = malloc(sizeof *g);
        if (!g || golden_load(MODELS[m], g)) {
            verdict("FAIL", "%s: %s", MODELS[m], g ? mv_last_error() : "out of memory");
            free(g);
            continue;
        }
        for (size_t r = 0; r < sizeof runs / sizeof *runs; r++) check_engine_options_run(MODELS[m], dev, g, &runs[r]);
        golden_free(g);
        free(g);
    }
}

static void check_sampler(void) {
    rng_t g;
    rng_seed(&g, 1234);
    // 1 and 2: the smallest rows; 512: the tiny models'; 1000 with a stride
    // of 1003 (rows not packed, nor 16-byte aligned); 4097: one past a power
    // of two; Qwen3's 151936.
    check_sampler_vocab(1, 1, 64, &g);
    check_sampler_vocab(2, 2, 64, &g);
    check_sampler_vocab(512, 512, 448, &g);
    check_sampler_vocab(1000, 1003, 448, &g);
    check_sampler_vocab(4097, 4097, 448, &g);
    check_sampler_vocab(151936, 151936, 160, &g);
    // Version 2's paths: Qwen3's vocabulary; 4099 and 2050 (rows off 16-byte
    // boundaries, the lists of the last threads short); small ones.
    check_sampler_greedy_split(151936, 151936, &g);
    check_sampler_greedy_split(4097, 4097, &g);
    check_sampler_greedy_split(1000, 1003, &g);
    check_sampler_greedy_split(3, 3, &g);
    check_sampler_paths(151936, &g);
    check_sampler_paths(4099, &g);
    check_sampler_paths(2050, &g);
    check_sampler_paths(100, &g);
    check_sampler_paths(3, &g);
    check_sampler_frequencies();
    check_sampler_options(&g);
    time_sampler(256, 151936, 11, &g);
    time_sampler(1, 151936, 21, &g);
}
#endif

int main(int argc, char **argv) {
    runner_device_t dev = RUNNER_DEVICE_CUDA;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--device") && i + 1 < argc) {
            const char *d = argv[++i];
            if (strcmp(d, "cpu") && strcmp(d, "cuda")) {
                fprintf(stderr, "engine_check: --device '%s' is not cpu or cuda\n", d);
                return 2;
            }
            dev = strcmp(d, "cpu") ? RUNNER_DEVICE_CUDA : RUNNER_DEVICE_CPU;
        } else if (!strcmp(argv[i], "--enforce-eager")) {
            g_enforce_eager = 1;
        } else {
            fprintf(stderr, "usage: engine_check [--device cuda|cpu] [--enforce-eager]   (run from the repository "
                            "root)\n");
            return strcmp(argv[i], "--help") ? 2 : 0;
        }
    }
    char why[256];
    if (!model_runner_device_available(dev, why, sizeof why)) {
        fprintf(stderr, "engine_check: --device %s: %s\n", model_runner_device_name(dev), why);
        return 1;
    }
    const char *one = getenv("MV_TP_COMM_OF_ONE");
    printf("engine_check: device %s%s%s\n", model_runner_device_name(dev),
           dev == RUNNER_DEVICE_CUDA ? (g_enforce_eager ? ", --enforce-eager (no CUDA graphs)" : ", CUDA graphs on")
                                     : "",
           dev == RUNNER_DEVICE_CUDA && one && !strcmp(one, "1")
               ? ", the tensor-parallel path with a communicator of one (MV_TP_COMM_OF_ONE=1)"
               : "");
    check_goldens(dev);
#if MV_HAVE_CUDA
    check_engine_options(dev);
    // The sampler's kernels are checked on their own: neither the engine's mode
    // nor its tensor-parallel path changes them (so, with MV_TP_COMM_OF_ONE=1,
    // the run checks only what that path changes, in less device time).
    if (dev == RUNNER_DEVICE_CUDA && !g_enforce_eager && !(one && !strcmp(one, "1"))) check_sampler();
#endif
    printf("engine_check: %d PASS, %d NEAR-TIE (bf16 took the other side of an HF top-2 margin < %g), %d SKIP, "
           "%d FAIL\n",
           n_pass, n_near, BF16_MARGIN_TOL, n_skip, n_fail);
    return n_fail ? 1 : 0;
}

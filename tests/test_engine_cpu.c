/*
 * tests/test_engine_cpu.c - the engine's CPU backend, end to end, against
 * Hugging Face transformers.
 *
 * The golden data: tests/data/tiny-qwen3-{tied,untied,mha}/ are real Qwen3
 * checkpoints (2 layers, vocab 512; tied and untied lm_head, head_dim
 * 16/32/64, GQA ratio 2/4/1), and golden.json beside each holds the greedy
 * ids transformers produced for 11 prompts (12 new tokens, eos ignored) and
 * the first-step logits of the first three. All made by
 * tests/data/make_tiny_qwen3.py, which golden.json names; a golden file that
 * no longer matches its checkpoint (sha256 of config.json and
 * model.safetensors) fails with a hint to rerun it.
 *
 * What must give exactly HF's greedy ids: one request at a time; all of
 * them in one batch (continuous batching); the shared-prefix prompts with
 * prefix-cache hits; chunked prefill (16 tokens per step); a KV cache so
 * small that sequences are preempted and recomputed. The first-step logits
 * must match HF's by NMSE. Then the sampler, seeds, and `minivllm generate`
 * on the command line, bad inputs included.
 *
 * Run: make test (a few seconds; under SANITIZE=1 too).
 */
#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "chapters/09-engine/runtime/engine.h"
#include "chapters/09-engine/runtime/sampler.h"
#include "common/check.h"
#include "tests/helpers.h"

static const char *MODELS[] = {"tests/data/tiny-qwen3-tied", "tests/data/tiny-qwen3-untied",
                               "tests/data/tiny-qwen3-mha"};
#define N_MODELS (int)(sizeof MODELS / sizeof MODELS[0])
#define MAX_CASES 64
#define MAX_IDS 256
#define GOLDEN_SCRIPT "tests/data/make_tiny_qwen3.py"

// First-step logits vs HF's, by NMSE = sum (ours - hf)^2 / sum hf^2.
// Both sides are fp32 activations over the same bf16 weights; they differ
// only in summation order (our blocked GEMM, float64 attention), which moves
// each logit by a few fp32 ulps: NMSE 2e-13 .. 8e-13 measured. A real bug (a wrong
// norm, a RoPE off by one position, a missing residual) gives NMSE > 1e-3.
// 1e-9 leaves four orders of magnitude on each side.
#define LOGITS_NMSE_TOL 1e-9

typedef struct {
    int32_t prompt[MAX_IDS];
    int n_prompt;
    int32_t greedy[MAX_IDS];
    int n_greedy;
    float *first_logits;  // [vocab] or NULL
    int n_logits;
} golden_case_t;

typedef struct {
    golden_case_t cases[MAX_CASES];
    int n_cases;
    int max_new_tokens;
    char config_sha[65], weights_sha[65];
} golden_t;

static char *read_text(const char *path) {
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "cannot open %s (made by %s)", path, GOLDEN_SCRIPT);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    cr_assert_not_null(s);
    cr_assert_eq(fread(s, 1, (size_t)n, f), (size_t)n);
    s[n] = '\0';
    fclose(f);
    return s;
}

static int ids_from_json(const cJSON *arr, int32_t *out, int cap) {
    cr_assert(cJSON_IsArray(arr));
    int n = 0;
    for (const cJSON *v = arr->child; v; v = v->next) {
        cr_assert(n < cap && cJSON_IsNumber(v));
        out[n++] = (int32_t)v->valuedouble;
    }
    return n;
}

static void golden_load(const char *dir, golden_t *g) {
    char path[512];
    snprintf(path, sizeof path, "%s/golden.json", dir);
    char *text = read_text(path);
    cJSON *root = cJSON_Parse(text);
    free(text);
    cr_assert_not_null(root, "%s is not JSON: rerun %s", path, GOLDEN_SCRIPT);
    memset(g, 0, sizeof *g);
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, "max_new_tokens");
    cr_assert(cJSON_IsNumber(v), "%s: no max_new_tokens", path);
    g->max_new_tokens = (int)v->valuedouble;
    const char *keys[2] = {"config_sha256", "weights_sha256"};
    char *dst[2] = {g->config_sha, g->weights_sha};
    for (int k = 0; k < 2; k++) {
        v = cJSON_GetObjectItemCaseSensitive(root, keys[k]);
        cr_assert(cJSON_IsString(v) && strlen(v->valuestring) == 64, "%s: no %s", path, keys[k]);
        memcpy(dst[k], v->valuestring, 65);
    }
    const cJSON *cases = cJSON_GetObjectItemCaseSensitive(root, "cases");
    cr_assert(cJSON_IsArray(cases));
    for (const cJSON *c = cases->child; c; c = c->next) {
        cr_assert(g->n_cases < MAX_CASES);
        golden_case_t *gc = &g->cases[g->n_cases++];
        gc->n_prompt = ids_from_json(cJSON_GetObjectItemCaseSensitive(c, "prompt_token_ids"), gc->prompt, MAX_IDS);
        gc->n_greedy = ids_from_json(cJSON_GetObjectItemCaseSensitive(c, "greedy_token_ids"), gc->greedy, MAX_IDS);
        const cJSON *fl = cJSON_GetObjectItemCaseSensitive(c, "first_logits");
        if (fl) {
            int n = cJSON_GetArraySize(fl), k = 0;
            gc->first_logits = malloc((size_t)n * sizeof(float));
            for (const cJSON *x = fl->child; x; x = x->next) gc->first_logits[k++] = (float)x->valuedouble;
            gc->n_logits = n;
        }
    }
    cJSON_Delete(root);
}

static void golden_free(golden_t *g) {
    for (int i = 0; i < g->n_cases; i++) free(g->cases[i].first_logits);
}

// sha256 through coreutils' sha256sum: the lab has no sha256 of its own,
// and a test may shell out.
static void sha256_file(const char *path, char out[65]) {
    char cmd[600], buf[256];
    snprintf(cmd, sizeof cmd, "sha256sum '%s'", path);
    cr_assert_eq(run_command(cmd, buf, sizeof buf), 0, "sha256sum %s failed", path);
    memcpy(out, buf, 64);
    out[64] = '\0';
}

// A golden file made from other files than the ones beside it is stale.
// 1 and a message naming the script when golden.json was made from other
// files than the ones beside it, else 0.
static int golden_is_stale(const char *dir, const golden_t *g, char *msg, size_t cap) {
    const char *files[2] = {"config.json", "model.safetensors"};
    const char *want[2] = {g->config_sha, g->weights_sha};
    for (int k = 0; k < 2; k++) {
        char path[512], sha[65];
        snprintf(path, sizeof path, "%s/%s", dir, files[k]);
        sha256_file(path, sha);
        if (strcmp(sha, want[k]) != 0) {
            snprintf(msg, cap,
                     "%s/golden.json is stale: it was made from a %s whose sha256 is %s, this one's is %s; "
                     "rerun python3 %s",
                     dir, files[k], want[k], sha, GOLDEN_SCRIPT);
            return 1;
        }
    }
    return 0;
}

static engine_t *make_engine(const char *dir, int max_num_seqs, int max_batched, int block_size, int num_blocks,
                             int prefix) {
    engine_config_t c = engine_config_default(dir);
    c.max_model_len = 128;
    c.max_num_seqs = max_num_seqs;
    c.max_num_batched_tokens = max_batched;
    c.block_size = block_size;
    c.num_blocks = num_blocks;
    c.enable_prefix_caching = prefix;
    c.num_threads = 2;
    engine_t *e = NULL;
    cr_assert_eq(engine_create(&c, &e), 0, "%s: %s", dir, mv_last_error());
    return e;
}

static engine_request_t greedy_request(const golden_case_t *gc, int max_tokens) {
    sampling_params_t p = {.temperature = 0.0f, .top_k = 0, .top_p = 1.0f, .max_tokens = max_tokens, .ignore_eos = 1};
    return (engine_request_t){gc->prompt, gc->n_prompt, p, 0};
}

// Run cases [first, first + n) of g in one engine_generate and compare.
static void expect_golden(engine_t *e, const golden_t *g, int first, int n, const char *what, const char *dir) {
    engine_request_t reqs[MAX_CASES];
    engine_output_t outs[MAX_CASES];
    for (int i = 0; i < n; i++) reqs[i] = greedy_request(&g->cases[first + i], g->max_new_tokens);
    cr_assert_eq(engine_generate(e, reqs, n, outs, NULL, NULL), 0, "%s %s: %s", dir, what, mv_last_error());
    for (int i = 0; i < n; i++) {
        const golden_case_t *gc = &g->cases[first + i];
        cr_expect_eq(outs[i].num_tokens, gc->n_greedy, "%s %s case %d: %d tokens", dir, what, first + i,
                     outs[i].num_tokens);
        cr_expect_eq(outs[i].finish_reason, FINISH_MAX_TOKENS);
        for (int k = 0; k < gc->n_greedy && k < outs[i].num_tokens; k++)
            if (outs[i].token_ids[k] != gc->greedy[k]) {
                cr_expect_fail("%s %s case %d: token %d is %d, transformers says %d", dir, what, first + i, k,
                               outs[i].token_ids[k], gc->greedy[k]);
                break;
            }
    }
    engine_outputs_free(outs, n);
}

// ---- the golden comparisons --------------------------------------------------------------

// Every test that compares with a golden file loads it through here, so a
// stale one fails first, with the hint, rather than as a wrong token.
static void golden_load_fresh(const char *dir, golden_t *g) {
    golden_load(dir, g);
    char msg[1024];
    cr_assert_eq(golden_is_stale(dir, g, msg, sizeof msg), 0, "%s", msg);
    cr_assert_geq(g->n_cases, 4, "%s/golden.json: %d cases (rerun %s)", dir, g->n_cases, GOLDEN_SCRIPT);
}

Test(engine_golden, goldens_are_not_stale) {
    for (int m = 0; m < N_MODELS; m++) {
        golden_t g;
        golden_load_fresh(MODELS[m], &g);
        golden_free(&g);
    }
}

// The check itself: a copy whose config.json gained a byte is stale, and
// the message says which file and how to fix it.
Test(engine_golden, a_changed_checkpoint_makes_the_golden_stale) {
    char dir[128], cmd[512], out[1024], msg[1024];
    snprintf(dir, sizeof dir, "/tmp/mv-test-stale-%d", (int)getpid());
    snprintf(cmd, sizeof cmd, "mkdir -p %s && cp %s/* %s/ && echo >> %s/config.json", dir, MODELS[0], dir, dir);
    cr_assert_eq(run_command(cmd, out, sizeof out), 0, "%s", cmd);
    golden_t g;
    golden_load(dir, &g);
    cr_expect_eq(golden_is_stale(dir, &g, msg, sizeof msg), 1);
    cr_expect(strstr(msg, "config.json") && strstr(msg, GOLDEN_SCRIPT), "%s", msg);
    golden_free(&g);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    run_command(cmd, out, sizeof out);
}

// How one golden comparison runs the engine.
typedef struct {
    const char *what;
    int max_num_seqs, max_batched, block_size, num_blocks, prefix_caching;
    int alone;       // 1: one request per engine_generate call, else all in one call
    int last_three;  // 1: only the last three cases (the shared-prefix prompts)
} golden_run_t;

typedef void (*engine_check_fn)(const engine_t *e, const golden_t *g, const char *dir);

// Every tiny model through an engine set up as `run` says; its ids must be
// the golden ones, then check() (if any) looks at the engine's statistics.
static void golden_run_all(const golden_run_t *run, engine_check_fn check) {
    for (int m = 0; m < N_MODELS; m++) {
        golden_t g;
        golden_load_fresh(MODELS[m], &g);
        engine_t *e = make_engine(MODELS[m], run->max_num_seqs, run->max_batched, run->block_size, run->num_blocks,
                                  run->prefix_caching);
        int first = run->last_three ? g.n_cases - 3 : 0, n = g.n_cases - first;
        if (run->alone)
            for (int i = first; i < g.n_cases; i++) expect_golden(e, &g, i, 1, run->what, MODELS[m]);
        else
            expect_golden(e, &g, first, n, run->what, MODELS[m]);
        if (check) check(e, &g, MODELS[m]);
        engine_free(e);
        golden_free(&g);
    }
}

Test(engine_golden, one_request_at_a_time) {
    golden_run_t run = {"alone", 4, 256, 16, 0, 0, 1, 0};
    golden_run_all(&run, NULL);
}

// Every request is admitted in the first step, and they decode together.
static void check_batched(const engine_t *e, const golden_t *g, const char *dir) {
    cr_expect_lt(e->num_steps, 2 * g->max_new_tokens, "%s: %lld steps", dir, e->num_steps);
}

Test(engine_golden, all_prompts_in_one_batch) {
    golden_run_t run = {"batched", 16, 512, 16, 0, 0, 0, 0};
    golden_run_all(&run, check_batched);
}

// The last three prompts share their first 40 tokens: with block_size 16
// the second and third find two full blocks (32 tokens) each in the prefix
// cache; with block_size 4, ten blocks (40 tokens) each.
static void check_prefix_16(const engine_t *e, const golden_t *g, const char *dir) {
    int first = g->n_cases - 3;
    cr_assert_eq(memcmp(g->cases[first].prompt, g->cases[first + 1].prompt, 32 * sizeof(int32_t)), 0,
                 "%s: the last three prompts should share a prefix (see %s)", dir, GOLDEN_SCRIPT);
    cr_expect_geq(e->num_cached_tokens, 2 * 32, "%s: %lld prompt tokens came from the prefix cache", dir,
                  e->num_cached_tokens);
}

static void check_prefix_4(const engine_t *e, const golden_t *g, const char *dir) {
    cr_expect_geq(e->num_cached_tokens, 2 * 40, "%s: %lld prompt tokens came from the prefix cache", dir,
                  e->num_cached_tokens);
}

Test(engine_golden, prefix_cache_hits_give_the_same_ids) {
    golden_run_t run16 = {"prefix-cached (block 16)", 8, 256, 16, 0, 1, 0, 1};
    golden_run_t run4 = {"prefix-cached (block 4)", 8, 256, 4, 0, 1, 0, 1};
    golden_run_all(&run16, check_prefix_16);
    golden_run_all(&run4, check_prefix_4);
}

Test(engine_golden, chunked_prefill_gives_the_same_ids) {
    golden_run_t run = {"chunked (16 tokens per step)", 4, 16, 16, 0, 1, 0, 0};
    golden_run_all(&run, NULL);
}

static void check_preempted(const engine_t *e, const golden_t *g, const char *dir) {
    cr_expect_gt(e->num_preemptions, 0, "%s: nothing was preempted", dir);
}

// 30 blocks of 4 tokens hold the longest request (100 + 12 tokens needs 28)
// and little more: decodes run out of blocks, sequences are preempted and
// recomputed later (partly from the prefix cache), and must still agree.
Test(engine_golden, preemption_gives_the_same_ids) {
    golden_run_t run = {"preempted", 8, 128, 4, 30, 1, 0, 0};
    golden_run_all(&run, check_preempted);
}

// ---- float32 checkpoints ----------------------------------------------------------------

// dst_dir/model.safetensors: every tensor of src_dir's checkpoint as F32
// (bf16 -> f32 is exact), in the format's layout: u64 header length, the
// JSON header padded with spaces to 8 bytes, then the data back to back.
static void write_f32_checkpoint(const char *src_dir, const char *dst_dir) {
    st_model_t *m;
    cr_assert_eq(st_open(src_dir, &m), 0, "%s", mv_last_error());
    cJSON *h = cJSON_CreateObject();
    size_t off = 0;
    for (size_t i = 0; i < m->n_tensors; i++) {
        const st_tensor_t *t = &m->tensors[i];
        size_t bytes = (size_t)st_numel(t) * 4;
        cJSON *e = cJSON_AddObjectToObject(h, t->name);
        cJSON_AddStringToObject(e, "dtype", "F32");
        cJSON *shape = cJSON_AddArrayToObject(e, "shape");
        for (int d = 0; d < t->ndim; d++) cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)t->shape[d]));
        cJSON *offs = cJSON_AddArrayToObject(e, "data_offsets");
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)off));
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)(off + bytes)));
        off += bytes;
    }
    char *header = cJSON_PrintUnformatted(h);
    size_t len = strlen(header), padded = (len + 7) / 8 * 8;
    char path[512];
    snprintf(path, sizeof path, "%s/model.safetensors", dst_dir);
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f, "%s", path);
    uint64_t n = padded;  // little-endian on the lab's x86-64 and arm64 hosts
    fwrite(&n, 8, 1, f);
    fwrite(header, 1, len, f);
    for (size_t k = len; k < padded; k++) fputc(' ', f);
    for (size_t i = 0; i < m->n_tensors; i++) {
        const st_tensor_t *t = &m->tensors[i];
        size_t numel = (size_t)st_numel(t);
        bf16_t *b = malloc(numel * sizeof *b);
        float *x = malloc(numel * sizeof *x);
        cr_assert(b && x);
        st_to_bf16(t, b);
        bf16_to_float_array(x, b, numel);
        fwrite(x, sizeof *x, numel, f);
        free(b);
        free(x);
    }
    cr_assert_eq(fclose(f), 0);
    free(header);
    cJSON_Delete(h);
    st_close(m);
}

// The same weights stored as F32 must give the same ids: the loader
// converts them to bf16 exactly (every value is a bf16 value).
Test(engine_golden, float32_checkpoints_give_the_same_ids) {
    for (int m = 0; m < N_MODELS; m++) {
        char dir[128], cmd[512], out[1024];
        snprintf(dir, sizeof dir, "/tmp/mv-test-f32-%d-%d", (int)getpid(), m);
        snprintf(cmd, sizeof cmd, "mkdir -p %s && cp %s/config.json %s/generation_config.json %s/", dir, MODELS[m],
                 MODELS[m], dir);
        cr_assert_eq(run_command(cmd, out, sizeof out), 0, "%s", cmd);
        write_f32_checkpoint(MODELS[m], dir);
        st_model_t *st;
        cr_assert_eq(st_open(dir, &st), 0, "%s", mv_last_error());
        cr_expect_eq(st->tensors[0].dtype, ST_F32);
        st_close(st);
        golden_t g;
        golden_load_fresh(MODELS[m], &g);
        engine_t *e = make_engine(dir, 16, 512, 16, 0, 1);
        expect_golden(e, &g, 0, g.n_cases, "f32 checkpoint", MODELS[m]);
        engine_free(e);
        golden_free(&g);
        snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
        run_command(cmd, out, sizeof out);
    }
}

typedef struct {
    float *logits[MAX_CASES];  // [vocab] the first step's logits of each request
    int vocab;
} logits_capture_t;

static void capture_first(void *ctx, int request, int gen_index, const float *logits, int vocab) {
    logits_capture_t *c = ctx;
    if (gen_index != 0 || request >= MAX_CASES) return;
    c->logits[request] = malloc((size_t)vocab * sizeof(float));
    memcpy(c->logits[request], logits, (size_t)vocab * sizeof(float));
    c->vocab = vocab;
}

Test(engine_golden, first_step_logits_match_transformers) {
    for (int m = 0; m < N_MODELS; m++) {
        golden_t g;
        golden_load_fresh(MODELS[m], &g);
        engine_t *e = make_engine(MODELS[m], 16, 512, 16, 0, 0);
        engine_request_t reqs[MAX_CASES];
        engine_output_t outs[MAX_CASES];
        for (int i = 0; i < g.n_cases; i++) reqs[i] = greedy_request(&g.cases[i], 1);
        logits_capture_t cap = {0};
        cr_assert_eq(engine_generate(e, reqs, g.n_cases, outs, capture_first, &cap), 0, "%s", mv_last_error());
        int checked = 0;
        for (int i = 0; i < g.n_cases; i++) {
            const golden_case_t *gc = &g.cases[i];
            if (gc->first_logits) {
                cr_assert_not_null(cap.logits[i]);
                cr_assert_eq(gc->n_logits, cap.vocab, "%s case %d: %d golden logits, vocab %d", MODELS[m], i,
                             gc->n_logits, cap.vocab);
                double err = 0, ref = 0;
                for (int k = 0; k < cap.vocab; k++) {
                    cr_assert(isfinite(cap.logits[i][k]), "%s case %d: logit %d is not finite", MODELS[m], i, k);
                    double d = (double)cap.logits[i][k] - gc->first_logits[k];
                    err += d * d;
                    ref += (double)gc->first_logits[k] * gc->first_logits[k];
                }
                double nmse = err / ref;
                if (getenv("MV_VERBOSE")) fprintf(stderr, "%s case %d: first-step logits NMSE %.3g\n", MODELS[m], i, nmse);
                cr_expect_lt(nmse, LOGITS_NMSE_TOL, "%s case %d: NMSE %.3g vs transformers", MODELS[m], i, nmse);
                checked++;
            }
            free(cap.logits[i]);
        }
        cr_expect_geq(checked, 1, "%s: golden.json has no first_logits", MODELS[m]);
        engine_outputs_free(outs, g.n_cases);
        engine_free(e);
        golden_free(&g);
    }
}

// ---- sampling ---------------------------------------------------------------------------
// The rule itself (greedy ties, top-k, top-p, the draw's distribution, the
// random stream) is the reference's, tested in tests/test_sampling.c. Here:
// the engine's layer over it, and which key the engine draws each token with.

Test(sampler, validates_params_and_samples_as_the_reference) {
    const sampling_params_t good = {.temperature = 0.7f, .top_k = 5, .top_p = 0.9f, .max_tokens = 1, .ignore_eos = 0}, neg = {.temperature = -1.0f, .top_k = 0, .top_p = 1.0f, .max_tokens = 1, .ignore_eos = 0}, k = {.temperature = 1.0f, .top_k = -2, .top_p = 1.0f, .max_tokens = 1, .ignore_eos = 0},
                            p0 = {.temperature = 1.0f, .top_k = 0, .top_p = 0.0f, .max_tokens = 1, .ignore_eos = 0};
    cr_expect_eq(sampler_validate_params(&good), 0);
    cr_expect_eq(sampler_validate_params(&neg), -1);
    cr_expect(strstr(mv_last_error(), "temperature -1") != NULL, "%s", mv_last_error());
    cr_expect_eq(sampler_validate_params(&k), -1);
    cr_expect(strstr(mv_last_error(), "top_k -2") != NULL, "%s", mv_last_error());
    cr_expect_eq(sampler_validate_params(&p0), -1);
    float logits[64];
    for (int i = 0; i < 64; i++) logits[i] = (float)((i * 37) % 64) / 8.0f;
    sampling_scratch_t s;
    cr_assert_eq(sampling_scratch_init(&s, 64), 0);
    for (int g = 0; g < 50; g++) {
        const uint64_t seed = 1000u + (uint64_t)g;
        int32_t a, b;
        cr_assert_eq(sampler_sample(&s, logits, &good, seed, g, &a), 0, "%s", mv_last_error());
        const sampling_row_t r = {.temperature = good.temperature, .top_k = good.top_k, .top_p = good.top_p, .seed = seed, .gen_index = g};
        cr_assert_eq(sample_token_cpu(&s, logits, &r, &b), 0);
        cr_expect_eq(a, b, "gen_index %d: the engine's sampler drew %d, the reference %d", g, a, b);
    }
    const float bad[3] = {NAN, -INFINITY, NAN};
    sampling_scratch_t s3;
    cr_assert_eq(sampling_scratch_init(&s3, 3), 0);
    int32_t id;
    cr_expect_eq(sampler_sample(&s3, bad, &good, 1, 0, &id), -1);
    cr_expect(strstr(mv_last_error(), "finite") != NULL, "%s", mv_last_error());
    sampling_scratch_free(&s3);
    sampling_scratch_free(&s);
}

// The GPU's description of a row (sampler_opts_row: what the CUDA backend
// uploads for kernels/sampling_opts.h) carries everything sampler_sample_seq
// uses: the kernels' steps, done here with their CPU references from that
// description alone (logprobs of the raw row, the stop ids it lists masked,
// the penalties over the ids it lists, the min_p mask, then the rule
// without min_p), give the host sampler's token and logprobs, bit for bit.
Test(sampler, the_devices_row_description_reproduces_the_host_sampler) {
    enum { V = 97, NP = 9, MAXN = 40 };
    sampler_scratch_t hs;
    sampling_scratch_t ref;
    cr_assert_eq(sampler_scratch_init(&hs, V), 0);
    cr_assert_eq(sampling_scratch_init(&ref, V), 0);
    const sampling_params_t kinds[] = {
        {.temperature = 1.5f, .top_p = 1.0f, .max_tokens = 64, .min_p = 0.05f, .presence_penalty = 0.5f,
         .frequency_penalty = 0.3f, .repetition_penalty = 1.3f, .logprobs = 1, .top_logprobs = 5},
        {.temperature = 0.0f, .top_p = 1.0f, .max_tokens = 64, .frequency_penalty = 2.0f, .repetition_penalty = 1.8f,
         .logprobs = 1},
        {.temperature = 2.0f, .top_k = 10, .top_p = 0.9f, .max_tokens = 64, .min_tokens = 20, .min_p = 0.1f},
        {.temperature = 0.8f, .top_p = 0.95f, .max_tokens = 64, .presence_penalty = -1.0f, .logprobs = 1,
         .top_logprobs = 20},
        {.temperature = 1.0f, .top_p = 1.0f, .max_tokens = 64, .repetition_penalty = 0.7f, .min_tokens = 3}};
    const int32_t stop_ids[3] = {5, 17, 96};
    int32_t tokens[NP + MAXN], ids[NP + MAXN + 3];
    float raw[V], row[V], host[V];
    int checked = 0, changed = 0;
    uint32_t rng = 12345;
    for (size_t kind = 0; kind < sizeof kinds / sizeof *kinds; kind++) {
        const sampling_params_t *p = &kinds[kind];
        for (int i = 0; i < NP; i++) tokens[i] = (int32_t)((i * 31 + (int)kind) % V);
        for (int n = NP; n < NP + MAXN; n++) {
            for (int i = 0; i < V; i++) {
                rng = rng * 1664525u + 1013904223u;
                raw[i] = (float)((int)(rng >> 9) % 2000 - 1000) / 250.0f;  // ties and repeats happen
            }
            const sampler_seq_t seq = {tokens, NP, n, stop_ids, 3};
            // The host sampler.
            memcpy(host, raw, sizeof raw);
            int32_t want = -1, got = -1;
            sampler_logprob_t want_lp = {0};
            cr_assert_eq(sampler_sample_seq(&hs, host, p, 99, &seq, &want, &want_lp), 0, "%s", mv_last_error());
            // The device's description, applied step by step.
            sampling_opts_row_t o;
            int num_ids = 0;
            cr_assert_eq(sampler_opts_row(p, &seq, &o, ids, (int)(sizeof ids / sizeof *ids), &num_ids), 0);
            cr_expect_eq(o.top_logprobs, p->logprobs ? p->top_logprobs : -1);
            memcpy(row, raw, sizeof raw);
            for (int k = 0; k < o.num_stop; k++) row[ids[o.stop_start + k]] = -INFINITY;
            if (o.presence != 0 || o.frequency != 0 || o.repetition != 1.0f) {
                uint64_t scratch[NP + MAXN];
                cr_assert_eq(sampling_apply_penalties_cpu(row, V, ids + o.ids_start, o.num_prompt,
                                                          ids + o.ids_start + o.num_prompt, o.num_output, o.presence,
                                                          o.frequency, o.repetition, scratch), 0);
            }
            cr_assert_eq(sampling_min_p_mask_cpu(row, V, o.temperature, o.min_p), 0);
            const sampling_row_t bare = {.temperature = o.temperature, .top_k = p->top_k, .top_p = p->top_p,
                                         .seed = 99, .gen_index = n - NP};
            cr_assert_eq(sample_token_cpu(&ref, row, &bare, &got), 0, "%s", mv_last_error());
            cr_expect_eq(got, want, "kind %zu, %d tokens: the device's description draws %d, the host %d", kind, n,
                         got, want);
            cr_expect_eq(memcmp(row, host, sizeof row) == 0 || o.min_p > 0, 1,
                         "kind %zu, %d tokens: the row before min_p differs from the host's", kind, n);
            if (p->logprobs) {
                float lp = 0, top_lps[SAMPLING_MAX_TOP_LOGPROBS];
                int32_t top_ids[SAMPLING_MAX_TOP_LOGPROBS];
                cr_assert_eq(sampling_logprobs_cpu(raw, V, got, o.top_logprobs, &lp, top_ids, top_lps), 0);
                cr_expect_eq(lp, want_lp.logprob, "kind %zu: logprob %.9g, host %.9g", kind, lp, want_lp.logprob);
                for (int j = 0; j < o.top_logprobs; j++) cr_expect_eq(top_ids[j], want_lp.top_ids[j]);
            }
            changed += memcmp(row, raw, sizeof row) != 0;
            tokens[n] = want;
            checked++;
        }
    }
    cr_expect_eq(checked, (int)(sizeof kinds / sizeof *kinds) * MAXN);
    cr_expect_gt(changed, checked / 2, "the options changed only %d of %d rows", changed, checked);
    // Rows without options are described as all off; a too small id buffer is an error, not an overflow.
    const sampling_params_t plain = {.temperature = 1.0f, .top_p = 1.0f, .max_tokens = 4};
    const sampler_seq_t seq = {tokens, NP, NP + 2, stop_ids, 3};
    sampling_opts_row_t o;
    int num_ids = 0;
    cr_expect_eq(sampler_uses_options(&plain, 0), 0);
    cr_assert_eq(sampler_opts_row(&plain, &seq, &o, ids, 4, &num_ids), 0);
    cr_expect_eq(num_ids, 0);
    cr_expect(o.repetition == 1.0f && o.top_logprobs == -1 && o.num_stop == 0 && o.min_p == 0);
    num_ids = 0;
    cr_expect_eq(sampler_opts_row(&kinds[0], &seq, &o, ids, 4, &num_ids), -1);
    cr_expect(strstr(mv_last_error(), "ids") != NULL, "%s", mv_last_error());
    sampler_scratch_free(&hs);
    sampling_scratch_free(&ref);
}

// What the on_logits hook saw: for each request and gen_index, the token
// the reference draws from those logits with the request's parameters and
// seed, and how many times that (request, gen_index) was sampled.
typedef struct {
    const engine_request_t *reqs;
    sampling_scratch_t scratch;
    int32_t want[MAX_CASES][MAX_IDS];
    int times[MAX_CASES][MAX_IDS];
    int bad;  // a hook call outside the table, or a reference error
} draw_capture_t;

static void capture_draw(void *ctx, int request, int gen_index, const float *logits, int vocab) {
    draw_capture_t *c = ctx;
    if (request < 0 || request >= MAX_CASES || gen_index < 0 || gen_index >= MAX_IDS || vocab != c->scratch.vocab) {
        c->bad++;
        return;
    }
    const engine_request_t *r = &c->reqs[request];
    const sampling_row_t row = {.temperature = r->params.temperature, .top_k = r->params.top_k, .top_p = r->params.top_p, .seed = r->seed, .gen_index = gen_index};
    if (sample_token_cpu(&c->scratch, logits, &row, &c->want[request][gen_index])) c->bad++;
    c->times[request][gen_index]++;
}

// Every token the engine samples on the host is the reference's draw with
// key (request seed, gen_index = tokens the request had generated), the key
// the cuda backend sends to the GPU (engine.c, step_on_device): each
// gen_index drawn exactly once, also when chunked prefill splits a prompt
// over steps and when a preempted request is recomputed. So the two
// backends draw the same token wherever their logits agree.
static void expect_reference_draws(engine_t *e, const golden_t *g, const char *what) {
    engine_request_t reqs[MAX_CASES];
    engine_output_t outs[MAX_CASES];
    const sampling_params_t kinds[3] = {{.temperature = 3.0f, .top_k = 50, .top_p = 1.0f, .max_tokens = 12, .ignore_eos = 1}, {.temperature = 2.0f, .top_k = 0, .top_p = 0.9f, .max_tokens = 12, .ignore_eos = 1}, {.temperature = 0.0f, .top_k = 0, .top_p = 1.0f, .max_tokens = 12, .ignore_eos = 1}};
    for (int i = 0; i < g->n_cases; i++)
        reqs[i] = (engine_request_t){g->cases[i].prompt, g->cases[i].n_prompt, kinds[i % 3], 500u + (uint64_t)i};
    draw_capture_t *c = calloc(1, sizeof *c);
    cr_assert_not_null(c);
    c->reqs = reqs;
    cr_assert_eq(sampling_scratch_init(&c->scratch, e->model.vocab_size), 0);
    cr_assert_eq(engine_generate(e, reqs, g->n_cases, outs, capture_draw, c), 0, "%s: %s", what, mv_last_error());
    cr_expect_eq(c->bad, 0, "%s: %d hook calls outside the table or failing", what, c->bad);
    for (int i = 0; i < g->n_cases; i++) {
        cr_expect_eq(outs[i].num_tokens, 12, "%s request %d", what, i);
        for (int k = 0; k < outs[i].num_tokens && k < MAX_IDS; k++) {
            cr_expect_eq(c->times[i][k], 1, "%s request %d: gen_index %d was sampled %d times", what, i, k,
                         c->times[i][k]);
            cr_expect_eq(outs[i].token_ids[k], c->want[i][k],
                         "%s request %d token %d: the engine drew %d, the reference with (seed %llu, gen_index %d) "
                         "draws %d",
                         what, i, k, outs[i].token_ids[k], (unsigned long long)reqs[i].seed, k, c->want[i][k]);
        }
    }
    engine_outputs_free(outs, g->n_cases);
    sampling_scratch_free(&c->scratch);
    free(c);
}

Test(engine_sampling, host_draws_are_the_reference_at_each_gen_index) {
    golden_t g;
    golden_load_fresh(MODELS[0], &g);
    engine_t *e = make_engine(MODELS[0], 16, 512, 16, 0, 1);
    expect_reference_draws(e, &g, "batched");
    engine_free(e);
    e = make_engine(MODELS[0], 4, 16, 16, 0, 1);
    expect_reference_draws(e, &g, "chunked (16 tokens per step)");
    engine_free(e);
    // 30 blocks of 4 tokens: decodes run out, requests are preempted and recomputed
    e = make_engine(MODELS[0], 8, 128, 4, 30, 1);
    expect_reference_draws(e, &g, "preempted");
    cr_expect_gt(e->num_preemptions, 0, "nothing was preempted");
    engine_free(e);
    golden_free(&g);
}

// Same seed, same tokens: alone or in a batch with others, because every
// draw is keyed by (request seed, gen_index) and nothing else.
Test(engine_sampling, same_seed_same_tokens_in_any_batch) {
    golden_t g;
    golden_load_fresh(MODELS[0], &g);
    engine_t *e = make_engine(MODELS[0], 16, 512, 16, 0, 1);
    // temperature 3: the tiny models are trained to be confident (top-2 margins
    // >= 4 logits), so at temperature ~1 nearly every draw is the greedy id
    sampling_params_t p = {.temperature = 3.0f, .top_k = 50, .top_p = 1.0f, .max_tokens = 12, .ignore_eos = 1};
    engine_request_t reqs[MAX_CASES];
    engine_output_t alone, batch[MAX_CASES], other;
    int n = g.n_cases;
    for (int i = 0; i < n; i++) reqs[i] = (engine_request_t){g.cases[i].prompt, g.cases[i].n_prompt, p, 1000u + i};
    cr_assert_eq(engine_generate(e, &reqs[2], 1, &alone, NULL, NULL), 0, "%s", mv_last_error());
    cr_assert_eq(engine_generate(e, reqs, n, batch, NULL, NULL), 0, "%s", mv_last_error());
    cr_assert_eq(alone.num_tokens, batch[2].num_tokens);
    cr_expect_eq(memcmp(alone.token_ids, batch[2].token_ids, (size_t)alone.num_tokens * sizeof(int32_t)), 0,
                 "request 2 sampled differently alone and in a batch");
    // Another seed gives another continuation (12 tokens at temperature 3
    // over the top 50 ids: the same by chance is very unlikely).
    engine_request_t r2 = reqs[2];
    r2.seed = 99;
    cr_assert_eq(engine_generate(e, &r2, 1, &other, NULL, NULL), 0, "%s", mv_last_error());
    cr_expect_neq(memcmp(alone.token_ids, other.token_ids, (size_t)alone.num_tokens * sizeof(int32_t)), 0);
    engine_outputs_free(&alone, 1);
    engine_outputs_free(&other, 1);
    engine_outputs_free(batch, n);
    engine_free(e);
    golden_free(&g);
}

Test(engine_sampling, eos_stops_with_finish_reason_stop) {
    // The first golden greedy continuation that reaches an eos id (2 or 3): without
    // ignore_eos the request stops there, the eos id included.
    golden_t g;
    golden_load_fresh(MODELS[0], &g);
    int c = -1, at = -1;
    for (int i = 0; i < g.n_cases && c < 0; i++)
        for (int k = 0; k < g.cases[i].n_greedy; k++)
            if (g.cases[i].greedy[k] == 2 || g.cases[i].greedy[k] == 3) {
                c = i, at = k;
                break;
            }
    if (c < 0) {
        golden_free(&g);
        cr_skip_test("no golden greedy output reaches an eos id");
    }
    engine_t *e = make_engine(MODELS[0], 4, 256, 16, 0, 1);
    engine_request_t r = greedy_request(&g.cases[c], g.max_new_tokens);
    r.params.ignore_eos = 0;
    engine_output_t out;
    cr_assert_eq(engine_generate(e, &r, 1, &out, NULL, NULL), 0, "%s", mv_last_error());
    cr_expect_eq(out.finish_reason, FINISH_EOS);
    cr_expect_str_eq(engine_finish_reason(out.finish_reason), "stop");
    cr_expect_eq(out.num_tokens, at + 1);
    engine_outputs_free(&out, 1);
    engine_free(e);
    golden_free(&g);
}

Test(engine_sampling, bad_requests_fail_the_batch_naming_the_request) {
    engine_t *e = make_engine(MODELS[0], 4, 256, 16, 0, 1);
    int32_t good[3] = {5, 6, 7}, out_of_vocab[2] = {5, 512}, negative[1] = {-3};
    int32_t too_long[200];
    for (int i = 0; i < 200; i++) too_long[i] = i % 500;
    sampling_params_t p = {.temperature = 0, .top_k = 0, .top_p = 1, .max_tokens = 4, .ignore_eos = 1}, zero = {.temperature = 0, .top_k = 0, .top_p = 1, .max_tokens = 0, .ignore_eos = 1};
    struct {
        engine_request_t bad;
        const char *says;
    } cases[] = {
        {{out_of_vocab, 2, p, 0}, "512"},
        {{negative, 1, p, 0}, "-3"},
        {{good, 0, p, 0}, "empty"},
        {{good, 3, zero, 0}, "max_tokens"},
        {{too_long, 200, p, 0}, "max_model_len"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        engine_request_t reqs[2] = {{good, 3, p, 0}, cases[k].bad};
        engine_output_t outs[2];
        cr_expect_eq(engine_generate(e, reqs, 2, outs, NULL, NULL), -1, "case %zu", k);
        cr_expect_eq(e->failed_request, 1, "case %zu", k);
        cr_expect(strstr(mv_last_error(), "request 1") && strstr(mv_last_error(), cases[k].says), "case %zu: %s", k,
                  mv_last_error());
    }
    engine_free(e);
}

// vLLM's other options through the engine: every token is the reference's
// draw from the raw logits (the on_logits hook sees them before anything
// changes them) after min_tokens' mask and the penalties over the prompt
// and the tokens before it, with min_p, and its logprobs are the
// reference's log-softmax of those raw logits. Also when chunked prefill
// splits the prompt and when a preempted request is recomputed.
typedef struct {
    const engine_request_t *reqs;
    const engine_t *e;
    sampling_scratch_t scratch;
    float *row;
    int32_t want[MAX_CASES][MAX_IDS];
    int32_t plain[MAX_CASES][MAX_IDS];  // the draw from the raw logits without the options
    engine_logprob_t want_lp[MAX_CASES][MAX_IDS];
    int times[MAX_CASES][MAX_IDS];
    int bad;
} option_capture_t;

static void capture_option_draw(void *ctx, int request, int gen_index, const float *logits, int vocab) {
    option_capture_t *c = ctx;
    if (request < 0 || request >= MAX_CASES || gen_index < 0 || gen_index >= MAX_IDS || vocab != c->scratch.vocab) {
        c->bad++;
        return;
    }
    const engine_request_t *r = &c->reqs[request];
    const sampling_params_t *p = &r->params;
    memcpy(c->row, logits, (size_t)vocab * sizeof *c->row);
    if (gen_index < p->min_tokens && !p->ignore_eos)
        for (int k = 0; k < c->e->sched_cfg.num_eos; k++) c->row[c->e->sched_cfg.eos_ids[k]] = -INFINITY;
    uint64_t ids[MAX_IDS + 64];
    if (sampling_apply_penalties_cpu(c->row, vocab, r->prompt, r->num_prompt, c->want[request], gen_index,
                                     p->presence_penalty, p->frequency_penalty,
                                     p->repetition_penalty == 0 ? 1.0f : p->repetition_penalty, ids))
        c->bad++;
    const sampling_row_t row = {.temperature = p->temperature, .top_k = p->top_k, .top_p = p->top_p,
                                .seed = r->seed, .gen_index = gen_index, .min_p = p->min_p};
    sampling_row_t bare = row;
    bare.min_p = 0;
    if (sample_token_cpu(&c->scratch, logits, &bare, &c->plain[request][gen_index])) c->bad++;
    int32_t *t = &c->want[request][gen_index];
    if (sample_token_cpu(&c->scratch, c->row, &row, t)) c->bad++;
    engine_logprob_t *lp = &c->want_lp[request][gen_index];
    lp->num_top = p->top_logprobs;
    if (p->logprobs &&
        sampling_logprobs_cpu(logits, vocab, *t, p->top_logprobs, &lp->logprob, lp->top_ids, lp->top_logprobs))
        c->bad++;
    c->times[request][gen_index]++;
}

static void expect_option_draws(engine_t *e, const golden_t *g, const char *what) {
    engine_request_t reqs[MAX_CASES];
    engine_output_t outs[MAX_CASES];
    const sampling_params_t kinds[4] = {
        {.temperature = 3.0f, .top_p = 1.0f, .max_tokens = 12, .ignore_eos = 1, .min_p = 0.02f,
         .presence_penalty = 0.5f, .frequency_penalty = 0.3f, .repetition_penalty = 1.3f, .logprobs = 1,
         .top_logprobs = 5},
        {.temperature = 0.0f, .top_p = 1.0f, .max_tokens = 12, .ignore_eos = 1, .frequency_penalty = 2.0f,
         .repetition_penalty = 1.8f, .logprobs = 1},
        {.temperature = 2.0f, .top_k = 30, .top_p = 0.9f, .max_tokens = 12, .min_tokens = 8, .min_p = 0.1f},
        {.temperature = 2.5f, .top_p = 1.0f, .max_tokens = 12, .ignore_eos = 1, .presence_penalty = -1.0f,
         .logprobs = 1, .top_logprobs = 20}};
    const int n = g->n_cases;
    for (int i = 0; i < n; i++)
        reqs[i] = (engine_request_t){g->cases[i].prompt, g->cases[i].n_prompt, kinds[i % 4], 700u + (uint64_t)i};
    option_capture_t *c = calloc(1, sizeof *c);
    cr_assert_not_null(c);
    c->reqs = reqs, c->e = e;
    cr_assert_eq(sampling_scratch_init(&c->scratch, e->model.vocab_size), 0);
    cr_assert_not_null(c->row = malloc((size_t)e->model.vocab_size * sizeof *c->row));
    cr_assert_eq(engine_generate(e, reqs, n, outs, capture_option_draw, c), 0, "%s: %s", what, mv_last_error());
    cr_expect_eq(c->bad, 0, "%s: %d hook calls outside the table or failing", what, c->bad);
    int differs = 0;  // tokens the options changed: the test must see them at work
    for (int i = 0; i < n; i++) {
        const sampling_params_t *p = &reqs[i].params;
        if (p->ignore_eos) cr_expect_eq(outs[i].num_tokens, 12, "%s request %d", what, i);
        else cr_expect_geq(outs[i].num_tokens, p->min_tokens, "%s request %d stopped before min_tokens", what, i);
        cr_expect_eq(!!outs[i].logprobs, p->logprobs, "%s request %d: logprobs %p", what, i, (void *)outs[i].logprobs);
        for (int k = 0; k < outs[i].num_tokens && k < MAX_IDS; k++) {
            cr_expect_eq(c->times[i][k], 1, "%s request %d: gen_index %d was sampled %d times", what, i, k,
                         c->times[i][k]);
            cr_expect_eq(outs[i].token_ids[k], c->want[i][k], "%s request %d token %d: the engine drew %d, the reference %d",
                         what, i, k, outs[i].token_ids[k], c->want[i][k]);
            differs += c->want[i][k] != c->plain[i][k];
            if (!p->logprobs || !outs[i].logprobs) continue;
            const engine_logprob_t *got = &outs[i].logprobs[k], *want = &c->want_lp[i][k];
            cr_expect_eq(got->logprob, want->logprob, "%s request %d token %d: logprob %.9g, reference %.9g", what, i,
                         k, got->logprob, want->logprob);
            cr_expect_leq(got->logprob, 0.0f);
            cr_expect_eq(got->num_top, p->top_logprobs);
            for (int j = 0; j < p->top_logprobs; j++) {
                cr_expect_eq(got->top_ids[j], want->top_ids[j], "%s request %d token %d top %d", what, i, k, j);
                cr_expect_eq(got->top_logprobs[j], want->top_logprobs[j]);
            }
        }
    }
    cr_expect_gt(differs, 0, "%s: no token differs from the draw without the options", what);
    engine_outputs_free(outs, n);
    sampling_scratch_free(&c->scratch);
    free(c->row);
    free(c);
}

Test(engine_sampling, penalties_min_p_min_tokens_and_logprobs_are_the_reference) {
    golden_t g;
    golden_load_fresh(MODELS[0], &g);
    engine_t *e = make_engine(MODELS[0], 16, 512, 16, 0, 1);
    expect_option_draws(e, &g, "batched");
    engine_free(e);
    e = make_engine(MODELS[0], 4, 16, 16, 0, 1);
    expect_option_draws(e, &g, "chunked (16 tokens per step)");
    engine_free(e);
    e = make_engine(MODELS[0], 8, 128, 4, 30, 1);
    expect_option_draws(e, &g, "preempted");
    cr_expect_gt(e->num_preemptions, 0, "nothing was preempted");
    engine_free(e);
    golden_free(&g);
}

// The penalties change what greedy decoding says (the tiny models repeat
// themselves: a strong repetition penalty breaks that), and min_tokens
// keeps a stop id from ending a request early.
Test(engine_sampling, penalties_and_min_tokens_change_the_output) {
    golden_t g;
    golden_load_fresh(MODELS[0], &g);
    engine_t *e = make_engine(MODELS[0], 4, 256, 16, 0, 1);
    engine_request_t r = greedy_request(&g.cases[0], 12);
    engine_output_t plain, pen, early, late;
    cr_assert_eq(engine_generate(e, &r, 1, &plain, NULL, NULL), 0, "%s", mv_last_error());
    r.params.repetition_penalty = 5.0f;
    r.params.frequency_penalty = 2.0f;
    cr_assert_eq(engine_generate(e, &r, 1, &pen, NULL, NULL), 0, "%s", mv_last_error());
    cr_expect_neq(memcmp(plain.token_ids, pen.token_ids, 12 * sizeof(int32_t)), 0, "the penalties changed nothing");
    // with a repetition penalty of 5 and frequency 2, greedy never picks an id twice in 12 tokens here
    // (each repeat would have to beat the rest by 2 plus a factor of 5)
    // stop id = greedy's third token: it ends the request there, unless min_tokens says later
    r = greedy_request(&g.cases[0], 12);
    const int32_t stop_id = plain.token_ids[2];
    const engine_stop_t stop = {.ids = &stop_id, .n = 1};
    cr_assert_eq(engine_run_stops(e, &r, &stop, 1, &early, NULL), 0, "%s", mv_last_error());
    int first = 0;
    while (plain.token_ids[first] != stop_id) first++;
    cr_expect_eq(early.num_tokens, first + 1, "the stop id ends it at its first place");
    r.params.min_tokens = 6;
    cr_assert_eq(engine_run_stops(e, &r, &stop, 1, &late, NULL), 0, "%s", mv_last_error());
    cr_expect_geq(late.num_tokens, 6, "min_tokens 6, and it stopped after %d", late.num_tokens);
    for (int k = 0; k < 6 && k < late.num_tokens; k++)
        cr_expect_neq(late.token_ids[k], stop_id, "token %d is the stop id, under min_tokens", k);
    engine_outputs_free(&plain, 1);
    engine_outputs_free(&pen, 1);
    engine_outputs_free(&early, 1);
    engine_outputs_free(&late, 1);
    // bad values are refused naming them
    const struct {
        sampling_params_t p;
        const char *says;
    } bad[] = {
        {{.top_p = 1, .max_tokens = 4, .min_tokens = 5}, "min_tokens 5"},
        {{.top_p = 1, .max_tokens = 4, .min_p = 1.5f}, "min_p 1.5"},
        {{.top_p = 1, .max_tokens = 4, .repetition_penalty = -1}, "repetition_penalty -1"},
        {{.top_p = 1, .max_tokens = 4, .presence_penalty = NAN}, "presence_penalty nan"},
        {{.top_p = 1, .max_tokens = 4, .top_logprobs = 3}, "top_logprobs 3"},
        {{.top_p = 1, .max_tokens = 4, .logprobs = 1, .top_logprobs = 21}, "top_logprobs 21"},
    };
    for (size_t k = 0; k < sizeof bad / sizeof *bad; k++) {
        engine_request_t b = {g.cases[0].prompt, g.cases[0].n_prompt, bad[k].p, 0};
        engine_output_t o;
        cr_expect_eq(engine_generate(e, &b, 1, &o, NULL, NULL), -1, "case %zu", k);
        cr_expect(strstr(mv_last_error(), bad[k].says), "case %zu: %s", k, mv_last_error());
    }
    engine_free(e);
    golden_free(&g);
}

// ---- the command line ---------------------------------------------------------------------

static void write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f, "%s", path);
    fputs(text, f);
    fclose(f);
}

Test(generate_cli, jsonl_in_jsonl_out_matches_the_golden) {
    golden_t g;
    golden_load_fresh(MODELS[0], &g);
    char in[128], out[128], cmd[1024], buf[16384];
    snprintf(in, sizeof in, "/tmp/mv-test-gen-in-%d.jsonl", (int)getpid());
    snprintf(out, sizeof out, "/tmp/mv-test-gen-out-%d.jsonl", (int)getpid());
    FILE *f = fopen(in, "w");
    cr_assert_not_null(f);
    for (int i = 0; i < g.n_cases; i++) {
        fprintf(f, "{\"prompt_token_ids\": [");
        for (int k = 0; k < g.cases[i].n_prompt; k++) fprintf(f, k ? ", %d" : "%d", g.cases[i].prompt[k]);
        fprintf(f, "], \"max_tokens\": %d, \"temperature\": 0, \"ignore_eos\": true}\n", g.max_new_tokens);
        if (i == 0) fprintf(f, "\n");  // blank lines are skipped
    }
    fclose(f);
    snprintf(cmd, sizeof cmd, "./%s/minivllm generate --model %s --input %s --output %s --max-num-batched-tokens 32 2>&1",
             MV_BUILD_DIR, MODELS[0], in, out);
    cr_assert_eq(run_command(cmd, buf, sizeof buf), 0, "%s", buf);
    f = fopen(out, "r");
    cr_assert_not_null(f);
    char line[8192];
    int i = 0;
    while (fgets(line, sizeof line, f)) {
        cJSON *o = cJSON_Parse(line);
        cr_assert_not_null(o, "%s", line);
        cr_expect_eq((int)cJSON_GetObjectItem(o, "index")->valuedouble, i);
        cr_expect_str_eq(cJSON_GetObjectItem(o, "text")->valuestring, "");
        cr_expect_str_eq(cJSON_GetObjectItem(o, "finish_reason")->valuestring, "length");
        int32_t ids[MAX_IDS];
        int n = ids_from_json(cJSON_GetObjectItem(o, "token_ids"), ids, MAX_IDS);
        cr_assert_lt(i, g.n_cases);
        cr_expect_eq(n, g.cases[i].n_greedy);
        cr_expect_eq(memcmp(ids, g.cases[i].greedy, (size_t)n * sizeof(int32_t)), 0, "line %d: %s", i + 1, line);
        cJSON_Delete(o);
        i++;
    }
    fclose(f);
    cr_expect_eq(i, g.n_cases);
    remove(in);
    remove(out);
    golden_free(&g);
}

Test(generate_cli, same_seed_same_output) {
    char in[128], cmd[1024], a[8192], b[8192], c[8192];
    snprintf(in, sizeof in, "/tmp/mv-test-gen-seed-%d.jsonl", (int)getpid());
    // temperature 3: the trained tiny model is confident; at 1.0 most draws are the greedy id
    write_file(in, "{\"prompt_token_ids\": [10, 20, 30], \"temperature\": 3.0, \"max_tokens\": 10, \"ignore_eos\": true}\n"
                   "{\"prompt_token_ids\": [10, 20, 30], \"temperature\": 3.0, \"max_tokens\": 10, \"ignore_eos\": true, "
                   "\"seed\": 5}\n");
    snprintf(cmd, sizeof cmd, "./%s/minivllm generate --model %s --input %s --seed 5 2>&1", MV_BUILD_DIR, MODELS[0], in);
    cr_assert_eq(run_command(cmd, a, sizeof a), 0, "%s", a);
    cr_assert_eq(run_command(cmd, b, sizeof b), 0, "%s", b);
    cr_expect_str_eq(a, b, "two runs with --seed 5 differ");
    // Request 0 gets seed 5 + 0 = 5 and request 1 says "seed": 5: the same stream.
    char *l1 = strstr(a, "== request 1");
    cr_assert_not_null(l1, "%s", a);
    char *ids0 = strchr(a, '\n') + 1, *ids1 = strchr(l1, '\n') + 1;
    cr_expect_eq(strncmp(ids0, ids1, (size_t)(strchr(ids1, '\n') - ids1)), 0, "%s", a);
    snprintf(cmd, sizeof cmd, "./%s/minivllm generate --model %s --input %s --seed 6 2>&1", MV_BUILD_DIR, MODELS[0], in);
    cr_assert_eq(run_command(cmd, c, sizeof c), 0, "%s", c);
    cr_expect_str_neq(a, c, "--seed 6 gave the same as --seed 5");
    remove(in);
}

// "n": a line is n requests, sample j drawn with seed + j: each the same as
// a line of its own with that seed. "logprobs": N gives each token's
// log-probability and N top ones, the first of which is the largest.
Test(generate_cli, n_samples_and_logprobs_in_jsonl) {
    char in[128], outp[128], cmd[1024], log[8192];
    snprintf(in, sizeof in, "/tmp/mv-test-gen-n-%d.jsonl", (int)getpid());
    snprintf(outp, sizeof outp, "/tmp/mv-test-gen-n-%d.out.jsonl", (int)getpid());
    write_file(in, "{\"prompt_token_ids\": [10, 20, 30], \"temperature\": 3.0, \"max_tokens\": 8, \"ignore_eos\": true, "
                   "\"seed\": 40, \"n\": 3, \"logprobs\": 2, \"presence_penalty\": 0.5, \"min_p\": 0.01}\n"
                   "{\"prompt_token_ids\": [10, 20, 30], \"temperature\": 3.0, \"max_tokens\": 8, \"ignore_eos\": true, "
                   "\"seed\": 42, \"presence_penalty\": 0.5, \"min_p\": 0.01}\n");
    snprintf(cmd, sizeof cmd, "./%s/minivllm generate --model %s --input %s --output %s --ordered 2>&1", MV_BUILD_DIR,
             MODELS[0], in, outp);
    cr_assert_eq(run_command(cmd, log, sizeof log), 0, "%s", log);
    char *text = read_text(outp);
    cr_assert_not_null(text);
    cJSON *rec[4] = {0};
    char *line = text;
    for (int i = 0; i < 4; i++) {
        char *nl = strchr(line, '\n');
        cr_assert_not_null(nl, "record %d missing: %s", i, text);
        *nl = '\0';
        cr_assert_not_null(rec[i] = cJSON_Parse(line), "%s", line);
        line = nl + 1;
    }
    for (int i = 0; i < 3; i++) {
        cr_expect_eq(cJSON_GetObjectItem(rec[i], "index")->valueint, i);
        cr_expect_eq(cJSON_GetObjectItem(rec[i], "sample")->valueint, i);
        const cJSON *lps = cJSON_GetObjectItem(rec[i], "logprobs");
        cr_assert(cJSON_IsArray(lps) && cJSON_GetArraySize(lps) == 8, "record %d: logprobs", i);
        const cJSON *ids = cJSON_GetObjectItem(rec[i], "token_ids");
        for (int k = 0; k < 8; k++) {
            const cJSON *e = cJSON_GetArrayItem(lps, k), *top = cJSON_GetObjectItem(e, "top_logprobs");
            cr_expect_eq(cJSON_GetObjectItem(e, "token_id")->valueint, cJSON_GetArrayItem(ids, k)->valueint);
            const double lp = cJSON_GetObjectItem(e, "logprob")->valuedouble;
            cr_assert(cJSON_IsArray(top) && cJSON_GetArraySize(top) == 2);
            const double t0 = cJSON_GetObjectItem(cJSON_GetArrayItem(top, 0), "logprob")->valuedouble,
                         t1 = cJSON_GetObjectItem(cJSON_GetArrayItem(top, 1), "logprob")->valuedouble;
            cr_expect(lp <= 0 && t0 <= 0 && t1 <= t0 && lp <= t0, "record %d token %d: %g, top %g %g", i, k, lp, t0, t1);
        }
    }
    cr_expect_null(cJSON_GetObjectItem(rec[3], "sample"), "a line without n has no sample");
    cr_expect_null(cJSON_GetObjectItem(rec[3], "logprobs"));
    // sample 2 of seed 40 is seed 42: the last line's tokens
    char *a = cJSON_PrintUnformatted(cJSON_GetObjectItem(rec[2], "token_ids"));
    char *b = cJSON_PrintUnformatted(cJSON_GetObjectItem(rec[3], "token_ids"));
    char *z = cJSON_PrintUnformatted(cJSON_GetObjectItem(rec[0], "token_ids"));
    cr_expect_str_eq(a, b, "sample 2 with seed 40 differs from seed 42");
    cr_expect_str_neq(a, z, "samples 0 and 2 are the same");
    free(a), free(b), free(z);
    for (int i = 0; i < 4; i++) cJSON_Delete(rec[i]);
    free(text);
    remove(in);
    remove(outp);
}

Test(generate_cli, help_wrong_args_and_no_cuda) {
    char cmd[1024], out[16384];
    snprintf(cmd, sizeof cmd, "./%s/minivllm generate --help 2>&1", MV_BUILD_DIR);
    cr_expect_eq(run_command(cmd, out, sizeof out), 0);
    cr_expect(strstr(out, "usage: minivllm generate") && strstr(out, "--max-num-batched-tokens"), "%s", out);
    const char *bad[][2] = {
        {"--model tests/data/tiny-qwen3-tied --prompt-ids 1", "--prompt-ids"},
        {"--model tests/data/tiny-qwen3-tied --input x --max-tokens banana", "banana"},
        {"--model tests/data/tiny-qwen3-tied --input x --top-p 0", "--top-p"},
        {"--model tests/data/tiny-qwen3-tied --input x --device tpu", "tpu"},
        {"--model tests/data/tiny-qwen3-tied --input x --kv-cache-gib -1", "--kv-cache-gib"},
        {"--input x", "--model"},
        {"--model tests/data/tiny-qwen3-tied", "--input"},
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        snprintf(cmd, sizeof cmd, "./%s/minivllm generate %s 2>&1", MV_BUILD_DIR, bad[k][0]);
        cr_expect_eq(run_command(cmd, out, sizeof out), 2, "%s: %s", bad[k][0], out);
        cr_expect(strstr(out, bad[k][1]) != NULL, "%s: %s", bad[k][0], out);
    }
    snprintf(cmd, sizeof cmd, "./%s/minivllm generate --model %s --device cuda --input x 2>&1", MV_BUILD_DIR, MODELS[0]);
    cr_expect_eq(run_command(cmd, out, sizeof out), 1, "%s", out);
    // No GPU is visible to run_command's commands: a clear error, not a crash.
    cr_expect(strstr(out, "--device cuda") && strstr(out, "use --device cpu"), "%s", out);
    // A KV budget too small for one sequence says which options to change.
    snprintf(cmd, sizeof cmd, "./%s/minivllm generate --model %s --input x --kv-cache-gib 0.0001 2>&1", MV_BUILD_DIR,
             MODELS[0]);
    cr_expect_eq(run_command(cmd, out, sizeof out), 1, "%s", out);
    cr_expect(strstr(out, "--kv-cache-gib") && strstr(out, "--max-model-len"), "%s", out);
}

Test(generate_cli, bad_input_lines_are_named) {
    char in[128], cmd[1024], out[16384];
    snprintf(in, sizeof in, "/tmp/mv-test-gen-bad-%d.jsonl", (int)getpid());
    const char *bad[][2] = {
        {"{\"prompt_token_ids\": [1, 2], \"max_tokns\": 3}", "max_tokns"},
        {"{\"prompt_token_ids\": [1, 512]}", "512"},
        {"{\"prompt_token_ids\": [1, 2.5]}", "prompt_token_ids"},
        {"{\"prompt_token_ids\": \"1 2\"}", "prompt_token_ids"},
        {"{\"prompt_token_ids\": []}", "empty"},
        {"{\"prompt_token_ids\": [1], \"max_tokens\": 0}", "max_tokens"},
        {"{\"prompt_token_ids\": [1], \"temperature\": \"hot\"}", "temperature"},
        {"{\"prompt_token_ids\": [1], \"top_p\": 1.5}", "top_p"},
        {"{\"prompt_token_ids\": [1], \"ignore_eos\": 1}", "ignore_eos"},
        {"{\"prompt\": \"Hello\"}", "tokenizer"},
        {"{\"prompt_token_ids\": [1], \"prompt\": \"Hello\"}", "exactly one"},
        {"[1, 2, 3]", "object"},
        {"{\"prompt_token_ids\": [1, 2", "JSON"},
        {"{\"prompt_token_ids\": [1], \"n\": 0}", "\"n\""},
        {"{\"prompt_token_ids\": [1], \"n\": 2, \"temperature\": 0}", "greedy"},
        {"{\"prompt_token_ids\": [1], \"min_p\": 2}", "min_p"},
        {"{\"prompt_token_ids\": [1], \"max_tokens\": 4, \"min_tokens\": 5}", "min_tokens"},
        {"{\"prompt_token_ids\": [1], \"presence_penalty\": 3}", "presence_penalty"},
        {"{\"prompt_token_ids\": [1], \"repetition_penalty\": 0}", "repetition_penalty"},
        {"{\"prompt_token_ids\": [1], \"logprobs\": 21}", "logprobs"},
        {"{\"prompt_token_ids\": [1], \"logprobs\": true}", "logprobs"},
        {"{\"prompt_token_ids\": [1], \"stop_token_ids\": [600]}", "stop_token_ids"},
        {"{\"prompt_token_ids\": [1], \"skip_special_tokens\": 0}", "skip_special_tokens"},
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        char text[512];
        snprintf(text, sizeof text, "{\"prompt_token_ids\": [7, 8]}\n%s\n", bad[k][0]);
        write_file(in, text);
        snprintf(cmd, sizeof cmd, "./%s/minivllm generate --model %s --input %s 2>&1", MV_BUILD_DIR, MODELS[0], in);
        cr_expect_eq(run_command(cmd, out, sizeof out), 1, "%s: %s", bad[k][0], out);
        char where[160];
        snprintf(where, sizeof where, "%s:2:", in);
        cr_expect(strstr(out, where) && strstr(out, bad[k][1]), "%s: %s", bad[k][0], out);
    }
    // Too long for --max-model-len: named by its line too.
    write_file(in, "{\"prompt_token_ids\": [7, 8]}\n{\"prompt_token_ids\": [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]}\n");
    snprintf(cmd, sizeof cmd, "./%s/minivllm generate --model %s --input %s --max-model-len 8 2>&1", MV_BUILD_DIR,
             MODELS[0], in);
    cr_expect_eq(run_command(cmd, out, sizeof out), 1, "%s", out);
    char where[160];
    snprintf(where, sizeof where, "%s:2:", in);
    cr_expect(strstr(out, where) && strstr(out, "max_model_len"), "%s", out);
    remove(in);
}

// --logits-out: the first-step logits of every request, in input order, as a
// float32 .npy that numpy.load reads (the layout cmd_generate.c's header
// describes), equal to transformers' golden logits. The input lists golden
// cases 2, 0, 1 (untied model) and a 32-token budget chunks the prefills, so
// the rows arrive out of order and in different steps.
Test(generate_cli, logits_out_writes_the_first_step_logits_as_npy) {
    golden_t g;
    golden_load_fresh(MODELS[1], &g);
    const int order[3] = {2, 0, 1};
    char in[128], npy[128], cmd[1024], out[16384];
    snprintf(in, sizeof in, "/tmp/mv-test-logits-in-%d.jsonl", (int)getpid());
    snprintf(npy, sizeof npy, "/tmp/mv-test-logits-%d.npy", (int)getpid());
    FILE *f = fopen(in, "w");
    cr_assert_not_null(f);
    for (int r = 0; r < 3; r++) {
        const golden_case_t *gc = &g.cases[order[r]];
        cr_assert_not_null(gc->first_logits, "golden case %d has no first_logits", order[r]);
        fprintf(f, "{\"prompt_token_ids\": [");
        for (int k = 0; k < gc->n_prompt; k++) fprintf(f, k ? ", %d" : "%d", gc->prompt[k]);
        fprintf(f, "], \"max_tokens\": 2}\n");
    }
    fclose(f);
    snprintf(cmd, sizeof cmd,
             "./%s/minivllm generate --model %s --input %s --output /dev/null --logits-out %s "
             "--max-num-batched-tokens 32 2>&1",
             MV_BUILD_DIR, MODELS[1], in, npy);
    cr_assert_eq(run_command(cmd, out, sizeof out), 0, "%s\n%s", cmd, out);
    // The .npy: magic, version 1.0, a header dict naming '<f4' and the shape, data at a multiple of 64.
    f = fopen(npy, "rb");
    cr_assert_not_null(f, "%s was not written", npy);
    unsigned char pre[10];
    cr_assert_eq(fread(pre, 1, 10, f), 10u);
    cr_expect(memcmp(pre, "\x93NUMPY\x01\x00", 8) == 0, "not a version 1.0 .npy");
    int hlen = pre[8] | pre[9] << 8;
    cr_expect_eq((10 + hlen) % 64, 0, "header length %d: data not 64-byte aligned", hlen);
    char header[256] = {0};
    cr_assert(hlen < (int)sizeof header);
    cr_assert_eq(fread(header, 1, (size_t)hlen, f), (size_t)hlen);
    cr_expect(strstr(header, "'descr': '<f4'") && strstr(header, "'fortran_order': False") &&
                  strstr(header, "'shape': (3, 512)") && header[hlen - 1] == '\n',
              "%s", header);
    float row[512];
    for (int r = 0; r < 3; r++) {
        cr_assert_eq(fread(row, sizeof(float), 512, f), 512u, "row %d", r);
        const float *want = g.cases[order[r]].first_logits;
        double err = 0, ref = 0;
        for (int k = 0; k < 512; k++) {
            err += ((double)row[k] - want[k]) * ((double)row[k] - want[k]);
            ref += (double)want[k] * want[k];
        }
        cr_expect_lt(err / ref, LOGITS_NMSE_TOL, "row %d (golden case %d): NMSE %.3g", r, order[r], err / ref);
    }
    cr_expect_eq(fgetc(f), EOF, "bytes after the last row");
    fclose(f);
    remove(npy);
    // A path that cannot be opened fails before loading, naming the option and the path.
    snprintf(cmd, sizeof cmd, "./%s/minivllm generate --model %s --input %s --logits-out /nonexistent-dir/l.npy 2>&1",
             MV_BUILD_DIR, MODELS[1], in);
    cr_expect_eq(run_command(cmd, out, sizeof out), 1, "%s", out);
    cr_expect(strstr(out, "--logits-out") && strstr(out, "/nonexistent-dir/l.npy"), "%s", out);
    // Binary data on stdout, or no path, is refused as a usage error.
    const char *bad[] = {"--logits-out -", "--logits-out="};
    for (size_t k = 0; k < sizeof bad / sizeof *bad; k++) {
        snprintf(cmd, sizeof cmd, "./%s/minivllm generate --model %s --input %s %s 2>&1", MV_BUILD_DIR, MODELS[1], in,
                 bad[k]);
        cr_expect_eq(run_command(cmd, out, sizeof out), 2, "%s: %s", bad[k], out);
        cr_expect(strstr(out, "--logits-out") != NULL, "%s: %s", bad[k], out);
    }
    // A failing run leaves no half-written file behind.
    write_file(in, "{\"prompt_token_ids\": [7, 8]}\n{\"prompt_token_ids\": [1, 9999]}\n");
    snprintf(cmd, sizeof cmd, "./%s/minivllm generate --model %s --input %s --logits-out %s 2>&1", MV_BUILD_DIR,
             MODELS[1], in, npy);
    cr_expect_eq(run_command(cmd, out, sizeof out), 1, "%s", out);
    cr_expect_eq(access(npy, F_OK), -1, "%s left behind after a failure", npy);
    remove(in);
    golden_free(&g);
}

// The real Qwen3 tokenizer cut down to the tiny model's 512 ids: its vocab
// entries below 512, the merges among them, no added tokens. Written to
// dir/tokenizer.json with a tokenizer_config.json that names no eos (and,
// with chat, carries Qwen3's chat template).
static void write_cut_tokenizer(const char *qwen, const char *dir, int keep, int chat) {
    char path[512];
    snprintf(path, sizeof path, "%s/tokenizer.json", qwen);
    char *text = read_text(path);
    cJSON *root = cJSON_Parse(text);
    free(text);
    cr_assert_not_null(root, "%s is not JSON", path);
    cJSON *model = cJSON_GetObjectItem(root, "model"), *vocab = cJSON_GetObjectItem(model, "vocab");
    cJSON *kept = cJSON_CreateObject(), *merges = cJSON_CreateArray();
    for (cJSON *v = vocab->child; v; v = v->next)
        if (v->valuedouble < keep) cJSON_AddNumberToObject(kept, v->string, v->valuedouble);
    for (cJSON *m = cJSON_GetObjectItem(model, "merges")->child; m; m = m->next) {
        char a[256], b[256], ab[512];
        if (cJSON_IsString(m)) {
            if (sscanf(m->valuestring, "%255s %255s", a, b) != 2) continue;
        } else {
            snprintf(a, sizeof a, "%s", m->child->valuestring);
            snprintf(b, sizeof b, "%s", m->child->next->valuestring);
        }
        snprintf(ab, sizeof ab, "%s%s", a, b);
        if (cJSON_GetObjectItemCaseSensitive(kept, a) && cJSON_GetObjectItemCaseSensitive(kept, b) &&
            cJSON_GetObjectItemCaseSensitive(kept, ab))
            cJSON_AddItemToArray(merges, cJSON_Duplicate(m, 1));
    }
    cJSON_ReplaceItemInObject(model, "vocab", kept);
    cJSON_ReplaceItemInObject(model, "merges", merges);
    cJSON_ReplaceItemInObject(root, "added_tokens", cJSON_CreateArray());
    char *out = cJSON_PrintUnformatted(root);
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    write_file(path, out);
    free(out);
    cJSON_Delete(root);
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    if (!chat) {
        write_file(path, "{\"eos_token\": null}");
        return;
    }
    char src[512];
    snprintf(src, sizeof src, "%s/tokenizer_config.json", qwen);
    char *cfg_text = read_text(src);
    cJSON *cfg = cJSON_Parse(cfg_text), *conf = cJSON_CreateObject();
    free(cfg_text);
    cr_assert_not_null(cfg, "%s is not JSON", src);
    cJSON_AddNullToObject(conf, "eos_token");
    cJSON_AddItemToObject(conf, "chat_template", cJSON_Duplicate(cJSON_GetObjectItem(cfg, "chat_template"), 1));
    char *conf_text = cJSON_PrintUnformatted(conf);
    write_file(path, conf_text);
    free(conf_text);
    cJSON_Delete(conf);
    cJSON_Delete(cfg);
}

// Text prompts: the tiny tied checkpoint with a tokenizer beside it
// (symlinks in a temporary directory). The real Qwen3 tokenizer has 151,669
// ids, more than the tiny model's 512 rows: refused at load, by name. Cut
// down to 512 ids (byte-level BPE gives short ASCII texts ids below 512) it
// runs; and sampled ids the cut tokenizer does not know (it has fewer than
// 512: padding rows) decode to no text, counted on stderr, failing nothing.
Test(generate_cli, text_prompts_with_a_tokenizer) {
    const char *qwen = qwen3_dir_or_skip("generate with a tokenizer");
    char dir[128], cmd[2048], out[16384], path[256];
    snprintf(dir, sizeof dir, "/tmp/mv-test-gen-tok-%d", (int)getpid());
    snprintf(cmd, sizeof cmd,
             "mkdir -p %s && for f in config.json generation_config.json model.safetensors; do ln -sf \"$PWD/%s/$f\" "
             "%s/$f; done && for f in tokenizer.json tokenizer_config.json; do ln -sf \"%s/$f\" %s/$f; done",
             dir, MODELS[0], dir, qwen, dir);
    cr_assert_eq(run_command(cmd, out, sizeof out), 0, "%s", cmd);
    snprintf(cmd, sizeof cmd, "./%s/minivllm generate --model %s --prompt 'a' 2>&1", MV_BUILD_DIR, dir);
    cr_expect_eq(run_command(cmd, out, sizeof out), 1, "%s", out);
    cr_expect(strstr(out, "tokenizer.json has 151669 ids, more than config.json's vocab_size 512"), "%s", out);

    snprintf(cmd, sizeof cmd, "rm -f %s/tokenizer.json %s/tokenizer_config.json", dir, dir);
    run_command(cmd, out, sizeof out);
    write_cut_tokenizer(qwen, dir, 400, 0);
    snprintf(path, sizeof path, "%s/out.jsonl", dir);
    snprintf(cmd, sizeof cmd,
             "./%s/minivllm generate --model %s --prompt '1+1=' --prompt 'a' --temperature 0 --max-tokens 12 "
             "--ignore-eos --output %s 2>&1",
             MV_BUILD_DIR, dir, path);
    cr_assert_eq(run_command(cmd, out, sizeof out), 0, "%s", out);
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f);
    char line[8192];
    int n = 0, unknown = 0;
    while (fgets(line, sizeof line, f)) {
        cJSON *o = cJSON_Parse(line);
        cr_assert_not_null(o);
        int32_t ids[MAX_IDS];
        int k = ids_from_json(cJSON_GetObjectItem(o, "token_ids"), ids, MAX_IDS);
        cr_expect_eq(k, 12);
        // The text is the tokenizer's decoding of the ids it knows (special tokens skipped).
        char list[1024] = "", *p = list;
        for (int i = 0; i < k; i++) {
            unknown += ids[i] >= 400;
            if (ids[i] < 400) p += snprintf(p, sizeof list - (size_t)(p - list), p > list ? ",%d" : "%d", ids[i]);
        }
        char want[4096] = "\"\"";
        snprintf(cmd, sizeof cmd, "./%s/minivllm detokenize --model %s --ids '%s' --skip-special --json", MV_BUILD_DIR,
                 dir, list);
        if (list[0]) cr_assert_eq(run_command(cmd, want, sizeof want), 0, "%s", want);
        cJSON *w = cJSON_Parse(want);
        cr_assert(cJSON_IsString(w), "%s", want);
        cr_expect_str_eq(cJSON_GetObjectItem(o, "text")->valuestring, w->valuestring);
        cJSON_Delete(w);
        cJSON_Delete(o);
        n++;
    }
    fclose(f);
    cr_expect_eq(n, 2);
    cr_expect_gt(unknown, 0, "test setup: no generated id was past the cut tokenizer's 400 ids");
    char note[128];
    snprintf(note, sizeof note, "%d generated ids are padding rows the tokenizer does not know", unknown);
    cr_expect(strstr(out, note), "%s", out);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    run_command(cmd, out, sizeof out);
}

// ---- one request never sinks the others; results as they finish ----------------------------

// The memory estimate made before loading is what the CPU runner then
// allocates, buffer for buffer (a load refused or let through on it must
// be refused or let through for the right amount).
Test(engine_memory, estimate_is_what_the_cpu_runner_allocates) {
    for (int m = 0; m < N_MODELS; m++) {
        engine_t *e = make_engine(MODELS[m], 3, 40, 8, 50, 1);
        engine_memory_t mem;
        cr_assert_eq(engine_memory_estimate(&e->cfg, &e->model, &mem), 0, "%s", mv_last_error());
        cr_expect_eq(mem.runner.weight_bytes, e->runner->weight_bytes, "%s: weights", MODELS[m]);
        cr_expect_eq(mem.runner.kv_cache_bytes, e->runner->kv_cache_bytes, "%s: KV cache", MODELS[m]);
        cr_expect_eq(mem.runner.scratch_bytes, e->runner->scratch_bytes, "%s: scratch", MODELS[m]);
        cr_expect_gt(mem.host_bytes, e->runner->weight_bytes + e->runner->kv_cache_bytes + e->runner->scratch_bytes);
        size_t avail = 0;
        cr_expect_eq(host_memory_available(&avail), 0, "%s", mv_last_error());
        cr_expect_gt(avail, 0);
        cr_expect_leq(mem.host_min_bytes, mem.host_bytes);
        // More than any machine has: refused, naming both byte counts.
        mem.host_min_bytes = (size_t)1 << 62;
        cr_expect_eq(engine_memory_check(&mem, &e->cfg), -1);
        char need[64];
        snprintf(need, sizeof need, "needs at least %zu bytes", mem.host_min_bytes);
        cr_expect(strstr(mv_last_error(), need) && strstr(mv_last_error(), "are available"), "%s", mv_last_error());
        engine_free(e);
    }
}

// tests/data/tiny-qwen3-untied with embedding row 100 set to NaN (bf16
// 0x7fc0), in a temporary directory made once per test process: a prompt
// holding id 100 gets logits with no finite value, the others are as on the
// real model (untied: the LM head does not read the poisoned row).
static const char *poisoned_model_dir(void) {
    static char dir[128];
    if (dir[0]) return dir;
    snprintf(dir, sizeof dir, "/tmp/mv-test-nan-%d", (int)getpid());
    char cmd[512], out[256], path[256];
    snprintf(cmd, sizeof cmd, "mkdir -p %s && cp %s/config.json %s/generation_config.json %s/", dir, MODELS[1],
             MODELS[1], dir);
    cr_assert_eq(run_command(cmd, out, sizeof out), 0, "%s", out);
    snprintf(path, sizeof path, "%s/model.safetensors", MODELS[1]);
    st_model_t *m;
    cr_assert_eq(st_open_file(path, &m), 0, "%s", mv_last_error());
    const st_tensor_t *t = st_find(m, "model.embed_tokens.weight");
    cr_assert_not_null(t);
    size_t size = m->files[0].size, at = (size_t)((const uint8_t *)t->data - m->files[0].data);
    uint8_t *bytes = malloc(size);
    cr_assert_not_null(bytes);
    memcpy(bytes, m->files[0].data, size);
    for (int64_t k = 0; k < t->shape[1]; k++) {
        bytes[at + 2 * (size_t)(100 * t->shape[1] + k)] = 0xc0;
        bytes[at + 2 * (size_t)(100 * t->shape[1] + k) + 1] = 0x7f;
    }
    st_close(m);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f);
    cr_assert_eq(fwrite(bytes, 1, size, f), size);
    fclose(f);
    free(bytes);
    return dir;
}

// A backend that samples "on its device": the CPU step, sampled greedily
// on the host, except that every row of request `poison` reports the GPU
// sampler's answer for logits with no finite value.
static int fake_poison_prompt0 = -1;
static int fake_step_sample(model_runner_t *r, const runner_step_t *in, const runner_sampling_t *sp,
                            int32_t *sampled, float *logits) {
    const int V = r->cfg.vocab_size;
    float *own = logits ? logits : malloc((size_t)in->num_sample * (size_t)V * sizeof(float));
    if (!own || RUNNER_BACKEND_CPU.step(r, in, own)) return -1;
    for (int k = 0; k < in->num_sample; k++) {
        sampled[k] = sampling_argmax_cpu(own + (size_t)k * V, V);
        // The tests give the poisoned request a first prompt token no other request has.
        int t = in->sample_token_index[k];
        int row = 0;
        while (in->cu_seqlens_q[row + 1] <= t) row++;
        (void)sp;
        if (in->input_ids[in->cu_seqlens_q[row]] == fake_poison_prompt0 && in->positions[in->cu_seqlens_q[row]] == 0)
            sampled[k] = RUNNER_ROW_FAILED;
    }
    if (!logits) free(own);
    return 0;
}

typedef struct {
    int order[MAX_CASES], n;
    int stop_after;                    // set *stop after this many finished (0: never)
    volatile sig_atomic_t *stop;
} finished_log_t;

static int log_finished(void *ctx, int i, const engine_output_t *o) {
    finished_log_t *l = ctx;
    cr_expect(o->done, "request %d handed over before it was done", i);
    l->order[l->n++] = i;
    if (l->stop_after && l->n == l->stop_after) *l->stop = SIGINT;
    return 0;
}

// Requests [7, 8], [100, 5, 6] (the poisoned one, failing at its first
// token), [9]: on the host sampler (NaN logits: the untied model's
// embedding row 100 made NaN) and on a device sampler (RUNNER_ROW_FAILED),
// the poisoned request ends with an error and the others as they would alone.
Test(engine_isolation, a_failing_request_ends_alone_on_both_sampling_paths) {
    static const int32_t p0[] = {7, 8}, p1[] = {100, 5, 6}, p2[] = {9};
    sampling_params_t greedy = {.temperature = 0.0f, .top_k = 0, .top_p = 1.0f, .max_tokens = 6, .ignore_eos = 1};
    engine_request_t reqs[3] = {{p0, 2, greedy, 0}, {p1, 3, greedy, 1}, {p2, 1, greedy, 2}};
    // The reference: each healthy request alone on a healthy model.
    engine_t *e = make_engine(MODELS[1], 4, 64, 8, 64, 1);
    engine_output_t alone[3] = {{0}};
    for (int i = 0; i < 3; i += 2) cr_assert_eq(engine_generate(e, &reqs[i], 1, &alone[i], NULL, NULL), 0);
    // Device path: a backend whose sampler fails request 1's rows.
    runner_backend_t fake = *e->runner->backend;
    fake.step_sample = fake_step_sample;
    const runner_backend_t *real = e->runner->backend;
    e->runner->backend = &fake;
    fake_poison_prompt0 = 100;
    for (int path = 0; path < 2; path++) {
        engine_output_t outs[3];
        finished_log_t log = {.n = 0};
        engine_hooks_t hooks = {.on_finished = log_finished, .ctx = &log};
        cr_assert_eq(engine_run(e, reqs, 3, outs, &hooks), 0, "path %d: %s", path, mv_last_error());
        cr_expect_eq(e->num_failed, 1, "path %d", path);
        cr_expect_eq(e->num_finished, 3);
        cr_expect_eq(log.n, 3, "on_finished once per request");
        cr_expect_not_null(outs[1].error, "path %d: the poisoned request has no error", path);
        cr_expect_str_eq(engine_output_finish_reason(&outs[1]), "error");
        cr_expect_eq(outs[1].num_tokens, 0, "the placeholder token must not be in the output");
        if (outs[1].error) cr_expect(strstr(outs[1].error, "no finite"), "%s", outs[1].error);
        for (int i = 0; i < 3; i += 2) {
            cr_expect_null(outs[i].error);
            cr_expect_eq(outs[i].num_tokens, alone[i].num_tokens);
            cr_expect_eq(memcmp(outs[i].token_ids, alone[i].token_ids, (size_t)alone[i].num_tokens * 4), 0,
                         "path %d: request %d differs from its run alone", path, i);
        }
        engine_outputs_free(outs, 3);
        if (path == 0) {
            // Host path: the real CPU backend on a copy of the model whose embedding row 100 is NaN.
            e->runner->backend = real;
            engine_free(e);
            e = make_engine(poisoned_model_dir(), 4, 64, 8, 64, 1);
        }
    }
    engine_outputs_free(alone, 3);
    engine_free(e);
    char cmd[256], out[256];
    snprintf(cmd, sizeof cmd, "rm -rf %s", poisoned_model_dir());
    run_command(cmd, out, sizeof out);
}

// engine_run hands each output over once, as it finishes (shorter first);
// the stop flag stops it between steps, keeping what had finished.
Test(engine_isolation, finish_order_and_stop) {
    static const int32_t p[] = {7, 8, 9};
    engine_request_t reqs[3];
    for (int i = 0; i < 3; i++) reqs[i] = (engine_request_t){p, 3, {.temperature = 0.0f, .top_k = 0, .top_p = 1.0f, .max_tokens = 12 - 4 * i, .ignore_eos = 1}, (uint64_t)i};
    engine_t *e = make_engine(MODELS[0], 4, 64, 8, 64, 1);
    engine_output_t outs[3];
    volatile sig_atomic_t stop = 0;
    finished_log_t log = {.n = 0, .stop_after = 0, .stop = &stop};
    engine_hooks_t hooks = {.on_finished = log_finished, .stop = &stop, .ctx = &log};
    cr_assert_eq(engine_run(e, reqs, 3, outs, &hooks), 0, "%s", mv_last_error());
    cr_expect(log.n == 3 && log.order[0] == 2 && log.order[1] == 1 && log.order[2] == 0, "finish order %d %d %d",
              log.order[0], log.order[1], log.order[2]);
    engine_outputs_free(outs, 3);
    log = (finished_log_t){.n = 0, .stop_after = 1, .stop = &stop};
    cr_assert_eq(engine_run(e, reqs, 3, outs, &hooks), ENGINE_STOPPED, "%s", mv_last_error());
    cr_expect(e->stopped && e->num_finished == 1 && outs[2].done && !outs[0].done && !outs[1].done);
    cr_expect_eq(outs[2].num_tokens, 4);
    cr_expect_lt(e->num_steps, 6, "it ran on after the stop: %lld steps", e->num_steps);
    engine_outputs_free(outs, 3);
    engine_free(e);
}

// ---- stop strings, generate --stream, chat: text end to end (the real tokenizer, cut) ---------

// The tiny tied checkpoint beside Qwen3's real tokenizer cut to its 512 ids
// and Qwen3's chat template, in dir (a temporary directory).
static void make_text_model(const char *qwen, char *dir, size_t cap) {
    snprintf(dir, cap, "/tmp/mv-test-text-%d", (int)getpid());
    char cmd[2048], out[1024];
    snprintf(cmd, sizeof cmd,
             "rm -rf %s && mkdir -p %s && for f in config.json generation_config.json model.safetensors; do ln -sf "
             "\"$PWD/%s/$f\" %s/$f; done",
             dir, dir, MODELS[0], dir);
    cr_assert_eq(run_command(cmd, out, sizeof out), 0, "%s", cmd);
    write_cut_tokenizer(qwen, dir, 512, 1);
}

static void remove_dir(const char *dir) {
    char cmd[512], out[64];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    run_command(cmd, out, sizeof out);
}

// A whole file, binary-safe: its bytes (NUL-terminated) and *len.
static char *read_bytes(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "cannot open %s", path);
    static char buf[1 << 16];
    *len = fread(buf, 1, sizeof buf - 1, f);
    buf[*len] = '\0';
    fclose(f);
    char *s = malloc(*len + 1);
    memcpy(s, buf, *len + 1);
    return s;
}

// `minivllm generate` on one JSONL request (built with cJSON, consumed): its record.
static cJSON *generate_record(const char *dir, cJSON *req) {
    char path[256], cmd[1024];
    static char out[1 << 16];
    snprintf(path, sizeof path, "%s/in.jsonl", dir);
    char *line = cJSON_PrintUnformatted(req);
    write_file(path, line);
    free(line);
    cJSON_Delete(req);
    snprintf(cmd, sizeof cmd, "./%s/minivllm generate --model %s --device cpu --input %s --output - 2>&1",
             MV_BUILD_DIR, dir, path);
    cr_assert_eq(run_command(cmd, out, sizeof out), 0, "%s", out);
    cJSON *o = cJSON_Parse(out);
    cr_assert_not_null(o, "%s", out);
    return o;
}

// {"prompt": "1+1=", 30 greedy tokens, ignore_eos}, with stop (a JSON value, or NULL) and include.
static cJSON *stop_request(const char *stop_json, int include) {
    cJSON *r = cJSON_CreateObject();
    cJSON_AddStringToObject(r, "prompt", "1+1=");
    cJSON_AddNumberToObject(r, "max_tokens", 30);
    cJSON_AddNumberToObject(r, "temperature", 0);
    cJSON_AddTrueToObject(r, "ignore_eos");
    if (stop_json) cJSON_AddItemToObject(r, "stop", cJSON_Parse(stop_json));
    if (include) cJSON_AddTrueToObject(r, "include_stop_str_in_output");
    return r;
}

// The text of ids[0..n) (special tokens skipped), binary-safe, in *out.
static void decode_ids(const tokenizer_t *tok, const int32_t *ids, int n, tok_bytes_t *out) {
    out->len = 0;
    cr_assert_eq(tok_bytes_append(out, "", 0), 0);
    cr_assert_eq(tokenizer_decode(tok, ids, (size_t)n, 1, out), 0, "%s", mv_last_error());
}

// Stop strings through generate's JSONL: the text is cut before the string
// (after it with include_stop_str_in_output), finish_reason "stop",
// stop_reason the string, and the request ended on the token that completed
// it: token_ids are the greedy run's first m, m the fewest whose text holds
// the string. The string is picked so that it spans a token boundary (it is
// found only once two tokens are in), which is what held-back text is for.
Test(stop_strings, generate_jsonl_cut_at_the_string_and_no_token_past_it) {
    const char *qwen = qwen3_dir_or_skip("stop strings with a tokenizer");
    char dir[128];
    make_text_model(qwen, dir, sizeof dir);
    cJSON *base = generate_record(dir, stop_request(NULL, 0));
    int32_t ids[MAX_IDS];
    const int n = ids_from_json(cJSON_GetObjectItem(base, "token_ids"), ids, MAX_IDS);
    cr_assert_eq(n, 30);
    cr_expect(cJSON_IsNull(cJSON_GetObjectItem(base, "stop_reason")), "no stop: stop_reason null");
    tokenizer_t *tok = tokenizer_load(dir);
    cr_assert_not_null(tok, "%s", mv_last_error());
    tok_bytes_t all = {0}, pre = {0};
    decode_ids(tok, ids, n, &all);
    // A 3-byte printable ASCII string that first occurs at p and is completed by token m-1, begun before it.
    char stop[4] = "";
    size_t p = 0;
    int m = 0;
    for (size_t at = 0; at + 3 <= all.len && !m; at++) {
        const char *s = all.data + at;
        if (s[0] <= ' ' || s[0] > '~' || s[1] <= ' ' || s[1] > '~' || s[2] <= ' ' || s[2] > '~') continue;
        if (memmem(all.data, at + 2, s, 3)) continue;  // not its first occurrence
        int k = 1;
        for (; k <= n; k++) {
            decode_ids(tok, ids, k, &pre);
            if (memmem(pre.data, pre.len, s, 3)) break;
        }
        decode_ids(tok, ids, k - 1, &pre);
        if (pre.len > at && pre.len < at + 3) memcpy(stop, s, 3), p = at, m = k;
    }
    cr_assert_gt(m, 0, "test setup: no 3-byte ASCII string of the greedy text spans a token boundary");
    cr_assert_lt(m, n, "test setup: the stop should come before max_tokens");
    char list[64];
    snprintf(list, sizeof list, "[\"never-in-it\", \"%s\"]", stop);
    for (int include = 0; include <= 1; include++) {
        cJSON *req = stop_request(list, include);
        cJSON *o = generate_record(dir, req);
        int32_t got[MAX_IDS];
        const int k = ids_from_json(cJSON_GetObjectItem(o, "token_ids"), got, MAX_IDS);
        cr_expect_eq(k, m, "include %d: %d tokens, the stop is complete after %d: none may be spent past it", include,
                     k, m);
        cr_expect(k <= m && memcmp(got, ids, (size_t)k * sizeof *got) == 0, "include %d: the greedy run's ids", include);
        const size_t want_len = p + (include ? 3 : 0);
        const char *text = cJSON_GetObjectItem(o, "text")->valuestring;
        cr_expect(strlen(text) == want_len && memcmp(text, all.data, want_len) == 0,
                  "include %d: text %zu bytes, want the first %zu (stop \"%s\" at %zu)", include, strlen(text),
                  want_len, stop, p);
        cr_expect_str_eq(cJSON_GetObjectItem(o, "finish_reason")->valuestring, "stop");
        const cJSON *sr = cJSON_GetObjectItem(o, "stop_reason");
        cr_expect(cJSON_IsString(sr) && strcmp(sr->valuestring, stop) == 0, "stop_reason is the string");
        cJSON_Delete(o);
    }
    // One string, not a list: the same.
    snprintf(list, sizeof list, "\"%s\"", stop);
    cJSON *o = generate_record(dir, stop_request(list, 0));
    cr_expect_eq(cJSON_GetArraySize(cJSON_GetObjectItem(o, "token_ids")), m);
    cJSON_Delete(o);
    // Bad values, and no tokenizer: refused before anything runs, naming the key.
    char path[256], cmd[1024], out[4096];
    snprintf(path, sizeof path, "%s/bad.jsonl", dir);
    static const char *const BAD[] = {"[\"\"]", "[\"a\",\"b\",\"c\",\"d\",\"e\"]", "3"};
    for (int i = 0; i < 3; i++) {
        char line[256];
        snprintf(line, sizeof line, "{\"prompt\": \"a\", \"stop\": %s}\n", BAD[i]);
        write_file(path, line);
        snprintf(cmd, sizeof cmd, "./%s/minivllm generate --model %s --input %s --output - 2>&1", MV_BUILD_DIR, dir, path);
        cr_expect_eq(run_command(cmd, out, sizeof out), 1, "%s: %s", BAD[i], out);
        cr_expect(strstr(out, "\"stop\""), "%s: %s", BAD[i], out);
    }
    write_file(path, "{\"prompt_token_ids\": [40, 63], \"stop\": [\"ab\"]}\n");
    snprintf(cmd, sizeof cmd, "./%s/minivllm generate --model %s --input %s --output - 2>&1", MV_BUILD_DIR, MODELS[0],
             path);
    cr_expect_eq(run_command(cmd, out, sizeof out), 1, "%s", out);
    cr_expect(strstr(out, "no tokenizer.json"), "%s", out);
    tok_bytes_free(&all);
    tok_bytes_free(&pre);
    tokenizer_free(tok);
    cJSON_Delete(base);
    remove_dir(dir);
}

// The engine core's streaming matcher on its own (text/stop_str.h): text
// that may be the start of a stop string is never handed out, so what is
// taken, token by token, is always a prefix of the final (cut) text.
Test(stop_strings, held_back_text_is_never_taken_back) {
    const char *qwen = qwen3_dir_or_skip("stop strings with a tokenizer");
    tokenizer_t *tok = tokenizer_load(qwen);
    cr_assert_not_null(tok, "%s", mv_last_error());
    static const char TEXT[] = "Hello world, hello there; hello thing.";
    tok_ids_t ids = {0};
    cr_assert_eq(tokenizer_encode(tok, TEXT, strlen(TEXT), &ids), 0);
    static const char *const STOPS[] = {"lo thi", "xyz"};
    for (int include = 0; include <= 1; include++) {
        stop_text_t s;
        cr_assert_eq(stop_text_init(&s, tok, STOPS, 2, include, 1), 0, "%s", mv_last_error());
        tok_bytes_t shown = {0};
        int hit = 0, held = 0;
        size_t k = 0;
        for (; k < ids.len && !hit; k++) {
            hit = stop_text_push(&s, ids.data[k]);
            size_t n;
            const char *p = stop_text_take(&s, &n);
            tok_bytes_append(&shown, p, n);
            held |= !hit && shown.len < s.text.len;
            // Never a byte that is not the final text's.
            cr_expect(memcmp(shown.data, TEXT, shown.len) == 0, "token %zu: shown \"%.*s\"", k, (int)shown.len,
                      shown.data);
        }
        cr_expect_eq(hit, 1);
        stop_text_finish(&s);
        size_t n;
        const char *p = stop_text_take(&s, &n);
        tok_bytes_append(&shown, p, n);
        const char *want = include ? "Hello world, hello there; hello thi" : "Hello world, hello there; hel";
        cr_expect(shown.len == strlen(want) && memcmp(shown.data, want, shown.len) == 0, "include %d: \"%.*s\"",
                  include, (int)shown.len, shown.data);
        cr_expect_str_eq(stop_text_matched(&s), "lo thi");
        // "lo th" of "hello there" looks like the start of "lo thi": held back until "ere" settles it.
        if (!include) cr_expect(held, "some text was held back");
        else cr_expect(!held, "include_stop_str_in_output: nothing is ever cut, so nothing is held");
        tok_bytes_free(&shown);
        stop_text_free(&s);
    }
    tok_ids_free(&ids);
    tokenizer_free(tok);
}

// generate --stream: the text on stdout, as it is sampled, is the record's text.
Test(generate_cli, stream_prints_the_records_text) {
    const char *qwen = qwen3_dir_or_skip("generate --stream with a tokenizer");
    char dir[128], cmd[2048], out[4096], rec[256], streamed[256];
    make_text_model(qwen, dir, sizeof dir);
    snprintf(rec, sizeof rec, "%s/out.jsonl", dir);
    snprintf(streamed, sizeof streamed, "%s/stdout", dir);
    snprintf(cmd, sizeof cmd,
             "./%s/minivllm generate --model %s --prompt '1+1=' --temperature 0 --max-tokens 30 --ignore-eos --stream "
             "--output %s > %s 2>&1",
             MV_BUILD_DIR, dir, rec, streamed);
    cr_assert_eq(run_command(cmd, out, sizeof out), 0, "%s", out);
    size_t n;
    char *text = read_bytes(streamed, &n);
    char *rec_text = read_text(rec);
    cJSON *o = cJSON_Parse(rec_text);
    free(rec_text);
    cr_assert_not_null(o);
    int32_t ids[MAX_IDS];
    const int k = ids_from_json(cJSON_GetObjectItem(o, "token_ids"), ids, MAX_IDS);
    cr_expect_eq(k, 30);
    tokenizer_t *tok = tokenizer_load(dir);
    tok_bytes_t want = {0};
    decode_ids(tok, ids, k, &want);
    cr_expect(n == want.len + 1 && memcmp(text, want.data, want.len) == 0 && text[n - 1] == '\n',
              "streamed %zu bytes, the record's text is %zu (and a newline)", n, want.len);
    cr_expect(strncmp(cJSON_GetObjectItem(o, "text")->valuestring, text, strlen(cJSON_GetObjectItem(o, "text")->valuestring)) == 0);
    // More than one prompt, or --output -: refused, it is one text on stdout.
    snprintf(cmd, sizeof cmd, "./%s/minivllm generate --model %s --prompt a --prompt b --stream 2>&1", MV_BUILD_DIR, dir);
    cr_expect_eq(run_command(cmd, out, sizeof out), 2, "%s", out);
    snprintf(cmd, sizeof cmd, "./%s/minivllm generate --model %s --prompt a --stream --output - 2>&1", MV_BUILD_DIR, dir);
    cr_expect_eq(run_command(cmd, out, sizeof out), 2, "%s", out);
    tok_bytes_free(&want);
    tokenizer_free(tok);
    free(text);
    cJSON_Delete(o);
    remove_dir(dir);
}

// minivllm chat: two turns piped on stdin print the replies generate gives
// for the same conversation (greedy): the first is generate --chat's, the
// second generate's for the messages [user, the first reply, user].
Test(chat_cli, two_turns_equal_generate_on_the_conversation) {
    const char *qwen = qwen3_dir_or_skip("minivllm chat with a tokenizer");
    char dir[128], cmd[2048], out[4096], path[256];
    make_text_model(qwen, dir, sizeof dir);
    tokenizer_t *tok = tokenizer_load(dir);
    cr_assert_not_null(tok, "%s", mv_last_error());
    // Turn one: generate --chat (enable_thinking false, as --no-thinking).
    snprintf(cmd, sizeof cmd, "./%s/minivllm generate --model %s --chat --prompt hi --temperature 0 --max-tokens 8 "
                              "--output - 2>&1", MV_BUILD_DIR, dir);
    cr_assert_eq(run_command(cmd, out, sizeof out), 0, "%s", out);
    cJSON *o1 = cJSON_Parse(out);
    cr_assert_not_null(o1, "%s", out);
    int32_t ids[MAX_IDS];
    tok_bytes_t r1 = {0}, r2 = {0};
    int k = ids_from_json(cJSON_GetObjectItem(o1, "token_ids"), ids, MAX_IDS);
    decode_ids(tok, ids, k, &r1);
    cr_assert_eq(strlen(r1.data), r1.len, "test setup: the first reply holds a NUL byte");
    // Turn two: the conversation so far as messages.
    cJSON *req = cJSON_CreateObject(), *msgs = cJSON_AddArrayToObject(req, "messages");
    const char *turns[3][2] = {{"user", "hi"}, {"assistant", r1.data}, {"user", "more"}};
    for (int i = 0; i < 3; i++) {
        cJSON *m = cJSON_CreateObject();
        cJSON_AddStringToObject(m, "role", turns[i][0]);
        cJSON_AddStringToObject(m, "content", turns[i][1]);
        cJSON_AddItemToArray(msgs, m);
    }
    cJSON_AddFalseToObject(req, "enable_thinking");
    cJSON_AddNumberToObject(req, "max_tokens", 8);
    cJSON_AddNumberToObject(req, "temperature", 0);
    cJSON *o2 = generate_record(dir, req);
    k = ids_from_json(cJSON_GetObjectItem(o2, "token_ids"), ids, MAX_IDS);
    decode_ids(tok, ids, k, &r2);
    // The chat, both turns on stdin.
    snprintf(path, sizeof path, "%s/chat.out", dir);
    snprintf(cmd, sizeof cmd, "printf 'hi\\nmore\\n' | ./%s/minivllm chat --model %s --no-thinking --temperature 0 "
                              "--max-tokens 8 > %s 2>&1", MV_BUILD_DIR, dir, path);
    cr_assert_eq(run_command(cmd, out, sizeof out), 0, "%s", out);
    size_t n;
    char *got = read_bytes(path, &n);
    tok_bytes_t want = {0};
    tok_bytes_append(&want, r1.data, r1.len);
    tok_bytes_append(&want, "\n", 1);
    tok_bytes_append(&want, r2.data, r2.len);
    tok_bytes_append(&want, "\n", 1);
    cr_expect(n == want.len && memcmp(got, want.data, n) == 0, "chat printed \"%s\", generate gives \"%s\"", got,
              want.data);
    free(got);
    // "/exit" ends it: one reply.
    snprintf(cmd, sizeof cmd, "printf 'hi\\n/exit\\nmore\\n' | ./%s/minivllm chat --model %s --no-thinking "
                              "--temperature 0 --max-tokens 8 > %s 2>&1", MV_BUILD_DIR, dir, path);
    cr_assert_eq(run_command(cmd, out, sizeof out), 0, "%s", out);
    got = read_bytes(path, &n);
    cr_expect(n == r1.len + 1 && memcmp(got, r1.data, r1.len) == 0, "/exit: one reply, \"%s\"", got);
    free(got);
    // No tokenizer: a clear error.
    snprintf(cmd, sizeof cmd, "echo hi | ./%s/minivllm chat --model %s 2>&1", MV_BUILD_DIR, MODELS[0]);
    cr_expect_eq(run_command(cmd, out, sizeof out), 1, "%s", out);
    cr_expect(strstr(out, "chat needs a tokenizer"), "%s", out);
    tok_bytes_free(&r1);
    tok_bytes_free(&r2);
    tok_bytes_free(&want);
    cJSON_Delete(o1);
    cJSON_Delete(o2);
    tokenizer_free(tok);
    remove_dir(dir);
}

// ---- asynchronous scheduling ------------------------------------------------------------------
// A backend with asynchronous steps over the CPU model: launch_sample runs
// the step at once (the "device" is the host), taking a row's input id from
// the step launched before's ids where input_from says so, and keeps its ids
// in one of two slots until collect_sample takes the oldest; sampling as
// fake_step_sample (greedy, request `poison` failing). An id the step before
// failed (RUNNER_ROW_FAILED) reads as id 0, as the GPU's embedding reads an id
// outside the vocabulary as zeros: that row's output is dropped anyway.
static struct {
    int32_t ids[2][64];
    int n[2], head, count;
    long launches, ahead_launches, rows_launched;
} fake_async;

static int fake_launch_sample(model_runner_t *r, const runner_step_t *in, const runner_sampling_t *sp,
                              const int32_t *input_from) {
    cr_assert_lt(fake_async.count, 2, "more than two steps launched");
    cr_assert_leq(in->num_seqs, 64);
    const int slot = (fake_async.head + fake_async.count) % 2, prev = (slot + 1) % 2;
    runner_step_t own = *in;
    int32_t ids[64];
    if (input_from) {
        cr_assert_eq(fake_async.count, 1, "input ids from a step that is not the one in flight");
        for (int q = 0; q < in->num_seqs; q++) {
            cr_assert_lt(input_from[q], fake_async.n[prev]);
            const int32_t id = fake_async.ids[prev][input_from[q]];
            ids[q] = id == RUNNER_ROW_FAILED ? 0 : id;
        }
        own.input_ids = ids;
        fake_async.ahead_launches++;
    }
    if (fake_step_sample(r, &own, sp, fake_async.ids[slot], NULL)) return -1;
    fake_async.n[slot] = in->num_sample;
    fake_async.count++;
    fake_async.launches++;
    fake_async.rows_launched += in->num_sample;
    return 0;
}

static int fake_collect_sample(model_runner_t *r, int32_t *sampled, int n) {
    cr_assert_gt(fake_async.count, 0, "nothing launched");
    cr_assert_eq(n, fake_async.n[fake_async.head]);
    memcpy(sampled, fake_async.ids[fake_async.head], (size_t)n * sizeof *sampled);
    fake_async.head ^= 1;
    fake_async.count--;
    return 0;
}

// The same requests with steps planned ahead and without: the same tokens,
// finish reasons and errors. Stop ids taken from a first run (requests 0 and
// 2's fourth token) end requests where the scheduler cannot foresee it, so the
// step planned ahead drops their rows; request 1 fails at its first token;
// request 3 runs to its max_tokens.
Test(engine_async, steps_planned_ahead_give_the_same_outputs) {
    static const int32_t p0[] = {7, 8}, p1[] = {100, 5, 6}, p2[] = {9}, p3[] = {11, 12, 13, 14};
    sampling_params_t greedy = {.temperature = 0.0f, .top_k = 0, .top_p = 1.0f, .max_tokens = 9, .ignore_eos = 1};
    engine_request_t reqs[4] = {{p0, 2, greedy, 0}, {p1, 3, greedy, 1}, {p2, 1, greedy, 2}, {p3, 4, greedy, 3}};
    reqs[3].params.max_tokens = 14;
    engine_t *e = make_engine(MODELS[0], 4, 64, 8, 64, 1);
    runner_backend_t fake = *e->runner->backend;
    fake.step_sample = fake_step_sample;
    fake.launch_sample = fake_launch_sample;
    fake.collect_sample = fake_collect_sample;
    e->runner->backend = &fake;
    fake_poison_prompt0 = 100;
    engine_output_t first[4];
    e->cfg.no_async_scheduling = 1;
    cr_assert_eq(engine_run(e, reqs, 4, first, NULL), 0, "%s", mv_last_error());
    int32_t stop_id[4];
    engine_stop_t stops[4] = {{0}};
    for (int i = 0; i < 4; i++)
        if ((i == 0 || i == 2) && first[i].num_tokens > 3) {
            stop_id[i] = first[i].token_ids[3];
            stops[i] = (engine_stop_t){.ids = &stop_id[i], .n = 1};
        }
    engine_output_t outs[2][4];
    for (int a = 0; a < 2; a++) {
        e->cfg.no_async_scheduling = !a;
        memset(&fake_async, 0, sizeof fake_async);
        cr_assert_eq(engine_run_stops(e, reqs, stops, 4, outs[a], NULL), 0, "async %d: %s", a, mv_last_error());
        cr_expect_eq(fake_async.count, 0, "async %d: a launched step was never collected", a);
        if (a == 0) cr_expect_eq(fake_async.launches, 0, "no steps launched without async scheduling");
    }
    cr_expect_geq(fake_async.ahead_launches, 10, "only %ld steps planned ahead", fake_async.ahead_launches);
    long tokens = 0;
    for (int i = 0; i < 4; i++) {
        tokens += outs[1][i].num_tokens;
        cr_expect_eq(outs[0][i].num_tokens, outs[1][i].num_tokens, "request %d: %d tokens sync, %d async", i,
                     outs[0][i].num_tokens, outs[1][i].num_tokens);
        cr_expect_eq(memcmp(outs[0][i].token_ids, outs[1][i].token_ids, (size_t)outs[0][i].num_tokens * 4), 0,
                     "request %d differs", i);
        cr_expect_str_eq(engine_output_finish_reason(&outs[0][i]), engine_output_finish_reason(&outs[1][i]));
        cr_expect_eq(!outs[0][i].error, !outs[1][i].error, "request %d", i);
    }
    cr_expect_not_null(outs[1][1].error, "the poisoned request has no error");
    cr_expect_str_eq(engine_output_finish_reason(&outs[1][0]), "stop");
    // Rows computed past an unforeseen end (the stops, the failure): launched, never handed over.
    cr_expect_gt(fake_async.rows_launched, tokens + 1, "%ld rows launched for %ld tokens", fake_async.rows_launched,
                 tokens);
    engine_outputs_free(first, 4);
    engine_outputs_free(outs[0], 4);
    engine_outputs_free(outs[1], 4);
    e->runner->backend = &RUNNER_BACKEND_CPU;
    engine_free(e);
}

/*
 * chapters/09-engine/cmd_bench.c - `minivllm bench`: offline throughput of
 * the engine, vLLM's benchmark_throughput in miniature.
 *
 *   minivllm bench --model DIR [--random-weights] [--num-seqs 256]
 *                  [--min-len 100] [--max-len 1024] [--prompt-len N] [--output-len N]
 *                  [--seed 0] [--json FILE]
 *
 * The workload: num-seqs requests, each with a prompt length and an output
 * length drawn uniformly from [min-len, max-len], and a prompt of random ids
 * (uniform over the vocabulary, special and eos ids left out). All of them
 * are submitted at once, as a batch job would, and the engine batches them
 * continuously. --prompt-len N and --output-len N fix the prompt or the
 * output length of every request instead of drawing it: single-stream
 * decode is --num-seqs 1 --prompt-len 512 --output-len 256. Greedy sampling (temperature 0): the cheapest sampler, and
 * the only choice that does not make the timing depend on a seed.
 *
 * Why ignore_eos: a request must generate exactly its drawn output length.
 * If an eos could stop it early, the work done would depend on what the
 * model happens to say (and with random weights, on noise), and two runs,
 * or two engines, would not be timing the same job.
 *
 * What the numbers mean:
 *   output tok/s = output tokens / generate s. The tokens a user waits for:
 *                  each costs one decode step's share of reading every weight
 *                  and the request's KV cache, so this is the decode-bound
 *                  figure vLLM's benchmarks lead with.
 *   total tok/s  = (prompt + output tokens) / generate s. Prompt tokens are
 *                  processed many per step (prefill is compute-bound and
 *                  cheap per token), so total tok/s is always the larger one,
 *                  and it is the fair figure when prompts are long.
 * generate s is timed with CLOCK_MONOTONIC around engine_generate only;
 * loading (and converting, or drawing random weights) is reported apart as
 * load s, since a server pays it once.
 *
 * --random-weights: no weights file, only config.json. The weights are drawn
 * from --seed as Hugging Face initialises a Qwen3 (qwen3_weights_random) and
 * go through the same binding and runner as a checkpoint: real shapes timed,
 * nonsense generated. Model runtime does not depend on the values (no early
 * exits, ignore_eos), so the times are those of the real model.
 *
 * Requests, lengths and ids are reproducible: request i's prompt and output
 * lengths are draws 2i and 2i+1 of rng_int(min-len, max-len) from
 * rng_seed(seed) (common/rng.h); the prompt ids come from a second stream,
 * rng_seed(seed + 1), request after request. A fixed length replaces its
 * draw (the draws are still made, so fixing the output length leaves the
 * prompt lengths and ids as they were).
 *
 * Exit status: 0, 1 (bad model files, a failing run), 2 (bad arguments,
 * named). Try it: make && ./build/minivllm bench --model tests/data/tiny-qwen3-tied
 * Tests: tests/test_bench.c.
 */
#include <cjson/cJSON.h>
#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "chapters/09-engine/cli.h"
#include "chapters/09-engine/engine.h"
#include "common/check.h"
#include "common/rng.h"

static const char BENCH_USAGE[] =
    "usage: minivllm bench --model DIR [--random-weights] [--num-seqs N] [--min-len N] [--max-len N]\n"
    "                      [--prompt-len N] [--output-len N] [--seed S] [--json FILE]\n"
    "                      [--device cpu|cuda] [engine sizes...]\n"
    "\n"
    "Time the engine on N requests whose prompt and output lengths are drawn uniformly from\n"
    "[--min-len, --max-len] (or fixed by --prompt-len / --output-len), with random prompt ids, greedy sampling (temperature 0) and\n"
    "ignore_eos (every request generates exactly its drawn length). Prints requests, prompt and\n"
    "output tokens, load and generate seconds, output tok/s and total tok/s (prompt + output);\n"
    "--json FILE writes the same with the command line, date and host. --random-weights draws\n"
    "the weights from --seed instead of reading them: DIR then needs only config.json.";

typedef struct {
    const char *model, *num_seqs, *min_len, *max_len, *prompt_len, *output_len, *seed, *json;
    cli_engine_args_t eng;
    int random_weights;
} bench_args_t;

typedef struct {
    long num_seqs, min_len, max_len, seed;
    long prompt_len, output_len;  // 0: drawn from [min_len, max_len]; else every request's length
    engine_config_t ec;       // resolved (engine_config_resolve)
    qwen3_config_t model;
    int threads;              // CPU threads the runner uses
    long long prompt_tokens, output_tokens, steps, preemptions;
    double load_s, generate_s;
    size_t weight_bytes, kv_cache_bytes, scratch_bytes;  // what the runner placed on its device
} bench_t;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

// Numbers, then the lengths against the model and the engine, all before loading.
static int bench_options(const bench_args_t *a, bench_t *b) {
    const char *cmd = "bench";
    b->num_seqs = 256, b->min_len = 100, b->max_len = 1024, b->seed = 0;
    if (cli_parse_long(cmd, "--num-seqs", a->num_seqs, 1, 1 << 20, &b->num_seqs) ||
        cli_parse_long(cmd, "--min-len", a->min_len, 1, 1 << 24, &b->min_len) ||
        cli_parse_long(cmd, "--max-len", a->max_len, 1, 1 << 24, &b->max_len) ||
        cli_parse_long(cmd, "--prompt-len", a->prompt_len, 1, 1 << 24, &b->prompt_len) ||
        cli_parse_long(cmd, "--output-len", a->output_len, 1, 1 << 24, &b->output_len) ||
        cli_parse_long(cmd, "--seed", a->seed, 0, LONG_MAX - 1, &b->seed))
        return CLI_USAGE;
    if (b->min_len > b->max_len)
        return cli_error(cmd, CLI_USAGE, "--min-len %ld is greater than --max-len %ld", b->min_len, b->max_len);
    b->ec = engine_config_default(a->model);
    int st = cli_engine_config(cmd, &a->eng, &b->ec);
    if (st) return st;
    b->ec.random_weights = a->random_weights;
    b->ec.weights_seed = (uint64_t)b->seed;
    b->ec.progress = isatty(STDERR_FILENO);
    if (qwen3_config_load(a->model, &b->model) || engine_config_resolve(&b->ec, &b->model))
        return cli_error(cmd, CLI_FAIL, "%s", mv_last_error());
    // The longest request is the longest prompt plus the longest output.
    long max_prompt = b->prompt_len ? b->prompt_len : b->max_len;
    long max_output = b->output_len ? b->output_len : b->max_len;
    if (max_prompt + max_output > b->ec.max_model_len) {
        char opts[96];
        snprintf(opts, sizeof opts, "%s%s", b->prompt_len ? "--prompt-len" : "--max-len",
                 b->output_len ? (b->prompt_len ? " and --output-len" : " or --output-len")
                               : (b->prompt_len ? " or --max-len" : ""));
        return cli_error(cmd, CLI_USAGE,
                         "%s %ld: a prompt of %ld tokens plus %ld generated needs a max_model_len of %ld, and it "
                         "is %d (lower %s, or raise --max-model-len up to max_position_embeddings %d)",
                         b->prompt_len ? "--prompt-len" : "--max-len", max_prompt, max_prompt, max_output,
                         max_prompt + max_output, b->ec.max_model_len, opts, b->model.max_position_embeddings);
    }
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    b->threads = b->ec.num_threads ? b->ec.num_threads : (int)(cpus > 0 ? cpus : 1);
    return CLI_OK;
}

static int is_excluded(const engine_t *e, int32_t id) {
    for (int k = 0; k < e->model.n_eos; k++)
        if (id == e->model.eos_token_ids[k]) return 1;
    if (id == e->model.bos_token_id) return 1;
    return e->tokenizer && tokenizer_is_special(e->tokenizer, id);
}

// The requests (see the header for how they are drawn). ids: [sum of prompt lengths].
static int make_requests(const bench_t *b, const engine_t *e, engine_request_t *reqs, int32_t **ids_out) {
    const int n = (int)b->num_seqs;
    rng_t len_rng, id_rng;
    rng_seed(&len_rng, (uint64_t)b->seed);
    rng_seed(&id_rng, (uint64_t)b->seed + 1);
    size_t total = 0;
    for (int i = 0; i < n; i++) {
        int prompt_len = rng_int(&len_rng, (int)b->min_len, (int)b->max_len);
        int output_len = rng_int(&len_rng, (int)b->min_len, (int)b->max_len);
        reqs[i].num_prompt = b->prompt_len ? (int)b->prompt_len : prompt_len;
        reqs[i].params = (sampling_params_t){0.0f, 0, 1.0f, b->output_len ? (int)b->output_len : output_len, 1};
        reqs[i].seed = (uint64_t)i;
        total += (size_t)reqs[i].num_prompt;
    }
    int32_t *ids = malloc(total * sizeof *ids);
    if (!ids) return mv_error("out of memory for %zu prompt ids", total);
    // Rejection sampling keeps the rest uniform; a vocabulary of nothing but
    // special ids would never end, so look for one allowed id first.
    const int V = e->model.vocab_size;
    int any = 0;
    for (int32_t id = 0; id < V && !any; id++) any = !is_excluded(e, id);
    if (!any) {
        free(ids);
        return mv_error("every id of the vocabulary is special or eos: no prompt to draw");
    }
    size_t k = 0;
    for (int i = 0; i < n; i++) {
        reqs[i].prompt = ids + k;
        for (int j = 0; j < reqs[i].num_prompt; j++) {
            int32_t id;
            do id = rng_int(&id_rng, 0, V - 1);
            while (is_excluded(e, id));
            ids[k++] = id;
        }
    }
    *ids_out = ids;
    return 0;
}

static int run(bench_t *b) {
    if (b->ec.progress) fprintf(stderr, "minivllm bench: loading %s%s\n", b->ec.model_dir,
                                b->ec.random_weights ? " (random weights)" : "");
    engine_t *e = NULL;
    double t0 = now_s();
    if (engine_create(&b->ec, &e)) return -1;
    b->load_s = now_s() - t0;
    const int n = (int)b->num_seqs;
    engine_request_t *reqs = calloc((size_t)n, sizeof *reqs);
    engine_output_t *outs = calloc((size_t)n, sizeof *outs);
    int32_t *ids = NULL;
    int rc = reqs && outs ? 0 : mv_error("out of memory");
    if (!rc) rc = make_requests(b, e, reqs, &ids);
    if (!rc && b->ec.progress)
        fprintf(stderr, "minivllm bench: loaded in %.2f s; generating %d requests\n", b->load_s, n);
    if (!rc) {
        t0 = now_s();
        rc = engine_generate(e, reqs, n, outs, NULL, NULL);
        b->generate_s = now_s() - t0;
    }
    for (int i = 0; !rc && i < n; i++) {
        b->prompt_tokens += reqs[i].num_prompt;
        b->output_tokens += outs[i].num_tokens;
    }
    if (!rc) {
        b->steps = e->num_steps;
        b->preemptions = e->num_preemptions;
        b->ec = e->cfg;  // what the engine resolved
        b->weight_bytes = e->runner->weight_bytes;
        b->kv_cache_bytes = e->runner->kv_cache_bytes;
        b->scratch_bytes = e->runner->scratch_bytes;
    }
    engine_outputs_free(outs, rc ? 0 : n);
    free(outs);
    free(reqs);
    free(ids);
    engine_free(e);
    return rc;
}

static double per_s(long long tokens, double s) { return s > 0 ? (double)tokens / s : 0; }

static void config_summary(const qwen3_config_t *m, char *buf, size_t cap) {
    snprintf(buf, cap, "%s: %d layers, hidden %d, %d q / %d kv heads x %d, intermediate %d, vocab %d, %s lm_head",
             m->architecture, m->num_hidden_layers, m->hidden_size, m->num_attention_heads, m->num_key_value_heads,
             m->head_dim, m->intermediate_size, m->vocab_size, m->tie_word_embeddings ? "tied" : "untied");
}

static void print_table(const bench_t *b) {
    char cfg[256];
    config_summary(&b->model, cfg, sizeof cfg);
    const engine_config_t *c = &b->ec;
    char lens[160], range[48];
    snprintf(range, sizeof range, "uniform in [%ld, %ld]", b->min_len, b->max_len);
    if (!b->prompt_len && !b->output_len) snprintf(lens, sizeof lens, "prompt and output lengths %s", range);
    else if (b->prompt_len && b->output_len)
        snprintf(lens, sizeof lens, "prompts of %ld tokens, outputs of %ld", b->prompt_len, b->output_len);
    else if (b->prompt_len) snprintf(lens, sizeof lens, "prompts of %ld tokens, output lengths %s", b->prompt_len, range);
    else snprintf(lens, sizeof lens, "prompt lengths %s, outputs of %ld tokens", range, b->output_len);
    printf("minivllm bench: %ld requests, %s, seed %ld,\n"
           "greedy (temperature 0), ignore_eos\n",
           b->num_seqs, lens, b->seed);
    printf("  %-16s %ld\n", "requests", b->num_seqs);
    printf("  %-16s %lld\n", "prompt tokens", b->prompt_tokens);
    printf("  %-16s %lld\n", "output tokens", b->output_tokens);
    printf("  %-16s %.3f\n", "load s", b->load_s);
    printf("  %-16s %.3f\n", "generate s", b->generate_s);
    printf("  %-16s %.1f\n", "output tok/s", per_s(b->output_tokens, b->generate_s));
    printf("  %-16s %.1f\n", "total tok/s", per_s(b->prompt_tokens + b->output_tokens, b->generate_s));
    printf("  %-16s %s\n", "device", c->device == RUNNER_DEVICE_CUDA ? "cuda" : "cpu");
    printf("  %-16s %d\n", "threads", b->threads);
    printf("  %-16s %s%s\n", "model", c->model_dir, c->random_weights ? " (random weights)" : "");
    printf("  %-16s %s\n", "config", cfg);
    printf("  %-16s max_model_len %d, max_num_seqs %d, max_num_batched_tokens %d, %d blocks of %d, %lld steps, "
           "%lld preemptions\n",
           "engine", c->max_model_len, c->max_num_seqs, c->max_num_batched_tokens, c->num_blocks, c->block_size,
           b->steps, b->preemptions);
    printf("  %-16s weights %zu, KV cache %zu, scratch %zu\n", "bytes", b->weight_bytes, b->kv_cache_bytes,
           b->scratch_bytes);
}

// The command line as a shell would take it back: words with anything but
// [A-Za-z0-9_./=:,+-] single-quoted.
static char *command_line(int argc, char **argv) {
    size_t cap = 16;
    for (int i = 0; i < argc; i++) cap += 4 * strlen(argv[i]) + 3;
    char *s = malloc(cap);
    if (!s) return NULL;
    size_t n = (size_t)snprintf(s, cap, "minivllm");
    for (int i = 0; i < argc; i++) {
        const char *w = argv[i];
        int plain = *w != '\0' && strspn(w, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_./=:,+-") ==
                                      strlen(w);
        s[n++] = ' ';
        if (!plain) s[n++] = '\'';
        for (const char *p = w; *p; p++) {
            if (*p == '\'' && !plain) {
                memcpy(s + n, "'\\''", 4);
                n += 4;
            } else {
                s[n++] = *p;
            }
        }
        if (!plain) s[n++] = '\'';
    }
    s[n] = '\0';
    return s;
}

static cJSON *config_json(const qwen3_config_t *m, const engine_config_t *c) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "architecture", m->architecture);
    cJSON_AddNumberToObject(o, "num_hidden_layers", m->num_hidden_layers);
    cJSON_AddNumberToObject(o, "hidden_size", m->hidden_size);
    cJSON_AddNumberToObject(o, "intermediate_size", m->intermediate_size);
    cJSON_AddNumberToObject(o, "num_attention_heads", m->num_attention_heads);
    cJSON_AddNumberToObject(o, "num_key_value_heads", m->num_key_value_heads);
    cJSON_AddNumberToObject(o, "head_dim", m->head_dim);
    cJSON_AddNumberToObject(o, "vocab_size", m->vocab_size);
    // Decode reads every weight once a step: n_params x 2 bytes in bf16 is the napkin math of its GB/s.
    cJSON_AddNumberToObject(o, "n_params", (double)qwen3_config_n_params(m));
    cJSON_AddBoolToObject(o, "tie_word_embeddings", m->tie_word_embeddings);
    cJSON_AddNumberToObject(o, "max_model_len", c->max_model_len);
    cJSON_AddNumberToObject(o, "max_num_seqs", c->max_num_seqs);
    cJSON_AddNumberToObject(o, "max_num_batched_tokens", c->max_num_batched_tokens);
    cJSON_AddNumberToObject(o, "block_size", c->block_size);
    cJSON_AddNumberToObject(o, "num_blocks", c->num_blocks);
    cJSON_AddNumberToObject(o, "gpu_memory_utilization", c->gpu_memory_utilization);
    cJSON_AddBoolToObject(o, "enable_prefix_caching", c->enable_prefix_caching);
    return o;
}

static int write_json(const bench_t *b, const char *path, int argc, char **argv) {
    char date[32];
    time_t t = time(NULL);
    struct tm tm;
    strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", gmtime_r(&t, &tm));
    char *cmdline = command_line(argc, argv);
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "command", cmdline ? cmdline : "");
    cJSON_AddStringToObject(o, "date", date);
    cJSON_AddNumberToObject(o, "host_cpus", (double)cpus);
    cJSON_AddNumberToObject(o, "requests", (double)b->num_seqs);
    cJSON_AddNumberToObject(o, "prompt_tokens", (double)b->prompt_tokens);
    cJSON_AddNumberToObject(o, "output_tokens", (double)b->output_tokens);
    cJSON_AddNumberToObject(o, "load_s", b->load_s);
    cJSON_AddNumberToObject(o, "generate_s", b->generate_s);
    cJSON_AddNumberToObject(o, "output_tok_s", per_s(b->output_tokens, b->generate_s));
    cJSON_AddNumberToObject(o, "total_tok_s", per_s(b->prompt_tokens + b->output_tokens, b->generate_s));
    cJSON_AddStringToObject(o, "device", b->ec.device == RUNNER_DEVICE_CUDA ? "cuda" : "cpu");
    cJSON_AddNumberToObject(o, "threads", b->threads);
    cJSON_AddStringToObject(o, "model_dir", b->ec.model_dir);
    cJSON_AddBoolToObject(o, "random_weights", b->ec.random_weights);
    cJSON_AddNumberToObject(o, "min_len", (double)b->min_len);
    cJSON_AddNumberToObject(o, "max_len", (double)b->max_len);
    // null: drawn from [min_len, max_len]
    if (b->prompt_len) cJSON_AddNumberToObject(o, "prompt_len", (double)b->prompt_len);
    else cJSON_AddNullToObject(o, "prompt_len");
    if (b->output_len) cJSON_AddNumberToObject(o, "output_len", (double)b->output_len);
    else cJSON_AddNullToObject(o, "output_len");
    cJSON_AddNumberToObject(o, "seed", (double)b->seed);
    cJSON_AddNumberToObject(o, "temperature", 0);
    cJSON_AddBoolToObject(o, "ignore_eos", 1);
    cJSON_AddNumberToObject(o, "steps", (double)b->steps);
    cJSON_AddNumberToObject(o, "preemptions", (double)b->preemptions);
    cJSON_AddNumberToObject(o, "weight_bytes", (double)b->weight_bytes);
    cJSON_AddNumberToObject(o, "kv_cache_bytes", (double)b->kv_cache_bytes);
    cJSON_AddNumberToObject(o, "scratch_bytes", (double)b->scratch_bytes);
    cJSON_AddItemToObject(o, "config", config_json(&b->model, &b->ec));
    char *s = cJSON_Print(o);
    cJSON_Delete(o);
    free(cmdline);
    if (!s) return mv_error("out of memory");
    FILE *f = fopen(path, "w");
    int rc = f ? 0 : mv_error("cannot open %s: %s", path, strerror(errno));
    if (!rc && fprintf(f, "%s\n", s) < 0) rc = mv_error("cannot write %s: %s", path, strerror(errno));
    if (f && fclose(f) && !rc) rc = mv_error("cannot write %s: %s", path, strerror(errno));
    free(s);
    return rc;
}

int cmd_bench(int argc, char **argv) {
    bench_args_t a = {0};
    const cli_opt_t own[] = {
        {"--model", "DIR", "Hugging Face model directory (only config.json with --random-weights)", &a.model, NULL},
        {"--random-weights", NULL, "seeded random weights from config.json's shapes (no weights file)", NULL,
         &a.random_weights},
        {"--num-seqs", "N", "requests (default 256)", &a.num_seqs, NULL},
        {"--min-len", "N", "shortest prompt and output, >= 1 (default 100)", &a.min_len, NULL},
        {"--max-len", "N", "longest prompt and output; 2 x N <= max_model_len (default 1024)", &a.max_len, NULL},
        {"--prompt-len", "N", "every prompt N tokens (instead of drawn from [min-len, max-len])", &a.prompt_len, NULL},
        {"--output-len", "N", "every request generates N tokens (instead of drawn)", &a.output_len, NULL},
        {"--seed", "S", "draws the lengths, the prompt ids and random weights (default 0)", &a.seed, NULL},
        {"--json", "FILE", "also write the results, command line, date and host as JSON", &a.json, NULL},
    };
    enum { N_OWN = sizeof own / sizeof *own };
    cli_opt_t opts[N_OWN + CLI_ENGINE_N_OPTS];
    memcpy(opts, own, sizeof own);
    int n_opts = N_OWN + cli_engine_opts(&a.eng, opts + N_OWN);
    int st = cli_parse("bench", BENCH_USAGE, opts, n_opts, argc, argv);
    if (st == CLI_HELP) return CLI_OK;
    if (st != CLI_OK) return st;
    if (!a.model) return cli_error("bench", CLI_USAGE, "--model DIR is required");
    bench_t b = {0};
    if ((st = bench_options(&a, &b))) return st;
    if (run(&b) || (a.json && write_json(&b, a.json, argc, argv)))
        return cli_error("bench", CLI_FAIL, "%s", mv_last_error());
    print_table(&b);
    return CLI_OK;
}

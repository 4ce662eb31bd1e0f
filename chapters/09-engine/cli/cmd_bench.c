/*
 * chapters/09-engine/cli/cmd_bench.c - `minivllm bench`: how fast the engine
 * is, offline (vLLM's benchmark_throughput and benchmark_latency in miniature).
 *
 *   minivllm bench --model DIR [--random-weights] [--num-seqs 256]
 *                  [--min-len 100] [--max-len 1024] [--prompt-len N] [--output-len N]
 *   minivllm bench --model DIR --input FILE.jsonl
 *   minivllm bench --model DIR --latency [--batch 1,8,64] [--prompt-len 512] [--output-len 256]
 *       and in every mode [--repeat 3] [--no-warmup] [--sampling greedy|qwen3|file]
 *       [--temperature T] [--top-k K] [--top-p P] [--seed 0] [--json FILE] [--step-trace FILE]
 *
 * Three workloads:
 *   drawn      num-seqs requests, each with a prompt length and an output
 *              length drawn uniformly from [min-len, max-len], and a prompt of
 *              random ids (uniform over the vocabulary, special and eos ids
 *              left out). --prompt-len N / --output-len N fix a length
 *              instead: single-stream decode is --num-seqs 1 --prompt-len 512
 *              --output-len 256.
 *   --input    the requests of a JSONL file, one a line, read as `generate
 *              --input` reads them (cli/requests.h) but ids only:
 *              "prompt_token_ids" and "max_tokens" are required, and
 *              "temperature", "top_k", "top_p", "seed", "ignore_eos" optional
 *              (a line without them is greedy, ignores eos, and is seeded
 *              --seed + its index). tests/bench/nanovllm_workload.py writes
 *              nano-vllm's own bench.py workload in this form.
 *   --latency  for each batch size B of --batch, B requests of --prompt-len
 *              random ids and --output-len tokens, run together: exactly B
 *              at a time (max_num_seqs is raised to B when not given, and the
 *              KV cache must hold all B whole), so nothing waits in a queue.
 * In the first two all the requests are submitted at once, as a batch job
 * would, and the engine batches them continuously.
 *
 * Sampling: greedy (temperature 0) unless a line says otherwise.
 * --sampling greedy makes every request greedy; --sampling qwen3 gives every
 * request the model's generation_config.json values (Qwen3's are temperature
 * 0.6, top_k 20, top_p 0.95); --sampling file (the default with --input)
 * keeps each line's. --temperature / --top-k / --top-p then override one value
 * for every request. Each request has its own seeded generator, so a sampled
 * run draws the same tokens every repetition.
 *
 * Why ignore_eos: a request must generate exactly its output length. If an
 * eos could stop it early, the work done would depend on what the model
 * happens to say (and with random weights, on noise), and two runs, or two
 * engines, would not be timing the same job. Drawn and latency requests
 * always ignore eos; a line may say "ignore_eos": false.
 *
 * How it is timed: the model loads once (engine_create, timed as load s),
 * then a warm-up (as nano-vllm's bench.py does one, so the first timed run
 * does not pay for first-use costs: CUDA's lazy module loading, cuBLAS's
 * workspace, the page faults of fresh buffers): the first request, its prompt
 * cut to 32 tokens, 16 tokens generated; in latency mode the batch itself,
 * 2 tokens each, once per batch size. Then --repeat N timed runs of
 * engine_generate on the same requests (each starts with an empty prefix
 * cache: the scheduler is new every call), with CLOCK_MONOTONIC.
 *
 * What the numbers mean:
 *   output tok/s = output tokens / generate s. The tokens a user waits for:
 *                  each costs one decode step's share of reading every weight
 *                  and the request's KV cache, so this is the decode-bound
 *                  figure vLLM's benchmarks lead with (and nano-vllm's
 *                  "Throughput").
 *   total tok/s  = (prompt + output tokens) / generate s. Prompt tokens are
 *                  processed many per step (prefill is compute-bound and
 *                  cheap per token), so total tok/s is always the larger one,
 *                  and it is the fair figure when prompts are long.
 *   TTFT         time to first token: from engine_generate's start (when
 *                every request arrives) until the request's first token is
 *                on the host. It holds the prefill of the request and of
 *                every request scheduled with or before it.
 *   TPOT         time per output token after the first:
 *                (finish - first token) / (output tokens - 1).
 * Each throughput figure is the median of the repetitions, with their min and
 * max; TTFT and TPOT are p50 and p99 over every request of every repetition
 * (linear interpolation between order statistics, numpy's default). The
 * start-up is reported apart: load s, warm-up s, and wall s (the whole
 * command from before the load to the end of the last repetition).
 *
 * --random-weights: no weights file, only config.json. The weights are drawn
 * from --seed as Hugging Face initialises a Qwen3 (qwen3_weights_random) and
 * go through the same binding and runner as a checkpoint: real shapes timed,
 * nonsense generated. Model runtime does not depend on the values (no early
 * exits, ignore_eos), so the times are those of the real model.
 *
 * Drawn requests are reproducible: request i's prompt and output lengths are
 * draws 2i and 2i+1 of rng_int(min-len, max-len) from rng_seed(seed)
 * (common/rng.h); the prompt ids come from a second stream, rng_seed(seed +
 * 1), request after request. A fixed length replaces its draw (the draws are
 * still made, so fixing the output length leaves the prompt lengths and ids
 * as they were). Latency mode draws its prompts the same way.
 *
 * --json FILE: every figure, with the command line, the date, the commit
 * (MV_COMMIT, else `git rev-parse --short HEAD`, "-dirty" when the tree
 * differs from it, else "unknown"), the GPU (its name, from gpu_probe, on
 * --device cuda), the host and the engine's configuration. Its directory is
 * checked before anything loads, so a bad path costs nothing, and the file
 * is written whole or not at all (FILE.tmp-PID, renamed when complete).
 *
 * --step-trace FILE: one CSV line per step of every timed run (rep counts the
 * timed runs from 1, across --latency's batch sizes): its rows, prefill rows,
 * query tokens, context tokens (the keys its attention reads), sampled rows,
 * the microseconds inside the model runner (staging, the GPU's work and the
 * wait for it) and the engine's own host work. The file is opened before the
 * load (a bad path fails at once) and holds what finished if a run stops.
 *
 * A request that fails while timed (logits with no finite value) fails the
 * benchmark, naming it: the workload timed would not be the one asked for.
 * Generated ids the tokenizer does not know (padding rows, when DIR has a
 * tokenizer) are counted ("unknown_token_ids"), not failures.
 *
 * SIGINT / SIGTERM: the run stops between two steps; the repetitions that
 * had finished (latency: the batch sizes) are reported, and written to
 * --json with "interrupted": true; exit status 130 / 143.
 *
 * Exit status: 0; 1 (bad model files, a bad --input line, a failing run);
 * 2 (bad arguments, named); 130 / 143 (stopped by SIGINT / SIGTERM). Try it: ./build/minivllm bench --model
 * tests/data/tiny-qwen3-tied --latency --batch 1,4 --prompt-len 64 --output-len 32
 * Tests: tests/test_bench.c.
 */
#include <cjson/cJSON.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "chapters/09-engine/cli/cli.h"
#include "chapters/09-engine/cli/requests.h"
#include "chapters/09-engine/runtime/engine.h"
#include "common/check.h"
#include "common/gpu.h"
#include "common/rng.h"

static const char BENCH_USAGE[] =
    "usage: minivllm bench --model DIR [--random-weights] [--num-seqs N] [--min-len N] [--max-len N]\n"
    "                      [--prompt-len N] [--output-len N]\n"
    "       minivllm bench --model DIR --input FILE.jsonl\n"
    "       minivllm bench --model DIR --latency [--batch 1,8,64] [--prompt-len 512] [--output-len 256]\n"
    "         in every mode: [--repeat N] [--no-warmup] [--sampling greedy|qwen3|file] [--temperature T]\n"
    "                        [--top-k K] [--top-p P] [--seed S] [--json FILE] [--step-trace FILE]\n"
    "                        [--device cpu|cuda] [engine sizes...]\n"
    "\n"
    "Time the engine. By default on N requests whose prompt and output lengths are drawn uniformly\n"
    "from [--min-len, --max-len] (or fixed by --prompt-len / --output-len), with random prompt ids,\n"
    "greedy sampling (temperature 0) and ignore_eos (every request generates exactly its length).\n"
    "--input FILE.jsonl: the requests of a file instead, one JSON object a line with \"prompt_token_ids\"\n"
    "and \"max_tokens\", and optionally \"temperature\", \"top_k\", \"top_p\", \"seed\", \"ignore_eos\"\n"
    "(tests/bench/nanovllm_workload.py writes nano-vllm's benchmark workload so).\n"
    "--latency: for each batch size of --batch, that many requests at once; time to first token\n"
    "(TTFT) and time per output token (TPOT), p50 and p99.\n"
    "After one warm-up, --repeat runs are timed (default 3): output tok/s and total tok/s (prompt +\n"
    "output) as median, min and max; load, warm-up and wall seconds apart. --sampling qwen3 samples\n"
    "with generation_config.json's values (Qwen3: temperature 0.6, top_k 20, top_p 0.95).\n"
    "--json FILE writes every figure with the command line, commit, date, GPU and host.\n"
    "--step-trace FILE writes one CSV line per timed step (rep,step,rows,prefill_rows,tokens,\n"
    "context_tokens,sampled,runner_us,host_us): where each step's time went.\n"
    "--random-weights draws the weights from --seed instead of reading them: DIR then needs only\n"
    "config.json.";

enum { BENCH_MAX_BATCHES = 16 };

typedef struct {
    const char *model, *num_seqs, *min_len, *max_len, *prompt_len, *output_len, *seed, *json;
    const char *input, *repeat, *sampling, *temperature, *top_k, *top_p, *batch, *step_trace;
    cli_engine_args_t eng;
    int random_weights, latency, no_warmup;
} bench_args_t;

// One timed engine_generate.
typedef struct {
    double generate_s;
    double host_s, runner_s;  // the engine's own host work / inside the runner's steps (engine.h)
    long long steps_ahead;    // steps planned ahead (asynchronous scheduling)
    long long prompt_tokens, output_tokens, steps, preemptions;
    long long unknown_tokens;  // generated ids the tokenizer does not know (0 without a tokenizer)
} bench_rep_t;

// One workload, timed --repeat times: the throughput run, or one batch size of --latency.
typedef struct {
    int n;                 // requests per run (the batch size in latency mode)
    bench_rep_t *reps;     // [repeat]
    double *ttft_s;        // [repeat * n] every request's time to first token
    double *tpot_s;        // [repeat * n] time per output token, of requests with >= 2 tokens
    int n_ttft, n_tpot;
} bench_group_t;

typedef enum { WORK_DRAWN, WORK_INPUT, WORK_LATENCY } bench_work_t;

typedef struct {
    bench_work_t work;
    long num_seqs, min_len, max_len, seed, repeat;
    long prompt_len, output_len;  // 0: drawn from [min_len, max_len]; else every request's length
    int batches[BENCH_MAX_BATCHES], n_batches;  // latency mode
    int warmup;
    // Sampling: the base (--sampling), then the single overrides.
    const char *sampling;         // "greedy", "qwen3" or "file"
    int set_temperature, set_top_k, set_top_p;
    float temperature, top_p;
    long top_k;
    const char *input;
    cli_requests_t rq;            // --input's requests
    engine_config_t ec;           // resolved (engine_config_resolve), then what the engine resolved
    qwen3_config_t model;
    int threads;                  // CPU threads the runner uses
    double t_start, load_s, warmup_s, wall_s;
    size_t weight_bytes, kv_cache_bytes, scratch_bytes;  // what the runner placed on its device
    int num_graphs;               // cuda: decode CUDA graphs captured (0: --enforce-eager)
    double graph_s;               // their capture time, inside load_s
    size_t graph_bytes;           // their GPU memory
    long long graph_early_edges;  // their programmatic edges on the launch-completion port (MV_PDL_EARLY)
    int megakernel_rows;          // cuda: decode steps of 1 .. this many rows run the decode megakernel (0: none)
    int async_scheduling;         // 1: asynchronous scheduling in effect (asked for, and the runner has it)
    int halves_rows, halves_max_rows;  // cuda: decode steps of these many rows run as two halves at once (0: never)
    char megakernel_why[160];     // and why not beyond
    gpu_info_t gpu;               // probed on --device cuda
    bench_group_t groups[BENCH_MAX_BATCHES];  // 1 in throughput mode
    int n_groups;
    // The requests' sampling, as the table and the JSON describe it.
    int uniform_sampling;         // every request samples alike (params of request 0)
    sampling_params_t sample0;
    int ignore_eos;               // 1 all, 0 none, -1 mixed
    int stopped;                  // 1: a signal stopped it; repeat / n_groups then count what finished
    int has_tokenizer;            // DIR has one: unknown ids are counted
    FILE *step_trace;             // --step-trace: every timed step, as CSV (engine_t.step_trace)
    int traced_runs;              // timed runs written to it so far
} bench_t;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

// ---- options ------------------------------------------------------------------------------

// "1,8,64": at most BENCH_MAX_BATCHES sizes, each in [1, 65536].
static int parse_batches(const char *v, bench_t *b) {
    const char *p = v;
    b->n_batches = 0;
    while (1) {
        char *end;
        errno = 0;
        long x = strtol(p, &end, 10);
        if (end == p || errno || x < 1 || x > 65536 || (*end && *end != ',') || b->n_batches == BENCH_MAX_BATCHES)
            return cli_error("bench", CLI_USAGE,
                             "--batch '%s' is not a list of batch sizes in [1, 65536] such as 1,8,64 (at most %d)", v,
                             BENCH_MAX_BATCHES);
        b->batches[b->n_batches++] = (int)x;
        if (!*end) return CLI_OK;
        p = end + 1;
    }
}

// Options that belong to another mode are refused by name, not ignored.
static int refuse(const char *opt, const char *v, const char *why) {
    return v ? cli_error("bench", CLI_USAGE, "%s: %s", opt, why) : CLI_OK;
}

static int mode_options(const bench_args_t *a, bench_t *b) {
    if (a->input && a->latency) return cli_error("bench", CLI_USAGE, "--input and --latency: choose one");
    const char *drawn_only = a->input ? "the requests come from --input" : "--latency runs --batch requests of "
                                                                           "--prompt-len + --output-len tokens";
    if (a->input || a->latency) {
        int st = refuse("--num-seqs", a->num_seqs, drawn_only);
        if (!st) st = refuse("--min-len", a->min_len, drawn_only);
        if (!st) st = refuse("--max-len", a->max_len, drawn_only);
        if (!st && a->input) st = refuse("--prompt-len", a->prompt_len, drawn_only);
        if (!st && a->input) st = refuse("--output-len", a->output_len, drawn_only);
        if (st) return st;
    }
    if (!a->latency && a->batch) return cli_error("bench", CLI_USAGE, "--batch goes with --latency");
    b->work = a->input ? WORK_INPUT : a->latency ? WORK_LATENCY : WORK_DRAWN;
    b->input = a->input;
    if (b->work == WORK_LATENCY) {
        b->prompt_len = 512, b->output_len = 256;
        int st = parse_batches(a->batch ? a->batch : "1,8,64", b);
        if (st) return st;
    }
    b->sampling = a->sampling ? a->sampling : a->input ? "file" : "greedy";
    if (strcmp(b->sampling, "greedy") && strcmp(b->sampling, "qwen3") && strcmp(b->sampling, "file"))
        return cli_error("bench", CLI_USAGE, "--sampling '%s' is not greedy, qwen3 or file", b->sampling);
    if (!strcmp(b->sampling, "file") && !a->input)
        return cli_error("bench", CLI_USAGE, "--sampling file: only --input has lines to take sampling from");
    return CLI_OK;
}

static int sampling_overrides(const bench_args_t *a, bench_t *b) {
    const char *cmd = "bench";
    b->set_temperature = a->temperature != NULL, b->set_top_k = a->top_k != NULL, b->set_top_p = a->top_p != NULL;
    if (cli_parse_float(cmd, "--temperature", a->temperature, 0, 1e6, 0, &b->temperature) ||
        cli_parse_long(cmd, "--top-k", a->top_k, 0, INT_MAX, &b->top_k) ||
        cli_parse_float(cmd, "--top-p", a->top_p, 0, 1, 1, &b->top_p))
        return CLI_USAGE;
    return CLI_OK;
}

// The longest request (prompt + output) must fit max_model_len.
static int check_lengths(const bench_t *b) {
    if (b->work == WORK_INPUT) return CLI_OK;  // checked line by line (check_input)
    long max_prompt = b->prompt_len ? b->prompt_len : b->max_len;
    long max_output = b->output_len ? b->output_len : b->max_len;
    if (max_prompt + max_output <= b->ec.max_model_len) return CLI_OK;
    char opts[96];
    snprintf(opts, sizeof opts, "%s%s", b->prompt_len ? "--prompt-len" : "--max-len",
             b->output_len ? (b->prompt_len ? " and --output-len" : " or --output-len")
                           : (b->prompt_len ? " or --max-len" : ""));
    return cli_error("bench", CLI_USAGE,
                     "%s %ld: a prompt of %ld tokens plus %ld generated needs a max_model_len of %ld, and it "
                     "is %d (lower %s, or raise --max-model-len up to max_position_embeddings %d)",
                     b->prompt_len ? "--prompt-len" : "--max-len", max_prompt, max_prompt, max_output,
                     max_prompt + max_output, b->ec.max_model_len, opts, b->model.max_position_embeddings);
}

// Latency mode runs each batch whole: max_num_seqs >= the largest batch (raised when not given).
static int latency_config(const bench_args_t *a, bench_t *b) {
    int bmax = 0;
    for (int k = 0; k < b->n_batches; k++) bmax = b->batches[k] > bmax ? b->batches[k] : bmax;
    engine_config_t probe = b->ec;
    if (engine_config_resolve(&probe, &b->model)) return cli_error("bench", CLI_FAIL, "%s", mv_last_error());
    if (probe.max_num_seqs >= bmax) return CLI_OK;
    if (a->eng.max_num_seqs)
        return cli_error("bench", CLI_USAGE,
                         "--batch %d runs %d requests at once, and --max-num-seqs %d allows fewer (raise it or "
                         "leave it out)",
                         bmax, bmax, probe.max_num_seqs);
    b->ec.max_num_seqs = bmax;
    return CLI_OK;
}

// Numbers, then the lengths against the model and the engine, all before loading.
static int bench_options(const bench_args_t *a, bench_t *b) {
    const char *cmd = "bench";
    b->num_seqs = 256, b->min_len = 100, b->max_len = 1024, b->seed = 0, b->repeat = 3;
    int st = mode_options(a, b);
    if (st) return st;
    if (cli_parse_long(cmd, "--num-seqs", a->num_seqs, 1, 1 << 20, &b->num_seqs) ||
        cli_parse_long(cmd, "--min-len", a->min_len, 1, 1 << 24, &b->min_len) ||
        cli_parse_long(cmd, "--max-len", a->max_len, 1, 1 << 24, &b->max_len) ||
        cli_parse_long(cmd, "--prompt-len", a->prompt_len, 1, 1 << 24, &b->prompt_len) ||
        cli_parse_long(cmd, "--output-len", a->output_len, 1, 1 << 24, &b->output_len) ||
        cli_parse_long(cmd, "--seed", a->seed, 0, LONG_MAX - 1, &b->seed) ||
        cli_parse_long(cmd, "--repeat", a->repeat, 1, 1000, &b->repeat))
        return CLI_USAGE;
    if ((st = sampling_overrides(a, b))) return st;
    if (b->min_len > b->max_len)
        return cli_error(cmd, CLI_USAGE, "--min-len %ld is greater than --max-len %ld", b->min_len, b->max_len);
    b->warmup = !a->no_warmup;
    b->ec = engine_config_default(a->model);
    if ((st = cli_engine_config(cmd, &a->eng, &b->ec))) return st;
    b->ec.random_weights = a->random_weights;
    b->ec.weights_seed = (uint64_t)b->seed;
    b->ec.progress = isatty(STDERR_FILENO);
    if (qwen3_config_load(a->model, &b->model)) return cli_error(cmd, CLI_FAIL, "%s", mv_last_error());
    if (b->work == WORK_LATENCY && (st = latency_config(a, b))) return st;
    if (engine_config_resolve(&b->ec, &b->model)) return cli_error(cmd, CLI_FAIL, "%s", mv_last_error());
    if ((st = check_lengths(b))) return st;
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    b->threads = b->ec.num_threads ? b->ec.num_threads : (int)(cpus > 0 ? cpus : 1);
    return CLI_OK;
}

// ---- the requests -------------------------------------------------------------------------

// --input's lines, checked against the model before it loads: ids in the
// vocabulary, and every request must fit max_model_len whole (the engine
// would stop it short there, and the file's workload would not be the one timed).
static int read_input(bench_t *b) {
    cli_requests_t *rq = &b->rq;
    rq->model_dir = b->ec.model_dir;
    rq->text_refused = "bench times token ids: give \"prompt_token_ids\"";
    rq->vocab_size = b->model.vocab_size;
    rq->need_max_tokens = 1;
    rq->defaults = (sampling_params_t){.temperature = 0.0f, .top_k = 0, .top_p = 1.0f, .max_tokens = 16, .ignore_eos = 1};  // greedy, ignore_eos
    rq->base_seed = (uint64_t)b->seed;
    if (cli_requests_read(rq, b->input)) return -1;
    if (rq->n == 0) return mv_error("%s: no requests in it (it is empty, or every line is blank)", b->input);
    for (int i = 0; i < rq->n; i++) {
        const cli_request_t *r = &rq->reqs[i];
        long need = (long)r->prompt.len + r->params.max_tokens;
        if (need > b->ec.max_model_len)
            return mv_error("%s:%ld: a prompt of %zu tokens plus \"max_tokens\" %d needs a max_model_len of %ld, and "
                            "it is %d (raise --max-model-len, up to max_position_embeddings %d)",
                            b->input, r->line_no, r->prompt.len, r->params.max_tokens, need, b->ec.max_model_len,
                            b->model.max_position_embeddings);
    }
    return 0;
}

static int is_excluded(const engine_t *e, int32_t id) {
    for (int k = 0; k < e->model.n_eos; k++)
        if (id == e->model.eos_token_ids[k]) return 1;
    if (id == e->model.bos_token_id) return 1;
    return e->tokenizer && tokenizer_is_special(e->tokenizer, id);
}

// n drawn requests (see the header for how). ids: [sum of prompt lengths].
static int draw_requests(const bench_t *b, const engine_t *e, int n, engine_request_t *reqs, int32_t **ids_out) {
    rng_t len_rng, id_rng;
    rng_seed(&len_rng, (uint64_t)b->seed);
    rng_seed(&id_rng, (uint64_t)b->seed + 1);
    size_t total = 0;
    for (int i = 0; i < n; i++) {
        int prompt_len = rng_int(&len_rng, (int)b->min_len, (int)b->max_len);
        int output_len = rng_int(&len_rng, (int)b->min_len, (int)b->max_len);
        reqs[i].num_prompt = b->prompt_len ? (int)b->prompt_len : prompt_len;
        reqs[i].params = (sampling_params_t){.temperature = 0.0f, .top_k = 0, .top_p = 1.0f, .max_tokens = b->output_len ? (int)b->output_len : output_len, .ignore_eos = 1};
        reqs[i].seed = (uint64_t)b->seed + (uint64_t)i;
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

// --sampling, then --temperature / --top-k / --top-p, over every request.
static void apply_sampling(const bench_t *b, engine_request_t *reqs, int n) {
    for (int i = 0; i < n; i++) {
        sampling_params_t *p = &reqs[i].params;
        if (!strcmp(b->sampling, "greedy")) p->temperature = 0, p->top_k = 0, p->top_p = 1;
        if (!strcmp(b->sampling, "qwen3"))
            p->temperature = b->model.temperature, p->top_k = b->model.top_k, p->top_p = b->model.top_p;
        if (b->set_temperature) p->temperature = b->temperature;
        if (b->set_top_k) p->top_k = (int)b->top_k;
        if (b->set_top_p) p->top_p = b->top_p;
    }
}

// What the table and the JSON say about the requests' sampling.
static void describe_sampling(bench_t *b, const engine_request_t *reqs, int n) {
    b->sample0 = reqs[0].params;
    b->uniform_sampling = 1;
    int eos_on = 0;
    for (int i = 0; i < n; i++) {
        const sampling_params_t *p = &reqs[i].params;
        if (p->temperature != b->sample0.temperature || p->top_k != b->sample0.top_k || p->top_p != b->sample0.top_p)
            b->uniform_sampling = 0;
        eos_on += p->ignore_eos;
    }
    b->ignore_eos = eos_on == n ? 1 : eos_on == 0 ? 0 : -1;
}

// ---- timing -------------------------------------------------------------------------------

// An untimed run of reqs[0..n), prompts cut to prompt_cap tokens and outputs to max_tokens.
static int warm_up(engine_t *e, const engine_request_t *reqs, int n, int prompt_cap, int max_tokens, double *s) {
    engine_request_t *w = calloc((size_t)n, sizeof *w);
    engine_output_t *outs = calloc((size_t)n, sizeof *outs);
    int rc = w && outs ? 0 : mv_error("out of memory");
    for (int i = 0; !rc && i < n; i++) {
        w[i] = reqs[i];
        if (w[i].num_prompt > prompt_cap) w[i].num_prompt = prompt_cap;
        if (w[i].params.max_tokens > max_tokens) w[i].params.max_tokens = max_tokens;
        w[i].params.ignore_eos = 1;
    }
    double t0 = now_s();
    const engine_hooks_t hooks = {.stop = &cli_stop_signal};
    if (!rc) {
        rc = engine_run(e, w, n, outs, &hooks);
        if (rc < 0) mv_error_prefix("warm-up");
    }
    *s += now_s() - t0;
    if (rc >= 0) engine_outputs_free(outs, n);
    free(outs);
    free(w);
    return rc;
}

// The first request that failed alone: a failure of the benchmark (-1).
static int failed_request(const engine_t *e, const engine_output_t *outs, int n) {
    for (int i = 0; i < n; i++)
        if (outs[i].error) {
            mv_error("%s (a benchmark times every request to its end)", outs[i].error);
            return i;
        }
    return -1;
}

// --repeat timed runs of reqs[0..n), into g; *reps_done of them finished.
// ENGINE_STOPPED when a signal stopped a repetition (it is not counted).
static int time_group(const bench_t *b, engine_t *e, const engine_request_t *reqs, int n, bench_group_t *g,
                      int *reps_done) {
    const int R = (int)b->repeat;
    g->n = n;
    g->reps = calloc((size_t)R, sizeof *g->reps);
    g->ttft_s = malloc((size_t)R * (size_t)n * sizeof *g->ttft_s);
    g->tpot_s = malloc((size_t)R * (size_t)n * sizeof *g->tpot_s);
    engine_output_t *outs = calloc((size_t)n, sizeof *outs);
    int rc = g->reps && g->ttft_s && g->tpot_s && outs ? 0 : mv_error("out of memory");
    const engine_hooks_t hooks = {.stop = &cli_stop_signal};
    *reps_done = 0;
    for (int r = 0; !rc && r < R; r++) {
        e->step_trace = b->step_trace;
        e->step_trace_rep = b->step_trace ? ++((bench_t *)b)->traced_runs : 0;
        double t0 = now_s();
        rc = engine_run(e, reqs, n, outs, &hooks);
        double dt = now_s() - t0;
        e->step_trace = NULL;
        if (rc == ENGINE_STOPPED) engine_outputs_free(outs, n);
        if (rc) break;
        int bad = failed_request(e, outs, n);
        if (bad >= 0) {
            e->failed_request = bad;
            engine_outputs_free(outs, n);
            rc = -1;
            break;
        }
        bench_rep_t *rep = &g->reps[r];
        rep->unknown_tokens = e->num_unknown_tokens;
        rep->generate_s = dt;
        rep->steps = e->num_steps;
        rep->preemptions = e->num_preemptions;
        rep->host_s = e->host_s;
        rep->runner_s = e->runner_s;
        rep->steps_ahead = e->num_steps_ahead;
        for (int i = 0; i < n; i++) {
            rep->prompt_tokens += reqs[i].num_prompt;
            rep->output_tokens += outs[i].num_tokens;
            g->ttft_s[g->n_ttft++] = outs[i].first_token_s;
            if (outs[i].num_tokens >= 2)
                g->tpot_s[g->n_tpot++] = (outs[i].finish_s - outs[i].first_token_s) / (outs[i].num_tokens - 1);
        }
        engine_outputs_free(outs, n);
        *reps_done = r + 1;
        if (b->ec.progress)
            fprintf(stderr, "minivllm bench: %d requests, repetition %d/%d: %.3f s\n", n, r + 1, R, dt);
    }
    free(outs);
    return rc;
}

// The failing request of a run, by its line or its index.
static int name_failed_request(const bench_t *b, const engine_t *e) {
    if (e->failed_request < 0) return -1;
    if (b->work != WORK_INPUT) return mv_error_prefix("request %d", e->failed_request);
    // cli_requests_where names the line as "path:line".
    char where[512];
    cli_requests_where(&b->rq, e->failed_request, where, sizeof where);
    return mv_error_prefix("%s", where);
}

// Every batch of latency mode must fit the KV cache whole, or requests would wait (or be preempted).
static int check_latency_cache(const bench_t *b, const engine_t *e) {
    const int bs = e->cfg.block_size;
    const long per_seq = (b->prompt_len + b->output_len + bs - 1) / bs;
    for (int k = 0; k < b->n_batches; k++)
        if ((long)b->batches[k] * per_seq > e->cfg.num_blocks)
            return mv_error("--batch %d: %d sequences of %ld + %ld tokens need %ld KV blocks of %d tokens, and the "
                            "cache has %d (raise --kv-cache-gib or --num-blocks, or lower --batch)",
                            b->batches[k], b->batches[k], b->prompt_len, b->output_len, b->batches[k] * per_seq, bs,
                            e->cfg.num_blocks);
    return 0;
}

// Load, warm up, time every group.
static int run(bench_t *b) {
    if (b->ec.progress) fprintf(stderr, "minivllm bench: loading %s%s\n", b->ec.model_dir,
                                b->ec.random_weights ? " (random weights)" : "");
    engine_t *e = NULL;
    double t0 = now_s();
    if (engine_create(&b->ec, &e)) return -1;
    b->load_s = now_s() - t0;
    b->has_tokenizer = e->tokenizer != NULL;
    b->ec = e->cfg;  // what the engine resolved (the cuda runner sizes the cache)
    b->weight_bytes = e->runner->weight_bytes;
    b->kv_cache_bytes = e->runner->kv_cache_bytes;
    b->scratch_bytes = e->runner->scratch_bytes;
    b->num_graphs = e->runner->num_graphs;
    b->graph_s = e->runner->graph_seconds;
    b->graph_bytes = e->runner->graph_bytes;
    b->graph_early_edges = e->runner->graph_early_edges;
    b->megakernel_rows = e->runner->megakernel_rows;
    b->halves_rows = e->runner->halves_rows;
    b->halves_max_rows = e->runner->halves_max_rows;
    b->async_scheduling = !b->ec.no_async_scheduling && model_runner_can_launch(e->runner);
    snprintf(b->megakernel_why, sizeof b->megakernel_why, "%s", e->runner->megakernel_why);
    if (b->ec.device == RUNNER_DEVICE_CUDA) gpu_probe(&b->gpu, 0);
    int rc = b->work == WORK_LATENCY ? check_latency_cache(b, e) : 0;
    b->n_groups = b->work == WORK_LATENCY ? b->n_batches : 1;
    cli_catch_stop_signals();
    for (int k = 0; !rc && k < b->n_groups; k++) {
        int n = b->work == WORK_LATENCY ? b->batches[k] : b->work == WORK_INPUT ? b->rq.n : (int)b->num_seqs;
        engine_request_t *reqs = b->work == WORK_INPUT ? cli_requests_to_engine(&b->rq) : calloc((size_t)n, sizeof *reqs);
        int32_t *ids = NULL;
        rc = reqs ? 0 : mv_error("out of memory");
        if (!rc && b->work != WORK_INPUT) rc = draw_requests(b, e, n, reqs, &ids);
        if (!rc) {
            apply_sampling(b, reqs, n);
            describe_sampling(b, reqs, n);
        }
        if (!rc && b->ec.progress)
            fprintf(stderr, "minivllm bench: loaded in %.2f s; %d requests, %ld repetitions\n", b->load_s, n, b->repeat);
        // Throughput: one short request, as nano-vllm's bench.py; latency: the batch itself, 2 tokens each.
        if (!rc && b->warmup)
            rc = b->work == WORK_LATENCY ? warm_up(e, reqs, n, INT_MAX, 2, &b->warmup_s)
                                         : warm_up(e, reqs, 1, 32, 16, &b->warmup_s);
        int reps_done = 0;
        if (!rc) rc = time_group(b, e, reqs, n, &b->groups[k], &reps_done);
        if (rc < 0) name_failed_request(b, e);
        if (rc == ENGINE_STOPPED) {
            // Keep what finished: throughput its repetitions, latency its whole batch sizes.
            b->stopped = 1;
            if (b->work == WORK_LATENCY) b->n_groups = k;
            else b->repeat = reps_done;
        }
        free(ids);
        free(reqs);
    }
    if (rc == ENGINE_STOPPED) rc = 0;
    b->wall_s = now_s() - b->t_start;
    engine_free(e);
    return rc;
}

// ---- summaries ----------------------------------------------------------------------------

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

// The q-quantile of x[0..n) (sorted in place), linear between order statistics (numpy's default).
static double quantile(double *x, int n, double q) {
    if (n == 0) return NAN;
    qsort(x, (size_t)n, sizeof *x, cmp_double);
    double pos = q * (n - 1);
    int lo = (int)floor(pos), hi = lo + 1 < n ? lo + 1 : lo;
    return x[lo] + (x[hi] - x[lo]) * (pos - lo);
}

typedef struct {
    double median, min, max;
} spread_t;

typedef enum { REP_GENERATE_S, REP_OUTPUT_TOK_S, REP_TOTAL_TOK_S } rep_figure_t;

static double rep_figure(const bench_rep_t *r, rep_figure_t f) {
    double s = r->generate_s > 0 ? r->generate_s : 1e-300;
    return f == REP_GENERATE_S ? r->generate_s
           : f == REP_OUTPUT_TOK_S ? (double)r->output_tokens / s
                                   : (double)(r->prompt_tokens + r->output_tokens) / s;
}

static spread_t rep_spread(const bench_t *b, const bench_group_t *g, rep_figure_t f) {
    double x[1000];
    const int R = (int)b->repeat;
    for (int r = 0; r < R; r++) x[r] = rep_figure(&g->reps[r], f);
    spread_t s;
    s.median = quantile(x, R, 0.5);
    s.min = x[0];
    s.max = x[R - 1];
    return s;
}

typedef struct {
    double p50, p99, min, max, mean;
    int n;
} pct_t;

// Milliseconds: p50, p99, min, max and mean of x_s[0..n) seconds.
static pct_t percentiles_ms(const double *x_s, int n) {
    pct_t p = {NAN, NAN, NAN, NAN, NAN, n};
    if (n == 0) return p;
    double *x = malloc((size_t)n * sizeof *x);
    if (!x) return p;
    double sum = 0;
    for (int i = 0; i < n; i++) sum += (x[i] = 1e3 * x_s[i]);
    p.p50 = quantile(x, n, 0.5);
    p.p99 = quantile(x, n, 0.99);
    p.min = x[0], p.max = x[n - 1], p.mean = sum / n;
    free(x);
    return p;
}

static void sampling_text(const bench_t *b, char *buf, size_t cap) {
    const sampling_params_t *p = &b->sample0;
    if (!b->uniform_sampling) snprintf(buf, cap, "sampling per line");
    else if (p->temperature == 0) snprintf(buf, cap, "greedy (temperature 0)");
    else snprintf(buf, cap, "temperature %g, top_k %d, top_p %g", p->temperature, p->top_k, p->top_p);
    size_t n = strlen(buf);
    snprintf(buf + n, cap - n, ", %s", b->ignore_eos == 1 ? "ignore_eos" : b->ignore_eos == 0 ? "stops at eos"
                                                                                              : "ignore_eos per line");
}

static void config_summary(const qwen3_config_t *m, char *buf, size_t cap) {
    snprintf(buf, cap, "%s: %d layers, hidden %d, %d q / %d kv heads x %d, intermediate %d, vocab %d, %s lm_head",
             m->architecture, m->num_hidden_layers, m->hidden_size, m->num_attention_heads, m->num_key_value_heads,
             m->head_dim, m->intermediate_size, m->vocab_size, m->tie_word_embeddings ? "tied" : "untied");
}

// ---- the table ----------------------------------------------------------------------------

static void print_workload(const bench_t *b) {
    char lens[192], range[48], samp[96];
    sampling_text(b, samp, sizeof samp);
    snprintf(range, sizeof range, "uniform in [%ld, %ld]", b->min_len, b->max_len);
    if (b->work == WORK_INPUT) snprintf(lens, sizeof lens, "from %s", b->input);
    else if (!b->prompt_len && !b->output_len) snprintf(lens, sizeof lens, "prompt and output lengths %s", range);
    else if (b->prompt_len && b->output_len)
        snprintf(lens, sizeof lens, "prompts of %ld tokens, outputs of %ld", b->prompt_len, b->output_len);
    else if (b->prompt_len) snprintf(lens, sizeof lens, "prompts of %ld tokens, output lengths %s", b->prompt_len, range);
    else snprintf(lens, sizeof lens, "prompt lengths %s, outputs of %ld tokens", range, b->output_len);
    if (b->work == WORK_LATENCY)
        printf("minivllm bench --latency: %s, seed %ld,\n", lens, b->seed);
    else
        printf("minivllm bench: %d requests, %s, seed %ld,\n", b->groups[0].n, lens, b->seed);
    printf("%s; %ld repetition%s after %s\n", samp, b->repeat, b->repeat == 1 ? "" : "s",
           b->warmup ? "a warm-up" : "no warm-up");
}

static void print_engine(const bench_t *b) {
    char cfg[256];
    config_summary(&b->model, cfg, sizeof cfg);
    const engine_config_t *c = &b->ec;
    printf("  %-16s %.3f\n", "load s", b->load_s);
    printf("  %-16s %.3f\n", "warm-up s", b->warmup_s);
    printf("  %-16s %.3f (load, warm-up and every repetition)\n", "wall s", b->wall_s);
    printf("  %-16s %s%s%s\n", "device", c->device == RUNNER_DEVICE_CUDA ? "cuda" : "cpu",
           b->gpu.available ? ", " : "", b->gpu.available ? b->gpu.name : "");
    printf("  %-16s %d\n", "threads", b->threads);
    printf("  %-16s %s%s\n", "model", c->model_dir, c->random_weights ? " (random weights)" : "");
    printf("  %-16s %s\n", "config", cfg);
    printf("  %-16s max_model_len %d, max_num_seqs %d, max_num_batched_tokens %d, %d blocks of %d\n", "engine",
           c->max_model_len, c->max_num_seqs, c->max_num_batched_tokens, c->num_blocks, c->block_size);
    printf("  %-16s weights %zu, KV cache %zu, scratch %zu\n", "bytes", b->weight_bytes, b->kv_cache_bytes,
           b->scratch_bytes);
    if (c->device == RUNNER_DEVICE_CUDA)
        printf("  %-16s %d decode sizes captured in %.2f s, %zu bytes%s; %lld edges early\n", "cuda graphs",
               b->num_graphs, b->graph_s, b->graph_bytes, b->num_graphs ? "" : " (--enforce-eager)",
               b->graph_early_edges);
    if (c->device == RUNNER_DEVICE_CUDA && b->num_graphs) {
        if (b->megakernel_rows)
            printf("  %-16s decode steps of 1 to %d rows%s%s\n", "megakernel", b->megakernel_rows,
                   b->megakernel_why[0] ? "; not " : "", b->megakernel_why);
        else
            printf("  %-16s off (%s)\n", "megakernel", b->megakernel_why);
    }
    if (c->device == RUNNER_DEVICE_CUDA && b->halves_rows)
        printf("  %-16s decode steps of %d to %d rows as two halves at once (MV_DECODE_HALVES)\n", "two halves",
               b->halves_rows, b->halves_max_rows);
}

static void print_throughput(const bench_t *b) {
    const bench_group_t *g = &b->groups[0];
    const bench_rep_t *r0 = &g->reps[0];
    spread_t gs = rep_spread(b, g, REP_GENERATE_S), os = rep_spread(b, g, REP_OUTPUT_TOK_S),
             ts = rep_spread(b, g, REP_TOTAL_TOK_S);
    pct_t ttft = percentiles_ms(g->ttft_s, g->n_ttft), tpot = percentiles_ms(g->tpot_s, g->n_tpot);
    print_workload(b);
    printf("  %-16s %d\n", "requests", g->n);
    printf("  %-16s %lld\n", "prompt tokens", r0->prompt_tokens);
    printf("  %-16s %lld\n", "output tokens", r0->output_tokens);
    printf("  %-16s %.3f (min %.3f, max %.3f)\n", "generate s", gs.median, gs.min, gs.max);
    printf("  %-16s %.1f (min %.1f, max %.1f)\n", "output tok/s", os.median, os.min, os.max);
    printf("  %-16s %.1f (min %.1f, max %.1f)\n", "total tok/s", ts.median, ts.min, ts.max);
    printf("  %-16s p50 %.2f, p99 %.2f\n", "TTFT ms", ttft.p50, ttft.p99);
    printf("  %-16s p50 %.3f, p99 %.3f\n", "TPOT ms", tpot.p50, tpot.p99);
    printf("  %-16s %lld steps (%lld planned ahead), %lld preemptions\n", "steps", r0->steps, r0->steps_ahead,
           r0->preemptions);
    if (b->has_tokenizer && r0->unknown_tokens)
        printf("  %-16s %lld generated ids the tokenizer does not know (padding rows: no text)\n", "unknown ids",
               r0->unknown_tokens);
    if (r0->steps > 0)
        printf("  %-16s host %.1f us, runner %.1f us (first repetition)\n", "per step",
               1e6 * r0->host_s / (double)r0->steps, 1e6 * r0->runner_s / (double)r0->steps);
    print_engine(b);
}

static void print_latency(const bench_t *b) {
    print_workload(b);
    printf("  %6s %9s %12s %12s %12s %12s %14s %s\n", "batch", "samples", "TTFT p50 ms", "TTFT p99 ms", "TPOT p50 ms",
           "TPOT p99 ms", "output tok/s", "(min, max)");
    for (int k = 0; k < b->n_groups; k++) {
        const bench_group_t *g = &b->groups[k];
        pct_t ttft = percentiles_ms(g->ttft_s, g->n_ttft), tpot = percentiles_ms(g->tpot_s, g->n_tpot);
        spread_t os = rep_spread(b, g, REP_OUTPUT_TOK_S);
        printf("  %6d %9d %12.2f %12.2f %12.3f %12.3f %14.1f (%.1f, %.1f)\n", g->n, g->n_ttft, ttft.p50, ttft.p99,
               tpot.p50, tpot.p99, os.median, os.min, os.max);
    }
    print_engine(b);
}

// ---- the JSON -----------------------------------------------------------------------------

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

// The first line a shell command prints, or "" (no such program, not a repository...).
static void first_line_of(const char *cmd, char *buf, size_t cap) {
    buf[0] = '\0';
    FILE *p = popen(cmd, "r");
    if (!p) return;
    if (!fgets(buf, (int)cap, p)) buf[0] = '\0';
    buf[strcspn(buf, "\r\n")] = '\0';
    pclose(p);
}

// MV_COMMIT, else git's short hash (with "-dirty" when tracked files differ from it), else "unknown".
static void commit_id(char *buf, size_t cap) {
    const char *env = getenv("MV_COMMIT");
    if (env && *env) {
        snprintf(buf, cap, "%s", env);
        return;
    }
    char hash[64], dirty[16];
    first_line_of("git rev-parse --short HEAD 2>/dev/null", hash, sizeof hash);
    if (!hash[0]) {
        snprintf(buf, cap, "unknown");
        return;
    }
    first_line_of("git diff --quiet HEAD -- 2>/dev/null || echo dirty", dirty, sizeof dirty);
    snprintf(buf, cap, "%s%s", hash, dirty[0] ? "-dirty" : "");
}

// /proc/cpuinfo's "model name", or "".
static void host_cpu(char *buf, size_t cap) {
    buf[0] = '\0';
    FILE *f = fopen("/proc/cpuinfo", "r");
    char line[512];
    while (f && fgets(line, sizeof line, f)) {
        const char *colon = strchr(line, ':');
        if (strncmp(line, "model name", 10) == 0 && colon) {
            snprintf(buf, cap, "%s", colon + 2);
            buf[strcspn(buf, "\n")] = '\0';
            break;
        }
    }
    if (f) fclose(f);
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
    // Ranks the model is split over (one process, and on cuda one GPU, each); num_blocks is every rank's.
    cJSON_AddNumberToObject(o, "tensor_parallel_size", c->tp_size > 1 ? c->tp_size : 1);
    return o;
}

static cJSON *gpu_json(const gpu_info_t *g) {
    if (!g->available) return cJSON_CreateNull();
    cJSON *o = cJSON_CreateObject();
    char cc[16];
    snprintf(cc, sizeof cc, "%d.%d", g->cc_major, g->cc_minor);
    cJSON_AddStringToObject(o, "name", g->name);
    cJSON_AddStringToObject(o, "compute_capability", cc);
    cJSON_AddNumberToObject(o, "sm_count", g->sm_count);
    cJSON_AddNumberToObject(o, "mem_bytes", (double)g->mem_bytes);
    cJSON_AddStringToObject(o, "driver", g->driver);
    cJSON_AddStringToObject(o, "runtime", g->runtime);
    return o;
}

// A number, or null when it is not one (no TPOT with one-token outputs).
static void add_number(cJSON *o, const char *key, double v) {
    if (isfinite(v)) cJSON_AddNumberToObject(o, key, v);
    else cJSON_AddNullToObject(o, key);
}

static cJSON *spread_json(spread_t s) {
    cJSON *o = cJSON_CreateObject();
    add_number(o, "median", s.median);
    add_number(o, "min", s.min);
    add_number(o, "max", s.max);
    return o;
}

static cJSON *pct_json(pct_t p) {
    cJSON *o = cJSON_CreateObject();
    add_number(o, "p50", p.p50);
    add_number(o, "p99", p.p99);
    add_number(o, "min", p.min);
    add_number(o, "max", p.max);
    add_number(o, "mean", p.mean);
    cJSON_AddNumberToObject(o, "samples", p.n);
    return o;
}

static cJSON *reps_json(const bench_t *b, const bench_group_t *g) {
    cJSON *a = cJSON_CreateArray();
    for (int r = 0; r < b->repeat; r++) {
        const bench_rep_t *x = &g->reps[r];
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "generate_s", x->generate_s);
        cJSON_AddNumberToObject(o, "prompt_tokens", (double)x->prompt_tokens);
        cJSON_AddNumberToObject(o, "output_tokens", (double)x->output_tokens);
        cJSON_AddNumberToObject(o, "output_tok_s", rep_figure(x, REP_OUTPUT_TOK_S));
        cJSON_AddNumberToObject(o, "total_tok_s", rep_figure(x, REP_TOTAL_TOK_S));
        cJSON_AddNumberToObject(o, "steps", (double)x->steps);
        cJSON_AddNumberToObject(o, "steps_ahead", (double)x->steps_ahead);
        cJSON_AddNumberToObject(o, "preemptions", (double)x->preemptions);
        cJSON_AddNumberToObject(o, "host_s", x->host_s);
        cJSON_AddNumberToObject(o, "runner_s", x->runner_s);
        cJSON_AddItemToArray(a, o);
    }
    return a;
}

static cJSON *ms_array(const double *x_s, int n) {
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; i < n; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber(1e3 * x_s[i]));
    return a;
}

// Throughput: flat fields, as docs/results/generate.py reads them: the median over the
// repetitions (tokens, steps: the first's), their min and max, and every repetition.
static void throughput_json(cJSON *o, const bench_t *b) {
    const bench_group_t *g = &b->groups[0];
    const bench_rep_t *r0 = &g->reps[0];
    spread_t gs = rep_spread(b, g, REP_GENERATE_S), os = rep_spread(b, g, REP_OUTPUT_TOK_S),
             ts = rep_spread(b, g, REP_TOTAL_TOK_S);
    cJSON_AddNumberToObject(o, "requests", g->n);
    cJSON_AddNumberToObject(o, "prompt_tokens", (double)r0->prompt_tokens);
    cJSON_AddNumberToObject(o, "output_tokens", (double)r0->output_tokens);
    cJSON_AddNumberToObject(o, "generate_s", gs.median);
    cJSON_AddNumberToObject(o, "generate_s_min", gs.min);
    cJSON_AddNumberToObject(o, "generate_s_max", gs.max);
    cJSON_AddNumberToObject(o, "output_tok_s", os.median);
    cJSON_AddNumberToObject(o, "output_tok_s_min", os.min);
    cJSON_AddNumberToObject(o, "output_tok_s_max", os.max);
    cJSON_AddNumberToObject(o, "total_tok_s", ts.median);
    cJSON_AddNumberToObject(o, "total_tok_s_min", ts.min);
    cJSON_AddNumberToObject(o, "total_tok_s_max", ts.max);
    cJSON_AddItemToObject(o, "ttft_ms", pct_json(percentiles_ms(g->ttft_s, g->n_ttft)));
    cJSON_AddItemToObject(o, "tpot_ms", pct_json(percentiles_ms(g->tpot_s, g->n_tpot)));
    cJSON_AddNumberToObject(o, "steps", (double)r0->steps);
    cJSON_AddNumberToObject(o, "steps_ahead", (double)r0->steps_ahead);
    cJSON_AddNumberToObject(o, "preemptions", (double)r0->preemptions);
    if (b->has_tokenizer) cJSON_AddNumberToObject(o, "unknown_token_ids", (double)r0->unknown_tokens);
    else cJSON_AddNullToObject(o, "unknown_token_ids");
    if (r0->steps > 0) {
        cJSON_AddNumberToObject(o, "host_us_per_step", 1e6 * r0->host_s / (double)r0->steps);
        cJSON_AddNumberToObject(o, "runner_us_per_step", 1e6 * r0->runner_s / (double)r0->steps);
    }
    cJSON_AddItemToObject(o, "repetitions", reps_json(b, g));
}

static void latency_json(cJSON *o, const bench_t *b) {
    cJSON *a = cJSON_CreateArray();
    for (int k = 0; k < b->n_groups; k++) {
        const bench_group_t *g = &b->groups[k];
        cJSON *x = cJSON_CreateObject();
        cJSON_AddNumberToObject(x, "batch", g->n);
        cJSON_AddItemToObject(x, "ttft_ms", pct_json(percentiles_ms(g->ttft_s, g->n_ttft)));
        cJSON_AddItemToObject(x, "tpot_ms", pct_json(percentiles_ms(g->tpot_s, g->n_tpot)));
        cJSON_AddItemToObject(x, "generate_s", spread_json(rep_spread(b, g, REP_GENERATE_S)));
        cJSON_AddItemToObject(x, "output_tok_s", spread_json(rep_spread(b, g, REP_OUTPUT_TOK_S)));
        cJSON_AddItemToObject(x, "total_tok_s", spread_json(rep_spread(b, g, REP_TOTAL_TOK_S)));
        cJSON_AddItemToObject(x, "repetitions", reps_json(b, g));
        // Every sample, request after request, repetition after repetition.
        cJSON_AddItemToObject(x, "ttft_ms_all", ms_array(g->ttft_s, g->n_ttft));
        cJSON_AddItemToObject(x, "tpot_ms_all", ms_array(g->tpot_s, g->n_tpot));
        cJSON_AddItemToArray(a, x);
    }
    cJSON_AddItemToObject(o, "batches", a);
}

static void sampling_json(cJSON *o, const bench_t *b) {
    cJSON_AddStringToObject(o, "sampling", b->sampling);
    // The values every request samples with; null when they differ from line to line.
    if (b->uniform_sampling) {
        cJSON_AddNumberToObject(o, "temperature", b->sample0.temperature);
        cJSON_AddNumberToObject(o, "top_k", b->sample0.top_k);
        cJSON_AddNumberToObject(o, "top_p", b->sample0.top_p);
    } else {
        cJSON_AddNullToObject(o, "temperature");
        cJSON_AddNullToObject(o, "top_k");
        cJSON_AddNullToObject(o, "top_p");
    }
    if (b->ignore_eos >= 0) cJSON_AddBoolToObject(o, "ignore_eos", b->ignore_eos);
    else cJSON_AddNullToObject(o, "ignore_eos");
}

static char *bench_json(const bench_t *b, int argc, char **argv) {
    char date[32], commit[96], cpu[256];
    time_t t = time(NULL);
    struct tm tm;
    strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", gmtime_r(&t, &tm));
    commit_id(commit, sizeof commit);
    host_cpu(cpu, sizeof cpu);
    char *cmdline = command_line(argc, argv);
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    static const char *const WORK[] = {"drawn", "input", "latency"};
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "command", cmdline ? cmdline : "");
    cJSON_AddStringToObject(o, "date", date);
    cJSON_AddStringToObject(o, "commit", commit);
    if (b->gpu.available) cJSON_AddStringToObject(o, "gpu", b->gpu.name);
    else cJSON_AddNullToObject(o, "gpu");
    cJSON_AddItemToObject(o, "gpu_info", gpu_json(&b->gpu));
    cJSON_AddStringToObject(o, "host_cpu", cpu);
    cJSON_AddNumberToObject(o, "host_cpus", (double)cpus);
    cJSON_AddStringToObject(o, "device", b->ec.device == RUNNER_DEVICE_CUDA ? "cuda" : "cpu");
    cJSON_AddNumberToObject(o, "threads", b->threads);
    cJSON_AddStringToObject(o, "model_dir", b->ec.model_dir);
    cJSON_AddBoolToObject(o, "random_weights", b->ec.random_weights);
    cJSON_AddStringToObject(o, "mode", b->work == WORK_LATENCY ? "latency" : "throughput");
    cJSON_AddStringToObject(o, "workload", WORK[b->work]);
    if (b->input) cJSON_AddStringToObject(o, "input", b->input);
    else cJSON_AddNullToObject(o, "input");
    // min_len, max_len: null unless drawn; prompt_len, output_len: null when drawn or given by each line
    if (b->work == WORK_DRAWN) {
        cJSON_AddNumberToObject(o, "min_len", (double)b->min_len);
        cJSON_AddNumberToObject(o, "max_len", (double)b->max_len);
    } else {
        cJSON_AddNullToObject(o, "min_len");
        cJSON_AddNullToObject(o, "max_len");
    }
    if (b->prompt_len) cJSON_AddNumberToObject(o, "prompt_len", (double)b->prompt_len);
    else cJSON_AddNullToObject(o, "prompt_len");
    if (b->output_len) cJSON_AddNumberToObject(o, "output_len", (double)b->output_len);
    else cJSON_AddNullToObject(o, "output_len");
    cJSON_AddNumberToObject(o, "seed", (double)b->seed);
    sampling_json(o, b);
    cJSON_AddNumberToObject(o, "repeat", (double)b->repeat);
    cJSON_AddBoolToObject(o, "warmup", b->warmup);
    cJSON_AddBoolToObject(o, "interrupted", b->stopped);
    cJSON_AddNumberToObject(o, "load_s", b->load_s);
    cJSON_AddNumberToObject(o, "warmup_s", b->warmup_s);
    cJSON_AddNumberToObject(o, "wall_s", b->wall_s);
    if (b->work == WORK_LATENCY) latency_json(o, b);
    else throughput_json(o, b);
    cJSON_AddNumberToObject(o, "weight_bytes", (double)b->weight_bytes);
    cJSON_AddNumberToObject(o, "kv_cache_bytes", (double)b->kv_cache_bytes);
    cJSON_AddNumberToObject(o, "scratch_bytes", (double)b->scratch_bytes);
    cJSON_AddBoolToObject(o, "enforce_eager", b->ec.enforce_eager);
    cJSON_AddBoolToObject(o, "async_scheduling", b->async_scheduling);
    cJSON_AddNumberToObject(o, "cuda_graphs", b->num_graphs);
    cJSON_AddNumberToObject(o, "graph_capture_s", b->graph_s);
    cJSON_AddNumberToObject(o, "graph_bytes", (double)b->graph_bytes);
    cJSON_AddNumberToObject(o, "graph_early_edges", (double)b->graph_early_edges);
    cJSON_AddNumberToObject(o, "megakernel_rows", b->megakernel_rows);
    cJSON_AddStringToObject(o, "megakernel_not", b->megakernel_why);
    cJSON_AddNumberToObject(o, "halves_rows", b->halves_rows);
    cJSON_AddNumberToObject(o, "halves_max_rows", b->halves_max_rows);
    cJSON_AddItemToObject(o, "config", config_json(&b->model, &b->ec));
    char *s = cJSON_Print(o);
    cJSON_Delete(o);
    free(cmdline);
    return s;
}

// The whole document to PATH.tmp-PID, then renamed: PATH is complete or untouched.
static int write_json(const bench_t *b, const char *path, int argc, char **argv) {
    char *s = bench_json(b, argc, argv);
    if (!s) return mv_error("out of memory");
    cli_atomic_t f;
    int rc = cli_atomic_open(&f, path);
    if (!rc && fprintf(f.f, "%s\n", s) < 0) rc = mv_error("cannot write %s: %s", path, strerror(errno));
    if (!rc) rc = cli_atomic_commit(&f);
    else cli_atomic_abort(&f);
    free(s);
    return rc;
}

static void bench_free(bench_t *b) {
    for (int k = 0; k < BENCH_MAX_BATCHES; k++) {
        free(b->groups[k].reps);
        free(b->groups[k].ttft_s);
        free(b->groups[k].tpot_s);
    }
    cli_requests_free(&b->rq);
}

// Options parsed and checked: check --json's path, read --input, run, report.
static int bench_main(const bench_args_t *a, bench_t *b, int argc, char **argv) {
    if (a->json && cli_atomic_check(a->json)) return cli_error("bench", CLI_FAIL, "--json: %s", mv_last_error());
    if (a->step_trace) {
        b->step_trace = fopen(a->step_trace, "w");
        if (!b->step_trace)
            return cli_error("bench", CLI_FAIL, "--step-trace %s: %s", a->step_trace, strerror(errno));
        fprintf(b->step_trace, "%s\n", engine_step_trace_header);
    }
    int rc = b->work == WORK_INPUT ? read_input(b) : 0;
    if (!rc) rc = run(b);
    if (b->step_trace) {
        const int bad = ferror(b->step_trace);
        if (fclose(b->step_trace) || bad) {
            if (!rc) rc = mv_error("--step-trace %s: write failed", a->step_trace);
        }
        b->step_trace = NULL;
    }
    const int have = b->n_groups > 0 && b->repeat > 0;  // after a stop, something finished
    if (!rc && a->json && have) rc = write_json(b, a->json, argc, argv);
    if (rc) return cli_error("bench", CLI_FAIL, "%s", mv_last_error());
    if (have && b->work == WORK_LATENCY) print_latency(b);
    else if (have) print_throughput(b);
    if (!b->stopped) return CLI_OK;
    fprintf(stderr, "minivllm bench: stopped by %s: %s%s\n", cli_stop_signal_name(),
            !have ? "nothing had finished, nothing is reported"
                  : b->work == WORK_LATENCY ? "the batch sizes that finished are reported"
                                            : "the repetitions that finished are reported",
            a->json && have ? " (and in --json, with \"interrupted\": true)" : a->json ? "; --json not written" : "");
    return cli_stop_status();
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
        {"--prompt-len", "N", "every prompt N tokens (instead of drawn; --latency: default 512)", &a.prompt_len, NULL},
        {"--output-len", "N", "every request generates N tokens (instead of drawn; --latency: default 256)",
         &a.output_len, NULL},
        {"--input", "FILE", "time the requests of a JSONL file (\"-\" = stdin) instead of drawn ones", &a.input, NULL},
        {"--latency", NULL, "time to first token and per output token at each --batch size", NULL, &a.latency},
        {"--batch", "B,B,...", "--latency's batch sizes (default 1,8,64)", &a.batch, NULL},
        {"--repeat", "N", "timed repetitions, after the warm-up (default 3)", &a.repeat, NULL},
        {"--no-warmup", NULL, "time from the first run on", NULL, &a.no_warmup},
        {"--sampling", "MODE", "greedy, qwen3 (generation_config.json's) or file (each line's; --input's default)",
         &a.sampling, NULL},
        {"--temperature", "T", "every request samples at T (0 = greedy)", &a.temperature, NULL},
        {"--top-k", "K", "every request keeps the K most likely tokens (0 = off)", &a.top_k, NULL},
        {"--top-p", "P", "every request samples from the nucleus P in (0, 1]", &a.top_p, NULL},
        {"--seed", "S", "draws the lengths, the prompt ids, random weights; seeds request i with S + i (default 0)",
         &a.seed, NULL},
        {"--json", "FILE", "also write every figure, the command line, commit, date, GPU and host as JSON", &a.json,
         NULL},
        {"--step-trace", "FILE", "one CSV line per timed step: its rows, tokens, context and microseconds",
         &a.step_trace, NULL},
    };
    enum { N_OWN = sizeof own / sizeof *own };
    cli_opt_t opts[N_OWN + CLI_ENGINE_N_OPTS];
    memcpy(opts, own, sizeof own);
    int n_opts = N_OWN + cli_engine_opts(&a.eng, opts + N_OWN);
    bench_t b = {0};
    b.t_start = now_s();
    int st = cli_parse("bench", BENCH_USAGE, opts, n_opts, argc, argv);
    if (st == CLI_HELP) return CLI_OK;
    if (st != CLI_OK) return st;
    if (!a.model) return cli_error("bench", CLI_USAGE, "--model DIR is required");
    {
        const int mst = cli_model_dir("bench", &a.model);
        if (mst != CLI_OK) return mst;
    }
    if ((st = bench_options(&a, &b))) return st;
    if (cli_tp_follower("bench", &b.ec, &st)) {  // ranks other than 0 end here
        bench_free(&b);
        return st;
    }
    st = bench_main(&a, &b, argc, argv);
    bench_free(&b);
    return st;
}

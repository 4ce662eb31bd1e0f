/*
 * chapters/08-scheduler/main.c - Chapter 08: the scheduler, simulated.
 *
 * Runs the scheduler (scheduler.h) with a stand-in model (simulate.h) on
 * three workloads and checks, after every step, that no KV block is leaked
 * or owned twice, that reference counts equal owners, that every running
 * sequence has the blocks its tokens need and that cached blocks' hashes
 * match their tokens; and, at the end, that every request produced exactly
 * the tokens the stand-in model gives it in isolation.
 *   1. random:        256 requests, prompt and output lengths in 100..1024,
 *                     random arrivals, a cache small enough to preempt;
 *   2. shared-prefix: 256 requests behind one 768-token system prompt
 *                     (the prefix cache at work);
 *   3. bad requests:  rejected with a reason, while the good ones finish.
 * It prints steps, batch sizes, block usage, the prefix-cache hit rate and
 * preemptions, compares with static batching, and draws block usage and
 * batch size over time in the terminal (and as a PNG with gnuplot).
 *
 * There is no GPU half: this chapter is plain host C.
 * Build and run:  make && ./build/08-scheduler [--plot FILE.png] [--json FILE] [--help]
 * Exit status: 0 if every check passed, 1 if any failed, 2 on bad arguments.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "chapters/08-scheduler/sched/scheduler.h"
#include "chapters/08-scheduler/simulate.h"
#include "common/check.h"
#include "common/harness.h"
#include "common/rng.h"

// Qwen3's generation_config.json: eos_token_id [151645, 151643]
// (<|im_end|> and <|endoftext|>).
static const int32_t QWEN3_EOS[] = {151645, 151643};

// The cache of the simulation: 2048 blocks of 16 tokens = 32768 tokens of
// K/V. Qwen3-0.6B keeps 28 layers x 8 KV heads x 128 dims x 2 (K and V) x
// 2 bytes = 114688 bytes per token, so this is a 3.8 GB cache: small on
// purpose, so that 64 sequences of up to 2048 tokens must preempt.
static scheduler_config_t sim_config(void) {
    scheduler_config_t c = {
        .max_num_seqs = 64,
        .max_num_batched_tokens = 2048,
        .max_model_len = 2048,
        .block_size = 16,
        .num_blocks = 2048,
        .enable_prefix_caching = 1,
        .num_eos = 2,
    };
    memcpy(c.eos_ids, QWEN3_EOS, sizeof QWEN3_EOS);
    return c;
}

// ---- options of this chapter -------------------------------------------------------------

typedef struct {
    const char *plot_path;
} chapter_opts_t;

static int parse_opt(void *ctx, int argc, char **argv, int i) {
    chapter_opts_t *o = ctx;
    if (strcmp(argv[i], "--plot")) return 0;
    if (i + 1 >= argc) {
        fprintf(stderr, "08-scheduler: --plot needs a file name (see --help)\n");
        exit(2);
    }
    o->plot_path = argv[i + 1];
    return 2;
}

// ---- plots ------------------------------------------------------------------------------------

// A terminal plot of series[n] (values in [0, ymax]): columns average the
// steps they cover, rows are filled up to the column's value.
static void ascii_plot(const char *title, const int *series, long n, double ymax) {
    enum { W = 72, H = 8 };
    double col[W];
    for (int c = 0; c < W; c++) {
        long lo = n * c / W, hi = n * (c + 1) / W;
        double sum = 0;
        for (long i = lo; i < hi; i++) sum += series[i];
        col[c] = hi > lo ? sum / (double)(hi - lo) : 0;
    }
    printf("\n  %s\n", title);
    for (int r = H; r >= 1; r--) {
        double level = ymax * (r - 0.5) / H;
        printf("  %6.0f |", ymax * r / H);
        for (int c = 0; c < W; c++) putchar(col[c] >= level ? '#' : ' ');
        putchar('\n');
    }
    printf("         +");
    for (int c = 0; c < W; c++) putchar('-');
    printf("\n          step 0%*s%ld\n", W - 6, "", n);
}

static int on_path(const char *prog) {
    const char *path = getenv("PATH");
    if (!path) return 0;
    char *copy = strdup(path), *save = NULL;
    int found = 0;
    for (char *dir = strtok_r(copy, ":", &save); dir && !found; dir = strtok_r(NULL, ":", &save)) {
        char full[4096];
        snprintf(full, sizeof full, "%s/%s", dir, prog);
        found = access(full, X_OK) == 0;
    }
    free(copy);
    return found;
}

// Block usage (%) and batch size over the steps, as a PNG drawn by gnuplot.
static void gnuplot_png(const char *png, const sim_result_t *r, const char *title) {
    if (!on_path("gnuplot")) {
        printf("  PNG skipped: gnuplot is not on PATH (install it to get %s)\n", png);
        return;
    }
    FILE *g = popen("gnuplot", "w");
    if (!g) {
        printf("  PNG skipped: could not start gnuplot\n");
        return;
    }
    fprintf(g, "set terminal pngcairo size 1000,500\nset output '%s'\n", png);
    fprintf(g, "set title '%s'\nset xlabel 'step'\nset ylabel 'KV blocks used (%%)'\n", title);
    fprintf(g, "set y2label 'batch size (sequences)'\nset ytics nomirror\nset y2tics\n");
    fprintf(g, "set yrange [0:105]\nset key bottom right\n$d << EOD\n");
    for (long i = 0; i < r->steps; i++)
        fprintf(g, "%ld %.2f %d\n", i, 100.0 * r->blocks_used[i] / r->num_blocks, r->batch_size[i]);
    fprintf(g, "EOD\nplot $d using 1:2 with lines title 'blocks used', "
               "$d using 1:3 axes x1y2 with lines title 'batch size'\n");
    int rc = pclose(g);
    printf("  %s: %s\n", rc == 0 ? "PNG written" : "gnuplot failed, no PNG", png);
}

// ---- workloads -----------------------------------------------------------------------------------

static double hit_rate(const sim_result_t *r) {
    return r->prompt_tokens_admitted ? (double)r->cached_tokens_admitted / r->prompt_tokens_admitted : 0;
}

static double mean_of(const int *x, long n) {
    double s = 0;
    for (long i = 0; i < n; i++) s += x[i];
    return n ? s / (double)n : 0;
}

// Static batching on the same requests and outputs: a batch takes requests in
// arrival order while it has rows and the cache can hold all of them at their
// final length (nothing can be preempted, and nobody joins a started batch);
// it is prefilled in token-budget steps, then decoded until its longest
// output is done. mean_rows: busy rows per decode step.
static long static_batching_steps(const scheduler_config_t *c, const sim_request_t *reqs,
                                  const sim_result_t *r, int n, double *mean_rows) {
    long steps = 0, rows = 0, decode_steps = 0;
    for (int b = 0; b < n;) {
        long prompt = 0;
        int longest = 0, blocks = 0, e = b;
        for (; e < n && e - b < c->max_num_seqs; e++) {
            if (r->out_len[e] < 0) continue;  // rejected
            int need = blocks_for_tokens(reqs[e].num_prompt + r->out_len[e], c->block_size);
            if (e > b && blocks + need > c->num_blocks) break;
            blocks += need;
            prompt += reqs[e].num_prompt;
            if (r->out_len[e] > longest) longest = r->out_len[e];
            // A sequence with k outputs is busy in k - 1 decode steps.
            rows += r->out_len[e] - 1;
        }
        steps += (prompt + c->max_num_batched_tokens - 1) / c->max_num_batched_tokens + longest - 1;
        decode_steps += longest - 1;
        b = e;
    }
    *mean_rows = decode_steps ? (double)rows / decode_steps : 0;
    return steps;
}

static mv_json_t *result_json(const sim_result_t *r, const scheduler_config_t *c) {
    mv_json_t *j = mvj_object();
    mvj_set_number(j, "steps", (double)r->steps);
    mvj_set_number(j, "tokens", (double)r->tokens);
    mvj_set_number(j, "finished", r->finished);
    mvj_set_number(j, "rejected", r->rejected);
    mvj_set_number(j, "mean_batch", mean_of(r->batch_size, r->steps));
    mvj_set_number(j, "max_batch", r->max_batch);
    mvj_set_number(j, "mean_tokens_per_step", mean_of(r->step_tokens, r->steps));
    mvj_set_number(j, "mean_blocks_used_pct", 100.0 * mean_of(r->blocks_used, r->steps) / c->num_blocks);
    mvj_set_number(j, "peak_blocks_used_pct", 100.0 * r->peak_blocks_used / c->num_blocks);
    mvj_set_number(j, "prefix_hit_rate", hit_rate(r));
    mvj_set_number(j, "preemptions", (double)r->preemptions);
    mvj_set_number(j, "evictions", (double)r->evictions);
    mv_json_t *cfg = mvj_set_object(j, "config");
    mvj_set_number(cfg, "max_num_seqs", c->max_num_seqs);
    mvj_set_number(cfg, "max_num_batched_tokens", c->max_num_batched_tokens);
    mvj_set_number(cfg, "max_model_len", c->max_model_len);
    mvj_set_number(cfg, "block_size", c->block_size);
    mvj_set_number(cfg, "num_blocks", c->num_blocks);
    mvj_set_bool(cfg, "enable_prefix_caching", c->enable_prefix_caching);
    return j;
}

// Run one workload; record its checks and statistics. Returns the result
// (caller frees) so the plots can use it.
static void run_workload(harness_t *h, mv_json_t *jw, const char *name, const workload_t *w,
                         const scheduler_config_t *c, sim_result_t *r, sim_request_t **reqs_out) {
    rng_t rng;
    rng_seed(&rng, h->seed ^ (uint64_t)(unsigned char)name[0]);
    sim_request_t *reqs = sim_make_requests(&rng, w);
    if (!reqs) mv_die_at(__FILE__, __LINE__, "sim_make_requests", mv_last_error());
    sim_options_t opt = {.check_every_step = 1, .max_steps = 200000};
    int rc = sim_run(c, reqs, w->num_requests, &opt, r);
    char detail[512];
    snprintf(detail, sizeof detail, "%ld steps, %d requests%s%s", r->steps, w->num_requests,
             rc ? ": " : "", rc ? mv_last_error() : "");
    harness_check_bool(h, "cpu", name, "invariants, every step", rc == 0, detail);
    snprintf(detail, sizeof detail, "%d finished, %d wrong", r->finished, r->wrong_outputs);
    harness_check_bool(h, "cpu", name, "outputs match the model",
                       rc == 0 && r->finished == w->num_requests && r->wrong_outputs == 0, detail);
    if (!h->summary) {
        printf("    steps %ld, tokens/step %.0f, batch mean %.1f max %d (max_num_seqs %d)\n",
               r->steps, mean_of(r->step_tokens, r->steps), mean_of(r->batch_size, r->steps),
               r->max_batch, c->max_num_seqs);
        printf("    KV blocks used: mean %.0f%%, peak %.0f%% of %d; prefix-cache hit rate %.1f%%; "
               "preemptions %lld; evictions %lld\n",
               100.0 * mean_of(r->blocks_used, r->steps) / c->num_blocks,
               100.0 * r->peak_blocks_used / c->num_blocks, c->num_blocks, 100.0 * hit_rate(r),
               r->preemptions, r->evictions);
    }
    mvj_set(jw, name, result_json(r, c));
    *reqs_out = reqs;
}

// ---- asynchronous scheduling ----------------------------------------------------------------------
// The engine on a GPU plans step n + 1 while step n runs
// (scheduler_schedule_ahead). The same requests with and without it, and
// with requests that end at a token the scheduler cannot foresee (the
// stand-in's stop: any token that is a multiple of STOP_MOD, as the engine's
// stop ids and strings): every output must be the model's, the same in both
// runs, and the run must plan steps ahead and drop the rows of requests that
// ended while their next step was already running.
#define STOP_MOD 97

static void check_async(harness_t *h, mv_json_t *jw, const workload_t *w, const scheduler_config_t *c) {
    rng_t rng;
    rng_seed(&rng, h->seed ^ 0xa5u);
    sim_request_t *reqs = sim_make_requests(&rng, w);
    if (!reqs) mv_die_at(__FILE__, __LINE__, "sim_make_requests", mv_last_error());
    sim_result_t r[2];
    int rc[2];
    for (int a = 0; a < 2; a++) {
        sim_options_t opt = {.check_every_step = 1, .max_steps = 200000, .async = a, .stop_mod = STOP_MOD};
        rc[a] = sim_run(c, reqs, w->num_requests, &opt, &r[a]);
    }
    int differ = 0;
    for (int i = 0; i < w->num_requests; i++)
        differ += r[0].out_len[i] != r[1].out_len[i] || r[0].reason[i] != r[1].reason[i];
    char detail[512];
    snprintf(detail, sizeof detail, "%ld steps, %ld planned ahead, %ld rows dropped%s%s", r[1].steps,
             r[1].ahead_steps, r[1].dropped_rows, rc[1] ? ": " : "", rc[1] ? mv_last_error() : "");
    harness_check_bool(h, "cpu", "async", "invariants, every step", rc[0] == 0 && rc[1] == 0, detail);
    snprintf(detail, sizeof detail, "%d finished, %d wrong, %d differ from the run without", r[1].finished,
             r[1].wrong_outputs, differ);
    harness_check_bool(h, "cpu", "async", "outputs match the model and the run without",
                       rc[1] == 0 && r[1].wrong_outputs == 0 && r[1].finished == w->num_requests && !differ, detail);
    harness_check_bool(h, "cpu", "async", "steps planned ahead, rows dropped",
                       r[1].ahead_steps > r[1].steps / 2 && r[1].dropped_rows > 0, detail);
    if (!h->summary)
        printf("    without: %ld steps; with: %ld steps, %ld of them planned ahead (%.0f%%), %ld rows dropped from "
               "a step in flight\n", r[0].steps, r[1].steps, r[1].ahead_steps, 100.0 * r[1].ahead_steps / r[1].steps,
               r[1].dropped_rows);
    mv_json_t *ja = mvj_set_object(jw, "async");
    mvj_set_number(ja, "num_requests", w->num_requests);
    mvj_set_number(ja, "stop_mod", STOP_MOD);
    mvj_set_number(ja, "steps_sync", (double)r[0].steps);
    mvj_set_number(ja, "steps", (double)r[1].steps);
    mvj_set_number(ja, "steps_ahead", (double)r[1].ahead_steps);
    mvj_set_number(ja, "rows_dropped", (double)r[1].dropped_rows);
    mvj_set_number(ja, "outputs_differ", differ);
    for (int a = 0; a < 2; a++) sim_free_result(&r[a]);
    sim_free_requests(reqs, w->num_requests);
}

// ---- bad requests ----------------------------------------------------------------------------------

static void check_bad_requests(harness_t *h) {
    scheduler_config_t c = sim_config();
    c.num_blocks = 64;  // 1024 tokens: a 2000-token request can never fit
    scheduler_t s;
    MV_CHECK(scheduler_init(&s, &c));
    static const struct {
        const char *what;
        int n, max_tokens;
        request_error_t expect;
    } cases[] = {
        {"empty prompt", 0, 16, REQ_EMPTY_PROMPT},
        {"prompt over max_model_len", 2049, 16, REQ_PROMPT_TOO_LONG},
        {"max_tokens 0", 10, 0, REQ_BAD_PARAMS},
        {"never fits the cache", 1500, 500, REQ_NEVER_FITS},
        {"good request", 300, 40, REQ_OK},
        {"good request", 700, 200, REQ_OK},
    };
    int32_t *prompt = malloc(2049 * sizeof(int32_t));
    if (!prompt) mv_die_at(__FILE__, __LINE__, "malloc", "out of host memory");
    for (int i = 0; i < 2049; i++) prompt[i] = (i * 7919) % SIM_VOCAB;
    int n_good = 0;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        sampling_params_t p = sampling_params_default(cases[i].max_tokens);
        p.ignore_eos = 1;
        request_error_t e;
        int rc = scheduler_add_request(&s, prompt, cases[i].n, &p, NULL, &e);
        char detail[512];
        snprintf(detail, sizeof detail, "%s: %s", request_error_name(e),
                 rc ? mv_last_error() : "accepted");
        harness_check_bool(h, "cpu", "bad-requests", cases[i].what,
                           e == cases[i].expect && (rc == 0) == (e == REQ_OK), detail);
        n_good += e == REQ_OK;
    }
    // The accepted ones run to the end beside the rejected.
    int32_t sampled[64] = {0};
    int steps = 0, finished = 0;
    const sched_step_t *st;
    while (scheduler_num_unfinished(&s) && steps < 10000) {
        MV_CHECK(scheduler_schedule(&s, &st));
        for (int k = 0; k < st->num_sample; k++) sampled[k] = 1000 + steps;
        MV_CHECK(scheduler_postprocess(&s, sampled));
        MV_CHECK(scheduler_check_invariants(&s));
        for (sequence_t *q; (q = scheduler_pop_finished(&s)); finished++) sequence_free(q);
        steps++;
    }
    char detail[128];
    snprintf(detail, sizeof detail, "%d of %d accepted requests finished in %d steps", finished,
             n_good, steps);
    harness_check_bool(h, "cpu", "bad-requests", "the others go on", finished == n_good, detail);
    free(prompt);
    scheduler_free(&s);
}

int main(int argc, char **argv) {
    chapter_opts_t opts = {NULL};
    harness_extra_t extra = {
        "  --plot FILE      write block usage and batch size over time as a PNG (gnuplot);\n"
        "                   default: next to --json, as FILE.png\n",
        parse_opt, &opts};
    harness_t h;
    harness_begin_host(&h, "08-scheduler",
                       "continuous batching over paged KV blocks with prefix caching, simulated",
                       argc, argv, &extra);
    mv_json_t *jw = mvj_set_object(h.json, "workloads");
    scheduler_config_t c = sim_config();

    harness_section(&h, "random: 256 requests, prompt and output 100..1024 tokens, random arrivals");
    workload_t random_w = {256, 100, 1024, 100, 1024, 0, 1.0};
    if (h.quick) random_w.num_requests = 64;
    sim_result_t rr;
    sim_request_t *rreqs;
    run_workload(&h, jw, "random", &random_w, &c, &rr, &rreqs);
    double static_rows;
    long static_steps = static_batching_steps(&c, rreqs, &rr, random_w.num_requests, &static_rows);
    mv_json_t *js = mvj_set_object(jw, "static_batching");
    mvj_set_number(js, "steps", (double)static_steps);
    mvj_set_number(js, "mean_decode_rows", static_rows);
    if (!h.summary)
        printf("    static batching of the same requests: %ld steps (continuous: %ld), "
               "%.1f of %d rows busy per decode step\n",
               static_steps, rr.steps, static_rows, c.max_num_seqs);

    harness_section(&h, "shared-prefix: 256 requests behind one 768-token system prompt");
    workload_t shared_w = {256, 32, 256, 32, 256, 768, 0.5};
    if (h.quick) shared_w.num_requests = 64;
    sim_result_t sr;
    sim_request_t *sreqs;
    run_workload(&h, jw, "shared-prefix", &shared_w, &c, &sr, &sreqs);
    // The first request must compute the system prompt; nearly every later
    // one should find its 48 full blocks cached.
    double expect = 0.6;
    char detail[128];
    snprintf(detail, sizeof detail, "%.1f%% of admitted prompt tokens cached (expect > %.0f%%)",
             100.0 * hit_rate(&sr), 100 * expect);
    harness_check_bool(&h, "cpu", "shared-prefix", "prefix cache hits", hit_rate(&sr) > expect, detail);

    harness_section(&h, "asynchronous scheduling: 256 requests at once, steps planned ahead, unforeseen stops");
    workload_t async_w = {256, 100, 1024, 100, 1024, 0, 0.0};
    if (h.quick) async_w.num_requests = 64;
    check_async(&h, jw, &async_w, &c);

    harness_section(&h, "bad requests are rejected with a reason, the others go on");
    check_bad_requests(&h);

    if (!h.summary) {
        char title[128];
        snprintf(title, sizeof title, "random: KV blocks used (of %d) per step", c.num_blocks);
        ascii_plot(title, rr.blocks_used, rr.steps, c.num_blocks);
        ascii_plot("random: batch size (sequences) per step", rr.batch_size, rr.steps, c.max_num_seqs);
        char png[4096] = "";
        if (opts.plot_path) snprintf(png, sizeof png, "%s", opts.plot_path);
        else if (h.json_path) snprintf(png, sizeof png, "%s.png", h.json_path);
        if (png[0]) gnuplot_png(png, &rr, "08-scheduler, random workload");
        else printf("\n  PNG skipped: give --plot FILE.png (or --json FILE) to draw one\n");
    }
    sim_free_requests(rreqs, random_w.num_requests);
    sim_free_requests(sreqs, shared_w.num_requests);
    sim_free_result(&rr);
    sim_free_result(&sr);
    return harness_end(&h);
}

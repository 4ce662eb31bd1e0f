/*
 * chapters/09-engine/cli/cmd_serve.c - `minivllm serve`: the engine behind an
 * OpenAI-compatible HTTP server.
 *
 *   minivllm serve --model DIR [--host 127.0.0.1] [--port 8000] [--api-key KEY]
 *   curl http://127.0.0.1:8000/v1/completions -H 'Content-Type: application/json' \
 *        -d '{"model": "DIR", "prompt": "Hello", "max_tokens": 16}'
 *
 * The parts, in chapters/09-engine/serve/:
 *   openai.c         request bodies -> token ids and sampling parameters; answers and SSE chunks
 *   engine_thread.c  the engine core (runtime/engine.h) in its own thread, fed by a queue
 *   http.c           libmicrohttpd: routes, bodies, streams, errors in OpenAI's schema
 * This file loads the model, starts both threads, prints "serving on
 * http://HOST:PORT" (with --port 0 the port the system picked, so tests can
 * run side by side) and waits for SIGINT or SIGTERM. Then it drains: the
 * listening socket is closed, new requests get 503, the running ones
 * finish (at most --drain-timeout seconds, then they are aborted), their
 * answers are sent, and it exits 0.
 *
 * Exit status: 0 after a drain, 1 the model or the address failed, 2 bad arguments.
 */
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "chapters/09-engine/cli/cli.h"
#include "chapters/09-engine/serve/engine_thread.h"
#include "chapters/09-engine/serve/http.h"
#include "common/check.h"

static const char SERVE_USAGE[] =
    "usage: minivllm serve --model DIR [--host ADDR] [--port N] [--api-key KEY] [--served-model-name NAME]\n"
    "                      [--max-queued-requests N] [--max-body-bytes N] [--timeout S] [--drain-timeout S]\n"
    "                      [--seed S] [--random-weights] [--device cpu|cuda] [engine sizes...]\n"
    "\n"
    "Serve a Qwen3 model directory over HTTP, as vLLM's OpenAI-compatible server does:\n"
    "  POST /v1/completions        {\"prompt\": text, [texts], [ids] or [[ids]], \"max_tokens\", ...}\n"
    "  POST /v1/chat/completions   {\"messages\": [...], \"chat_template_kwargs\": {\"enable_thinking\": false}, ...}\n"
    "  (\"stream\": true: server-sent events, a chunk per token, ending \"data: [DONE]\")\n"
    "  GET  /v1/models, /health, /metrics (Prometheus)\n"
    "Sampling: max_tokens, temperature, top_p, top_k, seed, ignore_eos, stop_token_ids\n"
    "(defaults from generation_config.json; a request without \"seed\" gets S + its number).\n"
    "All requests share one engine: they join the running batch as they arrive, and a client\n"
    "that disconnects frees its KV blocks at once. --port 0 picks a free port; the line\n"
    "\"serving on http://HOST:PORT\" on stdout says which. SIGINT / SIGTERM: stop accepting,\n"
    "finish what runs (at most --drain-timeout s), exit 0.";

typedef struct {
    const char *model, *host, *port, *api_key, *served_name, *max_queued, *max_body, *timeout, *drain_timeout, *seed;
    const char *step_delay;
    int random_weights;
    cli_engine_args_t eng;
} serve_args_t;

typedef struct {
    long port, max_queued, max_body, timeout, seed, step_delay;
    float drain_timeout;
} serve_numbers_t;

static int parse_numbers(const serve_args_t *a, serve_numbers_t *n) {
    const char *cmd = "serve";
    *n = (serve_numbers_t){.port = 8000, .max_queued = 256, .max_body = 4 << 20, .timeout = 30, .drain_timeout = 30};
    return cli_parse_long(cmd, "--port", a->port, 0, 65535, &n->port) ||
                   cli_parse_long(cmd, "--max-queued-requests", a->max_queued, 1, 1 << 20, &n->max_queued) ||
                   cli_parse_long(cmd, "--max-body-bytes", a->max_body, 64, 1L << 30, &n->max_body) ||
                   cli_parse_long(cmd, "--timeout", a->timeout, 0, 86400, &n->timeout) ||
                   cli_parse_float(cmd, "--drain-timeout", a->drain_timeout, 0, 86400, 0, &n->drain_timeout) ||
                   cli_parse_long(cmd, "--seed", a->seed, 0, LONG_MAX, &n->seed) ||
                   cli_parse_long(cmd, "--step-delay-ms", a->step_delay, 0, 10000, &n->step_delay)
               ? CLI_USAGE
               : CLI_OK;
}

// Up to timeout_s for the answers under way to be sent.
static void wait_for_answers(const http_server_t *h, double timeout_s) {
    for (int i = 0; i < (int)(timeout_s * 100) && http_server_active(h) > 0; i++) {
        struct timespec ts = {0, 10 * 1000000L};
        nanosleep(&ts, NULL);
    }
}

static int run_serve(const serve_args_t *a) {
    serve_numbers_t n;
    int st = parse_numbers(a, &n);
    if (st) return st;
    engine_config_t ec = engine_config_default(a->model);
    if ((st = cli_engine_config("serve", &a->eng, &ec))) return st;
    ec.random_weights = a->random_weights;
    ec.weights_seed = (uint64_t)n.seed;
    if (cli_tp_follower("serve", &ec, &st)) return st;  // ranks other than 0 end here
    engine_t *e = NULL;
    if (engine_create(&ec, &e)) return cli_error("serve", CLI_FAIL, "%s", mv_last_error());
    // Signals go to sigwait below, not to a thread in the middle of a step:
    // the threads started from here on inherit this mask.
    sigset_t stop;
    sigemptyset(&stop);
    sigaddset(&stop, SIGINT);
    sigaddset(&stop, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &stop, NULL);
    signal(SIGPIPE, SIG_IGN);
    const serve_engine_config_t sc = {(int)n.max_queued, (uint64_t)n.seed, (int)n.step_delay};
    serve_engine_t *se = NULL;
    http_server_t *h = NULL;
    const char *name = a->served_name ? a->served_name : a->model;
    const qwen3_config_t *m = &e->model;
    http_config_t hc = {.host = a->host ? a->host : "127.0.0.1",
                        .port = (int)n.port,
                        .api_key = a->api_key,
                        .max_body_bytes = (size_t)n.max_body,
                        .timeout_s = (unsigned)n.timeout,
                        .max_model_len = e->cfg.max_model_len,
                        .api = {.served_model_name = name,
                                .tokenizer = e->tokenizer,
                                .vocab_size = m->vocab_size,
                                .max_model_len = e->cfg.max_model_len,
                                .defaults = {m->temperature, m->top_k, m->top_p, 16, 0}}};
    if (serve_engine_start(e, &sc, &se)) {
        engine_free(e);
        return cli_error("serve", CLI_FAIL, "%s", mv_last_error());
    }
    hc.engine = se;
    if (http_server_start(&hc, &h)) {
        st = cli_error("serve", CLI_FAIL, "%s", mv_last_error());
        serve_engine_free(se);
        engine_free(e);
        return st;
    }
    fprintf(stderr, "minivllm serve: %s on %s (%d KV blocks of %d tokens, %d rows, max_model_len %d)%s\n", name,
            model_runner_device_name(ec.device), e->cfg.num_blocks, e->cfg.block_size, e->cfg.max_num_seqs,
            e->cfg.max_model_len, e->tokenizer ? "" : "; no tokenizer: prompts must be token ids");
    printf("serving on http://%s:%d\n", hc.host, http_server_port(h));
    fflush(stdout);
    int sig = 0;
    sigwait(&stop, &sig);
    fprintf(stderr, "minivllm serve: %s: draining (no new requests; the running ones finish, at most %g s)\n",
            sig == SIGINT ? "SIGINT" : "SIGTERM", (double)n.drain_timeout);
    http_server_quiesce(h);
    serve_engine_drain(se, n.drain_timeout);
    wait_for_answers(h, 5.0);
    http_server_stop(h);
    serve_engine_free(se);
    engine_free(e);
    fprintf(stderr, "minivllm serve: stopped\n");
    return CLI_OK;
}

int cmd_serve(int argc, char **argv) {
    serve_args_t a = {0};
    const cli_opt_t own[] = {
        {"--model", "DIR", "Hugging Face model directory", &a.model, NULL},
        {"--host", "ADDR", "address to listen on (default 127.0.0.1)", &a.host, NULL},
        {"--port", "N", "port to listen on, 0 = any free one (default 8000)", &a.port, NULL},
        {"--api-key", "KEY", "require \"Authorization: Bearer KEY\" on /v1/ paths", &a.api_key, NULL},
        {"--served-model-name", "NAME", "the model's name in the API (default: --model as given)", &a.served_name,
         NULL},
        {"--max-queued-requests", "N", "requests that may wait for a row; one more is a 503 (default 256)",
         &a.max_queued, NULL},
        {"--max-body-bytes", "N", "largest request body; a larger one is a 413 (default 4194304)", &a.max_body, NULL},
        {"--timeout", "S", "close a connection idle for S seconds, 0 = never (default 30)", &a.timeout, NULL},
        {"--drain-timeout", "S", "on SIGINT/SIGTERM, abort what still runs after S seconds (default 30)",
         &a.drain_timeout, NULL},
        {"--seed", "S", "request i without \"seed\" draws with S + i; the --random-weights seed (default 0)", &a.seed,
         NULL},
        {"--random-weights", NULL, "no weights file: seeded random weights for config.json (timing only)", NULL,
         &a.random_weights},
        {"--step-delay-ms", "MS", "testing aid: sleep MS after every engine step (default 0)", &a.step_delay, NULL},
    };
    enum { N_OWN = sizeof own / sizeof *own };
    cli_opt_t opts[N_OWN + CLI_ENGINE_N_OPTS];
    memcpy(opts, own, sizeof own);
    int n_opts = N_OWN + cli_engine_opts(&a.eng, opts + N_OWN);
    int st = cli_parse("serve", SERVE_USAGE, opts, n_opts, argc, argv);
    if (st == CLI_HELP) return CLI_OK;
    if (st != CLI_OK) return st;
    if (!a.model) return cli_error("serve", CLI_USAGE, "--model DIR is required");
    {
        const int mst = cli_model_dir("serve", &a.model);
        if (mst != CLI_OK) return mst;
    }
    if (a.api_key && !*a.api_key) return cli_error("serve", CLI_USAGE, "--api-key needs a non-empty key");
    return run_serve(&a);
}

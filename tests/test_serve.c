/*
 * tests/test_serve.c - `minivllm serve` and the engine paths it needs.
 *
 *   scheduler_abort (chapter 08): a running or waiting request taken out
 *     between steps, its blocks free, the invariants kept.
 *   engine_core (runtime/engine.h): requests added while others run give the
 *     tokens engine_run gives; an abort frees the blocks at once and reports
 *     finish_reason "abort"; stop_token_ids end a request as a stop.
 *   the server over a plain socket (no HTTP library in the test): the tiny
 *     checkpoint without a tokenizer, on port 0: token ids equal
 *     `minivllm generate`'s, the event stream's shape, 404 / 405 / 413 (a
 *     chunked body cut at the limit), an idle connection closed after
 *     --timeout, SIGINT -> exit 0.
 *   serve_api (serve/openai.c, in-process): the sampling fields (n, best_of,
 *     penalties, min_p, min_tokens, logprobs / top_logprobs), each bad value a
 *     400 naming it; the logprobs in OpenAI's shapes, -inf written -9999.0,
 *     usage counting a prompt once for its n choices; token strings and raw
 *     bytes with the real tokenizer (MV_QWEN3_DIR).
 *   n > 1 over the socket: choice j with seed s is a lone request with seed s + j.
 *   tests/serve/openai_client_test.py: the real `openai` client against it
 *     (completions, chat, streaming, usage, errors, 503, a disconnect freeing
 *     its blocks, the drain); skipped, saying why, without MV_QWEN3_DIR or the
 *     openai module (tests/requirements.txt; CI installs it).
 *   tests/serve/bench_serve_test.py: the serving benchmark
 *     (tests/serve/bench_serve.py, standard library only, so never skipped)
 *     against it at a finite request rate and at inf: every request
 *     completes, the tokens are minivllm bench's, the figures consistent;
 *     no server and an unknown model exit 1. The streamed-text half needs
 *     MV_QWEN3_DIR (it says SKIP for that half without it).
 *
 * Run: make test  (or build/tests/test_serve after make)
 */
#include <arpa/inet.h>
#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "chapters/08-scheduler/sched/scheduler.h"
#include "chapters/09-engine/runtime/engine.h"
#include "chapters/09-engine/serve/openai.h"
#include "common/check.h"
#include "tests/helpers.h"

static const char *TINY = "tests/data/tiny-qwen3-tied";

// ---- scheduler_abort -------------------------------------------------------------------

Test(scheduler_abort, frees_a_running_and_a_waiting_request) {
    scheduler_t s;
    // 1 row: the second request waits.
    scheduler_config_t c = {1, 64, 64, 4, 16, 1, {0}, 0};
    cr_assert_eq(scheduler_init(&s, &c), 0, "%s", mv_last_error());
    int32_t p[10] = {5, 6, 7, 8, 9, 10, 11, 12, 13, 14};
    sampling_params_t sp = {.temperature = 0, .top_k = 0, .top_p = 1, .max_tokens = 20, .ignore_eos = 1};
    int64_t a, b;
    int marker;
    cr_assert_eq(scheduler_add_request_user(&s, p, 10, &sp, &marker, &a, NULL), 0);
    cr_assert_eq(scheduler_add_request(&s, p, 6, &sp, &b, NULL), 0);
    const sched_step_t *st;
    cr_assert_eq(scheduler_schedule(&s, &st), 0);
    cr_expect_eq(st->num_seqs, 1);
    cr_expect_eq(st->seqs[0]->user, &marker, "the caller's pointer rides on the sequence");
    cr_expect_eq(scheduler_abort(&s, a), -1, "no abort while a step is in flight");
    int32_t tok = 1;
    cr_assert_eq(scheduler_postprocess(&s, &tok), 0);
    cr_expect_lt(s.bm.num_free, 16, "the running request holds blocks");
    cr_expect_eq(scheduler_abort(&s, a), 0, "%s", mv_last_error());
    cr_expect_eq(s.bm.num_free, 16, "its blocks are free at once");
    cr_expect_eq(s.num_running, 0);
    cr_expect_eq(scheduler_check_invariants(&s), 0, "%s", mv_last_error());
    sequence_t *q = scheduler_pop_finished(&s);
    cr_assert_not_null(q);
    cr_expect_eq(q->finish_reason, FINISH_ABORTED);
    cr_expect_eq(sequence_num_generated(q), 1, "it keeps the token it had");
    cr_expect_str_eq(finish_reason_name(q->finish_reason), "aborted");
    sequence_free(q);
    // The waiting one leaves the queue; an unknown id is 1.
    cr_expect_eq(scheduler_abort(&s, b), 0);
    cr_expect_eq(s.num_waiting, 0);
    cr_expect_eq(scheduler_abort(&s, b), 1);
    cr_expect_eq(scheduler_abort(&s, 999), 1);
    sequence_free(scheduler_pop_finished(&s));
    cr_expect_eq(scheduler_num_unfinished(&s), 0);
    cr_expect_eq(s.num_aborted, 2);
    scheduler_free(&s);
}

// ---- engine_core -------------------------------------------------------------------------

typedef struct {
    int tokens[4];         // on_token calls per request
    int finished[4];
    engine_output_t out[4];
    int stop_flags[4];     // on_token's stop = 1 seen
} core_log_t;

static void log_token(void *ctx, void *user, int32_t token, int stop, const engine_logprob_t *lp) {
    core_log_t *l = ctx;
    const int i = (int)(intptr_t)user;
    (void)token;
    l->tokens[i]++;
    l->stop_flags[i] += stop;
}

static int log_finished(void *ctx, void *user, engine_output_t *o) {
    core_log_t *l = ctx;
    const int i = (int)(intptr_t)user;
    l->finished[i]++;
    l->out[i] = *o;
    return 0;
}

static engine_t *tiny_engine(void) {
    engine_config_t ec = engine_config_default(TINY);
    ec.device = RUNNER_DEVICE_CPU;
    ec.num_threads = 1;
    engine_t *e;
    cr_assert_eq(engine_create(&ec, &e), 0, "%s", mv_last_error());
    return e;
}

Test(engine_core, late_requests_abort_and_stop_token_ids) {
    engine_t *e = tiny_engine();
    const int32_t prompt[] = {431, 173, 170, 322, 319, 246, 264, 420};
    const engine_request_t r = {prompt, 8, {.temperature = 0, .top_p = 1, .max_tokens = 12, .ignore_eos = 1}, 0};
    engine_output_t alone;
    cr_assert_eq(engine_run(e, &r, 1, &alone, NULL), 0, "%s", mv_last_error());
    cr_assert_eq(alone.num_tokens, 12);

    core_log_t log = {0};
    const engine_core_hooks_t hooks = {log_token, log_finished, NULL, &log};
    engine_core_t *c;
    cr_assert_eq(engine_core_create(e, &hooks, &c), 0, "%s", mv_last_error());
    int64_t id0, id1, id2;
    cr_assert_eq(engine_core_add(c, &r, NULL, (void *)0, &id0), 0);
    for (int k = 0; k < 3; k++) cr_assert_eq(engine_core_step(c), 0, "%s", mv_last_error());
    // Joins the running batch after three steps; the same greedy tokens.
    cr_assert_eq(engine_core_add(c, &r, NULL, (void *)1, &id1), 0);
    // A third, long one, aborted while it runs.
    const engine_request_t longer = {prompt, 8, {.temperature = 0, .top_p = 1, .max_tokens = 400, .ignore_eos = 1}, 0};
    cr_assert_eq(engine_core_add(c, &longer, NULL, (void *)2, &id2), 0);
    cr_assert_eq(engine_core_step(c), 0);
    engine_core_stats_t st;
    engine_core_stats(c, &st);
    cr_expect_eq(st.num_running, 3);
    const int free_before = st.num_free_blocks;
    cr_assert_eq(engine_core_abort(c, id2), 0, "%s", mv_last_error());
    engine_core_stats(c, &st);
    cr_expect_gt(st.num_free_blocks, free_before, "the aborted request's blocks are free at once");
    cr_expect_eq(log.finished[2], 1);
    cr_expect_eq(log.out[2].finish_reason, FINISH_ABORTED);
    cr_expect_str_eq(engine_output_finish_reason(&log.out[2]), "abort");
    cr_expect_eq(engine_core_abort(c, id2), 1, "aborting twice is 'already finished'");
    while (engine_core_num_unfinished(c) > 0) cr_assert_eq(engine_core_step(c), 0, "%s", mv_last_error());
    for (int i = 0; i < 2; i++) {
        cr_expect_eq(log.finished[i], 1);
        cr_expect_eq(log.tokens[i], 12, "request %d: one on_token per token", i);
        cr_assert_eq(log.out[i].num_tokens, 12);
        cr_expect_eq(memcmp(log.out[i].token_ids, alone.token_ids, 12 * sizeof(int32_t)), 0,
                     "request %d: the tokens of engine_run alone", i);
        cr_expect_eq(log.out[i].num_prompt_tokens, 8);
    }
    engine_core_stats(c, &st);
    cr_expect_eq(st.num_free_blocks, st.num_blocks, "every block is free at the end");
    cr_expect_eq(st.num_aborted, 1);

    // stop_token_ids: the 5th greedy token ends it as a stop, kept in the ids.
    const int32_t stop_id = alone.token_ids[4];
    int first = 0;
    while (alone.token_ids[first] != stop_id) first++;
    const engine_stop_t stop = {.ids = &stop_id, .n = 1};
    cr_assert_eq(engine_core_add(c, &r, &stop, (void *)3, NULL), 0);
    while (engine_core_num_unfinished(c) > 0) cr_assert_eq(engine_core_step(c), 0);
    cr_expect_eq(log.out[3].num_tokens, first + 1);
    cr_expect_eq(log.out[3].finish_reason, FINISH_EOS);
    cr_expect_eq(log.out[3].stop_token_id, stop_id);
    cr_expect_eq(log.stop_flags[3], 1, "on_token says the last token was a stop");
    const int32_t bad = 512;
    const engine_stop_t bad_stop = {.ids = &bad, .n = 1};
    cr_expect_eq(engine_core_add(c, &r, &bad_stop, NULL, NULL), -1, "a stop id outside the vocabulary");
    for (int i = 0; i < 4; i++) engine_outputs_free(&log.out[i], 1);
    engine_outputs_free(&alone, 1);
    engine_core_free(c);
    engine_free(e);
}

// ---- the server over a socket --------------------------------------------------------------

typedef struct {
    pid_t pid;
    int port;
    FILE *out;
} server_t;

// Start build/minivllm serve --port 0 and read its "serving on" line.
static server_t start_server(const char *extra) {
    server_t s = {0};
    int fd[2];
    cr_assert_eq(pipe(fd), 0);
    s.pid = fork();
    cr_assert_geq(s.pid, 0);
    if (s.pid == 0) {
        dup2(fd[1], STDOUT_FILENO);
        // Nothing else of this process goes with the server (Criterion's own
        // pipes among them: a server holding them confuses its runner).
        for (int k = STDERR_FILENO + 1; k < 1024; k++) close(k);
        char cmd[1024];
        snprintf(cmd, sizeof cmd, "exec ./%s/minivllm serve --model %s --device cpu --port 0 %s", MV_BUILD_DIR, TINY,
                 extra);
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    close(fd[1]);
    s.out = fdopen(fd[0], "r");
    char line[256] = "";
    cr_assert_not_null(fgets(line, sizeof line, s.out), "serve printed nothing");
    cr_assert_eq(sscanf(line, "serving on http://127.0.0.1:%d", &s.port), 1, "%s", line);
    return s;
}

static int stop_server(server_t *s, int sig) {
    kill(s->pid, sig);
    int st = 0;
    for (int i = 0; i < 2000; i++) {
        if (waitpid(s->pid, &st, WNOHANG) == s->pid) {
            fclose(s->out);
            return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        }
        usleep(10000);
    }
    kill(s->pid, SIGKILL);
    waitpid(s->pid, &st, 0);
    fclose(s->out);
    return -1;
}

static int connect_to(int port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    cr_assert_eq(connect(fd, (struct sockaddr *)&a, sizeof a), 0, "connect: %s", strerror(errno));
    return fd;
}

static void send_all(int fd, const char *s, size_t n) {
    while (n > 0) {
        ssize_t w = send(fd, s, n, MSG_NOSIGNAL);
        if (w <= 0) return;  // the server may close early (a 413): what it answered is read next
        s += w, n -= (size_t)w;
    }
}

// Everything until the server closes (Connection: close), NUL-terminated; its length.
static size_t read_all(int fd, char *buf, size_t cap) {
    size_t n = 0;
    ssize_t r;
    while (n + 1 < cap && (r = recv(fd, buf + n, cap - 1 - n, 0)) > 0) n += (size_t)r;
    buf[n] = '\0';
    return n;
}

// One request on its own connection; the whole answer (status line, headers, body).
static int http(int port, const char *method, const char *path, const char *body, char *out, size_t cap) {
    int fd = connect_to(port);
    char head[512];
    int n = snprintf(head, sizeof head,
                     "%s %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\n"
                     "Content-Length: %zu\r\n\r\n",
                     method, path, body ? strlen(body) : 0);
    send_all(fd, head, (size_t)n);
    if (body) send_all(fd, body, strlen(body));
    read_all(fd, out, cap);
    close(fd);
    int status = 0;
    sscanf(out, "HTTP/1.%*d %d", &status);
    return status;
}

static const char *body_of(const char *resp) {
    const char *b = strstr(resp, "\r\n\r\n");
    return b ? b + 4 : "";
}

// Greedy ids of `minivllm generate` for a token-id prompt.
static int generate_ids(const char *line, int32_t *ids, int cap) {
    char cmd[1024], out[8192];
    snprintf(cmd, sizeof cmd, "echo '%s' | ./%s/minivllm generate --model %s --device cpu --input - --output -",
             line, MV_BUILD_DIR, TINY);
    cr_assert_eq(run_command(cmd, out, sizeof out), 0, "%s", out);
    cJSON *o = cJSON_Parse(out);
    cr_assert_not_null(o, "%s", out);
    int n = 0;
    for (cJSON *v = cJSON_GetObjectItem(o, "token_ids")->child; v && n < cap; v = v->next) ids[n++] = v->valueint;
    cJSON_Delete(o);
    return n;
}

Test(serve_socket, completions_stream_errors_timeout_and_sigint, .timeout = 60) {
    server_t s = start_server("--timeout 1 --max-body-bytes 2048");
    static char resp[1 << 16];
    // Non-streaming: the ids of generate, the usage.
    int32_t want[32];
    int nw = generate_ids("{\"prompt_token_ids\": [40, 63], \"max_tokens\": 12, \"temperature\": 0}", want, 32);
    cr_assert_gt(nw, 0);
    int st = http(s.port, "POST", "/v1/completions",
                  "{\"prompt\": [40, 63], \"max_tokens\": 12, \"temperature\": 0, \"return_token_ids\": true}", resp,
                  sizeof resp);
    cr_assert_eq(st, 200, "%s", resp);
    cJSON *o = cJSON_Parse(body_of(resp));
    cr_assert_not_null(o, "%s", resp);
    cJSON *ch = cJSON_GetArrayItem(cJSON_GetObjectItem(o, "choices"), 0);
    cJSON *ids = cJSON_GetObjectItem(ch, "token_ids");
    cr_assert_eq(cJSON_GetArraySize(ids), nw, "%s", resp);
    for (int i = 0; i < nw; i++) cr_expect_eq(cJSON_GetArrayItem(ids, i)->valueint, want[i], "token %d", i);
    cr_expect_str_eq(cJSON_GetObjectItem(ch, "finish_reason")->valuestring, nw < 12 ? "stop" : "length");
    cJSON *u = cJSON_GetObjectItem(o, "usage");
    cr_expect_eq(cJSON_GetObjectItem(u, "prompt_tokens")->valueint, 2);
    cr_expect_eq(cJSON_GetObjectItem(u, "completion_tokens")->valueint, nw);
    cr_expect_eq(cJSON_GetObjectItem(u, "total_tokens")->valueint, nw + 2);
    cJSON_Delete(o);

    // Streaming: an event per token, finish_reason in the last chunk, then [DONE].
    st = http(s.port, "POST", "/v1/completions",
              "{\"prompt\": [40, 63], \"max_tokens\": 12, \"temperature\": 0, \"stream\": true, "
              "\"stream_options\": {\"include_usage\": true}}",
              resp, sizeof resp);
    cr_assert_eq(st, 200, "%s", resp);
    cr_expect(strstr(resp, "Content-Type: text/event-stream") != NULL, "%s", resp);
    int events = 0, finishes = 0, usage = 0;
    for (const char *p = resp; (p = strstr(p, "data: ")); p += 6) {
        events++;
        finishes += strncmp(p, "data: {", 7) == 0 && strstr(p, "\"finish_reason\":\"") &&
                    strstr(p, "\"finish_reason\":\"") < strstr(p, "\n\n");
        usage += strncmp(p, "data: {", 7) == 0 && strstr(p, "\"choices\":[]") &&
                 strstr(p, "\"choices\":[]") < strstr(p, "\n\n");
    }
    // No tokenizer: no text, so one event carries the end only (finish), one the usage, one [DONE].
    cr_expect_eq(finishes, 1, "%s", resp);
    cr_expect_eq(usage, 1, "%s", resp);
    cr_expect_geq(events, 3, "%s", resp);
    cr_expect(strstr(resp, "data: [DONE]\n\n") != NULL, "%s", resp);

    // Errors, in OpenAI's schema.
    st = http(s.port, "POST", "/v1/completions", "{\"prompt\": \"text\"}", resp, sizeof resp);
    cr_expect_eq(st, 400, "a text prompt without a tokenizer: %s", resp);
    cr_expect(strstr(body_of(resp), "\"error\":{\"message\":") != NULL, "%s", resp);
    cr_expect(strstr(body_of(resp), "\"param\":\"prompt\"") != NULL, "%s", resp);
    // Stop strings are matched on the text: without a tokenizer, refused by name.
    st = http(s.port, "POST", "/v1/completions", "{\"prompt\": [1], \"stop\": [\"ab\"]}", resp, sizeof resp);
    cr_expect(st == 400 && strstr(body_of(resp), "\"param\":\"stop\"") && strstr(resp, "no tokenizer.json"), "%s",
              resp);
    st = http(s.port, "POST", "/v1/completions", "{\"prompt\": [1], \"top_p\": 0}", resp, sizeof resp);
    cr_expect_eq(st, 400, "%s", resp);
    cr_expect(strstr(body_of(resp), "\"param\":\"top_p\"") != NULL, "%s", resp);
    st = http(s.port, "POST", "/v1/completions", "{\"prompt\": [1], \"logit_bias\": {\"5\": 1}}", resp, sizeof resp);
    cr_expect(st == 400 && strstr(resp, "not supported yet: logit_bias"), "%s", resp);
    st = http(s.port, "POST", "/v1/completions", "{\"prompt\": [1], \"logit_bias\": {}, \"echo\": false}", resp,
              sizeof resp);
    cr_expect_eq(st, 200, "the values of unsupported fields that mean off are accepted: %s", resp);
    st = http(s.port, "POST", "/v1/completions", "{\"prompt\": [1], \"prompt\": [2]}", resp, sizeof resp);
    cr_expect_eq(st, 400, "a key twice: %s", resp);
    st = http(s.port, "POST", "/v1/completions", "{\"prompt\": [1]", resp, sizeof resp);
    cr_expect_eq(st, 400, "bad JSON: %s", resp);
    st = http(s.port, "GET", "/v2/x", NULL, resp, sizeof resp);
    cr_expect_eq(st, 404, "%s", resp);
    st = http(s.port, "DELETE", "/v1/models", NULL, resp, sizeof resp);
    cr_expect_eq(st, 405, "%s", resp);
    cr_expect(strstr(resp, "Allow: GET") != NULL, "%s", resp);
    // 413: a Content-Length over the limit, and a chunked body (no length) cut at the limit.
    static char big[4096];
    memset(big, ' ', sizeof big - 1);
    st = http(s.port, "POST", "/v1/completions", big, resp, sizeof resp);
    cr_expect_eq(st, 413, "%s", resp);
    int fd = connect_to(s.port);
    const char *head = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nTransfer-Encoding: chunked\r\n\r\n";
    send_all(fd, head, strlen(head));
    for (int k = 0; k < 4; k++) {
        char chunk[1100];
        int n = snprintf(chunk, sizeof chunk, "3e8\r\n%1000s\r\n", "");
        send_all(fd, chunk, (size_t)n);
    }
    send_all(fd, "0\r\n\r\n", 5);
    read_all(fd, resp, sizeof resp);
    close(fd);
    cr_expect(strncmp(resp, "HTTP/1.1 413", 12) == 0, "a chunked body over the limit: %s", resp);
    // The endpoints that are not generation.
    st = http(s.port, "GET", "/health", NULL, resp, sizeof resp);
    cr_expect_eq(st, 200);
    st = http(s.port, "GET", "/metrics", NULL, resp, sizeof resp);
    cr_expect(st == 200 && strstr(resp, "minivllm:kv_cache_blocks_used 0\n") &&
                  strstr(resp, "minivllm:time_to_first_token_seconds_count 3\n") &&
                  strstr(resp, "minivllm:generation_tokens_total "),
              "%s", resp);

    // An idle connection is closed after --timeout (1 s).
    fd = connect_to(s.port);
    struct pollfd p = {.fd = fd, .events = POLLIN};
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int ready = poll(&p, 1, 5000);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    char c;
    cr_expect(ready == 1 && recv(fd, &c, 1, 0) == 0, "the idle connection was not closed");
    double waited = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    cr_expect(waited > 0.5 && waited < 4, "closed after %.2f s", waited);
    close(fd);

    cr_expect_eq(stop_server(&s, SIGINT), 0, "SIGINT: drain and exit 0");
}

// ---- openai.c in-process: the sampling fields, n, and the logprobs' JSON ----------------------

// The tiny checkpoint as the server sees it, without a tokenizer (text is refused).
static api_context_t tiny_api(void) {
    return (api_context_t){.served_model_name = "tiny", .vocab_size = 512, .max_model_len = 512,
                           .defaults = {.temperature = 0.6f, .top_k = 20, .top_p = 0.95f}};
}

static int parse_body(api_kind_t kind, const char *body, api_request_t *r, api_error_t *err) {
    const api_context_t ctx = tiny_api();
    return api_parse_request(kind, body, strlen(body), &ctx, r, err);
}

Test(serve_api, the_sampling_fields_and_their_ranges) {
    api_request_t r;
    api_error_t err;
    cr_assert_eq(parse_body(API_COMPLETIONS,
                            "{\"prompt\": [[1, 2], [3]], \"max_tokens\": 8, \"n\": 3, \"best_of\": 3, \"seed\": 9,"
                            " \"presence_penalty\": -1.5, \"frequency_penalty\": 2, \"repetition_penalty\": 1.25,"
                            " \"min_p\": 0.125, \"min_tokens\": 8, \"logprobs\": 5}",
                            &r, &err),
                 0, "%s", err.message);
    cr_expect_eq(r.n, 3);
    cr_expect_eq(api_num_choices(&r), 6, "two prompts x n = 3");
    cr_expect(r.has_seed && r.seed == 9);
    cr_expect_eq(r.params.presence_penalty, -1.5f);
    cr_expect_eq(r.params.frequency_penalty, 2.0f);
    cr_expect_eq(r.params.repetition_penalty, 1.25f);
    cr_expect_eq(r.params.min_p, 0.125f);
    cr_expect_eq(r.params.min_tokens, 8);
    cr_expect(r.params.logprobs == 1 && r.params.top_logprobs == 5, "completions' logprobs 5: the sampled + 5");
    api_request_free(&r);
    cr_assert_eq(parse_body(API_COMPLETIONS,
                            "{\"prompt\": [1], \"n\": 1, \"best_of\": null, \"presence_penalty\": 0,"
                            " \"logprobs\": 0, \"echo\": false, \"min_tokens\": 0}",
                            &r, &err),
                 0, "%s", err.message);
    cr_expect(r.n == 1 && r.params.logprobs == 1 && r.params.top_logprobs == 0, "logprobs 0: the sampled token's");
    api_request_free(&r);
    // Each bad value: a 400 naming its field.
    static const struct {
        api_kind_t kind;
        const char *body, *param;
    } BAD[] = {
        {API_COMPLETIONS, "{\"prompt\": [1], \"n\": 0}", "n"},
        {API_COMPLETIONS, "{\"prompt\": [1], \"n\": 129}", "n"},
        {API_COMPLETIONS, "{\"prompt\": [1], \"n\": 2.5}", "n"},
        {API_COMPLETIONS, "{\"prompt\": [1], \"n\": 2, \"temperature\": 0}", "n"},  // vLLM: greedy needs n = 1
        {API_COMPLETIONS, "{\"prompt\": [1], \"best_of\": 2}", "best_of"},
        {API_COMPLETIONS, "{\"prompt\": [1], \"presence_penalty\": 2.5}", "presence_penalty"},
        {API_COMPLETIONS, "{\"prompt\": [1], \"presence_penalty\": \"1\"}", "presence_penalty"},
        {API_COMPLETIONS, "{\"prompt\": [1], \"frequency_penalty\": -2.01}", "frequency_penalty"},
        {API_COMPLETIONS, "{\"prompt\": [1], \"repetition_penalty\": 0}", "repetition_penalty"},
        {API_COMPLETIONS, "{\"prompt\": [1], \"repetition_penalty\": -1}", "repetition_penalty"},
        {API_COMPLETIONS, "{\"prompt\": [1], \"repetition_penalty\": 1e999}", "repetition_penalty"},
        {API_COMPLETIONS, "{\"prompt\": [1], \"min_p\": 1.01}", "min_p"},
        {API_COMPLETIONS, "{\"prompt\": [1], \"min_p\": -0.1}", "min_p"},
        {API_COMPLETIONS, "{\"prompt\": [1], \"min_tokens\": -1}", "min_tokens"},
        {API_COMPLETIONS, "{\"prompt\": [1], \"min_tokens\": 1.5}", "min_tokens"},
        {API_COMPLETIONS, "{\"prompt\": [1], \"min_tokens\": 17}", "min_tokens"},  // > the default max_tokens 16
        {API_COMPLETIONS, "{\"prompt\": [1], \"max_tokens\": 4, \"min_tokens\": 5}", "min_tokens"},
        {API_COMPLETIONS, "{\"prompt\": [1], \"logprobs\": 21}", "logprobs"},
        {API_COMPLETIONS, "{\"prompt\": [1], \"logprobs\": -1}", "logprobs"},
        {API_COMPLETIONS, "{\"prompt\": [1], \"logprobs\": true}", "logprobs"},
        {API_COMPLETIONS, "{\"prompt\": [1], \"top_logprobs\": 2}", "top_logprobs"},  // chat's field
        {API_COMPLETIONS, "{\"prompt\": [1], \"prompt_logprobs\": 1}", "prompt_logprobs"},
        {API_COMPLETIONS, "{\"prompt\": [1], \"echo\": true}", "echo"},
        {API_CHAT, "{\"messages\": [], \"logprobs\": 1}", "logprobs"},
        {API_CHAT, "{\"messages\": [], \"top_logprobs\": 2}", "top_logprobs"},
        {API_CHAT, "{\"messages\": [], \"logprobs\": true, \"top_logprobs\": 21}", "top_logprobs"},
    };
    for (size_t k = 0; k < sizeof BAD / sizeof *BAD; k++) {
        const int rc = parse_body(BAD[k].kind, BAD[k].body, &r, &err);
        cr_expect(rc == -1 && err.status == 400 && !strcmp(err.param, BAD[k].param), "%s: %d %s (%s)", BAD[k].body,
                  err.status, err.param, err.message);
        api_request_free(&r);
    }
}

// A finished choice of two tokens, by hand: the second one's logprob -inf (as
// a masked id has), its second top entry missing (fewer ids than asked).
Test(serve_api, logprobs_in_openais_shapes_and_no_inf) {
    const api_context_t ctx = tiny_api();
    engine_logprob_t lps[2] = {{-0.25f, 2, {7, 9}, {-0.25f, -1.5f}}, {-INFINITY, 2, {3, -1}, {-0.5f, -INFINITY}}};
    int32_t ids[2] = {7, 11}, prompt[2] = {1, 2};
    engine_output_t o = {.token_ids = ids, .num_tokens = 2, .finish_reason = FINISH_MAX_TOKENS, .stop_token_id = -1,
                         .num_prompt_tokens = 2, .logprobs = lps};
    api_choice_t ch[2] = {{&o, prompt, 2}, {&o, prompt, 2}};
    api_request_t r;
    api_error_t err;
    cr_assert_eq(parse_body(API_COMPLETIONS, "{\"prompt\": [1, 2], \"logprobs\": 2, \"max_tokens\": 2}", &r, &err), 0,
                 "%s", err.message);
    r.n = 2;  // two choices of one prompt: its tokens count once in usage
    tok_bytes_t b = {0};
    cr_assert_eq(api_response_json(&r, &ctx, "cmpl-x", 1, ch, 2, &b), 0);
    cr_expect(!strstr(b.data, "inf") && !strstr(b.data, "nan") && strstr(b.data, "-9999.0"), "%s", b.data);
    cJSON *j = cJSON_Parse(b.data);
    cr_assert_not_null(j, "%s", b.data);
    const cJSON *lp = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 1), "logprobs");
    char *got = cJSON_PrintUnformatted(lp);
    // The sampled token first in its map (7 once), the missing id left out, offsets in characters.
    cr_expect_str_eq(got, "{\"tokens\":[\"token_id:7\",\"token_id:11\"],\"token_logprobs\":[-0.25,-9999],"
                          "\"top_logprobs\":[{\"token_id:7\":-0.25,\"token_id:9\":-1.5},"
                          "{\"token_id:11\":-9999,\"token_id:3\":-0.5}],\"text_offset\":[0,10]}");
    free(got);
    const cJSON *usage = cJSON_GetObjectItem(j, "usage");
    cr_expect_eq(cJSON_GetObjectItem(usage, "prompt_tokens")->valueint, 2, "n = 2: the prompt counted once");
    cr_expect_eq(cJSON_GetObjectItem(usage, "completion_tokens")->valueint, 4);
    cJSON_Delete(j);
    // A stream chunk of the second token: its text_offset goes on from 10.
    int offset = 10;
    const api_logprobs_t one = {ids + 1, lps + 1, 1, &offset};
    b.len = 0;
    cr_assert_eq(api_chunk_text(&r, &ctx, "cmpl-x", 1, 0, "", 0, &one, NULL, &b), 0);
    cr_expect(strstr(b.data, "\"text_offset\":[10]") && offset == 21, "%d %s", offset, b.data);
    // Chat's shape (the request made by hand: a chat body needs a tokenizer).
    r.kind = API_CHAT;
    r.params.top_logprobs = 2;
    b.len = 0;
    cr_assert_eq(api_response_json(&r, &ctx, "chatcmpl-x", 1, ch, 1, &b), 0);
    cr_expect(!strstr(b.data, "inf") && !strstr(b.data, "nan"), "%s", b.data);
    j = cJSON_Parse(b.data);
    cr_assert_not_null(j, "%s", b.data);
    lp = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0), "logprobs");
    got = cJSON_PrintUnformatted(lp);
    cr_expect_str_eq(got, "{\"content\":[{\"token\":\"token_id:7\",\"logprob\":-0.25,\"bytes\":null,\"top_logprobs\":["
                          "{\"token\":\"token_id:7\",\"logprob\":-0.25,\"bytes\":null},"
                          "{\"token\":\"token_id:9\",\"logprob\":-1.5,\"bytes\":null}]},"
                          "{\"token\":\"token_id:11\",\"logprob\":-9999,\"bytes\":null,\"top_logprobs\":["
                          "{\"token\":\"token_id:3\",\"logprob\":-0.5,\"bytes\":null}]}]}");
    free(got);
    cJSON_Delete(j);
    // Without logprobs: null.
    r.params.logprobs = 0;
    b.len = 0;
    cr_assert_eq(api_response_json(&r, &ctx, "chatcmpl-x", 1, ch, 1, &b), 0);
    cr_expect(strstr(b.data, "\"logprobs\":null") != NULL, "%s", b.data);
    tok_bytes_free(&b);
    api_request_free(&r);
}

// With a tokenizer (the real Qwen3 one, MV_QWEN3_DIR): token strings are the
// id decoded alone, special tokens kept; chat's bytes are the raw bytes, also
// of a token that is half a UTF-8 character (its string U+FFFD).
Test(serve_api, logprobs_token_strings_and_bytes) {
    const char *qwen = qwen3_dir_or_skip("the logprobs token strings test");
    tokenizer_t *tok = tokenizer_load(qwen);
    cr_assert_not_null(tok, "%s", mv_last_error());
    api_context_t ctx = tiny_api();
    ctx.tokenizer = tok;
    ctx.vocab_size = tokenizer_n_ids(tok);
    // "é" is C3 A9; byte-level ids 0..255 hold single bytes: find C3's token by its bytes.
    int32_t half = -1;
    for (int32_t id = 0; id < 256 && half < 0; id++) {
        const char *p;
        size_t n;
        if (!tokenizer_token_bytes(tok, id, &p, &n) && n == 1 && (unsigned char)p[0] == 0xC3) half = id;
    }
    cr_assert_geq(half, 0, "no token for the byte C3");
    const int32_t im_end = tokenizer_token_id(tok, "<|im_end|>");
    cr_assert_geq(im_end, 0);
    engine_logprob_t lps[2] = {{-1.0f, 0, {0}, {0}}, {-2.0f, 0, {0}, {0}}};
    int32_t ids[2] = {half, im_end}, prompt[1] = {1};
    engine_output_t o = {.token_ids = ids, .num_tokens = 2, .finish_reason = FINISH_MAX_TOKENS, .stop_token_id = -1,
                         .num_prompt_tokens = 1, .logprobs = lps};
    const api_choice_t ch = {&o, prompt, 1};
    api_request_t r = {.kind = API_CHAT, .n = 1, .skip_special_tokens = 1, .params = {.logprobs = 1}};
    tok_bytes_t b = {0};
    cr_assert_eq(api_response_json(&r, &ctx, "chatcmpl-x", 1, &ch, 1, &b), 0);
    cr_expect(strstr(b.data, "{\"token\":\"\xEF\xBF\xBD\",\"logprob\":-1,\"bytes\":[195]") != NULL, "%s", b.data);
    cr_expect(strstr(b.data, "{\"token\":\"<|im_end|>\",\"logprob\":-2,\"bytes\":[60,124,105,109,95,101,110,100,124,62]")
                  != NULL,
              "skip_special_tokens leaves the logprobs' tokens alone: %s", b.data);
    tok_bytes_free(&b);
    tokenizer_free(tok);
}

// n > 1 over the socket: choice j with "seed" s draws what a lone request with seed s + j draws.
Test(serve_socket, n_choices_draw_with_seed_plus_j) {
    server_t s = start_server("");
    static char resp[1 << 16];
    const char *fmt = "{\"prompt\": [431, 173, 170, 322], \"max_tokens\": 6, \"temperature\": 5, \"top_p\": 1,"
                      " \"top_k\": 0, \"ignore_eos\": true, \"return_token_ids\": true, \"seed\": %d, \"n\": %d}";
    char body[512];
    snprintf(body, sizeof body, fmt, 5, 3);
    cr_assert_eq(http(s.port, "POST", "/v1/completions", body, resp, sizeof resp), 200, "%s", resp);
    cJSON *all = cJSON_Parse(body_of(resp));
    cr_assert_not_null(all, "%s", resp);
    const cJSON *choices = cJSON_GetObjectItem(all, "choices");
    cr_assert_eq(cJSON_GetArraySize(choices), 3, "%s", resp);
    char *first = NULL;
    int differ = 0;
    for (int k = 0; k < 3; k++) {
        const cJSON *c = cJSON_GetArrayItem(choices, k);
        cr_expect_eq(cJSON_GetObjectItem(c, "index")->valueint, k);
        char *ids = cJSON_PrintUnformatted(cJSON_GetObjectItem(c, "token_ids"));
        snprintf(body, sizeof body, fmt, 5 + k, 1);
        cr_assert_eq(http(s.port, "POST", "/v1/completions", body, resp, sizeof resp), 200, "%s", resp);
        cJSON *one = cJSON_Parse(body_of(resp));
        char *want = cJSON_PrintUnformatted(cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(one, "choices"), 0),
                                                                "token_ids"));
        cr_expect_str_eq(ids, want, "choice %d of seed 5 is seed %d's", k, 5 + k);
        if (!first) first = strdup(ids);
        else differ |= strcmp(first, ids) != 0;
        free(want);
        free(ids);
        cJSON_Delete(one);
    }
    cr_expect(differ, "the three choices drew the same tokens");
    const cJSON *usage = cJSON_GetObjectItem(all, "usage");
    cr_expect_eq(cJSON_GetObjectItem(usage, "prompt_tokens")->valueint, 4, "the prompt counted once");
    cr_expect_eq(cJSON_GetObjectItem(usage, "completion_tokens")->valueint, 18);
    free(first);
    cJSON_Delete(all);
    cr_expect_eq(stop_server(&s, SIGTERM), 0);
}

// The real openai client, in Python (tests/serve/openai_client_test.py).
// No .timeout here: the script bounds its own waits (20 s each), and under
// ASan libcriterion 2.4 leaks 48 bytes when two .timeout tests run at once.
Test(serve_openai, the_openai_python_client) {
    const char *qwen = qwen3_dir_or_skip("the openai client test of minivllm serve");
    char cmd[1024], out[1 << 16];
    snprintf(cmd, sizeof cmd, "python3 tests/serve/openai_client_test.py --minivllm ./%s/minivllm --qwen '%s' 2>&1",
             MV_BUILD_DIR, qwen);
    int st = run_command(cmd, out, sizeof out);
    if (st == 77) {
        fprintf(stderr, "SKIP: %s", out);
        cr_skip_test("python3 has no openai module");
    }
    cr_expect_eq(st, 0, "tests/serve/openai_client_test.py failed:\n%s", out);
}

// The serving benchmark, in Python (tests/serve/bench_serve_test.py runs
// tests/serve/bench_serve.py against servers of its own; MV_QWEN3_DIR, when
// set, is read from the environment). No .timeout, as above: the script
// bounds its waits (20 s a byte, 120 s a run).
Test(serve_bench, bench_serve_py_against_the_server) {
    char cmd[1024], out[1 << 16];
    snprintf(cmd, sizeof cmd, "python3 tests/serve/bench_serve_test.py --minivllm ./%s/minivllm 2>&1", MV_BUILD_DIR);
    int st = run_command(cmd, out, sizeof out);
    cr_expect_eq(st, 0, "tests/serve/bench_serve_test.py failed:\n%s", out);
}

// Only the program links the HTTP library: no chapter, no test binary (Makefile, SERVE_LDLIBS).
Test(serve_layering, only_minivllm_links_libmicrohttpd) {
    char cmd[512], out[16384];
    snprintf(cmd, sizeof cmd, "ldd ./%s/minivllm 2>&1", MV_BUILD_DIR);
    cr_assert_eq(run_command(cmd, out, sizeof out), 0, "%s", out);
    cr_expect(strstr(out, "libmicrohttpd") != NULL, "build/minivllm does not link libmicrohttpd:\n%s", out);
    const char *others[] = {"08-scheduler", "01-activation", "engine_check", "tests/test_serve"};
    for (size_t k = 0; k < sizeof others / sizeof *others; k++) {
        snprintf(cmd, sizeof cmd, "./%s/%s", MV_BUILD_DIR, others[k]);
        // build/engine_check exists in CUDA builds only (make test SANITIZE=1 builds the CPU half).
        if (!strcmp(others[k], "engine_check") && access(cmd, X_OK) != 0) continue;
        snprintf(cmd, sizeof cmd, "ldd ./%s/%s 2>&1", MV_BUILD_DIR, others[k]);
        cr_assert_eq(run_command(cmd, out, sizeof out), 0, "%s", out);
        cr_expect(strstr(out, "libmicrohttpd") == NULL, "%s links libmicrohttpd:\n%s", others[k], out);
    }
}

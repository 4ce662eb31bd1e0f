/*
 * chapters/09-engine/serve/engine_thread.c - the engine thread and its jobs (see engine_thread.h).
 */
#include "chapters/09-engine/serve/engine_thread.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/check.h"

// ---- jobs -----------------------------------------------------------------------------

serve_job_t *serve_job_create(api_request_t *api, const api_context_t *ctx) {
    serve_job_t *j = calloc(1, sizeof *j);
    if (!j) return NULL;
    const int n = api_num_choices(api);
    j->subs = calloc((size_t)(n ? n : 1), sizeof *j->subs);
    if (!j->subs) {
        free(j);
        return NULL;
    }
    pthread_mutex_init(&j->mu, NULL);
    pthread_cond_init(&j->cv, NULL);
    j->api = *api;
    *api = (api_request_t){0};
    j->num_subs = n;
    j->refs = 1;
    for (int i = 0; i < j->num_subs; i++) {
        serve_sub_t *u = &j->subs[i];
        const int p = i / j->api.n, k = i % j->api.n;
        u->job = j;
        u->index = i;
        u->req.prompt = j->api.prompts[p].data;
        u->req.num_prompt = (int)j->api.prompts[p].len;
        u->req.params = j->api.params;
        u->req.params.max_tokens = api_max_tokens(&j->api, ctx, p);
        // vLLM's parallel sampling: the k-th of n draws with seed + k (without
        // has_seed, serve_engine_submit numbers every choice).
        u->req.seed = j->api.seed + (uint64_t)k;
    }
    return j;
}

static void job_free(serve_job_t *j) {
    for (int i = 0; i < j->num_subs; i++) {
        free(j->subs[i].tokens);
        free(j->subs[i].lps);
        engine_outputs_free(&j->subs[i].out, 1);
    }
    free(j->subs);
    api_request_free(&j->api);
    pthread_mutex_destroy(&j->mu);
    pthread_cond_destroy(&j->cv);
    free(j);
}

static void job_ref(serve_job_t *j) {
    pthread_mutex_lock(&j->mu);
    j->refs++;
    pthread_mutex_unlock(&j->mu);
}

void serve_job_release(serve_job_t *j) {
    if (!j) return;
    pthread_mutex_lock(&j->mu);
    int left = --j->refs;
    pthread_mutex_unlock(&j->mu);
    if (left == 0) job_free(j);
}

// Set the job's state (and error), wake its waiters.
static void job_set_state(serve_job_t *j, job_state_t st, const api_error_t *err) {
    pthread_mutex_lock(&j->mu);
    j->state = st;
    if (err) j->error = *err;
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
}

// ---- the engine ---------------------------------------------------------------------------

// Prometheus histogram buckets, in seconds (vLLM's for the same metrics).
static const double TTFT_BUCKETS[] = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25,
                                      0.5,   0.75,  1.0,  2.5,  5.0,  7.5,  10.0, 20.0, 40.0};
static const double TPOT_BUCKETS[] = {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4,
                                      0.5,  0.75,  1.0,  2.5,   5.0, 7.5, 10.0, 20.0, 40.0};
enum { N_BUCKETS = sizeof TTFT_BUCKETS / sizeof *TTFT_BUCKETS };

typedef struct {
    long long counts[N_BUCKETS + 1];  // [i]: observations <= bucket i; the last: all (+Inf)
    double sum;
} histogram_t;

static void histogram_add(histogram_t *h, const double *buckets, double v) {
    for (int i = 0; i < N_BUCKETS; i++) h->counts[i] += v <= buckets[i];
    h->counts[N_BUCKETS]++;
    h->sum += v;
}

struct serve_engine {
    engine_t *e;
    engine_core_t *core;            // the engine thread's alone
    serve_engine_config_t cfg;
    pthread_t thread;
    int started;
    // Guarded by mu:
    pthread_mutex_t mu;
    pthread_cond_t cv;              // the engine thread waits on it for work; drain waits on it for idle
    serve_job_t *queue_head, *queue_tail;  // submitted, not yet taken
    int num_queued;                 // requests (sub-requests) in the queue
    serve_job_t *aborts;            // jobs whose client went away
    long long num_submitted;        // requests numbered so far (the default seeds)
    int draining, abort_all, stopped, idle;
    char failure[512];              // the engine's own failure, "" while it runs
    engine_core_stats_t stats;      // a snapshot after each turn of the loop
    histogram_t ttft, tpot;
    long long finished_by_reason[4];  // stop, length, abort, error
    long long num_rejected_full;      // 503s
    // The engine thread's alone:
    serve_job_t *live;              // running jobs (for abort_all and failures)
};

// ---- the engine core's hooks (on the engine thread) ----------------------------------------

static void on_token(void *ctx, void *user, int32_t token, int stop, const engine_logprob_t *lp) {
    serve_sub_t *u = user;
    serve_job_t *j = u->job;
    pthread_mutex_lock(&j->mu);
    if (u->num_tokens == u->cap) {
        int cap = u->cap ? 2 * u->cap : 64;
        int32_t *t = realloc(u->tokens, (size_t)cap * sizeof *t);
        if (t) u->tokens = t;
        engine_logprob_t *l = lp ? realloc(u->lps, (size_t)cap * sizeof *l) : NULL;
        if (l) u->lps = l;
        if (t && (l || !lp)) u->cap = cap;
    }
    // (A token that found no memory is dropped: the stream misses it, the final output has it.)
    if (u->num_tokens < u->cap) {
        if (lp) u->lps[u->num_tokens] = *lp;
        u->tokens[u->num_tokens++] = token;
    }
    u->last_is_stop = stop;
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
}

static void live_remove(serve_engine_t *s, serve_job_t *j) {
    if (j->live_prev) j->live_prev->live_next = j->live_next;
    else if (s->live == j) s->live = j->live_next;
    if (j->live_next) j->live_next->live_prev = j->live_prev;
    j->live_prev = j->live_next = NULL;
}

static int on_finished(void *ctx, void *user, engine_output_t *out) {
    serve_engine_t *s = ctx;
    serve_sub_t *u = user;
    serve_job_t *j = u->job;
    const int n = out->num_tokens;
    const double ttft = out->first_token_s - out->arrival_s;
    const double tpot = n > 1 ? (out->finish_s - out->first_token_s) / (n - 1) : 0;
    const int reason = out->error ? 3 : out->finish_reason == FINISH_ABORTED ? 2 : out->finish_reason == FINISH_EOS ? 0 : 1;
    const int got_token = n > 0 && out->first_token_s > 0;
    pthread_mutex_lock(&j->mu);
    u->out = *out;  // moved
    u->finished = 1;
    // A rejected job's requests come out through here too (admit): the
    // engine's reference is admit's to let go of then.
    const int done = ++j->num_finished == j->num_subs && j->state == JOB_RUNNING;
    if (done) j->state = JOB_DONE;
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
    pthread_mutex_lock(&s->mu);
    s->finished_by_reason[reason]++;
    if (got_token) histogram_add(&s->ttft, TTFT_BUCKETS, ttft);
    if (n > 1 && reason != 2) histogram_add(&s->tpot, TPOT_BUCKETS, tpot);
    pthread_mutex_unlock(&s->mu);
    // The engine's reference goes when the last of the job's requests is over.
    if (done) {
        live_remove(s, j);
        serve_job_release(j);
    }
    return 0;
}

// ---- the loop -------------------------------------------------------------------------------

// Every sub-request of j into the core, or none: one the engine refuses
// (a prompt that can never fit the cache, say) rejects the whole job.
static void admit(serve_engine_t *s, serve_job_t *j) {
    pthread_mutex_lock(&j->mu);
    const int gone = j->abort;
    pthread_mutex_unlock(&j->mu);
    if (gone) {
        job_set_state(j, JOB_DONE, NULL);
        serve_job_release(j);
        return;
    }
    api_error_t err;
    int bad = -1;
    for (int i = 0; i < j->num_subs && bad < 0; i++) {
        serve_sub_t *u = &j->subs[i];
        const engine_stop_t stop = {.ids = j->api.stop_token_ids, .n = j->api.num_stop_token_ids,
                                    .strs = (const char *const *)j->api.stop, .num_strs = j->api.num_stop,
                                    .include_str = j->api.include_stop_str_in_output,
                                    .keep_special = !j->api.skip_special_tokens};
        if (engine_core_add(s->core, &u->req, &stop, u, &u->id)) bad = i;
        else u->added = 1;
    }
    if (bad < 0) {
        j->live_next = s->live;
        if (s->live) s->live->live_prev = j;
        s->live = j;
        job_set_state(j, JOB_RUNNING, NULL);
        return;
    }
    api_fail(&err, 400, j->api.kind == API_CHAT ? "messages" : "prompt", "invalid_value", "%s%s", mv_last_error(),
             j->num_subs > 1 ? " (one of the prompts)" : "");
    // Those already in the core come out again (their on_finished sees a rejected job).
    job_set_state(j, JOB_REJECTED, &err);
    for (int i = 0; i < bad; i++) engine_core_abort(s->core, j->subs[i].id);
    serve_job_release(j);
}

static void abort_job(serve_engine_t *s, serve_job_t *j) {
    pthread_mutex_lock(&j->mu);
    const int running = j->state == JOB_RUNNING;
    pthread_mutex_unlock(&j->mu);
    if (!running) return;
    // engine_core_abort calls on_finished, which takes j->mu: not held here.
    // The job is alive: the abort queue's reference.
    for (int i = 0; i < j->num_subs; i++)
        if (j->subs[i].added) engine_core_abort(s->core, j->subs[i].id);
}

// The engine failed: nothing can run any more. Every running job ends with a 500.
static void fail_all(serve_engine_t *s, const char *why) {
    pthread_mutex_lock(&s->mu);
    snprintf(s->failure, sizeof s->failure, "%s", why);
    pthread_mutex_unlock(&s->mu);
    fprintf(stderr, "minivllm serve: the engine failed: %s\n", why);
    api_error_t err;
    api_fail(&err, 500, NULL, "engine_failed", "the engine failed: %s", why);
    while (s->live) {
        serve_job_t *j = s->live;
        live_remove(s, j);
        job_set_state(j, JOB_FAILED, &err);
        serve_job_release(j);
    }
}

static void snapshot(serve_engine_t *s) {
    engine_core_stats_t st;
    engine_core_stats(s->core, &st);
    pthread_mutex_lock(&s->mu);
    s->stats = st;
    pthread_mutex_unlock(&s->mu);
}

static void *engine_main(void *arg) {
    serve_engine_t *s = arg;
    for (;;) {
        pthread_mutex_lock(&s->mu);
        while (!s->queue_head && !s->aborts && !s->abort_all && engine_core_num_unfinished(s->core) == 0 &&
               !s->draining)
            pthread_cond_wait(&s->cv, &s->mu);
        serve_job_t *queue = s->queue_head, *aborts = s->aborts;
        s->queue_head = s->queue_tail = NULL;
        s->aborts = NULL;
        const int abort_all = s->abort_all;
        s->num_queued = 0;
        pthread_mutex_unlock(&s->mu);
        while (queue) {
            serve_job_t *j = queue;
            queue = j->next;
            admit(s, j);
        }
        while (aborts) {
            serve_job_t *j = aborts;
            aborts = j->next;
            abort_job(s, j);
            serve_job_release(j);  // the abort queue's reference
        }
        while (abort_all && s->live) abort_job(s, s->live);
        snapshot(s);
        if (engine_core_num_unfinished(s->core) > 0) {
            if (engine_core_step(s->core)) {
                fail_all(s, mv_last_error());
                break;
            }
            snapshot(s);
            if (s->cfg.step_delay_ms > 0) {
                struct timespec ts = {s->cfg.step_delay_ms / 1000, (long)(s->cfg.step_delay_ms % 1000) * 1000000L};
                nanosleep(&ts, NULL);
            }
        }
        pthread_mutex_lock(&s->mu);
        const int idle = engine_core_num_unfinished(s->core) == 0 && !s->queue_head && !s->aborts;
        const int stop = s->draining && idle;
        if (stop) {
            s->idle = 1;
            pthread_cond_broadcast(&s->cv);
        }
        pthread_mutex_unlock(&s->mu);
        if (stop) break;
    }
    // Anything still queued (a failure) is answered, not left waiting.
    pthread_mutex_lock(&s->mu);
    serve_job_t *queue = s->queue_head, *aborts = s->aborts;
    s->queue_head = s->queue_tail = NULL;
    s->aborts = NULL;
    s->stopped = 1;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    api_error_t err;
    api_fail(&err, 503, NULL, "server_stopping", "the server is shutting down");
    for (serve_job_t *j = queue, *next; j; j = next) {
        next = j->next;
        job_set_state(j, JOB_FAILED, &err);
        serve_job_release(j);
    }
    for (serve_job_t *j = aborts, *next; j; j = next) {
        next = j->next;
        serve_job_release(j);
    }
    return NULL;
}

int serve_engine_start(engine_t *e, const serve_engine_config_t *cfg, serve_engine_t **out) {
    *out = NULL;
    serve_engine_t *s = calloc(1, sizeof *s);
    if (!s) return mv_error("serve: out of memory");
    s->e = e;
    s->cfg = *cfg;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    const engine_core_hooks_t hooks = {.on_token = on_token, .on_finished = on_finished, .ctx = s};
    if (engine_core_create(e, &hooks, &s->core)) {
        serve_engine_free(s);
        return -1;
    }
    snapshot(s);
    if (pthread_create(&s->thread, NULL, engine_main, s)) {
        serve_engine_free(s);
        return mv_error("serve: cannot start the engine thread");
    }
    s->started = 1;
    *out = s;
    return 0;
}

int serve_engine_submit(serve_engine_t *s, serve_job_t *j, api_error_t *err) {
    job_ref(j);  // the engine's, given back below if the job is refused
    pthread_mutex_lock(&s->mu);
    int rc = 0;
    const int waiting = s->num_queued + s->stats.num_waiting;
    if (s->failure[0])
        rc = api_fail(err, 500, NULL, "engine_failed", "the engine failed: %s", s->failure);
    else if (s->draining || s->stopped)
        rc = api_fail(err, 503, NULL, "server_stopping", "the server is shutting down");
    else if (waiting + j->num_subs > s->cfg.max_queued_requests) {
        rc = api_fail(err, 503, NULL, "queue_full",
                      "the queue is full: %d requests wait, at most %d (--max-queued-requests); try again later",
                      waiting, s->cfg.max_queued_requests);
        s->num_rejected_full++;
    }
    if (!rc) {
        for (int i = 0; i < j->num_subs; i++)
            if (!j->api.has_seed) j->subs[i].req.seed = s->cfg.base_seed + (uint64_t)(s->num_submitted + i);
        s->num_submitted += j->num_subs;
        j->next = NULL;
        if (s->queue_tail) s->queue_tail->next = j;
        else s->queue_head = j;
        s->queue_tail = j;
        s->num_queued += j->num_subs;
        pthread_cond_broadcast(&s->cv);
    }
    pthread_mutex_unlock(&s->mu);
    if (rc) serve_job_release(j);
    return rc;
}

void serve_engine_abort(serve_engine_t *s, serve_job_t *j) {
    pthread_mutex_lock(&j->mu);
    const int first = !j->abort;
    const int over = j->state == JOB_DONE || j->state == JOB_REJECTED || j->state == JOB_FAILED;
    j->abort = 1;
    pthread_mutex_unlock(&j->mu);
    if (!first || over) return;
    job_ref(j);  // the abort queue's
    pthread_mutex_lock(&s->mu);
    if (s->stopped) {
        pthread_mutex_unlock(&s->mu);
        serve_job_release(j);
        return;
    }
    j->next = s->aborts;  // a job in the abort queue is in no submission queue: admit() took it first
    s->aborts = j;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

void serve_engine_drain(serve_engine_t *s, double timeout_s) {
    if (!s || !s->started) return;
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += (time_t)timeout_s;
    pthread_mutex_lock(&s->mu);
    s->draining = 1;
    pthread_cond_broadcast(&s->cv);
    while (!s->idle && !s->stopped)
        if (pthread_cond_timedwait(&s->cv, &s->mu, &until)) break;
    if (!s->idle && !s->stopped) {
        fprintf(stderr, "minivllm serve: %d requests still running after %.0f s: aborted\n", s->stats.num_running +
                s->stats.num_waiting, timeout_s);
        s->abort_all = 1;
        pthread_cond_broadcast(&s->cv);
    }
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->thread, NULL);
    s->started = 0;
}

void serve_engine_free(serve_engine_t *s) {
    if (!s) return;
    if (s->started) serve_engine_drain(s, 0);
    engine_core_free(s->core);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s);
}

int serve_engine_health(serve_engine_t *s, char *why, size_t cap) {
    pthread_mutex_lock(&s->mu);
    int rc = s->failure[0] ? -1 : 0;
    if (rc) snprintf(why, cap, "the engine failed: %s", s->failure);
    pthread_mutex_unlock(&s->mu);
    return rc;
}

// ---- /metrics ---------------------------------------------------------------------------------

static int metric(tok_bytes_t *b, const char *name, const char *type, const char *help, double v) {
    char buf[512];
    int n = snprintf(buf, sizeof buf, "# HELP %s %s\n# TYPE %s %s\n%s %.17g\n", name, help, name, type, name, v);
    return tok_bytes_append(b, buf, (size_t)n);
}

static int histogram_text(tok_bytes_t *b, const char *name, const char *help, const histogram_t *h,
                          const double *buckets) {
    char buf[256];
    int n = snprintf(buf, sizeof buf, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    int rc = tok_bytes_append(b, buf, (size_t)n);
    for (int i = 0; !rc && i <= N_BUCKETS; i++) {
        if (i < N_BUCKETS) n = snprintf(buf, sizeof buf, "%s_bucket{le=\"%g\"} %lld\n", name, buckets[i], h->counts[i]);
        else n = snprintf(buf, sizeof buf, "%s_bucket{le=\"+Inf\"} %lld\n", name, h->counts[i]);
        rc = tok_bytes_append(b, buf, (size_t)n);
    }
    n = snprintf(buf, sizeof buf, "%s_sum %.17g\n%s_count %lld\n", name, h->sum, name, h->counts[N_BUCKETS]);
    return rc || tok_bytes_append(b, buf, (size_t)n);
}

int serve_engine_metrics(serve_engine_t *s, tok_bytes_t *b) {
    pthread_mutex_lock(&s->mu);
    const engine_core_stats_t st = s->stats;
    const histogram_t ttft = s->ttft, tpot = s->tpot;
    long long by_reason[4];
    memcpy(by_reason, s->finished_by_reason, sizeof by_reason);
    const int queued = s->num_queued;
    const long long full = s->num_rejected_full;
    pthread_mutex_unlock(&s->mu);
    const double hit_rate =
        st.num_prompt_tokens_looked_up > 0 ? (double)st.num_cached_tokens / (double)st.num_prompt_tokens_looked_up : 0;
    int rc = metric(b, "minivllm:num_requests_running", "gauge", "Requests in the running batch.", st.num_running) ||
             metric(b, "minivllm:num_requests_waiting", "gauge",
                    "Requests waiting: in the scheduler's queue or not yet taken by the engine thread.",
                    st.num_waiting + queued) ||
             metric(b, "minivllm:kv_cache_blocks_used", "gauge", "KV-cache blocks held by running requests.",
                    st.num_blocks - st.num_free_blocks) ||
             metric(b, "minivllm:kv_cache_blocks_free", "gauge",
                    "KV-cache blocks nobody holds (cached prefixes among them).", st.num_free_blocks) ||
             metric(b, "minivllm:kv_cache_usage_perc", "gauge", "Share of the KV-cache blocks in use.",
                    st.num_blocks ? (double)(st.num_blocks - st.num_free_blocks) / st.num_blocks : 0) ||
             metric(b, "minivllm:prefix_cache_queries_total", "counter",
                    "Prompt tokens looked up in the prefix cache at admission.", (double)st.num_prompt_tokens_looked_up) ||
             metric(b, "minivllm:prefix_cache_hits_total", "counter", "Of those, tokens found in the prefix cache.",
                    (double)st.num_cached_tokens) ||
             metric(b, "minivllm:prefix_cache_hit_rate", "gauge", "prefix_cache_hits_total / prefix_cache_queries_total.",
                    hit_rate) ||
             metric(b, "minivllm:prompt_tokens_total", "counter", "Prompt tokens of the requests admitted.",
                    (double)st.num_prompt_tokens) ||
             metric(b, "minivllm:generation_tokens_total", "counter", "Tokens generated.",
                    (double)st.num_generated_tokens) ||
             metric(b, "minivllm:num_preemptions_total", "counter", "Sequences preempted (recomputed later).",
                    (double)st.num_preemptions) ||
             metric(b, "minivllm:engine_steps_total", "counter", "Engine steps run.", (double)st.num_steps) ||
             metric(b, "minivllm:request_rejected_queue_full_total", "counter", "Requests refused with 503: queue full.",
                    (double)full);
    char buf[512];
    static const char *const REASONS[] = {"stop", "length", "abort", "error"};
    int n = snprintf(buf, sizeof buf, "# HELP minivllm:request_success_total Requests finished, by finish_reason.\n"
                                      "# TYPE minivllm:request_success_total counter\n");
    rc = rc || tok_bytes_append(b, buf, (size_t)n);
    for (int i = 0; !rc && i < 4; i++) {
        n = snprintf(buf, sizeof buf, "minivllm:request_success_total{finished_reason=\"%s\"} %lld\n", REASONS[i],
                     by_reason[i]);
        rc = tok_bytes_append(b, buf, (size_t)n);
    }
    rc = rc ||
         histogram_text(b, "minivllm:time_to_first_token_seconds",
                        "Time from a request's admission into the engine to its first token.", &ttft, TTFT_BUCKETS) ||
         histogram_text(b, "minivllm:time_per_output_token_seconds",
                        "Per request: (finish - first token) / (tokens - 1).", &tpot, TPOT_BUCKETS);
    return rc ? -1 : 0;
}

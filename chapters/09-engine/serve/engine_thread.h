/*
 * chapters/09-engine/serve/engine_thread.h - the engine in its own thread, and
 * the requests that HTTP threads hand it.
 *
 * Where it sits: `minivllm serve` (cli/cmd_serve.c) runs one engine core
 * (runtime/engine.h) in one thread, the engine thread, and answers HTTP in
 * others (http.c, a thread per connection). They meet here:
 *
 *   HTTP thread                          engine thread (owns the engine core)
 *   -----------                          ------------------------------------
 *   serve_job_create(api request)        loop:
 *   serve_engine_submit(job) --queue-->    take the queue: engine_core_add each
 *   wait on job->cv                        take the aborts: engine_core_abort each
 *        <-- job->cv, per token ---------  engine_core_step: on_token appends to the
 *   write SSE chunks / the JSON body         job's sub-request, on_finished ends it
 *   client gone: serve_engine_abort(job)   (between steps: nothing is half done)
 *
 * A job is one HTTP request: one engine request ("sub") per choice, n per
 * prompt (choice p * n + j is prompt p's j-th, as OpenAI numbers them). It is
 * reference counted (the HTTP side, the engine while it runs it, an abort
 * in the queue), so whichever side lets go last frees it. Each job has its
 * own mutex and condition variable; the engine's queue has another. No
 * thread ever holds two of them at once.
 *
 * Admission happens between steps, so a request joins the running batch at
 * the next step after it arrives. Aborting frees its KV blocks before the
 * next step runs. The queue holds at most max_queued_requests requests that
 * wait (in the queue or in the scheduler's waiting list): one more is a 503.
 */
#ifndef MV_SERVE_ENGINE_THREAD_H
#define MV_SERVE_ENGINE_THREAD_H

#include <pthread.h>
#include <stdint.h>

#include "chapters/09-engine/runtime/engine.h"
#include "chapters/09-engine/serve/openai.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    JOB_QUEUED,    // submitted, not yet in the engine
    JOB_RUNNING,   // every sub-request is in the engine core
    JOB_REJECTED,  // the engine refused it (job->error, a 400): nothing ran
    JOB_DONE,      // every sub-request finished (or was aborted)
    JOB_FAILED,    // the engine itself failed (job->error, a 500)
} job_state_t;

typedef struct serve_job serve_job_t;

// One choice of a job: one engine request.
typedef struct {
    serve_job_t *job;
    int index;                 // its choice index: prompt * n + j
    engine_request_t req;      // the prompt points into job->api.prompts[index / n]
    int64_t id;                // the engine core's id, once added
    int added;                 // 1 once in the core
    // Guarded by job->mu:
    int32_t *tokens;           // [num_tokens] sampled so far (cap allocated)
    engine_logprob_t *lps;     // [num_tokens] theirs, with params.logprobs (cap allocated), else NULL
    int num_tokens, cap;
    int last_is_stop;          // the last token ended it as a stop (eos / stop_token_ids): no text
    int finished;              // out is filled
    engine_output_t out;       // the engine's output, once finished
} serve_sub_t;

struct serve_job {
    pthread_mutex_t mu;
    pthread_cond_t cv;         // signalled on every change below
    job_state_t state;
    api_error_t error;         // JOB_REJECTED / JOB_FAILED
    api_request_t api;         // the parsed body (owned)
    serve_sub_t *subs;         // [num_subs]
    int num_subs, num_finished;
    int abort;                 // 1: the client went away
    int refs;
    serve_job_t *next;         // in the engine's submission or abort queue
    serve_job_t *live_prev, *live_next;  // the engine thread's list of running jobs
};

// Build a job from a parsed body (moved into the job; *api is zeroed).
// NULL when out of memory.
serve_job_t *serve_job_create(api_request_t *api, const api_context_t *ctx);
// Let go of the caller's reference.
void serve_job_release(serve_job_t *job);

typedef struct {
    int max_queued_requests;   // requests that may wait; one more is a 503
    uint64_t base_seed;        // engine request i without "seed" draws with base_seed + i (each
                               // choice of n is one: n > 1 choices draw differently)
    int step_delay_ms;         // testing aid: sleep this long after each step
} serve_engine_config_t;

typedef struct serve_engine serve_engine_t;

// Start the engine thread over e (which it uses alone from here on).
int serve_engine_start(engine_t *e, const serve_engine_config_t *cfg, serve_engine_t **out);
// Queue a job (the engine takes a reference): 0, or -1 with *err: 503 when
// the queue is full or the server is draining, 500 when the engine failed.
int serve_engine_submit(serve_engine_t *s, serve_job_t *job, api_error_t *err);
// The client went away: abort the job's requests and free their blocks at
// the engine's next turn. Safe to call at any time, more than once.
void serve_engine_abort(serve_engine_t *s, serve_job_t *job);
// Stop taking jobs (503 from now on), let the running ones finish for up to
// timeout_s seconds, abort the rest, and stop the engine thread.
void serve_engine_drain(serve_engine_t *s, double timeout_s);
void serve_engine_free(serve_engine_t *s);

// The Prometheus text of GET /metrics, appended to out.
int serve_engine_metrics(serve_engine_t *s, tok_bytes_t *out);
// 0 while the engine runs; else -1 with why (GET /health answers 500 then).
int serve_engine_health(serve_engine_t *s, char *why, size_t cap);

#ifdef __cplusplus
}
#endif
#endif

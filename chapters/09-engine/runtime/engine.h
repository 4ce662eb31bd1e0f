/*
 * chapters/09-engine/runtime/engine.h - the inference engine: requests in, tokens out.
 *
 * Where it sits: on top of everything. It loads a model directory
 * (config.json, generation_config.json, the safetensors weights and, when
 * present, the tokenizer), builds a scheduler (chapter 08) and a model
 * runner (model_runner.h), and runs the loop nano-vllm's LLMEngine runs:
 *
 *     while requests are unfinished:
 *         step    = scheduler_schedule()          which tokens run, where their K/V go
 *         logits  = model_runner_step(step)        one forward pass
 *         tokens  = sampler_sample(logits)          one per sampled row, per-request rng
 *         scheduler_postprocess(tokens)            append, finish on eos / length
 *
 * All the requests of one engine_generate() call are added at once and
 * batched continuously: the scheduler mixes their prefills (chunked when the
 * token budget is short) and decodes in every step, reuses cached prefix
 * blocks, and preempts when the cache is full.
 *
 * The loop itself is the engine core (engine_core_*, at the end of this
 * file), as vLLM's EngineCore: requests are added and aborted between two
 * steps, and each reports its tokens as they are sampled. engine_run is a
 * batch on top of it; `minivllm serve` runs one core for as long as it
 * serves (chapters/09-engine/serve/).
 *
 * Bad requests: engine_generate() checks every request before running any
 * (ids inside the vocabulary, the scheduler's own checks: empty prompt,
 * max_tokens < 1, too long, never fits in the cache...), and a bad one fails
 * the whole call with -1 and a message naming the request's index. A file
 * with a typo in it runs nothing, which is what a command-line user expects.
 *
 * Once running, one request never sinks the others: a request that cannot
 * go on (logits with no finite value to sample from, on either backend)
 * ends there with its `error` set (finish_reason "error") and the tokens it
 * had; the rest run to their end. engine_run() also hands each output over
 * as its request finishes (on_finished, to write it out at once) and stops
 * between two steps when asked (a flag set by a signal handler): whatever
 * had finished is kept, the rest is reported as not done.
 *
 * Memory: engine_create() works out what the load will allocate
 * (engine_memory_estimate) and refuses, naming the bytes needed and
 * available, before it allocates any of it.
 *
 * Library code: 0 / -1 with mv_error(), never exits.
 * Tests: tests/test_engine_cpu.c. Try it: ./build/minivllm generate --help
 */
#ifndef MV_ENGINE_H
#define MV_ENGINE_H

#include <signal.h>
#include <stdio.h>
#include <stdint.h>

#include "chapters/08-scheduler/sched/scheduler.h"
#include "chapters/09-engine/model/model_config.h"
#include "chapters/09-engine/runtime/model_runner.h"
#include "chapters/09-engine/runtime/sampler.h"
#include "chapters/09-engine/text/stop_str.h"
#include "chapters/09-engine/text/tokenizer.h"

#ifdef __cplusplus
extern "C" {
#endif

// The defaults of max_num_seqs / max_num_batched_tokens (engine_config_resolve).
#define ENGINE_CPU_MAX_NUM_SEQS 16
#define ENGINE_CUDA_MAX_NUM_SEQS 256
#define ENGINE_CUDA_MAX_NUM_BATCHED_TOKENS 8192

typedef struct {
    const char *model_dir;
    runner_device_t device;
    int max_model_len;           // 0 = min(max_position_embeddings, 4096)
    int max_num_seqs;            // 0 = cpu 16, cuda 256; at most max_num_batched_tokens and
                                 //     num_blocks when those are given
    int max_num_batched_tokens;  // 0 = cpu: max(max_model_len, 512) capped at 8192;
                                 //     cuda: 8192, at most max_num_seqs x max_model_len;
                                 //     either way >= max_num_seqs
    int block_size;              // 0 = 16
    int num_blocks;              // 0 = cpu: enough for max_num_seqs full sequences, within kv_cache_bytes;
                                 //     cuda: what gpu_memory_utilization leaves (the runner sizes it)
    long long kv_cache_bytes;    // cpu: 0 = 2 GiB, the KV budget when num_blocks is 0;
                                 // cuda: 0 = size from gpu_memory_utilization, else this budget
    float gpu_memory_utilization;  // cuda: share of the GPU's memory for weights + scratch + KV, 0 = 0.9
    int enforce_eager;           // cuda: 1 = no CUDA graphs, decode steps launched kernel by kernel
    int no_async_scheduling;     // 1 = every step scheduled after the one before is postprocessed;
                                 // 0 (the default) = decode step n + 1 planned and queued on the GPU
                                 // while step n runs, on a runner with asynchronous steps (cuda, tp 1)
    int enable_prefix_caching;
    int num_threads;             // 0 = one per online CPU
    int progress;                // 1: a progress line on stderr
    int random_weights;          // 1: no weights file; seeded random ones for config.json's shapes
                                 //    (qwen3_weights_random, std 0.02): for timing, not for text
    uint64_t weights_seed;       // the seed of random_weights
    int tp_size;                 // tensor-parallel ranks (--tensor-parallel-size), 0 = 1; > 1: one process
                                 // per rank under mpirun (cuda: one GPU each, NCCL builds; model_runner.h); the memory
                                 // estimate is then one rank's share
} engine_config_t;

// The defaults above (prefix caching on).
engine_config_t engine_config_default(const char *model_dir);
// Fill the zeros of *c with the defaults for model m and check the sizes,
// as engine_create does: a command can check its options before loading.
int engine_config_resolve(engine_config_t *c, const qwen3_config_t *m);

// A request's stops, as vLLM's SamplingParams has them. Copied by engine_core_add.
//   stop_token_ids: sampling one ends the request with finish_reason "stop",
//     the id kept in token_ids as an eos is, whatever ignore_eos says.
//   stop strings (text/stop_str.h; they need the tokenizer): checked on the
//     decoded text after every token; the token that completes one ends the
//     request in the same step (no token is spent past it), finish_reason
//     "stop", out->stop_str the string, out->text cut before it (after it
//     with include_str). token_ids keep every id sampled, that last one too.
typedef struct {
    const int32_t *ids;         // [n] stop_token_ids
    int n;
    const char *const *strs;    // [num_strs] stop strings, at most STOP_STR_MAX, none empty
    int num_strs;
    int include_str;            // include_stop_str_in_output
    int keep_special;           // 1: special tokens count in the text (skip_special_tokens false)
} engine_stop_t;

// A sampled token's log-probability and the likeliest ids' (sampling_params_t.logprobs).
typedef sampler_logprob_t engine_logprob_t;

typedef struct {
    const int32_t *prompt;       // [num_prompt] token ids
    int num_prompt;
    sampling_params_t params;
    uint64_t seed;               // keys this request's draws: Philox(seed; token id, gen_index)
} engine_request_t;

typedef struct {
    int32_t *token_ids;          // [num_tokens] generated ids (an eos that stopped it included), malloc'd
    int num_tokens;
    finish_reason_t finish_reason;
    // When, in seconds since the run began (engine_run, or engine_core_create;
    // CLOCK_MONOTONIC): the request was added (0 for all of engine_run's), its
    // first token was on the host, and it finished. Time to first token is
    // first_token_s - arrival_s; time per output token after it is
    // (finish_s - first_token_s) / (num_tokens - 1). `minivllm bench --latency`.
    double arrival_s, first_token_s, finish_s;
    int num_prompt_tokens;       // the prompt's length
    int num_cached_tokens;       // of those, found in the prefix cache when it was (last) admitted
    int32_t stop_token_id;       // the stop_token_ids entry that ended it (finish_reason "stop"), else -1
    int done;                    // 1 once the request finished (normally or with error); 0 if the run
                                 // stopped first (engine_run's stop flag): then nothing else is set
    char *error;                 // NULL, or why it could not go on: finish_reason "error", token_ids
                                 // holding what it had generated before (malloc'd)
    int num_unknown_tokens;      // of token_ids, ids the tokenizer has no token for (padding rows of
                                 // the vocabulary: they decode to no text); 0 without a tokenizer
    char *text;                  // [text_len] with stop strings: the decoded text (the stop id's left
    size_t text_len;             // out), cut at the stop string; else NULL (malloc'd, NUL-terminated)
    char *stop_str;              // the stop string that ended it (finish_reason "stop"), else NULL (malloc'd)
    engine_logprob_t *logprobs;  // [num_tokens] with params.logprobs, else NULL (malloc'd)
} engine_output_t;

typedef struct engine {
    engine_config_t cfg;         // with the defaults filled in
    qwen3_config_t model;
    st_model_t *weights;         // the mapped checkpoint; NULL with random_weights once the runner has its copy
    tokenizer_t *tokenizer;      // NULL when the directory has none
    model_runner_t *runner;      // its weight_bytes, kv_cache_bytes, scratch_bytes: what it placed
    scheduler_config_t sched_cfg;
    // statistics of the last engine_generate
    long long num_steps, num_prompt_tokens, num_generated_tokens, num_cached_tokens, num_preemptions;
    double elapsed_s;
    // Where a run's time went, per engine_generate: host_s in the engine's own
    // host work (scheduling, building the step, host sampling, postprocessing),
    // runner_s inside the model runner's step (staging the inputs, the GPU's
    // work and the wait for it). Without asynchronous scheduling the GPU waits
    // for the host's work, so host_s / num_steps is what each step adds to
    // the GPU time; with it, the work for step n is done while step n + 1
    // runs, in the num_steps_ahead steps that were planned ahead.
    double host_s, runner_s;
    long long num_steps_ahead;
    int failed_request;          // the request a failing engine_generate named, else -1
    int num_finished;            // requests done (their outputs filled), errors included
    int num_failed;              // of those, ended with an error (finish_reason "error")
    long long num_unknown_tokens;  // generated ids the tokenizer does not know (see engine_output_t)
    int stopped;                 // 1: the last run stopped early at the hooks' stop flag
    // Optional, the caller's: one CSV line per step (engine_step_trace_header's
    // columns), the step's shape and where its time went; `minivllm bench
    // --step-trace`. step_trace_rep is written in the first column.
    FILE *step_trace;
    int step_trace_rep;
} engine_t;

// The columns of engine_t.step_trace's lines, for its first line.
extern const char engine_step_trace_header[];

// Optional hook: called with each sampled row's logits [vocab] before sampling.
// gen_index = how many tokens that request had generated before this one.
// The cuda backend samples on the GPU either way (the same tokens with or
// without the hook); with the hook it also copies the logits to the host.
typedef void (*engine_logits_fn)(void *ctx, int request, int gen_index, const float *logits, int vocab);

// Called once per request, as it finishes (outputs[request] filled and
// done), in the order requests finish. Returning -1 (with mv_error(): a
// write error, say) stops the run: engine_run then returns -1 with it.
typedef int (*engine_finished_fn)(void *ctx, int request, const engine_output_t *out);

typedef struct {
    engine_logits_fn on_logits;         // optional, as engine_generate's
    engine_finished_fn on_finished;     // optional
    const volatile sig_atomic_t *stop;  // optional: read after every step; non-zero stops the run there
                                        // (a signal handler sets it: no work in the handler)
    void *ctx;                          // passed to the hooks
    // Optional: each sampled token of request `request`, as the core's
    // on_token (stop = 1: an eos / stop_token_ids id, whose text is left out;
    // lp: its log-probabilities with params.logprobs, else NULL).
    void (*on_token)(void *ctx, int request, int32_t token, int stop, const engine_logprob_t *lp);
} engine_hooks_t;

// engine_run's result when it stopped at hooks->stop before every request finished.
enum { ENGINE_STOPPED = 1 };

// The memory a load needs, by part, before anything is allocated.
typedef struct {
    runner_memory_t runner;       // the model runner's (model_runner_memory_estimate)
    size_t engine_bytes;          // the engine's host buffers: logits [max_num_seqs, vocab] fp32 and the
                                  // sampler's scratch, when the host samples (cpu)
    size_t random_weights_bytes;  // random_weights: the bf16 checkpoint drawn in memory, alive until the
                                  // runner has converted it (a mapped checkpoint costs page cache only)
    size_t host_bytes;            // everything above that lives in host memory on this device
    size_t host_min_bytes;        // host_bytes with the KV cache counted as one sequence of max_model_len:
                                  // what must fit to load at all (the cache is allocated whole but its
                                  // pages are touched only as blocks fill, so its full size is reported,
                                  // not required)
    size_t device_bytes;          // cuda: the runner's device share (its KV cache only when num_blocks is
                                  // set; runner_cuda.c sizes the rest against cudaMemGetInfo); cpu: 0
} engine_memory_t;

// c: resolved (engine_config_resolve). -1 with mv_error() on a bad shape.
int engine_memory_estimate(const engine_config_t *c, const qwen3_config_t *m, engine_memory_t *out);
// 0 when mem->host_min_bytes fits host_memory_available(); else -1 with
// mv_error() naming both byte counts, the parts and which options lower them.
int engine_memory_check(const engine_memory_t *mem, const engine_config_t *c);

// Load the model (the memory check first), the tokenizer when there is one
// (it may not have more ids than config.json's vocab_size), and the runner.
int engine_create(const engine_config_t *cfg, engine_t **out);
void engine_free(engine_t *e);

// Run requests[0..n) to completion; outputs[i] belongs to requests[i]
// (free them with engine_outputs_free). 0 when every request is done: each
// ended normally or with its own error (e->num_failed of them); -1 with
// mv_error() naming the request on a bad one (nothing is run then), on a
// failing step, or when on_finished failed (the outputs are freed then);
// ENGINE_STOPPED when *hooks->stop was set: the outputs with done == 1 are
// valid (e->num_finished of them), the others empty. hooks may be NULL.
int engine_run(engine_t *e, const engine_request_t *requests, int n, engine_output_t *outputs,
               const engine_hooks_t *hooks);
// engine_run with each request's stops: stops[i] belongs to requests[i]
// (NULL: none for any). engine_run is this with NULL.
int engine_run_stops(engine_t *e, const engine_request_t *requests, const engine_stop_t *stops, int n,
                     engine_output_t *outputs, const engine_hooks_t *hooks);
// engine_run with only an on_logits hook (which may be NULL).
int engine_generate(engine_t *e, const engine_request_t *requests, int n, engine_output_t *outputs,
                    engine_logits_fn on_logits, void *ctx);
void engine_outputs_free(engine_output_t *outputs, int n);

// "stop" (an eos id), "length" (max_tokens or max_model_len) or "abort", as vLLM says.
const char *engine_finish_reason(finish_reason_t r);
// An output's: "error" when it ended with one, else engine_finish_reason's.
const char *engine_output_finish_reason(const engine_output_t *o);


// ---- the engine core: a long-lived loop that takes requests as they come ------------------
//
// engine_run adds a whole batch, then steps until it is done. A server
// (cli/cmd_serve.c, serve/) cannot: its requests arrive while others run.
// The core is the loop itself, as vLLM's EngineCore is: requests are added
// and aborted between two steps, each step runs whatever the scheduler has,
// and each request reports its tokens as they are sampled and its output
// when it finishes. engine_run is a batch on top of it. Not thread-safe: one
// thread owns a core (the server's engine thread), and other threads talk to
// that thread (serve/engine_thread.c).
typedef struct engine_core engine_core_t;

typedef struct {
    // Each sampled token of the request `user`, when the step that sampled
    // it is done; before that request's on_finished. stop = 1: this token
    // ended the request as a stop (an eos id, or one of its stop_token_ids),
    // whose text vLLM leaves out of the output. lp: the token's
    // log-probabilities when the request asked for logprobs, else NULL. Optional.
    void (*on_token)(void *ctx, void *user, int32_t token, int stop, const engine_logprob_t *lp);
    // The request is over (finished, failed alone, or aborted: out->finish_reason
    // FINISH_ABORTED). The hook owns out's arrays (move them or
    // engine_outputs_free(out, 1)), whatever it returns; -1 (with mv_error())
    // makes the step that called it return -1. Optional.
    int (*on_finished)(void *ctx, void *user, engine_output_t *out);
    // Each sampled row's logits [vocab] before sampling, as engine_logits_fn. Optional.
    void (*on_logits)(void *ctx, void *user, int gen_index, const float *logits, int vocab);
    void *ctx;
} engine_core_hooks_t;

// What /metrics reports: counters since engine_core_create, and gauges now.
typedef struct {
    int num_running, num_waiting;       // the scheduler's, now
    int num_blocks, num_free_blocks;    // the KV cache's, now
    long long num_steps, num_prompt_tokens, num_generated_tokens;
    long long num_prompt_tokens_looked_up, num_cached_tokens;  // prefix cache: admitted tokens, found ones
    long long num_preemptions, num_finished, num_failed, num_aborted, num_unknown_tokens;
    double host_s, runner_s;            // as engine_t's
    long long num_steps_ahead;          // steps planned and launched while the step before ran
} engine_core_stats_t;

// A core over e's runner (one core at a time per engine: the KV cache is the runner's).
int engine_core_create(engine_t *e, const engine_core_hooks_t *hooks, engine_core_t **out);
// Unfinished requests are dropped without a hook call.
void engine_core_free(engine_core_t *c);
// Check r (ids in the vocabulary, sampling parameters, the scheduler's own
// checks) and queue it; it runs from the next step on. The prompt and stop
// (NULL: none) are copied. -1 with mv_error() saying what is wrong (nothing
// is added); else 0 and its id.
int engine_core_add(engine_core_t *c, const engine_request_t *r, const engine_stop_t *stop, void *user,
                    int64_t *id);
// Abort request id now (between steps): its KV blocks are free when this
// returns, and its on_finished has run (finish_reason FINISH_ABORTED).
// 0, 1 when it had finished already, -1 with mv_error().
int engine_core_abort(engine_core_t *c, int64_t id);
// One step, when anything is unfinished (else nothing): 0, or -1 with mv_error().
int engine_core_step(engine_core_t *c);
int engine_core_num_unfinished(const engine_core_t *c);
void engine_core_stats(const engine_core_t *c, engine_core_stats_t *out);
// Seconds since engine_core_create: the clock of the outputs' times.
double engine_core_now(const engine_core_t *c);

#ifdef __cplusplus
}
#endif
#endif

/*
 * chapters/08-scheduler/simulate.h - drive the scheduler with a stand-in model.
 *
 * The stand-in model replaces Qwen3 by something cheap and deterministic that
 * still uses the step exactly as a real model runner would:
 *   - it writes each query token's "K/V" (here: its token id and position)
 *     into a simulated KV cache at slot_mapping[k], skipping -1;
 *   - for each sampled row it "attends" to a few positions of the context
 *     (the first, the middle, the last) by reading them through the row's
 *     block table, checks that each slot holds the position it should, and
 *     mixes the token ids it read into the next token.
 * The same next token is computed straight from a sequence's own token list
 * by standin_next_token(). So if a block table, a slot, a prefix-cache hit or
 * a recomputation after preemption were wrong, the tokens a request produces
 * would differ from the reference, and the run fails.
 *
 * sim_run() adds requests as they arrive, runs the scheduler step by step,
 * checks every invariant after every step, and records per-step series for
 * the chapter's plots. Used by build/08-scheduler and the tests.
 */
#ifndef MV_SIMULATE_H
#define MV_SIMULATE_H

#include <stdint.h>

#include "chapters/08-scheduler/sched/scheduler.h"
#include "common/rng.h"

#ifdef __cplusplus
extern "C" {
#endif

#define SIM_VOCAB 151936  // Qwen3's vocabulary size: ids the stand-in model samples from

typedef struct {
    int num_requests;
    int prompt_min, prompt_max;   // prompt length, uniform in [min, max]
    int output_min, output_max;   // max_tokens, uniform in [min, max]
    int shared_prefix_len;        // leading prompt tokens every request shares (0: none)
    double mean_arrival_gap;      // mean steps between arrivals (exponential); 0: all at once
} workload_t;

typedef struct {
    int32_t *prompt;              // [num_prompt]
    int num_prompt;
    sampling_params_t params;
    long arrival_step;            // the step before which it is added
} sim_request_t;

// Draws a workload from the seeded generator; free with sim_free_requests.
// NULL and mv_error() when out of memory.
sim_request_t *sim_make_requests(rng_t *rng, const workload_t *w);
void sim_free_requests(sim_request_t *reqs, int n);

// The stand-in model's next token after tokens[0..n).
int32_t standin_next_token(const int32_t *tokens, int n);

typedef struct {
    int check_every_step;         // 1: invariants and step checks after every step
    long max_steps;               // give up (an error) past this many steps
    // Asynchronous scheduling, as the engine drives it on a GPU: while step n
    // "runs", step n + 1 is planned ahead (scheduler_schedule_ahead) and run
    // with its input ids taken from step n's output, before step n is
    // postprocessed. The outputs must be the same as without.
    int async;
    // A request whose sampled token is a multiple of stop_mod ends with it,
    // as the engine ends one at a stop id or stop string (max_tokens cut
    // before postprocess): an end the scheduler cannot see coming. 0: off.
    int stop_mod;
    // Every abort_every steps, the middle running request is aborted
    // (between steps: with async, while the step planned ahead runs). 0: off.
    int abort_every;
} sim_options_t;

typedef struct {
    long steps;                   // forward passes
    long long tokens;             // query tokens over all steps
    long long preemptions;
    long long prompt_tokens_admitted, cached_tokens_admitted;  // prefix-cache hit rate
    long long evictions;
    int finished, rejected, aborted, wrong_outputs;
    long ahead_steps;             // async: steps planned ahead
    long dropped_rows;            // async: rows dropped from a step in flight (an end it could not see)
    int first_wrong;              // request index of the first wrong output, -1 if none
    int max_batch;                // most rows in one step
    int peak_blocks_used;
    int num_blocks;
    // per-step series, [steps] each (for the plots)
    int *batch_size;              // rows
    int *blocks_used;             // blocks held by running sequences after the step
    int *step_tokens;             // query tokens
    int *out_len;                 // [num_requests] tokens generated (-1: rejected)
    finish_reason_t *reason;      // [num_requests]
} sim_result_t;

// Runs the requests to completion. 0 when every step kept the invariants and
// every request's output equals standin_next_token's; -1 with the first
// failure in mv_last_error() otherwise (the result holds what ran so far).
int sim_run(const scheduler_config_t *cfg, const sim_request_t *reqs, int n,
            const sim_options_t *opt, sim_result_t *res);
void sim_free_result(sim_result_t *res);

#ifdef __cplusplus
}
#endif
#endif

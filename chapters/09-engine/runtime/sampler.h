/*
 * chapters/09-engine/runtime/sampler.h - from one row of logits to one
 * token id, on the host: the engine's side of reference/sampling.h.
 *
 * Where it sits: after the model runner's LM head, once per sampled row of
 * a step; its token goes back to the scheduler (scheduler_postprocess).
 * The CPU backend samples here; the CUDA backend samples on the GPU
 * (kernels/sampling.h). Both follow the rule of reference/sampling.h and
 * draw the same numbers, so for the same logits they return the same
 * token, not merely tokens from the same distribution.
 *
 * The rules, in vLLM's order: temperature 0 is greedy (the argmax, the
 * lowest id on a tie); otherwise top-k (0 = off), then top-p (1 = off),
 * then one draw from softmax(logits / temperature) over what is kept.
 *
 * Randomness: a request's draws are keyed by (its seed, gen_index = the
 * tokens it had generated before this one), through a counter-based
 * generator (Philox). A draw depends on nothing else: not the batch the
 * request ran in, not the order of the rows, not a preemption and
 * recompute (the recomputed request reaches the same gen_index again
 * with the same tokens behind it). So the same seed gives the same tokens
 * whatever else was running, on either backend.
 *
 * vLLM's other options, in vLLM's order, before the rule above: min_tokens
 * (eos and stop ids set to -inf while the request has fewer tokens),
 * then the repetition, frequency and presence penalties (on the logits,
 * greedy rows too), then, for a draw, min_p beside top-k and top-p
 * (reference/sampling.h). logprobs are those of the raw logits, before
 * any of it (vLLM's default logprobs mode). The GPU does the same without
 * copying the logits back (kernels/sampling_opts.h): sampler_opts_row
 * describes a request's next token to it, and its kernels reproduce
 * sampler_sample_seq's row and token exactly (build/engine_check).
 *
 * Library code: 0 / -1 with mv_error(). Tests: tests/test_engine_cpu.c
 * (the engine's draws), tests/test_sampling.c (the reference).
 */
#ifndef MV_SAMPLER_H
#define MV_SAMPLER_H

#include <stdint.h>

#include "chapters/08-scheduler/sched/sequence.h"
#include "reference/sampling.h"

#ifdef __cplusplus
extern "C" {
#endif

// A request's stop_token_ids, at most: while min_tokens masks them, the
// GPU's options buffer holds them beside the request's sequence.
#define SAMPLER_MAX_STOP_IDS 128

// 0 when temperature >= 0 (and finite), top_k >= 0, top_p in (0, 1], min_p
// in [0, 1], min_tokens in [0, max_tokens], penalties finite (repetition
// > 0, or 0 for 1) and top_logprobs in [0, 20] (and 0 without logprobs);
// else -1 with mv_error() naming the bad value.
int sampler_validate_params(const sampling_params_t *p);

// What the next token of one request is drawn with, besides its parameters.
typedef struct {
    const int32_t *tokens;     // the sequence: num_prompt prompt ids, then the generated ones
    int num_prompt, num_tokens;
    const int32_t *stop_ids;   // [num_stop_ids] masked while under min_tokens (eos ids, stop_token_ids)
    int num_stop_ids;
} sampler_seq_t;

// A sampled token's log-probability and the likeliest ids' (logprobs).
typedef struct {
    float logprob;
    int num_top;                                  // top_logprobs
    int32_t top_ids[SAMPLING_MAX_TOP_LOGPROBS];   // largest first
    float top_logprobs[SAMPLING_MAX_TOP_LOGPROBS];
} sampler_logprob_t;

// The host sampler's scratch: the reference's, and the penalties' (grown as needed).
typedef struct {
    sampling_scratch_t ref;
    uint64_t *ids;   // [ids_cap] a sequence's ids, for the penalties
    int ids_cap;
    float *raw;      // [vocab] the raw logits, for logprobs, when a penalty or min_tokens changes the row
} sampler_scratch_t;
int sampler_scratch_init(sampler_scratch_t *s, int vocab);
void sampler_scratch_free(sampler_scratch_t *s);

// 1 when the request's next token (it has generated gen_index) uses one of
// the options above: penalties, min_p, logprobs, or min_tokens still masking.
int sampler_uses_options(const sampling_params_t *p, int64_t gen_index);

// The GPU's description of that token (kernels/sampling_opts.h): *row, and
// the ids it reads appended to ids[*num_ids ..] (the sequence's ids when a
// penalty is on, seq->stop_ids while min_tokens masks them). -1 with
// mv_error() when they would pass ids_cap.
int sampler_opts_row(const sampling_params_t *p, const sampler_seq_t *seq, sampling_opts_row_t *row, int32_t *ids,
                     int ids_cap, int *num_ids);

// A row whose options are all off: the GPU's kernels leave it at once.
sampling_opts_row_t sampler_opts_off(void);

// The GPU's logprobs of a row as the host sampler's.
void sampler_logprob_from_gpu(const sampling_logprobs_t *g, sampler_logprob_t *out);

// The reference's row for a request's next token.
sampling_row_t sampler_row(const sampling_params_t *p, uint64_t seed, int64_t gen_index);

// Sample one id from logits[s->vocab] for a request with parameters p and
// seed that had generated gen_index tokens. -1 with mv_error() on bad
// parameters or logits with no finite largest value.
int sampler_sample(sampling_scratch_t *s, const float *logits, const sampling_params_t *p, uint64_t seed,
                   int64_t gen_index, int32_t *out);

// The whole of it for one request: logits[vocab] (changed in place by
// min_tokens and the penalties), the sequence so far, and lp (NULL, or
// filled when p->logprobs). gen_index = seq->num_tokens - seq->num_prompt.
int sampler_sample_seq(sampler_scratch_t *s, float *logits, const sampling_params_t *p, uint64_t seed,
                       const sampler_seq_t *seq, int32_t *out, sampler_logprob_t *lp);

#ifdef __cplusplus
}
#endif
#endif

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

// 0 when temperature >= 0 (and finite), top_k >= 0 and top_p in (0, 1];
// else -1 with mv_error() naming the bad value.
int sampler_validate_params(const sampling_params_t *p);

// The reference's row for a request's next token.
sampling_row_t sampler_row(const sampling_params_t *p, uint64_t seed, int64_t gen_index);

// Sample one id from logits[s->vocab] for a request with parameters p and
// seed that had generated gen_index tokens. -1 with mv_error() on bad
// parameters or logits with no finite largest value.
int sampler_sample(sampling_scratch_t *s, const float *logits, const sampling_params_t *p, uint64_t seed,
                   int64_t gen_index, int32_t *out);

#ifdef __cplusplus
}
#endif
#endif

/*
 * chapters/09-engine/sampler.h - from one row of logits to one token id, on
 * the host.
 *
 * Where it sits: after the model runner's LM head, once per sampled row of
 * a step; its token goes back to the scheduler (scheduler_postprocess).
 *
 * The rules, in vLLM's order:
 *   - temperature 0: greedy, the argmax; on a tie the lowest id wins, so
 *     the choice never depends on how the logits were reduced.
 *   - otherwise logits / temperature, then
 *       top-k: keep the k largest (0 = off),
 *       top-p: of those, keep the smallest set, largest first, whose
 *              probability sums to at least p (1 = off; the largest always
 *              stays),
 *     softmax over what is kept, and one uniform draw picks the token.
 *
 * Randomness: each request has its own splitmix64 state, seeded from the
 * request's seed. A draw depends only on that state, never on the batch
 * the request happened to run in, so the same seed gives the same tokens
 * whatever else was running (as vLLM's per-request generators do).
 *
 * The CUDA backend samples on the GPU (kernels/sampling.h) with the same
 * rules and its own counter-based generator (Philox keyed by the seed and
 * the token's index); this host sampler is its reference. Library code: 0 / -1 with mv_error(). Tests: tests/test_engine_cpu.c.
 */
#ifndef MV_SAMPLER_H
#define MV_SAMPLER_H

#include <stdint.h>

#include "chapters/08-scheduler/sequence.h"

#ifdef __cplusplus
extern "C" {
#endif

// splitmix64 (Steele, Lea, Flood 2014): a 64-bit state, advanced by a
// constant, then mixed; every seed gives a good stream.
static inline uint64_t splitmix64_next(uint64_t *state) {
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

// A uniform double in [0, 1) from the top 53 bits of the next draw.
static inline double splitmix64_uniform(uint64_t *state) {
    return (double)(splitmix64_next(state) >> 11) * 0x1.0p-53;
}

// Scratch for one vocabulary: reused across calls (one per thread).
typedef struct {
    int vocab;
    int32_t *ids;  // [vocab] candidate ids, sorted by logit
    float *probs;  // [vocab] their probabilities
} sampler_t;

int sampler_init(sampler_t *s, int vocab);
void sampler_free(sampler_t *s);

// The argmax of logits[vocab], lowest id on ties (NaN never wins).
int32_t sampler_argmax(const float *logits, int vocab);

// 0 when temperature >= 0, top_k >= 0 and top_p in (0, 1]; else -1 with
// mv_error() naming the bad value.
int sampler_validate_params(const sampling_params_t *p);

// Sample one id from logits[vocab] with p's temperature/top_k/top_p;
// greedy (and no draw from *rng) when temperature is 0.
// -1 with mv_error() on bad parameters or logits with no finite value.
int sampler_sample(sampler_t *s, const float *logits, const sampling_params_t *p, uint64_t *rng, int32_t *out);

#ifdef __cplusplus
}
#endif
#endif

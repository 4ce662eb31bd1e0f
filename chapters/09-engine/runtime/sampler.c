/*
 * chapters/09-engine/runtime/sampler.c - the engine's host sampler, a thin
 * layer over reference/sampling.c (see sampler.h).
 */
#include "chapters/09-engine/runtime/sampler.h"


sampling_row_t sampler_row(const sampling_params_t *p, uint64_t seed, int64_t gen_index) {
    return (sampling_row_t){p->temperature, p->top_k, p->top_p, seed, gen_index};
}

int sampler_validate_params(const sampling_params_t *p) {
    const sampling_row_t r = sampler_row(p, 0, 0);
    return sampling_row_validate(&r);
}

int sampler_sample(sampling_scratch_t *s, const float *logits, const sampling_params_t *p, uint64_t seed,
                   int64_t gen_index, int32_t *out) {
    const sampling_row_t r = sampler_row(p, seed, gen_index);
    return sample_token_cpu(s, logits, &r, out);
}

/*
 * chapters/09-engine/runtime/sampler.c - the engine's host sampler, a thin
 * layer over reference/sampling.c (see sampler.h).
 */
#include "chapters/09-engine/runtime/sampler.h"


#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/check.h"

sampling_row_t sampler_row(const sampling_params_t *p, uint64_t seed, int64_t gen_index) {
    return (sampling_row_t){p->temperature, p->top_k, p->top_p, seed, gen_index, p->min_p};
}

static float repetition_of(const sampling_params_t *p) {
    return p->repetition_penalty == 0 ? 1.0f : p->repetition_penalty;
}

int sampler_validate_params(const sampling_params_t *p) {
    const sampling_row_t r = sampler_row(p, 0, 0);
    if (sampling_row_validate(&r)) return -1;
    if (p->min_tokens < 0 || (p->max_tokens > 0 && p->min_tokens > p->max_tokens))
        return mv_error("sampling: min_tokens %d must be in [0, max_tokens = %d]", p->min_tokens, p->max_tokens);
    if (!isfinite(p->presence_penalty) || !isfinite(p->frequency_penalty) || !(repetition_of(p) > 0) ||
        !isfinite(p->repetition_penalty))
        return mv_error("sampling: presence_penalty %g and frequency_penalty %g must be finite, "
                        "repetition_penalty %g > 0", p->presence_penalty, p->frequency_penalty, p->repetition_penalty);
    if (p->top_logprobs < 0 || p->top_logprobs > SAMPLING_MAX_TOP_LOGPROBS || (p->top_logprobs && !p->logprobs))
        return mv_error("sampling: top_logprobs %d must be in [0, %d], and needs logprobs", p->top_logprobs,
                        SAMPLING_MAX_TOP_LOGPROBS);
    return 0;
}

int sampler_scratch_init(sampler_scratch_t *s, int vocab) {
    *s = (sampler_scratch_t){0};
    return sampling_scratch_init(&s->ref, vocab);
}

void sampler_scratch_free(sampler_scratch_t *s) {
    sampling_scratch_free(&s->ref);
    free(s->ids);
    free(s->raw);
    *s = (sampler_scratch_t){0};
}

static int has_penalties(const sampling_params_t *p) {
    return p->presence_penalty != 0 || p->frequency_penalty != 0 || repetition_of(p) != 1.0f;
}

int sampler_uses_options(const sampling_params_t *p, int64_t gen_index) {
    return has_penalties(p) || p->min_p > 0 || p->logprobs || gen_index < p->min_tokens;
}

sampling_opts_row_t sampler_opts_off(void) {
    return (sampling_opts_row_t){.repetition = 1.0f, .top_logprobs = -1};
}

int sampler_opts_row(const sampling_params_t *p, const sampler_seq_t *seq, sampling_opts_row_t *row, int32_t *ids,
                     int ids_cap, int *num_ids) {
    const int64_t gen_index = seq->num_tokens - seq->num_prompt;
    const int mask = gen_index < p->min_tokens ? seq->num_stop_ids : 0;
    const int pen = has_penalties(p) ? seq->num_tokens : 0;
    if (*num_ids + pen + mask > ids_cap)
        return mv_error("sampling: a step's penalty and min_tokens ids pass the device's %d", ids_cap);
    *row = sampler_opts_off();
    row->temperature = p->temperature;
    row->min_p = p->min_p;
    if (pen) {
        row->presence = p->presence_penalty;
        row->frequency = p->frequency_penalty;
        row->repetition = repetition_of(p);
        row->ids_start = *num_ids;
        row->num_prompt = seq->num_prompt;
        row->num_output = seq->num_tokens - seq->num_prompt;
        memcpy(ids + *num_ids, seq->tokens, (size_t)pen * sizeof *ids);
        *num_ids += pen;
    }
    if (mask) {
        row->stop_start = *num_ids;
        row->num_stop = mask;
        memcpy(ids + *num_ids, seq->stop_ids, (size_t)mask * sizeof *ids);
        *num_ids += mask;
    }
    if (p->logprobs) row->top_logprobs = p->top_logprobs;
    return 0;
}

void sampler_logprob_from_gpu(const sampling_logprobs_t *g, sampler_logprob_t *out) {
    out->logprob = g->token_logprob;
    out->num_top = g->num_top;
    for (int k = 0; k < g->num_top && k < SAMPLING_MAX_TOP_LOGPROBS; k++) {
        out->top_ids[k] = g->top_ids[k];
        out->top_logprobs[k] = g->top_logprobs[k];
    }
}

int sampler_sample_seq(sampler_scratch_t *s, float *logits, const sampling_params_t *p, uint64_t seed,
                       const sampler_seq_t *seq, int32_t *out, sampler_logprob_t *lp) {
    const int V = s->ref.vocab;
    const int64_t gen_index = seq->num_tokens - seq->num_prompt;
    const int mask = gen_index < p->min_tokens && seq->num_stop_ids > 0;
    const int want_lp = lp && p->logprobs;
    // logprobs are of the raw logits: kept aside when min_tokens or a penalty is about to change them.
    const float *raw = logits;
    if (want_lp && (mask || has_penalties(p))) {
        if (!s->raw && !(s->raw = malloc((size_t)V * sizeof *s->raw)))
            return mv_error("sampling: out of memory for a row of %d logits", V);
        memcpy(s->raw, logits, (size_t)V * sizeof *s->raw);
        raw = s->raw;
    }
    for (int k = 0; mask && k < seq->num_stop_ids; k++)
        if (seq->stop_ids[k] >= 0 && seq->stop_ids[k] < V) logits[seq->stop_ids[k]] = -INFINITY;
    if (has_penalties(p)) {
        if (seq->num_tokens > s->ids_cap) {
            uint64_t *ids = realloc(s->ids, (size_t)seq->num_tokens * sizeof *ids);
            if (!ids) return mv_error("sampling: out of memory for %d penalty ids", seq->num_tokens);
            s->ids = ids;
            s->ids_cap = seq->num_tokens;
        }
        if (sampling_apply_penalties_cpu(logits, V, seq->tokens, seq->num_prompt, seq->tokens + seq->num_prompt,
                                         (int)gen_index, p->presence_penalty, p->frequency_penalty, repetition_of(p),
                                         s->ids))
            return -1;
    }
    if (sampler_sample(&s->ref, logits, p, seed, gen_index, out)) return -1;
    if (!want_lp) return 0;
    lp->num_top = p->top_logprobs;
    return sampling_logprobs_cpu(raw, V, *out, p->top_logprobs, &lp->logprob, lp->top_ids, lp->top_logprobs);
}

int sampler_sample(sampling_scratch_t *s, const float *logits, const sampling_params_t *p, uint64_t seed,
                   int64_t gen_index, int32_t *out) {
    const sampling_row_t r = sampler_row(p, seed, gen_index);
    return sample_token_cpu(s, logits, &r, out);
}

/*
 * chapters/09-engine/sampler.c - greedy, temperature, top-k and top-p
 * sampling on the host (see sampler.h).
 */
#include "chapters/09-engine/sampler.h"

#include <math.h>
#include <stdlib.h>

#include "common/check.h"

int sampler_init(sampler_t *s, int vocab) {
    *s = (sampler_t){0};
    if (vocab < 1) return mv_error("sampler: vocab must be >= 1, got %d", vocab);
    s->vocab = vocab;
    s->ids = malloc((size_t)vocab * sizeof *s->ids);
    s->probs = malloc((size_t)vocab * sizeof *s->probs);
    if (!s->ids || !s->probs) {
        sampler_free(s);
        return mv_error("sampler: out of memory for a vocabulary of %d", vocab);
    }
    return 0;
}

void sampler_free(sampler_t *s) {
    free(s->ids);
    free(s->probs);
    *s = (sampler_t){0};
}

int32_t sampler_argmax(const float *logits, int vocab) {
    int32_t best = -1;
    for (int32_t i = 0; i < vocab; i++)
        if (!isnan(logits[i]) && (best < 0 || logits[i] > logits[best])) best = i;  // '>' keeps the lowest id
    return best;
}

// qsort's comparator over ids, by logit descending then id ascending: a
// total order, so the candidates' order never depends on qsort's algorithm.
static _Thread_local const float *t_sort_logits;  // set just before qsort, read by the comparator

static int by_logit_desc(const void *a, const void *b) {
    int32_t i = *(const int32_t *)a, j = *(const int32_t *)b;
    float x = t_sort_logits[i], y = t_sort_logits[j];
    if (x != y) return x > y ? -1 : 1;
    return (i > j) - (i < j);
}

int sampler_validate_params(const sampling_params_t *p) {
    if (!(p->temperature >= 0) || !isfinite(p->temperature) || p->top_k < 0 || !(p->top_p > 0 && p->top_p <= 1))
        return mv_error("sampler: temperature %g must be >= 0, top_k %d >= 0, top_p %g in (0, 1]", p->temperature,
                        p->top_k, p->top_p);
    return 0;
}

int sampler_sample(sampler_t *s, const float *logits, const sampling_params_t *p, uint64_t *rng, int32_t *out) {
    const int V = s->vocab;
    if (sampler_validate_params(p)) return -1;
    int32_t best = sampler_argmax(logits, V);
    if (best < 0 || !isfinite(logits[best])) return mv_error("sampler: the logits have no finite value");
    if (p->temperature == 0) {
        *out = best;
        return 0;
    }
    // Candidates: the finite logits, sorted (NaN and -inf can never be drawn).
    int n = 0;
    for (int32_t i = 0; i < V; i++)
        if (isfinite(logits[i])) s->ids[n++] = i;
    t_sort_logits = logits;
    qsort(s->ids, (size_t)n, sizeof *s->ids, by_logit_desc);
    if (p->top_k > 0 && p->top_k < n) n = p->top_k;
    // Softmax of logits / temperature over the kept candidates, in double
    // for the sum; the largest logit is subtracted so exp() cannot overflow.
    const double inv_t = 1.0 / p->temperature, top = logits[s->ids[0]];
    double sum = 0;
    for (int k = 0; k < n; k++) {
        s->probs[k] = (float)exp(((double)logits[s->ids[k]] - top) * inv_t);
        sum += s->probs[k];
    }
    if (p->top_p < 1) {
        double cum = 0;
        int keep = n;
        for (int k = 0; k < n; k++) {
            cum += s->probs[k] / sum;
            if (cum >= p->top_p) {
                keep = k + 1;
                break;
            }
        }
        sum = 0;
        for (int k = 0; k < keep; k++) sum += s->probs[k];
        n = keep;
    }
    double u = splitmix64_uniform(rng) * sum, acc = 0;
    *out = s->ids[n - 1];  // rounding can leave u just above the last partial sum
    for (int k = 0; k < n; k++) {
        acc += s->probs[k];
        if (u < acc) {
            *out = s->ids[k];
            break;
        }
    }
    return 0;
}

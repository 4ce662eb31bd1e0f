/*
 * reference/sampling.c - token sampling on the CPU (see sampling.h for the
 * rule). Clarity first: this is the code the GPU sampler is checked against,
 * and every number in it comes from reference/sampling_math.h.
 */
#include "reference/sampling.h"

#include <math.h>
#include <stdlib.h>

#include "common/check.h"
#include "reference/sampling_math.h"

int sampling_scratch_init(sampling_scratch_t *s, int vocab) {
    *s = (sampling_scratch_t){0};
    if (vocab < 1) return mv_error("sampling: vocab must be >= 1, got %d", vocab);
    s->order = malloc((size_t)vocab * sizeof *s->order);
    if (!s->order) return mv_error("sampling: out of memory for a vocabulary of %d", vocab);
    s->vocab = vocab;
    return 0;
}

void sampling_scratch_free(sampling_scratch_t *s) {
    free(s->order);
    *s = (sampling_scratch_t){0};
}

int sampling_row_validate(const sampling_row_t *r) {
    if (!(r->temperature >= 0) || !isfinite(r->temperature) || r->top_k < 0 || !(r->top_p > 0 && r->top_p <= 1))
        return mv_error("sampling: temperature %g must be >= 0 and finite, top_k %d >= 0, top_p %g in (0, 1]",
                        r->temperature, r->top_k, r->top_p);
    if (r->gen_index < 0) return mv_error("sampling: gen_index %lld must be >= 0", (long long)r->gen_index);
    if (!(r->min_p >= 0 && r->min_p <= 1)) return mv_error("sampling: min_p %g must be in [0, 1]", r->min_p);
    return 0;
}

int32_t sampling_argmax_cpu(const float *logits, int vocab) {
    uint64_t best = 0;  // below every pack
    for (int32_t i = 0; i < vocab; i++) {
        if (isnan(logits[i])) continue;
        const uint64_t p = sampling_pack(sampling_order_key(logits[i]), i);
        if (p > best) best = p;
    }
    return best ? sampling_unpack_id(best) : -1;
}

// qsort's comparator: larger pack first (larger logit, then lower id).
static int by_pack_desc(const void *a, const void *b) {
    const uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x < y) - (x > y);
}

// 1 and *top = the largest logit when that is finite, else 0.
static int finite_top(const float *logits, int vocab, float *top) {
    const int32_t best = sampling_argmax_cpu(logits, vocab);
    if (best < 0 || !isfinite(logits[best])) return 0;
    *top = logits[best];
    return 1;
}

static int top_logit(const float *logits, int vocab, float *top) {
    if (!finite_top(logits, vocab, top))
        return mv_error("sampling: the logits have no finite largest value (all NaN or -inf, or a +inf)");
    return 0;
}

// The finite logits into s->order as packs, in id order; their number.
static int collect_finite(sampling_scratch_t *s, const float *logits) {
    int n = 0;
    for (int32_t i = 0; i < s->vocab; i++)
        if (isfinite(logits[i])) s->order[n++] = sampling_pack(sampling_order_key(logits[i]), i);
    return n;
}

// a[i] below its children: the min-heap of a[0, n) from i down.
static void sift_down(uint64_t *a, int n, int i) {
    for (;;) {
        int m = i, l = 2 * i + 1, r = l + 1;
        if (l < n && a[l] < a[m]) m = l;
        if (r < n && a[r] < a[m]) m = r;
        if (m == i) return;
        const uint64_t t = a[i];
        a[i] = a[m], a[m] = t;
        i = m;
    }
}

// The k largest of a[0, n) into a[0, k), in no order: a min-heap of k,
// each later element replacing the root when larger. O(n log k) at worst,
// and about n comparisons when, as usual, few later elements are larger.
static void keep_largest(uint64_t *a, int n, int k) {
    for (int i = k / 2 - 1; i >= 0; i--) sift_down(a, k, i);
    for (int j = k; j < n; j++)
        if (a[j] > a[0]) {
            a[0] = a[j];
            sift_down(a, k, 0);
        }
}

// Order the candidates and cut them: top-k, then top-p by integer masses.
static int kept_prefix(sampling_scratch_t *s, const float *logits, const sampling_row_t *r, float top) {
    int n = collect_finite(s, logits);
    if (r->top_k > 0 && r->top_k < n) {  // only the first k of the order are needed, sorted
        keep_largest(s->order, n, r->top_k);
        n = r->top_k;
    }
    qsort(s->order, (size_t)n, sizeof *s->order, by_pack_desc);
    const float inv_t = sampling_inv_temperature(r->temperature);
    if (r->min_p > 0) {  // masses fall along the order: the kept ones are a prefix
        const uint64_t floor_mass = (uint64_t)ceil((double)r->min_p * 4294967296.0);
        int keep = 1;  // the top token's mass is 2^32 >= floor_mass
        while (keep < n && sampling_mass(sampling_log_weight(logits[sampling_unpack_id(s->order[keep])], top, inv_t)) >= floor_mass)
            keep++;
        n = keep;
    }
    if (r->top_p < 1.0f) {
        uint64_t mass = 0;
        for (int k = 0; k < n; k++)
            mass += sampling_mass(sampling_log_weight(logits[sampling_unpack_id(s->order[k])], top, inv_t));
        const uint64_t target = sampling_top_p_target(r->top_p, mass);
        uint64_t cum = 0;
        int keep = 0;
        while (cum < target)  // stops by n: the whole prefix has mass >= target
            cum += sampling_mass(sampling_log_weight(logits[sampling_unpack_id(s->order[keep++])], top, inv_t));
        n = keep;
    }
    return n;
}

int sampling_kept_cpu(sampling_scratch_t *s, const float *logits, const sampling_row_t *r, int *n_kept) {
    float top = 0;
    if (sampling_row_validate(r) || top_logit(logits, s->vocab, &top)) return -1;
    if (r->temperature == 0) return mv_error("sampling: temperature 0 is greedy: it keeps no set to draw from");
    *n_kept = kept_prefix(s, logits, r, top);
    return 0;
}

// The Gumbel-max draw over the packs cand[0, n), the top token among them:
// the largest score, ties to the lower id. A token whose log weight is
// below SAMPLING_NEVER_WINS cannot beat the top token's score, whatever
// the two uniforms (sampling_math.h), so its uniform is not computed: the
// same id, without 150k Philox draws and logs on a typical row.
static int32_t gumbel_argmax(const uint64_t *cand, int n, const float *logits, float top, const sampling_row_t *r) {
    const float inv_t = sampling_inv_temperature(r->temperature);
    uint64_t pick = 0;
    for (int k = 0; k < n; k++) {
        const int32_t id = sampling_unpack_id(cand[k]);
        const float x = sampling_log_weight(logits[id], top, inv_t);
        if (x < SAMPLING_NEVER_WINS) continue;
        const uint64_t q = sampling_pack(sampling_order_key(sampling_gumbel_score(x, r->seed, r->gen_index, id)), id);
        if (q > pick) pick = q;
    }
    return sampling_unpack_id(pick);
}

int sample_token_cpu(sampling_scratch_t *s, const float *logits, const sampling_row_t *r, int32_t *out) {
    float top = 0;
    if (sampling_row_validate(r) || top_logit(logits, s->vocab, &top)) return -1;
    if (r->temperature == 0) {
        *out = sampling_argmax_cpu(logits, s->vocab);
        return 0;
    }
    // Without a cut the kept set is every finite logit, and the draw is an
    // argmax over a set: no order needed, so no sort.
    const int cut = r->top_k > 0 || r->top_p < 1.0f || r->min_p > 0;
    const int n = cut ? kept_prefix(s, logits, r, top) : collect_finite(s, logits);
    *out = gumbel_argmax(s->order, n, logits, top, r);
    return 0;
}

int sample_tokens_cpu(int32_t *out, const float *logits, long long logits_stride, int num_rows, int vocab,
                      const float *temperature, const int32_t *top_k, const float *top_p, const uint64_t *seed,
                      const int64_t *gen_index) {
    if (num_rows < 0 || vocab < 1 || logits_stride < vocab)
        return mv_error("sample_tokens_cpu: bad shape rows=%d vocab=%d stride=%lld", num_rows, vocab, logits_stride);
    for (int k = 0; k < num_rows; k++) {
        const sampling_row_t r = {.temperature = temperature[k], .top_k = top_k[k], .top_p = top_p[k], .seed = seed[k], .gen_index = gen_index[k]};
        if (sampling_row_validate(&r)) return mv_error_prefix("sample_tokens_cpu: row %d", k);
    }
    sampling_scratch_t s;
    if (num_rows == 0) return 0;
    if (sampling_scratch_init(&s, vocab)) return -1;
    for (int k = 0; k < num_rows; k++) {
        const float *x = logits + (long long)k * logits_stride;
        const sampling_row_t r = {.temperature = temperature[k], .top_k = top_k[k], .top_p = top_p[k], .seed = seed[k], .gen_index = gen_index[k]};
        float top = 0;
        if (!finite_top(x, vocab, &top)) out[k] = -1;  // the kernel's answer for such a row
        else if (sample_token_cpu(&s, x, &r, &out[k])) {
            sampling_scratch_free(&s);
            return mv_error_prefix("sample_tokens_cpu: row %d", k);
        }
    }
    sampling_scratch_free(&s);
    return 0;
}

// ---- penalties and logprobs ------------------------------------------------------------

static int by_u64_asc(const void *a, const void *b) {
    const uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

int sampling_apply_penalties_cpu(float *logits, int vocab, const int32_t *prompt, int num_prompt,
                                 const int32_t *output, int num_output, float presence, float frequency,
                                 float repetition, uint64_t *scratch) {
    if (!(repetition > 0) || !isfinite(repetition) || !isfinite(presence) || !isfinite(frequency))
        return mv_error("sampling: repetition_penalty %g must be > 0, presence %g and frequency %g finite",
                        repetition, presence, frequency);
    // Each id as (id, 1 if from the output), sorted: an id's entries are adjacent.
    const int n = num_prompt + num_output;
    for (int k = 0; k < n; k++) {
        const int32_t id = k < num_prompt ? prompt[k] : output[k - num_prompt];
        if (id < 0 || id >= vocab) return mv_error("sampling: penalty id %d is outside [0, %d)", id, vocab);
        scratch[k] = (uint64_t)id << 1 | (uint64_t)(k >= num_prompt);
    }
    qsort(scratch, (size_t)n, sizeof *scratch, by_u64_asc);
    for (int k = 0; k < n;) {
        const int32_t id = (int32_t)(scratch[k] >> 1);
        int count = 0;  // times generated
        int j = k;
        for (; j < n && (int32_t)(scratch[j] >> 1) == id; j++) count += (int)(scratch[j] & 1);
        float x = logits[id];
        if (repetition != 1.0f) x = x > 0 ? x / repetition : x * repetition;
        x -= frequency * (float)count;
        if (count > 0) x -= presence;
        logits[id] = x;
        k = j;
    }
    return 0;
}

int sampling_logprobs_cpu(const float *logits, int vocab, int32_t token, int top_n, float *token_lp,
                          int32_t *top_ids, float *top_lps) {
    float top = 0;
    if (top_n < 0 || top_n > SAMPLING_MAX_TOP_LOGPROBS || top_n > vocab)
        return mv_error("sampling: top_logprobs %d must be in [0, %d]", top_n, SAMPLING_MAX_TOP_LOGPROBS);
    if (token < 0 || token >= vocab) return mv_error("sampling: token %d is outside [0, %d)", token, vocab);
    if (top_logit(logits, vocab, &top)) return -1;
    double sum = 0;
    for (int i = 0; i < vocab; i++)
        if (!isnan(logits[i])) sum += exp((double)logits[i] - (double)top);
    const double lse = (double)top + log(sum);
    *token_lp = isnan(logits[token]) ? -INFINITY : (float)((double)logits[token] - lse);
    // The top_n largest in the sampler's order, by insertion into a short sorted list.
    uint64_t best[SAMPLING_MAX_TOP_LOGPROBS];
    int m = 0;
    for (int32_t i = 0; top_n > 0 && i < vocab; i++) {
        if (isnan(logits[i])) continue;
        const uint64_t p = sampling_pack(sampling_order_key(logits[i]), i);
        if (m == top_n && p <= best[m - 1]) continue;
        int j = m < top_n ? m++ : m - 1;
        while (j > 0 && best[j - 1] < p) best[j] = best[j - 1], j--;
        best[j] = p;
    }
    for (int k = 0; k < m; k++) {
        top_ids[k] = sampling_unpack_id(best[k]);
        top_lps[k] = (float)((double)logits[top_ids[k]] - lse);
    }
    for (int k = m; k < top_n; k++) top_ids[k] = -1, top_lps[k] = -INFINITY;  // fewer non-NaN ids than asked
    return 0;
}

int sampling_min_p_mask_cpu(float *logits, int vocab, float temperature, float min_p) {
    if (vocab < 1) return mv_error("sampling: vocab must be >= 1, got %d", vocab);
    if (!(temperature >= 0) || !isfinite(temperature) || !(min_p >= 0 && min_p <= 1))
        return mv_error("sampling: temperature %g must be >= 0 and finite, min_p %g in [0, 1]", temperature, min_p);
    float top = 0;
    if (temperature == 0 || min_p == 0 || !finite_top(logits, vocab, &top)) return 0;
    const float inv_t = sampling_inv_temperature(temperature);
    const uint64_t floor_mass = (uint64_t)ceil((double)min_p * 4294967296.0);  // as kept_prefix's
    uint64_t fail = 0;  // the first pack of the order whose mass is short; 0: none is
    for (int32_t i = 0; i < vocab; i++) {
        if (!isfinite(logits[i]) || sampling_mass(sampling_log_weight(logits[i], top, inv_t)) >= floor_mass) continue;
        const uint64_t p = sampling_pack(sampling_order_key(logits[i]), i);
        if (p > fail) fail = p;
    }
    for (int32_t i = 0; fail && i < vocab; i++)  // the top token's mass is 2^32: it is never dropped
        if (isfinite(logits[i]) && sampling_pack(sampling_order_key(logits[i]), i) <= fail) logits[i] = -INFINITY;
    return 0;
}

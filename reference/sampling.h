/*
 * reference/sampling.h - CPU reference of token sampling: from one row of
 * logits to one token id, with greedy, temperature, top-k and top-p.
 *
 * Where it sits in Qwen3 inference: after the LM head, once per sampled
 * row of a step; the id goes back to the scheduler. The engine's CPU
 * backend samples with it (chapters/09-engine/runtime/sampler.h), and the
 * GPU sampler (kernels/sampling.h) is checked against it token for token:
 * for the same fp32 logits, parameters, seed and gen_index both return the
 * same id, every time (build/engine_check).
 *
 * The rule (vLLM's order):
 *   1. greedy (temperature 0): the argmax; a tie goes to the lowest id, -0
 *      and +0 tie, NaN never wins. If the largest non-NaN logit is not
 *      finite (all NaN, all -inf, or a +inf) the row has no answer: an
 *      error here, -1 from the GPU.
 *   2. otherwise the candidates are the finite logits in the order (logit
 *      descending, id ascending), a total order. top-k keeps the first k
 *      (0 = off). Each candidate has the log weight x = (logit - top) / T
 *      (T the temperature, top the largest logit; in fp32 as (logit - top)
 *      times 1/T, sampling_math.h) and the integer mass
 *      floor(e^x 2^32). top-p keeps, of those, the shortest prefix whose
 *      mass reaches ceil(top_p * their total mass) (1 = off; the top token
 *      always stays). min_p (0 = off), before top-k and top-p as in vLLM,
 *      keeps the candidates whose mass is at least ceil(min_p 2^32), the
 *      top token's being 2^32: those at least min_p times as likely as it.
 *   3. the draw: the kept token with the largest Gumbel score
 *      x + g, g = -log(-log(u)), u = Philox4x32-10 of (seed; token id,
 *      gen_index), a tie going to the lower id. That picks token i with
 *      probability e^x_i / sum over the kept of e^x: softmax(logits / T)
 *      restricted to the kept set.
 *
 * Why the two backends agree exactly: every number the rule uses comes
 * from reference/sampling_math.h, one copy for both (exp and log from IEEE
 * operations only, never contracted), the masses are integers (their sums
 * are the same in any order, block reduction or loop), the top-p target is
 * one integer computed the same way, and u depends only on (seed,
 * gen_index, id), never on the batch or the order rows run in.
 *
 * This file sorts the finite logits (a qsort, when top-k or top-p cut) and
 * walks the prefix; the kernel finds the same prefix without sorting the
 * row: by bisection (version 1), or among the few candidates that per-thread
 * shortlists leave (version 2). Library code: 0 / -1 with mv_error(). Tests: tests/test_sampling.c.
 */
#ifndef MV_REF_SAMPLING_H
#define MV_REF_SAMPLING_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// One row's sampling parameters and the key of its draw.
typedef struct {
    float temperature;  // >= 0 and finite; 0 = greedy
    int32_t top_k;      // >= 0; 0 = off (k >= the finite logits: off too)
    float top_p;        // in (0, 1]; 1 = off
    uint64_t seed;      // the request's seed
    int64_t gen_index;  // >= 0: tokens the request had generated before this one
    float min_p;        // in [0, 1]; 0 = off (kernels/sampling.h has none: the GPU masks the row first,
                        // sampling_min_p_mask_cpu below, kernels/sampling_opts.h)
} sampling_row_t;

// Scratch for one vocabulary, reused across calls (one per thread).
typedef struct {
    int vocab;
    uint64_t *order;  // [vocab] candidates as sampling_pack(order key, id); after sampling_kept_cpu
                      //         the kept ones first, in the order
} sampling_scratch_t;

int sampling_scratch_init(sampling_scratch_t *s, int vocab);
void sampling_scratch_free(sampling_scratch_t *s);

// 0 when temperature >= 0 and finite, top_k >= 0, top_p in (0, 1] and
// gen_index >= 0; else -1 with mv_error() naming the bad value.
int sampling_row_validate(const sampling_row_t *r);

// The argmax of logits[vocab] in the sampler's order (lowest id on ties,
// -0 = +0, NaN never wins); -1 when every logit is NaN.
int32_t sampling_argmax_cpu(const float *logits, int vocab);

// The kept set of a row with temperature > 0: s->order[0, *n_kept) in the
// order (sampling_unpack_id gives the ids). -1 with mv_error() on bad
// parameters, temperature 0, or logits with no finite largest value.
int sampling_kept_cpu(sampling_scratch_t *s, const float *logits, const sampling_row_t *r, int *n_kept);

// One token id from logits[s->vocab]. -1 with mv_error() on bad parameters
// or logits whose largest non-NaN value is not finite.
int sample_token_cpu(sampling_scratch_t *s, const float *logits, const sampling_row_t *r, int32_t *out);

// The GPU launcher's contract on the host (kernels/sampling.h,
// sample_tokens_cuda): out [num_rows], logits rows of logits_stride floats,
// per-row parameters in [num_rows] arrays; a row with no finite largest
// logit gets -1. -1 with mv_error() naming the row on bad parameters.
int sample_tokens_cpu(int32_t *out, const float *logits, long long logits_stride, int num_rows, int vocab,
                      const float *temperature, const int32_t *top_k, const float *top_p, const uint64_t *seed,
                      const int64_t *gen_index);

// ---- before the rule: penalties, and the log-probabilities returned ---------------------

// vLLM's penalties on one row of logits, in place, in vLLM's order:
//   repetition (1 = off, > 0): every id of the prompt or the output, once:
//     a logit > 0 is divided by it, any other multiplied;
//   frequency: minus frequency x (times the id was generated);
//   presence:  minus presence for every id generated at least once.
// prompt / output: the sequence's ids; scratch: [num_prompt + num_output]
// (sorted there to count them). Ids outside [0, vocab) are an error.
int sampling_apply_penalties_cpu(float *logits, int vocab, const int32_t *prompt, int num_prompt,
                                 const int32_t *output, int num_output, float presence, float frequency,
                                 float repetition, uint64_t *scratch);

// log_softmax(logits) at `token`, and the top_n largest logits' ids and
// log-probabilities, largest first (ties to the lower id; at most 20): what
// vLLM returns as logprobs (its default, of the raw logits, before
// penalties and temperature). The normaliser is summed in double; a -inf
// logit has log-probability -inf. -1 with mv_error() when the row has no
// finite largest value or top_n is out of range.
#define SAMPLING_MAX_TOP_LOGPROBS 20
int sampling_logprobs_cpu(const float *logits, int vocab, int32_t token, int top_n, float *token_lp,
                          int32_t *top_ids, float *top_lps);

// min_p as a mask, for a sampler without it (the GPU's, kernels/sampling.h):
// the finite logits that min_p's cut of rule 2 drops become -inf, in place,
// so that the rule without min_p on the masked row keeps exactly what the
// rule with min_p keeps on the row, whatever top_k and top_p (and so draws
// the same id). Why that holds: min_p and top-k each keep a prefix of the
// order, so together they keep the shorter one, whichever cuts first; top-p
// then sums the masses of that same prefix. The cut: rule 2 walks the order
// while a mass is >= ceil(min_p 2^32) and stops at the first that is not,
// so with p_fail = the largest pack (sampling_pack) of a finite logit whose
// mass is below, the dropped tokens are the finite ones with a pack <=
// p_fail: one scan for a maximum, then one to mask; exact whether or not
// the masses fall strictly along the order (exp's last bit need not). top
// is the largest logit, as rule 2's, so call it after the penalties.
// Nothing changes when temperature is 0 (greedy ignores min_p), min_p is 0,
// or the row has no finite largest value (the sampler then fails the row).
// -1 with mv_error() when vocab < 1, temperature < 0 or not finite, or
// min_p is outside [0, 1]. kernels/sampling_opts.h does the same on the GPU.
int sampling_min_p_mask_cpu(float *logits, int vocab, float temperature, float min_p);

// ---- the same options on the GPU: what the host uploads, and gets back -------------------
//
// kernels/sampling_opts.h runs min_tokens, the penalties, min_p (as the mask
// above) and logprobs on the device, around the GPU sampler, with these
// functions' numbers. Its two row types are here, plain C, so that host
// code (chapters/09-engine/runtime/sampler.c fills them) builds without CUDA.
#define SAMPLING_OPTS_MAX_TOP 20
#ifdef __cplusplus
static_assert(SAMPLING_OPTS_MAX_TOP == SAMPLING_MAX_TOP_LOGPROBS, "top_logprobs: one bound on both backends");
#else
_Static_assert(SAMPLING_OPTS_MAX_TOP == SAMPLING_MAX_TOP_LOGPROBS, "top_logprobs: one bound on both backends");
#endif

// One row's options, uploaded per step (a device array, one per sampled
// row), filled from the request as sampler_sample_seq reads it: repetition
// 0 means 1, num_stop is 0 once the request has min_tokens tokens,
// top_logprobs is -1 without logprobs. All off (the kernels leave the row at
// once): presence and frequency 0, repetition 1, num_stop 0, top_logprobs
// -1, and min_p 0 or temperature 0.
typedef struct {
    float temperature;  // the sampler's (min_p is relative to the tempered top); 0 = greedy: min_p ignored
    float min_p;        // in [0, 1]; 0 = off
    float presence, frequency, repetition;  // finite, repetition > 0; 0, 0, 1 = off
    int32_t ids_start;   // this row's penalty ids in the step's id array: [ids_start, + num_prompt) the
    int32_t num_prompt;  //   prompt, then num_output generated ids; read only when a penalty is on;
    int32_t num_output;  //   ids outside [0, vocab) are skipped (the host has validated them)
    int32_t stop_start, num_stop;  // min_tokens: the logits of ids[stop_start, + num_stop) set to -inf
    int32_t top_logprobs;          // -1 = no logprobs; else 0..20 top entries besides the token's own
} sampling_opts_row_t;

// One row's logprobs, copied back with the sampled ids; written only for
// rows with top_logprobs >= 0. sampling_logprobs_cpu's numbers, lse summed
// in another order (equal to within a few float ulp), the top ids exactly.
typedef struct {
    double lse;           // log-sum-exp of the raw row, in double as sampling_logprobs_cpu's;
                          // NaN: the raw row has no finite largest value (that function's error: fail the step)
    float token_logprob;  // the sampled token's; -inf for a NaN logit or an id of -1
    int32_t num_top;      // top_logprobs (0 when lse is NaN)
    int32_t top_ids[SAMPLING_OPTS_MAX_TOP];     // largest first, ties to the lower id; -1 past the non-NaN ids
    float top_logprobs[SAMPLING_OPTS_MAX_TOP];  // theirs; -inf past the non-NaN ids
} sampling_logprobs_t;

#ifdef __cplusplus
}
#endif
#endif

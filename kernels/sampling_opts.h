/*
 * kernels/sampling_opts.h - vLLM's other sampling options on the GPU:
 * min_tokens, the presence / frequency / repetition penalties, min_p, and
 * logprobs with top_logprobs, around the GPU sampler (kernels/sampling.h),
 * with no copy of the logits to the host.
 *
 * Where it sits: last in the CUDA backend's step, after the LM head:
 *     sampling_prepare_cuda         the fp32 logits, in place, for the rows that use an option
 *     sample_tokens_cuda            the ids (kernels/sampling.h, unchanged; version 4 reads
 *                                   the bf16 logits, and the fp32 rows prepared here)
 *     sampling_logprobs_finish_cuda each sampled token's log-probability
 * A row whose options are all off leaves both kernels at once, so the
 * three launches can sit in every decode step's CUDA graph.
 *
 * The rule is the host sampler's (chapters/09-engine/runtime/sampler.c,
 * sampler_sample_seq), in its order, and so are the numbers:
 *   1. logprobs are of the RAW logits: log-sum-exp and the top_logprobs
 *      largest (logit descending, id ascending; reference/sampling.c,
 *      sampling_logprobs_cpu), before anything below changes the row;
 *   2. min_tokens: the stop ids' logits become -inf;
 *   3. the penalties, each distinct id of prompt and output once, with the
 *      reference's float operations one IEEE rounding each
 *      (sampling_apply_penalties_cpu): the same bits;
 *   4. min_p, which kernels/sampling.h does not have, as a mask: the finite
 *      logits that the reference's min_p cut drops become -inf
 *      (sampling_min_p_mask_cpu says why top-k and top-p then keep the
 *      reference's set), with the masses of reference/sampling_math.h;
 *   5. sample_tokens_cuda on the prepared row draws the host's id.
 * So the prepared logits equal, bit for bit, the host's row after min_tokens,
 * the penalties and sampling_min_p_mask_cpu, and the ids equal the host's.
 * The log-probabilities are summed in double in another order than the
 * host's: equal to its within a few ulp (build/engine_check states the
 * tolerance); their top ids are the host's exactly.
 *
 * How (one block of 1024 threads per row; costs in kernels/sampling_opts.cu):
 * the top-N of a row without sorting it: each thread keeps its 4 largest
 * packs while it reads the row for the maximum; N rounds of a block maximum
 * over the threads' heads then merge those sorted lists, and a thread that
 * runs out of list having dropped packs makes every thread refill from the
 * row below the last pick. The penalties count ids with atomics in a zeroed
 * [rows, vocab] scratch that the kernel zeroes again as it applies them.
 * min_p: a block maximum finds p_fail, the first pack of the order whose
 * mass is short, then every finite token at or after it is masked.
 *
 * Build: nvcc without -ftz=true / --use_fast_math, as kernels/sampling.h.
 * Check: build/engine_check (tests/gpu/engine_check.c, "sampler options").
 */
#ifndef MV_KERNELS_SAMPLING_OPTS_H
#define MV_KERNELS_SAMPLING_OPTS_H

#include <cuda_runtime_api.h>
#include <stdint.h>

#include "common/bf16.h"
#include "reference/sampling.h"

#ifdef __cplusplus
extern "C" {
#endif

// The types, sampling_opts_row_t (a row's options, uploaded) and
// sampling_logprobs_t (a row's logprobs, copied back), are plain C in
// reference/sampling.h, so that host code builds them without CUDA.

#ifdef __CUDACC__
#define SAMPLING_OPTS_FN static inline __host__ __device__
#else
#define SAMPLING_OPTS_FN static inline
#endif

// 1 when the row has an option on: sampling_prepare_cuda reads and changes
// it; else the kernel leaves the row at once.
SAMPLING_OPTS_FN int sampling_opts_row_on(const sampling_opts_row_t *o) {
    return o->top_logprobs >= 0 || o->num_stop > 0 || o->presence != 0.0f || o->frequency != 0.0f ||
           o->repetition != 1.0f || (o->temperature > 0.0f && o->min_p > 0.0f);
}

// Before sample_tokens_cuda, on the same fp32 logits (rows of logits_stride
// floats, vocab used), in place; one block per row, steps 1-4 above for the
// options each row has on. Device arrays: d_opts [num_rows]; d_ids the
// rows' penalty and stop ids; d_counts [num_rows * vocab] uint32, all zero
// on entry and left all zero (zero it once, at allocation); d_raw rows of
// logits_stride floats, the raw copy of each row with logprobs (finish reads
// the sampled token's logit there); d_lp [num_rows]. No allocation, no host
// sync: graph-capturable. num_rows 0 is a no-op.
int sampling_prepare_cuda(float *d_logits, long long logits_stride, int num_rows, int vocab,
                          const sampling_opts_row_t *d_opts, const int32_t *d_ids, uint32_t *d_counts,
                          float *d_raw, sampling_logprobs_t *d_lp, cudaStream_t stream);

// The same for version 4 of the sampler (kernels/sampling.h), which reads
// the LM head's bf16 logits: each row with an option on is first widened
// from d_src (rows of logits_stride bf16) into d_logits, then prepared there
// as above; the other rows' d_logits are not touched (version 4 reads them
// from d_src).
int sampling_prepare_bf16_cuda(float *d_logits, const bf16_t *d_src, long long logits_stride, int num_rows,
                               int vocab, const sampling_opts_row_t *d_opts, const int32_t *d_ids,
                               uint32_t *d_counts, float *d_raw, sampling_logprobs_t *d_lp, cudaStream_t stream);

// After sample_tokens_cuda: d_lp[row].token_logprob = the sampled token's
// raw logit minus lse, rounded to float, for the rows with top_logprobs >=
// 0 (the others untouched); -inf for a NaN raw logit or an id of -1, as the
// reference. d_sampled [num_rows]; ids outside [0, logits_stride) read
// nothing.
int sampling_logprobs_finish_cuda(const int32_t *d_sampled, const float *d_raw, long long logits_stride,
                                  int num_rows, const sampling_opts_row_t *d_opts, sampling_logprobs_t *d_lp,
                                  cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif

/*
 * kernels/sampling.h - token sampling on the GPU, callable from C: from the
 * LM head's logits to one token id per row, without copying the logits to
 * the host (152k floats a row for Qwen3, against 4 bytes for the id).
 *
 * Where it sits: last in the CUDA backend's step (chapters/09-engine/
 * model_runner_cuda.c), after the LM head. The rules are those of the host
 * sampler, chapters/09-engine/sampler.h, its reference:
 *
 *   - temperature 0: greedy, the argmax; on a tie the lowest id; NaN never
 *     wins. A row whose largest non-NaN logit is not finite (all NaN, all
 *     -inf, or a +inf) has no answer: its id is -1, and the caller fails
 *     the step, as the host sampler returns an error.
 *   - otherwise the candidates are the finite logits, ordered by logit
 *     descending then id ascending (a total order, as the host's qsort
 *     comparator); top-k keeps the first k; top-p keeps, of those, the
 *     shortest prefix whose probabilities (softmax of logit / temperature
 *     over the top-k) sum to at least p; one token is drawn from what is
 *     kept, in proportion to exp(logit / temperature).
 *
 * How, without sorting 152k values: the kept set is a prefix of that total
 * order, so it is described by a threshold key (a logit value and an id
 * cut for the ties at that value). The threshold is found by bisection on
 * the bits of the value (32 steps, each one pass over the row counting, or
 * summing probability, above the candidate), then on the id. The draw is
 * the Gumbel-max trick: argmax over the kept tokens of
 * logit / temperature + g_i, g_i = -log(-log(u_i)), which picks token i with
 * probability exp(logit_i / T) / sum over kept: the same distribution as the
 * host's inverse-CDF walk, in one parallel argmax.
 *
 * Randomness: u_i = Philox4x32-10 (Salmon et al., SC'11) keyed by the
 * request's seed, counter (token id i, gen_index): counter-based, so a draw
 * depends only on (seed, how many tokens the request had generated, i),
 * never on the batch or the order rows run in. Same seed, same tokens on
 * this backend. (The host sampler draws from a splitmix64 stream: the two
 * backends sample the same distribution, not the same tokens.)
 *
 * Versions:
 *   1  one block of 1024 threads per row; every bisection step is one pass
 *      over the row through L2 (about 100 passes for top-k + top-p, 1 for
 *      greedy). Written for reading and exactness; a radix-select version
 *      comes when the engine is timed.
 */
#ifndef MV_KERNELS_SAMPLING_H
#define MV_KERNELS_SAMPLING_H

#include <cuda_runtime_api.h>
#include <stdint.h>

#include "common/bf16.h"

#ifdef __cplusplus
extern "C" {
#endif

#define SAMPLING_NUM_VERSIONS 1
#define SAMPLING_FAST 1  // the version the engine uses

const char *sampling_version_name(int version);

// d_out [num_rows] ids (-1: the row had no finite logit), d_logits rows of
// logits_stride floats, vocab of them used. Per row (device arrays of
// [num_rows]): temperature >= 0 (0 = greedy), top_k >= 0 (0 = off), top_p in
// (0, 1] (1 = off), seed, gen_index >= 0. Checked on the host first
// (sampler_validate_params): a launcher cannot read device memory.
int sample_tokens_cuda(int version, int32_t *d_out, const float *d_logits, long long logits_stride, int num_rows,
                       int vocab, const float *d_temperature, const int32_t *d_top_k, const float *d_top_p,
                       const uint64_t *d_seed, const int64_t *d_gen_index, cudaStream_t stream);

// out [n] fp32 = in [n] bf16: the LM head writes bf16, the sampler and the
// host (on_logits) read fp32.
int bf16_to_f32_cuda(float *d_out, const bf16_t *d_in, long long n, cudaStream_t stream);

// The uniform number in (0, 1) the kernel draws for token `id` of a row
// with this seed and gen_index: Philox4x32-10, the same code on host and
// device, so a check can recompute the Gumbel draw on the host.
float sampling_uniform(uint64_t seed, int64_t gen_index, int32_t id);

#ifdef __cplusplus
}
#endif
#endif

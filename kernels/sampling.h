/*
 * kernels/sampling.h - token sampling on the GPU, callable from C: from the
 * LM head's logits to one token id per row, without copying the logits to
 * the host (152k floats a row for Qwen3, against 4 bytes for the id).
 *
 * Where it sits: last in the CUDA backend's step (chapters/09-engine/
 * runtime/runner_cuda.c), after the LM head. The rule is the CPU
 * reference's, reference/sampling.h (greedy with the lowest id on ties;
 * top-k; top-p on integer masses; the Gumbel-max draw keyed by Philox of
 * (seed; token id, gen_index)), and so are the numbers: both take them from
 * reference/sampling_math.h (exp, log and Philox from IEEE operations
 * only, never contracted). So for the same fp32 logits, parameters, seed
 * and gen_index the two backends return the same token id, exactly, every
 * time; build/engine_check requires it row for row. A row whose largest
 * non-NaN logit is not finite (all NaN, all -inf, or a +inf) has no answer:
 * its id is -1, and the caller fails the step, as the reference errs.
 *
 * How, without sorting 152k values: the kept set is a prefix of the order
 * (logit descending, id ascending), so it is described by a threshold (a
 * logit's order key and an id cut for the ties at it), or by the (key, id)
 * pack of its last token. Version 1 finds the threshold by bisection on the
 * key's 32 bits (each step one pass over the row counting tokens, or summing
 * their integer masses, at or above the candidate), then on the id. Version
 * 2 bounds it from each thread's few largest packs and finishes among at most
 * 2048 candidates in shared memory. Integer sums are exact in any order, so
 * the block's reductions reach the same totals as the reference's loop and
 * the same prefix as its sort. The draw is one parallel argmax of the Gumbel
 * scores over the kept tokens, ties to the lower id, as the reference's loop.
 *
 * Randomness: counter-based, so a draw depends only on (seed, how many
 * tokens the request had generated, token id), never on the batch or the
 * order rows run in, nor on the backend.
 *
 * Versions (the same ids, bit for bit; build/engine_check runs each):
 *   1  one block of 1024 threads per row; every bisection step is one pass
 *      over the row (about 100 passes for top-k + top-p, 1 for greedy, 2
 *      for temperature alone): 100 x 608 KB a row for Qwen3's default.
 *      Written for reading and exactness; kept as the readable kernel.
 *   2  one block of 512 threads per row. One
 *      pass keeps each thread's 4 largest finite (key, id) packs in
 *      registers; their union (2048) is sorted in shared memory; its k-th
 *      entry bounds the top-k set, which is the union's first k whenever no
 *      thread's 4th entry lies above it (else one more pass gathers every
 *      pack at or above it). top-p and the Gumbel draw then run on those k
 *      candidates. Passes over the row: greedy 1, temperature alone 2
 *      (the draw scores every token within 20 T of the top: compute-bound),
 *      top-k <= 2048 with or without top-p 1 or 2, top-p alone 2 or 3.
 *      top_k > 2048, more than 2048 packs at or above the bound (finite
 *      logits in a few threads' ids only, or a large k), and top-p alone
 *      when the union does not hold top_p of the mass (flat rows) fall back
 *      to version 1's bisection in the same kernel. Static shared memory (16.6 KB), no
 *      allocation: safe to capture in a CUDA graph. Costs and predicted
 *      times: kernels/sampling.cu.
 *   3  version 2, except that a greedy row
 *      (temperature 0) is cut into up to 32 slices, one block each, when
 *      there are few rows (2 x SMs / rows slices), and the last block of
 *      the row to finish combines their argmaxes (largest pack, count of
 *      finite logits, +inf seen): one row's read spread over 32 SMs instead
 *      of one. Needs a workspace (sample_tokens_ws_bytes), zeroed once when
 *      allocated; each launch leaves it zeroed again. Same ids as 1 and 2.
 *   4  SAMPLING_FAST, the engine's: version 3 reading the LM head's bf16
 *      logits (sample_tokens_bf16_cuda), widened in registers, so that the
 *      engine need not widen every row into an fp32 copy first (at 256
 *      rows: 78 MB read instead of 78 read + 156 written + 156 read;
 *      measured in docs/09-engine.md, section 5). A row
 *      with an option on (kernels/sampling_opts.h) reads the fp32 row that
 *      sampling_prepare_bf16_cuda widened and changed. Widening is exact,
 *      so its ids are version 3's on the widened logits.
 *
 * Build: nvcc without -ftz=true / --use_fast_math (the Makefile's flags):
 * flushing subnormal logits would be the one difference left.
 */
#ifndef MV_KERNELS_SAMPLING_H
#define MV_KERNELS_SAMPLING_H

#include <cuda_runtime_api.h>
#include <stdint.h>

#include "common/bf16.h"
#include "reference/sampling.h"

#ifdef __cplusplus
extern "C" {
#endif

#define SAMPLING_NUM_VERSIONS 4
#define SAMPLING_FAST 4  // the version the engine uses

const char *sampling_version_name(int version);

// d_out [num_rows] ids (-1: the row had no finite logit), d_logits rows of
// logits_stride floats, vocab of them used. Per row (device arrays of
// [num_rows]): temperature >= 0 (0 = greedy), top_k >= 0 (0 = off), top_p in
// (0, 1] (1 = off), seed, gen_index >= 0. Checked on the host first
// (sampler_validate_params, i.e. sampling_row_validate): a launcher cannot
// read device memory. The reference with the same arguments on the host:
// sample_tokens_cpu (reference/sampling.h).
int sample_tokens_cuda(int version, int32_t *d_out, const float *d_logits, long long logits_stride, int num_rows,
                       int vocab, const float *d_temperature, const int32_t *d_top_k, const float *d_top_p,
                       const uint64_t *d_seed, const int64_t *d_gen_index, cudaStream_t stream);

// The same with a device workspace of ws_bytes (16-byte aligned), which
// version 3 needs: sample_tokens_ws_bytes(3, rows) for up to `rows` rows,
// zeroed once after allocation (cudaMemset); every launch leaves it zeroed.
// One launch at a time per workspace. Versions 1 and 2 ignore it
// (sample_tokens_cuda is this call with none).
int sample_tokens_ws_cuda(int version, int32_t *d_out, const float *d_logits, long long logits_stride, int num_rows,
                          int vocab, const float *d_temperature, const int32_t *d_top_k, const float *d_top_p,
                          const uint64_t *d_seed, const int64_t *d_gen_index, void *d_ws, size_t ws_bytes,
                          cudaStream_t stream);
// Bytes of workspace a version needs for up to num_rows rows (0: none).
size_t sample_tokens_ws_bytes(int version, int num_rows);

// Version 4: the same ids from the LM head's bf16 logits, d_logits rows of
// logits_stride bf16 (vocab used). d_opts [num_rows] (NULL: every row reads
// d_logits): a row whose options are on (sampling_opts_row_on) reads its
// fp32 row in d_prepared (the same stride) instead, where
// sampling_prepare_bf16_cuda left it. Workspace as version 3's:
// sample_tokens_ws_bytes(4, rows), zeroed once. sample_tokens_cuda and
// sample_tokens_ws_cuda refuse version 4 (they take fp32 logits).
int sample_tokens_bf16_cuda(int32_t *d_out, const bf16_t *d_logits, const float *d_prepared,
                            const sampling_opts_row_t *d_opts, long long logits_stride, int num_rows, int vocab,
                            const float *d_temperature, const int32_t *d_top_k, const float *d_top_p,
                            const uint64_t *d_seed, const int64_t *d_gen_index, void *d_ws, size_t ws_bytes,
                            cudaStream_t stream);

// out [n] fp32 = in [n] bf16: the LM head writes bf16; versions 1 to 3 of
// the sampler and the host (on_logits) read fp32.
int bf16_to_f32_cuda(float *d_out, const bf16_t *d_in, long long n, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif

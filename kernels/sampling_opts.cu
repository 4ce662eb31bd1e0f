/*
 * kernels/sampling_opts.cu - min_tokens, penalties, min_p and logprobs on
 * the GPU, before and after sample_tokens_cuda (see kernels/sampling_opts.h
 * for the rule). The CPU references are reference/sampling.c's
 * sampling_logprobs_cpu, sampling_apply_penalties_cpu and
 * sampling_min_p_mask_cpu, in the order of the host sampler
 * (chapters/09-engine/runtime/sampler.c, sampler_sample_seq);
 * build/engine_check (tests/gpu/engine_check.c) requires the prepared
 * logits bit for bit, the same ids and the same top ids.
 *
 * One block of 1024 threads per row; a row with every option off returns
 * before it reads anything but its options. Passes over a row with every
 * option on (607,744 bytes each for Qwen3's 151936 fp32 logits):
 *   logprobs    1 read + 1 write (the maximum, each thread's 4 largest packs,
 *               the raw copy), 1 read (the sum of exp in double), then N
 *               rounds of a block maximum (2 barriers each) for top N, and
 *               one more read only when a thread held more than 4 of the top N
 *   min_tokens  a write per stop id
 *   penalties   two walks over the row's ids (4 bytes an id: 1 atomic, then
 *               1 exchange), a read and a write per distinct id
 *   min_p       3 reads (the top after the penalties; p_fail, one
 *               sampling_expf per finite logit; the mask) and a write of
 *               each dropped logit (most of the row at a usual min_p)
 * So about 5 reads and 2 writes of the row, 4.3 MB a row: 272 MB at 64
 * rows, ~70 us at the H200's ~4 TB/s (less where the rereads hit L2); one
 * row runs on one SM, so it is bound by one SM's bandwidth instead.
 * Measured: the "sampler options timing" lines of build/engine_check.
 * Memory: d_counts and d_raw are each as large as the rows' fp32 logits.
 */
#include "kernels/sampling_opts.h"

#include <math.h>

#include "common/check.h"
#include "kernels/common.cuh"
#include "reference/sampling_math.h"

#define OPTS_THREADS 1024
#define OPTS_LIST 4                   // packs each thread keeps for top_logprobs
#define OPTS_LOADS 4                  // loads in flight per thread in a pass over a row
#define PACK_UNKNOWN 0xffffffffffffffffull  // above every pack: "this thread's next pack is not known"

// ---- block reductions: every thread gets the result ---------------------------------------------

static __device__ __forceinline__ unsigned long long opts_warp_max(unsigned long long v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const unsigned long long w = __shfl_xor_sync(0xffffffffu, v, o);
        v = w > v ? w : v;
    }
    return v;
}

// scratch: [32] in shared memory, reused by the next call (the last barrier).
static __device__ unsigned long long opts_block_max(unsigned long long v, unsigned long long *scratch) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    v = opts_warp_max(v);
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < (int)(blockDim.x / 32) ? scratch[lane] : 0ull;
    v = opts_warp_max(v);
    __syncthreads();
    return v;
}

// A double sum, in the tree's order: not the reference's loop, so equal to
// it only to rounding (the logprobs' tolerance in build/engine_check).
static __device__ double opts_block_sum(double v, double *scratch) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < (int)(blockDim.x / 32) ? scratch[lane] : 0.0;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    __syncthreads();
    return v;
}

// f(logit, id) once for every id of the row: thread t reads t, t + 1024,
// ..., OPTS_LOADS loads in flight before the first use. Coalesced whatever
// the row's alignment (a row of a strided batch may start anywhere).
template <typename F>
static __device__ __forceinline__ void for_each_in_row(const float *x, int vocab, F &f) {
    const int nt = (int)blockDim.x;
    int i = threadIdx.x;
    for (; i + (OPTS_LOADS - 1) * nt < vocab; i += OPTS_LOADS * nt) {
        float v[OPTS_LOADS];
#pragma unroll
        for (int u = 0; u < OPTS_LOADS; u++) v[u] = x[i + u * nt];
#pragma unroll
        for (int u = 0; u < OPTS_LOADS; u++) f(v[u], i + u * nt);
    }
    for (; i < vocab; i += nt) f(x[i], i);
}

// The largest non-NaN pack of the row (sampling_pack: the order, ties to
// the lower id), over the block; 0 when every logit is NaN.
static __device__ unsigned long long row_max_pack(const float *x, int vocab, unsigned long long *scratch) {
    unsigned long long best = 0;
    auto f = [&](float l, int i) {
        if (isnan(l)) return;
        const unsigned long long p = sampling_pack(sampling_order_key(l), i);
        best = p > best ? p : best;
    };
    for_each_in_row(x, vocab, f);
    return opts_block_max(best, scratch);
}

// ---- 1. logprobs of the raw row -----------------------------------------------------------------

// A thread's OPTS_LIST largest packs, descending (0 = empty), in registers
// (every index is a constant after unrolling), and whether any pack it saw
// fell off the list: then what follows its last entry is not known.
struct top_list_t {
    unsigned long long a[OPTS_LIST];
    bool dropped;

    __device__ __forceinline__ void clear() {
#pragma unroll
        for (int j = 0; j < OPTS_LIST; j++) a[j] = 0;
        dropped = false;
    }
    __device__ __forceinline__ void insert(unsigned long long p) {
        if (p <= a[OPTS_LIST - 1]) {  // the list is full (a pack is never 0) and p is below it
            dropped = true;
            return;
        }
        dropped = dropped || a[OPTS_LIST - 1] != 0;  // the last entry falls off
        // a[j] becomes max(a[j], min(p, a[j-1])), from the bottom up.
#pragma unroll
        for (int j = OPTS_LIST - 1; j > 0; j--) a[j] = p > a[j - 1] ? a[j - 1] : (p > a[j] ? p : a[j]);
        a[0] = p > a[0] ? p : a[0];
    }
    // The largest pack of this thread not picked yet: 0 when it has none
    // left, PACK_UNKNOWN when the list ran out but the thread saw more.
    __device__ __forceinline__ unsigned long long next() const {
        return a[0] ? a[0] : dropped ? PACK_UNKNOWN : 0ull;
    }
    __device__ __forceinline__ void pop() {
#pragma unroll
        for (int j = 0; j + 1 < OPTS_LIST; j++) a[j] = a[j + 1];
        a[OPTS_LIST - 1] = 0;
    }
};

// Every thread's list rebuilt from the row's packs below `below` (the last
// pick: every pack above it has been picked), so each holds its next largest.
static __device__ void refill(top_list_t &list, const float *x, int vocab, unsigned long long below) {
    list.clear();
    auto f = [&](float l, int i) {
        if (isnan(l)) return;
        const unsigned long long p = sampling_pack(sampling_order_key(l), i);
        if (p < below) list.insert(p);
    };
    for_each_in_row(x, vocab, f);
}

// lse and the top n_top of the raw row x into *lp, the row copied to raw.
// The reference (sampling_logprobs_cpu): top = the largest non-NaN logit
// (not finite: its error, here lse NaN), lse = top + log(sum of
// exp(l - top)) in double, the top ids in the order with the NaN ids left
// out (-1 and -inf past them), log-probabilities (float)(l - lse).
// The top n_top by merging the threads' sorted lists: each round the block
// maximum of the lists' heads is the largest pack not picked yet, as long
// as no thread's head is unknown; when one is, every list is refilled from
// the row below the last pick (one more pass), and the round is taken again.
static __device__ void raw_logprobs(const float *x, int vocab, int n_top, float *raw, sampling_logprobs_t *lp,
                                    unsigned long long *scratch, double *dscratch) {
    top_list_t list;
    list.clear();
    unsigned long long best = 0;
    auto f = [&](float l, int i) {
        raw[i] = l;
        if (isnan(l)) return;
        const unsigned long long p = sampling_pack(sampling_order_key(l), i);
        best = p > best ? p : best;
        if (n_top > 0) list.insert(p);
    };
    for_each_in_row(x, vocab, f);
    best = opts_block_max(best, scratch);
    const float top = best ? x[sampling_unpack_id(best)] : NAN;
    if (!isfinite(top)) {  // every logit NaN, the largest -inf, or a +inf
        if (threadIdx.x == 0) {
            lp->lse = NAN, lp->token_logprob = NAN, lp->num_top = 0;
            for (int k = 0; k < SAMPLING_OPTS_MAX_TOP; k++) lp->top_ids[k] = -1, lp->top_logprobs[k] = -INFINITY;
        }
        return;
    }
    double acc = 0;
    auto g = [&](float l, int) {
        if (!isnan(l)) acc += exp((double)l - (double)top);
    };
    for_each_in_row(x, vocab, g);
    const double lse = (double)top + log(opts_block_sum(acc, dscratch));

    unsigned long long last = PACK_UNKNOWN;
    int r = 0;
    while (r < n_top) {  // the same path in every thread: b is the block's
        const unsigned long long b = opts_block_max(list.next(), scratch);
        if (b == PACK_UNKNOWN) {
            refill(list, x, vocab, last);
            continue;
        }
        if (b == 0) break;  // fewer non-NaN logits than n_top
        if (list.a[0] == b) list.pop();  // packs are distinct: one thread holds b
        if (threadIdx.x == 0) {
            const int32_t id = sampling_unpack_id(b);
            lp->top_ids[r] = id;
            lp->top_logprobs[r] = (float)((double)x[id] - lse);
        }
        last = b;
        r++;
    }
    if (threadIdx.x == 0) {
        for (int k = r; k < SAMPLING_OPTS_MAX_TOP; k++) lp->top_ids[k] = -1, lp->top_logprobs[k] = -INFINITY;
        lp->lse = lse, lp->token_logprob = NAN, lp->num_top = n_top;  // finish writes the token's
    }
}

// ---- 2. min_tokens, 3. penalties ----------------------------------------------------------------

static __device__ void mask_stop_ids(float *x, int vocab, const int32_t *stop, int n) {
    for (int k = threadIdx.x; k < n; k += blockDim.x) {
        const int32_t id = stop[k];
        if (id >= 0 && id < vocab) x[id] = -INFINITY;
    }
}

// The reference's penalties (sampling_apply_penalties_cpu), each distinct
// id once. It sorts the ids to count them; here count[id] (this row's
// [vocab] of zeroed scratch) gathers 1 if the id is in the prompt plus 2
// per time it was generated (atomicOr and atomicAdd commute), and the
// second walk's atomicExch hands the total to exactly one thread per id and
// leaves the scratch zero. One IEEE rounding per operation, never fused
// (sampling_math.h's smath_*): the bits of the reference's x / rep, x * rep,
// x - frequency * count and x - presence.
static __device__ void apply_penalties(float *x, int vocab, const int32_t *ids, int num_prompt, int num_output,
                                       uint32_t *count, float presence, float frequency, float repetition) {
    const int n = num_prompt + num_output;
    for (int k = threadIdx.x; k < n; k += blockDim.x) {
        const int32_t id = ids[k];
        if (id < 0 || id >= vocab) continue;
        if (k < num_prompt) atomicOr(&count[id], 1u);
        else atomicAdd(&count[id], 2u);
    }
    __syncthreads();
    for (int k = threadIdx.x; k < n; k += blockDim.x) {
        const int32_t id = ids[k];
        if (id < 0 || id >= vocab) continue;
        const uint32_t v = atomicExch(&count[id], 0u);
        if (v == 0) continue;  // another entry of the same id took it
        const int times = (int)(v >> 1);
        float l = x[id];
        if (repetition != 1.0f) l = l > 0 ? smath_div(l, repetition) : smath_mul(l, repetition);
        l = smath_sub(l, smath_mul(frequency, (float)times));
        if (times > 0) l = smath_sub(l, presence);
        x[id] = l;
    }
}

// ---- 4. min_p as a mask ---------------------------------------------------------------------------

// sampling_min_p_mask_cpu on the block: top after the penalties, p_fail =
// the largest pack of a finite logit whose mass is below ceil(min_p 2^32)
// (a block maximum: the reference's loop stops at that token), then every
// finite logit with a pack <= p_fail becomes -inf. The masses are
// sampling_math.h's, the same bits as the reference's.
static __device__ void mask_min_p(float *x, int vocab, float temperature, float min_p, unsigned long long *scratch) {
    const unsigned long long best = row_max_pack(x, vocab, scratch);
    const float top = best ? x[sampling_unpack_id(best)] : NAN;
    if (!isfinite(top)) return;  // no answer: the sampler gives -1
    const float inv_t = sampling_inv_temperature(temperature);
    const uint64_t floor_mass = (uint64_t)ceil(smath_dmul((double)min_p, 4294967296.0));  // exact: times 2^32
    unsigned long long fail = 0;
    auto f = [&](float l, int i) {
        if (!isfinite(l)) return;
        const unsigned long long p = sampling_pack(sampling_order_key(l), i);
        if (p > fail && sampling_mass(sampling_log_weight(l, top, inv_t)) < floor_mass) fail = p;
    };
    for_each_in_row(x, vocab, f);
    fail = opts_block_max(fail, scratch);
    if (fail == 0) return;
    auto g = [&](float l, int i) {  // each thread rewrites only ids it read itself
        if (isfinite(l) && sampling_pack(sampling_order_key(l), i) <= fail) x[i] = -INFINITY;
    };
    for_each_in_row(x, vocab, g);
}

// ---- the kernels --------------------------------------------------------------------------------

__global__ void __launch_bounds__(OPTS_THREADS)
sampling_prepare_kernel(float *logits, const __nv_bfloat16 *src, long long stride, int vocab,
                        const sampling_opts_row_t *opts, const int32_t *ids, uint32_t *counts, float *raw,
                        sampling_logprobs_t *lp) {
    pdl_launch_dependents();
    pdl_wait();  // every read below is of the step's data (kernels/common.cuh: PDL)
    __shared__ unsigned long long scratch[32];
    __shared__ double dscratch[32];
    const int row = blockIdx.x;
    const sampling_opts_row_t o = opts[row];
    if (!sampling_opts_row_on(&o)) return;  // the whole block: one row per block
    const bool want_lp = o.top_logprobs >= 0, stop = o.num_stop > 0;
    const bool penalties = o.presence != 0.0f || o.frequency != 0.0f || o.repetition != 1.0f;
    const bool min_p = o.temperature > 0.0f && o.min_p > 0.0f;
    float *x = logits + (long long)row * stride;
    if (src) {  // the LM head's bf16 row widened into x first: the options below change fp32 values
        const __nv_bfloat16 *y = src + (long long)row * stride;
        for (int i = threadIdx.x; i < vocab; i += blockDim.x) x[i] = __bfloat162float(y[i]);
        __syncthreads();
    }
    if (want_lp) {
        const int n_top = o.top_logprobs < SAMPLING_OPTS_MAX_TOP ? o.top_logprobs : SAMPLING_OPTS_MAX_TOP;
        raw_logprobs(x, vocab, n_top, raw + (long long)row * stride, lp + row, scratch, dscratch);
        __syncthreads();  // every read of the raw row is done before it changes
    }
    if (stop) {
        mask_stop_ids(x, vocab, ids + o.stop_start, o.num_stop);
        __syncthreads();
    }
    if (penalties) {
        apply_penalties(x, vocab, ids + o.ids_start, o.num_prompt, o.num_output, counts + (size_t)row * (size_t)vocab,
                        o.presence, o.frequency, o.repetition);
        __syncthreads();
    }
    if (min_p) mask_min_p(x, vocab, o.temperature, o.min_p, scratch);
}

// One thread per row: the sampled token's raw logit minus lse.
__global__ void sampling_finish_kernel(const int32_t *sampled, const float *raw, long long stride, int num_rows,
                                       const sampling_opts_row_t *opts, sampling_logprobs_t *lp) {
    pdl_launch_dependents();
    pdl_wait();
    const int row = blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= num_rows || opts[row].top_logprobs < 0) return;
    const int32_t id = sampled[row];
    const float l = id >= 0 && id < stride ? raw[(long long)row * stride + id] : NAN;
    lp[row].token_logprob = isnan(l) ? -INFINITY : (float)((double)l - lp[row].lse);
}

// ---- launchers ------------------------------------------------------------------------------------

static int prepare_launch(const char *fn, float *d_logits, const bf16_t *d_src, long long logits_stride,
                          int num_rows, int vocab, const sampling_opts_row_t *d_opts, const int32_t *d_ids,
                          uint32_t *d_counts, float *d_raw, sampling_logprobs_t *d_lp, cudaStream_t stream) {
    if (num_rows < 0 || vocab < 1 || logits_stride < vocab)
        return mv_error("%s: bad shape rows=%d vocab=%d stride=%lld", fn, num_rows, vocab, logits_stride);
    if (num_rows == 0) return 0;
    if (!d_logits || !d_opts || !d_ids || !d_counts || !d_raw || !d_lp) return mv_error("%s: null pointer", fn);
    mv_launch(sampling_prepare_kernel, dim3((unsigned)num_rows), dim3(OPTS_THREADS), 0, stream, d_logits,
              (const __nv_bfloat16 *)d_src, logits_stride, vocab, d_opts, d_ids, d_counts, d_raw, d_lp);
    return CUDA_TRY(cudaGetLastError());
}

extern "C" int sampling_prepare_cuda(float *d_logits, long long logits_stride, int num_rows, int vocab,
                                     const sampling_opts_row_t *d_opts, const int32_t *d_ids, uint32_t *d_counts,
                                     float *d_raw, sampling_logprobs_t *d_lp, cudaStream_t stream) {
    return prepare_launch("sampling_prepare_cuda", d_logits, NULL, logits_stride, num_rows, vocab, d_opts, d_ids,
                          d_counts, d_raw, d_lp, stream);
}

extern "C" int sampling_prepare_bf16_cuda(float *d_logits, const bf16_t *d_src, long long logits_stride,
                                          int num_rows, int vocab, const sampling_opts_row_t *d_opts,
                                          const int32_t *d_ids, uint32_t *d_counts, float *d_raw,
                                          sampling_logprobs_t *d_lp, cudaStream_t stream) {
    if (!d_src && num_rows > 0) return mv_error("sampling_prepare_bf16_cuda: null pointer (the bf16 logits)");
    return prepare_launch("sampling_prepare_bf16_cuda", d_logits, d_src, logits_stride, num_rows, vocab, d_opts,
                          d_ids, d_counts, d_raw, d_lp, stream);
}

extern "C" int sampling_logprobs_finish_cuda(const int32_t *d_sampled, const float *d_raw, long long logits_stride,
                                             int num_rows, const sampling_opts_row_t *d_opts,
                                             sampling_logprobs_t *d_lp, cudaStream_t stream) {
    if (num_rows < 0 || logits_stride < 1)
        return mv_error("sampling_logprobs_finish_cuda: bad shape rows=%d stride=%lld", num_rows, logits_stride);
    if (num_rows == 0) return 0;
    if (!d_sampled || !d_raw || !d_opts || !d_lp) return mv_error("sampling_logprobs_finish_cuda: null pointer");
    const int threads = 128;
    mv_launch(sampling_finish_kernel, dim3((unsigned)((num_rows + threads - 1) / threads)), dim3(threads), 0, stream,
              d_sampled, d_raw, logits_stride, num_rows, d_opts, d_lp);
    return CUDA_TRY(cudaGetLastError());
}

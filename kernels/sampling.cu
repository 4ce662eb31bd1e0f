/*
 * kernels/sampling.cu - greedy, temperature, top-k and top-p sampling on the
 * GPU (see kernels/sampling.h for the rules and the method). The CPU
 * reference is chapters/09-engine/sampler.c; build/engine_check compares
 * the two on the same logits.
 */
#include "kernels/sampling.h"

#include <math.h>

#include "common/check.h"
#include "kernels/common.cuh"

#define SAMPLING_THREADS 1024

// ---- Philox4x32-10 ------------------------------------------------------------------------
// Ten rounds of: two 32x32 -> 64-bit multiplies, their halves xor-ed with the
// other counter words and the key, the key bumped by the golden-ratio
// constants. Counter-based: the output is a pure function of (counter, key).
__host__ __device__ static inline uint32_t philox4x32_10_first(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3,
                                                               uint32_t k0, uint32_t k1) {
    const uint32_t M0 = 0xD2511F53u, M1 = 0xCD9E8D57u, W0 = 0x9E3779B9u, W1 = 0xBB67AE85u;
    for (int round = 0; round < 10; round++) {
        const uint64_t p0 = (uint64_t)M0 * c0, p1 = (uint64_t)M1 * c2;
        const uint32_t hi0 = (uint32_t)(p0 >> 32), lo0 = (uint32_t)p0;
        const uint32_t hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
        c0 = hi1 ^ c1 ^ k0;
        c1 = lo1;
        c2 = hi0 ^ c3 ^ k1;
        c3 = lo0;
        k0 += W0;
        k1 += W1;
    }
    return c0;
}

// u in (0, 1), never 0 or 1 (log(-log(u)) stays finite): the top 24 bits and a half.
__host__ __device__ static inline float uniform_of(uint64_t seed, int64_t gen_index, int32_t id) {
    const uint32_t x = philox4x32_10_first((uint32_t)id, (uint32_t)(uint64_t)gen_index,
                                           (uint32_t)((uint64_t)gen_index >> 32), 0u, (uint32_t)seed,
                                           (uint32_t)(seed >> 32));
    return ((float)(x >> 8) + 0.5f) * (1.0f / 16777216.0f);
}

extern "C" float sampling_uniform(uint64_t seed, int64_t gen_index, int32_t id) {
    return uniform_of(seed, gen_index, id);
}

// ---- block reductions -----------------------------------------------------------------------

// A float's bits mapped to an unsigned key with the same order (-inf < ... <
// -0 < +0 < ... < +inf); NaN never reaches it.
__device__ __forceinline__ uint32_t ordered_bits(float x) {
    const uint32_t b = __float_as_uint(x);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

template <typename T>
__device__ __forceinline__ T warp_reduce_sum(T v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ unsigned long long warp_reduce_max(unsigned long long v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const unsigned long long w = __shfl_xor_sync(0xffffffffu, v, o);
        v = w > v ? w : v;
    }
    return v;
}

// Sum over the block; every thread gets it. scratch: [32] in shared memory.
template <typename T>
__device__ T block_reduce_sum(T v, T *scratch) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    v = warp_reduce_sum(v);
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < (int)(blockDim.x / 32) ? scratch[lane] : (T)0;
    v = warp_reduce_sum(v);
    __syncthreads();  // scratch is reused by the next reduction
    return v;
}

__device__ unsigned long long block_reduce_max(unsigned long long v, unsigned long long *scratch) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    v = warp_reduce_max(v);
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < (int)(blockDim.x / 32) ? scratch[lane] : 0ull;
    v = warp_reduce_max(v);
    __syncthreads();
    return v;
}

// (value key, id) packed so that the larger pack is the larger value, then
// the lower id: the host's tie rule in one integer max.
__device__ __forceinline__ unsigned long long pack_arg(uint32_t key, int32_t id) {
    return ((unsigned long long)key << 32) | (unsigned long long)(0xffffffffu - (uint32_t)id);
}
__device__ __forceinline__ int32_t unpack_id(unsigned long long p) { return (int32_t)(0xffffffffu - (uint32_t)p); }

// A prefix of the order (logit descending, id ascending): the tokens whose
// key is above `key`, and those equal to it with an id <= `max_id`.
struct prefix_t {
    uint32_t key;
    int32_t max_id;
};

__device__ __forceinline__ bool in_prefix(const prefix_t &p, uint32_t key, int32_t id) {
    return key > p.key || (key == p.key && id <= p.max_id);
}

// What one pass sums over a row: a count of tokens, or their probability mass.
struct row_t {
    const float *logits;
    int vocab;
    float top, inv_t;  // the largest logit, 1 / temperature
    prefix_t keep;     // the candidates so far (top-k)
};

// Sum over the finite tokens of the row inside r.keep and inside `cut`,
// of 1 (count) or exp((l - top) / T) (mass).
template <bool MASS>
__device__ double pass_sum(const row_t &r, const prefix_t &cut, double *scratch) {
    double acc = 0;
    for (int i = threadIdx.x; i < r.vocab; i += blockDim.x) {
        const float l = r.logits[i];
        if (!isfinite(l)) continue;
        const uint32_t k = ordered_bits(l);
        if (!in_prefix(r.keep, k, i) || !in_prefix(cut, k, i)) continue;
        acc += MASS ? (double)__expf((l - r.top) * r.inv_t) : 1.0;
    }
    return block_reduce_sum(acc, scratch);
}

// The shortest prefix of the order (inside r.keep) whose count or mass is at
// least `target`: bisection on the value key's 32 bits (the largest key whose
// tokens at or above it reach the target), then on the id among the tokens
// that share that key (the smallest id cut that reaches it).
template <bool MASS>
__device__ prefix_t shortest_prefix(const row_t &r, double target, double *scratch) {
    prefix_t p = {0u, r.vocab - 1};
    for (int bit = 31; bit >= 0; bit--) {
        const prefix_t cand = {p.key | (1u << bit), r.vocab - 1};
        if (pass_sum<MASS>(r, cand, scratch) >= target) p.key = cand.key;
    }
    int lo = 0, hi = r.vocab - 1;
    while (lo < hi) {
        const int mid = lo + (hi - lo) / 2;
        const prefix_t cand = {p.key, mid};
        if (pass_sum<MASS>(r, cand, scratch) >= target) hi = mid;
        else lo = mid + 1;
    }
    p.max_id = lo;
    return p;
}

// ---- version 1: one block per row ---------------------------------------------------------------
__global__ void __launch_bounds__(SAMPLING_THREADS)
sample_kernel_v1(int32_t *out, const float *logits, long long stride, int vocab, const float *temperature,
                 const int32_t *top_k, const float *top_p, const uint64_t *seed, const int64_t *gen_index) {
    __shared__ double dscratch[32];
    __shared__ unsigned long long uscratch[32];
    const int row = blockIdx.x;
    const float *x = logits + (long long)row * stride;

    // 1. The argmax over the non-NaN logits, lowest id on ties.
    unsigned long long best = 0;
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
        const float l = x[i];
        if (isnan(l)) continue;
        const unsigned long long p = pack_arg(ordered_bits(l), i);
        best = p > best ? p : best;
    }
    best = block_reduce_max(best, uscratch);
    if (best == 0 || !isfinite(x[unpack_id(best)])) {  // nothing but NaN, or the largest is +-inf
        if (threadIdx.x == 0) out[row] = -1;
        return;
    }
    const int32_t argmax = unpack_id(best);
    const float T = temperature[row];
    if (T == 0.0f) {
        if (threadIdx.x == 0) out[row] = argmax;
        return;
    }

    // 2. top-k, then top-p, as prefixes of the order.
    row_t r = {x, vocab, x[argmax], 1.0f / T, {0u, vocab - 1}};  // key 0 is below every finite value
    const prefix_t all = {0u, vocab - 1};
    const double n_finite = pass_sum<false>(r, all, dscratch);
    const int k = top_k[row];
    if (k > 0 && (double)k < n_finite) r.keep = shortest_prefix<false>(r, (double)k, dscratch);
    const float p = top_p[row];
    if (p < 1.0f) {
        const double mass = pass_sum<true>(r, all, dscratch);
        r.keep = shortest_prefix<true>(r, (double)p * mass, dscratch);
    }

    // 3. The Gumbel-max draw over the kept tokens.
    const uint64_t s = seed[row];
    const int64_t g = gen_index[row];
    unsigned long long pick = 0;
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
        const float l = x[i];
        if (!isfinite(l) || !in_prefix(r.keep, ordered_bits(l), i)) continue;
        const float score = (l - r.top) * r.inv_t - logf(-logf(uniform_of(s, g, i)));
        const unsigned long long q = pack_arg(ordered_bits(score), i);
        pick = q > pick ? q : pick;
    }
    pick = block_reduce_max(pick, uscratch);
    if (threadIdx.x == 0) out[row] = pick ? unpack_id(pick) : argmax;  // argmax is always kept: pick is set
}

__global__ void bf16_to_f32_kernel(float *out, const __nv_bfloat16 *in, long long n) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        out[i] = __bfloat162float(in[i]);
}

// ---- launchers ------------------------------------------------------------------------------------

extern "C" const char *sampling_version_name(int version) { return version == 1 ? "v1-bisect" : NULL; }

extern "C" int sample_tokens_cuda(int version, int32_t *d_out, const float *d_logits, long long logits_stride,
                                  int num_rows, int vocab, const float *d_temperature, const int32_t *d_top_k,
                                  const float *d_top_p, const uint64_t *d_seed, const int64_t *d_gen_index,
                                  cudaStream_t stream) {
    if (version != 1) return mv_error("sample_tokens_cuda: unknown version %d (1..%d)", version, SAMPLING_NUM_VERSIONS);
    if (num_rows < 0 || vocab < 1 || logits_stride < vocab)
        return mv_error("sample_tokens_cuda: bad shape rows=%d vocab=%d stride=%lld", num_rows, vocab, logits_stride);
    if (num_rows == 0) return 0;
    if (!d_out || !d_logits || !d_temperature || !d_top_k || !d_top_p || !d_seed || !d_gen_index)
        return mv_error("sample_tokens_cuda: null pointer");
    sample_kernel_v1<<<num_rows, SAMPLING_THREADS, 0, stream>>>(d_out, d_logits, logits_stride, vocab, d_temperature,
                                                                d_top_k, d_top_p, d_seed, d_gen_index);
    return CUDA_TRY(cudaGetLastError());
}

extern "C" int bf16_to_f32_cuda(float *d_out, const bf16_t *d_in, long long n, cudaStream_t stream) {
    if (n < 0) return mv_error("bf16_to_f32_cuda: n = %lld < 0", n);
    if (n == 0) return 0;
    if (!d_out || !d_in) return mv_error("bf16_to_f32_cuda: null pointer");
    long long blocks = (n + 255) / 256;
    const long long cap = 8LL * mv_num_sms();
    if (blocks > cap) blocks = cap;
    bf16_to_f32_kernel<<<(unsigned)blocks, 256, 0, stream>>>(d_out, (const __nv_bfloat16 *)d_in, n);
    return CUDA_TRY(cudaGetLastError());
}

/*
 * kernels/sampling.cu - greedy, temperature, top-k and top-p sampling on the
 * GPU (see kernels/sampling.h for the rule and the method). The CPU
 * reference is reference/sampling.c; both take every number from
 * reference/sampling_math.h, and build/engine_check (tests/gpu/
 * engine_check.c) requires the same id from both on the same logits.
 */
#include "kernels/sampling.h"

#include <math.h>

#include "common/check.h"
#include "kernels/common.cuh"
#include "kernels/sampling_opts.h"
#include "reference/sampling_math.h"

#define SAMPLING_THREADS 1024

// A logit as the sampler reads it: a row of fp32 (versions 1 to 3, and the
// rows sampling_prepare_cuda changed) or of the LM head's bf16 (version 4).
// Widening a bf16 is exact, so both give the fp32 value the reference reads.
__device__ __forceinline__ float logit_f(float v) { return v; }
__device__ __forceinline__ float logit_f(__nv_bfloat16 v) { return __bfloat162float(v); }

// ---- block reductions (integers: exact in any order) --------------------------------------------

__device__ __forceinline__ unsigned long long warp_reduce_sum(unsigned long long v) {
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
// The sums are of integers (counts, masses), so the order of the tree does
// not change a bit of the result: the serial loop of the reference agrees.
__device__ unsigned long long block_reduce_sum(unsigned long long v, unsigned long long *scratch) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    v = warp_reduce_sum(v);
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < (int)(blockDim.x / 32) ? scratch[lane] : 0ull;
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

// ---- the kept set as a prefix of the order ---------------------------------------------------------

// A prefix of the order (logit descending, id ascending): the tokens whose
// key is above `key`, and those equal to it with an id <= `max_id`. In
// terms of sampling_pack: the tokens whose pack is >= pack(key, max_id),
// i.e. the first tokens of the reference's sorted array.
struct prefix_t {
    uint32_t key;
    int32_t max_id;
};

__device__ __forceinline__ bool in_prefix(const prefix_t &p, uint32_t key, int32_t id) {
    return key > p.key || (key == p.key && id <= p.max_id);
}

// What one pass sums over a row: a count of tokens, or their integer mass.
template <typename E>
struct row_t {
    const E *logits;
    int vocab;
    float top, inv_t;  // the largest logit, sampling_inv_temperature(T)
    prefix_t keep;     // the candidates so far (top-k)
};

// Sum over the finite tokens of the row inside r.keep and inside `cut`,
// of 1 (count) or sampling_mass (mass): the reference's numbers, exactly.
template <bool MASS, typename E>
__device__ unsigned long long pass_sum(const row_t<E> &r, const prefix_t &cut, unsigned long long *scratch) {
    unsigned long long acc = 0;
    for (int i = threadIdx.x; i < r.vocab; i += blockDim.x) {
        const float l = logit_f(r.logits[i]);
        if (!isfinite(l)) continue;
        const uint32_t k = sampling_order_key(l);
        if (!in_prefix(r.keep, k, i) || !in_prefix(cut, k, i)) continue;
        acc += MASS ? sampling_mass(sampling_log_weight(l, r.top, r.inv_t)) : 1ull;
    }
    return block_reduce_sum(acc, scratch);
}

// The shortest prefix of the order (inside r.keep) whose count or mass is at
// least `target` (> 0, and reached by r.keep): bisection on the key's 32
// bits (the largest key whose tokens at or above it reach the target: the
// key of the prefix's last token), then on the id among the tokens that
// share that key (the smallest id cut that reaches it).
template <bool MASS, typename E>
__device__ prefix_t shortest_prefix(const row_t<E> &r, unsigned long long target, unsigned long long *scratch) {
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
    __shared__ unsigned long long scratch[32];
    const int row = blockIdx.x;
    const float *x = logits + (long long)row * stride;

    // 1. The argmax over the non-NaN logits in the order (lowest id on ties).
    unsigned long long best = 0;
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
        const float l = x[i];
        if (isnan(l)) continue;
        const unsigned long long p = sampling_pack(sampling_order_key(l), i);
        best = p > best ? p : best;
    }
    best = block_reduce_max(best, scratch);
    if (best == 0 || !isfinite(x[sampling_unpack_id(best)])) {  // nothing but NaN, or the largest is +-inf
        if (threadIdx.x == 0) out[row] = -1;
        return;
    }
    const int32_t argmax = sampling_unpack_id(best);
    const float T = temperature[row];
    if (T == 0.0f) {
        if (threadIdx.x == 0) out[row] = argmax;
        return;
    }

    // 2. top-k, then top-p on integer masses, as prefixes of the order.
    row_t<float> r = {x, vocab, x[argmax], sampling_inv_temperature(T), {0u, vocab - 1}};  // key 0: below every value
    const prefix_t all = {0u, vocab - 1};
    const int k = top_k[row];
    if (k > 0 && (unsigned long long)k < pass_sum<false>(r, all, scratch))
        r.keep = shortest_prefix<false>(r, (unsigned long long)k, scratch);
    const float p = top_p[row];
    if (p < 1.0f) {
        const unsigned long long mass = pass_sum<true>(r, all, scratch);
        r.keep = shortest_prefix<true>(r, sampling_top_p_target(p, mass), scratch);
    }

    // 3. The Gumbel-max draw over the kept tokens (those below
    // SAMPLING_NEVER_WINS cannot beat the top token: skipped, as the reference does).
    const uint64_t s = seed[row];
    const int64_t g = gen_index[row];
    unsigned long long pick = 0;
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
        const float l = x[i];
        if (!isfinite(l) || !in_prefix(r.keep, sampling_order_key(l), i)) continue;
        const float lw = sampling_log_weight(l, r.top, r.inv_t);
        if (lw < SAMPLING_NEVER_WINS) continue;
        const float score = sampling_gumbel_score(lw, s, g, i);
        const unsigned long long q = sampling_pack(sampling_order_key(score), i);
        pick = q > pick ? q : pick;
    }
    pick = block_reduce_max(pick, scratch);
    if (threadIdx.x == 0) out[row] = pick ? sampling_unpack_id(pick) : argmax;  // the argmax is always kept
}
// ---- version 2: a shortlist per thread, the candidates in shared memory ---------------------------
//
// Why version 1 is slow: each bisection step is a pass over the whole row,
// 607,744 bytes (151936 fp32), and top-k + top-p take about 100 of them:
// at 256 rows that is 100 x 155.6 MB = 15.6 GB, about 4 ms at the H200's
// ~4 TB/s, for a step whose model takes ~10 ms.
//
// Version 2 reads the row once for top-k (and for Qwen3's default, top-k
// then top-p), and finds the cut among at most 2048 candidates in shared
// memory:
//   1. One pass: each thread keeps, in registers, the V2_LIST = 4 largest
//      packs (sampling_pack: order key and id, so no two are equal) of the
//      finite logits it reads, counts them, and notes a +inf.
//   2. The union U of the 512 lists (2048 packs) is sorted in shared memory
//      (bitonic, descending). tau = U[k-1]: U[0, k) are k packs >= tau, so
//      the first k of the order are all >= tau. A thread drops only packs
//      below its 4th entry; so when every thread's 4th entry is <= tau (or
//      it kept fewer than 4), every pack >= tau is in U, and U[0, k) is the
//      top-k set, in the order. Otherwise (a thread's 4th entry is above
//      tau: it may have dropped some) one more pass gathers every pack
//      >= tau (at least k, usually a few more) into shared memory, and they
//      are sorted.
//   3. top-p on those k, in the order: their integer masses, a block scan
//      (integers: the reference's loop gives the same sums), the first
//      prefix that reaches the target. Then the Gumbel-max draw over the
//      kept prefix: one score per kept token, not per token of the row.
// top-p alone: the row's total mass needs the top logit, so a second pass;
// then tau is the first entry of U whose prefix mass in U reaches the
// target (the true prefix up to tau holds U's and more, so the cut is at or
// before tau), with the same completeness test. Every cut is the
// reference's to the bit: the same packs, the same integer masses, the same
// target, the same scores; only which tokens are looked at changes.
//
// Where it falls back to version 1's bisection (correct, ~50-100 passes):
// top_k > 2048; more than 2048 packs >= tau (the lists missed too much:
// finite logits crowded into a few threads' ids, or a large k); top-p alone
// when U's 2048 tokens do not hold top_p of the mass (flat rows).
//
// Passes over the row (607,744 bytes each for Qwen3):
//   greedy                      1
//   temperature only            2 (argmax, then the draw; the draw is
//                               Philox and two logs for every token within
//                               20 T of the top: compute, ~150 instructions a
//                               token, as in version 1)
//   top-k <= 2048 (+ top-p)     1, or 2 when a thread's 4th entry is above tau
//   top-p alone                 2, or 3
// Predicted at 256 rows of 151936 (155.6 MB a pass, ~39 us at ~4 TB/s):
// greedy ~40 us; Qwen3's default (T 0.6, top_k 20, top_p 0.95) ~40 us of
// reading plus ~5 us a row of sorting (66 barrier steps over 2048 packs,
// overlapped by the SM's other block): ~50 us, against version 1's ~6 ms.
// Measured: the "sampler timing" lines of build/engine_check.
//
// Launch shape: 512 threads (4 packs a thread fill the 2048-entry array),
// 2 blocks an SM (registers <= 64: 63 used, no spills, 16.6 KB of static
// shared memory), so 256 rows are one wave on 132 SMs.

#define V2_THREADS 512
#define V2_LIST 4                          // packs each thread keeps: the shortlist
#define V2_CAP (V2_THREADS * V2_LIST)      // 2048 candidates in shared memory (16 KB)
#define V2_PER_THREAD (V2_CAP / V2_THREADS)  // candidates a thread scans in mass_cut
#define V2_LOADS 3                         // 16-byte loads in flight per thread in a pass (4 spill)

// f(logit, id) once for every id of the row, by the threads of the block:
// 16-byte loads (4 fp32 logits or 8 bf16), V2_LOADS in flight per thread
// (48 KB an SM at 2 blocks of 512), where the row is 16-byte aligned (a row
// of a strided batch may start anywhere: scalars up to the first 16-byte
// boundary, and after the last full vector). With an fp32 row aligned,
// thread t reads ids 4t..4t+3, then 4t + 2048.., and so on (a bf16 row:
// 8t..8t+7, then 8t + 4096..).
template <typename E, typename F>
__device__ __forceinline__ void for_each_logit(const E *x, int vocab, F &f) {
    constexpr int W = 16 / (int)sizeof(E);  // logits a vector
    int head = (int)(((16u - (unsigned)((uintptr_t)x & 15u)) & 15u) / sizeof(E));  // 0..W-1
    head = head < vocab ? head : vocab;
    for (int i = threadIdx.x; i < head; i += blockDim.x) f(logit_f(x[i]), i);
    const uint4 *v = reinterpret_cast<const uint4 *>(x + head);
    const int nvec = (vocab - head) / W, nt = (int)blockDim.x;
    // The W logits of one vector, in id order.
    auto each = [&](const uint4 &a, int i) {
        const uint32_t w[4] = {a.x, a.y, a.z, a.w};
#pragma unroll
        for (int k = 0; k < 4; k++) {
            if (W == 4) {
                f(__uint_as_float(w[k]), i + k);
            } else {  // a bf16 is the high half of a float
                f(__uint_as_float(w[k] << 16), i + 2 * k);
                f(__uint_as_float(w[k] & 0xffff0000u), i + 2 * k + 1);
            }
        }
    };
    int j = threadIdx.x;
    for (; j + (V2_LOADS - 1) * nt < nvec; j += V2_LOADS * nt) {
        uint4 q[V2_LOADS];
#pragma unroll
        for (int u = 0; u < V2_LOADS; u++) q[u] = v[j + u * nt];  // all in flight before the first use
#pragma unroll
        for (int u = 0; u < V2_LOADS; u++) each(q[u], head + W * (j + u * nt));
    }
    for (; j < nvec; j += nt) each(v[j], head + W * j);
    for (int i = head + W * nvec + threadIdx.x; i < vocab; i += blockDim.x) f(logit_f(x[i]), i);
}

// The L largest packs a thread has seen, descending; 0 = empty (below every pack).
template <int L>
struct shortlist_t {
    unsigned long long a[L];

    __device__ __forceinline__ void insert(unsigned long long p) {
        if (p <= a[L - 1]) return;  // the usual case once the list has filled
        // a[j] becomes max(a[j], min(p, a[j-1])): from the bottom up, so
        // a[j-1] is still the old value when a[j] reads it.
#pragma unroll
        for (int j = L - 1; j > 0; j--) a[j] = p > a[j - 1] ? a[j - 1] : (p > a[j] ? p : a[j]);
        a[0] = p > a[0] ? p : a[0];
    }
    // Every pack of this thread that is >= tau is in the list: what it
    // dropped is below its last entry, and that is <= tau (0 when the list
    // is not full: it dropped nothing).
    __device__ __forceinline__ bool holds_all_from(unsigned long long tau) const { return a[L - 1] <= tau; }
};

// What the first pass learns about a row (the same in every thread).
struct row_stats_t {
    unsigned long long best;  // the largest finite pack: the argmax, when valid
    unsigned long long n_finite;
    bool valid;               // a finite logit and no +inf: the row has an answer
};

// Pass 1: each thread's shortlist of the finite logits, and the row's stats.
// A row has an answer when its largest non-NaN logit is finite, i.e. it has
// a finite logit and no +inf; the argmax is then the largest finite pack.
template <int L, typename E>
__device__ row_stats_t first_pass(const E *x, int vocab, shortlist_t<L> &list, unsigned long long *scratch) {
#pragma unroll
    for (int j = 0; j < L; j++) list.a[j] = 0;
    unsigned long long finite = 0;
    int pos_inf = 0;
    auto f = [&](float l, int i) {
        if (isfinite(l)) {
            finite++;
            list.insert(sampling_pack(sampling_order_key(l), i));
        } else if (l > 0.0f) {
            pos_inf = 1;  // +inf (NaN compares false)
        }
    };
    for_each_logit(x, vocab, f);
    row_stats_t s;
    s.n_finite = block_reduce_sum(finite, scratch);
    s.best = block_reduce_max(list.a[0], scratch);
    s.valid = !__syncthreads_or(pos_inf) && s.n_finite > 0;
    return s;
}

// Sort a[0, n) descending, n a power of two <= V2_CAP, in shared memory;
// all threads call it, after a barrier that made a[] visible.
__device__ void bitonic_sort_desc(unsigned long long *a, int n) {
    for (int size = 2; size <= n; size <<= 1) {
        for (int stride = size >> 1; stride > 0; stride >>= 1) {
            for (int t = threadIdx.x; t < n / 2; t += blockDim.x) {
                const int i = 2 * stride * (t / stride) + t % stride, j = i + stride;  // bit `stride` of i is 0
                const bool desc = (i & size) == 0;  // the merges' directions; the last (size = n) is descending
                const unsigned long long ai = a[i], aj = a[j];
                if ((ai < aj) == desc) a[i] = aj, a[j] = ai;
            }
            __syncthreads();
        }
    }
}

// a[0, m) (m <= V2_CAP, visible after a barrier) sorted descending: padded
// with 0 to a power of two, which sorts last.
__device__ void sort_candidates(unsigned long long *a, int m) {
    int n = 1;
    while (n < m) n <<= 1;
    for (int i = m + threadIdx.x; i < n; i += blockDim.x) a[i] = 0;
    __syncthreads();
    bitonic_sort_desc(a, n);
}

// Each thread's shortlist into cand[V2_CAP], sorted: the union U, descending.
template <int L>
__device__ void sort_shortlists(const shortlist_t<L> &list, unsigned long long *cand) {
#pragma unroll
    for (int j = 0; j < L; j++) cand[threadIdx.x * L + j] = list.a[j];
    __syncthreads();
    bitonic_sort_desc(cand, V2_CAP);
}

// One more pass: every finite pack >= tau into cand[], in no order; their
// number (more than V2_CAP: only the first V2_CAP were stored; the caller
// falls back). count: a shared int.
template <typename E>
__device__ int gather_from(const E *x, int vocab, unsigned long long tau, unsigned long long *cand, int *count) {
    if (threadIdx.x == 0) *count = 0;
    __syncthreads();
    bool full = false;  // this thread saw the array full: it stops adding (the count is past V2_CAP already)
    auto f = [&](float l, int i) {
        if (full || !isfinite(l)) return;
        const unsigned long long q = sampling_pack(sampling_order_key(l), i);
        if (q < tau) return;
        const int at = atomicAdd(count, 1);
        if (at < V2_CAP) cand[at] = q;
        else full = true;
    };
    for_each_logit(x, vocab, f);
    __syncthreads();
    const int m = *count;
    __syncthreads();  // every thread has read it before a later gather resets it
    return m;
}

// Exclusive scan of one integer per thread: the sum over the threads
// before this one; *total gets the block's sum. Exact in any order.
__device__ unsigned long long block_exclusive_scan(unsigned long long v, unsigned long long *scratch,
                                                   unsigned long long *total) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nwarps = blockDim.x / 32;
    unsigned long long incl = v;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const unsigned long long y = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += y;
    }
    if (lane == 31) scratch[warp] = incl;
    __syncthreads();
    if (warp == 0) {  // the warps' totals, scanned by the first warp
        unsigned long long s = lane < nwarps ? scratch[lane] : 0ull;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const unsigned long long y = __shfl_up_sync(0xffffffffu, s, o);
            if (lane >= o) s += y;
        }
        scratch[lane] = s;
    }
    __syncthreads();
    const unsigned long long before = (warp > 0 ? scratch[warp - 1] : 0ull) + incl - v;
    *total = scratch[nwarps - 1];
    __syncthreads();  // scratch is reused
    return before;
}

// top-p over cand[0, n) (n <= V2_CAP, descending, 0 entries only at the
// end): the length of the shortest prefix whose integer mass reaches
// ceil(top_p * mass), mass = row_mass, or cand's own total when row_mass is
// 0 (top-k then top-p: the total of the k kept); 0 when cand's prefix never
// reaches it. Thread t owns cand[4t, 4t + 4): its masses, their sum, a
// block scan, then each thread's first index whose running sum reaches the
// target; the smallest over the block is the cut (the running sums never
// decrease, and the mass there is > 0: a real candidate, below n).
template <typename E>
__device__ int mass_cut(const unsigned long long *cand, int n, const E *x, float top, float inv_t, float top_p,
                        unsigned long long row_mass, unsigned long long *scratch) {
    const int first_i = threadIdx.x * V2_PER_THREAD;
    unsigned long long w[V2_PER_THREAD], local = 0;
#pragma unroll
    for (int c = 0; c < V2_PER_THREAD; c++) {
        const int i = first_i + c;
        w[c] = 0;
        if (i < n && cand[i] != 0)
            w[c] = sampling_mass(sampling_log_weight(logit_f(x[sampling_unpack_id(cand[i])]), top, inv_t));
        local += w[c];
    }
    unsigned long long total;
    unsigned long long cum = block_exclusive_scan(local, scratch, &total);
    const unsigned long long target = sampling_top_p_target(top_p, row_mass ? row_mass : total);  // >= 1
    int hit = -1;
#pragma unroll
    for (int c = 0; c < V2_PER_THREAD; c++) {
        cum += w[c];
        if (hit < 0 && cum >= target) hit = first_i + c;
    }
    const unsigned long long r = block_reduce_max(hit >= 0 ? (unsigned long long)(V2_CAP - hit) : 0ull, scratch);
    return r ? V2_CAP - (int)r + 1 : 0;
}

// The top-k set (0 < k < n_finite, k <= V2_CAP) into cand[0, k), in the
// order; k, or 0 when it does not fit (fall back).
template <int L, typename E>
__device__ int top_k_candidates(const E *x, int vocab, const shortlist_t<L> &list, int k,
                                unsigned long long n_finite, unsigned long long *cand, int *count) {
    sort_shortlists(list, cand);
    const unsigned long long tau = cand[k - 1];  // 0 when the lists hold fewer than k packs
    if (__syncthreads_and(list.holds_all_from(tau))) return k;  // (also: every thread has read tau)
    if (tau == 0 && n_finite > V2_CAP) return 0;  // every finite logit is a candidate: too many
    const int m = gather_from(x, vocab, tau, cand, count);  // >= k
    if (m > V2_CAP) return 0;
    sort_candidates(cand, m);
    return k;
}

// top-p alone (top-k off): the kept prefix into cand[0, n), in the order; n,
// or 0 when the shortlists do not reach the target or too many candidates
// lie above it (fall back).
template <int L, typename E>
__device__ int top_p_candidates(const E *x, int vocab, const shortlist_t<L> &list, float top, float inv_t,
                                float top_p, unsigned long long *cand, int *count, unsigned long long *scratch) {
    // Pass 2: the row's total mass (every finite logit, as the reference).
    unsigned long long acc = 0;
    auto f = [&](float l, int i) {
        if (isfinite(l)) acc += sampling_mass(sampling_log_weight(l, top, inv_t));
    };
    for_each_logit(x, vocab, f);
    const unsigned long long mass = block_reduce_sum(acc, scratch);
    sort_shortlists(list, cand);
    int n = mass_cut(cand, V2_CAP, x, top, inv_t, top_p, mass, scratch);
    if (n == 0) return 0;
    const unsigned long long tau = cand[n - 1];
    if (__syncthreads_and(list.holds_all_from(tau))) return n;  // U's prefix is the row's: the cut is exact
    const int m = gather_from(x, vocab, tau, cand, count);
    if (m > V2_CAP) return 0;
    sort_candidates(cand, m);
    return mass_cut(cand, m, x, top, inv_t, top_p, mass, scratch);  // reaches it by tau at the latest
}

// The Gumbel-max draw over cand[0, n): the largest (score key, id) pack
// over the whole block; tokens below SAMPLING_NEVER_WINS skipped, as the
// reference does.
template <typename E>
__device__ unsigned long long draw_candidates(const unsigned long long *cand, int n, const E *x, float top,
                                              float inv_t, uint64_t s, int64_t g, unsigned long long *scratch) {
    unsigned long long pick = 0;
    for (int j = threadIdx.x; j < n; j += blockDim.x) {
        const int32_t id = sampling_unpack_id(cand[j]);
        const float lw = sampling_log_weight(logit_f(x[id]), top, inv_t);
        if (lw < SAMPLING_NEVER_WINS) continue;
        const unsigned long long q = sampling_pack(sampling_order_key(sampling_gumbel_score(lw, s, g, id)), id);
        pick = q > pick ? q : pick;
    }
    return block_reduce_max(pick, scratch);
}

// The same draw over the row's tokens inside r.keep, in one pass.
template <typename E>
__device__ unsigned long long draw_row(const row_t<E> &r, uint64_t s, int64_t g, unsigned long long *scratch) {
    unsigned long long pick = 0;
    auto f = [&](float l, int i) {
        if (!isfinite(l)) return;
        const float lw = sampling_log_weight(l, r.top, r.inv_t);
        if (lw < SAMPLING_NEVER_WINS || !in_prefix(r.keep, sampling_order_key(l), i)) return;
        const unsigned long long q = sampling_pack(sampling_order_key(sampling_gumbel_score(lw, s, g, i)), i);
        pick = q > pick ? q : pick;
    };
    for_each_logit(r.logits, r.vocab, f);
    return block_reduce_max(pick, scratch);
}

// The fallback: version 1's cuts by bisection, then the draw over the row.
template <typename E>
__device__ unsigned long long draw_bisect(const E *x, int vocab, float top, float inv_t, int k, float top_p,
                                          uint64_t s, int64_t g, unsigned long long *scratch) {
    row_t<E> r = {x, vocab, top, inv_t, {0u, vocab - 1}};
    const prefix_t all = {0u, vocab - 1};
    if (k > 0) r.keep = shortest_prefix<false>(r, (unsigned long long)k, scratch);
    if (top_p < 1.0f) {
        const unsigned long long mass = pass_sum<true>(r, all, scratch);
        r.keep = shortest_prefix<true>(r, sampling_top_p_target(top_p, mass), scratch);
    }
    return draw_row(r, s, g, scratch);
}

// Rows that cut (temperature > 0, and top-k or top-p): the shortlists, then
// the candidates; the fallback when they do not fit. The pick pack (0: none).
template <typename E>
__device__ unsigned long long sample_cut_v2(const E *x, int vocab, const shortlist_t<V2_LIST> &list,
                                            const row_stats_t &st, float T, int k, float top_p, uint64_t s,
                                            int64_t g, unsigned long long *cand, int *count,
                                            unsigned long long *scratch) {
    const float top = logit_f(x[sampling_unpack_id(st.best)]), inv_t = sampling_inv_temperature(T);
    const bool k_on = k > 0 && (unsigned long long)k < st.n_finite, p_on = top_p < 1.0f;
    if (!k_on && !p_on) {  // top_k >= the finite logits: no cut after all
        const row_t<E> r = {x, vocab, top, inv_t, {0u, vocab - 1}};
        return draw_row(r, s, g, scratch);
    }
    int n = 0;  // the kept set is cand[0, n), in the order; 0: fall back
    if (k_on) {
        n = k <= V2_CAP ? top_k_candidates(x, vocab, list, k, st.n_finite, cand, count) : 0;
        if (n && p_on) n = mass_cut(cand, n, x, top, inv_t, top_p, 0, scratch);  // always reached: n >= 1
    } else {
        n = top_p_candidates(x, vocab, list, top, inv_t, top_p, cand, count, scratch);
    }
    if (n == 0) return draw_bisect(x, vocab, top, inv_t, k_on ? k : 0, top_p, s, g, scratch);
    return draw_candidates(cand, n, x, top, inv_t, s, g, scratch);
}

// Greedy and temperature-only rows: the argmax pass, and for temperature
// one draw pass.
template <typename E>
__device__ void sample_plain_v2(int32_t *out, const E *x, int vocab, float T, uint64_t s, int64_t g,
                                unsigned long long *scratch) {
    shortlist_t<1> best;
    const row_stats_t st = first_pass(x, vocab, best, scratch);
    const int32_t argmax = sampling_unpack_id(st.best);
    unsigned long long pick = 0;
    if (st.valid && T != 0.0f) {
        const row_t<E> r = {x, vocab, logit_f(x[argmax]), sampling_inv_temperature(T), {0u, vocab - 1}};
        pick = draw_row(r, s, g, scratch);
    }
    if (threadIdx.x == 0) out[blockIdx.x] = !st.valid ? -1 : pick ? sampling_unpack_id(pick) : argmax;
}

// One row, version 2's way, by the whole block (versions 2 and 3).
template <typename E>
__device__ void sample_row_v2(int32_t *out, int row, const E *x, int vocab, float T, int k, float p, uint64_t s,
                              int64_t g) {
    __shared__ unsigned long long cand[V2_CAP];  // the shortlists, then the candidates: packs, descending
    __shared__ unsigned long long scratch[32];
    __shared__ int count;
    if (T == 0.0f || (k == 0 && p >= 1.0f)) {  // the same branch for the whole block: one row per block
        sample_plain_v2(out, x, vocab, T, s, g, scratch);
        return;
    }
    shortlist_t<V2_LIST> list;
    const row_stats_t st = first_pass(x, vocab, list, scratch);
    if (!st.valid) {
        if (threadIdx.x == 0) out[row] = -1;
        return;
    }
    const unsigned long long pick = sample_cut_v2(x, vocab, list, st, T, k, p, s, g, cand, &count, scratch);
    if (threadIdx.x == 0) out[row] = pick ? sampling_unpack_id(pick) : sampling_unpack_id(st.best);
}

__global__ void __launch_bounds__(V2_THREADS, 2)
sample_kernel_v2(int32_t *out, const float *logits, long long stride, int vocab, const float *temperature,
                 const int32_t *top_k, const float *top_p, const uint64_t *seed, const int64_t *gen_index) {
    pdl_launch_dependents();
    pdl_wait();  // every read below is of activations (kernels/common.cuh: PDL)
    const int row = blockIdx.x;
    sample_row_v2(out, row, logits + (long long)row * stride, vocab, temperature[row], top_k[row], top_p[row],
                  seed[row], gen_index[row]);
}

// ---- version 3: a greedy row's argmax over several blocks --------------------------------------
//
// Why: at a few rows version 2 is one block a row, so one SM reads the whole
// row, 608 KB for Qwen3, while the GPU's other 131 SMs sit idle: 30 us for
// one greedy row from memory on an H100. (Inside the engine's decode graph
// the step measured whole did not get shorter with version 3: chapter 09,
// section 5.) Version 3 cuts a greedy row (T == 0)
// into P slices (P = 2 x SMs / rows, at most V3_MAX_PIECES, rounded down;
// 1 from 133 rows on 132 SMs, where version 2's one block a row already
// fills the GPU). Each slice's block computes what version 2's first pass
// computes over its slice: the largest finite (key, id) pack, the count of
// finite logits, whether it saw a +inf; the block writes them to the
// workspace, and the last of the row's P blocks to arrive (a counter per
// row, atomicAdd after a fence: the threadFenceReduction pattern) combines
// them: the largest pack, the sum, the or. Max, integer sum and or give
// the same result in any order, so the id is version 2's, bit for bit. The
// last block sets the row's counter back to 0, so the workspace is ready
// for the next launch with no memset (it must be zeroed once, when
// allocated). Every other row (temperature > 0) runs version 2's code in its
// first block; the others leave at once.
// Predicted for one greedy row of 151,936 on 132 SMs: P = 32 blocks of
// 19 KB each, one trip to L2 for the logits (the LM head just wrote them),
// two block reductions, a fence and an atomic: about 3 us.

#define V3_MAX_PIECES 32

struct v3_part_t {
    unsigned long long best;      // the largest finite pack of the slice (0: none)
    unsigned long long n_finite;  // the slice's finite logits
    unsigned int pos_inf;         // the slice holds a +inf
    unsigned int pad;
};

// A row's workspace: its arrival counter, then its slices' parts. One
// layout per row, whatever the launch's rows, so a counter never shares
// bytes with another launch's parts.
struct v3_row_t {
    unsigned int arrivals;  // the row's blocks done so far: 0 between launches
    unsigned int pad[3];
    v3_part_t part[V3_MAX_PIECES];
};

// Row `row`, slice `piece` of P, version 3's way: x is the row's logits.
template <typename E>
__device__ void sample_row_v3(int32_t *out, int row, int piece, int P, const E *x, int vocab, float T, int top_k,
                              float top_p, uint64_t seed, int64_t gen_index, v3_row_t *ws) {
    if (T != 0.0f || P == 1) {
        if (piece == 0) sample_row_v2(out, row, x, vocab, T, top_k, top_p, seed, gen_index);
        return;
    }
    __shared__ unsigned long long scratch[32];
    __shared__ unsigned int last;
    // The slice [lo, hi): whole 16-byte vectors (the row starts 16-byte
    // aligned when the stride is a multiple of 16 bytes, as the engine's is).
    constexpr int W = 16 / (int)sizeof(E);
    const int chunk = (((vocab + P - 1) / P) + W - 1) & ~(W - 1);
    const int lo = min(vocab, piece * chunk), hi = min(vocab, lo + chunk);
    unsigned long long best = 0, finite = 0;
    int pos_inf = 0;
    auto f = [&](float l, int i) {
        if (isfinite(l)) {
            finite++;
            const unsigned long long q = sampling_pack(sampling_order_key(l), lo + i);
            best = q > best ? q : best;
        } else if (l > 0.0f) {
            pos_inf = 1;  // +inf (NaN compares false)
        }
    };
    for_each_logit(x + lo, hi - lo, f);
    const unsigned long long n_finite = block_reduce_sum(finite, scratch);
    best = block_reduce_max(best, scratch);
    const int any_inf = __syncthreads_or(pos_inf);
    if (threadIdx.x == 0) {
        v3_part_t *pp = &ws[row].part[piece];
        pp->best = best;
        pp->n_finite = n_finite;
        pp->pos_inf = (unsigned)any_inf;
        __threadfence();  // the part is visible GPU-wide before the count says so
        last = atomicAdd(&ws[row].arrivals, 1u) == (unsigned)(P - 1);
    }
    __syncthreads();
    if (!last || threadIdx.x != 0) return;
    __threadfence();  // the other blocks' parts, after their counts
    unsigned long long b = 0, n = 0;
    unsigned int inf = 0;
    const v3_part_t *rp = ws[row].part;
    for (int j = 0; j < P; j++) {
        const unsigned long long pb = __ldcg(&rp[j].best);
        b = pb > b ? pb : b;
        n += __ldcg(&rp[j].n_finite);
        inf |= __ldcg(&rp[j].pos_inf);
    }
    ws[row].arrivals = 0;  // ready for the next launch
    out[row] = (inf || n == 0) ? -1 : sampling_unpack_id(b);
}

__global__ void __launch_bounds__(V2_THREADS, 2)
sample_kernel_v3(int32_t *out, const float *logits, long long stride, int vocab, const float *temperature,
                 const int32_t *top_k, const float *top_p, const uint64_t *seed, const int64_t *gen_index,
                 v3_row_t *ws) {
    pdl_launch_dependents();
    pdl_wait();  // every read below is of activations (kernels/common.cuh: PDL)
    const int row = blockIdx.x;
    sample_row_v3(out, row, blockIdx.y, gridDim.y, logits + (long long)row * stride, vocab, temperature[row],
                  top_k[row], top_p[row], seed[row], gen_index[row], ws);
}

// ---- version 4: version 3 on the LM head's bf16 logits ------------------------------------------
//
// Why: the LM head writes bf16, and versions 1 to 3 read fp32, so an
// engine that samples with them widens every row first (bf16_to_f32_cuda):
// at 256 rows of 151,936
// that kernel reads 78 MB and writes 156 MB (about 56 us at the copy rate,
// 86 us measured), and the sampler then reads the 156 MB again. Version 4
// reads the 78 MB of bf16 once: the widening happens in registers, where
// it is exact, so every id is version 3's on the widened row. A row with an
// option on (sampling_opts_row_on) is the exception: sampling_prepare_cuda
// changed its logits (penalties, masks), and they are no longer bf16
// values; sampling_prepare_bf16_cuda widened it into the fp32 buffer first,
// and version 4 reads that row there. Predicted at 256 greedy rows: the
// conversion's 86 us gone, and the draw's read halved (46.8 us to about 25).
__global__ void __launch_bounds__(V2_THREADS, 2)
sample_kernel_v4(int32_t *out, const __nv_bfloat16 *logits, const float *prepared, const sampling_opts_row_t *opts,
                 long long stride, int vocab, const float *temperature, const int32_t *top_k, const float *top_p,
                 const uint64_t *seed, const int64_t *gen_index, v3_row_t *ws) {
    pdl_launch_dependents();
    pdl_wait();  // every read below is of activations (kernels/common.cuh: PDL)
    const int row = blockIdx.x;
    const long long at = (long long)row * stride;
    if (opts && sampling_opts_row_on(&opts[row]))
        sample_row_v3(out, row, blockIdx.y, gridDim.y, prepared + at, vocab, temperature[row], top_k[row],
                      top_p[row], seed[row], gen_index[row], ws);
    else
        sample_row_v3(out, row, blockIdx.y, gridDim.y, logits + at, vocab, temperature[row], top_k[row], top_p[row],
                      seed[row], gen_index[row], ws);
}

// Pieces a greedy row is cut into at num_rows rows.
static int v3_pieces(int num_rows) {
    int P = 2 * mv_num_sms() / (num_rows > 0 ? num_rows : 1);
    return P < 1 ? 1 : P > V3_MAX_PIECES ? V3_MAX_PIECES : P;
}

__global__ void bf16_to_f32_kernel(float *out, const __nv_bfloat16 *in, long long n) {
    pdl_launch_dependents();
    pdl_wait();  // every read below is of activations (kernels/common.cuh: PDL)
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        out[i] = __bfloat162float(in[i]);
}

// ---- launchers ------------------------------------------------------------------------------------

extern "C" const char *sampling_version_name(int version) {
    return version == 1   ? "v1-bisect"
           : version == 2 ? "v2-shortlist"
           : version == 3 ? "v3-split-greedy"
           : version == 4 ? "v4-bf16"
                          : NULL;
}

extern "C" size_t sample_tokens_ws_bytes(int version, int num_rows) {
    if ((version != 3 && version != 4) || num_rows <= 0) return 0;
    return (size_t)num_rows * sizeof(v3_row_t);
}

extern "C" int sample_tokens_cuda(int version, int32_t *d_out, const float *d_logits, long long logits_stride,
                                  int num_rows, int vocab, const float *d_temperature, const int32_t *d_top_k,
                                  const float *d_top_p, const uint64_t *d_seed, const int64_t *d_gen_index,
                                  cudaStream_t stream) {
    if (version == 3) return mv_error("sample_tokens_cuda: version 3 needs a workspace (sample_tokens_ws_cuda)");
    return sample_tokens_ws_cuda(version, d_out, d_logits, logits_stride, num_rows, vocab, d_temperature, d_top_k,
                                 d_top_p, d_seed, d_gen_index, NULL, 0, stream);
}

extern "C" int sample_tokens_ws_cuda(int version, int32_t *d_out, const float *d_logits, long long logits_stride,
                                     int num_rows, int vocab, const float *d_temperature, const int32_t *d_top_k,
                                     const float *d_top_p, const uint64_t *d_seed, const int64_t *d_gen_index,
                                     void *d_ws, size_t ws_bytes, cudaStream_t stream) {
    if (version < 1 || version > SAMPLING_NUM_VERSIONS)
        return mv_error("sample_tokens_cuda: unknown version %d (1..%d)", version, SAMPLING_NUM_VERSIONS);
    if (version == 4)
        return mv_error("sample_tokens_cuda: version 4 reads the LM head's bf16 logits (sample_tokens_bf16_cuda)");
    if (num_rows < 0 || vocab < 1 || logits_stride < vocab)
        return mv_error("sample_tokens_cuda: bad shape rows=%d vocab=%d stride=%lld", num_rows, vocab, logits_stride);
    if (num_rows == 0) return 0;
    if (!d_out || !d_logits || !d_temperature || !d_top_k || !d_top_p || !d_seed || !d_gen_index)
        return mv_error("sample_tokens_cuda: null pointer");
    // One block per row; no allocation, no host sync: the engine captures this into CUDA graphs.
    if (version == 1)
        sample_kernel_v1<<<num_rows, SAMPLING_THREADS, 0, stream>>>(d_out, d_logits, logits_stride, vocab,
                                                                    d_temperature, d_top_k, d_top_p, d_seed,
                                                                    d_gen_index);
    else if (version == 2)
        mv_launch(sample_kernel_v2, dim3((unsigned)num_rows), dim3(V2_THREADS), 0, stream, d_out, d_logits,
                  logits_stride, vocab, d_temperature, d_top_k, d_top_p, d_seed, d_gen_index);
    else {
        const size_t need = sample_tokens_ws_bytes(3, num_rows);
        if (!d_ws || ws_bytes < need || ((uintptr_t)d_ws & 15))
            return mv_error("sample_tokens_cuda: version 3 at %d rows needs %zu bytes of 16-byte aligned workspace "
                            "(got %zu at %p)", num_rows, need, ws_bytes, d_ws);
        mv_launch(sample_kernel_v3, dim3((unsigned)num_rows, (unsigned)v3_pieces(num_rows)), dim3(V2_THREADS), 0,
                  stream, d_out, d_logits, logits_stride, vocab, d_temperature, d_top_k, d_top_p, d_seed, d_gen_index,
                  (v3_row_t *)d_ws);
    }
    return CUDA_TRY(cudaGetLastError());
}

extern "C" int sample_tokens_bf16_cuda(int32_t *d_out, const bf16_t *d_logits, const float *d_prepared,
                                       const sampling_opts_row_t *d_opts, long long logits_stride, int num_rows,
                                       int vocab, const float *d_temperature, const int32_t *d_top_k,
                                       const float *d_top_p, const uint64_t *d_seed, const int64_t *d_gen_index,
                                       void *d_ws, size_t ws_bytes, cudaStream_t stream) {
    const char *fn = "sample_tokens_bf16_cuda";
    if (num_rows < 0 || vocab < 1 || logits_stride < vocab)
        return mv_error("%s: bad shape rows=%d vocab=%d stride=%lld", fn, num_rows, vocab, logits_stride);
    if (num_rows == 0) return 0;
    if (!d_out || !d_logits || !d_temperature || !d_top_k || !d_top_p || !d_seed || !d_gen_index)
        return mv_error("%s: null pointer", fn);
    if (d_opts && !d_prepared) return mv_error("%s: rows with options need the prepared fp32 logits (NULL)", fn);
    const size_t need = sample_tokens_ws_bytes(4, num_rows);
    if (!d_ws || ws_bytes < need || ((uintptr_t)d_ws & 15))
        return mv_error("%s: %d rows need %zu bytes of 16-byte aligned workspace (got %zu at %p)", fn, num_rows, need,
                        ws_bytes, d_ws);
    mv_launch(sample_kernel_v4, dim3((unsigned)num_rows, (unsigned)v3_pieces(num_rows)), dim3(V2_THREADS), 0, stream,
              d_out, (const __nv_bfloat16 *)d_logits, d_prepared, d_opts, logits_stride, vocab, d_temperature,
              d_top_k, d_top_p, d_seed, d_gen_index, (v3_row_t *)d_ws);
    return CUDA_TRY(cudaGetLastError());
}

extern "C" int bf16_to_f32_cuda(float *d_out, const bf16_t *d_in, long long n, cudaStream_t stream) {
    if (n < 0) return mv_error("bf16_to_f32_cuda: n = %lld < 0", n);
    if (n == 0) return 0;
    if (!d_out || !d_in) return mv_error("bf16_to_f32_cuda: null pointer");
    long long blocks = (n + 255) / 256;
    const long long cap = 8LL * mv_num_sms();
    if (blocks > cap) blocks = cap;
    mv_launch(bf16_to_f32_kernel, dim3((unsigned)blocks), dim3(256), 0, stream, d_out, (const __nv_bfloat16 *)d_in, n);
    return CUDA_TRY(cudaGetLastError());
}

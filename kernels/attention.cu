/*
 * kernels/attention.cu - attention over the paged KV cache (see attention.h
 * and, for the maths, reference/attention.h).
 *
 * Three places hold the keys, one kernel body each: a K/V addressing policy
 * (PagedKV: through the block table; ContigKV: packed, cu_seqlens_k) says
 * how many keys sequence s has and where its key j lives, and every kernel is
 * a template over it. Queries are rows of q (any stride); decode is the case
 * "one query per sequence", cu_seqlens_q = NULL.
 *
 * Version 1 (naive) is written to be read beside the CPU reference.
 * Version 2 of decode is in attention_decode.cuh, versions 2 and 3 of
 * prefill in attention_flash.cuh and attention_flash3.cuh: all included
 * here, so one object file holds them all.
 */
#include "kernels/attention.h"
#include "kernels/versions.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/check.h"
#include "kernels/common.cuh"
#include "kernels/paged_kv.cuh"
#include "kernels/rope.h"
#include "reference/attention.h"

typedef __nv_bfloat16 bf16;

// ---- where the keys are --------------------------------------------------------------

// Paged: PagedKV (kernels/paged_kv.cuh, shared with the decode megakernel).

// Contiguous (FlashAttention's varlen): k, v [T_k, Hkv, D] rows of k_stride,
// v_stride elements; sequence s's keys are rows cu_seqlens_k[s] ..< [s+1].
struct ContigKV {
    const bf16 *k, *v;
    long long k_stride, v_stride;
    const int32_t *cu_seqlens_k;  // [num_seqs + 1]
    __device__ __forceinline__ int num_keys(int s) const { return cu_seqlens_k[s + 1] - cu_seqlens_k[s]; }
    __device__ __forceinline__ long long key_row(int s, int j) const { return (long long)cu_seqlens_k[s] + j; }
};

// Sequence s's query rows: first .. first + n - 1. NULL cu_seqlens_q: decode,
// sequence s has the one row s.
__device__ __forceinline__ int seq_queries(const int32_t *cu_seqlens_q, int s, int *first) {
    if (!cu_seqlens_q) {
        *first = s;
        return 1;
    }
    *first = cu_seqlens_q[s];
    return cu_seqlens_q[s + 1] - cu_seqlens_q[s];
}

// ---- version 1: naive ----------------------------------------------------------------
// One block of 128 threads per (query row, head): blockIdx = (i, h, s).
// The CPU reference computes all scores of the row, then their max, then
// the weights and the weighted sum of V. A block cannot hold a row of
// unbounded length, so this kernel walks the keys in chunks of 128 (one
// key per thread) and keeps the softmax online, the chapter's own lesson:
//   m = max so far, l = sum of exp(score - m) so far, acc = sum of
//   exp(score - m) * v so far; a new chunk with a larger max rescales l and
//   acc by exp(m_old - m_new).
// A warp computes one key's score at a time (lanes split the dot product
// over d, a warp sum adds the parts); then thread t holds the score of key
// j0 + t, and thread d < D owns output dimension d.
enum { V1_THREADS = 128 };

__device__ __forceinline__ float block_max_v1(float x) {
    __shared__ float partial[V1_THREADS / 32];
    for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
    if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = x;
    __syncthreads();
    float m = partial[0];
    for (int w = 1; w < V1_THREADS / 32; w++) m = fmaxf(m, partial[w]);
    __syncthreads();  // partial[] is rewritten by the next call
    return m;
}

template <class KV>
__global__ void __launch_bounds__(V1_THREADS)
attention_kernel_v1(bf16 *out, const bf16 *q, long long q_stride, KV kv, const int32_t *cu_seqlens_q, int H,
                    int Hkv, int D, float scale) {
    const int i = blockIdx.x, h = blockIdx.y, s = blockIdx.z, t = threadIdx.x;
    int first;
    const int n = seq_queries(cu_seqlens_q, s, &first);
    if (i >= n) return;  // the grid is sized for the longest sequence
    const int ctx = kv.num_keys(s);
    const int kv_head = h / (H / Hkv);  // GQA
    const int last = ctx - n + i;       // end-aligned causal mask: keys 0..last
    __shared__ float q_row[128];        // [D] this query, as floats
    __shared__ float scores[V1_THREADS];  // this chunk's scores
    __shared__ float p[V1_THREADS];       // this chunk's weights exp(score - m)
    const int lane = t % 32, warp = t / 32;
    if (t < D) q_row[t] = __bfloat162float(q[(long long)(first + i) * q_stride + (long long)h * D + t]);
    __syncthreads();

    float m = -INFINITY, l = 0.0f, acc = 0.0f;
    for (int j0 = 0; j0 <= last; j0 += V1_THREADS) {
        for (int c = warp; c < V1_THREADS; c += V1_THREADS / 32) {
            float score = -INFINITY;  // masked: past the diagonal, or past the context
            if (j0 + c <= last) {     // the same for the whole warp
                const bf16 *k = kv.k + kv.key_row(s, j0 + c) * kv.k_stride + (long long)kv_head * D;  // [D]
                float dot = 0.0f;
                for (int d = lane; d < D; d += 32) dot += q_row[d] * __bfloat162float(k[d]);
                score = warp_sum(dot) * scale;
            }
            if (lane == 0) scores[c] = score;
        }
        __syncthreads();
        const int j = j0 + t;
        const float score = scores[t];
        // Key j0 <= last always exists, so m_new is finite.
        const float m_new = fmaxf(m, block_max_v1(score));
        const float w = j <= last ? expf(score - m_new) : 0.0f;
        const float rescale = expf(m - m_new);  // 0 on the first chunk (m = -inf)
        p[t] = w;
        l = l * rescale + block_sum(w);  // block_sum's barrier also publishes p[]
        if (t < D) {
            const int chunk = min(V1_THREADS, last - j0 + 1);
            float a = acc * rescale;
            for (int c = 0; c < chunk; c++) {
                const bf16 *v = kv.v + kv.key_row(s, j0 + c) * kv.v_stride + (long long)kv_head * D;  // [D]
                a += p[c] * __bfloat162float(v[t]);
            }
            acc = a;
        }
        m = m_new;
        __syncthreads();  // scores[] and p[] are rewritten by the next chunk
    }
    // No keys at all (only a padded decode slot can have ctx = 0): output 0.
    if (t < D) out[((long long)(first + i) * H + h) * D + t] = __float2bfloat16(last >= 0 ? acc / l : 0.0f);
}

#include "kernels/rmsnorm.cuh"
#include "kernels/rope_fused.cuh"
#include "kernels/attention_decode.cuh"
#include "kernels/attention_flash.cuh"
#include "kernels/attention_flash3.cuh"

// ---- launchers -------------------------------------------------------------------------

extern "C" const char *attention_prefill_version_name(int version) {
    return kernel_version_name(ATTN_PREFILL_VERSION_TABLE, version);  // kernels/versions.h
}

extern "C" const char *attention_decode_version_name(int version) {
    return kernel_version_name(ATTN_DECODE_VERSION_TABLE, version);  // kernels/versions.h
}

// The checks every launcher shares: heads, head_dim, grid limits.
static int check_heads(const char *fn, int num_seqs, int num_heads, int num_kv_heads, int head_dim, float scale) {
    if (attention_validate_heads(num_seqs, num_heads, num_kv_heads, head_dim, scale)) return -1;
    if (head_dim != 64 && head_dim != 128)
        return mv_error("%s: head_dim %d is not supported by the CUDA kernels (64 or 128)", fn, head_dim);
    if (num_seqs > 65535)
        return mv_error("%s: num_seqs %d is more than the grid's z dimension holds (65535)", fn, num_seqs);
    return 0;
}

static int check_block_size(const char *fn, int block_size, int num_blocks, int max_blocks) {
    if (attention_validate_cache(block_size, num_blocks, max_blocks)) return -1;
    if (block_size < 16 || block_size > 256 || (block_size & (block_size - 1)))
        return mv_error("%s: block_size %d is not supported by the CUDA kernels (a power of two in 16..256)", fn,
                        block_size);
    return 0;
}

static int log2_int(int x) {
    int s = 0;
    while ((1 << s) < x) s++;
    return s;
}

// Versions 2 and up read 16-byte vectors: 8 bf16 of a row at a time.
static int check_vec16(const char *fn, const void *q, long long q_stride, const void *k, long long k_stride,
                       const void *v, long long v_stride) {
    if (!mv_aligned(q, 16) || !mv_aligned(k, 16) || !mv_aligned(v, 16) || q_stride % 8 || k_stride % 8 ||
        v_stride % 8)
        return mv_error("%s: versions 2 and up read 16-byte vectors: q, k and v must be 16-byte aligned and their row "
                        "strides multiples of 8 elements (q_stride %lld, k/v strides %lld, %lld)",
                        fn, q_stride, k_stride, v_stride);
    return 0;
}

template <class KV>
static void launch_v1(bf16 *out, const bf16 *q, long long q_stride, KV kv, const int32_t *cu_seqlens_q, int num_seqs,
                      int max_seqlen_q, int H, int Hkv, int D, float scale, cudaStream_t stream) {
    dim3 grid((unsigned)max_seqlen_q, (unsigned)H, (unsigned)num_seqs);
    attention_kernel_v1<KV><<<grid, V1_THREADS, 0, stream>>>(out, q, q_stride, kv, cu_seqlens_q, H, Hkv, D, scale);
}

static int check_prefill_common(const char *fn, int version, const void *out, const void *q, long long q_stride,
                                const void *cu_seqlens_q, int num_seqs, int max_seqlen_q, int num_heads,
                                int num_kv_heads, int head_dim, float scale) {
    if (version < 1 || version > ATTN_PREFILL_NUM_VERSIONS)
        return mv_error("%s: unknown version %d (1..%d)", fn, version, ATTN_PREFILL_NUM_VERSIONS);
    if (check_heads(fn, num_seqs, num_heads, num_kv_heads, head_dim, scale)) return -1;
    if (max_seqlen_q < 0) return mv_error("%s: max_seqlen_q must be >= 0, got %d", fn, max_seqlen_q);
    if (q_stride < (long long)num_heads * head_dim)
        return mv_error("%s: q_stride %lld is less than num_heads*head_dim = %d", fn, q_stride, num_heads * head_dim);
    if (num_seqs > 0 && max_seqlen_q > 0 && (!out || !q || !cu_seqlens_q))
        return mv_error("%s: null pointer for a non-empty batch", fn);
    return 0;
}

// The version choice both prefill entries share, for either place of the
// keys (KV = PagedKV or ContigKV): version 1, or a flash version after the
// 16-byte alignment check it needs.
template <class KV>
static int prefill_versions(const char *fn, int version, bf16 *out, const bf16 *q, long long q_stride, const KV &kv,
                            const int32_t *d_cu_seqlens_q, int num_seqs, int max_seqlen_q, int num_heads,
                            int num_kv_heads, int head_dim, float scale, cudaStream_t stream) {
    if (version == 1) {
        launch_v1(out, q, q_stride, kv, d_cu_seqlens_q, num_seqs, max_seqlen_q, num_heads, num_kv_heads, head_dim,
                  scale, stream);
    } else {
        if (check_vec16(fn, q, q_stride, kv.k, kv.k_stride, kv.v, kv.v_stride)) return -1;
        const int rc = version == 2 ? launch_flash(out, q, q_stride, kv, d_cu_seqlens_q, num_seqs, max_seqlen_q,
                                                   num_heads, num_kv_heads, head_dim, scale, stream)
                                    : launch_flash3(out, q, q_stride, kv, d_cu_seqlens_q, num_seqs, max_seqlen_q,
                                                    num_heads, num_kv_heads, head_dim, scale, stream);
        if (rc) return -1;
    }
    return CUDA_TRY(cudaGetLastError());
}

extern "C" int attention_prefill_cuda(int version, bf16_t *d_out, const bf16_t *d_q, long long q_stride,
                                      const bf16_t *d_k_cache, const bf16_t *d_v_cache,
                                      const int32_t *d_cu_seqlens_q, const int32_t *d_context_lens,
                                      const int32_t *d_block_tables, int num_seqs, int max_seqlen_q, int num_heads,
                                      int num_kv_heads, int head_dim, int block_size, int num_blocks, int max_blocks,
                                      float scale, cudaStream_t stream) {
    const char *fn = "attention_prefill_cuda";
    if (check_prefill_common(fn, version, d_out, d_q, q_stride, d_cu_seqlens_q, num_seqs, max_seqlen_q, num_heads,
                             num_kv_heads, head_dim, scale) ||
        check_block_size(fn, block_size, num_blocks, max_blocks))
        return -1;
    if (num_seqs == 0 || max_seqlen_q == 0) return 0;
    if (!d_k_cache || !d_v_cache || !d_context_lens || !d_block_tables)
        return mv_error("%s: null pointer for a non-empty batch", fn);
    const long long row = (long long)num_kv_heads * head_dim;
    PagedKV kv = {(const bf16 *)d_k_cache, (const bf16 *)d_v_cache, row, row, d_context_lens, d_block_tables,
                  log2_int(block_size), max_blocks};
    return prefill_versions(fn, version, (bf16 *)d_out, (const bf16 *)d_q, q_stride, kv, d_cu_seqlens_q, num_seqs,
                            max_seqlen_q, num_heads, num_kv_heads, head_dim, scale, stream);
}

extern "C" int attention_prefill_varlen_cuda(int version, bf16_t *d_out, const bf16_t *d_q, long long q_stride,
                                             const bf16_t *d_k, long long k_stride, const bf16_t *d_v,
                                             long long v_stride, const int32_t *d_cu_seqlens_q,
                                             const int32_t *d_cu_seqlens_k, int num_seqs, int max_seqlen_q,
                                             int num_heads, int num_kv_heads, int head_dim, float scale,
                                             cudaStream_t stream) {
    const char *fn = "attention_prefill_varlen_cuda";
    if (check_prefill_common(fn, version, d_out, d_q, q_stride, d_cu_seqlens_q, num_seqs, max_seqlen_q, num_heads,
                             num_kv_heads, head_dim, scale))
        return -1;
    const long long row = (long long)num_kv_heads * head_dim;
    if (k_stride < row || v_stride < row)
        return mv_error("%s: k_stride %lld and v_stride %lld must be >= num_kv_heads*head_dim = %lld", fn, k_stride,
                        v_stride, row);
    if (num_seqs == 0 || max_seqlen_q == 0) return 0;
    if (!d_k || !d_v || !d_cu_seqlens_k) return mv_error("%s: null pointer for a non-empty batch", fn);
    ContigKV kv = {(const bf16 *)d_k, (const bf16 *)d_v, k_stride, v_stride, d_cu_seqlens_k};
    return prefill_versions(fn, version, (bf16 *)d_out, (const bf16 *)d_q, q_stride, kv, d_cu_seqlens_q, num_seqs,
                            max_seqlen_q, num_heads, num_kv_heads, head_dim, scale, stream);
}

extern "C" int attention_decode_num_splits(int num_seqs, int num_kv_heads, int max_context_len, int block_size) {
    return decode_num_splits(num_seqs, num_kv_heads, max_context_len, block_size, mv_num_sms());
}

extern "C" size_t attention_decode_workspace_bytes(int num_seqs, int num_heads, int head_dim, int num_splits) {
    if (num_splits <= 1 || num_seqs <= 0 || num_heads <= 0 || head_dim <= 0) return 0;
    // Per (sequence, head, split): the unnormalised output [head_dim] and (max, sum), all fp32.
    return (size_t)num_seqs * num_heads * num_splits * ((size_t)head_dim + 2) * sizeof(float);
}

extern "C" int attention_decode_pieces_up_to(void) {
    static int up_to = -1;
    if (up_to < 0) {
        const char *e = getenv("MV_DECODE_PIECES");
        up_to = e && !strcmp(e, "0") ? 0 : e && !strcmp(e, "8") ? 8 : DEC_BALANCE_UP_TO;
    }
    return up_to;
}

// attention_decode_cuda, and with rope (its q the raw QKV rows) the pieces
// of attention_decode_rope_cuda's one kernel.
static int decode_run(const char *fn, int version, int num_splits, bf16_t *d_out, const bf16_t *d_q, long long q_stride,
                      const bf16_t *d_k_cache, const bf16_t *d_v_cache, const int32_t *d_context_lens,
                      const int32_t *d_block_tables, const int32_t *d_row_order, int num_seqs, int max_context_len,
                      int num_heads, int num_kv_heads, int head_dim, int block_size, int num_blocks, int max_blocks,
                      float scale, void *d_workspace, size_t workspace_bytes, const dec_rope_args *rope,
                      cudaStream_t stream) {
    if (version < 1 || version > ATTN_DECODE_NUM_VERSIONS)
        return mv_error("%s: unknown version %d (1..%d)", fn, version, ATTN_DECODE_NUM_VERSIONS);
    if (check_heads(fn, num_seqs, num_heads, num_kv_heads, head_dim, scale) ||
        check_block_size(fn, block_size, num_blocks, max_blocks))
        return -1;
    if (max_context_len < 0) return mv_error("%s: max_context_len must be >= 0, got %d", fn, max_context_len);
    if (num_splits < 0 || num_splits > ATTN_DECODE_MAX_SPLITS)
        return mv_error("%s: num_splits %d outside 0..%d (0 = choose)", fn, num_splits, ATTN_DECODE_MAX_SPLITS);
    if (version == 1 && num_splits > 1)
        return mv_error("%s: version 1 does not split (num_splits %d; use 0 or 1)", fn, num_splits);
    if (q_stride < (long long)num_heads * head_dim)
        return mv_error("%s: q_stride %lld is less than num_heads*head_dim = %d", fn, q_stride, num_heads * head_dim);
    if (num_seqs == 0) return 0;
    if (!d_out || !d_q || !d_k_cache || !d_v_cache || !d_context_lens || !d_block_tables)
        return mv_error("%s: null pointer for a non-empty batch", fn);
    const long long row = (long long)num_kv_heads * head_dim;
    PagedKV kv = {(const bf16 *)d_k_cache, (const bf16 *)d_v_cache, row, row, d_context_lens, d_block_tables,
                  log2_int(block_size), max_blocks};
    bf16 *out = (bf16 *)d_out;
    const bf16 *q = (const bf16 *)d_q;
    if (version == 1) {
        launch_v1(out, q, q_stride, kv, (const int32_t *)NULL, num_seqs, 1, num_heads, num_kv_heads, head_dim, scale,
                  stream);
    } else {
        if (check_vec16(fn, q, q_stride, kv.k, kv.k_stride, kv.v, kv.v_stride)) return -1;
        // Version 4 (automatic count only): where the batch alone just fills
        // the GPU, DEC_BALANCE_SPLITS pieces of at least DEC_MIN_PIECE keys
        // (attention_decode.cuh, decode_balanced).
        int splits = num_splits, row_piece = version >= 3 ? 1 : 0;
        if (!splits) {
            splits = attention_decode_num_splits(num_seqs, num_kv_heads, max_context_len, block_size);
            if (version >= 4 &&
                decode_balanced(num_seqs, num_kv_heads, splits, mv_num_sms(), attention_decode_pieces_up_to())) {
                splits = DEC_BALANCE_SPLITS;
                row_piece = DEC_MIN_PIECE;
            }
        }
        const size_t need = attention_decode_workspace_bytes(num_seqs, num_heads, head_dim, splits);
        if (need > 0 && (!d_workspace || workspace_bytes < need))
            return mv_error("%s: %d splits need %zu bytes of workspace, got %zu%s", fn, splits, need, workspace_bytes,
                            d_workspace ? "" : " (NULL)");
        if (need > 0 && !mv_aligned(d_workspace, 16))
            return mv_error("%s: the workspace must be 16-byte aligned", fn);
        // Versions 6 and 7: the ring; version 7 alone: the caller's row order.
        const int stages = version >= 6 ? DEC_RING_STAGES : 0;
        if (launch_decode_v2(out, q, q_stride, kv, num_seqs, max_context_len, num_heads, num_kv_heads, head_dim, scale,
                             splits, (float *)d_workspace, row_piece, version == 5 ? 2 : 1, stages,
                             version == 7 ? d_row_order : NULL, rope, stream))
            return -1;
    }
    return CUDA_TRY(cudaGetLastError());
}

extern "C" int attention_decode_cuda(int version, int num_splits, bf16_t *d_out, const bf16_t *d_q, long long q_stride,
                                     const bf16_t *d_k_cache, const bf16_t *d_v_cache, const int32_t *d_context_lens,
                                     const int32_t *d_block_tables, const int32_t *d_row_order, int num_seqs,
                                     int max_context_len, int num_heads, int num_kv_heads, int head_dim, int block_size,
                                     int num_blocks, int max_blocks, float scale, void *d_workspace,
                                     size_t workspace_bytes, cudaStream_t stream) {
    return decode_run("attention_decode_cuda", version, num_splits, d_out, d_q, q_stride, d_k_cache, d_v_cache,
                      d_context_lens, d_block_tables, d_row_order, num_seqs, max_context_len, num_heads, num_kv_heads,
                      head_dim, block_size, num_blocks, max_blocks, scale, d_workspace, workspace_bytes, NULL, stream);
}

extern "C" int attention_decode_rope_fused(int version, const bf16_t *d_qkv, const attention_decode_rope_t *rope,
                                           const bf16_t *d_k_cache, const bf16_t *d_v_cache, int num_heads,
                                           int num_kv_heads, int head_dim) {
    if (version < 2 || version > ATTN_DECODE_NUM_VERSIONS || !rope || !rope->cache || !rope->cache->d_cos_sin)
        return 0;
    if (head_dim != 64 && head_dim != 128) return 0;
    if (num_heads < 1 || num_kv_heads < 1 || num_heads % num_kv_heads) return 0;
    const int group = num_heads / num_kv_heads;
    // One CTA a kv head (G = the group): else a second CTA of the head could
    // read the new key before the first has stored it.
    if (group != 1 && group != 2 && group != 4 && group != 8) return 0;
    if (rope->cache->head_dim != head_dim) return 0;
    const void *sixteen[] = {d_qkv, rope->q_norm_w, rope->k_norm_w, d_k_cache, d_v_cache};
    for (size_t i = 0; i < sizeof sixteen / sizeof *sixteen; i++)
        if (!sixteen[i] || !mv_aligned(sixteen[i], 16)) return 0;
    return mv_aligned(rope->cache->d_cos_sin, 32);
}

extern "C" int attention_decode_rope_cuda(int version, int num_splits, bf16_t *d_out, bf16_t *d_qkv,
                                          const attention_decode_rope_t *rope, bf16_t *d_k_cache, bf16_t *d_v_cache,
                                          const int32_t *d_context_lens, const int32_t *d_block_tables,
                                          const int32_t *d_row_order, int num_seqs, int max_context_len, int num_heads,
                                          int num_kv_heads, int head_dim, int block_size, int num_blocks,
                                          int max_blocks, float scale, void *d_workspace, size_t workspace_bytes,
                                          cudaStream_t stream) {
    const char *fn = "attention_decode_rope_cuda";
    // The attention's own refusals first, so that a refused call writes
    // nothing (the two kernels' path stores the keys before attention runs).
    if (!rope) return mv_error("%s: no q/k norm and RoPE arguments", fn);
    if (version < 1 || version > ATTN_DECODE_NUM_VERSIONS)
        return mv_error("%s: unknown version %d (1..%d)", fn, version, ATTN_DECODE_NUM_VERSIONS);
    if (check_heads(fn, num_seqs, num_heads, num_kv_heads, head_dim, scale) ||
        check_block_size(fn, block_size, num_blocks, max_blocks))
        return -1;
    if (num_splits < 0 || num_splits > ATTN_DECODE_MAX_SPLITS || (version == 1 && num_splits > 1))
        return mv_error("%s: num_splits %d outside 0..%d (version 1: 0 or 1)", fn, num_splits,
                        version == 1 ? 1 : ATTN_DECODE_MAX_SPLITS);
    if (num_seqs > 0 && d_k_cache && d_k_cache == d_v_cache)
        return mv_error("%s: the K and V caches must be different buffers", fn);
    const long long qkv_stride = (long long)(num_heads + 2 * num_kv_heads) * head_dim;
    if (!attention_decode_rope_fused(version, d_qkv, rope, d_k_cache, d_v_cache, num_heads, num_kv_heads, head_dim))
        // The two kernels: the same bits (and q and k left normed in d_qkv).
        return qk_norm_rope_store_cuda(d_qkv, rope->q_norm_w, rope->k_norm_w, rope->positions, rope->cache, d_k_cache,
                                       d_v_cache, rope->slot_mapping, num_seqs, num_heads, num_kv_heads, head_dim,
                                       rope->eps, block_size, num_blocks, stream) ||
               decode_run(fn, version, num_splits, d_out, d_qkv, qkv_stride, d_k_cache, d_v_cache, d_context_lens,
                          d_block_tables, d_row_order, num_seqs, max_context_len, num_heads, num_kv_heads, head_dim,
                          block_size, num_blocks, max_blocks, scale, d_workspace, workspace_bytes, NULL, stream);
    if (num_seqs > 0 && (!rope->positions || !rope->slot_mapping))
        return mv_error("%s: null positions or slot_mapping for a non-empty batch", fn);
    const dec_rope_args ra = {(const bf16 *)d_qkv, qkv_stride, num_heads * head_dim, num_kv_heads,
                              rope->cache->max_position, rope->eps, (const bf16 *)rope->q_norm_w,
                              (const bf16 *)rope->k_norm_w, rope->cache->d_cos_sin, rope->positions,
                              rope->slot_mapping, (bf16 *)d_k_cache, (bf16 *)d_v_cache,
                              (long long)num_blocks * block_size};
    return decode_run(fn, version, num_splits, d_out, d_qkv, qkv_stride, d_k_cache, d_v_cache, d_context_lens,
                      d_block_tables, d_row_order, num_seqs, max_context_len, num_heads, num_kv_heads, head_dim,
                      block_size, num_blocks, max_blocks, scale, d_workspace, workspace_bytes, &ra, stream);
}

/*
 * reference/attention.h - CPU reference of attention over the paged KV cache,
 * for prefill (many query tokens per sequence) and decode (one).
 *
 * Where it sits in Qwen3: in every decoder layer, after q_norm/k_norm, RoPE
 * and the KV store (chapter 06) have written this step's k and v rows into
 * the layer's cache, and before the output projection o_proj.
 *
 * Naive attention, for one sequence and one query head:
 *
 *     S = Q K^T * scale         the score matrix [n, ctx]: query i against key j
 *     P = softmax(S + mask)     row by row; each row of P sums to 1
 *     O = P V                   [n, D]: each output row is a weighted average of V rows
 *
 * with Q [n, D] the sequence's n query rows of that head, K and V [ctx, D]
 * its ctx key and value rows, scale = 1/sqrt(head_dim) (scores then stay O(1)
 * as head_dim grows, and softmax does not saturate). Softmax subtracts the
 * row's maximum before exp(): the result is the same, and exp() never
 * overflows. This reference computes the score matrix one row at a time
 * (memory: one row of ctx scores per thread, never n x ctx), in float64.
 *
 * The causal mask. A token may only look at itself and earlier tokens: the
 * model was trained that way, and a later token does not exist yet when an
 * earlier one is generated. Masked scores are -inf, so their weights are 0;
 * here they are simply never computed.
 *
 * Why the mask is aligned to the end. A sequence's keys are ctx =
 * context_len tokens, its queries only the n newest of them: the first
 * ctx - n are already in the cache (a prefix-cache hit, or an earlier chunk
 * of a chunked prefill, or the whole past in decode). Query i (0-based among
 * the n new tokens) is the token at position ctx - n + i, so it sees keys
 *
 *     j <= ctx - n + i.
 *
 * Counting from the start (j <= i) would be right only when nothing was
 * cached (n = ctx); with a cached prefix it would hide most of the context.
 * Decode is the case n = 1: the one query sees all ctx keys.
 *
 * GQA (grouped-query attention). Qwen3 has fewer K/V heads than query heads
 * (Qwen3-0.6B: 16 query heads, 8 KV heads), which shrinks the KV cache. The
 * query heads form num_kv_heads groups of group = num_heads / num_kv_heads
 * consecutive heads, and every head of a group reads the same K/V head:
 *
 *     query head h reads kv head h / group.
 *
 * The paged cache (chapter 06): per layer, K and V caches
 *
 *     [num_blocks, block_size, num_kv_heads, head_dim]
 *
 * and a sequence's token j lives in physical block
 * block_tables[seq][j / block_size], at offset j % block_size. Blocks can be
 * anywhere, in any order, and shared between sequences with the same prefix.
 * Block tables are [num_seqs, max_blocks] int32, padded with -1 (chapter 08);
 * only the entries that cover the context are read.
 *
 * Which entry point the engine uses. The model runner writes each layer's
 * new K/V into the cache *before* that layer's attention (chapter 08), and a
 * cached prefix exists nowhere else, so the engine always reads keys through
 * the block table: attention_prefill_cpu and attention_decode_cpu.
 * attention_prefill_contiguous_cpu is the textbook form (FlashAttention's
 * varlen interface without a block table: keys packed sequence after
 * sequence, located by cu_seqlens_k). It is here as the simplest case to
 * learn and to write a first kernel against; the tests show that it and the
 * paged form agree. All three share one routine per (sequence, head).
 *
 * fp32 in, fp32 out, float64 inside (scores, softmax, the weighted sum of V).
 * On the GPU the tensors are bf16; the chapter converts bf16 inputs. The
 * work is split over threads by (sequence, head); each pair is computed by
 * one thread in a fixed order, so the result is bit for bit the same for any
 * number of threads.
 *
 * Library code: returns 0, or -1 after mv_error() (common/check.h) with a
 * message naming the sequence and the value; never exits. Tested by
 * tests/test_attention.c, driven by build/07-attention.
 */
#ifndef MV_REF_ATTENTION_H
#define MV_REF_ATTENTION_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// head_dim is at most this (Qwen3: 128) and even: the GPU kernels load
// pairs of bf16 values.
#define ATTN_MAX_HEAD_DIM 256

// Head shapes, shared by the CPU reference and the CUDA launchers:
// num_seqs >= 0, num_heads >= 1, num_kv_heads >= 1 dividing num_heads,
// head_dim even in [2, ATTN_MAX_HEAD_DIM], scale finite and > 0.
int attention_validate_heads(long long num_seqs, long long num_heads, long long num_kv_heads,
                             long long head_dim, float scale);

// Paged cache shapes: block_size >= 1, num_blocks >= 1, max_blocks >= 1,
// num_blocks * block_size slots fit an int32 (chapter 06's slot ids),
// max_blocks * block_size tokens fit an int. The CPU reference takes any
// block_size; the CUDA launchers may allow fewer (16..256, powers of two).
int attention_validate_cache(long long block_size, long long num_blocks, long long max_blocks);

// The batch description, read on the host (the CUDA launchers cannot read
// device memory: callers run this on the host copies before launching, as
// chapter 06 does with kv_store_validate_slots). With cu_seqlens_q NULL,
// every sequence has one query token (decode). Checks:
//   cu_seqlens_q [num_seqs + 1]: starts at 0, never decreases;
//   context_lens [num_seqs]: >= the sequence's new tokens (it counts the
//     cached ones and the new ones), <= max_blocks * block_size;
//   block_tables [num_seqs, max_blocks]: the ceil(context_len / block_size)
//     entries that cover the context are in [0, num_blocks) (not -1).
int attention_validate_paged_batch(const int32_t *cu_seqlens_q, const int32_t *context_lens,
                                   const int32_t *block_tables, int num_seqs, int block_size,
                                   int num_blocks, int max_blocks);

// cu_seqlens_q and cu_seqlens_k [num_seqs + 1]: both start at 0 and never
// decrease, and every sequence has at least as many keys as queries.
int attention_validate_contiguous_batch(const int32_t *cu_seqlens_q, const int32_t *cu_seqlens_k,
                                        int num_seqs);

// The order in which decode attention version 7 (kernels/attention.h)
// launches the rows' blocks: longest context first. order[k] is the row with
// the k-th longest context_lens entry; rows of equal length keep their own
// order (so the result is one permutation for a given batch). A negative
// length counts as 0. The GPU cannot sort cheaply inside one launch, and the
// engine knows every row's length on the host when it stages a step, so the
// order is made here, on the host. Returns 0, or -1 on a NULL array or
// num_seqs < 0.
int attention_row_order_longest_first(const int32_t *context_lens, int num_seqs, int32_t *order);

// order [num_seqs] must be a permutation of 0 .. num_seqs - 1 (every row
// exactly once): a row left out would never be computed, a row named twice
// would be written twice. Returns 0, or -1 with a message naming the first
// entry out of range or repeated. For the host copy, before it goes up.
int attention_validate_row_order(const int32_t *order, int num_seqs);

// num_threads, in all three: 0 = one per online CPU (the calling thread
// alone when the batch is small), 1 = the calling thread only, n = at most n.

// Prefill over the paged cache, causal mask aligned to the end.
//   out [T_q, num_heads, head_dim]        T_q = cu_seqlens_q[num_seqs]
//   q   [T_q, num_heads, head_dim]        sequence s: rows cu_seqlens_q[s] ..< cu_seqlens_q[s+1]
//   k_cache, v_cache [num_blocks, block_size, num_kv_heads, head_dim]
//   cu_seqlens_q [num_seqs + 1], context_lens [num_seqs] (cached + new keys),
//   block_tables [num_seqs, max_blocks] (-1 padded)
// scale: 1/sqrt(head_dim) for Qwen3.
int attention_prefill_cpu(float *out, const float *q, const float *k_cache, const float *v_cache,
                          const int32_t *cu_seqlens_q, const int32_t *context_lens,
                          const int32_t *block_tables, int num_seqs, int num_heads, int num_kv_heads,
                          int head_dim, int block_size, int num_blocks, int max_blocks, float scale,
                          int num_threads);

// Decode: one query token per sequence over its whole context in the cache.
//   out, q [num_seqs, num_heads, head_dim]; the rest as in prefill.
// The same as prefill with cu_seqlens_q = {0, 1, 2, ..., num_seqs}.
int attention_decode_cpu(float *out, const float *q, const float *k_cache, const float *v_cache,
                         const int32_t *context_lens, const int32_t *block_tables, int num_seqs,
                         int num_heads, int num_kv_heads, int head_dim, int block_size, int num_blocks,
                         int max_blocks, float scale, int num_threads);

// Prefill with keys packed contiguously (no cache, no block table).
//   out, q [T_q, num_heads, head_dim]; k, v [T_k, num_kv_heads, head_dim],
//   T_k = cu_seqlens_k[num_seqs]; sequence s has keys cu_seqlens_k[s] ..< cu_seqlens_k[s+1]
//   and the same end-aligned mask (more keys than queries = a prefix).
int attention_prefill_contiguous_cpu(float *out, const float *q, const float *k, const float *v,
                                     const int32_t *cu_seqlens_q, const int32_t *cu_seqlens_k,
                                     int num_seqs, int num_heads, int num_kv_heads, int head_dim,
                                     float scale, int num_threads);

#ifdef __cplusplus
}
#endif
#endif

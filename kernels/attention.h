/*
 * kernels/attention.h - attention over the paged KV cache on the GPU,
 * callable from C: prefill (many query tokens per sequence, causal, varlen)
 * and decode (one query token per sequence).
 *
 * The math, the end-aligned causal mask, GQA and the cache layout are those of
 * the CPU reference, reference/attention.h (read it first):
 *
 *   k_cache, v_cache [num_blocks, block_size, num_kv_heads, head_dim] bf16
 *   token j of sequence s at block_tables[s * max_blocks + j / block_size],
 *   offset j % block_size; query i of n new tokens sees keys
 *   j <= context_len - n + i; query head h reads kv head h / (H / Hkv).
 *
 * bf16 q, k, v and out; fp32 scores, online softmax and accumulation.
 * q rows may have any stride (a view into the QKV projection output
 * [T, (H + 2*Hkv) * D], so q_stride = (H + 2*Hkv) * D); out is contiguous
 * [T, H, D].
 *
 * The batch description (cu_seqlens_q, context_lens, block_tables) must be
 * checked on the host first with attention_validate_paged_batch()
 * (reference/attention.h): a launcher cannot read device memory. The
 * host-side sizes passed here (max_seqlen_q, max_context_len) must be upper
 * bounds of the device arrays' values; an upper bound larger than the true
 * maximum is allowed (it only launches blocks that find no work), which is
 * what a CUDA graph captured once for many steps needs.
 *
 * Supported shapes: head_dim 64 or 128, block_size a power of two in
 * 16..256, num_heads a multiple of num_kv_heads; anything else is refused
 * with a message naming the value.
 *
 * Versions (kernels/attention.cu; docs/07-attention.md, section 4):
 *   prefill 1  naive: a block of 128 threads per (query row, head); keys in
 *              chunks of 128 with an online softmax, a warp per key's dot
 *              product. Slow; a second reference on the GPU.
 *   prefill 2  flash (attention_flash.cuh): FlashAttention-2 on mma.sync
 *              m16n8k16 bf16, fp32 accumulators; 64 queries x 64 keys per
 *              tile, 4 warps, cp.async double buffering, swizzled shared
 *              memory (80 KB at D = 128), causal tiles skipped, the mask only
 *              on diagonal tiles. P is rounded to bf16 before the P V mma.
 *              Needs q, k, v 16-byte aligned with row strides multiples of 8.
 *   prefill 3  flash, 32 rows per warp (attention_flash3.cuh): version 2
 *              with 128 queries x 64 keys per tile and 4 warps of two
 *              16-row m-tiles each, so every K and V fragment read from
 *              shared memory feeds two mmas (Q read from shared per tile,
 *              96 KB at D = 128); heaviest causal tiles launched first;
 *              block table read once per 16 keys; per-warp causal skipping.
 *              Same alignment needs as version 2.
 *   decode  1  naive: prefill 1 with one query per sequence; never splits.
 *   decode  2  split (attention_decode.cuh): a block of 128 threads per
 *              (sequence, kv head, piece), the whole GQA group at once,
 *              16-byte loads, 32 KB in flight per block; pieces combined by
 *              a reduction kernel (log-sum-exp) when num_splits > 1.
 *              The pieces are cut from max_context_len on the host: under
 *              a loose bound (a CUDA graph launched with max_model_len) a
 *              short context lands in the first piece or two and the other
 *              blocks find no keys.
 *              Same alignment needs as prefill 2.
 *   decode  3  version 2 with each sequence's own context cut into the
 *              num_splits pieces (whole tiles of 64 keys at D = 128), on the
 *              device: the engine's, for decode graphs, which are launched with
 *              max_model_len as the bound. At one stream of 515 keys and 16
 *              pieces, 9 pieces of 64 keys instead of 3 of 256.
 *   decode  4  version 3 with pieces for a batch of mixed lengths: with the
 *              automatic count (num_splits 0), where the batch's (row, kv
 *              head) blocks number 2 to 8 a SM (version 3 leaves those
 *              unsplit), 8 pieces of at least 256 keys, so that the longest
 *              row's block does not hold up the layer (unsplit, a block reads
 *              ~34 keys a microsecond: 60 us for 2,048 keys). Elsewhere, and
 *              with an explicit num_splits, version 3.
 *   decode  5  version 4 with the pieces' reduction in its version 2
 *              (decode_reduce_one_v2: every load of up to 16 pieces issued
 *              before the first sum, lane k loading piece k's max and sum):
 *              the same sums in the same order, so version 4's bits. The
 *              decode megakernel reduces its pieces this way; this version
 *              puts that code under chapter 07's check.
 *   decode  6  version 4 with each block's keys and values through a ring
 *              in shared memory: every thread copies its own vectors of the
 *              next tile with cp.async while it computes the current one
 *              (two stages of 32 KB at groups of 1 or 2), so loads stay in
 *              flight during the math. The same vectors reach the same
 *              registers in the same order: version 4's bits. The ring
 *              leaves room for 3 blocks a SM, not 4; where the grid would fit
 *              in one wave at 4 a SM but not at 3, it takes version 4's loads.
 *   decode  7  version 6 with its blocks started longest row first: the
 *              caller passes d_row_order, a permutation of the rows
 *              (attention_row_order_longest_first, reference/attention.h,
 *              makes it on the host), and block (y, z) of the grid computes
 *              the (y + rows * z)-th (row, piece) of that order. Blocks start
 *              in grid order, so in a batch of mixed lengths the last ones to
 *              start are the shortest, and no long row runs on alone at the
 *              end of the launch. Taken only where the grid needs more than
 *              one wave (in one, every block starts at once). The same pieces
 *              and sums: version 4's bits, in any order. The engine's
 *              (ATTN_DECODE_FAST).
 */
#ifndef MV_KERNELS_ATTENTION_H
#define MV_KERNELS_ATTENTION_H

#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>

#include "common/bf16.h"
#include "kernels/rope.h"

#ifdef __cplusplus
extern "C" {
#endif

#define ATTN_PREFILL_NUM_VERSIONS 3
#define ATTN_PREFILL_FAST 3  // the version the engine uses
#define ATTN_DECODE_NUM_VERSIONS 7
#define ATTN_DECODE_FAST 7   // the version the engine uses
#define ATTN_DECODE_MAX_SPLITS 64

const char *attention_prefill_version_name(int version);
const char *attention_decode_version_name(int version);

// Prefill over the paged cache (what the engine calls: the new tokens' k and
// v are already stored in the cache by chapter 06's store_kvcache_cuda).
//   d_out [T_q, num_heads, head_dim], d_q rows of q_stride elements,
//   d_cu_seqlens_q [num_seqs + 1], d_context_lens [num_seqs],
//   d_block_tables [num_seqs, max_blocks]; max_seqlen_q >= every sequence's
//   new tokens.
int attention_prefill_cuda(int version, bf16_t *d_out, const bf16_t *d_q, long long q_stride,
                           const bf16_t *d_k_cache, const bf16_t *d_v_cache, const int32_t *d_cu_seqlens_q,
                           const int32_t *d_context_lens, const int32_t *d_block_tables, int num_seqs,
                           int max_seqlen_q, int num_heads, int num_kv_heads, int head_dim, int block_size,
                           int num_blocks, int max_blocks, float scale, cudaStream_t stream);

// Prefill with keys packed contiguously, FlashAttention's varlen interface:
//   d_k, d_v [T_k, num_kv_heads, head_dim] with row strides k_stride, v_stride
//   (elements); sequence s has queries cu_seqlens_q[s] ..< cu_seqlens_q[s+1]
//   and keys cu_seqlens_k[s] ..< cu_seqlens_k[s+1], the same end-aligned mask.
int attention_prefill_varlen_cuda(int version, bf16_t *d_out, const bf16_t *d_q, long long q_stride,
                                  const bf16_t *d_k, long long k_stride, const bf16_t *d_v, long long v_stride,
                                  const int32_t *d_cu_seqlens_q, const int32_t *d_cu_seqlens_k, int num_seqs,
                                  int max_seqlen_q, int num_heads, int num_kv_heads, int head_dim, float scale,
                                  cudaStream_t stream);

// How many pieces the split decode cuts each sequence's context into for
// this shape (1 = unsplit): enough thread blocks to fill the GPU's SMs when
// num_seqs * num_kv_heads alone does not, and no piece shorter than a few
// blocks of keys. At most ATTN_DECODE_MAX_SPLITS.
int attention_decode_num_splits(int num_seqs, int num_kv_heads, int max_context_len, int block_size);

// Version 4's band (and so versions 5 to 7's) tops out at 4 blocks a SM;
// MV_DECODE_PIECES=8 or 0 (an experiment switch: the pieces up to 8 blocks
// a SM, the band before version 7, or none, leaving version 7's row order
// alone against the tail) moves it. The top in use, read from the
// environment once.
int attention_decode_pieces_up_to(void);

// Bytes of device workspace the split decode needs (partial outputs and
// their softmax max and sum) for up to num_seqs sequences and num_splits
// pieces. 0 when num_splits is 1.
size_t attention_decode_workspace_bytes(int num_seqs, int num_heads, int head_dim, int num_splits);

// Decode: one query per sequence over its whole context in the cache.
//   d_out [num_seqs, num_heads, head_dim], d_q rows of q_stride elements.
// num_splits: 0 = attention_decode_num_splits(), 1 = unsplit, n = n pieces
// (versions 2 and 3; version 1 takes 0 or 1). d_workspace must hold
// attention_decode_workspace_bytes() for the splits used (may be NULL when
// unsplit). A piece that starts past a sequence's context contributes
// nothing, so max_context_len may be an upper bound. d_row_order
// [num_seqs]: the order version 7 starts the rows' blocks in, a permutation
// of 0 .. num_seqs - 1 (check the host copy with
// attention_validate_row_order: the launcher cannot read it), or NULL for
// the rows' own order; the other versions do not read it.
int attention_decode_cuda(int version, int num_splits, bf16_t *d_out, const bf16_t *d_q, long long q_stride,
                          const bf16_t *d_k_cache, const bf16_t *d_v_cache, const int32_t *d_context_lens,
                          const int32_t *d_block_tables, const int32_t *d_row_order, int num_seqs,
                          int max_context_len, int num_heads,
                          int num_kv_heads, int head_dim, int block_size, int num_blocks, int max_blocks,
                          float scale, void *d_workspace, size_t workspace_bytes, cudaStream_t stream);

// Decode with chapter 05's q/k norm + RoPE and chapter 06's store in it:
// the same as qk_norm_rope_store_cuda (kernels/rope.h) on d_qkv followed by
// attention_decode_cuda(version, ...) with d_q = d_qkv, in one kernel where
// attention_decode_rope_fused() says so (kernels/decode_rope_prep.cuh):
// each piece norms and rotates its own queries from the raw QKV row, and
// the piece that holds a row's last key (the new token's) stores that key
// and its value into the cache before it reads its keys. The output and
// the caches are the two kernels' bits (d_row_order as attention_decode_cuda). d_qkv [num_seqs, (num_heads + 2 *
// num_kv_heads) * head_dim] holds one token a row ([q | k | v], the
// engine's layout); the one kernel leaves its q and k columns raw, the two
// leave them normed and rotated: read neither afterwards. Slots are chapter
// 06's (-1 = store nothing; check them on the host first,
// kv_store_validate_slots: one out of range traps), positions must be below
// the cache's max_position (else a trap). num_splits, the workspace and the
// other arguments as attention_decode_cuda; versions 2 to 7 fuse, version 1
// runs the two kernels. A refused call (no rope arguments, an unknown
// version, heads, block size or pieces the kernels do not take, one buffer
// for K and V) returns -1 with mv_error() before anything is written. Checked by chapter 07 against the two kernels, bit
// for bit, and against the CPU reference.
typedef struct {
    const bf16_t *q_norm_w, *k_norm_w;  // [head_dim] each
    const int32_t *positions;           // [num_seqs]
    const rope_cache_gpu_t *cache;      // cos/sin [max_position, head_dim] (kernels/rope.h)
    const int32_t *slot_mapping;        // [num_seqs]
    float eps;                          // the q/k RMSNorm's epsilon
} attention_decode_rope_t;

int attention_decode_rope_cuda(int version, int num_splits, bf16_t *d_out, bf16_t *d_qkv,
                               const attention_decode_rope_t *rope, bf16_t *d_k_cache, bf16_t *d_v_cache,
                               const int32_t *d_context_lens, const int32_t *d_block_tables,
                               const int32_t *d_row_order, int num_seqs, int max_context_len, int num_heads,
                               int num_kv_heads, int head_dim, int block_size, int num_blocks, int max_blocks,
                               float scale, void *d_workspace, size_t workspace_bytes, cudaStream_t stream);

// 1 when attention_decode_rope_cuda runs one kernel for these arguments:
// version 2 to 7, head_dim 64 or 128, a GQA group of 1, 2, 4 or 8 (one CTA
// covers a kv head's queries), d_qkv, the weights and the caches 16-byte
// aligned, cos/sin 32-byte aligned; 0 when it runs the two kernels.
int attention_decode_rope_fused(int version, const bf16_t *d_qkv, const attention_decode_rope_t *rope,
                                const bf16_t *d_k_cache, const bf16_t *d_v_cache, int num_heads, int num_kv_heads,
                                int head_dim);

#ifdef __cplusplus
}
#endif
#endif

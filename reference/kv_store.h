/*
 * reference/kv_store.h - CPU reference of the paged KV cache's store step.
 *
 * Where it sits in Qwen3: in every decoder layer, after RoPE and before
 * attention, this step's k and v rows are written into the layer's KV cache,
 * where attention (chapter 07) reads them, now and in every later step.
 *
 * The cache, per layer: a K cache and a V cache, each
 *
 *     [num_blocks, block_size, num_kv_heads, head_dim] bf16
 *
 * A block holds block_size consecutive tokens of one sequence; its
 * (block, offset) pairs flatten into *slots*: slot = block * block_size +
 * offset, and the token in slot s has its K row at k_cache + s * Hkv * D.
 * Which physical block a sequence's i-th logical block lives in is its
 * block table's business (chapter 08's block manager); this step only sees
 * slot_mapping [T]: the slot of each token of the step, built by chapter 08's
 * scheduler as block_table[pos / block_size] * block_size + pos % block_size,
 * or -1 for a token whose K/V is already in the cache (a prefix-cache hit),
 * which is skipped.
 *
 * It is a copy: the cache holds exactly the bits of k and v; slots no token
 * names keep their earlier contents.
 */
#ifndef MV_REF_KV_STORE_H
#define MV_REF_KV_STORE_H

#include <stdint.h>

#include "common/bf16.h"

#ifdef __cplusplus
extern "C" {
#endif

// Shape checks shared by the CPU reference and the CUDA launchers:
// T >= 0, Hkv >= 1, D >= 1, block_size >= 1, num_blocks >= 1,
// row strides >= Hkv*D, num_blocks*block_size slots fit an int32.
int kv_store_validate(long long T, long long num_kv_heads, long long head_dim, long long k_stride,
                      long long v_stride, long long block_size, long long num_blocks);

// Every slot -1 or in [0, num_slots), and no slot named by two tokens (two
// writers of one slot in one step would race, and one of them is a bug
// upstream)? Else -1 naming the token(s). The CUDA launchers cannot read
// device memory, so callers run this on the host copy before launching, as
// chapter 04 does for token ids with embedding_validate_ids().
int kv_store_validate_slots(const int32_t *slot_mapping, int T, long long num_slots);

// k [T, Hkv, D] bf16 with row stride k_stride (k may be a view into the QKV
// output), v likewise; k_cache, v_cache [num_blocks, block_size, Hkv, D].
// Token t's rows are copied to slot slot_mapping[t] (skipped when -1).
int store_kvcache_cpu(const bf16_t *k, long long k_stride, const bf16_t *v, long long v_stride,
                      bf16_t *k_cache, bf16_t *v_cache, const int32_t *slot_mapping, int T,
                      int num_kv_heads, int head_dim, int block_size, int num_blocks);

// The same store for fp32 k/v and fp32 caches: the engine's CPU backend runs
// in fp32 throughout (chapter 09's runtime/runner_cpu.c), so its caches are fp32.
// Same shapes, strides, slot checks and -1 rule as store_kvcache_cpu.
int store_kvcache_f32_cpu(const float *k, long long k_stride, const float *v, long long v_stride,
                          float *k_cache, float *v_cache, const int32_t *slot_mapping, int T,
                          int num_kv_heads, int head_dim, int block_size, int num_blocks);

#ifdef __cplusplus
}
#endif
#endif

/*
 * kernels/kv_store.h - the paged KV cache's store step on the GPU, callable from C.
 *
 *   store_kvcache_cuda: k [T, Hkv, D] and v [T, Hkv, D] (any row strides:
 *   views into the QKV projection output) copied into
 *   k_cache / v_cache [num_blocks, block_size, Hkv, D] at the slots
 *   slot_mapping [T] (int32, device) names; slot -1 = skip (already cached).
 * An exact copy of bf16 bits. The layout and the slot rule are in
 * reference/kv_store.h; chapter 07's attention reads this layout.
 *
 * slot_mapping must be checked on the host first with
 * kv_store_validate_slots() (reference/kv_store.h): a launcher cannot read
 * device memory. A slot that slips through anyway (< -1 or past the cache)
 * stops the kernel with a trap instead of writing outside the cache.
 *
 * Versions:
 *   1  naive: one thread per element of K (and the same element of V).
 *   2  fast:  one warp per token; 16-byte vectors; each lane issues 4
 *             vectors of K and 4 of V before it stores any.
 */
#ifndef MV_KERNELS_KV_STORE_H
#define MV_KERNELS_KV_STORE_H

#include <cuda_runtime_api.h>
#include <stdint.h>

#include "common/bf16.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KV_STORE_NUM_VERSIONS 2
#define KV_STORE_FAST 2  // the version the engine uses

const char *kv_store_version_name(int version);

int store_kvcache_cuda(int version, const bf16_t *d_k, long long k_stride, const bf16_t *d_v, long long v_stride,
                       bf16_t *d_k_cache, bf16_t *d_v_cache, const int32_t *d_slot_mapping, int T,
                       int num_kv_heads, int head_dim, int block_size, int num_blocks, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif

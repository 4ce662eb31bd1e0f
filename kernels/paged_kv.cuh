/*
 * kernels/paged_kv.cuh - where decode attention finds a sequence's keys in
 * the paged KV cache (kernels/attention.cu's kernels and the decode
 * megakernel read it the same way).
 */
#ifndef MV_KERNELS_PAGED_KV_CUH
#define MV_KERNELS_PAGED_KV_CUH

#include <cuda_bf16.h>
#include <stdint.h>

// Paged: k_cache, v_cache [num_blocks, block_size, Hkv, D]; sequence s's key
// j is in physical block block_tables[s * max_blocks + j / block_size], at
// offset j % block_size. block_size is a power of two: a shift and a mask.
struct PagedKV {
    const __nv_bfloat16 *k, *v;    // [num_blocks * block_size rows, row_stride]
    long long k_stride, v_stride;  // elements between token rows (Hkv * D for the cache)
    const int32_t *context_lens;  // [num_seqs]
    const int32_t *block_tables;  // [num_seqs, max_blocks]
    int block_shift, max_blocks;   // block_size = 1 << block_shift
    __device__ __forceinline__ int num_keys(int s) const { return context_lens[s]; }
    // The token row of key j of sequence s.
    __device__ __forceinline__ long long key_row(int s, int j) const {
        const int32_t block = block_tables[(long long)s * max_blocks + (j >> block_shift)];
        return ((long long)block << block_shift) + (j & ((1 << block_shift) - 1));
    }
};

#endif

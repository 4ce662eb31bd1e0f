/*
 * kernels/rmsnorm.cuh - RMSNorm device code that other kernels reuse.
 *
 * Chapter 05 fuses Qwen3's q_norm / k_norm with RoPE; it normalises heads
 * with these functions instead of a copy of them.
 */
#ifndef MV_KERNELS_RMSNORM_CUH
#define MV_KERNELS_RMSNORM_CUH

#include "kernels/common.cuh"

// 1 / sqrt(mean(x^2) + eps) for a row spread over one warp: each lane passes
// the sum of squares of its own elements; every lane gets the result.
__device__ __forceinline__ float warp_inv_rms(float lane_sum_sq, int n, float eps) {
    return rsqrtf(warp_sum(lane_sum_sq) / (float)n + eps);
}

// The same for a row spread over the whole block (contains __syncthreads()).
__device__ __forceinline__ float block_inv_rms(float thread_sum_sq, int n, float eps) {
    return rsqrtf(block_sum(thread_sum_sq) / (float)n + eps);
}

// Sum over a group of LANES consecutive lanes (a power of two, <= 32) of a
// warp: several heads share a warp, each head owning one group. `mask`
// names the lanes present (all 32 unless the block ends mid-warp).
template <int LANES>
__device__ __forceinline__ float group_sum(float v, unsigned mask) {
#pragma unroll
    for (int offset = LANES / 2; offset > 0; offset >>= 1) v += __shfl_xor_sync(mask, v, offset);
    return v;
}

// 1 / sqrt(mean(x^2) + eps) for a head of n elements spread over a group
// of LANES lanes (each lane passes the sum of squares of its elements).
template <int LANES>
__device__ __forceinline__ float group_inv_rms(float lane_sum_sq, unsigned mask, int n, float eps) {
    return rsqrtf(group_sum<LANES>(lane_sum_sq, mask) / (float)n + eps);
}

#endif

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

#endif

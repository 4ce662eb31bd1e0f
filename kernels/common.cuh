/*
 * kernels/common.cuh - small device helpers shared by the lab's kernels.
 *
 * bf16 values travel as raw 16-bit patterns in the C headers (bf16_t) and as
 * __nv_bfloat16 inside kernels. Vector access: 16 bytes = 8 bf16 per
 * load/store, the widest single memory instruction (LDG.E.128), which keeps
 * the number of memory instructions per byte low.
 */
#ifndef MV_KERNELS_COMMON_CUH
#define MV_KERNELS_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

// N bf16 values moved as one aligned vector (N = 8: 16 bytes, 4: 8 bytes...).
template <int N>
struct alignas(2 * N) bf16_vec {
    __nv_bfloat16 v[N];
};

// True when p is aligned to `bytes`.
static inline bool mv_aligned(const void *p, int bytes) {
    return ((uintptr_t)p % (uintptr_t)bytes) == 0;
}

// Sum of v over the 32 lanes of a warp; every lane gets the total.
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
    return v;
}

// Sum of v over the whole block (blockDim.x a multiple of 32, at most 1024);
// every thread gets the total. Contains __syncthreads(): call it from all threads.
__device__ __forceinline__ float block_sum(float v) {
    __shared__ float partial[32];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    v = warp_sum(v);
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    const int num_warps = blockDim.x / 32;
    v = lane < num_warps ? partial[lane] : 0.0f;
    v = warp_sum(v);
    __syncthreads();  // partial[] may be reused by a later call
    return v;
}

// The number of multiprocessors (SMs) of the current device, queried once
// per device and cached: launchers size grids that fill the GPU from it.
int mv_num_sms(void);

#endif

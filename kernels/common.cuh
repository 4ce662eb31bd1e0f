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

// 16 bytes global -> shared (dst: a shared-space address), asynchronously,
// through L2 only (.cg); src_bytes 0 writes 16 zero bytes and reads nothing.
// A thread's copies are visible to that thread after cp_async_wait<N>() has
// left at most N of its newest groups in flight; other threads need a barrier.
__device__ __forceinline__ void cp_async16(uint32_t dst, const void *src, int src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }

// The shared-space address of a pointer into shared memory (cp.async,
// ldmatrix and mma operands take 32-bit shared addresses).
__device__ __forceinline__ uint32_t smem_u32(const void *p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}

// Four 8x8 b16 matrices; lanes 8i..8i+7 give the row addresses of matrix i,
// and lane l receives, of each matrix, row l/4, columns 2(l%4), 2(l%4)+1.
__device__ __forceinline__ void ldmatrix_x4(uint32_t r[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}
// The same, each matrix transposed: lane l receives rows 2(l%4), 2(l%4)+1 of column l/4.
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t r[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

// Byte offset of 16-byte chunk `chunk` of row `row` in a swizzled tile of
// rows of CHUNKS chunks.
template <int CHUNKS>
__device__ __forceinline__ uint32_t swz(int row, int chunk) {
    return (uint32_t)((row * CHUNKS + (chunk ^ (row & 7))) * 16);
}

// The number of multiprocessors (SMs) of the current device, queried once
// per device and cached: launchers size grids that fill the GPU from it.
int mv_num_sms(void);

// ---- programmatic dependent launch (PDL, sm_90 and later) ----------------------
//
// A kernel launched with the PDL attribute (mv_launch while mv_pdl_enabled())
// may start before the kernel ahead of it in the stream has finished: as soon
// as every block of that kernel has called pdl_launch_dependents() (or
// exited), or, in the engine's decode graphs, once every block of it has
// begun (runner_cuda.c moves the graphs' programmatic edges to the
// launch-completion port). Until it calls pdl_wait(), it may only read what
// no earlier kernel writes (weights, constants) and may write nothing;
// pdl_wait() returns when the kernel ahead has finished and its writes are
// visible. Since that kernel passed its own pdl_wait() before finishing,
// every earlier kernel has finished too. A decode-path kernel therefore
// starts with pdl_launch_dependents() (let the next kernel get resident and
// issue its weight loads) and calls pdl_wait() before its first read of an
// activation. Launched without the attribute both are no-ops, so the same
// kernel serves plain launches and the chapters' checks.
__device__ __forceinline__ void pdl_wait(void) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_launch_dependents(void) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

#include "kernels/pdl.h"

// kernel<<<grid, block, smem, stream>>>(args...), with the PDL attribute when
// mv_pdl_enabled(). Only kernels that call pdl_wait() before reading
// activations may be launched through it.
template <typename... KArgs, typename... Args>
static inline cudaError_t mv_launch(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem,
                                    cudaStream_t stream, Args... args) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = mv_pdl_enabled() ? 1 : 0;
    return cudaLaunchKernelEx(&cfg, kernel, static_cast<KArgs>(args)...);
}

#endif

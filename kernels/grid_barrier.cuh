/*
 * kernels/grid_barrier.cuh - a barrier of every block of one kernel, for
 * persistent kernels launched cooperatively (cudaLaunchCooperativeKernel
 * guarantees that all blocks are resident at once, without which a block
 * spinning here could wait for one that never starts).
 *
 * One 32-bit counter in device memory, zeroed before the launch. Barrier i
 * (counted from 1 by every block alike) is passed when the counter reaches
 * i * gridDim.x: each block adds 1 when it arrives and waits for that value.
 * The block's thread 0 does the arrival and the waiting; the __syncthreads
 * on either side order the other threads' accesses with it:
 *
 *   __syncthreads()                  every thread's writes of this phase done
 *   red.release.gpu  count += 1      ... made visible before the arrival
 *   ld.acquire.gpu   until count >= i * blocks
 *   __syncthreads()                  no thread reads the next phase's input early
 *
 * The release is cumulative: it publishes what the block's other threads
 * wrote before the first __syncthreads, and the acquire makes every block's
 * writes visible to this one after the second. Reads after a barrier of
 * data written before it must not use the non-coherent path (__ldg,
 * ld.global.nc), whose cache the barrier does not invalidate; weights,
 * written by no one during the kernel, may.
 */
#ifndef MV_KERNELS_GRID_BARRIER_CUH
#define MV_KERNELS_GRID_BARRIER_CUH

#include <cuda_runtime.h>

typedef struct {
    unsigned *count;
    unsigned epoch;  // barriers passed so far by this block
} grid_barrier_t;

__device__ __forceinline__ grid_barrier_t grid_barrier_make(unsigned *count) {
    grid_barrier_t b = {count, 0u};
    return b;
}

// Sync: how the block's participating threads meet (__syncthreads, or a
// named barrier when some warps of the block do not take part); thread 0
// must be one of them.
struct grid_barrier_block_sync {
    static __device__ __forceinline__ void sync() { __syncthreads(); }
};

// Thread 0's half of barrier i, split so that a kernel can act between the
// two (every thread counts the epoch alike; only thread 0 calls these).
// The arrival: returns the count that means every block has arrived.
__device__ __forceinline__ unsigned grid_barrier_arrive(const grid_barrier_t *b) {
    asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(b->count) : "memory");
    return b->epoch * gridDim.x;
}

// The wait: one acquire load at a time until the count is reached.
__device__ __forceinline__ void grid_barrier_wait(const grid_barrier_t *b, unsigned target) {
    unsigned v;
    do {
        asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(b->count) : "memory");
    } while (v < target);
}

template <class Sync = grid_barrier_block_sync>
__device__ __forceinline__ void grid_barrier_sync(grid_barrier_t *b) {
    Sync::sync();
    b->epoch++;
    if (threadIdx.x == 0) grid_barrier_wait(b, grid_barrier_arrive(b));
    Sync::sync();
}

#endif

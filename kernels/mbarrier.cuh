/*
 * kernels/mbarrier.cuh - shared-memory mbarriers and the bulk copy engine
 * (cp.async.bulk, compute capability 9.0), as the decode megakernel uses
 * them: the copies' barriers take one arrival a phase and count the bytes;
 * the hand-over barriers take one arrival from each thread that signals.
 * Below sm_90 the functions compile to nothing (callers check the GPU).
 * Used by kernels/decode_megakernel.cu, tests/gpu/racecheck_probe.cu and
 * tests/gpu/mbar_probe.cu (which times the waits by try_wait against those
 * by test_wait: chapter 09, exercise 12).
 */
#ifndef MV_KERNELS_MBARRIER_CUH
#define MV_KERNELS_MBARRIER_CUH

#include <stdint.h>

namespace mv_mbar {

__device__ __forceinline__ unsigned smem_u32(const void *p) { return (unsigned)__cvta_generic_to_shared(p); }

// A phase completes after `count` arrivals (and, with mbar_expect, its bytes).
__device__ __forceinline__ void mbar_init(uint64_t *bar, unsigned count = 1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(bar)), "r"(count) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#endif
}

// Arrive (release: this thread's earlier accesses happen before the phase completes).
__device__ __forceinline__ void mbar_arrive(uint64_t *bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_u32(bar)) : "memory");
#endif
}

// Expect `bytes` on the barrier (one arrival: its phase completes when that
// many bytes have landed). Thread 0 only.
__device__ __forceinline__ void mbar_expect(uint64_t *bar, unsigned bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)), "r"(bytes)
                 : "memory");
#endif
}

// `bytes` bytes (a multiple of 16) from src into dst by the bulk copy
// engine, completing on the barrier. Thread 0 only.
__device__ __forceinline__ void bulk_copy(void *dst, const void *src, unsigned bytes, uint64_t *bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                     smem_u32(dst)),
                 "l"(src), "r"(bytes), "r"(smem_u32(bar))
                 : "memory");
#else
    (void)dst, (void)src, (void)bytes, (void)bar;
#endif
}

// Wait until the phase of this parity has completed (acquire): by
// mbarrier.try_wait, which may suspend the thread until the phase completes
// or a time limit passes, or with SPIN by mbarrier.test_wait, which only
// looks (a spin on shared memory). tests/gpu/mbar_probe.cu times both.
template <bool SPIN = false>
__device__ __forceinline__ void mbar_wait(uint64_t *bar, unsigned parity) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    unsigned done = 0;
    while (!done) {
        if constexpr (SPIN)
            asm volatile(
                "{\n .reg .pred p;\n mbarrier.test_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}"
                : "=r"(done)
                : "r"(smem_u32(bar)), "r"(parity)
                : "memory");
        else
            asm volatile(
                "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}"
                : "=r"(done)
                : "r"(smem_u32(bar)), "r"(parity)
                : "memory");
    }
#else
    (void)bar, (void)parity;
#endif
}
// Arrive, then wait for the phase of this arrival to complete: a barrier of
// the `count` threads that each call it once a phase (the token that
// mbarrier.arrive returns names the phase, so the caller keeps no count).
// SPIN as for mbar_wait.
template <bool SPIN = false>
__device__ __forceinline__ void mbar_arrive_wait(uint64_t *bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    uint64_t state;
    asm volatile("mbarrier.arrive.shared::cta.b64 %0, [%1];" : "=l"(state) : "r"(smem_u32(bar)) : "memory");
    unsigned done = 0;
    while (!done) {
        if constexpr (SPIN)
            asm volatile("{\n .reg .pred p;\n mbarrier.test_wait.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}"
                         : "=r"(done)
                         : "r"(smem_u32(bar)), "l"(state)
                         : "memory");
        else
            asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}"
                         : "=r"(done)
                         : "r"(smem_u32(bar)), "l"(state)
                         : "memory");
    }
#else
    (void)bar;
#endif
}
}  // namespace mv_mbar

#endif

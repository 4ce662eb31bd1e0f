/*
 * tests/gpu/mbar_probe.cu - what one meeting of the decode megakernel's 256
 * consumer threads costs, by the kind of barrier they meet at.
 *
 *   nvcc -I. -DMV_HAVE_CUDA=1 -O3 -std=c++17 -gencode=arch=compute_90,code=sm_90 tests/gpu/mbar_probe.cu \
 *        build/lib/libmv_core.a -lcublas -lnccl -o build/mbar_probe
 *   ./build/mbar_probe [ROUNDS]
 *
 * The question behind it (chapter 09, exercise 12): with its consumers'
 * barrier as an mbarrier of 256 arrivals waited on by `mbarrier.try_wait`,
 * the megakernel is slower than with named barrier 1, and o_proj's input, a
 * 4 KB copy and one such meeting, takes several times as long; the RMSNorm's
 * block sum, which meets at an mbarrier the same way, makes the norm's
 * input about 0.9 us longer than a plain copy's. try_wait may suspend the
 * thread until the phase completes or a time limit passes; test_wait only
 * looks. Each variant: one block of 288 threads a SM (132 blocks; the ninth
 * warp leaves at once, as the producer's idle lanes do), ROUNDS meetings of
 * the 256 consumers, each round one warp (in turn) arriving SKEW cycles
 * late, so that the figure past SKEW is the meeting's latency after its last
 * arrival. Printed: cycles a meeting (block 0's clock, median of 5 launches)
 * and that minus SKEW.
 *   named        bar.sync 1, 256
 *   try-parity   mbarrier.arrive, then mbarrier.try_wait.parity until done
 *                (the RMSNorm's block sum, mbar_arrive + mbar_wait)
 *   try-state    mbarrier.arrive returning its state, then try_wait on it
 *                (mbar_arrive_wait: the MV_MK_CSYNC_MBAR build's barrier)
 *   test-parity  mbarrier.arrive, then mbarrier.test_wait.parity until done
 *                (mbar_wait<true>)
 *   test-state   mbar_arrive_wait<true>: the MV_MK_CSYNC_MBAR barrier by test_wait
 *   hint-N       try_wait.parity with a suspend-time hint of N ns
 * The program checks nothing of its own; the table is the result.
 */
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <algorithm>
#include <vector>

#include "common/check.h"
#include "kernels/mbarrier.cuh"


using namespace mv_mbar;

enum { NAMED, TRY_PARITY, TRY_STATE, TEST_PARITY, TEST_STATE, HINT };

__device__ __forceinline__ void spin_cycles(long long c) {
    const long long t0 = clock64();
    while (clock64() - t0 < c) {
    }
}

__device__ __forceinline__ bool try_parity_hint(uint64_t *bar, unsigned parity, unsigned hint) {
    unsigned done;
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2, %3;\n selp.u32 %0, 1, 0, p;\n}"
        : "=r"(done)
        : "r"(smem_u32(bar)), "r"(parity), "r"(hint)
        : "memory");
    return done != 0;
}

template <int MODE>
__global__ void __launch_bounds__(288, 1) meet_kernel(int rounds, long long skew, unsigned hint,
                                                      long long *cycles) {
    __shared__ uint64_t bar;
    if (threadIdx.x == 0) mbar_init(&bar, 256);
    __syncthreads();
    if (threadIdx.x >= 256) return;
    const int warp = threadIdx.x / 32;
    const long long t0 = clock64();
    for (int r = 0; r < rounds; r++) {
        if (skew && warp == r % 8) spin_cycles(skew);
        if constexpr (MODE == NAMED) {
            asm volatile("bar.sync 1, 256;" ::: "memory");
        } else if constexpr (MODE == TRY_STATE) {
            mbar_arrive_wait(&bar);
        } else if constexpr (MODE == TEST_STATE) {
            mbar_arrive_wait<true>(&bar);
        } else {
            mbar_arrive(&bar);
            const unsigned parity = (unsigned)r & 1u;
            if constexpr (MODE == TRY_PARITY) mbar_wait(&bar, parity);
            if constexpr (MODE == TEST_PARITY) mbar_wait<true>(&bar, parity);
            if constexpr (MODE == HINT)
                while (!try_parity_hint(&bar, parity, hint)) {
                }
        }
    }
    if (blockIdx.x == 0 && threadIdx.x == 0) *cycles = clock64() - t0;
}

template <int MODE>
static double run(int rounds, long long skew, unsigned hint, int blocks, long long *d) {
    std::vector<double> t;
    for (int k = 0; k < 6; k++) {
        meet_kernel<MODE><<<blocks, 288, 100 * 1024>>>(rounds, skew, hint, d);
        CUDA_CHECK(cudaGetLastError());
        long long c;
        CUDA_CHECK(cudaMemcpy(&c, d, sizeof c, cudaMemcpyDeviceToHost));
        if (k) t.push_back((double)c / rounds);  // the first launch warms up
    }
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
}

int main(int argc, char **argv) {
    if (argc > 2) {
        fprintf(stderr, "usage: mbar_probe [ROUNDS]\n");
        return 2;
    }
    char *end = NULL;
    const long parsed = argc > 1 ? strtol(argv[1], &end, 10) : 4096;
    const int ok = argc == 1 || (end != argv[1] && *end == '\0');
    const int rounds = ok && parsed >= 1 && parsed <= 1000000 ? (int)parsed : 0;
    if (rounds == 0) {
        fprintf(stderr, "mbar_probe: ROUNDS must be an integer from 1 to 1000000, got '%s'\n", argv[1]);
        return 2;
    }
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    if (prop.major < 9) {
        fprintf(stderr, "mbar_probe: needs compute capability 9.0 (mbarrier try_wait), this GPU is %d.%d\n", prop.major,
                prop.minor);
        return 2;
    }
    long long *d;
    CUDA_CHECK(cudaMalloc(&d, sizeof(long long)));
    CUDA_CHECK(cudaFuncSetAttribute(meet_kernel<NAMED>, cudaFuncAttributeMaxDynamicSharedMemorySize, 100 * 1024));
    CUDA_CHECK(cudaFuncSetAttribute(meet_kernel<TRY_PARITY>, cudaFuncAttributeMaxDynamicSharedMemorySize, 100 * 1024));
    CUDA_CHECK(cudaFuncSetAttribute(meet_kernel<TRY_STATE>, cudaFuncAttributeMaxDynamicSharedMemorySize, 100 * 1024));
    CUDA_CHECK(cudaFuncSetAttribute(meet_kernel<TEST_PARITY>, cudaFuncAttributeMaxDynamicSharedMemorySize, 100 * 1024));
    CUDA_CHECK(cudaFuncSetAttribute(meet_kernel<TEST_STATE>, cudaFuncAttributeMaxDynamicSharedMemorySize, 100 * 1024));
    CUDA_CHECK(cudaFuncSetAttribute(meet_kernel<HINT>, cudaFuncAttributeMaxDynamicSharedMemorySize, 100 * 1024));
    const int blocks = prop.multiProcessorCount;
    int khz = 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, 0));
    printf("mbar_probe: %s, %d SMs, clock %.0f MHz, %d rounds, one block of 288 threads a SM (256 meet)\n", prop.name,
           blocks, khz / 1e3, rounds);
    printf("%-14s %8s %14s %16s\n", "variant", "skew", "cycles/meeting", "past the skew");
    const long long skews[] = {0, 2000};
    for (long long s : skews) {
        double c;
        c = run<NAMED>(rounds, s, 0, blocks, d);
        printf("%-14s %8lld %14.1f %16.1f\n", "named", s, c, c - s);
        c = run<TRY_PARITY>(rounds, s, 0, blocks, d);
        printf("%-14s %8lld %14.1f %16.1f\n", "try-parity", s, c, c - s);
        c = run<TRY_STATE>(rounds, s, 0, blocks, d);
        printf("%-14s %8lld %14.1f %16.1f\n", "try-state", s, c, c - s);
        c = run<TEST_PARITY>(rounds, s, 0, blocks, d);
        printf("%-14s %8lld %14.1f %16.1f\n", "test-parity", s, c, c - s);
        c = run<TEST_STATE>(rounds, s, 0, blocks, d);
        printf("%-14s %8lld %14.1f %16.1f\n", "test-state", s, c, c - s);
        const unsigned hints[] = {0u, 20u, 100u, 1000u};
        for (unsigned h : hints) {
            char name[32];
            snprintf(name, sizeof name, "hint-%u", h);
            c = run<HINT>(rounds, s, h, blocks, d);
            printf("%-14s %8lld %14.1f %16.1f\n", name, s, c, c - s);
        }
    }
    CUDA_CHECK(cudaFree(d));
    return 0;
}

/*
 * tests/gpu/racecheck_probe.cu - the two shared-memory patterns of the
 * decode megakernel that compute-sanitizer's racecheck reported while they
 * met at named barriers (docs/09-engine.md, "A decode megakernel"), each
 * alone in a small kernel, beside the mbarrier hand-over that replaced
 * them. On an H200 racecheck finds nothing in any of the variants (docs/
 * results/09-engine-megakernel.txt): alone, neither pattern is flagged.
 *
 *   nvcc -I. -O3 -std=c++17 -gencode=arch=compute_90,code=sm_90 tests/gpu/racecheck_probe.cu \
 *        -o build/racecheck_probe
 *   ./build/racecheck_probe VARIANT            (checks its own results: exit 1 on a wrong sum)
 *   compute-sanitizer --tool racecheck ./build/racecheck_probe VARIANT
 *
 * (tests/gpu/racecheck_probe.sh runs every variant under racecheck and
 * synccheck and prints one line each.) One block, ROUNDS rounds.
 *
 * The block sum (the megakernel's consumers_inv_rms): lane 0 of each of 8
 * warps writes its warp's sum to a __shared__ float[8], a barrier, every
 * thread reads the 8 and sums them, a barrier.
 *   sum-sync       256 threads, __syncthreads                     (the baseline)
 *   sum-named      256 threads, bar.sync 1, 256                   (a named barrier, nobody else)
 *   sum-producer   288 threads, bar.sync 1, 256 among the first 256; the ninth warp
 *                  waits at bar.sync 2, 288 for the end (the megakernel's layout)
 *
 * The weight buffer (the megakernel's producer and consumers): 4 KB pieces
 * of a 64 KB global array into a 16 KB shared buffer by cp.async.bulk, each
 * piece completing on an mbarrier; 256 consumer threads sum the buffer.
 *   copy-direct    thread 0 issues the copy, every thread waits on its
 *                  mbarrier, __syncthreads before the next copy         (the first megakernel)
 *   copy-named     the ninth warp's lane 0 issues and waits on the mbarrier,
 *                  then arrives at named barrier 6 (288: "full"), the consumers
 *                  wait there, read, and arrive at named barrier 8 ("empty"),
 *                  which the ninth warp waits at before the next copy (the
 *                  megakernel until the mbarrier hand-over)
 *   copy-named-early  the same, the consumers sleeping ~4 us before "full", so
 *                  that the producer's arrival comes first and it waits at
 *                  "empty" while "full" is still open (the megakernel's order)
 *   copy-named-late   the same, the producer sleeping ~4 us before "empty", so
 *                  that the consumers' block sum runs while "empty" is open
 *   copy-mbar      the hand-over by mbarriers (the megakernel now): lane 0 of
 *                  the ninth warp arrives at a "full" mbarrier once the copy
 *                  has landed, every consumer waits on it, reads, and arrives
 *                  at an "empty" mbarrier of 256 arrivals that lane 0 waits on
 *                  before the next copy; both sides sleep as in the two above
 */
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/mbarrier.cuh"

#define CK(x)                                                                  \
    do {                                                                       \
        cudaError_t e_ = (x);                                                  \
        if (e_ != cudaSuccess) {                                               \
            printf("%s: %s\n", #x, cudaGetErrorString(e_));                    \
            exit(1);                                                           \
        }                                                                      \
    } while (0)

constexpr int ROUNDS = 64, CONSUMERS = 256, THREADS = CONSUMERS + 32;
constexpr int PIECE = 4096, BUF = 16384, SRC = 65536;

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

template <int MODE>  // 0 __syncthreads, 1 bar.sync 1, 256
__device__ __forceinline__ void consumers_sync() {
    if (MODE == 0) __syncthreads();
    else asm volatile("bar.sync 1, 256;" ::: "memory");
}

// out[r] = the block sum of round r's values (thread t's value: t + r).
template <int MODE>
__global__ void sum_kernel(float *out) {
    __shared__ float partial[8];
    if (threadIdx.x >= CONSUMERS) {  // sum-producer: the ninth warp waits for the end
        asm volatile("bar.sync 2, %0;" ::"n"(THREADS) : "memory");
        return;
    }
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    for (int r = 0; r < ROUNDS; r++) {
        float v = warp_sum((float)(threadIdx.x + r));
        if (lane == 0) partial[warp] = v;
        consumers_sync<MODE>();
        v = lane < 8 ? partial[lane] : 0.0f;
        v = warp_sum(v);
        consumers_sync<MODE>();
        if (threadIdx.x == 0) out[r] = v;
    }
    if (blockDim.x == THREADS) asm volatile("bar.sync 2, %0;" ::"n"(THREADS) : "memory");
}

using namespace mv_mbar;

// The megakernel's copy: expect the bytes, then issue the bulk copy.
__device__ __forceinline__ void mbar_copy(void *dst, const void *src, unsigned bytes, uint64_t *bar) {
    mbar_expect(bar, bytes);
    bulk_copy(dst, src, bytes, bar);
}

// About `ns` nanoseconds of doing nothing (the early / late variants).
__device__ __forceinline__ void doze(unsigned ns) {
    for (unsigned t = 0; t < ns; t += 1000) __nanosleep(1000);
}

enum { COPY_DIRECT, COPY_NAMED, COPY_NAMED_EARLY, COPY_NAMED_LATE, COPY_MBAR };

// The sum of the source's floats, one piece of it a round (round r: piece
// r % (SRC / PIECE) into slot r % (BUF / PIECE) of the buffer): out[r].
template <int MODE>
__global__ void copy_kernel(const float *src, float *out) {
    __shared__ __align__(128) float buf[BUF / 4];
    __shared__ uint64_t bar, full, empty;
    __shared__ float partial[8];
    if (threadIdx.x == 0) {
        mbar_init(&bar);
        mbar_init(&full);
        mbar_init(&empty, CONSUMERS);
    }
    __syncthreads();
    const int pieces = SRC / PIECE, slots = BUF / PIECE, n = PIECE / 4;
    const bool named = MODE == COPY_NAMED || MODE == COPY_NAMED_EARLY || MODE == COPY_NAMED_LATE;
    const bool late = MODE == COPY_NAMED_LATE || MODE == COPY_MBAR;
    const bool early = MODE == COPY_NAMED_EARLY || MODE == COPY_MBAR;
    if (MODE != COPY_DIRECT && threadIdx.x >= CONSUMERS) {  // the producer warp
        if constexpr (MODE == COPY_MBAR) {  // lane 0 alone
            if (threadIdx.x != CONSUMERS) return;
            for (int r = 0; r < ROUNDS; r++) {
                if (r > 0) {
                    doze(4000);
                    mbar_wait(&empty, (unsigned)(r - 1) & 1u);
                }
                mbar_copy(buf + (r % slots) * n, src + (size_t)(r % pieces) * n, PIECE, &bar);
                mbar_wait(&bar, (unsigned)r & 1u);
                mbar_arrive(&full);
            }
            return;
        } else {
            for (int r = 0; r < ROUNDS; r++) {
                if (r > 0) {
                    if (late) doze(4000);
                    asm volatile("bar.sync 8, %0;" ::"n"(THREADS) : "memory");  // empty
                }
                if (threadIdx.x == CONSUMERS) {
                    mbar_copy(buf + (r % slots) * n, src + (size_t)(r % pieces) * n, PIECE, &bar);
                    mbar_wait(&bar, (unsigned)r & 1u);
                }
                __syncwarp();
                asm volatile("bar.arrive 6, %0;" ::"n"(THREADS) : "memory");  // full
            }
            asm volatile("bar.sync 8, %0;" ::"n"(THREADS) : "memory");  // the last release
            return;
        }
    }
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    for (int r = 0; r < ROUNDS; r++) {
        if (early) doze(4000);
        if (MODE == COPY_DIRECT) {
            if (threadIdx.x == 0) mbar_copy(buf + (r % slots) * n, src + (size_t)(r % pieces) * n, PIECE, &bar);
            mbar_wait(&bar, (unsigned)r & 1u);
        } else if (MODE == COPY_MBAR) {
            mbar_wait(&full, (unsigned)r & 1u);
        } else {
            asm volatile("bar.sync 6, %0;" ::"n"(THREADS) : "memory");  // full
        }
        const float *p = buf + (r % slots) * n;
        float v = 0.0f;
        for (int i = threadIdx.x; i < n; i += CONSUMERS) v += p[i];
        if (named) asm volatile("bar.arrive 8, %0;" ::"n"(THREADS) : "memory");  // empty: reads done
        if (MODE == COPY_MBAR) mbar_arrive(&empty);
        v = warp_sum(v);
        if (lane == 0) partial[warp] = v;
        consumers_sync<MODE == COPY_DIRECT ? 0 : 1>();
        v = lane < 8 ? partial[lane] : 0.0f;
        v = warp_sum(v);
        if (threadIdx.x == 0) out[r] = v;
        if (MODE == COPY_DIRECT) __syncthreads();  // every read done before thread 0 refills
        else asm volatile("bar.sync 1, 256;" ::: "memory");  // partial[] free again
    }
}

int main(int argc, char **argv) {
    const char *v = argc > 1 ? argv[1] : "";
    const char *names[] = {"sum-sync",         "sum-named",       "sum-producer", "copy-direct", "copy-named",
                           "copy-named-early", "copy-named-late", "copy-mbar"};
    const int n_names = (int)(sizeof names / sizeof *names);
    int k = -1;
    for (int i = 0; i < n_names; i++)
        if (!strcmp(v, names[i])) k = i;
    if (k < 0) {
        fprintf(stderr, "usage: %s VARIANT, one of:", argv[0]);
        for (int i = 0; i < n_names; i++) fprintf(stderr, " %s", names[i]);
        fprintf(stderr, "\n");
        return 2;
    }
    int dev = 0, major = 0;
    CK(cudaGetDevice(&dev));
    CK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    if (k >= 3 && major < 9) {
        fprintf(stderr, "%s: the bulk copies need compute capability 9.0 (this GPU: %d.x)\n", v, major);
        return 2;
    }
    float *d_out = NULL, *d_src = NULL;
    CK(cudaMalloc(&d_out, ROUNDS * sizeof(float)));
    CK(cudaMalloc(&d_src, SRC));
    float h_src[SRC / 4];
    for (int i = 0; i < SRC / 4; i++) h_src[i] = (float)(i % 97);  // small integers: every sum exact in fp32
    CK(cudaMemcpy(d_src, h_src, SRC, cudaMemcpyHostToDevice));
    switch (k) {
    case 0: sum_kernel<0><<<1, CONSUMERS>>>(d_out); break;
    case 1: sum_kernel<1><<<1, CONSUMERS>>>(d_out); break;
    case 2: sum_kernel<1><<<1, THREADS>>>(d_out); break;
    case 3: copy_kernel<COPY_DIRECT><<<1, CONSUMERS>>>(d_src, d_out); break;
    case 4: copy_kernel<COPY_NAMED><<<1, THREADS>>>(d_src, d_out); break;
    case 5: copy_kernel<COPY_NAMED_EARLY><<<1, THREADS>>>(d_src, d_out); break;
    case 6: copy_kernel<COPY_NAMED_LATE><<<1, THREADS>>>(d_src, d_out); break;
    default: copy_kernel<COPY_MBAR><<<1, THREADS>>>(d_src, d_out); break;
    }
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    float h_out[ROUNDS];
    CK(cudaMemcpy(h_out, d_out, sizeof h_out, cudaMemcpyDeviceToHost));
    int bad = 0;
    for (int r = 0; r < ROUNDS; r++) {
        double want = 0;
        if (k < 3)
            for (int t = 0; t < CONSUMERS; t++) want += t + r;
        else
            for (int i = 0; i < PIECE / 4; i++) want += h_src[(r % (SRC / PIECE)) * (PIECE / 4) + i];
        if (h_out[r] != (float)want) {
            if (bad++ < 3) printf("%s: round %d: %.1f, expected %.1f\n", v, r, h_out[r], want);
        }
    }
    printf("%s: %d rounds, %s\n", v, ROUNDS, bad ? "WRONG SUMS" : "sums right");
    CK(cudaFree(d_out));
    CK(cudaFree(d_src));
    return bad ? 1 : 0;
}

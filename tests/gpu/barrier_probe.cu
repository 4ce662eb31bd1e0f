/*
 * tests/gpu/barrier_probe.cu - what a grid-wide barrier costs inside one
 * persistent kernel, and whether a weight read across such a barrier
 * streams faster than the same read as kernels of its own.
 *
 *   nvcc -I. -O3 -std=c++17 -gencode=arch=compute_90,code=sm_90 tests/gpu/barrier_probe.cu \
 *        build/lib/libmv_core.a -o build/barrier_probe && ./build/barrier_probe
 *
 * The question behind it: a decode step is ~290 dependent kernels, each at
 * least ~1.6 us on the critical path (tests/gpu/pdl_probe.cu). A persistent
 * kernel replaces each boundary with a barrier of all its blocks. That pays
 * only if the barrier is cheaper than a boundary, and if the loads of the
 * next phase's weights, issued before the barrier, keep the memory busy
 * while the blocks wait. Three measurements (median of 5 timings, each of
 * a cooperative launch captured in a CUDA graph as the engine replays its
 * decode steps):
 *   barrier  R = 2000 barriers, nothing else: time per barrier, with 1, 2
 *            and 4 blocks of 128 threads per SM
 *   phases   16 reads of 8 MiB (qkv_proj's size), each its own buffer, a
 *            barrier between reads; with and without the next read's
 *            first loads issued before the barrier
 */
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <algorithm>
#include <vector>

#include "kernels/grid_barrier.cuh"

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { printf("%s: %s\n", #x, cudaGetErrorString(e_)); exit(1); } } while (0)

__global__ void barrier_kernel(unsigned *count, int rounds) {
    grid_barrier_t bar = grid_barrier_make(count);
    for (int i = 0; i < rounds; i++) grid_barrier_sync(&bar);
}

// 16 reads of `bytes` each; between reads, a barrier. PRE: loads of the
// next buffer issued before the barrier (U 16-byte loads a thread).
template <int U, bool PRE>
__global__ void phases_kernel(const uint4 *const *bufs, long long n, int nbuf, unsigned *count, unsigned *out) {
    grid_barrier_t bar = grid_barrier_make(count);
    const long long g = (long long)blockIdx.x * blockDim.x + threadIdx.x, G = (long long)gridDim.x * blockDim.x;
    unsigned acc = 0;
    uint4 v[U];
    if (PRE) {
#pragma unroll
        for (int u = 0; u < U; u++) v[u] = g + u * G < n ? __ldg(bufs[0] + g + u * G) : make_uint4(0, 0, 0, 0);
    }
    for (int b = 0; b < nbuf; b++) {
        const uint4 *p = bufs[b];
        long long i = g;
        if (!PRE) {
#pragma unroll
            for (int u = 0; u < U; u++) v[u] = i + u * G < n ? __ldg(p + i + u * G) : make_uint4(0, 0, 0, 0);
        }
        for (;;) {
#pragma unroll
            for (int u = 0; u < U; u++) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
            i += U * G;
            if (i >= n) break;
#pragma unroll
            for (int u = 0; u < U; u++) v[u] = i + u * G < n ? __ldg(p + i + u * G) : make_uint4(0, 0, 0, 0);
        }
        if (PRE && b + 1 < nbuf) {
#pragma unroll
            for (int u = 0; u < U; u++) v[u] = g + u * G < n ? __ldg(bufs[b + 1] + g + u * G) : make_uint4(0, 0, 0, 0);
        }
        grid_barrier_sync(&bar);
    }
    if (acc == 0x12345678u) out[blockIdx.x] = acc;
}

template <typename F>
static double time_graph(cudaStream_t s, F enqueue, double per) {
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    enqueue();
    CK(cudaStreamEndCapture(s, &g));
    CK(cudaGraphInstantiate(&ge, g, 0));
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    std::vector<double> t;
    for (int k = 0; k < 6; k++) {
        CK(cudaEventRecord(a, s));
        for (int r = 0; r < 10; r++) CK(cudaGraphLaunch(ge, s));
        CK(cudaEventRecord(b, s));
        CK(cudaEventSynchronize(b));
        float ms;
        CK(cudaEventElapsedTime(&ms, a, b));
        if (k) t.push_back(ms * 1e3 / 10 / per);
    }
    std::sort(t.begin(), t.end());
    CK(cudaGraphExecDestroy(ge));
    CK(cudaGraphDestroy(g));
    return t[t.size() / 2];
}

static void launch_coop(const void *fn, int blocks, int threads, void **args, cudaStream_t s) {
    CK(cudaLaunchCooperativeKernel(fn, dim3(blocks), dim3(threads), args, 0, s));
}

int main(void) {
    int sms = 0;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    unsigned *count, *out;
    CK(cudaMalloc(&count, sizeof(unsigned)));
    CK(cudaMalloc(&out, 1 << 20));
    int rounds = 2000;
    for (int per_sm : {1, 2, 4}) {
        int blocks = per_sm * sms;
        void *args[] = {&count, &rounds};
        double us = time_graph(s, [&] {
            CK(cudaMemsetAsync(count, 0, sizeof(unsigned), s));
            launch_coop((const void *)barrier_kernel, blocks, 128, args, s);
        }, rounds);
        printf("barrier: %d blocks (%d per SM) x 128 threads: %.3f us per barrier\n", blocks, per_sm, us);
    }
    const int NBUF = 16;
    const long long bytes = 8LL << 20, n = bytes / 16;
    std::vector<uint4 *> w(NBUF);
    for (auto &p : w) { CK(cudaMalloc(&p, bytes)); CK(cudaMemset(p, 1, bytes)); }
    const uint4 **d_bufs;
    CK(cudaMalloc(&d_bufs, sizeof(uint4 *) * NBUF));
    CK(cudaMemcpy(d_bufs, w.data(), sizeof(uint4 *) * NBUF, cudaMemcpyHostToDevice));
    int nbuf = NBUF;
    long long nn = n;
    for (int per_sm : {1, 2, 4}) {
        for (int pre = 0; pre <= 1; pre++) {
            int blocks = per_sm * sms;
            void *args[] = {&d_bufs, &nn, &nbuf, &count, &out};
            const void *fn = pre ? (const void *)phases_kernel<8, true> : (const void *)phases_kernel<8, false>;
            double us = time_graph(s, [&] {
                CK(cudaMemsetAsync(count, 0, sizeof(unsigned), s));
                launch_coop(fn, blocks, 128, args, s);
            }, NBUF);
            printf("phases: 8 MiB a phase, %d blocks x 128 threads, next loads before the barrier %s: "
                   "%.2f us a phase (%.0f GB/s)\n", blocks, pre ? "yes" : "no ", us, bytes / us / 1e3);
        }
    }
    printf("captured cooperative launches in a graph: ok\n");
    return 0;
}

/*
 * tests/gpu/pdl_probe.cu - what programmatic dependent launch changes for the
 * decode step's kernels, measured in CUDA graphs as the engine replays them.
 *
 *   nvcc -I. -O3 -std=c++17 -gencode=arch=compute_90,code=sm_90 tests/gpu/pdl_probe.cu \
 *        build/lib/libmv_core.a -lcublas -lnccl -o build/pdl_probe && ./build/pdl_probe
 *
 * Three measurements, each in CUDA graphs as the engine replays its decode
 * steps (median of 5 timings of 20 replays):
 *   overlap  two small kernels launched with PDL: how early the second one
 *            starts against the first one's end (in a stream and in a graph)
 *   read     a plain read of 8 MiB (8 loads of 16 bytes per thread issued
 *            before any is used, as the GEMV does), 16 kernels back to back:
 *            what one kernel of that size can reach at all
 *   gemv16   16 GEMVs of one Qwen3-0.6B projection (M = 1), each over its
 *            own copy of the weight; norm16: 16 x (fused add + RMSNorm, then
 *            the GEMV)
 * each with PDL off and on; time per kernel (per pair for norm16) and % of
 * a 4.2 TB/s copy bandwidth for the weights.
 */
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <algorithm>
#include <vector>

#include "kernels/common.cuh"
#include "kernels/linear.h"
#include "kernels/pdl.h"
#include "kernels/rmsnorm.h"

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { printf("%s: %s\n", #x, cudaGetErrorString(e_)); exit(1); } } while (0)
#define MV(x) do { if (x) { printf("%s failed\n", #x); exit(1); } } while (0)

static const int REPS = 16;

// Overlap detector: A triggers, then spins ~20 us and stamps its end; B
// stamps its start before pdl_wait(). B's start before A's end = overlap.
__device__ __forceinline__ unsigned long long gtime() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
__global__ void probe_a(unsigned long long *t) {
    pdl_launch_dependents();
    pdl_wait();
    const unsigned long long t0 = gtime();
    while (gtime() - t0 < 20000) {
    }
    if (threadIdx.x == 0) t[blockIdx.x] = gtime();
}
__global__ void probe_b(unsigned long long *t) {
    pdl_launch_dependents();
    const unsigned long long t0 = gtime();
    pdl_wait();
    if (threadIdx.x == 0) t[64 + blockIdx.x] = t0;
}
// The ceiling for one of these kernels: a plain read of the same bytes, U
// 16-byte loads per thread issued before any is used (as the GEMV does),
// then a store of one word per block.
template <int U>
__global__ void read_kernel(const uint4 *p, long long n, unsigned *out) {
    pdl_launch_dependents();
    const long long i0 = (long long)blockIdx.x * blockDim.x * U + threadIdx.x;
    uint4 v[U];
#pragma unroll
    for (int u = 0; u < U; u++) {
        const long long i = i0 + (long long)u * blockDim.x;
        v[u] = i < n ? __ldg(p + i) : make_uint4(0, 0, 0, 0);
    }
    pdl_wait();
    unsigned acc = 0;
#pragma unroll
    for (int u = 0; u < U; u++) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
    if (acc == 0x12345678u) out[blockIdx.x] = acc;
}

static void time_reads(cudaStream_t s) {
    const long long bytes = 8LL << 20, n = bytes / 16;
    std::vector<uint4 *> w(REPS);
    for (auto &p : w) { CK(cudaMalloc(&p, bytes)); CK(cudaMemset(p, 1, bytes)); }
    unsigned *out;
    CK(cudaMalloc(&out, 1 << 20));
    for (int threads : {128, 256, 512}) {
        for (int pdl = 0; pdl <= 1; pdl++) {
            MV(mv_pdl_set(pdl));
            cudaGraph_t g;
            cudaGraphExec_t ge;
            CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
            const long long blocks = (n + threads * 8 - 1) / (threads * 8);
            for (int i = 0; i < REPS; i++) CK(mv_launch(read_kernel<8>, dim3((unsigned)blocks), dim3(threads), 0, s, (const uint4 *)w[i], n, out));
            CK(cudaStreamEndCapture(s, &g));
            MV(mv_pdl_set(0));
            CK(cudaGraphInstantiate(&ge, g, 0));
            cudaEvent_t a, b;
            CK(cudaEventCreate(&a)); CK(cudaEventCreate(&b));
            std::vector<double> t;
            for (int k = 0; k < 6; k++) {
                CK(cudaEventRecord(a, s));
                for (int r = 0; r < 20; r++) CK(cudaGraphLaunch(ge, s));
                CK(cudaEventRecord(b, s));
                CK(cudaEventSynchronize(b));
                float ms; CK(cudaEventElapsedTime(&ms, a, b));
                if (k) t.push_back(ms * 1e3 / 20 / REPS);
            }
            std::sort(t.begin(), t.end());
            printf("read 8 MiB, %d threads x 8 loads, PDL %s: %.2f us per kernel (%.0f GB/s)\n", threads, pdl ? "on " : "off",
                   t[2], bytes / t[2] / 1e3);
        }
    }
    for (auto &p : w) CK(cudaFree(p));
    CK(cudaFree(out));
}

static void overlap(cudaStream_t s, int graph) {
    unsigned long long *d, h[128];
    CK(cudaMalloc(&d, sizeof h));
    MV(mv_pdl_set(1));
    cudaGraph_t g;
    cudaGraphExec_t ge;
    if (graph) CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    CK(mv_launch(probe_a, dim3(8), dim3(32), 0, s, d));
    CK(mv_launch(probe_b, dim3(8), dim3(32), 0, s, d));
    if (graph) {
        CK(cudaStreamEndCapture(s, &g));
        CK(cudaGraphInstantiate(&ge, g, 0));
        CK(cudaGraphLaunch(ge, s));
    }
    MV(mv_pdl_set(0));
    CK(cudaStreamSynchronize(s));
    CK(cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost));
    unsigned long long a_end = 0, b_start = ~0ull;
    for (int i = 0; i < 8; i++) { a_end = std::max(a_end, h[i]); b_start = std::min(b_start, h[64 + i]); }
    printf("overlap probe (%s): B started %+.1f us after A ended (negative: PDL overlapped)\n",
           graph ? "graph" : "stream", ((double)b_start - (double)a_end) / 1e3);
    CK(cudaFree(d));
}

struct chain {
    int N, K, with_norm;
    bf16_t *w[REPS], *x, *y, *res, *nw;
};

static cublasHandle_t handle;

static void enqueue(chain &c, cudaStream_t s) {
    for (int i = 0; i < REPS; i++) {
        if (c.with_norm) MV(fused_add_rmsnorm_cuda(RMSNORM_FAST, c.x, c.res, c.y, c.nw, 1, c.K, 1e-6f, s));
        MV(linear_cuda(handle, c.y, c.x, c.w[i], NULL, 1, c.N, c.K, s));
    }
}

static double time_graph(chain &c, int pdl, cudaStream_t s) {
    MV(mv_pdl_set(pdl));
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    enqueue(c, s);
    CK(cudaStreamEndCapture(s, &g));
    MV(mv_pdl_set(0));
    CK(cudaGraphInstantiate(&ge, g, 0));
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    std::vector<double> t;
    for (int k = 0; k < 6; k++) {
        CK(cudaEventRecord(a, s));
        for (int r = 0; r < 20; r++) CK(cudaGraphLaunch(ge, s));
        CK(cudaEventRecord(b, s));
        CK(cudaEventSynchronize(b));
        float ms;
        CK(cudaEventElapsedTime(&ms, a, b));
        if (k) t.push_back(ms * 1e3 / 20 / REPS);
    }
    std::sort(t.begin(), t.end());
    CK(cudaGraphExecDestroy(ge));
    CK(cudaGraphDestroy(g));
    return t[t.size() / 2];
}

int main(void) {
    if (!mv_pdl_supported()) { printf("no PDL on this GPU\n"); return 1; }
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    overlap(s, 0);
    overlap(s, 1);
    time_reads(s);
    const struct { const char *name; int N, K; } shapes[] = {
        {"qkv_proj", 4096, 1024}, {"o_proj", 1024, 2048}, {"gate_up", 6144, 1024}, {"down", 1024, 3072}};
    const double copy_gbs = 4200.0;  // for the % column only; chapter 01 measures the real one
    int l2 = 0;
    CK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, 0));
    printf("L2 %d MiB\n", l2 >> 20);
    if (cublasCreate(&handle) != CUBLAS_STATUS_SUCCESS) return 1;
    printf("%-10s %-6s %10s %10s %8s %8s\n", "shape", "chain", "off us", "PDL us", "off %", "PDL %");
    for (auto &sh : shapes) {
        for (int with_norm = 0; with_norm <= 1; with_norm++) {
            if (with_norm && sh.K != 1024) continue;
            chain c = {sh.N, sh.K, with_norm, {}, NULL, NULL, NULL, NULL};
            for (int i = 0; i < REPS; i++) {
                CK(cudaMalloc(&c.w[i], (size_t)sh.N * sh.K * 2));
                CK(cudaMemset(c.w[i], 0x3c, (size_t)sh.N * sh.K * 2));
            }
            const int big = sh.N > sh.K ? sh.N : sh.K;
            CK(cudaMalloc(&c.x, (size_t)big * 2));
            CK(cudaMalloc(&c.y, (size_t)big * 2));
            CK(cudaMalloc(&c.res, (size_t)big * 2));
            CK(cudaMalloc(&c.nw, (size_t)big * 2));
            CK(cudaMemset(c.x, 0x3c, (size_t)big * 2));
            CK(cudaMemset(c.y, 0, (size_t)big * 2));
            CK(cudaMemset(c.res, 0x3c, (size_t)big * 2));
            CK(cudaMemset(c.nw, 0x3c, (size_t)big * 2));
            enqueue(c, s);
            CK(cudaStreamSynchronize(s));
            const double off = time_graph(c, 0, s), on = time_graph(c, 1, s);
            const double mb = (double)sh.N * sh.K * 2 / 1e6;
            printf("%-10s %-6s %10.2f %10.2f %8.1f %8.1f\n", sh.name, with_norm ? "norm16" : "gemv16", off, on,
                   mb / off * 1e3 / copy_gbs * 100, mb / on * 1e3 / copy_gbs * 100);
            for (int i = 0; i < REPS; i++) CK(cudaFree(c.w[i]));
            CK(cudaFree(c.x)); CK(cudaFree(c.y)); CK(cudaFree(c.res)); CK(cudaFree(c.nw));
        }
    }
    return 0;
}

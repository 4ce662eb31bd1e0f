/*
 * tests/gpu/read_probe.cu - how fast can a kernel only read HBM? The ceiling
 * that decode attention (chapter 07) reads against, beside chapter 01's copy.
 *
 * Chapter 01's copy bandwidth counts a device-to-device cudaMemcpy's reads and
 * writes. Decode attention only reads (the KV cache; its output is 1/1000 of
 * its input), and a stream of reads alone can run faster than a copy: no
 * write traffic shares the bus. This probe reads 2 GiB (40 times the H100's and
 * H200's 50 MB L2) with 16-byte loads, grid-stride, U loads in flight per
 * thread before any is used, over a sweep of threads per block, blocks per SM
 * and U, and reports the best and every point, with the copy measured the
 * way chapter 01 does in the same process.
 *
 * Layout variant "kv": the loads of decode attention's CTAs. The buffer is
 * a KV cache of 8 kv heads x 128 dims in bf16 (2 KB a token row); CTA b reads
 * kv head b % 8's 256-byte slice of each row of its own run of tokens, so
 * every load is one of the 256-byte pieces 2 KB apart that attention reads.
 *
 * Build and run on the GPU machine (the lab's device tool), from the root:
 *   nvcc -O3 -arch=sm_90 -o build/read_probe tests/gpu/read_probe.cu
 *   ./build/read_probe [--json FILE]
 */
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <algorithm>
#include <vector>

#define CK(x)                                                                                      \
    do {                                                                                           \
        cudaError_t e_ = (x);                                                                      \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "read_probe: %s failed: %s (line %d)\n", #x, cudaGetErrorString(e_), __LINE__); \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

// Linear: thread t reads vectors t, t + stride, ... U at a time.
template <int U>
__global__ void read_linear(const uint4 *__restrict__ p, long long n, unsigned *sink) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    unsigned acc = 0;
    for (; i + (U - 1) * stride < n; i += U * stride) {
        uint4 v[U];
#pragma unroll
        for (int u = 0; u < U; u++) v[u] = __ldg(p + i + u * stride);
#pragma unroll
        for (int u = 0; u < U; u++) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
    }
    for (; i < n; i += stride) {
        const uint4 v = __ldg(p + i);
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (acc == 0x9e3779b9u) *sink = acc;  // never true for the zero-filled buffer: keeps the loads
}

// KV layout: rows of 2 KB (8 heads x 256 B = 16 vectors each). CTA b takes head
// b % 8 and rows [r0, r0 + rows_per) with r0 = (b / 8) * rows_per; its threads read
// the head's 16 vectors of U rows at a time: 16 lanes a row, blockDim / 16 rows a load.
template <int U>
__global__ void read_kv(const uint4 *__restrict__ p, long long rows_per, unsigned *sink) {
    const int head = blockIdx.x % 8;
    const long long r0 = (long long)(blockIdx.x / 8) * rows_per;
    const int part = threadIdx.x % 16, rsub = threadIdx.x / 16, rstep = blockDim.x / 16;
    unsigned acc = 0;
    for (long long r = rsub; r < rows_per; r += (long long)U * rstep) {
        uint4 v[U];
#pragma unroll
        for (int u = 0; u < U; u++) {
            const long long row = r + (long long)u * rstep;
            v[u] = row < rows_per ? __ldg(p + (r0 + row) * 128 + head * 16 + part) : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int u = 0; u < U; u++) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
    }
    if (acc == 0x9e3779b9u) *sink = acc;
}

struct point {
    const char *layout;
    int threads, blocks_per_sm, U;
    double us, gbs;
};

static float median(std::vector<float> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

template <class F>
static float time_us(F launch, int reps) {
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    launch();  // warm-up
    CK(cudaDeviceSynchronize());
    std::vector<float> t;
    for (int r = 0; r < reps; r++) {
        CK(cudaEventRecord(a));
        launch();
        CK(cudaEventRecord(b));
        CK(cudaEventSynchronize(b));
        float ms;
        CK(cudaEventElapsedTime(&ms, a, b));
        t.push_back(ms * 1000.0f);
    }
    CK(cudaGetLastError());
    CK(cudaEventDestroy(a));
    CK(cudaEventDestroy(b));
    return median(t);
}

template <int U>
static float run_linear(const uint4 *p, long long n, unsigned *sink, int blocks, int threads) {
    return time_us([&] { read_linear<U><<<blocks, threads>>>(p, n, sink); }, 9);
}
template <int U>
static float run_kv(const uint4 *p, long long rows_per, unsigned *sink, int blocks, int threads) {
    return time_us([&] { read_kv<U><<<blocks, threads>>>(p, rows_per, sink); }, 9);
}

int main(int argc, char **argv) {
    const char *json = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json") && i + 1 < argc) json = argv[++i];
        else {
            fprintf(stderr, "usage: %s [--json FILE]\n", argv[0]);
            return 2;
        }
    }
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    const int sms = prop.multiProcessorCount;
    const size_t bytes = (size_t)2 << 30;
    uint4 *buf, *dst;
    unsigned *sink;
    CK(cudaMalloc(&buf, bytes));
    CK(cudaMalloc(&dst, bytes / 2));
    CK(cudaMalloc(&sink, 4));
    CK(cudaMemset(buf, 0, bytes));
    CK(cudaMemset(dst, 0, bytes / 2));
    const long long n = (long long)(bytes / 16);

    // Chapter 01's copy: 1 GiB device to device, reads and writes counted.
    const float copy_us = time_us([&] { CK(cudaMemcpyAsync(dst, buf, bytes / 2, cudaMemcpyDeviceToDevice)); }, 9);
    const double copy_gbs = (double)bytes / (copy_us * 1e3);
    printf("%s, %d SMs: copy of 1 GiB %.1f us, %.0f GB/s (reads + writes)\n", prop.name, sms, copy_us, copy_gbs);

    std::vector<point> pts;
    const int threads_list[] = {128, 256, 512, 1024};
    const int bpsm_list[] = {1, 2, 4, 8, 16};
    for (int threads : threads_list)
        for (int bpsm : bpsm_list) {
            if (threads * bpsm > 2048) continue;
            const int blocks = sms * bpsm;
            const int Us[] = {1, 2, 4, 8, 16};
            for (int U : Us) {
                float us = U == 1   ? run_linear<1>(buf, n, sink, blocks, threads)
                           : U == 2 ? run_linear<2>(buf, n, sink, blocks, threads)
                           : U == 4 ? run_linear<4>(buf, n, sink, blocks, threads)
                           : U == 8 ? run_linear<8>(buf, n, sink, blocks, threads)
                                    : run_linear<16>(buf, n, sink, blocks, threads);
                pts.push_back({"linear", threads, bpsm, U, us, (double)bytes / (us * 1e3)});
            }
        }
    // KV layout: 2 GiB = 1 Mi rows of 2 KB; 8 heads x (sms * bpsm / 8 * 8 ...) CTAs.
    const long long rows = (long long)(bytes / 2048);
    for (int bpsm : {4, 8, 16}) {
        const int groups = sms * bpsm / 8;  // CTAs per head
        const long long rows_per = rows / groups;
        const double read = (double)rows_per * groups * 2048;
        const int Us[] = {4, 8, 16};
        for (int U : Us) {
            float us = U == 4   ? run_kv<4>(buf, rows_per, sink, groups * 8, 128)
                       : U == 8 ? run_kv<8>(buf, rows_per, sink, groups * 8, 128)
                                : run_kv<16>(buf, rows_per, sink, groups * 8, 128);
            pts.push_back({"kv", 128, bpsm, U, us, read / (us * 1e3)});
        }
    }
    point best = pts[0], best_kv = pts[0];
    best_kv.gbs = 0;
    for (const point &q : pts) {
        if (!strcmp(q.layout, "linear") && q.gbs > best.gbs) best = q;
        if (!strcmp(q.layout, "kv") && q.gbs > best_kv.gbs) best_kv = q;
    }
    printf("%-7s %7s %6s %3s %10s %8s %9s\n", "layout", "threads", "CTA/SM", "U", "us", "GB/s", "% of copy");
    for (const point &q : pts)
        printf("%-7s %7d %6d %3d %10.1f %8.0f %8.1f%%\n", q.layout, q.threads, q.blocks_per_sm, q.U, q.us, q.gbs,
               100.0 * q.gbs / copy_gbs);
    printf("best linear read: %.0f GB/s (%d threads, %d CTAs/SM, U %d) = %.1f%% of the copy's %.0f\n", best.gbs,
           best.threads, best.blocks_per_sm, best.U, 100.0 * best.gbs / copy_gbs, copy_gbs);
    printf("best kv-layout read: %.0f GB/s (%d CTAs/SM, U %d) = %.1f%% of the copy\n", best_kv.gbs,
           best_kv.blocks_per_sm, best_kv.U, 100.0 * best_kv.gbs / copy_gbs);
    if (json) {
        FILE *f = fopen(json, "w");
        if (!f) {
            fprintf(stderr, "read_probe: cannot write %s\n", json);
            return 1;
        }
        fprintf(f, "{\"gpu\": \"%s\", \"sm_count\": %d, \"bytes\": %zu, \"copy_gbs\": %.1f, \"points\": [", prop.name, sms,
                bytes, copy_gbs);
        for (size_t i = 0; i < pts.size(); i++)
            fprintf(f, "%s{\"layout\": \"%s\", \"threads\": %d, \"ctas_per_sm\": %d, \"U\": %d, \"us\": %.2f, \"gbs\": %.1f}",
                    i ? ", " : "", pts[i].layout, pts[i].threads, pts[i].blocks_per_sm, pts[i].U, pts[i].us, pts[i].gbs);
        fprintf(f, "]}\n");
        fclose(f);
    }
    CK(cudaFree(buf));
    CK(cudaFree(dst));
    CK(cudaFree(sink));
    return 0;
}

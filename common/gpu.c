/* common/gpu.c - device probe, buffers, timing and ceilings (see gpu.h). */
#include "common/gpu.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/check.h"
#include "common/compare.h"
#include "common/rng.h"

#if !MV_HAVE_CUDA

int gpu_probe(gpu_info_t *info, int device) {
    memset(info, 0, sizeof *info);
    info->device = device;
    snprintf(info->why_not, sizeof info->why_not,
             "this build has no CUDA code (nvcc was not found at build time)");
    return -1;
}

#else
#include <cublas_v2.h>
#include <cuda_runtime.h>

int gpu_probe(gpu_info_t *info, int device) {
    memset(info, 0, sizeof *info);
    info->device = device;
    cudaError_t err = cudaGetDeviceCount(&info->device_count);
    if (err != cudaSuccess || info->device_count == 0) {
        snprintf(info->why_not, sizeof info->why_not, "no CUDA device (%s)",
                 err == cudaSuccess ? "device count is 0" : cudaGetErrorName(err));
        (void)cudaGetLastError();  // clear the sticky-free error so later checks start clean
        return -1;
    }
    if (device < 0 || device >= info->device_count) {
        snprintf(info->why_not, sizeof info->why_not, "device %d does not exist (%d visible)",
                 device, info->device_count);
        return -1;
    }
    struct cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
    CUDA_CHECK(cudaSetDevice(device));
    snprintf(info->name, sizeof info->name, "%s", prop.name);
    info->sm_count = prop.multiProcessorCount;
    info->cc_major = prop.major;
    info->cc_minor = prop.minor;
    info->l2_bytes = (size_t)prop.l2CacheSize;
    info->mem_bytes = prop.totalGlobalMem;
    int drv = 0, rt = 0;
    cudaDriverGetVersion(&drv);
    cudaRuntimeGetVersion(&rt);
    snprintf(info->driver, sizeof info->driver, "%d.%d", drv / 1000, (drv % 1000) / 10);
    snprintf(info->runtime, sizeof info->runtime, "%d.%d", rt / 1000, (rt % 1000) / 10);
    info->available = 1;
    return 0;
}

void *gpu_alloc(size_t bytes) {
    void *p = NULL;
    if (bytes == 0) bytes = 1;  // keep a valid, distinct pointer for empty tensors
    cudaError_t err = cudaMalloc(&p, bytes);
    if (err != cudaSuccess) {
        char what[256];
        snprintf(what, sizeof what, "%s while allocating %zu bytes", cudaGetErrorName(err), bytes);
        mv_die_at(__FILE__, __LINE__, "cudaMalloc", what);
    }
    return p;
}

void gpu_free(void *p) {
    if (p) CUDA_CHECK(cudaFree(p));
}

void gpu_upload(void *d_dst, const void *h_src, size_t bytes) {
    if (bytes) CUDA_CHECK(cudaMemcpy(d_dst, h_src, bytes, cudaMemcpyHostToDevice));
}

void gpu_download(void *h_dst, const void *d_src, size_t bytes) {
    if (bytes) CUDA_CHECK(cudaMemcpy(h_dst, d_src, bytes, cudaMemcpyDeviceToHost));
}

void gpu_poison(void *d, size_t bytes) {
    if (bytes) CUDA_CHECK(cudaMemset(d, POISON_BYTE, bytes));
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double gpu_time_ms(gpu_work_fn fn, void *ctx, timing_opts_t opts) {
    cudaStream_t stream;
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    // Flushing: writing twice the L2 size evicts whatever the last run left.
    void *flush = NULL;
    size_t flush_bytes = 0;
    if (opts.flush_l2) {
        int dev, l2;
        CUDA_CHECK(cudaGetDevice(&dev));
        CUDA_CHECK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev));
        flush_bytes = 2 * (size_t)l2;
        flush = gpu_alloc(flush_bytes);
    }
    for (int i = 0; i < opts.warmup; i++) MV_CHECK(fn(ctx, stream));
    CUDA_CHECK(cudaStreamSynchronize(stream));

    cudaEvent_t start, stop;
    CUDA_CHECK(cudaEventCreate(&start));
    CUDA_CHECK(cudaEventCreate(&stop));
    double *ms = malloc(sizeof(double) * (size_t)(opts.reps > 0 ? opts.reps : 1));
    if (!ms) mv_die_at(__FILE__, __LINE__, "malloc", "out of host memory");
    for (int i = 0; i < opts.reps; i++) {
        if (flush) CUDA_CHECK(cudaMemsetAsync(flush, i & 0xff, flush_bytes, stream));
        CUDA_CHECK(cudaEventRecord(start, stream));
        MV_CHECK(fn(ctx, stream));
        CUDA_CHECK(cudaEventRecord(stop, stream));
        CUDA_CHECK(cudaEventSynchronize(stop));
        float t;
        CUDA_CHECK(cudaEventElapsedTime(&t, start, stop));
        ms[i] = t;
    }
    qsort(ms, (size_t)opts.reps, sizeof(double), cmp_double);
    double median = opts.reps > 0 ? ms[opts.reps / 2] : 0.0;
    free(ms);
    CUDA_CHECK(cudaEventDestroy(start));
    CUDA_CHECK(cudaEventDestroy(stop));
    gpu_free(flush);
    CUDA_CHECK(cudaStreamDestroy(stream));
    return median;
}

int gpu_copy2d(void *ctx, cudaStream_t stream) {
    const gpu_copy2d_t *c = ctx;
    return CUDA_TRY(cudaMemcpy2DAsync(c->dst, c->pitch, c->src, c->pitch, c->width, c->height,
                                      cudaMemcpyDeviceToDevice, stream));
}

// ---- ceilings ---------------------------------------------------------------

typedef struct {
    void *dst;
    const void *src;
    size_t bytes;
} copy_ctx_t;

static int copy_work(void *p, cudaStream_t s) {
    copy_ctx_t *c = p;
    return CUDA_TRY(cudaMemcpyAsync(c->dst, c->src, c->bytes, cudaMemcpyDeviceToDevice, s));
}

typedef struct {
    cublasHandle_t handle;
    int n;
    const bf16_t *a, *b;
    bf16_t *c;
} gemm_ctx_t;

static int gemm_work(void *p, cudaStream_t s) {
    gemm_ctx_t *g = p;
    const float alpha = 1.0f, beta = 0.0f;
    if (cublasSetStream(g->handle, s) != CUBLAS_STATUS_SUCCESS) return mv_error("cublasSetStream failed");
    cublasStatus_t st = cublasGemmEx(g->handle, CUBLAS_OP_N, CUBLAS_OP_N, g->n, g->n, g->n, &alpha,
                                     g->a, CUDA_R_16BF, g->n, g->b, CUDA_R_16BF, g->n, &beta, g->c,
                                     CUDA_R_16BF, g->n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    if (st != CUBLAS_STATUS_SUCCESS) return mv_error("cublasGemmEx: %s", cublasGetStatusName(st));
    return 0;
}

void measure_ceilings(ceilings_t *c, int quick) {
    // Copy: 1 GiB each way is far past the 60 MB L2 of an H200, so this
    // measures HBM, not cache. Bytes counted: read + write.
    c->copy_bytes = (size_t)(quick ? 256 : 1024) << 20;
    copy_ctx_t cc = {gpu_alloc(c->copy_bytes), gpu_alloc(c->copy_bytes), c->copy_bytes};
    CUDA_CHECK(cudaMemset(cc.dst, 0x3c, c->copy_bytes));
    CUDA_CHECK(cudaMemset((void *)cc.src, 0x5a, c->copy_bytes));
    double ms = gpu_time_ms(copy_work, &cc, (timing_opts_t){3, quick ? 5 : 20, 0});
    c->copy_gbs = 2.0 * (double)c->copy_bytes / (ms * 1e-3) / 1e9;
    gpu_free(cc.dst);
    gpu_free((void *)cc.src);

    // GEMM: 8192^3 bf16, fp32 accumulation, on random data (zeros run faster
    // than real data and would overstate the ceiling).
    int n = quick ? 4096 : 8192;
    size_t elems = (size_t)n * n;
    bf16_t *h = malloc(elems * sizeof(bf16_t));
    if (!h) mv_die_at(__FILE__, __LINE__, "malloc", "out of host memory");
    rng_t rng;
    rng_seed(&rng, 1234);
    fill_uniform_bf16(&rng, h, elems, -1.0f, 1.0f);
    gemm_ctx_t g = {0};
    g.n = n;
    g.a = gpu_alloc(elems * sizeof(bf16_t));
    g.b = gpu_alloc(elems * sizeof(bf16_t));
    g.c = gpu_alloc(elems * sizeof(bf16_t));
    gpu_upload((void *)g.a, h, elems * sizeof(bf16_t));
    gpu_upload((void *)g.b, h, elems * sizeof(bf16_t));
    free(h);
    CUBLAS_CHECK(cublasCreate(&g.handle));
    ms = gpu_time_ms(gemm_work, &g, (timing_opts_t){3, quick ? 5 : 10, 0});
    c->gemm_n = n;
    c->gemm_tflops = 2.0 * (double)n * n * n / (ms * 1e-3) / 1e12;
    CUBLAS_CHECK(cublasDestroy(g.handle));
    gpu_free((void *)g.a);
    gpu_free((void *)g.b);
    gpu_free(g.c);
}
#endif

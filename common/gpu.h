/*
 * common/gpu.h - the GPU side every chapter shares: finding the device,
 * device buffers, timing, and the two ceilings each kernel is measured
 * against.
 *
 * Timing follows the lab's method: warm up, flush the L2 cache before each
 * timed run (so a kernel is not timed reading data the previous run left in
 * cache), time with CUDA events, and report the median of the repeats.
 *
 * The ceilings are measured at the start of each run, on the GPU at hand:
 *   - copy bandwidth: a large device-to-device cudaMemcpy, counting bytes
 *     read plus bytes written (this is what a memory-bound kernel can hope for);
 *   - bf16 GEMM rate: a large cuBLAS bf16 GEMM with fp32 accumulation.
 *
 * Built without nvcc (MV_HAVE_CUDA 0), gpu_probe() reports that no GPU can
 * be used and says why; nothing else here is declared.
 */
#ifndef MV_GPU_H
#define MV_GPU_H

#include <stddef.h>

#include "common/bf16.h"
#if MV_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    int available;         // 1 when a CUDA device is usable
    char why_not[256];     // when not available: the reason, for the user
    char name[256];        // e.g. "NVIDIA H200"
    int device;            // CUDA device index
    int device_count;      // visible CUDA devices
    int sm_count;          // streaming multiprocessors
    int cc_major, cc_minor;  // compute capability
    size_t l2_bytes;       // L2 cache size
    size_t mem_bytes;      // device memory
    char driver[32];       // driver and runtime versions, e.g. "13.0"
    char runtime[32];
} gpu_info_t;

// Find device `device`. Always fills `info`; returns 0 if usable, else -1
// (with info->why_not set). Never exits: no GPU is a normal condition.
int gpu_probe(gpu_info_t *info, int device);

#if MV_HAVE_CUDA
typedef struct {
    double copy_gbs;      // device-to-device copy, (read + write) bytes / s / 1e9
    double gemm_tflops;   // bf16 GEMM, 2*M*N*K / s / 1e12
    size_t copy_bytes;    // size of the buffer copied
    int gemm_n;           // M = N = K of the GEMM
} ceilings_t;

// Measure both ceilings on the current device (a few hundred ms).
void measure_ceilings(ceilings_t *c, int quick);

// Device buffers: allocate, or die naming the size.
void *gpu_alloc(size_t bytes);
void gpu_free(void *p);
void gpu_upload(void *d_dst, const void *h_src, size_t bytes);
void gpu_download(void *h_dst, const void *d_src, size_t bytes);
// Fill with POISON_BYTE (see compare.h) so unwritten elements are caught.
void gpu_poison(void *d, size_t bytes);

// Work to be timed: enqueue it on `stream`; return 0, or -1 with mv_error().
typedef int (*gpu_work_fn)(void *ctx, cudaStream_t stream);

typedef struct {
    int warmup;    // untimed runs first
    int reps;      // timed runs; the median is reported
    int flush_l2;  // 1: overwrite a buffer twice the L2 size before each run
} timing_opts_t;

// Median time in ms of one run of `fn`. Dies if a run fails.
double gpu_time_ms(gpu_work_fn fn, void *ctx, timing_opts_t opts);

// A device-to-device cudaMemcpy2D as timed work (ctx: gpu_copy2d_t): the
// ceiling of a strided access pattern, e.g. the q/k or k/v columns of
// QKV rows, timed beside a kernel that reads and writes that region.
typedef struct {
    void *dst;
    const void *src;
    size_t pitch, width, height;  // bytes between rows (both sides), bytes per row, rows
} gpu_copy2d_t;
int gpu_copy2d(void *ctx, cudaStream_t stream);
#endif

#ifdef __cplusplus
}
#endif
#endif

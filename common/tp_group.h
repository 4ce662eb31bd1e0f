/*
 * common/tp_group.h - a tensor-parallel group: tp ranks driven from one
 * process, each with its own CUDA stream and cuBLAS handle.
 *
 * Two placements:
 *   real       rank r on GPU r; collectives over NCCL (ncclCommInitAll).
 *              NCCL collectives for several ranks from one thread must sit
 *              between ncclGroupStart() and ncclGroupEnd(); the functions
 *              here do that.
 *   simulated  every rank on GPU 0, for showing tp > 1 arithmetic on one
 *              GPU. The "all-reduce" adds the ranks' buffers with
 *              cublasAxpyEx (bf16 in and out, fp32 math: the same result as
 *              NCCL's bf16 sum of two ranks).
 *
 *   tp_all_reduce_bf16: every rank's buffer becomes the sum over ranks (a
 *                       row-parallel layer after its GEMM).
 *   tp_gather_bf16:     rank 0 receives every rank's buffer in rank order
 *                       (the LM head's vocabulary shards of the logits).
 *
 * NVLink multicast (NVLS) is left to the environment: machines that share
 * GPUs set NCCL_NVLS_ENABLE=0, and nothing here turns it on.
 */
#ifndef MV_TP_GROUP_H
#define MV_TP_GROUP_H

#if MV_HAVE_CUDA
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <stddef.h>
#if MV_HAVE_NCCL
#include <nccl.h>
#endif

#include "common/bf16.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TP_GROUP_MAX 8

typedef struct {
    int size;                              // ranks
    int simulated;                         // 1: all ranks on device 0, no NCCL
    int device[TP_GROUP_MAX];              // rank r's GPU
    cudaStream_t streams[TP_GROUP_MAX];    // rank r's stream, on device[r]
    cublasHandle_t cublas[TP_GROUP_MAX];   // rank r's cuBLAS handle
#if MV_HAVE_NCCL
    ncclComm_t comms[TP_GROUP_MAX];        // rank r's communicator (real only)
#endif
} tp_group_t;

// Real group: ranks 0..size-1 on GPUs 0..size-1 (needs NCCL and size GPUs).
int tp_group_init(tp_group_t *g, int size);
// Simulated group: `size` ranks, all on GPU 0.
int tp_group_init_simulated(tp_group_t *g, int size);
void tp_group_destroy(tp_group_t *g);

// Make rank r's device current (before allocating its buffers).
int tp_set_rank(const tp_group_t *g, int r);
// bufs[r]: rank r's device buffer of `count` bf16, summed in place.
int tp_all_reduce_bf16(tp_group_t *g, bf16_t *const *bufs, size_t count);
// send[r]: rank r's `count` bf16; recv: on rank 0's device, [size, count].
int tp_gather_bf16(tp_group_t *g, const bf16_t *const *send, bf16_t *recv, size_t count);
// Wait for every rank's stream.
int tp_sync(tp_group_t *g);

// The groups a chapter checks its tensor-parallel code on (chapters 03 and
// 04). With two or more GPUs and NCCL: one real group over every visible GPU
// (at most TP_GROUP_MAX). Otherwise two groups on GPU 0, tp = 1 and a
// simulated tp = 2, so the sharded arithmetic is checked on one GPU too.
typedef struct {
    int n;                 // groups in use: 1 (real) or 2 (on GPU 0)
    int real;              // 1: group[0] is the real group, over NCCL
    tp_group_t group[2];
    const char *mode[2];   // each group's name in the check labels: "nccl", "1gpu", "2 shards on 1 gpu"
} tp_check_groups_t;

// device_count: the GPUs visible (gpu_info_t's device_count).
int tp_check_groups_init(tp_check_groups_t *s, int device_count);
void tp_check_groups_destroy(tp_check_groups_t *s);

// Median time in ms of `fn` (work enqueued on every rank, e.g. a
// collective), measured with events on rank 0's stream after all ranks are
// idle; `warmup` untimed runs first. Dies if a run fails.
typedef int (*tp_work_fn)(tp_group_t *g, void *ctx);
double tp_time_ms(tp_group_t *g, tp_work_fn fn, void *ctx, int warmup, int reps);

#ifdef __cplusplus
}
#endif
#endif
#endif

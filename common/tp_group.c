/* common/tp_group.c - tensor-parallel group, real (NCCL) or simulated on one GPU (see tp_group.h). */
#include "common/tp_group.h"

#if MV_HAVE_CUDA
#include <stdlib.h>
#include <string.h>

#include "common/check.h"

static int make_rank(tp_group_t *g, int r, int device) {
    g->device[r] = device;
    if (CUDA_TRY(cudaSetDevice(device)) ||
        CUDA_TRY(cudaStreamCreateWithFlags(&g->streams[r], cudaStreamNonBlocking)))
        return -1;
    if (cublasCreate(&g->cublas[r]) != CUBLAS_STATUS_SUCCESS)
        return mv_error("tp_group: cublasCreate failed on device %d", device);
    return 0;
}

#if MV_HAVE_NCCL
static int nccl_try(ncclResult_t r, const char *what) {
    if (r == ncclSuccess) return 0;
    return mv_error("%s: %s", what, ncclGetErrorString(r));
}
#endif

int tp_group_init(tp_group_t *g, int size) {
    memset(g, 0, sizeof *g);
#if MV_HAVE_NCCL
    int count = 0;
    if (CUDA_TRY(cudaGetDeviceCount(&count))) return -1;
    if (size < 1 || size > TP_GROUP_MAX || size > count)
        return mv_error("tp_group_init: %d ranks asked for, %d GPUs visible (at most %d)", size, count, TP_GROUP_MAX);
    int devs[TP_GROUP_MAX];
    for (int r = 0; r < size; r++) devs[r] = r;
    if (nccl_try(ncclCommInitAll(g->comms, size, devs), "ncclCommInitAll")) return -1;
    g->size = size;
    for (int r = 0; r < size; r++)
        if (make_rank(g, r, r)) return -1;
    return CUDA_TRY(cudaSetDevice(0));
#else
    (void)size;
    return mv_error("tp_group_init: this build has no NCCL (nccl.h was not found at build time)");
#endif
}

int tp_group_init_simulated(tp_group_t *g, int size) {
    memset(g, 0, sizeof *g);
    if (size < 1 || size > TP_GROUP_MAX)
        return mv_error("tp_group_init_simulated: %d ranks (1..%d)", size, TP_GROUP_MAX);
    g->size = size;
    g->simulated = 1;
    for (int r = 0; r < size; r++)
        if (make_rank(g, r, 0)) return -1;
    return 0;
}

void tp_group_destroy(tp_group_t *g) {
    for (int r = 0; r < g->size; r++) {
        cudaSetDevice(g->device[r]);
        cudaStreamSynchronize(g->streams[r]);
        cublasDestroy(g->cublas[r]);
        cudaStreamDestroy(g->streams[r]);
#if MV_HAVE_NCCL
        if (!g->simulated) ncclCommDestroy(g->comms[r]);
#endif
    }
    cudaSetDevice(0);
    g->size = 0;
}

int tp_set_rank(const tp_group_t *g, int r) { return CUDA_TRY(cudaSetDevice(g->device[r])); }

int tp_check_groups_init(tp_check_groups_t *s, int device_count) {
    memset(s, 0, sizeof *s);
    if (device_count >= 2 && MV_HAVE_NCCL) {
        s->n = 1;
        s->real = 1;
        s->mode[0] = "nccl";
        return tp_group_init(&s->group[0], device_count > TP_GROUP_MAX ? TP_GROUP_MAX : device_count);
    }
    s->n = 2;
    s->mode[0] = "1gpu";
    s->mode[1] = "2 shards on 1 gpu";
    return tp_group_init_simulated(&s->group[0], 1) || tp_group_init_simulated(&s->group[1], 2) ? -1 : 0;
}

void tp_check_groups_destroy(tp_check_groups_t *s) {
    for (int i = 0; i < s->n; i++) tp_group_destroy(&s->group[i]);
    s->n = 0;
}

// All ranks on one GPU: rank 0 waits for the others, adds their buffers
// into its own, and the others wait for rank 0 and copy the sum back.
static int simulated_all_reduce(tp_group_t *g, bf16_t *const *bufs, size_t count) {
    cudaEvent_t ev[TP_GROUP_MAX];
    const float one = 1.0f;
    for (int r = 0; r < g->size; r++) {
        if (CUDA_TRY(cudaEventCreateWithFlags(&ev[r], cudaEventDisableTiming)) ||
            CUDA_TRY(cudaEventRecord(ev[r], g->streams[r])))
            return -1;
    }
    for (int r = 1; r < g->size; r++) {
        if (CUDA_TRY(cudaStreamWaitEvent(g->streams[0], ev[r], 0))) return -1;
        if (cublasSetStream(g->cublas[0], g->streams[0]) != CUBLAS_STATUS_SUCCESS ||
            cublasAxpyEx(g->cublas[0], (int)count, &one, CUDA_R_32F, bufs[r], CUDA_R_16BF, 1, bufs[0], CUDA_R_16BF,
                         1, CUDA_R_32F) != CUBLAS_STATUS_SUCCESS)
            return mv_error("tp_all_reduce_bf16 (simulated): cublasAxpyEx failed");
    }
    if (CUDA_TRY(cudaEventRecord(ev[0], g->streams[0]))) return -1;
    for (int r = 1; r < g->size; r++)
        if (CUDA_TRY(cudaStreamWaitEvent(g->streams[r], ev[0], 0)) ||
            CUDA_TRY(cudaMemcpyAsync(bufs[r], bufs[0], count * sizeof(bf16_t), cudaMemcpyDeviceToDevice, g->streams[r])))
            return -1;
    for (int r = 0; r < g->size; r++) cudaEventDestroy(ev[r]);  // released once their work completes
    return 0;
}

int tp_all_reduce_bf16(tp_group_t *g, bf16_t *const *bufs, size_t count) {
    if (count == 0) return 0;
    if (g->simulated) return simulated_all_reduce(g, bufs, count);
#if MV_HAVE_NCCL
    if (nccl_try(ncclGroupStart(), "ncclGroupStart")) return -1;
    for (int r = 0; r < g->size; r++)
        if (nccl_try(ncclAllReduce(bufs[r], bufs[r], count, ncclBfloat16, ncclSum, g->comms[r], g->streams[r]),
                     "ncclAllReduce")) {
            ncclGroupEnd();
            return -1;
        }
    return nccl_try(ncclGroupEnd(), "ncclGroupEnd (all-reduce)");
#else
    return mv_error("tp_all_reduce_bf16: no NCCL in this build");
#endif
}

int tp_gather_bf16(tp_group_t *g, const bf16_t *const *send, bf16_t *recv, size_t count) {
    if (count == 0) return 0;
    if (g->simulated) {
        cudaEvent_t ev;
        for (int r = 0; r < g->size; r++) {
            // rank 0's stream copies each slice once rank r's work is done
            if (CUDA_TRY(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming)) ||
                CUDA_TRY(cudaEventRecord(ev, g->streams[r])) || CUDA_TRY(cudaStreamWaitEvent(g->streams[0], ev, 0)) ||
                CUDA_TRY(cudaMemcpyAsync(recv + (size_t)r * count, send[r], count * sizeof(bf16_t),
                                         cudaMemcpyDeviceToDevice, g->streams[0])))
                return -1;
            cudaEventDestroy(ev);
        }
        return 0;
    }
#if MV_HAVE_NCCL
    // Point to point: every rank sends to rank 0, which receives into its
    // slot. Rank 0's own slice is a local copy.
    if (nccl_try(ncclGroupStart(), "ncclGroupStart")) return -1;
    for (int r = 1; r < g->size; r++) {
        if (nccl_try(ncclSend(send[r], count, ncclBfloat16, 0, g->comms[r], g->streams[r]), "ncclSend") ||
            nccl_try(ncclRecv(recv + (size_t)r * count, count, ncclBfloat16, r, g->comms[0], g->streams[0]),
                     "ncclRecv")) {
            ncclGroupEnd();
            return -1;
        }
    }
    if (nccl_try(ncclGroupEnd(), "ncclGroupEnd (gather)")) return -1;
    if (CUDA_TRY(cudaSetDevice(g->device[0]))) return -1;
    return CUDA_TRY(cudaMemcpyAsync(recv, send[0], count * sizeof(bf16_t), cudaMemcpyDeviceToDevice, g->streams[0]));
#else
    return mv_error("tp_gather_bf16: no NCCL in this build");
#endif
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double tp_time_ms(tp_group_t *g, tp_work_fn fn, void *ctx, int warmup, int reps) {
    for (int i = 0; i < warmup; i++) MV_CHECK(fn(g, ctx));
    MV_CHECK(tp_sync(g));
    if (reps < 1) reps = 1;
    double *ms = malloc(sizeof(double) * (size_t)reps);
    if (!ms) mv_die_at(__FILE__, __LINE__, "malloc", "out of host memory");
    cudaEvent_t start, stop;
    MV_CHECK(tp_set_rank(g, 0));
    CUDA_CHECK(cudaEventCreate(&start));
    CUDA_CHECK(cudaEventCreate(&stop));
    for (int i = 0; i < reps; i++) {
        MV_CHECK(tp_sync(g));  // every rank idle: the run starts together
        CUDA_CHECK(cudaEventRecord(start, g->streams[0]));
        MV_CHECK(fn(g, ctx));
        MV_CHECK(tp_set_rank(g, 0));
        CUDA_CHECK(cudaEventRecord(stop, g->streams[0]));
        MV_CHECK(tp_sync(g));
        float t;
        CUDA_CHECK(cudaEventElapsedTime(&t, start, stop));
        ms[i] = t;
    }
    qsort(ms, (size_t)reps, sizeof(double), cmp_double);
    double median = ms[reps / 2];
    free(ms);
    CUDA_CHECK(cudaEventDestroy(start));
    CUDA_CHECK(cudaEventDestroy(stop));
    return median;
}

int tp_sync(tp_group_t *g) {
    for (int r = 0; r < g->size; r++)
        if (CUDA_TRY(cudaSetDevice(g->device[r])) || CUDA_TRY(cudaStreamSynchronize(g->streams[r]))) return -1;
    return CUDA_TRY(cudaSetDevice(g->device[0]));
}
#endif

/*
 * tests/gpu/tp_allreduce.c - what the engine's tensor-parallel collectives
 * cost per step on their own: build/tp_allreduce, one process per GPU
 * under mpirun (tests/gpu/tp_check.sh runs it).
 *
 *     mpirun -np 2 build/tp_allreduce --model tests/data/qwen3-8b-shape [--tokens 1,256] [--json FILE]
 *
 * For each T (tokens in the step: 1 is a single-stream decode step, 256 a
 * decode step of 256 rows), one step's collectives exactly as
 * chapters/09-engine/runtime/runner_cuda.c makes them for config.json's
 * shapes at tp = N:
 *     2L + 1 ncclAllReduce of [T, H] bf16 (sum): the embedding, then o_proj
 *            and down_proj of each of the L layers
 *     1      ncclAllGather of [T, V/N] bf16: the LM head's vocabulary blocks
 * captured into one CUDA graph on the rank's stream, as the engine's decode
 * graphs hold them, and replayed: after WARMUP replays, the median of REPS,
 * each timed with CUDA events on rank 0 (every rank replays in lock step:
 * a collective finishes on no rank before it has started on all). A second
 * graph holds the all-reduces alone. There is no GEMM between them here, so
 * this is the communication's own time per step, not what overlapping it
 * with compute would leave (the engine does not overlap: each all-reduce
 * waits for its GEMM, and the next kernel for it).
 *
 * Printed: ms per step and us per all-reduce, with the bytes each moves;
 * --json FILE the same with the GPU, N and the NCCL transport variables.
 * Needs CUDA, NCCL and MPI at build time; otherwise it says so and exits 1.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chapters/04-embedding/vocab_parallel.h"
#include "chapters/09-engine/model/model_config.h"
#include "chapters/09-engine/parallel/tp_comm.h"
#include "common/check.h"

#if MV_HAVE_CUDA && MV_HAVE_NCCL && MV_HAVE_MPI
#include <cuda_runtime_api.h>
#include <nccl.h>

#define WARMUP 10
#define REPS 50
#define MAX_T 16

typedef struct {
    ncclComm_t comm;
    cudaStream_t stream;
    int H, L, Vl;      // hidden size, layers, this rank's vocabulary rows
    void *d_x;         // [Tmax, H] bf16
    void *d_send;      // [Tmax, Vl] bf16
    void *d_recv;      // [N, Tmax, Vl] bf16
} probe_t;

static int cmp_float(const void *a, const void *b) {
    const float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

// One step's collectives for T tokens (with_gather 0: the all-reduces alone).
static int enqueue_step(const probe_t *p, int T, int with_gather) {
    for (int k = 0; k < 2 * p->L + 1; k++)
        if (NCCL_TRY(ncclAllReduce(p->d_x, p->d_x, (size_t)T * p->H, ncclBfloat16, ncclSum, p->comm, p->stream)))
            return -1;
    if (with_gather && NCCL_TRY(ncclAllGather(p->d_send, p->d_recv, (size_t)T * p->Vl, ncclBfloat16, p->comm,
                                              p->stream)))
        return -1;
    return 0;
}

// The median ms of one replay of the step's graph.
static int time_step(const probe_t *p, const tp_comm_t *tp, int T, int with_gather, float *median_ms) {
    cudaGraph_t g = NULL;
    cudaGraphExec_t ge = NULL;
    if (enqueue_step(p, T, with_gather) || CUDA_TRY(cudaStreamSynchronize(p->stream)) ||  // outside capture first
        CUDA_TRY(cudaStreamBeginCapture(p->stream, cudaStreamCaptureModeThreadLocal)))
        return -1;
    const int rc = enqueue_step(p, T, with_gather);
    if (CUDA_TRY(cudaStreamEndCapture(p->stream, &g)) || rc || CUDA_TRY(cudaGraphInstantiate(&ge, g, 0))) return -1;
    cudaGraphDestroy(g);
    cudaEvent_t e0, e1;
    if (CUDA_TRY(cudaEventCreate(&e0)) || CUDA_TRY(cudaEventCreate(&e1))) return -1;
    float ms[REPS];
    for (int k = 0; k < WARMUP; k++)
        if (CUDA_TRY(cudaGraphLaunch(ge, p->stream))) return -1;
    if (CUDA_TRY(cudaStreamSynchronize(p->stream)) || tp_comm_agree(tp, 1, "", NULL)) return -1;
    for (int k = 0; k < REPS; k++) {
        if (CUDA_TRY(cudaEventRecord(e0, p->stream)) || CUDA_TRY(cudaGraphLaunch(ge, p->stream)) ||
            CUDA_TRY(cudaEventRecord(e1, p->stream)) || CUDA_TRY(cudaEventSynchronize(e1)) ||
            CUDA_TRY(cudaEventElapsedTime(&ms[k], e0, e1)))
            return -1;
    }
    qsort(ms, REPS, sizeof *ms, cmp_float);
    *median_ms = ms[REPS / 2];
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    cudaGraphExecDestroy(ge);
    return 0;
}

static int parse_tokens(const char *s, int *out, int *n) {
    *n = 0;
    while (s && *s && *n < MAX_T) {
        char *end;
        const long v = strtol(s, &end, 10);
        if (end == s || v < 1 || v > 65536) return mv_error("--tokens %s: a comma-separated list of 1..65536", s);
        out[(*n)++] = (int)v;
        s = *end == ',' ? end + 1 : end;
    }
    return *n ? 0 : mv_error("--tokens: no value");
}

static const char *env_or(const char *name, const char *fallback) {
    const char *v = getenv(name);
    return v && *v ? v : fallback;
}

int main(int argc, char **argv) {
    const char *model = NULL, *tokens = "1,256", *json = NULL;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--model")) model = argv[i + 1];
        else if (!strcmp(argv[i], "--tokens")) tokens = argv[i + 1];
        else if (!strcmp(argv[i], "--json")) json = argv[i + 1];
        else break;
    }
    if (!model) {
        fprintf(stderr, "usage: mpirun -np N %s --model DIR [--tokens 1,256] [--json FILE]\n", argv[0]);
        return 2;
    }
    int Ts[MAX_T], nT = 0;
    qwen3_config_t c;
    tp_comm_t tp;
    MV_CHECK(parse_tokens(tokens, Ts, &nT));
    MV_CHECK(qwen3_config_load(model, &c));
    const int N = tp_comm_launched_size();
    if (N < 2) {
        fprintf(stderr, "tp_allreduce: run it under mpirun with 2 or more ranks (mpirun -np 2 %s ...)\n", argv[0]);
        return 2;
    }
    MV_CHECK(tp_comm_open(N, &tp));
    int count = 0;
    CUDA_CHECK(cudaGetDeviceCount(&count));
    const int device = tp_comm_launched_local_rank() % count;
    CUDA_CHECK(cudaSetDevice(device));
    vocab_shard_t vs;
    MV_CHECK(vocab_shard_init(&vs, c.vocab_size, N, tp.rank));
    probe_t p = {.H = c.hidden_size, .L = c.num_hidden_layers, .Vl = vs.local_rows};
    int Tmax = 0;
    for (int k = 0; k < nT; k++) Tmax = Ts[k] > Tmax ? Ts[k] : Tmax;
    CUDA_CHECK(cudaStreamCreateWithFlags(&p.stream, cudaStreamNonBlocking));
    // Values, not zeros (conventions): ones, whose sums stay exact in bf16 for N <= 256.
    const size_t x_bytes = (size_t)Tmax * p.H * 2, send_bytes = (size_t)Tmax * p.Vl * 2;
    CUDA_CHECK(cudaMalloc(&p.d_x, x_bytes));
    CUDA_CHECK(cudaMalloc(&p.d_send, send_bytes));
    CUDA_CHECK(cudaMalloc(&p.d_recv, (size_t)N * send_bytes));
    CUDA_CHECK(cudaMemset(p.d_x, 0x3f, x_bytes));
    CUDA_CHECK(cudaMemset(p.d_send, 0x3f, send_bytes));
    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    if (tp.rank == 0) NCCL_CHECK(ncclGetUniqueId(&id));
    MV_CHECK(tp_comm_bcast(&tp, &id, sizeof id, 0));
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 1;
    NCCL_CHECK(ncclCommInitRankConfig(&p.comm, N, id, tp.rank, &config));

    struct cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
    FILE *jf = NULL;
    if (tp.rank == 0) {
        printf("tp_allreduce: %s, %d ranks, %s (H %d, %d layers, V/N %d), NCCL_P2P_DISABLE=%s NCCL_SHM_DISABLE=%s "
               "NCCL_NVLS_ENABLE=%s\n",
               prop.name, N, model, p.H, p.L, p.Vl, env_or("NCCL_P2P_DISABLE", "unset"),
               env_or("NCCL_SHM_DISABLE", "unset"), env_or("NCCL_NVLS_ENABLE", "unset"));
        printf("%6s %12s %14s %16s %14s %16s\n", "tokens", "all-reduces", "bytes each", "all-reduces ms",
               "us each", "+ all-gather ms");
        if (json) IO_CHECK((jf = fopen(json, "w")) != NULL, json);
        if (jf)
            fprintf(jf, "{\"gpu\": \"%s\", \"tp\": %d, \"model\": \"%s\", \"hidden_size\": %d, \"layers\": %d, "
                        "\"vocab_local\": %d, \"nccl_p2p_disable\": \"%s\", \"nccl_shm_disable\": \"%s\", "
                        "\"warmup\": %d, \"reps\": %d, \"steps\": [",
                    prop.name, N, model, p.H, p.L, p.Vl, env_or("NCCL_P2P_DISABLE", "unset"),
                    env_or("NCCL_SHM_DISABLE", "unset"), WARMUP, REPS);
    }
    for (int k = 0; k < nT; k++) {
        float ar_ms = 0, all_ms = 0;
        MV_CHECK(time_step(&p, &tp, Ts[k], 0, &ar_ms));
        MV_CHECK(time_step(&p, &tp, Ts[k], 1, &all_ms));
        const int n_ar = 2 * p.L + 1;
        const size_t bytes = (size_t)Ts[k] * p.H * 2;
        if (tp.rank != 0) continue;
        printf("%6d %12d %14zu %16.3f %14.2f %16.3f\n", Ts[k], n_ar, bytes, ar_ms, 1e3 * ar_ms / n_ar, all_ms);
        if (jf)
            fprintf(jf, "%s{\"tokens\": %d, \"allreduces\": %d, \"allreduce_bytes\": %zu, \"allreduce_step_ms\": %.4f, "
                        "\"allreduce_us_each\": %.3f, \"collectives_step_ms\": %.4f, \"allgather_bytes\": %zu}",
                    k ? ", " : "", Ts[k], n_ar, bytes, ar_ms, 1e3 * ar_ms / n_ar, all_ms, (size_t)Ts[k] * p.Vl * 2);
    }
    if (jf) {
        fprintf(jf, "]}\n");
        IO_CHECK(fclose(jf) == 0, json);
    }
    ncclCommDestroy(p.comm);
    cudaFree(p.d_x);
    cudaFree(p.d_send);
    cudaFree(p.d_recv);
    tp_comm_mark_settled();
    return tp_comm_end(0);
}
#else
int main(void) {
    fprintf(stderr, "tp_allreduce: needs CUDA, NCCL and MPI at build time, and this build lacks one of them\n");
    return 1;
}
#endif

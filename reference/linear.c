/*
 * reference/linear.c - blocked, threaded fp32 GEMM for the linear layers
 * (see linear.h). Clarity first; the blocking only keeps it usable at
 * Qwen3-0.6B sizes (a 4096 x 1024 projection of 256 tokens is 2 GFLOP).
 */
#include "reference/linear.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/check.h"

// Weight rows converted to fp32 at a time: 32 rows x K floats stay in L2
// while every row of x passes over them.
#define LINEAR_BLOCK_N 32

typedef struct {
    float *out;
    const float *x;
    const bf16_t *W, *bias;
    int M, N, K;
    int n_begin, n_end;  // this thread's output columns, whole blocks
    int failed;
} linear_job_t;

// Dot product with 8 independent partial sums: shorter dependency chains
// and room for the compiler to vectorise. The summation order is fixed, so
// a row's result does not depend on which thread or block computes it.
static float dot(const float *a, const float *b, int K) {
    float s[8] = {0};
    int k = 0;
    for (; k + 8 <= K; k += 8)
        for (int j = 0; j < 8; j++) s[j] += a[k + j] * b[k + j];
    float total = ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
    for (; k < K; k++) total += a[k] * b[k];
    return total;
}

static void *linear_worker(void *arg) {
    linear_job_t *j = arg;
    float *wblock = malloc(sizeof(float) * LINEAR_BLOCK_N * (size_t)j->K);  // [BLOCK_N, K]
    if (!wblock) {
        j->failed = 1;
        return NULL;
    }
    for (int n0 = j->n_begin; n0 < j->n_end; n0 += LINEAR_BLOCK_N) {
        int nb = j->n_end - n0 < LINEAR_BLOCK_N ? j->n_end - n0 : LINEAR_BLOCK_N;
        bf16_to_float_array(wblock, j->W + (size_t)n0 * j->K, (size_t)nb * j->K);
        for (int m = 0; m < j->M; m++) {
            const float *xm = j->x + (size_t)m * j->K;
            float *om = j->out + (size_t)m * j->N;
            for (int n = 0; n < nb; n++) {
                float b = j->bias ? bf16_to_float(j->bias[n0 + n]) : 0.0f;
                om[n0 + n] = dot(xm, wblock + (size_t)n * j->K, j->K) + b;
            }
        }
    }
    free(wblock);
    return NULL;
}

int linear_validate(long long M, long long N, long long K) {
    if (M < 0) return mv_error("linear: M (tokens) must be >= 0, got %lld", M);
    if (N < 1) return mv_error("linear: N (out_features) must be >= 1, got %lld", N);
    if (K < 1) return mv_error("linear: K (in_features) must be >= 1, got %lld", K);
    if (M * K > (1LL << 40) || N * K > (1LL << 40) || M * N > (1LL << 40))
        return mv_error("linear: M=%lld N=%lld K=%lld is larger than the lab supports", M, N, K);
    return 0;
}

int linear_cpu(float *out, const float *x, const bf16_t *W, const bf16_t *bias, int M, int N, int K,
               int threads) {
    if (linear_validate(M, N, K)) return -1;
    if (M == 0) return 0;
    if (threads <= 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        threads = n > 0 ? (int)n : 1;
    }
    int blocks = (N + LINEAR_BLOCK_N - 1) / LINEAR_BLOCK_N;
    if (threads > blocks) threads = blocks;
    if (threads > 64) threads = 64;
    linear_job_t jobs[64];
    pthread_t tids[64];
    for (int t = 0; t < threads; t++) {
        // Whole blocks per thread, so every thread converts whole weight blocks.
        int b0 = (int)((long long)blocks * t / threads), b1 = (int)((long long)blocks * (t + 1) / threads);
        jobs[t] = (linear_job_t){out, x, W, bias, M, N, K, b0 * LINEAR_BLOCK_N,
                                 b1 * LINEAR_BLOCK_N < N ? b1 * LINEAR_BLOCK_N : N, 0};
    }
    int started = 0;
    for (int t = 1; t < threads; t++, started++)
        if (pthread_create(&tids[t], NULL, linear_worker, &jobs[t])) break;
    linear_worker(&jobs[0]);
    int failed = jobs[0].failed;
    for (int t = 1; t <= started; t++) {
        pthread_join(tids[t], NULL);
        failed |= jobs[t].failed;
    }
    // Threads that could not start: do their share here.
    for (int t = started + 1; t < threads; t++) {
        linear_worker(&jobs[t]);
        failed |= jobs[t].failed;
    }
    if (failed) return mv_error("linear_cpu: out of memory for a %d x %d weight block", LINEAR_BLOCK_N, K);
    return 0;
}

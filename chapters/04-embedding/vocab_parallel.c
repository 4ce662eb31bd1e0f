/* chapters/04-embedding/vocab_parallel.c - vocabulary slices for embedding and LM head (see vocab_parallel.h). */
#include "chapters/04-embedding/vocab_parallel.h"

#include <string.h>

#include "common/check.h"

int vocab_shard_init(vocab_shard_t *v, int vocab_size, int tp_size, int tp_rank) {
    memset(v, 0, sizeof *v);
    if (vocab_size < 1) return mv_error("vocab_shard: vocab_size must be >= 1, got %d", vocab_size);
    if (tp_size < 1 || tp_size > 64) return mv_error("vocab_shard: tp size must be in [1, 64], got %d", tp_size);
    if (tp_rank < 0 || tp_rank >= tp_size) return mv_error("vocab_shard: tp rank %d is outside [0, %d)", tp_rank, tp_size);
    v->vocab_size = vocab_size;
    v->tp_size = tp_size;
    v->tp_rank = tp_rank;
    v->padded = (vocab_size + tp_size - 1) / tp_size * tp_size;
    v->local_rows = v->padded / tp_size;
    v->start = tp_rank * v->local_rows;
    v->real_end = v->start + v->local_rows < vocab_size ? v->start + v->local_rows : vocab_size;
    if (v->real_end < v->start) v->real_end = v->start;  // a rank holding padding only
    return 0;
}

int vocab_shard_load(const vocab_shard_t *v, const char *name, const bf16_t *full, int rows, int cols,
                     int hidden, bf16_t *local) {
    if (rows != v->vocab_size || cols != hidden)
        return mv_error("vocab_shard_load: tensor %s has shape [%d, %d], expected [%d, %d] (vocab_size, hidden_size)",
                        name, rows, cols, v->vocab_size, hidden);
    size_t real = (size_t)(v->real_end - v->start);
    memcpy(local, full + (size_t)v->start * hidden, real * hidden * sizeof(bf16_t));
    memset(local + real * hidden, 0, ((size_t)v->local_rows - real) * hidden * sizeof(bf16_t));
    return 0;
}

int vocab_shard_scatter_logits(const vocab_shard_t *v, const float *local, int M, float *full) {
    size_t real = (size_t)(v->real_end - v->start);
    for (int m = 0; m < M; m++)
        memcpy(full + (size_t)m * v->vocab_size + v->start, local + (size_t)m * v->local_rows, real * sizeof(float));
    return 0;
}

#if MV_HAVE_CUDA
int vocab_assemble_logits_cuda(const vocab_shard_t *v0, const bf16_t *d_gathered, int M, bf16_t *d_logits,
                               cudaStream_t stream) {
    for (int r = 0; r < v0->tp_size; r++) {
        vocab_shard_t v;
        if (vocab_shard_init(&v, v0->vocab_size, v0->tp_size, r)) return -1;
        size_t real = (size_t)(v.real_end - v.start);
        if (real == 0 || M == 0) continue;
        // Rank r's block [M, local_rows] -> columns [start, real_end) of every row.
        if (CUDA_TRY(cudaMemcpy2DAsync(d_logits + v.start, (size_t)v.vocab_size * sizeof(bf16_t),
                                       d_gathered + (size_t)r * M * v.local_rows, (size_t)v.local_rows * sizeof(bf16_t),
                                       real * sizeof(bf16_t), (size_t)M, cudaMemcpyDeviceToDevice, stream)))
            return -1;
    }
    return 0;
}
#endif

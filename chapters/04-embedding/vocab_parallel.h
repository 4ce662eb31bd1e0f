/*
 * chapters/04-embedding/vocab_parallel.h - the vocabulary split over tp ranks,
 * for the token embedding and the LM head. Plain host C (the logits assembly
 * needs CUDA and is declared only in CUDA builds).
 *
 * The vocabulary (Qwen3: 151936 rows of hidden 1024) is padded up to a
 * multiple of tp and cut into equal, contiguous slices: rank r holds rows
 * [r * V/tp, (r+1) * V/tp) of the padded table. Padding rows are zero and
 * are never looked up (ids are validated first) and never reported (the
 * logits are trimmed back to vocab_size).
 *
 *   embedding: each rank gathers the rows it holds and writes zeros for the
 *              others (embedding_cuda); an all-reduce adds them up.
 *   LM head:   each rank computes logits for its slice, [M, V/tp]; rank 0
 *              gathers them and assembles [M, vocab_size].
 * With tie_word_embeddings (Qwen3-0.6B) the LM head's weight *is* the
 * embedding table: the same memory, loaded once.
 */
#ifndef MV_VOCAB_PARALLEL_H
#define MV_VOCAB_PARALLEL_H

#include "common/bf16.h"
#if MV_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    int vocab_size;   // real vocabulary (config.json vocab_size)
    int padded;       // vocab_size rounded up to a multiple of tp_size
    int tp_size, tp_rank;
    int start;        // first row of this rank's slice
    int local_rows;   // padded / tp_size: rows in this rank's table
    int real_end;     // min(start + local_rows, vocab_size): rows past it are padding
} vocab_shard_t;

int vocab_shard_init(vocab_shard_t *v, int vocab_size, int tp_size, int tp_rank);

// This rank's rows of the full table `full` [rows, cols] into `local`
// [local_rows, hidden] (padding rows zeroed). A wrong shape names the tensor.
int vocab_shard_load(const vocab_shard_t *v, const char *name, const bf16_t *full, int rows, int cols,
                     int hidden, bf16_t *local);

// A rank's logits [M, local_rows] into their columns of [M, vocab_size],
// padding dropped (the CPU simulation's version of the assembly below).
int vocab_shard_scatter_logits(const vocab_shard_t *v, const float *local, int M, float *full);

#if MV_HAVE_CUDA
// On rank 0's device: gathered [tp, M, local_rows] (rank-major, as
// tp_gather_bf16 leaves them) -> logits [M, vocab_size], padding trimmed.
int vocab_assemble_logits_cuda(const vocab_shard_t *v0, const bf16_t *d_gathered, int M, bf16_t *d_logits,
                               cudaStream_t stream);
#endif

#ifdef __cplusplus
}
#endif
#endif

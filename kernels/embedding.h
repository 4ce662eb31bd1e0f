/*
 * kernels/embedding.h - token embedding (vocabulary-parallel) and the
 * last-token selection before the LM head, callable from C.
 *
 *   embedding_cuda: out [T, H] = table[ids[t] - vocab_start] for ids in
 *                   [vocab_start, vocab_end), zero rows for the others
 *                   (masked: a rank never reads a row it does not hold).
 *                   Ids must be validated on the host first
 *                   (embedding_validate_ids in reference/embedding.h).
 *   gather_last_tokens_cuda: out [S, H] = hidden[cu_seqlens[s+1] - 1].
 * Both copy rows with 16-byte vectors when H and the pointers allow it.
 */
#ifndef MV_KERNELS_EMBEDDING_H
#define MV_KERNELS_EMBEDDING_H

#include <cuda_runtime_api.h>
#include <stdint.h>

#include "common/bf16.h"

#ifdef __cplusplus
extern "C" {
#endif

int embedding_cuda(bf16_t *d_out, const int32_t *d_ids, const bf16_t *d_table, int T, int H,
                   int vocab_start, int vocab_end, cudaStream_t stream);

int gather_last_tokens_cuda(bf16_t *d_out, const bf16_t *d_hidden, const int32_t *d_cu_seqlens, int S,
                            int H, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif

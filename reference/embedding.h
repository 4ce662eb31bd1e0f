/*
 * reference/embedding.h - CPU reference of the token embedding and of the
 * row selection in front of the LM head.
 *
 *   embedding:   out[t] = table[ids[t]]   (Qwen3-0.6B: table [151936, 1024])
 *                With a vocabulary split over tp ranks, a rank holds rows
 *                [vocab_start, vocab_end) and writes zeros for ids outside
 *                them; summing the ranks' outputs (the all-reduce) gives
 *                every token its row exactly once.
 *   last tokens: in prefill only the last token of each sequence needs
 *                logits: out[s] = hidden[cu_seqlens[s+1] - 1].
 */
#ifndef MV_REF_EMBEDDING_H
#define MV_REF_EMBEDDING_H

#include <stdint.h>

#include "common/bf16.h"

#ifdef __cplusplus
extern "C" {
#endif

// Every id in [0, vocab_size)? Else -1 naming the first bad id and its position.
int embedding_validate_ids(const int32_t *ids, int T, int vocab_size);

// out [T, H] fp32 = table rows (table [vocab_end - vocab_start, H] bf16 holds
// rows vocab_start..vocab_end-1); ids outside that range give zero rows.
int embedding_cpu(float *out, const int32_t *ids, const bf16_t *table, int T, int H, int vocab_start,
                  int vocab_end);

// cu_seqlens [S+1]: 0 = c[0] < c[1] < ... < c[S] = T (every sequence has a token).
int cu_seqlens_validate(const int32_t *cu_seqlens, int S, int T);

// out [S, H] = hidden [T, H] at rows cu_seqlens[s+1] - 1.
int gather_last_tokens_cpu(float *out, const float *hidden, const int32_t *cu_seqlens, int S, int T, int H);

#ifdef __cplusplus
}
#endif
#endif

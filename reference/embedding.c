/* reference/embedding.c - token embedding and last-token selection on the CPU (see embedding.h). */
#include "reference/embedding.h"

#include <string.h>

#include "common/check.h"

int embedding_validate_ids(const int32_t *ids, int T, int vocab_size) {
    if (T < 0) return mv_error("embedding: T (tokens) must be >= 0, got %d", T);
    for (int t = 0; t < T; t++)
        if (ids[t] < 0 || ids[t] >= vocab_size)
            return mv_error("embedding: token id %d at position %d is outside the vocabulary [0, %d)",
                            (int)ids[t], t, vocab_size);
    return 0;
}

int embedding_cpu(float *out, const int32_t *ids, const bf16_t *table, int T, int H, int vocab_start,
                  int vocab_end) {
    if (T < 0 || H < 1 || vocab_start < 0 || vocab_end < vocab_start)
        return mv_error("embedding_cpu: bad shape T=%d H=%d rows [%d, %d)", T, H, vocab_start, vocab_end);
    for (int t = 0; t < T; t++) {
        float *o = out + (size_t)t * H;
        if (ids[t] >= vocab_start && ids[t] < vocab_end)
            bf16_to_float_array(o, table + (size_t)(ids[t] - vocab_start) * H, (size_t)H);
        else
            memset(o, 0, sizeof(float) * (size_t)H);  // another rank holds this row
    }
    return 0;
}

int cu_seqlens_validate(const int32_t *cu_seqlens, int S, int T) {
    if (S < 0) return mv_error("cu_seqlens: number of sequences must be >= 0, got %d", S);
    if (cu_seqlens[0] != 0) return mv_error("cu_seqlens[0] must be 0, got %d", (int)cu_seqlens[0]);
    for (int s = 0; s < S; s++)
        if (cu_seqlens[s + 1] <= cu_seqlens[s])
            return mv_error("cu_seqlens: sequence %d is empty or negative (%d -> %d)", s, (int)cu_seqlens[s],
                            (int)cu_seqlens[s + 1]);
    if (cu_seqlens[S] != T)
        return mv_error("cu_seqlens[%d] = %d, but there are %d tokens", S, (int)cu_seqlens[S], T);
    return 0;
}

int gather_last_tokens_cpu(float *out, const float *hidden, const int32_t *cu_seqlens, int S, int T, int H) {
    if (cu_seqlens_validate(cu_seqlens, S, T)) return -1;
    for (int s = 0; s < S; s++)
        memcpy(out + (size_t)s * H, hidden + (size_t)(cu_seqlens[s + 1] - 1) * H, sizeof(float) * (size_t)H);
    return 0;
}

/*
 * reference/linear.h - CPU reference of a linear layer, y = x W^T + b.
 *
 * Every projection in a Qwen3 decoder layer (q/k/v, o, gate/up, down) and
 * the LM head is a linear layer. Weights are stored as Hugging Face stores
 * them: W [out_features, in_features], row-major, bf16. The activations are
 * fp32, as in the engine's CPU backend; each weight row is converted to fp32
 * as it is used, so a model is never held twice in memory.
 *
 * The GEMM is blocked (a block of weight rows is converted once and reused
 * for every row of x) and split over threads by blocks of output columns.
 */
#ifndef MV_REF_LINEAR_H
#define MV_REF_LINEAR_H

#include "common/bf16.h"

#ifdef __cplusplus
extern "C" {
#endif

int linear_validate(long long M, long long N, long long K);

// out [M, N] fp32 = x [M, K] fp32 @ W[N, K]^T (bf16) + bias [N] (bf16, or NULL).
// threads <= 0: one per online CPU.
int linear_cpu(float *out, const float *x, const bf16_t *W, const bf16_t *bias, int M, int N, int K,
               int threads);

#ifdef __cplusplus
}
#endif
#endif

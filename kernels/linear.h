/*
 * kernels/linear.h - linear layers on the GPU, callable from C.
 *
 *   linear_cuda:   out [M, N] bf16 = x [M, K] bf16 @ W [N, K]^T (+ bias [N])
 *                  through cuBLAS: bf16 inputs, fp32 accumulation, bf16 output.
 *                  With a bias the sum is rounded to bf16 once (the GEMM
 *                  writes fp32 to a stream-ordered workspace; one kernel adds
 *                  the bias and rounds).
 *   add_bias_cuda: out [M, N] += bias [N] (row-parallel layers with tp > 1 add
 *                  it once, after the all-reduce).
 *
 * W is stored as Hugging Face stores it, [out_features, in_features]
 * row-major. cuBLAS is column-major, so the row-major product
 * out = x W^T is computed as the column-major out^T = W x^T: cuBLAS sees W
 * as a K x N column-major matrix and transposes it (CUBLAS_OP_T).
 * The CPU reference is linear_cpu() in reference/linear.h.
 */
#ifndef MV_KERNELS_LINEAR_H
#define MV_KERNELS_LINEAR_H

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <stddef.h>

#include "common/bf16.h"

#ifdef __cplusplus
extern "C" {
#endif

int linear_cuda(cublasHandle_t handle, bf16_t *d_out, const bf16_t *d_x, const bf16_t *d_W,
                const bf16_t *d_bias, int M, int N, int K, cudaStream_t stream);

int add_bias_cuda(bf16_t *d_out, const bf16_t *d_bias, int M, int N, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif

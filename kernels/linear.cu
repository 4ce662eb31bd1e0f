/*
 * kernels/linear.cu - cuBLAS GEMM for linear layers and the bias add (see linear.h).
 *
 * Napkin math, Qwen3-0.6B gate_up (N = 6144, K = 1024): the weight is
 * 12.6 MB. At M = 1 (one decode token) the layer does 12.6 MFLOP and must
 * read 12.6 MB: 1 FLOP per byte, memory-bound, ~3 us at 4.2 TB/s. At
 * M = 4096 it does 51.5 GFLOP over ~71 MB: compute-bound, ~65 us at 790
 * TFLOP/s. The crossover is near M = 200 (the measured ceilings, ~790
 * TFLOP/s over ~4.2 TB/s, give ~190 FLOP per byte on an H200).
 */
#include "kernels/linear.h"

#include "common/check.h"
#include "kernels/common.cuh"
#include "reference/linear.h"

typedef __nv_bfloat16 bf16;

// One thread per element; the bias row is tiny and stays in L1.
// out = bf16(acc + bias): the bias added in fp32, one rounding.
__global__ void bias_round_kernel(bf16 *out, const float *acc, const bf16 *bias, long long total, int N) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x)
        out[i] = __float2bfloat16(acc[i] + __bfloat162float(bias[i % N]));
}

__global__ void add_bias_kernel(bf16 *out, const bf16 *bias, long long total, int N) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x)
        out[i] = __float2bfloat16(__bfloat162float(out[i]) + __bfloat162float(bias[i % N]));
}

static unsigned grid_for(long long n) {
    long long blocks = (n + 255) / 256, cap = 8LL * mv_num_sms();
    return (unsigned)(blocks < cap ? (blocks > 0 ? blocks : 1) : cap);
}

extern "C" int linear_cuda(cublasHandle_t handle, bf16_t *d_out, const bf16_t *d_x, const bf16_t *d_W,
                           const bf16_t *d_bias, int M, int N, int K, cudaStream_t stream) {
    if (linear_validate(M, N, K)) return -1;
    if (M == 0) return 0;
    if (!handle || !d_out || !d_x || !d_W) return mv_error("linear_cuda: null handle or pointer");
    cublasStatus_t st = cublasSetStream(handle, stream);
    if (st != CUBLAS_STATUS_SUCCESS) return mv_error("linear_cuda: cublasSetStream: %s", cublasGetStatusName(st));
    const float alpha = 1.0f, beta = 0.0f;
    if (!d_bias) {
        // Column-major view: out^T [N, M] = op(W)[N, K] * x^T [K, M], with W
        // seen as K x N (ld K) and transposed, x^T as K x M (ld K), out^T ld N.
        st = cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, N, M, K, &alpha, d_W, CUDA_R_16BF, K, d_x,
                          CUDA_R_16BF, K, &beta, d_out, CUDA_R_16BF, N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        if (st != CUBLAS_STATUS_SUCCESS)
            return mv_error("linear_cuda: cublasGemmEx (M=%d N=%d K=%d): %s", M, N, K, cublasGetStatusName(st));
        return 0;
    }
    // With a bias the sum x W^T + b must be rounded to bf16 once: x W^T can
    // be much larger than the result, and rounding it first costs up to half
    // an ulp of x W^T. Measured on an H200 (chapter 03, run 6): a bf16-output
    // GEMM with beta = 1 over the broadcast bias gave the very same errors as
    // adding the bias afterwards, so cuBLAS rounds the product before adding
    // C. Here the GEMM writes fp32 into a stream-ordered workspace, and one
    // kernel adds the bias and rounds.
    float *acc = NULL;
    size_t bytes = (size_t)M * N * sizeof(float);
    if (CUDA_TRY(cudaMallocAsync((void **)&acc, bytes, stream))) return -1;
    st = cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, N, M, K, &alpha, d_W, CUDA_R_16BF, K, d_x,
                      CUDA_R_16BF, K, &beta, acc, CUDA_R_32F, N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    if (st != CUBLAS_STATUS_SUCCESS) {
        cudaFreeAsync(acc, stream);
        return mv_error("linear_cuda: cublasGemmEx fp32 out (M=%d N=%d K=%d): %s", M, N, K, cublasGetStatusName(st));
    }
    long long total = (long long)M * N;
    bias_round_kernel<<<grid_for(total), 256, 0, stream>>>((bf16 *)d_out, acc, (const bf16 *)d_bias, total, N);
    int rc = CUDA_TRY(cudaGetLastError());
    if (CUDA_TRY(cudaFreeAsync(acc, stream))) return -1;
    return rc;
}

extern "C" int add_bias_cuda(bf16_t *d_out, const bf16_t *d_bias, int M, int N, cudaStream_t stream) {
    if (M < 0 || N < 1) return mv_error("add_bias_cuda: bad shape M=%d N=%d", M, N);
    if (M == 0) return 0;
    long long total = (long long)M * N;
    add_bias_kernel<<<grid_for(total), 256, 0, stream>>>((bf16 *)d_out, (const bf16 *)d_bias, total, N);
    return CUDA_TRY(cudaGetLastError());
}

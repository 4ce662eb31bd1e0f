/*
 * kernels/linear.h - linear layers on the GPU, callable from C.
 *
 *   linear_cuda:   out [M, N] bf16 = x [M, K] bf16 @ W [N, K]^T (+ bias [N]),
 *                  bf16 inputs, fp32 accumulation, bf16 output; with a bias
 *                  the sum is rounded to bf16 once. The engine's entry point:
 *                  it picks the version below (LINEAR_AUTO).
 *   linear_cuda_version: the same, with the version forced (chapter 03 checks
 *                  and times each one).
 *   add_bias_cuda: out [M, N] += bias [N] (row-parallel layers with tp > 1 add
 *                  it once, after the all-reduce).
 *
 * Versions:
 *   1  cuBLAS: cublasGemmEx, any shape. With a bias the GEMM writes fp32 to
 *      a stream-ordered workspace and one kernel adds the bias and rounds.
 *   2  GEMV for small M (decode): our own kernel, which streams each weight
 *      row from HBM exactly once with 16-byte loads and keeps the M <= 16
 *      tokens' sums in registers. Needs K % 8 == 0 and 16-byte aligned x
 *      and W (every row then starts on 16 bytes); any other shape is refused
 *      with an error naming the value.
 *   3  the same GEMV on the tensor cores, for M <= 32: each 16 rows of W
 *      the A operand of mma.sync.m16n8k16, each 8 tokens its B operand (its
 *      8 columns; up to 4 such groups, each with its own MMAs on the same
 *      A), fp32 sums in a fixed order (kernels/gemv_mma.cuh) that the
 *      decode megakernel can repeat from shared memory (MV_LINEAR_GEMV=3).
 *      The same refusals as version 2, with M > 32 in place of M > 16.
 *   LINEAR_AUTO (0): a GEMV where it measured faster than cuBLAS (M <= 2,
 *      or M <= 8 with N <= 2048: linear_auto_version) and the shape and
 *      pointers allow it, version 1 otherwise. Which GEMV: version 2 up to
 *      M = 4, version 3 from M = 5 (LINEAR_GEMV_MMA_AUTO_MIN_M);
 *      MV_LINEAR_GEMV=2 or 3 forces one of them wherever it applies, for
 *      comparisons (linear_gemv_forced).
 *
 * W is stored as Hugging Face stores it, [out_features, in_features]
 * row-major. cuBLAS is column-major, so the row-major product
 * out = x W^T is computed as the column-major out^T = W x^T: cuBLAS sees W
 * as a K x N column-major matrix and transposes it (CUBLAS_OP_T). The GEMV
 * reads W as it is stored: one dot product of length K per output.
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

#define LINEAR_AUTO 0    // linear_cuda's own choice
#define LINEAR_CUBLAS 1  // version 1
#define LINEAR_GEMV 2    // version 2
#define LINEAR_GEMV_MMA 3  // version 3
#define LINEAR_NUM_VERSIONS 3

// The most tokens the GEMV takes: its per-token sums live in registers, one
// set per M (a template instantiation each, M = 1..16).
#define LINEAR_GEMV_MAX_M 16
// Version 3's most: 4 groups of the MMA's 8 columns (kernels/gemv_mma.cuh).
#define LINEAR_GEMV_MMA_MAX_M 32
// Where linear_cuda takes version 3 rather than 2 (chapter 03's small-M
// table, one H100): from M = 5. At M = 8 it is ahead on every projection
// (o_proj 4.9 against 6.1 us, gate_up 8.1 against 12.7), at M = 4 even or
// behind (down_proj 5.9 against 5.4), at M = 1 and 2 behind (qkv_proj 6.5
// against 5.7): from HBM, version 2's instructions cost little until M
// grows, and version 3's blocks of one 16-row tile each start fewer loads.
// In a decode step of 5 to 8 rows the fused down projection gains most
// (chapter 09: 23 to 26% more tokens a second).
#define LINEAR_GEMV_MMA_AUTO_MIN_M 5
// Where linear_cuda picks the GEMV, from chapter 03's small-M table (one
// H200, Qwen3-0.6B's projections, 16 launches in a CUDA graph): it is faster
// than cuBLAS at M <= 2 on every shape (1.05x to 2.9x), and up to M = 8 only
// on the narrow ones (N = 1024: o_proj 1.1-2.9x, down_proj 1.3-1.8x). On the
// wide ones (N = 4096, 6144) cuBLAS wins from M = 4 (0.97x and 0.74x there).
// Past 8 tokens cuBLAS keeps them too: version 3 takes up to 32, but at 16
// it only ties cuBLAS on o_proj (6.6 against 6.5 us, H100) and at 32 loses
// on both (9.5 against 6.5, 11.1 against 8.6), and a decode step of 9 to 16
// rows on it gained nothing, of 24 and 32 rows lost 5 and 13% (chapter 09).
#define LINEAR_GEMV_AUTO_MAX_M 2         // any N
#define LINEAR_GEMV_AUTO_MAX_M_NARROW 8  // N <= LINEAR_GEMV_NARROW_N
#define LINEAR_GEMV_NARROW_N 2048

// "auto", "v1-cublas", "v2-gemv", "v3-gemv-mma"; NULL for an unknown version.
const char *linear_version_name(int version);

int linear_cuda(cublasHandle_t handle, bf16_t *d_out, const bf16_t *d_x, const bf16_t *d_W,
                const bf16_t *d_bias, int M, int N, int K, cudaStream_t stream);

// version: LINEAR_AUTO, LINEAR_CUBLAS or LINEAR_GEMV. The handle may be NULL
// for LINEAR_GEMV.
int linear_cuda_version(int version, cublasHandle_t handle, bf16_t *d_out, const bf16_t *d_x,
                        const bf16_t *d_W, const bf16_t *d_bias, int M, int N, int K,
                        cudaStream_t stream);

// 1 when the GEMV takes this shape and these pointers (1 <= M <=
// LINEAR_GEMV_MAX_M, K % 8 == 0, x and W 16-byte aligned), else 0. Records
// no error.
int linear_gemv_applies(const bf16_t *d_x, const bf16_t *d_W, int M, int K);

// 1 when version 3 takes this shape and these pointers: the GEMV's
// conditions on K and the pointers, and 1 <= M <= LINEAR_GEMV_MMA_MAX_M.
int linear_gemv_mma_applies(const bf16_t *d_x, const bf16_t *d_W, int M, int K);

// The GEMV the environment forces wherever linear_cuda picks a GEMV:
// LINEAR_GEMV for MV_LINEAR_GEMV=2, LINEAR_GEMV_MMA for 3 (where version 3
// takes the shape), 0 when unset (read once; the engine refuses any other
// value at start-up).
int linear_gemv_forced(void);

// The version linear_cuda runs for these arguments: LINEAR_GEMV_MMA,
// LINEAR_GEMV or LINEAR_CUBLAS.
int linear_auto_version(const bf16_t *d_x, const bf16_t *d_W, int M, int N, int K);

// The MLP's down projection with SiluAndMul folded into the GEMV's input:
// out [M, N] = SiluAndMul(gate_up [M, 2K]) @ W [N, K]^T, the same bits as
// silu_and_mul_cuda(SILU_AND_MUL_FAST) into a [M, K] buffer followed by the
// GEMV linear_cuda would run on that buffer (version 3 or 2; where it would
// run cuBLAS, version 2 up to 16 tokens and version 3 past them), without
// that buffer. M <= LINEAR_GEMV_MMA_MAX_M, K % 8 == 0, gate_up and W
// 16-byte aligned; otherwise -1 with mv_error().
// The CPU reference is silu_and_mul_cpu() then linear_cpu().
int linear_silu_mul_cuda(bf16_t *d_out, const bf16_t *d_gate_up, const bf16_t *d_W, int M, int N, int K,
                         cudaStream_t stream);
// The same with the GEMV's version forced: LINEAR_GEMV (M <= 16) or
// LINEAR_GEMV_MMA (M <= 32).
int linear_silu_mul_cuda_version(int version, bf16_t *d_out, const bf16_t *d_gate_up, const bf16_t *d_W, int M,
                                 int N, int K, cudaStream_t stream);

// The GEMV's warps per row (version 2): the smallest power of two, at most
// 8, with which one batch of 4 slabs of 32 16-byte chunks per warp covers
// the row. It fixes the order a row's sum is taken in, so another kernel that
// must give the GEMV's bits (kernels/decode_megakernel.cu) splits K the same way.
int linear_gemv_k_split(int K);

int add_bias_cuda(bf16_t *d_out, const bf16_t *d_bias, int M, int N, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif

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
 *   4  a tiled GEMM on the tensor cores for 9 to a few hundred tokens: 64
 *      rows of W by up to 64 tokens a block, K in chunks of 64 through a
 *      ring of shared memory (cp.async, ldmatrix, mma.sync.m16n8k16), the
 *      weight's first chunks requested before the block waits for the
 *      kernel ahead (PDL), which cuBLAS's kernels cannot do. Where 64-row
 *      tiles are too few (N = 1,024) K is split over up to 16 blocks, whose
 *      fp32 sums meet in a workspace registered for the cuBLAS handle
 *      (linear_set_workspace). The same refusals as version 2 on K and the
 *      pointers; any M. (The number 4 first named a TMA + wgmma GEMM, runs
 *      93 to 96 of docs/perf-notes.md, whose code was not kept.)
 *   LINEAR_AUTO (0): a GEMV up to M = 8 (LINEAR_GEMV_AUTO_MAX_M), where
 *      the shape and pointers allow it; version 4 above that up to
 *      LINEAR_TILE_AUTO_MAX_M tokens where the handle has a workspace (or
 *      the shape needs none); version 1 otherwise. Which GEMV:
 *      version 2 at M = 1, version 3 from M = 2 (LINEAR_GEMV_MMA_AUTO_MIN_M);
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
#define LINEAR_TILE 4      // version 4
#define LINEAR_NUM_VERSIONS 4

// The most tokens the GEMV takes: its per-token sums live in registers, one
// set per M (a template instantiation each, M = 1..16).
#define LINEAR_GEMV_MAX_M 16
// Version 3's most: 4 groups of the MMA's 8 columns (kernels/gemv_mma.cuh).
#define LINEAR_GEMV_MMA_MAX_M 32
// Where linear_cuda takes version 3 rather than 2: from M = 2. Alone
// (chapter 03's small-M table, one H100) version 3 is behind version 2 at
// M = 1 and 2 (qkv_proj 6.5 against 5.7 us) and about even at 4, ahead at 8
// (o_proj 4.9 against 6.1, gate_up 8.1 against 12.7). In a decode step it
// is ahead from 2 rows: with version 3 on every projection a step of 2, 3
// and 4 rows gave 20, 29 and 30% more tokens a second than with version 2
// there (chapter 09, "The GEMV on every projection up to 8 rows", H100):
// the fused down projection forms SiluAndMul's input once per 16-row tile,
// not once per row pair.
#define LINEAR_GEMV_MMA_AUTO_MIN_M 2
// Where linear_cuda picks the GEMV: up to M = 8, on every shape. Alone, one
// launch against one, cuBLAS is ahead of it from M = 4 on the wide
// projections (N = 4,096 and 6,144: 0.97x and 0.74x on an H200), but in the
// decode graphs the GEMV starts its weight loads under PDL while the kernel
// before it runs, and cuBLAS waits for that kernel to finish: with the GEMV
// on the wide projections too (and version 3 from 2 rows), steps of 3 to 8
// rows ran 5 to 20% faster (same section). Past 8 tokens cuBLAS keeps them: version 3 takes up to 32, but a
// step of 24 or 32 rows on it lost 12 and 24% (same section), and one of 9 to
// 16 rows runs as two halves of at most 8 (MV_DECODE_HALVES).
#define LINEAR_GEMV_AUTO_MAX_M 8

// Where linear_cuda picks version 4: above the GEMV's limit, up to this many
// tokens. 0: never (MV_LINEAR_TILE_MAX_M=N sets it, 0 to
// LINEAR_TILE_MAX_AUTO_LIMIT, for measurements).
#define LINEAR_TILE_AUTO_MAX_M 0
#define LINEAR_TILE_MAX_AUTO_LIMIT 4096

// "auto", "v1-cublas", "v2-gemv", "v3-gemv-mma", "v4-tile"; NULL for an unknown version.
const char *linear_version_name(int version);

int linear_cuda(cublasHandle_t handle, bf16_t *d_out, const bf16_t *d_x, const bf16_t *d_W,
                const bf16_t *d_bias, int M, int N, int K, cudaStream_t stream);

// version: LINEAR_AUTO or 1 to LINEAR_NUM_VERSIONS. The handle may be NULL
// for the GEMVs, and for version 4 where the shape needs no workspace.
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

// MV_LINEAR_GEMV_MAX_M=N, for measurements: linear_cuda picks a GEMV up to
// N tokens (0 to LINEAR_GEMV_MMA_MAX_M) in place of LINEAR_GEMV_AUTO_MAX_M.
// Returns N; -1 when unset; -2 for any other value (read once; the engine
// refuses it at start-up).
int linear_gemv_max_m_override(void);

// The version linear_cuda runs for these arguments: LINEAR_GEMV_MMA,
// LINEAR_GEMV, LINEAR_TILE or LINEAR_CUBLAS. The handle (may be NULL) counts
// only for version 4's workspace.
int linear_auto_version(cublasHandle_t handle, const bf16_t *d_x, const bf16_t *d_W, int M, int N, int K);

// Version 4's workspace, per cuBLAS handle: linear_cuda_version(4) and
// linear_cuda with that handle use d_ws (16-byte aligned, `bytes` long;
// its first 64 KB are tile counters, zeroed here) whenever a shape splits K
// over several blocks. Launches with that handle must stay in one stream
// order (the engine: one handle per stream). NULL d_ws forgets the handle.
// At most 16 handles. Returns 0, or -1 with mv_error().
int linear_set_workspace(cublasHandle_t handle, void *d_ws, size_t bytes);
// The bytes of workspace version 4 needs for M tokens of an [N, K] weight
// (the counters alone where it does not split K).
size_t linear_tile_workspace_bytes(int M, int N, int K);
// 1 when version 4 takes these arguments now: K % 8 == 0, x and W 16-byte
// aligned, and, where the shape splits K, a workspace for the handle large
// enough for M tokens. Records no error.
int linear_tile_applies(cublasHandle_t handle, const bf16_t *d_x, const bf16_t *d_W, int M, int N, int K);
// MV_LINEAR_TILE_MAX_M: N (0 to LINEAR_TILE_MAX_AUTO_LIMIT), -1 unset, -2
// anything else (read once; the engine refuses it at start-up).
int linear_tile_max_m_override(void);
// The most tokens linear_cuda gives version 4: the override, else
// LINEAR_TILE_AUTO_MAX_M.
int linear_tile_auto_max_m(void);

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

// The same product by version 4 (any M): SiluAndMul of each chunk of
// gate_up computed in shared memory as it lands, the same bits as
// silu_and_mul_cuda(SILU_AND_MUL_FAST) followed by linear_cuda_version(4).
// The handle's workspace as linear_cuda_version(4) needs it.
int linear_silu_mul_tile_cuda(cublasHandle_t handle, bf16_t *d_out, const bf16_t *d_gate_up, const bf16_t *d_W, int M,
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

/*
 * kernels/rmsnorm.h - CUDA RMSNorm in Qwen3's three forms, callable from C.
 *
 *   plain:      out [T, hidden] = rmsnorm(x) * w
 *   fused add:  residual [T, hidden] = bf16(x + residual)   (written back)
 *               out [T, hidden]      = rmsnorm(residual) * w
 *               (out may alias x: the engine overwrites the sublayer output)
 *   per head:   head h of token t at x + t*x_stride + h*head_dim, normalised
 *               over head_dim with w [head_dim]; out may alias x (in place),
 *               which is how q_norm / k_norm run on the QKV projection output.
 * bf16 in and out, fp32 math. The fused form normalises the residual *as
 * stored in bf16*, as Hugging Face's Qwen3 does (its residual add happens in
 * bf16 before the norm upcasts).
 *
 * Versions:
 *   1  naive: one thread per row (per head), scalar loads. Written for reading.
 *   2  vec16: plain and fused use one block per row, heads one warp per head;
 *             16-byte vector loads, the row kept in registers between the
 *             sum of squares and the write, so each byte is read once. But
 *             each thread waits for one load before it issues the next.
 *   3  fast:  version 2 with every load of a thread issued before the first
 *             use and 4 vectors per thread (rows), or 4 tokens per thread
 *             with a thread group per head (heads): enough bytes in flight
 *             to keep HBM busy.
 * The CPU reference is in reference/rmsnorm.h.
 */
#ifndef MV_KERNELS_RMSNORM_H
#define MV_KERNELS_RMSNORM_H

#include <cuda_runtime_api.h>

#include "common/bf16.h"

#ifdef __cplusplus
extern "C" {
#endif

#define RMSNORM_NUM_VERSIONS 3
#define RMSNORM_FAST 3  // the version the engine uses

const char *rmsnorm_version_name(int version);

int rmsnorm_cuda(int version, bf16_t *d_out, const bf16_t *d_x, const bf16_t *d_w, int T,
                 int hidden, float eps, cudaStream_t stream);

int fused_add_rmsnorm_cuda(int version, bf16_t *d_out, bf16_t *d_residual, const bf16_t *d_x,
                           const bf16_t *d_w, int T, int hidden, float eps, cudaStream_t stream);

int rmsnorm_heads_cuda(int version, bf16_t *d_out, long long out_stride, const bf16_t *d_x,
                       long long x_stride, const bf16_t *d_w, int T, int num_heads, int head_dim,
                       float eps, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif

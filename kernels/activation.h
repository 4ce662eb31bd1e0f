/*
 * kernels/activation.h - CUDA SiluAndMul, callable from C.
 *
 *   out [T, I] bf16 = silu(in[:, :I]) * in[:, I:],  in [T, 2*I] bf16, fp32 math
 *
 * Versions (the `version` argument):
 *   1  naive: one thread per output element, 2-byte loads. Written for reading.
 *   2  vec16: 16-byte vector loads and stores (8 bf16 at a time), a grid sized
 *             to the GPU that strides over the tensor. Falls back to narrower
 *             vectors when I or the pointers are not 16-byte aligned.
 *   3  fast:  version 2's vectors, but each block takes whole rows (no index
 *             division), the fast divide, and 4 vector loads issued before
 *             their first use, for more bytes in flight per thread.
 * The CPU reference is silu_and_mul_cpu() in reference/activation.h.
 */
#ifndef MV_KERNELS_ACTIVATION_H
#define MV_KERNELS_ACTIVATION_H

#include <cuda_runtime_api.h>

#include "common/bf16.h"

#ifdef __cplusplus
extern "C" {
#endif

#define SILU_AND_MUL_NUM_VERSIONS 3
#define SILU_AND_MUL_FAST 3  // the version the engine uses

// "v1-naive", "v2-vec16"...; NULL for an unknown version.
const char *silu_and_mul_version_name(int version);

// 0 on success; -1 with mv_last_error() on a bad shape, version or launch.
int silu_and_mul_cuda(int version, bf16_t *d_out, const bf16_t *d_in, int T, int I,
                      cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif

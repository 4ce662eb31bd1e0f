/*
 * kernels/rope.h - CUDA rotary position embedding (RoPE), and Qwen3's
 * q_norm/k_norm fused with it, callable from C.
 *
 *   rope_cuda:         q [T, num_heads, D] and k [T, num_kv_heads, D] (any
 *                      row strides: views into the QKV projection output)
 *                      rotated in place by positions [T] (int32, device).
 *   qk_norm_rope_cuda: on the QKV output qkv [T, (H + 2*Hkv) * D] itself:
 *                      each q head RMS-normalised over D with q_norm_w [D],
 *                      each k head with k_norm_w [D], then rotated; one
 *                      read and one write of q and k; v untouched.
 * bf16 in and out, fp32 math, one rounding per output (see reference/rope.h
 * for how this differs from Hugging Face's bf16 arithmetic).
 *
 * Positions must be checked on the host first with rope_validate_positions()
 * (reference/rope.h): a launcher cannot read device memory. A position that
 * slips through anyway stops the kernel with a trap (the next CUDA call
 * fails with "unspecified launch failure") rather than reading outside
 * the cache.
 *
 * Versions (both functions; from 4 on only the fused form changes):
 *   1  naive: rope_cuda one thread per (token, head, pair); the fused one
 *            thread per (token, head), which sums the squares of its head
 *            and then rotates it. Written for reading.
 *   2  fast:  a group of LANES threads per head, each thread holding a
 *            16-byte vector of the first half and the matching one of the
 *            second half, for HPT heads of one token at once: all their
 *            loads issued before any is used, and the token's cos/sin
 *            loaded once for all HPT heads. The fused kernel reduces the sum
 *            of squares over the group with group_inv_rms (kernels/rmsnorm.cuh).
 *   3  fast:  the plain form the engine runs. The same group of LANES threads per head and the
 *            same pairing, but one head and TOK = 4 tokens per thread (all
 *            8 loads issued first), the block's cos/sin rows copied once
 *            into shared memory, bf16 kept packed two to a register, blocks
 *            of whole warps (8 lanes x 24 heads = 192 threads for Qwen3):
 *            64 registers (79 fused) instead of 112 (126), so 4-5 blocks
 *            per SM instead of 2. The fused form uses group_inv_rms too.
 *   4  fused: 2 tokens per thread and the head size a template constant
 *            (D = 2 * VEC * LANES; Qwen3's 128), 64 registers, 5 blocks of
 *            192 per SM; other head sizes take v3. Plain: v3's kernel.
 *   6  fused: the engine's (ROPE_FAST). The fastest member of the sweep
 *            (tests/gpu/rope_sweep.cu, docs/results/05-rope-sweep.txt):
 *            the member <TOK 1, MINB 8, COSSIN 1, MATH 1> of
 *            kernels/rope_fused.cuh, chosen by ROPE_V6 in kernels/rope.cu.
 *            One token per thread, __launch_bounds__(192, 8): 40 registers,
 *            no spills, 8 blocks (48 warps) per SM; cos/sin loaded by each
 *            thread from the global row into registers (no shared memory,
 *            no barrier); x * w rotated first, then one multiply by 1/rms
 *            (linearity: the rotation does not wait for the reduction).
 *            On one H200, T = 32768, q/k in 256-byte aligned QKV rows:
 *            109.7 us, 87.7% of copy.
 *            Head sizes D = 2 * VEC * LANES (LANES 4, 8, 16 or 32);
 *            other head sizes take v3. Plain: v3's kernel.
 * There is no version 5 or 7 (a persistent pipelined kernel and a
 * copy-engine one, neither faster than 6: docs/05-rope.md); the numbers
 * are kept so that version 6 keeps its name in the published results.
 */
#ifndef MV_KERNELS_ROPE_H
#define MV_KERNELS_ROPE_H

#include <cuda_runtime_api.h>
#include <stdint.h>

#include "common/bf16.h"
#include "reference/rope.h"

#ifdef __cplusplus
extern "C" {
#endif

#define ROPE_MAX_VERSION 6  // versions 1, 2, 3, 4 and 6: the names below are NULL for 5
#define ROPE_FAST 6         // the version the engine uses (plain: v3's kernel under the name v6)

// The cos/sin cache on the device: a copy of the host cache that
// rope_cache_build() (reference/rope.c) made, so the math exists once.
typedef struct {
    float *d_cos_sin;  // [max_position, head_dim] fp32, rows as in rope_cache_t
    int max_position;
    int head_dim;
} rope_cache_gpu_t;

int rope_cache_upload(rope_cache_gpu_t *d_cache, const rope_cache_t *host_cache);
void rope_cache_gpu_free(rope_cache_gpu_t *d_cache);

// "v1-naive-thread-per-pair"...; NULL for a number that is not a version.
const char *rope_version_name(int version);
const char *qk_norm_rope_version_name(int version);

// q and k must not overlap. d_positions [T] int32 on the device.
int rope_cuda(int version, bf16_t *d_q, long long q_stride, bf16_t *d_k, long long k_stride,
              const int32_t *d_positions, const rope_cache_gpu_t *cache, int T, int num_heads,
              int num_kv_heads, int head_dim, cudaStream_t stream);

// d_qkv [T, (num_heads + 2*num_kv_heads) * head_dim]; weights [head_dim].
int qk_norm_rope_cuda(int version, bf16_t *d_qkv, const bf16_t *d_q_norm_w, const bf16_t *d_k_norm_w,
                      const int32_t *d_positions, const rope_cache_gpu_t *cache, int T, int num_heads,
                      int num_kv_heads, int head_dim, float eps, cudaStream_t stream);

// Version 6 of qk_norm_rope_cuda and chapter 06's store step in one kernel
// (STORE = 1 in kernels/rope_fused.cuh): qkv as qk_norm_rope_cuda leaves it,
// and each token's normalised, rotated k heads and its v heads copied into
// k_cache / v_cache [num_blocks, block_size, Hkv, D] at slot_mapping [T]
// (slot -1 = skip), as store_kvcache_cuda would copy them: the same bits as
// qk_norm_rope_cuda(6, ...) followed by store_kvcache_cuda(KV_STORE_FAST,
// ...) of qkv's k and v columns, in one launch and without reading k and v
// a second time. Head sizes D = 16 * LANES (64, 128, 256, 512) with
// 16-byte aligned qkv, weights and caches, and cos/sin 32-byte aligned;
// anything else runs those two kernels (the same bits). Checked and timed
// by chapter 06; its CPU reference is qk_norm_rope_cpu then
// store_kvcache_f32_cpu. Slots must be checked on the host first
// (kv_store_validate_slots); one that slips through traps.
int qk_norm_rope_store_cuda(bf16_t *d_qkv, const bf16_t *d_q_norm_w, const bf16_t *d_k_norm_w,
                            const int32_t *d_positions, const rope_cache_gpu_t *cache, bf16_t *d_k_cache,
                            bf16_t *d_v_cache, const int32_t *d_slot_mapping, int T, int num_heads,
                            int num_kv_heads, int head_dim, float eps, int block_size, int num_blocks,
                            cudaStream_t stream);

// 1 when qk_norm_rope_store_cuda runs its one kernel for these arguments,
// 0 when it runs the two (records no error).
int qk_norm_rope_store_fused(const bf16_t *d_qkv, const bf16_t *d_q_norm_w, const bf16_t *d_k_norm_w,
                             const rope_cache_gpu_t *cache, const bf16_t *d_k_cache, const bf16_t *d_v_cache,
                             int num_heads, int num_kv_heads, int head_dim);

#ifdef __cplusplus
}
#endif
#endif

/*
 * kernels/versions.h - the numbered versions of the chapters' kernels and
 * their names, written once (the type: common/versions.h).
 *
 * The launchers' *_version_name() functions (in each kernel's .cu) answer from these
 * tables, and the chapter executables give them to the harness for
 * `--kernel N` and --help. Plain C, no CUDA header: a CPU-only build lists
 * the versions too. Each kernel's header says what its versions do.
 */
#ifndef MV_KERNELS_VERSIONS_H
#define MV_KERNELS_VERSIONS_H

#include "common/versions.h"

// kernels/activation.h: silu_and_mul_cuda (chapter 01).
static const kernel_version_t SILU_AND_MUL_VERSION_TABLE[] = {
    {1, "v1-naive"},
    {2, "v2-vec16-gridstride"},
    {3, "v3-rows-unrolled"},
    {0, NULL},
};

// kernels/rmsnorm.h: rmsnorm_cuda and its fused-add form (chapter 02).
static const kernel_version_t RMSNORM_VERSION_TABLE[] = {
    {1, "v1-naive-thread-per-row"},
    {2, "v2-vec16-one-load-at-a-time"},
    {3, "v3-vec16-loads-in-flight"},
    {0, NULL},
};

// kernels/linear.h: linear_cuda_version (chapter 03). LINEAR_AUTO (0,
// "auto") is linear_cuda's choice between these, not a version.
static const kernel_version_t LINEAR_VERSION_TABLE[] = {
    {1, "v1-cublas"},
    {2, "v2-gemv"},
    {3, "v3-gemv-mma"},
    {4, "v4-tile"},
    {0, NULL},
};

// kernels/rope.h: rope_cuda (chapter 05). From 4 on only the fused form
// changes; the plain form of 4 and 6 is v3's kernel and launch. There is no
// 5 (see kernels/rope.h).
static const kernel_version_t ROPE_VERSION_TABLE[] = {
    {1, "v1-naive-thread-per-pair"},
    {2, "v2-vec16-group-per-head-4-heads"},
    {3, "v3-vec16-group-per-head-4-tokens"},
    {4, "v4-same-as-v3"},
    {6, "v6-same-as-v3"},
    {0, NULL},
};

// kernels/rope.h: qk_norm_rope_cuda, q_norm/k_norm fused with RoPE (chapter 05).
// 6 is the sweep winner (rope_fused.cuh: TOK 1, MINB 8, COSSIN 1, MATH 1).
static const kernel_version_t QK_NORM_ROPE_VERSION_TABLE[] = {
    {1, "v1-naive-thread-per-head"},
    {2, "v2-vec16-group-per-head-4-heads"},
    {3, "v3-vec16-group-per-head-4-tokens"},
    {4, "v4-vec16-group-per-head-2-tokens-fixed-d"},
    {6, "v6-1-token-8-blocks-cossin-in-regs"},
    {0, NULL},
};

// kernels/kv_store.h: store_kvcache_cuda (chapter 06).
static const kernel_version_t KV_STORE_VERSION_TABLE[] = {
    {1, "v1-naive-thread-per-element"},
    {2, "v2-vec16-warp-per-token"},
    {0, NULL},
};

// kernels/attention.h: the prefill and decode attention kernels (chapter 07).
static const kernel_version_t ATTN_PREFILL_VERSION_TABLE[] = {
    {1, "v1-naive-block-per-row"},
    {2, "v2-flash-mma-bf16"},
    {3, "v3-flash-32-rows-per-warp"},
    {0, NULL},
};
static const kernel_version_t ATTN_DECODE_VERSION_TABLE[] = {
    {1, "v1-naive-block-per-head"},
    {2, "v2-gqa-split"},
    {3, "v3-gqa-split-per-row"},
    {4, "v4-gqa-balanced-pieces"},
    {5, "v5-reduce-loads-first"},
    {6, "v6-async-ring"},
    {7, "v7-longest-first"},
    {0, NULL},
};

#endif

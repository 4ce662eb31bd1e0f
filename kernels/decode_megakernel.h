/*
 * kernels/decode_megakernel.h - a whole decode step's decoder layers in one
 * persistent kernel (the "megakernel"), for one GPU and a few rows.
 *
 * The engine's decode step is a chain of about 290 dependent kernels, and
 * each kernel costs ~1.6 us on the chain even with programmatic dependent
 * launch, before it moves a byte (docs/09-engine.md, "Why the engine is
 * still far from its floor"). This kernel keeps one block on every SM for
 * all the layers: the kernel boundaries become grid barriers (~1 us,
 * kernels/grid_barrier.cuh), and each block's share of the next
 * projections' weights streams into its shared memory (the bulk copy
 * engine) while the current phase runs, so the weights keep flowing across
 * the barriers instead of starting cold at every kernel.
 *
 * What it computes is the layers of the unfused decode step, the same bits:
 * for every layer l of the step's M rows (one token each),
 *
 *     [l > 0: residual += x]  hidden = RMSNorm(residual) * input_norm[l]
 *     qkv = hidden W_qkv^T                              (the GEMV's sums)
 *     q, k heads: RMSNorm * q_norm / k_norm, RoPE       (qk_norm_rope v6)
 *     k, v -> the paged cache at slot_mapping            (store_kvcache)
 *     attn = decode attention over the context           (version 3, split)
 *     x = attn W_o^T
 *     residual += x;  hidden = RMSNorm(residual) * post_norm[l]
 *     gate_up = hidden W_gate_up^T
 *     x = SiluAndMul(gate_up) W_down^T
 *
 * then residual += x, out = RMSNorm(residual) * final_norm. Each phase
 * takes its arithmetic, in its order, from the kernel it replaces (the
 * GEMV's K split, RMSNorm version 3's sums, chapter 05's norm and rotation
 * helpers, chapter 07's decode piece and reduction as device functions),
 * so a step through this kernel gives the bits of the unfused graph
 * (build/engine_check compares them). The CPU reference is the same as the
 * unfused kernels': the CPU backend's layer.
 *
 * Where it applies (decode_megakernel_applies): compute capability 9.0
 * (the bulk copies and mbarriers), no biases, hidden <= 1024, head_dim 64
 * or 128, a GQA group of 1, 2 or 4, M in {1, 2, 4, 8}, and every projection
 * one that linear_cuda would run as the GEMV at that M (so that the bits are
 * the GEMV's: for Qwen3-0.6B, M <= 2), with its weights fitting in shared memory.
 */
#ifndef MV_KERNELS_DECODE_MEGAKERNEL_H
#define MV_KERNELS_DECODE_MEGAKERNEL_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#include "common/bf16.h"

#ifdef __cplusplus
extern "C" {
#endif

// One decoder layer's weights and KV cache on the device.
typedef struct {
    const bf16_t *qkv;         // [nq*D + 2*nkv*D, H]  rows: q, k, v
    const bf16_t *o_proj;      // [H, nq*D]
    const bf16_t *gate_up;     // [2I, H]  rows: gate, then up
    const bf16_t *down;        // [H, I]
    const bf16_t *input_norm;  // [H]
    const bf16_t *post_norm;   // [H]
    const bf16_t *q_norm;      // [D]
    const bf16_t *k_norm;      // [D]
    bf16_t *k_cache, *v_cache; // [num_blocks, block_size, nkv, D] each
} megakernel_layer_t;

typedef struct {
    // the model
    int num_layers, hidden, intermediate, num_heads, num_kv_heads, head_dim;
    float eps;                            // RMSNorm's epsilon
    const megakernel_layer_t *d_layers;   // [num_layers], on the device
    const bf16_t *final_norm;             // [H]
    const float *cos_sin;                 // [max_position, D] fp32 (rope_cache_gpu_t)
    int max_position;
    // the paged cache
    int block_size, num_blocks, max_blocks;
    // the step (device arrays, M rows)
    const int32_t *positions, *slot_mapping, *context_lens, *block_tables;
    int max_context_len;                  // the attention's bound (a decode graph: max_model_len)
    // the embedding: input_ids NULL, the residual holds it on entry; else the
    // kernel reads the rows of embed [vocab, H] itself (an id outside [0,
    // vocab) gives a row of zeros, as embedding_cuda) and writes the residual
    const int32_t *input_ids;
    const bf16_t *embed;
    int vocab;
    // buffers: residual holds the embedding on entry (input_ids NULL); hidden_out [M, H] gets the
    // final norm's output; residual2 [M, H] is scratch, as are the others
    bf16_t *residual, *residual2, *hidden_out, *qkv, *attn, *x, *gate_up;
    float *attn_ws;                       // the split decode's pieces
    size_t attn_ws_bytes;
    unsigned *barrier;                    // two counters, zero before the first launch; each launch leaves them zero
    // NULL, or [MEGAKERNEL_TIMELINE_WORDS] for a profile of the step: for
    // barrier i, [2i] the last block's arrival and [2i + 1] block 0's
    // departure (%globaltimer, ns); [2 * (slots - 1)] the kernel's start,
    // [2 * (slots - 1) + 1] 1 + whether q/k norm and RoPE ran in the
    // attention pieces (MV_MEGAKERNEL_FUSED_ROPE: no phase of their own);
    // then the marks inside the projections (MEGAKERNEL_TIMELINE_MARK) and
    // in block 0's first attention piece (MEGAKERNEL_TIMELINE_PIECE).
    unsigned long long *timeline;
} megakernel_args_t;

// Barriers a step of L layers passes at most (7 a layer), plus the start slot.
#define MEGAKERNEL_TIMELINE_SLOTS(L) (7 * (L) + 2)
// After the barriers' pairs, block 0's times inside each projection j (0 qkv,
// 1 o_proj, 2 gate_up, 3 down) of layer l: k = 0 its input staged in shared
// memory, 1 its weights landed, 2 its GEMV done.
#define MEGAKERNEL_TIMELINE_MARK(L, l, j, k) (2 * MEGAKERNEL_TIMELINE_SLOTS(L) + ((l) * 4 + (j)) * 3 + (k))
// Then block 0's first attention piece of layer l (by default, where the
// pieces norm and rotate their own queries): k = 0 it starts, 1 its queries
// ready, 2 its keys and values done, 3 its results written; and k = 4 block
// 0's share of the pieces' reduction done.
#define MEGAKERNEL_TIMELINE_PIECE(L, l, k) (2 * MEGAKERNEL_TIMELINE_SLOTS(L) + 12 * (L) + (l) * 5 + (k))
// Words (unsigned long long) of the whole timeline.
#define MEGAKERNEL_TIMELINE_WORDS(L) (2 * MEGAKERNEL_TIMELINE_SLOTS(L) + 17 * (L))

// 1 when the megakernel takes this model at M rows on the current device,
// else 0 with the reason in why[why_len] (no error recorded). The weight
// pointers of layer 0 on the host decide the GEMV's alignment.
int decode_megakernel_applies(const megakernel_args_t *a, const megakernel_layer_t *layer0, int M, char *why,
                              size_t why_len);

// The megakernel's gates (MV_MEGAKERNEL_GATES; NULL: the default): 1 with
// gate[4] and *gated set (0 for "off"), or 0 with the reason in why.
int decode_megakernel_gates(const char *value, int gate[4], int *gated, char *why, size_t why_len);

// The decoder layers and the final norm of a decode step of M rows (see
// above), and with input_ids the embedding before them, enqueued as one
// cooperative launch (and a memset of the timeline, with one). Its grid
// barrier's counters must be zero before the first launch; the last block
// to finish sets them to zero again. Capturable into a CUDA graph. -1 with
// mv_error() on bad arguments.
int decode_megakernel_cuda(const megakernel_args_t *a, int M, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif

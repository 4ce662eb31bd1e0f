/*
 * chapters/09-engine/model/qwen3_layout.h - where each Qwen3 checkpoint tensor
 * lands in the engine's merged matrices. Written once here; every backend
 * (runtime/runner_cpu.c, runtime/runner_cuda.c) and every tensor-parallel
 * rank reads it.
 *
 * Hugging Face stores q_proj, k_proj and v_proj as three matrices and
 * gate_proj and up_proj as two. The engine multiplies each group as one
 * matrix, as vLLM's QKVParallelLinear and MergedColumnParallelLinear do: one
 * GEMM reads the normed hidden states once instead of three (or two) times,
 * and its output row holds q, k and v side by side, the layout that
 * qk_norm_rope, store_kvcache and attention read (with a row stride of
 * QKV), and gate then up, the layout SiluAndMul reads. nn.Linear's weight
 * is [out_features, in_features], so putting outputs side by side means
 * stacking the matrices' rows (H = hidden_size, I = intermediate_size,
 * hd = head_dim, nq / nkv = query / KV heads):
 *
 *   qkv_proj [(nq + 2 nkv) hd, H]              gate_up_proj [2I, H]
 *     rows [0, nq hd)               q_proj       rows [0, I)    gate_proj
 *     rows [nq hd, (nq + nkv) hd)   k_proj       rows [I, 2I)   up_proj
 *     rows [(nq + nkv) hd, end)     v_proj
 *
 * and, only with attention_bias, the merged bias [(nq + 2 nkv) hd] holds
 * q_proj.bias, k_proj.bias, v_proj.bias at the same offsets (Qwen3's MLP has
 * no bias). Qwen3-0.6B (H 1024, 16 query heads, 8 KV heads of 128, I 3072):
 * qkv_proj [4096, 1024] with q rows [0, 2048), k [2048, 3072), v [3072,
 * 4096); gate_up_proj [6144, 1024] with gate [0, 3072), up [3072, 6144).
 *
 * Tensor parallelism (chapter 03) cuts each merged matrix by output rows,
 * never splitting a head: rank r of tp holds nq/tp query heads and nkv/tp KV
 * heads, [q_r | k_r | v_r], and I/tp rows each of gate and up, [gate_r |
 * up_r]. The pieces below are chapter 03's rules (tp_linear_qkv,
 * tp_linear_merged_column, tp_linear_segments) evaluated once for a rank:
 * which rows of which checkpoint tensor go to which rows of that rank's
 * matrix. tp_size 1 is the single-device engine: each piece is a whole
 * tensor. Qwen3-0.6B at tp 2, rank 1: qkv_proj [2048, 1024] takes q_proj
 * rows [1024, 2048) into [0, 1024), k_proj rows [512, 1024) into [1024,
 * 1536), v_proj rows [512, 1024) into [1536, 2048).
 *
 * When tp exceeds nkv (a multiple of it), every rank holds the one KV head
 * its query heads read, shared by tp/nkv ranks (chapter 03's kv_replicas,
 * as vLLM does): tiny-qwen3-untied (1 KV head) at tp 2 gives each rank 2
 * query heads and a copy of KV head 0.
 *
 * Not merged, but sharded too, and described here with the rest of a
 * rank's share so that every backend reads one description: o_proj and
 * down_proj (row-parallel in chapter 03: a rank holds a slice of their
 * columns, the slice of the heads / the gate_up rows it computes), and the
 * embedding and LM head (vocab-parallel in chapter 04: a rank holds V/tp
 * rows). Every fill below goes through chapter 03's tp_linear_load and
 * chapter 04's vocab_shard_load, reading only the rank's rows (or columns)
 * of the mapped checkpoint tensor. The norms are whole on every rank.
 *
 * Build: part of build/libmv_model.a; calls chapter 03 (build/libmv_ch03.a)
 * and chapter 04 (build/libmv_ch04.a).
 * Tests: tests/test_qwen3_layout.c.
 */
#ifndef MV_QWEN3_LAYOUT_H
#define MV_QWEN3_LAYOUT_H

#include <stddef.h>

#include "chapters/03-linear-tp/linear_tp.h"
#include "chapters/04-embedding/vocab_parallel.h"
#include "chapters/09-engine/model/model_config.h"
#include "chapters/09-engine/model/qwen3_weights.h"

#ifdef __cplusplus
extern "C" {
#endif

// The checkpoint tensors that go into a merged matrix (fields of
// qwen3_layer_weights_t: the weight, and its bias where there is one).
typedef enum { QWEN3_Q_PROJ, QWEN3_K_PROJ, QWEN3_V_PROJ, QWEN3_GATE_PROJ, QWEN3_UP_PROJ } qwen3_source_t;

// A piece's index in its merged matrix: chapter 03's part number.
enum { QWEN3_PART_Q = 0, QWEN3_PART_K = 1, QWEN3_PART_V = 2 };   // in qkv_proj
enum { QWEN3_PART_GATE = 0, QWEN3_PART_UP = 1 };                 // in gate_up_proj

// Rows [src_row, src_row + rows) of one checkpoint tensor land at rows
// [dst_row, dst_row + rows) of a merged matrix (for a bias: its elements).
typedef struct {
    qwen3_source_t source;
    int src_rows;  // rows of the whole checkpoint tensor (its out_features)
    int src_row;   // the first row this rank takes (0 at tp_size 1)
    int dst_row;   // where they land in the merged matrix
    int rows;      // how many: src_rows / tp_size
} qwen3_piece_t;

typedef struct {
    const char *name;                   // "qkv_proj", "gate_up_proj" (vLLM's names)
    int rows, cols;                     // this rank's merged matrix: [rows, cols] bf16, cols = H
    int num_pieces;                     // 3 (q, k, v) or 2 (gate, up)
    qwen3_piece_t piece[TP_MAX_PARTS];  // [num_pieces] by part, which is also row order
    int has_bias;                       // 1: a merged bias [rows] too, same pieces (attention_bias)
    tp_linear_t tp;                     // chapter 03's description the pieces were computed from
} qwen3_merged_t;

typedef struct {
    int tp_size, tp_rank;
    qwen3_merged_t qkv;      // [(nq/tp + 2 nkv_local) hd, H]  nkv_local = qkv.tp.kv_heads_local
    qwen3_merged_t gate_up;  // [2I / tp_size, H]
    tp_linear_t o_proj;      // row-parallel: this rank's [H, nq/tp hd]
    tp_linear_t down;        // row-parallel: this rank's [H, I/tp]
    vocab_shard_t vocab;     // embed_tokens' and lm_head's rows of this rank: [vocab.local_rows, H]
} qwen3_layout_t;

// The layout of rank tp_rank of tp_size for config c (1, 0: unsharded).
// -1 with mv_error() when tp_size does not divide the heads or I (chapter
// 03's message, prefixed with the matrix's name).
int qwen3_layout_init(qwen3_layout_t *lo, const qwen3_config_t *c, int tp_size, int tp_rank);

// The checkpoint tensor behind a source in one layer, and its bias (NULL
// without attention_bias; always NULL for gate and up).
const st_tensor_t *qwen3_source_weight(const qwen3_layer_weights_t *lw, qwen3_source_t s);
const st_tensor_t *qwen3_source_bias(const qwen3_layer_weights_t *lw, qwen3_source_t s);

// Fill dst [m->rows, m->cols] bf16 (host memory) with this rank's merged
// matrix of one layer: each piece's rows of its tensor, converted with
// st_to_bf16. The _bias version fills dst [m->rows] (m->has_bias only).
// -1 with mv_error() naming the tensor when its shape is not the layout's
// (a layout made for another config), or when out of memory (a sliced
// piece, tp_size > 1, is converted whole first).
int qwen3_merged_fill(const qwen3_merged_t *m, const qwen3_layer_weights_t *lw, bf16_t *dst);
int qwen3_merged_fill_bias(const qwen3_merged_t *m, const qwen3_layer_weights_t *lw, bf16_t *dst);

// This rank's columns of a row-parallel checkpoint tensor t (o_proj or
// down_proj) into dst [l->out_local, l->in_local] (tp_linear_load).
int qwen3_row_fill(const tp_linear_t *l, const st_tensor_t *t, bf16_t *dst);
// This rank's rows of embed_tokens or lm_head into dst [v->local_rows, H],
// padding rows zeroed (vocab_shard_load).
int qwen3_vocab_fill(const vocab_shard_t *v, const st_tensor_t *t, int H, bf16_t *dst);

#ifdef __cplusplus
}
#endif
#endif

/*
 * chapters/03-linear-tp/linear_tp.h - how Qwen3's linear layers are sharded
 * for tensor parallelism, and how a checkpoint tensor is cut into a rank's
 * shard. Plain host C: the engine loads its weights with these functions.
 *
 * With tp ranks, each rank holds a slice of each weight (Megatron-LM's
 * scheme, as vLLM uses it). W is [out_features, in_features] as Hugging
 * Face stores it.
 *
 *   replicated       every rank holds all of W.
 *   column-parallel  rank r holds output rows [r*out/tp, (r+1)*out/tp): its
 *                    output is a slice of the full output; no communication.
 *   merged column    gate_proj and up_proj in one weight: rank r holds its
 *                    slice of gate then its slice of up: [gate_r | up_r].
 *   QKV              q_proj, k_proj, v_proj merged; rank r holds
 *                    num_heads/tp query heads and num_kv_heads/tp kv heads,
 *                    laid out [q_r | k_r | v_r]. Whole heads never split,
 *                    so attention runs on each rank with no communication.
 *                    When tp exceeds num_kv_heads (a multiple of it), each
 *                    rank holds the one kv head its query heads read, and
 *                    tp/num_kv_heads ranks hold a copy of it (vLLM's
 *                    num_kv_head_replicas): rank r holds kv head
 *                    r / (tp/num_kv_heads).
 *   row-parallel     rank r holds input columns [r*in/tp, (r+1)*in/tp): it
 *                    computes a partial sum of the full output; an
 *                    all-reduce adds the partials; the bias is added once.
 *
 * A decoder layer pairs them: QKV (column) -> attention -> o_proj (row), and
 * gate_up (column) -> SiluAndMul -> down_proj (row). The column layer's
 * slice is exactly the row layer's input slice, so each pair needs one
 * all-reduce and nothing in between.
 */
#ifndef MV_LINEAR_TP_H
#define MV_LINEAR_TP_H

#include "common/bf16.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    TP_REPLICATED,
    TP_COLUMN,
    TP_MERGED_COLUMN,
    TP_QKV,
    TP_ROW,
} tp_kind_t;

#define TP_MAX_PARTS 3

typedef struct {
    tp_kind_t kind;
    int tp_size, tp_rank;
    int in_features, out_features;  // the full (unsharded) layer
    int in_local, out_local;        // this rank's weight shard is [out_local, in_local]
    int num_parts;                  // merged column: 2 (gate, up); QKV: 3 (q, k, v); else 1
    int part_out[TP_MAX_PARTS];     // full output rows of each part
    int num_heads, num_kv_heads, head_dim;  // QKV only
    int kv_heads_local;             // QKV only: kv heads this rank holds (num_kv_heads/tp, or 1 when replicated)
    int kv_replicas;                // QKV only: ranks holding each kv head (1, or tp/num_kv_heads)
} tp_linear_t;

// Where a rank's local output columns sit in the full output:
// local[:, local_offset + i] is full[:, full_offset + i] for i < count.
typedef struct {
    int local_offset, full_offset, count;
} tp_segment_t;

// Each returns 0, or -1 with mv_last_error() when tp does not divide the
// sizes (or a size or rank is out of range).
int tp_linear_replicated(tp_linear_t *l, int in, int out, int tp_size, int tp_rank);
int tp_linear_column(tp_linear_t *l, int in, int out, int tp_size, int tp_rank);
int tp_linear_merged_column(tp_linear_t *l, int in, const int *part_out, int num_parts, int tp_size,
                            int tp_rank);
int tp_linear_qkv(tp_linear_t *l, int hidden, int num_heads, int num_kv_heads, int head_dim,
                  int tp_size, int tp_rank);
int tp_linear_row(tp_linear_t *l, int in, int out, int tp_size, int tp_rank);

const char *tp_kind_name(tp_kind_t kind);

// The layer kind and part of a Hugging Face Qwen3 projection name
// ("q_proj" -> QKV part 0, "up_proj" -> merged part 1, "down_proj" -> row...).
// A full key such as "model.layers.3.mlp.up_proj.weight" works too.
int tp_part_of(const char *name, tp_kind_t *kind, int *part);

// Output segments of this rank (column kinds); returns how many (<= 3).
int tp_linear_segments(const tp_linear_t *l, tp_segment_t *seg);

// Copy this rank's shard of one full checkpoint tensor `full` [rows, cols]
// (part `part` of the layer) into its place in `local` [out_local, in_local].
// A shape that does not match is an error naming the tensor.
int tp_linear_load(const tp_linear_t *l, const char *name, int part, const bf16_t *full, int rows,
                   int cols, bf16_t *local);

// The same for a bias [n]: column kinds take their slice into local_bias
// [out_local]; row-parallel layers keep the whole bias (added once, after
// the all-reduce).
int tp_linear_load_bias(const tp_linear_t *l, const char *name, int part, const bf16_t *full, int n,
                        bf16_t *local_bias);

// Put a rank's local output [M, out_local] into its columns of the full
// output [M, out_features] (column kinds). The CPU simulation and the
// chapter's checks use it to compare shards with the unsharded layer.
int tp_linear_scatter_output(const tp_linear_t *l, const float *local, int M, float *full);

#ifdef __cplusplus
}
#endif
#endif

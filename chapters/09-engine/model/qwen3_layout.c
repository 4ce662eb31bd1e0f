/*
 * chapters/09-engine/model/qwen3_layout.c - Qwen3's merged qkv_proj and
 * gate_up_proj, computed from the config with chapter 03's sharding rules,
 * and filled from a layer's checkpoint tensors (see qwen3_layout.h).
 */
#include "chapters/09-engine/model/qwen3_layout.h"

#include <stdlib.h>
#include <string.h>

#include "common/check.h"

// The pieces of one merged matrix from chapter 03's description of it:
// tp_linear_segments says where each part's slice of this rank sits in the
// full (unsharded) output and in the rank's local one. A part's slice
// starts at full_offset in the stacked parts, so in its own tensor at
// full_offset minus the rows of the parts before it.
static void pieces_from_tp(qwen3_merged_t *m, const char *name, const qwen3_source_t *sources, int has_bias) {
    tp_segment_t seg[TP_MAX_PARTS];
    m->name = name;
    m->rows = m->tp.out_local;
    m->cols = m->tp.in_local;
    m->num_pieces = tp_linear_segments(&m->tp, seg);
    m->has_bias = has_bias;
    int part_start = 0;
    for (int p = 0; p < m->num_pieces; p++) {
        m->piece[p] = (qwen3_piece_t){.source = sources[p],
                                      .src_rows = m->tp.part_out[p],
                                      .src_row = seg[p].full_offset - part_start,
                                      .dst_row = seg[p].local_offset,
                                      .rows = seg[p].count};
        part_start += m->tp.part_out[p];
    }
}

int qwen3_layout_init(qwen3_layout_t *lo, const qwen3_config_t *c, int tp_size, int tp_rank) {
    static const qwen3_source_t qkv[] = {QWEN3_Q_PROJ, QWEN3_K_PROJ, QWEN3_V_PROJ};
    static const qwen3_source_t gate_up[] = {QWEN3_GATE_PROJ, QWEN3_UP_PROJ};
    const int H = c->hidden_size, I = c->intermediate_size, halves[2] = {I, I};
    memset(lo, 0, sizeof *lo);
    lo->tp_size = tp_size;
    lo->tp_rank = tp_rank;
    if (tp_linear_qkv(&lo->qkv.tp, H, c->num_attention_heads, c->num_key_value_heads, c->head_dim, tp_size,
                      tp_rank))
        return mv_error_prefix("qkv_proj");
    if (tp_linear_merged_column(&lo->gate_up.tp, H, halves, 2, tp_size, tp_rank))
        return mv_error_prefix("gate_up_proj");
    if (tp_linear_row(&lo->o_proj, c->num_attention_heads * c->head_dim, H, tp_size, tp_rank))
        return mv_error_prefix("o_proj");
    if (tp_linear_row(&lo->down, I, H, tp_size, tp_rank)) return mv_error_prefix("down_proj");
    if (vocab_shard_init(&lo->vocab, c->vocab_size, tp_size, tp_rank)) return mv_error_prefix("embed_tokens");
    pieces_from_tp(&lo->qkv, "qkv_proj", qkv, c->attention_bias);
    pieces_from_tp(&lo->gate_up, "gate_up_proj", gate_up, 0);
    return 0;
}

const st_tensor_t *qwen3_source_weight(const qwen3_layer_weights_t *lw, qwen3_source_t s) {
    switch (s) {
    case QWEN3_Q_PROJ: return lw->q_proj;
    case QWEN3_K_PROJ: return lw->k_proj;
    case QWEN3_V_PROJ: return lw->v_proj;
    case QWEN3_GATE_PROJ: return lw->gate_proj;
    case QWEN3_UP_PROJ: return lw->up_proj;
    }
    return NULL;
}

const st_tensor_t *qwen3_source_bias(const qwen3_layer_weights_t *lw, qwen3_source_t s) {
    switch (s) {
    case QWEN3_Q_PROJ: return lw->q_bias;
    case QWEN3_K_PROJ: return lw->k_bias;
    case QWEN3_V_PROJ: return lw->v_bias;
    case QWEN3_GATE_PROJ:
    case QWEN3_UP_PROJ: return NULL;
    }
    return NULL;
}

// Piece p of tensor t (a weight [src_rows, cols], or a bias [src_rows] when
// cols is 0) into its rows of dst, by chapter 03's loaders: the rows this
// rank holds, read from the mapped tensor itself (st_bf16_view).
static int fill_piece(const qwen3_merged_t *m, int part, const st_tensor_t *t, int cols, bf16_t *dst) {
    const int ndim = cols ? 2 : 1;
    const qwen3_piece_t *p = &m->piece[part];
    if (!t) return mv_error("%s: part %d has no tensor bound", m->name, part);
    if (t->ndim != ndim || t->shape[0] != p->src_rows || (cols && t->shape[1] != cols)) {
        if (cols)
            return mv_error("%s: tensor %s is not [%d, %d] as the layout expects", m->name, t->name, p->src_rows,
                            cols);
        return mv_error("%s: tensor %s is not [%d] as the layout expects", m->name, t->name, p->src_rows);
    }
    bf16_t *owned = NULL;
    const bf16_t *full = st_bf16_view(t, &owned);
    if (!full) return mv_error_prefix("%s", m->name);
    int rc = cols ? tp_linear_load(&m->tp, t->name, part, full, p->src_rows, cols, dst)
                  : tp_linear_load_bias(&m->tp, t->name, part, full, p->src_rows, dst);
    free(owned);
    return rc ? mv_error_prefix("%s", m->name) : 0;
}

int qwen3_merged_fill(const qwen3_merged_t *m, const qwen3_layer_weights_t *lw, bf16_t *dst) {
    for (int p = 0; p < m->num_pieces; p++)
        if (fill_piece(m, p, qwen3_source_weight(lw, m->piece[p].source), m->cols, dst)) return -1;
    return 0;
}

int qwen3_merged_fill_bias(const qwen3_merged_t *m, const qwen3_layer_weights_t *lw, bf16_t *dst) {
    if (!m->has_bias) return mv_error("%s: the layout has no bias (attention_bias is false)", m->name);
    for (int p = 0; p < m->num_pieces; p++)
        if (fill_piece(m, p, qwen3_source_bias(lw, m->piece[p].source), 0, dst)) return -1;
    return 0;
}

int qwen3_row_fill(const tp_linear_t *l, const st_tensor_t *t, bf16_t *dst) {
    if (t->ndim != 2) return mv_error("tensor %s has %d dims, expected 2", t->name, t->ndim);
    bf16_t *owned = NULL;
    const bf16_t *full = st_bf16_view(t, &owned);
    if (!full) return -1;
    int rc = tp_linear_load(l, t->name, 0, full, (int)t->shape[0], (int)t->shape[1], dst);
    free(owned);
    return rc;
}

int qwen3_vocab_fill(const vocab_shard_t *v, const st_tensor_t *t, int H, bf16_t *dst) {
    if (t->ndim != 2) return mv_error("tensor %s has %d dims, expected 2", t->name, t->ndim);
    bf16_t *owned = NULL;
    const bf16_t *full = st_bf16_view(t, &owned);
    if (!full) return -1;
    int rc = vocab_shard_load(v, t->name, full, (int)t->shape[0], (int)t->shape[1], H, dst);
    free(owned);
    return rc;
}

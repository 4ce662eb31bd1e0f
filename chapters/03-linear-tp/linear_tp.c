/*
 * chapters/03-linear-tp/linear_tp.c - sharding rules and shard loading for
 * tensor-parallel linear layers (see linear_tp.h).
 */
#include "chapters/03-linear-tp/linear_tp.h"

#include <string.h>

#include "common/check.h"

static int check_common(tp_linear_t *l, const char *what, int in, int tp_size, int tp_rank) {
    memset(l, 0, sizeof *l);
    if (tp_size < 1 || tp_size > 64) return mv_error("%s: tp size must be in [1, 64], got %d", what, tp_size);
    if (tp_rank < 0 || tp_rank >= tp_size)
        return mv_error("%s: tp rank %d is outside [0, %d)", what, tp_rank, tp_size);
    if (in < 1) return mv_error("%s: in_features must be >= 1, got %d", what, in);
    l->tp_size = tp_size;
    l->tp_rank = tp_rank;
    l->in_features = in;
    l->in_local = in;
    l->num_parts = 1;
    return 0;
}

int tp_linear_replicated(tp_linear_t *l, int in, int out, int tp_size, int tp_rank) {
    if (check_common(l, "replicated linear", in, tp_size, tp_rank)) return -1;
    if (out < 1) return mv_error("replicated linear: out_features must be >= 1, got %d", out);
    l->kind = TP_REPLICATED;
    l->out_features = l->out_local = l->part_out[0] = out;
    return 0;
}

int tp_linear_column(tp_linear_t *l, int in, int out, int tp_size, int tp_rank) {
    if (check_common(l, "column-parallel linear", in, tp_size, tp_rank)) return -1;
    if (out < 1 || out % tp_size)
        return mv_error("column-parallel linear: out_features %d is not a positive multiple of tp size %d",
                        out, tp_size);
    l->kind = TP_COLUMN;
    l->out_features = l->part_out[0] = out;
    l->out_local = out / tp_size;
    return 0;
}

int tp_linear_merged_column(tp_linear_t *l, int in, const int *part_out, int num_parts, int tp_size,
                            int tp_rank) {
    if (check_common(l, "merged column-parallel linear", in, tp_size, tp_rank)) return -1;
    if (num_parts < 1 || num_parts > TP_MAX_PARTS)
        return mv_error("merged column-parallel linear: %d parts (1..%d)", num_parts, TP_MAX_PARTS);
    l->kind = TP_MERGED_COLUMN;
    l->num_parts = num_parts;
    for (int p = 0; p < num_parts; p++) {
        if (part_out[p] < 1 || part_out[p] % tp_size)
            return mv_error("merged column-parallel linear: part %d has %d rows, not a positive multiple "
                            "of tp size %d", p, part_out[p], tp_size);
        l->part_out[p] = part_out[p];
        l->out_features += part_out[p];
        l->out_local += part_out[p] / tp_size;
    }
    return 0;
}

int tp_linear_qkv(tp_linear_t *l, int hidden, int num_heads, int num_kv_heads, int head_dim,
                  int tp_size, int tp_rank) {
    if (check_common(l, "QKV linear", hidden, tp_size, tp_rank)) return -1;
    if (num_heads < 1 || num_kv_heads < 1 || head_dim < 1)
        return mv_error("QKV linear: num_heads %d, num_kv_heads %d, head_dim %d must all be >= 1",
                        num_heads, num_kv_heads, head_dim);
    if (num_heads % num_kv_heads)
        return mv_error("QKV linear: num_heads %d is not a multiple of num_kv_heads %d (GQA groups)",
                        num_heads, num_kv_heads);
    if (num_heads % tp_size)
        return mv_error("QKV linear: tp size %d does not divide num_attention_heads %d", tp_size, num_heads);
    // KV heads are split when tp divides them, and replicated when tp is a
    // multiple of them (every rank then needs one whole kv head: a head is
    // never split). Anything else would leave a rank's query heads reading
    // kv heads split across ranks.
    if (num_kv_heads % tp_size && tp_size % num_kv_heads)
        return mv_error("QKV linear: tp size %d neither divides num_key_value_heads %d nor is a multiple of it",
                        tp_size, num_kv_heads);
    l->kind = TP_QKV;
    l->num_parts = 3;
    l->num_heads = num_heads;
    l->num_kv_heads = num_kv_heads;
    l->head_dim = head_dim;
    l->kv_heads_local = num_kv_heads >= tp_size ? num_kv_heads / tp_size : 1;
    l->kv_replicas = num_kv_heads >= tp_size ? 1 : tp_size / num_kv_heads;
    l->part_out[0] = num_heads * head_dim;
    l->part_out[1] = l->part_out[2] = num_kv_heads * head_dim;
    l->out_features = l->part_out[0] + 2 * l->part_out[1];
    l->out_local = (num_heads / tp_size + 2 * l->kv_heads_local) * head_dim;
    return 0;
}

int tp_linear_row(tp_linear_t *l, int in, int out, int tp_size, int tp_rank) {
    if (check_common(l, "row-parallel linear", in, tp_size, tp_rank)) return -1;
    if (in % tp_size)
        return mv_error("row-parallel linear: in_features %d is not a multiple of tp size %d", in, tp_size);
    if (out < 1) return mv_error("row-parallel linear: out_features must be >= 1, got %d", out);
    l->kind = TP_ROW;
    l->in_local = in / tp_size;
    l->out_features = l->out_local = l->part_out[0] = out;
    return 0;
}

const char *tp_kind_name(tp_kind_t kind) {
    switch (kind) {
    case TP_REPLICATED: return "replicated";
    case TP_COLUMN: return "column";
    case TP_MERGED_COLUMN: return "merged-column";
    case TP_QKV: return "qkv";
    case TP_ROW: return "row";
    }
    return "?";
}

int tp_part_of(const char *name, tp_kind_t *kind, int *part) {
    static const struct {
        const char *proj;
        tp_kind_t kind;
        int part;
    } map[] = {
        {"q_proj", TP_QKV, 0},         {"k_proj", TP_QKV, 1},          {"v_proj", TP_QKV, 2},
        {"gate_proj", TP_MERGED_COLUMN, 0}, {"up_proj", TP_MERGED_COLUMN, 1},
        {"o_proj", TP_ROW, 0},         {"down_proj", TP_ROW, 0},
    };
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++) {
        const char *hit = strstr(name, map[i].proj);
        size_t n = strlen(map[i].proj);
        // Whole component only: "q_proj" must not match inside another word.
        if (hit && (hit == name || hit[-1] == '.') && (hit[n] == '\0' || hit[n] == '.')) {
            *kind = map[i].kind;
            *part = map[i].part;
            return 0;
        }
    }
    return mv_error("tp_part_of: '%s' is not a Qwen3 projection (q/k/v/o_proj, gate/up/down_proj)", name);
}

int tp_linear_segments(const tp_linear_t *l, tp_segment_t *seg) {
    const int r = l->tp_rank, tp = l->tp_size;
    if (l->kind == TP_REPLICATED || l->kind == TP_ROW) {
        seg[0] = (tp_segment_t){0, 0, l->out_features};
        return 1;
    }
    // Column kinds: part p's slice of this rank follows the earlier parts' slices.
    // QKV's k and v (parts 1, 2) are cut by kv head, which kv_replicas ranks share.
    int local = 0, full = 0;
    for (int p = 0; p < l->num_parts; p++) {
        const int kv = l->kind == TP_QKV && p > 0;
        int n = kv ? l->kv_heads_local * l->head_dim : l->part_out[p] / tp;
        int slice = kv ? r / l->kv_replicas : r;
        seg[p] = (tp_segment_t){local, full + slice * n, n};
        local += n;
        full += l->part_out[p];
    }
    return l->num_parts;
}

int tp_linear_load(const tp_linear_t *l, const char *name, int part, const bf16_t *full, int rows,
                   int cols, bf16_t *local) {
    if (part < 0 || part >= l->num_parts)
        return mv_error("tp_linear_load: %s: part %d of a %s layer with %d part(s)", name, part,
                        tp_kind_name(l->kind), l->num_parts);
    int want_rows = l->part_out[part], want_cols = l->in_features;
    if (rows != want_rows || cols != want_cols)
        return mv_error("tp_linear_load: tensor %s has shape [%d, %d], expected [%d, %d] for a %s layer "
                        "(part %d)", name, rows, cols, want_rows, want_cols, tp_kind_name(l->kind), part);
    if (l->kind == TP_ROW) {
        // Every output row, this rank's slice of the input columns.
        size_t c0 = (size_t)l->tp_rank * l->in_local;
        for (int o = 0; o < rows; o++)
            memcpy(local + (size_t)o * l->in_local, full + (size_t)o * cols + c0,
                   (size_t)l->in_local * sizeof(bf16_t));
        return 0;
    }
    tp_segment_t seg[TP_MAX_PARTS];
    tp_linear_segments(l, seg);
    // The part's rows that belong to this rank, into their place in the local weight.
    int part_start = 0;
    for (int p = 0; p < part; p++) part_start += l->part_out[p];
    int first_row = seg[part].full_offset - part_start;
    memcpy(local + (size_t)seg[part].local_offset * cols, full + (size_t)first_row * cols,
           (size_t)seg[part].count * cols * sizeof(bf16_t));
    return 0;
}

int tp_linear_load_bias(const tp_linear_t *l, const char *name, int part, const bf16_t *full, int n,
                        bf16_t *local_bias) {
    if (part < 0 || part >= l->num_parts)
        return mv_error("tp_linear_load_bias: %s: part %d of a %s layer with %d part(s)", name, part,
                        tp_kind_name(l->kind), l->num_parts);
    if (n != l->part_out[part])
        return mv_error("tp_linear_load_bias: bias %s has %d elements, expected %d", name, n, l->part_out[part]);
    tp_segment_t seg[TP_MAX_PARTS];
    tp_linear_segments(l, seg);
    if (l->kind == TP_ROW || l->kind == TP_REPLICATED) {
        memcpy(local_bias, full, (size_t)n * sizeof(bf16_t));
        return 0;
    }
    int part_start = 0;
    for (int p = 0; p < part; p++) part_start += l->part_out[p];
    memcpy(local_bias + seg[part].local_offset, full + (seg[part].full_offset - part_start),
           (size_t)seg[part].count * sizeof(bf16_t));
    return 0;
}

int tp_linear_scatter_output(const tp_linear_t *l, const float *local, int M, float *full) {
    if (l->kind == TP_ROW) return mv_error("tp_linear_scatter_output: a row-parallel output is a partial sum");
    tp_segment_t seg[TP_MAX_PARTS];
    int ns = tp_linear_segments(l, seg);
    for (int m = 0; m < M; m++)
        for (int s = 0; s < ns; s++)
            memcpy(full + (size_t)m * l->out_features + seg[s].full_offset,
                   local + (size_t)m * l->out_local + seg[s].local_offset, (size_t)seg[s].count * sizeof(float));
    return 0;
}

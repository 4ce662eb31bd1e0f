/*
 * tests/test_qwen3_layout.c - Criterion tests of Qwen3's weight packing
 * (chapters/09-engine/model/qwen3_layout.h), the one description both
 * backends and every tensor-parallel rank pack their merged qkv_proj and
 * gate_up_proj by. Nothing here needs a GPU, so a change to the packing
 * fails on any machine:
 *
 *   - Qwen3-0.6B's shapes and row ranges, written out by hand (from its
 *     config.json in $MV_QWEN3_DIR or tests/data/qwen3-0.6b-shape, and from
 *     hard-coded numbers), unsharded and for rank 1 of tp 2;
 *   - the filled matrices of the real tiny checkpoints in tests/data/ equal
 *     the row-wise concatenation of their tensors, converted here with
 *     st_to_bf16 (the merged bias too, on in-memory weights with
 *     attention_bias);
 *   - at tp 2, each rank's matrices equal what chapter 03's shard loaders
 *     (tp_linear_load, tp_linear_load_bias) build;
 *   - the errors: a tp size that splits a KV head, a layout of another config.
 *
 * Run: make test  (or build/tests/test_qwen3_layout after make)
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chapters/03-linear-tp/linear_tp.h"
#include "chapters/09-engine/model/model_config.h"
#include "chapters/09-engine/model/qwen3_layout.h"
#include "chapters/09-engine/model/qwen3_weights.h"
#include "chapters/09-engine/model/safetensors.h"
#include "common/bf16.h"
#include "common/check.h"
#include "common/rng.h"

static const char *TINY[] = {"tests/data/tiny-qwen3-tied", "tests/data/tiny-qwen3-untied",
                             "tests/data/tiny-qwen3-mha"};
#define N_TINY (int)(sizeof TINY / sizeof TINY[0])

// ---- Qwen3-0.6B's layout, by hand ------------------------------------------------------

static void expect_piece(const qwen3_merged_t *m, int p, qwen3_source_t src, int src_rows, int src_row, int dst_row,
                         int rows) {
    const qwen3_piece_t *x = &m->piece[p];
    cr_expect(x->source == src && x->src_rows == src_rows && x->src_row == src_row && x->dst_row == dst_row &&
                  x->rows == rows,
              "%s piece %d: source %d, rows [%d, %d) of %d -> [%d, %d); expected source %d, rows [%d, %d) of %d -> "
              "[%d, %d)",
              m->name, p, (int)x->source, x->src_row, x->src_row + x->rows, x->src_rows, x->dst_row,
              x->dst_row + x->rows, (int)src, src_row, src_row + rows, src_rows, dst_row, dst_row + rows);
}

// H 1024, 16 query heads and 8 KV heads of 128, I 3072: q_proj [2048, 1024],
// k_proj and v_proj [1024, 1024], gate_proj and up_proj [3072, 1024].
static void expect_qwen3_0_6b(const qwen3_config_t *c) {
    cr_assert(c->hidden_size == 1024 && c->num_attention_heads == 16 && c->num_key_value_heads == 8 &&
                  c->head_dim == 128 && c->intermediate_size == 3072,
              "not Qwen3-0.6B's config: H %d, heads %d/%d, head_dim %d, I %d", c->hidden_size,
              c->num_attention_heads, c->num_key_value_heads, c->head_dim, c->intermediate_size);
    qwen3_layout_t lo;
    cr_assert_eq(qwen3_layout_init(&lo, c, 1, 0), 0, "%s", mv_last_error());
    cr_expect(lo.qkv.rows == 4096 && lo.qkv.cols == 1024, "qkv_proj is [%d, %d], expected [4096, 1024]", lo.qkv.rows,
              lo.qkv.cols);
    cr_assert_eq(lo.qkv.num_pieces, 3);
    expect_piece(&lo.qkv, QWEN3_PART_Q, QWEN3_Q_PROJ, 2048, 0, 0, 2048);     // q rows [0, 2048)
    expect_piece(&lo.qkv, QWEN3_PART_K, QWEN3_K_PROJ, 1024, 0, 2048, 1024);  // k rows [2048, 3072)
    expect_piece(&lo.qkv, QWEN3_PART_V, QWEN3_V_PROJ, 1024, 0, 3072, 1024);  // v rows [3072, 4096)
    cr_expect_eq(lo.qkv.has_bias, 0, "Qwen3 has no attention bias");
    cr_expect(lo.gate_up.rows == 6144 && lo.gate_up.cols == 1024, "gate_up_proj is [%d, %d], expected [6144, 1024]",
              lo.gate_up.rows, lo.gate_up.cols);
    cr_assert_eq(lo.gate_up.num_pieces, 2);
    expect_piece(&lo.gate_up, QWEN3_PART_GATE, QWEN3_GATE_PROJ, 3072, 0, 0, 3072);  // gate rows [0, 3072)
    expect_piece(&lo.gate_up, QWEN3_PART_UP, QWEN3_UP_PROJ, 3072, 0, 3072, 3072);   // up rows [3072, 6144)
    cr_expect_eq(lo.gate_up.has_bias, 0);

    // Rank 1 of 2: the second 8 query heads, the second 4 KV heads, the
    // second half of gate and of up, in the same order.
    cr_assert_eq(qwen3_layout_init(&lo, c, 2, 1), 0, "%s", mv_last_error());
    cr_expect(lo.qkv.rows == 2048 && lo.qkv.cols == 1024, "tp 2 qkv_proj is [%d, %d]", lo.qkv.rows, lo.qkv.cols);
    expect_piece(&lo.qkv, QWEN3_PART_Q, QWEN3_Q_PROJ, 2048, 1024, 0, 1024);
    expect_piece(&lo.qkv, QWEN3_PART_K, QWEN3_K_PROJ, 1024, 512, 1024, 512);
    expect_piece(&lo.qkv, QWEN3_PART_V, QWEN3_V_PROJ, 1024, 512, 1536, 512);
    cr_expect(lo.gate_up.rows == 3072 && lo.gate_up.cols == 1024, "tp 2 gate_up_proj is [%d, %d]", lo.gate_up.rows,
              lo.gate_up.cols);
    expect_piece(&lo.gate_up, QWEN3_PART_GATE, QWEN3_GATE_PROJ, 3072, 1536, 0, 1536);
    expect_piece(&lo.gate_up, QWEN3_PART_UP, QWEN3_UP_PROJ, 3072, 1536, 1536, 1536);
}

Test(qwen3_layout, qwen3_0_6b_hard_coded) {
    qwen3_config_t c = {.hidden_size = 1024, .num_attention_heads = 16, .num_key_value_heads = 8, .head_dim = 128,
                        .intermediate_size = 3072, .vocab_size = 151936};
    expect_qwen3_0_6b(&c);
}

// The real config.json: $MV_QWEN3_DIR when set, else the copy in tests/data.
Test(qwen3_layout, qwen3_0_6b_config_json) {
    const char *dir = getenv("MV_QWEN3_DIR");
    if (!dir || !*dir) dir = "tests/data/qwen3-0.6b-shape";
    qwen3_config_t c;
    cr_assert_eq(qwen3_config_load(dir, &c), 0, "%s", mv_last_error());
    expect_qwen3_0_6b(&c);
}

// Each piece's tensor is the projection chapter 03 gives that part number
// (tp_part_of: "q_proj" -> QKV part 0, "up_proj" -> merged part 1...).
Test(qwen3_layout, sources_are_chapter_03_parts) {
    qwen3_config_t c = {.hidden_size = 64, .num_attention_heads = 4, .num_key_value_heads = 2, .head_dim = 16,
                        .intermediate_size = 96, .vocab_size = 512};
    static const char *names[] = {"q_proj", "k_proj", "v_proj", "gate_proj", "up_proj"};
    qwen3_layout_t lo;
    cr_assert_eq(qwen3_layout_init(&lo, &c, 1, 0), 0, "%s", mv_last_error());
    const qwen3_merged_t *ms[] = {&lo.qkv, &lo.gate_up};
    for (int k = 0; k < 2; k++)
        for (int p = 0; p < ms[k]->num_pieces; p++) {
            tp_kind_t kind;
            int part;
            cr_assert_eq(tp_part_of(names[ms[k]->piece[p].source], &kind, &part), 0, "%s", mv_last_error());
            cr_expect(kind == ms[k]->tp.kind && part == p, "%s piece %d is %s, chapter 03's %s part %d", ms[k]->name,
                      p, names[ms[k]->piece[p].source], tp_kind_name(kind), part);
        }
}

// ---- filling from real checkpoints ------------------------------------------------------

typedef struct {
    qwen3_config_t c;
    st_model_t *m;
    qwen3_weights_t w;
} model_t;

static void open_model(const char *dir, model_t *mo) {
    cr_assert_eq(qwen3_config_load(dir, &mo->c), 0, "%s", mv_last_error());
    cr_assert_eq(st_open(dir, &mo->m), 0, "%s", mv_last_error());
    cr_assert_eq(qwen3_weights_bind(&mo->c, mo->m, &mo->w), 0, "%s", mv_last_error());
}

static void close_model(model_t *mo) {
    qwen3_weights_free(&mo->w);
    st_close(mo->m);
}

// n bf16 values set to NaN: a row the fill forgot stays NaN and fails memcmp.
static bf16_t *poisoned(size_t n) {
    bf16_t *p = malloc(n * sizeof *p);
    cr_assert_not_null(p);
    for (size_t i = 0; i < n; i++) p[i] = float_to_bf16(NAN);
    return p;
}

// The tensors, converted one by one and stacked: what a merged matrix must be.
static bf16_t *stacked(const st_tensor_t *const *ts, int n, size_t want) {
    bf16_t *out = poisoned(want);
    size_t off = 0;
    for (int k = 0; k < n; k++) {
        cr_assert(off + (size_t)st_numel(ts[k]) <= want, "%s does not fit", ts[k]->name);
        st_to_bf16(ts[k], out + off);
        off += (size_t)st_numel(ts[k]);
    }
    cr_assert_eq(off, want, "the tensors hold %zu values, the merged matrix %zu", off, want);
    return out;
}

// The pieces cover the merged rows [0, rows) in order, each exactly once
// (asserted before any fill writes through them).
static void assert_pieces_tile(const qwen3_merged_t *m) {
    int next = 0;
    for (int p = 0; p < m->num_pieces; p++) {
        cr_assert_eq(m->piece[p].dst_row, next, "%s piece %d starts at row %d, not %d", m->name, p,
                     m->piece[p].dst_row, next);
        next += m->piece[p].rows;
    }
    cr_assert_eq(next, m->rows, "%s: the pieces cover %d rows of %d", m->name, next, m->rows);
}

static void expect_fill_is_stack(const qwen3_merged_t *m, const qwen3_layer_weights_t *lw, const st_tensor_t *const *ts,
                                 int n, const char *where) {
    const size_t numel = (size_t)m->rows * m->cols;
    assert_pieces_tile(m);
    bf16_t *got = poisoned(numel), *want = stacked(ts, n, numel);
    cr_assert_eq(qwen3_merged_fill(m, lw, got), 0, "%s", mv_last_error());
    cr_expect_eq(memcmp(got, want, numel * sizeof *got), 0, "%s: %s is not its tensors stacked by rows", where,
                 m->name);
    free(got);
    free(want);
}

Test(qwen3_layout, fill_is_the_row_wise_concatenation) {
    for (int d = 0; d < N_TINY; d++) {
        model_t mo;
        open_model(TINY[d], &mo);
        qwen3_layout_t lo;
        cr_assert_eq(qwen3_layout_init(&lo, &mo.c, 1, 0), 0, "%s", mv_last_error());
        for (int l = 0; l < mo.w.n_layers; l++) {
            const qwen3_layer_weights_t *lw = &mo.w.layers[l];
            char where[128];
            snprintf(where, sizeof where, "%s layer %d", TINY[d], l);
            const st_tensor_t *qkv[] = {lw->q_proj, lw->k_proj, lw->v_proj}, *gate_up[] = {lw->gate_proj, lw->up_proj};
            expect_fill_is_stack(&lo.qkv, lw, qkv, 3, where);
            expect_fill_is_stack(&lo.gate_up, lw, gate_up, 2, where);
        }
        close_model(&mo);
    }
}

// ---- tensor parallelism: chapter 03 builds the same shards -------------------------------

// Rank r's matrix the way chapter 03 loads it: each whole tensor converted,
// then tp_linear_load puts the rank's rows in their place.
static bf16_t *chapter03_shard(const qwen3_merged_t *m, const qwen3_layer_weights_t *lw) {
    bf16_t *local = poisoned((size_t)m->rows * m->cols);
    for (int p = 0; p < m->num_pieces; p++) {
        const st_tensor_t *t = qwen3_source_weight(lw, m->piece[p].source);
        bf16_t *full = malloc((size_t)st_numel(t) * sizeof *full);
        cr_assert_not_null(full);
        st_to_bf16(t, full);
        cr_assert_eq(tp_linear_load(&m->tp, t->name, p, full, (int)t->shape[0], (int)t->shape[1], local), 0, "%s",
                     mv_last_error());
        free(full);
    }
    return local;
}

static void expect_shard_matches_chapter03(const qwen3_merged_t *m, const qwen3_layer_weights_t *lw,
                                           const char *where) {
    const size_t numel = (size_t)m->rows * m->cols;
    assert_pieces_tile(m);
    bf16_t *got = poisoned(numel), *want = chapter03_shard(m, lw);
    cr_assert_eq(qwen3_merged_fill(m, lw, got), 0, "%s", mv_last_error());
    cr_expect_eq(memcmp(got, want, numel * sizeof *got), 0, "%s: %s differs from chapter 03's shard", where,
                 m->name);
    free(got);
    free(want);
}

Test(qwen3_layout, tp2_shards_match_chapter_03) {
    // tiny-qwen3-tied: 4 query heads, 2 KV heads of 64; mha: 2 and 2 (untied has 1 KV head).
    const char *dirs[] = {"tests/data/tiny-qwen3-tied", "tests/data/tiny-qwen3-mha"};
    for (int d = 0; d < 2; d++) {
        model_t mo;
        open_model(dirs[d], &mo);
        const int qn = mo.c.num_attention_heads * mo.c.head_dim, H = mo.c.hidden_size;
        for (int rank = 0; rank < 2; rank++) {
            qwen3_layout_t lo;
            cr_assert_eq(qwen3_layout_init(&lo, &mo.c, 2, rank), 0, "%s", mv_last_error());
            cr_expect_eq(lo.qkv.rows, (qn + 2 * mo.c.num_key_value_heads * mo.c.head_dim) / 2);
            cr_expect_eq(lo.gate_up.rows, mo.c.intermediate_size);
            for (int l = 0; l < mo.w.n_layers; l++) {
                const qwen3_layer_weights_t *lw = &mo.w.layers[l];
                char where[128];
                snprintf(where, sizeof where, "%s tp 2 rank %d layer %d", dirs[d], rank, l);
                expect_shard_matches_chapter03(&lo.qkv, lw, where);
                expect_shard_matches_chapter03(&lo.gate_up, lw, where);
                // Said once more in plain words: rank r's first rows are
                // query heads [r nq/2, (r+1) nq/2), q_proj's r-th half.
                bf16_t *got = poisoned((size_t)lo.qkv.rows * H), *q = poisoned((size_t)qn * H);
                cr_assert_eq(qwen3_merged_fill(&lo.qkv, lw, got), 0, "%s", mv_last_error());
                st_to_bf16(lw->q_proj, q);
                cr_expect_eq(memcmp(got, q + (size_t)rank * (qn / 2) * H, (size_t)(qn / 2) * H * sizeof *q), 0,
                             "%s: the q rows are not q_proj's half %d", where, rank);
                free(got);
                free(q);
            }
        }
        close_model(&mo);
    }
}

// ---- the merged bias (attention_bias): in-memory weights ---------------------------------

Test(qwen3_layout, bias_fill_unsharded_and_tp2) {
    qwen3_config_t c;
    cr_assert_eq(qwen3_config_load("tests/data/tiny-qwen3-tied", &c), 0, "%s", mv_last_error());
    c.attention_bias = 1;
    st_model_t *m;
    cr_assert_eq(qwen3_weights_random(&c, 7, 0.02f, &m), 0, "%s", mv_last_error());
    // Random weights have zero biases (as HF initialises them); give them
    // values, or a bias copied from the wrong place would still compare equal.
    rng_t rng;
    rng_seed(&rng, 11);
    for (size_t i = 0; i < m->n_tensors; i++)
        if (strstr(m->tensors[i].name, "_proj.bias"))
            fill_uniform_bf16(&rng, st_model_data(m, &m->tensors[i]), (size_t)st_numel(&m->tensors[i]), -1, 1);
    qwen3_weights_t w;
    cr_assert_eq(qwen3_weights_bind(&c, m, &w), 0, "%s", mv_last_error());
    for (int l = 0; l < w.n_layers; l++) {
        const qwen3_layer_weights_t *lw = &w.layers[l];
        qwen3_layout_t lo;
        cr_assert_eq(qwen3_layout_init(&lo, &c, 1, 0), 0, "%s", mv_last_error());
        cr_assert_eq(lo.qkv.has_bias, 1);
        const st_tensor_t *biases[] = {lw->q_bias, lw->k_bias, lw->v_bias};
        bf16_t *got = poisoned((size_t)lo.qkv.rows), *want = stacked(biases, 3, (size_t)lo.qkv.rows);
        cr_assert_eq(qwen3_merged_fill_bias(&lo.qkv, lw, got), 0, "%s", mv_last_error());
        cr_expect_eq(memcmp(got, want, (size_t)lo.qkv.rows * sizeof *got), 0, "layer %d: the qkv bias", l);
        free(got);
        free(want);
        for (int rank = 0; rank < 2; rank++) {
            cr_assert_eq(qwen3_layout_init(&lo, &c, 2, rank), 0, "%s", mv_last_error());
            got = poisoned((size_t)lo.qkv.rows);
            want = poisoned((size_t)lo.qkv.rows);
            for (int p = 0; p < 3; p++) {
                bf16_t full[1024];
                cr_assert((size_t)st_numel(biases[p]) <= sizeof full / sizeof *full);
                st_to_bf16(biases[p], full);
                cr_assert_eq(tp_linear_load_bias(&lo.qkv.tp, biases[p]->name, p, full, (int)st_numel(biases[p]), want),
                             0, "%s", mv_last_error());
            }
            cr_assert_eq(qwen3_merged_fill_bias(&lo.qkv, lw, got), 0, "%s", mv_last_error());
            cr_expect_eq(memcmp(got, want, (size_t)lo.qkv.rows * sizeof *got), 0,
                         "layer %d tp 2 rank %d: the qkv bias differs from chapter 03's", l, rank);
            free(got);
            free(want);
        }
    }
    qwen3_weights_free(&w);
    st_close(m);
}

// ---- errors -----------------------------------------------------------------------------

Test(qwen3_layout, tp_that_splits_a_kv_head_is_refused) {
    // 12 query heads, 4 KV heads at tp 6: 6 neither divides 4 nor is a multiple of it.
    qwen3_config_t c = {.hidden_size = 64, .num_attention_heads = 12, .num_key_value_heads = 4, .head_dim = 16,
                        .intermediate_size = 96, .vocab_size = 512};
    qwen3_layout_t lo;
    cr_assert_eq(qwen3_layout_init(&lo, &c, 6, 0), -1);
    cr_expect(strstr(mv_last_error(), "qkv_proj") && strstr(mv_last_error(), "num_key_value_heads"), "%s",
              mv_last_error());
}

Test(qwen3_layout, tp_above_the_kv_heads_copies_them) {
    // tiny-qwen3-untied: 4 query heads, 1 KV head. At tp 2 rank 1 holds query
    // heads 2..3 and a copy of KV head 0, and the row-parallel and vocabulary
    // shares are halves.
    qwen3_config_t c;
    cr_assert_eq(qwen3_config_load("tests/data/tiny-qwen3-untied", &c), 0, "%s", mv_last_error());
    qwen3_layout_t lo;
    cr_assert_eq(qwen3_layout_init(&lo, &c, 2, 1), 0, "%s", mv_last_error());
    const int hd = c.head_dim;
    cr_expect_eq(lo.qkv.rows, (2 + 2 * 1) * hd);
    cr_expect_eq(lo.qkv.piece[QWEN3_PART_Q].src_row, 2 * hd);
    cr_expect_eq(lo.qkv.piece[QWEN3_PART_K].src_row, 0);
    cr_expect_eq(lo.qkv.piece[QWEN3_PART_V].rows, hd);
    cr_expect_eq(lo.o_proj.in_local, 2 * hd);
    cr_expect_eq(lo.down.in_local, c.intermediate_size / 2);
    cr_expect_eq(lo.vocab.start, c.vocab_size / 2);
    cr_expect_eq(lo.vocab.local_rows, c.vocab_size / 2);
}

Test(qwen3_layout, layout_of_another_config_is_refused) {
    model_t mo;
    open_model("tests/data/tiny-qwen3-tied", &mo);
    qwen3_config_t big = {.hidden_size = 1024, .num_attention_heads = 16, .num_key_value_heads = 8, .head_dim = 128,
                          .intermediate_size = 3072, .vocab_size = 151936};
    qwen3_layout_t lo;
    cr_assert_eq(qwen3_layout_init(&lo, &big, 1, 0), 0, "%s", mv_last_error());
    bf16_t *dst = poisoned((size_t)lo.qkv.rows * lo.qkv.cols);
    cr_assert_eq(qwen3_merged_fill(&lo.qkv, &mo.w.layers[0], dst), -1);
    cr_expect(strstr(mv_last_error(), "model.layers.0.self_attn.q_proj.weight") &&
                  strstr(mv_last_error(), "[2048, 1024]"),
              "%s", mv_last_error());
    cr_expect_eq(qwen3_merged_fill_bias(&lo.qkv, &mo.w.layers[0], dst), -1, "a layout without a bias");
    free(dst);
    close_model(&mo);
}

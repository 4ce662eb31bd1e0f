/*
 * chapters/03-linear-tp/main.c - Chapter 03: linear layers sharded for tensor
 * parallelism (replicated, column, merged column, QKV, row), over cuBLAS and NCCL.
 *
 * What it checks:
 *   1. The CPU reference GEMM (reference/linear.c) against hand-computed
 *      values and a float64 formula.
 *   2. A CPU simulation of tp = 1, 2, 4 and 8 ranks: every rank's shard is
 *      cut from the full checkpoint tensors by tp_linear_load(), and the
 *      concatenated column outputs and the summed row partials must equal
 *      the unsharded layer. Bad sharding (tp not dividing the heads) and bad
 *      tensor shapes must be rejected. This half always runs (CI).
 *   3. On the GPU, Qwen3-0.6B's projections (qkv, o, gate_up, down) plus a
 *      replicated layer and biased column/row layers: with N >= 2 visible
 *      GPUs, tp = N over NCCL, one rank per GPU, every rank checked against
 *      the CPU; with one GPU, tp = 1 and the tp = 2 arithmetic with both
 *      shards on that GPU. Each case runs linear_cuda (the engine's call,
 *      which picks a version) and each version forced: cuBLAS (v1) and the
 *      small-M GEMVs (v2, v3) wherever they take the shape.
 *   4. The GEMVs on small odd shapes (M = 1..16 for v2, 1..32 for v3, odd
 *      N, K from 8 to 16384, with and without bias), their refusals (K % 8
 *      != 0, misaligned x or W, M > 16 for v2, M > 32 for v3) with cuBLAS
 *      taking over, and linear_cuda's choice.
 *   4b. The down projection with SiluAndMul folded into the GEMV
 *      (linear_silu_mul_cuda): bit for bit the unfused pair, and against
 *      the CPU; both again under programmatic dependent launch.
 *   5. Timing: TFLOP/s and GB/s of cuBLAS at M = 1, 8, 64, 256 decode
 *      tokens and 4096, 16384 prefill tokens; with 2+ GPUs also each rank's
 *      shard and the all-reduce of the hidden-size activations (time and bus
 *      bandwidth). Then small M (1..64): cuBLAS against the GEMV, timed as a
 *      decode step runs them, back to back in a CUDA graph.
 *
 * Build and run:  make && ./build/03-linear-tp [--json FILE] [--help]
 * Exit status: 0 if every check passed, 1 if any failed, 2 on bad arguments.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chapters/03-linear-tp/linear_tp.h"
#include "common/bf16.h"
#include "common/check.h"
#include "common/compare.h"
#include "common/harness.h"
#include "common/rng.h"
#include "kernels/versions.h"
#include "reference/linear.h"
#if MV_HAVE_CUDA
#include "common/tp_group.h"
#include "kernels/activation.h"
#include "kernels/linear.h"
#include "kernels/pdl.h"
#endif

static const tolerance_t TOL_HAND = {1e-12, 1e-6, 1e-12,
    "small integers and halves: every product and sum is exact in fp32"};
static const tolerance_t TOL_F64 = {1e-6, 1e-5, 1e-11,
    "fp32 dot products of length K against float64: about sqrt(K) roundings of 2^-24 times "
    "sum|x*w|, under 1e-6 here"};
static const tolerance_t TOL_EXACT = {0, 0, 0,
    "a column shard computes the very same dot products, in the same order, as the unsharded "
    "layer: the results must be identical"};
static const tolerance_t TOL_ROW_CPU = {1e-5, 1e-5, 1e-10,
    "row partials summed in another order than the full dot product: fp32 roundings of "
    "~2^-24 * sum|x*w|, about 1e-6 at these sizes"};

// ---- layer descriptions ---------------------------------------------------------------

typedef struct {
    const char *name;   // shown in tables
    tp_kind_t kind;
    int in, out;        // full layer
    int parts[3];       // part rows (merged: gate, up; qkv: computed from heads)
    int num_parts;
    int heads, kv_heads, head_dim;  // qkv
    int bias;           // has a bias
} layer_spec_t;

static int make_layer(const layer_spec_t *s, int tp, int rank, tp_linear_t *l) {
    switch (s->kind) {
    case TP_REPLICATED: return tp_linear_replicated(l, s->in, s->out, tp, rank);
    case TP_COLUMN: return tp_linear_column(l, s->in, s->out, tp, rank);
    case TP_MERGED_COLUMN: return tp_linear_merged_column(l, s->in, s->parts, s->num_parts, tp, rank);
    case TP_QKV: return tp_linear_qkv(l, s->in, s->heads, s->kv_heads, s->head_dim, tp, rank);
    case TP_ROW: return tp_linear_row(l, s->in, s->out, tp, rank);
    }
    return mv_error("unknown layer kind");
}

// The full checkpoint tensors of a layer: one per part (q, k, v / gate, up / W).
typedef struct {
    tp_linear_t full;           // the tp = 1 view
    bf16_t *part_w[3];          // [part_out[p], in]
    bf16_t *part_b[3];          // [part_out[p]] or NULL
    bf16_t *W, *b;              // the unsharded layer: parts stacked, [out, in] and [out]
    const char *part_name[3];
} layer_weights_t;

static const char *part_tensor_name(const layer_spec_t *s, int p) {
    static const char *qkv[3] = {"q_proj", "k_proj", "v_proj"}, *mlp[2] = {"gate_proj", "up_proj"};
    if (s->kind == TP_QKV) return qkv[p];
    if (s->kind == TP_MERGED_COLUMN) return mlp[p];
    return s->name;
}

// Weights ~ U(-1/sqrt(in), 1/sqrt(in)), as nn.Linear initialises them, so
// outputs stay O(1) at any K; biases ~ U(-0.5, 0.5).
static void make_weights(layer_weights_t *lw, const layer_spec_t *s, rng_t *rng) {
    memset(lw, 0, sizeof *lw);
    MV_CHECK(make_layer(s, 1, 0, &lw->full));
    const tp_linear_t *l = &lw->full;
    float a = 1.0f / sqrtf((float)l->in_features);
    lw->W = malloc((size_t)l->out_features * l->in_features * sizeof(bf16_t));
    lw->b = s->bias ? malloc((size_t)l->out_features * sizeof(bf16_t)) : NULL;
    if (!lw->W || (s->bias && !lw->b)) mv_die_at(__FILE__, __LINE__, "malloc", "out of host memory");
    size_t row = 0;
    for (int p = 0; p < l->num_parts; p++) {
        size_t n = (size_t)l->part_out[p] * l->in_features;
        lw->part_w[p] = malloc(n * sizeof(bf16_t));
        if (!lw->part_w[p]) mv_die_at(__FILE__, __LINE__, "malloc", "out of host memory");
        fill_uniform_bf16(rng, lw->part_w[p], n, -a, a);
        memcpy(lw->W + row * l->in_features, lw->part_w[p], n * sizeof(bf16_t));
        if (s->bias) {
            lw->part_b[p] = malloc((size_t)l->part_out[p] * sizeof(bf16_t));
            if (!lw->part_b[p]) mv_die_at(__FILE__, __LINE__, "malloc", "out of host memory");
            fill_uniform_bf16(rng, lw->part_b[p], (size_t)l->part_out[p], -0.5f, 0.5f);
            memcpy(lw->b + row, lw->part_b[p], (size_t)l->part_out[p] * sizeof(bf16_t));
        }
        lw->part_name[p] = part_tensor_name(s, p);
        row += (size_t)l->part_out[p];
    }
}

static void free_weights(layer_weights_t *lw) {
    for (int p = 0; p < 3; p++) {
        free(lw->part_w[p]);
        free(lw->part_b[p]);
    }
    free(lw->W);
    free(lw->b);
}

// Rank r's weight [out_local, in_local] and bias, cut from the checkpoint tensors.
static void load_shard(const tp_linear_t *l, const layer_weights_t *lw, bf16_t *w, bf16_t *b) {
    for (int p = 0; p < l->num_parts; p++) {
        MV_CHECK(tp_linear_load(l, lw->part_name[p], p, lw->part_w[p], l->part_out[p], l->in_features, w));
        if (b && lw->part_b[p])
            MV_CHECK(tp_linear_load_bias(l, lw->part_name[p], p, lw->part_b[p], l->part_out[p], b));
    }
}

// A rank's input: the full x for column kinds, its column slice for row-parallel.
static void rank_input(const tp_linear_t *l, const float *x, int M, float *x_local) {
    int c0 = l->kind == TP_ROW ? l->tp_rank * l->in_local : 0;
    for (int m = 0; m < M; m++)
        memcpy(x_local + (size_t)m * l->in_local, x + (size_t)m * l->in_features + c0, sizeof(float) * l->in_local);
}

// ---- 1. and 2. the CPU half --------------------------------------------------------------

static void check_hand_values(harness_t *h) {
    // x = [1, 2]; W = [[1, 0], [0, 1], [1, 1]]; b = [0.5, 0, -1]  ->  [1.5, 2, 2]
    float x[2] = {1, 2}, out[3];
    float wf[6] = {1, 0, 0, 1, 1, 1}, bfl[3] = {0.5f, 0, -1};
    bf16_t w[6], b[3];
    float_to_bf16_array(w, wf, 6);
    float_to_bf16_array(b, bfl, 3);
    double expected[3] = {1.5, 2, 2};
    MV_CHECK(linear_cpu(out, x, w, b, 1, 3, 2, 1));
    harness_check(h, "cpu", "hand-values", "linear_cpu", "M=1 N=3 K=2",
                  compare_f64("hand", out, expected, 3, TOL_HAND, 0), TOL_HAND);
}

static void check_f64(harness_t *h, rng_t *rng, int M, int N, int K, int with_bias) {
    float *x = malloc(sizeof(float) * M * K), *out = malloc(sizeof(float) * M * N);
    bf16_t *w = malloc(sizeof(bf16_t) * N * K), *b = malloc(sizeof(bf16_t) * N);
    double *e = malloc(sizeof(double) * M * N);
    if (!x || !out || !w || !b || !e) mv_die_at(__FILE__, __LINE__, "malloc", "out of host memory");
    fill_normal_f32(rng, x, (size_t)M * K, 0, 1);
    fill_uniform_bf16(rng, w, (size_t)N * K, -1.0f / sqrtf(K), 1.0f / sqrtf(K));
    fill_uniform_bf16(rng, b, (size_t)N, -0.5f, 0.5f);
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            double s = with_bias ? bf16_to_float(b[n]) : 0.0;
            for (int k = 0; k < K; k++) s += (double)x[(size_t)m * K + k] * bf16_to_float(w[(size_t)n * K + k]);
            e[(size_t)m * N + n] = s;
        }
    poison_host(out, sizeof(float) * M * N);
    MV_CHECK(linear_cpu(out, x, w, with_bias ? b : NULL, M, N, K, 0));
    char shape[64];
    snprintf(shape, sizeof shape, "M=%d N=%d K=%d%s", M, N, K, with_bias ? " +bias" : "");
    harness_check(h, "cpu", "float64", "linear_cpu", shape, compare_f64("linear", out, e, (size_t)M * N, TOL_F64, 0), TOL_F64);
    free(x); free(out); free(w); free(b); free(e);
}

// The tp simulation: each rank's shard through linear_cpu, then the
// column outputs scattered into place and the row partials summed.
static void simulate_tp(harness_t *h, rng_t *rng, const layer_spec_t *s, int tp, int M) {
    layer_weights_t lw;
    make_weights(&lw, s, rng);
    const tp_linear_t *full = &lw.full;
    float *x = malloc(sizeof(float) * M * full->in_features);
    float *ref = malloc(sizeof(float) * M * full->out_features), *got = calloc((size_t)M * full->out_features, sizeof(float));
    if (!x || !ref || !got) mv_die_at(__FILE__, __LINE__, "malloc", "out of host memory");
    fill_normal_f32(rng, x, (size_t)M * full->in_features, 0, 1);
    MV_CHECK(linear_cpu(ref, x, lw.W, lw.b, M, full->out_features, full->in_features, 0));

    char shape[96], label[64];
    snprintf(shape, sizeof shape, "tp=%d M=%d %dx%d", tp, M, full->out_features, full->in_features);
    snprintf(label, sizeof label, "%s (%s)", s->name, tp_kind_name(s->kind));
    tp_linear_t l;
    if (make_layer(s, tp, 0, &l)) {
        harness_check_bool(h, "cpu", "tp-sim", label, 0, mv_last_error());
        goto out;
    }
    if (s->kind != TP_ROW) poison_host(got, sizeof(float) * M * full->out_features);
    for (int r = 0; r < tp; r++) {
        MV_CHECK(make_layer(s, tp, r, &l));
        bf16_t *w = malloc(sizeof(bf16_t) * l.out_local * l.in_local), *b = malloc(sizeof(bf16_t) * l.out_local);
        float *xl = malloc(sizeof(float) * M * l.in_local), *yl = malloc(sizeof(float) * M * l.out_local);
        if (!w || !b || !xl || !yl) mv_die_at(__FILE__, __LINE__, "malloc", "out of host memory");
        load_shard(&l, &lw, w, s->bias ? b : NULL);
        rank_input(&l, x, M, xl);
        // Row-parallel: no bias in the partials; it is added once, after the sum.
        MV_CHECK(linear_cpu(yl, xl, w, s->bias && s->kind != TP_ROW ? b : NULL, M, l.out_local, l.in_local, 1));
        if (s->kind == TP_ROW)
            for (size_t i = 0; i < (size_t)M * l.out_local; i++) got[i] += yl[i];
        else
            MV_CHECK(tp_linear_scatter_output(&l, yl, M, got));
        free(w); free(b); free(xl); free(yl);
    }
    if (s->kind == TP_ROW && s->bias)
        for (int m = 0; m < M; m++)
            for (int n = 0; n < full->out_features; n++) got[(size_t)m * full->out_features + n] += bf16_to_float(lw.b[n]);
    tolerance_t tol = s->kind == TP_ROW && tp > 1 ? TOL_ROW_CPU : TOL_EXACT;
    harness_check(h, "cpu", "tp-sim", label, shape,
                  compare_f32(label, got, ref, (size_t)M * full->out_features, tol, 0), tol);
out:
    free(x); free(ref); free(got);
    free_weights(&lw);
}

static void check_rejections(harness_t *h) {
    tp_linear_t l;
    char detail[320];
    // tp = 3 does not divide Qwen3-0.6B's 16 query heads.
    int rc = tp_linear_qkv(&l, 1024, 16, 8, 128, 3, 0);
    snprintf(detail, sizeof detail, "tp=3, 16 heads: %s", rc ? mv_last_error() : "accepted (wrong)");
    harness_check_bool(h, "cpu", "reject", "qkv heads % tp", rc != 0 && strstr(mv_last_error(), "num_attention_heads"), detail);
    // tp = 12 divides 24 query heads, but neither divides 8 kv heads nor is a
    // multiple of them (tp = 16 would replicate them, as vLLM does).
    rc = tp_linear_qkv(&l, 1024, 24, 8, 128, 12, 0);
    snprintf(detail, sizeof detail, "tp=12, 8 kv heads: %s", rc ? mv_last_error() : "accepted (wrong)");
    harness_check_bool(h, "cpu", "reject", "qkv kv_heads % tp", rc != 0 && strstr(mv_last_error(), "num_key_value_heads"), detail);
    // A k_proj of the wrong shape is an error naming the tensor.
    MV_CHECK(tp_linear_qkv(&l, 64, 4, 2, 16, 2, 1));
    bf16_t *w = calloc(64 * 64, sizeof(bf16_t)), *dst = calloc((size_t)l.out_local * l.in_local, sizeof(bf16_t));
    if (!w || !dst) mv_die_at(__FILE__, __LINE__, "calloc", "out of host memory");
    rc = tp_linear_load(&l, "model.layers.0.self_attn.k_proj.weight", 1, w, 64, 64, dst);
    snprintf(detail, sizeof detail, "%s", rc ? mv_last_error() : "accepted (wrong)");
    harness_check_bool(h, "cpu", "reject", "tensor shape", rc != 0 && strstr(mv_last_error(), "k_proj"), detail);
    free(w);
    free(dst);
    // Row-parallel needs tp to divide in_features.
    rc = tp_linear_row(&l, 3072, 1024, 5, 0);
    snprintf(detail, sizeof detail, "%s", rc ? mv_last_error() : "accepted (wrong)");
    harness_check_bool(h, "cpu", "reject", "row in % tp", rc != 0, detail);
    // Names map to layer kinds; unknown names are refused.
    tp_kind_t kind;
    int part;
    rc = tp_part_of("model.layers.27.mlp.up_proj.weight", &kind, &part);
    harness_check_bool(h, "cpu", "names", "up_proj -> merged part 1", rc == 0 && kind == TP_MERGED_COLUMN && part == 1, "");
    rc = tp_part_of("model.layers.0.self_attn.qq_proj.weight", &kind, &part);
    harness_check_bool(h, "cpu", "names", "unknown projection", rc != 0, rc ? mv_last_error() : "accepted (wrong)");
}

#if MV_HAVE_CUDA  // the GPU half's layers (a CPU-only build would warn they are unused)
// Qwen3-0.6B: hidden 1024, 16 q heads, 8 kv heads, head_dim 128, intermediate 3072.
static const layer_spec_t QWEN3_LAYERS[] = {
    {"qkv_proj", TP_QKV, 1024, 4096, {0}, 3, 16, 8, 128, 0},
    {"o_proj", TP_ROW, 2048, 1024, {1024}, 1, 0, 0, 0, 0},
    {"gate_up_proj", TP_MERGED_COLUMN, 1024, 6144, {3072, 3072}, 2, 0, 0, 0, 0},
    {"down_proj", TP_ROW, 3072, 1024, {1024}, 1, 0, 0, 0, 0},
};
// The other kinds, and biases (Qwen3 has none; other models do).
static const layer_spec_t OTHER_LAYERS[] = {
    {"replicated", TP_REPLICATED, 1024, 512, {512}, 1, 0, 0, 0, 0},
    {"column+bias", TP_COLUMN, 1024, 2048, {2048}, 1, 0, 0, 0, 1},
    {"row+bias", TP_ROW, 2048, 1024, {1024}, 1, 0, 0, 0, 1},
};
#endif
// Small shapes for the CPU simulation (tp up to 8: 16 q heads, 8 kv heads).
static const layer_spec_t SMALL_LAYERS[] = {
    {"qkv_proj", TP_QKV, 256, 512, {0}, 3, 16, 8, 16, 0},
    {"o_proj", TP_ROW, 256, 256, {256}, 1, 0, 0, 0, 0},
    {"gate_up_proj", TP_MERGED_COLUMN, 256, 1024, {512, 512}, 2, 0, 0, 0, 0},
    {"down_proj", TP_ROW, 512, 256, {256}, 1, 0, 0, 0, 0},
    {"replicated", TP_REPLICATED, 256, 96, {96}, 1, 0, 0, 0, 0},
    {"column+bias", TP_COLUMN, 256, 512, {512}, 1, 0, 0, 0, 1},
    {"row+bias", TP_ROW, 512, 256, {256}, 1, 0, 0, 0, 1},
};

// ---- 3., 4. and 5. the GPU half ---------------------------------------------------------
#if MV_HAVE_CUDA
// One bf16 rounding of an fp32 sum: the same numbers for both versions;
// only the order of the fp32 additions, which the reason names, differs.
static tolerance_t tol_one_rounding(double ref_rms, int version) {
    return (tolerance_t){1e-5 * ref_rms + 1e-6, BF16_HALF_ULP + 1e-5, BF16_HALF_ULP * BF16_HALF_ULP * 1.01,
        version == LINEAR_GEMV
            ? "bf16 output: half an ulp, 2^-8 relative; the GEMV's fp32 accumulation order (each lane "
              "over its chunks, a 32-lane tree, then the warps that split K) differs from the CPU's by "
              "~sqrt(K) * 2^-24 * sum|x*w|, far below that"
        : version == LINEAR_GEMV_MMA
            ? "bf16 output: half an ulp, 2^-8 relative; the tensor cores' fp32 sums (MMA after MMA over "
              "slices of K, the slices added in order) differ from the CPU's order by ~sqrt(K) * 2^-24 * "
              "sum|x*w|, far below that"
        : version == LINEAR_TILE
            ? "bf16 output: half an ulp, 2^-8 relative; the tiled GEMM's fp32 sums (MMA after MMA over "
              "its blocks' slices of K, the slices added in order) differ from the CPU's order by "
              "~sqrt(K) * 2^-24 * sum|x*w|, far below that"
            : "bf16 output: half an ulp, 2^-8 relative; cuBLAS's fp32 accumulation order differs from "
              "the CPU's by ~sqrt(K) * 2^-24 * sum|x*w|, far below that"};
}

// Tolerances on the GPU are built per case: their absolute part scales
// with the output's RMS. version: the one that ran (v1, v2 or v3).
static tolerance_t tol_gpu(const layer_spec_t *s, int tp, double ref_rms, int version) {
    if (s->kind == TP_ROW && tp > 1)
        return (tolerance_t){4 * BF16_HALF_ULP * ref_rms, BF16_HALF_ULP, (tp + 1) * BF16_HALF_ULP * BF16_HALF_ULP,
            "each rank's partial sum is rounded to bf16 before the all-reduce (as vLLM does), and "
            "the bias is added to the rounded sum, so the error scales with the partials (about "
            "the output's RMS, up to 4 sigma), not with each output: atol = 4 * 2^-8 * RMS(ref); "
            "tp + 1 roundings bound the NMSE"};
    return tol_one_rounding(ref_rms, version);
}

typedef struct {
    tp_group_t *g;
    int rank;
    tp_linear_t l;
    bf16_t *d_x, *d_w, *d_b, *d_y;  // on the rank's device
    int M;
} rank_buf_t;

// The layer on every rank with one version: GEMM on every rank; row-parallel
// then all-reduces and adds the bias once.
static void run_layer(tp_group_t *g, const layer_spec_t *s, rank_buf_t *rb, int M, int version) {
    int tp = g->size;
    bf16_t *outs[TP_GROUP_MAX];
    for (int r = 0; r < tp; r++) {
        MV_CHECK(tp_set_rank(g, r));
        // Row-parallel with tp > 1: the bias waits until after the all-reduce,
        // or every rank would add it.
        const bf16_t *bias = s->kind == TP_ROW && tp > 1 ? NULL : rb[r].d_b;
        MV_CHECK(linear_cuda_version(version, g->cublas[r], rb[r].d_y, rb[r].d_x, rb[r].d_w, bias, M,
                                     rb[r].l.out_local, rb[r].l.in_local, g->streams[r]));
        outs[r] = rb[r].d_y;
    }
    if (s->kind == TP_ROW && tp > 1) MV_CHECK(tp_all_reduce_bf16(g, outs, (size_t)M * rb[0].l.out_local));
    if (s->kind == TP_ROW && s->bias && tp > 1)
        for (int r = 0; r < tp; r++) {
            MV_CHECK(tp_set_rank(g, r));
            MV_CHECK(add_bias_cuda(rb[r].d_y, rb[r].d_b, M, rb[r].l.out_local, g->streams[r]));
        }
    MV_CHECK(tp_sync(g));
}

// Run one layer on every rank of g at M tokens and check each rank.
// Rows [0, M) of x are random; the CPU reference covers rows check_rows
// (every row, or a sample for large M).
// Versions: linear_cuda itself (LINEAR_AUTO, the engine's call) under the
// case's own label; then, labelled by version, cuBLAS forced where
// linear_cuda chose a GEMV (so cuBLAS stays checked at small M), and each
// GEMV (v2, v3) forced wherever it takes the shape.
static void run_and_check(harness_t *h, tp_group_t *g, const layer_spec_t *s, const layer_weights_t *lw,
                          const bf16_t *x_bf, const float *x_f, int M, const float *ref, const int *rows, int n_rows,
                          const char *mode) {
    int tp = g->size;
    rank_buf_t rb[TP_GROUP_MAX];
    (void)x_f;
    for (int r = 0; r < tp; r++) {
        rank_buf_t *b = &rb[r];
        b->g = g;
        b->rank = r;
        b->M = M;
        MV_CHECK(make_layer(s, tp, r, &b->l));
        size_t nw = (size_t)b->l.out_local * b->l.in_local;
        bf16_t *w = malloc(nw * sizeof(bf16_t)), *bias = malloc((size_t)b->l.out_local * sizeof(bf16_t));
        bf16_t *xl = malloc((size_t)M * b->l.in_local * sizeof(bf16_t));
        if (!w || !bias || !xl) mv_die_at(__FILE__, __LINE__, "malloc", "out of host memory");
        load_shard(&b->l, lw, w, s->bias ? bias : NULL);
        int c0 = b->l.kind == TP_ROW ? r * b->l.in_local : 0;
        for (int m = 0; m < M; m++)
            memcpy(xl + (size_t)m * b->l.in_local, x_bf + (size_t)m * b->l.in_features + c0, b->l.in_local * sizeof(bf16_t));
        MV_CHECK(tp_set_rank(g, r));
        b->d_w = gpu_alloc(nw * sizeof(bf16_t));
        b->d_b = s->bias ? gpu_alloc((size_t)b->l.out_local * sizeof(bf16_t)) : NULL;
        b->d_x = gpu_alloc((size_t)M * b->l.in_local * sizeof(bf16_t));
        b->d_y = gpu_alloc((size_t)M * b->l.out_local * sizeof(bf16_t));
        gpu_upload(b->d_w, w, nw * sizeof(bf16_t));
        if (s->bias) gpu_upload(b->d_b, bias, (size_t)b->l.out_local * sizeof(bf16_t));
        gpu_upload(b->d_x, xl, (size_t)M * b->l.in_local * sizeof(bf16_t));
        CUDA_CHECK(cudaDeviceSynchronize());
        free(w); free(bias); free(xl);
    }
    // Every rank has the same M, N, K and alignment, so rank 0 speaks for all.
    const int auto_version =
        linear_auto_version(g->cublas[0], rb[0].d_x, rb[0].d_w, M, rb[0].l.out_local, rb[0].l.in_local);
    int gemv_applies = 1, mma_applies = 1, tile_applies = 1;
    for (int r = 0; r < tp; r++) {
        gemv_applies &= linear_gemv_applies(rb[r].d_x, rb[r].d_w, M, rb[r].l.in_local);
        mma_applies &= linear_gemv_mma_applies(rb[r].d_x, rb[r].d_w, M, rb[r].l.in_local);
        tile_applies &= linear_tile_applies(g->cublas[r], rb[r].d_x, rb[r].d_w, M, rb[r].l.out_local,
                                            rb[r].l.in_local);
    }

    int N = lw->full.out_features;
    double ss = 0;
    for (int i = 0; i < n_rows; i++)
        for (int n = 0; n < N; n++) ss += (double)ref[(size_t)i * N + n] * ref[(size_t)i * N + n];
    double rms = sqrt(ss / ((double)n_rows * N));
    const int versions[5] = {LINEAR_AUTO, LINEAR_CUBLAS, LINEAR_GEMV, LINEAR_GEMV_MMA, LINEAR_TILE};
    for (int vi = 0; vi < 5; vi++) {
        const int v = versions[vi];
        if (v == LINEAR_CUBLAS && auto_version == LINEAR_CUBLAS) continue;  // the auto run was cuBLAS
        if (v == LINEAR_GEMV && !gemv_applies) continue;
        if (v == LINEAR_GEMV_MMA && !mma_applies) continue;
        if (v == LINEAR_TILE && !tile_applies) continue;
        if (!harness_kernel_wanted(h, v == LINEAR_AUTO ? auto_version : v)) continue;  // --kernel N: what ran is N
        for (int r = 0; r < tp; r++) {
            MV_CHECK(tp_set_rank(g, r));
            gpu_poison(rb[r].d_y, (size_t)M * rb[r].l.out_local * sizeof(bf16_t));
            CUDA_CHECK(cudaDeviceSynchronize());
        }
        run_layer(g, s, rb, M, v);

        // Check each rank: its output columns against the same columns of the reference.
        tolerance_t tol = tol_gpu(s, tp, rms, v == LINEAR_AUTO ? auto_version : v);
        for (int r = 0; r < tp; r++) {
            const tp_linear_t *l = &rb[r].l;
            bf16_t *y = malloc((size_t)M * l->out_local * sizeof(bf16_t));
            bf16_t *got = malloc((size_t)n_rows * l->out_local * sizeof(bf16_t));
            float *want = malloc((size_t)n_rows * l->out_local * sizeof(float));
            if (!y || !got || !want) mv_die_at(__FILE__, __LINE__, "malloc", "out of host memory");
            MV_CHECK(tp_set_rank(g, r));
            gpu_download(y, rb[r].d_y, (size_t)M * l->out_local * sizeof(bf16_t));
            tp_segment_t seg[TP_MAX_PARTS];
            int ns = tp_linear_segments(l, seg);
            for (int i = 0; i < n_rows; i++) {
                memcpy(got + (size_t)i * l->out_local, y + (size_t)rows[i] * l->out_local, l->out_local * sizeof(bf16_t));
                for (int k = 0; k < ns; k++)
                    memcpy(want + (size_t)i * l->out_local + seg[k].local_offset, ref + (size_t)i * N + seg[k].full_offset,
                           seg[k].count * sizeof(float));
            }
            char label[96], shape[128];
            const char *sampled = n_rows < M ? " (rows sampled)" : "";
            if (v == LINEAR_AUTO) {
                snprintf(label, sizeof label, "%s %s rank %d/%d", s->name, mode, r, tp);
                snprintf(shape, sizeof shape, "M=%d %dx%d%s", M, N, lw->full.in_features, sampled);
            } else {
                snprintf(label, sizeof label, "%s %s", linear_version_name(v), mode);
                snprintf(shape, sizeof shape, "%s rank %d/%d M=%d %dx%d%s", s->name, r, tp, M, N,
                         lw->full.in_features, sampled);
            }
            harness_check(h, "gpu", tp_kind_name(s->kind), label, shape,
                          compare_bf16(label, got, want, (size_t)n_rows * l->out_local, tol, 0), tol);
            free(y); free(got); free(want);
        }
    }
    for (int r = 0; r < tp; r++) {
        MV_CHECK(tp_set_rank(g, r));
        gpu_free(rb[r].d_w); gpu_free(rb[r].d_b); gpu_free(rb[r].d_x); gpu_free(rb[r].d_y);
    }
    MV_CHECK(tp_set_rank(g, 0));
}

// One layer at one M: random x, the CPU reference on the checked rows, then
// every group (real and/or simulated).
static void check_layer(harness_t *h, rng_t *rng, const layer_spec_t *s, int M, tp_check_groups_t *groups) {
    layer_weights_t lw;
    make_weights(&lw, s, rng);
    int K = lw.full.in_features, N = lw.full.out_features;
    bf16_t *x = malloc((size_t)M * K * sizeof(bf16_t));
    float *xf = malloc((size_t)M * K * sizeof(float));
    if (!x || !xf) mv_die_at(__FILE__, __LINE__, "malloc", "out of host memory");
    fill_normal_bf16(rng, x, (size_t)M * K, 0, 1);
    bf16_to_float_array(xf, x, (size_t)M * K);
    // Large M: a sample of rows (first, last, and a stride between) keeps the
    // CPU reference to seconds; every row is still computed on the GPU.
    int stride = M >= 16384 ? 32 : M >= 4096 ? 8 : 1;
    int n_rows = 0, *rows = malloc(sizeof(int) * (size_t)(M / stride + 2));
    float *xs = malloc((size_t)(M / stride + 2) * K * sizeof(float));
    float *ref = malloc((size_t)(M / stride + 2) * N * sizeof(float));
    if (!rows || !xs || !ref) mv_die_at(__FILE__, __LINE__, "malloc", "out of host memory");
    int last = 0;
    for (int m = 0; m < M; m += stride) rows[n_rows++] = last = m;
    if (last != M - 1) rows[n_rows++] = M - 1;
    for (int i = 0; i < n_rows; i++) memcpy(xs + (size_t)i * K, xf + (size_t)rows[i] * K, K * sizeof(float));
    MV_CHECK(linear_cpu(ref, xs, lw.W, lw.b, n_rows, N, K, 0));
    for (int gi = 0; gi < groups->n; gi++) {
        tp_group_t *g = &groups->group[gi];
        // A layer whose shapes the group's tp does not divide is skipped, and said so.
        tp_linear_t probe;
        if (make_layer(s, g->size, 0, &probe)) {
            char detail[300];
            snprintf(detail, sizeof detail, "skipped: %s", mv_last_error());
            harness_check_bool(h, "gpu", tp_kind_name(s->kind), s->name, 1, detail);
            continue;
        }
        run_and_check(h, g, s, &lw, x, xf, M, ref, rows, n_rows, groups->mode[gi]);
    }
    free(x); free(xf); free(rows); free(xs); free(ref);
    free_weights(&lw);
}

// ---- 4. the small-M GEMV on odd shapes, its refusals, and linear_cuda's choice -----------

typedef struct {
    int M, N, K, bias;
    int x_off, w_off;  // elements past a 16-byte aligned allocation (1: misaligned)
    const char *why;   // what the case exercises
} small_m_case_t;

// Chunks are 16 bytes (8 bf16), slabs 32 chunks; ks warps share a row (kernels/linear.cu).
static const small_m_case_t SMALL_M_CASES[] = {
    {1, 1, 8, 0, 0, 0, "the smallest: one row, one chunk"},
    {1, 3, 8, 1, 0, 0, "odd N below one row pair per warp"},
    {2, 7, 16, 0, 0, 0, "two chunks"},
    {3, 33, 264, 1, 0, 0, "33 chunks: one slab and one chunk"},
    {4, 515, 1000, 0, 0, 0, "125 chunks: a short last slab"},
    {7, 1001, 1024, 1, 0, 0, "one batch of 4 slabs, odd N, bias"},
    {8, 999, 3072, 0, 0, 0, "ks = 4, the batch's last slab empty"},
    {8, 4097, 2048, 1, 0, 0, "ks = 2, one row past a full block"},
    {5, 77, 8200, 1, 0, 0, "ks = 8 and a second batch of one chunk"},
    {1, 2049, 16384, 0, 0, 0, "ks = 8, two full batches per warp"},
    {11, 301, 1024, 1, 0, 0, "M past linear_cuda's threshold"},
    {16, 129, 520, 0, 0, 0, "the GEMV's largest M"},
    // The GEMV refuses these; cuBLAS, and so linear_cuda, must still be right.
    {2, 33, 100, 0, 0, 0, "K % 8 != 0"},
    {1, 64, 1020, 1, 0, 0, "K % 8 != 0"},
    {3, 65, 1024, 0, 1, 0, "x one element off 16 bytes"},
    {3, 65, 1024, 0, 0, 1, "W one element off 16 bytes"},
    {17, 64, 256, 0, 0, 0, "M past the GEMV's 16"},
    // Version 3 past 8 tokens: groups of 8, each its own MMAs on the same W.
    {9, 300, 1000, 1, 0, 0, "version 3's second group, one token in it"},
    {24, 1024, 2048, 0, 0, 0, "three groups: o_proj at 24 rows"},
    {29, 77, 264, 1, 0, 0, "four groups, the last short; odd N"},
    {32, 1024, 3072, 0, 0, 0, "version 3's largest M: down_proj at 32 rows"},
    {20, 65, 1024, 0, 1, 0, "x one element off 16 bytes, past 16 tokens"},
    {33, 64, 256, 0, 0, 0, "M past version 3's 32"},
    // Version 4, the tiled GEMM, takes any M: token tiles of 16 to 64, K split
    // over blocks where 64-row tiles are few.
    {100, 1024, 3072, 1, 0, 0, "two token tiles, K split over 8 blocks, bias"},
    {130, 8200, 136, 0, 0, 0, "three token tiles, 129 row tiles (no split), a short chunk"},
    {77, 96, 4104, 1, 0, 0, "two row tiles, the second short: K split 13 ways"},
    {40, 4096, 1024, 0, 0, 0, "qkv_proj at 40 rows: a tile of 48 tokens, K split in 2"},
};

// Elements after y, poisoned: a store past the end shows there.
#define Y_GUARD 64

static int guard_intact(const bf16_t *g, int n) {
    for (int i = 0; i < n; i++)
        if (g[i] != POISON_BF16) return 0;
    return 1;
}

static int any_poison(const bf16_t *y, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (y[i] == POISON_BF16) return 1;
    return 0;
}

// What a refusal by version v (2, 3 or 4) must name: the value that is wrong
// (version 4 takes any M).
static void expected_refusal(const small_m_case_t *c, int v, char *buf, size_t n) {
    if (v != LINEAR_TILE && c->M > (v == LINEAR_GEMV_MMA ? LINEAR_GEMV_MMA_MAX_M : LINEAR_GEMV_MAX_M))
        snprintf(buf, n, "M = %d", c->M);
    else if (c->K % 8) snprintf(buf, n, "K = %d", c->K);
    else if (c->w_off) snprintf(buf, n, "W (");
    else snprintf(buf, n, "x (");
}

static void check_small_m(harness_t *h, cublasHandle_t handle, rng_t *rng, const small_m_case_t *c) {
    const int M = c->M, N = c->N, K = c->K;
    size_t nx = (size_t)M * K, nw = (size_t)N * K, ny = (size_t)M * N;
    bf16_t *x = malloc(nx * sizeof(bf16_t)), *w = malloc(nw * sizeof(bf16_t)), *b = malloc(N * sizeof(bf16_t));
    bf16_t *y = malloc((ny + Y_GUARD) * sizeof(bf16_t));
    float *xf = malloc(nx * sizeof(float)), *ref = malloc(ny * sizeof(float));
    if (!x || !w || !b || !y || !xf || !ref) mv_die_at(__FILE__, __LINE__, "malloc", "out of host memory");
    fill_normal_bf16(rng, x, nx, 0, 1);
    fill_uniform_bf16(rng, w, nw, -1.0f / sqrtf((float)K), 1.0f / sqrtf((float)K));
    fill_uniform_bf16(rng, b, (size_t)N, -0.5f, 0.5f);
    bf16_to_float_array(xf, x, nx);
    MV_CHECK(linear_cpu(ref, xf, w, c->bias ? b : NULL, M, N, K, 0));
    double ss = 0;
    for (size_t i = 0; i < ny; i++) ss += (double)ref[i] * ref[i];
    const double rms = sqrt(ss / (double)ny);

    bf16_t *x_base = gpu_alloc((nx + 8) * sizeof(bf16_t)), *w_base = gpu_alloc((nw + 8) * sizeof(bf16_t));
    bf16_t *d_b = gpu_alloc(N * sizeof(bf16_t)), *d_y = gpu_alloc((ny + Y_GUARD) * sizeof(bf16_t));
    bf16_t *d_x = x_base + c->x_off, *d_w = w_base + c->w_off;
    gpu_upload(d_x, x, nx * sizeof(bf16_t));
    gpu_upload(d_w, w, nw * sizeof(bf16_t));
    gpu_upload(d_b, b, N * sizeof(bf16_t));

    char shape[128];
    snprintf(shape, sizeof shape, "M=%d N=%d K=%d%s%s%s: %s", M, N, K, c->bias ? " +bias" : "",
             c->x_off ? " x+1" : "", c->w_off ? " W+1" : "", c->why);
    const int applies = linear_gemv_applies(d_x, d_w, M, K), applies3 = linear_gemv_mma_applies(d_x, d_w, M, K);
    const int applies4 = linear_tile_applies(handle, d_x, d_w, M, N, K);
    const int auto_version = linear_auto_version(handle, d_x, d_w, M, N, K);
    const int over = linear_gemv_max_m_override();
    const int max_m = over >= 0 ? over : LINEAR_GEMV_AUTO_MAX_M;
    const int forced = linear_gemv_forced();
    // A GEMV up to max_m where one takes the shape: version 3 from its
    // threshold (or forced), version 2 below it or forced; past max_m
    // version 4 up to its own limit where it takes the shape; cuBLAS otherwise.
    const int want_auto = M > max_m ? (M <= linear_tile_auto_max_m() && applies4 ? LINEAR_TILE : LINEAR_CUBLAS)
                          : forced == LINEAR_GEMV ? (applies ? LINEAR_GEMV : LINEAR_CUBLAS)
                          : applies3 && (forced == LINEAR_GEMV_MMA || M >= LINEAR_GEMV_MMA_AUTO_MIN_M) ? LINEAR_GEMV_MMA
                          : applies ? LINEAR_GEMV
                                    : LINEAR_CUBLAS;
    char detail[320];
    snprintf(detail, sizeof detail, "%s: picks %s", shape, linear_version_name(auto_version));
    harness_check_bool(h, "gpu", "small-m", "linear_cuda's choice", auto_version == want_auto, detail);

    const int versions[5] = {LINEAR_CUBLAS, LINEAR_GEMV, LINEAR_GEMV_MMA, LINEAR_TILE, LINEAR_AUTO};
    for (int vi = 0; vi < 5; vi++) {
        const int v = versions[vi];
        const int ran = v == LINEAR_AUTO ? auto_version : v;
        if (!harness_kernel_wanted(h, ran)) continue;  // --kernel N: what runs is version N
        char label[64];
        snprintf(label, sizeof label, "%s", v == LINEAR_AUTO ? "linear_cuda (auto)" : linear_version_name(v));
        gpu_poison(d_y, (ny + Y_GUARD) * sizeof(bf16_t));
        CUDA_CHECK(cudaDeviceSynchronize());
        int rc = linear_cuda_version(v, handle, d_y, d_x, d_w, c->bias ? d_b : NULL, M, N, K, 0);
        if ((v == LINEAR_GEMV && !applies) || (v == LINEAR_GEMV_MMA && !applies3) || (v == LINEAR_TILE && !applies4)) {
            // Refused, with an error that names the wrong value; nothing launched.
            char named[64], what[64];
            expected_refusal(c, v, named, sizeof named);
            snprintf(detail, sizeof detail, "%s: %s", shape, rc ? mv_last_error() : "accepted (wrong)");
            snprintf(what, sizeof what, "%s refuses", linear_version_name(v));
            harness_check_bool(h, "gpu", "small-m", what, rc != 0 && strstr(mv_last_error(), named), detail);
            continue;
        }
        if (rc) {
            snprintf(detail, sizeof detail, "%s: %s", shape, mv_last_error());
            harness_check_bool(h, "gpu", "small-m", label, 0, detail);
            continue;
        }
        CUDA_CHECK(cudaDeviceSynchronize());
        gpu_download(y, d_y, (ny + Y_GUARD) * sizeof(bf16_t));
        tolerance_t tol = tol_one_rounding(rms, ran);
        harness_check(h, "gpu", "small-m", label, shape, compare_bf16(label, y, ref, ny, tol, 0), tol);
        snprintf(detail, sizeof detail, "%s %s: the %d bf16 after y %s", label, shape, Y_GUARD,
                 guard_intact(y + ny, Y_GUARD) ? "untouched" : "written (an overrun)");
        harness_check_bool(h, "gpu", "small-m", "no store past y", guard_intact(y + ny, Y_GUARD), detail);
    }
    gpu_free(x_base); gpu_free(w_base); gpu_free(d_b); gpu_free(d_y);
    free(x); free(w); free(b); free(y); free(xf); free(ref);
}

// The GEMV's sums do not depend on M or N (kernels/linear.cu: the warps that
// split K depend on K alone): a batch's first rows must equal, bit for bit,
// the same tokens run as a batch of 1 and of 3, two later tokens (for
// version 3 in its third and fourth groups of 8) the same token run alone,
// and a layer's first columns the same weight rows run as a narrower layer
// (whose blocks hold fewer rows). M is the version's largest. Version 4's
// sums do not depend on M either (M = 100: two token tiles, the second
// short; the later tokens in it), but do on N, which sets how many blocks
// split K: its N check is left out.
static void check_gemv_invariance(harness_t *h, cublasHandle_t handle, rng_t *rng, int version) {
    const int M = version == LINEAR_TILE ? 100 : version == LINEAR_GEMV_MMA ? LINEAR_GEMV_MMA_MAX_M : LINEAR_GEMV_MAX_M,
              N = 2049, K = 3072, N_narrow = 130;
    const int later[2] = {M / 2 + 1, M - 1};
    bf16_t *x = malloc((size_t)M * K * sizeof(bf16_t)), *w = malloc((size_t)N * K * sizeof(bf16_t));
    bf16_t *b = malloc(N * sizeof(bf16_t)), *yM = malloc((size_t)M * N * sizeof(bf16_t));
    bf16_t *y1 = malloc(N * sizeof(bf16_t)), *y3 = malloc(3 * (size_t)N * sizeof(bf16_t));
    bf16_t *yn = malloc((size_t)M * N_narrow * sizeof(bf16_t));
    if (!x || !w || !b || !yM || !y1 || !y3 || !yn) mv_die_at(__FILE__, __LINE__, "malloc", "out of host memory");
    fill_normal_bf16(rng, x, (size_t)M * K, 0, 1);
    fill_uniform_bf16(rng, w, (size_t)N * K, -1.0f / sqrtf((float)K), 1.0f / sqrtf((float)K));
    fill_uniform_bf16(rng, b, (size_t)N, -0.5f, 0.5f);
    bf16_t *d_x = gpu_alloc((size_t)M * K * sizeof(bf16_t)), *d_w = gpu_alloc((size_t)N * K * sizeof(bf16_t));
    bf16_t *d_b = gpu_alloc(N * sizeof(bf16_t)), *d_yM = gpu_alloc((size_t)M * N * sizeof(bf16_t));
    bf16_t *d_y1 = gpu_alloc(N * sizeof(bf16_t)), *d_y3 = gpu_alloc(3 * (size_t)N * sizeof(bf16_t));
    bf16_t *d_yn = gpu_alloc((size_t)M * N_narrow * sizeof(bf16_t));
    gpu_upload(d_x, x, (size_t)M * K * sizeof(bf16_t));
    gpu_upload(d_w, w, (size_t)N * K * sizeof(bf16_t));
    gpu_upload(d_b, b, N * sizeof(bf16_t));
    gpu_poison(d_yM, (size_t)M * N * sizeof(bf16_t));
    gpu_poison(d_y1, N * sizeof(bf16_t));
    gpu_poison(d_y3, 3 * (size_t)N * sizeof(bf16_t));
    gpu_poison(d_yn, (size_t)M * N_narrow * sizeof(bf16_t));
    CUDA_CHECK(cudaDeviceSynchronize());
    MV_CHECK(linear_cuda_version(version, handle, d_yM, d_x, d_w, d_b, M, N, K, 0));
    MV_CHECK(linear_cuda_version(version, handle, d_y1, d_x, d_w, d_b, 1, N, K, 0));
    MV_CHECK(linear_cuda_version(version, handle, d_y3, d_x, d_w, d_b, 3, N, K, 0));
    MV_CHECK(linear_cuda_version(version, handle, d_yn, d_x, d_w, d_b, M, N_narrow, K, 0));
    CUDA_CHECK(cudaDeviceSynchronize());
    gpu_download(yM, d_yM, (size_t)M * N * sizeof(bf16_t));
    gpu_download(y1, d_y1, N * sizeof(bf16_t));
    gpu_download(y3, d_y3, 3 * (size_t)N * sizeof(bf16_t));
    gpu_download(yn, d_yn, (size_t)M * N_narrow * sizeof(bf16_t));
    // Poison left anywhere would make two unwritten outputs look "identical".
    int same_m = !any_poison(yM, (size_t)M * N) && !memcmp(y1, yM, N * sizeof(bf16_t)) &&
                 !memcmp(y3, yM, 3 * (size_t)N * sizeof(bf16_t));
    for (int i = 0; i < 2; i++) {  // token later[i] alone: x from its row (K % 8 == 0: still 16-byte aligned)
        gpu_poison(d_y1, N * sizeof(bf16_t));
        MV_CHECK(linear_cuda_version(version, handle, d_y1, d_x + (size_t)later[i] * K, d_w, d_b, 1, N, K, 0));
        CUDA_CHECK(cudaDeviceSynchronize());
        gpu_download(y1, d_y1, N * sizeof(bf16_t));
        same_m &= !memcmp(y1, yM + (size_t)later[i] * N, N * sizeof(bf16_t));
    }
    int same_n = !any_poison(yM, (size_t)M * N);
    for (int m = 0; m < M; m++) same_n &= !memcmp(yn + (size_t)m * N_narrow, yM + (size_t)m * N, N_narrow * sizeof(bf16_t));
    char detail[200], label[64];
    snprintf(detail, sizeof detail, "N=%d K=%d +bias: tokens 0..2 at M = 1, 3 and %d, tokens %d and %d at M = 1 and %d %s",
             N, K, M, later[0], later[1], M, same_m ? "identical" : "DIFFER");
    snprintf(label, sizeof label, "%s same bits at any M", linear_version_name(version));
    harness_check_bool(h, "gpu", "small-m", label, same_m, detail);
    snprintf(detail, sizeof detail, "M=%d K=%d +bias: columns 0..%d at N = %d and %d %s", M, K, N_narrow - 1, N_narrow, N,
             same_n ? "identical" : "DIFFER");
    snprintf(label, sizeof label, "%s same bits at any N", linear_version_name(version));
    if (version != LINEAR_TILE) harness_check_bool(h, "gpu", "small-m", label, same_n, detail);
    gpu_free(d_x); gpu_free(d_w); gpu_free(d_b); gpu_free(d_yM); gpu_free(d_y1); gpu_free(d_y3); gpu_free(d_yn);
    free(x); free(w); free(b); free(yM); free(y1); free(y3); free(yn);
}

// ---- 4b. the down projection with SiluAndMul folded in, and PDL ----------------------------
//
// linear_silu_mul_cuda reads gate_up [M, 2K] and computes x = SiluAndMul
// (gate_up) chunk by chunk as it streams W. It must give, bit for bit, what
// silu_and_mul_cuda (the engine's version) into a [M, K] buffer followed by
// the GEMV gives; and that against the CPU: linear_cpu over the activations
// the GPU computed (chapter 01 checks those against silu_and_mul_cpu). Both
// are then run again with programmatic dependent launch on (kernels/pdl.h),
// the unfused pair launched back to back so that a GEMV that read x before
// the SiluAndMul kernel had written it would see the poison left there.
typedef struct {
    int M, N, K;
    const char *why;
} silu_gemv_case_t;

static const silu_gemv_case_t SILU_GEMV_CASES[] = {
    {1, 1024, 3072, "Qwen3-0.6B down_proj, one decode token"},
    {8, 1024, 3072, "down_proj at M = 8"},
    {3, 77, 264, "odd N, 33 chunks"},
    {16, 129, 1000, "the GEMV's largest M, a short last slab"},
    {5, 301, 8200, "ks = 8 and a second batch"},
    {24, 1024, 3072, "down_proj at 24 rows: version 3's three groups"},
    {32, 129, 1000, "version 3's largest M, a short last slab"},
};

// The CPU reference over the activations silu_and_mul_cuda wrote (d_act,
// [M, K]; chapter 01 checks those against silu_and_mul_cpu): ref = act W^T
// in fp32. Returns the reference's RMS, for the tolerance.
static double act_reference(const bf16_t *d_act, bf16_t *act, float *actf, const bf16_t *w, float *ref, int M, int N,
                            int K) {
    const size_t na = (size_t)M * K, ny = (size_t)M * N;
    gpu_download(act, d_act, na * sizeof(bf16_t));
    bf16_to_float_array(actf, act, na);
    MV_CHECK(linear_cpu(ref, actf, w, NULL, M, N, K, 0));
    double ss = 0;
    for (size_t i = 0; i < ny; i++) ss += (double)ref[i] * ref[i];
    return sqrt(ss / (double)ny);
}

static void check_silu_gemv(harness_t *h, cublasHandle_t handle, rng_t *rng, const silu_gemv_case_t *c, int pdl,
                            int version) {
    const int M = c->M, N = c->N, K = c->K;
    const size_t ngu = (size_t)M * 2 * K, na = (size_t)M * K, nw = (size_t)N * K, ny = (size_t)M * N;
    bf16_t *gu = malloc(ngu * sizeof(bf16_t)), *w = malloc(nw * sizeof(bf16_t)), *act = malloc(na * sizeof(bf16_t));
    bf16_t *y_fused = malloc((ny + Y_GUARD) * sizeof(bf16_t)), *y_plain = malloc(ny * sizeof(bf16_t));
    float *actf = malloc(na * sizeof(float)), *ref = malloc(ny * sizeof(float));
    if (!gu || !w || !act || !y_fused || !y_plain || !actf || !ref)
        mv_die_at(__FILE__, __LINE__, "malloc", "out of host memory");
    fill_normal_bf16(rng, gu, ngu, 0, 2);
    fill_uniform_bf16(rng, w, nw, -1.0f / sqrtf((float)K), 1.0f / sqrtf((float)K));
    bf16_t *d_gu = gpu_alloc(ngu * sizeof(bf16_t)), *d_w = gpu_alloc(nw * sizeof(bf16_t));
    bf16_t *d_act = gpu_alloc(na * sizeof(bf16_t)), *d_yf = gpu_alloc((ny + Y_GUARD) * sizeof(bf16_t));
    bf16_t *d_yp = gpu_alloc(ny * sizeof(bf16_t));
    gpu_upload(d_gu, gu, ngu * sizeof(bf16_t));
    gpu_upload(d_w, w, nw * sizeof(bf16_t));
    gpu_poison(d_act, na * sizeof(bf16_t));
    gpu_poison(d_yf, (ny + Y_GUARD) * sizeof(bf16_t));
    gpu_poison(d_yp, ny * sizeof(bf16_t));
    CUDA_CHECK(cudaDeviceSynchronize());
    if (pdl) MV_CHECK(mv_pdl_set(1));
    const int rc_fused = linear_silu_mul_cuda_version(version, d_yf, d_gu, d_w, M, N, K, 0);
    const int rc_plain = silu_and_mul_cuda(SILU_AND_MUL_FAST, d_act, d_gu, M, K, 0) ||
                         linear_cuda_version(version, handle, d_yp, d_act, d_w, NULL, M, N, K, 0);
    if (pdl) MV_CHECK(mv_pdl_set(0));
    char shape[160], detail[320], label[64];
    snprintf(shape, sizeof shape, "M=%d N=%d K=%d%s: %s", M, N, K, pdl ? " (PDL on)" : "", c->why);
    snprintf(label, sizeof label, "%s + silu_and_mul%s", linear_version_name(version), pdl ? ", PDL" : "");
    if (rc_fused || rc_plain) {
        snprintf(detail, sizeof detail, "%s: %s", shape, mv_last_error());
        harness_check_bool(h, "gpu", "silu-gemv", label, 0, detail);
    } else {
        CUDA_CHECK(cudaDeviceSynchronize());
        gpu_download(y_fused, d_yf, (ny + Y_GUARD) * sizeof(bf16_t));
        gpu_download(y_plain, d_yp, ny * sizeof(bf16_t));
        const tolerance_t tol = tol_one_rounding(act_reference(d_act, act, actf, w, ref, M, N, K), version);
        harness_check(h, "gpu", "silu-gemv", label, shape, compare_bf16(label, y_fused, ref, ny, tol, 0), tol);
        const int same = !any_poison(y_plain, ny) && !memcmp(y_fused, y_plain, ny * sizeof(bf16_t));
        snprintf(detail, sizeof detail, "%s: linear_silu_mul_cuda against silu_and_mul_cuda + the GEMV: %s", shape,
                 same ? "identical" : "DIFFER");
        harness_check_bool(h, "gpu", "silu-gemv", "fused = unfused, bit for bit", same, detail);
        snprintf(detail, sizeof detail, "%s: the %d bf16 after y %s", shape, Y_GUARD,
                 guard_intact(y_fused + ny, Y_GUARD) ? "untouched" : "written (an overrun)");
        harness_check_bool(h, "gpu", "silu-gemv", "no store past y", guard_intact(y_fused + ny, Y_GUARD), detail);
    }
    gpu_free(d_gu); gpu_free(d_w); gpu_free(d_act); gpu_free(d_yf); gpu_free(d_yp);
    free(gu); free(w); free(act); free(y_fused); free(y_plain); free(actf); free(ref);
}

// What linear_silu_mul_cuda refuses, naming the value.
static void check_silu_gemv_refusals(harness_t *h) {
    const struct {
        int M, N, K;
        const char *named;
    } bad[] = {{33, 64, 256, "M = 33"}, {2, 64, 100, "K = 100"}, {1, 0, 64, "N"}};
    bf16_t *d_a = gpu_alloc(4096 * sizeof(bf16_t)), *d_b = gpu_alloc(4096 * sizeof(bf16_t));
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        const int rc = linear_silu_mul_cuda(d_a, d_b, d_b, bad[i].M, bad[i].N, bad[i].K, 0);
        char detail[256];
        snprintf(detail, sizeof detail, "M=%d N=%d K=%d: %s", bad[i].M, bad[i].N, bad[i].K,
                 rc ? mv_last_error() : "accepted (wrong)");
        harness_check_bool(h, "gpu", "silu-gemv", "refuses", rc != 0 && strstr(mv_last_error(), bad[i].named), detail);
    }
    gpu_free(d_a); gpu_free(d_b);
}

// Version 4 under programmatic dependent launch: silu_and_mul_cuda writes
// the activations and version 4 reads them, launched back to back with PDL
// on, over poisoned activations; a tile that read x before its wait (it
// issues W's loads before it) would see the poison. Then the same two with
// PDL off: the same bits, and both against the CPU. And version 4 with
// SiluAndMul folded in (linear_silu_mul_tile_cuda), PDL on, right after the
// kernel that writes its gate_up, as in a decode step: version 4 itself,
// times an identity matrix (x I^T = x exactly), over a poisoned gate_up.
// It must give the same bits as the two kernels.
static void check_tile_pdl(harness_t *h, cublasHandle_t handle, rng_t *rng, int M, int N, int K, const char *why) {
    const size_t ngu = (size_t)M * 2 * K, na = (size_t)M * K, nw = (size_t)N * K, ny = (size_t)M * N;
    bf16_t *gu = malloc(ngu * sizeof(bf16_t)), *w = malloc(nw * sizeof(bf16_t)), *act = malloc(na * sizeof(bf16_t));
    bf16_t *y_pdl = malloc(ny * sizeof(bf16_t)), *y_plain = malloc(ny * sizeof(bf16_t));
    bf16_t *y_fused = malloc(ny * sizeof(bf16_t));
    float *actf = malloc(na * sizeof(float)), *ref = malloc(ny * sizeof(float));
    if (!gu || !w || !act || !y_pdl || !y_plain || !y_fused || !actf || !ref)
        mv_die_at(__FILE__, __LINE__, "malloc", "out of host memory");
    fill_normal_bf16(rng, gu, ngu, 0, 2);
    fill_uniform_bf16(rng, w, nw, -1.0f / sqrtf((float)K), 1.0f / sqrtf((float)K));
    bf16_t *d_gu = gpu_alloc(ngu * sizeof(bf16_t)), *d_w = gpu_alloc(nw * sizeof(bf16_t));
    bf16_t *d_act = gpu_alloc(na * sizeof(bf16_t)), *d_y = gpu_alloc(ny * sizeof(bf16_t));
    bf16_t *d_gu2 = gpu_alloc(ngu * sizeof(bf16_t));
    gpu_upload(d_gu, gu, ngu * sizeof(bf16_t));
    gpu_upload(d_w, w, nw * sizeof(bf16_t));
    char shape[160], detail[320];
    snprintf(shape, sizeof shape, "M=%d N=%d K=%d: %s", M, N, K, why);
    int rc = 0;
    for (int pdl = 1; pdl >= 0 && !rc; pdl--) {
        gpu_poison(d_act, na * sizeof(bf16_t));
        gpu_poison(d_y, ny * sizeof(bf16_t));
        CUDA_CHECK(cudaDeviceSynchronize());
        if (pdl) MV_CHECK(mv_pdl_set(1));
        rc = silu_and_mul_cuda(SILU_AND_MUL_FAST, d_act, d_gu, M, K, 0) ||
             linear_cuda_version(LINEAR_TILE, handle, d_y, d_act, d_w, NULL, M, N, K, 0);
        if (pdl) MV_CHECK(mv_pdl_set(0));
        if (!rc) {
            CUDA_CHECK(cudaDeviceSynchronize());
            gpu_download(pdl ? y_pdl : y_plain, d_y, ny * sizeof(bf16_t));
        }
    }
    if (!rc) {
        const size_t ne = (size_t)2 * K * 2 * K;
        bf16_t *eye = calloc(ne, sizeof(bf16_t)), *d_eye = gpu_alloc(ne * sizeof(bf16_t));
        if (!eye) mv_die_at(__FILE__, __LINE__, "malloc", "out of host memory");
        for (int i = 0; i < 2 * K; i++) eye[(size_t)i * 2 * K + i] = float_to_bf16(1.0f);
        gpu_upload(d_eye, eye, ne * sizeof(bf16_t));
        free(eye);
        gpu_poison(d_gu2, ngu * sizeof(bf16_t));
        gpu_poison(d_y, ny * sizeof(bf16_t));
        CUDA_CHECK(cudaDeviceSynchronize());
        MV_CHECK(mv_pdl_set(1));
        rc = linear_cuda_version(LINEAR_TILE, handle, d_gu2, d_gu, d_eye, NULL, M, 2 * K, 2 * K, 0) ||
             linear_silu_mul_tile_cuda(handle, d_y, d_gu2, d_w, M, N, K, 0);
        MV_CHECK(mv_pdl_set(0));
        CUDA_CHECK(cudaDeviceSynchronize());
        gpu_free(d_eye);
        if (!rc) {
            CUDA_CHECK(cudaDeviceSynchronize());
            gpu_download(y_fused, d_y, ny * sizeof(bf16_t));
        }
    }
    if (rc) {
        snprintf(detail, sizeof detail, "%s: %s", shape, mv_last_error());
        harness_check_bool(h, "gpu", "tile-pdl", "v4-tile after silu_and_mul", 0, detail);
    } else {
        const tolerance_t tol = tol_one_rounding(act_reference(d_act, act, actf, w, ref, M, N, K), LINEAR_TILE);
        harness_check(h, "gpu", "tile-pdl", "v4-tile after silu_and_mul, PDL", shape,
                      compare_bf16("v4-tile PDL", y_pdl, ref, ny, tol, 0), tol);
        const int same = !any_poison(y_pdl, ny) && !memcmp(y_pdl, y_plain, ny * sizeof(bf16_t));
        snprintf(detail, sizeof detail, "%s: with PDL against without: %s", shape, same ? "identical" : "DIFFER");
        harness_check_bool(h, "gpu", "tile-pdl", "PDL on = off, bit for bit", same, detail);
        const int same_f = !any_poison(y_fused, ny) && !memcmp(y_fused, y_plain, ny * sizeof(bf16_t));
        snprintf(detail, sizeof detail, "%s: linear_silu_mul_tile_cuda (PDL) against silu_and_mul_cuda + v4-tile: %s",
                 shape, same_f ? "identical" : "DIFFER");
        harness_check_bool(h, "gpu", "tile-pdl", "fused = unfused, bit for bit", same_f, detail);
    }
    gpu_free(d_gu); gpu_free(d_gu2); gpu_free(d_w); gpu_free(d_act); gpu_free(d_y);
    free(gu); free(w); free(act); free(y_pdl); free(y_plain); free(y_fused); free(actf); free(ref);
}

// Version 4's workspace (linear_set_workspace) for a handle of this chapter,
// on the current device: enough for every Qwen3-0.6B projection up to 256
// tokens (gate_up_proj at 256: 2 x 256 x 6144 fp32, 12.6 MB). Larger M
// with a split K is not version 4's to take here (linear_tile_applies).
#define TILE_WS_BYTES (32u << 20)
static void *tile_workspace(cublasHandle_t handle) {
    void *ws = gpu_alloc(TILE_WS_BYTES);
    MV_CHECK(linear_set_workspace(handle, ws, TILE_WS_BYTES));
    return ws;
}
static void tile_workspace_free(cublasHandle_t handle, void *ws) {
    MV_CHECK(linear_set_workspace(handle, NULL, 0));
    gpu_free(ws);
}

typedef struct {
    cublasHandle_t handle;
    int version;
    bf16_t *d_y, *d_x, *d_w;
    int M, N, K;
} gemm_ctx_t;

static int run_gemm(void *p, cudaStream_t s) {
    gemm_ctx_t *c = p;
    return linear_cuda_version(c->version, c->handle, c->d_y, c->d_x, c->d_w, NULL, c->M, c->N, c->K, s);
}

// Time one GEMM of rank 0's shard (tp = 1: the whole layer) on GPU 0, one
// launch per timed run; cuBLAS (version 1) forced, so these rows stay
// cuBLAS's whatever linear_cuda would pick.
static void time_gemm(harness_t *h, cublasHandle_t handle, rng_t *rng, const char *case_name, const char *label,
                      int M, int N, int K) {
    gemm_ctx_t c = {handle, LINEAR_CUBLAS, NULL, NULL, NULL, M, N, K};
    size_t nx = (size_t)M * K, nw = (size_t)N * K;
    bf16_t *hx = malloc((nx > nw ? nx : nw) * sizeof(bf16_t));
    if (!hx) mv_die_at(__FILE__, __LINE__, "malloc", "out of host memory");
    c.d_x = gpu_alloc(nx * sizeof(bf16_t));
    c.d_w = gpu_alloc(nw * sizeof(bf16_t));
    c.d_y = gpu_alloc((size_t)M * N * sizeof(bf16_t));
    fill_normal_bf16(rng, hx, nx, 0, 1);
    gpu_upload(c.d_x, hx, nx * sizeof(bf16_t));
    fill_uniform_bf16(rng, hx, nw, -0.03f, 0.03f);
    gpu_upload(c.d_w, hx, nw * sizeof(bf16_t));
    free(hx);
    timing_opts_t opts = {5, h->quick ? 10 : 50, 1};
    double ms = gpu_time_ms(run_gemm, &c, opts);
    char shape[64];
    snprintf(shape, sizeof shape, "M=%d N=%d K=%d", M, N, K);
    // Bytes: the weight read once, x read, y written. FLOPs: 2*M*N*K.
    double bytes = 2.0 * ((double)N * K + (double)M * K + (double)M * N);
    harness_timing(h, case_name, label, shape, ms, bytes, 2.0 * M * N * K, 0);
    gpu_free(c.d_x); gpu_free(c.d_w); gpu_free(c.d_y);
}

// ---- 5. small M: cuBLAS against the GEMV, as a decode step runs them -----------------------
//
// One launch timed alone (time_gemm) carries ~5 us of fixed cost in this
// harness (chapter 02 times a 4 KB RMSNorm row at 5.5-6 us), as much as the
// whole weight stream of these layers at M = 1. A decode step instead runs
// its kernels back to back in a CUDA graph. So here each timed run is a
// graph of SMALL_M_COPIES launches of the same layer, each over its own copy
// of the weight (after the L2 flush no copy is in cache, so every launch
// reads its weight from HBM), and the time per launch is the run's median
// over SMALL_M_COPIES: the launch gaps of a graph and each kernel's ramp-up
// and tail stay in, as in the engine.
#define SMALL_M_COPIES 16

typedef struct {
    cudaGraphExec_t exec;
} graph_ctx_t;

static int run_graph(void *p, cudaStream_t s) {
    return CUDA_TRY(cudaGraphLaunch(((graph_ctx_t *)p)->exec, s));
}

// *ms = the time per launch; returns -1 (with mv_error) if the launches
// could not be captured, so that one row is lost, not the run's record.
static int time_per_launch(const gemm_ctx_t *c0, size_t nw, timing_opts_t opts, double *ms) {
    cudaStream_t cs;
    CUDA_CHECK(cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking));
    cudaGraph_t graph = NULL;
    graph_ctx_t g = {NULL};
    int rc = CUDA_TRY(cudaStreamBeginCapture(cs, cudaStreamCaptureModeThreadLocal));
    if (!rc) {
        for (int i = 0; !rc && i < SMALL_M_COPIES; i++) {
            gemm_ctx_t c = *c0;
            c.d_w += (size_t)i * nw;
            rc = run_gemm(&c, cs);
        }
        // End the capture even after a failed launch, so the stream leaves capture mode.
        cudaError_t end = cudaStreamEndCapture(cs, &graph);
        if (!rc) rc = CUDA_TRY(end);
    }
    if (!rc) rc = CUDA_TRY(cudaGraphInstantiate(&g.exec, graph, 0));
    if (!rc) *ms = gpu_time_ms(run_graph, &g, opts) / SMALL_M_COPIES;
    if (rc) (void)cudaGetLastError();  // a failed capture's error must not surface at the next launch
    if (g.exec) CUDA_CHECK(cudaGraphExecDestroy(g.exec));
    if (graph) CUDA_CHECK(cudaGraphDestroy(graph));
    CUDA_CHECK(cudaStreamDestroy(cs));
    return rc;
}

// A whole layer (tp = 1) at M = 1..256, every version (v2 up to its 16, v3
// up to its 32, v4 from 8).
// cuBLAS gets a handle of its own here, destroyed after the graphs that
// captured it: whatever it allocated during a capture stays out of the
// other timings.
static void time_small_m(harness_t *h, rng_t *rng, const layer_spec_t *s) {
    cublasHandle_t handle;
    CUBLAS_CHECK(cublasCreate(&handle));
    void *ws = tile_workspace(handle);
    tp_linear_t l;
    MV_CHECK(make_layer(s, 1, 0, &l));
    const int N = l.out_local, K = l.in_local, max_M = 256;
    const size_t nw = (size_t)N * K;
    bf16_t *hbuf = malloc((nw > (size_t)max_M * K ? nw : (size_t)max_M * K) * sizeof(bf16_t));
    if (!hbuf) mv_die_at(__FILE__, __LINE__, "malloc", "out of host memory");
    gemm_ctx_t c = {handle, 0, NULL, NULL, NULL, 0, N, K};
    c.d_w = gpu_alloc(SMALL_M_COPIES * nw * sizeof(bf16_t));  // copy i at d_w + i * nw: 16-byte aligned (K % 8 == 0)
    c.d_x = gpu_alloc((size_t)max_M * K * sizeof(bf16_t));
    c.d_y = gpu_alloc((size_t)max_M * N * sizeof(bf16_t));
    fill_uniform_bf16(rng, hbuf, nw, -1.0f / sqrtf((float)K), 1.0f / sqrtf((float)K));
    gpu_upload(c.d_w, hbuf, nw * sizeof(bf16_t));
    for (int i = 1; i < SMALL_M_COPIES; i++)
        CUDA_CHECK(cudaMemcpy(c.d_w + (size_t)i * nw, c.d_w, nw * sizeof(bf16_t), cudaMemcpyDeviceToDevice));
    fill_normal_bf16(rng, hbuf, (size_t)max_M * K, 0, 1);
    gpu_upload(c.d_x, hbuf, (size_t)max_M * K * sizeof(bf16_t));
    CUDA_CHECK(cudaDeviceSynchronize());
    free(hbuf);

    timing_opts_t opts = {3, h->quick ? 10 : 30, 1};
    const int Ms[] = {1, 2, 4, 8, 16, 32, 64, 128, 256};
    for (size_t i = 0; i < sizeof Ms / sizeof Ms[0]; i++) {
        c.M = Ms[i];
        for (int v = LINEAR_CUBLAS; v <= LINEAR_TILE; v++) {
            if (v == LINEAR_GEMV && !linear_gemv_applies(c.d_x, c.d_w, c.M, K)) continue;
            if (v == LINEAR_GEMV_MMA && !linear_gemv_mma_applies(c.d_x, c.d_w, c.M, K)) continue;
            if (v == LINEAR_TILE && (c.M < 8 || !linear_tile_applies(handle, c.d_x, c.d_w, c.M, N, K))) continue;
            // --kernel N: version N alone; --kernel 4 keeps cuBLAS beside it from 8 tokens, its rival there.
            if (!harness_kernel_wanted(h, v) && !(v == LINEAR_CUBLAS && c.M >= 8 && harness_kernel_wanted(h, LINEAR_TILE) &&
                                                  h->kernel == LINEAR_TILE))
                continue;
            c.version = v;
            char label[64], shape[64];
            snprintf(label, sizeof label, "%s %s", s->name, linear_version_name(v));
            snprintf(shape, sizeof shape, "M=%d N=%d K=%d", c.M, N, K);
            double ms = 0;
            if (time_per_launch(&c, nw, opts, &ms)) {
                char detail[320];
                snprintf(detail, sizeof detail, "%s %s: %s", label, shape, mv_last_error());
                harness_check_bool(h, "gpu", "small-m", "timing: 16 launches captured in a graph", 0, detail);
                continue;
            }
            // Bytes: the weight read once, x read, y written. FLOPs: 2*M*N*K.
            double bytes = 2.0 * ((double)N * K + (double)c.M * K + (double)c.M * N);
            harness_timing(h, "small-m", label, shape, ms, bytes, 2.0 * c.M * N * K, 0);
        }
    }
    gpu_free(c.d_w); gpu_free(c.d_x); gpu_free(c.d_y);
    tile_workspace_free(handle, ws);
    CUBLAS_CHECK(cublasDestroy(handle));
}

typedef struct {
    bf16_t *bufs[TP_GROUP_MAX];
    size_t count;
} allreduce_ctx_t;

static int run_all_reduce(tp_group_t *g, void *p) {
    allreduce_ctx_t *c = p;
    return tp_all_reduce_bf16(g, c->bufs, c->count);
}

// The all-reduce of [M, hidden] bf16 over the real group. Bus bandwidth =
// data * 2(n-1)/n / time, NCCL's own measure: what each link carries in a
// ring all-reduce, comparable across GPU counts.
static void time_all_reduce(harness_t *h, tp_group_t *g, int M, int hidden) {
    allreduce_ctx_t c = {{0}, (size_t)M * hidden};
    for (int r = 0; r < g->size; r++) {
        MV_CHECK(tp_set_rank(g, r));
        c.bufs[r] = gpu_alloc(c.count * sizeof(bf16_t));
        CUDA_CHECK(cudaMemset(c.bufs[r], 0x3c, c.count * sizeof(bf16_t)));  // 0x3c3c = 0.0115: finite, not zero
    }
    double ms = tp_time_ms(g, run_all_reduce, &c, 5, h->quick ? 10 : 50);
    double bus_bytes = c.count * sizeof(bf16_t) * 2.0 * (g->size - 1) / g->size;
    char shape[64], label[64];
    snprintf(shape, sizeof shape, "M=%d x %d bf16", M, hidden);
    snprintf(label, sizeof label, "nccl all-reduce, %d GPUs (busbw)", g->size);
    harness_timing(h, "all-reduce", label, shape, ms, bus_bytes, 0, 0);
    for (int r = 0; r < g->size; r++) {
        MV_CHECK(tp_set_rank(g, r));
        gpu_free(c.bufs[r]);
    }
    MV_CHECK(tp_set_rank(g, 0));
}
#endif

int main(int argc, char **argv) {
    harness_t h;
    // MV_LINEAR_GEMV forces linear_cuda's GEMV (kernels/linear.h); any other
    // value than 2 or 3 is refused here, as the engine refuses it, rather
    // than read as unset. So is an MV_LINEAR_GEMV_MAX_M outside 0 to 32.
    const char *gemv = getenv("MV_LINEAR_GEMV");
    if (gemv && strcmp(gemv, "2") && strcmp(gemv, "3")) {
        fprintf(stderr, "03-linear-tp: MV_LINEAR_GEMV=%s: it takes 2 (version 2, the GEMV on fp32 FMAs) or 3 "
                        "(version 3, on the tensor cores)\n", gemv);
        return 2;
    }
#if MV_HAVE_CUDA
    if (linear_gemv_max_m_override() == -2) {
        fprintf(stderr, "03-linear-tp: MV_LINEAR_GEMV_MAX_M=%s: it takes a number of tokens from 0 to %d (a GEMV up "
                        "to that many on every projection)\n", getenv("MV_LINEAR_GEMV_MAX_M"), LINEAR_GEMV_MMA_MAX_M);
        return 2;
    }
    if (linear_tile_max_m_override() == -2) {
        fprintf(stderr, "03-linear-tp: MV_LINEAR_TILE_MAX_M=%s: it takes a number of tokens from 0 to %d (version 4 "
                        "up to that many, past the GEMV's)\n", getenv("MV_LINEAR_TILE_MAX_M"),
                LINEAR_TILE_MAX_AUTO_LIMIT);
        return 2;
    }
#endif
    // linear_cuda's automatic choice (LINEAR_AUTO) is checked as the version it picks.
    static const harness_kernel_t kernels[] = {{"linear", LINEAR_VERSION_TABLE}, {NULL, NULL}};
    harness_begin_kernels(&h, "03-linear-tp",
                          "tensor-parallel linear layers (replicated, column, merged, QKV, row) over cuBLAS and NCCL",
                          argc, argv, kernels);
    rng_t rng;
    rng_seed(&rng, h.seed);

    harness_section(&h, "CPU reference GEMM against hand-computed values and float64");
    check_hand_values(&h);
    check_f64(&h, &rng, 3, 5, 7, 0);
    check_f64(&h, &rng, 17, 33, 100, 1);
    check_f64(&h, &rng, 9, 70, 1024, 0);

    harness_section(&h, "CPU simulation of tp = 1, 2, 4, 8: shards reassembled equal the unsharded layer");
    int tps[] = {1, 2, 4, 8};
    for (size_t i = 0; i < sizeof SMALL_LAYERS / sizeof SMALL_LAYERS[0]; i++)
        for (int t = 0; t < 4; t++) simulate_tp(&h, &rng, &SMALL_LAYERS[i], tps[t], 5);
    check_rejections(&h);

#if MV_HAVE_CUDA
    if (h.use_gpu) {
        tp_check_groups_t groups;
        MV_CHECK(tp_check_groups_init(&groups, h.gpu.device_count));
        void *group_ws[2][TP_GROUP_MAX] = {{NULL}};
        for (int gi = 0; gi < groups.n; gi++)
            for (int r = 0; r < groups.group[gi].size; r++) {
                MV_CHECK(tp_set_rank(&groups.group[gi], r));
                group_ws[gi][r] = tile_workspace(groups.group[gi].cublas[r]);
            }
        harness_section(&h, groups.real ? "GPU: tp = number of GPUs over NCCL, every rank against the CPU"
                                        : "GPU: tp = 1, and tp = 2 with both shards on this GPU");
        int check_M[] = {1, 7, 64, 256};
        for (size_t i = 0; i < 4; i++)
            for (int k = 0; k < 4; k++) check_layer(&h, &rng, &QWEN3_LAYERS[i], check_M[k], &groups);
        for (size_t i = 0; i < 3; i++)
            for (int k = 0; k < 4; k += 3) check_layer(&h, &rng, &OTHER_LAYERS[i], check_M[k], &groups);

        harness_section(&h, "GPU: the small-M versions (v2, v3, v4) on odd shapes, their refusals, and linear_cuda's "
                            "choice");
        cublasHandle_t handle;
        CUBLAS_CHECK(cublasCreate(&handle));
        void *ws = tile_workspace(handle);
        for (size_t i = 0; i < sizeof SMALL_M_CASES / sizeof SMALL_M_CASES[0]; i++)
            check_small_m(&h, handle, &rng, &SMALL_M_CASES[i]);
        // The GEMVs' own properties and their fused forms, version by version.
        for (int v = LINEAR_GEMV; v <= LINEAR_TILE; v++)
            if (harness_kernel_wanted(&h, v)) check_gemv_invariance(&h, handle, &rng, v);
        if (harness_kernel_wanted(&h, LINEAR_TILE) && mv_pdl_supported()) {
            harness_section(&h, "GPU: version 4 reading what the kernel ahead wrote, with programmatic dependent "
                                "launch");
            check_tile_pdl(&h, handle, &rng, 24, 1024, 3072, "down_proj at 24 rows: K split over 8 blocks");
            check_tile_pdl(&h, handle, &rng, 100, 4096, 1024, "qkv_proj's shape at 100 rows: two token tiles");
            check_tile_pdl(&h, handle, &rng, 64, 8192, 512, "128 row tiles: no split, one store a sum");
        }
        if (harness_kernel_wanted(&h, LINEAR_GEMV) || harness_kernel_wanted(&h, LINEAR_GEMV_MMA)) {
            harness_section(&h, "GPU: the down projection with SiluAndMul folded into the GEMV, with and without "
                                "programmatic dependent launch");
            for (int v = LINEAR_GEMV; v <= LINEAR_GEMV_MMA; v++) {
                if (!harness_kernel_wanted(&h, v)) continue;
                for (int pdl = 0; pdl <= mv_pdl_supported(); pdl++)
                    for (size_t i = 0; i < sizeof SILU_GEMV_CASES / sizeof SILU_GEMV_CASES[0]; i++)
                        if (SILU_GEMV_CASES[i].M <= (v == LINEAR_GEMV ? LINEAR_GEMV_MAX_M : LINEAR_GEMV_MMA_MAX_M))
                            check_silu_gemv(&h, handle, &rng, &SILU_GEMV_CASES[i], pdl, v);
            }
            check_silu_gemv_refusals(&h);
        }
        if (h.do_timing) {
            int big_M[] = {4096, 16384};
            for (size_t i = 0; i < 4; i++)
                for (int k = 0; k < 2; k++) check_layer(&h, &rng, &QWEN3_LAYERS[i], big_M[k], &groups);

            int time_M[] = {1, 8, 64, 256, 4096, 16384};
            // cuBLAS (version 1) forced: these rows are version 1's.
            if (harness_kernel_wanted(&h, LINEAR_CUBLAS))
                harness_section(&h, "Timing on GPU 0: Qwen3-0.6B projections, whole (tp = 1) and one tp = 2 shard");
            for (size_t i = 0; i < 4 && harness_kernel_wanted(&h, LINEAR_CUBLAS); i++) {
                const layer_spec_t *s = &QWEN3_LAYERS[i];
                tp_linear_t l1, l2;
                MV_CHECK(make_layer(s, 1, 0, &l1));
                MV_CHECK(make_layer(s, 2, 0, &l2));
                char label[64];
                for (int k = 0; k < 6; k++) {
                    snprintf(label, sizeof label, "%s tp=1", s->name);
                    time_gemm(&h, handle, &rng, "gemm", label, time_M[k], l1.out_local, l1.in_local);
                    snprintf(label, sizeof label, "%s tp=2 rank shard", s->name);
                    time_gemm(&h, handle, &rng, "gemm", label, time_M[k], l2.out_local, l2.in_local);
                }
            }
            if (groups.real) {
                harness_section(&h, "NCCL all-reduce of hidden-size activations");
                for (int k = 0; k < 6; k++) time_all_reduce(&h, &groups.group[0], time_M[k], 1024);
            }

            harness_section(&h, "Small M on GPU 0: cuBLAS (v1) against the GEMVs (v2, v3) and the tiled GEMM (v4), "
                                "16 launches back to back in a CUDA graph, time per launch");
            for (size_t i = 0; i < 4; i++) time_small_m(&h, &rng, &QWEN3_LAYERS[i]);
        }
        tile_workspace_free(handle, ws);
        CUBLAS_CHECK(cublasDestroy(handle));
        for (int gi = 0; gi < groups.n; gi++)
            for (int r = 0; r < groups.group[gi].size; r++) {
                MV_CHECK(tp_set_rank(&groups.group[gi], r));
                tile_workspace_free(groups.group[gi].cublas[r], group_ws[gi][r]);
            }
        tp_check_groups_destroy(&groups);
    }
#endif
    return harness_end(&h);
}

/*
 * chapters/09-engine/runtime/runner_cpu.c - the model runner's CPU backend
 * (see model_runner.h for the interface).
 *
 * The CPU backend is Qwen3 in fp32 activations over bf16 weights, built
 * only from the reference/ layers (no second copy of any layer's math):
 *
 *   weights   every matrix converted to bf16 once (st_to_bf16: bf16, f16 and
 *             f32 checkpoints alike), q/k/v merged into one [(nq+2nkv)*hd, H]
 *             matrix and gate/up into one [2I, H] (one GEMM each, and the
 *             merged layouts are what qk_norm_rope_cpu and silu_and_mul_cpu
 *             read): which tensor lands at which rows is model/qwen3_layout.h's,
 *             filled by qwen3_merged_fill, as the CUDA backend fills its own;
 *             o_proj, down_proj and the embeddings by qwen3_row_fill and
 *             qwen3_vocab_fill (chapter 03's and 04's loaders, which take this
 *             rank's share: all of it at tp 1). Norm weights as fp32. Tied
 *             embeddings share one copy.
 *   KV cache  per layer, fp32 K and V [num_blocks, block_size, nkv, hd].
 *   RoPE      one fp32 cos/sin cache [max_model_len, hd] from config.json
 *             (rope_theta, llama3 scaling when present).
 *
 * Attention: a step that is all decode (one query token per row, nothing
 * else) goes through attention_decode_cpu, as the CUDA backend sends
 * it to its decode kernel; any other step (prefill, chunked prefill, prefix
 * hits, or prefill and decode rows mixed) goes through attention_prefill_cpu
 * for all its rows: a decode row is a prefill row of one query token, and
 * both entry points share one routine, so the results are bit for bit the
 * same either way.
 *
 * Tensor parallelism (--tensor-parallel-size N, one process per rank under
 * mpirun; parallel/tp_comm.h): rank r holds the shard that
 * model/qwen3_layout.h describes for it, loaded by chapter 03's and 04's
 * loaders from the mapped checkpoint: qkv_proj by heads (its query heads and
 * their KV heads, copied when N exceeds the KV heads), gate_up_proj by
 * rows, o_proj and down_proj by columns (row-parallel), embed_tokens and
 * lm_head by vocabulary rows. Its KV cache holds only its KV heads. A step
 * then needs four collectives per layer pair and two at the ends:
 *   embedding   each rank writes its rows' embeddings, zeros elsewhere -> all-reduce
 *   o_proj      partial sums over its heads -> all-reduce (the bias added once, by rank 0)
 *   down_proj   partial sums over its I/N columns -> all-reduce
 *   LM head     logits of its V/N vocabulary rows -> gathered on rank 0
 * Everything between (norms, RoPE, attention, SiluAndMul) runs on the
 * rank's own heads or on the whole hidden state it already has, with no
 * communication. At N = 1 every collective is a no-op and every shard the
 * whole tensor: one code path.
 *
 * The order of a layer's calls is model_runner.h's (cpu_layer below follows
 * it, as the CUDA backend's cuda_layer does). It matters for one thing:
 * this step's K/V are stored in the cache *before* attention reads it,
 * because attention reads every key, the new ones included, through the
 * block table.
 */
#include "chapters/09-engine/runtime/model_runner.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chapters/09-engine/model/qwen3_layout.h"
#include "chapters/09-engine/model/qwen3_weights.h"
#include "chapters/09-engine/parallel/tp_comm.h"
#include "common/check.h"
#include "reference/activation.h"
#include "reference/attention.h"
#include "reference/embedding.h"
#include "reference/kv_store.h"
#include "reference/linear.h"
#include "reference/rmsnorm.h"
#include "reference/rope.h"

// ---- the CPU backend's state -----------------------------------------------------------
// H = hidden_size, I = intermediate_size, V = vocab_size, hd = head_dim, and
// this rank's share of tp ranks: nq = query heads / tp, nkv = its KV heads
// (KV heads / tp, or 1 when copied), QKV = (nq + 2*nkv) * hd, I' = I / tp,
// V' = vocab rows / tp (padded up); Tm = max_num_batched_tokens. At tp 1
// they are the model's own sizes.

typedef struct {
    float *input_norm;      // [H]
    bf16_t *qkv;            // [QKV, H]  rows: q_proj, then k_proj, then v_proj (qwen3_layout.h)
    bf16_t *qkv_bias;       // [QKV] or NULL (attention_bias)
    float *q_norm, *k_norm; // [hd] each
    bf16_t *o_proj;         // [H, nq*hd] this rank's columns
    bf16_t *o_bias;         // [H] or NULL
    float *post_norm;       // [H]
    bf16_t *gate_up;        // [2I', H]  rows: gate_proj, then up_proj (qwen3_layout.h)
    bf16_t *down;           // [H, I'] this rank's columns
    float *k_cache, *v_cache;  // [num_blocks, block_size, nkv, hd] fp32 each
} cpu_layer_t;

typedef struct {
    qwen3_layout_t layout;  // this rank's shapes and pieces (tp_size 1: the whole model)
    const tp_comm_t *tp;    // the ranks (the runner's; a communicator of one at tp 1)
    bf16_t *embed;          // [V', H] this rank's vocabulary rows
    bf16_t *lm_head;        // [V', H]; == embed when tied (one copy)
    float *final_norm;      // [H]
    cpu_layer_t *layers;    // [L]
    rope_cache_t rope;      // cos/sin [max_model_len, hd]
    // scratch, sized for Tm tokens
    float *residual;        // [Tm, H] the residual stream
    float *hidden;          // [Tm, H] normed input of a sublayer
    float *x;               // [Tm, H] output of a sublayer (o_proj, down_proj)
    float *qkv;             // [Tm, QKV]
    float *q;               // [Tm, nq*hd] q heads copied out of qkv (attention wants them packed)
    float *attn;            // [Tm, nq*hd]
    float *gate_up;         // [Tm, 2I']
    float *act;             // [Tm, I']
    float *last;            // [max_num_seqs, H] final hidden rows of the sampled rows
    int32_t *cu_last;       // [max_num_seqs + 1] cu_seqlens that ends at each sampled token
    // tp > 1 only (NULL at tp 1, where the LM head writes the logits itself):
    float *logits_local;    // [max_num_seqs, V'] this rank's logits
    float *logits_all;      // [tp, max_num_seqs, V'] every rank's, gathered on rank 0
} cpu_state_t;

static void *alloc_count(size_t n, size_t elem, size_t *total, const char *what) {
    void *p = n ? calloc(n, elem) : NULL;
    if (n && !p) mv_error("model runner (cpu): out of host memory for %s (%zu bytes)", what, n * elem);
    if (p && total) *total += n * elem;
    return p;
}

// bf16 copy of a tensor, into dst (which has room for st_numel(t) values).
static void to_bf16(const st_tensor_t *t, bf16_t *dst) { st_to_bf16(t, dst); }

// fp32 copy of a (small) tensor: norm weights.
static float *to_f32(const st_tensor_t *t, size_t *total) {
    size_t n = (size_t)st_numel(t);
    bf16_t *tmp = malloc(n * sizeof *tmp);
    float *out = alloc_count(n, sizeof(float), total, t->name);
    if (!tmp || !out) {
        free(tmp);
        free(out);
        mv_error("model runner (cpu): out of host memory converting %s", t->name);
        return NULL;
    }
    // Every norm weight goes through bf16, as the engine's other weights do:
    // a bf16 checkpoint is kept exactly, an f32 one rounds like the GPU's will.
    st_to_bf16(t, tmp);
    bf16_to_float_array(out, tmp, n);
    free(tmp);
    return out;
}

static int bind_layer(cpu_layer_t *cl, const qwen3_layer_weights_t *lw, const qwen3_layout_t *lo,
                      const qwen3_config_t *c, const runner_config_t *rc, size_t *wbytes, size_t *kvbytes) {
    const size_t H = (size_t)c->hidden_size, hd = (size_t)c->head_dim;
    const size_t kvn = (size_t)lo->qkv.tp.kv_heads_local * hd;
    const qwen3_merged_t *qkv = &lo->qkv, *gate_up = &lo->gate_up;
    cl->input_norm = to_f32(lw->input_layernorm, wbytes);
    cl->post_norm = to_f32(lw->post_attention_layernorm, wbytes);
    cl->q_norm = to_f32(lw->q_norm, wbytes);
    cl->k_norm = to_f32(lw->k_norm, wbytes);
    cl->qkv = alloc_count((size_t)qkv->rows * qkv->cols, sizeof(bf16_t), wbytes, qkv->name);
    cl->o_proj = alloc_count(H * (size_t)lo->o_proj.in_local, sizeof(bf16_t), wbytes, "o_proj");
    cl->gate_up = alloc_count((size_t)gate_up->rows * gate_up->cols, sizeof(bf16_t), wbytes, gate_up->name);
    cl->down = alloc_count(H * (size_t)lo->down.in_local, sizeof(bf16_t), wbytes, "down_proj");
    const size_t cache = (size_t)rc->num_blocks * (size_t)rc->block_size * kvn;
    cl->k_cache = alloc_count(cache, sizeof(float), kvbytes, "the K cache");
    cl->v_cache = alloc_count(cache, sizeof(float), kvbytes, "the V cache");
    if (!cl->input_norm || !cl->post_norm || !cl->q_norm || !cl->k_norm || !cl->qkv || !cl->o_proj ||
        !cl->gate_up || !cl->down || !cl->k_cache || !cl->v_cache)
        return -1;
    if (qwen3_merged_fill(qkv, lw, cl->qkv) || qwen3_merged_fill(gate_up, lw, cl->gate_up) ||
        qwen3_row_fill(&lo->o_proj, lw->o_proj, cl->o_proj) || qwen3_row_fill(&lo->down, lw->down_proj, cl->down))
        return -1;
    if (qkv->has_bias) {
        cl->qkv_bias = alloc_count((size_t)qkv->rows, sizeof(bf16_t), wbytes, "qkv bias");
        cl->o_bias = alloc_count(H, sizeof(bf16_t), wbytes, "o_proj bias");
        if (!cl->qkv_bias || !cl->o_bias || qwen3_merged_fill_bias(qkv, lw, cl->qkv_bias)) return -1;
        to_bf16(lw->o_bias, cl->o_bias);
    }
    return 0;
}

static void cpu_destroy(model_runner_t *r) {
    cpu_state_t *s = r->state;
    if (!s) return;
    for (int l = 0; s->layers && l < r->cfg.num_hidden_layers; l++) {
        cpu_layer_t *cl = &s->layers[l];
        free(cl->input_norm), free(cl->qkv), free(cl->qkv_bias), free(cl->q_norm), free(cl->k_norm);
        free(cl->o_proj), free(cl->o_bias), free(cl->post_norm), free(cl->gate_up), free(cl->down);
        free(cl->k_cache), free(cl->v_cache);
    }
    free(s->layers);
    if (s->lm_head != s->embed) free(s->lm_head);
    free(s->embed), free(s->final_norm);
    rope_cache_free(&s->rope);
    free(s->residual), free(s->hidden), free(s->x), free(s->qkv), free(s->q), free(s->attn);
    free(s->gate_up), free(s->act), free(s->last), free(s->cu_last), free(s->logits_local), free(s->logits_all);
    free(s);
    r->state = NULL;
}

static int cpu_create(model_runner_t *r, const st_model_t *m) {
    const qwen3_config_t *c = &r->cfg;
    const runner_config_t *rc = &r->rc;
    cpu_state_t *s = calloc(1, sizeof *s);
    if (!s) return mv_error("model runner (cpu): out of host memory");
    r->state = s;
    s->tp = &r->tp;
    qwen3_weights_t w;
    if (qwen3_layout_init(&s->layout, c, r->tp.size, r->tp.rank) || qwen3_weights_bind(c, m, &w)) return -1;
    const qwen3_layout_t *lo = &s->layout;
    const size_t H = (size_t)c->hidden_size, V = (size_t)lo->vocab.local_rows, I = (size_t)lo->down.in_local;
    const size_t qn = (size_t)lo->o_proj.in_local;
    const size_t qkv = (size_t)lo->qkv.rows, gate_up = (size_t)lo->gate_up.rows;
    const size_t Tm = (size_t)rc->max_num_batched_tokens, Sm = (size_t)rc->max_num_seqs;
    int rcode = 0;
    s->layers = alloc_count((size_t)c->num_hidden_layers, sizeof *s->layers, NULL, "layers");
    s->embed = alloc_count(V * H, sizeof(bf16_t), &r->weight_bytes, "embed_tokens");
    s->final_norm = to_f32(w.norm, &r->weight_bytes);
    if (!s->layers || !s->embed || !s->final_norm) rcode = -1;
    if (!rcode && qwen3_vocab_fill(&lo->vocab, w.embed_tokens, (int)H, s->embed)) rcode = -1;
    if (!rcode) {
        if (w.lm_head == w.embed_tokens) {
            s->lm_head = s->embed;
        } else {
            s->lm_head = alloc_count(V * H, sizeof(bf16_t), &r->weight_bytes, "lm_head");
            if (!s->lm_head || qwen3_vocab_fill(&lo->vocab, w.lm_head, (int)H, s->lm_head)) rcode = -1;
        }
    }
    for (int l = 0; !rcode && l < c->num_hidden_layers; l++)
        if (bind_layer(&s->layers[l], &w.layers[l], &s->layout, c, rc, &r->weight_bytes, &r->kv_cache_bytes))
            rcode = mv_error_prefix("layer %d", l);
    qwen3_weights_free(&w);
    if (rcode) return -1;
    if (model_runner_build_rope(&s->rope, c, rc->max_model_len)) return -1;
    size_t *sb = &r->scratch_bytes;
    s->residual = alloc_count(Tm * H, sizeof(float), sb, "scratch");
    s->hidden = alloc_count(Tm * H, sizeof(float), sb, "scratch");
    s->x = alloc_count(Tm * H, sizeof(float), sb, "scratch");
    s->qkv = alloc_count(Tm * qkv, sizeof(float), sb, "scratch");
    s->q = alloc_count(Tm * qn, sizeof(float), sb, "scratch");
    s->attn = alloc_count(Tm * qn, sizeof(float), sb, "scratch");
    s->gate_up = alloc_count(Tm * gate_up, sizeof(float), sb, "scratch");
    s->act = alloc_count(Tm * I, sizeof(float), sb, "scratch");
    s->last = alloc_count(Sm * H, sizeof(float), sb, "scratch");
    s->cu_last = alloc_count(Sm + 1, sizeof(int32_t), sb, "scratch");
    if (!s->residual || !s->hidden || !s->x || !s->qkv || !s->q || !s->attn || !s->gate_up || !s->act ||
        !s->last || !s->cu_last)
        return -1;
    if (r->tp.size > 1) {
        s->logits_local = alloc_count(Sm * V, sizeof(float), sb, "scratch");
        s->logits_all = alloc_count((size_t)r->tp.size * Sm * V, sizeof(float), sb, "scratch");
        if (!s->logits_local || !s->logits_all) return -1;
    }
    return 0;
}

// One decoder layer over the step's T tokens. On entry s->hidden holds the
// normed input and s->residual the residual stream; on exit s->x holds the
// MLP's output, still to be added to the residual by the next norm.
static int cpu_layer(const model_runner_t *r, cpu_state_t *s, const cpu_layer_t *cl, const runner_step_t *in) {
    const qwen3_config_t *c = &r->cfg;
    const runner_config_t *rc = &r->rc;
    const qwen3_merged_t *qkv = &s->layout.qkv;
    const int T = in->num_tokens, H = c->hidden_size, I = s->layout.down.in_local, hd = c->head_dim;
    const int nq = c->num_attention_heads / s->tp->size, nkv = qkv->tp.kv_heads_local;
    const int qn = nq * hd, qkv_n = qkv->rows, th = rc->num_threads;
    // o_proj's bias is added once: by rank 0, into its partial sum.
    const bf16_t *o_bias = s->tp->rank == 0 ? cl->o_bias : NULL;
    // A qkv output row's k and v columns are the merged weight's k and v rows.
    const int k_col = qkv->piece[QWEN3_PART_K].dst_row, v_col = qkv->piece[QWEN3_PART_V].dst_row;
    const float eps = (float)c->rms_norm_eps, scale = 1.0f / sqrtf((float)hd);

    // Attention block.
    if (linear_cpu(s->qkv, s->hidden, cl->qkv, cl->qkv_bias, T, qkv_n, H, th) ||
        qk_norm_rope_cpu(s->qkv, cl->q_norm, cl->k_norm, in->positions, &s->rope, T, nq, nkv, hd, eps) ||
        store_kvcache_f32_cpu(s->qkv + k_col, qkv_n, s->qkv + v_col, qkv_n, cl->k_cache, cl->v_cache,
                              in->slot_mapping, T, nkv, hd, rc->block_size, rc->num_blocks))
        return -1;
    for (int t = 0; t < T; t++) memcpy(s->q + (size_t)t * qn, s->qkv + (size_t)t * qkv_n, (size_t)qn * sizeof(float));
    int rca;
    if (T == in->num_seqs)  // all decode: one query token per row
        rca = attention_decode_cpu(s->attn, s->q, cl->k_cache, cl->v_cache, in->context_lens, in->block_tables,
                                   in->num_seqs, nq, nkv, hd, rc->block_size, rc->num_blocks,
                                   in->max_blocks_per_seq, scale, th);
    else
        rca = attention_prefill_cpu(s->attn, s->q, cl->k_cache, cl->v_cache, in->cu_seqlens_q, in->context_lens,
                                    in->block_tables, in->num_seqs, nq, nkv, hd, rc->block_size, rc->num_blocks,
                                    in->max_blocks_per_seq, scale, th);
    if (rca || linear_cpu(s->x, s->attn, cl->o_proj, o_bias, T, H, qn, th) ||
        tp_comm_allreduce_sum_f32(s->tp, s->x, (size_t)T * H))
        return -1;

    // MLP block: residual += attention output, then normalise.
    if (fused_add_rmsnorm_cpu(s->hidden, s->residual, s->x, cl->post_norm, T, H, eps) ||
        linear_cpu(s->gate_up, s->hidden, cl->gate_up, NULL, T, s->layout.gate_up.rows, H, th) ||
        silu_and_mul_cpu(s->act, s->gate_up, T, I) || linear_cpu(s->x, s->act, cl->down, NULL, T, H, I, th) ||
        tp_comm_allreduce_sum_f32(s->tp, s->x, (size_t)T * H))
        return -1;
    return 0;
}

static int cpu_step(model_runner_t *r, const runner_step_t *in, float *logits) {
    cpu_state_t *s = r->state;
    const qwen3_config_t *c = &r->cfg;
    const vocab_shard_t *vs = &s->layout.vocab;
    const int T = in->num_tokens, H = c->hidden_size, V = vs->local_rows;
    const float eps = (float)c->rms_norm_eps;
    if (T == 0) return 0;
    // The residual stream starts as the embeddings; layer 0's input norm is
    // a plain one (nothing to add yet), every later norm adds first. Each
    // rank looks up the ids in its rows (zeros for the others' ids), and the
    // all-reduce adds the one non-zero row of each token to every rank.
    if (embedding_cpu(s->residual, in->input_ids, s->embed, T, H, vs->start, vs->start + V) ||
        tp_comm_allreduce_sum_f32(s->tp, s->residual, (size_t)T * H) ||
        rmsnorm_cpu(s->hidden, s->residual, s->layers[0].input_norm, T, H, eps))
        return -1;
    for (int l = 0; l < c->num_hidden_layers; l++) {
        if (l > 0 && fused_add_rmsnorm_cpu(s->hidden, s->residual, s->x, s->layers[l].input_norm, T, H, eps))
            return -1;
        if (cpu_layer(r, s, &s->layers[l], in)) return mv_error_prefix("layer %d", l);
    }
    if (in->num_sample == 0) return 0;
    if (fused_add_rmsnorm_cpu(s->hidden, s->residual, s->x, s->final_norm, T, H, eps)) return -1;
    // The LM head runs only on the rows that sample: a cu_seqlens whose
    // sequences end at the sampled tokens lets gather_last_tokens_cpu pick them.
    s->cu_last[0] = 0;
    for (int k = 0; k < in->num_sample; k++) s->cu_last[k + 1] = in->sample_token_index[k] + 1;
    const int S = in->num_sample;
    if (gather_last_tokens_cpu(s->last, s->hidden, s->cu_last, S, s->cu_last[S], H)) return -1;
    if (s->tp->size == 1) return linear_cpu(logits, s->last, s->lm_head, NULL, S, V, H, r->rc.num_threads);
    // Each rank's logits [S, V'] for its vocabulary rows, gathered on rank 0,
    // which puts every rank's block into its columns (chapter 04's assembly).
    const size_t block = (size_t)S * V;
    if (linear_cpu(s->logits_local, s->last, s->lm_head, NULL, S, V, H, r->rc.num_threads) ||
        tp_comm_gather(s->tp, s->logits_local, block * sizeof(float), s->logits_all, 0))
        return -1;
    if (s->tp->rank != 0) return 0;
    for (int rank = 0; rank < s->tp->size; rank++) {
        vocab_shard_t v;
        if (vocab_shard_init(&v, c->vocab_size, s->tp->size, rank) ||
            vocab_shard_scatter_logits(&v, s->logits_all + (size_t)rank * block, S, logits))
            return -1;
    }
    return 0;
}

// The CPU backend samples on the host: no step_sample, no asynchronous steps.
const runner_backend_t RUNNER_BACKEND_CPU = {"cpu", cpu_create, cpu_step, cpu_destroy, NULL, NULL, NULL};

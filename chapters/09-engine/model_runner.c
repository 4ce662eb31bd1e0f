/*
 * chapters/09-engine/model_runner.c - the model runner (see model_runner.h)
 * and its CPU backend.
 *
 * The CPU backend is Qwen3 in fp32 activations over bf16 weights, built
 * only from the reference/ layers (no second copy of any layer's math):
 *
 *   weights   every matrix converted to bf16 once (st_to_bf16: bf16, f16 and
 *             f32 checkpoints alike), q/k/v merged into one [(nq+2nkv)*hd, H]
 *             matrix and gate/up into one [2I, H] (one GEMM each, and the
 *             merged layouts are what qk_norm_rope_cpu and silu_and_mul_cpu
 *             read); norm weights as fp32. Tied embeddings share one copy.
 *   KV cache  per layer, fp32 K and V [num_blocks, block_size, nkv, hd].
 *   RoPE      one fp32 cos/sin cache [max_model_len, hd] from config.json
 *             (rope_theta, llama3 scaling when present).
 *
 * Attention: a step that is all decode (one query token per row, nothing
 * else) goes through attention_decode_cpu, the shape a CUDA backend will
 * capture in a CUDA graph; any other step (prefill, chunked prefill, prefix
 * hits, or prefill and decode rows mixed) goes through attention_prefill_cpu
 * for all its rows: a decode row is a prefill row of one query token, and
 * both entry points share one routine, so the results are bit for bit the
 * same either way.
 *
 * Order inside a layer matters for one thing: this step's K/V are stored in
 * the cache *before* attention reads it, because attention reads every key,
 * the new ones included, through the block table.
 */
#include "chapters/09-engine/model_runner.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chapters/09-engine/qwen3_weights.h"
#include "chapters/09-engine/sampler.h"
#include "common/check.h"
#include "common/gpu.h"
#include "reference/activation.h"
#include "reference/attention.h"
#include "reference/embedding.h"
#include "reference/kv_store.h"
#include "reference/linear.h"
#include "reference/rmsnorm.h"
#include "reference/rope.h"

// ---- the CPU backend's state -----------------------------------------------------------
// H = hidden_size, I = intermediate_size, V = vocab_size, hd = head_dim,
// nq / nkv = query / KV heads, QKV = (nq + 2*nkv) * hd, Tm = max_num_batched_tokens.

typedef struct {
    float *input_norm;      // [H]
    bf16_t *qkv;            // [QKV, H]  rows: q_proj, then k_proj, then v_proj
    bf16_t *qkv_bias;       // [QKV] or NULL (attention_bias)
    float *q_norm, *k_norm; // [hd] each
    bf16_t *o_proj;         // [H, nq*hd]
    bf16_t *o_bias;         // [H] or NULL
    float *post_norm;       // [H]
    bf16_t *gate_up;        // [2I, H]  rows: gate_proj, then up_proj
    bf16_t *down;           // [H, I]
    float *k_cache, *v_cache;  // [num_blocks, block_size, nkv, hd] fp32 each
} cpu_layer_t;

typedef struct {
    bf16_t *embed;          // [V, H]
    bf16_t *lm_head;        // [V, H]; == embed when tied (one copy)
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
    float *gate_up;         // [Tm, 2I]
    float *act;             // [Tm, I]
    float *last;            // [max_num_seqs, H] final hidden rows of the sampled rows
    int32_t *cu_last;       // [max_num_seqs + 1] cu_seqlens that ends at each sampled token
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

static int bind_layer(cpu_layer_t *cl, const qwen3_layer_weights_t *lw, const qwen3_config_t *c,
                      const runner_config_t *rc, size_t *wbytes, size_t *kvbytes) {
    const size_t H = (size_t)c->hidden_size, I = (size_t)c->intermediate_size, hd = (size_t)c->head_dim;
    const size_t qn = (size_t)c->num_attention_heads * hd, kvn = (size_t)c->num_key_value_heads * hd;
    const size_t qkv_rows = qn + 2 * kvn;
    cl->input_norm = to_f32(lw->input_layernorm, wbytes);
    cl->post_norm = to_f32(lw->post_attention_layernorm, wbytes);
    cl->q_norm = to_f32(lw->q_norm, wbytes);
    cl->k_norm = to_f32(lw->k_norm, wbytes);
    cl->qkv = alloc_count(qkv_rows * H, sizeof(bf16_t), wbytes, "qkv_proj");
    cl->o_proj = alloc_count(H * qn, sizeof(bf16_t), wbytes, "o_proj");
    cl->gate_up = alloc_count(2 * I * H, sizeof(bf16_t), wbytes, "gate_up_proj");
    cl->down = alloc_count(H * I, sizeof(bf16_t), wbytes, "down_proj");
    const size_t cache = (size_t)rc->num_blocks * (size_t)rc->block_size * kvn;
    cl->k_cache = alloc_count(cache, sizeof(float), kvbytes, "the K cache");
    cl->v_cache = alloc_count(cache, sizeof(float), kvbytes, "the V cache");
    if (!cl->input_norm || !cl->post_norm || !cl->q_norm || !cl->k_norm || !cl->qkv || !cl->o_proj ||
        !cl->gate_up || !cl->down || !cl->k_cache || !cl->v_cache)
        return -1;
    to_bf16(lw->q_proj, cl->qkv);
    to_bf16(lw->k_proj, cl->qkv + qn * H);
    to_bf16(lw->v_proj, cl->qkv + (qn + kvn) * H);
    to_bf16(lw->o_proj, cl->o_proj);
    to_bf16(lw->gate_proj, cl->gate_up);
    to_bf16(lw->up_proj, cl->gate_up + I * H);
    to_bf16(lw->down_proj, cl->down);
    if (lw->q_bias) {
        cl->qkv_bias = alloc_count(qkv_rows, sizeof(bf16_t), wbytes, "qkv bias");
        cl->o_bias = alloc_count(H, sizeof(bf16_t), wbytes, "o_proj bias");
        if (!cl->qkv_bias || !cl->o_bias) return -1;
        to_bf16(lw->q_bias, cl->qkv_bias);
        to_bf16(lw->k_bias, cl->qkv_bias + qn);
        to_bf16(lw->v_bias, cl->qkv_bias + qn + kvn);
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
    free(s->gate_up), free(s->act), free(s->last), free(s->cu_last);
    free(s);
    r->state = NULL;
}

int model_runner_build_rope(rope_cache_t *rope, const qwen3_config_t *c, int max_model_len) {
    rope_config_t rc = {
        .head_dim = c->head_dim,
        .max_position = max_model_len,
        .theta = c->rope_theta,
        .scaling = c->rope_scaling.kind == QWEN3_ROPE_LLAMA3 ? ROPE_SCALING_LLAMA3 : ROPE_SCALING_NONE,
        .factor = c->rope_scaling.factor,
        .low_freq_factor = c->rope_scaling.low_freq_factor,
        .high_freq_factor = c->rope_scaling.high_freq_factor,
        .original_max_position = c->rope_scaling.original_max_position_embeddings,
    };
    return rope_cache_build(rope, &rc);
}

static int cpu_create(model_runner_t *r, const st_model_t *m) {
    const qwen3_config_t *c = &r->cfg;
    const runner_config_t *rc = &r->rc;
    cpu_state_t *s = calloc(1, sizeof *s);
    if (!s) return mv_error("model runner (cpu): out of host memory");
    r->state = s;
    qwen3_weights_t w;
    if (qwen3_weights_bind(c, m, &w)) return -1;
    const size_t H = (size_t)c->hidden_size, V = (size_t)c->vocab_size, I = (size_t)c->intermediate_size;
    const size_t qn = (size_t)c->num_attention_heads * c->head_dim;
    const size_t qkv = qn + 2 * (size_t)c->num_key_value_heads * c->head_dim;
    const size_t Tm = (size_t)rc->max_num_batched_tokens, Sm = (size_t)rc->max_num_seqs;
    int rcode = 0;
    s->layers = alloc_count((size_t)c->num_hidden_layers, sizeof *s->layers, NULL, "layers");
    s->embed = alloc_count(V * H, sizeof(bf16_t), &r->weight_bytes, "embed_tokens");
    s->final_norm = to_f32(w.norm, &r->weight_bytes);
    if (!s->layers || !s->embed || !s->final_norm) rcode = -1;
    if (!rcode) {
        to_bf16(w.embed_tokens, s->embed);
        if (w.lm_head == w.embed_tokens) {
            s->lm_head = s->embed;
        } else {
            s->lm_head = alloc_count(V * H, sizeof(bf16_t), &r->weight_bytes, "lm_head");
            if (s->lm_head) to_bf16(w.lm_head, s->lm_head);
            else rcode = -1;
        }
    }
    for (int l = 0; !rcode && l < c->num_hidden_layers; l++)
        rcode = bind_layer(&s->layers[l], &w.layers[l], c, rc, &r->weight_bytes, &r->kv_cache_bytes);
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
    s->gate_up = alloc_count(Tm * 2 * I, sizeof(float), sb, "scratch");
    s->act = alloc_count(Tm * I, sizeof(float), sb, "scratch");
    s->last = alloc_count(Sm * H, sizeof(float), sb, "scratch");
    s->cu_last = alloc_count(Sm + 1, sizeof(int32_t), sb, "scratch");
    if (!s->residual || !s->hidden || !s->x || !s->qkv || !s->q || !s->attn || !s->gate_up || !s->act ||
        !s->last || !s->cu_last)
        return -1;
    return 0;
}

// One decoder layer over the step's T tokens. On entry s->hidden holds the
// normed input and s->residual the residual stream; on exit s->x holds the
// MLP's output, still to be added to the residual by the next norm.
static int cpu_layer(const model_runner_t *r, cpu_state_t *s, const cpu_layer_t *cl, const runner_step_t *in) {
    const qwen3_config_t *c = &r->cfg;
    const runner_config_t *rc = &r->rc;
    const int T = in->num_tokens, H = c->hidden_size, I = c->intermediate_size, hd = c->head_dim;
    const int nq = c->num_attention_heads, nkv = c->num_key_value_heads;
    const int qn = nq * hd, kvn = nkv * hd, qkv_n = qn + 2 * kvn, th = rc->num_threads;
    const float eps = (float)c->rms_norm_eps, scale = 1.0f / sqrtf((float)hd);

    // Attention block.
    if (linear_cpu(s->qkv, s->hidden, cl->qkv, cl->qkv_bias, T, qkv_n, H, th) ||
        qk_norm_rope_cpu(s->qkv, cl->q_norm, cl->k_norm, in->positions, &s->rope, T, nq, nkv, hd, eps) ||
        store_kvcache_f32_cpu(s->qkv + qn, qkv_n, s->qkv + qn + kvn, qkv_n, cl->k_cache, cl->v_cache,
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
    if (rca || linear_cpu(s->x, s->attn, cl->o_proj, cl->o_bias, T, H, qn, th)) return -1;

    // MLP block: residual += attention output, then normalise.
    if (fused_add_rmsnorm_cpu(s->hidden, s->residual, s->x, cl->post_norm, T, H, eps) ||
        linear_cpu(s->gate_up, s->hidden, cl->gate_up, NULL, T, 2 * I, H, th) ||
        silu_and_mul_cpu(s->act, s->gate_up, T, I) || linear_cpu(s->x, s->act, cl->down, NULL, T, H, I, th))
        return -1;
    return 0;
}

static int cpu_step(model_runner_t *r, const runner_step_t *in, float *logits) {
    cpu_state_t *s = r->state;
    const qwen3_config_t *c = &r->cfg;
    const int T = in->num_tokens, H = c->hidden_size, V = c->vocab_size;
    const float eps = (float)c->rms_norm_eps;
    if (T == 0) return 0;
    // The residual stream starts as the embeddings; layer 0's input norm is
    // a plain one (nothing to add yet), every later norm adds first.
    if (embedding_cpu(s->residual, in->input_ids, s->embed, T, H, 0, V) ||
        rmsnorm_cpu(s->hidden, s->residual, s->layers[0].input_norm, T, H, eps))
        return -1;
    for (int l = 0; l < c->num_hidden_layers; l++) {
        if (l > 0 && fused_add_rmsnorm_cpu(s->hidden, s->residual, s->x, s->layers[l].input_norm, T, H, eps))
            return -1;
        if (cpu_layer(r, s, &s->layers[l], in)) {
            char what[1024];
            snprintf(what, sizeof what, "%s", mv_last_error());
            return mv_error("layer %d: %s", l, what);
        }
    }
    if (in->num_sample == 0) return 0;
    if (fused_add_rmsnorm_cpu(s->hidden, s->residual, s->x, s->final_norm, T, H, eps)) return -1;
    // The LM head runs only on the rows that sample: a cu_seqlens whose
    // sequences end at the sampled tokens lets gather_last_tokens_cpu pick them.
    s->cu_last[0] = 0;
    for (int k = 0; k < in->num_sample; k++) s->cu_last[k + 1] = in->sample_token_index[k] + 1;
    const int S = in->num_sample;
    if (gather_last_tokens_cpu(s->last, s->hidden, s->cu_last, S, s->cu_last[S], H) ||
        linear_cpu(logits, s->last, s->lm_head, NULL, S, V, H, r->rc.num_threads))
        return -1;
    return 0;
}

// The CPU backend samples on the host: no step_sample.
const runner_backend_t RUNNER_BACKEND_CPU = {"cpu", cpu_create, cpu_step, cpu_destroy, NULL};

// ---- the device-independent part -------------------------------------------------------

size_t model_runner_block_bytes(const qwen3_config_t *cfg, int block_size, runner_device_t device) {
    size_t elem = device == RUNNER_DEVICE_CPU ? sizeof(float) : sizeof(bf16_t);
    // K and V, every layer, block_size tokens of nkv heads of hd values.
    return 2 * (size_t)cfg->num_hidden_layers * (size_t)block_size * (size_t)cfg->num_key_value_heads *
           (size_t)cfg->head_dim * elem;
}

const char *model_runner_device_name(runner_device_t device) { return device == RUNNER_DEVICE_CUDA ? "cuda" : "cpu"; }

int model_runner_device_available(runner_device_t device, char *why, size_t cap) {
    if (device == RUNNER_DEVICE_CPU) return 1;
#if MV_HAVE_CUDA
    gpu_info_t info;
    if (gpu_probe(&info, 0) == 0) return 1;
    snprintf(why, cap, "%s", info.why_not);
#else
    snprintf(why, cap, "this minivllm was built without CUDA (nvcc was not found, or NO_CUDA=1)");
#endif
    return 0;
}

runner_device_t model_runner_default_device(void) {
    char why[256];
    return model_runner_device_available(RUNNER_DEVICE_CUDA, why, sizeof why) ? RUNNER_DEVICE_CUDA : RUNNER_DEVICE_CPU;
}

static int validate_config(const runner_config_t *rc, const qwen3_config_t *c) {
    if (rc->max_num_seqs < 1 || rc->max_num_batched_tokens < rc->max_num_seqs)
        return mv_error("model runner: max_num_seqs (%d) must be >= 1 and <= max_num_batched_tokens (%d)",
                        rc->max_num_seqs, rc->max_num_batched_tokens);
    if (rc->max_model_len < 1 || rc->max_model_len > c->max_position_embeddings)
        return mv_error("model runner: max_model_len %d must be in [1, max_position_embeddings = %d]",
                        rc->max_model_len, c->max_position_embeddings);
    if (rc->num_threads < 0) return mv_error("model runner: num_threads must be >= 0, got %d", rc->num_threads);
    if (!(rc->gpu_memory_utilization >= 0 && rc->gpu_memory_utilization <= 1))
        return mv_error("model runner: gpu_memory_utilization %g must be in (0, 1] (0 = 0.9)",
                        rc->gpu_memory_utilization);
    // The cuda backend may be left to size the cache itself (num_blocks 0):
    // it knows how much memory is left only after placing the weights.
    const int sized_later = rc->device == RUNNER_DEVICE_CUDA && rc->num_blocks == 0;
    if (attention_validate_heads(rc->max_num_seqs, c->num_attention_heads, c->num_key_value_heads, c->head_dim,
                                 1.0f / sqrtf((float)c->head_dim)) ||
        attention_validate_cache(rc->block_size, sized_later ? 1 : rc->num_blocks, 1))
        return -1;
    return 0;
}

int model_runner_create(const qwen3_config_t *cfg, const st_model_t *weights, const runner_config_t *rc,
                        model_runner_t **out) {
    *out = NULL;
    const runner_backend_t *b = NULL;
    char why[256];
    if (!model_runner_device_available(rc->device, why, sizeof why))
        return mv_error("--device %s: %s (use --device cpu)", model_runner_device_name(rc->device), why);
    if (rc->device == RUNNER_DEVICE_CPU) b = &RUNNER_BACKEND_CPU;
#if MV_HAVE_CUDA
    else b = &RUNNER_BACKEND_CUDA;
#endif
    if (!b) return mv_error("model runner: unknown device %d", (int)rc->device);
    if (validate_config(rc, cfg)) return -1;
    model_runner_t *r = calloc(1, sizeof *r);
    if (!r) return mv_error("model runner: out of host memory");
    r->cfg = *cfg;
    r->rc = *rc;
    r->backend = b;
    if (b->create(r, weights)) {
        char what[1024];
        snprintf(what, sizeof what, "%s", mv_last_error());
        model_runner_free(r);
        return mv_error("model runner (%s): %s", b->name, what);
    }
    *out = r;
    return 0;
}

void model_runner_free(model_runner_t *r) {
    if (!r) return;
    if (r->backend) r->backend->destroy(r);
    free(r);
}

// The step's checks, shared by model_runner_step and model_runner_step_sample.
static int validate_step(const model_runner_t *r, const runner_step_t *in) {
    const runner_config_t *rc = &r->rc;
    const int T = in->num_tokens, S = in->num_seqs;
    if (T < 0 || T > rc->max_num_batched_tokens || S < 0 || S > rc->max_num_seqs || S > T ||
        in->num_sample < 0 || in->num_sample > S)
        return mv_error("model runner: step of %d tokens, %d rows, %d sampled does not fit max_num_batched_tokens "
                        "%d, max_num_seqs %d",
                        T, S, in->num_sample, rc->max_num_batched_tokens, rc->max_num_seqs);
    if (in->max_blocks_per_seq < 1 || (long long)in->max_blocks_per_seq * rc->block_size < rc->max_model_len)
        return mv_error("model runner: block tables of width %d cannot hold max_model_len %d", in->max_blocks_per_seq,
                        rc->max_model_len);
    if (T == 0) return 0;
    if (embedding_validate_ids(in->input_ids, T, r->cfg.vocab_size) ||
        rope_validate_positions(in->positions, T, rc->max_model_len) || cu_seqlens_validate(in->cu_seqlens_q, S, T) ||
        attention_validate_paged_batch(in->cu_seqlens_q, in->context_lens, in->block_tables, S, rc->block_size,
                                       rc->num_blocks, in->max_blocks_per_seq))
        return -1;
    for (int k = 0; k < in->num_sample; k++)
        if (in->sample_token_index[k] < 0 || in->sample_token_index[k] >= T ||
            (k > 0 && in->sample_token_index[k] <= in->sample_token_index[k - 1]))
            return mv_error("model runner: sample_token_index[%d] = %d is not increasing inside [0, %d)", k,
                            in->sample_token_index[k], T);
    return 0;
}

int model_runner_step(model_runner_t *r, const runner_step_t *in, float *logits) {
    if (validate_step(r, in)) return -1;
    if (in->num_tokens == 0) return 0;
    return r->backend->step(r, in, logits);
}

int model_runner_samples_on_device(const model_runner_t *r) { return r->backend->step_sample != NULL; }

int model_runner_step_sample(model_runner_t *r, const runner_step_t *in, const runner_sampling_t *sp,
                             int32_t *sampled, float *logits) {
    if (!r->backend->step_sample)
        return mv_error("model runner (%s): this backend samples on the host (use model_runner_step)",
                        r->backend->name);
    if (validate_step(r, in)) return -1;
    for (int k = 0; k < in->num_sample; k++) {
        sampling_params_t p = {sp->temperature[k], sp->top_k[k], sp->top_p[k], 1, 0};
        if (sampler_validate_params(&p)) {
            char what[1024];
            snprintf(what, sizeof what, "%s", mv_last_error());
            return mv_error("model runner: sampled row %d: %s", k, what);
        }
        if (sp->gen_index[k] < 0) return mv_error("model runner: sampled row %d: gen_index %lld < 0", k,
                                                  (long long)sp->gen_index[k]);
    }
    if (in->num_tokens == 0) return 0;
    return r->backend->step_sample(r, in, sp, sampled, logits);
}

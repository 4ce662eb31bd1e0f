/*
 * chapters/09-engine/model/qwen3_weights.h - the tensors of a Qwen3ForCausalLM
 * checkpoint, found by name in the safetensors files and checked against
 * the config: every expected tensor present with its exact shape, nothing
 * else. Nothing is copied: each field points at an st_tensor_t, whose data
 * lies in the read-only file mapping (safetensors.h); the model runner
 * converts (st_to_bf16) and uploads from there.
 *
 * The names and shapes, with H = hidden_size, I = intermediate_size,
 * V = vocab_size, hd = head_dim, nq = num_attention_heads,
 * nkv = num_key_value_heads (nn.Linear stores [out_features, in_features]):
 *
 *   model.embed_tokens.weight                          [V, H]
 *   model.layers.{i}.input_layernorm.weight            [H]
 *   model.layers.{i}.self_attn.q_proj.weight           [nq * hd, H]
 *   model.layers.{i}.self_attn.k_proj.weight           [nkv * hd, H]
 *   model.layers.{i}.self_attn.v_proj.weight           [nkv * hd, H]
 *   model.layers.{i}.self_attn.o_proj.weight           [H, nq * hd]
 *   model.layers.{i}.self_attn.q_norm.weight           [hd]   (RMSNorm of each query head)
 *   model.layers.{i}.self_attn.k_norm.weight           [hd]   (RMSNorm of each key head)
 *   model.layers.{i}.post_attention_layernorm.weight   [H]
 *   model.layers.{i}.mlp.gate_proj.weight              [I, H]
 *   model.layers.{i}.mlp.up_proj.weight                [I, H]
 *   model.layers.{i}.mlp.down_proj.weight              [H, I]
 *   model.norm.weight                                  [H]
 *   lm_head.weight                                     [V, H]
 * and, only when config attention_bias is true, self_attn.{q,k,v,o}_proj.bias
 * ([nq * hd], [nkv * hd], [nkv * hd], [H]).
 *
 * Tied embeddings (tie_word_embeddings true, as in Qwen3-0.6B): the logits
 * use embed_tokens, and lm_head points at it. A checkpoint may still carry
 * lm_head.weight; it must then be [V, H], and it is ignored, as vLLM
 * ignores it (its bytes are not compared with embed_tokens').
 *
 * Build: part of build/libmv_host.a. Tests: tests/test_model_loading.c.
 */
#ifndef MV_QWEN3_WEIGHTS_H
#define MV_QWEN3_WEIGHTS_H

#include "chapters/09-engine/model/model_config.h"
#include "chapters/09-engine/model/safetensors.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    const st_tensor_t *input_layernorm;           // [H]
    const st_tensor_t *q_proj, *k_proj, *v_proj;  // [nq*hd, H], [nkv*hd, H], [nkv*hd, H]
    const st_tensor_t *o_proj;                    // [H, nq*hd]
    const st_tensor_t *q_bias, *k_bias, *v_bias;  // [nq*hd], [nkv*hd], [nkv*hd]; NULL unless attention_bias
    const st_tensor_t *o_bias;                    // [H]; NULL unless attention_bias
    const st_tensor_t *q_norm, *k_norm;           // [hd]
    const st_tensor_t *post_attention_layernorm;  // [H]
    const st_tensor_t *gate_proj, *up_proj;       // [I, H]
    const st_tensor_t *down_proj;                 // [H, I]
} qwen3_layer_weights_t;

typedef struct {
    const st_tensor_t *embed_tokens;  // [V, H]
    qwen3_layer_weights_t *layers;    // [num_hidden_layers]
    int n_layers;
    const st_tensor_t *norm;          // [H] the final RMSNorm
    const st_tensor_t *lm_head;       // [V, H]; == embed_tokens when tied
    int64_t n_params;                 // elements of the distinct tensors above
    size_t n_bytes;                   // their bytes as stored (before conversion to bf16)
} qwen3_weights_t;

// Find and check every tensor. 0 on success; -1 with mv_error() naming the
// file and the tensor (missing, unexpected, or of the wrong shape).
// The pointers live as long as `m`; free with qwen3_weights_free.
int qwen3_weights_bind(const qwen3_config_t *c, const st_model_t *m, qwen3_weights_t *w);
void qwen3_weights_free(qwen3_weights_t *w);

// A checkpoint that was never saved: every tensor qwen3_weights_bind expects
// for config c, bf16, in memory (st_model_alloc), drawn from `seed` as
// Hugging Face initialises a Qwen3 (matrices and embeddings normal(0, std),
// std = initializer_range, 0.02; norm weights 1; biases 0). It binds, converts
// and runs exactly as a loaded checkpoint does, so real shapes can be timed
// (`minivllm bench --random-weights`) from config.json alone. The same seed
// gives the same weights. Free with st_close.
int qwen3_weights_random(const qwen3_config_t *c, uint64_t seed, float std, st_model_t **out);

#ifdef __cplusplus
}
#endif
#endif

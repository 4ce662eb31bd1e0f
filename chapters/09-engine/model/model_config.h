/*
 * chapters/09-engine/model/model_config.h - Qwen3's hyper-parameters, read from a
 * Hugging Face model directory as it is downloaded:
 *
 *   config.json             the shapes (hidden size, layers, heads...), RoPE,
 *                           the norm's epsilon, whether lm_head is tied
 *   generation_config.json  end-of-sequence ids and default sampling
 *                           (optional: without it the ids come from
 *                           config.json and sampling uses vLLM's defaults)
 *
 * Every value is checked before the engine sizes a buffer with it: a missing
 * key, a wrong JSON type or a value out of range is an error that names the
 * file and the key, e.g.
 *   "DIR/config.json: num_key_value_heads 5 does not divide num_attention_heads 16".
 *
 * What is accepted:
 *   - architectures must be ["Qwen3ForCausalLM"]. LlamaForCausalLM is NOT
 *     accepted: Llama has no q_norm/k_norm, so qwen3_weights.c could not
 *     load it anyway, and a config that loads should mean a model that runs.
 *   - rope_theta at the top level (transformers 4.x) or inside
 *     rope_parameters (transformers 5.x); when both are there they must agree.
 *   - RoPE scaling: none (rope_scaling null/absent, or rope_type "default")
 *     or "llama3", named by "rope_type" or the older "type", in rope_scaling
 *     or rope_parameters. Any other type (yarn, dynamic, linear...) is an error.
 *   - torch_dtype or dtype: "bfloat16", "float16" or "float32" (absent:
 *     bfloat16). It only says what the checkpoint was saved as; the weights
 *     are converted to bf16 on load whatever it says.
 *
 * Build: part of build/libmv_host.a. Tests: tests/test_model_loading.c.
 */
#ifndef MV_MODEL_CONFIG_H
#define MV_MODEL_CONFIG_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum { QWEN3_MAX_EOS = 8 };

typedef enum { QWEN3_ROPE_NONE = 0, QWEN3_ROPE_LLAMA3 = 1 } qwen3_rope_kind_t;

// Llama 3.1's RoPE scaling: wavelengths longer than
// original_max_position_embeddings / low_freq_factor are divided by
// `factor`, those shorter than original / high_freq_factor are kept, and
// those between are blended smoothly. Only read when kind == LLAMA3.
typedef struct {
    qwen3_rope_kind_t kind;
    double factor;                         // >= 1: how much longer the context becomes
    double low_freq_factor;                // > 0
    double high_freq_factor;               // > low_freq_factor
    int original_max_position_embeddings;  // > 0: the context length trained before scaling
} qwen3_rope_scaling_t;

typedef struct {
    // ---- config.json --------------------------------------------------------
    char architecture[64];        // "Qwen3ForCausalLM"
    int vocab_size;               // V: rows of embed_tokens and lm_head
    int hidden_size;              // H: width of the residual stream
    int intermediate_size;        // I: the MLP's inner width (gate/up: [I, H])
    int num_hidden_layers;        // L: decoder layers
    int num_attention_heads;      // query heads (q_proj: [heads * head_dim, H])
    int num_key_value_heads;      // KV heads, divides num_attention_heads (GQA)
    int head_dim;                 // hd: Qwen3 sets it (0.6B: 128, although H / heads = 64);
                                  // when absent it is H / heads
    double rms_norm_eps;          // epsilon inside RMSNorm's square root
    double rope_theta;            // RoPE base (Qwen3: 1e6)
    qwen3_rope_scaling_t rope_scaling;  // none, or llama3
    int max_position_embeddings;  // the longest context the model was made for
    int tie_word_embeddings;      // 1: lm_head is embed_tokens (no lm_head.weight needed)
    int attention_bias;           // 1: q/k/v/o_proj have biases (Qwen3: 0)
    char dtype[16];               // torch_dtype / dtype: "bfloat16", "float16", "float32"
    // ---- generation_config.json (token ids fall back to config.json) --------
    int32_t eos_token_ids[QWEN3_MAX_EOS];  // [n_eos] generation stops at any of them
    int n_eos;                             // 0 .. QWEN3_MAX_EOS
    int32_t bos_token_id;                  // -1 when there is none
    float temperature;                     // default sampling temperature (absent: 1.0)
    int top_k;                             // 0 = off (absent: off; -1 in the file also means off)
    float top_p;                           // (0, 1] (absent: 1.0 = off)
} qwen3_config_t;

// Read DIR/config.json and DIR/generation_config.json (if present) into *c.
// 0 on success; -1 with mv_error() naming the file and the key.
int qwen3_config_load(const char *model_dir, qwen3_config_t *c);

// Parameters the config implies (embedding, layers, final norm, and lm_head
// unless tied), to check a checkpoint's size against.
int64_t qwen3_config_n_params(const qwen3_config_t *c);

const char *rope_scaling_name(qwen3_rope_kind_t k);

#ifdef __cplusplus
}
#endif
#endif

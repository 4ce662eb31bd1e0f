/*
 * chapters/09-engine/model/model_config.c - config.json and generation_config.json
 * -> qwen3_config_t, every value checked (see model_config.h for what is
 * accepted).
 *
 * Reading order: small typed readers that name the file and the key in
 * every error, then RoPE (the one part whose layout changed between
 * transformers versions), the cross-checks between values, and
 * generation_config.json.
 */
#include "chapters/09-engine/model/model_config.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "chapters/09-engine/model/mapped_file.h"
#include "common/check.h"

// Sizes beyond this are a corrupt file, not a model: 2^24 keeps every
// product of two of them (a weight matrix's element count) inside int64 and
// every single one inside int.
#define MAX_SIZE (1L << 24)

// Where keys are read from, for error messages: "DIR/config.json: rope_scaling.factor ...".
typedef struct {
    const char *path;    // the file
    const cJSON *obj;    // the JSON object holding the keys
    const char *prefix;  // "" at the top level, "rope_scaling." inside it
} keys_t;

// The value of `key`, or NULL when it is absent or JSON null (HF writes
// null for "not set", e.g. "rope_scaling": null).
static const cJSON *get(const keys_t *k, const char *key) {
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(k->obj, key);
    return cJSON_IsNull(it) ? NULL : it;
}

static int missing(const keys_t *k, const char *key) {
    return mv_error("%s: %s%s is missing", k->path, k->prefix, key);
}

// An integer in [lo, hi]. Absent: an error if required, else *out = dflt.
static int read_int(const keys_t *k, const char *key, int required, int dflt, long lo, long hi, int *out) {
    const cJSON *it = get(k, key);
    if (!it) {
        *out = dflt;
        return required ? missing(k, key) : 0;
    }
    if (!cJSON_IsNumber(it) || it->valuedouble != floor(it->valuedouble))
        return mv_error("%s: %s%s must be an integer", k->path, k->prefix, key);
    double v = it->valuedouble;
    if (v < (double)lo || v > (double)hi)
        return mv_error("%s: %s%s is %.0f; it must be from %ld to %ld", k->path, k->prefix, key, v, lo, hi);
    *out = (int)v;
    return 0;
}

// A finite number in (lo, hi] when lo_open, else [lo, hi].
static int read_num(const keys_t *k, const char *key, int required, double dflt, double lo, int lo_open, double hi,
                    double *out) {
    const cJSON *it = get(k, key);
    if (!it) {
        *out = dflt;
        return required ? missing(k, key) : 0;
    }
    if (!cJSON_IsNumber(it) || !isfinite(it->valuedouble))
        return mv_error("%s: %s%s must be a finite number", k->path, k->prefix, key);
    double v = it->valuedouble;
    if ((lo_open ? v <= lo : v < lo) || v > hi)
        return mv_error("%s: %s%s is %g; it must be in %c%g, %g]", k->path, k->prefix, key, v, lo_open ? '(' : '[',
                        lo, hi);
    *out = v;
    return 0;
}

static int read_bool(const keys_t *k, const char *key, int dflt, int *out) {
    const cJSON *it = get(k, key);
    *out = dflt;
    if (!it) return 0;
    if (!cJSON_IsBool(it)) return mv_error("%s: %s%s must be true or false", k->path, k->prefix, key);
    *out = cJSON_IsTrue(it);
    return 0;
}

// A string copied into out[cap]; absent: dflt (NULL dflt = required).
static int read_str(const keys_t *k, const char *key, const char *dflt, char *out, size_t cap) {
    const cJSON *it = get(k, key);
    if (!it && !dflt) return missing(k, key);
    if (it && !cJSON_IsString(it)) return mv_error("%s: %s%s must be a string", k->path, k->prefix, key);
    const char *s = it ? it->valuestring : dflt;
    if (strlen(s) >= cap) return mv_error("%s: %s%s \"%.40s...\" is too long", k->path, k->prefix, key, s);
    snprintf(out, cap, "%s", s);
    return 0;
}

// ---- architecture and dtype ---------------------------------------------------------------

static int read_architecture(const keys_t *k, qwen3_config_t *c) {
    const cJSON *a = get(k, "architectures");
    if (!a) return missing(k, "architectures");
    const cJSON *first = cJSON_GetArrayItem(a, 0);
    if (!cJSON_IsArray(a) || cJSON_GetArraySize(a) != 1 || !cJSON_IsString(first))
        return mv_error("%s: architectures must be a list of one name, [\"Qwen3ForCausalLM\"]", k->path);
    snprintf(c->architecture, sizeof c->architecture, "%s", first->valuestring);
    if (strcmp(first->valuestring, "Qwen3ForCausalLM") != 0)
        return mv_error("%s: architectures [\"%.60s\"] is not supported; only Qwen3ForCausalLM is", k->path,
                        first->valuestring);
    char model_type[32];
    if (read_str(k, "model_type", "qwen3", model_type, sizeof model_type)) return -1;
    if (strcmp(model_type, "qwen3") != 0)
        return mv_error("%s: model_type \"%s\" is not \"qwen3\"", k->path, model_type);
    return 0;
}

// transformers 4.x writes "torch_dtype", 5.x writes "dtype".
static int read_dtype(const keys_t *k, qwen3_config_t *c) {
    const char *key = get(k, "dtype") ? "dtype" : "torch_dtype";
    if (read_str(k, key, "bfloat16", c->dtype, sizeof c->dtype)) return -1;
    if (strcmp(c->dtype, "bfloat16") && strcmp(c->dtype, "float16") && strcmp(c->dtype, "float32"))
        return mv_error("%s: %s \"%s\" is not bfloat16, float16 or float32", k->path, key, c->dtype);
    return 0;
}

// ---- RoPE ------------------------------------------------------------------------------------

const char *rope_scaling_name(qwen3_rope_kind_t kind) { return kind == QWEN3_ROPE_LLAMA3 ? "llama3" : "none"; }

// The scaling type of an object: "rope_type" (current) or "type" (older
// configs). Absent: "default" (no scaling), or an error when `required`.
static int read_rope_type(const keys_t *k, int required, const char **type) {
    const cJSON *t = get(k, "rope_type"), *old = get(k, "type");
    *type = "default";
    if (!t && !old)
        return required ? mv_error("%s: %srope_type (or %stype) is missing", k->path, k->prefix, k->prefix) : 0;
    if ((t && !cJSON_IsString(t)) || (old && !cJSON_IsString(old)))
        return mv_error("%s: %srope_type must be a string", k->path, k->prefix);
    if (t && old && strcmp(t->valuestring, old->valuestring) != 0)
        return mv_error("%s: %srope_type \"%s\" and %stype \"%s\" disagree", k->path, k->prefix, t->valuestring,
                        k->prefix, old->valuestring);
    *type = t ? t->valuestring : old->valuestring;
    return 0;
}

static int read_llama3(const keys_t *k, qwen3_rope_scaling_t *r) {
    r->kind = QWEN3_ROPE_LLAMA3;
    if (read_num(k, "factor", 1, 0, 1.0, 0, 1e6, &r->factor) ||
        read_num(k, "low_freq_factor", 1, 0, 0.0, 1, 1e6, &r->low_freq_factor) ||
        read_num(k, "high_freq_factor", 1, 0, 0.0, 1, 1e6, &r->high_freq_factor) ||
        read_int(k, "original_max_position_embeddings", 1, 0, 1, MAX_SIZE, &r->original_max_position_embeddings))
        return -1;
    // The blend between the two wavelengths divides by their difference.
    if (r->high_freq_factor <= r->low_freq_factor)
        return mv_error("%s: %shigh_freq_factor %g must be larger than %slow_freq_factor %g", k->path, k->prefix,
                        r->high_freq_factor, k->prefix, r->low_freq_factor);
    return 0;
}

// rope_theta and the scaling: transformers 4.x puts rope_theta at the top
// level and the scaling in "rope_scaling" (null for none); 5.x puts both in
// "rope_parameters" ({"rope_type": "default", "rope_theta": 1e6}).
static int read_rope(const keys_t *top, qwen3_config_t *c) {
    const cJSON *params = get(top, "rope_parameters"), *scaling = get(top, "rope_scaling");
    if (params && !cJSON_IsObject(params))
        return mv_error("%s: rope_parameters must be an object or null", top->path);
    if (scaling && !cJSON_IsObject(scaling)) return mv_error("%s: rope_scaling must be an object or null", top->path);
    keys_t kp = {top->path, params, "rope_parameters."}, ks = {top->path, scaling, "rope_scaling."};

    double theta_top = 0, theta_par = 0;
    int has_top = get(top, "rope_theta") != NULL, has_par = params && get(&kp, "rope_theta");
    if (!has_top && !has_par)
        return mv_error("%s: rope_theta is missing (looked at the top level and in rope_parameters)", top->path);
    if ((has_top && read_num(top, "rope_theta", 1, 0, 0.0, 1, 1e12, &theta_top)) ||
        (has_par && read_num(&kp, "rope_theta", 1, 0, 0.0, 1, 1e12, &theta_par)))
        return -1;
    if (has_top && has_par && theta_top != theta_par)
        return mv_error("%s: rope_theta %g and rope_parameters.rope_theta %g disagree", top->path, theta_top, theta_par);
    c->rope_theta = has_top ? theta_top : theta_par;

    // The scaling lives in rope_scaling when that is set, else in rope_parameters.
    const keys_t *ksrc = scaling ? &ks : params ? &kp : NULL;
    c->rope_scaling = (qwen3_rope_scaling_t){QWEN3_ROPE_NONE, 1.0, 0, 0, 0};
    if (!ksrc) return 0;
    const char *type;
    if (read_rope_type(ksrc, ksrc == &ks, &type)) return -1;
    if (strcmp(type, "default") == 0) return 0;
    if (strcmp(type, "llama3") == 0) return read_llama3(ksrc, &c->rope_scaling);
    return mv_error("%s: %srope_type \"%.40s\" is not supported (only llama3, or none)", top->path, ksrc->prefix, type);
}

// ---- the shapes ------------------------------------------------------------------------------

static int read_shapes(const keys_t *k, qwen3_config_t *c) {
    if (read_int(k, "vocab_size", 1, 0, 1, MAX_SIZE, &c->vocab_size) ||
        read_int(k, "hidden_size", 1, 0, 1, MAX_SIZE, &c->hidden_size) ||
        read_int(k, "intermediate_size", 1, 0, 1, MAX_SIZE, &c->intermediate_size) ||
        read_int(k, "num_hidden_layers", 1, 0, 1, 4096, &c->num_hidden_layers) ||
        read_int(k, "num_attention_heads", 1, 0, 1, 4096, &c->num_attention_heads) ||
        read_int(k, "num_key_value_heads", 1, 0, 1, 4096, &c->num_key_value_heads) ||
        read_int(k, "head_dim", 0, 0, 1, 4096, &c->head_dim) ||
        read_int(k, "max_position_embeddings", 1, 0, 1, MAX_SIZE, &c->max_position_embeddings) ||
        read_num(k, "rms_norm_eps", 1, 0, 0.0, 1, 1.0, &c->rms_norm_eps) ||
        read_bool(k, "tie_word_embeddings", 0, &c->tie_word_embeddings) ||
        read_bool(k, "attention_bias", 0, &c->attention_bias))
        return -1;
    // Grouped-query attention: each KV head serves heads / kv query heads.
    if (c->num_attention_heads % c->num_key_value_heads != 0)
        return mv_error("%s: num_key_value_heads %d does not divide num_attention_heads %d", k->path,
                        c->num_key_value_heads, c->num_attention_heads);
    if (c->head_dim == 0) {
        if (c->hidden_size % c->num_attention_heads != 0)
            return mv_error("%s: head_dim is absent and hidden_size %d is not a multiple of num_attention_heads %d",
                            k->path, c->hidden_size, c->num_attention_heads);
        c->head_dim = c->hidden_size / c->num_attention_heads;
    }
    // RoPE rotates the head's dimensions in pairs.
    if (c->head_dim % 2 != 0) return mv_error("%s: head_dim %d must be even (RoPE rotates pairs)", k->path, c->head_dim);
    if (c->rope_scaling.kind == QWEN3_ROPE_LLAMA3 &&
        c->rope_scaling.original_max_position_embeddings > c->max_position_embeddings)
        return mv_error("%s: rope_scaling.original_max_position_embeddings %d exceeds max_position_embeddings %d",
                        k->path, c->rope_scaling.original_max_position_embeddings, c->max_position_embeddings);
    return 0;
}

// ---- token ids and sampling ---------------------------------------------------------------------

// eos_token_id: one id or a list of ids (Qwen3: [151645, 151643], i.e.
// <|im_end|> and <|endoftext|>). Absent: *found = 0.
static int read_eos(const keys_t *k, qwen3_config_t *c, int *found) {
    const cJSON *e = get(k, "eos_token_id");
    *found = e != NULL;
    if (!e) return 0;
    const cJSON *one = cJSON_IsArray(e) ? e->child : e;
    c->n_eos = 0;
    for (; one; one = cJSON_IsArray(e) ? one->next : NULL) {
        if (c->n_eos == QWEN3_MAX_EOS)
            return mv_error("%s: eos_token_id lists more than %d ids", k->path, QWEN3_MAX_EOS);
        double v = cJSON_IsNumber(one) ? one->valuedouble : -1;
        if (v != floor(v) || v < 0 || v >= c->vocab_size)
            return mv_error("%s: eos_token_id must be an id or a list of ids in [0, vocab_size %d)", k->path,
                            c->vocab_size);
        c->eos_token_ids[c->n_eos++] = (int32_t)v;
    }
    return 0;
}

static int read_generation(const char *dir, const keys_t *cfg, qwen3_config_t *c) {
    char path[4096];
    snprintf(path, sizeof path, "%s/generation_config.json", dir);
    // Sampling defaults when the file or a key is absent: vLLM's (plain
    // sampling over the whole vocabulary). vLLM, like this engine, ignores
    // do_sample: the request decides, the file only sets defaults.
    c->temperature = 1.0f;
    c->top_k = 0;
    c->top_p = 1.0f;
    int found = 0, bos = -1;
    cJSON *root = NULL;
    if (file_exists(path)) {
        if (!(root = json_load_file(path))) return -1;
        if (!cJSON_IsObject(root)) {
            cJSON_Delete(root);
            return mv_error("%s: not a JSON object", path);
        }
        keys_t g = {path, root, ""};
        double t, p;
        int rc = read_eos(&g, c, &found) || read_int(&g, "bos_token_id", 0, -1, 0, c->vocab_size - 1, &bos) ||
                 read_num(&g, "temperature", 0, 1.0, 0.0, 0, 1e6, &t) ||
                 read_int(&g, "top_k", 0, 0, -1, 1L << 30, &c->top_k) ||
                 read_num(&g, "top_p", 0, 1.0, 0.0, 1, 1.0, &p);
        cJSON_Delete(root);
        if (rc) return -1;
        c->temperature = (float)t;
        c->top_p = (float)p;
        if (c->top_k < 0) c->top_k = 0;  // HF and vLLM write -1 or 0 for "off"
    }
    // The token ids may also (or only) be in config.json.
    if (!found && read_eos(cfg, c, &found)) return -1;
    if (bos < 0 && read_int(cfg, "bos_token_id", 0, -1, 0, c->vocab_size - 1, &bos)) return -1;
    c->bos_token_id = bos;
    return 0;
}

// ---- the whole config -------------------------------------------------------------------------

int qwen3_config_load(const char *dir, qwen3_config_t *c) {
    *c = (qwen3_config_t){0};
    char path[4096];
    if (snprintf(path, sizeof path, "%s/config.json", dir) >= (int)sizeof path)
        return mv_error("%s: model directory name too long", dir);
    cJSON *root = json_load_file(path);
    if (!root) return -1;
    keys_t k = {path, root, ""};
    int rc = cJSON_IsObject(root) ? 0 : mv_error("%s: not a JSON object", path);
    // RoPE before the shapes: the shapes' cross-checks look at the scaling.
    if (!rc)
        rc = read_architecture(&k, c) || read_dtype(&k, c) || read_rope(&k, c) || read_shapes(&k, c) ||
             read_generation(dir, &k, c);
    cJSON_Delete(root);
    return rc ? -1 : 0;
}

int64_t qwen3_config_n_params(const qwen3_config_t *c) {
    int64_t H = c->hidden_size, I = c->intermediate_size, hd = c->head_dim;
    int64_t q = c->num_attention_heads * hd, kv = c->num_key_value_heads * hd;
    int64_t attn = q * H + 2 * kv * H + H * q + 2 * hd + (c->attention_bias ? q + 2 * kv + H : 0);
    int64_t layer = 2 * H + attn + 3 * I * H;
    int64_t emb = (int64_t)c->vocab_size * H;
    return emb + c->num_hidden_layers * layer + H + (c->tie_word_embeddings ? 0 : emb);
}

/*
 * tests/test_model_loading.c - Criterion tests of loading a Hugging Face
 * model directory (chapters/09-engine/): model_config.c (config.json,
 * generation_config.json), safetensors.c (the weight files, single or
 * sharded), qwen3_weights.c (the exact set of Qwen3 tensors) and the
 * `minivllm inspect` command.
 *
 * No binary file is committed: each test writes a tiny Qwen3 (2 layers,
 * hidden 8, 2 query heads, 1 KV head, head_dim 4, vocab 16, intermediate 12)
 * into a fresh temporary directory with the small safetensors writer below,
 * which can also lie (wrong header length, offsets, dtypes, truncation) to
 * make the broken files. Every failure must be an error that names the file
 * and the tensor or key; the tests check both with strstr.
 * The real Qwen3-0.6B config is read when MV_QWEN3_DIR is set (skipped,
 * saying so, when it is not).
 *
 * Run: make test  (or build/tests/test_model_loading after make)
 */
#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <ftw.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "chapters/09-engine/model/model_config.h"
#include "chapters/09-engine/model/qwen3_weights.h"
#include "chapters/09-engine/model/safetensors.h"
#include "common/bf16.h"
#include "common/check.h"
#include "tests/helpers.h"

// ---- a temporary model directory ----------------------------------------------------

static char tmp_dir[64];

static void path_of(char *out, size_t cap, const char *name) { snprintf(out, cap, "%s/%s", tmp_dir, name); }

static void write_text(const char *name, const char *text) {
    char path[256];
    path_of(path, sizeof path, name);
    FILE *f = fopen(path, "wb");
    cr_assert(f, "cannot write %s", path);
    fputs(text, f);
    fclose(f);
}

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
    return remove(path);
}

static void make_tmp(void) {
    strcpy(tmp_dir, "/tmp/mv_model_XXXXXX");
    cr_assert(mkdtemp(tmp_dir));
}

static void remove_tmp(void) { nftw(tmp_dir, remove_entry, 8, FTW_DEPTH | FTW_PHYS); }

// ---- a small safetensors writer ---------------------------------------------------------

typedef struct {
    char name[96];
    char dtype[8];       // "BF16", "F16", "F32", or anything (e.g. "I64") for the bad cases
    int ndim;
    int64_t shape[2];
    const void *data;    // NULL: a pattern (see fill)
    int fixed_off;       // 1: off[] below is written as it is (a lie), else computed
    int64_t off[2];      // data_offsets [begin, end)
} entry_t;

typedef struct {
    entry_t e[64];
    int n;
} tensors_t;

// Lies the writer can tell about a file's layout.
typedef struct {
    uint64_t header_len_extra;  // added to the true header length
    size_t extra_data;          // zero bytes added to the data section
    size_t truncate;            // bytes cut off the end of the file
} lies_t;

static size_t elem_size(const char *dtype) {
    return strcmp(dtype, "F32") == 0 ? 4 : strcmp(dtype, "I64") == 0 ? 8 : 2;
}

static int64_t numel(const entry_t *e) {
    int64_t n = 1;
    for (int i = 0; i < e->ndim; i++) n *= e->shape[i];
    return n;
}

static entry_t *add(tensors_t *ts, const char *name, const char *dtype, int64_t d0, int64_t d1) {
    cr_assert(ts->n < 64);
    entry_t *e = &ts->e[ts->n++];
    *e = (entry_t){.ndim = d1 < 0 ? 1 : 2, .shape = {d0, d1}};
    snprintf(e->name, sizeof e->name, "%s", name);
    snprintf(e->dtype, sizeof e->dtype, "%s", dtype);
    return e;
}

static entry_t *find(tensors_t *ts, const char *name) {
    for (int i = 0; i < ts->n; i++)
        if (strcmp(ts->e[i].name, name) == 0) return &ts->e[i];
    cr_assert_fail("the test has no tensor %s", name);
    return NULL;
}

static void drop(tensors_t *ts, const char *name) {
    entry_t *e = find(ts, name);
    memmove(e, e + 1, (size_t)(ts->e + ts->n - (e + 1)) * sizeof *e);
    ts->n--;
}

// The value element k of tensor number t holds when no data is given: small
// distinct bf16 values, so that a pointer into the wrong tensor shows.
static float pattern(int t, int64_t k) { return (float)(t + 1) + 0.125f * (float)(k % 8); }

static void fill(uint8_t *dst, const entry_t *e, int t) {
    size_t es = elem_size(e->dtype), n = (size_t)numel(e);
    if (e->data) {
        memcpy(dst, e->data, n * es);
        return;
    }
    for (size_t k = 0; k < n; k++) {
        bf16_t b = float_to_bf16(pattern(t, (int64_t)k));
        memcpy(dst + k * es, &b, 2);  // other dtypes: only the bytes' count matters
    }
}

// Write tensors ts into `name`: 8-byte header length, JSON header padded
// with spaces to a multiple of 8, then the data, tensor after tensor.
static void write_st(const char *name, const tensors_t *ts, const lies_t *lie) {
    tensors_t t = *ts;
    int64_t at = 0;
    for (int i = 0; i < t.n; i++) {
        int64_t size = numel(&t.e[i]) * (int64_t)elem_size(t.e[i].dtype);
        if (!t.e[i].fixed_off) t.e[i].off[0] = at, t.e[i].off[1] = at + size;
        at += size;  // the data section is as long as the true sizes add up to
    }
    size_t data_len = (size_t)at + (lie ? lie->extra_data : 0);
    cJSON *h = cJSON_CreateObject();
    cJSON *meta = cJSON_AddObjectToObject(h, "__metadata__");
    cJSON_AddStringToObject(meta, "format", "pt");
    for (int i = 0; i < t.n; i++) {
        cJSON *o = cJSON_AddObjectToObject(h, t.e[i].name);
        cJSON_AddStringToObject(o, "dtype", t.e[i].dtype);
        cJSON *shape = cJSON_AddArrayToObject(o, "shape");
        for (int d = 0; d < t.e[i].ndim; d++) cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)t.e[i].shape[d]));
        cJSON *offs = cJSON_AddArrayToObject(o, "data_offsets");
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)t.e[i].off[0]));
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)t.e[i].off[1]));
    }
    char *json = cJSON_PrintUnformatted(h);
    cJSON_Delete(h);
    size_t hlen = (strlen(json) + 7) / 8 * 8;
    uint8_t *data = calloc(data_len + 1, 1);
    for (int i = 0, k = 0; i < t.n; i++) {
        size_t size = (size_t)(numel(&t.e[i]) * (int64_t)elem_size(t.e[i].dtype));
        if (t.e[i].off[0] >= 0 && (size_t)t.e[i].off[0] + size <= data_len) fill(data + t.e[i].off[0], &t.e[i], k);
        k++;
    }
    char path[256];
    path_of(path, sizeof path, name);
    FILE *f = fopen(path, "wb");
    cr_assert(f, "cannot write %s", path);
    uint64_t n = hlen + (lie ? lie->header_len_extra : 0);
    fwrite(&n, 8, 1, f);  // little-endian on the hosts the lab runs on
    fwrite(json, 1, strlen(json), f);
    for (size_t i = strlen(json); i < hlen; i++) fputc(' ', f);
    fwrite(data, 1, data_len, f);
    fclose(f);
    if (lie && lie->truncate) cr_assert_eq(truncate(path, (off_t)(8 + hlen + data_len - lie->truncate)), 0);
    free(json);
    free(data);
}

// ---- the tiny Qwen3 ---------------------------------------------------------------------

enum { V = 16, H = 8, I = 12, L = 2, NQ = 2, NKV = 1, HD = 4, N_TINY = 1 + 11 * L + 1 + 1 };

static const char TINY_CONFIG[] =
    "{\"architectures\": [\"Qwen3ForCausalLM\"], \"model_type\": \"qwen3\", \"vocab_size\": 16, "
    "\"hidden_size\": 8, \"intermediate_size\": 12, \"num_hidden_layers\": 2, \"num_attention_heads\": 2, "
    "\"num_key_value_heads\": 1, \"head_dim\": 4, \"rms_norm_eps\": 1e-06, \"rope_theta\": 1000000, "
    "\"rope_scaling\": null, \"max_position_embeddings\": 64, \"tie_word_embeddings\": false, "
    "\"attention_bias\": false, \"torch_dtype\": \"bfloat16\", \"bos_token_id\": 1, \"eos_token_id\": 2}";

// config.json = TINY_CONFIG with `key` set to the JSON `value` (NULL:
// removed); key NULL writes it unchanged.
static void write_config(const char *key, const char *value) {
    cJSON *c = cJSON_Parse(TINY_CONFIG);
    cr_assert(c);
    if (key) {
        cJSON_DeleteItemFromObjectCaseSensitive(c, key);
        cJSON *v = value ? cJSON_Parse(value) : NULL;
        cr_assert(!value || v, "bad test JSON %s", value);
        if (v) cJSON_AddItemToObject(c, key, v);
    }
    char *s = cJSON_Print(c);
    write_text("config.json", s);
    free(s);
    cJSON_Delete(c);
}

static void layer_name(char *out, size_t cap, int i, const char *suffix) {
    snprintf(out, cap, "model.layers.%d.%s", i, suffix);
}

// The tensors of the tiny Qwen3, in file order; lm_head unless tied.
static void tiny_tensors(tensors_t *ts, const char *dtype, int tied) {
    ts->n = 0;
    add(ts, "model.embed_tokens.weight", dtype, V, H);
    static const struct { const char *suffix; int64_t d0, d1; } layer[] = {
        {"input_layernorm.weight", H, -1},          {"self_attn.q_proj.weight", NQ * HD, H},
        {"self_attn.k_proj.weight", NKV * HD, H},   {"self_attn.v_proj.weight", NKV * HD, H},
        {"self_attn.o_proj.weight", H, NQ * HD},    {"self_attn.q_norm.weight", HD, -1},
        {"self_attn.k_norm.weight", HD, -1},        {"post_attention_layernorm.weight", H, -1},
        {"mlp.gate_proj.weight", I, H},             {"mlp.up_proj.weight", I, H},
        {"mlp.down_proj.weight", H, I},
    };
    for (int i = 0; i < L; i++)
        for (int k = 0; k < 11; k++) {
            char name[96];
            layer_name(name, sizeof name, i, layer[k].suffix);
            add(ts, name, dtype, layer[k].d0, layer[k].d1);
        }
    add(ts, "model.norm.weight", dtype, H, -1);
    if (!tied) add(ts, "lm_head.weight", dtype, V, H);
}

// The whole tiny model directory: config.json + model.safetensors.
static void write_tiny_model(void) {
    tensors_t ts;
    tiny_tensors(&ts, "BF16", 0);
    write_config(NULL, NULL);
    write_st("model.safetensors", &ts, NULL);
}

// The index of a sharded checkpoint: tensors [0, split) in shard 1, the rest in shard 2.
static void write_index(const tensors_t *ts, int split, const char *shard1, const char *shard2) {
    cJSON *root = cJSON_CreateObject(), *wm = cJSON_CreateObject();
    cJSON_AddItemToObject(cJSON_AddObjectToObject(root, "metadata"), "total_size", cJSON_CreateNumber(1234));
    for (int i = 0; i < ts->n; i++) cJSON_AddStringToObject(wm, ts->e[i].name, i < split ? shard1 : shard2);
    cJSON_AddItemToObject(root, "weight_map", wm);
    char *s = cJSON_Print(root);
    write_text("model.safetensors.index.json", s);
    free(s);
    cJSON_Delete(root);
}

#define SHARD1 "model-00001-of-00002.safetensors"
#define SHARD2 "model-00002-of-00002.safetensors"

static void write_shards(const tensors_t *ts, int split) {
    tensors_t a = {.n = 0}, b = {.n = 0};
    for (int i = 0; i < ts->n; i++) {
        if (i < split) a.e[a.n++] = ts->e[i];
        else b.e[b.n++] = ts->e[i];
    }
    write_st(SHARD1, &a, NULL);
    write_st(SHARD2, &b, NULL);
}

// ---- expecting errors ------------------------------------------------------------------

// The last error must mention every one of the (NULL-terminated) strings.
static void expect_error_names(const char *what, const char *const *needles) {
    const char *err = mv_last_error();
    for (int i = 0; needles[i]; i++)
        cr_expect(strstr(err, needles[i]) != NULL, "%s: the error should name \"%s\": %s", what, needles[i], err);
}
#define EXPECT_ERROR(what, ...) expect_error_names((what), (const char *const[]){__VA_ARGS__, NULL})

// Open the weights of tmp_dir and bind them with its config: 0 or -1.
static int load_all(qwen3_config_t *c, st_model_t **m, qwen3_weights_t *w) {
    *m = NULL;
    if (qwen3_config_load(tmp_dir, c)) return -1;
    if (st_open(tmp_dir, m)) return -1;
    int rc = qwen3_weights_bind(c, *m, w);
    if (rc) {
        st_close(*m);
        *m = NULL;
    }
    return rc;
}

// Write the tiny model with ts as its weights (single file), expect the
// load to fail with an error naming model.safetensors and `tensor`.
static void expect_bad_weights(const char *what, const tensors_t *ts, const lies_t *lie, const char *tensor,
                               const char *detail) {
    write_config(NULL, NULL);
    write_st("model.safetensors", ts, lie);
    qwen3_config_t c;
    st_model_t *m;
    qwen3_weights_t w;
    cr_assert_eq(load_all(&c, &m, &w), -1, "%s: loaded", what);
    EXPECT_ERROR(what, "model.safetensors", tensor, detail);
}

// ---- config.json and generation_config.json ---------------------------------------------

TestSuite(config, .init = make_tmp, .fini = remove_tmp);

Test(config, tiny_config_read) {
    write_config(NULL, NULL);
    qwen3_config_t c;
    cr_assert_eq(qwen3_config_load(tmp_dir, &c), 0, "%s", mv_last_error());
    cr_expect_str_eq(c.architecture, "Qwen3ForCausalLM");
    cr_expect_eq(c.vocab_size, V);
    cr_expect_eq(c.hidden_size, H);
    cr_expect_eq(c.intermediate_size, I);
    cr_expect_eq(c.num_hidden_layers, L);
    cr_expect_eq(c.num_attention_heads, NQ);
    cr_expect_eq(c.num_key_value_heads, NKV);
    cr_expect_eq(c.head_dim, HD);
    cr_expect_eq(c.rms_norm_eps, 1e-6);
    cr_expect_eq(c.rope_theta, 1e6);
    cr_expect_eq(c.rope_scaling.kind, QWEN3_ROPE_NONE);
    cr_expect_eq(c.max_position_embeddings, 64);
    cr_expect_eq(c.tie_word_embeddings, 0);
    cr_expect_eq(c.attention_bias, 0);
    cr_expect_str_eq(c.dtype, "bfloat16");
    // No generation_config.json: ids from config.json, vLLM's sampling defaults.
    cr_expect_eq(c.n_eos, 1);
    cr_expect_eq(c.eos_token_ids[0], 2);
    cr_expect_eq(c.bos_token_id, 1);
    cr_expect_eq(c.temperature, 1.0f);
    cr_expect_eq(c.top_k, 0);
    cr_expect_eq(c.top_p, 1.0f);
}

Test(config, head_dim_defaults_to_hidden_over_heads) {
    write_config("head_dim", NULL);
    qwen3_config_t c;
    cr_assert_eq(qwen3_config_load(tmp_dir, &c), 0, "%s", mv_last_error());
    cr_expect_eq(c.head_dim, H / NQ);
}

Test(config, generation_config_eos_list_and_single_int) {
    write_config(NULL, NULL);
    qwen3_config_t c;
    write_text("generation_config.json",
               "{\"bos_token_id\": 3, \"eos_token_id\": [5, 2, 7], \"temperature\": 0.6, \"top_k\": 20, \"top_p\": 0.95}");
    cr_assert_eq(qwen3_config_load(tmp_dir, &c), 0, "%s", mv_last_error());
    cr_expect_eq(c.n_eos, 3);
    cr_expect(c.eos_token_ids[0] == 5 && c.eos_token_ids[1] == 2 && c.eos_token_ids[2] == 7);
    cr_expect_eq(c.bos_token_id, 3);
    cr_expect_float_eq(c.temperature, 0.6f, 1e-7);
    cr_expect_eq(c.top_k, 20);
    cr_expect_float_eq(c.top_p, 0.95f, 1e-7);

    write_text("generation_config.json", "{\"eos_token_id\": 9, \"top_k\": -1}");
    cr_assert_eq(qwen3_config_load(tmp_dir, &c), 0, "%s", mv_last_error());
    cr_expect_eq(c.n_eos, 1);
    cr_expect_eq(c.eos_token_ids[0], 9);
    cr_expect_eq(c.bos_token_id, 1, "bos from config.json when generation_config.json has none");
    cr_expect_eq(c.top_k, 0, "-1 means off");
    cr_expect_eq(c.temperature, 1.0f);

    static const struct { const char *json, *key; } bad[] = {
        {"{\"eos_token_id\": [1, 2, 3, 4, 5, 6, 7, 8, 9]}", "eos_token_id"},
        {"{\"eos_token_id\": [1, 16]}", "eos_token_id"},
        {"{\"eos_token_id\": \"2\"}", "eos_token_id"},
        {"{\"top_p\": 1.5}", "top_p"},
        {"{\"top_p\": 0}", "top_p"},
        {"{\"temperature\": -1}", "temperature"},
        {"{\"top_k\": 2.5}", "top_k"},
        {"{\"eos_token_id\": 2,}", "not valid JSON"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        write_text("generation_config.json", bad[i].json);
        cr_expect_eq(qwen3_config_load(tmp_dir, &c), -1, "%s accepted", bad[i].json);
        EXPECT_ERROR(bad[i].json, "generation_config.json", bad[i].key);
    }
}

Test(config, bad_values_name_file_and_key) {
    static const struct { const char *key, *value, *expect; } bad[] = {
        {"hidden_size", NULL, "hidden_size is missing"},
        {"num_key_value_heads", NULL, "num_key_value_heads is missing"},
        {"num_key_value_heads", "3", "num_key_value_heads 3 does not divide num_attention_heads 2"},
        {"intermediate_size", "-12", "intermediate_size is -12"},
        {"vocab_size", "0", "vocab_size is 0"},
        {"num_hidden_layers", "-1", "num_hidden_layers"},
        {"hidden_size", "\"8\"", "hidden_size must be an integer"},
        {"hidden_size", "8.5", "hidden_size must be an integer"},
        {"head_dim", "3", "head_dim 3 must be even"},
        {"rms_norm_eps", "0", "rms_norm_eps is 0"},
        {"rope_theta", NULL, "rope_theta is missing"},
        {"rope_theta", "-5", "rope_theta is -5"},
        {"tie_word_embeddings", "1", "tie_word_embeddings must be true or false"},
        {"torch_dtype", "\"int8\"", "torch_dtype \"int8\""},
        {"architectures", "[\"LlamaForCausalLM\"]", "LlamaForCausalLM"},
        {"architectures", NULL, "architectures is missing"},
        {"model_type", "\"llama\"", "model_type"},
        {"eos_token_id", "99", "eos_token_id"},
        {"rope_scaling", "{\"rope_type\": \"yarn\", \"factor\": 4.0}", "rope_scaling.rope_type \"yarn\""},
        {"rope_scaling", "{\"type\": \"dynamic\", \"factor\": 2.0}", "rope_scaling.rope_type \"dynamic\""},
        {"rope_scaling", "{\"factor\": 2.0}", "rope_scaling.rope_type (or rope_scaling.type) is missing"},
        {"rope_scaling", "\"llama3\"", "rope_scaling must be an object"},
        {"rope_scaling",
         "{\"rope_type\": \"llama3\", \"low_freq_factor\": 1, \"high_freq_factor\": 4, "
         "\"original_max_position_embeddings\": 32}",
         "rope_scaling.factor is missing"},
        {"rope_scaling",
         "{\"rope_type\": \"llama3\", \"factor\": 8, \"low_freq_factor\": 4, \"high_freq_factor\": 1, "
         "\"original_max_position_embeddings\": 32}",
         "rope_scaling.high_freq_factor"},
        {"rope_scaling",
         "{\"rope_type\": \"llama3\", \"factor\": 8, \"low_freq_factor\": 1, \"high_freq_factor\": 4, "
         "\"original_max_position_embeddings\": 128}",
         "original_max_position_embeddings 128 exceeds"},
        {"rope_parameters", "{\"rope_type\": \"default\", \"rope_theta\": 10000}", "rope_theta 1e+06 and rope_parameters.rope_theta 10000 disagree"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        write_config(bad[i].key, bad[i].value);
        qwen3_config_t c;
        cr_expect_eq(qwen3_config_load(tmp_dir, &c), -1, "%s = %s accepted", bad[i].key, bad[i].value);
        EXPECT_ERROR(bad[i].key, "config.json", bad[i].key, bad[i].expect);
    }
    write_text("config.json", "{\"hidden_size\": 8,");
    qwen3_config_t c;
    cr_expect_eq(qwen3_config_load(tmp_dir, &c), -1);
    EXPECT_ERROR("truncated JSON", "config.json", "not valid JSON");
    cr_expect_eq(qwen3_config_load("/nonexistent-dir", &c), -1);
    EXPECT_ERROR("no directory", "/nonexistent-dir/config.json");
}

Test(config, rope_layouts_of_both_transformers_versions) {
    qwen3_config_t c;
    // transformers 5.x: rope_theta only inside rope_parameters.
    cJSON *cfg = cJSON_Parse(TINY_CONFIG);
    cJSON_DeleteItemFromObject(cfg, "rope_theta");
    cJSON_AddItemToObject(cfg, "rope_parameters", cJSON_Parse("{\"rope_type\": \"default\", \"rope_theta\": 500000}"));
    char *s = cJSON_Print(cfg);
    write_text("config.json", s);
    free(s);
    cr_assert_eq(qwen3_config_load(tmp_dir, &c), 0, "%s", mv_last_error());
    cr_expect_eq(c.rope_theta, 5e5);
    cr_expect_eq(c.rope_scaling.kind, QWEN3_ROPE_NONE);

    // llama3 scaling inside rope_parameters.
    cJSON_ReplaceItemInObject(cfg, "rope_parameters",
                              cJSON_Parse("{\"rope_type\": \"llama3\", \"rope_theta\": 500000, \"factor\": 8.0, "
                                          "\"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0, "
                                          "\"original_max_position_embeddings\": 32}"));
    s = cJSON_Print(cfg);
    write_text("config.json", s);
    free(s);
    cJSON_Delete(cfg);
    cr_assert_eq(qwen3_config_load(tmp_dir, &c), 0, "%s", mv_last_error());
    cr_expect_eq(c.rope_scaling.kind, QWEN3_ROPE_LLAMA3);
    cr_expect_eq(c.rope_scaling.factor, 8.0);

    // transformers 4.x: rope_scaling with the older "type" key.
    write_config("rope_scaling", "{\"type\": \"llama3\", \"factor\": 8.0, \"low_freq_factor\": 1.0, "
                                 "\"high_freq_factor\": 4.0, \"original_max_position_embeddings\": 32}");
    cr_assert_eq(qwen3_config_load(tmp_dir, &c), 0, "%s", mv_last_error());
    cr_expect_eq(c.rope_theta, 1e6);
    cr_expect_eq(c.rope_scaling.kind, QWEN3_ROPE_LLAMA3);
    cr_expect_eq(c.rope_scaling.low_freq_factor, 1.0);
    cr_expect_eq(c.rope_scaling.high_freq_factor, 4.0);
    cr_expect_eq(c.rope_scaling.original_max_position_embeddings, 32);
    write_config("rope_scaling", "{\"rope_type\": \"default\"}");
    cr_assert_eq(qwen3_config_load(tmp_dir, &c), 0, "%s", mv_last_error());
    cr_expect_eq(c.rope_scaling.kind, QWEN3_ROPE_NONE);
}

// ---- the real Qwen3-0.6B config --------------------------------------------------------------

Test(qwen3, real_config) {
    const char *d = qwen3_dir_or_skip("the real Qwen3-0.6B config test is");
    qwen3_config_t c;
    cr_assert_eq(qwen3_config_load(d, &c), 0, "%s", mv_last_error());
    cr_expect_eq(c.hidden_size, 1024);
    cr_expect_eq(c.num_hidden_layers, 28);
    cr_expect_eq(c.num_attention_heads, 16);
    cr_expect_eq(c.num_key_value_heads, 8);
    cr_expect_eq(c.head_dim, 128, "Qwen3 sets head_dim; it is not 1024 / 16");
    cr_expect_eq(c.intermediate_size, 3072);
    cr_expect_eq(c.vocab_size, 151936);
    cr_expect_eq(c.rope_theta, 1e6);
    cr_expect_eq(c.rope_scaling.kind, QWEN3_ROPE_NONE);
    cr_expect_eq(c.rms_norm_eps, 1e-6);
    cr_expect_eq(c.tie_word_embeddings, 1);
    cr_expect_eq(c.n_eos, 2);
    cr_expect(c.eos_token_ids[0] == 151645 && c.eos_token_ids[1] == 151643);
    cr_expect_eq(c.bos_token_id, 151643);
    cr_expect_float_eq(c.temperature, 0.6f, 1e-7);
    cr_expect_eq(c.top_k, 20);
    cr_expect_float_eq(c.top_p, 0.95f, 1e-7);
    // 596M parameters (the model card says 0.6B; 0.44B without the embedding).
    cr_expect_eq(qwen3_config_n_params(&c), 596049920);
}

// ---- valid weights ----------------------------------------------------------------------------

TestSuite(weights, .init = make_tmp, .fini = remove_tmp);

// Every bound tensor holds the pattern of its position in `ts`.
static void expect_tensor_pattern(const st_tensor_t *t, const tensors_t *ts) {
    int idx = -1;
    for (int i = 0; i < ts->n; i++)
        if (strcmp(ts->e[i].name, t->name) == 0) idx = i;
    cr_assert(idx >= 0, "%s not written", t->name);
    bf16_t got[V * H];
    cr_assert(st_numel(t) <= V * H);
    st_to_bf16(t, got);
    for (int64_t k = 0; k < st_numel(t); k++)
        cr_expect_eq(got[k], float_to_bf16(pattern(idx, k)), "%s[%lld]", t->name, (long long)k);
}

static void expect_tiny_bound(const qwen3_weights_t *w, const tensors_t *ts) {
    cr_expect_eq(w->n_layers, L);
    cr_expect_eq(w->embed_tokens->shape[0], V);
    cr_expect_eq(w->layers[1].k_proj->shape[0], NKV * HD);
    cr_expect_eq(w->layers[1].o_proj->shape[1], NQ * HD);
    cr_expect_eq(w->layers[0].down_proj->shape[1], I);
    cr_expect_str_eq(w->layers[1].q_norm->name, "model.layers.1.self_attn.q_norm.weight");
    cr_expect_null(w->layers[0].q_bias);
    expect_tensor_pattern(w->embed_tokens, ts);
    expect_tensor_pattern(w->layers[1].up_proj, ts);
    expect_tensor_pattern(w->norm, ts);
    expect_tensor_pattern(w->lm_head, ts);
}

Test(weights, single_file) {
    tensors_t ts;
    tiny_tensors(&ts, "BF16", 0);
    write_tiny_model();
    qwen3_config_t c;
    st_model_t *m;
    qwen3_weights_t w;
    cr_assert_eq(load_all(&c, &m, &w), 0, "%s", mv_last_error());
    cr_expect_eq(m->n_tensors, N_TINY);
    cr_expect_eq(m->n_files, 1);
    cr_expect_null(st_find(m, "model.layers.2.input_layernorm.weight"));
    expect_tiny_bound(&w, &ts);
    cr_expect_neq(w.lm_head, w.embed_tokens);
    cr_expect_eq(w.n_params, qwen3_config_n_params(&c));
    cr_expect_eq(w.n_bytes, 2 * (size_t)w.n_params);
    cr_expect(strstr(w.norm->file, "model.safetensors"));
    qwen3_weights_free(&w);
    st_close(m);
}

Test(weights, sharded_with_index) {
    tensors_t ts;
    tiny_tensors(&ts, "BF16", 0);
    write_config(NULL, NULL);
    write_shards(&ts, 10);
    write_index(&ts, 10, SHARD1, SHARD2);
    qwen3_config_t c;
    st_model_t *m;
    qwen3_weights_t w;
    cr_assert_eq(load_all(&c, &m, &w), 0, "%s", mv_last_error());
    cr_expect_eq(m->n_files, 2);
    cr_expect_eq(m->n_tensors, N_TINY);
    cr_expect(strstr(m->source, "model.safetensors.index.json"));
    cr_expect(strstr(w.embed_tokens->file, SHARD1), "%s", w.embed_tokens->file);
    cr_expect(strstr(w.lm_head->file, SHARD2), "%s", w.lm_head->file);
    // The pattern follows the position inside each shard's own tensor list.
    tensors_t b = {.n = 0};
    for (int i = 10; i < ts.n; i++) b.e[b.n++] = ts.e[i];
    expect_tensor_pattern(w.lm_head, &b);
    qwen3_weights_free(&w);
    st_close(m);
}

Test(weights, tied_embeddings) {
    write_config("tie_word_embeddings", "true");
    tensors_t ts;
    tiny_tensors(&ts, "BF16", 1);
    write_st("model.safetensors", &ts, NULL);
    qwen3_config_t c;
    st_model_t *m;
    qwen3_weights_t w;
    cr_assert_eq(load_all(&c, &m, &w), 0, "%s", mv_last_error());
    cr_expect_eq(w.lm_head, w.embed_tokens, "tied: lm_head is embed_tokens");
    cr_expect_eq(w.n_params, qwen3_config_n_params(&c));
    qwen3_weights_free(&w);
    st_close(m);

    // A stored lm_head.weight of the right shape is accepted and ignored.
    add(&ts, "lm_head.weight", "BF16", V, H);
    write_st("model.safetensors", &ts, NULL);
    cr_assert_eq(load_all(&c, &m, &w), 0, "%s", mv_last_error());
    cr_expect_eq(w.lm_head, w.embed_tokens);
    cr_expect_eq(w.n_params, qwen3_config_n_params(&c), "the ignored lm_head is not counted");
    qwen3_weights_free(&w);
    st_close(m);

    // ... but of the wrong shape it is an error.
    find(&ts, "lm_head.weight")->shape[0] = V + 1;
    write_st("model.safetensors", &ts, NULL);
    cr_expect_eq(load_all(&c, &m, &w), -1);
    EXPECT_ERROR("tied lm_head of the wrong shape", "model.safetensors", "lm_head.weight", "[17, 8]");
}

Test(weights, attention_bias) {
    write_config("attention_bias", "true");
    tensors_t ts;
    tiny_tensors(&ts, "BF16", 0);
    write_st("model.safetensors", &ts, NULL);
    qwen3_config_t c;
    st_model_t *m;
    qwen3_weights_t w;
    cr_expect_eq(load_all(&c, &m, &w), -1, "biases asked for but absent");
    EXPECT_ERROR("no biases", "model.safetensors", "model.layers.0.self_attn.q_proj.bias");
    for (int i = 0; i < L; i++) {
        char name[96];
        layer_name(name, sizeof name, i, "self_attn.q_proj.bias");
        add(&ts, name, "BF16", NQ * HD, -1);
        layer_name(name, sizeof name, i, "self_attn.k_proj.bias");
        add(&ts, name, "BF16", NKV * HD, -1);
        layer_name(name, sizeof name, i, "self_attn.v_proj.bias");
        add(&ts, name, "BF16", NKV * HD, -1);
        layer_name(name, sizeof name, i, "self_attn.o_proj.bias");
        add(&ts, name, "BF16", H, -1);
    }
    write_st("model.safetensors", &ts, NULL);
    cr_assert_eq(load_all(&c, &m, &w), 0, "%s", mv_last_error());
    cr_expect_eq(w.layers[1].v_bias->shape[0], NKV * HD);
    cr_expect_eq(w.n_params, qwen3_config_n_params(&c));
    qwen3_weights_free(&w);
    st_close(m);

    // The same file with attention_bias false: the biases are unexpected.
    write_config(NULL, NULL);
    cr_expect_eq(load_all(&c, &m, &w), -1);
    EXPECT_ERROR("biases not asked for", "model.safetensors", "unexpected tensor model.layers.0.self_attn.k_proj.bias",
                 "attention_bias false");
}

// ---- f16 and f32 -> bf16 -------------------------------------------------------------------------

Test(weights, f16_and_f32_converted_to_bf16_round_to_nearest_even) {
    static const uint32_t f32_in[] = {
        0x3f800000u,  // 1.0
        0x3f808000u,  // 1 + 2^-8: a tie, kept bit even -> down
        0x3f818000u,  // 1 + 3 * 2^-8: a tie, kept bit odd -> up
        0x3f80c000u,  // above the half -> up
        0xbf7fffffu,  // -0.99999994 -> -1.0 (the carry reaches the exponent)
        0x7f7fffffu,  // FLT_MAX rounds to +Inf, as in PyTorch
        0x80000000u,  // -0
        0x7f800000u,  // +Inf
        0x7fc00001u,  // NaN stays NaN
        0x00000001u,  // the smallest subnormal rounds to 0
    };
    static const bf16_t f32_want[] = {0x3f80, 0x3f80, 0x3f82, 0x3f81, 0xbf80, 0x7f80, 0x8000, 0x7f80, 0x7fc0, 0x0000};
    static const uint16_t f16_in[] = {
        0x3c00,  // 1.0
        0xc000,  // -2.0
        0x3c04,  // 1 + 2^-8: a tie -> even (down)
        0x3c0c,  // 1 + 3 * 2^-8: a tie -> even (up)
        0x3c06,  // 1 + 6 * 2^-10: above the half -> up
        0x0001,  // smallest subnormal 2^-24
        0x8001,  // -2^-24
        0x03ff,  // largest subnormal 1023 * 2^-24 -> rounds up to 2^-14
        0x0400,  // smallest normal 2^-14
        0x7bff,  // 65504, the largest half
        0xfc00,  // -Inf
        0x7e00,  // NaN
        0x8000,  // -0
    };
    static const bf16_t f16_want[] = {0x3f80, 0xc000, 0x3f80, 0x3f82, 0x3f81, 0x3380, 0xb380,
                                      0x3880, 0x3880, 0x4780, 0xff80, 0x7fc0, 0x8000};
    enum { NF32 = sizeof f32_in / sizeof f32_in[0], NF16 = sizeof f16_in / sizeof f16_in[0] };
    static const bf16_t bf16_in[] = {0x1234, 0xabcd, 0x7fc0};
    tensors_t ts = {.n = 0};
    add(&ts, "a.f32", "F32", NF32, -1)->data = f32_in;
    add(&ts, "b.f16", "F16", NF16, -1)->data = f16_in;
    add(&ts, "c.bf16", "BF16", 3, -1)->data = bf16_in;
    write_st("weights.safetensors", &ts, NULL);
    char path[256];
    path_of(path, sizeof path, "weights.safetensors");
    st_model_t *m;
    cr_assert_eq(st_open_file(path, &m), 0, "%s", mv_last_error());
    bf16_t out[16];
    const st_tensor_t *t = st_find(m, "a.f32");
    cr_assert(t);
    cr_expect_eq(t->dtype, ST_F32);
    st_to_bf16(t, out);
    for (int i = 0; i < NF32; i++)
        cr_expect_eq(out[i], f32_want[i], "f32 0x%08x -> 0x%04x, expected 0x%04x", f32_in[i], out[i], f32_want[i]);
    st_to_bf16(t = st_find(m, "b.f16"), out);
    cr_expect_eq(t->dtype, ST_F16);
    for (int i = 0; i < NF16; i++)
        cr_expect_eq(out[i], f16_want[i], "f16 0x%04x -> 0x%04x, expected 0x%04x", f16_in[i], out[i], f16_want[i]);
    st_to_bf16(st_find(m, "c.bf16"), out);
    cr_expect(out[0] == 0x1234 && out[1] == 0xabcd && out[2] == 0x7fc0, "bf16 is copied bit for bit");
    st_close(m);
}

// Every one of the 65536 halves, against the definition
// (-1)^s * 2^(e-15) * (1 + m/1024), or 2^-14 * m/1024 for e = 0.
Test(weights, f16_to_float_exhaustive) {
    for (uint32_t h = 0; h < 65536; h++) {
        int s = (int)(h >> 15), e = (int)((h >> 10) & 31), mant = (int)(h & 1023);
        float got = f16_to_float((uint16_t)h);
        double want = e == 31 ? (mant ? NAN : INFINITY) : e ? ldexp(1.0 + mant / 1024.0, e - 15) : ldexp(mant / 1024.0, -14);
        if (s) want = -want;
        if (isnan(want)) cr_assert(isnan(got), "0x%04x", h);
        else cr_assert(got == (float)want && !signbit(got) == !s, "0x%04x -> %g, expected %g", h, got, want);
    }
}

// ---- broken weights: every error names the file and the tensor ----------------------------------

#define K_PROJ "model.layers.1.self_attn.k_proj.weight"
#define UP_PROJ "model.layers.1.mlp.up_proj.weight"

Test(weights, missing_tensor) {
    tensors_t ts;
    tiny_tensors(&ts, "BF16", 0);
    drop(&ts, UP_PROJ);
    expect_bad_weights("missing", &ts, NULL, UP_PROJ, "is missing");
}

Test(weights, extra_tensor) {
    tensors_t ts;
    tiny_tensors(&ts, "BF16", 0);
    add(&ts, "model.layers.2.input_layernorm.weight", "BF16", H, -1);
    expect_bad_weights("a third layer", &ts, NULL, "model.layers.2.input_layernorm.weight", "unexpected tensor");
    tiny_tensors(&ts, "BF16", 0);
    add(&ts, "model.layers.0.self_attn.rotary_emb.inv_freq", "F32", HD / 2, -1);
    expect_bad_weights("inv_freq", &ts, NULL, "rotary_emb.inv_freq", "unexpected tensor");
}

Test(weights, wrong_shape) {
    tensors_t ts;
    tiny_tensors(&ts, "BF16", 0);
    find(&ts, K_PROJ)->shape[0] = H;
    expect_bad_weights("k_proj [8, 8]", &ts, NULL, K_PROJ, "has shape [8, 8]; config.json implies [4, 8]");
    tiny_tensors(&ts, "BF16", 0);
    entry_t *e = find(&ts, "model.norm.weight");
    e->ndim = 2, e->shape[1] = 1;
    expect_bad_weights("norm [8, 1]", &ts, NULL, "model.norm.weight", "[8, 1]");
}

Test(weights, wrong_dtype) {
    tensors_t ts;
    tiny_tensors(&ts, "BF16", 0);
    strcpy(find(&ts, K_PROJ)->dtype, "I64");
    expect_bad_weights("I64", &ts, NULL, K_PROJ, "dtype I64 is not supported");
}

Test(weights, f16_and_f32_checkpoints_load) {
    static const char *dtypes[] = {"F16", "F32"};
    for (int d = 0; d < 2; d++) {
        tensors_t ts;
        tiny_tensors(&ts, dtypes[d], 0);
        write_config(NULL, NULL);
        write_st("model.safetensors", &ts, NULL);
        qwen3_config_t c;
        st_model_t *m;
        qwen3_weights_t w;
        cr_assert_eq(load_all(&c, &m, &w), 0, "%s: %s", dtypes[d], mv_last_error());
        cr_expect_eq(w.norm->dtype, d ? ST_F32 : ST_F16);
        cr_expect_eq(w.n_bytes, (d ? 4 : 2) * (size_t)w.n_params);
        qwen3_weights_free(&w);
        st_close(m);
    }
}

Test(weights, truncated_file) {
    tensors_t ts;
    tiny_tensors(&ts, "BF16", 0);
    expect_bad_weights("10 bytes short", &ts, &(lies_t){.truncate = 10}, "lm_head.weight", "truncated");
    // Cut inside the header: the header length now runs past the end.
    write_st("model.safetensors", &ts, NULL);
    char path[256];
    path_of(path, sizeof path, "model.safetensors");
    cr_assert_eq(truncate(path, 100), 0);
    st_model_t *m;
    cr_expect_eq(st_open(tmp_dir, &m), -1);
    EXPECT_ERROR("cut in the header", "model.safetensors", "header length");
    cr_assert_eq(truncate(path, 5), 0);
    cr_expect_eq(st_open(tmp_dir, &m), -1);
    EXPECT_ERROR("5 bytes", "model.safetensors", "too short");
    cr_expect_null(m);
}

Test(weights, header_length_larger_than_file) {
    tensors_t ts;
    tiny_tensors(&ts, "BF16", 0);
    write_config(NULL, NULL);
    write_st("model.safetensors", &ts, &(lies_t){.header_len_extra = 1u << 20});
    st_model_t *m;
    cr_expect_eq(st_open(tmp_dir, &m), -1);
    EXPECT_ERROR("header length", "model.safetensors", "is larger than the rest of the file");
    // A header length that lands inside the data: the JSON is not one object.
    write_st("model.safetensors", &ts, &(lies_t){.header_len_extra = 16});
    cr_expect_eq(st_open(tmp_dir, &m), -1);
    EXPECT_ERROR("header length +16", "model.safetensors", "header is not one JSON object");
}

Test(weights, offsets_out_of_range) {
    tensors_t ts;
    tiny_tensors(&ts, "BF16", 0);
    entry_t *e = find(&ts, "model.norm.weight");
    int64_t total = 0;
    for (int i = 0; i < ts.n; i++) total += numel(&ts.e[i]) * 2;
    e->fixed_off = 1, e->off[0] = total, e->off[1] = total + 2 * H;
    expect_bad_weights("past the end", &ts, NULL, "model.norm.weight", "run past the data section");
    e->off[0] = 40, e->off[1] = 8;
    expect_bad_weights("end before begin", &ts, NULL, "model.norm.weight", "end before they begin");
}

Test(weights, overlapping_offsets) {
    tensors_t ts;
    tiny_tensors(&ts, "BF16", 0);
    // model.norm.weight's 16 bytes claimed at the start, inside embed_tokens.
    entry_t *e = find(&ts, "model.norm.weight");
    e->fixed_off = 1, e->off[0] = 0, e->off[1] = 2 * H;
    expect_bad_weights("overlap", &ts, NULL, "model.embed_tokens.weight", "overlap tensor model.norm.weight");
}

Test(weights, gap_between_tensors) {
    tensors_t ts;
    tiny_tensors(&ts, "BF16", 0);
    // 16 unused bytes after the last tensor.
    expect_bad_weights("trailing bytes", &ts, &(lies_t){.extra_data = 16}, "model.safetensors",
                       "16 bytes after the last tensor's data belong to no tensor");
    // lm_head (the last tensor) moved 16 bytes later: a hole before it.
    entry_t *e = find(&ts, "lm_head.weight");
    int64_t begin = 0;
    for (entry_t *p = ts.e; p != e; p++) begin += numel(p) * 2;
    e->fixed_off = 1, e->off[0] = begin + 16, e->off[1] = begin + 16 + 2 * V * H;
    expect_bad_weights("hole", &ts, &(lies_t){.extra_data = 16}, "lm_head.weight", "unused (the format allows no gaps)");
}

Test(weights, numel_times_size_mismatch) {
    tensors_t ts;
    tiny_tensors(&ts, "BF16", 0);
    entry_t *e = find(&ts, UP_PROJ);
    e->shape[0] = I - 1;  // the header says [11, 8] = 176 bytes over a 192-byte span
    e->fixed_off = 1;
    int64_t begin = 0;
    for (entry_t *p = ts.e; p != e; p++) begin += numel(p) * 2;
    e->off[0] = begin, e->off[1] = begin + 2 * I * H;
    expect_bad_weights("numel", &ts, NULL, UP_PROJ, "span 192 bytes, but BF16 with 88 elements needs 176");
}

Test(weights, bad_headers) {
    static const struct { const char *json, *expect; } bad[] = {
        {"[1, 2]", "not one JSON object"},
        {"{\"x\": {\"dtype\": \"BF16\"}", "not one JSON object"},
        {"{\"x\": {\"dtype\": \"BF16\", \"shape\": [2], \"data_offsets\": [0]}}", "x: data_offsets"},
        {"{\"x\": {\"dtype\": \"BF16\", \"shape\": [-2], \"data_offsets\": [0, 4]}}", "x: shape[0]"},
        {"{\"x\": {\"shape\": [2], \"data_offsets\": [0, 4]}}", "x: no \"dtype\""},
        {"{\"x\": {\"dtype\": \"BF16\", \"shape\": [1,1,1,1,1,1,1,1,1], \"data_offsets\": [0, 2]}}", "x: 9 dims"},
        {"{\"__metadata__\": 3, \"x\": {\"dtype\": \"BF16\", \"shape\": [2], \"data_offsets\": [0, 4]}}",
         "__metadata__"},
        {"{\"x\": {\"dtype\": \"BF16\", \"shape\": [1], \"data_offsets\": [0, 2]}}", "2 bytes after the last tensor"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char path[256];
        path_of(path, sizeof path, "h.safetensors");
        FILE *f = fopen(path, "wb");
        uint64_t n = strlen(bad[i].json);
        fwrite(&n, 8, 1, f);
        fputs(bad[i].json, f);
        fwrite("\0\0\0\0", 1, 4, f);  // 4 bytes of data
        fclose(f);
        st_model_t *m;
        cr_expect_eq(st_open_file(path, &m), -1, "%s accepted", bad[i].json);
        EXPECT_ERROR(bad[i].json, "h.safetensors", bad[i].expect);
    }
}

Test(weights, no_weights_in_directory) {
    write_config(NULL, NULL);
    st_model_t *m;
    cr_expect_eq(st_open(tmp_dir, &m), -1);
    EXPECT_ERROR("empty directory", tmp_dir, "no model.safetensors");
}

// ---- broken shards -------------------------------------------------------------------------------

static void expect_bad_index(const char *what, const char *file, const char *tensor, const char *detail) {
    qwen3_config_t c;
    st_model_t *m;
    qwen3_weights_t w;
    cr_expect_eq(load_all(&c, &m, &w), -1, "%s: loaded", what);
    EXPECT_ERROR(what, file, tensor, detail);
}

Test(weights, index_names_a_missing_file) {
    tensors_t ts;
    tiny_tensors(&ts, "BF16", 0);
    write_config(NULL, NULL);
    write_shards(&ts, 10);
    write_index(&ts, 10, SHARD1, "model-00003-of-00002.safetensors");
    expect_bad_index("missing shard", "model.safetensors.index.json", "model-00003-of-00002.safetensors",
                     "does not exist");
    write_index(&ts, 10, SHARD1, "../" SHARD2);
    expect_bad_index("path outside", "model.safetensors.index.json", ts.e[10].name, "file name in the model directory");
}

Test(weights, tensor_in_index_but_not_in_its_shard) {
    tensors_t ts;
    tiny_tensors(&ts, "BF16", 0);
    write_config(NULL, NULL);
    write_index(&ts, 10, SHARD1, SHARD2);
    tensors_t t2 = ts;
    drop(&t2, UP_PROJ);
    write_shards(&t2, 10);
    expect_bad_index("not in shard", "model.safetensors.index.json", UP_PROJ, "that file does not have it");
}

Test(weights, tensor_in_the_wrong_shard_or_unlisted_or_twice) {
    tensors_t ts;
    tiny_tensors(&ts, "BF16", 0);
    write_config(NULL, NULL);
    write_shards(&ts, 10);
    write_index(&ts, 11, SHARD1, SHARD2);  // tensor 10 listed in shard 1, stored in shard 2
    expect_bad_index("wrong shard", "model.safetensors.index.json", ts.e[10].name, SHARD2);

    // In shard 2 but not in the index.
    tensors_t listed = ts;
    drop(&listed, "model.norm.weight");
    write_index(&listed, 10, SHARD1, SHARD2);
    expect_bad_index("unlisted", SHARD2, "model.norm.weight", "not in the weight_map");

    // The same tensor in both shards.
    tensors_t again = ts;
    add(&again, ts.e[0].name, "BF16", V, H);  // embed_tokens at the end of shard 2 too
    write_shards(&again, 10);
    write_index(&ts, 10, SHARD1, SHARD2);
    expect_bad_index("twice", "model.safetensors.index.json", "model.embed_tokens.weight", "appears twice");

    // The index lists a tensor twice (JSON objects may repeat a key; cJSON keeps both).
    write_shards(&ts, 10);
    cJSON *root = cJSON_CreateObject(), *wm = cJSON_AddObjectToObject(root, "weight_map");
    for (int i = 0; i < ts.n; i++) cJSON_AddStringToObject(wm, ts.e[i].name, i < 10 ? SHARD1 : SHARD2);
    cJSON_AddStringToObject(wm, ts.e[3].name, SHARD1);
    char *s = cJSON_Print(root);
    write_text("model.safetensors.index.json", s);
    free(s);
    cJSON_Delete(root);
    expect_bad_index("listed twice", "model.safetensors.index.json", ts.e[3].name, "twice");
}

// ---- sanitizer findings and strict JSON ------------------------------------------------------------

// A header of no tensors, exactly "\x02\0\0\0\0\0\0\0{}": a legal empty
// file, which used to reach qsort(NULL, 0) and arithmetic on a NULL pointer
// (UBSan aborts on those in the SANITIZE=1 build). Now an empty model, and
// binding it names the first missing tensor.
Test(weights, zero_tensors_header) {
    char path[256];
    path_of(path, sizeof path, "model.safetensors");
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f);
    fwrite("\x02\0\0\0\0\0\0\0{}", 1, 10, f);
    fclose(f);
    st_model_t *m = NULL;
    cr_assert_eq(st_open_file(path, &m), 0, "%s", mv_last_error());
    cr_expect_eq(m->n_tensors, 0);
    cr_expect_null(st_find(m, "model.norm.weight"));
    st_close(m);
    write_config(NULL, NULL);
    qwen3_config_t c;
    qwen3_weights_t w;
    cr_expect_eq(load_all(&c, &m, &w), -1);
    EXPECT_ERROR("no tensors", "model.embed_tokens.weight", "missing");
    // And with bytes after "{}" that belong to no tensor.
    f = fopen(path, "ab");
    fputc(0, f);
    fclose(f);
    cr_expect_eq(st_open_file(path, &m), -1);
    EXPECT_ERROR("no tensors, one byte", "1 bytes after the last tensor");
}

// A key twice: Python, vLLM and Hugging Face take the last, cJSON the
// first. Either guess can bind the wrong value, so it is refused, naming
// the key; so is a NUL inside a string (cJSON would cut it there).
Test(config, duplicate_keys_and_nul_refused) {
    write_tiny_model();
    char path[256];
    path_of(path, sizeof path, "config.json");
    char *cfg = NULL;
    {
        cJSON *c = cJSON_Parse(TINY_CONFIG);
        cfg = cJSON_PrintUnformatted(c);
        cJSON_Delete(c);
    }
    char text[2048];
    // The tail "}" replaced by a second vocab_size.
    snprintf(text, sizeof text, "%.*s,\"vocab_size\":32}", (int)strlen(cfg) - 1, cfg);
    write_text("config.json", text);
    qwen3_config_t c;
    cr_expect_eq(qwen3_config_load(tmp_dir, &c), -1);
    EXPECT_ERROR("vocab_size twice", "config.json", "key \"vocab_size\" appears twice (in the top-level object)");
    snprintf(text, sizeof text, "%.*s,\"rope_parameters\":{\"rope_theta\":1,\"rope_theta\":2}}",
             (int)strlen(cfg) - 1, cfg);
    write_text("config.json", text);
    cr_expect_eq(qwen3_config_load(tmp_dir, &c), -1);
    EXPECT_ERROR("a nested key twice", "key \"rope_theta\" appears twice (in rope_parameters)");
    char *at = strstr(cfg, "\"Qwen3ForCausalLM\"");
    cr_assert_not_null(at);
    snprintf(text, sizeof text, "%.*s\"Qwen3ForCausalLM\\u0000x\"%s", (int)(at - cfg), cfg, at + 18);
    write_text("config.json", text);
    cr_expect_eq(qwen3_config_load(tmp_dir, &c), -1);
    EXPECT_ERROR("a NUL", "config.json", "architectures[0] holds a NUL character");
    free(cfg);
    // In a safetensors header: a tensor listed twice.
    write_config(NULL, NULL);
    tensors_t ts;
    tiny_tensors(&ts, "BF16", 0);
    write_st("model.safetensors", &ts, NULL);
    st_model_t *m;
    cr_assert_eq(st_open(tmp_dir, &m), 0, "%s", mv_last_error());
    st_close(m);
    path_of(path, sizeof path, "model.safetensors");
    FILE *f = fopen(path, "r+b");
    cr_assert_not_null(f);
    uint64_t hlen;
    cr_assert_eq(fread(&hlen, 8, 1, f), 1u);
    char *h = calloc(1, hlen + 1);
    cr_assert_eq(fread(h, 1, hlen, f), hlen);
    // Rename the second tensor to the first's name: the name written over
    // the longer one, the rest spaces (JSON allows them before the colon).
    char *first = strstr(h, "\"model.embed_tokens.weight\"");
    char *second = strstr(h, "\"model.layers.0.input_layernorm.weight\"");
    cr_assert(first && second);
    const char *dup = "\"model.embed_tokens.weight\"";
    memcpy(second, dup, strlen(dup));
    memset(second + strlen(dup), ' ', strlen("\"model.layers.0.input_layernorm.weight\"") - strlen(dup));
    cr_assert_eq(fseek(f, 8, SEEK_SET), 0);
    fwrite(h, 1, hlen, f);
    fclose(f);
    free(h);
    cr_expect_eq(st_open(tmp_dir, &m), -1);
    EXPECT_ERROR("tensor twice", "model.safetensors: header", "key \"model.embed_tokens.weight\" appears twice");
}

// ---- minivllm inspect ------------------------------------------------------------------------------

// Run build/minivllm with the arguments; its exit status, stdout and stderr in out.
static int run_minivllm(const char *args, char *out, size_t cap) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s/minivllm %s 2>&1", MV_BUILD_DIR, args);
    return run_command(cmd, out, cap);
}

TestSuite(inspect, .init = make_tmp, .fini = remove_tmp);

Test(inspect, tiny_model_and_broken_one) {
    write_tiny_model();
    char args[512], out[8192];
    snprintf(args, sizeof args, "inspect --model '%s'", tmp_dir);
    cr_expect_eq(run_minivllm(args, out, sizeof out), 0, "%s", out);
    cr_expect(strstr(out, "Qwen3ForCausalLM"), "%s", out);
    cr_expect(strstr(out, "25: 25 BF16, 0 F16, 0 F32"), "%s", out);
    cr_expect(strstr(out, "head_dim 4"), "%s", out);

    tensors_t ts;
    tiny_tensors(&ts, "BF16", 0);
    drop(&ts, UP_PROJ);
    write_st("model.safetensors", &ts, NULL);
    cr_expect_eq(run_minivllm(args, out, sizeof out), 1, "%s", out);
    cr_expect(strstr(out, UP_PROJ) && strstr(out, "model.safetensors"), "%s", out);

    write_config("num_key_value_heads", "3");
    cr_expect_eq(run_minivllm(args, out, sizeof out), 1, "%s", out);
    cr_expect(strstr(out, "config.json") && strstr(out, "num_key_value_heads"), "%s", out);
}

Test(inspect, command_line) {
    char out[8192];
    cr_expect_eq(run_minivllm("inspect --help", out, sizeof out), 0);
    cr_expect(strstr(out, "usage: minivllm inspect --model DIR"), "%s", out);
    cr_expect_eq(run_minivllm("inspect", out, sizeof out), 2);
    cr_expect(strstr(out, "--model"), "%s", out);
    cr_expect_eq(run_minivllm("inspect --model", out, sizeof out), 2);
    cr_expect_eq(run_minivllm("inspect --model x --bogus", out, sizeof out), 2);
    cr_expect(strstr(out, "--bogus"), "%s", out);
    cr_expect_eq(run_minivllm("inspect --model /nonexistent-dir", out, sizeof out), 1);
    cr_expect(strstr(out, "--model /nonexistent-dir: no such directory"), "%s", out);
    cr_expect_eq(run_minivllm("--help", out, sizeof out), 0);
    cr_expect(strstr(out, "inspect"), "%s", out);
}

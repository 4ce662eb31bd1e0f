/*
 * chapters/09-engine/model/qwen3_weights.c - bind a Qwen3ForCausalLM checkpoint's
 * tensors by name and check their shapes (see qwen3_weights.h for the list).
 *
 * Each expected tensor is looked up, its shape compared with the one the
 * config implies, and the tensor marked as used; whatever is left unmarked
 * at the end is a tensor the model does not have, and an error too (a
 * typo'd name, a layer too many, a bias the config does not ask for).
 */
#include "chapters/09-engine/model/qwen3_weights.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/check.h"
#include "common/rng.h"

typedef struct {
    const qwen3_config_t *c;
    const st_model_t *m;
    unsigned char *used;  // [m->n_tensors] 1 once bound
    qwen3_weights_t *w;
} binder_t;

static void shape_str(char *buf, size_t cap, int ndim, const int64_t *shape) {
    size_t n = (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < ndim && n < cap; i++)
        n += (size_t)snprintf(buf + n, cap - n, i ? ", %lld" : "%lld", (long long)shape[i]);
    if (n < cap) snprintf(buf + n, cap - n, "]");
}

// Bind tensor `name` of shape [d0] (d1 < 0) or [d0, d1] into *out.
static int bind(binder_t *b, const char *name, int64_t d0, int64_t d1, const st_tensor_t **out) {
    int64_t want[2] = {d0, d1};
    int ndim = d1 < 0 ? 1 : 2;
    char ws[64], got[128];
    shape_str(ws, sizeof ws, ndim, want);
    const st_tensor_t *t = st_find(b->m, name);
    if (!t) return mv_error("%s: tensor %s %s is missing", b->m->source, name, ws);
    if (t->ndim != ndim || t->shape[0] != d0 || (ndim == 2 && t->shape[1] != d1)) {
        shape_str(got, sizeof got, t->ndim, t->shape);
        return mv_error("%s: tensor %s has shape %s; config.json implies %s", t->file, name, got, ws);
    }
    b->used[t - b->m->tensors] = 1;
    b->w->n_params += st_numel(t);
    b->w->n_bytes += t->nbytes;
    *out = t;
    return 0;
}

// The tensors of layer i: name, shape ([d0] when d1 < 0) and the field of
// *l that holds it. One table for binding a checkpoint and for building
// random weights (qwen3_weights_random), so the two cannot disagree.
typedef struct {
    char name[128];
    int64_t d0, d1;
    const st_tensor_t **slot;
} tensor_want_t;

enum { LAYER_MAX_TENSORS = 15 };

static int layer_tensors(const qwen3_config_t *c, int i, qwen3_layer_weights_t *l, tensor_want_t *want) {
    int64_t H = c->hidden_size, I = c->intermediate_size, hd = c->head_dim;
    int64_t q = (int64_t)c->num_attention_heads * hd, kv = (int64_t)c->num_key_value_heads * hd;
    const struct {
        const char *suffix;
        int64_t d0, d1;
        const st_tensor_t **slot;
    } table[LAYER_MAX_TENSORS] = {
        {"input_layernorm.weight", H, -1, &l->input_layernorm},
        {"self_attn.q_proj.weight", q, H, &l->q_proj},
        {"self_attn.k_proj.weight", kv, H, &l->k_proj},
        {"self_attn.v_proj.weight", kv, H, &l->v_proj},
        {"self_attn.o_proj.weight", H, q, &l->o_proj},
        {"self_attn.q_norm.weight", hd, -1, &l->q_norm},
        {"self_attn.k_norm.weight", hd, -1, &l->k_norm},
        {"post_attention_layernorm.weight", H, -1, &l->post_attention_layernorm},
        {"mlp.gate_proj.weight", I, H, &l->gate_proj},
        {"mlp.up_proj.weight", I, H, &l->up_proj},
        {"mlp.down_proj.weight", H, I, &l->down_proj},
        // Only with attention_bias (n below stops before these otherwise).
        {"self_attn.q_proj.bias", q, -1, &l->q_bias},
        {"self_attn.k_proj.bias", kv, -1, &l->k_bias},
        {"self_attn.v_proj.bias", kv, -1, &l->v_bias},
        {"self_attn.o_proj.bias", H, -1, &l->o_bias},
    };
    int n = c->attention_bias ? 15 : 11;
    for (int k = 0; k < n; k++) {
        snprintf(want[k].name, sizeof want[k].name, "model.layers.%d.%s", i, table[k].suffix);
        want[k].d0 = table[k].d0;
        want[k].d1 = table[k].d1;
        want[k].slot = table[k].slot;
    }
    return n;
}

static int bind_layer(binder_t *b, int i, qwen3_layer_weights_t *l) {
    tensor_want_t want[LAYER_MAX_TENSORS];
    int n = layer_tensors(b->c, i, l, want);
    for (int k = 0; k < n; k++)
        if (bind(b, want[k].name, want[k].d0, want[k].d1, want[k].slot)) return -1;
    return 0;
}

// With tied embeddings lm_head is embed_tokens; a stored lm_head.weight is
// shape-checked, then ignored (vLLM skips it too).
static int bind_lm_head(binder_t *b) {
    const qwen3_config_t *c = b->c;
    qwen3_weights_t *w = b->w;
    if (!c->tie_word_embeddings) return bind(b, "lm_head.weight", c->vocab_size, c->hidden_size, &w->lm_head);
    const st_tensor_t *stored = NULL;
    if (st_find(b->m, "lm_head.weight")) {
        if (bind(b, "lm_head.weight", c->vocab_size, c->hidden_size, &stored)) return -1;
        w->n_params -= st_numel(stored);  // not counted: it is not used
        w->n_bytes -= stored->nbytes;
    }
    w->lm_head = w->embed_tokens;
    return 0;
}

// The first tensor nothing was bound to, as an error with a hint.
static int check_unused(const binder_t *b) {
    for (size_t i = 0; i < b->m->n_tensors; i++) {
        if (b->used[i]) continue;
        const st_tensor_t *t = &b->m->tensors[i];
        const char *hint = "";
        if (strstr(t->name, "_proj.bias") && !b->c->attention_bias) hint = " (config.json has attention_bias false)";
        else if (strncmp(t->name, "model.layers.", 13) == 0) hint = " (check num_hidden_layers in config.json)";
        return mv_error("%s: unexpected tensor %s: a Qwen3ForCausalLM with this config.json has no such tensor%s",
                        t->file, t->name, hint);
    }
    return 0;
}

int qwen3_weights_bind(const qwen3_config_t *c, const st_model_t *m, qwen3_weights_t *w) {
    *w = (qwen3_weights_t){0};
    binder_t b = {c, m, calloc(m->n_tensors + 1, 1), w};
    w->layers = calloc((size_t)c->num_hidden_layers, sizeof *w->layers);
    if (!b.used || !w->layers) {
        free(b.used);
        qwen3_weights_free(w);
        return mv_error("%s: out of memory", m->source);
    }
    w->n_layers = c->num_hidden_layers;
    int rc = bind(&b, "model.embed_tokens.weight", c->vocab_size, c->hidden_size, &w->embed_tokens);
    for (int i = 0; i < c->num_hidden_layers && !rc; i++) rc = bind_layer(&b, i, &w->layers[i]);
    if (!rc) rc = bind(&b, "model.norm.weight", c->hidden_size, -1, &w->norm);
    if (!rc) rc = bind_lm_head(&b);
    if (!rc) rc = check_unused(&b);
    free(b.used);
    if (rc) qwen3_weights_free(w);
    return rc ? -1 : 0;
}

void qwen3_weights_free(qwen3_weights_t *w) {
    free(w->layers);
    *w = (qwen3_weights_t){0};
}

// ---- random weights ---------------------------------------------------------------------

static void push_spec(st_tensor_t *specs, size_t *n, const char *name, int64_t d0, int64_t d1) {
    st_tensor_t *t = &specs[(*n)++];
    *t = (st_tensor_t){.name = name, .dtype = ST_BF16, .ndim = d1 < 0 ? 1 : 2, .shape = {d0, d1 < 0 ? 0 : d1}};
}

// Norm weights are RMSNorm's gain: 1 is its identity, as HF initialises it.
static int is_norm(const char *name) {
    size_t n = strlen(name), k = strlen("norm.weight");
    return n >= k && strcmp(name + n - k, "norm.weight") == 0;
}

// The draw, in parallel but independent of the thread count: every tensor
// is cut into chunks of RANDOM_CHUNK values, and chunk j of tensor i (in
// name order) is its own splitmix64 stream seeded from (seed, i, j). A chunk
// is filled by one thread whichever it is, so any number of threads gives
// the same bytes. (Qwen3-0.6B's 596M values took 25 s on one thread.)
#define RANDOM_CHUNK ((size_t)1 << 20)

static uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

typedef struct {
    st_model_t *m;
    uint64_t seed;
    float std;
    size_t *first_chunk;  // [n_tensors + 1] prefix sums of the chunk counts
    size_t next;          // the next chunk to take (atomic)
} fill_job_t;

static void fill_chunk(fill_job_t *f, size_t i, size_t j) {
    const st_tensor_t *t = &f->m->tensors[i];
    bf16_t *d = st_model_data(f->m, t);
    size_t n = (size_t)st_numel(t), lo = j * RANDOM_CHUNK, hi = lo + RANDOM_CHUNK < n ? lo + RANDOM_CHUNK : n;
    if (is_norm(t->name)) {
        for (size_t k = lo; k < hi; k++) d[k] = float_to_bf16(1.0f);
    } else if (strstr(t->name, "_proj.bias")) {
        memset(d + lo, 0, (hi - lo) * sizeof *d);  // zeros, as HF initialises a Linear's bias
    } else {
        rng_t rng;
        rng_seed(&rng, mix64(mix64(f->seed ^ mix64((uint64_t)i + 1)) + (uint64_t)j));
        fill_normal_bf16(&rng, d + lo, hi - lo, 0.0f, f->std);
    }
}

static void *fill_worker(void *arg) {
    fill_job_t *f = arg;
    const size_t total = f->first_chunk[f->m->n_tensors];
    size_t i = 0;
    for (;;) {
        size_t c = __atomic_fetch_add(&f->next, 1, __ATOMIC_RELAXED);
        if (c >= total) return NULL;
        while (f->first_chunk[i + 1] <= c) i++;  // chunks are taken in increasing order by each thread
        fill_chunk(f, i, c - f->first_chunk[i]);
    }
}

static int fill_random(st_model_t *m, uint64_t seed, float std) {
    fill_job_t f = {m, seed, std, malloc((m->n_tensors + 1) * sizeof(size_t)), 0};
    if (!f.first_chunk) return mv_error("random weights: out of memory");
    f.first_chunk[0] = 0;
    for (size_t i = 0; i < m->n_tensors; i++) {
        size_t n = (size_t)st_numel(&m->tensors[i]);
        f.first_chunk[i + 1] = f.first_chunk[i] + (n + RANDOM_CHUNK - 1) / RANDOM_CHUNK;
    }
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    size_t nt = cpus < 1 ? 1 : cpus > 64 ? 64 : (size_t)cpus;
    if (nt > f.first_chunk[m->n_tensors]) nt = f.first_chunk[m->n_tensors] > 0 ? f.first_chunk[m->n_tensors] : 1;
    pthread_t tids[64];
    size_t started = 0;
    while (started + 1 < nt && pthread_create(&tids[started], NULL, fill_worker, &f) == 0) started++;
    fill_worker(&f);  // this thread too (and alone if no thread could start)
    for (size_t t = 0; t < started; t++) pthread_join(tids[t], NULL);
    free(f.first_chunk);
    return 0;
}

int qwen3_weights_random(const qwen3_config_t *c, uint64_t seed, float std, st_model_t **out) {
    *out = NULL;
    const size_t per_layer = LAYER_MAX_TENSORS, L = (size_t)c->num_hidden_layers;
    tensor_want_t *want = calloc(L * per_layer + 1, sizeof *want);
    st_tensor_t *specs = calloc(L * per_layer + 3, sizeof *specs);
    qwen3_layer_weights_t unused;
    int rc = want && specs ? 0 : mv_error("random weights: out of memory");
    size_t n = 0;
    if (!rc) {
        push_spec(specs, &n, "model.embed_tokens.weight", c->vocab_size, c->hidden_size);
        push_spec(specs, &n, "model.norm.weight", c->hidden_size, -1);
        if (!c->tie_word_embeddings) push_spec(specs, &n, "lm_head.weight", c->vocab_size, c->hidden_size);
        for (size_t i = 0; i < L; i++) {
            tensor_want_t *w = want + i * per_layer;
            int k = layer_tensors(c, (int)i, &unused, w);
            for (int j = 0; j < k; j++) push_spec(specs, &n, w[j].name, w[j].d0, w[j].d1);
        }
        rc = st_model_alloc("random weights", specs, n, out);
    }
    free(specs);
    free(want);
    if (rc) return -1;
    if (fill_random(*out, seed, std)) {
        st_close(*out);
        *out = NULL;
        return -1;
    }
    return 0;
}

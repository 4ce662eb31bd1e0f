/*
 * chapters/09-engine/model/safetensors.c - opening and checking safetensors files
 * (see safetensors.h for the format and the list of checks).
 *
 * Reading order: dtypes and the f16 -> bf16 conversion, one tensor's header
 * entry, one file (header, entries, the layout of the data section), then
 * the index of a sharded checkpoint and st_open/st_find/st_close.
 */
#include "chapters/09-engine/model/safetensors.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/check.h"

// The format stores numbers little-endian and so does every machine the
// lab runs on (x86-64, aarch64): tensor bytes are used as they are.
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors.c reads little-endian data in place; a big-endian host would need byte swaps"
#endif

// The format's own limit on the header (the Rust reference refuses more).
#define MAX_HEADER_BYTES (100u << 20)
// JSON numbers are doubles: integers above 2^53 are not exact any more.
#define MAX_JSON_INT 9007199254740992.0

// ---- dtypes ------------------------------------------------------------------------------

size_t st_dtype_size(st_dtype_t d) { return d == ST_F32 ? 4 : 2; }

const char *st_dtype_name(st_dtype_t d) { return d == ST_BF16 ? "BF16" : d == ST_F16 ? "F16" : "F32"; }

static int dtype_from_name(const char *s, st_dtype_t *d) {
    if (strcmp(s, "BF16") == 0) *d = ST_BF16;
    else if (strcmp(s, "F16") == 0) *d = ST_F16;
    else if (strcmp(s, "F32") == 0) *d = ST_F32;
    else return -1;
    return 0;
}

int64_t st_numel(const st_tensor_t *t) {
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
    return n;
}

// IEEE half: 1 sign bit, 5 exponent bits (bias 15), 10 mantissa bits.
// float has 8 exponent bits (bias 127) and 23 mantissa bits, so every half
// is a float: normals are rebiased, subnormals scaled, Inf/NaN widened.
float f16_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
    uint32_t bits;
    if (exp == 0x1f) {
        bits = sign | 0x7f800000u | (mant << 13);  // Inf (mant 0) or NaN (payload kept)
    } else if (exp != 0) {
        bits = sign | ((exp - 15 + 127) << 23) | (mant << 13);
    } else {
        // Zero or subnormal: mant * 2^-24, exact in float (mant < 2^10).
        float f = (float)mant * 0x1p-24f;
        memcpy(&bits, &f, sizeof bits);
        bits |= sign;
    }
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

// Elements are read with memcpy: data_offsets need not be aligned to the
// element size (an odd header length is legal), and memcpy of a constant
// size compiles to a plain load where alignment allows.
void st_to_bf16(const st_tensor_t *t, bf16_t *dst) {
    const unsigned char *src = t->data;
    size_t n = (size_t)st_numel(t);
    if (t->dtype == ST_BF16) {
        if (n) memcpy(dst, src, n * sizeof *dst);
    } else if (t->dtype == ST_F16) {
        for (size_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, src + 2 * i, 2);
            dst[i] = float_to_bf16(f16_to_float(h));  // exact widening, then one rounding
        }
    } else {
        for (size_t i = 0; i < n; i++) {
            float f;
            memcpy(&f, src + 4 * i, 4);
            dst[i] = float_to_bf16(f);
        }
    }
}

const bf16_t *st_bf16_view(const st_tensor_t *t, bf16_t **owned) {
    *owned = NULL;
    if (t->dtype == ST_BF16 && (uintptr_t)t->data % sizeof(bf16_t) == 0) return t->data;
    size_t n = (size_t)st_numel(t);
    *owned = malloc((n ? n : 1) * sizeof **owned);
    if (!*owned) {
        mv_error("out of host memory converting %s to bf16 (%zu bytes)", t->name, n * sizeof **owned);
        return NULL;
    }
    st_to_bf16(t, *owned);
    return *owned;
}

// ---- growable tensor list -------------------------------------------------------------------

typedef struct {
    st_tensor_t *t;  // [n]
    size_t n, cap;
} tensor_list_t;

static st_tensor_t *list_push(tensor_list_t *l) {
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 64;
        st_tensor_t *p = realloc(l->t, cap * sizeof *p);
        if (!p) return NULL;
        l->t = p;
        l->cap = cap;
    }
    l->t[l->n] = (st_tensor_t){0};
    return &l->t[l->n++];
}

static void list_free(tensor_list_t *l) {
    for (size_t i = 0; i < l->n; i++) free((char *)l->t[i].name);
    free(l->t);
    *l = (tensor_list_t){0};
}

// ---- one tensor's header entry -------------------------------------------------------------

// A JSON integer in [0, 2^53], else -1.
static double json_uint(const cJSON *v) {
    if (!cJSON_IsNumber(v)) return -1;
    double d = v->valuedouble;
    return d >= 0 && d <= MAX_JSON_INT && d == floor(d) ? d : -1;
}

// Where one tensor's bytes are, relative to the data section.
typedef struct {
    uint64_t begin, end;
    size_t index;  // into the file's tensor list
} span_t;

// Fill *t from `entry` ({"dtype", "shape", "data_offsets"}); data_size is
// the data section's length, in which [begin, end) must lie.
static int parse_entry(const char *path, const cJSON *entry, const uint8_t *data, uint64_t data_size, st_tensor_t *t,
                       span_t *span) {
    const char *name = entry->string;
    if (!cJSON_IsObject(entry)) return mv_error("%s: tensor %s: header entry is not a JSON object", path, name);
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(entry, "dtype");
    const cJSON *shape = cJSON_GetObjectItemCaseSensitive(entry, "shape");
    const cJSON *offs = cJSON_GetObjectItemCaseSensitive(entry, "data_offsets");
    if (!cJSON_IsString(dt)) return mv_error("%s: tensor %s: no \"dtype\" string", path, name);
    if (dtype_from_name(dt->valuestring, &t->dtype))
        return mv_error("%s: tensor %s: dtype %.20s is not supported (only BF16, F16 and F32)", path, name,
                        dt->valuestring);
    if (!cJSON_IsArray(shape)) return mv_error("%s: tensor %s: no \"shape\" list", path, name);
    int ndim = cJSON_GetArraySize(shape);
    if (ndim > ST_MAX_DIMS) return mv_error("%s: tensor %s: %d dims, at most %d", path, name, ndim, ST_MAX_DIMS);
    t->ndim = ndim;
    // numel * element size must not overflow: with every dim <= 2^53 a
    // product past 2^62 is refused before it can wrap.
    double numel = 1;
    for (int i = 0; i < ndim; i++) {
        double d = json_uint(cJSON_GetArrayItem(shape, i));
        if (d < 0) return mv_error("%s: tensor %s: shape[%d] is not a non-negative integer", path, name, i);
        t->shape[i] = (int64_t)d;
        numel *= d;
        if (numel > 0x1p62) return mv_error("%s: tensor %s: shape is impossibly large", path, name);
    }
    double b = json_uint(cJSON_GetArrayItem(offs, 0)), e = json_uint(cJSON_GetArrayItem(offs, 1));
    if (!cJSON_IsArray(offs) || cJSON_GetArraySize(offs) != 2 || b < 0 || e < 0)
        return mv_error("%s: tensor %s: data_offsets must be [begin, end], two non-negative integers", path, name);
    span->begin = (uint64_t)b;
    span->end = (uint64_t)e;
    if (span->begin > span->end)
        return mv_error("%s: tensor %s: data_offsets [%.0f, %.0f) end before they begin", path, name, b, e);
    if (span->end > data_size)
        return mv_error("%s: tensor %s: data_offsets [%.0f, %.0f) run past the data section (%llu bytes): "
                        "the file is truncated or the offsets are wrong",
                        path, name, b, e, (unsigned long long)data_size);
    uint64_t want = (uint64_t)numel * st_dtype_size(t->dtype);
    if (span->end - span->begin != want)
        return mv_error("%s: tensor %s: data_offsets span %llu bytes, but %s with %.0f elements needs %llu", path,
                        name, (unsigned long long)(span->end - span->begin), dt->valuestring, numel,
                        (unsigned long long)want);
    t->data = data + span->begin;
    t->nbytes = (size_t)want;
    t->name = strdup(name);
    return t->name ? 0 : mv_error("%s: out of memory", path);
}

// ---- one file -----------------------------------------------------------------------------

static int cmp_span(const void *a, const void *b) {
    const span_t *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    return x->end < y->end ? -1 : x->end > y->end;
}

// The tensors must tile the data section: sorted by begin, each starts
// where the previous ended (no overlap, no gap) and the last ends at the
// end of the data section.
// A file with no tensors (header "{}") is legal and has an empty data section.
static int check_layout(const char *path, span_t *spans, size_t n, const st_tensor_t *t, uint64_t data_size) {
    if (n > 1) qsort(spans, n, sizeof *spans, cmp_span);
    uint64_t at = 0;
    for (size_t i = 0; i < n; i++) {
        const span_t *s = &spans[i];
        if (s->begin < at)
            return mv_error("%s: tensor %s: data_offsets [%llu, %llu) overlap tensor %s [%llu, %llu)", path,
                            t[s->index].name, (unsigned long long)s->begin, (unsigned long long)s->end,
                            t[spans[i - 1].index].name, (unsigned long long)spans[i - 1].begin,
                            (unsigned long long)spans[i - 1].end);
        if (s->begin > at)
            return mv_error("%s: tensor %s: data_offsets [%llu, %llu) leave bytes [%llu, %llu) of the data section "
                            "unused (the format allows no gaps)",
                            path, t[s->index].name, (unsigned long long)s->begin, (unsigned long long)s->end,
                            (unsigned long long)at, (unsigned long long)s->begin);
        at = s->end;
    }
    if (at != data_size)
        return mv_error("%s: %llu bytes after the last tensor's data belong to no tensor", path,
                        (unsigned long long)(data_size - at));
    return 0;
}

// The header: 8-byte length N, then N bytes of JSON (a single object,
// optionally padded with spaces). Returns the parsed object or NULL.
static cJSON *parse_header(const mapped_file_t *f, uint64_t *header_len) {
    if (f->size < 8) {
        mv_error("%s: %zu bytes, too short for a safetensors file (it starts with an 8-byte header length)", f->path,
                 f->size);
        return NULL;
    }
    uint64_t n;
    memcpy(&n, f->data, 8);  // little-endian, like the host (checked above)
    if (n > f->size - 8) {
        mv_error("%s: header length %llu is larger than the rest of the file (%zu bytes): truncated, or not a "
                 "safetensors file",
                 f->path, (unsigned long long)n, f->size - 8);
        return NULL;
    }
    if (n > MAX_HEADER_BYTES) {
        mv_error("%s: header length %llu is over the format's limit of %u bytes", f->path, (unsigned long long)n,
                 MAX_HEADER_BYTES);
        return NULL;
    }
    const char *text = (const char *)f->data + 8, *end = NULL;
    cJSON *h = n && text[0] == '{' ? cJSON_ParseWithLengthOpts(text, (size_t)n, &end, 0) : NULL;
    size_t at = h ? (size_t)(end - text) : 0;
    while (h && at < n && text[at] == ' ') at++;  // the padding
    if (!cJSON_IsObject(h) || at != n) {
        cJSON_Delete(h);
        mv_error("%s: the %llu-byte header is not one JSON object", f->path, (unsigned long long)n);
        return NULL;
    }
    // A tensor listed twice, or a name cut at a NUL, would bind the wrong bytes.
    if (json_check_strict(h, text, (size_t)(end - text))) {
        cJSON_Delete(h);
        mv_error_prefix("%s: header", f->path);
        return NULL;
    }
    *header_len = n;
    return h;
}

// Parse file f's header and append its tensors to `out`.
static int parse_file(const mapped_file_t *f, tensor_list_t *out) {
    uint64_t hlen = 0;
    cJSON *h = parse_header(f, &hlen);
    if (!h) return -1;
    const uint8_t *data = f->data + 8 + hlen;
    uint64_t data_size = f->size - 8 - hlen;
    size_t first = out->n;
    int n_entries = cJSON_GetArraySize(h);
    span_t *spans = malloc(((size_t)n_entries + 1) * sizeof *spans);
    int rc = spans ? 0 : mv_error("%s: out of memory", f->path);
    size_t n = 0;
    for (const cJSON *e = h->child; e && !rc; e = e->next) {
        if (strcmp(e->string, "__metadata__") == 0) {
            if (!cJSON_IsObject(e)) rc = mv_error("%s: __metadata__ is not a JSON object", f->path);
            continue;
        }
        st_tensor_t *t = list_push(out);
        if (!t) {
            rc = mv_error("%s: out of memory", f->path);
            break;
        }
        t->file = f->path;
        spans[n].index = out->n - 1 - first;
        rc = parse_entry(f->path, e, data, data_size, t, &spans[n]);
        n++;
    }
    // out->t is still NULL when no file so far had a tensor: no pointer arithmetic on it then.
    if (!rc) rc = check_layout(f->path, spans, n, n ? out->t + first : NULL, data_size);
    free(spans);
    cJSON_Delete(h);
    return rc;
}

// ---- the model: one file or an index of shards ----------------------------------------------------

static int cmp_tensor_name(const void *a, const void *b) {
    return strcmp(((const st_tensor_t *)a)->name, ((const st_tensor_t *)b)->name);
}

const st_tensor_t *st_find(const st_model_t *m, const char *name) {
    st_tensor_t key = {.name = name};
    return m && m->n_tensors ? bsearch(&key, m->tensors, m->n_tensors, sizeof key, cmp_tensor_name) : NULL;
}

void st_close(st_model_t *m) {
    if (!m) return;
    tensor_list_t l = {m->tensors, m->n_tensors, m->n_tensors};
    list_free(&l);
    for (int i = 0; i < m->n_files; i++) mapped_file_close(&m->files[i]);
    free(m->files);
    free(m->owned);
    free(m->source);
    free(m);
}

int st_model_alloc(const char *source, const st_tensor_t *specs, size_t n, st_model_t **out) {
    *out = NULL;
    st_model_t *m = calloc(1, sizeof *m);
    tensor_list_t l = {0};
    size_t total = 0;
    int rc = m && (m->source = strdup(source)) ? 0 : -1;
    for (size_t i = 0; !rc && i < n; i++) {
        st_tensor_t *t = list_push(&l);
        if (!t || !(t->name = strdup(specs[i].name))) {
            rc = -1;
            break;
        }
        t->dtype = specs[i].dtype;
        t->ndim = specs[i].ndim;
        memcpy(t->shape, specs[i].shape, sizeof t->shape);
        t->file = m->source;
        t->nbytes = (size_t)st_numel(t) * st_dtype_size(t->dtype);
        // Each tensor starts 64-byte aligned: offsets first, pointers once the block exists.
        t->data = (const void *)(uintptr_t)total;
        total += (t->nbytes + 63) / 64 * 64;
    }
    if (!rc && !(m->owned = calloc(total ? total : 1, 1))) rc = -1;
    for (size_t i = 0; !rc && i < l.n; i++) l.t[i].data = (const char *)m->owned + (uintptr_t)l.t[i].data;
    if (m) {
        m->tensors = l.t;
        m->n_tensors = l.n;
    } else {
        list_free(&l);
    }
    if (rc) {
        st_close(m);
        return mv_error("%s: out of memory (%zu bytes of tensors)", source, total);
    }
    if (m->n_tensors > 1) qsort(m->tensors, m->n_tensors, sizeof *m->tensors, cmp_tensor_name);
    *out = m;
    return 0;
}

void *st_model_data(st_model_t *m, const st_tensor_t *t) {
    return m->owned ? (char *)m->owned + ((const char *)t->data - (const char *)m->owned) : NULL;
}

// Map and parse files[0..n_files) (their paths already in files[i].path
// slots passed as `paths`), then sort the tensors by name; a name in two
// shards is an error naming both.
static int load_files(st_model_t *m, char **paths, int n_files) {
    m->files = calloc((size_t)n_files, sizeof *m->files);
    if (!m->files) return mv_error("%s: out of memory", m->source);
    tensor_list_t l = {0};
    int rc = 0;
    for (int i = 0; i < n_files && !rc; i++) {
        rc = mapped_file_open(paths[i], &m->files[i]);
        if (!rc) {
            m->n_files = i + 1;
            rc = parse_file(&m->files[i], &l);
        }
    }
    m->tensors = l.t;
    m->n_tensors = l.n;
    if (rc) return -1;
    if (m->n_tensors > 1) qsort(m->tensors, m->n_tensors, sizeof *m->tensors, cmp_tensor_name);
    for (size_t i = 1; i < m->n_tensors; i++)
        if (strcmp(m->tensors[i - 1].name, m->tensors[i].name) == 0)
            return mv_error("%s: tensor %s appears twice (in %s and in %s)", m->source, m->tensors[i].name,
                            m->tensors[i - 1].file, m->tensors[i].file);
    return 0;
}

// A shard's name must be a plain file name in the model directory:
// "../x" or "/etc/x" in a downloaded index must not open files elsewhere.
static int is_plain_name(const char *s) {
    return s[0] && !strchr(s, '/') && strcmp(s, ".") && strcmp(s, "..");
}

static char *join(const char *dir, const char *name) {
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = malloc(n);
    if (p) snprintf(p, n, "%s/%s", dir, name);
    return p;
}

// weight_map {tensor: shard}: the distinct shard paths, in order of first mention.
static int index_shards(const char *idx, const char *dir, const cJSON *wm, char ***paths, int *n_paths) {
    const char **names = calloc((size_t)cJSON_GetArraySize(wm) + 1, sizeof *names);
    if (!names) return mv_error("%s: out of memory", idx);
    int n = 0, rc = 0;
    for (const cJSON *e = wm->child; e && !rc; e = e->next) {
        if (!cJSON_IsString(e) || !is_plain_name(e->valuestring)) {
            rc = mv_error("%s: weight_map: tensor %s must map to a file name in the model directory", idx, e->string);
            break;
        }
        int seen = 0;
        for (int k = 0; k < n && !seen; k++) seen = strcmp(names[k], e->valuestring) == 0;
        if (!seen) names[n++] = e->valuestring;
        char *p = seen ? NULL : join(dir, e->valuestring);
        if (!seen && !file_exists(p))
            rc = mv_error("%s: weight_map puts tensor %s in %s, which does not exist", idx, e->string, p);
        free(p);
    }
    *paths = calloc((size_t)n + 1, sizeof **paths);
    if (!rc && !*paths) rc = mv_error("%s: out of memory", idx);
    for (int k = 0; k < n && !rc; k++)
        if (!((*paths)[k] = join(dir, names[k]))) rc = mv_error("%s: out of memory", idx);
    *n_paths = n;
    free(names);
    return rc;
}

// Every tensor of the index is in the shard it names, every tensor of the
// shards is in the index, and the index names no tensor twice.
static int check_index(const st_model_t *m, const char *dir, const cJSON *wm) {
    size_t n_listed = 0;
    for (const cJSON *e = wm->child; e; e = e->next, n_listed++) {
        for (const cJSON *d = wm->child; d != e; d = d->next)
            if (strcmp(d->string, e->string) == 0)
                return mv_error("%s: weight_map lists tensor %s twice", m->source, e->string);
        const st_tensor_t *t = st_find(m, e->string);
        char *want = join(dir, e->valuestring);
        int rc = !want ? mv_error("%s: out of memory", m->source)
                 : !t  ? mv_error("%s: weight_map puts tensor %s in %s, but that file does not have it", m->source,
                                  e->string, want)
                 : strcmp(t->file, want) != 0
                     ? mv_error("%s: weight_map puts tensor %s in %s, but it is in %s", m->source, e->string, want,
                                t->file)
                     : 0;
        free(want);
        if (rc) return rc;
    }
    // All listed tensors were found, each once, so any surplus is unlisted.
    for (size_t i = 0; n_listed != m->n_tensors && i < m->n_tensors; i++)
        if (!cJSON_GetObjectItemCaseSensitive(wm, m->tensors[i].name))
            return mv_error("%s: tensor %s is in %s but not in the weight_map", m->source, m->tensors[i].name,
                            m->tensors[i].file);
    return 0;
}

static int open_index(st_model_t *m, const char *dir) {
    cJSON *root = json_load_file(m->source);
    if (!root) return -1;
    const cJSON *wm = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
    char **paths = NULL;
    int n_paths = 0;
    int rc = cJSON_IsObject(wm) && wm->child ? 0 : mv_error("%s: no weight_map object with tensors in it", m->source);
    if (!rc) rc = index_shards(m->source, dir, wm, &paths, &n_paths);
    if (!rc) rc = load_files(m, paths, n_paths);
    if (!rc) rc = check_index(m, dir, wm);
    for (int i = 0; paths && i < n_paths; i++) free(paths[i]);
    free(paths);
    cJSON_Delete(root);
    return rc;
}

static int finish(st_model_t *m, int rc, st_model_t **out) {
    if (rc) {
        st_close(m);
        m = NULL;
    }
    *out = m;
    return rc ? -1 : 0;
}

int st_open_file(const char *path, st_model_t **out) {
    st_model_t *m = calloc(1, sizeof *m);
    if (!m || !(m->source = strdup(path))) {
        free(m);
        *out = NULL;
        return mv_error("%s: out of memory", path);
    }
    char *paths[1] = {m->source};
    return finish(m, load_files(m, paths, 1), out);
}

int st_open(const char *dir, st_model_t **out) {
    *out = NULL;
    char *single = join(dir, "model.safetensors"), *index = join(dir, "model.safetensors.index.json");
    int rc = single && index ? 0 : mv_error("%s: out of memory", dir);
    if (!rc && file_exists(single)) {
        rc = st_open_file(single, out);
    } else if (!rc && file_exists(index)) {
        st_model_t *m = calloc(1, sizeof *m);
        if (!m) {
            rc = mv_error("%s: out of memory", index);
        } else {
            m->source = index;
            index = NULL;
            rc = finish(m, open_index(m, dir), out);
        }
    } else if (!rc) {
        rc = mv_error("%s: no model.safetensors and no model.safetensors.index.json in this directory", dir);
    }
    free(single);
    free(index);
    return rc;
}

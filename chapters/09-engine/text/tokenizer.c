/*
 * chapters/09-engine/text/tokenizer.c - Qwen3's byte-level BPE tokenizer (see tokenizer.h).
 *
 * Reading order: the byte <-> unicode table, UTF-8 helpers, the two hash
 * tables (merges and the word cache), loading tokenizer.json, then encode
 * (added tokens -> NFC -> regex -> BPE) and decode.
 *
 * Tested by tests/test_tokenizer.c and, id for id against Hugging Face
 * `tokenizers`, by tests/tokenizer/compare_hf.py (both run by `make test`).
 */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "chapters/09-engine/text/tokenizer.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdarg.h>
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <utf8proc.h>
#include <xxhash.h>

#include "chapters/09-engine/model/mapped_file.h"
#include "common/check.h"

// ---- growable buffers --------------------------------------------------------------

static int grow(void **data, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return 0;
    size_t c = *cap ? *cap : 64;
    while (c < need) c *= 2;
    void *p = realloc(*data, c * elem);
    if (!p) return mv_error("out of memory (%zu bytes)", c * elem);
    *data = p;
    *cap = c;
    return 0;
}

int tok_bytes_append(tok_bytes_t *b, const char *s, size_t n) {
    if (grow((void **)&b->data, &b->cap, b->len + n + 1, 1)) return -1;
    if (n) memcpy(b->data + b->len, s, n);
    b->len += n;
    b->data[b->len] = '\0';
    return 0;
}

int tok_bytes_appendf(tok_bytes_t *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    const int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0 || grow((void **)&b->data, &b->cap, b->len + (size_t)n + 1, 1)) return -1;
    va_start(ap, fmt);
    vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
    return 0;
}

int tok_bytes_append_json(tok_bytes_t *b, const char *s, size_t n) {
    if (tok_bytes_append(b, "\"", 1)) return -1;
    size_t run = 0;  // s[run..i) needs no escape
    for (size_t i = 0; i < n; i++) {
        const unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c != '"' && c != '\\') continue;
        char esc[8];
        if (c == '"' || c == '\\') snprintf(esc, sizeof esc, "\\%c", c);
        else if (c == '\n') snprintf(esc, sizeof esc, "\\n");
        else if (c == '\r') snprintf(esc, sizeof esc, "\\r");
        else if (c == '\t') snprintf(esc, sizeof esc, "\\t");
        else snprintf(esc, sizeof esc, "\\u%04x", c);
        if (tok_bytes_append(b, s + run, i - run) || tok_bytes_append(b, esc, strlen(esc))) return -1;
        run = i + 1;
    }
    return tok_bytes_append(b, s + run, n - run) || tok_bytes_append(b, "\"", 1) ? -1 : 0;
}

void tok_bytes_free(tok_bytes_t *b) {
    free(b->data);
    *b = (tok_bytes_t){0};
}

int tok_ids_push(tok_ids_t *v, int32_t id) {
    if (v->len == v->cap && grow((void **)&v->data, &v->cap, v->len + 1, sizeof(int32_t))) return -1;
    v->data[v->len++] = id;
    return 0;
}

void tok_ids_free(tok_ids_t *v) {
    free(v->data);
    *v = (tok_ids_t){0};
}

// ---- the byte-level alphabet ----------------------------------------------------------
// BPE vocabularies are stored as text, but byte-level BPE works on raw bytes,
// and bytes such as ' ' or 0x0a or 0xe4 would make a vocabulary file
// unreadable. GPT-2 therefore gave each of the 256 bytes a visible unicode
// character: printable Latin-1 bytes stand for themselves, the 68 others
// (controls, space, 0x7f-0xa0, 0xad) become U+0100, U+0101... in byte order.
// So ' ' is 'Ġ' (U+0120) and '\n' is 'Ċ' (U+010A) in tokenizer.json.
static void byte_level_table(uint32_t byte_to_cp[256]) {
    int n = 0;
    for (int b = 0; b < 256; b++) {
        int visible = (b >= '!' && b <= '~') || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
        byte_to_cp[b] = visible ? (uint32_t)b : (uint32_t)(256 + n++);
    }
}

// ---- UTF-8 ------------------------------------------------------------------------------

// Length of the valid UTF-8 sequence at s[0..avail), 0 if it is invalid, or
// -k if the k available bytes are a valid but unfinished start of one.
// *bad_len gets the length of the maximal invalid subpart when 0 is returned.
static int utf8_seq(const unsigned char *s, size_t avail, int *bad_len) {
    unsigned c = s[0];
    *bad_len = 1;
    if (c < 0x80) return 1;
    int need;
    unsigned lo = 0x80, hi = 0xbf;  // the allowed range of the second byte
    if (c >= 0xc2 && c <= 0xdf) need = 2;
    else if (c >= 0xe0 && c <= 0xef) {
        need = 3;
        if (c == 0xe0) lo = 0xa0;        // overlong
        else if (c == 0xed) hi = 0x9f;   // surrogates U+D800..DFFF
    } else if (c >= 0xf0 && c <= 0xf4) {
        need = 4;
        if (c == 0xf0) lo = 0x90;        // overlong
        else if (c == 0xf4) hi = 0x8f;   // past U+10FFFF
    } else return 0;                     // 0x80..0xc1, 0xf5..0xff never start one
    for (int i = 1; i < need; i++) {
        if ((size_t)i >= avail) return -i;
        unsigned lo_i = i == 1 ? lo : 0x80, hi_i = i == 1 ? hi : 0xbf;
        if (s[i] < lo_i || s[i] > hi_i) {
            *bad_len = i;
            return 0;
        }
    }
    return need;
}

size_t utf8_first_invalid(const char *text, size_t len) {
    const unsigned char *s = (const unsigned char *)text;
    size_t i = 0;
    while (i < len) {
        if (s[i] < 0x80) {
            i++;
            continue;
        }
        int bad, n = utf8_seq(s + i, len - i, &bad);
        if (n <= 0) return i;
        i += (size_t)n;
    }
    return len;
}

static const char REPLACEMENT[] = "\xef\xbf\xbd";  // U+FFFD

// Append bytes s[0..n) as text: valid sequences as they are, each maximal
// invalid subpart as one U+FFFD. If `final` is 0, an unfinished sequence at
// the very end is not converted; its length is returned in *held.
static int append_lossy(tok_bytes_t *out, const unsigned char *s, size_t n, int final, int *held) {
    size_t i = 0, run = 0;  // s[run..i) is valid text not yet copied
    *held = 0;
    while (i < n) {
        if (s[i] < 0x80) {
            i++;
            continue;
        }
        int bad, k = utf8_seq(s + i, n - i, &bad);
        if (k > 0) {
            i += (size_t)k;
            continue;
        }
        if (tok_bytes_append(out, (const char *)s + run, i - run)) return -1;
        if (k < 0 && !final) {
            *held = -k;
            return 0;
        }
        if (tok_bytes_append(out, REPLACEMENT, 3)) return -1;
        i += k < 0 ? (size_t)-k : (size_t)bad;
        run = i;
    }
    return tok_bytes_append(out, (const char *)s + run, i - run);
}

// ---- hash tables ------------------------------------------------------------------------

// Merge table: the pair (left id, right id) -> (rank, merged id). Open
// addressing with linear probing; keys are 64-bit so a multiplicative hash
// is enough. rank_plus1 == 0 marks an empty slot (pair (0, 0) is a real key).
typedef struct {
    uint64_t key;        // (uint64_t)left << 32 | right
    int32_t rank_plus1;  // merge rank + 1: lower rank = learnt earlier = merged first
    int32_t merged;      // id of left+right
} merge_slot_t;

static inline uint64_t pair_key(int32_t a, int32_t b) { return (uint64_t)(uint32_t)a << 32 | (uint32_t)b; }
static inline size_t key_hash(uint64_t k) { return (size_t)((k * 0x9e3779b97f4a7c15ull) >> 17); }

// Word cache: piece bytes -> the ids BPE made of them. Text repeats its
// words (Zipf), so most pieces are found here and BPE runs once per distinct
// word. The keys and ids live in two arenas; when the table is half full
// everything is dropped at once, which bounds memory without any LRU.
typedef struct {
    uint64_t hash;     // XXH3 of the piece
    uint32_t key_off;  // offset into cache_keys
    uint32_t key_len;  // 0 = empty slot (empty pieces are never cached)
    uint32_t ids_off;  // offset into cache_ids
    uint32_t n_ids;
} cache_slot_t;

enum { CACHE_SLOTS = 1 << 16, CACHE_MAX_WORD = 256 };

typedef struct {
    char *content;  // the token's text, matched byte for byte
    size_t len;
    int32_t id;
} added_token_t;

enum { KIND_NONE = 0, KIND_VOCAB = 1, KIND_ADDED = 2, KIND_SPECIAL = 3 };

struct tokenizer {
    int32_t n_ids;         // one past the largest id (vocab and added tokens)
    uint8_t *kind;         // [n_ids] KIND_*: unused ids are KIND_NONE
    uint32_t *text_off;    // [n_ids + 1] each id's decoded bytes are text[off[i]..off[i+1])
    char *text;            // the raw bytes of every token, back to back
    int32_t byte_id[256];  // id of the one-byte token of each byte: where BPE starts

    merge_slot_t *merges;  // [merge_cap] open addressing
    size_t merge_cap;      // power of two, at least 2x the number of merges

    added_token_t *added;  // [n_added] sorted longest first, so the first hit is the longest
    int n_added;
    uint8_t added_first[256];  // 1 if some added token starts with this byte

    pcre2_code *re;            // the pre-tokenizer split regex
    pcre2_match_data *md;
    pcre2_match_context *mctx;
    pcre2_jit_stack *jit_stack;
    int jit;                   // 1 if pcre2_jit_compile succeeded

    cache_slot_t *cache;       // [CACHE_SLOTS]
    size_t cache_used;
    tok_bytes_t cache_keys;
    tok_ids_t cache_ids;

    // BPE scratch, reused between words: [n] symbols of the word being merged.
    int32_t *sym_id, *sym_prev, *sym_next;
    uint64_t *heap;            // [3n] candidate merges, (rank << 32 | position)
    size_t scratch_cap;

    int32_t eos_id;
    int qwen3_chat;
};

static const merge_slot_t *merge_find(const tokenizer_t *t, int32_t a, int32_t b) {
    uint64_t k = pair_key(a, b);
    size_t mask = t->merge_cap - 1;
    for (size_t i = key_hash(k) & mask;; i = (i + 1) & mask) {
        const merge_slot_t *s = &t->merges[i];
        if (!s->rank_plus1) return NULL;
        if (s->key == k) return s;
    }
}

static void merge_insert(tokenizer_t *t, int32_t a, int32_t b, int32_t rank, int32_t merged) {
    uint64_t k = pair_key(a, b);
    size_t mask = t->merge_cap - 1;
    size_t i = key_hash(k) & mask;
    while (t->merges[i].rank_plus1 && t->merges[i].key != k) i = (i + 1) & mask;
    // A pair listed twice keeps its last rank: Hugging Face collects the
    // merges into a map the same way, so later entries overwrite.
    t->merges[i] = (merge_slot_t){k, rank + 1, merged};
}

// ---- loading ----------------------------------------------------------------------------

// The whole file, NUL-terminated. Only a regular file: fopen() opens a
// directory too, and its "size" from fseek/ftell is LONG_MAX on Linux, which
// malloc would be asked for.
static char *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        mv_error("cannot open %s: %s", path, strerror(errno));
        return NULL;
    }
    struct stat st;
    int stat_ok = fstat(fileno(f), &st) == 0;
    if (!stat_ok || !S_ISREG(st.st_mode)) {
        int dir = stat_ok && S_ISDIR(st.st_mode);
        fclose(f);
        mv_error("%s is not a regular file%s", path, dir ? " (it is a directory)" : "");
        return NULL;
    }
    char *buf = malloc((size_t)st.st_size + 1);
    if (!buf) {
        fclose(f);
        mv_error("%s: out of memory for its %lld bytes", path, (long long)st.st_size);
        return NULL;
    }
    size_t n = fread(buf, 1, (size_t)st.st_size, f);
    int bad = n != (size_t)st.st_size || ferror(f);
    fclose(f);
    if (bad) {
        free(buf);
        mv_error("cannot read %s (%zu of %lld bytes read)", path, n, (long long)st.st_size);
        return NULL;
    }
    buf[n] = '\0';
    *len = n;
    return buf;
}

static cJSON *parse_json_file(const char *path) {
    size_t len;
    char *text = read_file(path, &len);
    if (!text) return NULL;
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(text, len, &end, 0);
    if (!root) {
        // cJSON points at where parsing stopped: report it as a byte offset.
        const char *at = cJSON_GetErrorPtr();
        long off = at && at >= text && at <= text + len ? (long)(at - text) : -1;
        mv_error("%s: malformed JSON near byte %ld (truncated or not JSON?)", path, off);
    } else {
        size_t at = (size_t)(end - text);
        while (at < len && strchr(" \t\r\n", text[at]) && text[at]) at++;
        int rc = at < len ? mv_error("%s: malformed JSON: unexpected bytes after the value at byte %zu", path, at)
                 : json_check_strict(root, text, len) ? mv_error_prefix("%s", path)
                                                      : 0;
        if (rc) {
            cJSON_Delete(root);
            root = NULL;
        }
    }
    free(text);
    return root;
}

// A small string -> id table, only alive while loading (vocab lookups for merges).
typedef struct {
    const char **key;  // [cap] points into the parsed JSON
    int32_t *id;       // [cap]
    size_t cap;
} vocab_map_t;

static size_t str_hash(const char *s) { return (size_t)XXH3_64bits(s, strlen(s)); }

static int vocab_map_init(vocab_map_t *m, size_t n) {
    m->cap = 1;
    while (m->cap < 2 * n + 16) m->cap *= 2;
    m->key = calloc(m->cap, sizeof *m->key);
    m->id = malloc(m->cap * sizeof *m->id);
    return m->key && m->id ? 0 : mv_error("out of memory for the vocabulary");
}

static int32_t vocab_map_get(const vocab_map_t *m, const char *s) {
    for (size_t i = str_hash(s) & (m->cap - 1);; i = (i + 1) & (m->cap - 1)) {
        if (!m->key[i]) return -1;
        if (strcmp(m->key[i], s) == 0) return m->id[i];
    }
}

static int vocab_map_put(vocab_map_t *m, const char *s, int32_t id) {
    size_t i = str_hash(s) & (m->cap - 1);
    for (; m->key[i]; i = (i + 1) & (m->cap - 1))
        if (strcmp(m->key[i], s) == 0) return mv_error("vocab: token \"%s\" is listed twice", s);
    m->key[i] = s;
    m->id[i] = id;
    return 0;
}

static void vocab_map_free(vocab_map_t *m) {
    free(m->key);
    free(m->id);
}

// Turn a byte-level token ("Ġthe") back into its raw bytes (" the").
// Returns -1 if a character is outside the byte-level alphabet.
static int byte_level_decode(const int16_t *cp_to_byte, const char *tok, tok_bytes_t *out) {
    const utf8proc_uint8_t *s = (const utf8proc_uint8_t *)tok;
    size_t len = strlen(tok), i = 0;
    while (i < len) {
        utf8proc_int32_t cp;
        utf8proc_ssize_t n = utf8proc_iterate(s + i, (utf8proc_ssize_t)(len - i), &cp);
        if (n <= 0 || cp >= 512 || cp_to_byte[cp] < 0) return -1;
        char b = (char)cp_to_byte[cp];
        if (tok_bytes_append(out, &b, 1)) return -1;
        i += (size_t)n;
    }
    return 0;
}

static const char *json_type_name(const cJSON *j) {
    if (!j) return "missing";
    if (cJSON_IsString(j)) return "a string";
    if (cJSON_IsNumber(j)) return "a number";
    if (cJSON_IsObject(j)) return "an object";
    if (cJSON_IsArray(j)) return "an array";
    if (cJSON_IsNull(j)) return "null";
    return "a boolean";
}

static const char *json_str(const cJSON *obj, const char *key) {
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(obj, key);
    return cJSON_IsString(j) ? j->valuestring : NULL;
}

// The pipeline around the model must be the one we implement: NFC, a regex
// Split then ByteLevel without its own regex, a ByteLevel decoder. Anything
// else is refused by name rather than tokenized differently.
static int check_pipeline(const cJSON *root, const char *path, const char **pattern) {
    const cJSON *norm = cJSON_GetObjectItemCaseSensitive(root, "normalizer");
    const char *nt = json_str(norm, "type");
    if (!nt || strcmp(nt, "NFC") != 0)
        return mv_error("%s: normalizer must be {\"type\": \"NFC\"} (found %s)", path,
                        nt ? nt : json_type_name(norm));
    const cJSON *pre = cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer");
    const cJSON *seq = cJSON_GetObjectItemCaseSensitive(pre, "pretokenizers");
    const char *pt = json_str(pre, "type");
    if (!pt || strcmp(pt, "Sequence") != 0 || cJSON_GetArraySize(seq) != 2)
        return mv_error("%s: pre_tokenizer must be a Sequence of a regex Split and ByteLevel", path);
    const cJSON *split = cJSON_GetArrayItem(seq, 0), *bl = cJSON_GetArrayItem(seq, 1);
    const char *st = json_str(split, "type"), *beh = json_str(split, "behavior");
    *pattern = json_str(cJSON_GetObjectItemCaseSensitive(split, "pattern"), "Regex");
    if (!st || strcmp(st, "Split") != 0 || !*pattern || !beh || strcmp(beh, "Isolated") != 0 ||
        cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(split, "invert")))
        return mv_error("%s: pre_tokenizer[0] must be a Split with a Regex pattern, behavior "
                        "Isolated, invert false", path);
    const char *bt = json_str(bl, "type");
    if (!bt || strcmp(bt, "ByteLevel") != 0 || cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(bl, "use_regex")) ||
        cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(bl, "add_prefix_space")))
        return mv_error("%s: pre_tokenizer[1] must be ByteLevel with use_regex and "
                        "add_prefix_space false", path);
    const char *dt = json_str(cJSON_GetObjectItemCaseSensitive(root, "decoder"), "type");
    if (!dt || strcmp(dt, "ByteLevel") != 0)
        return mv_error("%s: decoder must be ByteLevel", path);
    return 0;
}

// Hugging Face runs this regex with Oniguruma, whose \s is Unicode's
// White_Space property. PCRE2 10.42's \s (with UCP) is "Z or tab..CR", which
// lacks U+0085, so \s and \S are spelt out as that exact set before compiling.
#define WHITE_SPACE "\\t-\\r \\x{85}\\x{a0}\\x{1680}\\x{2000}-\\x{200a}\\x{2028}\\x{2029}\\x{202f}\\x{205f}\\x{3000}"

static int rewrite_white_space(const char *pat, tok_bytes_t *out) {
    int in_class = 0;
    for (size_t i = 0; pat[i]; i++) {
        char c = pat[i];
        if (c == '\\' && pat[i + 1]) {
            char e = pat[++i];
            int r;
            if (e == 's') r = in_class ? tok_bytes_append(out, WHITE_SPACE, strlen(WHITE_SPACE))
                                       : tok_bytes_append(out, "[" WHITE_SPACE "]", strlen(WHITE_SPACE) + 2);
            else if (e == 'S' && !in_class) r = tok_bytes_append(out, "[^" WHITE_SPACE "]", strlen(WHITE_SPACE) + 3);
            else if (e == 'S') return mv_error("pre-tokenizer regex: \\S inside [...] is not supported");
            else r = tok_bytes_append(out, pat + i - 1, 2);
            if (r) return -1;
            continue;
        }
        if (c == '[' && !in_class) in_class = 1;
        else if (c == ']' && in_class) in_class = 0;
        if (tok_bytes_append(out, &c, 1)) return -1;
    }
    return 0;
}

static int compile_regex(tokenizer_t *t, const char *pattern) {
    tok_bytes_t pat = {0};
    if (rewrite_white_space(pattern, &pat)) {
        tok_bytes_free(&pat);  // the part rewritten before the refusal
        return -1;
    }
    int err;
    PCRE2_SIZE at;
    // UTF: work in code points; UCP: \p{L} etc. by Unicode properties.
    t->re = pcre2_compile((PCRE2_SPTR)pat.data, pat.len, PCRE2_UTF | PCRE2_UCP, &err, &at, NULL);
    tok_bytes_free(&pat);
    if (!t->re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof msg);
        return mv_error("pre-tokenizer regex does not compile at offset %zu: %s", (size_t)at, (char *)msg);
    }
    // JIT makes matching several times faster; without it (an exotic CPU)
    // the interpreter gives the same matches.
    t->jit = pcre2_jit_compile(t->re, PCRE2_JIT_COMPLETE) == 0;
    t->md = pcre2_match_data_create_from_pattern(t->re, NULL);
    t->mctx = pcre2_match_context_create(NULL);
    if (!t->md || !t->mctx) return mv_error("out of memory for the regex");
    if (t->jit) {
        // \s+(?!\S) backtracks over a whole whitespace run; the default 32 KiB
        // JIT stack is too small for very long runs.
        t->jit_stack = pcre2_jit_stack_create(64 * 1024, 8 * 1024 * 1024, NULL);
        if (!t->jit_stack) return mv_error("out of memory for the regex JIT stack");
        pcre2_jit_stack_assign(t->mctx, NULL, t->jit_stack);
    }
    return 0;
}

static int set_token(tokenizer_t *t, int32_t id, int kind, const char *bytes, size_t n, tok_bytes_t *text,
                     uint32_t *start) {
    if (id < 0 || id >= t->n_ids) return mv_error("token id %d out of range", id);
    if (t->kind[id] != KIND_NONE) return mv_error("token id %d is given twice", id);
    t->kind[id] = (uint8_t)kind;
    start[id] = (uint32_t)text->len;
    t->text_off[id] = (uint32_t)n;  // length for now; offsets are built at the end
    return tok_bytes_append(text, bytes, n);
}

static int load_vocab(tokenizer_t *t, const cJSON *vocab, const cJSON *added, vocab_map_t *map,
                      const int16_t *cp_to_byte, const char *path) {
    if (!cJSON_IsObject(vocab)) return mv_error("%s: model.vocab must be an object (found %s)", path, json_type_name(vocab));
    if (!cJSON_IsArray(added)) return mv_error("%s: added_tokens must be an array (found %s)", path, json_type_name(added));
    int n_vocab = cJSON_GetArraySize(vocab);
    int32_t max_id = -1;
    for (const cJSON *v = vocab->child; v; v = v->next) {
        if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble > 1e8)
            return mv_error("%s: vocab entry \"%s\" has no valid id", path, v->string);
        if (v->valueint > max_id) max_id = v->valueint;
    }
    for (const cJSON *a = added->child; a; a = a->next) {
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(a, "id");
        if (!cJSON_IsNumber(id) || id->valuedouble < 0 || id->valuedouble > 1e8 || !json_str(a, "content"))
            return mv_error("%s: an added token lacks an id or content", path);
        if (id->valueint > max_id) max_id = id->valueint;
    }
    t->n_ids = max_id + 1;
    t->kind = calloc((size_t)t->n_ids, 1);
    t->text_off = calloc((size_t)t->n_ids + 1, sizeof(uint32_t));
    uint32_t *start = calloc((size_t)t->n_ids + 1, sizeof(uint32_t));
    if (!t->kind || !t->text_off || !start || vocab_map_init(map, (size_t)n_vocab)) {
        free(start);
        return mv_error("out of memory for the vocabulary");
    }
    tok_bytes_t text = {0}, raw = {0};
    int rc = 0;
    for (int b = 0; b < 256; b++) t->byte_id[b] = -1;
    for (const cJSON *v = vocab->child; v && !rc; v = v->next) {
        raw.len = 0;
        if (byte_level_decode(cp_to_byte, v->string, &raw)) {
            rc = mv_error("%s: vocab token \"%s\" has a character outside the byte-level alphabet", path, v->string);
            break;
        }
        rc = vocab_map_put(map, v->string, v->valueint) ||
             set_token(t, v->valueint, KIND_VOCAB, raw.data ? raw.data : "", raw.len, &text, start);
        if (raw.len == 1) t->byte_id[(unsigned char)raw.data[0]] = v->valueint;
    }
    for (int b = 0; b < 256 && !rc; b++)
        if (t->byte_id[b] < 0) rc = mv_error("%s: vocab has no token for byte 0x%02x", path, b);
    // Added tokens decode as Hugging Face's ByteLevel decoder does: through
    // the byte-level alphabet if every character is in it, else as written.
    t->n_added = cJSON_GetArraySize(added);
    t->added = calloc((size_t)t->n_added + 1, sizeof *t->added);
    if (!t->added && !rc) rc = mv_error("out of memory");
    int k = 0;
    for (const cJSON *a = added->child; a && !rc; a = a->next, k++) {
        const char *content = json_str(a, "content");
        int32_t id = cJSON_GetObjectItemCaseSensitive(a, "id")->valueint;
        if (!*content) {
            rc = mv_error("%s: added token %d has empty content", path, id);
            break;
        }
        static const char *unsupported[] = {"lstrip", "rstrip", "single_word"};
        for (int u = 0; u < 3 && !rc; u++)
            if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(a, unsupported[u])))
                rc = mv_error("%s: added token \"%s\" sets %s, which this tokenizer does not implement",
                              path, content, unsupported[u]);
        if (rc) break;
        int special = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(a, "special"));
        t->added[k] = (added_token_t){strdup(content), strlen(content), id};
        if (!t->added[k].content) rc = mv_error("out of memory");
        t->added_first[(unsigned char)content[0]] = 1;
        raw.len = 0;
        const char *dec = content;
        size_t dec_len = strlen(content);
        if (byte_level_decode(cp_to_byte, content, &raw) == 0) dec = raw.data, dec_len = raw.len;
        if (rc) break;
        if (id < t->n_ids && t->kind[id] == KIND_VOCAB) t->kind[id] = KIND_NONE;  // added wins, as in HF
        rc = set_token(t, id, special ? KIND_SPECIAL : KIND_ADDED, dec, dec_len, &text, start);
    }
    tok_bytes_free(&raw);
    if (!rc) {
        // Lay the tokens' bytes out in id order so decoding is one memcpy per id.
        t->text = malloc(text.len + 1);
        if (!t->text) rc = mv_error("out of memory");
        uint32_t off = 0;
        for (int32_t i = 0; i < t->n_ids && !rc; i++) {
            uint32_t n = t->kind[i] ? t->text_off[i] : 0;
            memcpy(t->text + off, text.data + start[i], n);
            t->text_off[i] = off;
            off += n;
        }
        t->text_off[t->n_ids] = off;
    }
    tok_bytes_free(&text);
    free(start);
    return rc;
}

static int cmp_added_longest_first(const void *a, const void *b) {
    const added_token_t *x = a, *y = b;
    return x->len < y->len ? 1 : x->len > y->len ? -1 : 0;
}

static int load_merges(tokenizer_t *t, const cJSON *merges, const vocab_map_t *map, const char *path) {
    if (!cJSON_IsArray(merges)) return mv_error("%s: model.merges must be an array (found %s)", path, json_type_name(merges));
    int n = cJSON_GetArraySize(merges);
    t->merge_cap = 1;
    while (t->merge_cap < 2 * (size_t)n + 16) t->merge_cap *= 2;
    t->merges = calloc(t->merge_cap, sizeof *t->merges);
    if (!t->merges) return mv_error("out of memory for %d merges", n);
    char buf[1024];
    int rank = 0;
    for (const cJSON *m = merges->child; m; m = m->next, rank++) {
        // Older files store a merge as "left right"; newer ones as ["left", "right"]
        // (which also allows tokens that contain a space).
        const char *left = NULL, *right = NULL;
        char pair_buf[1024];
        if (cJSON_IsString(m)) {
            const char *sp = strchr(m->valuestring, ' ');
            size_t ll = sp ? (size_t)(sp - m->valuestring) : 0;
            if (!sp || ll >= sizeof pair_buf || strchr(sp + 1, ' '))
                return mv_error("%s: merge %d \"%s\" is not two tokens separated by one space", path, rank, m->valuestring);
            memcpy(pair_buf, m->valuestring, ll);
            pair_buf[ll] = '\0';
            left = pair_buf;
            right = sp + 1;
        } else if (cJSON_IsArray(m) && cJSON_GetArraySize(m) == 2 && cJSON_IsString(m->child) &&
                   cJSON_IsString(m->child->next)) {
            left = m->child->valuestring;
            right = m->child->next->valuestring;
        } else {
            return mv_error("%s: merge %d is %s, not \"a b\" or [\"a\", \"b\"]", path, rank, json_type_name(m));
        }
        int32_t a = vocab_map_get(map, left), b = vocab_map_get(map, right);
        size_t ll = strlen(left), rl = strlen(right);
        if (ll + rl >= sizeof buf) return mv_error("%s: merge %d is too long", path, rank);
        memcpy(buf, left, ll);
        memcpy(buf + ll, right, rl + 1);
        int32_t ab = vocab_map_get(map, buf);
        if (a < 0 || b < 0 || ab < 0)
            return mv_error("%s: merge %d (\"%s\" \"%s\"): \"%s\" is not in the vocab", path, rank, left, right,
                            a < 0 ? left : b < 0 ? right : buf);
        merge_insert(t, a, b, rank, ab);
    }
    return 0;
}

static int load_config(tokenizer_t *t, const char *dir) {
    char path[4096];
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    cJSON *cfg = parse_json_file(path);
    if (!cfg) return -1;
    int rc = 0;
    if (!cJSON_IsObject(cfg)) rc = mv_error("%s: not a JSON object", path);
    // eos_token is either "<|im_end|>" or {"content": "<|im_end|>", ...}.
    const cJSON *eos = cJSON_GetObjectItemCaseSensitive(cfg, "eos_token");
    const char *eos_s = cJSON_IsString(eos) ? eos->valuestring : json_str(eos, "content");
    t->eos_id = eos_s ? tokenizer_token_id(t, eos_s) : -1;
    if (!rc && eos_s && t->eos_id < 0) rc = mv_error("%s: eos_token \"%s\" is not an added token", path, eos_s);
    // chat.c renders Qwen3's template in C; recognise it by the two things
    // that set it apart (ChatML markers and the enable_thinking switch).
    const char *tmpl = json_str(cfg, "chat_template");
    t->qwen3_chat = tmpl && strstr(tmpl, "<|im_start|>") && strstr(tmpl, "enable_thinking") &&
                    strstr(tmpl, "reasoning_content");
    cJSON_Delete(cfg);
    return rc;
}

tokenizer_t *tokenizer_load(const char *dir) {
    char path[4096];
    if (snprintf(path, sizeof path, "%s/tokenizer.json", dir) >= (int)sizeof path) {
        mv_error("model directory name too long");
        return NULL;
    }
    cJSON *root = parse_json_file(path);
    if (!root) return NULL;
    tokenizer_t *t = calloc(1, sizeof *t);
    vocab_map_t map = {0};
    int16_t cp_to_byte[512];
    uint32_t byte_to_cp[256];
    byte_level_table(byte_to_cp);
    for (int i = 0; i < 512; i++) cp_to_byte[i] = -1;
    for (int b = 0; b < 256; b++) cp_to_byte[byte_to_cp[b]] = (int16_t)b;

    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    const char *type = json_str(model, "type"), *pattern = NULL;
    int rc = t ? 0 : mv_error("out of memory");
    if (!rc && !cJSON_IsObject(root)) rc = mv_error("%s: not a JSON object", path);
    if (!rc && (!type || strcmp(type, "BPE") != 0))
        rc = mv_error("%s: model.type must be \"BPE\" (found %s)", path, type ? type : json_type_name(model));
    if (!rc) rc = check_pipeline(root, path, &pattern);
    if (!rc && (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(model, "byte_fallback")) ||
                cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(model, "ignore_merges"))))
        rc = mv_error("%s: byte_fallback / ignore_merges are not implemented", path);
    if (!rc) rc = load_vocab(t, cJSON_GetObjectItemCaseSensitive(model, "vocab"),
                             cJSON_GetObjectItemCaseSensitive(root, "added_tokens"), &map, cp_to_byte, path);
    if (!rc) rc = load_merges(t, cJSON_GetObjectItemCaseSensitive(model, "merges"), &map, path);
    if (!rc) rc = compile_regex(t, pattern);
    if (!rc) {
        qsort(t->added, (size_t)t->n_added, sizeof *t->added, cmp_added_longest_first);
        t->cache = calloc(CACHE_SLOTS, sizeof *t->cache);
        if (!t->cache) rc = mv_error("out of memory");
    }
    if (!rc) rc = load_config(t, dir);
    vocab_map_free(&map);
    cJSON_Delete(root);
    if (rc) {
        tokenizer_free(t);
        return NULL;
    }
    return t;
}

void tokenizer_free(tokenizer_t *t) {
    if (!t) return;
    free(t->kind);
    free(t->text_off);
    free(t->text);
    free(t->merges);
    for (int i = 0; t->added && i < t->n_added; i++) free(t->added[i].content);
    free(t->added);
    pcre2_match_data_free(t->md);
    pcre2_match_context_free(t->mctx);
    pcre2_jit_stack_free(t->jit_stack);
    pcre2_code_free(t->re);
    free(t->cache);
    tok_bytes_free(&t->cache_keys);
    tok_ids_free(&t->cache_ids);
    free(t->sym_id);
    free(t->sym_prev);
    free(t->sym_next);
    free(t->heap);
    free(t);
}

int32_t tokenizer_n_ids(const tokenizer_t *t) { return t->n_ids; }
int32_t tokenizer_eos_id(const tokenizer_t *t) { return t->eos_id; }
int tokenizer_uses_jit(const tokenizer_t *t) { return t->jit; }
int tokenizer_has_qwen3_chat(const tokenizer_t *t) { return t->qwen3_chat; }
int tokenizer_is_special(const tokenizer_t *t, int32_t id) {
    return id >= 0 && id < t->n_ids && t->kind[id] == KIND_SPECIAL;
}

int32_t tokenizer_token_id(const tokenizer_t *t, const char *s) {
    for (int i = 0; i < t->n_added; i++)
        if (strcmp(t->added[i].content, s) == 0) return t->added[i].id;
    return -1;
}

// ---- BPE ----------------------------------------------------------------------------------

static void heap_push(uint64_t *h, size_t *n, uint64_t v) {
    size_t i = (*n)++;
    while (i > 0 && h[(i - 1) / 2] > v) {
        h[i] = h[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h[i] = v;
}

static uint64_t heap_pop(uint64_t *h, size_t *n) {
    uint64_t top = h[0], v = h[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && h[c + 1] < h[c]) c++;
        if (h[c] >= v) break;
        h[i] = h[c];
        i = c;
    }
    h[i] = v;
    return top;
}

static void push_pair(tokenizer_t *t, size_t *nh, int32_t pos) {
    int32_t nx = t->sym_next[pos];
    if (nx < 0) return;
    const merge_slot_t *m = merge_find(t, t->sym_id[pos], t->sym_id[nx]);
    if (m) heap_push(t->heap, nh, (uint64_t)(m->rank_plus1 - 1) << 32 | (uint32_t)pos);
}

// Byte-level BPE of one piece: start from one symbol per byte, then keep
// merging the adjacent pair with the lowest merge rank (the leftmost one on
// a tie) until no adjacent pair is in the merge table. A min-heap of
// candidate pairs makes this O(n log n); entries made stale by an earlier
// merge are recognised on pop and skipped. This is the order Hugging Face's
// BPE uses, so the ids are the same.
static int bpe_word(tokenizer_t *t, const unsigned char *s, size_t n, tok_ids_t *out) {
    if (n > t->scratch_cap) {
        size_t c = n < 64 ? 64 : n * 2;
        int32_t *a = realloc(t->sym_id, c * sizeof(int32_t));
        if (a) t->sym_id = a;
        int32_t *b = realloc(t->sym_prev, c * sizeof(int32_t));
        if (b) t->sym_prev = b;
        int32_t *d = realloc(t->sym_next, c * sizeof(int32_t));
        if (d) t->sym_next = d;
        uint64_t *h = realloc(t->heap, 3 * c * sizeof(uint64_t));
        if (h) t->heap = h;
        if (!a || !b || !d || !h) return mv_error("out of memory for a %zu-byte word", n);
        t->scratch_cap = c;
    }
    int32_t len = (int32_t)n;
    for (int32_t i = 0; i < len; i++) {
        t->sym_id[i] = t->byte_id[s[i]];
        t->sym_prev[i] = i - 1;
        t->sym_next[i] = i + 1 < len ? i + 1 : -1;
    }
    size_t nh = 0;
    for (int32_t i = 0; i + 1 < len; i++) push_pair(t, &nh, i);
    while (nh) {
        uint64_t top = heap_pop(t->heap, &nh);
        int32_t pos = (int32_t)(uint32_t)top, rank = (int32_t)(top >> 32);
        int32_t nx = t->sym_next[pos];
        if (t->sym_id[pos] < 0 || nx < 0) continue;  // merged away, or now last
        const merge_slot_t *m = merge_find(t, t->sym_id[pos], t->sym_id[nx]);
        if (!m || m->rank_plus1 - 1 != rank) continue;  // this pair changed since it was pushed
        t->sym_id[pos] = m->merged;
        t->sym_id[nx] = -1;
        t->sym_next[pos] = t->sym_next[nx];
        if (t->sym_next[nx] >= 0) t->sym_prev[t->sym_next[nx]] = pos;
        if (t->sym_prev[pos] >= 0) push_pair(t, &nh, t->sym_prev[pos]);
        push_pair(t, &nh, pos);
    }
    for (int32_t i = 0; i >= 0; i = t->sym_next[i])
        if (tok_ids_push(out, t->sym_id[i])) return -1;
    return 0;
}

static int encode_piece(tokenizer_t *t, const char *piece, size_t n, tok_ids_t *out) {
    if (n == 0) return 0;
    if (n > CACHE_MAX_WORD) return bpe_word(t, (const unsigned char *)piece, n, out);
    uint64_t h = XXH3_64bits(piece, n);
    size_t mask = CACHE_SLOTS - 1, i = (size_t)h & mask;
    for (; t->cache[i].key_len; i = (i + 1) & mask) {
        const cache_slot_t *c = &t->cache[i];
        if (c->hash == h && c->key_len == n && memcmp(t->cache_keys.data + c->key_off, piece, n) == 0) {
            for (uint32_t k = 0; k < c->n_ids; k++)
                if (tok_ids_push(out, t->cache_ids.data[c->ids_off + k])) return -1;
            return 0;
        }
    }
    size_t first = out->len;
    if (bpe_word(t, (const unsigned char *)piece, n, out)) return -1;
    if (t->cache_used >= CACHE_SLOTS / 2) {  // full: start over (see cache_slot_t)
        memset(t->cache, 0, CACHE_SLOTS * sizeof *t->cache);
        t->cache_used = 0;
        t->cache_keys.len = 0;
        t->cache_ids.len = 0;
        for (i = (size_t)h & mask; t->cache[i].key_len; i = (i + 1) & mask) {}
    }
    cache_slot_t c = {h, (uint32_t)t->cache_keys.len, (uint32_t)n, (uint32_t)t->cache_ids.len,
                      (uint32_t)(out->len - first)};
    if (tok_bytes_append(&t->cache_keys, piece, n)) return -1;
    for (size_t k = first; k < out->len; k++)
        if (tok_ids_push(&t->cache_ids, out->data[k])) return -1;
    t->cache[i] = c;
    t->cache_used++;
    return 0;
}

// ---- encode -----------------------------------------------------------------------------

// Cut text (no added tokens in it) into pieces with the pre-tokenizer regex
// and BPE each piece. "Isolated": every match is a piece, and so is any text
// between matches (Qwen's pattern leaves none, but others may).
static int encode_segment(tokenizer_t *t, const char *s, size_t n, tok_ids_t *out) {
    size_t pos = 0;
    while (pos < n) {
        int rc = t->jit ? pcre2_jit_match(t->re, (PCRE2_SPTR)s, n, pos, 0, t->md, t->mctx)
                        : pcre2_match(t->re, (PCRE2_SPTR)s, n, pos, PCRE2_NO_UTF_CHECK, t->md, t->mctx);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return mv_error("pre-tokenizer regex failed at byte %zu: %s", pos, (char *)msg);
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(t->md);
        size_t a = ov[0], b = ov[1];
        if (a > pos && encode_piece(t, s + pos, a - pos, out)) return -1;
        if (b == a) {  // an empty match: step over one character so we progress
            size_t step = 1;
            while (a + step < n && ((unsigned char)s[a + step] & 0xc0) == 0x80) step++;
            if (encode_piece(t, s + a, step, out)) return -1;
            b = a + step;
        } else if (encode_piece(t, s + a, b - a, out)) {
            return -1;
        }
        pos = b;
    }
    return pos < n ? encode_piece(t, s + pos, n - pos, out) : 0;
}

// NFC first, so that "e" + U+0301 and the precomposed "é" give the same ids.
// Pure ASCII is already in NFC, and most text is mostly ASCII, so we skip
// utf8proc for it.
static int normalize_and_encode(tokenizer_t *t, const char *s, size_t n, tok_ids_t *out) {
    size_t i = 0;
    while (i < n && (unsigned char)s[i] < 0x80) i++;
    if (i == n) return encode_segment(t, s, n, out);
    utf8proc_uint8_t *nfc = NULL;
    utf8proc_ssize_t m = utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, &nfc,
                                      UTF8PROC_STABLE | UTF8PROC_COMPOSE);
    if (m < 0) return mv_error("NFC normalisation failed: %s", utf8proc_errmsg(m));
    int rc = encode_segment(t, (const char *)nfc, (size_t)m, out);
    free(nfc);
    return rc;
}

// The longest added token that starts at s (n bytes left), or NULL.
static const added_token_t *added_at(const tokenizer_t *t, const char *s, size_t n) {
    if (!t->added_first[(unsigned char)s[0]]) return NULL;
    for (int i = 0; i < t->n_added; i++) {  // longest first
        const added_token_t *a = &t->added[i];
        if (a->len <= n && memcmp(a->content, s, a->len) == 0) return a;
    }
    return NULL;
}

int tokenizer_encode(tokenizer_t *t, const char *text, size_t len, tok_ids_t *out) {
    size_t bad = utf8_first_invalid(text, len);
    if (bad < len)
        return mv_error("text is not valid UTF-8: byte 0x%02x at byte offset %zu", (unsigned char)text[bad], bad);
    // Added tokens are found in the raw text first: "<|im_start|>" must be
    // one id, never BPE'd into "<", "|", "im", ... Text between them goes
    // through NFC, the regex and BPE.
    size_t start = 0;
    for (size_t i = 0; i < len; i++) {
        const added_token_t *a = added_at(t, text + i, len - i);
        if (!a) continue;
        if (i > start && normalize_and_encode(t, text + start, i - start, out)) return -1;
        if (tok_ids_push(out, a->id)) return -1;
        i += a->len - 1;
        start = i + 1;
    }
    return start < len ? normalize_and_encode(t, text + start, len - start, out) : 0;
}

// ---- decode -----------------------------------------------------------------------------

// The bytes of one id. An id the tokenizer does not know (past its last id,
// or a gap in its numbering) has none: a model's vocabulary is padded past
// the tokenizer's (Qwen3: 151,936 embedding rows, 151,669 ids), sampling can
// land on a padding row, and Hugging Face and vLLM decode such an id to no
// text. Only a negative id, which no model produces, is an error.
static int id_bytes(const tokenizer_t *t, int32_t id, int skip_special, const char **p, size_t *n) {
    if (id < 0) return mv_error("token id %d is negative", id);
    *p = t->text;
    *n = 0;
    if (id >= t->n_ids || t->kind[id] == KIND_NONE) return 0;
    int skip = skip_special && t->kind[id] == KIND_SPECIAL;
    *p = t->text + t->text_off[id];
    *n = skip ? 0 : t->text_off[id + 1] - t->text_off[id];
    return 0;
}

int tokenizer_token_bytes(const tokenizer_t *t, int32_t id, const char **p, size_t *n) {
    return id_bytes(t, id, 0, p, n);
}

int tokenizer_knows_id(const tokenizer_t *t, int32_t id) {
    return id >= 0 && id < t->n_ids && t->kind[id] != KIND_NONE;
}

int tokenizer_decode(const tokenizer_t *t, const int32_t *ids, size_t n, int skip_special, tok_bytes_t *out) {
    tok_bytes_t raw = {0};
    int rc = tok_bytes_append(&raw, "", 0), held;
    for (size_t i = 0; i < n && !rc; i++) {
        const char *p = NULL;
        size_t k = 0;
        rc = id_bytes(t, ids[i], skip_special, &p, &k) || tok_bytes_append(&raw, p, k);
    }
    if (!rc) rc = append_lossy(out, (const unsigned char *)raw.data, raw.len, 1, &held);
    if (!rc && !out->data) rc = tok_bytes_append(out, "", 0);
    tok_bytes_free(&raw);
    return rc ? -1 : 0;
}

void tok_stream_init(tok_stream_t *s, int skip_special) {
    *s = (tok_stream_t){.skip_special = skip_special};
}

int tok_stream_push(const tokenizer_t *t, tok_stream_t *s, int32_t id, tok_bytes_t *out) {
    const char *p = NULL;
    size_t k = 0;
    if (id_bytes(t, id, s->skip_special, &p, &k)) return -1;
    // The held bytes plus this token; a token is rarely long, so a small
    // stack buffer covers most, and the heap the rest.
    unsigned char small[64], *buf = k + 4 <= sizeof small ? small : malloc(k + 4);
    if (!buf) return mv_error("out of memory");
    memcpy(buf, s->held, (size_t)s->n_held);
    memcpy(buf + s->n_held, p, k);
    size_t n = (size_t)s->n_held + k;
    int held, rc = append_lossy(out, buf, n, 0, &held);
    if (rc == 0) {
        memcpy(s->held, buf + n - (size_t)held, (size_t)held);
        s->n_held = held;
        if (!out->data) rc = tok_bytes_append(out, "", 0);
    }
    if (buf != small) free(buf);
    return rc;
}

int tok_stream_flush(tok_stream_t *s, tok_bytes_t *out) {
    int held, rc = append_lossy(out, s->held, (size_t)s->n_held, 1, &held);
    s->n_held = 0;
    if (!rc && !out->data) rc = tok_bytes_append(out, "", 0);
    return rc;
}

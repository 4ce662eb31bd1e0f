/*
 * chapters/09-engine/model/mapped_file.c - read-only file mappings and JSON files
 * read through them (see mapped_file.h).
 */
#include "chapters/09-engine/model/mapped_file.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/check.h"

int mapped_file_open(const char *path, mapped_file_t *f) {
    *f = (mapped_file_t){0};
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return mv_error("%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        int err = errno;
        close(fd);
        return mv_error("%s: not a regular file%s%s", path, err ? ": " : "", err ? strerror(err) : "");
    }
    f->size = (size_t)st.st_size;
    // mmap refuses a length of 0, and an empty file has nothing to map.
    if (f->size > 0) {
        // MAP_PRIVATE + PROT_READ: nobody can write through the mapping, and
        // the pages stay shared with the page cache.
        void *p = mmap(NULL, f->size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            int err = errno;
            close(fd);
            return mv_error("%s: cannot mmap %zu bytes: %s", path, f->size, strerror(err));
        }
        f->data = p;
    }
    close(fd);  // the mapping keeps the file alive on its own
    f->path = strdup(path);
    if (!f->path) {
        mapped_file_close(f);
        return mv_error("%s: out of memory", path);
    }
    return 0;
}

void mapped_file_close(mapped_file_t *f) {
    if (f->data) munmap((void *)f->data, f->size);
    free(f->path);
    *f = (mapped_file_t){0};
}

// ---- strict JSON -----------------------------------------------------------------------------

// Whether the escape \u at s[i] (s[i] == 'u') gives cJSON a NUL: \u0000,
// or a \u not followed by four hex digits (cJSON reads the others as 0).
static int u_escape_is_nul(const char *s, size_t n, size_t i) {
    if (i + 4 >= n) return 1;
    int zero = 1;
    for (size_t d = 1; d <= 4; d++) {
        if (!isxdigit((unsigned char)s[i + d])) return 1;
        zero &= s[i + d] == '0';
    }
    return zero;
}

// The index (in document order, from 0) of the first string of text[0..n)
// that holds a NUL, as a raw 0x00 byte (escaped or not), as the escape
// \u0000, or as a \u escape without four hex digits, which cJSON turns into
// one; -1 if none. *raw_at gets the offset of a raw 0x00 byte found outside
// any string (cJSON skips it as if it were a space), else stays SIZE_MAX.
// Lexing JSON strings needs no parser: outside a string '"' opens one;
// inside, '\\' escapes the next byte and '"' closes it.
static long first_nul_string(const char *s, size_t n, size_t *raw_at) {
    long k = -1;
    for (size_t i = 0; i < n; i++) {
        if (s[i] == '\0' && *raw_at == SIZE_MAX) *raw_at = i;
        if (s[i] != '"') continue;
        k++;
        for (i++; i < n && s[i] != '"'; i++) {
            if (s[i] == '\0') return k;
            if (s[i] == '\\' && i + 1 < n) {
                i++;
                if (s[i] == '\0' || (s[i] == 'u' && u_escape_is_nul(s, n, i))) return k;
            }
        }
    }
    return -1;
}

// The place of a value inside the document, for messages: messages[0].content.
typedef struct {
    char buf[256];
    size_t len;
} json_path_t;

static size_t path_push_key(json_path_t *p, const char *key) {
    size_t old = p->len;
    int n = snprintf(p->buf + p->len, sizeof p->buf - p->len, "%s%.60s", p->len ? "." : "", key);
    if (n > 0) p->len = p->len + (size_t)n < sizeof p->buf ? p->len + (size_t)n : sizeof p->buf - 1;
    return old;
}

static size_t path_push_index(json_path_t *p, int i) {
    size_t old = p->len;
    int n = snprintf(p->buf + p->len, sizeof p->buf - p->len, "[%d]", i);
    if (n > 0) p->len = p->len + (size_t)n < sizeof p->buf ? p->len + (size_t)n : sizeof p->buf - 1;
    return old;
}

static void path_pop(json_path_t *p, size_t old) {
    p->len = old;
    p->buf[old] = '\0';
}

static const char *path_or_top(const json_path_t *p) { return p->len ? p->buf : "the top-level value"; }

// Walk v in document order counting its strings (an object member's key,
// then its value) until string number `target`; report it by its path.
static int find_nul(const cJSON *v, long target, long *k, json_path_t *p) {
    if (cJSON_IsString(v) && (*k)++ == target)
        return mv_error("%s holds a NUL character (\\u0000): a string with one is refused, not cut short there",
                        path_or_top(p));
    if (!cJSON_IsArray(v) && !cJSON_IsObject(v)) return 0;
    int i = 0;
    for (const cJSON *c = v->child; c; c = c->next, i++) {
        size_t old;
        if (cJSON_IsObject(v)) {
            if ((*k)++ == target)
                return mv_error("a key %s%s holds a NUL character (\\u0000): a key with one is refused",
                                p->len ? "inside " : "of ", path_or_top(p));
            old = path_push_key(p, c->string);
        } else {
            old = path_push_index(p, i);
        }
        int rc = find_nul(c, target, k, p);
        path_pop(p, old);
        if (rc) return rc;
    }
    return 0;
}

static int cmp_key(const void *a, const void *b) {
    return strcmp((*(const cJSON *const *)a)->string, (*(const cJSON *const *)b)->string);
}

// The first key that appears twice in one object of v. Small objects are
// compared pair by pair; large ones (tokenizer.json's vocabulary: 151,643
// keys) sorted first, so the check stays O(n log n).
static int find_duplicate(const cJSON *v, json_path_t *p) {
    if (!cJSON_IsArray(v) && !cJSON_IsObject(v)) return 0;
    if (cJSON_IsObject(v)) {
        size_t n = 0;
        for (const cJSON *c = v->child; c; c = c->next) n++;
        const cJSON *dup = NULL;
        if (n <= 32) {
            for (const cJSON *a = v->child; a && !dup; a = a->next)
                for (const cJSON *b = a->next; b && !dup; b = b->next)
                    if (strcmp(a->string, b->string) == 0) dup = a;
        } else {
            const cJSON **keys = malloc(n * sizeof *keys);
            if (!keys) return mv_error("out of memory checking %zu keys", n);
            size_t i = 0;
            for (const cJSON *c = v->child; c; c = c->next) keys[i++] = c;
            qsort(keys, n, sizeof *keys, cmp_key);
            for (i = 1; i < n && !dup; i++)
                if (strcmp(keys[i - 1]->string, keys[i]->string) == 0) dup = keys[i];
            free(keys);
        }
        if (dup)
            return mv_error("key \"%.60s\" appears twice (in %s): duplicate keys are refused, as neither value "
                            "can be trusted",
                            dup->string, p->len ? p->buf : "the top-level object");
    }
    int i = 0;
    for (const cJSON *c = v->child; c; c = c->next, i++) {
        size_t old = cJSON_IsObject(v) ? path_push_key(p, c->string) : path_push_index(p, i);
        int rc = find_duplicate(c, p);
        path_pop(p, old);
        if (rc) return rc;
    }
    return 0;
}

int json_check_strict(const cJSON *root, const char *text, size_t len) {
    size_t raw_at = SIZE_MAX;
    long target = first_nul_string(text, len, &raw_at);
    json_path_t p = {{0}, 0};
    long k = 0;
    if (target >= 0) {
        if (find_nul(root, target, &k, &p)) return -1;
        // Not reached for a tree parsed from text; kept so a mismatch still fails.
        return mv_error("a string holds a NUL character (\\u0000)");
    }
    if (raw_at != SIZE_MAX) return mv_error("a NUL byte (0x00) at byte %zu", raw_at);
    return find_duplicate(root, &p);
}

// ---- JSON files --------------------------------------------------------------------------------

cJSON *json_load_file(const char *path) {
    mapped_file_t f;
    if (mapped_file_open(path, &f)) return NULL;
    const char *text = (const char *)f.data, *end = NULL;
    // Length-bounded parse: the mapping has no terminating NUL. The last
    // argument 0 lets trailing bytes through; they are checked below.
    cJSON *root = f.size ? cJSON_ParseWithLengthOpts(text, f.size, &end, 0) : NULL;
    if (root) {
        size_t at = (size_t)(end - text);
        while (at < f.size && strchr(" \t\r\n", text[at]) && text[at]) at++;
        if (at < f.size) {
            cJSON_Delete(root);
            root = NULL;
            mv_error("%s: not valid JSON: unexpected bytes after the value at byte %zu", path, at);
        } else if (json_check_strict(root, text, f.size)) {
            cJSON_Delete(root);
            root = NULL;
            mv_error_prefix("%s", path);
        }
    } else {
        // cJSON points at where parsing stopped: report it as a byte offset.
        const char *err = cJSON_GetErrorPtr();
        long off = err && f.size && err >= text && err <= text + f.size ? (long)(err - text) : 0;
        mv_error("%s: not valid JSON (stopped near byte %ld; empty or truncated file?)", path, off);
    }
    mapped_file_close(&f);
    return root;
}

int file_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* common/json_writer.c - a JSON tree and its writer (see json_writer.h). */
#include "common/json_writer.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/check.h"

typedef enum { J_OBJECT, J_ARRAY, J_STRING, J_NUMBER, J_BOOL } kind_t;

struct mv_json {
    kind_t kind;
    char *key;               // the member's name, inside an object
    char *str;               // J_STRING
    double num;              // J_NUMBER
    int b;                   // J_BOOL
    mv_json_t *first, *last; // J_OBJECT, J_ARRAY: the children in order
    mv_json_t *next;         // the next sibling
};

static void *xcalloc(size_t n) {
    void *p = calloc(1, n);
    if (!p) mv_die_at(__FILE__, __LINE__, "calloc", "out of host memory building JSON");
    return p;
}

static char *xstrdup(const char *s) {
    char *d = strdup(s ? s : "");
    if (!d) mv_die_at(__FILE__, __LINE__, "strdup", "out of host memory building JSON");
    return d;
}

static mv_json_t *node(kind_t k) {
    mv_json_t *v = xcalloc(sizeof *v);
    v->kind = k;
    return v;
}

mv_json_t *mvj_object(void) { return node(J_OBJECT); }
mv_json_t *mvj_array(void) { return node(J_ARRAY); }
mv_json_t *mvj_string(const char *s) {
    mv_json_t *v = node(J_STRING);
    v->str = xstrdup(s);
    return v;
}
mv_json_t *mvj_number(double x) {
    mv_json_t *v = node(J_NUMBER);
    v->num = x;
    return v;
}
mv_json_t *mvj_bool(int b) {
    mv_json_t *v = node(J_BOOL);
    v->b = b != 0;
    return v;
}

static void append(mv_json_t *parent, mv_json_t *item) {
    item->next = NULL;
    if (parent->last) parent->last->next = item;
    else parent->first = item;
    parent->last = item;
}

void mvj_set(mv_json_t *obj, const char *key, mv_json_t *item) {
    item->key = xstrdup(key);
    for (mv_json_t **p = &obj->first; *p; p = &(*p)->next) {
        if (strcmp((*p)->key, key)) continue;
        mv_json_t *old = *p;  // replace in place: the key keeps its position
        item->next = old->next;
        *p = item;
        if (obj->last == old) obj->last = item;
        old->next = NULL;
        mvj_free(old);
        return;
    }
    append(obj, item);
}

void mvj_set_string(mv_json_t *obj, const char *key, const char *s) { mvj_set(obj, key, mvj_string(s)); }
void mvj_set_number(mv_json_t *obj, const char *key, double x) { mvj_set(obj, key, mvj_number(x)); }
void mvj_set_bool(mv_json_t *obj, const char *key, int b) { mvj_set(obj, key, mvj_bool(b)); }

mv_json_t *mvj_set_object(mv_json_t *obj, const char *key) {
    mv_json_t *v = mvj_object();
    mvj_set(obj, key, v);
    return v;
}

mv_json_t *mvj_set_array(mv_json_t *obj, const char *key) {
    mv_json_t *v = mvj_array();
    mvj_set(obj, key, v);
    return v;
}

void mvj_push(mv_json_t *arr, mv_json_t *item) { append(arr, item); }

void mvj_free(mv_json_t *v) {
    while (v) {
        mv_json_t *next = v->next;
        mvj_free(v->first);
        free(v->key);
        free(v->str);
        free(v);
        v = next;
    }
}

// A JSON string: quotes, backslashes and control bytes escaped; other bytes
// (UTF-8 included) as they are.
static int write_string(const char *s, FILE *f) {
    if (fputc('"', f) == EOF) return -1;
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        int rc;
        switch (*p) {
            case '"': rc = fputs("\\\"", f); break;
            case '\\': rc = fputs("\\\\", f); break;
            case '\n': rc = fputs("\\n", f); break;
            case '\r': rc = fputs("\\r", f); break;
            case '\t': rc = fputs("\\t", f); break;
            case '\b': rc = fputs("\\b", f); break;
            case '\f': rc = fputs("\\f", f); break;
            default: rc = *p < 0x20 ? fprintf(f, "\\u%04x", *p) : fputc(*p, f);
        }
        if (rc < 0) return -1;
    }
    return fputc('"', f) == EOF ? -1 : 0;
}

// The shortest of %.15g and %.17g that reads back as the same double
// (integers below 10^15 come out without a decimal point).
static int write_number(double x, FILE *f) {
    if (!isfinite(x)) return fputs("null", f) < 0 ? -1 : 0;
    char buf[32];
    snprintf(buf, sizeof buf, "%.15g", x);
    if (strtod(buf, NULL) != x) snprintf(buf, sizeof buf, "%.17g", x);
    return fputs(buf, f) < 0 ? -1 : 0;
}

static int write_value(const mv_json_t *v, FILE *f, int depth) {
    switch (v->kind) {
        case J_STRING: return write_string(v->str, f);
        case J_NUMBER: return write_number(v->num, f);
        case J_BOOL: return fputs(v->b ? "true" : "false", f) < 0 ? -1 : 0;
        case J_OBJECT:
        case J_ARRAY: break;
    }
    const int obj = v->kind == J_OBJECT;
    if (!v->first) return fputs(obj ? "{}" : "[]", f) < 0 ? -1 : 0;
    if (fputc(obj ? '{' : '[', f) == EOF) return -1;
    for (const mv_json_t *c = v->first; c; c = c->next) {
        if (fprintf(f, "%s\n%*s", c == v->first ? "" : ",", 2 * (depth + 1), "") < 0) return -1;
        if (obj && (write_string(c->key, f) || fputs(": ", f) < 0)) return -1;
        if (write_value(c, f, depth + 1)) return -1;
    }
    return fprintf(f, "\n%*s%c", 2 * depth, "", obj ? '}' : ']') < 0 ? -1 : 0;
}

int mvj_write(const mv_json_t *v, FILE *f) {
    if (write_value(v, f, 0) || fputc('\n', f) == EOF) return -1;
    return 0;
}

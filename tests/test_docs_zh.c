/*
 * tests/test_docs_zh.c - the Chinese edition (docs/zh/) lines up with the
 * English pages.
 *
 * Every English page has a Chinese counterpart: docs/NAME.md -> docs/zh/NAME.md
 * (docs/perf-notes.md, the lab's run-by-run history, is English only), and the
 * repository's README.md -> docs/zh/index.md. For each pair, outside fenced
 * code blocks, the two pages must have:
 *   - the same headings, by level and in order (#, ##, ###, ...);
 *   - the same number of fenced code blocks (``` or ~~~, indented ones too);
 *   - the same generated blocks (<!-- generated:NAME -->), by name and in
 *     order, which docs/results/generate.py fills in both editions.
 * A Chinese page may end with a section of its own (docs/zh/README.md's
 * glossary) after a line "<!-- zh-only -->": nothing after it is compared.
 * Each page also starts with the language switch: "English | [中文](...)" on
 * the English side, "[English](...) | 中文" on the Chinese side.
 *
 * A translation that drifts (a section added to one edition only, a code
 * block lost, a table block renamed) fails here with the first difference.
 *
 * Run: make test  (or build/tests/test_docs_zh from the repository root;
 * MV_DOCS_ROOT=DIR checks a copy of the tree instead)
 */
#include <criterion/criterion.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_ITEMS 512
#define MAX_PAGES 64

// What the check compares of one page, in order of appearance.
typedef struct {
    int n_headings;
    int heading_level[MAX_ITEMS];    // 1 for "#", 2 for "##"...
    int heading_line[MAX_ITEMS];     // 1-based line number
    char heading_text[MAX_ITEMS][96];
    int n_fences;                    // fenced code blocks
    int n_generated;
    char generated[MAX_ITEMS][64];   // "01-activation:env"...
    char first_line[256];
} page_shape;

static const char *root(void) {
    const char *r = getenv("MV_DOCS_ROOT");
    return (r && *r) ? r : ".";
}

// A truncating copy (heading texts and first lines are only quoted in messages).
static void copy_str(char *dst, size_t cap, const char *src) {
    size_t n = strlen(src) < cap - 1 ? strlen(src) : cap - 1;
    memcpy(dst, src, n);
    dst[n] = '\0';
}

// Read a page's shape; returns 0 when the file does not exist.
static int read_shape(const char *path, int stop_at_zh_only, page_shape *s) {
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    memset(s, 0, sizeof *s);
    char line[8192];
    int lineno = 0, in_fence = 0;
    while (fgets(line, sizeof line, f)) {
        lineno++;
        line[strcspn(line, "\r\n")] = '\0';
        if (lineno == 1) copy_str(s->first_line, sizeof s->first_line, line);
        const char *p = line;
        while (*p == ' ') p++;
        if (!strncmp(p, "```", 3) || !strncmp(p, "~~~", 3)) {
            if (!in_fence) s->n_fences++;
            in_fence = !in_fence;
            continue;
        }
        if (in_fence) continue;
        if (stop_at_zh_only && !strcmp(line, "<!-- zh-only -->")) break;
        if (line[0] == '#') {
            int level = 0;
            while (line[level] == '#') level++;
            if (level <= 6 && line[level] == ' ') {
                cr_assert_lt(s->n_headings, MAX_ITEMS, "%s: too many headings", path);
                s->heading_level[s->n_headings] = level;
                s->heading_line[s->n_headings] = lineno;
                copy_str(s->heading_text[s->n_headings], sizeof s->heading_text[0], line);
                s->n_headings++;
            }
        }
        if (!strncmp(line, "<!-- generated:", strlen("<!-- generated:"))) {
            const char *g = line + strlen("<!-- generated:");
            size_t n = strcspn(g, " ");  // "<!-- generated:NAME -->"
            cr_assert_lt(s->n_generated, MAX_ITEMS, "%s: too many generated blocks", path);
            snprintf(s->generated[s->n_generated], sizeof s->generated[0], "%.*s", (int)n, g);
            s->n_generated++;
        }
    }
    fclose(f);
    return 1;
}

// The English pages that have a Chinese counterpart, as (English, Chinese)
// paths relative to the root: README.md and docs/*.md but perf-notes.md.
static int english_pages(char en[][128], char zh[][128]) {
    int n = 0;
    snprintf(en[n], 128, "README.md");
    snprintf(zh[n], 128, "docs/zh/index.md");
    n++;
    char dir[1024];
    snprintf(dir, sizeof dir, "%.900s/docs", root());
    DIR *d = opendir(dir);
    cr_assert_not_null(d, "cannot open %s (run the test from the repository root, or set MV_DOCS_ROOT)", dir);
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t len = strlen(e->d_name);
        if (len < 4 || strcmp(e->d_name + len - 3, ".md") || !strcmp(e->d_name, "perf-notes.md")) continue;
        cr_assert_lt(n, MAX_PAGES, "too many pages in docs/");
        cr_assert_lt(len, 100, "page name too long: docs/%s", e->d_name);
        snprintf(en[n], 128, "docs/%.100s", e->d_name);
        snprintf(zh[n], 128, "docs/zh/%.100s", e->d_name);
        n++;
    }
    closedir(d);
    return n;
}

static void path_of(char *out, size_t cap, const char *rel) { snprintf(out, cap, "%.900s/%.200s", root(), rel); }

static page_shape en_shape, zh_shape;

Test(docs_zh, every_english_page_has_a_chinese_page) {
    static char en[MAX_PAGES][128], zh[MAX_PAGES][128];
    int n = english_pages(en, zh), missing = 0;
    for (int i = 0; i < n; i++) {
        char p[1200];
        path_of(p, sizeof p, zh[i]);
        FILE *f = fopen(p, "r");
        if (f) {
            fclose(f);
            continue;
        }
        cr_log_error("%s has no Chinese edition: %s is missing", en[i], zh[i]);
        missing++;
    }
    cr_expect_eq(missing, 0, "%d English page(s) without a Chinese counterpart in docs/zh/", missing);
}

Test(docs_zh, every_chinese_page_has_an_english_page) {
    static char en[MAX_PAGES][128], zh[MAX_PAGES][128];
    int n = english_pages(en, zh);
    char dir[1024];
    snprintf(dir, sizeof dir, "%.900s/docs/zh", root());
    DIR *d = opendir(dir);
    cr_assert_not_null(d, "cannot open %s: the Chinese edition is missing", dir);
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t len = strlen(e->d_name);
        if (len < 4 || strcmp(e->d_name + len - 3, ".md")) continue;
        char rel[300];
        snprintf(rel, sizeof rel, "docs/zh/%s", e->d_name);
        int found = 0;
        for (int i = 0; i < n && !found; i++) found = !strcmp(zh[i], rel);
        cr_expect(found, "%s has no English page (docs/%s, or README.md for index.md)", rel, e->d_name);
    }
    closedir(d);
}

// Compare one pair; every difference is reported, the first heading
// mismatch with both lines.
static int compare_pair(const char *en_rel, const char *zh_rel) {
    char ep[1200], zp[1200];
    path_of(ep, sizeof ep, en_rel);
    path_of(zp, sizeof zp, zh_rel);
    if (!read_shape(zp, 1, &zh_shape)) return 0;  // reported by every_english_page_has_a_chinese_page
    cr_assert(read_shape(ep, 0, &en_shape), "cannot read %s", ep);
    int bad = 0;
    int n = en_shape.n_headings < zh_shape.n_headings ? en_shape.n_headings : zh_shape.n_headings;
    for (int i = 0; i < n; i++) {
        if (en_shape.heading_level[i] != zh_shape.heading_level[i]) {
            cr_log_error("%s:%d and %s:%d: heading %d differs in level: \"%s\" against \"%s\"", en_rel,
                         en_shape.heading_line[i], zh_rel, zh_shape.heading_line[i], i + 1,
                         en_shape.heading_text[i], zh_shape.heading_text[i]);
            bad++;
            break;
        }
    }
    if (en_shape.n_headings != zh_shape.n_headings) {
        cr_log_error("%s has %d headings, %s has %d (last English: \"%s\", last Chinese: \"%s\")", en_rel,
                     en_shape.n_headings, zh_rel, zh_shape.n_headings,
                     en_shape.n_headings ? en_shape.heading_text[en_shape.n_headings - 1] : "",
                     zh_shape.n_headings ? zh_shape.heading_text[zh_shape.n_headings - 1] : "");
        bad++;
    }
    if (en_shape.n_fences != zh_shape.n_fences) {
        cr_log_error("%s has %d fenced code blocks, %s has %d", en_rel, en_shape.n_fences, zh_rel, zh_shape.n_fences);
        bad++;
    }
    int same_generated = en_shape.n_generated == zh_shape.n_generated;
    for (int i = 0; same_generated && i < en_shape.n_generated; i++)
        same_generated = !strcmp(en_shape.generated[i], zh_shape.generated[i]);
    if (!same_generated) {
        char el[2048] = "", zl[2048] = "";
        for (int i = 0; i < en_shape.n_generated; i++)
            snprintf(el + strlen(el), sizeof el - strlen(el), " %s", en_shape.generated[i]);
        for (int i = 0; i < zh_shape.n_generated; i++)
            snprintf(zl + strlen(zl), sizeof zl - strlen(zl), " %s", zh_shape.generated[i]);
        cr_log_error("generated blocks differ: %s has [%s ], %s has [%s ]", en_rel, el, zh_rel, zl);
        bad++;
    }
    return bad;
}

Test(docs_zh, headings_code_blocks_and_generated_blocks_line_up) {
    static char en[MAX_PAGES][128], zh[MAX_PAGES][128];
    int n = english_pages(en, zh), bad = 0;
    for (int i = 0; i < n; i++) bad += compare_pair(en[i], zh[i]);
    cr_expect_eq(bad, 0, "%d difference(s) between the English and Chinese pages (see above)", bad);
}

// "zh/NAME.md" from "docs/NAME.md" (what an English page links to), and
// "../NAME.md" or "../../README.md" (what a Chinese page links to).
Test(docs_zh, every_page_starts_with_the_language_switch) {
    static char en[MAX_PAGES][128], zh[MAX_PAGES][128];
    int n = english_pages(en, zh), bad = 0;
    for (int i = 0; i < n; i++) {
        char ep[1200], zp[1200], want_en[512], want_zh[512];
        path_of(ep, sizeof ep, en[i]);
        path_of(zp, sizeof zp, zh[i]);
        const char *name = strrchr(en[i], '/') ? strrchr(en[i], '/') + 1 : en[i];
        if (!strcmp(en[i], "README.md")) {
            snprintf(want_en, sizeof want_en, "English | [中文](docs/zh/index.md)");
            snprintf(want_zh, sizeof want_zh, "[English](../../README.md) | 中文");
        } else {
            snprintf(want_en, sizeof want_en, "English | [中文](zh/%.120s)", name);
            snprintf(want_zh, sizeof want_zh, "[English](../%.120s) | 中文", name);
        }
        if (read_shape(ep, 0, &en_shape) && strcmp(en_shape.first_line, want_en)) {
            cr_log_error("%s: the first line should be the language switch \"%s\" (it is \"%s\")", en[i], want_en,
                         en_shape.first_line);
            bad++;
        }
        if (read_shape(zp, 1, &zh_shape) && strcmp(zh_shape.first_line, want_zh)) {
            cr_log_error("%s: the first line should be the language switch \"%s\" (it is \"%s\")", zh[i], want_zh,
                         zh_shape.first_line);
            bad++;
        }
    }
    cr_expect_eq(bad, 0, "%d page(s) without the language switch on their first line", bad);
}

/*
 * chapters/09-engine/cli.c - option parsing and output helpers for `minivllm`
 * (see cli.h). Options are long only ("--model DIR" or "--model=DIR") so that
 * every error can name exactly the argument that was wrong.
 */
#include "chapters/09-engine/cli.h"

#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "common/check.h"

int cli_error(const char *cmd, int status, const char *fmt, ...) {
    fflush(stdout);
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "minivllm %s: ", cmd);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    return status;
}

static void print_usage(const char *usage, const cli_opt_t *opts, int n) {
    printf("%s\n\nOptions:\n", usage);
    for (int i = 0; i < n; i++) {
        char left[64];
        snprintf(left, sizeof left, "%s%s%s", opts[i].name, opts[i].metavar ? " " : "",
                 opts[i].metavar ? opts[i].metavar : "");
        printf("  %-22s %s\n", left, opts[i].help);
    }
    printf("  %-22s %s\n", "--help", "show this help");
}

int cli_parse(const char *cmd, const char *usage, const cli_opt_t *opts, int n, int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) {
            print_usage(usage, opts, n);
            return CLI_HELP;
        }
        const char *eq = strchr(arg, '=');
        size_t name_len = eq ? (size_t)(eq - arg) : strlen(arg);
        const cli_opt_t *o = NULL;
        for (int k = 0; k < n && !o; k++)
            if (strlen(opts[k].name) == name_len && strncmp(opts[k].name, arg, name_len) == 0) o = &opts[k];
        if (!o)
            return cli_error(cmd, CLI_USAGE, "unknown %s '%s' (see minivllm %s --help)",
                             arg[0] == '-' ? "option" : "argument", arg, cmd);
        if (!o->metavar) {
            if (eq) return cli_error(cmd, CLI_USAGE, "option %s takes no value", o->name);
            *o->flag = 1;
            continue;
        }
        if (eq) {
            *o->value = eq + 1;
        } else {
            if (i + 1 >= argc) return cli_error(cmd, CLI_USAGE, "option %s needs a value (%s)", o->name, o->metavar);
            *o->value = argv[++i];
        }
    }
    return CLI_OK;
}

void cli_print_ids(FILE *f, const int32_t *ids, size_t n) {
    fputc('[', f);
    for (size_t i = 0; i < n; i++) fprintf(f, i ? ", %d" : "%d", ids[i]);
    fputs("]\n", f);
}

// JSON allows raw UTF-8 in strings; only '"', '\\' and control characters
// must be escaped. NULs are written as \u0000, so no byte is lost.
void cli_print_json_string(FILE *f, const char *s, size_t n) {
    fputc('"', f);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"') fputs("\\\"", f);
        else if (c == '\\') fputs("\\\\", f);
        else if (c == '\n') fputs("\\n", f);
        else if (c == '\r') fputs("\\r", f);
        else if (c == '\t') fputs("\\t", f);
        else if (c < 0x20 || c == 0x7f) fprintf(f, "\\u%04x", c);
        else fputc(c, f);
    }
    fputs("\"\n", f);
}

int cli_for_each_line(const char *path, cli_line_fn fn, void *ctx) {
    FILE *f = strcmp(path, "-") == 0 ? stdin : fopen(path, "r");
    if (!f) return mv_error("cannot open %s: %s", path, strerror(errno));
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    long line_no = 0;
    int rc = 0;
    while (!rc && (n = getline(&line, &cap, f)) >= 0) {
        line_no++;
        while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r')) line[--n] = '\0';
        rc = fn(line, (size_t)n, line_no, ctx);
    }
    free(line);
    if (f != stdin) fclose(f);
    return rc;
}

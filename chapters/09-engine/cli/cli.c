/*
 * chapters/09-engine/cli.c - option parsing and output helpers for `minivllm`
 * (see cli.h). Options are long only ("--model DIR" or "--model=DIR") so that
 * every error can name exactly the argument that was wrong.
 */
#include "chapters/09-engine/cli/cli.h"

#include <errno.h>
#include <math.h>
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

static int bad_value(const char *cmd, const char *opt, const char *v, const char *what) {
    return cli_error(cmd, CLI_USAGE, "%s '%s' is not %s", opt, v, what);
}

int cli_parse_long(const char *cmd, const char *opt, const char *v, long lo, long hi, long *out) {
    if (!v) return CLI_OK;
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (!*v || *end || errno || x < lo || x > hi) {
        char what[96];
        snprintf(what, sizeof what, "an integer in [%ld, %ld]", lo, hi);
        return bad_value(cmd, opt, v, what);
    }
    *out = x;
    return CLI_OK;
}

int cli_parse_float(const char *cmd, const char *opt, const char *v, double lo, double hi, int lo_open, float *out) {
    if (!v) return CLI_OK;
    char *end;
    double x = strtod(v, &end);
    if (!*v || *end || !isfinite(x) || x > hi || x < lo || (lo_open && x == lo)) {
        char what[96];
        snprintf(what, sizeof what, "a number in %s%g, %g]", lo_open ? "(" : "[", lo, hi);
        return bad_value(cmd, opt, v, what);
    }
    *out = (float)x;
    return CLI_OK;
}

int cli_engine_opts(cli_engine_args_t *a, cli_opt_t *opts) {
    const cli_opt_t o[CLI_ENGINE_N_OPTS] = {
        {"--device", "DEV", "cuda or cpu (default: cuda when a CUDA GPU is present, else cpu)", &a->device, NULL},
        {"--max-model-len", "N", "prompt + generated tokens (default min(max_position_embeddings, 4096))",
         &a->max_model_len, NULL},
        {"--max-num-seqs", "N", "sequences per step (default: cpu 16, cuda 256)", &a->max_num_seqs, NULL},
        {"--max-num-batched-tokens", "N", "tokens per step; long prompts prefill in chunks (default: cpu "
                                          "max(max-model-len, 512) up to 8192, cuda 8192)", &a->max_batched, NULL},
        {"--block-size", "N", "tokens per KV-cache block (default 16)", &a->block_size, NULL},
        {"--num-blocks", "N", "KV-cache blocks (default: all sequences full, within --kv-cache-gib)", &a->num_blocks,
         NULL},
        {"--kv-cache-gib", "G", "KV-cache memory when --num-blocks is not given (cpu default 2; cuda default: "
                                "from --gpu-memory-utilization)", &a->kv_gib, NULL},
        {"--gpu-memory-utilization", "F", "cuda: share of GPU memory for weights, scratch and KV cache (default 0.9)",
         &a->gpu_util, NULL},
        {"--threads", "N", "CPU threads, 0 = one per CPU (default)", &a->threads, NULL},
        {"--no-prefix-caching", NULL, "do not reuse the KV blocks of shared prompt prefixes", NULL, &a->no_prefix},
        {"--enforce-eager", NULL, "cuda: no CUDA graphs; decode steps launch kernel by kernel", NULL,
         &a->enforce_eager},
    };
    memcpy(opts, o, sizeof o);
    return CLI_ENGINE_N_OPTS;
}

int cli_engine_config(const char *cmd, const cli_engine_args_t *a, engine_config_t *ec) {
    long v[6] = {0};
    if (cli_parse_long(cmd, "--max-model-len", a->max_model_len, 1, 1 << 24, &v[0]) ||
        cli_parse_long(cmd, "--max-num-seqs", a->max_num_seqs, 1, 1 << 16, &v[1]) ||
        cli_parse_long(cmd, "--max-num-batched-tokens", a->max_batched, 1, 1 << 24, &v[2]) ||
        cli_parse_long(cmd, "--block-size", a->block_size, 1, 1 << 16, &v[3]) ||
        cli_parse_long(cmd, "--num-blocks", a->num_blocks, 1, 1 << 24, &v[4]) ||
        cli_parse_long(cmd, "--threads", a->threads, 0, 4096, &v[5]))
        return CLI_USAGE;
    ec->max_model_len = (int)v[0];
    ec->max_num_seqs = (int)v[1];
    ec->max_num_batched_tokens = (int)v[2];
    ec->block_size = (int)v[3];
    ec->num_blocks = (int)v[4];
    ec->num_threads = (int)v[5];
    float gib = 0;
    if (cli_parse_float(cmd, "--kv-cache-gib", a->kv_gib, 0, 1 << 20, 1, &gib)) return CLI_USAGE;
    ec->kv_cache_bytes = (long long)((double)gib * (double)(1LL << 30));
    if (cli_parse_float(cmd, "--gpu-memory-utilization", a->gpu_util, 0, 1, 1, &ec->gpu_memory_utilization))
        return CLI_USAGE;
    ec->enable_prefix_caching = !a->no_prefix;
    ec->enforce_eager = a->enforce_eager;
    if (a->device && strcmp(a->device, "cpu") && strcmp(a->device, "cuda"))
        return bad_value(cmd, "--device", a->device, "cpu or cuda");
    if (!a->device) {
        ec->device = model_runner_default_device();
        return CLI_OK;
    }
    ec->device = strcmp(a->device, "cuda") == 0 ? RUNNER_DEVICE_CUDA : RUNNER_DEVICE_CPU;
    char why[256];
    if (!model_runner_device_available(ec->device, why, sizeof why))
        return cli_error(cmd, CLI_FAIL, "--device %s: %s (use --device cpu)", a->device, why);
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

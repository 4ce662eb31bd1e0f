/*
 * chapters/09-engine/cli.c - option parsing and output helpers for `minivllm`
 * (see cli.h). Options are long only ("--model DIR" or "--model=DIR") so that
 * every error can name exactly the argument that was wrong.
 */
#include "chapters/09-engine/cli/cli.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "chapters/09-engine/model/mapped_file.h"
#include "chapters/09-engine/model/qwen3_layout.h"
#include "chapters/09-engine/parallel/tp_comm.h"
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
        {"--no-async-scheduling", NULL, "cuda: schedule each step after the one before is done, instead of "
                                        "queueing the next decode step while one runs", NULL, &a->no_async},
        {"--tensor-parallel-size", "N", "ranks the model is split over, one process each (cuda: one GPU "
                                        "each, over NCCL): launch with `mpirun -np N` (default 1)", &a->tp_size,
         NULL},
        {"-tp", "N", "the same as --tensor-parallel-size", &a->tp_size, NULL},
    };
    memcpy(opts, o, sizeof o);
    return CLI_ENGINE_N_OPTS;
}

int cli_engine_config(const char *cmd, const cli_engine_args_t *a, engine_config_t *ec) {
    long v[7] = {0, 0, 0, 0, 0, 0, 1};
    if (cli_parse_long(cmd, "--tensor-parallel-size", a->tp_size, 1, 64, &v[6]) ||
        cli_parse_long(cmd, "--max-model-len", a->max_model_len, 1, 1 << 24, &v[0]) ||
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
    ec->tp_size = (int)v[6];
    float gib = 0;
    if (cli_parse_float(cmd, "--kv-cache-gib", a->kv_gib, 0, 1 << 20, 1, &gib)) return CLI_USAGE;
    ec->kv_cache_bytes = (long long)((double)gib * (double)(1LL << 30));
    if (cli_parse_float(cmd, "--gpu-memory-utilization", a->gpu_util, 0, 1, 1, &ec->gpu_memory_utilization))
        return CLI_USAGE;
    ec->enable_prefix_caching = !a->no_prefix;
    ec->enforce_eager = a->enforce_eager;
    ec->no_async_scheduling = a->no_async;
    if (a->device && strcmp(a->device, "cpu") && strcmp(a->device, "cuda"))
        return bad_value(cmd, "--device", a->device, "cpu or cuda");
    ec->device = !a->device ? model_runner_default_device()
                 : strcmp(a->device, "cuda") == 0 ? RUNNER_DEVICE_CUDA : RUNNER_DEVICE_CPU;
    char why[256];
    if (a->device && !model_runner_device_available(ec->device, why, sizeof why))
        return cli_error(cmd, CLI_FAIL, "--device %s: %s (use --device cpu)", a->device, why);
    // cuda carries the ranks' tensors over NCCL: a build without it runs one GPU only.
    if (ec->tp_size > 1 && ec->device == RUNNER_DEVICE_CUDA && !MV_HAVE_NCCL)
        return cli_error(cmd, CLI_USAGE, "--tensor-parallel-size %d: the cuda backend runs its ranks over NCCL, "
                                         "and this minivllm was built without it (nccl.h was not found at build "
                                         "time): use --device cpu, or rebuild with NCCL", ec->tp_size);
    return CLI_OK;
}

int cli_tp_follower(const char *cmd, const engine_config_t *ec, int *status) {
    *status = CLI_OK;
    // Rank 0 alone speaks for what every rank finds the same (one message is
    // enough), and fails; the others stop with status 0. Were they to fail
    // too, the first of them to exit would make mpirun abort the job, and
    // it could kill rank 0 before its message is out (seen in CI: the
    // refusal of -tp 4 ended with mpirun's notice alone). mpirun's status is
    // still rank 0's failure.
    const int quiet = tp_comm_launched_rank() != 0;
    if (ec->tp_size <= 1 && tp_comm_launched_size() > 1) {
        // N copies of the whole job, each writing the same outputs: surely not what was meant.
        *status = quiet ? CLI_OK
                        : cli_error(cmd, CLI_USAGE, "mpirun started %d ranks, and --tensor-parallel-size is 1: give "
                                                    "-tp %d to split the model over them",
                                    tp_comm_launched_size(), tp_comm_launched_size());
        return 1;
    }
    if (ec->tp_size <= 1) return 0;
    // Sizes tp does not divide are refused before MPI starts.
    qwen3_config_t m;
    qwen3_layout_t lo;
    tp_comm_t world;
    if (qwen3_config_load(ec->model_dir, &m) || qwen3_layout_init(&lo, &m, ec->tp_size, 0)) {
        *status = quiet ? CLI_OK
                        : cli_error(cmd, CLI_FAIL, "--tensor-parallel-size %d: %s", ec->tp_size, mv_last_error());
        return 1;
    }
    if (tp_comm_open(ec->tp_size, &world)) {
        *status = quiet ? CLI_FAIL : cli_error(cmd, CLI_FAIL, "%s", mv_last_error());
        return 1;
    }
    if (world.rank == 0) return 0;
    // A follower: rank 0 answers the signals (serve drains on SIGTERM, then
    // stops every rank), so mpirun's forwarded copies are not for us.
    signal(SIGINT, SIG_IGN);
    signal(SIGTERM, SIG_IGN);
    engine_config_t fc = *ec;
    fc.progress = 0;
    engine_t *e = NULL;
    if (engine_create(&fc, &e)) {
        // A failure every rank learned of (the load's agreement) is rank 0's
        // to report; one only this rank knows it says itself.
        *status = tp_comm_settled() ? CLI_FAIL
                                    : cli_error(cmd, CLI_FAIL, "tp rank %d: %s", world.rank, mv_last_error());
        return 1;
    }
    if (model_runner_follow(e->runner)) *status = cli_error(cmd, CLI_FAIL, "tp rank %d: %s", world.rank, mv_last_error());
    engine_free(e);
    return 1;
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
    errno = 0;
    while (!rc && (n = getline(&line, &cap, f)) >= 0) {
        line_no++;
        // getline counts NUL bytes in the length; every parser after it would stop at the first.
        const char *nul = memchr(line, '\0', (size_t)n);
        if (nul) {
            rc = mv_error("%s:%ld: a NUL byte at column %ld: a line holding NUL bytes is refused (is this a "
                          "text file?)",
                          path, line_no, (long)(nul - line) + 1);
            break;
        }
        while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r')) line[--n] = '\0';
        rc = fn(line, (size_t)n, line_no, ctx);
        errno = 0;
    }
    // getline returns -1 at the end of the file and on a read error alike.
    if (!rc && ferror(f))
        rc = mv_error("cannot read %s after line %ld: %s", path, line_no, strerror(errno ? errno : EIO));
    free(line);
    if (f != stdin) fclose(f);
    return rc;
}

cJSON *cli_parse_json_line(const char *line, size_t len) {
    const char *end = NULL;
    cJSON *j = cJSON_ParseWithLengthOpts(line, len, &end, 0);
    if (!j) {
        const char *at = cJSON_GetErrorPtr();
        long col = at && at >= line && at <= line + len ? (long)(at - line) + 1 : 0;
        mv_error("not valid JSON (stopped near column %ld)", col);
        return NULL;
    }
    size_t at = (size_t)(end - line);
    while (at < len && (line[at] == ' ' || line[at] == '\t')) at++;
    if (at < len) {
        cJSON_Delete(j);
        mv_error("not valid JSON: more after the value at column %zu (one JSON value a line)", at + 1);
        return NULL;
    }
    if (json_check_strict(j, line, len)) {
        cJSON_Delete(j);
        return NULL;
    }
    return j;
}

// ---- signals -------------------------------------------------------------------------------

volatile sig_atomic_t cli_stop_signal = 0;

static void on_stop_signal(int sig) { cli_stop_signal = sig; }

void cli_catch_stop_signals(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    // SA_RESTART: a write(2) under way when the signal lands goes on, so no
    // record is cut by the signal itself.
    sa.sa_flags = SA_RESTART;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGXFSZ, SIG_IGN);
}

int cli_stop_status(void) { return 128 + (int)cli_stop_signal; }

const char *cli_stop_signal_name(void) {
    return cli_stop_signal == SIGINT ? "SIGINT" : cli_stop_signal == SIGTERM ? "SIGTERM" : "a signal";
}

// ---- whole-record output -----------------------------------------------------------------------

int cli_out_open(cli_out_t *o, const char *path) {
    *o = (cli_out_t){.fd = -1, .path = path};
    if (strcmp(path, "-") == 0) {
        o->fd = STDOUT_FILENO;
        o->path = "standard output";
    } else {
        struct stat st;
        if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) return mv_error("cannot write %s: it is a directory", path);
        o->fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (o->fd < 0) return mv_error("cannot open %s: %s", path, strerror(errno));
    }
    // What is already there (standard output redirected to a file with >>) stays.
    struct stat st;
    o->seekable = fstat(o->fd, &st) == 0 && S_ISREG(st.st_mode);
    off_t at = o->seekable ? lseek(o->fd, 0, SEEK_CUR) : 0;
    o->good = at > 0 ? at : 0;
    return 0;
}

int cli_out_write(cli_out_t *o, const char *s, size_t n) {
    size_t done = 0;
    while (done < n) {
        ssize_t w = write(o->fd, s + done, n - done);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            int err = w < 0 ? errno : ENOSPC;
            int cut = done > 0 && o->seekable && ftruncate(o->fd, o->good) == 0 &&
                      lseek(o->fd, o->good, SEEK_SET) == o->good;
            if (done == 0 || cut)
                return mv_error("cannot write %s: %s (it holds the %ld whole record%s written before, nothing cut)",
                                o->path, strerror(err), o->records, o->records == 1 ? "" : "s");
            return mv_error("cannot write %s: %s (after %ld whole record%s, part of one more got through)", o->path,
                            strerror(err), o->records, o->records == 1 ? "" : "s");
        }
        done += (size_t)w;
    }
    o->good += (off_t)n;
    o->records++;
    return 0;
}

int cli_out_close(cli_out_t *o) {
    int rc = 0;
    if (o->fd > STDERR_FILENO && close(o->fd)) rc = mv_error("cannot write %s: %s", o->path, strerror(errno));
    o->fd = -1;
    return rc;
}

// ---- whole files ----------------------------------------------------------------------------

static char *temp_name(const char *path) {
    size_t n = strlen(path) + 32;
    char *t = malloc(n);
    if (t) snprintf(t, n, "%s.tmp-%ld", path, (long)getpid());
    return t;
}

int cli_atomic_check(const char *path) {
    struct stat st;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) return mv_error("cannot write %s: it is a directory", path);
    char *tmp = temp_name(path);
    if (!tmp) return mv_error("out of memory");
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    int rc = fd < 0 ? mv_error("cannot open %s: %s (no new file could be made beside it)", path, strerror(errno)) : 0;
    if (fd >= 0) {
        close(fd);
        unlink(tmp);
    }
    free(tmp);
    return rc;
}

int cli_atomic_open(cli_atomic_t *a, const char *path) {
    *a = (cli_atomic_t){0};
    if (cli_atomic_check(path)) return -1;
    a->path = strdup(path);
    a->tmp = temp_name(path);
    if (!a->path || !a->tmp) {
        cli_atomic_abort(a);
        return mv_error("out of memory");
    }
    if (!(a->f = fopen(a->tmp, "wb"))) {
        int err = errno;
        cli_atomic_abort(a);
        return mv_error("cannot create %s: %s", path, strerror(err));
    }
    return 0;
}

int cli_atomic_commit(cli_atomic_t *a) {
    int ok = fflush(a->f) == 0 && !ferror(a->f) && fsync(fileno(a->f)) == 0;
    int err = errno;
    ok = fclose(a->f) == 0 && ok;
    a->f = NULL;
    if (ok && rename(a->tmp, a->path) != 0) ok = 0, err = errno;
    int rc = ok ? 0 : mv_error("cannot write %s: %s (nothing written there)", a->path, strerror(err ? err : EIO));
    if (!ok) unlink(a->tmp);
    free(a->path);
    free(a->tmp);
    *a = (cli_atomic_t){0};
    return rc;
}

void cli_atomic_abort(cli_atomic_t *a) {
    if (a->f) fclose(a->f);
    if (a->tmp) unlink(a->tmp);
    free(a->path);
    free(a->tmp);
    *a = (cli_atomic_t){0};
}

// ---- --model: a directory, or a Hugging Face repo id found in the local cache ----

// "ORG/NAME" as the Hub spells repo ids: one '/', letters, digits, '-', '_', '.'.
static int looks_like_repo_id(const char *m) {
    const char *slash = strchr(m, '/');
    if (!slash || slash == m || !slash[1] || strchr(slash + 1, '/') || m[0] == '.') return 0;
    for (const char *c = m; *c; c++)
        if (*c != '/' && !isalnum((unsigned char)*c) && *c != '-' && *c != '_' && *c != '.') return 0;
    return 1;
}

static int is_dir(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

// The Hub cache's root, as huggingface_hub finds it: HF_HUB_CACHE, else
// HF_HOME/hub, else ~/.cache/huggingface/hub.
static void hub_cache_dir(char *out, size_t cap) {
    const char *v = getenv("HF_HUB_CACHE"), *home = getenv("HF_HOME");
    if (v && *v) snprintf(out, cap, "%s", v);
    else if (home && *home) snprintf(out, cap, "%s/hub", home);
    else snprintf(out, cap, "%s/.cache/huggingface/hub", getenv("HOME") ? getenv("HOME") : "");
}

int cli_model_dir(const char *cmd, const char **model) {
    const char *m = *model;
    if (is_dir(m)) return CLI_OK;
    if (!looks_like_repo_id(m)) return cli_error(cmd, CLI_FAIL, "--model %s: no such directory", m);
    // models--ORG--NAME/refs/main names the snapshot that `hf download` left.
    static char dir[4096];
    char cache[2048], repo[512], ref[256] = "", path[4096];
    hub_cache_dir(cache, sizeof cache);
    snprintf(repo, sizeof repo, "models--%s", m);
    char *slash = strchr(repo, '/');
    memmove(slash + 2, slash + 1, strlen(slash + 1) + 1);  // ORG/NAME -> ORG--NAME
    slash[0] = slash[1] = '-';
    snprintf(path, sizeof path, "%s/%s/refs/main", cache, repo);
    FILE *f = fopen(path, "r");
    if (f) {
        if (!fgets(ref, sizeof ref, f)) ref[0] = '\0';
        fclose(f);
        ref[strcspn(ref, "\r\n")] = '\0';
    }
    if (ref[0] && !strchr(ref, '/') && strcmp(ref, "..")) {
        snprintf(dir, sizeof dir, "%s/%s/snapshots/%s", cache, repo, ref);
        if (is_dir(dir)) {
            fprintf(stderr, "minivllm %s: --model %s: the Hugging Face cache's copy, %s\n", cmd, m, dir);
            *model = dir;
            return CLI_OK;
        }
    }
    char name[256];
    snprintf(name, sizeof name, "%s", strchr(m, '/') + 1);
    return cli_error(cmd, CLI_FAIL,
                     "--model %s: no such directory, and not in the Hugging Face cache (%s). Download it with:\n"
                     "  hf download %s --local-dir models/%s\n"
                     "then pass --model models/%s (docs/getting-a-model.md)",
                     m, cache, m, name, name);
}

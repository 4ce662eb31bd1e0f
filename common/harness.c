/* common/harness.c - the chapter driver described in harness.h. */
#include "common/harness.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/check.h"

static void usage(const harness_t *h, FILE *f) {
    fprintf(f,
            "usage: %s [options]\n"
            "  %s\n\n"
            "%s\n\n"
            "options:\n"
            "  --json FILE      write every result (checks, tolerances, timings, GPU) to FILE\n"
            "  --seed N         seed for the random inputs (default 42)\n"
            "  --cpu            CPU half only, even when a GPU is present\n"
            "  --quick          fewer and smaller timing runs\n"
            "  --summary        one summary line instead of the full output\n"
            "  --require-speed  fail when a kernel misses its speed target\n"
            "  --checks-only    checks only: no ceilings, no timing (for compute-sanitizer)\n"
            "  --device N       CUDA device index (default 0)\n"
            "  --help           this text\n"
            "exit status: 0 all checks passed, 1 a check failed, 2 bad arguments\n",
            h->chapter, h->title,
            h->host_only ? "A host-only chapter: plain C with no GPU half; --cpu, --device and\n"
                           "--require-speed change nothing."
                         : "Checks the chapter's CUDA kernels against the CPU reference, then times them.\n"
                           "Without a usable GPU it checks the CPU reference on its own and says so.");
    if (h->extra_usage) fprintf(f, "options of this chapter:\n%s", h->extra_usage);
}

static void bad_arg(const harness_t *h, const char *fmt, const char *arg) {
    fprintf(stderr, "%s: ", h->chapter);
    fprintf(stderr, fmt, arg);
    fprintf(stderr, " (see --help)\n");
    exit(2);
}

static long long parse_int(const harness_t *h, const char *opt, const char *s, long long lo,
                           long long hi) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) {
        char msg[128];
        snprintf(msg, sizeof msg, "%s expects an integer in [%lld, %lld], got '%%s'", opt, lo, hi);
        bad_arg(h, msg, s);
    }
    return v;
}

static void iso_time(char *buf, size_t n) {
    time_t t = time(NULL);
    struct tm tm;
    gmtime_r(&t, &tm);
    strftime(buf, n, "%Y-%m-%dT%H:%M:%SZ", &tm);
}

static void begin(harness_t *h, const char *chapter, const char *title, int argc, char **argv,
                  int host_only, const char *extra_usage) {
    memset(h, 0, sizeof *h);
    h->host_only = host_only;
    h->extra_usage = extra_usage;
    h->chapter = chapter;
    h->title = title;
    h->seed = 42;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int has_next = i + 1 < argc;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(h, stdout);
            exit(0);
        } else if (!strcmp(a, "--json")) {
            if (!has_next) bad_arg(h, "%s needs a file name", a);
            h->json_path = argv[++i];
        } else if (!strcmp(a, "--seed")) {
            if (!has_next) bad_arg(h, "%s needs a number", a);
            h->seed = (uint64_t)parse_int(h, a, argv[++i], 0, (1LL << 62));
        } else if (!strcmp(a, "--device")) {
            if (!has_next) bad_arg(h, "%s needs a number", a);
            h->device = (int)parse_int(h, a, argv[++i], 0, 1023);
        } else if (!strcmp(a, "--cpu")) {
            h->cpu_only = 1;
        } else if (!strcmp(a, "--quick")) {
            h->quick = 1;
        } else if (!strcmp(a, "--summary")) {
            h->summary = 1;
        } else if (!strcmp(a, "--require-speed")) {
            h->require_speed = 1;
        } else if (!strcmp(a, "--checks-only")) {
            h->checks_only = 1;
        } else {
            bad_arg(h, "unknown argument '%s'", a);
        }
    }
    // The command line, as it was typed, goes into the JSON record.
    size_t used = 0;
    for (int i = 0; i < argc && used < sizeof h->command; i++)
        used += (size_t)snprintf(h->command + used, sizeof h->command - used, "%s%s", i ? " " : "",
                                 argv[i]);

    h->json = cJSON_CreateObject();
    cJSON_AddStringToObject(h->json, "chapter", chapter);
    cJSON_AddStringToObject(h->json, "title", title);
    cJSON_AddStringToObject(h->json, "command", h->command);
    cJSON_AddNumberToObject(h->json, "seed", (double)h->seed);
    char when[32];
    iso_time(when, sizeof when);
    cJSON_AddStringToObject(h->json, "date", when);
    cJSON_AddBoolToObject(h->json, "built_with_cuda", MV_HAVE_CUDA);
    h->checks = cJSON_AddArrayToObject(h->json, "checks");
    h->timings = cJSON_AddArrayToObject(h->json, "timings");

    if (!h->summary) printf("%s: %s\n", chapter, title);
    if (h->host_only) {
        snprintf(h->gpu.why_not, sizeof h->gpu.why_not, "host-only chapter");
    } else if (h->cpu_only) {
        snprintf(h->gpu.why_not, sizeof h->gpu.why_not, "--cpu was given");
    } else if (gpu_probe(&h->gpu, h->device) == 0) {
        h->use_gpu = 1;
    }
    cJSON *g = cJSON_AddObjectToObject(h->json, "gpu");
    cJSON_AddBoolToObject(g, "used", h->use_gpu);
    if (!h->use_gpu) {
        cJSON_AddStringToObject(g, "why_not", h->gpu.why_not);
        if (!h->summary && !h->host_only)
            printf("GPU half skipped: %s. Checking the CPU reference only.\n", h->gpu.why_not);
        return;
    }
    cJSON_AddStringToObject(g, "name", h->gpu.name);
    cJSON_AddNumberToObject(g, "device", h->gpu.device);
    cJSON_AddNumberToObject(g, "device_count", h->gpu.device_count);
    cJSON_AddNumberToObject(g, "sm_count", h->gpu.sm_count);
    char cc[16];
    snprintf(cc, sizeof cc, "%d.%d", h->gpu.cc_major, h->gpu.cc_minor);
    cJSON_AddStringToObject(g, "compute_capability", cc);
    cJSON_AddNumberToObject(g, "l2_bytes", (double)h->gpu.l2_bytes);
    cJSON_AddNumberToObject(g, "mem_bytes", (double)h->gpu.mem_bytes);
    cJSON_AddStringToObject(g, "driver", h->gpu.driver);
    cJSON_AddStringToObject(g, "runtime", h->gpu.runtime);
    h->do_timing = !h->checks_only;
    if (!h->do_timing) {
        if (!h->summary) printf("GPU: %s (%d SMs); --checks-only: no ceilings, no timing\n", h->gpu.name, h->gpu.sm_count);
        return;
    }
#if MV_HAVE_CUDA
    measure_ceilings(&h->ceil, h->quick);
    cJSON *c = cJSON_AddObjectToObject(h->json, "ceilings");
    cJSON_AddNumberToObject(c, "copy_gbs", h->ceil.copy_gbs);
    cJSON_AddNumberToObject(c, "copy_bytes", (double)h->ceil.copy_bytes);
    cJSON_AddNumberToObject(c, "gemm_tflops", h->ceil.gemm_tflops);
    cJSON_AddNumberToObject(c, "gemm_n", h->ceil.gemm_n);
    if (!h->summary)
        printf("GPU: %s (%d SMs, L2 %.0f MB), measured copy %.0f GB/s (read+write), bf16 GEMM %.0f "
               "TFLOP/s (%d^3)\n",
               h->gpu.name, h->gpu.sm_count, h->gpu.l2_bytes / 1e6, h->ceil.copy_gbs,
               h->ceil.gemm_tflops, h->ceil.gemm_n);
#endif
}

void harness_begin(harness_t *h, const char *chapter, const char *title, int argc, char **argv) {
    begin(h, chapter, title, argc, argv, 0, NULL);
}

void harness_begin_host(harness_t *h, const char *chapter, const char *title, int argc, char **argv,
                        const harness_extra_t *extra) {
    // The chapter's own options are taken out first; the common ones are
    // parsed as in every chapter. The record keeps the whole command line.
    char **rest = malloc((size_t)(argc + 1) * sizeof(char *));
    if (!rest) mv_die_at(__FILE__, __LINE__, "malloc", "out of host memory");
    int n = 0;
    for (int i = 0; i < argc; i++) {
        int used = i > 0 && extra && extra->parse ? extra->parse(extra->ctx, argc, argv, i) : 0;
        if (used > 0) i += used - 1;
        else rest[n++] = argv[i];
    }
    rest[n] = NULL;
    begin(h, chapter, title, n, rest, 1, extra ? extra->usage : NULL);
    free(rest);
    size_t len = 0;
    for (int i = 0; i < argc && len < sizeof h->command; i++)
        len += (size_t)snprintf(h->command + len, sizeof h->command - len, "%s%s", i ? " " : "", argv[i]);
    cJSON_ReplaceItemInObject(h->json, "command", cJSON_CreateString(h->command));
    cJSON_AddBoolToObject(h->json, "host_only", 1);
}

void harness_section(harness_t *h, const char *title) {
    if (!h->summary) printf("\n== %s\n", title);
}

static cJSON *tol_json(tolerance_t tol) {
    cJSON *t = cJSON_CreateObject();
    cJSON_AddNumberToObject(t, "atol", tol.atol);
    cJSON_AddNumberToObject(t, "rtol", tol.rtol);
    cJSON_AddNumberToObject(t, "max_nmse", tol.max_nmse);
    cJSON_AddStringToObject(t, "reason", tol.reason ? tol.reason : "");
    return t;
}

int harness_check(harness_t *h, const char *side, const char *case_name, const char *version,
                  const char *shape, compare_result_t r, tolerance_t tol) {
    h->n_checks++;
    if (!r.pass) h->n_failed++;
    cJSON *c = cJSON_CreateObject();
    cJSON_AddStringToObject(c, "side", side);
    cJSON_AddStringToObject(c, "case", case_name);
    cJSON_AddStringToObject(c, "version", version);
    cJSON_AddStringToObject(c, "shape", shape);
    cJSON_AddBoolToObject(c, "pass", r.pass);
    cJSON_AddNumberToObject(c, "n", (double)r.n);
    cJSON_AddNumberToObject(c, "n_bad", (double)r.n_bad);
    cJSON_AddNumberToObject(c, "n_nonfinite", (double)r.n_nonfinite);
    cJSON_AddNumberToObject(c, "n_unwritten", (double)r.n_unwritten);
    cJSON_AddNumberToObject(c, "max_abs", r.max_abs);
    cJSON_AddNumberToObject(c, "max_rel", r.max_rel);
    cJSON_AddNumberToObject(c, "nmse", r.nmse);
    cJSON_AddItemToObject(c, "tolerance", tol_json(tol));
    cJSON_AddItemToArray(h->checks, c);
    if (!h->summary || !r.pass)
        printf("  %s %-3s %-14s %-26s %-28s max_abs %.2e max_rel %.2e nmse %.2e\n",
               r.pass ? "PASS" : "FAIL", side, case_name, version, shape, r.max_abs, r.max_rel,
               r.nmse);
    return r.pass;
}

int harness_check_bool(harness_t *h, const char *side, const char *case_name, const char *what,
                       int pass, const char *detail) {
    h->n_checks++;
    if (!pass) h->n_failed++;
    cJSON *c = cJSON_CreateObject();
    cJSON_AddStringToObject(c, "side", side);
    cJSON_AddStringToObject(c, "case", case_name);
    cJSON_AddStringToObject(c, "version", what);
    cJSON_AddBoolToObject(c, "pass", pass);
    cJSON_AddStringToObject(c, "detail", detail ? detail : "");
    cJSON_AddItemToArray(h->checks, c);
    if (!h->summary || !pass)
        printf("  %s %-3s %-14s %-26s %s\n", pass ? "PASS" : "FAIL", side, case_name, what,
               detail ? detail : "");
    return pass;
}

void harness_timing(harness_t *h, const char *case_name, const char *version, const char *shape,
                    double ms, double bytes, double flops, double target_pct_copy) {
    h->n_timings++;
    cJSON *t = cJSON_CreateObject();
    cJSON_AddStringToObject(t, "case", case_name);
    cJSON_AddStringToObject(t, "version", version);
    cJSON_AddStringToObject(t, "shape", shape);
    cJSON_AddNumberToObject(t, "ms", ms);
    cJSON_AddNumberToObject(t, "bytes", bytes);
    cJSON_AddNumberToObject(t, "flops", flops);
    double s = ms * 1e-3;
    double gbs = bytes > 0 ? bytes / s / 1e9 : 0, tflops = flops > 0 ? flops / s / 1e12 : 0;
    double pct_copy = 0, pct_gemm = 0;
#if MV_HAVE_CUDA
    if (h->ceil.copy_gbs > 0) pct_copy = 100.0 * gbs / h->ceil.copy_gbs;
    if (h->ceil.gemm_tflops > 0) pct_gemm = 100.0 * tflops / h->ceil.gemm_tflops;
#endif
    if (bytes > 0) {
        cJSON_AddNumberToObject(t, "gbs", gbs);
        cJSON_AddNumberToObject(t, "pct_copy", pct_copy);
    }
    if (flops > 0) {
        cJSON_AddNumberToObject(t, "tflops", tflops);
        cJSON_AddNumberToObject(t, "pct_gemm", pct_gemm);
    }
    if (target_pct_copy > 0) {
        int met = pct_copy >= target_pct_copy;
        cJSON_AddNumberToObject(t, "target_pct_copy", target_pct_copy);
        cJSON_AddBoolToObject(t, "target_met", met);
        if (!met) h->n_slow++;
        if (pct_copy > h->best_pct) {
            h->best_pct = pct_copy;
            snprintf(h->best_line, sizeof h->best_line, "%s %.0f GB/s (%.0f%% of copy) at %s",
                     version, gbs, pct_copy, shape);
        }
    }
    cJSON_AddItemToArray(h->timings, t);
    if (!h->summary) {
        char flops_txt[48] = "";
        if (flops > 0) snprintf(flops_txt, sizeof flops_txt, " %8.1f TFLOP/s (%3.0f%%)", tflops, pct_gemm);
        printf("  %-14s %-26s %-28s %10.4f ms %8.0f GB/s (%3.0f%% of copy)%s%s\n", case_name,
               version, shape, ms, gbs, pct_copy, flops_txt,
               target_pct_copy > 0 && pct_copy < target_pct_copy ? "  BELOW TARGET" : "");
    }
}

int harness_end(harness_t *h) {
    int failed = h->n_failed > 0 || (h->require_speed && h->n_slow > 0);
    cJSON_AddNumberToObject(h->json, "n_checks", h->n_checks);
    cJSON_AddNumberToObject(h->json, "n_failed", h->n_failed);
    cJSON_AddNumberToObject(h->json, "n_below_target", h->n_slow);
    cJSON_AddBoolToObject(h->json, "passed", h->n_failed == 0);
    if (h->json_path) {
        char *text = cJSON_Print(h->json);
        FILE *f = fopen(h->json_path, "w");
        IO_CHECK(f != NULL, h->json_path);
        IO_CHECK(fputs(text, f) >= 0 && fputc('\n', f) != EOF, h->json_path);
        IO_CHECK(fclose(f) == 0, h->json_path);
        free(text);
    }
    char status[64];
    snprintf(status, sizeof status, "%s", h->n_failed ? "FAIL" : "PASS");
    if (h->summary) {
        printf("%-16s %s  %d/%d checks", h->chapter, status, h->n_checks - h->n_failed, h->n_checks);
        if (h->gpu_note) {
            printf("  (CPU reference only: %s)", h->gpu_note);
        } else if (h->use_gpu) {
            printf("  on %s", h->gpu.name);
            if (h->best_line[0]) printf("; fastest: %s", h->best_line);
        } else if (h->host_only) {
            printf("  (host-only chapter)");
        } else {
            printf("  (CPU reference only; GPU half skipped: %s)", h->gpu.why_not);
        }
        if (h->n_slow) printf("; %d timing(s) below target", h->n_slow);
        printf("\n");
    } else {
        printf("\n%s: %s, %d of %d checks passed", h->chapter, status, h->n_checks - h->n_failed,
               h->n_checks);
        if (h->n_timings) printf(", %d timings (%d below target)", h->n_timings, h->n_slow);
        if (!h->use_gpu && !h->host_only) printf("; GPU half skipped: %s", h->gpu.why_not);
        printf("\n");
    }
    cJSON_Delete(h->json);
    h->json = NULL;
    return failed ? 1 : 0;
}

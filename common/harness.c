/* common/harness.c - the chapter driver described in harness.h. */
#include "common/harness.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/check.h"

// The largest version number among the chapter's kernels (0: none).
static int max_version(const harness_t *h) {
    int max = 0;
    for (const harness_kernel_t *k = h->kernels; k && k->what; k++)
        for (const kernel_version_t *v = k->versions; v->name; v++)
            if (v->number > max) max = v->number;
    return max;
}

static int version_exists(const harness_t *h, int number) {
    for (const harness_kernel_t *k = h->kernels; k && k->what; k++)
        if (kernel_version_name(k->versions, number)) return 1;
    return 0;
}

// "v3-flash-32-rows-per-warp" (one kernel) or "prefill v3-..., decode v3-..."
// (several): what version `number` is in this chapter.
static void version_names(const harness_t *h, int number, char *buf, size_t n) {
    int several = h->kernels[0].what && h->kernels[1].what;
    size_t used = 0;
    buf[0] = 0;
    for (const harness_kernel_t *k = h->kernels; k->what && used < n; k++) {
        const char *name = kernel_version_name(k->versions, number);
        if (!name) continue;
        used += (size_t)snprintf(buf + used, n - used, "%s%s%s%s", used ? ", " : "", several ? k->what : "",
                                 several ? " " : "", name);
    }
}

// The list --help and a wrong --kernel print: one line per version number.
static void print_versions(const harness_t *h, FILE *f) {
    if (h->host_only) {
        fprintf(f, "kernel versions: none (a host-only chapter has no kernels; --kernel is an error)\n");
        return;
    }
    if (!h->kernels || !h->kernels[0].what) {
        fprintf(f, "kernel versions: none (--kernel is an error)\n");
        return;
    }
    fprintf(f, "kernel versions (--kernel N runs one, e.g. %s --kernel %d):\n", h->chapter, max_version(h));
    for (int number = 1; number <= max_version(h); number++) {
        if (!version_exists(h, number)) continue;
        char names[512];
        version_names(h, number, names, sizeof names);
        fprintf(f, "  %d  %s\n", number, names);
    }
}

// --kernel's value: a version number one of the chapter's kernels has.
static int parse_kernel(const harness_t *h, const char *s) {
    if (h->host_only || !h->kernels || !h->kernels[0].what) {
        fprintf(stderr, "%s: --kernel %s: %s has no kernels (see --help)\n", h->chapter, s,
                h->host_only ? "a host-only chapter" : "this chapter");
        exit(2);
    }
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end) {
        fprintf(stderr, "%s: --kernel expects a version number, got '%s'\n", h->chapter, s);
    } else if (v < 1 || v > max_version(h) || !version_exists(h, (int)v)) {
        fprintf(stderr, "%s: --kernel %s: no such version\n", h->chapter, s);
    } else {
        return (int)v;
    }
    print_versions(h, stderr);
    exit(2);
}

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
            "  --kernel N       check and time kernel version N only (as llm.c's ./layernorm_forward 4);\n"
            "                   the CPU self-checks still run\n"
            "  --help           this text\n"
            "exit status: 0 all checks passed, 1 a check failed, 2 bad arguments\n",
            h->chapter, h->title,
            h->host_only ? "A host-only chapter: plain C with no GPU half; --cpu, --device and\n"
                           "--require-speed change nothing."
                         : "Checks the chapter's CUDA kernels against the CPU reference, then times them.\n"
                           "Without a usable GPU it checks the CPU reference on its own and says so.");
    if (h->extra_usage) fprintf(f, "options of this chapter:\n%s", h->extra_usage);
    print_versions(h, f);
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

// With --kernel N and the GPU half running: which version that is.
static void say_kernel(const harness_t *h) {
    if (h->summary || !h->kernel) return;
    char names[512];
    version_names(h, h->kernel, names, sizeof names);
    printf("--kernel %d: checking%s version %d only (%s)\n", h->kernel, h->do_timing ? " and timing" : "", h->kernel,
           names);
}

static void begin(harness_t *h, const char *chapter, const char *title, int argc, char **argv,
                  int host_only, const char *extra_usage, const harness_kernel_t *kernels) {
    memset(h, 0, sizeof *h);
    h->kernels = kernels;
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
        } else if (!strcmp(a, "--kernel")) {
            if (!has_next) bad_arg(h, "%s needs a version number", a);
            h->kernel = parse_kernel(h, argv[++i]);
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

    h->json = mvj_object();
    mvj_set_string(h->json, "chapter", chapter);
    mvj_set_string(h->json, "title", title);
    mvj_set_string(h->json, "command", h->command);
    mvj_set_number(h->json, "seed", (double)h->seed);
    char when[32];
    iso_time(when, sizeof when);
    mvj_set_string(h->json, "date", when);
    mvj_set_bool(h->json, "built_with_cuda", MV_HAVE_CUDA);
    if (h->kernel) mvj_set_number(h->json, "kernel", h->kernel);
    h->checks = mvj_set_array(h->json, "checks");
    h->timings = mvj_set_array(h->json, "timings");

    if (!h->summary) printf("%s: %s\n", chapter, title);
    if (h->host_only) {
        snprintf(h->gpu.why_not, sizeof h->gpu.why_not, "host-only chapter");
    } else if (h->cpu_only) {
        snprintf(h->gpu.why_not, sizeof h->gpu.why_not, "--cpu was given");
    } else if (gpu_probe(&h->gpu, h->device) == 0) {
        h->use_gpu = 1;
    }
    mv_json_t *g = mvj_set_object(h->json, "gpu");
    mvj_set_bool(g, "used", h->use_gpu);
    if (!h->use_gpu) {
        mvj_set_string(g, "why_not", h->gpu.why_not);
        if (!h->summary && !h->host_only)
            printf("GPU half skipped: %s. Checking the CPU reference only.\n", h->gpu.why_not);
        if (!h->summary && h->kernel)
            printf("--kernel %d: a GPU version, so nothing of it runs while the GPU half is skipped.\n", h->kernel);
        return;
    }
    mvj_set_string(g, "name", h->gpu.name);
    mvj_set_number(g, "device", h->gpu.device);
    mvj_set_number(g, "device_count", h->gpu.device_count);
    mvj_set_number(g, "sm_count", h->gpu.sm_count);
    char cc[16];
    snprintf(cc, sizeof cc, "%d.%d", h->gpu.cc_major, h->gpu.cc_minor);
    mvj_set_string(g, "compute_capability", cc);
    mvj_set_number(g, "l2_bytes", (double)h->gpu.l2_bytes);
    mvj_set_number(g, "mem_bytes", (double)h->gpu.mem_bytes);
    mvj_set_string(g, "driver", h->gpu.driver);
    mvj_set_string(g, "runtime", h->gpu.runtime);
    h->do_timing = !h->checks_only;
    if (!h->do_timing) {
        if (!h->summary) printf("GPU: %s (%d SMs); --checks-only: no ceilings, no timing\n", h->gpu.name, h->gpu.sm_count);
        say_kernel(h);
        return;
    }
#if MV_HAVE_CUDA
    measure_ceilings(&h->ceil, h->quick);
    mv_json_t *c = mvj_set_object(h->json, "ceilings");
    mvj_set_number(c, "copy_gbs", h->ceil.copy_gbs);
    mvj_set_number(c, "copy_bytes", (double)h->ceil.copy_bytes);
    mvj_set_number(c, "gemm_tflops", h->ceil.gemm_tflops);
    mvj_set_number(c, "gemm_n", h->ceil.gemm_n);
    if (!h->summary)
        printf("GPU: %s (%d SMs, L2 %.0f MB), measured copy %.0f GB/s (read+write), bf16 GEMM %.0f "
               "TFLOP/s (%d^3)\n",
               h->gpu.name, h->gpu.sm_count, h->gpu.l2_bytes / 1e6, h->ceil.copy_gbs,
               h->ceil.gemm_tflops, h->ceil.gemm_n);
#endif
    say_kernel(h);
}

void harness_begin(harness_t *h, const char *chapter, const char *title, int argc, char **argv) {
    begin(h, chapter, title, argc, argv, 0, NULL, NULL);
}

void harness_begin_kernels(harness_t *h, const char *chapter, const char *title, int argc, char **argv,
                           const harness_kernel_t *kernels) {
    begin(h, chapter, title, argc, argv, 0, NULL, kernels);
}

int harness_kernel_wanted(const harness_t *h, int version) {
    return h->kernel == 0 || h->kernel == version;
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
    begin(h, chapter, title, n, rest, 1, extra ? extra->usage : NULL, NULL);
    free(rest);
    size_t len = 0;
    for (int i = 0; i < argc && len < sizeof h->command; i++)
        len += (size_t)snprintf(h->command + len, sizeof h->command - len, "%s%s", i ? " " : "", argv[i]);
    mvj_set_string(h->json, "command", h->command);
    mvj_set_bool(h->json, "host_only", 1);
}

void harness_section(harness_t *h, const char *title) {
    if (!h->summary) printf("\n== %s\n", title);
}

static mv_json_t *tol_json(tolerance_t tol) {
    mv_json_t *t = mvj_object();
    mvj_set_number(t, "atol", tol.atol);
    mvj_set_number(t, "rtol", tol.rtol);
    mvj_set_number(t, "max_nmse", tol.max_nmse);
    mvj_set_string(t, "reason", tol.reason ? tol.reason : "");
    return t;
}

// One bound of a tolerance, short: "0", or "1e-06" / "2.5e-03" when that is
// its exact value, else three digits ("3.92e-03" for 2^-8 + 1e-5). The exact
// values are in the --json record.
static void tol_text(char *buf, size_t n, double x) {
    if (x == 0) {
        snprintf(buf, n, "0");
        return;
    }
    for (int digits = 0; digits < 2; digits++) {
        snprintf(buf, n, "%.*e", digits, x);
        if (strtod(buf, NULL) == x) return;
    }
    snprintf(buf, n, "%.2e", x);
}

int harness_check(harness_t *h, const char *side, const char *case_name, const char *version,
                  const char *shape, compare_result_t r, tolerance_t tol) {
    h->n_checks++;
    if (!r.pass) h->n_failed++;
    mv_json_t *c = mvj_object();
    mvj_set_string(c, "side", side);
    mvj_set_string(c, "case", case_name);
    mvj_set_string(c, "version", version);
    mvj_set_string(c, "shape", shape);
    mvj_set_bool(c, "pass", r.pass);
    mvj_set_number(c, "n", (double)r.n);
    mvj_set_number(c, "n_bad", (double)r.n_bad);
    mvj_set_number(c, "n_nonfinite", (double)r.n_nonfinite);
    mvj_set_number(c, "n_unwritten", (double)r.n_unwritten);
    mvj_set_number(c, "max_abs", r.max_abs);
    mvj_set_number(c, "max_rel", r.max_rel);
    mvj_set_number(c, "nmse", r.nmse);
    mvj_set(c, "tolerance", tol_json(tol));
    mvj_push(h->checks, c);
    if (!h->summary || !r.pass) {
        char atol[16], rtol[16], nmse[16];
        tol_text(atol, sizeof atol, tol.atol);
        tol_text(rtol, sizeof rtol, tol.rtol);
        tol_text(nmse, sizeof nmse, tol.max_nmse);
        printf("  %s %-3s %-14s %-26s %-28s max_abs %.2e max_rel %.2e nmse %.2e  tol abs %s rel %s nmse %s\n",
               r.pass ? "PASS" : "FAIL", side, case_name, version, shape, r.max_abs, r.max_rel,
               r.nmse, atol, rtol, nmse);
    }
    return r.pass;
}

int harness_check_bool(harness_t *h, const char *side, const char *case_name, const char *what,
                       int pass, const char *detail) {
    h->n_checks++;
    if (!pass) h->n_failed++;
    mv_json_t *c = mvj_object();
    mvj_set_string(c, "side", side);
    mvj_set_string(c, "case", case_name);
    mvj_set_string(c, "version", what);
    mvj_set_bool(c, "pass", pass);
    mvj_set_string(c, "detail", detail ? detail : "");
    mvj_push(h->checks, c);
    if (!h->summary || !pass)
        printf("  %s %-3s %-14s %-26s %s\n", pass ? "PASS" : "FAIL", side, case_name, what,
               detail ? detail : "");
    return pass;
}

void harness_timing(harness_t *h, const char *case_name, const char *version, const char *shape,
                    double ms, double bytes, double flops, double target_pct_copy) {
    h->n_timings++;
    mv_json_t *t = mvj_object();
    mvj_set_string(t, "case", case_name);
    mvj_set_string(t, "version", version);
    mvj_set_string(t, "shape", shape);
    mvj_set_number(t, "ms", ms);
    mvj_set_number(t, "bytes", bytes);
    mvj_set_number(t, "flops", flops);
    double s = ms * 1e-3;
    double gbs = bytes > 0 ? bytes / s / 1e9 : 0, tflops = flops > 0 ? flops / s / 1e12 : 0;
    double pct_copy = 0, pct_gemm = 0;
#if MV_HAVE_CUDA
    if (h->ceil.copy_gbs > 0) pct_copy = 100.0 * gbs / h->ceil.copy_gbs;
    if (h->ceil.gemm_tflops > 0) pct_gemm = 100.0 * tflops / h->ceil.gemm_tflops;
#endif
    if (bytes > 0) {
        mvj_set_number(t, "gbs", gbs);
        mvj_set_number(t, "pct_copy", pct_copy);
    }
    if (flops > 0) {
        mvj_set_number(t, "tflops", tflops);
        mvj_set_number(t, "pct_gemm", pct_gemm);
    }
    if (target_pct_copy > 0) {
        int met = pct_copy >= target_pct_copy;
        mvj_set_number(t, "target_pct_copy", target_pct_copy);
        mvj_set_bool(t, "target_met", met);
        if (!met) h->n_slow++;
        if (pct_copy > h->best_pct) {
            h->best_pct = pct_copy;
            snprintf(h->best_line, sizeof h->best_line, "%s %.0f GB/s (%.0f%% of copy) at %s",
                     version, gbs, pct_copy, shape);
        }
    }
    mvj_push(h->timings, t);
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
    mvj_set_number(h->json, "n_checks", h->n_checks);
    mvj_set_number(h->json, "n_failed", h->n_failed);
    mvj_set_number(h->json, "n_below_target", h->n_slow);
    mvj_set_bool(h->json, "passed", h->n_failed == 0);
    if (h->json_path) {
        FILE *f = fopen(h->json_path, "w");
        IO_CHECK(f != NULL, h->json_path);
        IO_CHECK(mvj_write(h->json, f) == 0, h->json_path);
        IO_CHECK(fclose(f) == 0, h->json_path);
    }
    char status[64];
    snprintf(status, sizeof status, "%s", h->n_failed ? "FAIL" : "PASS");
    if (h->summary) {
        printf("%-16s %s  %d/%d checks", h->chapter, status, h->n_checks - h->n_failed, h->n_checks);
        if (h->use_gpu) {
            printf("  on %s", h->gpu.name);
            if (h->kernel) printf("; kernel version %d only", h->kernel);
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
        if (h->use_gpu && h->kernel) printf("; kernel version %d only", h->kernel);
        if (!h->use_gpu && !h->host_only) printf("; GPU half skipped: %s", h->gpu.why_not);
        printf("\n");
    }
    mvj_free(h->json);
    h->json = NULL;
    return failed ? 1 : 0;
}

/*
 * tests/test_cli.c - every chapter executable answers its command line as the
 * lab promises: --help exits 0, a wrong argument is an error naming it with
 * exit status 2, and --json writes a file that names the chapter.
 *
 * Run: make test  (the executables come from the same build directory)
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "tests/helpers.h"

static const char *CHAPTERS[] = {"01-activation", "02-rmsnorm", "03-linear-tp", "04-embedding", "08-scheduler"};
#define N_CHAPTERS (sizeof CHAPTERS / sizeof CHAPTERS[0])

Test(cli, help_exits_zero) {
    char cmd[512], out[8192];
    for (size_t i = 0; i < N_CHAPTERS; i++) {
        snprintf(cmd, sizeof cmd, "./%s/%s --help 2>&1", MV_BUILD_DIR, CHAPTERS[i]);
        cr_expect_eq(run_command(cmd, out, sizeof out), 0, "%s --help", CHAPTERS[i]);
        cr_expect(strstr(out, "usage") != NULL || strstr(out, "Usage") != NULL, "%s --help: %s", CHAPTERS[i], out);
    }
}

Test(cli, wrong_argument_is_named_and_exits_2) {
    char cmd[512], out[8192];
    for (size_t i = 0; i < N_CHAPTERS; i++) {
        snprintf(cmd, sizeof cmd, "./%s/%s --no-such-flag 2>&1", MV_BUILD_DIR, CHAPTERS[i]);
        cr_expect_eq(run_command(cmd, out, sizeof out), 2, "%s --no-such-flag", CHAPTERS[i]);
        cr_expect(strstr(out, "--no-such-flag") != NULL, "%s: %s", CHAPTERS[i], out);
        snprintf(cmd, sizeof cmd, "./%s/%s --seed banana 2>&1", MV_BUILD_DIR, CHAPTERS[i]);
        cr_expect_eq(run_command(cmd, out, sizeof out), 2, "%s --seed banana", CHAPTERS[i]);
        cr_expect(strstr(out, "banana") != NULL, "%s: %s", CHAPTERS[i], out);
    }
}

Test(cli, json_names_the_chapter) {
    char cmd[512], out[8192], path[256];
    snprintf(path, sizeof path, "/tmp/mv-test-cli-%d.json", (int)getpid());
    snprintf(cmd, sizeof cmd, "./%s/01-activation --cpu --summary --json %s 2>&1", MV_BUILD_DIR, path);
    cr_assert_eq(run_command(cmd, out, sizeof out), 0, "%s", out);
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f);
    size_t n = fread(out, 1, sizeof out - 1, f);
    out[n] = '\0';
    fclose(f);
    remove(path);
    cJSON *j = cJSON_Parse(out);
    cr_assert_not_null(j, "the --json file is not JSON:\n%s", out);
    cJSON *chapter = cJSON_GetObjectItem(j, "chapter");
    cr_expect(cJSON_IsString(chapter) && !strcmp(chapter->valuestring, "01-activation"), "%s", out);
    cr_expect(cJSON_IsArray(cJSON_GetObjectItem(j, "checks")), "%s", out);
    cJSON_Delete(j);
}

Test(cli, unwritable_json_path_fails_cleanly) {
    char cmd[512], out[8192];
    snprintf(cmd, sizeof cmd, "./%s/02-rmsnorm --cpu --summary --json /no/such/dir/x.json 2>&1", MV_BUILD_DIR);
    cr_expect_eq(run_command(cmd, out, sizeof out), 1);
    cr_expect(strstr(out, "/no/such/dir/x.json") != NULL, "%s", out);
}

// --kernel N (llm.c's `./layernorm_forward 4`): each GPU chapter's versions
// with the name of its last one, which a wrong N must list.
static const struct {
    const char *chapter, *last_version;
} KERNEL_CHAPTERS[] = {
    {"01-activation", "3  v3-rows-unrolled"},
    {"02-rmsnorm", "3  v3-vec16-loads-in-flight"},
    {"03-linear-tp", "2  v2-gemv"},
    {"04-embedding", "1  v1"},
    {"05-rope", "6  rope v6-same-as-v3, qk_norm_rope v6-1-token-8-blocks-cossin-in-regs"},
    {"06-kv-store", "2  v2-vec16-warp-per-token"},
    {"07-attention", "3  prefill v3-flash-32-rows-per-warp, decode v3-gqa-split-per-row"},
};
#define N_KERNEL_CHAPTERS (sizeof KERNEL_CHAPTERS / sizeof KERNEL_CHAPTERS[0])

Test(cli, kernel_that_is_no_version_exits_2_listing_the_versions) {
    char cmd[512], out[8192];
    for (size_t i = 0; i < N_KERNEL_CHAPTERS; i++) {
        const char *c = KERNEL_CHAPTERS[i].chapter;
        snprintf(cmd, sizeof cmd, "./%s/%s --kernel 99 2>&1", MV_BUILD_DIR, c);
        cr_expect_eq(run_command(cmd, out, sizeof out), 2, "%s --kernel 99: %s", c, out);
        cr_expect(strstr(out, "--kernel 99: no such version") != NULL, "%s: %s", c, out);
        cr_expect(strstr(out, KERNEL_CHAPTERS[i].last_version) != NULL, "%s: no '%s' in: %s", c,
                  KERNEL_CHAPTERS[i].last_version, out);
        snprintf(cmd, sizeof cmd, "./%s/%s --kernel abc 2>&1", MV_BUILD_DIR, c);
        cr_expect_eq(run_command(cmd, out, sizeof out), 2, "%s --kernel abc: %s", c, out);
        cr_expect(strstr(out, "'abc'") != NULL, "%s: %s", c, out);
        snprintf(cmd, sizeof cmd, "./%s/%s --help 2>&1", MV_BUILD_DIR, c);
        cr_expect_eq(run_command(cmd, out, sizeof out), 0, "%s --help", c);
        cr_expect(strstr(out, "--kernel N") != NULL && strstr(out, KERNEL_CHAPTERS[i].last_version) != NULL,
                  "%s --help lists neither --kernel nor the versions: %s", c, out);
    }
    // Rope has no version 5 (kernels/rope.h): a gap in the numbers is no version either.
    snprintf(cmd, sizeof cmd, "./%s/05-rope --kernel 5 2>&1", MV_BUILD_DIR);
    cr_expect_eq(run_command(cmd, out, sizeof out), 2, "05-rope --kernel 5: %s", out);
}

// An experiment switch of a chapter's kernels with a value it does not take
// is refused by name, exit 2, rather than read as unset (the engine refuses
// the same values: runner_cuda.c, check_switches).
Test(cli, experiment_switch_with_a_wrong_value_exits_2) {
    static const struct {
        const char *env, *chapter, *takes;
    } cases[] = {
        {"MV_LINEAR_GEMV=4", "03-linear-tp", "it takes 2"},
        {"MV_DECODE_PIECES=5", "07-attention", "it takes 0"},
        {"MV_DECODE_PIECES=", "07-attention", "it takes 0"},
    };
    char cmd[512], out[8192];
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        snprintf(cmd, sizeof cmd, "%s ./%s/%s --cpu 2>&1", cases[i].env, MV_BUILD_DIR, cases[i].chapter);
        cr_expect_eq(run_command(cmd, out, sizeof out), 2, "%s %s: %s", cases[i].env, cases[i].chapter, out);
        cr_expect(strstr(out, cases[i].env) && strstr(out, cases[i].takes), "%s %s: %s", cases[i].env,
                  cases[i].chapter, out);
    }
    // The values they take run as ever.
    snprintf(cmd, sizeof cmd, "MV_DECODE_PIECES=0 ./%s/07-attention --cpu --summary 2>&1", MV_BUILD_DIR);
    cr_expect_eq(run_command(cmd, out, sizeof out), 0, "%s", out);
}

Test(cli, kernel_in_a_host_only_chapter_is_an_error) {
    char cmd[512], out[8192];
    snprintf(cmd, sizeof cmd, "./%s/08-scheduler --kernel 1 2>&1", MV_BUILD_DIR);
    cr_expect_eq(run_command(cmd, out, sizeof out), 2, "%s", out);
    cr_expect(strstr(out, "no kernels") != NULL, "%s", out);
}

// Without the GPU half --kernel selects nothing that runs, and says so; the
// CPU self-checks run and pass as ever.
Test(cli, kernel_with_cpu_says_the_gpu_half_is_skipped) {
    char cmd[512], out[8192];
    snprintf(cmd, sizeof cmd, "./%s/01-activation --cpu --kernel 2 2>&1", MV_BUILD_DIR);
    cr_expect_eq(run_command(cmd, out, sizeof out), 0, "%s", out);
    cr_expect(strstr(out, "GPU half skipped") != NULL && strstr(out, "--kernel 2") != NULL, "%s", out);
    cr_expect(strstr(out, "PASS cpu") != NULL, "%s", out);
}

// Every comparison's line shows the tolerance it was judged by: 01's
// hand-computed values are judged by atol 1e-12, rtol 1e-6, NMSE 1e-12.
Test(cli, check_lines_show_their_tolerance) {
    char cmd[512], out[8192];
    snprintf(cmd, sizeof cmd, "./%s/01-activation --cpu 2>&1", MV_BUILD_DIR);
    cr_assert_eq(run_command(cmd, out, sizeof out), 0, "%s", out);
    const char *line = strstr(out, "  PASS cpu hand-values");
    cr_assert_not_null(line, "%s", out);
    const char *eol = strchr(line, '\n');
    const char *tol = strstr(line, "  tol abs 1e-12 rel 1e-06 nmse 1e-12\n");
    cr_expect(tol != NULL && tol < eol, "no tolerance on the line: %.*s", (int)(eol - line), line);
}

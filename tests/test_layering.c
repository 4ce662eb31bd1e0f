/*
 * tests/test_layering.c - the build's layers stay apart.
 *
 * A chapter executable links what its chapter teaches and the chapters
 * before it, nothing more (Makefile, "one archive per layer"): chapter 01
 * builds from common/, reference/, kernels/ and its own main.c, so an error
 * in the engine's code cannot stop it, and it needs none of the engine's
 * libraries at run time. These tests ask make and ldd, so a new include or
 * a link line that crosses a layer fails here, in CI.
 *
 * Run: make test  (or build/tests/test_layering after make)
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "tests/helpers.h"

// make's plan for `target` from a clean tree (-B: as if nothing were
// built; -n: print the commands, run none), in a build directory of its
// own so the real one is not touched. The variables of the make that runs
// this test (jobserver, -n of its own) are kept out.
static void plan_of(const char *target, char *out, size_t cap) {
    char cmd[512];
    snprintf(cmd, sizeof cmd,
             "env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL make --no-print-directory -n -B BUILD=build-layering "
             "build-layering/%s 2>&1",
             target);
    cr_assert_eq(run_command(cmd, out, cap), 0, "make -n failed:\n%.2000s", out);
}

Test(layering, chapter_01_compiles_nothing_of_chapters_08_and_09, .timeout = 120) {
    static char out[1 << 20];
    plan_of("01-activation", out, sizeof out);
    cr_assert(strstr(out, "chapters/01-activation/main.c") != NULL, "unexpected plan:\n%.2000s", out);
    const char *bad[] = {"chapters/08-", "chapters/09-", "-lcjson", "-lpcre2", "-lutf8proc", "-lxxhash"};
    for (size_t k = 0; k < sizeof bad / sizeof *bad; k++) {
        const char *hit = strstr(out, bad[k]);
        cr_expect(hit == NULL, "build/01-activation's plan mentions %s: ...%.200s", bad[k], hit ? hit : "");
    }
}

Test(layering, chapters_01_to_07_link_no_engine_object, .timeout = 120) {
    static char out[1 << 20];
    const char *chapters[] = {"01-activation", "02-rmsnorm", "03-linear-tp", "04-embedding",
                              "05-rope",       "06-kv-store", "07-attention"};
    for (size_t c = 0; c < sizeof chapters / sizeof *chapters; c++) {
        plan_of(chapters[c], out, sizeof out);
        cr_expect(strstr(out, "chapters/09-engine") == NULL && strstr(out, "libmv_runtime") == NULL &&
                      strstr(out, "libmv_text") == NULL && strstr(out, "libmv_model") == NULL &&
                      strstr(out, "libmv_sched") == NULL,
                  "%s's plan reaches the engine or the scheduler", chapters[c]);
    }
}

Test(layering, chapter_01_needs_no_engine_library_at_run_time) {
    char cmd[512], out[8192];
    snprintf(cmd, sizeof cmd, "ldd ./%s/01-activation 2>&1", MV_BUILD_DIR);
    cr_assert_eq(run_command(cmd, out, sizeof out), 0, "%s", out);
    const char *bad[] = {"pcre2", "utf8proc", "xxhash", "cjson"};
    for (size_t k = 0; k < sizeof bad / sizeof *bad; k++)
        cr_expect(strstr(out, bad[k]) == NULL, "ldd build/01-activation lists %s:\n%s", bad[k], out);
}

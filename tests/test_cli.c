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

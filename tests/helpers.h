/*
 * tests/helpers.h - small helpers shared by the Criterion tests (header
 * only: each tests/test_*.c is its own binary, and none of this belongs in
 * the library).
 *
 *   run_command(cmd, out, cap)   run a shell command: exit status + output
 *   qwen3_dir_or_skip(what)      $MV_QWEN3_DIR, or skip the test saying so
 */
#ifndef MV_TESTS_HELPERS_H
#define MV_TESTS_HELPERS_H

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>

// Run a shell command; return its exit status (-1 if it did not exit) and
// up to cap - 1 bytes of its stdout (add 2>&1 to the command for stderr).
// The command sees no GPU (CUDA_VISIBLE_DEVICES empty): `minivllm` then
// defaults to --device cpu, whose results the tests know exactly, on a GPU
// machine as in CI. The cuda backend has its own check, build/engine_check.
static inline int run_command(const char *cmd, char *out, size_t cap) {
    setenv("CUDA_VISIBLE_DEVICES", "", 1);
    FILE *p = popen(cmd, "r");
    cr_assert_not_null(p, "popen %s", cmd);
    size_t n = fread(out, 1, cap - 1, p);
    out[n] = '\0';
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

// The real Qwen3-0.6B directory (config and tokenizer, no weights) from
// MV_QWEN3_DIR; without it the calling test is skipped, saying which.
static inline const char *qwen3_dir_or_skip(const char *what) {
    const char *d = getenv("MV_QWEN3_DIR");
    if (!d || !*d) {
        fprintf(stderr, "SKIP: MV_QWEN3_DIR is not set, so %s skipped\n", what);
        cr_skip_test("MV_QWEN3_DIR is not set");
    }
    return d;
}

#endif

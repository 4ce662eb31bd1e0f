/*
 * common/harness.h - what every chapter executable does around its own cases.
 *
 *   harness_begin()  parse the common arguments, find the GPU (or say why the
 *                    GPU half is skipped), measure the ceilings;
 *   harness_check()  record one comparison (CPU self-check or GPU kernel);
 *   harness_timing() record one timed kernel, as GB/s and/or TFLOP/s and as a
 *                    percentage of the measured ceilings;
 *   harness_end()    print the table, write --json, return the exit code.
 *
 * Common arguments of every chapter executable:
 *   --json FILE      write all results (cases, errors, tolerances, times,
 *                    rates, GPU name, command) to FILE
 *   --seed N         seed of the random inputs (default 42)
 *   --cpu            skip the GPU half even when a GPU is present
 *   --quick          fewer and smaller timing runs
 *   --summary        print one summary line instead of the full table
 *   --require-speed  also fail (exit 1) when a kernel misses its speed target
 *   --checks-only    run the checks, skip ceilings and timing (for compute-sanitizer)
 *   --device N       CUDA device index (default 0)
 *   --kernel N       check and time kernel version N only, as llm.c's
 *                    `./layernorm_forward 4` (the CPU self-checks still run);
 *                    N must be one of the versions the chapter registered
 *                    (harness_begin_kernels), which --help lists
 *   --help
 * A wrong argument is an error naming it, with exit status 2.
 */
#ifndef MV_HARNESS_H
#define MV_HARNESS_H

#include <stdint.h>

#include "common/compare.h"
#include "common/gpu.h"
#include "common/json_writer.h"
#include "common/versions.h"

#ifdef __cplusplus
extern "C" {
#endif


typedef struct {
    const char *chapter;   // "01-activation"
    const char *title;     // one line: what the chapter checks
    // options
    const char *json_path;
    uint64_t seed;
    int cpu_only, quick, summary, require_speed, checks_only, device;
    int kernel;            // --kernel N: the one version to run; 0: every version
    char command[1024];    // the command line, for the record
    // environment
    gpu_info_t gpu;
    int use_gpu;           // 1 when the GPU half runs
    int do_timing;         // 1 when timings run (GPU used, no --checks-only)
#if MV_HAVE_CUDA
    ceilings_t ceil;
#endif
    // results
    mv_json_t *json, *checks, *timings;  // the --json record (common/json_writer.h)
    int n_checks, n_failed, n_timings, n_slow;
    double best_pct;       // best % of copy bandwidth among targeted timings
    char best_line[256];   // the timing behind best_pct, for the summary
    // host-only chapters (harness_begin_host)
    int host_only;         // 1: the chapter has no GPU half at all
    const char *extra_usage;  // the chapter's own options, for --help
    const struct harness_kernel *kernels;  // the chapter's kernels and their versions (or NULL)
} harness_t;

// One of a chapter's kernels and its numbered versions (a table of
// kernels/versions.h). A chapter with several kernels (07: prefill and
// decode) gives one entry each, in an array ended by { NULL, NULL }; their
// versions share the numbers, so --kernel 3 runs version 3 of each.
typedef struct harness_kernel {
    const char *what;                  // "prefill", as --help and the errors print it
    const kernel_version_t *versions;  // ends with { 0, NULL }
} harness_kernel_t;

// Parses arguments (exits 0 after --help, 2 on a bad argument); may take a
// few hundred ms to measure the ceilings when a GPU is used.
void harness_begin(harness_t *h, const char *chapter, const char *title, int argc, char **argv);

// harness_begin for a chapter whose kernels come in numbered versions: `kernels`
// (ended by { NULL, NULL }) is what --kernel N is checked against (a number
// no kernel has: an error listing the versions, exit status 2) and what
// --help lists.
void harness_begin_kernels(harness_t *h, const char *chapter, const char *title, int argc, char **argv,
                           const harness_kernel_t *kernels);

// 1 when kernel version `version` is to be checked and timed: every version
// without --kernel, only N with --kernel N. Checks and timings that belong
// to no version (a cudaMemcpy2D baseline, NCCL) run either way.
int harness_kernel_wanted(const harness_t *h, int version);

// A chapter with no GPU half (scheduler, tokenizer): its messages say
// "host-only chapter" instead of "GPU half skipped", and `parse` takes the
// chapter's own options first. parse(ctx, argc, argv, i) returns how many
// entries argv[i..] it used (0: not its option); it exits 2 itself on a bad
// value. `usage` lists those options for --help.
typedef struct {
    const char *usage;
    int (*parse)(void *ctx, int argc, char **argv, int i);
    void *ctx;
} harness_extra_t;
void harness_begin_host(harness_t *h, const char *chapter, const char *title, int argc, char **argv,
                        const harness_extra_t *extra);

// A heading for the next group of lines (not printed with --summary).
void harness_section(harness_t *h, const char *title);

// Record and print one comparison. `side` is "cpu" (the reference against an
// independent check) or "gpu". The line ends with the tolerance it was judged
// by, "tol abs 1e-12 rel 1e-06 nmse 1e-12" (atol, rtol, max_nmse; --json keeps
// them exactly, with the reason). Returns r.pass.
int harness_check(harness_t *h, const char *side, const char *case_name, const char *version,
                  const char *shape, compare_result_t r, tolerance_t tol);

// Record and print a check that is not an element-wise comparison (an
// invariant, a count, an exact match); `detail` says what was found.
int harness_check_bool(harness_t *h, const char *side, const char *case_name, const char *what,
                       int pass, const char *detail);

// Record one timing. bytes / flops: what one run must move / compute (0 if
// not meaningful). target_pct_copy: the speed target as % of the measured
// copy bandwidth (0: no target for this case).
void harness_timing(harness_t *h, const char *case_name, const char *version, const char *shape,
                    double ms, double bytes, double flops, double target_pct_copy);

// Print the timing table (or the summary line), write --json, free
// everything. Returns the process exit code: 1 on any failed check (or
// missed target with --require-speed), else 0.
int harness_end(harness_t *h);

#ifdef __cplusplus
}
#endif
#endif

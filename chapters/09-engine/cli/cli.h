/*
 * chapters/09-engine/cli/cli.h - the pieces of the `minivllm` command line.
 *
 * main.c holds the table of commands; each command is a function
 * cmd_NAME(argc, argv) (argv[0] is the command's name) that parses its
 * options with cli_parse and returns the exit status:
 *   0 success, 1 failure (bad input, bad model files), 2 bad arguments.
 * To add a command: write cmd_NAME in its own cmd_*.c file, declare it
 * here, add a line to COMMANDS in main.c.
 */
#ifndef MV_CLI_H
#define MV_CLI_H

#include <stdio.h>

#include "chapters/09-engine/runtime/engine.h"
#include "chapters/09-engine/text/tokenizer.h"

#ifdef __cplusplus
extern "C" {
#endif

enum { CLI_OK = 0, CLI_FAIL = 1, CLI_USAGE = 2, CLI_HELP = 3 };

// One option: "--name VALUE" (value != NULL) or a flag "--name" (flag != NULL).
typedef struct {
    const char *name;     // "--model"
    const char *metavar;  // "DIR" in the help text; NULL for a flag
    const char *help;
    const char **value;   // where the value goes
    int *flag;            // set to 1 if the flag is given
} cli_opt_t;

// Parse argv[1..argc) against opts[0..n_opts). Returns CLI_OK, CLI_HELP
// (--help printed the usage) or CLI_USAGE (an error naming the argument
// was printed). `usage` is the command's synopsis and description.
int cli_parse(const char *cmd, const char *usage, const cli_opt_t *opts, int n_opts, int argc, char **argv);
// "minivllm CMD: <message>" on stderr; returns `status`.
int cli_error(const char *cmd, int status, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

// Number options. v == NULL (not given) leaves *out as it is, the default;
// a value that is not a number in [lo, hi] (lo excluded when lo_open) prints
// "minivllm CMD: OPT 'v' is not ..." and returns CLI_USAGE; else CLI_OK.
int cli_parse_long(const char *cmd, const char *opt, const char *v, long lo, long hi, long *out);
int cli_parse_float(const char *cmd, const char *opt, const char *v, double lo, double hi, int lo_open, float *out);

// The engine's options, shared by every command that runs the engine
// (generate, bench): --device, --max-model-len, --max-num-seqs,
// --max-num-batched-tokens, --block-size, --num-blocks, --kv-cache-gib,
// --gpu-memory-utilization, --threads, --no-prefix-caching.
typedef struct {
    const char *device, *max_model_len, *max_num_seqs, *max_batched, *block_size, *num_blocks, *threads, *kv_gib;
    const char *gpu_util;
    int no_prefix;
    int enforce_eager;
} cli_engine_args_t;
enum { CLI_ENGINE_N_OPTS = 11 };
// Write the CLI_ENGINE_N_OPTS option entries, bound to *a, into opts[];
// returns CLI_ENGINE_N_OPTS.
int cli_engine_opts(cli_engine_args_t *a, cli_opt_t *opts);
// The parsed options over engine_config_default's zeros. Without --device:
// cuda when a CUDA GPU is visible (in a build with CUDA), else cpu.
// CLI_USAGE naming a bad value, CLI_FAIL for --device cuda where it cannot
// run (saying why), else CLI_OK.
int cli_engine_config(const char *cmd, const cli_engine_args_t *a, engine_config_t *ec);

// Output helpers: a JSON list "[1, 2, 3]" and a JSON string, each on one line.
void cli_print_ids(FILE *f, const int32_t *ids, size_t n);
void cli_print_json_string(FILE *f, const char *s, size_t n);

// Read FILE ("-" = stdin) one line at a time, the line ending cut off, and
// call fn(line, len, line_no, ctx) for each (line_no from 1) until one
// returns non-zero, which is returned.
typedef int (*cli_line_fn)(const char *line, size_t len, long line_no, void *ctx);
int cli_for_each_line(const char *path, cli_line_fn fn, void *ctx);
// Commands (cmd_tokenize.c).
int cmd_tokenize(int argc, char **argv);
int cmd_detokenize(int argc, char **argv);
// cmd_inspect.c
int cmd_inspect(int argc, char **argv);
// cmd_generate.c
int cmd_generate(int argc, char **argv);
// cmd_bench.c
int cmd_bench(int argc, char **argv);

#ifdef __cplusplus
}
#endif
#endif

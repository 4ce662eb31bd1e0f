/*
 * chapters/09-engine/cli/cli.h - the pieces of the `minivllm` command line.
 *
 * main.c holds the table of commands; each command is a function
 * cmd_NAME(argc, argv) (argv[0] is the command's name) that parses its
 * options with cli_parse and returns the exit status:
 *   0 success, 1 failure (bad input, bad model files), 2 bad arguments.
 *   130 / 143 stopped by SIGINT / SIGTERM (what had finished was written).
 * To add a command: write cmd_NAME in its own cmd_*.c file, declare it
 * here, add a line to COMMANDS in main.c.
 */
#ifndef MV_CLI_H
#define MV_CLI_H

#include <cjson/cJSON.h>
#include <signal.h>
#include <stdio.h>
#include <sys/types.h>

#include "chapters/09-engine/runtime/engine.h"
#include "chapters/09-engine/text/tokenizer.h"

#ifdef __cplusplus
extern "C" {
#endif

enum { CLI_OK = 0, CLI_FAIL = 1, CLI_USAGE = 2, CLI_HELP = 3 };

// What `minivllm --version` prints first: the engine's version.
#define MV_VERSION "0.9.0"

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
// (generate, bench, serve, chat; inspect for its memory figures): --device,
// --max-model-len, --max-num-seqs, --max-num-batched-tokens, --block-size,
// --num-blocks, --kv-cache-gib, --gpu-memory-utilization, --threads,
// --no-prefix-caching, --enforce-eager, --no-async-scheduling,
// --tensor-parallel-size (also -tp).
typedef struct {
    const char *device, *max_model_len, *max_num_seqs, *max_batched, *block_size, *num_blocks, *threads, *kv_gib;
    const char *gpu_util, *tp_size;
    int no_prefix;
    int enforce_eager;
    int no_async;
} cli_engine_args_t;
enum { CLI_ENGINE_N_OPTS = 14 };
// Write the CLI_ENGINE_N_OPTS option entries, bound to *a, into opts[];
// returns CLI_ENGINE_N_OPTS.
int cli_engine_opts(cli_engine_args_t *a, cli_opt_t *opts);
// The parsed options over engine_config_default's zeros. Without --device:
// cuda when a CUDA GPU is visible (in a build with CUDA), else cpu.
// CLI_USAGE naming a bad value, CLI_FAIL for --device cuda where it cannot
// run (saying why), else CLI_OK.
int cli_engine_config(const char *cmd, const cli_engine_args_t *a, engine_config_t *ec);

// Tensor parallelism (--tensor-parallel-size N > 1, one process per rank
// under `mpirun -np N`): a command that runs the engine calls this once its
// engine_config_t is complete, before it reads requests or opens outputs.
// Returns 0 on rank 0 (and at N = 1): go on, rank 0 does all the command's
// work. Returns 1 when the command ends here with *status: on rank 0 when
// the ranks cannot be joined (not started by mpirun, another world size, a
// build without MPI: the message says which), and on every other rank once
// it has loaded its shard and followed rank 0's steps to the end (it
// reads, writes and prints nothing else).
int cli_tp_follower(const char *cmd, const engine_config_t *ec, int *status);

// --model as given: a directory, or a Hugging Face repo id ("Qwen/Qwen3-0.6B")
// whose snapshot is in the local Hub cache (HF_HUB_CACHE, HF_HOME/hub or
// ~/.cache/huggingface/hub; *model then points at it, and a line on stderr
// says so). Otherwise CLI_FAIL with a message that, for a repo id, gives
// the download command.
int cli_model_dir(const char *cmd, const char **model);

// Output helpers: a JSON list "[1, 2, 3]" and a JSON string, each on one line.
void cli_print_ids(FILE *f, const int32_t *ids, size_t n);
void cli_print_json_string(FILE *f, const char *s, size_t n);

// Read FILE ("-" = stdin) one line at a time, the line ending cut off, and
// call fn(line, len, line_no, ctx) for each (line_no from 1) until one
// returns non-zero, which is returned. A line holding a NUL byte is an
// error ("FILE:3: a NUL byte at column 7 ..."), not a shorter line, and so is
// a read error (a directory, an I/O error): not taken for the end of the file.
typedef int (*cli_line_fn)(const char *line, size_t len, long line_no, void *ctx);
int cli_for_each_line(const char *path, cli_line_fn fn, void *ctx);

// One JSONL line, line[0..len), parsed strictly: one JSON value with only
// spaces after it, no NUL in a string and no key twice (json_check_strict).
// NULL with mv_error() naming the problem and the field; the caller adds
// "FILE:LINE".
cJSON *cli_parse_json_line(const char *line, size_t len);

// ---- stopping on a signal -------------------------------------------------------------
// SIGINT and SIGTERM only set cli_stop_signal (sigaction; nothing else is
// safe in a handler); the engine reads it between steps (engine_hooks_t),
// stops, and the command writes what had finished and exits 128 + signal.
// SIGXFSZ is ignored too, so a file-size limit is a write error (EFBIG),
// reported, rather than the end of the process.
extern volatile sig_atomic_t cli_stop_signal;
void cli_catch_stop_signals(void);
// 128 + the signal: 130 for SIGINT, 143 for SIGTERM.
int cli_stop_status(void);
const char *cli_stop_signal_name(void);

// ---- output that never holds a cut line ------------------------------------------------
// Each record (a JSON line, a text block) is built in memory and written
// with write(2) straight to the file (nothing waits in a stdio buffer): it
// is on disk, or in the pipe, when cli_out_write returns. A short write
// (a full disk, a size limit) is cut back off with ftruncate, so a regular
// file only ever holds whole records, and the error stops the command.
typedef struct {
    int fd;
    const char *path;   // for messages; "standard output" for "-"
    off_t good;         // bytes of whole records written
    long records;       // whole records written
    int seekable;       // a regular file: a short write can be cut back off
} cli_out_t;
// "-" is standard output. Opened (created, truncated) at once, so that a bad
// path fails before the model loads. -1 with mv_error() naming the path.
int cli_out_open(cli_out_t *o, const char *path);
// All n bytes or, on a failure, none (cut back on a regular file): -1 with
// mv_error() naming the path, the error and how many records it holds.
int cli_out_write(cli_out_t *o, const char *s, size_t n);
int cli_out_close(cli_out_t *o);

// ---- files written whole or not at all --------------------------------------------------
// Written to PATH.tmp-PID beside PATH, then renamed over PATH (rename is
// atomic within a directory): PATH is the complete file or left as it was.
typedef struct {
    FILE *f;
    char *path, *tmp;
} cli_atomic_t;
// Before anything long runs: PATH's directory takes a new file (created and
// removed again) and PATH is not a directory. -1 with mv_error() naming it.
int cli_atomic_check(const char *path);
int cli_atomic_open(cli_atomic_t *a, const char *path);
// Flush, sync, close and rename into place. -1 with mv_error() (the
// temporary file removed).
int cli_atomic_commit(cli_atomic_t *a);
// Close and remove the temporary file; PATH is untouched. NULL f is fine.
void cli_atomic_abort(cli_atomic_t *a);
// Commands (cmd_tokenize.c).
int cmd_tokenize(int argc, char **argv);
int cmd_detokenize(int argc, char **argv);
// cmd_inspect.c
int cmd_inspect(int argc, char **argv);
// cmd_generate.c
int cmd_generate(int argc, char **argv);
// cmd_bench.c
int cmd_bench(int argc, char **argv);
// cmd_serve.c (with chapters/09-engine/serve/)
int cmd_serve(int argc, char **argv);
// cmd_chat.c
int cmd_chat(int argc, char **argv);

#ifdef __cplusplus
}
#endif
#endif

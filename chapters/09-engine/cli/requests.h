/*
 * chapters/09-engine/cli/requests.h - request lines of a JSONL file, read
 * once for every command that takes them (`generate --input`, `bench --input`).
 *
 * A line is one JSON object with exactly one of
 *   "prompt": "text"                 (needs the tokenizer)
 *   "prompt_token_ids": [1, 2, 3]    (works without a tokenizer)
 *   "messages": [{"role": "user", "content": "..."}], and optionally
 *       "add_generation_prompt" (default true here) and "enable_thinking"
 * and optionally "max_tokens", "temperature", "top_k", "top_p", "seed",
 * "ignore_eos", over the command's defaults for that line, "stop" (a
 * string or a list of up to 4, vLLM's stop strings: they need the
 * tokenizer) with "include_stop_str_in_output", "stop_token_ids",
 * "skip_special_tokens", and vLLM's other SamplingParams under their names
 * and ranges: "n" (the line becomes n requests, sample j drawn with seed +
 * j), "min_tokens", "min_p", "presence_penalty", "frequency_penalty",
 * "repetition_penalty", "logprobs" (an integer N: each token's
 * log-probability and the N likeliest ids'). Blank lines are
 * skipped. Anything else (an unknown key, a value of the wrong type, an id
 * outside the vocabulary, an empty prompt) is an error naming the file, the
 * line and the key: "requests.jsonl:3: \"max_tokens\" must be an integer >= 1".
 * So is what a lenient JSON reader would lose without a word: a NUL in a
 * string ("prompt": "a\u0000b" is refused, not read as "a"), a NUL byte in
 * the line, a key given twice (refused, rather than first or last wins), and
 * a read error (not taken for the end of the file).
 *
 * Tests: tests/test_engine_cpu.c (generate) and tests/test_bench.c (bench).
 */
#ifndef MV_CLI_REQUESTS_H
#define MV_CLI_REQUESTS_H

#include <stdint.h>

#include "chapters/08-scheduler/sched/sequence.h"
#include "chapters/09-engine/runtime/engine.h"
#include "chapters/09-engine/text/tokenizer.h"

#ifdef __cplusplus
extern "C" {
#endif

// One request, as read from a line (or given as a --prompt).
typedef struct {
    tok_ids_t prompt;            // the prompt's token ids
    sampling_params_t params;    // the defaults, with the line's own keys over them
    uint64_t seed;               // the line's "seed", else base_seed + the request's index
    long line_no;                // its line in the file (from 1); 0 for a --prompt
    int prompt_arg;              // which --prompt (from 0) when line_no is 0
    engine_stop_t stop;          // the line's "stop" strings and "stop_token_ids" (none: 0 of each;
                                 // malloc'd), "skip_special_tokens" false as keep_special
    int n;                       // the line's "n": it is n requests in a row, samples 0 .. n - 1
    int sample;                  // which of them this is (0 for a line without "n")
} cli_request_t;

// The largest "n" a line may ask for.
#define CLI_MAX_N 64

// The reader's settings (set by the caller) and the requests read so far.
// Zero-initialise, set the settings, read; free with cli_requests_free.
typedef struct {
    const char *path;            // the file, named in every message
    tokenizer_t *tokenizer;      // encodes "prompt" and "messages"; NULL: a line with them is an error
    const char *model_dir;       // named in that error
    const char *text_refused;    // non-NULL: why text prompts are refused whatever the tokenizer
    int chat;                    // 1: a text prompt becomes a user message of Qwen3's chat template
    int vocab_size;              // > 0: every id must be in [0, vocab_size)
    int need_max_tokens;         // 1: a line without "max_tokens" is an error
    sampling_params_t defaults;  // what a line does not say
    uint64_t base_seed;          // request i without "seed" gets base_seed + i
    cli_request_t *reqs;         // [n] in order: --prompts first, then the file's lines
    int n, cap;
} cli_requests_t;

// Every line of path ("-" = standard input), appended to c->reqs; the
// first bad line stops it: -1 with mv_error() "path:line: ...".
int cli_requests_read(cli_requests_t *c, const char *path);
// One line of c->path (set it first), line_no from 1; blank: nothing added.
// 0, or -1 with mv_error() "path:line: ..." (what cli_requests_read does per line).
int cli_requests_add_line(cli_requests_t *c, const char *line, size_t len, long line_no);
// A text prompt (a --prompt option, number prompt_arg from 0), appended.
int cli_requests_add_text(cli_requests_t *c, const char *text, int prompt_arg);
// Where request i came from, for messages: "path:line" or "--prompt #k".
void cli_requests_where(const cli_requests_t *c, int i, char *buf, size_t cap);
// The requests as the engine takes them: [c->n], pointing into c (which
// must outlive them); free() the array.
engine_request_t *cli_requests_to_engine(const cli_requests_t *c);
// Their stops, as engine_run_stops takes them: [c->n], pointing into c; free() the array.
engine_stop_t *cli_requests_stops(const cli_requests_t *c);
void cli_requests_free(cli_requests_t *c);

#ifdef __cplusplus
}
#endif
#endif

/*
 * chapters/09-engine/cli/cmd_generate.c - `minivllm generate`: prompts in,
 * generated tokens out, through the engine (engine.h).
 *
 *   minivllm generate --model DIR --prompt "Hello" --max-tokens 32
 *   minivllm generate --model DIR --input requests.jsonl --output out.jsonl
 *
 * A line of requests.jsonl is one request, with exactly one of
 *   "prompt": "text"                 (needs the tokenizer in DIR)
 *   "prompt_token_ids": [1, 2, 3]    (works without a tokenizer)
 *   "messages": [{"role": "user", "content": "..."}], and optionally
 *       "add_generation_prompt" (default true here) and "enable_thinking"
 * and optionally "max_tokens", "temperature", "top_k", "top_p", "seed",
 * "ignore_eos", which override the command line's values for that line,
 * and "stop" (a string or up to 4: vLLM's stop strings, matched on the text
 * as it is generated; the request ends at once, its text cut before the
 * string) with "include_stop_str_in_output" (keep the string in the text),
 * and vLLM's other sampling keys (requests.h: stop_token_ids, n, min_tokens,
 * min_p, the three penalties, logprobs, skip_special_tokens).
 * (cli/requests.c reads these lines, for `bench --input` too.)
 * Every request is submitted at once and batched continuously. Each result
 * is written the moment its request finishes, one JSON line each, in the
 * order requests finish (the "index" says which request it is; --ordered
 * writes them in input order instead, each as soon as it and every request
 * before it are done):
 *   {"index":0,"token_ids":[...],"text":"...","finish_reason":"stop","stop_reason":null}
 * (stop_reason as vLLM's: the stop string or stop token id that ended it;
 * a line with "n" > 1 gives n records, each with "sample": j; with
 * "logprobs": N each record has "logprobs": [{"token_id", "logprob",
 * "top_logprobs": [N of {"token_id", "logprob"}]}, one per token], of the
 * raw logits, -inf written as -9999.0 as vLLM's server does).
 * (text is "" without a tokenizer). --stream (one text prompt) prints
 * the text on stdout as tokens are sampled, flushed per token, then a
 * newline; the JSON line still goes to --output when it is given. A line is written whole with one
 * write(2), not buffered: a crash or a kill loses only what had not finished,
 * and the file never holds a cut line (cli_out_t: a short write is cut back
 * off, and the write error stops the run with exit status 1).
 *
 * Bad input is all or nothing: an unknown key, a value of the wrong type,
 * an id outside the vocabulary, an empty prompt, max_tokens < 1, a prompt
 * longer than --max-model-len... stops the command before anything runs,
 * with exit status 1 and a message naming the file, the line and the key.
 * Wrong arguments exit 2 naming the argument. --output is opened (and so
 * checked) before the model loads: a bad path costs nothing.
 *
 * A request that fails while running (logits with no finite value) ends
 * alone: its line says "finish_reason":"error" and "error":"why", with the
 * tokens it had; the others run to their end, and the exit status is 1.
 * An id the tokenizer does not know (the model's vocabulary is padded past
 * the tokenizer's) has no text and fails nothing; how many were generated is
 * said on stderr.
 *
 * SIGINT or SIGTERM: the engine stops between two steps, every result that
 * had finished is on disk (with --ordered, the finished ones still held back
 * are written then, in input order), the requests that had not are named on
 * stderr, and the exit status is 130 (SIGINT) or 143 (SIGTERM).
 *
 * --logits-out FILE.npy saves, for every request in input order, the logits
 * of its first generated token (the prefill's last position: what the first
 * sampling step saw), as one NumPy .npy array, float32 [num_requests, vocab]:
 * numpy.load(FILE) reads it, and tests/gpu/compare_hf.py compares it with
 * transformers. The format (numpy's NEP 1, version 1.0) is simple enough to
 * read by hand: the 6 bytes "\x93NUMPY", the bytes 1 and 0 (the version), a
 * little-endian uint16 HLEN, HLEN bytes of a Python dict literal such as
 *   {'descr': '<f4', 'fortran_order': False, 'shape': (3, 151936), }
 * padded with spaces and ending in '\n' so that the data starts at a
 * multiple of 64 bytes, then the rows, little-endian float32, row-major.
 * The file is written whole or not at all: the rows go to FILE.npy.tmp-PID,
 * renamed to FILE.npy once every row is there; a failure or a signal removes
 * it. Its directory is checked before the model loads.
 */
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

#include "chapters/09-engine/cli/cli.h"
#include "chapters/09-engine/cli/requests.h"
#include "chapters/09-engine/runtime/engine.h"
#include "common/check.h"

static const char GENERATE_USAGE[] =
    "usage: minivllm generate --model DIR [--prompt TEXT]... [--input FILE.jsonl] [--output FILE.jsonl]\n"
    "                         [--ordered] [--chat] [--stream] [--max-tokens N] [--temperature T] [--top-k K] [--top-p P]\n"
    "                         [--seed S] [--ignore-eos] [--logits-out FILE.npy] [--random-weights]\n"
    "                         [--device cpu|cuda] [engine sizes...]\n"
    "\n"
    "Generate text with a Qwen3 model directory (config.json, safetensors weights, and\n"
    "tokenizer.json for text prompts). Requests come from --prompt (repeatable) and from the\n"
    "lines of --input (\"-\" = stdin); each line is a JSON object with one of \"prompt\" (text),\n"
    "\"prompt_token_ids\" (a list of ids) or \"messages\" (a chat), and optionally \"max_tokens\",\n"
    "\"temperature\", \"top_k\", \"top_p\", \"seed\", \"ignore_eos\", \"stop\" (a string or up to 4) and\n"
    "\"include_stop_str_in_output\". All requests run together\n"
    "(continuous batching). Each result is written as its request finishes, in finish order\n"
    "(--ordered: in input order). With --output, one JSON line per request:\n"
    "  {\"index\": 0, \"token_ids\": [...], \"text\": \"...\", \"finish_reason\": \"stop\"|\"length\"|\"error\",\n"
    "   \"stop_reason\": null|\"stop string\"|stop token id}\n"
    "(with \"error\": \"why\" when a request failed alone); without it, each request's text (or\n"
    "ids, without a tokenizer) on stdout. --stream (one --prompt): the text on stdout as it is\n"
    "sampled, then a newline (the JSON line to --output FILE when given).\n"
    "--logits-out FILE.npy: each request's first-step logits, float32 [requests, vocab] (numpy .npy).\n"
    "--random-weights: no weights file (DIR needs only config.json), seeded random weights drawn from\n"
    "--seed as `minivllm bench --random-weights` draws them: real shapes, nonsense text; prompts as ids.\n"
    "Sampling defaults come from generation_config.json (temperature 0 = greedy). A request\n"
    "without \"seed\" gets seed S + its index (S = --seed, default 0): reruns are identical.\n"
    "--device: cuda (bf16 on the GPU, sampling there too) when a CUDA GPU is present, else cpu\n"
    "(fp32 activations); --device cuda without a GPU is an error.\n"
    "Exit status: 0; 1 bad input or a failed request (the others are written); 2 bad arguments;\n"
    "130 / 143 stopped by SIGINT / SIGTERM (what had finished is written, the rest named).";

// The requests (requests.h), the engine that runs them, and where the results go.
typedef struct {
    engine_t *e;
    cli_requests_t rq;
    cli_out_t out;                // --output, or standard output
    int jsonl;                    // --output given: JSON lines, else text
    int ordered;                  // --ordered: input order
    const engine_output_t *outs;  // [rq.n] the engine's, filled as requests finish
    unsigned char *written;       // [rq.n] 1 once request i is written
    int next;                     // --ordered: the first request not yet written
    tok_bytes_t text, rec;        // scratch: decoded text, the record being built
    struct logits_out *lo;        // --logits-out's file (its path NULL without the option)
    int stream;                   // --stream: the one request's text on stdout as it is sampled
    stop_text_t dec;              // --stream's decoder (no stop strings: the text as format_output decodes it)
} gen_ctx_t;

static int append_str(tok_bytes_t *b, const char *s) { return tok_bytes_append(b, s, strlen(s)); }

static int append_ids(tok_bytes_t *b, const int32_t *ids, int n, const char *sep) {
    int rc = append_str(b, "[");
    for (int k = 0; !rc && k < n; k++) rc = tok_bytes_appendf(b, k ? "%s%d" : "%.0s%d", sep, ids[k]);
    return rc || append_str(b, "]") ? -1 : 0;
}

// A log-probability as JSON: -inf (a token that could not have been drawn)
// as vLLM's server writes it, -9999.0; %.9g gives the float back exactly.
static int append_lp(tok_bytes_t *b, float lp) { return tok_bytes_appendf(b, "%.9g", lp < -9999.0f ? -9999.0 : (double)lp); }

// "logprobs": [{"token_id", "logprob", "top_logprobs": [{"token_id", "logprob"}, ...]}, ...],
// one per generated token (vLLM's per-position logprobs, of the raw logits).
static int append_logprobs(tok_bytes_t *b, const engine_output_t *o) {
    int rc = append_str(b, ",\"logprobs\":[");
    for (int t = 0; !rc && t < o->num_tokens; t++) {
        const engine_logprob_t *lp = &o->logprobs[t];
        rc = tok_bytes_appendf(b, "%s{\"token_id\":%d,\"logprob\":", t ? "," : "", o->token_ids[t]) ||
             append_lp(b, lp->logprob) || append_str(b, ",\"top_logprobs\":[");
        for (int k = 0; !rc && k < lp->num_top && lp->top_ids[k] >= 0; k++)
            rc = tok_bytes_appendf(b, "%s{\"token_id\":%d,\"logprob\":", k ? "," : "", lp->top_ids[k]) ||
                 append_lp(b, lp->top_logprobs[k]) || append_str(b, "}");
        if (!rc) rc = append_str(b, "]}");
    }
    return rc || append_str(b, "]");
}

// Request i's record: a JSON line, or a text block, built whole in c->rec.
static int format_output(gen_ctx_t *c, int i, const engine_output_t *o) {
    tok_bytes_t *b = &c->rec;
    b->len = 0;
    c->text.len = 0;
    // Unknown ids (padding rows) decode to no text: decoding cannot fail on them.
    int rc = tok_bytes_append(&c->text, "", 0);
    if (!rc && o->text) rc = tok_bytes_append(&c->text, o->text, o->text_len);  // cut at a stop string
    else if (!rc && c->e->tokenizer)
        rc = tokenizer_decode(c->e->tokenizer, o->token_ids, (size_t)o->num_tokens, !c->rq.reqs[i].stop.keep_special,
                              &c->text);
    if (rc) return -1;
    const char *reason = engine_output_finish_reason(o);
    if (!c->jsonl) {
        rc = tok_bytes_appendf(b, "== request %d (%s, %d tokens, finish_reason %s", i, c->rq.reqs[i].line_no ? "input" : "prompt",
                        o->num_tokens, reason);
        if (!rc && o->error) rc = append_str(b, ": ") || append_str(b, o->error);
        if (!rc) rc = append_str(b, ")\n");
        if (!rc && c->e->tokenizer) rc = tok_bytes_append(b, c->text.data, c->text.len);
        else if (!rc) rc = append_ids(b, o->token_ids, o->num_tokens, ", ");
        return rc || append_str(b, "\n") ? -1 : 0;
    }
    // By hand rather than with cJSON's printer, which would stop a text at a NUL (byte 0's token decodes to one).
    rc = tok_bytes_appendf(b, "{\"index\":%d,\"token_ids\":", i) || append_ids(b, o->token_ids, o->num_tokens, ",") ||
         append_str(b, ",\"text\":") || tok_bytes_append_json(b, c->text.data, c->text.len) ||
         tok_bytes_appendf(b, ",\"finish_reason\":\"%s\"", reason);
    if (!rc && o->error) rc = append_str(b, ",\"error\":") || tok_bytes_append_json(b, o->error, strlen(o->error));
    // vLLM's stop_reason: the stop string or stop token id that ended it, else null.
    if (!rc) rc = append_str(b, ",\"stop_reason\":");
    if (!rc && o->stop_str) rc = tok_bytes_append_json(b, o->stop_str, strlen(o->stop_str));
    else if (!rc && o->stop_token_id >= 0) rc = tok_bytes_appendf(b, "%d", o->stop_token_id);
    else if (!rc) rc = append_str(b, "null");
    if (!rc && c->rq.reqs[i].n > 1) rc = tok_bytes_appendf(b, ",\"sample\":%d", c->rq.reqs[i].sample);
    if (!rc && o->logprobs) rc = append_logprobs(b, o);
    return rc || append_str(b, "}\n") ? -1 : 0;
}

// --stream: what is settled of the text, on stdout now.
static int stream_out(gen_ctx_t *c) {
    size_t n;
    const char *p = stop_text_take(&c->dec, &n);
    if ((n && fwrite(p, 1, n, stdout) != n) || fflush(stdout)) return mv_error("stdout: %s", strerror(errno));
    return 0;
}

// engine_hooks_t.on_token (--stream): decoded as format_output decodes (special tokens skipped).
static void stream_token(void *ctx, int request, int32_t token, int stop, const engine_logprob_t *lp) {
    gen_ctx_t *c = ctx;
    (void)request, (void)stop;
    if (c->e->tokenizer && stop_text_push(&c->dec, token) >= 0) stream_out(c);
}

static int write_output(gen_ctx_t *c, int i) {
    if (c->stream) {
        // The end of the streamed text; the record itself only to --output FILE.
        if ((c->e->tokenizer && (stop_text_finish(&c->dec) || stream_out(c))) || fputs("\n", stdout) == EOF ||
            fflush(stdout))
            return -1;
        if (!c->jsonl) {
            c->written[i] = 1;
            return 0;
        }
    }
    if (format_output(c, i, &c->outs[i]) || cli_out_write(&c->out, c->rec.data, c->rec.len)) return -1;
    c->written[i] = 1;
    return 0;
}

// engine_finished_fn: write request i now (finish order), or every request
// that is now next in input order (--ordered).
static int on_finished(void *ctx, int i, const engine_output_t *o) {
    gen_ctx_t *c = ctx;
    (void)o;
    if (!c->ordered) return write_output(c, i);
    for (; c->next < c->rq.n && c->outs[c->next].done; c->next++)
        if (write_output(c, c->next)) return -1;
    return 0;
}

// After a stop: with --ordered, the finished requests held back behind an unfinished one.
static int write_held_back(gen_ctx_t *c) {
    for (int i = 0; i < c->rq.n; i++)
        if (c->outs[i].done && !c->written[i] && write_output(c, i)) return -1;
    return 0;
}

// Every "--prompt TEXT" / "--prompt=TEXT" (cli_parse keeps only the last).
static int collect_prompts(int argc, char **argv, const char ***out) {
    static const char *const FLAGS[] = {"--chat", "--ignore-eos", "--no-prefix-caching", "--enforce-eager",
                                        "--no-async-scheduling", "--ordered", "--stream", "--random-weights"};
    int n = 0;
    *out = calloc((size_t)argc, sizeof **out);
    for (int i = 1; *out && i < argc; i++) {
        int flag = 0;
        for (size_t k = 0; k < sizeof FLAGS / sizeof *FLAGS; k++) flag |= strcmp(argv[i], FLAGS[k]) == 0;
        if (strcmp(argv[i], "--prompt") == 0 && i + 1 < argc) (*out)[n++] = argv[++i];
        else if (strncmp(argv[i], "--prompt=", 9) == 0) (*out)[n++] = argv[i] + 9;
        else if (argv[i][0] == '-' && argv[i][1] == '-' && !strchr(argv[i], '=') && i + 1 < argc && !flag)
            i++;  // an option's value, even one that looks like "--prompt"
    }
    return n;
}

// ---- --logits-out: the first step's logits as a .npy file (see the header) ----------------

// The .npy layout is little-endian float32: this writer copies the host's floats as they are.
_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "--logits-out writes host floats as '<f4'");

typedef struct logits_out {
    cli_atomic_t file;     // FILE.npy.tmp-PID until every row is in, then FILE.npy
    const char *path;
    int n, vocab;          // the array's shape [n, vocab]
    long header;           // bytes before row 0
    unsigned char *seen;   // [n] 1 once request i's row is written
    char error[512];       // the first failure inside the hook (it cannot return one)
} logits_out_t;

// NEP 1 version 1.0: magic, version, uint16 header length, dict, padding to 64, '\n'.
static int npy_write_header(logits_out_t *o) {
    char dict[128];
    int len = snprintf(dict, sizeof dict, "{'descr': '<f4', 'fortran_order': False, 'shape': (%d, %d), }", o->n,
                       o->vocab);
    int pad = (64 - (10 + len + 1) % 64) % 64;
    int hlen = len + pad + 1;
    unsigned char pre[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, (unsigned char)(hlen & 0xff), (unsigned char)(hlen >> 8)};
    FILE *f = o->file.f;
    int ok = fwrite(pre, 1, sizeof pre, f) == sizeof pre && fwrite(dict, 1, (size_t)len, f) == (size_t)len &&
             fprintf(f, "%*s\n", pad, "") == pad + 1;
    o->header = 10 + hlen;
    return ok ? 0 : mv_error("cannot write %s: %s", o->path, strerror(errno));
}

// engine_logits_fn: keep the row of each request's first sampled token, at its place in the file.
static void save_first_logits(void *ctx, int request, int gen_index, const float *logits, int vocab) {
    logits_out_t *o = ((gen_ctx_t *)ctx)->lo;
    if (gen_index != 0 || o->error[0] || request < 0 || request >= o->n || o->seen[request]) return;
    if (vocab != o->vocab) {
        snprintf(o->error, sizeof o->error, "%s: a logits row has %d entries, and the vocabulary %d", o->path, vocab,
                 o->vocab);
        return;
    }
    off_t at = (off_t)o->header + (off_t)request * vocab * (off_t)sizeof(float);
    if (fseeko(o->file.f, at, SEEK_SET) || fwrite(logits, sizeof(float), (size_t)vocab, o->file.f) != (size_t)vocab) {
        snprintf(o->error, sizeof o->error, "cannot write %s: %s", o->path, strerror(errno));
        return;
    }
    o->seen[request] = 1;
}

// After generation: every row written and the file renamed into place, or
// (ok == 0: the run failed or stopped) the temporary file removed.
static int logits_out_finish(logits_out_t *o, int ok) {
    int rc = 0;
    if (ok && o->error[0]) rc = mv_error("%s", o->error);
    for (int i = 0; ok && !rc && i < o->n; i++)
        if (!o->seen[i]) rc = mv_error("%s: request %d produced no first-step logits", o->path, i);
    if (ok && !rc) rc = cli_atomic_commit(&o->file);
    else cli_atomic_abort(&o->file);
    free(o->seen);
    o->seen = NULL;
    return rc;
}

typedef struct {
    const char *model, *input, *output, *prompt, *max_tokens, *temperature, *top_k, *top_p, *seed, *logits_out;
    cli_engine_args_t eng;
    int chat, ignore_eos, ordered, stream, random_weights;
} gen_args_t;

// The command line's sampling values over generation_config.json's.
static int sampling_options(const gen_args_t *a, const qwen3_config_t *m, sampling_params_t *p, uint64_t *seed) {
    long max_tokens = 16, top_k = m->top_k, s = 0;
    *p = (sampling_params_t){.temperature = m->temperature, .top_k = m->top_k, .top_p = m->top_p, .max_tokens = 16, .ignore_eos = a->ignore_eos};
    const char *cmd = "generate";
    if (cli_parse_long(cmd, "--max-tokens", a->max_tokens, 1, INT_MAX, &max_tokens) ||
        cli_parse_float(cmd, "--temperature", a->temperature, 0, 1e6, 0, &p->temperature) ||
        cli_parse_long(cmd, "--top-k", a->top_k, 0, INT_MAX, &top_k) ||
        cli_parse_float(cmd, "--top-p", a->top_p, 0, 1, 1, &p->top_p) || cli_parse_long(cmd, "--seed", a->seed, 0, LONG_MAX, &s))
        return CLI_USAGE;
    p->max_tokens = (int)max_tokens;
    p->top_k = (int)top_k;
    *seed = (uint64_t)s;
    return CLI_OK;
}

// Up to `max` requests with done == want_done (or with an error when
// want_error), as "path:line (request i): message" or "path:line", on stderr.
static void list_requests(const gen_ctx_t *c, int want_done, int want_error, int max) {
    int shown = 0, total = 0;
    for (int i = 0; i < c->rq.n; i++) {
        const engine_output_t *o = &c->outs[i];
        if (o->done != want_done || (want_error && !o->error)) continue;
        if (shown++ < max) {
            char where[512];
            cli_requests_where(&c->rq, i, where, sizeof where);
            fprintf(stderr, "  request %d (%s)%s%s\n", i, where, want_error ? ": " : "", want_error ? o->error : "");
        }
        total++;
    }
    if (total > max) fprintf(stderr, "  ... and %d more\n", total - max);
}

// What the run left: failed requests, unknown ids, a stop. Returns the exit status.
static int report(gen_ctx_t *c, int stopped, const engine_config_t *ec) {
    const engine_t *e = c->e;
    const int n = c->rq.n;
    if (e->num_unknown_tokens > 0)
        fprintf(stderr, "minivllm generate: %lld generated ids are padding rows the tokenizer does not know (it has %d "
                        "ids, the model's vocabulary %d rows): they have no text\n",
                e->num_unknown_tokens, tokenizer_n_ids(e->tokenizer), e->model.vocab_size);
    if (e->num_failed > 0) {
        fprintf(stderr, "minivllm generate: %d of %d requests failed (finish_reason \"error\" in %s; the others "
                        "ran to their end):\n",
                e->num_failed, n, c->out.path);
        list_requests(c, 1, 1, 10);
    }
    if (stopped) {
        fprintf(stderr, "minivllm generate: stopped by %s after %lld steps: %d of %d requests finished and are "
                        "written to %s; these %d did not:\n",
                cli_stop_signal_name(), e->num_steps, e->num_finished, n, c->out.path, n - e->num_finished);
        list_requests(c, 0, 0, 20);
        return cli_stop_status();
    }
    if (ec->progress)
        fprintf(stderr, "minivllm: %d requests, %lld prompt tokens (%lld from the prefix cache), %lld generated "
                        "in %lld steps, %.2f s (%.1f tok/s generated)\n",
                n, e->num_prompt_tokens, e->num_cached_tokens, e->num_generated_tokens, e->num_steps, e->elapsed_s,
                (double)e->num_generated_tokens / (e->elapsed_s > 0 ? e->elapsed_s : 1));
    return e->num_failed ? CLI_FAIL : CLI_OK;
}

// The model and the requests are ready: run, writing results as they finish.
static int run_requests(gen_ctx_t *c, logits_out_t *lo, const engine_config_t *ec) {
    const int n = c->rq.n;
    engine_request_t *reqs = cli_requests_to_engine(&c->rq);
    engine_stop_t *stops = cli_requests_stops(&c->rq);
    engine_output_t *outs = calloc((size_t)(n ? n : 1), sizeof *outs);
    c->written = calloc((size_t)(n ? n : 1), 1);
    c->outs = outs;
    int rc = reqs && stops && outs && c->written ? 0 : mv_error("out of memory");
    if (!rc && lo->path) {
        lo->n = n;
        lo->seen = calloc((size_t)n, 1);
        rc = !lo->seen ? mv_error("out of memory") : cli_atomic_open(&lo->file, lo->path) ? -1 : npy_write_header(lo);
    }
    int st = CLI_FAIL;
    if (!rc) {
        c->lo = lo;
        const engine_hooks_t hooks = {lo->path ? save_first_logits : NULL, on_finished, &cli_stop_signal, c,
                                      c->stream ? stream_token : NULL};
        cli_catch_stop_signals();
        rc = engine_run_stops(c->e, reqs, stops, n, outs, &hooks);
        if (rc < 0 && c->e->failed_request >= 0) {
            char where[512];
            cli_requests_where(&c->rq, c->e->failed_request, where, sizeof where);
            mv_error_prefix("%s", where);
        }
        if (rc == ENGINE_STOPPED && write_held_back(c)) rc = -1;
        if (lo->path && logits_out_finish(lo, rc == 0) && rc == 0) rc = -1;
        if (rc >= 0) st = report(c, rc == ENGINE_STOPPED, ec);
        if (rc == ENGINE_STOPPED && lo->path)
            fprintf(stderr, "minivllm generate: --logits-out %s not written (the run did not finish)\n", lo->path);
    } else if (lo->path) {
        logits_out_finish(lo, 0);
    }
    if (rc < 0) cli_error("generate", CLI_FAIL, "%s", mv_last_error());
    engine_outputs_free(outs, n);
    free(outs);
    free(reqs);
    free(stops);
    free(c->written);
    return rc < 0 ? CLI_FAIL : st;
}

static int run_generate(gen_args_t *a, const char **prompts, int n_prompts) {
    engine_config_t ec = engine_config_default(a->model);
    int st = cli_engine_config("generate", &a->eng, &ec);
    if (st) return st;
    ec.progress = isatty(STDERR_FILENO);
    // --random-weights: drawn from --seed as bench draws them, on every rank
    // (each rank draws the whole model, then keeps its shard).
    long weights_seed = 0;
    if (a->random_weights && cli_parse_long("generate", "--seed", a->seed, 0, LONG_MAX, &weights_seed))
        return CLI_USAGE;
    ec.random_weights = a->random_weights;
    ec.weights_seed = (uint64_t)weights_seed;
    if (cli_tp_follower("generate", &ec, &st)) return st;  // ranks other than 0 end here
    gen_ctx_t c = {.rq = {.path = a->input, .model_dir = a->model, .chat = a->chat},
                   .jsonl = a->output != NULL, .ordered = a->ordered, .stream = a->stream};
    // Parse the numbers before loading anything: a typo costs nothing.
    qwen3_config_t mc;
    if (qwen3_config_load(a->model, &mc)) return cli_error("generate", CLI_FAIL, "%s", mv_last_error());
    if ((st = sampling_options(a, &mc, &c.rq.defaults, &c.rq.base_seed))) return st;
    c.rq.vocab_size = mc.vocab_size;
    logits_out_t lo = {.path = a->logits_out, .vocab = mc.vocab_size};
    // Where the results go, checked before the model loads. "--output -" is
    // standard output in JSONL form, as "--input -" is standard input.
    if (lo.path && cli_atomic_check(lo.path))
        return cli_error("generate", CLI_FAIL, "--logits-out: %s", mv_last_error());
    if (cli_out_open(&c.out, a->output ? a->output : "-")) return cli_error("generate", CLI_FAIL, "%s", mv_last_error());
    int rc = engine_create(&ec, &c.e) ? -1 : 0;
    if (!rc) {
        c.rq.tokenizer = c.e->tokenizer;
        for (int i = 0; i < n_prompts && !rc; i++) rc = cli_requests_add_text(&c.rq, prompts[i], i);
        if (!rc && a->input) rc = cli_requests_read(&c.rq, a->input);
        if (!rc && c.rq.n == 0) rc = mv_error("no requests: give --prompt or a non-empty --input");
        if (!rc && c.stream && !c.e->tokenizer)
            rc = mv_error("--stream prints text, and %s has no tokenizer.json", a->model);
        if (!rc && c.stream) rc = stop_text_init(&c.dec, c.e->tokenizer, NULL, 0, 0, 1);
    }
    if (rc) st = cli_error("generate", CLI_FAIL, "%s", mv_last_error());
    else st = run_requests(&c, &lo, &ec);
    if (cli_out_close(&c.out) && st == CLI_OK) st = cli_error("generate", CLI_FAIL, "%s", mv_last_error());
    tok_bytes_free(&c.text);
    tok_bytes_free(&c.rec);
    stop_text_free(&c.dec);
    cli_requests_free(&c.rq);
    engine_free(c.e);
    return st;
}

int cmd_generate(int argc, char **argv) {
    gen_args_t a = {0};
    const cli_opt_t own[] = {
        {"--model", "DIR", "Hugging Face model directory", &a.model, NULL},
        {"--prompt", "TEXT", "a text prompt (repeatable; needs tokenizer.json)", &a.prompt, NULL},
        {"--input", "FILE", "JSON lines of requests (\"-\" = stdin)", &a.input, NULL},
        {"--output", "FILE", "write one JSON line per request here, - for stdout (default: text on stdout)", &a.output, NULL},
        {"--ordered", NULL, "write results in input order (default: each as its request finishes)", NULL, &a.ordered},
        {"--chat", NULL, "wrap each text prompt as a user message (Qwen3 chat template)", NULL, &a.chat},
        {"--stream", NULL, "one --prompt: print its text as it is sampled (the JSON line to --output FILE)", NULL,
         &a.stream},
        {"--max-tokens", "N", "tokens to generate per request (default 16)", &a.max_tokens, NULL},
        {"--temperature", "T", "0 = greedy (default: generation_config.json, else 1)", &a.temperature, NULL},
        {"--top-k", "K", "keep the K most likely tokens, 0 = off (default: generation_config.json)", &a.top_k, NULL},
        {"--top-p", "P", "nucleus in (0, 1], 1 = off (default: generation_config.json)", &a.top_p, NULL},
        {"--seed", "S", "request i without \"seed\" uses S + i (default 0)", &a.seed, NULL},
        {"--ignore-eos", NULL, "keep generating after an end-of-sequence token", NULL, &a.ignore_eos},
        {"--logits-out", "FILE", "save each request's first-step logits, float32 [requests, vocab], as .npy",
         &a.logits_out, NULL},
        {"--random-weights", NULL, "no weights file: seeded random weights (from --seed) for config.json's shapes",
         NULL, &a.random_weights},
    };
    enum { N_OWN = sizeof own / sizeof *own };
    cli_opt_t opts[N_OWN + CLI_ENGINE_N_OPTS];
    memcpy(opts, own, sizeof own);
    int n_opts = N_OWN + cli_engine_opts(&a.eng, opts + N_OWN);
    int st = cli_parse("generate", GENERATE_USAGE, opts, n_opts, argc, argv);
    if (st == CLI_HELP) return CLI_OK;
    if (st != CLI_OK) return st;
    if (!a.model) return cli_error("generate", CLI_USAGE, "--model DIR is required");
    {
        const int mst = cli_model_dir("generate", &a.model);
        if (mst != CLI_OK) return mst;
    }
    if (a.logits_out && (!*a.logits_out || !strcmp(a.logits_out, "-")))
        return cli_error("generate", CLI_USAGE, "--logits-out needs a file path (the .npy is binary: not stdout)");
    const char **prompts;
    int n_prompts = collect_prompts(argc, argv, &prompts);
    if (!prompts) return cli_error("generate", CLI_FAIL, "out of memory");
    if (n_prompts == 0 && !a.input) {
        free(prompts);
        return cli_error("generate", CLI_USAGE, "give --prompt TEXT or --input FILE.jsonl");
    }
    if (a.stream && (n_prompts != 1 || a.input || (a.output && !strcmp(a.output, "-")))) {
        free(prompts);
        return cli_error("generate", CLI_USAGE,
                         "--stream prints one prompt's text on stdout: give exactly one --prompt, no --input, "
                         "and --output FILE (not -) for the JSON line");
    }
    st = run_generate(&a, prompts, n_prompts);
    free(prompts);
    return st;
}

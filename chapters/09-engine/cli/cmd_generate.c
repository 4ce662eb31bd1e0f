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
 * "ignore_eos", which override the command line's values for that line.
 * (cli/requests.c reads these lines, for `bench --input` too.)
 * Every request is submitted at once and batched continuously; the outputs
 * come back in input order, one JSON line each:
 *   {"index": 0, "token_ids": [...], "text": "...", "finish_reason": "stop"}
 * (text is "" without a tokenizer).
 *
 * Bad input is all or nothing: an unknown key, a value of the wrong type,
 * an id outside the vocabulary, an empty prompt, max_tokens < 1, a prompt
 * longer than --max-model-len... stops the command before anything runs,
 * with exit status 1 and a message naming the file, the line and the key.
 * Wrong arguments exit 2 naming the argument.
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
 * The file is opened before the model loads, so a bad path costs nothing.
 */
#include <cjson/cJSON.h>
#include <errno.h>
#include <limits.h>
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
    "                         [--chat] [--max-tokens N] [--temperature T] [--top-k K] [--top-p P]\n"
    "                         [--seed S] [--ignore-eos] [--logits-out FILE.npy] [--device cpu|cuda] [engine sizes...]\n"
    "\n"
    "Generate text with a Qwen3 model directory (config.json, safetensors weights, and\n"
    "tokenizer.json for text prompts). Requests come from --prompt (repeatable) and from the\n"
    "lines of --input (\"-\" = stdin); each line is a JSON object with one of \"prompt\" (text),\n"
    "\"prompt_token_ids\" (a list of ids) or \"messages\" (a chat), and optionally \"max_tokens\",\n"
    "\"temperature\", \"top_k\", \"top_p\", \"seed\", \"ignore_eos\". All requests run together\n"
    "(continuous batching). With --output, one JSON line per request, in input order:\n"
    "  {\"index\": 0, \"token_ids\": [...], \"text\": \"...\", \"finish_reason\": \"stop\"|\"length\"}\n"
    "without it, each request's text (or ids, without a tokenizer) on stdout.\n"
    "--logits-out FILE.npy: each request's first-step logits, float32 [requests, vocab] (numpy .npy).\n"
    "Sampling defaults come from generation_config.json (temperature 0 = greedy). A request\n"
    "without \"seed\" gets seed S + its index (S = --seed, default 0): reruns are identical.\n"
    "--device: cuda (bf16 on the GPU, sampling there too) when a CUDA GPU is present, else cpu\n"
    "(fp32 activations); --device cuda without a GPU is an error.";

// The requests (requests.h) and the engine that runs them.
typedef struct {
    engine_t *e;
    cli_requests_t rq;
} gen_ctx_t;

static int write_outputs(const gen_ctx_t *c, const engine_output_t *outs, FILE *f, int jsonl) {
    tok_bytes_t text = {0};
    int rc = 0;
    for (int i = 0; i < c->rq.n && !rc; i++) {
        text.len = 0;
        if (c->e->tokenizer &&
            tokenizer_decode(c->e->tokenizer, outs[i].token_ids, (size_t)outs[i].num_tokens, 1, &text))
            rc = -1;
        if (!text.data) rc = rc ? rc : tok_bytes_append(&text, "", 0);
        if (rc) break;
        if (!jsonl) {
            fprintf(f, "== request %d (%s, %d tokens, finish_reason %s)\n", i, c->rq.reqs[i].line_no ? "input" : "prompt",
                    outs[i].num_tokens, engine_finish_reason(outs[i].finish_reason));
            if (c->e->tokenizer) fprintf(f, "%s\n", text.data);
            else cli_print_ids(f, outs[i].token_ids, (size_t)outs[i].num_tokens);
            continue;
        }
        cJSON *o = cJSON_CreateObject();
        cJSON *ids = cJSON_CreateArray();
        for (int k = 0; o && ids && k < outs[i].num_tokens; k++)
            cJSON_AddItemToArray(ids, cJSON_CreateNumber(outs[i].token_ids[k]));
        cJSON_AddNumberToObject(o, "index", i);
        cJSON_AddItemToObject(o, "token_ids", ids);
        cJSON_AddStringToObject(o, "text", text.data);  // decoded text never holds a NUL: U+FFFD replaces bad bytes
        cJSON_AddStringToObject(o, "finish_reason", engine_finish_reason(outs[i].finish_reason));
        char *s = cJSON_PrintUnformatted(o);
        if (!s) rc = mv_error("out of memory");
        else fprintf(f, "%s\n", s);
        free(s);
        cJSON_Delete(o);
    }
    tok_bytes_free(&text);
    return rc;
}

// Every "--prompt TEXT" / "--prompt=TEXT" (cli_parse keeps only the last).
static int collect_prompts(int argc, char **argv, const char ***out) {
    int n = 0;
    *out = calloc((size_t)argc, sizeof **out);
    for (int i = 1; *out && i < argc; i++) {
        if (strcmp(argv[i], "--prompt") == 0 && i + 1 < argc) (*out)[n++] = argv[++i];
        else if (strncmp(argv[i], "--prompt=", 9) == 0) (*out)[n++] = argv[i] + 9;
        else if (argv[i][0] == '-' && argv[i][1] == '-' && !strchr(argv[i], '=') && i + 1 < argc &&
                 strcmp(argv[i], "--chat") && strcmp(argv[i], "--ignore-eos") && strcmp(argv[i], "--no-prefix-caching"))
            i++;  // an option's value, even one that looks like "--prompt"
    }
    return n;
}

// ---- --logits-out: the first step's logits as a .npy file (see the header) ----------------

// The .npy layout is little-endian float32: this writer copies the host's floats as they are.
_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "--logits-out writes host floats as '<f4'");

typedef struct {
    FILE *f;
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
    int ok = fwrite(pre, 1, sizeof pre, o->f) == sizeof pre && fwrite(dict, 1, (size_t)len, o->f) == (size_t)len &&
             fprintf(o->f, "%*s\n", pad, "") == pad + 1;
    o->header = 10 + hlen;
    return ok ? 0 : mv_error("cannot write %s: %s", o->path, strerror(errno));
}

// engine_logits_fn: keep the row of each request's first sampled token, at its place in the file.
static void save_first_logits(void *ctx, int request, int gen_index, const float *logits, int vocab) {
    logits_out_t *o = ctx;
    if (gen_index != 0 || o->error[0] || request < 0 || request >= o->n || o->seen[request]) return;
    if (vocab != o->vocab) {
        snprintf(o->error, sizeof o->error, "%s: a logits row has %d entries, and the vocabulary %d", o->path, vocab,
                 o->vocab);
        return;
    }
    off_t at = (off_t)o->header + (off_t)request * vocab * (off_t)sizeof(float);
    if (fseeko(o->f, at, SEEK_SET) || fwrite(logits, sizeof(float), (size_t)vocab, o->f) != (size_t)vocab) {
        snprintf(o->error, sizeof o->error, "cannot write %s: %s", o->path, strerror(errno));
        return;
    }
    o->seen[request] = 1;
}

// After generation: every row written, the file closed; on failure the partial file is removed.
static int logits_out_finish(logits_out_t *o, int ok) {
    int rc = 0;
    if (ok && o->error[0]) rc = mv_error("%s", o->error);
    for (int i = 0; ok && !rc && i < o->n; i++)
        if (!o->seen[i]) rc = mv_error("%s: request %d produced no first-step logits", o->path, i);
    if (fclose(o->f) && ok && !rc) rc = mv_error("cannot write %s: %s", o->path, strerror(errno));
    if (!ok || rc) remove(o->path);
    free(o->seen);
    return rc;
}

typedef struct {
    const char *model, *input, *output, *prompt, *max_tokens, *temperature, *top_k, *top_p, *seed, *logits_out;
    cli_engine_args_t eng;
    int chat, ignore_eos;
} gen_args_t;

// The command line's sampling values over generation_config.json's.
static int sampling_options(const gen_args_t *a, const qwen3_config_t *m, sampling_params_t *p, uint64_t *seed) {
    long max_tokens = 16, top_k = m->top_k, s = 0;
    *p = (sampling_params_t){m->temperature, m->top_k, m->top_p, 16, a->ignore_eos};
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

static int run_generate(gen_args_t *a, const char **prompts, int n_prompts) {
    engine_config_t ec = engine_config_default(a->model);
    int st = cli_engine_config("generate", &a->eng, &ec);
    if (st) return st;
    ec.progress = isatty(STDERR_FILENO);
    gen_ctx_t c = {.rq = {.path = a->input, .model_dir = a->model, .chat = a->chat}};
    // Parse the numbers before loading anything: a typo costs nothing.
    qwen3_config_t mc;
    if (qwen3_config_load(a->model, &mc)) return cli_error("generate", CLI_FAIL, "%s", mv_last_error());
    if ((st = sampling_options(a, &mc, &c.rq.defaults, &c.rq.base_seed))) return st;
    c.rq.vocab_size = mc.vocab_size;
    logits_out_t lo = {.path = a->logits_out, .vocab = mc.vocab_size};
    if (lo.path && !(lo.f = fopen(lo.path, "wb")))
        return cli_error("generate", CLI_FAIL, "--logits-out: cannot open %s: %s", lo.path, strerror(errno));
    if (engine_create(&ec, &c.e)) {
        if (lo.f) logits_out_finish(&lo, 0);
        return cli_error("generate", CLI_FAIL, "%s", mv_last_error());
    }
    c.rq.tokenizer = c.e->tokenizer;
    int rc = 0;
    for (int i = 0; i < n_prompts && !rc; i++) rc = cli_requests_add_text(&c.rq, prompts[i], i);
    if (!rc && a->input) rc = cli_requests_read(&c.rq, a->input);
    if (!rc && c.rq.n == 0) rc = mv_error("no requests: give --prompt or a non-empty --input");
    const int n = c.rq.n;
    engine_request_t *reqs = cli_requests_to_engine(&c.rq);
    engine_output_t *outs = calloc((size_t)(n ? n : 1), sizeof *outs);
    if (!rc && (!reqs || !outs)) rc = mv_error("out of memory");
    if (!rc && lo.f) {
        lo.n = n;
        lo.seen = calloc((size_t)n, 1);
        rc = lo.seen ? npy_write_header(&lo) : mv_error("out of memory");
    }
    if (!rc && engine_generate(c.e, reqs, n, outs, lo.f ? save_first_logits : NULL, &lo)) {
        rc = -1;
        if (c.e->failed_request >= 0) {
            char where[512];
            cli_requests_where(&c.rq, c.e->failed_request, where, sizeof where);
            mv_error_prefix("%s", where);
        }
    }
    if (lo.f && logits_out_finish(&lo, !rc) && !rc) rc = -1;
    if (!rc) {
        // "--output -" is standard output in JSONL form, as "--input -" is standard input.
        int to_stdout = !a->output || !strcmp(a->output, "-");
        FILE *f = to_stdout ? stdout : fopen(a->output, "w");
        if (!f) rc = mv_error("cannot open %s: %s", a->output, strerror(errno));
        if (!rc) rc = write_outputs(&c, outs, f, a->output != NULL);
        if (f && f != stdout && fclose(f) && !rc) rc = mv_error("cannot write %s: %s", a->output, strerror(errno));
        if (!rc && ec.progress)
            fprintf(stderr, "minivllm: %d requests, %lld prompt tokens (%lld from the prefix cache), %lld generated "
                            "in %lld steps, %.2f s (%.1f tok/s generated)\n",
                    n, c.e->num_prompt_tokens, c.e->num_cached_tokens, c.e->num_generated_tokens, c.e->num_steps,
                    c.e->elapsed_s, (double)c.e->num_generated_tokens / (c.e->elapsed_s > 0 ? c.e->elapsed_s : 1));
    }
    if (rc) cli_error("generate", CLI_FAIL, "%s", mv_last_error());
    engine_outputs_free(outs, n);
    free(outs);
    free(reqs);
    cli_requests_free(&c.rq);
    engine_free(c.e);
    return rc ? CLI_FAIL : CLI_OK;
}

int cmd_generate(int argc, char **argv) {
    gen_args_t a = {0};
    const cli_opt_t own[] = {
        {"--model", "DIR", "Hugging Face model directory", &a.model, NULL},
        {"--prompt", "TEXT", "a text prompt (repeatable; needs tokenizer.json)", &a.prompt, NULL},
        {"--input", "FILE", "JSON lines of requests (\"-\" = stdin)", &a.input, NULL},
        {"--output", "FILE", "write one JSON line per request here, - for stdout (default: text on stdout)", &a.output, NULL},
        {"--chat", NULL, "wrap each text prompt as a user message (Qwen3 chat template)", NULL, &a.chat},
        {"--max-tokens", "N", "tokens to generate per request (default 16)", &a.max_tokens, NULL},
        {"--temperature", "T", "0 = greedy (default: generation_config.json, else 1)", &a.temperature, NULL},
        {"--top-k", "K", "keep the K most likely tokens, 0 = off (default: generation_config.json)", &a.top_k, NULL},
        {"--top-p", "P", "nucleus in (0, 1], 1 = off (default: generation_config.json)", &a.top_p, NULL},
        {"--seed", "S", "request i without \"seed\" uses S + i (default 0)", &a.seed, NULL},
        {"--ignore-eos", NULL, "keep generating after an end-of-sequence token", NULL, &a.ignore_eos},
        {"--logits-out", "FILE", "save each request's first-step logits, float32 [requests, vocab], as .npy",
         &a.logits_out, NULL},
    };
    enum { N_OWN = sizeof own / sizeof *own };
    cli_opt_t opts[N_OWN + CLI_ENGINE_N_OPTS];
    memcpy(opts, own, sizeof own);
    int n_opts = N_OWN + cli_engine_opts(&a.eng, opts + N_OWN);
    int st = cli_parse("generate", GENERATE_USAGE, opts, n_opts, argc, argv);
    if (st == CLI_HELP) return CLI_OK;
    if (st != CLI_OK) return st;
    if (!a.model) return cli_error("generate", CLI_USAGE, "--model DIR is required");
    if (a.logits_out && (!*a.logits_out || !strcmp(a.logits_out, "-")))
        return cli_error("generate", CLI_USAGE, "--logits-out needs a file path (the .npy is binary: not stdout)");
    const char **prompts;
    int n_prompts = collect_prompts(argc, argv, &prompts);
    if (!prompts) return cli_error("generate", CLI_FAIL, "out of memory");
    if (n_prompts == 0 && !a.input) {
        free(prompts);
        return cli_error("generate", CLI_USAGE, "give --prompt TEXT or --input FILE.jsonl");
    }
    st = run_generate(&a, prompts, n_prompts);
    free(prompts);
    return st;
}

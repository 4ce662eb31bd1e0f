/*
 * chapters/09-engine/cmd_tokenize.c - the `minivllm tokenize` and
 * `minivllm detokenize` commands.
 *
 *   minivllm tokenize   --model DIR --text TEXT           -> [9707, 11, 1879, 0]
 *   minivllm tokenize   --model DIR --input FILE.jsonl    -> one id list per line
 *   minivllm tokenize   --model DIR --input FILE.jsonl --bench   -> timing JSON
 *   minivllm detokenize --model DIR --ids 9707,11,1879    -> Hello, world
 *   minivllm detokenize --model DIR --input IDS.jsonl     -> one JSON string per line
 *
 * A line of FILE.jsonl is {"text": "..."} or a chat request
 * {"messages": [...], "add_generation_prompt": true, "enable_thinking": false}.
 */
#include <cjson/cJSON.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "chapters/09-engine/text/chat.h"
#include "chapters/09-engine/cli/cli.h"
#include "common/check.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

// The text a request line stands for: its "text", or its chat rendered.
static int request_text(const tokenizer_t *tok, const cJSON *req, tok_bytes_t *text) {
    if (!cJSON_IsObject(req)) return mv_error("a request must be a JSON object");
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(req, "text");
    if (t) {
        if (!cJSON_IsString(t)) return mv_error("\"text\" must be a string");
        return tok_bytes_append(text, t->valuestring, strlen(t->valuestring));
    }
    if (!cJSON_GetObjectItemCaseSensitive(req, "messages"))
        return mv_error("a request needs \"text\" or \"messages\"");
    if (!tokenizer_has_qwen3_chat(tok))
        return mv_error("this model's chat template is not Qwen3's, which is the only one implemented");
    chat_message_t *msgs;
    int n;
    chat_options_t opt;
    if (chat_request_from_json(req, &msgs, &n, &opt)) return -1;
    int rc = chat_render_qwen3(msgs, n, &opt, text);
    free(msgs);
    return rc;
}

// Strict: nothing after the value, no NUL in a string, no key twice (cli.h).
static cJSON *parse_line(const char *line, size_t len) { return cli_parse_json_line(line, len); }

// Prefix the last error with where it happened.
static int error_in(const char *path, long line_no) { return mv_error_prefix("%s:%ld", path, line_no); }

typedef struct {
    tokenizer_t *tok;
    const char *path;
    tok_ids_t ids;
    tok_bytes_t text;
    // --bench only: every request's text, kept to be encoded again and again.
    int keep;
    tok_bytes_t all;    // the texts back to back
    size_t *ends;       // [n_docs] end offset of each text in `all`
    size_t n_docs, cap_docs;
} tokenize_ctx_t;

static int tokenize_line(const char *line, size_t len, long line_no, void *p) {
    tokenize_ctx_t *c = p;
    cJSON *req = parse_line(line, len);
    c->text.len = 0;
    c->ids.len = 0;
    int rc = req ? request_text(c->tok, req, &c->text) : -1;
    cJSON_Delete(req);
    if (!rc && c->keep) {
        rc = tok_bytes_append(&c->all, c->text.data, c->text.len);
        if (!rc && c->n_docs == c->cap_docs) {
            size_t cap = c->cap_docs ? 2 * c->cap_docs : 256;
            size_t *e = realloc(c->ends, cap * sizeof *e);
            rc = e ? 0 : mv_error("out of memory");
            if (e) c->ends = e, c->cap_docs = cap;
        }
        if (!rc) c->ends[c->n_docs++] = c->all.len;
        return rc;
    }
    if (!rc) rc = tokenizer_encode(c->tok, c->text.data, c->text.len, &c->ids);
    if (rc) return error_in(c->path, line_no);
    cli_print_ids(stdout, c->ids.data, c->ids.len);
    return 0;
}

// Encode every text `repeat` times on this one thread; report the first
// pass (cold word cache) and the best pass, as JSON on one line.
static int run_bench(tokenize_ctx_t *c, int repeat, double load_s) {
    double first = 0, best = 1e30;
    uint64_t id_sum = 0;
    size_t n_tokens = 0;
    for (int r = 0; r < repeat; r++) {
        size_t start = 0;
        uint64_t sum = 0;
        n_tokens = 0;
        double t0 = now_s();
        for (size_t d = 0; d < c->n_docs; d++) {
            c->ids.len = 0;
            if (tokenizer_encode(c->tok, c->all.data + start, c->ends[d] - start, &c->ids))
                return error_in(c->path, (long)d + 1);
            for (size_t k = 0; k < c->ids.len; k++) sum += (uint64_t)c->ids.data[k];
            n_tokens += c->ids.len;
            start = c->ends[d];
        }
        double dt = now_s() - t0;
        if (r == 0) first = dt;
        if (dt < best) best = dt;
        id_sum = sum;
    }
    double mb = (double)c->all.len / 1e6;
    printf("{\"impl\": \"minivllm\", \"threads\": 1, \"docs\": %zu, \"bytes\": %zu, \"tokens\": %zu, "
           "\"id_sum\": %llu, \"repeat\": %d, \"load_s\": %.4f, \"first_s\": %.4f, \"best_s\": %.4f, "
           "\"first_mb_per_s\": %.3f, \"best_mb_per_s\": %.3f, \"regex_jit\": %s}\n",
           c->n_docs, c->all.len, n_tokens, (unsigned long long)id_sum, repeat, load_s, first, best,
           mb / first, mb / best, tokenizer_uses_jit(c->tok) ? "true" : "false");
    return 0;
}

static const char TOKENIZE_USAGE[] =
    "usage: minivllm tokenize --model DIR (--text TEXT | --input FILE.jsonl) [--bench [--repeat N]]\n"
    "\n"
    "Turn text into Qwen3 token ids, printed as a JSON list.\n"
    "With --input, each line of FILE.jsonl (\"-\" = stdin) is one request, either\n"
    "  {\"text\": \"...\"}  or\n"
    "  {\"messages\": [{\"role\": \"user\", \"content\": \"...\"}, ...],\n"
    "   \"add_generation_prompt\": true, \"enable_thinking\": false}\n"
    "(rendered with Qwen3's chat template, then tokenized), and one JSON list is\n"
    "printed per line, in order.\n"
    "With --bench, nothing is printed but a JSON line of timings: encoding all the\n"
    "requests on one thread, --repeat times (default 3).";

int cmd_tokenize(int argc, char **argv) {
    const char *model = NULL, *text = NULL, *input = NULL, *repeat_s = NULL;
    int bench = 0;
    cli_opt_t opts[] = {
        {"--model", "DIR", "Hugging Face model directory (tokenizer.json, tokenizer_config.json)", &model, NULL},
        {"--text", "TEXT", "the text to tokenize", &text, NULL},
        {"--input", "FILE", "JSON lines of requests (\"-\" = stdin)", &input, NULL},
        {"--bench", NULL, "time the encoding of --input instead of printing ids", NULL, &bench},
        {"--repeat", "N", "with --bench: passes over the input (default 3)", &repeat_s, NULL},
    };
    int st = cli_parse("tokenize", TOKENIZE_USAGE, opts, 5, argc, argv);
    if (st == CLI_HELP) return CLI_OK;
    if (st != CLI_OK) return st;
    if (!model) return cli_error("tokenize", CLI_USAGE, "--model DIR is required");
    if (!text == !input) return cli_error("tokenize", CLI_USAGE, "give exactly one of --text and --input");
    if (bench && !input) return cli_error("tokenize", CLI_USAGE, "--bench needs --input");
    int repeat = 3;
    if (repeat_s) {
        char *end;
        long r = strtol(repeat_s, &end, 10);
        if (*end || r < 1 || r > 1000) return cli_error("tokenize", CLI_USAGE, "--repeat '%s' is not a count from 1 to 1000", repeat_s);
        repeat = (int)r;
    }

    {
        const int mst = cli_model_dir("tokenize", &model);
        if (mst != CLI_OK) return mst;
    }
    double t0 = now_s();
    tokenize_ctx_t c = {.tok = tokenizer_load(model), .path = input, .keep = bench};
    double load_s = now_s() - t0;
    if (!c.tok) return cli_error("tokenize", CLI_FAIL, "%s", mv_last_error());
    int rc;
    if (text) {
        rc = tokenizer_encode(c.tok, text, strlen(text), &c.ids);
        if (!rc) cli_print_ids(stdout, c.ids.data, c.ids.len);
    } else {
        rc = cli_for_each_line(input, tokenize_line, &c);
        if (!rc && bench) rc = run_bench(&c, repeat, load_s);
    }
    if (rc) cli_error("tokenize", CLI_FAIL, "%s", mv_last_error());
    tok_ids_free(&c.ids);
    tok_bytes_free(&c.text);
    tok_bytes_free(&c.all);
    free(c.ends);
    tokenizer_free(c.tok);
    return rc ? CLI_FAIL : CLI_OK;
}

// ---- detokenize -------------------------------------------------------------------------

typedef struct {
    tokenizer_t *tok;
    const char *path;
    int skip_special, stream, json;
    tok_ids_t ids;
    tok_bytes_t text;
} detok_ctx_t;

// Decode c->ids into c->text, all at once or one id at a time through the
// streaming decoder (which must give the same text).
static int decode_ids(detok_ctx_t *c) {
    c->text.len = 0;
    if (!c->stream) return tokenizer_decode(c->tok, c->ids.data, c->ids.len, c->skip_special, &c->text);
    tok_stream_t s;
    tok_stream_init(&s, c->skip_special);
    for (size_t i = 0; i < c->ids.len; i++)
        if (tok_stream_push(c->tok, &s, c->ids.data[i], &c->text)) return -1;
    return tok_stream_flush(&s, &c->text);
}

static int detok_line(const char *line, size_t len, long line_no, void *p) {
    detok_ctx_t *c = p;
    cJSON *arr = parse_line(line, len);
    c->ids.len = 0;
    int rc = !arr ? -1 : cJSON_IsArray(arr) ? 0 : mv_error("not a JSON list of ids");
    for (const cJSON *e = arr ? arr->child : NULL; e && !rc; e = e->next) {
        // The range first: converting a double outside int32 to int32 is undefined.
        if (!cJSON_IsNumber(e) || !(e->valuedouble >= INT32_MIN && e->valuedouble <= INT32_MAX) ||
            e->valuedouble != (double)(int32_t)e->valuedouble)
            rc = mv_error("not a JSON list of integer ids");
        else
            rc = tok_ids_push(&c->ids, (int32_t)e->valuedouble);
    }
    cJSON_Delete(arr);
    if (!rc) rc = decode_ids(c);
    if (rc) return error_in(c->path, line_no);
    cli_print_json_string(stdout, c->text.data, c->text.len);
    return 0;
}

// "1,2,3", "1 2 3" or "[1, 2, 3]". Returns CLI_OK or CLI_USAGE naming the bad part.
static int parse_id_list(const char *s, tok_ids_t *ids) {
    const char *p = s;
    while (*p) {
        if (*p == ',' || *p == ' ' || *p == '[' || *p == ']') {
            p++;
            continue;
        }
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < INT32_MIN || v > INT32_MAX || (*end && !strchr(", ]", *end))) {
            size_t n = strcspn(p, ", ]");
            return cli_error("detokenize", CLI_USAGE, "--ids: '%.*s' is not an integer id", (int)n, p);
        }
        if (tok_ids_push(ids, (int32_t)v)) return cli_error("detokenize", CLI_FAIL, "%s", mv_last_error());
        p = end;
    }
    return CLI_OK;
}

static const char DETOKENIZE_USAGE[] =
    "usage: minivllm detokenize --model DIR (--ids 1,2,3 | --input FILE.jsonl) [--skip-special] [--stream] [--json]\n"
    "\n"
    "Turn Qwen3 token ids back into text. With --ids the text is printed as it is,\n"
    "followed by a newline (as a JSON string with --json). With --input, each line\n"
    "of FILE.jsonl (\"-\" = stdin) is a JSON list of ids, and one JSON string is\n"
    "printed per line. Bytes that are not valid UTF-8 are shown as U+FFFD. An id the\n"
    "tokenizer does not know (a padding row of the model's vocabulary) has no text.";

int cmd_detokenize(int argc, char **argv) {
    const char *model = NULL, *ids_s = NULL, *input = NULL;
    detok_ctx_t c = {0};
    cli_opt_t opts[] = {
        {"--model", "DIR", "Hugging Face model directory (tokenizer.json, tokenizer_config.json)", &model, NULL},
        {"--ids", "LIST", "the ids, separated by commas or spaces", &ids_s, NULL},
        {"--input", "FILE", "JSON lines, each a list of ids (\"-\" = stdin)", &input, NULL},
        {"--skip-special", NULL, "leave out special tokens such as <|im_end|>", NULL, &c.skip_special},
        {"--stream", NULL, "decode one id at a time with the streaming decoder", NULL, &c.stream},
        {"--json", NULL, "with --ids: print the text as a JSON string", NULL, &c.json},
    };
    int st = cli_parse("detokenize", DETOKENIZE_USAGE, opts, 6, argc, argv);
    if (st == CLI_HELP) return CLI_OK;
    if (st != CLI_OK) return st;
    if (!model) return cli_error("detokenize", CLI_USAGE, "--model DIR is required");
    if (!ids_s == !input) return cli_error("detokenize", CLI_USAGE, "give exactly one of --ids and --input");
    if (ids_s && (st = parse_id_list(ids_s, &c.ids)) != CLI_OK) {
        tok_ids_free(&c.ids);
        return st;
    }
    {
        const int mst = cli_model_dir("detokenize", &model);
        if (mst != CLI_OK) {
            tok_ids_free(&c.ids);
            return mst;
        }
    }
    c.tok = tokenizer_load(model);
    c.path = input;
    int rc = c.tok ? 0 : -1;
    if (!rc && ids_s) {
        rc = decode_ids(&c);
        if (!rc && c.json) cli_print_json_string(stdout, c.text.data, c.text.len);
        else if (!rc) printf("%s\n", c.text.data);
    } else if (!rc) {
        rc = cli_for_each_line(input, detok_line, &c);
    }
    if (rc) cli_error("detokenize", CLI_FAIL, "%s", mv_last_error());
    tok_ids_free(&c.ids);
    tok_bytes_free(&c.text);
    tokenizer_free(c.tok);
    return rc ? CLI_FAIL : CLI_OK;
}

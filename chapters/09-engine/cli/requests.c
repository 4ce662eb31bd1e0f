/*
 * chapters/09-engine/cli/requests.c - request lines of a JSONL file (see
 * requests.h), shared by `minivllm generate` and `minivllm bench`.
 */
#include "chapters/09-engine/cli/requests.h"

#include <cjson/cJSON.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chapters/09-engine/cli/cli.h"
#include "chapters/09-engine/text/chat.h"
#include "common/check.h"

static int push_request(cli_requests_t *c, const cli_request_t *r) {
    if (c->n == c->cap) {
        int cap = c->cap ? 2 * c->cap : 16;
        cli_request_t *p = realloc(c->reqs, (size_t)cap * sizeof *p);
        if (!p) return mv_error("out of memory");
        c->reqs = p;
        c->cap = cap;
    }
    c->reqs[c->n++] = *r;
    return 0;
}

// Text -> ids, as a user message of the chat template when c->chat is set.
static int encode_text(const cli_requests_t *c, const char *text, tok_ids_t *ids) {
    if (c->text_refused) return mv_error("\"prompt\": %s", c->text_refused);
    if (!c->tokenizer)
        return mv_error("a text prompt needs a tokenizer, and %s has no tokenizer.json (use prompt_token_ids)",
                        c->model_dir);
    if (!c->chat) return tokenizer_encode(c->tokenizer, text, strlen(text), ids);
    chat_message_t m = {"user", text, NULL};
    chat_options_t opt = {1, 0};
    tok_bytes_t rendered = {0};
    int rc = chat_render_qwen3(&m, 1, &opt, &rendered);
    if (!rc) rc = tokenizer_encode(c->tokenizer, rendered.data, rendered.len, ids);
    tok_bytes_free(&rendered);
    return rc;
}

static int is_int(const cJSON *v, double lo, double hi) {
    return cJSON_IsNumber(v) && v->valuedouble == floor(v->valuedouble) && v->valuedouble >= lo &&
           v->valuedouble <= hi;
}

static int line_ids(const cli_requests_t *c, const cJSON *arr, tok_ids_t *ids) {
    if (!cJSON_IsArray(arr)) return mv_error("\"prompt_token_ids\" must be a list of integer ids");
    int k = 0;
    for (const cJSON *v = arr->child; v; v = v->next, k++) {
        if (!is_int(v, INT32_MIN, INT32_MAX))
            return mv_error("\"prompt_token_ids\"[%d] is not an integer id", k);
        // Checked here, before the model loads, when the caller knows the vocabulary.
        if (c->vocab_size > 0 && (v->valuedouble < 0 || v->valuedouble >= c->vocab_size))
            return mv_error("\"prompt_token_ids\"[%d] = %.0f is outside the vocabulary [0, %d)", k, v->valuedouble,
                            c->vocab_size);
        if (tok_ids_push(ids, (int32_t)v->valuedouble)) return -1;
    }
    return 0;
}

static int line_messages(const cli_requests_t *c, const cJSON *req, tok_ids_t *ids) {
    if (c->text_refused) return mv_error("\"messages\": %s", c->text_refused);
    if (!c->tokenizer) return mv_error("\"messages\" needs a tokenizer, and %s has no tokenizer.json", c->model_dir);
    if (!tokenizer_has_qwen3_chat(c->tokenizer))
        return mv_error("\"messages\": this model's chat template is not Qwen3's, the only one implemented");
    chat_message_t *msgs;
    int n;
    chat_options_t opt;
    if (chat_request_from_json(req, &msgs, &n, &opt)) return -1;
    // A generation request wants the assistant's turn opened, unless it says otherwise.
    if (!cJSON_GetObjectItemCaseSensitive(req, "add_generation_prompt")) opt.add_generation_prompt = 1;
    tok_bytes_t text = {0};
    int rc = chat_render_qwen3(msgs, n, &opt, &text);
    free(msgs);
    if (!rc) rc = tokenizer_encode(c->tokenizer, text.data, text.len, ids);
    tok_bytes_free(&text);
    return rc;
}

static const char *const LINE_KEYS[] = {
    "prompt", "prompt_token_ids", "messages", "add_generation_prompt", "enable_thinking", "max_tokens",
    "temperature", "top_k", "top_p", "seed", "ignore_eos", "stop", "include_stop_str_in_output", "stop_token_ids",
    "skip_special_tokens", "n", "min_tokens", "min_p", "presence_penalty", "frequency_penalty",
    "repetition_penalty", "logprobs"};

static void stop_free(engine_stop_t *s) {
    for (int i = 0; i < s->num_strs; i++) free((char *)s->strs[i]);
    free((void *)s->strs);
    free((void *)s->ids);
    *s = (engine_stop_t){0};
}

// A deep copy of a request's stops (each of a line's n samples owns its own).
static int stop_copy(engine_stop_t *dst, const engine_stop_t *src) {
    *dst = *src;
    dst->ids = NULL, dst->strs = NULL, dst->n = dst->num_strs = 0;
    int32_t *ids = src->n ? malloc((size_t)src->n * sizeof *ids) : NULL;
    char **strs = src->num_strs ? calloc(STOP_STR_MAX, sizeof *strs) : NULL;
    dst->ids = ids, dst->strs = (const char *const *)strs;
    if ((src->n && !ids) || (src->num_strs && !strs)) return mv_error("out of memory");
    if (ids) memcpy(ids, src->ids, (size_t)src->n * sizeof *ids);
    dst->n = src->n;
    for (int i = 0; i < src->num_strs; i++) {
        if (!(strs[i] = strdup(src->strs[i]))) return mv_error("out of memory");
        dst->num_strs = i + 1;
    }
    return 0;
}

// "stop": a string or a list of up to STOP_STR_MAX non-empty strings ([] = none),
// and "include_stop_str_in_output", into r->stop.
static int line_stop(const cli_requests_t *c, const cJSON *req, cli_request_t *r) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(req, "stop");
    const cJSON *inc = cJSON_GetObjectItemCaseSensitive(req, "include_stop_str_in_output");
    if (inc && !cJSON_IsBool(inc)) return mv_error("\"include_stop_str_in_output\" must be true or false");
    const cJSON *ids = cJSON_GetObjectItemCaseSensitive(req, "stop_token_ids");
    if (ids && !cJSON_IsNull(ids)) {
        if (!cJSON_IsArray(ids)) return mv_error("\"stop_token_ids\" must be a list of token ids");
        const int m = cJSON_GetArraySize(ids);
        if (m > SAMPLER_MAX_STOP_IDS)
            return mv_error("\"stop_token_ids\" has %d ids, at most %d", m, SAMPLER_MAX_STOP_IDS);
        int32_t *out = malloc((size_t)(m ? m : 1) * sizeof *out);
        if (!out) return mv_error("out of memory");
        r->stop.ids = out;
        int k = 0;
        for (const cJSON *e = ids->child; e; e = e->next, k++) {
            if (!is_int(e, 0, c->vocab_size > 0 ? c->vocab_size - 1 : INT32_MAX))
                return mv_error("\"stop_token_ids\"[%d] is not a token id%s", k, c->vocab_size > 0 ? " of the vocabulary" : "");
            out[k] = (int32_t)e->valuedouble;
        }
        r->stop.n = m;
    }
    const cJSON *skip = cJSON_GetObjectItemCaseSensitive(req, "skip_special_tokens");
    if (skip && !cJSON_IsBool(skip)) return mv_error("\"skip_special_tokens\" must be true or false");
    r->stop.keep_special = skip && cJSON_IsFalse(skip);
    if (!v || cJSON_IsNull(v)) return 0;
    const int n = cJSON_IsString(v) ? 1 : cJSON_IsArray(v) ? cJSON_GetArraySize(v) : -1;
    if (n < 0 || n > STOP_STR_MAX)
        return mv_error("\"stop\" must be a string or a list of up to %d strings", STOP_STR_MAX);
    if (n == 0) return 0;
    if (c->text_refused) return mv_error("\"stop\": %s", c->text_refused);
    if (!c->tokenizer)
        return mv_error("\"stop\" strings are matched on the text, and %s has no tokenizer.json", c->model_dir);
    engine_stop_t *s = &r->stop;
    char **strs = calloc(STOP_STR_MAX, sizeof *strs);
    if (!strs) return mv_error("out of memory");
    s->strs = (const char *const *)strs;
    s->include_str = inc && cJSON_IsTrue(inc);
    const cJSON *e = cJSON_IsString(v) ? v : v->child;
    for (int k = 0; k < n; k++, e = e->next) {
        if (!cJSON_IsString(e) || !e->valuestring[0]) return mv_error("\"stop\"[%d] must be a non-empty string", k);
        if (!(strs[k] = strdup(e->valuestring))) return mv_error("out of memory");
        s->num_strs = k + 1;
    }
    return 0;
}

// The sampling keys of a line, over the defaults.
static int line_params(const cli_requests_t *c, const cJSON *req, cli_request_t *r) {
    const cJSON *v;
    if ((v = cJSON_GetObjectItemCaseSensitive(req, "max_tokens"))) {
        if (!is_int(v, 1, INT_MAX)) return mv_error("\"max_tokens\" must be an integer >= 1");
        r->params.max_tokens = (int)v->valuedouble;
    } else if (c->need_max_tokens) {
        return mv_error("\"max_tokens\" is missing (a timed request says how many tokens it generates)");
    }
    if ((v = cJSON_GetObjectItemCaseSensitive(req, "temperature"))) {
        if (!cJSON_IsNumber(v) || !(v->valuedouble >= 0) || v->valuedouble > 1e6)
            return mv_error("\"temperature\" must be a number >= 0");
        r->params.temperature = (float)v->valuedouble;
    }
    if ((v = cJSON_GetObjectItemCaseSensitive(req, "top_k"))) {
        if (!is_int(v, -1, INT_MAX)) return mv_error("\"top_k\" must be an integer >= 0 (-1 or 0 = off)");
        r->params.top_k = v->valuedouble < 0 ? 0 : (int)v->valuedouble;
    }
    if ((v = cJSON_GetObjectItemCaseSensitive(req, "top_p"))) {
        if (!cJSON_IsNumber(v) || !(v->valuedouble > 0 && v->valuedouble <= 1))
            return mv_error("\"top_p\" must be a number in (0, 1]");
        r->params.top_p = (float)v->valuedouble;
    }
    if ((v = cJSON_GetObjectItemCaseSensitive(req, "seed"))) {
        if (!is_int(v, 0, 9007199254740992.0)) return mv_error("\"seed\" must be an integer >= 0");
        r->seed = (uint64_t)v->valuedouble;
    }
    if ((v = cJSON_GetObjectItemCaseSensitive(req, "ignore_eos"))) {
        if (!cJSON_IsBool(v)) return mv_error("\"ignore_eos\" must be true or false");
        r->params.ignore_eos = cJSON_IsTrue(v);
    }
    // vLLM's other SamplingParams, with its names and ranges.
    if ((v = cJSON_GetObjectItemCaseSensitive(req, "n"))) {
        if (!is_int(v, 1, CLI_MAX_N)) return mv_error("\"n\" must be an integer in [1, %d]", CLI_MAX_N);
        r->n = (int)v->valuedouble;
    }
    if (r->n > 1 && r->params.temperature == 0)
        return mv_error("\"n\" > 1 with temperature 0: greedy samples are all the same (vLLM refuses it too)");
    if ((v = cJSON_GetObjectItemCaseSensitive(req, "min_tokens"))) {
        if (!is_int(v, 0, INT_MAX)) return mv_error("\"min_tokens\" must be an integer >= 0");
        r->params.min_tokens = (int)v->valuedouble;
    }
    if (r->params.min_tokens > r->params.max_tokens)
        return mv_error("\"min_tokens\" (%d) must be at most max_tokens (%d)", r->params.min_tokens, r->params.max_tokens);
    if ((v = cJSON_GetObjectItemCaseSensitive(req, "min_p"))) {
        if (!cJSON_IsNumber(v) || !(v->valuedouble >= 0 && v->valuedouble <= 1))
            return mv_error("\"min_p\" must be a number in [0, 1]");
        r->params.min_p = (float)v->valuedouble;
    }
    static const struct {
        const char *key;
        double lo, hi;
    } PEN[] = {{"presence_penalty", -2, 2}, {"frequency_penalty", -2, 2}, {"repetition_penalty", 0, 1e6}};
    float *pen[] = {&r->params.presence_penalty, &r->params.frequency_penalty, &r->params.repetition_penalty};
    for (int k = 0; k < 3; k++)
        if ((v = cJSON_GetObjectItemCaseSensitive(req, PEN[k].key))) {
            if (!cJSON_IsNumber(v) || !(v->valuedouble >= PEN[k].lo && v->valuedouble <= PEN[k].hi) ||
                (k == 2 && !(v->valuedouble > 0)))
                return mv_error(k == 2 ? "\"%s\" must be a number > 0 (1 = off)" : "\"%s\" must be a number in [-2, 2]",
                                PEN[k].key);
            *pen[k] = (float)v->valuedouble;
        }
    if ((v = cJSON_GetObjectItemCaseSensitive(req, "logprobs")) && !cJSON_IsNull(v)) {
        if (!is_int(v, 0, SAMPLING_MAX_TOP_LOGPROBS))
            return mv_error("\"logprobs\" must be an integer in [0, %d] (top ids returned beside the sampled one)",
                            SAMPLING_MAX_TOP_LOGPROBS);
        r->params.logprobs = 1;
        r->params.top_logprobs = (int)v->valuedouble;
    }
    return 0;
}

static int parse_request(const cli_requests_t *c, const cJSON *req, cli_request_t *r) {
    if (!cJSON_IsObject(req)) return mv_error("a request must be a JSON object");
    for (const cJSON *k = req->child; k; k = k->next) {
        size_t i = 0;
        while (i < sizeof LINE_KEYS / sizeof *LINE_KEYS && strcmp(k->string, LINE_KEYS[i])) i++;
        if (i == sizeof LINE_KEYS / sizeof *LINE_KEYS) return mv_error("unknown key \"%s\"", k->string);
    }
    const cJSON *prompt = cJSON_GetObjectItemCaseSensitive(req, "prompt");
    const cJSON *ids = cJSON_GetObjectItemCaseSensitive(req, "prompt_token_ids");
    const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(req, "messages");
    if (!!prompt + !!ids + !!msgs != 1)
        return mv_error("a request needs exactly one of \"prompt\", \"prompt_token_ids\" and \"messages\"");
    if (line_params(c, req, r) || line_stop(c, req, r)) return -1;
    if (prompt && !cJSON_IsString(prompt)) return mv_error("\"prompt\" must be a string");
    int rc = prompt ? encode_text(c, prompt->valuestring, &r->prompt)
                    : ids ? line_ids(c, ids, &r->prompt) : line_messages(c, req, &r->prompt);
    if (!rc && r->prompt.len == 0)
        rc = mv_error("\"%s\" is empty", prompt ? "prompt" : ids ? "prompt_token_ids" : "messages");
    return rc;
}

int cli_requests_add_line(cli_requests_t *c, const char *line, size_t len, long line_no) {
    size_t k = 0;
    while (k < len && (line[k] == ' ' || line[k] == '\t')) k++;
    if (k == len) return 0;
    cJSON *req = cli_parse_json_line(line, len);
    cli_request_t r = {.params = c->defaults, .seed = c->base_seed + (uint64_t)c->n, .line_no = line_no, .n = 1};
    int rc = req ? parse_request(c, req, &r) : -1;
    const int has_seed = req && cJSON_GetObjectItemCaseSensitive(req, "seed");
    cJSON_Delete(req);
    if (!rc) rc = push_request(c, &r);  // c owns r from here
    if (rc) {
        tok_ids_free(&r.prompt);
        stop_free(&r.stop);
        return mv_error_prefix("%s:%ld", c->path, line_no);
    }
    // "n": the line's other samples are copies of it, sample j drawn with
    // seed + j (vLLM's rule when the line gives a seed; without one, each
    // has its own index's seed, as every other request).
    const int first = c->n - 1;
    for (int j = 1; !rc && j < r.n; j++) {
        cli_request_t q = c->reqs[first];
        q.sample = j;
        q.seed = has_seed ? r.seed + (uint64_t)j : c->base_seed + (uint64_t)c->n;
        q.prompt = (tok_ids_t){0};
        for (size_t t = 0; !rc && t < r.prompt.len; t++) rc = tok_ids_push(&q.prompt, r.prompt.data[t]);
        if (!rc) rc = stop_copy(&q.stop, &c->reqs[first].stop);
        if (!rc) rc = push_request(c, &q);
        if (rc) {
            tok_ids_free(&q.prompt);
            stop_free(&q.stop);
        }
    }
    if (rc) mv_error_prefix("%s:%ld", c->path, line_no);
    return rc;
}

static int input_line(const char *line, size_t len, long line_no, void *p) {
    return cli_requests_add_line(p, line, len, line_no);
}

int cli_requests_read(cli_requests_t *c, const char *path) {
    c->path = path;
    return cli_for_each_line(path, input_line, c);
}

int cli_requests_add_text(cli_requests_t *c, const char *text, int prompt_arg) {
    cli_request_t r = {.params = c->defaults, .seed = c->base_seed + (uint64_t)c->n, .prompt_arg = prompt_arg, .n = 1};
    int rc = encode_text(c, text, &r.prompt);
    if (!rc && r.prompt.len == 0) rc = mv_error("the prompt is empty");
    if (!rc) rc = push_request(c, &r);
    if (rc) {
        tok_ids_free(&r.prompt);
        mv_error_prefix("--prompt #%d", prompt_arg + 1);
    }
    return rc;
}

void cli_requests_where(const cli_requests_t *c, int i, char *buf, size_t cap) {
    if (c->reqs[i].line_no) snprintf(buf, cap, "%s:%ld", c->path, c->reqs[i].line_no);
    else snprintf(buf, cap, "--prompt #%d", c->reqs[i].prompt_arg + 1);
}

engine_request_t *cli_requests_to_engine(const cli_requests_t *c) {
    engine_request_t *reqs = calloc((size_t)(c->n ? c->n : 1), sizeof *reqs);
    for (int i = 0; reqs && i < c->n; i++)
        reqs[i] = (engine_request_t){c->reqs[i].prompt.data, (int)c->reqs[i].prompt.len, c->reqs[i].params,
                                     c->reqs[i].seed};
    return reqs;
}

engine_stop_t *cli_requests_stops(const cli_requests_t *c) {
    engine_stop_t *s = calloc((size_t)(c->n ? c->n : 1), sizeof *s);
    for (int i = 0; s && i < c->n; i++) s[i] = c->reqs[i].stop;
    return s;
}

void cli_requests_free(cli_requests_t *c) {
    for (int i = 0; i < c->n; i++) {
        tok_ids_free(&c->reqs[i].prompt);
        stop_free(&c->reqs[i].stop);
    }
    free(c->reqs);
    c->reqs = NULL;
    c->n = c->cap = 0;
}

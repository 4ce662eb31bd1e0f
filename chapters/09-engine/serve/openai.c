/*
 * chapters/09-engine/serve/openai.c - OpenAI's bodies in and out (see openai.h).
 */
#include "chapters/09-engine/serve/openai.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chapters/09-engine/model/mapped_file.h"
#include "chapters/09-engine/text/chat.h"
#include "common/check.h"

int api_fail(api_error_t *err, int status, const char *param, const char *code, const char *fmt, ...) {
    err->status = status;
    snprintf(err->param, sizeof err->param, "%s", param ? param : "");
    err->code = code;
    err->type = status >= 500 ? "server_error" : "invalid_request_error";
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->message, sizeof err->message, fmt, ap);
    va_end(ap);
    return -1;
}

// ---- JSON out, by hand: cJSON's printer stops a string at a NUL byte, and a
// ---- decoded text may hold one (the token of byte 0).

static int put(tok_bytes_t *b, const char *s) { return tok_bytes_append(b, s, strlen(s)); }

static int put_cstr(tok_bytes_t *b, const char *s) { return s ? tok_bytes_append_json(b, s, strlen(s)) : put(b, "null"); }

static int put_ids(tok_bytes_t *b, const int32_t *ids, int n) {
    int rc = put(b, "[");
    for (int k = 0; !rc && k < n; k++) rc = tok_bytes_appendf(b, k ? ",%d" : "%d", ids[k]);
    return rc || put(b, "]") ? -1 : 0;
}

char *api_error_json(const api_error_t *err) {
    tok_bytes_t b = {0};
    int rc = put(&b, "{\"error\":{\"message\":") || put_cstr(&b, err->message) || put(&b, ",\"type\":") ||
             put_cstr(&b, err->type) || put(&b, ",\"param\":") || put_cstr(&b, err->param[0] ? err->param : NULL) ||
             put(&b, ",\"code\":") || (err->code ? put_cstr(&b, err->code) : tok_bytes_appendf(&b, "%d", err->status)) ||
             put(&b, "}}");
    if (rc) {
        tok_bytes_free(&b);
        return NULL;
    }
    return b.data;
}

// ---- requests in ------------------------------------------------------------------------

// The fields each endpoint takes. Those of NOT_YET are OpenAI's or vLLM's
// and refused with "not supported yet" unless they ask for the default.
static const char *const COMPLETION_FIELDS[] = {
    "model", "prompt", "max_tokens", "temperature", "top_p", "top_k", "min_p", "seed", "n", "best_of",
    "presence_penalty", "frequency_penalty", "repetition_penalty", "min_tokens", "logprobs", "ignore_eos",
    "stop_token_ids", "stop", "include_stop_str_in_output", "stream", "stream_options", "return_token_ids",
    "skip_special_tokens", "user", NULL};
static const char *const CHAT_FIELDS[] = {
    "model", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k", "min_p", "seed",
    "n", "best_of", "presence_penalty", "frequency_penalty", "repetition_penalty", "min_tokens", "logprobs",
    "top_logprobs", "ignore_eos", "stop_token_ids", "stop", "include_stop_str_in_output", "stream",
    "stream_options", "return_token_ids", "skip_special_tokens", "user", "chat_template_kwargs",
    "add_generation_prompt", NULL};

// A field that needs sampler work the engine does not have yet, with the
// value that means "off" (then it is accepted as a no-op).
typedef enum { OFF_NULL, OFF_FALSE, OFF_EMPTY } off_kind_t;
static const struct {
    const char *name;
    off_kind_t off;
} NOT_YET[] = {
    {"prompt_logprobs", OFF_NULL}, {"logit_bias", OFF_EMPTY},
    {"echo", OFF_FALSE},      {"suffix", OFF_NULL},
    {"tools", OFF_EMPTY},     {"tool_choice", OFF_NULL},      {"response_format", OFF_NULL},
    {"parallel_tool_calls", OFF_NULL}, {"continue_final_message", OFF_FALSE}, {"guided_json", OFF_NULL},
};

static int is_off(const cJSON *v, off_kind_t k) {
    if (cJSON_IsNull(v)) return 1;
    switch (k) {
    case OFF_NULL: return 0;
    case OFF_FALSE: return cJSON_IsFalse(v) || (cJSON_IsNumber(v) && v->valuedouble == 0);
    case OFF_EMPTY: return (cJSON_IsArray(v) || cJSON_IsObject(v)) && !v->child;
    }
    return 0;
}

static int is_int(const cJSON *v, double lo, double hi) {
    return cJSON_IsNumber(v) && v->valuedouble == floor(v->valuedouble) && v->valuedouble >= lo &&
           v->valuedouble <= hi;
}

// The field, or NULL when absent or null.
static const cJSON *field(const cJSON *o, const char *name) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
    return v && !cJSON_IsNull(v) ? v : NULL;
}

static int check_fields(const cJSON *body, const char *const *known, api_error_t *err) {
    for (const cJSON *k = body->child; k; k = k->next) {
        int ok = 0;
        for (int i = 0; known[i] && !ok; i++) ok = strcmp(k->string, known[i]) == 0;
        if (ok) continue;
        for (size_t i = 0; i < sizeof NOT_YET / sizeof *NOT_YET && !ok; i++)
            if (strcmp(k->string, NOT_YET[i].name) == 0) {
                if (!is_off(k, NOT_YET[i].off))
                    return api_fail(err, 400, k->string, "not_supported", "not supported yet: %s", k->string);
                ok = 1;
            }
        if (!ok) return api_fail(err, 400, k->string, "unknown_field", "unknown field: %s", k->string);
    }
    return 0;
}

static int parse_bool(const cJSON *body, const char *name, int *out, api_error_t *err) {
    const cJSON *v = field(body, name);
    if (!v) return 0;
    if (!cJSON_IsBool(v)) return api_fail(err, 400, name, "invalid_type", "%s must be true or false", name);
    *out = cJSON_IsTrue(v);
    return 0;
}

// A number in [lo, hi] into *out (a field that is absent or null leaves it).
static int parse_range(const cJSON *body, const char *name, double lo, double hi, float *out, api_error_t *err) {
    const cJSON *v = field(body, name);
    if (!v) return 0;
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= lo && v->valuedouble <= hi))
        return api_fail(err, 400, name, "invalid_value", "%s must be a number in [%g, %g]", name, lo, hi);
    *out = (float)v->valuedouble;
    return 0;
}

// vLLM's ranges: presence and frequency in [-2, 2], repetition > 0 (and
// finite: vLLM dropped its old upper bound of 2), min_p in [0, 1];
// min_tokens >= 0 here, <= max_tokens once the prompts are known.
static int parse_penalties(const cJSON *body, api_request_t *r, api_error_t *err) {
    if (parse_range(body, "presence_penalty", -2, 2, &r->params.presence_penalty, err) ||
        parse_range(body, "frequency_penalty", -2, 2, &r->params.frequency_penalty, err) ||
        parse_range(body, "min_p", 0, 1, &r->params.min_p, err))
        return -1;
    const cJSON *v = field(body, "repetition_penalty");
    if (v && (!cJSON_IsNumber(v) || !(v->valuedouble > 0) || !isfinite((float)v->valuedouble)))
        return api_fail(err, 400, "repetition_penalty", "invalid_value",
                        "repetition_penalty must be a finite number > 0 (1 = off)");
    if (v) r->params.repetition_penalty = (float)v->valuedouble;
    if ((v = field(body, "min_tokens"))) {
        if (!is_int(v, 0, 1 << 30))
            return api_fail(err, 400, "min_tokens", "invalid_value", "min_tokens must be an integer >= 0");
        r->params.min_tokens = (int)v->valuedouble;
    }
    return 0;
}

// "n" choices per prompt; "best_of" only as vLLM V1 takes it (null or n).
static int parse_n(const cJSON *body, api_request_t *r, api_error_t *err) {
    const cJSON *v = field(body, "n");
    if (v && !is_int(v, 1, API_MAX_N))
        return api_fail(err, 400, "n", "invalid_value", "n must be an integer in [1, %d]", API_MAX_N);
    if (v) r->n = (int)v->valuedouble;
    // n copies of one greedy answer are refused, as vLLM refuses them.
    if (r->n > 1 && r->params.temperature == 0)
        return api_fail(err, 400, "n", "invalid_value", "n must be 1 when using greedy sampling (temperature 0), got %d",
                        r->n);
    if ((v = field(body, "best_of")) && !(cJSON_IsNumber(v) && v->valuedouble == r->n))
        return api_fail(err, 400, "best_of", "not_supported", "not supported yet: best_of other than n");
    return 0;
}

// Completions: "logprobs" an integer, how many likeliest tokens beside the
// sampled one. Chat: "logprobs" true, "top_logprobs" how many (OpenAI:
// top_logprobs needs logprobs). At most 20 either way (vLLM's --max-logprobs default).
static int parse_logprobs(const cJSON *body, api_kind_t kind, api_request_t *r, api_error_t *err) {
    const cJSON *v = field(body, "logprobs");
    if (kind == API_COMPLETIONS) {
        if (!v) return 0;
        if (!is_int(v, 0, SAMPLING_MAX_TOP_LOGPROBS))
            return api_fail(err, 400, "logprobs", "invalid_value", "logprobs must be an integer in [0, %d]",
                            SAMPLING_MAX_TOP_LOGPROBS);
        r->params.logprobs = 1;
        r->params.top_logprobs = (int)v->valuedouble;
        return 0;
    }
    if (parse_bool(body, "logprobs", &r->params.logprobs, err)) return -1;
    if (!(v = field(body, "top_logprobs"))) return 0;
    if (!is_int(v, 0, SAMPLING_MAX_TOP_LOGPROBS))
        return api_fail(err, 400, "top_logprobs", "invalid_value", "top_logprobs must be an integer in [0, %d]",
                        SAMPLING_MAX_TOP_LOGPROBS);
    if (v->valuedouble > 0 && !r->params.logprobs)
        return api_fail(err, 400, "top_logprobs", "invalid_value", "top_logprobs needs \"logprobs\": true");
    r->params.top_logprobs = (int)v->valuedouble;
    return 0;
}

// The sampling fields shared by both endpoints.
static int parse_sampling(const cJSON *body, api_kind_t kind, const api_context_t *ctx, api_request_t *r,
                          api_error_t *err) {
    const cJSON *v;
    const char *mt = kind == API_CHAT && field(body, "max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
    if (kind == API_CHAT && field(body, "max_completion_tokens") && field(body, "max_tokens"))
        return api_fail(err, 400, "max_completion_tokens", "invalid_value",
                        "give max_tokens or max_completion_tokens, not both");
    if ((v = field(body, mt))) {
        if (!is_int(v, 1, 1 << 30)) return api_fail(err, 400, mt, "invalid_value", "%s must be an integer >= 1", mt);
        r->params.max_tokens = (int)v->valuedouble;
    }
    if ((v = field(body, "temperature"))) {
        if (!cJSON_IsNumber(v) || !(v->valuedouble >= 0) || v->valuedouble > 1e6)
            return api_fail(err, 400, "temperature", "invalid_value", "temperature must be a number >= 0 (0 = greedy)");
        r->params.temperature = (float)v->valuedouble;
    }
    if ((v = field(body, "top_p"))) {
        if (!cJSON_IsNumber(v) || !(v->valuedouble > 0 && v->valuedouble <= 1))
            return api_fail(err, 400, "top_p", "invalid_value", "top_p must be a number in (0, 1]");
        r->params.top_p = (float)v->valuedouble;
    }
    if ((v = field(body, "top_k"))) {
        if (!is_int(v, -1, 1 << 30))
            return api_fail(err, 400, "top_k", "invalid_value", "top_k must be an integer >= -1 (-1 or 0 = off)");
        r->params.top_k = v->valuedouble < 0 ? 0 : (int)v->valuedouble;
    }
    if ((v = field(body, "seed"))) {
        if (!is_int(v, 0, 9007199254740992.0))
            return api_fail(err, 400, "seed", "invalid_value", "seed must be an integer >= 0");
        r->has_seed = 1;
        r->seed = (uint64_t)v->valuedouble;
    }
    if (parse_penalties(body, r, err) || parse_n(body, r, err) || parse_logprobs(body, kind, r, err)) return -1;
    if (parse_bool(body, "ignore_eos", &r->params.ignore_eos, err)) return -1;
    if ((v = field(body, "stop_token_ids"))) {
        if (!cJSON_IsArray(v))
            return api_fail(err, 400, "stop_token_ids", "invalid_type", "stop_token_ids must be a list of token ids");
        int n = cJSON_GetArraySize(v), k = 0;
        if (n > SAMPLER_MAX_STOP_IDS)
            return api_fail(err, 400, "stop_token_ids", "invalid_value", "stop_token_ids has %d ids, at most %d", n,
                            SAMPLER_MAX_STOP_IDS);
        r->stop_token_ids = malloc((size_t)(n ? n : 1) * sizeof(int32_t));
        if (!r->stop_token_ids) return api_fail(err, 500, NULL, NULL, "out of memory");
        for (const cJSON *e = v->child; e; e = e->next, k++) {
            if (!is_int(e, 0, ctx->vocab_size - 1))
                return api_fail(err, 400, "stop_token_ids", "invalid_value",
                                "stop_token_ids[%d] is not a token id in [0, %d)", k, ctx->vocab_size);
            r->stop_token_ids[k] = (int32_t)e->valuedouble;
        }
        r->num_stop_token_ids = n;
    }
    if ((v = field(body, "stop"))) {
        const int n = cJSON_IsString(v) ? 1 : cJSON_IsArray(v) ? cJSON_GetArraySize(v) : -1;
        if (n < 0 || n > STOP_STR_MAX)
            return api_fail(err, 400, "stop", "invalid_value", "stop must be a string or a list of up to %d strings",
                            STOP_STR_MAX);
        if (n > 0 && !ctx->tokenizer)
            return api_fail(err, 400, "stop", "invalid_value",
                            "stop strings are matched on the text, and this model has no tokenizer.json "
                            "(use stop_token_ids)");
        const cJSON *e = cJSON_IsString(v) ? v : v->child;
        for (int k = 0; k < n; k++, e = e->next) {
            if (!cJSON_IsString(e) || !e->valuestring[0])
                return api_fail(err, 400, "stop", "invalid_value", "stop[%d] must be a non-empty string", k);
            if (!(r->stop[k] = strdup(e->valuestring))) return api_fail(err, 500, NULL, NULL, "out of memory");
            r->num_stop = k + 1;
        }
    }
    if (parse_bool(body, "include_stop_str_in_output", &r->include_stop_str_in_output, err)) return -1;
    if (parse_bool(body, "stream", &r->stream, err) || parse_bool(body, "return_token_ids", &r->return_token_ids, err) ||
        parse_bool(body, "skip_special_tokens", &r->skip_special_tokens, err))
        return -1;
    if ((v = field(body, "stream_options"))) {
        if (!cJSON_IsObject(v))
            return api_fail(err, 400, "stream_options", "invalid_type", "stream_options must be an object");
        if (!r->stream)
            return api_fail(err, 400, "stream_options", "invalid_value", "stream_options needs \"stream\": true");
        for (const cJSON *k = v->child; k; k = k->next) {
            if (strcmp(k->string, "include_usage") == 0) {
                if (!cJSON_IsBool(k) && !cJSON_IsNull(k))
                    return api_fail(err, 400, "stream_options.include_usage", "invalid_type",
                                    "stream_options.include_usage must be true or false");
                r->include_usage = cJSON_IsTrue(k);
            } else if (strcmp(k->string, "continuous_usage_stats") == 0) {
                if (!is_off(k, OFF_FALSE))
                    return api_fail(err, 400, "stream_options.continuous_usage_stats", "not_supported",
                                    "not supported yet: stream_options.continuous_usage_stats");
            } else {
                return api_fail(err, 400, "stream_options", "unknown_field", "unknown field: stream_options.%s",
                                k->string);
            }
        }
    }
    if ((v = field(body, "user")) && !cJSON_IsString(v))
        return api_fail(err, 400, "user", "invalid_type", "user must be a string");
    return 0;
}

static int push_prompt(api_request_t *r, tok_ids_t *ids) {
    tok_ids_t *p = realloc(r->prompts, (size_t)(r->num_prompts + 1) * sizeof *p);
    if (!p) return -1;
    r->prompts = p;
    r->prompts[r->num_prompts++] = *ids;
    *ids = (tok_ids_t){0};
    return 0;
}

// One prompt: a string (encoded) or a list of ids.
static int one_prompt(const cJSON *v, const api_context_t *ctx, api_request_t *r, const char *param,
                      api_error_t *err) {
    tok_ids_t ids = {0};
    int rc = 0;
    if (cJSON_IsString(v)) {
        if (!ctx->tokenizer)
            rc = api_fail(err, 400, param, "invalid_value",
                          "a text prompt needs a tokenizer, and this model has no tokenizer.json (send token ids)");
        else if (tokenizer_encode((tokenizer_t *)ctx->tokenizer, v->valuestring, strlen(v->valuestring), &ids))
            rc = api_fail(err, 400, param, "invalid_value", "%s: %s", param, mv_last_error());
    } else {
        int k = 0;
        for (const cJSON *e = v->child; !rc && e; e = e->next, k++) {
            if (!is_int(e, 0, ctx->vocab_size - 1))
                rc = api_fail(err, 400, param, "invalid_value", "%s[%d] is not a token id in [0, %d)", param, k,
                              ctx->vocab_size);
            else if (tok_ids_push(&ids, (int32_t)e->valuedouble))
                rc = api_fail(err, 500, NULL, NULL, "out of memory");
        }
    }
    if (!rc && ids.len == 0) rc = api_fail(err, 400, param, "invalid_value", "%s is empty", param);
    if (!rc && (int)ids.len > ctx->max_model_len)
        rc = api_fail(err, 400, param, "context_length_exceeded",
                      "%s has %zu tokens, more than the model's context of %d (--max-model-len)", param, ids.len,
                      ctx->max_model_len);
    if (!rc && push_prompt(r, &ids)) rc = api_fail(err, 500, NULL, NULL, "out of memory");
    tok_ids_free(&ids);
    return rc;
}

// "prompt": a string, a list of strings, a list of ids, or a list of lists of ids.
static int parse_prompts(const cJSON *body, const api_context_t *ctx, api_request_t *r, api_error_t *err) {
    const cJSON *p = field(body, "prompt");
    if (!p) return api_fail(err, 400, "prompt", "missing_field", "prompt is required");
    if (cJSON_IsString(p)) return one_prompt(p, ctx, r, "prompt", err);
    if (!cJSON_IsArray(p) || !p->child)
        return api_fail(err, 400, "prompt", "invalid_type",
                        "prompt must be a string, a list of strings, a list of token ids or a list of lists of them");
    if (cJSON_IsNumber(p->child)) return one_prompt(p, ctx, r, "prompt", err);
    int k = 0;
    for (const cJSON *e = p->child; e; e = e->next, k++) {
        char param[32];
        snprintf(param, sizeof param, "prompt[%d]", k);
        if (!cJSON_IsString(e) && !(cJSON_IsArray(e) && (!e->child || cJSON_IsNumber(e->child))))
            return api_fail(err, 400, "prompt", "invalid_type", "%s must be a string or a list of token ids", param);
        if (one_prompt(e, ctx, r, param, err)) return -1;
    }
    return 0;
}

static int parse_messages(const cJSON *body, const api_context_t *ctx, api_request_t *r, api_error_t *err) {
    if (!field(body, "messages")) return api_fail(err, 400, "messages", "missing_field", "messages is required");
    if (!ctx->tokenizer)
        return api_fail(err, 400, "messages", "invalid_value", "chat needs a tokenizer, and this model has none");
    if (!tokenizer_has_qwen3_chat(ctx->tokenizer))
        return api_fail(err, 400, "messages", "invalid_value",
                        "this model's chat template is not Qwen3's, the only one implemented");
    // chat.c reads {"messages", "add_generation_prompt", "enable_thinking"}
    // from one object: vLLM takes enable_thinking in chat_template_kwargs.
    chat_options_t opt = {1, 1};
    const cJSON *kw = field(body, "chat_template_kwargs");
    if (kw && !cJSON_IsObject(kw))
        return api_fail(err, 400, "chat_template_kwargs", "invalid_type", "chat_template_kwargs must be an object");
    for (const cJSON *k = kw ? kw->child : NULL; k; k = k->next) {
        if (strcmp(k->string, "enable_thinking") != 0)
            return api_fail(err, 400, "chat_template_kwargs", "not_supported",
                            "not supported yet: chat_template_kwargs.%s (only enable_thinking)", k->string);
        if (!cJSON_IsBool(k))
            return api_fail(err, 400, "chat_template_kwargs.enable_thinking", "invalid_type",
                            "chat_template_kwargs.enable_thinking must be true or false");
        opt.enable_thinking = cJSON_IsTrue(k);
    }
    if (parse_bool(body, "add_generation_prompt", &opt.add_generation_prompt, err)) return -1;
    cJSON *view = cJSON_CreateObject();
    if (!view) return api_fail(err, 500, NULL, NULL, "out of memory");
    cJSON_AddItemReferenceToObject(view, "messages", cJSON_GetObjectItemCaseSensitive(body, "messages"));
    chat_message_t *msgs = NULL;
    int n = 0, rc = 0;
    chat_options_t ignored;
    if (chat_request_from_json(view, &msgs, &n, &ignored))
        rc = api_fail(err, 400, "messages", "invalid_value", "%s", mv_last_error());
    tok_bytes_t text = {0};
    if (!rc && chat_render_qwen3(msgs, n, &opt, &text))
        rc = api_fail(err, 400, "messages", "invalid_value", "%s", mv_last_error());
    free(msgs);
    cJSON_Delete(view);
    if (!rc) {
        cJSON *s = cJSON_CreateString("");
        // Encode the rendered text as a prompt string: one_prompt does the checks.
        if (!s) rc = api_fail(err, 500, NULL, NULL, "out of memory");
        else {
            free(s->valuestring);
            s->valuestring = text.data;  // the cJSON string owns it now
            text = (tok_bytes_t){0};
            rc = one_prompt(s, ctx, r, "messages", err);
            cJSON_Delete(s);
        }
    }
    tok_bytes_free(&text);
    return rc;
}

int api_parse_request(api_kind_t kind, const char *body, size_t len, const api_context_t *ctx, api_request_t *r,
                      api_error_t *err) {
    *r = (api_request_t){.kind = kind, .n = 1, .params = ctx->defaults, .skip_special_tokens = 1};
    r->params.max_tokens = 0;
    r->params.ignore_eos = 0;
    const char *end = NULL;
    cJSON *j = cJSON_ParseWithLengthOpts(body, len, &end, 0);
    if (!j) return api_fail(err, 400, NULL, "invalid_json", "the body is not valid JSON");
    int rc = 0;
    size_t at = (size_t)(end - body);
    while (at < len && (body[at] == ' ' || body[at] == '\t' || body[at] == '\r' || body[at] == '\n')) at++;
    if (at < len) rc = api_fail(err, 400, NULL, "invalid_json", "the body has more after its JSON value");
    else if (!cJSON_IsObject(j)) rc = api_fail(err, 400, NULL, "invalid_json", "the body must be a JSON object");
    else if (json_check_strict(j, body, len)) rc = api_fail(err, 400, NULL, "invalid_json", "%s", mv_last_error());
    if (!rc) rc = check_fields(j, kind == API_CHAT ? CHAT_FIELDS : COMPLETION_FIELDS, err);
    const cJSON *m = rc ? NULL : field(j, "model");
    if (m && !cJSON_IsString(m)) rc = api_fail(err, 400, "model", "invalid_type", "model must be a string");
    else if (m && strcmp(m->valuestring, ctx->served_model_name) != 0)
        rc = api_fail(err, 404, "model", "model_not_found", "The model `%s` does not exist (this server has `%s`).",
                      m->valuestring, ctx->served_model_name);
    if (!rc) rc = parse_sampling(j, kind, ctx, r, err);
    if (!rc) rc = kind == API_CHAT ? parse_messages(j, ctx, r, err) : parse_prompts(j, ctx, r, err);
    for (int i = 0; !rc && i < r->num_prompts; i++)
        if (r->params.min_tokens > api_max_tokens(r, ctx, i))
            rc = api_fail(err, 400, "min_tokens", "invalid_value", "min_tokens %d is more than max_tokens %d%s",
                          r->params.min_tokens, api_max_tokens(r, ctx, i),
                          r->params.max_tokens ? "" : " (the default: give max_tokens)");
    cJSON_Delete(j);
    return rc;
}

void api_request_free(api_request_t *r) {
    for (int i = 0; i < r->num_prompts; i++) tok_ids_free(&r->prompts[i]);
    free(r->prompts);
    free(r->stop_token_ids);
    for (int i = 0; i < r->num_stop; i++) free(r->stop[i]);
    *r = (api_request_t){0};
}

int api_num_choices(const api_request_t *r) { return r->num_prompts * r->n; }

int api_max_tokens(const api_request_t *r, const api_context_t *ctx, int i) {
    if (r->params.max_tokens > 0) return r->params.max_tokens;
    if (r->kind == API_COMPLETIONS) return 16;
    int left = ctx->max_model_len - (int)r->prompts[i].len;
    return left > 0 ? left : 1;
}

// ---- answers out ----------------------------------------------------------------------------

const char *api_finish_reason(const engine_output_t *o) { return engine_output_finish_reason(o); }

int api_output_text(const tokenizer_t *tok, const api_request_t *r, const engine_output_t *o, tok_bytes_t *out) {
    if (tok_bytes_append(out, "", 0)) return -1;
    if (!tok) return 0;
    if (o->text) return tok_bytes_append(out, o->text, o->text_len);
    int n = o->num_tokens;
    if (n > 0 && o->finish_reason == FINISH_EOS && !o->error) n--;  // the stop id's text is left out
    return tokenizer_decode(tok, o->token_ids, (size_t)n, r->skip_special_tokens, out);
}

static int put_head(tok_bytes_t *b, const char *object, const char *id, long long created, const api_context_t *ctx) {
    return put(b, "{\"id\":") || put_cstr(b, id) || put(b, ",\"object\":") || put_cstr(b, object) ||
           tok_bytes_appendf(b, ",\"created\":%lld,\"model\":", created) || put_cstr(b, ctx->served_model_name);
}

// "finish_reason": ..., "stop_reason": ... (vLLM's: the stop string or stop token id, else null)
static int put_finish(tok_bytes_t *b, const engine_output_t *o) {
    int rc = put(b, ",\"finish_reason\":") || put_cstr(b, api_finish_reason(o)) || put(b, ",\"stop_reason\":");
    if (rc) return -1;
    if (o->stop_str) return put_cstr(b, o->stop_str);
    return o->stop_token_id >= 0 ? tok_bytes_appendf(b, "%d", o->stop_token_id) : put(b, "null");
}

static int put_token_ids(tok_bytes_t *b, const api_request_t *r, const api_choice_t *c) {
    if (!r->return_token_ids) return 0;
    return put(b, ",\"prompt_token_ids\":") || put_ids(b, c->prompt, c->num_prompt) || put(b, ",\"token_ids\":") ||
           put_ids(b, c->out->token_ids, c->out->num_tokens);
}

// A prompt's tokens count once however many choices it has (vLLM's usage
// with n > 1), and so do its cached ones (its first choice's).
static int put_usage(tok_bytes_t *b, const api_request_t *r, const api_choice_t *choices, int n) {
    long long p = 0, g = 0, cached = 0;
    for (int i = 0; i < n; i++) {
        if (i % r->n == 0) p += choices[i].out->num_prompt_tokens, cached += choices[i].out->num_cached_tokens;
        g += choices[i].out->num_tokens;
    }
    return tok_bytes_appendf(b, "\"usage\":{\"prompt_tokens\":%lld,\"completion_tokens\":%lld,\"total_tokens\":%lld,"
                   "\"prompt_tokens_details\":{\"cached_tokens\":%lld}}",
                p, g, p + g, cached);
}

// ---- logprobs ----
//
// A token's string is its id decoded alone, special tokens kept whatever
// skip_special_tokens says (vLLM decodes each id with tokenizer.decode([id]),
// whose default keeps them; skip_special_tokens is about the text). A token
// that ends or begins inside a UTF-8 character decodes to U+FFFD there, as
// in vLLM (Hugging Face's errors="replace"); chat's "bytes" are the token's
// real bytes, as OpenAI defines them, where vLLM gives the UTF-8 of the
// string (so EF BF BD for such a piece). Without a tokenizer a token is
// "token_id:N" (vLLM's --return-tokens-as-token-ids form) and its bytes null.

// The string of token id, into s (replaced).
static int token_string(const api_context_t *ctx, int32_t id, tok_bytes_t *s) {
    s->len = 0;
    if (!ctx->tokenizer) return tok_bytes_appendf(s, "token_id:%d", id);
    return tok_bytes_append(s, "", 0) || tokenizer_decode(ctx->tokenizer, &id, 1, 0, s);
}

// A log-probability as JSON: never inf or nan, -inf (a masked id) as vLLM's -9999.0.
static int put_logprob(tok_bytes_t *b, float v) {
    if (isnan(v) || v <= -9999.0f) return put(b, "-9999.0");
    return tok_bytes_appendf(b, "%.9g", v);
}

// Code points in a decoded string (valid UTF-8): vLLM's text_offset counts Python characters.
static int utf8_chars(const tok_bytes_t *s) {
    int n = 0;
    for (size_t k = 0; k < s->len; k++) n += ((unsigned char)s->data[k] & 0xC0) != 0x80;
    return n;
}

// Chat's {"token": ..., "logprob": ..., "bytes": [...]}, without its closing brace.
static int put_chat_token(tok_bytes_t *b, const api_context_t *ctx, int32_t id, float lp, tok_bytes_t *s) {
    int rc = token_string(ctx, id, s) || put(b, "{\"token\":") || tok_bytes_append_json(b, s->data, s->len) ||
             put(b, ",\"logprob\":") || put_logprob(b, lp) || put(b, ",\"bytes\":");
    if (rc) return -1;
    const char *p = NULL;
    size_t n = 0;
    if (!ctx->tokenizer || tokenizer_token_bytes(ctx->tokenizer, id, &p, &n)) return put(b, "null");
    rc = put(b, "[");
    for (size_t k = 0; !rc && k < n; k++) rc = tok_bytes_appendf(b, k ? ",%u" : "%u", (unsigned char)p[k]);
    return rc || put(b, "]") ? -1 : 0;
}

// Chat: {"content": [one entry per token]}.
static int put_chat_logprobs(tok_bytes_t *b, const api_context_t *ctx, const api_logprobs_t *lp, tok_bytes_t *s) {
    int rc = put(b, "{\"content\":[");
    for (int k = 0; !rc && k < lp->n; k++) {
        const engine_logprob_t *e = &lp->lps[k];
        rc = (k && put(b, ",")) || put_chat_token(b, ctx, lp->ids[k], e->logprob, s) || put(b, ",\"top_logprobs\":[");
        // OpenAI's: the top_logprobs likeliest, largest first. (vLLM lists the
        // sampled token first when it is not among them, in top_logprobs' places.)
        for (int t = 0, m = 0; !rc && t < e->num_top; t++) {
            if (e->top_ids[t] < 0) continue;  // fewer ids with a value than asked
            rc = (m++ && put(b, ",")) || put_chat_token(b, ctx, e->top_ids[t], e->top_logprobs[t], s) || put(b, "}");
        }
        rc = rc || put(b, "]}");
    }
    return rc || put(b, "]}") ? -1 : 0;
}

// Completions: OpenAI's legacy {"tokens", "token_logprobs", "top_logprobs",
// "text_offset"}, as vLLM fills it: a token's top_logprobs map holds the
// sampled token first, then the likeliest (up to logprobs + 1 entries), keyed
// by token string (two ids with one string are one key, at the first's
// place with the last's value, as a Python dict has them). text_offset: the
// characters of the token strings before each, from *text_offset on.
static int put_completion_logprobs(tok_bytes_t *b, const api_context_t *ctx, const api_logprobs_t *lp,
                                   tok_bytes_t *s) {
    int rc = put(b, "{\"tokens\":[");
    int offset = lp->text_offset ? *lp->text_offset : 0;
    for (int k = 0; !rc && k < lp->n; k++)
        rc = (k && put(b, ",")) || token_string(ctx, lp->ids[k], s) || tok_bytes_append_json(b, s->data, s->len);
    rc = rc || put(b, "],\"token_logprobs\":[");
    for (int k = 0; !rc && k < lp->n; k++) rc = (k && put(b, ",")) || put_logprob(b, lp->lps[k].logprob);
    rc = rc || put(b, "],\"top_logprobs\":[");
    tok_bytes_t keys[SAMPLING_MAX_TOP_LOGPROBS + 1] = {{0}};
    for (int k = 0; !rc && k < lp->n; k++) {
        const engine_logprob_t *e = &lp->lps[k];
        float vals[SAMPLING_MAX_TOP_LOGPROBS + 1];
        int m = 0;
        rc = token_string(ctx, lp->ids[k], &keys[m]);
        vals[m++] = e->logprob;
        for (int t = 0; !rc && t < e->num_top; t++) {
            if (e->top_ids[t] < 0 || e->top_ids[t] == lp->ids[k]) continue;  // none, or the sampled one again
            rc = token_string(ctx, e->top_ids[t], &keys[m]);
            int same = 0;
            while (same < m && !(keys[same].len == keys[m].len && !memcmp(keys[same].data, keys[m].data, keys[m].len)))
                same++;
            vals[same] = e->top_logprobs[t];
            if (same == m) m++;
        }
        rc = rc || (k && put(b, ",")) || put(b, "{");
        for (int t = 0; !rc && t < m; t++)
            rc = (t && put(b, ",")) || tok_bytes_append_json(b, keys[t].data, keys[t].len) || put(b, ":") ||
                 put_logprob(b, vals[t]);
        rc = rc || put(b, "}");
    }
    for (int t = 0; t <= SAMPLING_MAX_TOP_LOGPROBS; t++) tok_bytes_free(&keys[t]);
    rc = rc || put(b, "],\"text_offset\":[");
    for (int k = 0; !rc && k < lp->n; k++) {
        rc = (k && put(b, ",")) || tok_bytes_appendf(b, "%d", offset) || token_string(ctx, lp->ids[k], s);
        offset += utf8_chars(s);
    }
    if (lp->text_offset) *lp->text_offset = offset;
    return rc || put(b, "]}") ? -1 : 0;
}

// ,"logprobs": ... of a choice or a chunk: null unless the request asked for them.
static int put_logprobs(tok_bytes_t *b, const api_request_t *r, const api_context_t *ctx, const api_logprobs_t *lp) {
    if (!r->params.logprobs || !lp) return put(b, ",\"logprobs\":null");
    tok_bytes_t s = {0};
    int rc = put(b, ",\"logprobs\":") ||
             (r->kind == API_CHAT ? put_chat_logprobs(b, ctx, lp, &s) : put_completion_logprobs(b, ctx, lp, &s));
    tok_bytes_free(&s);
    return rc ? -1 : 0;
}

int api_response_json(const api_request_t *r, const api_context_t *ctx, const char *id, long long created,
                      const api_choice_t *choices, int n, tok_bytes_t *b) {
    const int chat = r->kind == API_CHAT;
    tok_bytes_t text = {0};
    int rc = put_head(b, chat ? "chat.completion" : "text_completion", id, created, ctx) || put(b, ",\"choices\":[");
    for (int i = 0; !rc && i < n; i++) {
        text.len = 0;
        rc = api_output_text(ctx->tokenizer, r, choices[i].out, &text) || tok_bytes_appendf(b, i ? ",{\"index\":%d" : "{\"index\":%d", i);
        if (!rc && chat)
            rc = put(b, ",\"message\":{\"role\":\"assistant\",\"content\":") || tok_bytes_append_json(b, text.data, text.len) ||
                 put(b, "}");
        else if (!rc)
            rc = put(b, ",\"text\":") || tok_bytes_append_json(b, text.data, text.len);
        const engine_output_t *o = choices[i].out;
        // Every token's, the one that stopped it included (vLLM's token_ids and logprobs both keep it).
        const api_logprobs_t lp = {o->token_ids, o->logprobs, o->logprobs ? o->num_tokens : 0, NULL};
        rc = rc || put_logprobs(b, r, ctx, &lp) || put_finish(b, o) || put_token_ids(b, r, &choices[i]) ||
             put(b, "}");
    }
    rc = rc || put(b, "],") || put_usage(b, r, choices, n) || put(b, "}");
    tok_bytes_free(&text);
    return rc ? -1 : 0;
}

int api_chunk_role(const api_request_t *r, const api_context_t *ctx, const char *id, long long created, int index,
                   tok_bytes_t *b) {
    return put(b, "data: ") || put_head(b, "chat.completion.chunk", id, created, ctx) ||
                   tok_bytes_appendf(b, ",\"choices\":[{\"index\":%d,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},"
                           "\"logprobs\":null,\"finish_reason\":null}]}\n\n",
                        index)
               ? -1
               : 0;
}

int api_chunk_text(const api_request_t *r, const api_context_t *ctx, const char *id, long long created, int index,
                   const char *text, size_t len, const api_logprobs_t *lp, const api_choice_t *finish,
                   tok_bytes_t *b) {
    const int chat = r->kind == API_CHAT;
    int rc = put(b, "data: ") || put_head(b, chat ? "chat.completion.chunk" : "text_completion", id, created, ctx) ||
             tok_bytes_appendf(b, ",\"choices\":[{\"index\":%d", index);
    if (chat) rc = rc || put(b, ",\"delta\":") || (len || !finish ? put(b, "{\"content\":") || tok_bytes_append_json(b, text, len) || put(b, "}") : put(b, "{}"));
    else rc = rc || put(b, ",\"text\":") || tok_bytes_append_json(b, text, len);
    rc = rc || put_logprobs(b, r, ctx, lp);
    if (finish) rc = rc || put_finish(b, finish->out) || put_token_ids(b, r, finish);
    else rc = rc || put(b, ",\"finish_reason\":null");
    return rc || put(b, "}]}\n\n") ? -1 : 0;
}

int api_chunk_usage(const api_request_t *r, const api_context_t *ctx, const char *id, long long created,
                    const api_choice_t *choices, int n, tok_bytes_t *b) {
    const int chat = r->kind == API_CHAT;
    return put(b, "data: ") || put_head(b, chat ? "chat.completion.chunk" : "text_completion", id, created, ctx) ||
                   put(b, ",\"choices\":[],") || put_usage(b, r, choices, n) || put(b, "}\n\n")
               ? -1
               : 0;
}

int api_chunk_done(tok_bytes_t *b) { return put(b, "data: [DONE]\n\n"); }

int api_chunk_error(const api_error_t *err, tok_bytes_t *b) {
    char *j = api_error_json(err);
    int rc = !j || put(b, "data: ") || put(b, j) || put(b, "\n\n");
    free(j);
    return rc ? -1 : 0;
}

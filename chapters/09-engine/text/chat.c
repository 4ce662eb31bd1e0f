/*
 * chapters/09-engine/text/chat.c - Qwen3's chat template, rendered in C (see chat.h).
 *
 * Each function below mirrors one part of the Jinja template in
 * ../shared/models/qwen3-0.6b/tokenizer_config.json; the comments quote the
 * Jinja so the two can be read side by side. Python's str.strip('\n') and
 * str.split() semantics are spelt out in small helpers.
 */
#include "chapters/09-engine/text/chat.h"

#include <stdlib.h>
#include <string.h>

#include "common/check.h"

// A view of part of a string: Python slicing without copies.
typedef struct {
    const char *p;
    size_t n;
} span_t;

static span_t span_of(const char *s) { return (span_t){s, strlen(s)}; }

static span_t lstrip_nl(span_t s) {
    while (s.n && s.p[0] == '\n') s.p++, s.n--;
    return s;
}

static span_t rstrip_nl(span_t s) {
    while (s.n && s.p[s.n - 1] == '\n') s.n--;
    return s;
}

// The offset of the first / last occurrence of `needle` in s, or -1.
static long find_first(span_t s, const char *needle) {
    size_t k = strlen(needle);
    for (size_t i = 0; i + k <= s.n; i++)
        if (memcmp(s.p + i, needle, k) == 0) return (long)i;
    return -1;
}

static long find_last(span_t s, const char *needle) {
    size_t k = strlen(needle);
    for (size_t i = s.n >= k ? s.n - k + 1 : 0; i-- > 0;)
        if (memcmp(s.p + i, needle, k) == 0) return (long)i;
    return -1;
}

// s.split(sep)[-1] and s.split(sep)[0].
static span_t after_last(span_t s, const char *sep) {
    long i = find_last(s, sep);
    if (i < 0) return s;
    size_t skip = (size_t)i + strlen(sep);
    return (span_t){s.p + skip, s.n - skip};
}

static span_t before_first(span_t s, const char *sep) {
    long i = find_first(s, sep);
    return i < 0 ? s : (span_t){s.p, (size_t)i};
}

static int put(tok_bytes_t *out, const char *s) { return tok_bytes_append(out, s, strlen(s)); }
static int put_span(tok_bytes_t *out, span_t s) { return tok_bytes_append(out, s.p, s.n); }

static int has_prefix_suffix(const char *s, const char *pre, const char *suf) {
    size_t n = strlen(s), a = strlen(pre), b = strlen(suf);
    return n >= a && n >= b && memcmp(s, pre, a) == 0 && memcmp(s + n - b, suf, b) == 0;
}

// {%- for message in messages[::-1] %} ... : the index of the last user turn
// that is a real query, not a tool response passed back as a user turn.
// Assistant turns after it are the current answer, whose thinking is shown.
static int last_query_index(const chat_message_t *m, int n) {
    for (int i = n - 1; i >= 0; i--)
        if (strcmp(m[i].role, "user") == 0 &&
            !has_prefix_suffix(m[i].content, "<tool_response>", "</tool_response>"))
            return i;
    return n - 1;
}

static int render_assistant(const chat_message_t *m, int i, int n, int last_query, tok_bytes_t *out) {
    span_t content = span_of(m[i].content), reasoning = {"", 0};
    if (m[i].reasoning_content) {
        reasoning = span_of(m[i].reasoning_content);
    } else if (find_first(content, "</think>") >= 0) {
        // Thinking written inline: "<think>\n...\n</think>\n\nanswer".
        span_t whole = content;
        content = lstrip_nl(after_last(whole, "</think>"));
        reasoning = lstrip_nl(after_last(rstrip_nl(before_first(whole, "</think>")), "<think>"));
    }
    int rc = put(out, "<|im_start|>assistant\n");
    // Only the turns answering the last query keep their thinking; older
    // turns are shown as bare answers, as the model saw them in training.
    if (i > last_query && (i == n - 1 || reasoning.n)) {
        // reasoning_content.strip('\n'): both ends.
        rc = rc || put(out, "<think>\n") || put_span(out, rstrip_nl(lstrip_nl(reasoning))) ||
             put(out, "\n</think>\n\n") || put_span(out, lstrip_nl(content));
    } else {
        rc = rc || put_span(out, content);
    }
    return rc || put(out, "<|im_end|>\n");
}

int chat_render_qwen3(const chat_message_t *m, int n, const chat_options_t *opt, tok_bytes_t *out) {
    if (n <= 0) return mv_error("chat: the message list is empty");
    for (int i = 0; i < n; i++) {
        if (!m[i].role || !m[i].content) return mv_error("chat: message %d lacks a role or content", i);
        const char *r = m[i].role;
        if (strcmp(r, "system") && strcmp(r, "user") && strcmp(r, "assistant") && strcmp(r, "tool"))
            return mv_error("chat: message %d has role \"%s\" (expected system, user, assistant or tool)", i, r);
    }
    int rc = tok_bytes_append(out, "", 0);
    // A leading system message opens the text.
    if (strcmp(m[0].role, "system") == 0)
        rc = rc || put(out, "<|im_start|>system\n") || put(out, m[0].content) || put(out, "<|im_end|>\n");
    int last_query = last_query_index(m, n);
    for (int i = 0; i < n && !rc; i++) {
        const char *role = m[i].role;
        if (strcmp(role, "user") == 0 || (strcmp(role, "system") == 0 && i > 0)) {
            rc = put(out, "<|im_start|>") || put(out, role) || put(out, "\n") || put(out, m[i].content) ||
                 put(out, "<|im_end|>\n");
        } else if (strcmp(role, "assistant") == 0) {
            rc = render_assistant(m, i, n, last_query, out);
        } else if (strcmp(role, "tool") == 0) {
            // Consecutive tool responses share one user turn.
            if (i == 0 || strcmp(m[i - 1].role, "tool") != 0) rc = put(out, "<|im_start|>user");
            rc = rc || put(out, "\n<tool_response>\n") || put(out, m[i].content) || put(out, "\n</tool_response>");
            if (!rc && (i == n - 1 || strcmp(m[i + 1].role, "tool") != 0)) rc = put(out, "<|im_end|>\n");
        }
    }
    if (!rc && opt->add_generation_prompt) {
        rc = put(out, "<|im_start|>assistant\n");
        // "enable_thinking is false": an empty thinking block, already closed,
        // tells the model to skip thinking and answer.
        if (!rc && !opt->enable_thinking) rc = put(out, "<think>\n\n</think>\n\n");
    }
    return rc ? -1 : 0;
}

static int json_bool(const cJSON *req, const char *key, int dflt, int *value) {
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(req, key);
    if (!j || cJSON_IsNull(j)) {
        *value = dflt;
        return 0;
    }
    if (!cJSON_IsBool(j)) return mv_error("chat: \"%s\" must be true or false", key);
    *value = cJSON_IsTrue(j);
    return 0;
}

int chat_request_from_json(const cJSON *req, chat_message_t **messages, int *n, chat_options_t *opt) {
    const cJSON *arr = cJSON_GetObjectItemCaseSensitive(req, "messages");
    *messages = NULL;
    *n = 0;
    if (!cJSON_IsArray(arr)) return mv_error("chat: \"messages\" must be an array");
    // enable_thinking defaults to on: the template only acts on an explicit false.
    if (json_bool(req, "add_generation_prompt", 0, &opt->add_generation_prompt) ||
        json_bool(req, "enable_thinking", 1, &opt->enable_thinking))
        return -1;
    int count = cJSON_GetArraySize(arr);
    chat_message_t *m = calloc((size_t)count + 1, sizeof *m);
    if (!m) return mv_error("out of memory");
    int i = 0;
    for (const cJSON *e = arr->child; e; e = e->next, i++) {
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(e, "role");
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(e, "content");
        const cJSON *reasoning = cJSON_GetObjectItemCaseSensitive(e, "reasoning_content");
        const char *bad = !cJSON_IsString(role) ? "\"role\" must be a string"
                          : !cJSON_IsString(content) ? "\"content\" must be a string"
                          : reasoning && !cJSON_IsNull(reasoning) && !cJSON_IsString(reasoning)
                              ? "\"reasoning_content\" must be a string or null"
                          : cJSON_GetObjectItemCaseSensitive(e, "tool_calls") ? "tool_calls are not supported yet"
                                                                              : NULL;
        if (bad) {
            free(m);
            return mv_error("chat: message %d: %s", i, bad);
        }
        m[i].role = role->valuestring;
        m[i].content = content->valuestring;
        m[i].reasoning_content = cJSON_IsString(reasoning) ? reasoning->valuestring : NULL;
    }
    if (cJSON_GetObjectItemCaseSensitive(req, "tools")) {
        free(m);
        return mv_error("chat: \"tools\" are not supported yet");
    }
    *messages = m;
    *n = count;
    return 0;
}

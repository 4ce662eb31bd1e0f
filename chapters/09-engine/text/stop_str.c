/*
 * chapters/09-engine/text/stop_str.c - stop strings on the decoded text (see stop_str.h).
 */
#include "chapters/09-engine/text/stop_str.h"

#include <stdlib.h>
#include <string.h>

#include "common/check.h"

int stop_text_init(stop_text_t *s, const tokenizer_t *tok, const char *const *stops, int n, int include,
                   int skip_special) {
    *s = (stop_text_t){.tok = tok, .include = include, .matched = -1};
    tok_stream_init(&s->dec, skip_special);
    if (!tok) return mv_error("stop strings need a tokenizer");
    if (n < 0 || n > STOP_STR_MAX) return mv_error("stop: at most %d strings, got %d", STOP_STR_MAX, n);
    for (int i = 0; i < n; i++) {
        if (!stops[i] || !stops[i][0]) {
            stop_text_free(s);
            return mv_error("stop[%d] is empty", i);
        }
        if (!(s->stops[i] = strdup(stops[i]))) {
            stop_text_free(s);
            return mv_error("out of memory");
        }
        s->num_stops = i + 1;
        size_t len = strlen(stops[i]);
        if (len > s->max_len) s->max_len = len;
    }
    return tok_bytes_append(&s->text, "", 0);
}

void stop_text_free(stop_text_t *s) {
    for (int i = 0; i < s->num_stops; i++) free(s->stops[i]);
    tok_bytes_free(&s->text);
    *s = (stop_text_t){.matched = -1};
}

// memmem over a text that may hold NUL bytes (a decoded byte 0).
static const char *find(const char *hay, size_t n, const char *needle, size_t m) {
    for (size_t i = 0; m <= n && i + m <= n; i++)
        if (hay[i] == needle[0] && memcmp(hay + i, needle, m) == 0) return hay + i;
    return NULL;
}

int stop_text_push(stop_text_t *s, int32_t id) {
    if (s->matched >= 0 || s->finished) return s->matched >= 0;
    const size_t before = s->text.len;
    if (tok_stream_push(s->tok, &s->dec, id, &s->text)) return -1;
    const size_t added = s->text.len - before;
    s->pushed++;
    // vLLM looks for stop strings once the output is longer than min_tokens.
    if (added == 0 || s->pushed <= s->min_tokens) return 0;
    for (int i = 0; i < s->num_stops; i++) {
        const size_t m = strlen(s->stops[i]);
        // The new text and the m - 1 bytes before it: where a match can end in this token.
        size_t from = before + 1 > m ? before + 1 - m : 0;
        const char *at = find(s->text.data + from, s->text.len - from, s->stops[i], m);
        if (!at) continue;
        size_t cut = (size_t)(at - s->text.data) + (s->include ? m : 0);
        s->text.len = cut;
        s->text.data[cut] = '\0';
        if (s->sent > cut) s->sent = cut;  // cannot happen: what might be cut is never sent
        s->matched = i;
        return 1;
    }
    return 0;
}

int stop_text_finish(stop_text_t *s) {
    if (s->finished) return 0;
    s->finished = 1;
    return s->matched >= 0 ? 0 : tok_stream_flush(&s->dec, &s->text);
}

// Bytes at the end of the text that could be the start of a stop string.
static size_t held_back(const stop_text_t *s) {
    if (s->finished || s->matched >= 0 || s->include) return 0;
    const size_t unsent = s->text.len - s->sent;
    size_t hold = 0;
    for (int i = 0; i < s->num_stops; i++) {
        const size_t m = strlen(s->stops[i]);
        // The longest proper prefix of stop i that the text ends with.
        for (size_t k = (m - 1 < unsent ? m - 1 : unsent); k > hold; k--)
            if (memcmp(s->text.data + s->text.len - k, s->stops[i], k) == 0) {
                hold = k;
                break;
            }
    }
    return hold;
}

const char *stop_text_take(stop_text_t *s, size_t *len) {
    const size_t end = s->text.len - held_back(s);
    const char *p = s->text.data + s->sent;
    *len = end > s->sent ? end - s->sent : 0;
    s->sent += *len;
    return p;
}

const char *stop_text_matched(const stop_text_t *s) { return s->matched >= 0 ? s->stops[s->matched] : NULL; }

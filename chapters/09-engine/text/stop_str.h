/*
 * chapters/09-engine/text/stop_str.h - stop strings, checked on the text as tokens arrive.
 *
 * Where it sits: between the sampler and the user, beside the streaming
 * decoder (tokenizer.h). A request with "stop": ["\n\n", "User:"] ends as
 * soon as one of them appears in its decoded text, as vLLM ends it: the
 * text is cut before the stop string (after it with
 * include_stop_str_in_output), finish_reason is "stop" and stop_reason the
 * string. The engine (runtime/engine.c) runs one of these per request to
 * know when to end it; a streaming answer (serve/http.c) runs its own over
 * the same tokens to know what it may show.
 *
 * Matching is on the text, not the tokens: a stop string may span several
 * tokens, or end inside one (then the rest of that token's text is cut too).
 * Each new piece of text is searched together with the len - 1 bytes before
 * it, so a string split across tokens is found in the step that completes
 * it. When several complete in the same step, the first in the list wins
 * (vLLM's order).
 *
 * Streaming without a half-shown stop: a client must never see text that is
 * then taken back. So the text that could still be the start of a stop
 * string (the longest end of the text that is a prefix of one) is held back
 * until the next token settles it: either it completes the stop (and is cut)
 * or it does not (and is sent). With include_stop_str_in_output nothing is
 * ever taken back, so nothing is held. Bytes, not characters: the decoder
 * hands over whole UTF-8 characters and a stop string starts on one, so a
 * held-back tail always starts on a character boundary.
 *
 * Tests: tests/test_engine_cpu.c (stop_strings), tests/serve/openai_client_test.py (test_stop).
 */
#ifndef MV_STOP_STR_H
#define MV_STOP_STR_H

#include <stddef.h>
#include <stdint.h>

#include "chapters/09-engine/text/tokenizer.h"

#ifdef __cplusplus
extern "C" {
#endif

// OpenAI's limit on "stop": a string or a list of up to 4.
#define STOP_STR_MAX 4

typedef struct {
    const tokenizer_t *tok;
    tok_stream_t dec;             // the streaming decoder: whole characters only
    char *stops[STOP_STR_MAX];    // [num_stops] the stop strings, copied, non-empty
    int num_stops;
    int include;                  // include_stop_str_in_output: keep the stop string in the text
    size_t max_len;               // the longest stop string's length in bytes
    tok_bytes_t text;             // the text so far; cut at the stop once one matched
    size_t sent;                  // of text, bytes handed out by stop_text_take
    int matched;                  // the index of the stop string found, -1 while none
    int finished;                 // stop_text_finish ran: nothing more is held back
    int min_tokens;               // no stop is looked for until more tokens than this were pushed
                                  // (sampling_params_t.min_tokens; set it after stop_text_init)
    int pushed;                   // tokens pushed
} stop_text_t;

// stops[0..n) (n <= STOP_STR_MAX, none empty) over tok's decoding of the
// ids pushed (special tokens skipped as skip_special says). n = 0 is a plain
// streaming decoder. -1 with mv_error() on a bad list or no memory.
int stop_text_init(stop_text_t *s, const tokenizer_t *tok, const char *const *stops, int n, int include,
                   int skip_special);
void stop_text_free(stop_text_t *s);
// One token's text: 1 when it completed a stop string (s->matched set, the
// text cut; push nothing more), 0 when not, -1 with mv_error().
int stop_text_push(stop_text_t *s, int32_t id);
// The sequence is over: a character the decoder still holds becomes U+FFFD
// (unless a stop matched: the text was cut before it), and nothing is held back.
int stop_text_finish(stop_text_t *s);
// The text that is settled and not yet taken: *len bytes from the returned
// pointer (into s->text), marked taken.
const char *stop_text_take(stop_text_t *s, size_t *len);
// The matched stop string, or NULL.
const char *stop_text_matched(const stop_text_t *s);

#ifdef __cplusplus
}
#endif
#endif

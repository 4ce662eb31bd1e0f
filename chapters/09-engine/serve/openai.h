/*
 * chapters/09-engine/serve/openai.h - OpenAI's request and response bodies, in C.
 *
 * Where it sits: between the HTTP layer (http.c, which receives the bytes)
 * and the engine thread (engine_thread.c, which runs token ids). A body of
 * POST /v1/completions or /v1/chat/completions becomes an api_request_t:
 * prompts as token ids (text through the tokenizer, messages through Qwen3's
 * chat template, text/chat.c), the sampling parameters the engine has, and
 * how to answer (stream or not, usage in the stream, token ids or not).
 * The answers are built here too: one JSON body, or the server-sent-event
 * chunks of a stream, in OpenAI's shapes (and vLLM's extensions: stop_reason,
 * return_token_ids, top_k, ignore_eos, stop_token_ids, include_stop_str_in_output,
 * chat_template_kwargs). "stop" strings end a choice as vLLM's do: its text
 * cut before the string, finish_reason "stop", stop_reason the string.
 *
 * Sampling as vLLM's SamplingParams has it (sequence.h, runtime/sampler.h):
 *   n (1..API_MAX_N)       choices per prompt: choice index = prompt * n + j, choice j
 *                          drawing with seed + j when "seed" is given (vLLM's
 *                          ParentRequest), else with a seed of its own; greedy
 *                          (temperature 0) with n > 1 is refused, as vLLM does;
 *                          best_of only as null or equal to n
 *   presence_penalty, frequency_penalty in [-2, 2]; repetition_penalty > 0
 *                          (finite; vLLM has no upper bound); min_p in [0, 1];
 *   min_tokens (0..max_tokens): eos and stop_token_ids masked, stop strings
 *                          not looked for, until that many tokens;
 *   logprobs               completions: an integer 0..20 (the sampled token's
 *                          log-probability and that many likeliest), in the
 *                          legacy shape {tokens, token_logprobs, top_logprobs,
 *                          text_offset}; chat: true, with top_logprobs 0..20, as
 *                          {content: [{token, logprob, bytes, top_logprobs}]}.
 *                          Of the raw logits (vLLM's default), -inf written as
 *                          -9999.0 (vLLM's clamp). See put_logprobs in openai.c
 *                          for the token strings.
 *
 * Strict, as the rest of the engine is: an unknown field, a wrong type or an
 * out-of-range value is a 400 naming the field (its "param"), and a field of
 * OpenAI's or vLLM's that the engine does not do yet (prompt_logprobs, echo,
 * suffix, logit_bias, tools, tool_choice, response_format, guided_json,
 * continue_final_message...) is a 400 "not supported yet: FIELD" rather
 * than silently ignored. A field given as JSON null is taken as not given,
 * as OpenAI's own server does, and so is a value that asks for the default
 * (echo = false, logit_bias = {} ...).
 *
 * No HTTP or threads in here: tests can drive it in-process.
 */
#ifndef MV_SERVE_OPENAI_H
#define MV_SERVE_OPENAI_H

#include <stdint.h>

#include "chapters/08-scheduler/sched/sequence.h"
#include "chapters/09-engine/runtime/engine.h"
#include "chapters/09-engine/text/tokenizer.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { API_COMPLETIONS, API_CHAT } api_kind_t;

// The largest "n" taken (OpenAI's own limit; vLLM's VLLM_MAX_N_SEQUENCES is
// 16384). Each choice is one engine request, and --max-queued-requests counts them.
#define API_MAX_N 128

// An error as OpenAI's schema carries it: {"error": {"message", "type", "param", "code"}}.
typedef struct {
    int status;          // the HTTP status: 400, 401, 404, 405, 413, 500, 503
    char message[512];
    char param[64];      // the field at fault, "" for none (null in the body)
    const char *type;    // "invalid_request_error", "server_error"...
    const char *code;    // NULL for null
} api_error_t;

// Fill *err and return -1.
int api_fail(api_error_t *err, int status, const char *param, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
// The error body, malloc'd, NUL-terminated.
char *api_error_json(const api_error_t *err);

// What a body is parsed against: the model being served.
typedef struct {
    const char *served_model_name;  // "model" must be this (else 404), when given
    const tokenizer_t *tokenizer;   // NULL: text prompts and messages are refused
    int vocab_size;
    int max_model_len;
    sampling_params_t defaults;     // generation_config.json's temperature, top_k, top_p
} api_context_t;

typedef struct {
    api_kind_t kind;
    tok_ids_t *prompts;            // [num_prompts] token ids, n engine requests each
    int num_prompts;
    int n;                         // choices per prompt (>= 1): choice p * n + j is prompt p's j-th
    sampling_params_t params;      // max_tokens: as given, or 0 (= the default for each prompt);
                                   // logprobs / top_logprobs: as the engine takes them (1 and 0..20)
    int has_seed;
    uint64_t seed;                 // with has_seed: choice p * n + j draws with seed + j
    int32_t *stop_token_ids;       // [num_stop_token_ids], malloc'd
    int num_stop_token_ids;
    char *stop[STOP_STR_MAX];      // [num_stop] "stop" strings, malloc'd (text/stop_str.h: they need the tokenizer)
    int num_stop;
    int include_stop_str_in_output;  // vLLM's: the text keeps the stop string that ended it
    int stream;                    // "stream": true: server-sent events
    int include_usage;             // stream_options.include_usage: a last chunk with usage
    int return_token_ids;          // vLLM's: choices carry "token_ids" (and "prompt_token_ids")
    int skip_special_tokens;       // decode without special tokens (default 1)
} api_request_t;

// Parse body[0..len). 0, or -1 with *err (400 naming the field, 404 for
// another model). *out is filled either way; free it with api_request_free.
int api_parse_request(api_kind_t kind, const char *body, size_t len, const api_context_t *ctx, api_request_t *out,
                      api_error_t *err);
void api_request_free(api_request_t *r);

// num_prompts * n: the choices of the answer, one engine request each.
int api_num_choices(const api_request_t *r);

// max_tokens for prompt i: as given, else 16 for completions (OpenAI's
// default) and what is left of max_model_len for chat (vLLM's).
int api_max_tokens(const api_request_t *r, const api_context_t *ctx, int i);

// ---- answers -----------------------------------------------------------------------------

// One choice's result, as the engine finished it.
typedef struct {
    const engine_output_t *out;    // token ids, finish reason, stop_token_id, logprobs
    const int32_t *prompt;         // [num_prompt] for return_token_ids
    int num_prompt;
} api_choice_t;

// Some tokens of a choice with their log-probabilities, for one stream chunk.
typedef struct {
    const int32_t *ids;            // [n] the tokens
    const engine_logprob_t *lps;   // [n] theirs
    int n;
    int *text_offset;              // completions: text_offset of ids[0] in, of the token after ids[n-1] out
} api_logprobs_t;

// The text of a finished output: its ids decoded (special tokens skipped as
// r says), without the id that stopped it (an eos or a stop_token_ids entry),
// as vLLM leaves it out; with stop strings, the engine's text, cut at the
// one that matched. Appended to out.
int api_output_text(const tokenizer_t *tok, const api_request_t *r, const engine_output_t *o, tok_bytes_t *out);
// "stop", "length", "abort" or "error".
const char *api_finish_reason(const engine_output_t *o);

// The whole answer without streaming: {"id", "object", "created", "model",
// "choices": [...], "usage": {...}}, appended to out.
int api_response_json(const api_request_t *r, const api_context_t *ctx, const char *id, long long created,
                      const api_choice_t *choices, int n, tok_bytes_t *out);

// Streaming: one "data: {...}\n\n" event, appended to out.
// The first chunk of a chat choice: delta {"role": "assistant", "content": ""}.
int api_chunk_role(const api_request_t *r, const api_context_t *ctx, const char *id, long long created, int index,
                   tok_bytes_t *out);
// Text of choice `index` (a delta) and, with logprobs, those of the tokens
// it came from (lp; NULL writes "logprobs": null); with finish (non-NULL) the
// choice's last chunk, carrying finish_reason (and its token ids with return_token_ids).
int api_chunk_text(const api_request_t *r, const api_context_t *ctx, const char *id, long long created, int index,
                   const char *text, size_t len, const api_logprobs_t *lp, const api_choice_t *finish,
                   tok_bytes_t *out);
// stream_options.include_usage: "choices": [] and the usage of all choices
// (prompt tokens counted once per prompt, as vLLM counts them with n > 1).
int api_chunk_usage(const api_request_t *r, const api_context_t *ctx, const char *id, long long created,
                    const api_choice_t *choices, int n, tok_bytes_t *out);
// "data: [DONE]\n\n"
int api_chunk_done(tok_bytes_t *out);
// An error in the middle of a stream (the status is sent already): data: {"error": ...}
int api_chunk_error(const api_error_t *err, tok_bytes_t *out);

#ifdef __cplusplus
}
#endif
#endif

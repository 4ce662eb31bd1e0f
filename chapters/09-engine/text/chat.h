/*
 * chapters/09-engine/text/chat.h - Qwen3's chat format, rendered in C.
 *
 * A chat model does not see "messages"; it sees one text in which every
 * turn is wrapped in ChatML markers:
 *
 *     <|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n
 *
 * Hugging Face renders that text from a Jinja template stored in
 * tokenizer_config.json. We render the same text directly, for the cases the
 * engine needs (system, user, assistant and tool-response turns,
 * add_generation_prompt, enable_thinking; no tool definitions or tool calls
 * yet), and tests/tokenizer/compare_hf.py checks it against
 * transformers' apply_chat_template, case by case.
 *
 * Try it:  ./build/minivllm tokenize --model DIR --input requests.jsonl
 * with a line like {"messages": [{"role": "user", "content": "Hi"}],
 *                   "add_generation_prompt": true, "enable_thinking": false}
 */
#ifndef MV_CHAT_H
#define MV_CHAT_H

#include <cjson/cJSON.h>

#include "chapters/09-engine/text/tokenizer.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    const char *role;               // "system", "user", "assistant" or "tool"
    const char *content;
    const char *reasoning_content;  // assistant only: its thinking; NULL if absent
} chat_message_t;

typedef struct {
    int add_generation_prompt;  // 1: end with "<|im_start|>assistant\n" for the model to continue
    int enable_thinking;        // 0: prefill an empty <think></think>, so the model answers at once
} chat_options_t;

// Append the text Qwen3's template renders for messages[0..n) to out.
// An unknown role, an empty list or a tool call is an error (-1).
int chat_render_qwen3(const chat_message_t *messages, int n, const chat_options_t *opt, tok_bytes_t *out);

// Read a request object {"messages": [...], "add_generation_prompt": bool,
// "enable_thinking": bool}. *messages is malloc'd (free it); its strings
// point into `request`, which must outlive it.
int chat_request_from_json(const cJSON *request, chat_message_t **messages, int *n, chat_options_t *opt);

#ifdef __cplusplus
}
#endif
#endif

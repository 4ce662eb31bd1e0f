/*
 * chapters/09-engine/text/tokenizer.h - Qwen3's tokenizer in plain C: text <-> token ids.
 *
 * Where it sits: the first and last step of the engine. A request's text is
 * turned into ids here before prefill, and every sampled id is turned back
 * into text here (through the streaming decoder) before it reaches the user.
 *
 * What it implements, read from a Hugging Face model directory
 * (tokenizer.json + tokenizer_config.json):
 *   1. added tokens (<|im_start|>, <|endoftext|>, <think>...) found whole in
 *      the raw text, leftmost-longest, before anything else;
 *   2. NFC normalisation of the text between them (utf8proc);
 *   3. the pre-tokenizer regex that cuts text into "words" (PCRE2, JIT);
 *   4. byte-level BPE on each word: its bytes, merged pair by pair in
 *      order of merge rank, with a word -> ids cache;
 *   5. decoding: ids -> bytes -> UTF-8 text, invalid bytes shown as U+FFFD,
 *      and a streaming decoder that holds back an incomplete character.
 * docs/09-tokenizer.md explains each step.
 *
 * A tokenizer_t is used by one thread at a time (encode updates its cache
 * and scratch buffers); decoding only reads it.
 *
 * Errors: every function that can fail returns 0 / -1 (or NULL) and records
 * a message with mv_error() (common/check.h).
 * Try it: make && ./build/minivllm tokenize --model DIR --text "Hello"
 */
#ifndef MV_TOKENIZER_H
#define MV_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// A growable byte string, always NUL-terminated (the text may hold NULs too;
// len is the truth). Zero-initialise, then append; free with tok_bytes_free.
typedef struct {
    char *data;  // [cap] bytes, data[len] == '\0'
    size_t len, cap;
} tok_bytes_t;

// A growable list of token ids. Zero-initialise; free with tok_ids_free.
typedef struct {
    int32_t *data;  // [cap] token ids
    size_t len, cap;
} tok_ids_t;

int tok_bytes_append(tok_bytes_t *b, const char *s, size_t n);
// printf into b (no length limit).
int tok_bytes_appendf(tok_bytes_t *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
// s[0..n) as a JSON string, quotes included, every byte kept: a NUL becomes
// \u0000 (cJSON's printer stops a string at a NUL, and a decoded text may
// hold one: the token of byte 0). The engine's JSONL records and the
// server's bodies are written with it.
int tok_bytes_append_json(tok_bytes_t *b, const char *s, size_t n);
void tok_bytes_free(tok_bytes_t *b);
int tok_ids_push(tok_ids_t *v, int32_t id);
void tok_ids_free(tok_ids_t *v);

typedef struct tokenizer tokenizer_t;  // defined in tokenizer.c

// Load from a model directory: DIR/tokenizer.json and DIR/tokenizer_config.json.
// Returns NULL (with mv_last_error()) if a file is missing, not a regular
// file, malformed (a key twice or a NUL in a string included:
// json_check_strict), or asks for something this tokenizer does not implement.
tokenizer_t *tokenizer_load(const char *model_dir);
void tokenizer_free(tokenizer_t *tok);

// Append the ids of `text` (len bytes of UTF-8) to `out`. Invalid UTF-8 is
// rejected (-1) with the byte offset of the first bad byte in the message.
int tokenizer_encode(tokenizer_t *tok, const char *text, size_t len, tok_ids_t *out);

// Append the text of `ids` to `out`. Bytes that do not form valid UTF-8
// become U+FFFD, one per maximal invalid sequence (what Hugging Face and
// Python's errors="replace" do). skip_special drops special added tokens.
// An id the tokenizer does not know (tokenizer_knows_id: a padding row of
// the model's vocabulary) contributes no text, as in Hugging Face and vLLM;
// only a negative id is an error (-1).
int tokenizer_decode(const tokenizer_t *tok, const int32_t *ids, size_t n, int skip_special,
                     tok_bytes_t *out);

// Streaming decoder: feed ids one at a time, get text as soon as it is whole.
// A character split across tokens (common for CJK and emoji: one token may
// end in the middle of a 3- or 4-byte sequence) is held back until the ids
// that complete it arrive. The concatenation of everything pushed plus the
// final flush equals tokenizer_decode of all the ids.
typedef struct {
    unsigned char held[4];  // bytes of an incomplete UTF-8 sequence
    int n_held;             // 0..3
    int skip_special;       // as in tokenizer_decode
} tok_stream_t;

void tok_stream_init(tok_stream_t *s, int skip_special);
int tok_stream_push(const tokenizer_t *tok, tok_stream_t *s, int32_t id, tok_bytes_t *out);
// End of stream: whatever is still held cannot be completed, so it becomes U+FFFD.
int tok_stream_flush(tok_stream_t *s, tok_bytes_t *out);

// ---- what the engine needs to know about the vocabulary ----------------------------
int32_t tokenizer_n_ids(const tokenizer_t *tok);     // one past the largest id
// 1 if id has a token (text); 0 for a negative id, one past the last, or a
// gap in the numbering. The engine counts the generated ids it does not know.
int tokenizer_knows_id(const tokenizer_t *tok, int32_t id);
// The raw bytes of one id's token (special tokens included), *n of them at
// *p (inside the tokenizer; not NUL-terminated). A token may end or begin
// inside a UTF-8 character, so these are not always valid UTF-8: what the
// server's logprobs report as "bytes" (tokenizer_decode shows such bytes as
// U+FFFD). An id without a token has none (*n = 0). -1 for a negative id.
int tokenizer_token_bytes(const tokenizer_t *tok, int32_t id, const char **p, size_t *n);
int32_t tokenizer_eos_id(const tokenizer_t *tok);    // from tokenizer_config.json, -1 if none
int32_t tokenizer_token_id(const tokenizer_t *tok, const char *added_token);  // -1 if not added
int tokenizer_is_special(const tokenizer_t *tok, int32_t id);
int tokenizer_uses_jit(const tokenizer_t *tok);      // 1 if PCRE2's JIT compiled the regex
// 1 if tokenizer_config.json's chat template is Qwen3's (the one chat.c renders).
int tokenizer_has_qwen3_chat(const tokenizer_t *tok);

// The byte offset of the first byte of `s` that is not valid UTF-8
// (overlong forms, surrogates and code points past U+10FFFF are invalid),
// or len if all of it is valid.
size_t utf8_first_invalid(const char *s, size_t len);

#ifdef __cplusplus
}
#endif
#endif

/*
 * chapters/09-engine/model/mapped_file.h - a file mapped read-only into memory, and
 * a JSON file read through such a mapping.
 *
 * Why mmap: a Qwen3 checkpoint is one to tens of gigabytes. Mapping the file
 * costs no copy and no allocation: the kernel pages bytes in from its page
 * cache when they are first touched, shares them between processes that load
 * the same model, and drops them under memory pressure without writing
 * anything back (the mapping is read-only). A weight pointer is then just an
 * address inside the mapping, as in llama2.c's run.c.
 *
 * mmap's one sharp edge: if another process truncates the file while it is
 * mapped, touching the vanished pages raises SIGBUS. Checks cannot catch
 * that; do not rewrite a checkpoint while the engine has it open.
 *
 * Used by safetensors.c (weights) and model_config.c (config.json,
 * generation_config.json); json_check_strict also by the tokenizer and the
 * request lines of the command line. Library code: errors go to mv_error().
 */
#ifndef MV_MAPPED_FILE_H
#define MV_MAPPED_FILE_H

#include <cjson/cJSON.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    char *path;           // owned copy of the path, for error messages
    const uint8_t *data;  // [size] bytes, mapped read-only; NULL when size == 0
    size_t size;          // the file's size in bytes
} mapped_file_t;

// Map `path` read-only. 0 on success; -1 with mv_error() naming the file.
int mapped_file_open(const char *path, mapped_file_t *f);
// Unmap and free; safe on a zeroed or already closed mapped_file_t.
void mapped_file_close(mapped_file_t *f);
// Parse a whole file as one JSON value, checked by json_check_strict. NULL
// with mv_error() naming the file (cannot open / not a regular file / not
// valid JSON near byte N / a NUL or a duplicate key, named) on failure.
cJSON *json_load_file(const char *path);

// JSON as strict as the engine needs it, on top of cJSON, which is lenient
// in two ways that lose data silently:
//   - its strings end at the first NUL, so "a\u0000b" reads as "a";
//   - an object with a key twice answers lookups with the first value
//     (Python's json, vLLM and Hugging Face keep the last).
// Both are refused, and so is a raw 0x00 byte anywhere. root must have been
// parsed from text[0..len) (string k of the text is then string k of the
// tree, in document order, which is how a NUL is traced to its field).
// 0, or -1 with mv_error() naming the field by its path in the document:
//   "messages[0].content holds a NUL character (\u0000) ..."
//   "key \"max_tokens\" appears twice (in the top-level object) ..."
int json_check_strict(const cJSON *root, const char *text, size_t len);
// 1 if `path` names an existing regular file.
int file_exists(const char *path);

#ifdef __cplusplus
}
#endif
#endif

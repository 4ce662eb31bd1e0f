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
 * generation_config.json); library code: errors go to mv_error().
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
// Parse a whole file as one JSON value. NULL with mv_error() naming the
// file (cannot open / not valid JSON near byte N) on failure.
cJSON *json_load_file(const char *path);
// 1 if `path` names an existing regular file.
int file_exists(const char *path);

#ifdef __cplusplus
}
#endif
#endif

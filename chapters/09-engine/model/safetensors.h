/*
 * chapters/09-engine/model/safetensors.h - Hugging Face safetensors weight files,
 * mapped read-only and checked before any weight is trusted.
 *
 * A .safetensors file has three parts:
 *
 *   [8 bytes]  N, the header's length: a little-endian uint64
 *   [N bytes]  the header, a JSON object with one entry per tensor,
 *                "model.norm.weight": {"dtype": "BF16", "shape": [1024],
 *                                      "data_offsets": [0, 2048]}
 *              and optionally "__metadata__": {"format": "pt"}. Writers pad
 *              it with spaces so that the data starts 8-byte aligned.
 *   [rest]     the data section: each tensor's raw bytes, row-major and
 *              little-endian, at [begin, end) counted from this section's
 *              start. Tensors follow each other with no gaps.
 *
 * There is no pickle and no code in it: loading is a JSON parse plus pointer
 * arithmetic, so the file can be mmapped (see mapped_file.h) and each
 * tensor's data is a pointer into the mapping, with nothing copied.
 *
 * A large checkpoint is split into shards, model-00001-of-00002.safetensors
 * ..., and model.safetensors.index.json says which shard holds which tensor:
 *   {"metadata": {"total_size": 1234}, "weight_map": {"model.norm.weight":
 *    "model-00002-of-00002.safetensors", ...}}
 *
 * st_open() checks, and every failure names the file and the tensor:
 *   - the header length fits in the file, the header is one JSON object
 *     (trailing spaces allowed) with no key twice and no NUL in a string
 *     (json_check_strict), "__metadata__" (if any) is an object; a header
 *     of no tensors, "{}", is legal (and the model it gives has none);
 *   - each tensor: dtype BF16, F16 or F32 (anything else is refused by
 *     name), a shape of at most 8 non-negative dims, data_offsets
 *     [begin, end) inside the data section with end - begin == numel * the
 *     dtype's size;
 *   - sorted by begin, the tensors neither overlap nor leave gaps, and the
 *     last one ends where the file ends (the format's own rule; a truncated
 *     file fails here or at the offsets);
 *   - sharded: every file the index names exists, every tensor of the index
 *     is in the shard it names, every tensor of a shard is in the index, and
 *     no tensor appears twice (in the index or across shards).
 * The index's metadata.total_size is not checked: writers compute it in
 * different ways.
 *
 * Which file is opened: model.safetensors when it exists, else
 * model.safetensors.index.json (the order transformers uses).
 *
 * Build: part of build/libmv_host.a. Tests: tests/test_model_loading.c.
 */
#ifndef MV_SAFETENSORS_H
#define MV_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "chapters/09-engine/model/mapped_file.h"
#include "common/bf16.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { ST_BF16 = 0, ST_F16 = 1, ST_F32 = 2 } st_dtype_t;
enum { ST_MAX_DIMS = 8 };

typedef struct {
    const char *name;            // "model.layers.0.self_attn.q_proj.weight" (owned by the st_model_t)
    st_dtype_t dtype;
    int ndim;                    // 0 (a scalar) .. ST_MAX_DIMS
    int64_t shape[ST_MAX_DIMS];  // [ndim], row-major: the last dim varies fastest
    const void *data;            // [nbytes] inside its file's read-only mapping; may be unaligned
    size_t nbytes;               // numel * st_dtype_size(dtype)
    const char *file;            // path of the .safetensors file that holds it
} st_tensor_t;

typedef struct {
    char *source;           // what was opened: DIR/model.safetensors or DIR/model.safetensors.index.json
    mapped_file_t *files;   // [n_files] the mapped .safetensors files
    int n_files;
    st_tensor_t *tensors;   // [n_tensors] sorted by name (st_find is a binary search)
    size_t n_tensors;
    void *owned;            // st_model_alloc only: the one malloc'd block holding every tensor's data
} st_model_t;

// Open and check the weights of a model directory. 0 and *out on success;
// -1 with mv_error() naming the file and the tensor (and *out NULL).
int st_open(const char *model_dir, st_model_t **out);
// Open and check one .safetensors file, whatever its name.
int st_open_file(const char *path, st_model_t **out);
// A model that lives in memory, not in a file: n tensors with the names,
// dtypes and shapes of specs[0..n) (their data/nbytes/file are ignored),
// their data zeroed in one owned block. The caller fills the data through
// st_model_data() before anyone reads it. This is how weights that were never
// saved (random weights to time real shapes, `minivllm bench --random-weights`)
// go through the same binding, checking and conversion as a checkpoint.
// `source` names it in messages. -1 with mv_error() when out of memory.
int st_model_alloc(const char *source, const st_tensor_t *specs, size_t n, st_model_t **out);
// Writable data of tensor t of an st_model_alloc model (NULL for a mapped one).
void *st_model_data(st_model_t *m, const st_tensor_t *t);
// Unmap (or free) everything; NULL is fine. Tensor pointers die with the model.
void st_close(st_model_t *m);
// The tensor called `name`, or NULL.
const st_tensor_t *st_find(const st_model_t *m, const char *name);

size_t st_dtype_size(st_dtype_t d);       // bytes per element: 2, 2, 4
const char *st_dtype_name(st_dtype_t d);  // "BF16", "F16", "F32" (the file's spelling)
int64_t st_numel(const st_tensor_t *t);   // product of the shape (1 for a scalar)

// Copy t's elements into dst[st_numel(t)] as bf16: BF16 is copied, F16 and
// F32 are converted with round-to-nearest-even (NaN stays NaN, Inf stays Inf).
void st_to_bf16(const st_tensor_t *t, bf16_t *dst);
// t's elements as bf16 without a copy where it can: a BF16 tensor whose data
// is 2-byte aligned is returned as it lies in the mapping (*owned NULL), so
// a tensor-parallel rank that copies out its slice touches only the pages
// of that slice; anything else is converted whole into a malloc'd copy,
// returned and left in *owned for the caller to free. NULL with mv_error()
// when out of memory.
const bf16_t *st_bf16_view(const st_tensor_t *t, bf16_t **owned);
// IEEE half -> float, exact (every half is a float).
float f16_to_float(uint16_t h);

#ifdef __cplusplus
}
#endif
#endif

/*
 * chapters/07-attention/attention_cases.h - random attention batches over a
 * paged KV cache, and the float64 formula they are checked with.
 *
 * Used by the chapter executable (build/07-attention: the CPU reference now,
 * the CUDA kernels later, on the same cases) and by tests/test_attention.c.
 *
 * A case is one step of a made-up scheduler (chapter 08's rules): a batch of
 * sequences, each with a cached prefix (possibly empty) and some new tokens,
 * their keys and values written into a paged cache through block tables
 * whose blocks come out of the pool in random order. A sequence may reuse
 * the first full blocks of an earlier one (a prefix-cache hit): its block
 * table then names the same physical blocks, and its keys there are the
 * earlier sequence's keys. Slots no token owns hold NaN, so a read outside
 * the context poisons the output.
 *
 * The same keys are also kept contiguous, sequence after sequence
 * (cu_seqlens_k), for the float64 formula and the contiguous reference.
 * Values are drawn as bf16 (then kept as float), as the GPU half will use them.
 */
#ifndef MV_ATTENTION_CASES_H
#define MV_ATTENTION_CASES_H

#include <stddef.h>
#include <stdint.h>

#include "common/rng.h"

#ifdef __cplusplus
extern "C" {
#endif

// One sequence of a case.
typedef struct {
    int num_new;        // query tokens in this step (>= 1)
    int context_len;    // keys it attends to: cached prefix + new tokens (>= num_new)
    int share_from;     // -1, or an earlier sequence whose first blocks this one reuses
    int shared_blocks;  // how many (full in both sequences); 0 when share_from is -1
} attn_seq_spec_t;

typedef struct {
    int num_seqs, num_heads, num_kv_heads, head_dim;
    int block_size, num_blocks, max_blocks;
    float scale;              // 1/sqrt(head_dim)
    int T_q, T_k;             // query rows, key rows of all sequences
    int num_shared;           // block-table entries that name another sequence's block
    float *q;                 // [T_q, num_heads, head_dim]
    float *k, *v;             // [T_k, num_kv_heads, head_dim] contiguous, sequence after sequence
    float *k_cache, *v_cache; // [num_blocks, block_size, num_kv_heads, head_dim]; NaN where no token lives
    int32_t *cu_seqlens_q;    // [num_seqs + 1]
    int32_t *cu_seqlens_k;    // [num_seqs + 1]
    int32_t *context_lens;    // [num_seqs]
    int32_t *block_tables;    // [num_seqs, max_blocks], -1 padded
} attn_case_t;

// The lab's standard ragged mix for one block size: 1 token; exactly one
// block; one block + 1; a long sequence in the middle of a chunked prefill;
// a prefix hit on the long one's first blocks with a few new tokens; a fully
// cached prompt that recomputes its last token (inside a shared block); a
// chunk that starts mid-block after a prefix hit on the one-block sequence.
// New tokens of long sequences are at most 24, so a case stays fast.
// Writes at most ATTN_MIX_SEQS specs; returns how many.
#define ATTN_MIX_SEQS 8
int attn_specs_ragged(attn_seq_spec_t *specs, rng_t *rng, int block_size);

// Build a case; 0, or -1 with mv_error() for a spec that breaks the rules
// above (naming the sequence) or when out of memory.
int attn_case_make(attn_case_t *c, rng_t *rng, const attn_seq_spec_t *specs, int num_seqs, int num_heads,
                   int num_kv_heads, int head_dim, int block_size);
void attn_case_free(attn_case_t *c);

// The float64 formula, written apart from the reference: for each sequence
// and head the whole score matrix [num_new, context_len] from the contiguous
// keys, -inf above the end-aligned diagonal, softmax, times V.
//   out [T_q, num_heads, head_dim]
// 0, or -1 with mv_error() when out of memory.
int attention_f64(double *out, const attn_case_t *c);

// Each sequence's last query row: src [T_q, H, D] -> dst [num_seqs, H, D],
// elements of elem_size bytes (float or double). Decode's queries are these
// rows of a prefill, and its outputs must be these rows of the prefill's.
void attn_case_last_rows(const attn_case_t *c, void *dst, const void *src, size_t elem_size);

#ifdef __cplusplus
}
#endif
#endif

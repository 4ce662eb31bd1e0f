/*
 * chapters/08-scheduler/sched/block_manager.h - the paged KV cache's bookkeeping.
 *
 * The KV cache on the GPU is one big pool of fixed-size blocks; block b holds
 * the keys and values of block_size consecutive tokens of one sequence, at
 * cache slots [b * block_size, (b + 1) * block_size). A sequence's block
 * table lists its blocks in token order, so token t lives in block
 * block_table[t / block_size] at offset t % block_size. Blocks need not be
 * contiguous: memory is handed out one block at a time, and nothing is
 * reserved for tokens a sequence has not produced yet (PagedAttention).
 *
 * This file keeps, on the host:
 *   - a reference count per block (how many sequences' tables hold it);
 *   - the free list: blocks nobody holds, in the order they were freed;
 *   - the prefix cache: every full block is named by a hash chained over its
 *     parent's hash and its own token ids,
 *         hash(block i) = XXH64(tokens of block i, seed = hash(block i-1)),
 *     so equal hashes mean "same tokens *and* same everything before them",
 *     which is what makes reusing the block's K/V correct. The token ids and
 *     the parent hash are kept too, and a hit must match them exactly.
 *
 * A freed block that carries a registered hash keeps its K/V and stays in the
 * hash table: a later sequence with the same prefix can take it back from the
 * free list. It is only evicted when a fresh block is needed and it is the
 * least recently freed one. Blocks with no cached content go to the front of
 * the free list, so they are used before any cached block is evicted.
 *
 * Library code: returns 0 / -1 with mv_error(), never exits.
 * Tested by tests/test_block_manager.c.
 */
#ifndef MV_BLOCK_MANAGER_H
#define MV_BLOCK_MANAGER_H

#include <stdint.h>

#include "chapters/08-scheduler/sched/sequence.h"

#ifdef __cplusplus
extern "C" {
#endif

// Parent hash of a sequence's first block: its chain starts from here.
#define PREFIX_HASH_SEED 0ull

typedef struct {
    int32_t ref_count;         // number of block tables that hold this block
    int hashed;                // 1: full block with hash, parent_hash, tokens set
    int registered;            // 1: the hash table maps `hash` to this block
    uint64_t hash;             // XXH64(tokens, seed = parent_hash)
    uint64_t parent_hash;      // hash of the block before it in its sequence
    int32_t prev_free, next_free;  // free-list links (-1: none); valid when ref_count == 0
    int32_t next_in_bucket;    // next block of the same hash-table bucket (-1: none)
} kv_block_t;

typedef struct {
    int num_blocks;            // size of the pool
    int block_size;            // tokens per block
    int enable_prefix_caching;
    kv_block_t *blocks;        // [num_blocks]
    int32_t *block_tokens;     // [num_blocks, block_size]: token ids of hashed blocks
    // Free list: blocks with ref_count 0, doubly linked. The head is handed
    // out first: empty blocks, then cached blocks from least recently freed.
    int32_t free_head, free_tail;
    int num_free;
    // Prefix cache: hash -> block, chained buckets threaded through the blocks.
    int32_t *buckets;          // [num_buckets]: first block of each chain, -1 if none
    uint32_t num_buckets;      // power of two >= num_blocks
    int num_registered;        // blocks with registered == 1
    // statistics
    long long num_evictions;   // cached blocks overwritten for new content
    long long num_lookups;     // full blocks looked up at admission
    long long num_hits;        // of those, found in the cache
} block_manager_t;

int bm_init(block_manager_t *bm, int num_blocks, int block_size, int enable_prefix_caching);
void bm_free(block_manager_t *bm);

// Chained block hash: XXH64 of the block's token ids seeded with the parent's hash.
uint64_t bm_hash_block(uint64_t parent_hash, const int32_t *tokens, int block_size);

// The registered block with this hash, parent hash and tokens, or -1.
int bm_lookup(const block_manager_t *bm, uint64_t hash, uint64_t parent_hash,
              const int32_t *tokens);

// ---- per-sequence operations (what the scheduler calls) ------------------------

// Cached leading full blocks of s's tokens: writes up to `max` block ids to
// ids[] and returns how many. 0 when prefix caching is off.
int bm_match_prefix(block_manager_t *bm, const sequence_t *s, int32_t *ids, int max);

// Free blocks that admitting s would use, given its n_hits cached blocks
// ids[0..n_hits): every block it needs, less the hits someone else holds
// (a hit on a block in the free list still takes that block off the list).
int bm_admit_cost(const block_manager_t *bm, const sequence_t *s, const int32_t *ids, int n_hits);

// Give a waiting sequence blocks for all its tokens, reusing its cached
// prefix: sets block_table, num_cached_tokens, num_hashed_blocks. -1 (and no
// change) when the free blocks do not suffice.
int bm_admit(block_manager_t *bm, sequence_t *s);

// Grow s's block table to hold n_tokens tokens; -1 (and no change) when
// there are not enough free blocks.
int bm_append(block_manager_t *bm, sequence_t *s, int n_tokens);

// Register the hash of every block of s that is full within its first
// n_tokens tokens (their K/V is computed by the end of this step).
void bm_commit_full_blocks(block_manager_t *bm, sequence_t *s, int n_tokens);

// Give back all of s's blocks (last block first, so a prefix outlives its
// tail in the cache); s->num_blocks becomes 0.
void bm_release(block_manager_t *bm, sequence_t *s);

// Internal consistency: free list and reference counts agree, every hashed
// block's hash matches its tokens, the hash table finds every registered
// block. 0, or -1 with the first violation in mv_last_error().
int bm_check(const block_manager_t *bm);

#ifdef __cplusplus
}
#endif
#endif

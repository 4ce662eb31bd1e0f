/* chapters/08-scheduler/sched/block_manager.c - the paged KV bookkeeping declared in block_manager.h. */
#include "chapters/08-scheduler/sched/block_manager.h"

#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "common/check.h"

// ---- free list -------------------------------------------------------------------

static void free_list_unlink(block_manager_t *bm, int32_t id) {
    kv_block_t *b = &bm->blocks[id];
    if (b->prev_free >= 0) bm->blocks[b->prev_free].next_free = b->next_free;
    else bm->free_head = b->next_free;
    if (b->next_free >= 0) bm->blocks[b->next_free].prev_free = b->prev_free;
    else bm->free_tail = b->prev_free;
    b->prev_free = b->next_free = -1;
    bm->num_free--;
}

static void free_list_push_tail(block_manager_t *bm, int32_t id) {
    kv_block_t *b = &bm->blocks[id];
    b->prev_free = bm->free_tail;
    b->next_free = -1;
    if (bm->free_tail >= 0) bm->blocks[bm->free_tail].next_free = id;
    else bm->free_head = id;
    bm->free_tail = id;
    bm->num_free++;
}

static void free_list_push_head(block_manager_t *bm, int32_t id) {
    kv_block_t *b = &bm->blocks[id];
    b->prev_free = -1;
    b->next_free = bm->free_head;
    if (bm->free_head >= 0) bm->blocks[bm->free_head].prev_free = id;
    else bm->free_tail = id;
    bm->free_head = id;
    bm->num_free++;
}

// ---- hash table --------------------------------------------------------------------

static uint32_t bucket_of(const block_manager_t *bm, uint64_t hash) {
    return (uint32_t)(hash & (bm->num_buckets - 1));
}

static int32_t *block_tokens(const block_manager_t *bm, int32_t id) {
    return bm->block_tokens + (size_t)id * bm->block_size;
}

uint64_t bm_hash_block(uint64_t parent_hash, const int32_t *tokens, int block_size) {
    // Seeding with the parent's hash chains the blocks: the same 16 tokens
    // after a different prefix give a different hash, because their K/V
    // (which depends on every earlier token) is different too.
    return XXH64(tokens, (size_t)block_size * sizeof(int32_t), parent_hash);
}

int bm_lookup(const block_manager_t *bm, uint64_t hash, uint64_t parent_hash,
              const int32_t *tokens) {
    for (int32_t id = bm->buckets[bucket_of(bm, hash)]; id >= 0; id = bm->blocks[id].next_in_bucket) {
        const kv_block_t *b = &bm->blocks[id];
        // A 64-bit hash can collide; comparing the tokens and the parent makes
        // a hit exact for this block, and the parent chain does the rest.
        if (b->hash == hash && b->parent_hash == parent_hash &&
            !memcmp(block_tokens(bm, id), tokens, (size_t)bm->block_size * sizeof(int32_t)))
            return id;
    }
    return -1;
}

static void table_remove(block_manager_t *bm, int32_t id) {
    int32_t *link = &bm->buckets[bucket_of(bm, bm->blocks[id].hash)];
    while (*link != id) link = &bm->blocks[*link].next_in_bucket;
    *link = bm->blocks[id].next_in_bucket;
    bm->blocks[id].next_in_bucket = -1;
    bm->blocks[id].registered = 0;
    bm->num_registered--;
}

static void table_insert(block_manager_t *bm, int32_t id) {
    uint32_t k = bucket_of(bm, bm->blocks[id].hash);
    bm->blocks[id].next_in_bucket = bm->buckets[k];
    bm->buckets[k] = id;
    bm->blocks[id].registered = 1;
    bm->num_registered++;
}

// ---- pool ------------------------------------------------------------------------------

int bm_init(block_manager_t *bm, int num_blocks, int block_size, int enable_prefix_caching) {
    memset(bm, 0, sizeof *bm);
    if (num_blocks < 1 || block_size < 1)
        return mv_error("bm_init: need num_blocks >= 1 and block_size >= 1, got %d and %d",
                        num_blocks, block_size);
    bm->num_blocks = num_blocks;
    bm->block_size = block_size;
    bm->enable_prefix_caching = enable_prefix_caching;
    bm->num_buckets = 1;
    while (bm->num_buckets < (uint32_t)num_blocks) bm->num_buckets <<= 1;
    bm->blocks = calloc((size_t)num_blocks, sizeof(kv_block_t));
    bm->block_tokens = malloc((size_t)num_blocks * block_size * sizeof(int32_t));
    bm->buckets = malloc(bm->num_buckets * sizeof(int32_t));
    if (!bm->blocks || !bm->block_tokens || !bm->buckets) {
        bm_free(bm);
        return mv_error("bm_init: out of memory for %d blocks of %d tokens", num_blocks, block_size);
    }
    for (uint32_t k = 0; k < bm->num_buckets; k++) bm->buckets[k] = -1;
    bm->free_head = bm->free_tail = -1;
    for (int32_t id = 0; id < num_blocks; id++) {
        bm->blocks[id].next_in_bucket = -1;
        free_list_push_tail(bm, id);
    }
    return 0;
}

void bm_free(block_manager_t *bm) {
    free(bm->blocks);
    free(bm->block_tokens);
    free(bm->buckets);
    memset(bm, 0, sizeof *bm);
}

// Take the block at the head of the free list for new content. If it still
// held a cached prefix block, that content is evicted now.
static int32_t take_fresh_block(block_manager_t *bm) {
    int32_t id = bm->free_head;
    if (id < 0) return -1;
    free_list_unlink(bm, id);
    kv_block_t *b = &bm->blocks[id];
    if (b->registered) table_remove(bm, id);
    if (b->hashed) bm->num_evictions++;
    b->hashed = 0;
    b->hash = b->parent_hash = 0;
    b->ref_count = 1;
    return id;
}

// Take a cached block for one more sequence; off the free list if nobody held it.
static void take_cached_block(block_manager_t *bm, int32_t id) {
    if (bm->blocks[id].ref_count == 0) free_list_unlink(bm, id);
    bm->blocks[id].ref_count++;
}

static void release_block(block_manager_t *bm, int32_t id) {
    kv_block_t *b = &bm->blocks[id];
    if (--b->ref_count > 0) return;
    // A registered block goes to the tail: it is evicted last, after every
    // block freed before it. An unregistered one holds nothing reusable.
    if (b->registered) free_list_push_tail(bm, id);
    else free_list_push_head(bm, id);
}

// ---- per-sequence operations -------------------------------------------------------------

int bm_match_prefix(block_manager_t *bm, const sequence_t *s, int32_t *ids, int max) {
    if (!bm->enable_prefix_caching) return 0;
    int bs = bm->block_size, n_full = s->num_tokens / bs, n = 0;
    uint64_t parent = PREFIX_HASH_SEED;
    for (int i = 0; i < n_full && n < max; i++) {
        const int32_t *tok = s->tokens + (size_t)i * bs;
        uint64_t h = bm_hash_block(parent, tok, bs);
        int32_t id = bm_lookup(bm, h, parent, tok);
        // Only a leading run of blocks is reusable: after the first miss the
        // K/V of every later block depends on tokens we must compute anyway.
        if (id < 0) break;
        ids[n++] = id;
        parent = h;
    }
    return n;
}

int bm_admit_cost(const block_manager_t *bm, const sequence_t *s, const int32_t *ids, int n_hits) {
    int cost = blocks_for_tokens(s->num_tokens, bm->block_size);
    for (int i = 0; i < n_hits; i++)
        if (bm->blocks[ids[i]].ref_count > 0) cost--;
    return cost;
}

int bm_admit(block_manager_t *bm, sequence_t *s) {
    if (s->num_blocks != 0)
        return mv_error("bm_admit: sequence %lld already holds %d blocks", (long long)s->id,
                        s->num_blocks);
    int need = blocks_for_tokens(s->num_tokens, bm->block_size);
    if (need > s->max_blocks)
        return mv_error("bm_admit: sequence %lld needs %d blocks, its table has %d",
                        (long long)s->id, need, s->max_blocks);
    int n_hits = bm_match_prefix(bm, s, s->block_table, need);
    bm->num_lookups += s->num_tokens / bm->block_size;
    if (bm_admit_cost(bm, s, s->block_table, n_hits) > bm->num_free)
        return mv_error("bm_admit: sequence %lld needs %d free blocks, %d are free",
                        (long long)s->id, bm_admit_cost(bm, s, s->block_table, n_hits),
                        bm->num_free);
    bm->num_hits += n_hits;
    // Hits first: taking a fresh block below may evict the least recently
    // freed cached block, and that must not be one of our hits.
    for (int i = 0; i < n_hits; i++) take_cached_block(bm, s->block_table[i]);
    for (int i = n_hits; i < need; i++) s->block_table[i] = take_fresh_block(bm);
    s->num_blocks = need;
    s->num_cached_tokens = n_hits * bm->block_size;
    s->num_hashed_blocks = n_hits;
    return 0;
}

int bm_append(block_manager_t *bm, sequence_t *s, int n_tokens) {
    int need = blocks_for_tokens(n_tokens, bm->block_size);
    if (need > s->max_blocks)
        return mv_error("bm_append: sequence %lld needs %d blocks, its table has %d",
                        (long long)s->id, need, s->max_blocks);
    if (need - s->num_blocks > bm->num_free)
        return mv_error("bm_append: sequence %lld needs %d more blocks, %d are free",
                        (long long)s->id, need - s->num_blocks, bm->num_free);
    while (s->num_blocks < need) s->block_table[s->num_blocks++] = take_fresh_block(bm);
    return 0;
}

void bm_commit_full_blocks(block_manager_t *bm, sequence_t *s, int n_tokens) {
    if (!bm->enable_prefix_caching) return;
    int bs = bm->block_size, n_full = n_tokens / bs;
    for (int i = s->num_hashed_blocks; i < n_full; i++) {
        int32_t id = s->block_table[i];
        kv_block_t *b = &bm->blocks[id];
        const int32_t *tok = s->tokens + (size_t)i * bs;
        b->parent_hash = i ? bm->blocks[s->block_table[i - 1]].hash : PREFIX_HASH_SEED;
        b->hash = bm_hash_block(b->parent_hash, tok, bs);
        memcpy(block_tokens(bm, id), tok, (size_t)bs * sizeof(int32_t));
        b->hashed = 1;
        // Another sequence may have computed the same block at the same time
        // (both missed before either finished it). The first copy stays the
        // one the cache finds; this one is freed as plain memory.
        if (bm_lookup(bm, b->hash, b->parent_hash, tok) < 0) table_insert(bm, id);
    }
    if (n_full > s->num_hashed_blocks) s->num_hashed_blocks = n_full;
}

void bm_release(block_manager_t *bm, sequence_t *s) {
    // Last block first: the free list's tail is evicted last, so the shared
    // prefix (first blocks) outlives a sequence's private tail in the cache.
    for (int i = s->num_blocks - 1; i >= 0; i--) release_block(bm, s->block_table[i]);
    s->num_blocks = 0;
    s->num_hashed_blocks = 0;
}

// ---- invariants ----------------------------------------------------------------------------

int bm_check(const block_manager_t *bm) {
    // Walk the free list: every entry has ref 0, is seen once, links agree.
    char *seen = calloc((size_t)bm->num_blocks, 1);
    if (!seen) return mv_error("bm_check: out of memory");
    int n = 0, rc = 0;
    int32_t prev = -1;
    for (int32_t id = bm->free_head; id >= 0 && !rc; prev = id, id = bm->blocks[id].next_free) {
        if (id >= bm->num_blocks) rc = mv_error("free list holds block id %d out of range", id);
        else if (seen[id]) rc = mv_error("block %d is in the free list twice", id);
        else if (bm->blocks[id].ref_count != 0)
            rc = mv_error("block %d is in the free list with reference count %d", id,
                          bm->blocks[id].ref_count);
        else if (bm->blocks[id].prev_free != prev)
            rc = mv_error("free list: block %d's back link is %d, expected %d", id,
                          bm->blocks[id].prev_free, prev);
        else seen[id] = 1, n++;
    }
    if (!rc && prev != bm->free_tail)
        rc = mv_error("free list ends at block %d but its tail is %d", prev, bm->free_tail);
    if (!rc && n != bm->num_free)
        rc = mv_error("free list holds %d blocks, num_free says %d", n, bm->num_free);
    int n_registered = 0;
    for (int32_t id = 0; id < bm->num_blocks && !rc; id++) {
        const kv_block_t *b = &bm->blocks[id];
        if (b->ref_count < 0) rc = mv_error("block %d has reference count %d", id, b->ref_count);
        else if (b->ref_count == 0 && !seen[id])
            rc = mv_error("block %d is leaked: nobody holds it and it is not in the free list", id);
        else if (b->hashed && bm_hash_block(b->parent_hash, block_tokens(bm, id), bm->block_size) != b->hash)
            rc = mv_error("block %d: stored hash does not match its tokens", id);
        else if (b->registered && !b->hashed)
            rc = mv_error("block %d is registered without a hash", id);
        else if (b->registered &&
                 bm_lookup(bm, b->hash, b->parent_hash, block_tokens(bm, id)) != id)
            rc = mv_error("block %d is registered but the hash table does not find it", id);
        n_registered += b->registered;
    }
    if (!rc && n_registered != bm->num_registered)
        rc = mv_error("%d blocks are registered, num_registered says %d", n_registered,
                      bm->num_registered);
    free(seen);
    return rc;
}

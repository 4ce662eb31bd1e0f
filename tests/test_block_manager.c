/*
 * tests/test_block_manager.c - Criterion tests of chapter 08's block manager:
 * allocation and reference counts, chained block hashes (XXH64), prefix
 * hits (leading full blocks only, confirmed by tokens), cached blocks that
 * survive being freed, least-recently-freed eviction, and failure without
 * side effects when the pool is short.
 *
 * Run: make test  (or build/tests/test_block_manager after make)
 */
#include <criterion/criterion.h>
#include <xxhash.h>

#include "chapters/08-scheduler/sched/block_manager.h"
#include "common/check.h"

enum { BS = 4, MAX_LEN = 64 };

// A waiting sequence whose token i is base + i (max_tokens 1).
static sequence_t *seq_of(int64_t id, int n, int32_t base) {
    int32_t tok[MAX_LEN];
    for (int i = 0; i < n; i++) tok[i] = base + i;
    sampling_params_t p = sampling_params_default(1);
    sequence_t *s = sequence_create(id, tok, n, &p, MAX_LEN, BS);
    cr_assert_not_null(s);
    return s;
}

static void admit_and_compute(block_manager_t *bm, sequence_t *s) {
    cr_assert_eq(bm_admit(bm, s), 0, "%s", mv_last_error());
    s->num_computed_tokens = s->num_tokens;
    bm_commit_full_blocks(bm, s, s->num_tokens);
}

static void expect_consistent(const block_manager_t *bm) {
    cr_expect_eq(bm_check(bm), 0, "%s", mv_last_error());
}

Test(block_manager, admit_and_release_count_blocks) {
    block_manager_t bm;
    cr_assert_eq(bm_init(&bm, 8, BS, 1), 0);
    sequence_t *s = seq_of(0, 9, 100);  // 9 tokens -> 3 blocks
    cr_assert_eq(bm_admit(&bm, s), 0);
    cr_expect_eq(s->num_blocks, 3);
    cr_expect_eq(bm.num_free, 5);
    for (int i = 0; i < 3; i++) cr_expect_eq(bm.blocks[s->block_table[i]].ref_count, 1);
    cr_expect_eq(bm_append(&bm, s, 13), 0);  // a 13th token needs a 4th block
    cr_expect_eq(s->num_blocks, 4);
    cr_expect_eq(bm_append(&bm, s, 16), 0);  // still 4 blocks
    cr_expect_eq(s->num_blocks, 4);
    expect_consistent(&bm);
    bm_release(&bm, s);
    cr_expect_eq(s->num_blocks, 0);
    cr_expect_eq(bm.num_free, 8);
    expect_consistent(&bm);
    sequence_free(s);
    bm_free(&bm);
}

Test(block_manager, hash_is_xxh64_chained_over_the_parent) {
    int32_t tok[BS] = {1, 2, 3, 4};
    uint64_t h0 = bm_hash_block(PREFIX_HASH_SEED, tok, BS);
    cr_expect_eq(h0, XXH64(tok, sizeof tok, PREFIX_HASH_SEED));
    // The same tokens after another block hash differently.
    cr_expect_neq(bm_hash_block(h0, tok, BS), h0);
    cr_expect_eq(bm_hash_block(h0, tok, BS), XXH64(tok, sizeof tok, h0));
}

Test(block_manager, new_sequence_reuses_leading_full_blocks) {
    block_manager_t bm;
    cr_assert_eq(bm_init(&bm, 16, BS, 1), 0);
    sequence_t *a = seq_of(0, 10, 100);  // blocks [100..103] [104..107] [108 109]
    admit_and_compute(&bm, a);
    cr_expect_eq(a->num_hashed_blocks, 2, "only full blocks are hashed");
    sequence_t *b = seq_of(1, 11, 100);  // same first 10 tokens, one more
    cr_assert_eq(bm_admit(&bm, b), 0);
    cr_expect_eq(b->num_cached_tokens, 8, "two full blocks cached, not the partial third");
    cr_expect_eq(b->block_table[0], a->block_table[0]);
    cr_expect_eq(b->block_table[1], a->block_table[1]);
    cr_expect_neq(b->block_table[2], a->block_table[2]);
    cr_expect_eq(bm.blocks[a->block_table[0]].ref_count, 2);
    cr_expect_eq(bm.num_hits, 2);
    expect_consistent(&bm);
    bm_release(&bm, b);
    cr_expect_eq(bm.blocks[a->block_table[0]].ref_count, 1);
    bm_release(&bm, a);
    expect_consistent(&bm);
    sequence_free(a);
    sequence_free(b);
    bm_free(&bm);
}

Test(block_manager, a_hit_needs_the_same_prefix_before_it) {
    block_manager_t bm;
    cr_assert_eq(bm_init(&bm, 16, BS, 1), 0);
    sequence_t *a = seq_of(0, 8, 100);
    admit_and_compute(&bm, a);
    // Same second block, different first block: the chain makes it a miss.
    sequence_t *c = seq_of(1, 8, 100);
    c->tokens[0] = 7;
    int32_t ids[4];
    cr_expect_eq(bm_match_prefix(&bm, c, ids, 4), 0);
    // A planted hash "collision": right hash and parent, other tokens.
    const kv_block_t *b0 = &bm.blocks[a->block_table[0]];
    int32_t other[BS] = {100, 101, 102, 999};
    cr_expect_eq(bm_lookup(&bm, b0->hash, b0->parent_hash, other), -1);
    cr_expect_eq(bm_lookup(&bm, b0->hash, b0->parent_hash, a->tokens), a->block_table[0]);
    bm_release(&bm, a);
    sequence_free(a);
    sequence_free(c);
    bm_free(&bm);
}

Test(block_manager, freed_block_stays_cached_until_needed) {
    block_manager_t bm;
    cr_assert_eq(bm_init(&bm, 4, BS, 1), 0);
    sequence_t *a = seq_of(0, 8, 100);
    admit_and_compute(&bm, a);
    int32_t a0 = a->block_table[0], a1 = a->block_table[1];
    bm_release(&bm, a);
    cr_expect_eq(bm.num_free, 4);
    sequence_t *b = seq_of(1, 9, 100);
    cr_assert_eq(bm_admit(&bm, b), 0);
    cr_expect_eq(b->block_table[0], a0);
    cr_expect_eq(b->block_table[1], a1);
    cr_expect_eq(b->num_cached_tokens, 8);
    cr_expect_eq(bm.num_evictions, 0);
    cr_expect_eq(bm.num_free, 1, "the two hits came off the free list, one fresh block was taken");
    expect_consistent(&bm);
    bm_release(&bm, b);
    sequence_free(a);
    sequence_free(b);
    bm_free(&bm);
}

Test(block_manager, evicts_least_recently_freed_first) {
    block_manager_t bm;
    cr_assert_eq(bm_init(&bm, 4, BS, 1), 0);
    sequence_t *a = seq_of(0, 8, 100), *b = seq_of(1, 8, 200);
    admit_and_compute(&bm, a);
    admit_and_compute(&bm, b);
    int32_t a0 = a->block_table[0], a1 = a->block_table[1], b1 = b->block_table[1];
    bm_release(&bm, a);  // frees a1 then a0: a's tail is evicted before its head
    bm_release(&bm, b);
    sequence_t *c = seq_of(2, 4, 300);
    cr_assert_eq(bm_admit(&bm, c), 0);
    cr_expect_eq(c->block_table[0], a1, "least recently freed: a's last block");
    cr_expect_eq(bm.num_evictions, 1);
    int32_t ids[2];
    cr_expect_eq(bm_match_prefix(&bm, a, ids, 2), 1, "a's first block is still cached");
    sequence_t *d = seq_of(3, 8, 400);
    cr_assert_eq(bm_admit(&bm, d), 0);
    cr_expect_eq(d->block_table[0], a0);
    cr_expect_eq(d->block_table[1], b1);
    cr_expect_eq(bm_match_prefix(&bm, a, ids, 2), 0);
    cr_expect_eq(bm_match_prefix(&bm, b, ids, 2), 1);
    expect_consistent(&bm);
    bm_release(&bm, c);
    bm_release(&bm, d);
    sequence_free(a);
    sequence_free(b);
    sequence_free(c);
    sequence_free(d);
    bm_free(&bm);
}

Test(block_manager, short_pool_fails_without_side_effects) {
    block_manager_t bm;
    cr_assert_eq(bm_init(&bm, 3, BS, 1), 0);
    sequence_t *a = seq_of(0, 8, 100), *b = seq_of(1, 8, 200);
    cr_assert_eq(bm_admit(&bm, a), 0);
    cr_expect_eq(bm_admit(&bm, b), -1);
    cr_expect_eq(b->num_blocks, 0);
    cr_expect_eq(bm.num_free, 1);
    cr_expect_eq(bm_append(&bm, a, 13), -1, "13 tokens need 2 more blocks, 1 is free");
    cr_expect_eq(a->num_blocks, 2);
    cr_expect_eq(bm.num_free, 1);
    expect_consistent(&bm);
    bm_release(&bm, a);
    sequence_free(a);
    sequence_free(b);
    bm_free(&bm);
}

Test(block_manager, same_block_computed_twice_is_registered_once) {
    block_manager_t bm;
    cr_assert_eq(bm_init(&bm, 8, BS, 1), 0);
    sequence_t *a = seq_of(0, 8, 100), *b = seq_of(1, 8, 100);
    cr_assert_eq(bm_admit(&bm, a), 0);  // both admitted before either computed a block
    cr_assert_eq(bm_admit(&bm, b), 0);
    cr_expect_eq(b->num_cached_tokens, 0);
    bm_commit_full_blocks(&bm, a, 8);
    bm_commit_full_blocks(&bm, b, 8);
    cr_expect_eq(bm.num_registered, 2, "a's two blocks; b's copies are not registered");
    expect_consistent(&bm);
    bm_release(&bm, b);
    bm_release(&bm, a);
    expect_consistent(&bm);
    int32_t ids[2];
    cr_expect_eq(bm_match_prefix(&bm, a, ids, 2), 2);
    cr_expect_eq(ids[0], a->block_table[0]);
    sequence_free(a);
    sequence_free(b);
    bm_free(&bm);
}

Test(block_manager, prefix_caching_off_never_hits) {
    block_manager_t bm;
    cr_assert_eq(bm_init(&bm, 8, BS, 0), 0);
    sequence_t *a = seq_of(0, 8, 100), *b = seq_of(1, 8, 100);
    admit_and_compute(&bm, a);
    cr_assert_eq(bm_admit(&bm, b), 0);
    cr_expect_eq(b->num_cached_tokens, 0);
    cr_expect_eq(bm.num_registered, 0);
    bm_release(&bm, a);
    bm_release(&bm, b);
    expect_consistent(&bm);
    sequence_free(a);
    sequence_free(b);
    bm_free(&bm);
}

Test(block_manager, bad_pool_is_an_error) {
    block_manager_t bm;
    cr_expect_eq(bm_init(&bm, 0, 16, 1), -1);
    cr_expect_eq(bm_init(&bm, 16, 0, 1), -1);
}

/*
 * tests/test_embedding.c - Criterion tests of chapter 04's CPU side: token
 * ids and cu_seqlens validation, masked lookups, vocabulary slices with
 * padding, and the logits' assembly.
 *
 * Run: make test  (or build/tests/test_embedding after make)
 */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "chapters/04-embedding/vocab_parallel.h"
#include "common/check.h"
#include "reference/embedding.h"

Test(ids, rejected_with_position_and_value) {
    int32_t ids[4] = {0, 5, 151936, 2};
    cr_expect_eq(embedding_validate_ids(ids, 4, 151936), -1);
    cr_expect(strstr(mv_last_error(), "151936 at position 2") != NULL, "%s", mv_last_error());
    ids[2] = -3;
    cr_expect_eq(embedding_validate_ids(ids, 4, 151936), -1);
    cr_expect(strstr(mv_last_error(), "-3") != NULL);
    ids[2] = 151935;
    cr_expect_eq(embedding_validate_ids(ids, 4, 151936), 0);
}

Test(cu_seqlens, rules) {
    int32_t ok[4] = {0, 1, 4, 10}, empty[3] = {0, 2, 2}, not_zero[2] = {1, 3};
    cr_expect_eq(cu_seqlens_validate(ok, 3, 10), 0);
    cr_expect_eq(cu_seqlens_validate(ok, 3, 11), -1);
    cr_expect_eq(cu_seqlens_validate(empty, 2, 2), -1);
    cr_expect_eq(cu_seqlens_validate(not_zero, 1, 3), -1);
}

Test(embedding, masked_rows_are_zero) {
    bf16_t table[6];
    float tf[6] = {1, 2, 3, 4, 5, 6}, out[6];
    float_to_bf16_array(table, tf, 6);
    int32_t ids[3] = {0, 1, 2};
    // This rank holds rows [1, 3): table + 2 is its first row.
    cr_assert_eq(embedding_cpu(out, ids, table + 2, 3, 2, 1, 3), 0);
    float want[6] = {0, 0, 3, 4, 5, 6};
    cr_expect_eq(memcmp(out, want, sizeof want), 0);
}

Test(vocab_shard, padding_and_slices) {
    vocab_shard_t v;
    cr_assert_eq(vocab_shard_init(&v, 1001, 4, 3), 0);
    cr_expect_eq(v.padded, 1004);
    cr_expect_eq(v.local_rows, 251);
    cr_expect_eq(v.start, 753);
    cr_expect_eq(v.real_end, 1001);  // 3 padding rows at the end of the last slice
    cr_assert_eq(vocab_shard_init(&v, 151936, 2, 1), 0);
    cr_expect_eq(v.padded, 151936);
    cr_expect_eq(v.start, 75968);
    cr_expect_eq(vocab_shard_init(&v, 100, 0, 0), -1);
}

Test(vocab_shard, load_zeroes_padding_and_scatter_trims) {
    vocab_shard_t v;
    cr_assert_eq(vocab_shard_init(&v, 5, 2, 1), 0);  // padded 6: rank 1 holds rows 3, 4 and one padding row
    bf16_t full[5 * 2], local[3 * 2];
    for (int i = 0; i < 10; i++) full[i] = (bf16_t)(100 + i);
    memset(local, 0xff, sizeof local);
    cr_assert_eq(vocab_shard_load(&v, "embed_tokens", full, 5, 2, 2, local), 0);
    bf16_t want[6] = {106, 107, 108, 109, 0, 0};
    cr_expect_eq(memcmp(local, want, sizeof want), 0);
    float logits_local[3] = {1, 2, 99}, logits[5] = {0};
    cr_assert_eq(vocab_shard_scatter_logits(&v, logits_local, 1, logits), 0);
    cr_expect_eq(logits[3], 1);
    cr_expect_eq(logits[4], 2);  // the padding column (99) is dropped
    cr_expect_eq(vocab_shard_load(&v, "lm_head.weight", full, 4, 2, 2, local), -1);
    cr_expect(strstr(mv_last_error(), "lm_head.weight") != NULL);
}

Test(last_tokens, selects_each_sequence_end) {
    float hidden[8] = {0, 10, 1, 11, 2, 12, 3, 13}, out[4];
    int32_t cu[3] = {0, 3, 4};
    cr_assert_eq(gather_last_tokens_cpu(out, hidden, cu, 2, 4, 2), 0);
    float want[4] = {2, 12, 3, 13};
    cr_expect_eq(memcmp(out, want, sizeof want), 0);
}

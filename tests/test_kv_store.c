/*
 * tests/test_kv_store.c - Criterion tests of chapter 06's CPU rules: where a
 * token's K/V lands ([num_blocks, block_size, Hkv, D], slot = block *
 * block_size + offset), slot -1 skipped, untouched slots kept bit for bit,
 * strided k/v views, and the validation of slots and shapes.
 *
 * Run: make test  (or build/tests/test_kv_store after make)
 */
#include <criterion/criterion.h>
#include <string.h>

#include "common/check.h"
#include "common/compare.h"
#include "reference/kv_store.h"

Test(kv_store, rows_land_in_their_slots_and_skips_keep_old_contents) {
    enum { NB = 4, BS = 4, HKV = 2, D = 3, ROW = HKV * D, T = 5 };
    bf16_t k[T * ROW], v[T * ROW], kc[NB * BS * ROW], vc[NB * BS * ROW], kc0[NB * BS * ROW], vc0[NB * BS * ROW];
    for (int i = 0; i < T * ROW; i++) k[i] = (bf16_t)(0x3f00 + i), v[i] = (bf16_t)(0xbf00 + i);
    for (int i = 0; i < NB * BS * ROW; i++) kc[i] = kc0[i] = (bf16_t)(0x1000 + i), vc[i] = vc0[i] = (bf16_t)(0x2000 + i);
    // block 3 offset 1, skip, block 0 offset 0, block 2 offset 3, skip
    int32_t slots[T] = {13, -1, 0, 11, -1};
    cr_assert_eq(store_kvcache_cpu(k, ROW, v, ROW, kc, vc, slots, T, HKV, D, BS, NB), 0, "%s", mv_last_error());
    for (int s = 0; s < NB * BS; s++) {
        int t = -1;
        for (int j = 0; j < T; j++)
            if (slots[j] == s) t = j;
        for (int e = 0; e < ROW; e++) {
            bf16_t wk = t >= 0 ? k[t * ROW + e] : kc0[s * ROW + e], wv = t >= 0 ? v[t * ROW + e] : vc0[s * ROW + e];
            cr_expect_eq(kc[s * ROW + e], wk, "K slot %d elem %d", s, e);
            cr_expect_eq(vc[s * ROW + e], wv, "V slot %d elem %d", s, e);
        }
    }
}

Test(kv_store, layout_is_block_offset_head_dim) {
    // Element (block b, offset o, head h, dim d) at ((b*BS + o)*HKV + h)*D + d.
    enum { NB = 3, BS = 2, HKV = 2, D = 2, ROW = HKV * D };
    bf16_t k[ROW] = {1, 2, 3, 4}, v[ROW] = {5, 6, 7, 8}, kc[NB * BS * ROW] = {0}, vc[NB * BS * ROW] = {0};
    int32_t slot = 2 * BS + 1;  // block 2, offset 1
    cr_assert_eq(store_kvcache_cpu(k, ROW, v, ROW, kc, vc, &slot, 1, HKV, D, BS, NB), 0);
    for (int h = 0; h < HKV; h++)
        for (int d = 0; d < D; d++) {
            cr_expect_eq(kc[((2 * BS + 1) * HKV + h) * D + d], k[h * D + d]);
            cr_expect_eq(vc[((2 * BS + 1) * HKV + h) * D + d], v[h * D + d]);
        }
}

Test(kv_store, strided_views_into_qkv_rows) {
    // QKV rows of 8 elements: q [0, 4), k [4, 6), v [6, 8); Hkv = 1, D = 2.
    enum { T = 2, QKV = 8 };
    bf16_t qkv[T * QKV], kc[4 * 2], vc[4 * 2];
    for (int i = 0; i < T * QKV; i++) qkv[i] = (bf16_t)(100 + i);
    poison_host(kc, sizeof kc);
    poison_host(vc, sizeof vc);
    int32_t slots[T] = {3, 1};
    cr_assert_eq(store_kvcache_cpu(qkv + 4, QKV, qkv + 6, QKV, kc, vc, slots, T, 1, 2, 2, 2), 0);
    cr_expect_eq(kc[3 * 2], 104);
    cr_expect_eq(kc[3 * 2 + 1], 105);
    cr_expect_eq(vc[3 * 2], 106);
    cr_expect_eq(kc[1 * 2], 112);
    cr_expect_eq(vc[1 * 2 + 1], 115);
    cr_expect_eq(kc[0], POISON_BF16);
    cr_expect_eq(vc[2 * 2], POISON_BF16);
}

Test(kv_store, slots_are_validated) {
    int32_t ok[4] = {-1, 0, 63, -1}, low[2] = {0, -2}, high[3] = {1, 2, 64}, dup[4] = {7, 8, -1, 7};
    cr_expect_eq(kv_store_validate_slots(ok, 4, 64), 0);
    cr_expect_eq(kv_store_validate_slots(low, 2, 64), -1);
    cr_expect(strstr(mv_last_error(), "token 1 has slot -2") != NULL, "%s", mv_last_error());
    cr_expect_eq(kv_store_validate_slots(high, 3, 64), -1);
    cr_expect(strstr(mv_last_error(), "token 2 has slot 64") != NULL, "%s", mv_last_error());
    cr_expect_eq(kv_store_validate_slots(dup, 4, 64), -1);
    cr_expect(strstr(mv_last_error(), "tokens 0 and 3 both write slot 7") != NULL, "%s", mv_last_error());
    // store_kvcache_cpu refuses and writes nothing.
    bf16_t k[2] = {1, 2}, kc[4] = {9, 9, 9, 9}, vc[4] = {9, 9, 9, 9};
    int32_t bad[2] = {0, 2};  // 2 slots of 1 element: slot 2 is past the end
    cr_expect_eq(store_kvcache_cpu(k, 1, k, 1, kc, vc, bad, 2, 1, 1, 1, 2), -1);
    cr_expect_eq(kc[0], 9);
}

Test(kv_store, shapes_are_validated) {
    cr_expect_eq(kv_store_validate(8, 8, 128, 1024, 4096, 16, 100), 0);
    cr_expect_eq(kv_store_validate(8, 8, 128, 1000, 4096, 16, 100), -1);  // k stride < row
    cr_expect_eq(kv_store_validate(8, 0, 128, 1024, 1024, 16, 100), -1);  // no kv heads
    cr_expect_eq(kv_store_validate(8, 8, 128, 1024, 1024, 0, 100), -1);   // block_size 0
    cr_expect_eq(kv_store_validate(8, 8, 128, 1024, 1024, 1 << 16, 1 << 16), -1);  // slots past int32
    for (int bs = 16; bs <= 256; bs *= 2) cr_expect_eq(kv_store_validate(1, 8, 128, 1024, 1024, bs, 64), 0);
}

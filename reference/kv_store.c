/* reference/kv_store.c - the paged KV cache's store step on the CPU (see kv_store.h). */
#include "reference/kv_store.h"

#include <stdlib.h>
#include <string.h>

#include "common/check.h"

int kv_store_validate(long long T, long long num_kv_heads, long long head_dim, long long k_stride,
                      long long v_stride, long long block_size, long long num_blocks) {
    if (T < 0) return mv_error("kv_store: T (tokens) must be >= 0, got %lld", T);
    if (num_kv_heads < 1 || head_dim < 1)
        return mv_error("kv_store: num_kv_heads and head_dim must be >= 1, got %lld and %lld", num_kv_heads, head_dim);
    if (block_size < 1 || num_blocks < 1)
        return mv_error("kv_store: block_size and num_blocks must be >= 1, got %lld and %lld", block_size, num_blocks);
    const long long row = num_kv_heads * head_dim;
    if (row > (1LL << 20)) return mv_error("kv_store: num_kv_heads*head_dim = %lld is larger than the lab supports", row);
    if (k_stride < row || v_stride < row)
        return mv_error("kv_store: k/v row strides (%lld, %lld) must be >= num_kv_heads*head_dim = %lld", k_stride,
                        v_stride, row);
    // slot_mapping is int32: every slot must be representable.
    if (num_blocks * block_size >= (1LL << 31))
        return mv_error("kv_store: num_blocks*block_size = %lld slots do not fit an int32 slot id",
                        num_blocks * block_size);
    if (num_blocks * block_size * row > (1LL << 40) || T * k_stride > (1LL << 40) || T * v_stride > (1LL << 40))
        return mv_error("kv_store: the cache or the k/v views are larger than the lab supports");
    return 0;
}

int kv_store_validate_slots(const int32_t *slot_mapping, int T, long long num_slots) {
    if (T < 0) return mv_error("kv_store: T (tokens) must be >= 0, got %d", T);
    if (T > 0 && !slot_mapping) return mv_error("kv_store: no slot_mapping for %d tokens", T);
    for (int t = 0; t < T; t++)
        if (slot_mapping[t] < -1 || slot_mapping[t] >= num_slots)
            return mv_error("kv_store: token %d has slot %d, outside [0, %lld) (and not -1 = skip)", t,
                            (int)slot_mapping[t], num_slots);
    // One bit per slot finds a second writer in one pass; the first writer
    // is then found by a scan (errors are rare, so that scan is cheap overall).
    unsigned char *seen = calloc((size_t)(num_slots + 7) / 8, 1);
    if (!seen) return mv_error("kv_store: out of host memory checking %lld slots", num_slots);
    for (int t = 0; t < T; t++) {
        int32_t s = slot_mapping[t];
        if (s < 0) continue;
        if (seen[s / 8] & (1u << (s % 8))) {
            int first = 0;
            while (slot_mapping[first] != s) first++;
            free(seen);
            return mv_error("kv_store: tokens %d and %d both write slot %d in one step", first, t, (int)s);
        }
        seen[s / 8] |= (unsigned char)(1u << (s % 8));
    }
    free(seen);
    return 0;
}

// Both element types share this loop: the caches are arrays of `elem`-byte
// values, and a token's K (or V) row is Hkv*D of them.
static int store_rows(const void *k, long long k_stride, const void *v, long long v_stride, void *k_cache,
                      void *v_cache, const int32_t *slot_mapping, int T, int num_kv_heads, int head_dim,
                      int block_size, int num_blocks, size_t elem) {
    if (kv_store_validate(T, num_kv_heads, head_dim, k_stride, v_stride, block_size, num_blocks) ||
        kv_store_validate_slots(slot_mapping, T, (long long)num_blocks * block_size))
        return -1;
    const size_t row = (size_t)num_kv_heads * head_dim * elem;  // bytes of one token's K (or V)
    const char *kb = k, *vb = v;
    char *kc = k_cache, *vc = v_cache;
    for (int t = 0; t < T; t++) {
        int32_t slot = slot_mapping[t];
        if (slot == -1) continue;  // already cached: the slot keeps what it holds
        memcpy(kc + (size_t)slot * row, kb + (size_t)t * (size_t)k_stride * elem, row);
        memcpy(vc + (size_t)slot * row, vb + (size_t)t * (size_t)v_stride * elem, row);
    }
    return 0;
}

int store_kvcache_cpu(const bf16_t *k, long long k_stride, const bf16_t *v, long long v_stride,
                      bf16_t *k_cache, bf16_t *v_cache, const int32_t *slot_mapping, int T,
                      int num_kv_heads, int head_dim, int block_size, int num_blocks) {
    return store_rows(k, k_stride, v, v_stride, k_cache, v_cache, slot_mapping, T, num_kv_heads, head_dim,
                      block_size, num_blocks, sizeof(bf16_t));
}

int store_kvcache_f32_cpu(const float *k, long long k_stride, const float *v, long long v_stride,
                          float *k_cache, float *v_cache, const int32_t *slot_mapping, int T,
                          int num_kv_heads, int head_dim, int block_size, int num_blocks) {
    return store_rows(k, k_stride, v, v_stride, k_cache, v_cache, slot_mapping, T, num_kv_heads, head_dim,
                      block_size, num_blocks, sizeof(float));
}

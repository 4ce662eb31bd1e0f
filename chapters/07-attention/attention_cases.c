/* chapters/07-attention/attention_cases.c - random paged attention batches and the float64 formula (see attention_cases.h). */
#include "chapters/07-attention/attention_cases.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/bf16.h"
#include "common/check.h"
#include "common/compare.h"

static int max_int(int a, int b) { return a > b ? a : b; }

int attn_specs_ragged(attn_seq_spec_t *specs, rng_t *rng, int block_size) {
    const int bs = block_size;
    const int tail = rng_int(rng, 1, max_int(1, bs - 1));  // a partial last block
    const int long_ctx = max_int(3 * bs, 256) + tail;
    int n = 0;
    specs[n++] = (attn_seq_spec_t){1, 1, -1, 0};
    specs[n++] = (attn_seq_spec_t){bs, bs, -1, 0};
    specs[n++] = (attn_seq_spec_t){bs + 1, bs + 1, -1, 0};
    // 3: a chunk of a long prompt, starting anywhere in a block.
    specs[n++] = (attn_seq_spec_t){rng_int(rng, 2, 24), long_ctx, -1, 0};
    // 4: a prefix hit on sequence 3's first full blocks, then its own new tokens.
    int m = rng_int(rng, 1, long_ctx / bs), extra = rng_int(rng, 1, 24);
    specs[n++] = (attn_seq_spec_t){extra, m * bs + extra, 3, m};
    // 5: every token cached (shared): the last one is recomputed for its logits.
    m = rng_int(rng, 1, long_ctx / bs);
    specs[n++] = (attn_seq_spec_t){1, m * bs, 3, m};
    // 6: shares sequence 1's block; an earlier chunk of its own is cached, this
    //    chunk starts mid-block.
    const int earlier = rng_int(rng, 1, max_int(1, bs - 1)), chunk = rng_int(rng, 1, 24);
    specs[n++] = (attn_seq_spec_t){chunk, bs + earlier + chunk, 1, 1};
    // 7: a decode token over a long context of its own.
    specs[n++] = (attn_seq_spec_t){1, rng_int(rng, 2 * bs, 3 * bs), -1, 0};
    return n;
}

// Checks a spec list against the rules in the header.
static int check_specs(const attn_seq_spec_t *specs, int S, int block_size) {
    for (int s = 0; s < S; s++) {
        const attn_seq_spec_t *p = &specs[s];
        if (p->num_new < 1 || p->context_len < p->num_new)
            return mv_error("attn_case: sequence %d: num_new %d, context_len %d (need 1 <= num_new <= context_len)", s,
                            p->num_new, p->context_len);
        if (p->share_from < 0) continue;
        const long long shared = (long long)p->shared_blocks * block_size;
        if (p->share_from >= s || p->shared_blocks < 1 || shared > p->context_len ||
            shared > specs[p->share_from].context_len)
            return mv_error("attn_case: sequence %d cannot share %d blocks of sequence %d", s, p->shared_blocks,
                            p->share_from);
    }
    return 0;
}

// x [n] drawn from N(0, std), each value rounded to bf16.
static void fill_bf16_values(rng_t *rng, float *x, size_t n, float std) {
    fill_normal_f32(rng, x, n, 0.0f, std);
    for (size_t i = 0; i < n; i++) x[i] = bf16_round(x[i]);
}

// Allocations of a case; 0 or -1 (out of memory).
static int alloc_case(attn_case_t *c) {
    const size_t H = (size_t)c->num_heads, Hkv = (size_t)c->num_kv_heads, D = (size_t)c->head_dim;
    const size_t slots = (size_t)c->num_blocks * c->block_size, S = (size_t)c->num_seqs;
    c->q = malloc(sizeof(float) * (size_t)c->T_q * H * D);
    c->k = malloc(sizeof(float) * (size_t)c->T_k * Hkv * D);
    c->v = malloc(sizeof(float) * (size_t)c->T_k * Hkv * D);
    c->k_cache = malloc(sizeof(float) * slots * Hkv * D);
    c->v_cache = malloc(sizeof(float) * slots * Hkv * D);
    c->cu_seqlens_q = malloc(sizeof(int32_t) * (S + 1));
    c->cu_seqlens_k = malloc(sizeof(int32_t) * (S + 1));
    c->context_lens = malloc(sizeof(int32_t) * S);
    c->block_tables = malloc(sizeof(int32_t) * S * (size_t)c->max_blocks);
    if (!c->q || !c->k || !c->v || !c->k_cache || !c->v_cache || !c->cu_seqlens_q || !c->cu_seqlens_k ||
        !c->context_lens || !c->block_tables)
        return mv_error("attn_case: out of host memory");
    return 0;
}

// Hands out physical blocks 0..num_blocks-1 in a random order.
static int32_t *shuffled_blocks(rng_t *rng, int num_blocks) {
    int32_t *p = malloc(sizeof(int32_t) * (size_t)num_blocks);
    if (!p) return NULL;
    for (int i = 0; i < num_blocks; i++) p[i] = i;
    for (int i = num_blocks - 1; i > 0; i--) {
        int j = rng_int(rng, 0, i);
        int32_t t = p[i];
        p[i] = p[j];
        p[j] = t;
    }
    return p;
}

int attn_case_make(attn_case_t *c, rng_t *rng, const attn_seq_spec_t *specs, int num_seqs, int num_heads,
                   int num_kv_heads, int head_dim, int block_size) {
    memset(c, 0, sizeof *c);
    if (num_seqs < 1 || block_size < 1 || check_specs(specs, num_seqs, block_size)) {
        if (num_seqs < 1 || block_size < 1) mv_error("attn_case: num_seqs and block_size must be >= 1");
        return -1;
    }
    const int bs = block_size;
    c->num_seqs = num_seqs;
    c->num_heads = num_heads;
    c->num_kv_heads = num_kv_heads;
    c->head_dim = head_dim;
    c->block_size = bs;
    c->scale = (float)(1.0 / sqrt((double)head_dim));
    int own_blocks = 0, widest = 0;
    for (int s = 0; s < num_seqs; s++) {
        const int used = (specs[s].context_len + bs - 1) / bs;
        own_blocks += used - (specs[s].share_from >= 0 ? specs[s].shared_blocks : 0);
        widest = max_int(widest, used);
        c->T_q += specs[s].num_new;
        c->T_k += specs[s].context_len;
    }
    c->num_blocks = own_blocks + 3;  // a few blocks nobody uses
    c->max_blocks = widest + 2;      // every table ends in -1 padding
    if (alloc_case(c)) {
        attn_case_free(c);
        return -1;
    }
    int32_t *pool = shuffled_blocks(rng, c->num_blocks);
    if (!pool) {
        attn_case_free(c);
        return mv_error("attn_case: out of host memory");
    }
    const size_t row = (size_t)num_kv_heads * head_dim;  // floats of one token's K (or V)
    fill_bf16_values(rng, c->q, (size_t)c->T_q * num_heads * head_dim, 2.0f);
    poison_host(c->k_cache, sizeof(float) * (size_t)c->num_blocks * bs * row);  // NaN in every slot
    poison_host(c->v_cache, sizeof(float) * (size_t)c->num_blocks * bs * row);
    int taken = 0;
    c->cu_seqlens_q[0] = c->cu_seqlens_k[0] = 0;
    for (int s = 0; s < num_seqs; s++) {
        const attn_seq_spec_t *p = &specs[s];
        const int ctx = p->context_len, used = (ctx + bs - 1) / bs;
        const int shared = p->share_from >= 0 ? p->shared_blocks : 0;
        c->cu_seqlens_q[s + 1] = c->cu_seqlens_q[s] + p->num_new;
        c->cu_seqlens_k[s + 1] = c->cu_seqlens_k[s] + ctx;
        c->context_lens[s] = ctx;
        int32_t *table = c->block_tables + (size_t)s * c->max_blocks;
        for (int b = 0; b < c->max_blocks; b++)
            table[b] = b < shared ? c->block_tables[(size_t)p->share_from * c->max_blocks + b]
                       : b < used ? pool[taken++]
                                  : -1;
        c->num_shared += shared;
        // Keys and values: in shared blocks, the earlier sequence's (its
        // owner wrote them to the cache); after them, new ones, written here.
        float *k = c->k + (size_t)c->cu_seqlens_k[s] * row, *v = c->v + (size_t)c->cu_seqlens_k[s] * row;
        const int shared_tokens = shared * bs;
        if (shared_tokens > 0) {
            const size_t from = (size_t)c->cu_seqlens_k[p->share_from] * row;
            memcpy(k, c->k + from, sizeof(float) * (size_t)shared_tokens * row);
            memcpy(v, c->v + from, sizeof(float) * (size_t)shared_tokens * row);
        }
        fill_bf16_values(rng, k + (size_t)shared_tokens * row, (size_t)(ctx - shared_tokens) * row, 1.0f);
        fill_bf16_values(rng, v + (size_t)shared_tokens * row, (size_t)(ctx - shared_tokens) * row, 1.0f);
        for (int j = shared_tokens; j < ctx; j++) {
            const size_t slot = (size_t)table[j / bs] * bs + (size_t)(j % bs);
            memcpy(c->k_cache + slot * row, k + (size_t)j * row, sizeof(float) * row);
            memcpy(c->v_cache + slot * row, v + (size_t)j * row, sizeof(float) * row);
        }
    }
    free(pool);
    return 0;
}

void attn_case_free(attn_case_t *c) {
    free(c->q); free(c->k); free(c->v); free(c->k_cache); free(c->v_cache);
    free(c->cu_seqlens_q); free(c->cu_seqlens_k); free(c->context_lens); free(c->block_tables);
    memset(c, 0, sizeof *c);
}

int attention_f64(double *out, const attn_case_t *c) {
    const int H = c->num_heads, Hkv = c->num_kv_heads, D = c->head_dim, group = H / Hkv;
    for (int s = 0; s < c->num_seqs; s++) {
        const int n = c->cu_seqlens_q[s + 1] - c->cu_seqlens_q[s], ctx = c->context_lens[s];
        const float *q = c->q + (size_t)c->cu_seqlens_q[s] * H * D;    // [n, H, D]
        const float *k = c->k + (size_t)c->cu_seqlens_k[s] * Hkv * D;  // [ctx, Hkv, D]
        const float *v = c->v + (size_t)c->cu_seqlens_k[s] * Hkv * D;  // [ctx, Hkv, D]
        double *o = out + (size_t)c->cu_seqlens_q[s] * H * D;          // [n, H, D]
        double *P = malloc(sizeof(double) * (size_t)n * ctx);           // [n, ctx] the whole score matrix
        if (!P) return mv_error("attention_f64: out of host memory for a %d x %d score matrix", n, ctx);
        for (int h = 0; h < H; h++) {
            const int g = h / group;
            for (int i = 0; i < n; i++) {
                double *p = P + (size_t)i * ctx;  // [ctx]
                // Query i is position ctx - n + i; later keys are masked.
                double max = -INFINITY, sum = 0;
                for (int j = 0; j < ctx; j++) {
                    p[j] = -INFINITY;
                    if (j > ctx - n + i) continue;
                    double dot = 0;
                    for (int d = 0; d < D; d++)
                        dot += (double)q[((size_t)i * H + h) * D + d] * k[((size_t)j * Hkv + g) * D + d];
                    p[j] = dot * (double)c->scale;
                    max = fmax(max, p[j]);
                }
                for (int j = 0; j < ctx; j++) sum += exp(p[j] - max);  // exp(-inf) = 0
                for (int j = 0; j < ctx; j++) p[j] = exp(p[j] - max) / sum;
            }
            // O = P V, row by row; masked weights are 0 and skipped.
            for (int i = 0; i < n; i++) {
                double *oi = o + ((size_t)i * H + h) * D;  // [D]
                for (int d = 0; d < D; d++) oi[d] = 0;
                for (int j = 0; j <= ctx - n + i; j++)
                    for (int d = 0; d < D; d++) oi[d] += P[(size_t)i * ctx + j] * v[((size_t)j * Hkv + g) * D + d];
            }
        }
        free(P);
    }
    return 0;
}

void attn_case_last_rows(const attn_case_t *c, void *dst, const void *src, size_t elem_size) {
    const size_t row = (size_t)c->num_heads * c->head_dim * elem_size;  // bytes of one token's output
    for (int s = 0; s < c->num_seqs; s++)
        memcpy((char *)dst + (size_t)s * row, (const char *)src + (size_t)(c->cu_seqlens_q[s + 1] - 1) * row, row);
}

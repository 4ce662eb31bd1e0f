/*
 * reference/attention.c - attention over the paged KV cache on the CPU (see
 * attention.h for the maths, the causal mask aligned to the end, GQA and the
 * cache layout). Clarity first: this is the code the GPU kernels are checked
 * against, and the engine's CPU backend runs it at real sizes, so it is also
 * threaded over (sequence, head) and keeps one row of scores per thread.
 */
#include "reference/attention.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "common/check.h"

// ---- validation ----------------------------------------------------------------

int attention_validate_heads(long long num_seqs, long long num_heads, long long num_kv_heads,
                             long long head_dim, float scale) {
    if (num_seqs < 0) return mv_error("attention: num_seqs must be >= 0, got %lld", num_seqs);
    if (num_heads < 1 || num_kv_heads < 1)
        return mv_error("attention: num_heads and num_kv_heads must be >= 1, got %lld and %lld", num_heads,
                        num_kv_heads);
    if (num_heads > 4096) return mv_error("attention: num_heads = %lld is more than the lab supports", num_heads);
    if (num_seqs * num_heads >= (1LL << 31))
        return mv_error("attention: num_seqs*num_heads = %lld (sequence, head) pairs is more than the lab supports",
                        num_seqs * num_heads);
    if (num_heads % num_kv_heads != 0)
        return mv_error("attention: num_heads (%lld) must be a multiple of num_kv_heads (%lld): each kv head "
                        "serves a group of num_heads / num_kv_heads query heads (GQA)",
                        num_heads, num_kv_heads);
    if (head_dim < 2 || head_dim > ATTN_MAX_HEAD_DIM || head_dim % 2 != 0)
        return mv_error("attention: head_dim must be even and in [2, %d], got %lld", ATTN_MAX_HEAD_DIM, head_dim);
    if (!(scale > 0.0f) || !isfinite(scale))
        return mv_error("attention: scale must be finite and > 0 (1/sqrt(head_dim) for Qwen3), got %g", scale);
    return 0;
}

int attention_validate_cache(long long block_size, long long num_blocks, long long max_blocks) {
    if (block_size < 1 || num_blocks < 1 || max_blocks < 1)
        return mv_error("attention: block_size, num_blocks and max_blocks must be >= 1, got %lld, %lld and %lld",
                        block_size, num_blocks, max_blocks);
    // Slot ids (block * block_size + offset) are int32 in chapters 06 and 08.
    if (num_blocks * block_size >= (1LL << 31))
        return mv_error("attention: num_blocks*block_size = %lld slots do not fit an int32 slot id",
                        num_blocks * block_size);
    if (max_blocks * block_size >= (1LL << 31))
        return mv_error("attention: max_blocks*block_size = %lld tokens per sequence do not fit an int",
                        max_blocks * block_size);
    return 0;
}

// cu [num_seqs + 1]: 0 first, then never decreasing. `name` is the array's name.
static int check_prefix_sums(const char *name, const int32_t *cu, int num_seqs) {
    if (!cu) return mv_error("attention: %s is NULL", name);
    if (cu[0] != 0) return mv_error("attention: %s[0] must be 0, got %d", name, (int)cu[0]);
    for (int s = 0; s < num_seqs; s++)
        if (cu[s + 1] < cu[s])
            return mv_error("attention: %s decreases at sequence %d: %s[%d] = %d after %s[%d] = %d", name, s, name,
                            s + 1, (int)cu[s + 1], name, s, (int)cu[s]);
    return 0;
}

int attention_validate_paged_batch(const int32_t *cu_seqlens_q, const int32_t *context_lens,
                                   const int32_t *block_tables, int num_seqs, int block_size,
                                   int num_blocks, int max_blocks) {
    if (num_seqs < 0) return mv_error("attention: num_seqs must be >= 0, got %d", num_seqs);
    if (attention_validate_cache(block_size, num_blocks, max_blocks)) return -1;
    if (num_seqs == 0) return 0;
    if (cu_seqlens_q && check_prefix_sums("cu_seqlens_q", cu_seqlens_q, num_seqs)) return -1;
    if (!context_lens || !block_tables) return mv_error("attention: context_lens or block_tables is NULL");
    const long long max_ctx = (long long)max_blocks * block_size;
    for (int s = 0; s < num_seqs; s++) {
        const int n = cu_seqlens_q ? cu_seqlens_q[s + 1] - cu_seqlens_q[s] : 1;
        const int ctx = context_lens[s];
        if (ctx < n)
            return mv_error("attention: sequence %d has context_len %d but %d new tokens (context_len counts the "
                            "cached and the new keys, so it is at least the new tokens)",
                            s, ctx, n);
        if (ctx > max_ctx)
            return mv_error("attention: sequence %d has context_len %d, more than max_blocks*block_size = %lld", s,
                            ctx, max_ctx);
        // Only the blocks that hold the context are read; the rest may be -1.
        const int used = (ctx + block_size - 1) / block_size;
        for (int b = 0; b < used; b++) {
            const int32_t id = block_tables[(size_t)s * max_blocks + b];
            if (id >= 0 && id < num_blocks) continue;
            char what[64];
            if (id == -1) snprintf(what, sizeof what, "-1 (no block)");
            else snprintf(what, sizeof what, "%d, outside [0, num_blocks = %d)", (int)id, num_blocks);
            const int last = (b + 1) * block_size < ctx ? (b + 1) * block_size - 1 : ctx - 1;
            return mv_error("attention: sequence %d: block_tables[%d][%d] = %s, but logical block %d holds its "
                            "tokens %d..%d (context_len %d)",
                            s, s, b, what, b, b * block_size, last, ctx);
        }
    }
    return 0;
}

// Sort keys: (INT32_MAX - length) in the high half, the row in the low
// half, so one ascending sort of the keys is longest first, ties by row.
static int cmp_u64(const void *a, const void *b) {
    const uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

int attention_row_order_longest_first(const int32_t *context_lens, int num_seqs, int32_t *order) {
    if (num_seqs < 0) return mv_error("attention: num_seqs must be >= 0, got %d", num_seqs);
    if (num_seqs == 0) return 0;
    if (!context_lens || !order) return mv_error("attention: the row order needs context_lens and order (NULL given)");
    uint64_t *keys = malloc((size_t)num_seqs * sizeof *keys);
    if (!keys) return mv_error("attention: out of memory for the row order of %d rows", num_seqs);
    for (int s = 0; s < num_seqs; s++) {
        const int32_t len = context_lens[s] > 0 ? context_lens[s] : 0;
        keys[s] = (uint64_t)(uint32_t)(INT32_MAX - len) << 32 | (uint32_t)s;
    }
    qsort(keys, (size_t)num_seqs, sizeof *keys, cmp_u64);
    for (int k = 0; k < num_seqs; k++) order[k] = (int32_t)(keys[k] & 0xffffffffu);
    free(keys);
    return 0;
}

int attention_validate_row_order(const int32_t *order, int num_seqs) {
    if (num_seqs < 0) return mv_error("attention: num_seqs must be >= 0, got %d", num_seqs);
    if (num_seqs == 0) return 0;
    if (!order) return mv_error("attention: the row order is NULL for %d rows", num_seqs);
    unsigned char *seen = calloc((size_t)num_seqs, 1);
    if (!seen) return mv_error("attention: out of memory checking a row order of %d rows", num_seqs);
    int rc = 0;
    for (int k = 0; k < num_seqs && !rc; k++) {
        const int32_t s = order[k];
        if (s < 0 || s >= num_seqs)
            rc = mv_error("attention: row_order[%d] = %d is outside [0, %d): the order must name every row once", k,
                          (int)s, num_seqs);
        else if (seen[s])
            rc = mv_error("attention: row_order[%d] = %d names row %d a second time: the order must name every row "
                          "once",
                          k, (int)s, (int)s);
        else
            seen[s] = 1;
    }
    free(seen);
    return rc;
}

int attention_validate_contiguous_batch(const int32_t *cu_seqlens_q, const int32_t *cu_seqlens_k,
                                        int num_seqs) {
    if (num_seqs < 0) return mv_error("attention: num_seqs must be >= 0, got %d", num_seqs);
    if (num_seqs == 0) return 0;
    if (check_prefix_sums("cu_seqlens_q", cu_seqlens_q, num_seqs) ||
        check_prefix_sums("cu_seqlens_k", cu_seqlens_k, num_seqs))
        return -1;
    for (int s = 0; s < num_seqs; s++) {
        const int n = cu_seqlens_q[s + 1] - cu_seqlens_q[s], ctx = cu_seqlens_k[s + 1] - cu_seqlens_k[s];
        if (ctx < n)
            return mv_error("attention: sequence %d has %d keys but %d queries (the keys count the cached and the "
                            "new tokens, so there are at least as many keys as queries)",
                            s, ctx, n);
    }
    return 0;
}

// ---- the computation -----------------------------------------------------------

// One batch, in either layout. Paged: block_tables != NULL, keys through the
// block table. Contiguous: block_tables == NULL, keys at rows cu_seqlens_k[s] + j.
typedef struct {
    float *out;                   // [T_q, H, D]
    const float *q;               // [T_q, H, D]
    const float *k, *v;           // paged [num_blocks, block_size, Hkv, D]; contiguous [T_k, Hkv, D]
    const int32_t *cu_seqlens_q;  // [S + 1]; NULL: sequence s has the one query row s (decode)
    const int32_t *context_lens;  // [S] paged: keys of sequence s
    const int32_t *cu_seqlens_k;  // [S + 1] contiguous: keys of sequence s
    const int32_t *block_tables;  // [S, max_blocks] paged; NULL for contiguous
    int S, H, Hkv, D, block_size, max_blocks;
    double scale;
} attn_batch_t;

// Sequence s's query rows: the first in *first, the count returned.
static int seq_queries(const attn_batch_t *a, int s, int *first) {
    if (!a->cu_seqlens_q) {
        *first = s;
        return 1;
    }
    *first = a->cu_seqlens_q[s];
    return a->cu_seqlens_q[s + 1] - a->cu_seqlens_q[s];
}

// Sequence s's keys (cached + new).
static int seq_keys(const attn_batch_t *a, int s) {
    return a->block_tables ? a->context_lens[s] : a->cu_seqlens_k[s + 1] - a->cu_seqlens_k[s];
}

// The row of k (and v) that holds key j of sequence s: for the paged cache
// the slot block * block_size + offset (chapter 06), rows of Hkv * D floats.
static size_t key_row(const attn_batch_t *a, int s, int j) {
    if (!a->block_tables) return (size_t)a->cu_seqlens_k[s] + (size_t)j;
    const int32_t block = a->block_tables[(size_t)s * a->max_blocks + j / a->block_size];
    return (size_t)block * a->block_size + (size_t)(j % a->block_size);
}

// q . k in float64. Four partial sums: each add waits for the one before it
// in its chain, so four chains run about four times as fast as one; the order
// is fixed, so the result does not depend on anything but the inputs.
// When D is not a multiple of 4, its last two elements go to the first chain.
static double dot_f64(const float *x, const float *y, int D) {
    double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    int d = 0;
    for (; d + 4 <= D; d += 4) {
        s0 += (double)x[d] * y[d];
        s1 += (double)x[d + 1] * y[d + 1];
        s2 += (double)x[d + 2] * y[d + 2];
        s3 += (double)x[d + 3] * y[d + 3];
    }
    for (; d < D; d++) s0 += (double)x[d] * y[d];
    return (s0 + s1) + (s2 + s3);
}

// Query head h of sequence s, every query row of it.
//   scores [ctx]: one row of the score matrix at a time
//   acc [D]: the weighted sum of V rows
static void attend_one_head(const attn_batch_t *a, int s, int h, double *scores, double *acc) {
    const int D = a->D;
    const int kv_head = h / (a->H / a->Hkv);  // GQA: a group of query heads shares one kv head
    const size_t row = (size_t)a->Hkv * D;    // floats per token in k and v
    int first;
    const int n = seq_queries(a, s, &first);
    const int ctx = seq_keys(a, s);
    for (int i = 0; i < n; i++) {
        const float *q = a->q + ((size_t)(first + i) * a->H + h) * D;  // [D]
        // Query i is the token at position ctx - n + i: it sees keys 0..last.
        const int last = ctx - n + i;
        double max = -INFINITY;
        for (int j = 0; j <= last; j++) {
            const float *k = a->k + key_row(a, s, j) * row + (size_t)kv_head * D;  // [D]
            scores[j] = dot_f64(q, k, D) * a->scale;
            if (scores[j] > max) max = scores[j];
        }
        // softmax(x) = exp(x - max) / sum exp(x - max): the largest term is
        // exp(0) = 1, so nothing overflows and the sum is at least 1.
        double sum = 0;
        for (int j = 0; j <= last; j++) {
            scores[j] = exp(scores[j] - max);
            sum += scores[j];
        }
        for (int d = 0; d < D; d++) acc[d] = 0;
        for (int j = 0; j <= last; j++) {
            const float *v = a->v + key_row(a, s, j) * row + (size_t)kv_head * D;  // [D]
            const double w = scores[j];
            // Two elements a step (head_dim is even): the compiler makes each
            // pair one vector instruction.
            for (int d = 0; d < D; d += 2) {
                acc[d] += w * v[d];
                acc[d + 1] += w * v[d + 1];
            }
        }
        float *o = a->out + ((size_t)(first + i) * a->H + h) * D;  // [D]
        for (int d = 0; d < D; d++) o[d] = (float)(acc[d] / sum);
    }
}

// ---- threads over (sequence, head) ---------------------------------------------

enum { ATTN_MAX_THREADS = 64 };
// Below this many multiply-adds (about a millisecond of work) threads cost
// more than they save.
#define ATTN_MIN_WORK_PER_THREAD 1e6

typedef struct {
    const attn_batch_t *a;
    atomic_int *next;  // the next (sequence, head) item, as s * H + h
    double *scores;    // [max_ctx] this thread's row of scores
    double *acc;       // [D]
} attn_worker_t;

// Take items until none are left. Taking them one at a time balances ragged
// lengths: a thread that drew a long sequence simply takes fewer items.
static void *attn_worker(void *p) {
    attn_worker_t *w = p;
    const int items = w->a->S * w->a->H;
    for (;;) {
        const int item = atomic_fetch_add(w->next, 1);
        if (item >= items) break;
        attend_one_head(w->a, item / w->a->H, item % w->a->H, w->scores, w->acc);
    }
    return NULL;
}

static int choose_threads(const attn_batch_t *a, int requested) {
    double work = 0;  // multiply-adds of q.k and p.v, at most
    for (int s = 0; s < a->S; s++) {
        int first;
        work += 2.0 * seq_queries(a, s, &first) * seq_keys(a, s) * a->H * a->D;
    }
    int n = requested;
    if (n <= 0) {
        long cpus = sysconf(_SC_NPROCESSORS_ONLN);
        n = cpus > 0 ? (int)(cpus < ATTN_MAX_THREADS ? cpus : ATTN_MAX_THREADS) : 1;
        double useful = work / ATTN_MIN_WORK_PER_THREAD;
        if (useful < n) n = useful < 1 ? 1 : (int)useful;
    }
    if (n > ATTN_MAX_THREADS) n = ATTN_MAX_THREADS;
    if (n > a->S * a->H) n = a->S * a->H;
    return n < 1 ? 1 : n;
}

static int run_batch(const attn_batch_t *a, int num_threads) {
    if (a->S == 0) return 0;
    int max_ctx = 1;
    for (int s = 0; s < a->S; s++)
        if (seq_keys(a, s) > max_ctx) max_ctx = seq_keys(a, s);
    const int nt = choose_threads(a, num_threads);
    const size_t per_thread = (size_t)max_ctx + (size_t)a->D;  // scores, then acc
    double *scratch = malloc(sizeof(double) * per_thread * (size_t)nt);
    if (!scratch)
        return mv_error("attention: out of host memory for %d threads' score rows of %d keys", nt, max_ctx);
    atomic_int next;
    atomic_init(&next, 0);
    attn_worker_t workers[ATTN_MAX_THREADS];
    pthread_t threads[ATTN_MAX_THREADS];
    for (int t = 0; t < nt; t++)
        workers[t] = (attn_worker_t){a, &next, scratch + (size_t)t * per_thread,
                                     scratch + (size_t)t * per_thread + max_ctx};
    // The calling thread is worker 0. A thread that cannot be started is no
    // error: the others take its items.
    int started = 1;
    while (started < nt && pthread_create(&threads[started], NULL, attn_worker, &workers[started]) == 0) started++;
    attn_worker(&workers[0]);
    for (int t = 1; t < started; t++) pthread_join(threads[t], NULL);
    free(scratch);
    return 0;
}

// ---- entry points --------------------------------------------------------------

static int check_buffers(const float *out, const float *q, const float *k, const float *v, long long T_q) {
    if (T_q > 0 && (!out || !q || !k || !v)) return mv_error("attention: out, q, k or v is NULL");
    return 0;
}

int attention_prefill_cpu(float *out, const float *q, const float *k_cache, const float *v_cache,
                          const int32_t *cu_seqlens_q, const int32_t *context_lens,
                          const int32_t *block_tables, int num_seqs, int num_heads, int num_kv_heads,
                          int head_dim, int block_size, int num_blocks, int max_blocks, float scale,
                          int num_threads) {
    if (attention_validate_heads(num_seqs, num_heads, num_kv_heads, head_dim, scale)) return -1;
    if (num_seqs > 0 && !cu_seqlens_q) return mv_error("attention: cu_seqlens_q is NULL");
    if (attention_validate_paged_batch(cu_seqlens_q, context_lens, block_tables, num_seqs, block_size, num_blocks,
                                       max_blocks) ||
        check_buffers(out, q, k_cache, v_cache, num_seqs ? cu_seqlens_q[num_seqs] : 0))
        return -1;
    attn_batch_t a = {out, q, k_cache, v_cache, cu_seqlens_q, context_lens, NULL, block_tables,
                      num_seqs, num_heads, num_kv_heads, head_dim, block_size, max_blocks, scale};
    return run_batch(&a, num_threads);
}

int attention_decode_cpu(float *out, const float *q, const float *k_cache, const float *v_cache,
                         const int32_t *context_lens, const int32_t *block_tables, int num_seqs,
                         int num_heads, int num_kv_heads, int head_dim, int block_size, int num_blocks,
                         int max_blocks, float scale, int num_threads) {
    if (attention_validate_heads(num_seqs, num_heads, num_kv_heads, head_dim, scale) ||
        attention_validate_paged_batch(NULL, context_lens, block_tables, num_seqs, block_size, num_blocks,
                                       max_blocks) ||
        check_buffers(out, q, k_cache, v_cache, num_seqs))
        return -1;
    attn_batch_t a = {out, q, k_cache, v_cache, NULL, context_lens, NULL, block_tables,
                      num_seqs, num_heads, num_kv_heads, head_dim, block_size, max_blocks, scale};
    return run_batch(&a, num_threads);
}

int attention_prefill_contiguous_cpu(float *out, const float *q, const float *k, const float *v,
                                     const int32_t *cu_seqlens_q, const int32_t *cu_seqlens_k,
                                     int num_seqs, int num_heads, int num_kv_heads, int head_dim,
                                     float scale, int num_threads) {
    if (attention_validate_heads(num_seqs, num_heads, num_kv_heads, head_dim, scale) ||
        attention_validate_contiguous_batch(cu_seqlens_q, cu_seqlens_k, num_seqs) ||
        check_buffers(out, q, k, v, num_seqs ? cu_seqlens_q[num_seqs] : 0))
        return -1;
    attn_batch_t a = {out, q, k, v, cu_seqlens_q, NULL, cu_seqlens_k, NULL,
                      num_seqs, num_heads, num_kv_heads, head_dim, 1, 1, scale};
    return run_batch(&a, num_threads);
}

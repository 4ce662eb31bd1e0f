/*
 * chapters/06-kv-store/main.c - Chapter 06: the paged KV cache and its store step.
 *
 * Where it sits in Qwen3: in every decoder layer, after RoPE, this step's k
 * and v rows are written into the layer's KV cache; attention (chapter 07)
 * then reads every earlier token's K and V from there.
 *
 *   k_cache, v_cache [num_blocks, block_size, num_kv_heads, head_dim] bf16
 *   slot = block * block_size + offset       (chapter 08's slot_mapping)
 *   token t: k_cache[slot_mapping[t]] = k[t], v likewise; slot -1 = skip
 *
 * A sequence's logical block i (its tokens i*block_size ..) lives in the
 * physical block block_table[i]; physical blocks are handed out one at a
 * time in any order, and two sequences with the same prefix share the
 * physical blocks of that prefix (prefix caching): their tokens there are
 * already cached and get slot -1.
 *
 * What it checks:
 *   1. The CPU reference (reference/kv_store.c): a hand-made example, the
 *      layout as attention reads it (through block tables), and the
 *      rejections of bad slots (out of range, two writers of one slot) and
 *      shapes. Always runs.
 *   2. Every CUDA version (kernels/kv_store.cu) against the CPU reference,
 *      bit for bit over the *whole* caches: block sizes 16, 32, 64, 128 and
 *      256; random block tables (blocks out of order, a shared prefix,
 *      skipped -1 slots); two steps (a prefill, then decode tokens and a new
 *      prefix-sharing sequence), so slots written in step 1 must survive
 *      step 2; caches poisoned first, so slots nobody writes must keep the
 *      poison; k/v as views into QKV rows or contiguous; odd rows and
 *      misaligned pointers (the scalar fallback).
 *   3. Timing at Qwen3-0.6B shapes (T = 1, 256, 8192; 8 kv heads of 128)
 *      and at a large shape (over 256 MiB of traffic), as GB/s and % of
 *      the measured copy bandwidth.
 *   4. The store fused with chapter 05's q/k norm + RoPE
 *      (qk_norm_rope_store_cuda, kernels/rope.h): bit for bit what
 *      qk_norm_rope_cuda (version 6) then store_kvcache_cuda (version 2)
 *      leave, in the QKV buffer and in both whole caches (poisoned first,
 *      skipped slots among the stored ones), with programmatic dependent
 *      launch off and on; against the CPU reference (qk_norm_rope_cpu,
 *      then the store); shapes that take its one kernel (head_dim 64, 128)
 *      and ones that take the two (a misaligned QKV, head_dim 96); then
 *      timed against the two kernels at T = 1, 64, 256 and 8192.
 *
 * Build and run:  make && ./build/06-kv-store [--json FILE] [--help]
 * Exit status: 0 if every check passed, 1 if any failed, 2 on bad arguments.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/bf16.h"
#include "common/check.h"
#include "common/compare.h"
#include "common/harness.h"
#include "common/rng.h"
#include "kernels/versions.h"
#include "reference/kv_store.h"
#if MV_HAVE_CUDA
#include "kernels/kv_store.h"
#include "kernels/pdl.h"
#include "kernels/rope.h"
#include "reference/rope.h"
#endif

// Exact comparison of two caches [num_slots, row] (a copy has no tolerance):
// the number of differing elements, and the first one located as
// (block, offset, head, dim) in `detail`.
static long long compare_cache(const bf16_t *got, const bf16_t *want, long long num_slots, int Hkv, int D,
                               int block_size, char *detail, size_t n) {
    const long long row = (long long)Hkv * D;
    long long bad = 0, first = -1;
    for (long long i = 0; i < num_slots * row; i++)
        if (got[i] != want[i]) {
            if (first < 0) first = i;
            bad++;
        }
    if (bad == 0) {
        snprintf(detail, n, "all %lld slots identical", num_slots);
    } else {
        long long slot = first / row;
        int e = (int)(first % row);
        snprintf(detail, n, "%lld elements differ; first: block %lld offset %lld head %d dim %d: got 0x%04x want 0x%04x",
                 bad, slot / block_size, slot % block_size, e / D, e % D, got[first], want[first]);
    }
    return bad;
}

// ---- a step of the scheduler, made up: block tables and slot_mapping -------------
enum { MAX_SEQS = 8, MAX_BLOCKS_PER_SEQ = 64 };

typedef struct {
    int len;                               // tokens whose K/V should be in the cache
    int num_blocks;
    int32_t table[MAX_BLOCKS_PER_SEQ];     // block table: physical block of logical block i
} seq_t;

typedef struct {
    int num_blocks, block_size;
    int32_t *free_blocks;  // a random permutation: blocks come out in no order
    int num_free;
    seq_t seqs[MAX_SEQS];
    int num_seqs;
} pool_t;

static void pool_init(pool_t *p, rng_t *rng, int num_blocks, int block_size) {
    p->num_blocks = num_blocks;
    p->block_size = block_size;
    p->free_blocks = mv_xmalloc(sizeof(int32_t) * (size_t)num_blocks);
    for (int i = 0; i < num_blocks; i++) p->free_blocks[i] = i;
    for (int i = num_blocks - 1; i > 0; i--) {
        int j = rng_int(rng, 0, i);
        int32_t tmp = p->free_blocks[i];
        p->free_blocks[i] = p->free_blocks[j];
        p->free_blocks[j] = tmp;
    }
    p->num_free = num_blocks;
    p->num_seqs = 0;
}

static int32_t pool_take(pool_t *p) {
    if (p->num_free == 0) mv_die_at(__FILE__, __LINE__, "pool_take", "the made-up scenario ran out of blocks");
    return p->free_blocks[--p->num_free];
}

// Grow sequence s to new_len tokens and append its tokens [from, new_len) to
// the step, each with its slot (chapter 08's rule); positions below `cached`
// are prefix-cache hits and get -1.
static void step_add(pool_t *p, int s, int from, int new_len, int cached, int32_t *slots, int *T) {
    seq_t *q = &p->seqs[s];
    const int bs = p->block_size;
    while (q->num_blocks * bs < new_len) q->table[q->num_blocks++] = pool_take(p);
    q->len = new_len;
    for (int pos = from; pos < new_len; pos++)
        slots[(*T)++] = pos < cached ? -1 : q->table[pos / bs] * bs + pos % bs;
}

// Step 1: three prefills; sequence 1 shares sequence 0's first full block(s)
// (same physical blocks in its table; those tokens are cached: -1).
// Step 2: a decode token for each sequence, and a new sequence sharing all
// of sequence 0's full blocks, with a few new tokens after them.
static void make_step(pool_t *p, rng_t *rng, int step, int32_t *slots, int *T) {
    const int bs = p->block_size;
    *T = 0;
    if (step == 1) {
        int len0 = rng_int(rng, 2 * bs, 3 * bs + bs / 2);
        p->num_seqs = 3;
        for (int s = 0; s < 3; s++) p->seqs[s].num_blocks = 0;
        step_add(p, 0, 0, len0, 0, slots, T);
        int shared = rng_int(rng, 1, len0 / bs);  // full blocks of sequence 0
        seq_t *s1 = &p->seqs[1];
        for (int i = 0; i < shared; i++) s1->table[s1->num_blocks++] = p->seqs[0].table[i];
        step_add(p, 1, 0, shared * bs + rng_int(rng, 1, 2 * bs), shared * bs, slots, T);
        step_add(p, 2, 0, rng_int(rng, 1, bs + 3), 0, slots, T);
    } else {
        for (int s = 0; s < p->num_seqs; s++) step_add(p, s, p->seqs[s].len, p->seqs[s].len + 1, 0, slots, T);
        int s = p->num_seqs++;
        seq_t *n = &p->seqs[s];
        n->num_blocks = 0;
        int full = (p->seqs[0].len - 1) / bs;  // sequence 0's blocks that were full before its decode token
        for (int i = 0; i < full; i++) n->table[n->num_blocks++] = p->seqs[0].table[i];
        step_add(p, s, 0, full * bs + rng_int(rng, 1, bs), full * bs, slots, T);
    }
}

// ---- 1. the CPU reference on its own ----------------------------------------------

static void check_hand_values(harness_t *h) {
    // 3 blocks of 2 slots, 1 kv head of 2: slots 0..5. Tokens 0..3 go to
    // slots 5, -1 (skipped), 0, 2: block 2 offset 1, -, block 0 offset 0, block 1 offset 0.
    enum { NB = 3, BS = 2, ROW = 2 };
    bf16_t k[4 * ROW], v[4 * ROW], kc[NB * BS * ROW], vc[NB * BS * ROW];
    for (int i = 0; i < 4 * ROW; i++) k[i] = float_to_bf16((float)(i + 1)), v[i] = float_to_bf16((float)(-i - 1));
    poison_host(kc, sizeof kc);
    poison_host(vc, sizeof vc);
    int32_t slots[4] = {5, -1, 0, 2};
    MV_CHECK(store_kvcache_cpu(k, ROW, v, ROW, kc, vc, slots, 4, 1, 2, BS, NB));
    const float P = 999.0f;  // stands for "still poison"
    const float want_k[NB * BS * ROW] = {5, 6, P, P, 7, 8, P, P, P, P, 1, 2};
    const float want_v[NB * BS * ROW] = {-5, -6, P, P, -7, -8, P, P, P, P, -1, -2};
    bf16_t wk[NB * BS * ROW], wv[NB * BS * ROW];
    for (int i = 0; i < NB * BS * ROW; i++) {
        wk[i] = want_k[i] == P ? POISON_BF16 : float_to_bf16(want_k[i]);
        wv[i] = want_v[i] == P ? POISON_BF16 : float_to_bf16(want_v[i]);
    }
    char detail[256];
    long long bad = compare_cache(kc, wk, NB * BS, 1, ROW, BS, detail, sizeof detail);
    harness_check_bool(h, "cpu", "hand-values", "K: slots 5,-1,0,2 into 3 blocks of 2", bad == 0, detail);
    bad = compare_cache(vc, wv, NB * BS, 1, ROW, BS, detail, sizeof detail);
    harness_check_bool(h, "cpu", "hand-values", "V: slots 5,-1,0,2 into 3 blocks of 2", bad == 0, detail);
}

// Read the cache the way attention does: for each sequence and position p,
// block table[p / block_size], offset p % block_size. Every position of
// every sequence must hold the K (and V) row its token produced; the rows
// of shared prefix blocks are the ones sequence 0 wrote.
static void check_layout_via_block_tables(harness_t *h, rng_t *rng, int block_size) {
    const int Hkv = 2, D = 8, row = Hkv * D, NB = 40;
    pool_t p;
    pool_init(&p, rng, NB, block_size);
    int32_t *slots = mv_xmalloc(sizeof(int32_t) * 16 * (size_t)block_size);  // step 1 has < 10 blocks of tokens
    int T = 0;
    make_step(&p, rng, 1, slots, &T);
    // The k row of a token carries (sequence, position) as raw bit patterns
    // (a copy moves bits, not values), so a row found in the cache names
    // where it came from: k[0] = seq, k[1] = pos; v[1] = pos + 0x2000.
    bf16_t *k = mv_xmalloc(sizeof(bf16_t) * (size_t)T * row), *v = mv_xmalloc(sizeof(bf16_t) * (size_t)T * row);
    int t = 0;
    for (int s = 0; s < p.num_seqs; s++)
        for (int pos = 0; pos < p.seqs[s].len; pos++, t++)
            for (int e = 0; e < row; e++) {
                int bits = e == 0 ? s : e == 1 ? pos : e * 1000 + s;
                k[(size_t)t * row + e] = (bf16_t)bits;
                v[(size_t)t * row + e] = (bf16_t)(bits + 0x2000);
            }
    const size_t cache_n = (size_t)NB * block_size * row;
    bf16_t *kc = mv_xmalloc(cache_n * 2), *vc = mv_xmalloc(cache_n * 2);
    poison_host(kc, cache_n * 2);
    poison_host(vc, cache_n * 2);
    MV_CHECK(store_kvcache_cpu(k, row, v, row, kc, vc, slots, T, Hkv, D, block_size, NB));
    int bad = 0, reads = 0;
    for (int s = 0; s < p.num_seqs; s++)
        for (int pos = 0; pos < p.seqs[s].len; pos++, reads++) {
            // [num_blocks, block_size, Hkv, D]: element (b, o, h, d) at ((b*bs + o)*Hkv + h)*D + d
            const int b = p.seqs[s].table[pos / block_size], o = pos % block_size;
            const bf16_t *kr = kc + ((size_t)b * block_size + o) * Hkv * D;
            const bf16_t *vr = vc + ((size_t)b * block_size + o) * Hkv * D;
            // A cached (shared) position was written by sequence 0.
            const int writer = (s == 1 && slots[p.seqs[0].len + pos] == -1) ? 0 : s;
            if (kr[0] != (bf16_t)writer || kr[1] != (bf16_t)pos || vr[1] != (bf16_t)(pos + 0x2000))
                bad++;
        }
    char detail[160], what[96];
    snprintf(detail, sizeof detail, "%d of %d (sequence, position) reads through block tables found the wrong row", bad, reads);
    snprintf(what, sizeof what, "attention-style reads, block_size %d", block_size);
    harness_check_bool(h, "cpu", "layout", what, bad == 0, detail);
    // The second step the GPU half replays (decode tokens, a new sequence
    // sharing sequence 0's full blocks) must be a valid slot_mapping too.
    int T2 = 0;
    make_step(&p, rng, 2, slots, &T2);
    int skipped = 0;
    for (int i = 0; i < T2; i++) skipped += slots[i] == -1;
    int rc = kv_store_validate_slots(slots, T2, (long long)NB * block_size);
    snprintf(detail, sizeof detail, "%d tokens, %d skipped: %s", T2, skipped, rc ? mv_last_error() : "valid");
    snprintf(what, sizeof what, "step 2 slot_mapping, block_size %d", block_size);
    harness_check_bool(h, "cpu", "layout", what, rc == 0 && skipped > 0, detail);
    free(p.free_blocks); free(slots); free(k); free(v); free(kc); free(vc);
}

static void expect_error(harness_t *h, const char *what, int rc, const char *must_mention) {
    char detail[320];
    snprintf(detail, sizeof detail, "%s", rc ? mv_last_error() : "accepted (wrong)");
    harness_check_bool(h, "cpu", "reject", what, rc != 0 && strstr(mv_last_error(), must_mention) != NULL, detail);
}

static void check_rejections(harness_t *h) {
    int32_t below[3] = {0, -2, 1}, past[2] = {3, 64}, twice[4] = {5, -1, 9, 5}, ok[4] = {0, -1, -1, 63};
    expect_error(h, "slot < -1", kv_store_validate_slots(below, 3, 64), "token 1 has slot -2");
    expect_error(h, "slot >= num_blocks*block_size", kv_store_validate_slots(past, 2, 64), "token 1 has slot 64");
    expect_error(h, "two tokens write one slot", kv_store_validate_slots(twice, 4, 64), "tokens 0 and 3 both write slot 5");
    harness_check_bool(h, "cpu", "accept", "slots 0, -1, -1 (several skips), last slot",
                       kv_store_validate_slots(ok, 4, 64) == 0, "");
    expect_error(h, "k row stride < num_kv_heads*head_dim", kv_store_validate(4, 8, 128, 512, 1024, 16, 4), "stride");
    expect_error(h, "block_size 0", kv_store_validate(4, 8, 128, 1024, 1024, 0, 4), "block_size");
    bf16_t k[4] = {0}, kc[8] = {0}, vc[8] = {0};
    expect_error(h, "store_kvcache_cpu with a bad slot", store_kvcache_cpu(k, 2, k, 2, kc, vc, past, 2, 1, 2, 2, 2),
                 "slot 64");
}

// ---- 2. and 3. the CUDA versions ------------------------------------------------------
#if MV_HAVE_CUDA
// k and v either as views into QKV rows [T, (2*Hkv + 2*Hkv) * D] (q with
// 2*Hkv heads first: the engine's layout) or as separate contiguous tensors.
typedef struct {
    int Hkv, D, block_size;
    int in_qkv, misalign;
} kcase_t;

typedef struct {
    int version, T, Hkv, D, block_size, num_blocks;
    const bf16_t *d_k, *d_v;
    long long k_stride, v_stride;
    bf16_t *d_kc, *d_vc;
    int32_t *d_slots;
} run_ctx_t;

static int run_version(void *p, cudaStream_t s) {
    run_ctx_t *r = p;
    return store_kvcache_cuda(r->version, r->d_k, r->k_stride, r->d_v, r->v_stride, r->d_kc, r->d_vc, r->d_slots, r->T,
                              r->Hkv, r->D, r->block_size, r->num_blocks, s);
}

// Device k and v for T tokens (from host rows [T, row] each), in the
// case's layout. Returns the allocation to free.
static bf16_t *upload_kv(const kcase_t *c, int T, const bf16_t *h_k, const bf16_t *h_v, run_ctx_t *r) {
    const size_t row = (size_t)c->Hkv * c->D;
    if (c->in_qkv) {
        // Whole QKV rows: q (2*Hkv heads, poison: never read), then k, then v.
        const size_t qkv_row = 4 * row;
        bf16_t *h_qkv = mv_xmalloc((size_t)T * qkv_row * 2);
        poison_host(h_qkv, (size_t)T * qkv_row * 2);
        for (int t = 0; t < T; t++) {
            memcpy(h_qkv + (size_t)t * qkv_row + 2 * row, h_k + (size_t)t * row, row * 2);
            memcpy(h_qkv + (size_t)t * qkv_row + 3 * row, h_v + (size_t)t * row, row * 2);
        }
        bf16_t *buf = gpu_alloc(((size_t)T * qkv_row + 1) * 2);
        bf16_t *qkv = buf + c->misalign;
        gpu_upload(qkv, h_qkv, (size_t)T * qkv_row * 2);
        free(h_qkv);
        r->d_k = qkv + 2 * row;
        r->d_v = qkv + 3 * row;
        r->k_stride = r->v_stride = (long long)qkv_row;
        return buf;
    }
    // v starts 8 elements (16 bytes) after k ends, so both stay 16-byte
    // aligned unless the case asks for misalignment. With v one element
    // after k, every "contiguous" case would silently take the 2-byte path
    // (on one H200, T = 65536: 82% of copy instead of 92%).
    bf16_t *buf = gpu_alloc((2 * (size_t)T * row + 16) * 2);
    bf16_t *k = buf + c->misalign, *v = buf + (size_t)T * row + 8 + c->misalign;
    gpu_upload(k, h_k, (size_t)T * row * 2);
    gpu_upload(v, h_v, (size_t)T * row * 2);
    r->d_k = k;
    r->d_v = v;
    r->k_stride = r->v_stride = (long long)row;
    return buf;
}

static void describe(const kcase_t *c, int T, char *shape, size_t n) {
    snprintf(shape, n, "T=%d kv %dx%d bs=%d %s%s", T, c->Hkv, c->D, c->block_size, c->in_qkv ? "in QKV" : "contiguous",
             c->misalign ? " +1" : "");
}

// Two steps through random block tables, every version, whole caches compared bit for bit.
static void check_steps(harness_t *h, rng_t *rng, kcase_t c) {
    const int NB = 48, bs = c.block_size, row = c.Hkv * c.D;
    const long long num_slots = (long long)NB * bs;
    const size_t cache_n = (size_t)num_slots * row;
    bf16_t *want_k = mv_xmalloc(cache_n * 2), *want_v = mv_xmalloc(cache_n * 2);
    bf16_t *got_k = mv_xmalloc(cache_n * 2), *got_v = mv_xmalloc(cache_n * 2);
    bf16_t *d_kc = gpu_alloc(cache_n * 2), *d_vc = gpu_alloc(cache_n * 2);
    int32_t *slots[2];
    int T[2];
    bf16_t *h_k[2], *h_v[2];
    // The scenario is drawn once; each version replays it on fresh caches.
    pool_t p;
    pool_init(&p, rng, NB, bs);
    for (int st = 0; st < 2; st++) {
        slots[st] = mv_xmalloc(sizeof(int32_t) * 16 * (size_t)bs);
        make_step(&p, rng, st + 1, slots[st], &T[st]);
        MV_CHECK(kv_store_validate_slots(slots[st], T[st], num_slots));  // before any kernel runs
        h_k[st] = mv_xmalloc((size_t)T[st] * row * 2);
        h_v[st] = mv_xmalloc((size_t)T[st] * row * 2);
        fill_normal_bf16(rng, h_k[st], (size_t)T[st] * row, 0.0f, 1.0f);
        fill_normal_bf16(rng, h_v[st], (size_t)T[st] * row, 0.0f, 1.0f);
    }
    char shape[96], label[96], detail[256];
    for (int v = 1; v <= KV_STORE_NUM_VERSIONS; v++) {
        if (!harness_kernel_wanted(h, v)) continue;  // --kernel N: version N alone
        poison_host(want_k, cache_n * 2);
        poison_host(want_v, cache_n * 2);
        gpu_poison(d_kc, cache_n * 2);
        gpu_poison(d_vc, cache_n * 2);
        for (int st = 0; st < 2; st++) {
            run_ctx_t r = {v, T[st], c.Hkv, c.D, bs, NB, NULL, NULL, 0, 0, d_kc, d_vc, NULL};
            bf16_t *buf = upload_kv(&c, T[st], h_k[st], h_v[st], &r);
            r.d_slots = gpu_alloc(sizeof(int32_t) * (size_t)T[st]);
            gpu_upload(r.d_slots, slots[st], sizeof(int32_t) * (size_t)T[st]);
            MV_CHECK(store_kvcache_cpu(h_k[st], row, h_v[st], row, want_k, want_v, slots[st], T[st], c.Hkv, c.D, bs, NB));
            MV_CHECK(run_version(&r, 0));
            CUDA_CHECK(cudaDeviceSynchronize());
            gpu_download(got_k, d_kc, cache_n * 2);
            gpu_download(got_v, d_vc, cache_n * 2);
            int skipped = 0, poison_slots = 0;
            for (int t = 0; t < T[st]; t++) skipped += slots[st][t] == -1;
            for (long long s = 0; s < num_slots; s++) poison_slots += want_k[(size_t)s * row] == POISON_BF16;
            describe(&c, T[st], shape, sizeof shape);
            long long bk = compare_cache(got_k, want_k, num_slots, c.Hkv, c.D, bs, detail, sizeof detail);
            size_t len = strlen(detail);
            snprintf(detail + len, sizeof detail - len, " (%d tokens, %d skipped; %d slots never written)", T[st], skipped,
                     poison_slots);
            snprintf(label, sizeof label, "%s step %d: K cache", kv_store_version_name(v), st + 1);
            harness_check_bool(h, "gpu", "random", label, bk == 0, detail);
            long long bv = compare_cache(got_v, want_v, num_slots, c.Hkv, c.D, bs, detail, sizeof detail);
            snprintf(label, sizeof label, "%s step %d: V cache", kv_store_version_name(v), st + 1);
            harness_check_bool(h, "gpu", "random", label, bv == 0, detail);
            gpu_free(buf);
            gpu_free(r.d_slots);
        }
    }
    for (int st = 0; st < 2; st++) free(slots[st]), free(h_k[st]), free(h_v[st]);
    free(p.free_blocks);
    free(want_k); free(want_v); free(got_k); free(got_v);
    gpu_free(d_kc); gpu_free(d_vc);
}

// One step of T tokens of fresh sequences: consecutive tokens fill blocks
// taken in random order (a large prefill), every token stored. Checked bit
// for bit, then timed.
static void check_and_time(harness_t *h, rng_t *rng, const char *case_name, kcase_t c, int T, int do_time,
                           double target_pct) {
    const int bs = c.block_size, row = c.Hkv * c.D;
    const int NB = (T + bs - 1) / bs + 8;  // a few blocks nobody uses
    const long long num_slots = (long long)NB * bs;
    const size_t cache_n = (size_t)num_slots * row;
    pool_t p;
    pool_init(&p, rng, NB, bs);
    int32_t *slots = mv_xmalloc(sizeof(int32_t) * (size_t)T);
    for (int t = 0; t < T; t++) slots[t] = p.free_blocks[t / bs] * bs + t % bs;
    MV_CHECK(kv_store_validate_slots(slots, T, num_slots));
    bf16_t *h_k = mv_xmalloc((size_t)T * row * 2), *h_v = mv_xmalloc((size_t)T * row * 2);
    fill_normal_bf16(rng, h_k, (size_t)T * row, 0.0f, 1.0f);
    fill_normal_bf16(rng, h_v, (size_t)T * row, 0.0f, 1.0f);
    bf16_t *want_k = mv_xmalloc(cache_n * 2), *want_v = mv_xmalloc(cache_n * 2), *got = mv_xmalloc(cache_n * 2);
    poison_host(want_k, cache_n * 2);
    poison_host(want_v, cache_n * 2);
    MV_CHECK(store_kvcache_cpu(h_k, row, h_v, row, want_k, want_v, slots, T, c.Hkv, c.D, bs, NB));

    bf16_t *d_kc = gpu_alloc(cache_n * 2), *d_vc = gpu_alloc(cache_n * 2);
    run_ctx_t r = {0, T, c.Hkv, c.D, bs, NB, NULL, NULL, 0, 0, d_kc, d_vc, NULL};
    bf16_t *buf = upload_kv(&c, T, h_k, h_v, &r);
    r.d_slots = gpu_alloc(sizeof(int32_t) * (size_t)T);
    gpu_upload(r.d_slots, slots, sizeof(int32_t) * (size_t)T);

    char shape[96], label[96], detail[256];
    describe(&c, T, shape, sizeof shape);
    // Bytes one run must move: each stored token's K and V rows read once
    // and written once, plus its 4-byte slot id:
    //   T * (Hkv * D * 2 bytes * 2 (K, V) * 2 (read, write) + 4).
    // Qwen3-0.6B: 8 * 128 * 2 * 2 * 2 + 4 = 8196 bytes per token.
    const double bytes = (double)T * ((double)row * 2 * 2 * 2 + 4);
    for (int v = 1; v <= KV_STORE_NUM_VERSIONS; v++) {
        if (!harness_kernel_wanted(h, v)) continue;  // --kernel N: version N alone
        r.version = v;
        gpu_poison(d_kc, cache_n * 2);
        gpu_poison(d_vc, cache_n * 2);
        MV_CHECK(run_version(&r, 0));
        CUDA_CHECK(cudaDeviceSynchronize());
        gpu_download(got, d_kc, cache_n * 2);
        long long bk = compare_cache(got, want_k, num_slots, c.Hkv, c.D, bs, detail, sizeof detail);
        snprintf(label, sizeof label, "%s: K cache", kv_store_version_name(v));
        harness_check_bool(h, "gpu", case_name, label, bk == 0, detail);
        gpu_download(got, d_vc, cache_n * 2);
        long long bv = compare_cache(got, want_v, num_slots, c.Hkv, c.D, bs, detail, sizeof detail);
        snprintf(label, sizeof label, "%s: V cache", kv_store_version_name(v));
        harness_check_bool(h, "gpu", case_name, label, bv == 0, detail);
        if (do_time) {
            // Storing the same rows again moves the same bytes: runs repeat as they are.
            timing_opts_t opts = {5, h->quick ? 10 : 50, 1};
            double ms = gpu_time_ms(run_version, &r, opts);
            harness_timing(h, case_name, kv_store_version_name(v), shape, ms, bytes, 0,
                           v == KV_STORE_FAST ? target_pct : 0);
        }
    }
    if (do_time && c.in_qkv) {
        // The same bytes read from the same place: cudaMemcpy2D of the k and
        // v columns of the QKV rows (half of each row for Qwen3's shape).
        bf16_t *dst = gpu_alloc((size_t)T * 4 * row * 2);
        gpu_copy2d_t cp = {dst, r.d_k, (size_t)4 * row * 2, (size_t)2 * row * 2, (size_t)T};
        timing_opts_t opts = {5, h->quick ? 10 : 50, 1};
        double ms = gpu_time_ms(gpu_copy2d, &cp, opts);
        harness_timing(h, case_name, "cudaMemcpy2D same region", shape, ms, bytes, 0, 0);
        gpu_free(dst);
    }
    gpu_free(buf); gpu_free(r.d_slots); gpu_free(d_kc); gpu_free(d_vc);
    free(p.free_blocks); free(slots); free(h_k); free(h_v); free(want_k); free(want_v); free(got);
}
// ---- 4. the store fused with q/k norm + RoPE -----------------------------------------

// Chapter 05's tolerance for its fused kernels (TOL_GPU_FUSED there): the
// fused store's k is version 6's, so it is held to the same.
static const tolerance_t TOL_FUSED_K = {
    1e-5, BF16_HALF_ULP + 2e-5, (BF16_HALF_ULP + 2e-5) * (BF16_HALF_ULP + 2e-5),
    "version 6's q/k norm + RoPE (chapter 05): output rounded once to bf16, 2^-8; its fp32 sum of squares in "
    "tree order moves 1/rms by up to ~1e-5 (relative), and per-element fp32 roundings (atol)"};

typedef struct {
    int H, Hkv, D, block_size, misalign;
    const char *why;
} fcase_t;

typedef struct {
    bf16_t *qkv, *kc, *vc, *qw, *kw;
    const int32_t *pos, *slots;
    const rope_cache_gpu_t *cache;
    int T, H, Hkv, D, bs, nb, fused;
} fused_ctx_t;

static int run_fused(void *p, cudaStream_t s) {
    const fused_ctx_t *c = p;
    const long long row = (long long)(c->H + 2 * c->Hkv) * c->D;
    if (c->fused)
        return qk_norm_rope_store_cuda(c->qkv, c->qw, c->kw, c->pos, c->cache, c->kc, c->vc, c->slots, c->T, c->H,
                                       c->Hkv, c->D, 1e-6f, c->bs, c->nb, s);
    return qk_norm_rope_cuda(6, c->qkv, c->qw, c->kw, c->pos, c->cache, c->T, c->H, c->Hkv, c->D, 1e-6f, s) ||
           store_kvcache_cuda(KV_STORE_FAST, c->qkv + (long long)c->H * c->D, row,
                              c->qkv + (long long)(c->H + c->Hkv) * c->D, row, c->kc, c->vc, c->slots, c->T, c->Hkv,
                              c->D, c->bs, c->nb, s);
}

static void check_fused(harness_t *h, rng_t *rng, fcase_t c, int T, int do_time) {
    const int row = (c.H + 2 * c.Hkv) * c.D, kvrow = c.Hkv * c.D, bs = c.block_size;
    const int NB = (T + bs - 1) / bs + 8;
    const long long num_slots = (long long)NB * bs;
    const size_t cache_n = (size_t)num_slots * kvrow, qkv_n = (size_t)T * row;
    pool_t p;
    pool_init(&p, rng, NB, bs);
    int32_t *slots = mv_xmalloc(sizeof(int32_t) * (size_t)T), *pos = mv_xmalloc(sizeof(int32_t) * (size_t)T);
    rope_config_t cfg = {c.D, 4096, 1e6, ROPE_SCALING_NONE, 0, 0, 0, 0};
    rope_cache_t cache;
    MV_CHECK(rope_cache_build(&cache, &cfg));
    for (int t = 0; t < T; t++) {
        // Every 7th token already cached (-1): its slot keeps the poison.
        slots[t] = t % 7 == 3 ? -1 : p.free_blocks[t / bs] * bs + t % bs;
        pos[t] = rng_int(rng, 0, cfg.max_position - 1);
    }
    MV_CHECK(kv_store_validate_slots(slots, T, num_slots));
    bf16_t *h_qkv = mv_xmalloc(qkv_n * 2), *h_w = mv_xmalloc((size_t)2 * c.D * 2);
    fill_normal_bf16(rng, h_qkv, qkv_n, 0.0f, 1.0f);
    fill_uniform_bf16(rng, h_w, (size_t)2 * c.D, 0.5f, 1.5f);

    rope_cache_gpu_t d_cache;
    MV_CHECK(rope_cache_upload(&d_cache, &cache));
    bf16_t *buf[2], *kc[2], *vc[2];
    fused_ctx_t ctx[2];
    bf16_t *d_w = gpu_alloc((size_t)2 * c.D * 2);
    gpu_upload(d_w, h_w, (size_t)2 * c.D * 2);
    int32_t *d_pos = gpu_alloc(sizeof(int32_t) * (size_t)T), *d_slots = gpu_alloc(sizeof(int32_t) * (size_t)T);
    gpu_upload(d_pos, pos, sizeof(int32_t) * (size_t)T);
    gpu_upload(d_slots, slots, sizeof(int32_t) * (size_t)T);
    for (int i = 0; i < 2; i++) {
        buf[i] = gpu_alloc((qkv_n + 8) * 2);
        kc[i] = gpu_alloc(cache_n * 2);
        vc[i] = gpu_alloc(cache_n * 2);
        ctx[i] = (fused_ctx_t){buf[i] + c.misalign, kc[i], vc[i], d_w, d_w + c.D, d_pos, d_slots, &d_cache,
                               T, c.H, c.Hkv, c.D, bs, NB, i};
    }
    const int one_kernel = qk_norm_rope_store_fused(ctx[1].qkv, ctx[1].qw, ctx[1].kw, &d_cache, kc[1], vc[1], c.H,
                                                    c.Hkv, c.D);
    char shape[160], detail[720], label[96];
    snprintf(shape, sizeof shape, "T=%d q %dx%d kv %dx%d bs=%d%s: %s (%s)", T, c.H, c.D, c.Hkv, c.D, bs,
             c.misalign ? " QKV+1" : "", c.why, one_kernel ? "one kernel" : "two kernels");
    bf16_t *got_qkv = mv_xmalloc(qkv_n * 2), *want_qkv = mv_xmalloc(qkv_n * 2);
    bf16_t *got_c = mv_xmalloc(cache_n * 2), *want_c = mv_xmalloc(cache_n * 2);
    for (int pdl = 0; pdl <= mv_pdl_supported(); pdl++) {
        for (int i = 0; i < 2; i++) {
            gpu_upload(ctx[i].qkv, h_qkv, qkv_n * 2);
            gpu_poison(kc[i], cache_n * 2);
            gpu_poison(vc[i], cache_n * 2);
        }
        CUDA_CHECK(cudaDeviceSynchronize());
        if (pdl) MV_CHECK(mv_pdl_set(1));
        const int rc = run_fused(&ctx[0], 0) || run_fused(&ctx[1], 0);
        if (pdl) MV_CHECK(mv_pdl_set(0));
        snprintf(label, sizeof label, "fused = qk_norm_rope v6 + store v2%s", pdl ? ", PDL" : "");
        if (rc) {
            snprintf(detail, sizeof detail, "%s: %s", shape, mv_last_error());
            harness_check_bool(h, "gpu", "fused", label, 0, detail);
            continue;
        }
        CUDA_CHECK(cudaDeviceSynchronize());
        gpu_download(want_qkv, ctx[0].qkv, qkv_n * 2);
        gpu_download(got_qkv, ctx[1].qkv, qkv_n * 2);
        const int same_qkv = !memcmp(want_qkv, got_qkv, qkv_n * 2);
        gpu_download(want_c, kc[0], cache_n * 2);
        gpu_download(got_c, kc[1], cache_n * 2);
        char kd[200], vd[200];
        const long long bk = compare_cache(got_c, want_c, num_slots, c.Hkv, c.D, bs, kd, sizeof kd);
        gpu_download(want_c, vc[0], cache_n * 2);
        gpu_download(got_c, vc[1], cache_n * 2);
        const long long bv = compare_cache(got_c, want_c, num_slots, c.Hkv, c.D, bs, vd, sizeof vd);
        snprintf(detail, sizeof detail, "%s: QKV %s; K cache %s; V cache %s", shape, same_qkv ? "identical" : "DIFFERS",
                 kd, vd);
        harness_check_bool(h, "gpu", "fused", label, same_qkv && bk == 0 && bv == 0, detail);
    }

    // Against the CPU: qk_norm_rope_cpu on the fp32 QKV, then its k and v
    // heads stored through the same slots, compared with the fused run's
    // caches (left by the last run above) at every stored slot; the skipped
    // and unused slots must still hold the poison.
    float *f_qkv = mv_xmalloc(qkv_n * sizeof(float)), *f_w = mv_xmalloc((size_t)2 * c.D * sizeof(float));
    bf16_to_float_array(f_qkv, h_qkv, qkv_n);
    bf16_to_float_array(f_w, h_w, (size_t)2 * c.D);
    MV_CHECK(qk_norm_rope_cpu(f_qkv, f_w, f_w + c.D, pos, &cache, T, c.H, c.Hkv, c.D, 1e-6f));
    size_t stored = 0;
    for (int t = 0; t < T; t++) stored += slots[t] >= 0;
    float *want_k = mv_xmalloc((stored ? stored : 1) * kvrow * sizeof(float));
    bf16_t *got_k = mv_xmalloc((stored ? stored : 1) * kvrow * 2), *got_v = mv_xmalloc(cache_n * 2);
    gpu_download(got_c, kc[1], cache_n * 2);
    gpu_download(got_v, vc[1], cache_n * 2);
    int v_exact = 1, poison_kept = 1;
    size_t j = 0;
    for (int t = 0; t < T; t++) {
        if (slots[t] < 0) continue;
        for (int e = 0; e < kvrow; e++) {
            want_k[j * kvrow + e] = f_qkv[(size_t)t * row + (size_t)c.H * c.D + e];
            got_k[j * kvrow + e] = got_c[(size_t)slots[t] * kvrow + e];
            v_exact &= got_v[(size_t)slots[t] * kvrow + e] == h_qkv[(size_t)t * row + (size_t)(c.H + c.Hkv) * c.D + e];
        }
        j++;
    }
    char *written = calloc((size_t)num_slots, 1);
    for (int t = 0; t < T; t++)
        if (slots[t] >= 0) written[slots[t]] = 1;
    for (long long sl = 0; sl < num_slots; sl++)
        if (!written[sl])
            for (int e = 0; e < kvrow; e++)
                poison_kept &= got_c[(size_t)sl * kvrow + e] == POISON_BF16 && got_v[(size_t)sl * kvrow + e] == POISON_BF16;
    free(written);
    harness_check(h, "gpu", "fused", "fused: K cache against the CPU", shape,
                  compare_bf16("fused k", got_k, want_k, stored * kvrow, TOL_FUSED_K, 0), TOL_FUSED_K);
    snprintf(detail, sizeof detail, "%s: %zu stored tokens' v heads %s", shape, stored,
             v_exact ? "bit for bit the QKV's" : "DIFFER from the QKV's");
    harness_check_bool(h, "gpu", "fused", "fused: V cache an exact copy", v_exact, detail);
    snprintf(detail, sizeof detail, "%s: slots no token stores %s", shape,
             poison_kept ? "keep the poison" : "were WRITTEN");
    harness_check_bool(h, "gpu", "fused", "fused: nothing else written", poison_kept, detail);

    if (do_time) {
        // Bytes: q and k read and written (the QKV rows' q and k columns), v
        // read, k and v written to the cache, weights and cos/sin rows small.
        const double bytes = (double)T * ((double)(c.H + c.Hkv) * c.D * 2 * 2 + (double)kvrow * 2 * 3);
        timing_opts_t opts = {5, h->quick ? 10 : 50, 1};
        for (int i = 0; i < 2; i++) {
            const double ms = gpu_time_ms(run_fused, &ctx[i], opts);
            snprintf(shape, sizeof shape, "T=%d q %dx%d kv %dx%d in QKV", T, c.H, c.D, c.Hkv, c.D);
            harness_timing(h, "fused", i ? "qk_norm_rope_store (one kernel)" : "qk_norm_rope v6 + store v2", shape, ms,
                           bytes, 0, 0);
        }
    }
    for (int i = 0; i < 2; i++) gpu_free(buf[i]), gpu_free(kc[i]), gpu_free(vc[i]);
    gpu_free(d_w); gpu_free(d_pos); gpu_free(d_slots);
    rope_cache_gpu_free(&d_cache);
    rope_cache_free(&cache);
    free(p.free_blocks); free(slots); free(pos); free(h_qkv); free(h_w); free(got_qkv); free(want_qkv);
    free(got_c); free(want_c); free(f_qkv); free(f_w); free(want_k); free(got_k); free(got_v);
}
#endif

int main(int argc, char **argv) {
    harness_t h;
    static const harness_kernel_t kernels[] = {{"store_kvcache", KV_STORE_VERSION_TABLE}, {NULL, NULL}};
    harness_begin_kernels(&h, "06-kv-store",
                          "Paged KV cache store: k/v rows into [num_blocks, block_size, Hkv, D] slots (slot -1 skipped); bf16, exact",
                          argc, argv, kernels);
    rng_t rng;
    rng_seed(&rng, h.seed);

    harness_section(&h, "CPU reference: hand-made layout, reads through block tables, rejections");
    check_hand_values(&h);
    const int block_sizes[5] = {16, 32, 64, 128, 256};
    for (int i = 0; i < 5; i++) check_layout_via_block_tables(&h, &rng, block_sizes[i]);
    check_rejections(&h);

#if MV_HAVE_CUDA
    if (h.use_gpu) {
        harness_section(&h, "CUDA versions against the CPU reference: two steps through random block tables, whole caches");
        for (int i = 0; i < 5; i++) {
            const int bs = block_sizes[i];
            // {Hkv, D, block_size, in_qkv, misalign}
            check_steps(&h, &rng, (kcase_t){8, 128, bs, 1, 0});
            check_steps(&h, &rng, (kcase_t){1, 64, bs, 0, 0});
            static const kcase_t odd[5] = {
                {3, 7, 0, 0, 0},    // row of 21 elements: scalar path
                {2, 96, 0, 1, 1},   // misaligned QKV view
                {4, 256, 0, 0, 1},  // misaligned contiguous
                {1, 2, 0, 0, 0},    // 4-byte rows
                {8, 128, 0, 1, 1},  // Qwen3's row, misaligned
            };
            kcase_t c = odd[i];
            c.block_size = bs;
            check_steps(&h, &rng, c);
        }

        harness_section(&h, "Qwen3-0.6B shapes and a large shape: check, then time");
        const int qwen_T[] = {1, 256, 8192};
        for (int i = 0; i < 3; i++) {
            check_and_time(&h, &rng, "qwen3-0.6b", (kcase_t){8, 128, 16, 1, 0}, qwen_T[i], h.do_timing, 0);
            check_and_time(&h, &rng, "qwen3-0.6b", (kcase_t){8, 128, 16, 0, 0}, qwen_T[i], h.do_timing, 0);
        }
        // Large: 65536 tokens of 8 kv heads of 128: K and V 2 KB each per
        // token, read and written: 537 MB (over 256 MiB). The fast version
        // must reach 85% of copy on contiguous k/v; from the QKV rows
        // (the engine's layout) a cudaMemcpy2D of the same region is timed beside.
        if (h.do_timing) {
            const int big_T = h.quick ? 16384 : 65536;
            check_and_time(&h, &rng, "large", (kcase_t){8, 128, 16, 0, 0}, big_T, 1, 85.0);
            check_and_time(&h, &rng, "large", (kcase_t){8, 128, 256, 0, 0}, big_T, 1, 85.0);
            check_and_time(&h, &rng, "large", (kcase_t){8, 128, 16, 1, 0}, big_T, 1, 0);
        }

        if (harness_kernel_wanted(&h, KV_STORE_FAST)) {
            harness_section(&h, "The store fused with q/k norm + RoPE (qk_norm_rope_store_cuda) against version 6 + "
                                "version 2 and the CPU");
            // {H, Hkv, D, block_size, misalign, why}
            const fcase_t fc[] = {
                {16, 8, 128, 16, 0, "Qwen3-0.6B"},
                {4, 2, 64, 32, 0, "head_dim 64 (the tiny checkpoints)"},
                {2, 1, 128, 256, 0, "one kv head, block 256"},
                {16, 8, 128, 16, 1, "QKV one element off 16 bytes"},
                {4, 2, 96, 16, 0, "head_dim 96"},
            };
            const int fT[] = {1, 7, 300};
            for (size_t i = 0; i < sizeof fc / sizeof fc[0]; i++)
                for (int k = 0; k < 3; k++) check_fused(&h, &rng, fc[i], fT[k], 0);
            if (h.do_timing) {
                const int tT[] = {1, 64, 256, 8192};
                for (int k = 0; k < 4; k++) check_fused(&h, &rng, fc[0], tT[k], 1);
            }
        }
    }
#endif
    return harness_end(&h);
}

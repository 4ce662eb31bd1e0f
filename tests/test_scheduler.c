/*
 * tests/test_scheduler.c - Criterion tests of chapter 08's scheduler: the
 * step output the model runner reads, max_num_seqs and the token budget,
 * chunked prefill (of any sequence) without starving decodes, prefix-cache
 * reuse (and the -1 slot of a fully cached prompt), preemption of the most
 * recently admitted sequence, the finishing rules, rejected requests; then
 * long randomized runs with the stand-in model (random arrivals, caches
 * small enough to preempt) checking every invariant after every step.
 *
 * Run: make test  (or build/tests/test_scheduler after make)
 */
#include <criterion/criterion.h>
#include <string.h>

#include "chapters/08-scheduler/sched/scheduler.h"
#include "chapters/08-scheduler/simulate.h"
#include "common/check.h"
#include "common/rng.h"

static scheduler_config_t config(int bs, int blocks, int seqs, int budget, int max_len) {
    scheduler_config_t c = {seqs, budget, max_len, bs, blocks, 1, {7, 9}, 2};
    return c;
}

static int64_t add(scheduler_t *s, int n, int32_t base, int max_tokens) {
    int32_t tok[4096];
    for (int i = 0; i < n; i++) tok[i] = base + i;
    sampling_params_t p = sampling_params_default(max_tokens);
    p.ignore_eos = 1;
    int64_t id = -1;
    cr_assert_eq(scheduler_add_request(s, tok, n, &p, &id, NULL), 0, "%s", mv_last_error());
    return id;
}

static const sched_step_t *schedule(scheduler_t *s) {
    const sched_step_t *st;
    cr_assert_eq(scheduler_schedule(s, &st), 0, "%s", mv_last_error());
    cr_assert_eq(scheduler_check_step(s, st), 0, "%s", mv_last_error());
    return st;
}

// Feed back the stand-in model's tokens (from each row's own tokens) and
// check the invariants.
static void postprocess(scheduler_t *s, const sched_step_t *st) {
    int32_t sampled[256];
    for (int k = 0; k < st->num_sample; k++) {
        const sequence_t *q = st->seqs[st->sample_rows[k]];
        sampled[k] = standin_next_token(q->tokens, q->num_tokens);
    }
    cr_assert_eq(scheduler_postprocess(s, sampled), 0, "%s", mv_last_error());
    cr_assert_eq(scheduler_check_invariants(s), 0, "%s", mv_last_error());
}

static int row_len(const sched_step_t *st, int r) {
    return st->cu_seqlens_q[r + 1] - st->cu_seqlens_q[r];
}

Test(scheduler, first_step_is_the_model_runners_input) {
    scheduler_t s;
    scheduler_config_t c = config(4, 16, 4, 64, 32);
    cr_assert_eq(scheduler_init(&s, &c), 0);
    add(&s, 5, 100, 4);
    add(&s, 3, 200, 4);
    const sched_step_t *st = schedule(&s);
    cr_assert_eq(st->num_seqs, 2);
    cr_assert_eq(st->num_tokens, 8);
    int32_t ids[8] = {100, 101, 102, 103, 104, 200, 201, 202}, pos[8] = {0, 1, 2, 3, 4, 0, 1, 2};
    for (int k = 0; k < 8; k++) {
        cr_expect_eq(st->input_ids[k], ids[k]);
        cr_expect_eq(st->positions[k], pos[k]);
    }
    cr_expect_eq(st->cu_seqlens_q[1], 5);
    cr_expect_eq(st->cu_seqlens_q[2], 8);
    cr_expect_eq(st->cu_seqlens_k[2], 8);
    cr_expect_eq(st->context_lens[0], 5);
    cr_expect_eq(st->context_lens[1], 3);
    cr_expect_eq(st->max_blocks_per_seq, 8);
    const int32_t *bt0 = st->block_tables, *bt1 = st->block_tables + st->max_blocks_per_seq;
    cr_expect_eq(st->slot_mapping[0], bt0[0] * 4);
    cr_expect_eq(st->slot_mapping[4], bt0[1] * 4);
    cr_expect_eq(st->slot_mapping[7], bt1[0] * 4 + 2);
    cr_expect_eq(bt0[2], -1, "block table rows are padded with -1");
    cr_expect_eq(bt1[1], -1);
    cr_expect_eq(st->num_sample, 2);
    cr_expect_eq(st->sample_token_index[0], 4);
    cr_expect_eq(st->sample_token_index[1], 7);
    postprocess(&s, st);

    st = schedule(&s);  // decode: one token per row, at the next position
    cr_assert_eq(st->num_seqs, 2);
    cr_expect_eq(st->num_tokens, 2);
    cr_expect_eq(st->positions[0], 5);
    cr_expect_eq(st->positions[1], 3);
    cr_expect_eq(st->context_lens[0], 6);
    cr_expect_eq(st->cu_seqlens_k[2], 6 + 4);
    cr_expect_eq(st->num_prefill_rows, 0);
    postprocess(&s, st);
    scheduler_free(&s);
}

Test(scheduler, respects_max_num_seqs_and_token_budget) {
    scheduler_t s;
    scheduler_config_t c = config(4, 64, 2, 16, 64);
    cr_assert_eq(scheduler_init(&s, &c), 0);
    for (int i = 0; i < 5; i++) add(&s, 3, 100 * i, 8);
    const sched_step_t *st = schedule(&s);
    cr_expect_eq(st->num_seqs, 2);
    cr_expect_eq(s.num_waiting, 3);
    postprocess(&s, st);
    scheduler_free(&s);
}

Test(scheduler, long_prompt_is_prefilled_in_chunks) {
    scheduler_t s;
    scheduler_config_t c = config(4, 64, 4, 32, 128);
    cr_assert_eq(scheduler_init(&s, &c), 0);
    add(&s, 100, 0, 2);
    int chunks[] = {32, 32, 32, 4};
    for (int i = 0; i < 4; i++) {
        const sched_step_t *st = schedule(&s);
        cr_assert_eq(st->num_tokens, chunks[i]);
        cr_expect_eq(st->positions[0], 32 * i);
        cr_expect_eq(st->context_lens[0], 32 * i + chunks[i]);
        cr_expect_eq(st->num_sample, i == 3, "only the last chunk samples");
        postprocess(&s, st);
    }
    scheduler_free(&s);
}

Test(scheduler, any_sequence_can_be_chunked_and_decodes_are_not_starved) {
    scheduler_t s;
    scheduler_config_t c = config(4, 256, 4, 32, 1024);
    cr_assert_eq(scheduler_init(&s, &c), 0);
    add(&s, 20, 0, 50);
    add(&s, 50, 1000, 50);
    const sched_step_t *st = schedule(&s);
    cr_assert_eq(st->num_seqs, 2);
    cr_expect_eq(row_len(st, 0), 20);
    cr_expect_eq(row_len(st, 1), 12, "the second sequence gets the rest of the budget");
    cr_expect_eq(st->num_sample, 1);
    postprocess(&s, st);
    // A 600-token prompt arrives behind two running sequences: every step
    // they decode one token each and the prompt takes the rest.
    add(&s, 600, 5000, 4);
    for (int step = 0; step < 12; step++) {
        st = schedule(&s);
        int decodes = 0;
        for (int r = 0; r < st->num_seqs; r++) decodes += st->seqs[r]->id == 0;
        cr_expect_eq(decodes, 1, "step %d: sequence 0 must decode every step", step);
        cr_expect_leq(st->num_tokens, 32);
        postprocess(&s, st);
    }
    scheduler_free(&s);
}

Test(scheduler, reuses_cached_prefix_and_skips_its_kv) {
    scheduler_t s;
    scheduler_config_t c = config(16, 64, 4, 256, 256);
    cr_assert_eq(scheduler_init(&s, &c), 0);
    add(&s, 40, 100, 8);
    postprocess(&s, schedule(&s));
    int32_t a0 = s.running[0]->block_table[0], a1 = s.running[0]->block_table[1];
    add(&s, 45, 100, 8);  // same first 40 tokens: two full blocks cached
    add(&s, 32, 100, 8);  // the whole prompt is two cached blocks
    const sched_step_t *st = schedule(&s);
    cr_assert_eq(st->num_seqs, 3);
    cr_expect_eq(row_len(st, 1), 45 - 32);
    cr_expect_eq(st->positions[st->cu_seqlens_q[1]], 32);
    cr_expect_eq(st->context_lens[1], 45);
    cr_expect_eq(st->block_tables[st->max_blocks_per_seq + 0], a0);
    cr_expect_eq(st->block_tables[st->max_blocks_per_seq + 1], a1);
    // Fully cached: its last token runs again for the logits, K/V not rewritten.
    cr_expect_eq(row_len(st, 2), 1);
    cr_expect_eq(st->positions[st->cu_seqlens_q[2]], 31);
    cr_expect_eq(st->slot_mapping[st->cu_seqlens_q[2]], -1);
    cr_expect_eq(st->context_lens[2], 32);
    cr_expect_eq(st->num_sample, 3);
    cr_expect_eq(s.num_cached_tokens_admitted, 64);
    postprocess(&s, st);
    st = schedule(&s);  // its first decode goes to a new block of its own
    cr_expect_geq(st->slot_mapping[st->cu_seqlens_q[2]], 0);
    postprocess(&s, st);
    scheduler_free(&s);
}

Test(scheduler, preempts_most_recently_admitted_and_recomputes_it) {
    scheduler_t s;
    // 6 blocks of 4 tokens; two sequences of 8 + 12 tokens cannot both grow.
    scheduler_config_t c = config(4, 6, 4, 64, 64);
    cr_assert_eq(scheduler_init(&s, &c), 0);
    int64_t a = add(&s, 8, 100, 12), b = add(&s, 8, 200, 12);
    int preempted_at = -1;
    for (int step = 0; step < 100 && scheduler_num_unfinished(&s); step++) {
        const sched_step_t *st = schedule(&s);
        if (st->num_preempted && preempted_at < 0) {
            preempted_at = step;
            cr_expect_eq(s.waiting[0]->id, b, "the later admitted sequence is preempted");
            cr_expect_eq(s.waiting[0]->num_blocks, 0);
            cr_expect_eq(s.running[0]->id, a);
        }
        postprocess(&s, st);
    }
    cr_expect_geq(preempted_at, 0, "the cache was too small, a preemption must happen");
    cr_assert_eq(scheduler_num_unfinished(&s), 0);
    for (sequence_t *q; (q = scheduler_pop_finished(&s)); sequence_free(q)) {
        cr_expect_eq(sequence_num_generated(q), 12);
        for (int i = q->num_prompt_tokens; i < q->num_tokens; i++)
            cr_expect_eq(q->tokens[i], standin_next_token(q->tokens, i));
    }
    scheduler_free(&s);
}

// Run one request to the end feeding `token` every step; returns it finished.
static sequence_t *run_one(scheduler_t *s, int n, int max_tokens, int ignore_eos, int32_t token) {
    int32_t tok[64];
    for (int i = 0; i < n; i++) tok[i] = 100 + i;
    sampling_params_t p = sampling_params_default(max_tokens);
    p.ignore_eos = ignore_eos;
    cr_assert_eq(scheduler_add_request(s, tok, n, &p, NULL, NULL), 0, "%s", mv_last_error());
    for (int step = 0; step < 200 && scheduler_num_unfinished(s); step++) {
        cr_assert_leq(schedule(s)->num_sample, 8);
        int32_t sampled[8] = {token, token, token, token, token, token, token, token};
        cr_assert_eq(scheduler_postprocess(s, sampled), 0);
        cr_assert_eq(scheduler_check_invariants(s), 0, "%s", mv_last_error());
    }
    sequence_t *q = scheduler_pop_finished(s);
    cr_assert_not_null(q);
    cr_expect_eq(q->status, SEQ_FINISHED);
    cr_expect_eq(s->bm.num_free, s->bm.num_blocks, "a finished sequence gives its blocks back");
    return q;
}

Test(scheduler, finishing_rules) {
    scheduler_t s;
    scheduler_config_t c = config(4, 16, 4, 64, 12);  // eos ids 7 and 9
    cr_assert_eq(scheduler_init(&s, &c), 0);
    sequence_t *q = run_one(&s, 4, 5, 0, 9);
    cr_expect_eq(q->finish_reason, FINISH_EOS);
    cr_expect_eq(sequence_num_generated(q), 1);
    sequence_free(q);
    q = run_one(&s, 4, 5, 0, 7);
    cr_expect_eq(q->finish_reason, FINISH_EOS, "every id of the eos set stops");
    sequence_free(q);
    q = run_one(&s, 4, 5, 1, 9);
    cr_expect_eq(q->finish_reason, FINISH_MAX_TOKENS, "ignore_eos keeps going");
    cr_expect_eq(sequence_num_generated(q), 5);
    sequence_free(q);
    q = run_one(&s, 4, 100, 0, 3);
    cr_expect_eq(q->finish_reason, FINISH_MAX_MODEL_LEN);
    cr_expect_eq(q->num_tokens, 12);
    sequence_free(q);
    q = run_one(&s, 12, 100, 0, 3);  // a prompt of exactly max_model_len still samples one
    cr_expect_eq(q->finish_reason, FINISH_MAX_MODEL_LEN);
    cr_expect_eq(sequence_num_generated(q), 1);
    sequence_free(q);
    scheduler_free(&s);
}

Test(scheduler, bad_requests_are_rejected_and_the_rest_go_on) {
    scheduler_t s;
    scheduler_config_t c = config(4, 8, 4, 64, 64);  // 32 tokens of cache
    cr_assert_eq(scheduler_init(&s, &c), 0);
    int32_t tok[80] = {0};
    sampling_params_t p = sampling_params_default(4);
    request_error_t e;
    cr_expect_eq(scheduler_add_request(&s, tok, 0, &p, NULL, &e), -1);
    cr_expect_eq(e, REQ_EMPTY_PROMPT);
    cr_expect_eq(scheduler_add_request(&s, tok, 65, &p, NULL, &e), -1);
    cr_expect_eq(e, REQ_PROMPT_TOO_LONG);
    cr_expect(strstr(mv_last_error(), "max_model_len") != NULL, "%s", mv_last_error());
    cr_expect_eq(scheduler_add_request(&s, tok, 30, &p, NULL, &e), -1, "30 + 4 - 1 tokens need 9 blocks");
    cr_expect_eq(e, REQ_NEVER_FITS);
    sampling_params_t zero = sampling_params_default(0);
    cr_expect_eq(scheduler_add_request(&s, tok, 4, &zero, NULL, &e), -1);
    cr_expect_eq(e, REQ_BAD_PARAMS);
    tok[2] = -5;
    cr_expect_eq(scheduler_add_request(&s, tok, 4, &p, NULL, &e), -1);
    cr_expect_eq(e, REQ_BAD_TOKEN);
    tok[2] = 0;
    cr_expect_eq(s.num_rejected, 5);
    cr_expect_eq(scheduler_num_unfinished(&s), 0);
    sequence_t *q = run_one(&s, 29, 4, 1, 5);  // 32 tokens: exactly the cache
    cr_expect_eq(sequence_num_generated(q), 4);
    sequence_free(q);
    scheduler_free(&s);
}

Test(scheduler, misuse_is_an_error) {
    scheduler_t s;
    scheduler_config_t c = config(4, 8, 4, 2, 64);
    cr_expect_eq(scheduler_init(&s, &c), -1, "budget below max_num_seqs");
    c = config(4, 8, 4, 64, 64);
    cr_assert_eq(scheduler_init(&s, &c), 0);
    cr_expect_eq(scheduler_postprocess(&s, NULL), -1, "no step in flight");
    add(&s, 4, 0, 4);
    const sched_step_t *st;
    cr_assert_eq(scheduler_schedule(&s, &st), 0);
    cr_expect_eq(scheduler_schedule(&s, &st), -1, "the last step was not postprocessed");
    scheduler_free(&s);
}

// ---- long randomized runs -------------------------------------------------------------
// (No .timeout on these: Criterion's timer leaks 48 bytes, which fails the
// LeakSanitizer run of `make test SANITIZE=1`.)

static void random_run(uint64_t seed, scheduler_config_t c, workload_t w, int min_steps,
                       int want_preemption) {
    rng_t rng;
    rng_seed(&rng, seed);
    sim_request_t *reqs = sim_make_requests(&rng, &w);
    cr_assert_not_null(reqs);
    sim_options_t opt = {.check_every_step = 1, .max_steps = 100000};
    sim_result_t r;
    int rc = sim_run(&c, reqs, w.num_requests, &opt, &r);
    cr_expect_eq(rc, 0, "seed %llu: %s", (unsigned long long)seed, mv_last_error());
    cr_expect_eq(r.finished + r.rejected, w.num_requests);
    cr_expect_eq(r.wrong_outputs, 0);
    cr_expect_geq(r.steps, min_steps, "seed %llu: only %ld steps", (unsigned long long)seed, r.steps);
    if (want_preemption)
        cr_expect_gt(r.preemptions, 0, "seed %llu: the cache should force preemption",
                     (unsigned long long)seed);
    sim_free_result(&r);
    sim_free_requests(reqs, w.num_requests);
}

Test(scheduler_random, small_cache_forces_preemption) {
    scheduler_config_t c = config(16, 96, 16, 128, 512);
    workload_t w = {120, 1, 300, 1, 200, 0, 2.0};
    for (uint64_t seed = 1; seed <= 3; seed++) random_run(seed, c, w, 1000, 1);
}

Test(scheduler_random, shared_prefix_with_eviction) {
    scheduler_config_t c = config(8, 160, 12, 64, 512);
    workload_t w = {200, 1, 100, 1, 120, 200, 1.5};
    for (uint64_t seed = 10; seed <= 12; seed++) random_run(seed, c, w, 1000, 1);
}

Test(scheduler_random, odd_block_sizes_and_no_prefix_cache) {
    workload_t w = {80, 1, 120, 1, 100, 30, 1.0};
    scheduler_config_t c = config(3, 150, 8, 24, 256);
    random_run(20, c, w, 1000, 1);
    c = config(1, 500, 8, 8, 256);
    random_run(21, c, w, 1000, 1);
    c = config(5, 90, 8, 40, 256);
    c.enable_prefix_caching = 0;
    random_run(22, c, w, 1000, 1);
}

Test(scheduler_random, some_requests_rejected_the_rest_finish) {
    // Prompts up to 300 against max_model_len 256: the long ones are rejected.
    scheduler_config_t c = config(16, 40, 8, 64, 256);
    workload_t w = {60, 1, 300, 1, 100, 0, 1.0};
    random_run(30, c, w, 300, 0);
}

// ---- asynchronous scheduling ---------------------------------------------------------------
// The same workload with and without steps planned ahead (scheduler_schedule_ahead,
// the stand-in's input ids taken from the step before's output): every
// request must end with the same tokens (checked against the stand-in model)
// and the same length and reason; the runs must plan steps ahead, and drop
// rows whose request ended unforeseen (stops, aborts) from a step in flight.
// min_ahead: the least share of steps planned ahead (arrivals make requests
// wait, and a step with one to admit is not planned ahead).
static void async_vs_sync(uint64_t seed, scheduler_config_t c, workload_t w, int stop_mod, int abort_every,
                          double min_ahead) {
    rng_t rng;
    rng_seed(&rng, seed);
    sim_request_t *reqs = sim_make_requests(&rng, &w);
    cr_assert_not_null(reqs);
    sim_result_t r[2];
    for (int a = 0; a < 2; a++) {
        sim_options_t opt = {.check_every_step = 1, .max_steps = 100000, .async = a, .stop_mod = stop_mod, .abort_every = abort_every};
        int rc = sim_run(&c, reqs, w.num_requests, &opt, &r[a]);
        cr_expect_eq(rc, 0, "seed %llu, async %d: %s", (unsigned long long)seed, a, mv_last_error());
        cr_expect_eq(r[a].wrong_outputs, 0, "seed %llu, async %d", (unsigned long long)seed, a);
        cr_expect_eq(r[a].finished + r[a].rejected, w.num_requests);
    }
    cr_expect_eq(r[0].ahead_steps, 0);
    cr_expect_gt(r[1].ahead_steps, (long)(min_ahead * r[1].steps), "seed %llu: %ld of %ld steps planned ahead",
                 (unsigned long long)seed, r[1].ahead_steps, r[1].steps);
    if (stop_mod || abort_every)
        cr_expect_gt(r[1].dropped_rows, 0, "seed %llu: no row dropped from a step in flight", (unsigned long long)seed);
    if (!abort_every)  // an abort lands on whichever request is in the middle at that step
        for (int i = 0; i < w.num_requests; i++) {
            cr_expect_eq(r[0].out_len[i], r[1].out_len[i], "seed %llu, request %d: %d tokens sync, %d async",
                         (unsigned long long)seed, i, r[0].out_len[i], r[1].out_len[i]);
            cr_expect_eq(r[0].reason[i], r[1].reason[i], "seed %llu, request %d", (unsigned long long)seed, i);
        }
    sim_free_result(&r[0]);
    sim_free_result(&r[1]);
    sim_free_requests(reqs, w.num_requests);
}

Test(scheduler_async, all_at_once_same_outputs) {
    scheduler_config_t c = config(16, 400, 16, 256, 512);
    workload_t w = {16, 1, 100, 1, 120, 0, 0.0};
    async_vs_sync(40, c, w, 0, 0, 0.8);
}

Test(scheduler_async, unforeseen_stops_drop_rows) {
    scheduler_config_t c = config(8, 300, 12, 96, 512);
    workload_t w = {80, 1, 80, 1, 150, 20, 0.5};
    for (uint64_t seed = 41; seed <= 43; seed++) async_vs_sync(seed, c, w, 37, 0, 0.1);
}

Test(scheduler_async, small_cache_preemption_and_aborts) {
    scheduler_config_t c = config(16, 96, 16, 128, 512);
    workload_t w = {120, 1, 300, 1, 200, 0, 2.0};
    for (uint64_t seed = 44; seed <= 45; seed++) async_vs_sync(seed, c, w, 53, 7, 0.03);
    c = config(3, 150, 8, 24, 256);
    c.enable_prefix_caching = 0;
    w = (workload_t){80, 1, 120, 1, 100, 30, 1.0};
    async_vs_sync(46, c, w, 0, 5, 0.03);
}

Test(scheduler_async, misuse_is_an_error) {
    scheduler_t s;
    cr_assert_eq(scheduler_init(&s, &(scheduler_config_t){.max_num_seqs = 4, .max_num_batched_tokens = 16,
                                                           .max_model_len = 64, .block_size = 4, .num_blocks = 32,
                                                           .enable_prefix_caching = 1}),
                 0);
    const sched_step_t *ah;
    cr_expect_eq(scheduler_schedule_ahead(&s, &ah), -1, "nothing in flight");
    int64_t id = add(&s, 6, 100, 5);
    const sched_step_t *st = schedule(&s);
    cr_expect_eq(scheduler_schedule_ahead(&s, &ah), 1, "a prefill step is not planned after");
    postprocess(&s, st);
    st = schedule(&s);  // a decode step
    cr_assert_eq(scheduler_schedule_ahead(&s, &ah), 0, "%s", mv_last_error());
    cr_expect_eq(ah->num_seqs, 1);
    cr_expect_eq(ah->positions[0], 7);
    cr_expect_eq(ah->input_from[0], 0);
    const sched_step_t *again;
    cr_expect_eq(scheduler_schedule_ahead(&s, &again), -1, "planned twice");
    cr_expect_eq(scheduler_abort(&s, id), -1, "abort while a step is planned ahead");
    postprocess(&s, st);
    cr_expect_eq(s.step_in_flight, 1, "the step planned ahead is in flight");
    cr_expect_eq(scheduler_check_step(&s, ah), 0, "%s", mv_last_error());
    cr_expect_eq(ah->input_ids[0], s.running[0]->tokens[7]);
    cr_expect_eq(scheduler_abort(&s, id), 0, "abort with a decode step in flight: %s", mv_last_error());
    cr_expect_eq(ah->num_seqs, 0, "its row dropped");
    cr_expect_eq(scheduler_postprocess(&s, NULL), 0);
    cr_expect_eq(s.step_in_flight, 0);
    cr_expect_eq(scheduler_check_invariants(&s), 0, "%s", mv_last_error());
    scheduler_free(&s);
}

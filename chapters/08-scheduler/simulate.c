/* chapters/08-scheduler/simulate.c - the stand-in model and workload runner of simulate.h. */
#include "chapters/08-scheduler/simulate.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/check.h"

// ---- workloads ---------------------------------------------------------------------

sim_request_t *sim_make_requests(rng_t *rng, const workload_t *w) {
    sim_request_t *reqs = calloc((size_t)w->num_requests, sizeof *reqs);
    int32_t *shared = malloc((size_t)(w->shared_prefix_len + 1) * sizeof(int32_t));
    if (!reqs || !shared) {
        free(reqs);
        free(shared);
        mv_error("sim_make_requests: out of memory");
        return NULL;
    }
    for (int i = 0; i < w->shared_prefix_len; i++) shared[i] = rng_int(rng, 0, SIM_VOCAB - 1);
    double t = 0;
    for (int r = 0; r < w->num_requests; r++) {
        sim_request_t *q = &reqs[r];
        int own = rng_int(rng, w->prompt_min, w->prompt_max);
        q->num_prompt = w->shared_prefix_len + own;
        q->prompt = malloc((size_t)q->num_prompt * sizeof(int32_t));
        if (!q->prompt) {
            sim_free_requests(reqs, r);
            free(shared);
            mv_error("sim_make_requests: out of memory");
            return NULL;
        }
        memcpy(q->prompt, shared, (size_t)w->shared_prefix_len * sizeof(int32_t));
        for (int i = w->shared_prefix_len; i < q->num_prompt; i++)
            q->prompt[i] = rng_int(rng, 0, SIM_VOCAB - 1);
        q->params = sampling_params_default(rng_int(rng, w->output_min, w->output_max));
        // Exponential gaps: arrivals of independent users (a Poisson process).
        if (w->mean_arrival_gap > 0) t += -w->mean_arrival_gap * log(1.0 - rng_double(rng));
        q->arrival_step = (long)t;
    }
    free(shared);
    return reqs;
}

void sim_free_requests(sim_request_t *reqs, int n) {
    if (!reqs) return;
    for (int i = 0; i < n; i++) free(reqs[i].prompt);
    free(reqs);
}

// ---- the stand-in model ------------------------------------------------------------

static uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

// The next token from the length and three context tokens (first, middle,
// last): depends on the prompt, on the position and on earlier outputs.
static int32_t next_from(int n, int32_t first, int32_t middle, int32_t last) {
    uint64_t h = mix64((uint64_t)n);
    h = mix64(h ^ (uint32_t)first);
    h = mix64(h ^ (uint32_t)middle);
    h = mix64(h ^ (uint32_t)last);
    return (int32_t)(h % SIM_VOCAB);
}

int32_t standin_next_token(const int32_t *tokens, int n) {
    return next_from(n, tokens[0], tokens[(n - 1) / 2], tokens[n - 1]);
}

typedef struct {
    int32_t *kv_token, *kv_pos;   // [num_blocks * block_size] what each cache slot holds
    int block_size;
} kv_sim_t;

// Read the token at position p of a row through its block table.
static int kv_read(const kv_sim_t *kv, const int32_t *row, int p, int32_t *token) {
    int32_t b = row[p / kv->block_size];
    if (b < 0) return mv_error("stand-in model: position %d has no block", p);
    size_t slot = (size_t)b * kv->block_size + p % kv->block_size;
    if (kv->kv_pos[slot] != p)
        return mv_error("stand-in model: slot %zu should hold position %d, holds %d", slot, p,
                        kv->kv_pos[slot]);
    *token = kv->kv_token[slot];
    return 0;
}

// One forward pass: write every query token's K/V, then "attend" for the
// sampled rows. sampled[num_sample] receives the next tokens. prev: NULL, or
// for a step planned ahead the step before's output, where each row's input
// id comes from (input_from), as the GPU takes it from its own memory.
static int standin_forward(kv_sim_t *kv, const sched_step_t *st, const int32_t *prev, int32_t *sampled) {
    for (int k = 0; k < st->num_tokens; k++) {
        if (st->slot_mapping[k] < 0) continue;
        kv->kv_token[st->slot_mapping[k]] = prev && st->planned_ahead ? prev[st->input_from[k]] : st->input_ids[k];
        kv->kv_pos[st->slot_mapping[k]] = st->positions[k];
    }
    for (int k = 0; k < st->num_sample; k++) {
        int r = st->sample_rows[k], n = st->context_lens[r];
        const int32_t *row = st->block_tables + (size_t)r * st->max_blocks_per_seq;
        int32_t first, middle, last;
        if (kv_read(kv, row, 0, &first) || kv_read(kv, row, (n - 1) / 2, &middle) ||
            kv_read(kv, row, n - 1, &last))
            return -1;
        sampled[k] = next_from(n, first, middle, last);
    }
    return 0;
}

// ---- the run ---------------------------------------------------------------------------

static int push_series(sim_result_t *res, long *cap, int batch, int used, int tokens) {
    if (res->steps == *cap) {
        long cap2 = *cap ? *cap * 2 : 1024;
        int *a = realloc(res->batch_size, (size_t)cap2 * sizeof(int));
        if (a) res->batch_size = a;
        int *b = realloc(res->blocks_used, (size_t)cap2 * sizeof(int));
        if (b) res->blocks_used = b;
        int *c = realloc(res->step_tokens, (size_t)cap2 * sizeof(int));
        if (c) res->step_tokens = c;
        if (!a || !b || !c) return mv_error("sim_run: out of memory for %ld steps", cap2);
        *cap = cap2;
    }
    res->batch_size[res->steps] = batch;
    res->blocks_used[res->steps] = used;
    res->step_tokens[res->steps] = tokens;
    res->steps++;
    return 0;
}

// A finished sequence: every generated token must be the reference's.
static void verify_output(sim_result_t *res, const sequence_t *q, int req) {
    res->finished++;
    res->aborted += q->finish_reason == FINISH_ABORTED;
    res->out_len[req] = sequence_num_generated(q);
    res->reason[req] = q->finish_reason;
    for (int i = q->num_prompt_tokens; i < q->num_tokens; i++)
        if (q->tokens[i] != standin_next_token(q->tokens, i)) {
            if (res->wrong_outputs++ == 0) res->first_wrong = req;
            return;
        }
}

// Pop and check every finished sequence.
static void drain_finished(scheduler_t *s, sim_result_t *res, const int *id_to_req) {
    for (sequence_t *q; (q = scheduler_pop_finished(s));) {
        verify_output(res, q, id_to_req[q->id]);
        sequence_free(q);
    }
}

// out[2][max_num_seqs]: the "GPU's" output of the step in flight and of
// the one planned ahead (the runner's ids, in the order it was given the rows).
static int run_loop(scheduler_t *s, kv_sim_t *kv, const sim_request_t *reqs, int n,
                    const sim_options_t *opt, sim_result_t *res, int *id_to_req, int32_t *out[2],
                    int32_t *sampled) {
    long now = 0, cap = 0;
    int next = 0, slot = 0;
    const sched_step_t *st = NULL;  // in flight: run, not postprocessed
    for (;;) {
        for (; next < n && reqs[next].arrival_step <= now; next++) {
            int64_t id;
            if (scheduler_add_request(s, reqs[next].prompt, reqs[next].num_prompt,
                                      &reqs[next].params, &id, NULL)) {
                res->rejected++;
                continue;
            }
            id_to_req[id] = next;
        }
        if (!st) {
            if (scheduler_num_unfinished(s) == 0) {
                if (next == n) return 0;
                now = reqs[next].arrival_step;  // idle until the next arrival
                continue;
            }
            if (scheduler_schedule(s, &st)) return -1;
            if (st->num_seqs == 0)
                return mv_error("step %ld: %d sequences wait but nothing was scheduled", res->steps,
                                scheduler_num_unfinished(s));
            if (opt->check_every_step && scheduler_check_step(s, st))
                return mv_error("step %ld: bad step: %s", res->steps, mv_last_error());
            if (standin_forward(kv, st, NULL, out[slot])) return -1;
        }
        // Step n + 1 planned and run before step n's ids are read.
        const sched_step_t *ahead = NULL;
        if (opt->async) {
            const int rc = scheduler_schedule_ahead(s, &ahead);
            if (rc < 0) return -1;
            if (rc == 0) {
                if (standin_forward(kv, ahead, out[slot], out[slot ^ 1])) return -1;
                res->ahead_steps++;
            }
        }
        for (int k = 0; k < st->num_sample; k++) {
            sampled[k] = out[slot][st->launched_index[k]];
            sequence_t *q = st->seqs[st->sample_rows[k]];
            if (opt->stop_mod && sampled[k] % opt->stop_mod == 0)
                q->params.max_tokens = sequence_num_generated(q) + 1;
        }
        int batch = st->num_seqs, tokens = st->num_tokens;
        if (batch > res->max_batch) res->max_batch = batch;
        const int ahead_rows = ahead ? ahead->num_seqs : 0;
        if (scheduler_postprocess(s, sampled)) return -1;
        if (ahead) res->dropped_rows += ahead_rows - ahead->num_seqs;
        if (opt->check_every_step && scheduler_check_invariants(s))
            return mv_error("step %ld: invariant broken: %s", res->steps, mv_last_error());
        // The step planned ahead is whole now (its input ids are in).
        if (opt->check_every_step && ahead && scheduler_check_step(s, ahead))
            return mv_error("step %ld: bad step planned ahead: %s", res->steps + 1, mv_last_error());
        int used = s->bm.num_blocks - s->bm.num_free;
        if (used > res->peak_blocks_used) res->peak_blocks_used = used;
        if (push_series(res, &cap, batch, used, tokens)) return -1;
        res->tokens += tokens;
        drain_finished(s, res, id_to_req);
        if (ahead) slot ^= 1;
        st = ahead;
        if (opt->abort_every && res->steps % opt->abort_every == 0 && s->num_running > 0) {
            const int64_t id = s->running[s->num_running / 2]->id;
            const int rows = st ? st->num_seqs : 0;
            if (scheduler_abort(s, id) != 0) return mv_error("step %ld: abort of %lld: %s", res->steps, (long long)id, mv_last_error());
            if (st) res->dropped_rows += rows - st->num_seqs;
            if (opt->check_every_step && scheduler_check_invariants(s))
                return mv_error("step %ld: invariant broken by an abort: %s", res->steps, mv_last_error());
            drain_finished(s, res, id_to_req);
        }
        if (res->steps > opt->max_steps)
            return mv_error("no end after %ld steps (%d sequences left)", res->steps,
                            scheduler_num_unfinished(s));
        now++;
    }
}

int sim_run(const scheduler_config_t *cfg, const sim_request_t *reqs, int n,
            const sim_options_t *opt, sim_result_t *res) {
    memset(res, 0, sizeof *res);
    res->first_wrong = -1;
    res->num_blocks = cfg->num_blocks;
    scheduler_t s;
    if (scheduler_init(&s, cfg)) return -1;
    size_t slots = (size_t)cfg->num_blocks * cfg->block_size;
    kv_sim_t kv = {malloc(slots * sizeof(int32_t)), malloc(slots * sizeof(int32_t)), cfg->block_size};
    int *id_to_req = malloc((size_t)(n + 1) * sizeof(int));
    int32_t *sampled = malloc((size_t)cfg->max_num_seqs * sizeof(int32_t));
    int32_t *out[2] = {malloc((size_t)cfg->max_num_seqs * sizeof(int32_t)),
                       malloc((size_t)cfg->max_num_seqs * sizeof(int32_t))};
    res->out_len = malloc((size_t)(n + 1) * sizeof(int));
    res->reason = calloc((size_t)(n + 1), sizeof(finish_reason_t));
    int rc = -1;
    if (!kv.kv_token || !kv.kv_pos || !id_to_req || !sampled || !out[0] || !out[1] || !res->out_len || !res->reason) {
        mv_error("sim_run: out of memory");
    } else {
        // Never-written slots read as position -1, which no read expects.
        memset(kv.kv_pos, 0xff, slots * sizeof(int32_t));
        for (int i = 0; i < n; i++) res->out_len[i] = -1;
        rc = run_loop(&s, &kv, reqs, n, opt, res, id_to_req, out, sampled);
    }
    res->preemptions = s.num_preemptions;
    res->prompt_tokens_admitted = s.num_prompt_tokens_admitted;
    res->cached_tokens_admitted = s.num_cached_tokens_admitted;
    res->evictions = s.bm.num_evictions;
    if (rc == 0 && res->wrong_outputs)
        rc = mv_error("%d requests produced wrong tokens (first: request %d)", res->wrong_outputs,
                      res->first_wrong);
    if (rc == 0 && res->finished + res->rejected != n)
        rc = mv_error("%d requests finished and %d were rejected, of %d", res->finished,
                      res->rejected, n);
    scheduler_free(&s);
    free(kv.kv_token);
    free(kv.kv_pos);
    free(id_to_req);
    free(sampled);
    free(out[0]);
    free(out[1]);
    return rc;
}

void sim_free_result(sim_result_t *res) {
    free(res->batch_size);
    free(res->blocks_used);
    free(res->step_tokens);
    free(res->out_len);
    free(res->reason);
    memset(res, 0, sizeof *res);
}

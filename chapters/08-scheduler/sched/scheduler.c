/* chapters/08-scheduler/sched/scheduler.c - continuous batching, as described in scheduler.h. */
#include "chapters/08-scheduler/sched/scheduler.h"

#include <stdlib.h>
#include <string.h>

#include "common/check.h"

static int min_int(int a, int b) { return a < b ? a : b; }

const char *request_error_name(request_error_t e) {
    switch (e) {
    case REQ_OK: return "ok";
    case REQ_EMPTY_PROMPT: return "empty_prompt";
    case REQ_PROMPT_TOO_LONG: return "prompt_too_long";
    case REQ_BAD_PARAMS: return "bad_params";
    case REQ_BAD_TOKEN: return "bad_token";
    case REQ_NEVER_FITS: return "never_fits";
    }
    return "?";
}

// ---- setup ----------------------------------------------------------------------------

static int check_config(const scheduler_config_t *c) {
    if (c->max_num_seqs < 1) return mv_error("scheduler: max_num_seqs must be >= 1, got %d", c->max_num_seqs);
    // Every running sequence gets at least one token per step, so the token
    // budget must cover a full batch of decodes.
    if (c->max_num_batched_tokens < c->max_num_seqs)
        return mv_error("scheduler: max_num_batched_tokens (%d) must be >= max_num_seqs (%d)",
                        c->max_num_batched_tokens, c->max_num_seqs);
    if (c->max_model_len < 1) return mv_error("scheduler: max_model_len must be >= 1, got %d", c->max_model_len);
    if (c->num_eos < 0 || c->num_eos > SCHED_MAX_EOS)
        return mv_error("scheduler: num_eos must be in [0, %d], got %d", SCHED_MAX_EOS, c->num_eos);
    return 0;
}

static int step_alloc(sched_step_t *st, int rows, int toks, int max_blocks_per_seq) {
    st->max_blocks_per_seq = max_blocks_per_seq;
    st->input_ids = malloc((size_t)toks * sizeof(int32_t));
    st->positions = malloc((size_t)toks * sizeof(int32_t));
    st->slot_mapping = malloc((size_t)toks * sizeof(int32_t));
    st->cu_seqlens_q = malloc((size_t)(rows + 1) * sizeof(int32_t));
    st->cu_seqlens_k = malloc((size_t)(rows + 1) * sizeof(int32_t));
    st->block_tables = malloc((size_t)rows * max_blocks_per_seq * sizeof(int32_t));
    st->context_lens = malloc((size_t)rows * sizeof(int32_t));
    st->sample_rows = malloc((size_t)rows * sizeof(int32_t));
    st->sample_token_index = malloc((size_t)rows * sizeof(int32_t));
    st->seqs = malloc((size_t)rows * sizeof(sequence_t *));
    st->input_from = malloc((size_t)rows * sizeof(int32_t));
    st->launched_index = malloc((size_t)rows * sizeof(int32_t));
    if (!st->input_ids || !st->positions || !st->slot_mapping || !st->cu_seqlens_q || !st->cu_seqlens_k ||
        !st->block_tables || !st->context_lens || !st->sample_rows || !st->sample_token_index || !st->seqs ||
        !st->input_from || !st->launched_index)
        return -1;
    st->cu_seqlens_q[0] = st->cu_seqlens_k[0] = 0;
    return 0;
}

static void step_free(sched_step_t *st) {
    free(st->input_ids);
    free(st->positions);
    free(st->slot_mapping);
    free(st->cu_seqlens_q);
    free(st->cu_seqlens_k);
    free(st->block_tables);
    free(st->context_lens);
    free(st->sample_rows);
    free(st->sample_token_index);
    free(st->seqs);
    free(st->input_from);
    free(st->launched_index);
}

int scheduler_init(scheduler_t *s, const scheduler_config_t *cfg) {
    memset(s, 0, sizeof *s);
    if (check_config(cfg)) return -1;
    if (bm_init(&s->bm, cfg->num_blocks, cfg->block_size, cfg->enable_prefix_caching)) return -1;
    s->cfg = *cfg;
    int rows = cfg->max_num_seqs, toks = cfg->max_num_batched_tokens;
    const int max_blocks_per_seq = blocks_for_tokens(cfg->max_model_len, cfg->block_size);
    s->cap_waiting = s->cap_finished = 64;
    s->waiting = malloc((size_t)s->cap_waiting * sizeof(sequence_t *));
    s->finished = malloc((size_t)s->cap_finished * sizeof(sequence_t *));
    s->running = malloc((size_t)rows * sizeof(sequence_t *));
    s->prefix_hits = malloc((size_t)max_blocks_per_seq * sizeof(int32_t));
    if (!s->prefix_hits || !s->waiting || !s->finished || !s->running ||
        step_alloc(&s->steps[0], rows, toks, max_blocks_per_seq) ||
        step_alloc(&s->steps[1], rows, toks, max_blocks_per_seq)) {
        scheduler_free(s);
        return mv_error("scheduler_init: out of memory");
    }
    return 0;
}

void scheduler_free(scheduler_t *s) {
    for (int i = 0; i < s->num_waiting; i++) sequence_free(s->waiting[i]);
    for (int i = 0; i < s->num_running; i++) sequence_free(s->running[i]);
    for (int i = 0; i < s->num_finished; i++) sequence_free(s->finished[i]);
    free(s->waiting);
    free(s->running);
    free(s->finished);
    step_free(&s->steps[0]);
    step_free(&s->steps[1]);
    free(s->prefix_hits);
    bm_free(&s->bm);
    memset(s, 0, sizeof *s);
}

// Grow a pointer array to hold at least `need` entries.
static int reserve(sequence_t ***arr, int *cap, int need) {
    if (need <= *cap) return 0;
    int cap2 = *cap * 2 > need ? *cap * 2 : need;
    sequence_t **p = realloc(*arr, (size_t)cap2 * sizeof(sequence_t *));
    if (!p) return mv_error("scheduler: out of memory for %d sequences", cap2);
    *arr = p;
    *cap = cap2;
    return 0;
}

// ---- requests -----------------------------------------------------------------------------

// Tokens a request can ever hold in the KV cache: it stops at max_tokens
// generated or at max_model_len tokens, and its last sampled token is never
// computed.
static int max_kv_tokens(const scheduler_config_t *c, int n, int max_tokens) {
    long last = (long)n + max_tokens;
    long cap = c->max_model_len > n + 1 ? c->max_model_len : n + 1;
    return (int)((last < cap ? last : cap) - 1);
}

static request_error_t validate_request(const scheduler_t *s, const int32_t *prompt, int n,
                                        const sampling_params_t *p) {
    const scheduler_config_t *c = &s->cfg;
    if (n < 1 || !prompt) {
        mv_error("rejected: the prompt is empty");
        return REQ_EMPTY_PROMPT;
    }
    if (n > c->max_model_len) {
        mv_error("rejected: the prompt has %d tokens, more than max_model_len = %d", n,
                 c->max_model_len);
        return REQ_PROMPT_TOO_LONG;
    }
    if (p->max_tokens < 1) {
        mv_error("rejected: max_tokens must be >= 1, got %d", p->max_tokens);
        return REQ_BAD_PARAMS;
    }
    if (!(p->temperature >= 0) || !(p->top_p > 0 && p->top_p <= 1) || p->top_k < 0) {
        mv_error("rejected: sampling parameters out of range (temperature %g >= 0, top_p %g in "
                 "(0, 1], top_k %d >= 0)", p->temperature, p->top_p, p->top_k);
        return REQ_BAD_PARAMS;
    }
    for (int i = 0; i < n; i++)
        if (prompt[i] < 0) {
            mv_error("rejected: prompt token %d has the negative id %d", i, prompt[i]);
            return REQ_BAD_TOKEN;
        }
    // Admission waits until a sequence fits; one that could not fit in an
    // empty cache would wait (or preempt itself) forever.
    int blocks = blocks_for_tokens(max_kv_tokens(c, n, p->max_tokens), c->block_size);
    if (blocks > c->num_blocks) {
        mv_error("rejected: the request may need %d KV blocks (%d prompt tokens, max_tokens %d, "
                 "block_size %d) but the cache has only %d", blocks, n, p->max_tokens,
                 c->block_size, c->num_blocks);
        return REQ_NEVER_FITS;
    }
    return REQ_OK;
}

int scheduler_add_request(scheduler_t *s, const int32_t *prompt, int n, const sampling_params_t *p,
                          int64_t *id, request_error_t *err) {
    return scheduler_add_request_user(s, prompt, n, p, NULL, id, err);
}

int scheduler_add_request_user(scheduler_t *s, const int32_t *prompt, int n, const sampling_params_t *p,
                               void *user, int64_t *id, request_error_t *err) {
    request_error_t e = validate_request(s, prompt, n, p);
    if (err) *err = e;
    if (e != REQ_OK) {
        s->num_rejected++;
        return -1;
    }
    if (reserve(&s->waiting, &s->cap_waiting, s->num_waiting + 1)) return -1;
    sequence_t *q = sequence_create(s->next_id, prompt, n, p, s->cfg.max_model_len, s->cfg.block_size);
    if (!q) return -1;
    q->user = user;
    s->waiting[s->num_waiting++] = q;
    if (id) *id = s->next_id;
    s->next_id++;
    return 0;
}

// Remove entry i of arr[0..*n), keeping the order of the others.
static void remove_at(sequence_t **arr, int *n, int i) {
    memmove(arr + i, arr + i + 1, (size_t)(*n - i - 1) * sizeof(sequence_t *));
    (*n)--;
}

// A decode step: every row one query token, every row sampled, in row order.
static int is_decode(const sched_step_t *st) {
    return st->num_tokens == st->num_seqs && st->num_sample == st->num_seqs;
}

// Drop the rows of a decode step whose seqs[r] was set to NULL: the rest
// move up in order, with their launched_index (the runner's row order).
static void drop_rows(sched_step_t *st) {
    const int W = st->max_blocks_per_seq;
    int w = 0;
    st->max_seqlen_k = 0;
    for (int r = 0; r < st->num_seqs; r++) {
        if (!st->seqs[r]) continue;
        st->input_ids[w] = st->input_ids[r];
        st->positions[w] = st->positions[r];
        st->slot_mapping[w] = st->slot_mapping[r];
        st->context_lens[w] = st->context_lens[r];
        if (w != r) memcpy(st->block_tables + (size_t)w * W, st->block_tables + (size_t)r * W, (size_t)W * sizeof(int32_t));
        st->seqs[w] = st->seqs[r];
        st->input_from[w] = st->input_from[r];
        st->launched_index[w] = st->launched_index[r];
        st->sample_rows[w] = st->sample_token_index[w] = w;
        st->cu_seqlens_q[w + 1] = w + 1;
        st->cu_seqlens_k[w + 1] = st->cu_seqlens_k[w] + st->context_lens[w];
        if (st->context_lens[w] > st->max_seqlen_k) st->max_seqlen_k = st->context_lens[w];
        w++;
    }
    st->num_seqs = st->num_tokens = st->num_sample = w;
    st->max_seqlen_q = w > 0;
}

int scheduler_abort(scheduler_t *s, int64_t id) {
    sched_step_t *st = &s->steps[s->cur];
    if (s->ahead_planned || (s->step_in_flight && !is_decode(st)))
        return mv_error("scheduler_abort: a step is %s (abort between steps)",
                        s->ahead_planned ? "planned ahead" : "in flight");
    // Room in the finished list first, so that a failure leaves everything as it was.
    if (reserve(&s->finished, &s->cap_finished, s->num_finished + 1)) return -1;
    sequence_t *q = NULL;
    for (int i = 0; i < s->num_running && !q; i++)
        if (s->running[i]->id == id) {
            q = s->running[i];
            remove_at(s->running, &s->num_running, i);
            // Its row in the decode step in flight goes (the GPU still
            // writes that row's K/V into its blocks; they are reused only
            // by a step queued after this one).
            for (int r = 0; s->step_in_flight && r < st->num_seqs; r++)
                if (st->seqs[r] == q) {
                    st->seqs[r] = NULL;
                    drop_rows(st);
                    break;
                }
            bm_release(&s->bm, q);
        }
    for (int i = 0; i < s->num_waiting && !q; i++)
        if (s->waiting[i]->id == id) {
            q = s->waiting[i];
            remove_at(s->waiting, &s->num_waiting, i);
        }
    if (!q) return 1;
    q->status = SEQ_FINISHED;
    q->finish_reason = FINISH_ABORTED;
    s->finished[s->num_finished++] = q;
    s->num_aborted++;
    return 0;
}

sequence_t *scheduler_pop_finished(scheduler_t *s) {
    if (s->num_finished == 0) return NULL;
    sequence_t *q = s->finished[0];
    memmove(s->finished, s->finished + 1, (size_t)(s->num_finished - 1) * sizeof(sequence_t *));
    s->num_finished--;
    return q;
}

// ---- scheduling ----------------------------------------------------------------------------

// Append one row to the step: the next n_new tokens of q, from its first
// uncomputed token. Those tokens count as computed from here on, and every
// block they fill is registered in the prefix cache: the model runner writes
// a layer's K/V for the whole batch before that layer's attention reads it,
// so even a sequence admitted later in this same step may reuse them.
static void step_add_row(scheduler_t *s, sequence_t *q, int n_new, int admitted) {
    sched_step_t *st = &s->steps[s->cur];
    int bs = s->cfg.block_size, r = st->num_seqs++;
    int start = q->num_computed_tokens, end = start + n_new;
    for (int t = 0; t < n_new; t++) {
        int p = start + t, k = st->num_tokens + t;
        st->input_ids[k] = q->tokens[p];
        st->positions[k] = p;
        // The only query token that can already be cached is the last token
        // of a fully cached prompt: it runs again for its logits, its K/V
        // is already in the (shared) block and must not be written.
        st->slot_mapping[k] = p < q->num_cached_tokens ? -1 : q->block_table[p / bs] * bs + p % bs;
    }
    st->num_tokens += n_new;
    st->cu_seqlens_q[r + 1] = st->num_tokens;
    st->cu_seqlens_k[r + 1] = st->cu_seqlens_k[r] + end;
    st->context_lens[r] = end;
    int32_t *row = st->block_tables + (size_t)r * st->max_blocks_per_seq;
    memcpy(row, q->block_table, (size_t)q->num_blocks * sizeof(int32_t));
    for (int j = q->num_blocks; j < st->max_blocks_per_seq; j++) row[j] = -1;
    if (n_new > st->max_seqlen_q) st->max_seqlen_q = n_new;
    if (end > st->max_seqlen_k) st->max_seqlen_k = end;
    if (n_new > 1 || admitted) st->num_prefill_rows++;
    // A row is sampled when it reaches the sequence's last token; a chunk
    // in the middle of a prompt produces nothing.
    if (end == q->num_tokens) {
        st->sample_rows[st->num_sample] = r;
        st->sample_token_index[st->num_sample] = st->num_tokens - 1;
        st->num_sample++;
    }
    st->seqs[r] = q;
    st->input_from[r] = -1;
    q->num_computed_tokens = end;
    bm_commit_full_blocks(&s->bm, q, end);
}

// Preempt by recomputation: the most recently admitted running sequence
// gives back every block and returns to the front of the waiting queue,
// keeping its tokens (prompt and generated) to prefill them again later.
static int preempt_last(scheduler_t *s) {
    sequence_t *q = s->running[--s->num_running];
    bm_release(&s->bm, q);
    q->status = SEQ_WAITING;
    q->num_computed_tokens = q->num_cached_tokens = 0;
    q->num_preemptions++;
    if (reserve(&s->waiting, &s->cap_waiting, s->num_waiting + 1)) return -1;
    memmove(s->waiting + 1, s->waiting, (size_t)s->num_waiting * sizeof(sequence_t *));
    s->waiting[0] = q;
    s->num_waiting++;
    s->num_preemptions++;
    s->steps[s->cur].num_preempted++;
    return 0;
}

// Pass 1: every running sequence gets its decode token or its next prompt
// chunk. Returns the token budget left, or -1 on an internal error.
static int schedule_running(scheduler_t *s, int budget) {
    int bs = s->cfg.block_size;
    for (int i = 0; i < s->num_running; i++) {
        sequence_t *q = s->running[i];
        // Keep one token for each running sequence behind this one, so a
        // long prompt chunk cannot starve the decodes that follow it.
        int behind = s->num_running - 1 - i;
        int n_new = min_int(q->num_tokens - q->num_computed_tokens, budget - behind);
        // Cannot happen while max_num_batched_tokens >= max_num_seqs.
        if (n_new < 1) return mv_error("scheduler: no token budget left for sequence %lld", (long long)q->id);
        int need = blocks_for_tokens(q->num_computed_tokens + n_new, bs) - q->num_blocks;
        while (need > s->bm.num_free && q->status == SEQ_RUNNING)
            if (preempt_last(s)) return -1;
        if (q->status != SEQ_RUNNING) break;  // it was the last one and preempted itself
        if (bm_append(&s->bm, q, q->num_computed_tokens + n_new)) return -1;
        step_add_row(s, q, n_new, 0);
        budget -= n_new;
    }
    return budget;
}

// Pass 2: admit waiting sequences in order while rows, budget and blocks last.
static int schedule_waiting(scheduler_t *s, int budget) {
    int32_t *hits = s->prefix_hits;
    while (s->num_waiting > 0 && s->num_running < s->cfg.max_num_seqs && budget > 0) {
        sequence_t *q = s->waiting[0];
        int n_hits = bm_match_prefix(&s->bm, q, hits, q->max_blocks);
        // First come, first served: if the head of the queue does not fit,
        // nobody behind it jumps ahead (that would starve long prompts).
        if (bm_admit_cost(&s->bm, q, hits, n_hits) > s->bm.num_free) break;
        if (bm_admit(&s->bm, q)) return -1;
        memmove(s->waiting, s->waiting + 1, (size_t)(s->num_waiting - 1) * sizeof(sequence_t *));
        s->num_waiting--;
        q->status = SEQ_RUNNING;
        s->running[s->num_running++] = q;
        // At least the last token is computed, for its logits.
        q->num_computed_tokens = min_int(q->num_cached_tokens, q->num_tokens - 1);
        s->num_prompt_tokens_admitted += q->num_tokens;
        s->num_cached_tokens_admitted += q->num_cached_tokens;
        int n_new = min_int(q->num_tokens - q->num_computed_tokens, budget);
        step_add_row(s, q, n_new, 1);
        s->steps[s->cur].num_admitted++;
        budget -= n_new;
    }
    return budget;
}

int scheduler_schedule(scheduler_t *s, const sched_step_t **out) {
    if (s->step_in_flight)
        return mv_error("scheduler_schedule: the previous step was not postprocessed");
    sched_step_t *st = &s->steps[s->cur];
    st->num_seqs = st->num_tokens = st->num_sample = st->num_prefill_rows = 0;
    st->max_seqlen_q = st->max_seqlen_k = 0;
    st->num_preempted = st->num_admitted = 0;
    st->planned_ahead = 0;
    *out = st;
    int budget = schedule_running(s, s->cfg.max_num_batched_tokens);
    if (budget < 0) return -1;
    // After a preemption the cache is full: admitting now would only
    // preempt again next step.
    if (st->num_preempted == 0 && schedule_waiting(s, budget) < 0) return -1;
    st->num_launched_sample = st->num_sample;
    for (int k = 0; k < st->num_sample; k++) st->launched_index[k] = k;
    if (st->num_seqs == 0) return 0;
    s->step_in_flight = 1;
    s->num_steps++;
    s->num_tokens_scheduled += st->num_tokens;
    return 0;
}

// Does step n, now running, end q by length whatever it samples? (The
// finish rules of finish_reason below that do not depend on the token.)
static int ends_by_length(const scheduler_config_t *c, const sequence_t *q) {
    return sequence_num_generated(q) + 1 >= q->params.max_tokens || q->num_tokens + 1 >= c->max_model_len;
}

int scheduler_schedule_ahead(scheduler_t *s, const sched_step_t **out) {
    *out = NULL;
    if (!s->step_in_flight) return mv_error("scheduler_schedule_ahead: no step is in flight to plan after");
    if (s->ahead_planned) return mv_error("scheduler_schedule_ahead: a step is planned ahead already");
    const sched_step_t *now = &s->steps[s->cur];
    if (!is_decode(now) || now->num_seqs == 0) return 1;
    const int bs = s->cfg.block_size;
    int need = 0, rows = 0;
    for (int r = 0; r < now->num_seqs; r++) {
        const sequence_t *q = now->seqs[r];
        if (ends_by_length(&s->cfg, q)) continue;
        // The token step n samples sits at position num_tokens: its K/V needs a slot.
        need += blocks_for_tokens(q->num_tokens + 1, bs) - q->num_blocks;
        rows++;
    }
    // Blocks short: scheduler_schedule may preempt (or find them freed by
    // the sequences step n ends); leave it to the usual path.
    if (rows == 0 || need > s->bm.num_free) return 1;
    // A request waits: scheduler_schedule would admit it next step unless
    // every row goes on and the head of the queue has no room (a row, the
    // token budget, or its blocks). Only then is the step planned ahead the
    // one it would plan (an unforeseen end of step n admits it a step later).
    if (s->num_waiting > 0) {
        if (rows < now->num_seqs) return 1;
        if (s->num_running < s->cfg.max_num_seqs && rows < s->cfg.max_num_batched_tokens) {
            sequence_t *head = s->waiting[0];
            const int n_hits = bm_match_prefix(&s->bm, head, s->prefix_hits, head->max_blocks);
            if (bm_admit_cost(&s->bm, head, s->prefix_hits, n_hits) <= s->bm.num_free - need) return 1;
        }
    }
    sched_step_t *st = &s->steps[s->cur ^ 1];
    st->num_seqs = st->num_tokens = st->num_sample = st->num_prefill_rows = 0;
    st->max_seqlen_k = 0;
    st->max_seqlen_q = 1;
    st->num_preempted = st->num_admitted = 0;
    st->planned_ahead = 1;
    for (int r = 0; r < now->num_seqs; r++) {
        sequence_t *q = now->seqs[r];
        if (ends_by_length(&s->cfg, q)) continue;
        const int p = q->num_tokens, w = st->num_seqs++;
        if (bm_append(&s->bm, q, p + 1)) return -1;  // cannot fail: counted above
        st->input_ids[w] = 0;  // step n's token: filled in by its postprocess
        st->input_from[w] = now->launched_index[r];  // the runner's index of row r's id (sample index = row)
        st->positions[w] = p;
        st->slot_mapping[w] = q->block_table[p / bs] * bs + p % bs;
        st->context_lens[w] = p + 1;
        st->cu_seqlens_q[w + 1] = w + 1;
        st->cu_seqlens_k[w + 1] = st->cu_seqlens_k[w] + p + 1;
        int32_t *row = st->block_tables + (size_t)w * st->max_blocks_per_seq;
        memcpy(row, q->block_table, (size_t)q->num_blocks * sizeof(int32_t));
        for (int j = q->num_blocks; j < st->max_blocks_per_seq; j++) row[j] = -1;
        if (p + 1 > st->max_seqlen_k) st->max_seqlen_k = p + 1;
        st->sample_rows[w] = st->sample_token_index[w] = st->launched_index[w] = w;
        st->seqs[w] = q;
        // As step_add_row: counted as computed from here on. Its full blocks
        // are hashed by step n's postprocess, once the token is known.
        q->num_computed_tokens = p + 1;
    }
    st->num_tokens = st->num_sample = st->num_launched_sample = st->num_seqs;
    s->ahead_planned = 1;
    s->num_steps++;
    s->num_tokens_scheduled += st->num_tokens;
    *out = st;
    return 0;
}

// ---- feedback -------------------------------------------------------------------------------

static int is_eos(const scheduler_config_t *c, int32_t token) {
    for (int i = 0; i < c->num_eos; i++)
        if (c->eos_ids[i] == token) return 1;
    return 0;
}

static finish_reason_t finish_reason(const scheduler_config_t *c, const sequence_t *q) {
    int32_t last = q->tokens[q->num_tokens - 1];
    if (!q->params.ignore_eos && is_eos(c, last)) return FINISH_EOS;
    if (sequence_num_generated(q) >= q->params.max_tokens) return FINISH_MAX_TOKENS;
    if (q->num_tokens >= c->max_model_len) return FINISH_MAX_MODEL_LEN;
    return FINISH_NONE;
}

int scheduler_postprocess(scheduler_t *s, const int32_t *sampled) {
    if (!s->step_in_flight)
        return mv_error("scheduler_postprocess: no step is in flight");
    sched_step_t *st = &s->steps[s->cur];
    for (int k = 0; k < st->num_sample; k++) {
        sequence_t *q = st->seqs[st->sample_rows[k]];
        if (sequence_append(q, sampled[k])) return -1;
        q->finish_reason = finish_reason(&s->cfg, q);
        if (q->finish_reason != FINISH_NONE) q->status = SEQ_FINISHED;
    }
    // The step planned ahead: its input ids are known now, its full blocks
    // can be hashed, and the rows of sequences that just ended go.
    if (s->ahead_planned) {
        sched_step_t *ah = &s->steps[s->cur ^ 1];
        int dropped = 0;
        for (int r = 0; r < ah->num_seqs; r++) {
            sequence_t *q = ah->seqs[r];
            if (q->status == SEQ_FINISHED) {
                ah->seqs[r] = NULL;
                dropped = 1;
                continue;
            }
            ah->input_ids[r] = q->tokens[q->num_tokens - 1];
            bm_commit_full_blocks(&s->bm, q, q->num_computed_tokens);
        }
        if (dropped) drop_rows(ah);
    }
    // Drop the finished from the running list, keeping admission order.
    int kept = 0;
    for (int i = 0; i < s->num_running; i++) {
        sequence_t *q = s->running[i];
        if (q->status != SEQ_FINISHED) {
            s->running[kept++] = q;
            continue;
        }
        bm_release(&s->bm, q);
        if (reserve(&s->finished, &s->cap_finished, s->num_finished + 1)) return -1;
        s->finished[s->num_finished++] = q;
    }
    s->num_running = kept;
    if (s->ahead_planned) {
        s->cur ^= 1;  // the step planned ahead is the one in flight now
        s->ahead_planned = 0;
    } else {
        s->step_in_flight = 0;
    }
    return 0;
}

// ---- invariants -------------------------------------------------------------------------------

static int check_running_seq(const scheduler_t *s, const sequence_t *q, int32_t *owners,
                             int64_t *last_owner) {
    const block_manager_t *bm = &s->bm;
    int bs = s->cfg.block_size;
    long long id = (long long)q->id;
    if (q->status != SEQ_RUNNING) return mv_error("sequence %lld is in the running list but %s", id, seq_status_name(q->status));
    // Between steps the last token is not computed yet; while a step
    // planned ahead is in flight, it is (that step computes it).
    const int ahead = s->step_in_flight && s->steps[s->cur].planned_ahead;
    if (q->num_computed_tokens < 0 || q->num_computed_tokens > q->num_tokens - !ahead)
        return mv_error("sequence %lld: %d computed of %d tokens (must leave the last one)", id,
                        q->num_computed_tokens, q->num_tokens);
    // Blocks for every token but the newest sampled one (the next step adds
    // its block), and none past the tokens it has.
    if (q->num_blocks < blocks_for_tokens(q->num_tokens - 1, bs) ||
        q->num_blocks > blocks_for_tokens(q->num_tokens, bs))
        return mv_error("sequence %lld holds %d blocks for %d tokens", id, q->num_blocks, q->num_tokens);
    if (q->num_cached_tokens % bs || q->num_cached_tokens > q->num_tokens)
        return mv_error("sequence %lld: %d cached tokens is not a count of full blocks", id,
                        q->num_cached_tokens);
    for (int j = 0; j < q->num_blocks; j++) {
        int32_t b = q->block_table[j];
        if (b < 0 || b >= bm->num_blocks) return mv_error("sequence %lld: block id %d out of range", id, b);
        if (last_owner[b] == q->id) return mv_error("sequence %lld holds block %d twice", id, b);
        last_owner[b] = q->id;
        owners[b]++;
    }
    if (bm->enable_prefix_caching && q->num_hashed_blocks < q->num_computed_tokens / bs)
        return mv_error("sequence %lld: %d computed tokens but only %d blocks hashed", id,
                        q->num_computed_tokens, q->num_hashed_blocks);
    uint64_t parent = PREFIX_HASH_SEED;
    for (int j = 0; j < q->num_hashed_blocks; j++) {
        const kv_block_t *b = &bm->blocks[q->block_table[j]];
        const int32_t *tok = q->tokens + (size_t)j * bs;
        if (!b->hashed || b->parent_hash != parent || b->hash != bm_hash_block(parent, tok, bs) ||
            memcmp(bm->block_tokens + (size_t)q->block_table[j] * bs, tok, (size_t)bs * sizeof(int32_t)))
            return mv_error("sequence %lld: block %d (id %d) does not hold its tokens' hash", id, j,
                            q->block_table[j]);
        parent = b->hash;
    }
    return 0;
}

int scheduler_check_invariants(const scheduler_t *s) {
    const block_manager_t *bm = &s->bm;
    if (bm_check(bm)) return -1;
    if (s->num_running > s->cfg.max_num_seqs)
        return mv_error("%d sequences running, max_num_seqs is %d", s->num_running, s->cfg.max_num_seqs);
    int32_t *owners = calloc((size_t)bm->num_blocks, sizeof(int32_t));
    int64_t *last_owner = malloc((size_t)bm->num_blocks * sizeof(int64_t));
    if (!owners || !last_owner) {
        free(owners);
        free(last_owner);
        return mv_error("scheduler_check_invariants: out of memory");
    }
    for (int b = 0; b < bm->num_blocks; b++) last_owner[b] = -1;
    int rc = 0;
    for (int i = 0; i < s->num_running && !rc; i++)
        rc = check_running_seq(s, s->running[i], owners, last_owner);
    for (int i = 0; i < s->num_waiting && !rc; i++) {
        const sequence_t *q = s->waiting[i];
        if (q->status != SEQ_WAITING || q->num_blocks || q->num_computed_tokens)
            rc = mv_error("waiting sequence %lld is %s with %d blocks and %d computed tokens",
                          (long long)q->id, seq_status_name(q->status), q->num_blocks,
                          q->num_computed_tokens);
    }
    for (int b = 0; b < bm->num_blocks && !rc; b++)
        if (owners[b] != bm->blocks[b].ref_count)
            rc = mv_error("block %d has reference count %d but %d running sequences hold it", b,
                          bm->blocks[b].ref_count, owners[b]);
    free(owners);
    free(last_owner);
    return rc;
}

static int check_row(const scheduler_t *s, const sched_step_t *st, int r, uint8_t *written) {
    const sequence_t *q = st->seqs[r];
    int bs = s->cfg.block_size;
    int q0 = st->cu_seqlens_q[r], q_len = st->cu_seqlens_q[r + 1] - q0;
    int ctx = st->context_lens[r];
    if (q_len < 1 || ctx < q_len || st->cu_seqlens_k[r + 1] - st->cu_seqlens_k[r] != ctx ||
        ctx > q->num_computed_tokens || ctx > s->cfg.max_model_len)
        return mv_error("step row %d: query length %d, context %d do not add up", r, q_len, ctx);
    const int32_t *row = st->block_tables + (size_t)r * st->max_blocks_per_seq;
    for (int j = 0; j < st->max_blocks_per_seq; j++)
        if (row[j] != (j < q->num_blocks ? q->block_table[j] : -1))
            return mv_error("step row %d: block table entry %d is %d", r, j, row[j]);
    for (int t = 0; t < q_len; t++) {
        int k = q0 + t, p = ctx - q_len + t;
        if (st->positions[k] != p || st->input_ids[k] != q->tokens[p])
            return mv_error("step row %d token %d: position %d / id %d, expected %d / %d", r, t,
                            st->positions[k], st->input_ids[k], p, q->tokens[p]);
        int32_t slot = st->slot_mapping[k];
        if (slot < 0) {
            if (p >= q->num_cached_tokens)
                return mv_error("step row %d: uncached position %d has no slot", r, p);
            continue;
        }
        int32_t b = row[p / bs];
        if (slot != b * bs + p % bs) return mv_error("step row %d: position %d -> slot %d, expected %d", r, p, slot, b * bs + p % bs);
        // Writing into a block that another sequence also holds would change
        // that sequence's cached K/V, unless this row fills the block in this
        // step and the other took it from the prefix cache in the same step
        // (admitted after this row: step_add_row registers a block once
        // it is full): then both hold the same tokens' K/V, written now.
        if (s->bm.blocks[b].ref_count != 1 && p / bs >= ctx / bs)
            return mv_error("step row %d writes into shared block %d (reference count %d)", r, b,
                            s->bm.blocks[b].ref_count);
        if (written[slot]++) return mv_error("slot %d is written twice in one step", slot);
    }
    return 0;
}

int scheduler_check_step(const scheduler_t *s, const sched_step_t *st) {
    const scheduler_config_t *c = &s->cfg;
    if (st->num_seqs > c->max_num_seqs || st->num_tokens > c->max_num_batched_tokens)
        return mv_error("step has %d rows and %d tokens, limits %d and %d", st->num_seqs,
                        st->num_tokens, c->max_num_seqs, c->max_num_batched_tokens);
    if (st->cu_seqlens_q[0] != 0 || st->cu_seqlens_k[0] != 0 ||
        st->cu_seqlens_q[st->num_seqs] != st->num_tokens)
        return mv_error("step: cu_seqlens do not start at 0 or end at num_tokens");
    uint8_t *written = calloc((size_t)s->bm.num_blocks * c->block_size, 1);
    if (!written) return mv_error("scheduler_check_step: out of memory");
    int rc = 0, k = 0;
    for (int r = 0; r < st->num_seqs && !rc; r++) {
        rc = check_row(s, st, r, written);
        const sequence_t *q = st->seqs[r];
        int sampled = k < st->num_sample && st->sample_rows[k] == r;
        if (!rc && sampled != (st->context_lens[r] == q->num_tokens))
            rc = mv_error("step row %d: sampled %d but context %d of %d tokens", r, sampled,
                          st->context_lens[r], q->num_tokens);
        if (!rc && sampled && st->sample_token_index[k] != st->cu_seqlens_q[r + 1] - 1)
            rc = mv_error("step row %d: sampled token index %d is not the row's last", r,
                          st->sample_token_index[k]);
        k += sampled;
    }
    if (!rc && k != st->num_sample) rc = mv_error("step: %d sample rows listed, %d found", st->num_sample, k);
    free(written);
    return rc;
}

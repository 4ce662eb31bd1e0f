/*
 * chapters/08-scheduler/sched/scheduler.h - continuous batching over a paged KV cache.
 *
 * Each call to scheduler_schedule() picks the work of one forward pass of the
 * model and writes it as a plain struct of flat int32 arrays (sched_step_t),
 * ready to copy to the GPU. The model runner (chapter 09) runs the pass,
 * samples one token for each row marked in the step, and hands the tokens
 * back with scheduler_postprocess(). Then the next step.
 *
 * The policy, step by step:
 *   1. Running sequences, in the order they were admitted. A sequence whose
 *      prompt is done decodes one token. A sequence still in its prompt takes
 *      the next chunk of it, as large as the token budget allows after one
 *      token is kept back for every running sequence behind it, so a long
 *      prompt never starves the decodes (chunked prefill). A sequence that
 *      needs a new block when none is free preempts the most recently
 *      admitted running sequence: its blocks are freed, it goes back to the
 *      front of the waiting queue and is recomputed later (its cached blocks
 *      may still be in the prefix cache by then).
 *   2. If nothing was preempted, waiting sequences are admitted in order
 *      (first come, first served) while there is a free row (max_num_seqs),
 *      token budget (max_num_batched_tokens) and free blocks for all their
 *      tokens. Their leading cached blocks come from the prefix cache; the
 *      rest of the prompt is prefilled, in chunks if the budget is short.
 *
 * Requests that can never run (empty prompt, longer than max_model_len,
 * max_tokens < 1, needing more blocks than the whole cache) are rejected
 * when added, with a reason; the others go on.
 *
 * Library code: returns 0 / -1 with mv_error(), never exits.
 * Tested by tests/test_scheduler.c; driven by build/08-scheduler.
 */
#ifndef MV_SCHEDULER_H
#define MV_SCHEDULER_H

#include <stdint.h>

#include "chapters/08-scheduler/sched/block_manager.h"
#include "chapters/08-scheduler/sched/sequence.h"

#ifdef __cplusplus
extern "C" {
#endif

#define SCHED_MAX_EOS 8

typedef struct {
    int max_num_seqs;            // rows per step (sequences in one forward pass)
    int max_num_batched_tokens;  // query tokens per step, >= max_num_seqs
    int max_model_len;           // prompt + generated tokens of one sequence
    int block_size;              // tokens per KV block
    int num_blocks;              // KV blocks in the pool
    int enable_prefix_caching;
    int32_t eos_ids[SCHED_MAX_EOS];  // generation_config.json's eos_token_id list
    int num_eos;
} scheduler_config_t;

// One forward pass, as the model runner consumes it. Rows are sequences;
// tokens are the query tokens of all rows, concatenated row after row.
// Every array is owned by the scheduler and valid until the next schedule.
typedef struct {
    int num_seqs;              // rows
    int num_tokens;            // query tokens in all rows
    int max_blocks_per_seq;    // width of block_tables: ceil(max_model_len / block_size)
    int max_seqlen_q, max_seqlen_k;
    int num_prefill_rows;      // rows with more than one query token or a cached prefix
    int num_sample;            // rows that produce a sampled token

    int32_t *input_ids;        // [num_tokens] token ids to run
    int32_t *positions;        // [num_tokens] position of each token in its sequence (RoPE)
    int32_t *cu_seqlens_q;     // [num_seqs + 1] prefix sums of query lengths
    int32_t *cu_seqlens_k;     // [num_seqs + 1] prefix sums of context lengths
    int32_t *slot_mapping;     // [num_tokens] where to write each token's K/V:
                               //   block_id * block_size + offset, -1 = already cached
    int32_t *block_tables;     // [num_seqs, max_blocks_per_seq] block ids, -1 padded
    int32_t *context_lens;     // [num_seqs] tokens whose K/V the row attends to (incl. its own)
    int32_t *sample_rows;      // [num_sample] rows whose last token's logits are sampled
    int32_t *sample_token_index;  // [num_sample] index into the tokens of that last token
    sequence_t **seqs;         // [num_seqs] the sequences (sampling params, ids)

    // what happened while scheduling (for statistics)
    int num_preempted;         // sequences preempted during this step
    int num_admitted;          // waiting sequences admitted during this step

    // Asynchronous scheduling (scheduler_schedule_ahead):
    int planned_ahead;         // 1: planned while the step before it was still running
    int32_t *input_from;       // [num_seqs] planned ahead: row r's input id is the token the step
                               //   before sampled at its sample index input_from[r]; input_ids[r]
                               //   holds it once that step is postprocessed
    int num_launched_sample;   // sampled rows when the step was planned: what the model runner
                               //   was given and returns ids for (rows dropped later do not change it)
    int32_t *launched_index;   // [num_sample] each sampled row's index among those
} sched_step_t;

// Why a request was rejected.
typedef enum {
    REQ_OK,
    REQ_EMPTY_PROMPT,
    REQ_PROMPT_TOO_LONG,     // more than max_model_len tokens
    REQ_BAD_PARAMS,          // max_tokens < 1, temperature < 0, top_p outside (0, 1], top_k < 0
    REQ_BAD_TOKEN,           // a negative token id
    REQ_NEVER_FITS,          // needs more KV blocks than the whole cache
} request_error_t;

const char *request_error_name(request_error_t e);

typedef struct {
    scheduler_config_t cfg;
    block_manager_t bm;
    sequence_t **waiting;      // [cap_waiting] FIFO; a preempted sequence goes to the front
    int num_waiting, cap_waiting;
    sequence_t **running;      // [max_num_seqs] in admission order
    int num_running;
    sequence_t **finished;     // [cap_finished] finished, not yet taken by the caller
    int num_finished, cap_finished;
    sched_step_t steps[2];     // the step in flight and the one planned ahead of it (arrays sized
                               // for the worst case)
    int cur;                   // steps[cur]: the last scheduled step, or the one in flight
    int32_t *prefix_hits;      // [max_blocks_per_seq] scratch: cached blocks of the next admission
    int step_in_flight;        // 1 between schedule and postprocess
    int ahead_planned;         // 1 while steps[cur ^ 1] is planned ahead of steps[cur]
    int64_t next_id;
    // statistics
    long long num_steps, num_preemptions, num_rejected, num_aborted;
    long long num_prompt_tokens_admitted;  // tokens looked up in the prefix cache at admission
    long long num_cached_tokens_admitted;  // of those, found in the cache
    long long num_tokens_scheduled;        // query tokens over all steps
} scheduler_t;

int scheduler_init(scheduler_t *s, const scheduler_config_t *cfg);
void scheduler_free(scheduler_t *s);

// Add a request. On success returns 0 and its sequence id in *id. On a bad
// request returns -1, the reason in *err (may be NULL) and a sentence in
// mv_last_error(); the scheduler is unchanged and goes on with the others.
int scheduler_add_request(scheduler_t *s, const int32_t *prompt, int n, const sampling_params_t *p,
                          int64_t *id, request_error_t *err);
// The same, with the caller's pointer stored in the sequence (sequence_t.user).
int scheduler_add_request_user(scheduler_t *s, const int32_t *prompt, int n, const sampling_params_t *p,
                               void *user, int64_t *id, request_error_t *err);

// Take request `id` out now, between two steps (a server's client went
// away): a running sequence gives its blocks back at once (its full blocks
// stay in the prefix cache, unreferenced, as a finished one's do), a
// waiting one leaves the queue. It joins the finished list with
// FINISH_ABORTED and the tokens it had, for scheduler_pop_finished.
// While a decode step is in flight (asynchronous scheduling: the step
// planned ahead runs while the caller handles the one before), the
// request's row is dropped from that step: the runner still computes it,
// and its id is not wanted (launched_index maps the rest).
// 0 when aborted, 1 when no unfinished request has that id (it finished
// already), -1 with mv_error() while a step that is not a decode step is in
// flight, or while a step is planned ahead.
int scheduler_abort(scheduler_t *s, int64_t id);

// Plan the next step. *out points at the scheduler's step; num_seqs is 0
// only when there is nothing left to run. -1 if the previous step was not
// postprocessed yet.
int scheduler_schedule(scheduler_t *s, const sched_step_t **out);

// Feed back the sampled tokens of the last step: sampled[k] is the token of
// row step->sample_rows[k], k < num_sample. Appends them, finishes sequences
// (eos, max_tokens, max_model_len) and frees their blocks. When a step was
// planned ahead, it becomes the step in flight: its input ids are filled
// in, its rows whose sequence just finished are dropped (the runner's ids
// for them are not wanted), and step_in_flight stays 1.
int scheduler_postprocess(scheduler_t *s, const int32_t *sampled);

// Asynchronous scheduling (vLLM's --async-scheduling, SGLang's overlap
// scheduler): plan step n + 1 while step n is still running, so that the
// model runner can queue it behind step n on the GPU before step n's ids
// reach the host, and the GPU does not wait for the host between steps.
// Step n + 1 is the step scheduler_schedule would plan after step n if
// every sequence of it went on: each row decodes the token step n is
// sampling, whose id the runner takes from its own output of step n
// (input_from); rows whose sequence step n ends by length (max_tokens,
// max_model_len) are left out. Step n must be in flight and a decode step
// (every row one token, sampled), nothing may wait (an admission would
// change the step), and the new tokens' blocks must be free without a
// preemption. When a row's sequence does end at step n after all (an eos,
// a stop the caller applied before postprocess, an abort), its row is
// dropped when step n is postprocessed: the runner computed one token
// nobody reads, into the sequence's own block, which is freed only then.
// 0 with *out = the step; 1 when the step cannot be planned ahead now
// (nothing changed: postprocess step n and schedule as usual); -1 with
// mv_error() on misuse.
int scheduler_schedule_ahead(scheduler_t *s, const sched_step_t **out);

// Sequences waiting or running.
static inline int scheduler_num_unfinished(const scheduler_t *s) {
    return s->num_waiting + s->num_running;
}

// A finished sequence, now the caller's (free it with sequence_free), or NULL.
sequence_t *scheduler_pop_finished(scheduler_t *s);

// The invariants the chapter checks after every step: the block manager's
// own (bm_check), plus: each block's reference count equals the number of
// running sequences holding it, no sequence holds a block twice, waiting
// sequences hold nothing, every running sequence has the blocks its computed
// tokens need and the hashes of its full blocks match its tokens.
int scheduler_check_invariants(const scheduler_t *s);

// The last step is well formed: prefix sums, positions, every slot inside
// its row's blocks and written once, budgets respected.
int scheduler_check_step(const scheduler_t *s, const sched_step_t *st);

#ifdef __cplusplus
}
#endif
#endif

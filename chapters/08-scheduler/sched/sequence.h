/*
 * chapters/08-scheduler/sched/sequence.h - one request as the scheduler sees it.
 *
 * A sequence is a list of token ids (the prompt, then every token sampled so
 * far), where it stands (waiting, running, finished), the KV-cache blocks
 * that hold its keys and values (its block table), and how many of its
 * tokens already have their K/V in those blocks. Nothing here knows about
 * the model: Qwen3 only appears later, when chapter 09's model runner turns
 * a scheduled step into attention over these blocks.
 *
 * The scheduler (scheduler.h) owns the sequences it creates; a finished one
 * is handed to the caller, who frees it with sequence_free().
 *
 * Tested by tests/test_scheduler.c; driven by build/08-scheduler.
 */
#ifndef MV_SEQUENCE_H
#define MV_SEQUENCE_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    SEQ_WAITING,   // in the waiting queue: no blocks, nothing computed
    SEQ_RUNNING,   // admitted: holds blocks, takes part in steps
    SEQ_FINISHED,  // done: blocks given back, tokens kept for the caller
} seq_status_t;

typedef enum {
    FINISH_NONE,           // not finished
    FINISH_EOS,            // sampled one of the end-of-sequence ids
    FINISH_MAX_TOKENS,     // generated params.max_tokens tokens
    FINISH_MAX_MODEL_LEN,  // prompt + generated reached max_model_len
    FINISH_ABORTED,        // taken out by scheduler_abort (a client that went away)
} finish_reason_t;

// What the sampler needs (chapter 09 reads these) and when to stop.
typedef struct {
    float temperature;  // 0 = greedy
    int top_k;          // 0 = no top-k cut
    float top_p;        // 1 = no nucleus cut
    int max_tokens;     // at most this many generated tokens, >= 1
    int ignore_eos;     // 1: keep going after an eos id (benchmarks do this)
    // vLLM's other sampling options. A zeroed field is "off", so a struct
    // written with only the five fields above is the plain sampler.
    int min_tokens;            // eos and stop ids cannot be sampled before this many tokens (0 = off)
    float min_p;               // drop tokens less likely than min_p x the likeliest (0 = off)
    float presence_penalty;    // minus this for every id already generated (0 = off)
    float frequency_penalty;   // minus this times how often each id was generated (0 = off)
    float repetition_penalty;  // ids of the prompt or the output: a logit > 0 divided by it,
                               // else multiplied (1 = off; 0 is taken as 1, a zeroed struct)
    int logprobs;              // 1: each token's log-probability (of the raw logits) is returned
    int top_logprobs;          // with logprobs: also this many likeliest ids and theirs (0..20)
} sampling_params_t;

// Qwen3's generation_config.json defaults, with the given max_tokens.
sampling_params_t sampling_params_default(int max_tokens);

typedef struct {
    int64_t id;                    // assigned by the scheduler, in arrival order
    seq_status_t status;
    finish_reason_t finish_reason;
    sampling_params_t params;

    int32_t *tokens;               // [capacity]: prompt, then generated tokens
    int num_tokens;                // valid entries of tokens
    int num_prompt_tokens;
    int capacity;

    // KV state. Tokens [0, num_computed_tokens) have their K/V in the blocks;
    // the next step computes from num_computed_tokens on. A sequence always
    // has at least one token left to compute: the last one, whose logits give
    // the next sampled token.
    int num_computed_tokens;
    int num_cached_tokens;         // of those, found in the prefix cache when admitted
    int num_hashed_blocks;         // leading full blocks whose hash is registered

    int32_t *block_table;          // [max_blocks]: KV block ids, in token order
    int num_blocks;
    int max_blocks;                // ceil(max_model_len / block_size)

    int num_preemptions;           // times this sequence was preempted
    void *user;                    // the caller's, never read here (chapter 09 keeps its
                                   // per-request state there); NULL unless given
} sequence_t;

// A new waiting sequence holding a copy of prompt[n]; room for every token it
// may ever hold (n + max_tokens, capped at max_model_len + 1). NULL and
// mv_error() when out of memory.
sequence_t *sequence_create(int64_t id, const int32_t *prompt, int n, const sampling_params_t *p,
                            int max_model_len, int block_size);
void sequence_free(sequence_t *s);

// Append one sampled token; -1 when the sequence is already full.
int sequence_append(sequence_t *s, int32_t token);

static inline int sequence_num_generated(const sequence_t *s) {
    return s->num_tokens - s->num_prompt_tokens;
}

// Blocks needed to hold n tokens: ceil(n / block_size).
static inline int blocks_for_tokens(int n, int block_size) {
    return (n + block_size - 1) / block_size;
}

const char *seq_status_name(seq_status_t s);
const char *finish_reason_name(finish_reason_t r);

#ifdef __cplusplus
}
#endif
#endif

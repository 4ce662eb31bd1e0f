/* chapters/08-scheduler/sched/sequence.c - the request record declared in sequence.h. */
#include "chapters/08-scheduler/sched/sequence.h"

#include <stdlib.h>
#include <string.h>

#include "common/check.h"

sampling_params_t sampling_params_default(int max_tokens) {
    // Qwen3-0.6B's generation_config.json: temperature 0.6, top_k 20, top_p 0.95.
    sampling_params_t p = {.temperature = 0.6f, .top_k = 20, .top_p = 0.95f, .max_tokens = max_tokens, .ignore_eos = 0};
    return p;
}

sequence_t *sequence_create(int64_t id, const int32_t *prompt, int n, const sampling_params_t *p,
                            int max_model_len, int block_size) {
    sequence_t *s = calloc(1, sizeof *s);
    if (!s) {
        mv_error("sequence_create: out of memory");
        return NULL;
    }
    // A sequence stops once it holds max_model_len tokens, but a prompt of
    // exactly max_model_len still samples one token: hence the + 1.
    long cap = (long)n + p->max_tokens;
    if (cap > (long)max_model_len + 1) cap = (long)max_model_len + 1;
    s->capacity = (int)cap;
    s->max_blocks = blocks_for_tokens(max_model_len, block_size);
    s->tokens = malloc((size_t)s->capacity * sizeof(int32_t));
    s->block_table = malloc((size_t)s->max_blocks * sizeof(int32_t));
    if (!s->tokens || !s->block_table) {
        mv_error("sequence_create: out of memory for %d tokens", s->capacity);
        sequence_free(s);
        return NULL;
    }
    memcpy(s->tokens, prompt, (size_t)n * sizeof(int32_t));
    s->id = id;
    s->status = SEQ_WAITING;
    s->params = *p;
    s->num_tokens = s->num_prompt_tokens = n;
    return s;
}

void sequence_free(sequence_t *s) {
    if (!s) return;
    free(s->tokens);
    free(s->block_table);
    free(s);
}

int sequence_append(sequence_t *s, int32_t token) {
    if (s->num_tokens >= s->capacity)
        return mv_error("sequence %lld: no room for token %d (capacity %d)", (long long)s->id,
                        token, s->capacity);
    s->tokens[s->num_tokens++] = token;
    return 0;
}

const char *seq_status_name(seq_status_t s) {
    switch (s) {
    case SEQ_WAITING: return "waiting";
    case SEQ_RUNNING: return "running";
    case SEQ_FINISHED: return "finished";
    }
    return "?";
}

const char *finish_reason_name(finish_reason_t r) {
    switch (r) {
    case FINISH_NONE: return "none";
    case FINISH_EOS: return "eos";
    case FINISH_MAX_TOKENS: return "max_tokens";
    case FINISH_MAX_MODEL_LEN: return "max_model_len";
    case FINISH_ABORTED: return "aborted";
    }
    return "?";
}

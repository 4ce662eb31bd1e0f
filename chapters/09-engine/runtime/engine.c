/*
 * chapters/09-engine/runtime/engine.c - the engine loop (see engine.h).
 */
#include "chapters/09-engine/runtime/engine.h"

#include <stdint.h>
#include <stdio.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "chapters/09-engine/model/qwen3_weights.h"
#include "chapters/09-engine/runtime/sampler.h"
#include "common/check.h"
#include "reference/embedding.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

engine_config_t engine_config_default(const char *model_dir) {
    engine_config_t c = {0};
    c.model_dir = model_dir;
    c.device = RUNNER_DEVICE_CPU;
    c.enable_prefix_caching = 1;
    return c;
}

const char *engine_finish_reason(finish_reason_t r) {
    return r == FINISH_EOS ? "stop" : r == FINISH_ABORTED ? "abort" : "length";
}

const char *engine_output_finish_reason(const engine_output_t *o) {
    return o->error ? "error" : engine_finish_reason(o->finish_reason);
}

int engine_config_resolve(engine_config_t *c, const qwen3_config_t *m) {
    if (c->max_model_len < 0 || c->max_num_seqs < 0 || c->max_num_batched_tokens < 0 || c->block_size < 0 ||
        c->num_blocks < 0 || c->kv_cache_bytes < 0 || c->num_threads < 0 || c->tp_size < 0)
        return mv_error("engine: sizes must be >= 0 (0 = the default)");
    if (c->gpu_memory_utilization == 0) c->gpu_memory_utilization = 0.9f;
    if (!(c->gpu_memory_utilization > 0 && c->gpu_memory_utilization <= 1))
        return mv_error("engine: gpu_memory_utilization %g must be in (0, 1]", c->gpu_memory_utilization);
    if (c->max_model_len == 0) c->max_model_len = m->max_position_embeddings < 4096 ? m->max_position_embeddings : 4096;
    if (c->max_model_len > m->max_position_embeddings)
        return mv_error("engine: max_model_len %d is longer than the model's max_position_embeddings %d",
                        c->max_model_len, m->max_position_embeddings);
    // Default rows and token budget, by device (engine.h's table):
    //   cpu   16 rows, max(max_model_len, 512) tokens capped at 8192: a CPU
    //         step is slow per token, and 16 rows already fill its cores.
    //   cuda  256 rows and 8192 tokens, vLLM's defaults: a GPU step costs
    //         about the same for 16 rows as for 256 (decode is weight-bound),
    //         so rows are throughput. (nano-vllm uses 512 / 16384.)
    // A default never exceeds what was given: not more rows than tokens per
    // step (every row needs one token of the budget), nor than KV blocks
    // (every running row holds one), and not more tokens than all rows
    // full could use (rows x max_model_len).
    const int gpu = c->device == RUNNER_DEVICE_CUDA;
    if (c->max_num_seqs == 0) {
        long long r = gpu ? ENGINE_CUDA_MAX_NUM_SEQS : ENGINE_CPU_MAX_NUM_SEQS;
        if (c->max_num_batched_tokens > 0 && c->max_num_batched_tokens < r) r = c->max_num_batched_tokens;
        if (c->num_blocks > 0 && c->num_blocks < r) r = c->num_blocks;
        c->max_num_seqs = (int)r;
    }
    if (c->max_num_batched_tokens == 0) {
        long long t;
        if (gpu) {
            t = ENGINE_CUDA_MAX_NUM_BATCHED_TOKENS;
            long long full = (long long)c->max_num_seqs * c->max_model_len;
            if (full < t) t = full;
        } else {
            t = c->max_model_len > 512 ? c->max_model_len : 512;
            if (t > 8192) t = 8192;
        }
        if (t < c->max_num_seqs) t = c->max_num_seqs;
        c->max_num_batched_tokens = (int)t;
    }
    if (c->block_size == 0) c->block_size = 16;
    // cuda without a KV budget: the runner sizes the cache from the GPU's
    // free memory once the weights are placed (num_blocks stays 0 until then).
    if (c->device == RUNNER_DEVICE_CUDA && c->kv_cache_bytes == 0) return 0;
    if (c->kv_cache_bytes == 0) c->kv_cache_bytes = 2LL << 30;
    const int per_seq = (c->max_model_len + c->block_size - 1) / c->block_size;
    if (c->num_blocks == 0) {
        // Enough for every row to reach max_model_len, if the budget allows:
        // on the CPU, memory is plentiful but not free.
        long long want = (long long)per_seq * c->max_num_seqs;
        long long fit = c->kv_cache_bytes / (long long)model_runner_block_bytes(m, c->block_size, c->device);
        long long nb = want < fit ? want : fit;
        if (nb < per_seq)
            return mv_error("engine: the KV cache budget (%lld bytes) holds %lld blocks of %d tokens, fewer than one "
                            "sequence of max_model_len %d needs (%d): lower --max-model-len, or raise --kv-cache-gib "
                            "or --num-blocks",
                            c->kv_cache_bytes, fit, c->block_size, c->max_model_len, per_seq);
        c->num_blocks = (int)nb;
    }
    return 0;
}

// The runner's sizes, as engine_create builds them from the resolved config.
static runner_config_t runner_config_from(const engine_config_t *c) {
    return (runner_config_t){.device = c->device,
                             .max_num_batched_tokens = c->max_num_batched_tokens,
                             .max_num_seqs = c->max_num_seqs,
                             .max_model_len = c->max_model_len,
                             .block_size = c->block_size,
                             .num_blocks = c->num_blocks,
                             .num_threads = c->num_threads,
                             .gpu_memory_utilization = c->gpu_memory_utilization,
                             .enforce_eager = c->enforce_eager,
                             .tp_size = c->tp_size};
}

int engine_memory_estimate(const engine_config_t *c, const qwen3_config_t *m, engine_memory_t *out) {
    *out = (engine_memory_t){0};
    runner_config_t rc = runner_config_from(c);
    if (model_runner_memory_estimate(m, &rc, &out->runner)) return -1;
    const int cpu = c->device == RUNNER_DEVICE_CPU;
    const size_t V = (size_t)m->vocab_size, Sm = (size_t)c->max_num_seqs;
    // engine_run's logits and the host sampler's scratch (sampling_scratch_t: one uint64 per id).
    if (cpu) out->engine_bytes = Sm * V * sizeof(float) + V * sizeof(uint64_t);
    // st_model_alloc starts every tensor 64-byte aligned: at most 64 bytes more per tensor.
    if (c->random_weights)
        out->random_weights_bytes = (size_t)qwen3_config_n_params(m) * sizeof(bf16_t) +
                                    64 * (3 + 15 * (size_t)m->num_hidden_layers);
    const runner_memory_t *r = &out->runner;
    out->host_bytes = out->engine_bytes + out->random_weights_bytes + r->rope_bytes + r->host_bytes;
    out->host_min_bytes = out->host_bytes;
    if (cpu) {
        const size_t per_seq = (size_t)(c->max_model_len + c->block_size - 1) / (size_t)c->block_size;
        const size_t kv_min = per_seq * model_runner_block_bytes(m, c->block_size, c->device);
        out->host_bytes += r->weight_bytes + r->kv_cache_bytes + r->scratch_bytes;
        out->host_min_bytes += r->weight_bytes + (kv_min < r->kv_cache_bytes ? kv_min : r->kv_cache_bytes) +
                               r->scratch_bytes;
    } else {
        out->device_bytes = r->weight_bytes + r->kv_cache_bytes + r->scratch_bytes;
    }
    return 0;
}

static double gib(size_t b) { return (double)b / (double)(1ull << 30); }

int engine_memory_check(const engine_memory_t *mem, const engine_config_t *c) {
    size_t avail;
    if (host_memory_available(&avail)) return -1;
    if (mem->host_min_bytes <= avail) return 0;
    const runner_memory_t *r = &mem->runner;
    const int cpu = c->device == RUNNER_DEVICE_CPU;
    char parts[512];
    int n = snprintf(parts, sizeof parts, "%s%.2f GiB", cpu ? "weights " : "conversion buffer ",
                     gib(cpu ? r->weight_bytes : r->host_bytes));
    if (cpu && n > 0 && (size_t)n < sizeof parts)
        n += snprintf(parts + n, sizeof parts - (size_t)n,
                      ", scratch %.2f GiB, KV cache of one %d-token sequence %.2f GiB (all %d blocks: %.2f GiB as "
                      "they fill)",
                      gib(r->scratch_bytes + mem->engine_bytes + r->rope_bytes), c->max_model_len,
                      gib(mem->host_min_bytes - mem->host_bytes + r->kv_cache_bytes), c->num_blocks,
                      gib(r->kv_cache_bytes));
    if (mem->random_weights_bytes && n > 0 && (size_t)n < sizeof parts)
        snprintf(parts + n, sizeof parts - (size_t)n, ", random weights %.2f GiB", gib(mem->random_weights_bytes));
    return mv_error("engine: loading %s on %s needs at least %zu bytes of host memory (%.2f GiB: %s), and %zu "
                    "bytes (%.2f GiB) are available (MemAvailable in /proc/meminfo, or the cgroup's limit): refused "
                    "before allocating; lower --max-num-batched-tokens, --max-num-seqs or --max-model-len, or use "
                    "a machine with more memory",
                    c->model_dir, model_runner_device_name(c->device), mem->host_min_bytes,
                    gib(mem->host_min_bytes), parts, avail, gib(avail));
}

void engine_free(engine_t *e) {
    if (!e) return;
    model_runner_free(e->runner);
    tokenizer_free(e->tokenizer);
    st_close(e->weights);
    free(e);
}

// The tokenizer is optional: a directory without tokenizer.json serves
// prompt_token_ids only. A tokenizer.json that is there but broken is an error.
static int load_tokenizer(engine_t *e) {
    char path[4096];
    snprintf(path, sizeof path, "%s/tokenizer.json", e->cfg.model_dir);
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    fclose(f);
    e->tokenizer = tokenizer_load(e->cfg.model_dir);
    if (!e->tokenizer) return -1;
    // Fewer ids than rows is normal (the embedding is padded to a round
    // size; those ids decode to no text). More would be ids the model can
    // never produce nor read: the tokenizer belongs to another model.
    if (tokenizer_n_ids(e->tokenizer) > e->model.vocab_size)
        return mv_error("%s: tokenizer.json has %d ids, more than config.json's vocab_size %d: the tokenizer "
                        "does not belong to this model",
                        e->cfg.model_dir, tokenizer_n_ids(e->tokenizer), e->model.vocab_size);
    return 0;
}

int engine_create(const engine_config_t *cfg, engine_t **out) {
    *out = NULL;
    engine_t *e = calloc(1, sizeof *e);
    if (!e) return mv_error("engine: out of memory");
    e->cfg = *cfg;
    if (qwen3_config_load(cfg->model_dir, &e->model) || engine_config_resolve(&e->cfg, &e->model))
        goto fail;
    engine_memory_t mem;
    if (engine_memory_estimate(&e->cfg, &e->model, &mem) || engine_memory_check(&mem, &e->cfg)) goto fail;
    if (cfg->random_weights ? qwen3_weights_random(&e->model, cfg->weights_seed, 0.02f, &e->weights)
                            : st_open(cfg->model_dir, &e->weights))
        goto fail;
    if (load_tokenizer(e)) goto fail;
    const engine_config_t *c = &e->cfg;
    runner_config_t rc = runner_config_from(c);
    if (model_runner_create(&e->model, e->weights, &rc, &e->runner)) goto fail;
    // The cuda runner may have sized the cache itself.
    e->cfg.num_blocks = e->runner->rc.num_blocks;
    if (cfg->progress)
        fprintf(stderr, "minivllm: %s backend: weights %.1f MiB, KV cache %.1f MiB (%d blocks of %d tokens), "
                        "scratch %.1f MiB (steps of up to %d tokens, %d rows: logits [%d, %d])\n",
                e->runner->backend->name, (double)e->runner->weight_bytes / (1 << 20),
                (double)e->runner->kv_cache_bytes / (1 << 20), e->cfg.num_blocks, c->block_size,
                (double)e->runner->scratch_bytes / (1 << 20), c->max_num_batched_tokens, c->max_num_seqs,
                c->max_num_seqs, e->model.vocab_size);
    if (cfg->progress && c->device == RUNNER_DEVICE_CUDA) {
        if (e->runner->num_graphs > 0)
            fprintf(stderr, "minivllm: decode CUDA graphs: %d batch sizes (1 to %d) captured in %.2f s, %.1f MiB\n",
                    e->runner->num_graphs, c->max_num_seqs, e->runner->graph_seconds,
                    (double)e->runner->graph_bytes / (1 << 20));
        else
            fprintf(stderr, "minivllm: decode CUDA graphs: off (--enforce-eager)\n");
        if (e->runner->num_graphs > 0 && e->runner->megakernel_rows > 0)
            fprintf(stderr, "minivllm: decode megakernel: steps of 1 to %d rows%s%s\n", e->runner->megakernel_rows,
                    e->runner->megakernel_why[0] ? "; not " : "", e->runner->megakernel_why);
        else if (e->runner->num_graphs > 0)
            fprintf(stderr, "minivllm: decode megakernel: off (%s)\n", e->runner->megakernel_why);
        if (e->runner->halves_rows > 0)
            fprintf(stderr, "minivllm: decode steps of %d to %d rows run as two halves at once\n",
                    e->runner->halves_rows, e->runner->halves_max_rows);
    }
    // The runner converted the weights into its own buffers. A mapped file
    // costs nothing to keep, but random weights are a second copy in memory.
    if (cfg->random_weights) {
        st_close(e->weights);
        e->weights = NULL;
    }
    scheduler_config_t *sc = &e->sched_cfg;
    *sc = (scheduler_config_t){c->max_num_seqs, c->max_num_batched_tokens, c->max_model_len, c->block_size,
                               c->num_blocks, c->enable_prefix_caching, {0}, 0};
    for (int i = 0; i < e->model.n_eos && i < SCHED_MAX_EOS; i++) sc->eos_ids[sc->num_eos++] = e->model.eos_token_ids[i];
    *out = e;
    return 0;
fail:
    engine_free(e);
    return -1;
}

void engine_outputs_free(engine_output_t *outputs, int n) {
    for (int i = 0; outputs && i < n; i++) {
        free(outputs[i].token_ids);
        free(outputs[i].error);
        free(outputs[i].text);
        free(outputs[i].stop_str);
        free(outputs[i].logprobs);
        outputs[i] = (engine_output_t){0};
    }
}

// The scheduler's step, as the runner takes it.
static runner_step_t runner_step_from(const sched_step_t *st) {
    return (runner_step_t){st->num_tokens,   st->num_seqs,     st->num_sample,   st->max_blocks_per_seq,
                           st->input_ids,    st->positions,    st->cu_seqlens_q, st->context_lens,
                           st->slot_mapping, st->block_tables, st->sample_token_index};
}

// ---- the engine core: requests added and aborted between steps -----------------------------

// One request inside the core, hung on its sequence (sequence_t.user) from
// engine_core_add until it is handed over in collect_finished.
typedef struct {
    void *user;                 // the caller's (engine_core_add)
    sampling_params_t params;   // as given: the sequence's own max_tokens may be cut to end it early
    uint64_t seed;              // keys this request's draws
    int32_t *stop_ids;          // [num_stop_ids] stop_token_ids, malloc'd (NULL when none)
    int num_stop_ids;
    int32_t stop_hit;           // the stop_token_ids entry that ended it, else -1
    stop_text_t *text;          // with stop strings: the decoded text they are checked on, else NULL
    char *failed;               // why it could not go on (set in the step it failed), else NULL
    double arrival_s, first_token_s;  // since the core began (first_token_s 0 until then)
    engine_logprob_t *lps;      // [lps_cap] with params.logprobs: lps[i] of generated token i
    int lps_cap;
} core_req_t;

struct engine_core {
    engine_t *e;
    engine_core_hooks_t hooks;
    scheduler_t sched;
    sampler_scratch_t sampler;   // the host's sampling scratch: when the host samples, or a row needs it
    int32_t *stop_ids;           // [num_eos + the longest stop_token_ids] a row's ids masked by min_tokens
    int stop_ids_cap;
    float *logits;     // [max_num_seqs, vocab] fp32: when the host samples or reads a row (on_logits)
    int32_t *sampled;  // [max_num_seqs]
    // Asynchronous scheduling (scheduler_schedule_ahead): on when the runner
    // has asynchronous steps and nothing asks for logits. inflight: the step
    // launched on the runner and not collected yet, between two calls of
    // engine_core_step a step planned ahead; raw: the runner's ids of it.
    int async;
    const sched_step_t *inflight;
    int32_t *raw;      // [max_num_seqs]
    // the sampled rows' parameters, for a runner that samples on its device
    float *temperature, *top_p;  // [max_num_seqs]
    int32_t *top_k;              // [max_num_seqs]
    uint64_t *seed;              // [max_num_seqs]
    int64_t *gen_index;          // [max_num_seqs]
    // vLLM's other options of the sampled rows, for the device (sampler_opts_row)
    sampling_opts_row_t *opts;   // [max_num_seqs]
    sampling_logprobs_t *lp;     // [max_num_seqs] the device's logprobs
    int32_t *opt_ids;            // [opt_ids_cap] the rows' penalty and min_tokens ids (grown as needed)
    int opt_ids_cap;
    double t0;                   // engine_core_create: every time in the outputs counts from here
    engine_core_stats_t st;      // the counters (engine_core_stats adds the scheduler's gauges)
};

static void core_req_free(core_req_t *r) {
    if (!r) return;
    free(r->stop_ids);
    free(r->failed);
    free(r->lps);
    if (r->text) stop_text_free(r->text);
    free(r->text);
    free(r);
}

double engine_core_now(const engine_core_t *c) { return now_s() - c->t0; }

int engine_core_create(engine_t *e, const engine_core_hooks_t *hooks, engine_core_t **out) {
    *out = NULL;
    engine_core_t *c = calloc(1, sizeof *c);
    if (!c) return mv_error("engine: out of memory");
    c->e = e;
    if (hooks) c->hooks = *hooks;
    c->t0 = now_s();
    int rc = scheduler_init(&c->sched, &e->sched_cfg);
    if (rc) {
        free(c);
        return -1;
    }
    const int on_device = model_runner_samples_on_device(e->runner);
    if (!on_device) rc = sampler_scratch_init(&c->sampler, e->model.vocab_size);
    const size_t Sm = (size_t)e->cfg.max_num_seqs;
    // Host logits [max_num_seqs, vocab] fp32 (256 x 151936 x 4 = 156 MB on
    // cuda's defaults): only when the host reads them, i.e. the host samples
    // or on_logits wants them. A runner that samples on its device returns ids.
    const int host_logits = !on_device || c->hooks.on_logits;
    c->logits = host_logits ? malloc(Sm * (size_t)e->model.vocab_size * sizeof(float)) : NULL;
    c->sampled = malloc(Sm * sizeof(int32_t));
    c->raw = malloc(Sm * sizeof(int32_t));
    c->async = !e->cfg.no_async_scheduling && model_runner_can_launch(e->runner) && !c->hooks.on_logits;
    c->temperature = malloc(Sm * sizeof(float));
    c->top_p = malloc(Sm * sizeof(float));
    c->top_k = malloc(Sm * sizeof(int32_t));
    c->seed = malloc(Sm * sizeof(uint64_t));
    c->gen_index = malloc(Sm * sizeof(int64_t));
    c->opts = malloc(Sm * sizeof *c->opts);
    c->lp = malloc(Sm * sizeof *c->lp);
    if (!rc && ((host_logits && !c->logits) || !c->sampled || !c->raw || !c->temperature || !c->top_p || !c->top_k ||
                !c->seed || !c->gen_index || !c->opts || !c->lp))
        rc = mv_error("engine: out of memory");
    if (rc) {
        engine_core_free(c);
        return -1;
    }
    *out = c;
    return 0;
}

// The requests the scheduler still holds own a core_req_t each.
static void free_held(sequence_t **seqs, int n) {
    for (int i = 0; i < n; i++) {
        core_req_free(seqs[i]->user);
        seqs[i]->user = NULL;
    }
}

static int collect_inflight(engine_core_t *c);

void engine_core_free(engine_core_t *c) {
    if (!c) return;
    // A step still on the runner (a step planned ahead, or one a failed
    // step left): wait for it, its ids unread.
    if (c->inflight) (void)collect_inflight(c);
    free_held(c->sched.waiting, c->sched.num_waiting);
    free_held(c->sched.running, c->sched.num_running);
    free_held(c->sched.finished, c->sched.num_finished);
    scheduler_free(&c->sched);
    sampler_scratch_free(&c->sampler);
    free(c->stop_ids);
    free(c->logits);
    free(c->sampled);
    free(c->raw);
    free(c->temperature), free(c->top_p), free(c->top_k), free(c->seed), free(c->gen_index);
    free(c->opts), free(c->lp), free(c->opt_ids);
    free(c);
}

int engine_core_add(engine_core_t *c, const engine_request_t *r, const engine_stop_t *stop, void *user,
                    int64_t *id) {
    static const engine_stop_t no_stop = {0};
    if (!stop) stop = &no_stop;
    const int V = c->e->model.vocab_size;
    if (r->num_prompt > 0 && embedding_validate_ids(r->prompt, r->num_prompt, V)) return -1;
    if (sampler_validate_params(&r->params)) return -1;
    if (stop->n < 0 || (stop->n > 0 && !stop->ids)) return mv_error("stop_token_ids: %d ids and no list", stop->n);
    if (stop->n > SAMPLER_MAX_STOP_IDS)
        return mv_error("stop_token_ids: %d ids, at most %d", stop->n, SAMPLER_MAX_STOP_IDS);
    for (int k = 0; k < stop->n; k++)
        if (stop->ids[k] < 0 || stop->ids[k] >= V)
            return mv_error("stop_token_ids[%d] = %d is outside the vocabulary [0, %d)", k, stop->ids[k], V);
    core_req_t *q = calloc(1, sizeof *q);
    if (!q) return mv_error("engine: out of memory");
    *q = (core_req_t){.user = user, .params = r->params, .seed = r->seed, .stop_hit = -1,
                      .arrival_s = engine_core_now(c)};
    if (stop->n > 0) {
        q->stop_ids = malloc((size_t)stop->n * sizeof(int32_t));
        if (!q->stop_ids) {
            core_req_free(q);
            return mv_error("engine: out of memory");
        }
        memcpy(q->stop_ids, stop->ids, (size_t)stop->n * sizeof(int32_t));
        q->num_stop_ids = stop->n;
    }
    if (stop->num_strs > 0) {
        const tokenizer_t *tok = c->e->tokenizer;
        int bad = !tok ? mv_error("stop strings need a tokenizer, and %s has no tokenizer.json", c->e->cfg.model_dir)
                       : !(q->text = calloc(1, sizeof *q->text)) ? mv_error("engine: out of memory")
                       : stop_text_init(q->text, tok, stop->strs, stop->num_strs, stop->include_str, !stop->keep_special);
        if (bad) {
            core_req_free(q);
            return -1;
        }
        q->text->min_tokens = r->params.min_tokens;
    }
    int64_t got;
    if (scheduler_add_request_user(&c->sched, r->prompt, r->num_prompt, &r->params, q, &got, NULL)) {
        core_req_free(q);
        return -1;
    }
    c->st.num_prompt_tokens += r->num_prompt;
    if (id) *id = got;
    return 0;
}

// Hand every finished sequence over to on_finished, as an engine_output_t.
static int collect_finished(engine_core_t *c) {
    sequence_t *q;
    while ((q = scheduler_pop_finished(&c->sched))) {
        core_req_t *r = q->user;
        engine_output_t o = {0};
        int g = sequence_num_generated(q);
        int rc = 0;
        if (!(o.token_ids = malloc((size_t)(g > 0 ? g : 1) * sizeof(int32_t)))) rc = mv_error("engine: out of memory");
        if (!rc) {
            if (r->failed) {
                o.error = r->failed;  // the output owns it now
                r->failed = NULL;
                g--;                  // the placeholder
                c->st.num_failed++;
            }
            memcpy(o.token_ids, q->tokens + q->num_prompt_tokens, (size_t)g * sizeof(int32_t));
            o.num_tokens = g;
            if (r->params.logprobs) {  // the output owns them now (lps[0, g) filled, one per token)
                o.logprobs = r->lps;
                r->lps = NULL;
                if (g > 0 && !o.logprobs) rc = mv_error("engine: request has no logprobs");
            }
            o.finish_reason = q->finish_reason;
            o.stop_token_id = -1;
            // A stop_token_ids entry cut max_tokens to end the request there: it
            // stopped, as vLLM says, and the id stays in token_ids as an eos does.
            if (r->stop_hit >= 0 && !o.error && q->finish_reason != FINISH_ABORTED) {
                if (q->finish_reason != FINISH_EOS) o.stop_token_id = r->stop_hit;
                o.finish_reason = FINISH_EOS;
            }
            o.num_prompt_tokens = q->num_prompt_tokens;
            o.num_cached_tokens = q->num_cached_tokens;
            o.arrival_s = r->arrival_s;
            o.first_token_s = r->first_token_s;
            o.finish_s = engine_core_now(c);
            if (r->text && !stop_text_finish(r->text)) {
                // The output takes the text over (cut at the stop, when one matched).
                o.text = r->text->text.data;
                o.text_len = r->text->text.len;
                r->text->text = (tok_bytes_t){0};
                const char *hit = stop_text_matched(r->text);
                if (hit && !o.error && q->finish_reason != FINISH_ABORTED) {
                    if (!(o.stop_str = strdup(hit))) rc = mv_error("engine: out of memory");
                    o.finish_reason = FINISH_EOS;  // "stop", whatever length it reached too
                }
            } else if (r->text) {
                rc = -1;
            }
            const tokenizer_t *tok = c->e->tokenizer;
            for (int k = 0; tok && k < g; k++) o.num_unknown_tokens += !tokenizer_knows_id(tok, o.token_ids[k]);
            c->st.num_unknown_tokens += o.num_unknown_tokens;
            o.done = 1;
            c->st.num_finished++;
            c->st.num_aborted += q->finish_reason == FINISH_ABORTED;
        }
        void *user = r->user;
        core_req_free(r);
        q->user = NULL;
        sequence_free(q);
        if (rc) {
            engine_outputs_free(&o, 1);
            return -1;
        }
        if (!c->hooks.on_finished) engine_outputs_free(&o, 1);
        else if (c->hooks.on_finished(c->hooks.ctx, user, &o)) return -1;
    }
    return 0;
}

static int drop_empty_inflight(engine_core_t *c);

int engine_core_abort(engine_core_t *c, int64_t id) {
    int rc = scheduler_abort(&c->sched, id);
    if (rc) return rc;
    return drop_empty_inflight(c) || collect_finished(c) ? -1 : 0;
}

int engine_core_num_unfinished(const engine_core_t *c) { return scheduler_num_unfinished(&c->sched); }

void engine_core_stats(const engine_core_t *c, engine_core_stats_t *out) {
    *out = c->st;
    out->num_running = c->sched.num_running;
    out->num_waiting = c->sched.num_waiting;
    out->num_blocks = c->sched.bm.num_blocks;
    out->num_free_blocks = c->sched.bm.num_free;
    out->num_prompt_tokens_looked_up = c->sched.num_prompt_tokens_admitted;
    out->num_cached_tokens = c->sched.num_cached_tokens_admitted;
    out->num_preemptions = c->sched.num_preemptions;
}

// A request that cannot go on: the scheduler has no "error" state, so the
// row gets a placeholder token and its max_tokens is capped at this token:
// the scheduler's own postprocess then finishes it and frees its blocks
// like any other (the placeholder is never computed, so it reaches no cache
// block), and collect_finished drops the placeholder and hands the error over.
static int fail_request(sequence_t *q, int32_t *sampled, const char *why) {
    core_req_t *r = q->user;
    if (!r->failed) {
        char msg[512];
        snprintf(msg, sizeof msg, "generated token %d: %s", sequence_num_generated(q), why);
        if (!(r->failed = strdup(msg))) return mv_error("engine: out of memory");
    }
    q->params.max_tokens = sequence_num_generated(q) + 1;
    *sampled = 0;
    return 0;
}

static int is_eos(const engine_core_t *c, int32_t token);

// The ids min_tokens masks for request r's next token (q has generated
// gen_index): its eos ids (unless ignore_eos) and its stop_token_ids, in
// c->stop_ids; none once it has min_tokens tokens.
static int row_stop_ids(engine_core_t *c, const core_req_t *r, int64_t gen_index, int *n_stop) {
    *n_stop = 0;
    if (gen_index >= r->params.min_tokens) return 0;
    const int need = c->e->sched_cfg.num_eos + r->num_stop_ids;
    if (need > c->stop_ids_cap) {
        int32_t *ids = realloc(c->stop_ids, (size_t)need * sizeof *ids);
        if (!ids) return mv_error("engine: out of memory");
        c->stop_ids = ids;
        c->stop_ids_cap = need;
    }
    for (int i = 0; !r->params.ignore_eos && i < c->e->sched_cfg.num_eos; i++)
        c->stop_ids[(*n_stop)++] = c->e->sched_cfg.eos_ids[i];
    for (int i = 0; i < r->num_stop_ids; i++) c->stop_ids[(*n_stop)++] = r->stop_ids[i];
    return 0;
}

// Where the logprobs of request r's token gen_index go (r->lps grown to hold it).
static engine_logprob_t *lp_slot(core_req_t *r, int64_t gen_index) {
    if (gen_index >= r->lps_cap) {
        const int cap = r->lps_cap ? 2 * r->lps_cap : 16;
        const int want = cap > gen_index ? cap : (int)gen_index + 1;
        engine_logprob_t *lps = realloc(r->lps, (size_t)want * sizeof *lps);
        if (!lps) {
            mv_error("engine: out of memory for logprobs");
            return NULL;
        }
        r->lps = lps;
        r->lps_cap = want;
    }
    return &r->lps[gen_index];
}

// Sample row k (sequence q) on the host from its logits: min_tokens, the
// penalties, min_p and logprobs included (sampler_sample_seq). The draw is
// keyed by (request seed, gen_index), as the device's: the same token.
// A failure ends this request only.
static int sample_row_on_host(engine_core_t *c, sequence_t *q, float *row, int32_t *out) {
    core_req_t *r = q->user;
    const int64_t gen_index = sequence_num_generated(q);
    int n_stop = 0;
    if (row_stop_ids(c, r, gen_index, &n_stop)) return -1;
    engine_logprob_t *lp = NULL;
    if (r->params.logprobs && !(lp = lp_slot(r, gen_index))) return -1;
    const sampler_seq_t seq = {q->tokens, q->num_prompt_tokens, q->num_tokens, c->stop_ids, n_stop};
    if (sampler_sample_seq(&c->sampler, row, &r->params, r->seed, &seq, out, lp))
        return fail_request(q, out, mv_last_error());
    return 0;
}

// Row k's options for the device (sampler_opts_row), its ids appended to c->opt_ids.
static int device_opts_row(engine_core_t *c, const sequence_t *q, int k, int *num_ids) {
    const core_req_t *r = q->user;
    int n_stop = 0;
    if (row_stop_ids(c, r, sequence_num_generated(q), &n_stop)) return -1;
    const int need = *num_ids + q->num_tokens + n_stop;
    if (need > c->opt_ids_cap) {
        const int cap = need > 2 * c->opt_ids_cap ? need : 2 * c->opt_ids_cap;
        int32_t *ids = realloc(c->opt_ids, (size_t)cap * sizeof *ids);
        if (!ids) return mv_error("engine: out of memory for the sampling options' ids");
        c->opt_ids = ids;
        c->opt_ids_cap = cap;
    }
    const sampler_seq_t seq = {q->tokens, q->num_prompt_tokens, q->num_tokens, c->stop_ids, n_stop};
    if (sampler_opts_row(&r->params, &seq, &c->opts[k], c->opt_ids, c->opt_ids_cap, num_ids)) return -1;
    return 0;
}

// The sampled rows' parameters for a runner that samples on its device.
// The key of a row's draw is (request seed, gen_index = tokens the request
// had generated); ahead: st was planned before the tokens of the step before
// it were appended (one more generated each). 1 when a row uses vLLM's other
// options at that token (sampler_uses_options), else 0.
static int row_params(engine_core_t *c, const sched_step_t *st, int ahead) {
    int any_opts = 0;
    for (int k = 0; k < st->num_sample; k++) {
        const sequence_t *q = st->seqs[st->sample_rows[k]];
        const core_req_t *r = q->user;
        c->temperature[k] = r->params.temperature;
        c->top_k[k] = r->params.top_k;
        c->top_p[k] = r->params.top_p;
        c->seed[k] = r->seed;
        c->gen_index[k] = sequence_num_generated(q) + ahead;
        any_opts |= sampler_uses_options(&r->params, c->gen_index[k]);
    }
    return any_opts;
}

// One step on a runner that samples on its device: the sampled rows'
// parameters go with the step, ids come back (and the logits when on_logits
// wants them). The key of a row's draw is (request seed, gen_index = tokens
// the request had generated), the same key the host path draws with. Rows
// that use vLLM's other options (sampler_uses_options) are sampled on the
// device too: their options and ids go with the step, their logprobs come
// back with the ids (kernels/sampling_opts.h), and no logits are copied.
static int step_on_device(engine_core_t *c, const sched_step_t *st) {
    const int V = c->e->model.vocab_size;
    const int any_opts = row_params(c, st, 0);
    int num_ids = 0;
    for (int k = 0; any_opts && k < st->num_sample; k++) {
        const sequence_t *q = st->seqs[st->sample_rows[k]];
        if (sampler_uses_options(&((const core_req_t *)q->user)->params, c->gen_index[k])) {
            if (device_opts_row(c, q, k, &num_ids)) return -1;
        } else {
            c->opts[k] = sampler_opts_off();
        }
    }
    runner_step_t in = runner_step_from(st);
    runner_sampling_t sp = {.temperature = c->temperature, .top_k = c->top_k, .top_p = c->top_p, .seed = c->seed,
                            .gen_index = c->gen_index};
    if (any_opts) sp.opts = c->opts, sp.opt_ids = c->opt_ids, sp.num_opt_ids = num_ids, sp.logprobs = c->lp;
    if (model_runner_step_sample(c->e->runner, &in, &sp, c->sampled, c->hooks.on_logits ? c->logits : NULL))
        return mv_error_prefix("step %lld", c->st.num_steps);
    for (int k = 0; k < st->num_sample; k++) {
        sequence_t *q = st->seqs[st->sample_rows[k]];
        core_req_t *r = q->user;
        float *row = c->logits ? c->logits + (size_t)k * V : NULL;
        if (c->hooks.on_logits) c->hooks.on_logits(c->hooks.ctx, r->user, sequence_num_generated(q), row, V);
        if (c->sampled[k] == RUNNER_ROW_FAILED) {
            if (fail_request(q, &c->sampled[k],
                             "the logits have no finite value (all NaN or -inf, or a +inf): the request cannot go on"))
                return -1;
        } else if (any_opts && r->params.logprobs && isnan(c->lp[k].lse)) {
            if (fail_request(q, &c->sampled[k], "logprobs: the logits have no finite largest value"))
                return -1;
        } else if (any_opts && r->params.logprobs) {
            engine_logprob_t *lp = lp_slot(r, c->gen_index[k]);
            if (!lp) return -1;
            sampler_logprob_from_gpu(&c->lp[k], lp);
        }
    }
    return 0;
}

// The host samples: each row keyed by (request seed, gen_index), as
// step_on_device keys the device's draw, so both backends draw the same.
static int sample_on_host(engine_core_t *c, const sched_step_t *st) {
    const int V = c->e->model.vocab_size;
    for (int k = 0; k < st->num_sample; k++) {
        sequence_t *q = st->seqs[st->sample_rows[k]];
        const core_req_t *r = q->user;
        float *row = c->logits + (size_t)k * V;
        if (c->hooks.on_logits) c->hooks.on_logits(c->hooks.ctx, r->user, sequence_num_generated(q), row, V);
        // The parameters were checked when the request was added: a
        // failure here is this row's logits, and ends this request only.
        if (sample_row_on_host(c, q, row, &c->sampled[k])) return -1;
    }
    return 0;
}

static int is_eos(const engine_core_t *c, int32_t token) {
    for (int i = 0; i < c->e->sched_cfg.num_eos; i++)
        if (c->e->sched_cfg.eos_ids[i] == token) return 1;
    return 0;
}

// Before postprocess: the first token's time, stop_token_ids and stop
// strings. A row that sampled one of its request's stop ids, or whose text
// now holds one of its stop strings, gets max_tokens cut to this token, so
// the scheduler finishes it in this postprocess and frees its blocks: no
// token is computed past a stop. An eos (that ends it) or a stop id has no
// text, as vLLM leaves theirs out.
static int before_postprocess(engine_core_t *c, const sched_step_t *st) {
    const double t = engine_core_now(c);
    for (int k = 0; k < st->num_sample; k++) {
        sequence_t *q = st->seqs[st->sample_rows[k]];
        core_req_t *r = q->user;
        if (sequence_num_generated(q) == 0) r->first_token_s = t;
        if (r->failed) continue;
        for (int j = 0; j < r->num_stop_ids; j++)
            if (c->sampled[k] == r->stop_ids[j]) {
                r->stop_hit = c->sampled[k];
                q->params.max_tokens = sequence_num_generated(q) + 1;
                break;
            }
        if (!r->text || r->stop_hit >= 0 || (!q->params.ignore_eos && is_eos(c, c->sampled[k]))) continue;
        const int hit = stop_text_push(r->text, c->sampled[k]);
        if (hit < 0) return -1;
        if (hit) q->params.max_tokens = sequence_num_generated(q) + 1;
    }
    return 0;
}

// ---- asynchronous scheduling ------------------------------------------------------------------
// While step n runs on the GPU, step n + 1 is planned (scheduler_schedule_ahead)
// and queued behind it, its input ids taken on the device from step n's
// output; then the host waits for step n's ids and postprocesses it. The GPU
// never waits for the host between two decode steps, and the host's work for
// step n (postprocessing, the hooks, the next plan) overlaps step n + 1 on
// the GPU. The tokens are the same: a row's draw is keyed by (seed,
// gen_index), whatever step computes it. A row whose request step n ends
// unforeseen (eos, a stop, an error) is computed once more and dropped.

// Step st's sampling parameters for the runner (row_params); 1 when every
// row can be launched (no options: those need the tokens), else 0.
static int async_params(engine_core_t *c, const sched_step_t *st, int ahead) { return !row_params(c, st, ahead); }

// Can the step after st, the step now in flight, go ahead? Only rows without
// options at their next token (checked before the scheduler commits to it).
static int ahead_allowed(const engine_core_t *c, const sched_step_t *st) {
    for (int k = 0; k < st->num_sample; k++) {
        const sequence_t *q = st->seqs[st->sample_rows[k]];
        if (sampler_uses_options(&((const core_req_t *)q->user)->params, sequence_num_generated(q) + 1)) return 0;
    }
    return 1;
}

// Step st on the runner, with the parameters async_params filled in.
static int launch(engine_core_t *c, const sched_step_t *st) {
    runner_step_t in = runner_step_from(st);
    runner_sampling_t sp = {.temperature = c->temperature, .top_k = c->top_k, .top_p = c->top_p, .seed = c->seed,
                            .gen_index = c->gen_index};
    if (model_runner_launch_sample(c->e->runner, &in, &sp, st->planned_ahead ? st->input_from : NULL))
        return mv_error_prefix("step %lld", c->st.num_steps + (st->planned_ahead ? 1 : 0));
    return 0;
}

// Wait for the step in flight; c->sampled[k] its id of sampled row k (the
// rows dropped while it ran are skipped through launched_index).
static int collect_inflight(engine_core_t *c) {
    const sched_step_t *st = c->inflight;
    c->inflight = NULL;
    if (model_runner_collect_sample(c->e->runner, c->raw, st->num_launched_sample))
        return mv_error_prefix("step %lld", c->st.num_steps);
    for (int k = 0; k < st->num_sample; k++) c->sampled[k] = c->raw[st->launched_index[k]];
    return 0;
}

// A step in flight whose every row was dropped (their requests ended):
// nothing to postprocess but the scheduler's bookkeeping; wait for it now.
static int drop_empty_inflight(engine_core_t *c) {
    if (!c->inflight || c->inflight->num_seqs > 0) return 0;
    if (collect_inflight(c) || scheduler_postprocess(&c->sched, c->sampled)) return -1;
    c->st.num_steps++;
    return 0;
}

int engine_core_step(engine_core_t *c) {
    if (!c->inflight && scheduler_num_unfinished(&c->sched) == 0) return 0;
    engine_t *e = c->e;
    const sched_step_t *st = c->inflight;
    const double t_host = now_s();
    double t_run, t_post, plan_s = 0.0;  // plan_s: planning the next step, inside [t_run, t_post)
    if (!st) {
        if (scheduler_schedule(&c->sched, &st)) return -1;
        if (st->num_seqs == 0) return mv_error("engine: the scheduler has unfinished requests but scheduled nothing");
    }
    if (c->async && (c->inflight || async_params(c, st, 0))) {
        // Asynchronous: st launched (now, or as the step planned ahead by
        // the call before); the next step planned and launched behind it
        // when it can be; then st's ids.
        t_run = now_s();
        if (!c->inflight) {
            if (launch(c, st)) return -1;
            c->inflight = st;
        }
        const double t_plan = now_s();
        const sched_step_t *ahead = NULL;
        if (ahead_allowed(c, st)) {
            const int rc = scheduler_schedule_ahead(&c->sched, &ahead);
            if (rc < 0) return -1;
            if (rc == 1) ahead = NULL;
        }
        // async_params does not refuse it: ahead_allowed checked its rows at the same gen_index.
        if (ahead && !async_params(c, ahead, 1))
            return mv_error("engine: a step planned ahead has a row with sampling options");
        plan_s = now_s() - t_plan;
        if ((ahead && launch(c, ahead)) || collect_inflight(c)) return -1;
        c->st.num_steps_ahead += ahead != NULL;
        c->inflight = ahead;
        t_post = now_s();
        for (int k = 0; k < st->num_sample; k++) {
            if (c->sampled[k] != RUNNER_ROW_FAILED) continue;
            if (fail_request(st->seqs[st->sample_rows[k]], &c->sampled[k],
                             "the logits have no finite value (all NaN or -inf, or a +inf): the request cannot go on"))
                return -1;
        }
    } else {
        runner_step_t in = runner_step_from(st);
        t_run = now_s();
        const int on_device = model_runner_samples_on_device(e->runner);
        if (on_device) {
            if (step_on_device(c, st)) return -1;
        } else if (model_runner_step(e->runner, &in, c->logits)) {
            return mv_error_prefix("step %lld", c->st.num_steps);
        }
        t_post = now_s();
        if (!on_device && sample_on_host(c, st)) return -1;
    }
    c->st.host_s += t_run - t_host + plan_s;
    c->st.runner_s += t_post - t_run - plan_s;
    if (before_postprocess(c, st)) return -1;
    if (scheduler_postprocess(&c->sched, c->sampled)) return -1;
    c->st.num_steps++;
    c->st.num_generated_tokens += st->num_sample;
    // Each new token, before its request's on_finished (the finished
    // sequences are still alive in the scheduler's finished list here).
    for (int k = 0; c->hooks.on_token && k < st->num_sample; k++) {
        const sequence_t *q = st->seqs[st->sample_rows[k]];
        const core_req_t *r = q->user;
        const int stop = q->status == SEQ_FINISHED && (q->finish_reason == FINISH_EOS || r->stop_hit >= 0);
        const engine_logprob_t *lp = r->params.logprobs ? &r->lps[sequence_num_generated(q) - 1] : NULL;
        if (!r->failed) c->hooks.on_token(c->hooks.ctx, r->user, c->sampled[k], stop, lp);
    }
    int rc = collect_finished(c);
    if (!rc) rc = drop_empty_inflight(c);
    const double t_end = now_s();
    c->st.host_s += t_end - t_post;
    if (e->step_trace) {
        long long ctx = 0;
        for (int i = 0; i < st->num_seqs; i++) ctx += st->context_lens[i];
        fprintf(e->step_trace, "%d,%lld,%d,%d,%d,%lld,%d,%.1f,%.1f\n", e->step_trace_rep, c->st.num_steps - 1,
                st->num_seqs, st->num_prefill_rows, st->num_tokens, ctx, st->num_sample, 1e6 * (t_post - t_run - plan_s),
                1e6 * ((t_run - t_host) + plan_s + (t_end - t_post)));
    }
    return rc;
}

const char engine_step_trace_header[] =
    "rep,step,rows,prefill_rows,tokens,context_tokens,sampled,runner_us,host_us";

// ---- engine_run: a batch, all added at once, through the core ---------------------------------

typedef struct {
    engine_output_t *outputs;     // [n]
    int n;
    const engine_hooks_t *hooks;  // never NULL
} run_t;

static int run_on_finished(void *ctx, void *user, engine_output_t *o) {
    run_t *run = ctx;
    const intptr_t i = (intptr_t)user;
    if (i < 0 || i >= run->n) {
        engine_outputs_free(o, 1);
        return mv_error("engine: a finished request with unknown index %lld", (long long)i);
    }
    run->outputs[i] = *o;  // moved: outputs[i] owns the arrays now
    return run->hooks->on_finished ? run->hooks->on_finished(run->hooks->ctx, (int)i, &run->outputs[i]) : 0;
}

static void run_on_token(void *ctx, void *user, int32_t token, int stop, const engine_logprob_t *lp) {
    const run_t *run = ctx;
    run->hooks->on_token(run->hooks->ctx, (int)(intptr_t)user, token, stop, lp);
}

static void run_on_logits(void *ctx, void *user, int gen_index, const float *logits, int vocab) {
    const run_t *run = ctx;
    run->hooks->on_logits(run->hooks->ctx, (int)(intptr_t)user, gen_index, logits, vocab);
}

int engine_run(engine_t *e, const engine_request_t *reqs, int n, engine_output_t *outputs,
               const engine_hooks_t *hooks) {
    return engine_run_stops(e, reqs, NULL, n, outputs, hooks);
}

int engine_run_stops(engine_t *e, const engine_request_t *reqs, const engine_stop_t *stops, int n,
                     engine_output_t *outputs, const engine_hooks_t *hooks) {
    static const engine_hooks_t no_hooks = {0};
    if (n < 0) return mv_error("engine: n must be >= 0");
    for (int i = 0; i < n; i++) outputs[i] = (engine_output_t){0};
    e->failed_request = -1;
    e->stopped = 0;
    run_t run = {outputs, n, hooks ? hooks : &no_hooks};
    const engine_core_hooks_t ch = {.on_token = run.hooks->on_token ? run_on_token : NULL,
                                    .on_finished = run_on_finished,
                                    .on_logits = run.hooks->on_logits ? run_on_logits : NULL,
                                    .ctx = &run};
    engine_core_t *c;
    if (engine_core_create(e, &ch, &c)) return -1;
    int rc = 0;
    // Every request is checked and added before anything runs: a bad one fails the call.
    for (int i = 0; i < n && !rc; i++) {
        if (engine_core_add(c, &reqs[i], stops ? &stops[i] : NULL, (void *)(intptr_t)i, NULL)) {
            e->failed_request = i;
            rc = mv_error_prefix("request %lld", (long long)i);
        }
    }
    while (!rc && engine_core_num_unfinished(c) > 0) {
        if (engine_core_step(c)) {
            rc = -1;
            break;
        }
        if (e->cfg.progress)
            fprintf(stderr, "\rminivllm: step %lld, %d/%d requests done, %lld tokens generated", c->st.num_steps,
                    n - engine_core_num_unfinished(c), n, c->st.num_generated_tokens);
        // Between two steps nothing is half done: stop here when asked.
        if (run.hooks->stop && *run.hooks->stop && engine_core_num_unfinished(c) > 0) {
            e->stopped = 1;
            rc = ENGINE_STOPPED;
        }
    }
    if (e->cfg.progress && n > 0) fprintf(stderr, "\n");
    for (int i = 0; !rc && i < n; i++)
        if (!outputs[i].done) rc = mv_error("engine: request %d never finished", i);
    engine_core_stats_t s;
    engine_core_stats(c, &s);
    e->num_steps = s.num_steps;
    e->num_prompt_tokens = s.num_prompt_tokens;
    e->num_generated_tokens = s.num_generated_tokens;
    e->num_cached_tokens = s.num_cached_tokens;
    e->num_preemptions = s.num_preemptions;
    e->num_finished = (int)s.num_finished;
    e->num_failed = (int)s.num_failed;
    e->num_unknown_tokens = s.num_unknown_tokens;
    e->host_s = s.host_s;
    e->runner_s = s.runner_s;
    e->num_steps_ahead = s.num_steps_ahead;
    e->elapsed_s = engine_core_now(c);
    if (rc < 0) engine_outputs_free(outputs, n);
    engine_core_free(c);
    return rc;
}

int engine_generate(engine_t *e, const engine_request_t *reqs, int n, engine_output_t *outputs,
                    engine_logits_fn on_logits, void *ctx) {
    const engine_hooks_t hooks = {.on_logits = on_logits, .ctx = ctx};
    return engine_run(e, reqs, n, outputs, &hooks);
}

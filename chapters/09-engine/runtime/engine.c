/*
 * chapters/09-engine/runtime/engine.c - the engine loop (see engine.h).
 */
#include "chapters/09-engine/runtime/engine.h"

#include <stdio.h>
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

const char *engine_finish_reason(finish_reason_t r) { return r == FINISH_EOS ? "stop" : "length"; }

const char *engine_output_finish_reason(const engine_output_t *o) {
    return o->error ? "error" : engine_finish_reason(o->finish_reason);
}

int engine_config_resolve(engine_config_t *c, const qwen3_config_t *m) {
    if (c->max_model_len < 0 || c->max_num_seqs < 0 || c->max_num_batched_tokens < 0 || c->block_size < 0 ||
        c->num_blocks < 0 || c->kv_cache_bytes < 0 || c->num_threads < 0)
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
                             .enforce_eager = c->enforce_eager};
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
        outputs[i] = (engine_output_t){0};
    }
}

// The scheduler's step, as the runner takes it.
static runner_step_t runner_step_from(const sched_step_t *st) {
    return (runner_step_t){st->num_tokens,   st->num_seqs,     st->num_sample,   st->max_blocks_per_seq,
                           st->input_ids,    st->positions,    st->cu_seqlens_q, st->context_lens,
                           st->slot_mapping, st->block_tables, st->sample_token_index};
}

typedef struct {
    scheduler_t sched;
    sampling_scratch_t sampler;  // the host's sampling scratch, when the host samples
    float *logits;     // [max_num_seqs, vocab]
    int32_t *sampled;  // [max_num_seqs]
    // the sampled rows' parameters, for a runner that samples on its device
    float *temperature, *top_p;  // [max_num_seqs]
    int32_t *top_k;              // [max_num_seqs]
    uint64_t *seed;              // [max_num_seqs]
    int64_t *gen_index;          // [max_num_seqs]
    int64_t first_id;  // the scheduler id of request 0 (ids are consecutive)
    double t0;         // when engine_generate began: the outputs' times count from here
    const engine_hooks_t *hooks;  // never NULL (engine_run puts empty hooks there)
    char **failed;     // [n] why request i could not go on, set in the step it failed, else NULL
} run_t;

static int add_all(engine_t *e, run_t *run, const engine_request_t *reqs, int n) {
    for (int i = 0; i < n; i++) {
        const engine_request_t *r = &reqs[i];
        int64_t id;
        e->failed_request = i;
        if (r->num_prompt > 0 && embedding_validate_ids(r->prompt, r->num_prompt, e->model.vocab_size))
            return mv_error_prefix("request %lld", (long long)i);
        if (scheduler_add_request(&run->sched, r->prompt, r->num_prompt, &r->params, &id, NULL))
            return mv_error_prefix("request %lld", (long long)i);
        e->failed_request = -1;
        if (i == 0) run->first_id = id;
        if (id != run->first_id + i) return mv_error("engine: the scheduler's ids are not consecutive");
    }
    return 0;
}

// A request that cannot go on: the scheduler has no "abort", so the row
// gets a placeholder token and its max_tokens is capped at this token: the
// scheduler's own postprocess then finishes it and frees its blocks like any
// other (the placeholder is never computed, so it reaches no cache block),
// and collect_finished drops the placeholder and hands the error over.
static int fail_request(run_t *run, sequence_t *q, int32_t *sampled, const char *why) {
    const int64_t i = q->id - run->first_id;
    if (!run->failed[i]) {
        char msg[512];
        snprintf(msg, sizeof msg, "generated token %d: %s", sequence_num_generated(q), why);
        if (!(run->failed[i] = strdup(msg))) return mv_error("engine: out of memory");
    }
    q->params.max_tokens = sequence_num_generated(q) + 1;
    *sampled = 0;
    return 0;
}

static int collect_finished(engine_t *e, run_t *run, int n, engine_output_t *outputs) {
    sequence_t *q;
    while ((q = scheduler_pop_finished(&run->sched))) {
        int64_t i = q->id - run->first_id;
        int g = sequence_num_generated(q);
        int rc = 0;
        if (i < 0 || i >= n) rc = mv_error("engine: a finished sequence with unknown id %lld", (long long)q->id);
        else if (!(outputs[i].token_ids = malloc((size_t)(g > 0 ? g : 1) * sizeof(int32_t))))
            rc = mv_error("engine: out of memory");
        if (!rc) {
            engine_output_t *o = &outputs[i];
            if (run->failed[i]) {
                o->error = run->failed[i];  // the output owns it now
                run->failed[i] = NULL;
                g--;                        // the placeholder
                e->num_failed++;
            }
            memcpy(o->token_ids, q->tokens + q->num_prompt_tokens, (size_t)g * sizeof(int32_t));
            o->num_tokens = g;
            o->finish_reason = q->finish_reason;
            o->finish_s = now_s() - run->t0;
            for (int k = 0; e->tokenizer && k < g; k++)
                o->num_unknown_tokens += !tokenizer_knows_id(e->tokenizer, o->token_ids[k]);
            e->num_unknown_tokens += o->num_unknown_tokens;
            o->done = 1;
            e->num_finished++;
        }
        sequence_free(q);
        if (rc) return -1;
        if (run->hooks->on_finished && run->hooks->on_finished(run->hooks->ctx, (int)i, &outputs[i])) return -1;
    }
    return 0;
}

// One step on a runner that samples on its device: the sampled rows'
// parameters go with the step, ids come back (and the logits when on_logits
// wants them). The key of a row's draw is (request seed, gen_index = tokens
// the request had generated), the same key the host path draws with.
static int step_on_device(engine_t *e, run_t *run, const engine_request_t *reqs, const sched_step_t *st,
                          engine_logits_fn on_logits, void *ctx) {
    const int V = e->model.vocab_size;
    for (int k = 0; k < st->num_sample; k++) {
        const sequence_t *q = st->seqs[st->sample_rows[k]];
        const int i = (int)(q->id - run->first_id);
        const sampling_params_t *p = &reqs[i].params;
        // The scheduler checked these when the request was added.
        if (sampler_validate_params(p)) {
            e->failed_request = i;
            return mv_error_prefix("request %lld", (long long)i);
        }
        run->temperature[k] = p->temperature;
        run->top_k[k] = p->top_k;
        run->top_p[k] = p->top_p;
        run->seed[k] = reqs[i].seed;
        run->gen_index[k] = sequence_num_generated(q);
    }
    runner_step_t in = runner_step_from(st);
    runner_sampling_t sp = {run->temperature, run->top_k, run->top_p, run->seed, run->gen_index};
    if (model_runner_step_sample(e->runner, &in, &sp, run->sampled, on_logits ? run->logits : NULL))
        return mv_error_prefix("step %lld", (long long)e->num_steps);
    for (int k = 0; k < st->num_sample; k++) {
        sequence_t *q = st->seqs[st->sample_rows[k]];
        if (on_logits)
            on_logits(ctx, (int)(q->id - run->first_id), sequence_num_generated(q), run->logits + (size_t)k * V, V);
        if (run->sampled[k] == RUNNER_ROW_FAILED &&
            fail_request(run, q, &run->sampled[k],
                         "the logits have no finite value (all NaN or -inf, or a +inf): the request cannot go on"))
            return -1;
    }
    return 0;
}

// The sampled rows that had generated nothing before this step: their first
// token is on the host now (before postprocess appends it).
static void stamp_first_tokens(const run_t *run, const sched_step_t *st, engine_output_t *outputs) {
    for (int k = 0; k < st->num_sample; k++) {
        const sequence_t *q = st->seqs[st->sample_rows[k]];
        if (sequence_num_generated(q) == 0) outputs[q->id - run->first_id].first_token_s = now_s() - run->t0;
    }
}

static int run_steps(engine_t *e, run_t *run, const engine_request_t *reqs, int n, engine_output_t *outputs) {
    const engine_logits_fn on_logits = run->hooks->on_logits;
    void *ctx = run->hooks->ctx;
    const int V = e->model.vocab_size;
    const int on_device = model_runner_samples_on_device(e->runner);
    int done = 0;
    while (scheduler_num_unfinished(&run->sched) > 0) {
        const sched_step_t *st;
        const double t_host = now_s();
        if (scheduler_schedule(&run->sched, &st)) return -1;
        if (st->num_seqs == 0) return mv_error("engine: the scheduler has unfinished requests but scheduled nothing");
        runner_step_t in = runner_step_from(st);
        const double t_run = now_s();
        e->host_s += t_run - t_host;
        if (on_device) {
            if (step_on_device(e, run, reqs, st, on_logits, ctx)) return -1;
        } else if (model_runner_step(e->runner, &in, run->logits)) {
            return mv_error_prefix("step %lld", (long long)e->num_steps);
        }
        const double t_post = now_s();
        e->runner_s += t_post - t_run;
        // The host samples: each row keyed by (request seed, gen_index), as
        // step_on_device keys the device's draw, so both backends draw the same.
        for (int k = 0; !on_device && k < st->num_sample; k++) {
            sequence_t *q = st->seqs[st->sample_rows[k]];
            const int i = (int)(q->id - run->first_id);
            const float *row = run->logits + (size_t)k * V;
            const int64_t gen_index = sequence_num_generated(q);
            if (on_logits) on_logits(ctx, i, (int)gen_index, row, V);
            // The parameters were checked when the request was added: a
            // failure here is this row's logits, and ends this request only.
            if (sampler_sample(&run->sampler, row, &reqs[i].params, reqs[i].seed, gen_index, &run->sampled[k]) &&
                fail_request(run, q, &run->sampled[k], mv_last_error()))
                return -1;
        }
        stamp_first_tokens(run, st, outputs);
        if (scheduler_postprocess(&run->sched, run->sampled)) return -1;
        e->num_steps++;
        e->num_generated_tokens += st->num_sample;
        if (collect_finished(e, run, n, outputs)) return -1;
        e->host_s += now_s() - t_post;
        if (e->cfg.progress) {
            done = n - scheduler_num_unfinished(&run->sched);
            fprintf(stderr, "\rminivllm: step %lld, %d/%d requests done, %lld tokens generated", e->num_steps, done,
                    n, e->num_generated_tokens);
        }
        // Between two steps nothing is half done: stop here when asked.
        if (run->hooks->stop && *run->hooks->stop && scheduler_num_unfinished(&run->sched) > 0) {
            e->stopped = 1;
            break;
        }
    }
    if (e->cfg.progress) fprintf(stderr, "\n");
    return e->stopped ? ENGINE_STOPPED : 0;
}

int engine_run(engine_t *e, const engine_request_t *reqs, int n, engine_output_t *outputs,
               const engine_hooks_t *hooks) {
    static const engine_hooks_t no_hooks = {0};
    if (n < 0) return mv_error("engine: n must be >= 0");
    for (int i = 0; i < n; i++) outputs[i] = (engine_output_t){0};
    double t0 = now_s();
    e->num_steps = e->num_generated_tokens = e->num_prompt_tokens = e->num_unknown_tokens = 0;
    e->host_s = e->runner_s = 0;
    e->failed_request = -1;
    e->num_finished = e->num_failed = e->stopped = 0;
    run_t run = {.t0 = t0, .hooks = hooks ? hooks : &no_hooks};
    int rc = scheduler_init(&run.sched, &e->sched_cfg);
    if (rc) return -1;
    if (!model_runner_samples_on_device(e->runner)) rc = sampling_scratch_init(&run.sampler, e->model.vocab_size);
    const size_t Sm = (size_t)e->cfg.max_num_seqs;
    // Host logits [max_num_seqs, vocab] fp32 (256 x 151936 x 4 = 156 MB on
    // cuda's defaults): only when the host reads them, i.e. the host samples
    // or on_logits wants them. A runner that samples on its device returns ids.
    const int host_logits = !model_runner_samples_on_device(e->runner) || run.hooks->on_logits;
    run.logits = host_logits ? malloc(Sm * (size_t)e->model.vocab_size * sizeof(float)) : NULL;
    run.sampled = malloc(Sm * sizeof(int32_t));
    run.temperature = malloc(Sm * sizeof(float));
    run.top_p = malloc(Sm * sizeof(float));
    run.top_k = malloc(Sm * sizeof(int32_t));
    run.seed = malloc(Sm * sizeof(uint64_t));
    run.gen_index = malloc(Sm * sizeof(int64_t));
    run.failed = calloc((size_t)(n ? n : 1), sizeof *run.failed);
    if (!rc && ((host_logits && !run.logits) || !run.sampled || !run.temperature || !run.top_p || !run.top_k ||
                !run.seed || !run.gen_index || !run.failed))
        rc = mv_error("engine: out of memory");
    if (!rc) rc = add_all(e, &run, reqs, n);
    if (!rc) rc = run_steps(e, &run, reqs, n, outputs);
    for (int i = 0; rc >= 0 && i < n; i++) {
        e->num_prompt_tokens += reqs[i].num_prompt;
        if (!rc && !outputs[i].done) rc = mv_error("engine: request %d never finished", i);
    }
    e->num_cached_tokens = run.sched.num_cached_tokens_admitted;
    e->num_preemptions = run.sched.num_preemptions;
    if (rc < 0) engine_outputs_free(outputs, n);
    scheduler_free(&run.sched);
    sampling_scratch_free(&run.sampler);
    for (int i = 0; run.failed && i < n; i++) free(run.failed[i]);  // of requests that never finished
    free(run.failed);
    free(run.logits);
    free(run.sampled);
    free(run.temperature), free(run.top_p), free(run.top_k), free(run.seed), free(run.gen_index);
    e->elapsed_s = now_s() - t0;
    return rc;
}

int engine_generate(engine_t *e, const engine_request_t *reqs, int n, engine_output_t *outputs,
                    engine_logits_fn on_logits, void *ctx) {
    const engine_hooks_t hooks = {.on_logits = on_logits, .ctx = ctx};
    return engine_run(e, reqs, n, outputs, &hooks);
}

/*
 * chapters/09-engine/runtime/model_runner.c - the model runner's
 * device-independent half (see model_runner.h): picking a backend, checking
 * the runner's sizes and every step before a backend sees it, and the RoPE
 * cache both backends build from config.json. The backends live in
 * runner_cpu.c and runner_cuda.c; neither reaches into the other.
 */
#include "chapters/09-engine/runtime/model_runner.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "chapters/09-engine/model/qwen3_layout.h"
#include "chapters/09-engine/runtime/sampler.h"
#include "common/check.h"
#include "common/gpu.h"
#include "reference/attention.h"
#include "reference/embedding.h"
#include "reference/rope.h"

int model_runner_build_rope(rope_cache_t *rope, const qwen3_config_t *c, int max_model_len) {
    rope_config_t rc = {
        .head_dim = c->head_dim,
        .max_position = max_model_len,
        .theta = c->rope_theta,
        .scaling = c->rope_scaling.kind == QWEN3_ROPE_LLAMA3 ? ROPE_SCALING_LLAMA3 : ROPE_SCALING_NONE,
        .factor = c->rope_scaling.factor,
        .low_freq_factor = c->rope_scaling.low_freq_factor,
        .high_freq_factor = c->rope_scaling.high_freq_factor,
        .original_max_position = c->rope_scaling.original_max_position_embeddings,
    };
    return rope_cache_build(rope, &rc);
}


size_t model_runner_block_bytes(const qwen3_config_t *cfg, int block_size, runner_device_t device) {
    size_t elem = device == RUNNER_DEVICE_CPU ? sizeof(float) : sizeof(bf16_t);
    // K and V, every layer, block_size tokens of nkv heads of hd values.
    return 2 * (size_t)cfg->num_hidden_layers * (size_t)block_size * (size_t)cfg->num_key_value_heads *
           (size_t)cfg->head_dim * elem;
}

// ---- memory, before anything is allocated ------------------------------------------------------

// The buffers of runner_cpu.c's cpu_create, one term per buffer, in its
// order (weights, then per layer, then scratch): the CPU estimate is exact,
// and tests/test_engine_cpu.c holds it to what cpu_create reports. With
// tp_size > 1 it is one rank's share (every rank's is the same size: V, I
// and the query heads split evenly, the KV heads split or copied), and the
// scratch adds the LM head's logits of this rank and all ranks' gathered
// (fp32 on cpu, bf16 on cuda, whose full-vocabulary logits are rank 0's).
int model_runner_memory_estimate(const qwen3_config_t *c, const runner_config_t *rc, runner_memory_t *out) {
    *out = (runner_memory_t){0};
    const int tp = rc->tp_size > 1 ? rc->tp_size : 1;
    qwen3_layout_t lo;
    if (qwen3_layout_init(&lo, c, tp, 0)) return tp > 1 ? mv_error_prefix("--tensor-parallel-size %d", tp) : -1;
    const int cpu = rc->device == RUNNER_DEVICE_CPU;
    const size_t H = (size_t)c->hidden_size, V = (size_t)lo.vocab.local_rows, I = (size_t)lo.down.in_local;
    const size_t hd = (size_t)c->head_dim, L = (size_t)c->num_hidden_layers;
    const size_t qn = (size_t)lo.o_proj.in_local;
    const size_t qkv = (size_t)lo.qkv.rows, gate_up = (size_t)lo.gate_up.rows;
    const size_t b16 = sizeof(bf16_t), f32 = sizeof(float), norm = cpu ? f32 : b16;
    size_t w = V * H * b16 + (c->tie_word_embeddings ? 0 : V * H * b16) + H * norm;
    size_t layer = 2 * H * norm + 2 * hd * norm + (qkv * H + H * qn + gate_up * H + H * I) * b16;
    if (lo.qkv.has_bias) layer += (qkv + H) * b16;
    out->weight_bytes = w + L * layer;
    // This rank's KV heads only: the model's block bytes scaled to them.
    out->kv_cache_bytes = (size_t)rc->num_blocks * model_runner_block_bytes(c, rc->block_size, rc->device) /
                          (size_t)c->num_key_value_heads * (size_t)lo.qkv.tp.kv_heads_local;
    const size_t Tm = (size_t)rc->max_num_batched_tokens, Sm = (size_t)rc->max_num_seqs;
    if (cpu)
        out->scratch_bytes = Tm * (3 * H + qkv + 2 * qn + gate_up + I) * f32 + Sm * H * f32 + (Sm + 1) * sizeof(int32_t) +
                             (tp > 1 ? (1 + (size_t)tp) * Sm * V * f32 : 0);
    else  // the same activations in bf16, and the logits of every row in fp32: a lower bound for cuda
        out->scratch_bytes = Tm * (3 * H + qkv + 2 * qn + gate_up + I) * b16 + Sm * (size_t)c->vocab_size * f32 +
                             (tp > 1 ? (1 + (size_t)tp) * Sm * V * b16 : 0);
    out->rope_bytes = (size_t)rc->max_model_len * hd * f32;
    if (!cpu) {
        size_t largest = V * H;
        if (qkv * H > largest) largest = qkv * H;
        if (gate_up * H > largest) largest = gate_up * H;
        out->host_bytes = largest * b16;
    }
    return 0;
}

// A "key: value" number of a /proc or /sys file, or -1.
static long long read_number(const char *path, const char *key) {
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    char line[256];
    long long v = -1;
    size_t kn = key ? strlen(key) : 0;
    while (v < 0 && fgets(line, sizeof line, f)) {
        if (key && strncmp(line, key, kn) != 0) continue;
        char *end;
        long long x = strtoll(line + kn, &end, 10);
        if (end != line + kn) v = x;
        if (!key) break;
    }
    fclose(f);
    return v;
}

int host_memory_available(size_t *bytes) {
    long long avail = read_number("/proc/meminfo", "MemAvailable:");  // in kB
    if (avail >= 0) {
        avail *= 1024;
    } else {
        long pages = sysconf(_SC_AVPHYS_PAGES), page = sysconf(_SC_PAGESIZE);
        if (pages < 0 || page < 0) return mv_error("cannot tell how much memory is free (no /proc/meminfo)");
        avail = (long long)pages * page;
    }
    // cgroup v2: memory.max is "max" when unlimited (read_number gives -1 then).
    long long max = read_number("/sys/fs/cgroup/memory.max", NULL);
    long long cur = read_number("/sys/fs/cgroup/memory.current", NULL);
    if (max >= 0 && cur >= 0) {
        long long left = max > cur ? max - cur : 0;
        if (left < avail) avail = left;
    }
    *bytes = (size_t)avail;
    return 0;
}

const char *model_runner_device_name(runner_device_t device) { return device == RUNNER_DEVICE_CUDA ? "cuda" : "cpu"; }

int model_runner_device_available(runner_device_t device, char *why, size_t cap) {
    if (device == RUNNER_DEVICE_CPU) return 1;
#if MV_HAVE_CUDA
    gpu_info_t info;
    if (gpu_probe(&info, 0) == 0) return 1;
    snprintf(why, cap, "%s", info.why_not);
#else
    snprintf(why, cap, "this minivllm was built without CUDA (nvcc was not found, or NO_CUDA=1)");
#endif
    return 0;
}

runner_device_t model_runner_default_device(void) {
    char why[256];
    return model_runner_device_available(RUNNER_DEVICE_CUDA, why, sizeof why) ? RUNNER_DEVICE_CUDA : RUNNER_DEVICE_CPU;
}

static int validate_config(const runner_config_t *rc, const qwen3_config_t *c) {
    if (rc->max_num_seqs < 1 || rc->max_num_batched_tokens < rc->max_num_seqs)
        return mv_error("model runner: max_num_seqs (%d) must be >= 1 and <= max_num_batched_tokens (%d)",
                        rc->max_num_seqs, rc->max_num_batched_tokens);
    if (rc->max_model_len < 1 || rc->max_model_len > c->max_position_embeddings)
        return mv_error("model runner: max_model_len %d must be in [1, max_position_embeddings = %d]",
                        rc->max_model_len, c->max_position_embeddings);
    if (rc->num_threads < 0) return mv_error("model runner: num_threads must be >= 0, got %d", rc->num_threads);
    if (!(rc->gpu_memory_utilization >= 0 && rc->gpu_memory_utilization <= 1))
        return mv_error("model runner: gpu_memory_utilization %g must be in (0, 1] (0 = 0.9)",
                        rc->gpu_memory_utilization);
    // The cuda backend may be left to size the cache itself (num_blocks 0):
    // it knows how much memory is left only after placing the weights.
    const int sized_later = rc->device == RUNNER_DEVICE_CUDA && rc->num_blocks == 0;
    if (attention_validate_heads(rc->max_num_seqs, c->num_attention_heads, c->num_key_value_heads, c->head_dim,
                                 1.0f / sqrtf((float)c->head_dim)) ||
        attention_validate_cache(rc->block_size, sized_later ? 1 : rc->num_blocks, 1))
        return -1;
    return 0;
}

// ---- tensor parallelism: the ranks' sizes, and one step on the wire ----------------------------

// Before anything is loaded: the backend, and the sizes tp must divide
// (chapter 03's and 04's rules, through qwen3_layout_init, name the size).
static int validate_tp(const runner_config_t *rc, const qwen3_config_t *c) {
    const int tp = rc->tp_size > 1 ? rc->tp_size : 1;
    if (rc->tp_size < 0 || rc->tp_size > 64)
        return mv_error("--tensor-parallel-size %d must be in [1, 64]", rc->tp_size);
    // cuda carries its ranks' tensors over NCCL (runner_cuda.c): a build without it runs one GPU.
    if (tp > 1 && rc->device == RUNNER_DEVICE_CUDA && !MV_HAVE_NCCL)
        return mv_error("--tensor-parallel-size %d: the cuda backend runs its ranks over NCCL, and this minivllm "
                        "was built without it (nccl.h was not found at build time): use --device cpu, or rebuild "
                        "with NCCL",
                        tp);
    qwen3_layout_t lo;
    if (qwen3_layout_init(&lo, c, tp, 0)) return mv_error_prefix("--tensor-parallel-size %d", tp);
    return 0;
}

// Rank 0's sizes to every rank, which must have the same: each rank parsed
// its own command line, and a rank whose cache or batch were another size
// would index rank 0's block tables out of its bounds.
static int same_sizes_as_rank0(const model_runner_t *r, char *why, size_t cap) {
    if (r->tp.size == 1) return 0;
    const runner_config_t *rc = &r->rc;
    const qwen3_config_t *c = &r->cfg;
    enum { N = 14 };
    const int32_t mine[N] = {(int32_t)rc->device,   rc->max_num_batched_tokens, rc->max_num_seqs, rc->max_model_len,
                             rc->block_size,        rc->num_blocks,             rc->tp_size,      c->hidden_size,
                             c->num_hidden_layers,  c->num_attention_heads,     c->num_key_value_heads, c->head_dim,
                             c->intermediate_size,  c->vocab_size};
    int32_t rank0[N];
    memcpy(rank0, mine, sizeof mine);
    if (tp_comm_bcast(&r->tp, rank0, sizeof rank0, 0)) {
        snprintf(why, cap, "%s", mv_last_error());
        return -1;
    }
    if (memcmp(rank0, mine, sizeof mine) == 0) return 0;
    snprintf(why, cap, "its model or engine sizes differ from rank 0's (model, --max-model-len, --max-num-seqs, "
                       "--max-num-batched-tokens, --block-size, --num-blocks, --kv-cache-gib): launch every rank "
                       "with the same command line and model");
    return -1;
}

// What rank 0 broadcasts before each step: a header of int32s, then (for a
// step) the step's arrays packed one after the other in one int32 buffer.
enum { TP_MSG_STEP = 1, TP_MSG_STOP = 2 };
enum { TP_HEAD_KIND, TP_HEAD_T, TP_HEAD_S, TP_HEAD_SAMPLE, TP_HEAD_MAXB, TP_HEAD_N };

// int32s of a step's arrays: input_ids, positions, slot_mapping [T];
// cu_seqlens_q [S + 1]; context_lens [S]; block_tables [S, maxb]; sample_token_index [num_sample].
static size_t wire_count(int T, int S, int ns, int maxb) {
    return 3 * (size_t)T + (size_t)S + 1 + (size_t)S + (size_t)S * (size_t)maxb + (size_t)ns;
}

static int wire_reserve(model_runner_t *r, size_t n) {
    if (n <= r->wire_cap) return 0;
    int32_t *w = realloc(r->wire, n * sizeof *w);
    if (!w) return mv_error("model runner: out of host memory for a step's broadcast (%zu bytes)", n * sizeof *w);
    r->wire = w;
    r->wire_cap = n;
    return 0;
}

// One array into the wire at `at`; returns where the next one goes.
static int32_t *wire_put(int32_t *at, const int32_t *a, size_t n) {
    if (n) memcpy(at, a, n * sizeof *at);
    return at + n;
}

// The step's arrays as views into a received wire (the order wire_put packed them).
static void wire_views(int32_t *w, int T, int S, int ns, int maxb, runner_step_t *in) {
    *in = (runner_step_t){T, S, ns, maxb, NULL, NULL, NULL, NULL, NULL, NULL, NULL};
    in->input_ids = w, w += T;
    in->positions = w, w += T;
    in->slot_mapping = w, w += T;
    in->cu_seqlens_q = w, w += S + 1;
    in->context_lens = w, w += S;
    in->block_tables = w, w += (size_t)S * maxb;
    in->sample_token_index = w;
}

// Rank 0: the step to every other rank.
static int send_step(model_runner_t *r, const runner_step_t *in) {
    const int T = in->num_tokens, S = in->num_seqs, ns = in->num_sample, maxb = in->max_blocks_per_seq;
    int32_t head[TP_HEAD_N] = {TP_MSG_STEP, T, S, ns, maxb};
    size_t n = wire_count(T, S, ns, maxb);
    if (wire_reserve(r, n)) return -1;
    int32_t *at = r->wire;
    at = wire_put(at, in->input_ids, (size_t)T);
    at = wire_put(at, in->positions, (size_t)T);
    at = wire_put(at, in->slot_mapping, (size_t)T);
    at = wire_put(at, in->cu_seqlens_q, (size_t)S + 1);
    at = wire_put(at, in->context_lens, (size_t)S);
    at = wire_put(at, in->block_tables, (size_t)S * maxb);
    wire_put(at, in->sample_token_index, (size_t)ns);
    if (tp_comm_bcast(&r->tp, head, sizeof head, 0) || tp_comm_bcast(&r->tp, r->wire, n * sizeof *r->wire, 0))
        return -1;
    return 0;
}

int model_runner_create(const qwen3_config_t *cfg, const st_model_t *weights, const runner_config_t *rc,
                        model_runner_t **out) {
    *out = NULL;
    const runner_backend_t *b = NULL;
    char why[256];
    if (!model_runner_device_available(rc->device, why, sizeof why))
        return mv_error("--device %s: %s (use --device cpu)", model_runner_device_name(rc->device), why);
    if (rc->device == RUNNER_DEVICE_CPU) b = &RUNNER_BACKEND_CPU;
#if MV_HAVE_CUDA
    else b = &RUNNER_BACKEND_CUDA;
#endif
    if (!b) return mv_error("model runner: unknown device %d", (int)rc->device);
    if (validate_config(rc, cfg) || validate_tp(rc, cfg)) return -1;
    model_runner_t *r = calloc(1, sizeof *r);
    if (!r) return mv_error("model runner: out of host memory");
    r->cfg = *cfg;
    r->rc = *rc;
    r->backend = b;
    if (tp_comm_open(rc->tp_size > 1 ? rc->tp_size : 1, &r->tp)) {
        free(r);
        return -1;
    }
    // From here on every rank reaches the agreement below, whatever fails on
    // it: a rank that returned early would leave the others waiting there.
    char why_not[1024] = "";
    int ok = same_sizes_as_rank0(r, why_not, sizeof why_not) == 0;
    if (ok && b->create(r, weights)) {
        mv_error_prefix("model runner (%s)", b->name);
        // A backend that held agreements of its own (cuda at tp > 1, around
        // starting NCCL) has already told every rank of a failure, naming the
        // rank: all of them return here, with no second agreement.
        if (r->failure_agreed) {
            model_runner_free(r);
            return -1;
        }
        snprintf(why_not, sizeof why_not, "%s", mv_last_error());
        ok = 0;
    }
    if (tp_comm_agree(&r->tp, ok, why_not, NULL)) {
        model_runner_free(r);
        return -1;
    }
    r->followers_waiting = r->tp.size > 1 && r->tp.rank == 0;
    // The wire sized once for the widest step the scheduler makes (block
    // tables as wide as max_model_len needs), so that steps allocate nothing.
    const int maxb = (rc->max_model_len + rc->block_size - 1) / rc->block_size;
    if (r->tp.size > 1 &&
        wire_reserve(r, wire_count(rc->max_num_batched_tokens, rc->max_num_seqs, rc->max_num_seqs, maxb)))
        tp_comm_abort(&r->tp, 1, mv_last_error());
    *out = r;
    return 0;
}

void model_runner_free(model_runner_t *r) {
    if (!r) return;
    if (r->followers_waiting) {
        // The stop message: a header of kind TP_MSG_STOP.
        int32_t head[TP_HEAD_N] = {TP_MSG_STOP};
        if (tp_comm_bcast(&r->tp, head, sizeof head, 0)) tp_comm_abort(&r->tp, 1, mv_last_error());
        r->followers_waiting = 0;
        tp_comm_mark_settled();
    }
    if (r->backend) r->backend->destroy(r);
    free(r->wire);
    free(r);
}

int model_runner_tp_rank(const model_runner_t *r) { return r->tp.rank; }

// The step's checks, shared by model_runner_step and model_runner_step_sample.
static int validate_step(const model_runner_t *r, const runner_step_t *in) {
    const runner_config_t *rc = &r->rc;
    const int T = in->num_tokens, S = in->num_seqs;
    if (T < 0 || T > rc->max_num_batched_tokens || S < 0 || S > rc->max_num_seqs || S > T ||
        in->num_sample < 0 || in->num_sample > S)
        return mv_error("model runner: step of %d tokens, %d rows, %d sampled does not fit max_num_batched_tokens "
                        "%d, max_num_seqs %d",
                        T, S, in->num_sample, rc->max_num_batched_tokens, rc->max_num_seqs);
    if (in->max_blocks_per_seq < 1 || (long long)in->max_blocks_per_seq * rc->block_size < rc->max_model_len)
        return mv_error("model runner: block tables of width %d cannot hold max_model_len %d", in->max_blocks_per_seq,
                        rc->max_model_len);
    if (T == 0) return 0;
    if (embedding_validate_ids(in->input_ids, T, r->cfg.vocab_size) ||
        rope_validate_positions(in->positions, T, rc->max_model_len) || cu_seqlens_validate(in->cu_seqlens_q, S, T) ||
        attention_validate_paged_batch(in->cu_seqlens_q, in->context_lens, in->block_tables, S, rc->block_size,
                                       rc->num_blocks, in->max_blocks_per_seq))
        return -1;
    for (int k = 0; k < in->num_sample; k++)
        if (in->sample_token_index[k] < 0 || in->sample_token_index[k] >= T ||
            (k > 0 && in->sample_token_index[k] <= in->sample_token_index[k - 1]))
            return mv_error("model runner: sample_token_index[%d] = %d is not increasing inside [0, %d)", k,
                            in->sample_token_index[k], T);
    return 0;
}

int model_runner_step(model_runner_t *r, const runner_step_t *in, float *logits) {
    if (r->num_launched)
        return mv_error("model runner: %d launched steps are not collected (model_runner_collect_sample)",
                        r->num_launched);
    if (validate_step(r, in)) return -1;
    if (in->num_tokens == 0) return 0;
    if (r->tp.size == 1) return r->backend->step(r, in, logits);
    if (r->tp.rank != 0) return mv_error("model runner: rank %d follows rank 0's steps (model_runner_follow)", r->tp.rank);
    // Once the step is sent, the other ranks are inside it: a failure from
    // here on cannot be returned to a caller that would go on without them.
    if (send_step(r, in) || r->backend->step(r, in, logits)) tp_comm_abort(&r->tp, 1, mv_last_error());
    return 0;
}

int model_runner_follow(model_runner_t *r) {
    if (r->tp.rank == 0) return mv_error("model runner: rank 0 runs the steps; only the other ranks follow");
    for (;;) {
        int32_t head[TP_HEAD_N];
        if (tp_comm_bcast(&r->tp, head, sizeof head, 0)) tp_comm_abort(&r->tp, 1, mv_last_error());
        if (head[TP_HEAD_KIND] == TP_MSG_STOP) {
            tp_comm_mark_settled();
            return 0;
        }
        const int T = head[TP_HEAD_T], S = head[TP_HEAD_S], ns = head[TP_HEAD_SAMPLE], maxb = head[TP_HEAD_MAXB];
        runner_step_t in;
        if (head[TP_HEAD_KIND] != TP_MSG_STEP || T < 0 || S < 0 || ns < 0 || maxb < 0 ||
            T > r->rc.max_num_batched_tokens || S > r->rc.max_num_seqs)
            tp_comm_abort(&r->tp, 1, "model runner: a message from rank 0 that is not a step");
        size_t n = wire_count(T, S, ns, maxb);
        if (wire_reserve(r, n) || tp_comm_bcast(&r->tp, r->wire, n * sizeof *r->wire, 0))
            tp_comm_abort(&r->tp, 1, mv_last_error());
        wire_views(r->wire, T, S, ns, maxb, &in);
        // Rank 0 checked it; checking again costs little and keeps a bad
        // message from indexing this rank's cache out of bounds. A follower
        // runs step even when rank 0 runs step_sample (the cuda backend):
        // both make the same collectives, all of them in the forward pass,
        // and only rank 0 samples.
        if (validate_step(r, &in) || r->backend->step(r, &in, NULL)) tp_comm_abort(&r->tp, 1, mv_last_error());
    }
}

int model_runner_samples_on_device(const model_runner_t *r) { return r->backend->step_sample != NULL; }

// One row's options as the device reads them (kernels/sampling_opts.h):
// values in range, and every id it points at inside opt_ids and the vocabulary.
static int validate_opts_row(const sampling_opts_row_t *o, const int32_t *ids, int num_ids, int vocab) {
    if (!(o->min_p >= 0 && o->min_p <= 1) || !isfinite(o->presence) || !isfinite(o->frequency) ||
        !(o->repetition > 0) || !isfinite(o->repetition) || o->top_logprobs < -1 ||
        o->top_logprobs > SAMPLING_MAX_TOP_LOGPROBS)
        return mv_error("options out of range: min_p %g, presence %g, frequency %g, repetition %g, top_logprobs %d",
                        o->min_p, o->presence, o->frequency, o->repetition, o->top_logprobs);
    const int pen = o->presence != 0 || o->frequency != 0 || o->repetition != 1.0f;
    const long long n_pen = pen ? (long long)o->num_prompt + o->num_output : 0;
    const struct { long long start, n; } spans[] = {{o->ids_start, n_pen}, {o->stop_start, o->num_stop}};
    for (int j = 0; j < 2; j++) {
        if (spans[j].n == 0) continue;
        if (o->num_prompt < 0 || o->num_output < 0 || spans[j].n < 0 || spans[j].start < 0 ||
            spans[j].start + spans[j].n > num_ids || !ids)
            return mv_error("option ids [%lld, %lld) outside the step's %d", spans[j].start,
                            spans[j].start + spans[j].n, num_ids);
        for (long long i = spans[j].start; i < spans[j].start + spans[j].n; i++)
            if (ids[i] < 0 || ids[i] >= vocab) return mv_error("option id %d is outside [0, %d)", ids[i], vocab);
    }
    return 0;
}

// The sampling parameters' checks, shared by step_sample and launch_sample.
static int validate_sampling(const model_runner_t *r, const runner_step_t *in, const runner_sampling_t *sp) {
    for (int k = 0; k < in->num_sample; k++) {
        sampling_params_t p = {.temperature = sp->temperature[k], .top_k = sp->top_k[k], .top_p = sp->top_p[k], .max_tokens = 1, .ignore_eos = 0};
        if (sampler_validate_params(&p)) return mv_error_prefix("model runner: sampled row %d", k);
        if (sp->gen_index[k] < 0) return mv_error("model runner: sampled row %d: gen_index %lld < 0", k,
                                                  (long long)sp->gen_index[k]);
        if (sp->opts && validate_opts_row(&sp->opts[k], sp->opt_ids, sp->num_opt_ids, r->cfg.vocab_size))
            return mv_error_prefix("model runner: sampled row %d", k);
    }
    if (sp->opts && !sp->logprobs)
        for (int k = 0; k < in->num_sample; k++)
            if (sp->opts[k].top_logprobs >= 0)
                return mv_error("model runner: sampled row %d wants logprobs and the step has no room for them", k);
    return 0;
}

// A sampled id from the backend: in the vocabulary, or a failed row.
static int check_sampled(const model_runner_t *r, const int32_t *sampled, int n) {
    // A failed row is the request's business (the engine ends it); an id
    // outside the vocabulary is the backend's bug and fails the step.
    for (int k = 0; k < n; k++)
        if (sampled[k] != RUNNER_ROW_FAILED && (sampled[k] < 0 || sampled[k] >= r->cfg.vocab_size))
            return mv_error("model runner (%s): sampled row %d: id %d is outside the vocabulary [0, %d)",
                            r->backend->name, k, sampled[k], r->cfg.vocab_size);
    return 0;
}

int model_runner_step_sample(model_runner_t *r, const runner_step_t *in, const runner_sampling_t *sp,
                             int32_t *sampled, float *logits) {
    if (!r->backend->step_sample)
        return mv_error("model runner (%s): this backend samples on the host (use model_runner_step)",
                        r->backend->name);
    if (r->num_launched)
        return mv_error("model runner: %d launched steps are not collected (model_runner_collect_sample)",
                        r->num_launched);
    if (validate_step(r, in) || validate_sampling(r, in, sp)) return -1;
    if (in->num_tokens == 0) return 0;
    if (r->tp.size == 1) {
        if (r->backend->step_sample(r, in, sp, sampled, logits)) return -1;
    } else {
        // As model_runner_step: the step to the other ranks first, and a
        // failure once they are inside it ends every rank.
        if (r->tp.rank != 0)
            return mv_error("model runner: rank %d follows rank 0's steps (model_runner_follow)", r->tp.rank);
        if (send_step(r, in) || r->backend->step_sample(r, in, sp, sampled, logits))
            tp_comm_abort(&r->tp, 1, mv_last_error());
    }
    return check_sampled(r, sampled, in->num_sample);
}

int model_runner_can_launch(const model_runner_t *r) {
    return r->backend->launch_sample && r->backend->collect_sample && r->tp.size == 1 && !r->no_async_steps;
}

int model_runner_launch_sample(model_runner_t *r, const runner_step_t *in, const runner_sampling_t *sp,
                               const int32_t *input_from) {
    if (!model_runner_can_launch(r))
        return mv_error("model runner (%s): no asynchronous steps here (a backend without them, or tp > 1)",
                        r->backend->name);
    if (r->num_launched == 2) return mv_error("model runner: two steps are launched already; collect one first");
    if (sp->opts) return mv_error("model runner: a launched step takes no sampling options (step_sample does)");
    if (validate_step(r, in) || validate_sampling(r, in, sp)) return -1;
    if (in->num_tokens == 0) return mv_error("model runner: an empty step is not launched");
    if (input_from) {
        if (r->num_launched != 1)
            return mv_error("model runner: input ids from the step before, but %d steps are launched", r->num_launched);
        if (in->num_tokens != in->num_seqs || in->num_sample != in->num_seqs)
            return mv_error("model runner: input ids from the step before in a step that is not a decode step");
        for (int q = 0; q < in->num_seqs; q++)
            if (input_from[q] < 0 || input_from[q] >= r->launched_sample[0])
                return mv_error("model runner: row %d takes the step before's id %d, of %d", q, input_from[q],
                                r->launched_sample[0]);
    }
    if (r->backend->launch_sample(r, in, sp, input_from)) return -1;
    r->launched_sample[r->num_launched++] = in->num_sample;
    return 0;
}

int model_runner_collect_sample(model_runner_t *r, int32_t *sampled, int n) {
    if (r->num_launched == 0) return mv_error("model runner: no launched step to collect");
    if (n != r->launched_sample[0])
        return mv_error("model runner: the oldest launched step sampled %d rows, not %d", r->launched_sample[0], n);
    const int rc = r->backend->collect_sample(r, sampled, n);
    r->launched_sample[0] = r->launched_sample[1];
    r->num_launched--;
    return rc ? -1 : check_sampled(r, sampled, n);
}

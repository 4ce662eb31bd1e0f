/*
 * chapters/09-engine/runtime/runner_cuda.c - the model runner's CUDA backend
 * (see model_runner.h): Qwen3 in bf16 on one GPU, built only from the
 * kernels/ functions (no second copy of any layer's math), with sampling on
 * the GPU.
 *
 *   weights   every tensor converted to bf16 on the host once (st_to_bf16:
 *             bf16, f16 and f32 checkpoints alike, as the CPU backend does),
 *             then copied to the GPU: q/k/v merged into one [QKV, H] matrix
 *             and gate/up into one [2I, H] (one GEMM each), packed on the
 *             host by qwen3_merged_fill from model/qwen3_layout.h (the CPU
 *             backend packs with the same function) and copied in one
 *             cudaMemcpy each; norm weights bf16 too (the kernels take
 *             bf16). Tied embeddings: one copy.
 *   KV cache  per layer, bf16 K and V [num_blocks, block_size, nkv, hd],
 *             sized from what is left of the GPU's memory (cuda_size_cache).
 *   scratch   every activation buffer sized at creation for the worst step
 *             (max_num_batched_tokens tokens, max_num_seqs rows): a step
 *             allocates nothing.
 *   inputs    the step's host int32 arrays are copied, through a pinned
 *             staging buffer, into fixed device buffers: the same device
 *             addresses every step. Two staging copies, used in turn by
 *             launched steps (cuda_launch_sample), so that the host fills
 *             one while the other's upload or ids are still in flight.
 *   one stream, one cuBLAS handle with a workspace we own; a second of
 *             each for the decode steps that run as two halves at once
 *             (cuda_state_t.halves_lo: the graph of 16 rows by default).
 *
 * One step, the kernels in order (T tokens, S rows, N sampled rows; the
 * order of a layer's calls is model_runner.h's, as the CPU backend's):
 *   embedding_cuda                              residual = embed[ids]
 *   rmsnorm_cuda                                hidden = norm(residual)     (layer 0's input norm)
 *   per layer:
 *     fused_add_rmsnorm_cuda (layers > 0)       residual += x; hidden = norm(residual)
 *     linear_cuda                               qkv = hidden W_qkv^T
 *     qk_norm_rope_store_cuda                   q, k heads normed and rotated in place, and
 *                                               k, v of the new tokens -> cache slots (one
 *                                               kernel; qk_norm_rope_cuda + store_kvcache_cuda
 *                                               with MV_FUSED_ROPE_STORE=0: the same bits;
 *                                               decode graphs of up to DECODE_ROPE_MAX_ROWS
 *                                               rows: inside attention_decode_rope_cuda)
 *     attention_decode_cuda  (T == S: every row one token; in a mixed step
 *       the leading rows of one token, the running decodes chapter 08 puts
 *       first) and attention_prefill_cuda (the rows after them: prompts)
 *     linear_cuda                               x = attn W_o^T
 *     fused_add_rmsnorm_cuda                    residual += x; hidden = norm(residual)
 *     linear_cuda, silu_and_mul_cuda, linear_cuda   x = down(silu(gate) * up)
 *   fused_add_rmsnorm_cuda                      final norm
 *   gather_last_tokens_cuda                     the N sampled rows' hidden states
 *   linear_cuda                                 logits [N, V] bf16 (LM head)
 *   sampling_prepare_bf16_cuda                  vLLM's other options on the rows that use
 *                                               them (penalties, min_tokens, min_p, logprobs),
 *                                               each such row widened to fp32 first
 *   sample_tokens_bf16_cuda                     N ids from the bf16 logits (step_sample), or,
 *                                               in step, the logits widened and copied to the
 *                                               host. MV_SAMPLER=1|2|3: bf16_to_f32_cuda on
 *                                               every row, sampling_prepare_cuda and
 *                                               sample_tokens_ws_cuda on fp32
 *   sampling_logprobs_finish_cuda               the sampled tokens' logprobs
 *
 * Decode steps (every row one new token) are CUDA graphs: captured at
 * creation for batch sizes 1, 2, 4, 8, 16, ... max_num_seqs, a step padded
 * to the next size and replayed with one launch ("decode steps as CUDA
 * graphs" below says what that needs). Prefill and mixed steps, whose
 * shapes vary, are launched kernel by kernel. enforce_eager launches decode
 * steps kernel by kernel too, padded the same way, so both compute the same
 * bits.
 * Tensor parallelism (rc.tp_size N > 1: one process per GPU under mpirun;
 * "tensor parallelism over NCCL" below, docs/09-parallel.md): rank r runs on
 * GPU (its local rank mod the GPUs visible), holds the shard that
 * model/qwen3_layout.h describes for it (loaded by chapter 03's and 04's
 * loaders, as the CPU backend loads its own), and runs the same kernels on
 * its heads and rows, with four NCCL collectives on its stream:
 *   embedding   masked rows (zeros for ids it does not hold) -> ncclAllReduce (bf16 sum)
 *   o_proj      partial sums over its heads -> ncclAllReduce (bias added by rank 0 only)
 *   down_proj   partial sums over its I/N columns -> ncclAllReduce
 *   LM head     its V/N vocabulary columns -> ncclAllGather; rank 0 assembles
 *               them (chapter 04's vocab_assemble_logits_cuda) and samples
 * The decode CUDA graphs capture the collectives: every rank captures the
 * same sizes in the same order. Only rank 0 samples; the other ranks run
 * step (model_runner_follow), whose collectives are the same as step_sample's.
 * At N = 1 none of this runs: every tp branch below is skipped, and the
 * launches are the single-GPU engine's.
 */
#include "chapters/09-engine/runtime/model_runner.h"

#if MV_HAVE_CUDA
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <limits.h>
#include <math.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#if MV_HAVE_NCCL
#include <nccl.h>
#endif

#include "chapters/04-embedding/vocab_parallel.h"
#include "chapters/09-engine/model/qwen3_layout.h"
#include "chapters/09-engine/model/qwen3_weights.h"
#include "chapters/09-engine/parallel/tp_comm.h"
#include "chapters/09-engine/runtime/sampler.h"
#include "common/check.h"
#include "kernels/activation.h"
#include "kernels/attention.h"
#include "kernels/decode_megakernel.h"
#include "kernels/embedding.h"
#include "kernels/kv_store.h"
#include "kernels/linear.h"
#include "kernels/pdl.h"
#include "kernels/rmsnorm.h"
#include "kernels/rope.h"
#include "kernels/sampling_opts.h"
#include "kernels/sampling.h"
#include "reference/attention.h"

// cuBLAS's recommended workspace on Hopper (32 MiB; 4 MiB is enough before
// sm_90). Owning it keeps cuBLAS from allocating on its own: its bytes are
// counted before the KV cache is sized, and its address never changes.
#define CUBLAS_WORKSPACE_BYTES (32u << 20)
// Decode steps of DECODE_HALVES_MIN to DECODE_HALVES_MAX rows (the size of
// their graph) run as two halves at once, unless MV_DECODE_HALVES says
// otherwise (cuda_state_t.halves_lo). Measured on Qwen3-0.6B's shapes, H200
// and H100: the graph of 16 rows (steps of 9 to 16) gains 5 to 8%; from 24
// rows on two halves lose, 1 to 14%, and at 4 and 8 rows 10 to 18%
// (docs/09-engine.md, "Two halves of a step at once").
#define DECODE_HALVES_MIN 16
#define DECODE_HALVES_MAX 16
// Decode graphs of up to DECODE_ROPE_MAX_ROWS rows (run whole, not as two
// halves) take q/k norm, RoPE and the KV store inside decode attention
// (attention_decode_rope_cuda), unless MV_DECODE_ROPE says otherwise
// (cuda_state_t.decode_rope). Measured on Qwen3-0.6B's shapes on an H100:
// 1.6% faster at 4 and 8 rows; at 16 rows (two halves of 8), 64 and the
// workload's 100 to 256 rows 1 to 2% slower (docs/09-engine.md, "q/k norm,
// RoPE and the KV store inside decode attention").
#define DECODE_ROPE_MAX_ROWS 8
#define DEFAULT_GPU_MEMORY_UTILIZATION 0.9f
#define DECODE_MAX_SIZES 64

// H = hidden_size, I = intermediate_size, V = vocab_size, hd = head_dim,
// nq / nkv = query / KV heads, QKV = (nq + 2*nkv) * hd,
// Tm = max_num_batched_tokens, Sm = max_num_seqs, W = ceil(max_model_len / block_size).
// At tp N > 1 the weight and activation shapes are this rank's share:
// nq/N query heads, its KV heads (nkv/N, or 1 copied), I/N, V' = V padded / N
// vocabulary rows (qwen3_layout.h); H is whole.


// Room for one row's min_tokens stop ids (its eos ids and stop_token_ids)
// in the options' id buffer, beside its sequence.
#define OPT_STOP_IDS (QWEN3_MAX_EOS + SAMPLER_MAX_STOP_IDS)

typedef struct {
    bf16_t *d_input_norm;             // [H]
    bf16_t *d_qkv;                    // [QKV, H]  rows: q_proj, k_proj, v_proj (qwen3_layout.h)
    bf16_t *d_qkv_bias;               // [QKV] or NULL
    bf16_t *d_q_norm, *d_k_norm;      // [hd] each
    bf16_t *d_o_proj;                 // [H, nq*hd]  (tp > 1: this rank's columns)
    bf16_t *d_o_bias;                 // [H] or NULL (tp > 1: added by rank 0 only)
    bf16_t *d_post_norm;              // [H]
    bf16_t *d_gate_up;                // [2I, H]  rows: gate_proj, then up_proj (qwen3_layout.h)
    bf16_t *d_down;                   // [H, I]  (tp > 1: this rank's I/N columns)
    bf16_t *d_k_cache, *d_v_cache;    // [num_blocks, block_size, nkv, hd] each
} cuda_layer_t;

// The step's inputs on the device, at fixed addresses (one allocation).
// Two layouts of the same bytes (layout_step): a prefill or mixed step's,
// each array at its full size (Tm tokens, Sm rows), and a decode step's of
// Sg rows, packed for exactly Sg rows (the graph of that size holds these
// addresses), so that its inputs go up in one copy, not twelve.
typedef struct {
    int32_t *input_ids;     // [Tm]
    int32_t *positions;     // [Tm]
    int32_t *slot_mapping;  // [Tm]
    int32_t *cu_seqlens_q;  // [Sm + 1]
    int32_t *context_lens;  // [Sm]
    int32_t *block_tables;  // [Sm, W]
    int32_t *cu_last;       // [Sm + 1] cu_seqlens ending at each sampled token (gather_last_tokens_cuda)
    float *temperature;     // [Sm]
    int32_t *top_k;         // [Sm]
    float *top_p;           // [Sm]
    uint64_t *seed;         // [Sm]
    int64_t *gen_index;     // [Sm]
    sampling_opts_row_t *opts;  // [Sm] vLLM's other options, per row (all off: sampler_opts_off)
    int32_t *row_order;     // [Sm] a decode step's rows longest first (decode attention version 7)
    int32_t *sampled;       // [Sm] output ids
    sampling_logprobs_t *lp;    // [Sm] output logprobs of the rows that ask for them
} step_buffers_t;

typedef struct {
    cudaStream_t stream;
    cublasHandle_t cublas;
    void *d_cublas_ws;                // [CUBLAS_WORKSPACE_BYTES]
    // Linear version 4's workspace for each handle (linear_set_workspace):
    // tile_ws_bytes each, 0 (and NULL) where linear_cuda never picks it.
    void *d_tile_ws, *d_tile_ws2;
    size_t tile_ws_bytes;
    qwen3_layout_t layout;            // this rank's shapes and pieces (one GPU: tp_size 1, the whole model)
    int device;                       // the CUDA device this rank runs on (0 at tp 1)
    bf16_t *d_embed;                  // [V, H]  (tp > 1: [V', H], this rank's vocabulary rows)
    bf16_t *d_lm_head;                // [V, H]; == d_embed when tied  (tp > 1: [V', H])
    bf16_t *d_final_norm;             // [H]
    cuda_layer_t *layers;             // [L] (host array of device pointers)
    rope_cache_gpu_t rope;            // cos/sin [max_model_len, hd] fp32
    int max_blocks;                   // W: width of the device block table
    // scratch, sized for Tm tokens / Sm rows
    bf16_t *d_residual;               // [Tm, H] the residual stream
    bf16_t *d_hidden;                 // [Tm, H] normed input of a sublayer
    bf16_t *d_x;                      // [Tm, H] output of a sublayer (o_proj, down_proj)
    bf16_t *d_qkv;                    // [Tm, QKV]
    bf16_t *d_attn;                   // [Tm, nq*hd]
    bf16_t *d_gate_up;                // [Tm, 2I]
    bf16_t *d_act;                    // [Tm, I]
    bf16_t *d_last;                   // [Sm, H] final hidden rows of the sampled rows
    bf16_t *d_logits_bf16;            // [Sm, V]  (tp > 1: rank 0 only, assembled from every rank's)
    float *d_logits;                  // [Sm, V] fp32  (tp > 1: rank 0 only)
    void *d_attn_ws;                  // split decode's partial results
    size_t attn_ws_bytes;
    void *d_step_mem;                 // one allocation behind step_buffers_t
    step_buffers_t d;                 // device views into d_step_mem
    void *h_stage;                    // pinned host copy of d_step_mem's layout: h_stages[stage]
    step_buffers_t h;                 // host views into h_stage
    // Asynchronous steps (cuda_launch_sample): two pinned staging copies, so
    // that the host fills one while the other's upload or ids are in flight.
    void *h_stages[2];
    int stage;                        // h_stage == h_stages[stage]
    int num_launched;                 // launched steps not collected, oldest first in launched[]
    struct {
        int stage;                    // the staging copy its ids come back into
        int32_t *h_sampled;           // where, and how many
        int n;
    } launched[2];
    cudaEvent_t launch_ev[2];         // [stage]: recorded after that staging copy's ids come down
    int32_t *prev_d_sampled;          // the last launched step's ids on the device
    size_t step_bytes;
    int step_tm, step_sm;             // the full layout's sizes (Tm tokens, Sm rows)
    int step_sg;                      // rows of the packed decode layout in d / h now; 0: the full layout
    int upload_arrays;                // MV_PACKED_UPLOAD=0: a decode step's inputs in a copy per array, as before
    int mk_embed;                     // the embedding inside the megakernel (MV_MEGAKERNEL_EMBED, default 1)
    // vLLM's other sampling options (kernels/sampling_opts.h; rank 0 only):
    int32_t *d_opt_ids, *h_opt_ids;   // [opt_ids_cap] the rows' penalty and min_tokens ids (h: pinned)
    int opt_ids_cap;                  // Sm x (max_model_len + OPT_STOP_IDS)
    uint32_t *d_counts;               // [Sm, V] the penalties' id counts: zero between steps
    float *d_raw;                     // [Sm, V] the raw logits of the rows that use an option
    int sampling_version;             // sample_tokens_cuda's version: SAMPLING_FAST, or MV_SAMPLER
    // MV_STEP_TIMES=1: each graphed decode step timed by two events (before its
    // inputs go up, after its ids come down) and by the host's clock around the
    // same calls; the means printed when the runner is destroyed.
    cudaEvent_t step_ev[2];
    double step_gpu_ms, step_host_s;
    long long step_timed;
    void *d_sample_ws;                // its workspace for Sm rows (version 3), zeroed once
    size_t sample_ws_bytes;
    // Decode steps (every row one token, every row sampled) run padded to
    // one of these batch sizes, as a CUDA graph captured at creation (or,
    // with enforce_eager, the same kernels launched one by one).
    int num_sizes;                    // captured sizes, increasing
    int sizes[DECODE_MAX_SIZES];
    cudaGraphExec_t graphs[DECODE_MAX_SIZES];  // NULL with enforce_eager
    // 1 while the decode graphs are warmed up and captured: the layers take
    // the fused kernels (the MLP's SiluAndMul inside the down projection's
    // GEMV) and every launch carries programmatic dependent launch
    // (kernels/pdl.h) where the GPU has it. 0 otherwise: prefill, mixed
    // steps and enforce_eager run the plain kernels, which compute the same
    // bits (build/engine_check compares graphs with eager).
    int fast_decode;
    // 1 (the default): q/k norm + RoPE and the KV store in one kernel
    // (qk_norm_rope_store_cuda, the same bits); MV_FUSED_ROPE_STORE=0: the two.
    int fused_rope_store;
    // 1 (the default): the decode graphs' programmatic edges leave their
    // upstream kernel's launch-completion port instead of its programmatic
    // port (move_edges_to_launch_completion); MV_PDL_EARLY=0: as captured.
    int pdl_early;
    // 1 (the default): a mixed step's leading one-token rows take decode
    // attention; MV_SPLIT_MIXED=0: every row of it prefill attention.
    int split_mixed;
    // The unfused decode graphs of up to decode_rope rows take q/k norm +
    // RoPE and the KV store inside decode attention's pieces
    // (attention_decode_rope_cuda: one launch a layer fewer, the same bits);
    // larger ones, eager steps and mixed steps run the kernel of their own.
    // DECODE_ROPE_MAX_ROWS by default; MV_DECODE_ROPE=0: none, 1: every size
    // (two halves of a step always run the kernel of their own).
    int decode_rope;
    // 1 when the step runs the tensor-parallel path: its NCCL communicator,
    // the collectives and the vocab-parallel LM head. tp > 1, or tp = 1 with
    // MV_TP_COMM_OF_ONE=1 (a communicator of one rank, whose collectives copy:
    // the same bits as tp = 1, so one GPU checks that path; build/engine_check).
    int collectives;
    // The decode megakernel (kernels/decode_megakernel.h): the layers of a
    // graphed decode step of up to megakernel_rows rows in one persistent
    // kernel, the same bits as the kernels it replaces. On by default
    // (MV_MEGAKERNEL=0 turns it off), never at tp > 1 or with enforce_eager.
    int megakernel[DECODE_MAX_SIZES];     // 1: size k's graph runs it
    megakernel_layer_t *d_mk_layers;      // [L] the layers' pointers, on the device
    bf16_t *d_residual2;                  // [8, H] the megakernel's second residual buffer
    unsigned *d_mk_barrier;               // its grid barrier's counter
    unsigned long long *d_mk_timeline;    // MV_MEGAKERNEL_PROFILE=1: the last step's barrier times
    // Two halves at once: a decode step of halves_lo to halves_hi rows (at
    // tp 1, outside the megakernel) runs its layers as two independent
    // chains of kernels, rows [0, S/2) on `stream` and the rest on stream2,
    // each with its own cuBLAS handle and workspaces, forked after the
    // embedding and joined before the final norm, so that each chain's
    // kernels can run in the gaps the other's leave (docs/09-engine.md,
    // "Two halves of a step at once"; MV_DECODE_HALVES sets the band).
    int halves_lo, halves_hi;             // decode steps of halves_lo to halves_hi rows (0: none)
    cudaStream_t stream2;
    cublasHandle_t cublas2;
    void *d_cublas_ws2;                   // [CUBLAS_WORKSPACE_BYTES]
    void *d_attn_ws2;                     // the split decode's partials of the second half's rows
    size_t attn_ws2_bytes;
    cudaEvent_t fork_ev, join_ev;
    // The tensor-parallel path only (NULL otherwise):
#if MV_HAVE_NCCL
    ncclComm_t nccl;                  // this rank's NCCL communicator
#endif
    bf16_t *d_logits_local;           // [Sm, V'] the LM head's logits of this rank's vocabulary rows
    bf16_t *d_logits_gathered;        // [tp, Sm, V'] every rank's, rank-major (ncclAllGather)
} cuda_state_t;

// MV_TP_COMM_OF_ONE=1: the tensor-parallel path at tp = 1 (cuda_state_t.collectives).
static int comm_of_one(void) {
    const char *v = getenv("MV_TP_COMM_OF_ONE");
    return v && !strcmp(v, "1");
}

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int dev_alloc(void **p, size_t bytes, size_t *total, const char *what) {
    *p = NULL;
    if (bytes == 0) return 0;
    cudaError_t err = cudaMalloc(p, bytes);
    if (err != cudaSuccess) {
        *p = NULL;
        return mv_error("cudaMalloc of %zu bytes for %s: %s (%s)", bytes, what, cudaGetErrorName(err),
                        cudaGetErrorString(err));
    }
    if (total) *total += bytes;
    return 0;
}

// n bf16 values from the host to d_dst; `what` names them in the error.
static int upload_host(bf16_t *d_dst, const bf16_t *h_src, size_t n, const char *what) {
    cudaError_t err = cudaMemcpy(d_dst, h_src, n * sizeof(bf16_t), cudaMemcpyHostToDevice);
    if (err != cudaSuccess)
        return mv_error("cudaMemcpy of %s (%zu bytes) to the GPU: %s", what, n * sizeof(bf16_t),
                        cudaGetErrorName(err));
    return 0;
}

// A weight tensor as bf16 on the device, at d_dst (room for st_numel(t)).
// h_tmp: host scratch with room for the largest tensor.
static int upload_bf16(const st_tensor_t *t, bf16_t *d_dst, bf16_t *h_tmp) {
    st_to_bf16(t, h_tmp);
    return upload_host(d_dst, h_tmp, (size_t)st_numel(t), t->name);
}

// Allocate and upload one tensor.
static int place(const st_tensor_t *t, bf16_t **d, bf16_t *h_tmp, size_t *wbytes) {
    if (dev_alloc((void **)d, (size_t)st_numel(t) * sizeof(bf16_t), wbytes, t->name)) return -1;
    return upload_bf16(t, *d, h_tmp);
}

// The host staging buffer's size: the largest tensor or merged matrix placed.
static size_t max_numel(const qwen3_weights_t *w, const qwen3_layout_t *lo) {
    const size_t qkv = (size_t)lo->qkv.rows * lo->qkv.cols, gate_up = (size_t)lo->gate_up.rows * lo->gate_up.cols;
    size_t m = qkv > gate_up ? qkv : gate_up;
    if ((size_t)st_numel(w->embed_tokens) > m) m = (size_t)st_numel(w->embed_tokens);
    if ((size_t)st_numel(w->lm_head) > m) m = (size_t)st_numel(w->lm_head);
    for (int l = 0; l < w->n_layers; l++) {
        const qwen3_layer_weights_t *lw = &w->layers[l];
        if ((size_t)st_numel(lw->o_proj) > m) m = (size_t)st_numel(lw->o_proj);
        if ((size_t)st_numel(lw->down_proj) > m) m = (size_t)st_numel(lw->down_proj);
    }
    return m;
}

// Allocate and upload one merged matrix of a layer (bias: its merged bias
// [rows] instead), packed in h_tmp by qwen3_layout.h's fill.
static int place_merged(const qwen3_merged_t *mg, const qwen3_layer_weights_t *lw, int bias, bf16_t **d,
                        bf16_t *h_tmp, size_t *wb) {
    const size_t n = bias ? (size_t)mg->rows : (size_t)mg->rows * mg->cols;
    const char *what = bias ? "qkv bias" : mg->name;
    if (dev_alloc((void **)d, n * sizeof(bf16_t), wb, what) ||
        (bias ? qwen3_merged_fill_bias(mg, lw, h_tmp) : qwen3_merged_fill(mg, lw, h_tmp)))
        return -1;
    return upload_host(*d, h_tmp, n, what);
}

// ---- tp > 1: this rank's shard of the weights --------------------------------------------
// The same tensors as place_weights, each cut as the CPU backend cuts its
// own (runner_cpu.c): the merged qkv_proj and gate_up_proj by the layout's
// pieces (place_merged already fills this rank's rows), o_proj and
// down_proj by columns (qwen3_row_fill: chapter 03's tp_linear_load), the
// embedding and LM head by vocabulary rows (qwen3_vocab_fill: chapter 04's
// vocab_shard_load, padding rows zero), norms and o_proj's bias whole. Each
// fill reads only this rank's rows or columns of the mapped checkpoint.
// With --random-weights every rank drew the whole model from the same seed
// (engine.c), so N ranks hold the shards of the same model as tp 1.

// A row-parallel matrix's shard [out_local, in_local].
static int place_row_shard(const tp_linear_t *l, const st_tensor_t *t, bf16_t **d, bf16_t *h_tmp, size_t *wb) {
    const size_t n = (size_t)l->out_local * (size_t)l->in_local;
    if (dev_alloc((void **)d, n * sizeof(bf16_t), wb, t->name) || qwen3_row_fill(l, t, h_tmp)) return -1;
    return upload_host(*d, h_tmp, n, t->name);
}

// A vocabulary table's shard [local_rows, H].
static int place_vocab_shard(const vocab_shard_t *v, const st_tensor_t *t, int H, bf16_t **d, bf16_t *h_tmp,
                             size_t *wb) {
    const size_t n = (size_t)v->local_rows * (size_t)H;
    if (dev_alloc((void **)d, n * sizeof(bf16_t), wb, t->name) || qwen3_vocab_fill(v, t, H, h_tmp)) return -1;
    return upload_host(*d, h_tmp, n, t->name);
}

// o_proj and down_proj: whole on one GPU; with tp > 1 this rank's columns
// (row-parallel, chapter 03), the rest of a layer as place_merged and place cut it.
static int place_row(const tp_linear_t *l, const st_tensor_t *t, bf16_t **d, bf16_t *h_tmp, size_t *wb) {
    return l->tp_size > 1 ? place_row_shard(l, t, d, h_tmp, wb) : place(t, d, h_tmp, wb);
}

static int place_layer(cuda_layer_t *cl, const qwen3_layer_weights_t *lw, const qwen3_layout_t *lo, bf16_t *h_tmp,
                       size_t *wb) {
    if (place(lw->input_layernorm, &cl->d_input_norm, h_tmp, wb) ||
        place(lw->post_attention_layernorm, &cl->d_post_norm, h_tmp, wb) ||
        place(lw->q_norm, &cl->d_q_norm, h_tmp, wb) || place(lw->k_norm, &cl->d_k_norm, h_tmp, wb) ||
        place_row(&lo->o_proj, lw->o_proj, &cl->d_o_proj, h_tmp, wb) ||
        place_row(&lo->down, lw->down_proj, &cl->d_down, h_tmp, wb) ||
        place_merged(&lo->qkv, lw, 0, &cl->d_qkv, h_tmp, wb) ||
        place_merged(&lo->gate_up, lw, 0, &cl->d_gate_up, h_tmp, wb))
        return -1;
    if (lo->qkv.has_bias &&
        (place_merged(&lo->qkv, lw, 1, &cl->d_qkv_bias, h_tmp, wb) || place(lw->o_bias, &cl->d_o_bias, h_tmp, wb)))
        return -1;
    return 0;
}

// The embedding and the LM head: whole on one GPU; with tp > 1 this rank's
// vocabulary rows (chapter 04).
static int place_vocab(const qwen3_layout_t *lo, const st_tensor_t *t, int H, bf16_t **d, bf16_t *h_tmp, size_t *wb) {
    return lo->tp_size > 1 ? place_vocab_shard(&lo->vocab, t, H, d, h_tmp, wb) : place(t, d, h_tmp, wb);
}

// Every weight, whole or this rank's shard as the layout says.
static int place_weights(cuda_state_t *s, const qwen3_weights_t *w, int L, int H, bf16_t *h_tmp, size_t *wb) {
    int rcode = place_vocab(&s->layout, w->embed_tokens, H, &s->d_embed, h_tmp, wb) ||
                place(w->norm, &s->d_final_norm, h_tmp, wb);
    if (!rcode) {
        if (w->lm_head == w->embed_tokens) s->d_lm_head = s->d_embed;
        else rcode = place_vocab(&s->layout, w->lm_head, H, &s->d_lm_head, h_tmp, wb);
    }
    for (int l = 0; !rcode && l < L; l++)
        if (place_layer(&s->layers[l], &w->layers[l], &s->layout, h_tmp, wb)) rcode = mv_error_prefix("layer %d", l);
    return rcode;
}

// MV_MEGAKERNEL_PROFILE=1: where the last megakernel step's time went,
// phase by phase (the mean over the layers), to stderr.
static void megakernel_profile_print(const model_runner_t *r, const cuda_state_t *s) {
    const int L = r->cfg.num_hidden_layers, slots = MEGAKERNEL_TIMELINE_SLOTS(L);
    const size_t words = MEGAKERNEL_TIMELINE_WORDS(L);
    unsigned long long *t = calloc(words, sizeof *t);
    if (!t || cudaMemcpy(t, s->d_mk_timeline, words * sizeof *t, cudaMemcpyDeviceToHost) != cudaSuccess) {
        free(t);
        return;
    }
    int used = 0;
    while (used < slots - 1 && t[2 * used + 1]) used++;
    const int per = L > 0 ? used / L : 0, fused = t[2 * (slots - 1) + 1] == 2;
    // A layer's phases: q/k norm + RoPE + KV store have their own unless
    // they ran in the attention pieces; the pieces' reduction, when split.
    static const char *all[] = {"norm + qkv", "q/k norm + RoPE + KV store", "attention pieces", "their reduction",
                                "o_proj", "norm + gate_up", "SiluAndMul + down"};
    const char *names[7];
    int n = 0;
    const int reduce_phase = per == (fused ? 6 : 7);
    for (int j = 0; j < 7; j++)
        if (!(j == 1 && fused) && !(j == 3 && !reduce_phase)) names[n++] = j == 2 && fused ? "rope + attention pieces" : all[j];
    if (n == per) {
        const unsigned long long start = t[2 * (slots - 1)];
        fprintf(stderr, "minivllm: megakernel profile of the last step (%d barriers, %.1f us to the last): "
                        "per phase, the mean over %d layers of\n  %-28s %10s %10s\n", used,
                (double)(t[2 * (used - 1) + 1] - start) / 1e3, L, "phase", "work us", "barrier us");
        for (int j = 0; j < per; j++) {
            double work = 0, wait = 0;
            for (int l = 0; l < L; l++) {
                const int i = l * per + j;
                const unsigned long long from = i == 0 ? start : t[2 * (i - 1) + 1];
                work += (double)(t[2 * i] - from);
                wait += (double)(t[2 * i + 1] - t[2 * i]);
            }
            fprintf(stderr, "  %-28s %10.2f %10.2f\n", names[j], work / L / 1e3, wait / L / 1e3);
        }
        // Block 0 inside the projections: from the barrier before (its
        // departure) to its input staged, to its weights landed, to its GEMV done.
        static const char *proj[] = {"qkv", "o_proj", "gate_up", "down"};
        const int before[4] = {-1, per - 4, per - 3, per - 2};  // the barrier ahead of each, in a layer
        fprintf(stderr, "  block 0 in the projections (us): %8s %8s %8s\n", "input", "weights", "gemv");
        for (int j = 0; j < 4; j++) {
            double in = 0, wt = 0, gv = 0;
            for (int l = 0; l < L; l++) {
                const int i = l * per + before[j];
                const unsigned long long from = i < 0 ? start : t[2 * i + 1];
                const unsigned long long *m = t + MEGAKERNEL_TIMELINE_MARK(L, l, j, 0);
                in += (double)(m[0] - from), wt += (double)(m[1] - m[0]), gv += (double)(m[2] - m[1]);
            }
            fprintf(stderr, "    %-30s %8.2f %8.2f %8.2f\n", proj[j], in / L / 1e3, wt / L / 1e3, gv / L / 1e3);
        }
        // Block 0's first attention piece (where the pieces rotate their own
        // queries), from the qkv barrier's departure: started, queries ready,
        // keys and values done, results written; its reduction share done,
        // from the pieces' barrier's departure.
        if (fused && t[MEGAKERNEL_TIMELINE_PIECE(L, 0, 0)]) {
            double at[4] = {0, 0, 0, 0}, red = 0;
            for (int l = 0; l < L; l++) {
                const unsigned long long from = t[2 * (l * per) + 1], *m = t + MEGAKERNEL_TIMELINE_PIECE(L, l, 0);
                for (int k = 0; k < 4; k++) at[k] += (double)(m[k] - from);
                if (reduce_phase) red += (double)(m[4] - t[2 * (l * per + 1) + 1]);
            }
            fprintf(stderr, "  block 0's first piece (us after the qkv barrier): start %.2f, queries %.2f, keys "
                            "%.2f, written %.2f; its reduction share done %.2f after the pieces' barrier\n",
                    at[0] / L / 1e3, at[1] / L / 1e3, at[2] / L / 1e3, at[3] / L / 1e3, red / L / 1e3);
        }
    }
    free(t);
}

static void cuda_destroy(model_runner_t *r) {
    cuda_state_t *s = r->state;
    if (!s) return;
    if (s->d_mk_timeline) megakernel_profile_print(r, s);
    if (s->step_timed > 0)
        fprintf(stderr, "minivllm: %lld graphed decode steps (MV_STEP_TIMES=1): %.1f us a step on the GPU (events "
                "from before the inputs' upload to after the ids' download), %.1f us on the host around the same "
                "calls\n", s->step_timed, 1e3 * s->step_gpu_ms / (double)s->step_timed,
                1e6 * s->step_host_s / (double)s->step_timed);
    if (s->stream2) cudaStreamSynchronize(s->stream2);
    if (s->fork_ev) cudaEventDestroy(s->fork_ev);
    if (s->join_ev) cudaEventDestroy(s->join_ev);
    for (int k = 0; k < 2; k++) {
        if (s->step_ev[k]) cudaEventDestroy(s->step_ev[k]);
        if (s->launch_ev[k]) cudaEventDestroy(s->launch_ev[k]);
    }
    // Free what exists; errors are ignored here (a failed create may leave
    // a sticky error, and there is nothing left to do with one).
    if (s->stream) cudaStreamSynchronize(s->stream);
    for (int k = 0; k < s->num_sizes; k++)
        if (s->graphs[k]) cudaGraphExecDestroy(s->graphs[k]);
#if MV_HAVE_NCCL
    // tp > 1, after the graphs that hold its collectives. Destroy when every
    // rank is leaving together (rank 0's stop, or an agreement every rank
    // saw); abort otherwise, which frees this rank's side without waiting
    // on peers that may never come.
    if (s->nccl) {
        if (tp_comm_settled()) ncclCommDestroy(s->nccl);
        else ncclCommAbort(s->nccl);
    }
#endif
    for (int l = 0; s->layers && l < r->cfg.num_hidden_layers; l++) {
        cuda_layer_t *cl = &s->layers[l];
        void *ps[] = {cl->d_input_norm, cl->d_qkv,    cl->d_qkv_bias, cl->d_q_norm, cl->d_k_norm,   cl->d_o_proj,
                      cl->d_o_bias,     cl->d_post_norm, cl->d_gate_up, cl->d_down,  cl->d_k_cache, cl->d_v_cache};
        for (size_t k = 0; k < sizeof ps / sizeof *ps; k++) cudaFree(ps[k]);
    }
    free(s->layers);
    if (s->d_lm_head != s->d_embed) cudaFree(s->d_lm_head);
    cudaFree(s->d_embed);
    cudaFree(s->d_final_norm);
    rope_cache_gpu_free(&s->rope);
    void *scratch[] = {s->d_residual, s->d_hidden, s->d_x,     s->d_qkv,         s->d_attn,    s->d_gate_up,
                       s->d_act,      s->d_last,   s->d_logits_bf16, s->d_logits, s->d_attn_ws, s->d_step_mem,
                       s->d_cublas_ws, s->d_logits_local, s->d_logits_gathered, s->d_opt_ids, s->d_counts,
                       s->d_raw,       s->d_sample_ws, s->d_mk_layers, s->d_residual2, s->d_mk_barrier, s->d_mk_timeline,
                       s->d_cublas_ws2, s->d_attn_ws2, s->d_tile_ws, s->d_tile_ws2};
    for (size_t k = 0; k < sizeof scratch / sizeof *scratch; k++) cudaFree(scratch[k]);
    for (int k = 0; k < 2; k++)
        if (s->h_stages[k]) cudaFreeHost(s->h_stages[k]);
    if (s->h_opt_ids) cudaFreeHost(s->h_opt_ids);
    if (s->cublas) linear_set_workspace(s->cublas, NULL, 0), cublasDestroy(s->cublas);
    if (s->cublas2) linear_set_workspace(s->cublas2, NULL, 0), cublasDestroy(s->cublas2);
    if (s->stream) cudaStreamDestroy(s->stream);
    if (s->stream2) cudaStreamDestroy(s->stream2);
    free(s);
    r->state = NULL;
}

// Lay step_buffers_t out over `base` (device or pinned host memory of the
// same layout). Returns the bytes the layout takes. Every array starts on
// an 8-byte boundary (the 64-bit seed and gen_index arrays need it).
static size_t layout_step(step_buffers_t *b, char *base, int Tm, int Sm, int W) {
    size_t off = 0;
#define TAKE(field, type, count)                                            \
    do {                                                                    \
        b->field = base ? (type *)(void *)(base + off) : NULL;              \
        off += ((size_t)(count) * sizeof(type) + 7) / 8 * 8;                \
    } while (0)
    TAKE(input_ids, int32_t, Tm);
    TAKE(positions, int32_t, Tm);
    TAKE(slot_mapping, int32_t, Tm);
    TAKE(cu_seqlens_q, int32_t, Sm + 1);
    TAKE(context_lens, int32_t, Sm);
    TAKE(block_tables, int32_t, (size_t)Sm * W);
    TAKE(cu_last, int32_t, Sm + 1);
    TAKE(temperature, float, Sm);
    TAKE(top_k, int32_t, Sm);
    TAKE(top_p, float, Sm);
    TAKE(seed, uint64_t, Sm);
    TAKE(gen_index, int64_t, Sm);
    TAKE(opts, sampling_opts_row_t, Sm);
    TAKE(row_order, int32_t, Sm);
    // The outputs last: a decode step uploads everything before them in one copy.
    TAKE(sampled, int32_t, Sm);
    TAKE(lp, sampling_logprobs_t, Sm);
#undef TAKE
    return off;
}

// Point d and h at the layout a step uses: Sg = 0, a prefill or mixed
// step's (every array at its full size); Sg > 0, a decode step's of Sg rows,
// packed. Only the pointers change; each step uploads its inputs anew.
static void step_views(cuda_state_t *s, int Sg) {
    if (s->step_sg == Sg && s->h_stage == s->h_stages[s->stage]) return;
    s->h_stage = s->h_stages[s->stage];
    const int T = Sg > 0 ? Sg : s->step_tm, S = Sg > 0 ? Sg : s->step_sm;
    layout_step(&s->d, (char *)s->d_step_mem, T, S, s->max_blocks);
    layout_step(&s->h, (char *)s->h_stage, T, S, s->max_blocks);
    s->step_sg = Sg;
}

// The KV cache from what is left of the GPU, vLLM's rule: this engine may
// fill gpu_memory_utilization of the card's *total* memory; what is in use
// now (our weights and scratch, the CUDA context, cuBLAS, and whatever other
// processes hold) comes off that, and the rest is KV blocks:
//     num_blocks = (util * total - (total - free)) / block_bytes
// Measured after everything else is allocated, so the cache gets exactly
// the remainder. (vLLM also runs a dummy forward pass first to measure the
// peak of its activations; ours are all preallocated, so there is nothing
// to measure.)
static int cuda_size_cache(model_runner_t *r, size_t block_bytes) {
    const runner_config_t *rc = &r->rc;
    const int per_seq = (rc->max_model_len + rc->block_size - 1) / rc->block_size;
    size_t free_b = 0, total_b = 0;
    if (CUDA_TRY(cudaMemGetInfo(&free_b, &total_b))) return -1;
    if (rc->num_blocks > 0) return 0;  // given (--num-blocks or --kv-cache-gib): cudaMalloc will say if it fits
    const double util = rc->gpu_memory_utilization > 0 ? rc->gpu_memory_utilization : DEFAULT_GPU_MEMORY_UTILIZATION;
    const double used = (double)(total_b - free_b), budget = util * (double)total_b - used;
    double nb = budget > 0 ? floor(budget / (double)block_bytes) : 0;
    if (nb > INT_MAX / 2) nb = INT_MAX / 2;
    if (nb < per_seq)
        return mv_error("the KV cache gets %.0f bytes (gpu_memory_utilization %.2f x %zu bytes of GPU memory, minus "
                        "%.0f in use: weights %zu, scratch %zu, the CUDA context and other processes): %.0f blocks "
                        "of %d tokens (%zu bytes each), fewer than one sequence of max_model_len %d needs (%d): "
                        "raise --gpu-memory-utilization, lower --max-model-len or --max-num-batched-tokens, or free "
                        "the GPU",
                        budget > 0 ? budget : 0, util, total_b, used, r->weight_bytes, r->scratch_bytes, nb,
                        rc->block_size, block_bytes, rc->max_model_len, per_seq);
    r->rc.num_blocks = (int)nb;
    return 0;
}

// Decode CUDA graphs (defined with the decode step, below).
static int decode_sizes(int Sm, int *sizes);
static int capture_decode_graphs(model_runner_t *r);

// ---- tp > 1: the ranks' device, communicator and cache -----------------------------------

// The GPU this rank takes: its rank on this host, modulo the GPUs visible
// (so `mpirun -np 2` on a host of 2 GPUs gives GPU 0 and GPU 1).
static int tp_device(const model_runner_t *r, int *device) {
    int count = 0;
    if (CUDA_TRY(cudaGetDeviceCount(&count))) return -1;
    if (count < 1) return mv_error("tp rank %d: no CUDA device visible", r->tp.rank);
    *device = tp_comm_launched_local_rank() % count;
    return 0;
}

// K and V bytes of one block on this rank: the model's, scaled to the KV
// heads it holds (all of them at tp 1).
static size_t rank_block_bytes(const model_runner_t *r, const qwen3_layout_t *lo) {
    const size_t full = model_runner_block_bytes(&r->cfg, r->rc.block_size, RUNNER_DEVICE_CUDA);
    if (lo->tp_size == 1) return full;
    return full / (size_t)r->cfg.num_key_value_heads * (size_t)lo->qkv.tp.kv_heads_local;
}

// The most rows a decode step runs in the megakernel. It takes up to 8, but
// from 2 rows the unfused graph, with the tensor-core GEMV on every
// projection, is faster (H100, tokens a second at 2, 3, 4 and 8 rows:
// 1,859, 2,692, 3,537 and 6,305 against the megakernel's 1,696, 1,674,
// 2,139 and 4,167); at one row the megakernel is 24% ahead (chapter 09,
// "The GEMV on every projection up to 8 rows"). MV_MEGAKERNEL_ROWS=N sets it
// to N (1 to 8), to measure and check the megakernel's other sizes.
#define DECODE_MEGAKERNEL_MAX_ROWS 1

static int megakernel_max_rows(void) {
    const char *v = getenv("MV_MEGAKERNEL_ROWS");  // one digit 1 to 8: check_switches refuses anything else
    return v && v[0] >= '1' && v[0] <= '8' && !v[1] ? v[0] - '0' : DECODE_MEGAKERNEL_MAX_ROWS;
}

#define RUNNER_STR_(x) #x
#define RUNNER_STR(x) RUNNER_STR_(x)
// Each switch, the values it takes (one character each) and what they mean.
static const struct {
    const char *name, *values, *takes;
} SWITCHES[] = {
    {"MV_MEGAKERNEL_FUSED_ROPE", "01",
     "0 (the megakernel's q/k norm + RoPE + KV store as a phase of their own) or 1 (inside its attention pieces, the "
     "default)"},
    {"MV_FUSED_ROPE_STORE", "01", "0 (q/k norm + RoPE and the KV store as two kernels) or 1 (one kernel, the default)"},
    {"MV_SPLIT_MIXED", "01",
     "0 (a mixed step's rows all through prefill attention) or 1 (its one-token rows through decode attention, the "
     "default)"},
    {"MV_MEGAKERNEL", "01", "0 (the unfused decode graphs) or 1 (the megakernel, the default)"},
    {"MV_MEGAKERNEL_ROWS", "12345678",
     "1 to 8 (the most rows a decode step runs in the megakernel; default " RUNNER_STR(DECODE_MEGAKERNEL_MAX_ROWS) ")"},
    {"MV_DECODE_ATTENTION", "3467",
     "3, 4, 6 or 7 (the decode attention version; default " RUNNER_STR(ATTN_DECODE_FAST) ")"},
    {"MV_DECODE_PIECES", "048",
     "0 (no pieces for decode attention's band of 2 to 4 blocks a SM), 4 (pieces up to 4 blocks a SM, the default) or "
     "8 (up to 8)"},
    {"MV_LINEAR_GEMV", "23", "2 (the GEMV on fp32 FMAs) or 3 (on the tensor cores, the default)"},
    {"MV_STEP_TIMES", "01",
     "0 (off, the default) or 1 (each graphed decode step timed, the means printed at the end)"},
    {"MV_MEGAKERNEL_SILU", "01",
     "0 (the megakernel's SiluAndMul in down's staging) or 1 (in gate_up's GEMV, the default)"},
    {"MV_MEGAKERNEL_REDUCE", "12", "1 or 2 (the version of the megakernel's split-attention reduction; default 2)"},
    {"MV_MEGAKERNEL_XREG", "01",
     "0 (the megakernel's GEMV reads x from shared memory for every row pair) or 1 (x in registers, the default)"},
    {"MV_MEGAKERNEL_EMBED", "01",
     "0 (the embedding as a kernel of its own before the megakernel) or 1 (the megakernel's first read, the "
     "default)"},
    {"MV_PACKED_UPLOAD", "01", "0 (a decode step's inputs in a copy per array) or 1 (in one copy, the default)"},
    {"MV_SAMPLER", "1234", "1 to 4 (kernels/sampling.h's versions; default " RUNNER_STR(SAMPLING_FAST) ")"},
    {"MV_PDL_EARLY", "01",
     "0 (a kernel in a decode graph starts when the kernel before it has triggered or finished) or 1 (when every "
     "block of the kernel before it has begun, the default)"},
    {"MV_DECODE_ROPE", "01",
     "0 (the decode graphs' q/k norm + RoPE + KV store as a kernel of its own) or 1 (inside decode attention's "
     "pieces in every graph run whole; unset: up to " RUNNER_STR(DECODE_ROPE_MAX_ROWS) " rows)"},
};

// The experiment switches above, MV_LINEAR_GEMV_MAX_M and MV_MEGAKERNEL_GATES
// (decode_megakernel_gates): any other value is refused at creation, naming
// it, rather than read as the default (MV_MEGAKERNEL=off would otherwise
// leave the megakernel on).
static int check_switches(void) {
    for (size_t i = 0; i < sizeof SWITCHES / sizeof *SWITCHES; i++) {
        const char *v = getenv(SWITCHES[i].name);
        if (v && (strlen(v) != 1 || !strchr(SWITCHES[i].values, v[0])))
            return mv_error("%s=%s: it takes %s", SWITCHES[i].name, v, SWITCHES[i].takes);
    }
    if (linear_gemv_max_m_override() == -2)
        return mv_error("MV_LINEAR_GEMV_MAX_M=%s: it takes a number of tokens from 0 to %d (a GEMV up to that many "
                        "on every projection)",
                        getenv("MV_LINEAR_GEMV_MAX_M"), LINEAR_GEMV_MMA_MAX_M);
    if (linear_tile_max_m_override() == -2)
        return mv_error("MV_LINEAR_TILE_MAX_M=%s: it takes a number of tokens from 0 to %d (linear version 4 up to "
                        "that many, past the GEMV's)",
                        getenv("MV_LINEAR_TILE_MAX_M"), LINEAR_TILE_MAX_AUTO_LIMIT);
    int gate[4], gated;
    char why[160];
    if (!decode_megakernel_gates(getenv("MV_MEGAKERNEL_GATES"), gate, &gated, why, sizeof why))
        return mv_error("%s", why);
    return 0;
}

// Weights, RoPE cache, scratch and step buffers: everything a runner holds
// but its KV cache and its graphs (the part that needs no other rank).
// MV_DECODE_HALVES=LO or LO-HI: decode steps (their graph's size) of LO
// rows or more, and at most HI, run as two halves at once; 0 turns it off.
// Unset: DECODE_HALVES_MIN to DECODE_HALVES_MAX.
// Linear version 4's workspace for one handle: enough for this rank's four
// projections at the most tokens linear_cuda gives version 4
// (linear_tile_auto_max_m, at most max_num_batched_tokens); 0 where it
// gives it none. The LM head never splits K (its 64-row tiles are
// thousands), so it needs only the counters, which every size includes.
static size_t tile_workspace_bytes(const model_runner_t *r, const cuda_state_t *s, const runner_config_t *rc) {
    int M = linear_tile_auto_max_m();
    if (M > rc->max_num_batched_tokens) M = rc->max_num_batched_tokens;
    if (M <= 0) return 0;
    const int H = r->cfg.hidden_size, hd = r->cfg.head_dim, qn = r->cfg.num_attention_heads / s->layout.tp_size * hd;
    const int shapes[4][2] = {{s->layout.qkv.rows, H}, {H, qn}, {s->layout.gate_up.rows, H}, {H, s->layout.down.in_local}};
    size_t most = 0;
    for (int i = 0; i < 4; i++) {
        const size_t b = linear_tile_workspace_bytes(M, shapes[i][0], shapes[i][1]);
        if (b > most) most = b;
    }
    return most;
}

static int decode_halves_band(int *lo, int *hi) {
    const char *v = getenv("MV_DECODE_HALVES");
    *lo = DECODE_HALVES_MIN, *hi = DECODE_HALVES_MAX;
    if (!v || !*v) return 0;
    char *end = NULL;
    const long a = strtol(v, &end, 10);
    long b = INT_MAX;
    if (*end == '-') b = strtol(end + 1, &end, 10);
    if (end == v || *end || a < 0 || a > INT_MAX || b < a || b > INT_MAX)
        return mv_error("MV_DECODE_HALVES=%s: expected a number of rows LO or a range LO-HI (0 turns the two halves "
                        "off)", v);
    *lo = (int)a, *hi = (int)b;
    return 0;
}

// The second half's stream, cuBLAS handle, workspaces and the fork and join
// events, when decode steps of max_num_seqs Sm rows could run as two halves.
static int decode_halves_prepare(model_runner_t *r, cuda_state_t *s, int Sm, int nq, int hd) {
    int lo = 0, hi = 0;
    if (decode_halves_band(&lo, &hi)) return -1;
    if (lo == 0 || lo > Sm || hi < 2) return 0;
    if (lo < 2) lo = 2;  // each half needs a row
    size_t *sb = &r->scratch_bytes;
    s->attn_ws2_bytes = attention_decode_workspace_bytes((Sm + 1) / 2, nq, hd, ATTN_DECODE_MAX_SPLITS);
    if (CUDA_TRY(cudaStreamCreateWithFlags(&s->stream2, cudaStreamNonBlocking))) {
        s->stream2 = NULL;
        return -1;
    }
    if (CUDA_TRY(cudaEventCreateWithFlags(&s->fork_ev, cudaEventDisableTiming)) ||
        CUDA_TRY(cudaEventCreateWithFlags(&s->join_ev, cudaEventDisableTiming)))
        return -1;
    cublasStatus_t st = cublasCreate(&s->cublas2);
    if (st != CUBLAS_STATUS_SUCCESS) {
        s->cublas2 = NULL;
        return mv_error("cublasCreate (the second half's handle): %s", cublasGetStatusName(st));
    }
    if (dev_alloc(&s->d_cublas_ws2, CUBLAS_WORKSPACE_BYTES, sb, "the second half's cuBLAS workspace") ||
        (s->tile_ws_bytes &&
         (dev_alloc(&s->d_tile_ws2, s->tile_ws_bytes, sb, "the second half's linear version 4 workspace") ||
          linear_set_workspace(s->cublas2, s->d_tile_ws2, s->tile_ws_bytes))) ||
        dev_alloc(&s->d_attn_ws2, s->attn_ws2_bytes, sb, "the second half's split-decode workspace"))
        return -1;
    st = cublasSetStream(s->cublas2, s->stream2);
    if (st == CUBLAS_STATUS_SUCCESS) st = cublasSetWorkspace(s->cublas2, s->d_cublas_ws2, CUBLAS_WORKSPACE_BYTES);
    if (st != CUBLAS_STATUS_SUCCESS)
        return mv_error("cublasSetStream/cublasSetWorkspace (the second half's handle): %s", cublasGetStatusName(st));
    s->halves_lo = r->halves_rows = lo;
    s->halves_hi = r->halves_max_rows = hi < Sm ? hi : Sm;
    return 0;
}

static int cuda_create_placed(model_runner_t *r, const st_model_t *m) {
    const qwen3_config_t *c = &r->cfg;
    const runner_config_t *rc = &r->rc;
    if (check_switches()) return -1;
    // The attention kernels' shapes (kernels/attention.h): refused here, once,
    // rather than at the first step.
    if (c->head_dim != 64 && c->head_dim != 128)
        return mv_error("head_dim %d: the CUDA attention kernels support 64 and 128 (use --device cpu)", c->head_dim);
    if (rc->block_size < 16 || rc->block_size > 256 || (rc->block_size & (rc->block_size - 1)))
        return mv_error("block_size %d: the CUDA attention kernels take a power of two in [16, 256]",
                        rc->block_size);
    cuda_state_t *s = calloc(1, sizeof *s);
    if (!s) return mv_error("out of host memory");
    r->state = s;
    s->fused_rope_store = !(getenv("MV_FUSED_ROPE_STORE") && !strcmp(getenv("MV_FUSED_ROPE_STORE"), "0"));
    s->split_mixed = !(getenv("MV_SPLIT_MIXED") && !strcmp(getenv("MV_SPLIT_MIXED"), "0"));
    s->pdl_early = !(getenv("MV_PDL_EARLY") && !strcmp(getenv("MV_PDL_EARLY"), "0"));
    const char *dr = getenv("MV_DECODE_ROPE");
    s->decode_rope = !dr ? DECODE_ROPE_MAX_ROWS : !strcmp(dr, "1") ? INT_MAX : 0;
    s->sampling_version = getenv("MV_SAMPLER") ? atoi(getenv("MV_SAMPLER")) : SAMPLING_FAST;
    s->upload_arrays = getenv("MV_PACKED_UPLOAD") && !strcmp(getenv("MV_PACKED_UPLOAD"), "0");
    s->mk_embed = !(getenv("MV_MEGAKERNEL_EMBED") && !strcmp(getenv("MV_MEGAKERNEL_EMBED"), "0"));
    if (getenv("MV_STEP_TIMES") && !strcmp(getenv("MV_STEP_TIMES"), "1") &&
        (CUDA_TRY(cudaEventCreate(&s->step_ev[0])) || CUDA_TRY(cudaEventCreate(&s->step_ev[1]))))
        return -1;
    // This rank's share of every tensor (tp 1: the whole model).
    if (qwen3_layout_init(&s->layout, c, r->tp.size, r->tp.rank)) return -1;
    s->collectives = s->layout.tp_size > 1 || comm_of_one();
    r->no_async_steps = s->collectives;  // cuda_launch_sample runs no collectives
    if (r->tp.size > 1 && tp_device(r, &s->device)) return -1;
    if (CUDA_TRY(cudaSetDevice(s->device)) || CUDA_TRY(cudaStreamCreateWithFlags(&s->stream, cudaStreamNonBlocking)))
        return -1;
    cublasStatus_t st = cublasCreate(&s->cublas);
    if (st != CUBLAS_STATUS_SUCCESS) {
        s->cublas = NULL;
        return mv_error("cublasCreate: %s", cublasGetStatusName(st));
    }
    // Will the model fit? Checked before the first allocation, so that a
    // checkpoint too large for this GPU is refused with the numbers, not
    // after minutes of copying weights (model_runner_memory_estimate is a
    // lower bound on what the allocations below take; at tp > 1, rank 0's
    // share, the largest).
    runner_memory_t est;
    size_t free_b = 0, total_b = 0;
    if (model_runner_memory_estimate(c, rc, &est) || CUDA_TRY(cudaMemGetInfo(&free_b, &total_b))) return -1;
    const size_t one_seq = (size_t)((rc->max_model_len + rc->block_size - 1) / rc->block_size) *
                           rank_block_bytes(r, &s->layout);
    s->tile_ws_bytes = tile_workspace_bytes(r, s, rc);
    const size_t need = est.weight_bytes + est.scratch_bytes + est.rope_bytes + CUBLAS_WORKSPACE_BYTES + s->tile_ws_bytes +
                        (rc->num_blocks ? est.kv_cache_bytes : one_seq);
    if (need > free_b)
        return mv_error("the model needs at least %zu bytes of GPU memory (weights %zu, scratch %zu, KV cache %zu%s); "
                        "the GPU has %zu free of %zu (lower --max-model-len, --max-num-seqs, "
                        "--max-num-batched-tokens or --num-blocks)",
                        need, est.weight_bytes, est.scratch_bytes, rc->num_blocks ? est.kv_cache_bytes : one_seq,
                        rc->num_blocks ? "" : " for one max_model_len sequence", free_b, total_b);
    size_t *sb = &r->scratch_bytes, *wb = &r->weight_bytes;
    if (dev_alloc(&s->d_cublas_ws, CUBLAS_WORKSPACE_BYTES, sb, "the cuBLAS workspace")) return -1;
    // The stream first: cublasSetStream puts the handle back on cuBLAS's own
    // workspace pool, so the workspace is set after it (and linear_cuda
    // leaves the stream alone when it is already this one).
    st = cublasSetStream(s->cublas, s->stream);
    if (st == CUBLAS_STATUS_SUCCESS) st = cublasSetWorkspace(s->cublas, s->d_cublas_ws, CUBLAS_WORKSPACE_BYTES);
    if (st != CUBLAS_STATUS_SUCCESS) return mv_error("cublasSetStream/cublasSetWorkspace: %s", cublasGetStatusName(st));
    if (s->tile_ws_bytes && (dev_alloc(&s->d_tile_ws, s->tile_ws_bytes, sb, "linear version 4's workspace") ||
                             linear_set_workspace(s->cublas, s->d_tile_ws, s->tile_ws_bytes)))
        return -1;

    // Weights.
    qwen3_weights_t w;
    if (qwen3_weights_bind(c, m, &w)) return -1;
    const int L = c->num_hidden_layers;
    bf16_t *h_tmp = malloc(max_numel(&w, &s->layout) * sizeof(bf16_t));
    s->layers = calloc((size_t)L, sizeof *s->layers);
    int rcode = h_tmp && s->layers ? 0 : mv_error("out of host memory converting the weights");
    if (!rcode)
        rcode = place_weights(s, &w, L, c->hidden_size, h_tmp, wb);
    free(h_tmp);
    qwen3_weights_free(&w);
    if (rcode) return -1;

    rope_cache_t host_rope;
    if (model_runner_build_rope(&host_rope, c, rc->max_model_len)) return -1;
    rcode = rope_cache_upload(&s->rope, &host_rope);
    if (!rcode) *sb += sizeof(float) * (size_t)host_rope.max_position * (size_t)host_rope.head_dim;
    rope_cache_free(&host_rope);
    if (rcode) return -1;

    // Scratch for the worst step (this rank's heads and rows; the logits,
    // which only the sampling rank reads, on rank 0 alone).
    const size_t H = (size_t)c->hidden_size, I = (size_t)s->layout.down.in_local;
    const size_t V = s->layout.tp_rank == 0 ? (size_t)c->vocab_size : 0;
    const int nq = c->num_attention_heads / s->layout.tp_size, hd = c->head_dim;
    const size_t qn = (size_t)nq * hd, qkv = (size_t)s->layout.qkv.rows, gate_up = (size_t)s->layout.gate_up.rows;
    const size_t Tm = (size_t)rc->max_num_batched_tokens, Sm = (size_t)rc->max_num_seqs, e = sizeof(bf16_t);
    s->max_blocks = (rc->max_model_len + rc->block_size - 1) / rc->block_size;
    s->attn_ws_bytes = attention_decode_workspace_bytes((int)Sm, nq, hd, ATTN_DECODE_MAX_SPLITS);
    if (dev_alloc((void **)&s->d_residual, Tm * H * e, sb, "the residual stream") ||
        dev_alloc((void **)&s->d_hidden, Tm * H * e, sb, "the normed hidden states") ||
        dev_alloc((void **)&s->d_x, Tm * H * e, sb, "the sublayer outputs") ||
        dev_alloc((void **)&s->d_qkv, Tm * qkv * e, sb, "the QKV projection") ||
        dev_alloc((void **)&s->d_attn, Tm * qn * e, sb, "the attention output") ||
        dev_alloc((void **)&s->d_gate_up, Tm * gate_up * e, sb, "the gate_up projection") ||
        dev_alloc((void **)&s->d_act, Tm * I * e, sb, "the MLP activations") ||
        dev_alloc((void **)&s->d_last, Sm * H * e, sb, "the sampled rows' hidden states") ||
        dev_alloc((void **)&s->d_logits_bf16, Sm * V * e, sb, "the bf16 logits") ||
        dev_alloc((void **)&s->d_logits, Sm * V * sizeof(float), sb, "the fp32 logits") ||
        dev_alloc(&s->d_attn_ws, s->attn_ws_bytes, sb, "the split-decode workspace"))
        return -1;
    if (!s->collectives && decode_halves_prepare(r, s, (int)Sm, nq, hd)) return -1;
    // The options' buffers (V is 0 off rank 0). A row's ids: its whole
    // sequence (at most max_model_len) and its min_tokens stop ids.
    s->opt_ids_cap = V ? (int)(Sm * (size_t)(rc->max_model_len + OPT_STOP_IDS)) : 0;
    if (dev_alloc((void **)&s->d_opt_ids, (size_t)s->opt_ids_cap * sizeof(int32_t), sb, "the sampling options' ids") ||
        dev_alloc((void **)&s->d_counts, Sm * V * sizeof(uint32_t), sb, "the penalties' counts") ||
        dev_alloc((void **)&s->d_raw, Sm * V * sizeof(float), sb, "the raw logits of option rows") ||
        (s->d_counts && CUDA_TRY(cudaMemsetAsync(s->d_counts, 0, Sm * V * sizeof(uint32_t), s->stream))))
        return -1;
    s->sample_ws_bytes = V ? sample_tokens_ws_bytes(s->sampling_version, (int)Sm) : 0;
    if (dev_alloc(&s->d_sample_ws, s->sample_ws_bytes, sb, "the sampler's workspace") ||
        (s->d_sample_ws && CUDA_TRY(cudaMemsetAsync(s->d_sample_ws, 0, s->sample_ws_bytes, s->stream))))
        return -1;
    if (s->opt_ids_cap && CUDA_TRY(cudaMallocHost((void **)&s->h_opt_ids, (size_t)s->opt_ids_cap * sizeof(int32_t)))) {
        s->h_opt_ids = NULL;
        return -1;
    }
    if (s->collectives) {
        const size_t Vl = (size_t)s->layout.vocab.local_rows, N = (size_t)s->layout.tp_size;
        if (dev_alloc((void **)&s->d_logits_local, Sm * Vl * e, sb, "this rank's logits") ||
            dev_alloc((void **)&s->d_logits_gathered, N * Sm * Vl * e, sb, "every rank's logits"))
            return -1;
    }
    // Room for both layouts: the full one, and the packed decode one at Sm rows.
    const size_t full = layout_step(&s->d, NULL, (int)Tm, (int)Sm, s->max_blocks);
    const size_t packed = layout_step(&s->d, NULL, (int)Sm, (int)Sm, s->max_blocks);
    s->step_bytes = full > packed ? full : packed;
    if (dev_alloc(&s->d_step_mem, s->step_bytes, sb, "the step's inputs")) return -1;
    for (int k = 0; k < 2; k++) {
        if (CUDA_TRY(cudaMallocHost(&s->h_stages[k], s->step_bytes))) {
            s->h_stages[k] = NULL;
            return -1;
        }
        if (CUDA_TRY(cudaEventCreateWithFlags(&s->launch_ev[k], cudaEventDisableTiming))) {
            s->launch_ev[k] = NULL;
            return -1;
        }
    }
    s->step_tm = (int)Tm, s->step_sm = (int)Sm;
    s->step_sg = -1;
    step_views(s, 0);
    return 0;
}

// The KV cache, per layer, of r->rc.num_blocks blocks of this rank's KV heads.
static int cuda_alloc_cache(model_runner_t *r) {
    cuda_state_t *s = r->state;
    const qwen3_config_t *c = &r->cfg;
    const size_t nkv = (size_t)s->layout.qkv.tp.kv_heads_local, hd = (size_t)c->head_dim, e = sizeof(bf16_t);
    const size_t cache = (size_t)r->rc.num_blocks * (size_t)r->rc.block_size * nkv * hd * e;
    for (int l = 0; l < c->num_hidden_layers; l++) {
        cuda_layer_t *cl = &s->layers[l];
        if (dev_alloc((void **)&cl->d_k_cache, cache, &r->kv_cache_bytes, "the K cache") ||
            dev_alloc((void **)&cl->d_v_cache, cache, &r->kv_cache_bytes, "the V cache")) {
            return mv_error_prefix("layer %d (%d blocks: lower --num-blocks or --gpu-memory-utilization)", l,
                                   r->rc.num_blocks);
        }
        // Zeros, not whatever was there: a decode step's padding rows read
        // one key of block 0, and must find finite values.
        if (CUDA_TRY(cudaMemsetAsync(cl->d_k_cache, 0, cache, s->stream)) ||
            CUDA_TRY(cudaMemsetAsync(cl->d_v_cache, 0, cache, s->stream)))
            return -1;
    }
    return 0;
}

static int cuda_create_tp(model_runner_t *r, int placed_rc);

static int cuda_create(model_runner_t *r, const st_model_t *m) {
    const int placed = cuda_create_placed(r, m);
    const cuda_state_t *sp = r->state;
    if (r->tp.size > 1 || (sp && sp->collectives)) return cuda_create_tp(r, placed);
    if (placed) return -1;
    cuda_state_t *s = r->state;
    const runner_config_t *rc = &r->rc;
    // The KV cache last: it gets what is left.
    const size_t block_bytes = model_runner_block_bytes(&r->cfg, rc->block_size, RUNNER_DEVICE_CUDA);
    if (cuda_size_cache(r, block_bytes) || cuda_alloc_cache(r)) return -1;
    s->num_sizes = decode_sizes(rc->max_num_seqs, s->sizes);
    if (!rc->enforce_eager && capture_decode_graphs(r)) return -1;
    return CUDA_TRY(cudaDeviceSynchronize());
}

// Copy n int32/float/... values of a step array into its fixed device
// buffer, through the pinned staging buffer (an asynchronous copy from
// pinned memory: the host does not wait for it).
static int stage(const cuda_state_t *s, void *d_dst, void *h_dst, const void *src, size_t bytes, const char *what) {
    if (bytes == 0) return 0;
    memcpy(h_dst, src, bytes);
    cudaError_t err = cudaMemcpyAsync(d_dst, h_dst, bytes, cudaMemcpyHostToDevice, s->stream);
    if (err != cudaSuccess)
        return mv_error("cudaMemcpyAsync of the step's %s (%zu bytes): %s", what, bytes, cudaGetErrorName(err));
    return 0;
}

static int upload_step(const model_runner_t *r, cuda_state_t *s, const runner_step_t *in) {
    const int T = in->num_tokens, S = in->num_seqs, N = in->num_sample, W = in->max_blocks_per_seq;
    if (W > s->max_blocks)
        return mv_error("the step's block tables are %d wide; the device's hold %d (max_model_len %d / block_size %d)",
                        W, s->max_blocks, r->rc.max_model_len, r->rc.block_size);
    step_views(s, 0);
    // The device block table is [S, s->max_blocks]: rows are repacked to
    // that fixed width (the scheduler's is ceil(max_model_len / block_size),
    // the same, so this is one memcpy per row at most).
    for (int q = 0; q < S; q++) {
        int32_t *row = s->h.block_tables + (size_t)q * s->max_blocks;
        memcpy(row, in->block_tables + (size_t)q * W, (size_t)W * sizeof(int32_t));
        for (int j = W; j < s->max_blocks; j++) row[j] = -1;
    }
    s->h.cu_last[0] = 0;
    for (int k = 0; k < N; k++) s->h.cu_last[k + 1] = in->sample_token_index[k] + 1;
    const size_t i4 = sizeof(int32_t);
    if (stage(s, s->d.input_ids, s->h.input_ids, in->input_ids, (size_t)T * i4, "input_ids") ||
        stage(s, s->d.positions, s->h.positions, in->positions, (size_t)T * i4, "positions") ||
        stage(s, s->d.slot_mapping, s->h.slot_mapping, in->slot_mapping, (size_t)T * i4, "slot_mapping") ||
        stage(s, s->d.cu_seqlens_q, s->h.cu_seqlens_q, in->cu_seqlens_q, (size_t)(S + 1) * i4, "cu_seqlens_q") ||
        stage(s, s->d.context_lens, s->h.context_lens, in->context_lens, (size_t)S * i4, "context_lens"))
        return -1;
    // These two were written into the staging buffer in place above.
    cudaError_t err = cudaMemcpyAsync(s->d.block_tables, s->h.block_tables, (size_t)S * s->max_blocks * i4,
                                      cudaMemcpyHostToDevice, s->stream);
    if (err == cudaSuccess)
        err = cudaMemcpyAsync(s->d.cu_last, s->h.cu_last, (size_t)(N + 1) * i4, cudaMemcpyHostToDevice, s->stream);
    if (err != cudaSuccess)
        return mv_error("cudaMemcpyAsync of the step's block tables / sampled rows: %s", cudaGetErrorName(err));
    return 0;
}

// The options' rows [0, n) (sp's, or all off) and their ids into the device
// buffers; with `rows_later`, the rows only into the staging buffer (a
// decode step's one copy takes them up with the rest).
static int upload_opts(cuda_state_t *s, const runner_sampling_t *sp, int n_real, int n, int rows_later) {
    const int with = sp && sp->opts;
    for (int k = 0; k < n; k++) s->h.opts[k] = with && k < n_real ? sp->opts[k] : sampler_opts_off();
    if (with && sp->num_opt_ids > s->opt_ids_cap)
        return mv_error("the step's %d sampling-option ids pass the device's %d", sp->num_opt_ids, s->opt_ids_cap);
    const cudaError_t err =
        rows_later ? cudaSuccess
                   : cudaMemcpyAsync(s->d.opts, s->h.opts, (size_t)n * sizeof(sampling_opts_row_t),
                                     cudaMemcpyHostToDevice, s->stream);
    if (err != cudaSuccess) return mv_error("cudaMemcpyAsync of the step's sampling options: %s", cudaGetErrorName(err));
    return (with && stage(s, s->d_opt_ids, s->h_opt_ids, sp->opt_ids, (size_t)sp->num_opt_ids * sizeof(int32_t),
                          "sampling options' ids"));
}

static int upload_sampling(cuda_state_t *s, const runner_sampling_t *sp, int N) {
    step_views(s, 0);
    return (sp->opts && upload_opts(s, sp, N, N, 0)) ||
           stage(s, s->d.temperature, s->h.temperature, sp->temperature, (size_t)N * sizeof(float), "temperature") ||
           stage(s, s->d.top_k, s->h.top_k, sp->top_k, (size_t)N * sizeof(int32_t), "top_k") ||
           stage(s, s->d.top_p, s->h.top_p, sp->top_p, (size_t)N * sizeof(float), "top_p") ||
           stage(s, s->d.seed, s->h.seed, sp->seed, (size_t)N * sizeof(uint64_t), "seed") ||
           stage(s, s->d.gen_index, s->h.gen_index, sp->gen_index, (size_t)N * sizeof(int64_t), "gen_index");
}

// tp > 1: the collectives of a step, on the rank's stream (so they are
// ordered with its kernels, and a decode graph captures them with the rest).
// bf16 in and out: NCCL adds in the type it is given, so a row-parallel
// layer's partial sums are rounded to bf16 before they are added (the CPU
// backend adds fp32: the reason tp = N matches tp = 1 within bf16 noise,
// not bit for bit, on this backend).
#if MV_HAVE_NCCL
static int tp_allreduce_sum(cuda_state_t *s, bf16_t *d_buf, size_t n, const char *after) {
    if (NCCL_TRY(ncclAllReduce(d_buf, d_buf, n, ncclBfloat16, ncclSum, s->nccl, s->stream)))
        return mv_error_prefix("the all-reduce after %s", after);
    return 0;
}

// Every rank's [n] into recv [tp, n], rank-major: the LM head's vocabulary blocks.
static int tp_allgather(cuda_state_t *s, const bf16_t *d_send, bf16_t *d_recv, size_t n) {
    if (NCCL_TRY(ncclAllGather(d_send, d_recv, n, ncclBfloat16, s->nccl, s->stream)))
        return mv_error_prefix("the LM head's all-gather");
    return 0;
}
#else
static int tp_allreduce_sum(cuda_state_t *s, bf16_t *d_buf, size_t n, const char *after) {
    return mv_error("the all-reduce after %s: this minivllm was built without NCCL", after);
}

static int tp_allgather(cuda_state_t *s, const bf16_t *d_send, bf16_t *d_recv, size_t n) {
    return mv_error("the LM head's all-gather: this minivllm was built without NCCL");
}
#endif

// The decode attention version (kernels/attention.h): ATTN_DECODE_FAST, or
// MV_DECODE_ATTENTION=3, 4, 6 or 7, to measure what each version changes
// (docs/09-engine.md). Read once.
static int decode_attention_version(void) {
    static int version = 0;
    if (!version) {
        const char *v = getenv("MV_DECODE_ATTENTION");
        version = v && !strcmp(v, "3")   ? 3
                  : v && !strcmp(v, "4") ? 4
                  : v && !strcmp(v, "6") ? 6
                  : v && !strcmp(v, "7") ? 7
                                         : ATTN_DECODE_FAST;
    }
    return version;
}

// The rows one chain of kernels runs: the whole step (row0 0, every token
// and row, on s->stream), or one half of a decode step of two halves at
// once (cuda_state_t.halves_lo), on its own stream and cuBLAS handle.
// Every activation buffer is [tokens, width] row-major and every step array
// per token or per row, so a half is the same buffers from row row0 on.
typedef struct {
    cudaStream_t stream;
    cublasHandle_t cublas;
    int row0;                 // its first token and row (0 unless a decode step's second half)
    int T, S;                 // its tokens and rows
    void *attn_ws;            // the split decode's partials of its rows
    size_t attn_ws_bytes;
    int half;                 // 1: one of two halves of a decode step
} rows_part_t;

// One decoder layer over a part's T tokens (see the list at the top).
// decode_rows: how many rows, from the first, have one query token each
// (all S in a decode step; in a mixed step the running rows ahead of the
// prompts, as the scheduler orders them).
static int cuda_layer(const model_runner_t *r, cuda_state_t *s, const cuda_layer_t *cl, const rows_part_t *p,
                      int max_seqlen_q, int max_context_len, int decode_rows) {
    const qwen3_config_t *c = &r->cfg;
    const runner_config_t *rc = &r->rc;
    const qwen3_merged_t *qkv = &s->layout.qkv;
    // This rank's heads and I/N columns (at tp 1 the model's own counts).
    const int T = p->T, S = p->S, H = c->hidden_size, I = s->layout.down.in_local, hd = c->head_dim;
    const int nq = c->num_attention_heads / s->layout.tp_size, nkv = qkv->tp.kv_heads_local;
    const int qn = nq * hd, qkv_n = qkv->rows, nb = rc->num_blocks, bs = rc->block_size, gu = s->layout.gate_up.rows;
    const int tp = s->collectives;
    // o_proj's bias is added once: by rank 0, into its partial sum.
    const bf16_t *o_bias = s->layout.tp_rank == 0 ? cl->d_o_bias : NULL;
    // A qkv output row's k and v columns are the merged weight's k and v rows.
    const int k_col = qkv->piece[QWEN3_PART_K].dst_row, v_col = qkv->piece[QWEN3_PART_V].dst_row;
    const float eps = (float)c->rms_norm_eps, scale = 1.0f / sqrtf((float)hd);
    cudaStream_t st = p->stream;
    cublasHandle_t cb = p->cublas;
    const step_buffers_t *d = &s->d;
    // This part's rows of the activations and of the step's arrays.
    const size_t r0 = (size_t)p->row0;
    bf16_t *hidden = s->d_hidden + r0 * H, *residual = s->d_residual + r0 * H, *x = s->d_x + r0 * H;
    bf16_t *qkv_out = s->d_qkv + r0 * qkv_n, *attn = s->d_attn + r0 * qn, *gate_up = s->d_gate_up + r0 * gu;
    bf16_t *act = s->d_act + r0 * I;
    const int32_t *positions = d->positions + r0, *slots = d->slot_mapping + r0, *ctx = d->context_lens + r0;
    const int32_t *tables = d->block_tables + r0 * s->max_blocks;

    // q/k norm + RoPE and the KV store in one kernel where the qkv row is
    // [q | k | v] (it is, for every tp: qwen3_layout), the same bits as the
    // two kernels (kernels/rope.h); unless MV_FUSED_ROPE_STORE=0.
    const int merged = k_col == nq * hd && v_col == (nq + nkv) * hd && qkv_n == (nq + 2 * nkv) * hd;
    if (linear_cuda(cb, qkv_out, hidden, cl->d_qkv, cl->d_qkv_bias, T, qkv_n, H, st)) return -1;
    // A graphed decode step (every row one token) of up to decode_rope rows,
    // run whole: q/k norm, RoPE and the store inside decode attention's
    // pieces, below. (The graph of 16 rows runs as two halves of 8, where
    // the one kernel measured slower: docs/09-engine.md.)
    const attention_decode_rope_t rope = {cl->d_q_norm, cl->d_k_norm, positions, &s->rope, slots, eps};
    const int rope_in_attn = S <= s->decode_rope && !p->half && s->fast_decode && T == S && merged &&
                             attention_decode_rope_fused(decode_attention_version(), qkv_out, &rope, cl->d_k_cache,
                                                         cl->d_v_cache, nq, nkv, hd);
    if (rope_in_attn) {
        // nothing here: attention_decode_rope_cuda below
    } else if (merged && s->fused_rope_store) {
        if (qk_norm_rope_store_cuda(qkv_out, cl->d_q_norm, cl->d_k_norm, positions, &s->rope, cl->d_k_cache,
                                    cl->d_v_cache, slots, T, nq, nkv, hd, eps, bs, nb, st))
            return -1;
    } else if (qk_norm_rope_cuda(ROPE_FAST, qkv_out, cl->d_q_norm, cl->d_k_norm, positions, &s->rope, T, nq, nkv, hd,
                                 eps, st) ||
               store_kvcache_cuda(KV_STORE_FAST, qkv_out + k_col, qkv_n, qkv_out + v_col, qkv_n, cl->d_k_cache,
                                  cl->d_v_cache, slots, T, nkv, hd, bs, nb, st)) {
        return -1;
    }
    // Rows of one query token (the first Sd, tokens 0 .. Sd-1) go to decode
    // attention, which reads each kv head's keys once for its whole GQA group
    // at the copy rate; the prompts' rows after them to prefill attention,
    // whose tiles of 128 queries a one-token row would leave nearly empty
    // (docs/09-engine.md, "Mixed steps"). Both write their rows of d_attn;
    // the prefill launch takes the remaining rows' slices of the step's
    // arrays (cu_seqlens_q holds absolute token offsets: only the whole
    // step, row0 0, has prompts).
    const int Sd = T == S ? S : s->split_mixed ? decode_rows : 0;
    // A graphed decode step's rows longest first (upload_decode), for
    // version 7; an eager step, a half or a mixed step keeps the rows' own
    // order (the same bits: chapter 07 checks version 7 in any order).
    const int32_t *order = s->fast_decode && !p->half && T == S ? d->row_order : NULL;
    int rca = Sd > 0 && (rope_in_attn ? attention_decode_rope_cuda(decode_attention_version(), 0, attn, qkv_out, &rope,
                                                                   cl->d_k_cache, cl->d_v_cache, ctx, tables, order,
                                                                   Sd, max_context_len, nq, nkv, hd, bs, nb,
                                                                   s->max_blocks, scale, p->attn_ws, p->attn_ws_bytes,
                                                                   st)
                                      : attention_decode_cuda(decode_attention_version(), 0, attn, qkv_out, qkv_n,
                                                              cl->d_k_cache, cl->d_v_cache, ctx, tables, order, Sd,
                                                              max_context_len, nq, nkv, hd, bs, nb, s->max_blocks,
                                                              scale, p->attn_ws, p->attn_ws_bytes, st));
    if (!rca && Sd < S)
        rca = p->row0 != 0 ? mv_error("a part of a step from row %d holds prompts", p->row0)
                           : attention_prefill_cuda(ATTN_PREFILL_FAST, attn, qkv_out, qkv_n, cl->d_k_cache,
                                                    cl->d_v_cache, d->cu_seqlens_q + Sd, ctx + Sd,
                                                    tables + (size_t)Sd * s->max_blocks, S - Sd, max_seqlen_q, nq, nkv,
                                                    hd, bs, nb, s->max_blocks, scale, st);
    if (rca || linear_cuda(cb, x, attn, cl->d_o_proj, o_bias, T, H, qn, st) ||
        (tp && tp_allreduce_sum(s, x, (size_t)T * H, "o_proj")))
        return -1;

    if (fused_add_rmsnorm_cuda(RMSNORM_FAST, hidden, residual, x, cl->d_post_norm, T, H, eps, st) ||
        linear_cuda(cb, gate_up, hidden, cl->d_gate_up, NULL, T, gu, H, st))
        return -1;
    // The graphs' decode steps fold SiluAndMul into the down projection's
    // GEMV where linear_cuda would run the GEMV anyway: one launch and one
    // [T, I] round trip less, the same bits.
    const int down_v = linear_auto_version(cb, act, cl->d_down, T, H, I);
    if (s->fast_decode && T == S && (down_v == LINEAR_GEMV || down_v == LINEAR_GEMV_MMA)) {
        if (linear_silu_mul_cuda(x, gate_up, cl->d_down, T, H, I, st)) return -1;
    } else if (s->fast_decode && T == S && down_v == LINEAR_TILE) {
        if (linear_silu_mul_tile_cuda(cb, x, gate_up, cl->d_down, T, H, I, st)) return -1;
    } else if (silu_and_mul_cuda(SILU_AND_MUL_FAST, act, gate_up, T, I, st) ||
               linear_cuda(cb, x, act, cl->d_down, NULL, T, H, I, st)) {
        return -1;
    }
    return tp ? tp_allreduce_sum(s, x, (size_t)T * H, "down_proj") : 0;
}

// tp > 1: the LM head on this rank's vocabulary rows, every rank's block
// gathered, and on rank 0 (the one that samples) the blocks put in their
// columns of [N, V] (chapter 04's assembly, padding dropped): the bf16
// logits the single-GPU LM head leaves.
static int lm_head_tp(const model_runner_t *r, cuda_state_t *s, const bf16_t *last, int N) {
    const vocab_shard_t *vs = &s->layout.vocab;
    const int H = r->cfg.hidden_size, Vl = vs->local_rows;
    if (linear_cuda(s->cublas, s->d_logits_local, last, s->d_lm_head, NULL, N, Vl, H, s->stream) ||
        tp_allgather(s, s->d_logits_local, s->d_logits_gathered, (size_t)N * Vl))
        return -1;
    if (s->layout.tp_rank != 0) return 0;
    return vocab_assemble_logits_cuda(vs, s->d_logits_gathered, N, s->d_logits_bf16, s->stream);
}

static int decode_size_index(const cuda_state_t *s, int S);

// The megakernel's arguments: the model, the cache, the step's device
// arrays and the scratch buffers (the same ones the unfused layers use).
static void megakernel_args_fill(const model_runner_t *r, const cuda_state_t *s, megakernel_args_t *a,
                                 int max_context_len) {
    const qwen3_config_t *c = &r->cfg;
    memset(a, 0, sizeof *a);
    a->num_layers = c->num_hidden_layers;
    a->hidden = c->hidden_size;
    a->intermediate = s->layout.down.in_local;
    a->num_heads = c->num_attention_heads;
    a->num_kv_heads = c->num_key_value_heads;
    a->head_dim = c->head_dim;
    a->eps = (float)c->rms_norm_eps;
    a->d_layers = s->d_mk_layers;
    a->final_norm = s->d_final_norm;
    a->cos_sin = s->rope.d_cos_sin;
    a->max_position = s->rope.max_position;
    a->block_size = r->rc.block_size;
    a->num_blocks = r->rc.num_blocks;
    a->max_blocks = s->max_blocks;
    a->positions = s->d.positions;
    a->slot_mapping = s->d.slot_mapping;
    a->context_lens = s->d.context_lens;
    a->block_tables = s->d.block_tables;
    a->max_context_len = max_context_len;
    a->residual = s->d_residual;
    a->residual2 = s->d_residual2;
    a->hidden_out = s->d_hidden;
    a->qkv = s->d_qkv;
    a->attn = s->d_attn;
    a->x = s->d_x;
    a->gate_up = s->d_gate_up;
    a->attn_ws = (float *)s->d_attn_ws;
    a->attn_ws_bytes = s->attn_ws_bytes;
    a->barrier = s->d_mk_barrier;
    a->timeline = s->d_mk_timeline;
}

// The decode megakernel is on unless MV_MEGAKERNEL=0 (the unfused graphs,
// for comparison: docs/09-engine.md, "A decode megakernel").
static int megakernel_wanted(void) {
    const char *v = getenv("MV_MEGAKERNEL");
    return !(v && !strcmp(v, "0"));
}

// Which decode sizes the megakernel takes (at creation, before capture):
// its buffers, the layers' pointers on the device, and the check of
// decode_megakernel_applies for each size. Sets r->megakernel_rows and,
// for the first size it does not take, r->megakernel_why.
static int megakernel_prepare(model_runner_t *r) {
    cuda_state_t *s = r->state;
    const int L = r->cfg.num_hidden_layers, H = r->cfg.hidden_size;
    r->megakernel_rows = 0;
    snprintf(r->megakernel_why, sizeof r->megakernel_why, "%s",
             s->collectives ? "tensor parallel" : !megakernel_wanted() ? "MV_MEGAKERNEL=0 turned it off" : "");
    if (s->collectives || !megakernel_wanted()) return 0;
    megakernel_layer_t *h = calloc((size_t)L, sizeof *h);
    if (!h) return mv_error("out of host memory for the megakernel's layer table");
    for (int l = 0; l < L; l++) {
        const cuda_layer_t *cl = &s->layers[l];
        h[l] = (megakernel_layer_t){cl->d_qkv,        cl->d_o_proj,    cl->d_gate_up, cl->d_down,
                                    cl->d_input_norm, cl->d_post_norm, cl->d_q_norm,  cl->d_k_norm,
                                    cl->d_k_cache,    cl->d_v_cache};
    }
    // Biases (not Qwen3's) leave every size to the unfused layers.
    int biased = 0;
    for (int l = 0; l < L; l++) biased |= s->layers[l].d_qkv_bias || s->layers[l].d_o_bias;
    if (biased) {
        free(h);
        snprintf(r->megakernel_why, sizeof r->megakernel_why, "the model has biases");
        return 0;
    }
    size_t *sb = &r->scratch_bytes;
    if (dev_alloc((void **)&s->d_mk_layers, (size_t)L * sizeof *h, sb, "the megakernel's layer table") ||
        dev_alloc((void **)&s->d_residual2, (size_t)8 * H * sizeof(bf16_t), sb, "the megakernel's residual") ||
        dev_alloc((void **)&s->d_mk_barrier, 64, sb, "the megakernel's barrier") ||
        CUDA_TRY(cudaMemset(s->d_mk_barrier, 0, 64)) ||  // each launch leaves its counters zero again
        (getenv("MV_MEGAKERNEL_PROFILE") && !strcmp(getenv("MV_MEGAKERNEL_PROFILE"), "1") &&
         dev_alloc((void **)&s->d_mk_timeline, sizeof(unsigned long long) * MEGAKERNEL_TIMELINE_WORDS(L), sb,
                   "the megakernel's profile")) ||
        CUDA_TRY(cudaMemcpy(s->d_mk_layers, h, (size_t)L * sizeof *h, cudaMemcpyHostToDevice))) {
        free(h);
        return -1;
    }
    megakernel_args_t a;
    megakernel_args_fill(r, s, &a, r->rc.max_model_len);
    const int max_rows = megakernel_max_rows();
    for (int k = 0, from_one = 1; k < s->num_sizes; k++) {
        char why[sizeof r->megakernel_why] = "";
        const int ok = s->sizes[k] <= max_rows &&
                       decode_megakernel_applies(&a, &h[0], s->sizes[k], why, sizeof why);
        s->megakernel[k] = ok;
        if (ok && from_one) r->megakernel_rows = s->sizes[k];
        if (!ok) from_one = 0;
        if (!ok && !r->megakernel_why[0])
            snprintf(r->megakernel_why, sizeof r->megakernel_why, "at %d rows: %s", s->sizes[k],
                     s->sizes[k] > max_rows ? "more rows than it is faster at (MV_MEGAKERNEL_ROWS)" : why);
    }
    free(h);
    return 0;
}

// 1 when a decode step of S rows runs as two halves at once (halves_lo to
// halves_hi rows, never with collectives).
static int runs_as_halves(const cuda_state_t *s, int S) {
    return s->halves_lo > 0 && !s->collectives && S >= s->halves_lo && S <= s->halves_hi;
}

// The whole forward pass of a step of T tokens, S rows and N sampled rows,
// enqueued from the fixed device buffers alone: no host value of the step
// but these sizes and the attention bounds enters a launch, so the same call
// can be captured into a CUDA graph. The bf16 logits of the sampled rows are
// left in s->d_logits_bf16. Nothing waits for the GPU here.
static int enqueue_forward(model_runner_t *r, int T, int S, int N, int max_seqlen_q, int max_context_len,
                           int decode_rows) {
    cuda_state_t *s = r->state;
    const qwen3_config_t *c = &r->cfg;
    const int H = c->hidden_size, V = c->vocab_size;
    const float eps = (float)c->rms_norm_eps;
    const int k = s->fast_decode && T == S && N == S ? decode_size_index(s, S) : -1;
    if (k >= 0 && s->sizes[k] == S && s->megakernel[k]) {
        // The decode megakernel: every layer and the final norm in one kernel.
        megakernel_args_t a;
        megakernel_args_fill(r, s, &a, max_context_len);
        // The embedding as the megakernel's first read (MV_MEGAKERNEL_EMBED=0: its own kernel).
        // Every row is sampled (T == N): the LM head reads the final norm's rows as they are.
        if (s->mk_embed) a.input_ids = s->d.input_ids, a.embed = s->d_embed, a.vocab = V;
        if ((!s->mk_embed && embedding_cuda(s->d_residual, s->d.input_ids, s->d_embed, T, H, 0, V, s->stream)) ||
            decode_megakernel_cuda(&a, S, s->stream) ||
            linear_cuda(s->cublas, s->d_logits_bf16, s->d_hidden, s->d_lm_head, NULL, N, V, H, s->stream))
            return mv_error_prefix("the decode megakernel's step of %d rows", S);
        return 0;
    }
    if (s->collectives) {
        // Each rank's rows of the ids it holds, zeros for the others'; the
        // all-reduce adds the one non-zero row of each token to every rank.
        const vocab_shard_t *vs = &s->layout.vocab;
        if (embedding_cuda(s->d_residual, s->d.input_ids, s->d_embed, T, H, vs->start, vs->start + vs->local_rows,
                           s->stream) ||
            tp_allreduce_sum(s, s->d_residual, (size_t)T * H, "the embedding"))
            return -1;
    } else if (embedding_cuda(s->d_residual, s->d.input_ids, s->d_embed, T, H, 0, V, s->stream)) {
        return -1;
    }
    // The whole step as one chain of kernels, or a decode step of
    // halves_lo to halves_hi rows as two halves at once: the second half's
    // chain on stream2, forked here (after the embedding) and joined before
    // the final norm. The kernel after a fork or a join is launched without
    // PDL: it waits for all of the other stream's work, not for one kernel.
    rows_part_t parts[2] = {{s->stream, s->cublas, 0, T, S, s->d_attn_ws, s->attn_ws_bytes, 0}};
    int num_parts = 1;
    const int pdl = mv_pdl_enabled();
    if (T == S && runs_as_halves(s, S)) {
        const int h = S / 2;
        parts[0].T = parts[0].S = h;
        parts[0].half = 1;
        parts[1] = (rows_part_t){s->stream2, s->cublas2, h, S - h, S - h, s->d_attn_ws2, s->attn_ws2_bytes, 1};
        num_parts = 2;
        if (CUDA_TRY(cudaEventRecord(s->fork_ev, s->stream)) || CUDA_TRY(cudaStreamWaitEvent(s->stream2, s->fork_ev, 0)))
            return mv_error_prefix("forking a decode step of %d rows into two halves", S);
    }
    for (int part = 0; part < num_parts; part++) {
        const rows_part_t *p = &parts[part];
        const size_t o = (size_t)p->row0 * H;
        if ((part > 0 && pdl && mv_pdl_set(0)) ||
            rmsnorm_cuda(RMSNORM_FAST, s->d_hidden + o, s->d_residual + o, s->layers[0].d_input_norm, p->T, H, eps,
                         p->stream) ||
            (part > 0 && pdl && mv_pdl_set(1)))
            return -1;
    }
    // Layer by layer, each part in turn: launched eagerly, neither half
    // waits behind all of the other's launches.
    for (int l = 0; l < c->num_hidden_layers; l++) {
        for (int part = 0; part < num_parts; part++) {
            const rows_part_t *p = &parts[part];
            const size_t o = (size_t)p->row0 * H;
            if ((l > 0 && fused_add_rmsnorm_cuda(RMSNORM_FAST, s->d_hidden + o, s->d_residual + o, s->d_x + o,
                                                 s->layers[l].d_input_norm, p->T, H, eps, p->stream)) ||
                cuda_layer(r, s, &s->layers[l], p, max_seqlen_q, max_context_len, decode_rows))
                return mv_error_prefix("layer %d", l);
        }
    }
    if (num_parts == 2 &&
        (CUDA_TRY(cudaEventRecord(s->join_ev, s->stream2)) || CUDA_TRY(cudaStreamWaitEvent(s->stream, s->join_ev, 0))))
        return mv_error_prefix("joining the two halves of a decode step of %d rows", S);
    if (N == 0) return 0;
    // The sampled rows' hidden states: when every token is sampled (T == N:
    // a decode step, each row one token, cu_last 0, 1, ..., N), the final
    // norm's rows themselves, with no gather.
    const bf16_t *last = T == N ? s->d_hidden : s->d_last;
    if ((num_parts == 2 && pdl && mv_pdl_set(0)) ||
        fused_add_rmsnorm_cuda(RMSNORM_FAST, s->d_hidden, s->d_residual, s->d_x, s->d_final_norm, T, H, eps,
                               s->stream) ||
        (num_parts == 2 && pdl && mv_pdl_set(1)) ||
        (T != N && gather_last_tokens_cuda(s->d_last, s->d_hidden, s->d.cu_last, N, H, s->stream)))
        return -1;
    if (s->collectives) return lm_head_tp(r, s, last, N);
    return linear_cuda(s->cublas, s->d_logits_bf16, last, s->d_lm_head, NULL, N, V, H, s->stream);
}

// Inputs up, then the forward pass (any step: prefill, decode, mixed).
static int cuda_forward(model_runner_t *r, const runner_step_t *in) {
    cuda_state_t *s = r->state;
    const int S = in->num_seqs;
    // Host-side upper bounds the attention launchers size their grids by.
    // And the rows of one query token ahead of the first longer one.
    int max_seqlen_q = 0, max_context_len = 0, decode_rows = -1;
    for (int q = 0; q < S; q++) {
        int n = in->cu_seqlens_q[q + 1] - in->cu_seqlens_q[q];
        if (n > max_seqlen_q) max_seqlen_q = n;
        if (n != 1 && decode_rows < 0) decode_rows = q;
        if (in->context_lens[q] > max_context_len) max_context_len = in->context_lens[q];
    }
    if (decode_rows < 0) decode_rows = S;
    if (upload_step(r, s, in)) return -1;
    return enqueue_forward(r, in->num_tokens, S, in->num_sample, max_seqlen_q, max_context_len, decode_rows);
}

// The sampler, with vLLM's other options around it when `opts` (a decode
// graph always has them: its rows' options are uploaded every step, all off
// for a row without any, and such a row leaves the two kernels at once).
// Version 4 reads the LM head's bf16 logits, and the rows with an option on
// from d_logits, where the prepare kernel widened and changed them;
// versions 1 to 3 read fp32, so every row is widened into d_logits first.
static int enqueue_sample(model_runner_t *r, int N, int opts) {
    cuda_state_t *s = r->state;
    const int V = r->cfg.vocab_size;
    if (s->sampling_version == 4)
        return (opts && sampling_prepare_bf16_cuda(s->d_logits, s->d_logits_bf16, V, N, V, s->d.opts, s->d_opt_ids,
                                                   s->d_counts, s->d_raw, s->d.lp, s->stream)) ||
               sample_tokens_bf16_cuda(s->d.sampled, s->d_logits_bf16, s->d_logits, opts ? s->d.opts : NULL, V, N, V,
                                       s->d.temperature, s->d.top_k, s->d.top_p, s->d.seed, s->d.gen_index,
                                       s->d_sample_ws, s->sample_ws_bytes, s->stream) ||
               (opts && sampling_logprobs_finish_cuda(s->d.sampled, s->d_raw, V, N, s->d.opts, s->d.lp, s->stream));
    return bf16_to_f32_cuda(s->d_logits, s->d_logits_bf16, (long long)N * V, s->stream) ||
           (opts && sampling_prepare_cuda(s->d_logits, V, N, V, s->d.opts, s->d_opt_ids, s->d_counts, s->d_raw,
                                          s->d.lp, s->stream)) ||
           sample_tokens_ws_cuda(s->sampling_version, s->d.sampled, s->d_logits, V, N, V, s->d.temperature,
                                 s->d.top_k, s->d.top_p, s->d.seed, s->d.gen_index, s->d_sample_ws,
                                 s->sample_ws_bytes, s->stream) ||
           (opts && sampling_logprobs_finish_cuda(s->d.sampled, s->d_raw, V, N, s->d.opts, s->d.lp, s->stream));
}

// ---- decode steps as CUDA graphs ---------------------------------------------------------
// A decode step (every row one new token, every row sampled) is the same
// launches every time, up to the batch size S: so it is captured once per
// size into a CUDA graph and replayed, one launch for the ~300 kernels of
// the step instead of ~300 launches from the host (vLLM does the same).
// What makes that possible:
//   - fixed addresses: every buffer is allocated once, at creation; a step's
//     inputs are copied into fixed device buffers before the replay.
//   - fixed launch shapes: a step of S rows runs padded to the smallest
//     captured size Sg >= S (1, 2, 4, then steps of 8 up to max_num_seqs).
//     Padding rows compute a harmless token: id 0 at position 0, no K/V
//     stored (slot -1), attending to one key of block 0, sampled greedily;
//     rows never mix, so they cannot disturb the real rows, and their
//     results are dropped. Decode attention is launched with max_model_len
//     as its bound on the context length, so no step's lengths enter it.
//   - nothing allocates, synchronises or reads device memory on the host
//     while the step is enqueued (cuBLAS works in our workspace).
// With enforce_eager the same padded step is launched kernel by kernel, so
// eager and graph steps compute exactly the same bits (build/engine_check
// compares them).

// The captured sizes for max_num_seqs Sm: 1, 2, 4, 8, 16, 24, ... (steps of
// 8), the last one Sm itself.
static int decode_sizes(int Sm, int *sizes) {
    int n = 0;
    for (int b = 1; b < 8 && b < Sm; b *= 2) sizes[n++] = b;
    for (int b = 8; b < Sm && n < DECODE_MAX_SIZES - 1; b += 8) sizes[n++] = b;
    sizes[n++] = Sm;
    return n;
}

// The captured size a decode step of S rows runs at; -1 when there is none
// (S > the largest, which cannot happen: the largest is max_num_seqs).
static int decode_size_index(const cuda_state_t *s, int S) {
    for (int k = 0; k < s->num_sizes; k++)
        if (s->sizes[k] >= S) return k;
    return -1;
}

static int is_decode_step(const runner_step_t *in) {
    return in->num_tokens > 0 && in->num_tokens == in->num_seqs && in->num_sample == in->num_seqs;
}

// The padded decode step's inputs into the fixed device buffers: rows
// [0, S) from the step (and sampling parameters, or greedy when sp is NULL),
// rows [S, Sg) padding (see above).
static int upload_decode(const model_runner_t *r, cuda_state_t *s, const runner_step_t *in,
                         const runner_sampling_t *sp, int Sg) {
    const int S = in->num_seqs, W = in->max_blocks_per_seq, Wd = s->max_blocks;
    if (W > Wd)
        return mv_error("the step's block tables are %d wide; the device's hold %d (max_model_len %d / block_size %d)",
                        W, Wd, r->rc.max_model_len, r->rc.block_size);
    step_views(s, Sg);
    step_buffers_t *h = &s->h;
    for (int q = 0; q < Sg; q++) {
        const int real = q < S;
        h->input_ids[q] = real ? in->input_ids[q] : 0;
        h->positions[q] = real ? in->positions[q] : 0;
        h->slot_mapping[q] = real ? in->slot_mapping[q] : -1;
        h->context_lens[q] = real ? in->context_lens[q] : 1;
        h->cu_seqlens_q[q] = q;
        h->cu_last[q] = q;
        int32_t *row = h->block_tables + (size_t)q * Wd;
        if (real) memcpy(row, in->block_tables + (size_t)q * W, (size_t)W * sizeof(int32_t));
        else row[0] = 0;
        for (int j = real ? W : 1; j < Wd; j++) row[j] = -1;
        h->temperature[q] = real && sp ? sp->temperature[q] : 0.0f;
        h->top_k[q] = real && sp ? sp->top_k[q] : 0;
        h->top_p[q] = real && sp ? sp->top_p[q] : 1.0f;
        h->seed[q] = real && sp ? sp->seed[q] : 0;
        h->gen_index[q] = real && sp ? sp->gen_index[q] : 0;
    }
    h->cu_seqlens_q[Sg] = Sg;
    h->cu_last[Sg] = Sg;
    // Decode attention version 7 starts the rows' blocks longest first
    // (kernels/attention.h); the padding rows (one key) come last.
    if (decode_attention_version() == 7 && attention_row_order_longest_first(h->context_lens, Sg, h->row_order))
        return mv_error_prefix("the row order of a decode step of %d rows", Sg);
    const int packed = !s->upload_arrays;
    if (s->layout.tp_rank == 0 ? upload_opts(s, sp, S, Sg, packed) : (upload_opts(s, NULL, 0, Sg, 1), 0)) return -1;
    // One copy of the packed layout up to its outputs: every input array's
    // Sg (+ 1) entries and the options' rows. (A small copy costs a few
    // microseconds on the GPU's timeline whatever its size: chapter 09.)
    if (packed) {
        const size_t bytes = (size_t)((char *)h->sampled - (char *)s->h_stage);
        if (CUDA_TRY(cudaMemcpyAsync(s->d_step_mem, s->h_stage, bytes, cudaMemcpyHostToDevice, s->stream)))
            return mv_error_prefix("uploading a decode step of %d rows", Sg);
        return 0;
    }
    // MV_PACKED_UPLOAD=0: one copy of each array's first Sg (+1) entries.
    const struct {
        void *d, *h;
        size_t bytes;
    } parts[] = {
        {s->d.input_ids, h->input_ids, (size_t)Sg * sizeof(int32_t)},
        {s->d.positions, h->positions, (size_t)Sg * sizeof(int32_t)},
        {s->d.slot_mapping, h->slot_mapping, (size_t)Sg * sizeof(int32_t)},
        {s->d.context_lens, h->context_lens, (size_t)Sg * sizeof(int32_t)},
        {s->d.cu_seqlens_q, h->cu_seqlens_q, (size_t)(Sg + 1) * sizeof(int32_t)},
        {s->d.cu_last, h->cu_last, (size_t)(Sg + 1) * sizeof(int32_t)},
        {s->d.block_tables, h->block_tables, (size_t)Sg * Wd * sizeof(int32_t)},
        {s->d.temperature, h->temperature, (size_t)Sg * sizeof(float)},
        {s->d.top_k, h->top_k, (size_t)Sg * sizeof(int32_t)},
        {s->d.top_p, h->top_p, (size_t)Sg * sizeof(float)},
        {s->d.seed, h->seed, (size_t)Sg * sizeof(uint64_t)},
        {s->d.gen_index, h->gen_index, (size_t)Sg * sizeof(int64_t)},
        {s->d.row_order, h->row_order, (size_t)Sg * sizeof(int32_t)},
    };
    for (size_t k = 0; k < sizeof parts / sizeof *parts; k++)
        if (CUDA_TRY(cudaMemcpyAsync(parts[k].d, parts[k].h, parts[k].bytes, cudaMemcpyHostToDevice, s->stream)))
            return mv_error_prefix("uploading a decode step of %d rows", Sg);
    return 0;
}

// The decode step of Sg rows, from the device buffers: the forward pass and
// the sampler. What a graph holds.
// At tp > 1 only rank 0 samples: the other ranks' graphs end with the
// LM head's all-gather (the same collectives, in the same order, on every rank).
static int enqueue_decode(model_runner_t *r, int Sg) {
    const cuda_state_t *s = r->state;
    return enqueue_forward(r, Sg, Sg, Sg, 1, r->rc.max_model_len, Sg) || (s->layout.tp_rank == 0 && enqueue_sample(r, Sg, 1));
}

// Rows whose input id the step before sampled (asynchronous scheduling):
// copied on the device from that step's ids, one copy per run of rows that
// take consecutive ids (in a step planned ahead, usually all of them). The
// upload just made must not reach those ids: it covers the packed layout up
// to this step's outputs, which lie below the step before's as long as this
// step has no more rows (a step planned ahead has at most the rows of the
// one before).
static int copy_input_from(cuda_state_t *s, const runner_step_t *in, const int32_t *input_from) {
    const size_t uploaded = (size_t)((char *)s->d.sampled - (char *)s->d_step_mem);
    if (!s->prev_d_sampled || (size_t)((char *)s->prev_d_sampled - (char *)s->d_step_mem) < uploaded)
        return mv_error("a step's input ids from the step before, whose ids this step's upload would overwrite");
    for (int q = 0; q < in->num_seqs;) {
        int n = 1;
        while (q + n < in->num_seqs && input_from[q + n] == input_from[q] + n) n++;
        if (CUDA_TRY(cudaMemcpyAsync(s->d.input_ids + q, s->prev_d_sampled + input_from[q], (size_t)n * sizeof(int32_t),
                                     cudaMemcpyDeviceToDevice, s->stream)))
            return mv_error_prefix("the input ids of rows %d..%d from the step before", q, q + n - 1);
        q += n;
    }
    return 0;
}

// Run the decode step: inputs up (input_from: see copy_input_from), then the
// graph (or the same launches).
static int run_decode(model_runner_t *r, const runner_step_t *in, const runner_sampling_t *sp,
                      const int32_t *input_from) {
    cuda_state_t *s = r->state;
    const int k = decode_size_index(s, in->num_seqs);
    if (k < 0) return mv_error("a decode step of %d rows exceeds max_num_seqs %d", in->num_seqs, r->rc.max_num_seqs);
    if (upload_decode(r, s, in, sp, s->sizes[k]) || (input_from && copy_input_from(s, in, input_from))) return -1;
    if (s->graphs[k]) return CUDA_TRY(cudaGraphLaunch(s->graphs[k], s->stream));
    return enqueue_decode(r, s->sizes[k]);
}

// Capture one graph per decode size (at creation, after the KV cache is
// allocated). Each size first runs once outside capture, so cuBLAS picks its
// kernels and every module is loaded before capture begins.
static int capture_decode_graphs_fast(model_runner_t *r);
static int capture_decode_graphs(model_runner_t *r) {
    cuda_state_t *s = r->state;
    if (megakernel_prepare(r)) return -1;
    s->fast_decode = 1;
    // Not at tp > 1: a programmatic edge lets a kernel start before the one
    // it follows has finished, and after an NCCL kernel that is NCCL's
    // business (whether it signals early), not ours. So no kernel is
    // launched with PDL in graphs that hold collectives.
    const int pdl = !s->collectives && mv_pdl_supported();
    if (pdl && mv_pdl_set(1)) return -1;
    const int rc = capture_decode_graphs_fast(r);
    s->fast_decode = 0;
    mv_pdl_set(0);
    return rc;
}

// The decode graphs' edges (unless MV_PDL_EARLY=0). A kernel launched with the
// PDL attribute is captured with a programmatic edge from the kernel before it,
// leaving that kernel's programmatic port: it fires when every block of the
// upstream kernel has called pdl_launch_dependents() or exited. Ours call it
// first thing, but cuBLAS's GEMMs never do, so the kernel after a GEMM is
// launched only as the GEMM's last blocks exit. Moved to the launch-completion
// port, the edge fires once every block of the upstream kernel has begun, so
// the kernel after a GEMM is launched and resident while the GEMM runs. Either
// way it waits in pdl_wait() until the GEMM has finished and its writes are
// visible, so the bits are the same. Returns the number of edges moved, or -1
// with mv_error().
static int move_edges_to_launch_completion(cudaGraph_t g) {
    size_t n = 0;
    if (CUDA_TRY(cudaGraphGetEdges(g, NULL, NULL, NULL, &n))) return -1;
    if (n == 0) return 0;
    cudaGraphNode_t *from = malloc(n * sizeof *from), *to = malloc(n * sizeof *to);
    cudaGraphEdgeData *data = malloc(n * sizeof *data);
    int moved = 0;
    if (!from || !to || !data) {
        moved = mv_error("out of host memory for %zu graph edges", n);
    } else if (CUDA_TRY(cudaGraphGetEdges(g, from, to, data, &n))) {
        moved = -1;
    } else {
        for (size_t i = 0; i < n && moved >= 0; i++) {
            if (data[i].type != cudaGraphDependencyTypeProgrammatic ||
                data[i].from_port != cudaGraphKernelNodePortProgrammatic)
                continue;
            cudaGraphEdgeData e = data[i];
            e.from_port = cudaGraphKernelNodePortLaunchCompletion;
            if (CUDA_TRY(cudaGraphRemoveDependencies(g, &from[i], &to[i], &data[i], 1)) ||
                CUDA_TRY(cudaGraphAddDependencies(g, &from[i], &to[i], &e, 1)))
                moved = -1;
            else
                moved++;
        }
    }
    free(from);
    free(to);
    free(data);
    return moved;
}

static int capture_decode_graphs_fast(model_runner_t *r) {
    cuda_state_t *s = r->state;
    long long edges_moved = 0;
    size_t free0 = 0, free1 = 0, total = 0;
    if (CUDA_TRY(cudaDeviceSynchronize()) || CUDA_TRY(cudaMemGetInfo(&free0, &total))) return -1;
    const double t0 = now_seconds();
    runner_step_t pad = {.num_tokens = 0, .num_seqs = 0, .num_sample = 0, .max_blocks_per_seq = s->max_blocks};
    for (int k = 0; k < s->num_sizes; k++) {
        const int Sg = s->sizes[k];
        if (upload_decode(r, s, &pad, NULL, Sg) || enqueue_decode(r, Sg) || CUDA_TRY(cudaStreamSynchronize(s->stream)))
            return mv_error_prefix("decode warm-up at batch size %d", Sg);
        cudaGraph_t g = NULL;
        if (CUDA_TRY(cudaStreamBeginCapture(s->stream, cudaStreamCaptureModeThreadLocal)))
            return mv_error_prefix("CUDA graph capture at batch size %d", Sg);
        const int rc_enqueue = enqueue_decode(r, Sg);
        const cudaError_t end = cudaStreamEndCapture(s->stream, &g);
        if (rc_enqueue || end != cudaSuccess) {
            if (g) cudaGraphDestroy(g);
            if (rc_enqueue) return mv_error_prefix("CUDA graph capture at batch size %d", Sg);
            return mv_error("CUDA graph capture at batch size %d: cudaStreamEndCapture: %s", Sg, cudaGetErrorName(end));
        }
        // Not in the megakernel's graphs nor in those run as two halves: there
        // the moved edges measured slower (docs/09-engine.md, "The edges after
        // cuBLAS's kernels").
        if (s->pdl_early && !s->megakernel[k] && !runs_as_halves(s, Sg)) {
            const int moved = move_edges_to_launch_completion(g);
            if (moved < 0) {
                cudaGraphDestroy(g);
                return mv_error_prefix("the programmatic edges of the graph of batch size %d", Sg);
            }
            edges_moved += moved;
        }
        const cudaError_t inst = cudaGraphInstantiate(&s->graphs[k], g, 0);
        cudaGraphDestroy(g);
        if (inst != cudaSuccess) {
            s->graphs[k] = NULL;
            return mv_error("CUDA graph of batch size %d: cudaGraphInstantiate: %s", Sg, cudaGetErrorName(inst));
        }
        if (CUDA_TRY(cudaGraphUpload(s->graphs[k], s->stream))) return -1;
    }
    if (CUDA_TRY(cudaStreamSynchronize(s->stream)) || CUDA_TRY(cudaMemGetInfo(&free1, &total))) return -1;
    r->graph_seconds = now_seconds() - t0;
    r->graph_bytes = free0 > free1 ? free0 - free1 : 0;
    r->num_graphs = s->num_sizes;
    r->graph_early_edges = edges_moved;
    return 0;
}

// Wait for the stream; an error of any kernel enqueued in this step shows
// up here (kernels run asynchronously), so say so.
static int finish_step_tp(cuda_state_t *s);
static int finish_step(cuda_state_t *s) {
    if (s->collectives) return finish_step_tp(s);
    cudaError_t err = cudaStreamSynchronize(s->stream);
    if (err != cudaSuccess)
        return mv_error("the step failed on the GPU: %s (%s); a kernel of this step faulted (rerun under "
                        "compute-sanitizer, or with CUDA_LAUNCH_BLOCKING=1, to see which)",
                        cudaGetErrorName(err), cudaGetErrorString(err));
    return 0;
}

// The step's logits to the host (on_logits), raw, before any option changed
// them: the LM head's bf16 widened into d_logits (after the sampler, which
// is done with the rows an option changed there) and copied.
static int download_logits(const model_runner_t *r, cuda_state_t *s, int N, float *logits) {
    size_t bytes = (size_t)N * (size_t)r->cfg.vocab_size * sizeof(float);
    if (N == 0 || !logits) return 0;
    if (bf16_to_f32_cuda(s->d_logits, s->d_logits_bf16, (long long)N * r->cfg.vocab_size, s->stream)) return -1;
    cudaError_t err = cudaMemcpyAsync(logits, s->d_logits, bytes, cudaMemcpyDeviceToHost, s->stream);
    if (err != cudaSuccess) return mv_error("cudaMemcpyAsync of the logits (%zu bytes): %s", bytes, cudaGetErrorName(err));
    return 0;
}

static int cuda_step(model_runner_t *r, const runner_step_t *in, float *logits) {
    cuda_state_t *s = r->state;
    if ((is_decode_step(in) ? run_decode(r, in, NULL, NULL) : cuda_forward(r, in)) ||
        download_logits(r, s, in->num_sample, logits))
        return -1;
    return finish_step(s);
}

static int cuda_step_sample(model_runner_t *r, const runner_step_t *in, const runner_sampling_t *sp,
                            int32_t *sampled, float *logits) {
    cuda_state_t *s = r->state;
    const int N = in->num_sample;
    const int decode = is_decode_step(in);
    const int timed = decode && s->step_ev[1] && s->graphs[0];
    const double h0 = timed ? now_seconds() : 0.0;
    if (timed && CUDA_TRY(cudaEventRecord(s->step_ev[0], s->stream))) return -1;
    if (decode ? run_decode(r, in, sp, NULL) : upload_sampling(s, sp, N) || cuda_forward(r, in)) return -1;
    if (N > 0) {
        if ((!decode && enqueue_sample(r, N, sp->opts != NULL)) ||
            CUDA_TRY(cudaMemcpyAsync(s->h.sampled, s->d.sampled, (size_t)N * sizeof(int32_t), cudaMemcpyDeviceToHost,
                                     s->stream)) ||
            (sp->opts && sp->logprobs &&
             CUDA_TRY(cudaMemcpyAsync(s->h.lp, s->d.lp, (size_t)N * sizeof(sampling_logprobs_t),
                                      cudaMemcpyDeviceToHost, s->stream))) ||
            download_logits(r, s, N, logits))
            return -1;
    }
    if (timed && CUDA_TRY(cudaEventRecord(s->step_ev[1], s->stream))) return -1;
    if (finish_step(s)) return -1;
    if (timed) {
        float ms = 0.0f;
        if (CUDA_TRY(cudaEventElapsedTime(&ms, s->step_ev[0], s->step_ev[1]))) return -1;
        s->step_gpu_ms += ms, s->step_host_s += now_seconds() - h0, s->step_timed++;
    }
    for (int k = 0; sp->opts && sp->logprobs && k < N; k++)
        if (sp->opts[k].top_logprobs >= 0) sp->logprobs[k] = s->h.lp[k];
    // A row whose logits have no finite value comes back as -1,
    // RUNNER_ROW_FAILED: model_runner_step_sample ends that request alone
    // (and refuses any other id outside the vocabulary).
    for (int k = 0; k < N; k++) sampled[k] = s->h.sampled[k];
    return 0;
}

// Asynchronous steps: cuda_step_sample's work, queued on the stream into one
// of two staging copies, and an event after its ids come down; no wait.
// (MV_STEP_TIMES times the steps of cuda_step_sample only.)
static int cuda_launch_sample(model_runner_t *r, const runner_step_t *in, const runner_sampling_t *sp,
                              const int32_t *input_from) {
    cuda_state_t *s = r->state;
    if (s->collectives) return mv_error("asynchronous steps on the tensor-parallel path");
    // The staging copy that is not the oldest launched step's: free, since
    // at most two are launched and the other one's ids are collected.
    s->stage = s->num_launched ? s->launched[0].stage ^ 1 : s->stage ^ 1;
    const int N = in->num_sample, decode = is_decode_step(in);
    if (decode ? run_decode(r, in, sp, input_from) : upload_sampling(s, sp, N) || cuda_forward(r, in)) return -1;
    if ((!decode && enqueue_sample(r, N, 0)) ||
        CUDA_TRY(cudaMemcpyAsync(s->h.sampled, s->d.sampled, (size_t)N * sizeof(int32_t), cudaMemcpyDeviceToHost,
                                 s->stream)) ||
        CUDA_TRY(cudaEventRecord(s->launch_ev[s->stage], s->stream)))
        return -1;
    s->launched[s->num_launched].stage = s->stage;
    s->launched[s->num_launched].h_sampled = s->h.sampled;
    s->launched[s->num_launched].n = N;
    s->num_launched++;
    s->prev_d_sampled = s->d.sampled;
    return 0;
}

static int cuda_collect_sample(model_runner_t *r, int32_t *sampled, int n) {
    cuda_state_t *s = r->state;
    if (s->num_launched == 0 || s->launched[0].n != n) return mv_error("no launched step of %d rows to collect", n);
    const int stage = s->launched[0].stage;
    const int32_t *ids = s->launched[0].h_sampled;
    s->launched[0] = s->launched[1];
    s->num_launched--;
    cudaError_t err = cudaEventSynchronize(s->launch_ev[stage]);
    if (err != cudaSuccess)
        return mv_error("the step failed on the GPU: %s (%s); a kernel of this step faulted (rerun under "
                        "compute-sanitizer, or with CUDA_LAUNCH_BLOCKING=1, to see which)",
                        cudaGetErrorName(err), cudaGetErrorString(err));
    memcpy(sampled, ids, (size_t)n * sizeof(int32_t));
    return 0;
}

// ---- tensor parallelism over NCCL: creation and the wait for a step ----------------------
// Rank 0 of N sends each step over MPI (model_runner.c); every rank then
// runs it here on its shard, and NCCL carries the activations between the
// GPUs. Creation goes in an order in which no rank can be left waiting on
// another that has given up:
//   1. each rank places its shard (cuda_create_placed): no communication;
//   2. an agreement (tp_comm_agree over MPI): if any rank failed, every rank
//      returns -1 and rank 0 prints "rank R: why";
//   3. rank 0's ncclGetUniqueId (agreed on), broadcast over MPI, then
//      ncclCommInitRankConfig, blocking, on every rank. A failure inside it
//      ends every rank (tp_comm_abort, MPI_Abort): the others may be inside
//      NCCL's bootstrap, waiting for this rank, where no MPI message reaches;
//   4. one all-reduce and one all-gather, so that NCCL sets up its
//      connections (and allocates their buffers) now, before the KV cache
//      is sized from what is left of the GPU;
//   5. each rank sizes its cache (the same rule as at tp 1, over its KV
//      heads' block bytes), an agreement, then the smallest count of any
//      rank is every rank's (rank 0's scheduler hands out block ids that
//      every rank must hold); each allocates it; an agreement;
//   6. the decode graphs: their warm-up and capture run collectives, so from
//      here a failure ends every rank (tp_comm_abort).
// NCCL_NVLS_ENABLE (NVLink multicast) and the transports are left to the
// environment (NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 gives the socket
// transport two hosts without a fast fabric would use).

// 0 when every rank is ok; else -1 on every rank, with "rank R: why", and
// the runner marked so that model_runner_create holds no second agreement.
static int tp_agree(model_runner_t *r, int ok) {
    char why[1000] = "";
    if (!ok) snprintf(why, sizeof why, "%s", mv_last_error());
    if (tp_comm_agree(&r->tp, ok, why, NULL) == 0) return 0;
    r->failure_agreed = 1;
    return -1;
}

#if MV_HAVE_NCCL
// Steps 3 and 4 above.
static int nccl_open(model_runner_t *r, cuda_state_t *s) {
    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    const int ok = r->tp.rank != 0 || !NCCL_TRY(ncclGetUniqueId(&id));
    if (tp_agree(r, ok) || tp_comm_bcast(&r->tp, &id, sizeof id, 0)) return -1;
    // Blocking (the default, said here): the call returns once this rank's
    // communicator is up, or with the error.
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 1;
    if (NCCL_TRY(ncclCommInitRankConfig(&s->nccl, r->tp.size, id, r->tp.rank, &config))) {
        s->nccl = NULL;
        tp_comm_abort(&r->tp, 1, mv_last_error());
    }
    if (tp_allreduce_sum(s, s->d_x, (size_t)r->cfg.hidden_size, "NCCL's first use") ||
        tp_allgather(s, s->d_logits_local, s->d_logits_gathered, (size_t)s->layout.vocab.local_rows) ||
        CUDA_TRY(cudaStreamSynchronize(s->stream)))
        tp_comm_abort(&r->tp, 1, mv_last_error());
    return 0;
}
#else
static int nccl_open(model_runner_t *r, cuda_state_t *s) {
    return mv_error("--tensor-parallel-size %d on cuda needs NCCL, and this minivllm was built without it", r->tp.size);
}
#endif

// Step 5 above: every rank's cache of the same number of blocks.
static int tp_size_cache(model_runner_t *r) {
    cuda_state_t *s = r->state;
    if (tp_agree(r, cuda_size_cache(r, rank_block_bytes(r, &s->layout)) == 0)) return -1;
    int32_t mine = r->rc.num_blocks, all[64] = {0};
    if (tp_comm_gather(&r->tp, &mine, sizeof mine, all, 0)) tp_comm_abort(&r->tp, 1, mv_last_error());
    int32_t fewest = mine;
    for (int k = 0; r->tp.rank == 0 && k < r->tp.size; k++)
        if (all[k] < fewest) fewest = all[k];
    if (tp_comm_bcast(&r->tp, &fewest, sizeof fewest, 0)) tp_comm_abort(&r->tp, 1, mv_last_error());
    r->rc.num_blocks = fewest;
    return tp_agree(r, cuda_alloc_cache(r) == 0);
}

static int cuda_create_tp(model_runner_t *r, int placed_rc) {
    if (tp_agree(r, placed_rc == 0)) return -1;
    cuda_state_t *s = r->state;
    if (nccl_open(r, s) || tp_size_cache(r)) return -1;
    s->num_sizes = decode_sizes(r->rc.max_num_seqs, s->sizes);
    if ((!r->rc.enforce_eager && capture_decode_graphs(r)) || CUDA_TRY(cudaDeviceSynchronize()))
        tp_comm_abort(&r->tp, 1, mv_last_error());
    return 0;
}

// How long a tp step may take before this rank gives up on its peers:
// MV_TP_STEP_TIMEOUT_S seconds (default 600, far above any step: a prefill
// of 8192 tokens of Qwen3-8B is well under a second on an H200).
static double tp_step_timeout_s(void) {
    const char *v = getenv("MV_TP_STEP_TIMEOUT_S");
    char *end = NULL;
    const double t = v && *v ? strtod(v, &end) : 0;
    return end && !*end && t > 0 ? t : 600.0;
}

// The wait for a tp step. NCCL has no timeout of its own on a collective: a
// peer that stops taking part leaves this rank's NCCL kernel spinning, and
// cudaStreamSynchronize would wait for ever. So the stream is polled, and
// while it runs NCCL's asynchronous error (a peer's connection closed, a
// remote error: ncclCommGetAsyncError) and the time are checked; either
// ends the wait with an error, which the model runner turns into
// tp_comm_abort on every rank. (A rank that dies is also seen by mpirun,
// which then ends the others.)
static int finish_step_tp(cuda_state_t *s) {
#if MV_HAVE_NCCL
    const double t0 = now_seconds(), limit = tp_step_timeout_s();
    for (;;) {
        const cudaError_t q = cudaStreamQuery(s->stream);
        if (q == cudaSuccess) return 0;
        if (q != cudaErrorNotReady)
            return mv_error("the step failed on the GPU: %s (%s); a kernel or collective of this step faulted "
                            "(rerun with CUDA_LAUNCH_BLOCKING=1 NCCL_DEBUG=WARN to see which)",
                            cudaGetErrorName(q), cudaGetErrorString(q));
        ncclResult_t async = ncclSuccess;
        if (NCCL_TRY(ncclCommGetAsyncError(s->nccl, &async))) return -1;
        if (async != ncclSuccess && async != ncclInProgress)
            return mv_error("NCCL reported an error during the step: %s (%s)", ncclGetErrorString(async),
                            ncclGetLastError(s->nccl));
        if (now_seconds() - t0 > limit)
            return mv_error("the step did not finish within %.0f s (MV_TP_STEP_TIMEOUT_S): another rank stopped "
                            "taking part in its collectives", limit);
        sched_yield();
    }
#else
    return mv_error("a tensor-parallel step: this minivllm was built without NCCL");
#endif
}

const runner_backend_t RUNNER_BACKEND_CUDA = {"cuda",           cuda_create,       cuda_step,          cuda_destroy,
                                              cuda_step_sample, cuda_launch_sample, cuda_collect_sample};

#endif  // MV_HAVE_CUDA

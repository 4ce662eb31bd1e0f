/*
 * chapters/09-engine/runtime/model_runner.h - Qwen3's forward pass over one
 * scheduled step, behind a backend interface.
 *
 * Where it sits: between the scheduler (chapter 08), which decides which
 * tokens run in this step and where their K/V go, and the sampler
 * (sampler.h), which turns logits into tokens. One call of
 * model_runner_step() is one forward pass of the whole model:
 *
 *   embedding -> L x [ input_layernorm (fused with the residual add from
 *   layer 1 on) -> qkv_proj -> q_norm/k_norm per head -> RoPE -> store k, v
 *   into the paged cache -> paged attention -> o_proj ->
 *   post_attention_layernorm (fused add) -> gate_up_proj -> SiluAndMul ->
 *   down_proj ] -> final norm (fused add) -> LM head, only for the rows
 *   that sample.
 *
 * Why a backend interface (a struct of function pointers, as zeux/calm
 * swaps its CPU and GPU `forward`): the engine loop does not know where the
 * model runs. The CPU backend (runner_cpu.c) calls the reference/ layers;
 * the CUDA backend (runner_cuda.c) calls kernels/ with the same step struct;
 * model_runner.c checks every step before either sees it. Three choices:
 *   - runner_step_t is a plain struct of flat int32 arrays on the host: a
 *     CUDA backend copies them to fixed device buffers (fixed addresses are
 *     what CUDA-graph capture of the decode step needs), and tensor-parallel
 *     ranks other than 0 can receive the same struct (broadcast) and follow
 *     rank 0's steps without a scheduler of their own.
 *   - every buffer is sized once, at creation, for the worst step
 *     (max_num_batched_tokens tokens, max_num_seqs rows): a step allocates
 *     nothing.
 *   - logits come back on the host, [num_sample, vocab] fp32, for the host
 *     sampler; a backend that samples on its device (cuda) also offers
 *     step_sample, which returns only the sampled ids (4 bytes a row
 *     instead of 4 * vocab) and the logits only when asked for.
 *
 * Tensor parallelism (rc.tp_size > 1, one process per rank under mpirun):
 * rank 0's engine calls model_runner_step (or model_runner_step_sample) as
 * at tp 1, and the step goes to the other ranks before the backend runs it;
 * they sit in model_runner_follow. The backend shards the model and adds
 * the partial sums: the CPU backend over parallel/tp_comm.h (MPI), the CUDA
 * backend over NCCL, one GPU per rank (docs/09-parallel.md).
 *
 * Library code: 0 / -1 with mv_error(), never exits (except the tp_comm_abort
 * of a tensor-parallel step that fails once the other ranks are inside it).
 * Tested by tests/test_engine_cpu.c against Hugging Face's greedy outputs
 * (tests/test_tp_mpi.c at tp 2 and 4);
 * the cuda backend (runner_cuda.c) by build/engine_check on a GPU.
 */
#ifndef MV_MODEL_RUNNER_H
#define MV_MODEL_RUNNER_H

#include <stddef.h>
#include <stdint.h>

#include "chapters/09-engine/model/model_config.h"
#include "chapters/09-engine/model/safetensors.h"
#include "chapters/09-engine/parallel/tp_comm.h"
#include "reference/rope.h"
#include "reference/sampling.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { RUNNER_DEVICE_CPU = 0, RUNNER_DEVICE_CUDA = 1 } runner_device_t;

// Sizes fixed at creation (the engine derives them from its options).
typedef struct {
    runner_device_t device;
    int max_num_batched_tokens;  // most query tokens in one step
    int max_num_seqs;            // most rows (sequences) in one step
    int max_model_len;           // longest sequence (prompt + generated); RoPE cache rows
    int block_size;              // tokens per KV block
    int num_blocks;              // KV blocks per layer (each holds K and V of block_size tokens);
                                 // cuda: 0 = as many as gpu_memory_utilization leaves room for
    int num_threads;             // CPU threads for linear/attention; 0 = one per online CPU
    float gpu_memory_utilization;  // cuda: the share of the GPU's memory this engine may fill
                                   // (weights + scratch + KV cache), in (0, 1]; 0 = 0.9
    int enforce_eager;           // cuda: 1 = launch decode steps kernel by kernel instead of
                                 // replaying CUDA graphs captured at creation (--enforce-eager)
    int tp_size;                 // tensor-parallel ranks, one process each (mpirun); 0 or 1 = one.
                                 // cpu, and cuda in builds with NCCL; sizes are then this rank's share
} runner_config_t;

// One step's inputs: the scheduler's sched_step_t, minus what only the
// scheduler needs. Host arrays, valid for the duration of the call.
typedef struct {
    int num_tokens;              // T: query tokens of all rows
    int num_seqs;                // S: rows
    int num_sample;              // rows whose last token's logits are wanted
    int max_blocks_per_seq;      // width of block_tables
    const int32_t *input_ids;           // [T]
    const int32_t *positions;           // [T] position of each token in its sequence
    const int32_t *cu_seqlens_q;        // [S + 1] prefix sums of query lengths
    const int32_t *context_lens;        // [S] cached + new tokens each row attends to
    const int32_t *slot_mapping;        // [T] cache slot of each token's K/V, -1 = already cached
    const int32_t *block_tables;        // [S, max_blocks_per_seq] -1 padded
    const int32_t *sample_token_index;  // [num_sample] increasing token index of each sampled row's last token
} runner_step_t;

// Sampling parameters of the step's sampled rows, for a backend that samples
// on its device. Host arrays of [num_sample], in the order of
// sample_token_index; checked on the host by model_runner_step_sample.
// A row's random draw depends only on (seed, gen_index): counter-based, so
// the same request gives the same tokens whatever it was batched with,
// and a preempted request that is recomputed draws the same numbers again.
typedef struct {
    const float *temperature;    // [num_sample] 0 = greedy
    const int32_t *top_k;        // [num_sample] 0 = off
    const float *top_p;          // [num_sample] (0, 1], 1 = off
    const uint64_t *seed;        // [num_sample] the request's seed
    const int64_t *gen_index;    // [num_sample] tokens the request had generated before this one
    // vLLM's other options (penalties, min_tokens, min_p, logprobs), or NULL
    // when no row of the step uses one. The device applies them itself
    // (kernels/sampling_opts.h); sampler_opts_row fills a row.
    const sampling_opts_row_t *opts;  // [num_sample]
    const int32_t *opt_ids;           // [num_opt_ids] the ids opts[k] point into
    int num_opt_ids;
    sampling_logprobs_t *logprobs;    // [num_sample] out: the rows with opts[k].top_logprobs >= 0
} runner_sampling_t;

typedef struct model_runner model_runner_t;

// What a backend implements. `state` is the backend's own struct.
typedef struct {
    const char *name;  // "cpu", "cuda"
    // Convert and place the weights, allocate the caches and scratch.
    int (*create)(model_runner_t *r, const st_model_t *weights);
    // One forward pass; logits [num_sample, vocab] fp32 on the host.
    int (*step)(model_runner_t *r, const runner_step_t *in, float *logits);
    void (*destroy)(model_runner_t *r);
    // Optional (NULL: the engine samples on the host from step's logits).
    // One forward pass and sampling on the device: sampled [num_sample]
    // ids on the host; logits [num_sample, vocab] fp32 also copied to the
    // host when not NULL (the engine's on_logits hook wants them). A row
    // whose logits have no finite value gets RUNNER_ROW_FAILED (the GPU
    // sampler's -1) and the call still returns 0: one request's NaNs must
    // not fail the other rows of the step.
    int (*step_sample)(model_runner_t *r, const runner_step_t *in, const runner_sampling_t *sp,
                       int32_t *sampled, float *logits);
    // Optional (NULL: no asynchronous steps). step_sample in two halves, for
    // the engine's asynchronous scheduling: launch_sample queues the step
    // and its sampling on the device and returns before they run;
    // collect_sample waits for the oldest launched step and copies its n
    // ids. At most two steps launched and not collected. input_from: NULL,
    // or (a decode step launched right after another) [num_seqs]: row r's
    // input id is the id the step launched before sampled at its index
    // input_from[r], taken from the device's memory (in->input_ids[r] is
    // then a placeholder). No logits, no options (sp->opts NULL).
    int (*launch_sample)(model_runner_t *r, const runner_step_t *in, const runner_sampling_t *sp,
                         const int32_t *input_from);
    int (*collect_sample)(model_runner_t *r, int32_t *sampled, int n);
} runner_backend_t;

struct model_runner {
    qwen3_config_t cfg;               // the model's shapes
    runner_config_t rc;               // the runner's sizes
    const runner_backend_t *backend;
    void *state;                      // the backend's buffers and weights
    size_t weight_bytes, kv_cache_bytes, scratch_bytes;  // what the backend allocated
    int num_graphs;                   // cuda: decode CUDA graphs captured (0 with enforce_eager)
    double graph_seconds;             // cuda: time their warm-up and capture took at creation
    size_t graph_bytes;               // cuda: GPU memory they took (cudaMemGetInfo before and after)
    long long graph_early_edges;      // cuda: their programmatic edges moved to the launch-completion port
                                      // (0 with MV_PDL_EARLY=0)
    int megakernel_rows;              // cuda: decode steps of 1 .. this many rows run the decode megakernel (0: none)
    char megakernel_why[160];         // cuda: why not at the first size it does not take ("" when it takes all)
    int halves_rows, halves_max_rows; // cuda: decode steps of halves_rows to halves_max_rows rows run as two
                                      // halves at once (two streams; 0: never)
    tp_comm_t tp;                     // the tensor-parallel ranks (size 1: this process alone)
    int followers_waiting;            // rank 0 of tp > 1: the other ranks follow its steps (a stop is owed)
    int failure_agreed;               // tp > 1: the backend's create failed after an agreement of its own
                                      // (every rank knows and returns: no second agreement)
    int32_t *wire;                    // [wire_cap] one step's arrays packed for the broadcast
    size_t wire_cap;
    int no_async_steps;               // set by a backend whose launch_sample cannot run this runner's
                                      // steps (cuda on the tensor-parallel path, MV_TP_COMM_OF_ONE=1)
    int num_launched;                 // steps launched (model_runner_launch_sample), not collected
    int launched_sample[2];           // their sampled rows, oldest first
};

// The CPU backend (runner_cpu.c).
extern const runner_backend_t RUNNER_BACKEND_CPU;
#if MV_HAVE_CUDA
// The CUDA backend (runner_cuda.c), in builds with CUDA only.
extern const runner_backend_t RUNNER_BACKEND_CUDA;
#endif

// 1 when `device` can run here; else 0 with the reason in why[cap] (cuda:
// a build without CUDA, no GPU visible, a driver that does not load).
int model_runner_device_available(runner_device_t device, char *why, size_t cap);
// The device a command uses when none is asked for: cuda when a CUDA GPU is
// visible in a build with CUDA, else cpu.
runner_device_t model_runner_default_device(void);
const char *model_runner_device_name(runner_device_t device);

// The fp32 cos/sin cache [max_model_len, head_dim] for cfg's RoPE (theta,
// llama3 scaling): built on the host by both backends (cuda uploads it).
int model_runner_build_rope(rope_cache_t *rope, const qwen3_config_t *cfg, int max_model_len);

// Bytes of K and V cache one block takes on `device` over all layers
// (the CPU backend keeps fp32 caches; the CUDA one keeps bf16).
size_t model_runner_block_bytes(const qwen3_config_t *cfg, int block_size, runner_device_t device);

// What a runner will allocate, worked out from the shapes before anything is
// allocated, so that a load that cannot fit is refused with the numbers
// instead of ending in the out-of-memory killer. On cpu it is exact: the
// three sums model_runner_create reports afterwards in weight_bytes,
// kv_cache_bytes and scratch_bytes (plus rope_bytes, the RoPE cache). On
// cuda it is the device's share (at tp > 1 rank 0's, the largest) as bf16
// weights and the KV cache of rc->num_blocks (0 while the runner is to size
// it), for runner_cuda.c to compare with cudaMemGetInfo; host_bytes is what
// the cuda backend keeps on the host while converting (one bf16 copy of the
// largest tensor).
typedef struct {
    size_t weight_bytes;    // weights as the backend keeps them (bf16 matrices, fp32 norms on cpu)
    size_t kv_cache_bytes;  // num_blocks blocks of every layer's K and V
    size_t scratch_bytes;   // activations for max_num_batched_tokens tokens, max_num_seqs rows
    size_t rope_bytes;      // the cos/sin cache [max_model_len, head_dim] fp32
    size_t host_bytes;      // cuda: host memory beside the device's (conversion buffer); cpu: 0
} runner_memory_t;
int model_runner_memory_estimate(const qwen3_config_t *cfg, const runner_config_t *rc, runner_memory_t *out);
// Host memory a new allocation can get without swapping or the OOM killer:
// /proc/meminfo's MemAvailable (else sysconf's free pages), lowered to what
// the cgroup (v2 memory.max minus memory.current) leaves, as in a container.
// 0 with *bytes; -1 with mv_error() when neither can be read.
int host_memory_available(size_t *bytes);

// Build a runner for the checkpoint `weights` with config `cfg`.
// -1 with mv_error() on a bad size, an unavailable device or no memory.
//
// With rc->tp_size N > 1 (one process per rank, started by mpirun; every
// rank calls this with the same arguments): a size N does not divide is
// refused before anything is loaded, naming it; rank 0's sizes are sent to
// the others, which must have the same; each rank loads its shard; then
// every rank learns whether any failed (tp_comm_agree), so that all return
// -1 with "rank R: why" or all go on: no rank is left waiting. Rank 0 then
// runs the steps (model_runner_step sends each to the others first) and
// the others call model_runner_follow.
int model_runner_create(const qwen3_config_t *cfg, const st_model_t *weights, const runner_config_t *rc,
                        model_runner_t **out);
// On rank 0 of tp > 1 this also tells the following ranks to stop.
void model_runner_free(model_runner_t *r);
// This process's rank (0 at tp 1).
int model_runner_tp_rank(const model_runner_t *r);
// Ranks other than 0: receive rank 0's steps and run each on this rank's
// shard, until rank 0's runner is freed. 0 then. A step that fails here
// cannot be reported to rank 0, which waits in the same step's collectives:
// it ends every rank (tp_comm_abort) with the rank and the cause.
int model_runner_follow(model_runner_t *r);

// Check the step against the runner's sizes (token ids in the vocabulary,
// positions, slots, the batch description), then run it.
// logits: [in->num_sample, cfg.vocab_size] fp32.
// At tp > 1 (rank 0 only): the checked step is sent to the other ranks
// first, and a failure after that ends every rank (tp_comm_abort), since
// the others wait inside the step.
int model_runner_step(model_runner_t *r, const runner_step_t *in, float *logits);

// 1 when the backend samples on its device (step_sample), else 0.
int model_runner_samples_on_device(const model_runner_t *r);
// The id of a sampled row whose logits had no finite value (all NaN, all
// -inf, or a +inf): that row's request cannot go on, the others can.
#define RUNNER_ROW_FAILED (-1)

// The checks of model_runner_step plus the sampling parameters', then one
// step with sampling on the device. sampled: [num_sample], each an id in
// [0, vocab) or RUNNER_ROW_FAILED for a row whose logits have no finite
// value (the step still succeeds: the engine ends that request alone).
// Any other value from the backend fails the step.
// logits: NULL, or [num_sample, vocab] fp32 to be filled as well.
int model_runner_step_sample(model_runner_t *r, const runner_step_t *in, const runner_sampling_t *sp,
                             int32_t *sampled, float *logits);

// Asynchronous steps (runner_backend_t.launch_sample / collect_sample): 1
// when this runner has them (the cuda backend at tp 1, without
// MV_TP_COMM_OF_ONE's collectives), else 0.
int model_runner_can_launch(const model_runner_t *r);
// The checks of model_runner_step_sample, then the step queued: the call
// returns before the device runs it. input_from: NULL, or [num_seqs] for a
// decode step launched while the one before it is not collected: row r's
// input id is that step's sampled id number input_from[r]. Refused with
// logits or options (sp->opts), past two launched steps, and while
// model_runner_step / step_sample would have to wait behind launched ones.
int model_runner_launch_sample(model_runner_t *r, const runner_step_t *in, const runner_sampling_t *sp,
                               const int32_t *input_from);
// The ids of the oldest launched step, once it has run: n must be its
// num_sample. A row whose logits had no finite value gets RUNNER_ROW_FAILED,
// as with model_runner_step_sample.
int model_runner_collect_sample(model_runner_t *r, int32_t *sampled, int n);

#ifdef __cplusplus
}
#endif
#endif

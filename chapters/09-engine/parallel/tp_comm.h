/*
 * chapters/09-engine/parallel/tp_comm.h - the host-side communicator of the
 * engine's tensor-parallel ranks: one process per rank, joined by MPI.
 *
 * Where it sits: under the model runner (runtime/model_runner.c), which
 * sends every step from rank 0 to the others, and the CPU backend
 * (runtime/runner_cpu.c), whose o_proj, down_proj and embedding add their
 * partial sums over the ranks and whose LM head gathers the logits on
 * rank 0. Launch: `mpirun -np N build/minivllm generate -tp N ...`; mpirun
 * starts N copies of the program and MPI tells each its rank.
 *
 * What it offers is what a tensor-parallel engine needs and no more:
 *   bcast           bytes from one rank to all (the step's arrays)
 *   allreduce_sum   fp32 partial sums -> the sum, on every rank (row-parallel)
 *   gather          equal blocks from every rank, rank-major, on one rank (logits)
 *   agree           every rank learns whether any failed, which, and why
 *   abort           end every rank now (a failure in the middle of a step,
 *                   when the others wait in a collective that would never end)
 *
 * A communicator of one (tp_size 1) is the same code with no MPI call: each
 * operation is the identity (or a copy), so the engine has one path. MPI is
 * optional in the build (MV_HAVE_MPI, the Makefile finds Open MPI through
 * mpicc --showme); without it only tp_size 1 opens.
 *
 * No transport of our own: everything here is one MPI collective over
 * MPI_COMM_WORLD (Open MPI picks shared memory on one host, TCP across hosts).
 * The CUDA backend's tensors go over NCCL instead (runtime/runner_cuda.c:
 * MPI carries the steps and NCCL's unique id, NCCL the activations).
 *
 * Library code: 0 / -1 with mv_error(), never exits (tp_comm_abort aside).
 */
#ifndef MV_TP_COMM_H
#define MV_TP_COMM_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    int size;  // ranks: 1, or the MPI world's size
    int rank;  // this process's: 0 owns the scheduler, the tokenizer and sampling
} tp_comm_t;

// 1 when this process was started by mpirun (Open MPI's OMPI_COMM_WORLD_SIZE
// or PMIx's PMIX_RANK in the environment), else 0. Asks nothing of MPI.
int tp_comm_launched(void);
// The world's size and this process's rank as mpirun's environment says
// (1 and 0 when not launched by it): known before MPI starts.
int tp_comm_launched_size(void);
int tp_comm_launched_rank(void);
// This process's rank among the ranks on its own host (Open MPI's
// OMPI_COMM_WORLD_LOCAL_RANK, MPICH's MPI_LOCALRANKID), else its world rank:
// which GPU of the host a rank of the CUDA backend takes.
int tp_comm_launched_local_rank(void);

// Join the ranks. size 1: a communicator of one, no MPI call (even under
// mpirun). size > 1: MPI_Init_thread (once per process; MPI_THREAD_SERIALIZED,
// since `serve` steps on its engine thread) and a check that the world has
// exactly `size` ranks. -1 with mv_error() saying what to do: a build
// without MPI, a process not started by mpirun, a world of another size.
int tp_comm_open(int size, tp_comm_t *c);
// 1 once tp_comm_open started MPI in this process.
int tp_comm_mpi_started(void);
// The ranks are settled: none waits on another any more (rank 0 sent the
// stop and a follower received it, or tp_comm_agree told every rank of a
// failure). The model runner marks it; tp_comm_end reads it.
void tp_comm_mark_settled(void);
int tp_comm_settled(void);
// At the end of the process, with its exit status: nothing when MPI was
// never started; MPI_Finalize when the ranks are settled (every rank calls
// it, and each exits with its own status); else this rank's peers may wait
// in a collective that will never end, so every rank is ended with
// MPI_Abort(status, or 1). Returns status.
int tp_comm_end(int status);

// bytes of buf from rank `root` to every rank's buf.
int tp_comm_bcast(const tp_comm_t *c, void *buf, size_t bytes, int root);
// buf [n] fp32 on every rank := the sum over the ranks of their buf.
int tp_comm_allreduce_sum_f32(const tp_comm_t *c, float *buf, size_t n);
// Every rank's send [bytes] into root's recv [size * bytes], rank r's block
// at r * bytes (recv is ignored on other ranks and may be NULL there).
int tp_comm_gather(const tp_comm_t *c, const void *send, size_t bytes, void *recv, int root);
// Every rank brings ok (1 or 0) and, when 0, its message. 0 when all are
// ok; else -1 on every rank with mv_error("rank R: message") naming the
// first rank that failed, and *failed_rank set (may be NULL).
int tp_comm_agree(const tp_comm_t *c, int ok, const char *msg, int *failed_rank);
// Print "minivllm: tp rank R: message" on stderr and end every rank
// (MPI_Abort with `status`). A communicator of one exits with status.
void tp_comm_abort(const tp_comm_t *c, int status, const char *msg) __attribute__((noreturn));

#ifdef __cplusplus
}
#endif
#endif

/*
 * chapters/09-engine/parallel/tp_comm.c - the tensor-parallel ranks'
 * communicator over MPI (see tp_comm.h). Every operation is one MPI
 * collective on MPI_COMM_WORLD; a communicator of one calls no MPI.
 */
#include "chapters/09-engine/parallel/tp_comm.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/check.h"

#if MV_HAVE_MPI
#include <mpi.h>
#endif

static int mpi_started;  // MPI_Init_thread ran in this process (once: MPI allows one init)
static int settled;      // no rank waits on another (tp_comm_mark_settled)

static int env_int(const char *name, int fallback) {
    const char *v = getenv(name);
    if (!v || !*v) return fallback;
    char *end;
    long x = strtol(v, &end, 10);
    return *end || x < 0 || x > INT_MAX ? fallback : (int)x;
}

// Open MPI's mpirun sets OMPI_COMM_WORLD_*; PMIx-based launchers PMIX_RANK;
// MPICH's Hydra PMI_SIZE / PMI_RANK.
int tp_comm_launched(void) {
    return getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMIX_RANK") || getenv("PMI_SIZE");
}

int tp_comm_launched_size(void) { return env_int("OMPI_COMM_WORLD_SIZE", env_int("PMI_SIZE", 1)); }

int tp_comm_launched_rank(void) {
    return env_int("OMPI_COMM_WORLD_RANK", env_int("PMIX_RANK", env_int("PMI_RANK", 0)));
}

int tp_comm_launched_local_rank(void) {
    return env_int("OMPI_COMM_WORLD_LOCAL_RANK", env_int("MPI_LOCALRANKID", tp_comm_launched_rank()));
}

int tp_comm_mpi_started(void) { return mpi_started; }

int tp_comm_open(int size, tp_comm_t *c) {
    *c = (tp_comm_t){1, 0};
    if (size == 1) return 0;
    if (size < 1) return mv_error("--tensor-parallel-size must be >= 1, got %d", size);
#if MV_HAVE_MPI
    if (!tp_comm_launched())
        return mv_error("--tensor-parallel-size %d runs one process per rank: launch it with `mpirun -np %d "
                        "minivllm ...` (this process was not started by mpirun)",
                        size, size);
    int inited = 0;
    MPI_Initialized(&inited);
    if (!inited) {
        int provided = 0;
        if (MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS)
            return mv_error("MPI_Init_thread failed");
        mpi_started = 1;
        // `serve` steps on its engine thread, not the one that started MPI.
        if (provided < MPI_THREAD_SERIALIZED)
            return mv_error("this MPI gives thread level %d, and the engine needs MPI_THREAD_SERIALIZED (%d)",
                            provided, MPI_THREAD_SERIALIZED);
    }
    int world = 0, rank = 0;
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (world != size)
        return mv_error("--tensor-parallel-size %d needs %d ranks, and mpirun started %d: launch with `mpirun -np %d`",
                        size, size, world, size);
    *c = (tp_comm_t){world, rank};
    return 0;
#else
    return mv_error("--tensor-parallel-size %d needs MPI, and this minivllm was built without it (mpi.h and mpicc "
                    "were not found: install openmpi-bin and libopenmpi-dev, then rebuild)",
                    size);
#endif
}

void tp_comm_mark_settled(void) { settled = 1; }

int tp_comm_settled(void) { return settled; }

int tp_comm_end(int status) {
#if MV_HAVE_MPI
    if (!mpi_started) return status;
    int done = 0;
    MPI_Finalized(&done);
    if (done) return status;
    if (settled) {
        MPI_Finalize();
        return status;
    }
    fflush(stdout);
    fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, status ? status : 1);
#endif
    return status;
}

#if MV_HAVE_MPI
// MPI counts in int: a larger buffer goes in pieces of at most 1 GiB.
#define MPI_PIECE ((size_t)1 << 30)

static int mpi_fail(const char *call, int err) {
    char s[MPI_MAX_ERROR_STRING];
    int n = 0;
    MPI_Error_string(err, s, &n);
    return mv_error("%s failed: %s", call, s);
}
#endif

int tp_comm_bcast(const tp_comm_t *c, void *buf, size_t bytes, int root) {
    if (c->size == 1) return 0;
#if MV_HAVE_MPI
    for (size_t at = 0; at < bytes; at += MPI_PIECE) {
        size_t n = bytes - at < MPI_PIECE ? bytes - at : MPI_PIECE;
        int err = MPI_Bcast((char *)buf + at, (int)n, MPI_BYTE, root, MPI_COMM_WORLD);
        if (err != MPI_SUCCESS) return mpi_fail("MPI_Bcast", err);
    }
    return 0;
#else
    return mv_error("tp_comm_bcast: no MPI in this build");
#endif
}

int tp_comm_allreduce_sum_f32(const tp_comm_t *c, float *buf, size_t n) {
    if (c->size == 1) return 0;
#if MV_HAVE_MPI
    const size_t piece = MPI_PIECE / sizeof(float);
    for (size_t at = 0; at < n; at += piece) {
        size_t k = n - at < piece ? n - at : piece;
        int err = MPI_Allreduce(MPI_IN_PLACE, buf + at, (int)k, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        if (err != MPI_SUCCESS) return mpi_fail("MPI_Allreduce", err);
    }
    return 0;
#else
    return mv_error("tp_comm_allreduce_sum_f32: no MPI in this build");
#endif
}

int tp_comm_gather(const tp_comm_t *c, const void *send, size_t bytes, void *recv, int root) {
    if (c->size == 1) {
        if (bytes && recv != send) memcpy(recv, send, bytes);
        return 0;
    }
#if MV_HAVE_MPI
    if (bytes > (size_t)INT_MAX) return mv_error("tp_comm_gather: %zu bytes a rank is more than MPI's int count", bytes);
    int err = MPI_Gather(send, (int)bytes, MPI_BYTE, recv, (int)bytes, MPI_BYTE, root, MPI_COMM_WORLD);
    return err == MPI_SUCCESS ? 0 : mpi_fail("MPI_Gather", err);
#else
    return mv_error("tp_comm_gather: no MPI in this build");
#endif
}

// What each rank brings to tp_comm_agree: fixed size, so one all-gather.
typedef struct {
    int ok;
    char msg[1020];
} agree_note_t;

int tp_comm_agree(const tp_comm_t *c, int ok, const char *msg, int *failed_rank) {
    if (failed_rank) *failed_rank = -1;
    if (c->size == 1) {
        if (ok) return 0;
        if (failed_rank) *failed_rank = 0;
        return mv_error("%s", msg ? msg : "failed");
    }
#if MV_HAVE_MPI
    agree_note_t mine = {ok, ""};
    if (!ok) snprintf(mine.msg, sizeof mine.msg, "%s", msg ? msg : "failed");
    agree_note_t *all = calloc((size_t)c->size, sizeof *all);
    if (!all) return mv_error("tp_comm_agree: out of host memory");
    int err = MPI_Allgather(&mine, (int)sizeof mine, MPI_BYTE, all, (int)sizeof mine, MPI_BYTE, MPI_COMM_WORLD);
    if (err != MPI_SUCCESS) {
        free(all);
        return mpi_fail("MPI_Allgather", err);
    }
    int rc = 0;
    for (int r = 0; r < c->size && !rc; r++)
        if (!all[r].ok) {
            settled = 1;  // every rank knows: each can report it and end on its own
            if (failed_rank) *failed_rank = r;
            rc = mv_error("rank %d: %s", r, all[r].msg);
        }
    free(all);
    return rc;
#else
    return mv_error("tp_comm_agree: no MPI in this build");
#endif
}

void tp_comm_abort(const tp_comm_t *c, int status, const char *msg) {
    fflush(stdout);
    fprintf(stderr, "minivllm: tp rank %d of %d: %s\n", c->rank, c->size, msg);
    fflush(stderr);
#if MV_HAVE_MPI
    if (c->size > 1) MPI_Abort(MPI_COMM_WORLD, status);
#endif
    exit(status);
}

/* common/check.c - implementation of the error checks declared in check.h. */
#include "common/check.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static _Thread_local char last_error[1024];

int mv_error(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    return -1;
}

const char *mv_last_error(void) { return last_error; }

int mv_error_prefix(const char *fmt, ...) {
    // mv_error() writes into the buffer mv_last_error() returns: copy the
    // old message out before the new one is formatted over it.
    char old[sizeof last_error], prefix[sizeof last_error];
    snprintf(old, sizeof old, "%s", last_error);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    size_t n = strnlen(prefix, sizeof last_error - 1);
    memcpy(last_error, prefix, n);
    snprintf(last_error + n, sizeof last_error - n, ": %s", old);  // cut at the buffer's end, as mv_error()
    return -1;
}

void mv_die_at(const char *file, int line, const char *call, const char *what) {
    fflush(stdout);
    fprintf(stderr, "error: %s failed at %s:%d: %s\n", call, file, line,
            what && *what ? what : "(no message)");
    exit(1);
}

void *mv_xmalloc(size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) {
        char what[64];
        snprintf(what, sizeof what, "out of host memory (%zu bytes)", bytes);
        mv_die_at(__FILE__, __LINE__, "malloc", what);
    }
    return p;
}

void io_check_at(int ok, const char *call, const char *path, const char *file, int line) {
    if (ok) return;
    char what[1200];
    snprintf(what, sizeof what, "%s: %s (errno %s)", path ? path : "?", strerror(errno),
             errno == ENOENT ? "ENOENT" : errno == EACCES ? "EACCES" : errno == ENOSPC ? "ENOSPC" : "other");
    mv_die_at(file, line, call, what);
}

#if MV_HAVE_CUDA
void cuda_check_at(cudaError_t err, const char *call, const char *file, int line) {
    if (err == cudaSuccess) return;
    char what[512];
    snprintf(what, sizeof what, "%s (%s)", cudaGetErrorName(err), cudaGetErrorString(err));
    mv_die_at(file, line, call, what);
}

int cuda_try_at(cudaError_t err, const char *call, const char *file, int line) {
    if (err == cudaSuccess) return 0;
    return mv_error("%s failed at %s:%d: %s (%s)", call, file, line, cudaGetErrorName(err),
                    cudaGetErrorString(err));
}

void cublas_check_at(cublasStatus_t st, const char *call, const char *file, int line) {
    if (st == CUBLAS_STATUS_SUCCESS) return;
    char what[256];
    snprintf(what, sizeof what, "%s (%s)", cublasGetStatusName(st), cublasGetStatusString(st));
    mv_die_at(file, line, call, what);
}
#endif

#if MV_HAVE_NCCL
void nccl_check_at(ncclResult_t r, const char *call, const char *file, int line) {
    if (r == ncclSuccess) return;
    char what[512];
    snprintf(what, sizeof what, "ncclResult %d (%s)", (int)r, ncclGetErrorString(r));
    mv_die_at(file, line, call, what);
}

int nccl_try_at(ncclResult_t r, const char *call, const char *file, int line) {
    if (r == ncclSuccess) return 0;
    // ncclGetLastError(NULL): NCCL's message for the last failure of this
    // thread (which peer, which transport), often more telling than the name.
    const char *last = ncclGetLastError(NULL);
    return mv_error("%s failed at %s:%d: ncclResult %d (%s)%s%s", call, file, line, (int)r, ncclGetErrorString(r),
                    last && *last ? ": " : "", last && *last ? last : "");
}
#endif

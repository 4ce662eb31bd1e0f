/*
 * common/check.h - the lab's one family of error checks.
 *
 * Two kinds of code use it:
 *
 *  - Library code (kernels/, reference/, loaders) never exits. A function
 *    that can fail returns an int: 0 on success, -1 on failure, after it
 *    recorded a message with mv_error(). The caller reads mv_last_error().
 *    CUDA_TRY() (and NCCL_TRY()) turn a failing CUDA (NCCL) call into such a -1.
 *
 *  - Programs (chapter mains, tests, the engine's CLI) stop at the first
 *    failure: MV_CHECK, CUDA_CHECK, CUBLAS_CHECK, NCCL_CHECK and IO_CHECK
 *    print the failing call, file:line and the error's name, then exit(1).
 *
 * Every kernel launch is followed by CUDA_TRY(cudaGetLastError()) inside
 * its launcher, so a bad launch configuration is reported where it happens.
 */
#ifndef MV_CHECK_H
#define MV_CHECK_H

#include <stddef.h>

#if MV_HAVE_CUDA
#include <cublas_api.h>
#include <cuda_runtime_api.h>
#endif
#if MV_HAVE_NCCL
#include <nccl.h>
#endif

#ifdef __cplusplus
extern "C" {
#endif

// Record a formatted message as the last error of this thread; returns -1.
int mv_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
// The message recorded by the last mv_error() of this thread ("" if none).
const char *mv_last_error(void);
// Put a formatted prefix and ": " in front of this thread's last error (a
// caller adding where the failure happened: "layer 3: ..."); returns -1.
int mv_error_prefix(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
// Print "error: <call> failed at file:line: <what>" and exit(1).
void mv_die_at(const char *file, int line, const char *call, const char *what)
    __attribute__((noreturn));

static inline void mv_check_at(int status, const char *call, const char *file, int line) {
    if (status != 0) mv_die_at(file, line, call, mv_last_error());
}
// For library calls that return 0 / -1.
#define MV_CHECK(call) mv_check_at((call), #call, __FILE__, __LINE__)

// Programs only: malloc(bytes) (at least 1 byte), or exit with a message.
void *mv_xmalloc(size_t bytes);

// Host I/O: `ok` is the success condition; on failure errno names the error.
void io_check_at(int ok, const char *call, const char *path, const char *file, int line);
#define IO_CHECK(ok, path) io_check_at((ok) ? 1 : 0, #ok, (path), __FILE__, __LINE__)

#if MV_HAVE_CUDA
void cuda_check_at(cudaError_t err, const char *call, const char *file, int line);
int cuda_try_at(cudaError_t err, const char *call, const char *file, int line);
#define CUDA_CHECK(call) cuda_check_at((call), #call, __FILE__, __LINE__)
#define CUDA_TRY(call) cuda_try_at((call), #call, __FILE__, __LINE__)
#endif

#if MV_HAVE_CUDA
void cublas_check_at(cublasStatus_t st, const char *call, const char *file, int line);
#define CUBLAS_CHECK(call) cublas_check_at((call), #call, __FILE__, __LINE__)
#endif

#if MV_HAVE_NCCL
void nccl_check_at(ncclResult_t r, const char *call, const char *file, int line);
#define NCCL_CHECK(call) nccl_check_at((call), #call, __FILE__, __LINE__)
// Library code: 0, or -1 with mv_error() naming the call, file:line,
// ncclGetErrorString's name and NCCL's own last message (ncclGetLastError).
int nccl_try_at(ncclResult_t r, const char *call, const char *file, int line);
#define NCCL_TRY(call) nccl_try_at((call), #call, __FILE__, __LINE__)
#endif

#ifdef __cplusplus
}
#endif
#endif

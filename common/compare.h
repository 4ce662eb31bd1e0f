/*
 * common/compare.h - the one comparison routine every chapter uses.
 *
 * A kernel's output is compared element by element with the CPU reference
 * (fp32, or float64 for the reference's own check). An element passes when
 *
 *     |out - ref| <= atol + rtol * |ref|
 *
 * and the whole tensor passes when every element passes, nothing is NaN or
 * Inf (in out or in ref: always a failure), no element still holds the
 * poison pattern, and the normalised mean squared error
 *
 *     NMSE = sum (out - ref)^2 / sum ref^2
 *
 * is at most max_nmse. The first few mismatches are printed with their
 * index. Outputs are poisoned (every byte POISON_BYTE) before each run, so an
 * element the kernel never wrote shows up as "unwritten", not as a lucky
 * leftover from an earlier run.
 */
#ifndef MV_COMPARE_H
#define MV_COMPARE_H

#include <stddef.h>
#include <stdint.h>

#include "common/bf16.h"

#ifdef __cplusplus
extern "C" {
#endif

// 0xFF in every byte: bf16 0xFFFF and float 0xFFFFFFFF are both NaN, and a
// kernel's own NaN results (0x7FC0...) have another bit pattern.
#define POISON_BYTE 0xFF
#define POISON_BF16 ((bf16_t)0xFFFFu)
#define POISON_F32_BITS 0xFFFFFFFFu

typedef struct {
    double atol;      // absolute slack, for values near zero
    double rtol;      // relative slack, as a fraction of |ref|
    double max_nmse;  // bound on sum(err^2) / sum(ref^2)
    const char *reason;  // why these numbers: printed and saved with the result
} tolerance_t;

typedef struct {
    size_t n;            // elements compared
    size_t n_bad;        // elements outside atol + rtol * |ref|
    size_t n_nonfinite;  // NaN or Inf in out or ref (poison excluded)
    size_t n_unwritten;  // elements still holding the poison pattern
    double max_abs;      // max |out - ref|
    double max_rel;      // max |out - ref| / |ref| over |ref| > atol
    double nmse;         // sum (out - ref)^2 / sum ref^2
    int pass;
} compare_result_t;

// How many mismatching elements are printed (then "... and N more").
#define COMPARE_MAX_PRINTED 5

// `label` names the case in messages; quiet = 1 prints nothing.
compare_result_t compare_bf16(const char *label, const bf16_t *out, const float *ref, size_t n,
                              tolerance_t tol, int quiet);
compare_result_t compare_f32(const char *label, const float *out, const float *ref, size_t n,
                             tolerance_t tol, int quiet);
compare_result_t compare_f64(const char *label, const float *out, const double *ref, size_t n,
                             tolerance_t tol, int quiet);

void poison_host(void *p, size_t bytes);

#ifdef __cplusplus
}
#endif
#endif

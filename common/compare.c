/* common/compare.c - the comparison routine described in compare.h. */
#include "common/compare.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

// One element of either output type, already decoded.
typedef struct {
    double value;
    int poison;  // the element still holds the poison pattern
} elem_t;

typedef elem_t (*get_out_fn)(const void *out, size_t i);
typedef double (*get_ref_fn)(const void *ref, size_t i);

static elem_t get_bf16(const void *out, size_t i) {
    bf16_t h = ((const bf16_t *)out)[i];
    return (elem_t){bf16_to_float(h), h == POISON_BF16};
}

static elem_t get_f32(const void *out, size_t i) {
    float f = ((const float *)out)[i];
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return (elem_t){f, u == POISON_F32_BITS};
}

static double ref_f32(const void *ref, size_t i) { return ((const float *)ref)[i]; }
static double ref_f64(const void *ref, size_t i) { return ((const double *)ref)[i]; }

static compare_result_t compare_generic(const char *label, const void *out, get_out_fn get_out,
                                        const void *ref, get_ref_fn get_ref, size_t n,
                                        tolerance_t tol, int quiet) {
    compare_result_t r = {0};
    r.n = n;
    double sum_err2 = 0.0, sum_ref2 = 0.0;
    size_t printed = 0;
    for (size_t i = 0; i < n; i++) {
        elem_t o = get_out(out, i);
        double e = get_ref(ref, i);
        const char *why = NULL;
        if (o.poison) {
            r.n_unwritten++;
            why = "unwritten (still poisoned)";
        } else if (!isfinite(o.value) || !isfinite(e)) {
            r.n_nonfinite++;
            why = isfinite(e) ? "output is NaN/Inf" : "reference is NaN/Inf";
        } else {
            double err = fabs(o.value - e);
            sum_err2 += err * err;
            sum_ref2 += e * e;
            if (err > r.max_abs) r.max_abs = err;
            if (fabs(e) > tol.atol && err / fabs(e) > r.max_rel) r.max_rel = err / fabs(e);
            if (!(err <= tol.atol + tol.rtol * fabs(e))) {
                r.n_bad++;
                why = "outside tolerance";
            }
        }
        if (why && !quiet && printed < COMPARE_MAX_PRINTED) {
            printf("    mismatch %s[%zu]: got %.8g, expected %.8g (%s)\n", label, i, o.value, e,
                   why);
            printed++;
        }
    }
    size_t n_fail = r.n_bad + r.n_nonfinite + r.n_unwritten;
    if (!quiet && n_fail > printed) printf("    ... and %zu more mismatches in %s\n", n_fail - printed, label);
    // NMSE over the finite elements; an all-zero reference compares absolute error.
    r.nmse = sum_ref2 > 0.0 ? sum_err2 / sum_ref2 : sum_err2;
    r.pass = n_fail == 0 && r.nmse <= tol.max_nmse;
    if (!quiet && n_fail == 0 && !r.pass)
        printf("    %s: NMSE %.3e is above its bound %.3e\n", label, r.nmse, tol.max_nmse);
    return r;
}

compare_result_t compare_bf16(const char *label, const bf16_t *out, const float *ref, size_t n,
                              tolerance_t tol, int quiet) {
    return compare_generic(label, out, get_bf16, ref, ref_f32, n, tol, quiet);
}

compare_result_t compare_f32(const char *label, const float *out, const float *ref, size_t n,
                             tolerance_t tol, int quiet) {
    return compare_generic(label, out, get_f32, ref, ref_f32, n, tol, quiet);
}

compare_result_t compare_f64(const char *label, const float *out, const double *ref, size_t n,
                             tolerance_t tol, int quiet) {
    return compare_generic(label, out, get_f32, ref, ref_f64, n, tol, quiet);
}

void poison_host(void *p, size_t bytes) { memset(p, POISON_BYTE, bytes); }

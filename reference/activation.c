/*
 * reference/activation.c - SiluAndMul on the CPU (see activation.h).
 * Clarity first: this is the code the GPU kernels are checked against.
 */
#include "reference/activation.h"

#include "common/check.h"

int silu_and_mul_validate(long long T, long long I) {
    if (T < 0) return mv_error("silu_and_mul: T (tokens) must be >= 0, got %lld", T);
    if (I < 1 || I > SILU_AND_MUL_MAX_I)
        return mv_error("silu_and_mul: I (intermediate size) must be in [1, %d], got %lld",
                        SILU_AND_MUL_MAX_I, I);
    if (T * 2 * I > (1LL << 40))
        return mv_error("silu_and_mul: T*2*I = %lld elements is larger than the lab supports", T * 2 * I);
    return 0;
}

int silu_and_mul_cpu(float *out, const float *in, int T, int I) {
    if (silu_and_mul_validate(T, I)) return -1;
    for (int t = 0; t < T; t++) {
        const float *gate = in + (size_t)t * 2 * I;  // [I]
        const float *up = gate + I;                  // [I]
        float *y = out + (size_t)t * I;              // [I]
        for (int j = 0; j < I; j++) y[j] = silu_f32(gate[j]) * up[j];
    }
    return 0;
}

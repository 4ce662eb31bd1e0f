/*
 * common/bf16.h - bf16 <-> float on the host.
 *
 * Qwen3 checkpoints store weights and activations as bfloat16 (bf16): the top
 * 16 bits of an IEEE float32 (1 sign bit, 8 exponent bits, 7 mantissa bits).
 * The host code of the lab keeps bf16 values as raw 16-bit patterns
 * (`bf16_t`); CUDA code reinterprets the same bits as `__nv_bfloat16`.
 *
 * float -> bf16 rounds to nearest, ties to even, as PyTorch and the CUDA
 * intrinsic __float2bfloat16 do. NaN stays NaN (quiet); Inf stays Inf.
 */
#ifndef MV_BF16_H
#define MV_BF16_H

#include <stdint.h>
#include <string.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef uint16_t bf16_t;  // raw bf16 bits

static inline float bf16_to_float(bf16_t h) {
    uint32_t u = (uint32_t)h << 16;  // bf16 is the high half of a float32
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline bf16_t float_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u)  // NaN: keep it a quiet NaN
        return (bf16_t)((u >> 16) | 0x0040u);
    // Round to nearest even: add 0x7fff plus the lowest kept bit, then cut.
    u += 0x7fffu + ((u >> 16) & 1u);
    return (bf16_t)(u >> 16);
}

// The value a float takes once it has been stored as bf16.
static inline float bf16_round(float f) { return bf16_to_float(float_to_bf16(f)); }

// Half a bf16 ulp, relative: bf16 keeps 8 significant bits (7 stored, one
// implied), so rounding to nearest moves a value by at most 2^-8 of it. Every
// tolerance for a bf16 output starts from this (and its square, for NMSE).
#define BF16_HALF_ULP (1.0 / 256)

void bf16_to_float_array(float *dst, const bf16_t *src, size_t n);
void float_to_bf16_array(bf16_t *dst, const float *src, size_t n);

#ifdef __cplusplus
}
#endif
#endif

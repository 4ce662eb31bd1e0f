/* common/bf16.c - array versions of the bf16 conversions in bf16.h. */
#include "common/bf16.h"

void bf16_to_float_array(float *dst, const bf16_t *src, size_t n) {
    for (size_t i = 0; i < n; i++) dst[i] = bf16_to_float(src[i]);
}

void float_to_bf16_array(bf16_t *dst, const float *src, size_t n) {
    for (size_t i = 0; i < n; i++) dst[i] = float_to_bf16(src[i]);
}

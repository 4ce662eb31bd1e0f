/*
 * common/rng.h - seeded random inputs.
 *
 * Every chapter draws its inputs from one seed (--seed), so a failing case
 * can be replayed exactly. The generator is splitmix64: tiny, fast, and good
 * enough for test data. Inputs come in realistic ranges, never all zeros
 * (zeros hide unwritten outputs and wrong indexing).
 */
#ifndef MV_RNG_H
#define MV_RNG_H

#include <stddef.h>
#include <stdint.h>

#include "common/bf16.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    uint64_t state;
} rng_t;

void rng_seed(rng_t *r, uint64_t seed);
uint64_t rng_u64(rng_t *r);
double rng_double(rng_t *r);                    // uniform in [0, 1)
float rng_uniform(rng_t *r, float lo, float hi);  // uniform in [lo, hi)
float rng_normal(rng_t *r, float mean, float std);
int rng_int(rng_t *r, int lo, int hi);          // uniform in [lo, hi], inclusive

void fill_uniform_f32(rng_t *r, float *x, size_t n, float lo, float hi);
void fill_normal_f32(rng_t *r, float *x, size_t n, float mean, float std);
// bf16 fills: the values are drawn in float, then rounded to bf16.
void fill_uniform_bf16(rng_t *r, bf16_t *x, size_t n, float lo, float hi);
void fill_normal_bf16(rng_t *r, bf16_t *x, size_t n, float mean, float std);

#ifdef __cplusplus
}
#endif
#endif

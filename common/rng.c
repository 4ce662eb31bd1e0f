/* common/rng.c - splitmix64 and the fill helpers declared in rng.h. */
#include "common/rng.h"

#include <math.h>

void rng_seed(rng_t *r, uint64_t seed) { r->state = seed ^ 0x9e3779b97f4a7c15ull; }

uint64_t rng_u64(rng_t *r) {
    // splitmix64 (Steele, Lea, Flood 2014): a Weyl sequence through a mixer.
    uint64_t z = (r->state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

double rng_double(rng_t *r) { return (double)(rng_u64(r) >> 11) * 0x1.0p-53; }

float rng_uniform(rng_t *r, float lo, float hi) {
    return lo + (hi - lo) * (float)rng_double(r);
}

float rng_normal(rng_t *r, float mean, float std) {
    // Box-Muller; 1 - u keeps the logarithm's argument away from 0.
    double u1 = 1.0 - rng_double(r), u2 = rng_double(r);
    double z = sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
    return mean + std * (float)z;
}

int rng_int(rng_t *r, int lo, int hi) {
    uint64_t span = (uint64_t)((int64_t)hi - lo + 1);
    return lo + (int)(rng_u64(r) % span);
}

void fill_uniform_f32(rng_t *r, float *x, size_t n, float lo, float hi) {
    for (size_t i = 0; i < n; i++) x[i] = rng_uniform(r, lo, hi);
}

void fill_normal_f32(rng_t *r, float *x, size_t n, float mean, float std) {
    for (size_t i = 0; i < n; i++) x[i] = rng_normal(r, mean, std);
}

void fill_uniform_bf16(rng_t *r, bf16_t *x, size_t n, float lo, float hi) {
    for (size_t i = 0; i < n; i++) x[i] = float_to_bf16(rng_uniform(r, lo, hi));
}

void fill_normal_bf16(rng_t *r, bf16_t *x, size_t n, float mean, float std) {
    for (size_t i = 0; i < n; i++) x[i] = float_to_bf16(rng_normal(r, mean, std));
}

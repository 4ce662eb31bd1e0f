/*
 * reference/sampling_math.h - the arithmetic the sampler's two backends
 * share, so that they return the same token id, bit for bit: the
 * Philox4x32-10 generator, exp and log built from IEEE +, -, *, / and fma
 * only, and the sampler's rule as small functions (a token's order key, its
 * integer mass, the top-p target, its Gumbel score).
 *
 * Where it sits: after the LM head, in the sampler. Included by
 * reference/sampling.c (the CPU reference, plain C11) and by
 * kernels/sampling.cu (the GPU sampler), where every function here is
 * __host__ __device__. One copy: a change here changes both backends.
 * Tests: tests/test_sampling.c (exp and log against libm, Philox against
 * Random123's known answers).
 *
 * Why a shared header and not libm / CUDA's math: IEEE 754 fixes the result
 * of +, -, *, / and fma (correctly rounded), so the same sequence of those
 * operations gives the same bits on any conforming machine. expf and logf
 * are not fixed: glibc, CUDA's logf and __expf differ in the last bit or
 * two, and a last bit is enough to move a Gumbel score past its neighbour's.
 * So exp and log are written here from the fixed operations. Three things
 * could still reorder or fuse them, and each is closed off:
 *   - contraction of a*b + c into one fma (one rounding instead of two):
 *     nvcc does it by default, gcc in its GNU modes. On the GPU every
 *     operation goes through __fadd_rn / __fmul_rn / ..., which nvcc never
 *     fuses; every fma we want is written as fmaf(). On the host the lab
 *     compiles with -std=c11, where gcc does not contract (a GNU mode on a
 *     machine with fma instructions is refused below; clang is told with
 *     its pragma).
 *   - excess precision (x87): FLT_EVAL_METHOD must be 0, checked below.
 *   - flushing subnormals to zero (nvcc -ftz=true, which --use_fast_math
 *     implies; the Makefile uses neither): exp never produces a subnormal
 *     (it returns 0 below 2^-125), so only subnormal logits would notice.
 */
#ifndef MV_REF_SAMPLING_MATH_H
#define MV_REF_SAMPLING_MATH_H

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#if defined(__CUDACC__)
#define SAMPLING_FN static inline __host__ __device__
#else
#define SAMPLING_FN static inline
#endif

#if !defined(__CUDA_ARCH__)
#if FLT_EVAL_METHOD != 0
#error "reference/sampling_math.h needs float arithmetic in float (FLT_EVAL_METHOD 0): x87 keeps excess precision"
#endif
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__) && !defined(__STRICT_ANSI__) && defined(__FP_FAST_FMAF)
#error "reference/sampling_math.h: a GNU mode with fma instructions contracts a*b+c; compile with -std=c11 (as the Makefile does) or -ffp-contract=off"
#endif
#endif

// ---- one IEEE operation each, never fused ----------------------------------------------------

SAMPLING_FN float smath_add(float a, float b) {
#ifdef __CUDA_ARCH__
    return __fadd_rn(a, b);
#else
    return a + b;
#endif
}
SAMPLING_FN float smath_sub(float a, float b) {
#ifdef __CUDA_ARCH__
    return __fsub_rn(a, b);
#else
    return a - b;
#endif
}
SAMPLING_FN float smath_mul(float a, float b) {
#ifdef __CUDA_ARCH__
    return __fmul_rn(a, b);
#else
    return a * b;
#endif
}
SAMPLING_FN float smath_div(float a, float b) {
#ifdef __CUDA_ARCH__
    return __fdiv_rn(a, b);
#else
    return a / b;
#endif
}
SAMPLING_FN double smath_dmul(double a, double b) {
#ifdef __CUDA_ARCH__
    return __dmul_rn(a, b);
#else
    return a * b;
#endif
}
SAMPLING_FN uint32_t smath_bits(float x) {
#ifdef __CUDA_ARCH__
    return __float_as_uint(x);
#else
    uint32_t b;
    memcpy(&b, &x, sizeof b);
    return b;
#endif
}
SAMPLING_FN float smath_from_bits(uint32_t b) {
#ifdef __CUDA_ARCH__
    return __uint_as_float(b);
#else
    float x;
    memcpy(&x, &b, sizeof x);
    return x;
#endif
}

// ---- exp and log ---------------------------------------------------------------------------

// e^x for every float x, within 1 ulp of the exact value (tests/test_sampling.c
// measures the worst case against double exp() and prints it).
// x = k ln2 + r with k = rint(x log2 e) and |r| <= ln2/2; r = x - k ln2 in
// two fma steps, ln2 split as LN2_HI (8 trailing zero bits, so k LN2_HI is
// exact for |k| < 256) + LN2_LO (Cody and Waite). e^r is its Taylor series
// up to r^7, in Horner form, one fma a step: the first term left out,
// r^8/8!, is below 6e-9 relative for |r| <= 0.347 (a tenth of an ulp).
// Then times 2^k, in two exact steps of 2^(k/2) built from their bits.
// Results below about 2^-125 are 0 (no subnormal is ever produced); above
// FLT_MAX, +inf. NaN stays NaN.
SAMPLING_FN float sampling_expf(float x) {
    const float LOG2E = 0x1.715476p+0f, LN2_HI = 0x1.62e400p-1f, LN2_LO = 0x1.7f7d1cp-20f;
    if (x != x) return x;
    if (x > 89.0f) return INFINITY;  // e^88.73 > FLT_MAX already: the scaling below overflows for those
    const float kf = rintf(smath_mul(x, LOG2E));  // x = -inf gives -inf here
    if (kf < -125.0f) return 0.0f;               // e^x < 2^-125
    const int k = (int)kf;
    float r = fmaf(-kf, LN2_HI, x);  // exact
    r = fmaf(-kf, LN2_LO, r);
    float p = 0x1.a01a02p-13f;          // 1/7!
    p = fmaf(p, r, 0x1.6c16c2p-10f);    // 1/6!
    p = fmaf(p, r, 0x1.111112p-7f);     // 1/5!
    p = fmaf(p, r, 0x1.555556p-5f);     // 1/4!
    p = fmaf(p, r, 0x1.555556p-3f);     // 1/3!
    p = fmaf(p, r, 0.5f);
    p = fmaf(p, r, 1.0f);
    p = fmaf(p, r, 1.0f);  // e^r, in [0.707, 1.415]; exactly 1 for r = 0
    const int k1 = k / 2, k2 = k - k1;  // each in [-63, 64]: 2^k1 and 2^k2 are normal floats
    p = smath_mul(p, smath_from_bits((uint32_t)(k1 + 127) << 23));
    return smath_mul(p, smath_from_bits((uint32_t)(k2 + 127) << 23));
}

// log(x) for every float x: -inf at 0, NaN below 0 and for NaN, +inf at
// +inf; within 1 ulp elsewhere (measured in tests/test_sampling.c).
// The method of fdlibm's logf (Sun, 1993; FreeBSD and musl keep it):
// x = 2^k m with m in [sqrt(1/2), sqrt(2)), f = m - 1 (exact), and
// log(m) = log(1 + f) = 2 atanh(s) with s = f / (2 + f), |s| <= 0.172:
// f - f^2/2 + s (f^2/2 + R(s^2)), where R is fdlibm's degree-8 minimax
// polynomial in s (four coefficients, in s^2, split odd/even for speed).
// log 2 is split as LN2_HI (exact times any k) + LN2_LO.
SAMPLING_FN float sampling_logf(float x) {
    const float LG1 = 0xaaaaaa.0p-24f, LG2 = 0xccce13.0p-25f, LG3 = 0x91e9ee.0p-25f, LG4 = 0xf89e26.0p-26f;
    const float LN2_HI = 0x1.62e300p-1f, LN2_LO = 0x1.2fefa2p-17f;
    if (!(x > 0.0f)) return x == 0.0f ? -INFINITY : NAN;  // NaN lands here too
    if (x == INFINITY) return x;
    int k = 0;
    uint32_t b = smath_bits(x);
    if (b < 0x00800000u) {  // subnormal: scale by 2^25 first (exact)
        b = smath_bits(smath_mul(x, 0x1p25f));
        k = -25;
    }
    k += (int)(b >> 23) - 127;
    b = (b & 0x007fffffu) | 0x3f800000u;  // m in [1, 2)
    if (b > 0x3fb504f3u) {                // m > sqrt(2): use m / 2
        b -= 0x00800000u;
        k += 1;
    }
    const float f = smath_sub(smath_from_bits(b), 1.0f);
    const float s = smath_div(f, smath_add(2.0f, f));
    const float z = smath_mul(s, s), w = smath_mul(z, z);
    const float t1 = smath_mul(w, fmaf(w, LG4, LG2));
    const float t2 = smath_mul(z, fmaf(w, LG3, LG1));
    const float R = smath_add(t2, t1);
    const float hfsq = smath_mul(smath_mul(0.5f, f), f);
    const float dk = (float)k;
    // fdlibm's order: s (hfsq + R) + k LN2_LO - hfsq + f + k LN2_HI
    float y = fmaf(s, smath_add(hfsq, R), smath_mul(dk, LN2_LO));
    y = smath_add(smath_sub(y, hfsq), f);
    return smath_add(y, smath_mul(dk, LN2_HI));
}

// ---- Philox4x32-10 ---------------------------------------------------------------------------

// Philox4x32-10 (Salmon, Moraes, Dror, Shaw: "Parallel random numbers: as
// easy as 1, 2, 3", SC'11). Ten rounds of: two 32x32 -> 64-bit multiplies,
// their halves xor-ed with the other counter words and the key, the key
// bumped by the golden-ratio constants. Counter-based: the output is a pure
// function of (counter, key), so any thread can draw any number, in any
// order. The same bits as Random123's philox4x32 (its known-answer vectors
// are in tests/test_sampling.c).
typedef struct {
    uint32_t v[4];
} philox4x32_t;

SAMPLING_FN philox4x32_t philox4x32_10(philox4x32_t ctr, uint32_t k0, uint32_t k1) {
    const uint32_t M0 = 0xD2511F53u, M1 = 0xCD9E8D57u, W0 = 0x9E3779B9u, W1 = 0xBB67AE85u;
    uint32_t c0 = ctr.v[0], c1 = ctr.v[1], c2 = ctr.v[2], c3 = ctr.v[3];
    for (int round = 0; round < 10; round++) {
        const uint64_t p0 = (uint64_t)M0 * c0, p1 = (uint64_t)M1 * c2;
        const uint32_t hi0 = (uint32_t)(p0 >> 32), lo0 = (uint32_t)p0;
        const uint32_t hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
        c0 = hi1 ^ c1 ^ k0;
        c1 = lo1;
        c2 = hi0 ^ c3 ^ k1;
        c3 = lo0;
        k0 += W0;
        k1 += W1;
    }
    philox4x32_t out = {{c0, c1, c2, c3}};
    return out;
}

// The uniform number of token `id` in the draw of a request's gen_index-th
// token: Philox keyed by the seed, counter (id, gen_index low, gen_index
// high, 0), the first output word's top 23 bits plus a half, times 2^-23.
// Every step is exact, so u = (j + 1/2) 2^-23 for j in [0, 2^23): strictly
// inside (0, 1), and log(-log(u)) is always finite. (24 bits plus a half
// would need 25 bits of mantissa: j + 1/2 rounds up to 2^24 and u to 1.)
SAMPLING_FN float sampling_uniform(uint64_t seed, int64_t gen_index, int32_t id) {
    const philox4x32_t ctr = {{(uint32_t)id, (uint32_t)(uint64_t)gen_index, (uint32_t)((uint64_t)gen_index >> 32), 0u}};
    const uint32_t x = philox4x32_10(ctr, (uint32_t)seed, (uint32_t)(seed >> 32)).v[0];
    return smath_mul(smath_add((float)(x >> 9), 0.5f), 0x1p-23f);
}

// ---- the sampler's rule, piece by piece ----------------------------------------------------

// A non-NaN float's place in the order, as an unsigned integer:
// -inf < ... < -0 = +0 < ... < +inf (the two zeros are one value, so they
// tie, and a tie goes to the lower id).
SAMPLING_FN uint32_t sampling_order_key(float x) {
    uint32_t b = smath_bits(x);
    if ((b & 0x7fffffffu) == 0) b = 0;
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// (key, id) as one integer whose order is the sampler's order: larger key
// first, then lower id. 0 is below every pack (an id's half is >= 2^31).
SAMPLING_FN uint64_t sampling_pack(uint32_t key, int32_t id) {
    return ((uint64_t)key << 32) | (uint64_t)(0xffffffffu - (uint32_t)id);
}
SAMPLING_FN int32_t sampling_unpack_id(uint64_t pack) { return (int32_t)(0xffffffffu - (uint32_t)pack); }

// 1 / temperature, for temperature > 0; capped at FLT_MAX so that the top
// token's log weight 0 * inv_t stays 0 for a subnormal temperature.
SAMPLING_FN float sampling_inv_temperature(float temperature) {
    const float inv_t = smath_div(1.0f, temperature);
    return inv_t > FLT_MAX ? FLT_MAX : inv_t;
}

// A token's log weight relative to the top logit: x = (logit - top) / T,
// computed as (logit - top) * inv_t (two roundings, the same on both
// sides); <= 0, 0 for the top token, -inf when the difference overflows.
SAMPLING_FN float sampling_log_weight(float logit, float top, float inv_t) {
    return smath_mul(smath_sub(logit, top), inv_t);
}

// A token's mass for top-p, as an integer: e^x in units of 2^-32,
// truncated (1.32 fixed point; the top token weighs exactly 2^32). Sums of
// masses are exact integer sums, the same in any order: a block reduction
// and a serial loop agree to the last bit, which no float sum guarantees.
// What it drops: a token below 2^-32 of the top's weight weighs 0 for
// top-p, and each weight is short of e^x by less than 2^-32. A row has
// fewer than 2^31 tokens, so a sum stays below 2^63.
#define SAMPLING_MASS_ONE 0x1p32f
SAMPLING_FN uint64_t sampling_mass(float x) { return (uint64_t)smath_mul(sampling_expf(x), SAMPLING_MASS_ONE); }

// Top-p keeps the shortest prefix of the order whose mass reaches
// ceil(top_p * mass), mass being the sum over the candidates. The product
// is one IEEE double multiplication (top_p has 24 bits, mass < 2^63), the
// same on both sides; exact while mass < 2^29, within 2^-53 relative
// beyond. At least 1 (top_p > 0), at most mass.
SAMPLING_FN uint64_t sampling_top_p_target(float top_p, uint64_t mass) {
    const uint64_t t = (uint64_t)ceil(smath_dmul((double)top_p, (double)mass));
    return t < mass ? t : mass;
}

// The Gumbel-max score of a kept token: x + g, g = -log(-log(u)), u this
// token's uniform number. The largest score wins; over the kept set, token
// i wins with probability e^x_i / sum of e^x (Gumbel 1954; the "Gumbel-max
// trick"). g lies in [-2.82, 16.64] (u in [2^-24, 1 - 2^-24];
// tests/test_sampling.c checks both ends), so a token whose x is below
// SAMPLING_NEVER_WINS scores below -3.3 and never beats the top token
// (x = 0, score >= -2.82): a draw may skip it.
#define SAMPLING_NEVER_WINS -20.0f
SAMPLING_FN float sampling_gumbel_score(float x, uint64_t seed, int64_t gen_index, int32_t id) {
    const float u = sampling_uniform(seed, gen_index, id);
    return smath_sub(x, sampling_logf(-sampling_logf(u)));
}

#endif

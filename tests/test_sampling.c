/*
 * tests/test_sampling.c - the sampler's CPU reference (reference/sampling.h)
 * and the arithmetic it shares with the GPU sampler
 * (reference/sampling_math.h).
 *
 * What must hold:
 *   - Philox4x32-10 gives Random123's known answers; the uniform numbers
 *     are exact and strictly inside (0, 1);
 *   - the shared exp and log are within EXP_LOG_ULP_TOL of the exact value
 *     (double libm) over the whole float range they serve;
 *   - greedy: the lowest id on ties, -0 = +0, NaN never wins, no finite
 *     largest value is an error;
 *   - the kept sets of top-k / top-p equal a brute-force sort with the same
 *     integer masses exactly, and a double-precision softmax up to a stated
 *     slack at the cut;
 *   - draws stay inside the kept set and follow softmax(logits / T) over it
 *     (chi-square over 200000 draws);
 *   - a draw depends on (seed, gen_index, logits, parameters) only;
 *   - min_p as a mask (sampling_min_p_mask_cpu, what the GPU does): the
 *     rule without min_p on the masked row keeps and draws exactly what the
 *     rule with it does on the row, for any top-k and top-p, and a mask one
 *     token off is caught;
 *   - a committed golden: fixed logits, parameters and seeds, the ids the
 *     rule gives; a change of the random stream or the rule fails, saying
 *     which.
 *
 * Run: make build/tests/test_sampling && build/tests/test_sampling
 * (MV_VERBOSE=1 prints the measured ulp errors and the chi-square values).
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/check.h"
#include "common/rng.h"
#include "reference/sampling.h"
#include "reference/sampling_math.h"

// Tolerances (conventions: each with its reason, never tuned to pass).
// exp and log: the sampler needs them to be the same on both backends, not
// to be exact; a few ulp would do. The methods are good to about half an
// ulp plus the final roundings (see sampling_math.h), so 1 ulp is what
// they claim, and what is checked.
#define EXP_LOG_ULP_TOL 1.0
// Kept sets against a double-precision softmax: the reference computes
// x = (l - top) / T in fp32 (three roundings: a relative error of about
// 2e-7 |x|, so up to 4e-6 in e^x for |x| up to 20) and truncates each mass
// to 2^-32 of the top's (at most vocab x 2^-32 = 1e-6 of the total for
// vocab 4096). A cumulative probability within 2e-5 of top_p may therefore
// fall on either side of it; anywhere else the two must agree.
#define TOP_P_SLACK 2e-5
// The chi-square threshold: the Wilson-Hilferty approximation of the
// quantile of chi-square with d degrees of freedom at z = 5 standard
// normal deviations (one-sided probability 3e-7): a correct sampler fails
// this for fewer than one seed set in a million.
#define CHI2_Z 5.0

static int verbose(void) { return getenv("MV_VERBOSE") != NULL; }

// ---- Philox and the uniform numbers ------------------------------------------------------------

// Random123's tests/kat_vectors, the three philox4x32 10 lines: counter,
// key, expected output.
Test(philox, random123_known_answers) {
    static const struct {
        uint32_t ctr[4], key[2], want[4];
    } kat[3] = {
        {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}},
        {{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu},
         {0xffffffffu, 0xffffffffu},
         {0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}},
        {{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u},
         {0xa4093822u, 0x299f31d0u},
         {0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}},
    };
    for (int t = 0; t < 3; t++) {
        const philox4x32_t ctr = {{kat[t].ctr[0], kat[t].ctr[1], kat[t].ctr[2], kat[t].ctr[3]}};
        const philox4x32_t out = philox4x32_10(ctr, kat[t].key[0], kat[t].key[1]);
        for (int w = 0; w < 4; w++)
            cr_expect_eq(out.v[w], kat[t].want[w],
                         "Philox4x32-10 known answer %d, word %d: %08x, Random123 says %08x: the generator changed", t,
                         w, out.v[w], kat[t].want[w]);
    }
}

// u = (j + 1/2) 2^-23 exactly, j < 2^23: never 0 or 1, so the Gumbel noise
// is always finite; and both halves of the seed and of gen_index matter.
Test(philox, uniform_numbers_are_exact_and_inside_0_1) {
    double sum = 0;
    const int N = 1 << 20;
    for (int i = 0; i < N; i++) {
        const float u = sampling_uniform(0x0123456789abcdefull, i / 1024, i % 1024);
        const double j = (double)u * 0x1p23 - 0.5;
        cr_assert(u > 0.0f && u < 1.0f, "u = %a", (double)u);
        cr_assert(j == floor(j) && j >= 0 && j < 0x1p23, "u = %a is not (j + 1/2) 2^-23", (double)u);
        cr_assert(isfinite(sampling_gumbel_score(0.0f, 5, i / 1024, i % 1024)));
        sum += u;
    }
    // the mean of 2^20 uniforms: standard deviation 0.29 / 1024 = 2.8e-4; 6 of them
    cr_expect(fabs(sum / N - 0.5) < 1.7e-3, "mean %g", sum / N);
    int differ = 0;
    for (int id = 0; id < 64; id++) {
        differ += sampling_uniform(1, 3, id) != sampling_uniform(1 + (1ull << 32), 3, id);
        differ += sampling_uniform(1, 3, id) != sampling_uniform(1, 3 + (1ll << 32), id);
    }
    cr_expect_geq(differ, 120, "the high halves of seed / gen_index barely change the stream (%d of 128)", differ);
    // the largest and smallest possible values
    cr_expect_eq(smath_mul(smath_add((float)(0xffffffffu >> 9), 0.5f), 0x1p-23f), 1.0f - 0x1p-24f);
    cr_expect_eq(smath_mul(smath_add(0.0f, 0.5f), 0x1p-23f), 0x1p-24f);
}

// Where the key and the counter go (Philox itself is pinned by the known
// answers above): four uniforms of seed 0x0123456789abcdef, committed when
// the layout was chosen.
Test(philox, the_counter_layout_is_unchanged) {
    static const struct {
        int32_t id;
        int64_t gen;
        float u;
    } g[4] = {{0, 7, 0x1.836404p-2f}, {1, 7, 0x1.18fe6cp-2f}, {151935, 7, 0x1.ea719cp-2f}, {7, 1ll << 33, 0x1.08b32ep-1f}};
    for (int t = 0; t < 4; t++) {
        const float u = sampling_uniform(0x0123456789abcdefull, g[t].gen, g[t].id);
        cr_expect_eq(u, g[t].u,
                     "sampling_uniform(seed 0x0123456789abcdef, gen_index %lld, id %d) = %a, committed %a: the key "
                     "(seed), the counter (id, gen_index) or the uniform mapping changed",
                     (long long)g[t].gen, g[t].id, (double)u, (double)g[t].u);
    }
}

// ---- exp and log against libm -----------------------------------------------------------------

// |got - exact| in units of the last place of exact, as a float.
static double ulp_error(float got, double exact) {
    if (got == exact) return 0;
    int e;
    frexp(exact, &e);  // exact = m 2^e, m in [0.5, 1)
    double ulp = ldexp(1.0, (e - 24 < -149 ? -149 : e - 24));
    return fabs((double)got - exact) / ulp;
}

static float float_of_bits(uint32_t b) { return smath_from_bits(b); }

Test(smath, exp_is_within_1_ulp_of_libm) {
    double worst = 0;
    float worst_x = 0;
    long n = 0;
    // Every 61st float of each sign, up to the overflow: both signs' whole
    // range where e^x is a normal float, plus the flush and overflow ends.
    for (int sign = 0; sign < 2; sign++)
        for (uint32_t b = 0; b < 0x42c80000u; b += 61) {  // |x| < 100
            const float x = float_of_bits(b | (sign ? 0x80000000u : 0));
            const double exact = exp((double)x);
            const float got = sampling_expf(x);
            n++;
            if (exact > FLT_MAX) {
                cr_assert(got == INFINITY, "exp(%a) = %a, want +inf", (double)x, (double)got);
            } else if (exact < 0x1p-126) {
                cr_assert(got == 0.0f, "exp(%a) = %a: below 2^-126 must be 0 (no subnormal)", (double)x, (double)got);
            } else if (got == 0.0f) {
                cr_assert(exact < 0x1p-125, "exp(%a) = 0 but exact %a >= 2^-125", (double)x, exact);
            } else {
                const double err = ulp_error(got, exact);
                if (err > worst) worst = err, worst_x = x;
            }
        }
    if (verbose()) fprintf(stderr, "sampling_expf: max error %.3f ulp (at x = %a) over %ld values\n", worst, (double)worst_x, n);
    cr_expect_leq(worst, EXP_LOG_ULP_TOL, "sampling_expf: %.3f ulp at x = %a", worst, (double)worst_x);
    cr_expect_eq(sampling_expf(0.0f), 1.0f, "e^0 must be exactly 1: the top token's mass is exactly 2^32");
    cr_expect_eq(sampling_expf(-0.0f), 1.0f);
    cr_expect_eq(sampling_expf(-INFINITY), 0.0f);
    cr_expect_eq(sampling_expf(INFINITY), INFINITY);
    cr_expect(isnan(sampling_expf(NAN)));
    cr_expect(isfinite(sampling_expf(88.72283172607421875f)), "the largest x with a finite e^x");
    cr_expect_eq(sampling_expf(88.72283935546875f), INFINITY);
}

Test(smath, log_is_within_1_ulp_of_libm) {
    double worst = 0;
    float worst_x = 0;
    long n = 0;
    // Every 53rd positive float, subnormals included.
    for (uint32_t b = 1; b < 0x7f800000u; b += 53) {
        const float x = float_of_bits(b);
        const double exact = log((double)x);
        const float got = sampling_logf(x);
        n++;
        const double err = ulp_error(got, exact);
        if (err > worst) worst = err, worst_x = x;
    }
    // and densely around 1, where log is near 0 and relative error shows
    for (uint32_t b = 0x3f700000u; b < 0x3f880000u; b++) {
        const float x = float_of_bits(b);
        const double err = ulp_error(sampling_logf(x), log((double)x));
        n++;
        if (err > worst) worst = err, worst_x = x;
    }
    if (verbose()) fprintf(stderr, "sampling_logf: max error %.3f ulp (at x = %a) over %ld values\n", worst, (double)worst_x, n);
    cr_expect_leq(worst, EXP_LOG_ULP_TOL, "sampling_logf: %.3f ulp at x = %a", worst, (double)worst_x);
    cr_expect_eq(sampling_logf(1.0f), 0.0f);
    cr_expect_eq(sampling_logf(0.0f), -INFINITY);
    cr_expect_eq(sampling_logf(-0.0f), -INFINITY);
    cr_expect(isnan(sampling_logf(-1.0f)));
    cr_expect(isnan(sampling_logf(NAN)));
    cr_expect_eq(sampling_logf(INFINITY), INFINITY);
}

// ---- the pieces of the rule ---------------------------------------------------------------------

Test(rule, masses_and_the_top_p_target) {
    cr_expect_eq(sampling_mass(0.0f), 1ull << 32, "the top token weighs exactly 2^32");
    cr_expect_eq(sampling_mass(-INFINITY), 0);
    cr_expect_eq(sampling_mass(-23.0f), 0, "e^-23 < 2^-32 weighs nothing");
    cr_expect_gt(sampling_mass(-22.0f), 0);
    const uint64_t half = sampling_mass(-0.693147182f);  // e^x = 0.5 within float rounding
    cr_expect(half > (1ull << 31) - 256 && half < (1ull << 31) + 256, "mass of 1/2: %llu", (unsigned long long)half);
    cr_expect_eq(sampling_top_p_target(0.5f, 1ull << 33), 1ull << 32);
    cr_expect_eq(sampling_top_p_target(1e-30f, 1ull << 32), 1, "the target is at least 1");
    cr_expect_eq(sampling_top_p_target(0.75f, 3), 3, "ceil(2.25)");
    const uint64_t big = (1ull << 62) + 1;  // not a double: rounds up to 2^62 + 0, then p < 1 stays below
    cr_expect_leq(sampling_top_p_target(0.99999994f, big), big);
    cr_expect_eq(sampling_inv_temperature(1e-45f), FLT_MAX, "1 / a subnormal temperature is capped");
    cr_expect_eq(sampling_log_weight(3.0f, 3.0f, FLT_MAX), 0.0f, "the top token's log weight is 0 at any temperature");
    cr_expect_eq(sampling_log_weight(-3e38f, 3e38f, 1.0f), -INFINITY);
    cr_expect_eq(sampling_order_key(-0.0f), sampling_order_key(0.0f));
    cr_expect_lt(sampling_order_key(-INFINITY), sampling_order_key(-FLT_MAX));
    cr_expect_lt(sampling_order_key(FLT_MAX), sampling_order_key(INFINITY));
    cr_expect_lt(sampling_order_key(-1e-45f), sampling_order_key(0.0f));
    cr_expect_gt(sampling_pack(5, 3), sampling_pack(5, 4), "on a tie the lower id is first");
    cr_expect_eq(sampling_unpack_id(sampling_pack(7, 12345)), 12345);
}

// ---- greedy --------------------------------------------------------------------------------

static sampling_row_t row_of(float T, int k, float p, uint64_t seed, int64_t gen) {
    return (sampling_row_t){.temperature = T, .top_k = k, .top_p = p, .seed = seed, .gen_index = gen};
}

static int32_t sample_or_fail(const float *logits, int V, sampling_row_t r) {
    sampling_scratch_t s;
    cr_assert_eq(sampling_scratch_init(&s, V), 0, "%s", mv_last_error());
    int32_t id = -7;
    cr_assert_eq(sample_token_cpu(&s, logits, &r, &id), 0, "%s", mv_last_error());
    sampling_scratch_free(&s);
    return id;
}

Test(greedy, lowest_id_on_ties_nan_never_wins_zeros_tie) {
    const float a[8] = {0.5f, 2.0f, -1.0f, 2.0f, NAN, 2.0f, -INFINITY, 1.0f};
    cr_expect_eq(sampling_argmax_cpu(a, 8), 1);
    const float b[3] = {-0.0f, 0.0f, -1.0f}, c[3] = {-1.0f, 0.0f, -0.0f}, d[3] = {NAN, -5.0f, NAN};
    cr_expect_eq(sampling_argmax_cpu(b, 3), 0, "-0 and +0 are one value: the lower id wins");
    cr_expect_eq(sampling_argmax_cpu(c, 3), 1);
    cr_expect_eq(sampling_argmax_cpu(d, 3), 1);
    const float nan3[3] = {NAN, NAN, NAN}, ninf[2] = {-INFINITY, -INFINITY};
    cr_expect_eq(sampling_argmax_cpu(nan3, 3), -1);
    cr_expect_eq(sampling_argmax_cpu(ninf, 2), 0);
    // temperature 0 draws nothing: the same id for every seed and gen_index
    for (int g = 0; g < 200; g++) {
        cr_expect_eq(sample_or_fail(a, 8, row_of(0.0f, 0, 1.0f, (uint64_t)g * 7919, g)), 1);
        cr_expect_eq(sample_or_fail(a, 8, row_of(0.0f, 3, 0.5f, (uint64_t)g, 3 * g)), 1);
        cr_expect_eq(sample_or_fail(b, 3, row_of(0.0f, 0, 1.0f, 1, g)), 0);
    }
}

Test(greedy, no_finite_largest_value_is_an_error) {
    const float nan3[3] = {NAN, NAN, NAN}, ninf[3] = {-INFINITY, -INFINITY, -INFINITY};
    const float pinf[3] = {1.0f, INFINITY, 2.0f}, mix[3] = {NAN, -INFINITY, NAN};
    const float *bad[4] = {nan3, ninf, pinf, mix};
    sampling_scratch_t s;
    cr_assert_eq(sampling_scratch_init(&s, 3), 0);
    for (int t = 0; t < 4; t++)
        for (int greedy = 0; greedy < 2; greedy++) {
            const sampling_row_t r = row_of(greedy ? 0.0f : 1.0f, 0, 1.0f, 1, 0);
            int32_t id = 77;
            cr_expect_eq(sample_token_cpu(&s, bad[t], &r, &id), -1, "case %d", t);
            cr_expect(strstr(mv_last_error(), "finite") != NULL, "%s", mv_last_error());
            cr_expect_eq(id, 77, "nothing written on an error");
        }
    sampling_scratch_free(&s);
}

Test(greedy, bad_parameters_are_errors_naming_the_value) {
    const float ok[3] = {0, 1, 2};
    const struct {
        sampling_row_t r;
        const char *says;
    } cases[] = {
        {{-1.0f, 0, 1.0f, 0, 0, 0}, "temperature -1"}, {{NAN, 0, 1.0f, 0, 0, 0}, "temperature nan"},
        {{INFINITY, 0, 1.0f, 0, 0, 0}, "temperature inf"}, {{1.0f, -1, 1.0f, 0, 0, 0}, "top_k -1"},
        {{1.0f, 0, 0.0f, 0, 0, 0}, "top_p 0"},          {{1.0f, 0, 1.5f, 0, 0, 0}, "top_p 1.5"},
        {{1.0f, 0, NAN, 0, 0, 0}, "top_p nan"},          {{1.0f, 0, 1.0f, 0, -1, 0}, "gen_index -1"},
        {{1.0f, 0, 1.0f, 0, 0, -0.5f}, "min_p -0.5"}, {{1.0f, 0, 1.0f, 0, 0, 1.5f}, "min_p 1.5"},
        {{1.0f, 0, 1.0f, 0, 0, NAN}, "min_p nan"},
    };
    sampling_scratch_t s;
    cr_assert_eq(sampling_scratch_init(&s, 3), 0);
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        int32_t id;
        cr_expect_eq(sample_token_cpu(&s, ok, &cases[k].r, &id), -1, "case %zu", k);
        cr_expect(strstr(mv_last_error(), cases[k].says) != NULL, "case %zu: %s", k, mv_last_error());
    }
    sampling_scratch_free(&s);
    cr_expect_eq(sampling_scratch_init(&s, 0), -1);
    // the batched form names the row
    float l[6] = {0, 1, 2, 0, 1, 2};
    float T[2] = {1.0f, 1.0f}, p[2] = {1.0f, 2.0f};
    int32_t k2[2] = {0, 0}, out[2];
    uint64_t seed[2] = {0, 0};
    int64_t gen[2] = {0, 0};
    cr_expect_eq(sample_tokens_cpu(out, l, 3, 2, 3, T, k2, p, seed, gen), -1);
    cr_expect(strstr(mv_last_error(), "row 1") != NULL, "%s", mv_last_error());
}

// ---- kept sets against brute force ---------------------------------------------------------------

// Brute force 1: sort the finite ids by float comparison (where -0 == +0
// already), then by id; cut with the same integer masses and target.
static int cmp_by_value(const void *a, const void *b, void *ctx) {
    const float *l = ctx;
    const int32_t i = *(const int32_t *)a, j = *(const int32_t *)b;
    if (l[i] != l[j]) return l[i] > l[j] ? -1 : 1;
    return (i > j) - (i < j);
}

// The kept ids of row r into ids[]; returns how many. cum[] (may be NULL)
// gets the double-precision cumulative softmax over the top-k candidates.
static int brute_kept(const float *l, int V, const sampling_row_t *r, int32_t *ids, double *cum, int *n_cand) {
    int n = 0;
    for (int i = 0; i < V; i++)
        if (isfinite(l[i])) ids[n++] = i;
    qsort_r(ids, (size_t)n, sizeof *ids, cmp_by_value, (void *)l);
    if (r->top_k > 0 && r->top_k < n) n = r->top_k;
    *n_cand = n;
    const float top = l[ids[0]], inv_t = sampling_inv_temperature(r->temperature);
    if (cum) {
        double sum = 0;
        for (int k = 0; k < n; k++) sum += cum[k] = exp(((double)l[ids[k]] - top) / r->temperature);
        double acc = 0;
        for (int k = 0; k < n; k++) cum[k] = (acc += cum[k]) / sum;
    }
    if (!(r->top_p < 1)) return n;
    uint64_t mass = 0, acc = 0;
    for (int k = 0; k < n; k++) mass += sampling_mass(sampling_log_weight(l[ids[k]], top, inv_t));
    const uint64_t target = sampling_top_p_target(r->top_p, mass);
    for (int k = 0; k < n; k++) {
        acc += sampling_mass(sampling_log_weight(l[ids[k]], top, inv_t));
        if (acc >= target) return k + 1;
    }
    cr_assert_fail("brute force: the candidates' mass never reached the target");
    return n;
}

// Brute force 2: the smallest prefix whose double softmax reaches top_p.
static int double_kept(const double *cum, int n, float top_p) {
    if (!(top_p < 1)) return n;
    for (int k = 0; k < n; k++)
        if (cum[k] >= top_p) return k + 1;
    return n;
}

static void random_logits(rng_t *g, float *l, int V, int style) {
    for (int i = 0; i < V; i++) {
        float x = rng_normal(g, 0.0f, 2.5f);
        if (style == 1) x = roundf(x * 4) / 4;  // many exact ties
        if (style == 2 && i % 17 == 3) x = NAN;
        if (style == 2 && i % 23 == 5) x = -INFINITY;
        if (style == 3 && i % 5 == 0) x = i % 10 ? 0.0f : -0.0f;
        l[i] = x;
    }
    if (style == 1 && V > 4) l[V / 2] = l[V - 1] = l[1] = 12.0f;  // a three-way tie at the top
}

Test(kept, top_k_and_top_p_equal_brute_force) {
    const int vocabs[] = {1, 2, 7, 64, 1000, 4096};
    const float temps[] = {0.05f, 0.3f, 1.0f, 1.7f, 10.0f};
    const int ks[] = {0, 1, 3, 50, -1, -2};  // -1: V, -2: V + 1
    const float ps[] = {1.0f, 0.999f, 0.9f, 0.5f, 0.05f, 1e-6f};
    rng_t g;
    rng_seed(&g, 11);
    sampling_scratch_t s;
    int cases = 0, slack = 0;
    for (size_t vi = 0; vi < sizeof vocabs / sizeof *vocabs; vi++) {
        const int V = vocabs[vi];
        float *l = malloc((size_t)V * sizeof *l);
        int32_t *ids = malloc((size_t)V * sizeof *ids);
        double *cum = malloc((size_t)V * sizeof *cum);
        cr_assert_eq(sampling_scratch_init(&s, V), 0);
        for (int style = 0; style < 4; style++) {
            random_logits(&g, l, V, style);
            if (sampling_argmax_cpu(l, V) < 0 || !isfinite(l[sampling_argmax_cpu(l, V)])) continue;
            for (size_t ti = 0; ti < sizeof temps / sizeof *temps; ti++)
                for (size_t ki = 0; ki < sizeof ks / sizeof *ks; ki++)
                    for (size_t pi = 0; pi < sizeof ps / sizeof *ps; pi++) {
                        const int k = ks[ki] == -1 ? V : ks[ki] == -2 ? V + 1 : ks[ki];
                        const sampling_row_t r = row_of(temps[ti], k, ps[pi], 1, 0);
                        int n_ref, n_cand;
                        cr_assert_eq(sampling_kept_cpu(&s, l, &r, &n_ref), 0, "%s", mv_last_error());
                        const int n_brute = brute_kept(l, V, &r, ids, cum, &n_cand);
                        cases++;
                        cr_assert_eq(n_ref, n_brute, "V %d style %d T %g k %d p %g: reference keeps %d, brute force %d",
                                     V, style, r.temperature, k, r.top_p, n_ref, n_brute);
                        for (int j = 0; j < n_ref; j++)
                            cr_assert_eq(sampling_unpack_id(s.order[j]), ids[j],
                                         "V %d style %d T %g k %d p %g: kept[%d] is %d, brute force %d", V, style,
                                         r.temperature, k, r.top_p, j, sampling_unpack_id(s.order[j]), ids[j]);
                        const int n_double = double_kept(cum, n_cand, r.top_p);
                        if (n_double != n_ref) {
                            // only where the double cumulative sits within the slack of top_p
                            const int lo = n_double < n_ref ? n_double : n_ref, hi = n_double ^ n_ref ^ lo;
                            for (int j = lo - 1; j < hi - 1; j++)
                                cr_assert(fabs(cum[j] - r.top_p) < TOP_P_SLACK,
                                          "V %d style %d T %g k %d p %g: keeps %d, double softmax %d, and the "
                                          "cumulative at %d is %.9f",
                                          V, style, r.temperature, k, r.top_p, n_ref, n_double, j, cum[j]);
                            slack++;
                        }
                    }
        }
        sampling_scratch_free(&s);
        free(l), free(ids), free(cum);
    }
    if (verbose()) fprintf(stderr, "kept sets: %d cases, %d differ from the double softmax within the slack\n", cases, slack);
    cr_expect_lt(slack, cases / 100 + 1, "%d of %d cases needed the slack", slack, cases);
}

Test(kept, top_k_1_and_tiny_top_p_are_greedy) {
    rng_t g;
    rng_seed(&g, 3);
    float l[300];
    for (int t = 0; t < 20; t++) {
        random_logits(&g, l, 300, t % 4);
        const int32_t best = sampling_argmax_cpu(l, 300);
        for (int gen = 0; gen < 25; gen++) {
            cr_expect_eq(sample_or_fail(l, 300, row_of(1.0f, 1, 1.0f, (uint64_t)t, gen)), best);
            cr_expect_eq(sample_or_fail(l, 300, row_of(2.0f, 0, 1e-6f, (uint64_t)t, gen)), best);
        }
    }
}

// min_p keeps the candidates at least min_p times as likely as the top one
// (by the integer masses), before top-k and top-p: checked against the
// double softmax wherever the ratio is not within 1e-6 of min_p.
Test(kept, min_p_keeps_what_is_min_p_times_as_likely_as_the_top) {
    rng_t g;
    rng_seed(&g, 29);
    const int V = 500;
    float l[500];
    sampling_scratch_t s;
    cr_assert_eq(sampling_scratch_init(&s, V), 0);
    const float mps[] = {1e-4f, 0.01f, 0.1f, 0.5f, 0.9f};
    const float temps[] = {0.3f, 1.0f, 2.5f};
    int cases = 0;
    for (int style = 0; style < 4; style++) {
        random_logits(&g, l, V, style);
        const int32_t best = sampling_argmax_cpu(l, V);
        for (size_t mi = 0; mi < sizeof mps / sizeof *mps; mi++)
            for (size_t ti = 0; ti < sizeof temps / sizeof *temps; ti++) {
                sampling_row_t r = row_of(temps[ti], 0, 1.0f, 1, 0);
                r.min_p = mps[mi];
                int n;
                cr_assert_eq(sampling_kept_cpu(&s, l, &r, &n), 0, "%s", mv_last_error());
                int kept[500] = {0};
                for (int j = 0; j < n; j++) kept[sampling_unpack_id(s.order[j])] = 1;
                for (int i = 0; i < V; i++) {
                    if (!isfinite(l[i])) {
                        cr_assert(!kept[i], "a non-finite logit is kept");
                        continue;
                    }
                    const double ratio = exp(((double)l[i] - l[best]) / r.temperature);
                    if (fabs(ratio - r.min_p) < 1e-6) continue;
                    cr_assert_eq(kept[i], ratio >= r.min_p, "style %d min_p %g T %g: id %d (ratio %.9f) kept %d",
                                 style, r.min_p, r.temperature, i, ratio, kept[i]);
                    cases++;
                }
                // with top-k and top-p too: a prefix of min_p's set, the same as cutting it by them
                sampling_row_t rk = r;
                rk.top_k = 7, rk.top_p = 0.8f;
                int nk;
                cr_assert_eq(sampling_kept_cpu(&s, l, &rk, &nk), 0);
                cr_assert(nk >= 1 && nk <= (n < 7 ? n : 7), "top-k 7 after min_p's %d keeps %d", n, nk);
            }
        // min_p 1: only the top logit (and its exact ties) are kept
        sampling_row_t r1 = row_of(1.0f, 0, 1.0f, 1, 0);
        r1.min_p = 1.0f;
        int n1;
        cr_assert_eq(sampling_kept_cpu(&s, l, &r1, &n1), 0);
        for (int j = 0; j < n1; j++) cr_assert_eq(l[sampling_unpack_id(s.order[j])], l[best]);
    }
    cr_expect_gt(cases, 1000);
    sampling_scratch_free(&s);
}

// ---- min_p as a mask (the GPU's way to it) ---------------------------------------------------

// Rows for the mask: random_logits' four styles (normal, ties, NaN/-inf
// holes, zeros) and rows that stress a cut: flat (min_p keeps most),
// constant (every mass 2^32: all kept), one finite value among NaN and
// -inf, a sharp top (min_p keeps one), a +inf and nothing finite (no
// answer: the mask must leave those alone).
#define MASK_STYLES 9
static void mask_test_row(rng_t *g, float *l, int V, int style) {
    if (style < 4) {
        random_logits(g, l, V, style);
        return;
    }
    for (int i = 0; i < V; i++) {
        float x = rng_normal(g, 0.0f, 1.0f);
        if (style == 4) x = rng_uniform(g, -0.01f, 0.01f);
        if (style == 5) x = 1.5f;
        if (style == 6) x = i % 2 ? NAN : -INFINITY;
        if (style == 8) x = i % 3 ? NAN : -INFINITY;
        l[i] = x;
    }
    if (style == 6) l[rng_int(g, 0, V - 1)] = 0.75f;
    if (style == 7) l[rng_int(g, 0, V - 1)] = 30.0f;
    if (style == 8 && V > 2) l[V / 2] = INFINITY;
}

// 0 when `r` (with its min_p) on l and r without min_p on `masked` keep the
// same ids in the same order, or both fail; else 1, with the first
// difference in msg.
static int mask_kept_differs(sampling_scratch_t *s, sampling_scratch_t *s2, const float *l, const float *masked,
                             sampling_row_t r, char *msg, size_t cap) {
    sampling_row_t r0 = r;
    r0.min_p = 0;
    int n = 0, n0 = 0;
    const int rc = sampling_kept_cpu(s, l, &r, &n), rc0 = sampling_kept_cpu(s2, masked, &r0, &n0);
    if (rc || rc0) {
        snprintf(msg, cap, "kept sets fail: with min_p %d, on the masked row %d", rc, rc0);
        return rc != rc0;
    }
    if (n != n0) {
        snprintf(msg, cap, "min_p keeps %d tokens, the masked row %d", n, n0);
        return 1;
    }
    for (int j = 0; j < n; j++)
        if (s->order[j] != s2->order[j]) {
            snprintf(msg, cap, "kept[%d]: id %d with min_p, id %d on the masked row", j, sampling_unpack_id(s->order[j]),
                     sampling_unpack_id(s2->order[j]));
            return 1;
        }
    return 0;
}

// The mask is min_p: on rows of every style, for temperatures from 1e-30 to
// 1e30 (all dropped but the top's ties, to none dropped), min_p from 1e-6
// to 1, with top-k and top-p on or off, the rule without min_p on the
// masked row keeps the same ids in the same order as the rule with min_p on
// the row, and draws the same ids for every key; greedy rows and rows with
// no answer are left bit for bit as they were.
Test(min_p_mask, is_the_reference_min_p_for_every_top_k_and_top_p) {
    const int vocabs[] = {1, 2, 7, 64, 1000, 4096};
    const float temps[] = {0.0f, 1e-30f, 0.05f, 0.6f, 1.0f, 2.5f, 1e30f};
    const float mps[] = {1e-6f, 0.01f, 0.05f, 0.1f, 0.5f, 0.9f, 1.0f};
    const struct {
        int k;  // -1: V
        float p;
    } cuts[] = {{0, 1.0f}, {1, 1.0f}, {3, 1.0f}, {50, 0.9f}, {0, 0.5f}, {0, 1e-6f}, {-1, 0.95f}};
    rng_t g;
    rng_seed(&g, 41);
    int kept_cases = 0, draws = 0, dropped_rows = 0;
    char msg[160];
    for (size_t vi = 0; vi < sizeof vocabs / sizeof *vocabs; vi++) {
        const int V = vocabs[vi];
        const int n_seeds = V > 1000 ? 1 : 4;  // qsort of the 4096-wide rows dominates the time
        float *l = malloc((size_t)V * sizeof *l), *m = malloc((size_t)V * sizeof *m);
        sampling_scratch_t s, s2;
        cr_assert_eq(sampling_scratch_init(&s, V), 0);
        cr_assert_eq(sampling_scratch_init(&s2, V), 0);
        for (int style = 0; style < MASK_STYLES; style++) {
            mask_test_row(&g, l, V, style);
            const int32_t best = sampling_argmax_cpu(l, V);
            const int answer = best >= 0 && isfinite(l[best]);
            for (size_t ti = 0; ti < sizeof temps / sizeof *temps; ti++)
                for (size_t mi = 0; mi < sizeof mps / sizeof *mps; mi++) {
                    memcpy(m, l, (size_t)V * sizeof *m);
                    cr_assert_eq(sampling_min_p_mask_cpu(m, V, temps[ti], mps[mi]), 0, "%s", mv_last_error());
                    int dropped = 0;
                    for (int i = 0; i < V; i++) {
                        if (memcmp(&m[i], &l[i], sizeof *m) == 0) continue;
                        cr_assert(isfinite(l[i]) && m[i] == -INFINITY, "V %d style %d: id %d went from %g to %g", V,
                                  style, i, l[i], m[i]);
                        dropped++;
                    }
                    if (temps[ti] == 0 || !answer)
                        cr_assert_eq(dropped, 0, "V %d style %d T %g: the mask dropped %d tokens of a %s row", V, style,
                                     temps[ti], dropped, temps[ti] == 0 ? "greedy" : "answerless");
                    dropped_rows += dropped > 0;
                    for (size_t ci = 0; ci < sizeof cuts / sizeof *cuts; ci++) {
                        sampling_row_t r = row_of(temps[ti], cuts[ci].k < 0 ? V : cuts[ci].k, cuts[ci].p, 0, 0);
                        r.min_p = mps[mi];
                        if (r.temperature > 0) {
                            cr_assert(!mask_kept_differs(&s, &s2, l, m, r, msg, sizeof msg),
                                      "V %d style %d T %g min_p %g top_k %d top_p %g: %s", V, style, r.temperature,
                                      r.min_p, r.top_k, r.top_p, msg);
                            kept_cases++;
                        }
                        sampling_row_t r0 = r;
                        r0.min_p = 0;
                        for (int k = 0; k < n_seeds; k++) {
                            r.seed = r0.seed = rng_u64(&g);
                            r.gen_index = r0.gen_index = (int64_t)(rng_u64(&g) >> 24);
                            int32_t id = -7, id0 = -7;
                            const int rc = sample_token_cpu(&s, l, &r, &id), rc0 = sample_token_cpu(&s2, m, &r0, &id0);
                            cr_assert(rc == rc0 && id == id0,
                                      "V %d style %d T %g min_p %g top_k %d top_p %g seed %llu: drew %d (rc %d) with "
                                      "min_p, %d (rc %d) from the masked row",
                                      V, style, r.temperature, r.min_p, r.top_k, r.top_p, (unsigned long long)r.seed,
                                      id, rc, id0, rc0);
                            draws++;
                        }
                    }
                }
        }
        sampling_scratch_free(&s);
        sampling_scratch_free(&s2);
        free(l), free(m);
    }
    if (verbose())
        fprintf(stderr, "min_p mask: %d kept sets and %d draws equal; %d masks dropped tokens\n", kept_cases, draws,
                dropped_rows);
    cr_expect_gt(dropped_rows, 300, "only %d masks dropped anything: the cases do not exercise the cut", dropped_rows);
}

// The comparison above has teeth: a mask one token off either way (the
// last token min_p keeps dropped too, or the first it drops put back) is
// caught on every row where min_p cuts.
Test(min_p_mask, a_mask_one_token_off_is_caught) {
    const int V = 1000;
    float l[1000], m[1000];
    sampling_scratch_t s, s2;
    cr_assert_eq(sampling_scratch_init(&s, V), 0);
    cr_assert_eq(sampling_scratch_init(&s2, V), 0);
    rng_t g;
    rng_seed(&g, 43);
    char msg[160];
    int cases = 0;
    for (int t = 0; t < 40; t++) {
        mask_test_row(&g, l, V, t % 4);
        sampling_row_t r = row_of(t % 2 ? 1.0f : 0.6f, 0, 1.0f, 0, 0);
        r.min_p = t % 3 ? 0.05f : 0.2f;
        memcpy(m, l, sizeof m);
        cr_assert_eq(sampling_min_p_mask_cpu(m, V, r.temperature, r.min_p), 0);
        cr_assert(!mask_kept_differs(&s, &s2, l, m, r, msg, sizeof msg), "row %d: %s", t, msg);
        // The last kept and the first dropped token, in the order.
        uint64_t last_kept = ~0ull, first_dropped = 0;
        for (int32_t i = 0; i < V; i++) {
            if (!isfinite(l[i])) continue;
            const uint64_t p = sampling_pack(sampling_order_key(l[i]), i);
            if (isfinite(m[i]) && p < last_kept) last_kept = p;
            if (!isfinite(m[i]) && p > first_dropped) first_dropped = p;
        }
        if (!first_dropped || last_kept == ~0ull) continue;
        const int32_t keep_id = sampling_unpack_id(last_kept), drop_id = sampling_unpack_id(first_dropped);
        if (keep_id != sampling_argmax_cpu(l, V)) {  // the top token: no cut drops it
            m[keep_id] = -INFINITY;
            cr_expect(mask_kept_differs(&s, &s2, l, m, r, msg, sizeof msg),
                      "row %d: a mask that drops id %d too went unnoticed", t, keep_id);
            m[keep_id] = l[keep_id];
        }
        m[drop_id] = l[drop_id];
        cr_expect(mask_kept_differs(&s, &s2, l, m, r, msg, sizeof msg),
                  "row %d: a mask that keeps id %d too went unnoticed", t, drop_id);
        cases++;
    }
    cr_expect_gt(cases, 30, "only %d rows had a min_p cut", cases);
    sampling_scratch_free(&s);
    sampling_scratch_free(&s2);
}

Test(min_p_mask, bad_parameters_are_errors_naming_the_value) {
    float l[4] = {1.0f, 2.0f, 3.0f, 4.0f};
    cr_expect_eq(sampling_min_p_mask_cpu(l, 4, 1.0f, 1.5f), -1);
    cr_expect(strstr(mv_last_error(), "min_p 1.5") != NULL, "%s", mv_last_error());
    cr_expect_eq(sampling_min_p_mask_cpu(l, 4, -1.0f, 0.1f), -1);
    cr_expect(strstr(mv_last_error(), "temperature -1") != NULL, "%s", mv_last_error());
    cr_expect_eq(sampling_min_p_mask_cpu(l, 4, NAN, 0.1f), -1);
    cr_expect_eq(sampling_min_p_mask_cpu(l, 0, 1.0f, 0.1f), -1);
    // min_p 0 and temperature 0 are off: nothing changes
    cr_expect_eq(sampling_min_p_mask_cpu(l, 4, 1.0f, 0.0f), 0);
    cr_expect_eq(sampling_min_p_mask_cpu(l, 4, 0.0f, 0.9f), 0);
    cr_expect(l[0] == 1.0f && l[1] == 2.0f && l[2] == 3.0f && l[3] == 4.0f);
}

// The penalties as vLLM applies them, against the formula written out.
Test(penalties, repetition_frequency_and_presence_as_vllm) {
    const int V = 8;
    const float l0[8] = {2.0f, -1.0f, 0.0f, 3.0f, -2.0f, 1.5f, 0.5f, -0.5f};
    const int32_t prompt[] = {0, 1, 1, 4};
    const int32_t output[] = {3, 1, 3, 3, 6};
    const float pres = 0.25f, freq = 0.5f, rep = 2.0f;
    float l[8];
    memcpy(l, l0, sizeof l);
    uint64_t scratch[9];
    cr_assert_eq(sampling_apply_penalties_cpu(l, V, prompt, 4, output, 5, pres, freq, rep, scratch), 0);
    int count[8] = {0}, seen[8] = {0};
    for (int k = 0; k < 4; k++) seen[prompt[k]] = 1;
    for (int k = 0; k < 5; k++) seen[output[k]] = 1, count[output[k]]++;
    for (int i = 0; i < V; i++) {
        float x = l0[i];
        if (seen[i]) x = x > 0 ? x / rep : x * rep;
        x -= freq * (float)count[i];
        if (count[i]) x -= pres;
        cr_expect_eq(l[i], x, "id %d: %g, expected %g", i, l[i], x);
    }
    // ids never seen are untouched; all off changes nothing
    cr_expect_eq(l[2], l0[2]);
    cr_expect_eq(l[7], l0[7]);
    memcpy(l, l0, sizeof l);
    cr_assert_eq(sampling_apply_penalties_cpu(l, V, prompt, 4, output, 5, 0, 0, 1.0f, scratch), 0);
    cr_expect(memcmp(l, l0, sizeof l) == 0, "penalties off changed the logits");
    // bad values and ids are errors naming them
    cr_expect_eq(sampling_apply_penalties_cpu(l, V, prompt, 4, output, 5, 0, 0, 0.0f, scratch), -1);
    cr_expect(strstr(mv_last_error(), "repetition_penalty 0") != NULL, "%s", mv_last_error());
    const int32_t bad[] = {9};
    cr_expect_eq(sampling_apply_penalties_cpu(l, V, bad, 1, NULL, 0, 0, 0, 1.5f, scratch), -1);
    cr_expect(strstr(mv_last_error(), "id 9") != NULL, "%s", mv_last_error());
}

// logprobs: log_softmax of the raw row (double normaliser), the top ids in
// the sampler's order.
Test(logprobs, are_the_log_softmax_and_the_top_ids_in_order) {
    rng_t g;
    rng_seed(&g, 5);
    const int V = 1000;
    float l[1000];
    for (int style = 0; style < 4; style++) {
        random_logits(&g, l, V, style);
        double m = -INFINITY, sum = 0;
        for (int i = 0; i < V; i++)
            if (!isnan(l[i]) && l[i] > m) m = l[i];
        for (int i = 0; i < V; i++)
            if (!isnan(l[i])) sum += exp((double)l[i] - m);
        const double lse = m + log(sum);
        int32_t ids[SAMPLING_MAX_TOP_LOGPROBS];
        float lps[SAMPLING_MAX_TOP_LOGPROBS];
        for (int32_t tok = 0; tok < V; tok += 37) {
            float lp;
            cr_assert_eq(sampling_logprobs_cpu(l, V, tok, 20, &lp, ids, lps), 0, "%s", mv_last_error());
            if (isnan(l[tok]) || isinf(l[tok])) cr_expect(isinf(lp) && lp < 0, "id %d: %g", tok, lp);
            else cr_expect(fabs(lp - ((double)l[tok] - lse)) <= 1e-6 * fmax(1.0, fabs(lp)), "id %d: %g", tok, lp);
        }
        // the top 20: in the sampler's order (logit descending, id ascending) and the 20 largest
        for (int k = 0; k < 20; k++) {
            cr_assert(ids[k] >= 0 && ids[k] < V && !isnan(l[ids[k]]));
            if (k) cr_assert(l[ids[k - 1]] > l[ids[k]] || (l[ids[k - 1]] == l[ids[k]] && ids[k - 1] < ids[k]),
                             "top %d and %d out of order", k - 1, k);
            cr_expect_eq(lps[k], (float)((double)l[ids[k]] - lse));
        }
        int larger = 0;
        for (int i = 0; i < V; i++) larger += !isnan(l[i]) && l[i] > l[ids[19]];
        cr_expect(larger <= 19, "%d logits are larger than the 20th", larger);
    }
    float lp;
    int32_t ids[1];
    float lps[1];
    cr_expect_eq(sampling_logprobs_cpu(l, V, 0, 21, &lp, ids, lps), -1);
    cr_expect_eq(sampling_logprobs_cpu(l, V, V, 0, &lp, ids, lps), -1);
}

// ---- draws ---------------------------------------------------------------------------------

// Draws over many (seed, gen_index) never leave the kept set, and hit more
// than one token of it.
Test(draws, stay_inside_the_kept_set) {
    rng_t g;
    rng_seed(&g, 5);
    const int V = 500;
    float l[500];
    sampling_scratch_t s;
    cr_assert_eq(sampling_scratch_init(&s, V), 0);
    char *kept = malloc(V);
    for (int t = 0; t < 24; t++) {
        random_logits(&g, l, V, t % 4);
        const sampling_row_t r = row_of(t % 3 ? 1.5f : 0.4f, t % 2 ? 20 : 0, t % 4 < 2 ? 0.8f : 1.0f, (uint64_t)t, 0);
        int n;
        cr_assert_eq(sampling_kept_cpu(&s, l, &r, &n), 0);
        memset(kept, 0, V);
        for (int j = 0; j < n; j++) kept[sampling_unpack_id(s.order[j])] = 1;
        int distinct = 0;
        char seen[500] = {0};
        for (int gen = 0; gen < 400; gen++) {
            sampling_row_t rg = r;
            rg.gen_index = gen;
            int32_t id;
            cr_assert_eq(sample_token_cpu(&s, l, &rg, &id), 0);
            cr_assert(id >= 0 && id < V && kept[id], "row %d gen %d drew %d, outside the kept set of %d", t, gen, id, n);
            distinct += !seen[id];
            seen[id] = 1;
        }
        if (n > 3) cr_expect_gt(distinct, 1, "row %d: 400 draws from %d kept tokens were all the same", t, n);
    }
    free(kept);
    sampling_scratch_free(&s);
}

// The quantile of chi-square with d degrees of freedom at z standard deviations (Wilson-Hilferty).
static double chi2_quantile(int d, double z) {
    const double a = 2.0 / (9.0 * d);
    return d * pow(1 - a + z * sqrt(a), 3);
}

// 200000 draws (seeds 0..199, gen_index 0..999) against softmax(l / T)
// over the kept set, by Pearson's chi-square.
Test(draws, follow_the_softmax_of_the_kept_set) {
    const float l[16] = {1.0f, 2.0f, 0.0f, 1.5f, -1.0f, 2.0f, 0.5f, -3.0f,
                         0.25f, 1.75f, -0.5f, 1.0f, 3.0f, -2.0f, 0.75f, 2.5f};
    const struct {
        float T;
        int k;
        float p;
    } cfg[] = {{1.0f, 0, 1.0f}, {0.5f, 5, 1.0f}, {1.3f, 0, 0.8f}, {2.0f, 8, 0.9f}, {40.0f, 0, 1.0f}};
    sampling_scratch_t s;
    cr_assert_eq(sampling_scratch_init(&s, 16), 0);
    for (size_t c = 0; c < sizeof cfg / sizeof *cfg; c++) {
        const sampling_row_t r0 = row_of(cfg[c].T, cfg[c].k, cfg[c].p, 0, 0);
        int n;
        cr_assert_eq(sampling_kept_cpu(&s, l, &r0, &n), 0);
        double prob[16] = {0}, sum = 0;
        for (int j = 0; j < n; j++) {
            const int id = sampling_unpack_id(s.order[j]);
            sum += prob[id] = exp(((double)l[id] - 3.0) / cfg[c].T);
        }
        long count[16] = {0};
        const int seeds = 200, gens = 1000;
        for (int sd = 0; sd < seeds; sd++)
            for (int gen = 0; gen < gens; gen++) {
                sampling_row_t r = r0;
                r.seed = (uint64_t)sd * 0x9e3779b97f4a7c15ull;
                r.gen_index = gen;
                int32_t id;
                cr_assert_eq(sample_token_cpu(&s, l, &r, &id), 0);
                cr_assert(prob[id] > 0, "config %zu drew %d, outside the kept set", c, id);
                count[id]++;
            }
        const double N = (double)seeds * gens;
        double chi2 = 0;
        for (int id = 0; id < 16; id++)
            if (prob[id] > 0) {
                const double e = N * prob[id] / sum;
                chi2 += (count[id] - e) * (count[id] - e) / e;
            }
        const double limit = n > 1 ? chi2_quantile(n - 1, CHI2_Z) : 0;
        if (verbose())
            fprintf(stderr, "draws T %g k %d p %g: %d kept, chi-square %.2f (%d dof, limit %.2f)\n", cfg[c].T, cfg[c].k,
                    cfg[c].p, n, chi2, n - 1, limit);
        cr_expect_leq(chi2, limit, "T %g top_k %d top_p %g: chi-square %.2f over %d kept tokens, limit %.2f", cfg[c].T,
                      cfg[c].k, cfg[c].p, chi2, n, limit);
    }
    sampling_scratch_free(&s);
}

// A draw depends on (logits, parameters, seed, gen_index) and nothing else:
// the same row gives the same id again, in a batch or alone, with a scratch
// that served other rows; other seeds and gen_index give other ids.
Test(draws, depend_only_on_the_row_and_its_key) {
    rng_t g;
    rng_seed(&g, 9);
    enum { R = 40, V = 1000 };
    float *l = malloc(sizeof(float) * R * V);
    float T[R], p[R];
    int32_t k[R], out[R], again[R];
    uint64_t seed[R];
    int64_t gen[R];
    for (int r = 0; r < R; r++) {
        random_logits(&g, l + (size_t)r * V, V, r % 4);
        T[r] = r % 5 == 0 ? 0.0f : 0.5f + 0.1f * (float)(r % 7);
        k[r] = r % 3 == 0 ? 0 : 10 + r;
        p[r] = r % 2 ? 0.9f : 1.0f;
        seed[r] = 1000 + (uint64_t)r;
        gen[r] = r;
    }
    cr_assert_eq(sample_tokens_cpu(out, l, V, R, V, T, k, p, seed, gen), 0, "%s", mv_last_error());
    cr_assert_eq(sample_tokens_cpu(again, l, V, R, V, T, k, p, seed, gen), 0);
    sampling_scratch_t s;
    cr_assert_eq(sampling_scratch_init(&s, V), 0);
    for (int r = R - 1; r >= 0; r--) {  // another order, one scratch for all
        const sampling_row_t row = row_of(T[r], k[r], p[r], seed[r], gen[r]);
        int32_t id;
        cr_assert_eq(sample_token_cpu(&s, l + (size_t)r * V, &row, &id), 0);
        cr_expect_eq(id, out[r], "row %d: %d alone, %d in the batch", r, id, out[r]);
        cr_expect_eq(again[r], out[r], "row %d: a second run drew %d, the first %d", r, again[r], out[r]);
    }
    // over 100 gen_index values on a flat row (1000 logits in [-1, 1)) the
    // draws vary: about 95 distinct ids are expected
    for (int i = 0; i < V; i++) l[i] = rng_uniform(&g, -1.0f, 1.0f);
    char seen[V] = {0};
    int distinct = 0;
    for (int gi = 0; gi < 100; gi++) {
        int32_t id;
        const sampling_row_t row = row_of(1.0f, 0, 1.0f, 77, gi);
        cr_assert_eq(sample_token_cpu(&s, l, &row, &id), 0);
        distinct += !seen[id];
        seen[id] = 1;
    }
    cr_expect_gt(distinct, 70, "100 gen_index values drew only %d distinct ids", distinct);
    // a row with no finite value is -1 in the batched form, as on the GPU
    for (int i = 0; i < V; i++) l[i] = NAN;
    cr_assert_eq(sample_tokens_cpu(out, l, V, R, V, T, k, p, seed, gen), 0);
    cr_expect_eq(out[0], -1);
    sampling_scratch_free(&s);
    free(l);
}

// Extreme temperatures and values: a subnormal temperature is greedy on
// distinct logits, overflowing differences weigh nothing, a huge
// temperature is nearly uniform.
Test(draws, extreme_temperatures_and_values) {
    const float l[5] = {1.0f, 3.0f, 2.999999f, -1e30f, 0.0f};
    for (int gen = 0; gen < 100; gen++) {
        cr_expect_eq(sample_or_fail(l, 5, row_of(1e-45f, 0, 1.0f, 3, gen)), 1);
        cr_expect_eq(sample_or_fail(l, 5, row_of(1e-30f, 0, 0.5f, 3, gen)), 1);
    }
    const float huge[3] = {3e38f, -3e38f, 3e38f};
    int hits[3] = {0};
    for (int gen = 0; gen < 400; gen++) hits[sample_or_fail(huge, 3, row_of(1.0f, 0, 1.0f, 8, gen))]++;
    cr_expect_eq(hits[1], 0, "a logit 6e38 below the top (x = -inf) was drawn");
    cr_expect(hits[0] > 120 && hits[2] > 120, "the two tied tops: %d and %d of 400", hits[0], hits[2]);
    int spread[5] = {0};
    for (int gen = 0; gen < 1000; gen++) spread[sample_or_fail(l, 5, row_of(1e30f, 0, 1.0f, 4, gen))]++;
    for (int i = 0; i < 5; i++) {
        if (i == 3) continue;  // -1e30 / 1e30 = -1: weight e^-1 relative, still drawn
        cr_expect(spread[i] > 120, "temperature 1e30: id %d drawn %d of 1000 times", i, spread[i]);
    }
}

// A token whose log weight is below SAMPLING_NEVER_WINS cannot win, so the
// draw skips it: the Gumbel noise's two ends (u = 2^-24 and 1 - 2^-24)
// leave no overlap, and the draw with the skip is the draw without it.
Test(draws, skipping_tokens_that_cannot_win_changes_nothing) {
    const float g_min = -sampling_logf(-sampling_logf(0x1p-24f)), g_max = -sampling_logf(-sampling_logf(1.0f - 0x1p-24f));
    cr_expect(SAMPLING_NEVER_WINS + g_max < g_min - 0.5f, "x = %g scores up to %g, the top token down to %g",
              (double)SAMPLING_NEVER_WINS, (double)(SAMPLING_NEVER_WINS + g_max), (double)g_min);
    rng_t g;
    rng_seed(&g, 21);
    enum { V = 2000 };
    float l[V];
    sampling_scratch_t s;
    cr_assert_eq(sampling_scratch_init(&s, V), 0);
    int skipped = 0;
    for (int t = 0; t < 60; t++) {
        random_logits(&g, l, V, t % 4);
        const sampling_row_t r = row_of(t % 3 == 0 ? 0.2f : t % 3 == 1 ? 1.0f : 3.0f, t % 2 ? 0 : 300,
                                        t % 5 ? 1.0f : 0.99f, (uint64_t)t * 31, t);
        int n;
        cr_assert_eq(sampling_kept_cpu(&s, l, &r, &n), 0);
        const float top = l[sampling_argmax_cpu(l, V)], inv_t = sampling_inv_temperature(r.temperature);
        uint64_t pick = 0;
        for (int j = 0; j < n; j++) {  // every kept token, none skipped
            const int32_t id = sampling_unpack_id(s.order[j]);
            const float x = sampling_log_weight(l[id], top, inv_t);
            skipped += x < SAMPLING_NEVER_WINS;
            const uint64_t q = sampling_pack(sampling_order_key(sampling_gumbel_score(x, r.seed, r.gen_index, id)), id);
            if (q > pick) pick = q;
        }
        int32_t id;
        cr_assert_eq(sample_token_cpu(&s, l, &r, &id), 0);
        cr_expect_eq(id, sampling_unpack_id(pick), "row %d: %d with the skip, %d without", t, id,
                     sampling_unpack_id(pick));
    }
    cr_expect_gt(skipped, 1000, "the rows had only %d tokens to skip: the test shows nothing", skipped);
    sampling_scratch_free(&s);
}

// ---- the golden ------------------------------------------------------------------------------

// A fixed row of 24 logits (ties at 2.5 and 0, a -0, a NaN, a -inf), fixed
// parameters and keys, and what the rule gives: the kept set's size and the
// id. Made by this reference when the rule was written
// (MV_SAMPLING_PRINT_GOLDEN=1 build/tests/test_sampling --filter golden/*
// prints the table again), and checked below against an independent
// double-precision Gumbel-max over the same uniforms: the ids are the
// rule's, not whatever came out.
static const float GOLDEN_LOGITS[24] = {1.25f, 2.5f,  -0.5f, 0.0f,     2.5f,  -3.0f, 1.0f,  NAN,
                                        0.75f, -0.0f, 2.0f,  -INFINITY, 0.5f, 1.5f,  -1.25f, 2.25f,
                                        -2.0f, 0.25f, 1.75f, -0.75f,   3.0f,  0.0f,  -4.0f, 1.125f};
static const struct {
    float T;
    int k;
    float p;
    uint64_t seed;
    int64_t gen;
    int n_kept, id;
} GOLDEN[] = {
    {0.00f, 0, 1.00f, 0x0ull, 0ll, 0, 20},
    {1.00f, 0, 1.00f, 0x0ull, 0ll, 22, 1},
    {1.00f, 0, 1.00f, 0x0ull, 1ll, 22, 10},
    {1.00f, 0, 1.00f, 0x1ull, 0ll, 22, 20},
    {0.700f, 5, 1.00f, 0x2aull, 7ll, 5, 1},
    {0.700f, 5, 1.00f, 0x2aull, 8ll, 5, 1},
    {1.00f, 0, 0.900f, 0x3039ull, 3ll, 11, 4},
    {1.30f, 0, 0.500f, 0x123456789abcdefull, 100ll, 4, 20},
    {2.00f, 10, 0.950f, 0x7ull, 8589934592ll, 10, 6},
    {0.250f, 0, 0.990f, 0x63ull, 2ll, 5, 4},
    {5.00f, 3, 1.00f, 0x10000000000ull, 5ll, 3, 20},
    {1.00f, 1, 1.00f, 0x5ull, 5ll, 1, 20},
};
#define N_GOLDEN (int)(sizeof GOLDEN / sizeof GOLDEN[0])

Test(golden, fixed_logits_parameters_and_seeds_give_the_committed_ids) {
    const int V = 24;
    sampling_scratch_t s;
    cr_assert_eq(sampling_scratch_init(&s, V), 0);
    const int print = getenv("MV_SAMPLING_PRINT_GOLDEN") != NULL;
    for (int t = 0; t < N_GOLDEN; t++) {
        const sampling_row_t r = row_of(GOLDEN[t].T, GOLDEN[t].k, GOLDEN[t].p, GOLDEN[t].seed, GOLDEN[t].gen);
        int n = 0;
        int32_t id;
        if (r.temperature > 0) cr_assert_eq(sampling_kept_cpu(&s, GOLDEN_LOGITS, &r, &n), 0);
        cr_assert_eq(sample_token_cpu(&s, GOLDEN_LOGITS, &r, &id), 0, "%s", mv_last_error());
        if (print) {
            printf("    {%#.3gf, %d, %#.3gf, 0x%llxull, %lldll, %d, %d},\n", r.temperature, r.top_k, r.top_p,
                   (unsigned long long)r.seed, (long long)r.gen_index, n, id);
            continue;
        }
        cr_expect_eq(n, GOLDEN[t].n_kept,
                     "golden row %d (T %g, top_k %d, top_p %g): keeps %d tokens, the golden %d: the kept-set rule "
                     "changed (the order, the integer masses or the top-p target)",
                     t, r.temperature, r.top_k, r.top_p, n, GOLDEN[t].n_kept);
        if (n == GOLDEN[t].n_kept)
            cr_expect_eq(id, GOLDEN[t].id,
                         "golden row %d (T %g, top_k %d, top_p %g, seed %llu, gen_index %lld): drew %d, the golden "
                         "%d, with the same kept set: the random stream (Philox, its key and counter, the uniform "
                         "mapping) or the Gumbel score changed",
                         t, r.temperature, r.top_k, r.top_p, (unsigned long long)r.seed, (long long)r.gen_index, id,
                         GOLDEN[t].id);
    }
    sampling_scratch_free(&s);
}

// The golden ids are Gumbel-max draws: recomputed in double precision from
// the same uniforms (libm log, exact x), the largest score is the golden
// id wherever the two best scores are not within 1e-4 of each other.
Test(golden, ids_are_the_double_precision_gumbel_argmax) {
    const int V = 24;
    int32_t ids[24];
    double cum[24];
    int checked = 0;
    for (int t = 0; t < N_GOLDEN; t++) {
        const sampling_row_t r = row_of(GOLDEN[t].T, GOLDEN[t].k, GOLDEN[t].p, GOLDEN[t].seed, GOLDEN[t].gen);
        if (r.temperature == 0) {
            cr_expect_eq(GOLDEN[t].id, 20, "golden row %d: greedy is the argmax, id 20", t);
            continue;
        }
        int n_cand;
        const int n = brute_kept(GOLDEN_LOGITS, V, &r, ids, cum, &n_cand);
        cr_expect_eq(n, GOLDEN[t].n_kept, "golden row %d: the brute force keeps %d", t, n);
        double best = -INFINITY, second = -INFINITY;
        int32_t best_id = -1;
        for (int j = 0; j < n; j++) {
            const double u = sampling_uniform(r.seed, r.gen_index, ids[j]);
            const double score = ((double)GOLDEN_LOGITS[ids[j]] - 3.0) / r.temperature - log(-log(u));
            if (score > best) second = best, best = score, best_id = ids[j];
            else if (score > second) second = score;
        }
        if (best - second > 1e-4) {
            cr_expect_eq(best_id, GOLDEN[t].id, "golden row %d: the double-precision Gumbel argmax is %d", t, best_id);
            checked++;
        }
    }
    cr_expect_geq(checked, N_GOLDEN - 3, "only %d golden rows were clear enough to check", checked);
}

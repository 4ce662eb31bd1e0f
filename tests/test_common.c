/*
 * tests/test_common.c - Criterion tests of common/: bf16 conversion, the
 * comparison routine (it must catch a planted error, a NaN, an Inf, an
 * unwritten output, a too-large NMSE) and the seeded generator.
 *
 * Run: make test  (or build/tests/test_common after make)
 */
#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "common/bf16.h"
#include "common/check.h"
#include "common/compare.h"
#include "common/json_writer.h"
#include "common/rng.h"

static const tolerance_t TOL = {1e-6, 1e-3, 1e-6, "test tolerance"};

Test(bf16, exact_values_round_trip) {
    float values[] = {0.0f, -0.0f, 1.0f, -2.5f, 0.15625f, 65280.0f, INFINITY, -INFINITY};
    for (size_t i = 0; i < sizeof values / sizeof values[0]; i++)
        cr_expect_eq(bf16_to_float(float_to_bf16(values[i])), values[i], "value %g", values[i]);
}

Test(bf16, rounds_to_nearest_even) {
    // 1 + 2^-8 is exactly halfway between bf16 1.0 and 1 + 2^-7: ties go to even (1.0).
    cr_expect_eq(float_to_bf16(1.0f + 0x1p-8f), 0x3f80);
    // 1 + 3*2^-8 is halfway between 1 + 2^-7 (odd) and 1 + 2^-6 (even): rounds up.
    cr_expect_eq(float_to_bf16(1.0f + 3 * 0x1p-8f), 0x3f82);
    // Just above halfway rounds up.
    cr_expect_eq(float_to_bf16(1.0f + 0x1p-8f + 0x1p-20f), 0x3f81);
    cr_expect_eq(float_to_bf16(3.0f), 0x4040);
}

Test(bf16, nan_stays_nan) {
    cr_expect(isnan(bf16_to_float(float_to_bf16(NAN))));
    // A NaN whose payload lives only in the low 16 bits must not become Inf.
    uint32_t u = 0x7f800001u;
    float f;
    memcpy(&f, &u, 4);
    cr_expect(isnan(bf16_to_float(float_to_bf16(f))));
}

Test(compare, identical_passes) {
    float ref[4] = {1, -2, 3, 0.5f};
    bf16_t out[4];
    float_to_bf16_array(out, ref, 4);
    compare_result_t r = compare_bf16("t", out, ref, 4, TOL, 1);
    cr_expect(r.pass);
    cr_expect_eq(r.n_bad, 0);
    cr_expect_eq(r.max_abs, 0.0);
}

Test(compare, catches_planted_error) {
    float ref[1000], out[1000];
    for (int i = 0; i < 1000; i++) ref[i] = out[i] = (float)i * 0.25f + 1.0f;
    out[517] = ref[517] * 1.01f;  // one element 1% off; rtol is 0.1%
    compare_result_t r = compare_f32("t", out, ref, 1000, TOL, 1);
    cr_expect(!r.pass);
    cr_expect_eq(r.n_bad, 1);
    cr_expect_float_eq(r.max_rel, 0.01, 1e-4);
}

Test(compare, nan_is_always_a_failure) {
    float ref[3] = {1, 2, 3}, out[3] = {1, NAN, 3};
    tolerance_t loose = {1e9, 1e9, 1e9, "anything finite passes"};
    compare_result_t r = compare_f32("t", out, ref, 3, loose, 1);
    cr_expect(!r.pass);
    cr_expect_eq(r.n_nonfinite, 1);
}

Test(compare, inf_is_always_a_failure) {
    float ref[2] = {1, 2}, out[2] = {1, INFINITY};
    tolerance_t loose = {1e9, 1e9, 1e9, "anything finite passes"};
    compare_result_t r = compare_f32("t", out, ref, 2, loose, 1);
    cr_expect(!r.pass);
    cr_expect_eq(r.n_nonfinite, 1);
}

Test(compare, nan_in_reference_is_a_failure) {
    float ref[2] = {1, NAN}, out[2] = {1, 2};
    compare_result_t r = compare_f32("t", out, ref, 2, TOL, 1);
    cr_expect(!r.pass);
    cr_expect_eq(r.n_nonfinite, 1);
}

Test(compare, unwritten_output_is_caught) {
    float ref[8];
    bf16_t out[8];
    for (int i = 0; i < 8; i++) ref[i] = (float)i;
    poison_host(out, sizeof out);
    // A kernel that forgot the last two elements:
    for (int i = 0; i < 6; i++) out[i] = float_to_bf16(ref[i]);
    compare_result_t r = compare_bf16("t", out, ref, 8, TOL, 1);
    cr_expect(!r.pass);
    cr_expect_eq(r.n_unwritten, 2);
}

Test(compare, poisoned_f32_is_unwritten) {
    float ref[2] = {1, 2}, out[2] = {1, 2};
    poison_host(&out[1], sizeof(float));
    compare_result_t r = compare_f32("t", out, ref, 2, TOL, 1);
    cr_expect(!r.pass);
    cr_expect_eq(r.n_unwritten, 1);
}

Test(compare, nmse_bound_is_enforced) {
    // Every element inside atol + rtol*|ref|, but all biased the same way:
    // NMSE = (1e-3)^2 = 1e-6 is over a bound of 1e-7.
    float ref[100], out[100];
    for (int i = 0; i < 100; i++) {
        ref[i] = 1.0f + i;
        out[i] = ref[i] * (1.0f + 1e-3f);
    }
    tolerance_t tol = {0, 2e-3, 1e-7, "tight nmse"};
    compare_result_t r = compare_f32("t", out, ref, 100, tol, 1);
    cr_expect_eq(r.n_bad, 0);
    cr_expect(!r.pass);
    cr_expect_float_eq(r.nmse, 1e-6, 1e-8);
}

Test(compare, f64_reference) {
    float out[2] = {1.0f, 2.0f};
    double ref[2] = {1.0, 2.0 + 1e-12};
    compare_result_t r = compare_f64("t", out, ref, 2, TOL, 1);
    cr_expect(r.pass);
}

Test(rng, same_seed_same_stream) {
    rng_t a, b;
    rng_seed(&a, 7);
    rng_seed(&b, 7);
    for (int i = 0; i < 100; i++) cr_expect_eq(rng_u64(&a), rng_u64(&b));
}

Test(rng, uniform_in_range_and_not_constant) {
    rng_t r;
    rng_seed(&r, 1);
    float lo = 1e9f, hi = -1e9f;
    for (int i = 0; i < 10000; i++) {
        float v = rng_uniform(&r, -2.0f, 3.0f);
        cr_assert(v >= -2.0f && v < 3.0f);
        lo = fminf(lo, v);
        hi = fmaxf(hi, v);
    }
    cr_expect(lo < -1.9f && hi > 2.9f);
    for (int i = 0; i < 1000; i++) {
        int k = rng_int(&r, 3, 5);
        cr_assert(k >= 3 && k <= 5);
    }
}

Test(rng, normal_has_right_moments) {
    rng_t r;
    rng_seed(&r, 2);
    double s = 0, s2 = 0;
    int n = 200000;
    for (int i = 0; i < n; i++) {
        double v = rng_normal(&r, 1.0f, 2.0f);
        s += v;
        s2 += v * v;
    }
    double mean = s / n, var = s2 / n - mean * mean;
    cr_expect(fabs(mean - 1.0) < 0.02, "mean %g", mean);
    cr_expect(fabs(var - 4.0) < 0.05, "var %g", var);
}

Test(check, mv_error_records_message) {
    cr_expect_eq(mv_error("bad shape %d", 7), -1);
    cr_expect_str_eq(mv_last_error(), "bad shape 7");
}

Test(check, mv_error_prefix_keeps_the_cause) {
    mv_error("bad shape %d", 7);
    cr_assert_eq(mv_error_prefix("layer %d", 3), -1);
    cr_assert_str_eq(mv_last_error(), "layer 3: bad shape 7");
    mv_error_prefix("step %s", "x");
    cr_assert_str_eq(mv_last_error(), "step x: layer 3: bad shape 7");
}

// The chapters' --json writer, read back by cJSON (the engine's parser).
Test(json_writer, round_trips_through_cjson) {
    mv_json_t *root = mvj_object();
    mvj_set_string(root, "s", "quote \" back\\ nl\n tab\t ctl\x01 utf8 \xe4\xb8\xad");
    mvj_set_number(root, "pi", 3.141592653589793);
    mvj_set_number(root, "tiny", 1e-300);
    mvj_set_number(root, "int", 123456789012.0);
    mvj_set_number(root, "nan", NAN);
    mvj_set_bool(root, "t", 1);
    mvj_set_string(root, "replaced", "old");
    mv_json_t *arr = mvj_set_array(root, "arr");
    mvj_push(arr, mvj_number(0.1));
    mvj_push(arr, mvj_string(""));
    mvj_set_object(root, "empty");
    mvj_set_string(root, "replaced", "new");  // same key: replaced in place, not added
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    cr_assert(f);
    cr_assert_eq(mvj_write(root, f), 0);
    fclose(f);
    mvj_free(root);
    cJSON *j = cJSON_Parse(buf);
    cr_assert(j, "cJSON could not parse the writer's output:\n%s", buf);
    cr_assert_str_eq(cJSON_GetObjectItem(j, "s")->valuestring, "quote \" back\\ nl\n tab\t ctl\x01 utf8 \xe4\xb8\xad");
    cr_assert_eq(cJSON_GetObjectItem(j, "pi")->valuedouble, 3.141592653589793);
    cr_assert_eq(cJSON_GetObjectItem(j, "tiny")->valuedouble, 1e-300);
    cr_assert_eq(cJSON_GetObjectItem(j, "int")->valuedouble, 123456789012.0);
    cr_assert(cJSON_IsNull(cJSON_GetObjectItem(j, "nan")));
    cr_assert(cJSON_IsTrue(cJSON_GetObjectItem(j, "t")));
    cr_assert_str_eq(cJSON_GetObjectItem(j, "replaced")->valuestring, "new");
    cr_assert_eq(cJSON_GetArraySize(j), 9, "keys: 9 distinct, got %d", cJSON_GetArraySize(j));
    cJSON *a = cJSON_GetObjectItem(j, "arr");
    cr_assert_eq(cJSON_GetArraySize(a), 2);
    cr_assert_eq(cJSON_GetArrayItem(a, 0)->valuedouble, 0.1);
    cr_assert(cJSON_IsObject(cJSON_GetObjectItem(j, "empty")));
    cJSON_Delete(j);
    free(buf);
}

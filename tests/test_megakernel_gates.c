/*
 * tests/test_megakernel_gates.c - MV_MEGAKERNEL_GATES, the megakernel's
 * schedule of weight refills (kernels/decode_megakernel.h,
 * decode_megakernel_gates), is read the same way by the kernel's plan and
 * by the CUDA runner's creation, which refuses a bad value naming it. The
 * parse is host code, so it is checked here without a GPU: the default,
 * "off", the bounds of each slot (before the phase that reads the
 * projection, after the same phase of the layer before), and the forms that
 * must be refused. In a build without CUDA there is nothing to test.
 *
 * Run: make test  (or build/tests/test_megakernel_gates after make)
 */
#include <criterion/criterion.h>
#include <string.h>

#if MV_HAVE_CUDA
#include "kernels/decode_megakernel.h"

static int parse(const char *v, int gate[4], int *gated, char *why) {
    return decode_megakernel_gates(v, gate, gated, why, 160);
}

Test(megakernel_gates, default_off_and_bounds) {
    int g[4], on;
    char why[160];
    cr_assert_eq(parse(NULL, g, &on, why), 1);
    cr_assert(on && g[0] == -2 && g[1] == 0 && g[2] == 2 && g[3] == 4, "the default is -2,0,2,4");
    cr_assert_eq(parse("off", g, &on, why), 1);
    cr_assert_eq(on, 0);
    cr_assert_eq(parse("-6,-2,-1,0", g, &on, why), 1, "the earliest slots: %s", why);
    cr_assert(on && g[0] == -6 && g[1] == -2 && g[2] == -1 && g[3] == 0);
    cr_assert_eq(parse("-1,3,4,5", g, &on, why), 1, "the latest slots: %s", why);
    cr_assert(on && g[0] == -1 && g[1] == 3 && g[2] == 4 && g[3] == 5);
}

Test(megakernel_gates, refused_with_the_value_named) {
    // A slot at or after the phase that reads its projection (the kernel
    // would wait for itself), before the same phase of the layer before,
    // too few or too many slots, not a number, empty.
    const char *bad[] = {"0,0,2,4", "-2,4,2,4", "-2,0,5,4", "-2,0,2,6", "-7,0,2,4", "-2,-3,2,4", "-2,0,2",
                         "-2,0,2,4,", "-2,0,2,4,1", "bogus", "", "-2;0;2;4", "OFF"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        int g[4], on = -1;
        char why[160] = "";
        cr_expect_eq(parse(bad[i], g, &on, why), 0, "MV_MEGAKERNEL_GATES=%s was taken", bad[i]);
        cr_expect_eq(on, 0, "MV_MEGAKERNEL_GATES=%s left the gates on", bad[i]);
        cr_expect(strstr(why, "MV_MEGAKERNEL_GATES=") != NULL, "the reason names the variable: %s", why);
    }
}
#else
Test(megakernel_gates, needs_cuda) { cr_skip_test("built without CUDA: no megakernel"); }
#endif

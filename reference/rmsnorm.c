/*
 * reference/rmsnorm.c - RMSNorm on the CPU (see rmsnorm.h).
 * Clarity first: this is the code the GPU kernels are checked against.
 */
#include "reference/rmsnorm.h"

#include <math.h>
#include <stddef.h>

#include "common/check.h"

static int check_eps(const char *who, float eps) {
    if (!(eps > 0.0f) || !isfinite(eps)) return mv_error("%s: eps must be > 0 and finite, got %g", who, eps);
    return 0;
}

int rmsnorm_validate(long long T, long long hidden, float eps) {
    if (T < 0) return mv_error("rmsnorm: T (tokens) must be >= 0, got %lld", T);
    if (hidden < 1 || hidden > RMSNORM_MAX_HIDDEN)
        return mv_error("rmsnorm: hidden size must be in [1, %d], got %lld", RMSNORM_MAX_HIDDEN, hidden);
    if (T * hidden > (1LL << 40))
        return mv_error("rmsnorm: T*hidden = %lld elements is larger than the lab supports", T * hidden);
    return check_eps("rmsnorm", eps);
}

int rmsnorm_heads_validate(long long T, long long num_heads, long long head_dim, long long x_stride,
                           long long out_stride, float eps) {
    if (T < 0) return mv_error("rmsnorm_heads: T (tokens) must be >= 0, got %lld", T);
    if (num_heads < 1) return mv_error("rmsnorm_heads: num_heads must be >= 1, got %lld", num_heads);
    if (head_dim < 1 || head_dim > 1024)
        return mv_error("rmsnorm_heads: head_dim must be in [1, 1024], got %lld", head_dim);
    // Each token's heads must fit inside its row, or rows would overlap.
    if (x_stride < num_heads * head_dim)
        return mv_error("rmsnorm_heads: x row stride %lld is smaller than num_heads*head_dim = %lld",
                        x_stride, num_heads * head_dim);
    if (out_stride < num_heads * head_dim)
        return mv_error("rmsnorm_heads: out row stride %lld is smaller than num_heads*head_dim = %lld",
                        out_stride, num_heads * head_dim);
    if (T * num_heads >= (1LL << 31))
        return mv_error("rmsnorm_heads: T*num_heads = %lld rows is larger than the lab supports", T * num_heads);
    if (T * x_stride > (1LL << 40) || T * out_stride > (1LL << 40))
        return mv_error("rmsnorm_heads: T*stride is larger than the lab supports");
    return check_eps("rmsnorm_heads", eps);
}

void rmsnorm_row_cpu(float *y, const float *x, const float *w, int n, float eps) {
    // The sum of squares in double: the reference should not lose digits the
    // kernels (fp32, tree-ordered) keep, on rows of up to a million elements.
    double sum_sq = 0.0;
    for (int i = 0; i < n; i++) sum_sq += (double)x[i] * x[i];
    float inv_rms = (float)(1.0 / sqrt(sum_sq / n + eps));
    for (int i = 0; i < n; i++) y[i] = x[i] * inv_rms * w[i];
}

int rmsnorm_cpu(float *out, const float *x, const float *w, int T, int hidden, float eps) {
    if (rmsnorm_validate(T, hidden, eps)) return -1;
    for (int t = 0; t < T; t++)
        rmsnorm_row_cpu(out + (size_t)t * hidden, x + (size_t)t * hidden, w, hidden, eps);
    return 0;
}

int fused_add_rmsnorm_cpu(float *out, float *residual, const float *x, const float *w, int T,
                          int hidden, float eps) {
    if (rmsnorm_validate(T, hidden, eps)) return -1;
    for (int t = 0; t < T; t++) {
        float *r = residual + (size_t)t * hidden;  // [hidden]
        const float *xt = x + (size_t)t * hidden;  // [hidden]
        for (int i = 0; i < hidden; i++) r[i] += xt[i];
        rmsnorm_row_cpu(out + (size_t)t * hidden, r, w, hidden, eps);
    }
    return 0;
}

int rmsnorm_heads_cpu(float *out, long long out_stride, const float *x, long long x_stride,
                      const float *w, int T, int num_heads, int head_dim, float eps) {
    if (rmsnorm_heads_validate(T, num_heads, head_dim, x_stride, out_stride, eps)) return -1;
    for (int t = 0; t < T; t++)
        for (int h = 0; h < num_heads; h++)
            rmsnorm_row_cpu(out + t * out_stride + (ptrdiff_t)h * head_dim,
                            x + t * x_stride + (ptrdiff_t)h * head_dim, w, head_dim, eps);
    return 0;
}

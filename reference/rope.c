/*
 * reference/rope.c - RoPE on the CPU (see rope.h): inv_freq (default and
 * llama3 rules), the fp32 cos/sin cache, the rotation, and Qwen3's
 * q_norm/k_norm + RoPE. Clarity first: the kernels are checked against it.
 */
#include "reference/rope.h"

#include <math.h>
#include <stddef.h>
#include <stdlib.h>

#include "common/check.h"
#include "reference/rmsnorm.h"

int rope_config_validate(const rope_config_t *cfg) {
    if (!cfg) return mv_error("rope: no config");
    if (cfg->head_dim < 2 || cfg->head_dim > ROPE_MAX_HEAD_DIM || cfg->head_dim % 2)
        return mv_error("rope: head_dim must be even and in [2, %d], got %d", ROPE_MAX_HEAD_DIM, cfg->head_dim);
    if (cfg->max_position < 1 || cfg->max_position > ROPE_MAX_POSITION)
        return mv_error("rope: max_position_embeddings must be in [1, %d], got %d", ROPE_MAX_POSITION,
                        cfg->max_position);
    if (!(cfg->theta > 1.0) || !isfinite(cfg->theta))
        return mv_error("rope: rope_theta must be > 1 and finite, got %g", cfg->theta);
    if (cfg->scaling == ROPE_SCALING_NONE) return 0;
    if (cfg->scaling != ROPE_SCALING_LLAMA3) return mv_error("rope: unknown rope scaling type %d", (int)cfg->scaling);
    if (!(cfg->factor >= 1.0) || !isfinite(cfg->factor))
        return mv_error("rope: llama3 factor must be >= 1, got %g", cfg->factor);
    if (!(cfg->low_freq_factor > 0.0) || !(cfg->high_freq_factor > cfg->low_freq_factor) ||
        !isfinite(cfg->high_freq_factor))
        return mv_error("rope: llama3 needs 0 < low_freq_factor < high_freq_factor, got %g and %g",
                        cfg->low_freq_factor, cfg->high_freq_factor);
    if (cfg->original_max_position < 1)
        return mv_error("rope: llama3 original_max_position_embeddings must be >= 1, got %d",
                        cfg->original_max_position);
    return 0;
}

// Hugging Face's _compute_llama3_parameters, element by element, in fp32
// and in its order of operations (Python scalars become fp32 when they meet
// an fp32 tensor; `a / tensor` is computed as reciprocal(tensor) * a):
//
//   wavelen = 2*pi / inv_freq
//   wavelen < original_max / high_freq_factor  -> inv_freq           (high frequencies: kept)
//   wavelen > original_max / low_freq_factor   -> inv_freq / factor  (low frequencies: stretched)
//   otherwise smooth = (original_max / wavelen - low) / (high - low)
//             inv_freq = (1 - smooth) * inv_freq / factor + smooth * inv_freq
//
// A dimension whose wavelength is short next to the original context turns
// many times inside it: it encodes local order and is kept. One whose
// wavelength is longer than the original context never completed a turn in
// training; dividing its frequency by `factor` stretches it over the longer
// context. The band between is blended linearly in original_max / wavelen.
static float llama3_scale(float inv, const rope_config_t *cfg) {
    const float low_wavelen = (float)(cfg->original_max_position / cfg->low_freq_factor);
    const float high_wavelen = (float)(cfg->original_max_position / cfg->high_freq_factor);
    const float factor = (float)cfg->factor;
    const float wavelen = (1.0f / inv) * (float)(2.0 * M_PI);
    if (wavelen < high_wavelen) return inv;
    if (wavelen > low_wavelen) return inv / factor;
    const float smooth = ((1.0f / wavelen) * (float)cfg->original_max_position - (float)cfg->low_freq_factor) /
                         (float)(cfg->high_freq_factor - cfg->low_freq_factor);
    return (1.0f - smooth) * inv / factor + smooth * inv;
}

int rope_inv_freq(float *inv_freq, const rope_config_t *cfg) {
    if (rope_config_validate(cfg)) return -1;
    const int half = cfg->head_dim / 2;
    for (int i = 0; i < half; i++) {
        // HF: 1.0 / (base ** (arange(0, dim, 2).float() / dim)), all fp32.
        float exponent = (float)(2 * i) / (float)cfg->head_dim;
        float inv = 1.0f / powf((float)cfg->theta, exponent);
        inv_freq[i] = cfg->scaling == ROPE_SCALING_LLAMA3 ? llama3_scale(inv, cfg) : inv;
    }
    return 0;
}

int rope_cache_build(rope_cache_t *cache, const rope_config_t *cfg) {
    cache->cos_sin = NULL;
    if (rope_config_validate(cfg)) return -1;
    const int D = cfg->head_dim, half = D / 2;
    float *inv_freq = malloc(sizeof(float) * (size_t)half);
    float *cs = malloc(sizeof(float) * (size_t)cfg->max_position * (size_t)D);
    if (!inv_freq || !cs) {
        free(inv_freq);
        free(cs);
        return mv_error("rope: out of host memory for a %d x %d cos/sin cache", cfg->max_position, D);
    }
    if (rope_inv_freq(inv_freq, cfg)) {  // cannot fail: cfg was validated
        free(inv_freq);
        free(cs);
        return -1;
    }
    for (int p = 0; p < cfg->max_position; p++) {
        float *row = cs + (size_t)p * D;  // [D]: cos[half], then sin[half]
        for (int i = 0; i < half; i++) {
            // The angle is HF's fp32 product; cos and sin of it are taken in
            // double and rounded once (within half an fp32 ulp of the true
            // cos/sin of that angle; torch's fp32 cos is within about one).
            float angle = (float)p * inv_freq[i];
            row[i] = (float)cos((double)angle);
            row[half + i] = (float)sin((double)angle);
        }
    }
    free(inv_freq);
    cache->cos_sin = cs;
    cache->max_position = cfg->max_position;
    cache->head_dim = D;
    return 0;
}

void rope_cache_free(rope_cache_t *cache) {
    free(cache->cos_sin);
    cache->cos_sin = NULL;
}

int rope_validate_positions(const int32_t *positions, int T, int max_position) {
    if (T < 0) return mv_error("rope: T (tokens) must be >= 0, got %d", T);
    if (T > 0 && !positions) return mv_error("rope: no positions for %d tokens", T);
    for (int t = 0; t < T; t++)
        if (positions[t] < 0 || positions[t] >= max_position)
            return mv_error("rope: token %d has position %d, outside [0, %d) (max_position_embeddings)", t,
                            (int)positions[t], max_position);
    return 0;
}

int rope_validate(long long T, long long num_heads, long long num_kv_heads, long long head_dim,
                  long long q_stride, long long k_stride, int cache_head_dim, int cache_max_position) {
    if (T < 0) return mv_error("rope: T (tokens) must be >= 0, got %lld", T);
    if (num_heads < 1 || num_kv_heads < 1)
        return mv_error("rope: num_heads and num_kv_heads must be >= 1, got %lld and %lld", num_heads, num_kv_heads);
    if (head_dim < 2 || head_dim > ROPE_MAX_HEAD_DIM || head_dim % 2)
        return mv_error("rope: head_dim must be even and in [2, %d], got %lld", ROPE_MAX_HEAD_DIM, head_dim);
    if (head_dim != cache_head_dim)
        return mv_error("rope: head_dim %lld differs from the cos/sin cache's %d", head_dim, cache_head_dim);
    if (cache_max_position < 1) return mv_error("rope: the cos/sin cache is empty");
    // Each token's heads must fit inside its row, or rows would overlap.
    if (q_stride < num_heads * head_dim)
        return mv_error("rope: q row stride %lld is smaller than num_heads*head_dim = %lld", q_stride,
                        num_heads * head_dim);
    if (k_stride < num_kv_heads * head_dim)
        return mv_error("rope: k row stride %lld is smaller than num_kv_heads*head_dim = %lld", k_stride,
                        num_kv_heads * head_dim);
    if (T * (num_heads + num_kv_heads) >= (1LL << 31))
        return mv_error("rope: T*(num_heads+num_kv_heads) = %lld heads is larger than the lab supports",
                        T * (num_heads + num_kv_heads));
    if (T * q_stride > (1LL << 40) || T * k_stride > (1LL << 40))
        return mv_error("rope: T*stride is larger than the lab supports");
    return 0;
}

// Turn each pair (x[i], x[i + D/2]) of one head by its angle.
static void rotate_head(float *x, const float *cos_sin_row, int D) {
    const int half = D / 2;
    const float *c = cos_sin_row, *s = cos_sin_row + half;
    for (int i = 0; i < half; i++) {
        float x1 = x[i], x2 = x[i + half];
        x[i] = x1 * c[i] - x2 * s[i];
        x[i + half] = x2 * c[i] + x1 * s[i];
    }
}

int rope_cpu(float *q, long long q_stride, float *k, long long k_stride, const int32_t *positions,
             const rope_cache_t *cache, int T, int num_heads, int num_kv_heads, int head_dim) {
    if (!cache || !cache->cos_sin) return mv_error("rope_cpu: no cos/sin cache");
    if (rope_validate(T, num_heads, num_kv_heads, head_dim, q_stride, k_stride, cache->head_dim,
                      cache->max_position) ||
        rope_validate_positions(positions, T, cache->max_position))
        return -1;
    for (int t = 0; t < T; t++) {
        const float *row = cache->cos_sin + (size_t)positions[t] * head_dim;
        for (int h = 0; h < num_heads; h++) rotate_head(q + t * q_stride + (ptrdiff_t)h * head_dim, row, head_dim);
        for (int h = 0; h < num_kv_heads; h++) rotate_head(k + t * k_stride + (ptrdiff_t)h * head_dim, row, head_dim);
    }
    return 0;
}

int qk_norm_rope_cpu(float *qkv, const float *q_norm_w, const float *k_norm_w,
                     const int32_t *positions, const rope_cache_t *cache, int T, int num_heads,
                     int num_kv_heads, int head_dim, float eps) {
    if (!cache || !cache->cos_sin) return mv_error("qk_norm_rope_cpu: no cos/sin cache");
    const long long row = (long long)(num_heads + 2LL * num_kv_heads) * head_dim;
    // Every check before anything is written: a failure leaves qkv as it was.
    if (rope_validate(T, num_heads, num_kv_heads, head_dim, row, row, cache->head_dim, cache->max_position) ||
        rope_validate_positions(positions, T, cache->max_position) ||
        rmsnorm_heads_validate(T, num_heads, head_dim, row, row, eps))
        return -1;
    float *q = qkv, *k = qkv + (ptrdiff_t)num_heads * head_dim;
    if (rmsnorm_heads_cpu(q, row, q, row, q_norm_w, T, num_heads, head_dim, eps) ||
        rmsnorm_heads_cpu(k, row, k, row, k_norm_w, T, num_kv_heads, head_dim, eps))
        return -1;
    return rope_cpu(q, row, k, row, positions, cache, T, num_heads, num_kv_heads, head_dim);
}

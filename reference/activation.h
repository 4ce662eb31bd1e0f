/*
 * reference/activation.h - CPU reference of Qwen3's MLP activation, SiluAndMul.
 *
 * In a Qwen3 decoder layer the MLP is
 *     down_proj( silu(gate_proj(x)) * up_proj(x) )
 * The engine computes gate_proj and up_proj as one merged GEMM whose output
 * row holds the gate half then the up half: in[t] = [gate (I) | up (I)].
 * SiluAndMul turns that [T, 2*I] tensor into [T, I]:
 *     out[t][j] = silu(in[t][j]) * in[t][I + j],   silu(g) = g / (1 + exp(-g))
 * For Qwen3-0.6B, I (intermediate_size) is 3072.
 *
 * fp32 in, fp32 out: the chapter converts its bf16 inputs to float first, and
 * the engine's CPU backend runs in fp32 throughout.
 */
#ifndef MV_REF_ACTIVATION_H
#define MV_REF_ACTIVATION_H

#include <math.h>

#ifdef __cplusplus
extern "C" {
#endif

// Largest I accepted, so that every index 2*I*T fits the kernels' arithmetic.
#define SILU_AND_MUL_MAX_I (1 << 24)

// 0 if the shape is valid, else -1 with a message (see common/check.h).
int silu_and_mul_validate(long long T, long long I);

// out [T, I] fp32 = silu(in[:, :I]) * in[:, I:], in [T, 2*I] fp32.
int silu_and_mul_cpu(float *out, const float *in, int T, int I);

static inline float silu_f32(float g) { return g / (1.0f + expf(-g)); }

#ifdef __cplusplus
}
#endif
#endif

/*
 * reference/rmsnorm.h - CPU reference of RMSNorm in its three Qwen3 forms.
 *
 *     y = x / sqrt(mean(x^2) + eps) * w          (over the last dimension)
 *
 * Where Qwen3 uses it:
 *  - plain: a norm with no residual to add (Hugging Face's final norm; in
 *    the engine's vLLM-style layout, layer 0's input_layernorm, where the
 *    residual stream starts);
 *  - fused with the residual add: each decoder layer's input_layernorm and
 *    post_attention_layernorm receive the sublayer output x and the running
 *    residual stream; the layer computes residual = x + residual, keeps it
 *    for the next add, and normalises it;
 *  - per head: q_norm and k_norm normalise each head of q and k over
 *    head_dim (Qwen3's change from Qwen2, which keeps attention logits in
 *    range), with weights of shape [head_dim].
 * eps is config.json's rms_norm_eps (1e-6 for Qwen3).
 *
 * fp32 in, fp32 out (the chapter converts bf16 inputs, the engine's CPU
 * backend is fp32). All three forms share one row routine.
 */
#ifndef MV_REF_RMSNORM_H
#define MV_REF_RMSNORM_H

#ifdef __cplusplus
extern "C" {
#endif

#define RMSNORM_MAX_HIDDEN (1 << 20)

// Shape checks shared by the CPU reference and the CUDA launchers.
int rmsnorm_validate(long long T, long long hidden, float eps);
int rmsnorm_heads_validate(long long T, long long num_heads, long long head_dim, long long x_stride,
                           long long out_stride, float eps);

// One row: y[i] = x[i] / sqrt(mean(x^2) + eps) * w[i], i < n.
void rmsnorm_row_cpu(float *y, const float *x, const float *w, int n, float eps);

// out [T, hidden] = rmsnorm(x [T, hidden]) * w [hidden]
int rmsnorm_cpu(float *out, const float *x, const float *w, int T, int hidden, float eps);

// residual [T, hidden] += x [T, hidden]  (written back: the next layer's residual)
// out [T, hidden] = rmsnorm(residual) * w
int fused_add_rmsnorm_cpu(float *out, float *residual, const float *x, const float *w, int T,
                          int hidden, float eps);

// Per head, in a strided layout: head h of token t starts at x + t*x_stride + h*head_dim.
// This reads q or k straight out of the QKV projection's output row.
// out may equal x (in place).
int rmsnorm_heads_cpu(float *out, long long out_stride, const float *x, long long x_stride,
                      const float *w, int T, int num_heads, int head_dim, float eps);

#ifdef __cplusplus
}
#endif
#endif

/*
 * reference/rope.h - CPU reference of rotary position embedding (RoPE) as
 * Hugging Face applies it to Qwen3 and Llama, and of Qwen3's fused
 * q_norm/k_norm + RoPE.
 *
 * Where it sits in Qwen3: after the QKV projection, each q and k head
 * (q_norm / k_norm first, in Qwen3) is rotated by its token's position;
 * v is not. Attention then compares rotated q and k.
 *
 * The rotation ("rotate_half" form): for head_dim D, element i of the first
 * half pairs with element i + D/2 (not with its neighbour, as in the
 * original RoFormer paper), and the pair is turned by the angle
 * pos * inv_freq[i]:
 *
 *     x1' = x1 * cos - x2 * sin          x1 = x[i],  x2 = x[i + D/2]
 *     x2' = x2 * cos + x1 * sin          inv_freq[i] = theta^(-2i / D)
 *
 * Each pair is a point in a plane turned by a position-dependent angle, so
 * <rope(q, m), rope(k, n)> depends on m - n only: attention scores see
 * relative position, though each vector carries its absolute one.
 *
 * Numbers, and how they differ from Hugging Face (HF), vLLM and nano-vllm:
 *  - inv_freq is computed in fp32 as HF does (theta^(2i/D) in fp32, then
 *    the reciprocal); with llama3 scaling HF's _compute_llama3_parameters
 *    rule is followed in fp32, in HF's order of operations.
 *  - The cos/sin cache is fp32 [max_position, D]: row p holds
 *    cos(p * inv_freq[0..D/2)) then sin(...) (vLLM's cos_sin_cache layout). The angle is
 *    the fp32 product p * inv_freq[i], exactly as HF forms it (its matmul of
 *    inv_freq by positions has one term); its cosine and sine are taken in
 *    double and rounded once to float. At p = 40959 that fp32 angle is up
 *    to ~5e-3 rad from the exact one: that is HF's (and every fp32
 *    implementation's) position encoding, and we match it, not the ideal.
 *  - Rotation: HF casts cos/sin to the activations' dtype (bf16) and
 *    computes q*cos + rotate_half(q)*sin in bf16, rounding after each
 *    operation (vLLM's CUDA kernel also keeps cos/sin in the model's dtype);
 *    nano-vllm computes in fp32 from the bf16 inputs and rounds once.
 *    We do as nano-vllm: fp32 math, one rounding of the output to bf16 (in the
 *    kernels; this reference is fp32 in, fp32 out). The difference from HF
 *    is a few bf16 ulps on some elements, not a change of the rule.
 *
 * Positions: the cache has max_position rows; a position outside
 * [0, max_position) is an error (never a wrap-around), reported with the
 * token index. The CUDA launchers cannot read device positions, so callers
 * run rope_validate_positions() on the host copy before launching (the
 * engine has it: the scheduler builds positions on the host), as chapter
 * 04 does for token ids with embedding_validate_ids().
 */
#ifndef MV_REF_ROPE_H
#define MV_REF_ROPE_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define ROPE_MAX_HEAD_DIM 512
#define ROPE_MAX_POSITION (1 << 24)

typedef enum {
    ROPE_SCALING_NONE = 0,    // Qwen3: rope_scaling null
    ROPE_SCALING_LLAMA3 = 1,  // Llama 3.1+: rope_type "llama3"
} rope_scaling_t;

// What config.json says about RoPE (chapter 09 fills it from the file).
typedef struct {
    int head_dim;         // D: rotated dimension (Qwen3 and Llama rotate the whole head)
    int max_position;     // max_position_embeddings: rows of the cos/sin cache
    double theta;         // rope_theta (Qwen3: 1e6, Llama 3: 5e5)
    rope_scaling_t scaling;
    // llama3 scaling only (rope_scaling in config.json):
    double factor;            // e.g. 8
    double low_freq_factor;   // e.g. 1
    double high_freq_factor;  // e.g. 4
    int original_max_position;  // original_max_position_embeddings, e.g. 8192
} rope_config_t;

// The fp32 cos/sin cache, host side.
typedef struct {
    int max_position;  // rows
    int head_dim;      // D
    float *cos_sin;    // [max_position, D] fp32: row p = cos(p*inv_freq[0..D/2)), sin(p*inv_freq[0..D/2))
} rope_cache_t;

// Config checks (theta > 0, D even in [2, ROPE_MAX_HEAD_DIM], llama3 factors sane).
int rope_config_validate(const rope_config_t *cfg);

// inv_freq [D/2] fp32, default rule or llama3 rule (see rope.c).
int rope_inv_freq(float *inv_freq, const rope_config_t *cfg);

// Build the cache (allocates cache->cos_sin; free with rope_cache_free).
int rope_cache_build(rope_cache_t *cache, const rope_config_t *cfg);
void rope_cache_free(rope_cache_t *cache);

// Every position in [0, max_position)? Else -1 naming the first bad token
// index and its position. Call it before any CUDA launch.
int rope_validate_positions(const int32_t *positions, int T, int max_position);

// Shape checks shared by the CPU reference and the CUDA launchers.
// q row stride >= num_heads*head_dim, k row stride >= num_kv_heads*head_dim.
int rope_validate(long long T, long long num_heads, long long num_kv_heads, long long head_dim,
                  long long q_stride, long long k_stride, int cache_head_dim, int cache_max_position);

// Rotate in place: head h of token t at q + t*q_stride + h*D ([T, num_heads, D]
// with any row stride: q may be a view into the QKV output), k likewise with
// num_kv_heads; by positions [T]. fp32 in and out.
int rope_cpu(float *q, long long q_stride, float *k, long long k_stride, const int32_t *positions,
             const rope_cache_t *cache, int T, int num_heads, int num_kv_heads, int head_dim);

// Qwen3's q_norm/k_norm then RoPE, in place on the QKV projection output
// qkv [T, (H + 2*Hkv) * D] fp32 (q heads, then k heads, then v heads, per
// row): rmsnorm_heads_cpu (reference/rmsnorm.h) of the q heads with q_norm_w
// [D] and of the k heads with k_norm_w [D], then rope_cpu. v is untouched.
int qk_norm_rope_cpu(float *qkv, const float *q_norm_w, const float *k_norm_w,
                     const int32_t *positions, const rope_cache_t *cache, int T, int num_heads,
                     int num_kv_heads, int head_dim, float eps);

#ifdef __cplusplus
}
#endif
#endif

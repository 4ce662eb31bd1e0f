/*
 * kernels/embedding.cu - embedding gather and last-token selection (see embedding.h).
 *
 * Napkin math: a row of Qwen3-0.6B is 1024 bf16 = 2 KB, read once and
 * written once: 4 KB per token, no arithmetic. Pure memory traffic; only
 * the rows actually used are read, so a 311 MB table costs 4 KB a token.
 */
#include "kernels/embedding.h"

#include "common/check.h"
#include "kernels/common.cuh"

typedef __nv_bfloat16 bf16;

// A block per token (grid-strided); threads copy the row in VEC-wide vectors.
template <int VEC>
__global__ void embedding_kernel(bf16 *out, const int32_t *ids, const bf16 *table, int T, int H,
                                 int vocab_start, int vocab_end) {
    pdl_launch_dependents();
    pdl_wait();  // every read below is of activations (kernels/common.cuh: PDL)
    using vec_t = bf16_vec<VEC>;
    const int nvec = H / VEC;
    for (int t = blockIdx.x; t < T; t += gridDim.x) {
        const int id = ids[t];
        vec_t *dst = reinterpret_cast<vec_t *>(out + (long long)t * H);
        if (id >= vocab_start && id < vocab_end) {
            const vec_t *src = reinterpret_cast<const vec_t *>(table + (long long)(id - vocab_start) * H);
            for (int i = threadIdx.x; i < nvec; i += blockDim.x) dst[i] = src[i];
        } else {
            vec_t zero;
#pragma unroll
            for (int e = 0; e < VEC; e++) zero.v[e] = __float2bfloat16(0.0f);
            for (int i = threadIdx.x; i < nvec; i += blockDim.x) dst[i] = zero;
        }
    }
}

template <int VEC>
__global__ void gather_last_tokens_kernel(bf16 *out, const bf16 *hidden, const int32_t *cu_seqlens, int S, int H) {
    pdl_launch_dependents();
    pdl_wait();  // every read below is of activations (kernels/common.cuh: PDL)
    using vec_t = bf16_vec<VEC>;
    const int nvec = H / VEC;
    for (int s = blockIdx.x; s < S; s += gridDim.x) {
        const vec_t *src = reinterpret_cast<const vec_t *>(hidden + (long long)(cu_seqlens[s + 1] - 1) * H);
        vec_t *dst = reinterpret_cast<vec_t *>(out + (long long)s * H);
        for (int i = threadIdx.x; i < nvec; i += blockDim.x) dst[i] = src[i];
    }
}

static int row_vec(int H, const void *a, const void *b) {
    for (int v = 8; v > 1; v /= 2)
        if (H % v == 0 && mv_aligned(a, 2 * v) && mv_aligned(b, 2 * v)) return v;
    return 1;
}

static void rows_launch_shape(int rows, int H, int vec, unsigned *blocks, int *threads) {
    int nvec = H / vec;
    *threads = nvec >= 256 ? 256 : ((nvec + 31) / 32) * 32;
    long long cap = 32LL * mv_num_sms();
    *blocks = (unsigned)(rows < cap ? rows : cap);
}

extern "C" int embedding_cuda(bf16_t *d_out, const int32_t *d_ids, const bf16_t *d_table, int T, int H,
                              int vocab_start, int vocab_end, cudaStream_t stream) {
    if (T < 0 || H < 1 || vocab_start < 0 || vocab_end < vocab_start)
        return mv_error("embedding_cuda: bad shape T=%d H=%d rows [%d, %d)", T, H, vocab_start, vocab_end);
    if (T == 0) return 0;
    if (!d_out || !d_ids || !d_table) return mv_error("embedding_cuda: null pointer");
    int vec = row_vec(H, d_out, d_table), threads;
    unsigned blocks;
    rows_launch_shape(T, H, vec, &blocks, &threads);
    bf16 *out = (bf16 *)d_out;
    const bf16 *table = (const bf16 *)d_table;
    switch (vec) {
    case 8: mv_launch(embedding_kernel<8>, dim3(blocks), dim3(threads), 0, stream, out, d_ids, table, T, H, vocab_start, vocab_end); break;
    case 4: mv_launch(embedding_kernel<4>, dim3(blocks), dim3(threads), 0, stream, out, d_ids, table, T, H, vocab_start, vocab_end); break;
    case 2: mv_launch(embedding_kernel<2>, dim3(blocks), dim3(threads), 0, stream, out, d_ids, table, T, H, vocab_start, vocab_end); break;
    default: mv_launch(embedding_kernel<1>, dim3(blocks), dim3(threads), 0, stream, out, d_ids, table, T, H, vocab_start, vocab_end); break;
    }
    return CUDA_TRY(cudaGetLastError());
}

extern "C" int gather_last_tokens_cuda(bf16_t *d_out, const bf16_t *d_hidden, const int32_t *d_cu_seqlens,
                                       int S, int H, cudaStream_t stream) {
    if (S < 0 || H < 1) return mv_error("gather_last_tokens_cuda: bad shape S=%d H=%d", S, H);
    if (S == 0) return 0;
    if (!d_out || !d_hidden || !d_cu_seqlens) return mv_error("gather_last_tokens_cuda: null pointer");
    int vec = row_vec(H, d_out, d_hidden), threads;
    unsigned blocks;
    rows_launch_shape(S, H, vec, &blocks, &threads);
    bf16 *out = (bf16 *)d_out;
    const bf16 *hidden = (const bf16 *)d_hidden;
    switch (vec) {
    case 8: mv_launch(gather_last_tokens_kernel<8>, dim3(blocks), dim3(threads), 0, stream, out, hidden, d_cu_seqlens, S, H); break;
    case 4: mv_launch(gather_last_tokens_kernel<4>, dim3(blocks), dim3(threads), 0, stream, out, hidden, d_cu_seqlens, S, H); break;
    case 2: mv_launch(gather_last_tokens_kernel<2>, dim3(blocks), dim3(threads), 0, stream, out, hidden, d_cu_seqlens, S, H); break;
    default: mv_launch(gather_last_tokens_kernel<1>, dim3(blocks), dim3(threads), 0, stream, out, hidden, d_cu_seqlens, S, H); break;
    }
    return CUDA_TRY(cudaGetLastError());
}

/*
 * kernels/linear.cu - linear layers: cuBLAS GEMM (version 1), a small-M GEMV
 * of our own (version 2), the same GEMV on the tensor cores (version 3), a
 * tiled tensor-core GEMM for 9 to a few hundred tokens (version 4), the
 * dispatch between them, and the bias add (see linear.h).
 *
 * Napkin math, Qwen3-0.6B gate_up (N = 6144, K = 1024): the weight is
 * 12.6 MB. At M = 1 (one decode token) the layer does 12.6 MFLOP and must
 * read 12.6 MB: 1 FLOP per byte, memory-bound, ~3 us at 4.2 TB/s. At
 * M = 4096 it does 51.5 GFLOP over ~71 MB: compute-bound, ~65 us at 790
 * TFLOP/s. The crossover is near M = 200 (the measured ceilings, ~790
 * TFLOP/s over ~4.2 TB/s, give ~190 FLOP per byte on an H200).
 *
 * Below the crossover the weight must be read once, whatever M is, so the
 * floor is bytes / bandwidth. Bytes = 2 * (N*K + M*K + M*N) (bf16: W and x
 * read once, y written once); at M = 1, and at 85% of the ~4.3 TB/s copy
 * bandwidth (3.65 TB/s):
 *
 *   projection     N      K     bytes      floor at 85%
 *   qkv_proj       4096   1024   8.40 MB   2.30 us
 *   o_proj         1024   2048   4.20 MB   1.15 us
 *   gate_up_proj   6144   1024  12.60 MB   3.45 us
 *   down_proj      1024   3072   6.30 MB   1.72 us
 *   one layer                   31.50 MB   8.62 us
 *
 * (at M = 8 the bytes grow by under 1%). Every launch also pays a fixed
 * ~2 us: the launch itself, the first loads' DRAM latency (most of 1 us
 * before any byte arrives) and the tail of the last blocks. For these shapes that fixed
 * cost is as large as the streaming: the GEMV is predicted at ~4.3, 3.2,
 * 5.5 and 3.7 us, ~17 us per layer, against the ~36 us measured for cuBLAS
 * on one H200 by Nsight in a decode step (13.7 + 6.3 + 6.3 + 6.0 us and a
 * 3.3 us split-K reduce): about 0.5 ms less per 28-layer decode step.
 * cuBLAS's small-M path is slow for two reasons: a GEMM kernel's tile is
 * typically 64-256 output rows by 64-256 tokens, so at M = 1 nearly all of
 * each tile is padding and too few tiles (CTAs) exist to keep 132 SMs' loads
 * in flight; and it adds launches (the split-K reduce), each with its fixed
 * cost.
 */
#include "kernels/linear.h"
#include "kernels/versions.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "common/check.h"
#include "kernels/activation.cuh"
#include "kernels/common.cuh"
#include "kernels/gemv_mma.cuh"
#include "reference/linear.h"

typedef __nv_bfloat16 bf16;

// One thread per element; the bias row is tiny and stays in L1.
// out = bf16(acc + bias): the bias added in fp32, one rounding.
__global__ void bias_round_kernel(bf16 *out, const float *acc, const bf16 *bias, long long total, int N) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x)
        out[i] = __float2bfloat16(acc[i] + __bfloat162float(bias[i % N]));
}

__global__ void add_bias_kernel(bf16 *out, const bf16 *bias, long long total, int N) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x)
        out[i] = __float2bfloat16(__bfloat162float(out[i]) + __bfloat162float(bias[i % N]));
}

static unsigned grid_for(long long n) {
    long long blocks = (n + 255) / 256, cap = 8LL * mv_num_sms();
    return (unsigned)(blocks < cap ? (blocks > 0 ? blocks : 1) : cap);
}

// ---- version 1: cuBLAS ------------------------------------------------------------------

static int linear_cublas(cublasHandle_t handle, bf16_t *d_out, const bf16_t *d_x, const bf16_t *d_W,
                         const bf16_t *d_bias, int M, int N, int K, cudaStream_t stream) {
    if (!handle || !d_out || !d_x || !d_W) return mv_error("linear_cuda: null handle or pointer");
    // The stream is set only when it changes: cublasSetStream also puts the
    // handle back on cuBLAS's default workspace pool, which would drop a
    // workspace the caller gave it (the engine owns one: cublasSetWorkspace).
    cudaStream_t current = NULL;
    cublasStatus_t st = cublasGetStream(handle, &current);
    if (st == CUBLAS_STATUS_SUCCESS && current != stream) st = cublasSetStream(handle, stream);
    if (st != CUBLAS_STATUS_SUCCESS) return mv_error("linear_cuda: cublasSetStream: %s", cublasGetStatusName(st));
    const float alpha = 1.0f, beta = 0.0f;
    if (!d_bias) {
        // Column-major view: out^T [N, M] = op(W)[N, K] * x^T [K, M], with W
        // seen as K x N (ld K) and transposed, x^T as K x M (ld K), out^T ld N.
        st = cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, N, M, K, &alpha, d_W, CUDA_R_16BF, K, d_x,
                          CUDA_R_16BF, K, &beta, d_out, CUDA_R_16BF, N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        if (st != CUBLAS_STATUS_SUCCESS)
            return mv_error("linear_cuda: cublasGemmEx (M=%d N=%d K=%d): %s", M, N, K, cublasGetStatusName(st));
        return 0;
    }
    // With a bias the sum x W^T + b must be rounded to bf16 once: x W^T can
    // be much larger than the result, and rounding it first costs up to half
    // an ulp of x W^T. Measured on an H200 by chapter 03's bias cases: a
    // bf16-output GEMM with beta = 1 over the broadcast bias gave the very
    // same errors as adding the bias afterwards, so cuBLAS rounds the product
    // before adding C. Here the GEMM writes fp32 into a stream-ordered workspace, and one
    // kernel adds the bias and rounds.
    float *acc = NULL;
    size_t bytes = (size_t)M * N * sizeof(float);
    if (CUDA_TRY(cudaMallocAsync((void **)&acc, bytes, stream))) return -1;
    st = cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, N, M, K, &alpha, d_W, CUDA_R_16BF, K, d_x,
                      CUDA_R_16BF, K, &beta, acc, CUDA_R_32F, N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    if (st != CUBLAS_STATUS_SUCCESS) {
        cudaFreeAsync(acc, stream);
        return mv_error("linear_cuda: cublasGemmEx fp32 out (M=%d N=%d K=%d): %s", M, N, K, cublasGetStatusName(st));
    }
    long long total = (long long)M * N;
    bias_round_kernel<<<grid_for(total), 256, 0, stream>>>((bf16 *)d_out, acc, (const bf16 *)d_bias, total, N);
    int rc = CUDA_TRY(cudaGetLastError());
    if (CUDA_TRY(cudaFreeAsync(acc, stream))) return -1;
    return rc;
}

// ---- version 2: the small-M GEMV --------------------------------------------------------
//
// y[m][n] = sum_k x[m][k] W[n][k] (+ b[n]) for M <= 16 tokens, built so that
// every byte of W is read from HBM once, 16 bytes per load, with as many
// loads in flight as the SM can hold.
//
// Work split. A row of W is cut into 16-byte chunks (8 bf16), and 32
// consecutive chunks make a slab: 512 bytes, which one warp reads with one
// coalesced load instruction (lane l takes chunk l). A warp owns
// GEMV_ROWS = 2 neighbouring rows. `ks` warps, a group, share those rows,
// and the slabs of a row are dealt to them round-robin (warp s of the group
// takes slabs s, s + ks, s + 2 ks, ...). Each warp issues the loads of
// GEMV_U = 4 of its slabs for both rows (8 loads of 16 bytes per lane, 4 KB
// per warp) before it does any arithmetic; then, for each chunk, it reads
// the M tokens' 16 bytes of x (through L1: every warp of the SM reads the
// same few KB of x, so after the first warp they are L1 hits) and does
// 8 * M fp32 FMAs per row. The loads of W are marked read-only and
// L1::no_allocate: W is streamed once and must not evict x from L1.
//
// ks depends on K only: the smallest power of 2 (at most 8) with which one
// batch of GEMV_U slabs covers a warp's share of the row. So a row's sum is
// always taken in the same order, whatever N and M are: y[m][n] has the
// same bits at any batch size up to 16 and any N (batch-invariant decode;
// chapter 03 checks it).
//
// The sums. Each lane accumulates its chunks' products per (row, token) in
// fp32 registers (2 x M of them); a warp-shuffle tree adds the 32 lanes;
// lane 0 puts the warp's 2 x M sums in shared memory, and after one barrier
// each thread of the block adds one output's ks warp sums in warp order,
// adds the bias in fp32 and rounds to bf16 once. Neighbouring threads store
// neighbouring elements of y.
//
// Occupancy (H200, 132 SMs, M = 1): groups per block start at 8 / ks (256
// threads) and are halved while the grid has fewer than 2 blocks per SM, so
// small N still spreads over every SM:
//   qkv_proj  N=4096 K=1024: ks=1, 512 blocks of 4 warps, 15.5 warps/SM
//   o_proj    N=1024 K=2048: ks=2, 512 blocks of 2 warps,  7.8 warps/SM
//   gate_up   N=6144 K=1024: ks=1, 384 blocks of 8 warps, 23 warps/SM
//   down_proj N=1024 K=3072: ks=4, 512 blocks of 4 warps, 15.5 warps/SM
// With 8 loads (6 for down_proj) of 16 bytes per lane, that is 31-93 KB in
// flight per SM: each SM's whole share of the weight is requested at once,
// more than the ~25 KB per SM that Little's law asks for (4.3 TB/s x ~0.8 us
// of DRAM latency / 132 SMs). No split-K across blocks is needed: N = 1024
// rows are 512 row pairs, ~4 per SM, and the K split inside a group gives
// the warps.
//
// Instruction issue, the limit as M grows: per 16-byte chunk of a row a lane
// issues 1 load and ~8 unpacking operations for W, and per token 8 FMAs plus
// half of (1 load + ~8 unpacking operations) for x (shared by 2 rows), plus
// its share of the shuffle tree: about 9 + 15 M instructions per 16 bytes.
// An H200 issues ~33e12 lane-instructions/s (132 SMs x 128 x 1.98 GHz), so
// the weight can stream at most at ~22 TB/s at M = 1, ~8 at M = 4, ~4 at
// M = 8 (as fast as HBM: the GEMV should still be near its floor) and ~2 at
// M = 16 (issue-bound, ~1.7x the floor). Measured (chapter 03's small-M
// table), the crossover comes earlier on the wide projections: linear.h's
// LINEAR_GEMV_AUTO_* constants hold it.

#define GEMV_ROWS 2       // output rows per warp
#define GEMV_U 4          // slabs per row that a warp loads before it computes
#define GEMV_MAX_WARPS 8  // warps per block

// 16 bytes of W, loaded once and never again: the read-only path (.nc), and
// no L1 allocation. Not volatile: the compiler may schedule these loads as
// early as it likes, which is the point.
__device__ __forceinline__ uint4 load_weight_stream(const uint4 *p) {
    uint4 v;
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "l"(p));
    return v;
}

// 8 bf16 (one 16-byte vector) to fp32, exactly: a bf16 is the top half of
// an fp32. Element 2i is the low half of word i (little-endian).
__device__ __forceinline__ void bf16x8_to_float(uint4 v, float f[8]) {
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        f[2 * i] = __uint_as_float(w[i] << 16);
        f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    }
}

// MT: the number of tokens, a template parameter so that the accumulators
// are a register array indexed by constants only (a run-time index would put
// them in local memory). blockDim.x = 32 * ks * groups.
// No __launch_bounds__: with (256) ptxas capped M = 6 and 7 at 80 registers
// and spilled; without it, 58 (M = 1) to 130 (M = 16) registers and no
// spills (nvcc 13.0, sm_90: -Xptxas -v). 58 registers leave room for 32
// warps per SM, more than any Qwen3-0.6B shape launches at M = 1.
// One batch of weight loads: GEMV_U slabs from `slab` on, for both rows.
template <int R>
__device__ __forceinline__ void gemv_load_batch(uint4 (&w)[GEMV_U][R], const uint4 *const (&wrow)[R], int slab,
                                                int ks, int kc, int lane) {
#pragma unroll
    for (int u = 0; u < GEMV_U; u++) {
        const int c = (slab + u * ks) * 32 + lane;
#pragma unroll
        for (int r = 0; r < R; r++) w[u][r] = c < kc ? load_weight_stream(wrow[r] + c) : make_uint4(0, 0, 0, 0);
    }
}

// Where x comes from. gemv_x_plain: x [M, K] bf16 itself, 16 bytes per
// chunk through L1. gemv_x_silu_mul: x = SiluAndMul(gate_up), gate_up
// [M, 2K] (gate, then up), computed per chunk as silu_and_mul_cuda's
// version 3 computes it (kernels/activation.cuh: the same expression and one
// bf16 rounding), so the fused layer gives the bits of silu_and_mul_cuda
// followed by this GEMV, without the [M, K] activation's round trip.
struct gemv_x_plain {
    static __device__ __forceinline__ void load(float xf[8], const bf16 *x, int m, int kc, int c) {
        bf16x8_to_float(__ldg(reinterpret_cast<const uint4 *>(x) + (long long)m * kc + c), xf);
    }
};

struct gemv_x_silu_mul {
    static __device__ __forceinline__ void load(float xf[8], const bf16 *gate_up, int m, int kc, int c) {
        const uint4 *row = reinterpret_cast<const uint4 *>(gate_up) + (long long)m * 2 * kc;
        float g[8], u[8];
        bf16x8_to_float(__ldg(row + c), g);
        bf16x8_to_float(__ldg(row + kc + c), u);
#pragma unroll
        for (int j = 0; j < 8; j++) xf[j] = __bfloat162float(__float2bfloat16(silu_mul_dev(g[j], u[j])));
    }
};

template <int MT, typename X>
__global__ void linear_gemv_kernel(bf16 *__restrict__ out, const bf16 *__restrict__ x, const bf16 *__restrict__ W,
                                   const bf16 *__restrict__ bias, int N, int K, int ks) {
    constexpr int R = GEMV_ROWS;
    static_assert(R * MT <= 32, "the final sums need one thread per output among a group's 32 * ks threads");
    __shared__ float partial[GEMV_MAX_WARPS][R * MT];  // each warp's sums, [warp][r * MT + m]

    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int group = warp / ks, slice = warp % ks;
    const int rows_per_block = (int)(blockDim.x / 32) / ks * R;
    const long long row0 = (long long)blockIdx.x * rows_per_block;  // the block's first row
    const int kc = K / 8;                                           // 16-byte chunks per row
    const uint4 *wrow[R];                                           // this warp's rows of W
#pragma unroll
    for (int r = 0; r < R; r++) {
        // Past the last row (odd N, the last block), read row N - 1 again
        // and drop the result: no branch in the loop below.
        long long n = row0 + group * R + r;
        wrow[r] = reinterpret_cast<const uint4 *>(W) + (n < N ? n : N - 1) * kc;
    }

    float acc[R][MT];
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int m = 0; m < MT; m++) acc[r][m] = 0.0f;

    // The first batch of weight loads is issued before pdl_wait(): under
    // programmatic dependent launch (kernels/common.cuh) they stream while
    // the kernel ahead, which writes x, is still running. For every
    // Qwen3-0.6B shape the first batch is the warp's whole share of its rows.
    pdl_launch_dependents();
    uint4 w[GEMV_U][R];
    gemv_load_batch<R>(w, wrow, slice, ks, kc, lane);
    pdl_wait();
    for (int slab = slice; slab * 32 < kc; slab += GEMV_U * ks) {
        // Every load of this batch first (2 rows x GEMV_U chunks per lane,
        // issued above for the first batch)...
        if (slab != slice) gemv_load_batch<R>(w, wrow, slab, ks, kc, lane);
        // ...then the arithmetic, as the loads arrive.
#pragma unroll
        for (int u = 0; u < GEMV_U; u++) {
            const int c = (slab + u * ks) * 32 + lane;
            if (c >= kc) continue;  // past the end of the row (a short last slab)
            float wf[R][8];
#pragma unroll
            for (int r = 0; r < R; r++) bf16x8_to_float(w[u][r], wf[r]);
#pragma unroll
            for (int m = 0; m < MT; m++) {
                float xf[8];
                X::load(xf, x, m, kc, c);
#pragma unroll
                for (int r = 0; r < R; r++)
#pragma unroll
                    for (int j = 0; j < 8; j++) acc[r][m] = fmaf(wf[r][j], xf[j], acc[r][m]);
            }
        }
    }

    // The 32 lanes' sums, then the ks warps' sums of a group, in a fixed order.
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int m = 0; m < MT; m++) acc[r][m] = warp_sum(acc[r][m]);
    if (lane == 0)
#pragma unroll
        for (int r = 0; r < R; r++)
#pragma unroll
            for (int m = 0; m < MT; m++) partial[warp][r * MT + m] = acc[r][m];
    __syncthreads();
    // Thread t writes token m = t / rows_per_block, row j = t % rows_per_block
    // of the block: neighbouring threads store neighbouring bf16 of y's row m.
    const int t = threadIdx.x;
    if (t < rows_per_block * MT) {
        const int m = t / rows_per_block, j = t % rows_per_block;
        const long long n = row0 + j;
        if (n < N) {
            const int g = j / R, r = j % R;
            float s = 0.0f;
            for (int q = 0; q < ks; q++) s += partial[g * ks + q][r * MT + m];
            if (bias) s += __bfloat162float(bias[n]);
            out[(long long)m * N + n] = __float2bfloat16(s);
        }
    }
}

typedef void (*gemv_kernel_fn)(bf16 *, const bf16 *, const bf16 *, const bf16 *, int, int, int);

// linear_gemv_kernel<M, X> for M = 1..LINEAR_GEMV_MAX_M, indexed by M - 1.
#define GEMV_TABLE(X)                                                                                     \
    {linear_gemv_kernel<1, X>,  linear_gemv_kernel<2, X>,  linear_gemv_kernel<3, X>,  linear_gemv_kernel<4, X>,  \
     linear_gemv_kernel<5, X>,  linear_gemv_kernel<6, X>,  linear_gemv_kernel<7, X>,  linear_gemv_kernel<8, X>,  \
     linear_gemv_kernel<9, X>,  linear_gemv_kernel<10, X>, linear_gemv_kernel<11, X>, linear_gemv_kernel<12, X>, \
     linear_gemv_kernel<13, X>, linear_gemv_kernel<14, X>, linear_gemv_kernel<15, X>, linear_gemv_kernel<16, X>}
static const gemv_kernel_fn GEMV_KERNELS[LINEAR_GEMV_MAX_M] = GEMV_TABLE(gemv_x_plain);
static const gemv_kernel_fn GEMV_SILU_KERNELS[LINEAR_GEMV_MAX_M] = GEMV_TABLE(gemv_x_silu_mul);

// Warps that share a row (see above): one batch of GEMV_U slabs per warp
// covers the row, with at most GEMV_MAX_WARPS warps (longer rows loop).
static int gemv_k_split(int K) {
    const int slabs = (K / 8 + 31) / 32;
    int ks = 1;
    while (ks < GEMV_MAX_WARPS && ks * GEMV_U < slabs) ks *= 2;
    return ks;
}

extern "C" int linear_gemv_k_split(int K) { return gemv_k_split(K); }

static long long gemv_blocks(int N, int groups) {
    const long long rows = (long long)groups * GEMV_ROWS;
    return (N + rows - 1) / rows;
}

static unsigned long gemv_misalignment(const void *p) { return (unsigned long)((uintptr_t)p % 16); }

extern "C" int linear_gemv_applies(const bf16_t *d_x, const bf16_t *d_W, int M, int K) {
    return M >= 1 && M <= LINEAR_GEMV_MAX_M && K >= 8 && K % 8 == 0 && d_x && d_W && mv_aligned(d_x, 16) &&
           mv_aligned(d_W, 16);
}

static int launch_gemv(gemv_kernel_fn kernel, bf16_t *d_out, const bf16_t *d_x, const bf16_t *d_W,
                       const bf16_t *d_bias, int N, int K, cudaStream_t stream) {
    const int ks = gemv_k_split(K);
    int groups = GEMV_MAX_WARPS / ks;
    while (groups > 1 && gemv_blocks(N, groups) < 2LL * mv_num_sms()) groups /= 2;
    if (CUDA_TRY(mv_launch(kernel, dim3((unsigned)gemv_blocks(N, groups)), dim3(32 * ks * groups), 0, stream,
                           (bf16 *)d_out, (const bf16 *)d_x, (const bf16 *)d_W, (const bf16 *)d_bias, N, K, ks)))
        return -1;
    return CUDA_TRY(cudaGetLastError());
}

// What both GEMVs (versions 2 and 3) need of K, W and x, refused in this
// order with the value named (after the caller's own check of M).
static int gemv_check_operands(const char *fn, const bf16_t *d_x, const bf16_t *d_W, int K) {
    if (K % 8)
        return mv_error("%s: K = %d is not a multiple of 8: each row of W and x must be whole 16-byte "
                        "vectors (8 bf16)", fn, K);
    if (!mv_aligned(d_W, 16))
        return mv_error("%s: W (%p) is not 16-byte aligned (address %% 16 = %lu)", fn, (const void *)d_W,
                        gemv_misalignment(d_W));
    if (!mv_aligned(d_x, 16))
        return mv_error("%s: x (%p) is not 16-byte aligned (address %% 16 = %lu)", fn, (const void *)d_x,
                        gemv_misalignment(d_x));
    return 0;
}

static int linear_gemv(bf16_t *d_out, const bf16_t *d_x, const bf16_t *d_W, const bf16_t *d_bias, int M, int N,
                       int K, cudaStream_t stream) {
    if (!d_out || !d_x || !d_W) return mv_error("linear_gemv: null pointer");
    if (M > LINEAR_GEMV_MAX_M)
        return mv_error("linear_gemv: M = %d tokens is more than the GEMV takes (%d); version 1 (cuBLAS) takes any M",
                        M, LINEAR_GEMV_MAX_M);
    if (gemv_check_operands("linear_gemv", d_x, d_W, K)) return -1;
    return launch_gemv(GEMV_KERNELS[M - 1], d_out, d_x, d_W, d_bias, N, K, stream);
}

static int linear_silu_mul_v2(bf16_t *d_out, const bf16_t *d_gate_up, const bf16_t *d_W, int M, int N, int K,
                              cudaStream_t stream) {
    if (linear_validate(M, N, K)) return -1;
    if (M == 0) return 0;
    if (!d_out || !d_gate_up || !d_W) return mv_error("linear_silu_mul_cuda: null pointer");
    if (M > LINEAR_GEMV_MAX_M)
        return mv_error("linear_silu_mul_cuda: M = %d tokens is more than the GEMV takes (%d); use "
                        "silu_and_mul_cuda and linear_cuda", M, LINEAR_GEMV_MAX_M);
    if (K % 8)
        return mv_error("linear_silu_mul_cuda: K = %d is not a multiple of 8 (whole 16-byte vectors of gate and up)", K);
    if (!mv_aligned(d_W, 16) || !mv_aligned(d_gate_up, 16))
        return mv_error("linear_silu_mul_cuda: W (%p) and gate_up (%p) must be 16-byte aligned", (const void *)d_W,
                        (const void *)d_gate_up);
    return launch_gemv(GEMV_SILU_KERNELS[M - 1], d_out, d_gate_up, d_W, NULL, N, K, stream);
}

static int launch_gemv_mma(int silu, bf16_t *d_out, const bf16_t *d_x, const bf16_t *d_W, const bf16_t *d_bias,
                           int M, int N, int K, cudaStream_t stream);  // version 3, below

extern "C" int linear_silu_mul_cuda_version(int version, bf16_t *d_out, const bf16_t *d_gate_up, const bf16_t *d_W,
                                            int M, int N, int K, cudaStream_t stream) {
    if (version != LINEAR_GEMV && version != LINEAR_GEMV_MMA)
        return mv_error("linear_silu_mul_cuda_version: version %d (it takes %d, the GEMV, or %d, the tensor-core GEMV)",
                        version, LINEAR_GEMV, LINEAR_GEMV_MMA);
    if (version == LINEAR_GEMV) return linear_silu_mul_v2(d_out, d_gate_up, d_W, M, N, K, stream);
    if (linear_validate(M, N, K)) return -1;
    if (M == 0) return 0;
    if (!d_out || !d_gate_up || !d_W) return mv_error("linear_silu_mul_cuda_version: null pointer");
    if (M > GEMV_MMA_MAX_M)
        return mv_error("linear_silu_mul_cuda_version: M = %d tokens is more than the tensor-core GEMV takes (%d)", M,
                        GEMV_MMA_MAX_M);
    if (K % 8)
        return mv_error("linear_silu_mul_cuda_version: K = %d is not a multiple of 8 (whole 16-byte vectors of gate "
                        "and up)", K);
    if (!mv_aligned(d_W, 16) || !mv_aligned(d_gate_up, 16))
        return mv_error("linear_silu_mul_cuda_version: W (%p) and gate_up (%p) must be 16-byte aligned",
                        (const void *)d_W, (const void *)d_gate_up);
    return launch_gemv_mma(1, d_out, d_gate_up, d_W, NULL, M, N, K, stream);
}

// ---- version 3: the tensor-core GEMV -----------------------------------------------------
//
// The sums of kernels/gemv_mma.cuh: W's rows in tiles of 16, each the A
// operand of mma.sync.m16n8k16, the M <= 32 tokens the B operands, in
// groups of 8 (NG of them, a template instance each). A block owns one tile
// and has one warp per slice of K (S warps, 4 for K = 1,024, 12 for K =
// 3,072); a warp issues the loads of up to 8 chunks of its slice (4 from
// two groups on; for rows g and g + 8 of the tile: 16 loads of 16 bytes a
// lane, 8 KB a warp) before its first MMA, then, per chunk, two MMAs for
// each group, all on the same 16 bytes of W a lane. The warps' D tiles
// meet in shared memory, and thread (row, token) adds its S slices in
// order, adds the bias and rounds once. A group is the same MMAs whichever
// group it is, so a token's bits do not depend on M.
//
// Why it is faster than version 2 where the GEMV is not waiting for HBM
// (the decode megakernel reads W from shared memory): per 16 bytes of a
// row version 2 issues ~15 instructions a lane at M = 1 (a load, unpacking
// W and x to fp32, 8 FMAs per row, a share of the shuffle tree), version 3
// one load and one MMA per 16 bytes of two rows, with no unpacking and no
// shuffles, at any M up to 8 (and 2 NG MMAs for NG groups). From HBM both
// are bound by the bytes until version 2's issue runs out (M of 8 and up).

// 16 bytes of an activation that the kernel ahead wrote: a volatile asm,
// so that the compiler keeps it after pdl_wait() (also a volatile asm). An
// __ldg may be hoisted above the wait, since the compiler takes what it
// reads to be constant for the whole kernel; the first version of this
// kernel did so, and under PDL read x before it was written (chapter 03's
// fused = unfused check with PDL caught it).
__device__ __forceinline__ uint4 load_activation(const bf16 *p) {
    uint4 v;
    asm volatile("ld.global.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

// x's 16 bytes for the B operand: token m's values k0 .. k0 + 7 as bf16.
struct gemv_mma_x_plain {
    static constexpr bool converts = false;
    static __device__ __forceinline__ uint4 load(const bf16 *x, int m, int K, int k0) {
        return load_activation(x + (long long)m * K + k0);
    }
};
// SiluAndMul(gate_up) rounded to bf16 as gemv_x_silu_mul rounds it.
struct gemv_mma_x_silu_mul {
    static constexpr bool converts = true;
    static __device__ __forceinline__ uint4 load(const bf16 *gate_up, int m, int K, int k0) {
        const bf16 *row = gate_up + (long long)m * 2 * K;
        float g[8], u[8];
        bf16x8_to_float(load_activation(row + k0), g);
        bf16x8_to_float(load_activation(row + K + k0), u);
        return silu_mul_pack8(g, u);
    }
};

// Chunks a warp loads before it computes: 8 for one group of tokens, 4 from
// two groups on, where each chunk also holds NG 16-byte pieces of x (at NG =
// 4, 4 chunks are 32 registers of W and 64 of x a lane; 8 would spill), and
// 3 for SiluAndMul's input at 4 groups (its conversions spill at 4).
template <typename X, int NG>
struct gemv_mma_batch {
    static constexpr int value = NG == 1 ? 8 : NG == 4 && X::converts ? 3 : 4;
};

// NG groups of 8 tokens (GEMV_MMA_COLS): M in (8 (NG - 1), 8 NG].
template <typename X, int NG>
__global__ void __launch_bounds__(32 * GEMV_MMA_MAX_SLICES)
linear_gemv_mma_kernel(bf16 *__restrict__ out, const bf16 *__restrict__ x, const bf16 *__restrict__ W,
                       const bf16 *__restrict__ bias, int M, int N, int K, int S, int per) {
    constexpr int B = gemv_mma_batch<X, NG>::value, MT = GEMV_MMA_COLS * NG;
    __shared__ float part[GEMV_MMA_MAX_SLICES][GEMV_MMA_ROWS][MT];
    const int lane = threadIdx.x % 32, q = threadIdx.x / 32, g = lane / 4, t = lane % 4;
    const long long row0 = (long long)blockIdx.x * GEMV_MMA_ROWS;
    const long long r_lo = row0 + g, r_hi = row0 + g + 8;
    const uint4 *w_lo = reinterpret_cast<const uint4 *>(W + (r_lo < N ? r_lo : 0) * K);
    const uint4 *w_hi = reinterpret_cast<const uint4 *>(W + (r_hi < N ? r_hi : 0) * K);
    const int C = (K + 31) / 32, c0 = q * per, c1 = min(C, c0 + per);
    float d[NG][4];
#pragma unroll
    for (int j = 0; j < NG; j++) d[j][0] = d[j][1] = d[j][2] = d[j][3] = 0.0f;
    pdl_launch_dependents();
    bool waited = false;
    for (int cb = c0; cb < c1; cb += B) {
        uint4 lo[B], hi[B], xv[B][NG];
#pragma unroll
        for (int u = 0; u < B; u++) {
            const int c = cb + u, k0 = c * 32 + 8 * t;
            const bool ok = c < c1 && k0 < K;
            lo[u] = ok && r_lo < N ? load_weight_stream(w_lo + k0 / 8) : make_uint4(0, 0, 0, 0);
            hi[u] = ok && r_hi < N ? load_weight_stream(w_hi + k0 / 8) : make_uint4(0, 0, 0, 0);
        }
        // The first batch of W is in flight before the wait: x comes from the kernel ahead (PDL).
        if (!waited) pdl_wait(), waited = true;
#pragma unroll
        for (int u = 0; u < B; u++) {
            const int c = cb + u, k0 = c * 32 + 8 * t;
#pragma unroll
            for (int j = 0; j < NG; j++) {
                const int m = GEMV_MMA_COLS * j + g;
                xv[u][j] = c < c1 && k0 < K && m < M ? X::load(x, m, K, k0) : make_uint4(0, 0, 0, 0);
            }
        }
#pragma unroll
        for (int u = 0; u < B; u++)
            if (cb + u < c1)
#pragma unroll
                for (int j = 0; j < NG; j++) gemv_mma_chunk(d[j], lo[u], hi[u], xv[u][j]);
    }
    if (!waited) pdl_wait();
    // D of group j: lane (g, t) holds rows g, g + 8 of tokens 8 j + 2t, 8 j + 2t + 1.
#pragma unroll
    for (int j = 0; j < NG; j++) {
        const int m = GEMV_MMA_COLS * j + 2 * t;
        part[q][g][m] = d[j][0];
        part[q][g][m + 1] = d[j][1];
        part[q][g + 8][m] = d[j][2];
        part[q][g + 8][m + 1] = d[j][3];
    }
    __syncthreads();
    // 16 M outputs, S * 32 threads (as few as 32 when K <= 256).
    for (int o = threadIdx.x; o < GEMV_MMA_ROWS * M; o += blockDim.x) {
        const int r = o % GEMV_MMA_ROWS, m = o / GEMV_MMA_ROWS;
        const long long n = row0 + r;
        if (n < N) {
            float s = 0.0f;
            for (int k = 0; k < S; k++) s += part[k][r][m];
            if (bias) s += __bfloat162float(bias[n]);
            out[(long long)m * N + n] = __float2bfloat16(s);
        }
    }
}

extern "C" int linear_gemv_forced(void) {
    static int v = -1;
    if (v < 0) {
        const char *e = getenv("MV_LINEAR_GEMV");
        v = e && !strcmp(e, "2") ? LINEAR_GEMV : e && !strcmp(e, "3") ? LINEAR_GEMV_MMA : 0;
    }
    return v;
}

// A count of tokens from the environment: N (0 to max), -1 unset, -2 anything else.
static int env_token_count(const char *name, int max) {
    const char *e = getenv(name);
    char *end = NULL;
    const long n = e ? strtol(e, &end, 10) : -1;
    return !e ? -1 : (end == e || *end || n < 0 || n > max) ? -2 : (int)n;
}

extern "C" int linear_gemv_max_m_override(void) {
    static int v = -3;
    if (v == -3) v = env_token_count("MV_LINEAR_GEMV_MAX_M", LINEAR_GEMV_MMA_MAX_M);
    return v;
}

extern "C" int linear_gemv_mma_applies(const bf16_t *d_x, const bf16_t *d_W, int M, int K) {
    // Version 2's conditions on K and the pointers (asked at M = 1), and version 3's own M.
    return M >= 1 && M <= GEMV_MMA_MAX_M && linear_gemv_applies(d_x, d_W, 1, K);
}

// The kernel for `silu` and NG = ceil(M / 8) groups of tokens.
template <int NG>
static int launch_gemv_mma_groups(int silu, dim3 grid, dim3 block, bf16_t *d_out, const bf16_t *d_x,
                                  const bf16_t *d_W, const bf16_t *d_bias, int M, int N, int K, int S, int per,
                                  cudaStream_t stream) {
    return CUDA_TRY(silu ? mv_launch(linear_gemv_mma_kernel<gemv_mma_x_silu_mul, NG>, grid, block, 0, stream,
                                     (bf16 *)d_out, (const bf16 *)d_x, (const bf16 *)d_W, (const bf16 *)NULL, M, N,
                                     K, S, per)
                         : mv_launch(linear_gemv_mma_kernel<gemv_mma_x_plain, NG>, grid, block, 0, stream,
                                     (bf16 *)d_out, (const bf16 *)d_x, (const bf16 *)d_W, (const bf16 *)d_bias, M, N,
                                     K, S, per));
}

static int launch_gemv_mma(int silu, bf16_t *d_out, const bf16_t *d_x, const bf16_t *d_W, const bf16_t *d_bias,
                           int M, int N, int K, cudaStream_t stream) {
    int S, per;
    gemv_mma_split(K, &S, &per);
    const dim3 grid((unsigned)((N + GEMV_MMA_ROWS - 1) / GEMV_MMA_ROWS)), block((unsigned)(32 * S));
    const int groups = (M + GEMV_MMA_COLS - 1) / GEMV_MMA_COLS;
    static_assert(GEMV_MMA_MAX_GROUPS == 4, "one instantiation per number of groups");
    if ((groups == 1 ? launch_gemv_mma_groups<1>
         : groups == 2 ? launch_gemv_mma_groups<2>
         : groups == 3 ? launch_gemv_mma_groups<3>
                       : launch_gemv_mma_groups<4>)(silu, grid, block, d_out, d_x, d_W, d_bias, M, N, K, S, per,
                                                    stream))
        return -1;
    return CUDA_TRY(cudaGetLastError());
}

static int linear_gemv_mma(bf16_t *d_out, const bf16_t *d_x, const bf16_t *d_W, const bf16_t *d_bias, int M, int N,
                           int K, cudaStream_t stream) {
    if (!d_out || !d_x || !d_W) return mv_error("linear_gemv_mma: null pointer");
    if (M > GEMV_MMA_MAX_M)
        return mv_error("linear_gemv_mma: M = %d tokens is more than the tensor-core GEMV takes (%d: %d groups of "
                        "the MMA's %d columns); version 1 (cuBLAS) takes any M",
                        M, GEMV_MMA_MAX_M, GEMV_MMA_MAX_GROUPS, GEMV_MMA_COLS);
    if (gemv_check_operands("linear_gemv_mma", d_x, d_W, K)) return -1;
    return launch_gemv_mma(0, d_out, d_x, d_W, d_bias, M, N, K, stream);
}

// ---- version 4: the tiled tensor-core GEMM for 9 to a few hundred tokens ----------------
//
// Where the GEMV runs out (its per-token work grows with M) and before
// cuBLAS's tiles are full (from a few hundred tokens), a projection is
// still mostly its weight's bytes, yet cuBLAS takes 6 to 8 us for it in a
// decode graph: its kernels do not use programmatic dependent launch, so
// each one starts only after the kernel ahead has finished and its own
// prologue and first loads are all on the critical path (chapter 09: 3.2 to
// 3.8 us a GEMM at 4 to 32 rows when that wait was skipped). This GEMM
// issues its weight's first loads before pdl_wait(), as the GEMV does.
//
// Tiles. A block owns 64 rows of W (LT_BN, 16 a warp, 4 warps) and up to 64
// tokens (BM = 16 NP, NP a template parameter: 1 to 4 pairs of the MMA's 8
// columns), and a slice of K. K is cut into chunks of 64 values (LT_BK, 128
// bytes a row); a chunk of W (8 KB) and of x (BM rows) is copied into shared
// memory by cp.async (16 bytes a thread, 4 stages in a ring; rows swizzled,
// 16-byte piece c of row r at c ^ (r % 8), so ldmatrix reads them without
// bank conflicts). Per 16 values of K a warp takes its A fragment (16 rows of
// W) and NP B fragments (16 tokens each) by ldmatrix.x4 and issues 2 NP
// mma.sync.m16n8k16, bf16 in, fp32 sums in registers. Each x chunk is read
// from L2 once per block, so the x traffic is 64 times smaller than W's rows
// make it in a GEMV of 16-row tiles (version 3's weakness past 8 tokens).
//
// Split K. With N = 1,024 (o_proj, down_proj) 64-row tiles make only 16
// blocks, too few to keep HBM busy, so K is split over S blocks (S from N
// and K only, lt_splits: the smallest power of two, at most 16 and at most
// the number of chunks, that makes at least 128 blocks of one token tile,
// then as few as hold the same ceil(chunks / S) chunks each).
// Each block writes its fp32 sums to a workspace, and the last block of a
// tile to arrive (an atomic counter per tile; it resets the counter) adds the
// S slices in order, adds the bias and rounds once. S = 1 stores directly.
//
// The bits. Each output is ((D_0 + D_1) + ...) + bias rounded once, D_s the
// sum of split s's chunks in order, each chunk 4 MMAs in k order: it depends
// on N and K (through S) and on nothing else: not on M, the token tile, or
// which block finished last. So a token's output does not depend on the
// batch it is in (chapter 03 checks it).
//
// The workspace: a counter per tile and S * M * N floats, per cuBLAS handle
// (linear_set_workspace), so that two streams with their own handles never
// share one.

#define LT_BN 64          // rows of W a block owns
#define LT_BK 64          // values of K a chunk holds (128 bytes a row)
#define LT_MAX_BM 64      // tokens a block owns
#define LT_STAGES 4       // chunks in flight in the ring
#define LT_THREADS 128    // 4 warps, 16 rows of W each
#define LT_MIN_BLOCKS 128  // lt_splits' target: blocks of one token tile
#define LT_MAX_SPLITS 16
#define LT_COUNTERS 16384  // tile counters at the start of a workspace
#define LT_COUNTER_BYTES (LT_COUNTERS * sizeof(unsigned))

static int lt_splits(int N, int K) {
    const int tiles = (N + LT_BN - 1) / LT_BN, chunks = (K + LT_BK - 1) / LT_BK;
    int s = 1;
    while (s < LT_MAX_SPLITS && s < chunks && tiles * s < LT_MIN_BLOCKS) s *= 2;
    // Every split gets ceil(chunks / s) chunks, so the last splits may be
    // empty: s then counts only those with chunks.
    const int per = (chunks + s - 1) / s;
    return (chunks + per - 1) / per;
}

// Token tiles of BM = 16 * min(4, ceil(M / 16)) tokens.
static int lt_pairs(int M) { return M >= LT_MAX_BM ? LT_MAX_BM / 16 : (M + 15) / 16; }

// One chunk of `rows` rows (row0 on) of a [*, K] matrix (rows ld apart)
// into a swizzled stage at dst: rows x 8 pieces of 16 bytes, zeros past
// row_end or K.
__device__ __forceinline__ void lt_load_chunk(uint32_t dst, const bf16 *__restrict__ src, int rows, int row0,
                                              int row_end, int K, long long ld, int k0) {
    for (int p = threadIdx.x; p < rows * 8; p += LT_THREADS) {
        const int r = p / 8, c = p % 8, row = row0 + r, k = k0 + 8 * c;
        const bool ok = row < row_end && k < K;
        cp_async16(dst + swz<8>(r, c), ok ? src + row * ld + k : src, ok ? 16 : 0);
    }
}

// x's chunk for the MMAs: a chunk of x itself, or (SILU) SiluAndMul of the
// gate and up chunks of gate_up [M, 2K] (gate's in the x slot, up's after
// it), converted in place once both have landed, to the bits
// silu_and_mul_cuda(SILU_AND_MUL_FAST) stores (silu_mul_pack8).
template <bool SILU>
__device__ __forceinline__ void lt_load_x(uint32_t sx, const bf16 *__restrict__ x, int BM, int m0, int M, int K,
                                          int k0) {
    if (SILU) {
        lt_load_chunk(sx, x, BM, m0, M, K, 2LL * K, k0);
        lt_load_chunk(sx + BM * LT_BK * 2, x + K, BM, m0, M, K, 2LL * K, k0);
    } else {
        lt_load_chunk(sx, x, BM, m0, M, K, K, k0);
    }
}

__device__ __forceinline__ void lt_silu_mul_in_place(unsigned char *sx, int BM) {
    for (int p = threadIdx.x; p < BM * 8; p += LT_THREADS) {
        const uint32_t off = swz<8>(p / 8, p % 8);
        uint4 *gp = reinterpret_cast<uint4 *>(sx + off);
        const uint4 u = *reinterpret_cast<const uint4 *>(sx + BM * LT_BK * 2 + off);
        float gf[8], uf[8];
        bf16x8_to_float(*gp, gf);
        bf16x8_to_float(u, uf);
        *gp = silu_mul_pack8(gf, uf);
    }
}

// Split s's sums of quad q of a tile (token m0 + 4q / 64, rows n0 + 4q % 64
// .. + 3), from L2 (.cg: other SMs wrote them); zeros past M or N.
__device__ __forceinline__ float4 lt_load_quad(const float *ws, int s, int M, int N, int m0, int n0, int q) {
    const int m = m0 + 4 * q / LT_BN, n = n0 + 4 * q % LT_BN;
    float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (m >= M) return v;
    const float *p = ws + ((long long)s * M + m) * N + n;
    if (N % 4 == 0 && n + 3 < N) return __ldcg(reinterpret_cast<const float4 *>(p));
    if (n < N) v.x = __ldcg(p);
    if (n + 1 < N) v.y = __ldcg(p + 1);
    if (n + 2 < N) v.z = __ldcg(p + 2);
    if (n + 3 < N) v.w = __ldcg(p + 3);
    return v;
}

// SILU: x is gate_up [M, 2K], and the product reads SiluAndMul(gate_up).
template <int NP, bool SILU>
__global__ void __launch_bounds__(LT_THREADS)
linear_tile_kernel(bf16 *__restrict__ out, const bf16 *__restrict__ x, const bf16 *__restrict__ W,
                   const bf16 *__restrict__ bias, float *__restrict__ ws, unsigned *__restrict__ counters, int M,
                   int N, int K, int S, int per) {
    constexpr int BM = 16 * NP;
    constexpr int W_BYTES = LT_BN * LT_BK * 2, X_BYTES = BM * LT_BK * 2, STAGE = W_BYTES + (SILU ? 2 : 1) * X_BYTES;
    extern __shared__ __align__(128) unsigned char lt_smem[];
    __shared__ unsigned last;
    const uint32_t base = smem_u32(lt_smem);
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, t = lane % 4;
    const int n0 = blockIdx.x * LT_BN, m0 = blockIdx.y * BM, split = blockIdx.z;
    const int C = (K + LT_BK - 1) / LT_BK, c0 = split * per, nc = min(C, c0 + per) - c0;

    pdl_launch_dependents();
    // The weight's first chunks depend on no kernel: in flight before the wait.
#pragma unroll
    for (int i = 0; i < LT_STAGES - 1; i++)
        if (i < nc) lt_load_chunk(base + i * STAGE, W, LT_BN, n0, N, K, K, (c0 + i) * LT_BK);
    pdl_wait();
#pragma unroll
    for (int i = 0; i < LT_STAGES - 1; i++) {
        if (i < nc) lt_load_x<SILU>(base + i * STAGE + W_BYTES, x, BM, m0, M, K, (c0 + i) * LT_BK);
        cp_async_commit();  // group i: chunk i's x (and, in group 0, the W above)
    }

    float d[2 * NP][4];
#pragma unroll
    for (int j = 0; j < 2 * NP; j++) d[j][0] = d[j][1] = d[j][2] = d[j][3] = 0.0f;
    for (int i = 0; i < nc; i++) {
        cp_async_wait<LT_STAGES - 2>();  // chunk i has landed (this thread's copies)
        __syncthreads();                 // everyone's, and chunk i - 1's stage is free
        const int nx = i + LT_STAGES - 1;
        if (nx < nc) {
            const uint32_t st = base + (nx % LT_STAGES) * STAGE;
            lt_load_chunk(st, W, LT_BN, n0, N, K, K, (c0 + nx) * LT_BK);
            lt_load_x<SILU>(st + W_BYTES, x, BM, m0, M, K, (c0 + nx) * LT_BK);
        }
        cp_async_commit();
        if (SILU) {
            lt_silu_mul_in_place(lt_smem + (i % LT_STAGES) * STAGE + W_BYTES, BM);
            __syncthreads();
        }
        const uint32_t sw = base + (i % LT_STAGES) * STAGE, sx = sw + W_BYTES;
#pragma unroll
        for (int kk = 0; kk < LT_BK / 16; kk++) {
            // A: rows 16 warp + (lane % 16), pieces 2 kk + lane / 16.
            uint32_t a[4];
            ldmatrix_x4(a, sw + swz<8>(16 * warp + lane % 16, 2 * kk + lane / 16));
#pragma unroll
            for (int p = 0; p < NP; p++) {
                // B: tokens 16 p + lane % 8 (+ 8 for lanes 16..31), pieces 2 kk + (lane / 8) % 2:
                // b0, b1 of group 2p, then of group 2p + 1.
                uint32_t b[4];
                ldmatrix_x4(b, sx + swz<8>(16 * p + lane % 8 + 8 * (lane / 16), 2 * kk + (lane / 8) % 2));
                mma_16816(d[2 * p], a[0], a[1], a[2], a[3], b[0], b[1]);
                mma_16816(d[2 * p + 1], a[0], a[1], a[2], a[3], b[2], b[3]);
            }
        }
    }
    cp_async_wait<0>();

    // D of group j: lane (g, t) holds rows g, g + 8 of tokens 8 j + 2t, 8 j + 2t + 1.
    const int r_lo = n0 + 16 * warp + g, r_hi = r_lo + 8;
    if (S == 1) {
#pragma unroll
        for (int j = 0; j < 2 * NP; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int n = e < 2 ? r_lo : r_hi, m = m0 + 8 * j + 2 * t + (e & 1);
                if (n < N && m < M)
                    out[(long long)m * N + n] = __float2bfloat16(d[j][e] + (bias ? __bfloat162float(bias[n]) : 0.0f));
            }
        return;
    }
#pragma unroll
    for (int j = 0; j < 2 * NP; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int n = e < 2 ? r_lo : r_hi, m = m0 + 8 * j + 2 * t + (e & 1);
            if (n < N && m < M) ws[((long long)split * M + m) * N + n] = d[j][e];
        }
    __threadfence();  // this block's sums are visible GPU-wide before it counts itself in
    __syncthreads();
    unsigned *counter = counters + blockIdx.y * gridDim.x + blockIdx.x;
    if (threadIdx.x == 0) last = atomicAdd(counter, 1u) == (unsigned)(S - 1);
    __syncthreads();
    if (!last) return;
    __threadfence();  // the other blocks' sums, seen after their counts
    // The tile's BM x 64 sums: thread i takes 4 neighbouring rows of W of
    // one token in each of 2 NP steps (16 threads cover a token's 64 rows:
    // coalesced), and reads all 2 NP quads of a slice before it adds any, so
    // that the slices' trips to L2 overlap instead of following one another.
    constexpr int QUADS = BM * LT_BN / 4 / LT_THREADS;
    float4 acc[QUADS];
#pragma unroll
    for (int i = 0; i < QUADS; i++) acc[i] = lt_load_quad(ws, 0, M, N, m0, n0, threadIdx.x + i * LT_THREADS);
#pragma unroll 1
    for (int s = 1; s < S; s++) {
        float4 v[QUADS];
#pragma unroll
        for (int i = 0; i < QUADS; i++) v[i] = lt_load_quad(ws, s, M, N, m0, n0, threadIdx.x + i * LT_THREADS);
#pragma unroll
        for (int i = 0; i < QUADS; i++) acc[i].x += v[i].x, acc[i].y += v[i].y, acc[i].z += v[i].z, acc[i].w += v[i].w;
    }
#pragma unroll
    for (int i = 0; i < QUADS; i++) {
        const int q = threadIdx.x + i * LT_THREADS, m = m0 + 4 * q / LT_BN, n = n0 + 4 * q % LT_BN;
        const float a[4] = {acc[i].x, acc[i].y, acc[i].z, acc[i].w};
#pragma unroll
        for (int e = 0; e < 4; e++)
            if (m < M && n + e < N)
                out[(long long)m * N + n + e] = __float2bfloat16(a[e] + (bias ? __bfloat162float(bias[n + e]) : 0.0f));
    }
    if (threadIdx.x == 0) *counter = 0;  // ready for the next launch (stream order)
}

// The workspace registered for each cuBLAS handle (linear_set_workspace).
#define LT_MAX_HANDLES 16
static struct {
    cublasHandle_t handle;
    void *ws;
    size_t bytes;
} lt_workspaces[LT_MAX_HANDLES];
static pthread_mutex_t lt_lock = PTHREAD_MUTEX_INITIALIZER;

static int lt_lookup(cublasHandle_t handle, void **ws, size_t *bytes) {
    int found = 0;
    pthread_mutex_lock(&lt_lock);
    for (int i = 0; i < LT_MAX_HANDLES && !found; i++)
        if (handle && lt_workspaces[i].handle == handle) {
            *ws = lt_workspaces[i].ws, *bytes = lt_workspaces[i].bytes;
            found = 1;
        }
    pthread_mutex_unlock(&lt_lock);
    return found;
}

extern "C" size_t linear_tile_workspace_bytes(int M, int N, int K) {
    if (M < 1 || N < 1 || K < 1) return LT_COUNTER_BYTES;
    const int S = lt_splits(N, K);
    return LT_COUNTER_BYTES + (S > 1 ? (size_t)S * M * N * sizeof(float) : 0);
}

extern "C" int linear_set_workspace(cublasHandle_t handle, void *d_ws, size_t bytes) {
    if (!handle) return mv_error("linear_set_workspace: null cuBLAS handle");
    if (d_ws && bytes < LT_COUNTER_BYTES)
        return mv_error("linear_set_workspace: %zu bytes is less than the %zu of version 4's tile counters", bytes,
                        (size_t)LT_COUNTER_BYTES);
    if (d_ws && !mv_aligned(d_ws, 16)) return mv_error("linear_set_workspace: the workspace is not 16-byte aligned");
    // The counters start at zero; each launch leaves them so.
    if (d_ws && CUDA_TRY(cudaMemset(d_ws, 0, LT_COUNTER_BYTES))) return -1;
    int rc = 0, done = 0;
    pthread_mutex_lock(&lt_lock);
    for (int i = 0; i < LT_MAX_HANDLES && !done; i++)
        if (lt_workspaces[i].handle == handle) {
            if (d_ws) lt_workspaces[i].ws = d_ws, lt_workspaces[i].bytes = bytes;
            else lt_workspaces[i].handle = NULL, lt_workspaces[i].ws = NULL, lt_workspaces[i].bytes = 0;
            done = 1;
        }
    for (int i = 0; i < LT_MAX_HANDLES && !done && d_ws; i++)
        if (!lt_workspaces[i].handle) {
            lt_workspaces[i].handle = handle, lt_workspaces[i].ws = d_ws, lt_workspaces[i].bytes = bytes;
            done = 1;
        }
    if (!done && d_ws) rc = -1;
    pthread_mutex_unlock(&lt_lock);
    if (rc) return mv_error("linear_set_workspace: more than %d handles have a workspace", LT_MAX_HANDLES);
    return 0;
}

extern "C" int linear_tile_applies(cublasHandle_t handle, const bf16_t *d_x, const bf16_t *d_W, int M, int N,
                                   int K) {
    void *ws = NULL;
    size_t bytes = 0;
    if (M < 1 || N < 1 || !linear_gemv_applies(d_x, d_W, 1, K)) return 0;
    if (lt_splits(N, K) == 1) return 1;  // no workspace needed
    const long long tiles = (long long)((N + LT_BN - 1) / LT_BN) * ((M + 16 * lt_pairs(M) - 1) / (16 * lt_pairs(M)));
    return lt_lookup(handle, &ws, &bytes) && tiles <= LT_COUNTERS && linear_tile_workspace_bytes(M, N, K) <= bytes;
}

template <int NP, bool SILU>
static cudaError_t launch_tile_pairs(dim3 grid, bf16_t *d_out, const bf16_t *d_x, const bf16_t *d_W,
                                     const bf16_t *d_bias, float *ws, unsigned *counters, int M, int N, int K, int S,
                                     int per, cudaStream_t stream) {
    const size_t smem = (size_t)LT_STAGES * (LT_BN + (SILU ? 2 : 1) * 16 * NP) * LT_BK * 2;
    // Past 48 KB of dynamic shared memory a kernel must opt in, once per device.
    static unsigned char attr_set[64];
    int dev = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e != cudaSuccess) return e;
    if (dev < 0 || dev >= 64 || !attr_set[dev]) {
        e = cudaFuncSetAttribute(linear_tile_kernel<NP, SILU>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 (int)smem);
        if (e != cudaSuccess) return e;
        if (dev >= 0 && dev < 64) attr_set[dev] = 1;
    }
    return mv_launch(linear_tile_kernel<NP, SILU>, grid, dim3(LT_THREADS), smem, stream, (bf16 *)d_out, (const bf16 *)d_x,
                     (const bf16 *)d_W, (const bf16 *)d_bias, ws, counters, M, N, K, S, per);
}

// silu: d_x is gate_up [M, 2K], and the product is SiluAndMul(gate_up) W^T.
static int linear_tile(cublasHandle_t handle, int silu, bf16_t *d_out, const bf16_t *d_x, const bf16_t *d_W,
                       const bf16_t *d_bias, int M, int N, int K, cudaStream_t stream) {
    if (!d_out || !d_x || !d_W) return mv_error("linear_tile: null pointer");
    if (gemv_check_operands("linear_tile", d_x, d_W, K)) return -1;
    const int S = lt_splits(N, K), NP = lt_pairs(M), C = (K + LT_BK - 1) / LT_BK;
    const int per = (C + S - 1) / S, BM = 16 * NP;
    const dim3 grid((unsigned)((N + LT_BN - 1) / LT_BN), (unsigned)((M + BM - 1) / BM), (unsigned)S);
    void *ws = NULL;
    size_t bytes = 0;
    if (S > 1) {
        if (!lt_lookup(handle, &ws, &bytes))
            return mv_error("linear_tile: N = %d, K = %d splits K over %d blocks, which needs a workspace, and this "
                            "cuBLAS handle has none (linear_set_workspace)", N, K, S);
        const size_t need = linear_tile_workspace_bytes(M, N, K);
        if ((size_t)grid.x * grid.y > LT_COUNTERS || need > bytes)
            return mv_error("linear_tile: M = %d, N = %d, K = %d needs %zu bytes of workspace (%u tiles); the handle's "
                            "has %zu", M, N, K, need, grid.x * grid.y, bytes);
    }
    unsigned *counters = (unsigned *)ws;
    float *partial = ws ? (float *)((char *)ws + LT_COUNTER_BYTES) : NULL;
    static_assert(LT_MAX_BM == 64, "one instantiation per pair count");
    const cudaError_t e =
        silu ? (NP == 1 ? launch_tile_pairs<1, true>
                : NP == 2 ? launch_tile_pairs<2, true>
                : NP == 3 ? launch_tile_pairs<3, true>
                          : launch_tile_pairs<4, true>)(grid, d_out, d_x, d_W, NULL, partial, counters, M, N, K, S,
                                                        per, stream)
             : (NP == 1 ? launch_tile_pairs<1, false>
                : NP == 2 ? launch_tile_pairs<2, false>
                : NP == 3 ? launch_tile_pairs<3, false>
                          : launch_tile_pairs<4, false>)(grid, d_out, d_x, d_W, d_bias, partial, counters, M, N, K, S,
                                                         per, stream);
    if (CUDA_TRY(e)) return -1;
    return CUDA_TRY(cudaGetLastError());
}

extern "C" int linear_tile_max_m_override(void) {
    static int v = -3;
    if (v == -3) v = env_token_count("MV_LINEAR_TILE_MAX_M", LINEAR_TILE_MAX_AUTO_LIMIT);
    return v;
}

extern "C" int linear_tile_auto_max_m(void) {
    const int over = linear_tile_max_m_override();
    return over >= 0 ? over : LINEAR_TILE_AUTO_MAX_M;
}

// ---- the dispatch ------------------------------------------------------------------------

extern "C" const char *linear_version_name(int version) {
    // LINEAR_AUTO is linear_cuda's choice, not a version: it has no row in the table.
    return version == LINEAR_AUTO ? "auto" : kernel_version_name(LINEAR_VERSION_TABLE, version);  // kernels/versions.h
}

extern "C" int linear_auto_version(cublasHandle_t handle, const bf16_t *d_x, const bf16_t *d_W, int M, int N,
                                   int K) {
    const int over = linear_gemv_max_m_override();
    const int max_m = over >= 0 ? over : LINEAR_GEMV_AUTO_MAX_M;
    if (M > max_m)
        return M <= linear_tile_auto_max_m() && linear_tile_applies(handle, d_x, d_W, M, N, K) ? LINEAR_TILE
                                                                                            : LINEAR_CUBLAS;
    const int v2 = linear_gemv_applies(d_x, d_W, M, K), v3 = linear_gemv_mma_applies(d_x, d_W, M, K);
    const int forced = linear_gemv_forced();
    // MV_LINEAR_GEMV=2 keeps version 2 wherever it applies (M <= 16), cuBLAS past it.
    if (forced == LINEAR_GEMV) return v2 ? LINEAR_GEMV : LINEAR_CUBLAS;
    if (v3 && (forced == LINEAR_GEMV_MMA || M >= LINEAR_GEMV_MMA_AUTO_MIN_M)) return LINEAR_GEMV_MMA;
    return v2 ? LINEAR_GEMV : LINEAR_CUBLAS;
}

// The down projection with SiluAndMul folded in, by the GEMV linear_cuda
// would run on the activations (where it would run cuBLAS: version 2 up to
// 16 tokens, version 3 past them).
extern "C" int linear_silu_mul_cuda(bf16_t *d_out, const bf16_t *d_gate_up, const bf16_t *d_W, int M, int N, int K,
                                    cudaStream_t stream) {
    const int a = linear_auto_version(NULL, d_gate_up, d_W, M, N, K);
    const int v = a == LINEAR_GEMV || a == LINEAR_GEMV_MMA ? a : M > LINEAR_GEMV_MAX_M ? LINEAR_GEMV_MMA : LINEAR_GEMV;
    return linear_silu_mul_cuda_version(v, d_out, d_gate_up, d_W, M, N, K, stream);
}

extern "C" int linear_silu_mul_tile_cuda(cublasHandle_t handle, bf16_t *d_out, const bf16_t *d_gate_up,
                                         const bf16_t *d_W, int M, int N, int K, cudaStream_t stream) {
    if (linear_validate(M, N, K)) return -1;
    if (M == 0) return 0;
    return linear_tile(handle, 1, d_out, d_gate_up, d_W, NULL, M, N, K, stream);
}

extern "C" int linear_cuda_version(int version, cublasHandle_t handle, bf16_t *d_out, const bf16_t *d_x,
                                   const bf16_t *d_W, const bf16_t *d_bias, int M, int N, int K,
                                   cudaStream_t stream) {
    if (version < LINEAR_AUTO || version > LINEAR_NUM_VERSIONS)
        return mv_error("linear_cuda_version: unknown version %d (0 = auto, 1..%d)", version, LINEAR_NUM_VERSIONS);
    if (linear_validate(M, N, K)) return -1;
    if (M == 0) return 0;
    if (version == LINEAR_AUTO) {
        // The caller must be ready for either version, so auto wants the handle too.
        if (!handle) return mv_error("linear_cuda: null cuBLAS handle");
        version = linear_auto_version(handle, d_x, d_W, M, N, K);
    }
    if (version == LINEAR_TILE) return linear_tile(handle, 0, d_out, d_x, d_W, d_bias, M, N, K, stream);
    if (version == LINEAR_GEMV) return linear_gemv(d_out, d_x, d_W, d_bias, M, N, K, stream);
    if (version == LINEAR_GEMV_MMA) return linear_gemv_mma(d_out, d_x, d_W, d_bias, M, N, K, stream);
    return linear_cublas(handle, d_out, d_x, d_W, d_bias, M, N, K, stream);
}

extern "C" int linear_cuda(cublasHandle_t handle, bf16_t *d_out, const bf16_t *d_x, const bf16_t *d_W,
                           const bf16_t *d_bias, int M, int N, int K, cudaStream_t stream) {
    return linear_cuda_version(LINEAR_AUTO, handle, d_out, d_x, d_W, d_bias, M, N, K, stream);
}

extern "C" int add_bias_cuda(bf16_t *d_out, const bf16_t *d_bias, int M, int N, cudaStream_t stream) {
    if (M < 0 || N < 1) return mv_error("add_bias_cuda: bad shape M=%d N=%d", M, N);
    if (M == 0) return 0;
    long long total = (long long)M * N;
    add_bias_kernel<<<grid_for(total), 256, 0, stream>>>((bf16 *)d_out, (const bf16 *)d_bias, total, N);
    return CUDA_TRY(cudaGetLastError());
}

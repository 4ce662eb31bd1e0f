/*
 * kernels/gemv_mma.cuh - the pieces of linear version 3, the tensor-core
 * GEMV, that both of its users share: kernels/linear.cu (the kernel that
 * streams W from global memory) and kernels/decode_megakernel.cu (a block's
 * rows of W from shared memory, under MV_LINEAR_GEMV=3). Both must give the
 * same bits, so the order of a row's sum is fixed here, once.
 *
 * y[m][n] = sum_k W[n][k] x[m][k] for M <= 32 tokens, as one
 * mma.sync.m16n8k16 (bf16 in, fp32 accumulate) after another: the MMA's
 * A operand is 16 rows of W, its B operand 8 of the tokens (the n8
 * columns, those past M zero), its D the 16 x 8 sums. Past 8 tokens the
 * tokens come in groups of 8, and each group has its own MMAs and its own
 * D, fed by the same A: token m is column m % 8 of group m / 8. One MMA does 16 x 8 x 16
 * multiply-adds; version 2 (fp32 FMAs on unpacked bf16) spends ~15
 * instructions a lane on 16 bytes of W at M = 1 and more with every token,
 * the MMA two instructions on 64 bytes of each of 16 rows, whatever M is.
 *
 * The order of a sum (the bits):
 *   - K is cut into chunks of 32 (the last one short when K % 32 != 0; K % 8
 *     == 0 always), C = ceil(K / 32) of them, and the chunks into S slices
 *     of `per` consecutive chunks (gemv_mma_split: at most 8 chunks, 256
 *     values, a slice while S <= 16; longer slices past K = 4,096).
 *   - Lane (g, t) = (lane / 4, lane % 4) of the MMA reads 8 consecutive
 *     values k = 32 c + 8 t .. + 7 of rows g and g + 8 and of token g (of
 *     token 8 j + g for group j). Its
 *     16 bytes feed two MMAs: values 0-3 the first, 4-7 the second (the
 *     k-slots 2t, 2t+1, 2t+8, 2t+9 of each; A and B use the same mapping,
 *     so each MMA still sums matching products). Values past K are zeros.
 *   - A slice's MMAs accumulate in chunk order into one fp32 D, from 0.
 *   - y = bf16(((0 + D_0) + D_1) + ... + D_{S-1} (+ bias)), the slices
 *     added in order in fp32.
 * Each output depends only on its own row of W and its own token, so the
 * bits do not depend on M, N, which rows share a tile, or which warp took
 * which slice.
 */
#ifndef MV_KERNELS_GEMV_MMA_CUH
#define MV_KERNELS_GEMV_MMA_CUH

#include <stdint.h>

#define GEMV_MMA_ROWS 16       // rows of W an MMA tile holds
#define GEMV_MMA_COLS 8        // tokens an MMA takes: its n8
#define GEMV_MMA_MAX_GROUPS 4  // groups of GEMV_MMA_COLS tokens a launch of linear version 3 takes
#define GEMV_MMA_MAX_M (GEMV_MMA_COLS * GEMV_MMA_MAX_GROUPS)  // 32: LINEAR_GEMV_MMA_MAX_M
#define GEMV_MMA_MAX_SLICES 16
#define GEMV_MMA_SLICE_CHUNKS 8  // chunks of 32 a slice holds while S <= GEMV_MMA_MAX_SLICES

// The slices of a row of K values: *S slices of *per chunks of 32 (the last
// slice may hold fewer).
__host__ __device__ __forceinline__ void gemv_mma_split(int K, int *S, int *per) {
    const int C = (K + 31) / 32;
    int s = (C + GEMV_MMA_SLICE_CHUNKS - 1) / GEMV_MMA_SLICE_CHUNKS;
    if (s > GEMV_MMA_MAX_SLICES) s = GEMV_MMA_MAX_SLICES;
    if (s < 1) s = 1;
    *S = s;
    *per = (C + s - 1) / s;
}

#ifdef __CUDACC__
// D += A B for one m16n8k16: a = 16 rows x 16 k-slots of bf16 (4 registers
// of 2), b = 16 k-slots x 8 columns (2 registers), d = 16 x 8 fp32.
__device__ __forceinline__ void mma_16816(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                          uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#else
    (void)d, (void)a0, (void)a1, (void)a2, (void)a3, (void)b0, (void)b1;
#endif
}

// One chunk of 32 values: lane (g, t)'s 16 bytes of row g (lo), row g + 8
// (hi) and token g (x), in the two MMAs the order above fixes. The A
// fragment of m16n8k16 is {(g, 2t..2t+1), (g+8, 2t..2t+1), (g, 2t+8..+9),
// (g+8, 2t+8..+9)}, the B fragment {(2t..2t+1, g), (2t+8..+9, g)}.
__device__ __forceinline__ void gemv_mma_chunk(float (&d)[4], const uint4 &lo, const uint4 &hi, const uint4 &x) {
    mma_16816(d, lo.x, hi.x, lo.y, hi.y, x.x, x.y);
    mma_16816(d, lo.z, hi.z, lo.w, hi.w, x.z, x.w);
}
#endif

#endif

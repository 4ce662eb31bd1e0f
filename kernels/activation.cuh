/*
 * kernels/activation.cuh - SiluAndMul's arithmetic for one element, shared by
 * silu_and_mul_cuda's version 3 (kernels/activation.cu) and the GEMV that
 * computes SiluAndMul as it reads its input (linear_silu_mul_cuda,
 * kernels/linear.cu), so the two give the same bits.
 */
#ifndef MV_KERNELS_ACTIVATION_CUH
#define MV_KERNELS_ACTIVATION_CUH

// silu(g) * u in fp32, before the one rounding to bf16: the fast
// approximate divide and exponential (2 ulp each: invisible after the
// rounding, 2^-8 relative).
__device__ __forceinline__ float silu_mul_dev(float g, float u) {
    return __fdividef(g, 1.0f + __expf(-g)) * u;
}

#endif

/*
 * kernels/activation.cuh - SiluAndMul's arithmetic for one element, shared by
 * silu_and_mul_cuda's version 3 (kernels/activation.cu) and the GEMV that
 * computes SiluAndMul as it reads its input (linear_silu_mul_cuda,
 * kernels/linear.cu), so the two give the same bits.
 */
#ifndef MV_KERNELS_ACTIVATION_CUH
#define MV_KERNELS_ACTIVATION_CUH

#include <cuda_bf16.h>
#include <stdint.h>

// silu(g) * u in fp32, before the one rounding to bf16: the fast
// approximate divide and exponential (2 ulp each: invisible after the
// rounding, 2^-8 relative).
__device__ __forceinline__ float silu_mul_dev(float g, float u) {
    return __fdividef(g, 1.0f + __expf(-g)) * u;
}

// 8 elements of SiluAndMul, each rounded to bf16 once, packed as one
// 16-byte vector (element 2i in the low half of word i): what the GEMVs
// that compute SiluAndMul as they read their input multiply (version 3's,
// kernels/linear.cu, and the decode megakernel's staging).
__device__ __forceinline__ uint4 silu_mul_pack8(const float g[8], const float u[8]) {
    uint32_t w[4];
#pragma unroll
    for (int j = 0; j < 4; j++) {
        const __nv_bfloat162 two = __floats2bfloat162_rn(silu_mul_dev(g[2 * j], u[2 * j]),
                                                         silu_mul_dev(g[2 * j + 1], u[2 * j + 1]));
        w[j] = (uint32_t)__bfloat16_as_ushort(two.x) | ((uint32_t)__bfloat16_as_ushort(two.y) << 16);
    }
    return make_uint4(w[0], w[1], w[2], w[3]);
}

#endif

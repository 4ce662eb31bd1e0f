/*
 * kernels/activation.cu - SiluAndMul kernels (see activation.h).
 *
 * Napkin math, per token: read 2*I bf16 (4*I bytes), write I bf16 (2*I
 * bytes), about 5 FLOPs and one exp per output. At 6 bytes per output the
 * arithmetic intensity is under 1 FLOP/byte: the kernel is memory-bound, and
 * its speed is judged by bytes moved / time against the copy bandwidth.
 */
#include "kernels/activation.h"

#include "common/check.h"
#include "kernels/common.cuh"
#include "reference/activation.h"

__device__ __forceinline__ float silu_dev(float g) {
    // __expf is the fast hardware exponential (2 ulp); exact enough next to
    // the bf16 rounding of the output (2^-8 relative).
    return g / (1.0f + __expf(-g));
}

// ---- version 1: naive --------------------------------------------------------
// One thread per output element. Consecutive threads read consecutive gate
// (and up) elements, so accesses are coalesced, but each thread moves only
// 2 bytes per load: many memory instructions for few bytes.
__global__ void silu_and_mul_kernel_v1(__nv_bfloat16 *out,       // [T, I]
                                       const __nv_bfloat16 *in,  // [T, 2*I]
                                       int T, int I) {
    long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (long long)T * I) return;
    long long t = idx / I, j = idx % I;
    float gate = __bfloat162float(in[t * 2 * I + j]);
    float up = __bfloat162float(in[t * 2 * I + I + j]);
    out[idx] = __float2bfloat16(silu_dev(gate) * up);
}

// ---- version 2: vectorised, grid-stride ---------------------------------------
// Each step a thread loads VEC gate values and VEC up values (16 bytes each
// for VEC = 8) and stores VEC outputs. A grid of a few blocks per SM strides
// over the whole tensor, so launch cost and tail effects stay small whatever T.
template <int VEC>
__global__ void silu_and_mul_kernel_v2(__nv_bfloat16 *out, const __nv_bfloat16 *in, int T, int I) {
    using vec_t = bf16_vec<VEC>;
    const long long vecs_per_row = I / VEC;  // launcher guarantees I % VEC == 0
    const long long total = (long long)T * vecs_per_row;
    for (long long v = (long long)blockIdx.x * blockDim.x + threadIdx.x; v < total;
         v += (long long)gridDim.x * blockDim.x) {
        long long t = v / vecs_per_row, c = v % vecs_per_row;
        const vec_t *gate_row = reinterpret_cast<const vec_t *>(in + t * 2 * I);
        const vec_t *up_row = reinterpret_cast<const vec_t *>(in + t * 2 * I + I);
        // Both loads are issued before either value is used: two 16-byte
        // requests in flight per thread.
        vec_t g = gate_row[c], u = up_row[c], y;
#pragma unroll
        for (int k = 0; k < VEC; k++)
            y.v[k] = __float2bfloat16(silu_dev(__bfloat162float(g.v[k])) * __bfloat162float(u.v[k]));
        reinterpret_cast<vec_t *>(out + t * I)[c] = y;
    }
}

template <int VEC>
static void launch_v2(__nv_bfloat16 *out, const __nv_bfloat16 *in, int T, int I, cudaStream_t s) {
    const int threads = 256;
    long long total = (long long)T * (I / VEC);
    // 8 blocks of 256 threads per SM is 2048 threads: full occupancy on
    // Hopper and Ampere. Fewer blocks when the tensor is small.
    long long blocks = (total + threads - 1) / threads;
    long long max_blocks = 8LL * mv_num_sms();
    if (blocks > max_blocks) blocks = max_blocks;
    silu_and_mul_kernel_v2<VEC><<<(unsigned)blocks, threads, 0, s>>>(out, in, T, I);
}

extern "C" const char *silu_and_mul_version_name(int version) {
    switch (version) {
    case 1: return "v1-naive";
    case 2: return "v2-vec16-gridstride";
    default: return NULL;
    }
}

extern "C" int silu_and_mul_cuda(int version, bf16_t *d_out, const bf16_t *d_in, int T, int I,
                                 cudaStream_t stream) {
    if (silu_and_mul_validate(T, I)) return -1;
    if (T == 0) return 0;
    if (!d_out || !d_in) return mv_error("silu_and_mul_cuda: null pointer for a non-empty tensor");
    __nv_bfloat16 *out = reinterpret_cast<__nv_bfloat16 *>(d_out);
    const __nv_bfloat16 *in = reinterpret_cast<const __nv_bfloat16 *>(d_in);
    switch (version) {
    case 1: {
        long long n = (long long)T * I;
        silu_and_mul_kernel_v1<<<(unsigned)((n + 255) / 256), 256, 0, stream>>>(out, in, T, I);
        break;
    }
    case 2: {
        // The widest vector that divides I and keeps every row aligned.
        int bytes_ok16 = mv_aligned(out, 16) && mv_aligned(in, 16);
        int bytes_ok8 = mv_aligned(out, 8) && mv_aligned(in, 8);
        int bytes_ok4 = mv_aligned(out, 4) && mv_aligned(in, 4);
        if (I % 8 == 0 && bytes_ok16) launch_v2<8>(out, in, T, I, stream);
        else if (I % 4 == 0 && bytes_ok8) launch_v2<4>(out, in, T, I, stream);
        else if (I % 2 == 0 && bytes_ok4) launch_v2<2>(out, in, T, I, stream);
        else launch_v2<1>(out, in, T, I, stream);
        break;
    }
    default:
        return mv_error("silu_and_mul_cuda: unknown version %d (1..%d)", version,
                        SILU_AND_MUL_NUM_VERSIONS);
    }
    return CUDA_TRY(cudaGetLastError());
}

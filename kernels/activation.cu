/*
 * kernels/activation.cu - SiluAndMul kernels (see activation.h).
 *
 * Napkin math, per token: read 2*I bf16 (4*I bytes), write I bf16 (2*I
 * bytes), about 5 FLOPs and one exp per output. At 6 bytes per output the
 * arithmetic intensity is under 1 FLOP/byte: the kernel is memory-bound, and
 * its speed is judged by bytes moved / time against the copy bandwidth.
 */
#include "kernels/activation.h"
#include "kernels/versions.h"

#include "common/check.h"
#include "kernels/activation.cuh"
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

// ---- version 3: more bytes in flight, no division ------------------------------
// Measured on an H200, version 2 reached 81% of the copy bandwidth at
// T = 32768, I = 3072. Two costs held it back: the 64-bit divide that turns
// the flat index into (row, column) every step, and the IEEE fp32 divide in
// silu, together enough instructions per byte to compete with the memory
// system. Version 3 gives each block whole rows (no index division), uses
// the fast approximate divide (__fdividef, 2 ulp: invisible after bf16
// rounding), and issues UNROLL vector loads of gate and up before it uses
// any of them, so each thread keeps up to 2 * UNROLL * 16 bytes in flight.
template <int VEC, int UNROLL>
__global__ void silu_and_mul_kernel_v3(__nv_bfloat16 *out, const __nv_bfloat16 *in, int T, int I) {
    using vec_t = bf16_vec<VEC>;
    const int vecs_per_row = I / VEC;  // launcher guarantees I % VEC == 0
    pdl_launch_dependents();
    pdl_wait();
    for (long long t = blockIdx.x; t < T; t += gridDim.x) {
        const vec_t *gate_row = reinterpret_cast<const vec_t *>(in + t * 2 * I);
        const vec_t *up_row = reinterpret_cast<const vec_t *>(in + t * 2 * I + I);
        vec_t *out_row = reinterpret_cast<vec_t *>(out + t * I);
        for (int c0 = threadIdx.x; c0 < vecs_per_row; c0 += blockDim.x * UNROLL) {
            vec_t g[UNROLL], u[UNROLL];
#pragma unroll
            for (int k = 0; k < UNROLL; k++) {  // all loads first
                int c = c0 + k * blockDim.x;
                if (c < vecs_per_row) {
                    g[k] = gate_row[c];
                    u[k] = up_row[c];
                }
            }
#pragma unroll
            for (int k = 0; k < UNROLL; k++) {
                int c = c0 + k * blockDim.x;
                if (c >= vecs_per_row) break;
                vec_t y;
#pragma unroll
                for (int e = 0; e < VEC; e++) {
                    y.v[e] = __float2bfloat16(silu_mul_dev(__bfloat162float(g[k].v[e]), __bfloat162float(u[k].v[e])));
                }
                out_row[c] = y;
            }
        }
    }
}

template <int VEC>
static void launch_v3(__nv_bfloat16 *out, const __nv_bfloat16 *in, int T, int I, cudaStream_t s) {
    // 128 threads x 4 vectors cover a row of up to 512 vectors (I = 4096 at
    // VEC = 8) in one step; 16 such blocks fill an SM (2048 threads).
    const int threads = 128;
    long long blocks = T;
    long long max_blocks = 16LL * mv_num_sms();
    if (blocks > max_blocks) blocks = max_blocks;
    mv_launch(silu_and_mul_kernel_v3<VEC, 4>, dim3((unsigned)blocks), dim3(threads), 0, s, out, in, T, I);
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
    return kernel_version_name(SILU_AND_MUL_VERSION_TABLE, version);  // kernels/versions.h
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
    case 2:
    case 3: {
        // The widest vector that divides I and keeps every row aligned.
        int vec = 1;
        for (int w = 8; w > 1 && vec == 1; w /= 2)
            if (I % w == 0 && mv_aligned(out, 2 * w) && mv_aligned(in, 2 * w)) vec = w;
        if (version == 2) {
            if (vec == 8) launch_v2<8>(out, in, T, I, stream);
            else if (vec == 4) launch_v2<4>(out, in, T, I, stream);
            else if (vec == 2) launch_v2<2>(out, in, T, I, stream);
            else launch_v2<1>(out, in, T, I, stream);
        } else {
            if (vec == 8) launch_v3<8>(out, in, T, I, stream);
            else if (vec == 4) launch_v3<4>(out, in, T, I, stream);
            else if (vec == 2) launch_v3<2>(out, in, T, I, stream);
            else launch_v3<1>(out, in, T, I, stream);
        }
        break;
    }
    default:
        return mv_error("silu_and_mul_cuda: unknown version %d (1..%d)", version,
                        SILU_AND_MUL_NUM_VERSIONS);
    }
    return CUDA_TRY(cudaGetLastError());
}

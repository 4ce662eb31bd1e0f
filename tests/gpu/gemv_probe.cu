/*
 * tests/gpu/gemv_probe.cu - the decode megakernel's GEMV from shared memory,
 * alone.
 *
 * In the megakernel's profile (MV_MEGAKERNEL_PROFILE=1) block 0 spends 1.1
 * to 2.6 us in a projection's GEMV once its weights have landed: 32 to 96
 * KB a block, 27 to 38 GB/s an SM from shared memory. Is that the GEMV's
 * own speed, or the kernel around it (the producer's bulk copies into the
 * other buffer, the other warps, the timer)? This probe runs the
 * megakernel's own mk::gemv (the file is included, not copied) on one
 * block a SM, 132 blocks, with block 0's share of each of Qwen3-0.6B's
 * projections already in shared memory and nothing else running, and
 * times it with clock64 and %globaltimer:
 *
 *   per projection, consumer-warp count NW (8, the kernel's; 16) and items
 *   a warp takes at once IW (1, the kernel's; 2, 3: mk::gemv's IW), and
 *   x read from shared memory for every item (mk::gemv) or converted once
 *   into registers (mk::gemv_xr, IW 1 or 2; MV_MEGAKERNEL_XREG): the
 *   cycles and ns of one GEMV (the mean of 200 after 10 to warm up,
 *   thread 0 of block 0 after all consumer warps met), and the bytes of
 *   weights a block read per ns; every variant's output must be bit for
 *   bit that of NW 8, IW 1 (a FAIL line and exit status 1 otherwise);
 *   %globaltimer's step: the smallest non-zero difference of two reads.
 *
 *   nvcc -I. -DMV_HAVE_CUDA=1 -O3 -std=c++17 -arch=sm_90 tests/gpu/gemv_probe.cu \
 *     -Lbuild/lib -lmv_ch07 -lmv_ch03 -lmv_core -lcublas -lnccl -o build/gemv_probe
 *   build/gemv_probe
 */
#include "kernels/decode_megakernel.cu"

#include <cstdio>
#include <cstring>

#define CK(x)                                                                                  \
    do {                                                                                       \
        cudaError_t e_ = (x);                                                                  \
        if (e_ != cudaSuccess) {                                                               \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
            return 1;                                                                          \
        }                                                                                      \
    } while (0)

enum { REPS = 200, WARM = 10 };

// One block a SM; CONSUMERS threads, as the megakernel's consumer warps.
// Shared memory: the share's weights [rows, K] (GV 3: each row padded 64
// bytes, as the kernel pads them for mk::gemv_mma), xs [1, K], part.
template <int NW, int IW, int GV = 2>
__global__ void gemv_alone(int N, int K, int ks, bf16 *out, unsigned long long *result) {
    using namespace mk;
    extern __shared__ __align__(128) unsigned char smem[];
    wbuf b = {reinterpret_cast<uint4 *>(smem), nullptr, nullptr, 0u, 0, 0};
    share(N, &b.row0, &b.rows);
    const int pitch = GV == 3 ? (2 * K + 64) / 16 : K / 8;  // uint4s a row
    const size_t wbytes = (size_t)b.rows * pitch * 16;
    uint4 *xs = reinterpret_cast<uint4 *>(smem + (wbytes + 127) / 128 * 128);
    float *part = reinterpret_cast<float *>(xs + K / 8);
    // Weights and input: small bf16 values from the index (any bits will do).
    for (size_t i = threadIdx.x; i < wbytes / 16 + K / 8; i += blockDim.x) {
        const unsigned h = (unsigned)i * 2654435761u;
        const uint32_t w = 0x3c003c00u ^ (h & 0x007f007fu);
        // (Writing smem[0] for the x indices too, as this loop once did, raced with its own fill:
        // weights that changed from launch to launch, and bits compared across variants that differed.)
        if (i < wbytes / 16) reinterpret_cast<uint4 *>(smem)[i] = make_uint4(w, w, w, w);
        else xs[i - wbytes / 16] = make_uint4(w, w, w, w);
    }
    __syncthreads();
    unsigned long long c_sum = 0, t_sum = 0;
    for (int r = 0; r < WARM + REPS; r++) {
        const unsigned long long c0 = clock64(), t0 = globaltimer();
        if constexpr (GV == 3)
            gemv_mma<1, NW>(b, K, pitch, xs, out, N, part);
        else if constexpr (GV == 4)
            gemv_xr<1, NW, IW>(b, K, ks, xs, out, N, part);
        else
            gemv<1, NW, IW>(b, K, ks, xs, out, N, part);
        csync<NW>::sync();
        const unsigned long long c1 = clock64(), t1 = globaltimer();
        if (r >= WARM) c_sum += c1 - c0, t_sum += t1 - t0;
    }
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        result[0] = c_sum, result[1] = t_sum, result[2] = (unsigned long long)b.rows;
        // %globaltimer's step.
        unsigned long long prev = globaltimer(), step = ~0ull;
        for (int i = 0; i < 20000; i++) {
            const unsigned long long t = globaltimer();
            if (t != prev && t - prev < step) step = t - prev;
            prev = t;
        }
        result[3] = step;
    }
}

// Version 3 (mk::gemv_mma, the tensor-core GEMV) alone: its own bits (not
// version 1's), so only its time is printed.
template <int NW>
static int run_mma(const char *name, int N, int K, bf16 *out, unsigned long long *d_res, int sms) {
    int S, per;
    gemv_mma_split(K, &S, &per);
    const size_t rows = share_bytes(N, K, sms) / 2 / K, tiles = (rows + 15) / 16;
    const size_t smem = (rows * (2 * K + 64) + 127) / 128 * 128 + (size_t)K * 2 + tiles * S * 16 * sizeof(float) + 256;
    CK(cudaFuncSetAttribute(gemv_alone<NW, 1, 3>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    gemv_alone<NW, 1, 3><<<sms, 32 * NW, smem>>>(N, K, 0, out, d_res);
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    unsigned long long r[3];
    CK(cudaMemcpy(r, d_res, sizeof r, cudaMemcpyDeviceToHost));
    const double cyc = (double)r[0] / REPS, ns = (double)r[1] / REPS;
    printf("%-13s warps %2d  version 3 (MMA)  rows %3llu  K %5d  slices %2d  %8.0f cycles  %7.0f ns  %6.1f bytes/ns\n",
           name, NW, r[2], K, S, cyc, ns, (double)r[2] * K * 2 / ns);
    return 0;
}

// One pair of buffers for every variant (a static array inside run<> would be one per instance, and
// every variant but the first would compare against zeros).
static unsigned short g_out[6144], g_ref[6144];

template <int NW, int IW, int GV = 2>
static int run(const char *name, int N, int K, bf16 *out, unsigned long long *d_res, int sms, bool first, int *bad) {
    const int ks = linear_gemv_k_split(K);
    const size_t rows = share_bytes(N, K, sms) / 2 / K;
    const size_t smem = (rows * K * 2 + 127) / 128 * 128 + (size_t)K * 2 + rows / 2 * ks * 2 * sizeof(float) + 256;
    CK(cudaFuncSetAttribute(gemv_alone<NW, IW, GV>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    CK(cudaMemset(out, 0xff, (size_t)N * 2));
    gemv_alone<NW, IW, GV><<<sms, 32 * NW, smem>>>(N, K, ks, out, d_res);
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    unsigned long long r[4];
    CK(cudaMemcpy(r, d_res, sizeof r, cudaMemcpyDeviceToHost));
    // The outputs: the first variant's (warps 8, items 1) are the reference; the others must match bit for bit.
    unsigned short *h = g_out, *hr = g_ref;
    CK(cudaMemcpy(h, out, (size_t)N * 2, cudaMemcpyDeviceToHost));
    if (first) memcpy(hr, h, (size_t)N * 2);
    int diff = 0;
    for (int i = 0; i < N; i++) diff += h[i] != hr[i];
    const double cyc = (double)r[0] / REPS, ns = (double)r[1] / REPS;
    printf("%-13s %s warps %2d  items %d  rows %3llu  K %5d  ks %d  %8.0f cycles  %7.0f ns  %6.1f bytes/ns  (%.2f GHz)  "
           "globaltimer step %llu ns  %s\n",
           name, GV == 4 ? "x in registers" : "x in smem     ", NW, IW, r[2], K, ks, cyc, ns, (double)r[2] * K * 2 / ns, cyc / ns, r[3],
           diff ? "FAIL: outputs differ from warps 8 items 1" : "bits: those of warps 8 items 1");
    if (diff) printf("FAIL %s warps %d items %d: %d of %d outputs differ\n", name, NW, IW, diff, N), ++*bad;
    return 0;
}

int main() {
    int sms = 0;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    bf16 *out;
    unsigned long long *d_res;
    CK(cudaMalloc(&out, (size_t)6144 * 2 * 2));
    CK(cudaMalloc(&d_res, 4 * sizeof(unsigned long long)));
    const struct { const char *name; int N, K; } p[] = {
        {"qkv_proj", 4096, 1024}, {"o_proj", 1024, 2048}, {"gate_up_proj", 6144, 1024}, {"down_proj", 1024, 3072}};
    int bad = 0;
    for (const auto &x : p)
        if (run<8, 1>(x.name, x.N, x.K, out, d_res, sms, true, &bad) ||
            run<8, 2>(x.name, x.N, x.K, out, d_res, sms, false, &bad) ||
            run<8, 3>(x.name, x.N, x.K, out, d_res, sms, false, &bad) ||
            run<16, 1>(x.name, x.N, x.K, out, d_res, sms, false, &bad) ||
            run<16, 2>(x.name, x.N, x.K, out, d_res, sms, false, &bad) ||
            run<8, 1, 4>(x.name, x.N, x.K, out, d_res, sms, false, &bad) ||
            run<8, 2, 4>(x.name, x.N, x.K, out, d_res, sms, false, &bad) ||
            run<16, 1, 4>(x.name, x.N, x.K, out, d_res, sms, false, &bad) ||
            run_mma<8>(x.name, x.N, x.K, out, d_res, sms))
            return 1;
    return bad ? 1 : 0;
}

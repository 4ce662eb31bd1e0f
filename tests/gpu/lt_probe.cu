/*
 * tests/gpu/lt_probe.cu - how far is cuBLAS's first choice from its best
 * for the engine's GEMMs?
 *
 * For each of Qwen3-0.6B's projections (N x K) and each M of the decode
 * graphs above the GEMV's 16 rows, it times, inside CUDA graphs as the
 * engine replays them, cublasGemmEx with CUBLAS_GEMM_DEFAULT (what linear
 * version 1 calls) and every algorithm cublasLt's heuristic offers for the
 * same problem (up to 32). Each graph holds L launches on L distinct
 * weight copies (as a step's 28 layers are), so that no launch finds its
 * weight in L2. Prints one line per (projection, M): the default's us a
 * launch, the heuristic's first, the best and its index, and the largest
 * difference of any algorithm's output from the default's (bf16 ulps of
 * the default's values are about 4e-3 of them: sums in another order).
 *
 *   nvcc -O2 -std=c++17 -arch=sm_90 tests/gpu/lt_probe.cu -lcublasLt -lcublas -o build/lt_probe
 *   MV_COMMIT=<commit> build/lt_probe [--json FILE]
 */
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string_view>
#include <vector>

#define CK(x)                                                                                  \
    do {                                                                                       \
        cudaError_t e_ = (x);                                                                  \
        if (e_ != cudaSuccess) {                                                               \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
            exit(1);                                                                           \
        }                                                                                      \
    } while (0)
#define CB(x)                                                                                          \
    do {                                                                                               \
        cublasStatus_t s_ = (x);                                                                       \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                             \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cublasGetStatusName(s_));      \
            exit(1);                                                                                   \
        }                                                                                              \
    } while (0)

typedef __nv_bfloat16 bf16;

__global__ void fill(bf16 *p, long long n, unsigned seed, float scale) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        unsigned h = (unsigned)i * 2654435761u ^ seed;
        h ^= h >> 13, h *= 0x5bd1e995u, h ^= h >> 15;
        p[i] = __float2bfloat16(((h & 0xffff) / 65536.0f - 0.5f) * scale);
    }
}

struct shape {
    const char *name;
    int N, K, L;
};

static const size_t WS = 32u << 20;  // the engine's cuBLAS workspace

static float time_graph(cudaGraphExec_t ge, cudaStream_t st, int L) {
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    for (int i = 0; i < 3; i++) CK(cudaGraphLaunch(ge, st));
    float best[5];
    for (int r = 0; r < 5; r++) {
        CK(cudaEventRecord(a, st));
        for (int i = 0; i < 10; i++) CK(cudaGraphLaunch(ge, st));
        CK(cudaEventRecord(b, st));
        CK(cudaEventSynchronize(b));
        float ms;
        CK(cudaEventElapsedTime(&ms, a, b));
        best[r] = ms * 1000.0f / (10.0f * L);
    }
    CK(cudaEventDestroy(a));
    CK(cudaEventDestroy(b));
    std::sort(best, best + 5);
    return best[2];
}

static float max_diff(const bf16 *d_a, const bf16 *d_b, size_t n, std::vector<bf16> &ha, std::vector<bf16> &hb) {
    ha.resize(n), hb.resize(n);
    CK(cudaMemcpy(ha.data(), d_a, n * 2, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(hb.data(), d_b, n * 2, cudaMemcpyDeviceToHost));
    float m = 0.0f;
    for (size_t i = 0; i < n; i++) m = std::max(m, std::fabs(__bfloat162float(ha[i]) - __bfloat162float(hb[i])));
    return m;
}

int main(int argc, char **argv) {
    const char *json = argc == 3 && std::string_view(argv[1]) == "--json" ? argv[2] : nullptr;
    const shape shapes[] = {{"qkv_proj", 4096, 1024, 28}, {"o_proj", 1024, 2048, 28}, {"gate_up_proj", 6144, 1024, 28},
                            {"down_proj", 1024, 3072, 28}, {"lm_head", 151936, 1024, 2}};
    const int Ms[] = {24, 32, 48, 64, 96, 128, 160, 192, 224, 256, 512, 2048};
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    cublasHandle_t h;
    CB(cublasCreate(&h));
    cublasLtHandle_t lt;
    CB(cublasLtCreate(&lt));
    void *ws;
    CK(cudaMalloc(&ws, WS));
    CB(cublasSetStream(h, st));
    CB(cublasSetWorkspace(h, ws, WS));
    FILE *jf = json ? fopen(json, "w") : nullptr;
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    const char *commit = getenv("MV_COMMIT");
    if (jf)
        fprintf(jf, "{\"gpu\": \"%s\", \"commit\": \"%s\", \"command\": \"lt_probe --json %s\", \"rows\": [\n",
                prop.name, commit ? commit : "unknown", json);
    int first = 1;
    std::vector<bf16> ha, hb;
    printf("%-13s %5s %9s %9s %9s %5s %7s %9s  %s\n", "projection", "M", "default", "lt[0]", "best", "idx", "algos",
           "max|d|", "best/default");
    for (const shape &s : shapes) {
        bf16 *W, *X, *Y, *Y0;
        const size_t wn = (size_t)s.N * s.K;
        CK(cudaMalloc(&W, wn * s.L * 2));
        CK(cudaMalloc(&X, (size_t)2048 * s.K * 2));
        CK(cudaMalloc(&Y, (size_t)2048 * s.N * 2 * s.L));
        CK(cudaMalloc(&Y0, (size_t)2048 * s.N * 2));
        fill<<<1024, 256>>>(W, (long long)wn * s.L, 7u, 0.0625f);
        fill<<<1024, 256>>>(X, (long long)2048 * s.K, 11u, 2.0f);
        CK(cudaDeviceSynchronize());
        for (int M : Ms) {
            const float alpha = 1.0f, beta = 0.0f;
            // The default: cublasGemmEx as linear_cuda calls it.
            cudaGraph_t g;
            cudaGraphExec_t ge;
            CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
            for (int l = 0; l < s.L; l++)
                CB(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, s.N, M, s.K, &alpha, W + wn * l, CUDA_R_16BF, s.K, X,
                                CUDA_R_16BF, s.K, &beta, Y + (size_t)2048 * s.N * l, CUDA_R_16BF, s.N,
                                CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
            CK(cudaStreamEndCapture(st, &g));
            CK(cudaGraphInstantiate(&ge, g, 0));
            const float t_def = time_graph(ge, st, s.L);
            CK(cudaGraphExecDestroy(ge));
            CK(cudaGraphDestroy(g));
            CK(cudaMemcpy(Y0, Y, (size_t)M * s.N * 2, cudaMemcpyDeviceToDevice));

            cublasLtMatmulDesc_t op;
            CB(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
            cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
            CB(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
            CB(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
            cublasLtMatrixLayout_t la, lb, lc;
            CB(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, s.K, s.N, s.K));
            CB(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, s.K, M, s.K));
            CB(cublasLtMatrixLayoutCreate(&lc, CUDA_R_16BF, s.N, M, s.N));
            cublasLtMatmulPreference_t pref;
            CB(cublasLtMatmulPreferenceCreate(&pref));
            size_t wsb = WS;
            CB(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof wsb));
            cublasLtMatmulHeuristicResult_t res[32];
            int nres = 0;
            CB(cublasLtMatmulAlgoGetHeuristic(lt, op, la, lb, lc, lc, pref, 32, res, &nres));
            float t0 = -1, tbest = 1e30f, dmax = 0.0f;
            int ibest = -1;
            for (int i = 0; i < nres; i++) {
                if (res[i].state != CUBLAS_STATUS_SUCCESS) continue;
                CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
                bool ok = true;
                for (int l = 0; l < s.L && ok; l++)
                    ok = cublasLtMatmul(lt, op, &alpha, W + wn * l, la, X, lb, &beta, Y + (size_t)2048 * s.N * l, lc,
                                        Y + (size_t)2048 * s.N * l, lc, &res[i].algo, ws, WS, st) == CUBLAS_STATUS_SUCCESS;
                CK(cudaStreamEndCapture(st, &g));
                if (!ok) {
                    CK(cudaGraphDestroy(g));
                    continue;
                }
                CK(cudaGraphInstantiate(&ge, g, 0));
                const float t = time_graph(ge, st, s.L);
                CK(cudaGraphExecDestroy(ge));
                CK(cudaGraphDestroy(g));
                CK(cudaStreamSynchronize(st));
                dmax = std::max(dmax, max_diff(Y, Y0, (size_t)M * s.N, ha, hb));
                if (i == 0) t0 = t;
                if (t < tbest) tbest = t, ibest = i;
            }
            printf("%-13s %5d %9.2f %9.2f %9.2f %5d %7d %9.2e  %.3f\n", s.name, M, t_def, t0, tbest, ibest, nres, dmax,
                   tbest / t_def);
            fflush(stdout);
            if (jf)
                fprintf(jf, "%s{\"projection\": \"%s\", \"N\": %d, \"K\": %d, \"M\": %d, \"default_us\": %.3f, "
                            "\"lt_first_us\": %.3f, \"best_us\": %.3f, \"best_index\": %d, \"algos\": %d, "
                            "\"max_abs_diff\": %.3e}",
                        first ? "" : ",\n", s.name, s.N, s.K, M, t_def, t0, tbest, ibest, nres, dmax);
            first = 0;
            cublasLtMatmulPreferenceDestroy(pref);
            cublasLtMatrixLayoutDestroy(la);
            cublasLtMatrixLayoutDestroy(lb);
            cublasLtMatrixLayoutDestroy(lc);
            cublasLtMatmulDescDestroy(op);
        }
        CK(cudaFree(W));
        CK(cudaFree(X));
        CK(cudaFree(Y));
        CK(cudaFree(Y0));
    }
    if (jf) fprintf(jf, "\n]}\n"), fclose(jf);
    return 0;
}

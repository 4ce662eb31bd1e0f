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
 * With --sweep it goes past the heuristic's list: for the four decode
 * projections and M = 32 to 256 it takes every configuration the heuristic
 * returns (up to 64) as a seed, times each, and from the 4 fastest moves
 * one setting at a time (split-K 1 to 8 with each reduction scheme the
 * algorithm supports, tile, stages, cluster shape, CTA swizzling, custom
 * option), keeping what is faster, within a time cap a problem (LT_SWEEP_S,
 * default 5 s). Configurations cublasLtMatmulAlgoCheck refuses are skipped.
 * One line per (projection, M): the default, the best found, the
 * heuristic's first configuration and the best one (algorithm id, tile,
 * stages, split-K, reduction scheme, swizzling, custom option, cluster).
 *
 *   nvcc -O2 -std=c++17 -arch=sm_90 tests/gpu/lt_probe.cu -lcublasLt -lcublas -o build/lt_probe
 *   MV_COMMIT=<commit> build/lt_probe [--sweep] [--json FILE]
 */
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <chrono>
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

// The median over 5 rounds of `rounds_of` graph launches, in us a GEMM (the
// graph holds L). fast: one round of 3 launches after one warm-up.
static float time_graph(cudaGraphExec_t ge, cudaStream_t st, int L, bool fast = false) {
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    const int warm = fast ? 1 : 3, rounds = fast ? 1 : 5, per = fast ? 3 : 10;
    for (int i = 0; i < warm; i++) CK(cudaGraphLaunch(ge, st));
    float t[5];
    for (int r = 0; r < rounds; r++) {
        CK(cudaEventRecord(a, st));
        for (int i = 0; i < per; i++) CK(cudaGraphLaunch(ge, st));
        CK(cudaEventRecord(b, st));
        CK(cudaEventSynchronize(b));
        float ms;
        CK(cudaEventElapsedTime(&ms, a, b));
        t[r] = ms * 1000.0f / ((float)per * L);
    }
    CK(cudaEventDestroy(a));
    CK(cudaEventDestroy(b));
    std::sort(t, t + rounds);
    return t[rounds / 2];
}

// One problem: the operands and cublasLt's descriptors of out = x W^T for M tokens.
struct problem {
    const shape *s;
    int M;
    bf16 *W, *X, *Y;
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t la, lb, lc;
};

// Captures L launches of one cublasLt algorithm into a graph and times it; -1
// when a launch is refused.
static float time_lt(cublasLtHandle_t lt, const problem &p, const cublasLtMatmulAlgo_t *algo, void *ws,
                     cudaStream_t st, bool fast) {
    const float alpha = 1.0f, beta = 0.0f;
    const size_t wn = (size_t)p.s->N * p.s->K;
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    bool ok = true;
    for (int l = 0; l < p.s->L && ok; l++)
        ok = cublasLtMatmul(lt, p.op, &alpha, p.W + wn * l, p.la, p.X, p.lb, &beta, p.Y + (size_t)2048 * p.s->N * l,
                            p.lc, p.Y + (size_t)2048 * p.s->N * l, p.lc, algo, ws, WS, st) == CUBLAS_STATUS_SUCCESS;
    CK(cudaStreamEndCapture(st, &g));
    if (!ok) {
        CK(cudaGraphDestroy(g));
        return -1.0f;
    }
    if (cudaGraphInstantiate(&ge, g, 0) != cudaSuccess) {
        cudaGetLastError();
        CK(cudaGraphDestroy(g));
        return -1.0f;
    }
    const float t = time_graph(ge, st, p.s->L, fast);
    CK(cudaGraphExecDestroy(ge));
    CK(cudaGraphDestroy(g));
    CK(cudaStreamSynchronize(st));
    return t;
}

static float max_diff(const bf16 *d_a, const bf16 *d_b, size_t n, std::vector<bf16> &ha, std::vector<bf16> &hb) {
    ha.resize(n), hb.resize(n);
    CK(cudaMemcpy(ha.data(), d_a, n * 2, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(hb.data(), d_b, n * 2, cudaMemcpyDeviceToHost));
    float m = 0.0f;
    for (size_t i = 0; i < n; i++) m = std::max(m, std::fabs(__bfloat162float(ha[i]) - __bfloat162float(hb[i])));
    return m;
}

// Up to max configurations cublasLt's heuristic offers for the problem, with
// the engine's workspace; returns how many it wrote into res.
static int heuristic_list(cublasLtHandle_t lt, const problem &p, cublasLtMatmulHeuristicResult_t *res, int max) {
    cublasLtMatmulPreference_t pref;
    CB(cublasLtMatmulPreferenceCreate(&pref));
    size_t wsb = WS;
    CB(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof wsb));
    int n = 0;
    CB(cublasLtMatmulAlgoGetHeuristic(lt, p.op, p.la, p.lb, p.lc, p.lc, pref, max, res, &n));
    cublasLtMatmulPreferenceDestroy(pref);
    return n;
}

// A configuration of one algorithm: what --sweep sets and reports.
struct config {
    cublasLtMatmulAlgo_t algo;
    int id, splitk;
    uint32_t tile, stages, red, swz, custom;
    uint16_t cluster;
    float us;
};

// A capability that is a list of uint32 ids (tiles, stages); empty when the
// algorithm lists none.
static std::vector<uint32_t> cap_list(const cublasLtMatmulAlgo_t *a, cublasLtMatmulAlgoCapAttributes_t attr) {
    size_t sz = 0;
    std::vector<uint32_t> out;
    if (cublasLtMatmulAlgoCapGetAttribute(a, attr, nullptr, 0, &sz) != CUBLAS_STATUS_SUCCESS || sz == 0) return out;
    out.resize(sz / sizeof(uint32_t));
    if (cublasLtMatmulAlgoCapGetAttribute(a, attr, out.data(), sz, &sz) != CUBLAS_STATUS_SUCCESS) out.clear();
    return out;
}

// The configuration an algorithm (a heuristic's result) carries.
static config read_config(const cublasLtMatmulAlgo_t &a) {
    config c{};
    c.algo = a;
    size_t sz;
    int32_t sk = 1;
    cublasLtMatmulAlgoConfigGetAttribute(&a, CUBLASLT_ALGO_CONFIG_ID, &c.id, sizeof c.id, &sz);
    cublasLtMatmulAlgoConfigGetAttribute(&a, CUBLASLT_ALGO_CONFIG_TILE_ID, &c.tile, sizeof c.tile, &sz);
    cublasLtMatmulAlgoConfigGetAttribute(&a, CUBLASLT_ALGO_CONFIG_STAGES_ID, &c.stages, sizeof c.stages, &sz);
    cublasLtMatmulAlgoConfigGetAttribute(&a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &sk, sizeof sk, &sz);
    cublasLtMatmulAlgoConfigGetAttribute(&a, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &c.red, sizeof c.red, &sz);
    cublasLtMatmulAlgoConfigGetAttribute(&a, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, &c.swz, sizeof c.swz, &sz);
    cublasLtMatmulAlgoConfigGetAttribute(&a, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, &c.custom, sizeof c.custom, &sz);
    cublasLtMatmulAlgoConfigGetAttribute(&a, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, &c.cluster, sizeof c.cluster, &sz);
    c.splitk = sk;
    return c;
}

// Sets c's fields on its algorithm; true when cublasLt accepts the
// configuration for this problem within the workspace.
static bool apply(cublasLtHandle_t lt, const problem &p, config &c) {
    cublasLtMatmulAlgo_t &a = c.algo;
    const int32_t sk = c.splitk;
    if (cublasLtMatmulAlgoConfigSetAttribute(&a, CUBLASLT_ALGO_CONFIG_TILE_ID, &c.tile, sizeof c.tile) ||
        cublasLtMatmulAlgoConfigSetAttribute(&a, CUBLASLT_ALGO_CONFIG_STAGES_ID, &c.stages, sizeof c.stages) ||
        cublasLtMatmulAlgoConfigSetAttribute(&a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &sk, sizeof sk) ||
        cublasLtMatmulAlgoConfigSetAttribute(&a, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &c.red, sizeof c.red) ||
        cublasLtMatmulAlgoConfigSetAttribute(&a, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, &c.swz, sizeof c.swz) ||
        cublasLtMatmulAlgoConfigSetAttribute(&a, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, &c.custom, sizeof c.custom) ||
        cublasLtMatmulAlgoConfigSetAttribute(&a, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, &c.cluster, sizeof c.cluster))
        return false;
    cublasLtMatmulHeuristicResult_t r;
    return cublasLtMatmulAlgoCheck(lt, p.op, p.la, p.lb, p.lc, p.lc, &a, &r) == CUBLAS_STATUS_SUCCESS &&
           r.workspaceSize <= WS;
}

static double now_s() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// --sweep for one problem. The seeds are the configurations cublasLt's
// heuristic returns (up to 64); each is timed, and from the 4 fastest a
// coordinate descent moves one setting at a time (split-K 1 to 8 with each
// reduction scheme, tile, stages, cluster shape, CTA swizzling, custom
// option), twice over, keeping what is faster. No candidate is started after
// cap_s seconds. Returns the best (by the fast timing); *seed0 the
// heuristic's first, *timed how many were timed.
static config sweep(cublasLtHandle_t lt, const problem &p, void *ws, cudaStream_t st, double cap_s, int *timed,
                    config *seed0) {
    const double t0 = now_s();
    *timed = 0;
    auto attempt = [&](config &c) {
        if (now_s() - t0 > cap_s || !apply(lt, p, c)) return 1e30f;
        const float u = time_lt(lt, p, &c.algo, ws, st, true);
        if (u < 0) return 1e30f;
        ++*timed;
        return u;
    };
    cublasLtMatmulHeuristicResult_t res[64];
    const int nres = heuristic_list(lt, p, res, 64);
    std::vector<config> seeds;
    for (int i = 0; i < nres; i++) {
        if (res[i].state != CUBLAS_STATUS_SUCCESS) continue;
        config c = read_config(res[i].algo);
        c.us = attempt(c);
        if (i == 0) *seed0 = c;
        if (c.us < 1e29f) seeds.push_back(c);
    }
    std::sort(seeds.begin(), seeds.end(), [](const config &x, const config &y) { return x.us < y.us; });
    config best = seeds.empty() ? config{} : seeds[0];
    if (seeds.empty()) best.us = 1e30f;
    const uint32_t schemes[] = {CUBLASLT_REDUCTION_SCHEME_INPLACE, CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE,
                                CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE};
    const uint16_t clusters[] = {CUBLASLT_CLUSTER_SHAPE_AUTO, CUBLASLT_CLUSTER_SHAPE_1x1x1, CUBLASLT_CLUSTER_SHAPE_2x1x1,
                                 CUBLASLT_CLUSTER_SHAPE_1x2x1, CUBLASLT_CLUSTER_SHAPE_4x1x1, CUBLASLT_CLUSTER_SHAPE_2x2x1};
    for (size_t t = 0; t < std::min<size_t>(4, seeds.size()); t++) {
        config c = seeds[t];
        auto take = [&](config d) {
            const float u = attempt(d);
            if (u < c.us) c = d, c.us = u;
        };
        const std::vector<uint32_t> tiles = cap_list(&c.algo, CUBLASLT_ALGO_CAP_TILE_IDS);
        const std::vector<uint32_t> stages = cap_list(&c.algo, CUBLASLT_ALGO_CAP_STAGES_IDS);
        uint32_t swz_ok = 0, redmask = 0;
        int32_t custom_max = 0, splitk_ok = 0;
        size_t sz;
        cublasLtMatmulAlgoCapGetAttribute(&c.algo, CUBLASLT_ALGO_CAP_SPLITK_SUPPORT, &splitk_ok, sizeof splitk_ok, &sz);
        cublasLtMatmulAlgoCapGetAttribute(&c.algo, CUBLASLT_ALGO_CAP_REDUCTION_SCHEME_MASK, &redmask, sizeof redmask,
                                          &sz);
        cublasLtMatmulAlgoCapGetAttribute(&c.algo, CUBLASLT_ALGO_CAP_CTA_SWIZZLING_SUPPORT, &swz_ok, sizeof swz_ok, &sz);
        cublasLtMatmulAlgoCapGetAttribute(&c.algo, CUBLASLT_ALGO_CAP_CUSTOM_OPTION_MAX, &custom_max, sizeof custom_max,
                                          &sz);
        for (int round = 0; round < 2; round++) {
            for (int sk = 1; sk <= 8 && splitk_ok; sk++)
                for (uint32_t r : schemes) {
                    if (sk > 1 && !(redmask & r)) continue;
                    config d = c;
                    d.splitk = sk, d.red = sk == 1 ? CUBLASLT_REDUCTION_SCHEME_NONE : r;
                    take(d);
                    if (sk == 1) break;
                }
            for (uint32_t tl : tiles) {
                config d = c;
                d.tile = tl;
                take(d);
            }
            for (uint32_t sg : stages) {
                config d = c;
                d.stages = sg;
                take(d);
            }
            for (uint16_t cl : clusters) {
                config d = c;
                d.cluster = cl;
                take(d);
            }
            for (uint32_t sw = 0; sw <= (swz_ok ? 1u : 0u); sw++)
                for (int32_t co = 0; co <= std::min(custom_max, 7); co++) {
                    config d = c;
                    d.swz = sw, d.custom = (uint32_t)co;
                    take(d);
                }
        }
        if (c.us < best.us) best = c;
    }
    return best;
}

int main(int argc, char **argv) {
    const char *json = nullptr;
    bool do_sweep = false;
    for (int i = 1; i < argc; i++) {
        if (std::string_view(argv[i]) == "--sweep")
            do_sweep = true;
        else if (std::string_view(argv[i]) == "--json" && i + 1 < argc)
            json = argv[++i];
        else {
            fprintf(stderr, "usage: lt_probe [--sweep] [--json FILE]\n");
            return 2;
        }
    }
    const shape shapes[] = {{"qkv_proj", 4096, 1024, 28}, {"o_proj", 1024, 2048, 28}, {"gate_up_proj", 6144, 1024, 28},
                            {"down_proj", 1024, 3072, 28}, {"lm_head", 151936, 1024, 2}};
    const int Ms_all[] = {24, 32, 48, 64, 96, 128, 160, 192, 224, 256, 512, 2048};
    const int Ms_sweep[] = {32, 64, 96, 128, 192, 256};
    const int *Ms = do_sweep ? Ms_sweep : Ms_all;
    const int nM = do_sweep ? 6 : 12;
    const int nshapes = do_sweep ? 4 : 5;
    const double cap_s = getenv("LT_SWEEP_S") ? atof(getenv("LT_SWEEP_S")) : 5.0;
    if (!(cap_s > 0.0)) {
        fprintf(stderr, "lt_probe: LT_SWEEP_S=%s: it takes a time in seconds above 0\n", getenv("LT_SWEEP_S"));
        return 2;
    }
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
    if (json && !jf) {
        fprintf(stderr, "lt_probe: cannot write %s\n", json);
        return 1;
    }
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    const char *commit = getenv("MV_COMMIT");
    char date[32];
    const time_t now = time(nullptr);
    strftime(date, sizeof date, "%Y-%m-%d", gmtime(&now));
    if (jf)
        fprintf(jf,
                "{\"gpu\": \"%s\", \"date\": \"%s\", \"commit\": \"%s\", \"command\": \"lt_probe%s --json %s\", "
                "\"rows\": [\n",
                prop.name, date, commit ? commit : "unknown", do_sweep ? " --sweep" : "", json);
    int first = 1;
    std::vector<bf16> ha, hb;
    if (do_sweep)
        printf("%-13s %5s %9s %9s %7s  %-24s %-24s %9s  %s\n", "projection", "M", "default", "best", "timed",
               "heuristic[0] (id tile st", "best: sk red swz cust cl)", "max|d|", "best/default");
    else
        printf("%-13s %5s %9s %9s %9s %5s %7s %9s  %s\n", "projection", "M", "default", "lt[0]", "best", "idx",
               "algos", "max|d|", "best/default");
    for (int si = 0; si < nshapes; si++) {
        const shape &s = shapes[si];
        bf16 *W, *X, *Y, *Y0;
        const size_t wn = (size_t)s.N * s.K;
        CK(cudaMalloc(&W, wn * s.L * 2));
        CK(cudaMalloc(&X, (size_t)2048 * s.K * 2));
        CK(cudaMalloc(&Y, (size_t)2048 * s.N * 2 * s.L));
        CK(cudaMalloc(&Y0, (size_t)2048 * s.N * 2));
        fill<<<1024, 256>>>(W, (long long)wn * s.L, 7u, 0.0625f);
        fill<<<1024, 256>>>(X, (long long)2048 * s.K, 11u, 2.0f);
        CK(cudaDeviceSynchronize());
        for (int mi = 0; mi < nM; mi++) {
            const int M = Ms[mi];
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

            problem p{&s, M, W, X, Y};
            CB(cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
            cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
            CB(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
            CB(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
            CB(cublasLtMatrixLayoutCreate(&p.la, CUDA_R_16BF, s.K, s.N, s.K));
            CB(cublasLtMatrixLayoutCreate(&p.lb, CUDA_R_16BF, s.K, M, s.K));
            CB(cublasLtMatrixLayoutCreate(&p.lc, CUDA_R_16BF, s.N, M, s.N));
            if (do_sweep) {
                int timed = 0;
                config c0{};
                config b = sweep(lt, p, ws, st, cap_s, &timed, &c0);
                float tb_us = -1.0f, dmax = -1.0f;
                if (b.us < 1e29f) {
                    tb_us = time_lt(lt, p, &b.algo, ws, st, false);  // the full timing, as the default's
                    dmax = max_diff(Y, Y0, (size_t)M * s.N, ha, hb);
                }
                char cfg[96], cfg0[96];
                snprintf(cfg, sizeof cfg, "%d %u %u %d %u %u %u %u", b.id, b.tile, b.stages, b.splitk, b.red, b.swz,
                         b.custom, b.cluster);
                snprintf(cfg0, sizeof cfg0, "%d %u %u %d %u %u %u %u", c0.id, c0.tile, c0.stages, c0.splitk, c0.red,
                         c0.swz, c0.custom, c0.cluster);
                printf("%-13s %5d %9.2f %9.2f %7d  %-24s %-24s %9.2e  %.3f\n", s.name, M, t_def, tb_us, timed, cfg0, cfg,
                       dmax, tb_us / t_def);
                fflush(stdout);
                if (jf)
                    fprintf(jf, "%s{\"projection\": \"%s\", \"N\": %d, \"K\": %d, \"M\": %d, \"default_us\": %.3f, "
                                "\"best_us\": %.3f, \"timed\": %d, \"heuristic_first\": \"%s\", \"algo_id\": %d, "
                                "\"tile\": %u, \"stages\": %u, \"splitk\": %d, \"reduction\": %u, \"swizzle\": %u, "
                                "\"custom\": %u, \"cluster\": %u, \"max_abs_diff\": %.3e}",
                            first ? "" : ",\n", s.name, s.N, s.K, M, t_def, tb_us, timed, cfg0, b.id, b.tile, b.stages,
                            b.splitk, b.red, b.swz, b.custom, b.cluster, dmax);
            } else {
                cublasLtMatmulHeuristicResult_t res[32];
                const int nres = heuristic_list(lt, p, res, 32);
                float t0 = -1, tbest = 1e30f, dmax = 0.0f;
                int ibest = -1;
                for (int i = 0; i < nres; i++) {
                    if (res[i].state != CUBLAS_STATUS_SUCCESS) continue;
                    const float t = time_lt(lt, p, &res[i].algo, ws, st, false);
                    if (t < 0) continue;
                    dmax = std::max(dmax, max_diff(Y, Y0, (size_t)M * s.N, ha, hb));
                    if (i == 0) t0 = t;
                    if (t < tbest) tbest = t, ibest = i;
                }
                printf("%-13s %5d %9.2f %9.2f %9.2f %5d %7d %9.2e  %.3f\n", s.name, M, t_def, t0, tbest, ibest, nres,
                       dmax, tbest / t_def);
                fflush(stdout);
                if (jf)
                    fprintf(jf, "%s{\"projection\": \"%s\", \"N\": %d, \"K\": %d, \"M\": %d, \"default_us\": %.3f, "
                                "\"lt_first_us\": %.3f, \"best_us\": %.3f, \"best_index\": %d, \"algos\": %d, "
                                "\"max_abs_diff\": %.3e}",
                            first ? "" : ",\n", s.name, s.N, s.K, M, t_def, t0, tbest, ibest, nres, dmax);
            }
            first = 0;
            cublasLtMatrixLayoutDestroy(p.la);
            cublasLtMatrixLayoutDestroy(p.lb);
            cublasLtMatrixLayoutDestroy(p.lc);
            cublasLtMatmulDescDestroy(p.op);
        }
        CK(cudaFree(W));
        CK(cudaFree(X));
        CK(cudaFree(Y));
        CK(cudaFree(Y0));
    }
    if (jf) fprintf(jf, "\n]}\n"), fclose(jf);
    return 0;
}

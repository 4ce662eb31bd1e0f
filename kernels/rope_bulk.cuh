/*
 * kernels/rope_bulk.cuh - version 7 of the fused q_norm/k_norm + RoPE: the
 * copy engine moves the rows, the threads only compute.
 *
 * Why (issue 4, docs/perf-notes.md runs 14-16): version 6 keeps its bytes in
 * flight with registers. Each thread loads one token's 32 bytes of one head,
 * waits, normalises, rotates and stores, so a byte is in flight only during
 * the load part of a thread's short life. It made 84.9% to 87.4% of copy in
 * QKV rows, at the issue's 85% line, and the guess was: too few bytes in
 * flight. (Outcome, runs 17-19: the guess was wrong. The low runs had timed
 * rows 16 bytes off alignment; aligned, version 6 makes 87.7%, within 1.4%
 * of the access pattern's own ceiling, and this version is as fast, not
 * faster. docs/05-rope.md, section 4.)
 *
 * Hopper has a bulk copy engine (the TMA unit): one thread asks it to move a
 * contiguous range of global memory to shared memory (cp.async.bulk ...
 * mbarrier::complete_tx::bytes) or back (cp.async.bulk.global.shared::cta),
 * and no register holds the data on the way. The q and k heads of one token
 * are one contiguous range of its QKV row (num_heads + num_kv_heads heads of
 * head_dim bf16; 6 KB for Qwen3-0.6B), and the token's cos/sin row is
 * another (head_dim fp32). So a block works like this:
 *
 *   warp 0, lane 0 (the producer)   warps 1..NCW (the consumers)
 *   ------------------------------  ------------------------------------
 *   for each tile of TILE tokens:   for each tile:
 *     wait until the stage's last     wait full[stage]
 *     store has read it               each group of LANES lanes takes one
 *     read the tile's positions        (token, head): sum of squares, the
 *     arm full[stage] with the         group's shuffle reduction, the
 *     tile's byte count                rotation, and the result written back
 *     bulk-load the rows and the       to the same place in shared memory
 *     cos/sin rows into the stage     fence.proxy.async (so the copy engine
 *   and once the consumers are         sees those writes), then arrive on
 *   done with a tile: bulk-store it    done[stage]
 *   to the rows it came from
 *
 * STAGES stages deep: while the consumers work on one tile, STAGES - 1
 * further tiles are on their way in and the finished ones on their way out.
 * The grid is persistent (a few blocks per SM, each looping over tiles
 * blockIdx.x, blockIdx.x + gridDim.x, ...).
 *
 * The loads and stores are exactly the token's q and k heads: the v part of
 * the row and everything outside the buffer are never written. The math is
 * version 6's (rope_fused.cuh, MATH 1: rotate x * w, then one multiply by
 * 1/rms), from the same helpers.
 *
 * Needs: 16-byte aligned rows, a token range and cos/sin row of a multiple
 * of 16 bytes, and a tile that fits shared memory; the launcher in
 * kernels/rope.cu checks this and otherwise runs version 6.
 */
#ifndef MV_KERNELS_ROPE_BULK_CUH
#define MV_KERNELS_ROPE_BULK_CUH

#include "kernels/rope_fused.cuh"

namespace rope_bulk {

using rope_fused::bf16;
using rope_fused::fvec;
using rope_fused::pack;

// ---- the PTX this needs (sm_90), one line each -----------------------------
// (Compiled for every target the Makefile names; only sm_90 and later run
// it: on older targets the kernel body below is a trap and these are unused.)
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
#define ROPE_BULK_PTX(...) asm volatile(__VA_ARGS__)
#else
#define ROPE_BULK_PTX(...) __trap()
#endif
__device__ __forceinline__ uint32_t smem_u32(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

__device__ __forceinline__ void mbar_init(uint64_t *bar, unsigned count) {
    ROPE_BULK_PTX("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(bar)), "r"(count) : "memory");
}
// Make the initialised barriers visible to the copy engine (the async proxy).
__device__ __forceinline__ void fence_barrier_init() { ROPE_BULK_PTX("fence.mbarrier_init.release.cluster;" ::: "memory"); }

// One arrival that also says how many bytes the copies will deliver.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t *bar, unsigned bytes) {
    ROPE_BULK_PTX("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t *bar) {
    ROPE_BULK_PTX("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_u32(bar)) : "memory");
}
// Wait until the barrier's phase with this parity has completed.
__device__ __forceinline__ void mbar_wait(uint64_t *bar, unsigned parity) {
    ROPE_BULK_PTX(
        "{\n"
        ".reg .pred done;\n"
        "WAIT_%=:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
        "@!done bra WAIT_%=;\n"
        "}\n" ::"r"(smem_u32(bar)),
        "r"(parity)
        : "memory");
}
// global -> shared, completing `bytes` of the barrier's transaction count.
__device__ __forceinline__ void bulk_load(void *dst, const void *src, unsigned bytes, uint64_t *bar) {
    ROPE_BULK_PTX("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                     smem_u32(dst)),
                 "l"(src), "r"(bytes), "r"(smem_u32(bar))
                 : "memory");
}
// shared -> global, tracked by bulk groups of the issuing thread.
__device__ __forceinline__ void bulk_store(void *dst, const void *src, unsigned bytes) {
    ROPE_BULK_PTX("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(dst), "r"(smem_u32(src)),
                 "r"(bytes)
                 : "memory");
}
__device__ __forceinline__ void bulk_commit() { ROPE_BULK_PTX("cp.async.bulk.commit_group;" ::: "memory"); }
// Until the issuing thread's committed stores have READ their shared memory.
__device__ __forceinline__ void bulk_wait_read_all() { ROPE_BULK_PTX("cp.async.bulk.wait_group.read 0;" ::: "memory"); }
// Until they have completed (written global memory).
__device__ __forceinline__ void bulk_wait_all() { ROPE_BULK_PTX("cp.async.bulk.wait_group 0;" ::: "memory"); }
// Order this thread's ordinary shared-memory writes before later copy-engine reads.
__device__ __forceinline__ void fence_proxy_async() { ROPE_BULK_PTX("fence.proxy.async.shared::cta;" ::: "memory"); }

// ---- the layout of a block's dynamic shared memory ---------------------------
// [full barriers x stages][done barriers x stages] padded to 128 bytes, then
// per stage: TILE token ranges of NH * D bf16, then TILE cos/sin rows of D fp32.
struct layout_t {
    int tile, stages;
    unsigned tok_bytes, cs_bytes, stage_bytes;
    size_t total;
};

static inline layout_t layout(int NH, int D, int tile, int stages) {
    layout_t L;
    L.tile = tile;
    L.stages = stages;
    L.tok_bytes = (unsigned)NH * (unsigned)D * 2u;
    L.cs_bytes = (unsigned)D * 4u;
    L.stage_bytes = (unsigned)tile * (L.tok_bytes + L.cs_bytes);
    L.total = 128 + (size_t)stages * L.stage_bytes;
    return L;
}

template <int VEC, int LANES, int NCW>
__global__ void __launch_bounds__(32 * (NCW + 1))
kernel(bf16 *qkv, long long row, const int32_t *positions, const float *cos_sin, const bf16 *q_w, const bf16 *k_w,
       int T, int H, int NH, int max_pos, float eps, layout_t L) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
    __trap();  // built for an older GPU too: the launcher never runs this there
#else
    using vec_t = pack<VEC>;
    using fvec_t = fvec<VEC>;
    constexpr int D = 2 * VEC * LANES, HALF = D / 2;
    extern __shared__ __align__(128) unsigned char sm[];
    uint64_t *full = reinterpret_cast<uint64_t *>(sm), *done = full + L.stages;
    unsigned char *stage0 = sm + 128;
    const long long ntiles = (T + (long long)L.tile - 1) / L.tile;

    if (threadIdx.x == 0) {
        for (int s = 0; s < L.stages; s++) {
            mbar_init(&full[s], 1);           // the producer's arrive.expect_tx
            mbar_init(&done[s], NCW * 32);    // every consumer thread
        }
        fence_barrier_init();
    }
    __syncthreads();

    if (threadIdx.x < 32) {
        // ---- the producer warp: lane r < TILE handles token r of a tile ----
        const int lane = threadIdx.x;
        long long it = 0, stored = 0;  // tiles loaded / tiles stored by this block
        auto store_one = [&]() {      // wait for the consumers of tile `stored`, then store it
            const int s = (int)(stored % L.stages);
            const long long t0 = (blockIdx.x + stored * gridDim.x) * (long long)L.tile;
            const int n = (int)(T - t0 < L.tile ? T - t0 : L.tile);
            mbar_wait(&done[s], (unsigned)((stored / L.stages) & 1));
            if (lane < n)
                bulk_store(qkv + (t0 + lane) * row, stage0 + (size_t)s * L.stage_bytes + (size_t)lane * L.tok_bytes,
                           L.tok_bytes);
            bulk_commit();
            stored++;
        };
        for (long long j = blockIdx.x; j < ntiles; j += gridDim.x, it++) {
            const int s = (int)(it % L.stages);
            if (it >= L.stages) {
                // The stage still holds tile it - stages: store it, and wait
                // until the copy engine has read it before loading over it.
                store_one();
                bulk_wait_read_all();
            }
            __syncwarp();
            const long long t0 = j * L.tile;
            const int n = (int)(T - t0 < L.tile ? T - t0 : L.tile);
            unsigned char *st = stage0 + (size_t)s * L.stage_bytes;
            if (lane == 0) mbar_arrive_expect_tx(&full[s], (unsigned)n * (L.tok_bytes + L.cs_bytes));
            __syncwarp();
            if (lane < n) {
                const int p = positions[t0 + lane];
                rope_fused::check_pos(p, max_pos);
                bulk_load(st + (size_t)lane * L.tok_bytes, qkv + (t0 + lane) * row, L.tok_bytes, &full[s]);
                bulk_load(st + (size_t)L.tile * L.tok_bytes + (size_t)lane * L.cs_bytes, cos_sin + (long long)p * D,
                          L.cs_bytes, &full[s]);
            }
        }
        while (stored < it) store_one();
        bulk_wait_all();  // every store has written global memory before the block ends
        return;
    }

    // ---- the consumer warps: group g of LANES lanes takes (token, head) items ----
    const int ctid = threadIdx.x - 32, lane = ctid % LANES, g = ctid / LANES;
    constexpr int G = NCW * 32 / LANES;
    const unsigned mask = LANES == 32 ? 0xffffffffu : (((1u << LANES) - 1u) << ((ctid % 32) - lane));
    const vec_t qa = reinterpret_cast<const vec_t *>(q_w)[lane], qb = reinterpret_cast<const vec_t *>(q_w + HALF)[lane];
    const vec_t ka = reinterpret_cast<const vec_t *>(k_w)[lane], kb = reinterpret_cast<const vec_t *>(k_w + HALF)[lane];
    long long it = 0;
    for (long long j = blockIdx.x; j < ntiles; j += gridDim.x, it++) {
        const int s = (int)(it % L.stages);
        const long long t0 = j * L.tile;
        const int n = (int)(T - t0 < L.tile ? T - t0 : L.tile);
        unsigned char *st = stage0 + (size_t)s * L.stage_bytes;
        const float *cs_rows = reinterpret_cast<const float *>(st + (size_t)L.tile * L.tok_bytes);
        mbar_wait(&full[s], (unsigned)((it / L.stages) & 1));
        for (int gi = g; gi < n * NH; gi += G) {
            const int r = gi / NH, h = gi - r * NH;
            bf16 *head = reinterpret_cast<bf16 *>(st + (size_t)r * L.tok_bytes) + (size_t)h * D;
            const vec_t x1 = reinterpret_cast<const vec_t *>(head)[lane];
            const vec_t x2 = reinterpret_cast<const vec_t *>(head + HALF)[lane];
            const fvec_t c = reinterpret_cast<const fvec_t *>(cs_rows + (size_t)r * D)[lane];
            const fvec_t sn = reinterpret_cast<const fvec_t *>(cs_rows + (size_t)r * D + HALF)[lane];
            const bool is_q = h < H;
            const vec_t wa = is_q ? qa : ka, wb = is_q ? qb : kb;
            float ss = 0.0f;
#pragma unroll
            for (int e = 0; e < VEC; e++) {
                const float a = rope_fused::get(x1, e), b = rope_fused::get(x2, e);
                ss += a * a + b * b;
            }
            float o1[VEC], o2[VEC];
            rope_fused::rotate_scaled<VEC>(x1, x2, wa, wb, c.v, sn.v, o1, o2);  // before the reduction
            const float inv_rms = group_inv_rms<LANES>(ss, mask, D, eps);
#pragma unroll
            for (int e = 0; e < VEC; e++) o1[e] *= inv_rms, o2[e] *= inv_rms;
            reinterpret_cast<vec_t *>(head)[lane] = rope_fused::put<VEC>(o1);
            reinterpret_cast<vec_t *>(head + HALF)[lane] = rope_fused::put<VEC>(o2);
        }
        fence_proxy_async();  // these writes, before the copy engine reads the stage
        mbar_arrive(&done[s]);
    }
#endif
}

// Enqueue version 7 on the QKV rows. Returns 1 (nothing launched) when the
// rows or the shared memory do not allow it; the caller then runs version 6.
template <int VEC, int LANES, int NCW>
static inline int launch(bf16 *qkv, long long row, const int32_t *pos, const float *cs, const bf16 *qw, const bf16 *kw,
                         int T, int H, int Hkv, int max_pos, float eps, int tile_bytes, int stages, int blocks_per_sm,
                         int num_sms, cudaStream_t s) {
    constexpr int D = 2 * VEC * LANES;
    const int NH = H + Hkv;
    const unsigned tok_bytes = (unsigned)NH * D * 2u;
    if (((uintptr_t)qkv % 16) || ((row * 2) % 16) || (tok_bytes % 16) || ((uintptr_t)cs % 16) || ((D * 4) % 16))
        return 1;
    int tile = tile_bytes / (int)tok_bytes;
    if (tile < 1) tile = 1;
    if (tile > 32) tile = 32;  // one producer lane per token of a tile
    if (stages < 2) stages = 2;
    if (stages > 8) stages = 8;  // 2 * 8 barriers of 8 bytes: the 128 bytes before the stages
    const layout_t L = layout(NH, D, tile, stages);
    // The shared-memory limit of this device, and the dynamic size this
    // kernel is allowed, asked once per device (not on every launch).
    constexpr int MAX_DEV = 64;
    static int smem_max[MAX_DEV], allowed[MAX_DEV];
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= MAX_DEV) return (void)cudaGetLastError(), 1;
    if (!smem_max[dev] &&
        cudaDeviceGetAttribute(&smem_max[dev], cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess)
        return (void)cudaGetLastError(), 1;
    static int major[MAX_DEV];
    if (!major[dev] && cudaDeviceGetAttribute(&major[dev], cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess)
        return (void)cudaGetLastError(), 1;
    if (major[dev] < 9 || L.total > (size_t)smem_max[dev]) return 1;  // the copy engine's bulk copies: sm_90
    auto fn = kernel<VEC, LANES, NCW>;
    if ((size_t)allowed[dev] < L.total) {
        if (cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)L.total) != cudaSuccess)
            return (void)cudaGetLastError(), 1;  // clear it: the caller falls back to version 6
        allowed[dev] = (int)L.total;
    }
    const long long ntiles = (T + (long long)tile - 1) / tile;
    long long grid = (long long)blocks_per_sm * num_sms;
    if (grid > ntiles) grid = ntiles;
    fn<<<(unsigned)grid, 32 * (NCW + 1), L.total, s>>>(qkv, row, pos, cs, qw, kw, T, H, NH, max_pos, eps, L);
    return 0;
}

}  // namespace rope_bulk

#endif

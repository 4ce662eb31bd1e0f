/*
 * kernels/kv_store.cu - the store step of the paged KV cache (see kv_store.h).
 *
 * Napkin math, per stored token of Qwen3-0.6B (8 kv heads, D = 128): K and
 * V rows of 1024 bf16 each, read once and written once: 2 * 2 KB * 2 =
 * 8 KB, plus a 4-byte slot id. No arithmetic at all: a gather-free scatter
 * copy, judged against the copy bandwidth. A token's row lands contiguously
 * in its slot (Hkv * D elements), so writes are as coalesced as reads.
 */
#include "kernels/kv_store.h"
#include "kernels/versions.h"

#include "common/check.h"
#include "kernels/common.cuh"
#include "reference/kv_store.h"

typedef __nv_bfloat16 bf16;

// A slot outside [-1, num_slots): the host check (kv_store_validate_slots)
// was skipped. Stop loudly instead of writing outside the cache.
__device__ __forceinline__ void check_slot(int slot, long long num_slots) {
    if (slot < -1 || (long long)slot >= num_slots) __trap();
}

// ---- version 1: naive -------------------------------------------------------------
// One thread per element e of token t's row (row = Hkv * D elements); a
// division finds t and e; 2-byte accesses.
__global__ void store_kvcache_kernel_v1(const bf16 *k, long long k_stride, const bf16 *v, long long v_stride,
                                        bf16 *k_cache, bf16 *v_cache, const int32_t *slot_mapping, int T,
                                        int row, long long num_slots) {
    const long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (long long)T * row) return;
    const long long t = idx / row;
    const int e = (int)(idx % row);
    const int slot = slot_mapping[t];
    check_slot(slot, num_slots);
    if (slot == -1) return;  // already cached: leave the slot alone
    k_cache[(long long)slot * row + e] = k[t * k_stride + e];
    v_cache[(long long)slot * row + e] = v[t * v_stride + e];
}

// ---- version 2: fast --------------------------------------------------------------
// Warp per token (threadIdx.y picks the token of the block). Lane l copies
// vectors l, l + 32, l + 64, ... of the row; CACHE of them for K and CACHE
// for V are loaded before any is stored, so a Qwen3 row (128 vectors of 16
// bytes) is one round of 8 loads in flight per lane. A skipped token's warp
// leaves at once: its whole row, K and V, is left untouched.
template <int VEC, int CACHE>
__global__ void __launch_bounds__(256)
store_kvcache_kernel_v2(const bf16 *k, long long k_stride, const bf16 *v, long long v_stride, bf16 *k_cache,
                        bf16 *v_cache, const int32_t *slot_mapping, int T, int row, long long num_slots) {
    pdl_launch_dependents();
    pdl_wait();  // every read below is of activations (kernels/common.cuh: PDL)
    using vec_t = bf16_vec<VEC>;
    const long long t = (long long)blockIdx.x * blockDim.y + threadIdx.y;
    if (t >= T) return;
    const int slot = slot_mapping[t];
    check_slot(slot, num_slots);
    if (slot == -1) return;
    const int nvec = row / VEC;
    const vec_t *ks = reinterpret_cast<const vec_t *>(k + t * k_stride);
    const vec_t *vs = reinterpret_cast<const vec_t *>(v + t * v_stride);
    vec_t *kd = reinterpret_cast<vec_t *>(k_cache + (long long)slot * row);
    vec_t *vd = reinterpret_cast<vec_t *>(v_cache + (long long)slot * row);
    for (int base = threadIdx.x; base < nvec; base += 32 * CACHE) {
        vec_t a[CACHE], b[CACHE];
#pragma unroll
        for (int c = 0; c < CACHE; c++) {
            const int i = base + c * 32;
            if (i < nvec) {
                a[c] = ks[i];
                b[c] = vs[i];
            }
        }
#pragma unroll
        for (int c = 0; c < CACHE; c++) {
            const int i = base + c * 32;
            if (i < nvec) {
                kd[i] = a[c];
                vd[i] = b[c];
            }
        }
    }
}

// ---- launchers -----------------------------------------------------------------------

// The widest vector (8, 4, 2 or 1 bf16) that divides the row and both
// strides, with all four pointers aligned to it (then every row and slot
// offset is aligned too).
static int pick_vec(int row, long long k_stride, long long v_stride, const void *k, const void *v,
                    const void *kc, const void *vc) {
    for (int vec = 8; vec > 1; vec /= 2) {
        if (row % vec || k_stride % vec || v_stride % vec) continue;
        if (!mv_aligned(k, 2 * vec) || !mv_aligned(v, 2 * vec) || !mv_aligned(kc, 2 * vec) ||
            !mv_aligned(vc, 2 * vec))
            continue;
        return vec;
    }
    return 1;
}

template <int VEC>
static void launch_v2(const bf16 *k, long long ks, const bf16 *v, long long vs, bf16 *kc, bf16 *vc,
                      const int32_t *slots, int T, int row, long long num_slots, cudaStream_t s) {
    const int tokens_per_block = 8;  // 8 warps, 256 threads
    dim3 block(32, tokens_per_block);
    dim3 grid((unsigned)((T + tokens_per_block - 1) / tokens_per_block));
    mv_launch(store_kvcache_kernel_v2<VEC, 4>, grid, block, 0, s, k, ks, v, vs, kc, vc, slots, T, row, num_slots);
}

extern "C" const char *kv_store_version_name(int version) {
    return kernel_version_name(KV_STORE_VERSION_TABLE, version);  // kernels/versions.h
}

extern "C" int store_kvcache_cuda(int version, const bf16_t *d_k, long long k_stride, const bf16_t *d_v,
                                  long long v_stride, bf16_t *d_k_cache, bf16_t *d_v_cache,
                                  const int32_t *d_slot_mapping, int T, int num_kv_heads, int head_dim,
                                  int block_size, int num_blocks, cudaStream_t stream) {
    if (version < 1 || version > KV_STORE_NUM_VERSIONS)
        return mv_error("store_kvcache_cuda: unknown version %d (1..%d)", version, KV_STORE_NUM_VERSIONS);
    if (kv_store_validate(T, num_kv_heads, head_dim, k_stride, v_stride, block_size, num_blocks)) return -1;
    if (T == 0) return 0;
    if (!d_k || !d_v || !d_k_cache || !d_v_cache || !d_slot_mapping)
        return mv_error("store_kvcache_cuda: null pointer for a non-empty tensor");
    if (d_k_cache == d_v_cache) return mv_error("store_kvcache_cuda: the K and V caches must be different buffers");
    const bf16 *k = (const bf16 *)d_k, *v = (const bf16 *)d_v;
    bf16 *kc = (bf16 *)d_k_cache, *vc = (bf16 *)d_v_cache;
    const int row = num_kv_heads * head_dim;
    const long long num_slots = (long long)num_blocks * block_size;
    if (version == 1) {
        const long long n = (long long)T * row;
        store_kvcache_kernel_v1<<<(unsigned)((n + 255) / 256), 256, 0, stream>>>(
            k, k_stride, v, v_stride, kc, vc, d_slot_mapping, T, row, num_slots);
    } else {
        switch (pick_vec(row, k_stride, v_stride, k, v, kc, vc)) {
        case 8: launch_v2<8>(k, k_stride, v, v_stride, kc, vc, d_slot_mapping, T, row, num_slots, stream); break;
        case 4: launch_v2<4>(k, k_stride, v, v_stride, kc, vc, d_slot_mapping, T, row, num_slots, stream); break;
        case 2: launch_v2<2>(k, k_stride, v, v_stride, kc, vc, d_slot_mapping, T, row, num_slots, stream); break;
        default: launch_v2<1>(k, k_stride, v, v_stride, kc, vc, d_slot_mapping, T, row, num_slots, stream); break;
        }
    }
    return CUDA_TRY(cudaGetLastError());
}

/*
 * kernels/decode_rope_prep.cuh - q/k norm, RoPE and the KV store inside a
 * decode attention piece: a Prep for decode_piece_v2
 * (kernels/attention_decode.cuh), used by the decode megakernel
 * (kernels/decode_megakernel.cu, its default) and by decode attention with
 * the store (attention_decode_rope_cuda, kernels/attention.h).
 *
 * Without it a decode layer runs, between the qkv projection and attention,
 * qk_norm_rope_store_cuda (chapter 06): it reads every row's q and k heads,
 * norms and rotates them, writes them back, and copies k and v into the
 * paged cache; attention then reads the queries again. With it the piece
 * that reads a row's queries norms and rotates them itself (G heads of D
 * values, a few hundred FLOPs, done again by each piece of the row), and
 * the piece that holds the row's last key (the new token's) computes that
 * key the same way, stores it and its value into the cache, and meets its
 * threads before it reads any key. No other piece reads that key, so
 * nothing else waits for the store; this needs one CTA to cover all of a kv
 * head's query heads (groups_per_kv 1), or a second CTA of the head would
 * read the key before it is stored.
 *
 * The arithmetic is qk_norm_rope version 6's, lane for lane (norm_rotate
 * below: MATH 1, rotate then scale; chapter 05), so the queries, the key
 * and the value are the bits of qk_norm_rope_store_cuda and the output is
 * the bits of that kernel followed by decode attention. In a piece a lane
 * holds dims part*8 .. part*8 + 7 of a head (LPK = D / 8 lanes a head):
 * lane part % (LPK / 2) of the first half is version 6's lane, and the lane
 * of the same dims in the second half computes the same sum of squares,
 * the same group sum over its own LPK / 2 lanes, and takes the rotation's
 * second output.
 *
 * Include after kernels/rope_fused.cuh, kernels/rmsnorm.cuh,
 * kernels/paged_kv.cuh and kernels/attention_decode.cuh.
 */
#pragma once

// One lane's 8 + 8 values of a head (x1 in the first half, x2 in the
// second), normed over the LANES lanes of `mask` with weight (wa, wb) and
// rotated by (cs, sn), in qk_norm_rope version 6's order (MATH 1: rotate,
// then scale): o1 and o2.
template <int LANES>
__device__ __forceinline__ void norm_rotate(const rope_fused::pack<8> &x1, const rope_fused::pack<8> &x2,
                                            const rope_fused::pack<8> &wa, const rope_fused::pack<8> &wb,
                                            const rope_fused::fvec<8> &cs, const rope_fused::fvec<8> &sn,
                                            unsigned mask, float eps, float (&o1)[8], float (&o2)[8]) {
    using namespace rope_fused;
    constexpr int VEC = 8, D = 2 * VEC * LANES;
    float ss = 0.0f;
#pragma unroll
    for (int e = 0; e < VEC; e++) {
        const float x = get(x1, e), y = get(x2, e);
        ss += x * x + y * y;
    }
    const float inv_rms = group_inv_rms<LANES>(ss, mask, D, eps);
    float co[VEC], si[VEC];
#pragma unroll
    for (int e = 0; e < VEC; e++) co[e] = cs.v[e], si[e] = sn.v[e];
    rotate_scaled<VEC>(x1, x2, wa, wb, co, si, o1, o2);
#pragma unroll
    for (int e = 0; e < VEC; e++) o1[e] *= inv_rms, o2[e] *= inv_rms;
}

// 16 bytes through L2 only: the QKV row was written by an earlier kernel,
// or earlier in the same persistent kernel (the read-only path could hold a
// stale line there).
__device__ __forceinline__ uint4 dec_ldcg16(const __nv_bfloat16 *p) {
    return __ldcg(reinterpret_cast<const uint4 *>(p));
}

// What the Prep reads, from its Src (the megakernel's params and layer, or
// attention_decode_rope_cuda's arguments):
//   positions(), slot_mapping()   [rows] int32; slot -1: a padding row, left alone
//   cos_sin()                     [max_position, D] fp32 (rope_cache_gpu_t), 32-byte aligned
//   q_norm(), k_norm()            [D] bf16, 16-byte aligned
//   k_cache(), v_cache()          [num_slots, Hkv, D] bf16
//   qkv(), qkv_stride()           the QKV rows [rows, qkv_stride] (what begin's q points into)
//   qn()                          q's columns in a QKV row (num_heads * D): k starts there, v Hkv * D later
//   num_kv_heads(), num_slots(), max_position(), eps()
//   mark(k)                       a point reached (0 begun, 1 queries ready; 2 and 3 from the piece)
template <int D, class Src>
struct dec_prep_rope {
    static constexpr int VEC = 8, LANES = D / 16, HALF = D / 2;
    using vec_t = rope_fused::pack<VEC>;
    using fvec_t = rope_fused::fvec<VEC>;
    Src src;

    __device__ __forceinline__ void mark(int k) const { src.mark(k); }

    // A head's two halves as version 6's lane (part % LANES) reads them.
    struct raw {
        vec_t x1, x2;
    };
    static __device__ __forceinline__ raw load(const __nv_bfloat16 *head, int part) {
        const int lane = part % LANES;
        uint4 r1 = dec_ldcg16(head + lane * VEC), r2 = dec_ldcg16(head + HALF + lane * VEC);
        return {*reinterpret_cast<const vec_t *>(&r1), *reinterpret_cast<const vec_t *>(&r2)};
    }
    // The head normed with w and rotated by (cs, sn): this lane's 8 dims.
    __device__ __forceinline__ vec_t norm_rope(const raw &x, const __nv_bfloat16 *w, const fvec_t &cs,
                                               const fvec_t &sn, int part) const {
        using namespace rope_fused;
        const int lane = part % LANES;
        const vec_t wa = reinterpret_cast<const vec_t *>(w)[lane];
        const vec_t wb = reinterpret_cast<const vec_t *>(w + HALF)[lane];
        float o1[VEC], o2[VEC];
        norm_rotate<LANES>(x.x1, x.x2, wa, wb, cs, sn, 0xffffffffu, src.eps(), o1, o2);
        return part < LANES ? put<VEC>(o1) : put<VEC>(o2);
    }

    // Every load first (the queries, and in the last piece warp 0's key,
    // value and slot), then the cos/sin row of the position, then the math:
    // two trips to L2 before the keys. Warp 0 of the last piece computes its
    // kv head's new key (both substreams the same lanes' values); its first
    // D / 8 lanes store key and value, 16 bytes each, as version 6's store
    // does (slot -1: a padding row, left alone). q: src.qkv(), raw.
    template <int DD, int G, class Ld>
    __device__ __forceinline__ bool begin(float (&qf)[G][8], const __nv_bfloat16 *q, long long q_stride, int s,
                                          int h0, int kvh, int part, int tid, bool last, float scale_log2) const {
        static_assert(DD == D, "one head size");
        mark(0);
        const int pos = src.positions()[s], nkv = src.num_kv_heads();
        raw xq[G];
#pragma unroll
        for (int g = 0; g < G; g++) xq[g] = load(q + (long long)s * q_stride + (long long)(h0 + g) * D, part);
        const bool key = last && tid < 32;
        const __nv_bfloat16 *khead = src.qkv() + (long long)s * src.qkv_stride() + src.qn() + kvh * D;
        raw xk = {};
        uint4 v = make_uint4(0, 0, 0, 0);
        int slot = -1;
        if (key) {
            xk = load(khead, part);
            v = dec_ldcg16(khead + nkv * D + part * 8);
            slot = src.slot_mapping()[s];
        }
        rope_fused::check_pos(pos, src.max_position());
        const int lane = part % LANES;
        const fvec_t cs = reinterpret_cast<const fvec_t *>(src.cos_sin() + (long long)pos * D)[lane];
        const fvec_t sn = reinterpret_cast<const fvec_t *>(src.cos_sin() + (long long)pos * D + HALF)[lane];
#pragma unroll
        for (int g = 0; g < G; g++) {
            const vec_t y = norm_rope(xq[g], src.q_norm(), cs, sn, part);
            bf16x8_to_float(*reinterpret_cast<const uint4 *>(&y), qf[g]);
#pragma unroll
            for (int e = 0; e < 8; e++) qf[g][e] *= scale_log2;
        }
        mark(1);
        if (!last) return false;
        if (key) {
            const vec_t y = norm_rope(xk, src.k_norm(), cs, sn, part);
            rope_fused::check_store_slot(slot, src.num_slots());
            if (tid < D / 8 && slot >= 0) {
                const long long at = (long long)slot * nkv * D + (long long)kvh * D + part * 8;
                *reinterpret_cast<vec_t *>(src.k_cache() + at) = y;
                *reinterpret_cast<uint4 *>(src.v_cache() + at) = v;
            }
        }
        return true;
    }
};

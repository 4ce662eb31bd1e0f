/*
 * kernels/attention_flash.cuh - version 2 of prefill attention (included by
 * attention.cu). Not written yet.
 */
#pragma once

template <class KV>
static int launch_flash(bf16 *out, const bf16 *q, long long q_stride, KV kv, const int32_t *cu_seqlens_q,
                        int num_seqs, int max_seqlen_q, int H, int Hkv, int D, float scale, cudaStream_t stream) {
    (void)out; (void)q; (void)q_stride; (void)kv; (void)cu_seqlens_q; (void)num_seqs; (void)max_seqlen_q; (void)H;
    (void)Hkv; (void)D; (void)scale; (void)stream;
    return mv_error("attention_prefill_cuda: version 2 is not written yet");
}

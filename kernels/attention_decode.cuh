/*
 * kernels/attention_decode.cuh - version 2 of decode attention (included by
 * attention.cu, which defines PagedKV and seq_queries). Not written yet.
 */
#pragma once

// How many pieces each sequence's context is cut into (see attention.h).
static int decode_num_splits(int num_seqs, int num_kv_heads, int max_context_len, int block_size, int num_sms) {
    (void)num_seqs; (void)num_kv_heads; (void)max_context_len; (void)block_size; (void)num_sms;
    return 1;
}

static int launch_decode_v2(bf16 *out, const bf16 *q, long long q_stride, PagedKV kv, int num_seqs,
                            int max_context_len, int H, int Hkv, int D, float scale, int num_splits, float *workspace,
                            cudaStream_t stream) {
    (void)out; (void)q; (void)q_stride; (void)kv; (void)num_seqs; (void)max_context_len; (void)H; (void)Hkv;
    (void)D; (void)scale; (void)num_splits; (void)workspace; (void)stream;
    return mv_error("attention_decode_cuda: version 2 is not written yet");
}

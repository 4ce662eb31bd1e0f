/*
 * kernels/pdl.h - turning programmatic dependent launch on and off (C API).
 *
 * The decode-path kernels (the GEMV, RMSNorm, the fused q/k-norm + RoPE, the
 * KV store, decode attention, SiLU-and-mul, the embedding and gather, the
 * sampler) are launched through mv_launch (kernels/common.cuh). While PDL is
 * on, each of those launches carries the attribute
 * cudaLaunchAttributeProgrammaticStreamSerialization, so a kernel can become
 * resident and start its weight loads while the one before it still runs;
 * inside, it waits (griddepcontrol.wait) before it touches an activation. The
 * results are the same bits either way; only the gaps between kernels change.
 *
 * The engine turns it on while it captures its decode CUDA graphs and off
 * again after (chapters/09-engine/runtime/runner_cuda.c), and moves the
 * graphs' programmatic edges to the upstream kernel's launch-completion port
 * (unless MV_PDL_EARLY=0). Off by default.
 */
#ifndef MV_KERNELS_PDL_H
#define MV_KERNELS_PDL_H

#ifdef __cplusplus
extern "C" {
#endif

// 1 when the current device can take the attribute (compute capability 9.0
// or newer), else 0.
int mv_pdl_supported(void);
// Turn PDL on (1) or off (0) for the launches that follow, on this host
// thread. Turning it on where mv_pdl_supported() is 0 is refused: -1 with
// mv_error().
int mv_pdl_set(int on);
int mv_pdl_enabled(void);

#ifdef __cplusplus
}
#endif

#endif

#!/usr/bin/env bash
# tests/gpu/rope_sweep.sh - build and run chapter 05's fused q/k-norm + RoPE sweep
# (tests/gpu/rope_sweep.cu) on the GPU machine, from the repo root, after
#   make -j16 DEPS_PREFIX=/opt/deps CUDA_ARCH=90
# built build/lib/libmv_core.a. Output: two tables (T =
# 32768, T = 8192) sorted by time; also saved to $OUT/rope_sweep.txt when
# OUT is set.
set -euo pipefail
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
NVCC=${NVCC:-$(command -v nvcc || echo $CUDA_HOME/bin/nvcc)}
lib=build/lib/libmv_core.a
[ -f $lib ] || { echo "rope_sweep.sh: $lib missing: run make -j16 DEPS_PREFIX=/opt/deps CUDA_ARCH=90 first"; exit 1; }
# NCCL: the same test as the Makefile's (common/check.c then calls it).
nccl=
printf '#include <nccl.h>\n' | gcc -E -x c -I$CUDA_HOME/include - >/dev/null 2>&1 && nccl=-lnccl
t0=$(date +%s)
"$NVCC" -O3 -std=c++17 -arch=sm_90 -lineinfo -I. -DMV_HAVE_CUDA=1 -DMV_HAVE_NCCL=0 \
  tests/gpu/rope_sweep.cu $lib \
  -L$CUDA_HOME/lib64 -Xlinker -rpath,$CUDA_HOME/lib64 -lcublas $nccl -o build/rope_sweep
echo "rope_sweep: built in $(( $(date +%s) - t0 )) s"
if [ -n "${OUT:-}" ]; then
  mkdir -p "$OUT"
  ./build/rope_sweep "$@" | tee "$OUT/rope_sweep.txt"
else
  ./build/rope_sweep "$@"
fi

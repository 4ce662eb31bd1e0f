#!/usr/bin/env bash
# tests/gpu/step_kernels.sh - one decode step's kernels at 256 and 64 rows, on the GPU machine.
#
# One call of the lab's `device` tool runs this on an H200 machine, after the build
# (`make -j16 DEPS_PREFIX=/opt/deps CUDA_ARCH=90 build/minivllm`):
#   MV_COMMIT=<commit> bash tests/gpu/step_kernels.sh
# For each batch B of BATCHES (default "256 64"): Nsight Compute's gpu__time_duration of every
# kernel of `minivllm bench --latency --batch B --prompt-len 16 --output-len 3 --enforce-eager`
# (eager, so each kernel is its own launch; 16-token prompts, so attention has almost nothing to
# read), then tests/gpu/step_kernels.py cuts out the last decode step and groups its kernels.
# Leaves $OUT/09-engine.step-kernels.json (chapter 09's table "Where a decode step of 64 and
# 256 rows goes") and, in $OUT/step_kernels.tgz, the ncu logs. About 15 s a batch on an H200.
set -uo pipefail
FINAL_OUT=${OUT:-/tmp/mv-out}
OUT=$(mktemp -d)
mkdir -p "$FINAL_OUT"
trap 'tar czf "$FINAL_OUT/step_kernels.tgz" -C "$OUT" .' EXIT
export LD_LIBRARY_PATH=/opt/deps/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
[ -x ./build/minivllm ] || { echo "step_kernels.sh: build/minivllm not built"; exit 1; }
[ -n "$NCU" ] || { echo "step_kernels.sh: no ncu"; exit 1; }
args=()
for b in ${BATCHES:-256 64}; do
  timeout 150 "$NCU" --clock-control none --metrics gpu__time_duration.sum --csv --page raw --log-file "$OUT/ncu.$b.log" \
    ./build/minivllm bench --random-weights --model tests/data/qwen3-0.6b-shape --device cuda --latency --batch "$b" \
    --prompt-len 16 --output-len 3 --repeat 1 --no-warmup --enforce-eager --max-num-seqs 256 > "$OUT/ncu.$b.out" 2>&1 \
    || { echo "step_kernels.sh: ncu at batch $b failed"; tail -5 "$OUT/ncu.$b.out"; exit 1; }
  args+=(--batch "$b" --log "$OUT/ncu.$b.log")
done
python3 tests/gpu/step_kernels.py "${args[@]}" --commit "${MV_COMMIT:-unknown}" --date "$(date -u +%F)" \
  --gpu "$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)" \
  --command "ncu --clock-control none --metrics gpu__time_duration.sum --csv --page raw ./build/minivllm bench --random-weights --model tests/data/qwen3-0.6b-shape --device cuda --latency --batch B --prompt-len 16 --output-len 3 --repeat 1 --no-warmup --enforce-eager --max-num-seqs 256" \
  --out "$FINAL_OUT/09-engine.step-kernels.json"

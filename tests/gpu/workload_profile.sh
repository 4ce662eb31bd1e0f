#!/usr/bin/env bash
# tests/gpu/workload_profile.sh - where nano-vllm's workload spends its time, on the GPU machine.
#
# One call of the lab's `device` tool runs this on an H200 machine:
#   bash tests/gpu/workload_profile.sh
# It builds for sm_90, then:
#   1. the workload (tests/bench/nanovllm_workload.py), greedy, one timed run with
#      `minivllm bench --step-trace`: every step's rows, tokens, context and microseconds
#   2. PROFILE=1 (off by default: slow): Nsight Compute's duration of every kernel of one
#      latency-mode run (PROFILE_BATCH requests of PROFILE_PROMPT tokens, 3 tokens each: their
#      prefill steps and two decode steps), kernels one at a time, the clocks left alone. On an
#      H200 it took 3-4 s a step and 2 minutes to capture the decode graphs (docs/perf-notes.md,
#      run 44): set PROFILE_S, and prefer the step trace.
#   3. PROBE=1 (default): tests/gpu/racecheck_probe.sh
# Leaves everything in one archive, $OUT/workload_profile.tgz (the device tool brings back only
# a few files): workload.trace.csv, workload.json, ncu.csv, racecheck_probe.*.log, run.log.
set -uo pipefail
FINAL_OUT=${OUT:-/tmp/mv-out}
OUT=$(mktemp -d)
mkdir -p "$FINAL_OUT"
exec > >(tee "$OUT/run.log") 2>&1
trap 'tar czf "$FINAL_OUT/workload_profile.tgz" -C "$OUT" .' EXIT
mkdir -p /opt/deps
for f in .deps/*.deb; do [ -f "$f" ] && dpkg -x "$f" /opt/deps; done
export LD_LIBRARY_PATH=/opt/deps/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export MV_COMMIT=${MV_COMMIT:-}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
T0=$(date +%s)
make -j16 DEPS_PREFIX=/opt/deps CUDA_ARCH=90 build/minivllm > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; echo BUILD FAILED; exit 1; }
echo "built in $(( $(date +%s) - T0 )) s"
status=0
model=(--random-weights --model tests/data/qwen3-0.6b-shape --device cuda)

WORK=/tmp/nanovllm_workload.jsonl
python3 tests/bench/nanovllm_workload.py --out "$WORK" || { echo "no workload"; exit 1; }
echo "=================== the workload, greedy, with --step-trace"
timeout 120 ./build/minivllm bench "${model[@]}" --input "$WORK" --sampling greedy --repeat 1 \
  --step-trace "$OUT/workload.trace.csv" --json "$OUT/workload.json" 2>&1 | grep -E "output tok/s|steps|rror" || status=1
echo "$(($(wc -l < "$OUT/workload.trace.csv") - 1)) steps traced"

if [ "${PROFILE:-0}" = 1 ]; then
  B=${PROFILE_BATCH:-128} P=${PROFILE_PROMPT:-1024}
  echo "=================== ncu: $B x $P, 3 tokens each"
  NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  T1=$(date +%s)
  timeout "${PROFILE_S:-240}" "$NCU" --clock-control none --graph-profiling node --metrics gpu__time_duration.sum \
    --csv --page raw --log-file "$OUT/ncu.log" \
    ./build/minivllm bench "${model[@]}" --latency --batch "$B" --prompt-len "$P" --output-len 3 --repeat 1 \
    --no-warmup --step-trace "$OUT/ncu.trace.csv" > "$OUT/ncu.csv" 2> "$OUT/ncu.err" || status=1
  echo "ncu: $(wc -l < "$OUT/ncu.csv") lines in $(( $(date +%s) - T1 )) s"; tail -3 "$OUT/ncu.err"
fi

if [ "${PROBE:-1}" = 1 ]; then
  echo "=================== tests/gpu/racecheck_probe.sh"
  OUT="$OUT" timeout 300 bash tests/gpu/racecheck_probe.sh || status=1
fi
exit $status

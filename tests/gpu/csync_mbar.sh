#!/usr/bin/env bash
# tests/gpu/csync_mbar.sh - chapter 09's exercise 12, measured: the decode megakernel with its consumers'
# barrier as named barrier 1 (`bar.sync 1, 256`, the default) against an mbarrier of 256 arrivals
# (kernels/decode_megakernel.cu built with -DMV_MK_CSYNC_MBAR). Both binaries are built elsewhere and
# carried: build/minivllm and build/engine_check (the default), build/minivllm-mbar and
# build/engine_check-mbar. It runs:
#   1. build/engine_check-mbar --device cuda (the variant bit for bit against the unfused kernels)
#   2. one stream (512 + 256) with each, alternated, two rounds (09-engine.csync-{named,mbar}.single.R.json)
#   3. compute-sanitizer racecheck over the variant: Qwen3-0.6B's shapes at one row and max_model_len 4096
#      (the run whose racecheck reports 5 hazards with the named barrier), then tiny-qwen3-mha at 4 rows
# Knobs: SKIP_CHECK=1 (no step 1), ROUNDS (step 2's rounds, 2), SKIP_TINY=1 (step 3's split run only),
# CHECK_S / SAN_S (time limits). Leaves its output under $OUT (run.log, engine_check.mbar.txt, the JSON,
# the sanitizer logs).
set -uo pipefail
. tests/gpu/gpu_env.sh  # $OUT, run.log, .deps, LD_LIBRARY_PATH, MV_COMMIT
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
model=(--random-weights --model tests/data/qwen3-0.6b-shape --device cuda)
status=0
if [ "${SKIP_CHECK:-0}" != 1 ]; then
  echo "=================== build/engine_check-mbar --device cuda"
  timeout "${CHECK_S:-200}" ./build/engine_check-mbar --device cuda > "$OUT/engine_check.mbar.txt" 2>&1
  rc=$?; [ $rc -eq 0 ] || status=1
  echo "engine_check-mbar rc=$rc: $(grep -c '^PASS' "$OUT/engine_check.mbar.txt") PASS, $(grep -c '^FAIL' "$OUT/engine_check.mbar.txt") FAIL"
  grep -E '^FAIL' "$OUT/engine_check.mbar.txt" | head -5
fi
for round in $(seq 1 "${ROUNDS:-2}"); do
  for v in named mbar; do
    bin=./build/minivllm; [ "$v" = mbar ] && bin=./build/minivllm-mbar
    echo "=================== one stream, $v (round $round)"
    timeout 90 "$bin" bench "${model[@]}" --num-seqs 1 --prompt-len 512 --output-len 256 --repeat 3 \
      --json "$OUT/09-engine.csync-$v.single.$round.json" 2>&1 | grep -E "output tok/s|TPOT|rror"
  done
done
echo "=================== one stream with MV_MEGAKERNEL_PROFILE=1, mbar"
MV_MEGAKERNEL_PROFILE=1 timeout 60 ./build/minivllm-mbar bench "${model[@]}" --num-seqs 1 --prompt-len 512 \
  --output-len 256 --repeat 1 2>&1 | grep -A16 "megakernel profile"
echo "=================== compute-sanitizer --tool racecheck, mbar, bench (Qwen3-0.6B shapes, 1 row, 300 + 3, split)"
timeout "${SAN_S:-150}" "$CS" --tool racecheck --error-exitcode 9 ./build/minivllm-mbar bench "${model[@]}" --num-seqs 1 \
  --prompt-len 300 --output-len 3 --repeat 1 --no-warmup --max-num-seqs 1 --max-model-len 4096 --kv-cache-gib 1 \
  > "$OUT/sanitizer.split.racecheck.mbar.log" 2>&1
rc=$?; [ $rc -eq 0 ] || status=1
echo "split racecheck rc=$rc: $(grep -E 'RACECHECK SUMMARY' "$OUT/sanitizer.split.racecheck.mbar.log" | tail -1)"
grep -E "Race reported|and (Read|Write) access|terminate" "$OUT/sanitizer.split.racecheck.mbar.log" | head -12
[ "${SKIP_TINY:-0}" = 1 ] && exit $status
echo "=================== compute-sanitizer --tool racecheck, mbar, bench (tiny-qwen3-mha, 4 rows)"
MV_MEGAKERNEL=1 timeout "${SAN_S:-150}" "$CS" --tool racecheck --error-exitcode 9 ./build/minivllm-mbar bench \
  --model tests/data/tiny-qwen3-mha --device cuda --num-seqs 4 --prompt-len 24 --output-len 16 --repeat 1 \
  --max-num-seqs 4 --max-model-len 128 > "$OUT/sanitizer.tiny.racecheck.mbar.log" 2>&1
rc=$?; [ $rc -eq 0 ] || status=1
echo "tiny racecheck rc=$rc: $(grep -E 'RACECHECK SUMMARY' "$OUT/sanitizer.tiny.racecheck.mbar.log" | tail -1)"
exit $status

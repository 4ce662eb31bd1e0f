#!/usr/bin/env bash
# tests/gpu/racecheck_probe.sh - tests/gpu/racecheck_probe.cu's eight variants, each run plain (its
# sums checked) and under compute-sanitizer racecheck and synccheck: one line each, on the GPU machine.
#   bash tests/gpu/racecheck_probe.sh
# Leaves racecheck_probe.<variant>.<tool>.log under $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/mv-out}
mkdir -p "$OUT" build
nvcc -I. -O3 -std=c++17 -lineinfo -gencode=arch=compute_90,code=sm_90 tests/gpu/racecheck_probe.cu \
  -o build/racecheck_probe || { echo "racecheck_probe: BUILD FAILED"; exit 1; }
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
status=0
for v in sum-sync sum-named sum-producer copy-direct copy-named copy-named-early copy-named-late copy-mbar; do
  plain=$(timeout 30 ./build/racecheck_probe "$v" 2>&1 | tail -1) || status=1
  line="$v: $plain"
  for tool in racecheck synccheck; do
    timeout 60 "$CS" --tool "$tool" ./build/racecheck_probe "$v" > "$OUT/racecheck_probe.$v.$tool.log" 2>&1
    line="$line | $tool: $(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY' "$OUT/racecheck_probe.$v.$tool.log" | tail -1 | sed 's/=* *//')"
  done
  echo "$line"
done
exit $status

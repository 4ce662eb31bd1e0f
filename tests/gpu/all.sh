#!/usr/bin/env bash
# tests/gpu/all.sh - one device call for everything: chapters, then the engine.
#
#   bash tests/gpu/all.sh [CHAPTER...]      (default: 05-rope 06-kv-store 07-attention)
#
# Runs tests/gpu/run.sh on the chapters, tests/gpu/engine_check.sh (the cuda
# backend against transformers' tiny checkpoints, CUDA graphs and eager),
# tests/gpu/bench.sh (nano-vllm's workload, latency, single stream) and
# tests/gpu/engine.sh (Qwen3-0.6B shapes: comparison with transformers), each
# in its own folder under $OUT and each under a time cap (CH_S, CHECK_S,
# BENCH_S, ENGINE_S seconds) so one call of the device tool (10 minutes at
# most) returns them all. SKIP_CHAPTERS=1 or SKIP_ENGINE=1 leave out one half;
# SKIP_BENCH=1, SKIP_HF=1 leave out bench.sh, engine.sh. The
# device tool brings back at most 8 files, so the folders are packed into
# $OUT/all.tgz; the summaries are printed last.
set -uo pipefail
OUT=${OUT:-/tmp/mv-out}
mkdir -p "$OUT"/ch "$OUT"/check "$OUT"/bench "$OUT"/engine
chapters=("$@")
[ ${#chapters[@]} -eq 0 ] && chapters=(05-rope 06-kv-store 07-attention)
t0=$(date +%s)
if [ "${SKIP_CHAPTERS:-0}" != 1 ]; then
  OUT=$OUT/ch timeout "${CH_S:-300}" bash tests/gpu/run.sh "${chapters[@]}" > /dev/null 2>&1
  echo "chapters: rc=$? $(( $(date +%s) - t0 )) s"
fi
if [ "${SKIP_ENGINE:-0}" != 1 ]; then
  OUT=$OUT/check timeout "${CHECK_S:-120}" bash tests/gpu/engine_check.sh > /dev/null 2>&1
  echo "engine_check: rc=$? $(( $(date +%s) - t0 )) s"
  if [ "${SKIP_BENCH:-0}" != 1 ]; then
    OUT=$OUT/bench TOTAL_S="${BENCH_S:-300}" timeout "${BENCH_S:-300}" bash tests/gpu/bench.sh > /dev/null 2>&1
    echo "bench: rc=$? $(( $(date +%s) - t0 )) s"
  fi
  if [ "${SKIP_HF:-0}" != 1 ]; then
    OUT=$OUT/engine timeout "${ENGINE_S:-170}" bash tests/gpu/engine.sh > /dev/null 2>&1
    echo "engine: rc=$? $(( $(date +%s) - t0 )) s"
  fi
fi
(cd "$OUT" && tar czf all.tgz ch check bench engine && rm -rf ch check bench engine)
tar xzf "$OUT/all.tgz" -C /tmp 2>/dev/null
echo "=================== chapters"
sed -n '/=================== summary/,$p' /tmp/ch/run.log 2>/dev/null | cut -c1-150
grep -E "FAIL|BUILD FAILED| error:|rror:" /tmp/ch/run.log 2>/dev/null | head -20
echo "=================== engine_check"
grep -vE "^PASS" /tmp/check/run.log 2>/dev/null | tail -40 | cut -c1-200
echo "=================== bench"
tail -25 /tmp/bench/bench.log 2>/dev/null | cut -c1-200
echo "=================== engine"
tail -30 /tmp/engine/engine.log 2>/dev/null | cut -c1-200

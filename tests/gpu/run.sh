#!/usr/bin/env bash
# tests/gpu/run.sh - build, check, sanitize and time chapters on the GPU machine.
#
# One call of the lab's `device` tool runs this on an H200 machine:
#   bash tests/gpu/run.sh 01-activation 02-rmsnorm
# It unpacks the Debian packages carried in .deps/ (the GPU machine has no
# package registry) into /opt/deps, builds for sm_90, runs each chapter with
# --json and --require-speed, runs compute-sanitizer (memcheck and racecheck)
# over each chapter's checks, and leaves under $OUT:
#   NN-name.json      the chapter's results (docs/results/ is generated from these)
#   run.log           everything printed
#   NN-name.1gpu.json on a machine with several GPUs, the tensor-parallel
#                     chapters (03, 04) run again on GPU 0 alone
#   sanitizer.txt     compute-sanitizer's verdict per chapter and tool (split
#                     it into docs/results/json/NN-name.sanitizer.txt)
#   env.txt           GPU, driver, nvcc
# Without arguments it runs every chapter.
set -uo pipefail
OUT=${OUT:-/tmp/mv-out}
mkdir -p "$OUT"
exec > >(tee "$OUT/run.log") 2>&1

mkdir -p /opt/deps
for f in .deps/*.deb; do dpkg -x "$f" /opt/deps; done

{
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv
  nvcc --version | tail -2
  echo "gcc: $(gcc --version | head -1)"
  echo "nccl: $(ls /usr/include/nccl.h /usr/local/cuda/include/nccl.h 2>/dev/null | tr '\n' ' ')"
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

chapters=("$@")
if [ ${#chapters[@]} -eq 0 ]; then
  chapters=($(ls chapters | grep -v 09-engine))
fi

t0=$(date +%s)
make -j16 DEPS_PREFIX=/opt/deps CUDA_ARCH=90 chapters || { echo "BUILD FAILED"; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s"

# Are the fast kernels' loads and stores 16 bytes wide? (LDG.E.128 / STG.E.128; chapter 07's flash
# prefill loads through cp.async (LDGSTS) and multiplies on the tensor cores (HMMA))
for k in activation rmsnorm linear embedding rope kv_store attention sampling; do
  o=build/obj/kernels/$k.cu.o
  [ -f "$o" ] && echo "sass $k: $(cuobjdump -sass "$o" | grep -cE 'LDG.E.128') LDG.E.128, $(cuobjdump -sass "$o" | grep -cE 'STG.E.128') STG.E.128, $(cuobjdump -sass "$o" | grep -cE 'LDGSTS') LDGSTS, $(cuobjdump -sass "$o" | grep -cE 'HMMA') HMMA, $(cuobjdump -sass "$o" | grep -cE 'LDL|STL') local-memory ops"
done

declare -A verdict
ngpu=$(nvidia-smi -L | wc -l)
for c in "${chapters[@]}"; do
  echo "=================== $c"
  ./build/$c --json "$OUT/$c.json" --require-speed
  verdict[$c]=$?
  case "$c" in 03-*|04-*)
    if [ "$ngpu" -ge 2 ]; then
      echo "=================== $c on GPU 0 alone"
      CUDA_VISIBLE_DEVICES=0 ./build/$c --json "$OUT/$c.1gpu.json" --require-speed
      verdict[$c.1gpu]=$?
    fi ;;
  esac
done

: > "$OUT/sanitizer.txt"
for c in "${chapters[@]}"; do
  [ "$c" = 08-scheduler ] && continue  # host-only: no CUDA call for the tools to watch
  for tool in memcheck racecheck; do
    log=$(mktemp)
    # On GPU 0 alone: the kernels are the same, and NCCL stays out of the tool's way.
    CUDA_VISIBLE_DEVICES=0 compute-sanitizer --tool $tool --error-exitcode 99 ./build/$c --checks-only --summary > "$log" 2>&1
    rc=$?
    echo "$c $tool rc=$rc $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$log" | tail -1)" | tee -a "$OUT/sanitizer.txt"
    [ $rc -ne 0 ] && grep -E "Race reported|Invalid|Error" "$log" | sort | uniq -c | sort -rn | head -8
    rm -f "$log"
  done
done

echo
echo "=================== summary"
for j in "$OUT"/*.json; do
  echo "$(basename $j) exit=${verdict[$(basename $j .json)]}"
  python3 - "$j" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
c = d.get('ceilings', {'copy_gbs': 0, 'gemm_tflops': 0})
print(f"  checks {d['n_checks']-d['n_failed']}/{d['n_checks']}  copy {c['copy_gbs']:.0f} GB/s  gemm {c['gemm_tflops']:.0f} TF  gpus {d['gpu'].get('device_count')}")
for t in d['timings']:
    if t['case'] != 'random':
        mark = '' if 'target_met' not in t else (' ok' if t['target_met'] else ' MISS')
        print(f"  {t['case']:11s} {t['version'][:34]:34s} {t['shape'][:26]:26s} {t['ms']*1e3:9.1f} us {t.get('gbs',0):6.0f} GB/s {t.get('pct_copy',0):5.1f}% {t.get('tflops',0):6.1f} TF{mark}")
PY
done
cat "$OUT/sanitizer.txt"

#!/usr/bin/env bash
# tests/gpu/megakernel.sh - the decode megakernel (kernels/decode_megakernel.h) on the GPU machine.
#
# One call of the lab's `device` tool runs this on an H200 machine:
#   bash tests/gpu/megakernel.sh
# It builds for sm_90, then:
#   1. build/engine_check --device cuda: among its cases, decode graphs that run the megakernel
#      (MV_MEGAKERNEL=1) at 1, 2, 4 and 8 rows against eager launches of the unfused kernels
#      (tokens and every logit row bit-identical), on the three tiny checkpoints and Qwen3-0.6B's
#      shapes; then chapter 07's check (its decode pieces and reduction are the megakernel's)
#   2. one stream (512 + 256, random weights, Qwen3-0.6B's shapes) with the megakernel
#      (MV_MEGAKERNEL=1, the default) and without it (MV_MEGAKERNEL=0: the unfused graphs),
#      alternated; its profile (MV_MEGAKERNEL_PROFILE=1); the latency mode at batch 1, 2 and 8
#   3. MK_SANITIZE=1: compute-sanitizer memcheck, racecheck and synccheck over bench runs whose
#      decode steps take the megakernel: tiny-qwen3-mha at 4 rows (MK_SANITIZE_TINY=0 skips it),
#      Qwen3-0.6B's shapes at one row and max_model_len 4096, its attention in 16 pieces
#      (MK_SANITIZE_SPLIT=0 skips it; MK_SANITIZE_SPLIT_TOOLS its tools, SAN_KERNEL=NAME instruments
#      only the kernels whose name holds NAME: memcheck only, since racecheck with --kernel-name
#      fails on these runs whatever the name, even one that matches no kernel: chapter 09,
#      docs/results/09-engine-sampler-v3.txt, runs 79-80); and memcheck, racecheck over 8 rows of
#      the unfused graphs (MK_SANITIZE_B8=0 skips it)
#   4. GEMV_PROBE=1 (after the check, before the timings): tests/gpu/gemv_probe.cu, the megakernel's
#      GEMV alone at 8 and 16 warps and 1 to 3 items a warp, x from shared memory or in registers, their
#      bits compared (gemv_probe.txt; with SKIP_BUILD=1 the probe is carried as build/gemv_probe);
#      PROBE_NCU=1: Nsight Compute's warp states and stall sources over two of its launches
#      (ncu.gemv_probe.K.txt)
#   5. CH03=1 (after the timings): chapter 03 (the linear layers' versions, checked and timed:
#      03-linear-tp.json), and with MK_SANITIZE=1 its checks of version 3 under memcheck and racecheck
#   6. NCU=1: Nsight Compute's warp-state sampling (WarpStateStats, SchedulerStats) over one launch
#      of the megakernel in a one-stream bench (ncu.megakernel.txt)
#   9. TIMELINE=1: one stream's decode steps (512 + 4) under Nsight Compute, graph node by graph node:
#      each kernel's gpu__time_duration, timed alone (timeline.ncu.csv; chapter 09's step-span table
#      keeps its last three steps)
#   8. LATENCY_AB=1: the latency mode at 1 to 8 rows, linear_cuda's GEMV choice against version 2
#   7. BATCH_AB="4 8": one bench of B rows each (512 + 256) with linear_cuda's own GEMV choice and
#      with MV_LINEAR_GEMV=2 (version 2 everywhere), alternated, two rounds
# BASE=DIR: a second tree (say `git archive <commit> | tar -x -C .base`, carried) built beside this one;
# variant "base" runs its minivllm, for a before/after in one call. BASE_BIN=PATH: variant "base" runs that
# binary instead (built elsewhere and carried; nothing is built).
# SKIP_BUILD=1: use build/minivllm and build/engine_check as carried (built elsewhere from the same tree).
# Knobs: ROUNDS (the alternated one-stream rounds, 2), TWO=1 (each round also two streams), VARIANTS
# and PROFILES (below), LATENCY=0
# (no latency mode), SKIP_CHECK=1,
# SKIP_CH07=1, CH07_ARGS (say --checks-only), CHECK_S / CH07_S / SAN_S (their time limits; SAN_S each sanitizer tool), SWEEP (below).
# Leaves under $OUT: engine_check.txt, 09-engine.<variant>.single.<round>.json,
# megakernel.profile.<variant>.txt, sanitizer logs, run.log; TAR=1: all of them in results.tgz
# (the device tool brings back 8 files at most), run.log beside it.
set -uo pipefail
. tests/gpu/gpu_env.sh  # $OUT, run.log, .deps, LD_LIBRARY_PATH, MV_COMMIT
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
pack() {
  [ "${TAR:-0}" = 1 ] || return 0
  tar czf /tmp/results.tgz -C "$OUT" --exclude run.log . && find "$OUT" -mindepth 1 ! -name run.log -delete &&
    mv /tmp/results.tgz "$OUT/results.tgz"
}
trap pack EXIT
T0=$(date +%s)
base_build=
if [ -n "${BASE:-}" ]; then
  (cd "$BASE" && make -j8 DEPS_PREFIX=/opt/deps CUDA_ARCH=90 build/minivllm > "$OUT/base.build.log" 2>&1) &
  base_build=$!
fi
if [ "${SKIP_BUILD:-0}" = 1 ]; then
  # build/minivllm and build/engine_check carried from a build of the same commit elsewhere.
  [ -x build/minivllm ] && [ -x build/engine_check ] || { echo "SKIP_BUILD=1 but no build/minivllm, build/engine_check"; exit 1; }
  echo "not built here (SKIP_BUILD=1): $(ldd build/minivllm | grep -c 'not found') libraries not found"
else
  make -j16 DEPS_PREFIX=/opt/deps CUDA_ARCH=90 > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; echo BUILD FAILED; exit 1; }
  echo "built in $(( $(date +%s) - T0 )) s"
fi
if [ -n "$base_build" ]; then
  wait "$base_build" || { tail -20 "$OUT/base.build.log"; echo "BASE BUILD FAILED"; }
  echo "base ($BASE) built in $(( $(date +%s) - T0 )) s"
fi
status=0
# The probe compiles (CPU) while the check runs (GPU).
probe_build=
if [ "${GEMV_PROBE:-0}" = 1 ] && [ "${SKIP_BUILD:-0}" = 1 ]; then
  [ -x build/gemv_probe ] || { echo "SKIP_BUILD=1 and GEMV_PROBE=1 but no build/gemv_probe carried"; exit 1; }
elif [ "${GEMV_PROBE:-0}" = 1 ]; then
  rm -f build/gemv_probe  # a failed compile must not leave an older probe to run
  nvcc -I. -DMV_HAVE_CUDA=1 -O3 -std=c++17 -arch=sm_90 tests/gpu/gemv_probe.cu -Lbuild/lib -lmv_ch07 -lmv_ch03 \
    -lmv_core -lcublas -lnccl -o build/gemv_probe > "$OUT/gemv_probe.build.log" 2>&1 &
  probe_build=$!
fi

if [ "${SKIP_CHECK:-0}" != 1 ]; then
  echo "=================== build/engine_check --device cuda (graphs: the megakernel where it applies)"
  timeout "${CHECK_S:-240}" ./build/engine_check --device cuda > "$OUT/engine_check.txt" 2>&1
  rc=$?; [ $rc -eq 0 ] || status=1
  echo "engine_check rc=$rc: $(grep -c '^PASS' "$OUT/engine_check.txt") PASS, $(grep -c '^FAIL' "$OUT/engine_check.txt") FAIL"
  grep -vE '^PASS' "$OUT/engine_check.txt" | tail -25
  if [ "${SKIP_CH07:-0}" != 1 ]; then
    echo "=================== chapter 07's check (decode attention: the megakernel's pieces and reduction)"
    timeout "${CH07_S:-200}" ./build/07-attention ${CH07_ARGS:-} --json "$OUT/07-attention.json" > "$OUT/07-attention.txt" 2>&1
    rc=$?; [ $rc -eq 0 ] || status=1
    echo "07-attention rc=$rc: $(grep -c 'PASS' "$OUT/07-attention.txt") PASS lines, $(grep -c 'FAIL' "$OUT/07-attention.txt") FAIL lines"
  fi
fi

if [ "${GEMV_PROBE:-0}" = 1 ]; then
  echo "=================== tests/gpu/gemv_probe.cu (the megakernel's GEMV alone)"
  [ -n "$probe_build" ] && wait "$probe_build"
  [ -x build/gemv_probe ] || { tail "$OUT/gemv_probe.build.log"; status=1; }
  [ -x build/gemv_probe ] && { timeout 120 ./build/gemv_probe > "$OUT/gemv_probe.txt" 2>&1; rc=$?; [ $rc -eq 0 ] || status=1
    sed -E 's/  globaltimer step [0-9]+ ns//; s/  \(1\.[0-9]+ GHz\)//' "$OUT/gemv_probe.txt"; echo "gemv_probe rc=$rc"; }
  if [ "${PROBE_NCU:-0}" = 1 ] && [ -x build/gemv_probe ]; then
    # qkv_proj's launches come first, in main()'s order: 0 x in shared memory (8 warps, 1 item), 5 x in
    # registers (8 warps, 1 item); the probe runs 210 GEMVs a launch.
    echo "=================== ncu: warp states and stall sources of the probe's qkv_proj GEMV (launches 0 and 5)"
    NCU_BIN=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
    for k in 0 5; do
      timeout 120 "$NCU_BIN" -k regex:gemv_alone --launch-skip $k --launch-count 1 --section WarpStateStats \
        --section SchedulerStats --section SourceCounters --section InstructionStats \
        --metrics smsp__inst_executed.sum,smsp__cycles_active.avg,sm__cycles_elapsed.avg \
        ./build/gemv_probe > "$OUT/ncu.gemv_probe.$k.txt" 2>&1
      echo "ncu launch $k rc=$?"
      grep -vE "^==PROF==|^  *$|^qkv|^o_proj|^gate|^down" "$OUT/ncu.gemv_probe.$k.txt" | grep -A70 "gemv_alone" | head -75
    done
  fi
fi

model=(--random-weights --model tests/data/qwen3-0.6b-shape --device cuda)
# The alternated variants (VARIANTS, default "mk1 mk0") and the profiled ones (PROFILES, default
# "mk1"; "none": no run): mk1 the megakernel, mk0 the unfused graphs, fr0 / fr1 the megakernel with its q/k norm +
# RoPE + KV store as a phase of their own / inside its attention pieces (MV_MEGAKERNEL_FUSED_ROPE),
# g2 / g3 the megakernel and every GEMV on linear version 2 / 3 (MV_LINEAR_GEMV), base BASE's minivllm;
# gates=Q,O,G,D (or gates=off) the producer's refills gated on the grid barriers (MV_MEGAKERNEL_GATES),
# s1 / s2 / s3 / s4 the sampler's version (MV_SAMPLER; kernels/sampling.h), silu0 / silu1 the megakernel's
# SiluAndMul in down's staging / in gate_up's GEMV (MV_MEGAKERNEL_SILU), red1 / red2 its reduction's
# version (MV_MEGAKERNEL_REDUCE), pu0 / pu1 a decode step's inputs in a copy per array / in one
# (MV_PACKED_UPLOAD), emb0 / emb1 the embedding as a kernel of its own / inside the megakernel
# (MV_MEGAKERNEL_EMBED), xr0 / xr1 the GEMV's x from shared memory / in registers (MV_MEGAKERNEL_XREG), st the step timer (MV_STEP_TIMES=1),
# cs the build with the consumers' barrier as an mbarrier (MV_MK_CSYNC_MBAR, carried as
# build/minivllm-mbar or CS_BIN), A+B: both (gates=off+fr0).
variant_env() {
  if [ "${1#*+}" != "$1" ]; then
    local part all=
    for part in ${1//+/ }; do all="$all $(variant_env "$part")" || return 1; done
    echo $all
    return 0
  fi
  case "$1" in
    mk1|base) echo MV_MEGAKERNEL=1 ;;
    g2) echo MV_MEGAKERNEL=1 MV_LINEAR_GEMV=2 ;;
    g3) echo MV_MEGAKERNEL=1 MV_LINEAR_GEMV=3 ;;
    mk0) echo MV_MEGAKERNEL=0 ;;
    fr0) echo MV_MEGAKERNEL=1 MV_MEGAKERNEL_FUSED_ROPE=0 ;;
    fr1) echo MV_MEGAKERNEL=1 MV_MEGAKERNEL_FUSED_ROPE=1 ;;
    gates=*) echo MV_MEGAKERNEL=1 MV_MEGAKERNEL_GATES="${1#gates=}" ;;
    s1|s2|s3|s4) echo MV_SAMPLER="${1#s}" ;;
    silu0|silu1) echo MV_MEGAKERNEL=1 MV_MEGAKERNEL_SILU="${1#silu}" ;;
    red1|red2) echo MV_MEGAKERNEL=1 MV_MEGAKERNEL_REDUCE="${1#red}" ;;
    pu0|pu1) echo MV_PACKED_UPLOAD="${1#pu}" ;;
    emb0|emb1) echo MV_MEGAKERNEL=1 MV_MEGAKERNEL_EMBED="${1#emb}" ;;
    xr0|xr1) echo MV_MEGAKERNEL=1 MV_MEGAKERNEL_XREG="${1#xr}" ;;
    cs) echo MV_MEGAKERNEL=1 ;;
    st) echo MV_STEP_TIMES=1 ;;
    *) echo "unknown variant $1" >&2; return 1 ;;
  esac
}
# A variant's name in file names (gates=-2,-1,0,4 -> gates_-2_-1_0_4).
vname() { echo "$1" | tr '=,:+' '____'; }
# The binary a variant runs: BASE's for base, the MV_MK_CSYNC_MBAR build's for cs (alone or in A+B).
variant_bin() {
  case "+$1+" in
    *+base+*) echo "${BASE_BIN:-$BASE/build/minivllm}" ;;
    *+cs+*) echo "${CS_BIN:-./build/minivllm-mbar}" ;;
    *) echo ./build/minivllm ;;
  esac
}
for round in $(seq 1 "${ROUNDS:-2}"); do
  for v in ${VARIANTS:-mk1 mk0}; do
    [ "$v" = none ] && continue
    e=$(variant_env "$v") || exit 2
    bin=$(variant_bin "$v")
    echo "=================== one stream, $v: $e (round $round)"
    env $e timeout 90 $bin bench "${model[@]}" --num-seqs 1 --prompt-len 512 --output-len 256 \
      --repeat 3 --json "$OUT/09-engine.$(vname "$v").single.$round.json" 2>&1 | grep -E "megakernel|output tok/s|TPOT|rror|MV_STEP_TIMES" | head -7
    if [ "${TWO:-0}" = 1 ]; then
      echo "=================== two streams, $v: $e (round $round)"
      env $e timeout 90 $bin bench "${model[@]}" --num-seqs 2 --prompt-len 512 --output-len 256 \
        --repeat 3 --json "$OUT/09-engine.$(vname "$v").two.$round.json" 2>&1 | grep -E "output tok/s|TPOT|rror" | head -3
    fi
  done
done
for v in ${PROFILES:-mk1}; do
  [ "$v" = none ] && continue
  e=$(variant_env "$v") || exit 2
  bin=$(variant_bin "$v")
  echo "=================== one stream with MV_MEGAKERNEL_PROFILE=1, $v: $e (the last step's phases)"
  env $e MV_MEGAKERNEL_PROFILE=1 timeout 90 $bin bench "${model[@]}" --num-seqs 1 --prompt-len 512 \
    --output-len 256 --repeat 1 2>&1 | grep -A16 "megakernel profile" | tee "$OUT/megakernel.profile.$(vname "$v").txt"
done
# SWEEP="CHUNK:RING[:WARPS] ...": the producer's pacing (bytes a copy : copies in flight) and
# the consumer warps (MV_MEGAKERNEL_WARPS; default the kernel's), one stream each, with the profile.
for cr in ${SWEEP:-}; do
  IFS=: read -r chunk ring warps <<< "$cr"
  echo "=================== one stream, MV_MEGAKERNEL_CHUNK=$chunk MV_MEGAKERNEL_RING=$ring MV_MEGAKERNEL_WARPS=${warps:-default}"
  env MV_MEGAKERNEL=1 MV_MEGAKERNEL_PROFILE=1 MV_MEGAKERNEL_CHUNK="$chunk" MV_MEGAKERNEL_RING="$ring" \
    ${warps:+MV_MEGAKERNEL_WARPS=$warps} timeout 60 ./build/minivllm bench "${model[@]}" --num-seqs 1 --prompt-len 512 --output-len 256 --repeat 2 \
    --json "$OUT/09-engine.mk1.sweep-${cr//:/-}.json" 2>&1 | grep -E "output tok/s|megakernel profile|^ +[a-zA-Z/0-9].*[0-9a-z]$|rror" \
    | grep -vE "^  (requests|prompt|output tokens|steps|load|warm|wall|threads|generate|device|TTFT|greedy|minivllm bench)" | head -18
done
for mk in $([ "${LATENCY:-1}" = 1 ] && echo 1 0); do
  echo "=================== latency at batch 1, 2, 8, MV_MEGAKERNEL=$mk"
  MV_MEGAKERNEL=$mk timeout 120 ./build/minivllm bench "${model[@]}" --latency --batch 1,2,8 --prompt-len 512 \
    --output-len 256 --repeat 2 --json "$OUT/09-engine.mk$mk.latency.json" 2>&1 | grep -E "batch|TPOT|TTFT|tok/s|megakernel" | head -14
done

for b in ${BATCH_AB:-}; do
  for round in 1 2; do
    for g in auto 2; do
      echo "=================== $b rows, GEMV $g (round $round)"
      env $([ $g = 2 ] && echo MV_LINEAR_GEMV=2) timeout 90 ./build/minivllm bench "${model[@]}" --num-seqs "$b" \
        --prompt-len 512 --output-len 256 --repeat 3 --json "$OUT/09-engine.b$b.gemv-$g.$round.json" 2>&1 |
        grep -E "output tok/s|TPOT|rror" | head -3
    done
  done
done

# LATENCY_AB=1: the latency mode at 1, 2, 4, 5, 6 and 8 rows with linear_cuda's own GEMV choice and
# with MV_LINEAR_GEMV=2, alternated (09-engine.latency-gemv-<auto|2>.<round>.json).
if [ "${LATENCY_AB:-0}" = 1 ]; then
  for rg in 1:auto 1:2 2:auto 2:2; do
    round=${rg%%:*}; g=${rg#*:}
    echo "=================== latency at 1, 2, 4, 5, 6, 8 rows, GEMV $g (round $round)"
    env $([ $g = 2 ] && echo MV_LINEAR_GEMV=2) timeout 120 ./build/minivllm bench "${model[@]}" --latency \
      --batch 1,2,4,5,6,8 --prompt-len 512 --output-len 256 --repeat 2 \
      --json "$OUT/09-engine.latency-gemv-$g.$round.json" 2>&1 |
      grep -E "batch|TPOT|tok/s" | head -14
  done
fi

if [ "${NCU:-0}" = 1 ]; then
  echo "=================== ncu: warp states over one megakernel launch (one stream, 512 + 16)"
  NCU_BIN=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
  MV_MEGAKERNEL=1 timeout "${NCU_S:-180}" "$NCU_BIN" -k regex:decode_megakernel --launch-skip 6 --launch-count 1 \
    --section WarpStateStats --section SchedulerStats --section LaunchStats ${NCU_RAW:+--page raw} \
    --metrics smsp__inst_executed.sum,sm__cycles_elapsed.avg,smsp__cycles_active.avg \
    ./build/minivllm bench "${model[@]}" --num-seqs 1 --prompt-len 512 --output-len 16 --repeat 1 \
    --max-num-seqs 2 --max-model-len 1024 --kv-cache-gib 1 > "$OUT/ncu.megakernel.txt" 2>&1
  echo "ncu rc=$?"
  if [ -n "${NCU_RAW:-}" ]; then
    grep -E "decode_megakernel|issue_stalled_[a-z_]+_per_issue_active.ratio" "$OUT/ncu.megakernel.txt" | head -40
  else
    grep -vE "^==PROF==|^  *$" "$OUT/ncu.megakernel.txt" | grep -A80 "decode_megakernel" | head -90
  fi
fi

if [ "${TIMELINE:-0}" = 1 ]; then
  echo "=================== one stream's decode steps, graph node by graph node (512 + 4; ncu, each kernel alone)"
  NCU_BIN=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
  timeout "${TIMELINE_S:-150}" "$NCU_BIN" --graph-profiling node --clock-control none --cache-control none \
    --metrics gpu__time_duration.sum --csv --page raw ./build/minivllm bench "${model[@]}" --num-seqs 1 \
    --prompt-len 512 --output-len 4 --repeat 1 --max-num-seqs 1 > "$OUT/timeline.ncu.csv" 2>&1
  echo "ncu rc=$?"
fi

if [ "${CH03:-0}" = 1 ]; then
  echo "=================== chapter 03 (linear versions 1-3: checks and the small-M table)"
  timeout "${CH03_S:-240}" ./build/03-linear-tp --json "$OUT/03-linear-tp.json" > "$OUT/03-linear-tp.txt" 2>&1
  rc=$?; [ $rc -eq 0 ] || status=1
  echo "03-linear-tp rc=$rc: $(grep -c 'PASS' "$OUT/03-linear-tp.txt") PASS lines, $(grep -c 'FAIL' "$OUT/03-linear-tp.txt") FAIL lines"
  grep -E 'FAIL' "$OUT/03-linear-tp.txt" | head -10
  grep -E 'small-m .*(qkv_proj|o_proj|gate_up_proj|down_proj) v[123]' "$OUT/03-linear-tp.txt" | grep -E 'M=(1|2|8) ' | head -40
fi

if [ "${MK_SANITIZE:-0}" = 1 ] && { [ "${CH03:-0}" = 1 ] || [ "${CH03_SAN:-0}" = 1 ]; }; then
  for tool in memcheck racecheck; do
    echo "=================== compute-sanitizer --tool $tool, 03-linear-tp --checks-only --kernel 3"
    CUDA_VISIBLE_DEVICES=0 timeout "${SAN_S:-200}" compute-sanitizer --tool $tool --error-exitcode 9 \
      ./build/03-linear-tp --checks-only --kernel 3 --summary > "$OUT/sanitizer.ch03.$tool.log" 2>&1
    rc=$?; [ $rc -eq 0 ] || status=1
    echo "ch03 v3 $tool rc=$rc: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/sanitizer.ch03.$tool.log" | tail -1)"
  done
fi

if [ "${MK_SANITIZE:-0}" = 1 ]; then
  CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  for tool in $([ "${MK_SANITIZE_TINY:-1}" = 1 ] && echo memcheck racecheck synccheck); do
    echo "=================== compute-sanitizer --tool $tool, bench (tiny-qwen3-mha, 4 rows, decode steps in the megakernel)"
    MV_MEGAKERNEL=1 timeout "${SAN_S:-200}" "$CS" --tool "$tool" --error-exitcode 9 ./build/minivllm bench \
      --model tests/data/tiny-qwen3-mha --device cuda --num-seqs 4 --prompt-len 24 --output-len 16 --repeat 1 \
      --max-num-seqs 4 --max-model-len 128 > "$OUT/sanitizer.$tool.log" 2>&1
    rc=$?; [ $rc -eq 0 ] || status=1
    echo "$tool rc=$rc: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/sanitizer.$tool.log" | tail -1)"
    grep -E "^  megakernel" "$OUT/sanitizer.$tool.log" | head -1
  done
  # Qwen3-0.6B's shapes at max_model_len 4096: the megakernel's split attention (16 pieces a row)
  # and its reduction (the tiny runs above never split).
  if [ "${MK_SANITIZE_SPLIT:-1}" = 1 ]; then
    for tool in ${MK_SANITIZE_SPLIT_TOOLS:-memcheck racecheck synccheck}; do
      echo "=================== compute-sanitizer --tool $tool, bench (Qwen3-0.6B shapes, 1 row, 300 + 3, split)"
      MV_MEGAKERNEL=1 timeout "${SAN_S:-200}" "$CS" --tool "$tool" ${SAN_KERNEL:+--kernel-name kns=$SAN_KERNEL} \
        --error-exitcode 9 ./build/minivllm bench "${model[@]}" --num-seqs 1 --prompt-len 300 --output-len 3 --repeat 1 \
        --no-warmup --max-num-seqs 1 --max-model-len 4096 --kv-cache-gib 1 > "$OUT/sanitizer.split.$tool.log" 2>&1
      rc=$?; [ $rc -eq 0 ] || status=1
      echo "split $tool rc=$rc: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/sanitizer.split.$tool.log" | tail -1)"
      grep -E "^========= +(Error|Warning): .*[Hh]azard" -A3 "$OUT/sanitizer.split.$tool.log" | grep -E "hazard|at .* in " | sort | uniq -c | sort -rn | head -12
      grep -E "^  megakernel" "$OUT/sanitizer.split.$tool.log" | head -1
    done
  fi
  # 8 rows: the unfused decode graphs, where linear_cuda runs version 3 (M >= 5) with PDL.
  for tool in $([ "${MK_SANITIZE_B8:-1}" = 1 ] && echo memcheck racecheck); do
    echo "=================== compute-sanitizer --tool $tool, bench (tiny-qwen3-mha, 8 rows: unfused graphs, GEMV v3)"
    timeout "${SAN_S:-200}" "$CS" --tool "$tool" --error-exitcode 9 ./build/minivllm bench \
      --model tests/data/tiny-qwen3-mha --device cuda --num-seqs 8 --prompt-len 24 --output-len 16 --repeat 1 \
      --max-num-seqs 8 --max-model-len 128 > "$OUT/sanitizer.b8.$tool.log" 2>&1
    rc=$?; [ $rc -eq 0 ] || status=1
    echo "8 rows $tool rc=$rc: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/sanitizer.b8.$tool.log" | tail -1)"
  done
fi
exit $status

#!/usr/bin/env bash
# tests/gpu/bench.sh - chapter 09's benchmarks on the GPU machine: nano-vllm's workload, latency, single stream.
#
# One call of the lab's `device` tool runs this on an H200 machine, from the repository root:
#   MV_COMMIT=<git rev-parse --short HEAD> bash tests/gpu/bench.sh
# (the machine's copy of the tree may have no .git: MV_COMMIT names the commit in every JSON).
# It unpacks the Debian packages carried in .deps/ into /opt/deps and builds build/minivllm for
# sm_90 (make: only what is out of date), then runs, on Qwen3-0.6B's shapes with
# random weights (tests/data/qwen3-0.6b-shape, --random-weights: real shapes, nonsense text),
# each step under `timeout`:
#   1. nano-vllm's bench.py workload (tests/bench/nanovllm_workload.py: 256 requests, prompts
#      and outputs of randint(100, 1024) tokens, ignore_eos), --repeat 3 after a warm-up:
#        greedy                       --sampling greedy
#        Qwen3's default sampling     --sampling qwen3 (temperature 0.6, top_k 20, top_p 0.95)
#        as bench.py samples          the file's own temperature 0.6, no top-k / top-p
#   2. latency: --latency --batch 1,8,64, prompts of 512 tokens, 256 generated, --repeat 3:
#      TTFT and TPOT p50 / p99
#   3. single-stream decode: 1 request, 512 + 256, --repeat 5 (docs/results' 09-engine:single)
#   4. scaling: --latency at batch 1 to 256 (512 + 256), and one stream at contexts 512 to 32768
#   5. on cuda, single stream and the greedy workload again with --enforce-eager (no CUDA graphs)
# SKIP_FILE=1 leaves out the workload at the file's own sampling, SKIP_WORKLOAD=1 all of step 1,
# SKIP_EAGER=1 step 5 (for a run that changed nothing they measure; their JSON stays that of an
# earlier commit).
# It leaves under $OUT (copy the JSON into docs/results/json/):
#   09-engine.nanovllm-greedy.json  09-engine.nanovllm-qwen3.json  09-engine.nanovllm-file.json
#   09-engine.latency.json          09-engine.single.json           bench.log (everything printed)
#   09-engine.single-eager.json     09-engine.nanovllm-greedy-eager.json
#   09-engine.scaling-batch.json    09-engine.context-{512,2048,8192,32768}.json
# and prints a short table last. Exit status 0 when every step ran.
#
# Time (H200): the build ~1-2 min when needed; each bench process draws the 596M random weights
# (~2-3 s on 16 cores) and uploads them; one repetition of the nano-vllm workload is ~7 s
# (140k output tokens at ~21k tok/s, docs/results' 09-engine bench figure), so ~30-40 s a sampling mode; latency
# ~15 s; single stream ~10 s. About 3-4 minutes in all, and every step's cap is cut to what is
# left of TOTAL_S (default 470 s) so the script ends within 8 minutes.
#
# A dry run of the script itself, without a GPU (the tiny model, the CPU backend, seconds):
#   MV=./build-h4/minivllm MV_DEVICE=cpu SHAPE=tests/data/tiny-qwen3-tied \
#     WORKLOAD_ARGS="--num-seqs 8 --min-len 4 --max-input-len 40 --max-output-len 20 --max-id 500" \
#     LAT_ARGS="--prompt-len 32 --output-len 16" SINGLE_ARGS="--prompt-len 32 --output-len 16" \
#     bash tests/gpu/bench.sh
set -uo pipefail
OUT=${OUT:-/tmp/mv-out}
mkdir -p "$OUT"
exec > >(tee "$OUT/bench.log") 2>&1

MV=${MV:-./build/minivllm}
SHAPE=${SHAPE:-tests/data/qwen3-0.6b-shape}
DEVICE=${MV_DEVICE:-cuda}
TOTAL_S=${TOTAL_S:-470}
read -r -a workload_args <<< "${WORKLOAD_ARGS:-}"
read -r -a lat_args <<< "${LAT_ARGS:---prompt-len 512 --output-len 256}"
read -r -a single_args <<< "${SINGLE_ARGS:---prompt-len 512 --output-len 256}"
export MV_COMMIT=${MV_COMMIT:-}  # empty: bench asks git itself (hash, "-dirty"), else says "unknown"

T0=$(date +%s)
elapsed() { echo $(( $(date +%s) - T0 )); }
# The smaller of a step's own cap and what is left of TOTAL_S (less 20 s for the table); at least 10 s.
cap() { local left=$(( TOTAL_S - 20 - $(elapsed) )); [ "$left" -gt "$1" ] && left=$1; [ "$left" -lt 10 ] && left=10; echo $left; }

if [ "$DEVICE" = cuda ]; then
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv
  # The carried Debian packages, for the build and for a binary built elsewhere (MV=PATH: no build),
  # which finds them through the library path.
  mkdir -p /opt/deps
  for f in .deps/*.deb; do [ -f "$f" ] && dpkg -x "$f" /opt/deps; done
  export LD_LIBRARY_PATH=/opt/deps/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  if [ "$MV" = ./build/minivllm ]; then  # make rebuilds only what is older than its sources
    echo "=================== build ($(elapsed) s)"
    timeout "$(cap 240)" make -j16 DEPS_PREFIX=/opt/deps CUDA_ARCH=90 build/minivllm > "$OUT/build.log" 2>&1 \
      || { tail -30 "$OUT/build.log"; echo "bench.sh: BUILD FAILED"; exit 1; }
    echo "built in $(elapsed) s"
  fi
fi
[ -x "$MV" ] || { echo "bench.sh: $MV not found"; exit 1; }

WORK=$(mktemp /tmp/mv-nanovllm.XXXXXX.jsonl)
trap 'rm -f "$WORK"' EXIT
python3 tests/bench/nanovllm_workload.py "${workload_args[@]}" --out "$WORK" || { echo "bench.sh: no workload"; exit 1; }
echo "nano-vllm workload: $(wc -l < "$WORK") requests, sha256 $(sha256sum "$WORK" | cut -c1-16)..."

model=(--random-weights --model "$SHAPE" --device "$DEVICE")
declare -A status
steps=()
step() {  # step NAME CAP ARGS...: one bench run, its JSON in $OUT/09-engine.NAME.json
  local name=$1 limit; limit=$(cap "$2"); shift 2
  echo "=================== $name ($(elapsed) s, timeout $limit s)"
  timeout "$limit" "$MV" bench "${model[@]}" --json "$OUT/09-engine.$name.json" "$@"
  status[$name]=$?
  [ "${status[$name]}" -eq 124 ] && echo "bench.sh: $name timed out after $limit s (no JSON)"
  steps+=("$name")
}

if [ "${SKIP_WORKLOAD:-0}" != 1 ]; then
  step nanovllm-greedy 120 --input "$WORK" --sampling greedy --repeat 3
  step nanovllm-qwen3 120 --input "$WORK" --sampling qwen3 --repeat 3
  [ "${SKIP_FILE:-0}" = 1 ] || step nanovllm-file 120 --input "$WORK" --repeat 3
fi
step latency 120 --latency --batch 1,8,64 "${lat_args[@]}" --repeat 3
step single 60 --num-seqs 1 "${single_args[@]}" --repeat 5
# Scaling: output tok/s against the batch size (512 + 256 each), and one stream against the context length.
step scaling-batch 90 --latency --batch 1,2,4,8,16,32,64,128,256 "${lat_args[@]}" --repeat 1
for ctx in 512 2048 8192 32768; do
  step "context-$ctx" 40 --latency --batch 1 --prompt-len "$ctx" --output-len 256 --max-model-len $((ctx + 256)) \
    --repeat 1
done
# The same without CUDA graphs (--enforce-eager: decode steps launched kernel by kernel), for what graphs change.
if [ "$DEVICE" = cuda ] && [ "${SKIP_EAGER:-0}" != 1 ]; then
  step single-eager 60 --num-seqs 1 "${single_args[@]}" --repeat 3 --enforce-eager
  step nanovllm-greedy-eager 120 --input "$WORK" --sampling greedy --repeat 2 --enforce-eager
fi

echo
echo "=================== summary ($(elapsed) s)"
python3 - "$OUT" "${steps[@]}" <<'PY'
import json, os, sys
out, steps = sys.argv[1], sys.argv[2:]
def load(name):
    p = os.path.join(out, f"09-engine.{name}.json")
    return json.load(open(p)) if os.path.exists(p) else None
first = next((d for d in map(load, steps) if d), None)
if first:
    print(f"{first.get('gpu') or first['device']}, commit {first['commit']}, {first['date']}, {first['host_cpus']} host CPUs, "
          f"{first['config']['n_params'] / 1e6:.0f}M params{' (random weights)' if first['random_weights'] else ''}")
print(f"{'run':17s} {'req':>4s} {'prompt':>8s} {'output':>8s} {'output tok/s (min-max)':>26s} {'total tok/s':>11s}"
      f" {'TTFT p50/p99 ms':>17s} {'TPOT p50/p99 ms':>16s} {'load s':>6s}")
for name in steps:
    d = load(name)
    if not d:
        print(f"{name:17s} no JSON")
        continue
    if d["mode"] == "latency":
        for b in d["batches"]:
            t, p, o = b["ttft_ms"], b["tpot_ms"], b["output_tok_s"]
            print(f"{'latency, batch ' + str(b['batch']):17s} {b['batch']:4d} {d['prompt_len']:8d} {d['output_len']:8d} "
                  f"{o['median']:>9,.0f} ({o['min']:,.0f}-{o['max']:,.0f}) {b['total_tok_s']['median']:11,.0f} "
                  f"{t['p50']:8.1f}/{t['p99']:<8.1f} {p['p50']:7.2f}/{p['p99']:<8.2f} {d['load_s']:6.2f}")
        continue
    t, p = d["ttft_ms"], d["tpot_ms"]
    print(f"{name:17s} {d['requests']:4d} {d['prompt_tokens']:8,d} {d['output_tokens']:8,d} "
          f"{d['output_tok_s']:>9,.0f} ({d['output_tok_s_min']:,.0f}-{d['output_tok_s_max']:,.0f}) "
          f"{d['total_tok_s']:11,.0f} {t['p50']:8.1f}/{t['p99']:<8.1f} {p['p50']:7.2f}/{p['p99']:<8.2f} {d['load_s']:6.2f}")
s = load("single")
if s and s["device"] == "cuda":
    # Decode reads every weight once per token: n_params x 2 bytes (bf16) per output token.
    print(f"single stream: {1e3 * s['generate_s'] / s['output_tokens']:.2f} ms per token, "
          f"{2 * s['config']['n_params'] * s['output_tok_s'] / 1e9:,.0f} GB/s of weights")
PY
rc=0
for k in "${steps[@]}"; do [ "${status[$k]}" -ne 0 ] && { echo "bench.sh: $k exit ${status[$k]}"; rc=1; }; done
echo "bench.sh: $(elapsed) s, exit $rc"
exit $rc

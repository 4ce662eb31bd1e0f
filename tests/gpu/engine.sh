#!/usr/bin/env bash
# tests/gpu/engine.sh - chapter 09's engine on the GPU machine: correctness against
# transformers on Qwen3-0.6B's shapes, then speed.
#
# Run from the repository root after the build (tests/gpu/run.sh unpacks the deps):
#   make -j16 DEPS_PREFIX=/opt/deps CUDA_ARCH=90 && bash tests/gpu/engine.sh
# It leaves under $OUT (docs/results/ is generated from the JSON files: copy them into
# docs/results/json/ and run python3 docs/results/generate.py):
#   09-engine.compare.json  tests/gpu/compare_hf.py: minivllm (cuda and cpu) vs transformers
#                           (fp32 and bf16): first-step logits NMSE, argmax, greedy agreement
#   09-engine.bench.json    minivllm bench --random-weights with its defaults (256 requests,
#                           lengths uniform in [100, 1024])
#   09-engine.single.json   single-stream decode: 1 request, 512-token prompt, 256 new tokens,
#                           on the bf16 checkpoint compare_hf.py kept (a real load time)
#   engine.log              everything printed
# and prints a short table last. Exit status: 0 when every step ran and the comparison passed.
#
# Time (H200, 16 host cores), about 1.5 to 2.5 minutes in all, each step capped by `timeout`
# so the whole stays under 4 minutes:
#   compare_hf.py  ~40-70 s: imports ~10 s, the 0.6B checkpoint built on the GPU and written
#                  (1.19 GB) ~5 s, transformers bf16 + fp32, 4 prompts x 32 tokens ~10 s,
#                  minivllm cuda ~5 s, minivllm cpu (2 prompts of 16 and 61 tokens, 8 tokens:
#                  ~80 prefill tokens x 1.2 GFLOP on 16 cores plus 8 steps reading 1.2 GB of
#                  bf16 weights; measured 13 s on 2 cores here, so ~3-10 s there) + its load
#   single         load ~2-5 s, 256 decode steps at a few ms each
#   bench          load ~20 s (drawing 596M random weights on one CPU thread: 29 s measured
#                  on a slow 2-core machine), then 144k prompt + 144k output tokens
#
# A dry run of the script itself, without a GPU (a tiny model, the CPU backend, seconds):
#   MV_DEVICE=cpu COMPARE_ARGS="--tiny --cpu-only" BENCH_ARGS="--num-seqs 4 --max-len 64" \
#     SHAPE=tests/data/tiny-qwen3-tied bash tests/gpu/engine.sh
set -uo pipefail
OUT=${OUT:-/tmp/mv-out}
mkdir -p "$OUT"
exec > >(tee "$OUT/engine.log") 2>&1

MV=./build/minivllm
SHAPE=${SHAPE:-tests/data/qwen3-0.6b-shape}
DEVICE=${MV_DEVICE:-cuda}
read -r -a compare_args <<< "${COMPARE_ARGS:-}"
read -r -a bench_args <<< "${BENCH_ARGS:-}"
CKPT=$(mktemp -d /tmp/mv-qwen3-0.6b-random.XXXXXX)
trap 'rm -rf "$CKPT"' EXIT
[ -x "$MV" ] || { echo "engine.sh: $MV not found: build first (make -j16 DEPS_PREFIX=/opt/deps CUDA_ARCH=90)"; exit 1; }
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
echo "engine.sh: GPU ${GPU:-none}, $(nproc) CPUs, $(python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)' 2>&1)"

T0=$(date +%s)
elapsed() { echo $(( $(date +%s) - T0 )); }
declare -A status

echo "=================== compare_hf.py ($(elapsed) s)"
timeout 130 python3 tests/gpu/compare_hf.py --json "$OUT/09-engine.compare.json" --keep "$CKPT" --timeout 60 \
  "${compare_args[@]}"
status[compare]=$?

# bench's JSON has no GPU name (bench is host C): add nvidia-smi's, as the docs name the GPU.
name_gpu() {
  [ -f "$1" ] && [ -n "$GPU" ] && python3 - "$1" "$GPU" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
d.setdefault("gpu", sys.argv[2])
json.dump(d, open(sys.argv[1], "w"), indent=1)
PY
}

echo "=================== single-stream decode ($(elapsed) s)"
if [ -f "$CKPT/model.safetensors" ]; then model=(--model "$CKPT"); else model=(--random-weights --model "$SHAPE"); fi
timeout 60 "$MV" bench "${model[@]}" --device "$DEVICE" --num-seqs 1 --prompt-len 512 --output-len 256 \
  --json "$OUT/09-engine.single.json"
status[single]=$?
name_gpu "$OUT/09-engine.single.json"
rm -rf "$CKPT"/*  # 1.2 GB of /tmp no longer needed

# What is left of 4 minutes, less 15 s for the table; at least 30 s.
left=$(( 225 - $(elapsed) )); [ $left -lt 30 ] && left=30
echo "=================== bench, defaults ($(elapsed) s, timeout ${left} s)"
timeout $left "$MV" bench --random-weights --model "$SHAPE" --device "$DEVICE" --json "$OUT/09-engine.bench.json" \
  "${bench_args[@]}"
status[bench]=$?
[ ${status[bench]} -eq 124 ] && echo "engine.sh: bench timed out after ${left} s (rerun alone: it has no JSON)"
name_gpu "$OUT/09-engine.bench.json"

echo
echo "=================== summary ($(elapsed) s)"
python3 - "$OUT" "${status[compare]}" "${status[single]}" "${status[bench]}" <<'PY'
import json, os, sys
out, st = sys.argv[1], dict(zip(("compare", "single", "bench"), sys.argv[2:]))
def load(name):
    p = os.path.join(out, name)
    return json.load(open(p)) if os.path.exists(p) else None
c = load("09-engine.compare.json")
print(f"compare_hf.py                 exit {st['compare']}  " + (("PASS" if c["pass"] else "FAIL") if c else "no JSON"))
if c:
    for p in c["pairs"]:
        print(f"  {p['a'] + ' vs ' + p['b']:32s} NMSE {p['nmse_max']:9.2e}  argmax {p['argmax_equal']}/{p['prompts']}"
              f"  greedy prefix min {p['greedy_prefix_min']:2d} mean {p['greedy_prefix_mean']:5.1f}"
              f"  equal {100 * p['greedy_equal_frac']:3.0f}%")
    for k in c["criteria"]:
        if not k["pass"]:
            print(f"  FAIL {k['name']}: {k['value']} ({k['bound']})")
for key, name in (("single", "09-engine.single.json"), ("bench", "09-engine.bench.json")):
    b = load(name)
    line = f"bench {key:23s} exit {st[key]}  "
    if b:
        line += (f"{b['requests']} req, {b['prompt_tokens']} + {b['output_tokens']} tok, load {b['load_s']:.2f} s, "
                 f"generate {b['generate_s']:.2f} s, output {b['output_tok_s']:,.1f} tok/s, total {b['total_tok_s']:,.1f} tok/s")
        if key == "single" and b["config"].get("n_params"):
            line += f", {2 * b['config']['n_params'] * b['output_tok_s'] / 1e9:,.0f} GB/s of weights"
    else:
        line += "no JSON"
    print(line)
PY
rc=0
for k in compare single bench; do [ "${status[$k]}" -ne 0 ] && rc=1; done
echo "engine.sh: $(elapsed) s, exit $rc"
exit $rc

#!/usr/bin/env bash
# tests/gpu/serve_bench.sh - the serving benchmark on the GPU machine: `minivllm serve` under
# tests/serve/bench_serve.py at several request rates, beside `minivllm bench` on the same requests.
#
# One call of the lab's `device` tool runs this on an H200 machine, from the repository root:
#   MV_COMMIT=<git rev-parse --short HEAD> bash tests/gpu/serve_bench.sh
# It builds build/minivllm for sm_90 when needed (as tests/gpu/bench.sh does), makes a model
# directory of Qwen3-0.6B's config (tests/data/qwen3-0.6b-shape) and its real tokenizer (the
# server streams text, so time to first token and inter-token latency mean what they say; without
# a tokenizer a request's text comes in one chunk at its end), then:
#   1. `minivllm bench` on the drawn workload (256 requests, prompt and output lengths U[100, 1024],
#      greedy, ignore_eos): the engine's own output tok/s, the ceiling of the server's;
#   2. `minivllm serve --random-weights` on the same directory, and bench_serve.py against it at
#      --request-rate 4, 16, 64 and inf (the same 256 requests, id for id: bench_serve.py draws
#      minivllm bench's workload), each into its own JSON.
# It leaves under $OUT (copy the JSON into docs/results/json/):
#   09-serving.bench.json  09-serving.rate-4.json  09-serving.rate-16.json  09-serving.rate-64.json
#   09-serving.rate-inf.json  serve.log (the server's) serve_bench.log (everything printed)
# and prints a short table last. Exit status 0 when every step ran.
#
# The tokenizer: TOKENIZER_DIR (default .deps/qwen3-0.6b-tokenizer, carried with .deps/) holds
# Qwen3-0.6B's tokenizer.json and tokenizer_config.json (copy them there from a Hugging Face
# download: `hf download Qwen/Qwen3-0.6B tokenizer.json tokenizer_config.json`).
#
# Time (H200): rate 4 spreads 256 arrivals over ~64 s, 16 and 64 over ~16 s and ~4 s, inf sends
# them at once; each run lasts about as long as the engine needs for 140k output tokens after
# the last arrival (~7 s at ~21k tok/s). About 3 minutes with the bench run and the server's start.
#
# A dry run without a GPU (the tiny model, the CPU backend, seconds):
#   MV=./build/minivllm MV_DEVICE=cpu SHAPE=tests/data/tiny-qwen3-tied TOKENIZER_DIR= \
#     WORKLOAD="--num-prompts 8 --input-len-range 4:40 --output-len-range 4:20" \
#     BENCH_ARGS="--num-seqs 8 --min-len 4 --max-len 40" RATES="16 inf" bash tests/gpu/serve_bench.sh
# (the drawn lengths then differ between the two, so only the server's figures mean anything).
set -uo pipefail
OUT=${OUT:-/tmp/mv-out}
mkdir -p "$OUT"
exec > >(tee "$OUT/serve_bench.log") 2>&1

MV=${MV:-./build/minivllm}
SHAPE=${SHAPE:-tests/data/qwen3-0.6b-shape}
DEVICE=${MV_DEVICE:-cuda}
TOKENIZER_DIR=${TOKENIZER_DIR-.deps/qwen3-0.6b-tokenizer}
PORT=${PORT:-8123}
read -r -a rates <<< "${RATES:-4 16 64 inf}"
read -r -a workload <<< "${WORKLOAD:-}"
read -r -a bench_args <<< "${BENCH_ARGS:-}"
export MV_COMMIT=${MV_COMMIT:-}

T0=$(date +%s)
elapsed() { echo $(( $(date +%s) - T0 )); }

if [ "$DEVICE" = cuda ]; then
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  if [ "$MV" = ./build/minivllm ]; then
    echo "=================== build ($(elapsed) s)"
    mkdir -p /opt/deps
    for f in .deps/*.deb; do [ -f "$f" ] && dpkg -x "$f" /opt/deps; done
    timeout 300 make -j16 DEPS_PREFIX=/opt/deps CUDA_ARCH=90 build/minivllm > "$OUT/build.log" 2>&1 \
      || { tail -30 "$OUT/build.log"; echo "serve_bench.sh: BUILD FAILED"; exit 1; }
    export LD_LIBRARY_PATH=/opt/deps/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
    echo "built in $(elapsed) s"
  fi
fi
[ -x "$MV" ] || { echo "serve_bench.sh: $MV not found"; exit 1; }

# The model directory: the shapes' config files beside the real tokenizer.
MODEL=$(mktemp -d /tmp/mv-serve-model.XXXXXX)
for f in config.json generation_config.json; do ln -s "$PWD/$SHAPE/$f" "$MODEL/$f"; done
if [ -n "$TOKENIZER_DIR" ]; then
  for f in tokenizer.json tokenizer_config.json; do
    [ -f "$TOKENIZER_DIR/$f" ] || { echo "serve_bench.sh: $TOKENIZER_DIR/$f is missing"; exit 1; }
    ln -s "$PWD/$TOKENIZER_DIR/$f" "$MODEL/$f"
  done
fi
SERVER=
# Wait for the server alone: a bare `wait` also waits for the tee above, which ends only when
# this script does (bash 5.2), so the script would never exit.
cleanup() { [ -n "$SERVER" ] && { kill "$SERVER" 2>/dev/null; wait "$SERVER" 2>/dev/null; }; rm -rf "$MODEL"; }
trap cleanup EXIT

declare -A status
echo "=================== minivllm bench ($(elapsed) s)"
timeout 200 "$MV" bench --model "$MODEL" --random-weights --device "$DEVICE" --json "$OUT/09-serving.bench.json" \
  "${bench_args[@]}"
status[bench]=$?

echo "=================== minivllm serve ($(elapsed) s)"
"$MV" serve --model "$MODEL" --random-weights --device "$DEVICE" --port "$PORT" --max-queued-requests 1024 \
  > "$OUT/serve.log" 2>&1 &
SERVER=$!
for rate in "${rates[@]}"; do
  echo "=================== bench_serve.py --request-rate $rate ($(elapsed) s)"
  timeout 240 python3 tests/serve/bench_serve.py --base-url "http://127.0.0.1:$PORT" --model-dir "$MODEL" \
    --ready-check-timeout-sec 120 --request-rate "$rate" --json "$OUT/09-serving.rate-$rate.json" "${workload[@]}"
  status[rate-$rate]=$?
done
kill -TERM "$SERVER" 2>/dev/null
wait "$SERVER" 2>/dev/null
SERVER=
tail -3 "$OUT/serve.log"

echo "=================== table ($(elapsed) s)"
python3 - "$OUT" "${rates[@]}" <<'EOF'
import json, os, sys
out, rates = sys.argv[1], sys.argv[2:]
def load(name):
    try:
        with open(os.path.join(out, name)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None
def pick(d, *keys):
    for k in keys:
        if d and isinstance(d.get(k), (int, float)):
            return d[k]
    return float("nan")
b = load("09-serving.bench.json")
print("minivllm bench: output tok/s", b and b.get("output_tok_s", b.get("results", {})))
print("%-6s %9s %10s %10s %10s %10s %10s" % ("rate", "req/s", "out tok/s", "TTFT p50", "TTFT p99", "TPOT p50", "ITL p99"))
for r in rates:
    d = load("09-serving.rate-%s.json" % r)
    if not d:
        print("%-6s (no JSON)" % r)
        continue
    print("%-6s %9.2f %10.0f %10.1f %10.1f %10.2f %10.2f" % (
        r, pick(d, "request_throughput"), pick(d, "output_throughput"), pick(d, "median_ttft_ms"),
        pick(d, "p99_ttft_ms"), pick(d, "median_tpot_ms"), pick(d, "p99_itl_ms")))
EOF
rc=0
for k in "${!status[@]}"; do [ "${status[$k]}" -ne 0 ] && { echo "serve_bench.sh: $k exit ${status[$k]}"; rc=1; }; done
exit $rc

#!/usr/bin/env bash
# tests/gpu/options_bench.sh - what vLLM's other sampling options (min_p, the penalties, logprobs)
# cost the engine on the GPU: `minivllm bench --input` on the same requests with and without them.
#
# One call of the lab's `device` tool runs this on an H200 machine, from the repository root, after
# a build (tests/gpu/engine_check.sh builds; MV picks the binary, TAG names the JSON):
#   MV=./build/minivllm TAG=gpu bash tests/gpu/options_bench.sh
# Two workloads on Qwen3-0.6B's shapes with random weights (tests/data/qwen3-0.6b-shape):
#   single   one request, 512 random prompt ids, 256 output tokens (one row a step: the
#            options' kernels run on one row, so this is their latency)
#   nanovllm nano-vllm's 256 requests (tests/bench/nanovllm_workload.py, ignore_eos)
# each sampled with Qwen3's defaults (temperature 0.6, top_k 20, top_p 0.95) and then again with
# those plus min_p 0.05, repetition_penalty 1.1, presence_penalty 0.5 and logprobs 5 on every
# request. WORKLOAD_ARGS go to nanovllm_workload.py (e.g. "--num-seqs 32"); REPS_SINGLE and
# REPS_WORK set the timed repetitions (5, 3), BENCH_S each run's time cap (150 s). A dry run without a GPU, on a tiny checkpoint:
#   MV=./build/minivllm MV_DEVICE=cpu SHAPE=tests/data/tiny-qwen3-tied MAX_ID=400 PROMPT_LEN=100 OUTPUT_LEN=50 \
#     WORKLOAD_ARGS="--num-seqs 8 --max-input-len 60 --max-output-len 20 --max-id 400" bash tests/gpu/options_bench.sh
# Leaves under $OUT: options.$TAG.{single,nanovllm}.{plain,options}.json and
# options_bench.$TAG.log; prints a short table last.
set -uo pipefail
OUT=${OUT:-/tmp/mv-out}
mkdir -p "$OUT"
MV=${MV:-./build/minivllm}
TAG=${TAG:-gpu}
SHAPE=${SHAPE:-tests/data/qwen3-0.6b-shape}
DEVICE=${MV_DEVICE:-cuda}
exec > >(tee "$OUT/options_bench.$TAG.log") 2>&1
[ -x "$MV" ] || { echo "options_bench.sh: $MV not found (build first)"; exit 1; }

dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
python3 tests/bench/nanovllm_workload.py ${WORKLOAD_ARGS:-} --out "$dir/nanovllm.jsonl" || exit 1
python3 - "$dir" "${MAX_ID:-10000}" "${PROMPT_LEN:-512}" "${OUTPUT_LEN:-256}" <<'EOF'
import json, os, random, sys
d, max_id, prompt_len, output_len = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
random.seed(1)
single = [{"prompt_token_ids": [random.randint(0, max_id) for _ in range(prompt_len)], "max_tokens": output_len,
           "ignore_eos": True}]
nano = [json.loads(l) for l in open(os.path.join(d, "nanovllm.jsonl"))]
plain = {"temperature": 0.6, "top_k": 20, "top_p": 0.95, "seed": 0}
opts = dict(plain, min_p=0.05, repetition_penalty=1.1, presence_penalty=0.5, logprobs=5)
for name, reqs in (("single", single), ("nanovllm", nano)):
    for kind, extra in (("plain", plain), ("options", opts)):
        with open(os.path.join(d, f"{name}.{kind}.jsonl"), "w") as f:
            for r in reqs:
                f.write(json.dumps(dict(r, **extra)) + "\n")
EOF
status=0
for w in single nanovllm; do
  for kind in plain options; do
    reps=${REPS_SINGLE:-5}; [ $w = nanovllm ] && reps=${REPS_WORK:-3}
    timeout ${BENCH_S:-150} "$MV" bench --model "$SHAPE" --random-weights --device "$DEVICE" --input "$dir/$w.$kind.jsonl" \
      --sampling file --repeat $reps --json "$OUT/options.$TAG.$w.$kind.json" > "$dir/$w.$kind.log" 2>&1
    rc=$?
    [ $rc -ne 0 ] && { echo "options_bench.sh: $w $kind exit $rc"; tail -5 "$dir/$w.$kind.log"; status=1; }
  done
done
python3 - "$OUT" "$TAG" <<'EOF'
import json, os, sys
out, tag = sys.argv[1:]
print("%-9s %-8s %12s %12s %10s" % ("workload", "sampling", "output tok/s", "ms / step", "vs plain"))
for w in ("single", "nanovllm"):
    base = None
    for kind in ("plain", "options"):
        try:
            d = json.load(open(os.path.join(out, f"options.{tag}.{w}.{kind}.json")))
        except (OSError, ValueError):
            print("%-9s %-8s (no JSON)" % (w, kind))
            continue
        base = base or d["output_tok_s"]
        print("%-9s %-8s %12.1f %12.3f %9.1f%%" % (w, kind, d["output_tok_s"], 1e3 * d["generate_s"] / d["steps"],
                                                  100 * d["output_tok_s"] / base))
EOF
exit $status

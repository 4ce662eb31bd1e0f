#!/usr/bin/env bash
# tests/gpu/pieces_band.sh - with decode attention version 7's rows longest first, where should version 4's
# pieces stop paying: 8 blocks a SM (33 to 132 rows of Qwen3-0.6B's 8 KV heads on 132 SMs), 4 (33 to 66 rows,
# the default: docs/09-engine.md, "Version 7's band"), or none? MV_DECODE_PIECES moves the band's top (kernels/attention.h): 8, 4 (the default) or 0 (no pieces:
# the order alone against the tail). From the repository root, with build/07-attention,
# build/minivllm and build/engine_check built or carried:
#   1. build/07-attention --kernel 7 with each setting: its checks, and the automatic count's times
#      (07-attention.pieces-N.json)
#   2. nano-vllm's workload, greedy, the three settings alternated, ROUNDS rounds (2), each with its step
#      trace (09-engine.pieces-N.rR.json and .csv)
#   3. the latency mode at 48 to 128 rows of equal lengths (1024 + 128), each setting
#      (09-engine.pieces-N.latency.json): the band's rows when no row is longer than the others
#   4. with CHECK=1: build/engine_check --device cuda under MV_DECODE_PIECES=0 (the band's graphs
#      unsplit, against the CPU reference)
# Then a table: output tok/s a round, and the decode steps' milliseconds by rows (the step traces).
# Leaves its output under $OUT.
set -uo pipefail
. tests/gpu/gpu_env.sh  # $OUT, run.log, .deps, LD_LIBRARY_PATH, MV_COMMIT
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
T0=$(date +%s)
el() { echo $(($(date +%s) - T0)); }
status=0
for n in 8 4 0; do
  MV_DECODE_PIECES=$n timeout "${CH07_S:-60}" ./build/07-attention --kernel 7 --json "$OUT/07-attention.pieces-$n.json" \
    > "$OUT/07-attention.pieces-$n.txt" 2>&1
  rc=$?; [ $rc -eq 0 ] || status=1
  echo "07-attention --kernel 7, MV_DECODE_PIECES=$n: rc=$rc $(tail -1 "$OUT/07-attention.pieces-$n.txt" | cut -c1-70) ($(el) s)"
done
model=(--random-weights --model tests/data/qwen3-0.6b-shape --device cuda)
W="$OUT/workload.jsonl"
python3 tests/bench/nanovllm_workload.py --out "$W" || exit 1
for r in $(seq 1 "${ROUNDS:-2}"); do
  for n in 8 4 0; do
    base="$OUT/09-engine.pieces-$n.r$r"
    MV_DECODE_PIECES=$n timeout 60 ./build/minivllm bench "${model[@]}" --input "$W" --sampling greedy --repeat 1 \
      --step-trace "$base.csv" --json "$base.json" > "$base.log" 2>&1
    rc=$?; [ $rc -eq 0 ] || status=1
    echo "workload, MV_DECODE_PIECES=$n, round $r: rc=$rc ($(el) s)"
  done
done
for n in 8 4 0; do
  base="$OUT/09-engine.pieces-$n.latency"
  MV_DECODE_PIECES=$n timeout 60 ./build/minivllm bench "${model[@]}" --latency --batch 48,64,96,128 --prompt-len 1024 \
    --output-len 128 --repeat 2 --json "$base.json" > "$base.log" 2>&1
  rc=$?; [ $rc -eq 0 ] || status=1
  echo "latency 48-128 rows, MV_DECODE_PIECES=$n: rc=$rc $(python3 -c "import json; d = json.load(open('$base.json'))
print([(b['batch'], round(b['output_tok_s']['median'])) for b in d['batches']])" 2>/dev/null) ($(el) s)"
done
if [ "${CHECK:-0}" = 1 ]; then
  MV_DECODE_PIECES=0 timeout "${CHECK_S:-300}" ./build/engine_check --device cuda > "$OUT/engine_check.pieces-0.txt" 2>&1
  rc=$?; [ $rc -eq 0 ] || status=1
  echo "engine_check, MV_DECODE_PIECES=0: rc=$rc, $(grep -c '^PASS' "$OUT/engine_check.pieces-0.txt") PASS," \
    "$(grep -c '^FAIL' "$OUT/engine_check.pieces-0.txt") FAIL ($(el) s)"
fi
OUT="$OUT" ROUNDS="${ROUNDS:-2}" python3 - <<'EOF'
import csv, json, os
out, rounds = os.environ["OUT"], int(os.environ["ROUNDS"])
bands = [(1, 32), (33, 64), (65, 96), (97, 132), (133, 256)]
print("\n| MV_DECODE_PIECES | output tok/s a round | prompt steps ms | " +
      " | ".join("%d-%d rows ms (steps)" % b for b in bands) + " |")
print("| ---: | ---: | ---: | " + " | ".join("---:" for _ in bands) + " |")
for n in (8, 4, 0):
    toks, pre, ms, steps = [], [], [[] for _ in bands], [0] * len(bands)
    for r in range(1, rounds + 1):
        base = os.path.join(out, "09-engine.pieces-%d.r%d" % (n, r))
        try:
            o = json.load(open(base + ".json"))["output_tok_s"]
            toks.append("%.0f" % (o["median"] if isinstance(o, dict) else o))
            rows = list(csv.DictReader(open(base + ".csv")))
        except (OSError, ValueError, KeyError):
            toks.append("-")
            continue
        pre.append(sum(float(x["runner_us"]) for x in rows if int(x["prefill_rows"]) > 0) / 1e3)
        dec = [x for x in rows if int(x["prefill_rows"]) == 0]
        for i, (lo, hi) in enumerate(bands):
            sel = [x for x in dec if lo <= int(x["rows"]) <= hi]
            ms[i].append(sum(float(x["runner_us"]) for x in sel) / 1e3)
            steps[i] = len(sel)
    mean = lambda v: "%.1f" % (sum(v) / len(v)) if v else "-"
    print("| %d | %s | %s | %s |" % (n, " / ".join(toks), mean(pre),
                                     " | ".join("%s (%d)" % (mean(m), s) for m, s in zip(ms, steps))))
EOF
echo "done in $(el) s"
exit $status

#!/usr/bin/env bash
# tests/gpu/tp_check.sh - the engine's cuda backend at --tensor-parallel-size 2 (one process per GPU,
# NCCL between them, MPI carrying the steps) against tp = 1, on a machine with 2 GPUs.
#
# One call of the lab's `device` tool, kind nvidia-h200-x2, from the repository root, carrying .deps:
#   MV_COMMIT=<git rev-parse --short HEAD> bash tests/gpu/tp_check.sh
# (the machine's copy of the tree may have no .git: MV_COMMIT names the commit in bench's JSON).
#
# What .deps/ must hold for it (the GPU machine has no package registry; Debian 12's packages, as
# the rest of .deps/): the build's usual ones (tests/gpu/bench.sh), and for MPI's header, when the
# machine's Open MPI has no mpicc + mpi.h of its own (it has Open MPI's mpirun and libmpi.so.40):
#   (cd .deps && apt-get download libopenmpi-dev)
# Only its headers are used (the Makefile finds $DEPS_PREFIX/usr/lib/x86_64-linux-gnu/openmpi/include
# and links the machine's own libmpi.so.40); its version should be the machine's Open MPI's major
# version (4.x: libmpi.so.40). The script says which mpi.h it used, and stops if there is none.
#
# Steps, each under `timeout`, every cap cut to what is left of TOTAL_S (default 560 s):
#   0. nvidia-smi (2 GPUs needed), mpirun and mpi.h found, .deps unpacked into /opt/deps, then
#      make -j16 DEPS_PREFIX=/opt/deps CUDA_ARCH=90 build/minivllm build/tp_allreduce
#      (`minivllm --version` must say NCCL: yes, MPI: yes).
#   1. tiny goldens (tests/data/tiny-qwen3-{tied,untied,mha}, golden.json's 11 prompts, greedy):
#      generate --device cuda at tp 1, then `mpirun -np 2 build/minivllm generate -tp 2 --device cuda`
#      with CUDA graphs, with --enforce-eager, and over NCCL's socket transport
#      (NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1); every tp 2 run must equal tp 1 token for token
#      (and each is also compared with transformers' greedy ids; the goldens' top-2 margins are
#      >= 5, far above bf16's error, so any difference is a FAIL).
#   2. Qwen3-0.6B shapes (tests/data/qwen3-0.6b-shape, --random-weights, seed 0: every rank draws
#      the whole model and keeps its shard): first-step logits of 4 prompts (1 to 300 tokens) at
#      tp 1, tp 2, tp 2 over sockets, and the cpu backend; NMSE of each against cuda tp 1 (and
#      against cpu) within BF16_NMSE_TOL, argmax compared (listed, not a verdict: random
#      weights give near ties).
#   3. build/tp_allreduce: the collectives of one step alone (2L + 1 all-reduces of [T, H] bf16
#      and the LM head's all-gather), Qwen3-8B's shapes, T = 1 and 256, NVLink/P2P and sockets.
#   4. minivllm bench on Qwen3-8B's shapes (tests/data/qwen3-8b-shape, --random-weights): single
#      stream (1 request, 512 + 256 tokens, --repeat 3) and nano-vllm's workload
#      (tests/bench/nanovllm_workload.py: 256 requests, --repeat 1 after bench's warm-up) at
#      tp 1 and tp 2, then tp 2 over sockets (single stream, then the workload while time is left:
#      a step that does not fit is listed as SKIPPED, never silently dropped).
# Leaves under $OUT (the device tool brings back 8 files at most): tp_check.log (everything
# printed), summary.json (the table's figures) and tp_check.tgz holding build.log, env.txt,
# tiny.*.jsonl, logits.*.npy, logits.json (the NMSE table), allreduce.{nvlink,socket}.json and
# bench.8b-{single,workload}-tp{1,2}[-socket].json (bench's --json); prints a short table last.
# Exit 0 when every step ran and every check passed.
#
# Time (estimates, not measured: the first run on GPUs will tell): build 1-2 min from a bare
# machine; each 8B bench process draws 8.2B random values (~30-40 s, every rank at once) and
# uploads 16 GB (tp 1) or 8 GB a GPU (tp 2); the workload ~20-40 s a repetition. Host memory:
# each rank holds the whole random model (16.4 GB) while it loads, so tp 2 needs ~35 GB at once
# (the machine's memory grows as it is used: KINDS.md).
#
# A dry run of the script's plumbing without a GPU (the cpu backend over MPI, tiny shapes for the
# bench, the NCCL-only step 3 skipped; a few minutes on 2 cores; the checks are the same):
#   MV_DEVICE=cpu BENCH_MODEL=tests/data/tiny-qwen3-tied \
#     WORKLOAD_ARGS="--num-seqs 8 --min-len 4 --max-input-len 40 --max-output-len 20 --max-id 500" \
#     SINGLE_ARGS="--num-seqs 1 --prompt-len 32 --output-len 16 --repeat 1" bash tests/gpu/tp_check.sh
set -uo pipefail
OUT=${OUT:-/tmp/mv-out}
mkdir -p "$OUT"
exec > >(tee "$OUT/tp_check.log") 2>&1

MV=./build/minivllm
TOTAL_S=${TOTAL_S:-560}
DEV=${MV_DEVICE:-cuda}
BENCH_MODEL=${BENCH_MODEL:-tests/data/qwen3-8b-shape}
read -r -a workload_args <<< "${WORKLOAD_ARGS:-}"
read -r -a single_args <<< "${SINGLE_ARGS:---num-seqs 1 --prompt-len 512 --output-len 256 --repeat 3}"
# cpu (the dry run): one thread a rank, and room for 2 ranks on a small machine.
dev=(--device "$DEV")
[ "$DEV" = cpu ] && dev+=(--threads 1)
export MV_COMMIT=${MV_COMMIT:-}
# NVLink multicast stays off on these machines (the environment sets it; never turned on here).
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
# Open MPI refuses to run as root (the GPU machine's user) without both.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# bf16 noise between two bf16 runs of the same model, relative to the logits' energy: each of the
# few dozen roundings in sequence has relative error <= 2^-9, giving an NMSE of order 1e-5; a
# wrong shard (a head or a vocabulary block misplaced) gives > 1e-1. The same bound as
# build/engine_check's BF16_LOGITS_NMSE_TOL, for the same reason.
BF16_NMSE_TOL=1e-3

T0=$(date +%s)
elapsed() { echo $(( $(date +%s) - T0 )); }
# The smaller of a step's own cap and what is left of TOTAL_S (less 15 s for the table); at least 10 s.
cap() { local left=$(( TOTAL_S - 15 - $(elapsed) )); [ "$left" -gt "$1" ] && left=$1; [ "$left" -lt 10 ] && left=10; echo $left; }
left() { echo $(( TOTAL_S - 15 - $(elapsed) )); }
status=0
fail() { echo "tp_check.sh: FAIL: $*"; status=1; }

echo "=================== environment ($(elapsed) s)"
{
  nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv
  nvidia-smi topo -m 2>/dev/null | head -6
  nvcc --version | tail -2
  command -v mpirun && mpirun --version 2>&1 | head -1
  env | grep -E '^NCCL_' | sort
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
ngpu=$(nvidia-smi -L 2>/dev/null | wc -l)
[ "$ngpu" -ge 2 ] || [ "$DEV" = cpu ] || { echo "tp_check.sh: $ngpu GPU(s) visible; this needs 2 (nvidia-h200-x2)"; exit 1; }
MPIRUN_BIN=$(command -v mpirun) || { echo "tp_check.sh: no mpirun on PATH"; exit 1; }
if [ "$DEV" = cuda ]; then
mkdir -p /opt/deps
for f in .deps/*.deb; do [ -f "$f" ] && dpkg -x "$f" /opt/deps; done
make_mpi=()
mpicc_here=$(dirname "$MPIRUN_BIN")/mpicc
if [ -x "$mpicc_here" ] && printf '#include <mpi.h>\n' | cc -E -x c $("$mpicc_here" --showme:compile 2>/dev/null) - \
     > /dev/null 2>&1; then
  make_mpi=(MPICC="$mpicc_here")
  echo "mpi.h: from $mpicc_here --showme"
elif [ -f /opt/deps/usr/lib/x86_64-linux-gnu/openmpi/include/mpi.h ]; then
  echo "mpi.h: /opt/deps/usr/lib/x86_64-linux-gnu/openmpi/include (libopenmpi-dev's deb from .deps/)"
else
  echo "tp_check.sh: no mpi.h: this mpirun has no mpicc with headers, and .deps/ has no libopenmpi-dev deb"
  echo "  here: (cd .deps && apt-get download libopenmpi-dev), then carry .deps again"
  exit 1
fi

echo "=================== build ($(elapsed) s)"
timeout "$(cap 300)" make -j16 DEPS_PREFIX=/opt/deps CUDA_ARCH=90 "${make_mpi[@]}" build/minivllm build/tp_allreduce \
  > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; echo "tp_check.sh: BUILD FAILED"; exit 1; }
"$MV" --version | tee -a "$OUT/env.txt"
"$MV" --version | grep -q "NCCL: yes, MPI: yes" || { echo "tp_check.sh: the build has no NCCL or no MPI"; exit 1; }
echo "built in $(elapsed) s"
fi

# mpirun -np 2 with the environment's NCCL variables passed on explicitly (-x), and no core
# binding (each rank draws random weights and converts tensors with many threads). MPIRUN2_SOCKET:
# the same over NCCL's socket transport, the one two hosts without a fast fabric use.
nccl_x=()
for v in $(env | grep -oE '^NCCL_[A-Z0-9_]+' | sort -u); do nccl_x+=(-x "$v"); done
MPIRUN2=("$MPIRUN_BIN" -np 2 --bind-to none "${nccl_x[@]}")
[ "$DEV" = cpu ] && MPIRUN2+=(--oversubscribe --mca btl self,vader)
MPIRUN2_SOCKET=(env NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 "${MPIRUN2[@]}" -x NCCL_P2P_DISABLE -x NCCL_SHM_DISABLE)

echo "=================== 1. tiny goldens: tp 2 against tp 1, token for token ($(elapsed) s)"
for m in tied untied mha; do
  model=tests/data/tiny-qwen3-$m
  python3 - "$model/golden.json" > "$OUT/tiny.$m.in.jsonl" <<'PY'
import json, sys
for c in json.load(open(sys.argv[1]))["cases"]:
    print(json.dumps({"prompt_token_ids": c["prompt_token_ids"], "max_tokens": len(c["greedy_token_ids"]),
                      "temperature": 0, "ignore_eos": True}))
PY
  gen=(generate --model "$model" "${dev[@]}" --input "$OUT/tiny.$m.in.jsonl" --ordered)
  CUDA_VISIBLE_DEVICES=0 timeout "$(cap 60)" "$MV" "${gen[@]}" --output "$OUT/tiny.$m.tp1.jsonl" || fail "tiny $m tp 1"
  timeout "$(cap 90)" "${MPIRUN2[@]}" "$MV" "${gen[@]}" -tp 2 --output "$OUT/tiny.$m.tp2.jsonl" || fail "tiny $m tp 2"
  timeout "$(cap 90)" "${MPIRUN2[@]}" "$MV" "${gen[@]}" -tp 2 --enforce-eager --output "$OUT/tiny.$m.tp2-eager.jsonl" \
    || fail "tiny $m tp 2 --enforce-eager"
  timeout "$(cap 90)" "${MPIRUN2_SOCKET[@]}" "$MV" "${gen[@]}" -tp 2 --output "$OUT/tiny.$m.tp2-socket.jsonl" \
    || fail "tiny $m tp 2 over sockets"
done
python3 - "$OUT" <<'PY' || status=1
import json, os, sys
out = sys.argv[1]
bad = 0
print(f"{'model':8s} {'run':14s} {'= tp 1':>8s} {'= HF':>8s}  first difference")
for m in ("tied", "untied", "mha"):
    g = json.load(open(f"tests/data/tiny-qwen3-{m}/golden.json"))
    cases = g["cases"]
    def ids(run):
        p = f"{out}/tiny.{m}.{run}.jsonl"
        return [json.loads(l)["token_ids"] for l in open(p)] if os.path.exists(p) else None
    ref = ids("tp1")
    for run in ("tp1", "tp2", "tp2-eager", "tp2-socket"):
        got = ids(run)
        if got is None or len(got) != len(cases):
            print(f"{m:8s} {run:14s} no output"); bad += 1; continue
        same_tp1 = sum(a == b for a, b in zip(got, ref or []))
        same_hf = sum(a == c["greedy_token_ids"] for a, c in zip(got, cases))
        first = ""
        for i, (a, c) in enumerate(zip(got, cases)):
            if a != c["greedy_token_ids"]:
                k = next(j for j in range(min(len(a), len(c["greedy_token_ids"])) + 1)
                         if j >= len(a) or a[j] != c["greedy_token_ids"][j])
                first = f"prompt {i} step {k} (HF top-2 margin {c['top2_margins'][k] if k < len(c['top2_margins']) else '-'})"
                break
        print(f"{m:8s} {run:14s} {same_tp1:4d}/{len(cases):<3d} {same_hf:4d}/{len(cases):<3d}  {first}")
        if run != "tp1" and same_tp1 != len(cases): bad += 1
        if same_hf != len(cases): bad += 1
print("tiny goldens:", "PASS" if bad == 0 else f"FAIL ({bad})")
sys.exit(1 if bad else 0)
PY

echo "=================== 2. Qwen3-0.6B shapes, random weights: first-step logits, tp 2 against tp 1 ($(elapsed) s)"
python3 - > "$OUT/logits.in.jsonl" <<'PY'
import json, random
rng = random.Random(17)
for n in (1, 7, 64, 300):
    print(json.dumps({"prompt_token_ids": [rng.randrange(151643) for _ in range(n)], "max_tokens": 1,
                      "temperature": 0, "ignore_eos": True}))
PY
lg=(generate --model tests/data/qwen3-0.6b-shape --random-weights --seed 0 --input "$OUT/logits.in.jsonl" --ordered
    --output /dev/null --max-model-len 1024 --max-num-seqs 8)
CUDA_VISIBLE_DEVICES=0 timeout "$(cap 60)" "$MV" "${lg[@]}" "${dev[@]}" --logits-out "$OUT/logits.tp1.npy" \
  || fail "0.6b logits tp 1"
timeout "$(cap 90)" "${MPIRUN2[@]}" "$MV" "${lg[@]}" "${dev[@]}" -tp 2 --logits-out "$OUT/logits.tp2.npy" || fail "0.6b logits tp 2"
timeout "$(cap 90)" "${MPIRUN2_SOCKET[@]}" "$MV" "${lg[@]}" "${dev[@]}" -tp 2 --logits-out "$OUT/logits.tp2-socket.npy" \
  || fail "0.6b logits tp 2 over sockets"
timeout "$(cap 90)" "$MV" "${lg[@]}" --device cpu --logits-out "$OUT/logits.cpu.npy" || fail "0.6b logits cpu"
python3 - "$OUT" "$BF16_NMSE_TOL" <<'PY' || status=1
import json, os, sys
import numpy as np
out, tol = sys.argv[1], float(sys.argv[2])
def load(run):
    p = f"{out}/logits.{run}.npy"
    return np.load(p).astype(np.float64) if os.path.exists(p) else None
runs = {r: load(r) for r in ("tp1", "tp2", "tp2-socket", "cpu")}
rows, bad = [], 0
def nmse(a, b): return float(((a - b) ** 2).sum() / max((b ** 2).sum(), 1e-300))
print(f"{'run':12s} {'against':8s} {'NMSE':>10s} {'max |diff|':>11s} {'argmax same':>12s}")
for run, ref in (("tp2", "tp1"), ("tp2-socket", "tp1"), ("tp2-socket", "tp2"), ("tp1", "cpu"), ("tp2", "cpu")):
    a, b = runs[run], runs[ref]
    if a is None or b is None or a.shape != b.shape or not np.isfinite(a).all():
        print(f"{run:12s} {ref:8s} missing, misshapen or not finite"); bad += 1; continue
    e = nmse(a, b)
    same = int((a.argmax(1) == b.argmax(1)).sum())
    print(f"{run:12s} {ref:8s} {e:10.3e} {np.abs(a - b).max():11.4f} {same:6d}/{a.shape[0]}")
    rows.append({"run": run, "against": ref, "nmse": e, "max_abs": float(np.abs(a - b).max()), "argmax_same": same,
                 "rows": int(a.shape[0])})
    if e > tol: bad += 1
json.dump({"tolerance_nmse": tol, "comparisons": rows}, open(f"{out}/logits.json", "w"), indent=1)
print("0.6b logits:", "PASS" if bad == 0 else f"FAIL ({bad})", f"(NMSE bound {tol:g})")
sys.exit(1 if bad else 0)
PY

echo "=================== 3. the collectives alone, Qwen3-8B shapes ($(elapsed) s)"
if [ "$DEV" = cuda ]; then
  timeout "$(cap 60)" "${MPIRUN2[@]}" ./build/tp_allreduce --model tests/data/qwen3-8b-shape --tokens 1,256 \
    --json "$OUT/allreduce.nvlink.json" || fail "tp_allreduce"
  timeout "$(cap 60)" "${MPIRUN2_SOCKET[@]}" ./build/tp_allreduce --model tests/data/qwen3-8b-shape \
    --tokens 1,256 --json "$OUT/allreduce.socket.json" || fail "tp_allreduce over sockets"
else
  echo "SKIPPED: NCCL between GPUs (MV_DEVICE=cpu)"
fi

echo "=================== 4. bench, $BENCH_MODEL, random weights ($(elapsed) s)"
WORK=$(mktemp /tmp/mv-nanovllm.XXXXXX.jsonl)
trap 'rm -f "$WORK"' EXIT
python3 tests/bench/nanovllm_workload.py "${workload_args[@]}" --out "$WORK" || fail "no workload"
bench8b=(bench --random-weights --model "$BENCH_MODEL" "${dev[@]}")
single=("${single_args[@]}")
workload=(--input "$WORK" --sampling greedy --repeat 1)
steps=()
# run NAME NEED_S CAP_S [socket] -- ARGS...: one bench, skipped (and said so) when less than NEED_S is left.
run() {
  local name=$1 need=$2 limit=$3 how=$4; shift 5
  steps+=("$name")
  if [ "$(left)" -lt "$need" ]; then echo "$name: SKIPPED ($(left) s left, needs ~$need s)"; return; fi
  echo "----- $name ($(elapsed) s, timeout $(cap "$limit") s)"
  local json="$OUT/bench.8b-$name.json"
  case $how in
    tp1) CUDA_VISIBLE_DEVICES=0 timeout "$(cap "$limit")" "$MV" "${bench8b[@]}" --json "$json" "$@" ;;
    tp2) timeout "$(cap "$limit")" "${MPIRUN2[@]}" "$MV" "${bench8b[@]}" -tp 2 --json "$json" "$@" ;;
    socket) timeout "$(cap "$limit")" "${MPIRUN2_SOCKET[@]}" "$MV" "${bench8b[@]}" -tp 2 --json "$json" "$@" ;;
  esac || fail "bench $name"
}
run single-tp1 60 120 tp1 -- "${single[@]}"
run single-tp2 60 120 tp2 -- "${single[@]}"
run workload-tp1 90 150 tp1 -- "${workload[@]}"
run workload-tp2 90 150 tp2 -- "${workload[@]}"
run single-tp2-socket 60 120 socket -- "${single[@]}"
run workload-tp2-socket 120 150 socket -- "${workload[@]}"

echo
echo "=================== summary ($(elapsed) s)"
python3 - "$OUT" "${steps[@]}" <<'PY'
import json, os, sys
out, steps = sys.argv[1], sys.argv[2:]
def load(p):
    p = os.path.join(out, p)
    return json.load(open(p)) if os.path.exists(p) else None
first = next((d for d in (load(f"bench.8b-{s}.json") for s in steps) if d), None)
if first:
    print(f"{first.get('gpu') or first['device']}, commit {first['commit']}, {first['date']}, "
          f"{first['config']['n_params'] / 1e9:.2f}B params (random weights)")
summary = {"bench": {}, "allreduce": {}}
print(f"{'bench (Qwen3-8B shapes)':24s} {'output tok/s':>12s} {'ms/step':>8s} {'runner ms/step':>14s} {'vs tp 1':>8s}")
base = {}
for s in steps:
    d = load(f"bench.8b-{s}.json")
    if not d:
        print(f"{s:24s} {'no JSON (failed or skipped)':>12s}")
        continue
    reps = d.get("repetitions") or []
    st = sum(r["steps"] for r in reps) if reps else 0
    gen = sum(r["generate_s"] for r in reps) if reps else 0
    run = sum(r["runner_s"] for r in reps) if reps else 0
    kind = s.split("-")[0]
    if s.endswith("tp1"): base[kind] = d["output_tok_s"]
    ratio = d["output_tok_s"] / base[kind] if kind in base and base[kind] else float("nan")
    print(f"{s:24s} {d['output_tok_s']:12,.0f} {1e3 * gen / max(st, 1):8.2f} {1e3 * run / max(st, 1):14.2f} "
          f"{ratio:7.2f}x")
    summary["bench"][s] = {"output_tok_s": d["output_tok_s"], "steps": st, "ms_per_step": 1e3 * gen / max(st, 1),
                           "runner_ms_per_step": 1e3 * run / max(st, 1), "vs_tp1": ratio}
for t in ("nvlink", "socket"):
    d = load(f"allreduce.{t}.json")
    if not d: continue
    for x in d["steps"]:
        print(f"collectives alone, {t:6s} T={x['tokens']:<4d}: {x['allreduces']} all-reduces of {x['allreduce_bytes']} B "
              f"= {x['allreduce_step_ms']:.3f} ms/step ({x['allreduce_us_each']:.1f} us each), "
              f"+ the LM head's all-gather = {x['collectives_step_ms']:.3f} ms/step")
    summary["allreduce"][t] = d["steps"]
json.dump(summary, open(os.path.join(out, "summary.json"), "w"), indent=1)
PY
# The device tool brings back at most 8 files: everything but the log and the summary in one tarball.
(cd "$OUT" && find . -maxdepth 1 -type f ! -name tp_check.log ! -name summary.json ! -name tp_check.tgz -printf '%P\n' \
   | tar czf tp_check.tgz -T - && find . -maxdepth 1 -type f ! -name tp_check.log ! -name summary.json \
   ! -name tp_check.tgz -delete)
echo "tp_check.sh: $(elapsed) s, $([ $status -eq 0 ] && echo PASS || echo FAIL) (files: $OUT/tp_check.log, summary.json, tp_check.tgz)"
exit $status

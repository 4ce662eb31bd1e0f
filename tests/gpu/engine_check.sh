#!/usr/bin/env bash
# tests/gpu/engine_check.sh - the engine's cuda backend on the GPU machine.
#
# One call of the lab's `device` tool runs this on an H200 machine:
#   bash tests/gpu/engine_check.sh
# It unpacks the Debian packages carried in .deps/ (the GPU machine has no
# package registry) into /opt/deps, builds for sm_90, then:
#   1. build/engine_check (--device cuda): the tiny transformers checkpoints
#      alone / batched / prefix-cached / chunked / preempted / memory-sized,
#      first-step logits, CUDA graphs against eager launches (bit-identical
#      tokens and logits), the decode megakernel's graphs (MV_MEGAKERNEL=1, the default)
#      and the unfused graphs (MV_MEGAKERNEL=0) against eager at 1, 2, 4 and 8 rows, decode steps as
#      two halves at once (MV_DECODE_HALVES=4: the goldens, and graphs against eager), and
#      the GPU sampler against its CPU reference;
#      then the goldens again with --enforce-eager. One line
#      per case: PASS, NEAR-TIE (a bf16 flip at an HF near tie, listed),
#      FAIL. All three checkpoints run on cuda (head_dim 64 / 128 / 64).
#   1b. build/engine_check again with MV_TP_COMM_OF_ONE=1: the runner's tensor-parallel path
#      (NCCL, the collectives in the graphs, the vocab-parallel LM head) on one GPU with a
#      communicator of one rank, which must give tp = 1's results.
#   2. minivllm generate --device cuda and --device cpu on the demo prompts
#      of tiny-qwen3-mha and on tests/gpu/options.jsonl, the outputs side by side.
#   3. compute-sanitizer over one generate run (every kernel of the step,
#      prefill and decode, and the sampler; a second memcheck run on
#      tests/gpu/options.jsonl for the sampling options' kernels): memcheck (out-of-bounds and
#      misaligned accesses, leaks of device memory), then racecheck (shared
#      memory hazards: the attention tiles, the norms' and the sampler's
#      block reductions).
#   4. python3 tests/data/make_tiny_qwen3.py --check --no-retrain: the
#      committed checkpoints' goldens recomputed by this machine's
#      transformers / torch (greedy ids equal, every top-2 margin above the
#      bf16 floor). A few seconds, offline.
# Leaves under $OUT: engine_check.txt, generate.{cuda,cpu}.jsonl,
# sanitizer.txt (memcheck and racecheck verdicts), sanitizer.log,
# racecheck.log, tiny_check.txt, engine_check.comm1.log, options.{cuda,cpu}.jsonl, env.txt,
# run.log. Exit 1 if any part failed.
set -uo pipefail
. tests/gpu/gpu_env.sh  # $OUT, run.log, .deps, LD_LIBRARY_PATH, MV_COMMIT

{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  nvcc --version | tail -2
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

make -j16 DEPS_PREFIX=/opt/deps CUDA_ARCH=90 || { echo "BUILD FAILED"; exit 1; }
status=0

echo "=================== build/engine_check --device cuda (CUDA graphs on)"
CUDA_VISIBLE_DEVICES=0 ./build/engine_check --device cuda | tee "$OUT/engine_check.txt"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
echo "=================== build/engine_check --device cuda --enforce-eager"
CUDA_VISIBLE_DEVICES=0 ./build/engine_check --device cuda --enforce-eager | tee "$OUT/engine_check.eager.txt" \
  | grep -vE "^PASS"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1

echo "=================== build/engine_check --device cuda, MV_TP_COMM_OF_ONE=1 (the tensor-parallel path at tp = 1)"
# The runner's tensor-parallel path (its NCCL communicator, the collectives captured in the decode
# graphs, the vocab-parallel embedding and LM head) on one GPU, with a communicator of one rank:
# every case must give tp = 1's bits. NCCL_DEBUG=INFO shows that the communicators were made.
MV_TP_COMM_OF_ONE=1 NCCL_NVLS_ENABLE=0 NCCL_DEBUG=INFO CUDA_VISIBLE_DEVICES=0 ./build/engine_check --device cuda \
  > "$OUT/engine_check.comm1.log" 2>&1
[ $? -eq 0 ] || status=1
grep -vE "^PASS|NCCL INFO" "$OUT/engine_check.comm1.log" | tail -8
echo "NCCL communicators made: $(grep -c 'Init COMPLETE' "$OUT/engine_check.comm1.log")"

echo "=================== minivllm generate, tiny-qwen3-mha, cuda vs cpu"
model=tests/data/tiny-qwen3-mha
for dev in cuda cpu; do
  CUDA_VISIBLE_DEVICES=0 ./build/minivllm generate --model $model --device $dev \
    --input chapters/09-engine/demo.jsonl --output "$OUT/generate.$dev.jsonl" --ordered --max-num-seqs 8 || status=1
done
paste -d'\n' "$OUT/generate.cuda.jsonl" "$OUT/generate.cpu.jsonl" | sed 's/^/  /'
# vLLM's other options (tests/gpu/options.jsonl: min_tokens, penalties, min_p, logprobs), sampled on the
# GPU by kernels/sampling_opts.h: the same lines on both backends, side by side (the tokens agree
# unless bf16 moves a draw; build/engine_check above holds the exact comparison).
for dev in cuda cpu; do
  CUDA_VISIBLE_DEVICES=0 ./build/minivllm generate --model $model --device $dev \
    --input tests/gpu/options.jsonl --output "$OUT/options.$dev.jsonl" --ordered --max-num-seqs 8 || status=1
done
paste -d'\n' "$OUT/options.cuda.jsonl" "$OUT/options.cpu.jsonl" | cut -c1-160 | sed 's/^/  /'

echo "=================== compute-sanitizer memcheck: generate --device cuda (decode steps replayed from CUDA graphs)"
CUDA_VISIBLE_DEVICES=0 compute-sanitizer --tool memcheck --error-exitcode 99 ./build/minivllm generate \
  --model $model --device cuda --input chapters/09-engine/demo.jsonl --output /dev/null \
  --max-num-seqs 8 --gpu-memory-utilization 0.05 > "$OUT/sanitizer.log" 2>&1
rc=$?
echo "generate memcheck rc=$rc $(grep -E 'ERROR SUMMARY' "$OUT/sanitizer.log" | tail -1)" | tee "$OUT/sanitizer.txt"
[ $rc -ne 0 ] && { grep -E "Invalid|Error|error" "$OUT/sanitizer.log" | sort | uniq -c | sort -rn | head -12; status=1; }
# The options' kernels (sampling_prepare_cuda, sampling_logprobs_finish_cuda) in prefill and graph decode steps.
CUDA_VISIBLE_DEVICES=0 compute-sanitizer --tool memcheck --error-exitcode 99 ./build/minivllm generate \
  --model $model --device cuda --input tests/gpu/options.jsonl --output /dev/null \
  --max-num-seqs 8 --gpu-memory-utilization 0.05 > "$OUT/sanitizer.options.log" 2>&1
rc=$?
echo "generate (options) memcheck rc=$rc $(grep -E 'ERROR SUMMARY' "$OUT/sanitizer.options.log" | tail -1)" \
  | tee -a "$OUT/sanitizer.txt"
[ $rc -ne 0 ] && { grep -E "Invalid|Error|error" "$OUT/sanitizer.options.log" | sort | uniq -c | sort -rn | head -12; status=1; }

echo "=================== tests/data/make_tiny_qwen3.py --check --no-retrain (this machine's transformers)"
# The committed checkpoints' goldens, recomputed by this machine's transformers/torch (seconds);
# retraining is skipped: it takes minutes and is not bit-reproducible across torch versions.
HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 timeout 120 python3 tests/data/make_tiny_qwen3.py --check --no-retrain \
  2>&1 | grep -v -i warn | tee "$OUT/tiny_check.txt"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1

echo "=================== compute-sanitizer racecheck: generate --device cuda"
# Racecheck serialises every block's shared-memory accesses, so it gets a
# short input: a 9-token greedy prefill and its decodes, one top-k/top-p
# sampled request (prefill, decode and both sampler paths), and one that uses
# every sampling option (the options' kernels' block reductions).
race_in=$(mktemp)
cat > "$race_in" <<'EOF2'
{"prompt_token_ids": [431, 173, 170, 322, 319, 246, 264, 420, 7], "max_tokens": 4, "temperature": 0, "ignore_eos": true}
{"prompt_token_ids": [40, 60], "max_tokens": 4, "temperature": 0.8, "top_k": 50, "top_p": 0.9, "seed": 7, "ignore_eos": true}
{"prompt_token_ids": [431, 173, 170, 322], "max_tokens": 4, "temperature": 0.9, "min_p": 0.05, "presence_penalty": 0.5, "frequency_penalty": 0.4, "repetition_penalty": 1.2, "logprobs": 5, "seed": 3, "min_tokens": 3}
EOF2
CUDA_VISIBLE_DEVICES=0 compute-sanitizer --tool racecheck --racecheck-report all --error-exitcode 99 \
  ./build/minivllm generate --model $model --device cuda --input "$race_in" --output /dev/null \
  --max-num-seqs 8 --gpu-memory-utilization 0.05 > "$OUT/racecheck.log" 2>&1
rc=$?
echo "generate racecheck rc=$rc $(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY' "$OUT/racecheck.log" | tail -1)" \
  | tee -a "$OUT/sanitizer.txt"
[ $rc -ne 0 ] && { grep -E "Race|Hazard|hazard|Error" "$OUT/racecheck.log" | sort | uniq -c | sort -rn | head -12; status=1; }

echo "=================== engine_check.sh: $([ $status -eq 0 ] && echo PASS || echo FAIL)"
exit $status

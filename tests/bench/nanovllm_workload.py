#!/usr/bin/env python3
"""tests/bench/nanovllm_workload.py - nano-vllm's benchmark workload, as JSONL for `minivllm bench --input`.

nano-vllm's bench.py (github.com/GeeeekExplorer/nano-vllm, bench.py) draws its workload so:

    seed(0)
    num_seqs = 256
    max_input_len = 1024
    max_ouput_len = 1024
    prompt_token_ids = [[randint(0, 10000) for _ in range(randint(100, max_input_len))] for _ in range(num_seqs)]
    sampling_params = [SamplingParams(temperature=0.6, ignore_eos=True, max_tokens=randint(100, max_ouput_len))
                       for _ in range(num_seqs)]

so the draws come in this order, from Python's random module seeded with 0: for each of the 256
requests, its prompt length (randint(100, 1024)) and then that many ids (randint(0, 10000), both
ends included); then, once every prompt is drawn, the 256 output lengths (randint(100, 1024)).
This script makes the same calls in the same order, so its requests are bench.py's, id for id.
It times output tokens only: "Throughput" there is sum(max_tokens) / seconds, minivllm bench's
output tok/s. (bench.py's warm-up, generate(["Benchmark: "], SamplingParams()), is not part of
the workload: minivllm bench does its own.)

Each line: {"prompt_token_ids": [...], "max_tokens": N, "temperature": 0.6, "ignore_eos": true}
(bench.py samples every request at temperature 0.6, with no top-k or top-p; --greedy leaves
"temperature" out, so the line is greedy, minivllm bench's default).

    python3 tests/bench/nanovllm_workload.py > /tmp/nanovllm.jsonl
    ./build/minivllm bench --model DIR --input /tmp/nanovllm.jsonl                  # as in the file: 0.6
    ./build/minivllm bench --model DIR --input /tmp/nanovllm.jsonl --sampling greedy
    ./build/minivllm bench --model DIR --input /tmp/nanovllm.jsonl --sampling qwen3  # 0.6, top_k 20, top_p 0.95

The other options change bench.py's constants (for a tiny model's small vocabulary and context),
never the order of the draws. The default output is pinned by its sha256 in tests/test_bench.c.
Python 3 standard library only; random.seed(0) and randint draw the same numbers on every
Python 3 since 3.2.
"""
import argparse
import json
import random
import sys


def workload(num_seqs=256, min_len=100, max_input_len=1024, max_output_len=1024, max_id=10000):
    """bench.py's prompt_token_ids and max_tokens, drawn in its order."""
    random.seed(0)
    prompts = [[random.randint(0, max_id) for _ in range(random.randint(min_len, max_input_len))]
               for _ in range(num_seqs)]
    max_tokens = [random.randint(min_len, max_output_len) for _ in range(num_seqs)]
    return prompts, max_tokens


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--greedy", action="store_true", help="leave out bench.py's temperature 0.6 (greedy lines)")
    p.add_argument("--out", default="-", help="output file (default: standard output)")
    p.add_argument("--num-seqs", type=int, default=256, help="bench.py's num_seqs (256)")
    p.add_argument("--min-len", type=int, default=100, help="the 100 of randint(100, ...) (100)")
    p.add_argument("--max-input-len", type=int, default=1024, help="bench.py's max_input_len (1024)")
    p.add_argument("--max-output-len", type=int, default=1024, help="bench.py's max_ouput_len (1024)")
    p.add_argument("--max-id", type=int, default=10000, help="the 10000 of randint(0, 10000) (10000)")
    a = p.parse_args()
    prompts, max_tokens = workload(a.num_seqs, a.min_len, a.max_input_len, a.max_output_len, a.max_id)
    f = sys.stdout if a.out == "-" else open(a.out, "w")
    for ids, m in zip(prompts, max_tokens):
        line = {"prompt_token_ids": ids, "max_tokens": m}
        if not a.greedy:
            line["temperature"] = 0.6
        line["ignore_eos"] = True
        f.write(json.dumps(line) + "\n")
    if f is not sys.stdout:
        f.close()


if __name__ == "__main__":
    main()

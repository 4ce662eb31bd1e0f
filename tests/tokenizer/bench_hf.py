#!/usr/bin/env python3
"""
tests/tokenizer/bench_hf.py - one-thread speed: the C tokenizer vs Hugging Face `tokenizers`.

Both encode the same documents (textgen.bench_documents: a few MB of mixed
English prose, code and Chinese, plus a little of every hard case), one
document per call, on one thread, in the same run on the same machine:

  C:  build/minivllm tokenize --model DIR --input docs.jsonl --bench --repeat R
      (times only the encoding loop, after loading and JSON parsing)
  HF: Tokenizer.encode_batch_fast(docs) (its fastest path: no offsets) with
      RAYON_NUM_THREADS=1 and TOKENIZERS_PARALLELISM=false, timed around the call.

Each side reports its first pass (cold word cache) and its best of R passes.
The ids are checked equal (count and sum) before anything is reported.
A second, adversarial row uses random strings (textgen.random_strings), in
which almost no word repeats, so caches do not help.

Run:  MV_QWEN3_DIR=../shared/models/qwen3-0.6b python3 tests/tokenizer/bench_hf.py \\
          --minivllm build/minivllm [--mb 4] [--json out.json]
"""
import os

# Must be set before tokenizers starts its thread pool.
os.environ["RAYON_NUM_THREADS"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"

import argparse  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import textgen  # noqa: E402


def bench_c(minivllm, model, docs, repeat, tmp):
    path = os.path.join(tmp, "docs.jsonl")
    with open(path, "w", encoding="utf-8") as f:
        for d in docs:
            f.write(json.dumps({"text": d}, ensure_ascii=False) + "\n")
    # The C tokenizer has no threads; RAYON_NUM_THREADS=1 does the same for HF.
    cmd = [minivllm, "tokenize", "--model", model, "--input", path, "--bench", "--repeat", str(repeat)]
    p = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(p.stdout)


def bench_hf(tok, docs, repeat):
    times, ids = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        # encode_batch_fast skips the character offsets; fall back on older versions.
        fast = getattr(tok, "encode_batch_fast", tok.encode_batch)
        enc = fast(docs, add_special_tokens=False)
        times.append(time.perf_counter() - t0)
        ids = enc
    n_tokens = sum(len(e.ids) for e in ids)
    id_sum = sum(sum(e.ids) for e in ids)
    return times[0], min(times), n_tokens, id_sum


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    textgen.add_common_args(ap)
    ap.add_argument("--mb", type=float, default=4.0, help="megabytes of mixed text (default 4)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()
    if not args.model:
        sys.exit("bench_hf.py: set MV_QWEN3_DIR or --model")
    from tokenizers import Tokenizer
    import tokenizers

    t0 = time.perf_counter()
    tok = Tokenizer.from_file(os.path.join(args.model, "tokenizer.json"))
    hf_load = time.perf_counter() - t0
    sets = [("mixed prose, code, Chinese", textgen.bench_documents(args.mb, args.seed)),
            ("random strings (adversarial)", textgen.random_strings(int(args.mb * 4000), args.seed))]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, docs in sets:
            c = bench_c(args.minivllm, args.model, docs, args.repeat, tmp)
            hf_first, hf_best, hf_tokens, hf_sum = bench_hf(tok, docs, args.repeat)
            if (c["tokens"], c["id_sum"]) != (hf_tokens, hf_sum):
                sys.exit(f"bench_hf.py: {name}: ids differ (minivllm {c['tokens']} tokens, sum {c['id_sum']}; "
                         f"hf {hf_tokens} tokens, sum {hf_sum}); run compare_hf.py")
            mb = c["bytes"] / 1e6
            rows.append({"text": name, "docs": len(docs), "mb": round(mb, 2), "tokens": c["tokens"],
                         "minivllm_first_mb_s": round(mb / c["first_s"], 2),
                         "minivllm_best_mb_s": round(mb / c["best_s"], 2),
                         "hf_first_mb_s": round(mb / hf_first, 2), "hf_best_mb_s": round(mb / hf_best, 2),
                         "ratio_first": round(hf_first / c["first_s"], 2),
                         "ratio_best": round(hf_best / c["best_s"], 2)})
            c_load = c["load_s"]
    result = {"machine": f"{cpu_name()}, {os.cpu_count()} cores, no GPU used", "threads": 1,
              "tokenizers_version": tokenizers.__version__, "regex_jit": c["regex_jit"],
              "load_s": {"minivllm": round(c_load, 3), "hf": round(hf_load, 3)},
              "command": "MV_QWEN3_DIR=../shared/models/qwen3-0.6b python3 tests/tokenizer/bench_hf.py "
                         f"--minivllm build/minivllm --mb {args.mb:g} --repeat {args.repeat}",
              "rows": rows}
    print(f"machine: {result['machine']}; tokenizers {tokenizers.__version__}; one thread each")
    print(f"load tokenizer.json: minivllm {c_load:.3f} s, HF {hf_load:.3f} s")
    print("| text | MB | tokens | minivllm MB/s (first / best) | HF tokenizers MB/s (first / best) | speed-up (first / best) |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['text']} | {r['mb']} | {r['tokens']} | {r['minivllm_first_mb_s']} / {r['minivllm_best_mb_s']} "
              f"| {r['hf_first_mb_s']} / {r['hf_best_mb_s']} | {r['ratio_first']}x / {r['ratio_best']}x |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
            f.write("\n")


if __name__ == "__main__":
    main()

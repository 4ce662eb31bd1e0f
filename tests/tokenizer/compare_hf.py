#!/usr/bin/env python3
"""
tests/tokenizer/compare_hf.py - the C tokenizer against Hugging Face, id for id.

Runs build/minivllm (tokenize / detokenize with --input FILE.jsonl, one
process for all cases) and compares with the `tokenizers` package on the
real Qwen3 tokenizer, and the chat format with transformers'
apply_chat_template:

  1. encode: hand-written hard cases + N seeded random strings (textgen.py);
  2. round trip: decode(encode(text)) == NFC(text), batch and streaming;
  3. decode of random id sequences (partial UTF-8 -> U+FFFD), with and
     without skip_special_tokens;
  4. chat: rendered text and ids for hand-written and random conversations,
     with add_generation_prompt and enable_thinking on, off and absent.

Any mismatch prints the case and exits 1. Without MV_QWEN3_DIR (or --model)
or without the Python packages it prints SKIP and exits 0.

Run:  make test-tokenizer   or
      MV_QWEN3_DIR=../shared/models/qwen3-0.6b python3 tests/tokenizer/compare_hf.py --minivllm build/minivllm
Python is only used here, to test; the engine never runs it.
"""
import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import textgen  # noqa: E402


def skip(why):
    print(f"SKIP tokenizer comparison with Hugging Face: {why}")
    sys.exit(0)


def run_lines(cmd, lines, tmp, name):
    """Write lines to tmp/name, run cmd with --input on it, return its output lines."""
    path = os.path.join(tmp, name)
    with open(path, "w", encoding="utf-8") as f:
        for line in lines:
            f.write(json.dumps(line, ensure_ascii=False) + "\n")
    p = subprocess.run(cmd + ["--input", path], capture_output=True, text=True, encoding="utf-8")
    if p.returncode != 0:
        print(f"FAIL: {' '.join(cmd)} --input {path} exited {p.returncode}:\n{p.stderr[-2000:]}")
        sys.exit(1)
    out = p.stdout.split("\n")
    if out and out[-1] == "":
        out.pop()
    if len(out) != len(lines):
        print(f"FAIL: {name}: {len(lines)} requests but {len(out)} output lines")
        sys.exit(1)
    return [json.loads(x) for x in out]


class Report:
    def __init__(self):
        self.failures = 0
        self.checked = {}

    def check(self, section, ok, detail):
        self.checked[section] = self.checked.get(section, 0) + 1
        if not ok:
            self.failures += 1
            if self.failures <= 15:
                print(f"MISMATCH [{section}] {detail()}")


def first_diff(a, b):
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    textgen.add_common_args(ap)
    ap.add_argument("--n-random", type=int, default=4000, help="random strings (default 4000)")
    ap.add_argument("--n-random-chats", type=int, default=300)
    ap.add_argument("--seed", type=int, default=20240607)
    args = ap.parse_args()
    if not args.model:
        skip("MV_QWEN3_DIR is not set (point it at ../shared/models/qwen3-0.6b)")
    if not os.path.isfile(os.path.join(args.model, "tokenizer.json")):
        skip(f"no tokenizer.json in {args.model}")
    # transformers warns at import that PyTorch is absent; only its tokenizer is used.
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    try:
        from tokenizers import Tokenizer, normalizers
        from transformers import AutoTokenizer
    except ImportError as e:
        skip(f"{e} (pip install -r tests/requirements.txt)")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

    t0 = time.time()
    hf = Tokenizer.from_file(os.path.join(args.model, "tokenizer.json"))
    nfc = normalizers.NFC()
    hf_chat = AutoTokenizer.from_pretrained(args.model)
    tok_cmd = [args.minivllm, "tokenize", "--model", args.model]
    detok_cmd = [args.minivllm, "detokenize", "--model", args.model]
    rep = Report()

    with tempfile.TemporaryDirectory() as tmp:
        # 1. encode
        texts = textgen.hard_cases() + textgen.random_strings(args.n_random, args.seed)
        ours = run_lines(tok_cmd, [{"text": t} for t in texts], tmp, "texts.jsonl")
        theirs = [e.ids for e in hf.encode_batch(texts, add_special_tokens=True)]
        for t, a, b in zip(texts, ours, theirs):
            rep.check("encode", a == b, lambda: f"text={t!r}\n  minivllm={a}\n  hf      ={b}\n"
                      f"  first difference at index {first_diff(a, b)}: "
                      f"{hf.id_to_token(a[first_diff(a, b)]) if first_diff(a, b) < len(a) else None!r} vs "
                      f"{hf.id_to_token(b[first_diff(a, b)]) if first_diff(a, b) < len(b) else None!r}")

        # 2. round trip, all at once and through the streaming decoder
        back = run_lines(detok_cmd, ours, tmp, "ids.jsonl")
        back_stream = run_lines(detok_cmd + ["--stream"], ours, tmp, "ids.jsonl")
        for t, b, s in zip(texts, back, back_stream):
            want = nfc.normalize_str(t)
            rep.check("round trip", b == want, lambda: f"text={t!r}\n  decode(encode)={b!r}\n  NFC(text)     ={want!r}")
            rep.check("round trip (stream)", s == b, lambda: f"text={t!r}\n  stream={s!r}\n  batch ={b!r}")

        # 3. random ids: pieces of multi-byte characters, special tokens
        rng = random.Random(args.seed + 7)
        n_ids = hf.get_vocab_size(with_added_tokens=True)
        id_lists = [[rng.randrange(n_ids) if rng.random() < 0.7 else rng.randrange(120000, n_ids)
                     for _ in range(rng.randint(0, 12))] for _ in range(2000)]
        for skip_special in (False, True):
            extra = ["--skip-special"] if skip_special else []
            mine = run_lines(detok_cmd + extra, id_lists, tmp, "random_ids.jsonl")
            mine_s = run_lines(detok_cmd + extra + ["--stream"], id_lists, tmp, "random_ids.jsonl")
            want = hf.decode_batch(id_lists, skip_special_tokens=skip_special)
            sec = "decode random ids" + (" skip_special" if skip_special else "")
            for ids, a, s, b in zip(id_lists, mine, mine_s, want):
                rep.check(sec, a == b, lambda: f"ids={ids}\n  minivllm={a!r}\n  hf      ={b!r}")
                rep.check(sec + " (stream)", s == b, lambda: f"ids={ids}\n  stream={s!r}\n  hf    ={b!r}")

        # 4. chat format
        cases = textgen.chat_cases(args.seed + 11, args.n_random_chats)
        requests = [dict(messages=m, **o) for m, o in cases]
        ours_chat = run_lines(tok_cmd, requests, tmp, "chats.jsonl")
        ours_text = run_lines(detok_cmd, ours_chat, tmp, "chat_ids.jsonl")
        for (msgs, opts), ids, text in zip(cases, ours_chat, ours_text):
            rendered = hf_chat.apply_chat_template(msgs, tokenize=False, **opts)
            want = hf.encode(rendered, add_special_tokens=False).ids
            rep.check("chat ids", ids == want, lambda: f"messages={str(msgs)[:800]} options={opts}\n"
                      f"  minivllm ids={ids}\n  hf ids      ={want}")
            rep.check("chat text", text == nfc.normalize_str(rendered),
                      lambda: f"messages={str(msgs)[:800]} options={opts}\n"
                      f"  minivllm={text[:800]!r}\n  hf      ={rendered[:800]!r}")

    for section, n in rep.checked.items():
        print(f"  {section:32s} {n:6d} cases")
    took = time.time() - t0
    if rep.failures:
        print(f"FAIL: {rep.failures} mismatches with Hugging Face (tokenizers, transformers) ({took:.1f} s)")
        sys.exit(1)
    print(f"PASS: every id and text matches Hugging Face ({took:.1f} s)")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""tests/gpu/tail_model.py - how much of a decode attention launch is its tail, by a fluid model.

Decode attention (kernels/attention_decode.cuh) runs one thread block per (row, kv head, piece).
The GPU starts blocks in grid order and starts the next one on a SM as soon as one of its own
ends. So the last blocks to start run on while SMs around them have nothing left to do: the
tail. This model predicts that cost before any kernel is changed (docs/07-attention.md, section
4.5, version 7), from three measured numbers:

  - the read ceiling, R GB/s (tests/gpu/read_probe.cu: 3,203 on an H100, run 117), shared by
    the blocks that are running;
  - one block's own top rate, r GB/s: a block alone reads about 34 keys a microsecond (chapter
    07's unsplit 1 x 1024), 34 * 512 bytes (a key and a value of one kv head, head_dim 128,
    bf16) = 17.4 GB/s;
  - how many blocks run at once: 3 a SM with version 6's ring, 132 SMs.

While n blocks run, each reads at min(r, R / n). The launch's time against the bytes at R is
its share of the read ceiling. Two orders: the rows' own (random lengths, as nano-vllm's
workload has them) and longest first (version 7). Pieces, where asked, are version 4's: each
row cut into 8 pieces of at least 256 keys (whole multiples of 256).

Run: python3 tests/gpu/tail_model.py [--json FILE]. Deterministic (seeded); needs no GPU.
"""
import argparse
import json
import random

READ_GBS = 3203.0      # read ceiling, H100 (run 117)
BLOCK_GBS = 34 * 512 / 1e3  # one block alone: 34 keys/us * 512 B = 17.4 GB/s
SLOTS = 3 * 132        # blocks at once: 3 a SM (version 6's ring) on 132 SMs
KV_HEADS = 8
KEY_BYTES = 512        # K and V of one key of one kv head: 2 * 128 * 2 bytes


def launch_us(blocks, slots=SLOTS, read=READ_GBS, top=BLOCK_GBS):
    """Microseconds for blocks (bytes each, in start order) on `slots` slots."""
    waiting, running, t = list(blocks), [], 0.0
    while waiting and len(running) < slots:
        running.append(waiting.pop(0))
    while running:
        rate = min(top, read / len(running)) * 1e3  # bytes a microsecond, each running block
        step = min(running)
        t += step / rate
        running = [b - step for b in running]
        done = sum(1 for b in running if b <= 1e-9)
        running = [b for b in running if b > 1e-9]
        for _ in range(done):
            if waiting:
                running.append(waiting.pop(0))
    return t


def pieces(ctx, n=8, least=256):
    """Version 4's pieces of one row: n pieces of at least `least` keys, whole multiples of it."""
    per = max(least, -(-(-(-ctx // n)) // least) * least)
    return [min(per, ctx - k * per) for k in range(n) if k * per < ctx]


def case(rows, lo, hi, rng, split=False):
    """One launch: `rows` rows of U[lo, hi] keys (each row's kv heads adjacent in start order)."""
    lens = [rng.randint(lo, hi) for _ in range(rows)]
    blocks = []
    for ctx in lens:
        for _ in range(KV_HEADS):
            blocks += [p * KEY_BYTES for p in (pieces(ctx) if split else [ctx])]
    ideal = sum(blocks) / (READ_GBS * 1e3)
    own = launch_us(blocks)
    longest = launch_us(sorted(blocks, reverse=True))
    return {"rows": rows, "keys": [lo, hi], "pieces": split, "ideal_us": round(ideal, 1),
            "own_order_us": round(own, 1), "own_order_pct": round(100 * ideal / own, 1),
            "longest_first_us": round(longest, 1), "longest_first_pct": round(100 * ideal / longest, 1)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", help="write the predictions here")
    a = ap.parse_args()
    rng = random.Random(0)
    cases = [case(256, 100, 2048, rng), case(160, 100, 2048, rng), case(256, 1024, 1024, rng),
             case(64, 100, 2048, rng, split=True)]
    out = {"model": "tests/gpu/tail_model.py", "read_gbs": READ_GBS, "block_gbs": BLOCK_GBS, "slots": SLOTS,
           "cases": cases}
    for c in cases:
        print(f"{c['rows']:4d} rows x U[{c['keys'][0]}, {c['keys'][1]}]{' in pieces' if c['pieces'] else ''}: "
              f"bytes at the read ceiling {c['ideal_us']:.1f} us; own order {c['own_order_us']:.1f} us "
              f"({c['own_order_pct']:.1f}%), longest first {c['longest_first_us']:.1f} us "
              f"({c['longest_first_pct']:.1f}%)")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()

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

With --bands, also the question version 7 leaves open: with the rows longest first, do version
4's pieces from 33 to 132 rows still pay? Each block then pays a fixed cost (its start, queries
and combine, in which it reads nothing), and a split launch its reduction kernel (4 us).

Run: python3 tests/gpu/tail_model.py [--bands] [--json FILE]. Deterministic (seeded); needs no GPU.
"""
import argparse
import json
import random

READ_GBS = 3203.0      # read ceiling, H100 (run 117)
BLOCK_GBS = 34 * 512 / 1e3  # one block alone: 34 keys/us * 512 B = 17.4 GB/s
SLOTS = 3 * 132        # blocks at once: 3 a SM (version 6's ring) on 132 SMs
KV_HEADS = 8
KEY_BYTES = 512        # K and V of one key of one kv head: 2 * 128 * 2 bytes


def launch_us(blocks, slots=SLOTS, read=READ_GBS, top=BLOCK_GBS, fixed_us=0.0):
    """Microseconds for blocks (bytes each, in start order) on `slots` slots. fixed_us: what each block spends
    reading nothing (its start, its queries, its combine), first, on its slot."""
    waiting, running, t = list(blocks), [], 0.0  # running: [fixed us left, bytes left]
    while waiting and len(running) < slots:
        running.append([fixed_us, waiting.pop(0)])
    while running:
        reading = sum(1 for f, _ in running if f <= 0)
        rate = min(top, read / max(reading, 1)) * 1e3  # bytes a microsecond, each reading block
        step = min([f for f, _ in running if f > 0] + [b / rate for f, b in running if f <= 0])
        t += step
        for x in running:
            if x[0] > 0:
                x[0] -= step
            else:
                x[1] -= step * rate
        done = sum(1 for f, b in running if f <= 1e-9 and b <= 1e-6)
        running = [x for x in running if not (x[0] <= 1e-9 and x[1] <= 1e-6)]
        for _ in range(done):
            if waiting:
                running.append([fixed_us, waiting.pop(0)])
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


def band(rows, rng, fixed_us, reduce_us=4.0):
    """Version 7 longest first at `rows` rows of U[100, 2048] keys: unsplit against version 4's pieces (8 of at
    least 256 keys, and of at least 512), each block paying fixed_us, a split launch also its reduction kernel."""
    lens = [rng.randint(100, 2048) for _ in range(rows)]
    ideal = sum(lens) * KV_HEADS * KEY_BYTES / (READ_GBS * 1e3)
    out = {"rows": rows, "fixed_us": fixed_us}
    for name, n, least in (("unsplit", 1, 256), ("8 x >= 256", 8, 256), ("8 x >= 512", 8, 512)):
        blocks = sorted((p * KEY_BYTES for ctx in lens for _ in range(KV_HEADS) for p in pieces(ctx, n, least)),
                        reverse=True)
        t = launch_us(blocks, fixed_us=fixed_us) + (reduce_us if n > 1 else 0.0)
        out[name] = round(100 * ideal / t, 1)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", help="write the predictions here")
    ap.add_argument("--bands", action="store_true",
                    help="also version 7's pieces against none at 40 to 132 rows, with a fixed cost a block")
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
    if a.bands:
        out["bands"] = [band(rows, random.Random(rows), fixed) for fixed in (0.0, 1.0, 2.0) for rows in (40, 64, 100, 132)]
        for b in out["bands"]:
            print(f"{b['rows']:4d} rows, {b['fixed_us']:.0f} us a block, longest first: unsplit {b['unsplit']:.1f}%, "
                  f"8 pieces of >= 256 keys {b['8 x >= 256']:.1f}%, of >= 512 {b['8 x >= 512']:.1f}% "
                  "(the reduction 4 us)")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()

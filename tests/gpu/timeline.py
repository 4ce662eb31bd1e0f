#!/usr/bin/env python3
"""tests/gpu/timeline.py - one stream's decode steps, kernel by kernel, from an nsys timeline.

Reads the CSV of `nsys stats --report cuda_gpu_trace --format csv` (every kernel and copy on the
GPU with its start and duration; graphs traced node by node) of a one-stream `minivllm bench`, and
prints, over the last --steps decode steps (a step begins at its embedding kernel): each position's
kernel or copy, its mean duration and the mean idle time on the GPU before it, then the step's
period, the time the GPU was busy and the time it sat idle. --json FILE writes the same numbers.
"""
import argparse
import csv
import json
import statistics
import sys


def column(header, *names):
    for i, h in enumerate(header):
        if any(n.lower() in h.lower() for n in names):
            return i
    raise SystemExit(f"timeline.py: no column like {names} in {header}")


def short(name):
    for key in ("decode_megakernel", "embedding", "gather_last", "gemv", "bf16_to_f32", "sample_kernel",
                "sampling_prepare", "sampling_finish", "logprobs", "gemm", "memcpy", "memset"):
        if key.lower() in name.lower():
            return key + ("" if key != "memcpy" else " " + name.split("memcpy")[-1].strip(" []"))
    return name[:48]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--json")
    a = ap.parse_args()
    with open(a.csv, newline="") as f:
        rows = [r for r in csv.reader(f) if r]
    header = rows[0]
    c_start, c_dur, c_name = column(header, "Start"), column(header, "Duration"), column(header, "Name")
    ev = []
    for r in rows[1:]:
        try:
            ev.append((int(float(r[c_start])), int(float(r[c_dur])), r[c_name]))
        except (ValueError, IndexError):
            continue
    ev.sort()
    starts = [i for i, e in enumerate(ev) if "embedding" in e[2].lower()]
    if len(starts) < 3:
        raise SystemExit(f"timeline.py: {len(starts)} embedding kernels: no decode steps found")
    # A step: from its embedding kernel's start to the next one's; the copies that upload the
    # step's inputs come before the embedding, so they count with the step before (its tail).
    starts = starts[-(a.steps + 1):]
    steps = [ev[starts[k]:starts[k + 1]] for k in range(len(starts) - 1)]
    shape = [short(e[2]) for e in steps[-1]]
    steps = [s for s in steps if [short(e[2]) for e in s] == shape]
    pos = []
    for j, name in enumerate(shape):
        durs = [s[j][1] / 1e3 for s in steps]
        gaps = [(s[j][0] - (s[j - 1][0] + s[j - 1][1])) / 1e3 for s in steps] if j else []
        pos.append({"name": name, "us": statistics.mean(durs), "gap_before_us": statistics.mean(gaps) if gaps else 0.0})
    # the gap before a step's first kernel: from the step before's last end
    first_gaps = [(steps[k][0][0] - (steps[k - 1][-1][0] + steps[k - 1][-1][1])) / 1e3 for k in range(1, len(steps))]
    pos[0]["gap_before_us"] = statistics.mean(first_gaps) if first_gaps else 0.0
    periods = [(steps[k + 1][0][0] - steps[k][0][0]) / 1e3 for k in range(len(steps) - 1)]
    busy = statistics.mean(sum(e[1] for e in s) / 1e3 for s in steps)
    period = statistics.median(periods) if periods else float("nan")
    print(f"{len(steps)} decode steps of {len(shape)} kernels and copies each; mean us")
    print(f"{'kernel or copy':<34} {'idle before':>11} {'time':>9}")
    for p in pos:
        print(f"{p['name']:<34} {p['gap_before_us']:>11.2f} {p['us']:>9.2f}")
    print(f"step period (median) {period:.1f} us, busy {busy:.1f} us, idle {period - busy:.1f} us")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"steps": len(steps), "kernels": pos, "period_us": period, "busy_us": busy}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

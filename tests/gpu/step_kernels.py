#!/usr/bin/env python3
"""tests/gpu/step_kernels.py - one decode step's kernels, from Nsight Compute's raw CSV.

    python3 tests/gpu/step_kernels.py --batch 256 --log ncu.256.log [--batch 64 --log ncu.64.log ...]
        --command "..." --commit ID --gpu NAME --out docs/results/json/09-engine.step-kernels.json

Each log is `ncu --metrics gpu__time_duration.sum --csv --page raw --log-file LOG` over a
`minivllm bench --latency --enforce-eager` run (tests/gpu/step_kernels.sh). The last decode step
is everything from the last embedding kernel on (every forward pass starts with it); its kernels
are grouped by name (the first 60 characters), in order of first launch, with their count and
summed duration in microseconds. Chapter 09's table "Where a decode step's time goes" is
rendered from the JSON by docs/results/generate.py.
"""
import argparse
import csv
import json
import sys


def last_step(path):
    rows = list(csv.reader(open(path, newline="")))
    at = [i for i, r in enumerate(rows) if "Kernel Name" in r and "gpu__time_duration.sum" in r]
    if not at:
        sys.exit(f"{path}: no Nsight Compute raw table (a 'Kernel Name' header with gpu__time_duration.sum)")
    hdr = rows[at[0]]
    unit = rows[at[0] + 1][hdr.index("gpu__time_duration.sum")]
    if unit != "ns":
        sys.exit(f"{path}: gpu__time_duration.sum in {unit!r}, expected ns")
    ki, ti = hdr.index("Kernel Name"), hdr.index("gpu__time_duration.sum")
    data = [(r[ki], float(r[ti].replace(",", ""))) for r in rows[at[0] + 2:] if len(r) == len(hdr)]
    starts = [i for i, (n, _) in enumerate(data) if n.startswith("void embedding_kernel")]
    if not starts:
        sys.exit(f"{path}: no embedding kernel, so no step to cut out")
    groups = {}
    for name, ns in data[starts[-1]:]:
        g = groups.setdefault(name[:60], {"name": name[:60], "count": 0, "us": 0.0})
        g["count"] += 1
        g["us"] += ns / 1000.0
    for g in groups.values():
        g["us"] = round(g["us"], 2)
    return {"kernels": len(data) - starts[-1], "total_us": round(sum(g["us"] for g in groups.values()), 1),
            "groups": list(groups.values())}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, action="append", required=True)
    ap.add_argument("--log", action="append", required=True)
    ap.add_argument("--command", required=True)
    ap.add_argument("--commit", required=True)
    ap.add_argument("--gpu", required=True)
    ap.add_argument("--date", default="")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    if len(a.batch) != len(a.log):
        sys.exit("give one --log per --batch")
    out = {"gpu": a.gpu, "command": a.command, "commit": a.commit, "date": a.date,
           "steps": [dict(batch=b, **last_step(p)) for b, p in zip(a.batch, a.log)]}
    json.dump(out, open(a.out, "w"), indent=1)
    for s in out["steps"]:
        print(f"batch {s['batch']}: {s['kernels']} kernels, {s['total_us']} us")


if __name__ == "__main__":
    main()

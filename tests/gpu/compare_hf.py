#!/usr/bin/env python3
"""tests/gpu/compare_hf.py - the engine against Hugging Face transformers on Qwen3-0.6B's shapes.

What it is: the end-to-end correctness check of the engine on real shapes. The tiny checkpoints of
tests/data/ prove the engine's logic token for token; this script checks the same engine at the
size where bf16 rounding, long dot products (1024, 3072) and a 151936-entry vocabulary matter.

What it does, all in a temporary directory:
  1. builds a Qwen3ForCausalLM from tests/data/qwen3-0.6b-shape/config.json (28 layers, hidden
     1024, 16 q / 8 kv heads of 128) with seeded random weights: matrices normal with std 0.02
     (Hugging Face's init), RMSNorm weights 1 + N(0, 0.1) so that a norm applied wrongly shows;
     rounds them to bf16 and saves them as model.safetensors beside the config files;
  2. runs transformers on a few seeded random prompts (token ids): float32 (the bf16 weights
     upcast, exact; eager attention; TF32 off) as the accurate reference, and bf16 as what a
     typical bf16 implementation gets. For each prompt: the first step's logits (the prefill's
     last position) and a greedy continuation with eos ignored;
  3. runs build/minivllm generate on the same prompts with --device cuda and --device cpu,
     --temperature 0 --ignore-eos, --logits-out (float32 .npy);
  4. compares, per pair: NMSE of the first-step logits (sum (a - b)^2 / sum b^2), whether their
     argmax agrees, and the greedy tokens: how many match before the first divergence and the
     fraction of positions equal. Writes everything as JSON (--json), prints a table, and exits
     1 if a criterion below fails (2 if a leg could not run at all).

The criteria, and why these bounds:
  - logits finite (NaN / Inf is always a failure).
  - cuda vs HF fp32: first-step NMSE <= 1e-2. A bf16 engine rounds every activation to 8
    significant bits (relative error up to 2^-9, variance u^2/3 ~ 1.3e-6 per rounding); a
    Qwen3 layer rounds about ten times (norm, qkv, q/k norm + rope, attention, o_proj, residual,
    norm, gate_up, silu*mul, down, residual), so 28 layers add ~280 roundings: NMSE ~ 4e-4 if
    the errors stayed independent; they may be amplified or damped along the way, which HF's
    own bf16 run measures: its NMSE against fp32 is printed beside ours (2.3e-4 with CPU torch
    on these shapes and prompts). 1e-2 leaves a factor of ~25 over the estimate and ~40 over
    HF's bf16; a structural bug (a RoPE off by one position, a norm skipped, a wrong GQA head
    mapping, K/V stored in the wrong slot) moves the logits by about their own size, which is
    an NMSE of order 0.1 to 1.
  - cuda vs HF fp32: the first generated token (argmax of the first-step logits) equal for
    every prompt, except a near-tie: when fp32's own top-2 gap is below 4 x the RMS of the
    logit error, either token is a correct answer for a bf16 engine. Excused ties are listed.
  - cpu vs HF fp32: NMSE <= 1e-7 and every greedy token equal. Both compute in fp32 over the
    same bf16 weights and differ only in summation order (a few fp32 ulps: NMSE 1.6e-12
    measured on these shapes against CPU torch, 2e-13 .. 8e-13 on tests/data's tiny
    checkpoints); a single bf16 rounding of the activations anywhere in the CPU backend would
    give ~1e-6 and fail.
  - cpu vs cuda: NMSE <= 1e-2, the same bound as cuda vs fp32 (the CPU backend is ~fp32).
  - the reference depends on the prompt: fp32's first tokens all differ between prompts, and
    so do the continuations, or agreeing with them would prove little. (With HF's std 0.02 at
    these shapes a continuation often repeats one id for a while: a random model's habit, and
    why the first-step logits, 151936 numbers per prompt, carry most of the evidence.)
  Greedy agreement between a bf16 run and fp32 is reported, not judged: two correct runs
  part at the first near-tie, and the fp32 top-2 gap at each divergence is printed to show it.

How to run (from the repository root, after make):
    python3 tests/gpu/compare_hf.py --json $OUT/09-engine.compare.json          # on the H200
    python3 tests/gpu/compare_hf.py --cpu-only --tiny                           # anywhere, seconds
--cpu-only runs transformers on the CPU and skips minivllm's cuda leg; --tiny swaps the 0.6B
shapes for a 4-layer model so that the whole pipeline runs in seconds on a laptop.
Needs torch, transformers (4.51 or 5.x), safetensors and numpy. tests/gpu/engine.sh runs it.
"""
import argparse
import datetime
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch
import transformers
from safetensors.torch import save_file
from transformers import Qwen3Config, Qwen3ForCausalLM

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SHAPE_DIR = os.path.join(ROOT, "tests", "data", "qwen3-0.6b-shape")

WEIGHT_SEED = 0
PROMPT_SEED = 1234
WEIGHT_STD = 0.02          # Hugging Face's initializer_range for Qwen3
NORM_STD = 0.1             # RMSNorm weights 1 + N(0, NORM_STD)
PROMPT_LENS = [16, 61, 128, 200]  # a block of 16, odd tails, the longest near 200
# --tiny: the same architecture, small enough for a CPU in seconds. The std is larger than
# HF's so that a 4-layer, 256-wide model's outputs still depend on the prompt.
TINY_FIELDS = dict(hidden_size=256, intermediate_size=512, num_hidden_layers=4, num_attention_heads=4,
                   num_key_value_heads=2, head_dim=64, vocab_size=2048, max_position_embeddings=1024)
TINY_WEIGHT_STD = 0.08

BOUNDS = {
    "cuda_vs_fp32_nmse": 1e-2,
    "cpu_vs_fp32_nmse": 1e-7,
    "cpu_vs_cuda_nmse": 1e-2,
    "tie_rms_factor": 4.0,
}


def log(msg):
    print(f"[compare_hf {time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ---- the checkpoint --------------------------------------------------------------------------

def model_config(tiny):
    """config.json and generation_config.json as dicts: Qwen3-0.6B's, or --tiny's (special ids inside its vocab)."""
    with open(os.path.join(SHAPE_DIR, "config.json")) as f:
        d = json.load(f)
    with open(os.path.join(SHAPE_DIR, "generation_config.json")) as f:
        gen = json.load(f)
    if tiny:
        d.update(TINY_FIELDS, max_window_layers=TINY_FIELDS["num_hidden_layers"], bos_token_id=1, eos_token_id=2)
        gen.update(bos_token_id=1, eos_token_id=[2, 3], pad_token_id=1)
    return d, gen


def special_ids(cfg, gen):
    """Ids a random prompt avoids: bos / eos, and Qwen3's added tokens (151643 and up)."""
    ids = set()
    for src in (cfg, gen):
        for k in ("bos_token_id", "eos_token_id", "pad_token_id"):
            v = src.get(k)
            ids.update(v if isinstance(v, list) else [v] if v is not None else [])
    return ids


def make_prompts(cfg, gen, lens):
    g = torch.Generator().manual_seed(PROMPT_SEED)
    hi = min(cfg["vocab_size"], 151643)  # Qwen3's added (special) tokens start at 151643
    bad = special_ids(cfg, gen)
    prompts = []
    for n in lens:
        ids = torch.randint(0, hi, (n,), generator=g).tolist()
        prompts.append([i if i not in bad else (i + 1) % hi for i in ids])
    return prompts


def build_model(cfg_dict, device, tiny):
    """A seeded random Qwen3 whose weights are exactly bf16 values, on `device`, in bf16."""
    # from_dict reads a config.json as from_pretrained does (4.x's rope_theta / torch_dtype keys included).
    config = Qwen3Config.from_dict(dict(cfg_dict))
    # Eager attention in both dtypes: the most literal implementation, the same code for fp32 and bf16.
    config._attn_implementation = "eager"
    with torch.device(device):
        model = Qwen3ForCausalLM(config)
    model.eval()
    if cfg_dict.get("tie_word_embeddings"):
        # One Parameter for both, whatever the transformers version does by default: the file
        # will hold the embedding alone, and HF must compute with exactly that matrix.
        model.lm_head.weight = model.model.embed_tokens.weight
    g = torch.Generator(device=device).manual_seed(WEIGHT_SEED)
    std = TINY_WEIGHT_STD if tiny else WEIGHT_STD
    with torch.no_grad():
        # named_parameters() lists a tied lm_head once (as model.embed_tokens.weight); sorted: a fixed order
        for name, p in sorted(model.named_parameters()):
            noise = torch.randn(p.shape, generator=g, device=device, dtype=torch.float32)
            p.copy_(1.0 + NORM_STD * noise if name.endswith("norm.weight") else std * noise)
    return cast_parameters(model, torch.bfloat16)


def cast_parameters(model, dtype):
    """The weights to dtype, and nothing else. model.to(dtype) would also cast the rotary embedding's
    inv_freq buffer, and a bf16 inv_freq (8 significant bits) moves every RoPE angle far more than
    bf16 arithmetic does: the fp32 reference would no longer be accurate. (from_pretrained never
    casts it either.) A tied lm_head is the same Parameter as the embedding: cast once."""
    for p in model.parameters():
        p.data = p.data.to(dtype)
    return model


def save_checkpoint(model, cfg_dict, gen_dict, out_dir):
    """model.safetensors (bf16, Qwen3's tensor names; no lm_head.weight when tied) and the config files.
    Written with safetensors directly, so that the layout is the same under transformers 4.x and 5.x."""
    tied = cfg_dict.get("tie_word_embeddings", False)
    tensors = {k: v.detach().to("cpu").contiguous() for k, v in model.state_dict().items()
               if not (tied and k == "lm_head.weight")}
    save_file(tensors, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(cfg_dict, f, indent=2)
    with open(os.path.join(out_dir, "generation_config.json"), "w") as f:
        json.dump(gen_dict, f, indent=2)


# ---- the runs --------------------------------------------------------------------------------

@torch.no_grad()
def hf_run(model, prompts, n_new, device):
    """Per prompt: first-step logits (float32, CPU), greedy ids, and the top-2 gap of each step's logits."""
    firsts, tokens, gaps = [], [], []
    for p in prompts:
        out = model(input_ids=torch.tensor([p], device=device), use_cache=True)
        logits = out.logits[0, -1].float()
        firsts.append(logits.cpu().numpy())
        ids, gap = [], []
        for step in range(n_new):
            top2 = torch.topk(logits, 2).values
            gap.append(float(top2[0] - top2[1]))
            ids.append(int(torch.argmax(logits)))
            if step + 1 == n_new:
                break
            out = model(input_ids=torch.tensor([[ids[-1]]], device=device), past_key_values=out.past_key_values,
                        use_cache=True)
            logits = out.logits[0, -1].float()
        tokens.append(ids)
        gaps.append(gap)
    return {"first_logits": np.stack(firsts), "tokens": tokens, "gaps": gaps}


def minivllm_run(binary, model_dir, device, prompts, n_new, work, timeout):
    inp = os.path.join(work, f"prompts-{device}.jsonl")
    out = os.path.join(work, f"out-{device}.jsonl")
    npy = os.path.join(work, f"logits-{device}.npy")
    with open(inp, "w") as f:
        for p in prompts:
            f.write(json.dumps({"prompt_token_ids": p}) + "\n")
    cmd = [binary, "generate", "--model", model_dir, "--device", device, "--input", inp, "--output", out,
           "--logits-out", npy, "--temperature", "0", "--max-tokens", str(n_new), "--ignore-eos",
           "--max-model-len", "1024"]
    log(" ".join(cmd))
    t0 = time.time()
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout} s", "command": " ".join(cmd)}
    secs = time.time() - t0
    if r.returncode != 0:
        return {"error": f"exit {r.returncode}: {(r.stderr or r.stdout).strip()[-600:]}", "command": " ".join(cmd)}
    tokens = [None] * len(prompts)
    with open(out) as f:
        for line in f:
            o = json.loads(line)
            tokens[o["index"]] = o["token_ids"]
    return {"first_logits": np.load(npy), "tokens": tokens, "seconds": secs, "command": " ".join(cmd)}


# ---- the comparison --------------------------------------------------------------------------

def nmse(a, ref):
    a, ref = a.astype(np.float64), ref.astype(np.float64)
    return float(((a - ref) ** 2).sum() / (ref ** 2).sum())


def compare(name_a, a, name_b, b, n_prompts, n_tokens, ref_gaps=None, ref_first=None):
    """a against b over prompts [0, n_prompts) and their first n_tokens tokens.
    ref_gaps / ref_first: HF fp32's per-step top-2 gaps and first logits, to judge ties."""
    rows = []
    for i in range(n_prompts):
        la, lb = a["first_logits"][i], b["first_logits"][i]
        ta, tb = a["tokens"][i][:n_tokens], b["tokens"][i][:n_tokens]
        n = min(len(ta), len(tb))
        prefix = next((k for k in range(n) if ta[k] != tb[k]), n)
        row = {
            "prompt": i,
            "nmse": nmse(la, lb),
            "finite": bool(np.isfinite(la).all() and np.isfinite(lb).all()),
            "argmax_a": int(np.argmax(la)), "argmax_b": int(np.argmax(lb)),
            "rms_logit_error": float(np.sqrt(np.mean((la.astype(np.float64) - lb) ** 2))),
            "tokens_compared": n,
            "greedy_prefix": prefix,
            "greedy_equal": sum(ta[k] == tb[k] for k in range(n)),
        }
        if ref_gaps is not None:
            row["ref_gap_first"] = ref_gaps[i][0]
            row["ref_gap_at_divergence"] = ref_gaps[i][prefix] if prefix < n else None
        rows.append(row)
    total = sum(r["tokens_compared"] for r in rows)
    return {
        "a": name_a, "b": name_b, "prompts": n_prompts, "tokens_per_prompt": n_tokens, "per_prompt": rows,
        "nmse_max": max(r["nmse"] for r in rows),
        "nmse_mean": sum(r["nmse"] for r in rows) / len(rows),
        "finite": all(r["finite"] for r in rows),
        "argmax_equal": sum(r["argmax_a"] == r["argmax_b"] for r in rows),
        "greedy_prefix_min": min(r["greedy_prefix"] for r in rows),
        "greedy_prefix_mean": sum(r["greedy_prefix"] for r in rows) / len(rows),
        "greedy_equal_frac": sum(r["greedy_equal"] for r in rows) / total if total else 0.0,
    }


def criteria(pairs, ref):
    """[(name, passed, value text, bound text)] for the pairs that ran."""
    out = []
    by = {(p["a"], p["b"]): p for p in pairs}
    for p in pairs:
        out.append((f"{p['a']} vs {p['b']}: logits finite", p["finite"], "finite" if p["finite"] else "NaN/Inf", "finite"))
    p = by.get(("minivllm cuda", "HF fp32"))
    if p:
        b = BOUNDS["cuda_vs_fp32_nmse"]
        out.append(("cuda vs HF fp32: first-step NMSE", p["nmse_max"] <= b, f"{p['nmse_max']:.3g}", f"<= {b:g}"))
        bad, ties = [], []
        for r in p["per_prompt"]:
            if r["argmax_a"] != r["argmax_b"]:
                (ties if r["ref_gap_first"] < BOUNDS["tie_rms_factor"] * r["rms_logit_error"] else bad).append(r["prompt"])
        txt = f"{p['argmax_equal']}/{p['prompts']} equal" + (f", near-ties excused: prompts {ties}" if ties else "")
        out.append(("cuda vs HF fp32: first token (argmax)", not bad, txt, "equal unless a near-tie"))
    p = by.get(("minivllm cpu", "HF fp32"))
    if p:
        b = BOUNDS["cpu_vs_fp32_nmse"]
        out.append(("cpu vs HF fp32: first-step NMSE", p["nmse_max"] <= b, f"{p['nmse_max']:.3g}", f"<= {b:g}"))
        # an fp32 near-tie (gap under 1e-3) could excuse a divergence; none is expected
        bad = [r["prompt"] for r in p["per_prompt"] if r["greedy_prefix"] < r["tokens_compared"]
               and not (r["ref_gap_at_divergence"] is not None and r["ref_gap_at_divergence"] < 1e-3)]
        out.append(("cpu vs HF fp32: greedy tokens", not bad,
                    f"{sum(r['greedy_equal'] for r in p['per_prompt'])}/{sum(r['tokens_compared'] for r in p['per_prompt'])} equal",
                    "all equal"))
    p = by.get(("minivllm cpu", "minivllm cuda"))
    if p:
        b = BOUNDS["cpu_vs_cuda_nmse"]
        out.append(("cpu vs cuda: first-step NMSE", p["nmse_max"] <= b, f"{p['nmse_max']:.3g}", f"<= {b:g}"))
    firsts = len({t[0] for t in ref["tokens"]})
    differ = len({tuple(t) for t in ref["tokens"]}) == len(ref["tokens"])
    distinct = min(len(set(t)) for t in ref["tokens"])
    out.append(("HF fp32 reference depends on the prompt", firsts == len(ref["tokens"]) and differ,
                f"{firsts}/{len(ref['tokens'])} distinct first tokens, continuations "
                f"{'all differ' if differ else 'REPEAT'} (min {distinct} distinct ids in one)",
                "all distinct"))
    return out


def print_table(res):
    print()
    print(f"== minivllm vs transformers {res['transformers']} on {res['model']} ({res['gpu']})")
    print(f"   prompts {res['prompt_lens']} tokens, {res['max_tokens']} greedy tokens "
          f"(cpu leg: {res['cpu_prompts']} prompts, {res['cpu_max_tokens']} tokens)")
    print(f"   {'pair':34s} {'NMSE max':>10s} {'argmax':>7s} {'greedy prefix min/mean':>23s} {'equal':>6s}")
    for p in res["pairs"]:
        print(f"   {p['a'] + ' vs ' + p['b']:34s} {p['nmse_max']:10.3g} {p['argmax_equal']:>3d}/{p['prompts']:<3d} "
              f"{p['greedy_prefix_min']:>10d} / {p['greedy_prefix_mean']:<10.1f} {100 * p['greedy_equal_frac']:5.1f}%")
    for name, leg in res["legs"].items():
        if "error" in leg:
            print(f"   {name}: NOT RUN: {leg['error']}")
    print("   criteria:")
    for c in res["criteria"]:
        print(f"     {'PASS' if c['pass'] else 'FAIL'}  {c['name']}: {c['value']} ({c['bound']})")
    print(f"   verdict: {'PASS' if res['pass'] else 'FAIL'}  ({res['seconds']:.0f} s)")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minivllm", default=os.path.join(ROOT, "build", "minivllm"))
    ap.add_argument("--json", help="write the results here (e.g. $OUT/09-engine.compare.json)")
    ap.add_argument("--tiny", action="store_true", help="a 4-layer model instead of Qwen3-0.6B's shapes")
    ap.add_argument("--cpu-only", action="store_true", help="transformers on the CPU, no minivllm cuda leg")
    ap.add_argument("--skip-cuda", action="store_true", help="no minivllm --device cuda leg")
    ap.add_argument("--skip-cpu", action="store_true", help="no minivllm --device cpu leg")
    ap.add_argument("--max-tokens", type=int, default=32, help="greedy tokens per prompt (default 32)")
    ap.add_argument("--cpu-prompts", type=int, default=2,
                    help="the minivllm cpu leg runs the first N prompts only (default 2: 16 and 61 tokens)")
    ap.add_argument("--cpu-max-tokens", type=int, default=8, help="and N greedy tokens (default 8)")
    ap.add_argument("--timeout", type=int, default=150, help="seconds allowed to each minivllm run")
    ap.add_argument("--keep", metavar="DIR", help="build the checkpoint in DIR and keep it")
    args = ap.parse_args()
    t_start = time.time()
    cuda_ok = torch.cuda.is_available()
    hf_device = "cpu" if args.cpu_only or not cuda_ok else "cuda"
    run_cuda = not (args.cpu_only or args.skip_cuda)
    if not os.access(args.minivllm, os.X_OK):
        sys.exit(f"compare_hf: {args.minivllm} not found: run make first")
    # fp32 means fp32: no TF32 in cuBLAS matmuls (torch's default, made explicit)
    torch.set_float32_matmul_precision("highest")
    if hf_device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False

    cfg, gen = model_config(args.tiny)
    prompts = make_prompts(cfg, gen, PROMPT_LENS)
    n_cpu = min(args.cpu_prompts, len(prompts))
    cpu_tokens = min(args.cpu_max_tokens, args.max_tokens)
    work = args.keep or tempfile.mkdtemp(prefix="mv-compare-")
    os.makedirs(work, exist_ok=True)
    timings, legs = {}, {}
    try:
        t0 = time.time()
        log(f"building the checkpoint ({'tiny' if args.tiny else 'Qwen3-0.6B shapes'}, seed {WEIGHT_SEED}) in {work}")
        model = build_model(cfg, hf_device, args.tiny)
        log(f"attention: {model.config._attn_implementation}, "
            f"{sum(p.numel() for p in model.parameters()) / 1e6:.0f}M parameters")
        save_checkpoint(model, cfg, gen, work)
        timings["checkpoint_s"] = time.time() - t0

        t0 = time.time()
        log(f"transformers bf16 on {hf_device}")
        legs["HF bf16"] = hf_run(model, prompts, args.max_tokens, hf_device)
        timings["hf_bf16_s"] = time.time() - t0
        t0 = time.time()
        log(f"transformers fp32 on {hf_device}")
        model = cast_parameters(model, torch.float32)  # bf16 -> fp32 is exact: the same weights
        legs["HF fp32"] = hf_run(model, prompts, args.max_tokens, hf_device)
        timings["hf_fp32_s"] = time.time() - t0
        del model
        if hf_device == "cuda":
            torch.cuda.empty_cache()  # the engine sizes its KV cache from free memory

        if run_cuda:
            legs["minivllm cuda"] = minivllm_run(args.minivllm, work, "cuda", prompts, args.max_tokens, work, args.timeout)
            timings["minivllm_cuda_s"] = legs["minivllm cuda"].get("seconds")
        if not args.skip_cpu:
            legs["minivllm cpu"] = minivllm_run(args.minivllm, work, "cpu", prompts[:n_cpu], cpu_tokens, work,
                                                args.timeout)
            timings["minivllm_cpu_s"] = legs["minivllm cpu"].get("seconds")
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)

    ref = legs["HF fp32"]
    ok = {k: v for k, v in legs.items() if "error" not in v}
    pairs = []
    n, T = len(prompts), args.max_tokens
    if "minivllm cuda" in ok:
        pairs.append(compare("minivllm cuda", ok["minivllm cuda"], "HF fp32", ref, n, T, ref["gaps"]))
        pairs.append(compare("minivllm cuda", ok["minivllm cuda"], "HF bf16", legs["HF bf16"], n, T))
    if "minivllm cpu" in ok:
        pairs.append(compare("minivllm cpu", ok["minivllm cpu"], "HF fp32", ref, n_cpu, cpu_tokens, ref["gaps"]))
        if "minivllm cuda" in ok:
            pairs.append(compare("minivllm cpu", ok["minivllm cpu"], "minivllm cuda", ok["minivllm cuda"], n_cpu,
                                 cpu_tokens))
    pairs.append(compare("HF bf16", legs["HF bf16"], "HF fp32", ref, n, T, ref["gaps"]))
    crit = [dict(name=c[0], **{"pass": bool(c[1])}, value=c[2], bound=c[3]) for c in criteria(pairs, ref)]
    failed_legs = [k for k, v in legs.items() if "error" in v]
    res = {
        "command": "python3 tests/gpu/compare_hf.py " + " ".join(sys.argv[1:]),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "host": platform.node(), "host_cpus": os.cpu_count(),
        "gpu": torch.cuda.get_device_name(0) if cuda_ok else "no GPU",
        "hf_device": hf_device, "torch": torch.__version__, "transformers": transformers.__version__,
        "model": "tiny Qwen3 (4 layers)" if args.tiny else "Qwen3-0.6B shapes (tests/data/qwen3-0.6b-shape)",
        "config": {k: cfg[k] for k in ("num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads",
                                       "num_key_value_heads", "head_dim", "vocab_size", "tie_word_embeddings")},
        "weights": {"seed": WEIGHT_SEED, "std": TINY_WEIGHT_STD if args.tiny else WEIGHT_STD, "norm": f"1 + N(0, {NORM_STD})",
                    "dtype": "bf16"},
        "prompt_seed": PROMPT_SEED, "prompt_lens": PROMPT_LENS, "max_tokens": args.max_tokens,
        "cpu_prompts": n_cpu, "cpu_max_tokens": cpu_tokens,
        "bounds": BOUNDS,
        "legs": {k: ({"error": v["error"], "command": v.get("command")} if "error" in v else
                     {"tokens": v["tokens"], **({"command": v["command"], "seconds": v["seconds"]} if "command" in v else {})})
                 for k, v in legs.items()},
        "hf_fp32_gaps": ref["gaps"],
        "pairs": pairs,
        "criteria": crit,
        "skipped": [k for k, skip in (("minivllm cuda", not run_cuda), ("minivllm cpu", args.skip_cpu)) if skip],
        "timings": timings,
        "seconds": time.time() - t_start,
    }
    res["pass"] = all(c["pass"] for c in crit) and not failed_legs
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
            f.write("\n")
    print_table(res)
    if failed_legs:
        return 2
    return 0 if res["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Tiny Qwen3 checkpoints and their greedy golden outputs, made by Hugging Face transformers.

What it is: the golden data for the engine's end-to-end tests. It writes three real
Hugging Face Qwen3 model directories (config.json, generation_config.json, model.safetensors in
bf16) and, in each, golden.json: the greedy token ids transformers produces for a fixed set of
prompts, plus the next-token logits after the first three prompts.

Where it sits: the whole model (embedding -> N x [RMSNorm, attention with q_norm/k_norm and
RoPE, RMSNorm, SwiGLU MLP] -> RMSNorm -> lm_head). The three models differ in what the engine
can get wrong: tied vs untied lm_head, head_dim 64 / 128 / 64 (the two the CUDA attention kernels
take, so every model runs on both backends), GQA ratio 2 / 4 / 1, hidden 96 / 64 / 128.

How to run (from the repository root; CPU only, about three minutes: one of training per model):
    python3 tests/data/make_tiny_qwen3.py
    python3 tests/data/make_tiny_qwen3.py --check      # recompute the committed checkpoints' goldens
                                                       # with this transformers/torch (exit 1 if a greedy
                                                       # id differs or a margin is below the floor), then
                                                       # retrain elsewhere and report weight bit-equality
    python3 tests/data/make_tiny_qwen3.py --check --no-retrain   # the goldens only (seconds)
Made with transformers 4.51.3 and torch 2.15 (CPU, one thread, deterministic algorithms); the
engine's tests compare golden.json's config_sha256 / weights_sha256 with the files beside it, so
a stale golden file fails with a hint naming this script. Do not edit the outputs by hand.

Why the models are trained: random weights give nearly flat next-token distributions, so some
greedy steps are near-ties (top-2 margins of 0.01-0.03 logit), and a correct bf16 engine
(~1.5% relative logit error) flips them. So each model starts from a seeded init (std 0.02,
norms 1; drawn from tensor names and shapes computed from the config, not from the model
object) and is trained for TRAIN_STEPS steps (about a minute) on a synthetic task that needs
attention and positions:
    next id after position t = 4 + 16*HI[x[t]] + LO[x[t-1]]    (x[t-1] := x[t] at t = 0),
    or eos (2 + LO[x[t-1]] % 2) when HI[x[t]] == 31,
with HI (id -> 0..31) and LO (id -> 0..15) random tables, different for each model. The model learns it to ~100% on
random inputs, so its greedy continuations are confident yet vary across prompts and positions
(the script asserts that they do, and that some reach an eos id); an engine that drops
attention, the KV cache or RoPE gets other ids.

The margin floor: after training, the script runs each model in bf16 (HF, CPU) over every
golden step and takes the largest |bf16 - float32| logit difference; the smallest top-2
margin over every golden step must be at least BF16_SAFETY (4) times that, and at least 0.25.
golden.json records min_top2_margin, bf16_max_abs_logit_error and margin_floor. Made with the
committed files: tied 5.27 / 0.219 / 0.88, untied 6.76 / 0.123 / 0.49,
mha 5.63 / 0.327 / 1.31 (min margin / bf16 error / floor, in logits).

Training is deterministic with one torch version but not bit-reproducible across versions, so
--check judges the committed weights: their goldens, recomputed by the running transformers,
must match golden.json exactly. Retraining is reported (a weight mismatch fails only under the
same torch and transformers versions as the committed files).

Why float32 and full recomputation: the golden tokens must be the exact answer for the bf16
weights, not one more implementation's rounding. The saved bf16 checkpoint is loaded back as
float32 (bf16 -> f32 is exact), attention is "eager", and each of the 12 greedy steps reruns
the whole sequence (no KV cache), so nothing depends on a cache implementation. HF's own
generate() with its KV cache is run as a cross-check and must agree.
"""
import argparse
import hashlib
import json
import os
import shutil
import sys
import tempfile

import torch
import transformers
from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = "tests/data/make_tiny_qwen3.py"
PROMPT_SEED = 1234
MAX_NEW_TOKENS = 12
VOCAB = 512
FIRST_SPECIAL_FREE_ID = 4  # ids 0..3 are "special" (1 = bos, 2 and 3 = eos); prompts avoid them
WEIGHT_STD = 0.02  # initial linear and embedding weights (HF's own init std), before training
NORM_STD = 0.0  # initial RMSNorm weights: 1 + N(0, NORM_STD), i.e. exactly 1
TIED_SEED = 1
UNTIED_SEED = 2

# The training task (see train()): for a sequence x, the target after position t is
#     HI[x[t]] * 16 + LO[x[t-1]] + 4    (x[t-1] := x[t] at t = 0)
# or, when HI[x[t]] == 31, the eos id 2 + (LO[x[t-1]] % 2).  HI: id -> 0..31 and LO: id -> 0..15
# are random tables (seeded by TASK_SEED and the model's seed: each model has its own). The
# answer needs the current token (residual stream) AND the
# previous one (an attention head that finds position t-1 through RoPE), so an engine that drops
# attention, the KV cache or the positions gets other ids; ~1/32 of the steps produce an eos.
TASK_SEED = 5
TRAIN_STEPS = 1000
TRAIN_LR = 5e-3
TRAIN_SHORT = 0.4  # the first 40% of the steps train on 64 sequences of 16 tokens (learns the
                   # previous-token head fast), the rest on 16 sequences of 48 or (every 4th) 128
EOS_INPUT_RATE = 0.05  # eos ids appear among the training inputs, as they do in generated text
BF16_SAFETY = 4.0  # the smallest golden top-2 margin must be >= BF16_SAFETY x the measured bf16 error
MIN_MARGIN_FLOOR = 0.25  # and never below this (logits)

# name -> (weight seed, the config fields that differ between the three models).
# Every head_dim is one the CUDA attention kernels take (64 or 128), so every model runs on
# both backends; the variety is in the GQA ratio (2 / 4 / 1), tied vs untied lm_head, hidden
# size (96: not a power of two / 64 / 128) and depth (2 / 3 / 2).
# The seed draws the initial weights and the training batches. The smallest top-2 margins
# are in golden.json ("top2_margins", "min_top2_margin") for the tests to report.
MODELS = {
    "tiny-qwen3-tied": (TIED_SEED, dict(hidden_size=96, intermediate_size=160, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                                   tie_word_embeddings=True)),
    "tiny-qwen3-untied": (UNTIED_SEED, dict(hidden_size=64, intermediate_size=192, num_hidden_layers=3,
                                       num_attention_heads=4, num_key_value_heads=1, head_dim=128,
                                       tie_word_embeddings=False)),
    "tiny-qwen3-mha": (3, dict(hidden_size=128, intermediate_size=224, num_hidden_layers=2,
                           num_attention_heads=2, num_key_value_heads=2, head_dim=64,
                           tie_word_embeddings=True)),
}
PROMPT_LENGTHS = [1, 2, 7, 16, 17, 33, 64, 100]  # around the 16-token block size and its tails
SHARED_PREFIX_LEN = 40  # 2.5 blocks of 16: full-block hits plus a partial block
SHARED_SUFFIX_LENS = [8, 1, 23]  # totals 48 (block-aligned), 41, 63
FIRST_LOGITS_CASES = 3


def make_prompts():
    """The same prompts for every model: 8 random ones, then 3 sharing a 40-token prefix."""
    g = torch.Generator().manual_seed(PROMPT_SEED)

    def rand_ids(n):
        return torch.randint(FIRST_SPECIAL_FREE_ID, VOCAB, (n,), generator=g).tolist()

    prompts = [rand_ids(n) for n in PROMPT_LENGTHS]
    prefix = rand_ids(SHARED_PREFIX_LEN)
    suffixes = [rand_ids(n) for n in SHARED_SUFFIX_LENS]
    # "then differ": the first token after the prefix must differ between every pair
    assert len({s[0] for s in suffixes}) == len(suffixes)
    prompts += [prefix + s for s in suffixes]
    return prompts


def make_config(fields):
    return Qwen3Config(vocab_size=VOCAB, max_position_embeddings=512, rope_theta=10000.0,
                       rms_norm_eps=1e-6, bos_token_id=1, eos_token_id=2,
                       sliding_window=None,  # as in Qwen3's own configs (null): no sliding window
                       max_window_layers=fields["num_hidden_layers"],  # as Qwen3's configs do
                       torch_dtype="bfloat16", **fields)


def canonical_weights(fields, seed):
    """The weights, drawn in a fixed order (sorted tensor names) from a seeded CPU generator.
    The names and shapes come from the config, not from the model object, so the draw does not
    depend on how a transformers version lists (or ties) its parameters."""
    H, I, hd = fields["hidden_size"], fields["intermediate_size"], fields["head_dim"]
    nq, nkv = fields["num_attention_heads"], fields["num_key_value_heads"]
    shapes = {"model.embed_tokens.weight": (VOCAB, H), "model.norm.weight": (H,)}
    if not fields["tie_word_embeddings"]:
        shapes["lm_head.weight"] = (VOCAB, H)
    for l in range(fields["num_hidden_layers"]):
        p = f"model.layers.{l}."
        shapes.update({p + "input_layernorm.weight": (H,), p + "post_attention_layernorm.weight": (H,),
                       p + "mlp.gate_proj.weight": (I, H), p + "mlp.up_proj.weight": (I, H),
                       p + "mlp.down_proj.weight": (H, I),
                       p + "self_attn.q_proj.weight": (nq * hd, H), p + "self_attn.k_proj.weight": (nkv * hd, H),
                       p + "self_attn.v_proj.weight": (nkv * hd, H), p + "self_attn.o_proj.weight": (H, nq * hd),
                       p + "self_attn.q_norm.weight": (hd,), p + "self_attn.k_norm.weight": (hd,)})
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name in sorted(shapes):
        noise = torch.randn(shapes[name], generator=g, dtype=torch.float32)
        out[name] = 1.0 + NORM_STD * noise if name.endswith("norm.weight") else WEIGHT_STD * noise
    return out


def task_tables(seed):
    g = torch.Generator().manual_seed(TASK_SEED * 1000 + seed)  # each model its own tables
    hi = torch.randint(0, 32, (VOCAB,), generator=g)
    lo = torch.randint(0, 16, (VOCAB,), generator=g)
    return hi, lo


def task_targets(x, hi, lo):
    """The next id the task wants after every position of x ([batch, len])."""
    prev = torch.cat([x[:, :1], x[:, :-1]], 1)
    out = FIRST_SPECIAL_FREE_ID + hi[x] * 16 + lo[prev]
    return torch.where(hi[x] == 31, 2 + lo[prev] % 2, out)


def train(model, seed):
    """Teach the model the task above: AdamW, one-cycle LR, random inputs (eos ids among them),
    cross-entropy at every position. CPU, one thread, deterministic algorithms, seeded data: the
    same torch version gives the same weights; another version may not (see --check)."""
    hi, lo = task_tables(seed)
    g = torch.Generator().manual_seed(1000 + seed)
    model.config._attn_implementation = "eager"
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=TRAIN_LR, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=TRAIN_LR, total_steps=TRAIN_STEPS, pct_start=0.05)
    for step in range(TRAIN_STEPS):
        short = step < TRAIN_STEPS * TRAIN_SHORT
        B, L = (64, 16) if short else (16, 128 if step % 4 == 3 else 48)
        x = torch.randint(FIRST_SPECIAL_FREE_ID, VOCAB, (B, L), generator=g)
        eos = torch.rand(B, L, generator=g) < EOS_INPUT_RATE
        x = torch.where(eos, 2 + torch.randint(0, 2, (B, L), generator=g), x)
        logits = model(x).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), task_targets(x, hi, lo).reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
    model.eval()
    print(f"  trained {TRAIN_STEPS} steps, last loss {loss.item():.4f}", flush=True)


def write_checkpoint(out_dir, name, fields, seed):
    config = make_config(fields)
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(config).float()
    params = dict(model.named_parameters())
    weights = canonical_weights(fields, seed)
    with torch.no_grad():
        for n, w in weights.items():
            assert params[n].shape == w.shape, (n, params[n].shape, w.shape)
            params[n].copy_(w)
    train(model, seed)
    model.generation_config = GenerationConfig(bos_token_id=1, eos_token_id=[2, 3], do_sample=True,
                                               temperature=0.6, top_k=20, top_p=0.95)
    model = model.to(torch.bfloat16)  # stored as bf16, like a real Qwen3 checkpoint
    if os.path.isdir(out_dir):
        shutil.rmtree(out_dir)
    model.save_pretrained(out_dir, safe_serialization=True)


def load_as(out_dir, dtype):
    # transformers 5 renamed from_pretrained's torch_dtype to dtype
    kw = {"dtype": dtype} if int(transformers.__version__.split(".")[0]) >= 5 else {"torch_dtype": dtype}
    return Qwen3ForCausalLM.from_pretrained(out_dir, attn_implementation="eager", **kw).eval()


def load_fp32(out_dir):
    return load_as(out_dir, torch.float32)


def bf16_logit_error(out_dir, cases):
    """How far bf16 arithmetic moves the logits: the model run in bf16 (HF, CPU) against float32,
    over every golden step (prompt + greedy ids in one forward). Returns the largest |difference|."""
    m32, m16 = load_fp32(out_dir), load_as(out_dir, torch.bfloat16)
    worst = 0.0
    with torch.no_grad():
        for c in cases:
            seq = c["prompt_token_ids"] + c["greedy_token_ids"][:-1]
            lo = len(c["prompt_token_ids"]) - 1
            a = m32(torch.tensor([seq])).logits[0, lo:].float()
            b = m16(torch.tensor([seq])).logits[0, lo:].float()
            worst = max(worst, (a - b).abs().max().item())
    return worst


def margin_stats(out_dir, cases):
    """min margin, bf16 error, floor; asserts the margin clears the floor."""
    err = bf16_logit_error(out_dir, cases)
    floor = max(MIN_MARGIN_FLOOR, BF16_SAFETY * err)
    mn = min(min(c["top2_margins"]) for c in cases)
    return {"min_top2_margin": mn, "bf16_max_abs_logit_error": err, "margin_floor": floor}


def greedy_full_recompute(model, prompt):
    """12 greedy steps, each a forward pass over the whole sequence (no KV cache).
    Returns the new ids, the logits after the prompt, and each step's top-1 minus top-2 gap."""
    ids = list(prompt)
    new, first_logits, margins = [], None, []
    with torch.no_grad():
        for step in range(MAX_NEW_TOKENS):
            logits = model(torch.tensor([ids])).logits[0, -1].float()
            if step == 0:
                first_logits = logits.clone()
            top2 = torch.topk(logits, 2).values
            margins.append((top2[0] - top2[1]).item())
            nxt = int(torch.argmax(logits))
            new.append(nxt)
            ids.append(nxt)
    return new, first_logits, margins


def greedy_hf_generate(model, prompt):
    """HF generate() with its KV cache and eos disabled: a cross-check of the loop above."""
    gc = GenerationConfig(do_sample=False, max_new_tokens=MAX_NEW_TOKENS, min_new_tokens=MAX_NEW_TOKENS,
                          eos_token_id=None, pad_token_id=0, bos_token_id=1)
    # generate() fills a passed config's default-valued fields (do_sample=False among them) from
    # the model's generation_config.json (do_sample=True...), so make the model's own greedy too.
    model.generation_config = gc
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                             generation_config=gc)
    return out[0, len(prompt):].tolist()


def sha256_file(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def fmt_float(x):
    # 7 significant digits are more than the engine's tolerance needs and keep the file small
    s = "%.7g" % x
    assert float(s) == float(s) and abs(float(s)) != float("inf"), s
    return s


def case_json(case):
    parts = ['"prompt_token_ids":' + json.dumps(case["prompt_token_ids"], separators=(",", ":")),
             '"greedy_token_ids":' + json.dumps(case["greedy_token_ids"], separators=(",", ":")),
             '"top2_margins":[' + ",".join("%.4g" % v for v in case["top2_margins"]) + "]"]
    if "first_logits" in case:
        parts.append('"first_logits":[' + ",".join(fmt_float(v) for v in case["first_logits"]) + "]")
    return "{" + ",".join(parts) + "}"


def write_golden(out_dir, cases, stats):
    header = {
        "generated_by": SCRIPT,
        "note": "made by Hugging Face transformers; do not edit; rerun the script",
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "method": "float32 (bf16 weights upcast), eager attention, greedy argmax, "
                  "full recomputation each step (no KV cache), eos ignored",
        "config_sha256": sha256_file(os.path.join(out_dir, "config.json")),
        "weights_sha256": sha256_file(os.path.join(out_dir, "model.safetensors")),
        "max_new_tokens": MAX_NEW_TOKENS,
        "task": "trained %d steps on: next = 4 + 16*HI[x[t]] + LO[x[t-1]], eos 2/3 when HI[x[t]] == 31 "
                "(HI, LO random tables, seed %d + the model's seed)" % (TRAIN_STEPS, TASK_SEED * 1000),
        "min_top2_margin": float("%.4g" % stats["min_top2_margin"]),
        "bf16_max_abs_logit_error": float("%.4g" % stats["bf16_max_abs_logit_error"]),
        "margin_floor": float("%.4g" % stats["margin_floor"]),
    }
    # one case per line: valid JSON that still diffs readably
    text = json.dumps(header, separators=(",", ":"))[:-1]
    text += ',\n"cases":[\n' + ",\n".join(case_json(c) for c in cases) + "\n]}\n"
    json.loads(text)  # it must parse
    with open(os.path.join(out_dir, "golden.json"), "w") as f:
        f.write(text)


def check_varied(name, cases):
    """Fail loudly if greedy decoding collapsed to a constant: such a golden tests nothing."""
    for i, c in enumerate(cases):
        distinct = len(set(c["greedy_token_ids"]))
        assert distinct >= 3, f"{name} case {i}: only {distinct} distinct generated ids {c['greedy_token_ids']}"
    outs = {tuple(c["greedy_token_ids"]) for c in cases}
    assert len(outs) == len(cases), f"{name}: two prompts produced the same continuation"
    assert any(t in (2, 3) for c in cases for t in c["greedy_token_ids"]), f"{name}: no golden reaches an eos id"
    firsts = {c["greedy_token_ids"][0] for c in cases}
    assert len(firsts) >= len(cases) // 2, f"{name}: first generated ids barely vary: {sorted(firsts)}"


def golden_cases(out_dir, name, prompts):
    """The golden cases of the checkpoint in out_dir (the cross-check with generate() included)."""
    model = load_fp32(out_dir)
    cases = []
    for j, prompt in enumerate(prompts):
        new, first_logits, margins = greedy_full_recompute(model, prompt)
        cached = greedy_hf_generate(model, prompt)
        assert cached == new, f"{name} case {j}: generate() {cached} != full recompute {new}"
        case = {"prompt_token_ids": prompt, "greedy_token_ids": new, "top2_margins": margins}
        if j < FIRST_LOGITS_CASES:
            case["first_logits"] = first_logits.tolist()
        cases.append(case)
    return cases


def check_margins(name, stats):
    assert stats["min_top2_margin"] >= stats["margin_floor"], (
        f"{name}: smallest top-2 margin {stats['min_top2_margin']:.4f} is below the floor "
        f"{stats['margin_floor']:.4f} (= max({MIN_MARGIN_FLOOR}, {BF16_SAFETY} x bf16 error "
        f"{stats['bf16_max_abs_logit_error']:.4f})): train longer or change the seed")


def read_safetensors(path):
    """{name: (dtype, shape, raw bytes)} with no library: the format is a JSON header and raw data."""
    with open(path, "rb") as f:
        b = f.read()
    n = int.from_bytes(b[:8], "little")
    header = json.loads(b[8:8 + n])
    out = {}
    for k, v in header.items():
        if k == "__metadata__":
            continue
        lo, hi = v["data_offsets"]
        out[k] = (v["dtype"], tuple(v["shape"]), b[8 + n + lo:8 + n + hi])
    return out


CONFIG_FIELDS = ["vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                 "num_key_value_heads", "head_dim", "tie_word_embeddings", "max_position_embeddings",
                 "rope_theta", "rms_norm_eps"]


def config_value(c, k):
    # transformers 5 writes rope_theta inside "rope_parameters"
    if k == "rope_theta" and k not in c:
        return (c.get("rope_parameters") or {}).get("rope_theta")
    return c.get(k)


def compare_weights(new_dir, ref_dir):
    """Problems (a list of strings) between two checkpoints: tensor bytes and config fields."""
    problems = []
    new_w = read_safetensors(os.path.join(new_dir, "model.safetensors"))
    ref_w = read_safetensors(os.path.join(ref_dir, "model.safetensors"))
    if sorted(new_w) != sorted(ref_w):
        problems.append(f"tensor names differ: {sorted(set(new_w) ^ set(ref_w))}")
    for k in sorted(set(new_w) & set(ref_w)):
        if new_w[k] != ref_w[k]:
            problems.append(f"tensor {k}: {new_w[k][:2]} vs committed {ref_w[k][:2]}, bytes differ")
    return problems


def compare_config(name, fields, ref_dir):
    problems = []
    want = make_config(fields).to_dict()
    with open(os.path.join(ref_dir, "config.json")) as f:
        ref_c = json.load(f)
    for k in CONFIG_FIELDS:
        w = want.get(k) if k in want else config_value(want, k)
        if config_value(ref_c, k) != w:
            problems.append(f"config {k}: committed {config_value(ref_c, k)}, the script says {w}")
    return problems


def check_goldens(name, fields, prompts, ref_dir):
    """The committed checkpoint's goldens, recomputed by this transformers/torch: greedy ids equal,
    margins above the floor. This is what --check judges (training is not reproducible across
    torch versions; the committed weights are the test data)."""
    problems = compare_config(name, fields, ref_dir)
    with open(os.path.join(ref_dir, "golden.json")) as f:
        ref = json.load(f)
    if ref.get("weights_sha256") != sha256_file(os.path.join(ref_dir, "model.safetensors")):
        problems.append("golden.json's weights_sha256 is not model.safetensors' sha256 (stale)")
    cases = golden_cases(ref_dir, name, prompts)
    stats = margin_stats(ref_dir, cases)
    if len(ref["cases"]) != len(cases):
        problems.append(f"{len(cases)} cases vs committed {len(ref['cases'])}")
    max_logit_diff = 0.0
    for j, (c, r) in enumerate(zip(cases, ref["cases"])):
        if c["prompt_token_ids"] != r["prompt_token_ids"]:
            problems.append(f"case {j}: prompt differs")
        if c["greedy_token_ids"] != r["greedy_token_ids"]:
            problems.append(f"case {j}: greedy ids {c['greedy_token_ids']} vs committed {r['greedy_token_ids']}")
        if "first_logits" in c and "first_logits" in r:
            d = max(abs(a - b) for a, b in zip(c["first_logits"], r["first_logits"]))
            max_logit_diff = max(max_logit_diff, d)
    if stats["min_top2_margin"] < stats["margin_floor"]:
        problems.append(f"min top-2 margin {stats['min_top2_margin']:.4f} < floor {stats['margin_floor']:.4f}")
    status = "OK" if not problems else "MISMATCH"
    print(f"{name}: {status}: {len(cases)} cases' greedy ids equal={not any('greedy ids' in p for p in problems)}, "
          f"first logits max |diff| {max_logit_diff:.3g}, min top-2 margin {stats['min_top2_margin']:.4f} "
          f"(floor {stats['margin_floor']:.4f}, bf16 error here {stats['bf16_max_abs_logit_error']:.4f}; "
          f"committed by transformers {ref.get('transformers')}, torch {ref.get('torch')})", flush=True)
    for p in problems:
        print("    " + p)
    return not problems, ref


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", help="write the models here instead of tests/data/ (a directory)")
    ap.add_argument("--check", action="store_true",
                    help="recompute the committed checkpoints' goldens with this transformers and compare "
                         "(greedy ids equal, margins above the floor); then retrain into a temporary "
                         "directory and report whether the weights are bit-equal; exit 1 on a mismatch")
    ap.add_argument("--no-retrain", action="store_true", help="with --check: skip the retraining")
    args = ap.parse_args()
    transformers.utils.logging.disable_progress_bar()
    torch.set_num_threads(1)  # one summation order for the float32 reference and the training
    torch.use_deterministic_algorithms(True)
    prompts = make_prompts()
    print(f"transformers {transformers.__version__}, torch {torch.__version__}", flush=True)
    if args.check:
        return check(prompts, args)
    base = args.out or HERE
    for name, (seed, fields) in MODELS.items():
        out_dir = os.path.join(base, name)
        print(f"{name}: training", flush=True)
        write_checkpoint(out_dir, name, fields, seed)
        cases = golden_cases(out_dir, name, prompts)
        check_varied(name, cases)
        stats = margin_stats(out_dir, cases)
        check_margins(name, stats)
        write_golden(out_dir, cases, stats)
        sizes = {f: os.path.getsize(os.path.join(out_dir, f)) for f in sorted(os.listdir(out_dir))}
        assert sum(sizes.values()) < 1 << 20, f"{name} is not small: {sizes}"
        print(f"{name}: {sizes}  min top-2 margin {stats['min_top2_margin']:.4f}, floor {stats['margin_floor']:.4f} "
              f"(bf16 error {stats['bf16_max_abs_logit_error']:.4f})", flush=True)
    return 0


def check(prompts, args):
    ok = True
    refs = {}
    for name, (seed, fields) in MODELS.items():
        good, refs[name] = check_goldens(name, fields, prompts, os.path.join(HERE, name))
        ok = good and ok
    print("make_tiny_qwen3 --check: goldens " + ("PASS: the committed checkpoints' goldens reproduce under "
                                                 "transformers " + transformers.__version__ if ok else "FAIL"),
          flush=True)
    if args.no_retrain:
        return 0 if ok else 1
    with tempfile.TemporaryDirectory(prefix="tiny-qwen3-check-") as tmp:
        for name, (seed, fields) in MODELS.items():
            out_dir = os.path.join(tmp, name)
            write_checkpoint(out_dir, name, fields, seed)
            problems = compare_weights(out_dir, os.path.join(HERE, name))
            same_versions = (refs[name].get("torch") == torch.__version__
                             and refs[name].get("transformers") == transformers.__version__)
            if not problems:
                print(f"{name}: retrained weights bit-equal to the committed ones")
            elif same_versions:
                print(f"{name}: MISMATCH: retrained weights differ under the versions that made them:")
                for p in problems[:5]:
                    print("    " + p)
                ok = False
            else:
                print(f"{name}: note: retrained weights differ ({len(problems)} tensors); expected with "
                      f"another torch/transformers than the committing one (training is not bit-reproducible "
                      f"across versions); the goldens above are what counts")
    print("make_tiny_qwen3 --check: " + ("PASS" if ok else "FAIL"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Tiny Qwen3 checkpoints and their greedy golden outputs, made by Hugging Face transformers.

What it is: the golden data for the engine's end-to-end tests (issue 8). It writes three real
Hugging Face Qwen3 model directories (config.json, generation_config.json, model.safetensors in
bf16) and, in each, golden.json: the greedy token ids transformers produces for a fixed set of
prompts, plus the next-token logits after the first three prompts.

Where it sits: the whole model (embedding -> N x [RMSNorm, attention with q_norm/k_norm and
RoPE, RMSNorm, SwiGLU MLP] -> RMSNorm -> lm_head). The three models differ in what the engine
can get wrong: tied vs untied lm_head, head_dim 64 / 128 / 64 (the two the CUDA attention kernels
take, so every model runs on both backends), GQA ratio 2 / 4 / 1, hidden 96 / 64 / 128.

How to run (from the repository root; CPU only, a few seconds):
    python3 tests/data/make_tiny_qwen3.py
    python3 tests/data/make_tiny_qwen3.py --check      # regenerate into a temporary directory and
                                                       # compare with the committed files (exit 1 if not
                                                       # weight-bit-equal with the same greedy ids)
    python3 tests/data/make_tiny_qwen3.py --search-seeds 24   # how the weight seeds were chosen
--check works offline with transformers 4.51 and 5.x (checked with 5.17 and torch 2.15 on a CPU);
the weights are drawn from tensor names and shapes computed from the config, not from the model
object, so they do not depend on how a transformers version lists its parameters.
Made with transformers 4.51.3 and torch 2.15; the engine's tests compare golden.json's
config_sha256 / weights_sha256 with the files beside it, so a stale golden file fails with a
hint naming this script. Do not edit the outputs by hand: rerun this script.

Why the weights are re-initialised: HF's default init (std 0.02) gives a model whose logits
barely depend on the input, so every greedy token is the same and the test would pass for an
engine that ignores attention. With std 0.15 the outputs vary across positions and prompts;
the script asserts that they do.

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
WEIGHT_STD = 0.15  # linear and embedding weights
NORM_STD = 0.1  # RMSNorm weights: 1 + N(0, 0.1)
TIED_SEED = 8
UNTIED_SEED = 11

# name -> (weight seed, the config fields that differ between the three models).
# Every head_dim is one the CUDA attention kernels take (64 or 128), so every model runs on
# both backends; the variety is in the GQA ratio (2 / 4 / 1), tied vs untied lm_head, hidden
# size (96: not a power of two / 64 / 128) and depth (2 / 3 / 2).
# Each weight seed is the one of seeds 1..24 whose golden run has the widest smallest gap
# between the top two logits and passes check_varied() (`--search-seeds 24` prints them): a
# near-tie would make the test flaky for a correct engine that merely sums in another order.
# The gaps are in golden.json ("top2_margins") for the tests to report.
MODELS = {
    "tiny-qwen3-tied": (TIED_SEED, dict(hidden_size=96, intermediate_size=160, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                                   tie_word_embeddings=True)),
    "tiny-qwen3-untied": (UNTIED_SEED, dict(hidden_size=64, intermediate_size=192, num_hidden_layers=3,
                                       num_attention_heads=4, num_key_value_heads=1, head_dim=128,
                                       tie_word_embeddings=False)),
    "tiny-qwen3-mha": (6, dict(hidden_size=128, intermediate_size=224, num_hidden_layers=2,
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
    model.generation_config = GenerationConfig(bos_token_id=1, eos_token_id=[2, 3], do_sample=True,
                                               temperature=0.6, top_k=20, top_p=0.95)
    model = model.to(torch.bfloat16)  # stored as bf16, like a real Qwen3 checkpoint
    if os.path.isdir(out_dir):
        shutil.rmtree(out_dir)
    model.save_pretrained(out_dir, safe_serialization=True)


def load_fp32(out_dir):
    # transformers 5 renamed from_pretrained's torch_dtype to dtype
    kw = {"dtype": torch.float32} if int(transformers.__version__.split(".")[0]) >= 5 else {"torch_dtype": torch.float32}
    return Qwen3ForCausalLM.from_pretrained(out_dir, attn_implementation="eager", **kw).eval()


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


def write_golden(out_dir, cases):
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
    firsts = {c["greedy_token_ids"][0] for c in cases}
    assert len(firsts) >= len(cases) // 2, f"{name}: first generated ids barely vary: {sorted(firsts)}"


def make_model(out_dir, name, seed, fields, prompts):
    """Write one checkpoint and compute its golden cases (the cross-check with generate() included)."""
    write_checkpoint(out_dir, name, fields, seed)
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


def check_against(name, tmp_dir, cases, ref_dir):
    """The regenerated model against the committed one: weights bit-equal, config fields equal,
    greedy ids equal; the first logits' largest difference is reported, not judged."""
    problems = []
    new_w = read_safetensors(os.path.join(tmp_dir, "model.safetensors"))
    ref_w = read_safetensors(os.path.join(ref_dir, "model.safetensors"))
    if sorted(new_w) != sorted(ref_w):
        problems.append(f"tensor names differ: {sorted(set(new_w) ^ set(ref_w))}")
    for k in sorted(set(new_w) & set(ref_w)):
        if new_w[k] != ref_w[k]:
            problems.append(f"tensor {k}: {new_w[k][:2]} vs committed {ref_w[k][:2]}, bytes differ")
    with open(os.path.join(tmp_dir, "config.json")) as f:
        new_c = json.load(f)
    with open(os.path.join(ref_dir, "config.json")) as f:
        ref_c = json.load(f)
    for k in CONFIG_FIELDS:
        if config_value(new_c, k) != config_value(ref_c, k):
            problems.append(f"config {k}: {config_value(new_c, k)} vs committed {config_value(ref_c, k)}")
    with open(os.path.join(ref_dir, "golden.json")) as f:
        ref = json.load(f)
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
    status = "OK" if not problems else "MISMATCH"
    print(f"{name}: {status}: {len(new_w)} tensors bit-equal={not any('bytes differ' in p for p in problems)}, "
          f"{len(cases)} cases' greedy ids equal={not any('greedy ids' in p for p in problems)}, "
          f"first logits max |diff| {max_logit_diff:.3g} (committed by transformers {ref.get('transformers')}, "
          f"torch {ref.get('torch')})")
    for p in problems:
        print("    " + p)
    return not problems


def search_seeds(n, prompts, tmp):
    """Print, for seeds 1..n of each model, whether it passes check_varied and its smallest margin."""
    for name, (_, fields) in MODELS.items():
        best = None
        for seed in range(1, n + 1):
            cases = make_model(os.path.join(tmp, name), name, seed, fields, prompts)
            try:
                check_varied(name, cases)
                ok = True
            except AssertionError:
                ok = False
            m = min(min(c["top2_margins"]) for c in cases)
            if ok and (best is None or m > best[1]):
                best = (seed, m)
            print(f"{name} seed {seed}: varied {ok}, min top2 margin {m:.4f}", flush=True)
        print(f"{name}: best seed {best}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", help="write the models here instead of tests/data/ (a directory)")
    ap.add_argument("--check", action="store_true",
                    help="regenerate into a temporary directory (or --out) and compare with the committed "
                         "tests/data models: weights bit-equal, greedy ids equal; exit 1 on a mismatch")
    ap.add_argument("--search-seeds", type=int, metavar="N", help="try weight seeds 1..N, print the margins")
    args = ap.parse_args()
    transformers.utils.logging.disable_progress_bar()
    torch.set_num_threads(1)  # one summation order for the float32 reference
    torch.use_deterministic_algorithms(True)
    prompts = make_prompts()
    print(f"transformers {transformers.__version__}, torch {torch.__version__}")
    if args.search_seeds:
        with tempfile.TemporaryDirectory() as tmp:
            search_seeds(args.search_seeds, prompts, tmp)
        return 0
    tmp = None
    if args.check and not args.out:
        tmp = tempfile.TemporaryDirectory(prefix="tiny-qwen3-check-")
    base = tmp.name if tmp else (args.out or HERE)
    ok = True
    for name, (seed, fields) in MODELS.items():
        out_dir = os.path.join(base, name)
        cases = make_model(out_dir, name, seed, fields, prompts)
        check_varied(name, cases)
        if args.check:
            ok = check_against(name, out_dir, cases, os.path.join(HERE, name)) and ok
            continue
        write_golden(out_dir, cases)
        sizes = {f: os.path.getsize(os.path.join(out_dir, f)) for f in sorted(os.listdir(out_dir))}
        assert sum(sizes.values()) < 1 << 20, f"{name} is not small: {sizes}"
        print(f"{name}: {sizes}  min top2 margin {min(min(c['top2_margins']) for c in cases):.4f}")
    if tmp:
        tmp.cleanup()
    if args.check:
        print("make_tiny_qwen3 --check: " + ("PASS: the committed checkpoints and goldens reproduce"
                                               if ok else "FAIL"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Tiny Qwen3 checkpoints and their greedy golden outputs, made by Hugging Face transformers.

What it is: the golden data for the engine's end-to-end tests (issue 8). It writes three real
Hugging Face Qwen3 model directories (config.json, generation_config.json, model.safetensors in
bf16) and, in each, golden.json: the greedy token ids transformers produces for a fixed set of
prompts, plus the next-token logits after the first three prompts.

Where it sits: the whole model (embedding -> N x [RMSNorm, attention with q_norm/k_norm and
RoPE, RMSNorm, SwiGLU MLP] -> RMSNorm -> lm_head). The three models differ in what the engine
can get wrong: tied vs untied lm_head, head_dim 16 / 32 / 64, GQA ratio 2 / 4 / 1.

How to run (from the repository root; CPU only, a few seconds):
    python3 tests/data/make_tiny_qwen3.py
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
import hashlib
import json
import os
import shutil

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

# name -> (weight seed, the config fields that differ between the three models).
# Each weight seed is the one of seeds 1..24 whose golden run has the widest smallest gap
# between the top two logits (0.007 / 0.017 / 0.020 here; the logits' spread is ~1.5) and passes
# check_varied(): a near-tie would make the test flaky for a correct engine that merely sums
# in another order. The gaps are in golden.json ("top2_margins") for the tests to report.
MODELS = {
    "tiny-qwen3-tied": (17, dict(hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                            num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                            tie_word_embeddings=True)),
    "tiny-qwen3-untied": (18, dict(hidden_size=96, intermediate_size=192, num_hidden_layers=3,
                              num_attention_heads=4, num_key_value_heads=1, head_dim=32,
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


def reinit_(model, seed):
    """Larger-than-default random weights, in a fixed order from a seeded generator."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        # named_parameters() lists a tied lm_head once (as model.embed_tokens.weight)
        for name, p in sorted(model.named_parameters()):
            noise = torch.randn(p.shape, generator=g, dtype=torch.float32)
            if name.endswith("norm.weight"):
                p.copy_(1.0 + NORM_STD * noise)
            else:
                p.copy_(WEIGHT_STD * noise)


def write_checkpoint(out_dir, name, fields, seed):
    config = make_config(fields)
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(config).float()
    reinit_(model, seed)
    model.generation_config = GenerationConfig(bos_token_id=1, eos_token_id=[2, 3], do_sample=True,
                                               temperature=0.6, top_k=20, top_p=0.95)
    model = model.to(torch.bfloat16)  # stored as bf16, like a real Qwen3 checkpoint
    if os.path.isdir(out_dir):
        shutil.rmtree(out_dir)
    model.save_pretrained(out_dir, safe_serialization=True)


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


def main():
    torch.set_num_threads(1)  # one summation order for the float32 reference
    torch.use_deterministic_algorithms(True)
    prompts = make_prompts()
    for name, (seed, fields) in MODELS.items():
        out_dir = os.path.join(HERE, name)
        write_checkpoint(out_dir, name, fields, seed)
        model = Qwen3ForCausalLM.from_pretrained(out_dir, torch_dtype=torch.float32,
                                                 attn_implementation="eager").eval()
        cases = []
        for j, prompt in enumerate(prompts):
            new, first_logits, margins = greedy_full_recompute(model, prompt)
            cached = greedy_hf_generate(model, prompt)
            assert cached == new, f"{name} case {j}: generate() {cached} != full recompute {new}"
            case = {"prompt_token_ids": prompt, "greedy_token_ids": new, "top2_margins": margins}
            if j < FIRST_LOGITS_CASES:
                case["first_logits"] = first_logits.tolist()
            cases.append(case)
        check_varied(name, cases)
        write_golden(out_dir, cases)
        sizes = {f: os.path.getsize(os.path.join(out_dir, f)) for f in sorted(os.listdir(out_dir))}
        assert sum(sizes.values()) < 1 << 20, f"{name} is not small: {sizes}"
        print(f"{name}: {sizes}  min top2 margin {min(min(c['top2_margins']) for c in cases):.4f}")


if __name__ == "__main__":
    main()

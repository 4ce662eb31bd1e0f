"""The tiny test checkpoint beside Qwen3's real tokenizer, for the tests in tests/serve/.

make_model_dir(qwen, d) fills the empty folder d: tests/data/tiny-qwen3-tied's config and
weights (linked), and qwen's tokenizer.json cut to the tiny model's 512 ids (the merges
whose parts and result all survive, no added tokens), as tests/test_engine_cpu.c's
write_cut_tokenizer does. With chat_template, tokenizer_config.json keeps Qwen3's chat
template (the server's /v1/chat/completions needs it).
"""
import json
import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = os.path.join(ROOT, "tests", "data", "tiny-qwen3-tied")


def make_model_dir(qwen, d, chat_template=False):
    for f in ("config.json", "generation_config.json", "model.safetensors"):
        os.symlink(os.path.join(TINY, f), os.path.join(d, f))
    with open(os.path.join(qwen, "tokenizer.json"), encoding="utf-8") as f:
        tok = json.load(f)
    vocab = {k: v for k, v in tok["model"]["vocab"].items() if v < 512}

    def pair(m):
        return m.split(" ", 1) if isinstance(m, str) else m

    tok["model"]["vocab"] = vocab
    tok["model"]["merges"] = [m for m in tok["model"]["merges"]
                              if pair(m)[0] in vocab and pair(m)[1] in vocab and "".join(pair(m)) in vocab]
    tok["added_tokens"] = []
    with open(os.path.join(d, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tok, f)
    config = {"eos_token": None}
    if chat_template:
        with open(os.path.join(qwen, "tokenizer_config.json"), encoding="utf-8") as f:
            config["chat_template"] = json.load(f)["chat_template"]
    with open(os.path.join(d, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f)

"""
tests/tokenizer/textgen.py - the texts the C tokenizer is checked and timed on.

Shared by compare_hf.py (correctness against Hugging Face) and bench_hf.py
(speed). Everything is seeded, so a failing case can be replayed:

  hard_cases()            hand-written cases, one reason each
  random_strings(n, seed) strings that mix every kind of hard piece at random
  chat_cases(seed)        chat requests for the chat-template comparison
  bench_documents(mb, seed) a few MB of mixed prose, code and CJK text
  add_common_args(ap)     --minivllm and --model, for both scripts

No NUL characters: the JSON lines interface goes through cJSON, whose strings
are C strings.
"""
import os
import random


def add_common_args(ap):
    """The two options every tokenizer script takes: which program, which model."""
    ap.add_argument("--minivllm", default="build/minivllm", help="the built program (default build/minivllm)")
    ap.add_argument("--model", default=os.environ.get("MV_QWEN3_DIR"),
                    help="Qwen3 model directory (default $MV_QWEN3_DIR)")

SPECIAL_TEXTS = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<think>", "</think>",
                 "<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|vision_pad|>",
                 "<tool_response>", "</tool_response>"]
# Near misses: these must NOT become special tokens.
NEAR_SPECIAL = ["<|im_start", "im_start|>", "<|", "|>", "<|im_end |>", "< think>", "<thinK>",
                "<<|im_start|>>", "<|endoftext|", "<think", "</think"]

# Every White_Space character and a few look-alikes that are not white space.
WHITESPACE = [" ", "\t", "\n", "\r", "\r\n", "\x0b", "\x0c", "\x85", "\xa0", "\u1680",
              "\u2000", "\u2001", "\u2002", "\u2003", "\u2004", "\u2005", "\u2006", "\u2007",
              "\u2008", "\u2009", "\u200a", "\u2028", "\u2029", "\u202f", "\u205f", "\u3000",
              "\u180e", "\u200b", "\ufeff", "\u2060"]

WORDS_EN = ("the of and to in is that it for was on are as with his they at be this have from "
            "or one had by word but not what all were we when your can said there use an each "
            "which she do how their if will up other about out many then them these so some her "
            "would make like him into time has look two more write go see number no way could "
            "people my than first water been call who oil its now find long down day did get "
            "come made may part model token server request kernel memory cache batch layer "
            "attention tensor gradient inference latency throughput scheduler block").split()
CJK_ZH = "的一是不了人我在有他这为之大来以个中上们到说国和地也子时道出而要于就下得可你年生自会那后能对着事其里所去行过家十用发天如然作方成者多日都三小军二无同么经法当起与好看学进种将还分此心前面又定见只主没公从知"
JA = ["こんにちは", "カタカナ", "ひらがな", "東京", "ですね", "ラーメン", "ｶﾀｶﾅ", "日本語の文章です。",
      "ー", "ゔ", "か\u3099", "は\u309a"]   # the last two compose under NFC (が, ぱ)
KO = ["안녕하세요", "한국어", "서울", "\u1100\u1161\u11a8", "\u1112\u1161\u11ab"]  # conjoining jamo compose under NFC
EMOJI = ["😀", "👍🏽", "👩\u200d💻", "👨\u200d👩\u200d👧\u200d👦", "🏳\ufe0f\u200d🌈", "🇯🇵", "🇺🇸🇬🇧",
         "❤\ufe0f", "☺", "🧑🏿\u200d🚀", "1\ufe0f\u20e3", "🫠"]
COMBINING = ["e\u0301", "a\u0308", "o\u0302\u0323", "o\u0323\u0302", "n\u0303", "A\u030a",
             "\u212b", "\u1e0b\u0323", "q\u0307\u0323", "\u0301", "c\u0327", "i\u0307\u0301",
             "\u00e9", "\u0041\u0301\u0301", "\u0958", "\uf900"]   # last two: composition exclusions / singletons
OTHER_SCRIPTS = ["Привет", "Ελληνικά", "مرحبا بالعالم", "שלום", "नमस्ते", "สวัสดีครับ", "ĳ", "ﬁ",
                 "Straße", "İstanbul", "ǅ", "Ⅻ", "½", "²", "٣", "①", "𝟘𝟙", "ſ"]
CODE = ["def f(x):\n    return x**2\n", "int main(void) { return 0; }", "for (i = 0; i < n; ++i)",
        "if x != None and y >= 3:", "#include <stdio.h>", "    \n\t\tfoo();\n", "a->b->c",
        "x = [1, 2, 3]  # comment", "SELECT * FROM t WHERE id=42;", "/* */ // ...",
        "print(f\"{x!r:>10}\")", "$HOME/.config", "\\n\\t\\\\", "```python\n", "===", "!!!???"]
CONTRACTIONS = ["it's", "IT'S", "we're", "they've", "I'm", "you'll", "he'd", "don't", "'s", "'S",
                "'ll", "'LL", "'Ve", "'re", "'d", "it’s", "o'clock", "'''", "''s", "'ſ"]
PUNCT = list(".,;:!?-_()[]{}<>\"'`~@#$%^&*+=|/\\") + ["…", "—", "–", "«", "»", "¿", "¡", "、", "。", "，", "「", "」"]


def hard_cases():
    """Hand-written hard cases."""
    cases = [
        "", "a", " ", "  ", "\n", "\n\n", "\r\n", " \n", "\n ", "Hello world", "Hello, world!",
        "hello   world", "   leading", "trailing   ", "a\tb", "a \t b", "a\n\n\nb", "a \n \n b",
        "line1\r\nline2\r\n", "\r\r\n\n", "  \n  \n  ", "x \u00a0 y", "x\u3000y", "x\u2028y", "x\x85y",
        "x \x85 y", "\u2003\u2003word", "word\u2009\u2009", " \t\n\x0b\x0c\r\x85\xa0\u1680\u2000\u2028\u2029\u3000end",
        # digits are split one by one
        "12345678901234567890", "3.14159", "1,000,000", "v1.2.3", "0x1F", "٠١٢٣", "１２３", "2024年1月1日",
        "a" * 300, "ab" * 200, "  " * 150, "\n" * 100, "1" * 500, "!" * 100,
        # CJK, Japanese, Korean
        "你好，世界！", "我爱北京天安门。", "中文English混合text", "こんにちは世界", "日本語の文章です。カタカナ、ひらがな。",
        "ｶﾀｶﾅ", "안녕하세요 세계", "\u1100\u1161\u11a8", CJK_ZH,
        # emoji and ZWJ sequences
        "😀", "👩\u200d💻 codes", "👨\u200d👩\u200d👧\u200d👦", "🏳\ufe0f\u200d🌈", "🇯🇵🇺🇸", "👍🏽👍🏿", "a😀b", "😀😀😀",
        # combining marks that NFC composes (or reorders)
        "e\u0301", "cafe\u0301", "o\u0323\u0302", "o\u0302\u0323", "\u212b", "A\u030a", "\u1e0b\u0323",
        "\u0301start", "n\u0303o", "\u0958", "\uf900", "\u00c5ngstr\u00f6m vs A\u030angstro\u0308m",
        # contractions, case-insensitive
        "it's", "IT'S", "They'll", "I'M", "we've", "you'D", "don't", "rock'n'roll", "'s'", "it’s", "'ſ",
        # code
        "def f(x):\n    return x**2\n", "int main(void) {\n\treturn 0;\n}\n", "x=[1,2,3];y={'a':1}",
        "    indented\n        more\n", "a->b && c || !d", "#!/bin/bash\necho \"$HOME\"\n",
        # special tokens inside ordinary text, and near misses
        "<|im_start|>", "<|im_start|>user\nHi<|im_end|>\n", "text<|endoftext|>more", "<think>\n\n</think>\n\n",
        "<|im_start|><|im_end|>", "<|im_start", "<|", "|>", "<<|im_start|>>", "a<|im_end|>b<|im_end|>",
        "<tool_call>{}</tool_call>", " <|im_start|> ", "\n<|im_end|>\n", "<|endoftext|", "<thinK>",
        "e\u0301<|im_end|>\u0301", "<|im_start|>" * 5,
        # other scripts and odd characters
        "Привет, мир", "Ελληνικά", "مرحبا بالعالم", "שלום עולם", "नमस्ते दुनिया", "สวัสดีครับ", "Straße",
        "İstanbul", "ﬁle", "ĳs", "½ ² Ⅻ ①", "\u200b", "a\u200bb", "\ufeffBOM", "\u00ad", "\U0001d7d8\U0001d7d9",
        "\ue000\uf8ff", "\ufffd", "\uffff", "\U0010ffff", "\U0001f600\U0001f601", "~~~", "...", "!!!???",
    ]
    return cases


def _piece(rng):
    kind = rng.random()
    if kind < 0.12: return rng.choice(WORDS_EN)
    if kind < 0.20: return rng.choice(WHITESPACE) * rng.choice([1, 1, 1, 2, 3, 5])
    if kind < 0.26: return "".join(rng.choice(CJK_ZH) for _ in range(rng.randint(1, 8)))
    if kind < 0.30: return rng.choice(JA)
    if kind < 0.33: return rng.choice(KO)
    if kind < 0.38: return rng.choice(EMOJI)
    if kind < 0.44: return rng.choice(COMBINING)
    if kind < 0.48: return rng.choice(OTHER_SCRIPTS)
    if kind < 0.53: return rng.choice(CODE)
    if kind < 0.58: return rng.choice(CONTRACTIONS)
    if kind < 0.64: return "".join(rng.choice(PUNCT) for _ in range(rng.randint(1, 4)))
    if kind < 0.69: return "".join(rng.choice("0123456789") for _ in range(rng.randint(1, 30)))
    if kind < 0.73: return rng.choice(SPECIAL_TEXTS)
    if kind < 0.76: return rng.choice(NEAR_SPECIAL)
    if kind < 0.80: return rng.choice(["\n", "\r\n", "\r", "\n\n", " \n", "\n ", "\t\n"])
    if kind < 0.88:
        # Any code point of the BMP or beyond, except surrogates and NUL.
        while True:
            cp = rng.randint(1, 0x10FFFF) if rng.random() < 0.3 else rng.randint(1, 0xFFFF)
            if not 0xD800 <= cp <= 0xDFFF:
                return chr(cp)
    if kind < 0.94: return rng.choice(WORDS_EN).capitalize() + rng.choice([" ", ", ", ". ", "\n"])
    return chr(rng.randint(0x20, 0x7E))


def random_strings(n, seed):
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        parts = [_piece(rng) for _ in range(rng.randint(1, 24))]
        sep = rng.choice(["", " ", "", " ", "\n", ""])
        out.append(sep.join(parts))
    return out


def chat_cases(seed, n_random=300):
    """(messages, options) pairs; options holds add_generation_prompt and maybe enable_thinking."""
    U = lambda c: {"role": "user", "content": c}
    A = lambda c: {"role": "assistant", "content": c}
    S = lambda c: {"role": "system", "content": c}
    convs = [
        [U("Hi")],
        [S("You are a helpful assistant."), U("What is 2+2?")],
        [S("Be brief."), U("Hello"), A("Hi! How can I help?"), U("Tell me a joke.")],
        [U("Q1"), A("<think>\nfirst thought\n</think>\n\nA1"), U("Q2"), A("<think>\nsecond\n</think>\n\nA2")],
        [U("Q"), A("<think>\n\n</think>\n\nplain answer")],
        [U("Q"), A("\n\n<think>\nr\n\n</think>\n\n\nanswer with newlines\n")],
        [U("Q"), {"role": "assistant", "content": "answer", "reasoning_content": "\nI reasoned.\n"}],
        [U("Q1"), {"role": "assistant", "content": "A1", "reasoning_content": "old thinking"}, U("Q2"),
         {"role": "assistant", "content": "A2", "reasoning_content": "new thinking"}],
        [U("Q"), {"role": "assistant", "content": "A", "reasoning_content": None}],
        [U("Q"), A("partial answer")],
        [U("Q"), A("one"), A("two")],
        [S("sys"), S("a second system message"), U("u")],
        [U("你好"), A("你好！有什么可以帮你的吗？"), U("讲个笑话 😀")],
        [U("<|im_start|>inject<|im_end|>"), A("</think>only closing")],
        [U("Q"), A("A <think>inline</think> tail")],
        [U("call a tool"), {"role": "tool", "content": "{\"temp\": 20}"}, {"role": "tool", "content": "second"},
         A("It is 20 degrees.")],
        [U("<tool_response>\nx\n</tool_response>")],
        [U("real query"), A("a"), U("<tool_response>\nr\n</tool_response>"), A("<think>\nt\n</think>\n\nb")],
        [S("only a system message")],
        [U(""), A("")],
        [U("  spaces  \n\n"), A("\n\nleading newlines")],
        [U("e\u0301 needs NFC"), A("cafe\u0301")],
    ]
    options = [{"add_generation_prompt": True}, {"add_generation_prompt": True, "enable_thinking": False},
               {"add_generation_prompt": True, "enable_thinking": True}, {"add_generation_prompt": False},
               {"add_generation_prompt": False, "enable_thinking": False}]
    cases = [(c, o) for c in convs for o in options]
    rng = random.Random(seed)
    strings = random_strings(n_random * 4, seed + 1)
    for i in range(n_random):
        msgs = []
        if rng.random() < 0.4:
            msgs.append(S(strings[4 * i]))
        for k in range(rng.randint(1, 4)):
            msgs.append(U(strings[4 * i + 1]))
            if rng.random() < 0.8:
                body = strings[4 * i + 2]
                r = rng.random()
                if r < 0.3:
                    body = "<think>\n" + strings[4 * i + 3] + "\n</think>\n\n" + body
                    msgs.append(A(body))
                elif r < 0.5:
                    msgs.append({"role": "assistant", "content": body, "reasoning_content": strings[4 * i + 3]})
                else:
                    msgs.append(A(body))
        cases.append((msgs, rng.choice(options)))
    return cases


def bench_documents(megabytes, seed):
    """Mixed text for timing: English-like prose, code, Chinese and a little of
    everything hard, in documents of 1-8 KB, drawn from small word lists so
    words repeat as they do in real text."""
    rng = random.Random(seed)
    docs, total = [], 0
    zh_words = ["".join(rng.choice(CJK_ZH) for _ in range(rng.randint(1, 4))) for _ in range(400)]
    idents = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz_") for _ in range(rng.randint(2, 10))) for _ in range(300)]
    while total < megabytes * 1e6:
        kind, size, parts = rng.random(), rng.randint(1000, 8000), []
        n = 0
        while n < size:
            if kind < 0.55:    # prose
                s = " ".join(rng.choice(WORDS_EN) for _ in range(rng.randint(4, 18)))
                s = s.capitalize() + rng.choice([". ", ", ", "! ", "? ", ".\n", ".\n\n"])
                if rng.random() < 0.1: s += str(rng.randint(0, 10**rng.randint(1, 6))) + " "
                if rng.random() < 0.05: s += rng.choice(CONTRACTIONS) + " "
            elif kind < 0.75:  # code
                ind = "    " * rng.randint(0, 3)
                a, b = rng.choice(idents), rng.choice(idents)
                s = rng.choice([f"{ind}{a} = {b}({rng.randint(0, 99)});\n", f"{ind}if ({a} != {b}) {{\n",
                                f"{ind}return {a}->{b};\n", f"{ind}}}\n", f"{ind}// {rng.choice(WORDS_EN)} {rng.choice(WORDS_EN)}\n",
                                f"{ind}def {a}(self, {b}):\n"])
            elif kind < 0.93:  # Chinese with some English and numbers
                s = "".join(rng.choice(zh_words) for _ in range(rng.randint(3, 12)))
                s += rng.choice(["，", "。", "！", "？\n", "。\n"])
                if rng.random() < 0.1: s += rng.choice(WORDS_EN) + " "
            else:              # everything hard
                s = random_strings(1, rng.randint(0, 10**9))[0] + "\n"
            parts.append(s)
            n += len(s.encode())
        doc = "".join(parts)
        docs.append(doc)
        total += len(doc.encode())
    return docs

#!/usr/bin/env python3
"""tests/gpu/serve_smoke.py - `minivllm serve` with vLLM's sampling options, on any backend: one completion
with n = 2, logprobs, the penalties, min_p and min_tokens, streamed and not; exit 0 when both answer 200, carry
every logprob, and the streamed logprobs equal the non-streamed ones.

    ./build/minivllm serve --model tests/data/tiny-qwen3-mha --device cuda --port 8133 &
    python3 tests/gpu/serve_smoke.py http://127.0.0.1:8133
"""
import json, sys, urllib.request
base = sys.argv[1]
def post(body, stream=False):
    req = urllib.request.Request(base + "/v1/completions", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        data = r.read().decode()
        return r.status, data
body = {"prompt": [431, 173, 170, 322], "max_tokens": 6, "temperature": 0.9, "seed": 5, "n": 2, "logprobs": 3,
        "presence_penalty": 0.5, "frequency_penalty": 0.3, "repetition_penalty": 1.2, "min_p": 0.05, "min_tokens": 3}
st, data = post(body)
d = json.loads(data)
ok = st == 200 and len(d["choices"]) == 2 and all(len(c["logprobs"]["token_logprobs"]) == 6 and len(c["logprobs"]["top_logprobs"][0]) >= 3 for c in d["choices"])
print("non-streamed", st, "ok" if ok else "BAD", [c["logprobs"]["token_logprobs"][:3] for c in d["choices"]])
st2, data2 = post(dict(body, stream=True))
lines = [l for l in data2.splitlines() if l.startswith("data: ")]
chunks = [json.loads(l[6:]) for l in lines if l != "data: [DONE]"]
lps = {}
for c in chunks:
    for ch in c.get("choices", []):
        if ch.get("logprobs"): lps.setdefault(ch["index"], []).extend(ch["logprobs"]["token_logprobs"])
same = all(lps.get(i) == d["choices"][i]["logprobs"]["token_logprobs"] for i in range(2))
print("streamed", st2, lines[-1], "logprobs equal to the non-streamed:", same)
sys.exit(0 if ok and same and lines[-1] == "data: [DONE]" else 1)

#!/usr/bin/env python3
"""tests/serve/openai_client_test.py - `minivllm serve` through the real `openai` Python client.

Run by tests/test_serve.c (make test), or by hand:
    python3 tests/serve/openai_client_test.py --minivllm build/minivllm --qwen $MV_QWEN3_DIR

The model: tests/data/tiny-qwen3-tied (512 ids) with Qwen3's real tokenizer cut down
to its ids below 512 and no added tokens (so ASCII text and the chat template's text
encode inside the tiny vocabulary), as tests/test_engine_cpu.c does for `generate`.
The outputs are nonsense text; what is checked is that they are the engine's:

  - completions and chat, stream and not: greedy token ids equal `minivllm generate`'s
    for the same prompt; the streamed text equals the non-streamed text; usage counts
    (prompt from `minivllm tokenize`, completion = ids returned);
  - prompts as a list of ids and a list of lists (one choice each);
  - errors with OpenAI's status and body: 400 (unknown field, named; not supported yet),
    401 (no key, wrong key), 404 (model, path), 405, 413, 503 (queue full);
  - a client that disconnects mid-stream: its request is aborted and its KV blocks are
    free at once (/metrics before and after);
  - SIGTERM drains: the running stream completes, the server exits 0;
  - stop strings (completions and chat, stream and not, include_stop_str_in_output both
    ways): the text is generate's for the same "stop", cut before the string (after it
    with include), finish_reason "stop", stop_reason the string, completion_tokens the
    fewest tokens whose text holds it; the string spans a token boundary, and the
    streamed chunks add up to the cut text (a chunk that showed part of the string
    would leave it in).
  - n > 1 (completions and chat, stream and not): choice p * n + j of prompt p; with a
    seed s choice j is the single request with seed s + j (vLLM's rule); the streamed
    text of each choice is the non-streamed one; usage counts each prompt once;
  - logprobs (completions' integer, chat's logprobs + top_logprobs, stream and not):
    every value within 1e-5 of log_softmax of `minivllm generate --logits-out`'s raw
    logits for the same prefix (computed here in double), the top ids the likeliest in
    order, token strings as Hugging Face's tokenizer decodes each id alone (vLLM's) and
    chat's bytes the token's raw bytes; the streamed chunks add up to the whole answer;
  - presence / frequency / repetition penalties and min_p: deterministic for a seed,
    they change the output, and equal `generate`'s for the same JSONL line (when
    generate takes the keys; else said so and compared server to server);
  - min_tokens: a prompt whose greedy answer ends in an eos goes on to min_tokens.

Exit 0 when every check passed; 1 with FAIL lines; 77 (skip) without the openai module.
"""
import argparse
import http.client
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

import math
import struct

try:
    import openai
    from tokenizers import Tokenizer
except ImportError:
    print("SKIP: the openai or tokenizers module is not installed (pip install -r tests/requirements.txt)")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tiny_model  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = os.path.join(ROOT, "tests", "data", "tiny-qwen3-tied")
KEY = "test-key-16"
failures = []


def check(cond, what):
    if cond:
        print("ok   " + what)
    else:
        print("FAIL " + what)
        failures.append(what)
    return cond


def make_model_dir(qwen, d):
    tiny_model.make_model_dir(qwen, d, chat_template=True)


class Server:
    def __init__(self, exe, model, *args):
        self.p = subprocess.Popen([exe, "serve", "--model", model, "--device", "cpu", "--port", "0",
                                   "--served-model-name", "tiny", *args],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = self.p.stdout.readline()
        if not line.startswith("serving on http://"):
            raise RuntimeError("serve did not start: %r %s" % (line, self.p.stderr.read()))
        self.host, port = line.strip()[len("serving on http://"):].rsplit(":", 1)
        self.port = int(port)
        self.url = "http://%s:%d/v1" % (self.host, self.port)

    def stop(self, sig=signal.SIGTERM):
        if self.p.poll() is None:
            self.p.send_signal(sig)
        try:
            return self.p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.p.kill()
            return -9

    def raw(self, method, path, body=None, headers=None):
        c = http.client.HTTPConnection(self.host, self.port, timeout=20)
        c.request(method, path, body=body, headers=headers or {})
        r = c.getresponse()
        data = r.read()
        c.close()
        return r.status, data

    def metrics(self):
        status, data = self.raw("GET", "/metrics")
        out = {}
        for line in data.decode().splitlines():
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                out[name] = float(value)
        return out


def generate(exe, model, line, chat=False):
    """`minivllm generate` on one request: its output record."""
    args = [exe, "generate", "--model", model, "--device", "cpu", "--output", "-"]
    if chat:
        args += ["--chat", "--prompt", line["prompt"], "--max-tokens", str(line["max_tokens"]), "--temperature", "0"]
        inp = None
    else:
        args += ["--input", "-"]
        inp = json.dumps(line) + "\n"
    out = subprocess.run(args, input=inp, capture_output=True, text=True, check=True).stdout
    return json.loads(out.splitlines()[0])


def tokenize(exe, model, text):
    out = subprocess.run([exe, "tokenize", "--model", model, "--text", text], capture_output=True, text=True,
                         check=True).stdout
    return json.loads(out)


def expect_status(fn, status, what, param=None):
    try:
        fn()
    except openai.APIStatusError as e:
        ok = e.status_code == status
        body = e.body if isinstance(e.body, dict) else {}
        if param is not None:
            ok = ok and body.get("param") == param
        return check(ok and "message" in body, "%s: %d %s" % (what, e.status_code, json.dumps(body)))
    return check(False, "%s: no error (wanted %d)" % (what, status))


def test_completions(exe, model, srv):
    c = openai.OpenAI(base_url=srv.url, api_key=KEY, max_retries=0)
    prompt = "1+1="
    want = generate(exe, model, {"prompt": prompt, "max_tokens": 12, "temperature": 0, "ignore_eos": True})
    r = c.completions.create(model="tiny", prompt=prompt, max_tokens=12, temperature=0,
                             extra_body={"ignore_eos": True, "return_token_ids": True})
    ch = r.choices[0]
    got = (ch.model_extra or {}).get("token_ids")
    check(got == want["token_ids"], "completions: token ids equal generate's (%s vs %s)" % (got, want["token_ids"]))
    check(ch.text == want["text"], "completions: text equals generate's")
    check(ch.finish_reason == "length", "completions: finish_reason length (%s)" % ch.finish_reason)
    n_prompt = len(tokenize(exe, model, prompt))
    check(r.usage.prompt_tokens == n_prompt and r.usage.completion_tokens == 12 and
          r.usage.total_tokens == n_prompt + 12, "completions: usage %s" % r.usage)
    # Streamed: the same text, one chunk per token, and the usage chunk at the end.
    text, reasons, usage, chunks = "", [], None, 0
    for ev in c.completions.create(model="tiny", prompt=prompt, max_tokens=12, temperature=0, stream=True,
                                   stream_options={"include_usage": True}, extra_body={"ignore_eos": True}):
        chunks += 1
        if ev.usage:
            usage = ev.usage
        for x in ev.choices:
            text += x.text
            if x.finish_reason:
                reasons.append(x.finish_reason)
    check(text == ch.text, "completions stream: text equals the non-streamed text (%r vs %r)" % (text, ch.text))
    check(reasons == ["length"], "completions stream: one finish_reason, length (%s)" % reasons)
    check(usage is not None and usage.completion_tokens == 12 and usage.prompt_tokens == n_prompt,
          "completions stream: include_usage chunk %s" % usage)
    # (How many chunks is the machine's timing: tokens the engine made while the
    # connection's thread was away go out together. test_queue_and_disconnect
    # counts them where each step takes 10 ms.)
    check(chunks >= 2, "completions stream: text and the usage chunk apart (%d chunks)" % chunks)
    # Token-id prompts: a list, and a list of lists (two choices).
    ids_a, ids_b = [431, 173, 170, 322], [40, 63]
    wa = generate(exe, model, {"prompt_token_ids": ids_a, "max_tokens": 6, "temperature": 0})
    wb = generate(exe, model, {"prompt_token_ids": ids_b, "max_tokens": 6, "temperature": 0})
    r = c.completions.create(model="tiny", prompt=ids_a, max_tokens=6, temperature=0,
                             extra_body={"return_token_ids": True})
    check(r.choices[0].model_extra.get("token_ids") == wa["token_ids"], "completions: a token-id prompt")
    r = c.completions.create(model="tiny", prompt=[ids_a, ids_b], max_tokens=6, temperature=0,
                             extra_body={"return_token_ids": True})
    got = sorted(((x.index, x.model_extra.get("token_ids")) for x in r.choices))
    check(got == [(0, wa["token_ids"]), (1, wb["token_ids"])], "completions: two token-id prompts, two choices")
    check(r.usage.prompt_tokens == 6 and r.usage.completion_tokens == len(wa["token_ids"]) + len(wb["token_ids"]),
          "completions: usage adds the choices (%s)" % r.usage)


def test_chat(exe, model, srv):
    c = openai.OpenAI(base_url=srv.url, api_key=KEY, max_retries=0)
    want = generate(exe, model, {"prompt": "hi", "max_tokens": 8}, chat=True)
    msgs = [{"role": "user", "content": "hi"}]
    kw = {"chat_template_kwargs": {"enable_thinking": False}, "return_token_ids": True}
    r = c.chat.completions.create(model="tiny", messages=msgs, max_tokens=8, temperature=0, extra_body=kw)
    ch = r.choices[0]
    check(ch.model_extra.get("token_ids") == want["token_ids"],
          "chat: token ids equal generate --chat's (%s vs %s)" % (ch.model_extra.get("token_ids"), want["token_ids"]))
    check(ch.message.role == "assistant" and ch.message.content == want["text"], "chat: the message is generate's text")
    check(r.usage.completion_tokens == len(want["token_ids"]), "chat: usage.completion_tokens %s" % r.usage)
    text, roles = "", 0
    for ev in c.chat.completions.create(model="tiny", messages=msgs, max_tokens=8, temperature=0, stream=True,
                                        extra_body={"chat_template_kwargs": {"enable_thinking": False}}):
        for x in ev.choices:
            roles += x.delta.role == "assistant"
            text += x.delta.content or ""
    check(text == ch.message.content and roles == 1, "chat stream: one role chunk, the same text (%r)" % text)
    # enable_thinking changes the prompt (an empty <think></think> block when false).
    r2 = c.chat.completions.create(model="tiny", messages=msgs, max_tokens=8, temperature=0,
                                   extra_body={"chat_template_kwargs": {"enable_thinking": True}})
    check(r2.usage.prompt_tokens < r.usage.prompt_tokens, "chat: enable_thinking=false adds the empty think block")


def detokenize(exe, model, ids):
    if not ids:
        return ""
    out = subprocess.run([exe, "detokenize", "--model", model, "--ids", ",".join(map(str, ids)), "--skip-special",
                          "--json"], capture_output=True, text=True, check=True).stdout
    return json.loads(out)


def pick_stop(exe, model, ids, text):
    """A 3-character printable ASCII piece of text that first occurs at p and that the
    token completing it did not begin: (stop, p, m = tokens up to the one completing it)."""
    prefixes = [detokenize(exe, model, ids[:k]) for k in range(len(ids) + 1)]
    for p in range(1, len(text) - 2):  # p > 0: something before the stop is kept
        s = text[p:p + 3]
        if not all("!" <= ch <= "~" for ch in s) or text.find(s) != p:
            continue
        m = next(k for k in range(len(ids) + 1) if s in prefixes[k])
        if p < len(prefixes[m - 1]) < p + 3:
            return s, p, m
    return None


def test_stop(exe, model, srv):
    c = openai.OpenAI(base_url=srv.url, api_key=KEY, max_retries=0)
    prompt, base = "1+1=", {"ignore_eos": True, "return_token_ids": True}
    r = c.completions.create(model="tiny", prompt=prompt, max_tokens=30, temperature=0, extra_body=base)
    ids, text = r.choices[0].model_extra["token_ids"], r.choices[0].text
    got = pick_stop(exe, model, ids, text)
    if not check(got is not None, "stop: a stop string spanning a token boundary in %r" % text):
        return
    stop, p, m = got
    for include in (False, True):
        want_text = text[:p + 3] if include else text[:p]
        gen = generate(exe, model, {"prompt": prompt, "max_tokens": 30, "temperature": 0, "ignore_eos": True,
                                    "stop": ["never-in-it", stop], "include_stop_str_in_output": include})
        what = "stop %r (include %s)" % (stop, include)
        check(gen["text"] == want_text and gen["stop_reason"] == stop, "%s: generate's text is cut" % what)
        kw = dict(base, include_stop_str_in_output=include)
        r = c.completions.create(model="tiny", prompt=prompt, max_tokens=30, temperature=0,
                                 stop=["never-in-it", stop], extra_body=kw)
        ch = r.choices[0]
        check(ch.text == want_text == gen["text"], "%s: completions text %r, want %r" % (what, ch.text, want_text))
        check(ch.finish_reason == "stop" and ch.model_extra.get("stop_reason") == stop,
              "%s: finish_reason stop, stop_reason the string (%s %s)" % (what, ch.finish_reason,
                                                                        ch.model_extra.get("stop_reason")))
        check(r.usage.completion_tokens == m and ch.model_extra["token_ids"] == ids[:m],
              "%s: no token past the stop (%d tokens, want %d)" % (what, r.usage.completion_tokens, m))
        chunks, reasons, usage = [], [], None
        for ev in c.completions.create(model="tiny", prompt=prompt, max_tokens=30, temperature=0, stop=stop,
                                       stream=True, stream_options={"include_usage": True},
                                       extra_body={"ignore_eos": True, "include_stop_str_in_output": include}):
            usage = ev.usage or usage
            for x in ev.choices:
                chunks.append(x.text)
                if x.finish_reason:
                    reasons.append((x.finish_reason, x.model_extra.get("stop_reason")))
        check("".join(chunks) == want_text, "%s: the streamed chunks add up to the cut text (%r)" % (what, chunks))
        check(reasons == [("stop", stop)] and usage is not None and usage.completion_tokens == m,
              "%s: stream ends with stop, %s, %s" % (what, reasons, usage))
    # Chat, stream and not: the same as generate's for the same messages and stop.
    msgs = [{"role": "user", "content": "hi"}]
    kw = {"chat_template_kwargs": {"enable_thinking": False}, "ignore_eos": True, "return_token_ids": True}
    r = c.chat.completions.create(model="tiny", messages=msgs, max_tokens=30, temperature=0, extra_body=kw)
    cids, ctext = r.choices[0].model_extra["token_ids"], r.choices[0].message.content
    got = pick_stop(exe, model, cids, ctext)
    if not check(got is not None, "chat stop: a stop string spanning a token boundary in %r" % ctext):
        return
    stop, p, m = got
    gen = generate(exe, model, {"messages": msgs, "enable_thinking": False, "max_tokens": 30, "temperature": 0,
                                "ignore_eos": True, "stop": stop})
    r = c.chat.completions.create(model="tiny", messages=msgs, max_tokens=30, temperature=0, stop=[stop],
                                  extra_body=kw)
    ch = r.choices[0]
    check(ch.message.content == ctext[:p] == gen["text"] and ch.finish_reason == "stop" and
          r.usage.completion_tokens == m, "chat stop %r: content %r, %d tokens" % (stop, ch.message.content,
                                                                                 r.usage.completion_tokens))
    text = ""
    for ev in c.chat.completions.create(model="tiny", messages=msgs, max_tokens=30, temperature=0, stop=[stop],
                                        stream=True, extra_body={"chat_template_kwargs": {"enable_thinking": False},
                                                                 "ignore_eos": True}):
        for x in ev.choices:
            text += x.delta.content or ""
    check(text == ctext[:p], "chat stream stop %r: the chunks add up to the cut content (%r)" % (stop, text))


def test_errors(exe, model, srv):
    c = openai.OpenAI(base_url=srv.url, api_key=KEY, max_retries=0)
    expect_status(lambda: openai.OpenAI(base_url=srv.url, api_key="wrong", max_retries=0).completions.create(
        model="tiny", prompt="a"), 401, "401 with a wrong key")
    st, _ = srv.raw("POST", "/v1/completions", body=b'{"prompt": "a"}', headers={"Content-Type": "application/json"})
    check(st == 401, "401 without Authorization (%d)" % st)
    expect_status(lambda: c.completions.create(model="other", prompt="a"), 404, "404 for another model", "model")
    expect_status(lambda: c.completions.create(model="tiny", prompt="a", extra_body={"foo": 1}), 400,
                  "400 names an unknown field", "foo")
    expect_status(lambda: c.completions.create(model="tiny", prompt="a", temperature=-1), 400,
                  "400 names an out-of-range field", "temperature")
    expect_status(lambda: c.completions.create(model="tiny", prompt="a", n=2, temperature=0), 400,
                  "400 for n > 1 with greedy sampling (vLLM's rule)", "n")
    expect_status(lambda: c.completions.create(model="tiny", prompt="a", n=0), 400, "400 for n = 0", "n")
    expect_status(lambda: c.completions.create(model="tiny", prompt="a", n=129), 400, "400 for n = 129", "n")
    expect_status(lambda: c.completions.create(model="tiny", prompt="a", n=2, best_of=3), 400,
                  "400 for best_of other than n", "best_of")
    for k, v in (("presence_penalty", 2.5), ("frequency_penalty", -3), ("repetition_penalty", 0), ("min_p", 1.5),
                 ("min_tokens", -1), ("logprobs", 21), ("logprobs", True)):
        expect_status(lambda: c.completions.create(model="tiny", prompt="a", extra_body={k: v}), 400,
                      "400 for %s = %r" % (k, v), k)
    expect_status(lambda: c.completions.create(model="tiny", prompt="a", max_tokens=4, extra_body={"min_tokens": 5}),
                  400, "400 for min_tokens > max_tokens", "min_tokens")
    msgs = [{"role": "user", "content": "hi"}]
    expect_status(lambda: c.chat.completions.create(model="tiny", messages=msgs, top_logprobs=2), 400,
                  "400 for top_logprobs without logprobs", "top_logprobs")
    expect_status(lambda: c.chat.completions.create(model="tiny", messages=msgs, logprobs=True, top_logprobs=21), 400,
                  "400 for top_logprobs = 21", "top_logprobs")
    expect_status(lambda: c.completions.create(model="tiny", prompt="a", extra_body={"prompt_logprobs": 1}), 400,
                  "400 not supported yet: prompt_logprobs", "prompt_logprobs")
    expect_status(lambda: c.completions.create(model="tiny", prompt="a", stop=["a", "b", "c", "d", "e"]), 400,
                  "400 for more than 4 stop strings", "stop")
    expect_status(lambda: c.completions.create(model="tiny", prompt="a", stop=[""]), 400,
                  "400 for an empty stop string", "stop")
    expect_status(lambda: c.completions.create(model="tiny", prompt="a" * 5000), 413, "413 for a body over the limit")
    expect_status(lambda: c.completions.create(model="tiny", prompt=[1] * 600), 400,
                  "400 for a prompt longer than max_model_len", "prompt")
    auth = {"Authorization": "Bearer " + KEY}
    st, body = srv.raw("GET", "/v1/nowhere", headers=auth)
    check(st == 404 and "error" in json.loads(body), "404 for an unknown path")
    st, body = srv.raw("GET", "/v1/completions", headers=auth)
    check(st == 405 and "error" in json.loads(body), "405 for GET /v1/completions")
    st, body = srv.raw("GET", "/v1/models", headers=auth)
    check(st == 200 and json.loads(body)["data"][0]["id"] == "tiny", "GET /v1/models")
    st, _ = srv.raw("GET", "/health")
    check(st == 200, "GET /health without a key")


def open_stream(srv, max_tokens, key=None):
    """A raw streaming request: the connection, its response (headers read)."""
    c = http.client.HTTPConnection(srv.host, srv.port, timeout=20)
    body = json.dumps({"model": "tiny", "prompt": [40, 63], "max_tokens": max_tokens, "temperature": 0,
                       "ignore_eos": True, "stream": True})
    c.request("POST", "/v1/completions", body=body, headers={"Content-Type": "application/json"})
    return c, c.getresponse()


def wait_metrics(srv, cond, seconds):
    end = time.time() + seconds
    m = srv.metrics()
    while not cond(m) and time.time() < end:
        time.sleep(0.02)
        m = srv.metrics()
    return m


def test_queue_and_disconnect(exe, model):
    # One row, one waiting place, 10 ms per step: a 300-token request runs for 3 s.
    srv = Server(exe, model, "--max-num-seqs", "1", "--max-queued-requests", "1", "--step-delay-ms", "10")
    try:
        c1, r1 = open_stream(srv, 300)
        check(r1.status == 200 and r1.readline().startswith(b"data: "), "queue: the first stream runs")
        m = wait_metrics(srv, lambda m: m["minivllm:num_requests_running"] == 1, 5)
        used = m["minivllm:kv_cache_blocks_used"]
        check(used > 0, "disconnect: the running stream holds KV blocks (%g)" % used)
        c2, r2 = open_stream(srv, 5)  # waits behind the first
        wait_metrics(srv, lambda m: m["minivllm:num_requests_waiting"] == 1, 5)
        st, body = srv.raw("POST", "/v1/completions", body=json.dumps({"prompt": [40], "max_tokens": 2}))
        err = json.loads(body).get("error", {})
        check(st == 503 and err.get("code") == "queue_full", "503 when the queue is full (%d %s)" % (st, body[:120]))
        # The first client goes away mid-stream: its request is aborted, its blocks freed at once.
        aborted0 = srv.metrics()['minivllm:request_success_total{finished_reason="abort"}']
        t0 = time.time()
        r1.close()
        c1.close()
        m = wait_metrics(srv, lambda m: m['minivllm:request_success_total{finished_reason="abort"}'] > aborted0, 2)
        check(m['minivllm:request_success_total{finished_reason="abort"}'] == aborted0 + 1,
              "disconnect: the request is aborted (%.2f s after the close)" % (time.time() - t0))
        # The waiting one now runs to its end (5 tokens), then nothing is held.
        text = r2.read().decode()
        check(text.rstrip().endswith("data: [DONE]") and text.count('"finish_reason":"length"') == 1,
              "queue: the waiting stream ran once the first was gone")
        c2.close()
        m = wait_metrics(srv, lambda m: m["minivllm:kv_cache_blocks_used"] == 0, 2)
        check(m["minivllm:kv_cache_blocks_used"] == 0 and m["minivllm:num_requests_running"] == 0,
              "disconnect: every KV block free again (%g used)" % m["minivllm:kv_cache_blocks_used"])
        check(m["minivllm:generation_tokens_total"] < 300, "disconnect: the aborted request did not run to its end")
        # SIGTERM while a stream runs: it completes, then the server exits 0.
        c3, r3 = open_stream(srv, 40)
        r3.readline()
        srv.p.send_signal(signal.SIGTERM)
        text = r3.read().decode()
        check(text.count('"finish_reason":"length"') == 1 and text.rstrip().endswith("data: [DONE]"),
              "drain: the running stream completes after SIGTERM (%d more events)" % text.count("data: "))
        # One step each 10 ms: the tokens arrive as they are made, not together at the end.
        check(text.count("data: ") >= 20, "stream: 39 tokens at 10 ms a step arrive in %d events (at least 20)" %
              text.count("data: "))
        rc = srv.p.wait(timeout=20)
        check(rc == 0, "drain: the server exits 0 (%d)" % rc)
    finally:
        srv.stop(signal.SIGKILL)


# ---- n, logprobs, penalties, min_tokens ------------------------------------------------------------

# Random sampling that actually varies on the tiny model (its logits are peaked: the
# likeliest token is thousands of times the next at temperature 1).
HOT = {"temperature": 5.0, "top_p": 1.0}
HOT_EXTRA = {"top_k": 0, "ignore_eos": True, "return_token_ids": True}


def ids_of(choice):
    return (choice.model_extra or {}).get("token_ids")


def stream_choices(events):
    """{index: [text, finish_reason, [logprob chunks]]} and the usage of a stream."""
    got, usage = {}, None
    for ev in events:
        usage = ev.usage or usage
        for x in ev.choices:
            g = got.setdefault(x.index, ["", None, []])
            g[0] += x.text if hasattr(x, "text") else (x.delta.content or "")
            g[1] = x.finish_reason or g[1]
            if x.logprobs is not None:
                g[2].append(x.logprobs)
    return got, usage


def test_n(exe, model, srv):
    c = openai.OpenAI(base_url=srv.url, api_key=KEY, max_retries=0)
    prompt, n_prompt = "1+1=", len(tokenize(exe, model, "1+1="))
    kw = dict(model="tiny", prompt=prompt, max_tokens=8, seed=11, **HOT)
    r = c.completions.create(n=3, extra_body=HOT_EXTRA, **kw)
    check(sorted(x.index for x in r.choices) == [0, 1, 2], "n=3: choices 0, 1, 2")
    by = {x.index: x for x in r.choices}
    for j in range(3):
        one = c.completions.create(n=1, extra_body=HOT_EXTRA, **dict(kw, seed=11 + j))
        check(ids_of(one.choices[0]) == ids_of(by[j]), "n=3 seed 11: choice %d is the request with seed %d" % (j, 11 + j))
    check(len({tuple(ids_of(x)) for x in r.choices}) > 1, "n=3: the choices differ (%s)" % [ids_of(x) for x in r.choices])
    check(r.usage.prompt_tokens == n_prompt and r.usage.completion_tokens == 24,
          "n=3: usage counts the prompt once, every choice's tokens (%s)" % r.usage)
    got, usage = stream_choices(c.completions.create(n=3, stream=True, stream_options={"include_usage": True},
                                                     extra_body={"top_k": 0, "ignore_eos": True}, **kw))
    check(sorted(got) == [0, 1, 2] and all(got[j][0] == by[j].text and got[j][1] == "length" for j in range(3)),
          "n=3 stream: each choice's text is the non-streamed one")
    check(usage is not None and usage.prompt_tokens == n_prompt and usage.completion_tokens == 24,
          "n=3 stream: the usage chunk (%s)" % usage)
    # Two prompts, n = 2: choice p * 2 + j.
    ids_a, ids_b = [431, 173, 170, 322], [40, 63]
    r = c.completions.create(model="tiny", prompt=[ids_a, ids_b], n=2, max_tokens=6, seed=5, extra_body=HOT_EXTRA,
                             **HOT)
    by = {x.index: x for x in r.choices}
    want = {}
    for p, ids in enumerate((ids_a, ids_b)):
        for j in range(2):
            one = c.completions.create(model="tiny", prompt=ids, max_tokens=6, seed=5 + j, extra_body=HOT_EXTRA, **HOT)
            want[p * 2 + j] = ids_of(one.choices[0])
    check(sorted(by) == [0, 1, 2, 3] and all(ids_of(by[i]) == want[i] for i in range(4)),
          "two prompts, n=2: choice p*2+j is prompt p with seed 5+j")
    check(r.usage.prompt_tokens == 6 and r.usage.completion_tokens == 24, "two prompts, n=2: usage %s" % r.usage)
    # Without a seed every choice draws on its own.
    r = c.completions.create(model="tiny", prompt=prompt, n=4, max_tokens=8, extra_body=HOT_EXTRA, **HOT)
    check(len({tuple(ids_of(x)) for x in r.choices}) > 1, "n=4 without seed: the choices differ")
    # Chat, stream and not.
    msgs = [{"role": "user", "content": "hi"}]
    ckw = dict(model="tiny", messages=msgs, max_tokens=8, seed=21, **HOT)
    cx = {"chat_template_kwargs": {"enable_thinking": False}, "top_k": 0, "ignore_eos": True}
    r = c.chat.completions.create(n=2, extra_body=dict(cx, return_token_ids=True), **ckw)
    by = {x.index: x for x in r.choices}
    one = c.chat.completions.create(n=1, extra_body=dict(cx, return_token_ids=True), **dict(ckw, seed=22))
    check(sorted(by) == [0, 1] and ids_of(by[1]) == ids_of(one.choices[0]), "chat n=2: choice 1 is seed 22's")
    got, _ = stream_choices(c.chat.completions.create(n=2, stream=True, extra_body=cx, **ckw))
    check(sorted(got) == [0, 1] and all(got[j][0] == by[j].message.content for j in range(2)),
          "chat n=2 stream: each choice's content is the non-streamed one")


def read_npy_f32(path):
    """A float32 C-order .npy as a list of rows (no numpy needed)."""
    with open(path, "rb") as f:
        data = f.read()
    assert data[:6] == b"\x93NUMPY"
    hlen = struct.unpack("<H", data[8:10])[0]
    header = data[10:10 + hlen].decode()
    shape = tuple(int(x) for x in header.split("(")[1].split(")")[0].split(",") if x.strip())
    vals = struct.unpack("<%df" % (shape[0] * shape[1]), data[10 + hlen:])
    return [vals[i * shape[1]:(i + 1) * shape[1]] for i in range(shape[0])]


def log_softmax(row):
    top = max(row)
    lse = top + math.log(math.fsum(math.exp(x - top) for x in row))
    return [x - lse for x in row]


def ref_logprobs(exe, model, prompt_ids, out_ids):
    """log_softmax of the CPU reference's raw logits for each generated position k: the
    first-step logits of prompt + out_ids[:k] (`minivllm generate --logits-out`)."""
    with tempfile.TemporaryDirectory(prefix="mv-lp-") as d:
        inp, npy = os.path.join(d, "in.jsonl"), os.path.join(d, "logits.npy")
        with open(inp, "w") as f:
            for k in range(len(out_ids)):
                f.write(json.dumps({"prompt_token_ids": prompt_ids + out_ids[:k], "max_tokens": 1,
                                    "temperature": 0}) + "\n")
        subprocess.run([exe, "generate", "--model", model, "--device", "cpu", "--input", inp, "--output", os.devnull,
                        "--logits-out", npy], check=True, capture_output=True)
        return [log_softmax(r) for r in read_npy_f32(npy)]


def top_ids(lsm, k):
    return sorted(range(len(lsm)), key=lambda i: (-lsm[i], i))[:k]


def byte_decoder():
    """GPT-2's byte-level alphabet, reversed: a token's characters -> its raw bytes."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1)) + \
        list(range(ord("\xae"), ord("\xff") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


TOL = 1e-5  # the server's float32 log-probability (normaliser summed in double) vs double here


def close(a, b):
    return abs(a - b) <= TOL


def check_completion_logprobs(what, lp, ids, ref, hf, k_top):
    ok = len(lp.tokens) == len(ids) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset)
    off = 0
    for k, t in enumerate(ids if ok else []):
        # vLLM's dict: by id, the sampled one first; then by string, two ids of one
        # string one key, at the first's place with the last's value.
        by_id = {t: ref[k][t]}
        for i in top_ids(ref[k], k_top):
            by_id[i] = ref[k][i]
        want = {}
        for i, v in by_id.items():
            want[hf.decode([i], skip_special_tokens=False)] = v
        got = lp.top_logprobs[k]
        ok = ok and lp.tokens[k] == hf.decode([t], skip_special_tokens=False) and close(lp.token_logprobs[k], ref[k][t])
        ok = ok and list(got)[0] == lp.tokens[k] and set(got) == set(want) and all(close(got[s], want[s]) for s in got)
        ok = ok and lp.text_offset[k] == off
        off += len(lp.tokens[k])
    return check(ok, "%s: tokens, token_logprobs, top_logprobs (%d), text_offset match the reference" % (what, k_top))


def check_chat_logprobs(what, content, ids, ref, hf, k_top):
    dec = byte_decoder()
    ok = len(content) == len(ids)
    for k, t in enumerate(ids if ok else []):
        e = content[k]
        ok = ok and e.token == hf.decode([t], skip_special_tokens=False) and close(e.logprob, ref[k][t])
        ok = ok and e.bytes == [dec[ch] for ch in hf.id_to_token(t)]
        tops = top_ids(ref[k], k_top)
        ok = ok and len(e.top_logprobs) == k_top
        for x, i in zip(e.top_logprobs if ok else [], tops):
            ok = ok and x.token == hf.decode([i], skip_special_tokens=False) and close(x.logprob, ref[k][i]) and \
                x.bytes == [dec[ch] for ch in hf.id_to_token(i)]
    return check(ok, "%s: token, logprob, bytes, top_logprobs (%d) match the reference" % (what, k_top))


def test_logprobs(exe, model, srv):
    c = openai.OpenAI(base_url=srv.url, api_key=KEY, max_retries=0)
    hf = Tokenizer.from_file(os.path.join(model, "tokenizer.json"))
    # Completions, greedy and sampled (logprobs are of the raw logits, whatever the temperature).
    for what, kw in (("greedy", {"temperature": 0}), ("sampled", dict(HOT, seed=4))):
        r = c.completions.create(model="tiny", prompt="1+1=", max_tokens=6, logprobs=5,
                                 extra_body={"top_k": 0, "ignore_eos": True, "return_token_ids": True}, **kw)
        ch = r.choices[0]
        ids, prompt_ids = ids_of(ch), ch.model_extra["prompt_token_ids"]
        ref = ref_logprobs(exe, model, prompt_ids, ids)
        if what == "greedy":
            check(all(t == top_ids(ref[k], 1)[0] for k, t in enumerate(ids)), "logprobs greedy: each token the argmax")
        check_completion_logprobs("completions logprobs %s" % what, ch.logprobs, ids, ref, hf, 5)
        got, _ = stream_choices(c.completions.create(model="tiny", prompt="1+1=", max_tokens=6, logprobs=5, stream=True,
                                                     extra_body={"top_k": 0, "ignore_eos": True}, **kw))
        parts = got.get(0, ["", None, []])[2]
        joined = [sum((getattr(p, f) for p in parts), []) for f in ("tokens", "token_logprobs", "top_logprobs",
                                                                     "text_offset")]
        check(joined == [ch.logprobs.tokens, ch.logprobs.token_logprobs, ch.logprobs.top_logprobs,
                         ch.logprobs.text_offset], "completions logprobs %s stream: the chunks add up to it" % what)
    r = c.completions.create(model="tiny", prompt="1+1=", max_tokens=3, logprobs=0, temperature=0,
                             extra_body={"return_token_ids": True})
    lp = r.choices[0].logprobs
    check(all(len(d) == 1 and list(d)[0] == t for d, t in zip(lp.top_logprobs, lp.tokens)),
          "completions logprobs=0: the sampled token alone in top_logprobs")
    # Chat.
    msgs = [{"role": "user", "content": "hi"}]
    cx = {"chat_template_kwargs": {"enable_thinking": False}, "ignore_eos": True}
    r = c.chat.completions.create(model="tiny", messages=msgs, max_tokens=6, temperature=0, logprobs=True,
                                  top_logprobs=3, extra_body=dict(cx, return_token_ids=True))
    ch = r.choices[0]
    ids, prompt_ids = ids_of(ch), ch.model_extra["prompt_token_ids"]
    ref = ref_logprobs(exe, model, prompt_ids, ids)
    check_chat_logprobs("chat logprobs", ch.logprobs.content, ids, ref, hf, 3)
    got, _ = stream_choices(c.chat.completions.create(model="tiny", messages=msgs, max_tokens=6, temperature=0,
                                                      logprobs=True, top_logprobs=3, stream=True, extra_body=cx))
    streamed = [e for p in got.get(0, ["", None, []])[2] for e in p.content]
    check([e.model_dump() for e in streamed] == [e.model_dump() for e in ch.logprobs.content],
          "chat logprobs stream: the chunks add up to it")
    r = c.chat.completions.create(model="tiny", messages=msgs, max_tokens=2, temperature=0, logprobs=True,
                                  extra_body=cx)
    check(all(e.top_logprobs == [] for e in r.choices[0].logprobs.content), "chat logprobs without top_logprobs: []")
    r = c.chat.completions.create(model="tiny", messages=msgs, max_tokens=2, temperature=0, extra_body=cx)
    check(r.choices[0].logprobs is None, "chat without logprobs: null")


def generate_lines(exe, model, lines):
    """generate's records for JSONL lines, or None when it refuses a key (told)."""
    p = subprocess.run([exe, "generate", "--model", model, "--device", "cpu", "--input", "-", "--output", "-",
                        "--ordered"], input="".join(json.dumps(x) + "\n" for x in lines), capture_output=True,
                       text=True)
    if p.returncode != 0:
        print("note generate refused the lines (%s): compared server to server" % p.stderr.strip()[-200:])
        return None
    return [json.loads(x) for x in p.stdout.splitlines()]


def test_penalties(exe, model, srv):
    c = openai.OpenAI(base_url=srv.url, api_key=KEY, max_retries=0)
    base = {"prompt": "1+1=", "max_tokens": 16, "seed": 3, "temperature": 2.0, "top_p": 1.0, "top_k": 0,
            "ignore_eos": True}
    # (option, the request it must differ from). The tiny model's answers rarely repeat a
    # token, so a penalty that discourages repeats shows on top of one that causes them.
    rep = {"repetition_penalty": 0.5, "temperature": 0}
    opts = [({"presence_penalty": -2.0}, {}), ({"frequency_penalty": -2.0}, {}), ({"repetition_penalty": 0.5}, {}),
            (rep, {"temperature": 0}), (dict(rep, frequency_penalty=2.0), rep), ({"frequency_penalty": -2.0, "presence_penalty": 2.0}, {"frequency_penalty": -2.0}),
            ({"min_p": 0.5, "temperature": 5.0}, {"temperature": 5.0})]

    def run(extra):
        body = dict(base, **extra)
        std = {k: body.pop(k) for k in ("prompt", "max_tokens", "seed", "temperature", "top_p", "presence_penalty",
                                          "frequency_penalty") if k in body}
        r = c.completions.create(model="tiny", extra_body=dict(body, return_token_ids=True), **std)
        return ids_of(r.choices[0])

    gen = generate_lines(exe, model, [dict(base, **o) for o, _ in opts])
    for i, (o, other) in enumerate(opts):
        a, b, ref = run(o), run(o), run(other)
        check(a == b, "%s: deterministic with a seed" % o)
        check(a != ref, "%s: changes the output of %s (%s vs %s)" % (o, other, a, ref))
        if gen is not None:
            check(gen[i]["token_ids"] == a, "%s: the server's tokens are generate's" % o)


def test_min_tokens(exe, model, srv):
    c = openai.OpenAI(base_url=srv.url, api_key=KEY, max_retries=0)
    # A prompt whose greedy answer ends in an eos soon: look among one-token prompts.
    prompts = [[x] for x in range(4, 132)]
    r = c.completions.create(model="tiny", prompt=prompts, max_tokens=24, temperature=0,
                             extra_body={"return_token_ids": True})
    ends = sorted((len(ids_of(x)), x.index) for x in r.choices
                  if x.finish_reason == "stop" and x.model_extra.get("stop_reason") is None)
    if not check(bool(ends), "min_tokens: a prompt whose greedy answer ends in an eos"):
        return
    n, i = ends[0]
    ids = ids_of(r.choices[[x.index for x in r.choices].index(i)])
    m = n + 4
    r = c.completions.create(model="tiny", prompt=prompts[i], max_tokens=24, temperature=0,
                             extra_body={"return_token_ids": True, "min_tokens": m})
    got = ids_of(r.choices[0])
    check(len(got) >= m and got[:n - 1] == ids[:n - 1] and ids[n - 1] not in got[:m],
          "min_tokens %d: the eos-ending answer (%d tokens) goes on (%d tokens: %s)" % (m, n, len(got), got))
    gen = generate_lines(exe, model, [{"prompt_token_ids": prompts[i], "max_tokens": 24, "temperature": 0,
                                       "min_tokens": m}])
    if gen is not None:
        check(gen[0]["token_ids"] == got, "min_tokens: generate's tokens")
    # With a stop string: none is looked for before min_tokens, in the stream too.
    text = c.completions.create(model="tiny", prompt="1+1=", max_tokens=30, temperature=0,
                                extra_body={"ignore_eos": True}).choices[0].text
    stop = text[1:3]
    kw = dict(model="tiny", prompt="1+1=", max_tokens=30, temperature=0, stop=[stop])
    r = c.completions.create(extra_body={"ignore_eos": True, "min_tokens": 8}, **kw)
    got, _ = stream_choices(c.completions.create(stream=True, extra_body={"ignore_eos": True, "min_tokens": 8}, **kw))
    check(r.usage.completion_tokens >= 8 and got[0][0] == r.choices[0].text,
          "min_tokens 8 with stop %r: %d tokens, the stream's text the same (%r)" % (stop, r.usage.completion_tokens,
                                                                                    r.choices[0].text))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--minivllm", required=True)
    ap.add_argument("--qwen", required=True, help="the real Qwen3 tokenizer's directory (MV_QWEN3_DIR)")
    a = ap.parse_args()
    exe = os.path.abspath(a.minivllm)
    with tempfile.TemporaryDirectory(prefix="mv-serve-") as d:
        make_model_dir(a.qwen, d)
        srv = Server(exe, d, "--api-key", KEY, "--max-body-bytes", "4096")
        try:
            test_completions(exe, d, srv)
            test_chat(exe, d, srv)
            test_stop(exe, d, srv)
            test_errors(exe, d, srv)
            test_n(exe, d, srv)
            test_logprobs(exe, d, srv)
            test_penalties(exe, d, srv)
            test_min_tokens(exe, d, srv)
        finally:
            rc = srv.stop()
        check(rc == 0, "SIGTERM on an idle server: exit 0 (%d)" % rc)
        test_queue_and_disconnect(exe, d)
    # The failures again, last: a runner that keeps only the output's tail still shows them.
    for what in failures:
        print("FAIL " + what)
    print("openai client test: %d failure%s" % (len(failures), "" if len(failures) == 1 else "s"))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

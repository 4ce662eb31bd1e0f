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

try:
    import openai
except ImportError:
    print("SKIP: the openai module is not installed (pip install -r tests/requirements.txt)")
    sys.exit(77)

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
    """The tiny weights beside the real tokenizer cut to 512 ids (test_engine_cpu.c's write_cut_tokenizer)."""
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
    with open(os.path.join(qwen, "tokenizer_config.json"), encoding="utf-8") as f:
        template = json.load(f)["chat_template"]
    with open(os.path.join(d, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump({"eos_token": None, "chat_template": template}, f)


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
    check(chunks >= 6, "completions stream: tokens arrive in several chunks (%d)" % chunks)
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
    expect_status(lambda: c.completions.create(model="tiny", prompt="a", n=2), 400, "400 not supported yet: n", "n")
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
        rc = srv.p.wait(timeout=20)
        check(rc == 0, "drain: the server exits 0 (%d)" % rc)
    finally:
        srv.stop(signal.SIGKILL)


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
        finally:
            rc = srv.stop()
        check(rc == 0, "SIGTERM on an idle server: exit 0 (%d)" % rc)
        test_queue_and_disconnect(exe, d)
    print("openai client test: %d failure%s" % (len(failures), "" if len(failures) == 1 else "s"))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""tests/serve/bench_serve.py - a serving benchmark for `minivllm serve`, measured as `vllm bench serve` measures.

`minivllm bench` times the engine alone: every request handed to it at once, no sockets. This
script times the server: it sends the same workload to `POST /v1/completions` as streaming HTTP
requests, arriving one after another at a given rate (a Poisson process) or all at once, and
times each request from the client's side, as a user of the server sees it.

    # Qwen3-0.6B's config.json and tokenizer.json, random weights (no weights file needed);
    # tests/gpu/serve_bench.sh runs exactly this on the GPU machine, beside minivllm bench.
    M=models/Qwen3-0.6B
    ./build/minivllm serve --model $M --random-weights --device cuda --port 8000 &
    for r in 4 16 64 inf; do
        python3 tests/serve/bench_serve.py --model-dir $M --ready-check-timeout-sec 600 \\
            --request-rate $r --json out/09-serve.rate-$r.json
    done
    kill %1   # SIGTERM: the server drains and exits 0
    # The engine alone on the same workload (256 requests, lengths 100..1024, seed 0): its
    # output_tok_s against the server's output_throughput at inf.
    ./build/minivllm bench --model $M --random-weights --device cuda --json out/bench.json

    # a small run against a server on another port, 32 requests of 64..128 tokens, 8 at a time:
    python3 tests/serve/bench_serve.py --base-url http://127.0.0.1:8001 --model-dir DIR \\
        --num-prompts 32 --input-len-range 64:128 --output-len-range 64:128 --max-concurrency 8

The model directory needs tokenizer.json for the timings between tokens to mean anything: a
server without a tokenizer has no text to stream, so each request gets a single chunk (at its
end) and TTFT = E2E latency, ITL empty; the script says so when it sees it (see "chunks" below).

The workload (the default): `minivllm bench`'s drawn requests (chapters/09-engine/cli/cmd_bench.c),
id for id, so the two can be compared. Request i's prompt and output lengths are draws 2i and
2i+1 of rng_int(lo, hi) from rng_seed(seed), splitmix64 as common/rng.c has it; its prompt ids
come from a second stream, rng_seed(seed + 1), request after request, uniform over config.json's
vocab_size with eos, bos and tokenizer.json's special ids left out (drawn again); greedy
(temperature 0), "seed": seed + i, and "ignore_eos": true, so every request generates exactly its
length and two runs time the same work. `minivllm bench --num-seqs N --min-len A --max-len B
--seed S` is `--num-prompts N --input-len-range A:B --output-len-range A:B --seed S`; its defaults
(256 requests, 100..1024, seed 0) are these; `--prompt-len P` is `--input-len-range P`.
--input FILE.jsonl sends the lines of a `minivllm bench --input` file instead
(tests/bench/nanovllm_workload.py writes nano-vllm's own workload so).

Arrivals: --request-rate R sends request i at the sum of i gaps drawn from an exponential with
mean 1/R s (a Poisson process, seeded from --seed: rng_seed(seed + 2)); the first at 0. inf (the
default) sends them all at once: full load, what `minivllm bench` times. --max-concurrency N
holds a request back until fewer than N are in flight; its TTFT counts from when it is sent.
The client: each request on a thread of its own, reading its stream with http.client; the
requests dealt round-robin to --workers processes (default one per 32 requests, at most 8 and
half the CPUs), since one Python process reading hundreds of streams at once would delay the
timestamps of each behind the others' parsing (measured: about 55 us of client CPU per chunk,
one stream at a time on a 2-core VM; at 25,000 tok/s that is more than one core).
--ready-check-timeout-sec S waits up to S s for the server to answer /v1/models (vLLM's option),
so the benchmark can be started beside a server still loading.
Before the timed run, one untimed warm-up request (request 0, prompt cut to 32 ids, 16 tokens,
as `minivllm bench` warms up; --no-warmup skips it) checks that the server answers.

What is measured, as vllm bench serve (vllm/benchmarks/serve.py) defines it, every time taken
by the client with time.perf_counter() (CLOCK_MONOTONIC: one clock for all its processes):
  duration        from sending the first request until the last one ends
  TTFT            time to first token: request sent -> its first chunk with a choice in it
  ITL             inter-token latency: every gap between two successive such chunks of a
                  request, all requests' gaps pooled
  E2E latency     request sent -> its last such chunk
  TPOT            time per output token after the first, per request: (E2E - TTFT) /
                  (output tokens - 1), over requests with more than one token
  tokens          from each stream's usage chunk (stream_options.include_usage)
  throughputs     completed requests, output tokens, input + output tokens, each / duration
Each latency has its mean, median, p99 (numpy's linear interpolation) and std (population),
in ms, over the completed requests. A metric with no sample (TPOT of one-token requests, ITL of
single-chunk streams) is null in the JSON (vLLM writes 0).
chunks: this server sends a chunk when a token adds text that is settled (not a piece of a
UTF-8 character or of a stop string), with the end, and several tokens in one chunk when the
client reads slower than the engine writes; vLLM's server sends one per token. ITL is therefore
per chunk, as vLLM's bench measures it; "chunks_per_output_token" in the JSON says how close
chunks are to tokens (1.0: one each). TPOT is per token either way.

A request fails when the HTTP status is not 200, the stream carries an error, it ends before
`data: [DONE]`, it has no usage chunk or no chunk with a choice, it times out (--timeout s
without a byte), its usage.prompt_tokens is not its prompt's length, or (ignore_eos) it has fewer
or more tokens than max_tokens. Failures are counted, the first one's error is printed, and they
are left out of every latency and token figure (as vLLM does), never silently.

--json PATH: every figure above, the failed requests' errors, the parameters, the server's model
id and max_model_len, the command line, the date, the commit and the GPU (nvidia-smi, when the
client runs beside the server); with --save-detailed also each request's input and output
lengths, start, TTFT, ITLs, E2E and error (a few MB for the default workload). Written whole
(PATH.tmp-PID, then renamed), its directory checked before anything is sent.

Exit status: 0 (some requests may have failed: see "Failed requests"); 1 the server cannot be
reached, the warm-up failed, or every request failed; 2 bad arguments; 130 interrupted.
Python 3 standard library only (the GPU machine has no package registry).
Tested by tests/serve/bench_serve_test.py (make test, through tests/test_serve.c).
"""
import argparse
import datetime
import http.client
import json
import math
import multiprocessing
import os
import platform
import queue as queue_mod
import subprocess
import sys
import threading
import time
import urllib.parse

MASK64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15


class Rng:
    """common/rng.c's splitmix64, draw for draw (rng_seed, rng_u64, rng_double, rng_int)."""

    def __init__(self, seed):
        self.state = (seed ^ GOLDEN) & MASK64

    def u64(self):
        self.state = (self.state + GOLDEN) & MASK64
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
        return z ^ (z >> 31)

    def double(self):  # uniform in [0, 1)
        return (self.u64() >> 11) * 2.0 ** -53

    def int(self, lo, hi):  # uniform in [lo, hi], both included
        return lo + self.u64() % (hi - lo + 1)


class Request:
    """One request of the workload: what is sent, and what must come back."""

    def __init__(self, prompt, max_tokens, sampling, ignore_eos):
        self.prompt = prompt          # [prompt_len] token ids
        self.max_tokens = max_tokens
        self.sampling = sampling      # {"temperature": ..., "seed": ..., ...} as sent
        self.ignore_eos = ignore_eos  # then exactly max_tokens must come back


class Result:
    """One request as the client saw it: times in seconds from time.perf_counter()."""

    def __init__(self):
        self.ok = False
        self.error = ""
        self.start = 0.0          # when it was sent
        self.ttft = None          # start -> first chunk with a choice
        self.latency = None       # start -> last chunk with a choice (vLLM's E2E latency)
        self.end = 0.0            # when the stream ended ([DONE] or the failure)
        self.itl = []             # gaps between successive chunks with a choice
        self.chunks = 0           # chunks with a choice
        self.prompt_tokens = 0    # usage
        self.output_tokens = 0    # usage


# ---- options ------------------------------------------------------------------------------------


def die(status, msg):
    print("bench_serve: " + msg, file=sys.stderr)
    sys.exit(status)


def parse_range(s, name):
    """'A:B' (or 'A,B') -> (A, B); 'N' -> (N, N); 1 <= A <= B."""
    parts = s.replace(",", ":").split(":")
    try:
        lo, hi = (int(parts[0]), int(parts[-1])) if len(parts) in (1, 2) else (0, -1)
    except ValueError:
        lo, hi = 0, -1
    if not 1 <= lo <= hi:
        die(2, "%s '%s' is not a length N or a range A:B with 1 <= A <= B" % (name, s))
    return lo, hi


def parse_args(argv):
    p = argparse.ArgumentParser(
        prog="bench_serve.py",
        description="Time `minivllm serve` as `vllm bench serve` does: minivllm bench's workload as streaming "
                    "/v1/completions requests, at a Poisson request rate or all at once.",
        epilog="Read the top of tests/serve/bench_serve.py for what each figure means.")
    p.add_argument("--base-url", default="http://127.0.0.1:8000", help="the server (default %(default)s)")
    p.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY"),
                   help="sent as 'Authorization: Bearer KEY' (default: $OPENAI_API_KEY, else none)")
    p.add_argument("--model", help="the model name sent in each request (default: /v1/models' first id)")
    p.add_argument("--model-dir", help="the directory the server serves: config.json's vocab_size, eos and bos, "
                                       "tokenizer.json's special ids, to draw prompts as minivllm bench does "
                                       "(default: /v1/models' root, when it is a directory here)")
    p.add_argument("--input", help="send the requests of a minivllm bench --input JSONL file instead of drawn ones")
    p.add_argument("--num-prompts", type=int, default=256, help="requests (default %(default)s)")
    p.add_argument("--input-len-range", default="100:1024", help="prompt lengths A:B, or N (default %(default)s)")
    p.add_argument("--output-len-range", default="100:1024", help="output lengths A:B, or N (default %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="lengths, prompt ids, arrivals, request seeds (default 0)")
    p.add_argument("--temperature", type=float, default=0.0, help="every drawn request's (default 0: greedy)")
    p.add_argument("--request-rate", default="inf", help="requests per second, Poisson arrivals; inf = all at once "
                                                        "(default inf)")
    p.add_argument("--max-concurrency", type=int, help="at most N requests in flight (default: no limit)")
    p.add_argument("--workers", type=int, help="client processes the requests are dealt to (default: one per 32 "
                                                "requests, at most 8 and half the CPUs)")
    p.add_argument("--timeout", type=float, default=600.0,
                   help="seconds a request may wait for its next byte before it fails (default %(default)s)")
    p.add_argument("--no-warmup", action="store_true", help="no untimed warm-up request first")
    p.add_argument("--ready-check-timeout-sec", type=float, default=0.0,
                   help="wait up to S s for the server to answer (default 0: ask once)")
    p.add_argument("--json", help="write every figure and the parameters to PATH")
    p.add_argument("--save-detailed", action="store_true",
                   help="--json also holds each request's lengths, start, TTFT, ITLs, E2E and error (vLLM's flag)")
    a = p.parse_args(argv)
    a.in_range = parse_range(a.input_len_range, "--input-len-range")
    a.out_range = parse_range(a.output_len_range, "--output-len-range")
    try:
        a.rate = float(a.request_rate)
    except ValueError:
        a.rate = -1.0
    if not a.rate > 0:  # also catches nan
        die(2, "--request-rate '%s' is not a number of requests per second > 0, or inf" % a.request_rate)
    if not 1 <= a.num_prompts <= 1 << 20:
        die(2, "--num-prompts %d is not in [1, 1048576]" % a.num_prompts)
    if a.max_concurrency is not None and a.max_concurrency < 1:
        die(2, "--max-concurrency %d must be >= 1" % a.max_concurrency)
    if a.workers is not None and a.workers < 1:
        die(2, "--workers %d must be >= 1" % a.workers)
    if not a.timeout > 0:
        die(2, "--timeout must be > 0 seconds")
    if not (a.temperature >= 0 and math.isfinite(a.temperature)):
        die(2, "--temperature must be a number >= 0")
    if a.seed < 0:
        die(2, "--seed must be >= 0")
    if a.input and (a.num_prompts != 256 or a.input_len_range != "100:1024" or a.output_len_range != "100:1024"):
        die(2, "--input gives the requests: --num-prompts and the length ranges go with drawn requests")
    return a


# ---- the server ---------------------------------------------------------------------------------


class Server:
    """Where to send, and how: one HTTP/1.1 connection per request, as a client of the OpenAI API opens."""

    def __init__(self, base_url, api_key, timeout):
        u = urllib.parse.urlsplit(base_url.rstrip("/"))
        if u.scheme not in ("http", "https") or not u.hostname:
            die(2, "--base-url '%s' is not an http:// or https:// URL" % base_url)
        self.url = base_url.rstrip("/")
        self.https = u.scheme == "https"
        self.host, self.port = u.hostname, u.port or (443 if self.https else 80)
        prefix = u.path[:-3] if u.path.endswith("/v1") else u.path  # accept .../v1 too, as the openai client wants
        self.prefix = prefix.rstrip("/")
        self.timeout = timeout
        self.headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
        if api_key:
            self.headers["Authorization"] = "Bearer " + api_key

    def connect(self):
        cls = http.client.HTTPSConnection if self.https else http.client.HTTPConnection
        return cls(self.host, self.port, timeout=self.timeout)

    def get_json(self, path):
        c = self.connect()
        try:
            c.request("GET", self.prefix + path, headers=self.headers)
            r = c.getresponse()
            body = r.read()
        finally:
            c.close()
        if r.status != 200:
            raise RuntimeError("GET %s: HTTP %d: %s" % (path, r.status, error_message(body)))
        return json.loads(body)


def error_message(body):
    """OpenAI's error body's message, else the body's first bytes."""
    try:
        e = json.loads(body)["error"]
        return "%s (%s)" % (e.get("message"), e.get("code") or e.get("type"))
    except (ValueError, KeyError, TypeError, AttributeError):
        return body[:300].decode("utf-8", "replace").strip() or "(empty body)"


def ask_models(srv, ready_s):
    """/v1/models: the ids served, and the first one's root and max_model_len. Until ready_s
    have passed, a refused connection (a server still loading) is tried again each second."""
    deadline = time.monotonic() + ready_s
    try:
        while True:
            try:
                m = srv.get_json("/v1/models")
                break
            except ConnectionRefusedError:
                now = time.monotonic()
                if now >= deadline:
                    raise
                time.sleep(min(1.0, deadline - now))
        data = m["data"]
        ids = [d["id"] for d in data]
    except (OSError, http.client.HTTPException) as e:
        die(1, "cannot reach the server at %s: %s: %s (is `minivllm serve` running there? --base-url%s)"
            % (srv.url, type(e).__name__, e, ", --ready-check-timeout-sec" if not ready_s else ""))
    except RuntimeError as e:
        die(1, "the server at %s answered %s%s" % (srv.url, e, " (--api-key?)" if "HTTP 401" in str(e) else ""))
    except (ValueError, KeyError, TypeError) as e:
        die(1, "the server at %s: /v1/models is not an OpenAI model list (%s)" % (srv.url, e))
    if not ids:
        die(1, "the server at %s serves no model (/v1/models is empty)" % srv.url)
    return ids, data[0].get("root"), data[0].get("max_model_len")


# ---- the workload -------------------------------------------------------------------------------


def load_json(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def excluded_ids(model_dir, vocab_size):
    """What minivllm bench leaves out of random prompts (cmd_bench.c, is_excluded): the eos ids and
    bos (generation_config.json's, else config.json's, as model_config.c reads them) and the ids
    tokenizer.json marks special."""
    cfg = load_json(os.path.join(model_dir, "config.json"))
    gen_path = os.path.join(model_dir, "generation_config.json")
    gen = load_json(gen_path) if os.path.exists(gen_path) else {}
    eos = gen["eos_token_id"] if "eos_token_id" in gen else cfg.get("eos_token_id")
    bos = gen.get("bos_token_id") if gen.get("bos_token_id") is not None else cfg.get("bos_token_id")
    out = set(eos if isinstance(eos, list) else [] if eos is None else [eos])
    if bos is not None:
        out.add(bos)
    tok_path = os.path.join(model_dir, "tokenizer.json")
    if os.path.exists(tok_path):
        for t in load_json(tok_path).get("added_tokens", []):
            if t.get("special") and 0 <= t["id"] < vocab_size:
                out.add(t["id"])
    return out


def draw_requests(a, model_dir):
    """minivllm bench's drawn workload (cmd_bench.c, draw_requests), id for id."""
    vocab_size = load_json(os.path.join(model_dir, "config.json"))["vocab_size"]
    skip = excluded_ids(model_dir, vocab_size)
    if len(skip) >= vocab_size:
        die(1, "every id of the vocabulary is special or eos: no prompt to draw")
    len_rng, id_rng = Rng(a.seed), Rng(a.seed + 1)
    lens = []
    for _ in range(a.num_prompts):
        lens.append((len_rng.int(*a.in_range), len_rng.int(*a.out_range)))
    reqs = []
    for i, (n_in, n_out) in enumerate(lens):
        ids = []
        while len(ids) < n_in:
            t = id_rng.int(0, vocab_size - 1)
            if t not in skip:
                ids.append(t)
        reqs.append(Request(ids, n_out, {"temperature": a.temperature, "seed": a.seed + i}, True))
    return reqs


def read_input(a):
    """A minivllm bench --input file: "prompt_token_ids" and "max_tokens" on every line; "temperature",
    "top_k", "top_p", "seed", "ignore_eos" optional (absent: greedy, eos ignored, seed --seed + index)."""
    reqs = []
    try:
        with open(a.input, encoding="utf-8") as f:
            for no, line in enumerate(f, 1):
                if not line.strip():
                    continue
                o = json.loads(line)
                ids, m = o.get("prompt_token_ids"), o.get("max_tokens")
                if not isinstance(ids, list) or not ids or not isinstance(m, int) or m < 1:
                    die(2, "%s:%d: needs \"prompt_token_ids\" (a list of ids) and \"max_tokens\" >= 1" % (a.input, no))
                s = {"temperature": o.get("temperature", 0.0), "seed": o.get("seed", a.seed + len(reqs))}
                for k in ("top_k", "top_p"):
                    if k in o:
                        s[k] = o[k]
                reqs.append(Request(ids, m, s, bool(o.get("ignore_eos", True))))
    except (OSError, ValueError) as e:
        die(2, "--input %s: %s" % (a.input, e))
    if not reqs:
        die(2, "--input %s: no requests in it" % a.input)
    return reqs


def arrival_times(n, rate, seed):
    """Seconds after the start at which each request is sent: exponential gaps of mean 1 / rate
    (a Poisson process, vLLM's burstiness 1), the first at 0; all 0 at rate inf."""
    if math.isinf(rate):
        return [0.0] * n
    rng, t, out = Rng(seed + 2), 0.0, []
    for i in range(n):
        out.append(t)
        t += -math.log(1.0 - rng.double()) / rate
    return out


# ---- one request ---------------------------------------------------------------------------------


def body_of(req, model, prompt=None, max_tokens=None):
    b = {"model": model, "prompt": prompt or req.prompt, "max_tokens": max_tokens or req.max_tokens,
         "ignore_eos": req.ignore_eos, "stream": True, "stream_options": {"include_usage": True}}
    b.update(req.sampling)
    return json.dumps(b).encode()


def sse_lines(r):
    """The lines of a response's event stream, each with the time its bytes arrived.
    read1 returns what has come (at most the rest of one HTTP chunk, which http.client
    decodes); the lines it completes arrived together. One read per event, where readline
    would make several: the client's cost per token bounds the rates it can time."""
    clock = time.perf_counter
    pending = b""
    while True:
        data = r.read1(65536)
        if not data:
            return
        now = clock()
        *lines, pending = (pending + data).split(b"\n")
        for line in lines:
            yield line, now


def stream_one(srv, body, res):
    """Send one streaming completion and read its events; fill res (times, usage, error)."""
    clock = time.perf_counter
    last = None
    done = False
    c = srv.connect()
    res.start = clock()
    try:
        c.request("POST", srv.prefix + "/v1/completions", body=body, headers=srv.headers)
        r = c.getresponse()
        if r.status != 200:
            res.error = "HTTP %d: %s" % (r.status, error_message(r.read()))
            return
        # Server-sent events: "data: {json}" lines, a blank line after each; ":" lines are comments.
        for line, now in sse_lines(r):
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                done = True
                break
            o = json.loads(data)
            if "error" in o:
                e = o["error"]
                res.error = "error event: %s" % (e.get("message") if isinstance(e, dict) else e)
                return
            if o.get("choices"):
                # Every chunk with a choice counts as vLLM counts it, its text empty or not.
                if last is None:
                    res.ttft = now - res.start
                else:
                    res.itl.append(now - last)
                last = now
                res.chunks += 1
            u = o.get("usage")
            if u:
                res.prompt_tokens, res.output_tokens = u.get("prompt_tokens", 0), u.get("completion_tokens", 0)
    except (http.client.IncompleteRead, http.client.RemoteDisconnected, ConnectionResetError) as e:
        res.error = "the connection closed mid-answer (%s: %s)" % (type(e).__name__, e)
        return
    except (OSError, http.client.HTTPException, ValueError) as e:  # refused, timed out, bad HTTP, bad JSON
        res.error = "%s: %s" % (type(e).__name__, e or "(no message)")
        return
    finally:
        res.end = clock()
        c.close()
    if last is not None:
        res.latency = last - res.start
    if not done:
        res.error = "the stream ended before data: [DONE]"
    elif last is None:
        res.error = "no chunk with a choice in the stream"
    elif res.output_tokens == 0:
        res.error = "no usage chunk (stream_options.include_usage) or 0 completion_tokens"


def run_one(srv, model, req, res):
    stream_one(srv, body_of(req, model), res)
    if res.error:
        return
    if res.prompt_tokens != len(req.prompt):
        res.error = "usage.prompt_tokens %d, and the prompt has %d ids" % (res.prompt_tokens, len(req.prompt))
    elif req.ignore_eos and res.output_tokens != req.max_tokens:
        res.error = "%d tokens, and ignore_eos asked for max_tokens %d" % (res.output_tokens, req.max_tokens)
    elif res.output_tokens > req.max_tokens:
        res.error = "%d tokens, more than max_tokens %d" % (res.output_tokens, req.max_tokens)
    else:
        res.ok = True


# ---- the run --------------------------------------------------------------------------------------


def warm_up(srv, model, req):
    """Request 0 cut to 32 prompt ids and 16 tokens, untimed (minivllm bench's warm-up)."""
    res = Result()
    stream_one(srv, body_of(req, model, req.prompt[:32], min(16, req.max_tokens)), res)
    if res.error:
        die(1, "the warm-up request failed: %s" % res.error)


def send_share(srv, model, reqs, arrivals, share, t0, slots):
    """Send requests `share` (indices, in arrival order), each at t0 + its arrival time on a
    thread of its own; wait for all of them. Returns [(index, Result)]."""
    results = {i: Result() for i in share}

    def one(i):
        try:
            run_one(srv, model, reqs[i], results[i])
        except Exception as e:  # a bug here must show as a failed request, not a silent thread death
            results[i].error = "client error: %s: %s" % (type(e).__name__, e)
        finally:
            if slots:
                slots.release()

    threads = []
    for i in share:
        wait = t0 + arrivals[i] - time.perf_counter()
        if wait > 0:
            time.sleep(wait)
        if slots:
            slots.acquire()  # in arrival order: the next to go is the oldest waiting
        th = threading.Thread(target=one, args=(i,), daemon=True)
        th.start()
        threads.append(th)
    for th in threads:
        th.join()
    return list(results.items())


def share_main(srv, model, reqs, arrivals, share, t0, slots, queue):
    """A worker process: its share of the requests, its results back through the queue."""
    queue.put(send_share(srv, model, reqs, arrivals, share, t0, slots))


def run(srv, model, reqs, arrivals, max_concurrency, workers):
    """Send every request at its arrival time and wait for all of them. Returns (results,
    duration s, t0). With workers > 1 the requests are dealt round-robin to that many processes
    (forked), each with its own interpreter lock, so reading many streams at once does not queue
    their timestamps behind one another; time.perf_counter is CLOCK_MONOTONIC, one clock for all
    the processes, so their times share t0. Duration: t0 -> the end of the last request."""
    n = len(reqs)
    if workers == 1:
        slots = threading.Semaphore(max_concurrency) if max_concurrency else None
        t0 = time.perf_counter()
        got = send_share(srv, model, reqs, arrivals, list(range(n)), t0, slots)
    else:
        ctx = multiprocessing.get_context("fork")
        slots = ctx.Semaphore(max_concurrency) if max_concurrency else None
        queue = ctx.Queue()
        shares = [list(range(w, n, workers)) for w in range(workers)]
        t0 = time.perf_counter() + 0.05 * workers  # every worker up before the first arrival
        procs = [ctx.Process(target=share_main, args=(srv, model, reqs, arrivals, sh, t0, slots, queue), daemon=True)
                 for sh in shares if sh]
        for p in procs:
            p.start()
        got = []
        for _ in procs:
            while True:
                try:
                    got += queue.get(timeout=1.0)
                    break
                except queue_mod.Empty:
                    if all(not p.is_alive() for p in procs) and queue.empty():
                        break  # a worker died without its results: its requests fail below
        for p in procs:
            p.join(timeout=10)
    results = [Result() for _ in reqs]
    for i, r in got:
        results[i] = r
    for r in results:
        if not r.ok and not r.error:
            r.error = "its worker process ended without a result"
            r.start = r.end = t0
    ends = [r.end for r in results if r.end]
    return results, (max(ends) if ends else time.perf_counter()) - t0, t0


# ---- the figures --------------------------------------------------------------------------------


def percentile(xs_sorted, p):
    """numpy.percentile's default (linear interpolation between order statistics)."""
    pos = (len(xs_sorted) - 1) * p / 100.0
    lo = int(math.floor(pos))
    hi = min(lo + 1, len(xs_sorted) - 1)
    return xs_sorted[lo] + (xs_sorted[hi] - xs_sorted[lo]) * (pos - lo)


def stats_ms(xs):
    """mean, median, std (population, as numpy.std), p99, in ms; None each without a sample."""
    if not xs:
        return {"mean": None, "median": None, "std": None, "p99": None}
    s = sorted(xs)
    mean = sum(s) / len(s)
    std = math.sqrt(sum((x - mean) ** 2 for x in s) / len(s))
    return {"mean": 1e3 * mean, "median": 1e3 * percentile(s, 50), "std": 1e3 * std, "p99": 1e3 * percentile(s, 99)}


def peak_concurrency(results):
    """The most requests in flight at once (vLLM's max_concurrent_requests)."""
    ev = sorted([(r.start, 1) for r in results] + [(r.end, -1) for r in results], key=lambda e: (e[0], e[1]))
    n = peak = 0
    for _, d in ev:
        n += d
        peak = max(peak, n)
    return peak


def metrics(reqs, results, duration):
    good = [r for r in results if r.ok]
    tokens_in = sum(r.prompt_tokens for r in good)
    tokens_out = sum(r.output_tokens for r in good)
    chunks = sum(r.chunks for r in good)
    m = {
        "duration": duration,
        "completed": len(good),
        "failed": len(results) - len(good),
        "total_input_tokens": tokens_in,
        "total_output_tokens": tokens_out,
        "request_throughput": len(good) / duration,
        "output_throughput": tokens_out / duration,
        "total_token_throughput": (tokens_in + tokens_out) / duration,
        "max_concurrent_requests": peak_concurrency(results),
        "total_chunks": chunks,
        "chunks_per_output_token": chunks / tokens_out if tokens_out else None,
    }
    series = {
        "ttft": [r.ttft for r in good],
        "tpot": [(r.latency - r.ttft) / (r.output_tokens - 1) for r in good if r.output_tokens > 1],
        "itl": [g for r in good for g in r.itl],
        "e2el": [r.latency for r in good],
    }
    for name, xs in series.items():
        for k, v in stats_ms(xs).items():
            m["%s_%s_ms" % (k, name)] = v
    return m


def print_table(a, m, model):
    line = "{:<40} {:<10}"

    def num(v, fmt="%.2f"):
        return "n/a" if v is None else fmt % v

    print("{s:{c}^{n}}".format(s=" Serving Benchmark Result ", n=50, c="="))
    print(line.format("Model:", model))
    print(line.format("Request rate (req/s):", a.request_rate))
    print(line.format("Maximum request concurrency:", a.max_concurrency or "none"))
    print(line.format("Successful requests:", m["completed"]))
    print(line.format("Failed requests:", m["failed"]))
    print(line.format("Benchmark duration (s):", num(m["duration"])))
    print(line.format("Total input tokens:", m["total_input_tokens"]))
    print(line.format("Total generated tokens:", m["total_output_tokens"]))
    print(line.format("Request throughput (req/s):", num(m["request_throughput"])))
    print(line.format("Output token throughput (tok/s):", num(m["output_throughput"])))
    print(line.format("Peak concurrent requests:", m["max_concurrent_requests"]))
    print(line.format("Total Token throughput (tok/s):", num(m["total_token_throughput"])))
    for key, title, short in (("ttft", "Time to First Token", "TTFT"),
                              ("tpot", "Time per Output Token (excl. 1st token)", "TPOT"),
                              ("itl", "Inter-token Latency", "ITL"),
                              ("e2el", "End-to-end Latency", "E2EL")):
        print("{s:{c}^{n}}".format(s=title, n=50, c="-"))
        print(line.format("Mean %s (ms):" % short, num(m["mean_%s_ms" % key])))
        print(line.format("Median %s (ms):" % short, num(m["median_%s_ms" % key])))
        print(line.format("P99 %s (ms):" % short, num(m["p99_%s_ms" % key])))
    print(line.format("Streamed chunks per output token:", num(m["chunks_per_output_token"], "%.3f")))
    print("=" * 50)


# ---- the JSON -----------------------------------------------------------------------------------


def commit_id():
    """MV_COMMIT, else git's short HEAD with -dirty when the tree differs (as minivllm bench), else unknown."""
    if os.environ.get("MV_COMMIT"):
        return os.environ["MV_COMMIT"]
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        head = subprocess.run(["git", "-C", here, "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              timeout=10)
        if head.returncode != 0:
            return "unknown"
        dirty = subprocess.run(["git", "-C", here, "diff", "--quiet", "HEAD"], capture_output=True, timeout=30)
        return head.stdout.strip() + ("-dirty" if dirty.returncode == 1 else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def gpu_name():
    """The first GPU's name from nvidia-smi (the client beside the server), else None."""
    try:
        r = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                           text=True, timeout=20)
        names = [x.strip() for x in r.stdout.splitlines() if x.strip()]
        return names[0] if r.returncode == 0 and names else None
    except (OSError, subprocess.SubprocessError):
        return None


def check_json_path(path):
    d = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(d) or not os.access(d, os.W_OK):
        die(2, "--json %s: the directory %s does not exist or is not writable" % (path, d))


def write_json(path, doc):
    """The whole document to PATH.tmp-PID, then renamed: PATH is complete or untouched."""
    tmp = "%s.tmp-%d" % (path, os.getpid())
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(doc, f, indent=1)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        if os.path.exists(tmp):
            os.unlink(tmp)
        die(1, "cannot write --json %s: %s" % (path, e))


def json_doc(a, srv, model, ids, max_model_len, model_dir, reqs, results, m, t0):
    def us(x):  # seconds, to the microsecond
        return None if x is None else round(x, 6)

    doc = {
        "tool": "tests/serve/bench_serve.py",
        "command": " ".join(sys.argv),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "commit": commit_id(),
        "gpu": gpu_name(),
        "host": platform.node(),
        "backend": "minivllm",
        "base_url": srv.url,
        "endpoint": "/v1/completions",
        "model_id": model,
        "server_model_ids": ids,
        "max_model_len": max_model_len,
        "model_dir": model_dir,
        "workload": "input" if a.input else "drawn",
        "input": a.input,
        "num_prompts": len(reqs),
        "input_len_range": None if a.input else list(a.in_range),
        "output_len_range": None if a.input else list(a.out_range),
        "seed": a.seed,
        "temperature": None if a.input else a.temperature,
        "ignore_eos": all(r.ignore_eos for r in reqs),
        "request_rate": "inf" if math.isinf(a.rate) else a.rate,
        "burstiness": 1.0,
        "max_concurrency": a.max_concurrency,
        "timeout": a.timeout,
        "client_processes": a.workers,
        "warmup": not a.no_warmup,
        **m,
        "first_error": next((r.error or "(no error recorded)" for r in results if not r.ok), None),
        "failed_requests": [{"index": i, "error": r.error} for i, r in enumerate(results) if not r.ok],
    }
    if not a.save_detailed:
        return doc
    doc.update({
        # Request by request, in workload order; times in seconds as vLLM writes them.
        "input_lens": [len(q.prompt) for q in reqs],
        "max_tokens": [q.max_tokens for q in reqs],
        "output_lens": [r.output_tokens if r.ok else 0 for r in results],
        "start_times": [us(r.start - t0) for r in results],
        "ttfts": [us(r.ttft) if r.ok else None for r in results],
        "e2els": [us(r.latency) if r.ok else None for r in results],
        "itls": [[us(g) for g in r.itl] if r.ok else [] for r in results],
        "errors": [r.error for r in results],
    })
    return doc


# ---- main -----------------------------------------------------------------------------------------


def main(argv):
    a = parse_args(argv)
    if a.json:
        check_json_path(a.json)
    srv = Server(a.base_url, a.api_key, a.timeout)
    ids, root, max_model_len = ask_models(srv, a.ready_check_timeout_sec)
    model = a.model or ids[0]
    model_dir = None
    if a.input:
        reqs = read_input(a)
    else:
        model_dir = a.model_dir or (root if root and os.path.isfile(os.path.join(root, "config.json")) else None)
        if not model_dir:
            die(2, "--model-dir DIR is needed to draw the prompts (the server's /v1/models root '%s' is not a "
                   "model directory here)" % root)
        try:
            reqs = draw_requests(a, model_dir)
        except (OSError, ValueError, KeyError) as e:
            die(2, "--model-dir %s: %s" % (model_dir, e))
    if max_model_len:
        for i, q in enumerate(reqs):
            if len(q.prompt) + q.max_tokens > max_model_len:
                die(2, "request %d: a prompt of %d tokens plus %d generated needs a max_model_len of %d, and the "
                       "server's is %d (shorten the length ranges, or start the server with a larger --max-model-len)"
                    % (i, len(q.prompt), q.max_tokens, len(q.prompt) + q.max_tokens, max_model_len))
    if a.workers is None:
        a.workers = max(1, min(8, (os.cpu_count() or 2) // 2, math.ceil(len(reqs) / 32)))
    print("bench_serve: %d requests to %s (model %s), request rate %s, max concurrency %s, %d client process%s"
          % (len(reqs), srv.url, model, a.request_rate, a.max_concurrency or "none", a.workers,
             "" if a.workers == 1 else "es"), file=sys.stderr)
    if not a.no_warmup:
        warm_up(srv, model, reqs[0])
    arrivals = arrival_times(len(reqs), a.rate, a.seed)
    try:
        results, duration, t0 = run(srv, model, reqs, arrivals, a.max_concurrency, a.workers)
    except KeyboardInterrupt:
        die(130, "interrupted: nothing reported")
    m = metrics(reqs, results, duration)
    print_table(a, m, model)
    failed = [(i, r.error or "(no error recorded)") for i, r in enumerate(results) if not r.ok]
    if failed:
        print("bench_serve: %d of %d requests FAILED; the first, request %d: %s"
              % (len(failed), len(results), failed[0][0], failed[0][1]), file=sys.stderr)
    if m["chunks_per_output_token"] is not None and m["chunks_per_output_token"] < 0.5:
        print("bench_serve: note: %.2f streamed chunks per output token: TTFT and ITL time chunks, not tokens "
              "(a model directory without tokenizer.json streams no text, only each request's end)"
              % m["chunks_per_output_token"], file=sys.stderr)
    if a.json:
        write_json(a.json, json_doc(a, srv, model, ids, max_model_len, model_dir, reqs, results, m, t0))
    if not m["completed"]:
        die(1, "every request failed")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

#!/usr/bin/env python3
"""tests/serve/bench_serve_test.py - tests/serve/bench_serve.py against a real `minivllm serve`.

Run by tests/test_serve.c (make test), or by hand:
    python3 tests/serve/bench_serve_test.py --minivllm build/minivllm [--qwen $MV_QWEN3_DIR]

The server runs on the loopback address, on a port the system picks (--port 0), on the CPU, with
tests/data/tiny-qwen3-tied: once as it is (no tokenizer: one chunk per request, at its end), and,
with --qwen, once beside Qwen3's real tokenizer cut to the tiny model's 512 ids (as
openai_client_test.py does), so text streams and there are gaps between chunks to time. Each runs a
small drawn workload at a finite request rate (one client process) and at inf (all at once, at
most 4 in flight, two client processes), and the JSON is checked: every request completed, the
tokens are the workload's (prompt lengths, and sum(max_tokens) generated, ignore_eos) and the same
totals `minivllm bench` draws for the same options, each figure is there and consistent with the
others (TTFT <= E2E, throughputs = totals / duration, arrivals no earlier than the Poisson
schedule, concurrency within its bound). Then the failures: no server at the address, a model the
server does not have (the warm-up, then every request), a server with --api-key asked without
it, and a server killed mid-run: each failed request counted, the reason printed, exit 1 when
none completed.

Exit 0 when every check passed; 1 with FAIL lines. About 5 s (10 s under ASan).
"""
import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
TINY = os.path.join(ROOT, "tests", "data", "tiny-qwen3-tied")
BENCH = os.path.join(HERE, "bench_serve.py")
sys.path.insert(0, HERE)
import bench_serve  # noqa: E402  (arrival_times, to check the schedule)
import tiny_model  # noqa: E402

failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)
    return cond


def make_model_dir(qwen, d):
    tiny_model.make_model_dir(qwen, d, chat_template=False)


class Server:
    def __init__(self, exe, model, *args):
        self.p = subprocess.Popen([exe, "serve", "--model", model, "--device", "cpu", "--host", "127.0.0.1",
                                   "--port", "0", "--timeout", "20", *args],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = self.p.stdout.readline()
        if not line.startswith("serving on http://"):
            self.p.kill()
            raise RuntimeError("serve did not start: %r %s" % (line, self.p.stderr.read()))
        self.url = line.strip()[len("serving on "):]

    def stop(self):
        if self.p.poll() is None:
            self.p.terminate()
        try:
            return self.p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.p.kill()
            return -9


def bench(url, *args):
    """Run bench_serve.py; (exit status, stdout + stderr)."""
    r = subprocess.run([sys.executable, BENCH, "--base-url", url, "--timeout", "20", *args], capture_output=True,
                       text=True, timeout=120)
    return r.returncode, r.stdout + r.stderr


def engine_totals(exe, model, n, lo, hi):
    """minivllm bench's prompt and output tokens for the same drawn workload."""
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "bench.json")
        subprocess.run([exe, "bench", "--model", model, "--device", "cpu", "--num-seqs", str(n), "--min-len", str(lo),
                        "--max-len", str(hi), "--repeat", "1", "--no-warmup", "--json", out], capture_output=True,
                       check=True, timeout=120)
        with open(out) as f:
            b = json.load(f)
    return b["prompt_tokens"], b["output_tokens"]


def close(x, y):
    return abs(x - y) <= 1e-6 * max(1.0, abs(y))


def check_run(doc, what, n, rate, seed, max_conc, streams_text, totals):
    """The figures of one run: complete, the workload's tokens, consistent, sane."""
    ok = check(doc["completed"] == n and doc["failed"] == 0 and doc["first_error"] is None,
               "%s: %d of %d completed, %d failed (%s)" % (what, doc["completed"], n, doc["failed"],
                                                            doc["first_error"]))
    if not ok:
        return
    check(doc["total_output_tokens"] == sum(doc["max_tokens"]) and doc["output_lens"] == doc["max_tokens"],
          "%s: %d output tokens = sum of max_tokens (ignore_eos)" % (what, doc["total_output_tokens"]))
    check(doc["total_input_tokens"] == sum(doc["input_lens"]), "%s: input tokens = the prompts' lengths" % what)
    check((doc["total_input_tokens"], doc["total_output_tokens"]) == totals,
          "%s: tokens (%d, %d) = minivllm bench's for the same workload %s"
          % (what, doc["total_input_tokens"], doc["total_output_tokens"], totals))
    keys = ["duration", "request_throughput", "output_throughput", "total_token_throughput", "max_concurrent_requests"]
    for m in ("ttft", "tpot", "itl", "e2el"):
        keys += ["%s_%s_ms" % (s, m) for s in ("mean", "median", "std", "p99")]
    check(all(k in doc for k in keys), "%s: every metric field is there" % what)
    d = doc["duration"]
    check(d > 0 and close(doc["request_throughput"], n / d) and close(doc["output_throughput"],
                                                                      doc["total_output_tokens"] / d)
          and close(doc["total_token_throughput"], (doc["total_input_tokens"] + doc["total_output_tokens"]) / d),
          "%s: throughputs = totals / duration %.3f s" % (what, d))
    ttft, e2e = doc["ttfts"], doc["e2els"]
    check(all(0 < t <= e + 1e-6 and e <= d for t, e in zip(ttft, e2e)),
          "%s: 0 < TTFT <= E2E <= duration, request by request" % what)
    check(doc["mean_ttft_ms"] <= doc["mean_e2el_ms"] + 1e-3 and doc["median_ttft_ms"] <= doc["p99_ttft_ms"] + 1e-3
          and doc["mean_tpot_ms"] is not None and doc["mean_tpot_ms"] >= 0,
          "%s: mean TTFT %.2f <= mean E2E %.2f ms, median TTFT <= p99, mean TPOT %.3f ms"
          % (what, doc["mean_ttft_ms"], doc["mean_e2el_ms"],
             -1 if doc["mean_tpot_ms"] is None else doc["mean_tpot_ms"]))
    sched = bench_serve.arrival_times(n, float(rate), seed)
    starts = doc["start_times"]
    check(all(s >= a - 1e-3 for s, a in zip(starts, sched)),
          "%s: no request sent before its arrival time (rate %s)" % (what, rate))
    if max_conc:
        check(1 <= doc["max_concurrent_requests"] <= max_conc,
              "%s: at most %d in flight (%d)" % (what, max_conc, doc["max_concurrent_requests"]))
    chunks = doc["total_chunks"]
    pooled = sum(len(g) for g in doc["itls"])
    check(pooled == chunks - n, "%s: %d ITL gaps = chunks %d - requests %d" % (what, pooled, chunks, n))
    if streams_text:
        check(doc["chunks_per_output_token"] > 0.5 and doc["mean_itl_ms"] is not None and doc["mean_itl_ms"] > 0,
              "%s: text streams: %.2f chunks per token, mean ITL %.3f ms"
              % (what, doc["chunks_per_output_token"], doc["mean_itl_ms"] or -1))
        # E2E = TTFT + the request's gaps, to the microsecond each was rounded to.
        check(all(abs(t + sum(g) - e) < 1e-4 * (2 + len(g)) for t, g, e in zip(ttft, doc["itls"], e2e)),
              "%s: E2E = TTFT + the sum of the request's ITLs" % what)
    else:
        check(chunks == n and doc["mean_itl_ms"] is None,
              "%s: no tokenizer: one chunk per request, no ITL (null)" % what)


def run_model(exe, model, what, streams_text, tmp):
    n, lo, hi = 12, 8, 40
    totals = engine_totals(exe, model, n, lo, hi)
    # 2 ms a step: the tiny model's steps take microseconds, and tokens made while a
    # connection's thread is away go out in one chunk; a step slower than a chunk's
    # send keeps one chunk a token on any machine, so the chunk counts below are the
    # server's streaming and not the machine's timing.
    srv = Server(exe, model, "--step-delay-ms", "2")
    try:
        for rate, conc, workers in (("25", None, 1), ("inf", 4, 2)):
            out = os.path.join(tmp, "%s-%s.json" % (what, rate))
            args = ["--model-dir", model, "--num-prompts", str(n), "--input-len-range", "%d:%d" % (lo, hi),
                    "--output-len-range", "%d:%d" % (lo, hi), "--seed", "0", "--request-rate", rate,
                    "--workers", str(workers), "--json", out, "--save-detailed"]
            if conc:
                args += ["--max-concurrency", str(conc)]
            st, log = bench(srv.url, *args)
            tag = "%s, rate %s, %d process%s" % (what, rate, workers, "" if workers == 1 else "es")
            if not check(st == 0 and os.path.exists(out), "%s: bench_serve.py exit %d" % (tag, st)):
                print(log)
                continue
            check("Serving Benchmark Result" in log and "Mean TTFT (ms):" in log and "P99 ITL (ms):" in log,
                  "%s: the table is printed" % tag)
            with open(out) as f:
                doc = json.load(f)
            check(doc["model_id"] == model and doc["num_prompts"] == n and doc["request_rate"] == (
                rate if rate == "inf" else float(rate)) and doc["date"] and doc["command"],
                  "%s: the JSON names the model, the parameters and the date" % tag)
            check_run(doc, tag, n, rate, 0, conc, streams_text, totals)
            check(not [x for x in os.listdir(tmp) if ".tmp-" in x], "%s: no temporary file left" % tag)
        # A model name the server does not have: the warm-up fails, exit 1, saying why.
        st, log = bench(srv.url, "--model", "no-such-model", "--num-prompts", "3", "--input-len-range", "8",
                        "--output-len-range", "4", "--model-dir", model)
        check(st == 1 and "warm-up request failed" in log and "HTTP 404" in log,
              "%s: an unknown model: the warm-up fails, exit %d: %s" % (what, st, log.strip().splitlines()[-1]))
        # Without the warm-up every request fails: each counted, the first error printed, exit 1.
        out = os.path.join(tmp, "%s-fail.json" % what)
        st, log = bench(srv.url, "--model", "no-such-model", "--num-prompts", "3", "--input-len-range", "8",
                        "--output-len-range", "4", "--model-dir", model, "--no-warmup", "--json", out)
        doc = json.load(open(out)) if os.path.exists(out) else {}
        check(st == 1 and "every request failed" in log and "3 of 3 requests FAILED" in log
              and doc.get("failed") == 3 and doc.get("completed") == 0 and "HTTP 404" in (doc.get("first_error") or "")
              and [f["index"] for f in doc.get("failed_requests", [])] == [0, 1, 2] and "ttfts" not in doc,
              "%s: every request failing: exit %d, failed %s, first error %r"
              % (what, st, doc.get("failed"), doc.get("first_error")))
    finally:
        check(srv.stop() == 0, "%s: the server drains and exits 0 on SIGTERM" % what)


def test_key_and_kill(exe, tmp):
    """--api-key: refused without it (401, exit 1), served with it. A server killed mid-run: every
    request in flight, and every one after, counted as failed, the first error printed, exit 1."""
    srv = Server(exe, TINY, "--api-key", "k-16")
    try:
        small = ["--model-dir", TINY, "--num-prompts", "2", "--input-len-range", "8", "--output-len-range", "4"]
        st, log = bench(srv.url, *small)
        check(st == 1 and "HTTP 401" in log, "--api-key set, none sent: exit %d: %s" % (st, log.strip()))
        st, log = bench(srv.url, "--api-key", "k-16", *small)
        check(st == 0 and "Successful requests:                     2" in log, "--api-key sent: exit %d" % st)
    finally:
        srv.stop()
    srv = Server(exe, TINY, "--max-num-seqs", "4")
    out = os.path.join(tmp, "killed.json")
    p = subprocess.Popen([sys.executable, BENCH, "--base-url", srv.url, "--timeout", "20", "--model-dir", TINY,
                          "--num-prompts", "16", "--input-len-range", "8", "--output-len-range", "400",
                          "--request-rate", "8", "--no-warmup", "--json", out], stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
    first = p.stdout.readline()  # "bench_serve: 16 requests to ...", printed as the sending starts
    time.sleep(0.5)  # a few requests streaming, most not sent yet
    srv.p.kill()
    srv.p.wait()
    log = first + p.communicate(timeout=120)[0]
    doc = json.load(open(out)) if os.path.exists(out) else {}
    check(p.returncode in (0, 1) and doc.get("failed", 0) >= 8 and doc.get("completed", 0) + doc.get("failed", 0) == 16
          and "requests FAILED" in log and doc.get("first_error"),
          "the server killed mid-run: exit %d, %s completed, %s failed, first error %r"
          % (p.returncode, doc.get("completed"), doc.get("failed"), doc.get("first_error")))
    check(p.returncode == 1 or doc.get("completed", 0) > 0, "exit 1 when none completed (exit %d)" % p.returncode)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--minivllm", required=True)
    p.add_argument("--qwen", default=os.environ.get("MV_QWEN3_DIR"), help="Qwen3 directory with tokenizer.json")
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        run_model(a.minivllm, TINY, "no tokenizer", False, tmp)
        if a.qwen:
            d = os.path.join(tmp, "tiny-tok")
            os.mkdir(d)
            make_model_dir(a.qwen, d)
            run_model(a.minivllm, d, "tokenizer", True, tmp)
        else:
            print("SKIP the streamed-text half: no --qwen / MV_QWEN3_DIR (Qwen3's tokenizer.json)")
        test_key_and_kill(a.minivllm, tmp)
    # Nothing listens on a port just closed: exit 1, naming the address.
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    st, log = bench("http://127.0.0.1:%d" % port, "--model-dir", TINY, "--num-prompts", "2")
    check(st == 1 and "cannot reach the server at http://127.0.0.1:%d" % port in log,
          "no server: exit %d: %s" % (st, log.strip()))
    t = time.monotonic()
    st, log = bench("http://127.0.0.1:%d" % port, "--model-dir", TINY, "--ready-check-timeout-sec", "2")
    waited = time.monotonic() - t
    check(st == 1 and "cannot reach" in log and 1.5 < waited < 10,
          "--ready-check-timeout-sec 2: asked again for %.1f s, then exit %d" % (waited, st))
    st, log = bench("http://127.0.0.1:%d" % port, "--request-rate", "0")
    check(st == 2 and "--request-rate" in log, "--request-rate 0: exit %d (bad argument)" % st)
    if failures:
        print("%d check(s) FAILED" % len(failures))
        return 1
    print("all bench_serve checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())

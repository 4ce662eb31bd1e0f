#!/usr/bin/env python3
"""tests/gpu/hf_peer.py - Hugging Face transformers as the peer for minivllm's benchmarks (Qwen3-0.6B shapes).

What: a Qwen3ForCausalLM built from tests/data/qwen3-0.6b-shape/config.json, bf16 on cuda, seeded random
weights (torch.manual_seed; no checkpoint, no network), attn_implementation="sdpa", timed two ways:
  single  one 512-token prompt of random ids in [0, 10000), 256 new tokens, greedy, eos ignored
          (min_new_tokens = max_new_tokens), static cache. With cache_implementation="static" on cuda,
          transformers 5.x generate() compiles the decode forward itself (get_compiled_call: torch.compile
          of model.__call__, CompileConfig's default mode "reduce-overhead"); "compiled" says whether it
          did (model._compiled_call exists). One warm-up generate (the compilation), then 3 timed runs:
          output tok/s = new tokens / seconds, median, min and max. If that step fails or runs past
          --single-cap, it runs again with disable_compile=True: "compiled": false, "why": ...
  cb      nano-vllm bench.py's workload (tests/bench/nanovllm_workload.py: 256 requests, prompts of
          100..1024 ids, max_tokens 100..1024), greedy, eos ignored, through transformers' continuous
          batching: model.init_continuous_batching(generation_config, workload_hints) -> manager;
          manager.warmup() (CUDA graphs, untimed); manager.start(); manager.add_request(ids,
          max_new_tokens=that request's max_tokens, eos_token_id=-1) for each, all at once; results
          polled with manager.get_result. (generate_batch() takes one max_new_tokens for all requests,
          hence the manager.) Capped at --cb-cap s of generation: past it, manager.stop(hard_stop=True)
          fails the rest, which hands back their partial tokens; "complete": false, output_tokens counts
          finished + partial tokens, seconds run to the stop. If the CB API is missing or yields no
          number: "mode": "static batches of 32": model.generate on left-padded batches of 32 in
          workload order, each to its longest request's max_tokens; output_tokens counts each request's
          own max_tokens only (generated_tokens has all), batches start only while time is left.
Each step runs in its own python process (killed at its cap, its process group with it), so a hang
cannot eat the budget; --total-cap (330 s) cuts every step's cap to what is left.

    HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 timeout 360 python3 tests/gpu/hf_peer.py --json $OUT/09-engine.hf-peer.json
    python3 tests/gpu/hf_peer.py --device cpu --tiny --prompt-len 32 --new-tokens 8 --num-seqs 6 --wl-max-len 150 \
        --json /tmp/p.json   # plumbing check without a GPU (2 layers, ~40 s; nothing compiles on the CPU)
Time: <= 330 s with the defaults (imports ~10 s per step; compile ~40-90 s; cb <= 150 s + warm-up).
Writes the JSON (gpu, versions, command, date, single, cb, steps, errors) even when steps fail; prints
a table last; exits 0 if single or cb produced a number, 1 otherwise. Needs torch and transformers 5.x.
"""
import argparse, contextlib, datetime, json, os, shlex, signal, statistics, subprocess, sys, tempfile, time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SHAPE_DIR = os.path.join(ROOT, "tests", "data", "qwen3-0.6b-shape")


def save(path, res):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(res, f, indent=1)
    os.replace(tmp, path)


# ------------------------------------------------------------------ child side (one step per process)
def build_model(a, res):
    import torch, transformers
    from transformers import AutoConfig, AutoModelForCausalLM
    res.update(torch=torch.__version__, transformers=transformers.__version__,
               gpu=torch.cuda.get_device_name(0) if torch.cuda.is_available() else None)
    cfg = AutoConfig.from_pretrained(SHAPE_DIR)
    if a.tiny:
        cfg.num_hidden_layers = 2
    model, errs = None, []
    for dev_ctx in (a.device, "cpu"):  # build on the device (fast init); else on the CPU and move it
        for kw in ("dtype", "torch_dtype"):  # transformers 5.x: dtype (torch_dtype deprecated); 4.x: torch_dtype
            try:
                torch.manual_seed(a.seed)
                with torch.device(dev_ctx):
                    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa", **{kw: torch.bfloat16})
                res["build"] = f"from_config({kw}=bfloat16) under torch.device({dev_ctx!r})"
                break
            except Exception as e:
                errs.append(f"{dev_ctx}/{kw}: {type(e).__name__}: {e}"[:300])
        if model is not None:
            break
    if model is None:
        raise RuntimeError("model build failed: " + " | ".join(errs))
    model = model.to(device=a.device, dtype=torch.bfloat16).eval()
    res.update(params=sum(p.numel() for p in model.parameters()), dtype=str(next(model.parameters()).dtype),
               attn_loaded=getattr(model.config, "_attn_implementation", None))
    return torch, model


def child_single(a, res, out):
    torch, model = build_model(a, res)
    sync = torch.cuda.synchronize if a.device == "cuda" else (lambda: None)
    g = torch.Generator().manual_seed(a.seed + 1)
    ids = torch.randint(0, 10000, (1, a.prompt_len), generator=g).to(a.device)
    kw = dict(max_new_tokens=a.new_tokens, min_new_tokens=a.new_tokens, do_sample=False,
              cache_implementation="static", pad_token_id=0)
    if a.child == "single-nocompile":
        kw["disable_compile"] = True
    res.update(prompt_len=a.prompt_len, new_tokens=a.new_tokens, generate_kwargs=repr(kw))

    def once():
        sync(); t = time.perf_counter()
        with torch.no_grad():
            o = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), **kw)
        sync()
        return time.perf_counter() - t, int(o.shape[1]) - a.prompt_len

    s, n = once()
    res.update(warmup_s=round(s, 3), compiled=hasattr(model, "_compiled_call") and "disable_compile" not in kw)
    save(out, res)
    secs, toks = zip(*[once() for _ in range(3)])
    tps = [n / s for n, s in zip(toks, secs)]
    res.update(seconds=[round(s, 4) for s in secs], tokens=list(toks), tok_s=[round(x, 2) for x in tps],
               output_tok_s_median=round(statistics.median(tps), 2), output_tok_s_min=round(min(tps), 2),
               output_tok_s_max=round(max(tps), 2))


def child_cb(a, res, out):
    sys.path.insert(0, os.path.join(ROOT, "tests", "bench"))
    from nanovllm_workload import workload
    prompts, max_tokens = workload(a.num_seqs, 100, a.wl_max_len, a.wl_max_len)
    torch, model = build_model(a, res)
    n = len(prompts)
    res.update(requests=n, requested_output_tokens=sum(max_tokens), sampling="greedy (do_sample=False), eos ignored")
    if a.child == "static":
        return static_batches(a, res, out, torch, model, prompts, max_tokens)
    from transformers import GenerationConfig
    gc = GenerationConfig(do_sample=False, max_new_tokens=max(max_tokens), pad_token_id=0)
    gc.eos_token_id = -1  # what init_continuous_batching sets for "no eos"; add_request gets -1 too
    res["mode"] = "continuous batching (init_continuous_batching + add_request per request max_new_tokens)"
    try:
        from transformers.generation.continuous_batching.utils import WorkloadHints
        hints = WorkloadHints(max_prompt_length=max(map(len, prompts)), max_generated_length=max(max_tokens),
                              num_requests=n)
        mgr = model.init_continuous_batching(generation_config=gc, workload_hints=hints)
    except (ImportError, TypeError) as e:
        res["hints_error"] = str(e)[:200]
        mgr = model.init_continuous_batching(generation_config=gc)
    res["attn_implementation"] = getattr(model.config, "_attn_implementation", None)
    t = time.perf_counter()
    if hasattr(mgr, "warmup"):
        with torch.no_grad():
            mgr.warmup()
    res["warmup_s"] = round(time.perf_counter() - t, 2)
    save(out, res)
    deadline = min(time.time() + a.cb_cap, a.child_deadline - 25)
    mgr.start()
    t0, t0_wall = time.perf_counter(), time.time()
    for i, (p, m) in enumerate(zip(prompts, max_tokens)):
        mgr.add_request(input_ids=p, request_id=f"r{i}", max_new_tokens=m, eos_token_id=-1)
    done = {}
    while len(done) < n and time.time() < deadline:
        r = mgr.get_result(timeout=0.5)
        if r is None:
            if not mgr.is_running():
                res["note"] = "generation thread stopped early"
                break
        elif r.is_finished():
            done[r.request_id] = r
    t1 = time.perf_counter()
    ok = [r for r in done.values() if r.error is None]
    fin_tokens = sum(len(r.generated_tokens) for r in ok)
    res.update(requests_run=n, requests_finished=len(ok), output_tokens_finished=fin_tokens,
               length_mismatches=sum(len(r.generated_tokens) != max_tokens[int(r.request_id[1:])] for r in ok))
    errors = [r.error for r in done.values() if r.error is not None]
    complete = len(ok) == n
    partial = 0
    if not complete:
        mgr.stop(block=True, timeout=15, hard_stop=True)  # fails the rest; their outputs carry partial tokens
        while True:
            r = mgr.get_result(timeout=0.5)
            if r is None:
                break
            if r.request_id not in done:
                partial += len(r.generated_tokens)
        t1 = time.perf_counter()
    tok = fin_tokens + partial
    if tok == 0:
        raise RuntimeError(f"no token came back ({len(errors)} request errors: {errors[:1]})")
    if not complete:
        res["incomplete_note"] = ("stopped at the cap: output_tokens = finished requests' tokens + the partial "
                                  "tokens of the requests failed by the hard stop; seconds run to the stop")
    res.update(complete=complete, output_tokens=tok, output_tokens_partial=partial, seconds=round(t1 - t0, 3),
               output_tok_s=round(tok / (t1 - t0), 1), cap_s=round(deadline - t0_wall, 1),
               request_errors=errors[:3])
    if complete:
        mgr.stop(block=True, timeout=15)


def static_batches(a, res, out, torch, model, prompts, max_tokens, bs=32):
    sync = torch.cuda.synchronize if a.device == "cuda" else (lambda: None)
    res["mode"] = f"static batches of {bs}"
    res["how"] = ("model.generate (dynamic cache, no compile) on left-padded batches in workload order, each to its "
                  "longest request's max_tokens; output_tokens = sum of each request's own max_tokens")
    deadline = min(time.time() + a.cb_cap, a.child_deadline - 25)
    t0, run, useful, gen, last = time.perf_counter(), 0, 0, 0, 0.0
    for b in range(0, len(prompts), bs):
        if time.time() + last > deadline:  # the next batch would not finish in time
            break
        tb = time.perf_counter()
        P, M = prompts[b:b + bs], max_tokens[b:b + bs]
        L = max(map(len, P))
        ids = torch.tensor([[0] * (L - len(p)) + p for p in P], device=a.device)
        mask = torch.tensor([[0] * (L - len(p)) + [1] * len(p) for p in P], device=a.device)
        with torch.no_grad():
            model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max(M), min_new_tokens=max(M),
                           do_sample=False, pad_token_id=0)
        sync()
        run, useful, gen, last = run + len(P), useful + sum(M), gen + max(M) * len(P), time.perf_counter() - tb
        s = time.perf_counter() - t0
        res.update(requests_run=run, output_tokens=useful, generated_tokens=gen, seconds=round(s, 3),
                   output_tok_s=round(useful / s, 1), complete=run == len(prompts))
        save(out, res)


def child_main(a):
    res = {"step": a.child}
    try:
        (child_single if a.child.startswith("single") else child_cb)(a, res, a.result)
    except Exception as e:
        import traceback
        res["error"] = f"{type(e).__name__}: {e}"[:500]
        res["traceback"] = traceback.format_exc()[-2000:]
    save(a.result, res)
    sys.stdout.flush(); sys.stderr.flush()
    os._exit(0)  # do not wait on a CB thread or compile workers


# ------------------------------------------------------------------ parent side
def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    for flag, typ, dflt, hlp in (
            ("--json", str, None, "write the results here"), ("--total-cap", float, 330, "seconds for everything"),
            ("--single-cap", float, 150, "seconds for the compiled single step"),
            ("--nocompile-cap", float, 75, "seconds for the uncompiled retry"),
            ("--cb-cap", float, 150, "seconds of CB generation"), ("--device", str, "cuda", "torch device"),
            ("--seed", int, 0, "weight seed (prompt: seed + 1)"), ("--prompt-len", int, 512, "single's prompt"),
            ("--new-tokens", int, 256, "single's new tokens"), ("--num-seqs", int, 256, "workload requests"),
            ("--wl-max-len", int, 1024, "workload max input/output length"),
            ("--skip", str, "", "comma list of single,cb to skip"), ("--child", str, None, argparse.SUPPRESS),
            ("--result", str, None, argparse.SUPPRESS), ("--child-deadline", float, 0, argparse.SUPPRESS)):
        p.add_argument(flag, type=typ, default=dflt, help=hlp if hlp == argparse.SUPPRESS else f"{hlp} ({dflt})")
    p.add_argument("--tiny", action="store_true", help="2 layers (plumbing check)")
    a = p.parse_args()
    if a.child:
        return child_main(a)
    t_start = time.time()
    R = {"what": "transformers peer, Qwen3-0.6B shapes, random bf16 weights", "command": shlex.join(sys.argv),
         "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
         "gpu": None, "torch": None, "transformers": None, "single": None, "cb": None, "steps": [], "errors": []}
    tmpd = tempfile.mkdtemp(prefix="hf_peer.")
    write = lambda: save(a.json, R) if a.json else None
    passthru = ["--device", a.device, "--seed", str(a.seed), "--prompt-len", str(a.prompt_len),
                "--new-tokens", str(a.new_tokens), "--num-seqs", str(a.num_seqs), "--wl-max-len", str(a.wl_max_len),
                "--cb-cap", str(a.cb_cap)] + (["--tiny"] if a.tiny else [])

    def _run_child(step, cap):
        cap = min(cap, t_start + a.total_cap - time.time() - 3)
        if cap < 20:
            R["errors"].append(f"{step}: skipped, {cap:.0f} s left"); return None
        rf, log = os.path.join(tmpd, step + ".json"), os.path.join(tmpd, step + ".log")
        cmd = [sys.executable, os.path.abspath(__file__), "--child", step, "--result", rf,
               "--child-deadline", str(time.time() + cap)] + passthru
        env = dict(os.environ, HF_HUB_OFFLINE=os.environ.get("HF_HUB_OFFLINE", "1"), TOKENIZERS_PARALLELISM="false")
        t, timed_out = time.time(), False
        with open(log, "w") as lf:
            pr = subprocess.Popen(cmd, stdout=lf, stderr=subprocess.STDOUT, cwd=ROOT, env=env, start_new_session=True)
            try:
                rc = pr.wait(timeout=cap)
            except subprocess.TimeoutExpired:
                timed_out = True
                with contextlib.suppress(OSError):  # the child and whatever it started (compile workers)
                    os.killpg(pr.pid, signal.SIGKILL)
                rc = pr.wait()
        res = {"step": step}
        with contextlib.suppress(Exception):
            res = json.load(open(rf))
        tail = open(log, errors="replace").read()[-1500:]
        R["steps"].append({"step": step, "rc": rc, "timed_out": timed_out, "cap_s": round(cap), "wall_s": round(time.time() - t, 1)})
        for k in ("gpu", "torch", "transformers"):
            R[k] = R[k] or res.get(k)
        if timed_out:
            res["error"] = res.get("error") or f"killed at its cap of {cap:.0f} s"
        if res.get("error") or rc != 0:
            R["errors"].append(f"{step}: {res.get('error', 'rc %s' % rc)}")
            res["log_tail"] = tail
        write()
        return res

    def run_child(step, cap):
        try:
            return _run_child(step, cap)
        except Exception as e:  # the parent must always write its JSON
            R["errors"].append(f"{step}: parent: {type(e).__name__}: {e}")
            return None

    write()
    if "single" not in a.skip:
        r = run_child("single", a.single_cap)
        if r is not None and "output_tok_s_median" not in r:
            why = r.get("error", "no number")
            r2 = run_child("single-nocompile", a.nocompile_cap)
            if r2 is not None:
                r2.update(compiled=False, why=f"compiled attempt: {why}",
                          compiled_attempt={k: r.get(k) for k in ("warmup_s", "compiled", "traceback")})
                r = r2
        R["single"] = r
    if "cb" not in a.skip:
        r = run_child("cb", a.cb_cap + 90)
        if r is not None and "output_tok_s" not in r:
            why = r.get("error", "no number")
            r2 = run_child("static", a.cb_cap + 60)
            if r2 is not None:
                r2["why"] = f"continuous batching: {why}"
                r2["cb_attempt"] = {k: r.get(k) for k in ("error", "traceback", "warmup_s", "attn_implementation")}
                r = r2
        R["cb"] = r
    R["total_s"] = round(time.time() - t_start, 1)
    write()
    s, c = R["single"] or {}, R["cb"] or {}
    print(f"hf_peer: {R['gpu']}  torch {R['torch']}  transformers {R['transformers']}  ({R['total_s']} s)")
    print(f"{'step':8} {'output tok/s':>14}  detail")
    print(f"{'single':8} {str(s.get('output_tok_s_median', '-')):>14}  compiled={s.get('compiled')} "
          f"min/max {s.get('output_tok_s_min')}/{s.get('output_tok_s_max')} warm-up {s.get('warmup_s')} s")
    print(f"{'cb':8} {str(c.get('output_tok_s', '-')):>14}  {c.get('mode')}: {c.get('requests_run')} requests, "
          f"{c.get('output_tokens')} tokens in {c.get('seconds')} s, complete={c.get('complete')}")
    for e in R["errors"]:
        print("error:", e[:300])
    return 0 if ("output_tok_s_median" in s or "output_tok_s" in c) else 1


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Best-practice PyTorch baseline for bench-decode: a hand-written Llama in the style of gpt-fast
(pytorch-labs/gpt-fast), no Hugging Face model code in the timed path.

The model (`scripts/gpt_fast_llama.py`): fused q/k/v weight, RMSNorm, rotary embeddings with
Llama-3 frequency scaling, `scaled_dot_product_attention`, a static KV cache of preallocated tensors
written at `input_pos`, SwiGLU, tied embeddings. Grouped-query attention in a decode step folds the
query heads of one KV head into the query length (no copy of the cache); as in gpt-fast, a decode
step attends over the whole static cache with a causal mask (static shapes; the cache holds
`context + steps * (reps + 1)` positions rounded up to 16, so early steps read masked positions
too). A prompt from position 0 attends to its own keys with `is_causal=True` (the flash backend),
after writing them into the cache.

Weights: with transformers importable, those of `LlamaForCausalLM` built under
`torch.manual_seed(seed)` on the device, as `scripts/torch_decode_bench.py` builds it (the same
random bf16 model as the Hugging Face columns); otherwise seeded normal(0, 0.02) weights.

Decode (per batch size): prefill `--context` positions of random prompts (one batched forward,
not timed), then `--reps + 1` runs of `--steps` greedy steps (the first run is a warm-up, the
median ms/step of the others is reported); each step reads the batch's argmax tokens back to the
host. Variants:

- `eager`: one forward per step;
- `cuda_graph`: the decode step (forward, argmax, token feedback, position + 1) captured once in
  a `torch.cuda.CUDAGraph` over static tensors and replayed per step;
- `compile_reduce_overhead`: `torch.compile(step, mode="reduce-overhead", fullgraph=True)`
  (Inductor kernels + CUDA graph trees);
- `compile_max_autotune`: `torch.compile(step, mode="max-autotune", fullgraph=True)`, run in a
  child process per batch size and abandoned after `--autotune-limit` seconds ("skipped: time
  limit").

`torch._dynamo.reset()` runs between batch sizes. Every variant starts from the same prefilled
cache and the same first token; its tokens (all `(reps + 1) * steps` steps) are compared with its
own eager run's (`matches`: equal tokens, total, first differing step).

Time to first token (batch 1, prompts of `--ttft` lengths): prompt ids on the host -> device, one
batched forward (logits of the last position only), argmax, token back on the host; median of
`--reps` after one warm-up; eager and `torch.compile(mode="reduce-overhead")`.

Output JSON (`--json`): {"torch_version", "gpu", "shape", "context", "steps", "reps", "weights",
"decode": {variant: {batch: {"ms", ...} | {"skipped"} | {"error"}}}, "matches": {variant: {batch:
{"equal", "of", "first_diff"}}}, "ttft": {"eager" | "compile": {prompt_len: ms}}, "wall_s"}.

Usage: python3 scripts/torch_static_decode.py --json OUT [--shape 1b|small|tiny] [--batches 1,16,64]
       [--context 128] [--steps 64] [--reps 5] [--variants eager,cuda_graph,...]
       [--autotune-limit 240] [--ttft 128,512,2048] [--device cuda|cpu]
       python3 scripts/torch_static_decode.py --self-test   # CPU checks of the model code
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpt_fast_llama import build, decode_step, prefill_step, self_test, shape_cfg  # noqa: E402

VARIANTS = ("eager", "cuda_graph", "compile_reduce_overhead", "compile_max_autotune")


def sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


def mark_step():
    f = getattr(getattr(torch, "compiler", None), "cudagraph_mark_step_begin", None)
    if f is not None:
        f()


def max_seq_for(a):
    return -(-(a.context + a.steps * (a.reps + 1) + 8) // 16) * 16


def prefilled(model, c, a, batch):
    """Fresh caches for `batch` rows with `a.context` positions filled; the first decode tokens."""
    model.setup_caches(batch, max_seq_for(a))
    g = torch.Generator().manual_seed(batch)
    ids = torch.randint(2, c.vocab, (batch, a.context), generator=g).to(a.device)
    return prefill_step(model, ids, torch.arange(a.context, device=a.device))


def timed_loop(a, step_and_read):
    """`reps + 1` runs of `steps` steps (the first is a warm-up); (median ms/step, tokens [n, B])."""
    times, tokens = [], []
    for r in range(a.reps + 1):
        sync(a.device)
        t = time.perf_counter()
        for _ in range(a.steps):
            tokens.append(step_and_read())
        if r:
            times.append((time.perf_counter() - t) * 1e3 / a.steps)
    return statistics.median(times), torch.cat(tokens, dim=1).T


def run_variant(model, c, a, variant, batch):
    """Times one variant at one batch size; (result dict, tokens [(reps + 1) * steps, B])."""
    tok0 = prefilled(model, c, a, batch)
    res = {}
    if variant == "cuda_graph":
        if a.device != "cuda":
            return {"skipped": "needs CUDA"}, None
        s_tok, s_pos = tok0.clone(), torch.tensor([a.context], device="cuda")
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up (writes position `context`, rewritten below)
            for _ in range(3):
                decode_step(model, s_tok, s_pos)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        t = time.perf_counter()
        with torch.cuda.graph(graph):
            s_tok.copy_(decode_step(model, s_tok, s_pos))
            s_pos.add_(1)
        torch.cuda.synchronize()
        res["capture_ms"] = (time.perf_counter() - t) * 1e3
        s_tok.copy_(tok0)
        s_pos.fill_(a.context)

        def one():
            graph.replay()  # forward, argmax, token feedback, position + 1
            return s_tok.cpu()

        res["ms"], tokens = timed_loop(a, one)
        del graph
        return res, tokens
    step = decode_step
    if variant.startswith("compile_"):
        mode = {"compile_reduce_overhead": "reduce-overhead", "compile_max_autotune": "max-autotune"}[variant]
        step = torch.compile(decode_step, mode=mode, fullgraph=True, dynamic=False)
    tok, pos = tok0.clone(), torch.tensor([a.context], device=a.device)
    compiled = step is not decode_step
    skips0 = cudagraph_skips()
    t = time.perf_counter()
    for _ in range(3 if compiled else 1):  # compile / warm up at position `context`
        if compiled:
            mark_step()
        step(model, tok, pos)
    sync(a.device)
    if compiled:
        res["compile_s"] = time.perf_counter() - t
        if a.device == "cuda":  # > 0: Inductor ran the step without CUDA graphs (see its log)
            res["cudagraph_skips"] = cudagraph_skips() - skips0

    def one():
        if compiled:
            mark_step()
        nxt = step(model, tok, pos)
        host = nxt.cpu()
        tok.copy_(nxt)
        pos.add_(1)
        return host

    res["ms"], tokens = timed_loop(a, one)
    return res, tokens


def cudagraph_skips():
    try:
        from torch._dynamo.utils import counters

        return int(counters["inductor"]["cudagraph_skips"])
    except (ImportError, KeyError, TypeError):
        return 0


def compare(tokens, ref):
    if tokens is None or ref is None:
        return None
    eq = tokens == ref
    bad = (~eq).any(dim=1).nonzero()
    return {"equal": int(eq.sum()), "of": eq.numel(), "first_diff": int(bad[0]) if len(bad) else None}


def child_variant(model, c, a, variant, batch):
    """Runs `variant` at `batch` in a child process (its own weights from the same seed, its own eager
    reference); abandoned after `a.autotune_limit` seconds."""
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "child.json")
        cmd = [sys.executable, os.path.abspath(__file__), "--json", out, "--shape", a.shape, "--batches", str(batch),
               "--context", str(a.context), "--steps", str(a.steps), "--reps", str(a.reps), "--variants",
               "eager," + variant, "--ttft", "", "--device", a.device, "--seed", str(a.seed), "--weights", a.weights,
               "--in-process"]
        p = subprocess.Popen(cmd, start_new_session=True)
        try:
            p.wait(timeout=a.autotune_limit)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, 9)  # the child and its compile workers
            p.wait()
            return {"skipped": f"time limit ({a.autotune_limit:g} s for the child process)"}, None
        if p.returncode != 0:
            return {"error": f"child process exit {p.returncode}"}, None
        with open(out) as f:
            j = json.load(f)
    r = j["decode"][variant][str(batch)]
    r["matches_own_eager"] = j["matches"].get(variant, {}).get(str(batch))
    return r, None


def bench_decode(model, c, a, res):
    dec, matches = res.setdefault("decode", {}), res.setdefault("matches", {})
    for b in a.batch_list:
        torch._dynamo.reset()
        ref = None
        for v in a.variant_list:
            try:
                if v == "compile_max_autotune" and not a.in_process:
                    r, toks = child_variant(model, c, a, v, b)
                    if r.get("matches_own_eager") is not None:
                        matches.setdefault(v, {})[str(b)] = r.pop("matches_own_eager")
                else:
                    with torch.no_grad():
                        r, toks = run_variant(model, c, a, v, b)
                    if v == "eager":
                        ref = toks
                    elif toks is not None:
                        matches.setdefault(v, {})[str(b)] = compare(toks, ref)
            except Exception as e:  # report, keep going with the other variants
                r = {"error": f"{type(e).__name__}: {e}"[:500]}
            finally:
                if v.startswith("compile_"):
                    torch._dynamo.reset()
            dec.setdefault(v, {})[str(b)] = r
            print(f"decode {v} batch {b}: {r} matches {matches.get(v, {}).get(str(b))}", flush=True)


def bench_ttft(model, c, a, res):
    """Time to the first token at batch 1: prompt to the device, one forward, argmax to the host."""
    if not a.ttft_list:
        return
    out = res.setdefault("ttft", {})
    max_seq = -(-(max(a.ttft_list) + 8) // 16) * 16
    for kind in ("eager", "compile"):
        torch._dynamo.reset()
        model.setup_caches(1, max_seq)
        fn = prefill_step
        if kind == "compile":
            fn = torch.compile(prefill_step, mode="reduce-overhead", fullgraph=True, dynamic=False)
        for n in a.ttft_list:
            try:
                g = torch.Generator().manual_seed(n)
                ids_host = torch.randint(2, c.vocab, (1, n), generator=g)
                if a.device == "cuda":
                    ids_host = ids_host.pin_memory()
                pos = torch.arange(n, device=a.device)
                times = []
                with torch.no_grad():
                    for r in range(a.reps + (3 if kind == "compile" else 1)):
                        sync(a.device)
                        t = time.perf_counter()
                        if kind == "compile":
                            mark_step()
                        tok = fn(model, ids_host.to(a.device, non_blocking=True), pos).cpu()
                        ms = (time.perf_counter() - t) * 1e3
                        if r >= (3 if kind == "compile" else 1):
                            times.append(ms)
                out.setdefault(kind, {})[str(n)] = statistics.median(times)
                out.setdefault("first_token", {}).setdefault(kind, {})[str(n)] = tok.flatten().tolist()
            except Exception as e:
                out.setdefault(kind, {})[str(n)] = {"error": f"{type(e).__name__}: {e}"[:500]}
            print(f"ttft {kind} {n}: {out[kind][str(n)]}", flush=True)
    torch._dynamo.reset()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json")
    ap.add_argument("--shape", default="1b", help="1b | small | tiny")
    ap.add_argument("--batches", default="1,16,64")
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--autotune-limit", type=float, default=240.0,
                    help="seconds per batch size for the max-autotune child process")
    ap.add_argument("--ttft", default="128,512,2048", help="prompt lengths for time to first token ('' skips)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--weights", default="auto", help="auto | hf | seeded")
    ap.add_argument("--in-process", action="store_true", help="run max-autotune here (used by the child)")
    ap.add_argument("--self-test", action="store_true")
    a = ap.parse_args()
    if a.self_test:
        self_test()
        return
    if not a.json:
        ap.error("--json is required")
    a.batch_list = [int(x) for x in a.batches.split(",") if x]
    a.variant_list = [v for v in a.variants.split(",") if v]
    unknown = set(a.variant_list) - set(VARIANTS)
    if unknown:
        ap.error(f"unknown variants {sorted(unknown)}; known: {VARIANTS}")
    a.ttft_list = [int(x) for x in a.ttft.split(",") if x]
    t0 = time.perf_counter()
    c = shape_cfg(a.shape)
    dtype = torch.bfloat16
    model, weights = build(c, a.device, dtype, a.seed, weights=a.weights, shape=a.shape)
    res = {"torch_version": torch.__version__,
           "gpu": torch.cuda.get_device_name() if a.device == "cuda" else a.device,
           "shape": a.shape, "context": a.context, "steps": a.steps, "reps": a.reps, "dtype": "bf16",
           "weights": weights, "autotune_limit_s": a.autotune_limit}
    try:
        bench_decode(model, c, a, res)
        bench_ttft(model, c, a, res)
    finally:
        res["wall_s"] = time.perf_counter() - t0
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
    print(f"{'batch':>5} " + " ".join(f"{v:>24}" for v in a.variant_list))
    for b in a.batch_list:
        cells = []
        for v in a.variant_list:
            r = res["decode"].get(v, {}).get(str(b), {})
            cells.append(f"{r['ms']:.3f} ms" if "ms" in r else str(next(iter(r.values()), "-"))[:24])
        print(f"{b:>5} " + " ".join(f"{x:>24}" for x in cells))


if __name__ == "__main__":
    main()

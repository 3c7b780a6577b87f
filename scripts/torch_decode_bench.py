#!/usr/bin/env python3
"""PyTorch baselines for bench-decode: the same Llama model in Hugging Face transformers (random
bf16 weights, Llama-3.2-1B shape by default), decoded with a static KV cache three ways:

- eager: one `model(...)` call per step;
- cudagraph: one decode step captured in a `torch.cuda.CUDAGraph`, replayed per step (cache
  position and input token are static tensors updated in place);
- compile: `torch.compile(model.forward, mode="reduce-overhead", fullgraph=True)`.

Every step reads the greedy tokens back to the host (as the Rust benchmark does), so ms/step is a
served token's latency. Writes JSON: {mode: {batch: {"ms": median ms/step, ...}}}.

Usage: python3 scripts/torch_decode_bench.py --json OUT [--shape 1b|small] [--batches 1,16,64]
       [--context 128] [--steps 64] [--modes eager,cudagraph,compile]
"""
import argparse
import json
import statistics
import sys
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM, StaticCache

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from hf_llama_reference import config  # noqa: E402


def make_cache(cfg, batch, max_len):
    for kwargs in (dict(config=cfg, max_batch_size=batch, max_cache_len=max_len, device="cuda", dtype=torch.bfloat16),
                   dict(config=cfg, max_cache_len=max_len),
                   dict(config=cfg, max_batch_size=batch, max_cache_len=max_len)):
        try:
            return StaticCache(**kwargs)
        except TypeError:
            continue
    raise RuntimeError("no StaticCache signature matched")


def run(model, cfg, mode, batch, context, steps, reps):
    max_len = context + steps * (reps + 2) + 8
    cache = make_cache(cfg, batch, max_len)
    g = torch.Generator(device="cuda").manual_seed(batch)
    ids = torch.randint(2, cfg.vocab_size, (batch, context), device="cuda", generator=g)
    with torch.no_grad():
        out = model(input_ids=ids, past_key_values=cache, cache_position=torch.arange(context, device="cuda"), use_cache=True)
    tok = torch.argmax(out.logits[:, -1], dim=-1, keepdim=True)
    pos = torch.tensor([context], device="cuda", dtype=torch.long)
    fwd = model.forward
    if mode == "compile":
        fwd = torch.compile(model.forward, mode="reduce-overhead", fullgraph=True)

    def step(tok, pos):
        logits = fwd(input_ids=tok, past_key_values=cache, cache_position=pos, position_ids=pos.expand(batch, 1),
                     use_cache=True).logits
        return torch.argmax(logits[:, -1], dim=-1, keepdim=True)

    times = []
    with torch.no_grad():
        if mode == "cudagraph":
            s_tok, s_pos = tok.clone(), pos.clone()
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(3):
                    step(s_tok, s_pos)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            t0 = time.perf_counter()
            with torch.cuda.graph(graph):
                s_next = step(s_tok, s_pos)
            capture_ms = (time.perf_counter() - t0) * 1e3
            for r in range(reps + 1):
                torch.cuda.synchronize()
                t = time.perf_counter()
                for _ in range(steps):
                    graph.replay()
                    s_tok.copy_(s_next)
                    s_pos += 1
                    s_tok.cpu()  # the served tokens reach the host every step
                if r:
                    times.append((time.perf_counter() - t) * 1e3 / steps)
            return {"ms": statistics.median(times), "capture_ms": capture_ms}
        for _ in range(3 if mode == "compile" else 1):  # compile / warm up
            tok = step(tok, pos)
            pos = pos + 1
        for r in range(reps + 1):
            torch.cuda.synchronize()
            t = time.perf_counter()
            for _ in range(steps):
                tok = step(tok, pos)
                pos = pos + 1
                tok.cpu()
            if r:
                times.append((time.perf_counter() - t) * 1e3 / steps)
    return {"ms": statistics.median(times)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", required=True)
    ap.add_argument("--shape", default="1b")
    ap.add_argument("--batches", default="1,16,64")
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--modes", default="eager,cudagraph,compile")
    args = ap.parse_args()
    torch.manual_seed(0)
    cfg = config(args.shape)
    with torch.device("cuda"):
        model = LlamaForCausalLM(cfg).to(torch.bfloat16).eval()
    res = {"torch": torch.__version__, "gpu": torch.cuda.get_device_name(), "shape": args.shape,
           "context": args.context, "steps": args.steps, "reps": args.reps}
    for mode in args.modes.split(","):
        res[mode] = {}
        for b in [int(x) for x in args.batches.split(",")]:
            try:
                res[mode][str(b)] = run(model, cfg, mode, b, args.context, args.steps, args.reps)
            except Exception as e:  # report, keep going with the other modes
                res[mode][str(b)] = {"error": f"{type(e).__name__}: {e}"[:500]}
            print(mode, b, res[mode][str(b)], flush=True)
    with open(args.json, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()

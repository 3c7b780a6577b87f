#!/usr/bin/env python3
"""Reference outputs for the Rust Llama decoder, from Hugging Face transformers (no download).

Builds `LlamaForCausalLM` from a config with a fixed seed (the `small` shape of
`models::llama::LlamaConfig::small()`, or Llama-3.2-1B's), saves it with `save_pretrained`
(`config.json` + `model.safetensors`, bf16, Hugging Face's tensor names), and for three fixed
prompts (random token ids of lengths 1, 7 and 20, drawn with seed `--seed + 1`):

- greedy-generates `--steps` tokens with the f32 model (the weights are the bf16 ones, widened);
- runs the whole sequence (prompt + generated, less its last token) teacher-forced through the
  f32 model and the bf16 model, and stores both logits;
- records the f32 top-2 margin at each position and the bf16 run's largest |logit - f32 logit|
  (the error PyTorch's own bf16 run shows).

Outputs, all in `--out DIR`:

- `config.json`, `model.safetensors` (and `generation_config.json` where the transformers
  version writes one): the model, as `save_pretrained` writes it; `LlamaModel::from_hf_dir(&stream, DIR, opts)` loads it.
- `tokenizer.json`, `tokenizer_config.json`: a byte-level BPE tokenizer with the model's exact
  vocabulary size and a Llama 3 style chat template, written by `scripts/make_test_tokenizer.py`'s
  `write(out, vocab)` (ids 0..4 are the special tokens: 0 `<|begin_of_text|>` = bos, 1
  `<|end_of_text|>` = the config's eos; for the 1B shape the trained vocabulary is filled up to
  128256 with added `<|filler_N|>` tokens, so every id has text). With these the folder is a complete
  model directory for `llama-serve --model DIR`.

With `--no-logits` only the model folder above (config, weights, tokenizer) is written and the
reference prompts are not run (fast: no f32 copy, no forward passes); the outputs below are then
absent.
- `logits.safetensors`: for prompt `i` (0, 1, 2), tensors `p{i}.f32` and `p{i}.bf16`, both f32
  of shape `[T][vocab]` with `T = len(prompt) + steps - 1`; row `t` is the logits after feeding
  `tokens[0..=t]`, i.e. the prediction of `tokens[t + 1]` (`.f32`: the f32 model, `.bf16`: the
  bf16 model, widened).
- `reference.json`, one object:
  - `shape`: `"small"` or `"1b"`; `steps`: `--steps`; `torch`: PyTorch's version;
  - `prompts`: a list, one object per prompt, in the order of `p{i}`:
    - `prompt`: the prompt's token ids;
    - `tokens`: prompt + generated token ids (length `len(prompt) + steps`);
    - `generated`: the `steps` greedy tokens of the f32 model;
    - `margins`: `T` floats, the f32 top-1 minus top-2 logit at each row of the logits (a small
      margin means a bf16 implementation may legitimately pick the other token there);
    - `bf16_max_abs_err`: the largest |bf16 logit - f32 logit| over the prompt's rows.

`tests/tests/gpu_llama.rs` runs this script (or reads the directories named by `LLAMA_REF_DIR` and `LLAMA_REF_DIR_1B`) and compares the
Rust decoder's tokens and logits with these files.

Usage: python3 scripts/hf_llama_reference.py --out DIR [--shape small|1b] [--steps 16] [--seed 0] [--no-logits]
"""
import argparse
import json
import os
import sys

import torch
from safetensors.torch import save_file
from transformers import LlamaConfig, LlamaForCausalLM

ROPE = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192, "rope_theta": 500000.0}


def config(shape):
    common = dict(rms_norm_eps=1e-5, rope_theta=500000.0, rope_scaling=dict(ROPE), max_position_embeddings=131072,
                  attention_bias=False, mlp_bias=False, hidden_act="silu", bos_token_id=0, eos_token_id=1,
                  initializer_range=0.02)
    if shape == "small":
        return LlamaConfig(vocab_size=2048, hidden_size=256, num_hidden_layers=4, num_attention_heads=8,
                           num_key_value_heads=2, head_dim=32, intermediate_size=768, tie_word_embeddings=False,
                           **common)
    if shape == "1b":
        return LlamaConfig(vocab_size=128256, hidden_size=2048, num_hidden_layers=16, num_attention_heads=32,
                           num_key_value_heads=8, head_dim=64, intermediate_size=8192, tie_word_embeddings=True,
                           **common)
    raise SystemExit(f"unknown shape {shape}")


def write_tokenizer(out, vocab):
    """Writes `tokenizer.json` + `tokenizer_config.json` for `vocab` ids next to the weights."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import make_test_tokenizer

    tok = make_test_tokenizer.write(out, vocab)
    assert tok.get_vocab_size() == vocab, (tok.get_vocab_size(), vocab)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--shape", default="small")
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-logits", action="store_true",
                    help="write only the model folder (config, weights, tokenizer); skip the reference prompts")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(args.seed)
    cfg = config(args.shape)
    with torch.device(dev):
        model = LlamaForCausalLM(cfg)
    model = model.to(torch.bfloat16).eval()
    model.save_pretrained(args.out, safe_serialization=True)
    write_tokenizer(args.out, cfg.vocab_size)
    if args.no_logits:
        print("wrote", args.out, "(model folder only: --no-logits)")
        return
    m16 = model
    m32 = LlamaForCausalLM(cfg).to(dev)
    m32.load_state_dict({k: v.float() for k, v in model.state_dict().items()})
    m32 = m32.float().eval()
    for m in (m16, m32):
        m.config._attn_implementation = "eager"

    g = torch.Generator().manual_seed(args.seed + 1)
    prompts = [torch.randint(2, cfg.vocab_size, (n,), generator=g).tolist() for n in (1, 7, 20)]
    out = {"shape": args.shape, "steps": args.steps, "prompts": [], "torch": torch.__version__}
    tensors = {}
    with torch.no_grad():
        for i, prompt in enumerate(prompts):
            seq = list(prompt)
            for _ in range(args.steps):
                logits = m32(torch.tensor([seq], device=dev)).logits[0, -1]
                seq.append(int(torch.argmax(logits)))
            ids = torch.tensor([seq[:-1]], device=dev)  # positions whose logits predict seq[1:]
            l32 = m32(ids).logits[0].float()
            l16 = m16(ids).logits[0].float()
            top2 = torch.topk(l32, 2, dim=-1).values
            margins = (top2[:, 0] - top2[:, 1]).tolist()
            err = float((l16 - l32).abs().max())
            tensors[f"p{i}.f32"] = l32.cpu().contiguous()
            tensors[f"p{i}.bf16"] = l16.cpu().contiguous()
            out["prompts"].append({"prompt": prompt, "tokens": seq, "generated": seq[len(prompt):],
                                   "margins": margins, "bf16_max_abs_err": err})
            print(f"prompt {i}: {len(prompt)} tokens, generated {seq[len(prompt):]}, "
                  f"bf16 vs f32 max |err| {err:.4g}, min margin {min(margins):.4g}")
    save_file(tensors, os.path.join(args.out, "logits.safetensors"))
    with open(os.path.join(args.out, "reference.json"), "w") as f:
        json.dump(out, f)
    print("wrote", args.out)


if __name__ == "__main__":
    main()

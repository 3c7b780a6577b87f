#!/usr/bin/env python3
"""A Llama written directly in PyTorch in the style of gpt-fast (pytorch-labs/gpt-fast), for the
PyTorch baseline of bench-decode (`scripts/torch_static_decode.py`).

Fused q/k/v weight, RMSNorm, rotary embeddings with Llama-3 frequency scaling (Hugging Face's
rotate-half layout, so its weights load unchanged), `scaled_dot_product_attention`, a static KV
cache of preallocated tensors written at `input_pos` (`index_copy_`), SwiGLU, tied embeddings.
`python3 scripts/gpt_fast_llama.py` runs `self_test()` (CPU, f32, tiny shape).
"""
import math
import os
import sys
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class Cfg:
    vocab: int = 128256
    dim: int = 2048
    n_layer: int = 16
    n_head: int = 32
    n_kv: int = 8
    head_dim: int = 64
    inter: int = 8192
    eps: float = 1e-5
    rope_theta: float = 500000.0
    rope_factor: float = 32.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_ctx: int = 8192
    tie: bool = True


def shape_cfg(shape):
    if shape == "1b":
        return Cfg()
    if shape == "small":  # models::llama::LlamaConfig::small()
        return Cfg(vocab=2048, dim=256, n_layer=4, n_head=8, n_kv=2, head_dim=32, inter=768, tie=False)
    if shape == "tiny":  # CPU checks
        return Cfg(vocab=97, dim=64, n_layer=2, n_head=4, n_kv=2, head_dim=16, inter=96, tie=True)
    raise SystemExit(f"unknown shape {shape}")


def rope_inv_freq(c):
    """Llama-3 scaled inverse frequencies (as transformers' `_compute_llama3_parameters`)."""
    inv = 1.0 / (c.rope_theta ** (torch.arange(0, c.head_dim, 2, dtype=torch.float64) / c.head_dim))
    low_wl, high_wl = c.original_ctx / c.low_freq_factor, c.original_ctx / c.high_freq_factor
    wl = 2 * math.pi / inv
    scaled = torch.where(wl > low_wl, inv / c.rope_factor, inv)
    smooth = (c.original_ctx / wl - c.low_freq_factor) / (c.high_freq_factor - c.low_freq_factor)
    smoothed = (1 - smooth) * scaled / c.rope_factor + smooth * scaled
    medium = ~(wl < high_wl) & ~(wl > low_wl)
    return torch.where(medium, smoothed, scaled).float()


def apply_rotary(x, cos, sin):
    # x [B, T, H, D]; cos/sin [T, D] (rotate-half layout: pairs (i, i + D/2)).
    x1, x2 = x.chunk(2, dim=-1)
    rot = torch.cat((-x2, x1), dim=-1)
    return (x * cos[None, :, None, :] + rot * sin[None, :, None, :]).to(x.dtype)


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


class KVCache(nn.Module):
    def __init__(self, batch, max_seq, n_kv, head_dim, dtype, device):
        super().__init__()
        shape = (batch, n_kv, max_seq, head_dim)
        self.register_buffer("k", torch.zeros(shape, dtype=dtype, device=device), persistent=False)
        self.register_buffer("v", torch.zeros(shape, dtype=dtype, device=device), persistent=False)
        if self.k.is_cuda and hasattr(torch._dynamo, "mark_static_address"):
            # updated in place at fixed addresses: CUDA graph trees keep them as static inputs
            torch._dynamo.mark_static_address(self.k)
            torch._dynamo.mark_static_address(self.v)

    def update(self, input_pos, k, v):
        # k, v [B, n_kv, T, D] written at positions input_pos [T]
        self.k.index_copy_(2, input_pos, k)
        self.v.index_copy_(2, input_pos, v)
        return self.k, self.v


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.wqkv = nn.Linear(c.dim, (c.n_head + 2 * c.n_kv) * c.head_dim, bias=False)
        self.wo = nn.Linear(c.n_head * c.head_dim, c.dim, bias=False)
        self.kv_cache = None

    def forward(self, x, cos, sin, mask, input_pos, prompt):
        c = self.c
        b, t, _ = x.shape
        q, k, v = self.wqkv(x).split([c.n_head * c.head_dim, c.n_kv * c.head_dim, c.n_kv * c.head_dim], dim=-1)
        q = apply_rotary(q.view(b, t, c.n_head, c.head_dim), cos, sin)
        k = apply_rotary(k.view(b, t, c.n_kv, c.head_dim), cos, sin).transpose(1, 2)
        v = v.view(b, t, c.n_kv, c.head_dim).transpose(1, 2)
        kc, vc = self.kv_cache.update(input_pos, k, v)
        g = c.n_head // c.n_kv
        if prompt:
            # a prompt from position 0: its own keys are the whole history
            q = q.transpose(1, 2)
            k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            y = y.transpose(1, 2).reshape(b, t, c.n_head * c.head_dim)
        else:
            # query heads of one KV head folded into the query length: [B, n_kv, g * T, D]
            q = q.view(b, t, c.n_kv, g, c.head_dim).permute(0, 2, 3, 1, 4).reshape(b, c.n_kv, g * t, c.head_dim)
            y = F.scaled_dot_product_attention(q, kc, vc, attn_mask=mask.repeat(g, 1)[None, None])
            y = y.view(b, c.n_kv, g, t, c.head_dim).permute(0, 3, 1, 2, 4).reshape(b, t, c.n_head * c.head_dim)
        return self.wo(y)


class MLP(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.w1 = nn.Linear(c.dim, c.inter, bias=False)  # gate
        self.w3 = nn.Linear(c.dim, c.inter, bias=False)  # up
        self.w2 = nn.Linear(c.inter, c.dim, bias=False)  # down

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.attention = Attention(c)
        self.feed_forward = MLP(c)
        self.attention_norm = RMSNorm(c.dim, c.eps)
        self.ffn_norm = RMSNorm(c.dim, c.eps)

    def forward(self, x, cos, sin, mask, input_pos, prompt):
        h = x + self.attention(self.attention_norm(x), cos, sin, mask, input_pos, prompt)
        return h + self.feed_forward(self.ffn_norm(h))


class Transformer(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.tok_embeddings = nn.Embedding(c.vocab, c.dim)
        self.layers = nn.ModuleList(Block(c) for _ in range(c.n_layer))
        self.norm = RMSNorm(c.dim, c.eps)
        self.output = nn.Linear(c.dim, c.vocab, bias=False)
        if c.tie:
            self.output.weight = self.tok_embeddings.weight
        self.max_seq = 0

    def setup_caches(self, batch, max_seq):
        dev, dtype = self.output.weight.device, self.output.weight.dtype
        self.max_seq = max_seq
        for layer in self.layers:
            layer.attention.kv_cache = KVCache(batch, max_seq, self.c.n_kv, self.c.head_dim, dtype, dev)
        pos = torch.arange(max_seq, device=dev, dtype=torch.float32)
        freqs = torch.outer(pos, rope_inv_freq(self.c).to(dev))
        emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("cos", emb.cos().to(dtype), persistent=False)
        self.register_buffer("sin", emb.sin().to(dtype), persistent=False)
        self.register_buffer("causal", torch.tril(torch.ones(max_seq, max_seq, dtype=torch.bool, device=dev)),
                             persistent=False)

    def forward(self, idx, input_pos, prompt=False, last_only=True):
        """idx [B, T] tokens at positions input_pos [T]; `prompt`: input_pos is 0..T-1."""
        cos, sin, mask = self.cos[input_pos], self.sin[input_pos], self.causal[input_pos]
        x = self.tok_embeddings(idx)
        for layer in self.layers:
            x = layer(x, cos, sin, mask, input_pos, prompt)
        if last_only:
            x = x[:, -1:]
        return self.output(self.norm(x))


def build(c, device, dtype, seed, weights="auto", shape=None):
    """The model with seeded random weights; (model, description of the weights)."""
    model = None
    if weights in ("auto", "hf"):
        try:
            sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
            from hf_llama_reference import config as hf_config
            from transformers import LlamaForCausalLM

            if weights == "auto" and shape not in ("1b", "small"):
                raise ImportError("no Hugging Face config for this shape")
            torch.manual_seed(seed)
            with torch.device(device):
                hf = LlamaForCausalLM(hf_config(shape) if shape in ("1b", "small") else hf_llama_config(c))
            hf = hf.to(dtype).eval()
            model = from_hf(c, hf, device, dtype)
            desc = f"transformers LlamaForCausalLM under torch.manual_seed({seed}) (as torch_decode_bench.py)"
            del hf
            if device == "cuda":
                torch.cuda.empty_cache()
        except ImportError:
            if weights == "hf":
                raise
    if model is None:
        torch.manual_seed(seed)
        with torch.device(device):
            model = Transformer(c)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith("norm.weight"):
                    p.fill_(1.0)
                else:
                    p.normal_(0.0, 0.02)
        model = model.to(dtype)
        desc = f"normal(0, 0.02) under torch.manual_seed({seed})"
    return model.eval(), desc


def hf_llama_config(c):
    from transformers import LlamaConfig

    rope = {"rope_type": "llama3", "factor": c.rope_factor, "low_freq_factor": c.low_freq_factor,
            "high_freq_factor": c.high_freq_factor, "original_max_position_embeddings": c.original_ctx,
            "rope_theta": c.rope_theta}
    return LlamaConfig(vocab_size=c.vocab, hidden_size=c.dim, num_hidden_layers=c.n_layer,
                       num_attention_heads=c.n_head, num_key_value_heads=c.n_kv, head_dim=c.head_dim,
                       intermediate_size=c.inter, rms_norm_eps=c.eps, rope_theta=c.rope_theta,
                       rope_scaling=rope, max_position_embeddings=131072, tie_word_embeddings=c.tie,
                       attention_bias=False, mlp_bias=False, hidden_act="silu")


def from_hf(c, hf, device, dtype):
    """Copies a transformers LlamaForCausalLM's weights (q/k/v fused)."""
    with torch.device(device):
        m = Transformer(c).to(dtype)
    sd = hf.state_dict()
    with torch.no_grad():
        m.tok_embeddings.weight.copy_(sd["model.embed_tokens.weight"])
        if not c.tie:
            m.output.weight.copy_(sd["lm_head.weight"])
        m.norm.weight.copy_(sd["model.norm.weight"])
        for i, layer in enumerate(m.layers):
            p = f"model.layers.{i}."
            a = p + "self_attn."
            layer.attention.wqkv.weight.copy_(torch.cat([sd[a + f"{x}_proj.weight"] for x in "qkv"]))
            layer.attention.wo.weight.copy_(sd[a + "o_proj.weight"])
            layer.feed_forward.w1.weight.copy_(sd[p + "mlp.gate_proj.weight"])
            layer.feed_forward.w3.weight.copy_(sd[p + "mlp.up_proj.weight"])
            layer.feed_forward.w2.weight.copy_(sd[p + "mlp.down_proj.weight"])
            layer.attention_norm.weight.copy_(sd[p + "input_layernorm.weight"])
            layer.ffn_norm.weight.copy_(sd[p + "post_attention_layernorm.weight"])
    return m


def decode_step(model, tok, pos):
    """One greedy step: tokens [B, 1] at position pos [1] -> next tokens [B, 1]."""
    return model(tok, pos)[:, -1].argmax(-1, keepdim=True)


def prefill_step(model, ids, pos):
    """A prompt from position 0 in one forward -> the first generated tokens [B, 1]."""
    return model(ids, pos, prompt=True)[:, -1].argmax(-1, keepdim=True)


def self_test():
    """CPU checks of the model code at the tiny shape, in f32: the prompt path, the cache path with
    several tokens and token-by-token decoding give the same logits and tokens; Llama-3 rotary
    frequencies and logits equal transformers' where it is installed; torch.compile traces a decode
    step and a prompt without graph breaks (backend "eager")."""
    torch.manual_seed(0)
    c = shape_cfg("tiny")
    model, _ = build(c, "cpu", torch.float32, 0, weights="seeded")
    b, t, gen, max_seq = 3, 9, 6, 32
    ids = torch.randint(2, c.vocab, (b, t))
    close = lambda x, y, what: torch.testing.assert_close(x, y, atol=1e-4, rtol=1e-4, msg=lambda m: f"{what}: {m}")
    with torch.no_grad():
        def greedy(tok, start):
            toks, logits = [], []
            for i in range(gen):
                lg = model(tok, torch.tensor([start + i]))[:, -1]
                tok = lg.argmax(-1, keepdim=True)
                toks.append(tok)
                logits.append(lg)
            return torch.cat(toks, 1), torch.stack(logits, 1)

        model.setup_caches(b, max_seq)
        full = model(ids, torch.arange(t), prompt=True, last_only=False)
        toks_a, lg_a = greedy(full[:, -1].argmax(-1, keepdim=True), t)

        model.setup_caches(b, max_seq)
        one = torch.stack([model(ids[:, i:i + 1], torch.tensor([i]))[:, -1] for i in range(t)], 1)
        close(one, full, "token-by-token prompt vs one prompt forward")
        toks_b, lg_b = greedy(one[:, -1].argmax(-1, keepdim=True), t)
        assert torch.equal(toks_a, toks_b), (toks_a, toks_b)
        close(lg_b, lg_a, "decode after token-by-token vs after prompt forward")

        model.setup_caches(b, max_seq)
        model(ids[:, :4], torch.arange(4))
        chunk = model(ids[:, 4:], torch.arange(4, t), last_only=False)  # cache path, 5 queries
        close(chunk, full[:, 4:], "second chunk through the cache vs prompt forward")
        toks_c, _ = greedy(chunk[:, -1].argmax(-1, keepdim=True), t)
        assert torch.equal(toks_a, toks_c)

        # the prompt path leaves the cache as token-by-token decoding does
        model.setup_caches(b, max_seq)
        model(ids, torch.arange(t), prompt=True)
        k_prompt = model.layers[-1].attention.kv_cache.k.clone()
        model.setup_caches(b, max_seq)
        for i in range(t):
            model(ids[:, i:i + 1], torch.tensor([i]))
        close(model.layers[-1].attention.kv_cache.k, k_prompt, "cache after prompt vs token by token")

        # torch.compile traces both paths whole
        model.setup_caches(b, max_seq)
        cp = torch.compile(prefill_step, backend="eager", fullgraph=True, dynamic=False)
        cd = torch.compile(decode_step, backend="eager", fullgraph=True, dynamic=False)
        tok = cp(model, ids, torch.arange(t))
        pos = torch.tensor([t])
        toks_d = []
        for _ in range(gen):
            tok = cd(model, tok, pos)
            pos.add_(1)
            toks_d.append(tok)
        assert torch.equal(torch.cat(toks_d, 1), toks_a)
        print("self-test: prompt / token-by-token / chunked cache paths agree; compile traces fullgraph")

        try:
            from transformers import LlamaForCausalLM
        except ImportError:
            print("self-test: transformers not installed, Hugging Face comparison skipped")
            return
        torch.manual_seed(1)
        hf = LlamaForCausalLM(hf_llama_config(c)).float().eval()
        m2 = from_hf(c, hf, "cpu", torch.float32).eval()
        m2.setup_caches(b, max_seq)
        ours = m2(ids, torch.arange(t), prompt=True, last_only=False)
        close(ours, hf(ids).logits, "ours vs transformers LlamaForCausalLM")
        m2.setup_caches(b, max_seq)
        step_ours = torch.stack([m2(ids[:, i:i + 1], torch.tensor([i]))[:, -1] for i in range(t)], 1)
        close(step_ours, hf(ids).logits, "ours token by token vs transformers")
        try:
            from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

            sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
            from hf_llama_reference import config as hf_config

            hc = hf_config("1b")
            inv, _ = ROPE_INIT_FUNCTIONS["llama3"](hc, "cpu")
            close(rope_inv_freq(shape_cfg("1b")), inv.float(), "llama3 rotary frequencies (1B config)")
            print("self-test: llama3 rotary frequencies equal transformers'")
        except (ImportError, KeyError, TypeError) as e:
            print(f"self-test: transformers' llama3 rope function not comparable here ({e})")
        print("self-test: logits equal transformers LlamaForCausalLM (f32, tiny shape)")


if __name__ == "__main__":
    self_test()

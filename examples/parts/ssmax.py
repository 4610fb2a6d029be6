"""Scalable-Softmax attention (Nakanishi 2025, "Scalable-Softmax Is Superior for Attention"): softmax
attention whose query at position t is multiplied by s_h log(n_t), n_t = t + 1 the keys it sees and s_h
a learned scalar per head, so attention does not flatten as the context grows (the paper's SSMax:
softmax(s log(n) z), "a simple multiplication of the query vector by s log n").

Everything else is anatomy's softmax attention: Q, K, V in one matmul, n_kv_head K/V heads (GQA), the
model's positions (`rotate`: RoPE at the LLaMA end, nothing at the 2017 end's learned table), and a KV
cache of K and V (the public API's KV), so cached decode scales each query by its own position's n.
Parameters: MHA's (or GQA's) plus n_head (one s per head), initialised to 0.43, the paper's Figure 1 value.

    anatomy components check examples/parts/ssmax.py
    anatomy ablate examples/parts/ssmax.toml
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn

from anatomy_cli.model.parts import KV, Options, part, visible


class SSMaxOptions(Options):
    s_init: float = Field(default=0.43, gt=0)  # each head's s at init


def attention_params(cfg, opts) -> int:
    """qkv [(H + 2G) hd, d], out [d, H hd], and one s per head."""
    d, hd, H, G = cfg.d_model, cfg.head_dim, cfg.n_head, cfg.n_kv_head
    return d * (H + 2 * G) * hd + H * hd * d + H


@part("ssmax", slot="mixer", options=SSMaxOptions, params=attention_params,
      about="scalable-softmax attention: each query times s_h log(n), n the keys it sees (s learned per head)",
      source="Nakanishi 2025 (SSMax)")
class SSMaxAttention(nn.Module):
    def __init__(self, cfg, opts: SSMaxOptions):
        super().__init__()
        self.n_head, self.n_kv_head, self.head_dim = cfg.n_head, cfg.n_kv_head, cfg.head_dim
        self.split = (cfg.n_head * cfg.head_dim, cfg.n_kv_head * cfg.head_dim, cfg.n_kv_head * cfg.head_dim)
        self.qkv = nn.Linear(cfg.d_model, sum(self.split), bias=False)
        self.out = nn.Linear(cfg.n_head * cfg.head_dim, cfg.d_model, bias=False)  # `out`: init scaled as a residual
        self.s = nn.Parameter(torch.full((cfg.n_head,), opts.s_init))  # a vector: init leaves it as built

    def new_state(self, batch: int, max_len: int, device=None, dtype=torch.float32) -> KV:
        return KV(batch, self.n_kv_head, max_len, self.head_dim, device, dtype)  # K and V of G heads

    def forward(self, x, pos, end, rotate, cache=None, layer: int = 0):
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(self.split, dim=-1)
        q = q.view(B, T, self.n_head, self.head_dim).transpose(1, 2)  # [B, H, T, hd]
        k = k.view(B, T, self.n_kv_head, self.head_dim).transpose(1, 2)  # [B, G, T, hd]
        v = v.view(B, T, self.n_kv_head, self.head_dim).transpose(1, 2)  # [B, G, T, hd]
        q, k = rotate(q, k, pos, end)
        past = 0
        if cache is not None:
            past = cache.past_len
            k, v = cache[layer].update(k, v, past)  # [B, G, S, hd]: positions 0 .. past + T - 1
        log_n = torch.log1p(pos.to(q.dtype))  # log(t + 1): [T] or [B, T]
        log_n = log_n.view(1, 1, T, 1) if pos.dim() == 1 else log_n.view(B, 1, T, 1)
        q = q * (self.s.view(1, self.n_head, 1, 1).to(q.dtype) * log_n)  # SSMax: z -> s log(n) z
        S = k.shape[2]
        mask = visible(past, T, S, 0, x.device) if S != T else None  # keys outnumber queries: mask by position
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None and T > 1,
                                           enable_gqa=self.n_kv_head != self.n_head)  # [B, H, T, hd]
        return self.out(y.transpose(1, 2).reshape(B, T, C))

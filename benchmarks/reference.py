"""A hand-written reference of anatomy's model family, written "the slow way" an article would.

Same architecture and the same parameter count as anatomy_cli.model.LM for any ModelConfig, but:
  - attention by hand: q @ k^T / sqrt(hd), masked_fill with a causal mask buffer, softmax, @ v;
    GQA by `repeat_interleave` of K/V up to n_head heads (a real copy in memory)
  - separate q, k, v Linear layers (three matmuls instead of one)
  - RMSNorm element-wise: x * rsqrt(mean(x^2) + eps) * w (several kernels, not F.rms_norm)
  - RoPE element-wise, half-split, cos/sin tables recomputed in every forward
  - LayerNorm via nn.LayerNorm, learned positions via nn.Embedding, GELU / SwiGLU FFNs
  - plain single-tensor AdamW (neither fused nor foreach)

`copy_from_anatomy` loads an anatomy LM's weights into it, so `python benchmarks/reference.py`
checks both models give the same logits in fp32: the speed comparison is between equal models.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402,F401  (puts the checkout's src/ on sys.path)


class RefRMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def make_norm(cfg) -> nn.Module:
    if cfg.norm_type == "rmsnorm":
        return RefRMSNorm(cfg.d_model, cfg.norm_eps)
    return nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps)  # weight + bias, like anatomy's LayerNorm


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(x, base: float):
    """x: [B, nh, T, hd]; half-split RoPE for positions 0..T-1, tables rebuilt on every call."""
    T, hd = x.shape[-2], x.shape[-1]
    inv_freq = 1.0 / (base ** (torch.arange(0, hd, 2, device=x.device, dtype=torch.float32) / hd))
    angles = torch.outer(torch.arange(T, device=x.device, dtype=torch.float32), inv_freq)  # [T, hd/2]
    emb = torch.cat((angles, angles), dim=-1)  # [T, hd]
    return x * emb.cos().to(x.dtype) + rotate_half(x) * emb.sin().to(x.dtype)


class RefAttention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.n_head, self.n_kv_head, self.head_dim = cfg.n_head, cfg.n_kv_head, cfg.head_dim
        self.rope = cfg.pos_type == "rope"
        self.rope_base = cfg.rope_base
        self.q = nn.Linear(cfg.d_model, cfg.n_head * cfg.head_dim, bias=False)
        self.k = nn.Linear(cfg.d_model, cfg.n_kv_head * cfg.head_dim, bias=False)
        self.v = nn.Linear(cfg.d_model, cfg.n_kv_head * cfg.head_dim, bias=False)
        self.out = nn.Linear(cfg.n_head * cfg.head_dim, cfg.d_model, bias=False)
        mask = torch.tril(torch.ones(cfg.ctx_len, cfg.ctx_len)).view(1, 1, cfg.ctx_len, cfg.ctx_len)
        self.register_buffer("mask", mask, persistent=False)

    def forward(self, x):
        B, T, C = x.shape
        q = self.q(x).view(B, T, self.n_head, self.head_dim).transpose(1, 2)  # [B, H, T, hd]
        k = self.k(x).view(B, T, self.n_kv_head, self.head_dim).transpose(1, 2)  # [B, G, T, hd]
        v = self.v(x).view(B, T, self.n_kv_head, self.head_dim).transpose(1, 2)  # [B, G, T, hd]
        if self.rope:
            q, k = apply_rope(q, self.rope_base), apply_rope(k, self.rope_base)
        if self.n_kv_head != self.n_head:  # GQA: copy each K/V head to its H/G query heads
            rep = self.n_head // self.n_kv_head
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)  # [B, H, T, hd]
        att = q @ k.transpose(-2, -1) / math.sqrt(self.head_dim)  # [B, H, T, T]
        att = att.masked_fill(self.mask[:, :, :T, :T] == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        y = att @ v  # [B, H, T, hd]
        return self.out(y.transpose(1, 2).contiguous().view(B, T, C))


class RefFFN(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.swiglu = cfg.ffn_type == "swiglu"
        if self.swiglu:
            self.gate = nn.Linear(cfg.d_model, cfg.ffn_hidden, bias=False)
        self.up = nn.Linear(cfg.d_model, cfg.ffn_hidden, bias=False)
        self.down = nn.Linear(cfg.ffn_hidden, cfg.d_model, bias=False)

    def forward(self, x):
        if self.swiglu:
            return self.down(F.silu(self.gate(x)) * self.up(x))
        return self.down(F.gelu(self.up(x)))


class RefBlock(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.pre = cfg.norm_pos == "pre"
        self.norm1, self.attn = make_norm(cfg), RefAttention(cfg)
        self.norm2, self.ffn = make_norm(cfg), RefFFN(cfg)

    def forward(self, x):
        if self.pre:
            x = x + self.attn(self.norm1(x))
            return x + self.ffn(self.norm2(x))
        x = self.norm1(x + self.attn(x))
        return self.norm2(x + self.ffn(x))


class RefLM(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.tok = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos = nn.Embedding(cfg.ctx_len, cfg.d_model) if cfg.pos_type == "learned" else None
        self.blocks = nn.ModuleList(RefBlock(cfg) for _ in range(cfg.n_layer))
        self.final_norm = make_norm(cfg) if cfg.norm_pos == "pre" else None
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        for name, p in self.named_parameters():
            if p.dim() >= 2:
                nn.init.normal_(p, mean=0.0, std=0.02)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def forward(self, idx, targets=None):
        B, T = idx.shape
        x = self.tok(idx)
        if self.pos is not None:
            x = x + self.pos(torch.arange(T, device=idx.device))
        for block in self.blocks:
            x = block(x)
        if self.final_norm is not None:
            x = self.final_norm(x)
        logits = self.head(x)  # [B, T, V]
        if targets is None:
            return logits, None
        return logits, F.cross_entropy(logits.float().view(B * T, -1), targets.view(B * T))


def make_optimizer(model: nn.Module, lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1) -> torch.optim.Optimizer:
    """Plain AdamW (the per-parameter Python loop); same decay groups as anatomy's."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=betas, foreach=False, fused=False)


@torch.no_grad()
def copy_from_anatomy(ref: RefLM, lm) -> RefLM:
    """Load an anatomy LM's weights into `ref` (qkv is split into q, k, v)."""
    ref.tok.weight.copy_(lm.tok.weight)
    ref.head.weight.copy_(lm.head.weight)
    if ref.pos is not None:
        ref.pos.weight.copy_(lm.positions.table.weight)
    if ref.final_norm is not None:
        ref.final_norm.load_state_dict(lm.final_norm.state_dict())
    for rb, ab in zip(ref.blocks, lm.blocks):
        q, k, v = ab.attn.qkv.weight.split(ab.attn.split, dim=0)
        rb.attn.q.weight.copy_(q)
        rb.attn.k.weight.copy_(k)
        rb.attn.v.weight.copy_(v)
        rb.attn.out.weight.copy_(ab.attn.out.weight)
        rb.ffn.load_state_dict(ab.ffn.state_dict())
        rb.norm1.load_state_dict(ab.norm1.state_dict())
        rb.norm2.load_state_dict(ab.norm2.state_dict())
    return ref


def check_against_anatomy(cfg, batch: int = 2, seq: int | None = None, atol: float = 1e-4):
    """Build both models from cfg, assert equal parameter counts and equal fp32 logits."""
    from anatomy_cli.model import LM

    torch.manual_seed(0)
    lm = LM(cfg)
    ref = copy_from_anatomy(RefLM(cfg), lm)
    n = lm.num_params()
    assert ref.num_params() == n == cfg.num_params(), (ref.num_params(), n, cfg.num_params())
    idx = torch.randint(cfg.vocab_size, (batch, seq or cfg.ctx_len))
    with torch.no_grad():
        diff = (lm(idx)[0] - ref(idx)[0]).abs().max().item()
    from anatomy_cli.spec.components import label

    assert diff < atol, f"{label(cfg)}: reference logits differ from anatomy's by {diff:.2e}"
    return n, diff


def main() -> None:
    from anatomy_cli.spec.config import ModelConfig

    base = dict(vocab_size=97, d_model=64, n_layer=2, n_head=4, ctx_len=32)
    llama = dict(norm_type="rmsnorm", norm_pos="pre", pos_type="rope", ffn_type="swiglu", n_kv_head=2)
    for name, extra in [("2017", {}), ("llama", llama), ("mqa", {**llama, "n_kv_head": 1})]:
        n, diff = check_against_anatomy(ModelConfig(**base, **extra))
        print(f"{name:6s} params {n:,} (equal)  max |logits diff| {diff:.2e}")


if __name__ == "__main__":
    main()

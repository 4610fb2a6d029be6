"""Causal self-attention: MHA when n_kv_head == n_head, GQA when fewer, MQA at one.

Q has n_head (H) heads; K and V have n_kv_head (G) heads, each shared by H/G query heads
(Ainslie et al. 2023). K/V are never repeated to H heads in memory that outlives a call: SDPA's
enable_gqa does the grouping inside the kernel, and the KV cache stores G heads. Where the installed
SDPA has no fused kernel for enable_gqa at the run's dtype (fp32/TF32 on CUDA: math only, which
materialises T x T scores), the trainer sets expand_kv (devices.expand_gqa) and K/V are repeated to
H heads just before the call (repeat_interleave: query head h reads K/V head h // (H/G), SDPA's own
grouping), so a fused kernel runs; the cache still holds G heads.

QK-norm (cfg.qk_norm): RMSNorm over head_dim on Q and on K of every head, one weight of size
head_dim for Q and one for K, shared across heads, as Qwen3 (Yang et al. 2025) and Gemma 3 (Gemma
Team 2025) do; OLMo 2 (Team OLMo 2024) norms the whole Q and K projections instead. Applied before
RoPE and before K enters the cache. It bounds the attention logits, which otherwise grow with the
Q/K weight norms and destabilise training (Dehghani et al. 2023, ViT-22B).

Sliding window (window W > 0; a "local" layer, see ModelConfig.layer_kinds): the query at position
q sees keys q - W < k <= q, W keys including itself, the convention of Mistral's sliding_window
(transformers' sliding_window_overlay: kv_idx > q_idx - sliding_window; Gemma 2/3 and gpt-oss use
the same mask). Stacked, L local layers reach back L (W - 1) positions (Beltagy et al. 2020,
Longformer; Jiang et al. 2023, Mistral 7B). Training uses SDPA with the boolean band mask; the
decode state keeps only the W - 1 latest keys (kv_cache.WindowKV).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from anatomy_cli.model.kv_cache import KV, WindowKV
from anatomy_cli.model.norms import RMSNorm


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg, window: int = 0):
        super().__init__()
        self.window = window  # 0: global; W: a query sees its W latest positions (itself included)
        self.n_head, self.n_kv_head, self.head_dim = cfg.n_head, cfg.n_kv_head, cfg.head_dim
        q_dim, kv_dim = cfg.n_head * cfg.head_dim, cfg.n_kv_head * cfg.head_dim
        self.split = (q_dim, kv_dim, kv_dim)
        self.qkv = nn.Linear(cfg.d_model, q_dim + 2 * kv_dim, bias=False)  # one matmul for Q, K, V
        self.out = nn.Linear(q_dim, cfg.d_model, bias=False)
        # absent unless qk_norm; norm weights are ones, so init draws no random numbers either way
        self.q_norm = RMSNorm(cfg.head_dim, cfg.norm_eps) if cfg.qk_norm else nn.Identity()
        self.k_norm = RMSNorm(cfg.head_dim, cfg.norm_eps) if cfg.qk_norm else nn.Identity()
        self.expand_kv = False  # repeat K/V to H heads before SDPA (set by the trainer: devices.expand_gqa)

    def new_state(self, batch: int, max_len: int, device=None, dtype=torch.float32) -> KV | WindowKV:
        if self.window:  # the window bounds what is kept, not max_len
            return WindowKV(batch, self.n_kv_head, self.window, self.head_dim, device, dtype)
        return KV(batch, self.n_kv_head, max_len, self.head_dim, device, dtype)

    def extra_repr(self) -> str:
        return f"window={self.window}" if self.window else ""

    def forward(self, x, pos, end, rotate, cache=None, layer: int = 0):
        """x: [B, T, C]; pos: [T] or [B, T] position ids; end = last position + 1.

        cache: a KVCache whose cache[layer] is this layer's KV (or WindowKV); cache.past_len is
        where x starts.
        """
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(self.split, dim=-1)
        q = q.view(B, T, self.n_head, self.head_dim).transpose(1, 2)  # [B, H, T, hd]
        k = k.view(B, T, self.n_kv_head, self.head_dim).transpose(1, 2)  # [B, G, T, hd]
        v = v.view(B, T, self.n_kv_head, self.head_dim).transpose(1, 2)  # [B, G, T, hd]
        q, k = self.q_norm(q), self.k_norm(k)  # QK-norm over hd (identity when off)
        q, k = rotate(q, k, pos, end)  # RoPE on Q and K only; V carries content, not position
        past = 0
        if cache is not None:
            past = cache.past_len
            k, v = cache[layer].update(k, v, past)  # [B, G, S, hd]: positions past + T - S .. past + T - 1
        mask = attention_mask(past, T, k.shape[2], self.window, x.device)
        is_causal = mask is None and k.shape[2] == T and T > 1
        gqa = self.n_kv_head != self.n_head
        if gqa and self.expand_kv:  # [B, G, S, hd] -> [B, H, S, hd], for this call only
            k, v = (t.repeat_interleave(self.n_head // self.n_kv_head, dim=1) for t in (k, v))
            gqa = False
        # y: [B, H, T, hd]
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal, enable_gqa=gqa)
        return self.out(y.transpose(1, 2).reshape(B, T, C))


def attention_mask(past: int, T: int, S: int, window: int, device) -> torch.Tensor | None:
    """Which keys each query may see: queries at positions past..past+T-1, S keys ending at the
    last query (positions past+T-S..past+T-1). A bool [T, S] mask (True = may attend): causal, and
    with a window W > 0 also k > q - W. None where SDPA needs none: S == T is its is_causal
    triangle and a single query sees every key, as long as no key is past a window.

    SDPA's is_causal aligns the triangle top-left, which is wrong once keys outnumber queries, so
    a chunk decoded after a prefix gets this mask, built from positions.
    """
    if (S == T or T == 1) and (not window or S <= window):
        return None
    q_pos = torch.arange(past, past + T, device=device)[:, None]  # [T, 1]
    k_pos = torch.arange(past + T - S, past + T, device=device)[None, :]  # [1, S]
    mask = k_pos <= q_pos  # [T, S]
    return mask & (k_pos > q_pos - window) if window else mask

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

Attention sinks (cfg.attn_sinks; gpt-oss, OpenAI 2025; after Xiao et al. 2024's sink tokens): one
learned logit s_h per query head joins every softmax over that head's keys and takes no value,
p_j = exp(l_j) / (exp(s_h) + sum_i exp(l_i)), so a head can put weight on "nothing" instead of on
whatever keys it sees. SDPA has no such term, so these layers run the attention as explicit math
(sink_attention; materialises [T, S] scores, as SDPA's math path would). Init: zeros, a sink of
weight exp(0) = 1 against the keys', drawing no random numbers (gpt-oss's init draws N(0, 0.02)).
Latent attention takes the same sinks (mla.py, and so dsa.py over the keys its indexer picks).

Gated attention output (cfg.attn_gate; Qwen3-Next / Qwen3.5, Qiu et al. 2025 "Gated Attention for
Large Language Models"): the Q projection also emits a gate per output element, and the output is
out(attn * sigmoid(gate)), a data-dependent, head-specific elementwise gate after the softmax.
The Q rows of qkv are laid out as Qwen3-Next's q_proj, per head [query_h | gate_h] (2 hd rows
each), so its weights are a straight copy.
Latent attention's queries come from a compressed latent, so its gate has a projection of its own
from the layer input (mla.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from anatomy_cli.model.kv_cache import KV, WindowKV
from anatomy_cli.model.norms import RMSNorm
from anatomy_cli.model.parts import visible


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg, window: int = 0):
        super().__init__()
        self.window = window  # 0: global; W: a query sees its W latest positions (itself included)
        self.n_head, self.n_kv_head, self.head_dim = cfg.n_head, cfg.n_kv_head, cfg.head_dim
        q_dim, kv_dim = cfg.n_head * cfg.head_dim, cfg.n_kv_head * cfg.head_dim
        self.gated = cfg.attn_gate  # Q rows per head: [query_h | gate_h], Qwen3-Next's q_proj
        self.split = ((2 if self.gated else 1) * q_dim, kv_dim, kv_dim)
        self.qkv = nn.Linear(cfg.d_model, sum(self.split), bias=False)  # one matmul for Q (+ gate), K, V
        self.out = nn.Linear(q_dim, cfg.d_model, bias=False)
        # absent unless qk_norm; norm weights are ones, so init draws no random numbers either way
        self.q_norm = RMSNorm(cfg.head_dim, cfg.norm_eps) if cfg.qk_norm else nn.Identity()
        self.k_norm = RMSNorm(cfg.head_dim, cfg.norm_eps) if cfg.qk_norm else nn.Identity()
        self.expand_kv = False  # repeat K/V to H heads before SDPA (set by the trainer: devices.expand_gqa)
        # a sink logit per query head; zeros: no random draws, and a model with sinks off has no such key
        self.sinks = nn.Parameter(torch.zeros(cfg.n_head)) if cfg.attn_sinks else None

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
        q = q.view(B, T, self.n_head, -1)  # [B, T, H, hd]; gated: [B, T, H, 2 hd], per head [query_h | gate_h]
        q, gate = q[..., : self.head_dim].transpose(1, 2), q[..., self.head_dim :]  # [B, H, T, hd]; [B, T, H, hd]
        k = k.view(B, T, self.n_kv_head, self.head_dim).transpose(1, 2)  # [B, G, T, hd]
        v = v.view(B, T, self.n_kv_head, self.head_dim).transpose(1, 2)  # [B, G, T, hd]
        q, k = self.q_norm(q), self.k_norm(k)  # QK-norm over hd (identity when off)
        q, k = rotate(q, k, pos, end)  # RoPE on Q and K only; V carries content, not position
        past = 0
        if cache is not None:
            past = cache.past_len
            k, v = cache[layer].update(k, v, past)  # [B, G, S, hd]: positions past + T - S .. past + T - 1
        y = self.attend(q, k, v, past)  # [B, H, T, hd]
        y = y.transpose(1, 2)  # [B, T, H, hd]
        if self.gated:  # Qwen3-Next: attn_output * sigmoid(gate), per head and dim, before o_proj
            y = y * torch.sigmoid(gate)
        return self.out(y.reshape(B, T, C))

    def attend(self, q, k, v, past: int) -> torch.Tensor:
        """q [B, H, T, hd] against k, v [B, G, S, hd] (S keys ending at the last query) -> [B, H, T, hd]."""
        T, S = q.shape[2], k.shape[2]
        if self.sinks is not None:  # SDPA has no sink term: the softmax as explicit math
            return sink_attention(q, k, v, self.sinks, visible(past, T, S, self.window, q.device))
        mask = attention_mask(past, T, S, self.window, q.device)
        is_causal = mask is None and S == T and T > 1
        gqa = self.n_kv_head != self.n_head
        if gqa and self.expand_kv:  # [B, G, S, hd] -> [B, H, S, hd], for this call only
            k, v = (t.repeat_interleave(self.n_head // self.n_kv_head, dim=1) for t in (k, v))
            gqa = False
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal, enable_gqa=gqa)


def sink_attention(q, k, v, sinks, mask, scale: float | None = None) -> torch.Tensor:
    """Softmax attention with a sink (gpt-oss's eager_attention_forward): q [B, H, T, hd], k [B, G, S, hd],
    v [B, G, S, hv] (hv: hd, or MLA's v_head_dim), sinks [H] (one logit per query head), mask a bool
    [T, S] or [B, 1, T, S] (True = may attend; DSA's per-query top-k is the latter) -> [B, H, T, hv].

    Scores are scaled by `scale`, default 1/sqrt(hd) as SDPA's; the sink's logit joins each row's softmax
    as one more column and is dropped after it, so it takes its share of the weight and contributes no
    value. Query head h reads K/V head h // (H/G), SDPA's and repeat_kv's grouping, without repeating K/V.
    """
    B, H, T, hd = q.shape
    G, S, hv = k.shape[1], k.shape[2], v.shape[-1]
    q = q.view(B, G, H // G, T, hd)  # [B, G, r, T, hd]: the r = H/G query heads of each K/V head
    scores = q @ k.unsqueeze(2).transpose(-1, -2) * (hd**-0.5 if scale is None else scale)  # [B, G, r, T, S]
    if mask.dim() == 4:  # [B, 1, T, S] -> [B, 1, 1, T, S]: the same keys for every head
        mask = mask.unsqueeze(2)
    scores = scores.masked_fill(~mask, float("-inf"))
    sink = sinks.view(G, H // G, 1, 1).expand(B, G, H // G, T, 1)  # [B, G, r, T, 1]
    # cat promotes: under bf16 autocast the softmax runs in the sink's fp32
    probs = torch.cat((scores, sink), dim=-1).softmax(dim=-1)[..., :S]  # [B, G, r, T, S]: the sink's column dropped
    return (probs.to(v.dtype) @ v.unsqueeze(2)).view(B, H, T, hv)  # [B, G, r, T, hv] -> [B, H, T, hv]


def attention_mask(past: int, T: int, S: int, window: int, device) -> torch.Tensor | None:
    """Which keys each query may see (see visible), or None where SDPA needs no mask: S == T is its
    is_causal triangle and a single query sees every key, as long as no key is past a window.

    SDPA's is_causal aligns the triangle top-left, which is wrong once keys outnumber queries, so
    a chunk decoded after a prefix gets this mask, built from positions.
    """
    if (S == T or T == 1) and (not window or S <= window):
        return None
    return visible(past, T, S, window, device)

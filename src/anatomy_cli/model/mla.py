"""Multi-head latent attention (MLA, DeepSeek-AI 2024: DeepSeek-V2 sec. 2.1; DeepSeek-V3).

Softmax attention whose K and V are rebuilt from a small per-token latent, so the decode cache holds
the latent, not per-head keys and values. With H heads and the sizes of ModelConfig.mla_dims
(r_q = q_lora_rank, r = kv_lora_rank, n = qk_nope_head_dim, p = qk_rope_head_dim, v = v_head_dim):

    x [B, T, d] ─ q_down ─ q_norm ─ q_up ─> Q [B, H, T, n + p] = (q_nope | q_rope)     q_rope rotated
    x ─ kv_down ─> (c [B, T, r] | k_rope [B, T, p])
                    c ─ kv_norm ─> latent  ─┐                                         <- cached
                    k_rope: rotated, ONE key shared by all heads ────────────────────  <- cached
                   latent ─ kv_up ─> (k_nope [B, H, S, n] | V [B, H, S, v])
    K = (k_nope | k_rope repeated over heads);  softmax(Q K^T / sqrt(n + p)) V ─ out ─> [B, T, d]

RoPE cannot ride inside the latent (a rotation between x and the cached c would have to be
re-applied per position to every up-projected key), so position lives in a separate p-wide
"decoupled" key, shared by all heads like MQA's, and each head's query has a matching p-wide part.
The cache per token per layer is r + p values (80 at the default study's d 128: d/2 + hd/2),
against 2 G hd for softmax attention; see ModelConfig.state_bytes.

Decode is the "naive" form: every step re-expands K and V from the cached latents with kv_up. The
"absorbed" form (fold kv_up's K half into the query and its V half into `out`) computes the same
numbers with fewer FLOPs per step at large H; at anatomy's sizes the plain form is the readable one.

Mapping onto Hugging Face's DeepseekV3Attention (transformers 5.x), pinned by tests/model/test_mla.py:
    q_down  = q_a_proj            q_norm  = q_a_layernorm (RMSNorm, eps 1e-6)   q_up = q_b_proj
    kv_down = kv_a_proj_with_mqa  kv_norm = kv_a_layernorm (RMSNorm, eps 1e-6)  kv_up = kv_b_proj
    out     = o_proj
  - q_up's rows are head-major, each head (nope | rope); kv_up's rows are head-major, each head
    (k_nope | v); kv_down's rows are (latent | rope key): the same splits as HF's.
  - The two latent norms use eps 1e-6, DeepSeek's constant (HF builds them without the config's
    rms_norm_eps), whatever cfg.norm_eps says; the block norms keep cfg.norm_eps.
  - Softmax scale (n + p)^-1/2: HF's qk_head_dim^-0.5 without YaRN (no mscale).
  - RoPE: anatomy's half-split pairing (i with i + p/2) over the p dims, base cfg.rope_base, as HF's
    rope_interleave=False. HF's default rope_interleave=True pairs (2i, 2i+1) instead; the same
    model maps onto it by permuting the rope rows of q_up (per head) and of kv_down: HF row 2i =
    our row i, HF row 2i+1 = our row i + p/2 (tests/model/test_mla.py maps it both ways).

Two parts of softmax attention (attention.py) also fit here; neither is in a published MLA model, and
both are off unless set (then the HF mapping above covers every other weight):
  - Sinks (cfg.attn_sinks, gpt-oss's): one learned logit per query head joins each query's softmax
    over its keys and takes no value, exactly attention.py's sink_attention at MLA's scale
    (n + p)^-1/2; zeros at init (no random draws). DSA (dsa.py) puts it into the softmax over the keys
    its indexer picks. The decode cache is unchanged (the sink is a weight, not a position).
  - The output gate (cfg.attn_gate, Qiu et al. 2025's sigmoid(X W_gate) of the layer input, per head
    and dim, on the attention output before `out`). Qwen3-Next's q_proj emits it beside the query,
    but MLA's queries come from the compressed latent (q_down, q_norm, q_up), so the gate here is a
    projection of its own from x: gate = Linear(d, H v), rows head-major (head h's v dims), and
    y = out(attn * sigmoid(gate(x))). This is the natural MLA form of the paper's gate (its input is
    the layer input X), not any published model's; d H v parameters (ModelConfig.mixer_params).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from anatomy_cli.model.attention import attention_mask, sink_attention, visible
from anatomy_cli.model.kv_cache import tensor_bytes
from anatomy_cli.model.norms import RMSNorm
from anatomy_cli.model.positions import RoPE

LATENT_EPS = 1e-6  # DeepSeek's RMSNorm eps on the two latents (HF: DeepseekV3RMSNorm's default)


class LatentKV:
    """One MLA layer's decode state: the normed latent [B, max_len, r] and the rotated shared RoPE key
    [B, max_len, p] of every position; nothing per head."""

    def __init__(self, batch: int, max_len: int, kv_lora_rank: int, rope_dim: int, device=None,
                 dtype=torch.float32):
        self.latent = torch.zeros(batch, max_len, kv_lora_rank, device=device, dtype=dtype)
        self.k_rope = torch.zeros(batch, max_len, rope_dim, device=device, dtype=dtype)
        self.capacity = max_len

    def update(self, latent: torch.Tensor, k_rope: torch.Tensor, past: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Write latent [B, T, r] and k_rope [B, T, p] at positions past..past+T-1; return those of
        positions 0..past+T-1 ([B, past + T, r] and [B, past + T, p] views, in the inputs' dtype)."""
        end = past + latent.shape[1]
        self.latent[:, past:end] = latent
        self.k_rope[:, past:end] = k_rope
        return self.latent[:, :end].to(latent.dtype), self.k_rope[:, :end].to(k_rope.dtype)

    def nbytes(self) -> int:
        return tensor_bytes(self.latent, self.k_rope)

    def reset(self) -> None:
        pass  # positions past past_len are never read; the LM's past_len is the only cursor


class LatentAttention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        m = cfg.mla_dims
        self.n_head, self.nope, self.v_dim = cfg.n_head, m.qk_nope_head_dim, m.v_head_dim
        self.rope_dim = m.qk_rope_head_dim
        self.kv_rank = m.kv_lora_rank
        qk_dim = self.nope + self.rope_dim
        self.q_down = nn.Linear(cfg.d_model, m.q_lora_rank, bias=False)
        self.q_norm = RMSNorm(m.q_lora_rank, LATENT_EPS)
        self.q_up = nn.Linear(m.q_lora_rank, cfg.n_head * qk_dim, bias=False)
        self.kv_down = nn.Linear(cfg.d_model, self.kv_rank + self.rope_dim, bias=False)
        self.kv_norm = RMSNorm(self.kv_rank, LATENT_EPS)
        self.kv_up = nn.Linear(self.kv_rank, cfg.n_head * (self.nope + self.v_dim), bias=False)
        self.out = nn.Linear(cfg.n_head * self.v_dim, cfg.d_model, bias=False)
        # the output gate from the layer input (see the module docstring); a matrix, so LM.reset_parameters
        # draws it N(0, 0.02) as the projections (it is not a residual output: no 1/sqrt(2L))
        self.gate = nn.Linear(cfg.d_model, cfg.n_head * self.v_dim, bias=False) if cfg.attn_gate else None
        # a sink logit per query head; zeros: no random draws, and a model with sinks off has no such key
        self.sinks = nn.Parameter(torch.zeros(cfg.n_head)) if cfg.attn_sinks else None
        self.scale = qk_dim**-0.5
        # its own rotation over the p rope dims (the block's `rotate` turns head_dim-wide heads);
        # learned positions and NoPE leave the decoupled parts unrotated
        self.rope = RoPE(cfg, head_dim=self.rope_dim) if cfg.pos_type == "rope" else None

    def new_state(self, batch: int, max_len: int, device=None, dtype=torch.float32) -> LatentKV:
        return LatentKV(batch, max_len, self.kv_rank, self.rope_dim, device, dtype)

    def forward(self, x, pos, end, rotate=None, cache=None, layer: int = 0):
        """x: [B, T, d]; pos: [T] or [B, T] position ids; end = last position + 1; cache: a KVCache
        whose cache[layer] is this layer's LatentKV (its past_len is where x starts). `rotate` is
        unused (see self.rope)."""
        q, k, v, _, past = self.project(x, pos, end, cache, layer)
        mask = attention_mask(past, q.shape[2], k.shape[2], 0, x.device)  # always global (a window leaves mla be)
        return self.attend(q, k, v, mask, x)

    def project(self, x, pos, end, cache=None, layer: int = 0):
        """Q [B, H, T, n + p], K [B, H, S, n + p] and V [B, H, S, v] of x (S = past + T: the cached
        positions' K and V rebuilt from their latents), the normed query latent [B, T, r_q] (DSA's
        indexer reads it, dsa.py) and past, the positions before x."""
        B, T, _ = x.shape
        H = self.n_head
        q_latent = self.q_norm(self.q_down(x))  # [B, T, r_q]
        q = self.q_up(q_latent).view(B, T, H, -1).transpose(1, 2)  # [B, H, T, n + p]
        q_nope, q_rope = q.split((self.nope, self.rope_dim), dim=-1)
        latent, k_rope = self.kv_down(x).split((self.kv_rank, self.rope_dim), dim=-1)  # [B, T, r], [B, T, p]
        latent = self.kv_norm(latent)
        k_rope = k_rope.unsqueeze(1)  # [B, 1, T, p]: one key for all heads
        if self.rope is not None:
            q_rope, k_rope = self.rope.rotate(q_rope, k_rope, pos, end)
        past = 0
        if cache is not None:
            past = cache.past_len
            latent, k_rope = cache[layer].update(latent, k_rope.squeeze(1), past)  # [B, S, r], [B, S, p]
            k_rope = k_rope.unsqueeze(1)  # [B, 1, S, p]
        S = latent.shape[1]
        kv = self.kv_up(latent).view(B, S, H, self.nope + self.v_dim).transpose(1, 2)  # [B, H, S, n + v]
        k_nope, v = kv.split((self.nope, self.v_dim), dim=-1)
        k = torch.cat((k_nope, k_rope.expand(B, H, S, self.rope_dim)), dim=-1)  # [B, H, S, n + p]
        q = torch.cat((q_nope, q_rope), dim=-1)  # [B, H, T, n + p]
        return q, k, v, q_latent, past

    def attend(self, q, k, v, mask, x):
        """softmax(Q K^T * scale + mask) V (with the sinks in the softmax's denominator when on), heads
        merged, gated by sigmoid(gate(x)) when on, through `out`: [B, T, d]. mask: None (square, causal, or
        a single query seeing every key), or a bool [T, S] or [B, 1, T, S] (True = may attend); x: the
        layer input [B, T, d] (the gate's)."""
        B, H, T, S = *q.shape[:3], k.shape[2]
        if self.sinks is not None:  # SDPA has no sink term: the softmax as explicit math
            if mask is None:  # the last T of S positions, causal (S == T, or one query seeing all)
                mask = visible(S - T, T, S, 0, q.device)
            y = sink_attention(q, k, v, self.sinks, mask, self.scale)  # [B, H, T, v]
        else:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None and S == T and T > 1,
                                               scale=self.scale)  # [B, H, T, v]
        y = y.transpose(1, 2)  # [B, T, H, v]
        if self.gate is not None:  # Qiu et al. 2025: per head and dim, before the output projection
            y = y * torch.sigmoid(self.gate(x)).view(B, T, H, self.v_dim)
        return self.out(y.reshape(B, T, H * self.v_dim))

"""Gated DeltaNet: linear attention whose state is corrected by the delta rule and decayed by a gate.

Yang, Kautz & Hatamizadeh, "Gated Delta Networks: Improving Mamba2 with Delta Rule" (ICLR 2025), as
Qwen3-Next / Qwen3.5 use it in three of every four layers. Per value head, a state S [d_k, d_v]
(a fast-weight memory from keys to values) is updated once per token t:

    S_t = exp(g_t) S_{t-1} + beta_t k_t (v_t - exp(g_t) S_{t-1}^T k_t)^T      o_t = S_t^T q_t

The bracket is the delta rule: write only what the decayed memory mispredicts for k_t, at rate
beta_t in (0, 1); exp(g_t) in (0, 1) forgets. No softmax, no positions, a constant-size state.

The layer, in Qwen3-Next's conventions (transformers' Qwen3NextGatedDeltaNet, torch fallback):
  x -> in_proj -> q, k (Hk heads of d_k), v, z (Hv heads of d_v); ba -> b, a (one per value head)
  q, k, v -> depthwise causal conv over time (kernel K, no bias) -> SiLU
  q, k -> L2-normalised (eps 1e-6 under the root), q * d_k^-0.5; each q/k head serves Hv/Hk
          consecutive value heads (Qwen3-Next: 16 key heads, 32 value heads)
  beta = sigmoid(b); g = -exp(A_log) * softplus(a + dt_bias)    (A_log, dt_bias: one per value head)
  o -> RMSNorm over d_v (weight [d_v], shared by heads) * SiLU(z) -> out_proj
Nothing of that layer is omitted. Anatomy's projection layout is [q | k | v | z] and [b | a], each
part contiguous over heads; HF groups them per key head (the parity test maps one onto the other).

Two forms of the same recurrence:
  chunked   training and prefill: chunks of C tokens; inside a chunk the delta rule's coupling is a
            unit lower-triangular system (the WY/UT form of Yang, Wang, Zhang, Shen & Kim, NeurIPS
            2024, "Parallelizing Linear Transformers with the Delta Rule over Sequence Length"),
            solved in one batched triangular solve; one state product per chunk carries the memory
  recurrent decode: one token at a time from the state
The decode state per layer: the recurrent state [B, Hv, d_k, d_v] and the conv's last K-1 inputs
[B, K-1, 2 Hk d_k + Hv d_v]; constant in the sequence length (GDNState.nbytes()).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from anatomy_cli.model.kv_cache import tensor_bytes
from anatomy_cli.spec.config import GDN_CHUNK

L2_EPS = 1e-6  # under the root of q's and k's L2 norm, as FLA and transformers use


def l2norm(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) + L2_EPS)


def decay_log(n: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """A_log [n]: A = exp(A_log) ~ U(0.01, 16) per head (transformers' init), decay rates from slow to
    fast; drawn from `generator` (None: the global one). LM.reset_parameters redraws it under keyed init."""
    device = None if generator is None else generator.device  # a keyed one is the host's
    return torch.empty(n, device=device).uniform_(0.01, 16, generator=generator).log()


class GDNState:
    """One layer's decode state (kv_cache.py's protocol): the conv's last K-1 inputs and the memory.
    Its size does not depend on how many positions it has seen, so it bounds none (capacity None)."""

    capacity = None

    def __init__(self, conv: torch.Tensor, memory: torch.Tensor):
        self.conv = conv  # [B, K-1, conv_dim]: pre-conv q|k|v of the last K-1 tokens
        self.memory = memory  # [B, Hv, d_k, d_v], fp32 or wider

    def nbytes(self) -> int:
        return tensor_bytes(self.conv, self.memory)

    def reset(self) -> None:
        """Back to position 0: nothing seen, so nothing remembered (unlike K/V, every slot is read)."""
        self.conv.zero_()
        self.memory.zero_()


def chunked_delta_rule(q, k, v, g, beta, memory=None, chunk: int = GDN_CHUNK):
    """q, k: [B, H, T, d_k] (unit rows, q scaled); v: [B, H, T, d_v]; g, beta: [B, H, T].

    Returns o [B, H, T, d_v] and the memory after the last token [B, H, d_k, d_v]. Within a chunk
    with start memory S, cumulative log decay G_i = g_1 + ... + g_i and corrections
    u_i = beta_i (v_i - exp(G_i) S^T k_i - sum_{j<i} exp(G_i - G_j) (k_i . k_j) u_j):
    (I + A) U = beta V - beta exp(G) K S, A strictly lower. Then
    o_i = exp(G_i) S^T q_i + sum_{j<=i} exp(G_i - G_j) (q_i . k_j) u_j and the chunk's end memory
    exp(G_C) S + sum_j exp(G_C - G_j) k_j u_j^T. A ragged end is padded with beta = 0 and g = 0:
    padded tokens neither write nor decay, so the end memory is the last real token's.
    """
    B, H, T, dk = k.shape
    dv = v.shape[-1]
    pad = -T % chunk
    if pad:
        q, k, v = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, v))
        g, beta = F.pad(g, (0, pad)), F.pad(beta, (0, pad))
    n = (T + pad) // chunk
    # chunk-major [n, B H, C, d]: the scan below unbinds chunks (one stack in backward, not n zero-filled
    # index gradients) and every per-chunk matrix is a contiguous batch
    q, k, v = (x.reshape(B * H, n, chunk, -1).transpose(0, 1) for x in (q, k, v))
    G = g.reshape(B * H, n, chunk).transpose(0, 1).cumsum(-1)  # [n, BH, C]
    beta = beta.reshape(B * H, n, chunk).transpose(0, 1).unsqueeze(-1)  # [n, BH, C, 1]
    lower = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).tril()
    # exp(G_i - G_j) for j <= i, else 0; the difference is taken before exp, so it never overflows
    decay = (G.unsqueeze(-1) - G.unsqueeze(-2)).masked_fill(~lower, float("-inf")).exp()  # [n, BH, C, C]
    kb = k * beta
    system = (kb @ k.transpose(-1, -2)) * decay  # its strict lower part is A; the diagonal is taken as 1
    rhs = torch.cat((v * beta, kb * G.exp().unsqueeze(-1)), -1)  # [n, BH, C, d_v + d_k]
    u_v, u_k = torch.linalg.solve_triangular(system, rhs, upper=False, unitriangular=True).split((dv, dk), -1)
    scores = (q @ k.transpose(-1, -2)) * decay  # [n, BH, C, C], the diagonal included
    q_in = q * G.exp().unsqueeze(-1)  # reads the start memory
    k_out = (k * (G[..., -1:] - G).exp().unsqueeze(-1)).transpose(-1, -2)  # [n, BH, d_k, C]: writes it
    chunk_decay = G[..., -1].exp()[..., None, None]  # [n, BH, 1, 1]
    if memory is not None:
        memory = memory.reshape(B * H, dk, dv)
    outs = []
    for uv, uk, sc, qi, ko, cd in zip(*(t.unbind(0) for t in (u_v, u_k, scores, q_in, k_out, chunk_decay))):
        if memory is None:  # no memory yet (the first chunk of training): nothing to read
            outs.append(sc @ uv)
            memory = ko @ uv
            continue
        u = uv - uk @ memory  # [BH, C, d_v]
        outs.append(qi @ memory + sc @ u)
        memory = memory * cd + ko @ u  # [BH, d_k, d_v]
    o = torch.stack(outs, 1).reshape(B, H, n * chunk, dv)[:, :, :T]
    return o, memory.reshape(B, H, dk, dv)


def recurrent_delta_rule(q, k, v, g, beta, memory=None):
    """The same recurrence one token at a time (decode; the reference the chunked form must equal)."""
    B, H, T, dk = k.shape
    if memory is None:
        memory = q.new_zeros(B, H, dk, v.shape[-1])
    outs = []
    for t in range(T):
        memory = memory * g[:, :, t].exp()[..., None, None]  # forget
        miss = v[:, :, t] - (k[:, :, t].unsqueeze(-2) @ memory).squeeze(-2)  # v - S^T k: [B, H, d_v]
        memory = memory + k[:, :, t].unsqueeze(-1) * (beta[:, :, t, None] * miss).unsqueeze(-2)
        outs.append((q[:, :, t].unsqueeze(-2) @ memory))  # [B, H, 1, d_v]
    return torch.cat(outs, 2), memory


class GatedDeltaNet(nn.Module):
    """A token mixer in place of attention (mixers.py's protocol). Sizes from cfg.gdn_shape (key heads,
    value heads, head dim) and cfg.gdn_conv. Positions are not read: order comes from the recurrence
    (and the conv), so a GDN layer has no RoPE and no length limit of its own.
    """

    CHUNK = GDN_CHUNK  # the training chunk width; the function does not depend on it

    def __init__(self, cfg):
        super().__init__()
        self.k_heads, self.v_heads, self.head_dim = cfg.gdn_shape
        self.kernel = cfg.gdn_conv
        key_dim, value_dim = self.k_heads * self.head_dim, self.v_heads * self.head_dim
        self.split = (key_dim, key_dim, value_dim)  # q | k | v, the conv's channels
        self.conv_dim = 2 * key_dim + value_dim
        self.in_proj = nn.Linear(cfg.d_model, self.conv_dim + value_dim, bias=False)  # q | k | v | z
        self.ba = nn.Linear(cfg.d_model, 2 * self.v_heads, bias=False)  # b | a
        self.conv = nn.Parameter(torch.empty(self.conv_dim, 1, self.kernel))  # depthwise [C, 1, K]
        nn.init.normal_(self.conv, std=0.02)  # LM.reset_parameters draws it again (as HF's init does)
        self.dt_bias = nn.Parameter(torch.ones(self.v_heads))
        self.A_log = nn.Parameter(decay_log(self.v_heads))
        self.norm_weight = nn.Parameter(torch.ones(self.head_dim))  # the gated RMSNorm over d_v
        self.eps = cfg.norm_eps
        self.out = nn.Linear(value_dim, cfg.d_model, bias=False)

    def new_state(self, batch: int, max_len: int = 0, device=None, dtype=torch.float32) -> GDNState:
        """The same size for any max_len: that is the point of a recurrent layer."""
        hd = self.head_dim
        return GDNState(torch.zeros(batch, self.kernel - 1, self.conv_dim, device=device, dtype=dtype),
                        torch.zeros(batch, self.v_heads, hd, hd, device=device,
                                    dtype=torch.promote_types(dtype, torch.float32)))

    def short_conv(self, x: torch.Tensor, state: GDNState | None) -> torch.Tensor:
        """x: [B, T, conv_dim] -> SiLU(causal depthwise conv over time), same shape; the state keeps
        the last K-1 inputs. Written as K shifted multiply-adds: F.conv1d's (identical) depthwise
        backward is several times slower on CPU, and this needs no [B, C, T] transposes."""
        B, T, _ = x.shape
        K = self.kernel
        if state is None:
            window = F.pad(x, (0, 0, K - 1, 0))  # [B, K - 1 + T, conv_dim], zeros before the start
        else:
            window = torch.cat((state.conv.to(x.dtype), x), 1)
            state.conv = window[:, window.shape[1] - (K - 1) :].to(state.conv.dtype)
        w = self.conv.to(x.dtype)  # [conv_dim, 1, K]: tap K-1 weighs the token itself (F.conv1d's order)
        y = window[:, K - 1 :] * w[:, 0, K - 1]
        for j in range(K - 1):
            y = y + window[:, j : j + T] * w[:, 0, j]
        return F.silu(y)

    def forward(self, x: torch.Tensor, pos=None, end=None, rotate=None, cache=None, layer: int = 0):
        """x: [B, T, C] -> [B, T, C]; cache[layer] (a GDNState) carries the conv tail and the memory."""
        state = cache[layer] if cache is not None else None
        B, T, _ = x.shape
        H, hd = self.v_heads, self.head_dim
        mixed, z = self.in_proj(x).split((self.conv_dim, H * hd), -1)
        b, a = self.ba(x).split(H, -1)  # [B, T, Hv] each
        q, k, v = self.short_conv(mixed, state).split(self.split, -1)
        q = l2norm(q.reshape(B, T, self.k_heads, hd)) / math.sqrt(hd)  # [B, T, Hk, d_k]
        k = l2norm(k.reshape(B, T, self.k_heads, hd))
        if self.k_heads != H:  # each key head serves H / Hk consecutive value heads
            q, k = (t.repeat_interleave(H // self.k_heads, dim=2) for t in (q, k))
        q, k, v = (t.transpose(1, 2) for t in (q, k, v.reshape(B, T, H, hd)))  # [B, H, T, d]
        beta = b.sigmoid().transpose(1, 2)  # [B, H, T]
        g = (-self.A_log.exp() * F.softplus(a + self.dt_bias)).transpose(1, 2)  # [B, H, T], log decay < 0
        o = self.delta_rule(q, k, v, g, beta, state)  # [B, H, T, d_v]
        o = o.transpose(1, 2).to(x.dtype)  # [B, T, H, d_v]
        o = F.rms_norm(o, (hd,), self.norm_weight, self.eps) * F.silu(z.reshape(B, T, H, hd))
        return self.out(o.reshape(B, T, H * hd))

    def delta_rule(self, q, k, v, g, beta, state: GDNState | None) -> torch.Tensor:
        """The recurrence in fp32 or wider (bf16 autocast too): one token from a state steps, else chunks."""
        dtype = torch.promote_types(q.dtype, torch.float32)  # fp64 stays fp64 (the tests' reference)
        with torch.autocast(q.device.type, enabled=False):
            q, k, v, g, beta = (t.to(dtype) for t in (q, k, v, g, beta))
            memory = state.memory.to(dtype) if state is not None else None
            if state is not None and q.shape[2] == 1:
                o, memory = recurrent_delta_rule(q, k, v, g, beta, memory)
            else:
                o, memory = chunked_delta_rule(q, k, v, g, beta, memory, min(self.CHUNK, q.shape[2]))
        if state is not None:
            state.memory = memory
        return o

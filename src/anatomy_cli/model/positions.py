"""Where a token is: a learned position table (2017), RoPE (Su et al. 2021, LLaMA), or nowhere (NoPE).

Both are indexed by explicit position ids `pos` (shape [T] or [B, T]), so cached decoding
continues from past_len instead of restarting at 0. Each class has the same two hooks:
  embed(x, pos)     -> x plus position vectors (learned table) or x unchanged (RoPE)
  rotate(q, k, pos) -> q, k rotated by position (RoPE) or unchanged (learned table)
NoPE (Kazemnejad et al. 2023) does neither: the causal mask is the only order signal a decoder gets.
RoPE touches only Q and K, never V, and uses the half-split pairing of HF Llama: dimension i is
paired with i + head_dim/2 (not with its neighbour 2i+1, the interleaved convention of the paper).
Partial rotary (cfg.rope_fraction < 1; Qwen3-Next's partial_rotary_factor 0.25, GPT-NeoX's rotary_pct)
rotates only the first R = cfg.rope_dims dims of each head, half-split within them (i with i + R/2),
at frequencies base^(-2i/R) over R, as transformers' apply_rotary_pos_emb and its default rope
init do; the other head_dim - R dims pass unrotated and carry no position.
"""

from __future__ import annotations

import torch
from torch import nn

from anatomy_cli.model.parts import build
from anatomy_cli.spec.errors import InputError


class PositionError(InputError):
    """A position the model has no representation for (past the learned table)."""


class LearnedPositions(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.ctx_len = cfg.ctx_len
        self.table = nn.Embedding(cfg.ctx_len, cfg.d_model)

    def embed(self, x: torch.Tensor, pos: torch.Tensor, end: int) -> torch.Tensor:
        if end > self.ctx_len:  # `end` = last position + 1, known on the host: no device sync
            raise PositionError(
                f"learned position table ends at ctx_len={self.ctx_len}; position {end - 1} requested "
                f"(use pos_type='rope' or 'nope' to run past the training length)"
            )
        return x + self.table(pos)  # [T, C] or [B, T, C] broadcasts over B

    def rotate(self, q, k, pos, end, start=None):
        return q, k


def rotate_interleaved(x: torch.Tensor) -> torch.Tensor:
    """Interleaved pairing: (x0, x1, x2, x3, ...) -> (-x1, x0, -x3, x2, ...)."""
    even, odd = x[..., 0::2], x[..., 1::2]
    return torch.stack((-odd, even), dim=-1).flatten(-2)


def turn_half(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """Half-split rotation x * cos + rotate_half(x) * sin, where rotate_half maps the halves
    (x1, x2) -> (-x2, x1) (HF Llama's form), in three passes over x instead of five.

    rotate_half(x) * sin == roll(x, hd/2) * signed_sin with signed_sin = (-sin_1, sin_2): the roll
    swaps the halves, the sign lives in the table. Negation is exact, so the results are bit-identical
    (tests/model/test_lm.py checks values and gradients against the rotate_half form).
    """
    return x * cos + x.roll(x.shape[-1] // 2, -1) * signed_sin


class RoPE(nn.Module):
    def __init__(self, cfg, head_dim: int | None = None):
        """head_dim: the rotated width when it is not cfg.rope_dims (MLA's decoupled rope part).
        cfg.rope_dims is cfg.head_dim unless rope_fraction < 1 (partial rotary)."""
        super().__init__()
        self.head_dim = head_dim or cfg.rope_dims  # the rotated width R: tables are [n, R]
        self.base = cfg.rope_base
        self.variant = cfg.rope_variant
        # fp32 cos/sin tables for positions 0..ctx_len-1, built once: buffers follow .to(device) and
        # stay out of the state dict (persistent=False); they grow only when decoding past ctx_len.
        # Built eagerly so torch.compile sees plain buffers, not a cache being filled mid-graph.
        self._build(cfg.ctx_len)

    def _angles(self, n: int, interleaved: bool) -> torch.Tensor:
        """float64 angles on the host (exact there, and MPS has no float64); _build casts and moves."""
        inv_freq = 1.0 / self.base ** (torch.arange(0, self.head_dim, 2).double() / self.head_dim)
        angles = torch.outer(torch.arange(n).double(), inv_freq)  # [n, hd/2]: pos * theta_i
        return angles.repeat_interleave(2, -1) if interleaved else torch.cat((angles, angles), -1)  # [n, hd]

    def _build(self, n: int, device=None) -> None:
        half = self._angles(n, False)
        sin = half.sin()
        sin[:, : self.head_dim // 2].neg_()  # signed: the sign of rotate_half, see turn_half
        # cast to fp32 on the host, then one copy to the device (device None: stay on the host)
        self.register_buffer("cos", half.cos().float().to(device), persistent=False)
        self.register_buffer("signed_sin", sin.float().to(device), persistent=False)
        if self.variant == "k_interleaved":
            inter = self._angles(n, True)
            self.register_buffer("cos_i", inter.cos().float().to(device), persistent=False)
            self.register_buffer("sin_i", inter.sin().float().to(device), persistent=False)

    def tables(self, end: int, interleaved: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """fp32 cos and sin of shape [n >= end, head_dim]; half-split sin is signed (see turn_half)."""
        if end > self.cos.shape[0]:  # decoding past the training length: grow (doubling)
            self._build(max(end, 2 * self.cos.shape[0]), self.cos.device)
        return (self.cos_i, self.sin_i) if interleaved else (self.cos, self.signed_sin)

    def rotate_one(self, x: torch.Tensor, pos: torch.Tensor, end: int, start: int | None = None,
                   interleaved: bool = False) -> torch.Tensor:
        R = self.head_dim
        if x.shape[-1] > R:  # partial rotary: [..., R] rotated, then the [..., hd - R] rest as it was
            return torch.cat((self.rotate_one(x[..., :R], pos, end, start, interleaved), x[..., R:]), dim=-1)
        cos, sin = self.tables(end, interleaved)
        if start is not None:  # positions start..end-1: a slice, no gather
            cos, sin = cos[start:end], sin[start:end]  # [T, hd]
        else:
            cos, sin = cos[pos], sin[pos]  # [T, hd] or [B, T, hd]
            if pos.dim() == 2:  # [B, T, hd] -> [B, 1, T, hd] to broadcast over heads
                cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        cos, sin = cos.to(x.dtype), sin.to(x.dtype)  # no-op in fp32; bf16 under autocast
        if interleaved:
            return x * cos + rotate_interleaved(x) * sin
        return turn_half(x, cos, sin)

    def embed(self, x, pos, end):
        return x

    def rotate(self, q: torch.Tensor, k: torch.Tensor, pos: torch.Tensor, end: int, start: int | None = None):
        """q: [B, H, T, hd], k: [B, G, T, hd] -> same shapes, rotated by angle pos * theta_i.

        `start` (optional) says pos == arange(start, end), letting the tables be sliced.
        """
        if self.variant == "q_only":  # break-it exercise: K keeps no position at all
            return self.rotate_one(q, pos, end, start), k
        if self.variant == "k_interleaved":  # break-it exercise: Q and K disagree on the pairing
            return self.rotate_one(q, pos, end, start), self.rotate_one(k, pos, end, start, interleaved=True)
        return self.rotate_one(q, pos, end, start), self.rotate_one(k, pos, end, start)


class NoPositions(nn.Module):
    """NoPE (Kazemnejad et al. 2023, "The Impact of Positional Encoding on Length Generalization in
    Transformers"): no position information at all. A causal decoder can still infer order from the
    mask (how many keys a query sees), so NoPE learns; nothing here ends at ctx_len.
    """

    def __init__(self, cfg):
        super().__init__()

    def embed(self, x, pos, end):
        return x

    def rotate(self, q, k, pos, end, start=None):
        return q, k


def make_positions(cfg) -> nn.Module:
    """The part cfg.pos_type names (learned, rope, nope: spec/parts.py declares them; or a plugin's)."""
    return build(cfg, "positions")

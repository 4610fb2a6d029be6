"""One transformer block: the only place where pre-norm vs post-norm is wired.

    post-norm (2017, Vaswani et al.)         pre-norm (GPT-2, LLaMA)
    x ─┬─ attn ─(+)─ norm1 ─┬─ ffn ─(+)─ norm2    x ─┬─ norm1 ─ attn ─(+)─┬─ norm2 ─ ffn ─(+)
       └────────┘           └───────┘              └──────────────────┘   └──────────────────┘

Post-norm normalises the residual stream itself after every sub-layer, so gradients to early layers
pass through every norm; pre-norm leaves an identity path from input to output (Xiong et al. 2020),
which is why it trains deep stacks without warmup. The LM adds a final norm only for pre-norm.
"""

from __future__ import annotations

from torch import nn

from .attention import CausalSelfAttention
from .ffn import make_ffn
from .norms import make_norm


class Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.pre = cfg.norm_pos == "pre"
        self.norm1, self.attn = make_norm(cfg), CausalSelfAttention(cfg)
        self.norm2, self.ffn = make_norm(cfg), make_ffn(cfg)

    def forward(self, x, pos, end, rotate, mask=None, cache=None, layer: int = 0):
        if self.pre:
            x = x + self.attn(self.norm1(x), pos, end, rotate, mask, cache, layer)
            return x + self.ffn(self.norm2(x))
        x = self.norm1(x + self.attn(x, pos, end, rotate, mask, cache, layer))
        return self.norm2(x + self.ffn(x))

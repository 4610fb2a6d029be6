"""The feed-forward half of a block: GELU MLP (2017 / GPT-2) and SwiGLU (Shazeer 2020, LLaMA).

Both are bias-free. SwiGLU has three matrices instead of two, so its hidden size is 2/3 of the
GELU one (rounded up to 32, see ModelConfig.ffn_hidden) to keep the parameter count comparable.

Every channel mixer has one interface, forward(x [B, T, C], stats=None) -> [B, T, C], so the block
calls whichever it holds the same way: a dense FFN ignores `stats`; a mixture of experts (moe.py,
cfg.moe) appends its routing statistics to it when the caller asks for them. mixers.make_ffn picks
the block's channel mixer.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class GeluMLP(nn.Module):
    def __init__(self, cfg, hidden: int | None = None):
        super().__init__()
        hidden = hidden or cfg.ffn_hidden
        self.up = nn.Linear(cfg.d_model, hidden, bias=False)
        self.down = nn.Linear(hidden, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor, stats: list | None = None) -> torch.Tensor:
        return self.down(F.gelu(self.up(x)))


class SwiGLU(nn.Module):
    def __init__(self, cfg, hidden: int | None = None):
        super().__init__()
        hidden = hidden or cfg.ffn_hidden
        self.gate = nn.Linear(cfg.d_model, hidden, bias=False)
        self.up = nn.Linear(cfg.d_model, hidden, bias=False)
        self.down = nn.Linear(hidden, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor, stats: list | None = None) -> torch.Tensor:
        return self.down(F.silu(self.gate(x)) * self.up(x))


FFNS: dict[str, type[nn.Module]] = {"gelu": GeluMLP, "swiglu": SwiGLU}

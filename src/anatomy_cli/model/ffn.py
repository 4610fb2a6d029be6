"""The feed-forward half of a block: GELU MLP (2017 / GPT-2) and SwiGLU (Shazeer 2020, LLaMA).

Both are bias-free. SwiGLU has three matrices instead of two, so its hidden size is 2/3 of the
GELU one (rounded up to 32, see ModelConfig.ffn_hidden) to keep the parameter count comparable.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class GeluMLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.up = nn.Linear(cfg.d_model, cfg.ffn_hidden, bias=False)
        self.down = nn.Linear(cfg.ffn_hidden, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.gelu(self.up(x)))


class SwiGLU(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.gate = nn.Linear(cfg.d_model, cfg.ffn_hidden, bias=False)
        self.up = nn.Linear(cfg.d_model, cfg.ffn_hidden, bias=False)
        self.down = nn.Linear(cfg.ffn_hidden, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.silu(self.gate(x)) * self.up(x))


FFNS: dict[str, type[nn.Module]] = {"gelu": GeluMLP, "swiglu": SwiGLU}


def make_ffn(cfg) -> nn.Module:
    return FFNS[cfg.ffn_type](cfg)

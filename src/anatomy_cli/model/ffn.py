"""The feed-forward half of a block: GELU MLP (2017 / GPT-2), SwiGLU (Shazeer 2020, LLaMA) and a SiLU MLP.

All are bias-free. SwiGLU has three matrices instead of two, so its hidden size is 2/3 of the
GELU one (rounded up to 32, see ModelConfig.ffn_hidden) to keep the parameter count comparable.
The SiLU MLP is SwiGLU without its gate (CS336's swiglu_ablation): two matrices at 3/2 of SwiGLU's
hidden, so it holds SwiGLU's parameters exactly and the comparison isolates the gate.
Each is a part of the ffn slot (spec/parts.py declares them; model/parts.build builds them).

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


class SiLUMLP(nn.Module):
    def __init__(self, cfg, hidden: int | None = None):
        super().__init__()
        hidden = hidden or cfg.ffn_hidden
        self.up = nn.Linear(cfg.d_model, hidden, bias=False)
        self.down = nn.Linear(hidden, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor, stats: list | None = None) -> torch.Tensor:
        return self.down(F.silu(self.up(x)))


# The FFNs a mixture of experts builds its experts of (moe.py; config.FFN_EXPERTS), by ffn_type.
FFNS: dict[str, type[nn.Module]] = {"gelu": GeluMLP, "swiglu": SwiGLU, "silu": SiLUMLP}

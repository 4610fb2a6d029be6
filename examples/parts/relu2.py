"""ReLU^2 FFN (So et al. 2021, "Primer: Searching for Efficient Transformers for Language Modeling", sec. 3):
the FFN's activation is the squared ReLU, relu(x)^2, in place of GELU; the two matrices stay.

Parameters: hidden 4 d_model by default, the 2017 GELU FFN's width, so it holds GELU's parameters exactly
(8 d^2 per layer, as in Primer's own comparison). Against the LLaMA end's SwiGLU (3 matrices of
ceil(8/3 d, 32)) it has 3 % fewer: 131,072 against 135,168 per layer at d_model 128. Set
[model.part_options.relu2] hidden = 528 (3/2 of SwiGLU's 352) to match SwiGLU's parameters exactly.

    anatomy components check examples/parts/relu2.py
    anatomy ablate examples/parts/relu2.toml
"""

from __future__ import annotations

import torch.nn.functional as F
from pydantic import Field
from torch import nn

from anatomy_cli.model.parts import Options, part


class Relu2Options(Options):
    hidden: int | None = Field(default=None, gt=0)  # None: 4 d_model, GELU's width


def width(cfg, opts: Relu2Options) -> int:
    return opts.hidden or 4 * cfg.d_model


@part("relu2", slot="ffn", options=Relu2Options, params=lambda cfg, o: 2 * cfg.d_model * width(cfg, o),
      about="ReLU^2 FFN: relu(x)^2 in place of GELU, the same two matrices (hidden 4d: GELU's parameters)",
      source="So et al. 2021 (Primer)")
class Relu2(nn.Module):
    def __init__(self, cfg, opts: Relu2Options):
        super().__init__()
        hidden = width(cfg, opts)
        self.up = nn.Linear(cfg.d_model, hidden, bias=False)  # [B, T, C] -> [B, T, hidden]
        self.down = nn.Linear(hidden, cfg.d_model, bias=False)  # `down`: its init is scaled like every residual branch

    def forward(self, x, stats=None):
        return self.down(F.relu(self.up(x)).square())  # [B, T, C]

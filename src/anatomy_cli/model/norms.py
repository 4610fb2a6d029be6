"""LayerNorm (2017) and RMSNorm (LLaMA) side by side, both on fused PyTorch kernels.

LayerNorm (Ba et al. 2016) centres and scales: (x - mean) / sqrt(var + eps) * w + b.
RMSNorm (Zhang & Sennrich 2019) only scales: x / sqrt(mean(x^2) + eps) * w; no mean, no bias.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class LayerNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in the fused kernel, apply the affine outside it: on CPU the fused kernel's
        # weight/bias gradient reduction order depends on the thread count, which made the same
        # run differ (~1e-7) between 1 and 2 threads; elementwise affine is thread-count exact.
        return F.layer_norm(x, self.weight.shape, None, None, self.eps) * self.weight + self.bias


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps  # explicit: F.rms_norm's default eps (finfo.eps) differs from LLaMA's
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, self.weight.shape, self.weight, self.eps)


NORMS: dict[str, type[nn.Module]] = {"layernorm": LayerNorm, "rmsnorm": RMSNorm}


def make_norm(cfg) -> nn.Module:
    return NORMS[cfg.norm_type](cfg.d_model, cfg.norm_eps)

"""LayerNorm (2017) and RMSNorm (LLaMA) side by side, both on fused PyTorch kernels, and no norm.

LayerNorm (Ba et al. 2016) centres and scales: (x - mean) / sqrt(var + eps) * w + b.
RMSNorm (Zhang & Sennrich 2019) only scales: x / sqrt(mean(x^2) + eps) * w; no mean, no bias.
No norm (norm_type "none"; CS336's layer_norm_ablation, "remove all of the RMSNorms"): every norm of
the block and the final one is the identity. Each is a part of the norm slot (spec/parts.py declares
them, model/parts.build builds them from the config: make_norm); QK-norm is RMSNorm at head_dim.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from anatomy_cli.model.parts import build


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


class NoNorm(nn.Identity):
    """The norm slot's identity (norm_type 'none'): no parameters, x unchanged."""

    def __init__(self, cfg):
        super().__init__()


def layer_norm(cfg) -> LayerNorm:
    return LayerNorm(cfg.d_model, cfg.norm_eps)


def rms_norm(cfg) -> RMSNorm:
    return RMSNorm(cfg.d_model, cfg.norm_eps)


def make_norm(cfg) -> nn.Module:
    """A norm of width d_model, the part cfg.norm_type names (anatomy's own or a plugin's)."""
    return build(cfg, "norm")

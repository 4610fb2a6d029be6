"""Per-layer K/V buffers for decoding: prefill once, then one token per step.

Each layer holds K and V of shape [B, n_kv_head, T_max, head_dim]: the cache stores only the
n_kv_head (G) heads; SDPA expands them to n_head at attention time, so GQA's memory saving is
real. Size: 2 (K and V) * L * B * G * T_max * head_dim * bytes per element.
"""

from __future__ import annotations

import torch


class CacheFullError(ValueError):
    """More positions were asked of the cache than it was allocated for."""


class KVCache:
    def __init__(self, n_layer: int, batch: int, n_kv_head: int, max_len: int, head_dim: int,
                 device=None, dtype=torch.float32):
        shape = (batch, n_kv_head, max_len, head_dim)
        self.k = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(n_layer)]
        self.v = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(n_layer)]
        self.max_len = max_len
        self.past_len = 0  # positions already written (shared by all layers)

    @classmethod
    def for_model(cls, cfg, batch: int, max_len: int, device=None, dtype=torch.float32) -> KVCache:
        return cls(cfg.n_layer, batch, cfg.n_kv_head, max_len, cfg.head_dim, device, dtype)

    def check_room(self, n_new: int) -> None:
        if self.past_len + n_new > self.max_len:
            raise CacheFullError(
                f"KV cache holds {self.max_len} positions; {self.past_len} used, {n_new} more asked"
            )

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write k, v ([B, G, T, hd]) at positions past_len..past_len+T-1; return all keys so far."""
        start, end = self.past_len, self.past_len + k.shape[2]
        self.k[layer][:, :, start:end] = k
        self.v[layer][:, :, start:end] = v
        # [B, G, end, hd] views; cast back only when the cache's dtype differs (e.g. a bf16 cache)
        return self.k[layer][:, :, :end].to(k.dtype), self.v[layer][:, :, :end].to(v.dtype)

    def advance(self, n: int) -> None:
        self.past_len += n

    def reset(self) -> None:
        self.past_len = 0

    def cache_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.k + self.v)


def kv_cache_bytes(n_layer: int, batch: int, n_kv_head: int, seq_len: int, head_dim: int,
                   bytes_per_elem: int) -> int:
    """2 * L * B * G * T * hd * bytes: what a cache of these sizes holds (K and V)."""
    return 2 * n_layer * batch * n_kv_head * seq_len * head_dim * bytes_per_elem

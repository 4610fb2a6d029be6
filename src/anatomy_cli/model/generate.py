"""Text generation: prefill the prompt once, then one token per step through the KV cache.

When the context reaches the window (ctx_len by default), the oldest half is dropped and the rest
re-prefilled ("context shift"); the uncached path applies the same rule, so both paths condition
on identical tokens and greedy outputs are identical. Sampling uses a seeded torch.Generator,
never the global RNG.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch

from anatomy_cli.spec.config import MAX_SIZE, MIN_CTX
from anatomy_cli.spec.errors import InputError


class SampleError(InputError):
    """Generation options that cannot work (window past the learned table, bad temperature)."""


def pick(logits: torch.Tensor, temp: float, top_k: int | None, gen: torch.Generator | None) -> int:
    """logits: [V] -> next id. temp 0 = argmax; top_k keeps the k most likely ids."""
    if temp == 0:
        return int(logits.argmax())
    scaled = logits.float() / temp
    if not bool(torch.isfinite(scaled).all()):  # a temperature so small that logits/temp overflows:
        scaled = (logits.float() - logits.float().max()) / temp  # shift first (softmax ignores it): ~argmax
    logits = scaled
    if top_k is not None and top_k < logits.numel():
        kth = torch.topk(logits, top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    return int(torch.multinomial(probs.cpu(), 1, generator=gen))


def check_options(cfg, temp: float, top_k: int | None, window: int | None) -> int:
    """The window to use (None: ctx_len); messages name the `sample` options the arguments come from."""
    if not math.isfinite(temp) or temp < 0:
        raise SampleError(f"--temp must be >= 0 and finite, got {temp}")
    if top_k is not None and top_k < 1:
        raise SampleError(f"--top-k must be >= 1, got {top_k}")
    if window is None:  # ModelConfig refuses a ctx_len below MIN_CTX: this default always fits
        window = cfg.ctx_len
    if not MIN_CTX <= window <= MAX_SIZE:
        raise SampleError(f"--window must be between {MIN_CTX} and {MAX_SIZE}, got {window}")
    if cfg.max_positions is not None and window > cfg.max_positions:
        raise SampleError(f"--window {window}: the learned position table ends at ctx_len={cfg.max_positions} "
                          f"(RoPE or NoPE can go beyond)")
    return window


def window_bytes(cfg, window: int) -> int:
    """fp32 bytes generation allocates for a window: every layer's decode state and RoPE's cos/sin tables."""
    tables = 4 * window * cfg.head_dim if cfg.pos_type == "rope" else 0
    return cfg.cache_bytes(1, window, 4) + 4 * tables


@torch.no_grad()
def generate(model, prefix: list[int], max_new: int, temp: float = 0.8, top_k: int | None = None,
             seed: int = 0, use_cache: bool = True, window: int | None = None) -> Iterator[int]:
    """Yield max_new ids after `prefix` (one id per step, for streaming)."""
    window = check_options(model.cfg, temp, top_k, window)
    if not prefix:
        raise SampleError("the prefix must hold at least one token (one character, for a char run)")
    device = next(model.parameters()).device
    gen = torch.Generator().manual_seed(seed)
    ids = list(prefix)
    start = max(0, len(ids) - window)  # the context is ids[start:]
    cache = model.new_cache(1, window) if use_cache and model.can_cache else None  # a part may keep none

    def run(tokens: list[int]) -> torch.Tensor:
        logits, _ = model(torch.tensor([tokens], device=device), cache=cache, last_only=True)
        return logits[0, -1]  # [V]

    logits = run(ids[start:])  # prefill
    for i in range(max_new):
        nxt = pick(logits, temp, top_k, gen)
        ids.append(nxt)
        yield nxt
        if i == max_new - 1:
            return  # no forward for a token nobody will read
        if len(ids) - start > window:  # context shift: keep the newest half of the window
            start = len(ids) - window // 2
            if cache is not None:
                cache.reset()
                logits = run(ids[start:])
                continue
        logits = run(ids[-1:] if cache is not None else ids[start:])

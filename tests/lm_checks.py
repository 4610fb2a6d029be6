"""Checks every component's tests run on a whole LM: causality, decoding through the cache in
chunks, and a few seeded training steps (for determinism). Toy sizes; the model is a seeded toy LM."""

from __future__ import annotations

import torch
from toy_data import TINY_MODEL, TINY_TRAIN, write_corpus

from anatomy_cli.data.load import load_corpus
from anatomy_cli.spec.config import RunConfig, validate
from anatomy_cli.training.run import resolve_config
from anatomy_cli.training.trainer import Trainer


def tokens(B: int, T: int, seed: int = 0, vocab: int = 50) -> torch.Tensor:
    return torch.randint(0, vocab, (B, T), generator=torch.Generator().manual_seed(seed))


def assert_causal(model, T: int = 16) -> None:
    """Changing token t leaves every logit before t as it was and moves every logit from t on.

    In float64: the changed token can alter the shapes a kernel sees (which tokens an MoE expert's
    matmul gets), so fp32 logits before t may move by rounding (1.3e-6 seen under MKL_CBWR=COMPATIBLE)
    without any information flowing back; in fp64 that rounding is ~1e-15, and a real leak is 1e-3."""
    idx = tokens(2, T, seed=3)
    model.double()
    try:
        with torch.no_grad():
            ref, _ = model(idx)
            for t in (0, 6, T - 1):
                changed = idx.clone()
                changed[:, t] = (changed[:, t] + 1) % 50
                logits, _ = model(changed)
                torch.testing.assert_close(logits[:, :t], ref[:, :t], atol=1e-10, rtol=0)
                per_pos = (logits[:, t:] - ref[:, t:]).abs().amax(dim=(0, 2))  # [T - t]
                assert per_pos.min() > 1e-3, f"token {t} did not reach every later position: {per_pos}"
    finally:
        model.float()


def decode_in_chunks(model, idx: torch.Tensor, chunks: list[int], max_len: int | None = None):
    """Feed idx through one cache (for max_len positions, default idx's length) in chunks of the
    given sizes; return the concatenated logits and the cache."""
    cache = model.new_cache(idx.shape[0], max_len or idx.shape[1])
    out, t = [], 0
    for n in chunks:
        assert cache.past_len == t
        logits, _ = model(idx[:, t : t + n], cache=cache)
        out.append(logits)
        t += n
    assert t == idx.shape[1]
    return torch.cat(out, dim=1), cache


# Cached decode against the full forward, per dtype. The two paths sum in other orders (a query
# against a cache vs a square mask; GDN's recurrence token by token vs chunked), so fp32 agrees only
# to rounding: logits of O(1-10) through 2-4 layers of d-term sums, 1.5e-5 apart seen on an Intel
# AVX-512 MKL path: 1e-4, ~100 ulps of a logit of 10. fp64 is where exactness is the point: 1e-10.
# A cache that drops, repeats or misplaces a position moves logits by 1e-2 or more at either.
DECODE_ATOL = {torch.float32: 1e-4, torch.float64: 1e-10}


def assert_decodes_like_full(model, idx: torch.Tensor, plans: list[list[int]]) -> None:
    """Decoding idx through one cache in each plan's chunks == one full forward, fp32 and fp64."""
    T = idx.shape[1]
    try:
        for dtype, atol in DECODE_ATOL.items():
            model.to(dtype)
            with torch.no_grad():
                full, _ = model(idx)
                for chunks in plans:
                    decoded, cache = decode_in_chunks(model, idx, chunks)
                    assert cache.past_len == T
                    torch.testing.assert_close(decoded, full, atol=atol, rtol=0, msg=f"{dtype}, chunks {chunks}")
    finally:
        model.float()


def assert_cached_decode(model) -> None:
    """Prefill + one token at a time, and uneven chunks (non-square masks too), == one full forward
    (16 tokens), fp32 and fp64."""
    assert_decodes_like_full(model, tokens(2, 16, seed=1), [[6] + [1] * 10, [5, 3, 1, 4, 1, 2]])


def trainer(tmp_path, name: str, model: dict | None = None, **train_opts) -> Trainer:
    """A Trainer on the tiny corpus in tmp_path (TINY_MODEL + model, TINY_TRAIN + train_opts)."""
    corpus_path = tmp_path / "tiny.txt"
    if not corpus_path.exists():
        write_corpus(tmp_path)
    cfg = validate(RunConfig, {"model": {**TINY_MODEL, **(model or {})},
                               "train": {**TINY_TRAIN, "sample_len": 0, "device": "cpu", **train_opts},
                               "data": {"source": str(corpus_path)}})
    corpus = load_corpus(cfg.data.source, cfg.data.val_frac, cfg.model.ctx_len)
    (tmp_path / name).mkdir()
    return Trainer(resolve_config(cfg, corpus), tmp_path / name, corpus)


def train_losses(tr: Trainer, steps: int = 3) -> list[float]:
    return [float(tr.train_step().loss) for _ in range(steps)]

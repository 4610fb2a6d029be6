"""Checks every component's tests run on a whole LM: causality, decoding through the cache in
chunks, and a few seeded training steps (for determinism). Toy sizes; the model is a seeded toy LM."""

from __future__ import annotations

import torch
from toy_data import TINY_MODEL, TINY_TRAIN, write_corpus

from anatomy_cli.config import RunConfig, validate
from anatomy_cli.data import load_corpus
from anatomy_cli.train import resolve_config
from anatomy_cli.trainer import Trainer


def tokens(B: int, T: int, seed: int = 0, vocab: int = 50) -> torch.Tensor:
    return torch.randint(0, vocab, (B, T), generator=torch.Generator().manual_seed(seed))


def assert_causal(model, T: int = 16) -> None:
    """Changing token t leaves every logit before t as it was and moves every logit from t on."""
    idx = tokens(2, T, seed=3)
    with torch.no_grad():
        ref, _ = model(idx)
        for t in (0, 6, T - 1):
            changed = idx.clone()
            changed[:, t] = (changed[:, t] + 1) % 50
            logits, _ = model(changed)
            torch.testing.assert_close(logits[:, :t], ref[:, :t], atol=1e-6, rtol=0)
            per_pos = (logits[:, t:] - ref[:, t:]).abs().amax(dim=(0, 2))  # [T - t]
            assert per_pos.min() > 1e-3, f"token {t} did not reach every later position: {per_pos}"


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


def assert_cached_decode(model) -> None:
    """Prefill + one token at a time, and uneven chunks, both == one full forward (16 tokens)."""
    idx = tokens(2, 16, seed=1)
    with torch.no_grad():
        full, _ = model(idx)
        singles, cache = decode_in_chunks(model, idx, [6] + [1] * 10)
        chunked, _ = decode_in_chunks(model, idx, [5, 3, 1, 4, 1, 2])  # non-square masks too
    assert cache.past_len == 16
    torch.testing.assert_close(singles, full, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(chunked, full, atol=1e-5, rtol=1e-5)


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

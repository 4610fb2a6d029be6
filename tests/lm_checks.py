"""Checks every component's tests run on a whole LM: causality, decoding through the cache in
chunks, and a few seeded training steps (for determinism). Toy sizes; the model is a seeded toy LM.
Causality and cached decode are the battery's own checks (exams/parts_check.py, what `anatomy
components check` runs on a plugin's part), so the built-in parts and a plugin's pass the same ones."""

from __future__ import annotations

import torch
from toy_data import TINY_MODEL, TINY_TRAIN, write_corpus

from anatomy_cli.data.load import load_corpus
from anatomy_cli.exams.parts_check import DECODE_ATOL, causal, decode_in_chunks, decodes_like_full, tokens  # noqa: F401
from anatomy_cli.spec.config import RunConfig, validate
from anatomy_cli.training.run import resolve_config
from anatomy_cli.training.trainer import Trainer


def assert_causal(model, T: int = 16) -> None:
    """Changing token t leaves every logit before t as it was and moves every logit from t on, in float64
    (the battery's check: exams/parts_check.causal, which says why fp64)."""
    causal(model, T)


def assert_decodes_like_full(model, idx: torch.Tensor, plans: list[list[int]]) -> None:
    """Decoding idx through one cache in each plan's chunks == one full forward, fp32 and fp64 (the
    battery's check: exams/parts_check.decodes_like_full, DECODE_ATOL)."""
    decodes_like_full(model, idx, plans)


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

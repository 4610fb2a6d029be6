"""Tiny corpora and specs for end-to-end tests (shared by the CLI, sweep and check tests)."""

from __future__ import annotations

import random
from pathlib import Path

WORDS = ("the model reads a token and predicts the next one while the norm keeps the scale steady "
         "and rope turns queries and keys by their position so attention sees distance").split()


def tiny_text(n_chars: int = 6000, seed: int = 0) -> str:
    """Deterministic pseudo-prose with markdown-ish structure; a few dozen distinct characters."""
    rng = random.Random(seed)
    out, size = [], 0
    while size < n_chars:
        line = " ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 12)))
        line = ("## " + line.title()) if rng.random() < 0.1 else line.capitalize() + "."
        out.append(line)
        size += len(line) + 1
    return "\n".join(out)[:n_chars]


def write_corpus(folder: Path, n_chars: int = 6000) -> Path:
    path = Path(folder) / "tiny.txt"
    path.write_text(tiny_text(n_chars), encoding="utf-8")
    return path


TINY_MODEL = {"d_model": 32, "n_layer": 2, "n_head": 4, "ctx_len": 16}
TINY_TRAIN = {"steps": 12, "batch_size": 4, "eval_interval": 6, "eval_batches": 2, "sample_len": 20,
              "warmup": 2, "lr": 3e-3}


def toml_value(v) -> str:
    if isinstance(v, str):
        return f'"{v}"'
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, dict):
        return "{ " + ", ".join(f'"{k}" = {toml_value(x)}' for k, x in v.items()) + " }"
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    return repr(v)


def write_spec(folder: Path, name: str = "toy", corpus: Path | None = None, top: dict | None = None,
               model: dict | None = None, train: dict | None = None) -> Path:
    """An ablation spec at toy sizes on the tiny corpus."""
    corpus = corpus or write_corpus(folder)
    lines = [f'name = "{name}"'] + [f"{k} = {toml_value(v)}" for k, v in (top or {}).items()]
    lines += ["[base.model]"] + [f"{k} = {toml_value(v)}" for k, v in {**TINY_MODEL, **(model or {})}.items()]
    lines += ["[base.train]"] + [f"{k} = {toml_value(v)}" for k, v in {**TINY_TRAIN, **(train or {})}.items()]
    lines += ["[base.data]", f'source = "{corpus}"']
    path = Path(folder) / f"{name}.toml"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path

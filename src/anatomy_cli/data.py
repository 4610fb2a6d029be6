"""Corpus -> text -> character vocabulary -> train/val ids -> batches.

Sources: a UTF-8 text file; a directory of .md/.txt files (sorted by path, YAML front matter
stripped, joined with a blank line); a directory written by `anatomy prepare`; or None, the
embedded default corpus. The split is contiguous (first 90% train, last 10% val) so validation
text is never seen in training, not even as overlapping windows.

Fairness: the training batch sequence depends only on (seed, data), through its own
torch.Generator, so every model config trained with one seed sees identical batches.
Validation uses fixed, evenly spaced windows that depend on nothing but the data.
"""

from __future__ import annotations

import hashlib
import json
from array import array
from collections import Counter
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from .runs import atomic_write_json

META, VOCAB_FILE, TRAIN_BIN, VAL_BIN = "meta.json", "vocab.json", "train.bin", "val.bin"
TEXT_SUFFIXES = (".md", ".txt")


class DataError(ValueError):
    """A corpus that cannot be used: missing, not UTF-8, empty, or too short."""


def default_corpus_path() -> Path:
    """corpus/anatomy.md: packaged into the wheel, or read from the checkout (editable install)."""
    packaged = resources.files("anatomy_cli") / "_corpus" / "anatomy.md"
    if packaged.is_file():
        return Path(str(packaged))
    return Path(__file__).resolve().parents[2] / "corpus" / "anatomy.md"


def strip_front_matter(text: str) -> str:
    """Drop a leading YAML block delimited by '---' lines (any line endings)."""
    text = text.replace("\r\n", "\n")
    if not text.startswith("---\n"):
        return text
    end = text.find("\n---\n", 4)
    if end == -1:
        return "" if text.rstrip("\n").endswith("\n---") else text
    return text[end + 5 :]


def read_text_file(path: Path) -> str:
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise DataError(f"corpus not found: {path}") from None
    except PermissionError:
        raise DataError(f"corpus not readable: {path}") from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise DataError(f"corpus is not UTF-8 text: {path} (invalid byte at offset {err.start})") from None


def read_source(source: str | Path | None) -> tuple[str, str]:
    """Return (text, description) for a file, a directory of .md/.txt files, or the default corpus."""
    if source is None:
        path = default_corpus_path()
        return read_text_file(path), f"default corpus ({path.name})"
    path = Path(source)
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in TEXT_SUFFIXES)
        if not files:
            raise DataError(f"no .md or .txt files in directory {path}")
        texts = [strip_front_matter(read_text_file(f)).strip("\n") for f in files]
        return "\n\n".join(texts), f"{len(files)} files under {path}"
    if not path.exists():
        raise DataError(f"corpus not found: {path}")
    return read_text_file(path), str(path)


class CharVocab:
    """Sorted unique characters; id = index. Saved as a JSON list of characters."""

    def __init__(self, chars: list[str]):
        self.chars = list(chars)
        self.index = {c: i for i, c in enumerate(self.chars)}

    @classmethod
    def from_text(cls, text: str) -> CharVocab:
        return cls(sorted(set(text)))

    def __len__(self) -> int:
        return len(self.chars)

    def missing(self, text: str) -> list[str]:
        return sorted({c for c in text if c not in self.index})

    def encode(self, text: str) -> list[int]:
        missing = self.missing(text)
        if missing:
            shown = ", ".join(repr(c) for c in missing[:10])
            raise DataError(f"characters not in the vocabulary: {shown}")
        return [self.index[c] for c in text]

    def decode(self, ids) -> str:
        return "".join(self.chars[i] for i in ids)

    def save(self, path: Path) -> None:
        atomic_write_json(path, self.chars)

    @classmethod
    def load(cls, path: Path) -> CharVocab:
        try:
            chars = json.loads(Path(path).read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise DataError(f"missing vocabulary file {path}") from None
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise DataError(f"corrupt vocabulary file {path}") from None
        if not isinstance(chars, list) or not all(isinstance(c, str) and len(c) == 1 for c in chars):
            raise DataError(f"corrupt vocabulary file {path}: expected a JSON list of characters")
        return cls(chars)


@dataclass
class Corpus:
    """Ids as compact arrays ('H' = uint16 when the vocabulary fits, else 'I')."""

    vocab: CharVocab
    train: array
    val: array
    meta: dict


def build_corpus(text: str, description: str, val_frac: float = 0.1, min_len: int = 1) -> Corpus:
    if not text.strip():
        raise DataError(f"corpus is empty: {description}")
    vocab = CharVocab.from_text(text)
    code = "H" if len(vocab) < 2**16 else "I"
    ids = array(code, (vocab.index[c] for c in text))
    n_val = int(len(ids) * val_frac)
    train, val = ids[: len(ids) - n_val], ids[len(ids) - n_val :]
    if min(len(train), len(val)) < min_len + 1:
        raise DataError(
            f"corpus too short: {len(text)} characters give {len(train)} train / {len(val)} val ids, "
            f"each split needs more than ctx_len={min_len}"
        )
    meta = {
        "source": description,
        "characters": len(text),
        "vocab_size": len(vocab),
        "train_ids": len(train),
        "val_ids": len(val),
        "val_frac": val_frac,
        "sha256": hashlib.sha256(text.encode("utf-8")).hexdigest(),
        "char_counts": dict(Counter(text).most_common()),
    }
    return Corpus(vocab, train, val, meta)


def save_corpus(corpus: Corpus, out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    corpus.vocab.save(out_dir / VOCAB_FILE)
    for name, ids in ((TRAIN_BIN, corpus.train), (VAL_BIN, corpus.val)):
        (out_dir / name).write_bytes(ids.tobytes())
    atomic_write_json(out_dir / META, {**corpus.meta, "dtype": corpus.train.typecode})  # last


def load_prepared(path: Path, min_len: int = 1) -> Corpus:
    try:
        meta = json.loads((path / META).read_text(encoding="utf-8"))
        vocab = CharVocab.load(path / VOCAB_FILE)
        arrays = []
        for name in (TRAIN_BIN, VAL_BIN):
            ids = array(meta["dtype"])
            ids.frombytes((path / name).read_bytes())
            arrays.append(ids)
    except (OSError, KeyError, ValueError, json.JSONDecodeError) as err:
        raise DataError(f"prepared data in {path} is incomplete or corrupt ({err.__class__.__name__})") from None
    if max(max(arrays[0], default=0), max(arrays[1], default=0)) >= len(vocab):
        raise DataError(f"prepared data in {path} has ids outside its vocabulary")
    if min(len(arrays[0]), len(arrays[1])) < min_len + 1:
        raise DataError(f"prepared data in {path} is too short for ctx_len={min_len}")
    return Corpus(vocab, arrays[0], arrays[1], meta)


def load_corpus(source: str | None, val_frac: float = 0.1, ctx_len: int = 1) -> Corpus:
    """A prepared directory is loaded as is; anything else is read and split now."""
    if source is not None and (Path(source) / META).is_file():
        return load_prepared(Path(source), ctx_len)
    text, description = read_source(source)
    return build_corpus(text, description, val_frac, ctx_len)


# ------------------------------------------------------------------------------- batches (torch)


def as_tensor(ids: array):
    """array of ids -> int64 tensor without a Python-level loop."""
    import numpy as np
    import torch

    return torch.from_numpy(np.frombuffer(ids, dtype=np.dtype(ids.typecode)).astype(np.int64))


class BatchSampler:
    """Random training windows from a generator seeded by the run seed alone."""

    def __init__(self, ids, batch_size: int, ctx_len: int, seed: int, device="cpu"):
        import torch

        self.torch = torch
        self.data = as_tensor(ids)
        self.batch_size, self.ctx_len, self.device = batch_size, ctx_len, torch.device(device)
        self.gen = torch.Generator().manual_seed(seed)

    def next(self):
        torch = self.torch
        starts = torch.randint(len(self.data) - self.ctx_len, (self.batch_size,), generator=self.gen)
        offsets = starts[:, None] + torch.arange(self.ctx_len + 1)  # [B, T + 1]
        window = self.data[offsets]
        x, y = window[:, :-1], window[:, 1:]  # [B, T] inputs and next-token targets
        from .devices import to_device

        return to_device(x, self.device), to_device(y, self.device)  # whatever the device: CUDA, MPS, CPU

    def state(self):
        return self.gen.get_state()

    def set_state(self, state) -> None:
        self.gen.set_state(state)


def fixed_windows(ids, batch_size: int, ctx_len: int, n_batches: int, device="cpu"):
    """n_batches of evenly spaced windows over `ids`: the same for every run and seed."""
    import torch

    data = as_tensor(ids)
    n = batch_size * n_batches
    last = len(data) - ctx_len - 1
    starts = torch.linspace(0, max(last, 0), n).long()
    offsets = starts[:, None] + torch.arange(ctx_len + 1)
    window = data[offsets].to(device)
    return [(w[:, :-1], w[:, 1:]) for w in window.split(batch_size)]

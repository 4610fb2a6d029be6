"""Corpus -> text -> character vocabulary -> train/val ids -> batches.

Sources: a UTF-8 text file; a directory of .md/.txt files (sorted by path, YAML front matter
stripped, joined with a blank line); a directory written by `anatomy prepare`; or None, the
embedded default corpus. The split is contiguous (first 90% train, last 10% val) so validation
text is never seen in training, not even as overlapping windows.

Fairness: the training batch sequence depends only on (seed, data), through its own
torch.Generator, so every model config trained with one seed sees identical batches.
Validation uses fixed, evenly spaced windows that depend on nothing but the data.

Memory: a text source is read in pieces of CHUNK_CHARS characters, twice (vocabulary, then ids),
so the text is never held whole; ids are kept in the smallest unsigned type that holds the
vocabulary (uint8 for up to 256 characters) and batches are gathered from them without an int64
copy of the corpus.
"""

from __future__ import annotations

import codecs
import hashlib
import json
from array import array
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from .runs import atomic_write_json
from .errors import InputError

META, VOCAB_FILE, TRAIN_BIN, VAL_BIN = "meta.json", "vocab.json", "train.bin", "val.bin"
TEXT_SUFFIXES = (".md", ".txt")
CHUNK_CHARS = 1 << 22  # characters (or bytes read) per piece: bounds the temporaries of a large corpus
ID_TYPES = ("B", "H", "I")  # array typecodes of uint8, uint16, uint32 ids: the first that holds the vocabulary

Pieces = Callable[[], Iterator[str]]  # each call yields the whole text again, in pieces


class DataError(InputError):
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


def iter_file_text(path: Path) -> Iterator[str]:
    """A UTF-8 file's text in pieces (never whole in memory), with read_text_file's errors."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    offset = 0  # bytes of the file handed to the decoder so far
    try:
        with open(path, "rb") as f:
            while True:
                block = f.read(CHUNK_CHARS)
                pending = len(decoder.getstate()[0])  # bytes of a character split across blocks
                try:
                    text = decoder.decode(block, final=not block)
                except UnicodeDecodeError as err:  # err.start counts from the pending bytes
                    raise DataError(f"corpus is not UTF-8 text: {path} "
                                    f"(invalid byte at offset {offset - pending + err.start})") from None
                offset += len(block)
                if text:
                    yield text
                if not block:
                    return
    except FileNotFoundError:
        raise DataError(f"corpus not found: {path}") from None
    except PermissionError:
        raise DataError(f"corpus not readable: {path}") from None


def text_pieces(source: str | Path | None) -> tuple[Pieces, str]:
    """(pieces, description) for a file, a directory of .md/.txt files, or the default corpus."""
    if source is None:
        path = default_corpus_path()
        return (lambda: iter_file_text(path)), f"default corpus ({path.name})"
    path = Path(source)
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in TEXT_SUFFIXES)
        if not files:
            raise DataError(f"no .md or .txt files in directory {path}")

        def pieces() -> Iterator[str]:  # front matter is per file: each file is read whole
            for i, f in enumerate(files):
                yield from ("\n\n" if i else "", strip_front_matter(read_text_file(f)).strip("\n"))

        return pieces, f"{len(files)} files under {path}"
    if not path.exists():
        raise DataError(f"corpus not found: {path}")
    if not path.is_file():  # /dev/zero, a FIFO: would be read forever
        raise DataError(f"corpus is not a regular file: {path}")
    return (lambda: iter_file_text(path)), str(path)


def read_source(source: str | Path | None) -> tuple[str, str]:
    """Return (text, description) for a file, a directory of .md/.txt files, or the default corpus."""
    pieces, description = text_pieces(source)
    return "".join(pieces()), description


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
    """Ids as compact arrays: typecode 'B' (uint8), 'H' (uint16) or 'I' (uint32), the smallest that fits."""

    vocab: CharVocab
    train: array
    val: array
    meta: dict


def id_typecode(vocab_size: int) -> str:
    return next(code for code in ID_TYPES if vocab_size <= 1 << (8 * array(code).itemsize))


def build_corpus(text: str, description: str, val_frac: float = 0.1, min_len: int = 1) -> Corpus:
    def pieces() -> Iterator[str]:
        return (text[i : i + CHUNK_CHARS] for i in range(0, len(text), CHUNK_CHARS))

    return build_from_pieces(pieces, description, val_frac, min_len)


def corpus_from_source(source: str | Path | None, val_frac: float = 0.1, min_len: int = 1) -> Corpus:
    """Read and split a text source (file, directory, default) without holding its text whole."""
    pieces, description = text_pieces(source)
    return build_from_pieces(pieces, description, val_frac, min_len)


def build_from_pieces(pieces: Pieces, description: str, val_frac: float = 0.1, min_len: int = 1) -> Corpus:
    """Two passes over the text: characters (vocabulary, length, hash), then ids straight into the splits."""
    first_seen: dict[str, None] = {}  # characters in order of first occurrence (ties of char_counts)
    n_chars, blank, digest = 0, True, hashlib.sha256()
    for piece in pieces():
        n_chars += len(piece)
        blank = blank and (not piece or piece.isspace())
        digest.update(piece.encode("utf-8"))
        first_seen.update((c, None) for c in sorted(set(piece).difference(first_seen), key=piece.index))
    if blank:
        raise DataError(f"corpus is empty: {description}")
    vocab = CharVocab(sorted(first_seen))
    n_val = int(n_chars * val_frac)
    n_train = n_chars - n_val
    if min(n_train, n_val) < min_len + 1:
        raise DataError(
            f"corpus too short: {n_chars} characters give {n_train} train / {n_val} val ids, "
            f"each split needs more than ctx_len={min_len}"
        )
    train, val, counts = _encode(pieces, vocab, n_train)
    meta = {
        "source": description,
        "characters": n_chars,
        "vocab_size": len(vocab),
        "train_ids": len(train),
        "val_ids": len(val),
        "val_frac": val_frac,
        "sha256": digest.hexdigest(),
        # most common first, ties in order of first occurrence (as collections.Counter.most_common)
        "char_counts": {c: counts[c] for c in sorted(first_seen, key=lambda c: -counts[c])},
    }
    return Corpus(vocab, train, val, meta)


def _encode(pieces: Pieces, vocab: CharVocab, n_train: int) -> tuple[array, array, dict[str, int]]:
    """(train ids, val ids, count per character): each piece's code points through a lookup table."""
    import numpy as np

    code = id_typecode(len(vocab))
    points = np.array([ord(c) for c in vocab.chars], dtype=np.int64)
    table = np.zeros(int(points.max()) + 1, dtype=np.dtype(code))  # code point -> id
    table[points] = np.arange(len(vocab))
    train, val, counts = array(code), array(code), np.zeros(len(vocab), dtype=np.int64)
    for piece in pieces():
        ids = table[np.frombuffer(piece.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)]
        counts += np.bincount(ids, minlength=len(vocab))
        room = n_train - len(train)
        train.frombytes(ids[:room].view(np.uint8))  # array.frombytes takes only a byte-typed buffer
        val.frombytes(ids[room:].view(np.uint8))
    return train, val, dict(zip(vocab.chars, counts.tolist()))


def save_corpus(corpus: Corpus, out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    corpus.vocab.save(out_dir / VOCAB_FILE)
    for name, ids in ((TRAIN_BIN, corpus.train), (VAL_BIN, corpus.val)):
        with open(out_dir / name, "wb") as f:
            ids.tofile(f)  # in blocks: no second copy of the ids as bytes
    atomic_write_json(out_dir / META, {**corpus.meta, "dtype": corpus.train.typecode})  # last


def _read_ids(path: Path, code: str) -> array:
    """A .bin file read straight into an id array (no intermediate bytes object)."""
    itemsize = array(code).itemsize
    size = path.stat().st_size
    if size % itemsize:
        raise ValueError(f"{path.name} is not a whole number of ids")
    ids = array(code, [0]) * (size // itemsize)
    with open(path, "rb") as f:
        if f.readinto(memoryview(ids).cast("B")) != size:
            raise ValueError(f"{path.name} changed while read")
    return ids


def load_prepared(path: Path, min_len: int = 1) -> Corpus:
    try:
        meta = json.loads((path / META).read_text(encoding="utf-8"))
        vocab = CharVocab.load(path / VOCAB_FILE)
        if not isinstance(meta, dict) or meta.get("dtype") not in ID_TYPES:
            raise ValueError("meta.json needs a dtype of B, H or I")
        arrays = [_read_ids(path / name, meta["dtype"]) for name in (TRAIN_BIN, VAL_BIN)]
    except (OSError, KeyError, ValueError, json.JSONDecodeError) as err:
        raise DataError(f"prepared data in {path} is incomplete or corrupt ({err.__class__.__name__})") from None
    if any(len(ids) and int(as_numpy(ids).max()) >= len(vocab) for ids in arrays):
        raise DataError(f"prepared data in {path} has ids outside its vocabulary")
    if min(len(arrays[0]), len(arrays[1])) < min_len + 1:
        raise DataError(f"prepared data in {path} is too short for ctx_len={min_len}")
    return Corpus(vocab, arrays[0], arrays[1], meta)


def load_corpus(source: str | None, val_frac: float = 0.1, ctx_len: int = 1) -> Corpus:
    """A prepared directory is loaded as is; anything else is read and split now."""
    if source is not None and (Path(source) / META).is_file():
        return load_prepared(Path(source), ctx_len)
    return corpus_from_source(source, val_frac, ctx_len)


# ------------------------------------------------------------------------------- batches (torch)


def as_numpy(ids):
    """A zero-copy numpy view of an id array in its own compact dtype."""
    import numpy as np

    return ids if isinstance(ids, np.ndarray) else np.frombuffer(ids, dtype=np.dtype(ids.typecode))


def gather(data, starts, length: int):
    """[N] start positions -> [N, length] int64 windows of `data`, widened only here (never the corpus)."""
    import numpy as np
    import torch

    offsets = starts[:, None] + torch.arange(length)  # [N, length]
    return torch.from_numpy(data[offsets.numpy()].astype(np.int64))


class BatchSampler:
    """Random training windows from a generator seeded by the run seed alone."""

    def __init__(self, ids, batch_size: int, ctx_len: int, seed: int, device="cpu"):
        import torch

        self.torch = torch
        self.data = as_numpy(ids)
        self.batch_size, self.ctx_len, self.device = batch_size, ctx_len, torch.device(device)
        self.gen = torch.Generator().manual_seed(seed)

    def next(self):
        torch = self.torch
        starts = torch.randint(len(self.data) - self.ctx_len, (self.batch_size,), generator=self.gen)
        window = gather(self.data, starts, self.ctx_len + 1)  # [B, T + 1]
        x, y = window[:, :-1], window[:, 1:]  # [B, T] inputs and next-token targets
        from .devices import to_device

        return to_device(x, self.device), to_device(y, self.device)  # whatever the device: CUDA, MPS, CPU

    def state(self):
        return self.gen.get_state()

    def set_state(self, state) -> None:
        self.gen.set_state(state)


def window_starts(n_ids: int, ctx_len: int, n: int):
    """n evenly spaced starts of (ctx_len + 1)-id windows over n_ids ids, as a LongTensor.

    float32 linspace, as the windows have always been placed (so validation sets do not move), then
    clamped: past 2^24 a float32 cannot hold every integer and the last start could round up past
    the end of the data.
    """
    import torch

    last = max(n_ids - ctx_len - 1, 0)
    return torch.linspace(0, last, n).long().clamp_(max=last)


def fixed_windows(ids, batch_size: int, ctx_len: int, n_batches: int, device="cpu"):
    """n_batches of evenly spaced windows over `ids`: the same for every run and seed."""
    data = as_numpy(ids)
    window = gather(data, window_starts(len(data), ctx_len, batch_size * n_batches), ctx_len + 1).to(device)
    return [(w[:, :-1], w[:, 1:]) for w in window.split(batch_size)]

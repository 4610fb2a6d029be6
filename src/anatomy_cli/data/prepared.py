"""Prepared corpus folders: `anatomy prepare` writes them, training loads them, and a fingerprint
ties their files to their meta.json.

A folder holds train.bin and val.bin (ids in meta.json's dtype), vocab.json and meta.json, written
last. meta.json's "fingerprint" records the size and sha256 of each of the three files: of the
whole file up to FULL_HASH_BYTES, else of SAMPLE_BLOCKS evenly spaced blocks, so that checking a
file of gigabytes costs a few milliseconds. Every load checks it (from the bytes it reads anyway),
so an edited file is refused by name instead of trained on; a run records it in its summary
(corpus_files) and a resume refuses a folder whose files differ from the ones it started on.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from array import array
from collections.abc import Callable
from pathlib import Path

from anatomy_cli.data.batches import as_numpy
from anatomy_cli.data.corpus import (
    CHUNK_CHARS,
    ID_TYPES,
    META,
    TRAIN_BIN,
    VAL_BIN,
    VOCAB_FILE,
    CharVocab,
    Corpus,
    DataError,
    Progress,
    Source,
    encode_source,
    id_typecode,
)
from anatomy_cli.store.runs import atomic_write_json, normal_mode

FULL_HASH_BYTES = 1 << 26  # a file up to 64 MiB is hashed whole; a larger one ...
SAMPLE_BLOCKS, SAMPLE_BYTES = 4097, 4096  # ... in 4097 evenly spaced 4 KiB blocks (first, middle, last)
PREPARED_FILES = (TRAIN_BIN, VAL_BIN, VOCAB_FILE)  # what the fingerprint covers


def prepare(src: Source, out: Path, val_frac: float = 0.1, min_len: int = 1, max_chars: int | None = None,
            progress: Progress | None = None) -> dict:
    """Write `src` as a prepared folder and return its meta.json; nothing of it is held whole in memory.

    The ids go straight into temporary files in `out`, renamed into place once both splits are
    complete, and meta.json comes last, so the folder reads as prepared only when its files are. A
    stream (hf:) is spooled to `out` on the first pass and removed after the second.
    """
    out, temps = Path(out), []
    created = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    try:
        spool = _temp(out, ".jsonl", temps) if src.once else None
        bins = [_temp(out, ".bin", temps) for _ in (TRAIN_BIN, VAL_BIN)]
        with open(bins[0], "wb") as train, open(bins[1], "wb") as val:
            vocab, meta = encode_source(src, lambda code: (train.write, val.write), val_frac, min_len,
                                        max_chars, progress, spool)
        (out / META).unlink(missing_ok=True)  # not a prepared corpus again until its new meta.json
        for temp, name in zip(bins, (TRAIN_BIN, VAL_BIN)):
            os.replace(temp, out / name)
        vocab.save(out / VOCAB_FILE)
        return _write_meta(out, meta, id_typecode(len(vocab)))
    finally:
        for temp in temps:
            temp.unlink(missing_ok=True)
        if created and not (out / META).is_file():  # a failure leaves no empty folder behind
            with contextlib.suppress(OSError):
                out.rmdir()


def _temp(folder: Path, suffix: str, temps: list[Path]) -> Path:
    fd, name = tempfile.mkstemp(dir=folder, prefix=".prepare-", suffix=suffix)
    normal_mode(fd)
    os.close(fd)
    temps.append(Path(name))
    return temps[-1]


def fingerprint(size: int, read: Callable[[int, int], bytes]) -> dict:
    """Size and sha256 of `size` bytes read by read(offset, n): all of them up to FULL_HASH_BYTES,
    else SAMPLE_BLOCKS blocks of SAMPLE_BYTES at evenly spaced offsets, the first, the middle and
    the last block included (a same-size edit between blocks is not seen; one in them is)."""
    digest = hashlib.sha256()
    if size <= FULL_HASH_BYTES:
        offsets, n, hashed = range(0, size, CHUNK_CHARS), CHUNK_CHARS, "all"
    else:
        last = size - SAMPLE_BYTES
        offsets = (last * i // (SAMPLE_BLOCKS - 1) for i in range(SAMPLE_BLOCKS))
        n, hashed = SAMPLE_BYTES, f"{SAMPLE_BLOCKS} blocks of {SAMPLE_BYTES} bytes"
    for offset in offsets:
        digest.update(read(offset, n))
    return {"bytes": size, "sha256": digest.hexdigest(), "hashed": hashed}


def buffer_fingerprint(buf) -> dict:
    view = memoryview(buf).cast("B")
    return fingerprint(len(view), lambda offset, n: view[offset : offset + n])


def file_fingerprint(path: Path) -> dict:
    with open(path, "rb") as f:

        def read(offset: int, n: int) -> bytes:
            f.seek(offset)
            return f.read(n)

        return fingerprint(os.fstat(f.fileno()).st_size, read)


def changed_file(was: dict | None, now: dict | None) -> str | None:
    """The first prepared file whose fingerprint differs between two records (None: same, or unknown)."""
    return next((name for name in PREPARED_FILES if (was or {}).get(name) and (now or {}).get(name)
                 and was[name] != now[name]), None)


def save_corpus(corpus: Corpus, out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    corpus.vocab.save(out_dir / VOCAB_FILE)
    for name, ids in ((TRAIN_BIN, corpus.train), (VAL_BIN, corpus.val)):
        with open(out_dir / name, "wb") as f:
            ids.tofile(f)  # in blocks: no second copy of the ids as bytes
    _write_meta(out_dir, corpus.meta, corpus.train.typecode)


def _write_meta(out: Path, meta: dict, code: str) -> dict:
    prints = {name: file_fingerprint(out / name) for name in PREPARED_FILES}
    meta = {**meta, "dtype": code, "fingerprint": prints}
    atomic_write_json(out / META, meta)  # last
    return meta


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
    """A prepared folder, its files checked against meta.json's fingerprint (older folders have none)."""
    corrupt = (OSError, KeyError, ValueError, json.JSONDecodeError)
    try:
        meta = json.loads((path / META).read_text(encoding="utf-8"))
        vocab = CharVocab.load(path / VOCAB_FILE)
        if not isinstance(meta, dict) or meta.get("dtype") not in ID_TYPES:
            raise ValueError("meta.json needs a dtype of B, H or I")
        recorded = meta.get("fingerprint")
        if recorded is not None and not (isinstance(recorded, dict) and all(
                isinstance(recorded.get(name), dict) for name in PREPARED_FILES)):
            raise ValueError("meta.json's fingerprint needs train.bin, val.bin and vocab.json")
    except corrupt as err:
        raise _corrupt(path, err) from None
    _check_sizes(path, recorded)
    try:
        arrays = [_read_ids(path / name, meta["dtype"]) for name in (TRAIN_BIN, VAL_BIN)]
        now = {TRAIN_BIN: buffer_fingerprint(arrays[0]), VAL_BIN: buffer_fingerprint(arrays[1]),
               VOCAB_FILE: buffer_fingerprint((path / VOCAB_FILE).read_bytes())}
    except corrupt as err:
        raise _corrupt(path, err) from None
    name = changed_file(recorded, now)
    if name is not None:
        raise DataError(f"{path / name} changed since it was prepared (its sha256 is not the one meta.json "
                        f"records); prepare the corpus again")
    if any(len(ids) and int(as_numpy(ids).max()) >= len(vocab) for ids in arrays):
        raise DataError(f"prepared data in {path} has ids outside its vocabulary")
    if min(len(arrays[0]), len(arrays[1])) < min_len + 1:
        raise DataError(f"prepared data in {path} is too short for ctx_len={min_len}")
    return Corpus(vocab, arrays[0], arrays[1], {**meta, "fingerprint": now})


def _corrupt(path: Path, err: Exception) -> DataError:
    return DataError(f"prepared data in {path} is incomplete or corrupt ({err.__class__.__name__})")


def _check_sizes(path: Path, recorded: dict | None) -> None:
    """Compare sizes before reading: an edit that adds or drops bytes is named without hashing anything."""
    for name in PREPARED_FILES if recorded else ():
        file = path / name
        size = file.stat().st_size if file.is_file() else None  # a missing file: incomplete, below
        if size is not None and size != recorded[name].get("bytes"):
            raise DataError(f"{file} changed since it was prepared ({size:,} bytes; meta.json records "
                            f"{recorded[name].get('bytes')}); prepare the corpus again")



"""Prepared corpus folders: `anatomy prepare` writes them, training loads them, and a fingerprint
ties their files to their meta.json.

A folder holds train.bin and val.bin (ids in meta.json's dtype, flat little-endian), its vocabulary
(vocab.json for char; tokenizer.json for any other tokenizer) and meta.json, written last. meta.json's
"fingerprint" records the size and sha256 of each of the three files: of the whole file up to
FULL_HASH_BYTES, else of SAMPLE_BLOCKS evenly spaced blocks, so that checking a file of gigabytes costs
a few milliseconds. Every load checks it, so an edited file (a tokenizer.json too) is refused by name
instead of trained on; a run records it in its summary (corpus_files) and a resume refuses a folder
whose files differ from the ones it started on.

nanoGPT's layout. A tokenizer folder's ids are uint16 (uint32 past 65,536 tokens) and it holds
meta.pkl, {"vocab_size": V, "dtype": "uint16"}: nanoGPT's training script reads train.bin/val.bin with
np.memmap(dtype=np.uint16) and its vocab_size from meta.pkl, so it trains on the folder as it is. A char
folder is as it always was (uint8 ids up to 256 characters, no meta.pkl: its fingerprint and the ids of
the runs on it stay); one of more than 256 characters is uint16 and reads the same way.

Loading maps the id files (np.memmap), never reads them whole: a corpus larger than memory trains, and
the pages a run touches are the page cache's to drop.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import pickle
import tempfile
import weakref
from array import array
from collections.abc import Callable
from pathlib import Path

from anatomy_cli.data.corpus import (
    CHUNK_CHARS,
    ID_TYPES,
    META,
    TRAIN_BIN,
    VAL_BIN,
    VOCAB_FILE,
    Corpus,
    DataError,
    Progress,
    Source,
    encode_source,
    id_blocks,
    id_typecode,
    token_typecode,
)
from anatomy_cli.data.tokenizer import TOKENIZER_FILE, Tokens, load_saved, vocab_maker
from anatomy_cli.store import runs
from anatomy_cli.store.runs import atomic_write_json, normal_mode

FULL_HASH_BYTES = 1 << 26  # a file up to 64 MiB is hashed whole; a larger one ...
SAMPLE_BLOCKS, SAMPLE_BYTES = 4097, 4096  # ... in 4097 evenly spaced 4 KiB blocks (first, middle, last)
PREPARED_FILES = (TRAIN_BIN, VAL_BIN, VOCAB_FILE)  # what the fingerprint covers (a char folder)
TOKEN_FILES = (TRAIN_BIN, VAL_BIN, TOKENIZER_FILE)  # ... and a folder of another tokenizer's ids
NANOGPT_META = "meta.pkl"  # nanoGPT's meta file: {"vocab_size": V, "dtype": "uint16"}
WRITTEN = (*PREPARED_FILES, TOKENIZER_FILE, NANOGPT_META, META)  # every file prepare writes


def read_meta(folder: Path) -> dict | None:
    """A prepared folder's meta.json, or None (no folder, no meta.json, not a JSON object)."""
    try:
        meta = json.loads((Path(folder) / META).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) else None


def folder_tokenizer(folder: Path) -> str | None:
    """The tokenizer spec a prepared folder was written with ("char" for one without the key), or None
    for a folder that is not prepared (or whose meta.json cannot be read)."""
    meta = read_meta(folder)
    return None if meta is None else meta.get("tokenizer", "char")


def check_rewrite(out: Path, tokenizer: str) -> None:
    """Refuse to prepare `out` again with another tokenizer than its own: its ids would go, and the runs
    trained on it would see other data. The same tokenizer (a fresh prepare) may replace it."""
    was = folder_tokenizer(out)
    if was is not None and was != tokenizer:
        raise DataError(f"{out} is a corpus prepared with {was}; prepare {tokenizer} into another folder "
                        f"(--out), or remove {out} first")


def prepare(src: Source, out: Path, val_frac: float = 0.1, min_len: int = 1, max_chars: int | None = None,
            progress: Progress | None = None, tokenizer: str = "char") -> dict:
    """Write `src` as a prepared folder and return its meta.json; nothing of it is held whole in memory.

    The ids go straight into temporary files in `out`, renamed into place once both splits are
    complete, and meta.json comes last, so the folder reads as prepared only when its files are. A
    stream (hf:) is spooled to `out` on the first pass and removed after the second. tokenizer: a
    data.tokenizer spec (char: the folder as it always was; else tokenizer.json, meta.pkl, uint16 ids).
    """
    out, temps = Path(out), []
    check_rewrite(out, tokenizer)
    maker = vocab_maker(tokenizer)
    created = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    try:
        spool = _temp(out, ".jsonl", temps) if src.once else None
        bins = [_temp(out, ".bin", temps) for _ in (TRAIN_BIN, VAL_BIN)]
        with open(bins[0], "wb") as train, open(bins[1], "wb") as val:
            files = ((train, out / TRAIN_BIN), (val, out / VAL_BIN))
            vocab, meta = encode_source(src, lambda code: tuple(_named(f.write, path) for f, path in files),
                                        val_frac, min_len, max_chars, progress, spool, maker)
            for f, path in files:  # what is still buffered, before close() could fail naming no file
                with runs.writing(path):
                    f.flush()
        (out / META).unlink(missing_ok=True)  # not a prepared corpus again until its new meta.json
        for name in (VOCAB_FILE, TOKENIZER_FILE, NANOGPT_META):  # the other kind's, or a stale one
            (out / name).unlink(missing_ok=True)
        for temp, name in zip(bins, (TRAIN_BIN, VAL_BIN)):
            os.replace(temp, out / name)
        vocab.save(out / vocab.file)
        if maker is None:
            return _write_meta(out, meta, id_typecode(len(vocab)))
        code = token_typecode(len(vocab))
        if code == "H":  # nanoGPT reads uint16 only; a uint32 folder says its dtype in meta.json
            _nanogpt_meta(out, len(vocab))
        return _write_meta(out, meta, code, TOKEN_FILES)
    finally:
        for temp in temps:
            temp.unlink(missing_ok=True)
        if created and not (out / META).is_file():  # a failure leaves no empty folder behind
            with contextlib.suppress(OSError):
                out.rmdir()


def _named(write: Callable[[bytes], int], path: Path) -> Callable[[bytes], int]:
    """write(), whose failure (a full disk) names `path`, the file its temp copy becomes, not the temp."""

    def named(data: bytes) -> int:
        with runs.writing(path):
            return write(data)

    return named


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
    return next((name for name in (*PREPARED_FILES, TOKENIZER_FILE) if (was or {}).get(name)
                 and (now or {}).get(name) and was[name] != now[name]), None)


def save_corpus(corpus: Corpus, out_dir: Path) -> None:
    """A corpus in memory (or memmapped) written as a prepared folder of its own kind."""
    out_dir.mkdir(parents=True, exist_ok=True)
    corpus.vocab.save(out_dir / corpus.vocab.file)
    for name, ids in ((TRAIN_BIN, corpus.train), (VAL_BIN, corpus.val)):
        with open(out_dir / name, "wb") as f:
            ids.tofile(f)  # in blocks: no second copy of the ids as bytes
    code = corpus.train.typecode if isinstance(corpus.train, array) else corpus.train.dtype.char
    files = PREPARED_FILES if corpus.vocab.file == VOCAB_FILE else TOKEN_FILES
    if files == TOKEN_FILES and code == "H":
        _nanogpt_meta(out_dir, len(corpus.vocab))
    _write_meta(out_dir, corpus.meta, code, files)


def _nanogpt_meta(out: Path, vocab_size: int) -> None:
    """meta.pkl, as nanoGPT's prepare scripts write it (its training script reads vocab_size)."""
    runs.atomic_write_bytes(out / NANOGPT_META, pickle.dumps({"vocab_size": vocab_size, "dtype": "uint16"}))


def _write_meta(out: Path, meta: dict, code: str, files: tuple[str, ...] = PREPARED_FILES) -> dict:
    prints = {name: file_fingerprint(out / name) for name in files}
    meta = {**meta, "dtype": code, "fingerprint": prints}
    atomic_write_json(out / META, meta)  # last
    return meta


def ids_dtype(code: str):
    """The numpy dtype of a folder's ids: its meta.json dtype (an array typecode), little-endian."""
    import numpy as np

    return np.dtype(code).newbyteorder("<")


def map_ids(path: Path, code: str):
    """A .bin file as a read-only np.memmap of its ids (nothing read until a batch touches it). The map
    keeps the file open as `.fd` (closed with the map): a new map of it (batches.fresh_map) and a block
    read of it (corpus.id_blocks) see this very file, even once `prepare` has put another in its place."""

    itemsize = array(code).itemsize
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        if size % itemsize or size == 0:
            raise ValueError(f"{path.name} is {'empty' if size == 0 else 'not a whole number of ids'}")
        ids = open_map(fd, ids_dtype(code), 0, (size // itemsize,))
    except BaseException:
        os.close(fd)
        raise
    ids.fd = fd
    weakref.finalize(ids, os.close, fd)
    return ids


def open_map(fd: int, dtype, offset: int, shape: tuple[int, ...]):
    """A read-only np.memmap of an open file descriptor (the map holds its own duplicate of it)."""
    import numpy as np

    with open(fd, "rb", closefd=False) as f:
        return np.memmap(f, dtype=dtype, mode="r", offset=offset, shape=shape)


def max_id(ids) -> int:
    """The largest id of a memmapped split, read from its file a block at a time (corpus.id_blocks)."""
    return max((int(block.max()) for block in id_blocks(ids) if len(block)), default=-1)


def load_prepared(path: Path, min_len: int = 1, tokenizer: str | None = None) -> Corpus:
    """A prepared folder, its files checked against meta.json's fingerprint (older folders have none),
    its ids memmapped. tokenizer: the spec a run names (data.tokenizer); a folder of another is refused."""
    corrupt = (OSError, KeyError, ValueError, json.JSONDecodeError)
    try:
        meta = json.loads((path / META).read_text(encoding="utf-8"))
        if not isinstance(meta, dict) or meta.get("dtype") not in ID_TYPES:
            raise ValueError("meta.json needs a dtype of B, H or I")
        files = PREPARED_FILES if meta.get("tokenizer", "char") == "char" else TOKEN_FILES
        recorded = meta.get("fingerprint")
        if recorded is not None and not (isinstance(recorded, dict) and all(
                isinstance(recorded.get(name), dict) for name in files)):
            raise ValueError(f"meta.json's fingerprint needs {', '.join(files)}")
    except corrupt as err:
        raise _corrupt(path, err) from None
    check_tokenizer(path, meta, tokenizer)
    _check_sizes(path, recorded, files)
    try:
        now = {name: file_fingerprint(path / name) for name in files}
    except corrupt as err:
        raise _corrupt(path, err) from None
    name = changed_file(recorded, now)
    if name is not None:
        raise DataError(f"{path / name} changed since it was prepared (its sha256 is not the one meta.json "
                        f"records); prepare the corpus again")
    try:
        vocab = load_saved(path, meta)
        arrays = [map_ids(path / name, meta["dtype"]) for name in (TRAIN_BIN, VAL_BIN)]
        top = max(max_id(ids) for ids in arrays)
    except corrupt as err:
        raise _corrupt(path, err) from None
    if top >= len(vocab):
        raise DataError(f"prepared data in {path} has ids outside its vocabulary")
    if min(len(arrays[0]), len(arrays[1])) < min_len + 1:
        raise DataError(f"prepared data in {path} is too short for ctx_len={min_len}")
    return Corpus(vocab, arrays[0], arrays[1], {**meta, "fingerprint": now})


def check_tokenizer(path: Path, meta: dict, tokenizer: str | None) -> None:
    """A run names the tokenizer it trains with (data.tokenizer); a prepared folder holds the ids of one
    (meta.json's tokenizer, "char" when absent). Another is refused, naming the setting that trains on
    the folder: the run's config (and id) must say what it trains on. A path names the folder's tokenizer
    when its tokenizer.json is the one the folder was prepared with (the same sha256), wherever it lies."""
    was = meta.get("tokenizer", "char")
    if tokenizer is None or tokenizer == was:
        return
    if tokenizer != "char" and not tokenizer.startswith(("bpe:", "hf:")):
        if Tokens.load(Path(tokenizer), tokenizer).sha256 == meta.get("tokenizer_sha256"):
            return
    raise DataError(f"{path} holds the ids of the tokenizer {was}, not {tokenizer}: train on it with "
                    f"--set data.tokenizer={was} (data.tokenizer in a spec), or prepare the corpus with {tokenizer}")


def _corrupt(path: Path, err: Exception) -> DataError:
    return DataError(f"prepared data in {path} is incomplete or corrupt ({err.__class__.__name__})")


def _check_sizes(path: Path, recorded: dict | None, files: tuple[str, ...] = PREPARED_FILES) -> None:
    """Compare sizes before reading: an edit that adds or drops bytes is named without hashing anything."""
    for name in files if recorded else ():
        file = path / name
        size = file.stat().st_size if file.is_file() else None  # a missing file: incomplete, below
        if size is not None and size != recorded[name].get("bytes"):
            raise DataError(f"{file} changed since it was prepared ({size:,} bytes; meta.json records "
                            f"{recorded[name].get('bytes')}); prepare the corpus again")



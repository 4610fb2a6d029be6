"""Corpus -> text -> vocabulary (characters, or a tokenizer) -> train/val ids -> batches.

Sources: a UTF-8 text file; a directory of .md/.txt files (sorted by path, YAML front matter
stripped, joined with DOC_SEP); a directory written by `anatomy prepare`; None, the embedded default
corpus; or a document source (sources.py: a .jsonl or .parquet file, a `datasets` save_to_disk
folder, hf:NAME), whose documents are joined with DOC_SEP.

Splits. A text source is split contiguously (first 90% train, last 10% val) so validation text is
never seen in training, not even as overlapping windows. A document source is split by whole
documents (split_documents): the last documents go to validation, never a part of one.

Fairness: the training batch sequence depends only on (seed, data), through its own
torch.Generator, so every model config trained with one seed sees identical batches.
Validation uses fixed, evenly spaced windows that depend on nothing but the data.

Memory: a source is read in pieces of CHUNK_CHARS characters, twice (vocabulary, then ids), so the
text is never held whole; `prepare` writes the ids straight to its files, so its memory does not
grow with the corpus (a network stream, which cannot be read twice, is spooled to disk on the first
pass). Ids are kept in the smallest unsigned type that holds the vocabulary (uint8 for up to 256
characters) and batches are gathered from them without an int64 copy of the corpus.
Prepared folders (writing, loading, fingerprints) are prepared.py's.

Tokenizers. The char vocabulary (CharVocab) is learned by pass one. Any other (data.tokenizer: bpe:N, a
tokenizer.json, hf:NAME; data/tokenizer.py) is made between the passes: a BPE is trained on the train
split's text alone (read up to the split, never past it), then pass two encodes both splits with it.
Its ids are uint16 up to 65,536 tokens, else uint32 (token_typecode: nanoGPT's dtype, never uint8)."""

from __future__ import annotations

import codecs
import contextlib
import hashlib
import itertools
import json
import os
from array import array
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from anatomy_cli.spec.errors import InputError
from anatomy_cli.store.runs import atomic_write_json

META, VOCAB_FILE, TRAIN_BIN, VAL_BIN = "meta.json", "vocab.json", "train.bin", "val.bin"
TEXT_SUFFIXES = (".md", ".txt")
DOC_SEP = "\n\n"  # joins the files of a folder and the documents of a dataset
CHUNK_CHARS = 1 << 22  # characters (or bytes read) per piece: bounds the temporaries of a large corpus
ID_TYPES = ("B", "H", "I")  # array typecodes of uint8, uint16, uint32 ids: the first that holds the vocabulary

Pieces = Callable[[], Iterator[str]]  # each call yields the whole text (or every document) again, in pieces
# A tokenizer other than char, made from the train split: Maker(train_pieces) -> a vocabulary (data/tokenizer.py)
Maker = Callable[[Pieces], object]
Progress = Callable[[dict], None]  # {"phase": "read" | "encode", "chars", "documents", "total"}


class DataError(InputError):
    """A corpus that cannot be used: missing, not UTF-8, empty, too short, changed, or badly formed."""


@dataclass
class Source:
    """Where a corpus comes from: `pieces` of one text (split contiguously) or `docs`, one string per
    document (split by documents); exactly one is set."""

    description: str
    pieces: Pieces | None = None
    docs: Pieces | None = None
    meta: dict = field(default_factory=dict)  # what meta.json records about a document source (field, split)
    once: bool = False  # a network stream: read once, so prepare spools it for the second pass


def default_corpus_path() -> Path:
    """corpus/anatomy.md: packaged into the wheel, or read from the checkout (editable install)."""
    packaged = resources.files("anatomy_cli") / "_corpus" / "anatomy.md"
    if packaged.is_file():
        return Path(str(packaged))
    return Path(__file__).resolve().parents[3] / "corpus" / "anatomy.md"


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
    except OSError as err:  # a read error of the disk, a path that turned into a folder
        raise DataError(f"cannot read {path} ({err.strerror or err.__class__.__name__})") from None
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
    except OSError as err:
        raise DataError(f"cannot read {path} at byte offset {offset:,} ({err.strerror or err.__class__.__name__})") \
            from None


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
                yield from (DOC_SEP if i else "", strip_front_matter(read_text_file(f)).strip("\n"))

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
    """Sorted unique characters; id = index. Saved as a JSON list of characters. The interface every
    vocabulary has (data/tokenizer.py): spec, file, len, encode, decode, token_bytes, save."""

    spec, file = "char", VOCAB_FILE

    def __init__(self, chars: list[str]):
        self.chars = list(chars)
        self.index = {c: i for i, c in enumerate(self.chars)}

    def token_bytes(self):
        """[V] int64: each character's UTF-8 bytes (a Chinese character is 3, not 1)."""
        import numpy as np

        return np.array([len(c.encode("utf-8")) for c in self.chars], dtype=np.int64)

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
    """Ids as compact arrays: typecode 'B' (uint8), 'H' (uint16) or 'I' (uint32), the smallest that fits
    (a tokenizer's: uint16 or uint32), or, for a prepared folder, read-only np.memmaps of its files. vocab:
    a CharVocab or a tokenizer with its interface (data/tokenizer.py)."""

    vocab: CharVocab
    train: array
    val: array
    meta: dict


COUNT_IDS = 1 << 20  # ids counted at a time: np.bincount widens what it counts to int64 (8 bytes an id)


def id_blocks(ids, n: int = COUNT_IDS) -> Iterator:
    """An id array's ids as numpy blocks of at most n: slices of an array in memory; a memmap's read from
    its file (np.fromfile), not through the map, whose pages would stay resident in this process."""
    import numpy as np

    fd = getattr(ids, "fd", None)  # a prepared split's open file (prepared.map_ids)
    if isinstance(ids, np.memmap) and fd is not None:
        for start in range(0, len(ids), n):
            count = min(n, len(ids) - start)
            raw = os.pread(fd, count * ids.itemsize, ids.offset + start * ids.itemsize)
            yield np.frombuffer(raw, dtype=ids.dtype)
        return
    view = ids if isinstance(ids, np.ndarray) else np.frombuffer(ids, dtype=np.dtype(ids.typecode))
    for start in range(0, len(view), n):
        yield view[start : start + n]


def id_counts(ids, vocab_size: int):
    """[vocab_size] int64: how often each id occurs in `ids` (an id array or a memmap), counted
    COUNT_IDS at a time, so the int64 copy np.bincount makes is of a block, never of a split or a piece of
    text (issue 48: every per-split statistic counts through here)."""
    import numpy as np

    total = np.zeros(vocab_size, dtype=np.int64)
    for block in id_blocks(ids):
        total += np.bincount(block, minlength=vocab_size)
    return total


def unigram_loss(corpus: Corpus) -> float:
    """The val loss (nats/token) of a model that knows only how often each token occurs: the
    cross-entropy on the val split of the train split's token frequencies, add-one smoothed over the
    vocabulary (a token only the val split holds still gets a probability). A property of the corpus,
    its split and its tokenizer, not of any model: a run that has learned nothing but these frequencies
    sits at it (the unigram plateau, report/plateau.py). Counts only, one pass over each split's ids."""
    import numpy as np

    train, val = (id_counts(ids, len(corpus.vocab)).astype(np.float64) for ids in (corpus.train, corpus.val))
    p = (train + 1.0) / (train.sum() + len(train))
    return float(-(val * np.log(p)).sum() / val.sum())


def id_typecode(vocab_size: int) -> str:
    return next(code for code in ID_TYPES if vocab_size <= 1 << (8 * array(code).itemsize))


def build_corpus(text: str, description: str, val_frac: float = 0.1, min_len: int = 1) -> Corpus:
    def pieces() -> Iterator[str]:
        return (text[i : i + CHUNK_CHARS] for i in range(0, len(text), CHUNK_CHARS))

    return build(Source(description, pieces=pieces), val_frac, min_len)


def token_typecode(vocab_size: int) -> str:
    """The ids of a tokenizer other than char: uint16 (nanoGPT's np.memmap dtype) up to 65,536 tokens, else
    uint32 (never uint8, even for a small user vocabulary: nanoGPT reads uint16)."""
    return "H" if vocab_size <= 1 << 16 else "I"


def build(src: Source, val_frac: float = 0.1, min_len: int = 1, maker: Maker | None = None) -> Corpus:
    """A source's ids in memory, as compact arrays (maker: a tokenizer other than char, encode_source)."""
    arrays: list[array] = []

    def writers(code: str):
        arrays.extend((array(code), array(code)))
        return arrays[0].frombytes, arrays[1].frombytes

    vocab, meta = encode_source(src, writers, val_frac, min_len, maker=maker)
    return Corpus(vocab, arrays[0], arrays[1], meta)


def encode_source(src: Source, writers: Callable[[str], tuple], val_frac: float = 0.1, min_len: int = 1,
                  max_chars: int | None = None, progress: Progress | None = None,
                  spool: Path | None = None, maker: Maker | None = None) -> tuple[CharVocab, dict]:
    """Both passes over a source: (vocabulary, meta). Pass one learns the characters, length and hash
    (and writes a stream's documents to `spool`); pass two hands each split's ids, as bytes, to
    writers(typecode) -> (write train, write val). max_chars caps a document source (see _take).

    maker (data/tokenizer.vocab_maker; None: char): a tokenizer made between the passes from the train
    split's pieces (a BPE is trained on them, and only on them) or loaded; pass two then encodes with it."""
    if max_chars is not None and (src.docs is None or max_chars < 1):
        raise DataError(f"--max-chars must be a positive number of characters, got {max_chars}" if src.docs
                        else f"--max-chars applies to document sources, not {src.description} "
                        f"(cut a text with head -c)")
    scan = _scan(src, max_chars, progress, spool)
    if maker is not None:
        return _encode_tokens(src, scan, maker, writers, val_frac, min_len, max_chars, progress, spool)
    code = id_typecode(len(scan.vocab))
    parts = _parts(src, scan, val_frac, spool)
    counts, sizes = _encode(parts, scan.vocab, writers(code), progress, scan.chars)
    return scan.vocab, _meta(src, scan, val_frac, counts, sizes, min_len, max_chars)


def _encode_tokens(src: Source, scan: Scan, maker: Maker, writers, val_frac: float, min_len: int,
                   max_chars: int | None, progress: Progress | None, spool: Path | None) -> tuple[object, dict]:
    """encode_source past pass one for a tokenizer other than char: make it from the train split (read
    up to the split, never past it), then encode both splits in pieces (Tokens.encode_parts)."""
    import numpy as np

    vocab = maker(lambda: (piece for _, piece in itertools.takewhile(lambda p: p[0] == 0,
                                                                     _parts(src, scan, val_frac, spool))))
    scan.val_documents = 0  # the walk above counted some; pass two counts them all
    code = token_typecode(len(vocab))
    write, sizes, n_bytes, chars = writers(code), [0, 0], [0, 0], [0]

    def counted(parts):
        for part, piece in parts:
            chars[0] += len(piece)
            yield part, piece

    for part, ids in vocab.encode_parts(counted(_parts(src, scan, val_frac, spool)), np.dtype(code)):
        write[part](ids.view(np.uint8))
        sizes[part] += len(ids)
        n_bytes[part] += int(vocab.token_bytes()[ids].sum())
        _tell(progress, "encode", chars[0], None, scan.chars)
    meta = _meta(src, scan, val_frac, None, sizes, min_len, max_chars, what="tokens")
    return vocab, meta | {"vocab_size": len(vocab), "tokenizer": vocab.spec, "tokenizer_sha256": vocab.sha256,
                          "token_dtype": np.dtype(code).name, "train_bytes": n_bytes[0], "val_bytes": n_bytes[1]}


# ------------------------------------------------------------------------------- the two passes


@dataclass
class Scan:
    """What the first pass learns: length, characters, hash and, for documents, how many it took."""

    chars: int = 0
    blank: bool = True
    documents: int = 0  # taken (within the cap); the second pass reads exactly these
    capped: bool = False  # the cap stopped the stream before its end
    val_documents: int = 0  # set by the second pass
    seen: dict = field(default_factory=dict)  # characters in order of first occurrence (ties of char_counts)
    digest: object = field(default_factory=hashlib.sha256)
    vocab: CharVocab | None = None


def _scan(src: Source, max_chars: int | None, progress: Progress | None, spool: Path | None) -> Scan:
    """Pass one; a stream's documents are also written to `spool` (JSON strings, one per line)."""
    scan = Scan()
    with open(spool, "w", encoding="utf-8") if spool else contextlib.nullcontext() as sink:
        if src.docs is None:
            pieces = src.pieces()
        else:
            pieces = _joined(_spooled(_take(src.docs(), max_chars, scan), sink))
        for piece in pieces:
            scan.chars += len(piece)
            scan.blank = scan.blank and (not piece or piece.isspace())
            scan.digest.update(piece.encode("utf-8"))
            scan.seen.update((c, None) for c in sorted(set(piece).difference(scan.seen), key=piece.index))
            _tell(progress, "read", scan.chars, scan.documents if src.docs is not None else None, max_chars)
    if src.docs is not None and not scan.documents:
        raise DataError(f"dataset is empty: {src.description} has no documents")
    own = scan.chars - (len(DOC_SEP) * (scan.documents - 1) if src.docs is not None else 0)  # not our separators
    if scan.blank:  # a file of 20,000 newlines is not empty, but has nothing to learn either
        raise DataError(f"corpus holds only whitespace ({own:,} characters): {src.description}"
                        if own else f"corpus is empty: {src.description}")
    if len(scan.seen) < 2:  # one character (NUL-only, "aaaa"): every next character is known, the loss is 0
        raise DataError(f"corpus has one character only ({next(iter(scan.seen))!r}), so there is nothing to "
                        f"predict: {src.description}")
    scan.vocab = CharVocab(sorted(scan.seen))
    return scan


def _take(docs: Iterable[str], max_chars: int | None, scan: Scan) -> Iterator[str]:
    """Documents in order while their joined text stays within max_chars: the cap cuts between
    documents, never inside one (a first document longer than the cap is an error)."""
    total = -len(DOC_SEP)
    for doc in docs:
        total += len(DOC_SEP) + len(doc)
        if max_chars is not None and total > max_chars:
            if not scan.documents:
                raise DataError(f"--max-chars {max_chars:,} is shorter than the first document "
                                f"({len(doc):,} characters)")
            scan.capped = True
            return
        scan.documents += 1
        yield doc


def _spooled(docs: Iterator[str], sink) -> Iterator[str]:
    for doc in docs:
        if sink is not None:
            sink.write(json.dumps(doc, ensure_ascii=False) + "\n")
        yield doc


def _unspooled(spool: Path) -> Iterator[str]:
    with open(spool, encoding="utf-8") as f:
        yield from (json.loads(line) for line in f)


def _joined(docs: Iterable[str]) -> Iterator[str]:
    """Documents joined with DOC_SEP, in pieces of about CHUNK_CHARS characters."""
    buf, size = [], 0
    for i, doc in enumerate(docs):
        buf += (DOC_SEP, doc) if i else (doc,)
        size += len(doc)
        if size >= CHUNK_CHARS:
            yield "".join(buf)
            buf, size = [], 0
    if buf:
        yield "".join(buf)


def _parts(src: Source, scan: Scan, val_frac: float, spool: Path | None) -> Iterator[tuple[int, str]]:
    """Pass two's text as (part, piece): part 0 trains, part 1 validates."""
    if src.docs is None:
        return split_text(src.pieces(), scan.chars - int(scan.chars * val_frac))
    docs = _unspooled(spool) if spool else itertools.islice(src.docs(), scan.documents)
    return split_documents(docs, scan.chars, val_frac, scan)


def split_text(pieces: Iterable[str], n_train: int) -> Iterator[tuple[int, str]]:
    """The contiguous split: the first n_train characters train, the rest validate."""
    room = n_train
    for piece in pieces:
        if piece[:room]:
            yield 0, piece[:room]
        if len(piece) > room:
            yield 1, piece[room:]
        room = max(room - len(piece), 0)


def split_documents(docs: Iterable[str], n_chars: int, val_frac: float,
                    scan: Scan) -> Iterator[tuple[int, str]]:
    """The split by whole documents of a text of n_chars characters (documents joined with DOC_SEP).

    The contiguous split would cut at boundary = n_chars - int(n_chars * val_frac). Here a document
    trains if it ends at or before that boundary; the document that straddles it goes whole to
    validation, with every document after it, so validation holds at least val_frac of the text and
    never a part of a training document. The separator between the two parts is dropped: neither
    split holds a join of training and validation text.
    """
    boundary, end = n_chars - int(n_chars * val_frac), -len(DOC_SEP)

    def tagged() -> Iterator[tuple[int, str]]:
        nonlocal end
        for doc in docs:
            end += len(DOC_SEP) + len(doc)
            scan.val_documents += end > boundary
            yield int(end > boundary), doc

    for part, group in itertools.groupby(tagged(), key=lambda tagged_doc: tagged_doc[0]):
        yield from ((part, piece) for piece in _joined(doc for _, doc in group))


def _encode(parts: Iterable[tuple[int, str]], vocab: CharVocab, writers, progress: Progress | None = None,
            total: int | None = None) -> tuple[dict[str, int], list[int]]:
    """(count per character, ids per part): each piece's code points through a lookup table, its ids
    handed to writers[part] as bytes (an id array's frombytes, or a file's write)."""
    import numpy as np

    points = np.array([ord(c) for c in vocab.chars], dtype=np.int64)
    table = np.zeros(int(points.max()) + 1, dtype=np.dtype(id_typecode(len(vocab))))  # code point -> id
    table[points] = np.arange(len(vocab))
    counts, sizes = np.zeros(len(vocab), dtype=np.int64), [0, 0]
    for part, piece in parts:
        ids = table[np.frombuffer(piece.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)]
        counts += id_counts(ids, len(vocab))  # a block at a time: a whole piece's int64 copy is 8x its ids
        writers[part](ids.view(np.uint8))  # array.frombytes takes only a byte-typed buffer
        sizes[part] += len(ids)
        _tell(progress, "encode", sum(sizes), None, total)
    return dict(zip(vocab.chars, counts.tolist())), sizes


def _tell(progress: Progress | None, phase: str, chars: int, documents: int | None,
          total: int | None) -> None:
    if progress is not None:
        progress({"phase": phase, "chars": chars, "documents": documents, "total": total})


def _meta(src: Source, scan: Scan, val_frac: float, counts: dict[str, int] | None, sizes: list[int], min_len: int,
          max_chars: int | None = None, what: str = "ids") -> dict:
    """meta.json's record of a source; counts None (a tokenizer other than char): no char_counts."""
    if min(sizes) < min_len + 1:
        whole = " (validation holds whole documents)" if src.docs is not None else ""
        raise DataError(f"corpus too short: {scan.chars} characters give {sizes[0]} train / {sizes[1]} val "
                        f"{what}, each split needs more than ctx_len={min_len}{whole}")
    meta = {"source": src.description, "characters": scan.chars, "vocab_size": len(scan.vocab),
            "train_ids": sizes[0], "val_ids": sizes[1], "val_frac": val_frac}
    if src.docs is not None:
        meta |= src.meta | {"documents": scan.documents, "val_documents": scan.val_documents,
                            "separator": DOC_SEP, "max_chars": max_chars, "capped": scan.capped}
    if counts is None:
        return meta | {"sha256": scan.digest.hexdigest()}
    return meta | {
        "sha256": scan.digest.hexdigest(),
        # most common first, ties in order of first occurrence (as collections.Counter.most_common)
        "char_counts": {c: counts[c] for c in sorted(scan.seen, key=lambda c: -counts[c])},
    }

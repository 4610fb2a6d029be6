"""Tokenizers other than the character vocabulary: text <-> ids, and the UTF-8 bytes each id stands for.

  Tokens        a `tokenizers` Tokenizer as a vocabulary (the interface CharVocab has): anatomy's byte-level
                BPE (bpe:N), a user's tokenizer.json, or one from the Hub (hf:NAME)
  vocab_maker   a data.tokenizer spec -> None (char) or what turns the train split into Tokens
  train_bpe     a byte-level BPE of N tokens trained on text pieces (the train split only)
  load_saved    the vocabulary a run or prepared folder saved: vocab.json (char) or tokenizer.json
  StreamDecoder ids in, text out as soon as it is whole (a token that ends inside a character waits)

A vocabulary, char or not, has: spec ("char", "bpe:4096", a path, "hf:gpt2"), file (the name it saves as),
sha256 (of what it saves: the tokenizer's identity), len() (ids 0 .. len-1), encode(text) -> list[int],
decode(ids) -> str, token_bytes() -> [V] UTF-8 bytes of each id, save(path).

Bytes per token (bits per byte, batches.eval_counts). A byte-level token's bytes are its own (a token that
holds part of a character counts the part, so a character split across tokens is counted once in a sum);
a special token counts 0; a byte-fallback token <0xNN> counts 1; any other token its decoded text. Every
piece encoded is checked: its ids' bytes must add up to the piece's UTF-8 bytes, so a tokenizer that drops
or replaces text (an unknown character without byte fallback, a lowercasing normalizer) is refused by
name instead of counted wrong.

Pieces. A corpus is encoded in pieces (memory does not grow with it), cut only where no token can span:
before a space that starts a word (not after whitespace) or after a newline that ends a line, the points
where GPT-2-style pre-tokenizers (anatomy's, GPT-2's, Llama 3's) split anyway; BPE merges never cross
them, so the ids are those of the whole text encoded at once. A run of more than MAX_CARRY characters
with no such point is cut where it is. Training sees the same pieces.

Memory of training: the `tokenizers` trainer keeps a table of distinct pre-tokenized words and their
counts (and the pair counts of those words), not the text: it grows with the number of distinct words
(Heaps' law: about the square root of the corpus for natural text), not with the corpus.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import re
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from anatomy_cli.data.corpus import VOCAB_FILE, CharVocab, DataError
from anatomy_cli.spec.config import BPE_SPECIALS, parse_tokenizer
from anatomy_cli.store.runs import atomic_write_text

TOKENIZER_FILE = "tokenizer.json"
PIECE_CHARS = 1 << 16  # characters per piece handed to the encoder (many at once: its threads share them)
BATCH_PIECES = 16  # pieces per call of the encoder
MAX_CARRY = 1 << 24  # characters held while no cut point shows; past it the text is cut where it is
BYTE_FALLBACK = re.compile(r"<0x[0-9A-Fa-f]{2}>")

Maker = Callable[[Callable[[], Iterator[str]]], "Tokens"]  # train-split pieces (a thunk) -> the vocabulary


def byte_alphabet() -> dict[str, int]:
    """GPT-2's printable stand-in for each byte (the ByteLevel pre-tokenizer's), inverted: char -> byte."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    shifted = [b for b in range(256) if b not in keep]
    stand_in = {b: chr(b) for b in keep} | {b: chr(256 + i) for i, b in enumerate(shifted)}
    return {c: b for b, c in stand_in.items()}


BYTE_OF = byte_alphabet()


def _tokenizers():
    try:
        import tokenizers
    except ImportError:
        raise DataError("a tokenizer other than char needs the tokenizers library: pip install tokenizers") from None
    return tokenizers


class Tokens:
    """A `tokenizers` Tokenizer with CharVocab's interface. Special tokens written in a text are text
    (encode_special_tokens): a corpus that holds "<|endoftext|>" is encoded as its characters."""

    file = TOKENIZER_FILE

    def __init__(self, tok, spec: str, where: str = ""):
        tok.encode_special_tokens = True
        self.tok, self.spec, self.where = tok, spec, where or spec
        self.json = tok.to_str()
        self.sha256 = hashlib.sha256(self.json.encode("utf-8")).hexdigest()
        ids = tok.get_vocab(with_added_tokens=True).values()
        self.size = max(ids) + 1 if ids else 0
        self._bytes = None

    def __len__(self) -> int:
        return self.size

    # ---------------------------------------------------------------- bytes per id
    def token_bytes(self):
        """[V] int64: the UTF-8 bytes each id stands for (module docstring; 0 for an id no token has)."""
        import numpy as np

        if self._bytes is None:
            added = {t.content: t.special for t in self.tok.get_added_tokens_decoder().values()}
            byte_level = "ByteLevel" in json.dumps(json.loads(self.json).get("decoder"))
            out = np.zeros(len(self), dtype=np.int64)
            for token, i in self.tok.get_vocab(with_added_tokens=True).items():
                out[i] = self._bytes_of(token, i, added, byte_level)
            self._bytes = out
        return self._bytes

    def _bytes_of(self, token: str, i: int, added: dict[str, bool], byte_level: bool) -> int:
        if token in added:  # an added token is raw text (not byte-mapped); a special one stands for none
            return 0 if added[token] else len(token.encode("utf-8"))
        if byte_level:  # GPT-2's stand-ins: one character per byte
            return sum(1 if c in BYTE_OF else len(c.encode("utf-8")) for c in token)
        if BYTE_FALLBACK.fullmatch(token):  # <0xE4>: one byte of a character the vocabulary lacks
            return 1
        return len(self.tok.decode([i], skip_special_tokens=False).encode("utf-8"))

    # ---------------------------------------------------------------- text <-> ids
    def encode(self, text: str) -> list[int]:
        """The ids of `text`, checked to stand for its bytes (else DataError naming what is lost)."""
        ids = self.tok.encode(text, add_special_tokens=False).ids
        self._check(ids, [text])
        return ids

    def decode(self, ids) -> str:
        return self.tok.decode([int(i) for i in ids], skip_special_tokens=False)

    def encode_pieces(self, pieces: list[str], dtype):
        """Pieces (cut where no token spans) -> one id array of `dtype`, checked as encode is."""
        import numpy as np

        lists = [e.ids for e in self.tok.encode_batch_fast(pieces, add_special_tokens=False)]  # each a new list
        ids = np.fromiter(itertools.chain.from_iterable(lists), dtype=dtype, count=sum(map(len, lists)))
        self._check(ids, pieces)
        return ids

    def encode_parts(self, parts: Iterable[tuple[int, str]], dtype) -> Iterator[tuple[int, object]]:
        """(part, piece) of any length -> (part, ids) with the ids of each part's whole text."""
        for part, group in itertools.groupby(parts, key=lambda p: p[0]):
            for batch in cut_pieces(piece for _, piece in group):
                yield part, self.encode_pieces(batch, dtype)

    def _check(self, ids, pieces: list[str]) -> None:
        import numpy as np

        want = sum(len(p.encode("utf-8")) for p in pieces)
        if len(ids) and int(np.asarray(ids).max()) >= len(self):
            raise DataError(f"tokenizer {self.where} gave an id past its vocabulary of {len(self):,}")
        if int(self.token_bytes()[np.asarray(ids, dtype=np.int64)].sum()) == want:
            return
        lost = self.unencodable("".join(pieces))
        shown = ", ".join(repr(c) for c in lost[:5]) or "text it changes (a normalizer)"
        raise DataError(f"tokenizer {self.where} cannot encode the text as it is: {shown} does not come back "
                        f"byte for byte (a tokenizer without byte fallback, or one that normalizes text); "
                        f"bits per byte needs one that keeps every byte, e.g. bpe:N")

    def unencodable(self, text: str) -> list[str]:
        """The characters of `text` whose ids do not stand for their bytes, in order of first occurrence."""
        sizes = self.token_bytes()
        return [c for c in dict.fromkeys(text)
                if int(sum(sizes[i] for i in self.tok.encode(c, add_special_tokens=False).ids))
                != len(c.encode("utf-8"))]

    # ---------------------------------------------------------------- files
    def save(self, path: Path) -> None:
        atomic_write_text(Path(path), self.json)

    @classmethod
    def load(cls, path: Path, spec: str | None = None) -> Tokens:
        """A tokenizer.json (or a folder holding one), one line for a missing or corrupt file."""
        path = Path(path)
        file = path / TOKENIZER_FILE if path.is_dir() else path
        if not file.is_file():
            raise DataError(f"tokenizer not found: {file}" + (" (a folder needs a tokenizer.json)" if path.is_dir()
                                                              else ""))
        tokenizers = _tokenizers()
        try:
            tok = tokenizers.Tokenizer.from_str(file.read_text(encoding="utf-8"))
        except Exception as err:  # not UTF-8, not JSON, not a tokenizer: the library raises Exception itself
            first = (str(err).splitlines() or [err.__class__.__name__])[0][:200]
            raise DataError(f"corrupt tokenizer file {file}: {first}") from None
        if tok.get_vocab_size(with_added_tokens=True) == 0:
            raise DataError(f"corrupt tokenizer file {file}: it has no tokens")
        return cls(tok, spec or str(path), str(file))


# ------------------------------------------------------------------------------- pieces


def cut_point(text: str, lo: int, hi: int) -> int:
    """The last p with lo < p < hi where text may be cut (text[:p] and text[p:] encoded apart give the
    ids of the whole), or -1: before a space between two non-spaces, else after a newline between two."""
    def between(i: int) -> bool:  # text[i] sits between two non-whitespace characters
        return 0 < i < len(text) - 1 and not text[i - 1].isspace() and not text[i + 1].isspace()

    p = text.rfind(" ", lo + 1, hi)  # the cut is p: the space starts the next word's token
    while p > lo and not between(p):
        p = text.rfind(" ", lo + 1, p)
    if p > lo:
        return p
    p = text.rfind("\n", lo, hi - 1)  # the cut is p + 1: the newline is a token of its own
    while p >= lo and not between(p):
        p = text.rfind("\n", lo, p) if p > lo else -1
    return p + 1 if p >= lo else -1


def cut_pieces(pieces: Iterable[str], size: int | None = None) -> Iterator[list[str]]:
    """Text in pieces of any length -> batches of pieces of about `size` characters (PIECE_CHARS), each
    cut at a cut_point; together they hold the text exactly. A batch holds about BATCH_PIECES pieces: what
    the encoder's threads share, and what bounds its temporaries (the encodings of 1M characters)."""
    size = size or PIECE_CHARS
    carry, batch = "", []
    for piece in pieces:
        text, start = carry + piece, 0
        while len(text) - start > size:
            p = cut_point(text, start + size // 2, start + size)
            if p < 0:
                p = cut_point(text, start, start + size)
            if p < 0:
                break
            batch.append(text[start:p])
            start = p
            if len(batch) == BATCH_PIECES:
                yield batch
                batch = []
        carry = text[start:]
        if len(carry) > MAX_CARRY:  # no cut point in MAX_CARRY characters: cut where it is
            batch.append(carry)
            carry = ""
    batch += [carry] if carry else []
    if batch:
        yield batch


# ------------------------------------------------------------------------------- making one


def train_bpe(pieces: Iterable[str], n: int) -> Tokens:
    """A byte-level BPE of n tokens (BPE_SPECIALS first, at id 0, then the 256 bytes, then merges) trained
    on `pieces` (the train split only). GPT-2's pre-tokenizer (ByteLevel, its regex, no prefix space) and
    decoder, no normalizer: decode(encode(text)) == text for every text. Deterministic: the same pieces
    give the same tokenizer.json. Refuses n the text cannot fill, saying what it could learn."""
    tokenizers = _tokenizers()
    from tokenizers import decoders, models, pre_tokenizers, trainers

    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=n, special_tokens=list(BPE_SPECIALS), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(itertools.chain.from_iterable(cut_pieces(pieces)), trainer)
    learned = tok.get_vocab_size(with_added_tokens=True)
    if learned < n:
        raise DataError(f"bpe:{n} is more than the train split can fill: it holds pairs for {learned:,} tokens "
                        f"({len(BPE_SPECIALS)} special, 256 bytes, {learned - 256 - len(BPE_SPECIALS):,} merges); "
                        f"ask for bpe:{learned} or fewer, or give a larger corpus")
    return Tokens(tok, f"bpe:{n}")


def from_hub(name: str) -> Tokens:
    """hf:NAME's tokenizer.json from the Hugging Face Hub (its cache when there); one line offline."""
    try:
        from huggingface_hub import hf_hub_download
        from huggingface_hub.utils import logging as hub_logging
    except ImportError:
        raise DataError("hf: tokenizers need huggingface_hub: pip install huggingface_hub") from None
    hub_logging.set_verbosity_error()  # no retry warnings on our stderr: a failure is one line
    try:
        path = hf_hub_download(name, TOKENIZER_FILE)
    except Exception as err:  # offline, no such repository, no tokenizer.json in it, an HTTP error
        first = " ".join(str(err).split())[:200] or err.__class__.__name__
        raise DataError(f"cannot get the tokenizer hf:{name} from the Hugging Face Hub ({first}); offline, "
                        f"save its tokenizer.json on a machine with network and give its path") from None
    return Tokens.load(Path(path), f"hf:{name}")


def vocab_maker(spec: str) -> Maker | None:
    """None for "char" (the corpus's own characters); else train_split_pieces -> Tokens: bpe:N trains on
    them, a path or hf:NAME is loaded (and ignores them)."""
    spec = parse_tokenizer(spec)
    if spec == "char":
        return None
    if spec.startswith("bpe:"):
        n = int(spec[4:])
        return lambda train: train_bpe(train(), n)
    if spec.startswith("hf:"):
        return lambda train: from_hub(spec[3:])
    return lambda train: Tokens.load(Path(spec), spec)


def check_spec(spec: str) -> None:
    """What can be refused of a spec before the corpus is read: a tokenizer path that is not there or is
    corrupt, an hf: tokenizer that cannot be fetched (offline; a fetched one is cached for the real load)."""
    spec = parse_tokenizer(spec)
    if spec.startswith("hf:"):
        from_hub(spec[3:])
    elif spec != "char" and not spec.startswith("bpe:"):
        Tokens.load(Path(spec), spec)


def load_saved(folder: Path, meta: dict | None = None) -> CharVocab | Tokens:
    """The vocabulary a prepared folder (meta: its meta.json) or a run folder (meta: {"tokenizer":
    data.tokenizer}) saved: vocab.json for char (a meta without "tokenizer": a char folder), else
    tokenizer.json, named by its spec."""
    spec = (meta or {}).get("tokenizer", "char")
    if spec == "char":
        return CharVocab.load(Path(folder) / VOCAB_FILE)
    return Tokens.load(Path(folder) / TOKENIZER_FILE, spec)


def spec_of(vocab) -> str:
    return getattr(vocab, "spec", "char")


# ------------------------------------------------------------------------------- streaming decode


class StreamDecoder:
    """Ids in, text out once it is whole: push(id) returns the text the new id completes ("" while the
    ids so far end inside a UTF-8 character), flush() what is left at the end. The text is decoded from
    a few ids before the new one (vLLM's incremental detokenizer), so a decoder that depends on its
    neighbours (a space the next token adds) gives the text decode(all ids) gives; a U+FFFD appears only
    where the ids themselves are not UTF-8, never for a character still arriving."""

    CONTEXT = 6  # ids decoded before the ones not yet shown

    def __init__(self, vocab, prefix: list[int] | None = None):
        self.vocab, self.ids = vocab, list(prefix or [])
        self.read = len(self.ids)  # ids[:read] are shown
        self.start = max(0, self.read - self.CONTEXT)

    def push(self, token: int) -> str:
        self.ids.append(int(token))
        return self._emit(final=False)

    def flush(self) -> str:
        return self._emit(final=True)

    def _emit(self, final: bool) -> str:
        shown = self.vocab.decode(self.ids[self.start:self.read])
        text = self.vocab.decode(self.ids[self.start:])
        if len(text) <= len(shown) or (text.endswith("\ufffd") and not final):  # a character still arriving
            return ""
        self.start, self.read = max(0, len(self.ids) - self.CONTEXT), len(self.ids)
        return text[len(shown):]

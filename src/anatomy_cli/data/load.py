"""Opening a corpus: any source -> a Source or a Corpus (the entry points training and prepare call).

  open_source         a path, a folder, a document source or None (the embedded corpus) -> Source
  corpus_from_source  a source read and split now -> Corpus
  load_corpus         a prepared folder as it is, anything else read and split now
  run_corpus          load_corpus with a run config's source, split, ctx_len and tokenizer
"""

from __future__ import annotations

from pathlib import Path

from anatomy_cli.data import prepared, sources
from anatomy_cli.data.corpus import META, Corpus, DataError, Source, build, text_pieces


def open_source(source: str | Path | None, field: str | None = None, split: str | None = None) -> Source:
    """A text source (file, folder of .md/.txt, the default) or a document source (sources.py)."""
    if source is not None and sources.is_document_source(str(source)):
        return sources.open_documents(str(source), field, split)
    pieces, description = text_pieces(source)
    if field is not None or split is not None:
        raise DataError(f"--field and --split apply to document sources ({sources.KINDS}), "
                        f"not {description}")
    return Source(description, pieces=pieces)


def corpus_from_source(source: str | Path | None, val_frac: float = 0.1, min_len: int = 1,
                       tokenizer: str | None = None) -> Corpus:
    """Read and split a text or local document source without holding its text whole.

    hf:NAME is refused: a run would download it while training, and a resume could see other data
    than the run started on; `anatomy prepare` fixes it once in a folder with a fingerprint.

    tokenizer (data.tokenizer; None or "char": the characters): a bpe:N is trained here, on the train
    split, every time the source is read. That keeps a text source one command (`train --set
    data.tokenizer=bpe:512`), as its split already is: training is deterministic (the same text gives
    the same tokenizer.json, which the run saves and a resume checks by sha256), it costs about a second
    for the sizes a text is trained from directly (the embedded corpus: 0.3 s), and a cache shared by
    parallel workers would need locks and invalidation for less than that. A large corpus is prepared
    once instead (`anatomy prepare SOURCE --tokenizer bpe:N`), which also maps its ids instead of
    holding them.
    """
    from anatomy_cli.data.tokenizer import vocab_maker

    _refuse_stream(source)
    return build(open_source(source), val_frac, min_len, vocab_maker(tokenizer or "char"))


def _refuse_stream(source: str | Path | None) -> None:
    if source is not None and sources.is_hf(str(source)):
        raise DataError(f"{source} streams from the network, so training would download it (and a resume "
                        f"could see other data): prepare it once with `anatomy prepare {source} --out DIR`, "
                        f"then train on DIR")


def check_source(source: str | None, tokenizer: str | None = None) -> None:
    """load_corpus's refusals that need no reading (a path that is not there, an hf: stream, a tokenizer
    file that is missing or corrupt, a prepared folder of another tokenizer), raised now: a command
    checks its corpus before it says anything else."""
    from anatomy_cli.data.tokenizer import check_spec

    if tokenizer is not None:
        check_spec(tokenizer)
    if source is not None and (Path(source) / META).is_file():
        meta = prepared.read_meta(Path(source))
        if meta is not None:
            prepared.check_tokenizer(Path(source), meta, tokenizer)
        return
    _refuse_stream(source)
    open_source(source)


def load_corpus(source: str | None, val_frac: float = 0.1, ctx_len: int = 1, tokenizer: str | None = None) -> Corpus:
    """A prepared directory is loaded as is (memmapped; tokenizer, when given, must be the one it was
    prepared with); anything else is read and split now, with `tokenizer` (None: char)."""
    if source is not None and (Path(source) / META).is_file():
        return prepared.load_prepared(Path(source), ctx_len, tokenizer)
    return corpus_from_source(source, val_frac, ctx_len, tokenizer)


def run_corpus(cfg, source: str | None | type(...) = ..., min_len: int | None = None) -> Corpus:
    """load_corpus for a RunConfig: its data.source (or `source`: a resume's, resolved against the folder it
    started in), val_frac, tokenizer, and its ctx_len as the shortest split (or min_len)."""
    src = cfg.data.source if source is ... else source
    return load_corpus(src, cfg.data.val_frac, cfg.model.ctx_len if min_len is None else min_len, cfg.data.tokenizer)

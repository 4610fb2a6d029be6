"""Opening a corpus: any source -> a Source or a Corpus (the entry points training and prepare call).

  open_source         a path, a folder, a document source or None (the embedded corpus) -> Source
  corpus_from_source  a source read and split now -> Corpus
  load_corpus         a prepared folder as it is, anything else read and split now
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


def corpus_from_source(source: str | Path | None, val_frac: float = 0.1, min_len: int = 1) -> Corpus:
    """Read and split a text or local document source without holding its text whole.

    hf:NAME is refused: a run would download it while training, and a resume could see other data
    than the run started on; `anatomy prepare` fixes it once in a folder with a fingerprint.
    """
    _refuse_stream(source)
    return build(open_source(source), val_frac, min_len)


def _refuse_stream(source: str | Path | None) -> None:
    if source is not None and sources.is_hf(str(source)):
        raise DataError(f"{source} streams from the network, so training would download it (and a resume "
                        f"could see other data): prepare it once with `anatomy prepare {source} --out DIR`, "
                        f"then train on DIR")


def check_source(source: str | None) -> None:
    """load_corpus's refusals that need no reading (a path that is not there, an hf: stream), raised
    now: a command checks its corpus before it says anything else."""
    if source is not None and (Path(source) / META).is_file():
        return
    _refuse_stream(source)
    open_source(source)


def load_corpus(source: str | None, val_frac: float = 0.1, ctx_len: int = 1) -> Corpus:
    """A prepared directory is loaded as is; anything else is read and split now."""
    if source is not None and (Path(source) / META).is_file():
        return prepared.load_prepared(Path(source), ctx_len)
    return corpus_from_source(source, val_frac, ctx_len)

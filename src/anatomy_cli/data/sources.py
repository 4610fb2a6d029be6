"""Document sources: a JSON Lines or Parquet file, a `datasets` save_to_disk folder, or hf:NAME.

Each is read as one string per document, from one field (--field, default "text"), in the source's
order; data.py joins the documents with DOC_SEP and holds validation out by whole documents.
JSON Lines needs nothing extra; Parquet needs pyarrow, and save_to_disk folders and hf: need the
`datasets` library (both come with the `data` extra). hf:NAME[:CONFIG] streams a dataset from the
Hugging Face Hub (or a local dataset folder, through datasets.load_dataset) and can be read only
once: `anatomy prepare` spools it to disk, and training refuses it (data.corpus_from_source).

Bad input raises DataError with one line: a missing library (with its install command), a field
the data lacks (naming the fields it has), a value that is not a string, a malformed JSON line
(with its number), a network failure (with what to do offline).
"""

from __future__ import annotations

import importlib
import json
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path

from anatomy_cli.data.corpus import DataError, Source

HF = "hf:"
FIELD, SPLIT = "text", "train"  # the defaults of --field and --split
SUFFIXES = (".jsonl", ".parquet")
KINDS = ".jsonl, .parquet, a save_to_disk folder, hf:NAME"
INSTALL = "pip install 'anatomy-cli[data]'"
BATCH = 1024  # rows per batch read from Parquet and datasets
OFFLINE = ("offline, prepare on a machine with network and copy its --out folder here, or point prepare at "
           "a local .parquet or .jsonl file or a save_to_disk folder")


def is_hf(source: str) -> bool:
    return source.startswith(HF)


def is_saved_dataset(path: Path) -> bool:
    """A folder written by datasets' save_to_disk: a Dataset or a DatasetDict."""
    return (path / "dataset_dict.json").is_file() or ((path / "state.json").is_file()
                                                       and (path / "dataset_info.json").is_file())


def is_document_source(source: str) -> bool:
    path = Path(source)
    return is_hf(source) or path.suffix.lower() in SUFFIXES or (path.is_dir() and is_saved_dataset(path))


def open_documents(source: str, field: str | None = None, split: str | None = None) -> Source:
    """The Source of a document source; reading starts only when its documents are asked for."""
    field = FIELD if field is None else field
    if is_hf(source):
        return _hf(source[len(HF):], field, split)
    return _local(Path(source), field, split, source)


def _local(path: Path, field: str, split: str | None, description: str) -> Source:
    if path.is_dir() and is_saved_dataset(path):
        return _saved(path, field, split, description)
    if not path.exists():
        raise DataError(f"corpus not found: {path}")
    if not path.is_file():
        raise DataError(f"corpus is not a regular file: {path}")
    if split is not None:
        raise DataError(f"--split applies to hf: datasets and save_to_disk folders, not {path}")
    if path.suffix.lower() == ".jsonl":
        return Source(description, docs=lambda: _jsonl(path, field), meta={"field": field, "split": None})
    _need("pyarrow.parquet", "reading Parquet needs pyarrow")
    return Source(description, docs=lambda: _parquet(path, field), meta={"field": field, "split": None})


def _need(module: str, what: str):
    try:
        return importlib.import_module(module)
    except ImportError:
        raise DataError(f"{what}: {INSTALL}") from None


# ----------------------------------------------------------------------------------- readers


def _text(row: dict, field: str, where: str) -> str:
    """row[field] as a document, or a one-line error naming the fields the row has."""
    if field not in row:
        raise _no_field(where, field, row)
    return _string(row[field], field, where)


def _no_field(where: str, field: str, names: Iterable) -> DataError:
    have = ", ".join(str(name) for name in names) or "none"
    return DataError(f"{where} has no field {field!r} (it has: {have}); "
                     f"pick one with `anatomy prepare --field NAME`")


def _string(value, field: str, where: str) -> str:
    if not isinstance(value, str):
        kind = "null" if value is None else type(value).__name__
        raise DataError(f"{where}: field {field!r} is {kind}, not a string")
    return value


def _jsonl(path: Path, field: str) -> Iterator[str]:
    """One JSON object per line (blank lines skipped); the documents are row[field]."""
    number = 0
    try:
        with open(path, encoding="utf-8") as f:
            for number, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as err:
                    raise DataError(f"{path} line {number} is not valid JSON "
                                    f"({err.msg}, column {err.colno})") from None
                if not isinstance(row, dict):
                    raise DataError(f"{path} line {number} is not a JSON object")
                yield _text(row, field, f"{path} line {number}")
    except UnicodeDecodeError:
        raise DataError(f"{path} is not UTF-8 text (line {number + 1})") from None


def _parquet(path: Path, field: str) -> Iterator[str]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as err:
        raise DataError(f"{path} is not a Parquet file ({_one_line(err)})") from None
    if field not in table.schema_arrow.names:
        raise _no_field(str(path), field, table.schema_arrow.names)
    row = 0
    for batch in table.iter_batches(batch_size=BATCH, columns=[field]):
        for value in batch.column(0).to_pylist():
            row += 1
            yield _string(value, field, f"{path} row {row}")


def _rows(dataset, field: str, where: str) -> Iterator[str]:
    """The documents of a datasets Dataset or IterableDataset, read in batches of one column."""
    columns = dataset.column_names  # None for a stream whose features are not known before reading
    if columns is not None:
        if field not in columns:
            raise _no_field(where, field, columns)
        dataset = dataset.select_columns([field])
    number = 0
    for batch in dataset.iter(batch_size=BATCH):
        if field not in batch:
            raise _no_field(where, field, batch)
        for value in batch[field]:
            number += 1
            yield _string(value, field, f"document {number} of {where}")


def _saved(path: Path, field: str, split: str | None, description: str) -> Source:
    """A save_to_disk folder: a Dataset (no splits) or a DatasetDict (--split, default train)."""
    datasets = _need("datasets", f"reading the save_to_disk folder {path} needs the datasets library")
    _quiet(datasets)
    try:
        dataset = datasets.load_from_disk(str(path))
    except (OSError, ValueError) as err:
        raise DataError(f"cannot read the dataset folder {path} ({_one_line(err)})") from None
    if isinstance(dataset, datasets.DatasetDict):
        split = SPLIT if split is None else split
        if split not in dataset:
            raise DataError(f"{path} has no split {split!r} (it has: {', '.join(dataset)}); "
                            f"choose one with --split")
        dataset = dataset[split]
    elif split is not None:
        raise DataError(f"{path} holds one dataset, not splits: drop --split")
    return Source(description, docs=lambda: _rows(dataset, field, description),
                  meta={"field": field, "split": split})


def _hf(name: str, field: str, split: str | None) -> Source:
    """hf:NAME[:CONFIG], streamed by datasets.load_dataset (a local file or saved folder: read as such)."""
    if not name:
        raise DataError("hf: needs a dataset name, e.g. hf:roneneldan/TinyStories")
    local = Path(name)
    if (local.is_file() and local.suffix.lower() in SUFFIXES) or (local.is_dir() and is_saved_dataset(local)):
        return _local(local, field, split, HF + name)
    datasets = _need("datasets", "hf: datasets need the datasets library")
    path, _, config = name.partition(":")
    split = SPLIT if split is None else split
    return Source(HF + name, docs=lambda: _stream(datasets, path, config or None, split, field),
                  meta={"field": field, "split": split}, once=True)


def _stream(datasets, path: str, config: str | None, split: str, field: str) -> Iterator[str]:
    where, done = HF + path + (f":{config}" if config else ""), 0
    refused = (FileNotFoundError, ValueError, datasets.exceptions.DatasetsError)  # no such dataset or split
    _quiet(datasets)
    try:
        dataset = datasets.load_dataset(path, config, split=split, streaming=True)
    except _network_errors() as err:
        raise DataError(f"cannot reach the Hugging Face Hub for {where} ({_one_line(err)}); "
                        f"{OFFLINE}") from None
    except refused as err:
        raise DataError(f"{where}: {_one_line(err)}") from None
    try:
        for doc in _rows(dataset, field, where):
            yield doc
            done += 1
    except _network_errors() as err:
        raise DataError(f"the connection to the Hugging Face Hub failed while streaming {where}, "
                        f"after {done:,} documents ({_one_line(err)}); {OFFLINE}") from None
    except datasets.exceptions.DatasetsError as err:  # a data file the stream cannot read
        raise DataError(f"{where}, after {done:,} documents: {_one_line(err)}") from None


def _network_errors() -> tuple[type[BaseException], ...]:
    """What datasets raises when the Hub cannot be reached or answers with an error: ConnectionError
    (HF_HUB_OFFLINE's OfflineModeIsEnabled is one), timeouts, the HTTP clients' transport errors and
    the Hub client's HTTP errors."""
    errors: list[type[BaseException]] = [ConnectionError, TimeoutError]
    if "httpx" in sys.modules:
        errors.append(sys.modules["httpx"].TransportError)
    if "requests" in sys.modules:
        errors.append(sys.modules["requests"].ConnectionError)
    if "huggingface_hub" in sys.modules:
        errors.append(sys.modules["huggingface_hub"].errors.HfHubHTTPError)
    return tuple(errors)


def _one_line(err: BaseException, limit: int = 300) -> str:
    text = " ".join(str(err).split()) or err.__class__.__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _quiet(datasets) -> None:
    """No progress bars, retry warnings or other logs from datasets and the Hub client on our stderr:
    prepare draws its own progress and reports a failure in one line."""
    import huggingface_hub

    datasets.disable_progress_bars()
    datasets.logging.set_verbosity_error()
    huggingface_hub.utils.logging.set_verbosity_error()


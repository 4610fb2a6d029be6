"""Document sources: a JSON Lines or Parquet file, a `datasets` save_to_disk folder, or hf:NAME.

Each is read as one string per document, from one field (--field, default "text"), in the source's
order; corpus.py joins the documents with DOC_SEP and holds validation out by whole documents.
JSON Lines needs nothing extra; Parquet needs pyarrow, and save_to_disk folders and hf: need the
`datasets` library (both come with the `data` extra). hf:NAME[:CONFIG] streams a dataset from the
Hugging Face Hub (or a local dataset folder, through datasets.load_dataset) and can be read only
once: `anatomy prepare` spools it to disk, and training refuses it (data.corpus_from_source).

Bad input raises DataError with one line naming the file and the line (JSON Lines) or the row
(Parquet, datasets): a missing library (with its install command), a field the data lacks (naming
the fields it has), a value that is not a string or holds a lone surrogate (a "\\ud800" escape that
is valid JSON but not text), a malformed, too deeply nested or too long JSON line, bytes that are
not UTF-8 (the line is the one that holds them: each line is decoded alone), a corrupt Parquet row
group, an empty or damaged save_to_disk folder, a network failure (with what to do offline). A
library reading bytes it did not write can raise anything, so its calls are wrapped whole: whatever
it raises becomes a DataError naming the file and the rows it was reading.
"""

from __future__ import annotations

import importlib
import itertools
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
MAX_LINE_BYTES = 1 << 26  # the longest JSON line read (64 MiB): a longer one is refused before it is read whole
BOM = b"\xef\xbb\xbf"  # a UTF-8 byte order mark, allowed at the start of a JSON Lines file
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
    have = ", ".join(_printable(str(name)) for name in names) or "none"
    return DataError(f"{where} has no field {field!r} (it has: {have}); "
                     f"pick one with `anatomy prepare --field NAME`")


def _string(value, field: str, where: str) -> str:
    if not isinstance(value, str):
        kind = "null" if value is None else type(value).__name__
        raise DataError(f"{where}: field {field!r} is {kind}, not a string")
    if not value.isascii():
        try:
            value.encode("utf-8")  # a lone surrogate cannot be: faster than searching for one
        except UnicodeEncodeError as err:
            raise DataError(f"{where}: field {field!r} holds a lone surrogate ({_printable(value[err.start])}) at "
                            f"character {err.start + 1:,}, which is not text (it cannot be written as UTF-8)") from None
    return value


def _printable(text: str) -> str:
    """text with lone surrogates as \\udXXX escapes: a message that holds one can still be printed."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _described(err: BaseException) -> str:
    """A library's error in one line, with its class (a KeyError's message alone is just a name)."""
    return f"{err.__class__.__name__}: {_one_line(err)}"


def _jsonl(path: Path, field: str) -> Iterator[str]:
    """One JSON object per line (blank lines skipped); the documents are row[field].

    Lines end at \\n (a \\r before it is JSON whitespace) and each is decoded on its own, so an error
    names the line that holds the bad bytes; a line is read only up to MAX_LINE_BYTES."""
    try:
        f = open(path, "rb")
    except PermissionError:
        raise DataError(f"corpus not readable: {path}") from None
    except OSError as err:
        raise DataError(f"cannot read {path} ({err.strerror or _described(err)})") from None
    with f:
        for number in itertools.count(1):
            try:
                raw = f.readline(MAX_LINE_BYTES + 1)
            except OSError as err:
                raise DataError(f"cannot read {path} at line {number} ({err.strerror or _described(err)})") from None
            if not raw:
                return
            if len(raw) > MAX_LINE_BYTES and not raw.endswith(b"\n"):
                raise DataError(f"{path} line {number} is longer than {MAX_LINE_BYTES:,} bytes, the most one JSON "
                                f"line may hold: split its document into several lines")
            row = _json_line(raw[len(BOM):] if number == 1 and raw.startswith(BOM) else raw, path, number)
            if row is not None:
                yield _text(row, field, f"{path} line {number}")


def _json_line(raw: bytes, path: Path, number: int) -> dict | None:
    """The JSON object on one line of a JSON Lines file (None for a blank line)."""
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise DataError(f"{path} line {number} is not UTF-8 text (invalid byte 0x{raw[err.start]:02x} at "
                        f"column {err.start + 1:,})") from None
    if not line or line.isspace():  # what strip() would empty, without copying the line
        return None
    try:
        row = json.loads(line)
    except json.JSONDecodeError as err:
        raise DataError(f"{path} line {number} is not valid JSON ({err.msg}, column {err.colno})") from None
    except RecursionError:
        raise DataError(f"{path} line {number} is nested too deeply to read as JSON") from None
    except ValueError as err:  # an integer of more digits than Python converts
        raise DataError(f"{path} line {number} is not valid JSON ({_one_line(err)})") from None
    if not isinstance(row, dict):
        raise DataError(f"{path} line {number} is not a JSON object")
    return row


def _parquet(path: Path, field: str) -> Iterator[str]:
    """The documents of one column, in batches; a part that cannot be read is named by its row group."""
    import pyarrow.parquet as pq

    try:
        table = pq.ParquetFile(path)
        names = table.schema_arrow.names
    except PermissionError:
        raise DataError(f"corpus not readable: {path}") from None
    except Exception as err:  # pyarrow on bytes that are not Parquet: ArrowInvalid, OSError, ...
        raise DataError(f"{path} is not a Parquet file ({_one_line(err)})") from None
    if field not in names:
        raise _no_field(str(path), field, names)
    row, batches = 0, table.iter_batches(batch_size=BATCH, columns=[field])
    while True:
        try:
            batch = next(batches, None)
            values = None if batch is None else _column_values(batch.column(0), field, path, row)
        except DataError:
            raise
        except Exception as err:  # a corrupt page, a bad compression stream, a page header that is not one
            raise DataError(f"{_unreadable(table, field, path, row)} cannot be read ({_described(err)})") from None
        if values is None:
            return
        for value in values:
            row += 1
            yield _string(value, field, f"{path} row {row}")


def _unreadable(table, field: str, path: Path, done: int) -> str:
    """Which rows of a Parquet file failed, `done` rows having been read: the first row group from the
    one holding row done + 1 that does not read alone (the reader reads ahead, so it may be a later one)."""
    try:
        start = 0
        for group in range(table.num_row_groups):
            end = start + table.metadata.row_group(group).num_rows
            if end > done:
                for _ in table.iter_batches(batch_size=BATCH, row_groups=[group], columns=[field]):
                    pass
            start = end
    except Exception:
        return f"{path} rows {start + 1:,}-{end:,} (row group {group + 1})"
    return f"{path} after row {done:,}"


def _column_values(column, field: str, path: Path, before: int) -> list:
    """A batch's column as Python values; a string that is not UTF-8 is named by its row."""
    try:
        return column.to_pylist()
    except UnicodeDecodeError:
        for k in range(len(column)):
            try:
                column[k].as_py()
            except UnicodeDecodeError as err:
                raise DataError(f"{path} row {before + k + 1}: field {field!r} is not UTF-8 text "
                                f"(invalid byte at offset {err.start})") from None
        raise


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
            yield _string(value, field, f"{where} row {number}")


def _saved(path: Path, field: str, split: str | None, description: str) -> Source:
    """A save_to_disk folder: a Dataset (no splits) or a DatasetDict (--split, default train).

    Of a DatasetDict only the chosen split is opened (as datasets would open it, from the folder named
    after it): a damaged or empty other split does not stop it. An empty dataset (save_to_disk writes
    no data file for one, which datasets cannot load) has no documents."""
    datasets = _need("datasets", f"reading the save_to_disk folder {path} needs the datasets library")
    _quiet(datasets)
    if (path / "state.json").is_file() and (path / "dataset_info.json").is_file():  # load_from_disk's order
        if split is not None:
            raise DataError(f"{path} holds one dataset, not splits: drop --split")
        folder = path
    else:
        split = SPLIT if split is None else split
        splits = _splits(path)
        if split not in splits:
            raise DataError(f"{path} has no split {split!r} (it has: {_printable(', '.join(splits)) or 'none'}); "
                            f"choose one with --split")
        folder = path / split
    dataset = _load_saved(datasets, folder)
    meta = {"field": field, "split": split}
    if dataset is None:
        return Source(description, docs=lambda: iter(()), meta=meta)
    return Source(description, docs=lambda: _saved_rows(dataset, field, description), meta=meta)


def _splits(path: Path) -> list[str]:
    """The splits dataset_dict.json names."""
    try:
        splits = json.loads((path / "dataset_dict.json").read_text(encoding="utf-8"))["splits"]
    except (OSError, UnicodeDecodeError, ValueError, RecursionError, KeyError, TypeError) as err:
        raise DataError(f"cannot read the dataset folder {path} (dataset_dict.json: {_described(err)})") from None
    if not isinstance(splits, list) or not all(isinstance(name, str) for name in splits):
        raise DataError(f"cannot read the dataset folder {path} (dataset_dict.json: \"splits\" is not a list of "
                        f"names)")
    return splits


def _load_saved(datasets, folder: Path):
    """The Dataset saved in `folder`, or None for one saved with no rows."""
    try:
        return datasets.Dataset.load_from_disk(str(folder))
    except Exception as err:  # a missing or damaged state.json, arrow file or split folder: anything
        if _saved_empty(folder):
            return None
        raise DataError(f"cannot read the dataset folder {folder} ({_described(err)})") from None


def _saved_empty(folder: Path) -> bool:
    """save_to_disk wrote no data file: a dataset of no rows."""
    try:
        state = json.loads((folder / "state.json").read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return False
    return isinstance(state, dict) and state.get("_data_files") == []


def _saved_rows(dataset, field: str, where: str) -> Iterator[str]:
    """_rows, with whatever datasets raises on damaged data as one line naming the rows."""
    done = 0
    try:
        for doc in _rows(dataset, field, where):
            yield doc
            done += 1
    except DataError:
        raise
    except Exception as err:
        raise DataError(f"{where}: cannot read the rows after row {done:,} ({_described(err)})") from None


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
    except Exception as err:  # a dataset whose files datasets cannot read
        raise DataError(f"{where}: {_described(err)}") from None
    try:
        for doc in _rows(dataset, field, where):
            yield doc
            done += 1
    except _network_errors() as err:
        raise DataError(f"the connection to the Hugging Face Hub failed while streaming {where}, "
                        f"after {done:,} documents ({_one_line(err)}); {OFFLINE}") from None
    except datasets.exceptions.DatasetsError as err:  # a data file the stream cannot read
        raise DataError(f"{where}, after {done:,} documents: {_one_line(err)}") from None
    except DataError:
        raise
    except Exception as err:  # what else a data file of the stream raises: pyarrow's errors, ...
        raise DataError(f"{where}, after {done:,} documents: {_described(err)}") from None


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


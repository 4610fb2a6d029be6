"""Dataset inputs the readers do not expect (issue #30, class 2): valid JSON that still breaks the
pipeline, files that are corrupt in the middle, empty datasets, fields of the wrong kind.

Every one ends in ONE line, `error: ...`, naming the file and the line (JSON Lines) or the row /
byte offset (the others), exit 2, no traceback, no internal error, and no --out folder left."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import invoke, one_error_line
from toy_data import tiny_text
from typer.testing import CliRunner

from anatomy_cli.data import prepared
from anatomy_cli.data import sources as documents

runner = CliRunner()
DOCS = [tiny_text(120 + 17 * i, seed=i) for i in range(10)]


def jsonl_lines(path: Path, lines: list[bytes]) -> Path:
    path.write_bytes(b"".join(line + b"\n" for line in lines))
    return path


def good(i: int) -> bytes:
    return json.dumps({"text": DOCS[i % len(DOCS)]}).encode()


def refused(tmp_path: Path, source, fragment: str, *options) -> str:
    """prepare SOURCE fails in one line holding `fragment`, exit 2, and leaves no --out folder."""
    out = tmp_path / "out"
    line = one_error_line(invoke("prepare", source, "--out", out, "--ctx-len", 8, *options), fragment)
    assert not out.exists(), line
    return line


def accepted(tmp_path: Path, source, *options) -> dict:
    out = tmp_path / "ok"
    result = invoke("prepare", source, "--out", out, "--ctx-len", 8, *options)
    assert result.exit_code == 0, result.output
    return prepared.load_prepared(out).meta


# ----------------------------------------------------------------------------- JSON Lines


def test_a_lone_surrogate_names_its_line(tmp_path):
    path = jsonl_lines(tmp_path / "d.jsonl", [good(0), good(1), b'{"text": "ab\\ud800cd"}', good(2)])
    refused(tmp_path, path, f"{path} line 3: field 'text' holds a lone surrogate (\\ud800)")


def test_a_lone_surrogate_in_a_field_name_prints_safely(tmp_path):
    path = jsonl_lines(tmp_path / "d.jsonl", [b'{"b\\udc00dy": "x"}'])
    refused(tmp_path, path, f"{path} line 1 has no field 'text' (it has: b\\udc00dy)")


def test_a_surrogate_pair_is_one_character_and_fine(tmp_path):
    path = jsonl_lines(tmp_path / "d.jsonl", [good(i) for i in range(6)] + [b'{"text": "smile \\ud83d\\ude00 ok"}'])
    assert "\U0001f600" in accepted(tmp_path, path)["char_counts"]


def test_deep_nesting_names_its_line(tmp_path):
    deep = b'{"text": "x", "meta": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    path = jsonl_lines(tmp_path / "d.jsonl", [good(0), deep, good(1)])
    refused(tmp_path, path, f"{path} line 2 is nested too deeply")


def test_a_huge_integer_names_its_line(tmp_path):
    path = jsonl_lines(tmp_path / "d.jsonl", [good(0), good(1), b'{"text": "x", "n": ' + b"7" * 5000 + b"}"])
    refused(tmp_path, path, f"{path} line 3 is not valid JSON")


@pytest.mark.parametrize("pad", [0, 20_000])  # the bad line in the first read buffer, or far past it
def test_non_utf8_names_the_real_line(tmp_path, pad):
    lines = [json.dumps({"text": DOCS[i] + "y" * pad}).encode() for i in range(6)]
    lines += [b'{"text": "caf\xe9"}'] + [good(i) for i in range(5)]
    path = jsonl_lines(tmp_path / "d.jsonl", lines)
    line = refused(tmp_path, path, f"{path} line 7 is not UTF-8")
    assert "column 14" in line  # the byte 0xe9 is the 14th of the line


def test_a_gigantic_line_is_refused_before_it_is_read_whole(tmp_path, monkeypatch):
    monkeypatch.setattr(documents, "MAX_LINE_BYTES", 4000, raising=False)
    big = json.dumps({"text": "z" * 10_000}).encode()
    path = jsonl_lines(tmp_path / "d.jsonl", [good(0), good(1), good(2), big, good(3)])
    refused(tmp_path, path, f"{path} line 4 is longer than 4,000 bytes")
    fits = json.dumps({"text": "z" * 3980}).encode()  # a line of exactly the limit (its newline not counted)
    assert len(fits) <= 4000
    path = jsonl_lines(tmp_path / "e.jsonl", [good(i) for i in range(8)] + [fits])
    assert accepted(tmp_path, path)["documents"] == 9


@pytest.mark.parametrize("value, kind", [(7, "int"), (2.5, "float"), (None, "null"), (["a"], "list"),
                                         ({"a": "b"}, "dict"), (True, "bool")])
def test_a_field_that_is_not_a_string_names_its_line(tmp_path, value, kind):
    path = jsonl_lines(tmp_path / "d.jsonl", [good(0), good(1), json.dumps({"text": value}).encode()])
    refused(tmp_path, path, f"{path} line 3: field 'text' is {kind}, not a string")


def test_empty_documents_are_kept_but_all_empty_is_refused(tmp_path):
    path = jsonl_lines(tmp_path / "d.jsonl", [good(i) for i in range(8)] + [b'{"text": ""}', good(8)])
    assert accepted(tmp_path, path)["documents"] == 10
    path = jsonl_lines(tmp_path / "e.jsonl", [b'{"text": ""}'] * 3)
    refused(tmp_path, path, f"corpus is empty: {path}")


def test_a_byte_order_mark_is_not_json_but_is_allowed(tmp_path):
    path = jsonl_lines(tmp_path / "d.jsonl", [b"\xef\xbb\xbf" + good(0)] + [good(i) for i in range(1, 9)])
    assert accepted(tmp_path, path)["documents"] == 9


def test_training_straight_from_hostile_jsonl_is_one_line(tmp_path):
    path = jsonl_lines(tmp_path / "d.jsonl", [good(0), b'{"text": "\\udfff"}'])
    one_error_line(invoke("train", f"--set=data.source={json.dumps(str(path))}", "--out", tmp_path / "run"),
                   f"{path} line 2: field 'text' holds a lone surrogate")


# ----------------------------------------------------------------------------- Parquet


@pytest.fixture
def pq():
    pytest.importorskip("pyarrow")
    return pytest.importorskip("pyarrow.parquet")


def test_corrupt_parquet_bytes_name_the_rows(tmp_path, pq):
    import pyarrow as pa

    path = tmp_path / "d.parquet"
    pq.write_table(pa.table({"text": [f"document {i} " * 20 for i in range(2000)]}), path, row_group_size=500,
                   compression="snappy")
    raw = bytearray(path.read_bytes())
    page = pq.ParquetFile(path).metadata.row_group(2).column(0).dictionary_page_offset  # the third row group's
    raw[page + 40: page + 104] = b"\xff" * 64  # compressed dictionary: no longer snappy
    path.write_bytes(bytes(raw))
    refused(tmp_path, path, f"{path} rows 1,001-1,500 (row group 3) cannot be read")


def test_truncated_and_garbage_parquet_name_the_file(tmp_path, pq):
    import pyarrow as pa

    path = tmp_path / "d.parquet"
    pq.write_table(pa.table({"text": DOCS}), path)
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    refused(tmp_path, path, f"{path} is not a Parquet file")
    path.write_bytes(b"")
    refused(tmp_path, path, f"{path} is not a Parquet file")


@pytest.mark.parametrize("values, kind", [([1, 2, 3], "int"), ([["a"], ["b"], ["c"]], "list"),
                                          ([b"a", b"b", b"c"], "bytes")])
def test_a_parquet_field_that_is_not_a_string_names_its_row(tmp_path, pq, values, kind):
    import pyarrow as pa

    path = tmp_path / "d.parquet"
    pq.write_table(pa.table({"text": values}), path)
    refused(tmp_path, path, f"{path} row 1: field 'text' is {kind}, not a string")


def test_invalid_utf8_in_a_parquet_string_column_names_its_row(tmp_path, pq):
    import pyarrow as pa

    data = b"goodbad\xffmore"
    offsets = pa.py_buffer(pa.array([0, 4, 8, 12], pa.int32()).buffers()[1])
    column = pa.StringArray.from_buffers(3, offsets, pa.py_buffer(data))  # not validated: row 2 is not UTF-8
    path = tmp_path / "d.parquet"
    pq.write_table(pa.table({"text": column}), path)
    refused(tmp_path, path, f"{path} row 2: field 'text' is not UTF-8 text")


# ----------------------------------------------------------------------------- save_to_disk


@pytest.fixture
def datasets():
    return pytest.importorskip("datasets")


def test_an_empty_saved_dataset_is_empty_not_an_index_error(tmp_path, datasets):
    datasets.Dataset.from_dict({"text": []}).save_to_disk(str(tmp_path / "saved"))
    refused(tmp_path, tmp_path / "saved", f"dataset is empty: {tmp_path / 'saved'} has no documents")


def test_an_empty_split_is_empty_and_does_not_stop_the_others(tmp_path, datasets):
    full = datasets.Dataset.from_dict({"text": DOCS})
    empty = datasets.Dataset.from_dict({"text": []}, features=full.features)
    datasets.DatasetDict({"train": full, "test": empty}).save_to_disk(str(tmp_path / "dict"))
    assert accepted(tmp_path, tmp_path / "dict")["documents"] == len(DOCS)
    refused(tmp_path, tmp_path / "dict", f"dataset is empty: {tmp_path / 'dict'} has no documents", "--split", "test")


def test_a_saved_field_that_is_not_a_string_names_its_row(tmp_path, datasets):
    datasets.Dataset.from_dict({"text": DOCS[:3] + [None]}).save_to_disk(str(tmp_path / "saved"))
    refused(tmp_path, tmp_path / "saved", f"{tmp_path / 'saved'} row 4: field 'text' is null, not a string")


@pytest.mark.parametrize("damage", ["arrow", "state", "state-keys", "dict"])
def test_a_damaged_saved_dataset_names_the_folder(tmp_path, datasets, damage):
    folder = tmp_path / "saved"
    if damage == "dict":
        datasets.DatasetDict({"train": datasets.Dataset.from_dict({"text": DOCS})}).save_to_disk(str(folder))
        (folder / "dataset_dict.json").write_text('{"splits": 3}')
    else:
        datasets.Dataset.from_dict({"text": DOCS}).save_to_disk(str(folder))
        if damage == "arrow":
            next(folder.glob("*.arrow")).write_bytes(b"\x00garbage" * 100)
        else:
            (folder / "state.json").write_text("{" if damage == "state" else "{}")
    refused(tmp_path, folder, f"{folder}")


@pytest.mark.parametrize("text", ["\x00" * 400, "a" * 400])
def test_a_corpus_of_one_character_is_refused(tmp_path, text):
    """A NUL-only or one-letter corpus trained to loss 0.000 without a word (issue 37's weak list): every
    next character is known, so there is nothing to measure."""
    path = tmp_path / "one.txt"
    path.write_text(text, encoding="utf-8")
    refused(tmp_path, path, f"corpus has one character only ({text[0]!r}), so there is nothing to predict: {path}")
    one_error_line(invoke("train", "--set", f"data.source={path}", "--set", "train.steps=1", "--out",
                          tmp_path / "run"), "corpus has one character only")
    assert not (tmp_path / "run").exists()


# ----------------------------------------------------------------------------- text files (issue 48)

TOY_RUN = [f"--set={k}" for k in ("model.d_model=32", "model.n_layer=1", "model.n_head=4", "model.ctx_len=16",
                                  "train.warmup=1", "train.eval_interval=2", "train.eval_batches=2",
                                  "train.sample_len=20")]


def train_on(tmp_path: Path, source: Path):
    out = tmp_path / "run"
    result = invoke("train", f"--set=data.source={json.dumps(str(source))}", *TOY_RUN, "--steps", 2, "--out", out)
    return result, out


@pytest.mark.parametrize("text, fragment", [("\n" * 20_000, "corpus holds only whitespace (20,000 characters)"),
                                            (" \t\n", "corpus holds only whitespace (3 characters)"),
                                            ("", "corpus is empty"),
                                            ("abc", "corpus too short: 3 characters")])
def test_a_corpus_without_text_says_which_and_draws_no_progress_bar(tmp_path, text, fragment):
    """Only whitespace is not 'empty'; a refusal before the first step leaves no 'train 0/2' bar above it."""
    path = tmp_path / "c.txt"
    path.write_text(text, encoding="utf-8")
    result, out = train_on(tmp_path, path)
    one_error_line(result, fragment)
    assert "0/2" not in result.output, result.output
    assert not (out / "config.json").exists()


def test_a_folder_of_runs_as_the_corpus_says_so(tmp_path):
    """data.source set to a runs folder read its runs' samples.txt as the corpus ('corpus too short')."""
    source = tmp_path / "c.txt"
    source.write_text(tiny_text(4000), encoding="utf-8")
    folder = tmp_path / "runs"
    done = invoke("train", f"--set=data.source={json.dumps(str(source))}", *TOY_RUN, "--steps", 2,
                  "--out", folder / "train" / "a")
    assert done.exit_code == 0 and (folder / "train" / "a" / "samples.txt").is_file(), done.output
    result, out = train_on(tmp_path, folder)
    one_error_line(result, f"the corpus {folder} is a folder of runs (it holds the run train/a)")
    assert not out.exists()

"""Document sources (JSON Lines, Parquet, save_to_disk, hf:) written locally, no network: each one
prepares and trains; validation holds whole documents; the character cap; bad input in one line."""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import pytest
from helpers import invoke, one_error_line
from toy_data import TINY_MODEL, TINY_TRAIN, tiny_text
from typer.testing import CliRunner

from anatomy_cli.cli.main import app
from anatomy_cli.cli.run import PrepareProgress
from anatomy_cli.data import corpus as corpus_mod
from anatomy_cli.data import load, prepared
from anatomy_cli.data import sources as documents
from anatomy_cli.data.corpus import DOC_SEP, DataError
from anatomy_cli.store import runs

pytestmark = pytest.mark.usefixtures("single_thread")
runner = CliRunner()
DOCS = [tiny_text(200 + 61 * i, seed=i) for i in range(12)]  # 12 documents of 200 to 871 characters


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def prepared_text(out: Path) -> tuple[str, str, dict]:
    """(train text, val text, meta) decoded from a prepared folder."""
    corpus = prepared.load_prepared(out)
    return corpus.vocab.decode(corpus.train), corpus.vocab.decode(corpus.val), corpus.meta


def expected_split(docs: list[str], val_frac: float = 0.1) -> int:
    """How many documents train: those ending at or before the contiguous split's boundary."""
    n_chars = len(DOC_SEP.join(docs))
    boundary, end = n_chars - int(n_chars * val_frac), -len(DOC_SEP)
    for k, doc in enumerate(docs):
        end += len(DOC_SEP) + len(doc)
        if end > boundary:
            return k
    return len(docs)


def train_sets(source: Path) -> list[str]:
    sets = [f"--set=data.source={json.dumps(str(source))}"]
    sets += [f"--set=model.{k}={json.dumps(v)}" for k, v in TINY_MODEL.items()]
    return sets + [f"--set=train.{k}={json.dumps(v)}" for k, v in {**TINY_TRAIN, "steps": 4, "eval_interval": 2,
                                                                    "sample_len": 0}.items()]


def losses(run: Path) -> list:
    return [(r["step"], r.get("train_loss"), r.get("val_loss")) for r in runs.read_metrics(run)]


# ----------------------------------------------------------------------------- each source


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> dict[str, tuple[Path, list[str]]]:
    """The same 12 documents as every local kind of source: {kind: (path, extra prepare options)}."""
    root = tmp_path_factory.mktemp("sources")
    out = {"jsonl": (write_jsonl(root / "docs.jsonl", [{"id": i, "text": d} for i, d in enumerate(DOCS)]), [])}
    pa, pq = pytest.importorskip("pyarrow"), pytest.importorskip("pyarrow.parquet")
    pq.write_table(pa.table({"story": DOCS, "n": list(range(len(DOCS)))}), root / "docs.parquet", row_group_size=5)
    out["parquet"] = (root / "docs.parquet", ["--field", "story"])
    datasets = pytest.importorskip("datasets")
    dataset = datasets.Dataset.from_dict({"text": DOCS, "n": list(range(len(DOCS)))})
    dataset.save_to_disk(str(root / "saved"))
    datasets.DatasetDict({"train": dataset.select(range(2)), "validation": dataset}).save_to_disk(str(root / "dict"))
    out["saved"] = (root / "saved", [])
    out["dict"] = (root / "dict", ["--split", "validation"])
    (root / "hub").mkdir()  # a folder of data files: read by datasets.load_dataset, streamed and spooled as hf: is
    pq.write_table(pa.table({"text": DOCS}), root / "hub" / "part-0.parquet", row_group_size=4)
    out["hf"] = (Path(f"hf:{root / 'hub'}"), [])
    return out


@pytest.mark.parametrize("kind", ["jsonl", "parquet", "saved", "dict", "hf"])
def test_each_source_prepares_whole_documents_and_trains(tmp_path, sources, kind):
    source, options = sources[kind]
    out = tmp_path / "prepared"
    result = invoke("prepare", source, "--out", out, "--ctx-len", 16, *options, "--json")
    assert result.exit_code == 0, result.output
    train, val, meta = prepared_text(out)
    k = expected_split(DOCS)
    assert 0 < k < len(DOCS)
    assert train == DOC_SEP.join(DOCS[:k]) and val == DOC_SEP.join(DOCS[k:])  # whole documents, in order
    assert {key: meta[key] for key in ("documents", "val_documents", "separator", "max_chars", "capped")} == \
        {"documents": 12, "val_documents": 12 - k, "separator": "\n\n", "max_chars": None, "capped": False}
    assert meta["source"] == str(source) and meta["characters"] == len(DOC_SEP.join(DOCS))
    assert meta["field"] == ("story" if kind == "parquet" else "text")
    assert meta["split"] == {"dict": "validation", "hf": "train"}.get(kind)
    assert json.loads(result.stdout) == {k: v for k, v in meta.items() if k != "char_counts"} | {"out": str(out)}
    assert sorted(p.name for p in out.iterdir()) == ["meta.json", "train.bin", "val.bin", "vocab.json"]  # no spool left
    run = tmp_path / "run"
    assert invoke("train", *train_sets(out), "--out", run).exit_code == 0
    assert runs.read_summary(run)["corpus_sha256"] == meta["sha256"]
    if kind in ("jsonl", "saved"):  # training straight from the file reads it the same way as prepare
        direct = tmp_path / "direct"
        assert invoke("train", *train_sets(source), "--out", direct).exit_code == 0
        assert losses(direct) == losses(run) and len(losses(run)) == 5


def test_training_straight_from_parquet_equals_training_on_its_prepared_folder(tmp_path, sources):
    parquet = Path(str(sources["hf"][0])[len("hf:"):]) / "part-0.parquet"  # field "text", the one training reads
    assert invoke("prepare", parquet, "--out", tmp_path / "p", "--ctx-len", 16).exit_code == 0
    for source, run in ((parquet, tmp_path / "direct"), (tmp_path / "p", tmp_path / "run")):
        assert invoke("train", *train_sets(source), "--out", run).exit_code == 0
    assert losses(tmp_path / "direct") == losses(tmp_path / "run")


def test_resume_refuses_a_changed_dataset(tmp_path):
    from anatomy_cli.spec.config import RunConfig, validate
    from anatomy_cli.training.run import train

    source = write_jsonl(tmp_path / "d.jsonl", [{"text": d} for d in DOCS])
    cfg = validate(RunConfig, {"model": TINY_MODEL, "train": {**TINY_TRAIN, "sample_len": 0},
                               "data": {"source": str(source)}})
    seen = {"step": 0}
    run = tmp_path / "run"
    summary = train(cfg, run, progress=lambda p: seen.update(step=p["step"]), stop=lambda: seen["step"] >= 3)
    assert summary["status"] == runs.INTERRUPTED
    write_jsonl(source, [{"text": d} for d in DOCS[1:] + DOCS[:1]])  # the same documents in another order
    one_error_line(invoke("train", "--resume", run), "the corpus changed since the run started (sha256")
    write_jsonl(source, [{"text": d} for d in DOCS])
    assert invoke("train", "--resume", run).exit_code == 0


def test_a_stream_equals_the_same_documents_read_from_a_file(tmp_path, sources):
    """hf: (spooled to disk between its passes) and Parquet give the same ids, vocabulary and hash."""
    a, b = tmp_path / "a", tmp_path / "b"
    assert invoke("prepare", sources["hf"][0], "--out", a, "--ctx-len", 8).exit_code == 0
    assert invoke("prepare", sources["parquet"][0], "--field", "story", "--out", b, "--ctx-len", 8).exit_code == 0
    for name in ("train.bin", "val.bin", "vocab.json"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    assert prepared_text(a)[2]["sha256"] == prepared_text(b)[2]["sha256"]


# ----------------------------------------------------------------------------- the split


@pytest.mark.parametrize("seed", range(40))
def test_validation_holds_whole_documents_and_never_overlaps_training(seed):
    rng = random.Random(seed)
    docs = [tiny_text(rng.randint(1, 300), seed=seed * 100 + i) for i in range(rng.randint(2, 30))]
    val_frac = rng.choice([0.05, 0.1, 0.3])
    corpus = corpus_mod.build(corpus_mod.Source("t", docs=lambda: iter(docs)), val_frac)
    k = expected_split(docs, val_frac)
    train, val = corpus.vocab.decode(corpus.train), corpus.vocab.decode(corpus.val)
    assert train == DOC_SEP.join(docs[:k]) and val == DOC_SEP.join(docs[k:])
    n_chars = len(DOC_SEP.join(docs))
    assert len(val) >= int(n_chars * val_frac)  # the straddling document goes to validation: at least val_frac
    assert corpus.meta["val_documents"] == len(docs) - k


def test_a_document_across_the_boundary_is_held_out_whole(tmp_path):
    # 9 short documents, then one of 400 characters that starts before the 10% boundary and ends after it
    docs = [f"doc {i} " + "x" * 90 for i in range(9)] + ["LONG " + "y" * 395]
    n_chars = len(DOC_SEP.join(docs))
    boundary = n_chars - int(n_chars * 0.1)
    start = len(DOC_SEP.join(docs[:9])) + len(DOC_SEP)
    assert start < boundary < start + len(docs[9])  # it straddles the boundary
    source = write_jsonl(tmp_path / "d.jsonl", [{"text": d} for d in docs])
    assert invoke("prepare", source, "--out", tmp_path / "p", "--ctx-len", 8).exit_code == 0
    train, val, meta = prepared_text(tmp_path / "p")
    assert val == docs[9] and train == DOC_SEP.join(docs[:9]) and "y" not in train
    assert meta["val_documents"] == 1 and meta["train_ids"] + meta["val_ids"] == n_chars - len(DOC_SEP)


def test_text_sources_keep_the_contiguous_split(tmp_path):
    text = DOC_SEP.join(DOCS)
    (tmp_path / "t.txt").write_text(text, encoding="utf-8")
    corpus = load.corpus_from_source(tmp_path / "t.txt")
    assert len(corpus.val) == int(len(text) * 0.1)  # cut mid-document, exactly at 10%
    assert corpus.vocab.decode(corpus.train) + corpus.vocab.decode(corpus.val) == text
    assert "documents" not in corpus.meta and "field" not in corpus.meta


# ----------------------------------------------------------------------------- the cap


@pytest.mark.parametrize("kind", ["jsonl", "hf"])
def test_a_corpus_larger_than_the_cap_is_cut_between_documents(tmp_path, sources, kind):
    source, options = sources[kind]
    cap = len(DOC_SEP.join(DOCS[:7])) + 100  # seven documents fit, the eighth would not
    result = invoke("prepare", source, "--out", tmp_path / "p", "--max-chars", cap, "--ctx-len", 8, *options)
    assert result.exit_code == 0, result.output
    train, val, meta = prepared_text(tmp_path / "p")
    assert meta["capped"] is True and meta["max_chars"] == cap and meta["documents"] == 7
    assert meta["characters"] == len(DOC_SEP.join(DOCS[:7])) <= cap
    assert train + DOC_SEP + val == DOC_SEP.join(DOCS[:7])
    whole = len(DOC_SEP.join(DOCS))
    for cap, capped in ((whole, False), (whole + 1, False), (whole - 1, True)):  # exactly the corpus is not a cut
        assert invoke("prepare", source, "--out", tmp_path / "q", "--max-chars", cap, "--ctx-len", 8,
                      *options).exit_code == 0
        meta = prepared_text(tmp_path / "q")[2]
        assert meta["capped"] is capped and meta["documents"] == 12 - capped


def test_the_cap_stops_reading_the_stream():
    read = []

    def docs():
        for i in range(10**9):  # endless: only the cap ends it
            read.append(i)
            yield f"document {i}"

    vocab, meta = corpus_mod.encode_source(corpus_mod.Source("endless", docs=docs), lambda code: (len, len), 0.5, 1,
                                           max_chars=1000)
    assert meta["capped"] and meta["characters"] <= 1000 and max(read) == meta["documents"]  # one past the cap, no more


# ----------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("rows, fragment", [
    ([{"text": "ok"}, "not json", {"text": "x"}], "line 2 is not valid JSON"),
    ([{"text": "ok"}, [1, 2]], "line 2 is not a JSON object"),
    ([{"text": "ok"}, {"text": 7}], "line 2: field 'text' is int, not a string"),
    ([{"text": "ok"}, {"text": None}], "line 2: field 'text' is null, not a string"),
    ([{"body": "ok", "id": 1}], "line 1 has no field 'text' (it has: body, id)"),
    ([], "dataset is empty"),
])
def test_bad_jsonl_is_one_line(tmp_path, rows, fragment):
    path = tmp_path / "d.jsonl"
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows), encoding="utf-8")
    one_error_line(invoke("prepare", path, "--out", tmp_path / "p"), fragment)
    assert not (tmp_path / "p").exists()  # nothing left behind


def test_bad_datasets_are_one_line(tmp_path, sources):
    pa, pq = pytest.importorskip("pyarrow"), pytest.importorskip("pyarrow.parquet")
    one_error_line(invoke("prepare", sources["parquet"][0], "--out", tmp_path / "p"),
                   "has no field 'text' (it has: story, n); pick one with `anatomy prepare --field NAME`")
    one_error_line(invoke("prepare", sources["saved"][0], "--field", "body", "--out", tmp_path / "p"),
                   "has no field 'body' (it has: text, n)")
    one_error_line(invoke("prepare", sources["hf"][0], "--field", "body", "--out", tmp_path / "p"),
                   "has no field 'body'")
    one_error_line(invoke("prepare", sources["dict"][0], "--split", "test", "--out", tmp_path / "p"),
                   "has no split 'test' (it has: train, validation)")
    one_error_line(invoke("prepare", sources["saved"][0], "--split", "train", "--out", tmp_path / "p"), "drop --split")
    pq.write_table(pa.table({"text": ["a b c", None]}), tmp_path / "nulls.parquet")
    one_error_line(invoke("prepare", tmp_path / "nulls.parquet", "--out", tmp_path / "p"),
                   "row 2: field 'text' is null")
    pq.write_table(pa.table({"text": pa.array([], pa.string())}), tmp_path / "empty.parquet")
    one_error_line(invoke("prepare", tmp_path / "empty.parquet", "--out", tmp_path / "p"), "dataset is empty")
    (tmp_path / "fake.parquet").write_text("not parquet")
    one_error_line(invoke("prepare", tmp_path / "fake.parquet", "--out", tmp_path / "p"), "is not a Parquet file")
    assert not (tmp_path / "p").exists()


@pytest.mark.parametrize("options, fragment", [
    (["--max-chars", 0], "--max-chars must be a positive number of characters, got 0"),
    (["--max-chars", -5], "--max-chars must be a positive number of characters, got -5"),
    (["--max-chars", 10], "--max-chars 10 is shorter than the first document"),
    (["--split", "train"], "--split applies to hf: datasets and save_to_disk folders"),
])
def test_bad_options_are_one_line(tmp_path, sources, options, fragment):
    one_error_line(invoke("prepare", sources["jsonl"][0], "--out", tmp_path / "p", *options), fragment)


def test_options_for_datasets_are_refused_on_text(tmp_path):
    (tmp_path / "t.txt").write_text(tiny_text(500), encoding="utf-8")
    one_error_line(invoke("prepare", tmp_path / "t.txt", "--field", "body", "--out", tmp_path / "p"),
                   "--field and --split apply to document sources")
    one_error_line(invoke("prepare", tmp_path / "t.txt", "--max-chars", 100, "--out", tmp_path / "p"),
                   "--max-chars applies to document sources")


def test_hf_without_the_extra_names_the_install_command(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # import datasets raises ImportError
    one_error_line(invoke("prepare", "hf:roneneldan/TinyStories", "--out", tmp_path / "p"),
                   "hf: datasets need the datasets library: pip install 'anatomy-cli[data]'")
    (tmp_path / "saved").mkdir()
    (tmp_path / "saved" / "dataset_dict.json").write_text("{}")
    one_error_line(invoke("prepare", tmp_path / "saved", "--out", tmp_path / "p"), "pip install 'anatomy-cli[data]'")


def test_offline_hub_is_one_line_saying_what_to_do(tmp_path, monkeypatch):
    datasets = pytest.importorskip("datasets")
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)  # what HF_HUB_OFFLINE=1 sets at import
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "cache")  # nothing cached to fall back on
    line = one_error_line(invoke("prepare", "hf:roneneldan/TinyStories", "--out", tmp_path / "p", "--max-chars", 1000),
                          "cannot reach the Hugging Face Hub for hf:roneneldan/TinyStories")
    assert "OfflineModeIsEnabled" in line and "copy its --out folder here" in line and "save_to_disk folder" in line
    assert not (tmp_path / "p").exists()


def test_a_connection_lost_mid_stream_is_one_line_and_leaves_nothing(tmp_path, monkeypatch):
    datasets = pytest.importorskip("datasets")

    def rows():
        yield from ({"text": d} for d in DOCS[:5])
        raise ConnectionError("Server Disconnected")  # what datasets' streaming reads raise once retries run out

    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: datasets.IterableDataset.from_generator(rows))
    out = tmp_path / "p"
    out.mkdir()
    (out / ".keep").write_text("mine")  # a hidden file: prepare refuses a folder of other visible files up front
    line = one_error_line(invoke("prepare", "hf:someone/stories", "--out", out),
                          "the connection to the Hugging Face Hub failed while streaming hf:someone/stories")
    assert "Server Disconnected" in line and "offline, prepare on a machine with network" in line
    assert sorted(p.name for p in out.iterdir()) == [".keep"]  # spool and partial ids removed


def test_training_on_hf_is_refused_with_the_prepare_command(tmp_path):
    one_error_line(invoke("train", *train_sets(Path("hf:roneneldan/TinyStories")), "--out", tmp_path / "r"),
                   "prepare it once with `anatomy prepare hf:roneneldan/TinyStories --out DIR`, then train on DIR")
    assert not (tmp_path / "r").exists()


def test_a_failed_prepare_keeps_the_folder_it_would_replace(tmp_path, sources):
    out = tmp_path / "p"
    assert invoke("prepare", sources["jsonl"][0], "--out", out, "--ctx-len", 8).exit_code == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"text": d} for d in DOCS] + [{"text": 1}])
    one_error_line(invoke("prepare", bad, "--out", out), "line 13: field 'text' is int")
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    prepared.load_prepared(out)


# ----------------------------------------------------------------------------- progress


def test_progress_is_plain_lines_off_a_terminal(tmp_path, sources, monkeypatch):
    monkeypatch.setattr(PrepareProgress, "PLAIN_S", 0.0)  # a line at every update instead of every 10 s
    result = invoke("prepare", sources["jsonl"][0], "--out", tmp_path / "p", "--ctx-len", 8, "--json")
    assert result.exit_code == 0
    lines = result.stderr.splitlines()
    assert lines[0] == f"read: {len(DOC_SEP.join(DOCS)):,} characters, 12 documents"
    assert lines[-1] == f"write ids: {len(DOC_SEP.join(DOCS)) - len(DOC_SEP):,} characters"
    assert json.loads(result.stdout)["documents"] == 12  # stdout stays machine-readable
    assert all(not line.startswith("read") for line in result.stdout.splitlines())


def test_documents_module_names_its_kinds():
    for source in ("x.jsonl", "x.parquet", "hf:a/b", "hf:a/b:config"):
        assert documents.is_document_source(source)
    assert not documents.is_document_source("x.txt")
    with pytest.raises(DataError, match="needs a dataset name"):
        documents.open_documents("hf:")


def test_prepare_help_names_every_source_and_option():
    result = runner.invoke(app, ["prepare", "--help"], env={"COLUMNS": "200"})
    flat = " ".join(result.output.replace("│", " ").split())
    for fragment in (".jsonl or .parquet file", "save_to_disk folder", "hf:NAME[:CONFIG]",
                     "pip install 'anatomy-cli[data]'",
                     "--field", "[default: text]", "--split", "[default: train]", "--max-chars", "whole documents"):
        assert fragment in flat, fragment

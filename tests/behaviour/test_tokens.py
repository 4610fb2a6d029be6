"""Tokens across the rooms: a BPE run trained from a text (its tokenizer trained on the fly) or from a
prepared folder records bits per byte in every eval line and its summary; sample, eval and resume speak
its tokens; a char run records bits per byte too. Real training at toy size, real tokenizers."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from helpers import invoke, one_error_line
from toy_data import TINY_MODEL, TINY_TRAIN

from anatomy_cli.data.batches import bits_per_byte, eval_counts, run_eval_counts
from anatomy_cli.data.load import run_corpus
from anatomy_cli.model.generate import generate
from anatomy_cli.spec.config import RunConfig, validate
from anatomy_cli.store import runs
from anatomy_cli.store.summary import RunSummary
from anatomy_cli.training import run as training
from anatomy_cli.training.checkpoint import load_run, load_run_config
from anatomy_cli.training.stacked import train_group

pytestmark = [pytest.mark.usefixtures("single_thread")]

TEXT = "\n".join(f"Line {i}: the model reads 注意力 and predicts the next token; café {i % 7}." for i in range(300))


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    path = tmp_path_factory.mktemp("tokens") / "text.txt"
    path.write_text(TEXT, encoding="utf-8")
    return path


def config(source, tokenizer: str = "char", **train) -> RunConfig:
    return validate(RunConfig, {"seed": 3, "model": TINY_MODEL, "train": {**TINY_TRAIN, "threads": 1, **train},
                                "data": {"source": str(source), "tokenizer": tokenizer}})


@pytest.fixture(scope="module")
def bpe_run(source, tmp_path_factory):
    cfg = config(source, "bpe:320")
    run_dir = tmp_path_factory.mktemp("bpe") / "run"
    return cfg, run_dir, training.train(cfg, run_dir)


def test_every_run_records_bits_per_byte(source, bpe_run, tmp_path):
    char = (config(source), tmp_path / "c", training.train(config(source), tmp_path / "c"))
    for cfg, run_dir, summary in (bpe_run, char):
        corpus = run_corpus(cfg)
        t = cfg.train
        assert (summary["val_tokens"], summary["val_bytes"]) == run_eval_counts(corpus, cfg) \
            == eval_counts(corpus, cfg.model.ctx_len, t.batch_size, t.eval_batches)
        assert summary["val_tokens"] == t.batch_size * t.eval_batches * cfg.model.ctx_len
        assert summary["best_val_bpb"] == pytest.approx(
            summary["best_val_loss"] * summary["val_tokens"] / (math.log(2) * summary["val_bytes"]), rel=1e-12)
        evals = [m for m in runs.read_metrics(run_dir) if "val_loss" in m]
        assert len(evals) == 3 and all(m["val_bpb"] == pytest.approx(
            bits_per_byte(m["val_loss"], summary["val_tokens"], summary["val_bytes"]), rel=1e-12) for m in evals)
        assert summary["tokenizer"] == cfg.data.tokenizer
        assert RunSummary.check(summary) is None
    cfg, run_dir, summary = bpe_run
    assert (run_dir / runs.TOKENIZER).is_file() and not (run_dir / runs.VOCAB).exists()
    assert summary["tokenizer_sha256"] == run_corpus(cfg).vocab.sha256
    assert summary["val_bytes"] > summary["val_tokens"]  # a BPE token holds more than a byte


def test_a_bpe_run_samples_its_tokens_as_text(bpe_run):
    """`sample` encodes the prefix with the run's tokenizer and prints what the ids decode to: the greedy
    ids of generate, decoded whole, are the streamed text."""
    cfg, run_dir, _ = bpe_run
    prefix = "注意 the model"
    result = invoke("sample", run_dir, "--prefix", prefix, "--temp", "0", "--max-new", "12")
    assert result.exit_code == 0, result.output
    _, vocab, model = load_run(run_dir)
    ids = vocab.encode(prefix)
    want = vocab.decode(ids + list(generate(model, ids, 12, temp=0)))
    assert result.stdout == want + "\n"
    assert (run_dir / runs.SAMPLES).read_text(encoding="utf-8").splitlines()[1].startswith(cfg.train.sample_prefix)


def test_eval_at_the_trained_length_gives_the_runs_bits_per_byte(bpe_run):
    _, run_dir, summary = bpe_run
    result = invoke("eval", run_dir, "--ctx", "1x,2x")
    assert result.exit_code == 0, result.output
    record = json.loads((run_dir / runs.EVAL).read_text())
    n = str(TINY_MODEL["ctx_len"])
    assert record["val_loss_by_ctx"][n] == pytest.approx(summary["best_val_loss"], rel=1e-6)
    assert record["val_bpb_by_ctx"][n] == pytest.approx(summary["best_val_bpb"], rel=1e-6)
    assert record["val_bpb_by_ctx"][str(2 * TINY_MODEL["ctx_len"])] is None  # learned positions end: n/a


def test_a_prepared_bpe_folder_trains_resumes_and_keeps_its_ids(source, tmp_path):
    out = tmp_path / "prepared"
    assert invoke("prepare", source, "--tokenizer", "bpe:320", "--out", out, "--ctx-len", 16).exit_code == 0
    cfg = validate(RunConfig, {**config(source, "bpe:320").model_dump(), "data": {"source": str(out),
                                                                                  "tokenizer": "bpe:320"}})
    corpus = run_corpus(cfg)
    from_text = run_corpus(config(source, "bpe:320"))  # trained on the fly: the same tokenizer, the same ids
    assert corpus.vocab.sha256 == from_text.vocab.sha256 and np.array_equal(corpus.train, from_text.train)
    seen = {"step": 0}
    summary = training.train(cfg, tmp_path / "run", progress=lambda p: seen.update(step=p["step"]),
                             stop=lambda: seen["step"] >= 6)
    assert summary["status"] == runs.INTERRUPTED
    assert invoke("train", "--resume", tmp_path / "run").exit_code == 0
    done = runs.read_summary(tmp_path / "run")
    alone = training.train(cfg, tmp_path / "alone")
    assert done["status"] == runs.COMPLETED and done["best_val_bpb"] == pytest.approx(alone["best_val_bpb"], rel=1e-5)


def test_a_resume_refuses_another_tokenizer(bpe_run, tmp_path):
    _, run_dir, summary = bpe_run
    cfg = load_run_config(run_dir)  # resolved: vocab_size filled in
    corpus = run_corpus(cfg)
    before = RunSummary.model_validate({**summary, "tokenizer_sha256": "0" * 64})
    with pytest.raises(runs.RunError, match="the tokenizer changed since the run started"):
        training.check_corpus(run_dir, cfg, before, corpus)
    training.check_corpus(run_dir, cfg, RunSummary.model_validate(summary), corpus)  # its own: fine


def test_stacked_seeds_record_bits_per_byte_as_alone(source, tmp_path):
    cfgs = [config(source, "bpe:320").model_copy(update={"seed": s}) for s in (1, 2)]
    summaries = train_group(cfgs, [tmp_path / "s1", tmp_path / "s2"])
    alone = training.train(cfgs[1], tmp_path / "alone")
    assert {s["val_bytes"] for s in summaries} == {alone["val_bytes"]}
    assert summaries[1]["best_val_bpb"] == pytest.approx(alone["best_val_bpb"], abs=1e-4)
    assert all("val_bpb" in m for m in runs.read_metrics(tmp_path / "s1") if "val_loss" in m)


def test_vocab_size_of_another_tokenizer_is_one_line(source):
    result = invoke("train", "--set", f"data.source={source}", "--set", "data.tokenizer=bpe:320",
                    "--set", "model.vocab_size=100", "--steps", "1")
    one_error_line(result, "the corpus has 320 tokens (bpe:320)")


def test_a_char_run_is_unchanged_by_tokens(source, tmp_path):
    """data.tokenizer at its default leaves the run id and the run's files as they were: vocab.json, no
    tokenizer.json; its bits per byte count each character's UTF-8 bytes (Chinese: 3)."""
    cfg = config(source)
    assert runs.run_id("x", 1, cfg.model_dump(mode="json")) == runs.run_id(
        "x", 1, {**cfg.model_dump(mode="json"), "data": {"source": str(source), "val_frac": 0.1}})
    summary = training.train(cfg, tmp_path / "c")
    assert (tmp_path / "c" / runs.VOCAB).is_file() and not (tmp_path / "c" / runs.TOKENIZER).exists()
    assert summary["val_bytes"] > summary["val_tokens"]  # 注意力 and é are more than a byte each


# ------------------------------------------------------------------------- a study across tokenizers


def tokenizer_spec(tmp_path, source, **top):
    from toy_data import write_spec

    return write_spec(tmp_path, name="toks", corpus=source, top={"flips": ["rope"], "seeds": 2, **top})


def test_a_spec_names_several_tokenizers_as_it_names_sizes(source, tmp_path):
    """Every config at every tokenizer, its slug led by the tokenizer, its vocabulary its tokenizer's; a spec
    without the key plans what it planned before (no run id moves)."""
    from anatomy_cli.sweep.plan import check_data, load_plan

    _, before = load_plan(tokenizer_spec(tmp_path, source))
    spec, plan = load_plan(tokenizer_spec(tmp_path, source, tokenizers=["char", "bpe:0320"]))
    assert spec.tokenizers == ["char", "bpe:0320"] and spec.tokenizer_list == ["char", "bpe:320"]
    assert len(plan) == 2 * len(before)
    assert {p.slug.split("_")[0] for p in plan} == {"char", "bpe320"}
    assert all(p.config.data.tokenizer == ("bpe:320" if p.slug.startswith("bpe320_") else "char") for p in plan)
    assert [p.slug.removeprefix("char_") for p in plan if p.slug.startswith("char_")] == [p.slug for p in before]
    vocab = check_data(plan)  # one corpus per (source, tokenizer): two vocabularies of one text
    assert vocab == {(str(source), "char"): len(set(TEXT)), (str(source), "bpe:320"): 320}


@pytest.mark.parametrize("top, fragment", [
    ({"tokenizers": ["char", "bpe:1"]}, "tokenizers: bpe:1 is refused"),
    ({"tokenizers": ["bpe:320", "bpe:0320"]}, "tokenizers: bpe:320 is named twice"),
    ({"tokenizers": ["char", "bpe:320"], "axes": {"data.tokenizer": ["char"]}}, "axes.data.tokenizer and tokenizers"),
    ({"flips": ["bpe"], "components": {"bpe": {"on": {"data.tokenizer": "bpe:320"}}}},
     "component bpe switches data.tokenizer: its runs would pair two tokenizers in one family"),
])
def test_a_study_mixing_tokenizers_in_one_family_is_one_line(source, tmp_path, top, fragment):
    spec = tokenizer_spec(tmp_path, source, **top)
    for command in (["ablate", spec, "--dry-run"], ["components", spec]):
        one_error_line(invoke(*command), fragment)


def test_tokenizers_beside_a_base_tokenizer_is_one_line(source, tmp_path):
    spec = tokenizer_spec(tmp_path, source, tokenizers=["char", "bpe:320"])
    spec.write_text(spec.read_text() + 'tokenizer = "bpe:320"\n')  # under [base.data]
    one_error_line(invoke("ablate", spec, "--dry-run"), "base.data.tokenizer and tokenizers both name the tokenizer")


def test_a_tokenizer_json_in_tokenizers_resolves_against_the_spec_folder(source, tmp_path):
    from anatomy_cli.sweep.plan import load_plan

    out = tmp_path / "prep"
    assert invoke("prepare", source, "--tokenizer", "bpe:320", "--out", out).exit_code == 0
    (tmp_path / "mine.json").write_bytes((out / "tokenizer.json").read_bytes())
    spec = tokenizer_spec(tmp_path, source, tokenizers=["char", "mine.json"])
    _, plan = load_plan(spec)
    assert {p.config.data.tokenizer for p in plan} == {"char", str(tmp_path / "mine.json")}
    assert {p.slug.split("_")[0] for p in plan} == {"char", "mine"}

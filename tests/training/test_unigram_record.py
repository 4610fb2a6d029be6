"""training.run records the corpus's unigram loss in summary.json (data.corpus.unigram_loss): the plateau a
report measures each run's val curve against (report/plateau.py), kept through a stop and a resume."""

from __future__ import annotations

import json

import pytest
from toy_data import TINY_MODEL, TINY_TRAIN, write_corpus

from anatomy_cli.data.corpus import unigram_loss
from anatomy_cli.data.load import load_corpus
from anatomy_cli.spec.config import RunConfig, validate
from anatomy_cli.store import runs
from anatomy_cli.training.run import resume, train


def test_a_run_records_its_corpus_unigram_loss_through_a_stop_and_a_resume(tmp_path):
    corpus = write_corpus(tmp_path)
    cfg = validate(RunConfig, {"model": TINY_MODEL, "train": {**TINY_TRAIN, "sample_len": 0},
                               "data": {"source": str(corpus)}})
    expected = unigram_loss(load_corpus(str(corpus), cfg.data.val_frac, cfg.model.ctx_len))
    seen = {"step": 0}
    stopped = train(cfg, tmp_path / "run", progress=lambda p: seen.update(step=p["step"]),
                    stop=lambda: seen["step"] >= 4)
    assert stopped["status"] == runs.INTERRUPTED and stopped["unigram_loss"] == pytest.approx(expected)
    done = resume(tmp_path / "run")
    assert done["status"] == runs.COMPLETED and done["unigram_loss"] == pytest.approx(expected)
    assert json.loads((tmp_path / "run" / runs.SUMMARY).read_text())["unigram_loss"] == pytest.approx(expected)
    assert 1.0 < expected < 4.0  # a few dozen characters of English-like text: well under ln V

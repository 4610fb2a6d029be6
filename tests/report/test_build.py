"""report/build.py: the report computed once. One `anatomy report` (and the report `ablate` writes at its end)
reads each study record of each folder once and loads the runs once, a tuned study's included, and every output
(terminal, report.md/.html, report.json, the results file) is read from the one Report."""

from __future__ import annotations

import collections
import json

import pytest
from helpers import invoke
from report_runs import called_sweep

from anatomy_cli.report import build as build_mod
from anatomy_cli.report import frames, rules
from anatomy_cli.report.build import build_report
from anatomy_cli.store import records
from tests.report.test_lr_comparison import tuned_folder
from tests.report.test_rule_words import decided_study

READERS = ("read_study", "read_decide", "read_tune", "read_timing")


@pytest.fixture
def counted(monkeypatch):
    """{(reader, folder): calls} of every study record read, and {"load_runs": calls}, while the test runs."""
    seen = collections.Counter()
    for name in READERS:
        real = getattr(records, name)

        def reader(folder, *args, _real=real, _name=name, **kw):
            seen[(_name, str(folder))] += 1
            return _real(folder, *args, **kw)

        for module in (records, rules, frames, build_mod):  # wherever a module took the reader by name
            if hasattr(module, name):
                monkeypatch.setattr(module, name, reader)
        monkeypatch.setattr(records, name, reader)
    real_load = frames.load_runs

    def load(*args, **kw):
        seen["load_runs"] += 1
        return real_load(*args, **kw)

    monkeypatch.setattr(frames, "load_runs", load)
    return seen


def test_a_tuned_decided_study_s_report_reads_each_record_once_and_its_runs_once(tmp_path, counted):
    root = tuned_folder(tmp_path)
    counted.clear()  # what the study itself read while it trained is not the report's
    results = tmp_path / "results.json"
    done = invoke("report", root, "--results", results)
    assert done.exit_code == 0, done.output
    reads = {k: n for k, n in counted.items() if k != "load_runs"}
    assert reads and max(reads.values()) == 1, reads
    assert {name for name, _ in reads} == set(READERS)  # the study's four records, each once
    assert counted["load_runs"] == 1  # the selection and shared-LR runs from the same load as the study's
    assert json.loads(results.read_text())["tuning"]["comparison"]


def test_a_report_of_a_parent_folder_reads_each_study_s_records_once(tmp_path, counted):
    decided_study(tmp_path / "runs" / "a")
    called_sweep(tmp_path / "runs" / "b")
    (tmp_path / "runs" / "b" / "decide.json").write_text((tmp_path / "runs" / "a" / "decide.json").read_text())
    counted.clear()
    r = build_report(tmp_path / "runs")
    assert max(n for k, n in counted.items() if k != "load_runs") == 1 and counted["load_runs"] == 1
    assert set(r.studies) == {tmp_path / "runs" / "a", tmp_path / "runs" / "b"}


def test_the_report_is_one_frozen_object_every_output_reads(tmp_path):
    called_sweep(tmp_path / "s")
    r = build_report(tmp_path / "s")
    with pytest.raises(AttributeError):
        r.runs = r.runs.iloc[:0]  # frozen: no output changes what another one shows
    assert set(r.effects["metric"]) == {"best_val_bpb", "tokens_per_s"}
    assert r.loss.equals(r.effects[r.effects["metric"] == "best_val_bpb"])
    assert list(r.verdict["flip"]) and r.tuning is None and r.scale is None and r.rules.looks == 1
    assert "config" in r.runs and "lr" in r.runs and r.runs["lr"].notna().all()  # read from each run's config

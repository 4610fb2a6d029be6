"""A report of a parent folder holding a study and a tuned study side by side (issue 48 item 6): each study is
judged as itself (its effects, intervals and calls as its own folder's report has them, in a group named after
it), the tuned study's selection runs never count as study seeds, and its LR comparison is kept; two tuned
studies under one parent are refused in one line."""

from __future__ import annotations

import json
import shutil

import pytest
from helpers import invoke, one_error_line
from toy_data import write_spec

from anatomy_cli.report.build import build_report

pytestmark = pytest.mark.slow  # trains a study and a tuned study at toy size

TRAIN = {"steps": 4, "eval_interval": 2, "lr": 0.04}  # both configs tuned inside the grid
TUNE = ("--tune-lr", "--tune-points", "3", "--tune-extend", "1")
COLUMNS = ["metric", "flip", "direction", "n_pairs", "gain", "adj_low", "adj_high", "call", "note"]


@pytest.fixture(scope="module")
def parent(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("side")
    top = {"seeds": 2, "flips": ["rope"], "directions": ["add-one"]}
    for name, extra in (("plain", ()), ("tuned", TUNE)):
        spec = write_spec(tmp, name=name, top=top, train=TRAIN)
        done = invoke("ablate", spec, "--runs-dir", tmp / "runs", "--workers", "1", "--stack", "off", "--no-report",
                      *extra)
        assert done.exit_code == 0, done.output
    return tmp / "runs"


def _effects(report, study: str | None = None):
    frame = report.effects
    if study is not None:
        frame = frame[frame["group"].str.split(", ").str[0] == f"study={study}"]
    return frame[COLUMNS].sort_values(["metric", "flip"]).reset_index(drop=True)


def test_each_study_in_a_parent_is_judged_as_itself(parent):
    both = build_report(parent)
    # one group a study (the plain one's label says its LR, the tuned one's configs each have their own), none per
    # grid LR
    assert set(both.loss["group"]) == {"study=plain, train.lr=0.04", "study=tuned"}
    assert both.rules.tune is not None and both.tuning is not None  # the tuned verdict and its comparison
    assert set(both.runs["seed"]) == {1337, 1338}  # the selection seed 1336 is no study seed
    for study in ("plain", "tuned"):
        own = build_report(parent / study)
        assert len(own.effects) and _effects(both, study).equals(_effects(own)), study
    assert "LR selection's error" in " ".join(_effects(both, "tuned")["note"].dropna())
    assert not _effects(both, "plain")["note"].fillna("").str.contains("LR selection").any()
    result = invoke("report", parent, "--format", "csv")
    assert result.exit_code == 0, result.output


def test_a_tuned_results_file_records_its_allowance_and_is_judged_again_alike(parent, tmp_path):
    path = tmp_path / "tuned.json"
    result = invoke("report", parent / "tuned", "--format", "csv", "--results", path)
    assert result.exit_code == 0, result.output
    loss = [e for e in json.loads(path.read_text())["effects"] if e["metric"] == "best_val_bpb"]
    assert loss and all(e["allow_low"] >= 0 and e["allow_high"] >= 0 for e in loss), loss
    again = invoke("rejudge", path, "--check")
    assert again.exit_code == 0 and "no call changes" in again.stdout, again.output


def test_two_tuned_studies_under_one_parent_are_refused(parent, tmp_path):
    root = tmp_path / "runs"
    shutil.copytree(parent / "tuned", root / "tuned")
    shutil.copytree(parent / "tuned", root / "tuned-again")
    one_error_line(invoke("report", root, "--format", "csv"), f"{root} holds 2 tuned studies", code=2)
    assert not (root / "report").exists()

"""report/rejudge.py: a results file judged again by today's rule from what it records (issue 35, item 6)."""

from __future__ import annotations

import json

import pytest
from helpers import invoke, one_error_line
from report_runs import called_sweep

from anatomy_cli.report import rejudge, results_blocks, results_file, stats


@pytest.fixture
def written(tmp_path):
    """A results file as `anatomy report --results` writes it, from a toy study of five flips, 3 seeds."""
    called_sweep(tmp_path / "runs")
    path = tmp_path / "study.json"
    result = invoke("report", tmp_path / "runs", "--format", "csv", "--results", path)
    assert result.exit_code == 0, result.output
    return path


def test_a_file_the_report_wrote_today_is_judged_the_same(written):
    """The paired sd recovered from the recorded raw interval gives back every call, interval and mde
    the report wrote: rejudging is exactly the report's rule on the same runs."""
    doc = results_file.load(written)
    new, changes = rejudge.rejudge(doc)
    assert changes == []
    for old, fresh in zip(doc["effects"], new["effects"]):
        assert fresh["call"] == old["call"]
        for key in ("adj_low", "adj_high", "mde", "df"):
            if old[key] is not None:
                assert fresh[key] == pytest.approx(old[key], rel=1e-4, abs=2e-6), key  # the file keeps 6 decimals


def test_a_call_that_rested_on_pooling_is_judged_on_its_own_variance(written):
    doc = results_file.load(written)
    loss = [e for e in doc["effects"] if e["metric"] == "best_val_bpb"]
    e = loss[0]
    # as the rule of issues 28-34 recorded one: a narrow interval on 12 pooled df, its own raw one wide
    e |= {"gain": -0.048, "raw_low": -0.110, "raw_high": 0.014, "adj_low": -0.084, "adj_high": -0.012, "df": 12.0,
          "prior_df": None, "call": stats.HURTS}
    new, changes = rejudge.rejudge(doc)
    (change,) = [c for c in changes if c["what"].startswith(e["flip"])]
    assert (change["before"], change["after"]) == (stats.HURTS, stats.UNDECIDED)
    fresh = next(x for x in new["effects"] if x["flip"] == e["flip"] and x["metric"] == "best_val_bpb")
    assert fresh["df"] == 2 and "prior_df" not in fresh and fresh["adj_low"] < 0 < fresh["adj_high"]


def test_speed_from_training_runs_is_not_timed(written):
    doc = results_file.load(written)
    speed = [e for e in doc["effects"] if e["metric"] == "tokens_per_s"]
    assert speed, "the toy study records tokens/s"
    for e in speed:
        e["call"] = stats.HELPS  # a file written before issue 37 called them
    new, changes = rejudge.rejudge(doc)
    assert {e["call"] for e in new["effects"] if e["metric"] == "tokens_per_s"} == {stats.NOT_TIMED}
    assert len([c for c in changes if c["after"] == stats.NOT_TIMED]) == len(speed)


def test_the_command_rewrites_checks_and_refuses(written, tmp_path):
    doc = json.loads(written.read_text())
    doc["effects"][0]["call"] = stats.SMALL  # a call the recorded numbers do not give
    written.write_text(json.dumps(doc, indent=1) + "\n")
    before = written.read_text()
    checked = invoke("rejudge", written, "--check")
    assert checked.exit_code == 1 and written.read_text() == before  # --check writes nothing
    assert "| below margin |" in checked.stdout
    assert invoke("rejudge", written).exit_code == 0
    again = invoke("rejudge", written, "--check")
    assert again.exit_code == 0 and "no call changes" in again.stdout  # judged again: nothing left to change
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    one_error_line(invoke("rejudge", bad), "not an anatomy results file")


def test_a_ladder_is_judged_again_whole_by_size_rows_and_trends():
    """On the shipped scale study: each size's row repeats its effect's interval and call, and a second
    pass changes nothing (the rewritten file is a fixed point)."""
    doc = results_file.load(results_blocks.RESULTS_DIR / "scale.json")
    stale = json.loads(json.dumps(doc))
    for row in stale["scale"]["effects"]:
        row |= {"adj_low": -9.0, "adj_high": 9.0}  # an interval the effect does not have
    new, _ = rejudge.rejudge(stale)
    # the effects as today's rule judges them (the file's may be a rule older: issue 48's sd floor)
    loss = {(e["flip"], e["direction"], e["group"]): e for e in new["effects"] if e["metric"] == "best_val_bpb"}
    for row in new["scale"]["effects"]:
        e = loss[(row["flip"], row["direction"], f"size {row['size']}")]
        assert (row["adj_low"], row["adj_high"], row["call"]) == (e["adj_low"], e["adj_high"], e["call"])
    assert rejudge.rejudge(new)[1] == []

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


def _shipped(name: str, tmp_path):
    """A copy of a shipped results file, to judge again or break."""
    copy = tmp_path / name
    copy.write_text((results_blocks.RESULTS_DIR / name).read_text())
    return copy


def test_a_tuned_file_is_judged_again_with_its_lr_allowance_and_its_calls_stay(tmp_path):
    """demo-tuned.json (written before the allowance was recorded): each tuned interval's widening is recovered from
    the interval that holds it, so judging it again gives back every interval and call as shipped; without the
    allowance (recorded as none) calls move, so the allowance is what holds them."""
    copy = _shipped("demo-tuned.json", tmp_path)
    shipped = results_file.load(copy)
    result = invoke("rejudge", copy)
    assert result.exit_code == 0 and "no call changes" in result.stdout, result.output
    for old, new in zip(shipped["effects"], results_file.load(copy)["effects"]):
        assert new["call"] == old["call"], old
        for key in ("adj_low", "adj_high"):
            if old[key] is not None:
                assert new[key] == pytest.approx(old[key], abs=1e-9), (key, old)
    bare = json.loads(json.dumps(shipped))
    for e in bare["effects"]:
        if e["metric"] == "best_val_bpb":
            e |= {"allow_low": None, "allow_high": None}
    assert rejudge.rejudge(bare)[1], "no call rests on the LR selection's allowance"


def _drop(key):
    return lambda e: {k: v for k, v in e.items() if k != key}


LOSS_CASES = [  # (what is broken, the row change, the field the line names)
    ("no metric", _drop("metric"), "effects[0].metric is missing"),
    ("no group", _drop("group"), "effects[0].group is missing"),
    ("no n_pairs", _drop("n_pairs"), "effects[0].n_pairs is missing"),
    ("no raw_low", _drop("raw_low"), "effects[0].raw_low is missing"),
    ("no call", _drop("call"), "effects[0].call is missing"),
    ("null gain", lambda e: e | {"gain": None}, "effects[0].gain is null where two pairs or more measured it"),
    ("null raw_high", lambda e: e | {"raw_high": None}, "effects[0].raw_high is null where two pairs or more"),
    ("adj_level 1", lambda e: e | {"adj_level": 1}, "effects[0].adj_level is 1 with family"),
]
TREND_CASES = [
    ("no fit_smallest", lambda t: {k: v for k, v in t.items() if k != "fit_smallest"},
     "scale.trends[0].fit_smallest is missing"),
    ("null slope_low", lambda t: t | {"slope_low": None}, "scale.trends[0].slope_low is null"),
    ("no series", lambda t: {k: v for k, v in t.items() if k != "series"}, "scale.trends[0].series is missing"),
]


@pytest.mark.parametrize("case, change, fragment", LOSS_CASES + TREND_CASES,
                         ids=[c[0] for c in LOSS_CASES + TREND_CASES])
def test_a_file_its_model_accepts_but_no_call_can_be_judged_from_is_one_line(tmp_path, case, change, fragment):
    copy = _shipped("scale.json", tmp_path)
    doc = json.loads(copy.read_text())
    if case in {c[0] for c in TREND_CASES}:
        tested = next(i for i, t in enumerate(doc["scale"]["trends"]) if t["sizes"] >= 2 and t["n_seeds"] >= 2)
        doc["scale"]["trends"][0] = change(doc["scale"]["trends"][tested])
    else:
        doc["effects"][0] = change(doc["effects"][0])
    copy.write_text(json.dumps(doc, indent=1) + "\n")
    results_file.load(copy)  # the typed model takes it: every key may be absent
    before = copy.read_text()
    for args in ((), ("--check",)):
        result = invoke("rejudge", copy, *args)
        one_error_line(result, f"{copy}: {fragment}")
        assert "no call changes" not in result.output and copy.read_text() == before


def test_a_size_row_without_its_size_is_one_line(tmp_path):
    copy = _shipped("scale.json", tmp_path)
    doc = json.loads(copy.read_text())
    del doc["scale"]["effects"][0]["size"]
    copy.write_text(json.dumps(doc))
    one_error_line(invoke("rejudge", copy, "--check"), f"{copy}: scale.effects[0].size is missing")


def test_an_effect_with_no_pairs_is_judged_not_crashed(tmp_path):
    copy = _shipped("demo.json", tmp_path)
    doc = json.loads(copy.read_text())
    doc["effects"][0] |= {"n_pairs": 0, "gain": None, "raw_low": None, "raw_high": None}
    copy.write_text(json.dumps(doc))
    new, _ = rejudge.rejudge(results_file.load(copy))
    assert new["effects"][0]["call"] == stats.NONE


def test_the_module_run_as_a_command_names_the_command(tmp_path):
    import subprocess
    import sys

    copy = _shipped("demo-tuned.json", tmp_path)
    before = copy.read_text()
    done = subprocess.run([sys.executable, "-m", "anatomy_cli.report.rejudge", str(copy)], capture_output=True,
                          text=True)
    assert done.returncode == 2 and done.stderr.strip() == (
        "error: judge results files again with `anatomy rejudge FILE ... [--check]`"), done
    assert copy.read_text() == before


def test_a_tuned_comparison_follows_its_rejudged_effects_and_judging_twice_changes_nothing(tmp_path):
    """The comparison with the shared LR repeats each tuned effect's call: judged again, a stale row takes its
    effect's interval and call, and the LR-confounded flag follows; a second pass reads the allowance the first
    recorded and leaves the document as it was."""
    doc = results_file.load(_shipped("demo-tuned.json", tmp_path))
    row = doc["tuning"]["comparison"][0]
    row |= {"call": "hurts", "adj_low": -9.0, "adj_high": -8.0, "confounded": True}  # stale against its effect
    once = rejudge.rejudge(doc)[0]
    effects = {(e["flip"], e["direction"]): e for e in once["effects"] if e["metric"] == "best_val_bpb"}
    for r in once["tuning"]["comparison"]:
        e = effects[(r["flip"], r["direction"])]
        assert (r["call"], r["adj_low"], r["adj_high"]) == (e["call"], e["adj_low"], e["adj_high"])
        assert r["confounded"] == (r["call"] != r["shared_call"])
    assert rejudge.rejudge(once)[0] == once

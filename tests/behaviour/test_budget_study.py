"""A budget ladder end to end at toy size (`anatomy ablate` with `[budgets]`, real training): each arm's
stable phase trained once to the largest budget, decays branched from its kept checkpoints at the smaller
ones, the report's data multipliers per budget; a rerun trains nothing; bad input is one line, exit 2."""

from __future__ import annotations

import json

import pytest
from helpers import invoke, one_error_line
from toy_data import write_spec

from anatomy_cli.report import worth
from anatomy_cli.store import records, runs

BUDGETS = [8, 12, 16, 24]
TRAIN = {"schedule": "wsd", "decay_frac": 0.25, "warmup": 2, "eval_interval": 4}
TOP = {"seeds": 3, "flips": ["rope"], "directions": ["add-one"]}


def spec(tmp_path, budgets=BUDGETS, train=None, **top):
    train = {k: v for k, v in {**TRAIN, **(train or {})}.items() if v is not None}  # None: left out
    path = write_spec(tmp_path, top={**TOP, **top}, train=train)
    with path.open("a", encoding="utf-8") as f:
        f.write(f"[budgets]\nsteps = {json.dumps(budgets)}\n")
    return path


@pytest.mark.parametrize("budgets, train, top, fragment", [
    ([8, 16, 12, 24], None, {}, "budgets.steps must increase: got 8, 16, 12, 24"),
    ([8, 12, 16], None, {}, "the data multipliers need 4 budgets or more"),
    (BUDGETS, {"warmup": 7}, {}, "budget 8: its decay (2 steps, train.decay_frac=0.25) is longer than its stable"),
    (BUDGETS, {"schedule": "cosine", "decay_frac": None}, {}, 'set base.train.schedule = "wsd"'),
    (BUDGETS, None, {"worth_margin": 1.0}, "worth_margin"),
])
def test_a_bad_budget_ladder_is_one_line_and_exit_2_before_anything_is_written(tmp_path, budgets, train, top,
                                                                                fragment):
    result = invoke("ablate", spec(tmp_path, budgets, train, **top), "--runs-dir", tmp_path / "runs", "--dry-run")
    one_error_line(result, fragment, code=2)
    assert not (tmp_path / "runs").exists()


def test_the_dry_run_plans_one_stable_run_and_its_decays_per_arm(tmp_path):
    from anatomy_cli.spec.config import AblationSpec, load_toml, validate
    from anatomy_cli.sweep import plan

    planned = plan.expand(validate(AblationSpec, load_toml(spec(tmp_path))))
    assert len(planned) == 2 * 3 * len(BUDGETS)
    stable = [p for p in planned if p.parent is None]
    assert {p.budget for p in stable} == {24} and len(stable) == 6
    assert stable[0].config.train.keep_checkpoints == (6, 9, 12)  # each smaller budget's decay start
    by_id = {p.run_id: p for p in planned}
    for p in planned:
        if p.parent is not None:
            parent = by_id[p.parent]
            assert parent.budget == 24 and (parent.role, parent.flip, parent.config.seed) == (p.role, p.flip,
                                                                                              p.config.seed)
            assert p.config.train.steps == p.budget and p.slug.startswith(f"b{p.budget}_")


@pytest.mark.slow
def test_a_budget_ladder_trains_branches_and_reports_data_multipliers(tmp_path):
    path = spec(tmp_path, worth_margin=1.1)  # asked for: a ladder no law fits would be refused
    result = invoke("ablate", path, "--runs-dir", tmp_path / "runs", "--workers", "1", "--stack", "off")
    assert result.exit_code == 0, result.output
    root = tmp_path / "runs" / "toy"
    assert records.read_study(root).budgets == BUDGETS and records.read_study(root).worth_margin == 1.1
    summaries = [runs.read_summary(d) for d in runs.find_runs(root)]
    assert len(summaries) == 24 and all(s["status"] == "completed" for s in summaries)
    branched = [s for s in summaries if s.get("branched_from")]
    assert len(branched) == 18 and {s["branched_from"]["step"] for s in branched} == {6, 9, 12}
    doc = json.loads((root / "report" / "report.json").read_text())["worth"]
    assert doc["axis"] == worth.DATA and doc["rungs"] == [f"{b} steps" for b in BUDGETS] and doc["margin"] == 1.1
    assert {m["rung"] for m in doc["multipliers"]} == set(doc["rungs"])
    assert all(m["axis"] == worth.DATA for m in doc["multipliers"])
    assert (root / "report" / "worth.png").is_file() and (root / "report" / "law.png").is_file()
    again = invoke("ablate", path, "--runs-dir", tmp_path / "runs", "--workers", "1", "--stack", "off", "--no-report")
    assert again.exit_code == 0, again.output
    assert "(to do: 0," in again.output  # every run and branch done: nothing trains again


def test_a_stable_run_and_its_decays_are_one_group_in_order_never_stacked():
    from anatomy_cli.sweep.jobs import Job, group_jobs

    cfg = {"seed": 1, "train": {"steps": 4}}
    jobs = [Job("a", cfg, "/r/a"), Job("a1", cfg, "/r/a1", branch_of="/r/a"), Job("b", cfg, "/r/b"),
            Job("a2", cfg, "/r/a2", branch_of="/r/a"), Job("c1", cfg, "/r/c1", branch_of="/r/c")]
    groups = [[j.run_id for j in g] for g in group_jobs(jobs, 3)]
    assert groups == [["a", "a1", "a2"], ["b"], ["c1"]]  # c's stable run done already: its decay alone

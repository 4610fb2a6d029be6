"""The paired timing pass on a toy plan (one spawned worker, a few steps; torch in the worker)."""

from __future__ import annotations

import re

import pytest
from toy_data import write_spec

from anatomy_cli.report import speed
from anatomy_cli.store import records
from anatomy_cli.sweep import timing
from anatomy_cli.sweep.plan import expand, load_spec


@pytest.mark.slow
@pytest.mark.process
def test_time_plan_times_every_config_in_rounds(tmp_path):
    spec = load_spec(write_spec(tmp_path, top={"flips": ["rope", "swiglu", "rmsnorm", "prenorm", "gqa"],
                                               "seeds": 2, "gqa_kv_head": 2}))
    plan = expand(spec.model_copy(update={"only": ["rope"]}))
    assert len(plan) == 8  # 4 configs x 2 seeds: timed once per config, not per seed
    rounds = []
    record = timing.time_plan(plan, steps=2, rounds=2, warmup=1, on_round=lambda r, n: rounds.append((r, n)))
    assert rounds == [(1, 2), (2, 2)]
    slugs = [c["slug"] for c in record["configs"]]
    assert sorted(slugs) == ["2017", "2017+rope", "llama", "llama-rope"]
    assert all(set(r) == set(slugs) and min(r.values()) > 0 for r in record["rounds_data"])
    rows = speed.timing_effects(record)
    assert {(r["flip"], r["direction"], r["n_pairs"]) for r in rows} == {("rope", "add-one", 2),
                                                                         ("rope", "remove-one", 2)}
    path = records.write_timing(tmp_path / "sweep", record)
    assert records.read_timing(path.parent) == record


OWN = {"wd0": {"on": {"train.weight_decay": 0.0}, "off": {"train.weight_decay": 0.1}},
       "lr2": {"on": {"train.lr": 6e-3}, "off": {"train.lr": 3e-3}},
       "wd2": {"on": {"train.beta2": 0.99}, "off": {"train.beta2": 0.95}}}


def roles_of(tmp_path, top, flips=None):
    spec = load_spec(write_spec(tmp_path, top=top))
    plan = expand(spec.model_copy(update={"only": flips}))
    first = {}
    for p in plan:
        first.setdefault(p.slug, p)
    design = next((p.design for p in plan if p.design), None)
    return {(c["group"], c["role"], c["flip"]) for c in timing.roles(list(first.values()), design)}


def test_timing_roles_for_every_design(tmp_path):
    both = roles_of(tmp_path, {"flips": ["rope", "swiglu", "rmsnorm"]})
    assert both == {("", "reference", None), ("", "all-on", None)} | {
        ("", d, f) for d in ("add-one", "remove-one") for f in ("rope", "swiglu", "rmsnorm")}
    removed = roles_of(tmp_path, {"flips": ["rope", "swiglu", "rmsnorm"], "directions": ["remove-one"]})
    assert {r for _, r, _ in removed} == {"reference", "all-on", "remove-one"}
    factorial = roles_of(tmp_path, {"flips": ["wd0", "lr2", "wd2"], "design": "factorial", "components": OWN})
    assert factorial == {("", "reference", None), ("", "all-on", None)} | {
        ("", d, f) for d in ("add-one", "remove-one") for f in ("wd0", "lr2", "wd2")}  # 2^3 holds both directions
    five = roles_of(tmp_path, {"flips": ["rope", "swiglu"], "design": "factorial"})  # 2 of the 5 travel with all 5:
    assert {(r, f) for _, r, f in five} == {("reference", None), ("add-one", "rope"), ("add-one", "swiglu"),
                                            ("other", None)}  # as the report reads them, no all-on end
    two = roles_of(tmp_path, {"flips": ["rope", "swiglu"]})  # rope alone is also the all-on end minus swiglu
    assert ("", "remove-one", "swiglu") in two and ("", "add-one", "rope") in two
    axes = roles_of(tmp_path, {"flips": ["rope"], "axes": {"n_layer": [1, 2]}})
    assert {g for g, _, _ in axes} == {"n_layer=1", "n_layer=2"} and ("n_layer=2", "add-one", "rope") in axes
    listed = roles_of(tmp_path, {"design": "list", "configs": [{"name": "a"}, {"name": "b"}]})
    assert {r for _, r, _ in listed} == {"other"}


def test_timing_effects_pair_within_groups():
    record = {"steps": 2, "warmup": 1, "rounds": 2, "threads": 1, "ends": ["2017", "llama"],
              "configs": [{"slug": s, "role": r, "flip": f, "group": g} for s, r, f, g in (
                  ("a1", "reference", None, "L=1"), ("b1", "add-one", "rope", "L=1"),
                  ("a2", "reference", None, "L=2"), ("b2", "add-one", "rope", "L=2"))],
              "rounds_data": [{"a1": 100.0, "b1": 110.0, "a2": 50.0, "b2": 40.0}] * 2}
    rows = {r["group"]: r for r in speed.timing_effects(record)}
    assert rows["L=1"]["gain"] == pytest.approx(10.0) and rows["L=2"]["gain"] == pytest.approx(-20.0)


@pytest.mark.slow
@pytest.mark.process
def test_time_pass_on_a_factorial_sweep_with_no_runs(tmp_path):
    from typer.testing import CliRunner

    from anatomy_cli.cli.main import app

    spec = write_spec(tmp_path, top={"flips": ["wd0", "lr2"], "design": "factorial", "components": OWN})
    result = CliRunner().invoke(app, ["ablate", str(spec), "--time", "--time-steps", "1", "--time-rounds", "3",
                                      "--runs-dir", str(tmp_path / "runs")])
    assert result.exit_code == 0, result.output
    record = records.read_timing(tmp_path / "runs" / "toy")
    assert len(record["rounds_data"]) == 3 and len({c["slug"] for c in record["configs"]}) == 4
    out = result.stdout
    for flip in ("wd0", "lr2"):  # both directions, each with a call under the one rule
        assert sum(line.split()[1:3] == [flip, d] for line in out.splitlines() for d in ("added", "removed")
                   if len(line.split()) > 3) == 2
    assert re.search(r"The rule: each interval at [\d.]+ % \(Bonferroni: 0.05 split over the \d effects\)",
                     " ".join(out.split()))  # judged once: no looks
    assert "timing: " in out
    assert not (tmp_path / "runs" / "toy" / "report").exists()  # no runs yet: no report

"""store/records.py: a study's records, each typed once and read by one function: written and read back whole,
a corrupt one refused in one line naming file and field, older files read alike, and the margin of a folder's
first study kept by every later one."""

from __future__ import annotations

import json

import pytest

from anatomy_cli.spec.config import ConfigError
from anatomy_cli.spec.knobs import Setting
from anatomy_cli.store import records
from anatomy_cli.store.runs import RunError


def test_each_record_round_trips_and_a_missing_one_is_none(tmp_path):
    assert [f(tmp_path) for f in (records.read_study, records.read_decide, records.read_tune,
                                  records.read_timing)] == [None] * 4
    study = records.StudyRecord(components=[{"name": "rope", "origin": "built-in"}],
                                invocation=records.Invocation(spec="s.toml", settings=[
                                    records.SettingRecord(key="seeds", value=4, typed="--seeds 4")]), margin=0.05)
    records.write_study(tmp_path, study)
    assert records.read_study(tmp_path) == study
    assert "sizes" not in json.loads((tmp_path / "sweep.json").read_text())  # as the file has always been written
    decide = records.DecideRecord(looks=[3, 4], alpha=0.025, by="spec")
    records.write_decide(tmp_path, decide)
    assert records.read_decide(tmp_path) == decide
    tune = records.TuneRecord(grid=records.TuneGrid(center=1e-3, points=3, factor=2.0, extend=1), seeds=[1336],
                              rule="argmin", initial_loss=6.0, arms=[records.TuneArm(
                                  arm="2017", config="abc", lrs=[5e-4, 1e-3], losses=[2.1, 2.0], lr=1e-3, tuned=True,
                                  reason="best", best_loss=2.0, sensitivity=0.05)])
    records.write_tune(tmp_path, tune)
    assert records.read_tune(tmp_path) == tune and tune.arms[0].config_hash == "abc"
    assert json.loads((tmp_path / "tune.json").read_text())["arms"][0]["config"] == "abc"  # the file's own key


@pytest.mark.parametrize("name, body, fragment", [
    ("sweep.json", {"components": "x"}, "no components list"),
    ("sweep.json", {"components": [], "margin": 0}, "margin: must be a finite number of bits per byte above 0"),
    ("sweep.json", {"components": [], "margin": 11},
     "margin: must be a finite number of bits per byte above 0 and at most 10"),
    ("sweep.json", {"components": [], "sizes": [{"name": 1}]}, "sizes is not a list of {name, settings}"),
    ("decide.json", {"looks": [3, 3], "alpha": 0.025}, "looks [3, 3] are not increasing"),
    ("decide.json", {"looks": [3, 4], "alpha": 0.05}, "is not 0.05 split over the 2 looks"),
    ("tune.json", {"grid": {"center": 1e-3, "points": 1, "factor": 2, "extend": 0}, "seeds": [1], "rule": "r",
                   "initial_loss": 1.0}, "grid.points: Input should be greater than or equal to 3"),
    ("timing.json", {"steps": 1, "warmup": 0, "threads": 1, "configs": [], "rounds_data": [{"a": -1.0}]},
     "rounds_data[0]['a']: Input should be greater than or equal to 0"),
])
def test_a_corrupt_record_is_one_line_naming_file_and_field(tmp_path, name, body, fragment):
    (tmp_path / name).write_text(json.dumps(body))
    reader = {"sweep.json": records.read_study, "decide.json": records.read_decide, "tune.json": records.read_tune,
              "timing.json": records.read_timing}[name]
    with pytest.raises(RunError) as err:
        reader(tmp_path)
    assert f"corrupt {name} in {tmp_path}" in str(err.value) and fragment in str(err.value), str(err.value)


def test_an_older_invocation_reads_as_settings_and_its_min_effect_as_the_margin(tmp_path):
    old = {"components": [], "invocation": {"spec": "x.toml", "flip": "rope,swiglu", "steps": 300,
                                            "min_effect": 0.05}}
    (tmp_path / "sweep.json").write_text(json.dumps(old))
    study = records.read_study(tmp_path)
    assert [(s.key, s.value) for s in study.invocation.as_settings()] == [("only", ["rope", "swiglu"]),
                                                                          ("base.train.steps", 300)]
    assert study.study_margin == 0.05
    for bad in (float("inf"), "0.5", True, -1, 20):  # an old margin out of range or of another type: refused by name
        (tmp_path / "sweep.json").write_text(json.dumps(old | {"invocation": {"min_effect": bad}}))
        with pytest.raises(RunError, match=f"^corrupt sweep.json in {tmp_path}: invocation.min_effect: "):
            records.read_study(tmp_path)


def test_the_first_study_s_margin_stays_and_a_redefined_component_is_refused(tmp_path):
    row = {"name": "wd0", "origin": "spec x", "on": {"train.weight_decay": 0.0}}
    first = records.merged_study(tmp_path, [row], [], records.Invocation(spec="a.toml"), 0.05)
    records.write_study(tmp_path, first)
    later = records.merged_study(tmp_path, [], [{"name": "S", "settings": {}}], records.Invocation(spec="b.toml"), 0.2)
    assert later.margin == 0.05 and later.invocation.spec == "b.toml" and [r["name"] for r in later.components] == [
        "wd0"] and later.sizes == [{"name": "S", "settings": {}}]
    with pytest.raises(ConfigError, match="component wd0 was defined differently"):
        records.merged_study(tmp_path, [row | {"on": {"train.weight_decay": 0.01}}], [], None, None)


def test_settings_record_how_they_were_typed():
    setting = Setting("decide.max_seeds", 6, "--max-seeds 6")
    assert setting.option == "--max-seeds" and setting.table == "decide"
    assert Setting("seeds", 3, "--set seeds=3").option == "--set seeds" and Setting("seeds", 3, "").table is None

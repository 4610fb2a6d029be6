"""The regression gate: --update writes a baseline from the measured seed spread; the gate passes on
unchanged code and fails, naming the config, against a baseline with lower numbers."""

from __future__ import annotations

import json

import pytest
from toy_data import write_spec
from typer.testing import CliRunner

from anatomy_cli import check as gate
from anatomy_cli.cli import app

runner = CliRunner()


def test_compare_verdicts_and_default_tolerance():
    baseline = {"gate_seed": 1, "configs": {"a": {"best_val_loss": 2.0, "tolerance": 0.01},
                                             "b": {"best_val_loss": 2.0, "tolerance": 0.01},
                                             "c": {"best_val_loss": 2.0, "tolerance": 0.01}}}
    rows = gate.compare(baseline, {"a": {1: 2.005}, "b": {1: 2.02}, "c": {1: None}})
    assert [r["verdict"] for r in rows] == ["ok", "REGRESSED", "MISSING"]
    assert not gate.passed(rows)
    assert gate.compare(baseline, {"a": {1: 1.5}, "b": {1: 1.9}, "c": {1: 2.0}})[0]["verdict"] == "ok"  # better is fine
    assert [r["verdict"] for r in gate.compare(baseline, {"b": {1: 2.02}}, tolerance=0.05)][1] == "ok"


def test_baseline_tolerance_comes_from_seed_spread():
    data = gate.build_baseline({"x": {1: 2.0, 2: 2.1, 3: 1.9}, "y": {1: 3.0, 2: 3.2, 3: 2.8}}, 1, "spec", "2.13", "cpu")
    entry = data["configs"]["x"]
    assert entry["best_val_loss"] == 2.0
    assert entry["seed_std"] == pytest.approx(0.1)
    pooled = ((0.1**2 + 0.2**2) / 2) ** 0.5  # variances pooled over configs
    assert data["pooled_seed_std"] == pytest.approx(pooled)
    assert entry["tolerance"] == data["configs"]["y"]["tolerance"] == pytest.approx(gate.TOLERANCE_SIGMAS * pooled)
    assert "std" in data["derivation"] and data["torch_version"] == "2.13" and data["machine"] == "cpu"
    with pytest.raises(gate.BaselineError, match="gate seed"):
        gate.build_baseline({"x": {2: 2.0, 3: 2.1}}, 1, "spec", "2.13", "cpu")


@pytest.mark.slow
def test_gate_passes_then_fails_against_lower_numbers(tmp_path):
    spec = write_spec(tmp_path, name="gate", top={"flips": ["rope"]})
    baseline = tmp_path / "baseline.json"
    runs_dir = tmp_path / "runs"
    made = runner.invoke(app, ["check", str(spec), "--baseline", str(baseline), "--runs-dir", str(runs_dir),
                               "--update", "--update-seeds", "2", "--workers", "1"])
    assert made.exit_code == 0, made.output
    assert "baseline rewritten" in made.output
    data = json.loads(baseline.read_text())
    assert set(data["configs"]) == {"2017", "2017+rope", "llama", "llama-rope"}
    ok = runner.invoke(app, ["check", str(spec), "--baseline", str(baseline), "--runs-dir", str(tmp_path / "again"),
                             "--workers", "1", "--json"])
    assert ok.exit_code == 0, ok.output
    assert json.loads(ok.stdout)["passed"] is True
    data["configs"]["2017+rope"]["best_val_loss"] -= 0.5  # pretend main used to learn much better
    baseline.write_text(json.dumps(data))
    bad = runner.invoke(app, ["check", str(spec), "--baseline", str(baseline), "--from-runs",
                              str(tmp_path / "again" / "gate")])
    assert bad.exit_code == 1
    assert "REGRESSED" in bad.output and "2017+rope (regressed)" in bad.output

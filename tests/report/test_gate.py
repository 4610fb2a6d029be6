"""The regression gate: --update writes a baseline from the measured seed spread; the gate passes on
unchanged code and fails, naming the config, against a baseline with lower numbers."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from toy_data import write_spec
from typer.testing import CliRunner

from anatomy_cli.cli.main import app
from anatomy_cli.report import gate

runner = CliRunner()


def test_compare_verdicts_and_default_tolerance():
    baseline = {"gate_seed": 1, "configs": {"a": {"best_val_bpb": 2.0, "tolerance": 0.01},
                                             "b": {"best_val_bpb": 2.0, "tolerance": 0.01},
                                             "c": {"best_val_bpb": 2.0, "tolerance": 0.01}}}
    rows = gate.compare(baseline, {"a": {1: 2.005}, "b": {1: 2.02}, "c": {1: None}})
    assert [r["verdict"] for r in rows] == ["ok", "REGRESSED", "MISSING"]
    assert not gate.passed(rows)
    assert [r["verdict"] for r in gate.compare(baseline, {"b": {1: 2.02}}, tolerance=0.05)][1] == "ok"


def test_gate_is_two_sided_a_fall_past_tolerance_fails():
    # A leak (attention seeing the next character) made RoPE configs' val loss fall by ~2 nats: not "ok".
    baseline = {"gate_seed": 1, "configs": {c: {"best_val_bpb": 3.3, "tolerance": 0.07} for c in ("2017", "rope")}}
    rows = gate.compare(baseline, {"2017": {1: 3.28}, "rope": {1: 1.3}})
    assert [r["verdict"] for r in rows] == ["ok", "IMPROVED"] and not gate.passed(rows)
    (line,) = gate.failure_lines(rows)
    assert line.startswith("improved: rope:") and "anatomy check --update" in line and "leak" in line
    assert gate.compare(baseline, {"2017": {1: 3.3 - 0.069}, "rope": {1: 3.3 + 0.069}})[0]["verdict"] == "ok"


def test_environment_warnings_name_torch_and_machine():
    base = {"torch_version": "2.13.0+cpu", "machine": "AMD EPYC (2 threads)", "configs": {}}
    assert gate.environment_warnings(base, "2.13.0+cpu", "AMD EPYC (2 threads)", "AVX512") == []
    warnings = gate.environment_warnings(base, "2.14.0", "Apple M3 (8 threads)", "DEFAULT")
    assert len(warnings) == 2 and "torch '2.13.0+cpu'" in warnings[0] and "'Apple M3 (8 threads)'" in warnings[1]
    assert "no CPU capability recorded" in warnings[1] and "(CPU capability DEFAULT)" in warnings[1]
    assert gate.environment_warnings({"configs": {}}, "2.14.0", "x", "AVX2") == []  # an old baseline without the fields


def test_machine_warning_names_the_cpu_capability_behind_one_model_name():
    base = {"torch_version": "2.13.0+cpu", "machine": "AMD EPYC (2 threads)", "cpu_capability": "AVX512", "configs": {}}
    assert gate.environment_warnings(base, "2.13.0+cpu", "AMD EPYC (2 threads)", "AVX512") == []
    (line,) = gate.environment_warnings(base, "2.13.0+cpu", "AMD EPYC (2 threads)", "AVX2")
    assert "with CPU capability AVX512, this one runs AVX2" in line and "'AMD EPYC (2 threads)'" in line
    (line,) = gate.environment_warnings(base, "2.13.0+cpu", "Intel Xeon (2 threads)", "AVX2")
    assert ("'AMD EPYC (2 threads)' (CPU capability AVX512), this is 'Intel Xeon (2 threads)' "
            "(CPU capability AVX2)") in line


def test_a_baseline_without_a_capability_is_named_once_numbers_differ():
    """experiments/ci-baseline.json predates the field: identical numbers need no line, moved ones say
    this machine's capability and that the baseline cannot tell its own."""
    base = gate.load_baseline(Path(__file__).parents[2] / "experiments" / "ci-baseline.json")
    assert "cpu_capability" not in base
    machine = base["machine"]
    same = [{"config": "2017", "identical": True, "verdict": "ok"}]
    moved = [{"config": "2017", "identical": False, "verdict": "ok"}]
    assert gate.environment_warnings(base, base["torch_version"], machine, "AVX512", same) == []
    (line,) = gate.environment_warnings(base, base["torch_version"], machine, "AVX2", moved)
    assert f"not identical on {machine!r} (CPU capability AVX2)" in line
    assert "does not record its CPU capability" in line


def test_update_records_the_cpu_capability():
    results = {"a": {1: 3.0, 2: 3.1}}
    base = gate.build_baseline(results, 1, "ci", "2.13.0+cpu", "AMD EPYC (2 threads)", "AVX512")
    assert base["cpu_capability"] == "AVX512" and base["machine"] == "AMD EPYC (2 threads)"


@pytest.mark.parametrize("text, fragment", [
    ('{"configs": {"a": {"best_val_loss": 3.0, "tolerance": "x"}}}', "tolerance 'x'"),
    ('{"configs": {"a": {"best_val_loss": 3.0, "tolerance": -1}}}', "tolerance -1"),
    ('{"configs": {"a": {"best_val_loss": NaN}}}', "finite numeric best_val_loss"),
    ('{"configs": {"a": {"best_val_loss": true}}}', "finite numeric best_val_loss"),
    ('{"gate_seed": "1337", "configs": {"a": {"best_val_loss": 3.0}}}', "gate_seed must be an integer"),
    ('{"torch_version": 2.1, "configs": {"a": {"best_val_loss": 3.0}}}', "torch_version must be a string"),
    ('{"cpu_capability": 512, "configs": {"a": {"best_val_loss": 3.0}}}', "cpu_capability must be a string"),
    ('{"configs": {"a": {"best_val_bpb": NaN}}}', "finite numeric best_val_bpb"),
    ('{"configs": {"a": {"tolerance": 0.1}}}', "config 'a' needs one finite numeric best_val_bpb"),
    ('{"configs": {"a": {"best_val_bpb": 3.0, "best_val_loss": 2.0}}}', "config 'a' needs one"),
    ('{"configs": {}}', "empty 'configs' table"),
])
def test_malformed_baseline_fields_are_named(tmp_path, text, fragment):
    path = tmp_path / "baseline.json"
    path.write_text(text)
    with pytest.raises(gate.BaselineError, match="baseline .*") as err:
        gate.load_baseline(path)
    assert fragment in str(err.value)


def test_collect_refuses_a_missing_or_empty_directory(tmp_path):
    from anatomy_cli.store.runs import RunError

    with pytest.raises(RunError, match="runs directory not found"):
        gate.collect(tmp_path / "nowhere")
    with pytest.raises(RunError, match="no runs under"):
        gate.collect(tmp_path)


def test_baseline_tolerance_comes_from_seed_spread():
    data = gate.build_baseline({"x": {1: 2.0, 2: 2.1, 3: 1.9}, "y": {1: 3.0, 2: 3.2, 3: 2.8}}, 1, "spec", "2.13", "cpu")
    entry = data["configs"]["x"]
    assert entry["best_val_bpb"] == 2.0 and data["metric"] == "best_val_bpb"
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
    from anatomy_cli.training.devices import cpu_capability

    assert data["cpu_capability"] == cpu_capability() and data["cpu_capability"]
    machine = data["machine"]
    ok = runner.invoke(app, ["check", str(spec), "--baseline", str(baseline), "--runs-dir", str(tmp_path / "again"),
                             "--workers", "1", "--json"])
    assert ok.exit_code == 0, ok.output
    assert json.loads(ok.stdout)["passed"] is True
    data["configs"]["2017+rope"]["best_val_bpb"] -= 0.5  # pretend main used to learn much better
    baseline.write_text(json.dumps(data))
    bad = runner.invoke(app, ["check", str(spec), "--baseline", str(baseline), "--from-runs",
                              str(tmp_path / "again" / "gate")])
    assert bad.exit_code == 1
    assert "REGRESSED" in bad.output and "2017+rope (regressed)" in bad.output
    data["configs"]["2017+rope"]["best_val_bpb"] += 2.5  # now main used to be 2 bits per byte worse: a leak?
    data["torch_version"], data["machine"] = "1.0.0", "a PDP-11"
    baseline.write_text(json.dumps(data))
    leak = runner.invoke(app, ["check", str(spec), "--baseline", str(baseline), "--from-runs",
                               str(tmp_path / "again" / "gate")])
    assert leak.exit_code == 1
    assert "2017+rope (improved)" in leak.output and "anatomy check --update" in leak.output
    assert "warning: baseline recorded with torch '1.0.0'" in leak.output and "'a PDP-11'" in leak.output
    data["machine"], data["cpu_capability"] = machine, "NEON"  # this CPU's name, another instruction set
    baseline.write_text(json.dumps(data))
    other = runner.invoke(app, ["check", str(spec), "--baseline", str(baseline), "--from-runs",
                                str(tmp_path / "again" / "gate")])
    assert f"with CPU capability NEON, this one runs {cpu_capability()}" in " ".join(other.output.split())
    missing = runner.invoke(app, ["check", str(spec), "--baseline", str(baseline), "--from-runs", str(tmp_path / "no")])
    assert missing.exit_code == 2 and "runs directory not found" in missing.output
    # a baseline from before bits per byte: the same runs compared in nats per character, with a line saying so
    again = tmp_path / "again" / "gate"
    nats = {"gate_seed": data["gate_seed"], "configs": {slug: {"best_val_loss": v, "tolerance": 0.01}
                                                        for slug, v in gate.collect(again, metric=gate.NATS).items()
                                                        for v in [v[data["gate_seed"]]]}}
    baseline.write_text(json.dumps(nats))
    old = runner.invoke(app, ["check", str(spec), "--baseline", str(baseline), "--from-runs", str(again)])
    assert old.exit_code == 0, old.output
    assert "records best_val_loss (nats per character" in " ".join(old.output.split()) and "--update" in old.output


def test_a_baseline_in_nats_converts_exactly_to_bits_per_byte():
    """in_bits_per_byte turns each seed's nats per character by the val windows' tokens and bytes with the
    runs' own formula, so a gate seed that reproduces its nats reproduces its bits per byte to the bit; the
    spread is measured again from the converted seeds."""
    from anatomy_cli.data.batches import bits_per_byte

    old = gate.build_baseline({"x": {1: 2.0, 2: 2.1, 3: 1.9}, "y": {1: 3.0, 2: 3.2, 3: 2.8}}, 1, "spec", "2.13", "cpu")
    for entry in old["configs"].values():  # as a baseline from before bits per byte wrote them
        entry["best_val_loss"] = entry.pop("best_val_bpb")
    old.pop("metric")
    assert gate.metric_of(old) == gate.NATS and gate.unit_lines(old, "b.json")
    new = gate.in_bits_per_byte(old, (4096, 5571))
    k = 4096 / (math.log(2) * 5571)
    assert gate.metric_of(new) == gate.BPB and not gate.unit_lines(new, "b.json")
    assert new["configs"]["x"]["best_val_bpb"] == bits_per_byte(2.0, 4096, 5571)
    assert new["configs"]["y"]["seed_values"]["2"] == bits_per_byte(3.2, 4096, 5571)
    assert new["pooled_seed_std"] == pytest.approx(k * old["pooled_seed_std"])
    assert new["configs"]["x"]["tolerance"] == pytest.approx(k * old["configs"]["x"]["tolerance"])
    assert new["per_byte"] == {"val_tokens": 4096, "val_bytes": 5571} and "converted from" in new["derivation"]
    assert ("cpu_capability" in new) == ("cpu_capability" in old) and new["measured_on"] == old["measured_on"]
    rows = gate.compare(new, {"x": {1: bits_per_byte(2.0, 4096, 5571)}, "y": {1: 2.0}})
    assert rows[0]["identical"] and rows[0]["verdict"] == "ok" and rows[1]["verdict"] == "IMPROVED"


def test_the_committed_baseline_is_in_bits_per_byte_of_the_ci_specs_windows():
    """experiments/ci-baseline.json was converted from nats per character: its windows are the CI spec's
    (results_bpb.factor_of counts them as training does), so its numbers are what the CI runs record."""
    from anatomy_cli.report.results_bpb import factor_of

    root = Path(__file__).parents[2] / "experiments"
    base = gate.load_baseline(root / "ci-baseline.json")
    assert gate.metric_of(base) == gate.BPB
    assert tuple(base["per_byte"].values()) == factor_of(root / "ci-regression.toml")

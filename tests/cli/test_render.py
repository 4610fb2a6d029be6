"""The answer in the terminal: `anatomy ablate` ends with the verdict and the report's path, fits
narrow terminals, and is plain text in a pipe (a line per finished run, no progress bars)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from helpers import PATIENCE
from report_runs import called_sweep
from toy_data import write_spec
from typer.testing import CliRunner

from anatomy_cli.cli.main import app

ANSI = re.compile(r"\x1b\[")


@pytest.fixture(scope="module")
def ablated(tmp_path_factory):
    """A one-seed toy ablation of rope, run through the CLI at 60 columns."""
    tmp = tmp_path_factory.mktemp("term")
    spec = write_spec(tmp)
    args = ["ablate", str(spec), "--flip", "rope", "--seeds", "1", "--workers", "1", "--runs-dir", str(tmp / "runs")]
    result = CliRunner().invoke(app, args, env={"COLUMNS": "60"})
    return tmp, spec, args, result


def table_lines(text: str) -> list[str]:
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if re.match(r"component\s{2}", line))  # the first table
    return lines[start:start + next(j for j, line in enumerate(lines[start:]) if not line.strip())]


@pytest.mark.slow
@pytest.mark.process
def test_ablate_ends_with_the_verdict_and_the_report_path(ablated):
    tmp, _, _, result = ablated
    assert result.exit_code == 0, result.output
    out = result.stdout
    last = out.rstrip().splitlines()[-1]
    assert last == (f"report: {tmp / 'runs' / 'toy' / 'report' / 'report.html'} "
                    f"(all files in {tmp / 'runs' / 'toy' / 'report'})")
    assert "forest.png" not in out and "effects.csv" not in out  # not the list of files
    rows = table_lines(out)  # both directions side by side, or one table each where 60 columns are too few
    assert "added to the 2017 end" in out and "removed from the LLaMA end" in out
    assert sum(line.count("too few seeds") for line in out.splitlines() if line.startswith("rope ")) == 2
    assert all(len(line) <= 60 for line in rows)
    assert "To add seeds to 3" in " ".join(out.split()) and "--seeds 3" in out  # wherever the 60 columns wrap it
    assert " ".join(out.split()).count("--seeds") == 1  # the study's --seeds 1 gives way to --seeds 3, not beside it
    err = result.stderr  # CliRunner is no terminal: one line per finished run, no bars
    assert [line.split("]")[0] for line in err.splitlines() if line.startswith("[")] == ["[1/4", "[2/4", "[3/4", "[4/4"]
    assert "━" not in err and "4 completed, 0 diverged, 0 failed of 4 runs" in err
    assert re.search(r"of 4 runs in \S+; took \d+s$", err, re.MULTILINE)  # the sweep's wall time, said


@pytest.mark.slow
@pytest.mark.process
def test_ablate_in_a_pipe_is_plain_text(ablated):
    tmp, _, args, _ = ablated
    env = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "80"}
    proc = subprocess.run([sys.executable, "-m", "anatomy_cli", *args], capture_output=True, text=True, env=env,
                          timeout=PATIENCE)
    assert proc.returncode == 0, proc.stderr
    assert not ANSI.search(proc.stdout) and not ANSI.search(proc.stderr)
    assert "4 of 4 runs already done" in proc.stderr and "━" not in proc.stderr
    assert proc.stdout.startswith("verdict: gain in best val loss") and "report: " in proc.stdout
    head = table_lines(proc.stdout)[0]  # 80 columns: both directions side by side
    assert "added to the 2017 end" in head and "removed from the LLaMA end" in head


@pytest.mark.slow  # writes whole reports with figures: seconds each
@pytest.mark.parametrize("columns", [80, 60])
def test_report_verdict_fits_the_terminal(tmp_path, columns):
    called_sweep(tmp_path)
    result = CliRunner().invoke(app, ["report", str(tmp_path)], env={"COLUMNS": str(columns)})
    assert result.exit_code == 0, result.output
    text = result.stdout[result.stdout.index("verdict: gain"):]
    rows = table_lines(text)
    assert all(len(line) <= columns for line in rows)
    rope = next(r for r in rows if " rope " in f" {r} ")
    assert " helps" in rope and "[+0." in rope
    assert "each interval at 99 % (Bonferroni: 0.05 split over the 5 effects)" in " ".join(text.split())


def test_components_fit_80_and_60_columns_and_wide_is_whole():
    for columns in (80, 60):
        result = CliRunner().invoke(app, ["components"], env={"COLUMNS": str(columns)})
        assert result.exit_code == 0
        lines = result.stdout.splitlines()
        assert all(len(line) <= columns for line in lines), max(lines, key=len)
        from anatomy_cli.spec.components import BUILTIN_NAMES

        first = lines.index(next(line for line in lines if line.startswith("name ")))
        rows = lines[first + 2:first + 2 + len(BUILTIN_NAMES)]
        assert [line.split()[0] for line in rows] == list(BUILTIN_NAMES)  # a line each
    wide = CliRunner().invoke(app, ["components", "--wide"], env={"COLUMNS": "60"}).stdout
    assert "RMSNorm instead of LayerNorm: scale only, no mean, no bias" in wide and "Zhang & Sennrich 2019" in wide


def test_the_dry_run_lists_a_specs_own_components_and_what_decide_may_add(tmp_path, monkeypatch):
    from helpers import fake_calibration

    fake_calibration(tmp_path, monkeypatch, {"step_s": 0.01, "eval_s": 0.1, "run_s": 1.0, "startup_s": 2.0,
                                             "when": "2024-01-01 00:00:00"})
    spec = write_spec(tmp_path, top={"flips": ["rope", "nowd"], "seeds": 3})
    own = '[decide]\nmax_seeds = 5\n[components.nowd]\non = {"train.weight_decay" = 0.0}\n'
    spec.write_text(spec.read_text() + own, encoding="utf-8")
    result = CliRunner().invoke(app, ["ablate", str(spec), "--dry-run", "--runs-dir", str(tmp_path / "runs")],
                                env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    rows = {line.split("│")[1].strip(): line for line in result.stdout.splitlines() if line.count("│") > 3}
    nowd = next(line for rid, line in rows.items() if rid.startswith("reference+nowd-s"))
    assert nowd.split("│")[2].strip() == "2017+nowd", nowd  # the components column: the spec's own is named
    top = next(line for rid, line in rows.items() if rid.startswith("all-on-s"))  # every component on
    assert top.split("│")[2].strip() == "llama+nowd", top
    said = " ".join(result.output.split())
    # 6 configs (the two ends, each flip added to one and removed from the other) at 3 seeds: 18 runs; the
    # looks at 4 and 5 seeds may add 2 seeds to each config: 12 more at most
    assert "plan: 18 runs" in said and "--decide may add up to 12 runs (up to 5 seeds a config" in said, said

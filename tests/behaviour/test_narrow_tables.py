"""80-column tables keep their identifying columns whole (issue #30): `ablate --dry-run`'s plan
table and `report`'s runs table drop descriptive columns before they cut a run id or a role."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from rich.console import Console
from rich.table import Table
from typer.testing import CliRunner

from anatomy_cli.cli import app as app_module
from anatomy_cli.cli.main import app
from anatomy_cli.cli.render import frame_table

runner = CliRunner()
ELLIPSIS = "…"


def _cells(text: str) -> list[list[str]]:
    """The body rows of a rich table, as the cells between its vertical borders."""
    return [[c.strip() for c in line.strip().strip("│").split("│")] for line in text.splitlines()
            if line.strip().startswith("│")]


def _plan(tmp_path, monkeypatch, width: int, *extra: str):
    monkeypatch.chdir(tmp_path)  # the demo spec shipped with anatomy
    monkeypatch.setattr(app_module.console, "_width", width)
    return runner.invoke(app, ["ablate", "--dry-run", "--runs-dir", str(tmp_path / "runs"), *extra])


@pytest.mark.process  # ablate --dry-run calibrates its estimate in a spawned worker
def test_plan_table_keeps_run_ids_and_roles_whole_at_80(tmp_path, monkeypatch):
    plan = json.loads(_plan(tmp_path, monkeypatch, 200, "--json").output)["runs"]
    result = _plan(tmp_path, monkeypatch, 80)
    assert result.exit_code == 0, result.output
    assert max(map(len, result.output.splitlines())) <= 80
    rows = _cells(result.output)
    head = next([c.strip() for c in line.strip().strip("┃").split("┃")] for line in result.output.splitlines()
                if line.startswith("┃"))
    assert len(rows) == len(plan)
    for run, row in zip(plan, rows):
        role = f"{run['role']}:{run['flip']}" if run.get("flip") else run["role"]
        assert row[head.index("run id")] == run["run_id"] and row[head.index("role")] == role, row
        assert not any(c.endswith(ELLIPSIS) for c in row), row


@pytest.mark.process  # ablate --dry-run calibrates its estimate in a spawned worker
def test_plan_table_at_a_wide_terminal_keeps_every_column(tmp_path, monkeypatch):
    result = _plan(tmp_path, monkeypatch, 250)
    assert result.exit_code == 0, result.output
    head = next(line for line in result.output.splitlines() if "run id" in line)
    for col in ("run id", "components", "role", "seed", "params", "est.", "status"):
        assert col in head
    assert ELLIPSIS not in result.output


def _frame() -> pd.DataFrame:
    # as the demo names them: the longest run id and label of its 36 runs
    ids = ["2017-s1337-fcf9c3c5", "2017+rmsnorm-s1338-0a1b2c3d", "llama-s1339-4e5f6a7b",
           "llama-swiglu-s1339-f07b8529", "llama-gqa-s1337-c953bdf3"]
    labels = ["2017", "rmsnorm", "llama", "rmsnorm+prenorm+rope+gqa", "rmsnorm+prenorm+rope+swiglu"]
    rows = [{"run_id": ids[i], "label": lab,
             "seed": 1337 + i, "status": "completed", "best_val_loss": 1.5 + i / 10, "best_val_bpb": 1.5 + i / 10,
             "best_step": 400,
             "overfit_gap": 0.0123, "tokens_per_s": 123456.0} for i, lab in enumerate(labels)]
    return pd.DataFrame(rows)


COLS = ["run_id", "label", "seed", "status", "best_val_loss", "best_step", "overfit_gap", "tokens_per_s"]


@pytest.mark.parametrize("width", [80, 60])
def test_frame_table_keeps_run_ids_and_labels_whole(width):
    """At 80 every run id and label fits on its line; at 60, where the two alone are wider than the
    terminal, they wrap (fold) and still lose nothing."""
    frame = _frame()
    console = Console(width=width, record=True)
    console.print(frame_table(frame, COLS, "runs"))
    text = console.export_text()
    assert max(map(len, text.splitlines())) <= width
    assert ELLIPSIS not in text
    rows = _cells(text)
    if width >= 80:
        assert [r[0] for r in rows] == list(frame["run_id"])
        assert [r[1] for r in rows] == list(frame["label"])
    else:
        assert "".join(r[0] for r in rows) == "".join(frame["run_id"])


def test_frame_table_at_a_wide_terminal_is_the_plain_rich_table():
    frame = _frame()
    wide = Console(width=250, record=True)
    wide.print(frame_table(frame, COLS, "runs"))
    plain = Table(title="runs")
    for c in COLS:
        plain.add_column(c)
    for row in frame[COLS].itertuples(index=False):
        plain.add_row(*(f"{v:.4f}" if isinstance(v, float) and abs(v) < 100 else f"{v:,.0f}"
                        if isinstance(v, float) else str(v) for v in row))
    ref = Console(width=250, record=True)
    ref.print(plain)
    assert wide.export_text() == ref.export_text()


def test_components_table_does_not_cut_at_20_when_the_width_allows(monkeypatch):
    monkeypatch.setattr(app_module.console, "_width", 200)
    monkeypatch.setenv("COLUMNS", "120")
    result = runner.invoke(app, ["components"])
    assert result.exit_code == 0, result.output
    assert max(map(len, result.output.splitlines())) <= 120
    assert "norm_type: layernorm -> rmsnorm" in result.output
    body = result.output.splitlines()[3:12]  # head, header, rule, then the built-in components
    abouts = [line.rsplit("  ", 1)[-1] for line in body]
    assert all(not a.endswith(ELLIPSIS) or len(a) > 20 for a in abouts), abouts

"""`anatomy report` (issue 38): --min-effect at another margin than the study's writes beside the
study's report, never over it, and says where; the verdict is the answer, the runs table only on --runs."""

from __future__ import annotations

import json

import pytest
from helpers import flat, invoke
from report_runs import called_sweep

from anatomy_cli.study import reporting

pytestmark = pytest.mark.slow  # writes whole reports with figures: seconds each


@pytest.fixture
def study(tmp_path):
    root = tmp_path / "runs" / "s"
    called_sweep(root)
    (root / "sweep.json").write_text(json.dumps({"components": [], "margin": 0.03}))
    first = invoke("report", root, "--format", "csv")
    assert first.exit_code == 0, first.output
    return root


def test_another_margin_writes_beside_the_study_report_and_says_where(study):
    own = (study / "report" / "effects.csv").read_bytes()
    result = invoke("report", study, "--format", "csv", "--margin", "0.5")
    assert result.exit_code == 0, result.output
    beside = study / "report-margin-0.5"
    assert (study / "report" / "effects.csv").read_bytes() == own  # the study's report untouched
    assert (beside / "effects.csv").is_file()
    assert (f"note: --margin 0.5 is not the margin the study's report is judged at: this report is a view written "
            f"beside it, into {beside} ({study / 'report'} is left as it was)") in flat(result.stderr)
    assert f"report: {beside / 'effects.csv'} (all files in {beside})" in result.stdout
    as_json = invoke("report", study, "--min-effect", "0.25", "--json")  # the older name of --margin
    assert as_json.exit_code == 0, as_json.output
    assert (study / "report-margin-0.25" / "report.json").is_file()
    assert (study / "report" / "effects.csv").read_bytes() == own


def test_the_study_own_margin_rewrites_its_own_report(study):
    result = invoke("report", study, "--format", "csv", "--margin", "0.03")
    assert result.exit_code == 0, result.output
    assert "note:" not in result.stderr and not list(study.glob("report-margin-*"))
    assert reporting.margin_folder(study, 0.03, 0.03) is None and reporting.margin_folder(study, None, 0.03) is None
    assert reporting.margin_folder(study, 0.05, 0.03) == study / "report-margin-0.05"
    assert reporting.margin_folder(study, 0.02, None) is None  # a study with none recorded: the default


def test_the_runs_table_only_on_runs(study):
    plain = invoke("report", study, "--format", "csv")
    assert plain.exit_code == 0, plain.output
    assert "run_id" not in plain.stdout and plain.stdout.lstrip().startswith("verdict:"), plain.stdout
    asked = invoke("report", study, "--format", "csv", "--runs")
    assert asked.exit_code == 0, asked.output
    assert "run_id" in asked.stdout and asked.stdout.index("run_id") < asked.stdout.index("verdict:")

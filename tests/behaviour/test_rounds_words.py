"""--decide's settings said as they were given (issue 48 item 10): a spec's [decide] keys are named as keys, not
as options nobody typed; a bad budget is a human line; the dry run's JSON carries the looks and their alpha; and
rounds capped below the seeds a folder already holds are refused before anything is written, since the looks
would judge fewer seeds than the report pools."""

from __future__ import annotations

import json

import pytest
from helpers import invoke, one_error_line
from toy_data import write_spec

TOY = {"seeds": 3, "only": ["rope"], "directions": ["add-one"]}
FAST = {"steps": 6, "eval_interval": 3}


def _with_decide(tmp_path, lines: str):
    spec = write_spec(tmp_path, top=TOY, train=FAST)
    spec.write_text(spec.read_text() + "[decide]\n" + lines + "\n")
    return spec


def test_a_spec_cap_below_its_seeds_names_the_key(tmp_path):
    spec = _with_decide(tmp_path, "max_seeds = 2")
    line = one_error_line(invoke("ablate", spec, "--runs-dir", tmp_path / "runs", "--dry-run"),
                          "decide.max_seeds: a cap of 2 seeds is below the 3 the study starts with")
    assert "--max-seeds" not in line
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("budget", ["-5m", "soon", "0"])
def test_a_spec_budget_that_is_no_time_is_a_human_line(tmp_path, budget):
    spec = _with_decide(tmp_path, f'budget = "{budget}"')
    line = one_error_line(invoke("ablate", spec, "--runs-dir", tmp_path / "runs", "--dry-run"),
                          f"decide.budget: '{budget}' is not a time: give one such as 30m, 2h, 90s or 600 (seconds)")
    assert not any(c in line for c in "^$[]\\|"), line  # no regular expression


def test_the_dry_run_json_carries_the_looks_and_their_alpha(tmp_path):
    spec = write_spec(tmp_path, top=TOY, train=FAST)
    args = ["ablate", spec, "--runs-dir", tmp_path / "runs", "--dry-run", "--json"]
    result = invoke(*args, "--decide", "--max-seeds", "7", "--budget", "30m", "--margin", "0.05")
    assert result.exit_code == 0, result.output
    rounds = json.loads(result.stdout)["decide"]
    assert [look["seeds"] for look in rounds["looks"]] == [3, 5, 7]
    alphas = [look["alpha"] for look in rounds["looks"]]  # spent late: the last look 0.03, the earlier share 0.02
    assert sum(alphas) == pytest.approx(0.05) and alphas == sorted(alphas) and alphas[-1] == pytest.approx(0.03)
    assert rounds["margin"] == 0.05 and rounds["budget"] == "30m" and rounds["budget_s"] == 1800
    plain = invoke(*args)
    assert plain.exit_code == 0 and "decide" not in json.loads(plain.stdout)


@pytest.mark.slow  # trains 12 toy runs
def test_rounds_capped_below_the_seeds_the_folder_holds_are_refused(tmp_path):
    spec = write_spec(tmp_path, top=TOY, train=FAST)
    runs_dir, folder = tmp_path / "runs", tmp_path / "runs" / "toy"
    assert invoke("ablate", spec, "--runs-dir", runs_dir, "--seeds", "6", "--no-report").exit_code == 0
    before = {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}
    one_error_line(invoke("ablate", spec, "--runs-dir", runs_dir, "--decide", "--max-seeds", "4", "--no-report"),
                   f"{folder} already holds 6 seeds of this study's configs (seeds 1341, 1342 past the cap), and "
                   f"--max-seeds caps its rounds at 4: the looks would judge 4 while the report pools 6")
    assert {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()} == before  # no decide.json
    assert invoke("ablate", spec, "--runs-dir", runs_dir, "--decide", "--max-seeds", "6", "--dry-run").exit_code == 0

"""A study's margin is fixed when it starts (issue 48 item 1): a rerun at another margin is refused in one
line naming both and the view that answers it (`anatomy report DIR --margin M`), which writes beside the study's
report and never rewrites sweep.json or decide.json; a margin outside the one bound (finite, above 0, at most
MAX_MARGIN bits per byte) is the same one line everywhere it can be given, before anything is written; an older
sweep.json's margin that is no margin is refused by name, not read as the default."""

from __future__ import annotations

import json
import shutil

import pytest
from helpers import invoke, one_error_line
from toy_data import write_spec

from anatomy_cli.report import stats
from anatomy_cli.spec.config import MARGIN_RULE

pytestmark = pytest.mark.slow  # trains a decided toy study once (a dozen seconds), then reads it

BAD = ["0", "-1", "inf", "nan", "1e308"]


@pytest.fixture(scope="module")
def decided(tmp_path_factory):
    """A toy study decided in rounds (looks at 3 and 4 seeds) at the default margin: (spec, runs dir, folder)."""
    tmp = tmp_path_factory.mktemp("margin")
    spec = write_spec(tmp, top={"seeds": 3, "only": ["rope"]}, train={"steps": 6, "eval_interval": 3})
    result = invoke("ablate", spec, "--runs-dir", tmp / "runs", "--decide", "--max-seeds", "4", "--no-report")
    assert result.exit_code == 0, result.output
    folder = tmp / "runs" / "toy"
    assert (folder / "sweep.json").is_file() and (folder / "decide.json").is_file()
    return spec, tmp / "runs", folder


def _records(folder) -> dict:
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}


def test_a_rerun_at_another_margin_is_refused_naming_both_and_the_view(decided):
    spec, runs_dir, folder = decided
    before = _records(folder)
    for option in ("--min-effect", "--margin"):
        result = invoke("ablate", spec, "--runs-dir", runs_dir, "--decide", "--max-seeds", "4", option, "10")
        one_error_line(result, f"{folder} started at margin the default {stats.DEFAULT_MARGIN:g} bits/byte "
                               f"(sweep.json), and {option} asks for 10")
        one_error_line(result, f"`anatomy report {folder} {option} 10` (a view beside the study's report)")
    assert _records(folder) == before  # sweep.json, decide.json: as the study wrote them


def test_a_recorded_margin_is_named_and_a_folder_from_before_sweep_json_kept_it_reads_decide_json(decided, tmp_path):
    spec, runs_dir, folder = decided
    copy = tmp_path / "runs" / "toy"
    shutil.copytree(folder, copy)
    for name in ("sweep.json", "decide.json"):  # a study started at 0.03
        data = json.loads((copy / name).read_text())
        (copy / name).write_text(json.dumps(data | {"margin": 0.03}))
    args = ["ablate", spec, "--runs-dir", tmp_path / "runs", "--decide", "--max-seeds", "4", "--dry-run"]
    one_error_line(invoke(*args, "--margin", "10"), "started at margin 0.03 bits/byte (sweep.json), and --margin "
                                                    "asks for 10")
    one_error_line(invoke(*args), "started at margin 0.03 bits/byte (sweep.json), and margin asks for the default "
                                  "0.02")
    assert invoke(*args, "--margin", "0.03").exit_code == 0
    (copy / "sweep.json").unlink()  # only decide.json records it
    one_error_line(invoke(*args, "--set", "margin=0.5"), "started at margin 0.03 bits/byte (decide.json), and --set "
                                                         "margin asks for 0.5")


def test_a_report_at_another_margin_is_a_view_that_rewrites_no_record(decided):
    _, _, folder = decided
    before = _records(folder)
    result = invoke("report", folder, "--min-effect", "0.5", "--format", "csv")
    assert result.exit_code == 0, result.output
    assert (folder / "report-margin-0.5" / "effects.csv").is_file()
    assert _records(folder) == before
    shutil.rmtree(folder / "report-margin-0.5")


@pytest.mark.parametrize("bad", BAD)
def test_a_bad_margin_is_one_line_everywhere_and_nothing_is_written(decided, tmp_path, bad):
    spec, runs_dir, folder = decided
    before, views = _records(folder), sorted(p.name for p in folder.iterdir())
    said = f"must be {MARGIN_RULE}, got {float(bad):g}"
    for option in ("--min-effect", "--margin"):
        one_error_line(invoke("ablate", spec, "--runs-dir", tmp_path / "fresh", option, bad), f"{option}: {said}")
        one_error_line(invoke("ablate", spec, "--runs-dir", runs_dir, "--decide", "--max-seeds", "4", option, bad),
                       f"{option}: {said}")
        one_error_line(invoke("report", folder, option, bad), f"--margin: {said}")
    one_error_line(invoke("ablate", spec, "--runs-dir", tmp_path / "fresh", "--set", f"margin={bad}"),
                   f"--set margin: {said}")
    in_file = tmp_path / "in-file.toml"  # TOML spells inf and nan as floats too
    in_file.write_text(f"margin = {bad}\n" + spec.read_text())
    one_error_line(invoke("ablate", in_file, "--runs-dir", tmp_path / "fresh", "--dry-run"), f"margin: {said}")
    assert not (tmp_path / "fresh").exists()  # nothing trained, no folder made
    assert _records(folder) == before and sorted(p.name for p in folder.iterdir()) == views


def test_a_view_of_a_study_that_recorded_no_margin_is_chosen_after_the_runs(decided, tmp_path):
    _, _, folder = decided
    copy = tmp_path / "copy"
    shutil.copytree(folder, copy)
    result = invoke("report", copy, "--min-effect", "0.05", "--results", tmp_path / "x.json", "--format", "csv")
    assert result.exit_code == 0, result.output
    loss = [e for e in json.loads((tmp_path / "x.json").read_text())["effects"] if e["metric"] == "best_val_bpb"]
    assert loss and {e["threshold"] for e in loss} == {0.05}
    assert {e["threshold_basis"] for e in loss} == {f"{stats.AFTER} (the study's: 0.020, the default)"}


@pytest.mark.parametrize("old", [float("inf"), "0.5", 0, 20])
def test_an_older_sweep_json_s_margin_that_is_no_margin_is_refused_by_name(decided, tmp_path, old):
    _, _, folder = decided
    copy = tmp_path / "copy"
    shutil.copytree(folder, copy)
    data = {k: v for k, v in json.loads((copy / "sweep.json").read_text()).items() if k != "margin"}
    data["invocation"] = (data.get("invocation") or {}) | {"min_effect": old}
    (copy / "sweep.json").write_text(json.dumps(data))  # json writes inf as Infinity, as older Pythons' files did
    before = _records(copy)
    one_error_line(invoke("report", copy, "--format", "csv"),
                   f"corrupt sweep.json in {copy}: invocation.min_effect: ")
    assert _records(copy) == before

"""`anatomy check` beside a tuned study (issue 48 item 8): a tuned folder holds a config's runs at several LRs
and the same seeds (selection, frozen LR, shared LR), and the baseline was measured at the spec's LRs. So
`check --from-runs TUNED` compares the shared-LR run (like with like), a tuned folder without one is refused in
one line, and `check --runs-dir` into a tuned folder is refused before anything trains."""

from __future__ import annotations

import json
import shutil

import pytest
from helpers import invoke, one_error_line
from toy_data import write_spec

from anatomy_cli.store import records, runs

pytestmark = pytest.mark.slow  # trains a baseline (2 seeds) and a tuned study at toy size

TRAIN = {"steps": 4, "eval_interval": 2, "lr": 0.01}  # the 2017 end's best LR is one factor up (it moves)
TUNE = ("--tune-lr", "--tune-points", "3", "--tune-extend", "1", "--workers", "1", "--stack", "off", "--no-report")


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gate")
    spec = write_spec(tmp, top={"seeds": 2, "flips": ["rope"], "directions": ["add-one"]}, train=TRAIN)
    baseline = tmp / "baseline.json"
    update = invoke("check", spec, "--baseline", baseline, "--runs-dir", tmp / "base", "--update",
                    "--update-seeds", "2", "--workers", "1")
    assert update.exit_code == 0, update.output
    tuned = invoke("ablate", spec, "--runs-dir", tmp / "tuned", *TUNE)
    assert tuned.exit_code == 0, tuned.output
    folder = tmp / "tuned" / "toy"
    record = records.read_tune(folder)
    moved = [a.arm for a in record.arms if a.lr is not None and a.lr != TRAIN["lr"]]
    assert moved, record  # a config trained at another LR than the baseline's, at the baseline's seeds
    return spec, baseline, folder


def test_check_from_a_tuned_folder_compares_the_shared_lr_run(made, tmp_path):
    spec, baseline, folder = made
    copy = tmp_path / "toy"
    shutil.copytree(folder, copy)
    for run_dir in runs.find_runs(copy):  # the runs at a frozen LR read after the shared-LR runs, whatever the ids
        if json.loads((run_dir / runs.CONFIG).read_text())["train"]["lr"] != TRAIN["lr"]:
            run_dir.rename(copy / f"zz-{run_dir.name}")
    for where in (folder, copy):
        result = invoke("check", spec, "--baseline", baseline, "--from-runs", where, "--json")
        assert result.exit_code == 0, result.output
        rows = json.loads(result.stdout)["rows"]
        assert {r["verdict"] for r in rows} == {"ok"} and all(r["identical"] for r in rows), rows


def test_a_tuned_folder_without_shared_lr_runs_is_refused(made, tmp_path):
    spec, baseline, folder = made
    copy = tmp_path / "toy"
    shutil.copytree(folder, copy)
    record = records.read_tune(copy)
    moved = next(a for a in record.arms if a.lr is not None and a.lr != TRAIN["lr"])
    for run_dir in runs.find_runs(copy):  # the shared-LR runs of the config whose LR moved: gone
        config = json.loads((run_dir / runs.CONFIG).read_text())
        if config["name"].endswith(f"/{moved.arm}") and config["train"]["lr"] == TRAIN["lr"]:
            shutil.rmtree(run_dir)
    one_error_line(invoke("check", spec, "--baseline", baseline, "--from-runs", copy),
                   f"{copy} is a tuned study's folder and holds no run of {moved.arm} at the spec's lr 0.01, where "
                   f"the baseline was measured", code=2)


def test_check_runs_dir_into_a_tuned_folder_is_refused_before_training(made):
    spec, baseline, folder = made
    before = sorted(p.name for p in folder.iterdir())
    one_error_line(invoke("check", spec, "--baseline", baseline, "--runs-dir", folder.parent, "--workers", "1"),
                   f"--runs-dir: {folder} is a tuned study's folder (tune.json)", code=2)
    one_error_line(invoke("check", spec, "--baseline", folder.parent / "b.json", "--runs-dir", folder.parent,
                          "--update", "--update-seeds", "2"), "is a tuned study's folder", code=2)
    assert sorted(p.name for p in folder.iterdir()) == before

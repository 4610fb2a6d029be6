"""Export never writes into runs (issue 37, cause 4 and the weak list's one-line fixes): `export` into a
folder that holds runs (a runs directory, a sweep folder without its sweep.json) is refused in one
line, --overwrite or not: its config.json beside the runs made `report` read the folder as one run
and ignore the real ones."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from helpers import LLAMA, invoke, one_error_line, run_sets
from toy_data import write_corpus

from anatomy_cli.store import runs


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """A LLaMA-shaped toy run (export takes one), trained under RUNS/train/ as `train` puts it."""
    work = tmp_path_factory.mktemp("round-five")
    result = invoke("train", *run_sets(write_corpus(work), **LLAMA), "--runs-dir", work / "runs")
    assert result.exit_code == 0, result.output
    (run,) = (work / "runs" / "train").iterdir()
    return run


def snapshot(root: Path) -> dict[str, bytes | None]:
    return {str(q.relative_to(root)): None if q.is_dir() else q.read_bytes() for q in sorted(root.rglob("*"))}


def runs_folder(tmp_path: Path, trained: Path) -> Path:
    """RUNS/train/ with two runs in it, as `train --runs-dir RUNS` leaves it (no sweep.json)."""
    for name in ("a", "b"):
        shutil.copytree(trained, tmp_path / "runs" / "train" / name)
    return tmp_path / "runs"


TARGETS = {  # a folder holding runs -> (its path below tmp_path, extra set-up)
    "runs-of-train": ("runs/train", None),
    "runs-dir": ("runs", None),  # the runs two levels down
    "after-a-bad-export": ("runs/train", "export"),  # an earlier export's config.json already there
    "sweep-without-sweep-json": ("sweep", "sweep"),
}


@pytest.mark.parametrize("case", TARGETS)
@pytest.mark.parametrize("overwrite", [True, False])
def test_export_refuses_a_folder_holding_runs(tmp_path, trained, case, overwrite):
    where, setup = TARGETS[case]
    runs_folder(tmp_path, trained)
    if setup == "export":  # what the unguarded --overwrite left: the export's files beside the runs
        config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama"}
        (tmp_path / where / runs.CONFIG).write_text(json.dumps(config))
    if setup == "sweep":
        shutil.move(tmp_path / "runs" / "train", tmp_path / "sweep")
    target = tmp_path / where
    before = snapshot(tmp_path)
    result = invoke("export", trained, target, *(["--overwrite"] if overwrite else []))
    line = one_error_line(result, f"{target} holds runs")
    assert "choose another output folder" in line, line
    assert snapshot(tmp_path) == before  # nothing written


def test_report_of_the_runs_folder_still_reads_its_runs(tmp_path, trained):
    root = runs_folder(tmp_path, trained)
    one_error_line(invoke("export", trained, root / "train", "--overwrite"), "holds runs")
    assert [p.name for p in runs.find_runs(root / "train")] == ["a", "b"]


def test_export_into_a_fresh_folder_beside_the_runs_still_works(tmp_path, trained):
    root = runs_folder(tmp_path, trained)
    result = invoke("export", trained, root / "hf")
    assert result.exit_code == 0, result.output
    assert (root / "hf" / "model.safetensors").is_file()


# ------------------------------------------------------------------------------ the weak list


@pytest.mark.parametrize("case", ["not-empty", "holds-runs"])
def test_no_warning_before_the_error_of_a_train_into_a_folder_it_refuses(tmp_path, trained, case):
    out = tmp_path / "out"
    if case == "not-empty":
        out.mkdir()
        (out / "notes.txt").write_text("mine\n")
    else:
        shutil.copytree(trained, out / "a")
    # --steps 1 ends inside the warmup: a warning, which must not come before the refusal
    result = invoke("train", *run_sets(Path(trained).parents[2] / "tiny.txt"), "--steps", 1, "--out", out)
    line = one_error_line(result, "not empty" if case == "not-empty" else "holds other runs")
    assert result.output.strip() == line.strip(), result.output  # the error alone: no warning, no progress bar


def test_no_warning_before_the_error_of_a_missing_corpus(tmp_path):
    """The warmup warning came first, then a progress bar, then 'corpus not found' (issue 37's weak list)."""
    result = invoke("train", *run_sets(tmp_path / "gone.txt"), "--steps", 1, "--out", tmp_path / "out")
    line = one_error_line(result, "corpus not found")
    assert result.output.strip() == line.strip(), result.output
    assert not (tmp_path / "out").exists()


def test_exporting_a_run_still_training_says_so(tmp_path, trained):
    """Its best weights so far are exported, with a warning that a later checkpoint replaces them (issue
    37's weak list: it said nothing); a finished run's export says nothing of the kind."""
    from anatomy_cli.store import lockfile

    run = tmp_path / "live"
    shutil.copytree(trained, run)
    summary = json.loads((run / runs.SUMMARY).read_text())
    runs.atomic_write_json(run / runs.SUMMARY, summary | {"status": runs.RUNNING, "owner": lockfile.identity()})
    result = invoke("export", run, tmp_path / "hf")
    assert result.exit_code == 0, result.output
    assert "is still training: this exports its best weights so far" in result.output, result.output
    done = invoke("export", trained, tmp_path / "hf2")
    assert done.exit_code == 0 and "still training" not in done.output

"""Issue #30 (data loss): no command writes into a run folder or a sweep folder unless it is that
command's own output there (report SWEEP -> SWEEP/report/, eval RUN -> RUN/eval.json), and none
replaces an existing file it did not write (`report --results` replaces only a results file). A
refusal is one line starting 'error:', exit 2, before anything is written: every byte under the
test's folder is as it was, and the runs in it still read as completed."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
from helpers import LLAMA, invoke, one_error_line, run_sets
from toy_data import write_corpus, write_spec
from typer.testing import CliRunner

from anatomy_cli.report import results_file
from anatomy_cli.store import runs

runner = CliRunner()


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("overwrite")


@pytest.fixture(scope="module")
def corpus(workdir) -> Path:
    return write_corpus(workdir)


@pytest.fixture(scope="module")
def trained(workdir, corpus) -> Path:
    out = workdir / "run"
    result = invoke("train", *run_sets(corpus, **LLAMA), "--out", out)
    assert result.exit_code == 0, result.output
    return out


@pytest.fixture
def p(tmp_path, trained) -> SimpleNamespace:
    """A completed run, a sweep with a completed run in it, a JSON file that is not a results file,
    a folder of someone's files and a text corpus folder, all in the test's own folder."""
    run = shutil.copytree(trained, tmp_path / "run")
    sweep = tmp_path / "sweep"
    shutil.copytree(trained, sweep / "member")
    (sweep / runs.SWEEP).write_text('{"components": []}\n')
    other = tmp_path / "other.json"
    other.write_text('{"mine": "not a results file"}\n')
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "report.md").write_text("my own notes\n")
    (folder / "vocab.json").write_text('["my", "own"]\n')
    texts = tmp_path / "texts"
    texts.mkdir()
    (texts / "chapter.txt").write_text("a corpus a run trains on\n")
    return SimpleNamespace(root=tmp_path, run=run, sweep=sweep, member=sweep / "member", other=other, folder=folder,
                           texts=texts)


def snapshot(root: Path) -> dict[str, bytes | None]:
    """Every path under root with its bytes (None for a folder)."""
    return {str(q.relative_to(root)): None if q.is_dir() else q.read_bytes() for q in sorted(root.rglob("*"))}


def refused(p: SimpleNamespace, args: list, fragment: str) -> None:
    """One error line holding `fragment`, exit 2, nothing under the test's folder written or changed,
    and both runs still complete."""
    before = snapshot(p.root)
    one_error_line(invoke(*args), fragment)
    assert snapshot(p.root) == before
    assert runs.run_status(p.run) == runs.COMPLETED and runs.run_status(p.member) == runs.COMPLETED


# --------------------------------------------------------------------------- report --results FILE

RESULTS_TARGETS = {  # target -> what the error line says
    "run-summary": (lambda p: p.run / runs.SUMMARY, lambda p: f"is inside the run directory {p.run}"),
    "new-file-in-run": (lambda p: p.run / "results.json", lambda p: f"is inside the run directory {p.run}"),
    "run-samples": (lambda p: p.run / runs.SAMPLES, lambda p: f"is inside the run directory {p.run}"),
    "run-itself": (lambda p: p.run, lambda p: f"{p.run} is a run directory"),
    "sweep-json": (lambda p: p.sweep / runs.SWEEP, lambda p: f"is inside the sweep directory {p.sweep}"),
    "new-file-in-sweep": (lambda p: p.sweep / "results.json", lambda p: f"is inside the sweep directory {p.sweep}"),
    "member-summary": (lambda p: p.member / runs.SUMMARY, lambda p: f"is inside the run directory {p.member}"),
    "not-results-json": (lambda p: p.other, lambda p: "exists and is not a results file"),
    "directory": (lambda p: p.folder, lambda p: f"{p.folder} is a directory"),
    "trailing-slash": (lambda p: f"{p.root / 'fresh'}/", lambda p: f"{p.root / 'fresh'}/ is a directory"),
}


@pytest.mark.parametrize("case", RESULTS_TARGETS)
def test_report_results_refuses_what_it_did_not_write(p, case):
    target, fragment = RESULTS_TARGETS[case]
    refused(p, ["report", p.sweep, "--format", "csv", "--results", target(p)], fragment(p))


def test_an_interrupted_run_s_summary_is_kept_and_the_run_resumes(p):
    """The issue's case: --results over an interrupted run's summary.json left it unresumable."""
    summary = json.loads((p.run / runs.SUMMARY).read_text())
    (p.run / runs.SUMMARY).write_text(json.dumps(summary | {"status": runs.INTERRUPTED}))
    before = snapshot(p.root)
    one_error_line(invoke("report", p.run, "--format", "csv", "--results", p.run / runs.SUMMARY),
                   f"is inside the run directory {p.run}")
    assert snapshot(p.root) == before and runs.run_status(p.run) == runs.INTERRUPTED
    result = invoke("train", "--resume", p.run)
    assert result.exit_code == 0, result.output
    assert runs.run_status(p.run) == runs.COMPLETED


def test_report_results_replaces_a_results_file_and_writes_a_fresh_path(p):
    fresh = p.root / "experiments" / "results" / "toy.json"
    result = invoke("report", p.sweep, "--format", "csv", "--results", fresh)
    assert result.exit_code == 0, result.output
    assert results_file.load(fresh)["format"] == results_file.FORMAT
    fresh.write_text(json.dumps({"format": results_file.FORMAT, "version": 1, "study": "stale"}))
    result = invoke("report", p.sweep, "--format", "csv", "--results", fresh)  # a results file: replaced
    assert result.exit_code == 0, result.output
    assert results_file.load(fresh)["study"] == "sweep"
    own = p.sweep / "report" / "results.json"  # report's own folder in the sweep
    result = invoke("report", p.sweep, "--format", "csv", "--results", own)
    assert result.exit_code == 0, result.output
    assert results_file.load(own)["study"] == "sweep"
    assert runs.run_status(p.member) == runs.COMPLETED


# --------------------------------------------------------------------------- report --out DIR

OUT_TARGETS = {
    "another-run": (lambda p: p.run, lambda p: f"{p.run} is a run directory"),
    "another-run-report": (lambda p: p.run / "report", lambda p: f"is inside the run directory {p.run}"),
    "member-folder": (lambda p: p.member / "report", lambda p: f"is inside the run directory {p.member}"),
    "sweep-not-report": (lambda p: p.sweep / "figures", lambda p: f"is inside the sweep directory {p.sweep}"),
    "sweep-itself": (lambda p: p.sweep, lambda p: f"{p.sweep} is a sweep directory"),
    "someone-s-report-md": (lambda p: p.folder, lambda p: f"{p.folder} is not a report folder but holds report.md"),
    "a-file": (lambda p: p.other, lambda p: "not a directory (a file is in the way)"),
}


@pytest.mark.parametrize("case", OUT_TARGETS)
def test_report_out_refuses_other_folders(p, case):
    target, fragment = OUT_TARGETS[case]
    refused(p, ["report", p.sweep, "--format", "csv", "--out", target(p), "--results", p.root / "r.json"],
            fragment(p))


def test_report_of_another_folder_cannot_write_into_a_sweep(p):
    refused(p, ["report", p.run, "--format", "csv", "--out", p.sweep / "report"],
            f"is inside the sweep directory {p.sweep}")


def test_report_results_is_not_one_of_the_report_s_own_files(p):
    refused(p, ["report", p.sweep, "--out", p.root / "rep", "--results", p.root / "rep" / "report.json"],
            "is the report's own report.json")


def test_report_writes_its_own_folder_again_and_a_fresh_one(p):
    from anatomy_cli.report import write

    for _ in range(2):  # SWEEP/report, every format, then the same folder again (its own files)
        result = invoke("report", p.sweep)
        assert result.exit_code == 0, result.output
    written = {q.name for q in (p.sweep / "report").iterdir()}
    assert {"runs.csv", "report.md", "report.html", "report.json"} <= written <= set(write.FILES)
    for out in (p.sweep / "report", p.root / "elsewhere", p.root / "elsewhere"):
        result = invoke("report", p.sweep, "--format", "md", "--out", out)
        assert result.exit_code == 0, result.output
    assert (p.root / "elsewhere" / "report.md").is_file()
    result = invoke("report", p.run, "--format", "csv")  # a run's own report folder
    assert result.exit_code == 0, result.output
    assert runs.run_status(p.run) == runs.COMPLETED and runs.run_status(p.member) == runs.COMPLETED


def test_a_sweep_is_known_without_sweep_json(p):
    """A list design writes no sweep.json: its runs' summaries name it. A live sweep holds its .lock;
    another tool's lock file (pytest's: a bare pid) does not make a folder a sweep."""
    listed = shutil.copytree(p.run, p.root / "listed" / "member").parent
    summary = json.loads((listed / "member" / runs.SUMMARY).read_text())
    (listed / "member" / runs.SUMMARY).write_text(json.dumps(summary | {"sweep": "listed"}))
    refused(p, ["report", p.sweep, "--format", "csv", "--results", listed / "results.json"],
            f"is inside the sweep directory {listed}")
    assert runs.holds_sweep(listed) and not runs.holds_sweep(p.root)
    locked = p.root / "locked"
    locked.mkdir()
    (locked / ".lock").write_text("12345\n")  # pytest's numbered folders hold one like it
    assert not runs.holds_sweep(locked)
    (locked / ".lock").write_text('{"pid": 12345, "start": null, "host": "h"}')
    assert runs.holds_sweep(locked)


# --------------------------------------------------------------------------- export RUN OUT_DIR

EXPORT_TARGETS = {
    "another-run": (lambda p: p.run, lambda p: f"{p.run} is a run directory"),
    "inside-a-run": (lambda p: p.run / "hf", lambda p: f"is inside the run directory {p.run}"),
    "inside-a-sweep": (lambda p: p.sweep / "hf", lambda p: f"is inside the sweep directory {p.sweep}"),
    "sweep-itself": (lambda p: p.sweep, lambda p: f"{p.sweep} is a sweep directory"),
    "sweep-member": (lambda p: p.member, lambda p: f"{p.member} is a run directory"),
    "someone-s-vocab": (lambda p: p.folder, lambda p: f"{p.folder} is not an export folder but holds vocab.json"),
}


@pytest.mark.parametrize("case", EXPORT_TARGETS)
def test_export_refuses_run_and_sweep_folders_even_with_overwrite(p, trained, case):
    target, fragment = EXPORT_TARGETS[case]
    refused(p, ["export", trained, target(p), "--overwrite"], fragment(p))


def test_export_writes_a_fresh_folder_and_replaces_its_own_export(p, trained):
    out = p.root / "hf"
    for extra in ([], ["--overwrite"]):
        result = invoke("export", trained, out, *extra)
        assert result.exit_code == 0, result.output
    assert (out / "model.safetensors").is_file()


# --------------------------------------------------------------------------- prepare --out DIR

PREPARE_TARGETS = {
    "a-run": (lambda p: p.run, lambda p: "is a run directory, not a prepared corpus directory"),
    "inside-a-run": (lambda p: p.run / "data", lambda p: f"is inside the run directory {p.run}"),
    "a-sweep": (lambda p: p.sweep, lambda p: f"{p.sweep} is a sweep directory"),
    "inside-a-sweep": (lambda p: p.sweep / "data", lambda p: f"is inside the sweep directory {p.sweep}"),
    "a-text-corpus": (lambda p: p.texts, lambda p: f"{p.texts} is not a prepared corpus but holds chapter.txt"),
    "someone-s-vocab": (lambda p: p.folder, lambda p: f"{p.folder} is not a prepared corpus but holds"),
}


@pytest.mark.parametrize("case", PREPARE_TARGETS)
def test_prepare_refuses_run_sweep_and_foreign_folders(p, corpus, case):
    target, fragment = PREPARE_TARGETS[case]
    refused(p, ["prepare", corpus, "--out", target(p), "--ctx-len", 16], fragment(p))


def test_prepare_writes_a_fresh_folder_and_prepares_its_own_again(p, corpus):
    for _ in range(2):
        result = invoke("prepare", corpus, "--out", p.root / "prepared", "--ctx-len", 16)
        assert result.exit_code == 0, result.output
    assert (p.root / "prepared" / "meta.json").is_file()


# --------------------------------------------------------------------------- train, ablate, eval


def test_train_and_ablate_refuse_a_sweep_and_a_run(p, corpus):
    sets = run_sets(corpus, **LLAMA)
    refused(p, ["train", *sets, "--out", p.sweep, "--overwrite"], f"{p.sweep} is a sweep directory")
    refused(p, ["train", *sets, "--out", p.sweep / "mine"], f"is inside the sweep directory {p.sweep}")
    refused(p, ["train", *sets, "--out", p.run / "inner"], f"is inside the run directory {p.run}")
    (p.root / "spec").mkdir()
    spec = write_spec(p.root / "spec")
    refused(p, ["ablate", spec, "--runs-dir", p.sweep, "--dry-run"], f"is inside the sweep directory {p.sweep}")
    refused(p, ["ablate", spec, "--runs-dir", p.run, "--dry-run"], f"is inside the run directory {p.run}")


def test_eval_writes_its_own_file_in_the_run(p):
    result = invoke("eval", p.run, "--ctx", 8)
    assert result.exit_code == 0, result.output
    assert (p.run / runs.EVAL).is_file() and runs.run_status(p.run) == runs.COMPLETED


# --------------------------------------------------------------------------- check --update --baseline FILE

BASELINE_TARGETS = {
    "run-summary": (lambda p: p.run / runs.SUMMARY, lambda p: f"is inside the run directory {p.run}"),
    "in-a-sweep": (lambda p: p.sweep / "baseline.json", lambda p: f"is inside the sweep directory {p.sweep}"),
    "not-a-baseline": (lambda p: p.other, lambda p: "exists and is not a baseline file"),
    "directory": (lambda p: p.folder, lambda p: f"{p.folder} is a directory"),
}


@pytest.mark.parametrize("case", BASELINE_TARGETS)
def test_check_update_refuses_before_it_trains(p, case):
    target, fragment = BASELINE_TARGETS[case]
    (p.root / "spec").mkdir()
    spec = write_spec(p.root / "spec", name="gate", top={"flips": ["rope"]})
    refused(p, ["check", spec, "--baseline", target(p), "--runs-dir", p.root / "ci", "--update", "--update-seeds", 2,
                "--workers", 1], fragment(p))


def test_a_baseline_file_may_be_replaced(tmp_path):
    from anatomy_cli.cli.tools import is_baseline

    path = tmp_path / "b.json"
    path.write_text('{"configs": {"2017": {"best_val_loss": 3.0}}}')
    assert is_baseline(path)
    runs.refuse_replacing(path, "--baseline", "baseline file", is_baseline)  # no error
    path.write_text('{"format": "anatomy-results"}')
    assert not is_baseline(path)

"""Where the output goes, hostile (issue 37, causes 6 and 8): a COLUMNS of 0 (some CI containers
export it) is read as unset, never as a terminal 0 columns wide that silences every command; a closed
stdout, an output encoding that cannot show a character, and the file-size limit (`ulimit -f`) are
each one line, exit 2, never an "internal error". Each case needs a real process: the consoles read
COLUMNS when the CLI is imported, and a closed fd 1, PYTHONIOENCODING and a ulimit belong to one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import PATIENCE, invoke, one_error_line, run_sets
from report_runs import make_run
from toy_data import tiny_text

pytestmark = pytest.mark.process

CLI = [sys.executable, "-m", "anatomy_cli"]


def env(**extra: str) -> dict:
    base = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES", "PYTHONIOENCODING")}
    return {**base, "PYTHONPATH": os.pathsep.join(sys.path), "OMP_NUM_THREADS": "1", **extra}


def anatomy(*args, shell_prefix: str = "", redirect: str = "", **extra) -> subprocess.CompletedProcess:
    """`anatomy ARGS` in its own process; `shell_prefix` (e.g. 'ulimit -f 50;') and `redirect` (e.g.
    '>&-') go through sh."""
    argv = [*CLI, *map(str, args)]
    if shell_prefix or redirect:
        argv = ["sh", "-c", f"{shell_prefix} exec \"$@\" {redirect}", "sh", *argv]
    return subprocess.run(argv, capture_output=True, text=True, env=env(**extra), timeout=PATIENCE)


@pytest.fixture(scope="module")
def sweep(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("sweep") / "sweep"
    for i, flips in enumerate(((), ("rope",))):
        make_run(root, f"r{i}", flips=flips)
    return root


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """A toy run on a corpus with characters ASCII cannot show."""
    folder = tmp_path_factory.mktemp("accented")
    corpus = folder / "accented.txt"
    corpus.write_text(tiny_text(6000).replace("e", "é").replace("a", "…"), encoding="utf-8")
    result = invoke("train", *run_sets(corpus), "--out", folder / "run")
    assert result.exit_code == 0, result.output
    return folder / "run"


# ------------------------------------------------------------------------------------- COLUMNS


@pytest.mark.parametrize("columns", ["0", "000"])
def test_columns_zero_is_unset_and_errors_are_said(columns):
    result = anatomy("train", "--set", "model.d_model=-1", COLUMNS=columns)
    assert one_error_line(result, "model.d_model: Input should be greater than 0", alone=True)


@pytest.mark.parametrize("columns", ["0", "-3", "wide"])
def test_columns_zero_or_not_a_number_still_prints_tables(columns):
    result = anatomy("components", COLUMNS=columns)
    assert result.returncode == 0, result.stderr
    assert "rope" in result.stdout and "swiglu" in result.stdout
    assert max(map(len, result.stdout.splitlines())) <= 80  # the width of a pipe, as with COLUMNS unset


# ---------------------------------------------------------------------------------- closed stdout


@pytest.mark.parametrize("args", [["report", "SWEEP", "--json"], ["components"], ["report", "SWEEP"]])
def test_a_closed_stdout_is_one_line(sweep, args):
    result = anatomy(*[sweep if a == "SWEEP" else a for a in args], redirect=">&-")
    assert "standard output is closed" in one_error_line(result, alone=True)


# ------------------------------------------------------------------------------------- encoding


@pytest.mark.parametrize("args", [["components"], ["report", "SWEEP"], ["sample", "RUN", "--max-new", "200"]])
def test_an_encoding_that_cannot_show_a_character_is_one_line(sweep, trained, args):
    args = [sweep if a == "SWEEP" else trained if a == "RUN" else a for a in args]
    result = anatomy(*args, PYTHONIOENCODING="ascii")
    one_error_line(result, "PYTHONIOENCODING=utf-8", alone=True)


def test_a_json_report_is_ascii_safe_in_any_encoding(sweep):
    result = anatomy("report", sweep, "--json", PYTHONIOENCODING="ascii")
    assert result.returncode == 0, result.stderr
    json.loads(result.stdout)


# ------------------------------------------------------------------------------- file-size limit


def test_the_file_size_limit_during_train_is_one_line_naming_it(tmp_path, trained):
    # the toy model's weights (~110 KB) pass 50 blocks (25 KiB in sh's 512-byte blocks, 50 KiB in bash's);
    # config, vocabulary and metrics stay below it
    out = tmp_path / "run"
    result = anatomy("train", *run_sets(Path(trained).parent / "accented.txt"), "--out", out,
                     shell_prefix="ulimit -f 50;", COLUMNS="200")
    line = one_error_line(result, "file-size limit")
    assert "File too large" in line and "best.safetensors" in line and "ulimit -f, is" in line, line
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "failed"
    assert "SafetensorError" not in summary["error"] and "File too large" in summary["error"], summary
    assert not list(out.glob(".*.tmp"))  # no partial temp file left behind


def test_a_torch_save_past_the_file_size_limit_is_efbig_naming_the_file(tmp_path):
    # torch.save says "unexpected pos" (a RuntimeError) where the limit stopped its write
    script = ("import errno, torch; from anatomy_cli.training.checkpoint import _atomic\n"
              "try:\n"
              f"    _atomic({str(tmp_path / 'resume.pt')!r},\n"
              "            lambda tmp: torch.save({'w': torch.zeros(100000)}, tmp))\n"
              "except OSError as err:\n"
              "    print(err.errno == errno.EFBIG, err.filename)\n")
    result = subprocess.run(["sh", "-c", 'ulimit -f 50; exec "$@"', "sh", sys.executable, "-c", script],
                            capture_output=True, text=True, env=env(), timeout=PATIENCE)
    assert result.stdout.split() == ["True", str(tmp_path / "resume.pt")], result.stdout + result.stderr

"""A full disk is one line naming the file, exit 2, never an 'internal error'; every file already
written keeps its old content and no temp file is left behind.

Where this machine lets a test mount a tiny tmpfs in its own mount namespace (`unshare -rm`, as
root or with user namespaces), the commands write into a real full file system; elsewhere the
same properties are checked by injecting OSError(ENOSPC) into the write."""

from __future__ import annotations

import errno
import functools
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import PATIENCE, error_line
from report_runs import make_run
from toy_data import TINY_MODEL, TINY_TRAIN, tiny_text, write_corpus, write_spec

from anatomy_cli.store import runs

FULL = os.strerror(errno.ENOSPC)  # "No space left on device"


@functools.cache
def tiny_fs_works() -> bool:
    if not shutil.which("unshare"):
        return False
    probe = subprocess.run(["unshare", "-rm", "sh", "-c", "mount -t tmpfs -o size=4k tmpfs /mnt && echo ok"],
                           capture_output=True, text=True)
    return probe.stdout.strip() == "ok"


# A string condition: probed (a process) when a test that needs it runs, not when the module is collected.
needs_tmpfs = pytest.mark.skipif("not tiny_fs_works()", reason="cannot mount a tmpfs in a user mount namespace")


def on_tiny_fs(mount: Path, size_kb: int, script: str) -> subprocess.CompletedProcess:
    """Run `script` (sh) with a `size_kb` tmpfs mounted at `mount`, in a private mount namespace."""
    mount.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(sys.path), "COLUMNS": "200"}
    return subprocess.run(["unshare", "-rm", "sh", "-c",
                           f"mount -t tmpfs -o size={size_kb}k tmpfs {mount} && {script}"],
                          capture_output=True, text=True, env=env, timeout=PATIENCE)


ANATOMY = f"{sys.executable} -m anatomy_cli"


@pytest.mark.process
@needs_tmpfs
def test_report_on_a_full_disk_names_the_file_and_keeps_the_old_report(tmp_path):
    for i, flips in enumerate(((), ("rope",))):
        make_run(tmp_path / "sweep", f"r{i}", flips=flips)
    out = tmp_path / "mnt"
    # an earlier report in the folder (forest.png marks a report folder: report --out replaces no other)
    script = (f"printf 'old figure' > {out}/forest.png && printf 'old report' > {out}/report.md && "
              f"{ANATOMY} report {tmp_path / 'sweep'} --out {out}; "
              f"echo rc=$?; ls -a {out}; cat {out}/report.md")
    result = on_tiny_fs(out, 24, script)  # room for the old file, not for the figures
    line = error_line(result.stderr)
    assert FULL in line and str(out) in line, result.stderr
    assert "rc=2" in result.stdout
    listing = result.stdout.split()
    assert not [name for name in listing if name.endswith(".tmp")], result.stdout  # no temp file left
    assert result.stdout.rstrip().endswith("old report")


@pytest.mark.process
@needs_tmpfs
def test_training_on_a_full_disk_is_one_line_naming_the_file(tmp_path):
    corpus = write_corpus(tmp_path)
    sets = [f"--set=data.source={json.dumps(str(corpus))}"]
    sets += [f"--set=model.{k}={json.dumps(v)}" for k, v in TINY_MODEL.items()]
    sets += [f"--set=train.{k}={json.dumps(v)}" for k, v in TINY_TRAIN.items()]
    out = tmp_path / "mnt"
    script = f"{ANATOMY} train {' '.join(repr(s) for s in sets)} --out {out}/run; echo rc=$?; ls -a {out}/run"
    result = on_tiny_fs(out, 64, script)  # config and vocab fit, the weights (~110 KB) do not
    line = error_line(result.stderr)
    assert FULL in line and f"{out}/run/" in line, result.stderr
    assert "rc=2" in result.stdout
    assert not [name for name in result.stdout.split() if name.endswith(".tmp")], result.stdout


@pytest.mark.process
@needs_tmpfs
def test_prepare_on_a_full_disk_names_the_split_file_not_its_temp(tmp_path):
    """A bare write() error names no file ('No space left on device' alone, issue 48): prepare names the file
    the temp becomes; no temp file and no half folder is left."""
    corpus = tmp_path / "c.txt"
    corpus.write_text(tiny_text(400_000), encoding="utf-8")
    out = tmp_path / "mnt"
    result = on_tiny_fs(out, 200, f"{ANATOMY} prepare {corpus} --out {out}/p --ctx-len 16; echo rc=$?; ls -a {out}")
    assert error_line(result.stderr) == f"error: {FULL}: {out}/p/train.bin", result.stderr
    assert "rc=2" in result.stdout and result.stdout.split()[1:] == [".", ".."], result.stdout


@pytest.mark.process
@needs_tmpfs
def test_ablate_time_on_a_full_disk_names_the_lock_and_leaves_no_temp(tmp_path):
    spec = write_spec(tmp_path, top={"flips": ["rope"], "seeds": 1})
    out = tmp_path / "mnt"
    script = (f"head -c 8192 /dev/zero > {out}/fill 2>/dev/null; {ANATOMY} ablate {spec} --time --set timing.steps=2 "
              f"--set timing.rounds=3 --runs-dir {out}/r; echo rc=$?; find {out}/r")
    result = on_tiny_fs(out, 8, script)  # filled before the sweep folder's lock is taken
    assert error_line(result.stderr) == f"error: {FULL}: {out}/r/toy/.lock", result.stderr
    assert "rc=2" in result.stdout and ".tmp" not in result.stdout, result.stdout


# ------------------------------------------------------------------ the standard streams (/dev/full)

needs_dev_full = pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full")


def anatomy(*args: str, stdout=subprocess.PIPE, stderr=subprocess.PIPE) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(sys.path), "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "anatomy_cli", *map(str, args)], stdout=stdout, stderr=stderr,
                          text=True, env=env, timeout=PATIENCE)


@pytest.mark.process
@needs_dev_full
@pytest.mark.parametrize("json_out", [True, False])
def test_a_full_standard_output_is_said_as_such_and_the_report_files_stay(tmp_path, json_out):
    for i, flips in enumerate(((), ("rope",))):
        make_run(tmp_path / "sweep", f"r{i}", flips=flips)
    with open("/dev/full", "w") as full:
        result = anatomy("report", tmp_path / "sweep", *(["--json"] if json_out else []), stdout=full)
    assert result.returncode == 2, result.stderr
    assert result.stderr == f"error: {FULL}: the standard output\n"  # one line, no 'Exception ignored' at exit
    assert json.loads((tmp_path / "sweep" / "report" / "report.json").read_text())["runs"]  # written whole


@pytest.mark.process
@needs_dev_full
def test_a_full_standard_error_does_not_fail_a_run(tmp_path):
    """train 2> /dev/full completed its run, printed nothing and exited 1: stderr holds progress and warnings,
    never the command's output, so losing it changes nothing: the summary on stdout, exit 0."""
    corpus = write_corpus(tmp_path)
    sets = [f"--set=data.source={json.dumps(str(corpus))}"]
    sets += [f"--set=model.{k}={json.dumps(v)}" for k, v in TINY_MODEL.items()]
    sets += [f"--set=train.{k}={json.dumps(v)}" for k, v in TINY_TRAIN.items()]
    with open("/dev/full", "w") as full:
        result = anatomy("train", *sets, "--set=train.warmup=100", "--out", tmp_path / "run", stderr=full)
    assert result.returncode == 0, result.stdout
    assert result.stdout.startswith(f"run: {tmp_path / 'run'}\n") and "completed" in result.stdout
    assert runs.read_summary(tmp_path / "run")["status"] == runs.COMPLETED


# ------------------------------------------------------------------ the same properties, injected


def test_an_injected_full_disk_names_the_file_and_keeps_the_old_one(tmp_path, monkeypatch):
    path = tmp_path / "summary.json"
    runs.atomic_write_json(path, {"status": "completed"})

    def full(fd):
        raise OSError(errno.ENOSPC, FULL)

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OSError) as caught:
        runs.atomic_write_json(path, {"status": "running", "pad": "x" * 10_000})
    assert caught.value.errno == errno.ENOSPC and caught.value.filename == str(path)
    assert json.loads(path.read_text()) == {"status": "completed"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["summary.json"]


@pytest.mark.parametrize("message", ["Error while serializing: I/O error: No space left on device (os error 28)",
                                     "[enforce fail at inline_container.cc:672] . unexpected pos 576 vs 534"])
def test_a_library_s_own_words_for_a_full_disk_become_one_oserror(tmp_path, monkeypatch, message):
    """safetensors says 'os error 28'; torch.save says 'unexpected pos' (the disk is then full)."""
    class Statvfs:
        f_bavail = 0

    monkeypatch.setattr(os, "statvfs", lambda path: Statvfs)
    with pytest.raises(OSError) as caught, runs.writing(tmp_path / "best.safetensors"):
        raise RuntimeError(message)
    assert caught.value.errno == errno.ENOSPC and caught.value.filename == str(tmp_path / "best.safetensors")


def test_a_bug_on_a_disk_with_room_stays_a_bug(tmp_path):
    with pytest.raises(RuntimeError, match="a bug"), runs.writing(tmp_path / "x"):
        raise RuntimeError("a bug")


def test_the_cli_says_a_full_disk_in_one_line(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from anatomy_cli.cli.main import app

    for i, flips in enumerate(((), ("rope",))):
        make_run(tmp_path / "sweep", f"r{i}", flips=flips)

    def full(fd):
        raise OSError(errno.ENOSPC, FULL)

    monkeypatch.setattr(os, "fsync", full)
    result = CliRunner().invoke(app, ["report", str(tmp_path / "sweep"), "--out", str(tmp_path / "out")])
    assert result.exit_code == 2, result.output
    assert error_line(result.output) == f"error: {FULL}: {tmp_path / 'out' / 'forest.png'}"
    assert not list((tmp_path / "out").glob(".*.tmp"))

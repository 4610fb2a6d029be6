"""--executor dask against a real scheduler and two workers on 127.0.0.1 (no shared filesystem
assumption: runs come back as bytes). Every process is stopped at the end, even on failure."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import PATIENCE, wait_for
from toy_data import tiny_text, write_corpus, write_spec
from typer.testing import CliRunner

from anatomy_cli.cli.main import app
from anatomy_cli.store import runs

pytest.importorskip("distributed")
pytestmark = [pytest.mark.slow, pytest.mark.process]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def dask_bin() -> list[str]:
    exe = shutil.which("dask", path=str(Path(sys.executable).parent)) or shutil.which("dask")
    return [exe] if exe else [sys.executable, "-m", "distributed.cli.dask_scheduler"]


def port_open(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def wait_port(port: int, timeout: float = PATIENCE) -> None:
    wait_for(lambda: port_open(port), f"the scheduler opening port {port}", timeout, poll=0.2)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("cluster")
    port, dash = free_port(), free_port()
    address = f"tcp://127.0.0.1:{port}"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    procs = []
    log = open(tmp_path / "dask.log", "w")
    try:
        procs.append(subprocess.Popen([*dask_bin(), "scheduler", "--host", "127.0.0.1", "--port", str(port),
                                       "--dashboard-address", f"127.0.0.1:{dash}"], stdout=log, stderr=log, env=env,
                                      cwd=tmp_path))
        wait_port(port)
        for i in range(2):
            wdir = tmp_path / f"worker{i}"  # separate working dirs: nothing shared with the client
            wdir.mkdir()
            procs.append(subprocess.Popen([*dask_bin(), "worker", address, "--nthreads", "1", "--nworkers", "1",
                                           "--no-dashboard", "--local-directory", str(wdir)],
                                          stdout=log, stderr=log, env=env, cwd=wdir))
        from distributed import Client

        with Client(address, timeout=f"{PATIENCE:.0f}s") as client:
            client.wait_for_workers(2, timeout=PATIENCE)
        yield address
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        log.close()
        assert all(p.poll() is not None for p in procs)


def test_dask_executor_matches_local(tmp_path, cluster):
    spec = write_spec(tmp_path, top={"flips": ["rope", "swiglu"]})
    runner = CliRunner()
    local = runner.invoke(app, ["ablate", str(spec), "--runs-dir", str(tmp_path / "local"), "--workers", "1",
                                "--no-report"])
    assert local.exit_code == 0, local.output
    remote = runner.invoke(app, ["ablate", str(spec), "--runs-dir", str(tmp_path / "dask"), "--executor", "dask",
                                 "--address", cluster, "--no-report"])
    assert remote.exit_code == 0, remote.output
    a, b = tmp_path / "local" / "toy", tmp_path / "dask" / "toy"
    names = sorted(d.name for d in a.iterdir() if d.is_dir())
    assert names == sorted(d.name for d in b.iterdir() if d.is_dir()) and len(names) == 6
    for name in names:
        strip = lambda d: [{k: v for k, v in r.items() if k not in runs.TIMING_KEYS} for r in runs.read_metrics(d)]  # noqa: E731
        assert strip(a / name) == strip(b / name), name
        assert (a / name / runs.CONFIG).read_text() == (b / name / runs.CONFIG).read_text()
        assert runs.read_summary(b / name)["status"] == runs.COMPLETED
        assert (b / name / runs.BEST).stat().st_size > 0
    before = {n: (b / n / runs.SUMMARY).read_text() for n in names}
    again = runner.invoke(app, ["ablate", str(spec), "--runs-dir", str(tmp_path / "dask"), "--executor", "dask",
                                "--address", cluster, "--no-report"])
    assert again.exit_code == 0 and "6 completed" in again.output
    assert {n: (b / n / runs.SUMMARY).read_text() for n in names} == before  # skipped, not resubmitted


def test_unreachable_scheduler_is_one_line(tmp_path):
    spec = write_spec(tmp_path)
    result = CliRunner().invoke(app, ["ablate", str(spec), "--runs-dir", str(tmp_path / "r"), "--executor", "dask",
                                      "--address", f"tcp://127.0.0.1:{free_port()}", "--no-report"])
    assert result.exit_code == 2 and "cannot reach the dask scheduler" in result.output


def _source(tmp_path: Path, kind: str) -> Path:
    """A corpus of each kind the local executor accepts."""
    if kind == "prepared":  # a folder written by `anatomy prepare`
        out = tmp_path / "prepared"
        assert CliRunner().invoke(app, ["prepare", str(write_corpus(tmp_path)), "--out", str(out),
                                        "--ctx-len", "16"]).exit_code == 0
        return out
    docs = tmp_path / "docs"  # a folder of .md/.txt files (front matter stripped, joined)
    docs.mkdir()
    (docs / "a.md").write_text("---\ntitle: a\n---\n" + tiny_text(3000, 1), encoding="utf-8")
    (docs / "b.txt").write_text(tiny_text(3000, 2), encoding="utf-8")
    return docs


@pytest.mark.parametrize("kind", ["prepared", "docs"])
def test_dask_accepts_every_source_the_local_executor_does(tmp_path, cluster, kind):
    spec = write_spec(tmp_path, corpus=_source(tmp_path, kind), top={"flips": ["rope"]})
    runner = CliRunner()
    for where, extra in (("local", ["--workers", "1"]), ("dask", ["--executor", "dask", "--address", cluster])):
        result = runner.invoke(app, ["ablate", str(spec), "--runs-dir", str(tmp_path / where), "--no-report", *extra])
        assert result.exit_code == 0, result.output
    a, b = tmp_path / "local" / "toy", tmp_path / "dask" / "toy"
    names = sorted(d.name for d in a.iterdir() if d.is_dir())
    assert names == sorted(d.name for d in b.iterdir() if d.is_dir()) and len(names) == 4
    for name in names:
        strip = lambda d: [{k: v for k, v in r.items() if k not in runs.TIMING_KEYS} for r in runs.read_metrics(d)]  # noqa: E731
        assert strip(a / name) == strip(b / name), name
        for file in (runs.CONFIG, runs.VOCAB, runs.SAMPLES):
            assert (a / name / file).read_text() == (b / name / file).read_text(), (name, file)
        assert runs.read_summary(b / name)["status"] == runs.COMPLETED


def test_dask_workers_train_a_plugin_part_from_the_code_its_jobs_ship(tmp_path, cluster):
    """The plugin file is gone from this machine (and was never on the workers' folders) once the plan is
    made: each job carries the source it was planned with, and its run records it."""
    from anatomy_cli.sweep.plan import execute, expand, load_spec

    (tmp_path / "parts").mkdir()
    plugin = tmp_path / "parts" / "relu2.py"
    plugin.write_text((Path(__file__).resolve().parents[2] / "examples" / "parts" / "relu2.py").read_text())
    spec = write_spec(tmp_path, top={"flips": ["relu2"], "directions": ["add-one"]},
                      model={"norm_type": "rmsnorm", "norm_pos": "pre", "pos_type": "rope", "ffn_type": "swiglu"})
    spec.write_text(spec.read_text().replace("[base.model]", '[base]\nplugins = ["parts/relu2.py"]\n[base.model]'))
    plan = expand(load_spec(spec))
    text = plugin.read_text()
    plugin.unlink()
    summaries = execute(plan, tmp_path / "dask" / "toy", executor="dask", address=cluster)
    assert [s["status"] for s in summaries] == [runs.COMPLETED, runs.COMPLETED], summaries
    variant = tmp_path / "dask" / "toy" / plan[1].run_id
    assert json.loads((variant / runs.PARTS).read_text())["relu2"]["text"] == text

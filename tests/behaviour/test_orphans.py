"""No spawned process outlives a SIGKILLed command (issue #30, class 4): the calibration worker of
`scale-plan` and of ablate's estimate, `ablate --time`'s timing worker, the sweep workers of
`ablate --workers 2` (killed while they start: the race where a worker read its parent's pid only
after the parent had died), and multiprocessing's resource tracker with them.

Each command starts in its own session; once its spawned child exists it is SIGKILLed (no handler,
no `finally` runs), and every process of that session must then be gone. A failing test kills the
whole group, so it leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import PATIENCE, group_gone, wait_for
from toy_data import write_spec

pytestmark = [pytest.mark.slow, pytest.mark.process,
              pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="reads a process's children from /proc")]

CLI = [sys.executable, "-m", "anatomy_cli"]
NEVER = 10**6  # steps: no run ends before the kill


def group(pgid: int) -> list[str]:
    """'pid ppid command' of each process left in the group (for a failure's message)."""
    left = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) == pgid:
                cmd = (stat.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                left.append(f"{stat.parent.name} ppid={fields[1]} {cmd[:160]}")
    return left


def spawned(pid: int) -> list[int]:
    """The multiprocessing 'spawn' children of `pid` (calibration, timing or sweep workers)."""
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return []
    out = []
    for child in children:
        with contextlib.suppress(OSError):
            if b"multiprocessing.spawn" in Path(f"/proc/{child}/cmdline").read_bytes():
                out.append(int(child))
    return out


# command -> (its arguments (spec, runs dir), spawned children to wait for before the kill)
COMMANDS = {
    "scale-plan-calibrating": (lambda spec, runs: ["scale-plan", spec], 1),
    "ablate-calibrating": (lambda spec, runs: ["ablate", spec, "--runs-dir", runs, "--workers", "1", "--no-report"], 1),
    "ablate-time": (lambda spec, runs: ["ablate", spec, "--runs-dir", runs, "--time", "--time-steps", str(NEVER)], 1),
    # two spawned children: the pool's workers, still starting (the calibration before them has one, joined first)
    "ablate-workers-starting": (lambda spec, runs: ["ablate", spec, "--runs-dir", runs, "--workers", "2",
                                                    "--no-report"], 2),
}


@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_sigkilled_command_leaves_no_process_behind(tmp_path, command):
    build, children = COMMANDS[command]
    spec = write_spec(tmp_path, top={"design": "list", "configs": [{"name": "a"}, {"name": "b"}]},
                      train={"steps": NEVER, "eval_interval": 100, "sample_len": 0})
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(sys.path),
           "ANATOMY_CACHE": str(tmp_path / "cache")}  # nothing cached: scale-plan and ablate calibrate
    err = tmp_path / "stderr.txt"  # a file, not a pipe: orphans writing to a full pipe nobody reads would block
    with open(err, "w") as stderr:
        proc = subprocess.Popen(CLI + build(str(spec), str(tmp_path / "runs")), stdout=subprocess.DEVNULL,
                                stderr=stderr, env=env, cwd=tmp_path,
                                start_new_session=True)  # its own group: every process it starts is in it
    try:
        wait_for(lambda: len(spawned(proc.pid)) >= children or proc.poll() is not None,
                 what=f"{command}'s spawned worker")
        assert proc.poll() is None, err.read_text()
        before = group(proc.pid)
        proc.kill()  # the command only, as the OOM killer would: nothing of it runs again
        proc.wait()
        with contextlib.suppress(AssertionError):  # the assert below names what is left
            wait_for(lambda: group_gone(proc.pid), what="every process of the command gone", timeout=PATIENCE)
        assert group_gone(proc.pid), (f"left running after SIGKILL of {command}:\n" + "\n".join(group(proc.pid))
                                      + "\n\nbefore the kill:\n" + "\n".join(before))
    finally:
        if not group_gone(proc.pid):
            os.killpg(proc.pid, signal.SIGKILL)
        if proc.poll() is None:
            proc.kill()
            proc.wait()


# ------------------------------------------------------------------ the parent-death signal itself

CHILD = """import sys, time
from anatomy_cli.sweep.worker import die_with_parent
print(die_with_parent(int(sys.argv[1])), flush=True)
time.sleep(3600)
"""
MIDDLE = """import os, subprocess, sys, time
subprocess.Popen([sys.executable, "-c", sys.argv[1], str(os.getpid())])
time.sleep(3600)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")
def test_die_with_parent_has_the_kernel_end_a_child_whose_parent_is_sigkilled(tmp_path):
    """No polling thread here: the kernel's signal alone ends the child, asleep in a call."""
    out = tmp_path / "child.txt"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    with open(out, "w") as stdout:
        middle = subprocess.Popen([sys.executable, "-c", MIDDLE, CHILD], stdout=stdout, env=env,
                                  start_new_session=True)
    try:
        wait_for(lambda: out.read_text().strip() or middle.poll() is not None, what="the child armed")
        assert out.read_text().strip() == "True"  # the kernel took the request
        middle.kill()
        middle.wait()
        wait_for(lambda: group_gone(middle.pid), what="the child gone with its parent")
    finally:
        if not group_gone(middle.pid):
            os.killpg(middle.pid, signal.SIGKILL)


def test_die_with_parent_exits_a_child_whose_parent_died_before_it_asked():
    """The race: the parent was gone before the child could ask (the child was re-parented); it
    exits at once instead of computing on. Its real parent is not the pid it names here."""
    not_my_parent = os.getpid() + 10**6  # no process has it
    result = subprocess.run([sys.executable, "-c", CHILD, str(not_my_parent)], capture_output=True, text=True,
                            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}, timeout=PATIENCE)
    assert (result.returncode, result.stdout) == (0, ""), result.stderr

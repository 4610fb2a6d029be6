"""Directory locks under contention: many processes race for one sweep lock from every starting
state (free, stale pid, recycled pid, garbage); exactly one wins each round."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import PATIENCE, wait_for

from anatomy_cli.sweep.plan import SweepLock, SweepLocked

CONTENDER = r"""
import os, sys, time
from pathlib import Path
from anatomy_cli.sweep.plan import SweepLock, SweepLocked

folder, signals, n, rounds = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])

def wait(pred, timeout=float(sys.argv[5])):
    deadline = time.time() + timeout
    while not pred():
        if time.time() > deadline:
            sys.exit("timed out")
        time.sleep(0.001)

(signals / f"ready.{os.getpid()}").write_text("")
for r in range(rounds):
    out = signals / str(r)
    wait((signals / f"go.{r}").exists)
    try:
        with SweepLock(folder):
            (out / f"{os.getpid()}.won").write_text("")
            wait(lambda: len(list(out.glob("*.won"))) + len(list(out.glob("*.lost"))) >= n)  # hold until every contender has tried
    except SweepLocked:
        (out / f"{os.getpid()}.lost").write_text("")
    (out / f"done.{os.getpid()}").write_text("")
"""  # noqa: E501 (the contender script: its comment, as it runs)


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


@pytest.mark.process
def test_processes_racing_for_a_lock_have_exactly_one_winner(tmp_path):
    n, rounds = 6, 24
    folder, signals = tmp_path / "sweep", tmp_path / "signals"
    folder.mkdir()
    signals.mkdir()
    states = {
        "free": None,
        "stale-pid": str(dead_pid()),  # the old format: a bare pid
        "recycled-pid": json.dumps({"pid": os.getpid(), "start": 1, "host": None}),  # live pid, other start
        "garbage": "\x00not a lock",
        "empty": "",
    }
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    args = [sys.executable, "-c", CONTENDER, str(folder), str(signals), str(n), str(rounds), str(PATIENCE)]
    procs = [subprocess.Popen(args, env=env) for _ in range(n)]
    try:
        wait_for(lambda: len(list(signals.glob("ready.*"))) >= n, "every contender ready")
        names = list(states)
        for r in range(rounds):
            state = names[r % len(names)]
            (signals / str(r)).mkdir()
            if states[state] is not None:
                (folder / ".lock").write_text(states[state])
            (signals / f"go.{r}").write_text("")
            wait_for(lambda: len(list((signals / str(r)).glob("done.*"))) >= n, f"round {r} done", poll=0.01)
            won = list((signals / str(r)).glob("*.won"))
            lost = list((signals / str(r)).glob("*.lost"))
            assert (len(won), len(lost)) == (1, n - 1), f"round {r} ({state}): {len(won)} winners"
            assert not (folder / ".lock").exists(), f"round {r}: the winner left its lock"
    finally:
        for p in procs:
            p.kill()
            p.wait()


def test_lock_names_its_owner_with_start_time_and_refuses_while_alive(tmp_path):
    from anatomy_cli.store import lockfile

    with SweepLock(tmp_path):
        owner = lockfile.read_owner(tmp_path / ".lock")
        assert owner == lockfile.identity()
        assert owner["pid"] == os.getpid()
        assert (tmp_path / ".lock").stat().st_mode & 0o777 == 0o644  # other users can see the owner
        if Path("/proc/self/stat").exists():
            assert isinstance(owner["start"], int)
        with pytest.raises(SweepLocked, match=f"in use by pid {os.getpid()}"):
            with SweepLock(tmp_path):
                pass
    assert not (tmp_path / ".lock").exists()
    assert not list(tmp_path.glob(".lock*"))  # no temp files left behind


@pytest.mark.process
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="start times come from /proc")
def test_a_recycled_pid_or_a_zombie_is_not_an_owner(tmp_path):
    from anatomy_cli.store import lockfile

    me = lockfile.identity()
    assert lockfile.alive(me)
    assert not lockfile.alive({**me, "start": me["start"] + 1})  # same pid, another process
    assert not lockfile.alive({"pid": dead_pid()})
    zombie = subprocess.Popen([sys.executable, "-c", "pass"])
    wait_for(lambda: lockfile.start_time(zombie.pid) is None or lockfile._zombie(zombie.pid), "the child's exit",
             poll=0.02)
    assert not lockfile.alive({"pid": zombie.pid})  # exited, not yet reaped
    zombie.wait()
    assert lockfile.alive({**me, "host": "another-host"})  # cannot check: assumed alive


@pytest.mark.parametrize("content", ["", "garbage", "{\"pid\": \"x\"}", "{\"pid\": true}", "[1, 2]", "-5",
                                     "99999999999999999999", "\xff\xfe"])
def test_an_unreadable_lock_is_taken_over(tmp_path, content):
    from anatomy_cli.store import lockfile

    (tmp_path / ".lock").write_text(content)
    with SweepLock(tmp_path):
        assert lockfile.read_owner(tmp_path / ".lock") == lockfile.identity()
    assert not (tmp_path / ".lock").exists()

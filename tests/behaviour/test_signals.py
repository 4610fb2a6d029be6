"""Real processes, real signals: SIGTERM/SIGHUP stop `ablate` and `train` as Ctrl-C does (exit 130,
runs saved and resumable, no worker left behind, lock released); a SIGKILLed run is resumable."""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import PATIENCE, flat, group_gone, wait_for
from toy_data import TINY_MODEL, TINY_TRAIN, write_corpus, write_spec

from anatomy_cli.store import lockfile, runs

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(sys.path)}
CLI = [sys.executable, "-m", "anatomy_cli"]
# The random kill point is drawn from a seed that a failure names, so it can be replayed.
KILL_SEED = int(os.environ.get("ANATOMY_KILL_SEED", random.SystemRandom().randrange(2**32)))
KILL_REPLAY = f"replay with ANATOMY_KILL_SEED={KILL_SEED}"


def raw_status(run_dir: Path) -> str | None:
    summary = runs.read_summary(run_dir)
    return summary.get("status") if summary else None


def steps(run_dir: Path) -> list[int]:
    return [r["step"] for r in runs.read_metrics(run_dir)]


def timings(run_dir: Path, upto: int) -> list[float]:
    """elapsed_s of the evaluations up to a step: a run trained again from step 0 would rewrite them."""
    return [r["elapsed_s"] for r in runs.read_metrics(run_dir) if "elapsed_s" in r and r["step"] <= upto]


def in_flight(sweep: Path, n: int) -> bool:
    """n runs have trained a few steps and are still going."""
    dirs = [d for d in sweep.glob("*/") if runs.run_status(d) == runs.RUNNING and len(runs.read_metrics(d)) > 3]
    return len(dirs) >= n


@pytest.mark.slow
@pytest.mark.process
@pytest.mark.parametrize("sig,workers", [(signal.SIGTERM, 2), (signal.SIGHUP, 1)],
                         ids=["sigterm-pool", "sighup-inline"])
def test_signal_stops_a_sweep_like_ctrl_c(tmp_path, sig, workers):
    n_steps = 1000  # long enough that a loaded machine cannot finish both runs before we see them in flight
    spec = write_spec(tmp_path, top={"design": "list", "configs": [{"name": f"c{i}"} for i in range(2)]},
                      train={"steps": n_steps, "eval_interval": 100, "sample_len": 0})
    cmd = CLI + ["ablate", str(spec), "--runs-dir", str(tmp_path / "runs"), "--workers", str(workers), "--no-report"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV,
                            start_new_session=True)  # its own process group: we can see every child
    sweep = tmp_path / "runs" / "toy"
    try:
        wait_for(lambda: in_flight(sweep, workers) or proc.poll() is not None, what="runs in flight")
        assert proc.poll() is None, proc.communicate()[1]
        proc.send_signal(sig)  # to the sweep process only, as `kill` or a service manager would
        out, err = proc.communicate(timeout=PATIENCE)
        assert proc.returncode == 130, err
        assert "rerun the same command to resume" in flat(err) and "Traceback" not in err
        wait_for(lambda: group_gone(proc.pid), what="every worker exited")
    finally:
        if not group_gone(proc.pid):
            os.killpg(proc.pid, signal.SIGKILL)
    assert not (sweep / ".lock").exists()
    dirs = [d for d in sweep.iterdir() if d.is_dir()]
    statuses = [raw_status(d) for d in dirs]
    assert runs.RUNNING not in statuses
    stopped = [d for d in dirs if raw_status(d) == runs.INTERRUPTED]
    assert len(stopped) >= workers
    for d in stopped:  # saved at the step it stopped: continued, not restarted, by the rerun
        assert (d / runs.RESUME).is_file() and steps(d)[-1] == runs.read_summary(d)["steps_done"] < n_steps
    rerun = subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=PATIENCE)
    assert rerun.returncode == 0, rerun.stderr
    dirs = [d for d in sweep.iterdir() if d.is_dir()]
    assert len(dirs) == 2 and all(raw_status(d) == runs.COMPLETED for d in dirs)
    for d in dirs:
        assert steps(d) == list(range(n_steps + 1)), d.name


def train_cmd(tmp_path: Path, out: Path, n_steps: int = 200, **train) -> list[str]:
    corpus = write_corpus(tmp_path)
    sets = [f"--set=data.source={json.dumps(str(corpus))}"]
    sets += [f"--set=model.{k}={json.dumps(v)}" for k, v in TINY_MODEL.items()]
    train = {**TINY_TRAIN, "steps": n_steps, "eval_interval": 100, "sample_len": 0, **train}
    sets += [f"--set=train.{k}={json.dumps(v)}" for k, v in train.items() if v is not None]
    return CLI + ["train", *sets, "--out", str(out)]


@pytest.mark.slow
@pytest.mark.process
def test_sigterm_saves_a_training_run_and_resume_finishes_it(tmp_path):
    run = tmp_path / "run"
    proc = subprocess.Popen(train_cmd(tmp_path, run), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=ENV)
    wait_for(lambda: len(runs.read_metrics(run)) > 20 or proc.poll() is not None, what="training under way")
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=PATIENCE)
    assert proc.returncode == 130, err
    assert f"resume with: anatomy train --resume {run}" in flat(err)
    summary = runs.read_summary(run)
    assert summary["status"] == runs.INTERRUPTED and (run / runs.RESUME).is_file()
    assert not (run / ".lock").exists()
    resumed = subprocess.run(CLI + ["train", "--resume", str(run)], capture_output=True, text=True, env=ENV,
                             timeout=PATIENCE)
    assert resumed.returncode == 0, resumed.stderr
    assert raw_status(run) == runs.COMPLETED and steps(run) == list(range(201))


@pytest.mark.slow
@pytest.mark.process
def test_sigkilled_run_is_resumable_from_scratch(tmp_path):
    run = tmp_path / "run"
    never = 10**6  # no checkpoint before the kill, however late it lands
    proc = subprocess.Popen(train_cmd(tmp_path, run, checkpoint_every=never), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env=ENV)
    wait_for(lambda: len(runs.read_metrics(run)) > 20 or proc.poll() is not None, what="training under way")
    proc.kill()
    proc.wait()
    summary = runs.read_summary(run)
    assert summary["status"] == runs.RUNNING and summary["owner"]["pid"] == proc.pid  # what the file says
    assert runs.run_status(run) == runs.INTERRUPTED  # what it means: its owner is dead
    resumed = subprocess.run(CLI + ["train", "--resume", str(run)], capture_output=True, text=True, env=ENV,
                             timeout=PATIENCE)
    assert resumed.returncode == 0, resumed.stderr
    assert "training it again from step 0" in flat(resumed.stderr)
    assert raw_status(run) == runs.COMPLETED and steps(run) == list(range(201))


@pytest.mark.slow
@pytest.mark.process
@pytest.mark.parametrize("every", [None, 3], ids=["at-evals", "every-3-steps"])
def test_sigkill_at_a_random_step_loses_at_most_one_interval(tmp_path, every):
    """SIGKILL (what an OOM kill or a preemption does) once a random number of metric lines is on
    disk: the resumed run continues from the last checkpoint and ends with an uninterrupted run's
    metrics, lines written after that checkpoint included, bit for bit."""
    n_steps, eval_interval = 400, 20
    opts = {"eval_interval": eval_interval, "log_interval": 1, "threads": 1, "checkpoint_every": every}
    lines = random.Random(KILL_SEED).randrange(2 * eval_interval + 5, 300)  # > 2 evals: a checkpoint exists
    print(f"killing at {lines} metric lines: {KILL_REPLAY}")
    run = tmp_path / "run"
    proc = subprocess.Popen(train_cmd(tmp_path, run, n_steps, **opts), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env=ENV)
    wait_for(lambda: len(runs.read_metrics(run)) >= lines or proc.poll() is not None, what=f"{lines} metric lines")
    proc.kill()
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, f"finished before the kill ({lines} lines; {KILL_REPLAY})"
    assert runs.run_status(run) == runs.INTERRUPTED
    from anatomy_cli.training.checkpoint import load_checkpoint

    saved = load_checkpoint(run / runs.RESUME)["step"]
    written = steps(run)[-1]
    assert eval_interval <= saved <= written, (saved, written, lines, KILL_REPLAY)
    before = timings(run, saved)
    resumed = subprocess.run(CLI + ["train", "--resume", str(run)], capture_output=True, text=True, env=ENV,
                             timeout=PATIENCE)
    assert resumed.returncode == 0, resumed.stderr
    assert timings(run, saved) == before  # continued from the checkpoint, not trained again
    straight = tmp_path / "straight"
    whole = subprocess.run(train_cmd(tmp_path, straight, n_steps, **opts), capture_output=True, text=True, env=ENV,
                           timeout=PATIENCE)
    assert whole.returncode == 0, whole.stderr

    def strip(d):
        return [{k: v for k, v in r.items() if k not in runs.TIMING_KEYS} for r in runs.read_metrics(d)]

    assert strip(run) == strip(straight), (saved, written, lines, KILL_REPLAY)
    a, b = runs.read_summary(run), runs.read_summary(straight)
    assert (a["best_val_loss"], a["best_step"], a["status"]) == (b["best_val_loss"], b["best_step"], runs.COMPLETED)
    assert not (run / runs.RESUME).exists() and not list(run.glob(".*.tmp"))


@pytest.mark.slow
@pytest.mark.process
def test_ctrl_c_twice_aborts_but_leaves_the_run_resumable(tmp_path):
    run = tmp_path / "run"
    proc = subprocess.Popen(train_cmd(tmp_path, run), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=ENV)
    wait_for(lambda: len(runs.read_metrics(run)) > 20 or proc.poll() is not None, what="training under way")
    proc.send_signal(signal.SIGINT)  # wherever each lands (or if the two merge), the run is left resumable
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=PATIENCE)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and f"anatomy train --resume {run}" in flat(err)
    assert raw_status(run) == runs.INTERRUPTED  # never 'running'
    resumed = subprocess.run(CLI + ["train", "--resume", str(run)], capture_output=True, text=True, env=ENV,
                             timeout=PATIENCE)
    assert resumed.returncode == 0, resumed.stderr
    assert steps(run) == list(range(201))


@pytest.mark.slow
@pytest.mark.process
def test_sigkilled_sweep_parent_does_not_orphan_its_workers(tmp_path):
    spec = write_spec(tmp_path, top={"design": "list", "configs": [{"name": f"c{i}"} for i in range(2)]},
                      train={"steps": 1000, "eval_interval": 100, "sample_len": 0})  # not done before seen
    cmd = CLI + ["ablate", str(spec), "--runs-dir", str(tmp_path / "runs"), "--workers", "2", "--no-report"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=ENV, start_new_session=True)
    sweep = tmp_path / "runs" / "toy"
    try:
        wait_for(lambda: in_flight(sweep, 2) or proc.poll() is not None, what="runs in flight")
        assert proc.poll() is None, "the sweep finished before its runs were seen in flight"
        proc.kill()  # the parent only: its workers notice and stop at their next step
        proc.wait()
        wait_for(lambda: group_gone(proc.pid), what="every worker exited")
    finally:
        if not group_gone(proc.pid):
            os.killpg(proc.pid, signal.SIGKILL)
    dirs = [d for d in sweep.iterdir() if d.is_dir()]
    assert [raw_status(d) for d in dirs] == [runs.INTERRUPTED] * 2
    assert lockfile.read_owner(sweep / ".lock")["pid"] == proc.pid  # stale: the next sweep takes it over
    rerun = subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=PATIENCE)
    assert rerun.returncode == 0, rerun.stderr
    assert all(steps(d) == list(range(1001)) for d in dirs)


@pytest.mark.slow
@pytest.mark.process
def test_a_sweep_worker_killed_under_its_run_leaves_it_resumable(tmp_path):
    """The OOM killer (or a SIGKILL) takes one worker: the sweep ends (exit 1) naming the run
    interrupted, and a rerun continues it from its last checkpoint."""
    spec = write_spec(tmp_path, top={"design": "list", "configs": [{"name": f"c{i}"} for i in range(2)]},
                      train={"steps": 1000, "eval_interval": 50, "sample_len": 0})
    cmd = CLI + ["ablate", str(spec), "--runs-dir", str(tmp_path / "runs"), "--workers", "2", "--no-report"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV,
                            start_new_session=True)
    sweep = tmp_path / "runs" / "toy"

    def checkpointed() -> Path | None:
        return next((d for d in sweep.glob("*/") if runs.run_status(d) == runs.RUNNING
                     and (d / runs.RESUME).is_file() and len(runs.read_metrics(d)) > 120), None)

    try:
        wait_for(lambda: checkpointed() or proc.poll() is not None, what="a run with a checkpoint")
        victim = checkpointed()
        assert victim is not None, proc.communicate()[1]
        os.kill(runs.read_summary(victim)["owner"]["pid"], signal.SIGKILL)
        out, err = proc.communicate(timeout=PATIENCE)
        wait_for(lambda: group_gone(proc.pid), what="every worker exited")
    finally:
        if not group_gone(proc.pid):
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 1, err
    assert "interrupted (rerun to resume)" in flat(err) and "Traceback" not in err  # the status line is on stderr
    summary = runs.read_summary(victim)
    assert summary["status"] == runs.INTERRUPTED and "worker process died" in summary["error"]
    from anatomy_cli.training.checkpoint import load_checkpoint

    saved = load_checkpoint(victim / runs.RESUME)["step"]
    before = timings(victim, saved)
    rerun = subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=PATIENCE)
    assert rerun.returncode == 0, rerun.stderr
    assert raw_status(victim) == runs.COMPLETED and steps(victim) == list(range(1001))
    assert timings(victim, saved) == before  # resumed at its checkpoint, not trained again


@pytest.mark.slow
@pytest.mark.process
def test_two_ablates_started_at_the_same_instant_one_runs_one_exits_3(tmp_path):
    spec = write_spec(tmp_path, top={"design": "list", "configs": [{"name": "a"}]},
                      train={"steps": 30, "eval_interval": 10, "sample_len": 0})
    for attempt in range(2):
        runs_dir = tmp_path / f"runs{attempt}"
        cmd = CLI + ["ablate", str(spec), "--runs-dir", str(runs_dir), "--workers", "1", "--no-report"]
        procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
                 for _ in range(2)]
        results = [(p.wait(timeout=PATIENCE), p.communicate()[1]) for p in procs]
        codes = sorted(code for code, _ in results)
        assert codes == [0, 3], results
        loser = next(err for code, err in results if code == 3)
        assert "is in use by pid" in flat(loser) and "Traceback" not in loser
        (run,) = [d for d in (runs_dir / "toy").iterdir() if d.is_dir()]
        assert steps(run) == list(range(31))  # trained once, not twice into one file


# ------------------------------------------------------------------ every long command, every signal


def handlers_installed(pid: int) -> bool:
    """The command has entered its body: it catches SIGTERM and SIGHUP (Python alone catches SIGINT
    only), read from the process's caught-signal mask."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    caught = int(next(line.split()[1] for line in status.splitlines() if line.startswith("SigCgt:")), 16)
    return all(caught >> (sig - 1) & 1 for sig in (signal.SIGTERM, signal.SIGHUP))


def spawned_child(pid: int) -> bool:
    """A multiprocessing 'spawn' worker of `pid` is running (the timing pass's worker)."""
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return False
    for child in children:
        with contextlib.suppress(OSError):
            if b"multiprocessing.spawn" in Path(f"/proc/{child}/cmdline").read_bytes():
                return True
    return False


@pytest.fixture(scope="module")
def long_inputs(tmp_path_factory) -> Path:
    """What each long command needs: a trained 2017 run and a LLaMA-shaped one, a spec whose runs
    never end, a baseline, and an 8 GB sparse corpus of NULs (valid UTF-8, no disk used)."""
    root = tmp_path_factory.mktemp("long")
    for name, extra in (("run17", []), ("runll", ["--set=model.norm_type=rmsnorm", "--set=model.norm_pos=pre",
                                                  "--set=model.pos_type=rope", "--set=model.ffn_type=swiglu"])):
        cmd = train_cmd(root, root / name, n_steps=12)[len(CLI):] + extra
        result = subprocess.run(CLI + cmd, capture_output=True, text=True, env=ENV, timeout=PATIENCE)
        assert result.returncode == 0, result.stderr
    write_spec(root, top={"design": "list", "configs": [{"name": "a"}]},
               train={"steps": 10**6, "eval_interval": 100, "sample_len": 0})
    (root / "baseline.json").write_text('{"configs": {"a": {"best_val_loss": 3.0}}}')
    with open(root / "huge.txt", "wb") as f:
        f.truncate(8 << 30)
    return root


def fifo_copy(run: Path, dest: Path, name: str) -> Path:
    """A copy of `run` at `dest` whose `name` is a FIFO no one writes: reading it blocks until interrupted."""
    copy = shutil.copytree(run, dest)
    (copy / name).unlink()
    os.mkfifo(copy / name)
    return copy


# command -> (args builder(inputs, tmp), the state to wait for, if not handlers_installed)
LONG = {
    "train": (lambda i, t: train_cmd(t, t / "run", n_steps=10**6)[len(CLI):],
              lambda t, pid: len(runs.read_metrics(t / "run")) > 3),
    "ablate": (lambda i, t: ["ablate", str(i / "toy.toml"), "--runs-dir", str(t / "runs"), "--workers", "1"],
               lambda t, pid: in_flight(t / "runs" / "toy", 1)),
    "ablate-time": (lambda i, t: ["ablate", str(i / "toy.toml"), "--runs-dir", str(t / "runs"), "--time",
                                  "--time-steps", str(10**6)], lambda t, pid: spawned_child(pid)),
    "check": (lambda i, t: ["check", str(i / "toy.toml"), "--baseline", str(i / "baseline.json"), "--runs-dir",
                            str(t / "runs"), "--workers", "1"], lambda t, pid: in_flight(t / "runs" / "toy", 1)),
    "eval": (lambda i, t: ["eval", str(shutil.copytree(i / "run17", t / "run")), "--ctx", "16",
                           "--batches", "20000"], None),
    "sample": (lambda i, t: ["sample", str(i / "runll"), "--max-new", str(10**8)], None),
    "bench-decode": (lambda i, t: ["bench-decode", "--new", str(10**6), "--prefix-len", "8"], None),
    "report": (lambda i, t: ["report", str(fifo_copy(i / "run17", t / "sweep" / "r", runs.METRICS).parent)], None),
    "stability": (lambda i, t: ["stability", str(fifo_copy(i / "run17", t / "sweep" / "r", runs.METRICS).parent)],
                  None),
    "export": (lambda i, t: ["export", str(fifo_copy(i / "runll", t / "run", runs.CONFIG)), str(t / "hf")], None),
    "prepare": (lambda i, t: ["prepare", str(i / "huge.txt"), "--out", str(t / "prepared")], None),
}


@pytest.mark.slow
@pytest.mark.process
@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads the caught-signal mask from /proc")
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP], ids=["sigint", "sigterm", "sighup"])
@pytest.mark.parametrize("command", list(LONG))
def test_every_long_command_stops_on_each_signal(long_inputs, tmp_path, command, sig):
    """Mid-command, SIGINT, SIGTERM and SIGHUP all end it like Ctrl-C: exit 130, one line, no worker
    left running, no lock held, no temp file left behind."""
    build, state = LONG[command]
    work = tmp_path / "work"
    work.mkdir()
    proc = subprocess.Popen(CLI + build(long_inputs, work), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, env=ENV, cwd=work, start_new_session=True)
    try:
        wait_for(lambda: (handlers_installed(proc.pid) and (state is None or state(work, proc.pid)))
                 or proc.poll() is not None, what=f"{command} under way")
        assert proc.poll() is None, proc.communicate()[1]
        proc.send_signal(sig)  # to the command only, as `kill` or a service manager would
        _, err = proc.communicate(timeout=PATIENCE)
        assert proc.returncode == 130, err
        assert "interrupted" in err and "Traceback" not in err and "internal error" not in err, err
        wait_for(lambda: group_gone(proc.pid), what="every worker exited")
    finally:
        if not group_gone(proc.pid):
            os.killpg(proc.pid, signal.SIGKILL)
    left = [p for p in work.rglob("*") if p.name == ".lock" or p.name.endswith(".tmp")]
    assert not left, left
    if command == "train":
        assert raw_status(work / "run") == runs.INTERRUPTED


@pytest.mark.slow
@pytest.mark.process
@pytest.mark.parametrize("command", ["ablate", "check"])
def test_a_sigkilled_parent_leaves_no_worker_and_no_tracker_warning(tmp_path, command):
    """SIGKILL of the parent mid-run (two workers: a pool, whose queues hold semaphores): its workers exit, and
    multiprocessing's resource tracker, which outlives it and unlinks those semaphores, says nothing on the
    terminal (it said '13 leaked semaphore objects to clean up at shutdown')."""
    spec = write_spec(tmp_path, top={"design": "list", "configs": [{"name": f"c{i}"} for i in range(2)]},
                      train={"steps": 10**6, "eval_interval": 100, "sample_len": 0})
    (tmp_path / "baseline.json").write_text('{"configs": {"c0": {"best_val_loss": 3.0}, "c1": {"best_val_loss": 3.0}}}')
    tail = ["--baseline", str(tmp_path / "baseline.json")] if command == "check" else []
    proc = subprocess.Popen(CLI + [command, str(spec), *tail, "--runs-dir", str(tmp_path / "runs"), "--workers", "2"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=ENV,
                            start_new_session=True)
    try:
        wait_for(lambda: in_flight(tmp_path / "runs" / "toy", 2) or proc.poll() is not None,
                 what=f"{command} under way")
        assert proc.poll() is None, proc.communicate()[1]
        proc.kill()
        _, err = proc.communicate(timeout=PATIENCE)  # until every process holding stderr (the tracker too) is gone
        assert proc.returncode == -signal.SIGKILL
        assert "leaked" not in err and "Traceback" not in err, err
        wait_for(lambda: group_gone(proc.pid), what="every worker exited")
    finally:
        if not group_gone(proc.pid):
            os.killpg(proc.pid, signal.SIGKILL)


def test_a_second_signal_after_the_run_saved_still_says_how_to_resume(tmp_path, monkeypatch):
    """The flake of the Ctrl-C-twice test, made deterministic: the second signal lands after the run
    has saved and the graceful stop is over (here: while the CLI prints 'interrupted at step ...').
    The run was started, so the hint is printed all the same."""
    from typer.testing import CliRunner

    from anatomy_cli.cli import app as cli_app
    from anatomy_cli.cli.main import app
    from anatomy_cli.training import run as training

    real = training.train
    monkeypatch.setattr(training, "train", lambda *a, **k: real(*a, **{**k, "stop": lambda: True}))  # stop after 1 step
    landed = []
    printer = cli_app.err_console.print

    def second_signal(*args, **kwargs):
        if not landed and args and "interrupted at step" in str(args[0]):
            landed.append(args[0])
            raise KeyboardInterrupt
        return printer(*args, **kwargs)

    monkeypatch.setattr(cli_app.err_console, "print", second_signal)
    run = tmp_path / "run"
    result = CliRunner().invoke(app, train_cmd(tmp_path, run)[len(CLI):])
    assert landed and result.exit_code == 130, result.output
    assert raw_status(run) == runs.INTERRUPTED
    assert f"error: interrupted; resume with: anatomy train --resume {run}" in flat(result.output)


# A command that interrupts itself at a chosen point: inside code run by exec() (as the __init__ of a
# dataclass being defined is), or inside a descriptor's __set_name__ (a class being defined).
PROBE = '''
import os, signal, sys, time
from anatomy_cli.cli.app import app, handle_errors
from anatomy_cli.cli.main import main


class Interrupts:
    def __set_name__(self, owner, name):
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(60)


@app.command("probe-interrupt")
@handle_errors
def probe(where: str):
    if where == "exec":
        exec("import os, signal, time; os.kill(os.getpid(), signal.SIGINT); time.sleep(60)")
    else:
        type("Defined", (), {"field": Interrupts()})


main()
'''


@pytest.mark.process
@pytest.mark.parametrize("where", ["exec", "set-name"])
def test_an_interrupt_inside_a_class_definition_or_exec_still_exits_130(tmp_path, where):
    """The CI flake of prepare-sigint, made deterministic: the signal landed while a lazy import defined
    a dataclass. Python then ended `python -m anatomy_cli` by SIGINT (-2) instead of exit 130, having
    remembered an interrupt inside exec'd code; in __set_name__ it became 'internal error: RuntimeError'."""
    (tmp_path / "probe_cli.py").write_text(PROBE)
    env = {**ENV, "PYTHONPATH": os.pathsep.join([str(tmp_path), ENV["PYTHONPATH"]])}
    result = subprocess.run([sys.executable, "-m", "probe_cli", "probe-interrupt", where], capture_output=True,
                            text=True, env=env, timeout=PATIENCE)
    assert result.returncode == 130, result.stderr
    assert result.stderr == "error: interrupted\n", result.stderr

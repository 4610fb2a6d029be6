"""Sweeps: expansion of specs into plans, execution, resume after a kill, parallel == sequential,
divergence handling and the sweep lock."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import PATIENCE, wait_for
from toy_data import write_spec

from anatomy_cli.spec.components import FIVE as FLIPS
from anatomy_cli.spec.components import label, on_names
from anatomy_cli.spec.config import AblationSpec, ConfigError, validate
from anatomy_cli.store import runs
from anatomy_cli.sweep.plan import SweepLock, SweepLocked, execute, expand


def spec(**kw) -> AblationSpec:
    return validate(AblationSpec, {"name": "t", **kw})


# ----------------------------------------------------------------------------- expansion


def test_one_at_a_time_gives_12_distinct_configs():
    plan = expand(spec())
    assert len(plan) == 12
    assert len({p.run_id for p in plan}) == 12
    labels = [label(p.config) for p in plan]
    assert labels[0] == "2017" and "llama" in labels
    assert {p.flip for p in plan if p.role == "add-one"} == set(FLIPS)
    assert {p.flip for p in plan if p.role == "remove-one"} == set(FLIPS)
    for p in plan:  # each add-one run has exactly its flip; each remove-one all but its flip
        if p.role == "add-one":
            assert on_names(p.config) == (p.flip,)
        if p.role == "remove-one":
            assert set(on_names(p.config)) == set(FLIPS) - {p.flip}


def test_factorial_gives_32_and_flip_filter_restricts():
    assert len(expand(spec(design="factorial"))) == 32
    plan = expand(spec(only=["rope", "swiglu"]))  # --flip rope,swiglu
    assert len(plan) == 6
    assert {p.flip for p in plan if p.flip} == {"rope", "swiglu"}


def test_gqa_flip_uses_spec_kv_heads_default_half():
    def add_gqa(s):
        return next(p for p in expand(s) if p.role == "add-one" and p.flip == "gqa")

    assert add_gqa(spec()).config.model.n_kv_head == 2
    assert add_gqa(spec(gqa_kv_head=1)).config.model.n_kv_head == 1
    with pytest.raises(ConfigError, match=r"2017\+gqa: planned \(add-one\) with gqa on, but model.n_kv_head=4"):
        expand(spec(gqa_kv_head=4))


def test_ids_are_stable_and_depend_on_config():
    a, b = expand(spec(seeds=2)), expand(spec(seeds=2))
    assert [p.run_id for p in a] == [p.run_id for p in b]
    c = expand(spec(seeds=2, base={"train": {"steps": 7}}))  # --steps 7
    assert not {p.run_id for p in a} & {p.run_id for p in c}


def test_seeds_and_axes_are_crossed():
    plan = expand(spec(seeds=[1, 2, 3], axes={"n_layer": [1, 2], "train.warmup": [0, 10]}))
    assert len(plan) == 12 * 3 * 2 * 2
    assert {p.config.model.n_layer for p in plan} == {1, 2}
    assert {p.config.train.warmup for p in plan} == {0, 10}


def test_list_design():
    s = spec(design="list", configs=[{"name": "a"}, {"name": "b", "set": {"model.pos_type": "rope"}}])
    plan = expand(s)
    assert [p.slug for p in plan] == ["a", "b"] and plan[1].config.model.pos_type == "rope"


def test_invalid_combinations_are_reported_before_any_run():
    s = spec(axes={"n_kv_head": [3]})  # 4 % 3 != 0 for every config
    with pytest.raises(ConfigError, match="n_kv_head=3 must divide n_head=4"):
        expand(s)
    with pytest.raises(ConfigError, match=r"only \(--flip\): unknown component\(s\) bogus"):
        expand(spec(only=["rope", "bogus"]))
    with pytest.raises(ConfigError, match="not a model or train field"):
        expand(spec(axes={"nonsense": [1]}))


# ----------------------------------------------------------------------------- execution


def metrics_without_time(run_dir: Path) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in runs.TIMING_KEYS} for r in runs.read_metrics(run_dir)]


def load(path: Path) -> AblationSpec:
    from anatomy_cli.sweep.plan import load_spec

    return load_spec(path)


@pytest.mark.slow
@pytest.mark.process
def test_workers_2_equal_workers_1(tmp_path):
    s = load(write_spec(tmp_path, top={"flips": ["rope", "gqa"], "seeds": 1}))
    plan = expand(s)
    execute(plan, tmp_path / "one", workers=1)
    execute(plan, tmp_path / "two", workers=2)
    for p in plan:
        a, b = tmp_path / "one" / p.run_id, tmp_path / "two" / p.run_id
        assert runs.read_summary(a)["status"] == runs.COMPLETED
        assert metrics_without_time(a) == metrics_without_time(b), p.run_id


def test_diverged_run_is_recorded_and_sweep_goes_on(tmp_path):
    s = load(write_spec(tmp_path, top={"design": "list", "configs": [
        {"name": "ok"}, {"name": "boom", "set": {"train.lr": 1e6, "train.grad_clip": 0.0}}]},
        train={"steps": 30, "eval_interval": 10}))
    summaries = execute(expand(s), tmp_path / "runs", workers=1)
    by = {x["run_id"].split("-s")[0]: x for x in summaries}
    assert by["ok"]["status"] == runs.COMPLETED
    assert by["boom"]["status"] == runs.DIVERGED
    assert by["boom"]["error"] == f"diverged at step {by['boom']['diverged_at']}"
    # rerunning skips both: a diverged run is a result
    assert {x["run_id"] for x in execute(expand(s), tmp_path / "runs")} == {x["run_id"] for x in summaries}


@pytest.mark.slow
@pytest.mark.process
def test_plan_estimates_come_from_a_cached_calibration(tmp_path, monkeypatch):
    from anatomy_cli.sweep import calibrate
    from anatomy_cli.sweep.plan import check_data, plan_estimate

    monkeypatch.setenv("ANATOMY_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(calibrate, "busy", lambda: None)  # cache even on a loaded test machine
    s = load(write_spec(tmp_path, top={"design": "list", "configs": [{"name": "a"}, {"name": "b", "set": {
        "train.steps": 24}}]}))
    plan = expand(s)
    per_run, startup = plan_estimate(plan, 1, check_data(plan))
    cache = json.loads((tmp_path / "cache" / "calibration.json").read_text())
    assert len(cache) == 1  # one shape class: the two configs differ only in steps
    cal = next(iter(cache.values()))
    assert cal["step_s"] > 0 and cal["eval_s"] > 0 and startup > 0
    a, b = (per_run[p.run_id] for p in plan)
    assert b - a == pytest.approx(12 * cal["step_s"] + 2 * cal["eval_s"])  # 12 more steps, 2 more evaluations
    (tmp_path / "cache" / "calibration.json").write_text(json.dumps({k: v | {"step_s": 1.0} for k, v in cache.items()}))
    again, _ = plan_estimate(plan, 1, check_data(plan))  # read from the cache, not measured again
    assert again[plan[1].run_id] - again[plan[0].run_id] == pytest.approx(12.0 + 2 * cal["eval_s"])
    assert calibrate.plan_seconds([5.0, 4.0, 3.0, 3.0], 2, 1.0) == 9.0  # 5+3 | 4+3 onto 2 workers, + start-up


def test_completed_runs_are_skipped_and_failed_rerun(tmp_path):
    s = load(write_spec(tmp_path, top={"design": "list", "configs": [{"name": "a"}, {"name": "b"}]}))
    plan = expand(s)
    execute(plan, tmp_path / "r")
    done = tmp_path / "r" / plan[0].run_id
    before = (done / runs.SUMMARY).read_text()
    failed = tmp_path / "r" / plan[1].run_id
    runs.atomic_write_json(failed / runs.SUMMARY, {"status": runs.FAILED})
    events = []
    execute(plan, tmp_path / "r", on_event=events.append)
    assert [e["run_id"] for e in events if e["event"] == "start"] == [plan[1].run_id]
    assert (done / runs.SUMMARY).read_text() == before
    assert runs.read_summary(failed)["status"] == runs.COMPLETED


@pytest.mark.process
def test_lock_refuses_a_live_holder_and_takes_over_a_stale_one(tmp_path):
    (tmp_path / ".lock").write_text(str(os.getpid()))
    with pytest.raises(SweepLocked, match=f"pid {os.getpid()}"):
        with SweepLock(tmp_path):
            pass
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (tmp_path / ".lock").write_text(str(dead.pid))
    with SweepLock(tmp_path):
        assert json.loads((tmp_path / ".lock").read_text())["pid"] == os.getpid()
    assert not (tmp_path / ".lock").exists()


@pytest.mark.slow
@pytest.mark.process
def test_sigkill_mid_sweep_then_rerun_completes_without_retraining(tmp_path):
    # c1 lasts 240 steps, so "c0 done and c1 under way" holds for seconds, not a poll's worth of
    # time, before the test kills the sweep in that state
    configs = [{"name": f"c{i}", "set": {"train.steps": 240 if i == 1 else 80}} for i in range(4)]
    spec_path = write_spec(tmp_path, top={"design": "list", "configs": configs},
                           train={"steps": 80, "eval_interval": 40})
    runs_dir = tmp_path / "runs"
    cmd = [sys.executable, "-m", "anatomy_cli", "ablate", str(spec_path), "--runs-dir", str(runs_dir),
           "--workers", "1", "--no-report"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
                            start_new_session=True)
    sweep = runs_dir / "toy"
    def one_done_next_under_way() -> bool:
        assert proc.poll() is None, "the sweep ended before c0 was done and c1 under way"
        states = [runs.run_status(d) for d in sweep.glob("*/")] if sweep.exists() else []
        return states.count(runs.COMPLETED) >= 1 and runs.RUNNING in states

    wait_for(one_done_next_under_way, "c0 done and c1 under way")
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    finished = {d.name: (d / runs.SUMMARY).read_text() for d in sweep.iterdir()
                if runs.run_status(d) == runs.COMPLETED}
    assert finished and len(finished) < 4
    rerun = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=PATIENCE)
    assert rerun.returncode == 0, rerun.stderr
    dirs = [d for d in sweep.iterdir() if d.is_dir()]
    assert len(dirs) == 4  # complete, no duplicates
    assert all(runs.run_status(d) == runs.COMPLETED for d in dirs)
    for name, text in finished.items():  # not retrained
        assert (sweep / name / runs.SUMMARY).read_text() == text
    for d in dirs:  # each run's metrics hold every step exactly once
        steps = [r["step"] for r in runs.read_metrics(d)]
        assert steps == list(range(0, runs.read_config(d)["train"]["steps"] + 1))
    assert not (sweep / ".lock").exists()


@pytest.mark.slow
@pytest.mark.process
def test_two_concurrent_ablates_leave_exactly_one_running(tmp_path):
    """The second sweep meets the first one holding the lock with a run in flight (a run that cannot
    finish before it is stopped, so the outcome cannot depend on timing): it exits 3 naming the
    owner and touches nothing; the first carries on, then stops on Ctrl-C with the lock released."""
    spec_path = write_spec(tmp_path, top={"design": "list", "configs": [{"name": "a"}]},
                           train={"steps": 10**6, "eval_interval": 100, "sample_len": 0})
    cmd = [sys.executable, "-m", "anatomy_cli", "ablate", str(spec_path), "--runs-dir", str(tmp_path / "runs"),
           "--workers", "1", "--no-report"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    first = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    sweep = tmp_path / "runs" / "toy"
    try:
        wait_for(lambda: any(len(runs.read_metrics(d)) > 3 for d in sweep.glob("*/")) or first.poll() is not None,
                 "the first sweep's run under way")
        (run,) = [d for d in sweep.iterdir() if d.is_dir()]
        second = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=PATIENCE)
        assert second.returncode == 3, second.stderr
        assert f"is in use by pid {first.pid}" in second.stderr and "Traceback" not in second.stderr
        assert first.poll() is None  # the first one was not disturbed
        assert runs.read_summary(run)["owner"]["pid"] == first.pid and runs.run_status(run) == runs.RUNNING
    finally:
        first.send_signal(signal.SIGINT)
        _, err = first.communicate(timeout=PATIENCE)
    assert first.returncode == 130, err
    assert [d.name for d in sweep.iterdir() if d.is_dir()] == [run.name]
    assert runs.run_status(run) == runs.INTERRUPTED and not (sweep / ".lock").exists()


def test_a_busy_calibration_is_cached_as_busy_and_redone_when_idle(tmp_path, monkeypatch):
    from anatomy_cli.sweep import calibrate

    monkeypatch.setenv("ANATOMY_CACHE", str(tmp_path))
    measured = []
    monkeypatch.setattr(calibrate, "_measure", lambda configs, threads: measured.append(len(configs)) or [
        {"step_s": 0.01, "eval_s": 0.1, "run_s": 1.0, "startup_s": 2.0} for _ in configs])
    monkeypatch.setattr(calibrate, "busy", lambda: (9.0, 2))
    assert calibrate.calibrations({"k": None}, 1)["k"]["busy"] is True
    calibrate.calibrations({"k": None}, 1)  # still busy: the busy one is used, not measured again
    assert measured == [1]
    monkeypatch.setattr(calibrate, "busy", lambda: None)
    assert calibrate.calibrations({"k": None}, 1)["k"]["busy"] is False and measured == [1, 1]
    calibrate.calibrations({"k": None}, 1)
    assert measured == [1, 1]


def test_a_calibration_reads_steps_and_evaluations_from_the_trainers_own_clock(tmp_path, monkeypatch):
    """step_s, eval_s and run_s come from one run's train time and loop time, after a warm-up run:
    never from the difference of two short runs, which came out negative on a worker's first shape."""
    import anatomy_cli.training.run as train_mod
    from anatomy_cli.spec.config import RunConfig
    from anatomy_cli.sweep import calibrate

    calls = []

    def fake_train(cfg, run_dir):
        t = cfg.train
        calls.append((t.steps, t.eval_interval))
        evals_in_loop = t.steps // t.eval_interval
        return {"step_time_ms": 20.0, "wall_s": t.steps * 0.02 + evals_in_loop * 0.5}

    monkeypatch.setattr(train_mod, "train", fake_train)
    monkeypatch.setattr("anatomy_cli.data.load.load_corpus", lambda *a: None)
    job = RunConfig().model_dump(mode="json")
    _, (cal,) = calibrate.measure_in_worker([job], 1)
    assert calls[0][0] < calibrate.N  # the warm-up, discarded
    assert calls[1] == (calibrate.N, calibrate.N // calibrate.E)
    assert cal["step_s"] == pytest.approx(0.02) and cal["eval_s"] == pytest.approx(0.5)
    cfg = RunConfig.model_validate(job | {"train": job["train"] | {"steps": 800, "eval_interval": 50}})
    run = calibrate.run_seconds(cfg, cal)  # 800 steps, 17 evaluations (step 0 and 16 in the loop)
    assert run == pytest.approx(cal["run_s"] + 800 * 0.02 + 17 * 0.5)

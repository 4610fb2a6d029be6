"""One cadence for both training loops (trainer.Cadence, driven by trainer.train_loop): Trainer and
StackedTrainer evaluate, log, checkpoint and stop at the same steps, the steps the Cadence itself
predicts, for every cadence option; the Cadence's answers at their edges; and one resume preamble,
so a lone resume and a stacked one refuse a run with the same line.

Time is the step: each test gives the Cadence a clock that reads seconds(step done), so the
checkpoint_minutes cases are exact and nothing sleeps."""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from toy_data import TINY_MODEL, tiny_text, write_corpus

from anatomy_cli.data.corpus import Corpus
from anatomy_cli.data.load import load_corpus
from anatomy_cli.spec.config import RunConfig, TrainConfig, validate
from anatomy_cli.store import runs
from anatomy_cli.training.run import resolve_config, resume, train
from anatomy_cli.training.stacked import StackedTrainer, train_group
from anatomy_cli.training.trainer import Cadence, RunLog, Trainer

pytestmark = pytest.mark.usefixtures("single_thread")

TRAIN = {"steps": 12, "batch_size": 4, "eval_interval": 4, "log_interval": 3, "eval_batches": 1, "warmup": 2,
         "lr": 3e-3, "sample_len": 0, "device": "cpu", "threads": 1}
Seconds = Callable[[int], float]  # the clock, as a function of the steps done


def no_time(step: int) -> float:
    return 0.0


def twenty_per_step(step: int) -> float:
    return 20.0 * step


def slowing(step: int) -> float:
    """Steps that take longer and longer (step s ends at s^2 seconds): checkpoint_minutes falls due
    after 6, then 3, then 2 steps."""
    return float(step * step)


@dataclass
class Trace:
    """Where one run's loop evaluated (val losses in metrics.jsonl, step 0 included), logged (progress
    events), checkpointed (resume.pt written), and how it ended: (status, steps done)."""

    evaluated: list[int] = field(default_factory=list)
    logged: list[int] = field(default_factory=list)
    checkpointed: list[int] = field(default_factory=list)
    ended: tuple[str, int] | None = None


def predict(c: Cadence, stop_at: int | None = None, seconds: Seconds = no_time, start: int = 0) -> Trace:
    """What a loop on c does from step `start`, read off c's answers alone: after each step the log
    point (evaluating first when due), then the stop request (stop_at: it checkpoints and ends), then
    the checkpoint; the minutes clock runs from the loop's start."""
    want = Trace(evaluated=[0] if start == 0 else [])
    saved = seconds(start)
    for step in range(start + 1, c.steps + 1):
        if c.log_at(step):
            want.logged.append(step)
            want.evaluated += [step] if c.evaluate_at(step) else []
        if step == stop_at:
            want.checkpointed.append(step)
            want.ended = (runs.INTERRUPTED, step)
            return want
        if c.checkpoint_at(step, seconds(step) - saved):
            want.checkpointed.append(step)
            saved = seconds(step)
    want.ended = (runs.COMPLETED, c.steps)
    return want


def where(answer: Callable[[int], bool], steps: int) -> list[int]:
    return [s for s in range(1, steps + 1) if answer(s)]


# ------------------------------------------------------------------ the two loops, traced
@pytest.fixture(scope="module")
def corpus_path(tmp_path_factory) -> Path:
    return write_corpus(tmp_path_factory.mktemp("corpus"))


def configs(corpus_path: Path, seeds=(0, 1), **train_kw) -> tuple[list[RunConfig], Corpus]:
    cfgs = [validate(RunConfig, {"seed": s, "model": TINY_MODEL, "train": {**TRAIN, **train_kw},
                                 "data": {"source": str(corpus_path)}}) for s in seeds]
    d = cfgs[0].data
    corpus = load_corpus(d.source, d.val_frac, cfgs[0].model.ctx_len)
    return [resolve_config(c, corpus) for c in cfgs], corpus


@pytest.fixture
def traces(monkeypatch) -> dict[str, Trace]:
    """Each run's Trace by its folder's name; resume.pt writes are spied on RunLog, which both loops use."""
    traces: dict[str, Trace] = defaultdict(Trace)
    real = RunLog.save_checkpoint

    def spy(log, weights, state):
        traces[log.run_dir.name].checkpointed.append(state.step)
        real(log, weights, state)

    monkeypatch.setattr(RunLog, "save_checkpoint", spy)
    return traces


def on_clock(tr, seconds: Seconds, stop_at: int | None):
    """Give tr's Cadence a clock of seconds(steps done); the stop request that is true from stop_at."""
    tr.cadence = dataclasses.replace(tr.cadence, clock=lambda: seconds(tr.step))
    return None if stop_at is None else (lambda: tr.step >= stop_at)


def run_alone(cfg: RunConfig, run_dir: Path, corpus: Corpus, trace: Trace, seconds: Seconds = no_time,
              stop_at: int | None = None, restore: bool = False) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    tr = Trainer(cfg, run_dir, corpus, progress=lambda p: trace.logged.append(p["step"]))
    if restore:
        tr.restore()
    status, _ = tr.run(on_clock(tr, seconds, stop_at))
    trace.ended = (status, tr.step)
    trace.evaluated = [r["step"] for r in runs.read_metrics(run_dir) if "val_loss" in r]


def run_stacked(cfgs: list[RunConfig], run_dirs: list[Path], corpus: Corpus, traces: dict[str, Trace],
                seconds: Seconds = no_time, stop_at: int | None = None, restore: bool = False) -> None:
    for d in run_dirs:
        d.mkdir(parents=True, exist_ok=True)
    tr = StackedTrainer(cfgs, run_dirs, corpus,
                        progress=lambda p: traces[Path(p["run_dir"]).name].logged.append(p["step"]))
    if restore:
        tr.restore()

    def finish(m, status: str, diverged_at: int | None) -> None:
        traces[m.run_dir.name].ended = (status, m.step)

    tr.run(finish, on_clock(tr, seconds, stop_at))
    for d in run_dirs:
        traces[d.name].evaluated = [r["step"] for r in runs.read_metrics(d) if "val_loss" in r]


# id: (train options, stop after this step, the clock)
CASES = {
    "default": ({}, None, no_time),  # checkpoints at the evaluations but the last
    "interval-1": ({"eval_interval": 1, "log_interval": 1}, None, no_time),
    "eval-past-the-end": ({"eval_interval": 50, "log_interval": 5}, None, no_time),  # the last step only
    "every-5": ({"checkpoint_every": 5}, None, no_time),
    "every-6-not-at-the-end": ({"checkpoint_every": 6}, None, no_time),
    "minutes": ({"checkpoint_minutes": 1.0}, None, twenty_per_step),  # 60 s = every 3 steps
    "minutes-slowing": ({"checkpoint_minutes": 0.5}, None, slowing),
    "every-5-or-minutes": ({"checkpoint_every": 5, "checkpoint_minutes": 1.0}, None, twenty_per_step),
    "stop-between-log-points": ({}, 5, no_time),
    "stop-at-an-evaluation": ({}, 8, no_time),  # the stop's checkpoint, not a second one
    "stop-with-minutes": ({"checkpoint_minutes": 1.0}, 7, twenty_per_step),
}


@pytest.mark.parametrize("case", CASES)
def test_both_loops_keep_the_cadence_it_predicts(tmp_path, corpus_path, traces, case):
    opts, stop_at, seconds = CASES[case]
    cfgs, corpus = configs(corpus_path, **opts)
    run_alone(cfgs[0], tmp_path / "alone", corpus, traces["alone"], seconds, stop_at)
    run_stacked(cfgs, [tmp_path / "s0", tmp_path / "s1"], corpus, traces, seconds, stop_at)
    assert traces["s0"] == traces["alone"] and traces["s1"] == traces["alone"]
    assert traces["alone"] == predict(Cadence.of(cfgs[0].train), stop_at, seconds)


def test_a_resumed_loop_goes_on_with_the_cadence_its_minutes_counted_from_the_resume(tmp_path, corpus_path,
                                                                                      traces):
    """Stopped after step 4, then restored and run to the end: the checkpoint_minutes clock starts
    again at the resume (checkpoints 3, 4 by the stop, then 7 and 10, not the 3, 6, 9 of a run
    trained through), in both loops."""
    cfgs, corpus = configs(corpus_path, checkpoint_minutes=1.0)
    dirs = [tmp_path / "s0", tmp_path / "s1"]
    for restore, stop_at in ((False, 4), (True, None)):
        run_alone(cfgs[0], tmp_path / "alone", corpus, traces["alone"], twenty_per_step, stop_at, restore)
        run_stacked(cfgs, dirs, corpus, traces, twenty_per_step, stop_at, restore)
    c = Cadence.of(cfgs[0].train)
    first, then = predict(c, 4, twenty_per_step), predict(c, None, twenty_per_step, start=4)
    want = Trace(first.evaluated + then.evaluated, first.logged + then.logged,
                 first.checkpointed + then.checkpointed, then.ended)
    assert want.checkpointed == [3, 4, 7, 10]
    assert traces["s0"] == traces["alone"] and traces["s1"] == traces["alone"]
    assert traces["alone"] == want


# ------------------------------------------------------------------ the Cadence alone
def test_the_last_step_is_always_evaluated_and_logged():
    for steps, every in ((10, 4), (10, 3), (7, 50), (12, 12), (1, 1)):
        c = Cadence(steps, every, 5)
        assert c.evaluate_at(steps) and c.log_at(steps)
    c = Cadence(10, 4, 3)
    assert where(c.evaluate_at, 10) == [4, 8, 10]
    assert where(c.log_at, 10) == [3, 4, 6, 8, 9, 10]
    assert where(Cadence(10, 50, 50).evaluate_at, 10) == [10]


def test_interval_1_evaluates_logs_and_by_default_checkpoints_every_step_but_the_last():
    c = Cadence(5, 1, 1)
    assert where(c.evaluate_at, 5) == where(c.log_at, 5) == [1, 2, 3, 4, 5]
    assert where(lambda s: c.checkpoint_at(s, 0.0), 5) == [1, 2, 3, 4]
    assert where(Cadence(5, 2, 1).log_at, 5) == [1, 2, 3, 4, 5]


def test_every_evaluation_is_a_log_point():
    for steps in (1, 7, 12):
        for ev in range(1, 8):
            for lg in range(1, 8):
                c = Cadence(steps, ev, lg)
                assert set(where(c.evaluate_at, steps)) <= set(where(c.log_at, steps)), (steps, ev, lg)


def test_checkpoints_by_step_default_to_the_evaluations_and_never_fall_on_the_last_step():
    def ckpts(c: Cadence) -> list[int]:
        return where(lambda s: c.checkpoint_at(s, 1e9), c.steps)  # any time: only the minutes read it

    assert ckpts(Cadence(12, 4, 3)) == [4, 8]
    assert ckpts(Cadence(12, 4, 3, checkpoint_every=5)) == [5, 10]
    assert ckpts(Cadence(12, 4, 3, checkpoint_every=6)) == [6]
    assert ckpts(Cadence(12, 4, 3, checkpoint_every=1)) == list(range(1, 12))
    assert ckpts(Cadence(12, 4, 3, checkpoint_every=100)) == []
    assert ckpts(Cadence(12, 50, 3)) == []  # the only evaluation is the last step
    # kept steps (train.keep_checkpoints: a budget ladder's branch points) checkpoint whatever else is set
    assert ckpts(Cadence(12, 4, 3, checkpoint_every=100, keep=(5, 7))) == [5, 7]
    assert ckpts(Cadence(12, 4, 3, keep=(5,))) == [4, 5, 8]
    assert Cadence.of(TrainConfig(steps=12, keep_checkpoints=[5, 7])).keep == (5, 7)


def test_checkpoint_minutes_fall_due_when_the_time_since_the_last_crosses_them():
    c = Cadence(100, 1000, 10, checkpoint_minutes=0.5)
    assert not c.checkpoint_at(7, 29.999) and c.checkpoint_at(7, 30.0) and c.checkpoint_at(7, 31.0)
    assert not c.checkpoint_at(100, 1e9)  # the last step: the run ends instead
    both = Cadence(100, 1000, 10, checkpoint_every=10, checkpoint_minutes=0.5)
    assert both.checkpoint_at(10, 0.0) and both.checkpoint_at(7, 30.0) and not both.checkpoint_at(7, 29.0)
    assert not Cadence(100, 1000, 10, checkpoint_every=10).checkpoint_at(7, 1e9)
    # the clock restarts at each checkpoint: s^2 seconds crosses 30 s at 6 (36), 9 (81-36), 11 (121-81)
    assert predict(Cadence(12, 50, 5, checkpoint_minutes=0.5), seconds=slowing).checkpointed == [6, 9, 11]
    assert predict(Cadence(12, 4, 3, checkpoint_every=5, checkpoint_minutes=1.0),
                   seconds=twenty_per_step).checkpointed == [3, 5, 8, 10]


def test_a_cadence_is_read_from_train_config_and_frozen():
    t = TrainConfig(steps=30, eval_interval=7, log_interval=2, checkpoint_every=9, checkpoint_minutes=2.5)
    c = Cadence.of(t)
    assert (c.steps, c.eval_interval, c.log_interval, c.checkpoint_every, c.checkpoint_minutes) == (30, 7, 2, 9, 2.5)
    assert c == Cadence.of(t, clock=lambda: 0.0)  # the clock is how time is read, not part of the cadence
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.steps = 31


# ------------------------------------------------------------------ one resume preamble
def test_a_lone_and_a_stacked_resume_refuse_with_the_same_line(tmp_path):
    corpus_path = write_corpus(tmp_path)
    cfgs, _ = configs(corpus_path, steps=4, eval_interval=2)
    done = tmp_path / "done"
    train(cfgs[0], done)
    with pytest.raises(runs.RunError) as alone:
        resume(done)
    with pytest.raises(runs.RunError) as stacked:
        train_group(None, [done], resume=True)
    assert str(alone.value) == str(stacked.value) == f"{done} is completed; only interrupted runs can be resumed"

    dirs = [tmp_path / "s0", tmp_path / "s1"]
    train_group(cfgs, dirs, stop=lambda: True)  # interrupted after step 1, checkpointed
    corpus_path.write_text(tiny_text(seed=1), encoding="utf-8")
    with pytest.raises(runs.RunError) as alone:
        resume(dirs[0])
    with pytest.raises(runs.RunError) as stacked:
        train_group(None, dirs, resume=True)
    assert str(alone.value) == str(stacked.value) and "the corpus changed since the run started" in str(alone.value)
    assert [runs.run_status(d) for d in dirs] == [runs.INTERRUPTED] * 2

"""study.rounds.run_rounds, the loop of `ablate --decide`, driven by a fake trainer over a synthetic study
(no training): each stop reason, the seeds each round gives, a config that sits a round out catching up,
and the calibration harness driving this very function."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from anatomy_cli.report import decide
from anatomy_cli.report import effects as effects_mod
from anatomy_cli.store.runs import COMPLETED
from anatomy_cli.study import ablation, rounds
from anatomy_cli.study.rounds import Rounds, run_rounds

ROLES = ("reference", "+rope", "+swiglu")


@dataclass(frozen=True)
class Planned:
    run_id: str
    slug: str


class FakeStudy:
    """Three configs (the reference end, +rope, +swiglu: two add-one effects) whose seed s has the loss
    base + the config's true effect + noise[config, s]; train() marks runs trained and advances a clock."""

    def __init__(self, gains: dict[str, float], sd: dict[str, float], seconds_per_run: float = 1.0, seed: int = 0):
        rng = np.random.default_rng(seed)
        self.loss = {(role, s): 3.0 - gains.get(role, 0.0) + sd.get(role, 0.01) * rng.normal()
                     for role in ROLES for s in range(1, 31)}
        self.trained: list[str] = []
        self.status: dict[str, str] = {}  # a run's status when not completed
        self.now, self.per_run = 0.0, seconds_per_run

    def plan_at(self, n: int) -> list[Planned]:
        return [Planned(f"{role}-s{s}", role) for role in ROLES for s in range(1, n + 1)]

    def train(self, todo: list[Planned]) -> list[str]:
        fresh = [p for p in todo if p.run_id not in self.trained]
        self.trained += [p.run_id for p in fresh]
        self.now += self.per_run * len(fresh)
        return [COMPLETED] * len(todo)

    def read(self) -> pd.DataFrame:
        rows = []
        for rid in self.trained:
            role, s = rid.rsplit("-s", 1)
            rows.append({"run_id": rid, "role": role, "design": "rope+swiglu", "settings": "{}", "size": "",
                         "seed": int(s), "status": self.status.get(rid, COMPLETED),
                         "best_val_loss": self.loss[(role, int(s))],
                         "best_val_bpb": self.loss[(role, int(s))]})
        return pd.DataFrame(rows)

    def seeds(self) -> dict[str, int]:
        return {role: sum(r.startswith(f"{role}-s") for r in self.trained) for role in ROLES}

    def run(self, plan: Rounds, **kw) -> rounds.RoundsDone:
        return run_rounds(self.plan_at(plan.looks[0]), plan, self.train, self.read, self.plan_at,
                          pending=lambda todo: [p for p in todo if p.run_id not in self.trained],
                          clock=lambda: self.now, **kw)


def test_every_effect_decided_stops_at_the_first_look():
    study = FakeStudy({"+rope": 0.5, "+swiglu": -0.5}, {})
    done = study.run(Rounds([3, 5, 7]))
    assert done.record.stopped == "every effect decided"
    assert [r.seeds for r in done.record.rounds] == [3] and done.record.rounds[0].open == []
    assert study.seeds() == {"reference": 3, "+rope": 3, "+swiglu": 3}


def test_the_seed_cap_stops_an_open_effect_and_only_its_configs_get_seeds():
    """swiglu helps clearly; rope's gain is lost in noise: without futility it gets seeds up to the cap."""
    study = FakeStudy({"+swiglu": 0.5, "+rope": 0.01}, {"+rope": 0.3})
    saved = []
    done = study.run(Rounds([3, 5, 7], futility=False), save=saved.append)
    assert done.record.stopped == "the seed cap (7) reached with 1 effect open"
    assert [r.seeds for r in done.record.rounds] == [3, 5, 7]
    assert [r.trained for r in done.record.rounds] == [9, 4, 4]  # 3 configs x 3, then 2 configs x 2 twice
    assert study.seeds() == {"reference": 7, "+rope": 7, "+swiglu": 3}
    assert all(r.open == ["rope add-one"] for r in done.record.rounds)
    assert saved[-1] == done.record and saved[0].rounds == []  # the plan is on disk before the first round
    assert done.record.alpha == pytest.approx(0.05 / 3)


def test_futility_stops_a_study_whose_open_effects_the_cap_could_not_decide():
    study = FakeStudy({"+swiglu": 0.5, "+rope": 0.0}, {"+rope": 0.3})
    done = study.run(Rounds([3, 4], futility=True))
    assert done.record.rounds[0].futile == ["rope add-one"]
    assert done.record.stopped == "1 effect open, none of which 4 seeds would decide at the noise measured"
    assert study.seeds() == {"reference": 3, "+rope": 3, "+swiglu": 3}


def test_the_budget_stops_before_a_round_that_would_overrun_it():
    """Round 1 trains 9 runs in 90 s (the fake clock): the next round's 4 runs at that pace take 40 s more,
    which a 120 s budget cannot hold; a 200 s budget can."""
    plan = dict(futility=False, budget_s=120.0, budget="2m")
    study = FakeStudy({"+swiglu": 0.5, "+rope": 0.01}, {"+rope": 0.3}, seconds_per_run=10.0)
    done = study.run(Rounds([3, 5, 7], **plan))
    assert done.record.stopped == "the budget (2m) would be overrun by the next round"
    assert len(done.record.rounds) == 1 and len(study.trained) == 9
    roomy = FakeStudy({"+swiglu": 0.5, "+rope": 0.01}, {"+rope": 0.3}, seconds_per_run=10.0)
    record = roomy.run(Rounds([3, 5, 7], **plan | {"budget_s": 200.0})).record  # 90 + 40 + 40 s
    assert len(record.rounds) == 3 and record.stopped.startswith("the seed cap")


def test_a_resumed_round_is_priced_by_the_estimate_when_nothing_trained():
    study = FakeStudy({"+swiglu": 0.5, "+rope": 0.01}, {"+rope": 0.3}, seconds_per_run=10.0)
    study.train(study.plan_at(3))  # a resumed study: the first round is found done
    asked = []
    done = study.run(Rounds([3, 5], futility=False, budget_s=1000.0, budget="1000s"),
                     cost=lambda todo: asked.append(len(todo)) or 5000.0)
    assert asked == [4] and done.record.stopped == "the budget (1000s) would be overrun by the next round"


def test_a_config_that_sat_out_a_round_catches_up_on_the_seeds_it_missed(monkeypatch):
    """Which effects are open is scripted per look: rope open, then decided, then open again (in a real
    family the moderated variance can move it back). At the look that reopens it, +rope gets every seed up
    to the next look, the one it sat out included (the loop before the study room gave it only the new one)."""
    script = iter([{"rope", "swiglu"}, {"swiglu"}, {"rope"}, set()])
    real = effects_mod.component_effects

    def scripted(*args, **kw):
        judged = real(*args, **kw)
        return judged.assign(call=np.where(judged["flip"].isin(next(script)), "undecided", "helps"))

    monkeypatch.setattr(effects_mod, "component_effects", scripted)
    study = FakeStudy({}, {})
    done = study.run(Rounds([3, 4, 5, 6], futility=False))
    assert [r.trained for r in done.record.rounds] == [9, 3, 2, 3]  # round 4: +rope's seeds 5 and 6, the end's 6
    assert study.seeds() == {"reference": 6, "+rope": 6, "+swiglu": 5}
    assert done.record.stopped == "every effect decided"


def test_a_rerun_over_the_same_runs_takes_the_same_decisions():
    study = FakeStudy({"+swiglu": 0.5, "+rope": 0.05}, {"+rope": 0.1})
    first = study.run(Rounds([3, 5, 7, 9], futility=False)).record
    again = study.run(Rounds([3, 5, 7, 9], futility=False)).record
    strip = [r.model_dump(exclude={"seconds"}) for r in first.rounds]
    assert [r.model_dump(exclude={"seconds"}) for r in again.rounds] == strip
    assert again.stopped == first.stopped


def test_the_calibration_harness_and_ablate_drive_the_same_rounds_function():
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import calibrate_verdict as cv

    assert cv.run_rounds is rounds.run_rounds is ablation.run_rounds
    source = Path(cv.__file__).read_text(encoding="utf-8")
    assert "._" not in "".join(line.split("#")[0] for line in source.splitlines() if "effects." in line
                               or "decide." in line or "stats." in line)  # no private name of report/


def test_looks_of_plans_from_the_first_count_to_the_cap():
    assert rounds.looks_of(3, None, 2) == [3, 5, 7, 9, 10]
    assert rounds.looks_of(12, None, 2) == [12]
    assert rounds.looks_of(3, 4, 1) == [3, 4]
    assert json.dumps(Rounds([3, 5]).alpha) == json.dumps(0.025)


class LosingStudy(FakeStudy):
    """A study whose trainer loses runs: `lose` maps a run id to the status it ends with (None: never started)."""

    def __init__(self, lose: dict, *args, **kw):
        super().__init__(*args, **kw)
        self.lose = lose

    def train(self, todo):
        kept = [p for p in todo if self.lose.get(p.run_id, "diverged") == "diverged"]  # a diverged run is a result
        super().train(kept)
        self.status |= {p.run_id: "diverged" for p in kept if p.run_id in self.lose}
        return [self.lose.get(p.run_id, COMPLETED) for p in todo]


def test_a_round_with_lost_runs_is_not_judged_and_the_rounds_stop():
    """A worker killed in round 1 (runs interrupted, never started, failed): no look, no next round planned
    from half a round, and the stop line says how to resume."""
    lose = {"+rope-s2": "interrupted", "+rope-s3": None, "+swiglu-s3": "failed"}
    study = LosingStudy(lose, {"+swiglu": 0.5}, {"+rope": 0.3})
    done = study.run(Rounds([3, 5, 7], futility=False))
    assert done.record.rounds == []
    assert done.record.stopped == ("round 1 lost 3 of 9 runs (1 interrupted, 1 never started, 1 failed): not "
                                   "judged; rerun the same command to resume")
    assert len(study.trained) == 6


def test_no_completed_pairs_is_never_decided():
    """Every variant run diverged: the effects have no completed pairs, which is open (not decided), and
    the study stops saying so instead of 'every effect decided'."""
    lose = {f"{role}-s{s}": "diverged" for role in ("+rope", "+swiglu") for s in range(1, 11)}
    study = LosingStudy(lose, {}, {})
    done = study.run(Rounds([3, 5], futility=True))
    assert done.record.rounds[0].open == ["rope add-one", "swiglu add-one"]
    assert done.record.stopped.startswith("no completed pairs: 2 effects without a pair of completed runs")
    assert "every effect decided" not in decide.stop_text(done.record)


def test_a_budget_the_first_round_overruns_trains_nothing():
    study = FakeStudy({}, {})
    done = study.run(Rounds([3, 5], budget_s=12.0, budget="12s"), cost=lambda todo: 17.0)
    assert done.record.stopped == "the budget (12s) would be overrun by the first round (est. 17 s): nothing trained"
    assert study.trained == [] and done.record.rounds == []


def test_a_rerun_counts_the_seconds_its_earlier_rounds_took_against_the_budget():
    """A budget-stopped study, rerun: its rounds are found done in no time, but the budget is already
    spent by the time they took when they trained, so it stays stopped."""
    plan = Rounds([3, 5, 7], futility=False, budget_s=120.0, budget="2m")
    study = FakeStudy({"+swiglu": 0.5, "+rope": 0.01}, {"+rope": 0.3}, seconds_per_run=10.0)
    first = study.run(plan).record
    assert first.stopped == "the budget (2m) would be overrun by the next round"
    again = study.run(plan, before=first).record
    assert again.stopped == first.stopped and again.rounds[0].seconds == first.rounds[0].seconds


def test_a_rerun_leaves_the_record_on_disk_until_its_first_look():
    """The plan is saved before the first round only for a new study: a second process started on a running
    study's folder must not blank its rounds before the sweep lock refuses it."""
    study = FakeStudy({"+swiglu": 0.5, "+rope": 0.01}, {"+rope": 0.3})
    first = study.run(Rounds([3, 5], futility=False)).record
    saved = []
    study.run(Rounds([3, 5], futility=False), save=saved.append, before=first)
    assert saved and saved[0].rounds  # the first save of a rerun is its first look, never an empty plan


def test_a_budget_the_first_round_may_not_fit_is_warned_of_by_the_dry_run(tmp_path, monkeypatch):
    """The dry run's first round against --budget (issue 48: 12 s asked, 19 s trained, nothing said): over it, the
    study would train nothing; past half of it, the round (never cut short) may train past it; within, no word."""
    from helpers import fake_calibration, invoke
    from toy_data import write_spec

    from anatomy_cli.sweep.plan import pending_runs

    fake_calibration(tmp_path, monkeypatch, {"step_s": 0.01, "eval_s": 0.1, "run_s": 1.0, "startup_s": 2.0,
                                             "when": "2024-01-01 00:00:00"})
    spec = write_spec(tmp_path, top={"flips": ["rope"], "seeds": 3})
    study = ablation.size_study(ablation.plan_study(ablation.Ask(spec=spec, runs_dir=tmp_path / "runs",
                                                                 decide=True, workers=1)))
    need = ablation.round_seconds(study, pending_runs(study.plan, study.sweep_dir))
    said = {}
    for budget in (need * 0.8, need * 1.5, need * 2.5):
        result = invoke("ablate", spec, "--decide", "--budget", f"{round(budget)}s", "--dry-run", "--workers", 1,
                        "--runs-dir", tmp_path / "runs")
        assert result.exit_code == 0, result.output
        said[budget] = [line for line in result.stderr.splitlines() if line.startswith("warning:")]
    over, tight, roomy = said.values()
    assert len(over) == 1 and "the round overruns it, so the study would stop before it and train nothing" in over[0]
    assert len(tight) == 1 and "the first round may train past the budget" in tight[0]
    assert roomy == [] and not (tmp_path / "runs").exists()
    assert rounds.budget_note(Rounds([3, 5]), 1e9) is None  # no budget, nothing to fit

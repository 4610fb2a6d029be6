"""study/lr_study.py: `anatomy ablate --tune-lr`'s plan (the spec's [tune] table, resolved once), its
refusals (one line, exit 2, nothing written), selection seeds that no study seed can be, and the two
phases driven by a fake trainer: each config's LR chosen from the grid's runs and frozen in tune.json,
the study's seeds at those LRs, the shared-LR runs beside them where an LR moved, and a rerun (after an
interruption too) that never re-picks."""

from __future__ import annotations

import json
import math

import pytest
from helpers import asked, flat, invoke, one_error_line
from toy_data import write_spec

from anatomy_cli.report import lr_allowance
from anatomy_cli.store import records, runs
from anatomy_cli.study import ablation, lr_study
from anatomy_cli.study.ablation import Ask, plan_study


def spec_at(tmp_path, tune=None, **train):
    top = {"seeds": 3, "flips": ["rope"], "directions": ["add-one"], **({"tune": tune} if tune else {})}
    return write_spec(tmp_path, top=top, train=train or None)


@pytest.mark.parametrize("args, spec_kw, fragment", [
    (["--tune-points", "1"], {}, "odd number of points, at least 3"),
    (["--tune-points", "4"], {}, "odd number of points"),
    (["--tune-factor", "1"], {}, "factor must be a finite number above 1"),
    (["--tune-factor", "0.5"], {}, "factor must be a finite number above 1"),
    (["--tune-factor", "1e300"], {}, "every LR must be a positive finite number"),  # 3e-3 x 1e300^4 overflows
    (["--tune-factor", "1e90", "--tune-extend", "4"], {}, "reaches lr=0"),  # 3e-3 / 1e90^6 underflows
    (["--tune-seeds", "1338,"], {}, "the selection seeds must not be study seeds: 1338 is both"),
    (["--tune-seeds", "1341,1336", "--decide", "--max-seeds", "5"], {}, "1341 is both"),  # a later look's seed
    (["--tune-seeds", "x"], {}, "--tune-seeds takes a count or a comma-separated list"),
    (["--tune-seeds", "0"], {}, "--tune-seeds: Input should be greater than or equal to 1"),
    # the flags obey the [tune] table's limits, as the table does (40,000 runs were planned past them; issue 48)
    (["--tune-points", "1001"], {}, "--tune-points: Input should be less than or equal to 31"),
    (["--tune-extend", "500"], {}, "--tune-extend: Input should be less than or equal to 16"),
    (["--tune-seeds", "5000"], {}, "--tune-seeds: Input should be less than or equal to 1000"),
    ([], {"tune": {"points": 1001}}, "tune.points: Input should be less than or equal to 31"),
    ([], {"tune": {"extend": 500}}, "tune.extend: Input should be less than or equal to 16"),
    (["--time"], {}, "--tune-lr trains; --time times"),
    ([], {"tune": {"points": 1}}, "odd number of points"),
    ([], {"tune": {"seeds": [1337]}}, "1337 is both"),
    ([], {"tune": {"factor": 0.5}}, "factor must be a finite number above 1"),
    ([], {"lr": 0}, "train.lr"),
    ([], {"lr": -1e-3}, "train.lr"),
    ([], {"lr": math.inf}, "train.lr"),
])
def test_bad_input_is_one_line_and_nothing_is_written(tmp_path, args, spec_kw, fragment):
    tune = spec_kw.pop("tune", None)
    spec = spec_at(tmp_path, tune, **spec_kw)
    flag = [] if tune else ["--tune-lr"]
    one_error_line(invoke("ablate", spec, "--runs-dir", tmp_path / "runs", *flag, *args), fragment)
    assert not (tmp_path / "runs").exists()


def test_grid_options_without_tune_lr_are_refused(tmp_path):
    one_error_line(invoke("ablate", spec_at(tmp_path), "--runs-dir", tmp_path / "runs", "--tune-points", "3",
                          "--dry-run"), "--tune-points 3 sets the [tune] table, which the spec does not have: add "
                   "--tune-lr (or --set tune=true) to turn it on")


def test_flags_override_the_specs_tune_table_once(tmp_path):
    spec = spec_at(tmp_path, {"points": 7, "factor": 1.5, "extend": 1, "seeds": 2})
    study = plan_study(Ask(spec=spec, runs_dir=tmp_path / "runs"))
    g = study.tune.grid
    assert (g.points, g.factor, g.extend, g.seeds, g.center, study.tune.by) == (7, 1.5, 1, (1336, 1335), 3e-3, "spec")
    study = plan_study(asked(spec, "--tune-points", "3", "--tune-seeds", "7,9",
                             runs_dir=tmp_path / "runs", tune_lr=True))
    g = study.tune.grid
    assert (g.points, g.factor, g.seeds, study.tune.by, study.tune.seeds_given) == (3, 1.5, (7, 9), "flag", [7, 9])
    assert plan_study(Ask(spec=spec, runs_dir=tmp_path / "runs", time_pass=True)).tune is None  # --time times


def test_selection_seeds_sit_below_every_seed_the_study_could_use(tmp_path):
    spec = spec_at(tmp_path)
    study = plan_study(asked(spec, "--tune-seeds", "3", "--max-seeds", "10",
                             runs_dir=tmp_path / "runs", tune_lr=True, decide=True))
    looks = {1337 + i for i in range(study.rounds.looks[-1])}
    assert study.tune.grid.seeds == (1336, 1335, 1334)
    assert not set(study.tune.grid.seeds) & ({p.config.seed for p in study.plan} | looks)
    assert plan_study(Ask(spec=spec, runs_dir=tmp_path / "runs")).tune is None  # no flag, no table: not tuned


def test_a_run_at_the_shared_lr_is_the_planned_run_and_another_lr_another_run(tmp_path):
    study = plan_study(Ask(spec=spec_at(tmp_path), runs_dir=tmp_path / "runs", tune_lr=True))
    p = study.plan[0]
    assert lr_study.at_lr(p, p.config.train.lr).run_id == p.run_id
    moved = lr_study.at_lr(p, 6e-3)
    assert moved.run_id != p.run_id and moved.config.train.lr == 6e-3 and moved.config.seed == p.config.seed
    assert lr_study.config_key(moved) == lr_study.config_key(p)  # the same config but for its LR
    assert lr_study.at_lr(p, 6e-3, 1336).config.seed == 1336


# ---------------------------------------------------------------------------- the two phases, a fake trainer

OPTIMUM = {"2017": 6e-3, "2017+rope": 3e-3}  # each config's best LR; 2017's is one factor above train.lr


class FakeTrainer:
    """Writes each run's config.json and summary.json: best val loss 2.5 - gain (2017+rope) + 0.02 (log2
    lr/optimum)^2 + each config's noise at the seed (the same at every LR); after `stop_after` runs it stops
    as an interrupted sweep would."""

    def __init__(self, root, optimum=OPTIMUM, stop_after=None, noise=4e-3, gain=0.0):
        self.root, self.optimum, self.stop_after, self.trained = root, optimum, stop_after, []
        self.noise, self.gain = noise, gain  # gain: what rope is worth at each config's best LR

    def loss(self, p) -> float:
        noise = self.noise * math.sin(1.7 * p.config.seed + len(p.slug))  # each config's own: paired gains vary
        rope = self.gain if p.slug == "2017+rope" else 0.0
        return 2.5 - rope + 0.02 * math.log2(p.config.train.lr / self.optimum[p.slug]) ** 2 + noise

    def __call__(self, todo):
        out = []
        for p in todo:
            run_dir = self.root / p.run_id
            if runs.run_status(run_dir) not in runs.DONE_STATES:
                if self.stop_after is not None and len(self.trained) >= self.stop_after:
                    raise KeyboardInterrupt
                run_dir.mkdir(parents=True, exist_ok=True)
                (run_dir / runs.CONFIG).write_text(json.dumps(p.config.model_dump(mode="json")))
                (run_dir / runs.SUMMARY).write_text(json.dumps({"status": "completed",
                                                                "best_val_loss": self.loss(p),
                                                                "best_val_bpb": self.loss(p)}))
                self.trained.append(p.run_id)
            out.append(runs.COMPLETED)
        return out


def tuned_study(tmp_path, *words, **ask):
    spec = spec_at(tmp_path)
    return ablation.size_study(plan_study(asked(spec, "--tune-points", "3", "--tune-extend", "1", *words,
                                                runs_dir=tmp_path / "runs", tune_lr=True, stack="off", **ask)))


def test_the_selection_chooses_each_lr_then_the_study_trains_at_it_with_the_shared_lr_beside(tmp_path):
    study = tuned_study(tmp_path)
    trainer = FakeTrainer(study.sweep_dir)
    done = ablation.run_study(study, trainer)
    record = records.read_tune(study.sweep_dir)
    assert record.chosen == {"2017": 6e-3, "2017+rope": 3e-3} and done.tune == record
    assert record.seeds == [1336] and record.by == "flag" and record.grid.points == 3
    study_seeds = {1337, 1338, 1339}
    trained = {(rid.rsplit("-s", 1)[0], int(rid.rsplit("-s", 1)[1].split("-")[0])) for rid in trainer.trained}
    assert {s for _, s in trained} == study_seeds | {1336}  # the selection seed is never a study seed
    # selection: 3 LRs x 2 configs, and 2017's best at the top edge one more past it; the study: 3 seeds x 2 at
    # their LRs; 2017's moved: its 3 seeds at the shared LR too
    assert len(trainer.trained) == 6 + 1 + 6 + 3 == len(done.statuses)
    assert record.arm("2017").extended == 1 and record.arm("2017").lrs == [1.5e-3, 3e-3, 6e-3, 1.2e-2]
    plan = lr_study.tuned_plan(study.plan, record)
    assert {p.config.train.lr for p in plan if p.slug == "2017"} == {6e-3}
    assert all((study.sweep_dir / p.run_id).is_dir() for p in study.plan)  # the shared-LR study is all there
    assert ablation.run_study(study, FakeTrainer(study.sweep_dir)).tune == record  # a rerun trains nothing new


def test_the_second_phase_is_priced_once_the_lrs_are_frozen_before_it_trains(tmp_path):
    study, events = tuned_study(tmp_path), []
    trainer = FakeTrainer(study.sweep_dir)

    def train(todo):
        events.append(("train", {p.config.seed for p in todo}))
        return trainer(todo)

    ablation.run_study(study, train, lambda line: events.append(("say", line)), price=lambda todo: 60.0 * len(todo))
    said = [i for i, (kind, line) in enumerate(events) if kind == "say" and "the study at the frozen LRs" in line]
    assert len(said) == 1
    line = events[said[0]][1]
    # 2 configs x 3 seeds at their LRs, 2017's moved: its 3 seeds at the shared LR beside them; priced by `price`
    assert line == ("--tune-lr: the study at the frozen LRs, 6 runs, and 3 at the shared LR 0.003 beside them "
                    "(to do: 9, est. 9.0min)")
    trains = [i for i, (kind, _) in enumerate(events) if kind == "train"]
    assert all(events[i][1] == {1336} for i in trains if i < said[0])  # after the selection's runs ...
    assert all(events[i][1] & {1337, 1338, 1339} for i in trains if i > said[0])  # ... before the study's
    again = []  # a rerun: nothing left to train, priced at 0; without `price` nothing is priced
    ablation.run_study(study, FakeTrainer(study.sweep_dir), again.append, price=lambda todo: 60.0 * len(todo))
    assert [x for x in again if "frozen LRs" in x] == [line.replace("to do: 9, est. 9.0min", "to do: 0, est. 0s")]
    quiet = []
    ablation.run_study(study, FakeTrainer(study.sweep_dir), quiet.append)
    assert not [x for x in quiet if "frozen LRs" in x]


def test_an_interrupted_selection_resumes_to_the_same_lrs(tmp_path):
    study = tuned_study(tmp_path)
    with pytest.raises(KeyboardInterrupt):
        ablation.run_study(study, FakeTrainer(study.sweep_dir, stop_after=4))
    assert records.read_tune(study.sweep_dir).arms == []  # the plan was written, nothing chosen yet
    again = FakeTrainer(study.sweep_dir)
    ablation.run_study(study, again)
    assert len(again.trained) == 3 + 6 + 3  # the rest of the selection (its extension too), then the study
    assert records.read_tune(study.sweep_dir).chosen == {"2017": 6e-3, "2017+rope": 3e-3}


def test_a_rerun_never_re_picks_and_another_grid_is_refused(tmp_path):
    study = tuned_study(tmp_path)
    ablation.run_study(study, FakeTrainer(study.sweep_dir))
    before = sorted(p.name for p in study.sweep_dir.iterdir())
    # the study's seeds say the other config's optimum moved: its frozen LR stays
    ablation.run_study(tuned_study(tmp_path), FakeTrainer(study.sweep_dir, optimum={"2017": 3e-3, "2017+rope": 1.2e-2}))
    assert records.read_tune(study.sweep_dir).chosen == {"2017": 6e-3, "2017+rope": 3e-3}
    spec = spec_at(tmp_path)
    for extra, fragment in ((["--tune-lr", "--tune-points", "5"], "was tuned with 3 LRs a factor 2 apart"),
                            (["--tune-lr", "--tune-points", "3", "--tune-extend", "1", "--tune-seeds", "2"],
                             "selection seeds 1336"),
                            ([], "was tuned (tune.json): add --tune-lr")):
        one_error_line(invoke("ablate", spec, "--runs-dir", tmp_path / "runs", *extra), fragment)
    one_error_line(invoke("ablate", spec, "--runs-dir", tmp_path / "runs", "--tune-lr", "--tune-points", "3",
                          "--tune-extend", "1", "--steps", "7"), "2017's LR was chosen for another config")
    assert sorted(p.name for p in study.sweep_dir.iterdir()) == before


def test_an_arm_best_at_the_edge_is_not_tuned_and_keeps_only_its_shared_lr_runs(tmp_path):
    study = tuned_study(tmp_path)
    trainer = FakeTrainer(study.sweep_dir, optimum={"2017": 3e-3, "2017+rope": 1e-1})  # far past the top edge
    ablation.run_study(study, trainer)
    record = records.read_tune(study.sweep_dir)
    rope = record.arm("2017+rope")
    assert not rope.tuned and rope.lr is None and "best at the edge" in rope.reason and rope.extended == 1
    assert len(rope.lrs) == 4  # the grid and one extension
    assert [p.slug for p in lr_study.tuned_plan(study.plan, record)] == ["2017"] * 3
    assert {p.run_id for p in study.plan} <= set(trainer.trained)  # at the shared LR, for the comparison


def test_dry_run_prices_the_selection_and_the_study_apart(tmp_path):
    result = invoke("ablate", spec_at(tmp_path), "--runs-dir", tmp_path / "runs", "--tune-lr", "--dry-run")
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "--tune-lr: first the LR selection, 10 runs (5 LRs a factor 2 apart around 0.003 x 2 configs x 1 " \
           "selection seed: 1336; to do: 10, est." in text
    assert "up to 4 more past an edge (est." in text and "then the study at the LRs chosen, 6 runs" in text
    assert "beside it up to 6 at the shared LR 0.003" in text
    assert not (tmp_path / "runs").exists()


def test_decide_rounds_run_at_the_frozen_lrs_with_the_shared_lr_beside(tmp_path):

    study = tuned_study(tmp_path, "--max-seeds", "6", "--decide-step", "3", decide=True)
    trainer = FakeTrainer(study.sweep_dir, noise=0.03, gain=0.07)  # an effect 3 seeds leave open, 6 may decide
    done = ablation.run_study(study, trainer)
    assert done.rounds is not None and records.read_decide(study.sweep_dir).looks == [3, 6]
    seeds = {int(r.rsplit("-s", 1)[1].split("-")[0]) for r in trainer.trained}
    rounds_ = records.read_decide(study.sweep_dir).rounds
    assert rounds_[0].seeds == 3 and 1336 in seeds and not {1336} & {1337 + i for i in range(6)}
    assert len(rounds_) == 2 and rounds_[0].open == ["rope add-one"]  # open at 3 seeds: seeds for both configs
    later = [r for r in trainer.trained if "-s1340-" in r or "-s1341-" in r or "-s1342-" in r]
    assert len(later) == 9  # each seed: 2017 at its frozen LR and at the shared LR, 2017+rope at its own (unmoved)


# ------------------------------------------------------------- [tune] shared = false: the study alone


def sub(tmp_path, name):
    """A folder of its own for one more study (spec, corpus and runs) beside the test's others."""
    (tmp_path / name).mkdir()
    return tmp_path / name


def test_shared_is_the_spec_s_unless_the_flag_says_otherwise(tmp_path):
    spec = spec_at(tmp_path, {"shared": False})
    assert plan_study(Ask(spec=spec, runs_dir=tmp_path / "runs")).tune.shared is False
    assert plan_study(asked(spec, "--tune-shared", runs_dir=tmp_path / "runs")).tune.shared is True
    plain = spec_at(sub(tmp_path, "plain"))
    assert plan_study(Ask(spec=plain, runs_dir=tmp_path / "runs", tune_lr=True)).tune.shared is True  # the default
    assert plan_study(asked(plain, "--no-tune-shared", runs_dir=tmp_path / "runs", tune_lr=True)).tune.shared is False
    result = invoke("ablate", plain, "--runs-dir", tmp_path / "runs", "--tune-lr", "--no-tune-shared", "--dry-run")
    assert result.exit_code == 0, result.output
    assert "no run at the shared LR 0.003 beside it (the shared-LR comparison is off)" in flat(result.output)


def test_shared_off_trains_no_run_at_the_shared_lr_and_tune_json_says_so(tmp_path):
    on = tuned_study(sub(tmp_path, "on"))
    off = tuned_study(sub(tmp_path, "off"), "--no-tune-shared")
    trained = {}
    for name, study in (("on", on), ("off", off)):
        trainer = FakeTrainer(study.sweep_dir)
        ablation.run_study(study, trainer)
        trained[name] = set(trainer.trained)
    record = records.read_tune(off.sweep_dir)
    assert record.shared is False and records.read_tune(on.sweep_dir).shared is True
    assert json.loads((off.sweep_dir / records.TUNE).read_text())["shared"] is False
    assert record.chosen == {"2017": 6e-3, "2017+rope": 3e-3}  # 2017's LR moved off the shared 3e-3
    moved = {p.run_id for p in off.plan if p.slug == "2017"}  # its study seeds at the shared LR
    assert len(moved) == 3 and not moved & trained["off"] and not any((off.sweep_dir / r).exists() for r in moved)
    assert {p.run_id for p in on.plan if p.slug == "2017"} <= trained["on"]  # shared on: still trained
    assert len(trained["off"]) == 6 + 1 + 6 and len(trained["on"]) == 6 + 1 + 6 + 3
    assert lr_allowance.rerun_flags(records.read_tune(off.sweep_dir))[-1] == "--no-tune-shared"
    assert "--no-tune-shared" not in lr_allowance.rerun_flags(records.read_tune(on.sweep_dir))


def test_shared_off_prices_no_shared_lr_run_before_or_after_the_choice(tmp_path):
    study = tuned_study(tmp_path, "--no-tune-shared")
    assert ablation.tune_cost(study).shared[0] == 0  # shared on: up to each config's 3 seeds, 6 (below)
    assert ablation.tune_cost(tuned_study(sub(tmp_path, "on"))).shared[0] == 6
    ablation.run_study(study, FakeTrainer(study.sweep_dir))
    cost = ablation.tune_cost(study)
    assert cost.chosen and cost.shared[0] == 0 and cost.study[0] == 6
    result = invoke("ablate", spec_at(tmp_path), "--runs-dir", tmp_path / "runs", "--tune-lr", "--tune-points", "3",
                    "--tune-extend", "1", "--no-tune-shared", "--dry-run")
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "1 more past an edge; then the study at the frozen LRs, 6 runs" in text
    assert "no run at the shared LR 0.003 beside it" in text and "at the shared LR 0.003 where" not in text


def test_a_rerun_with_shared_turned_the_other_way_is_refused(tmp_path):
    grid = ["--tune-lr", "--tune-points", "3", "--tune-extend", "1"]
    for name, was, rerun, fragment in (("off", ["--no-tune-shared"], [], "tuned without the shared-LR runs beside "
                                        "the study ([tune] shared = false): rerun with --no-tune-shared"),
                                       ("on", [], ["--no-tune-shared"], "tuned with the shared-LR runs beside the "
                                        "study ([tune] shared = true): rerun with --tune-shared")):
        study = tuned_study(sub(tmp_path, name), *was)
        ablation.run_study(study, FakeTrainer(study.sweep_dir))
        before = sorted(p.name for p in study.sweep_dir.iterdir())
        one_error_line(invoke("ablate", spec_at(tmp_path / name), "--runs-dir", tmp_path / name / "runs", *grid,
                              *rerun), fragment)
        assert sorted(p.name for p in study.sweep_dir.iterdir()) == before
    spec = spec_at(sub(tmp_path, "spec"), {"points": 3, "extend": 1, "shared": False})  # the spec's table says it too
    study = plan_study(Ask(spec=spec, runs_dir=tmp_path / "spec" / "runs", stack="off"))
    ablation.run_study(ablation.size_study(study), FakeTrainer(study.sweep_dir))
    assert invoke("ablate", spec, "--runs-dir", tmp_path / "spec" / "runs", "--dry-run").exit_code == 0
    one_error_line(invoke("ablate", spec, "--runs-dir", tmp_path / "spec" / "runs", "--tune-shared", "--dry-run"),
                   "rerun with --no-tune-shared")


def test_shared_off_an_arm_not_tuned_trains_nothing_past_its_selection(tmp_path):
    study = tuned_study(tmp_path, "--no-tune-shared")
    trainer = FakeTrainer(study.sweep_dir, optimum={"2017": 3e-3, "2017+rope": 1e-1})  # far past the top edge
    ablation.run_study(study, trainer)
    assert records.read_tune(study.sweep_dir).chosen == {"2017": 3e-3, "2017+rope": None}
    rope = {p.run_id for p in study.plan if p.slug == "2017+rope"}
    assert not rope & set(trainer.trained) and len(trainer.trained) == 6 + 1 + 3  # its grid, 1 extension; 2017's 3


def test_decide_rounds_run_at_the_frozen_lrs_with_shared_off(tmp_path):

    study = tuned_study(tmp_path, "--max-seeds", "6", "--decide-step", "3", "--no-tune-shared", decide=True)
    trainer = FakeTrainer(study.sweep_dir, noise=0.03, gain=0.07)  # as the shared-on rounds test above
    done = ablation.run_study(study, trainer)
    rounds_ = records.read_decide(study.sweep_dir).rounds
    assert done.rounds is not None and len(rounds_) == 2 and rounds_[0].open == ["rope add-one"]
    later = [r for r in trainer.trained if "-s1340-" in r or "-s1341-" in r or "-s1342-" in r]
    assert len(later) == 6  # each seed: 2017 at its frozen LR and 2017+rope at its own, nothing at the shared LR
    at_shared = {p.run_id for p in study.plan_at(6) if p.slug == "2017"}  # 2017 at 3e-3, its LR 6e-3
    assert len(at_shared) == 6 and not at_shared & set(trainer.trained)


def test_a_rerun_counts_its_own_selection_runs_as_the_study_s(tmp_path):
    """A rerun (all LRs frozen) reports on every run of the folder as its own: the selection runs the earlier
    invocation trained are this study's, not 'more from earlier plans' (issue 48)."""
    study = tuned_study(tmp_path)
    first = ablation.run_study(study, FakeTrainer(study.sweep_dir))
    again = ablation.run_study(tuned_study(tmp_path), FakeTrainer(study.sweep_dir))
    held = len(runs.find_runs(study.sweep_dir))
    assert len(first.statuses) == len(again.statuses) == held == 16
    assert again.count(runs.COMPLETED) == held


class Diverging(FakeTrainer):
    """Every selection run diverges (no best val loss); the study's seeds never train."""

    def __call__(self, todo):
        for p in todo:
            run_dir = self.root / p.run_id
            run_dir.mkdir(parents=True, exist_ok=True)
            (run_dir / runs.CONFIG).write_text(json.dumps(p.config.model_dump(mode="json")))
            (run_dir / runs.SUMMARY).write_text(json.dumps({"status": "diverged", "best_val_loss": None}))
        return [runs.DIVERGED] * len(todo)


def test_a_selection_whose_every_lr_diverged_says_so_not_widen_the_grid(tmp_path):
    study = tuned_study(tmp_path)
    ablation.run_study(study, Diverging(study.sweep_dir))
    record = records.read_tune(study.sweep_dir)
    assert all(a.reason == "not tuned: every LR diverged" for a in record.arms)
    line = lr_study.untuned_line(record)
    assert line.startswith("--tune-lr: no config was tuned (every LR of each diverged, the lowest 0.0015)")
    assert "lower train.lr" in line and "edge" not in line and "widen" not in line
    edge = record.model_copy(update={"arms": [record.arms[0].model_copy(update={"reason": "not tuned: best at the "
                                                                                "edge (the highest LR)"}),
                                              record.arms[1]]})
    assert "(1 best at the grid's edge, 1 with every LR diverged): no tuned verdict; widen the grid" in \
        lr_study.untuned_line(edge)
    (tmp_path / "t").mkdir()
    other = tuned_study(tmp_path / "t")
    assert lr_study.untuned_line(ablation.run_study(other, FakeTrainer(other.sweep_dir)).tune) is None  # one tuned

"""study.ablation: what `anatomy ablate` asks, resolved once (flag over spec), refused before anything is
written, and the closing line that counts every run of the plan."""

from __future__ import annotations

from helpers import asked, invoke, one_error_line
from toy_data import write_spec

from anatomy_cli.cli.sweep import closing_line
from anatomy_cli.store import records, runs
from anatomy_cli.study import ablation
from anatomy_cli.study.ablation import Ask, StudyDone, plan_study


def spec_at(tmp_path, **top):
    return write_spec(tmp_path, top={"seeds": 3, "flips": ["rope"], "directions": ["add-one"], **top})


def test_flags_override_the_specs_decide_table_once(tmp_path):
    spec = spec_at(tmp_path, decide={"max_seeds": 6, "step": 1, "budget": "1h"}, min_effect=0.05)
    study = plan_study(Ask(spec=spec, runs_dir=tmp_path / "runs"))
    assert study.rounds.looks == [3, 4, 5, 6] and study.rounds.budget_s == 3600 and study.margin == 0.05
    study = plan_study(asked(spec, "--max-seeds", "7", "--decide-step", "2", "--budget", "30m", "--margin", "0.01",
                             runs_dir=tmp_path / "runs"))
    assert study.rounds.looks == [3, 5, 7] and study.rounds.budget == "30m" and study.rounds.margin == 0.01
    (tmp_path / "plain").mkdir()
    plain = plan_study(Ask(spec=spec_at(tmp_path / "plain"), runs_dir=tmp_path / "other"))
    assert plain.rounds is None and plain.margin is None
    assert plan_study(Ask(spec=spec, runs_dir=tmp_path / "runs", time_pass=True)).rounds is None  # --time times


def test_decide_from_fewer_seeds_than_a_call_needs_is_refused(tmp_path):
    one_error_line(invoke("ablate", spec_at(tmp_path), "--runs-dir", tmp_path / "runs", "--decide", "--seeds", "2",
                          "--dry-run"), "a call needs 3: give --seeds 3 or more")


def test_a_specs_bad_budget_is_named_as_the_specs(tmp_path):
    spec = spec_at(tmp_path, decide={"budget": "0"})
    one_error_line(invoke("ablate", spec, "--runs-dir", tmp_path / "runs", "--dry-run"),
                   "decide.budget: '0' is not a time")


def test_a_plain_ablate_on_a_decided_folder_is_refused_before_anything_is_written(tmp_path):
    spec = spec_at(tmp_path)
    root = tmp_path / "runs" / "toy"
    root.mkdir(parents=True)
    records.write_decide(root, records.DecideRecord(looks=[3, 5], alpha=0.025))
    before = sorted(p.name for p in root.iterdir())
    for extra in ([], ["--seeds", "6"], ["--dry-run"]):
        one_error_line(invoke("ablate", spec, "--runs-dir", tmp_path / "runs", *extra), "was decided in rounds")
    assert sorted(p.name for p in root.iterdir()) == before
    assert invoke("ablate", spec, "--runs-dir", tmp_path / "runs", "--decide", "--max-seeds", "5",
                  "--dry-run").exit_code == 0  # the same plan of looks goes on


def test_the_closing_line_counts_every_run_of_the_plan(tmp_path):
    done = StudyDone([runs.COMPLETED] * 8 + [runs.INTERRUPTED] * 2 + [None] * 6, 61.0)
    line = closing_line(done, tmp_path)
    assert line.startswith("8 completed, 0 diverged, 0 failed, 2 interrupted (rerun to resume), 6 never started "
                           "(rerun to train them) of 16 runs")


def test_run_study_without_decide_trains_the_plan_once(tmp_path):
    study = ablation.size_study(plan_study(Ask(spec=spec_at(tmp_path), runs_dir=tmp_path / "runs", stack="off")))
    asked = []
    done = ablation.run_study(study, lambda todo: asked.append(len(todo)) or [runs.COMPLETED] * len(todo))
    assert asked == [len(study.plan)] == [6] and done.rounds is None and done.count(runs.COMPLETED) == 6

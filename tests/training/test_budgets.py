"""A budget ladder's plan (training/budgets.py): the stable run, its kept steps, the branches, the cost in
steps, and the refusals. No training."""

from __future__ import annotations

import pytest

from anatomy_cli.spec.config import ConfigError, RunConfig, validate
from anatomy_cli.store import runs
from anatomy_cli.training.budgets import branch_config, branch_problem, budget_ladder


def base(**train) -> RunConfig:
    return validate(RunConfig, {"train": {"steps": 300, "warmup": 50, "schedule": "wsd", **train}})


def test_one_stable_run_keeps_a_checkpoint_at_each_smaller_budgets_decay_start():
    ladder = budget_ladder(base(), [100, 150, 200, 300])
    stable, *branches = ladder.runs
    assert stable.budget == 300 and stable.start == 0 and stable.parent is None
    assert stable.config.train.keep_checkpoints == (80, 120, 160)  # 20 % decays: 100 - 20, 150 - 30, 200 - 40
    assert [(b.budget, b.start, b.parent, b.trained) for b in branches] == [(100, 80, 300, 20), (150, 120, 300, 30),
                                                                          (200, 160, 300, 40)]
    assert all(b.config.train.keep_checkpoints == () and b.config.train.steps == b.budget for b in branches)
    assert ladder.cost_steps == 300 + 20 + 30 + 40 and ladder.independent_steps == 750
    assert ladder.ratio == pytest.approx(390 / 300)
    assert all(branch_problem(stable.config, b.config, b.start) is None for b in branches)


def test_branches_keep_the_run_ids_of_runs_trained_to_their_budgets():
    ladder = budget_ladder(base(), [100, 300])
    ids = [runs.config_hash(r.config.model_dump(mode="json")) for r in ladder.runs]
    alone = [runs.config_hash(base(steps=s).model_dump(mode="json")) for s in (300, 100)]
    assert ids == alone  # kept checkpoints never move a result, so never an id


def test_geometric_budgets_cost_under_one_and_a_fifth_runs():
    ladder = budget_ladder(base(steps=800, warmup=20), [100, 200, 400, 800])
    assert ladder.ratio == pytest.approx((800 + 20 + 40 + 80) / 800)  # 1.175 against 1.875 independent


@pytest.mark.parametrize("budgets, fragment", [
    ([200, 100], "budgets must increase"), ([100, 100], "budgets must increase"), ([0, 100], "each above 0"),
    ([], "one budget or more")])
def test_budgets_that_do_not_increase_are_refused(budgets, fragment):
    with pytest.raises(ConfigError, match=fragment) as err:
        budget_ladder(base(), budgets)
    assert "\n" not in str(err.value)


def test_a_decay_longer_than_its_stable_phase_is_refused():
    with pytest.raises(ConfigError, match=r"budget 80: its decay \(16 steps.* longer than its stable phase \(14 steps"):
        budget_ladder(base(), [80, 300])  # 80 - 16 - 50 = 14 flat steps before a 16-step decay
    with pytest.raises(ConfigError, match="train.schedule = \"wsd\""):
        budget_ladder(validate(RunConfig, {"train": {"schedule": "cosine"}}), [100, 200])


def test_branch_problem_names_what_differs():
    stable = budget_ladder(base(), [100, 300]).stable.config
    assert "train.lr" in branch_problem(stable, branch_config(base(lr=1e-3), 100), 80)
    assert "model.d_model" in branch_problem(stable, branch_config(
        validate(RunConfig, {"model": {"d_model": 64}, "train": base().train.model_dump()}), 100), 80)
    assert "stable phases" in branch_problem(stable, branch_config(base(), 100), 81)

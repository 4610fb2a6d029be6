"""A budget ladder's plan: the loss at several token budgets from one warmup-stable-decay run and short
decays branched off its stable phase (Hägele et al. 2024, arXiv 2405.18392, sec. 4). No torch: a study
plans with it before anything trains (`ablate --dry-run`).

  budget_ladder   a base RunConfig and increasing budgets (steps) -> BudgetLadder: the stable run (the
                  largest budget, keeping a checkpoint at each smaller budget's decay start) and one
                  decay branch per smaller budget, with what the ladder costs in steps
  branch_config   a run's config as a branch of it: train.steps the branch's budget, nothing kept
  branch_problem  why a config cannot be a decay branched from a parent at a step (None: it can)

Why it works. Under train.schedule = "wsd" the learning rate is warmup then flat until train.decay_start
(training/trainer.py lr_at), and nothing before the decay depends on train.steps: a run to budget B and a
run to any larger budget are the same run, step for step, up to B's decay start S = B - round(decay_frac
x B). So the larger run's checkpoint at S (kept-S.pt: train.keep_checkpoints) plus B - S steps of decay
is the run to B (training/branch.py; tests/training/test_branch.py checks the weights and metrics are
the ones a run trained to B from step 0 has). Each arm's stable phase is trained once, to the largest
budget; every smaller budget then costs only its decay: cost = B_max + sum of the smaller budgets'
decays, against sum B_k for independent runs (budgets 1, 2, 4, 8 x and a 20 % decay: 1.18x one run
instead of 1.88x).

Refused (ConfigError, one line): budgets that do not increase, a schedule other than wsd, a decay
longer than its budget's stable phase (it would start inside the warmup, or leave less flat learning
rate than it decays over).
"""

from __future__ import annotations

from dataclasses import dataclass

from anatomy_cli.spec.config import NO_RESULT, ConfigError, RunConfig, TrainConfig


@dataclass(frozen=True)
class BudgetRun:
    """One run of a budget ladder: its budget (steps), its config, and where it starts: the stable run
    starts at step 0 (parent None); a branch at `start`, from the stable run's kept checkpoint there."""

    budget: int
    config: RunConfig
    start: int = 0
    parent: int | None = None  # the budget of the run it branches from

    @property
    def trained(self) -> int:
        """The steps this run trains itself."""
        return self.budget - self.start


@dataclass(frozen=True)
class BudgetLadder:
    """The stable run first, then the branches, smallest budget first; what the ladder costs in steps."""

    runs: tuple[BudgetRun, ...]

    @property
    def stable(self) -> BudgetRun:
        return self.runs[0]

    @property
    def cost_steps(self) -> int:
        """Steps trained: the stable run's to the largest budget, plus each branch's decay."""
        return sum(r.trained for r in self.runs)

    @property
    def independent_steps(self) -> int:
        """Steps the same budgets cost as runs of their own, each from step 0."""
        return sum(r.budget for r in self.runs)

    @property
    def ratio(self) -> float:
        """cost_steps in units of one run to the largest budget (1.18 for budgets 1, 2, 4, 8 x at 20 %)."""
        return self.cost_steps / self.stable.budget


def _with_train(cfg: RunConfig, **train) -> RunConfig:
    return cfg.model_copy(update={"train": TrainConfig.model_validate({**cfg.train.model_dump(), **train})})


def branch_config(cfg: RunConfig, steps: int) -> RunConfig:
    """cfg as a decay to `steps` branched off a run of it: train.steps the budget, no checkpoint kept (a
    branch is no one's parent), everything else as the parent has it."""
    return _with_train(cfg, steps=steps, keep_checkpoints=())


def budget_ladder(base: RunConfig, budgets) -> BudgetLadder:
    """The plan of a budget ladder over `budgets` (train steps, increasing) for base (train.schedule "wsd"):
    the stable run to the largest, keeping a checkpoint at each smaller budget's decay start, then one
    branch per smaller budget. ConfigError (one line) for budgets that do not increase, another schedule,
    or a decay longer than its budget's stable phase."""
    budgets = [int(b) for b in budgets]
    if not budgets:
        raise ConfigError("a budget ladder needs one budget or more (train steps)")
    if any(b <= a for a, b in zip(budgets, budgets[1:])) or budgets[0] <= 0:
        raise ConfigError(f"budgets must increase, each above 0: got {', '.join(map(str, budgets))}")
    if base.train.schedule != "wsd":
        raise ConfigError(f"a budget ladder branches decays off a stable phase: set train.schedule = \"wsd\" "
                          f"(got {base.train.schedule!r})")
    configs = [branch_config(base, b) for b in budgets]
    for cfg in configs:
        _check_decay(cfg.train)
    starts = [c.train.decay_start for c in configs[:-1]]
    stable = BudgetRun(budgets[-1], _with_train(configs[-1], keep_checkpoints=tuple(starts)))
    branches = [BudgetRun(b, c, c.train.decay_start, budgets[-1]) for b, c in zip(budgets, configs[:-1])]
    return BudgetLadder((stable, *branches))


def _check_decay(t: TrainConfig) -> None:
    stable = t.decay_start - t.warmup  # steps at the peak LR before the decay
    if t.decay_steps > stable:
        raise ConfigError(f"budget {t.steps}: its decay ({t.decay_steps} steps, train.decay_frac={t.decay_frac:g}) is "
                          f"longer than its stable phase ({max(stable, 0)} steps after train.warmup={t.warmup}); "
                          f"lower train.decay_frac or train.warmup, or drop this budget")


# Train settings a branch may hold otherwise than its parent: its budget, and what never moves a result.
FREE = ("steps", *(k for k, f in TrainConfig.model_fields.items() if f.json_schema_extra == NO_RESULT))


def branch_problem(parent: RunConfig, cfg: RunConfig, step: int) -> str | None:
    """Why cfg cannot continue from parent's checkpoint at `step` as if trained from step 0 (None: it can):
    both wsd, the same config but for train.steps and the settings that never move results (and the
    name), and `step` inside both stable phases (from it on, cfg's learning rate is its own)."""
    if parent.train.schedule != "wsd" or cfg.train.schedule != "wsd":
        return "both runs must have train.schedule = \"wsd\" (a stable phase to branch from)"
    differ = [f"train.{k}" for k in TrainConfig.model_fields
              if k not in FREE and getattr(parent.train, k) != getattr(cfg.train, k)]
    differ += [f"{section}.{k}" for section in ("model", "data")
               for k, v in getattr(cfg, section) if getattr(getattr(parent, section), k) != v]
    differ += ["seed"] if parent.seed != cfg.seed else []
    if differ:
        return f"it differs from the parent in {', '.join(differ)}: a branch is the parent's run with another budget"
    if not 0 < step <= min(parent.train.decay_start, cfg.train.decay_start):
        return (f"step {step} is not inside both stable phases (the parent decays from step "
                f"{parent.train.decay_start}, the branch from {cfg.train.decay_start})")
    return None

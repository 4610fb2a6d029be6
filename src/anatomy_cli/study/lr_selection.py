"""Fair learning rates, once: each arm's LR picked on selection seeds from a log-spaced grid, then frozen (no torch).

An arm (a config of the plan) trained at one shared `train.lr` measures how it reacts to that LR, not
what its component is worth: a component that moves the optimum by a factor r on a curve of curvature c
per (log2 LR)^2 adds about c (log2 r)^2 to its gain. So every arm trains a grid of LRs on selection
seeds disjoint from the study's, its LR is frozen at the grid's best, and the study's seeds then train
each arm at its own LR (issue 36). The calls stay honest about the gain at the frozen LRs because no
study seed saw the choice; how near each frozen LR is to its arm's optimum is the selection's own error.

The grid: `points` LRs center x factor^k for integer k from -points//2 to +points//2 (an odd count, so
the shared LR is a candidate and every LR, extensions included, is center x factor^k for an integer k:
its run id never drifts by rounding; an even count would have to leave the center out or favour one
side). Default 5 points at factor 2 (the factor-2 grids of Wen et al. 2025).

The rule: each arm's LR is the grid point of lowest selection loss (the mean over the selection seeds of
each run's best validation loss, capped: a diverged run, NaN or above the initial loss, counts at the
initial loss, ln V for a char model, never dropped). Ties go to the point nearer the center, then the
lower LR. If the best point is the grid's highest or lowest and extensions remain (`extend`, default 2),
the next point past that edge is trained; past the last extension an arm whose best is still at an edge
is not tuned (lr None: it gets no tuned call), and so is one whose every LR diverged.

Smoothing (rule PARABOLA, not the default): the same selection, then the vertex of the quadratic in log
LR through the best point and its two neighbours (within half a step of the best point; Marin's fit
over the whole grid is the one the issue warns is biased on wide, off-centre or lopsided grids).
benchmarks/calibrate_tuning.py drives both through this loop (RESULTS.md, "Tuned learning rates:
calibration"): with one selection seed the argmin is one or two steps off often enough on flat or noisy
curves that a study powerful enough calls the gain that choice made (against each arm at its optimum,
4-8 % family-wise error at 3 study seeds, 22-26 % at 10 on flat curves), and the vertex, averaging three
points, cuts that (3-7 %; 6-14 %). The argmin stays the default until a study adopts the parabola with
its record and its tests; its chosen LRs are grid points, each with its selection runs.

The sensitivity (Wortsman et al. 2023, "Small-scale proxies for large-scale Transformer training
instabilities"): the mean over the grid's points of min(loss, initial loss) minus the best of them. It
is taken over the grid's own points, which every arm shares (not its extensions), so two arms' numbers
compare.

  Grid           the selection plan: center, points, factor, extensions, selection seeds, rule (validated)
  Job            one selection run: (arm, lr, seed)
  capped         a run's selection loss, a divergence at the initial loss
  Choice         one arm's outcome: the LRs trained, their losses, the chosen LR or why none
  choose         the rule on one arm's losses (no extension): the Choice
  vertex         the parabola rule's step from the best point, in grid steps
  run_selection  the loop, over any trainer and reader: the grid, then the extensions, resumable
  frozen         {arm: lr} of the tuned arms
  Unfinished     raised when runs asked for are still missing after training
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

ARGMIN, PARABOLA = "argmin", "parabola"
RULES = (ARGMIN, PARABOLA)


@dataclass(frozen=True, kw_only=True)
class Grid:
    """The LRs every arm is tried at, on `seeds` (the selection seeds: disjoint from the study's, which
    `disjoint` checks); up to `extend` more points past the edge its best lands on."""

    center: float
    seeds: tuple[int, ...]
    points: int = 5
    factor: float = 2.0
    extend: int = 2
    rule: str = ARGMIN  # or PARABOLA: measured in benchmarks/calibrate_tuning.py, not yet what a study uses

    def __post_init__(self):
        object.__setattr__(self, "seeds", tuple(self.seeds))
        if self.rule not in RULES:
            raise ValueError(f"the LR rule must be one of {', '.join(RULES)}, not {self.rule!r}")
        if isinstance(self.points, bool) or not isinstance(self.points, int) or self.points < 3 or self.points % 2 == 0:
            raise ValueError(f"the LR grid needs an odd number of points, at least 3 (so the center is one of them), "
                             f"not {self.points!r}")
        if not (isinstance(self.center, (int, float)) and math.isfinite(self.center) and self.center > 0):
            raise ValueError(f"the LR grid's center (train.lr) must be a positive finite number, not {self.center!r}")
        if not (isinstance(self.factor, (int, float)) and math.isfinite(self.factor) and self.factor > 1):
            raise ValueError(f"the LR grid's factor must be a finite number above 1, not {self.factor!r}")
        if isinstance(self.extend, bool) or not isinstance(self.extend, int) or self.extend < 0:
            raise ValueError(f"the LR grid's extensions must be a count >= 0, not {self.extend!r}")
        seeds = list(self.seeds)
        if not seeds or len(set(seeds)) != len(seeds) or not all(type(s) is int for s in seeds):
            raise ValueError(f"the selection seeds must be a non-empty list of distinct integers, not {seeds}")

    @property
    def half(self) -> int:
        return self.points // 2

    def ks(self) -> range:
        """The grid's exponents: -half .. +half."""
        return range(-self.half, self.half + 1)

    def lr(self, k: int) -> float:
        """center x factor^k, from the integer k (never by repeated multiplication: the same k, the same float)."""
        return self.center * self.factor ** k

    def lrs(self) -> list[float]:
        """The grid's LRs, ascending; the middle one is the center exactly."""
        return [self.lr(k) for k in self.ks()]

    def disjoint(self, study_seeds: Sequence[int]) -> None:
        """Raise ValueError when a selection seed is also a study seed (the choice would see the study's data)."""
        both = sorted(set(self.seeds) & set(study_seeds))
        if both:
            raise ValueError(f"the selection seeds must not be study seeds: {', '.join(map(str, both))} "
                             f"{'is' if len(both) == 1 else 'are'} both")


class Job(NamedTuple):
    """One selection run; a plain (arm, lr, seed) tuple is the same key."""

    arm: str
    lr: float
    seed: int


class Unfinished(Exception):
    """Selection runs that were asked for and are still not in read() after training (failed, interrupted):
    no LR is chosen from a grid with holes; rerunning resumes."""

    def __init__(self, missing: list[Job]):
        self.missing = missing
        super().__init__(f"{len(missing)} selection run{'s' * (len(missing) > 1)} did not finish: no LR chosen; "
                         f"rerun the same command to resume")


def capped(loss, initial_loss: float) -> float:
    """A run's selection loss: its best validation loss, or the initial loss when it diverged (None, NaN,
    inf, or above the initial loss: it learned nothing a lower LR would not). Never dropped."""
    if loss is None:
        return float(initial_loss)
    loss = float(loss)
    return loss if math.isfinite(loss) and loss <= initial_loss else float(initial_loss)


@dataclass(frozen=True)
class Choice:
    """One arm's selection: every LR it trained (ascending, extensions included) and its capped mean
    selection loss there; the chosen LR (None: not tuned) and why; its best loss and sensitivity."""

    arm: str
    lrs: tuple[float, ...]
    losses: tuple[float, ...]
    lr: float | None
    tuned: bool
    reason: str
    best_loss: float
    sensitivity: float
    extended: int = 0  # points trained past the grid's edge
    point: float | None = None  # the best point's LR, where the arm is tuned (lr itself, by the argmin rule)


INSIDE = "best inside the grid"
DIVERGED = "not tuned: every LR diverged"


def _best(ks: Sequence[int], losses: Sequence[float]) -> int:
    """The index of the lowest loss; ties: the point nearer the center (smaller |k|), then the lower LR."""
    return min(range(len(ks)), key=lambda i: (losses[i], abs(ks[i]), ks[i]))


def choose(arm: str, grid: Grid, ks: Sequence[int], losses: Sequence[float], initial_loss: float) -> Choice:
    """The rule on one arm's mean capped losses at center x factor^k for the exponents `ks` (the grid's
    and any extensions, in any order), with no further extension: the lowest loss, inside the trained
    points, is chosen; at an edge or when every LR diverged, none is."""
    order = sorted(range(len(ks)), key=lambda i: ks[i])
    ks, losses = [ks[i] for i in order], [float(losses[i]) for i in order]
    i = _best(ks, losses)
    on_grid = [loss for k, loss in zip(ks, losses) if abs(k) <= grid.half]
    sensitivity = float(np.mean(np.minimum(on_grid, initial_loss)) - min(on_grid))
    extended = len(ks) - grid.points
    after = f" after {extended} extension{'s' * (extended != 1)}" if extended else ""
    if losses[i] >= initial_loss:
        lr, reason = None, DIVERGED
    elif 0 < i < len(ks) - 1:
        lr, reason = grid.lr(ks[i]), INSIDE + (f", once extended {extended} point{'s' * (extended > 1)} "
                                                f"{'up' if ks[-1] > grid.half else 'down'}" if extended else "")
    else:
        lr, reason = None, f"not tuned: best at the edge (the {'highest' if i else 'lowest'} LR){after}"
    point = lr
    if lr is not None and grid.rule == PARABOLA:
        lr = grid.center * grid.factor ** (ks[i] + vertex(*losses[i - 1: i + 2]))
    return Choice(arm, tuple(grid.lr(k) for k in ks), tuple(losses), lr, lr is not None, reason, losses[i],
                  sensitivity, extended, point)


def vertex(below: float, best: float, above: float) -> float:
    """The parabola rule's step from the best point, in grid steps: the vertex of the quadratic in log LR
    through the best point and its two neighbours, (below - above) / (2 (below - 2 best + above)). The best
    point being the lowest of the three, the vertex lies within half a step of it; 0 when all three tie."""
    curve = below - 2 * best + above
    return (below - above) / (2 * curve) if curve > 0 else 0.0


def _loss(done: Mapping, arm: str, lr: float, seeds: Sequence[int], initial_loss: float) -> float:
    return float(np.mean([capped(done[(arm, lr, s)], initial_loss) for s in seeds]))


def run_selection(arms: Sequence[str], grid: Grid, train: Callable[[list[Job]], object], read: Callable[[], Mapping],
                  initial_loss: float, *, say: Callable[[str], None] = lambda line: None) -> dict[str, Choice]:
    """Train the grid for every arm on the selection seeds (one batch), then, while an arm's best sits at
    an edge with extensions left, the next LR past that edge (every such arm in one batch per step), and
    return each arm's Choice.

    train(jobs) trains a list of Jobs (its return value is not read); read() -> {(arm, lr, seed): best
    validation loss, or None/NaN for a diverged run} of every selection run done so far (the runs of
    earlier invocations included: only the jobs it lacks are trained, so a rerun resumes, and takes the
    same extensions from the same losses). A job asked for and still missing after training raises
    Unfinished. say(line) tells progress.
    """
    ks = {arm: list(grid.ks()) for arm in arms}
    while True:
        done = read()
        todo = [Job(arm, grid.lr(k), s) for arm in arms for k in ks[arm] for s in grid.seeds
                if (arm, grid.lr(k), s) not in done]
        if todo:
            say(f"LR selection: training {len(todo)} run{'s' * (len(todo) > 1)}")
            train(todo)
            done = read()
            missing = [j for j in todo if j not in done]
            if missing:
                raise Unfinished(missing)
        more = {}
        for arm in arms:
            losses = [_loss(done, arm, grid.lr(k), grid.seeds, initial_loss) for k in ks[arm]]
            i, lo, hi = _best(ks[arm], losses), min(ks[arm]), max(ks[arm])
            if len(ks[arm]) - grid.points < grid.extend and losses[i] < initial_loss and ks[arm][i] in (lo, hi):
                more[arm] = hi + 1 if ks[arm][i] == hi else lo - 1
        if not more:
            break
        say(f"LR selection: best at an edge for {len(more)} arm{'s' * (len(more) > 1)}: one more LR past it")
        for arm, k in more.items():
            ks[arm].append(k)
    return {arm: choose(arm, grid, ks[arm], [_loss(done, arm, grid.lr(k), grid.seeds, initial_loss)
                                            for k in ks[arm]], initial_loss) for arm in arms}


def frozen(choices: Mapping[str, Choice]) -> dict[str, float]:
    """{arm: chosen LR} of the tuned arms (an untuned arm has none: it gets no tuned call)."""
    return {arm: c.lr for arm, c in choices.items() if c.tuned}

"""Calibration of fair learning rates (issue 36): arms with known LR curves through the real selection loop and verdict.

Each simulated family is one add-one study: a reference arm and five variants (the five LLaMA parts added
to it), five effects judged together by report.stats.judge at alpha 0.05 and the default margin. Every arm
has a known curve of its best validation loss against x = log2(LR / train.lr):

    loss(x) = best + c_lo (x - opt)^2 below opt, c_hi (x - opt)^2 above it; NaN (diverged) past opt + cliff

and each run (arm, LR, seed) adds a per-seed common term (sd SEED_SD: the seed's data order and init,
shared by every arm and LR of that seed, so it cancels in the paired differences) and its own noise (sd
RUN_SD: paired sd RUN_SD x sqrt 2 = 0.04, the demo's). Selection seeds and study seeds are independent
draws. A true effect is what the component is worth with each arm at its own optimum: the reference's best
minus the variant's; a false call is helps/hurts on an effect whose truth is 0 or of the other sign.

Four rules, on the same simulated runs (common random numbers: a run at the same arm, LR and seed is the
same run under every rule):
  tuned (argmin)    study.lr_selection.run_selection on the selection seeds (the loop `anatomy ablate --tune-lr`
                    runs: the grid, then extensions at an edge), each arm frozen at its best grid point, then
                    the study seeds at those LRs judged; an arm not tuned gives its effects no call
  tuned (parabola)  the same selection with the rule study.lr_selection.PARABOLA: the vertex of the quadratic in
                    log LR through the best point and its neighbours, and study runs of its own at that LR
  shared LR         every arm at train.lr, the study seeds judged (today's studies)
  naive             run_selection on the study seeds themselves (argmin), those same runs judged

Settings (the five variants' curves; the reference's: opt 0, best 2.0, sharp unless said)
  equal curves          every curve the same: the null
  shift x2 / x4         the optimum moved by a factor 2 or 4 (one or two doublings, up and down in turn),
    sharp / flat        best equal (true effects 0); curvature SHARP 0.1 or FLAT 0.02 per (log2 LR)^2
  shift x4, lopsided    Marin's shape: c 0.04 below the optimum, 0.13 above, divergence 1.5 doublings
    + cliff             above it (the reference's highest grid LR diverges)
  shift x2.8, off-grid  optima between grid points (reference at +0.3, variants +0.3 +/- 1.5): argmin's
                        grid error against the parabola's
  flatter curve         the component widens the stable range (QK-norm, z-loss): variants flat, same optimum
  gain                  the first variant better by GAIN, no shift (the rest null)
  gain + shift x4       the first variant better by GAIN with its optimum two doublings up (the rest shifted)

Measures per (setting, rule): the family-wise error (P(any false helps/hurts) over the null effects, the
truth being each arm at its own optimum) with its Monte-Carlo sd; the same at the LRs the rule used (a
call of the wrong sign against the true gain between the two LRs the study trained: what the verdict
itself promises); P(the true gain is called helps) where there is one; the arms not tuned; the arms whose
LR costs more than the margin; the regret (the true loss at the LR used minus the arm's best, mean over
arms); and the bias (the root mean square over effects of the mean gain's error against the truth).

Cost: ~60 ms a family on one loaded core (4 rules x 5 effects through stats.paired and stats.judge, then
the selection loops); the default 400 families x 11 settings: ~4 minutes on 2 busy cores.

    python benchmarks/calibrate_tuning.py                      # prints the table
    python benchmarks/calibrate_tuning.py --families 2000 --append
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import calibrate_verdict as cv
import numpy as np

from anatomy_cli.report import lr_allowance, stats
from anatomy_cli.spec.components import FIVE
from anatomy_cli.spec.roles import ADD_ONE, REFERENCE, variant
from anatomy_cli.store import records as record_mod
from anatomy_cli.study.lr_selection import PARABOLA, Grid, run_selection

CENTER = 1e-3  # train.lr
INITIAL = math.log(65)  # ln V of a 65-character vocabulary: a diverged run's loss
BEST = 2.0
SHARP, FLAT = 0.1, 0.02
RUN_SD = cv.SIGMA / math.sqrt(2)  # own noise of a run: paired sd cv.SIGMA
SEED_SD = cv.END_SD  # the seed's common term
GAIN = 0.3  # a true gain: 7.5 paired sds (3 seeds at Bonferroni 5 need about that)
STUDY_SEEDS = (1, 2, 3)
SELECTION_SEEDS = (1001,)
ROLES = [REFERENCE, *(variant(f, ADD_ONE) for f in FIVE)]
SMALL_GAIN = 0.08  # 2 paired sds: what 10 study seeds call about 4 times in 5 without the allowance
TUNED, BARE, SHARED, NAIVE, SMOOTH = ("tuned (argmin)", "tuned, no allowance", "shared LR", "naive",
                                      "tuned (parabola)")
RULES = (TUNED, BARE, SMOOTH, SHARED, NAIVE)
TEST_SETTING = "shift x4, sharp"


@dataclass(frozen=True)
class Curve:
    """An arm's best val loss against x = log2(LR / CENTER): a bowl around opt, lopsided, with a cliff."""

    opt: float = 0.0
    best: float = BEST
    c_lo: float = SHARP
    c_hi: float | None = None  # None: c_lo
    cliff: float = math.inf  # diverged (NaN) past opt + cliff

    def loss(self, x) -> np.ndarray:
        x = np.asarray(x, dtype=float)
        c = np.where(x < self.opt, self.c_lo, self.c_lo if self.c_hi is None else self.c_hi)
        return np.where(x > self.opt + self.cliff, np.nan, self.best + c * (x - self.opt) ** 2)


@dataclass(frozen=True)
class Setting:
    name: str
    variants: tuple[Curve, ...]
    reference: Curve = field(default_factory=Curve)
    noise: float = 1.0  # every run's own noise, in RUN_SD

    @property
    def curves(self) -> list[Curve]:
        return [self.reference, *self.variants]

    @property
    def truth(self) -> np.ndarray:
        """(5,) each effect's true gain: the reference's best minus the variant's (both at their optimum)."""
        return np.array([self.reference.best - v.best for v in self.variants])


def _turns(shift: float, **kw) -> tuple[Curve, ...]:
    """Five variants whose optima sit `shift` doublings up, down, up, down, up."""
    return tuple(Curve(opt=shift * (-1) ** i, **kw) for i in range(5))


NEAR_FLAT = 0.005
MISSED = stats.DEFAULT_MARGIN + 1e-9  # an arm whose LR costs more than the margin (a flat curve one step off: not)
LOPSIDED = {"c_lo": 0.04, "c_hi": 0.13, "cliff": 1.5}
SETTINGS = (
    Setting("equal curves", _turns(0.0)),
    Setting("shift x2, sharp", _turns(1.0)),
    Setting("shift x4, sharp", _turns(2.0)),
    Setting("shift x2, flat", _turns(1.0, c_lo=FLAT), Curve(c_lo=FLAT)),
    Setting("shift x4, flat", _turns(2.0, c_lo=FLAT), Curve(c_lo=FLAT)),
    Setting("shift x4, lopsided + cliff", _turns(2.0, **LOPSIDED), Curve(**LOPSIDED)),
    Setting("shift x2.8, off-grid", tuple(Curve(opt=0.3 + 1.5 * (-1) ** i) for i in range(5)), Curve(opt=0.3)),
    Setting("flatter curve", _turns(0.0, c_lo=FLAT)),
    Setting("flatter curve, noisy", _turns(0.0, c_lo=NEAR_FLAT), noise=3.0),
    Setting("gain", (Curve(best=BEST - GAIN), *_turns(0.0)[1:])),
    Setting("gain + shift x4", (Curve(opt=2.0, best=BEST - GAIN), *_turns(1.0)[1:])),
    Setting("small gain, flat", (Curve(best=BEST - SMALL_GAIN, c_lo=FLAT), *_turns(0.0, c_lo=FLAT)[1:]),
            Curve(c_lo=FLAT)),
    Setting("flat variants, sharp reference", _turns(0.0, c_lo=NEAR_FLAT)),
)


# ------------------------------------------------------------------------------- simulated runs


def grid_of(seeds) -> Grid:
    """The default grid (5 points at factor 2 around train.lr, 2 extensions) with the parabola rule: its
    Choices carry both the argmin (Choice.point, the rule a study uses) and the parabola's LR (Choice.lr)."""
    return Grid(center=CENTER, seeds=tuple(seeds), rule=PARABOLA)


def exponents(g: Grid) -> np.ndarray:
    """Every exponent a selection may train: the grid's and its extensions both ways."""
    reach = g.half + g.extend
    return np.arange(-reach, reach + 1)


def runs(rng: np.random.Generator, setting: Setting, families: int, n: int, common: np.ndarray,
         x: np.ndarray) -> np.ndarray:
    """(families, 6, len(x), n) losses at LRs 2^x x CENTER (x: (len(x),), or (families, 6, len(x)) per arm),
    with the seeds' common terms `common` (families, n) and fresh own noise; NaN: diverged."""
    x = np.broadcast_to(x, (families, len(ROLES), x.shape[-1]))
    mean = np.stack([c.loss(x[:, a]) for a, c in enumerate(setting.curves)], axis=1)
    own = RUN_SD * setting.noise * rng.normal(size=(*x.shape, n))
    return mean[..., None] + common[:, None, None, :] + own


def select(losses: np.ndarray, g: Grid) -> tuple[np.ndarray, np.ndarray, list[record_mod.TuneRecord]]:
    """Each arm's chosen exponent by the argmin and by the parabola (each (families, 6); NaN: not tuned) from
    study.lr_selection.run_selection over simulated runs `losses` (families, 6, exponents, seeds), and each
    family's tune.json record of the argmin's choices (arms named by their index: '0' the reference). All
    the families are one selection (every arm its own), as a study of many configs is: the trainer marks
    runs trained, the reader returns them."""
    ks, arms = exponents(g), [f"{f}/{a}" for f in range(losses.shape[0]) for a in range(len(ROLES))]
    at = {g.lr(int(k)): i for i, k in enumerate(ks)}
    seat = {s: i for i, s in enumerate(g.seeds)}
    done: dict = {}

    def train(jobs) -> None:
        for arm, lr, seed in jobs:
            f, a = map(int, arm.split("/"))
            done[(arm, lr, seed)] = float(losses[f, a, at[lr], seat[seed]])

    choices = list(run_selection(arms, g, train, lambda: done, INITIAL).values())
    point = np.array([math.nan if c.lr is None else float(ks[at[c.point]]) for c in choices])
    smooth = np.array([math.nan if c.lr is None else math.log2(c.lr / g.center) / math.log2(g.factor)
                       for c in choices])
    grid = record_mod.TuneGrid(center=g.center, points=g.points, factor=g.factor, extend=g.extend)
    arms_of = [[record_mod.TuneArm(arm=str(a), config="-", lrs=list(c.lrs), losses=list(c.losses), lr=c.point,
                                   tuned=c.tuned, reason=c.reason, best_loss=c.best_loss, sensitivity=c.sensitivity,
                                   extended=c.extended) for a, c in enumerate(choices[f * len(ROLES):][:len(ROLES)])]
               for f in range(losses.shape[0])]
    records = [record_mod.TuneRecord(grid=grid, seeds=list(g.seeds), rule="argmin", initial_loss=INITIAL, arms=a)
               for a in arms_of]
    return point.reshape(losses.shape[:2]), smooth.reshape(losses.shape[:2]), records


# ------------------------------------------------------------------------------- one setting


def judged(study: np.ndarray, used: np.ndarray, records=None) -> tuple[np.ndarray, np.ndarray]:
    """(calls, gains), each (families, 5), of study runs (families, 6, n) at the LRs a rule used (used:
    (families, 6) exponents, NaN: the arm not tuned, its effects no call) through the real verdict:
    stats.paired on each effect's paired gains (the reference minus the variant, seed by seed; a diverged
    run at the initial loss), with `records` (each family's tune.json) report.lr_allowance.allowance's widening
    for the selection's error (the reference the end, each variant its add-one; each effect's sd floored at
    the family's median, report.lr_allowance.family_sd, as a report does), then stats.judge over the family's
    effects at alpha 0.05 and the margin."""
    loss = np.where(np.isfinite(study), study, INITIAL)
    diffs = loss[:, :1] - loss[:, 1:]  # (families, 5, n): positive = the component helps
    ok = np.isfinite(used[:, :1]) & np.isfinite(used[:, 1:])
    calls = np.full(ok.shape, "", dtype=object)
    for f in range(len(diffs)):
        tested = np.flatnonzero(ok[f])
        rows = [stats.paired(diffs[f, i]) for i in tested]
        if records is not None:
            floor = lr_allowance.family_sd(r["sd"] for r in rows)
            rows = [r | lr_allowance.allowance(records[f], "0", str(1 + i), True, r["sd"], floor)
                    for r, i in zip(rows, tested)]
        rows = stats.judge(rows, stats.DEFAULT_MARGIN, stats.ALPHA)
        calls[f, tested] = [r["call"] for r in rows]
    return calls, np.where(ok, diffs.mean(axis=2), np.nan)


def run_setting(rng: np.random.Generator, setting: Setting, families: int, n_select: int = len(SELECTION_SEEDS),
                n_study: int = len(STUDY_SEEDS), rules=RULES, log=None) -> list[dict]:
    """One row per rule: fwer (and its Monte-Carlo sd), power, untuned, regret, bias."""
    t0 = time.perf_counter()
    pick, naive_grid = grid_of(range(1001, 1001 + n_select)), grid_of(range(1, 1 + n_study))
    ks, n = exponents(pick), n_study
    common = rng.normal(0, SEED_SD, (families, n))  # the study seeds' terms, shared by every run of a seed
    grid_runs = runs(rng, setting, families, n, common, ks)  # the study seeds at every LR a rule may use
    selection = runs(rng, setting, families, n_select, rng.normal(0, SEED_SD, (families, n_select)), ks)
    tuned, parabola, records = select(selection, pick)
    naive, _, _ = select(grid_runs, naive_grid)  # the argmin on the study's own seeds, judged on those runs
    off_grid = runs(rng, setting, families, n, common, np.nan_to_num(parabola)[..., None])[:, :, 0]
    shared = np.zeros(tuned.shape)
    used = {TUNED: tuned, BARE: tuned, SHARED: shared, NAIVE: naive, SMOOTH: parabola}
    best = np.array([c.best for c in setting.curves])
    out = []
    for rule, x in ((r, used[r]) for r in rules):
        on = np.isnan(x) | (x == np.round(x))  # a grid point: its run (the parabola's vertex at a tie: the point)
        idx = np.round(np.nan_to_num(x, nan=0.0)).astype(int) + len(ks) // 2
        study = np.take_along_axis(grid_runs, idx[:, :, None, None], axis=2)[:, :, 0]
        study = np.where(on[..., None], study, off_grid)  # off the grid: runs of their own at that LR
        calls, gains = judged(study, x, records if rule == TUNED else None)
        at = np.stack([c.loss(x[:, a]) for a, c in enumerate(setting.curves)], axis=1)
        at = np.where(np.isfinite(at), at, INITIAL)  # the true loss at the LR used (diverged: the initial loss)
        regret = np.where(np.isnan(x), np.nan, at - best)
        truth = np.broadcast_to(setting.truth, calls.shape)  # at each arm's optimum: what the component is worth
        at_lr = at[:, :1] - at[:, 1:]  # the true gain at the LRs the rule used: what its study measured
        false = cv.false_call({"call": calls, "truth": truth}) & (truth == 0)
        false_lr = cv.false_call({"call": calls, "truth": at_lr})
        p, q = float(false.any(axis=1).mean()), float(false_lr.any(axis=1).mean())
        bias = np.nanmean(gains, axis=0) - setting.truth
        out.append({"setting": setting.name, "rule": rule, "families": families,
                    "fwer": p, "fwer_sd": math.sqrt(p * (1 - p) / families),
                    "fwer_lr": q, "fwer_lr_sd": math.sqrt(q * (1 - q) / families),
                    "power": cv.rate({"call": calls}, stats.HELPS, 0) if setting.truth[0] > 0 else math.nan,
                    "untuned": float(np.isnan(x).mean()), "regret": float(np.nanmean(regret)),
                    "missed": float(np.nanmean(np.where(np.isnan(regret), np.nan, regret > MISSED))),
                    "bias": float(np.sqrt(np.nanmean(bias ** 2))), "signed_bias": float(np.nanmean(bias))})
    if log:
        log(f"{setting.name}: {time.perf_counter() - t0:.0f} s")
    return out


def calibrate(families: int, settings=SETTINGS, seed: int = 36, n_select: int = len(SELECTION_SEEDS),
              n_study: int = len(STUDY_SEEDS), log=None) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [r for s in settings for r in run_setting(rng, s, families, n_select, n_study, log=log)]


# ------------------------------------------------------------------------------- output


def _cell(x: float, sd: float | None = None) -> str:
    if not math.isfinite(x):
        return "-"
    return cv._pct(x) + (f" ± {cv._pct(sd)}" if sd is not None and math.isfinite(sd) else "")


def table(rows: list[dict]) -> list[str]:
    head = ["setting", "rule", "FWER % (± MC sd)", "FWER at the LRs used %", "P(helps) of the gain %",
            "arms not tuned %", "arms off by > margin %", "regret (nats)", "bias (nats)"]
    return cv._markdown(head, [[r["setting"], r["rule"], _cell(r["fwer"], r["fwer_sd"]),
                                _cell(r["fwer_lr"], r["fwer_lr_sd"]), _cell(r["power"]), _cell(r["untuned"]),
                                _cell(r["missed"]), f"{r['regret']:.3f}", f"{r['bias']:.3f}"] for r in rows])


def legend(families: int, n_select: int, n_study: int) -> list[str]:
    return [f"{families} families per setting, each 6 arms (a reference and 5 add-one variants, 5 effects "
            f"judged by stats.judge at alpha {stats.ALPHA} and margin {stats.DEFAULT_MARGIN}) on {n_study} "
            f"study seeds; tuned: {n_select} selection seed{'s' * (n_select > 1)}, grid 5 points at factor 2 "
            "around train.lr, up to 2 extensions. Curves: best 2.0, sharp 0.1 / flat 0.02 nats per (log2 LR)^2; "
            f"noise: per-seed common sd {SEED_SD}, per-run sd {RUN_SD:.4f} (paired sd {cv.SIGMA}); a true gain "
            f"{GAIN}. FWER: P(any false helps/hurts) over a family's null effects; P(helps): the first variant's "
            "true gain called helps; regret: the true loss at the LR a rule used minus the arm's best (mean over "
            "arms tuned); bias: root mean square over the 5 effects of (mean gain - truth)."]


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--families", type=int, default=400, help="simulated studies per setting (default 400)")
    p.add_argument("--selection-seeds", type=int, default=len(SELECTION_SEEDS),
                   help="selection seeds of the tuned rule (default 1, as `--tune-lr`)")
    p.add_argument("--study-seeds", type=int, default=len(STUDY_SEEDS), help="study seeds (default 3)")
    p.add_argument("--only", help="the settings whose name contains this")
    p.add_argument("--seed", type=int, default=36)
    p.add_argument("--append", action="store_true", help="append a dated section to benchmarks/RESULTS.md")
    return p.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    t0, load = time.perf_counter(), os.getloadavg()
    log = lambda s: print(s, file=sys.stderr, flush=True)  # noqa: E731
    settings = [s for s in SETTINGS if args.only is None or args.only in s.name]
    rows = calibrate(args.families, settings, args.seed, args.selection_seeds, args.study_seeds, log=log)
    lines = [*legend(args.families, args.selection_seeds, args.study_seeds), "", *table(rows), "",
             f"wall time {time.perf_counter() - t0:.0f} s; load average (1, 5, 15 min) before "
             f"{', '.join(f'{x:.2f}' for x in load)}, after {', '.join(f'{x:.2f}' for x in os.getloadavg())}"]
    print("\n".join(lines))
    if args.append:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        import common  # noqa: PLC0415 (torch: only when appending)

        common.append_results("Tuned learning rates: calibration (issue 36)", common.command_line(), lines)


if __name__ == "__main__":
    main()

"""Calibration of the verdict rule: synthetic studies with known true effects through the real report code.

Each simulated family is one study of the five LLaMA parts (rmsnorm, prenorm, rope, swiglu, gqa): the
2017 reference end, its five add-one variants, the LLaMA all-on end and its five remove-one variants,
11 configs x n seeds, 10 effects in one group. Per seed and config

    best_val_bpb = base(end) + seed effect + config truth + the config's own noise (+ a collapse)

where the seed effect (shared by every config of that seed, sd ~ END_SD) cancels in the paired
differences, so each effect's paired sd is set by the own noise of its two configs: the end's (END_OWN,
small) and the variant's, chosen so the effect's paired sd is what the noise setting asks for.

What runs through the real report code. The synthetic losses are generated vectorised, as a runs frame
(role, design, settings, size, seed, status, run_id, best_val_bpb) with many families stacked as separate
groups (a `family` setting). That frame is paired by `effects.paired_rows` (the pairing
`component_effects` uses: same seed, both runs completed; gain, sd, the group's noise) and judged by
`effects.effects_frame(rows, {metric: effects.margin_of(metric)})`, the body of `effects.component_effects`:
every group its own family, each effect on its own variance (stats.judge), the margin DEFAULT_MARGIN.
Every scenario of a cell is judged on the same simulated families (common random numbers): the families
are paired once with every true effect 0 and a scenario shifts the tested effect's paired differences by
its truth (gain and raw interval move, sd does not), exactly what pairing runs with that truth gives:
tests/report/test_calibration.py checks it against component_effects on runs simulated with the truth.

The grid of noise settings (issue 35): the tested effect (rope added to the 2017 end) has paired sd SIGMA
in every setting (so power rows read in its paired sds), the nine others as the setting says:
  alike                      all ten SIGMA (0.04, the demo's end seed sd; margin 0.02 = SIGMA / 2)
  one kx noisier             one other effect (gqa added) k x SIGMA, k in 1.5, 2, 3, 4, 6, 10: the case a
                             variance test on ten 2-df variances cannot see, where pooling failed
  two 4x noisier             gqa added and rope removed 4 x SIGMA
  spread sx                  the nine log-uniform over SIGMA / sqrt(s) .. SIGMA x sqrt(s), s in 2..70, drawn
                             per family (70x: the shipped studies' spread)
  t(3) tails                 alike, each config's own noise Student t on 3 df (scaled to the same sd)
  3 % collapses              alike, and each seed of a post-norm config (2017 end, +rmsnorm, +rope, +swiglu,
                             +gqa, -prenorm) collapses with probability 3 %: +1.5 nats/char, a completed run
                             (an outlier, not a divergence); prenorm's two effects then carry its expected
                             part (pre-norm does not collapse) as their truth, the rest 0
  alike, quiet               all ten at SIGMA / 8 (0.005): noise where `negligible` is reachable at 3-10 seeds,
                             for the boundary rows
  skew ... (--skew)          alike, each config's own noise right-skewed (unit_draw: gamma k = 4, lognormal sd
                             0.25 and 0.5, a centred exponential; and the exponential with one effect 4x noisier)
Scenarios per cell (the other effects 0 unless said)
  null           every effect 0 (but prenorm's collapse part): family-wise error P(any false helps/hurts),
                 a false call being one on an effect whose truth is 0 or of the other sign
  power k        the tested effect = k x its sd, k in POWER_K: P(it is called helps); the 80%-power effect
                 is interpolated linearly in log k (">16" when never reached)
  at the mde     the tested effect = the median mde the report prints for it under the null (estimated
                 from its seeds: stats.estimated_mde): P(helps), which the printed mde promises is 80 %
  boundary +/-   the tested effect = +/- the margin: P(it is called negligible)
  coverage       P(all simultaneous intervals hold their truths), pooled over every scenario judged; with
                 collapses prenorm's two effects are left out (one side collapses, the other never: their
                 paired gains are a skewed mixture whose mean no 3..10-seed t interval pins down)

--decide: the same families under `anatomy ablate --decide`, for two plans of looks: the demo's (3, 4 seeds)
and the default (3, 5, 7, 9, 10), each with alpha spent late (the default) and split equally, driven through
study.rounds.run_rounds, the very loop the command runs (a trainer that marks simulated runs trained, a reader
that returns them). Each family is simulated at the cap's seed count; at each look only the seeds each config
has been given so far are paired and judged (at the look's alpha, decide.spending), and the next look's seeds
go to the configs of the open effects (with futility: those decide.futile at the cap leaves, judged at the
final look's level; without: every open effect's). A family's calls are those of the last look it reached
(what its report says). Per plan, noise setting, spending and futility on/off: the family-wise error under
the null, P(helps) at 1.5, 2, 4, 8 paired sds, P(negligible) at the margin, coverage, and the runs a study
trained relative to 3 seeds of every config.

Trends: a size ladder of 3 sizes (log10 N 5, 5.5, 6), ten trends (the ten effects' per-seed gains), judged by
scale.trends, the report's code: each seed's gains at the sizes fitted by a line, the slopes judged as one
family by stats.judge, scale_call. Null: every slope 0 and the gains at each size inside the margin (every
size's call undecided), per-seed gain noise sd SIGMA at every size, one trend's (or none's) k x noisier: the
false grows / shrinks / reverses sign rate, and holds called for a flat trend at the margin.

Cost: ~45 ms per family and cell on one loaded core (pairing ~20 ms, then ~12 judgements of ~2 ms);
--families 1000 over the whole grid (4 seed counts x 15 settings) ~45 minutes on one core; --quick: 300
families, n = 3 only, a few minutes.

    python benchmarks/calibrate_verdict.py                        # prints the grid's table
    python benchmarks/calibrate_verdict.py --quick
    python benchmarks/calibrate_verdict.py --decide --families 300 --null-families 1000
    python benchmarks/calibrate_verdict.py --trends --families 4000
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from anatomy_cli.report import decide, effects, scale, stats
from anatomy_cli.spec.components import FIVE
from anatomy_cli.spec.roles import ADD_ONE, ALL_ON, DIRECTIONS, REFERENCE, REMOVE_ONE, variant
from anatomy_cli.store.runs import COMPLETED
from anatomy_cli.study.rounds import Rounds, run_rounds

METRIC = "best_val_bpb"  # the report's loss metric (frames.LOSS_METRIC)
END_SD = 0.04  # true seed-to-seed sd of an end's best val loss (the demo's: 0.046 and 0.040)
END_OWN = 0.0025  # the part of it that is the end config's own noise; the rest is the shared seed effect
SIGMA = 0.04  # the tested effect's paired sd, and every effect's when alike
COLLAPSE_P, COLLAPSE_LOSS = 0.03, 1.5
BASE = {REFERENCE: 3.8, ALL_ON: 2.9}
POWER_K = (1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0)  # 80 % at 3 seeds, each effect alone: ~11 sds
NS = (3, 4, 5, 10)
EFFECTS = [(f, ADD_ONE) for f in FIVE] + [(f, REMOVE_ONE) for f in FIVE]
INDEX = {e: i for i, e in enumerate(EFFECTS)}
TESTED = INDEX[("rope", ADD_ONE)]
NOISY = (INDEX[("gqa", ADD_ONE)], INDEX[("rope", REMOVE_ONE)])  # the effects a "noisier" setting makes noisy
VARIANTS = [variant(f, d) for d in DIRECTIONS for f in FIVE]  # config of effect i
ROLES = [REFERENCE, ALL_ON, *VARIANTS]
POST_NORM = np.array([r in {REFERENCE, "+rmsnorm", "+rope", "+swiglu", "+gqa", "-prenorm"} for r in ROLES])
MARGIN = stats.DEFAULT_MARGIN


@dataclass(frozen=True)
class Noise:
    """A noise setting: the ten effects' paired sds and the shape of each run's own noise."""

    name: str
    kind: str = "alike"  # alike | one | two | spread
    k: float = 1.0  # one / two: the noisy effects' sd in SIGMAs; spread: the ratio of the largest sd to the smallest
    tails: str = "normal"  # or "t3", or a right-skewed shape (SKEWS)
    collapse: float = 0.0  # probability a post-norm config's seed collapses
    sigma: float = SIGMA  # the tested effect's paired sd (and every effect's when alike)

    def sds(self, rng: np.random.Generator, families: int) -> np.ndarray:
        """(families, 10) paired sds."""
        sd = np.full((families, len(EFFECTS)), self.sigma)
        if self.kind == "one":
            sd[:, NOISY[0]] *= self.k
        elif self.kind == "two":
            sd[:, list(NOISY)] *= self.k
        elif self.kind == "spread":
            half = math.log(self.k) / 2
            sd = self.sigma * np.exp(rng.uniform(-half, half, size=sd.shape))
            sd[:, TESTED] = self.sigma
        return sd


GRID = (Noise("alike"), *(Noise(f"one {k:g}x noisier", "one", k) for k in (1.5, 2, 3, 4, 6, 10)),
        Noise("two 4x noisier", "two", 4.0), *(Noise(f"spread {s}x", "spread", s) for s in (2, 4, 8, 16, 70)),
        Noise("t(3) tails", tails="t3"), Noise("3 % collapses", collapse=COLLAPSE_P),
        Noise("alike, quiet", sigma=SIGMA / 8))
# the skew axis (issue 48): right-skewed run noise, every effect alike (the t(3) and normal cells stay above)
SKEWS = (Noise("skew gamma k=4", tails="gamma4"), Noise("skew lognormal 0.25", tails="lognormal0.25"),
         Noise("skew lognormal 0.5", tails="lognormal0.5"), Noise("skew exponential", tails="exponential"),
         Noise("skew exponential, one 4x noisier", "one", 4.0, tails="exponential"))
NOISES = {n.name: n for n in GRID + SKEWS}


# ------------------------------------------------------------------------------- synthetic studies


def unit_draw(rng: np.random.Generator, tails: str, size: tuple) -> np.ndarray:
    """A run's own noise, mean 0 and variance 1: normal, Student t on 3 df, or right-skewed (a loss that sometimes
    stays high: gamma k = 4, skewness 1; lognormal sd 0.25 / 0.5, skewness 0.78 / 1.75; a centred exponential,
    skewness 2). The variant's own noise dominates a paired difference (END_OWN is small), so a right-skewed
    loss makes an add-one gain (end - variant) left-skewed and a remove-one gain right-skewed."""
    if tails == "t3":
        return rng.standard_t(3, size=size) / math.sqrt(3.0)
    if tails == "gamma4":
        return (rng.gamma(4.0, size=size) - 4.0) / 2.0
    if tails.startswith("lognormal"):
        sd = float(tails.removeprefix("lognormal"))
        mean, var = math.exp(sd**2 / 2), (math.exp(sd**2) - 1) * math.exp(sd**2)
        return (rng.lognormal(0.0, sd, size=size) - mean) / math.sqrt(var)
    if tails == "exponential":
        return rng.exponential(size=size) - 1.0
    return rng.normal(size=size)


def simulate(rng: np.random.Generator, n: int, noise: Noise, families: int, first: int = 0,
             truth=None) -> tuple[pd.DataFrame, np.ndarray]:
    """A runs frame of `families` studies (groups `family=i`), n seeds each, with effects `truth` (10,
    gain units: positive = the part helps; default all 0), and each family's expected gains (families, 10)."""
    b = families
    truth = np.zeros(len(EFFECTS)) if truth is None else np.asarray(truth, dtype=float)
    seed_sd = math.sqrt(END_SD**2 - END_OWN**2)
    sd = noise.sds(rng, b)
    end_own = min(END_OWN, float(sd.min()) / 2)  # the end's own part never exceeds an effect's paired sd
    own = np.concatenate([np.full((b, 2), end_own), np.sqrt(np.maximum(sd**2 - end_own**2, 0.0))], axis=1)
    offset = np.concatenate([[0.0, 0.0], -truth[:5], truth[5:]])  # +f: lower loss by its gain; -f: higher
    base = np.array([BASE[REFERENCE], BASE[ALL_ON]] + [BASE[REFERENCE]] * 5 + [BASE[ALL_ON]] * 5)
    draw = unit_draw(rng, noise.tails, (b, len(ROLES), n))
    loss = base[None, :, None] + offset[None, :, None] + rng.normal(0, seed_sd, (b, 1, n)) + own[:, :, None] * draw
    expected = np.broadcast_to(truth, (b, len(EFFECTS))).copy()
    if noise.collapse:
        loss += COLLAPSE_LOSS * (POST_NORM[None, :, None] & (rng.random(loss.shape) < noise.collapse))
        shift = noise.collapse * COLLAPSE_LOSS * POST_NORM.astype(float)  # expected extra loss per config
        expected[:, :5] += shift[0] - shift[2:7]
        expected[:, 5:] += shift[7:] - shift[1]
    fam = np.repeat(np.arange(first, first + b), len(ROLES) * n)
    role = np.tile(np.repeat(np.array(ROLES, dtype=object), n), b)
    seed = np.tile(np.arange(1, n + 1), b * len(ROLES))
    m = len(fam)
    text = {"run_id": [f"f{f}-{r}-s{s}" for f, r, s in zip(fam, role, seed)], "role": role,
            "design": ["+".join(FIVE)] * m, "settings": [json.dumps({"family": int(f)}) for f in fam],
            "size": [""] * m, "status": ["completed"] * m}
    # plain object columns: the pairing runs ~30 % faster than on pandas' arrow strings
    runs = pd.DataFrame({k: pd.Series(v, dtype=object) for k, v in text.items()})
    runs["seed"], runs[METRIC] = seed, loss.reshape(-1)
    return runs, expected


def family_of(group: str, first: int, families: int) -> int:
    """The family index (from 0 in its batch) of a group named by groups(): 'family=i' ('' when alone)."""
    return 0 if families == 1 and group == "" else int(group.rsplit("=", 1)[1]) - first


def paired_rows(runs: pd.DataFrame, first: int, families: int) -> list[list[dict]]:
    """The real pairing (effects.paired_rows: paired gains, sd, the group's noise) per family, in EFFECTS order."""
    out: list[list[dict]] = [[{}] * len(EFFECTS) for _ in range(families)]
    for r in effects.paired_rows(runs, METRIC):
        out[family_of(r["group"], first, families)][INDEX[(r["flip"], r["direction"])]] = r
    return out


def shifted(rows: list[list[dict]], value: float, effect: int = TESTED) -> list[list[dict]]:
    """The rows of the same families with one effect's true gain larger by `value`: its paired differences
    all shift by value, so its gain and raw interval do and its sd does not (judge recomputes the rest).
    Exactly what the pairing gives on runs whose variant config is `value` better (test_calibration checks)."""
    if value == 0:
        return rows
    out = []
    for fam in rows:
        r = dict(fam[effect])
        r |= {k: r[k] + value for k in ("gain", "raw_low", "raw_high")}
        out.append([*fam[:effect], r, *fam[effect + 1:]])
    return out


def _arrays(judged: list[dict], first: int, families: int) -> dict[str, np.ndarray]:
    out = {"call": np.full((families, len(EFFECTS)), "", dtype=object),
           **{k: np.full((families, len(EFFECTS)), np.nan) for k in ("low", "high", "mde")}}
    for r in judged:
        f, i = family_of(r["group"], first, families), INDEX[(r["flip"], r["direction"])]
        out["call"][f, i], out["low"][f, i], out["high"][f, i] = r["call"], r["adj_low"], r["adj_high"]
        out["mde"][f, i] = r["mde"]
    return out


def judge(rows: list[list[dict]], first: int) -> dict[str, np.ndarray]:
    """{call, low, high, mde} arrays (families, 10) of the report's rule on paired_rows()' rows:
    effects.effects_frame with the loss metric's default margin (effects.margin), the body of
    effects.component_effects (every group its own family, each effect on its own variance)."""
    judged = effects.effects_frame([r for fam in rows for r in fam], {METRIC: effects.margin_of(METRIC)})
    return _arrays(judged.to_dict("records"), first, len(rows))


def run_cell(rng: np.random.Generator, n: int, noise: Noise, families: int, scenarios: dict[str, float],
             batch: int = 200, at_mde: bool = False) -> dict[str, dict]:
    """{scenario: {call, low, high, mde, truth, counted}} for scenarios {name: the tested effect's truth}.

    Every scenario is judged on the same simulated families (common random numbers): the runs of a batch
    are paired once through the report code, and each scenario shifts the tested effect's pairs. at_mde:
    also "at the mde", the tested effect at the median of the mde printed for it under the null (which
    needs the whole null first, so the batches' pairs are kept)."""
    parts: dict = {s: [] for s in scenarios}
    kept = []
    for first in range(0, families, batch):
        b = min(batch, families - first)
        runs, expected = simulate(rng, n, noise, b, first)
        rows = paired_rows(runs, first, b)
        extra = {"counted": np.broadcast_to(counted(noise), expected.shape)}
        for s, value in scenarios.items():
            parts[s].append(judge(shifted(rows, value), first) | extra | {"truth": expected + tested_only(value)})
        if at_mde:
            kept.append((first, rows, expected, extra))
    out = {s: {k: np.concatenate([p[k] for p in ps]) for k in ps[0]} for s, ps in parts.items()}
    if at_mde:
        null = out.get("null") or out[next(iter(out))]
        value = float(np.nanmedian(null["mde"][:, TESTED]))
        parts = [judge(shifted(rows, value), first) | extra | {"truth": expected + tested_only(value)}
                 for first, rows, expected, extra in kept]
        out["at the mde"] = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]} | {"value": value}
    return out


def tested_only(value: float) -> np.ndarray:
    truth = np.zeros(len(EFFECTS))
    truth[TESTED] = value
    return truth


# ------------------------------------------------------------------------------- measures


def false_call(j: dict) -> np.ndarray:
    """(families, 10): a helps/hurts call on an effect whose truth is 0 or of the other sign."""
    helps, hurts = j["call"] == stats.HELPS, j["call"] == stats.HURTS
    return (helps & (j["truth"] <= 0)) | (hurts & (j["truth"] >= 0))


def fwer(j: dict) -> float:
    return float(false_call(j).any(axis=1).mean())


def rate(j: dict, call: str, effect: int = TESTED) -> float:
    return float((j["call"][:, effect] == call).mean())


def covered(j: dict) -> np.ndarray:
    """(families,): every interval counted (j["counted"]) holds its truth."""
    return ((j["low"] <= j["truth"]) & (j["truth"] <= j["high"]) | ~j["counted"]).all(axis=1)


def counted(noise: Noise) -> np.ndarray:
    """(10,) the effects whose coverage counts: with collapses, those whose two configs collapse alike."""
    if not noise.collapse:
        return np.ones(len(EFFECTS), dtype=bool)
    ends = {ADD_ONE: POST_NORM[0], REMOVE_ONE: POST_NORM[1]}
    return np.array([POST_NORM[2 + i] == ends[d] for i, (_, d) in enumerate(EFFECTS)])


def detectable(power: dict[float, float], target: float = stats.POWER) -> float:
    """The effect (paired sds) called helps with probability `target`, linear in log k; inf if never."""
    ks = sorted(power)
    if power[ks[0]] >= target:
        return ks[0]
    for a, b in zip(ks, ks[1:]):
        if power[a] < target <= power[b]:
            x = math.log(a) + (target - power[a]) / (power[b] - power[a]) * (math.log(b) - math.log(a))
            return math.exp(x)
    return math.inf


def scenarios(noise: Noise, power: bool = True) -> dict[str, float]:
    """{name: the tested effect's truth}: the null, power at POWER_K of its sd, the margin's boundary."""
    out = {"null": 0.0} | ({f"power {k:g}": k * noise.sigma for k in POWER_K} if power else {})
    return out | {"edge +1": MARGIN, "edge -1": -MARGIN}


def summarise(cell: dict, noise: Noise) -> dict:
    """fwer, power {k: P(helps)}, mde80 (sds), the printed mde (sds) and P(helps) there, coverage,
    negligible_plus/minus of one run_cell()."""
    pw = {k: rate(cell[f"power {k:g}"], stats.HELPS) for k in POWER_K if f"power {k:g}" in cell}
    judged = [j for j in cell.values()]
    out = {"fwer": fwer(cell["null"]), "power": pw, "mde80": detectable(pw) if pw else math.nan,
           "coverage": float(np.concatenate([covered(j) for j in judged]).mean()),
           "negligible_plus": rate(cell["edge +1"], stats.NEGLIGIBLE) if "edge +1" in cell else math.nan,
           "negligible_minus": rate(cell["edge -1"], stats.NEGLIGIBLE) if "edge -1" in cell else math.nan}
    if "at the mde" in cell:
        out |= {"printed_mde": cell["at the mde"]["value"] / noise.sigma,
                "at_mde": rate(cell["at the mde"], stats.HELPS)}
    return out


def calibrate(families: int, ns=NS, noises=GRID, seed: int = 35, log=None, null_only: bool = False) -> list[dict]:
    """One row per (noise setting, n): summarise()'s numbers. Power rows only for the settings whose tested
    effect's power they read (alike, quiet, t(3), collapses): elsewhere the tested effect is judged alone
    on its own variance exactly as when alike (no variance borrows), so its power is alike's."""
    rng = np.random.default_rng(seed)
    out = []
    for noise in noises:
        for n in ns:
            t0 = time.perf_counter()
            power = noise.kind == "alike"
            chosen = {"null": 0.0} if null_only else scenarios(noise, power)
            cell = run_cell(rng, n, noise, families, chosen, at_mde=not null_only)
            out.append({"noise": noise.name, "n": n, "families": families, **summarise(cell, noise)})
            if log:
                log(f"{noise.name}, n={n}: {time.perf_counter() - t0:.0f} s")
    return out
# ------------------------------------------------------------------------------- --decide

PLANS = {"demo": [3, 4], "default": [3, 5, 7, 9, 10]}
DECIDE_K = (1.5, 2.0, 4.0, 8.0)
SPENDINGS = ("late", "equal")  # decide.spending: the default, and the split of studies planned before it
DECIDE_NOISES = tuple(NOISES[name] for name in ("alike", "one 4x noisier", "spread 70x", "t(3) tails"))


@dataclass(frozen=True)
class SimRun:
    """A planned run of a simulated study, as run_rounds reads one: its id and its config's slug."""

    run_id: str
    slug: str


def decide_cell(rng: np.random.Generator, looks: list[int], noise: Noise, families: int, value: float,
                futility: bool = True, batch: int = 200, spending: str = "late") -> dict[str, np.ndarray]:
    """One scenario (the tested effect's truth `value`) under --decide's looks: {call, low, high, truth,
    counted, runs}, each family's calls as its last look gave them and its runs trained (all configs).

    Each batch of families is one study (every family its own group, so its own family of effects) run
    by study.rounds.run_rounds, the loop `anatomy ablate --decide` runs: the trainer marks simulated runs
    as trained, the reader returns the trained ones. A family whose effects are decided (or futile) gets
    no more runs, and later looks judge it again on the same runs at the same alpha: the same calls."""
    rounds, cap, parts = Rounds(looks, futility=futility, spending=spending), looks[-1], []
    for first in range(0, families, batch):
        b = min(batch, families - first)
        runs, expected = simulate(rng, cap, noise, b, first, truth=tested_only(value))
        trained: set[str] = set()

        def plan_at(n: int) -> list[SimRun]:
            return [SimRun(f"f{f}-{r}-s{s}", f"f{f}-{r}") for f in range(first, first + b) for r in ROLES
                    for s in range(1, n + 1)]

        def train(todo: list[SimRun]) -> list[str]:
            trained.update(p.run_id for p in todo)
            return [COMPLETED] * len(todo)

        done = run_rounds(plan_at(looks[0]), rounds, train, lambda: runs[runs["run_id"].isin(trained)], plan_at,
                          pending=lambda todo: [p for p in todo if p.run_id not in trained])
        out = _arrays(done.effects.to_dict("records"), first, b)
        given = np.bincount([int(rid.split("-", 1)[0][1:]) - first for rid in trained], minlength=b)
        parts.append(out | {"truth": expected, "counted": np.broadcast_to(counted(noise), expected.shape).copy(),
                            "runs": given})
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


def calibrate_decide(families: int, plans=PLANS, noises=DECIDE_NOISES, seed: int = 28, log=None,
                     null_families: int | None = None, futilities=(True, False), spendings=SPENDINGS) -> list[dict]:
    """One row per (plan, noise setting, spending, futility on/off): error, power, boundary, coverage, runs.
    null_families: families of the null scenario (the error rate needs more than power does). Each spending
    of a (plan, noise, futility) is judged on the same simulated families (the generator restarted at the
    same state: common random numbers), so their differences are the rule's, not the draws'."""
    rng = np.random.default_rng(seed)
    out = []
    for plan, looks in plans.items():
        for noise in noises:
            for futility in futilities:
                state = rng.bit_generator.state
                for spending in spendings:
                    rng.bit_generator.state = state
                    out.append(_decide_row(rng, plan, looks, noise, futility, spending, families, null_families, log))
    return out


def _decide_row(rng, plan: str, looks: list[int], noise: Noise, futility: bool, spending: str, families: int,
                null_families: int | None, log) -> dict:
    t0 = time.perf_counter()
    cell = functools.partial(decide_cell, rng, looks, noise, futility=futility, spending=spending)
    cells = {"null": cell(null_families or families, 0.0)}
    cells |= {f"power {k:g}": cell(families, k * noise.sigma) for k in DECIDE_K}
    cells["edge"] = cell(families, MARGIN)
    pw = {k: rate(cells[f"power {k:g}"], stats.HELPS) for k in DECIDE_K}
    runs = {k: float(c["runs"].mean()) / (len(ROLES) * looks[0]) for k, c in cells.items()}
    if log:
        log(f"--decide {plan}, {noise.name}, {spending} spending, futility {futility}: "
            f"{time.perf_counter() - t0:.0f} s")
    return {"plan": plan, "looks": looks, "noise": noise.name, "futility": futility, "spending": spending,
            "alphas": decide.spending(looks, spending), "families": families,
            "null_families": null_families or families, "fwer": fwer(cells["null"]), "power": pw,
            "coverage": float(np.concatenate([covered(c) for k, c in cells.items() if k != "null"]).mean()),
            "negligible_plus": rate(cells["edge"], stats.NEGLIGIBLE), "runs_null": runs["null"],
            "runs_power2": runs["power 2"], "runs_power1.5": runs["power 1.5"]}


def decide_table(rows: list[dict]) -> list[str]:
    """The markdown table of calibrate_decide()'s rows."""
    ks = list(rows[0]["power"])
    head = (["plan (looks)", "noise", "spending", "futility", "FWER %"] + [f"P(helps) {k:g} sd %" for k in ks]
            + ["coverage %", "negl. at +m %", "runs (null) / 3 seeds", "runs (1.5 sd) / 3 seeds",
               "runs (2 sd) / 3 seeds"])
    return _markdown(head, [[f"{r['plan']} ({', '.join(map(str, r['looks']))})", r["noise"], r["spending"],
                             "on" if r["futility"] else "off", _pct(r["fwer"])] + [_pct(r["power"][k]) for k in ks]
                            + [_pct(r["coverage"]), _pct(r["negligible_plus"]), f"{r['runs_null']:.2f}x",
                               f"{r['runs_power1.5']:.2f}x", f"{r['runs_power2']:.2f}x"] for r in rows])


# ------------------------------------------------------------------------------- trends

LADDER = (5.0, 5.5, 6.0)  # log10 non-embedding parameters of the simulated sizes
TREND_K = (1.0, 2.0, 4.0, 10.0)


def trend_cell(rng: np.random.Generator, n: int, k: float, families: int, slope: float = 0.0,
               batch: int = 100) -> dict[str, np.ndarray]:
    """scale.trends on `families` simulated ladders of ten trends (the ten effects), n seeds, every size's
    gain inside the margin so every size's call is undecided (what lets a trend alone be called): per seed
    and size, gain = slope x (x - centre) + noise (sd SIGMA / 4, the noisy trend's k x that), tested trend
    (rope added) at `slope` nats/char per decade, the rest 0. {call (families, 10), slope_true (10,)}."""
    sd = np.full(len(EFFECTS), SIGMA / 4)
    sd[NOISY[0]] *= k
    truth = np.zeros(len(EFFECTS))
    truth[TESTED] = slope
    x = np.array(LADDER)
    calls = []
    for first in range(0, families, batch):
        b = min(batch, families - first)
        g = (truth[None, :, None, None] * (x - x.mean())[None, None, None, :]
             + sd[None, :, None, None] * rng.normal(size=(b, len(EFFECTS), n, len(x))))
        fam, eff, seed, size = (a.reshape(-1) for a in np.indices(g.shape))
        flips = np.array([f for f, _ in EFFECTS], dtype=object)
        dirs = np.array([d for _, d in EFFECTS], dtype=object)
        gains = pd.DataFrame({"series": [f"f{f}" for f in fam + first], "flip": flips[eff], "direction": dirs[eff],
                              "against": "", "seed": seed, "size": [f"s{i}" for i in size], "gain": g.reshape(-1),
                              "non_embedding_params": 10.0 ** x[size]})
        by_size = gains.drop_duplicates(["series", "flip", "direction", "size"])[["series", "flip", "direction"]]
        by_size = by_size.assign(call=stats.UNDECIDED)
        out = np.full((b, len(EFFECTS)), "", dtype=object)
        for series, fam_rows in gains.groupby("series", sort=False):
            judged = scale.trends(fam_rows, by_size[by_size["series"] == series], MARGIN)
            f = int(series[1:]) - first
            for r in judged.itertuples():
                out[f, INDEX[(r.flip, r.direction)]] = r.call
        calls.append(out)
    return {"call": np.concatenate(calls), "slope_true": truth}


def calibrate_trends(families: int, ns=(3, 5, 10), seed: int = 35, log=None) -> list[dict]:
    """One row per (n, k): P(any false grows / shrinks / reverses sign) with every slope 0 and one trend k x
    noisier, and that noisy trend's own rate."""
    rng = np.random.default_rng(seed)
    out = []
    moving = {scale.GROWS, scale.SHRINKS, scale.REVERSES}
    for n in ns:
        for k in TREND_K:
            t0 = time.perf_counter()
            cell = trend_cell(rng, n, k, families)
            false = np.isin(cell["call"], list(moving))
            out.append({"n": n, "k": k, "families": families, "fwer": float(false.any(axis=1).mean()),
                        "noisy": float(false[:, NOISY[0]].mean())})
            if log:
                log(f"trends n={n}, k={k:g}: {time.perf_counter() - t0:.0f} s")
    return out


def trends_table(rows: list[dict]) -> list[str]:
    return _markdown(["n seeds", "one trend k x noisier", "false grows/shrinks/reverses, any % (MC sd)",
                      "of the noisy trend %"],
                     [[str(r["n"]), f"{r['k']:g}", f"{_pct(r['fwer'])} "
                       f"({_pct(math.sqrt(max(r['fwer'], 0.05) * (1 - max(r['fwer'], 0.05)) / r['families']))})",
                       _pct(r["noisy"])] for r in rows])


# ------------------------------------------------------------------------------- output


def _pct(x: float) -> str:
    return "" if math.isnan(x) else f"{100 * x:.1f}"


def table(rows: list[dict]) -> list[str]:
    """The markdown table of calibrate()'s rows."""
    ks = list(POWER_K)
    head = (["noise", "n", "FWER % (MC sd)"] + [f"P(helps) {k:g} sd %" for k in ks]
            + ["80% power at (sd)", "printed mde (sd)", "P(helps) at it %", "coverage %", "negl. at +m %",
               "negl. at -m %"])
    body = []
    for r in rows:
        mc = math.sqrt(max(r["fwer"], 0.05) * (1 - max(r["fwer"], 0.05)) / r["families"])
        mde = ("" if not r["power"] else ">" + f"{max(ks):g}" if math.isinf(r["mde80"]) else f"{r['mde80']:.2f}")
        body.append([r["noise"], str(r["n"]), f"{_pct(r['fwer'])} ({_pct(mc)})"]
                    + [_pct(r["power"][k]) if k in r["power"] else "" for k in ks]
                    + [mde, f"{r['printed_mde']:.2f}" if "printed_mde" in r else "",
                       _pct(r["at_mde"]) if "at_mde" in r else "", _pct(r["coverage"]),
                       _pct(r["negligible_plus"]), _pct(r["negligible_minus"])])
    return _markdown(head, body)


def _markdown(head: list[str], body: list[list[str]]) -> list[str]:
    """A markdown table: the header, its rule, a line per row."""
    return ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|",
            *("| " + " | ".join(cells) + " |" for cells in body)]


def legend(families: int) -> list[str]:
    mc = math.sqrt(0.05 * 0.95 / families)
    return [f"{families} families per cell and scenario (Monte-Carlo sd of a rate near 5 %: {100 * mc:.2f} points; "
            f"of a rate near 80 %: {100 * math.sqrt(0.16 / families):.2f}); margin {MARGIN} nats/char (fixed); "
            f"the tested effect's paired sd {SIGMA} ({SIGMA / 8} in 'alike, quiet'); collapses: p {COLLAPSE_P}, "
            f"+{COLLAPSE_LOSS} nats/char on post-norm configs. FWER: P(any false helps/hurts) with every effect 0; "
            "P(helps) k sd: the tested effect at k paired sds, the other nine 0 (only where the tested effect's "
            "noise differs from alike's: with no variance borrowed, the other effects' noise cannot move its calls); "
            "printed mde: the median mde the report prints for the tested effect under the null, in its sds, and "
            "P(helps) for a true effect of that size; coverage: all simultaneous intervals hold their truths, over "
            "every scenario (with collapses: all but prenorm's two); negl. at +/-m: P(negligible) for a true "
            "effect exactly at +/- the margin."]


def decide_legend(families: int, null_families: int) -> list[str]:
    return [f"{families} families per scenario ({null_families} under the null: Monte-Carlo sd "
            f"{100 * math.sqrt(0.05 * 0.95 / null_families):.1f} points at 5 %); noise settings and margin as in "
            "the fixed-seed grid; each look judged at its spending's alpha (late: records.late_spending, 0.6 of "
            "0.05 at the final look, the rest in proportion to the look's order; equal: 0.05 / (number of looks)), "
            "futility at the final look's level; both spendings on the same families. FWER: P(any false helps/hurts "
            "in the calls of each family's last look) with every effect 0; P(helps) k sd: the tested effect at k "
            "paired sds; coverage: all intervals of a family's last look hold their truths, over the power and "
            "margin scenarios; negl. at +m: P(negligible) for the tested effect exactly at the margin 0.02; runs: "
            "the mean runs a study trained over 33 (3 seeds of its 11 configs), with every effect 0 and with the "
            "tested effect at 2 sds."]


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--families", type=int, default=1000, help="simulated studies per scenario (default 1000)")
    p.add_argument("--quick", action="store_true", help="300 families, n = 3 only")
    p.add_argument("--noise", action="append", choices=list(NOISES), help="only these noise settings (repeatable)")
    p.add_argument("--skew", action="store_true", help="the skew axis (right-skewed run noise) instead of the grid")
    p.add_argument("--skew-floor", type=float, help="judge with this stats.SKEW_FLOOR (0: each effect's own sd "
                   "alone, the rule before issue 48), to measure what the floor changes")
    p.add_argument("--n", type=int, action="append", help="only these seed counts (repeatable)")
    p.add_argument("--null-only", action="store_true", help="only the null scenario (FWER and coverage), for "
                   "rerunning a cell with more families")
    p.add_argument("--trends", action="store_true", help="the trends table instead (scale.trends on size ladders)")
    p.add_argument("--decide", action="store_true", help="the --decide table instead (rounds of seeds, futility "
                   "on and off)")
    p.add_argument("--null-families", type=int, help="with --decide: families of the null scenario (default: "
                   "--families)")
    p.add_argument("--plan", action="append", choices=list(PLANS), help="with --decide: only these plans")
    p.add_argument("--futility", choices=("on", "off", "both"), default="both", help="with --decide (default both)")
    p.add_argument("--spending", action="append", choices=SPENDINGS, help="with --decide: only these alpha "
                   "spendings (default both)")
    p.add_argument("--seed", type=int, default=28)
    p.add_argument("--json", type=Path, help="also write the numbers here")
    p.add_argument("--append", action="store_true", help="append a dated section to benchmarks/RESULTS.md")
    return p.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    families, ns = (300, (3,)) if args.quick else (args.families, tuple(args.n or NS))
    noises = tuple(NOISES[name] for name in args.noise) if args.noise else SKEWS if args.skew else GRID
    if args.skew_floor is not None:
        stats.SKEW_FLOOR = args.skew_floor
    t0 = time.perf_counter()
    log = lambda s: print(s, file=sys.stderr, flush=True)  # noqa: E731
    if args.decide:
        rows = calibrate_decide(families, plans={k: PLANS[k] for k in args.plan or PLANS},
                                noises=tuple(NOISES[n] for n in args.noise) if args.noise else DECIDE_NOISES,
                                seed=args.seed, log=log, null_families=args.null_families,
                                futilities={"on": (True,), "off": (False,), "both": (True, False)}[args.futility],
                                spendings=tuple(args.spending or SPENDINGS))
        lines = [*decide_legend(families, args.null_families or families), "", *decide_table(rows), "",
                 f"wall time {time.perf_counter() - t0:.0f} s"]
    elif args.trends:
        rows = calibrate_trends(families, tuple(args.n or (3, 5, 10)), seed=args.seed, log=log)
        lines = [f"{families} ladders per cell (3 sizes, 10 trends, every size's call undecided); margin {MARGIN}",
                 "", *trends_table(rows), "", f"wall time {time.perf_counter() - t0:.0f} s"]
    else:
        rows = calibrate(families, ns, noises, seed=args.seed, log=log, null_only=args.null_only)
        lines = [*legend(families), "", *table(rows), "", f"wall time {time.perf_counter() - t0:.0f} s"]
    print("\n".join(lines))
    if args.json:
        plain = [r | ({"mde80": None if math.isinf(r["mde80"]) else r["mde80"]} if "mde80" in r else {})
                 for r in rows]  # inf: never 80 %
        args.json.write_text(json.dumps({"families": families, "seed": args.seed, "rows": plain}, indent=1) + "\n")
    if args.append:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        import common  # noqa: PLC0415 (torch: only when appending)

        common.append_results("Verdict calibration over the noise grid (issue 35)", common.command_line(), lines)


if __name__ == "__main__":
    main()

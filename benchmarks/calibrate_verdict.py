"""Calibration of the verdict rule: synthetic studies with known true effects through the real report code.

Each simulated family is one study of the five LLaMA parts (rmsnorm, prenorm, rope, swiglu, gqa): the
2017 reference end, its five add-one variants, the LLaMA all-on end and its five remove-one variants,
11 configs x n seeds, 10 effects in one group. Per seed and config

    best_val_loss = base(end) + seed effect + config truth + the config's own noise (+ a collapse)

where the seed effect (shared by every config of that seed, sd ~ END_SD) cancels in the paired
differences, so each effect's paired sd is set by the own noise of its two configs: the end's (END_OWN,
small) and the variant's, chosen so the effect's paired sd is what the noise setting asks for.

What runs through the real report code. The synthetic losses are generated vectorised, as a runs frame
(role, design, settings, size, seed, status, run_id, best_val_loss) with many families stacked as separate
groups (a `family` setting). That frame is paired by `effects.paired_rows` (the pairing
`component_effects` uses: same seed, both runs completed; gain, sd, the group's noise). The NEW rule then
judges those rows with `effects.effects_frame(rows, {metric: effects.margin(metric)})`, which is the body of
`effects.component_effects` (every group its own family, moderated t, the fixed margin DEFAULT_MARGIN).
TODAY'S rule is a REPLICA of the rule before issue 28 on the same rows: one family of all effects (here
one group's ten), Bonferroni on each effect's own t (`stats.judge(..., moderate=False)`), the margin
estimated from the data as the reference end's seed-to-seed sd of best_val_loss (the row's `noise`).
Every scenario is judged on the same simulated families (common random numbers): pairing costs ~20 ms a
family and judging ~2 ms, so the families are paired once with every true effect 0 and a scenario shifts
the tested effect's paired differences by its truth (gain and raw interval move, sd does not), exactly
what pairing runs with that truth gives: tests/report/test_calibration.py checks it against component_effects
on the runs frame simulated with the truth itself.

Noise settings
  homogeneous                every effect's paired sd = SIGMA (0.04, the demo's end seed sd and the median
                             paired sd of its ten effects; margin 0.02 = SIGMA / 2)
  heterogeneous              the nine other effects' paired sds log-uniform in 0.1x..7x END_SD, drawn per
                             family (the demo's ten span 0.005..0.33 with an end seed sd of 0.046)
  heterogeneous + collapses  the same, and each seed of a post-norm config (2017 end, +rmsnorm, +rope,
                             +swiglu, +gqa, -prenorm) collapses with probability COLLAPSE_P: +COLLAPSE_LOSS
                             nats/char, a completed run (an outlier, not a divergence)
The tested effect (rope added to the 2017 end: post-norm on both sides) has paired sd SIGMA in every
setting, so power rows read in its paired sds. With collapses, an effect's truth is its expected paired
gain: prenorm's two effects then carry +COLLAPSE_P x COLLAPSE_LOSS (pre-norm does not collapse), the rest 0.

Scenarios (per n and noise setting; the other effects 0 unless said)
  null           every effect 0 (but prenorm's collapse part): family-wise error P(any false helps/hurts),
                 a false call being one on an effect whose truth is 0 or of the other sign
  power k        the tested effect = k x SIGMA, k in POWER_K (0.5, 1, 2, 3, 4, 8): P(it is called helps); the
                 80%-power effect is interpolated linearly in log k (">8" when never reached)
  boundary +/-   the tested effect = +/- the rule's margin: P(it is called negligible). New rule: 0.02;
                 today's: the end's true seed sd END_SD (the margin it estimates)
  coverage       P(all simultaneous intervals hold their truths), pooled over every scenario judged; with
                 collapses prenorm's two effects are left out (one side collapses, the other never: their
                 paired gains are a skewed mixture whose mean no 3..10-seed t interval pins down)

--decide: the same families under `anatomy ablate --decide`, for two plans of looks: the demo's (3, 4 seeds)
and the default (3, 5, 7, 9, 10), driven through study.rounds.run_rounds, the very loop the command runs (a
trainer that marks simulated runs trained, a reader that returns them). Each family is simulated at the cap's
seed count; at each look only the seeds each config has been given so far are paired and judged (at the
looks' alpha, decide.alpha), and the next look's seeds go to the configs of the open effects (with
futility: those decide.futile at the cap leaves; without: every open effect's). A family's calls are those of
the last look it reached (what its report says). Per plan, noise setting (homogeneous, heterogeneous) and futility
on/off: the family-wise error under the null, P(helps) at 1, 2, 4 paired sds, P(negligible) at the margin,
coverage, and the runs a study trained relative to 3 seeds of every config.

Cost: ~50 ms per family and (noise, n) cell on one loaded core (pairing ~20 ms, then 18 judgements of ~2 ms);
the default, 1200 families: 9 cells, ~10 minutes at load ~2.5 (562 s; 1065 s at load 4-6); --quick: 300
families, n = 3 only, ~1 minute.

    python benchmarks/calibrate_verdict.py                        # prints the table
    python benchmarks/calibrate_verdict.py --quick
    python benchmarks/calibrate_verdict.py --families 4000 --json calib.json --append   # ~35 minutes
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from anatomy_cli.report import effects, stats
from anatomy_cli.spec.components import FIVE
from anatomy_cli.spec.roles import ADD_ONE, ALL_ON, DIRECTIONS, REFERENCE, REMOVE_ONE, variant
from anatomy_cli.store.runs import COMPLETED
from anatomy_cli.study.rounds import Rounds, run_rounds

METRIC = "best_val_loss"
END_SD = 0.04  # true seed-to-seed sd of an end's best val loss (the demo's: 0.046 and 0.040)
END_OWN = 0.0025  # the part of it that is the end config's own noise; the rest is the shared seed effect
SIGMA = 0.04  # homogeneous paired sd, and the tested effect's in every setting
SD_RANGE = (0.1, 7.0)  # heterogeneous paired sds, in END_SD
COLLAPSE_P, COLLAPSE_LOSS = 0.1, 1.0
BASE = {REFERENCE: 3.8, ALL_ON: 2.9}
POWER_K = (0.5, 1.0, 2.0, 3.0, 4.0, 8.0)  # 3: the 80 % crossing of n = 3 lies between 2 and 4
NS = (3, 5, 10)
EFFECTS = [(f, ADD_ONE) for f in FIVE] + [(f, REMOVE_ONE) for f in FIVE]
INDEX = {e: i for i, e in enumerate(EFFECTS)}
TESTED = INDEX[("rope", ADD_ONE)]
VARIANTS = [variant(f, d) for d in DIRECTIONS for f in FIVE]  # config of effect i
ROLES = [REFERENCE, ALL_ON, *VARIANTS]
POST_NORM = np.array([r in {REFERENCE, "+rmsnorm", "+rope", "+swiglu", "+gqa", "-prenorm"} for r in ROLES])
NEW, TODAY = "new", "today"
RULES = (TODAY, NEW)
NEW_MARGIN = stats.DEFAULT_MARGIN


@dataclass(frozen=True)
class Noise:
    name: str
    heterogeneous: bool
    collapse: float  # probability a post-norm config's seed collapses


NOISES = (Noise("homogeneous", False, 0.0), Noise("heterogeneous", True, 0.0),
          Noise("heterogeneous + collapses", True, COLLAPSE_P))


# ------------------------------------------------------------------------------- synthetic studies


def simulate(rng: np.random.Generator, n: int, noise: Noise, families: int, first: int = 0,
             truth=None) -> tuple[pd.DataFrame, np.ndarray]:
    """A runs frame of `families` studies (groups `family=i`), n seeds each, with effects `truth` (10,
    gain units: positive = the part helps; default all 0), and each family's expected gains (families, 10)."""
    b = families
    truth = np.zeros(len(EFFECTS)) if truth is None else np.asarray(truth, dtype=float)
    seed_sd = math.sqrt(END_SD**2 - END_OWN**2)
    sd = np.full((b, len(EFFECTS)), SIGMA)
    if noise.heterogeneous:
        lo, hi = np.log(SD_RANGE[0] * END_SD), np.log(SD_RANGE[1] * END_SD)
        sd = np.exp(rng.uniform(lo, hi, size=sd.shape))
        sd[:, TESTED] = SIGMA
    own = np.concatenate([np.full((b, 2), END_OWN), np.sqrt(np.maximum(sd**2 - END_OWN**2, 0.0))], axis=1)
    offset = np.concatenate([[0.0, 0.0], -truth[:5], truth[5:]])  # +f: lower loss by its gain; -f: higher
    base = np.array([BASE[REFERENCE], BASE[ALL_ON]] + [BASE[REFERENCE]] * 5 + [BASE[ALL_ON]] * 5)
    loss = (base[None, :, None] + offset[None, :, None] + rng.normal(0, seed_sd, (b, 1, n))
            + own[:, :, None] * rng.normal(size=(b, len(ROLES), n)))
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
    runs["seed"], runs["best_val_loss"] = seed, loss.reshape(-1)
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
           "low": np.full((families, len(EFFECTS)), np.nan), "high": np.full((families, len(EFFECTS)), np.nan)}
    for r in judged:
        f, i = family_of(r["group"], first, families), INDEX[(r["flip"], r["direction"])]
        out["call"][f, i], out["low"][f, i], out["high"][f, i] = r["call"], r["adj_low"], r["adj_high"]
    return out


def judge(rows: list[list[dict]], rule: str, first: int) -> dict[str, np.ndarray]:
    """{call, low, high} arrays (families, 10) of one rule on paired_rows()' rows.

    NEW: effects.effects_frame with the loss metric's default margin (effects.margin), the body of
    effects.component_effects: every group its own family, moderated t, margin stats.DEFAULT_MARGIN.
    TODAY (a replica of the rule before issue 28): all effects one family (here: one group's ten), each
    effect's own variance (stats.judge(moderate=False)), the margin = the group's reference-end seed sd.
    """
    if rule == NEW:
        judged = effects.effects_frame([r for fam in rows for r in fam], {METRIC: effects.margin(METRIC)})
        judged = judged.to_dict("records")
    else:
        judged = [r for fam in rows for r in stats.judge(fam, fam[0]["noise"], moderate=False)]
    return _arrays(judged, first, len(rows))


def run_cell(rng: np.random.Generator, n: int, noise: Noise, families: int,
             scenarios: dict[str, tuple[float, tuple[str, ...]]], batch: int = 200) -> dict[str, dict]:
    """{scenario: {rule: {call, low, high, truth}}} for scenarios {name: (tested effect's truth, rules)}.

    Every scenario is judged on the same simulated families (common random numbers): the runs of a batch
    are paired once through the report code, and each scenario shifts the tested effect's pairs."""
    parts: dict = {s: {rule: [] for rule in rules} for s, (_, rules) in scenarios.items()}
    for first in range(0, families, batch):
        b = min(batch, families - first)
        runs, expected = simulate(rng, n, noise, b, first)
        rows = paired_rows(runs, first, b)
        for s, (value, rules) in scenarios.items():
            extra = {"truth": expected + tested_only(value), "counted": np.broadcast_to(counted(noise), expected.shape)}
            for rule in rules:
                parts[s][rule].append(judge(shifted(rows, value), rule, first) | extra)
    return {s: {rule: {k: np.concatenate([p[k] for p in ps]) for k in ps[0]} for rule, ps in by.items()}
            for s, by in parts.items()}


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


def boundary(rule: str) -> float:
    """The true effect at the rule's margin: the new rule's fixed one, today's estimated one's truth."""
    return NEW_MARGIN if rule == NEW else END_SD


def scenarios() -> dict[str, tuple[float, tuple[str, ...]]]:
    """{name: (the tested effect's truth, the rules judged)}: the null, power at POWER_K paired sds, and
    each rule's margin boundary (judged by that rule only)."""
    out = {"null": (0.0, RULES)} | {f"power {k:g}": (k * SIGMA, RULES) for k in POWER_K}
    return out | {f"edge {rule} {s:+d}": (s * boundary(rule), (rule,)) for rule in RULES for s in (1, -1)}


def summarise(cell: dict, rule: str) -> dict:
    """fwer, power {k: P(helps)}, mde80, coverage, negligible_plus/minus of one rule in one run_cell()."""
    pw = {k: rate(cell[f"power {k:g}"][rule], stats.HELPS) for k in POWER_K}
    judged = [by[rule] for by in cell.values() if rule in by]
    return {"fwer": fwer(cell["null"][rule]), "power": pw, "mde80": detectable(pw),
            "coverage": float(np.concatenate([covered(j) for j in judged]).mean()),
            "negligible_plus": rate(cell[f"edge {rule} +1"][rule], stats.NEGLIGIBLE),
            "negligible_minus": rate(cell[f"edge {rule} -1"][rule], stats.NEGLIGIBLE)}


def calibrate(families: int, ns=NS, noises=NOISES, seed: int = 28, log=None) -> list[dict]:
    """One row per (noise setting, n, rule): summarise()'s numbers."""
    rng = np.random.default_rng(seed)
    out = []
    for noise in noises:
        for n in ns:
            t0 = time.perf_counter()
            cell = run_cell(rng, n, noise, families, scenarios())
            out += [{"noise": noise.name, "n": n, "rule": rule, "families": families, **summarise(cell, rule)}
                    for rule in RULES]
            if log:
                log(f"{noise.name}, n={n}: {time.perf_counter() - t0:.0f} s")
    return out


# ------------------------------------------------------------------------------- --decide

PLANS = {"demo": [3, 4], "default": [3, 5, 7, 9, 10]}
DECIDE_K = (1.0, 2.0, 4.0)
DECIDE_NOISES = NOISES[:2]  # homogeneous, heterogeneous


@dataclass(frozen=True)
class SimRun:
    """A planned run of a simulated study, as run_rounds reads one: its id and its config's slug."""

    run_id: str
    slug: str


def decide_cell(rng: np.random.Generator, looks: list[int], noise: Noise, families: int, value: float,
                futility: bool = True, batch: int = 200) -> dict[str, np.ndarray]:
    """One scenario (the tested effect's truth `value`) under --decide's looks: {call, low, high, truth,
    counted, runs}, each family's calls as its last look gave them and its runs trained (all configs).

    Each batch of families is one study (every family its own group, so its own family of effects) run
    by study.rounds.run_rounds, the loop `anatomy ablate --decide` runs: the trainer marks simulated runs
    as trained, the reader returns the trained ones. A family whose effects are decided (or futile) gets
    no more runs, and later looks judge it again on the same runs at the same alpha: the same calls."""
    rounds, cap, parts = Rounds(looks, futility=futility), looks[-1], []
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
                     null_families: int | None = None) -> list[dict]:
    """One row per (plan, noise setting, futility on/off): error, power, boundary, coverage, runs.
    null_families: families of the null scenario (the error rate needs more than power does)."""
    rng = np.random.default_rng(seed)
    out = []
    for plan, looks in plans.items():
        for noise in noises:
            for futility in (True, False):
                t0 = time.perf_counter()
                cells = {"null": decide_cell(rng, looks, noise, null_families or families, 0.0, futility)}
                cells |= {f"power {k:g}": decide_cell(rng, looks, noise, families, k * SIGMA, futility)
                          for k in DECIDE_K}
                cells["edge"] = decide_cell(rng, looks, noise, families, NEW_MARGIN, futility)
                pw = {k: rate(cells[f"power {k:g}"], stats.HELPS) for k in DECIDE_K}
                out.append({"plan": plan, "looks": looks, "noise": noise.name, "futility": futility,
                            "families": families, "null_families": null_families or families,
                            "fwer": fwer(cells["null"]), "power": pw,
                            "coverage": float(np.concatenate([covered(c) for k, c in cells.items()
                                                              if k != "null"]).mean()),
                            "negligible_plus": rate(cells["edge"], stats.NEGLIGIBLE),
                            "runs_null": float(cells["null"]["runs"].mean()) / (len(ROLES) * looks[0]),
                            "runs_power2": float(cells["power 2"]["runs"].mean()) / (len(ROLES) * looks[0])})
                if log:
                    log(f"--decide {plan}, {noise.name}, futility {futility}: {time.perf_counter() - t0:.0f} s")
    return out


def decide_table(rows: list[dict]) -> list[str]:
    """The markdown table of calibrate_decide()'s rows."""
    ks = list(rows[0]["power"])
    head = (["plan (looks)", "noise", "futility", "FWER %"] + [f"P(helps) {k:g} sd %" for k in ks]
            + ["coverage %", "negl. at +m %", "runs (null) / 3 seeds", "runs (2 sd) / 3 seeds"])
    return _markdown(head, [[f"{r['plan']} ({', '.join(map(str, r['looks']))})", r["noise"],
                             "on" if r["futility"] else "off", _pct(r["fwer"])] + [_pct(r["power"][k]) for k in ks]
                            + [_pct(r["coverage"]), _pct(r["negligible_plus"]), f"{r['runs_null']:.2f}x",
                               f"{r['runs_power2']:.2f}x"] for r in rows])


# ------------------------------------------------------------------------------- output


def _pct(x: float) -> str:
    return f"{100 * x:.1f}"


def table(rows: list[dict]) -> list[str]:
    """The markdown table of calibrate()'s rows."""
    ks = list(rows[0]["power"])
    head = (["noise", "n", "rule", "FWER %"] + [f"P(helps) {k:g} sd %" for k in ks]
            + ["80% power at (sd)", "coverage %", "negl. at +m %", "negl. at -m %"])
    body = []
    for r in rows:
        mde = ">" + f"{max(ks):g}" if math.isinf(r["mde80"]) else f"{r['mde80']:.2f}"
        body.append([r["noise"], str(r["n"]), "new" if r["rule"] == NEW else "today (replica)", _pct(r["fwer"])]
                    + [_pct(r["power"][k]) for k in ks]
                    + [mde, _pct(r["coverage"]), _pct(r["negligible_plus"]), _pct(r["negligible_minus"])])
    return _markdown(head, body)


def _markdown(head: list[str], body: list[list[str]]) -> list[str]:
    """A markdown table: the header, its rule, a line per row."""
    return ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|",
            *("| " + " | ".join(cells) + " |" for cells in body)]


def legend(families: int) -> list[str]:
    mc = math.sqrt(0.05 * 0.95 / families)
    return [f"{families} families per scenario (Monte-Carlo sd: {100 * mc:.1f} points at 5 %, at most "
            f"{50 / math.sqrt(families):.1f} points); margin: new {NEW_MARGIN} (fixed), today the 2017 end's "
            f"estimated seed sd (true {END_SD}); SIGMA (paired sd of the tested effect) {SIGMA}; "
            f"heterogeneous paired sds {SD_RANGE[0]}x..{SD_RANGE[1]}x {END_SD}; collapses: p {COLLAPSE_P}, "
            f"+{COLLAPSE_LOSS} nats/char on post-norm configs. FWER: P(any false helps/hurts) with every effect 0; "
            "P(helps) k sd: the tested effect at k paired sds, the other nine 0; coverage: all simultaneous "
            "intervals hold their truths, over every scenario (with collapses: all but prenorm's two); "
            "negl. at +/-m: P(negligible) for a true effect exactly at +/- the rule's margin."]


def decide_legend(families: int, null_families: int) -> list[str]:
    return [f"{families} families per scenario ({null_families} under the null: Monte-Carlo sd "
            f"{100 * math.sqrt(0.05 * 0.95 / null_families):.1f} points at 5 %); noise settings and margin as in "
            "the fixed-seed table; every look judged at 0.05 / (number of looks). FWER: P(any false helps/hurts "
            "in the calls of each family's last look) with every effect 0; P(helps) k sd: the tested effect at k "
            "paired sds; coverage: all intervals of a family's last look hold their truths, over the power and "
            "margin scenarios; negl. at +m: P(negligible) for the tested effect exactly at the margin 0.02; runs: "
            "the mean runs a study trained over 33 (3 seeds of its 11 configs), with every effect 0 and with the "
            "tested effect at 2 sds."]


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--families", type=int, default=1200, help="simulated studies per scenario (default 1200)")
    p.add_argument("--quick", action="store_true", help="300 families, n = 3 only")
    p.add_argument("--decide", action="store_true", help="the --decide table instead (rounds of seeds, futility "
                   "on and off)")
    p.add_argument("--null-families", type=int, help="with --decide: families of the null scenario (default: "
                   "--families)")
    p.add_argument("--seed", type=int, default=28)
    p.add_argument("--json", type=Path, help="also write the numbers here")
    p.add_argument("--append", action="store_true", help="append a dated section to benchmarks/RESULTS.md")
    return p.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    families, ns = (300, (3,)) if args.quick else (args.families, NS)
    t0 = time.perf_counter()
    log = lambda s: print(s, file=sys.stderr, flush=True)  # noqa: E731
    if args.decide:
        rows = calibrate_decide(families, seed=args.seed, log=log, null_families=args.null_families)
        lines = [*decide_legend(families, args.null_families or families), "", *decide_table(rows), "",
                 f"wall time {time.perf_counter() - t0:.0f} s"]
    else:
        rows = calibrate(families, ns, seed=args.seed, log=log)
        lines = [*legend(families), "", *table(rows), "", f"wall time {time.perf_counter() - t0:.0f} s"]
    print("\n".join(lines))
    if args.json:
        plain = [r | ({"mde80": None if math.isinf(r["mde80"]) else r["mde80"]} if "mde80" in r else {})
                 for r in rows]  # inf: never 80 %
        args.json.write_text(json.dumps({"families": families, "seed": args.seed, "rows": plain}, indent=1) + "\n")
    if args.append:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        import common  # noqa: PLC0415 (torch: only when appending)

        common.append_results("Verdict calibration (issue 28)", common.command_line(), lines)


if __name__ == "__main__":
    main()

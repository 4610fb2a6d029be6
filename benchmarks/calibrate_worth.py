"""Calibration of compute multipliers (issue 47): ladders with known laws and known multipliers through the real
fit, inversion and judging code (report.worth.compute_worth / data_worth; no copy of either).

Each simulated ladder is one study at K rungs (compute C_k = C0 x 2^k, a width ladder that doubles its
FLOPs per rung) with two ends and five arms each, n seeds:
  add-one     the reference end's law L(C) = 1.3 + 2.2 (C / C0)^-0.15 (0.23 nats/char per doubling at the
              first rung, 0.12 at the eighth), arms worth ADD (1x, 1.2x, 2x, 0.8x, 1x); the 0.8x arm costs
              0.9x the FLOPs per token (GQA's place: a cheaper arm's cost is counted in its multiplier)
  remove-one  the all-on end's law L(C) = 1.1 + 1.8 (C / C0)^-0.18, arms worth REMOVE (1x, 1/1.2, 1/2, 1.25, 1x)
An arm worth m at a rung with cost c has the true loss L(m c) of its end's true curve: m is the multiplier
by definition, also where the fitted law is of the wrong form. Every run's loss adds a seed effect shared by
every config and rung of the seed (sd SEED), a seed-and-rung effect shared by the configs of one rung (its
data order there: cancels in the pairs, not in the law's rung means) and the run's own noise (sd
paired / sqrt 2), Normal, or Student t on 3 df scaled to the same sd.
Noise settings (paired sd; seed; seed-and-rung), from the shipped studies (experiments/results/*.json: end
seed sds 0.011 (five-flips, scale L) to 0.069 (demo), paired sds 0.003 to 0.05 (scale.json's 30 effects,
median 0.017)):
  quiet  0.005; 0.005; 0.005        mid  0.015; 0.015; 0.015        demo  0.04; 0.02; 0.03 (end sd 0.046)
Scenarios: null (every arm 1x: the family-wise error of the calls at 1x) and mixed (the arms above).
Laws: right (the data's law, its floor fitted), and wrong:
  floor +1/3, +1/6, -1/6, -1/3   the law fitted with its floor given (worth's `floor`) a third or a sixth
                                  off the true one (the data's law otherwise)
  bend 1/2, bend 1               the true curve bends in log-log: the local exponent of L - L_inf runs
                                  from (1 - b/2) alpha at the first rung to (1 + b/2) alpha at the last
                                  (b = 1/2 or 1; every K has the same bend across its span); a free floor
Data axis: the same ladders judged by data_worth, rungs being token budgets (warmup-stable-decay branches of
one run share their stable phase: the seed-and-rung effect is a third of mid's, the seed effect 3x).
Measures per setting: the family-wise error (P(any helps/hurts on an arm worth 1x, or of the wrong sign, in
one rung's family), null scenario), coverage (P(every interval of a rung's family inside the ladder holds
its truth), both scenarios; per interval beside it), the coverage of the extrapolated intervals, the bias
of the point estimate (the geometric mean of multiplier / truth - 1 per true multiplier, inside the ladder),
the power (P(helps) of the 1.2x and 2x arms), the share extrapolated, and how often lack_of_fit flags the law.
Monte-Carlo sd of a rate p over F families x K rungs: sqrt(p (1 - p) / (F K)) at worst (rungs of one ladder
share its law, so their families are not independent; the table's +/- is the per-ladder one, larger).

    python benchmarks/calibrate_worth.py --list                     # the settings, numbered
    python benchmarks/calibrate_worth.py --only 0-11 --ladders 400  # a piece of the grid (~15 min)
    python benchmarks/calibrate_worth.py --quick                    # 40 ladders, three settings
    python benchmarks/calibrate_worth.py --trends --only 8,17 --ladders 150   # trends, truths flat

Trends (--trends): the same ladders with worth.worth_trends on, the true multipliers equal at every rung, so
any grows, shrinks or reverses sign is false: per ladder and scenario (one family, scale.trends) and per trend.
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

from anatomy_cli.report import scale, stats, worth
from anatomy_cli.spec.roles import ADD_ONE, REMOVE_ONE

C0 = 1e12
LAWS = {ADD_ONE: (1.3, 2.2, 0.15), REMOVE_ONE: (1.1, 1.8, 0.18)}  # (floor, scale at C0, alpha)
FLIPS = ("rmsnorm", "prenorm", "rope", "swiglu", "gqa")
ADD = (1.0, 1.2, 2.0, 0.8, 1.0)
REMOVE = (1.0, 1 / 1.2, 0.5, 1.25, 1.0)
CHEAP = 3  # the arm that costs 0.9x FLOPs per token (gqa's place)
NOISE = {"quiet": (0.005, 0.005, 0.005), "mid": (0.015, 0.015, 0.015), "demo": (0.04, 0.02, 0.03)}


@dataclass(frozen=True)
class Setting:
    """One cell of the grid."""

    law: str = "right"  # right | floor +1/3 | ... | bend 1
    noise: str = "mid"
    rungs: int = 6
    seeds: int = 3
    axis: str = worth.COMPUTE
    tails: str = "normal"  # or t3

    @property
    def name(self) -> str:
        extra = (", data axis" if self.axis == worth.DATA else "") + (", t(3) tails" if self.tails == "t3" else "")
        return f"{self.law}, {self.noise}, K={self.rungs}, n={self.seeds}{extra}"


def grid() -> list[Setting]:
    """The settings: the right law over noise x rungs x seeds, then the wrong laws at mid noise."""
    out = [Setting("right", noise, k, n) for noise in ("quiet", "mid", "demo") for k in (4, 6, 8) for n in (3, 5)]
    out += [Setting("right", "demo", 6, 3, tails="t3"), Setting("right", "mid", 4, 3, worth.DATA),
            Setting("right", "mid", 6, 5, worth.DATA), Setting("right", "mid", 6, 10)]
    out += [Setting(law, "mid", k, 3) for law in ("floor +1/3", "floor +1/6", "floor -1/6", "floor -1/3", "bend 1/2",
                                                   "bend 1") for k in (4, 8)]
    return out


# ------------------------------------------------------------------------------- true curves


def true_loss(direction: str, c: np.ndarray, s: Setting) -> np.ndarray:
    """The end's true loss at compute c: its law, bent in log-log for the bend settings."""
    e, a, alpha = LAWS[direction]
    x = np.log(np.asarray(c, dtype=float) / C0)
    if s.law.startswith("bend"):
        b = {"bend 1/2": 0.5, "bend 1": 1.0}[s.law]
        span = (s.rungs - 1) * math.log(2)  # the local exponent alpha (1 - b/2 + b x / span)
        return e + a * np.exp(-alpha * ((1 - b / 2) * x + b * x**2 / (2 * span)))
    return e + a * np.exp(-alpha * x)


def given_floor(direction: str, s: Setting) -> float | None:
    """The floor the fit is given (None: fitted)."""
    if not s.law.startswith("floor"):
        return None
    off = {"floor +1/3": 1 / 3, "floor +1/6": 1 / 6, "floor -1/6": -1 / 6, "floor -1/3": -1 / 3}[s.law]
    return LAWS[direction][0] * (1 + off)


def truths(scenario: str) -> dict[str, tuple[float, ...]]:
    return {ADD_ONE: ADD if scenario == "mixed" else (1.0,) * 5,
            REMOVE_ONE: REMOVE if scenario == "mixed" else (1.0,) * 5}


# ------------------------------------------------------------------------------- simulated ladders


def simulate(rng: np.random.Generator, s: Setting, scenario: str, ladders: int, first: int = 0) -> pd.DataFrame:
    """LADDER_COLUMNS for `ladders` studies (series 'L<i>'), one row per run."""
    paired, seed_sd, rung_sd = NOISE[s.noise]
    if s.axis == worth.DATA:
        seed_sd, rung_sd = 3 * seed_sd, rung_sd / 3
    k, n, own = s.rungs, s.seeds, paired / math.sqrt(2)
    cost = C0 * 2.0 ** np.arange(k)
    frames = []
    for direction, ms in truths(scenario).items():
        arms = [("", 1.0, 1.0)] + [(f, m, 0.9 if i == CHEAP else 1.0) for i, (f, m) in enumerate(zip(FLIPS, ms))]
        draw = (rng.standard_t(3, (ladders, len(arms), k, n)) / math.sqrt(3.0) if s.tails == "t3"
                else rng.normal(size=(ladders, len(arms), k, n)))
        shared = rng.normal(0, seed_sd, (ladders, 1, 1, n)) + rng.normal(0, rung_sd, (ladders, 1, k, n))
        price = np.array([c for _, _, c in arms])[:, None] * cost[None, :]  # (arms, K) cost per run
        value = np.array([m for _, m, _ in arms])[:, None] * price
        loss = true_loss(direction, value, s)[None, :, :, None] + shared + own * draw
        idx = np.indices(loss.shape).reshape(4, -1)
        frames.append(pd.DataFrame({
            "series": np.char.add("L", (first + idx[0]).astype(str)), "rung": np.char.add("r", idx[2].astype(str)),
            "direction": direction, "flip": np.array([a for a, _, _ in arms], dtype=object)[idx[1]], "against": "",
            "seed": idx[3], "loss": loss.reshape(-1), "flops": price[idx[1], idx[2]],
            "tokens": price[idx[1], idx[2]], "tokens_per_s": math.nan}))
    return pd.concat(frames, ignore_index=True)


def judged(s: Setting, ladder: pd.DataFrame, floor: dict, trends: bool = False) -> worth.Worth:
    """The real code: compute_worth (or data_worth), per end its own given floor (None: fitted)."""
    fn = worth.data_worth if s.axis == worth.DATA else worth.compute_worth
    if floor[ADD_ONE] is None:
        return fn(ladder, trends=trends)
    parts = [fn(ladder[ladder["direction"] == d], floor=floor[d], trends=trends) for d in (ADD_ONE, REMOVE_ONE)]
    return worth.Worth(parts[0].axis, parts[0].margin, pd.concat([p.laws for p in parts]),
                       pd.concat([p.multipliers for p in parts], ignore_index=True),
                       pd.concat([p.trends for p in parts], ignore_index=True))


def _truth_of(frame: pd.DataFrame, scenario: str) -> np.ndarray:
    table = {(d, f): m for d, ms in truths(scenario).items() for f, m in zip(FLIPS, ms)}
    return np.array([table[(d, f)] for d, f in zip(frame["direction"], frame["flip"])])


def run_setting(rng: np.random.Generator, s: Setting, ladders: int, batch: int = 50) -> dict:
    """Both scenarios' multipliers (with their truths) over `ladders` simulated ladders, and the laws."""
    floor = {d: given_floor(d, s) for d in (ADD_ONE, REMOVE_ONE)}
    out: dict[str, list] = {"null": [], "mixed": [], "laws": []}
    for scenario in ("null", "mixed"):
        for first in range(0, ladders, batch):
            b = min(batch, ladders - first)
            w = judged(s, simulate(rng, s, scenario, b, first), floor)
            out[scenario].append(w.multipliers.assign(truth=_truth_of(w.multipliers, scenario)))
            out["laws"].append(w.laws)
    return {k: pd.concat(v, ignore_index=True) for k, v in out.items()}


def trend_cell(rng: np.random.Generator, s: Setting, ladders: int, batch: int = 25) -> dict:
    """Trends (worth.worth_trends: scale.trends on the pseudo-values) of both scenarios, whose true multipliers
    are the same at every rung: any grows, shrinks or reverses sign is false."""
    floor = {d: given_floor(d, s) for d in (ADD_ONE, REMOVE_ONE)}
    frames = []
    for scenario in ("null", "mixed"):
        for first in range(0, ladders, batch):
            w = judged(s, simulate(rng, s, scenario, min(batch, ladders - first), first), floor, trends=True)
            frames.append(w.trends.assign(scenario=scenario))
    t = pd.concat(frames, ignore_index=True)
    false = t["call"].isin([scale.GROWS, scale.SHRINKS, scale.REVERSES])
    held = t[t["scenario"] == "mixed"]
    return {"setting": s.name, "ladders": ladders, "false_any": float(false.groupby([t["scenario"], t["series"]]).any()
                                                                     .mean()),
            "false_each": float(false.mean()), "holds_mixed": float((held["call"] == scale.HOLDS).mean())}


# ------------------------------------------------------------------------------- measures


def family_rates(m: pd.DataFrame) -> pd.DataFrame:
    """Per (ladder, rung) family: any false call, every inside interval holding its truth."""
    helps, hurts = m["call"] == stats.HELPS, m["call"] == stats.HURTS
    worth_true = np.where(m["direction"] == ADD_ONE, 1.0, -1.0) * np.log(m["truth"])
    false = (helps & (worth_true <= 0)) | (hurts & (worth_true >= 0))
    holds = (m["low"] <= m["truth"] * (1 + 1e-12)) & (m["truth"] <= m["high"] * (1 + 1e-12))
    frame = m.assign(false=false, holds=holds | m["extrapolated"])
    return frame.groupby(["series", "rung"]).agg(false=("false", "any"), covered=("holds", "all"))


def summarise(s: Setting, cells: dict, ladders: int) -> dict:
    null, mixed = cells["null"], cells["mixed"]
    fam_null, fam_mixed = family_rates(null), family_rates(mixed)
    both = pd.concat([null, mixed], ignore_index=True)
    inside = both[~both["extrapolated"]]
    holds = (both["low"] <= both["truth"]) & (both["truth"] <= both["high"])
    out = {"setting": s.name, "ladders": ladders, "fwer": float(fam_null["false"].mean()),
           "fwer_ladder": float(fam_null.groupby("series")["false"].any().mean()),
           "false_mixed": float(fam_mixed["false"].mean()),
           "coverage": float(pd.concat([fam_null["covered"], fam_mixed["covered"]]).mean()),
           "coverage_each": float(holds[~both["extrapolated"]].mean()),
           "coverage_extrapolated": float(holds[both["extrapolated"]].mean()) if both["extrapolated"].any()
           else math.nan, "extrapolated": float(both["extrapolated"].mean()),
           "lack_of_fit": float((cells["laws"]["lack_of_fit_p"] < worth.LACK_OF_FIT_P).mean())}
    ratio = np.log(inside["multiplier"] / inside["truth"])
    out["bias"] = {f"{t:.3g}": 100 * (math.exp(float(ratio[np.isclose(inside["truth"], t)].mean())) - 1)
                   for t in sorted(set(np.round(inside["truth"], 6)))}
    power = mixed[~mixed["extrapolated"]]
    out["power"] = {f"{t:g}x": float((power.loc[np.isclose(power["truth"], t) & (power["direction"] == ADD_ONE),
                                                 "call"] == stats.HELPS).mean()) for t in (1.2, 2.0)}
    return out


def table(rows: list[dict]) -> list[str]:
    """The markdown table of the rows."""
    head = ("| setting | FWE (rung) | FWE (ladder) | false, mixed | coverage (rung) | each | extrapolated: share, "
            "coverage | bias 0.5 / 0.8 / 1 / 1.2 / 2x | P(helps) 1.2x / 2x | law flagged |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        b = r["bias"]
        bias = " / ".join(f"{b[k]:+.1f}" if k in b else "-" for k in ("0.5", "0.8", "1", "1.2", "2"))
        mc = math.sqrt(max(r["fwer"] * (1 - r["fwer"]), 0.01) / r["ladders"])
        lines.append(f"| {r['setting']} | {100 * r['fwer']:.1f} ± {100 * mc:.1f} % | {100 * r['fwer_ladder']:.1f} % "
                     f"| {100 * r['false_mixed']:.1f} % | {100 * r['coverage']:.1f} % | "
                     f"{100 * r['coverage_each']:.1f} % | "
                     f"{100 * r['extrapolated']:.0f} %, {100 * r['coverage_extrapolated']:.1f} % | {bias} % | "
                     f"{100 * r['power']['1.2x']:.0f} / "
                     f"{100 * r['power']['2x']:.0f} % | {100 * r['lack_of_fit']:.0f} % |")
    return lines


def parse_only(text: str | None, count: int) -> list[int]:
    if not text:
        return list(range(count))
    out = []
    for part in text.split(","):
        a, _, b = part.partition("-")
        out += list(range(int(a), int(b or a) + 1))
    return [i for i in out if 0 <= i < count]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ladders", type=int, default=400, help="simulated ladders per setting and scenario")
    p.add_argument("--only", help="settings by number (--list), e.g. 0-5,12")
    p.add_argument("--list", action="store_true", help="print the settings, numbered, and exit")
    p.add_argument("--quick", action="store_true", help="40 ladders, three settings")
    p.add_argument("--trends", action="store_true", help="the trends' false-call rate instead (constant truths)")
    p.add_argument("--seed", type=int, default=47)
    p.add_argument("--json", type=Path, help="append each setting's row to this JSON-lines file")
    p.add_argument("--table", type=Path, help="print the table of a --json file's rows and exit")
    args = p.parse_args(argv)
    if args.table:
        print("\n".join(table([json.loads(line) for line in args.table.read_text().splitlines() if line])))
        return 0
    settings = grid()
    if args.list:
        for i, s in enumerate(settings):
            print(f"{i:3d}  {s.name}")
        return 0
    chosen = [0, 8, 24] if args.quick else parse_only(args.only, len(settings))
    ladders = 40 if args.quick else args.ladders
    rows = []
    for i in chosen:
        t0 = time.perf_counter()
        rng = np.random.default_rng([args.seed, i])
        if args.trends:
            rows.append(trend_cell(rng, settings[i], ladders))
            print(json.dumps(rows[-1]), flush=True)
            continue
        rows.append(summarise(settings[i], run_setting(rng, settings[i], ladders), ladders))
        print(f"[{i}] {settings[i].name}: {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
        if args.json:
            with args.json.open("a") as f:
                f.write(json.dumps(rows[-1]) + "\n")
    if not args.trends:
        print("\n".join(table(rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

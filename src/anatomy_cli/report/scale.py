"""Effects across model sizes: does a component's gain grow, hold, shrink or reverse sign as the
model grows? Read from a study with a size ladder ([[sizes]]); no torch.

  size_table    one row per size: its non-embedding parameters, budget, and flags (still improving,
                overfit) that change what its effects mean
  by_size       each component's effect at each size: the report's judged effects, placed on the ladder
  trends        per component and direction: the slope of its gain against log10 parameters over
                seeds, with its simultaneous interval over the study's trends, and its call
  scale_call    the rule on one component's numbers
  scale_frames  the three frames from the report's frames

The rule. x = log10 of a size's non-embedding parameters (ModelConfig.non_embedding_params: every
parameter but the token table, the head and the position table) of the size's reference end, the
number scale-plan prints for the size (a sized study without a reference end: the median over the
size's runs, whose configs differ by a few percent). For each component and direction:
  per seed that has a completed pair at every size, the OLS slope of its gains on x (bits per byte per
  tenfold parameters); the trend is the mean slope over seeds, and the trends of one ladder (a
  series) are one family judged by stats.judge, the rule of every call in the report: each gets a
  simultaneous interval (slope_adj_low/high, level 1 - alpha/m over the ladder's m trends, each
  trend's own t; slope_low/high keep the raw 95% one) and a Holm p as a detail. A trend counts when its
  simultaneous interval excludes 0 and the fitted change across the ladder (slope x decades
  spanned) is larger than the margin (the verdict's): the same two parts as every call of the
  report, so no trend is called from an interval that holds 0, nor left uncalled beside one that
  does not. A trend is flat when the change its interval allows across the ladder lies inside
  (-margin, +margin): the equivalence test behind "holds", as "negligible" is for one effect.
  reverses sign   it helps at one size and hurts at another (the verdict's calls at each size), or a
                  trend that counts whose fitted line crosses zero inside the ladder
  grows/shrinks   a trend that counts: grows when the fitted |gain| is larger at the largest size
                  than at the smallest, shrinks otherwise
  not called at any size   no size's call is helps or hurts, and no trend counts
  holds           it helps (or hurts) at some size, never the opposite, and the trend is flat
  no trend detected   it helps (or hurts) at some size, but neither a trend nor flatness is shown
  too few seeds   fewer than MIN_PAIRS seeds with every size, or fewer than two sizes: no call. Where
                  the study has the seeds, the call names what is missing instead (trend_cause):
                    one parameter count: no trend   the sizes with pairs share one parameter count
                    size M diverged: no trend | size M still running | size M has no completed runs
                        fewer than two sizes have a pair, and why (M: the first size without)
                    2 seeds with every size: runs diverged at L (or: still running, unfinished)
                        seeds lost at some size, and how
Why per-seed slopes and not one pooled fit: the seed is what replicates. A seed's runs at every size
share its data order and its draws, so its effects at two sizes can move together; a pooled fit of
sizes x seeds points would take them for independent and understate the slope's interval, while a
slope per seed differences away what a seed shares across sizes and leaves independent slopes, whose
t interval is exact for normal slopes. The cost: seeds missing a size are left out of the trend.

Flags, per size (its completed runs): "still improving" when a run's best val loss is at its last
evaluation (more steps would lower it, and may reorder effects), "overfit" when a run's best came
before half its steps (the corpus is being memorised; what is compared is partly memory).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from anatomy_cli.report import stats
from anatomy_cli.report.frames import LOSS_METRIC, run_flags
from anatomy_cli.spec.roles import END_OF, REFERENCE, variant
from anatomy_cli.store import runs as runs_mod

HOLDS, GROWS, SHRINKS, REVERSES, NOISE_ALL = "holds", "grows", "shrinks", "reverses sign", "not called at any size"
NO_TREND = "no trend detected"
ONE_COUNT = "one parameter count: no trend"
CALLS = (HOLDS, GROWS, SHRINKS, REVERSES, NOISE_ALL, NO_TREND, stats.TOO_FEW, ONE_COUNT)  # + causes (trend_cause)
STILL_IMPROVING, OVERFIT = "still improving", "overfit"

SIZE_COLUMNS = ["series", "size", "non_embedding_params", "params", "steps", "tokens", "tokens_per_param", "runs",
                "still_improving", "overfit", "flags"]
BY_SIZE_COLUMNS = ["series", "flip", "direction", "against", "size", "non_embedding_params", "steps", "tokens",
                   "n_pairs", "gain", "adj_low", "adj_high", "call", "flags"]
TREND_COLUMNS = ["series", "flip", "direction", "against", "sizes", "n_seeds", "slope", "slope_adj_low",
                 "slope_adj_high", "adj_level", "slope_low", "slope_high", "p_value", "p_holm", "fit_smallest",
                 "fit_largest", "change", "margin", "call"]


def scale_call(size_calls: list[str], n_seeds: int, n_sizes: int, slope_adj: tuple[float, float],
               fit: tuple[float, float], margin: float, span: float, cause: str = "") -> str:
    """The call of one component and direction (the rule above). size_calls: its verdict call at each
    size; slope_adj: the slope's simultaneous interval; fit: the fitted mean gain at the smallest and
    the largest size; margin: the smallest change that matters (NaN: the interval alone decides, and
    nothing is flat); span: the decades of parameters the ladder spans; cause: why there is no trend
    to call when the runs say (trend_cause; '': too few seeds)."""
    if n_sizes < 2 or n_seeds < stats.MIN_PAIRS:
        return cause or stats.TOO_FEW
    if stats.HELPS in size_calls and stats.HURTS in size_calls:
        return REVERSES
    change = fit[1] - fit[0]
    margin = margin if math.isfinite(margin) else 0.0
    low, high = slope_adj
    if (low > 0 or high < 0) and abs(change) > margin:  # NaN bounds compare false: no trend
        if fit[0] * fit[1] < 0:  # the fitted line crosses zero inside the ladder
            return REVERSES
        return GROWS if abs(fit[1]) > abs(fit[0]) else SHRINKS
    if stats.HELPS not in size_calls and stats.HURTS not in size_calls:
        return NOISE_ALL
    flat = -margin < low * span and high * span < margin  # every change the interval allows is inside the margin
    return HOLDS if flat else NO_TREND


def series_of(group: str, size: str) -> str:
    """What a group holds besides its size ('size M, lr=0.001' -> 'lr=0.001'): the sizes of one series
    differ in nothing else, so their effects form one line."""
    return ", ".join(p for p in group.split(", ") if p != f"size {size}")


def size_table(runs: pd.DataFrame, curves: pd.DataFrame, names: list[str] = ()) -> pd.DataFrame:
    """SIZE_COLUMNS, one row per series and size, smallest first: parameters (its reference end's,
    else the median over its runs), steps, tokens per run and per non-embedding parameter, and its
    flags (counts of completed runs)."""
    last = curves[curves["split"] == "val"].groupby("run_id")["step"].max()
    sized = runs[runs["size"] != ""]
    rows = []
    for (group, size), members in sized.assign(group=_group_labels(sized)).groupby(["group", "size"], sort=False):
        settings = json.loads(members["settings"].iloc[0])
        steps = settings.get("train.steps")
        tokens = steps * settings.get("train.batch_size", 0) * settings.get("model.ctx_len", 0) if steps else None
        done = members[members["status"] == "completed"]
        best = done["best_step"].astype(float)
        improving, overfit = (int(flag.sum()) for flag in run_flags(
            best, done["run_id"].map(last).astype(float), steps or math.nan))
        basis = members[members["role"] == REFERENCE]  # the size's reference end, as scale-plan
        basis = basis if len(basis) else members  # a sized list design: the median over its runs
        n = float(basis["non_embedding_params"].median())
        flags = [f"{STILL_IMPROVING} ({improving} of {len(done)} runs)" if improving else "",
                 f"{OVERFIT} ({overfit} of {len(done)} runs)" if overfit else ""]
        rows.append({"series": series_of(group, size), "size": size, "non_embedding_params": int(n),
                     "params": int(basis["params"].median()) if basis["params"].notna().any() else None,
                     "steps": steps, "tokens": tokens, "tokens_per_param": tokens / n if tokens and n else None,
                     "runs": len(done), "still_improving": improving, "overfit": overfit,
                     "flags": "; ".join(filter(None, flags))})
    df = pd.DataFrame(rows, columns=SIZE_COLUMNS)
    order = {name: i for i, name in enumerate(names)}  # sizes that share a count: the ladder's order
    df = df.sort_values("size", key=lambda s: s.map(lambda n: order.get(n, len(order))), kind="stable")
    return df.sort_values(["series", "non_embedding_params"], kind="stable").reset_index(drop=True)


def _group_labels(runs: pd.DataFrame) -> pd.Series:
    """Each run's group label, as the report names its effects' groups."""
    from anatomy_cli.report import effects as effects_mod

    out = pd.Series("", index=runs.index, dtype=object)
    for group, members in effects_mod.groups(runs):
        out[members.index] = group
    return out


def by_size(loss_effects: pd.DataFrame, gains: pd.DataFrame, sizes: pd.DataFrame) -> pd.DataFrame:
    """BY_SIZE_COLUMNS: the report's judged loss effects of the sized groups, each on its size's row."""
    where = gains[gains["size"] != ""].drop_duplicates("group").set_index("group")["size"]
    eff = loss_effects[loss_effects["group"].isin(where.index)].copy()
    eff["size"] = eff["group"].map(where)
    eff["series"] = [series_of(g, s) for g, s in zip(eff["group"], eff["size"])]
    placed = sizes[["series", "size", "non_embedding_params", "steps", "tokens", "flags"]].assign(
        _rung=np.arange(len(sizes)))  # the size table's order: by parameters, then the ladder's
    merged = eff.merge(placed, on=["series", "size"], how="left")
    merged = merged.sort_values(["series", "flip", "direction", "_rung"], kind="stable")
    return merged[BY_SIZE_COLUMNS].reset_index(drop=True)


def trends(gains: pd.DataFrame, effects_by_size: pd.DataFrame, margin: float,
           runs: pd.DataFrame | None = None, alpha: float = stats.ALPHA) -> pd.DataFrame:
    """TREND_COLUMNS: per series, component and direction, the per-seed slopes of gain on log10 N
    (gains: effects.seed_gains rows with series and non_embedding_params), judged together as one
    family (stats.judge: simultaneous intervals, Holm p), and the call (scale_call) with the verdict's
    calls at each size (effects_by_size). runs (the sized runs with series, as scale_frames gives
    them): what a call without a trend names as its cause (trend_cause); None: too few seeds. alpha: the
    study's family-wise alpha, as its size effects were judged (a --decide study's looks' alpha)."""
    rows = []
    for (series, flip, direction), cell in gains.groupby(["series", "flip", "direction"], sort=False):
        table = cell.pivot_table(index="seed", columns="size", values="gain", aggfunc="first")
        complete = table.dropna()
        x = np.log10(cell.groupby("size")["non_embedding_params"].first()[complete.columns].to_numpy(float))
        n_sizes = len(set(x.tolist()))
        fits = [np.polyfit(x, g, 1) for g in complete.to_numpy(float)] if n_sizes >= 2 else []
        st = stats.paired([b for b, _ in fits])
        mean_a = float(np.mean([a for _, a in fits])) if fits else math.nan
        fit = (mean_a + st["gain"] * x.min(), mean_a + st["gain"] * x.max()) if fits else (math.nan, math.nan)
        calls = effects_by_size.loc[(effects_by_size["series"] == series) & (effects_by_size["flip"] == flip)
                                    & (effects_by_size["direction"] == direction), "call"].tolist()
        cause = ("" if runs is None or (n_sizes >= 2 and len(fits) >= stats.MIN_PAIRS)
                 else trend_cause(table, x, cell_runs(runs, series, flip, direction)))
        rows.append({"series": series, "flip": flip, "direction": direction, "against": cell["against"].iloc[0],
                     "sizes": n_sizes, "n_seeds": len(fits), "slope": st["gain"], "slope_low": st["raw_low"],
                     "slope_high": st["raw_high"], "p_value": st["p_value"], "fit_smallest": fit[0],
                     "fit_largest": fit[1], "change": fit[1] - fit[0], "margin": margin, "calls": calls,
                     "cause": cause, "span": float(np.ptp(x)) if len(x) else 0.0, "st": st})
    for series in dict.fromkeys(r["series"] for r in rows):  # one family per ladder
        family = [r for r in rows if r["series"] == series]
        for r, judged in zip(family, stats.judge([r["st"] for r in family], math.nan, alpha)):
            r |= {"slope_adj_low": judged["adj_low"], "slope_adj_high": judged["adj_high"],
                  "adj_level": judged["adj_level"], "p_value": judged["p_value"], "p_holm": judged["p_holm"]}
    df = pd.DataFrame(rows, columns=[*TREND_COLUMNS, "calls", "cause", "span"])
    df["call"] = [scale_call(r.calls, r.n_seeds, r.sizes, (r.slope_adj_low, r.slope_adj_high),
                             (r.fit_smallest, r.fit_largest), margin, r.span, r.cause) for r in df.itertuples()]
    return df[TREND_COLUMNS]


def cell_runs(runs: pd.DataFrame, series: str, flip: str, direction: str) -> pd.DataFrame:
    """The runs one component's effects in one direction are paired from: its end's and its variant's,
    at every size of the series."""
    return runs[(runs["series"] == series) & runs["role"].isin([END_OF[direction], variant(flip, direction)])]


def trend_cause(table: pd.DataFrame, x: np.ndarray, runs: pd.DataFrame) -> str:
    """Why one component has no trend to call, when the study has the seeds for one: '' (too few
    seeds: fewer than MIN_PAIRS seeds among its runs) or the cause its runs show. table: gains by seed
    and size (the sizes with a pair); x: log10 parameters of its complete sizes; runs: cell_runs."""
    ladder = list(dict.fromkeys(runs.sort_values("non_embedding_params", kind="stable")["size"]))
    with_pairs = [s for s in ladder if s in table.columns]
    if len(ladder) < 2:
        return "one size: no trend"
    if len(with_pairs) < 2:
        return size_cause(next(s for s in ladder if s not in table.columns), runs)
    if len(set(x.tolist())) < 2:
        return ONE_COUNT
    if runs["seed"].nunique() < stats.MIN_PAIRS:
        return ""
    lost = {s: runs[(runs["size"] == s) & ~runs["seed"].isin(table[s].dropna().index)] for s in with_pairs}
    lost = {s: r for s, r in lost.items() if len(r)}
    n = len(table.dropna())
    for status, word in ((runs_mod.RUNNING, "still running"), (runs_mod.DIVERGED, "diverged")):
        where = [s for s, r in lost.items() if (r["status"] == status).any()]
        if where:
            return f"{n} seed{'s' * (n != 1)} with every size: runs {word} at {', '.join(where)}"
    where = [s for s, r in lost.items() if (r["status"] != runs_mod.COMPLETED).any()]
    return f"{n} seed{'s' * (n != 1)} with every size: runs unfinished at {', '.join(where)}" if where else ""


def size_cause(size: str, runs: pd.DataFrame) -> str:
    """Why a size has no pair: 'size M still running' | 'size M diverged: no trend' | 'size M has no
    completed runs' | 'size M has no completed pairs' (runs: the cell's runs, every size)."""
    status = runs.loc[runs["size"] == size, "status"]
    if (status == runs_mod.RUNNING).any():
        return f"size {size} still running"
    if (status == runs_mod.DIVERGED).any():
        return f"size {size} diverged: no trend"
    if not (status == runs_mod.COMPLETED).any():
        return f"size {size} has no completed runs"
    return f"size {size} has no completed pairs"


def ladder_notes(sizes: pd.DataFrame, runs: pd.DataFrame, ladder: list[str]) -> list[str]:
    """What stands in the way of a trend, with its fix, for the section: sizes that share one parameter
    count, sizes without completed runs (diverged, failed, still running), ladder sizes without runs."""
    from anatomy_cli.report import verdict as vd

    notes = []
    for series, table in sizes.groupby("series", sort=False):
        where = f" [{series}]" if series else ""
        for n, same in table.groupby("non_embedding_params", sort=False):
            if len(same) > 1:
                names = " and ".join([", ".join(same["size"].iloc[:-1]), same["size"].iloc[-1]])
                notes.append(f"Sizes {names}{where} share one non-embedding parameter count ({int(n):,}): no trend "
                             f"can be fitted between them. Make sizes differ in width or depth (model.d_model, "
                             f"model.n_layer), not only in what the count leaves out (model.ctx_len, the "
                             f"vocabulary).")
        for size in table.loc[table["runs"] == 0, "size"]:
            members = runs[(runs["series"] == series) & (runs["size"] == size) & (runs["role"] != "")]
            diverged = members[members["status"] == runs_mod.DIVERGED]
            if (members["status"] == runs_mod.RUNNING).any():
                text = f"Size {size}{where} has no completed runs yet: it is still running; report again when it ends."
            elif len(diverged):
                text = (f"Size {size}{where} has no completed runs: {vd.diverged_text(diverged)}. Its seeds are all "
                        f"there, so more seeds would train nothing: {vd.divergence_fix(diverged, 'this size')} in its "
                        f"[[sizes]] entry, then run the study again (a changed config trains anew).")
            else:
                counts = ", ".join(f"{k} {st}" for st, k in members["status"].value_counts().items())
                text = (f"Size {size}{where} has no completed runs ({counts or 'none'}): each run's summary.json says "
                        f"why; running the study again trains them again.")
            notes.append(text)
    have = set(sizes["size"])
    notes += [f"Size {s} of the ladder has no runs yet." for s in ladder if s not in have]
    return notes


@dataclass(frozen=True)
class Scale:
    """A sized study's numbers for the report: size_table, by_size and trends frames, and the
    budget rule ({"budget": "same-steps" | "tokens-per-param", "tokens_per_param"?})."""

    sizes: pd.DataFrame
    by_size: pd.DataFrame
    trends: pd.DataFrame
    budget: dict
    notes: tuple[str, ...] = ()  # what stands in the way of a trend, and its fix (ladder_notes)

    def record(self) -> dict:
        """The report JSON's `scale` key (NaN -> null; the margin named as files name it: as_written)."""
        from anatomy_cli.report.frames import as_written, records

        return {"budget": self.budget, "sizes": records(self.sizes), "effects": records(self.by_size),
                "trends": records(as_written(self.trends))}


def by_size_csv(s: Scale) -> pd.DataFrame:
    """effects-by-size.csv: each effect at each size (BY_SIZE_COLUMNS) with its component's trend
    and call across sizes beside it (slope, its simultaneous and raw intervals, p_holm, scale_call)."""
    trend = s.trends[["series", "flip", "direction", "slope", "slope_adj_low", "slope_adj_high", "slope_low",
                      "slope_high", "p_holm", "call"]]
    return s.by_size.merge(trend.rename(columns={"call": "scale_call"}), on=["series", "flip", "direction"], how="left")


def scale_frames(runs: pd.DataFrame, curves: pd.DataFrame, effects: pd.DataFrame, studies: dict | None = None,
                 metric: str = LOSS_METRIC) -> Scale | None:
    """The sized groups under the report's runs, judged (Scale); None without two sizes. studies: the study
    folders' sweep.json records (frames.load_runs'), where the ladder's size names and budget rule are."""
    from anatomy_cli.report import effects as effects_mod

    if "size" not in runs or runs.loc[runs["role"] != "", "size"].replace("", np.nan).nunique() < 2:
        return None
    ladder = _ladder(runs, studies or {})
    names = list(dict.fromkeys(size["name"] for size in ladder))
    sizes = size_table(runs, curves, names)
    gains = effects_mod.seed_gains(runs, metric)
    gains = gains[gains["size"] != ""].copy()
    gains["series"] = [series_of(g, s) for g, s in zip(gains["group"], gains["size"])]
    gains = gains.merge(sizes[["series", "size", "non_embedding_params"]], on=["series", "size"], how="left")
    loss = effects[effects["metric"] == metric]
    placed = by_size(loss, gains, sizes)
    margin = float(loss["margin"].iloc[0]) if len(loss) else math.nan
    sized = runs[runs["size"] != ""]
    sized = sized.assign(series=[series_of(g, s) for g, s in zip(_group_labels(sized), sized["size"])])
    sized = sized.drop(columns="non_embedding_params").merge(sizes[["series", "size", "non_embedding_params"]],
                                                             on=["series", "size"], how="left")
    # the study's alpha, as its loss families were judged: level = 1 - alpha / family (a --decide study's looks')
    tested = loss[loss["family"] > 0]
    alpha = float(((1 - tested["adj_level"]) * tested["family"]).iloc[0]) if len(tested) else stats.ALPHA
    return Scale(sizes, placed, trends(gains, placed, margin, sized, alpha), budget_rule(ladder),
                 tuple(ladder_notes(sizes, sized, names)))


def _ladder(runs: pd.DataFrame, studies: dict) -> list[dict]:
    """The sizes the sized runs' sweep.json records name, in ladder order (runs or not)."""
    folders = dict.fromkeys(Path(p).parent for p in runs.loc[runs["size"] != "", "path"])
    return [size for f in folders if studies.get(f) is not None for size in studies[f].sizes]


def budget_rule(ladder: list[dict]) -> dict:
    """The size ladder's budget rule as sweep.json records it: {"budget", "tokens_per_param"?}."""
    return next(({k: size[k] for k in ("budget", "tokens_per_param") if k in size} for size in ladder), {})

"""The answer a report leads with: each component's worth, ranked, and what it holds for (no torch).

  verdict_frame   judged loss effects -> one row per component and direction, ranked by gain
  noise_floor     the seed-to-seed spread of each end's best val loss (shown beside the margin, which
                  is fixed before the data: stats.py states the rule)
  budget          the training budget the verdict holds for, and how far apart the two ends are
  more_seeds      the exact `anatomy ablate` command that adds seeds, with its estimated time
  seeds_advice    what to do about effects with fewer than SEEDS_WANTED pairs, from what the runs say:
                  add seeds (a command that trains them), train unfinished runs again, wait for a
                  study still running, or change a config whose runs diverged; never a command that
                  would train nothing
  rule_line       the rule of stats.py in one sentence, with a family's numbers (stats.rule_text)
  words           the verdict's words, one line each: margin and every call
  ends_text       the two ends' mean best val loss: the scale a gain reads against
  power_lines     what earlier runs say about power: the seeds an effect the size of the margin needs

Sign convention (everywhere: report, CLI, CSV/JSON, README): the gain is the loss reduction of
having the component, in bits per byte: loss(without) - loss(with), so positive = the component helps,
whichever end it was added to or removed from (effects.gain_of), and one ranking reads both.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from anatomy_cli.report import lr_allowance, stats
from anatomy_cli.report.frames import LOSS_METRIC, UNIT, run_flags
from anatomy_cli.spec.roles import ALL_ON, REFERENCE
from anatomy_cli.store import lockfile
from anatomy_cli.store import runs as runs_mod

SEEDS_WANTED = 3
VERDICT_COLUMNS = ["rank", "flip", "direction", "against", "group", "n_pairs", "gain", "adj_low", "adj_high",
                   "margin", "margin_basis", "call", "mde", "noise", "raw_low", "raw_high", "p_holm", "df",
                   "adj_level", "family", "plateau"]


def verdict_frame(loss_effects: pd.DataFrame) -> pd.DataFrame:
    """Loss effects (component_effects rows, already judged) -> VERDICT_COLUMNS, largest gain first."""
    df = loss_effects.sort_values("gain", ascending=False, na_position="last", kind="stable").reset_index(drop=True)
    df["rank"] = np.arange(1, len(df) + 1)
    return df[VERDICT_COLUMNS]


def end_runs(runs: pd.DataFrame, role: str) -> pd.DataFrame:
    """The completed runs of one end ('reference' | 'all-on'): the config of that role with the most
    seeds (empty when the end has none)."""
    done = runs[(runs["role"] == role) & (runs["status"] == runs_mod.COMPLETED)]
    return max((g for _, g in done.groupby(["design", "settings"])), key=len) if len(done) else done


def noise_floor(runs: pd.DataFrame, metric: str = LOSS_METRIC) -> dict[str, tuple[float, int, float]]:
    """{'reference' | 'all-on': (sd of `metric` over seeds, seeds, mean)} for each end that has runs
    (end_runs); the sd is NaN with one seed."""
    out = {}
    for role in (REFERENCE, ALL_ON):
        best = end_runs(runs, role)
        if best.empty:
            continue
        values = best.drop_duplicates("seed")[metric].to_numpy(float, na_value=np.nan)
        values = values[np.isfinite(values)]
        if len(values):
            out[role] = (float(np.std(values, ddof=1)) if len(values) > 1 else math.nan, len(values),
                         float(values.mean()))
    return out


def budget(runs: pd.DataFrame) -> dict:
    """steps, batch, ctx, tokens of the reference-end runs; each end's mean best val loss; whether
    the reference end was still improving at its last evaluation."""
    out: dict = {}
    for role in (REFERENCE, ALL_ON):
        done = runs[(runs["role"] == role) & (runs["status"] == runs_mod.COMPLETED)]
        if len(done):
            out[role] = float(done[LOSS_METRIC].mean())
            out[f"{role}_best_step"] = int(done["best_step"].min())
    ref = runs[runs["role"].isin([REFERENCE, ALL_ON])]
    if len(ref):
        settings = json.loads(ref.iloc[0]["settings"])
        steps, batch, ctx = (settings.get(k) for k in ("train.steps", "train.batch_size", "model.ctx_len"))
        out |= {"steps": steps, "batch_size": batch, "ctx_len": ctx}
        if None not in (steps, batch, ctx):
            out["tokens"] = steps * batch * ctx
        if "reference_best_step" in out and steps:
            out["still_improving"] = bool(run_flags(out["reference_best_step"], steps, steps)[0])
    return out


def ablate_command(rules, *extra: str, changed: tuple = ()) -> str:
    """The `anatomy ablate` command that made the study its Rules judge (sweep.json's invocation: its spec and
    the settings over it, each by its alias: spec/knobs.py; a tuned study's grid from tune.json) with `extra`
    options, writing to the same directory. changed: knobs.Setting values that take the place of the study's own
    setting of the same key (more seeds: one --seeds, never two)."""
    from anatomy_cli.spec import knobs

    folder, how = Path(rules.folder), rules.invocation
    spec = how.spec if how is not None else None
    if how is None:
        guess = Path("experiments") / f"{folder.name}.toml"
        spec = str(guess) if guess.is_file() else "SPEC"
    keys = {c.key for c in changed}
    words = knobs.command_args([s for s in rules.settings if not s.key.startswith("tune") and s.key not in keys]
                               + list(changed))
    parts = ["anatomy", "ablate"] + ([str(spec)] if spec else []) + words
    parts += lr_allowance.rerun_flags(rules.tune)  # a tuned study goes on with its grid (tune.json)
    return " ".join([*parts, *extra, "--runs-dir", str(folder.parent)])


def more_seeds(rules, runs: pd.DataFrame, wanted: int = SEEDS_WANTED) -> tuple[str, tuple[float, int] | None]:
    """(the command that brings every config to `wanted` seeds, (estimated seconds, workers) or None).

    Completed runs are skipped by the sweep, so the command trains only the new seeds. The estimate
    comes from the finished runs' measured times (_estimate).
    """
    from anatomy_cli.spec import knobs

    more = knobs.Setting("seeds", wanted, f"--seeds {wanted}")
    return ablate_command(rules, changed=(more,)), _estimate(runs, wanted)


def estimate_text(est: tuple[float, int] | None) -> str:
    if est is None:
        return ""
    s, workers = est
    when = f"{s:.0f} s" if s < 90 else f"{s / 60:.1f} min"
    return f" (est. {when} with {workers} worker{'s' * (workers > 1)})"


def rule_line(judged: pd.DataFrame, unit: str, seeds: str = "seeds", short: bool = False, looks=1,
              calls: bool = True) -> str:
    """The rule (stats.py) in one sentence, with a family's numbers: its level, m and looks in
    stats.rule_text's one wording, how its variances were read, the margin and its basis, and the
    effect it detects 80 % of the time (the median mde). looks: the study's planned looks, or each
    look's alpha (rules.Rules.spending; 1 for a timing pass, which is judged once). calls=False (short): without what
    a call needs, for a terminal that defines each call below it (words)."""
    if judged.empty or not (judged["family"] > 0).any():
        return f"The rule: no intervals yet (a call needs {stats.MIN_PAIRS} {seeds} or more)."
    tested = judged[judged["family"] > 0]
    m, level = int(tested["family"].max()), float(tested["adj_level"].min())
    size, where = margin_text(judged, unit)
    mde = float(np.nanmedian(tested["mde"])) if "mde" in tested and tested["mde"].notna().any() else math.nan
    mde_text = ((f"{mde:.1f}%" if unit == "%" else f"{mde:.3f} {unit}") if math.isfinite(mde) else "")
    groups = tested["group"].nunique() if "group" in tested else 1
    family = stats.rule_text(level, m, looks, groups)
    if short:
        method = "each effect's own t"
        practical = f"|gain| > {size} ({where})" if size else "nothing more"
        detect = f"; 80 % power at {mde_text}" if mde_text else ""
        if not calls:
            return (f"The rule: {family} ({method})" + (f"; an effect of {mde_text} is called 80 % of the time at "
                                                         f"these {seeds} (the median minimum detectable effect)"
                                                         if mde_text else "") + ".")
        return (f"The rule: {family} ({method}); a call needs the interval to exclude 0 and {practical}{detect}; "
                f"fewer than {stats.MIN_PAIRS} {seeds}: no call.")
    practical = f"its gain is larger than the margin, {size} ({where})" if size else "(no margin: the interval decides)"
    detect = (f" With these {seeds} and this noise an effect of {mde_text} is called 80 % of the time (median "
              f"minimum detectable effect)." if mde_text else "")
    return (f"**The rule**: {family}, over {seeds}; "
            + "each on its own variance and degrees of freedom (none borrows from the others: 3 seeds cannot show "
            "that the effects' noise is alike, and pooling it where it is not calls false effects). "
            + f"A component helps or hurts when its interval excludes 0 and {practical}; "
            f"negligible: the interval lies inside ±{size or '0'}; below margin: the interval excludes 0 but the gain "
            f"is inside the margin; undecided: the interval holds 0 and reaches past the margin; fewer than "
            f"{stats.MIN_PAIRS} {seeds}: too few for a call.{detect} Raw 95% intervals and Holm p-values: Effect "
            f"details.")


def margin_text(judged: pd.DataFrame, unit: str) -> tuple[str | None, str]:
    """(the family's margin as shown, '0.020 bits/byte' or '5.0%', None when unknown; where it came from)."""
    margin, basis = float(judged["margin"].iloc[0]), judged["margin_basis"].iloc[0]
    where = ("given by the study's margin" if basis in (stats.GIVEN, stats.GIVEN_BEFORE) else basis
             if str(basis).startswith(stats.AFTER) else "the default, fixed before the data")
    return ((f"{margin:.1f}%" if unit == "%" else f"{margin:.3f} {unit}") if math.isfinite(margin) else None), where


def words(judged: pd.DataFrame, unit: str, seeds: str = "seeds") -> list[tuple[str, str]]:
    """(word, what it means) for the terminal verdict: the margin, then every call (stats.CALLS), the
    rare ones (too few seeds, no completed pairs) only where the verdict uses them."""
    size, where = margin_text(judged, unit) if len(judged) else (None, "")
    said = set(judged["call"]) if len(judged) else set()
    out = [("margin", f"{size or 'none'}: the smallest gain that matters ({where})" if size else
            "none given: only the interval decides")]
    out += [("helps", "the interval excludes 0 and the gain is beyond +margin"),
            ("hurts", "the interval excludes 0 and the gain is beyond -margin"),
            ("negligible", "the interval lies inside ±margin: confidently smaller than what matters"),
            ("below margin", "the interval excludes 0, but the gain is inside ±margin"),
            ("undecided", "the interval holds 0 and reaches past the margin: more seeds would tell")]
    if stats.TOO_FEW in said:
        out.append((stats.TOO_FEW, f"fewer than {stats.MIN_PAIRS} {seeds}: no call"))
    if stats.NONE in said:
        out.append((stats.NONE, "no seed where both the end and the variant completed"))
    return out


def ends_text(runs: pd.DataFrame, ref_name: str, top_name: str) -> str:
    """'ends: the 2017 end reaches 3.799, the LLaMA end 2.851 (mean best val loss over 3 seeds, 0.948
    apart)': the scale a gain reads against; '' without both ends."""
    floor = noise_floor(runs)
    if REFERENCE not in floor or ALL_ON not in floor:
        return ""
    (_, n_ref, ref), (_, n_top, top) = floor[REFERENCE], floor[ALL_ON]
    n = f"{n_ref} seeds" if n_ref == n_top else f"{n_ref} and {n_top} seeds"
    return (f"ends: the {ref_name} end reaches {ref:.3f} {UNIT}, the {top_name} end {top:.3f} (mean best val "
            f"loss over {n}; {ref - top:+.3f} apart)")


def power_lines(runs: pd.DataFrame, effects: pd.DataFrame, flips=None) -> list[str]:
    """What the runs already in a sweep folder say about power, one line per group: the family's
    median minimum detectable effect now (of the call: stats.call_mde), and the seeds (with their estimated
    cost on this machine) at which an effect of twice the margin is called helps 80 % of the time
    (stats.seeds_for; a gain at the margin itself is called at most half the time, whatever the seeds).
    A tuned study's intervals are widened by the LR selection's allowance (allow_low), which no seed count
    shrinks: the mde and the seeds include it (the family's median), and an effect within it is said to be
    out of any seed count's reach.

    flips: only the effects of these flips (a plan's own: `--flip rope,swiglu` has 4 effects where the
    folder holds 10), a family of their count at the folder's alpha, each effect on its own variance."""
    from scipy import stats as sps

    loss = effects[(effects["metric"] == LOSS_METRIC) & (effects["family"] > 0) & effects["se"].notna()]
    if flips is not None:
        loss = loss[loss["flip"].isin(list(flips))]
    lines = []
    for group, fam in loss.groupby("group", sort=False):
        n_now, margin, m = int(fam["n_pairs"].median()), float(fam["margin"].iloc[0]), len(fam)
        sds = fam["sd"] if "sd" in fam else fam["se"] * np.sqrt(fam["n_pairs"])
        floor = stats.sd_floor(sds)  # as judge floors them, over this family (the plan's effects) alone
        se_judged = np.where(sds > 1e-12, np.maximum(sds, floor), sds) / np.sqrt(fam["n_pairs"])
        sd = float(np.median(sds))
        alpha = float(((1 - fam["adj_level"]) * fam["family"]).iloc[0])  # the verdict's: level = 1 - alpha / family
        allows = fam["allow_low"].dropna() if "allow_low" in fam else pd.Series(dtype=float)
        allow = float(allows.median()) if len(allows) else 0.0
        target = 2 * margin  # a gain at the margin itself passes it at most half the time: no call reaches 80 % there
        need = stats.seeds_for(sd, m, target, alpha, margin=margin, allow=allow)
        mde = np.median([stats.estimated_mde(se, df, float(sps.t.ppf(1 - alpha / (2 * m), df)), margin,
                                             _finite(a))  # as judge's
                         for se, df, a in zip(se_judged, fam["df"], fam.get("allow_low", [0.0] * m))])
        where = f"{group}: " if group else ""
        whose = ("the plan's " if flips is not None else "the ") + (f"{m} effects'" if m > 1 else "1 effect's")
        widened = f" (its interval widened by the LR selection's allowance, median {allow:.3f})" if allow else ""
        now = (f"{where}at {n_now} seeds {whose} median paired sd is {sd:.3f} {UNIT}; an effect "
               f"of {float(mde):.3f} is called 80 % of the time{widened}")
        twice = f"one of {target:.3f} (twice the margin)"
        if need is None and allow >= target:
            lines.append(f"{now}; no seed count calls {twice}: the LR selection's allowance ({allow:.3f}), which "
                         f"more study seeds do not shrink, is larger")
        elif need is None:
            lines.append(f"{now}; {twice} needs more seeds than anatomy runs")
        elif need <= n_now:
            lines.append(f"{now}, {twice} included")
        else:
            cost = estimate_text(_estimate(runs, need))
            lines.append(f"{now}; {twice} needs {need} seeds{cost}: --seeds {need}")
    return lines


def _finite(x) -> float:
    return float(x) if x is not None and math.isfinite(x) else 0.0


def _estimate(runs: pd.DataFrame, wanted: int) -> tuple[float, int] | None:
    """The wall time of what `--seeds wanted` trains: each config's missing seeds and its unfinished runs
    (failed, interrupted), each as its finished runs measured here (their wall_s), plus the per-run and
    start-up times of this machine's calibration when one is cached; None without them."""
    from anatomy_cli.sweep.calibrate import cached_overheads, plan_seconds
    from anatomy_cli.sweep.plan import core_workers

    new = []
    run_s, startup_s = cached_overheads()
    for _, config_runs in runs[runs["role"] != ""].groupby(["design", "settings", "role"]):
        todo = _to_train(config_runs, wanted)
        wall = config_runs.loc[config_runs["status"] == runs_mod.COMPLETED, "wall_s"].median()
        if todo > 0 and not math.isfinite(wall):
            return None
        new += [wall + run_s] * todo
    workers = core_workers(len(new)) if new else 1
    return plan_seconds(new, workers, startup_s), workers


def _to_train(config_runs: pd.DataFrame, wanted: int) -> int:
    """The runs of one config that `--seeds wanted` would train: its missing seeds, and its runs that
    did not finish (the sweep skips completed and diverged runs, and one a live process trains)."""
    unfinished = ~config_runs["status"].isin([*runs_mod.DONE_STATES, runs_mod.RUNNING])
    return max(0, wanted - config_runs["seed"].nunique()) + int(unfinished.sum())


# ----------------------------------------------------------------------------- fewer seeds than wanted


@dataclass(frozen=True)
class Advice:
    """What the report says about effects with fewer than SEEDS_WANTED pairs: the cause and the
    remedy in words, and the command that carries it out (None where no command would help)."""

    text: str
    command: str | None = None


def seeds_advice(rules, runs: pd.DataFrame, judged: pd.DataFrame, wanted: int = SEEDS_WANTED) -> Advice | None:
    """None when every effect of `judged` has `wanted` pairs; else the cause the runs show, in order:
    the study is still running (live runs or a live sweep lock: report again later; a command would
    meet the lock), seeds are missing (the `--seeds` command that adds them), runs did not finish
    (the same command trains them again), runs diverged (a config to change: every seed is there, so
    more seeds would train nothing), or the end and the variant share too few seeds."""
    if judged.empty or not (judged["n_pairs"] < wanted).any():
        return None
    running = still_running(rules.folder, runs)
    if running:
        return Advice(f"The study is still running ({running}): some effects have fewer than {wanted} seeds for "
                      f"now. Report again when it finishes (a command that adds seeds would meet the sweep's lock).")
    studied = runs[runs["role"] != ""]
    configs = [g for _, g in studied.groupby(["design", "settings", "role"])]
    missing = sum(max(0, wanted - g["seed"].nunique()) for g in configs)
    unfinished = studied[~studied["status"].isin([*runs_mod.DONE_STATES, runs_mod.RUNNING])]
    diverged = studied[studied["status"] == runs_mod.DIVERGED]
    cmd, est = more_seeds(rules, runs, wanted)
    also = f" Besides, {diverged_text(diverged)}." if len(diverged) else ""
    if missing:
        say = ("One seed: each effect is a point estimate, no interval." if (judged["n_pairs"] <= 1).all()
               else f"Fewer than {wanted} seeds for some configs.")
        return Advice(f"{say}{also} To add seeds to {wanted} (finished runs are skipped){estimate_text(est)}:", cmd)
    if len(unfinished):
        counts = ", ".join(f"{n} {status}" for status, n in unfinished["status"].value_counts().items())
        return Advice(f"{len(unfinished)} run{'s' * (len(unfinished) > 1)} did not finish ({counts}): every config "
                      f"has its {wanted} seeds, but some effects pair fewer.{also} To train them again (finished "
                      f"runs are skipped){estimate_text(est)}:", cmd)
    if len(diverged):
        return Advice(f"Some effects have fewer than {wanted} pairs because {diverged_text(diverged)}. Every config "
                      f"already has its {wanted} seeds, so adding seeds would train nothing (a diverged run is a "
                      f"result the sweep keeps): {divergence_fix(diverged)}, then run the study again (a changed "
                      f"config trains anew).")
    return Advice(f"Some effects have fewer than {wanted} pairs although every config has {wanted} seeds: their end "
                  f"and variant runs share fewer seeds (a pair needs the same seed at both).")


def still_running(root: Path, runs: pd.DataFrame) -> str:
    """'' when nothing trains the study now; else what does: '2 runs running', 'the sweep directory X
    is in use by pid N' (a live lock of the report's folder or of a sweep folder its runs are in; this
    process's own lock does not count)."""
    said = []
    n = int((runs["status"] == runs_mod.RUNNING).sum())  # 'running' only while its owner lives (status_of)
    if n:
        said.append(f"{n} run{'s' * (n > 1)} running")
    me = os.getpid()
    for folder in dict.fromkeys([Path(root), *(Path(p).parent for p in runs["path"])]):
        try:
            owner = lockfile.read_owner(folder / lockfile.LOCK)
        except OSError:  # another user's lock: not ours to read, so not ours to call idle
            said.append(f"the sweep directory {folder} is locked")
            continue
        if owner is not None and owner.get("pid") != me and lockfile.alive(owner):
            said.append(f"the sweep directory {folder} is in use by {lockfile.describe(owner)}")
    return "; ".join(said)


def diverged_text(diverged: pd.DataFrame, limit: int = 4) -> str:
    """'9 runs diverged at size M (at step 7 of 20; lr 0.001, warmup 2)', one clause per size (per
    config without sizes), the first `limit` of them."""
    def where(members: pd.DataFrame) -> str:
        settings = [json.loads(s) for s in members["settings"]]
        at = sorted({int(v) for v in pd.to_numeric(members["diverged_at"], errors="coerce").dropna()})
        steps = sorted({s.get("train.steps") for s in settings if s.get("train.steps") is not None})
        lrs = sorted({s.get("train.lr") for s in settings if s.get("train.lr") is not None})
        warmups = sorted({s.get("train.warmup") for s in settings if s.get("train.warmup") is not None})
        parts = [(f"at step{'s' * (len(at) > 1)} {'-'.join(map(str, dict.fromkeys([at[0], at[-1]])))}" if at else "")
                 + (f" of {'/'.join(map(str, steps))}" if at and steps else ""),
                 ", ".join(filter(None, [f"lr {'/'.join(f'{v:g}' for v in lrs)}" if lrs else "",
                                         f"warmup {'/'.join(map(str, warmups))}" if warmups else ""]))]
        return "; ".join(filter(None, parts))

    sized = "size" in diverged and (diverged["size"] != "").any()
    key = "size" if sized else "label"
    clauses = []
    for name, members in diverged.groupby(key, sort=False):
        n = len(members)
        place = f"at size {name}" if sized else f"({name})"
        detail = where(members)
        clauses.append(f"{n} run{'s' * (n > 1)} diverged {place}" + (f" ({detail})" if detail else ""))
    more = len(clauses) - limit
    return "; ".join(clauses[:limit]) + (f"; and {more} more" if more > 0 else "")


def divergence_fix(diverged: pd.DataFrame, where: str = "those configs") -> str:
    """What the diverged runs call for: a lower lr when they diverged within warmup (the peak lr is not
    even reached), else a lower lr or a longer warmup."""
    at = pd.to_numeric(diverged["diverged_at"], errors="coerce")
    warmup = pd.Series([json.loads(s).get("train.warmup", math.nan) for s in diverged["settings"]],
                       index=diverged.index, dtype=float)
    early = at.notna().any() and bool((at[at.notna()] <= warmup[at.notna()]).all())
    return (f"lower train.lr for {where} (its runs diverged within warmup)" if early
            else f"lower train.lr or lengthen train.warmup for {where}")

"""A tuned study's comparison: each component at its configs' own LRs beside the shared LR (no torch).

The verdict of a tuned study (`anatomy ablate --tune-lr`) is made from the study's runs at each
config's frozen LR (report/lr_allowance.py narrows the frames to them). Here the same effects are judged
again from the runs at the shared LR (train.lr, the grid's center) on the same seeds, as a family of
their own at the study's alpha and margin, and each component gets both: the tuned gain (the call),
the shared-LR gain beside it, and the flag LR-confounded where the two calls differ (the shared LR
made or hid the call). A config not tuned (its best at the grid's edge) has no tuned runs: its
effects get no tuned call ("not tuned") and keep the shared-LR one. A study planned without the
shared-LR runs ([tune] shared = false) has no comparison: every effect is listed with its tuned call,
the shared columns empty and nothing flagged. Which configs each effect compares is read from the
study's runs and the selection runs (every config trains the grid), so the figure and the table name
them either way.

  Tuned          what the report shows of a tuned study: the record, the comparison, each config's arm
  tuned_frames   the Tuned of a report's runs (None for a study that was not tuned)
  pairings       each effect's two configs, from the study's and the selection runs
  comparison     tuned and shared-LR effects side by side, with the flag
  blocks         the report's section (page.py blocks); HELD: what the grid holds, AdamW's decay
  lines          the terminal's lines
  record         report.json's "tuning"
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from anatomy_cli.report import lr_allowance, stats
from anatomy_cli.report.effects import _pairings, component_effects, groups
from anatomy_cli.report.frames import LOSS_METRIC, records
from anatomy_cli.spec.roles import VERB, variant
from anatomy_cli.store.records import TuneRecord

NOT_TUNED = "not tuned"  # the tuned call of an effect whose end or variant was not tuned
CONFOUNDED = "LR-confounded"
OFF = "the shared-LR comparison was not trained ([tune] shared = false)"  # nor anything flagged LR-confounded
COMPARISON_COLUMNS = ["flip", "direction", "against", "group", "n_pairs", "gain", "adj_low", "adj_high", "call",
                      "shared_n_pairs", "shared_gain", "shared_low", "shared_high", "shared_call", "confounded",
                      "end_arm", "variant_arm", "end_lr", "variant_lr"]
HELD = ("Only the peak LR moves: warmup, the schedule, weight decay, betas and gradient clipping are held at the "
        "spec's values. PyTorch's AdamW multiplies weight decay by the LR (decoupled decay: each step shrinks the "
        "weights by lr x weight_decay), so a higher LR also decays harder: the grid moves both together, and a "
        "config's best LR is the best of that pair.")


@dataclass(frozen=True)
class Tuned:
    folder: Path
    record: TuneRecord
    comparison: pd.DataFrame  # COMPARISON_COLUMNS, the verdict's order
    panels: list[dict]  # the sensitivity figure's: {"flip", "direction", "title", "end", "variant"} (arm names)


def tuned_frames(everything: pd.DataFrame, runs: pd.DataFrame, effects: pd.DataFrame, rules) -> Tuned | None:
    """The tuned study of a report (None unless the study its Rules judge was tuned): `everything` the runs frame
    as loaded (the selection and shared-LR runs included), `runs` the judged frame (lr_allowance.study_runs'),
    `effects` its judged effects."""
    record, folder = rules.tune, rules.folder
    if record is None:
        return None
    shared = lr_allowance.shared_runs(everything, folder, record) if record.shared else everything.iloc[0:0]
    selection = lr_allowance.selection_runs(everything, folder, record)
    pairs = pairings(pd.concat([runs, selection.assign(settings=selection["settings"].map(lr_allowance.without_lr),
                                                       tuned=True)]))
    return Tuned(folder, record, comparison(shared, effects[effects["metric"] == LOSS_METRIC], record, pairs,
                                            rules.alpha), panels(pairs))


def pairings(runs: pd.DataFrame) -> dict[tuple[str, str, str], tuple[str, str | None, str | None]]:
    """{(flip, direction, group): (against, end arm, variant arm)} of every effect the runs can measure (the
    study's runs and the selection runs: a config not tuned has only the latter), groups named as the
    verdict's."""
    out = {}
    for group, members in groups(runs[runs["role"] != ""]):
        for flip, direction, against, ref, var in _pairings(members):
            out.setdefault((flip, direction, group), (against, lr_allowance.arm_of(ref), lr_allowance.arm_of(var)))
    return out


def comparison(shared: pd.DataFrame, loss: pd.DataFrame, record: TuneRecord, pairs: dict,
               alpha: float = stats.ALPHA) -> pd.DataFrame:
    """Each loss effect of the tuned study (`loss`) and of the shared-LR runs, judged as its own family at the
    study's alpha and margin, side by side (COMPARISON_COLUMNS); `confounded` where both have a call and they
    differ; an effect only the shared LR has, or an effect of `pairs` (pairings': its configs) with a config
    not tuned, gets the tuned call NOT_TUNED (with no shared-LR runs, its shared call is stats.NONE)."""
    margin = float(loss["margin"].iloc[0]) if len(loss) else None
    base = component_effects(shared, margin=margin, alpha=alpha) if len(shared) else loss.iloc[0:0]
    base = base[base["metric"] == LOSS_METRIC] if len(base) else base
    keys = ["flip", "direction", "group"]
    tuned = loss.set_index(keys)
    other = base.rename(columns={"n_pairs": "shared_n_pairs", "gain": "shared_gain", "adj_low": "shared_low",
                                 "adj_high": "shared_high", "call": "shared_call"}).set_index(keys)
    chosen, not_tuned = record.chosen, {a.arm for a in record.arms if not a.tuned}
    untuned = [k for k, (_, end, var) in pairs.items() if {end, var} & not_tuned]
    index = list(dict.fromkeys([*tuned.index, *other.index, *untuned]))
    rows = []
    for key in index:
        flip, direction, group = key
        t = tuned.loc[key] if key in tuned.index else None
        s = other.loc[key] if key in other.index else None
        against, end, var = pairs.get(key, (None, None, None))
        row = {"flip": flip, "direction": direction, "group": group,
               "against": next((x["against"] for x in (t, s) if x is not None), against),
               "n_pairs": t["n_pairs"] if t is not None else 0,
               "gain": t["gain"] if t is not None else math.nan,
               "adj_low": t["adj_low"] if t is not None else math.nan,
               "adj_high": t["adj_high"] if t is not None else math.nan,
               "call": t["call"] if t is not None else NOT_TUNED,
               **{c: (s[c] if s is not None else (0 if c == "shared_n_pairs" else math.nan))
                  for c in ("shared_n_pairs", "shared_gain", "shared_low", "shared_high")},
               "shared_call": s["shared_call"] if s is not None else stats.NONE,
               "end_arm": end, "variant_arm": var, "end_lr": chosen.get(end), "variant_lr": chosen.get(var)}
        row["confounded"] = bool(t is not None and s is not None and row["call"] != row["shared_call"])
        rows.append(row)
    return pd.DataFrame(rows, columns=COMPARISON_COLUMNS)


def panels(pairs: dict) -> list[dict]:
    """One sensitivity panel per component and direction (and group) of `pairs` (pairings'): its end's arm and
    its variant's."""
    return [{"flip": flip, "direction": direction, "end": end, "variant": var,
             "title": f"{variant(flip, direction)} vs {end}" + (f" [{group}]" if group else "")}
            for (flip, direction, group), (_, end, var) in pairs.items()]


def _interval(lo: float, hi: float) -> str:
    return f"[{lo:+.3f}, {hi:+.3f}]" if math.isfinite(lo) and math.isfinite(hi) else "-"


def _gain(g: float) -> str:
    return f"{g:+.3f}" if math.isfinite(g) else ""


def table(t: Tuned) -> pd.DataFrame:
    """The comparison as display strings."""
    rows = []
    for r in t.comparison.itertuples():
        rows.append({"component": r.flip, "change": VERB[r.direction] + (f" [{r.group}]" if r.group else ""),
                     "tuned gain": _gain(r.gain), "interval": _interval(r.adj_low, r.adj_high), "call": r.call,
                     "shared-LR gain": _gain(r.shared_gain), "shared interval": _interval(r.shared_low, r.shared_high),
                     "shared call": r.shared_call, "flag": CONFOUNDED if r.confounded else "",
                     "LRs (end, variant)": f"{lr_allowance.lr_text(r.end_lr)}, {lr_allowance.lr_text(r.variant_lr)}"})
    out = pd.DataFrame(rows, columns=["component", "change", "tuned gain", "interval", "call", "shared-LR gain",
                                      "shared interval", "shared call", "flag", "LRs (end, variant)"])
    return out if t.record.shared else out.drop(columns=["shared-LR gain", "shared interval", "shared call", "flag"])


def arms_table(t: Tuned) -> pd.DataFrame:
    """Each config's selection: its LR, its best selection loss, its sensitivity, why."""
    rows = [{"config": a.arm, "LR": lr_allowance.lr_text(a.lr), "selection loss": f"{a.best_loss:.4f}",
             "sensitivity": f"{a.sensitivity:.4f}", "LRs tried": str(len(a.lrs)), "why": a.reason}
            for a in t.record.arms]
    return pd.DataFrame(rows, columns=["config", "LR", "selection loss", "sensitivity", "LRs tried", "why"])


def intro(t: Tuned) -> str:
    g, seeds = t.record.grid, ", ".join(map(str, t.record.seeds))
    return (f"Fair learning rates: each config's LR was chosen on selection seed{'s' * (len(t.record.seeds) > 1)} "
            f"{seeds} (never a study seed) from {g.points} LRs a factor {g.factor:g} apart around train.lr = "
            f"{g.center:g} (up to {g.extend} more past an edge), then frozen (tune.json); the verdict above is each "
            f"config at its own LR on the study's seeds, each interval widened by its two configs' regret bounds (how "
            f"much worse a frozen LR may be than its config's best, from the selection curve and the effect's own "
            f"noise: the LR selection's own error), so a call is meant of each config at its best LR. Rule: "
            f"{t.record.rule}. " + (f"Beside it, the same effects at the "
            f"shared LR {g.center:g} on the same seeds, judged as a family of their own at the study's alpha and "
            f"margin; **{CONFOUNDED}** where the two calls differ." if t.record.shared else
            f"{OFF[0].upper()}{OFF[1:]}: no study seed trained at the shared LR {g.center:g}, so no call is "
            f"checked against it and none is flagged {CONFOUNDED}."))


def notes(t: Tuned) -> list[str]:
    """The flagged effects, the configs not tuned, the sensitivity's meaning, and what the grid holds."""
    out = []
    for r in t.comparison[t.comparison["confounded"]].itertuples():
        out.append(f"**{CONFOUNDED}**: {r.flip} {VERB[r.direction]} is {r.call} at each config's own LR and "
                   f"{r.shared_call} at the shared LR")
    for a in t.record.arms:
        if not a.tuned:
            out.append(f"**{a.arm}** {a.reason}: its effects get no tuned call, " + (
                "only the shared-LR one" if t.record.shared else "and no shared-LR one ([tune] shared = false)"))
    out.append("Sensitivity (Wortsman et al. 2023): the mean over the grid's points of min(loss, initial loss "
               f"{t.record.initial_loss:.3f}) minus the best, in nats/token: how much a config loses, on average, at "
               "an LR off its best (larger = a sharper LR curve).")
    return out + [HELD]


def blocks(t: Tuned, image: Path | None) -> list:
    """The report's 'Fair learning rates' section."""
    out = [("p", intro(t)), ("table", table(t), False), ("list", notes(t))]
    if image is not None:
        out.append(("img", image))
    return out + [("p", "Each config's selection (selection loss: the mean over the selection seeds of the best val "
                        "loss at its LR; a diverged run counts at the initial loss):"), ("table", arms_table(t), False)]


def lines(t: Tuned) -> list[str]:
    """The terminal's: the LRs chosen and each flagged effect (or that none could be: shared off)."""
    chosen = ", ".join(f"{a.arm} {lr_allowance.lr_text(a.lr)}" for a in t.record.arms)
    out = [f"--tune-lr: LRs chosen on selection seeds {', '.join(map(str, t.record.seeds))}: {chosen}"]
    flagged = t.comparison[t.comparison["confounded"]]
    out += [f"{CONFOUNDED}: {r.flip} {VERB[r.direction]}: {r.call} at its own LRs, {r.shared_call} at the shared LR "
            f"(gain {_gain(r.gain)} vs {_gain(r.shared_gain)})" for r in flagged.itertuples()]
    if not t.record.shared:
        out.append(f"{OFF}: no call is checked for LR confounding")
    elif flagged.empty:
        out.append("no call differs at the shared LR (no effect is LR-confounded)")
    return out


def record(t: Tuned) -> dict:
    """report.json's "tuning": tune.json's record, and the comparison's rows."""
    return {**t.record.model_dump(mode="json", by_alias=True), "held": HELD, "comparison": records(t.comparison)}

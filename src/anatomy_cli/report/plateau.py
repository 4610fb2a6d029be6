"""Runs left on the unigram plateau: the rule, the loss it measures against, and the words (no torch).

  plateau_reason  the rule: a val curve that ended on the unigram loss, or left it only at the end
  unigram_of      a run's unigram loss: its summary's, else its corpus's when that can be read and is the
                  one it trained on, else unknown (None)
  counts_of       a run's (val tokens, val bytes), the bits-per-byte factor of its losses: its summary's, else
                  its fixed val windows' on its corpus (read as unigram_of reads it), else unknown (None)
  judged          a run's PLATEAU_COLUMNS: unigram_loss, plateau (the reason; None: not flagged), plateau_effects
  plateau_ids     the flagged runs an effect's counted pairs hold (effects.py's `plateau` column: its call
                  is marked MARK wherever it is shown)
  plateau_note    an effect's note naming the flagged runs it pairs (effects.py adds it)
  entered         the runs frame with plateau_effects: the loss effects each flagged run enters
  findings        per config, how many of its runs the rule flags (N of M)
  plateau_lines   one line per config with flagged runs, for the verdict (terminal, report.md/html)
  detail_lines    one line per flagged run (why, the effects it enters), for the effect details
  plateau_record  report.json's "plateau": the configs, the flagged runs, and the runs whose unigram loss is unknown
  left_at / escape_record   the step each run left the plateau at: the results file's "plateau"

Why. A character model first learns how often each character occurs (a BPE model, each token: every loss
here is in nats per token of the run's own tokenizer): its val loss drops to the
unigram loss (data.corpus.unigram_loss: the val split's cross-entropy under the train split's token
frequencies) and may sit there a long while before it learns anything of context (the post-norm 2017
end at a short warmup leaves it at a random step, or never). A run still there at its end, or that left
it only in its last evaluations, has a best val loss that measures when it escaped, not its config: the
gain at its seed is off by about the distance it did not fall, and the interval it enters is wide for it.
The report names such runs, and the effects they enter, rather than leave an 8-nat interval unexplained.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from pathlib import Path

import pandas as pd

from anatomy_cli.spec.config import ModelConfig, TrainConfig
from anatomy_cli.spec.roles import ADD_ONE, VERB
from anatomy_cli.store.runs import COMPLETED, read_config, read_summary

PLATEAU_TOL = 0.1  # nats/token: a val loss this far below the unigram loss has left the plateau
LATE_SHARE = 0.2  # left only in this last share of evaluations (at least the last one): too late to count
MIN_EVALS = 3  # fewer evaluations say nothing about when a run left: only "never left" is judged
NOTE_HEAD = "pairs a run still on the unigram plateau"
PLATEAU_COLUMNS = ("unigram_loss", "plateau", "plateau_effects")  # the runs frame's (frames.RUN_COLUMNS)
MARK = "†"  # beside every call that rests on a flagged run: terminal, report.md/html (report.json: `plateau`)


def plateau_reason(curve: Iterable[tuple[int, float]], unigram: float | None, tol: float = PLATEAU_TOL,
                   late: float = LATE_SHARE) -> str | None:
    """Why a run counts as still on the unigram plateau, or None (it left in time, or unigram is unknown).

    `curve`: (step, val loss) at each of the run's evaluations; NaN and inf are left out. A run has left
    the plateau at its first evaluation whose val loss is more than `tol` below `unigram`. It is flagged
      - when it never did: its best val loss is within `tol` of the unigram loss ("ended on the unigram
        plateau"), or more than `tol` above it ("never reached the unigram loss": not on the plateau); or
      - when it did only in its last `late` share of its n evaluations (the last ceil(late * n), at least
        one; judged from MIN_EVALS evaluations): it escaped so late that its best val loss still falls
        with every step, so it measures the step it escaped at (random, from seed to seed), not its config.
    """
    points = sorted((int(s), float(v)) for s, v in curve if v is not None and math.isfinite(float(v)))
    if unigram is None or not math.isfinite(unigram) or not points:
        return None
    best = min(v for _, v in points)
    below = next((i for i, (_, v) in enumerate(points) if v < unigram - tol), None)
    if below is None and best > unigram + tol:  # not on the plateau: above it (a collapse to ln V, a run cut short)
        return (f"never reached the unigram loss: best val loss {best:.3f}, {best - unigram:.3f} above the unigram "
                f"loss {unigram:.3f} nats/token (it did not learn even how often each token occurs)")
    if below is None:
        return (f"ended on the unigram plateau: best val loss {best:.3f}, the unigram loss {unigram:.3f} nats/token "
                f"(never {tol:g} below it)")
    n = len(points)
    last = max(1, math.ceil(late * n))
    if n < MIN_EVALS or below < n - last:
        return None
    when = "its last evaluation" if below == n - 1 else f"in its last {n - below} of {n} evaluations"
    return (f"left the unigram plateau only at step {points[below][0]} ({when}): best val loss {best:.3f}, the "
            f"unigram loss {unigram:.3f} nats/token")


def left_at(curve: Iterable[tuple[int, float]], unigram: float | None, tol: float = PLATEAU_TOL) -> int | None:
    """The step of a run's first evaluation more than `tol` below `unigram` (when it left the plateau); None when
    it never did, or its unigram loss is unknown (the results file's "plateau" record: escape_record)."""
    points = sorted((int(s), float(v)) for s, v in curve if v is not None and math.isfinite(float(v)))
    if unigram is None or not math.isfinite(unigram):
        return None
    return next((s for s, v in points if v < unigram - tol), None)


def escape_record(runs: pd.DataFrame, curves: pd.DataFrame) -> dict | None:
    """The results file's "plateau": the rule's tolerance and, for each completed run with a known unigram loss,
    its config (config_name), seed, steps and the step it left the plateau at (left_at; null: never), so a
    results file says whether a study's answers rest on when its runs escaped; None when no run is known."""
    if "unigram_loss" not in runs.columns:
        return None
    done = runs[(runs["status"] == COMPLETED) & runs["unigram_loss"].notna()].sort_values("run_id")
    val = curves[curves["split"] == "val"] if len(curves) else curves
    rows = []
    for r in done.itertuples():
        mine = val[val["run_id"] == r.run_id]
        steps = read_config(Path(r.path)) or {}
        steps = (steps.get("train") or {}).get("steps") if isinstance(steps.get("train"), dict) else None
        rows.append({"config": config_name(r.run_id), "run_id": r.run_id, "seed": int(r.seed),
                     "steps": steps if isinstance(steps, int) else int(mine["step"].max()),
                     "left_at": left_at(zip(mine["step"], mine["loss"]), float(r.unigram_loss))})
    return {"tolerance": PLATEAU_TOL, "runs": rows} if rows else None


# ----------------------------------------------------------------------------- the unigram loss


def unigram_of(run_dir: Path, cache: dict | None = None) -> float | None:
    """A run's unigram loss (nats/token): the one its summary records (runs since it was recorded), else the
    one of its corpus, read again now, when that is a local source whose fingerprint is the one the summary
    records (hf: names, changed, unreadable or unfingerprinted corpora: None, unknown). `cache` keeps
    each corpus read once across runs."""
    summary = read_summary(Path(run_dir)) or {}
    value = summary.get("unigram_loss")
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    read = _corpus_of(Path(run_dir), summary, cache)
    return read[1] if read is not None else None


def counts_of(run_dir: Path, cache: dict | None = None) -> tuple[int, int] | None:
    """A run's (val_tokens, val_bytes): the targets of its fixed val windows and the UTF-8 bytes they stand for,
    what turns its losses into bits per byte (data.batches.bits_per_byte). Its summary's (runs since they are
    recorded), else counted on its corpus as training counts them (data.batches.run_eval_counts; the corpus
    read as unigram_of reads it, its fingerprint checked), else None (unknown)."""
    summary = read_summary(Path(run_dir)) or {}
    tokens, size = summary.get("val_tokens"), summary.get("val_bytes")
    if all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in (tokens, size)):
        return tokens, size
    read = _corpus_of(Path(run_dir), summary, cache)
    if read is None or read[2] is None:
        return None
    config = read_config(Path(run_dir)) or {}
    model, train = (config.get(k) if isinstance(config.get(k), dict) else {} for k in ("model", "train"))
    settings = (model.get("ctx_len", ModelConfig.model_fields["ctx_len"].default),
                train.get("batch_size", TrainConfig.model_fields["batch_size"].default),
                train.get("eval_batches", TrainConfig.model_fields["eval_batches"].default))
    if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in settings):
        return None
    counts = read[3]
    if settings not in counts:
        from anatomy_cli.data.batches import eval_counts

        counts[settings] = eval_counts(read[2], *settings)
    return counts[settings]


def _corpus_of(run_dir: Path, summary: dict, cache: dict | None) -> tuple | None:
    """(meta, unigram loss, corpus, {eval settings: counts}) of the corpus a run trained on, read once per
    corpus into `cache`; None when it cannot be read again or is not the one the run's summary records."""
    sha = summary.get("corpus_sha256")
    config = read_config(Path(run_dir)) or {}
    data = config.get("data") if isinstance(config.get("data"), dict) else {}
    source, val_frac, tokenizer = data.get("source"), data.get("val_frac", 0.1), data.get("tokenizer", "char")
    if not isinstance(sha, str) or (source is not None and (not isinstance(source, str) or source.startswith("hf:"))):
        return None
    if source is not None and not Path(source).is_absolute() and isinstance(summary.get("started_in"), str):
        source = str(Path(summary["started_in"]) / source)
    cache = {} if cache is None else cache
    key = (source, val_frac) if tokenizer == "char" else (source, val_frac, tokenizer)
    if key not in cache:
        cache[key] = _read_corpus(source, val_frac, tokenizer)
    read = cache[key]
    files = summary.get("corpus_files")
    if read is None or read[0].get("sha256") != sha or (files and read[0].get("fingerprint") != files):
        return None
    return read


def _read_corpus(source: str | None, val_frac, tokenizer: str = "char") -> tuple | None:
    from anatomy_cli.data.corpus import unigram_loss
    from anatomy_cli.data.load import load_corpus

    try:
        corpus = load_corpus(source, float(val_frac), tokenizer=str(tokenizer))
    except Exception:  # a corpus gone, changed, unreadable or badly formed: its unigram loss is unknown
        return None
    return corpus.meta, unigram_loss(corpus), corpus, {}


# ----------------------------------------------------------------------------- frames


def judged(run_dir: Path, metrics: list[dict], status: str | None, best: float | None = None,
           cache: dict | None = None) -> dict:
    """A run's PLATEAU_COLUMNS for the runs frame (frames.load_runs): `unigram_loss` (NaN: unknown, or not a
    completed run) and `plateau` (plateau_reason's words for a completed run the rule flags, else None),
    from its val curve (metrics.jsonl; its best val loss alone where it has none); `plateau_effects` is
    filled once the effects are known (entered)."""
    u = unigram_of(Path(run_dir), cache) if status == COMPLETED else None
    curve = [(m["step"], m["val_loss"]) for m in metrics if m.get("val_loss") is not None and m.get("step") is not None]
    if not curve and best is not None:
        curve = [(0, best)]
    return {"unigram_loss": math.nan if u is None else u, "plateau": plateau_reason(curve, u), "plateau_effects": None}


def plateau_ids(ref: pd.DataFrame, var: pd.DataFrame) -> list[str]:
    """The flagged runs among an effect's counted pairs (`ref`, `var`: the end's and the variant's runs of
    those pairs), sorted; [] when none is (or nothing is marked)."""
    if "plateau" not in ref.columns or "plateau" not in var.columns:
        return []
    return sorted({r.run_id for frame in (ref, var) for r in frame.itertuples() if isinstance(r.plateau, str)})


def plateau_note(ref: pd.DataFrame, var: pd.DataFrame) -> str:
    """The note of an effect whose counted pairs (`ref`, `var`: the end's and the variant's runs of those
    pairs) hold a flagged run: which, and what that does to it; '' when none is (or nothing is marked)."""
    ids = ", ".join(plateau_ids(ref, var))
    if not ids:
        return ""
    return (f"{NOTE_HEAD}: {ids}. Its gain at that seed measures how long the run sat on the plateau (a random "
            f"number of steps), not the component, and widens the interval")


def marked(call: str, plateau: object) -> str:
    """A call as shown: with MARK when the effect rests on a flagged run (its `plateau` ids are not empty)."""
    return f"{call} {MARK}" if isinstance(plateau, str) and plateau else call


NOTE_IDS = re.compile(re.escape(NOTE_HEAD) + r": (?P<ids>.+?)\. Its gain")


def entered(runs: pd.DataFrame, effects: pd.DataFrame) -> pd.DataFrame:
    """The runs frame with `plateau_effects`: for each flagged run, the loss effects whose note names it
    ('gqa added, rope removed'), '' where none does; None for a run not flagged."""
    named: dict[str, list[str]] = {}
    for e in effects.itertuples():
        m = NOTE_IDS.search(e.note) if isinstance(e.note, str) else None
        for rid in (m["ids"].split(", ") if m else []):
            to = "to" if e.direction == ADD_ONE else "from"
            named.setdefault(rid, []).append(f"{e.flip} {VERB.get(e.direction, e.direction)} {to} the {e.against}"
                                             + (f" [{e.group}]" if e.group else ""))
    if "plateau" not in runs.columns:
        return runs
    out = [", ".join(dict.fromkeys(named.get(r.run_id, []))) if isinstance(r.plateau, str) else None
           for r in runs.itertuples()]
    return runs.assign(plateau_effects=pd.Series(out, index=runs.index, dtype=object))


# ----------------------------------------------------------------------------- words


def flagged(runs: pd.DataFrame) -> pd.DataFrame:
    """The runs the rule flags (mark's `plateau` set), by run id."""
    if "plateau" not in runs.columns:
        return runs.iloc[:0]
    return runs[runs["plateau"].map(lambda v: isinstance(v, str))].sort_values("run_id")


SLUG = re.compile(r"^(?P<slug>.+)-s\d+(?:-[0-9a-f]{8})?$")  # a run id: its config's slug, -s<seed>, -<hash>


def config_name(run_id: str) -> str:
    """'2017+gqa' of '2017+gqa-s1337-5e4f20ff' (sweep.plan's ids); the id itself where it is not one."""
    m = SLUG.match(run_id)
    return m["slug"] if m else run_id


def findings(runs: pd.DataFrame) -> list[tuple[str, int, int]]:
    """(config, its flagged runs, its completed runs) for each config the rule flags a run of: a config is its
    runs' slug (config_name), counted among the runs of the same label and settings."""
    out = []
    bad = flagged(runs)
    for name, mine in bad.groupby(bad["run_id"].map(config_name), sort=True):
        of = runs[runs["label"].isin(set(mine["label"])) & (runs["status"] == COMPLETED)]
        if "settings" in runs.columns:
            of = of[of["settings"].isin(set(mine["settings"]))]
        out.append((str(name), len(mine), max(len(of), len(mine))))
    return out


def plateau_lines(runs: pd.DataFrame, bold: bool = True) -> list[str]:
    """'**Unigram plateau**: 1 of 4 runs of config 2017+gqa left the unigram plateau late: the effects through
    2017+gqa measure escape time as well (their calls: †).', one line per config with a flagged run (none when
    no run is flagged). Which runs, and why, are the effect details' (detail_lines)."""
    head = "**Unigram plateau**: " if bold else "unigram plateau: "
    out = []
    for label, n, m in findings(runs):
        name = f"**{label}**" if bold else label
        out.append(f"{head}{n} of {m} runs of config {name} left the unigram plateau late: the effects through "
                   f"{label} measure escape time as well (their calls are marked {MARK}).")
    return out


def detail_lines(runs: pd.DataFrame) -> list[str]:
    """'**2017+gqa-s1337** left the unigram plateau only at step 300 (...); it enters gqa added to the 2017
    end, whose interval it widens: ...', one line per flagged run, for the effect details."""
    out = []
    for r in flagged(runs).itertuples():
        effects = getattr(r, "plateau_effects", None)
        what = (f"it enters {effects}, whose interval it widens: the gain at its seed measures how long the run "
                f"sat on the plateau, not the component" if effects else "it enters no effect")
        out.append(f"**{r.run_id}** {r.plateau}; {what}.")
    return out


def plateau_record(runs: pd.DataFrame) -> dict:
    """report.json's "plateau": the rule's numbers and mark, each config with flagged runs (N of M), each
    flagged run (id, why, best and unigram loss, the
    effects it enters) and the completed runs whose unigram loss is unknown (not checked)."""
    rows = [{"run_id": r.run_id, "reason": r.plateau, "best_val_loss": _number(r.best_val_loss),
             "unigram_loss": _number(r.unigram_loss), "effects": getattr(r, "plateau_effects", None) or ""}
            for r in flagged(runs).itertuples()]
    unknown = (sorted(runs.loc[(runs["status"] == COMPLETED) & runs["unigram_loss"].isna(), "run_id"])
               if "unigram_loss" in runs.columns else [])
    configs = [{"config": label, "late": n, "runs": m} for label, n, m in findings(runs)]
    return {"tolerance": PLATEAU_TOL, "late_share": LATE_SHARE, "mark": MARK, "configs": configs, "runs": rows,
            "unknown": unknown}


def _number(v) -> float | None:
    return float(v) if v is not None and math.isfinite(float(v)) else None

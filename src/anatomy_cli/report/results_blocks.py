"""The README's and docs' numbers, rendered from results files (no torch): marked blocks, never typed by hand.

  render   one marked block or inline value of a results document (BLOCKS: a table of the kinds, by name)
  update   every marked block of a text, rewritten from its study's results file
  drifted  the blocks whose text differs from what their file renders
  rewrite  `anatomy results [--check] [FILE ...]`: rewrite, or list what drifted (README.md and docs/*.md)

Marked blocks. A README names a study's file (experiments/results/<study>.json beside it) and
what to show; the text between the markers is the tool's, never typed by hand:
  <!-- results five-flips directions -->   ...table...   <!-- /results -->
  gain <!-- results five-flips gain rope add-one -->+0.445<!-- /results --> nats
Kinds: verdict, directions, ends, rule, moves, scale, parts, decide, tuning, lrs, worth (blocks); gain FLIP DIRECTION
[STEP], interval FLIP DIRECTION, call FLIP DIRECTION, trend FLIP DIRECTION (the call across sizes), family (the
rule's level, family, looks and family-wise error: stats.rule_text, as the terminal and the report say them),
lr CONFIG (a tuned study's chosen LR of one config), shared-gain / shared-interval / shared-call FLIP DIRECTION
(a tuned study's effect at the shared LR) (inline). tuning: each effect at its configs' own LRs beside the
shared LR, flagged LR-confounded where the calls differ; lrs: each config's chosen LR and why (report/lr_comparison.py);
tokenizers: each component's call at each tokenizer and whether it holds across them, `across` the same as one
sentence (inline; report/across_tokenizers.py).
worth: each part's compute (or data) multiplier at every rung of a ladder beside its gain (report/ladder.py);
multiplier FLIP DIRECTION RUNG: one of them (inline).
"""  # noqa: E501 (the docstring is docs/layout.md's text)

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Callable
from pathlib import Path

from anatomy_cli.report import decide as decide_mod
from anatomy_cli.report import lr_allowance, lr_comparison, stats
from anatomy_cli.report.results_file import LOSS_UNITS, ResultsError, _shown, load, unit_of
from anatomy_cli.spec.roles import ADD_ONE, ALL_ON, REFERENCE, REMOVE_ONE, VERB, variant
from anatomy_cli.store.records import DecideRecord

RESULTS_DIR = Path("experiments") / "results"
MARK = re.compile(r"<!-- results (?P<study>[\w.-]+) (?P<what>[^>]*?) -->(?P<body>.*?)<!-- /results -->", re.DOTALL)
INLINE = ("gain", "interval", "call", "trend", "lr", "shared-gain", "shared-interval", "shared-call", "bytes-per-token",
          "bits-per-nat", "across")


def render(doc: dict, what: str) -> str:
    """One marked block (a BLOCKS kind: markdown between newlines) or an inline value."""
    kind, *args = what.split()
    if kind in BLOCKS:
        return "\n" + BLOCKS[kind](doc, *args) + "\n"
    if kind == "family":
        return _family(doc)
    if kind == "multiplier":
        return _multiplier(doc, *args)
    if kind in INLINE:
        return _inline(doc, kind, *args)
    raise ResultsError(f"unknown results block {kind!r}; choose from {', '.join(BLOCKS)}, {', '.join(INLINE)}, "
                       f"family")


def _loss(doc: dict) -> list[dict]:
    return [e for e in doc.get("effects") or [] if e["metric"] in LOSS_UNITS]


def _unit(doc: dict) -> str:
    """The unit of a results file's losses: its own (results_file.unit_of)."""
    return unit_of(doc)


def _g(x, digits: int = 3) -> str:
    return "n/a" if x is None else f"{x:+.{digits}f}".replace("-", "−")


def _interval(e: dict, digits: int = 3) -> str:
    return "—" if e["adj_low"] is None else f"[{_g(e['adj_low'], digits)}, {_g(e['adj_high'], digits)}]"


def _end(doc: dict, role: str) -> str:
    return doc["ends"].get(role, {}).get("name", role)


def _change(doc: dict, e: dict) -> str:
    return (f"added to {_end(doc, REFERENCE)}" if e["direction"] == ADD_ONE
            else f"removed from {_end(doc, ALL_ON)}") + (f" [{e['group']}]" if e["group"] else "")


def _verdict(doc: dict) -> str:
    rows = sorted(_loss(doc), key=lambda e: -math.inf if e["gain"] is None else -e["gain"])
    lines = ["| rank | component | change | gain | interval | call |", "|---:|---|---|---:|---|---|"]
    lines += [f"| {i} | {e['flip']} | {_change(doc, e)} | {_g(e['gain'])} | {_interval(e)} | {e['call']} |"
              for i, e in enumerate(rows, 1)]
    return "\n".join(lines)


def _directions(doc: dict) -> str:
    effects = _loss(doc)
    dirs = [d for d in (ADD_ONE, REMOVE_ONE) if any(e["direction"] == d for e in effects)]
    heads = {ADD_ONE: f"added to the {_end(doc, REFERENCE)} end",
             REMOVE_ONE: f"removed from the {_end(doc, ALL_ON)} end"}
    by = {(e["flip"], e["direction"], e["group"]): e for e in effects}
    flips = list(dict.fromkeys((e["flip"], e["group"]) for e in sorted(effects, key=lambda e: -(e["gain"] or 0))))
    lines = ["| component | " + " | ".join(heads[d] for d in dirs) + " |", "|---|" + "---|" * len(dirs)]
    for flip, group in flips:
        cells = [by.get((flip, d, group)) for d in dirs]
        name = flip + (f" [{group}]" if group else "")
        lines.append(f"| {name} | " + " | ".join("" if e is None else f"{_g(e['gain'])} {_interval(e)} {e['call']}"
                                                  for e in cells) + " |")
    return "\n".join(lines)


def _ends(doc: dict) -> str:
    b, parts = doc["budget"], []
    for role in (REFERENCE, ALL_ON):
        e = doc["ends"].get(role)
        if e:
            sd = f", seed-to-seed sd {e['sd']:.3f}" if e["sd"] is not None else ""
            parts.append(f"the {e['name']} end reaches {e['mean']:.3f}{sd}{_path(e)}")
    tokens = f" ({b['tokens']:,} tokens)" if b.get("tokens") else ""
    n = len(doc["seeds"])
    return (f"Best val loss ({_unit(doc)}), {f'mean over {n} seeds' if n != 1 else 'one seed'}: " + "; ".join(parts)
            + f"; budget {b.get('steps', '?'):,} steps{tokens}; {doc['runs']['completed']} of {doc['runs']['total']}"
            f" runs completed.")


def _path(e: dict) -> str:
    """' at step S' and what came after it (files written before these keys existed: '')."""
    if e.get("best_step") is None or not e.get("last_step") or e.get("final") is None:
        return ""
    from anatomy_cli.report.frames import run_flags

    best, last, median = e["best_step"], e["last_step"], "median " if e["seeds"] > 1 else ""
    improving, overfit = run_flags(best, last, last)  # a completed run's last evaluation is its last step
    if improving:
        return f" at {median}step {best:,}, still improving at its last evaluation"
    if overfit:
        return f" at {median}step {best:,}, then overfits: {e['final']:.3f} at step {last:,}"
    return f" at {median}step {best:,} ({e['final']:.3f} at step {last:,})"


def _decide(doc: dict) -> str:
    """A --decide study's rounds, each look's alpha and why it stopped (the seeds of each effect are in
    the other blocks); nothing for a study run without it."""
    record = doc.get("decide")
    return decide_mod.stop_text(DecideRecord.model_validate(record)) + "." if record else ""


def _margin(e: dict) -> tuple[float | None, str | None]:
    """An effect's margin and where it came from, read under the keys the file keeps for them
    (`threshold`, `threshold_basis`: EFFECT_KEYS, as frames.FILE_NAMES writes them)."""
    return e["threshold"], e["threshold_basis"]


def _family(doc: dict) -> str:
    """stats.rule_text with the study's numbers: its loss family's level and size, the looks its
    decide record planned (1 without one) and how many groups it judged apart."""
    from anatomy_cli.report.stats import rule_text

    tested = [e for e in _loss(doc) if e["family"]]
    if not tested:
        return "no intervals: every effect has fewer than two seeds"
    looks = DecideRecord.model_validate(doc["decide"]).alphas if doc.get("decide") else 1
    return rule_text(min(e["adj_level"] for e in tested), int(max(e["family"] for e in tested)), looks,
                     len({e["group"] for e in tested}))


def _rule(doc: dict) -> str:
    e = next((e for e in _loss(doc) if e["family"]), None)
    if e is None:
        return "No intervals: every effect has fewer than two seeds."
    margin, basis = _margin(e)
    edge = "unknown" if margin is None else f"±{margin:.3f} {_unit(doc)}"
    family = _family(doc)
    family = family[:1].upper() + family[1:]
    if basis == "noise floor":  # a file written by the old rule (margin: the reference end's seed-to-seed sd)
        return (f"{family}; a call needs the interval to exclude 0 and the gain to lie beyond {edge} (the reference "
                f"end's seed-to-seed sd); negligible: the interval lies inside it.")
    basis = ("given by the study's margin" if basis in (stats.GIVEN, stats.GIVEN_BEFORE) else basis
             if str(basis).startswith(stats.AFTER) else "the default margin, fixed before the data")
    mdes = sorted(x["mde"] for x in _loss(doc) if x.get("mde") is not None and x["group"] == e["group"])
    mde = (f" An effect of {statistics.median(mdes):.3f} {_unit(doc)} is called 80 % of the time (the median minimum "
           f"detectable effect)." if mdes else "")
    # prior_df: a file judged by the rule of issues 28-34 (variances moderated behind Bartlett's test; null:
    # one pooled variance); absent or 0: each effect on its own variance, the rule since issue 35
    borrowed = "prior_df" in e and e["prior_df"] != 0
    how = ("moderated t: the variances of the group borrow strength from each other (empirical Bayes, Smyth 2004; "
           "the rule before issue 35)" if borrowed else "each effect's own t: each effect is judged on its own "
           "variance and degrees of freedom, none borrows")
    return (f"{family}; {how}. A call needs the "
            f"interval to exclude 0 and the gain to lie beyond {edge} ({basis}); negligible: the interval lies inside "
            f"it; below margin: the interval excludes 0, the gain lies inside it; undecided: the rest.{mde}")


def _moves(doc: dict, *_: str) -> str:
    lines = []
    rows = [r for r in doc["eval_gains"] if r["group"] == (doc["eval_gains"][0]["group"] if doc["eval_gains"] else "")]
    for direction, word in VERB.items():
        mine = [r for r in rows if r["direction"] == direction]
        steps = sorted({s for r in mine for s in r["steps"] if s > 0})
        for step in dict.fromkeys([steps[0], steps[len(steps) // 2], steps[-1]] if steps else []):
            at = sorted(((r["gain"][r["steps"].index(step)], r["flip"]) for r in mine if step in r["steps"]),
                        key=lambda t: -t[0])
            lines.append(f"- {word}, step {step}: " + " > ".join(f"{f} {_g(g)}" for g, f in at))
    return "\n".join(lines)


UNFAIR = "not a fair timing"  # in effects.OVERLAP_NOTE: the training runs' own tokens/s (files before NOT_TIMED too)


def _parts(doc: dict) -> str:
    """Each added part: its quality gain and call, its speed change and call (with a timing pass),
    its parameters (total, active) and its decode state at long context, against the reference end."""
    cost = {c["role"]: c for c in doc.get("configs", [])}
    ref = cost.get(REFERENCE, {})
    speed = {e["flip"]: e for e in doc["effects"] if e["metric"] == "tokens_per_s" and e["direction"] == ADD_ONE}
    lines = ["| part | gain in best val loss | speed (tokens/s) | params (active) | decode state at "
             f"{ref.get('positions', 4096):,} positions |", "|---|---|---|---|---|"]
    for e in sorted((e for e in _loss(doc) if e["direction"] == ADD_ONE), key=lambda e: -(e["gain"] or 0)):
        c, s = cost.get(variant(e["flip"], ADD_ONE), {}), speed.get(e["flip"])  # the add-one config's cost
        timed = s is not None and s["call"] != stats.NOT_TIMED and UNFAIR not in (s.get("note") or "")
        fast = f"{_g(s['gain'], 1)} % {_interval(s, 1)} {s['call']}" if timed else "not timed"
        size = "—" if c.get("params") is None else f"{c['params']:,} ({c['active_params']:,})"
        state = "—" if c.get("state_bytes_4k") is None else _mib(c["state_bytes_4k"], ref.get("state_bytes_4k"))
        lines.append(f"| {e['flip']} | {_g(e['gain'])} {_interval(e)} {e['call']} | {fast} | {size} | {state} |")
    if ref:
        lines.append(f"| ({_end(doc, REFERENCE)} end) | | | {ref['params']:,} ({ref['active_params']:,}) | "
                     f"{_mib(ref['state_bytes_4k'], None)} |")
    return "\n".join(lines)


def _mib(n: int, ref: int | None) -> str:
    ratio = "" if not ref else f", {n / ref:.2f}x"
    return f"{n / 2**20:.2f} MiB{ratio}"


def _scale(doc: dict) -> str:
    """Each component's gain at each size and its call across sizes (a study with sizes)."""
    if "scale" not in doc:
        raise ResultsError(f"{doc['study']}: no scale results (the study has fewer than two sizes)")
    sc = doc["scale"]
    names = list(dict.fromkeys(s["size"] for s in sc["sizes"]))
    params = {s["size"]: s["non_embedding_params"] for s in sc["sizes"]}
    cells = {(e["series"], e["flip"], e["direction"], e["size"]): e for e in sc["effects"]}
    lines = ["| component | change | " + " | ".join(f"{n} ({params[n]:,})" for n in names)
             + " | slope per 10x | call |",
             "|---|---|" + "---:|" * len(names) + "---:|---|"]
    for t in sc["trends"]:
        row = [cells.get((t["series"], t["flip"], t["direction"], n)) for n in names]
        slope = "n/a" if t["slope"] is None else _g(t["slope"]) + (
            f" [{_g(t['slope_adj_low'])}, {_g(t['slope_adj_high'])}]" if t.get("slope_adj_low") is not None else "")
        lines.append(f"| {t['flip']} | {_change(doc, t | {'group': t['series']})} | "
                     + " | ".join("" if e is None else f"{_g(e['gain'])} {_interval(e)}" for e in row)
                     + f" | {slope} | {t['call']} |")
    return "\n".join(lines)


def _across_of(doc: dict) -> list[dict]:
    if not doc.get("tokenizers"):
        raise ResultsError(f"{doc['study']}: no calls across tokenizers (the study names fewer than two)")
    return doc["tokenizers"]


def _tokenizers(doc: dict) -> str:
    """Each component's gain and call at each tokenizer, and whether the call holds across them
    (report/across_tokenizers.py): a study that names several tokenizers."""
    rows = _across_of(doc)
    names = list(dict.fromkeys(t for r in rows for t in r["tokenizers"]))
    lines = ["| component | change | " + " | ".join(names) + " | across tokenizers |",
             "|---|---|" + "---|" * len(names) + "---|"]
    for r in rows:
        cells = [f"{_g(r['gains'][t])} {_interval(dict(zip(('adj_low', 'adj_high'), r['intervals'][t])))} "
                 f"{r['calls'][t]}" if t in r["calls"] else "" for t in names]
        lines.append(f"| {r['flip']} | {_change(doc, r | {'group': ''})} | " + " | ".join(cells)
                     + f" | {r['across']} |")
    return "\n".join(lines)


def _across(doc: dict) -> str:
    """One sentence: the calls that hold across the study's tokenizers and those that move, each named with its
    calls (the README's line)."""
    rows = _across_of(doc)

    def named(kind: str, calls: bool) -> str:
        return ", ".join(f"{r['flip']} {VERB[r['direction']]}" + (
            " (" + ", ".join(f"{c} at {t}" for t, c in r["calls"].items()) + ")" if calls
            else f" ({next(iter(r['calls'].values()))})") for r in rows if r["across"] == kind) or "nothing"

    return (f"the same call at every tokenizer: {named('holds', False)}; another call with the tokenizer: "
            f"{named('moves', True)}; still open at some tokenizer: {named('open', True)}")
def _times(m) -> str:
    return "n/a" if m is None else f"{m:.2f}x"


def _worth_of(doc: dict) -> dict:
    w = doc.get("worth")
    if not w or not w.get("multipliers"):
        why = (w or {}).get("note") or "the study has no ladder"
        raise ResultsError(f"{doc['study']}: no multipliers ({why})")
    return w


def _worth(doc: dict) -> str:
    """Each part's compute (or data) multiplier [interval] call at every rung, its trend across rungs, and
    beside it its gain in loss at the largest rung (the loss call) (a study with a ladder, report/ladder.py)."""
    w = _worth_of(doc)
    rungs = list(w["rungs"])
    trend = {(t["series"], t["flip"], t["direction"]): t["call"] for t in w.get("trends") or []}
    top = rungs[-1]
    gain = {(e["flip"], e["direction"]): e for e in _loss(doc) if _rung_of(e["group"]) == top}
    lines = [f"| component | change | gain at {top} ({_unit(doc)}) | " + " | ".join(rungs) + " | across rungs |",
             "|---|---|---:|" + "---:|" * len(rungs) + "---|"]
    cells: dict = {}
    for m in w["multipliers"]:
        cells.setdefault((m["series"], m["flip"], m["direction"]), {})[m["rung"]] = m
    for (series, flip, direction), at in cells.items():
        e = gain.get((flip, direction))
        said = "" if e is None else f"{_g(e['gain'])} {_interval(e)} {e['call']}"
        row = [at.get(r) for r in rungs]
        lines.append(f"| {flip} | {_change(doc, {'direction': direction, 'group': series})} | {said} | "
                     + " | ".join("" if m is None else f"{_times(m['multiplier'])} [{_times(m['low'])}, "
                                  f"{_times(m['high'])}] {m['call']}" for m in row)
                     + f" | {trend.get((series, flip, direction), '')} |")
    laws = [f"{law['against']}: L = {law['floor']:.3g} + {law['scale']:.3g} (C / {law['unit']:.3g})^-{law['alpha']:.3g}"
            f" over {law['low']:.3g}..{law['high']:.3g} {'FLOPs' if law['axis'] == 'compute' else 'tokens'}"
            + (" (lack of fit p = " + f"{law['lack_of_fit_p']:.2g})" if law.get("lack_of_fit_p") is not None else "")
            for law in w.get("laws") or []]
    what = "compute" if w["axis"] == "compute" else "data"
    return "\n".join(lines) + (f"\n\nThe law each {what} multiplier inverts: " + "; ".join(laws) + "." if laws else "")


def _multiplier(doc: dict, flip: str = "", direction: str = "", *rung: str) -> str:
    """'1.17x [1.02x, 1.34x] helps': a part's multiplier at one rung (the inline `multiplier FLIP DIRECTION
    RUNG`, the rung as the ladder names it: '300 steps', 'M')."""
    name = " ".join(rung)
    m = next((m for m in _worth_of(doc)["multipliers"] if m["flip"] == flip and m["direction"] == direction
              and m["rung"] == name), None)
    if m is None:
        raise ResultsError(f"{doc['study']}: no multiplier for {flip} {direction} at {name!r}")
    return f"{_times(m['multiplier'])} [{_times(m['low'])}, {_times(m['high'])}] {m['call']}"


def _rung_of(group: str) -> str:
    """A budget ladder's rung named in an effect's group ('train.steps=300' -> '300 steps'); a size's name
    ('size M' -> 'M'); '' for none."""
    found = re.search(r"train\.steps=(\d+)", group or "")
    if found:
        return f"{found.group(1)} steps"
    return group.removeprefix("size ") if (group or "").startswith("size ") else ""


def _tuning_of(doc: dict) -> dict:
    if not doc.get("tuning"):
        raise ResultsError(f"{doc['study']}: no tuning results (the study was not run with --tune-lr)")
    return doc["tuning"]


def _shared(r: dict) -> dict:
    """A comparison row's shared-LR effect, under the keys _interval reads."""
    return {"gain": r["shared_gain"], "adj_low": r["shared_low"], "adj_high": r["shared_high"],
            "call": r["shared_call"]}


def _tuning(doc: dict) -> str:
    """A tuned study's effects at each config's own LR beside the shared LR (lr_comparison.table's columns),
    flagged where the two calls differ."""
    lines = ["| component | change | tuned gain | interval | call | shared-LR gain | shared interval | shared call | "
             "flag | LRs (end, variant) |", "|---|---|---:|---|---|---:|---|---|---|---|"]
    for r in _tuning_of(doc)["comparison"]:
        s, flag = _shared(r), lr_comparison.CONFOUNDED if r["confounded"] else ""
        lrs = f"{lr_allowance.lr_text(r['end_lr'])}, {lr_allowance.lr_text(r['variant_lr'])}"
        lines.append(f"| {r['flip']} | {_change(doc, r)} | {_g(r['gain'])} | {_interval(r)} | {r['call']} | "
                     f"{_g(s['gain'])} | {_interval(s)} | {s['call']} | {flag} | {lrs} |")
    return "\n".join(lines)


def _lrs(doc: dict) -> str:
    """Each config's selection (lr_comparison.arms_table's columns): its LR, best selection loss, sensitivity, why."""
    lines = ["| config | LR | selection loss | sensitivity | LRs tried | why |", "|---|---|---:|---:|---:|---|"]
    lines += [f"| {a['name']} | {lr_allowance.lr_text(a['lr'])} | {a['best_loss']:.4f} | {a['sensitivity']:.4f} | "
              f"{len(a['lrs'])} | {a['reason']} |" for a in _tuning_of(doc)["arms"]]
    return "\n".join(lines)


def _inline(doc: dict, kind: str, flip: str = "", direction: str = "", step: str = "") -> str:
    if kind in ("bytes-per-token", "bits-per-nat"):  # the constant its losses were turned into bits per byte by
        per = doc.get("per_byte")
        if not per:
            raise ResultsError(f"{doc['study']}: no per_byte (the validation windows' tokens and bytes)")
        ratio = per["val_bytes"] / per["val_tokens"]
        return f"{ratio:.3f}" if kind == "bytes-per-token" else f"{1 / (ratio * math.log(2)):.4f}"
    if kind == "across":
        return _across(doc)
    if kind == "lr":  # flip: the config's name
        arm = next((a for a in _tuning_of(doc)["arms"] if a["name"] == flip), None)
        if arm is None:
            raise ResultsError(f"{doc['study']}: no tuned config {flip!r}")
        return lr_allowance.lr_text(arm["lr"])
    if kind.startswith("shared-"):
        r = next((r for r in _tuning_of(doc)["comparison"] if r["flip"] == flip and r["direction"] == direction), None)
        if r is None:
            raise ResultsError(f"{doc['study']}: no shared-LR effect {flip} {direction}")
        s = _shared(r)
        return {"shared-gain": _g(s["gain"]), "shared-interval": _interval(s), "shared-call": s["call"]}[kind]
    if kind == "trend":
        t = next((t for t in doc.get("scale", {}).get("trends", [])
                  if t["flip"] == flip and t["direction"] == direction), None)
        if t is None:
            raise ResultsError(f"{doc['study']}: no trend across sizes for {flip} {direction}")
        return t["call"]
    if step:
        row = next((r for r in doc["eval_gains"] if r["flip"] == flip and r["direction"] == direction), None)
        if row is None or int(step) not in row["steps"]:
            raise ResultsError(f"{doc['study']}: no evaluation gain for {flip} {direction} at step {step}")
        return _g(row["gain"][row["steps"].index(int(step))])
    e = next((e for e in _loss(doc) if e["flip"] == flip and e["direction"] == direction), None)
    if e is None:
        raise ResultsError(f"{doc['study']}: no effect {flip} {direction}")
    return {"gain": _g(e["gain"]), "interval": _interval(e), "call": e["call"]}[kind]



# The block kinds, by name: what a marker `<!-- results STUDY KIND -->` renders.
BLOCKS: dict[str, Callable[..., str]] = {"verdict": _verdict, "directions": _directions, "ends": _ends, "rule": _rule,
                                         "moves": _moves, "scale": _scale, "parts": _parts, "decide": _decide,
                                         "tuning": _tuning, "lrs": _lrs, "tokenizers": _tokenizers,
                                         "worth": _worth}


# --------------------------------------------------------------------------- documents


def update(text: str, folder: Path) -> str:
    """text with every marked block rendered from folder/experiments/results/<study>.json."""
    cache: dict[str, dict] = {}

    def one(m: re.Match) -> str:
        study = m["study"]
        path = Path(folder) / RESULTS_DIR / f"{study}.json"
        if study not in cache:
            cache[study] = load(path)
        try:
            body = render(cache[study], m["what"])
        except (KeyError, TypeError, IndexError, ValueError, AttributeError) as err:  # a file missing a key
            raise ResultsError(f"{_shown(path)} cannot render '{m['what']}': {err.__class__.__name__}: {err}") from None
        return f"<!-- results {study} {m['what']} -->{body}<!-- /results -->"

    return MARK.sub(one, text)


def drifted(text: str, folder: Path) -> list[str]:
    """The marked blocks whose text differs from what their results file renders ('study what')."""
    fresh = update(text, folder)
    return [f"{a['study']} {a['what']}" for a, b in zip(MARK.finditer(text), MARK.finditer(fresh)) if a[0] != b[0]]


def rewrite(paths: list[Path], check: bool = False, say: Callable[[str], None] = print) -> int:
    """`anatomy results [--check] [FILE ...]` (default: README.md and docs/*.md): rewrite each file's marked blocks
    from its results files (say: one line per file rewritten), or with check, the number of blocks that drifted
    (say: one line each). A file missing, unreadable or rendering nothing raises ResultsError (one line)."""
    paths = paths or [Path("README.md"), *sorted(Path("docs").glob("*.md"))]
    bad = 0
    for path in paths:
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as err:
            raise ResultsError(f"cannot read {path}: {err}") from None
        bad += _one_file(path, text, check, say)
    return bad


def root_of(path: Path) -> Path:
    """The folder whose experiments/results/ a document's blocks read: the nearest of its own folder
    and those above it that has one (docs/x.md reads the repository's), else its own."""
    here = path.resolve().parent
    return next((d for d in (here, *here.parents) if (d / RESULTS_DIR).is_dir()), path.parent)


OPENING = re.compile(r"<!-- results [\w.-]+ [^>]*?-->")


def unclosed(text: str) -> list[int]:
    """Line numbers of opening markers that no `<!-- /results -->` closes (left silently unrendered)."""
    inside = {m.start() for m in MARK.finditer(text)}
    return [text.count("\n", 0, m.start()) + 1 for m in OPENING.finditer(text) if m.start() not in inside]


def _one_file(path: Path, text: str, check: bool, say: Callable[[str], None]) -> int:
    """--check: the number of drifted blocks (each named on stderr); else rewrite them, 0. A marker
    left open is one line naming the file and line, before anything is rewritten."""
    lines = unclosed(text)
    if lines:
        raise ResultsError(f"{path} line {lines[0]}: a results marker has no closing <!-- /results -->")
    if check:
        blocks = drifted(text, root_of(path))
        for block in blocks:
            say(f"{path}: block '{block}' differs from its results file")
        return len(blocks)
    new = update(text, root_of(path))
    if new != text:
        path.write_text(new, encoding="utf-8")
        say(f"{path}: rewritten from {RESULTS_DIR}/")
    return 0


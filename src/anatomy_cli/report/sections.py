"""The report's words and tables, in reading order, as page.py blocks (no torch).

  Parts          what the sections are made from: a Report (report/build.py, judged by stats.py's rule)
  lead           the opening paragraph: the runs, and the question the report answers
  sections       verdict, curves, effects over training, routing (a mixture of experts), speed, runs,
                 effect details, samples
  verdict_blocks / verdict_table   one family's ranked gains with their intervals and calls; reusable
                 for any set of judged effects (a section per model size, say)
  ranking_moves  the ranking early, midway and at the end of training
  scale_blocks / scale_lines   effects across model sizes (a study with [[sizes]]: scale.py's calls)
  (a tuned study's section, the shared-LR comparison: lr_comparison.py's blocks)

Every number a section shows is a gain (positive = having the component helps) with the interval
its call is made from; raw 95% intervals and Holm p-values appear only under Effect details.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from anatomy_cli.report import across_tokenizers, lr_comparison, textable
from anatomy_cli.report import decide as decide_mod
from anatomy_cli.report import scale as scale_mod
from anatomy_cli.report import speed as speed_mod
from anatomy_cli.report import verdict as vd
from anatomy_cli.report.build import Report
from anatomy_cli.report.effects import same_model_lines
from anatomy_cli.report.frames import CTX_PREFIX, LOSS_METRIC, RUN_COLUMNS, SAMPLE_CHARS, UNIT
from anatomy_cli.report.plateau import MARK, detail_lines, marked, plateau_lines
from anatomy_cli.spec import components as comp
from anatomy_cli.spec.roles import ADD_ONE, ALL_ON, REFERENCE, REMOVE_ONE, VERB, shown
from anatomy_cli.store.runs import SAMPLES

RUN_TABLE = ["run_id", "label", "seed", "status", "params", "active_params", "best_val_bpb", "best_val_loss",
             "best_step", "final_val_loss", "overfit_gap", "tokens_per_s", "step_time_ms", "max_grad_norm",
             "loss_spikes", "diverged_at"]
DETAIL_TABLE = ["flip", "direction", "against", "group", "n_pairs", "excluded", "gain", "adj_low", "adj_high",
                "call", "raw_low", "raw_high", "p_value", "p_holm", "note"]
FLOAT_FORMATS = {"tokens_per_s": "{:,.0f}", "step_time_ms": "{:.1f}", "wall_s": "{:.1f}",
                 "max_grad_norm": "{:.3g}", "p_value": "{:.3g}", "p_holm": "{:.3g}"}
GAIN_COLUMNS = ("gain", "adj_low", "adj_high", "raw_low", "raw_high")
LOSS_FORMATS = {c: "{:+.4f}" for c in GAIN_COLUMNS}


@dataclass(frozen=True)
class Parts:
    """A Report (report.build's) and the images written for it: what every section reads."""

    r: Report
    images: dict[str, Path]

    root = property(lambda self: self.r.root)
    rules = property(lambda self: self.r.rules)
    runs = property(lambda self: self.r.runs)
    effects = property(lambda self: self.r.effects)
    verdict = property(lambda self: self.r.verdict)  # loss effects, ranked (verdict.verdict_frame)
    speed = property(lambda self: self.r.speed_verdict)  # speed effects, ranked
    eval_effects = property(lambda self: self.r.eval_effects)
    scale = property(lambda self: self.r.scale)  # a study with two sizes or more
    tuned = property(lambda self: self.r.tuning)  # a tuned study (--tune-lr): the shared-LR comparison

    @functools.cached_property
    def components(self) -> dict[str, comp.Component]:
        return self.r.components


def lead(p: Parts) -> str:
    text = f"Runs under `{p.root}`: {len(p.runs)} runs ({status_counts(p.runs)})."
    if p.verdict.empty:
        return text
    ref, top = end_names(p.runs)
    flips = ", ".join(dict.fromkeys(p.verdict["flip"]))
    where = {ADD_ONE: f"added to the {ref} end", REMOVE_ONE: f"removed from the {top} end"}
    how = " and ".join(w for d, w in where.items() if d in set(p.verdict["direction"]))
    return text + f" The question: what is each of {flips} worth in best val loss, {how}, at this training budget?"


def sections(p: Parts) -> list[tuple[str, list]]:
    """The report in reading order: the answer first, speed after the quality sections."""
    loss = p.effects[p.effects["metric"] == LOSS_METRIC]
    ctx = [c for c in p.runs.columns if c.startswith(CTX_PREFIX)]
    curves = [("img", p.images["curves.png"])] + ([("img", p.images["grad-norm.png"])]
                                                  if "grad-norm.png" in p.images else [])
    across = [("Effects across scale", scale_blocks(p))] if p.scale is not None else []
    across += [("Fair learning rates", lr_comparison.blocks(p.tuned, p.images.get("lr-sensitivity.png")))] \
        if p.tuned is not None else []
    return [
        *worth_section(p),  # a ladder's multipliers lead
        ("Verdict", worth_note_blocks(p) + verdict_blocks(p)
         + ([("img", p.images["forest.png"])] if p.verdict.empty else [])  # else in it
         + component_blocks(p)),
        *across,
        ("Curves", [("p", ("One panel per component: the runs with it flipped (its colour) against the end they "
                           "are compared with (grey); mean over seeds."))] + curves),
        ("Effects over training", eval_blocks(p.eval_effects) + [("img", p.images["effects-over-training.png"])]),
        *([("Routing", [("p", ROUTING_NOTE), ("img", p.images["expert-load.png"])])] if "expert-load.png" in p.images
          else []),
        ("Speed", speed_blocks(p)),
        ("Runs", [("p", f"{len(p.runs)} runs: {status_counts(p.runs)}."),
                  ("table", display(by_components(p.runs), RUN_TABLE + ctx), True)]),
        ("Effect details", [("p", DETAIL_NOTE), ("table", display(loss, detail_columns(loss), LOSS_FORMATS), False)]
         + ([("p", f"The runs left on the unigram plateau late (the calls marked {MARK} rest on them):"),
             ("list", detail_lines(p.runs))] if detail_lines(p.runs) else [])),
        ("Samples", [("p", "One per config (its lowest seed), from the best weights."), ("samples", samples(p.runs))]),
    ]


ROUTING_NOTE = ("Each mixture of experts (its lowest seed): the share of every layer's routed tokens that each "
                "expert received on the fixed validation windows with the best weights, experts ordered by load "
                "within a layer. Dashed: the uniform share 1/E. Bars far above the line mean a router that "
                "collapsed onto a few experts; the rest then barely train.")
DETAIL_NOTE = ("gain = best val loss without the component minus with it, paired by seed (add-one: the end with "
               "every component off against it plus the component; remove-one: the end with every component on "
               "against it minus the component); positive = the component helps. adj_low/adj_high: the "
               "simultaneous interval the call is made from; raw_low/raw_high: the uncorrected 95% t interval; "
               "p_value: the paired t-test's; p_holm: after Holm-Bonferroni over every effect of the table.")


def end_names(runs: pd.DataFrame) -> tuple[str, str]:
    studied = runs.loc[runs["role"] != "", "design"]
    names = comp.end_names(studied.iloc[0].split("+")) if len(studied) else (REFERENCE, ALL_ON)
    return tuple(map(shown, names))


TOKENIZERS_RULE = ("holds: the same decided call at every tokenizer; moves: two decided calls differ; open: a "
                   "tokenizer still undecided")


def verdict_blocks(p: Parts) -> list:
    if p.verdict.empty:
        return [("p", "No paired runs yet: the verdict needs an end and at least one variant with a shared seed.")]
    ref, top = end_names(p.runs)
    bud = vd.budget(p.runs)
    blocks = [*component_blocks_head(p.verdict, p.runs, ref, top),
              ("table", component_table(p.verdict, ref, top), False),
              ("list", [vd.rule_line(p.verdict, UNIT, looks=p.rules.spending),
                        *decide_lines(p.rules.decide),
                        *same_model_lines(p.runs), *warning_lines(p.runs),
                        budget_line(bud, ref, top) if p.scale is None else f"**Budget**: {budget_text(p.scale)}",
                        noise_line(vd.noise_floor(p.runs), ref, top)])]
    # under the table, the configs with runs left on the unigram plateau (their calls marked), then the forest plot
    at = next(i for i, b in enumerate(blocks) if b[0] == "table") + 1
    blocks[at:at] = [("p", line) for line in plateau_lines(p.runs)] + [("img", p.images["forest.png"])]
    if p.scale is not None:
        blocks += [("p", "Across sizes (the call across sizes; Effects across scale has the rule):"),
                   ("list", scale_lines(p.scale))]
    if p.r.tokenizers:
        blocks += [("p", f"Across tokenizers (each its own family, {UNIT}; {TOKENIZERS_RULE}):"),
                   ("list", across_tokenizers.lines(p.r.tokenizers))]
    advice = vd.seeds_advice(p.rules, p.runs, p.verdict)
    if advice is not None:  # the cause the runs show; a command only where it trains something
        blocks += [("p", advice.text)] + ([("code", advice.command)] if advice.command else [])
    return blocks


def warning_lines(runs: pd.DataFrame) -> list[str]:
    """A run that completed yet learned nothing (summary.json's warning), one line each: its losses are no
    measurement of its config."""
    flagged = runs[runs["warning"].notna()] if "warning" in runs.columns else runs.iloc[:0]
    return [f"**{r.run_id}** {r.warning}" for r in flagged.itertuples()]


def decide_lines(record) -> list[str]:
    """A --decide study (its decide.json record): its rounds, each look's alpha and why it stopped (the seeds
    column says what each effect got)."""
    return [decide_mod.stop_text(record)] if record is not None else []


def component_blocks(p: Parts) -> list:
    """Each component of the verdict by name, what it is and where it comes from."""
    rows = []
    for name in dict.fromkeys(p.verdict["flip"]):
        c = p.components.get(name) or comp.BY_NAME.get(name)
        if c is not None:
            source = f" ({c.source})" if c.source else ""
            rows.append(f"**{name}**: {c.about}{source}; {c.describe('off')} -> {c.describe('on')}.")
    return [("p", "The components:"), ("list", rows)] if rows else []


CALL_SIGNS = {"helps": "▲", "hurts": "▼", "negligible": "="}  # a call told apart by a sign and weight, not colour


def component_blocks_head(verdict: pd.DataFrame, runs: pd.DataFrame, ref: str, top: str) -> list:
    """What the per-component table reads against, above it: the ends' losses (the scale of every gain) and
    how to read a cell."""
    ends = vd.ends_text(runs, ref, top)
    said = (f"What each component is worth: its gain in best val loss, loss without it minus loss with it ({UNIT}; "
            f"positive = the component helps), {directions_text(verdict, ref, top)}; each cell: gain [the interval "
            f"its call is made from] call (**▲ helps**, **▼ hurts**, **= negligible**; plain: undecided, or too few "
            f"seeds), components by their larger gain.")
    return ([("p", f"**Ends**: {ends.removeprefix('ends: ')}.")] if ends else []) + [("p", said)]


def call_shown(r) -> str:
    """A verdict row's call for report.md/html: its sign and in bold where it is decided, the plateau mark."""
    sign = CALL_SIGNS.get(r.call)
    return marked(f"**{sign} {r.call}**" if sign else r.call, getattr(r, "plateau", ""))


def component_table(verdict: pd.DataFrame, ref: str, top: str) -> pd.DataFrame:
    """The terminal's per-component table for report.md/html: component | added to the reference end |
    removed from the all-on end | seeds, each cell 'gain [interval] call' (call_shown)."""
    heads, rows = component_rows(verdict, ref, top, call_shown)
    rows = [row[:-1] + [row[-1].replace(" | ", ", ")] for row in rows]  # a '|' would end a markdown cell
    return pd.DataFrame(rows, columns=heads)


def component_rows(verdict: pd.DataFrame, ref: str, top: str, call=None) -> tuple[list[str], list[list[str]]]:
    """(headers, rows) of both directions side by side: component, 'gain [interval] call' per direction
    (`call`: a row -> its call as shown; default the call and its plateau mark), seeds; components ranked by
    their larger gain."""
    heads = {ADD_ONE: f"added to the {ref} end", REMOVE_ONE: f"removed from the {top} end"}
    dirs = [d for d in heads if d in set(verdict["direction"])]
    cell = {(r.flip, r.group, r.direction): r for r in verdict.itertuples()}
    names = list(dict.fromkeys((r.flip, r.group) for r in verdict.itertuples()))  # ranked: the larger gain first
    call = call or (lambda r: marked(r.call, getattr(r, "plateau", "")))

    def said(r) -> str:
        interval = f" [{r.adj_low:+.3f}, {r.adj_high:+.3f}]" if math.isfinite(r.adj_low) else ""
        return (f"{r.gain:+.3f}" if math.isfinite(r.gain) else "-") + f"{interval} {call(r)}"

    rows = []
    for flip, group in names:
        got = [cell.get((flip, group, d)) for d in dirs]
        seeds = list(dict.fromkeys(str(r.n_pairs) for r in got if r is not None))
        rows.append([flip + (f" [{group}]" if group else "")] + ["" if r is None else said(r) for r in got]
                    + [" | ".join(seeds)])
    return ["component", *(heads[d] for d in dirs), "seeds"], rows


def verdict_table(verdict: pd.DataFrame, fmt: str = "{:+.3f}") -> pd.DataFrame:
    """A judged family as display strings: rank, component, change, gain, interval, call, seeds."""
    rows = []
    for r in verdict.itertuples():
        rows.append({"rank": str(r.rank), "component": r.flip, "change": change(r.direction, r.group),
                     "gain": fmt.format(r.gain) if math.isfinite(r.gain) else "",
                     "interval": (f"[{fmt.format(r.adj_low)}, {fmt.format(r.adj_high)}]" if math.isfinite(r.adj_low)
                                  else "-"),
                     "seeds": str(r.n_pairs), "call": r.call})
    return pd.DataFrame(rows, columns=["rank", "component", "change", "gain", "interval", "call", "seeds"])


def verdict_text(r: Report, max_width: int | None) -> str:
    """A Report's verdict for a terminal or a pipe: plain text fitted to max_width (None: no limit); with
    sizes, a line per component with its call across sizes."""
    verdict, runs, across = r.verdict, r.runs, r.scale
    if verdict.empty:
        return "verdict: no paired runs yet (an end and a variant with a shared seed)."
    ref, top = end_names(runs)
    head = f"verdict: gain in best val loss ({UNIT}; > 0 = the component helps), largest first"
    ends = vd.ends_text(runs, ref, top)
    rule = vd.rule_line(verdict, UNIT, short=True, looks=r.rules.spending, calls=False)
    out = worth_text(r, max_width)  # a ladder's multipliers lead (or the one line why none)
    out += [textable.wrap(head, max_width), *([textable.wrap(ends, max_width)] if ends else []), "",
            directions_table(verdict, ref, top, max_width), "", textable.wrap(rule, max_width)]
    out += words_text(verdict, r.rules, max_width)
    out += [textable.wrap(line, max_width) for line in plateau_lines(runs, bold=False)]
    if across is not None:
        out += ["", "Across sizes (gain at the smallest -> the largest size):"]
        out += [textable.wrap(line, max_width) for line in scale_lines(across, bold=False)]
    if r.tokenizers:
        out += ["", textable.wrap(f"Across tokenizers ({TOKENIZERS_RULE}):", max_width)]
        out += [textable.wrap(line, max_width) for line in across_tokenizers.lines(r.tokenizers, bold=False)]
    advice = vd.seeds_advice(r.rules, runs, verdict)
    if advice is not None:
        out += [textable.wrap(advice.text, max_width)] + ([f"  {advice.command}"] if advice.command else [])
    return "\n".join(out)


def directions_table(verdict: pd.DataFrame, ref: str, top: str, max_width: int | None) -> str:
    """Both directions of each component side by side (added to the reference end | removed from the
    all-on end: gain [interval] call), components by their larger gain; where that is wider than
    max_width, one table per direction, each ranked."""
    heads = {ADD_ONE: f"added to the {ref} end", REMOVE_ONE: f"removed from the {top} end"}
    dirs = [d for d in heads if d in set(verdict["direction"])]
    wide = textable.table(*component_rows(verdict, ref, top), max_width, fit=[("drop", "seeds")], right={"seeds"})
    if max_width is None or max(map(len, wide.splitlines())) <= max_width:
        return wide
    parts = []
    for d in dirs:
        mine = [r for r in verdict.itertuples() if r.direction == d]
        body = textable.table(["component", "gain", "interval", "call"],
                              [[r.flip + (f" [{r.group}]" if r.group else ""), f"{r.gain:+.3f}",
                                f"[{r.adj_low:+.3f}, {r.adj_high:+.3f}]" if math.isfinite(r.adj_low) else "-",
                                marked(r.call, getattr(r, "plateau", ""))]
                               for r in mine], max_width, fit=[("cut", "component", 6)], right={"gain"})
        parts.append(f"{heads[d]}:\n{body}")
    return "\n\n".join(parts)


def words_text(verdict: pd.DataFrame, rules, max_width: int | None) -> list[str]:
    """The verdict's words, one line each (verdict.words), and where --decide came from; on a terminal,
    where a newcomer meets them, not behind a flag they would have to know of."""
    import textwrap

    pairs = vd.words(verdict, UNIT)
    record = rules.decide
    if record is not None:
        pairs.append(("look", f"a judgement after a round of seeds; {len(record.looks)} planned, at "
                              f"{', '.join(map(str, record.looks))} seeds"))
    w = max(len(word) for word, _ in pairs) + 4
    out = ["The words:"] + [textwrap.fill(text, max(40, max_width or 10**6), initial_indent=f"  {word:<{w - 2}}",
                                          subsequent_indent=" " * w) for word, text in pairs]
    if record is not None:
        out += [textable.wrap(f"--decide (turned on by {decide_mod.turned_on_by(rules)})"
                              + decide_mod.stop_text(record).removeprefix("--decide"), max_width)]
    return out


def speed_text(record: dict, max_width: int | None) -> str:
    """A timing pass's speed effects for a terminal, judged by the one rule (margin: stats.SPEED_MARGIN;
    the reference end's round-to-round spread is its noise)."""
    from anatomy_cli.report import effects as effects_mod

    spread = speed_mod.noise(record)
    judged = effects_mod.effects_frame([r | {"noise": spread} for r in speed_mod.timing_effects(record)], {})
    head = textable.wrap(speed_mod.summary_line(record) + ". Gain = % tokens/s with the component vs without; "
                         "> 0 = faster.", max_width)
    if judged.empty:
        return head + "\nNo component effects in this design (no end with its variants): tokens/s per config are " \
                      "in timing.json."
    shown = verdict_table(vd.verdict_frame(judged), "{:+.1f}%")
    body = textable.table(list(shown.columns), shown.values.tolist(), max_width,
                          fit=[("drop", "seeds"), ("drop", "rank"), ("cut", "change", 7), ("cut", "component", 6)],
                          right={"rank", "gain", "seeds"})
    rule = vd.rule_line(judged, "%", seeds="rounds", short=True)
    return "\n".join([head, "", body.replace("seeds", "rounds", 1), "", textable.wrap(rule, max_width)])


def directions_text(verdict: pd.DataFrame, ref: str, top: str) -> str:
    said = {ADD_ONE: f"added = to the {ref} end", REMOVE_ONE: f"removed = from the {top} end"}
    return ", ".join(said[d] for d in said if d in set(verdict["direction"]))


def change(direction: str, group: str = "") -> str:
    """'added' | 'removed' (the paragraph above a table says to and from which end), and the group."""
    return VERB[direction] + (f" [{group}]" if group else "")


def budget_line(bud: dict, ref_name: str, top_name: str) -> str:
    if "steps" not in bud:
        return "**Budget**: unknown."
    text = (f"**Budget**: this holds for {bud['steps']:,} training steps"
            + (f" ({bud['tokens']:,} tokens: batch {bud['batch_size']} x ctx {bud['ctx_len']})" if "tokens" in bud
               else "")
            + ".")
    if REFERENCE in bud and ALL_ON in bud:
        text += (f" There the {ref_name} end reaches {bud['reference']:.3f} and the {top_name} end "
                 f"{bud['all-on']:.3f} ({bud['reference'] - bud['all-on']:+.3f} apart).")
    if bud.get("still_improving"):
        text += (f" The {ref_name} end was still improving at its last evaluation, so a longer budget can "
                 f"shrink or reorder effects: see Effects over training.")
    return text


def noise_line(floor: dict, ref_name: str, top_name: str) -> str:
    parts = [f"{name} end sd {sd:.4f} over {n} seeds" for role, name in ((REFERENCE, ref_name), (ALL_ON, top_name))
             if role in floor for sd, n, _ in [floor[role]] if math.isfinite(sd)]
    if not parts:
        return "**Noise floor**: unknown with one seed per config (seed-to-seed spread of the ends' best val loss)."
    return f"**Noise floor** (seed-to-seed sd of best val loss): {'; '.join(parts)}."


def speed_blocks(p: Parts) -> list:
    record = p.rules.timing
    if record is None:
        cmd = vd.ablate_command(p.rules, "--time")
        return [("p", "Not measured fairly here: the training runs' tokens/s shared the CPU with whichever runs "
                      "overlapped them (effects.csv keeps them, noted). For a fair timing, each config timed for a "
                      "few steps in one idle worker, interleaved in rounds:"), ("code", cmd)]
    head = (speed_mod.summary_line(record) + ". Gain = 100 x (tokens/s with the component / without - 1), paired "
            "within a round; positive = faster. The same rule as the verdict, against the speed margin (the "
            "smallest change that matters, fixed before the data); the timing pass is judged once, so its family "
            "spends the whole 0.05. The reference end's round-to-round spread of tokens/s is the effects' noise, "
            "shown beside the margin, never used as it.")
    rule = vd.rule_line(p.speed, "%", seeds="rounds")
    return [("p", head), ("table", verdict_table(p.speed, "{:+.1f}%"), False), ("list", [rule]),
            ("img", p.images["speed.png"])]


def eval_blocks(eval_effects: pd.DataFrame) -> list:
    text = ("Each component's paired gain in val loss at every evaluation (positive = helps; band: the raw 95% "
            "interval at that evaluation, no call is made from it): a head start that fades comes back to zero, a "
            "lasting gain stays apart.")
    moves = ranking_moves(eval_effects) if len(eval_effects) else []
    return [("p", text)] + ([("p", f"Ranking by gain ({UNIT}) early, midway and at the end:"), ("list", moves)]
                            if moves else [])


def ranking_moves(eval_effects: pd.DataFrame) -> list[str]:
    """'added, step 50: prenorm +0.272 > rope +0.246 > ...' at the first evaluation after step 0, the
    middle one and the last, per direction (the first group's effects)."""
    ev = eval_effects[(eval_effects["step"] > 0) & (eval_effects["group"] == eval_effects["group"].iloc[0])]
    out = []
    for direction, word in VERB.items():
        d = ev[ev["direction"] == direction]
        steps = sorted(d["step"].unique())
        for step in dict.fromkeys([steps[0], steps[len(steps) // 2], steps[-1]] if steps else []):
            at = d[d["step"] == step].sort_values("gain", ascending=False)
            out.append(f"{word}, step {step}: " + " > ".join(f"{r.flip} {r.gain:+.3f}" for r in at.itertuples()))
    return out


def component_columns(runs: pd.DataFrame) -> list[str]:
    """The runs frame's per-component on/off columns: the built-ins, then spec components."""
    return [c for c in runs.columns if c in comp.BY_NAME or (c not in RUN_COLUMNS and not c.startswith(CTX_PREFIX))]


def by_components(runs: pd.DataFrame) -> pd.DataFrame:
    """Runs ordered by how many components they have on (the reference end first), then label."""
    n_on = runs[component_columns(runs)].sum(axis=1)
    return runs.assign(_n=n_on).sort_values(["_n", "label", "seed", "run_id"])


def status_counts(runs: pd.DataFrame) -> str:
    return ", ".join(f"{n} {status}" for status, n in runs["status"].value_counts().items())


def detail_columns(effects: pd.DataFrame) -> list[str]:
    # The group column only says something when there is more than one group.
    return [c for c in DETAIL_TABLE if c != "group" or (effects["group"] != "").any()]


def display(df: pd.DataFrame, columns: list[str], formats: dict | None = None) -> pd.DataFrame:
    """The same table as strings, formatted once for both markdown and HTML."""
    formats = FLOAT_FORMATS | (formats or {})
    return pd.DataFrame({c: [_cell(v, c, formats) for v in df[c].astype(object)] for c in columns},
                        columns=columns)


def _cell(value: Any, column: str, formats: dict) -> str:
    if value is None or (not isinstance(value, str) and pd.isna(value)):
        return ""
    if isinstance(value, (bool, np.bool_)):
        return "yes" if value else "no"
    if isinstance(value, (int, np.integer)):
        return f"{value:,}" if column in ("params", "active_params") else str(value)
    if isinstance(value, (float, np.floating)):
        return formats.get(column, "{:.4f}").format(value)
    return str(value)


def samples(runs: pd.DataFrame) -> list[tuple[str, str]]:
    """(heading, text) for one run per config (its lowest seed) with a samples.txt, reference end first."""
    out = []
    for run in by_components(runs).drop_duplicates(["label", "settings"]).itertuples():
        path = Path(run.path) / SAMPLES
        if path.is_file():
            text = path.read_text(encoding="utf-8", errors="replace")
            text = text[:SAMPLE_CHARS] + ("\n[...]" if len(text) > SAMPLE_CHARS else "")
            out.append((f"{run.label} · seed {run.seed} · {run.run_id}", text))
    return out


# --------------------------------------------------------------------------- effects across scale


def scale_blocks(p: Parts) -> list:
    """Each component's gain at each size, the call across sizes, the sizes with their flags, the rule."""
    s = p.scale
    names = list(dict.fromkeys(s.sizes["size"]))
    intro = (f"The same design at {len(names)} sizes ({', '.join(names)}), each paired on its own seeds: a run's size "
             f"is part of its group, so no effect is differenced across sizes. Gains as in the verdict ({UNIT}; "
             f"> 0 = the component helps) with the interval its call is made from, against each size's non-embedding "
             f"parameters (every parameter but the token table, the LM head and the position table). "
             f"**Budget**: {budget_text(s)}")
    notes = [("p", "What stands in the way of a trend:"), ("list", list(s.notes))] if s.notes else []
    return [("p", intro), *notes, ("table", size_display(s.sizes), False),
            ("p", "Each component's gain [interval] at each size, the fitted change in gain per tenfold "
                  "non-embedding parameters [its simultaneous interval over seeds] and the call across sizes:"),
            ("table", trend_display(s), False),
            ("list", [SCALE_RULE.format(**rule_numbers(s)), FLAGS_NOTE]), ("img", p.images["scale.png"])]


SCALE_RULE = ("**The rule across sizes**: for each component and direction, each seed's gains at the sizes are "
              "fitted by a line in log10 parameters (OLS); the trend is the mean slope over the seeds that have "
              "every size ({seeds}), with its simultaneous {level} t interval over seeds (Bonferroni over the {m} "
              "trends of the ladder, each trend's own t, as every interval of this report). A trend counts when "
              "that interval excludes 0 and the fitted change across the ladder is larger than {margin}; it is flat"
              " when every change the interval allows across the ladder lies inside ±{margin}. **reverses sign**: "
              "it helps at one size and hurts at another, or a trend that counts crosses zero inside the ladder; "
              "**grows** / **shrinks**: a trend that counts, the fitted |gain| larger / smaller at the largest size"
              " than at the smallest; **holds**: it helps (or hurts) at some size, never the opposite, and the "
              "trend is flat; **no trend detected**: it helps (or hurts) at some size, but neither a trend nor "
              "flatness is shown; **not called at any size**: no size helps or hurts, and no trend counts; fewer "
              "than 3 seeds with every size: too few seeds. Where the study has its seeds, the call names what is "
              "missing instead: **one parameter count: no trend** (the sizes share one non-embedding parameter "
              "count), **size M diverged: no trend** / **still running** / **has no completed runs** (fewer than "
              "two sizes have a pair), **2 seeds with every size: runs diverged at L** (seeds lost at a size).")
FLAGS_NOTE = ("**Flags**: still improving = a run's best val loss is at its last evaluation (more steps would lower "
              "it, and may reorder the effects); overfit = a run's best came before half its steps (it is memorising "
              "the corpus, so part of what is compared is memory).")


def rule_numbers(s: scale_mod.Scale) -> dict:
    margin = float(s.trends["margin"].iloc[0]) if len(s.trends) else math.nan
    seeds = sorted(set(s.trends["n_seeds"]))
    levels = s.trends["adj_level"].dropna()
    return {"seeds": "/".join(map(str, seeds)) or "none", "m": int(s.trends["p_value"].notna().sum()),
            "level": f"{100 * levels.iloc[0]:.4g}%" if len(levels) else "",
            "margin": f"{margin:.3f} {UNIT} (the margin)" if math.isfinite(margin) else "0"}


def budget_text(s: scale_mod.Scale) -> str:
    sizes = s.sizes.drop_duplicates("size")
    first, last = sizes.iloc[0], sizes.iloc[-1]
    if s.budget.get("budget") == "tokens-per-param":
        r = s.budget.get("tokens_per_param")
        return (f"{r:g} training tokens per non-embedding parameter N (Chinchilla-style): steps = ceil({r:g} x N / "
                f"(batch x ctx)), from {_int(first['steps'])} steps at {first['size']} to {_int(last['steps'])} at "
                f"{last['size']}.")
    return (f"the same {_int(first['steps'])} steps at every size, so tokens per non-embedding parameter fall from "
            f"{first['tokens_per_param']:.3g} at {first['size']} to {last['tokens_per_param']:.3g} at {last['size']}.")


def _int(v) -> str:
    return "?" if v is None or (isinstance(v, float) and not math.isfinite(v)) else f"{int(v):,}"


def size_display(sizes: pd.DataFrame) -> pd.DataFrame:
    rows = [{"size": r.size + (f" [{r.series}]" if r.series else ""), "non-emb. params": _int(r.non_embedding_params),
             "params": _int(r.params), "steps": _int(r.steps), "tokens": _int(r.tokens),
             "tokens/param": f"{r.tokens_per_param:.3g}" if r.tokens_per_param else "", "runs": str(r.runs),
             "flags": r.flags or "-"} for r in sizes.itertuples()]
    return pd.DataFrame(rows, columns=["size", "non-emb. params", "params", "steps", "tokens", "tokens/param",
                                       "runs", "flags"])


def trend_display(s: scale_mod.Scale) -> pd.DataFrame:
    """Component, change, the gain [interval] at each size, the slope per tenfold parameters [its
    simultaneous interval], call (Holm p and raw intervals: effects-by-size.csv)."""
    names = list(dict.fromkeys(s.sizes["size"]))
    cells = {(r.series, r.flip, r.direction, r.size): r for r in s.by_size.itertuples()}
    rows = []
    for t in s.trends.itertuples():
        row = {"component": t.flip, "change": change(t.direction, t.series)}
        for name in names:
            e = cells.get((t.series, t.flip, t.direction, name))
            row[name] = ("" if e is None else "-" if not math.isfinite(e.gain)  # no completed pair at this size
                         else f"{e.gain:+.3f} " + (f"[{e.adj_low:+.3f}, {e.adj_high:+.3f}]"
                                                   if math.isfinite(e.adj_low) else ""))
        row["slope per 10x"] = (f"{t.slope:+.3f} [{t.slope_adj_low:+.3f}, {t.slope_adj_high:+.3f}]"
                                if math.isfinite(t.slope_adj_low) else f"{t.slope:+.3f}" if math.isfinite(t.slope)
                                else "")
        row["call"] = t.call
        rows.append(row)
    return pd.DataFrame(rows, columns=["component", "change", *names, "slope per 10x", "call"])


def scale_lines(s: scale_mod.Scale, bold: bool = True) -> list[str]:
    """'**rope**: added grows (+0.120 at S -> +0.310 at L); removed holds (...)', one line per component."""
    out = []
    for flip, trends in s.trends.groupby("flip", sort=False):
        said = []
        for t in trends.itertuples():
            cells = s.by_size[(s.by_size["flip"] == flip) & (s.by_size["direction"] == t.direction)
                              & (s.by_size["series"] == t.series) & np.isfinite(s.by_size["gain"].astype(float))]
            ends = ("" if not len(cells) else f" ({cells['gain'].iloc[0]:+.3f} at {cells['size'].iloc[0]} only)"
                    if len(cells) == 1 else
                    f" ({cells['gain'].iloc[0]:+.3f} at {cells['size'].iloc[0]} -> {cells['gain'].iloc[-1]:+.3f} at "
                    f"{cells['size'].iloc[-1]})")
            said.append(f"{change(t.direction, t.series)} {t.call}{ends}")
        out.append(f"{'**' * bold}{flip}{'**' * bold}: " + "; ".join(said))
    return out


# --------------------------------------------------------------------------- worth (report/ladder.py)


def worth_section(p: Parts) -> list[tuple[str, list]]:
    """The section a ladder's report leads with ('What each part is worth in compute' or '... in data'),
    or nothing (no ladder, or one with no law: its one line leads the verdict instead, worth_note_blocks)."""
    lad = p.r.ladder
    if lad is None or lad.worth is None:
        return []
    return [(f"What each part is worth in {lad.axis}", worth_blocks(p))]


def worth_text(r: Report, max_width: int | None) -> list[str]:
    """The terminal's lines for a ladder, before the verdict: each part's multiplier at the smallest and the
    largest rung with its call and its trend, the margin; or the one line why the ladder has none."""
    lad = r.ladder
    if lad is None:
        return []
    if lad.worth is None:
        return [textable.wrap(lad.note, max_width), ""] if lad.note else []
    w = lad.worth
    head = (f"worth in {lad.axis} ({'FLOPs' if lad.axis == 'compute' else 'tokens'} its end needs to match the arm "
            f"/ the arm's; > 1x = the part helps; within 1/{w.margin:g}..{w.margin:g}x negligible), at "
            f"{lad.rungs[0]} -> {lad.rungs[-1]}:")
    return [textable.wrap(head, max_width), *(textable.wrap("  " + line, max_width) for line in
                                              worth_lines(w, bold=False)), ""]


def worth_note_blocks(p: Parts) -> list:
    """The one line why a study's ladder has no multipliers (experiments/scale.toml's three sizes)."""
    lad = p.r.ladder
    return [("p", lad.note)] if lad is not None and lad.worth is None and lad.note else []


def worth_blocks(p: Parts) -> list:
    """The multipliers at every rung with their intervals and calls, the trend across rungs, the forest on a
    log axis with 1x marked, the fitted law with each arm's points, and the rule in brief."""
    lad = p.r.ladder
    w = lad.worth
    what, unit = (("compute", "FLOPs") if lad.axis == "compute" else ("data", "tokens"))
    intro = (f"Each part's worth as {what}: the {unit} the end it is compared with would need, on its own fitted "
             f"law, to reach the arm's best val loss, over the {unit} the arm used (> 1x: the part is worth that "
             f"much more {what}; < 1x: the arm is worse than its end). At every rung of the ladder "
             f"({', '.join(lad.rungs)}), with the interval its call is made from; the trend across rungs after it.")
    return [("p", intro), ("table", worth_display(w), False), ("img", p.images["worth.png"]),
            ("list", worth_lines(w) + law_lines(w)), ("img", p.images["law.png"]),
            ("list", [WORTH_RULE.format(margin=f"{w.margin:g}")])]


WORTH_RULE = ("**The rule for multipliers**: each end's law L = L_inf + A C^-alpha is fitted on its own rungs (the "
              "mean over seeds), one shape every arm of that end shares; an arm's loss is placed on the law at its "
              "rung (the law's value there plus the arm's paired difference) and inverted. The interval carries "
              "the seeds' noise and the law's fit uncertainty (each seed left out in turn, the law refitted: the "
              "jackknife), simultaneous over each rung's multipliers (Bonferroni), on log multipliers; a call "
              "at 1x against the margin {margin}x (within 1/{margin}..{margin}x is negligible), in the loss "
              "calls' words. **extrapolated**: the compute it needs lies beyond the ladder's range (or below the "
              "law's floor): shown, not called. The trend: each seed's log multiplier against log10 of the "
              "rung's cost, called as the trends across sizes are.")


def _times(m: float) -> str:
    return "inf" if not math.isfinite(m) else f"{m:.2f}x" if m < 100 else f"{m:,.0f}x"


def multiplier_cell(r) -> str:
    """'1.23x [1.10x, 1.38x] helps' for one row of worth.WORTH_COLUMNS."""
    interval = f" [{_times(r.low)}, {_times(r.high)}]" if math.isfinite(r.low) else ""
    return f"{_times(r.multiplier)}{interval} {r.call}"


def worth_display(w) -> pd.DataFrame:
    """One row per component and direction: its multiplier [interval] call at every rung, and its trend."""
    m = w.multipliers
    rungs = list(dict.fromkeys(m["rung"]))
    trend = {(t.series, t.flip, t.direction): t.call for t in w.trends.itertuples()}
    rows = []
    for (series, flip, direction, against), cells in m.groupby(["series", "flip", "direction", "against"],
                                                               sort=False):
        to = "to" if direction == ADD_ONE else "from"
        where = f"{VERB[direction]} {to} the {against}" + (f" [{series}]" if series else "")
        row = {"component": flip, "change": where}
        row |= {rung: "" for rung in rungs} | {c.rung: multiplier_cell(c) for c in cells.itertuples()}
        row["trend"] = trend.get((series, flip, direction), "")
        rows.append(row)
    return pd.DataFrame(rows, columns=["component", "change", *rungs, "trend"])


def worth_lines(w, bold: bool = True) -> list[str]:
    """'**rope** added to the 2017 end: 1.21x [1.05x, 1.40x] helps at S -> 1.60x ... at XL; grows', one
    line per component and direction."""
    trend = {(t.series, t.flip, t.direction): t.call for t in w.trends.itertuples()}
    out = []
    for (series, flip, direction, against), cells in w.multipliers.groupby(
            ["series", "flip", "direction", "against"], sort=False):
        first, last = cells.iloc[0], cells.iloc[-1]
        at = (f"{multiplier_cell(first)} at {first['rung']}" if len(cells) == 1 else
              f"{multiplier_cell(first)} at {first['rung']} -> {multiplier_cell(last)} at {last['rung']}")
        call = trend.get((series, flip, direction))
        where = f"{VERB[direction]} {'to' if direction == ADD_ONE else 'from'} the {against}"
        out.append(f"{'**' * bold}{flip}{'**' * bold} {where}{f' [{series}]' if series else ''}: {at}"
                   + (f"; across rungs: {call}" if call else ""))
    return out


def law_lines(w) -> list[str]:
    """Each end's fitted law, over the range it was fitted on, and its lack-of-fit note where there is one."""
    from anatomy_cli.report.worth import describe

    return [f"The {law.against}'s law: {describe(law._asdict())} over {law.low:.3g}..{law.high:.3g} "
            f"{'FLOPs' if law.axis == 'compute' else 'tokens'} ({law.rungs} rungs, {law.seeds} seeds)"
            + (f"; {law.note}" if law.note else "") for law in w.laws.itertuples()]

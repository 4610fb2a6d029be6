"""Write the comparison report: report.md/.html, CSV, JSON and figures, from the frames and effects (no torch).

  write_report       a Report's files (report.build): report.md/.html (words: sections.py, verdict.py), CSV,
                     JSON (report_document), figures (figures.py), rendered by page.py
  FILES, is_report   the names it may write, and whether a folder is one it wrote

Library code: returns data or writes files, never prints or exits; problems raise RunError or
ValueError with a one-line message. Figures use matplotlib's object API (no pyplot global state).
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from anatomy_cli.report import figures, lr_comparison, scale
from anatomy_cli.report import page as document
from anatomy_cli.report.build import Report
from anatomy_cli.report.effects import _pairings, groups
from anatomy_cli.report.frames import as_written, records
from anatomy_cli.report.plateau import plateau_record
from anatomy_cli.spec.roles import ADD_ONE
from anatomy_cli.store.runs import (
    atomic_write_text,
    read_summary,
)

FORMATS = ("md", "html", "csv", "json")
# Every file write_report may write, forest.png (always, and first) leading: a folder is a report folder
# when it holds forest.png, and `report --out` refuses to replace one of these files in any other folder.
FIGURES = ("forest.png", "curves.png", "effects-over-training.png", "speed.png", "grad-norm.png", "scale.png",
           "expert-load.png", "lr-sensitivity.png", "worth.png", "law.png")
FILES = FIGURES + ("runs.csv", "effects.csv", "eval-effects.csv", "effects-by-size.csv", "lr-comparison.csv",
                   "report.json", "report.md", "report.html")


def is_report(folder: Path) -> bool:
    """A folder write_report wrote (it always writes forest.png, and first)."""
    return (Path(folder) / FIGURES[0]).is_file()


def json_text(doc: dict) -> str:
    return json.dumps(doc, indent=2, allow_nan=False) + "\n"


def report_document(r: Report) -> dict:
    """What report.json holds (`anatomy report --json` prints it, whichever --format was written)."""
    return {"root": str(r.root), "runs": records(r.runs), "effects": records(as_written(r.effects)),
            "verdict": records(as_written(r.verdict)), "eval_effects": records(r.eval_effects),
            **({"scale": r.scale.record()} if r.scale is not None else {}), "plateau": plateau_record(r.runs),
            **({"tuning": lr_comparison.record(r.tuning)} if r.tuning is not None else {}),
            **({"worth": r.ladder.record()} if r.ladder is not None else {})}


def write_report(r: Report, out_dir: Path | None = None, formats: tuple[str, ...] = FORMATS) -> dict[str, Path]:
    """Write the report files of `r` (report.build's) into out_dir (default <root>/report/); returns {file name:
    path}.

    Always the figures (forest.png, curves.png, effects-over-training.png; speed.png with a timing
    pass; grad-norm.png for a stability study; scale.png for a study at two sizes or more;
    expert-load.png when a run is a mixture of experts; lr-sensitivity.png for a tuned study; worth.png and
    law.png for a ladder with multipliers, report/ladder.py); 'csv'
    adds runs.csv, effects.csv (loss and speed, told apart by `metric`), eval-effects.csv, with sizes
    effects-by-size.csv and, tuned, lr-comparison.csv (lr_comparison.comparison); 'md' report.md, 'html' a
    self-contained report.html, 'json' report.json (report_document; NaN -> null).
    """
    from anatomy_cli.report import sections

    unknown = sorted(set(formats) - set(FORMATS))
    if unknown:
        raise ValueError(f"unknown report format(s) {', '.join(unknown)}; choose from {', '.join(FORMATS)}")
    out = Path(out_dir) if out_dir is not None else Path(r.root) / "report"
    out.mkdir(parents=True, exist_ok=True)
    panels = curve_panels(r.runs)
    paths = {"forest.png": figures.plot_forest(r.verdict, out / "forest.png"),
             "curves.png": figures.plot_curves(r.curves, panels, out / "curves.png"),
             "effects-over-training.png": figures.plot_eval_effects(r.eval_effects, out / "effects-over-training.png")}
    if r.rules.timing is not None:
        paths["speed.png"] = figures.plot_forest(r.speed_verdict, out / "speed.png", unit="%")
    if _stability_study(Path(r.root), r.runs):
        paths["grad-norm.png"] = figures.plot_curves(r.curves, panels, out / "grad-norm.png", value="grad_norm")
    if r.scale is not None:
        paths["scale.png"] = figures.plot_scale(r.scale.by_size, r.scale.trends, out / "scale.png")
    if r.ladder is not None and r.ladder.worth is not None:  # the multipliers' forest and the fitted law
        paths["worth.png"] = figures.plot_worth(r.ladder.worth.multipliers, out / "worth.png")
        paths["law.png"] = figures.plot_law(r.ladder.worth.laws, r.ladder.frame, out / "law.png")
    loads = expert_loads(r.runs)
    if loads:
        paths["expert-load.png"] = figures.plot_expert_load(loads, out / "expert-load.png")
    tuned = r.tuning  # a tuned study (--tune-lr): its LR curves, the shared-LR calls
    if tuned is not None:
        arms = {a.arm: {"lrs": a.lrs, "losses": a.losses, "lr": a.lr, "initial_loss": tuned.record.initial_loss}
                for a in tuned.record.arms}
        paths["lr-sensitivity.png"] = figures.plot_lr_sensitivity(arms, tuned.panels, out / "lr-sensitivity.png")
    texts = {}
    if "csv" in formats:
        texts |= {"runs.csv": r.runs.to_csv(index=False), "effects.csv": as_written(r.effects).to_csv(index=False),
                  "eval-effects.csv": r.eval_effects.to_csv(index=False)}
        if r.scale is not None:
            texts["effects-by-size.csv"] = scale.by_size_csv(r.scale).to_csv(index=False)
        if tuned is not None:
            texts["lr-comparison.csv"] = tuned.comparison.to_csv(index=False)
    if "json" in formats:
        texts["report.json"] = json_text(report_document(r))
    if "md" in formats or "html" in formats:
        parts = sections.Parts(r, paths)
        lead, body = sections.lead(parts), sections.sections(parts)
        if "md" in formats:
            texts["report.md"] = document.markdown("anatomy report", lead, body)
        if "html" in formats:
            texts["report.html"] = document.html_page("anatomy report", lead, body)
    for name, text in texts.items():
        atomic_write_text(out / name, text)
        paths[name] = out / name
    return paths


def curve_panels(runs: pd.DataFrame) -> list[dict]:
    """One small-multiple panel per component and direction (and group): its runs and its end's."""
    panels = []
    for group, members in groups(runs[runs["role"] != ""]):
        for flip, direction, against, ref, var in _pairings(members):
            sign = "+" if direction == ADD_ONE else "−"
            panels.append({"flip": flip, "direction": direction, "ref_name": against, "var_name": f"{sign}{flip}",
                           "title": f"{sign}{flip} vs {against}" + (f" [{group}]" if group else ""),
                           "ref": list(ref["run_id"]), "var": list(var["run_id"])})
    return panels


def expert_loads(runs: pd.DataFrame) -> list[tuple[str, list[list[float]]]]:
    """(title, [layer][expert] shares) of each mixture-of-experts config's lowest seed with a recorded load."""
    from anatomy_cli.report.sections import by_components

    out = []
    for run in by_components(runs).drop_duplicates(["label", "settings"]).itertuples():
        load = (read_summary(Path(run.path)) or {}).get("expert_load")
        if load:
            out.append((f"{run.label} · seed {run.seed}", load))
    return out


def _stability_study(root: Path, runs: pd.DataFrame) -> bool:
    """Show gradient norms where stability is the question: a diverged run, loss spikes, or the name says so."""
    return bool((runs["status"] == "diverged").any() or (runs["loss_spikes"].fillna(0) > 0).any()
                or "stability" in root.name)

"""`anatomy report`'s study: where a report may write, its frames read once, the side files (no printing).

  margin_folder       where a report at another margin than the study's goes, beside its own report (a view)
  check_report_paths  refusals of --out and --results before anything is written
  read_report         the Report of a folder (report.build), TensorBoard back-filled and the results
                      file written as asked: what the CLI then writes and renders
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from anatomy_cli.spec.config import ConfigError
from anatomy_cli.store import runs


@dataclass(frozen=True)
class Reported:
    formats: tuple[str, ...]
    report: object  # report.build's Report, computed once: shown and written by the caller
    out: Path | None  # where its files go: --out, a margin's view beside the study's report, or None (its own)
    view: bool  # the report is at another margin than the study's: a view written beside its own
    events: dict | None  # TensorBoard back-fill counts, when asked


def read_report(root: Path, out: Path | None, formats: tuple[str, ...], margin: float | None = None,
                results: str | Path | None = None, tensorboard: bool = False,
                worth_margin: float | None = None) -> Reported:
    """The Report of root built once (judged at `margin`, else the study's), every refusal before anything is
    written (unknown formats, a missing folder, --out and --results where they may not write), then TensorBoard
    events back-filled and the results file written when asked. Without --out, a report at another margin than
    the study's goes beside the study's own (margin_folder), which stays as the study wrote it. worth_margin:
    the ladder's multipliers asked for at that margin (a ladder no law fits: worth.LadderError, exit 2)."""
    from anatomy_cli.report import write
    from anatomy_cli.report.build import build_report
    from anatomy_cli.training import tensorboard as tb_events

    if tensorboard:
        tb_events.require()
    bad = [f for f in formats if f not in write.FORMATS]
    if bad:
        raise ConfigError(f"unknown --format {', '.join(bad)}; choose from {', '.join(write.FORMATS)}")
    if not root.exists():
        raise runs.RunError(f"runs directory not found: {root}")
    report = build_report(root, margin, worth_margin)  # computed once: shown and written by the caller
    beside = margin_folder(root, margin, report.rules.study_margin) if out is None else None
    out = beside or out
    check_report_paths(root, out, results)  # before anything is written
    events = tb_events.backfill(root) if tensorboard else None
    if results is not None:
        from anatomy_cli.report.results_build import write_results

        write_results(Path(results), report)
    return Reported(formats, report, out, beside is not None, events)


MARGIN_VIEW = "report-margin-"  # ROOT/report-margin-M: a report at another margin than the study's


def margin_folder(root: Path, margin: float | None, study: float | None) -> Path | None:
    """Where `report ROOT --margin M` writes without --out: ROOT/report-margin-M, beside the study's own report
    (left as the study wrote it), when M is not the margin that report is judged at (`study`: the study's
    recorded margin, None: the default); else None."""
    from anatomy_cli.report.stats import DEFAULT_MARGIN

    if margin is None or margin == (study if study is not None else DEFAULT_MARGIN):
        return None
    return Path(root) / f"{MARGIN_VIEW}{margin:g}"


def check_report_paths(root: Path, out: Path | None, results: str | Path | None) -> None:
    """Where `report ROOT` may write: its folder (--out) not in a run or a sweep unless it is ROOT/report,
    its own, and not a folder of someone's files named as its own; --results not in a run or a sweep
    (ROOT/report aside), nor a folder, nor an existing file other than a results file, nor one of the
    report's own files in its folder (it would be written over)."""
    from anatomy_cli.report import write
    from anatomy_cli.report.results_file import is_results

    own = root / "report"
    folder = out if out is not None else own
    beside = folder.parent == root and folder.name.startswith(MARGIN_VIEW)  # margin_folder's
    runs.refuse_inside_runs(folder, "--out", "report folder", own=folder if beside else own)
    runs.refuse_foreign(folder, "--out", "report folder", write.is_report, write.FILES.__contains__)
    if results is None:
        return
    path = Path(results)
    runs.refuse_inside_runs(path, "--results", "results file", own=own)
    runs.refuse_replacing(path, "--results", "results file", is_results, given=str(results))
    if path.name in write.FILES and path.resolve().parent == folder.resolve():
        raise runs.RunError(f"{results} is the report's own {path.name}, which the report would write over; choose "
                            f"another --results")

"""Sweep-level commands registered on the main app: ablate and report."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.table import Table

from . import runs
from .cli_app import (EXIT_FAILED, EXIT_INTERRUPTED, JsonOut, RunsDir, StopFlag, app, console, err_console,
                      handle_errors, safe_dir)
from .config import ConfigError
from .sweep import ASSUMED_FLOPS, DEFAULT_SPEC, check_data, estimate_seconds, load_spec, measured_flops

def fmt_seconds(s: float) -> str:
    return f"{s:.0f}s" if s < 90 else f"{s / 60:.1f}min"


def plan_table(plan, sweep_dir: Path, workers: int, vocab: dict) -> Table:
    measured = measured_flops(sweep_dir)
    rate = measured[0] if measured else ASSUMED_FLOPS
    basis = (f"measured {rate / 1e9:.0f} GFLOP/s per run over {measured[1]} finished runs" if measured
             else f"assuming ~{rate / 1e9:.0f} GFLOP/s per run")
    est = {p.run_id: estimate_seconds(p.config, rate) for p in plan}
    statuses = {p.run_id: runs.run_status(sweep_dir / p.run_id) for p in plan}
    todo = sum(s for rid, s in est.items() if statuses[rid] not in runs.DONE_STATES)
    table = Table(title=f"plan: {len(plan)} runs -> {sweep_dir}  (to do: est. {fmt_seconds(todo / max(1, workers))} "
                        f"with {workers} worker{'s' * (workers > 1)}, {basis})")
    for col in ("run id", "components", "role", "seed", "params", "est.", "status"):
        table.add_column(col, justify="right" if col in ("seed", "params", "est.") else "left")
    for p in plan:
        m = p.config.model
        params = m.model_copy(update={"vocab_size": vocab[p.config.data.source]}).num_params()
        role = f"{p.role}:{p.flip}" if p.flip else p.role
        table.add_row(p.run_id, m.label, role, str(p.config.seed), f"{params:,}", fmt_seconds(est[p.run_id]),
                      statuses[p.run_id] or "pending")
    return table


class SweepDisplay:
    """One rich progress display: the sweep's run count plus a bar per run in flight."""

    def __init__(self, total: int):
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("{task.fields[info]}"), TimeElapsedColumn(), console=err_console)
        self.sweep = self.progress.add_task("[bold]sweep", total=total, info="")
        self.tasks: dict[str, int] = {}
        self.failed = 0

    def __call__(self, e: dict) -> None:
        kind, rid = e["event"], e.get("run_id")
        if kind == "plan":
            self.progress.update(self.sweep, completed=e["skipped"], info=f"{e['skipped']} already done")
        elif kind == "start" and rid not in self.tasks:
            self.tasks[rid] = self.progress.add_task(f"  {rid}", total=e.get("steps") or 1, info="")
        elif kind == "progress":
            if rid not in self.tasks:
                self(dict(event="start", run_id=rid, steps=e["steps"]))
            self.progress.update(self.tasks[rid], completed=e["step"], total=e["steps"],
                                 info=f"val {e['val_loss']:.3f}")
        elif kind == "done":
            status = e["summary"].get("status")
            self.failed += status == runs.FAILED
            if rid in self.tasks:
                self.progress.remove_task(self.tasks.pop(rid))
            self.progress.advance(self.sweep)
            if status != runs.COMPLETED:
                self.progress.console.print(f"  {rid}: {e['summary'].get('error') or status}", highlight=False)


@app.command()
@handle_errors
def ablate(
    spec: Annotated[Optional[Path], typer.Argument(help=f"Ablation spec (TOML); default experiments/{DEFAULT_SPEC}.")] = None,
    flip: Annotated[Optional[str], typer.Option(help="Only these flips, e.g. rope,swiglu.")] = None,
    seeds: Annotated[Optional[int], typer.Option(min=1, help="Number of seeds (overrides the spec).")] = None,
    steps: Annotated[Optional[int], typer.Option(help="Training steps per run (overrides the spec).")] = None,
    workers: Annotated[Optional[int], typer.Option(min=1, help="Parallel processes (default: one per core).")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Show the plan and stop.")] = False,
    runs_dir: RunsDir = Path("runs"),
    no_report: Annotated[bool, typer.Option("--no-report", help="Skip writing the report at the end.")] = False,
    executor: Annotated[str, typer.Option(help="local (processes on this machine) | dask (an existing cluster).")] = "local",
    address: Annotated[Optional[str], typer.Option(help="Dask scheduler address, e.g. tcp://127.0.0.1:8786.")] = None,
):
    """Expand a spec into a grid of runs that flip components one at a time, run them, and report."""
    from .sweep import default_workers, execute, expand, parse_flips

    if steps is not None and steps <= 0:
        raise ConfigError(f"--steps must be > 0, got {steps}")
    if executor not in ("local", "dask"):
        raise ConfigError(f"--executor must be local or dask, got {executor!r}")
    s = load_spec(spec)
    plan = expand(s, parse_flips(flip), seeds, steps)
    sweep_dir = safe_dir(runs_dir) / s.name
    n_workers = workers or default_workers(len(plan))
    console.print(plan_table(plan, sweep_dir, n_workers, check_data(plan)))
    if dry_run:
        return
    display = SweepDisplay(len(plan))
    with StopFlag(graceful=executor == "local") as stop, display.progress:
        summaries = execute(plan, sweep_dir, n_workers, display, sweep_name=s.name, executor=executor,
                            address=address, stop=stop)
    if stop.requested:
        statuses = [x.get("status") for x in summaries]
        err_console.print(f"interrupted: {statuses.count(runs.COMPLETED)} of {len(plan)} runs completed; rerun "
                          f"the same command to resume", highlight=False)
        raise typer.Exit(EXIT_INTERRUPTED)
    if not no_report:
        _write_report(sweep_dir, None, ("md", "html", "csv", "json"))
    statuses = [x.get("status") for x in summaries]
    console.print(f"{statuses.count(runs.COMPLETED)} completed, {statuses.count(runs.DIVERGED)} diverged, "
                  f"{statuses.count(runs.FAILED)} failed of {len(plan)} runs in {sweep_dir}")
    if runs.FAILED in statuses:
        raise typer.Exit(EXIT_FAILED)


def _write_report(root: Path, out: Path | None, formats: tuple[str, ...], frames=None) -> dict:
    from .report import write_report

    paths = write_report(root, out, formats, frames)
    for kind, path in paths.items():
        console.print(f"  {kind:>8}: {path}", highlight=False)
    return paths


@app.command()
@handle_errors
def report(
    runs_dir: Annotated[Path, typer.Argument(help="A sweep directory (or any folder of run directories).")],
    format: Annotated[Optional[list[str]], typer.Option("--format", help="md | csv | html | json (repeatable; default all).")] = None,
    out: Annotated[Optional[Path], typer.Option("--out", help="Output folder (default RUNS_DIR/report).")] = None,
    json_out: JsonOut = False,
):
    """Turn run directories into comparison tables, component effects with CIs, and figures."""
    from . import report as rep

    formats = tuple(format or rep.FORMATS)
    bad = [f for f in formats if f not in rep.FORMATS]
    if bad:
        raise ConfigError(f"unknown --format {', '.join(bad)}; choose from {', '.join(rep.FORMATS)}")
    if not runs_dir.exists():
        raise runs.RunError(f"runs directory not found: {runs_dir}")
    frames = rep.report_frames(runs_dir)  # read once: shown here and written below
    frame, _, effects = frames
    if json_out:
        paths = rep.write_report(runs_dir, out, formats, frames)
        console.print_json(json.dumps({"runs": rep.records(frame), "effects": rep.records(effects),
                                       "files": {k: str(v) for k, v in paths.items()}}))
        return
    console.print(frame_table(frame, ["run_id", "label", "seed", "status", "best_val_loss", "best_step",
                                      "overfit_gap", "tokens_per_s"], "runs"))
    loss = effects[effects["metric"] == rep.LOSS_METRIC]
    if len(loss):
        console.print(frame_table(loss, ["flip", "direction", "group", "n_pairs", "mean_delta", "ci_low", "ci_high",
                                         "within_noise", "note"], "component effects (delta best val loss)"))
    _write_report(runs_dir, out, formats, frames)


def frame_table(frame, columns: list[str], title: str) -> Table:
    table = Table(title=title)
    cols = [c for c in columns if c in frame.columns]
    for c in cols:
        table.add_column(c)
    for row in frame[cols].itertuples(index=False):
        table.add_row(*(_fmt(v) for v in row))
    return table


def _fmt(v) -> str:
    if isinstance(v, float):
        return "-" if v != v else f"{v:.4f}" if abs(v) < 100 else f"{v:,.0f}"
    return str(v)

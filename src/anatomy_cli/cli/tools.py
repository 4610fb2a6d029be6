"""More commands on the main app: check (the CI regression gate), export (to Hugging Face), and the results files'
tools: results (the README's and docs' numbers rendered from them) and rejudge (a file judged again)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.table import Table

from anatomy_cli.cli.app import (
    EXIT_FAILED,
    JsonOut,
    Plugins,
    RunsDir,
    app,
    console,
    err_console,
    handle_errors,
    load_parts,
    styled,
    warn,
    warn_short_runs,
)
from anatomy_cli.cli.render import SweepDisplay
from anatomy_cli.spec.config import ConfigError
from anatomy_cli.spec.knobs import from_alias
from anatomy_cli.store import runs
from anatomy_cli.sweep.plan import experiments_dir, load_plan

CI_SPEC = "ci-regression.toml"


@app.command()
@handle_errors
def check(
    spec: Annotated[Optional[Path], typer.Argument(help=f"Spec to run (default experiments/{CI_SPEC}).")] = None,
    baseline: Annotated[Path, typer.Option(help="Baseline JSON file.")] = Path("experiments/ci-baseline.json"),
    tolerance: Annotated[Optional[float], typer.Option(
        min=0, help="Allowed move of best val bits per byte, up or down (default: per config, from the measured seed "
        "spread).")] = None,
    runs_dir: RunsDir = Path("runs"),
    from_runs: Annotated[Optional[Path], typer.Option(
        "--from-runs", help="Compare finished runs in this sweep directory instead of running the spec.")] = None,
    workers: Annotated[Optional[int], typer.Option(min=1, help="Parallel processes.")] = None,
    update: Annotated[bool, typer.Option(
        "--update", help="Rewrite the baseline deliberately (runs --update-seeds seeds).")] = False,
    update_seeds: Annotated[int, typer.Option(min=2, help="Seeds measured for --update (spread -> tolerance).")] = 4,
    json_out: JsonOut = False,
    plugin: Plugins = None,
):
    """Regression gate: run the CI spec and compare each config's best val bits per byte to the baseline."""
    from anatomy_cli.report import gate

    load_parts(plugin)

    if tolerance is not None and not math.isfinite(tolerance):
        raise ConfigError(f"--tolerance must be a finite number >= 0, got {tolerance}")
    seeds = [from_alias("--seeds", str(update_seeds))] if update else []
    s, plan = load_plan(spec or experiments_dir() / CI_SPEC, seeds)
    if update:  # where the baseline goes, checked before the runs it is measured from train
        runs.refuse_inside_runs(baseline, "--baseline", "baseline file")
        runs.refuse_replacing(baseline, "--baseline", "baseline file", is_baseline)
        return _update(s, plan, baseline, runs_dir, workers, update_seeds)
    base = gate.load_baseline(baseline) if baseline.exists() else None
    if base is None:
        raise gate.BaselineError(f"baseline not found: {baseline} (create it with --update)")
    metric = gate.metric_of(base)
    sweep_dir = from_runs or _run_spec(s, plan, runs_dir, workers)
    rows = gate.compare(base, gate.collect(sweep_dir, {p.slug: p.config.train.lr for p in plan}, metric), tolerance)
    warnings = gate.unit_lines(base, baseline) + gate.environment_warnings(base, *_environment(), rows)
    if json_out:
        console.print_json(json.dumps({"passed": gate.passed(rows), "rows": rows, "warnings": warnings,
                                       "failures": gate.failure_lines(rows)}))
        raise typer.Exit(0 if gate.passed(rows) else EXIT_FAILED)
    for line in warnings:
        err_console.print(styled("warning:", "bold yellow", f" {line}"), highlight=False, soft_wrap=True)
    console.print(check_table(rows, baseline, metric))
    if not gate.passed(rows):
        bad = ", ".join(f"{r['config']} ({r['verdict'].lower()})" for r in rows if r["verdict"] != gate.OK)
        console.print(styled("regression gate failed:", "bold red", f" {bad}"), highlight=False)
        for line in gate.failure_lines(rows):
            console.print(f"  {line}", highlight=False, soft_wrap=True)
        raise typer.Exit(EXIT_FAILED)
    console.print(styled("regression gate passed", "bold green", f" ({len(rows)} configs)"))


def is_baseline(path: Path) -> bool:
    """A baseline file (a JSON object with a 'configs' table): the only file `check --update` replaces."""
    return isinstance((runs.json_object(path) or {}).get("configs"), dict)


def is_export(folder: Path) -> bool:
    """A folder `export` wrote (a Llama config.json): the only kind whose files --overwrite replaces."""
    return (runs.json_object(Path(folder) / runs.CONFIG) or {}).get("architectures") == ["LlamaForCausalLM"]


def _environment() -> tuple[str, str, str | None]:
    """(torch version, machine, CPU capability) as `check --update` records them in a baseline."""
    import torch

    from anatomy_cli.training.devices import cpu_capability, hardware

    return torch.__version__, hardware(torch.device("cpu")), cpu_capability()


def _run_spec(s, plan, runs_dir: Path, workers: int | None) -> Path:
    from anatomy_cli.report.gate import refuse_tuned
    from anatomy_cli.sweep.plan import check_data, execute, plan_workers

    sweep_dir = runs.runs_folder(runs_dir) / s.name
    refuse_tuned(sweep_dir)
    warn_short_runs(p.config for p in plan)
    display = SweepDisplay(len(plan))
    with display.progress:  # SIGTERM/SIGHUP unwind like Ctrl-C (handle_errors): exit 130, workers end, lock freed
        execute(plan, sweep_dir, workers or plan_workers(plan, check_data(plan)), display, sweep_name=s.name)
    return sweep_dir


def _update(s, plan, baseline: Path, runs_dir: Path, workers: int | None, seeds: int) -> None:
    from anatomy_cli.report import gate

    sweep_dir = _run_spec(s, plan, runs_dir, workers)
    results = gate.collect(sweep_dir)
    data = gate.build_baseline(results, s.base.seed, s.name, *_environment())
    baseline.parent.mkdir(parents=True, exist_ok=True)
    runs.atomic_write_json(baseline, data)
    console.print(styled("baseline rewritten", "bold yellow", f": {baseline} ({len(data['configs'])} configs, {seeds} "
                         f"seeds each; commit it with a message saying why the numbers moved)"), highlight=False)


def check_table(rows: list[dict], baseline: Path, metric: str = "best_val_bpb") -> Table:
    unit = "bits per byte" if metric == "best_val_bpb" else "nats per character"
    table = Table(title=f"regression gate vs {baseline} (best val {unit})")
    for col in ("config", "baseline", "now", "delta", "allowed", "identical", "verdict"):
        table.add_column(col, justify="left" if col in ("config", "verdict") else "right")
    for r in rows:
        style = "green" if r["verdict"] == "ok" else "bold red"
        fmt = lambda v, sign="": "-" if v is None else f"{v:{sign}.4f}"  # noqa: E731
        same = {True: "yes", False: "no"}.get(r.get("identical"), "-")
        table.add_row(r["config"], fmt(r["baseline"]), fmt(r["now"]), fmt(r["delta"], "+"), fmt(r["allowed"]),
                      same, styled(r["verdict"], style))
    return table


@app.command()
@handle_errors
def export(
    run_dir: Annotated[Path, typer.Argument(help="A LLaMA-shaped run (rmsnorm, pre, rope, swiglu; any n_kv_head).")],
    to: Annotated[str, typer.Option("--to", help="Target format (only 'hf').")] = "hf",
    out_dir: Annotated[Path, typer.Argument(
        help="Output folder for config.json + model.safetensors.")] = Path("export"),
    weights: Annotated[str, typer.Option(help="best | last")] = "best",
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace an existing export.")] = False,
    plugin: Plugins = None,
):
    """Export a run as a Hugging Face LlamaForCausalLM folder (loads with from_pretrained, offline)."""
    if to != "hf":
        raise ConfigError(f"--to {to!r} is not supported; only 'hf'")
    if weights not in ("best", "last"):
        raise ConfigError(f"--weights must be best or last, got {weights!r}")
    from anatomy_cli.exams.export import EXPORT_FILES, export_hf

    load_parts(plugin)

    # never into a run or a sweep, nor over files of the export's names that no export wrote, --overwrite or not
    runs.refuse_inside_runs(out_dir, "output folder", "export folder")
    runs.refuse_holding_runs(out_dir, "output folder", "export folder")  # an earlier export's config.json or not
    runs.refuse_foreign(out_dir, "output folder", "export folder", is_export, EXPORT_FILES.__contains__)
    info = export_hf(run_dir, out_dir, weights, overwrite=overwrite)
    if runs.run_status(run_dir) == runs.RUNNING:  # its owner lives: the weights are a snapshot
        warn(f"{run_dir} is still training: this exports its {weights} weights so far, which a later "
             f"checkpoint replaces (export again when it has finished)")
    console.print(f"exported {info['label']} ({info['params']:,} params) -> {info['out_dir']}: "
                  f"{', '.join(Path(f).name for f in info['files'])}", highlight=False)


@app.command()
@handle_errors
def results(
    files: Annotated[Optional[list[Path]], typer.Argument(
        help="Documents whose marked blocks to rewrite (default README.md and docs/*.md).")] = None,
    check: Annotated[bool, typer.Option("--check", help="Rewrite nothing: list each block that differs from its "
                                        "results file, exit 1 if any does.")] = False,
):
    """Rewrite the README's and docs' marked result blocks from experiments/results/*.json (what `anatomy report
    RUNS_DIR --results FILE` wrote): every number of them comes from a file the tool wrote."""
    from anatomy_cli.report.results_blocks import rewrite

    said = (lambda line: err_console.print(line, highlight=False, markup=False, soft_wrap=True)) if check else (
        lambda line: console.print(line, highlight=False, markup=False, soft_wrap=True))
    if rewrite(list(files or []), check, said):
        raise typer.Exit(EXIT_FAILED)


@app.command()
@handle_errors
def rejudge(
    files: Annotated[list[Path], typer.Argument(help="Results files (experiments/results/*.json).")],
    check: Annotated[bool, typer.Option("--check", help="Rewrite nothing: list the calls that would change, exit 1 if "
                                        "any would.")] = False,
):
    """Judge results files again by today's rule, from what they record (no runs needed), and print the calls
    that changed."""
    from anatomy_cli.report.rejudge import rejudge_files, table

    changed = rejudge_files(files, check)
    console.print("\n".join(table(changed)) if changed else "no call changes", highlight=False, markup=False,
                  soft_wrap=True)
    if check and changed:
        raise typer.Exit(EXIT_FAILED)

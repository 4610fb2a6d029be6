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
from . import components
from .components import label
from .config import MAX_SEEDS, ConfigError
from .sweep import ASSUMED_FLOPS, DEFAULT_SPEC, check_data, estimate_seconds, load_spec, measured_flops, spec_table

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
        table.add_row(p.run_id, label(p.config), role, str(p.config.seed), f"{params:,}", fmt_seconds(est[p.run_id]),
                      statuses[p.run_id] or "pending")
    return table


def plan_json(spec, plan, sweep_dir: Path) -> dict:
    """The plan as data: the study's components and, per run, id, role, flip, seed and resolved config."""
    design = next((p.design for p in plan if p.design), None)
    return {
        "name": spec.name, "sweep_dir": str(sweep_dir), "design": spec.design,
        "components": [components.record(c) for c in design.components] if design else [],
        "runs": [{"run_id": p.run_id, "slug": p.slug, "role": p.role, "flip": p.flip, "seed": p.config.seed,
                  "label": label(p.config), "status": runs.run_status(sweep_dir / p.run_id) or "pending",
                  "config": p.config.model_dump(mode="json")} for p in plan],
    }


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
    seeds: Annotated[Optional[int], typer.Option(min=1, max=MAX_SEEDS, help="Number of seeds (overrides the spec).")] = None,
    steps: Annotated[Optional[int], typer.Option(help="Training steps per run (overrides the spec).")] = None,
    workers: Annotated[Optional[int], typer.Option(min=1, help="Parallel processes (default: one per core; on a GPU, what its memory holds).")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Show the plan and stop.")] = False,
    runs_dir: RunsDir = Path("runs"),
    no_report: Annotated[bool, typer.Option("--no-report", help="Skip writing the report at the end.")] = False,
    executor: Annotated[str, typer.Option(help="local (processes on this machine) | dask (an existing cluster).")] = "local",
    address: Annotated[Optional[str], typer.Option(help="Dask scheduler address, e.g. tcp://127.0.0.1:8786.")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="With --dry-run: print the plan as JSON (id, role, seed, resolved config per run).")] = False,
    time_pass: Annotated[bool, typer.Option("--time", help="Instead of training: time every config (one seed) for a few steps, interleaved in rounds in one idle worker, into SWEEP_DIR/timing.json; the report's speed effects then come from it.")] = False,
    time_steps: Annotated[int, typer.Option(min=1, help="With --time: timed steps per config and round.")] = 20,
    time_rounds: Annotated[int, typer.Option(min=2, help="With --time: rounds (the speed interval is over rounds).")] = 5,
    device: Annotated[Optional[str], typer.Option(help="auto | cpu | cuda | mps (overrides base.train.device).")] = None,
    compile: Annotated[bool, typer.Option("--compile", help="torch.compile every run (sets base.train.compile).")] = False,
    dtype: Annotated[Optional[str], typer.Option(help="float32 | bfloat16 (overrides base.train.dtype).")] = None,
):
    """Expand a spec into a grid of runs that flip components one at a time, run them, and report.

    On one GPU, --workers N runs N processes at once on it (default: as many as its free memory
    holds at the plan's largest run, at most one per core); compiled graphs are cached once in
    RUNS_DIR/<spec>/.compile-cache for every run of the same shape.
    """
    from .sweep import default_workers, execute, expand, parse_flips

    if steps is not None and steps <= 0:
        raise ConfigError(f"--steps must be > 0, got {steps}")
    if executor not in ("local", "dask"):
        raise ConfigError(f"--executor must be local or dask, got {executor!r}")
    if json_out and not dry_run:
        raise ConfigError("--json prints the plan: use it with --dry-run")
    s = with_train(load_spec(spec), device=device, compile=compile or None, dtype=dtype)
    plan = expand(s, parse_flips(flip, spec_table(s)), seeds, steps)
    sweep_dir = safe_dir(runs_dir) / s.name
    if json_out:
        console.print_json(json.dumps(plan_json(s, plan, sweep_dir)))
        return
    vocab = check_data(plan)
    n_workers = workers or sweep_workers(plan, vocab, default_workers(len(plan)))
    if time_pass and not dry_run:
        _time(plan, sweep_dir, n_workers, time_steps, time_rounds)
        return
    console.print(plan_table(plan, sweep_dir, n_workers, vocab))
    if dry_run:
        return
    if any(p.config.train.compile for p in plan):  # before the workers spawn: they inherit it
        from .devices import share_compile_cache

        share_compile_cache(sweep_dir, n_workers)
    display = SweepDisplay(len(plan))
    with StopFlag(graceful=executor == "local") as stop, display.progress:
        summaries = execute(plan, sweep_dir, n_workers, display, sweep_name=s.name, executor=executor,
                            address=address, invocation={"spec": None if spec is None else str(spec), "flip": flip,
                                                         "steps": steps}, stop=stop)
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


def _time(plan, sweep_dir: Path, workers: int, steps: int, rounds: int) -> None:
    """The timing pass: rounds of every config in one spawned worker, then the speed effects."""
    import os

    from rich.progress import Progress

    from . import timing
    from .sweep import SweepLock

    threads = max(1, (os.cpu_count() or 1) // max(1, workers))  # what each run of the sweep trains with
    sweep_dir.mkdir(parents=True, exist_ok=True)
    with SweepLock(sweep_dir), Progress(console=err_console) as progress:
        task = progress.add_task(f"timing {len({p.slug for p in plan})} configs", total=rounds)
        record = timing.time_plan(plan, steps, rounds, threads=threads,
                                  on_round=lambda r, n: progress.update(task, completed=r))
        path = timing.write_timing(sweep_dir, record)
    console.print(timing.summary_line(record), highlight=False)
    rows = timing.timing_effects(record)
    table = Table(title=f"speed effect (tokens/s, % vs its end, 95% interval over {rounds} rounds) -> {path}")
    for col in ("flip", "direction", "against", "effect"):
        table.add_column(col)
    for r in rows:
        table.add_row(r["flip"], r["direction"], r["against"], timing.fmt_ci(r))
    console.print(table)
    if runs.find_runs(sweep_dir):
        _write_report(sweep_dir, None, ("md", "html", "csv", "json"))


def with_train(spec, **overrides):
    """The spec with base.train fields overridden (None = keep the spec's), validated again."""
    from .config import AblationSpec, apply_overrides, validate

    sets = {f"base.train.{k}": v for k, v in overrides.items() if v is not None}
    return validate(AblationSpec, apply_overrides(spec.model_dump(mode="json"), sets)) if sets else spec


def sweep_workers(plan, vocab: dict, cpu_default: int) -> int:
    """Default parallel runs: one per core on the CPU; on a GPU, from its free memory (devices.py)."""
    names = {p.config.train.device for p in plan}
    if names <= {"cpu"} or not plan:
        return cpu_default
    from .devices import default_workers, resolve_device

    device = resolve_device(names.pop() if len(names) == 1 else "auto")
    return default_workers(device, [p.config for p in plan], vocab, len(plan))


def _write_report(root: Path, out: Path | None, formats: tuple[str, ...], frames=None) -> dict:
    from .report import write_report

    paths = write_report(root, out, formats, frames)
    for kind, path in paths.items():
        console.print(f"  {kind}: {path}", highlight=False)
    return paths


@app.command()
@handle_errors
def report(
    runs_dir: Annotated[Path, typer.Argument(help="A sweep directory (or any folder of run directories).")],
    format: Annotated[Optional[list[str]], typer.Option("--format", help="md | csv | html | json (repeatable; default all).")] = None,
    out: Annotated[Optional[Path], typer.Option("--out", help="Output folder (default RUNS_DIR/report).")] = None,
    json_out: JsonOut = False,
    tensorboard: Annotated[bool, typer.Option("--tensorboard", help="Also back-fill TensorBoard event files for runs that have none, from metrics.jsonl (needs the tb extra).")] = False,
):
    """Turn run directories into comparison tables, component effects with CIs, and figures."""
    from . import report as rep
    from . import tb_events

    if tensorboard:
        tb_events.require()

    formats = tuple(format or rep.FORMATS)
    bad = [f for f in formats if f not in rep.FORMATS]
    if bad:
        raise ConfigError(f"unknown --format {', '.join(bad)}; choose from {', '.join(rep.FORMATS)}")
    if not runs_dir.exists():
        raise runs.RunError(f"runs directory not found: {runs_dir}")
    frames = rep.report_frames(runs_dir)  # read once: shown here and written below
    frame, _, effects = frames
    events = tb_events.backfill(runs_dir) if tensorboard else None
    if json_out:
        paths = rep.write_report(runs_dir, out, formats, frames)
        console.print_json(json.dumps({"runs": rep.records(frame), "effects": rep.records(effects),
                                       "files": {k: str(v) for k, v in paths.items()},
                                       **({"tensorboard": events} if events else {})}))
        return
    console.print(frame_table(frame, ["run_id", "label", "seed", "status", "best_val_loss", "best_step",
                                      "overfit_gap", "tokens_per_s"], "runs"))
    loss = effects[effects["metric"] == rep.LOSS_METRIC]
    if len(loss):  # the answer last, where the terminal leaves it
        from .verdict import verdict_frame

        console.print(frame_table(rep.verdict_table(verdict_frame(loss)), ["rank", "component", "change", "gain",
                                  "interval", "call"],
                                  "verdict: gain in best val loss (nats/char, > 0 = the component helps)"))
    _write_report(runs_dir, out, formats, frames)
    if events is not None:
        console.print(f"tensorboard: event files written for {events['written']} runs ({events['skipped']} had their "
                      f"own); view with: tensorboard --logdir {runs_dir}", highlight=False)


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


# Published reference size (README): the counts `anatomy components` reports changes against.
REFERENCE_SIZE = {"vocab_size": 1719, "d_model": 128, "n_layer": 4, "n_head": 4, "n_kv_head": 4, "ctx_len": 128}


def param_change(c, end_on: bool) -> tuple[int, int] | None:
    """(total, active per token) parameters the component adds (negative: removes) at the published
    size, from the 2017 end (end_on False) or the LLaMA end; None for a component that does not touch
    the model."""
    from .config import ModelConfig

    if not any(k.startswith("model.") for k in c.keys):
        return None
    model = REFERENCE_SIZE | components.model_settings(components.FIVE, on=end_on, model=REFERENCE_SIZE)
    flat = components.flatten({"model": model})
    counts = []
    for state in (True, False):
        settings = {k.removeprefix("model."): v for k, v in c.settings(state, flat).items() if k.startswith("model.")}
        cfg = ModelConfig.model_validate(model | settings)
        counts.append((cfg.num_params(), cfg.active_params()))
    return counts[0][0] - counts[1][0], counts[0][1] - counts[1][1]


@app.command("components")
@handle_errors
def components_cmd(
    spec: Annotated[Optional[Path], typer.Argument(help="Also list this spec's own [components.NAME].")] = None,
    json_out: JsonOut = False,
):
    """The component table: name, off -> on settings, what it changes in parameters, source."""
    table_ = spec_table(load_spec(spec)) if spec is not None else dict(components.BY_NAME)
    rows = []
    for c in table_.values():
        change = {end: param_change(c, end == "llama") for end in ("2017", "llama")}
        rows.append(components.record(c) | {"off_text": c.describe("off"), "on_text": c.describe("on")}
                    | {f"params_from_{end}": d and d[0] for end, d in change.items()}
                    | {f"active_from_{end}": d and d[1] for end, d in change.items()})
    if json_out:
        console.print_json(json.dumps({"reference_size": REFERENCE_SIZE, "components": rows}))
        return
    out = Table(title="components: parameters each adds at vocab 1719, d 128, 4 layers, 4 heads, ctx 128 "
                      "(and per token, where that differs)",
                caption="anatomy components --json for sources and settings in full")
    for col in ("name", "off -> on", "from 2017", "from LLaMA", "about"):
        out.add_column(col, justify="right" if col.startswith("from") else "left",
                       no_wrap=col != "about", overflow="fold")
    for r, c in zip(rows, table_.values()):
        out.add_row(r["name"], change_text(c), _change(r, "2017"), _change(r, "llama"), r["about"])
    console.print(out)


def _change(row: dict, end: str) -> str:
    """'+1,024', or '+1,626,112' over '(active +4,096)' for a part a token uses only some of; '-' for none."""
    total, active = row[f"params_from_{end}"], row[f"active_from_{end}"]
    if total is None:
        return "-"
    return f"{total:+,}" + (f"\n(active {active:+,})" if active != total else "")


def change_text(c) -> str:
    """'norm_type: layernorm -> rmsnorm' (one key), else the settings in full."""
    if len(c.keys) == 1:
        key = c.keys[0]
        off = "(base)" if c.off is None else c.off[key] if c.off[key] != "" else "''"  # gdn_pattern's off
        return f"{key.removeprefix('model.')}: {off} -> {c.on[key]}"
    return f"{c.describe('off')} -> {c.describe('on')}"

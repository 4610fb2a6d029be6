"""Sweep-level commands registered on the main app: ablate and report."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.table import Table

from . import runs
from .cli_app import (EXIT_FAILED, EXIT_INTERRUPTED, JsonOut, RunsDir, StopFlag, app, console, err_console,
                      handle_errors, on_interrupt, safe_dir)
from . import components
from .components import label
from .config import MAX_SEEDS, ConfigError
from .sweep import DEFAULT_SPEC, check_data, load_plan, spec_table

MinEffect = Annotated[Optional[float], typer.Option(
    "--min-effect", min=0.0, help="The smallest gain in best val loss (nats/char) that matters for a call (default: "
    "the noise floor, the reference end's seed-to-seed sd).")]


def fmt_seconds(s: float) -> str:
    return f"{s:.0f}s" if s < 90 else f"{s / 60:.1f}min"


def plan_line(plan, sweep_dir: Path, workers: int, estimate: tuple[dict, float]) -> str:
    """'plan: 36 runs -> runs/demo (to do: 36, est. 24.0min with 2 workers, measured on this machine)'."""
    from .calibrate import busy, plan_seconds

    per_run, startup = estimate
    todo = [p for p in plan if runs.run_status(sweep_dir / p.run_id) not in runs.DONE_STATES]
    est = plan_seconds([per_run[p.run_id] for p in todo], workers, startup) if todo else 0.0
    load = busy()
    note = (f"; the machine is busy now (load average {load[0]:.1f} on {load[1]} cores): expect longer" if load
            else "")
    return (f"plan: {len(plan)} runs -> {sweep_dir}  (to do: {len(todo)}, est. {fmt_seconds(est)} with {workers} "
            f"worker{'s' * (workers > 1)}, from step times measured on this machine{note})")


def plan_table(plan, sweep_dir: Path, workers: int, vocab: dict, estimate: tuple[dict, float]) -> Table:
    statuses = {p.run_id: runs.run_status(sweep_dir / p.run_id) for p in plan}
    table = Table(title=plan_line(plan, sweep_dir, workers, estimate))
    for col in ("run id", "components", "role", "seed", "params", "est.", "status"):
        table.add_column(col, justify="right" if col in ("seed", "params", "est.") else "left")
    for p in plan:
        m = p.config.model
        params = m.model_copy(update={"vocab_size": vocab[p.config.data.source]}).num_params()
        role = f"{p.role}:{p.flip}" if p.flip else p.role
        table.add_row(p.run_id, label(p.config), role, str(p.config.seed), f"{params:,}",
                      fmt_seconds(estimate[0][p.run_id]), statuses[p.run_id] or "pending")
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


class LineDisplay:
    """For a pipe or a log: one plain line per finished run, nothing while runs train."""

    def __init__(self, total: int):
        self.total, self.done, self.failed = total, 0, 0

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        return None

    def __call__(self, e: dict) -> None:
        if e["event"] == "plan" and e["skipped"]:
            self.done = e["skipped"]
            err_console.print(f"{e['skipped']} of {self.total} runs already done", highlight=False)
        elif e["event"] == "done":
            self.done += 1
            summary = e["summary"]
            self.failed += summary.get("status") == runs.FAILED
            best = summary.get("best_val_loss")
            what = (f"best val {best:.4f}" if isinstance(best, float) and summary.get("status") == runs.COMPLETED
                    else summary.get("error") or summary.get("status"))
            took = f", {summary['wall_s']:.0f} s" if isinstance(summary.get("wall_s"), (int, float)) else ""
            err_console.print(f"[{self.done}/{self.total}] {e['run_id']}: {what}{took}", highlight=False,
                              markup=False, soft_wrap=True)


class SweepDisplay:
    """One rich progress display: the sweep's run count plus a bar per run in flight."""

    def __enter__(self):
        self.progress.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.progress.__exit__(*exc)

    def __init__(self, total: int):
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.progress = Progress(TextColumn("{task.description}", markup=False), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("{task.fields[info]}", markup=False), TimeElapsedColumn(),
                                 console=err_console)
        self.sweep = self.progress.add_task("sweep", total=total, info="")
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
    time_rounds: Annotated[int, typer.Option(min=3, help="With --time: rounds (the speed interval is over rounds; a call needs 3).")] = 5,
    device: Annotated[Optional[str], typer.Option(help="auto | cpu | cuda | mps (overrides base.train.device).")] = None,
    compile: Annotated[bool, typer.Option("--compile", help="torch.compile every run (sets base.train.compile).")] = False,
    dtype: Annotated[Optional[str], typer.Option(help="float32 | bfloat16 (overrides base.train.dtype).")] = None,
    min_effect: MinEffect = None,
    stack: Annotated[str, typer.Option(help="auto | off | N: train a config's seeds as one batched model, N seeds per model (auto: where measured faster on this device; runs keep their own folders).")] = "auto",
):
    """Expand a spec into a grid of runs that flip components one at a time, run them, and report.

    On one GPU, --workers N runs N processes at once on it (default: as many as its free memory
    holds at the plan's largest run, at most one per core); compiled graphs are cached once in
    RUNS_DIR/<spec>/.compile-cache for every run of the same shape.
    """
    from .sweep import default_workers, execute

    if steps is not None and steps <= 0:
        raise ConfigError(f"--steps must be > 0, got {steps}")
    if executor not in ("local", "dask"):
        raise ConfigError(f"--executor must be local or dask, got {executor!r}")
    if json_out and not dry_run:
        raise ConfigError("--json prints the plan: use it with --dry-run")
    s, plan = load_plan(spec, flip, seeds, steps, device=device, compile=compile or None, dtype=dtype)
    if device not in (None, "auto", "cpu") and executor == "local":  # here, not in each worker as train.device
        from .devices import resolve_device

        resolve_device(device, "--device")
    sweep_dir = safe_dir(runs_dir) / s.name
    runs.check_placement(sweep_dir, "sweep", "--runs-dir")  # before the plan is shown (execute checks again)
    if json_out:
        console.print_json(json.dumps(plan_json(s, plan, sweep_dir)))
        return
    vocab = check_data(plan)
    per_model = plan_stack(stack, plan, executor)
    n_workers = workers or sweep_workers(plan, vocab, default_workers(-(-len(plan) // per_model)))
    if time_pass and not dry_run:
        _time(plan, sweep_dir, n_workers, time_steps, time_rounds)
        return
    from .sweep import pending_runs, plan_estimate

    estimate = plan_estimate(plan if dry_run else pending_runs(plan, sweep_dir), n_workers, vocab)
    if dry_run:
        console.print(plan_table(plan, sweep_dir, n_workers, vocab, estimate))
        if s.sizes:
            from .cli_scale import size_report

            console.print(f"per size (budget {s.budget}):", highlight=False, markup=False)
            console.print(size_report(plan, n_workers, None)[1], highlight=False, markup=False, soft_wrap=True)
        return
    err_console.print(plan_line(plan, sweep_dir, n_workers, estimate), highlight=False, soft_wrap=True)
    if any(p.config.train.compile for p in plan):  # before the workers spawn: they inherit it
        from .devices import share_compile_cache

        share_compile_cache(sweep_dir, n_workers)
    live = console.is_terminal and err_console.is_terminal  # bars only where someone watches them
    display = SweepDisplay(len(plan)) if live else LineDisplay(len(plan))
    on_interrupt(lambda: "rerun the same command to resume")  # a second signal, wherever it lands
    started = time.monotonic()
    with StopFlag(graceful=executor == "local") as stop, display:
        summaries = execute(plan, sweep_dir, n_workers, display, sweep_name=s.name, executor=executor,
                            address=address, invocation={"spec": None if spec is None else str(spec), "flip": flip,
                                                         "steps": steps}, stop=stop, stack=per_model)
    if stop.requested:
        statuses = [x.get("status") for x in summaries]
        err_console.print(f"interrupted: {statuses.count(runs.COMPLETED)} of {len(plan)} runs completed; rerun "
                          f"the same command to resume", highlight=False)
        raise typer.Exit(EXIT_INTERRUPTED)
    statuses = [x.get("status") for x in summaries]
    lost = statuses.count(runs.INTERRUPTED)  # a worker killed under its run (resumable)
    err_console.print(f"{statuses.count(runs.COMPLETED)} completed, {statuses.count(runs.DIVERGED)} diverged, "
                      f"{statuses.count(runs.FAILED)} failed" + (f", {lost} interrupted (rerun to resume)" if lost else "")
                      + f" of {len(plan)} runs in {sweep_dir}; took {fmt_seconds(time.monotonic() - started)}",
                      highlight=False, soft_wrap=True)
    if not no_report:
        _write_report(sweep_dir, None, ("md", "html", "csv", "json"), min_effect=min_effect)
    if runs.FAILED in statuses or lost:
        raise typer.Exit(EXIT_FAILED)


def _time(plan, sweep_dir: Path, workers: int, steps: int, rounds: int) -> None:
    """The timing pass: rounds of every config in one spawned worker, then the speed effects, judged
    by the report's rule. Works on a sweep with no trained runs (the report then waits for them)."""
    import os

    from . import timing
    from .sections import speed_text
    from .sweep import SweepLock
    from .textable import width

    threads = max(1, (os.cpu_count() or 1) // max(1, workers))  # what each run of the sweep trains with
    sweep_dir.mkdir(parents=True, exist_ok=True)
    n = len({p.slug for p in plan})
    with SweepLock(sweep_dir):
        record = timing.time_plan(plan, steps, rounds, threads=threads, on_round=lambda r, k: err_console.print(
            f"timing {n} configs: round {r}/{k} done", highlight=False))
        path = timing.write_timing(sweep_dir, record)
    console.print(speed_text(record, width()), highlight=False, markup=False, soft_wrap=True)
    console.print(f"timing: {path}", highlight=False, markup=False, soft_wrap=True)
    if runs.find_runs(sweep_dir):
        _write_report(sweep_dir, None, ("md", "html", "csv", "json"))


def plan_stack(choice: str, plan, executor: str) -> int:
    """Seeds per stacked model for this plan (1: alone): --stack on the plan's device; the dask
    executor trains runs one by one."""
    from .sweep import stack_size

    size = stack_size(choice, "cpu")  # refuses a bad value before anything else
    if executor != "local" or choice == "off" or not plan:
        return 1
    if choice == "auto":
        from .devices import resolve_device

        names = {p.config.train.device for p in plan}
        size = stack_size(choice, resolve_device(names.pop() if len(names) == 1 else "auto").type)
    return size


def sweep_workers(plan, vocab: dict, cpu_default: int) -> int:
    """Default parallel runs: one per core on the CPU; on a GPU, from its free memory (devices.py)."""
    names = {p.config.train.device for p in plan}
    if names <= {"cpu"} or not plan:
        return cpu_default
    from .devices import default_workers, resolve_device

    device = resolve_device(names.pop() if len(names) == 1 else "auto")
    return default_workers(device, [p.config for p in plan], vocab, len(plan))


def _write_report(root: Path, out: Path | None, formats: tuple[str, ...], frames=None,
                  min_effect: float | None = None) -> dict:
    """Write the report, then print its answer: the verdict as plain text, and where the report is."""
    from . import report as rep
    from .sections import verdict_text
    from .textable import width
    from .verdict import verdict_frame

    from .scale import scale_frames

    frames = frames or rep.report_frames(root, min_effect)
    paths = rep.write_report(root, out, formats, frames)
    effects = frames[2]
    console.print(verdict_text(verdict_frame(effects[effects["metric"] == rep.LOSS_METRIC]), frames[0], root, width(),
                               scale_frames(*frames)), highlight=False, markup=False, soft_wrap=True)
    main = next((paths[k] for k in ("report.html", "report.md", "report.json", "effects.csv") if k in paths),
                paths["forest.png"])
    console.print(f"report: {main} (all files in {main.parent})", highlight=False, markup=False, soft_wrap=True)
    return paths


@app.command()
@handle_errors
def report(
    runs_dir: Annotated[Path, typer.Argument(help="A sweep directory (or any folder of run directories).")],
    format: Annotated[Optional[list[str]], typer.Option("--format", help="md | csv | html | json (repeatable; default all).")] = None,
    out: Annotated[Optional[Path], typer.Option("--out", help="Output folder (default RUNS_DIR/report).")] = None,
    json_out: JsonOut = False,
    tensorboard: Annotated[bool, typer.Option("--tensorboard", help="Also back-fill TensorBoard event files for runs that have none, from metrics.jsonl (needs the tb extra).")] = False,
    min_effect: MinEffect = None,
    results: Annotated[Optional[Path], typer.Option("--results", help="Also write the study's small results file (effects, calls, ends, budget: what the README's numbers are rendered from) to this path.")] = None,
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
    frames = rep.report_frames(runs_dir, min_effect)  # read once: shown here and written below
    frame, _, effects = frames
    events = tb_events.backfill(runs_dir) if tensorboard else None
    if results is not None:
        from .results import write_results

        write_results(results, runs_dir, frames)
    if json_out:
        paths = rep.write_report(runs_dir, out, formats, frames)
        console.print_json(json.dumps({"runs": rep.records(frame), "effects": rep.records(effects),
                                       "files": {k: str(v) for k, v in paths.items()},
                                       **({"tensorboard": events} if events else {})}))
        return
    console.print(frame_table(frame, ["run_id", "label", "seed", "status", "best_val_loss", "best_step",
                                      "overfit_gap", "tokens_per_s"], "runs"))
    _write_report(runs_dir, out, formats, frames)  # the answer last, where the terminal leaves it
    if results is not None:
        console.print(f"results: {results}", highlight=False, markup=False, soft_wrap=True)
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
    the model, or (a spec's own) cannot be placed at that size (n_head = 3 does not divide d_model 128)."""
    from .config import ModelConfig, validate

    if not any(k.startswith("model.") for k in c.keys):
        return None
    model = REFERENCE_SIZE | components.model_settings(components.FIVE, on=end_on, model=REFERENCE_SIZE)
    flat = components.flatten({"model": model})
    counts = []
    for state in (True, False):
        settings = {k.removeprefix("model."): v for k, v in c.settings(state, flat).items() if k.startswith("model.")}
        try:
            cfg = validate(ModelConfig, model | settings)
        except ConfigError:
            return None
        counts.append((cfg.num_params(), cfg.active_params()))
    return counts[0][0] - counts[1][0], counts[0][1] - counts[1][1]


@app.command("components")
@handle_errors
def components_cmd(
    spec: Annotated[Optional[Path], typer.Argument(help="Also list this spec's own [components.NAME].")] = None,
    json_out: JsonOut = False,
    wide: Annotated[bool, typer.Option("--wide", help="Every column in full, whatever the terminal's width.")] = False,
):
    """The component table: name, off -> on settings, what it changes in parameters, source."""
    from .textable import table, width, wrap

    table_ = dict(components.BY_NAME)
    if spec is not None:  # validated exactly as ablate validates it, plan included
        table_ = spec_table(load_plan(spec)[0])
    rows = []
    for c in table_.values():
        change = {end: param_change(c, end == "llama") for end in ("2017", "llama")}
        rows.append(components.record(c) | {"off_text": c.describe("off"), "on_text": c.describe("on")}
                    | {f"params_from_{end}": d and d[0] for end, d in change.items()}
                    | {f"active_from_{end}": d and d[1] for end, d in change.items()})
    if json_out:
        console.print_json(json.dumps({"reference_size": REFERENCE_SIZE, "components": rows}))
        return
    cells = [[r["name"], change_text(c), _change(r, "2017"), _change(r, "llama"), r["about"], c.source]
             for r, c in zip(rows, table_.values())]
    cols = width() if not wide else None
    text = table(["name", "off -> on", "from 2017", "from LLaMA", "about", "source"], cells, cols,
                 fit=[("drop", "source"), ("drop", "from LLaMA"), ("cut", "about", 20), ("cut", "off -> on", 20),
                      ("drop", "from 2017"), ("drop", "about")], right={"from 2017", "from LLaMA"})
    head = ("components: parameters each adds at vocab 1719, d 128, 4 layers, 4 heads, ctx 128 "
            "(and per token, where that differs)")
    foot = "" if wide else "anatomy components --wide (or --json) for every column in full"
    console.print("\n".join(filter(None, [wrap(head, cols), text, wrap(foot, cols) if foot else ""])),
                  highlight=False, markup=False, soft_wrap=True)


def _change(row: dict, end: str) -> str:
    """'+1,024', or '+1,626,112 (active +4,096)' for a part a token uses only some of; '-' for none."""
    total, active = row[f"params_from_{end}"], row[f"active_from_{end}"]
    if total is None:
        return "-"
    return f"{total:+,}" + (f" (active {active:+,})" if active != total else "")


def change_text(c) -> str:
    """'norm_type: layernorm -> rmsnorm' (one key), else the settings in full."""
    if len(c.keys) == 1:
        key = c.keys[0]
        off = c.off.get(key, "(base)") if c.off else "(base)"
        off = "''" if off == "" else off  # gdn_pattern's off
        return f"{key.removeprefix('model.')}: {off} -> {c.on[key]}"
    return f"{c.describe('off')} -> {c.describe('on')}"

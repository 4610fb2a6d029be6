"""Sweep-level commands registered on the main app: ablate and report."""

from __future__ import annotations

import functools
import json
import sys
import time
from pathlib import Path
from typing import Annotated, Optional

import typer

from anatomy_cli.cli.app import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    JsonOut,
    RunsDir,
    StopFlag,
    app,
    choose,
    console,
    err_console,
    handle_errors,
    on_interrupt,
    safe_dir,
    warn_short_runs,
)
from anatomy_cli.cli.render import (
    LineDisplay,
    SweepDisplay,
    fmt_seconds,
    frame_table,
    plan_json,
    plan_line,
    plan_table,
    sweep_workers,
)
from anatomy_cli.spec import components
from anatomy_cli.spec.config import MAX_SEEDS, ConfigError, DecideSpec
from anatomy_cli.store import runs
from anatomy_cli.sweep.plan import DEFAULT_SPEC, check_data, load_plan, spec_table

MinEffect = Annotated[Optional[float], typer.Option(
    "--min-effect", min=0.0, help="The smallest gain in best val loss (nats/char) that matters for a call, fixed "
    "before the data (default: the spec's min_effect, else 0.02).")]


@app.command()
@handle_errors
def ablate(
    spec: Annotated[Optional[Path], typer.Argument(
        help=f"Ablation spec (TOML); default experiments/{DEFAULT_SPEC}.")] = None,
    flip: Annotated[Optional[str], typer.Option(help="Only these flips, e.g. rope,swiglu.")] = None,
    seeds: Annotated[Optional[int], typer.Option(
        min=1, max=MAX_SEEDS, help="Number of seeds (overrides the spec).")] = None,
    steps: Annotated[Optional[int], typer.Option(help="Training steps per run (overrides the spec).")] = None,
    workers: Annotated[Optional[int], typer.Option(
        min=1, help="Parallel processes (default: one per core; on a GPU, what its memory holds).")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Show the plan and stop.")] = False,
    runs_dir: RunsDir = Path("runs"),
    no_report: Annotated[bool, typer.Option("--no-report", help="Skip writing the report at the end.")] = False,
    executor: Annotated[str, typer.Option(
        help="local (processes on this machine) | dask (an existing cluster).")] = "local",
    address: Annotated[Optional[str], typer.Option(help="Dask scheduler address, e.g. tcp://127.0.0.1:8786.")] = None,
    json_out: Annotated[bool, typer.Option(
        "--json", help="With --dry-run: print the plan as JSON (id, role, seed, resolved config per run).")] = False,
    time_pass: Annotated[bool, typer.Option(
        "--time", help="Instead of training: time every config (one seed) for a few steps, interleaved in rounds in "
        "one idle worker, into SWEEP_DIR/timing.json; the report's speed effects then come from it.")] = False,
    time_steps: Annotated[int, typer.Option(min=1, help="With --time: timed steps per config and round.")] = 20,
    time_rounds: Annotated[int, typer.Option(
        min=3, help="With --time: rounds (the speed interval is over rounds; a call needs 3).")] = 5,
    device: Annotated[Optional[str], typer.Option(
        help="auto | cpu | cuda | mps (overrides base.train.device).")] = None,
    compile: Annotated[bool, typer.Option(
        "--compile", help="torch.compile every run (sets base.train.compile).")] = False,
    dtype: Annotated[Optional[str], typer.Option(help="float32 | bfloat16 (overrides base.train.dtype).")] = None,
    min_effect: MinEffect = None,
    stack: Annotated[str, typer.Option(
        help="auto | off | N: train a config's seeds as one batched model, N seeds per model (auto: where measured "
        "faster on this device; runs keep their own folders).")] = "auto",
    decide: Annotated[bool, typer.Option(
        "--decide", help="Train in rounds: after each, add --decide-step seeds only to the configs whose effects are "
        "still undecided, until every effect is decided, --max-seeds or --budget is reached (alpha split over the "
        "planned rounds). A spec with a [decide] table does this by default.")] = False,
    max_seeds: Annotated[Optional[int], typer.Option(
        min=2, max=MAX_SEEDS, help="With --decide: the most seeds a config gets \\[default: the spec's, else 10].",
        show_default=False)] = None,
    decide_step: Annotated[Optional[int], typer.Option(
        min=1, max=MAX_SEEDS, help="With --decide: seeds added a round \\[default: the spec's, else 2].",
        show_default=False)] = None,
    budget: Annotated[Optional[str], typer.Option(
        help="With --decide: stop before a round that would overrun this time (30m, 2h, 600 = seconds).")] = None,
):
    """Expand a spec into a grid of runs that flip components one at a time, run them, and report.

    On one GPU, --workers N runs N processes at once on it (default: as many as its free memory
    holds at the plan's largest run, at most one per core); compiled graphs are cached once in
    RUNS_DIR/<spec>/.compile-cache for every run of the same shape.
    """
    from anatomy_cli.report import decide as decide_mod
    from anatomy_cli.sweep.plan import default_workers

    if steps is not None and steps <= 0:
        raise ConfigError(f"--steps must be > 0, got {steps}")
    choose(executor, "--executor", EXECUTORS)
    parse_stack(stack)
    if json_out and not dry_run:
        raise ConfigError("--json prints the plan: use it with --dry-run")
    if decide and time_pass:
        raise ConfigError("--decide trains; --time times: run them one after the other")
    budget_s = decide_mod.parse_budget(budget)
    s, plan = load_plan(spec, flip, seeds, steps, device=device, compile=compile or None, dtype=dtype)
    decide = (decide or s.decide is not None) and not time_pass  # a spec's [decide] rounds; --time times
    if not decide and (max_seeds is not None or budget is not None or decide_step is not None):
        raise ConfigError("--max-seeds, --decide-step and --budget plan the rounds of --decide: add --decide")
    if decide:
        plan_of = s.decide or DecideSpec()
        budget = budget if budget is not None else plan_of.budget
        budget_s = decide_mod.parse_budget(budget)
        max_seeds = max_seeds if max_seeds is not None else (plan_of.max_seeds if s.decide else None)
        decide_step = decide_step if decide_step is not None else plan_of.step
    looks = decide_looks(s, seeds, max_seeds, decide_step) if decide else None
    if device not in (None, "auto", "cpu") and executor == "local":  # here, not in each worker as train.device
        from anatomy_cli.training.devices import resolve_device

        resolve_device(device, "--device")
    sweep_dir = safe_dir(runs_dir) / s.name
    # before the plan is shown (execute checks again)
    runs.refuse_inside_runs(sweep_dir, "--runs-dir", "sweep directory", itself="sweep")
    if json_out:
        warn_short_runs(p.config for p in plan)
        console.print_json(json.dumps(plan_json(s, plan, sweep_dir)))
        return
    vocab = check_data(plan)
    per_model = plan_stack(stack, plan, executor)
    n_workers = workers or sweep_workers(plan, vocab, default_workers(-(-len(plan) // per_model)))
    if time_pass and not dry_run:
        _time(plan, sweep_dir, n_workers, time_steps, time_rounds)
        return
    warn_short_runs(p.config for p in plan)  # after every refusal: a warning never precedes an error
    from anatomy_cli.sweep.plan import pending_runs, plan_estimate

    estimate = plan_estimate(plan if dry_run else pending_runs(plan, sweep_dir), n_workers, vocab)
    if dry_run:
        console.print(plan_table(plan, sweep_dir, n_workers, vocab, estimate))
        if looks:
            console.print(f"--decide: looks at {', '.join(map(str, looks))} seeds, each at family-wise alpha "
                          f"{decide_mod.alpha(looks):.4g}; this table is the first round", highlight=False)
        if runs.find_runs(sweep_dir):  # earlier runs of the study: the power they give, and what more would cost
            from anatomy_cli.report import effects as effects_mod
            from anatomy_cli.report.verdict import power_lines

            found = effects_mod.report_frames(sweep_dir, min_effect if min_effect is not None else s.min_effect)
            for line in power_lines(sweep_dir, found[0], found[2]):
                console.print(f"power: {line}", highlight=False, soft_wrap=True)
        if s.sizes:
            from anatomy_cli.cli.render import size_report

            console.print(f"per size (budget {s.budget}):", highlight=False, markup=False)
            console.print(size_report(plan, n_workers, None)[1], highlight=False, markup=False, soft_wrap=True)
        return
    err_console.print(plan_line(plan, sweep_dir, n_workers, estimate), highlight=False, soft_wrap=True)
    if any(p.config.train.compile for p in plan):  # before the workers spawn: they inherit it
        from anatomy_cli.training.devices import share_compile_cache

        share_compile_cache(sweep_dir, n_workers)
    on_interrupt(lambda: "rerun the same command to resume")  # a second signal, wherever it lands
    started = time.monotonic()
    min_effect = min_effect if min_effect is not None else s.min_effect
    invocation = {"spec": None if spec is None else str(spec), "flip": flip, "steps": steps}
    if min_effect is not None:  # the report of this folder reads it from sweep.json
        invocation["min_effect"] = min_effect
    train = functools.partial(_train, sweep_dir=sweep_dir, workers=n_workers, name=s.name, executor=executor,
                              address=address, invocation=invocation, stack=per_model)
    if looks:
        def cost(todo) -> float:  # the dry-run's estimate of a round: this machine's calibrated step times
            from anatomy_cli.sweep.calibrate import plan_seconds

            per_run, startup = plan_estimate(todo, n_workers, vocab)
            return plan_seconds(list(per_run.values()), n_workers, startup) if todo else 0.0

        statuses = _decide(s, plan, looks, train, sweep_dir, min_effect, budget_s, budget,
                           lambda n: load_plan(spec, flip, n, steps, device=device, compile=compile or None,
                                               dtype=dtype)[1], cost)
    else:
        statuses = train(plan)
    lost = statuses.count(runs.INTERRUPTED)  # a worker killed under its run (resumable)
    err_console.print(f"{statuses.count(runs.COMPLETED)} completed, {statuses.count(runs.DIVERGED)} diverged, "
                      f"{statuses.count(runs.FAILED)} failed"
                      + (f", {lost} interrupted (rerun to resume)" if lost else "")
                      + f" of {len(statuses)} runs in {sweep_dir}; took {fmt_seconds(time.monotonic() - started)}",
                      highlight=False, soft_wrap=True)
    if not no_report:
        others = len(runs.find_runs(sweep_dir)) - len(statuses)
        if others > 0:  # the report reads the folder: say its verdict covers more than this plan
            err_console.print(f"note: the report covers every run in {sweep_dir}: this plan's {len(statuses)} and "
                              f"{others} more from earlier plans (for this plan alone, give --runs-dir another "
                              f"folder)", highlight=False, soft_wrap=True)
        _write_report(sweep_dir, None, ("md", "html", "csv", "json"), min_effect=min_effect)
    if runs.FAILED in statuses or lost:
        raise typer.Exit(EXIT_FAILED)


def _train(plan, sweep_dir: Path, workers: int, name: str, executor: str, address: str | None, invocation: dict,
           stack: int) -> list[str | None]:
    """Train a plan's pending runs (with bars on a terminal, lines elsewhere); the status of each run of
    the plan. A stop signal saves the runs in flight and exits 130 (a rerun resumes)."""
    from anatomy_cli.sweep.plan import execute

    live = console.is_terminal and err_console.is_terminal  # bars only where someone watches them
    display = SweepDisplay(len(plan)) if live else LineDisplay(len(plan))
    with StopFlag(graceful=executor == "local") as stop, display:
        summaries = execute(plan, sweep_dir, workers, display, sweep_name=name, executor=executor,
                            address=address, invocation=invocation, stop=stop, stack=stack)
    statuses = [x.get("status") for x in summaries]
    if stop.requested:
        err_console.print(f"interrupted: {statuses.count(runs.COMPLETED)} of {len(plan)} runs completed; rerun "
                          f"the same command to resume", highlight=False)
        raise typer.Exit(EXIT_INTERRUPTED)
    return statuses


def decide_looks(s, seeds: int | None, max_seeds: int | None, step: int) -> list[int]:
    """The seed counts --decide looks at, from the study's first count (--seeds, else the spec's)."""
    from anatomy_cli.report import decide as decide_mod

    if seeds is None and not isinstance(s.seeds, int):
        raise ConfigError("--decide adds seeds by count: give the spec's seeds as a count, or --seeds N")
    first = seeds or s.seeds
    return decide_mod.schedule(first, max_seeds if max_seeds is not None else max(decide_mod.MAX_SEEDS, first), step)


def _decide(s, plan, looks: list[int], train, sweep_dir: Path, min_effect: float | None, budget_s: float | None,
            budget: str | None, plan_at, cost) -> list[str | None]:
    """--decide: train the first round (`plan`), then at each planned look judge the effects on the
    look's seeds (the runs of its plan at n seeds) at the looks' alpha and give the next round's seeds only to the
    configs of open effects. decide.json records the plan and each round; the statuses of every run
    trained or found, for the closing line."""
    from anatomy_cli.report import decide as decide_mod
    from anatomy_cli.report import effects as effects_mod
    from anatomy_cli.report.frames import load_runs
    from anatomy_cli.sweep.plan import pending_runs

    record = decide_mod.read_record(sweep_dir)
    if record is not None and record.looks != looks:
        raise ConfigError(f"{sweep_dir} was decided with looks at {', '.join(map(str, record.looks))} seeds: rerun "
                          f"with the same --seeds, --max-seeds and --decide-step, or use another --runs-dir (a new "
                          f"plan after seeing the data would spend its alpha twice)")
    alpha = decide_mod.alpha(looks)
    record = decide_mod.DecideRecord(looks=looks, alpha=alpha)
    started, statuses, todo, full = time.monotonic(), {}, plan, plan  # full: every config at this look's seeds
    for k, n in enumerate(looks):
        began, pending = time.monotonic(), len(pending_runs(todo, sweep_dir))
        statuses |= dict(zip((p.run_id for p in todo), train(todo)))
        decide_mod.write_record(sweep_dir, record)  # the plan, before the look: a report from here on knows alpha
        ids = {p.run_id: p.slug for p in full}
        runs_k = load_runs(sweep_dir)[0]
        runs_k = runs_k[runs_k["run_id"].isin(ids)]
        effects = effects_mod.component_effects(runs_k, min_effect=min_effect, alpha=alpha)
        still, hopeless = decide_mod.open_effects(effects), decide_mod.futile(effects, looks[-1])
        round_s = time.monotonic() - began
        record = record.model_copy(update={"rounds": [*record.rounds, {
            "seeds": n, "trained": len(todo), "seconds": round(round_s, 1), "open": decide_mod.names(still),
            "futile": decide_mod.names(hopeless) if k < len(looks) - 1 else []}]})
        if still.empty:
            stopped = "every effect decided"
        elif k == len(looks) - 1:
            stopped = f"the seed cap ({n}) reached with {len(still)} effect{'s' * (len(still) > 1)} open"
        elif len(hopeless) == len(still):
            stopped = (f"{len(still)} effect{'s' * (len(still) > 1)} open, none of which {looks[-1]} seeds would "
                       f"decide at the noise measured")
        else:
            grouped = effects_mod.groups(runs_k[runs_k["role"] != ""])
            slugs = {ids[r] for r in decide_mod.open_runs(grouped, effects, cap=looks[-1])}
            full = plan_at(looks[k + 1])  # planned once per look: this round's work and the next look's runs
            todo = [p for p in full if p.slug in slugs and p.run_id not in ids]
            ahead = pending_runs(todo, sweep_dir)
            # the next round's time: at the pace of the runs this round trained, else (every run was found
            # done: a resumed study) the dry-run's estimate from this machine's calibrated step times
            need = round_s / pending * len(ahead) if pending else cost(ahead)
            if budget_s is not None and time.monotonic() - started + need > budget_s:
                stopped = f"the budget ({budget}) would be overrun by the next round"
            else:
                spare = f" ({len(hopeless)} of them futile: no more seeds)" if len(hopeless) else ""
                err_console.print(f"--decide: {len(still)} effect{'s' * (len(still) > 1)} open at {n} seeds{spare}; "
                                  f"round {k + 2} trains {len(todo)} runs at {looks[k + 1]} seeds", highlight=False)
                continue
        break
    record = record.model_copy(update={"stopped": stopped})
    decide_mod.write_record(sweep_dir, record)
    err_console.print(decide_mod.stop_text(record), highlight=False, soft_wrap=True)
    return list(statuses.values())


def _time(plan, sweep_dir: Path, workers: int, steps: int, rounds: int) -> None:
    """The timing pass: rounds of every config in one spawned worker, then the speed effects, judged
    by the report's rule. Works on a sweep with no trained runs (the report then waits for them)."""
    import os

    from anatomy_cli.report.sections import speed_text
    from anatomy_cli.report.textable import width
    from anatomy_cli.sweep import timing
    from anatomy_cli.sweep.plan import SweepLock

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


EXECUTORS = ("local", "dask")


def parse_stack(text: str) -> str:
    """--stack as typed, refused in one line unless auto, off or a count of seeds in ASCII digits, 1 or
    more ('²' is a digit to str.isdigit but not to int(), which raised)."""
    if text in ("auto", "off") or (text.isascii() and text.isdigit() and int(text) >= 1):
        return text
    raise ConfigError(f"--stack must be auto, off or a number of seeds per model (1 or more), got {text!r}")


def plan_stack(choice: str, plan, executor: str) -> int:
    """Seeds per stacked model for this plan (1: alone): --stack on the plan's device; the dask
    executor trains runs one by one."""
    from anatomy_cli.sweep.plan import stack_size

    size = stack_size(choice, "cpu")  # refuses a bad value before anything else
    if executor != "local" or choice == "off" or not plan:
        return 1
    if choice == "auto":
        from anatomy_cli.training.devices import resolve_device

        names = {p.config.train.device for p in plan}
        size = stack_size(choice, resolve_device(names.pop() if len(names) == 1 else "auto").type)
    return size


def _write_report(root: Path, out: Path | None, formats: tuple[str, ...], frames=None,
                  min_effect: float | None = None) -> dict:
    """Write the report, then print its answer: the verdict as plain text, and where the report is."""
    from anatomy_cli.report import effects as effects_mod
    from anatomy_cli.report import frames as frames_mod
    from anatomy_cli.report import write
    from anatomy_cli.report.scale import scale_frames
    from anatomy_cli.report.sections import verdict_text
    from anatomy_cli.report.textable import width
    from anatomy_cli.report.verdict import verdict_frame

    frames = frames or effects_mod.report_frames(root, min_effect)
    paths = write.write_report(root, out, formats, frames)
    effects = frames[2]
    console.print(verdict_text(verdict_frame(effects[effects["metric"] == frames_mod.LOSS_METRIC]), frames[0], root,
                               width(), scale_frames(*frames)), highlight=False, markup=False, soft_wrap=True)
    main = next((paths[k] for k in ("report.html", "report.md", "report.json", "effects.csv") if k in paths),
                paths["forest.png"])
    console.print(f"report: {main} (all files in {main.parent})", highlight=False, markup=False, soft_wrap=True)
    return paths


@app.command()
@handle_errors
def report(
    runs_dir: Annotated[Path, typer.Argument(help="A sweep directory (or any folder of run directories).")],
    format: Annotated[Optional[list[str]], typer.Option(
        "--format", help="md | csv | html | json (repeatable; default all).")] = None,
    out: Annotated[Optional[Path], typer.Option("--out", help="Output folder (default RUNS_DIR/report).")] = None,
    json_out: JsonOut = False,
    tensorboard: Annotated[bool, typer.Option(
        "--tensorboard", help="Also back-fill TensorBoard event files for runs that have none, from metrics.jsonl "
        "(needs the tb extra).")] = False,
    min_effect: MinEffect = None,
    results: Annotated[Optional[Path], typer.Option(  # path_type=str: as typed, so a trailing '/' (a folder) shows
        "--results", path_type=str, help="Also write the study's small results file (effects, calls, ends, budget: "
        "what the README's numbers are rendered from) to this path.")] = None,
):
    """Turn run directories into comparison tables, component effects with CIs, and figures."""
    from anatomy_cli.report import effects as effects_mod
    from anatomy_cli.report import write
    from anatomy_cli.training import tensorboard as tb_events

    if tensorboard:
        tb_events.require()

    formats = tuple(format or write.FORMATS)
    bad = [f for f in formats if f not in write.FORMATS]
    if bad:
        raise ConfigError(f"unknown --format {', '.join(bad)}; choose from {', '.join(write.FORMATS)}")
    if not runs_dir.exists():
        raise runs.RunError(f"runs directory not found: {runs_dir}")
    check_report_paths(runs_dir, out, results)  # before anything is written (issue #30)
    frames = effects_mod.report_frames(runs_dir, min_effect)  # read once: shown here and written below
    frame, _, effects = frames
    events = tb_events.backfill(runs_dir) if tensorboard else None
    if results is not None:
        from anatomy_cli.report.results import write_results

        write_results(Path(results), runs_dir, frames)
    if json_out:  # exactly report.json's document (the files are in the report folder)
        paths = write.write_report(runs_dir, out, formats, frames)
        text = (paths["report.json"].read_text() if "report.json" in paths
                else write.json_text(write.report_document(runs_dir, frames)))
        sys.stdout.write(text)
        sys.stdout.flush()
        if events is not None:  # not part of the document: said on stderr
            err_console.print(f"tensorboard: event files written for {events['written']} runs", highlight=False)
        return
    console.print(frame_table(frame, ["run_id", "label", "seed", "status", "best_val_loss", "best_step",
                                      "overfit_gap", "tokens_per_s"], "runs"))
    _write_report(runs_dir, out, formats, frames)  # the answer last, where the terminal leaves it
    if results is not None:
        console.print(f"results: {results}", highlight=False, markup=False, soft_wrap=True)
    if events is not None:
        console.print(f"tensorboard: event files written for {events['written']} runs ({events['skipped']} had their "
                      f"own); view with: tensorboard --logdir {runs_dir}", highlight=False)


def check_report_paths(root: Path, out: Path | None, results: str | Path | None) -> None:
    """Where `report ROOT` may write: its folder (--out) not in a run or a sweep unless it is ROOT/report,
    its own, and not a folder of someone's files named as its own; --results not in a run or a sweep
    (ROOT/report aside), nor a folder, nor an existing file other than a results file, nor one of the
    report's own files in its folder (it would be written over)."""
    from anatomy_cli.report import write
    from anatomy_cli.report.results import is_results

    own = root / "report"
    folder = out if out is not None else own
    runs.refuse_inside_runs(folder, "--out", "report folder", own=own)
    runs.refuse_foreign(folder, "--out", "report folder", write.is_report, write.FILES.__contains__)
    if results is None:
        return
    path = Path(results)
    runs.refuse_inside_runs(path, "--results", "results file", own=own)
    runs.refuse_replacing(path, "--results", "results file", is_results, given=str(results))
    if path.name in write.FILES and path.resolve().parent == folder.resolve():
        raise runs.RunError(f"{results} is the report's own {path.name}, which the report would write over; choose "
                            f"another --results")


# Published reference size (README): the counts `anatomy components` reports changes against.
REFERENCE_SIZE = {"vocab_size": 1719, "d_model": 128, "n_layer": 4, "n_head": 4, "n_kv_head": 4, "ctx_len": 128}


def param_change(c, end_on: bool) -> tuple[int, int] | None:
    """(total, active per token) parameters the component adds (negative: removes) at the published
    size, from the 2017 end (end_on False) or the LLaMA end; None for a component that does not touch
    the model, or (a spec's own) cannot be placed at that size (n_head = 3 does not divide d_model 128)."""
    from anatomy_cli.spec.config import ModelConfig, validate

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
    from anatomy_cli.report.textable import table, width, wrap

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
                 fit=[("drop", "source"), ("drop", "from LLaMA"), ("cut", "off -> on", 32), ("cut", "about", 30),
                      ("cut", "off -> on", 20), ("cut", "about", 20), ("drop", "from 2017"), ("drop", "about")],
                 right={"from 2017", "from LLaMA"})
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

"""Sweep-level commands registered on the main app: ablate and report."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Annotated, Optional

import typer

from anatomy_cli.cli.app import (
    ALIAS_CONTEXT,
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    JsonOut,
    RunsDir,
    StopFlag,
    StudySets,
    app,
    console,
    err_console,
    handle_errors,
    on_interrupt,
    warn,
    warn_short_runs,
    write_out,
)
from anatomy_cli.cli.render import (
    LineDisplay,
    SweepDisplay,
    fmt_seconds,
    frame_table,
    plan_json,
    plan_line,
    plan_table,
    size_report,
)
from anatomy_cli.spec import knobs
from anatomy_cli.spec.config import ConfigError
from anatomy_cli.store import runs
from anatomy_cli.sweep.plan import DEFAULT_SPEC

Margin = Annotated[Optional[float], typer.Option(
    "--margin", "--min-effect", help="Judge the loss effects at this margin (bits/byte) instead of the study's: a view "
    "of the same runs, written beside the study's report.")]


ABLATE_HELP = (f"SPEC: the ablation spec (TOML); default experiments/{DEFAULT_SPEC}.\n\nEvery other knob is a key "
               "of the study spec, set with --set KEY=VALUE: " + ", ".join(k for k in knobs.study_keys()
                                                                           if not k.startswith("base."))
               + ", and base.SECTION.KEY (the run settings, as `anatomy train --set` names them). These flags are "
               "aliases of such keys:\n\n" + knobs.alias_help().replace("[", "\\["))


@app.command(context_settings=ALIAS_CONTEXT, options_metavar="[SPEC] [OPTIONS]", epilog=ABLATE_HELP)
@handle_errors
def ablate(
    ctx: typer.Context,
    sets: StudySets = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Show the plan and stop.")] = False,
    json_out: Annotated[bool, typer.Option(
        "--json", help="With --dry-run: print the plan as JSON (id, role, seed, resolved config per run).")] = False,
    time_pass: Annotated[bool, typer.Option(
        "--time", help="Instead of training: time every config (one seed) for a few steps (\\[timing] steps, rounds), "
        "interleaved in rounds in one idle worker, into SWEEP_DIR/timing.json; the report's speed effects then "
        "come from it.")] = False,
    decide: Annotated[bool, typer.Option(
        "--decide", help="Train in rounds (the spec's \\[decide] table, at its defaults if it has none): after each, "
        "more seeds only for the configs whose effects are still open.")] = False,
    tune_lr: Annotated[bool, typer.Option(
        "--tune-lr", help="Fair learning rates (the spec's \\[tune] table, at its defaults if it has none): each "
        "config's LR chosen on a grid on selection seeds of its own, frozen in tune.json, then the study.")] = False,
    runs_dir: RunsDir = Path("runs"),
    workers: Annotated[Optional[int], typer.Option(
        min=1, help="Parallel processes (default: one per core; on a GPU, what its memory holds).")] = None,
    executor: Annotated[str, typer.Option(
        help="local (processes on this machine) | dask (an existing cluster).")] = "local",
    address: Annotated[Optional[str], typer.Option(help="Dask scheduler address, e.g. tcp://127.0.0.1:8786.")] = None,
    stack: Annotated[str, typer.Option(
        help="auto | off | N: train a config's seeds as one batched model, N seeds per model (auto: where measured "
        "faster on this device; runs keep their own folders).")] = "auto",
    no_report: Annotated[bool, typer.Option("--no-report", help="Skip writing the report at the end.")] = False,
):
    """Expand a spec into a grid of runs that flip components one at a time, run them, and report.

    On one GPU, --workers N runs N processes at once on it (default: as many as its free memory
    holds at the plan's largest run, at most one per core); compiled graphs are cached once in
    RUNS_DIR/<spec>/.compile-cache for every run of the same shape.
    """
    from anatomy_cli.study import ablation

    if json_out and not dry_run:
        raise ConfigError("--json prints the plan: use it with --dry-run")
    args, settings = knobs.read_args(ctx.args)
    if len(args) > 1:
        raise ConfigError(f"ablate takes one SPEC, got {len(args)}: {' '.join(args)}")
    spec = Path(args[0]) if args else None
    study = ablation.plan_study(ablation.Ask(
        spec=spec, settings=(*settings, *map(knobs.parse_set, sets or ())), decide=decide, tune_lr=tune_lr,
        time_pass=time_pass, runs_dir=runs_dir, workers=workers, executor=executor, address=address, stack=stack))
    if json_out:
        warn_short_runs(p.config for p in study.plan)
        console.print_json(json.dumps(plan_json(study.spec, study.plan, study.sweep_dir, study.rounds)))
        return
    study = ablation.size_study(study)
    if time_pass and not dry_run:
        return _time(study.plan, study.sweep_dir, study.workers, study.spec.timing)
    warn_short_runs(p.config for p in study.plan)  # after every refusal: a warning never precedes an error
    estimate = ablation.estimate(study, study.plan if dry_run else None, say=_say)  # a fresh machine measures first
    if dry_run:
        return _dry_run(study, estimate)
    done = _run(study, estimate)
    if not no_report and (study.tune is None or any(a.tuned for a in getattr(done.tune, "arms", []))):
        others = len(runs.find_runs(study.sweep_dir)) - len(done.statuses)
        if others > 0:  # the report reads the folder: say its verdict covers more than this plan
            err_console.print(scope_note(study.sweep_dir, len(done.statuses), others), highlight=False, soft_wrap=True)
        from anatomy_cli.report.build import build_report

        _write_report(build_report(study.sweep_dir), None, ("md", "html", "csv", "json"))
    if done.count(runs.FAILED) or done.count(runs.INTERRUPTED) or done.count(None):
        raise typer.Exit(EXIT_FAILED)


def _run(study, estimate):
    """Train the study (its plan line first; the compile cache shared; a second signal says how to resume) and
    say how it went; a tuned study whose selection tuned no config says so (its report is skipped)."""
    from anatomy_cli.study import ablation, lr_study

    err_console.print(plan_line(study.plan, study.sweep_dir, study.workers, estimate, decide_more(study)),
                      highlight=False, soft_wrap=True)
    if study.tune is not None:
        _say(tune_line(study))
    if any(p.config.train.compile for p in study.plan):  # before the workers spawn: they inherit it
        from anatomy_cli.training.devices import share_compile_cache

        share_compile_cache(study.sweep_dir, study.workers)
    on_interrupt(lambda: "rerun the same command to resume")  # a second signal, wherever it lands
    done = ablation.run_study(study, functools.partial(_train, study, estimate),
                              lambda line: err_console.print(line, highlight=False, soft_wrap=True),
                              price=lambda todo: ablation.round_seconds(study, todo))
    err_console.print(closing_line(done, study.sweep_dir), highlight=False, soft_wrap=True)
    untuned = lr_study.untuned_line(done.tune) if study.tune is not None and done.tune is not None else None
    if untuned:
        err_console.print(untuned, highlight=False, soft_wrap=True)
    return done


def decide_more(study) -> tuple[int, int] | None:
    """(the runs --decide's later looks may add at most, the seeds of its last look); None without rounds."""
    if not study.rounds:
        return None
    last = max(study.rounds.looks)
    return len(study.plan_at(last)) - len(study.plan), last


def _dry_run(study, estimate) -> None:
    """--dry-run: the plan table, the looks of --decide, the power earlier runs give, the sizes."""
    from anatomy_cli.report import decide as decide_mod

    console.print(plan_table(study.plan, study.sweep_dir, study.workers, study.vocab, estimate, decide_more(study)))
    if study.tune is not None:
        from anatomy_cli.report.textable import wrap

        console.print(wrap(tune_line(study), console.width), highlight=False, markup=False, soft_wrap=True)
    if study.rounds:
        looks = study.rounds.looks
        alphas = study.rounds.alphas
        console.print(f"--decide: looks at {', '.join(map(str, looks))} seeds, "
                      f"{'each at ' if len(set(alphas)) <= 1 else ''}family-wise alpha "
                      f"{decide_mod.alphas_text(alphas)}; this table is the first round", highlight=False)
        if study.tune is None:  # a tuned study's first round trains after its selection, at LRs not chosen yet
            from anatomy_cli.study.ablation import round_seconds
            from anatomy_cli.study.rounds import budget_note
            from anatomy_cli.sweep.plan import pending_runs

            note = budget_note(study.rounds, round_seconds(study, pending_runs(study.plan, study.sweep_dir)))
            if note:
                warn(note)
    if runs.find_runs(study.sweep_dir):  # earlier runs of the study: the power they give, and what more would cost
        from anatomy_cli.report.build import build_report
        from anatomy_cli.report.verdict import power_lines

        found = build_report(study.sweep_dir, study.margin)
        flips = {p.flip for p in study.plan if p.flip}  # the plan's own effects, not every one the folder holds
        for line in power_lines(found.runs, found.effects, flips or None):
            console.print(f"power: {line}", highlight=False, soft_wrap=True)
    if study.spec.sizes:
        console.print(f"per size (budget {study.spec.budget}):", highlight=False, markup=False)
        console.print(size_report(study.plan, study.workers, None)[1], highlight=False, markup=False,
                      soft_wrap=True)


def tune_line(study) -> str:
    """--tune-lr's two phases priced apart: '--tune-lr: first the LR selection, 60 runs (5 LRs x 12 configs x 1
    selection seed: 1336; to do: 60, est. 9.0min), up to 24 more past an edge (est. 3.6min); then the study at the
    frozen LRs, 36 runs (the table), and beside it up to 36 at the shared LR (est. 5.4min)'; with shared off,
    '..., and no run at the shared LR 0.001 beside it (the shared-LR comparison is off)'."""
    from anatomy_cli.study import ablation
    from anatomy_cli.study.lr_study import arms

    cost, g = ablation.tune_cost(study), study.tune.grid
    seeds = ", ".join(map(str, g.seeds))
    n_arms = len(arms(study.plan))
    head = (f"--tune-lr: first the LR selection, {cost.grid[0]} runs ({g.points} LRs a factor {g.factor:g} apart "
            f"around {g.center:g} x {n_arms} config{'s' * (n_arms > 1)} x {len(g.seeds)} selection "
            f"seed{'s' * (len(g.seeds) > 1)}: {seeds}; to do: {cost.grid[1]}, est. {fmt_seconds(cost.grid[2])})")
    extra = (f", {cost.extensions[0]} more past an edge" if cost.chosen else
             f", up to {cost.extensions[0]} more past an edge (est. {fmt_seconds(cost.extensions[1])})")
    at = "at the frozen LRs" if cost.chosen else "at the LRs chosen"
    shared = (f"{cost.shared[0]}" if cost.chosen else f"up to {cost.shared[0]}")
    beside = (f"beside it {shared} at the shared LR {g.center:g} where a config's LR moved (est. "
              f"{'' if cost.chosen else 'at most '}{fmt_seconds(cost.shared[1])})" if study.tune.shared else
              f"no run at the shared LR {g.center:g} beside it (the shared-LR comparison is off)")
    return (f"{head}{extra}; then the study {at}, {cost.study[0]} runs (to do: {cost.study[1]}, est. "
            f"{fmt_seconds(cost.study[2])}), and {beside}")


def scope_note(sweep_dir: Path, planned: int, others: int) -> str:
    return (f"note: the report covers every run in {sweep_dir}: this plan's {planned} and {others} more from earlier "
            f"plans (for this plan alone, give --runs-dir another folder)")


def closing_line(done, sweep_dir: Path) -> str:
    """'36 completed, 0 diverged, 0 failed of 36 runs in runs/demo; took 9.5min' (and the interrupted and
    never started: every run of the plan is counted)."""
    lost = done.count(runs.INTERRUPTED)  # a worker killed under its run (resumable)
    idle = len(done.statuses) - sum(map(done.count, (runs.COMPLETED, runs.DIVERGED, runs.FAILED, runs.INTERRUPTED)))
    return (f"{done.count(runs.COMPLETED)} completed, {done.count(runs.DIVERGED)} diverged, "
            f"{done.count(runs.FAILED)} failed" + (f", {lost} interrupted (rerun to resume)" if lost else "")
            + (f", {idle} never started (rerun to train them)" if idle else "")
            + f" of {len(done.statuses)} runs in {sweep_dir}; took {fmt_seconds(done.seconds)}")


def _say(line: str) -> None:
    """A line on stderr, wrapped to the width the plan table below it is fitted to (what is measured before
    the plan line)."""
    from anatomy_cli.report.textable import wrap

    err_console.print(wrap(line, console.width), highlight=False, markup=False, soft_wrap=True)


def _train(study, estimate, todo) -> list[str | None]:
    """Train a plan's pending runs (with bars on a terminal, lines elsewhere, a line a minute at least);
    the status of each run of the plan. A stop signal saves the runs in flight and exits 130 (a rerun
    resumes). estimate: the plan line's ({run id: seconds}, start-up), for the lines' est. left."""
    from anatomy_cli.study.ablation import train_runs
    from anatomy_cli.sweep.calibrate import plan_seconds
    from anatomy_cli.sweep.plan import pending_runs

    live = console.is_terminal and err_console.is_terminal  # bars only where someone watches them
    per_run, startup = estimate
    pending = [per_run.get(p.run_id) for p in pending_runs(todo, study.sweep_dir)]
    planned = plan_seconds(pending, study.workers, startup) if None not in pending else None  # a later round: none
    display = SweepDisplay(len(todo)) if live else LineDisplay(len(todo), planned_s=planned)
    with StopFlag(graceful=study.ask.executor == "local") as stop, display:
        statuses = train_runs(study, todo, display, stop)
    if stop.requested:
        err_console.print(f"interrupted: {statuses.count(runs.COMPLETED)} of {len(todo)} runs completed; rerun "
                          f"the same command to resume", highlight=False)
        raise typer.Exit(EXIT_INTERRUPTED)
    return statuses


def _time(plan, sweep_dir: Path, workers: int, table) -> None:
    """The timing pass: rounds of every config in one spawned worker ([timing] steps and rounds: `table`),
    then the speed effects, judged by the report's rule. Works on a sweep with no trained runs (the report
    then waits for them)."""
    import os

    from anatomy_cli.report.build import build_report
    from anatomy_cli.report.sections import speed_text
    from anatomy_cli.report.textable import width
    from anatomy_cli.store.records import write_timing
    from anatomy_cli.sweep import timing
    from anatomy_cli.sweep.plan import SweepLock

    threads = max(1, (os.cpu_count() or 1) // max(1, workers))  # what each run of the sweep trains with
    sweep_dir.mkdir(parents=True, exist_ok=True)
    n = len({p.slug for p in plan})
    with SweepLock(sweep_dir):
        record = timing.time_plan(plan, table.steps, table.rounds, threads=threads,
                                  on_round=lambda r, k: err_console.print(f"timing {n} configs: round {r}/{k} done",
                                                                          highlight=False))
        path = write_timing(sweep_dir, record)
    console.print(speed_text(record, width()), highlight=False, markup=False, soft_wrap=True)
    console.print(f"timing: {path}", highlight=False, markup=False, soft_wrap=True)
    if runs.find_runs(sweep_dir):
        _write_report(build_report(sweep_dir), None, ("md", "html", "csv", "json"))


def _write_report(r, out: Path | None, formats: tuple[str, ...]) -> dict:
    """Write a Report's files (report.build's), then print its answer: the verdict as plain text, and where the
    report is."""
    from anatomy_cli.report import lr_comparison, write
    from anatomy_cli.report.sections import verdict_text
    from anatomy_cli.report.textable import width, wrap

    paths = write.write_report(r, out, formats)
    console.print(verdict_text(r, width()), highlight=False, markup=False, soft_wrap=True)
    if r.tuning is not None:  # a tuned study: its LRs and what the shared LR would call
        console.print("\n".join(wrap(line, width()) for line in lr_comparison.lines(r.tuning)), highlight=False,
                      markup=False, soft_wrap=True)
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
    margin: Margin = None,
    results: Annotated[Optional[Path], typer.Option(  # path_type=str: as typed, so a trailing '/' (a folder) shows
        "--results", path_type=str, help="Also write the study's small results file (effects, calls, ends, budget: "
        "what the README's numbers are rendered from) to this path.")] = None,
    runs_table: Annotated[bool, typer.Option(
        "--runs", help="Also print the runs table (run id, label, seed, status, best val loss...) before the verdict.")
    ] = False,
    worth_margin: Annotated[Optional[float], typer.Option(
        "--worth-margin", help="Ask for the ladder's compute (or data) multipliers, judged at this margin (a "
        "multiplier above 1: 1.05 = within 1/1.05..1.05 is negligible); a ladder no law fits is refused.")] = None,
):
    """Turn run directories into comparison tables, component effects with CIs, and figures.

    With --margin other than the study's (and no --out), the report is a view of the same runs, written
    beside the study's own, into RUNS_DIR/report-margin-M: RUNS_DIR/report stays as the study wrote it.
    """
    from anatomy_cli.report import write
    from anatomy_cli.spec.config import check_margin
    from anatomy_cli.study import reporting

    if margin is not None:
        check_margin(margin, "--margin")
    done = reporting.read_report(runs_dir, out, tuple(format or write.FORMATS), margin, results, tensorboard,
                                 worth_margin)
    out = done.out
    if done.view:  # after every refusal: a note never precedes an error
        err_console.print(f"note: --margin {margin:g} is not the margin the study's report is judged at: this report "
                          f"is a view written beside it, into {out} ({runs_dir / 'report'} is left as it was)",
                          highlight=False, markup=False, soft_wrap=True)
    if json_out:  # exactly report.json's document (the files are in the report folder)
        paths = write.write_report(done.report, out, done.formats)
        text = (paths["report.json"].read_text() if "report.json" in paths
                else write.json_text(write.report_document(done.report)))
        write_out(text)
        if done.events is not None:  # not part of the document: said on stderr
            err_console.print(f"tensorboard: event files written for {done.events['written']} runs", highlight=False)
        return
    if runs_table:
        console.print(frame_table(done.report.runs, ["run_id", "label", "seed", "status", "best_val_loss",
                                                     "best_step", "overfit_gap", "tokens_per_s"], "runs"))
    _write_report(done.report, out, done.formats)  # the answer last, where the terminal leaves it
    if results is not None:
        console.print(f"results: {results}", highlight=False, markup=False, soft_wrap=True)
    if done.events is not None:
        console.print(f"tensorboard: event files written for {done.events['written']} runs ({done.events['skipped']} "
                      f"had their own); view with: tensorboard --logdir {runs_dir}", highlight=False)

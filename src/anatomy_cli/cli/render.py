"""What several commands print: plan lines and tables, sweep progress displays, run tables."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from rich.table import Table

from anatomy_cli.cli.app import (
    err_console,
)
from anatomy_cli.spec import components
from anatomy_cli.spec.components import label
from anatomy_cli.store import runs
from anatomy_cli.sweep.calibrate import fmt_seconds


def plan_line(plan, sweep_dir: Path, workers: int, estimate: tuple[dict, float], more: tuple[int, int] | None = None
              ) -> str:
    """'plan: 36 runs -> runs/demo (to do: 36, est. 24.0min with 2 workers, measured on this machine)'; `more`:
    (runs, seeds) --decide's later looks may add, at most, said after it ('--decide may add up to 12 runs')."""
    from anatomy_cli.sweep.calibrate import busy, plan_seconds

    per_run, startup = estimate
    todo = [p for p in plan if runs.run_status(sweep_dir / p.run_id) not in runs.DONE_STATES]
    est = plan_seconds([per_run[p.run_id] for p in todo], workers, startup) if todo else 0.0
    load = busy()
    note = (f"; the machine is busy now (load average {load[0]:.1f} on {load[1]} cores): expect longer" if load
            else "")
    extra = (f"; --decide may add up to {more[0]} runs (up to {more[1]} seeds a config, only where an effect is "
             f"open)" if more and more[0] > 0 else "")
    return (f"plan: {len(plan)} runs -> {sweep_dir}  (to do: {len(todo)}, est. {fmt_seconds(est)} with {workers} "
            f"worker{'s' * (workers > 1)}, from step times measured on this machine{note}){extra}")


class FittedTable:
    """A rich table that keeps its identifying columns (run id, role, label...) whole (#30).

    At a width that holds the whole table it prints exactly the plain rich table. Narrower, it leaves
    out the descriptive columns in `drop` order until the rest fits (a caption names them), and the
    identifying columns never end in an ellipsis: where they alone are too wide they wrap instead.
    """

    def __init__(self, title: str, headers: list[str], rows: list[list[str]], right: frozenset = frozenset(),
                 drop: tuple[str, ...] = ()):
        self.title, self.headers, self.rows, self.right, self.drop = title, headers, rows, right, drop

    def table(self, cols: list[str] | None = None, narrow: bool = False) -> Table:
        from anatomy_cli.report.textable import IDENTIFYING

        cols = self.headers if cols is None else cols
        left_out = [h for h in self.headers if h not in cols]
        caption = f"not shown at this width: {', '.join(left_out)} (--json has them)" if left_out else None
        table = Table(title=self.title, caption=caption)
        for col in cols:
            extra = {"overflow": "fold"} if narrow and col in IDENTIFYING else {}
            table.add_column(col, justify="right" if col in self.right else "left", **extra)
        index = {h: i for i, h in enumerate(self.headers)}
        for row in self.rows:
            table.add_row(*(row[index[c]] for c in cols))
        return table

    def natural_width(self, cols: list[str]) -> int:
        """The width rich gives the table unshrunk: each column's widest cell, padding and borders."""
        from rich.cells import cell_len

        index = {h: i for i, h in enumerate(self.headers)}
        return sum(max([cell_len(c)] + [cell_len(r[index[c]]) for r in self.rows]) + 3 for c in cols) + 1

    def __rich_console__(self, console, options):
        cols = list(self.headers)
        if self.natural_width(cols) <= options.max_width:
            yield self.table()
            return
        for col in self.drop:
            if self.natural_width(cols) <= options.max_width:
                break
            if col in cols and len(cols) > 1:
                cols.remove(col)
        yield self.table(cols, narrow=True)


def plan_table(plan, sweep_dir: Path, workers: int, vocab: dict, estimate: tuple[dict, float],
               more: tuple[int, int] | None = None) -> FittedTable:
    statuses = {p.run_id: runs.run_status(sweep_dir / p.run_id) for p in plan}
    rows = []
    for p in plan:
        m = p.config.model
        params = m.model_copy(update={"vocab_size": vocab[p.config.data.corpus_key]}).num_params()
        role = f"{p.role}:{p.flip}" if p.flip else p.role
        known = [*components.BUILTINS, *(c for c in (p.design.components if p.design else ())
                                         if c.name not in components.BY_NAME)]  # and a spec's own components table
        rows.append([p.run_id, label(p.config, known), role, str(p.config.seed), f"{params:,}",
                     fmt_seconds(estimate[0][p.run_id]), statuses[p.run_id] or "pending"])
    # narrower than the table: the components (which the role and run id also name) go first, then the
    # per-run sizes and estimates (the title has the total), then the seed (in the run id too)
    return FittedTable(plan_line(plan, sweep_dir, workers, estimate, more),
                       ["run id", "components", "role", "seed", "params", "est.", "status"], rows,
                       right=frozenset({"seed", "params", "est."}), drop=("components", "params", "est.", "seed"))


def plan_json(spec, plan, sweep_dir: Path, rounds=None) -> dict:
    """The plan as data: the study's components and, per run, id, role, flip, seed and resolved config; with
    rounds (--decide: study.rounds.Rounds), its looks (seeds and the family-wise alpha each is judged at), its
    margin (null: the default) and budget, as the dry run's text says them."""
    design = next((p.design for p in plan if p.design), None)
    out = {
        "name": spec.name, "sweep_dir": str(sweep_dir), "design": spec.design,
        "components": [components.record(c) for c in design.components] if design else [],
        "runs": [{"run_id": p.run_id, "slug": p.slug, "role": p.role, "flip": p.flip, "seed": p.config.seed,
                  "label": label(p.config), "status": runs.run_status(sweep_dir / p.run_id) or "pending",
                  "config": p.config.model_dump(mode="json")} for p in plan],
    }
    if rounds is not None:
        out["decide"] = {"looks": [{"seeds": n, "alpha": a} for n, a in zip(rounds.looks, rounds.alphas)],
                         "margin": rounds.margin, "budget": rounds.budget, "budget_s": rounds.budget_s}
    return out


HEARTBEAT_S = 60.0  # LineDisplay: the longest a pipe or a log goes without a line while runs train


class LineDisplay:
    """For a pipe or a log: one plain line per finished run and, while runs train, a line at most every
    `every` seconds when nothing else was printed ('still training: 3 of 36 runs done, 2 in flight;
    4.2min elapsed, est. 8.1min left'), at the first event after it is due (runs report progress at each
    evaluation). est. left: from the progress of this invocation's runs (steps done of their steps), and
    before any, `planned_s` (the plan line's estimate) less the time elapsed; `clock` is injectable."""

    def __init__(self, total: int, every: float = HEARTBEAT_S, clock: Callable[[], float] = time.monotonic,
                 planned_s: float | None = None):
        self.total, self.done, self.failed = total, 0, 0
        self.every, self.clock, self.planned_s = every, clock, planned_s
        self.began = self.said = clock()
        self.skipped = 0
        self.flight: dict[str, float] = {}  # run id -> fraction of its steps done, for runs in flight

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        return None

    def __call__(self, e: dict) -> None:
        kind = e["event"]
        if kind == "plan" and e["skipped"]:
            self.done = self.skipped = e["skipped"]
            self._say(f"{e['skipped']} of {self.total} runs already done")
        elif kind == "start":
            self.flight.setdefault(e["run_id"], 0.0)
        elif kind == "progress":
            self.flight[e["run_id"]] = e["step"] / e["steps"] if e.get("steps") else 0.0
        elif kind == "done":
            self.flight.pop(e["run_id"], None)
            self.done += 1
            summary = e["summary"]
            self.failed += summary.get("status") == runs.FAILED
            best = summary.get("best_val_loss")
            what = (f"best val {best:.4f}" if isinstance(best, float) and summary.get("status") == runs.COMPLETED
                    else summary.get("error") or summary.get("status"))
            took = f", {summary['wall_s']:.0f} s" if isinstance(summary.get("wall_s"), (int, float)) else ""
            self._say(f"[{self.done}/{self.total}] {e['run_id']}: {what}{took}")
        if self.clock() - self.said >= self.every:
            self._say(self.heartbeat())

    def heartbeat(self) -> str:
        """'still training: 3 of 36 runs done, 2 in flight; 4.2min elapsed, est. 8.1min left'."""
        elapsed = self.clock() - self.began
        worked = self.done - self.skipped + sum(self.flight.values())  # runs' worth of steps trained here
        left_runs = self.total - self.done - sum(self.flight.values())
        if worked > 0:
            left = f", est. {fmt_seconds(elapsed / worked * left_runs)} left"
        elif self.planned_s is not None:
            left = f", est. {fmt_seconds(max(0.0, self.planned_s - elapsed))} left"
        else:
            left = ""
        return (f"still training: {self.done} of {self.total} runs done, {len(self.flight)} in flight; "
                f"{fmt_seconds(elapsed)} elapsed{left}")

    def _say(self, line: str) -> None:
        self.said = self.clock()
        err_console.print(line, highlight=False, markup=False, soft_wrap=True)


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


# what a narrow runs table keeps longest, after its identifying columns
FRAME_KEEP = ("best_val_loss", "status")


def frame_table(frame, columns: list[str], title: str) -> FittedTable:
    from anatomy_cli.report.textable import IDENTIFYING

    cols = [c for c in columns if c in frame.columns]
    rows = [[_fmt(v) for v in row] for row in frame[cols].itertuples(index=False)]
    # narrower than the table: the descriptive columns go from the right, the kept ones last
    loose = [c for c in reversed(cols) if c not in IDENTIFYING]
    drop = [c for c in loose if c not in FRAME_KEEP] + [c for c in reversed(FRAME_KEEP) if c in loose]
    return FittedTable(title, cols, rows, drop=tuple(drop))


def _fmt(v) -> str:
    if isinstance(v, float):
        return "-" if v != v else f"{v:.4f}" if abs(v) < 100 else f"{v:,.0f}"
    return str(v)


def size_report(plan, workers: int | None, vocab: int | None, estimate: bool = True) -> tuple[dict, str]:
    """(the JSON payload, the plain-text table fitted to the terminal) of a plan's sizes (study.sizes)."""
    from anatomy_cli.report.textable import table, width, wrap
    from anatomy_cli.study.sizes import size_plan
    from anatomy_cli.sweep import ladder

    payload = size_plan(plan, workers, vocab, estimate)
    rows, total, n_workers, why_not = payload["sizes"], payload["total_s"], payload["workers"], payload["no_estimate"]
    active = any(r["active_params"] != r["params"] for r in rows)
    heads = ["size", "runs", "params", "non-emb.", *(["active"] if active else []), "steps", "tokens/run",
             "FLOPs/run", "est.", "corpus tok/param", "epochs", "warning"]
    c = ladder.count
    cells = [[r["size"] or "(base)", str(r["runs"]), c(r["params"]), c(r["non_embedding_params"]),
              *([c(r["active_params"])] if active else []), f"{r['steps']:,}", c(r["tokens"]), c(r["flops"]),
              "-" if r["est_s"] is None else fmt_seconds(r["est_s"]),
              "?" if r["corpus_tokens_per_param"] is None else f"{r['corpus_tokens_per_param']:.3g}",
              "?" if r["epochs"] is None else f"{r['epochs']:.2g}",
              ", ".join(w.split(":")[0] for w in r["warnings"]) or "-"] for r in rows]
    cols = width()
    body = table(heads, cells, cols, fit=[("drop", "runs"), ("drop", "corpus tok/param"), ("drop", "params"),
                                          ("drop", "FLOPs/run")],
                 right={h for h in heads if h not in ("size", "warning")})
    load = payload["load"]
    busy_note = f"; the machine is busy now (load {load[0]:.1f} on {load[1]} cores): expect longer" if load else ""
    when = (f"est. {fmt_seconds(total)} for {len(plan)} runs on {n_workers} worker{'s' * (n_workers > 1)}, from step "
            f"times measured on this machine{busy_note}") if total is not None else f"no time estimate ({why_not})"
    notes = [f"{r['size'] or '(base)'}: {w}" for r in rows for w in r["warnings"]]
    notes += [when, f"Warnings: overfit risk when a run makes more than {ladder.MAX_EPOCHS} epochs over its "
                   f"corpus' training split; a size whose runs take more than a day. Params, FLOPs: each size's "
                   f"first config (its reference end); FLOPs: training only."]
    return {k: v for k, v in payload.items() if k != "load"}, "\n".join([body, ""] + [wrap(n, cols) for n in notes])

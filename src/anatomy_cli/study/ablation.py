"""`anatomy ablate`'s study, as library calls the CLI renders: what was asked, the plan and its refusals,
the workers, the estimate, the training (rounds with --decide) and the closing counts.

  Ask         one `ablate` invocation: its spec, the settings over it, its modes, where to run
  Study       a planned study: the spec as validated, plan, sweep folder, rounds, then corpora, stacking, workers
  plan_study  every refusal before anything is shown or written, then the plan
  size_study  the corpora read once, seeds per stacked model, the worker count
  run_study   train the plan (rounds with --decide; after the LR selection with --tune-lr, lr_study.py)
              through a trainer; what it did
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from anatomy_cli.report import decide, stats
from anatomy_cli.spec import knobs
from anatomy_cli.spec import parts as registry
from anatomy_cli.spec.config import AblationSpec, ConfigError, choose
from anatomy_cli.store import records, runs
from anatomy_cli.study import lr_selection, lr_study
from anatomy_cli.study.rounds import Rounds, RoundsDone, looks_of, run_rounds
from anatomy_cli.sweep import plan as plan_mod

EXECUTORS = ("local", "dask")


@dataclass(frozen=True, kw_only=True)
class Ask:
    """One `anatomy ablate` invocation: its spec, the settings laid over it (--set and the aliases of
    spec/knobs.py, in order: a later one wins), its modes, and where and how to run."""

    spec: Path | None = None
    settings: tuple[knobs.Setting, ...] = ()
    decide: bool = False  # --decide: rounds (the setting decide=true)
    tune_lr: bool = False  # --tune-lr: fair learning rates (tune=true)
    time_pass: bool = False  # --time: time every config instead of training (no rounds, no tuning)
    runs_dir: Path = Path("runs")
    workers: int | None = None
    executor: str = "local"
    address: str | None = None
    stack: str = "auto"

    @property
    def all_settings(self) -> list[knobs.Setting]:
        """The modes as settings, then the settings as given."""
        modes = [knobs.Setting("decide", True, "--decide")] if self.decide else []
        modes += [knobs.Setting("tune", True, "--tune-lr")] if self.tune_lr else []
        return modes + list(self.settings)

    def given(self, key: str) -> knobs.Setting | None:
        """The last command-line setting of `key` or of a key inside it (decide: decide.max_seeds too)."""
        return next((s for s in reversed(self.all_settings) if s.key == key or s.key.startswith(f"{key}.")), None)

    def name_of(self, key: str) -> str:
        """How `key` was set, for a message: the option given on the command line ('--max-seeds', '--set
        decide.max_seeds'), else the spec's key."""
        return next((s.option for s in reversed(self.all_settings) if s.key == key), key)

    @property
    def spec_path(self) -> Path:
        return self.spec or plan_mod.experiments_dir() / plan_mod.DEFAULT_SPEC

    def origin(self, table: str) -> str:
        """Where a mode table came from, for a message: '--decide' (as typed), else "SPEC's [decide] table"."""
        given = self.given(table)
        return given.typed if given is not None else f"{self.spec_path}'s [{table}] table"

    @property
    def invocation(self) -> records.Invocation:
        """sweep.json's record of how the study was asked for (the report's advice commands say it again)."""
        return records.Invocation(spec=None if self.spec is None else str(self.spec),
                                  settings=[records.SettingRecord(key=s.key, value=s.value, typed=s.typed,
                                                                  extend=s.extend or None) for s in self.all_settings])


@dataclass(frozen=True)
class Study:
    ask: Ask
    spec: AblationSpec  # the spec file with the settings over it, validated once: every round expands this
    plan: list
    sweep_dir: Path
    rounds: Rounds | None  # --decide's plan of looks, else None
    vocab: dict = field(default_factory=dict)  # corpus source -> vocabulary size (size_study)
    per_model: int = 1  # seeds per stacked model
    workers: int = 1
    tune: lr_study.TunePlan | None = None  # --tune-lr's grid, else None

    @property
    def margin(self) -> float | None:
        """The study's margin (its spec's, or as set), None: the report's default."""
        return self.spec.margin

    def plan_at(self, seeds: int) -> list:
        """The plan at `seeds` seeds (a later look): the spec the study validated, never its file again."""
        return plan_mod.expand(self.spec.model_copy(update={"seeds": seeds}))


def decide_plan(ask: Ask, spec: AblationSpec) -> Rounds | None:
    """The rounds of the spec's [decide] table (there from the file, or from --decide / --set decide...); None
    without one, and always with --time, which times instead of training."""
    if spec.decide is None or ask.time_pass:
        return None
    where = ask.origin("decide")
    if not isinstance(spec.seeds, int):
        raise ConfigError(f"{where} trains in rounds, which add seeds by count: give the spec's seeds as a count, or "
                          f"--seeds N")
    if spec.seeds < stats.MIN_PAIRS:  # a look with fewer pairs can call nothing and would spend alpha for it
        raise ConfigError(f"{where} trains in rounds, which start from the study's {spec.seeds} "
                          f"seed{'s' * (spec.seeds > 1)} ({ask.name_of('seeds')}), but a call needs {stats.MIN_PAIRS}: "
                          f"give --seeds {stats.MIN_PAIRS} or more, or turn the rounds off with --set decide=false")
    table = spec.decide
    budget_s = decide.parse_budget(table.budget, ask.name_of("decide.budget"))
    looks = looks_of(spec.seeds, table.max_seeds, table.step, ask.name_of("decide.max_seeds"))
    return Rounds(looks, spec.margin, budget_s, table.budget, by="flag" if ask.given("decide") else "spec")


def plan_study(ask: Ask) -> Study:
    """The study this invocation asks for, or the one-line refusal of a bad option, spec or folder, before
    anything is written."""
    choose(ask.executor, "--executor", EXECUTORS)
    plan_mod.stack_size(ask.stack, "cpu")  # refuses a bad --stack before anything else
    for mode, flag in ((ask.decide, "--decide"), (ask.tune_lr, "--tune-lr")):
        if mode and ask.time_pass:
            raise ConfigError(f"{flag} trains; --time times: run them one after the other")
    spec, plan = plan_mod.load_plan(ask.spec, ask.all_settings)
    refuse_broken_parts(plan)
    rounds = decide_plan(ask, spec)
    tune = lr_study.tune_plan(ask, spec, plan, rounds)
    device = spec.base.train.device
    if device not in ("auto", "cpu") and ask.executor == "local":  # here, not in each worker
        from anatomy_cli.training.devices import resolve_device

        resolve_device(device, ask.name_of("base.train.device"))
    sweep_dir = runs.runs_folder(ask.runs_dir) / spec.name
    runs.refuse_inside_runs(sweep_dir, "--runs-dir", "sweep directory", itself="sweep")  # before the plan shows
    runs.refuse_corpus_overlap((p.config.data.source for p in plan), sweep_dir, "--runs-dir")
    study = Study(ask, spec, plan, sweep_dir, rounds, tune=tune)
    check_record(study)
    return study


def refuse_broken_parts(plan: list) -> None:
    """A plugin part the plan's configs use passes the battery's shape and causality checks before anything
    trains (PartError, one line, naming the part and its failure); torch is read only where one is used."""
    if any(p.plugin for item in plan for p in registry.used(item.config.model.model_dump(), {}).values()):
        from anatomy_cli.exams.parts_check import refuse_broken

        refuse_broken(item.config for item in plan)


def size_study(study: Study) -> Study:
    """The study with its corpora read (vocabularies), its seeds per stacked model and its workers:
    --workers, else plan_mod.plan_workers for the models it trains."""
    vocab = plan_mod.check_data(study.plan)
    plan_mod.refuse_other_corpus(study.plan, study.sweep_dir)  # new seeds never join runs of another corpus
    per_model = plan_mod.plan_stack(study.ask.stack, study.plan, study.ask.executor)
    workers = study.ask.workers or plan_mod.plan_workers(study.plan, vocab, -(-len(study.plan) // per_model))
    return replace(study, vocab=vocab, per_model=per_model, workers=workers)


def estimate(study: Study, todo: list | None = None, say=None) -> tuple[dict[str, float], float]:
    """({run id: seconds}, start-up seconds per worker) of `todo` (default: the runs still to do); say(line):
    what is measured first, where this machine's step times are not cached yet."""
    todo = plan_mod.pending_runs(study.plan, study.sweep_dir) if todo is None else todo
    return plan_mod.plan_estimate(todo, study.workers, study.vocab, say)


def round_seconds(study: Study, todo: list) -> float:
    """The estimated wall time of training `todo` on the study's workers (0 for nothing)."""
    from anatomy_cli.sweep.calibrate import plan_seconds

    if not todo:
        return 0.0
    per_run, startup = estimate(study, todo)
    return plan_seconds(list(per_run.values()), study.workers, startup)


@dataclass(frozen=True)
class TuneCost:
    """What --tune-lr adds, priced apart (runs, estimated seconds on the study's workers): the selection grid
    still to train, the extensions at most, the study at the frozen LRs and the shared-LR runs beside it (at
    most, before the LRs are chosen: every config's LR may move; none with shared off)."""

    grid: tuple[int, int, float]  # (runs, to do, seconds)
    extensions: tuple[int, float]  # at most
    study: tuple[int, int, float]  # (runs, to do, seconds)
    shared: tuple[int, float]  # at most before the choice, exact after it
    chosen: bool  # tune.json holds every arm's choice: the study and shared counts are exact


def tune_cost(study: Study) -> TuneCost:
    """The selection and the study priced apart (estimate, from this machine's step times; an LR does not
    change a run's step time, so a run at an LR not chosen yet is priced at train.lr)."""
    tune, record = study.tune, records.read_tune(study.sweep_dir)
    grid = lr_study.selection_plan(tune, study.plan)
    if record is not None and all(record.arm(a) is not None for a in lr_study.arms(study.plan)):
        extra = sum(a.extended for a in record.arms) * len(tune.grid.seeds)
        plan = lr_study.tuned_plan(study.plan, record)
        shared = lr_study.shared_of(plan, record) + lr_study.untuned_runs(study.plan, record)
        chosen = True
    else:
        extra = len(lr_study.arms(study.plan)) * tune.grid.extend * len(tune.grid.seeds)
        plan, shared, chosen = study.plan, study.plan if tune.shared else [], False
    todo = plan_mod.pending_runs(grid, study.sweep_dir)
    study_todo = plan_mod.pending_runs(plan, study.sweep_dir)
    one_lr = [p for p in grid if p.config.train.lr == tune.grid.center]  # an extension step: one LR per arm
    return TuneCost((len(grid), len(todo), round_seconds(study, todo)),
                    (extra, 0.0 if chosen else round_seconds(study, one_lr) * tune.grid.extend),
                    (len(plan), len(study_todo), round_seconds(study, study_todo)),
                    (len(shared), round_seconds(study, plan_mod.pending_runs(shared, study.sweep_dir))), chosen)


def train_runs(study: Study, todo: list, display=None, stop=None) -> list[str | None]:
    """Train the pending runs of `todo` into the sweep folder; each run's status (display: progress
    events; stop: asked between steps, a requested stop saves the runs in flight)."""
    summaries = plan_mod.execute(todo, study.sweep_dir, study.workers, display, sweep_name=study.spec.name,
                                 executor=study.ask.executor, address=study.ask.address, stop=stop,
                                 stack=study.per_model)
    return [x.get("status") for x in summaries]


def check_record(study: Study) -> records.DecideRecord | None:
    """The folder's decide.json, if any, after the refusals of a study that would change what the folder's
    records fixed when it started: another margin (a margin chosen after the data: a report at another margin is
    a view, `anatomy report DIR --margin M`), a folder decided with other looks (a new plan after seeing the data
    spends its alpha twice), and training a decided one without rounds (seeds the rounds withheld would join
    calls made at the looks' alpha, and the report's stop line would no longer hold)."""
    folder, ask = study.sweep_dir, study.ask
    record = records.read_decide(folder)
    lr_study.check_record(study.tune, study.plan, folder, ask.time_pass, decided=record is not None)
    _check_margin(study, records.read_study(folder), record)
    _check_cap(study)
    if record is not None and study.rounds is None and not ask.time_pass:
        raise ConfigError(f"{folder} was decided in rounds (decide.json): add --decide with the same seeds and "
                          f"[decide] settings to go on, or use another --runs-dir")
    if record is not None and study.rounds is not None and record.looks != study.rounds.looks:
        raise ConfigError(f"{folder} was decided with looks at {', '.join(map(str, record.looks))} seeds: rerun "
                          f"with the same seeds and [decide] settings (max_seeds, step), or use another --runs-dir "
                          f"(a new plan after seeing the data would spend its alpha twice)")
    return record


def _check_cap(study: Study) -> None:
    """Refuse rounds capped below the seeds the folder already holds of the study's configs: the looks would
    judge up to the cap (and call the rest futile) while the report pools every seed there, so neither line
    would be true of the other."""
    rounds = study.rounds
    if rounds is None or study.tune is not None or study.ask.time_pass:
        return
    slugs = {p.slug for p in study.plan}
    capped = {p.config.seed for p in study.plan_at(rounds.looks[-1])}
    past = sorted({int(seed[1:]) for slug, seed, _ in (r.name.rsplit("-", 2) for r in runs.find_runs(study.sweep_dir)
                                                       if r.name.count("-") >= 2)
                   if slug in slugs and seed[1:].lstrip("-").isdigit() and int(seed[1:]) not in capped})
    if past:
        held = len(capped) + len(past)
        raise ConfigError(f"{study.sweep_dir} already holds {held} seeds of this study's configs (seeds "
                          f"{', '.join(map(str, past))} past the cap), and {study.ask.name_of('decide.max_seeds')} "
                          f"caps its rounds at {rounds.looks[-1]}: the looks would judge {rounds.looks[-1]} while the "
                          f"report pools {held}; raise the cap to at least {held}, or use another --runs-dir")


def _check_margin(study: Study, begun: records.StudyRecord | None, record: records.DecideRecord | None) -> None:
    """Refuse a study at another margin than the one its folder's runs were started at: sweep.json's (none
    recorded: the default), else (a folder from before sweep.json kept it) decide.json's. Another margin is a
    view of the same runs (`anatomy report DIR --margin M`), never a rewrite of the study's records."""
    folder, ask = study.sweep_dir, study.ask
    if ask.time_pass or not runs.find_runs(folder) or (begun is None and (record is None or record.margin is None)):
        return
    fixed, where = (begun.study_margin, records.SWEEP) if begun is not None else (record.margin, records.DECIDE)
    if fixed == study.margin or (fixed is None and study.margin == stats.DEFAULT_MARGIN):
        return
    was = f"{fixed:g}" if fixed is not None else f"the default {stats.DEFAULT_MARGIN:g}"
    asked = study.margin if study.margin is not None else stats.DEFAULT_MARGIN
    now = f"{asked:g}" if study.margin is not None else f"the default {asked:g}"
    option = ask.name_of("margin")
    view = option if option in ("--margin", "--min-effect") else "--margin"  # report takes either name
    raise ConfigError(f"{folder} started at margin {was} bits/byte ({where}), and {option} asks for {now}: a study's "
                      f"margin is fixed when it starts; judge the same runs at {asked:g} with `anatomy report "
                      f"{folder} {view} {asked:g}` (a view beside the study's report), or use another --runs-dir")


@dataclass
class StudyDone:
    statuses: list[str | None]  # every run trained or found done, in plan order per round
    seconds: float
    rounds: RoundsDone | None = None
    tune: records.TuneRecord | None = None  # --tune-lr: tune.json's record, None before the LRs are chosen

    def count(self, status: str) -> int:
        return self.statuses.count(status)


def run_study(study: Study, train: Callable[[list], list], say: Callable[[str], None] = lambda line: None,
              clock: Callable[[], float] = time.monotonic, price: Callable[[list], float] | None = None
              ) -> StudyDone:
    """Train the study's plan through `train` (todo -> statuses): at once, or in --decide's rounds
    (run_rounds over the sweep folder); `say` tells the rounds' progress; `price` (runs -> estimated
    seconds, e.g. round_seconds), where given, prices a tuned study's second phase once its LRs are frozen."""
    from anatomy_cli.report.frames import load_runs

    started = clock()
    before = check_record(study)  # again: the folder may have changed since the plan was shown
    plan_mod.record_study(study.sweep_dir, study.plan, study.ask.invocation, study.margin,  # before anything trains
                          study.spec.worth_margin)
    if study.tune is not None:
        return _run_tuned(study, train, say, clock, started, before, price)
    if study.rounds is None:
        return StudyDone(train(study.plan), clock() - started)
    done = run_rounds(study.plan, study.rounds, train, lambda: load_runs(study.sweep_dir)[0], study.plan_at,
                      pending=lambda todo: plan_mod.pending_runs(todo, study.sweep_dir),
                      cost=lambda todo: round_seconds(study, todo),
                      save=lambda record: records.write_decide(study.sweep_dir, record), say=say, clock=clock,
                      before=before)
    return StudyDone(list(done.statuses.values()), clock() - started, done)


def initial_loss(study: Study) -> float:
    """What a diverged selection run counts at: ln of the vocabulary size (a uniform guess's loss)."""
    return math.log(max(study.vocab.values(), default=2))


def study_line(study: Study, first: list, shared: list, center: float, price: Callable[[list], float]) -> str:
    """Phase 2 priced once the LRs are frozen, before it trains: '--tune-lr: the study at the frozen LRs, 36 runs,
    and 33 at the shared LR 0.001 beside them (to do: 69, est. 21.3min)'; with --decide, its first round's."""
    from anatomy_cli.sweep.calibrate import fmt_seconds

    todo = plan_mod.pending_runs(first + shared, study.sweep_dir)
    beside = f", and {len(shared)} at the shared LR {center:g} beside them" if shared else ""
    rounds = " (--decide's first round)" if study.rounds is not None else ""
    return (f"--tune-lr: the study at the frozen LRs{rounds}, {len(first)} run{'s' * (len(first) != 1)}{beside} "
            f"(to do: {len(todo)}, est. {fmt_seconds(price(todo))})")


def _run_tuned(study: Study, train, say, clock, started: float, before, price=None) -> StudyDone:
    """--tune-lr: the selection (lr_study.select), then the study's seeds at the frozen LRs, in --decide's rounds or
    at once; beside each round, its runs at the shared LR where the LR moved (and the untuned arms' runs), unless
    the study was planned without them (shared off: shared_of and untuned_runs are empty)."""
    from anatomy_cli.report.frames import load_runs
    from anatomy_cli.report.lr_allowance import study_runs

    statuses: dict[str, str | None] = {}
    try:
        record = lr_study.select(study.tune, study.plan, study.sweep_dir, train, initial_loss(study), statuses, say)
    except lr_selection.Unfinished as err:
        say(f"--tune-lr: {err}")
        return StudyDone(list(statuses.values()), clock() - started)
    alone = lr_study.untuned_runs(study.plan, record)

    def beside(todo: list) -> list:
        nonlocal alone
        extra, alone = lr_study.shared_of(todo, record) + alone, []  # the untuned arms' runs: with the first round
        got = train(todo + extra) if todo or extra else []  # shared off, no arm tuned: nothing to train
        statuses.update(zip((p.run_id for p in todo + extra), got))
        return got[:len(todo)]

    first = lr_study.tuned_plan(study.plan, record)
    if price is not None:
        say(study_line(study, first, lr_study.shared_of(first, record) + alone, record.grid.center, price))
    if study.rounds is None or not first:
        beside(first)
        return StudyDone(list(statuses.values()), clock() - started, tune=record)
    done = run_rounds(first, replace(study.rounds, tune=record), beside,
                      lambda: study_runs(*load_runs(study.sweep_dir), study.sweep_dir, record)[0],
                      lambda n: lr_study.tuned_plan(study.plan_at(n), record),
                      pending=lambda todo: plan_mod.pending_runs(todo, study.sweep_dir),
                      cost=lambda todo: round_seconds(study, todo + lr_study.shared_of(todo, record)),
                      save=lambda r: records.write_decide(study.sweep_dir, r), say=say, clock=clock, before=before)
    return StudyDone(list(statuses.values()), clock() - started, done, tune=record)

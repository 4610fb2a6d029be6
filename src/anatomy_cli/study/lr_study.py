"""A tuned study (`anatomy ablate --tune-lr`, a spec's [tune] table): fair learning rates (no torch).

Phase 1 trains every config (arm) of the plan on an LR grid around train.lr, on selection seeds that
no study seed ever equals, and study/lr_selection.py's run_selection chooses each arm's LR from those runs;
the choices are frozen in tune.json (report/lr_allowance.py). Phase 2 trains the study's seeds, each arm at
its frozen LR, and the verdict (with --decide, its rounds) is made from those runs as from any study.
Beside them the same seeds train at the shared LR where an arm's LR moved, so the report can show
what the shared LR would have called (a config whose LR did not move is the same run either way);
[tune] shared = false (--no-tune-shared) trains no such run: the study alone, and no comparison.

Every selection and shared-LR run is an ordinary run of the sweep folder (its id the hash of its
config, its LR and seed included), trained by the study's own trainer: workers, stacking, the sweep
lock, Dask, resuming after a kill. The selection runs live in the sweep folder itself (a sweep inside
a sweep is refused: its report would count the outer one's runs), told apart by their seeds. A rerun
reads tune.json and never re-picks: a tuned arm keeps its LR; a rerun with another grid, other
selection seeds or the shared-LR comparison turned the other way is refused.

  TunePlan       the grid a study tunes with, resolved once from the spec's [tune] table, and what turned it on
  tune_plan      the spec's [tune] table (from the file, --tune-lr or --set tune...) -> a TunePlan, or a refusal
  check_record   the folder's tune.json against the plan: another grid, seeds, shared or config refused
  at_lr          a planned run at another LR (and seed)
  selection_run  the run of one selection Job
  select         phase 1 over a trainer: the grid trained, each arm's choice, tune.json written
  tuned_plan     phase 2's runs: each tuned arm at its frozen LR (an untuned arm has none)
  shared_of      the shared-LR runs beside tuned runs, where the LR moved (none with shared off)
  untuned_runs   the shared-LR runs of the arms not tuned (they have no tuned runs; none with shared off)
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from anatomy_cli.spec.config import SEED_MIN, ConfigError, RunConfig, seeds_of, validate
from anatomy_cli.store import records, runs
from anatomy_cli.study import lr_selection

RULE = ("each config's LR is the grid point of lowest selection loss (the mean over the selection seeds of each "
        "run's best val loss; a diverged run counts at the initial loss, ln of the vocabulary size, never dropped); "
        "ties go to the point nearer train.lr, then the lower LR; a best at the grid's edge trains one more point "
        "past it, up to the grid's extensions, after which the config is not tuned (no tuned call)")


@dataclass(frozen=True)
class TunePlan:
    grid: lr_selection.Grid
    by: str  # "flag" (--tune-lr) or "spec" (the spec's [tune] table), recorded in tune.json
    seeds_given: int | list[int] = 1  # the selection seeds as asked: a count, or a list
    shared: bool = True  # the shared-LR runs beside the study where an LR moved ([tune] shared)

    def record(self, initial_loss: float) -> records.TuneRecord:
        """tune.json's plan, before any arm is chosen."""
        g = self.grid
        return records.TuneRecord(grid=records.TuneGrid(center=g.center, points=g.points, factor=g.factor,
                                                              extend=g.extend),
                                     seeds=list(g.seeds), rule=RULE, initial_loss=initial_loss, by=self.by,
                                     seeds_given=self.seeds_given, shared=self.shared)

    def all_lrs(self) -> list[float]:
        """Every LR the grid can train, its extensions on both sides included."""
        g = self.grid
        return [g.lr(k) for k in range(-g.half - g.extend, g.half + g.extend + 1)]


def tune_plan(ask, spec, plan, rounds) -> TunePlan | None:
    """The grid of the spec's [tune] table (there from the file, or from --tune-lr, its aliases or --set tune...);
    None without one, and with --time, which times instead of training. Refused in one line: a grid Grid
    refuses (one point, a factor <= 1), an LR of the grid that is not a positive finite number, configs at
    more than one train.lr, and selection seeds that are study seeds, now or at any look of --decide
    (`rounds`)."""
    table = spec.tune
    if table is None or ask.time_pass:
        return None
    where = ask.origin("tune")
    centers = sorted({p.config.train.lr for p in plan})
    if len(centers) > 1:
        raise ConfigError(f"{where} tunes around one train.lr, and this plan's configs train at "
                          f"{', '.join(f'{c:g}' for c in centers)} (a size's or an axis's train.lr): give them one")
    seeds = tuple(seeds_of(table.seeds, spec.base.seed, below=True))
    if min(seeds) < SEED_MIN:
        raise ConfigError(f"{ask.name_of('tune.seeds')}: selection seeds below the base seed {spec.base.seed} reach "
                          f"past {SEED_MIN}: give them as a list")
    try:
        grid = lr_selection.Grid(center=centers[0], points=table.points, factor=float(table.factor),
                                 extend=table.extend, seeds=seeds)
    except ValueError as err:
        raise ConfigError(f"{where}: {err}") from None
    tuned = TunePlan(grid, "flag" if ask.given("tune") else "spec", table.seeds, table.shared)
    for k in range(-grid.half - grid.extend, grid.half + grid.extend + 1):
        try:
            lr = grid.lr(k)
        except OverflowError:
            lr = math.inf
        if not (math.isfinite(lr) and lr > 0):
            raise ConfigError(f"the LR grid reaches lr={lr:g} ({k:+d} factors of {grid.factor:g} from train.lr="
                              f"{grid.center:g}): every LR must be a positive finite number; use a smaller factor or "
                              f"fewer points")
    study_seeds = {p.config.seed for p in plan}
    if rounds is not None:
        study_seeds |= set(seeds_of(rounds.looks[-1], spec.base.seed))
    try:
        grid.disjoint(sorted(study_seeds))
    except ValueError as err:
        raise ConfigError(f"{err} (with --decide: any seed up to its max_seeds); choose other tune.seeds (a count "
                          f"takes the seeds below the base seed {spec.base.seed})") from None
    return tuned


def arms(plan) -> dict[str, object]:
    """{arm (a config's slug): its first planned run}, in plan order."""
    out: dict[str, object] = {}
    for p in plan:
        out.setdefault(p.slug, p)
    return out


def at_lr(p, lr: float, seed: int | None = None):
    """The planned run `p` at learning rate `lr` (and `seed`): an ordinary run, whose id is its config's hash."""
    data = p.config.model_dump(mode="json")
    data["train"] = {**data["train"], "lr": lr}
    if seed is not None:
        data["seed"] = seed
    cfg = validate(RunConfig, data)
    return replace(p, run_id=runs.run_id(p.slug, cfg.seed, cfg.model_dump(mode="json")), config=cfg)


def config_key(p) -> str:
    """The hash of an arm's config without its seed and LR: what its choice in tune.json holds for."""
    data = p.config.model_dump(mode="json")
    data["train"] = {**data["train"], "lr": None}
    return runs.config_hash({**data, "seed": None})


def selection_run(arm_runs: dict, job) -> object:
    """The planned run of one selection Job (arm, lr, seed)."""
    return at_lr(arm_runs[job[0]], job[1], job[2])


def selection_plan(tune: TunePlan, plan) -> list:
    """The grid's runs of every arm (no extensions): what phase 1 trains at least."""
    by_arm = arms(plan)
    return [selection_run(by_arm, (a, lr, s)) for a in by_arm for lr in tune.grid.lrs() for s in tune.grid.seeds]


def check_record(tune: TunePlan | None, plan, sweep_dir: Path, time_pass: bool = False, decided: bool = False
                 ) -> records.TuneRecord | None:
    """The folder's tune.json, if any. Refused: a tuned folder trained without --tune-lr (its verdict is the
    tuned runs'), a new grid or other selection seeds (an LR re-picked after the study's seeds trained at it
    would not have been chosen on other seeds), an arm whose config changed since its LR was chosen, and
    --tune-lr on a folder decided in rounds without it (`decided`: decide.json is there, tune.json is not), and
    the shared-LR comparison turned the other way (its runs would be there for some rounds and not others)."""
    record = records.read_tune(sweep_dir)
    if record is None:
        if tune is not None and decided:
            raise ConfigError(f"{sweep_dir} was decided in rounds without --tune-lr (decide.json): tune it in "
                              f"another --runs-dir")
        return None
    if tune is None:
        if time_pass:
            return record
        raise ConfigError(f"{sweep_dir} was tuned (tune.json): add --tune-lr with the same grid to go on, or use "
                          f"another --runs-dir")
    g, r = tune.grid, record.grid
    if (g.center, g.points, g.factor, g.extend, list(g.seeds)) != (r.center, r.points, r.factor, r.extend,
                                                                   record.seeds):
        seeds = ", ".join(map(str, record.seeds))
        raise ConfigError(f"{sweep_dir} was tuned with {r.points} LRs a factor {r.factor:g} apart around "
                          f"{r.center:g} (up to {r.extend} more) on selection seeds {seeds}: rerun with the same "
                          f"train.lr, --tune-points, --tune-factor, --tune-extend and --tune-seeds, or use another "
                          f"--runs-dir (an LR is never re-picked after the study's seeds trained at it)")
    if tune.shared != record.shared:
        was, flag = ("with", "--tune-shared") if record.shared else ("without", "--no-tune-shared")
        raise ConfigError(f"{sweep_dir} was tuned {was} the shared-LR runs beside the study ([tune] shared = "
                          f"{str(record.shared).lower()}): rerun with {flag}, or use another --runs-dir")
    for name, p in arms(plan).items():
        arm = record.arm(name)
        if arm is not None and arm.config_hash != config_key(p):
            raise ConfigError(f"{sweep_dir}: {name}'s LR was chosen for another config (tune.json; other --steps, "
                              f"say): rerun with the same settings, or use another --runs-dir")
    return record


def _reader(tune: TunePlan, by_arm: dict, sweep_dir: Path) -> Callable[[], dict]:
    """read() for run_selection: {(arm, lr, seed): best val loss or None} of every finished selection run."""
    lrs = tune.all_lrs()

    def read() -> dict:
        done = {}
        for arm in by_arm:
            for lr in lrs:
                for s in tune.grid.seeds:
                    run_dir = sweep_dir / selection_run(by_arm, (arm, lr, s)).run_id
                    if runs.run_status(run_dir) in runs.DONE_STATES:
                        done[(arm, lr, s)] = (runs.read_summary(run_dir) or {}).get("best_val_loss")
        return done

    return read


def select(tune: TunePlan, plan, sweep_dir: Path, train: Callable[[list], list], initial_loss: float,
           statuses: dict, say: Callable[[str], None] = lambda line: None) -> records.TuneRecord:
    """Phase 1: the arms tune.json has no choice for yet train the grid (train(todo) -> statuses, through the
    study's trainer; `statuses` collects each run's), run_selection chooses, and tune.json is written (its
    plan first, when the folder has none). Raises lr_selection.Unfinished when a selection run did not finish."""
    by_arm = arms(plan)
    record = records.read_tune(sweep_dir)
    if record is None:
        record = tune.record(initial_loss)
        records.write_tune(sweep_dir, record)
    todo = [a for a in by_arm if record.arm(a) is None]
    for arm in record.arms:  # chosen by an earlier invocation: its runs are this study's own, not another plan's
        if arm.arm in by_arm and arm.arm not in todo:
            for lr in arm.lrs:
                for s in record.seeds:
                    run_id = selection_run(by_arm, (arm.arm, lr, s)).run_id
                    statuses.setdefault(run_id, runs.run_status(sweep_dir / run_id))
    if not todo:
        return record

    def trainer(jobs) -> None:
        wanted = [selection_run(by_arm, j) for j in jobs]
        statuses.update(zip((p.run_id for p in wanted), train(wanted)))

    choices = lr_selection.run_selection(todo, tune.grid, trainer, _reader(tune, by_arm, sweep_dir),
                                         record.initial_loss, say=say)
    arms_ = [records.TuneArm(arm=c.arm, config=config_key(by_arm[c.arm]), lrs=list(c.lrs), losses=list(c.losses),
                                lr=c.lr, tuned=c.tuned, reason=c.reason, best_loss=c.best_loss,
                                sensitivity=c.sensitivity, extended=c.extended) for c in choices.values()]
    record = record.model_copy(update={"arms": [*record.arms, *arms_]})
    records.write_tune(sweep_dir, record)
    for arm in arms_:
        say(f"--tune-lr: {arm.arm} " + (f"at lr {arm.lr:.3g} ({arm.reason})" if arm.tuned else arm.reason))
    return record


def untuned_line(record: records.TuneRecord) -> str | None:
    """What a selection that tuned no config says (None where one was tuned): why, by its arms' reasons: a grid
    whose every LR diverged is not widened past its edge but moved down."""
    if any(a.tuned for a in record.arms) or not record.arms:
        return None
    diverged = sum(a.reason == lr_selection.DIVERGED for a in record.arms)
    if diverged == len(record.arms):
        return (f"--tune-lr: no config was tuned (every LR of each diverged, the lowest "
                f"{min(a.lrs[0] for a in record.arms):.3g}): no tuned verdict; lower train.lr, the grid's center, "
                f"in another --runs-dir")
    edge = f"{len(record.arms) - diverged} best at the grid's edge" + (
        f", {diverged} with every LR diverged" if diverged else "")
    return (f"--tune-lr: no config was tuned ({edge}): no tuned verdict; widen the grid (tune.factor, tune.extend) "
            f"in another --runs-dir")


def tuned_plan(plan, record: records.TuneRecord) -> list:
    """Phase 2: each run of `plan` whose arm was tuned, at the arm's frozen LR (the same run where it did not
    move); an arm not tuned has no tuned runs."""
    chosen = record.chosen
    return [p if chosen[p.slug] == p.config.train.lr else at_lr(p, chosen[p.slug]) for p in plan
            if chosen.get(p.slug) is not None]


def shared_of(todo, record: records.TuneRecord) -> list:
    """The shared-LR runs beside tuned runs: each run of `todo` whose LR moved, at the grid's center (the shared
    LR; a run that did not move is its own); none where the study was planned without them (shared off)."""
    center = record.grid.center
    return [at_lr(p, center) for p in todo if p.config.train.lr != center] if record.shared else []


def untuned_runs(plan, record: records.TuneRecord) -> list:
    """The runs of `plan` whose arm was not tuned, as planned (at the shared LR): shared-LR runs only, so none
    with shared off (such an arm then trains nothing past its selection)."""
    chosen = record.chosen
    return [p for p in plan if p.slug in chosen and chosen[p.slug] is None] if record.shared else []

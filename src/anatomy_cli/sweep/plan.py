"""Ablation sweeps: expand(spec) -> [PlannedRun] (pure, no torch), then execute the plan.

Designs (components from spec/components.py, built-in or declared in the spec):
  one-at-a-time  the reference end (every component off; "2017" for the five), each flip added
                 alone to it, the all-on end ("llama"), each flip removed alone
  factorial      every combination of the chosen flips (others keep the base's values)
  list           named configs given as dotted overrides of the base
Extra `axes` are crossed with the design; every config is validated before any run starts.
Execution skips runs already completed (or diverged: that is a result), continues interrupted
ones from their checkpoint, reruns the rest from scratch, and holds a lock so two sweeps never
share a directory.
"""

from __future__ import annotations

import itertools
import math
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from anatomy_cli.spec import components, knobs
from anatomy_cli.spec import parts as registry
from anatomy_cli.spec.components import Component, Design
from anatomy_cli.spec.config import (
    MAX_SIZE,
    AblationSpec,
    ConfigError,
    ModelConfig,
    RunConfig,
    TrainConfig,
    apply_overrides,
    load_toml,
    resolve_plugins,
    resolve_source,
    validate,
)
from anatomy_cli.spec.roles import ADD_ONE, ALL_ON, REFERENCE, REMOVE_ONE
from anatomy_cli.store import records, runs
from anatomy_cli.store.lockfile import DirLock, Locked
from anatomy_cli.sweep.jobs import Event, Job, Stop, execute_local

DEFAULT_SPEC = "demo.toml"
MAX_PLAN_RUNS = 10_000  # expanding more runs than this only fills memory before a sweep that never ends


def experiments_dir() -> Path:
    """./experiments when run from a checkout, else the copy packaged with anatomy."""
    from importlib import resources

    local = Path("experiments")
    if (local / DEFAULT_SPEC).is_file():
        return local
    packaged = resources.files("anatomy_cli") / "_experiments"
    if packaged.is_dir():
        return Path(str(packaged))
    return Path(__file__).resolve().parents[3] / "experiments"


def load_spec(path: Path | None, settings: Iterable[knobs.Setting] = ()) -> AblationSpec:
    """The spec file with `settings` (--set and its aliases: spec/knobs.py) laid over it, validated once: the
    one way a study spec is read. A setting of base.train.steps where the spec computes each size's steps
    (budget 'tokens-per-param') is refused, as a setting that would do nothing."""
    path = path or experiments_dir() / DEFAULT_SPEC
    settings = list(settings)
    data = resolve_spec_sources(resolve_source(load_toml(path), Path(path).parent, "base.data"), Path(path).parent)
    data = resolve_plugins(knobs.apply_settings(data, settings), Path(path).parent, "base")  # base.plugins, loaded
    spec = validate(AblationSpec, data)
    steps = next((s for s in settings if s.key == "base.train.steps"), None)
    if steps is not None and spec.budget == "tokens-per-param":
        raise ConfigError(f"{steps.typed} sets one budget for every size, but spec {spec.name} computes each size's "
                          f"steps (budget 'tokens-per-param'); change its tokens_per_param instead")
    return spec


def resolve_spec_sources(data: dict, base_dir: Path) -> dict:
    """A relative data.source in a component's settings, a [[configs]] entry or an axis, and a tokenizer.json path
    in `tokenizers`, resolve against the spec's folder, as base.data.source does."""
    if not isinstance(data, dict):
        return data
    tables = [c.get(k) for c in (data.get("components") or {}).values() if isinstance(c, dict) for k in ("on", "off")]
    tables += [c.get("set") for c in data.get("configs") or [] if isinstance(c, dict)]
    for table in tables:
        if isinstance(table, dict) and "data.source" in table:
            table["data.source"] = _resolved(table["data.source"], base_dir)
    axes = data.get("axes")
    if isinstance(axes, dict) and isinstance(axes.get("data.source"), list):
        axes["data.source"] = [_resolved(v, base_dir) for v in axes["data.source"]]
    if isinstance(data.get("tokenizers"), list):  # a tokenizer.json named by its path, as base.data.tokenizer is
        data["tokenizers"] = [v if not isinstance(v, str) or v == "char" or v.startswith(("bpe:", "hf:"))
                              else _resolved(v, base_dir) for v in data["tokenizers"]]
    return data


def _resolved(source, base_dir: Path):
    if isinstance(source, str) and not Path(source).is_absolute() and not Path(source).exists() \
            and (base_dir / source).exists():
        return str((base_dir / source).resolve())
    return source


def load_plan(path: Path | None, settings: Iterable[knobs.Setting] = ()) -> tuple[AblationSpec, list[PlannedRun]]:
    """The spec (load_spec: the file and the settings over it, validated once) and its plan, every planned
    config validated and the plan's size checked before it is built. `anatomy components SPEC`, `ablate`
    (also --dry-run and --time), `scale-plan` and `check` all read specs through here, so a spec one of them
    accepts, all accept."""
    spec = load_spec(path, settings)
    return spec, expand(spec)


def check_data(plan) -> dict[str | None, int]:
    """Read each distinct corpus once before any run starts: vocabulary size per corpus (DataConfig.corpus_key:
    its source and tokenizer)."""
    return {key: facts["vocab"] for key, facts in corpus_facts(plan).items()}


def corpus_facts(plan) -> dict[tuple, dict]:
    """{(source, tokenizer): {"vocab", "train_tokens"}} of each distinct corpus of the plan, each read once."""
    from anatomy_cli.data.load import load_corpus

    facts = {}
    for p in plan:
        d = p.config.data
        if d.corpus_key not in facts:
            shortest = min(q.config.model.ctx_len for q in plan if q.config.data.corpus_key == d.corpus_key)
            corpus = load_corpus(d.source, d.val_frac, shortest, d.tokenizer)
            facts[d.corpus_key] = {"vocab": len(corpus.vocab), "train_tokens": len(corpus.train),
                                   "val_tokens": len(corpus.val)}
        refuse_short(p, facts[d.corpus_key])
    return facts


def refuse_short(p: PlannedRun, facts: dict) -> None:
    """Each split of a run's corpus holds more than its ctx_len ids (a size of a long context may not),
    said before anything is measured or written, naming the size."""
    from anatomy_cli.data.corpus import DataError

    ctx, train, val = p.config.model.ctx_len, facts["train_tokens"], facts["val_tokens"]
    if min(train, val) < ctx + 1:
        whose = f"size {p.size.name}" if p.size is not None else p.slug
        corpus = f"the corpus {p.config.data.source}" if p.config.data.source else "the default corpus"
        raise DataError(f"{whose}: ctx_len={ctx:,} needs more than {ctx:,} ids in each split, and {corpus} gives "
                        f"{train:,} train / {val:,} val")


def refuse_other_corpus(plan, sweep_dir: Path) -> None:
    """New runs never join finished ones trained on another corpus: where the plan has runs to train, a
    finished run of sweep_dir on one of its sources whose summary records another fingerprint than the
    source holds now is refused, one line naming the corpus and the run (the report would pool them)."""
    from anatomy_cli.data.load import load_corpus
    from anatomy_cli.data.prepared import changed_file

    sweep_dir, by_source, now = Path(sweep_dir), {p.config.data.source: p for p in plan}, {}
    if not sweep_dir.is_dir() or not pending_runs(plan, sweep_dir):
        return
    for run_dir in sorted(d for d in sweep_dir.iterdir() if runs.holds_run(d)):
        summary = runs.json_object(run_dir / runs.SUMMARY) or {}
        source = ((runs.json_object(run_dir / runs.CONFIG) or {}).get("data") or {}).get("source")
        if summary.get("status") not in runs.DONE_STATES or not isinstance(summary.get("corpus_sha256"), str) \
                or not isinstance(source, (str, type(None))) or source not in by_source:
            continue
        if source not in now:
            cfg = by_source[source].config
            meta = load_corpus(source, cfg.data.val_frac, cfg.model.ctx_len, cfg.data.tokenizer).meta
            now[source] = (meta.get("sha256"), meta.get("fingerprint"))
        sha, files = now[source]
        if summary["corpus_sha256"] != sha or changed_file(summary.get("corpus_files"), files):
            raise runs.RunError(f"{sweep_dir}: its run {run_dir.name} trained on another corpus than "
                                f"{source or 'the default corpus'} holds now (sha256 {summary['corpus_sha256'][:12]}..."
                                f", now {str(sha)[:12]}...); new runs would pool two corpora in one study: restore "
                                f"the corpus, or use another --runs-dir")


class SweepLocked(Locked):
    """Another live process holds the sweep directory."""


@dataclass(frozen=True)
class PlannedSize:
    """One size of a ladder as planned: its name, the dotted settings it lays over the base (steps
    included when the budget computes them) and the budget rule, as sweep.json records it."""

    name: str
    settings: tuple[tuple[str, object], ...]
    budget: str
    tokens_per_param: float | None = None

    def record(self) -> dict:
        return {"name": self.name, "settings": dict(self.settings), "budget": self.budget,
                **({"tokens_per_param": self.tokens_per_param} if self.tokens_per_param is not None else {})}


@dataclass(frozen=True)
class PlannedRun:
    run_id: str
    slug: str  # e.g. '2017', '2017+rope', 'llama', 'llama-rope', with axis values appended ('S_2017': size S)
    role: str  # 'reference', 'add-one', 'all-on', 'remove-one', 'factorial', 'list'
    flip: str | None  # the flipped component for add-one / remove-one
    config: RunConfig
    design: Design | None = None  # the study's components (None for a list design)
    size: PlannedSize | None = None  # its rung of the spec's [[sizes]] (None: the spec has none)
    budget: int | None = None  # its budget (train steps) of the spec's [budgets] (None: the spec has none)
    parent: str | None = None  # a decay branch's stable run (its run id): trained from its kept checkpoint


def spec_table(spec: AblationSpec) -> dict[str, Component]:
    """The built-in components plus the spec's own, by name."""
    return components.table(spec.components, f"spec {spec.name}", spec.gqa_kv_head)


def parse_flips(text: str | None, known: Iterable[str] = components.BUILTIN_NAMES) -> list[str] | None:
    """'rope,swiglu' -> ['rope', 'swiglu']; unknown names are a ConfigError naming them."""
    if text is None:
        return None
    known = list(known)
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        raise ConfigError(f"unknown --flip name(s) {', '.join(unknown) or '(none)'}; choose from {', '.join(known)}")
    return list(dict.fromkeys(names))


def design_of(spec: AblationSpec, flips: list[str] | None = None) -> Design:
    """The study's components and which of them get runs of their own.

    The components are the spec's flips (default: the five plus the spec's own) and any names of `only`;
    runs of their own (add-one, remove-one, factorial) go to only's names when given (--flip). The
    five 2017 -> LLaMA parts travel together: a study that flips any of them has all five at its
    ends, so `flips = ["rope"]` still compares against the 2017 and LLaMA ends.
    """
    table = spec_table(spec)
    names = spec.flips if spec.flips is not None else [*components.FIVE, *spec.components]
    for key, given in (("flips", names), ("only (--flip)", flips or [])):
        unknown = [n for n in given if n not in table]
        if unknown:
            raise ConfigError(f"{key}: unknown component(s) {', '.join(dict.fromkeys(unknown))}; "
                              f"choose from {', '.join(table)} (or declare one under [components.NAME])")
    members = list(dict.fromkeys([*names, *(flips or [])]))
    if set(members) & set(components.FIVE):
        members = list(dict.fromkeys([*components.FIVE, *members]))
    design = Design(tuple(table[n] for n in members), tuple(flips or names))
    components.check_conflicts(design.components)
    return design


def tokenizer_slug(tokenizer: str) -> str:
    """A tokenizer's piece of a run's slug: 'char', 'bpe512', 'hf-gpt2', a tokenizer.json's folder or file stem."""
    if tokenizer == "char" or tokenizer.startswith(("bpe:", "hf:")):
        return runs.slugify(tokenizer.replace("bpe:", "bpe").replace("hf:", "hf-"))
    path = Path(tokenizer)
    return runs.slugify(path.stem if path.suffix == ".json" else path.name)


def refuse_mixed_tokenizers(design: Design | None) -> None:
    """A study never pairs runs of two tokenizers: a component that switches data.tokenizer is refused (a
    switched key is left out of a group's settings, so its two states would be two tokenizers in one family),
    naming the key that gives each tokenizer a family of its own. An axis or a [[configs]] entry that sets
    data.tokenizer keeps it in its settings, so each value is its own group already (effects.groups)."""
    for c in design.components if design else ():
        if "data.tokenizer" in c.keys:
            raise ConfigError(f"component {c.name} switches data.tokenizer: its runs would pair two tokenizers in "
                              f"one family; name them with tokenizers = [...] instead (each its own family)")


def axis_key(key: str) -> str:
    """Bare names are model or train fields ('n_layer' -> 'model.n_layer')."""
    if "." in key:
        return key
    if key in ModelConfig.model_fields:
        return f"model.{key}"
    if key in TrainConfig.model_fields:
        return f"train.{key}"
    raise ConfigError(f"axes.{key}: not a model or train field (use a dotted key such as train.warmup)")


Point = tuple[str, str, "str | None", dict[str, bool]]  # slug, role, flip, intended state per component


def design_points(spec: AblationSpec, design: Design) -> list[Point]:
    """(slug, role, flip, states) for each config of the design, before axes and seeds."""
    names, varied = design.names, design.varied
    if spec.design == "factorial":
        points = []
        for mask in itertools.product((False, True), repeat=len(varied)):
            on = [f for f, m in zip(varied, mask) if m]
            points.append(("+".join(on) or "none", "factorial", None, dict(zip(varied, mask))))
        return points
    ref, top = design.ends
    points = [(ref, REFERENCE, None, {n: False for n in names})]
    if ADD_ONE in spec.directions:
        points += [(f"{ref}+{f}", ADD_ONE, f, {n: n == f for n in names}) for f in varied]
    if REMOVE_ONE in spec.directions:
        points.append((top, ALL_ON, None, {n: True for n in names}))
        points += [(f"{top}-{f}", REMOVE_ONE, f, {n: n != f for n in names}) for f in varied]
    return points


def expand(spec: AblationSpec) -> list[PlannedRun]:
    """The full plan; raises ConfigError listing every invalid config before anything runs.

    Component settings are resolved against the base with its size's and axis values (so gqa
    follows an n_head axis or a size's n_head), then axes apply on top; every run's actual component
    states are checked against its intended role, so an axis or base setting that contradicts the
    role is an error, never a silently mislabelled run (a size may not set what a component
    switches: plan_sizes). With [[sizes]] the whole design runs at every size, its slugs starting
    with the size's name.
    """
    design = design_of(spec, spec.only) if spec.design != "list" else None
    base = spec.base.model_dump(mode="json")
    axes = {axis_key(k): v for k, v in spec.axes.items()}
    check_plan_size(spec, design)  # before anything is built: 2^24 factorial points would fill memory
    refuse_mixed_tokenizers(design)
    seed_list = spec.seed_list
    points = design_points(spec, design) if design else [(c.name, "list", None, {}) for c in spec.configs]
    sets = {c.name: dict(c.set) for c in spec.configs}
    plan, errors, seen = [], [], set()
    rungs = plan_sizes(spec, design, axes) or [None]
    for tok, rung, (slug, role, flip, want), values in itertools.product(spec.tokenizer_list, rungs, points,
                                                                         itertools.product(*axes.values())):
        axis_over = dict(zip(axes, values))
        full_slug = "_".join(([tokenizer_slug(tok)] if tok else []) + ([rung.name] if rung else []) + [slug]
                             + [f"{k.split('.')[-1]}={v}" for k, v in axis_over.items()])
        start = apply_overrides(base, {**({"data.tokenizer": tok} if tok else {}),
                                       **(dict(rung.settings) if rung else {}), **sets.get(slug, {}), **axis_over})
        flat = components.flatten(start)
        settings = {k: v for c in (design.components if design else ()) if c.name in want
                    for k, v in c.settings(want[c.name], flat).items()}
        for seed in seed_list:
            data = apply_overrides(start, {**settings, **axis_over, "seed": seed, "name": f"{spec.name}/{full_slug}"})
            try:
                cfg = validate(RunConfig, data)
            except ConfigError as err:
                errors.append(f"{full_slug} (seed {seed}): {err}")
                continue
            wrong = role_errors(cfg, design, want, axis_over, role)
            if wrong:
                errors.append(f"{full_slug}: {wrong}")
                break  # the same for every seed
            dumped = cfg.model_dump(mode="json")
            rid = runs.run_id(full_slug, seed, dumped)
            # A design plans each config once (with two components, A alone is all-on minus B);
            # a list design's entries are runs of their own even when their settings agree.
            same = runs.config_hash({k: v for k, v in dumped.items() if k != "name"}) if design else rid
            if same not in seen:
                seen.add(same)
                plan.append(PlannedRun(rid, full_slug, role, flip, cfg, design, rung))
    if design is not None and not errors:  # a flip another cancels at an end builds that end again
        errors = components.same_models((p.slug, p.config) for p in plan)
    if errors:
        more = f"; and {len(errors) - 4} more" if len(errors) > 4 else ""
        raise ConfigError(f"invalid configs in the plan ({len(errors)}): " + "; ".join(errors[:4]) + more)
    return budget_plan(plan, spec.budgets.steps) if spec.budgets is not None else plan


def budget_plan(plan: list[PlannedRun], steps: list[int]) -> list[PlannedRun]:
    """Each planned run as a budget ladder (training/budgets.py budget_ladder): its stable run to the largest
    budget (keeping a checkpoint at each smaller budget's decay start), then one decay branch per smaller
    budget, smallest first, naming the stable run as its parent. A branch is the run its config names (the
    id a run trained to that budget from step 0 has); slugs start with the budget ('b200_2017+rope').
    ConfigError (one line) for a decay longer than a budget's stable phase."""
    from anatomy_cli.training.budgets import budget_ladder

    out = []
    for p in plan:
        ladder = budget_ladder(p.config, steps)
        stable_id = None
        for r in ladder.runs:
            slug = f"b{r.budget}_{p.slug}"
            cfg = r.config.model_copy(update={"name": f"{p.config.name.partition('/')[0]}/{slug}"})
            rid = runs.run_id(slug, cfg.seed, cfg.model_dump(mode="json"))
            stable_id = stable_id or rid
            out.append(PlannedRun(rid, slug, p.role, p.flip, cfg, p.design, p.size, r.budget,
                                  None if r.parent is None else stable_id))
    return out


def plan_factors(spec: AblationSpec, design: Design | None) -> dict[str, int]:
    """The plan's dimensions, counted without building anything: design points (2^k for a factorial
    of k components; 1 + k and 1 + k one-at-a-time per direction), axis values, seeds. The product
    bounds the runs (a design point met twice is planned once)."""
    k = len(design.varied) if design else 0
    if design is None:
        points = len(spec.configs)
    elif spec.design == "factorial":
        points = 2**k
    else:
        points = 1 + (ADD_ONE in spec.directions) * k + (REMOVE_ONE in spec.directions) * (1 + k)
    return {"configs": points, "axis values": math.prod(len(v) for v in spec.axes.values()),
            "seeds": len(spec.seed_list), **({"sizes": len(spec.sizes)} if spec.sizes else {}),
            **({"tokenizers": len(spec.tokenizers)} if spec.tokenizers else {})}


def check_plan_size(spec: AblationSpec, design: Design | None) -> int:
    factors = plan_factors(spec, design)
    size = math.prod(factors.values())
    if size > MAX_PLAN_RUNS:
        shown = " x ".join(f"{n:,} {what}" for what, n in factors.items())
        raise ConfigError(f"the plan has {size:,} runs ({shown}); more than {MAX_PLAN_RUNS:,} is taken for a typo")
    return size


def plan_sizes(spec: AblationSpec, design: Design | None, axes: dict[str, list]) -> list[PlannedSize]:
    """The spec's sizes as dotted settings laid over the base before the components are: every key
    any size sets, at each size's resolved value (SizeSpec.resolved: n_kv_head keeps the base's
    ratio), so a run's settings name exactly one size; steps computed under 'tokens-per-param'.

    A key a size sets that a component of the study switches, or that an axis also sets, is refused:
    which of the two holds would be an accident (a size that contradicts a role).
    """
    switched = {k: c.name for c in (design.components if design else ()) for k in c.keys}
    keys = {f"{section}.{k}": None for size in spec.sizes for section in ("model", "train")
            for k in getattr(size, section)}
    for size in spec.sizes:
        for key in (f"{section}.{k}" for section in ("model", "train") for k in getattr(size, section)):
            if key in switched:
                raise ConfigError(f"sizes.{size.name}.{key}: component {switched[key]} of this study switches "
                                  f"it, so a size cannot set it")
            if key in axes:
                raise ConfigError(f"sizes.{size.name}.{key}: also an axis (axes.{key.split('.')[-1]}); a size and "
                                  f"an axis cannot both set it")
    if "model.n_head" in keys:
        keys["model.n_kv_head"] = None
    out = []
    for size in spec.sizes:
        resolved = dict(zip(("model", "train"), (c.model_dump(mode="json") for c in size.resolved(spec.base))))
        over = {key: resolved[key.split(".")[0]][key.split(".")[1]] for key in keys}
        if spec.budget == "tokens-per-param":
            over["train.steps"] = size_steps(spec, size)
        out.append(PlannedSize(size.name, tuple(over.items()), spec.budget, spec.tokens_per_param))
    return out


def size_steps(spec: AblationSpec, size) -> int:
    """Budget 'tokens-per-param' (Chinchilla-style, Hoffmann et al. 2022: ~20 tokens per parameter):
    steps = ceil(tokens_per_param x N / (batch x ctx)), N the size's non-embedding parameters with
    the base's components, so every run of a size shares one budget and stays paired."""
    model, train = size.resolved(spec.base)
    tokens = spec.tokens_per_param * model.non_embedding_params()
    steps = max(1, math.ceil(tokens / (train.batch_size * model.ctx_len)))
    if steps > MAX_SIZE:
        raise ConfigError(f"sizes.{size.name}: tokens_per_param={spec.tokens_per_param:g} asks for {steps:,} steps "
                          f"(at most {MAX_SIZE:,}): lower tokens_per_param or the size")
    return steps


def role_errors(cfg: RunConfig, design: Design | None, want: dict[str, bool], axis_over: dict, role: str) -> str:
    """'' when every component is in its intended state, else what contradicts the role and why."""
    flat = components.flat_config(cfg)
    problems = []
    for c in design.components if design else ():
        if c.name not in want or c.state(flat) == want[c.name]:
            continue
        shown = ", ".join(f"{k}={flat.get(k)!r}" for k in c.keys)
        by_axis = [k for k in c.keys if k in axis_over]
        cause = (f"set by axes.{by_axis[0].removeprefix('model.')}" if by_axis
                 else "the base's value" if c.off is None and not want[c.name]
                 else f"its {'on' if want[c.name] else 'off'} setting {c.describe('on' if want[c.name] else 'off')} "
                      f"does not hold here")
        problems.append(f"planned ({role}) with {c.name} {'on' if want[c.name] else 'off'}, but {shown} ({cause}) "
                        f"makes it {'off' if want[c.name] else 'on'}")
    return "; ".join(problems)


def plan_estimate(plan: list[PlannedRun], workers: int, vocab: dict, say=None) -> tuple[dict[str, float], float]:
    """({run id: estimated seconds}, start-up seconds per worker) from this machine's calibration
    (calibrate.py: measured step, evaluation and per-run times of each shape class, cached; say(line):
    what is measured, before a measurement)."""
    from anatomy_cli.sweep import calibrate

    threads = max(1, (os.cpu_count() or 1) // max(1, workers))  # what each run of the sweep trains with
    sized = {p.run_id: p.config.model_copy(update={"model": p.config.model.model_copy(
        update={"vocab_size": vocab[p.config.data.corpus_key]})}) for p in plan}
    # a budget ladder's decay trains only its decay (from its stable run's checkpoint): timed as that many steps
    trained = {p.run_id: sized[p.run_id].model_copy(update={"train": p.config.train.model_copy(
        update={"steps": p.config.train.decay_steps})}) if p.parent else sized[p.run_id] for p in plan}
    keys = {rid: calibrate.shape_key(cfg, cfg.model.vocab_size, threads) for rid, cfg in sized.items()}
    reps: dict[str, RunConfig] = {}
    for rid, key in keys.items():
        reps.setdefault(key, sized[rid])
    cals = calibrate.calibrations(reps, threads, say)
    per_run = {rid: calibrate.run_seconds(trained[rid], cals[keys[rid]], cfg.model.flops_per_token()
                                          / reps[keys[rid]].model.flops_per_token()) for rid, cfg in sized.items()}
    return per_run, max((c["startup_s"] for c in cals.values()), default=0.0)


# ----------------------------------------------------------------------------------- execution


class SweepLock(DirLock):
    """sweep_dir/.lock names its live owner; the protocol (atomic take, race-free stale takeover)
    is lockfile.DirLock's."""

    error = SweepLocked

    def __init__(self, sweep_dir: Path):
        super().__init__(sweep_dir, "sweep directory")


def stack_size(choice: str, device_type: str) -> int:
    """--stack auto | off | N -> the most seeds one stacked model holds (1: every run alone).
    auto: STACK_AUTO[device_type], what was measured faster on that kind of device."""
    if choice == "off":
        return 1
    if choice == "auto":
        return STACK_AUTO.get(device_type, 1)
    if choice.isascii() and choice.isdigit() and int(choice) >= 1:  # '²' is a digit to isdigit, not to int()
        return int(choice)
    raise ConfigError(f"--stack must be auto, off or a number of seeds per model (1 or more), got {choice!r}")


# `--stack auto` per device type: seeds per stacked model where stacking measured faster, 1 where
# it measured slower or was not measured (benchmarks/RESULTS.md, "bench_stack"; cpu: 0.91x the speed
# of runs alone, 3 interleaved rounds on an idle 2-core machine; cuda and mps: not measured yet).
STACK_AUTO = {"cpu": 1, "cuda": 1, "mps": 1}


def core_workers(n_runs: int) -> int:
    """Parallel processes on the CPU: one per core up to the number of runs (measured: benchmarks/RESULTS.md)."""
    return max(1, min(os.cpu_count() or 1, n_runs))


def plan_workers(plan: list[PlannedRun], vocab: dict, models: int | None = None) -> int:
    """A plan's default parallel processes, composed here once: on the CPU one per core up to the models
    it trains (`models`: runs, or stacked models of several seeds); on a GPU as many runs as its free
    memory holds (devices.device_workers)."""
    names = {p.config.train.device for p in plan}
    if names <= {"cpu"} or not plan:
        return core_workers(len(plan) if models is None else models)
    from anatomy_cli.training.devices import device_workers, resolve_device

    device = resolve_device(names.pop() if len(names) == 1 else "auto")
    return device_workers(device, [p.config for p in plan], vocab, len(plan))


def plan_stack(choice: str, plan: list[PlannedRun], executor: str) -> int:
    """Seeds per stacked model for this plan (1: alone): --stack on the plan's device; the dask
    executor trains runs one by one."""
    size = stack_size(choice, "cpu")  # refuses a bad value before anything else
    if executor != "local" or choice == "off" or not plan:
        return 1
    if choice == "auto":
        from anatomy_cli.training.devices import resolve_device

        names = {p.config.train.device for p in plan}
        size = stack_size(choice, resolve_device(names.pop() if len(names) == 1 else "auto").type)
    return size


def record_design(sweep_dir: Path, design: Design | None, sizes: Iterable[PlannedSize] = (),
                  invocation: records.Invocation | None = None, margin: float | None = None,
                  worth_margin: float | None = None, budgets: Iterable[int] = ()) -> None:
    """Add the design's components (and sizes) to sweep_dir/sweep.json, which the report reads to tell
    roles (and which size a run is); with `invocation` (a study's: its spec and settings), how the study was
    asked for, and its margin (kept as the folder's first study recorded it: records.merged_study).

    A sweep directory may hold several invocations (other --flip choices, more seeds): the file keeps
    the union of their components and sizes. A spec component or a size redefined under the same
    name is refused, since runs already written were planned with the old definition."""
    rows = [components.record(c) for c in (design.components if design else ())]
    rungs = [size.record() for size in sizes]
    records.write_study(sweep_dir, records.merged_study(sweep_dir, rows, rungs, invocation, margin, worth_margin,
                                                        sorted(set(budgets))))


def record_study(sweep_dir: Path, plan: list[PlannedRun], invocation: records.Invocation,
                 margin: float | None, worth_margin: float | None = None) -> None:
    """A study's sweep.json, written before any of its runs trains (under the sweep's lock): its design, its
    sizes, how it was asked for and its margin (the folder's first study's margin stays), and the multipliers'
    margin where it asks for them (spec key worth_margin)."""
    sweep_dir = Path(sweep_dir)
    runs.check_placement(sweep_dir, "sweep", "--runs-dir")
    sweep_dir.mkdir(parents=True, exist_ok=True)
    with SweepLock(sweep_dir):
        record_design(sweep_dir, next((p.design for p in plan if p.design), None),
                      list(dict.fromkeys(p.size for p in plan if p.size)), invocation, margin, worth_margin,
                      [p.budget for p in plan if p.budget])


def pending_runs(plan: list[PlannedRun], sweep_dir: Path) -> list[PlannedRun]:
    return [p for p in plan if runs.run_status(Path(sweep_dir) / p.run_id) not in runs.DONE_STATES]


def execute(plan: list[PlannedRun], sweep_dir: Path, workers: int = 1, on_event: Event | None = None,
            sweep_name: str | None = None, executor: str = "local", address: str | None = None,
            stop: Stop | None = None, stack: int = 1) -> list[dict]:
    """Run every pending run of the plan into sweep_dir/<run_id>; return all summaries.

    executor 'local' runs in this process (workers=1) or a process pool; 'dask' submits each run
    to an existing dask.distributed cluster at `address` (see dask_exec.py). The design's components
    and sizes go into sweep.json (record_design); how a study was asked for, and its margin, the study
    records itself before it trains (record_study).
    When stop() turns true (local executor) the runs in flight save and end 'interrupted', no new
    run starts, and this returns after every worker has exited, with the lock released: a rerun
    resumes the sweep.
    stack > 1 (local executor): runs that differ only by seed train as one stacked model, up to
    `stack` per model (jobs.group_jobs); every run keeps its own folder.
    """
    sweep_dir = Path(sweep_dir)
    runs.check_placement(sweep_dir, "sweep", "--runs-dir")  # runs inside a run: its report would see the outer one
    sweep_dir.mkdir(parents=True, exist_ok=True)
    emit = on_event or (lambda e: None)
    with SweepLock(sweep_dir):
        design = next((p.design for p in plan if p.design), None)
        sizes = list(dict.fromkeys(p.size for p in plan if p.size))
        if design is not None or sizes:
            record_design(sweep_dir, design, sizes, budgets=[p.budget for p in plan if p.budget])
        todo = pending_runs(plan, sweep_dir)
        emit({"event": "plan", "total": len(plan), "todo": len(todo), "skipped": len(plan) - len(todo)})
        threads = max(1, (os.cpu_count() or 1) // max(1, workers))
        todo_jobs = [Job(p.run_id, p.config.model_dump(mode="json"), str(sweep_dir / p.run_id), threads,
                         {"sweep": sweep_name, "role": p.role, "flip": p.flip}, registry.sources(p.config.plugins),
                         str(sweep_dir / p.parent) if p.parent else "")
                     for p in todo]
        if executor == "dask" and any(j.branch_of for j in todo_jobs):
            raise ConfigError("a budget ladder ([budgets]) trains each decay after its stable run in one local "
                              "worker: run it with the local executor")
        if executor == "dask":
            from anatomy_cli.sweep.dask_exec import execute_dask

            execute_dask(todo_jobs, address, emit)
        else:
            execute_local(todo_jobs, workers, emit, stop, stack)
    return [runs.read_summary(sweep_dir / p.run_id) or {} for p in plan]



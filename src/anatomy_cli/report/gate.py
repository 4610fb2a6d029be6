"""The CI regression gate: best val bits per byte per config against a committed baseline (no torch).

Baseline file (JSON): per config slug, the best val bits per byte (best_val_bpb, the unit of every answer) of
the gate seed measured on the reference machine, plus every seed's value. A baseline written before bits per
byte was the unit holds best_val_loss (nats per character) instead: it still loads, and the gate compares the
runs' best_val_loss against it, in the unit it records (metric_of), with a line saying how to rewrite it
(in_bits_per_byte converts one exactly, as results_bpb.py converts a results file). The default tolerance
comes from that measured spread, not a guess: TOLERANCE_SIGMAS x the pooled seed-to-seed standard deviation
(pooled over all configs, which share one noise level; a per-config std from 4 seeds is itself too noisy),
never below MIN_TOLERANCE. The gate is two-sided: a config REGRESSED when now > baseline + tolerance, and
IMPROVED when now < baseline - tolerance. Both are moves larger than reseeding explains, and an unexplained
fall is as suspect as a rise (attention that sees the next character makes loss fall by nats): an improvement
passes only once it is recorded deliberately with `anatomy check --update`. On the same machine and torch the
gate seed reproduces its numbers exactly, so the table also says whether each number is identical, and
`environment_warnings` names a baseline from elsewhere: another torch, another machine, or the same CPU model
name with another vector instruction set (cpu_capability: AVX2, AVX512, ...), whose kernels round differently.

load_baseline checks the whole file (Baseline: every field `check --update` writes, each of its type; a loss,
spread or tolerance a finite number >= 0; unknown fields kept) before the gate reads it.
"""

from __future__ import annotations

import datetime as dt
import math
import platform
import statistics
from pathlib import Path
from typing import Annotated

from pydantic import Field, ValidationError, model_validator

from anatomy_cli.data.batches import bits_per_byte
from anatomy_cli.spec.errors import InputError
from anatomy_cli.store import runs
from anatomy_cli.store.records import TUNE

ENVIRONMENT = ("torch_version", "machine", "cpu_capability")  # baseline fields that say where it was measured
TOLERANCE_SIGMAS = 2.0
MIN_TOLERANCE = 0.005
BPB, NATS = "best_val_bpb", "best_val_loss"  # the metric a baseline records: today's unit, and the one before it

OK, REGRESSED, IMPROVED, MISSING = "ok", "REGRESSED", "IMPROVED", "MISSING"
VERDICTS = {  # verdict -> what a failure of that kind asks of whoever reads it
    OK: None,
    REGRESSED: "best val bits per byte rose past the tolerance",
    IMPROVED: "best val bits per byte fell past the tolerance: a real improvement must be recorded deliberately "
              "with `anatomy check --update` (or it is a leak, e.g. attention seeing the next character)",
    MISSING: "no completed run with the gate seed",
}


class BaselineError(InputError):
    """A missing or malformed baseline file."""


NonNegative = Annotated[float, Field(ge=0)]  # finite: a FileModel takes no NaN or infinity


class BaselineConfig(runs.FileModel):
    best_val_bpb: NonNegative = None  # the gate seed's, in bits per byte
    best_val_loss: NonNegative = None  # a baseline from before bits per byte: nats per character
    tolerance: NonNegative = None  # absent: MIN_TOLERANCE
    seed_values: dict[str, NonNegative | None] = None  # {seed: best val bpb (or loss), null: not completed}
    seed_std: NonNegative = None

    @model_validator(mode="after")
    def _one_metric(self) -> BaselineConfig:
        if (self.best_val_bpb is None) == (self.best_val_loss is None):
            raise ValueError("needs one finite numeric best_val_bpb (or, written before bits per byte, best_val_loss)")
        return self


class Baseline(runs.FileModel):
    """The baseline file (build_baseline writes it): a field may be absent (older files), not mistyped."""

    configs: dict[str, BaselineConfig]
    gate_seed: int = None
    spec: str = None
    metric: str = None
    per_byte: dict[str, int] = None  # a converted baseline's val windows: {val_tokens, val_bytes}
    pooled_seed_std: NonNegative = None
    derivation: str = None
    torch_version: str | None = None
    machine: str | None = None
    cpu_capability: str | None = None
    platform: str = None
    measured_on: str = None


def collect(sweep_dir: Path, lrs: dict[str, float] | None = None,
            metric: str = BPB) -> dict[str, dict[int, float | None]]:
    """{slug: {seed: the run's `metric` (best val bits per byte), or None when the run did not complete or does not
    record it}}: one run per config and seed. In a tuned study's folder (tune.json) a config has runs at several
    LRs: with `lrs` ({slug: the spec's LR, what the baseline was measured at}) the run at the spec's LR is compared
    (the shared-LR run), and a config with none there is refused; two runs of a config at one seed that remain are
    refused (the gate compares one)."""
    sweep_dir = Path(sweep_dir)
    if not sweep_dir.is_dir():
        raise runs.RunError(f"runs directory not found: {sweep_dir}")
    tuned = (sweep_dir / TUNE).is_file()
    out: dict[str, dict[int, float | None]] = {}
    found: dict[tuple[str, int], list[Path]] = {}
    elsewhere: dict[str, list] = {}  # a tuned folder's LRs of each config other than the spec's
    for run_dir in runs.find_runs(sweep_dir):
        summary = runs.read_summary(run_dir) or {}
        config = runs.read_config(run_dir)
        name, seed = config.get("name"), config.get("seed")
        if not isinstance(name, str) or not _is_int(seed):
            raise runs.RunError(f"{run_dir / runs.CONFIG}: needs a string 'name' and an integer 'seed'")
        slug = name.rsplit("/", 1)[-1]  # sweeps name runs '<spec>/<slug>'
        lr = (config.get("train") or {}).get("lr")
        if tuned and lrs is not None and slug in lrs and not (isinstance(lr, (int, float)) and
                                                               math.isclose(lr, lrs[slug], rel_tol=1e-9)):
            elsewhere.setdefault(slug, []).append(lr)
            continue
        found.setdefault((slug, seed), []).append(run_dir)
        ok = summary.get("status") == runs.COMPLETED
        out.setdefault(slug, {})[seed] = summary.get(metric) if ok else None
    for slug in sorted(set(elsewhere) - set(out)):
        shown = ", ".join(f"{lr:g}" for lr in sorted({lr for lr in elsewhere[slug] if isinstance(lr, (int, float))}))
        raise runs.RunError(f"{sweep_dir} is a tuned study's folder and holds no run of {slug} at the spec's lr "
                            f"{lrs[slug]:g}, where the baseline was measured (only at {shown}): compare runs at the "
                            f"spec's LRs (a tuned study's shared-LR runs: tune.shared = true)")
    twice = next(((key, dirs) for key, dirs in sorted(found.items()) if len(dirs) > 1), None)
    if twice is not None:
        (slug, seed), dirs = twice
        raise runs.RunError(f"{sweep_dir} holds {len(dirs)} runs of {slug} at seed {seed} ("
                            f"{', '.join(d.name for d in dirs)}): the gate compares one run per config and seed; "
                            f"compare a folder of one study's runs")
    if not out:
        raise runs.RunError(f"no runs under {sweep_dir} (no run directory with a {runs.CONFIG})")
    return out


def refuse_tuned(sweep_dir: Path, option: str = "--runs-dir") -> None:
    """The gate's runs are not trained into a tuned study's folder (tune.json): its runs at other LRs share the
    gate's configs and seeds, so neither the study nor the gate would know which run is whose."""
    if (Path(sweep_dir) / TUNE).is_file():
        raise runs.RunError(f"{option}: {sweep_dir} is a tuned study's folder ({TUNE}): the gate's runs at the spec's "
                            f"LRs would join its runs of the same configs and seeds; use another {option}")


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def build_baseline(results: dict[str, dict[int, float | None]], gate_seed: int, spec_name: str,
                   torch_version: str, hardware: str, cpu_capability: str | None = None) -> dict:
    configs, variances = {}, []
    for slug, by_seed in sorted(results.items()):
        values = [v for v in by_seed.values() if v is not None]
        if by_seed.get(gate_seed) is None or len(values) < 2:
            raise BaselineError(f"{slug}: need the gate seed {gate_seed} and >= 2 completed seeds to measure spread")
        variances.append(statistics.variance(values))
        configs[slug] = {
            BPB: by_seed[gate_seed],
            "seed_values": {str(s): v for s, v in sorted(by_seed.items())},
            "seed_std": statistics.stdev(values),
        }
    pooled = math.sqrt(sum(variances) / len(variances))
    for entry in configs.values():
        entry["tolerance"] = max(MIN_TOLERANCE, TOLERANCE_SIGMAS * pooled)
    n_seeds = len(next(iter(results.values())))
    return {
        "spec": spec_name,
        "metric": BPB,
        "gate_seed": gate_seed,
        "pooled_seed_std": pooled,
        "derivation": f"{BPB} is the gate seed's; tolerance = max({MIN_TOLERANCE}, {TOLERANCE_SIGMAS} x the "
                      f"pooled std of {BPB} over {n_seeds} seeds x {len(configs)} configs "
                      f"= {TOLERANCE_SIGMAS} x {pooled:.4f})",
        "torch_version": torch_version,
        "machine": hardware,
        "cpu_capability": cpu_capability,
        "platform": platform.platform(),
        "measured_on": dt.date.today().isoformat(),
        "configs": configs,
    }


def load_baseline(path: Path) -> dict:
    """The baseline file as written (a plain dict), checked whole against Baseline first: BaselineError
    names the first bad field."""
    try:
        data = runs.read_json(path)
    except runs.RunError as err:
        raise BaselineError(f"baseline {path}: {err}") from None
    if not isinstance(data, dict) or not isinstance(data.get("configs"), dict):
        raise BaselineError(f"baseline {path} has no 'configs' table")
    if not data["configs"]:
        raise BaselineError(f"baseline {path} has an empty 'configs' table: nothing to gate")
    try:
        Baseline.model_validate(data)
    except ValidationError as err:
        raise BaselineError(f"baseline {path}: {_problem(err)}") from None
    return data


def _problem(err: ValidationError) -> str:
    """The first bad field, in the words the gate has always used for the fields it reads."""
    e = err.errors(include_url=False)[0]
    loc, value = e["loc"], e.get("input")
    if len(loc) == 3 and loc[0] == "configs" and loc[2] in (BPB, NATS) and e["type"] != "greater_than_equal":
        return f"config {loc[1]!r} lacks a finite numeric {loc[2]}"
    if len(loc) == 2 and loc[0] == "configs" and e["type"] == "value_error":
        return f"config {loc[1]!r} {e['msg'].removeprefix('Value error, ')}"
    if len(loc) == 3 and loc[0] == "configs" and loc[2] == "tolerance":
        return f"config {loc[1]!r} has tolerance {value!r}, not a finite number >= 0"
    if loc == ("gate_seed",):
        return f"gate_seed must be an integer, got {value!r}"
    if len(loc) == 1 and loc[0] in ENVIRONMENT:
        return f"{loc[0]} must be a string, got {value!r}"
    return runs.schema_problem(err, ("configs", "seed_values"))


def metric_of(baseline: dict) -> str:
    """The summary field a (loaded) baseline's numbers are: best_val_bpb, or best_val_loss in one written before
    bits per byte (every config of a file is one or the other: a mix is refused)."""
    kinds = {BPB if entry.get(BPB) is not None else NATS for entry in baseline["configs"].values()}
    if len(kinds) > 1:
        raise BaselineError("baseline mixes best_val_bpb and best_val_loss configs: rewrite it with "
                            "`anatomy check --update`")
    return kinds.pop()


def unit_lines(baseline: dict, path) -> list[str]:
    """A line for a baseline in nats per character: the gate compares best_val_loss with it, and how to move
    it to bits per byte."""
    if metric_of(baseline) == BPB:
        return []
    return [f"baseline {path} records best_val_loss (nats per character, written before bits per byte): the gate "
            f"compares the runs' best_val_loss with it; rewrite it in bits per byte with `anatomy check --update`"]


def in_bits_per_byte(baseline: dict, counts: tuple[int, int]) -> dict:
    """A baseline in nats per character, converted exactly: every seed's best_val_loss turned into best_val_bpb by
    the val windows' (val_tokens, val_bytes) as a run turns its own (data.batches.bits_per_byte, the same
    arithmetic, so a gate seed that reproduces its nats reproduces its bits per byte to the bit); the spread and
    tolerance measured again from the converted seeds (build_baseline's rule); where it was measured kept."""
    if metric_of(baseline) == BPB:
        return baseline
    per_seed = {slug: {int(s): None if v is None else bits_per_byte(v, *counts)
                       for s, v in (entry.get("seed_values") or {}).items()}
                for slug, entry in baseline["configs"].items()}
    seed = baseline.get("gate_seed")
    new = build_baseline(per_seed, seed, baseline.get("spec"), baseline.get("torch_version"), baseline.get("machine"),
                         baseline.get("cpu_capability"))
    keep = {k: baseline[k] for k in ("platform", "measured_on") if k in baseline}
    if "cpu_capability" not in baseline:
        new.pop("cpu_capability")  # unknown then, not None: environment_warnings tells the two apart
    return new | keep | {"per_byte": {"val_tokens": counts[0], "val_bytes": counts[1]},
                         "derivation": new["derivation"] + f"; converted from best_val_loss (nats per character) "
                         f"recorded {baseline.get('measured_on', 'before')} by x val_tokens / (ln 2 x val_bytes) of "
                         f"the spec's val windows ({counts[0]:,} tokens, {counts[1]:,} bytes)"}


def compare(baseline: dict, results: dict[str, dict[int, float | None]], tolerance: float | None = None) -> list[dict]:
    """One row per baseline config: baseline, now, delta, allowed, verdict (VERDICTS)."""
    seed = baseline.get("gate_seed")
    rows = []
    for slug, entry in baseline["configs"].items():
        now = results.get(slug, {}).get(seed) if seed is not None else next(iter(results.get(slug, {}).values()), None)
        allowed = tolerance if tolerance is not None else float(entry.get("tolerance", MIN_TOLERANCE))
        base = float(entry[metric_of(baseline)])
        if now is None or not math.isfinite(now):
            rows.append({"config": slug, "baseline": base, "now": None, "delta": None, "allowed": allowed,
                         "verdict": MISSING})
            continue
        delta = now - base
        verdict = REGRESSED if delta > allowed else IMPROVED if delta < -allowed else OK
        rows.append({"config": slug, "baseline": base, "now": now, "delta": delta, "allowed": allowed,
                     "identical": now == base, "verdict": verdict})
    return rows


def passed(rows: list[dict]) -> bool:
    return all(r["verdict"] == OK for r in rows)


def failure_lines(rows: list[dict]) -> list[str]:
    """What each kind of failure means and what to do about it, one line per kind present."""
    lines = []
    for verdict, advice in VERDICTS.items():
        names = [r["config"] for r in rows if r["verdict"] == verdict]
        if names and advice:
            lines.append(f"{verdict.lower()}: {', '.join(names)}: {advice}")
    return lines


def environment_warnings(baseline: dict, torch_version: str, machine: str, cpu_capability: str | None,
                         rows: list[dict] | None = None) -> list[str]:
    """Lines naming each way this environment differs from the one the baseline was recorded in.

    The CPU capability is named with the machine: one model name ('AMD EPYC') can run AVX2 on one
    host and AVX512 on another. A baseline that does not record one (written before it was) cannot
    rule that out, which is worth a line once the numbers are not identical (`rows`: compare()'s).
    """
    out = []
    then_cap = baseline.get("cpu_capability")
    cap = f" (CPU capability {cpu_capability})" if cpu_capability else ""
    then_machine = baseline.get("machine")
    if baseline.get("torch_version") not in (None, torch_version):
        out.append(f"baseline recorded with torch {baseline['torch_version']!r}, this is {torch_version!r}: "
                   f"numbers will not be identical and may move by more than seed noise")
    if then_machine is not None and then_machine != machine:
        then_cap_text = f"CPU capability {then_cap}" if then_cap else "no CPU capability recorded"
        out.append(f"baseline recorded with machine {then_machine!r} ({then_cap_text}), this is {machine!r}{cap}: "
                   f"numbers will not be identical and may move by more than seed noise")
    elif then_cap is not None and then_cap != cpu_capability:
        out.append(f"baseline recorded on {machine!r} with CPU capability {then_cap}, this one runs "
                   f"{cpu_capability}: the same CPU name with another instruction set rounds floats differently; "
                   f"numbers will not be identical and may move by more than seed noise")
    elif then_cap is None and then_machine is not None and any(r.get("identical") is False for r in rows or ()):
        out.append(f"numbers are not identical on {machine!r}{cap}; the baseline does not record its CPU capability, "
                   f"so a different instruction set behind the same CPU name cannot be ruled out (AVX2 and AVX512 "
                   f"kernels round differently)")
    return out

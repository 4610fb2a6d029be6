"""A decay branched from another run's stable phase: one rung of a budget ladder (training/budgets.py plans
them). The branch is the run its config names, trained from the parent's checkpoint at its decay start
instead of from step 0: the same weights, optimizer state, batch order, RNG and books there, so every
metric line and weight equals a run trained to that budget from the start (warmup-stable-decay's stable
phase does not depend on the budget; tests/training/test_branch.py checks equality).

  branch   parent run folder + a branch config + its folder -> the branch trained to its budget

A branch folder is a run folder like any other. It is set up under its lock: config.json and vocab.json
(run.prepare_fresh), the parent's metric lines up to the branch step, the parent's kept checkpoint there
as its resume.pt; then it trains as a resumed run does (Trainer.restore, the same loop, finalize), its
summary naming branched_from. A kill before its running summary leaves a folder branch() sets up again; a
kill after leaves an interrupted run that run.resume (`anatomy train --resume`) continues from its own
latest checkpoint, as for any run. The parent is only read (its kept checkpoint, config, metrics and
summary), never locked: a parent still training has either written its kept checkpoint or not.
"""

from __future__ import annotations

from pathlib import Path

from anatomy_cli.data.load import load_corpus
from anatomy_cli.spec.config import RunConfig
from anatomy_cli.store import runs
from anatomy_cli.store.summary import RunSummary
from anatomy_cli.training.budgets import branch_problem
from anatomy_cli.training.checkpoint import load_checkpoint, load_run_config, save_checkpoint
from anatomy_cli.training.devices import resolve_device
from anatomy_cli.training.run import (
    check_corpus,
    check_fits,
    data_source,
    drop_stale,
    finalize,
    prepare_fresh,
    recorded,
    resolve_config,
    resume,
)
from anatomy_cli.training.trainer import Progress, Trainer


def branch(parent: Path, cfg: RunConfig, run_dir: Path, progress: Progress | None = None, stop=None,
           extra_summary: dict | None = None) -> dict:
    """Train cfg into run_dir as a decay from `parent`'s stable phase, starting at cfg's decay start
    (cfg.train.decay_start) from the parent's kept checkpoint there; returns its summary. A completed
    branch in run_dir is returned as it is; an interrupted one is resumed (run.resume). RunError (one
    line) when the parent cannot lend that step: not a branchable config (budgets.branch_problem), no
    kept checkpoint there yet, another corpus."""
    parent, run_dir = Path(parent), Path(run_dir)
    status = runs.run_status(run_dir) if runs.is_run_dir(run_dir) else None
    if status == runs.COMPLETED:
        return runs.read_summary(run_dir)
    if status == runs.INTERRUPTED and runs.read_summary(run_dir).get("branched_from"):
        return resume(run_dir, progress, stop)
    cfg, corpus, rows = _lend(parent, cfg, run_dir)
    step = cfg.train.decay_start
    check_fits(cfg, resolve_device(cfg.train.device))
    runs.check_replace(run_dir, True)
    run_dir.mkdir(parents=True, exist_ok=True)
    with runs.RunLock(run_dir):
        runs.check_replace(run_dir, True)
        origin = {"branched_from": {"run": str(parent), "run_id": parent.name, "step": step}}
        carried = prepare_fresh(cfg, run_dir, corpus, RunSummary(**(extra_summary or {}), **origin).carried())
        runs.atomic_write_text(run_dir / runs.METRICS, "".join(runs.json_line(r) for r in rows))
        save_checkpoint(load_checkpoint(runs.kept_checkpoint(parent, step)), run_dir / runs.RESUME)  # as its own
        with recorded(run_dir, carried):
            tr = Trainer(cfg, run_dir, corpus, progress)
            tr.restore()  # the parent's weights, optimizer, batch order, RNG and books at `step`
            drop_stale(run_dir)
            status, diverged_at = tr.run(stop)
            return finalize(tr, status, diverged_at, carried)


def _lend(parent: Path, cfg: RunConfig, run_dir: Path):
    """(cfg resolved on the parent's corpus, that corpus, the parent's metric lines up to the branch step),
    or a RunError saying why the parent cannot lend the step."""
    parent_cfg, step = load_run_config(parent), cfg.train.decay_start
    before = RunSummary.model_validate(runs.read_summary(parent) or {})
    corpus = load_corpus(data_source(parent_cfg, before), parent_cfg.data.val_frac, parent_cfg.model.ctx_len)
    cfg = resolve_config(cfg, corpus)
    problem = branch_problem(parent_cfg, cfg, step)
    if problem is not None:
        raise runs.RunError(f"{run_dir.name} cannot branch from {parent} at step {step}: {problem}")
    kept = runs.kept_checkpoint(parent, step)
    if not kept.is_file():
        raise runs.RunError(f"{parent} has no kept checkpoint at step {step} ({kept.name}): train it with "
                            f"train.keep_checkpoints holding {step}, past that step")
    check_corpus(parent, parent_cfg, before, corpus)  # the parent's data, as a resume of it would read
    return cfg, corpus, _parent_rows(parent, step)


def _parent_rows(parent: Path, step: int) -> list[dict]:
    """The parent's metric lines up to `step` (the branch's own up to there); RunError while they do not
    reach it."""
    rows = [r for r in runs.read_metrics(parent) if r["step"] <= step]
    if not any(r["step"] == step for r in rows):  # a parent resumed from before `step` is computing them again
        raise runs.RunError(f"{parent}'s metrics.jsonl does not reach step {step} yet (it is being trained again "
                            f"from an earlier checkpoint); branch once it passes step {step}")
    return rows

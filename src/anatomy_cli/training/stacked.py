"""Stacked seeds: the runs of one config that differ only by seed train as one batched model.

    StackedTrainer   S members -> one step: [S, B, T] batches through vmap(functional_call(LM)),
                     one backward, per-member clipping, one AdamW over [S, ...] parameters
    Member           one run inside the stack: its config, folder, RunLog, BatchSampler, and a lone
                     LM that holds its slice for writing (checkpoints, best/last weights, samples)
    stack_problem    why a config cannot train stacked (None: it can), probed on a tiny batch

Design: torch.func (stack_module_state + functional_call + vmap), not a stacked-weights module.
vmap batches the unchanged model code, so every part stacks with no code of its own: the five,
the modern parts, GDN, and each part that lands later, as long as its forward is vmap-able. A
stacked-weights module would need a batched twin of every layer (norms, RoPE, attention, GDN, ...),
a second implementation of each part to keep equal to the first. A part that vmap cannot batch
(data-dependent shapes, host reads of tensor values) is found by stack_problem before training
and its runs train alone, with the reason in summary.json's stack_note.

Each member is the run trained alone, as far as anything downstream can tell:
- init: member i's LM is built after torch.manual_seed(seed_i) with seed_i as keyed init's key,
  exactly as Trainer builds it, and stacked from there (stack_module_state copies each member's);
- batches: its own BatchSampler(seed_i); validation windows are seed-free, so shared;
- AdamW: elementwise, so one optimizer over [S, ...] tensors is S optimizers; the decay groups
  are decided on the member's shapes (make_optimizer lead=1); the state a member checkpoints is
  its slice, in the lone run's state_dict layout (a member can resume alone, and back);
- clipping: each member's gradient is scaled by its own total norm (clip_grad_norm_'s formula);
- divergence: a member's RunLog notes it; at its next log point (where a lone run stops) the
  member is finished 'diverged' and removed from the stack (its slices dropped: it costs nothing
  from there), and the others go on. Member losses are independent sums, so a NaN in one never
  reaches another's gradient;
- folders: each member writes its own metrics.jsonl, checkpoints, weights, summary (train.finalize).
Batched matmuls round differently from single ones, so a member equals its lone run within float
rounding (tests: fp32 best val loss within 1e-4), not bit for bit. Timings (step_time_ms,
tokens_per_s) are the stack's: a member's tokens over the stack's training time.
"""

from __future__ import annotations

import contextlib
import copy
import math
from pathlib import Path

import torch
from torch.func import functional_call, stack_module_state, vmap

from anatomy_cli.data.batches import BatchSampler, fixed_windows, run_eval_counts
from anatomy_cli.data.corpus import Corpus
from anatomy_cli.model import LM
from anatomy_cli.spec import parts as registry
from anatomy_cli.spec.config import RunConfig
from anatomy_cli.store import runs
from anatomy_cli.training.devices import autocast, resolve_device
from anatomy_cli.training.trainer import (
    Cadence,
    Progress,
    ResumeState,
    RunLog,
    StepRecord,
    add_terms,
    gqa_expanded,
    lr_at,
    make_optimizer,
    progress_event,
    set_expand_kv,
    train_loop,
    training_device,
)

TERMS = ("moe_aux_loss", "dsa_indexer_loss")  # the aux outputs add_terms reads (not expert_counts)


def stack_problem(cfg: RunConfig) -> str | None:
    """None when cfg's model trains stacked; else one line saying why not (a tiny vmapped
    forward and backward of two members, on the CPU, raised it)."""
    if cfg.train.compile:
        return "compiled runs train alone (torch.compile of the stacked step is not built yet)"
    said = [p for p in registry.used(cfg.model.model_dump(), {}).values() if p.stack]
    if said:  # a part that says it cannot (spec/parts.py: Part.stack)
        return f"cannot train stacked: the part {said[0].name} says {said[0].stack}"
    model = cfg.model if cfg.model.vocab_size else cfg.model.model_copy(update={"vocab_size": 64})  # any size probes
    try:
        members = [LM(model) for _ in range(2)]
        params, _ = stack_module_state(members)
        T = min(model.ctx_len, 8)
        x = torch.zeros(2, 1, T, dtype=torch.long)
        def total(p, a, b):  # the training step's loss, as member_losses computes it
            logits, loss, aux = functional_call(members[0], p, (a, b), {"aux": True})
            return add_terms(cfg.train, logits, loss, {k: v for k, v in aux.items() if k in TERMS})[0]

        vmap(total)(params, x, x).sum().backward()
    except Exception as err:  # noqa: BLE001 - any failure means: train alone, and say why
        return f"cannot train stacked ({err.__class__.__name__}: {' '.join(str(err).split())[:200]})"
    return None


class Member:
    """One run in a stack; has the attributes train.summarize / write_samples / finalize read."""

    def __init__(self, cfg: RunConfig, run_dir: Path, corpus: Corpus, device: torch.device):
        t = cfg.train
        self.cfg, self.run_dir, self.corpus, self.device = cfg, Path(run_dir), corpus, device
        torch.manual_seed(cfg.seed)  # the lone run's init, order or keyed (Trainer does the same)
        self.model = LM(cfg.model, cfg.seed).to(device)
        self.sampler = BatchSampler(corpus.train, t.batch_size, cfg.model.ctx_len, cfg.seed, device)
        self.log = RunLog(cfg, run_dir)
        self.step, self.elapsed, self.train_time = 0, 0.0, 0.0


class StackedTrainer:
    """Members that differ only by seed, stepped as one model (see the module docstring)."""

    def __init__(self, cfgs: list[RunConfig], run_dirs: list[Path], corpus: Corpus, progress: Progress | None = None):
        t = cfgs[0].train
        self.t, self.corpus, self.progress = t, corpus, progress
        self.device = training_device(t)
        self.members = [Member(c, d, corpus, self.device) for c, d in zip(cfgs, run_dirs)]
        self.base = copy.deepcopy(self.members[0].model)  # the structure functional_call runs
        set_expand_kv(self.base, gqa_expanded(cfgs[0], self.device))
        self.val = fixed_windows(corpus.val, t.batch_size, cfgs[0].model.ctx_len, t.eval_batches, self.device)
        self.autocast = autocast(self.device, t.dtype)
        counts = run_eval_counts(corpus, cfgs[0])  # the members' windows are one set: one count
        for m in self.members:  # what train.finalize reads of a Trainer besides the books
            m.val, m.autocast, m.fwd = self.val, self.autocast, m.model
            m.log.counts = counts
        self.step, self.elapsed, self.train_time = 0, 0.0, 0.0
        self.size = len(self.members)  # members at the start: the summary's `stacked`
        self.cadence = Cadence.of(t)
        self.restack(self.members)

    def restack(self, members: list[Member], opt_state: dict | None = None) -> None:
        """Stack these members' current weights (and optimizer state, when given) as the leaves."""
        self.members = members
        params, _ = stack_module_state([m.model for m in members])  # {name: [S, ...]} leaves
        self.params = {k: p.detach().requires_grad_() for k, p in params.items()}
        self.opt = make_optimizer(list(self.params.values()), self.t, self.device, lead=1)
        if opt_state is not None:
            self.opt.load_state_dict(opt_state)
        self.losses = vmap(self.member_losses, in_dims=(0, 0, 0))
        self.val_losses = vmap(self.member_val_loss, in_dims=(0, None, None))

    # ------------------------------------------------------------------ one step
    def member_losses(self, params: dict, x: torch.Tensor, y: torch.Tensor):
        """One member's (loss to minimise, cross-entropy, {term name: term}): Trainer.losses under vmap."""
        logits, loss, aux = functional_call(self.base, params, (x, y), {"aux": True})
        return add_terms(self.t, logits, loss, {k: v for k, v in aux.items() if k in TERMS})

    def member_val_loss(self, params: dict, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return functional_call(self.base, params, (x, y))[1].float()

    def train_step(self) -> None:
        lr = lr_at(self.step, self.t)
        for group in self.opt.param_groups:
            group["lr"] = lr
        batches = [m.sampler.next() for m in self.members]
        x, y = torch.stack([b[0] for b in batches]), torch.stack([b[1] for b in batches])  # [S, B, T]
        with self.autocast:
            total, loss, terms = self.losses(self.params, x, y)  # [S] each
        total.sum().backward()  # member losses are independent: each gradient is its member's own
        norms = clip_members(list(self.params.values()), self.t.grad_clip if self.t.grad_clip > 0 else math.inf)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        self.step += 1
        loss, norms = loss.detach(), norms.detach()
        for i, m in enumerate(self.members):
            m.step = self.step
            member_terms = {k: v[i].detach() for k, v in terms.items()}
            m.log.pending.append(StepRecord(self.step, lr, loss[i], norms[i], member_terms))

    @torch.no_grad()
    def evaluate(self) -> list[float]:
        total = torch.zeros(len(self.members), device=self.device)
        for x, y in self.val:
            with self.autocast:
                total += self.val_losses(self.params, x, y)
        return [v / len(self.val) for v in total.tolist()]

    # ------------------------------------------------------------------ members' files
    def sync(self) -> None:
        """Copy each member's slice into its lone LM (what checkpoints, weights and samples read)."""
        with torch.no_grad():
            for i, m in enumerate(self.members):
                for name, p in m.model.named_parameters():
                    p.copy_(self.params[name][i])

    def member_opt_state(self, i: int) -> dict:
        """Member i's AdamW state in a lone run's layout: every [S, ...] tensor sliced to its own."""
        return map_members(self.opt.state_dict(), lambda v: v[i].clone())

    def member_state(self, i: int) -> ResumeState:
        m = self.members[i]
        return m.log.resume_state(self.step, self.elapsed, self.train_time, self.member_opt_state(i),
                                  m.sampler.state())

    def checkpoint(self) -> None:
        self.sync()
        for i, m in enumerate(self.members):
            m.log.flush(self.step, durable=True)
            m.log.save_checkpoint(m.model.state_dict(), self.member_state(i))

    def restore(self) -> None:
        """Every member continues from its resume.pt; all must name the same step."""
        states = []
        for m in self.members:
            weights, best, s = m.log.read_checkpoint()
            try:
                m.model.load_state_dict(weights, strict=True)
                m.sampler.set_state(s.sampler)
            except (KeyError, ValueError, RuntimeError, TypeError) as err:
                raise m.log.misfit(err) from None
            m.log.resumed(s, weights, best)
            m.step, states.append(s)
        steps = {s.step for s in states}
        if len(steps) != 1:
            raise runs.RunError(f"stacked resume needs one step for every member, got {sorted(steps)}")
        s0 = states[0]
        torch.set_rng_state(s0.torch_rng)
        self.step, self.elapsed, self.train_time = s0.step, s0.elapsed, s0.train_time
        groups = s0.optimizer["param_groups"]
        merged = {k: {n: torch.stack([s.optimizer["state"][k][n] for s in states]) if torch.is_tensor(v) and v.dim() > 0
                      else v for n, v in v0.items()} for k, v0 in s0.optimizer["state"].items()}
        self.restack(self.members, {"state": merged, "param_groups": groups})

    def retire(self, gone: list[Member]) -> None:
        """Drop members (finished early) from the stack: their slices stop costing anything."""
        keep = [i for i, m in enumerate(self.members) if m not in gone]
        state = map_members(self.opt.state_dict(), lambda v: v[keep])
        self.sync()
        self.restack([self.members[i] for i in keep], state)

    # ------------------------------------------------------------------ the loop
    def run(self, finish, stop=None) -> None:
        """Train every member to train.steps; finish(member, status, diverged_at) writes a member's
        files when it stops (diverged: at its log point, as alone; the rest at the end)."""
        self.finish = finish  # log_point finishes diverged members with it
        if self.step == 0:
            self.eval_point()  # step 0: the untrained members' val losses
        status = train_loop(self, stop)
        if status != runs.INTERRUPTED:
            self.sync()  # a stop's checkpoint has synced already
        self.stamp_all()
        for m in self.members:
            finish(m, status, None)

    def advance(self) -> None:
        self.train_step()

    def log_point(self, evaluate: bool) -> bool:
        """Flush every member's books; a member that diverged is finished here (where it would stop
        alone) and leaves the stack. True when none is left."""
        self.eval_point(evaluate, elapsed=self.elapsed)
        gone = [m for m in self.members if m.log.diverged_at is not None]
        if gone:
            self.sync()
            for m in gone:
                self.stamp(m)
                self.finish(m, runs.DIVERGED, m.log.diverged_at)
            self.retire(gone)
        self.report()
        return not self.members

    def eval_point(self, is_eval: bool = True, elapsed: float = 0.0) -> None:
        """Flush every member's pending lines, with its val loss at an evaluation (best weights saved)."""
        vals = self.evaluate() if is_eval else [None] * len(self.members)
        if is_eval and any(v < m.log.best for v, m in zip(vals, self.members)):
            self.sync()
        for m, val in zip(self.members, vals):
            if val is not None:
                m.log.evaluated(self.step, val, m.model.state_dict)
            m.log.flush(self.step, val, elapsed)

    def stamp(self, m: Member) -> None:
        m.step, m.elapsed, m.train_time = self.step, self.elapsed, self.train_time

    def stamp_all(self) -> None:
        for m in self.members:
            self.stamp(m)

    def report(self) -> None:
        if self.progress:
            for m in self.members:
                self.progress(progress_event(self.step, self.cadence.steps, m.log, m.run_dir))


def map_members(opt_state: dict, fn) -> dict:
    """An optimizer state_dict with fn applied to each per-member tensor ([S, ...]; AdamW's step
    counts are 0-d and shared, kept as they are)."""
    state = {k: {n: fn(v) if torch.is_tensor(v) and v.dim() > 0 else v for n, v in s.items()}
             for k, s in opt_state["state"].items()}
    return {"state": state, "param_groups": opt_state["param_groups"]}


def clip_members(params: list[torch.Tensor], max_norm: float) -> torch.Tensor:
    """Scale each member's gradient by its own total norm, as clip_grad_norm_ does for one model:
    coef = min(1, max_norm / (norm + 1e-6)). Returns the members' norms before clipping, [S]."""
    grads = [p.grad for p in params if p.grad is not None]
    per = torch.stack([torch.linalg.vector_norm(g.flatten(1), dim=1) for g in grads])  # [P, S]
    norms = torch.linalg.vector_norm(per, dim=0)  # [S]
    coef = (max_norm / (norms + 1e-6)).clamp(max=1.0)
    for g in grads:
        g.mul_(coef.view(-1, *[1] * (g.dim() - 1)).to(g.dtype))
    return norms


# ------------------------------------------------------------------ a group of runs' lifecycle
def train_group(cfgs: list[RunConfig], run_dirs: list[Path], progress: Progress | None = None, stop=None,
                extras: list[dict] | None = None, resume: bool = False) -> list[dict]:
    """Train (or, resume=True, continue from their checkpoints, all at one step) runs that differ
    only by seed as one stack; each run folder ends as it would alone. Returns their summaries."""
    from anatomy_cli.data.load import run_corpus
    from anatomy_cli.store.summary import RunSummary
    from anatomy_cli.training.checkpoint import load_run_config
    from anatomy_cli.training.run import (
        check_fits,
        data_source,
        drop_stale,
        finalize,
        prepare_fresh,
        recorded,
        resolve_config,
        resume_preamble,
        resumed_at,
    )

    run_dirs = [Path(d) for d in run_dirs]
    if resume:
        cfgs = [load_run_config(d) for d in run_dirs]
    c0 = cfgs[0]
    source = c0.data.source  # a resumed stack reads a relative source from the folder it started in
    if resume:
        source = data_source(c0, RunSummary(started_in=(runs.read_summary(run_dirs[0]) or {}).get("started_in")))
    corpus = run_corpus(c0, source)
    cfgs = cfgs if resume else [resolve_config(c, corpus) for c in cfgs]
    check_fits(cfgs[0], resolve_device(c0.train.device), copies=len(cfgs))
    with contextlib.ExitStack() as held:
        carried = {}
        for cfg, d, extra in zip(cfgs, run_dirs, extras or [{}] * len(cfgs)):
            if not resume:
                runs.check_replace(d, True)
            d.mkdir(parents=True, exist_ok=True)
            held.enter_context(runs.RunLock(d))
            if resume:
                _, carried[d] = resume_preamble(d, cfg, corpus)
            else:
                carried[d] = prepare_fresh(cfg, d, corpus, RunSummary(**extra).carried())
            carried[d]["stack_note"] = None
        tr = StackedTrainer(cfgs, run_dirs, corpus, progress)
        if resume:
            tr.restore()  # a bad checkpoint raises here and leaves the runs as they were
            for d in run_dirs:
                drop_stale(d)
                carried[d] = resumed_at(carried[d], tr.step)
        for d in run_dirs:
            held.enter_context(recorded(d, carried[d]))
        done: dict[Path, dict] = {}

        def finish(m: Member, status: str, diverged_at: int | None) -> None:
            done[m.run_dir] = finalize(m, status, diverged_at, {**carried[m.run_dir], "stacked": tr.size})

        tr.run(finish, stop)
        return [done[d] for d in run_dirs]


def start_step(run_dir: Path) -> int | None:
    """The step a run would start from: 0 (fresh, or interrupted before its first checkpoint), its
    checkpoint's step (interrupted), or None when its checkpoint cannot be read (it trains alone,
    where train.resume decides)."""
    from anatomy_cli.training.checkpoint import load_checkpoint

    run_dir = Path(run_dir)
    if runs.run_status(run_dir) != runs.INTERRUPTED or not (run_dir / runs.RESUME).is_file():
        return 0
    try:
        return int(ResumeState.from_state(load_checkpoint(run_dir / runs.RESUME)).step)
    except Exception:  # noqa: BLE001 - unreadable: the lone path reports it
        return None

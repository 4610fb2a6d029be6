"""The step loop of one run: a Trainer steps the model; a RunLog keeps the run's books; a Cadence
says when the loop evaluates, logs and checkpoints.

  Trainer     model, optimizer, batches, validation windows: train_step() -> StepRecord, evaluate(),
              run(stop) -> (status, diverged_at), state() / restore() as a ResumeState
  RunLog      one run folder's books: metrics.jsonl lines, TensorBoard events, best val loss and
              best.safetensors, divergence, and the checkpoint file (resume.pt)
  Cadence     train.eval_interval / log_interval / checkpoint_every / checkpoint_minutes as answers:
              evaluate_at(step), log_at(step), checkpoint_at(step, since_s)
  train_loop  the one step loop, on a Cadence: Trainer.run and StackedTrainer.run (stacked.py) both
              call it, each with its own log point and checkpoint; progress_event is what either reports

The split lets several runs share one model step (stacked seeds: one batched model, a RunLog per
member) without the books knowing. Losses and gradient norms stay on the device as StepRecords and
are read back only at log and eval points and checkpoints (no host sync per step). Progress goes
to a callback; this module never prints.

Checkpoints (train.checkpoint_every / checkpoint_minutes; by default at every evaluation) are one
file holding everything a resume needs, replaced atomically (checkpoint.save_checkpoint), so a
complete checkpoint exists at every instant once the first is written. Before it names step s,
every metrics line up to s is on disk; lines past s (written after it, before a kill) are dropped
on resume and computed again, bit for bit.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Protocol

import torch

from anatomy_cli.data.batches import BatchSampler, bits_per_byte, fixed_windows, run_eval_counts
from anatomy_cli.data.corpus import Corpus
from anatomy_cli.model import LM
from anatomy_cli.model.moe import update_biases
from anatomy_cli.spec.config import RunConfig, TrainConfig
from anatomy_cli.store import runs
from anatomy_cli.training import tensorboard as tb_events
from anatomy_cli.training.checkpoint import load_checkpoint, read_weights, save_checkpoint, save_weights
from anatomy_cli.training.devices import (
    autocast,
    compile_model,
    configure,
    expand_gqa,
    keep_freed_memory,
    resolve_device,
    sdpa_probe,
)

Progress = Callable[[dict], None]


def lr_at(step: int, t) -> float:
    """Linear warmup to t.lr, then constant, cosine down to t.lr * t.min_lr_frac, or warmup-stable-decay:
    t.lr until t.decay_start, then down to t.lr * t.min_lr_frac over t.decay_steps, linear or 1-sqrt
    (Hägele et al. 2024, eq. 1 and sec. 3: f = 1 - p or 1 - sqrt(p), p the decay's progress, reaching the
    floor at the last step, as the warmup reaches t.lr at its last)."""
    if step < t.warmup:
        return t.lr * (step + 1) / t.warmup
    if t.schedule == "constant" or (t.schedule == "wsd" and step < t.decay_start):
        return t.lr
    if t.schedule == "wsd":
        p = min(1.0, (step + 1 - t.decay_start) / t.decay_steps)
        f = 1 - p if t.decay_shape == "linear" else 1 - math.sqrt(p)
        return t.lr * (t.min_lr_frac + (1 - t.min_lr_frac) * f)
    progress = (step - t.warmup) / max(1, t.steps - t.warmup)
    return t.lr * (t.min_lr_frac + (1 - t.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0))))


def make_optimizer(model: LM | list[torch.Tensor], t, device: torch.device, lead: int = 0) -> torch.optim.Optimizer:
    """AdamW; weight decay on matrices only (not on norm weights/biases); fused kernel when offered.

    lead: leading dimensions that are not the parameter's own (stacked seeds: 1), so the decay
    groups are decided on each member's shapes, exactly as for the run trained alone.
    """
    params = list(model.parameters() if isinstance(model, torch.nn.Module) else model)
    decay = [p for p in params if p.dim() - lead >= 2]
    no_decay = [p for p in params if p.dim() - lead < 2]
    groups = [{"params": decay, "weight_decay": t.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    kwargs = dict(lr=t.lr, betas=(t.beta1, t.beta2))
    try:
        return torch.optim.AdamW(groups, fused=device.type in ("cuda", "cpu"), **kwargs)
    except (RuntimeError, TypeError):  # older torch without a fused kernel for this device
        return torch.optim.AdamW(groups, **kwargs)


def add_terms(t, logits: torch.Tensor, loss: torch.Tensor, aux: dict) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """(loss to minimise, cross-entropy, {metric name: term}) from one forward's outputs (see
    Trainer.losses; stacked.py calls it per member under vmap)."""
    total, terms = loss, {}
    if t.z_loss > 0:
        terms["z_loss"] = t.z_loss * logits.float().logsumexp(dim=-1).square().mean()  # logits: [B, T, V], unpadded
        total = total + terms["z_loss"]
    if "moe_aux_loss" in aux:
        terms["moe_aux_loss"] = aux["moe_aux_loss"]
        total = total + t.moe_aux_loss * aux["moe_aux_loss"]
    if "dsa_indexer_loss" in aux:
        terms["dsa_indexer_loss"] = aux["dsa_indexer_loss"]
        if t.dsa_indexer_loss > 0:  # skipped at 0: the indexer then gets no gradient at all (None, no decay)
            total = total + t.dsa_indexer_loss * aux["dsa_indexer_loss"]
    return total, loss, terms


def uses_graphs(t) -> bool:
    """Whether steps run as CUDA graph replays (compile_mode "reduce-overhead"): each step and each
    evaluation batch then starts with torch.compiler.cudagraph_mark_step_begin(), and nothing a
    replay outputs is kept past its step (step records hold clones). On the CPU the same code runs
    (inductor records no graphs there; the calls are cheap), so the path is tested without a GPU.
    The default compile_mode stays "default": reduce-overhead is not yet measured faster on CUDA
    through Trainer (benchmarks/gpu_check.py measures it; RESULTS.md)."""
    return t.compile and t.compile_mode == "reduce-overhead"


def training_device(t) -> torch.device:
    """The run's device, with this process set up to train on it: threads, the CPU allocator's
    freed-memory policy, matmul precision (Trainer and StackedTrainer alike)."""
    if t.threads:
        torch.set_num_threads(t.threads)
    device = resolve_device(t.device)
    if device.type == "cpu":
        keep_freed_memory()
    configure(device)
    return device


def gqa_expanded(cfg: RunConfig, device: torch.device) -> bool:
    """devices.expand_gqa for this run's model, batch and dtype on this device."""
    t = cfg.train
    return expand_gqa(cfg.model, sdpa_probe(cfg.model, t.batch_size, device, t.dtype), device.type)


def set_expand_kv(model: torch.nn.Module, on: bool) -> None:
    """Every attention layer repeats K/V to its query heads before SDPA (devices.expand_gqa)."""
    for m in model.modules():
        if hasattr(m, "expand_kv"):
            m.expand_kv = on


@dataclass(frozen=True)
class Cadence:
    """When a training loop evaluates, logs and checkpoints, stated once for Trainer and StackedTrainer
    (torchtitan's should_validate(step) / should_log(step) shape). `step` is steps done. After each
    step train_loop asks, in this order: log_at (the log point, evaluating first when evaluate_at),
    the stop request, checkpoint_at.

    clock: seconds, read only for checkpoint_minutes, so a test can make time a function of the step
    instead of sleeping. Every other timing (elapsed_s, step time) stays on time.perf_counter.
    """

    steps: int
    eval_interval: int
    log_interval: int
    checkpoint_every: int | None = None
    checkpoint_minutes: float | None = None
    clock: Callable[[], float] = field(default=time.perf_counter, compare=False, repr=False)
    keep: tuple[int, ...] = ()  # train.keep_checkpoints: a checkpoint at each, kept (RunLog.save_checkpoint)

    @classmethod
    def of(cls, t: TrainConfig, clock: Callable[[], float] = time.perf_counter) -> Cadence:
        return cls(t.steps, t.eval_interval, t.log_interval, t.checkpoint_every, t.checkpoint_minutes, clock,
                   t.keep_checkpoints)

    def evaluate_at(self, step: int) -> bool:
        """Every eval_interval steps, and the last step (a run always ends on a measured val loss)."""
        return step % self.eval_interval == 0 or step == self.steps

    def log_at(self, step: int) -> bool:
        """A log point: pending metric lines flushed (one host read), divergence judged, progress
        reported. Every log_interval steps, and at every evaluation."""
        return self.evaluate_at(step) or step % self.log_interval == 0

    def checkpoint_at(self, step: int, since_s: float) -> bool:
        """resume.pt after this step, since_s seconds after the last one (or the loop's start): by
        checkpoint_every steps and/or checkpoint_minutes; with neither, at every evaluation. Never at
        the last step: the run ends there, with its last weights and summary instead."""
        if step >= self.steps:
            return False
        if step in self.keep:  # a branch point of a budget ladder (training/branch.py)
            return True
        if self.checkpoint_every is None and self.checkpoint_minutes is None:
            return self.evaluate_at(step)
        return ((self.checkpoint_every is not None and step % self.checkpoint_every == 0)
                or (self.checkpoint_minutes is not None and since_s >= 60 * self.checkpoint_minutes))


class Loop(Protocol):
    """What train_loop steps: a Trainer, or a StackedTrainer (all its members at one step)."""

    cadence: Cadence
    step: int  # steps done
    elapsed: float  # wall seconds since step 0, across resumes
    train_time: float  # seconds inside advance(): the summary's step time and tokens/s

    def advance(self) -> None:
        """One optimizer step, its StepRecords pending in the books."""

    def log_point(self, evaluate: bool) -> bool:
        """Flush the books, with val losses when evaluate; True: nothing is left to train."""

    def checkpoint(self) -> None:
        """Metric lines up to this step on disk, then resume.pt."""


def train_loop(tr: Loop, stop: Callable[[], bool] | None = None) -> str:
    """Step tr to its cadence's steps: COMPLETED, INTERRUPTED (stop() was true after a step: that
    step is checkpointed first) or DIVERGED (its log point said nothing is left to train)."""
    c = tr.cadence
    start = time.perf_counter() - tr.elapsed  # a resumed run's elapsed goes on from its checkpoint
    saved = c.clock()
    while tr.step < c.steps:
        t0 = time.perf_counter()
        tr.advance()
        tr.train_time += time.perf_counter() - t0
        if c.log_at(tr.step):
            tr.elapsed = time.perf_counter() - start
            if tr.log_point(c.evaluate_at(tr.step)):
                return runs.DIVERGED
        if stop is not None and stop():
            tr.elapsed = time.perf_counter() - start
            tr.checkpoint()
            return runs.INTERRUPTED
        if c.checkpoint_at(tr.step, c.clock() - saved):
            tr.elapsed = time.perf_counter() - start
            tr.checkpoint()
            saved = c.clock()
    tr.elapsed = time.perf_counter() - start
    return runs.COMPLETED


def progress_event(step: int, steps: int, log: RunLog, run_dir: Path | None = None) -> dict:
    """What a loop reports of one run at a log point. A stacked member's names its run_dir (one
    callback hears the whole stack; sweep.jobs maps the folder to a run id); a lone run's does not."""
    named = {"run_dir": str(run_dir)} if run_dir is not None else {}
    return named | {"step": step, "steps": steps, "val_loss": log.last_val, "best_val_loss": log.best,
                    "train_loss": log.train_loss}


@dataclass(frozen=True)
class StepRecord:
    """One optimizer step's numbers, kept on the device until the RunLog flushes them."""

    step: int  # steps done after this one
    lr: float
    loss: torch.Tensor  # cross-entropy of the batch, 0-d
    grad_norm: torch.Tensor  # total gradient norm before clipping, 0-d
    # The terms besides the cross-entropy, by their metrics.jsonl name, 0-d each (see Trainer.losses):
    # z_loss (train.z_loss > 0), moe_aux_loss (a mixture-of-experts model), dsa_indexer_loss (a dsa model).
    terms: dict[str, torch.Tensor] = field(default_factory=dict)


@dataclass
class ResumeState:
    """Everything besides the weights that a run needs to continue step-exactly."""

    step: int
    best: float  # best val loss so far (inf before a finite one)
    best_step: int  # -1 before a finite val loss
    ref_loss: float | None  # the untrained model's val loss: the yardstick for "exploded"
    last_val: float
    diverged_at: int | None
    elapsed: float
    train_time: float
    optimizer: dict
    sampler: torch.Tensor  # the batch generator's state
    torch_rng: torch.Tensor

    def to_state(self) -> dict:
        """Plain containers, numbers and tensors: what torch.load(weights_only=True) reads back."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_state(cls, state: dict) -> ResumeState:
        if "counters" in state:  # resume.pt of an older version: positional tensors, weights elsewhere
            (step, best_step), (best, ref, last_val, elapsed, train_time) = (
                state["counters"].tolist(), state["floats"].tolist())
            state = {**state, "step": step, "best_step": best_step, "best": best, "last_val": last_val,
                     "ref_loss": None if math.isnan(ref) else ref, "diverged_at": None, "elapsed": elapsed,
                     "train_time": train_time}
        return cls(**{f.name: state[f.name] for f in fields(cls)})


class RunLog:
    """The books of one run folder: metric lines, best weights, divergence, checkpoint files."""

    def __init__(self, cfg: RunConfig, run_dir: Path):
        self.cfg, self.run_dir = cfg, Path(run_dir)
        self.pending: list[StepRecord] = []
        self.best, self.best_step, self.ref_loss = math.inf, -1, None
        self.last_val, self.train_loss = math.nan, math.nan
        self.diverged_at: int | None = None  # the first diverged step; the loop stops at its next log point
        self.events = tb_events.for_run(self.run_dir, cfg.model_dump(mode="json"))  # None without tensorboard
        self.counts: tuple[int, int] | None = None  # (val_tokens, val_bytes): set by the trainer (bpb)

    def bpb(self, val_loss: float) -> float | None:
        """A val loss (nats per token) in bits per byte over the fixed val windows (data/batches.py)."""
        return None if self.counts is None else bits_per_byte(val_loss, *self.counts)

    def tokens(self, step: int) -> int:
        return step * self.cfg.train.batch_size * self.cfg.model.ctx_len

    def flush(self, step: int, val_loss: float | None = None, elapsed: float = 0.0, durable: bool = False) -> None:
        """Append the pending step lines (one host read for all) and, at an eval, the val loss to
        metrics.jsonl; note the first diverged step. durable: fsync (before a checkpoint names step)."""
        lines = []
        if self.pending:
            rows = [torch.stack([r.loss.float(), r.grad_norm.float(), *(v.float() for v in r.terms.values())])
                    for r in self.pending]
            for rec, (loss, norm, *extra) in zip(self.pending, torch.stack(rows).tolist()):
                lines.append({"step": rec.step, "train_loss": loss, "grad_norm": norm, "lr": rec.lr,
                              "tokens": self.tokens(rec.step)})
                lines[-1].update(zip(rec.terms, extra))  # z_loss, moe_aux_loss: besides the CE (train_loss)
                self.note(rec.step, loss)
            self.train_loss = lines[-1]["train_loss"]
            self.pending = []
        if val_loss is not None:
            if not lines or lines[-1]["step"] != step:
                lines.append({"step": step, "tokens": self.tokens(step)})
            lines[-1].update(val_loss=val_loss, elapsed_s=round(elapsed, 3))
            lines[-1].update({} if self.counts is None else {"val_bpb": self.bpb(val_loss)})
            self.note(step, val_loss)
        runs.append_text(self.run_dir / runs.METRICS, "".join(runs.json_line(r) for r in lines), durable)
        if self.events is not None:
            self.events.rows(lines)

    def note(self, step: int, loss: float) -> None:
        if self.diverged_at is None and self.is_diverged(loss):
            self.diverged_at = step

    def is_diverged(self, loss: float) -> bool:
        if not math.isfinite(loss):
            return True
        return self.ref_loss is not None and loss > self.cfg.train.diverge_factor * self.ref_loss

    def evaluated(self, step: int, val: float, weights: Callable[[], dict]) -> None:
        """Book a val loss; a new best saves `weights()` (a state dict) as best.safetensors."""
        self.last_val = val
        if self.ref_loss is None:
            self.ref_loss = val
        if val < self.best:
            self.best, self.best_step = val, step
            save_weights(weights(), self.run_dir / runs.BEST)

    def resume_state(self, step: int, elapsed: float, train_time: float, optimizer: dict,
                     sampler: torch.Tensor) -> ResumeState:
        """This run's resume state at `step`: the books from here, the counters and states given."""
        return ResumeState(step, self.best, self.best_step, self.ref_loss, self.last_val, self.diverged_at,
                           elapsed, train_time, optimizer, sampler, torch.get_rng_state())

    def misfit(self, err: Exception) -> runs.RunError:
        """The one-line error for a checkpoint whose weights or states do not load into this run."""
        detail = " ".join(str(err).split())[:300]
        return runs.RunError(f"resume state in {self.run_dir} does not fit this run: {detail}")

    def save_checkpoint(self, weights: dict, state: ResumeState) -> None:
        """resume.pt: weights, the best weights when they are not these, and the resume state. At a step of
        train.keep_checkpoints the same file is kept as kept-<step>.pt first: a kill between the two
        leaves resume.pt at an earlier step, whose resume reaches this step again and keeps it then."""
        best = read_weights(self.run_dir / runs.BEST) if 0 <= state.best_step < state.step else None
        ckpt = {"model": weights, "best_model": best, **state.to_state()}
        if state.step in self.cfg.train.keep_checkpoints:
            save_checkpoint(ckpt, runs.kept_checkpoint(self.run_dir, state.step))
        save_checkpoint(ckpt, self.run_dir / runs.RESUME)

    def read_checkpoint(self) -> tuple[dict, dict | None, ResumeState]:
        """(weights, best weights, state) of resume.pt, changing nothing. Best weights None: the weights
        are the best (or there is none yet); an older version's resume.pt has its weights in last."""
        ckpt = load_checkpoint(self.run_dir / runs.RESUME)
        try:
            state = ResumeState.from_state(ckpt)
        except (KeyError, TypeError, ValueError, AttributeError) as err:
            raise runs.RunError(f"resume state in {self.run_dir} does not fit this run: {err!r}") from None
        if "model" not in ckpt:  # an older resume.pt; its best.safetensors stays as it is
            return read_weights(self.run_dir / runs.LAST), None, state
        return ckpt["model"], ckpt.get("best_model"), state

    def resumed(self, state: ResumeState, weights: dict, best: dict | None) -> None:
        """Take the books of a checkpoint: best.safetensors back to its best weights (a later best may
        have been written before a kill), and metric lines past its step dropped (they come again), from
        the TensorBoard events too."""
        self.best, self.best_step, self.ref_loss = state.best, state.best_step, state.ref_loss
        self.last_val, self.diverged_at = state.last_val, state.diverged_at
        if best is not None or state.best_step == state.step:
            save_weights(weights if best is None else best, self.run_dir / runs.BEST)
        elif state.best_step < 0:
            (self.run_dir / runs.BEST).unlink(missing_ok=True)
        rows = [r for r in runs.read_metrics(self.run_dir) if r["step"] <= state.step]
        runs.atomic_write_text(self.run_dir / runs.METRICS, "".join(runs.json_line(r) for r in rows))
        if self.events is not None:  # one event file again, each kept line once (tensorboard.resumed)
            self.events = tb_events.resumed(self.run_dir, self.cfg.model_dump(mode="json"), rows, state.elapsed)

    def close(self) -> None:
        if self.events is not None:
            self.events.close()


class Trainer:
    """One model and its optimizer, batches and validation windows, stepping one run's RunLog."""

    def __init__(self, cfg: RunConfig, run_dir: Path, corpus: Corpus, progress: Progress | None = None):
        t = cfg.train
        self.cfg, self.run_dir, self.corpus, self.progress = cfg, Path(run_dir), corpus, progress
        self.device = training_device(t)
        torch.manual_seed(cfg.seed)  # model init depends on the seed alone (model.init_key: how)
        self.model = LM(cfg.model, cfg.seed).to(self.device)
        set_expand_kv(self.model, gqa_expanded(cfg, self.device))
        self.fwd = compile_model(self.model, t.compile_mode) if t.compile else self.model
        self.graphs = uses_graphs(t)
        self.opt = make_optimizer(self.model, t, self.device)
        self.sampler = BatchSampler(corpus.train, t.batch_size, cfg.model.ctx_len, cfg.seed, self.device)
        self.val = fixed_windows(corpus.val, t.batch_size, cfg.model.ctx_len, t.eval_batches, self.device)
        self.autocast = autocast(self.device, t.dtype)
        self.step, self.elapsed, self.train_time = 0, 0.0, 0.0
        self.last: StepRecord | None = None  # the latest step's record
        self.log = RunLog(cfg, run_dir)
        self.log.counts = run_eval_counts(corpus, cfg)
        self.cadence = Cadence.of(t)

    # ------------------------------------------------------------------ one step
    def losses(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
        """(loss to minimise, cross-entropy, {metric name: term}) of one batch, all on the device (no
        host read).

        z_loss (train.z_loss > 0): the term z_loss * mean over positions of logsumexp(logits)^2 (PaLM,
        Chowdhery et al. 2022, sec. 5), added to the loss. moe_aux_loss (a mixture-of-experts model):
        the model's load-balancing loss, unscaled; train.moe_aux_loss times it is added.
        dsa_indexer_loss (a dsa model): the indexer's KL loss (model/dsa.py), unscaled;
        train.dsa_indexer_loss times it is added when > 0 (it trains the indexer alone). Evaluation adds
        none. The deepseek router has no balance term: train_step moves its selection biases after the
        optimizer step instead (moe.update_biases, train.moe_bias_rate).
        """
        return self.forward_terms(x, y)[:3]

    def forward_terms(self, x: torch.Tensor, y: torch.Tensor):
        """losses(x, y) and the forward's aux dict (its expert_counts: what the bias update reads)."""
        with self.autocast:
            logits, loss, aux = self.fwd(x, y, aux=True)
        return (*add_terms(self.cfg.train, logits, loss, aux), aux)

    def train_step(self) -> StepRecord:
        t = self.cfg.train
        lr = lr_at(self.step, t)
        for group in self.opt.param_groups:
            group["lr"] = lr
        x, y = self.sampler.next()
        if self.graphs:
            torch.compiler.cudagraph_mark_step_begin()  # a new step: the last replay's outputs may be reused
        total, loss, terms, aux = self.forward_terms(x, y)
        total.backward()
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), t.grad_clip if t.grad_clip > 0 else math.inf)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        if self.cfg.model.moe_router == "deepseek":  # aux-loss-free balancing: the bias, off the loss (model/moe.py)
            update_biases(self.model, aux["expert_counts"], t.moe_bias_rate)
        self.step += 1
        keep = (lambda v: v.detach().clone()) if self.graphs else (lambda v: v.detach())  # graph outputs die next step
        self.last = StepRecord(self.step, lr, keep(loss), keep(norm), {k: keep(v) for k, v in terms.items()})
        return self.last

    def train_steps(self, n: int) -> None:
        """n steps that nobody books (a timing pass): no metrics, no checkpoint."""
        for _ in range(n):
            self.train_step()

    def sync(self) -> None:
        """Wait until every queued step has run: one host read of the last loss (+ CUDA synchronize)."""
        if self.last is not None:
            float(self.last.loss)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    @torch.no_grad()
    def evaluate(self) -> float:
        self.model.eval()
        total = torch.zeros((), device=self.device)
        for x, y in self.val:  # every window [B, T]: one shape, so a graph is recorded once
            if self.graphs:
                torch.compiler.cudagraph_mark_step_begin()
            with self.autocast:
                _, loss = self.fwd(x, y)
            total += loss.float()  # read before the next replay
        self.model.train()
        return float(total) / len(self.val)

    # ------------------------------------------------------------------ state
    def state(self) -> ResumeState:
        return self.log.resume_state(self.step, self.elapsed, self.train_time, self.opt.state_dict(),
                                     self.sampler.state())

    def checkpoint(self) -> None:
        """Metric lines up to this step on disk, then resume.pt replaced in one rename."""
        self.log.flush(self.step, durable=True)
        self.log.save_checkpoint(self.model.state_dict(), self.state())

    def restore(self) -> None:
        """Continue from resume.pt: weights, optimizer, batch order, RNG, counters and books."""
        weights, best, s = self.log.read_checkpoint()
        try:
            self.model.load_state_dict(weights, strict=True)
            self.opt.load_state_dict(s.optimizer)
            self.sampler.set_state(s.sampler)
            torch.set_rng_state(s.torch_rng)
        except (KeyError, ValueError, RuntimeError, TypeError) as err:
            raise self.log.misfit(err) from None
        self.step, self.elapsed, self.train_time = s.step, s.elapsed, s.train_time
        self.log.resumed(s, weights, best)

    # ------------------------------------------------------------------ the loop
    def run(self, stop: Callable[[], bool] | None = None) -> tuple[str, int | None]:
        """Train to cfg.train.steps, or until diverged or stop() is true: (status, diverged_at)."""
        if self.step == 0 and not (self.run_dir / runs.METRICS).exists():
            self.log.flush(0, self.eval_point())  # step 0: the untrained model's val loss
        status = train_loop(self, stop)
        return status, self.log.diverged_at if status == runs.DIVERGED else None

    def advance(self) -> None:
        self.log.pending.append(self.train_step())

    def log_point(self, evaluate: bool) -> bool:
        """Flush (the val loss too, when evaluate) and report; True when diverged: a lone run stops
        at the log point that sees it."""
        self.log.flush(self.step, self.eval_point() if evaluate else None, self.elapsed)
        if self.log.diverged_at is not None:
            return True
        self.report()
        return False

    def eval_point(self) -> float:
        val = self.evaluate()
        self.log.evaluated(self.step, val, self.model.state_dict)
        return val

    def report(self) -> None:
        if self.progress:
            self.progress(progress_event(self.step, self.cadence.steps, self.log))

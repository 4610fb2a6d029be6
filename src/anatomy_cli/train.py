"""One training run: RunConfig + run directory -> config.json, metrics.jsonl, weights, summary.json.

The step loop keeps losses and gradient norms on the device and reads them back only at log and
eval points (no host sync per step). Progress goes to a callback; this module never prints.
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import platform
import time
from collections.abc import Callable
from pathlib import Path

import torch

from . import components, runs, tb_events
from .checkpoint import load_run_config, load_state, load_weights, save_state, save_weights
from .config import ConfigError, RunConfig
from .data import BatchSampler, Corpus, fixed_windows, load_corpus
from .devices import (accelerator_name, autocast, compile_model, configure, matmul_precision, peak_rss_bytes,
                      resolve_device, sdpa_kernel)
from .lockfile import identity
from .model import LM
from .sample import generate

Progress = Callable[[dict], None]


def hardware(device: torch.device) -> str:
    if device.type != "cpu":
        return accelerator_name(device)
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return f"{line.split(':', 1)[1].strip()} ({torch.get_num_threads()} threads)"
    return f"{platform.processor() or platform.machine()} ({torch.get_num_threads()} threads)"


def keep_freed_memory() -> bool:
    """Let glibc keep freed activation buffers for reuse instead of handing them back to the OS.

    By default glibc serves large blocks with mmap and returns freed heap tops with brk, so every CPU
    training step page-faults its activations in again: ~9,000 faults and ~25 ms of system time per
    seed-size step on the 2-core dev machine. With the mmap threshold at its 32 MiB maximum and
    trimming off, a step faults ~100 times and runs 2-4% faster (the same effect jemalloc/tcmalloc
    give). The price is that the process keeps its peak heap. Linux glibc only; False elsewhere.
    """
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3  # <malloc.h>
    return bool(libc.mallopt(m_mmap_threshold, 32 << 20)) and bool(libc.mallopt(m_trim_threshold, 1 << 30))


def lr_at(step: int, t) -> float:
    """Linear warmup to t.lr, then constant or cosine down to t.lr * t.min_lr_frac."""
    if step < t.warmup:
        return t.lr * (step + 1) / t.warmup
    if t.schedule == "constant":
        return t.lr
    progress = (step - t.warmup) / max(1, t.steps - t.warmup)
    return t.lr * (t.min_lr_frac + (1 - t.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0))))


def resolve_config(cfg: RunConfig, corpus: Corpus) -> RunConfig:
    """Fill model.vocab_size from the data (or check it matches)."""
    n = len(corpus.vocab)
    if cfg.model.vocab_size not in (None, n):
        raise ConfigError(f"model.vocab_size={cfg.model.vocab_size} but the corpus has {n} distinct characters")
    return cfg.model_copy(update={"model": cfg.model.model_copy(update={"vocab_size": n})})


def make_optimizer(model: LM, t, device: torch.device) -> torch.optim.Optimizer:
    """AdamW; weight decay on matrices only (not on norm weights/biases); fused kernel when offered."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": t.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    kwargs = dict(lr=t.lr, betas=(t.beta1, t.beta2))
    try:
        return torch.optim.AdamW(groups, fused=device.type in ("cuda", "cpu"), **kwargs)
    except (RuntimeError, TypeError):  # older torch without a fused kernel for this device
        return torch.optim.AdamW(groups, **kwargs)


class Trainer:
    """Holds the state of one run so it can be checkpointed and resumed step-exactly."""

    def __init__(self, cfg: RunConfig, run_dir: Path, corpus: Corpus, progress: Progress | None = None):
        t = cfg.train
        self.cfg, self.run_dir, self.corpus, self.progress = cfg, Path(run_dir), corpus, progress
        if t.threads:
            torch.set_num_threads(t.threads)
        self.device = resolve_device(t.device)
        if self.device.type == "cpu":
            keep_freed_memory()
        configure(self.device)
        torch.manual_seed(cfg.seed)  # model init depends on the seed alone
        self.model = LM(cfg.model).to(self.device)
        self.fwd = compile_model(self.model, t.compile_mode) if t.compile else self.model
        self.opt = make_optimizer(self.model, t, self.device)
        self.sampler = BatchSampler(corpus.train, t.batch_size, cfg.model.ctx_len, cfg.seed, self.device)
        self.val = fixed_windows(corpus.val, t.batch_size, cfg.model.ctx_len, t.eval_batches, self.device)
        self.autocast = autocast(self.device, t.dtype)
        self.step, self.best, self.best_step, self.ref_loss = 0, math.inf, -1, None
        self.last_val, self.elapsed, self.train_time = math.nan, 0.0, 0.0
        # (step, lr, cross-entropy, grad norm, {z_loss, moe_aux_loss: value} as present): device
        # tensors until the next flush
        self.pending: list[tuple[int, float, torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]] = []
        self.events = tb_events.for_run(self.run_dir, cfg.model_dump(mode="json"))  # None without tensorboard

    # ------------------------------------------------------------------ state
    def save_resume(self) -> None:
        # resume.pt is the commit mark of a checkpoint: drop the old one before last.safetensors
        # changes, so a kill between the two writes leaves no checkpoint rather than a mismatched one.
        (self.run_dir / runs.RESUME).unlink(missing_ok=True)
        save_weights(self.model, self.run_dir / runs.LAST)
        state = {
            "optimizer": self.opt.state_dict(),
            "sampler": self.sampler.state(),
            "torch_rng": torch.get_rng_state(),
            "counters": torch.tensor([self.step, self.best_step], dtype=torch.long),
            "floats": torch.tensor([self.best, self.ref_loss or math.nan, self.last_val, self.elapsed,
                                    self.train_time], dtype=torch.float64),
        }
        save_state(state, self.run_dir / runs.RESUME)

    def load_resume(self) -> None:
        state = load_state(self.run_dir / runs.RESUME)
        load_weights(self.model, self.run_dir / runs.LAST)
        try:
            self.opt.load_state_dict(state["optimizer"])
            self.sampler.set_state(state["sampler"])
            torch.set_rng_state(state["torch_rng"])
            self.step, self.best_step = (int(v) for v in state["counters"])
            self.best, ref, self.last_val, self.elapsed, self.train_time = (float(v) for v in state["floats"])
        except (KeyError, ValueError, RuntimeError) as err:
            raise runs.RunError(f"resume state in {self.run_dir} does not fit this run: {err}") from None
        self.ref_loss = None if math.isnan(ref) else ref
        # Drop metric lines past the saved step (none, unless the process died after a flush).
        rows = [r for r in runs.read_metrics(self.run_dir) if r["step"] <= self.step]
        runs.atomic_write_text(self.run_dir / runs.METRICS, "".join(runs.json_line(r) for r in rows))

    # ------------------------------------------------------------------ loop pieces
    @torch.no_grad()
    def evaluate(self) -> float:
        self.model.eval()
        total = torch.zeros((), device=self.device)
        for x, y in self.val:
            with self.autocast:
                _, loss = self.fwd(x, y)
            total += loss.float()
        self.model.train()
        return float(total) / len(self.val)

    def losses(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
        """(loss to minimise, cross-entropy, {metric name: value}) of one batch, all on the device.

        z_loss (train.z_loss > 0): the term z_loss * mean over positions of logsumexp(logits)^2 (PaLM,
        Chowdhery et al. 2022, sec. 5), added to the loss. moe_aux_loss (a mixture-of-experts model):
        the model's load-balancing loss, unscaled; train.moe_aux_loss times it is added. Evaluation
        adds neither.
        """
        with self.autocast:
            logits, loss, aux = self.fwd(x, y, aux=True)
        t, total, terms = self.cfg.train, loss, {}
        if t.z_loss > 0:
            terms["z_loss"] = t.z_loss * logits.float().logsumexp(dim=-1).square().mean()  # logits: [B, T, V]
            total = total + terms["z_loss"]
        if "moe_aux_loss" in aux:
            terms["moe_aux_loss"] = aux["moe_aux_loss"]
            total = total + t.moe_aux_loss * aux["moe_aux_loss"]
        return total, loss, terms

    def train_step(self) -> None:
        t = self.cfg.train
        lr = lr_at(self.step, t)
        for group in self.opt.param_groups:
            group["lr"] = lr
        x, y = self.sampler.next()
        total, loss, terms = self.losses(x, y)
        total.backward()
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), t.grad_clip if t.grad_clip > 0 else math.inf)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        self.step += 1
        self.pending.append((self.step, lr, loss.detach(), norm.detach(), {k: v.detach() for k, v in terms.items()}))

    def flush(self, val_loss: float | None = None) -> int | None:
        """Write pending per-step lines (one host read for all of them); return a diverged step."""
        lines, diverged = [], None
        if self.pending:
            rows = [torch.stack([l.float(), n.float(), *(v.float() for v in terms.values())])
                    for _, _, l, n, terms in self.pending]
            values = torch.stack(rows).tolist()
            for (step, lr, _, _, terms), (loss, norm, *extra) in zip(self.pending, values):
                tokens = step * self.cfg.train.batch_size * self.cfg.model.ctx_len
                lines.append({"step": step, "train_loss": loss, "grad_norm": norm, "lr": lr, "tokens": tokens})
                lines[-1].update(zip(terms, extra))  # z_loss, moe_aux_loss: besides the CE (train_loss)
                if diverged is None and self.is_diverged(loss):
                    diverged = step
            self.pending = []
        if val_loss is not None:
            if not lines or lines[-1]["step"] != self.step:
                lines.append({"step": self.step, "tokens": self.step * self.cfg.train.batch_size * self.cfg.model.ctx_len})
            lines[-1].update(val_loss=val_loss, elapsed_s=round(self.elapsed, 3))
            if diverged is None and self.is_diverged(val_loss):
                diverged = self.step
        with open(self.run_dir / runs.METRICS, "a", encoding="utf-8") as f:
            f.write("".join(runs.json_line(r) for r in lines))
        if self.events is not None:
            self.events.rows(lines)
        return diverged

    def is_diverged(self, loss: float) -> bool:
        if not math.isfinite(loss):
            return True
        return self.ref_loss is not None and loss > self.cfg.train.diverge_factor * self.ref_loss

    def eval_point(self) -> float:
        val = self.evaluate()
        self.last_val = val
        if self.ref_loss is None:
            self.ref_loss = val  # the untrained model's loss: the yardstick for "exploded"
        if val < self.best:
            self.best, self.best_step = val, self.step
            save_weights(self.model, self.run_dir / runs.BEST)
        return val

    def report(self, **extra) -> None:
        if self.progress:
            self.progress({"step": self.step, "steps": self.cfg.train.steps, "val_loss": self.last_val,
                           "best_val_loss": self.best, **extra})


def run_training(tr: Trainer, stop: Callable[[], bool] | None = None) -> tuple[str, int | None]:
    """The step loop. Returns (status, diverged_at)."""
    t = tr.cfg.train
    if tr.step == 0 and not (tr.run_dir / runs.METRICS).exists():
        tr.flush(tr.eval_point())  # step 0: the untrained model's val loss
    start = time.perf_counter() - tr.elapsed
    while tr.step < t.steps:
        t0 = time.perf_counter()
        tr.train_step()
        is_eval = tr.step % t.eval_interval == 0 or tr.step == t.steps
        if is_eval or tr.step % t.log_interval == 0:
            train_loss = float(tr.pending[-1][2])
            tr.train_time += time.perf_counter() - t0
            tr.elapsed = time.perf_counter() - start
            diverged = tr.flush(tr.eval_point() if is_eval else None)
            if diverged is not None:
                return runs.DIVERGED, diverged
            tr.report(train_loss=train_loss)
        else:
            tr.train_time += time.perf_counter() - t0
        if stop is not None and stop():
            tr.elapsed = time.perf_counter() - start
            tr.flush()
            tr.save_resume()
            return runs.INTERRUPTED, None
    tr.elapsed = time.perf_counter() - start
    return runs.COMPLETED, None


def write_samples(tr: Trainer) -> str:
    t = tr.cfg.train
    if t.sample_len == 0 or tr.best_step < 0:
        return ""
    load_weights(tr.model, tr.run_dir / runs.BEST)
    tr.model.eval()
    vocab = tr.corpus.vocab
    prefix = "".join(c for c in t.sample_prefix if c in vocab.index) or vocab.chars[0]
    ids = list(generate(tr.model, vocab.encode(prefix), t.sample_len, t.sample_temp, seed=tr.cfg.seed))
    text = prefix + vocab.decode(ids)
    header = f"# prefix={prefix!r} temp={t.sample_temp} seed={tr.cfg.seed} weights=best\n"
    runs.atomic_write_text(tr.run_dir / runs.SAMPLES, header + text + "\n")
    return text


@torch.no_grad()
def expert_load(tr: Trainer) -> list[list[float]] | None:
    """Per MoE layer, the fraction of routed slots each expert got (each row sums to 1; a balanced
    router gives 1/E; none can pass 1/k, as a token picks k different experts), over the fixed
    validation windows with the best weights (best.safetensors): the router the run's result comes
    from, so a collapse late in training shows (a tally over training would average it away). None
    for a dense model or a run without best weights."""
    if not tr.cfg.model.moe or tr.best_step < 0:
        return None
    load_weights(tr.model, tr.run_dir / runs.BEST)
    tr.model.eval()
    counts = 0
    for x, y in tr.val:
        with tr.autocast:
            counts = counts + tr.fwd(x, y, aux=True)[2]["expert_counts"]  # [L, E]
    return (counts / counts.sum(dim=-1, keepdim=True)).tolist()


def available_bytes(device: torch.device) -> int | None:
    """Memory a new allocation can get: free GPU memory, or MemAvailable on Linux (None if unknown)."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return None


def check_fits(cfg: RunConfig, device: torch.device) -> None:
    """Refuse, with the estimate, a model whose training step cannot fit (instead of an allocator crash)."""
    t = cfg.train
    val_windows = 8 * t.batch_size * t.eval_batches * (cfg.model.ctx_len + 1)  # int64, held for the whole run
    need, have = cfg.model.train_bytes(t.batch_size) + val_windows, available_bytes(device)
    if have is not None and need > have:
        m = cfg.model
        raise ConfigError(f"run too large for this machine: d_model={m.d_model}, n_layer={m.n_layer}, "
                          f"ctx_len={m.ctx_len}, batch_size={t.batch_size}, eval_batches={t.eval_batches} need about {need / 2**30:,.1f} GiB "
                          f"for one training step ({m.num_params():,} parameters); {have / 2**30:,.1f} GiB is "
                          f"available on {device}")


def peak_memory(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return peak_rss_bytes()  # process peak RSS (MPS memory is the OS's: no separate peak counter)


def summarize(tr: Trainer, status: str, diverged_at: int | None, extra: dict | None = None) -> dict:
    t, steps = tr.cfg.train, tr.step
    tokens = steps * t.batch_size * tr.cfg.model.ctx_len
    best = tr.best if math.isfinite(tr.best) else None
    return {
        "status": status,
        "run_id": tr.run_dir.name,
        "label": components.label(tr.cfg),
        "components": list(components.on_names(tr.cfg)),
        "seed": tr.cfg.seed,
        "params": tr.model.num_params(),
        "active_params": tr.cfg.model.active_params(),  # per token: a mixture's unrouted experts left out
        "best_val_loss": best,
        "best_step": tr.best_step if best is not None else None,
        "final_val_loss": tr.last_val if math.isfinite(tr.last_val) else None,
        "bits_per_char": best / math.log(2) if best is not None else None,
        "steps_done": steps,
        "tokens_seen": tokens,
        "tokens_per_s": tokens / tr.train_time if tr.train_time > 0 else None,
        "step_time_ms": 1000 * tr.train_time / steps if steps else None,
        "wall_s": round(tr.elapsed, 3),
        "peak_mem_bytes": peak_memory(tr.device),
        "device": str(tr.device),
        "hardware": hardware(tr.device),
        "threads": torch.get_num_threads(),
        "torch_version": torch.__version__,
        "dtype": t.dtype,
        "matmul_precision": matmul_precision(tr.device, t.dtype),  # what "float32" really ran at
        "sdpa_kernel": sdpa_kernel(tr.cfg.model, t.batch_size, tr.device, t.dtype),
        "compiled": t.compile,
        "diverged_at": diverged_at,
        "error": f"diverged at step {diverged_at}" if diverged_at is not None else None,
        "corpus_sha256": tr.corpus.meta.get("sha256"),
        **(extra or {}),
    }


# Summary fields a run keeps through 'running', 'failed' and 'interrupted' summaries and a resume.
SWEEP_KEYS = ("sweep", "role", "flip")
CARRIED = ("run_id", "corpus_sha256", *SWEEP_KEYS)


def train(cfg: RunConfig, run_dir: Path, progress: Progress | None = None,
          stop: Callable[[], bool] | None = None, extra_summary: dict | None = None,
          overwrite: bool = True) -> dict:
    """Train one run from scratch into run_dir (emptied of a previous attempt first).

    Holds run_dir/.lock throughout (RunBusy if a live process trains it). overwrite=False refuses a
    folder that is not empty; a folder of other runs is always refused (runs.check_replace).
    """
    corpus = load_corpus(cfg.data.source, cfg.data.val_frac, cfg.model.ctx_len)
    cfg = resolve_config(cfg, corpus)
    check_fits(cfg, resolve_device(cfg.train.device))
    run_dir = Path(run_dir)
    runs.check_replace(run_dir, overwrite)
    run_dir.mkdir(parents=True, exist_ok=True)
    with runs.RunLock(run_dir):
        runs.check_replace(run_dir, overwrite)  # again, now that no one else can write here
        return _from_scratch(cfg, run_dir, corpus, progress, stop, extra_summary or {})


def _from_scratch(cfg: RunConfig, run_dir: Path, corpus: Corpus, progress, stop, extra: dict) -> dict:
    for name in (runs.METRICS, runs.SUMMARY, runs.BEST, runs.LAST, runs.RESUME, runs.SAMPLES):
        (run_dir / name).unlink(missing_ok=True)
    runs.atomic_write_json(run_dir / runs.CONFIG, cfg.model_dump(mode="json"))  # first
    corpus.vocab.save(run_dir / runs.VOCAB)
    base = {"run_id": run_dir.name, "corpus_sha256": corpus.meta.get("sha256"), **extra}
    _mark_running(run_dir, base)
    with _recorded(run_dir, base):
        tr = Trainer(cfg, run_dir, corpus, progress)
        return _finish(tr, stop, extra)


def resume(run_dir: Path, progress: Progress | None = None, stop: Callable[[], bool] | None = None) -> dict:
    """Continue an interrupted run; metrics equal an uninterrupted run's.

    'Interrupted' includes a run whose process died (SIGKILL, power loss): its summary still says
    'running' but names a dead owner. With a checkpoint (resume.pt, written when a run is stopped)
    training continues from its step; without one (the process was killed before it could save)
    the run starts again from step 0 with its recorded config and seed, which gives the same
    metrics an uninterrupted run would. Either way the corpus must be the one the run started on.
    """
    run_dir = Path(run_dir)
    cfg = load_run_config(run_dir)
    with runs.RunLock(run_dir):  # status is read under the lock: a finished rival is seen finished
        status = runs.run_status(run_dir)
        if status != runs.INTERRUPTED:
            raise runs.RunError(f"{run_dir} is {status or 'not a run'}; only interrupted runs can be resumed")
        summary = runs.read_summary(run_dir) or {}
        corpus = load_corpus(cfg.data.source, cfg.data.val_frac, cfg.model.ctx_len)
        check_corpus(run_dir, cfg, summary, corpus)
        extra = {k: summary[k] for k in SWEEP_KEYS if k in summary}
        if not (run_dir / runs.RESUME).is_file():
            return _from_scratch(cfg, run_dir, corpus, progress, stop, extra)
        tr = Trainer(cfg, run_dir, corpus, progress)
        tr.load_resume()  # a bad checkpoint raises here and leaves the run as it was
        base = {"run_id": run_dir.name, "corpus_sha256": corpus.meta.get("sha256"), **extra}
        _mark_running(run_dir, {**summary, **base})
        with _recorded(run_dir, {**summary, **base}):
            return _finish(tr, stop, extra)


def has_checkpoint(run_dir: Path) -> bool:
    """Whether resume() continues from a saved step (else it trains again from step 0)."""
    return (Path(run_dir) / runs.RESUME).is_file()


def check_corpus(run_dir: Path, cfg: RunConfig, summary: dict, corpus: Corpus) -> None:
    """Refuse to continue a run on other data than it started on (fingerprint, else vocabulary size)."""
    was, now = summary.get("corpus_sha256"), corpus.meta.get("sha256")
    if was and now and was != now:
        raise runs.RunError(f"{run_dir}: the corpus changed since the run started (sha256 {was[:12]}... is now "
                            f"{now[:12]}...); resuming would train on other data")
    if len(corpus.vocab) != cfg.model.vocab_size:
        raise runs.RunError(f"{run_dir}: the corpus changed since the run started (vocabulary size differs)")


def _mark_running(run_dir: Path, base: dict) -> None:
    """The summary while training: 'running', owned by this process (runs.run_status checks it lives)."""
    keep = {k: v for k, v in base.items() if k in CARRIED}
    runs.atomic_write_json(run_dir / runs.SUMMARY, {"status": runs.RUNNING, "owner": identity(), **keep})


@contextlib.contextmanager
def _recorded(run_dir: Path, base: dict):
    """Whatever ends training early leaves the run 'failed' (an exception: out of memory, a bug) or
    'interrupted' (a second Ctrl-C, SystemExit) with the error in summary.json, never 'running'."""
    try:
        yield
    except BaseException as err:
        status = runs.FAILED if isinstance(err, Exception) else runs.INTERRUPTED
        error = f"{err.__class__.__name__}: {err}".rstrip(": ")
        keep = {k: v for k, v in base.items() if k in CARRIED}
        with contextlib.suppress(OSError):
            runs.atomic_write_json(run_dir / runs.SUMMARY, {"status": status, **keep, "error": error})
        raise


def _finish(tr: Trainer, stop, extra: dict | None) -> dict:
    status, diverged_at = run_training(tr, stop)
    if status == runs.INTERRUPTED:
        summary = summarize(tr, status, None, extra)
    else:
        save_weights(tr.model, tr.run_dir / runs.LAST)
        (tr.run_dir / runs.RESUME).unlink(missing_ok=True)
        if status == runs.COMPLETED:
            write_samples(tr)
        load = expert_load(tr)
        summary = summarize(tr, status, diverged_at, {**(extra or {}), **({"expert_load": load} if load else {})})
    if tr.events is not None:
        tr.events.close()
    runs.atomic_write_json(tr.run_dir / runs.SUMMARY, summary)  # last
    return summary

"""Length extrapolation: a run's best weights evaluated at other context lengths.

  parse_ctx_list   '128,256' or '1x,2x,4x' -> [(n, is_multiple)]; bad text is a ConfigError
  eval_lengths     one run dir -> best-weights val loss (nats/token) and bits per byte at each context length
  eval_tree        a run dir or a sweep dir -> eval_lengths for each completed run, eval.json written

Length extrapolation is measured, never faked: a learned position table has no row past ctx_len,
so those lengths are "n/a" (null in eval.json), not silently cropped; RoPE simply rotates by
larger angles and NoPE has nothing that ends, so both are evaluated as is. A val split too short
for a length is also n/a, with a note saying so (skipped, not an error: in a sweep, one impossible
length must not stop the others).

Library code: returns data, never prints or exits; bad input raises ConfigError, RunError or
DataError with a one-line message. torch is imported inside the functions that need it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from anatomy_cli.data.batches import bits_per_byte, eval_counts
from anatomy_cli.spec import components
from anatomy_cli.spec.config import (
    ConfigError,
    ModelConfig,
)
from anatomy_cli.store import runs

LEARNED_NA = "n/a (learned table ends at ctx_len={})"


# ------------------------------------------------------------------------- 1. length extrapolation


def parse_ctx_list(text: str) -> list[tuple[int, bool]]:
    """'128,256' -> [(128, False), (256, False)]; '1x,4x' -> multiples of each run's ctx_len."""
    items = []
    for part in text.split(","):
        part = part.strip().lower()
        multiple = part.endswith("x")
        digits = part[:-1] if multiple else part
        if not digits.isdecimal() or int(digits) <= 0:
            raise ConfigError(f"--ctx expects positive lengths or multiples of ctx_len, e.g. 128,256,512 "
                              f"or 1x,2x,4x; got {text!r}")
        items.append((int(digits), multiple))
    return items


def resolve_lengths(items: list[tuple[int, bool]], ctx_len: int) -> list[int]:
    return sorted({n * ctx_len if multiple else n for n, multiple in items})


def length_problem(cfg: ModelConfig, n: int, n_val: int) -> str | None:
    """Why length n cannot be measured for this model and val split, or None if it can."""
    if cfg.max_positions is not None and n > cfg.max_positions:
        return LEARNED_NA.format(cfg.max_positions)
    if n_val < n + 1:  # a window of n inputs needs n + 1 ids (the targets are shifted by one)
        return f"n/a (val split has {n_val:,} ids; a window of {n:,} needs {n + 1:,})"
    return None


def eval_bytes(cfg: ModelConfig, n: int, batch_size: int, batches: int) -> int:
    """Bytes an evaluation at length n holds: every window's ids (int64, made up front) plus one
    batch's forward, bounded by what a training step at that length would need."""
    return 8 * batches * batch_size * (n + 1) + cfg.model_copy(update={"ctx_len": n}).train_bytes(batch_size)


def val_loss_at(model, val_ids, n: int, batch_size: int, batches: int, dtype: str = "float32") -> float:
    """Mean loss over data.fixed_windows of length n (raises PositionError past a learned table).

    Same windows, batching, averaging and dtype (bf16 autocast or fp32) as Trainer.evaluate, so at
    n = ctx_len with the run's batch_size, eval_batches and dtype, on the device it was trained on,
    this reproduces the run's best_val_loss (exactly for an eager run).
    """
    import torch

    from anatomy_cli.data.batches import fixed_windows
    from anatomy_cli.training.devices import autocast

    device = next(model.parameters()).device
    total = torch.zeros((), device=device)
    windows = fixed_windows(val_ids, batch_size, n, batches, device)
    with torch.no_grad(), autocast(device, dtype):
        for x, y in windows:  # x, y: [B, n]
            _, loss = model(x, y)
            total += loss.float()
    return float(total) / len(windows)


def run_corpus(cfg, run_dir: Path, cache: dict | None = None):
    """The run's corpus (one read per source and tokenizer), checked against the vocabulary the run saved
    (vocab.json's characters, or tokenizer.json's sha256)."""
    from anatomy_cli.data.load import run_corpus as load_run_corpus
    from anatomy_cli.training.checkpoint import run_vocab

    cache = {} if cache is None else cache
    key = (cfg.data.source, cfg.data.val_frac, cfg.data.tokenizer)
    if key not in cache:
        cache[key] = load_run_corpus(cfg, min_len=1)
    corpus = cache[key]
    vocab = run_vocab(run_dir)
    if getattr(vocab, "chars", None) != getattr(corpus.vocab, "chars", None) \
            or getattr(vocab, "sha256", None) != getattr(corpus.vocab, "sha256", None):
        raise runs.RunError(f"{run_dir}: the corpus changed since the run was trained (vocabulary differs)")
    return corpus


def eval_lengths(run_dir: Path, ctx: list[tuple[int, bool]], batches: int | None = None,
                 batch_size: int | None = None, device: str = "cpu", corpus_cache: dict | None = None) -> dict:
    """{"val_loss_by_ctx": {"64": 1.9, "256": None}, "ctx_len", "pos_type", "notes", ...} for a run."""
    from anatomy_cli.training.checkpoint import load_run
    from anatomy_cli.training.devices import require_memory

    cfg, _, model = load_run(run_dir, "best", device)
    corpus = run_corpus(cfg, run_dir, corpus_cache)
    bs, nb = batch_size or cfg.train.batch_size, batches or cfg.train.eval_batches
    losses: dict[str, float | None] = {}
    bpb: dict[str, float | None] = {}  # the same losses in bits per byte (data/batches.py)
    notes: dict[str, str] = {}
    for n in resolve_lengths(ctx, cfg.model.ctx_len):
        problem = length_problem(cfg.model, n, len(corpus.val))
        if problem:
            losses[str(n)], bpb[str(n)], notes[str(n)] = None, None, problem
        else:
            require_memory(eval_bytes(cfg.model, n, bs, nb), device,
                           f"{run_dir}: --batches {nb} x --batch-size {bs} windows of {n} tokens")
            losses[str(n)] = val_loss_at(model, corpus.val, n, bs, nb, cfg.train.dtype)  # the run's own dtype
            bpb[str(n)] = bits_per_byte(losses[str(n)], *eval_counts(corpus, n, bs, nb))
    return {"val_loss_by_ctx": losses, "val_bpb_by_ctx": bpb, "ctx_len": cfg.model.ctx_len,
            "pos_type": cfg.model.pos_type,
            "notes": notes, "label": components.label(cfg), "weights": "best", "batch_size": bs, "batches": nb,
            "dtype": cfg.train.dtype}


MERGE_KEYS = ("weights", "batch_size", "batches", "dtype")


def write_eval(run_dir: Path, result: dict) -> dict:
    """Write eval.json atomically; lengths measured earlier with the same settings are kept."""
    path = Path(run_dir) / runs.EVAL
    old: dict = {}
    if path.exists():
        try:
            runs.read_ctx_losses(path)  # checks the losses table
            old = runs.read_json(path)
        except runs.RunError:
            old = {}  # a corrupt eval.json is replaced, not merged
    if isinstance(old, dict):
        old.setdefault("dtype", "float32")  # written before eval ran in the run's dtype: always fp32
    same = (isinstance(old, dict) and isinstance(old.get("notes", {}), dict)
            and all(old.get(k) == result.get(k) for k in MERGE_KEYS))
    losses = {**(old.get("val_loss_by_ctx", {}) if same else {}), **result["val_loss_by_ctx"]}
    losses = dict(sorted(losses.items(), key=lambda kv: int(kv[0])))
    old_bpb = old.get("val_bpb_by_ctx", {}) if same and isinstance(old.get("val_bpb_by_ctx"), dict) else {}
    bpb = {n: {**old_bpb, **result.get("val_bpb_by_ctx", {})}.get(n) for n in losses}
    notes = {**(old.get("notes", {}) if same else {}), **result["notes"]}
    merged = {**result, "val_loss_by_ctx": losses, "val_bpb_by_ctx": bpb,
              "notes": {k: v for k, v in notes.items() if losses.get(k) is None}}
    runs.atomic_write_json(path, merged)
    return merged


def eval_tree(root: Path, ctx: list[tuple[int, bool]], batches: int | None = None, batch_size: int | None = None,
              device: str = "cpu", on_run: Callable[[Path, dict], None] | None = None) -> dict:
    """Evaluate a run dir, or every completed run under a sweep dir; returns {"runs", "skipped"}."""
    root = Path(root)
    if not root.exists():
        raise runs.RunError(f"run or sweep directory not found: {root}")
    if runs.is_run_dir(root):
        targets, skipped = [root], []
    else:
        found = runs.find_runs(root)
        if not found:
            raise runs.RunError(f"no runs under {root} (no run directory with a {runs.CONFIG})")
        targets = [d for d in found if runs.run_status(d) == runs.COMPLETED]
        skipped = [{"run_dir": str(d), "status": runs.run_status(d) or "incomplete"} for d in found if d not in targets]
    done, corpora = [], {}
    for run_dir in targets:
        result = write_eval(run_dir, eval_lengths(run_dir, ctx, batches, batch_size, device, corpora))
        done.append({"run_dir": str(run_dir), **result})
        if on_run:
            on_run(run_dir, result)
    return {"runs": done, "skipped": skipped}

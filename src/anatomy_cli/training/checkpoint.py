"""Weights on disk: safetensors only (no pickle), written atomically; loading a run back.

A checkpoint (weights, optimizer, RNG and counters in one file, for resuming) goes through
torch.save and comes back with torch.load(weights_only=True), which refuses arbitrary pickled
objects. Every file here is written to a temp file, fsynced and renamed into place.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from anatomy_cli.data.corpus import DataError
from anatomy_cli.data.tokenizer import load_saved
from anatomy_cli.model import LM
from anatomy_cli.spec.config import ConfigError, RunConfig, validate
from anatomy_cli.spec.parts import PartError
from anatomy_cli.spec.roles import ALL_ON
from anatomy_cli.store import runs


def save_weights(weights: torch.nn.Module | dict, path: Path) -> None:
    """A module's (or a state dict's) every key, tied ones too: safetensors refuses tensors that share
    memory, so a second name for one tensor (head.weight when tied to tok.weight) is written as a
    copy, and loading copies both names back into the one parameter."""
    state, seen = {}, set()
    for k, v in (weights.state_dict() if isinstance(weights, torch.nn.Module) else weights).items():
        v = v.detach().contiguous().cpu()
        state[k] = v.clone() if v.data_ptr() in seen else v
        seen.add(v.data_ptr())
    _atomic(path, lambda tmp: save_file(state, tmp))


def _atomic(path: Path, write) -> None:
    """write(tmp) into a temp file beside path, fsync it, then rename it over path: a reader (or a
    resume after a kill at any instant) sees the old file or the new one, never part of one."""
    fd, tmp = tempfile.mkstemp(dir=Path(path).parent, prefix=f".{Path(path).name}.", suffix=".tmp")
    os.close(fd)
    try:
        with runs.writing(path):
            write(tmp)
        runs.normal_mode(tmp)  # after writing: a mode set on the mkstemp file before save_file does not survive
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_weights(path: Path) -> dict[str, torch.Tensor]:
    """A safetensors file as a CPU state dict; missing or corrupt is a one-line RunError."""
    if not Path(path).is_file():
        raise runs.RunError(f"missing weights file {path}")
    try:
        return load_file(str(path), device="cpu")  # load_state_dict copies to the model's device, any kind
    except (SafetensorError, OSError, ValueError) as err:
        raise runs.RunError(f"corrupt weights file {path}: {str(err).splitlines()[0]}") from None


def load_weights(model: torch.nn.Module, path: Path, hint: str = "") -> None:
    """Load safetensors weights into `model`; a mismatch or a NaN/inf weight is a one-line RunError (+ hint)."""
    state = read_weights(path)
    # A diverged run's weights hold NaN/inf: every logit would be NaN (argmax 0, multinomial refuses).
    bad = [k for k, v in state.items() if v.is_floating_point() and not bool(torch.isfinite(v).all())]
    if bad:
        more = f" and {len(bad) - 1} more" if len(bad) > 1 else ""
        raise runs.RunError(f"weights in {path} are not finite (NaN or inf in {bad[0]}{more}): "
                            f"the run diverged{hint}")
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as err:
        detail = " ".join(str(err).split())[:300]
        raise runs.RunError(f"weights in {path} do not match the run's config: {detail}") from None


def save_checkpoint(state: dict, path: Path) -> None:
    """One file with everything a resume needs (tensors, numbers, containers), replaced atomically."""
    _atomic(path, lambda tmp: torch.save(state, tmp))


def load_checkpoint(path: Path) -> dict:
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise runs.RunError(f"no resumable state in {Path(path).parent} (missing {Path(path).name})") from None
    except Exception as err:  # a corrupt or foreign pickle: refuse it, whatever it is
        raise runs.RunError(f"corrupt resume state {path}: {err.__class__.__name__}") from None
    if not isinstance(state, dict):
        raise runs.RunError(f"corrupt resume state {path}: not a checkpoint")
    return state


def load_run_config(run_dir: Path) -> RunConfig:
    run_dir = Path(run_dir)
    if not run_dir.exists():
        raise runs.RunError(f"run directory not found: {run_dir}")
    if not run_dir.is_dir():
        raise runs.RunError(f"not a run directory: {run_dir}")
    if not (run_dir / runs.CONFIG).exists() and runs.holds_sweep(run_dir):  # `anatomy sample runs/demo`
        raise runs.RunError(f"{run_dir} is a sweep folder: pass one of its runs, e.g. {example_run(run_dir)}")
    try:
        return validate(RunConfig, runs.read_json(run_dir / runs.CONFIG), prefix="config.json: ")
    except ConfigError as err:
        raise runs.RunError(f"{run_dir}: {err}") from None


def example_run(sweep_dir: Path) -> Path:
    """A run of a sweep folder to name: its first completed run of the all-on (LLaMA) end, the one a newcomer
    wants to hear (its summary's role), else its first completed one, else its first, or SWEEP/<a run id>."""
    try:
        found = sorted(child for child in Path(sweep_dir).iterdir() if runs.holds_run(child))
    except OSError:
        found = []
    done = [d for d in found if runs.run_status(d) == runs.COMPLETED]
    top = [d for d in done if (runs.read_summary(d) or {}).get("role") == ALL_ON]
    return (top or done or found or [Path(sweep_dir) / "<a run id>"])[0]


def run_vocab(run_dir: Path):
    """The vocabulary a run saved: its tokenizer.json (data.tokenizer other than char), else its vocab.json;
    missing or corrupt is a one-line RunError."""
    cfg = load_run_config(run_dir)
    try:
        return load_saved(Path(run_dir), {"tokenizer": cfg.data.tokenizer})
    except DataError as err:
        raise runs.RunError(str(err)) from None


def load_run(run_dir: Path, which: str = "best", device: str | torch.device = "cpu"):
    """(config, vocab, model in eval mode) of a finished or interrupted run: vocab is the run's CharVocab
    or Tokens (data/tokenizer.py)."""
    cfg = load_run_config(run_dir)
    vocab = run_vocab(run_dir)
    if len(vocab) != cfg.model.vocab_size:
        what = "characters" if vocab.spec == "char" else "tokens"
        raise runs.RunError(f"{run_dir}: {vocab.file} has {len(vocab)} {what}, config says {cfg.model.vocab_size}")
    try:
        model = LM(cfg.model).to(device)
    except PartError as err:  # its plugin's file holds other code now: the run keeps the code it trained with
        raise runs.RunError(f"{run_dir}: {err} (its text is in {Path(run_dir) / runs.PARTS})") from None
    name = {"best": runs.BEST, "last": runs.LAST}[which]
    hint = "; use --weights best (saved at the best val loss, before it diverged)" if which == "last" else ""
    load_weights(model, Path(run_dir) / name, hint)
    return cfg, vocab, model.eval()

"""Weights on disk: safetensors only (no pickle), written atomically; loading a run back.

Optimizer/RNG state for resuming goes through torch.save and comes back with
torch.load(weights_only=True), which refuses arbitrary pickled objects.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from . import runs
from .config import ConfigError, RunConfig, validate
from .data import CharVocab, DataError
from .model import LM


def save_weights(model: torch.nn.Module, path: Path) -> None:
    """Every state-dict key, tied ones too: safetensors refuses tensors that share memory, so a
    second name for one tensor (head.weight when tied to tok.weight) is written as a copy, and
    loading copies both names back into the one parameter."""
    state, seen = {}, set()
    for k, v in model.state_dict().items():
        v = v.detach().contiguous().cpu()
        state[k] = v.clone() if v.data_ptr() in seen else v
        seen.add(v.data_ptr())
    fd, tmp = tempfile.mkstemp(dir=Path(path).parent, prefix=f".{Path(path).name}.", suffix=".tmp")
    os.close(fd)
    try:
        with runs.writing(path):
            save_file(state, tmp)
        runs.normal_mode(tmp)  # after save_file: a mode set on the mkstemp file before it does not survive
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load_weights(model: torch.nn.Module, path: Path, hint: str = "") -> None:
    """Load safetensors weights into `model`; a mismatch or a NaN/inf weight is a one-line RunError (+ hint)."""
    if not Path(path).is_file():
        raise runs.RunError(f"missing weights file {path}")
    try:
        state = load_file(str(path), device="cpu")  # load_state_dict copies to the model's device, any kind
    except (SafetensorError, OSError, ValueError) as err:
        raise runs.RunError(f"corrupt weights file {path}: {str(err).splitlines()[0]}") from None
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


def save_state(state: dict, path: Path) -> None:
    fd, tmp = tempfile.mkstemp(dir=Path(path).parent, prefix=f".{Path(path).name}.", suffix=".tmp")
    runs.normal_mode(fd)
    os.close(fd)
    try:
        with runs.writing(path):
            torch.save(state, tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)  # a failed save left no temp file behind
        raise


def load_state(path: Path) -> dict:
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise runs.RunError(f"no resumable state in {Path(path).parent} (missing {Path(path).name})") from None
    except Exception as err:  # a corrupt or foreign pickle: refuse it, whatever it is
        raise runs.RunError(f"corrupt resume state {path}: {err.__class__.__name__}") from None


def load_run_config(run_dir: Path) -> RunConfig:
    run_dir = Path(run_dir)
    if not run_dir.exists():
        raise runs.RunError(f"run directory not found: {run_dir}")
    if not run_dir.is_dir():
        raise runs.RunError(f"not a run directory: {run_dir}")
    try:
        return validate(RunConfig, runs.read_json(run_dir / runs.CONFIG), prefix="config.json: ")
    except ConfigError as err:
        raise runs.RunError(f"{run_dir}: {err}") from None


def load_run(run_dir: Path, which: str = "best", device: str | torch.device = "cpu"):
    """(config, vocab, model in eval mode) of a finished or interrupted run."""
    cfg = load_run_config(run_dir)
    try:
        vocab = CharVocab.load(Path(run_dir) / runs.VOCAB)
    except DataError as err:
        raise runs.RunError(str(err)) from None
    if len(vocab) != cfg.model.vocab_size:
        raise runs.RunError(f"{run_dir}: vocab.json has {len(vocab)} characters, config says {cfg.model.vocab_size}")
    model = LM(cfg.model).to(device)
    name = {"best": runs.BEST, "last": runs.LAST}[which]
    hint = "; use --weights best (saved at the best val loss, before it diverged)" if which == "last" else ""
    load_weights(model, Path(run_dir) / name, hint)
    return cfg, vocab, model.eval()

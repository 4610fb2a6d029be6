"""What many test files share: the LLaMA end, the CLI through CliRunner, the one-error-line check,
waiting on a process, scrambling a layer's weights, and the DeepSeek-family state dict's shared part.

Waiting. A test that starts a process waits for a state (a metric line on disk, a run in flight, the
process gone), never for a duration, and gives up only after PATIENCE: every such wait here ends in
at most ~100 s on an idle 2-core machine (the longest, a sweep rerun to completion), so PATIENCE holds
on a machine 5x slower than that, a load of 8 on 2 cores, with room to spare. A test that finds its
state sooner moves on at once, so the ceiling costs nothing when all is well.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path

import torch
from toy_data import TINY_MODEL, TINY_TRAIN
from typer.testing import CliRunner

from anatomy_cli.cli.main import app

PATIENCE = 900.0  # seconds: the ceiling of any one wait on a process (see the docstring)

# The LLaMA end of the five flips (RMSNorm, pre-norm, RoPE, SwiGLU, GQA at 4 heads -> 2 K/V heads).
LLAMA = {"norm_type": "rmsnorm", "norm_pos": "pre", "pos_type": "rope", "ffn_type": "swiglu", "n_kv_head": 2}
LLAMA_MHA = {k: v for k, v in LLAMA.items() if k != "n_kv_head"}  # the four parts, K/V heads as given


def wait_for(predicate, what: str = "condition", timeout: float = PATIENCE, poll: float = 0.05) -> None:
    """Return once predicate() is true; fail naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached in {timeout:.0f}s")
        time.sleep(poll)


def flat(text: str) -> str:
    """Console output with rich's line wrapping undone."""
    return " ".join(text.split())


def error_line(text: str) -> str:
    """The one line of `text` starting 'error:'; no traceback, no internal error."""
    assert "Traceback" not in text and "internal error" not in text, text
    errors = [line for line in text.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, text
    return errors[0]


def one_error_line(result, fragment: str = "", code: int = 2, alone: bool = False) -> str:
    """The command exited with `code` and said why in exactly one line starting 'error:', which (with
    its continuation: the lines rich wrapped it onto, up to a blank one) holds `fragment`; no
    traceback. alone: that line is all it wrote to stderr. `result` is a CliRunner Result or a
    CompletedProcess; returns the error line."""
    exit_code = result.exit_code if hasattr(result, "exit_code") else result.returncode
    text = result.output if hasattr(result, "output") else result.stderr
    assert exit_code == code, (exit_code, text)
    line = error_line(text)
    lines = text[text.index(line):].splitlines()
    said = flat(" ".join(lines[: next((i for i, s in enumerate(lines) if not s.strip()), len(lines))]))
    assert fragment in said, text
    if alone:
        assert result.stderr.strip() == line.strip(), result.stderr
    return line


def invoke(*args):
    """The `anatomy` CLI in this process (typer's CliRunner), every argument as a string."""
    return CliRunner().invoke(app, [str(a) for a in args])


def fake_calibration(tmp_path: Path, monkeypatch, calibration: dict) -> list[int]:
    """An empty calibration cache of this test, an idle machine, and step times measured instantly as
    `calibration` (sweep.calibrate._measure faked); the list it returns grows by the configs measured
    at each measurement."""
    from anatomy_cli.sweep import calibrate

    monkeypatch.setenv("ANATOMY_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(calibrate, "busy", lambda: None)
    measured: list[int] = []
    monkeypatch.setattr(calibrate, "_measure", lambda configs, threads: measured.append(len(configs)) or [
        dict(calibration) for _ in configs])
    return measured


def run_sets(corpus: Path, **model) -> list[str]:
    """--set options for a toy run on `corpus`: TINY_MODEL with `model` over it, TINY_TRAIN."""
    sets = [f"--set=data.source={json.dumps(str(corpus))}"]
    sets += [f"--set=model.{k}={json.dumps(v)}" for k, v in {**TINY_MODEL, **model}.items()]
    return sets + [f"--set=train.{k}={json.dumps(v)}" for k, v in TINY_TRAIN.items()]


def group_gone(pgid: int) -> bool:
    """No process is left in process group `pgid`."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return False


def scramble_with_sinks(module: torch.nn.Module) -> None:
    """Re-draw module's weights in place from torch's global generator: matrices at 1/sqrt(fan_in), the
    attention sinks around 0.5 with spread 1, every other vector (norm weights) around 1."""
    with torch.no_grad():
        for name, p in module.named_parameters():
            if p.dim() >= 2:
                p.normal_(0, 1 / math.sqrt(p.shape[-1]))
            else:
                p.normal_(0.5, 1.0) if name == "sinks" else p.normal_(1.0, 0.3)


def deepseek_base_state(lm, dense_mlp: bool) -> dict:
    """The part of anatomy's LLaMA-end LM -> a DeepSeek-family transformers state dict that every variant
    shares: embeddings, final norm, head, each layer's two norms and, with dense_mlp, its SwiGLU as
    mlp.{gate,up,down}_proj. The caller adds attention (and MoE) and detaches."""
    out = {"model.embed_tokens.weight": lm.tok.weight, "model.norm.weight": lm.final_norm.weight,
           "lm_head.weight": lm.head.weight}
    for i, block in enumerate(lm.blocks):
        pre = f"model.layers.{i}."
        out |= {pre + "input_layernorm.weight": block.norm1.weight,
                pre + "post_attention_layernorm.weight": block.norm2.weight}
        if dense_mlp:
            out |= {pre + "mlp.gate_proj.weight": block.ffn.gate.weight,
                    pre + "mlp.up_proj.weight": block.ffn.up.weight,
                    pre + "mlp.down_proj.weight": block.ffn.down.weight}
    return out


def asked(spec, *words: str, **where):
    """An `ablate` Ask as the command line gives it: `words` its alias flags ("--tune-points", "3") and --set
    pairs ("--set", "seeds=4"), `where` the Ask's other fields (runs_dir, stack, decide, tune_lr, time_pass)."""
    from anatomy_cli.spec import knobs
    from anatomy_cli.study.ablation import Ask

    words, sets = list(map(str, words)), []
    while "--set" in words:
        i = words.index("--set")
        sets.append(knobs.parse_set(words[i + 1]))
        del words[i:i + 2]
    args, settings = knobs.read_args(words)
    assert not args, args
    return Ask(spec=spec, settings=(*settings, *sets), **where)

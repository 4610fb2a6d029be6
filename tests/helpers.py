"""What many test files share: the LLaMA end, the CLI through CliRunner, the one-error-line check,
and waiting on a process.

Waiting. A test that starts a process waits for a state (a metric line on disk, a run in flight, the
process gone), never for a duration, and gives up only after PATIENCE: every such wait here ends in
at most ~100 s on an idle 2-core machine (the longest, a sweep rerun to completion), so PATIENCE holds
on a machine 5x slower than that, a load of 8 on 2 cores, with room to spare. A test that finds its
state sooner moves on at once, so the ceiling costs nothing when all is well.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

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

"""anatomy's fused model == the hand-written reference of benchmarks/reference.py (fp32), for every
component combination; and the GPU check script fails cleanly on a machine without CUDA."""

from __future__ import annotations

import itertools
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import PATIENCE

from anatomy_cli.model import LM
from anatomy_cli.spec.config import ModelConfig

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH))
import reference  # noqa: E402

GRID = list(itertools.product(("layernorm", "rmsnorm"), ("post", "pre"), ("learned", "rope"), ("gelu", "swiglu"),
                              (4, 2, 1)))


@pytest.mark.usefixtures("single_thread")
@pytest.mark.parametrize("norm,pos_norm,pos,ffn,kv", GRID, ids=["-".join(map(str, g)) for g in GRID])
def test_fused_equals_reference(norm, pos_norm, pos, ffn, kv):
    cfg = ModelConfig(vocab_size=40, d_model=32, n_layer=2, n_head=4, n_kv_head=kv, ctx_len=16, norm_type=norm,
                      norm_pos=pos_norm, pos_type=pos, ffn_type=ffn)
    torch.manual_seed(0)
    lm = LM(cfg).eval()
    with torch.no_grad():  # non-trivial norm weights/biases so a dropped parameter shows
        for name, p in lm.named_parameters():
            if p.dim() == 1:
                p.normal_(1.0 if name.endswith("weight") else 0.0, 0.1)
    ref = reference.copy_from_anatomy(reference.RefLM(cfg), lm).eval()
    assert sum(p.numel() for p in ref.parameters()) == lm.num_params()
    idx = torch.randint(0, 40, (2, 16))
    with torch.no_grad():
        ours, _ = lm(idx)
        theirs = ref(idx)
        theirs = theirs[0] if isinstance(theirs, tuple) else theirs
    assert torch.allclose(ours, theirs, atol=1e-5), (ours - theirs).abs().max()


@pytest.mark.process
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU path")
def test_gpu_check_fails_cleanly_without_cuda():
    result = subprocess.run(["bash", str(BENCH / "gpu_check.sh")], capture_output=True, text=True, timeout=PATIENCE)
    assert result.returncode in (2, 3), result.stdout + result.stderr  # no CUDA (or no pydantic)
    assert "Traceback" not in result.stderr
    if result.returncode == 2:
        assert "no CUDA device" in result.stdout + result.stderr

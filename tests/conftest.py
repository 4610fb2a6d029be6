"""Shared toy fixtures: tiny ModelConfigs and seeded fp32 LMs, plus the 16 component combinations.

The 32-combination grid of the tests is `components` (norm_type x norm_pos x pos_type x ffn_type,
a parametrized fixture) crossed with an n_kv_head axis that each test parametrizes itself.
"""

from __future__ import annotations

import atexit
import itertools
import math
import os
import shutil
import sys
import tempfile

import pytest
import torch

from anatomy_cli.model import LM
from anatomy_cli.spec.config import ModelConfig

# Plan estimates calibrate into a cache of this test session, never the user's ~/.cache; set at import,
# so the subprocesses tests start (their environment copied at import) share it too.
os.environ["ANATOMY_CACHE"] = tempfile.mkdtemp(prefix="anatomy-test-cache-")
atexit.register(shutil.rmtree, os.environ["ANATOMY_CACHE"], True)

TOY = {"vocab_size": 50, "d_model": 32, "n_layer": 2, "n_head": 4, "n_kv_head": 4, "ctx_len": 24}

COMPONENTS = [
    {"norm_type": n, "norm_pos": p, "pos_type": e, "ffn_type": f}
    for n, p, e, f in itertools.product(("layernorm", "rmsnorm"), ("post", "pre"), ("learned", "rope"),
                                        ("gelu", "swiglu"))
]


def component_id(c: dict) -> str:
    return "-".join((c["norm_type"], c["norm_pos"], c["pos_type"], c["ffn_type"]))


def toy_config(**overrides) -> ModelConfig:
    return ModelConfig(**{**TOY, **overrides})


def scramble(model: torch.nn.Module) -> torch.nn.Module:
    """Re-draw every weight at unit-gain scale so logits are O(1) and every parameter matters.

    GPT-2's N(0, 0.02) init makes logits nearly uniform, which would let a wrong mask or a wrong
    position hide below the 1e-5 tolerances; norm weights and biases are randomised for the same
    reason (a unit weight and zero bias would make a dropped norm parameter invisible).
    """
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:  # matrices and embeddings: std 1/sqrt(fan_in)
                p.normal_(0.0, 1.0 / math.sqrt(p.shape[-1]))
            elif name.endswith("bias"):  # LayerNorm bias (no Linear has one)
                p.normal_(0.0, 0.1)
            else:  # norm weights
                p.normal_(1.0, 0.1)
    return model


def toy_lm(seed: int = 0, **overrides) -> LM:
    """A seeded toy LM in fp32 eval mode with scrambled weights."""
    torch.manual_seed(seed)
    return scramble(LM(toy_config(**overrides)).float()).eval()


@pytest.fixture(params=COMPONENTS, ids=component_id)
def components(request) -> dict:
    """One of the 16 norm_type x norm_pos x pos_type x ffn_type combinations."""
    return dict(request.param)


@pytest.fixture
def make_lm():
    """Factory fixture: make_lm(seed=0, **config_overrides) -> seeded toy LM (fp32, eval)."""
    return toy_lm


@pytest.fixture
def make_config():
    """Factory fixture: make_config(**overrides) -> toy ModelConfig."""
    return toy_config


@pytest.fixture
def single_thread():
    """Run a test's toy-sized torch ops on one intra-op thread, then restore the old count.

    At these sizes threading only adds synchronisation, and on a busy 2-core machine two spinning
    torch threads per process make tiny ops 10x slower. Opt in with usefixtures("single_thread").
    """
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(autouse=True)
def parts_registry():
    """Every test starts from, and leaves, the parts registry as anatomy's own parts make it: plugins a test
    loads (spec/parts.py's REGISTRY, LOADED, their modules) are gone after it."""
    from anatomy_cli.spec import parts

    registry, loaded, modules = dict(parts.REGISTRY), dict(parts.LOADED), set(sys.modules)
    yield
    parts.REGISTRY.clear()
    parts.REGISTRY.update(registry)
    parts.LOADED.clear()
    parts.LOADED.update(loaded)
    for name in set(sys.modules) - modules:
        if name.startswith("anatomy_plugin_"):
            del sys.modules[name]

"""The public parts API (model/parts.py) as a surface: its names, what each slot is called with, and
anatomy's own parts built through it (no side door: the modules the model held before)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from anatomy_cli.model import LM, parts
from anatomy_cli.model.ffn import GeluMLP, SiLUMLP, SwiGLU
from anatomy_cli.model.norms import LayerNorm, NoNorm, RMSNorm
from anatomy_cli.model.positions import LearnedPositions, NoPositions, RoPE
from anatomy_cli.spec import parts as registry
from anatomy_cli.spec.config import ModelConfig

SURFACE = ["part", "Options", "Part", "SLOTS", "PartError", "KV", "WindowKV", "visible", "build", "load_plugins"]
EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "parts"


def test_the_public_surface_is_these_names_each_documented():
    assert parts.__all__ == SURFACE
    assert all(hasattr(parts, name) for name in SURFACE)
    assert f"{', '.join(SURFACE)}." in " ".join(parts.__doc__.split())  # the docstring lists it
    assert set(parts.SLOTS) == {"mixer", "ffn", "norm", "positions"}
    assert all(slot in parts.__doc__ for slot in parts.SLOTS)


@pytest.mark.parametrize("settings, slot, cls", [
    ({}, "ffn", GeluMLP), ({"ffn_type": "swiglu"}, "ffn", SwiGLU), ({"ffn_type": "silu"}, "ffn", SiLUMLP),
    ({}, "norm", LayerNorm), ({"norm_type": "rmsnorm"}, "norm", RMSNorm), ({"norm_type": "none"}, "norm", NoNorm),
    ({}, "positions", LearnedPositions), ({"pos_type": "rope"}, "positions", RoPE),
    ({"pos_type": "nope"}, "positions", NoPositions),
])
def test_anatomy_s_own_parts_are_built_through_the_api(settings, slot, cls):
    cfg = ModelConfig(vocab_size=50, d_model=32, n_head=4, **settings)
    module = parts.build(cfg, slot)
    assert type(module) is cls
    declared = registry.find(slot, getattr(cfg, registry.SLOTS[slot].field)).params(cfg, None)
    assert sum(p.numel() for p in module.parameters()) == declared


def test_no_norm_makes_every_norm_an_identity_and_silu_keeps_swiglu_s_count():
    cfg = ModelConfig(vocab_size=50, d_model=32, n_head=4, norm_type="none", norm_pos="pre")
    model = LM(cfg)
    norms = [model.final_norm] + [n for b in model.blocks for n in (b.norm1, b.norm2)]
    assert all(isinstance(n, NoNorm) for n in norms) and model.num_params() == cfg.num_params()
    x = torch.randn(2, 3, 32)
    assert torch.equal(model.final_norm(x), x)
    silu = ModelConfig(vocab_size=50, d_model=32, n_head=4, ffn_type="silu")
    assert LM(silu).num_params() == LM(ModelConfig(vocab_size=50, d_model=32, n_head=4, ffn_type="swiglu")).num_params()


def test_a_plugin_part_is_built_as_the_model_s_own_and_its_code_is_checked():
    registry.load_plugins([EXAMPLES / "relu2.py"])
    cfg = ModelConfig(vocab_size=50, d_model=32, n_head=4, ffn_type="relu2",
                      part_options={"relu2": {"hidden": 48}})
    model = LM(cfg)
    assert type(model.blocks[0].ffn).__name__ == "Relu2" and model.blocks[0].ffn.up.out_features == 48
    assert model.num_params() == cfg.num_params()
    stale = cfg.model_copy(update={"part_code": {"relu2": "0" * 64}})  # a config resolved with other code
    with pytest.raises(parts.PartError, match=r"part relu2: the config records the code of .*relu2\.py at sha256 "
                                              r"000000000000\.\.\., but the file loaded now is"):
        LM(stale)


def test_the_mask_helper_is_softmax_attention_s():
    mask = parts.visible(2, 3, 5, 0, "cpu")  # queries at 2, 3, 4 against keys 0..4
    assert mask.tolist() == [[True, True, True, False, False], [True, True, True, True, False], [True] * 5]
    assert parts.visible(2, 3, 5, 2, "cpu").tolist()[2] == [False, False, False, True, True]  # a window of 2

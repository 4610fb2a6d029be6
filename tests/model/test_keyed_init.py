"""Keyed initialisation (model.init_key = "name", LM.reset_parameters): each parameter is drawn from a
generator keyed by (seed, its qualified name), so two models that differ by one component start from the
identical tensor wherever they share a parameter's name and shape; today's order init ("order", the
default) does not, is unchanged bit for bit, and keeps every run id. Toy sizes, fp32, on the CPU.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import torch
from helpers import LLAMA

from anatomy_cli.model import LM
from anatomy_cli.model.lm import DRAWN_VECTORS, keyed_generator
from anatomy_cli.spec.config import ModelConfig
from anatomy_cli.store import runs
from anatomy_cli.sweep.plan import expand, load_spec

pytestmark = [pytest.mark.filterwarnings("error"), pytest.mark.usefixtures("single_thread")]

EXPERIMENTS = Path(__file__).resolve().parents[2] / "experiments"
TINY = {"vocab_size": 50, "d_model": 32, "n_layer": 2, "n_head": 4, "ctx_len": 16}
# Every kind of parameter the model builds: GDN's random A_log and ones dt_bias, experts' [E, out, in]
# weights, latent attention's norms and sinks, the deepseek router, the sparse indexer's LayerNorm.
ENDS = {
    "2017": {},
    "llama": LLAMA,
    "gdn": {**LLAMA, "gdn_pattern": "DA"},
    "moe": {**LLAMA, "moe": True, "moe_shared": True},
    "deepseek": {**LLAMA, "moe": True, "moe_router": "deepseek", "moe_shared": True},
    "mla": {**LLAMA, "attn_type": "mla", "attn_sinks": True, "attn_gate": True},
    "dsa": {**LLAMA, "attn_type": "mla", "dsa": True},
    "modern": {**LLAMA, "qk_norm": True, "tie_embeddings": True, "attn_sinks": True, "parallel_block": True},
}
# One component apart: (a, b) model settings over TINY.
PAIRS = {
    "learned-vs-rope": ({"pos_type": "learned"}, {"pos_type": "rope"}),
    "gelu-vs-swiglu": ({"ffn_type": "gelu"}, {"ffn_type": "swiglu"}),
    "kv4-vs-kv2": ({"n_kv_head": 4}, {"n_kv_head": 2}),
    "layernorm-vs-rmsnorm": ({"norm_type": "layernorm"}, {"norm_type": "rmsnorm"}),
    "untied-vs-tied": ({}, {"tie_embeddings": True}),
}
# The pairs order init splits: a part that draws before others do. Norms draw nothing, and the untied head
# is drawn last, so those two pairs already share every common parameter under order init.
SHIFTED = ["learned-vs-rope", "gelu-vs-swiglu", "kv4-vs-kv2"]


def model(settings: dict, key: str = "name", seed: int | None = 3, global_seed: int = 0) -> LM:
    """An LM of TINY + settings, built after torch.manual_seed(global_seed) as a run builds it."""
    torch.manual_seed(global_seed)
    return LM(ModelConfig(**TINY, **settings, init_key=key), seed)


def params(m: LM) -> dict[str, torch.Tensor]:
    return {k: p.detach() for k, p in m.named_parameters()}


def shared(a: LM, b: LM) -> list[str]:
    """The parameter names a and b both have, at the same shape."""
    pa, pb = params(a), params(b)
    return sorted(k for k in pa.keys() & pb.keys() if pa[k].shape == pb[k].shape)


def random_names(m: LM) -> list[str]:
    """The parameters init draws at random (matrices and DRAWN_VECTORS; the rest are ones or zeros)."""
    return [k for k, p in m.named_parameters() if p.dim() >= 2 or k.rpartition(".")[2] in DRAWN_VECTORS]


# ------------------------------------------------------------------ (a) one component apart


@pytest.mark.parametrize("pair", list(PAIRS))
def test_keyed_init_gives_two_arms_every_parameter_they_share(pair):
    a_set, b_set = PAIRS[pair]
    a, b = model(a_set, global_seed=11), model(b_set, global_seed=12)  # the global stream plays no part
    names = shared(a, b)
    assert len(names) >= 10
    pa, pb = params(a), params(b)
    assert [k for k in names if not torch.equal(pa[k], pb[k])] == []


@pytest.mark.parametrize("pair", SHIFTED)
def test_order_init_does_not(pair):
    """Today's stream: a part built early (a position table, K/V heads of another width, a gate matrix)
    shifts every later draw, so the two arms of a pair start from different weights where they share."""
    a_set, b_set = PAIRS[pair]
    a, b = model(a_set, "order", global_seed=3), model(b_set, "order", global_seed=3)
    pa, pb = params(a), params(b)
    differ = [k for k in shared(a, b) if pa[k].dim() >= 2 and not torch.equal(pa[k], pb[k])]
    assert len(differ) >= 3


# ------------------------------------------------------------------ (b) deterministic, and per seed


@pytest.mark.parametrize("end", list(ENDS))
def test_keyed_init_depends_on_the_seed_and_the_name_alone(end):
    """Built twice under different global streams: identical weights and buffers (a random parameter that
    keyed init does not redraw, as A_log would be without DRAWN_VECTORS, fails here)."""
    a = model(ENDS[end], seed=5, global_seed=0)
    b = model(ENDS[end], seed=5, global_seed=1)
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    assert [k for k in sa if not torch.equal(sa[k], sb[k])] == []
    other = params(model(ENDS[end], seed=6))
    pa = params(a)
    assert [k for k in random_names(a) if torch.equal(pa[k], other[k])] == []  # another seed: every draw moves


def test_seed_none_is_the_global_seed_as_torch_takes_it():
    """LM(cfg) after torch.manual_seed(s) keys on s, as LM(cfg, s) does; torch takes -1 as 2^64 - 1."""
    for s in (5, -1):
        explicit = params(model(LLAMA, seed=s, global_seed=0))
        implicit = params(model(LLAMA, seed=None, global_seed=s))
        assert all(torch.equal(explicit[k], implicit[k]) for k in explicit)
    assert all(torch.equal(a, b) for a, b in zip(params(model({}, seed=-1)).values(),
                                                 params(model({}, seed=2**64 - 1)).values()))


def test_the_key_is_a_stable_hash_of_seed_and_name():
    """sha256("1337:tok.weight"), first 63 bits: the same number in every process and version."""
    digest = hashlib.sha256(b"1337:tok.weight").digest()
    assert keyed_generator(1337, "tok.weight").initial_seed() == int.from_bytes(digest[:8], "big") >> 1
    assert keyed_generator(1337, "tok.weight").initial_seed() == 287223060428785730
    assert keyed_generator(1338, "tok.weight").initial_seed() != 287223060428785730
    assert keyed_generator(1337, "head.weight").initial_seed() != 287223060428785730


# ------------------------------------------------------------------ (c) the same distributions


def test_keyed_init_draws_what_order_init_draws():
    """Each matrix's std matches order init's (N(0, 0.02); residual outputs 0.02 / sqrt(2L)), and the
    vectors stay as built: norm weights and dt_bias ones, biases and sinks zeros, exp(A_log) in [0.01, 16]."""
    big = {"vocab_size": 512, "d_model": 128, "n_layer": 2, "n_head": 4, "ctx_len": 16}
    settings = {**LLAMA, "gdn_pattern": "DA", "attn_sinks": True, "gdn_heads": 64}
    keyed, order = (LM(ModelConfig(**big, **settings, init_key=k), 9) for k in ("name", "order"))
    pk, po = params(keyed), params(order)
    assert pk.keys() == po.keys()
    for k, p in pk.items():
        if p.dim() >= 2 and p.numel() >= 4096:
            std = 0.02 / 2 if k.endswith(("out.weight", "down.weight")) else 0.02  # 1/sqrt(2 * 2 layers)
            assert abs(float(p.mean())) < 4 * std / p.numel() ** 0.5, k
            assert float(p.std()) == pytest.approx(std, rel=0.05), k
            assert float(p.std()) == pytest.approx(float(po[k].std()), rel=0.05), k
        elif k.endswith("A_log"):
            A = p.exp()  # U(0.01, 16): mean 8
            assert ((A > 0.0099) & (A < 16.01)).all() and float(A.mean()) == pytest.approx(8, rel=0.35)
            assert not torch.equal(p, po[k])
        elif p.dim() == 1:
            assert torch.equal(p, po[k]), k  # ones or zeros, no draw
            assert set(p.unique().tolist()) <= {0.0, 1.0}, k
    assert any(k.endswith("sinks") for k in pk) and any(k.endswith("dt_bias") for k in pk)


# ------------------------------------------------------------------ (d) today's default unchanged

# sum and sum of squares of every parameter after torch.manual_seed(7); LM(cfg), and the global stream's
# next draw after it, computed with the code before init_key existed (git archive of 25739fc). The draws
# are the same on every CPU, but normal_'s vectorised transform rounds differently by ATen's CPU capability
# (6e-8 relative between AVX-512 and the default path), so the sums are compared at 1e-6: an init that
# drew in another order or from another stream moves them by far more. The stream's next draw is exact.
ORDER_PINS = {
    "2017": (127.05693608789193, 136.244643736927, 0.1772356629371643),
    "llama": (158.39070825173235, 168.66512353379267, 0.5888288021087646),
    "gdn": (180.74740931152851, 205.20803116841932, 0.47617632150650024),
}


@pytest.mark.parametrize("end", list(ORDER_PINS))
def test_order_init_is_the_init_before_the_field(end):
    torch.manual_seed(7)
    m = LM(ModelConfig(**TINY, **ENDS[end]))  # init_key defaults to "order"
    total = sum(float(p.detach().double().sum()) for p in m.parameters())
    squares = sum(float(p.detach().double().pow(2).sum()) for p in m.parameters())
    assert (total, squares) == pytest.approx(ORDER_PINS[end][:2], rel=1e-6)
    assert float(torch.rand(1)) == ORDER_PINS[end][2]


def test_run_ids_move_only_when_init_key_is_name():
    """The demo's ids are pinned in tests/spec/test_config.py; "order" written out keeps them."""
    plan = {p.run_id: p.config for p in expand(load_spec(EXPERIMENTS / "demo.toml"))}
    config = plan["2017-s1337-676b9f59"].model_dump(mode="json")
    assert config["model"]["init_key"] == "order"
    assert runs.config_hash(config) == "676b9f59"
    keyed = {**config, "model": {**config["model"], "init_key": "name"}}
    assert runs.config_hash(keyed) != "676b9f59"

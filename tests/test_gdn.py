"""Gated DeltaNet (gdn): the layer against transformers' Qwen3-Next layer, its two forms against each
other, and the hybrid model's parameter count, causality, stateful decode and determinism.

The reference is Qwen3NextGatedDeltaNet on its PyTorch fallback path: the four functions that
transformers would swap for fla / causal-conv1d kernels are unwrapped to their torch bodies, so the
test compares against the reference code even where those packages are installed.
"""

from __future__ import annotations

import inspect
import math

import pytest
import torch

from anatomy_cli.config import ModelConfig
from anatomy_cli.model.gdn import GatedDeltaNet, chunked_delta_rule, l2norm, recurrent_delta_rule

pytestmark = [pytest.mark.usefixtures("single_thread")]

FALLBACKS = ("torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule", "causal_conv1d_fn",
             "causal_conv1d_update")


def gdn_config(**overrides) -> ModelConfig:
    return ModelConfig(**{"vocab_size": 50, "d_model": 32, "n_layer": 4, "n_head": 4, "ctx_len": 24,
                          "gdn_pattern": "DDDA", **overrides})


def scrambled_layer(cfg: ModelConfig, seed: int = 0) -> GatedDeltaNet:
    """Unit-gain weights (matrices 1/sqrt(fan_in), vectors around 1) so that every part matters."""
    torch.manual_seed(seed)
    layer = GatedDeltaNet(cfg).eval()
    with torch.no_grad():
        for p in layer.parameters():
            p.normal_(0, 1 / math.sqrt(p.shape[-1])) if p.dim() >= 2 else p.normal_(1.0, 0.3)
    return layer


# ------------------------------------------------------------------------- the reference layer


@pytest.fixture
def hf(monkeypatch):
    """transformers' qwen3_next module with its kernel hooks pinned to the torch fallbacks."""
    pytest.importorskip("transformers", reason="transformers is not installed")
    mod = pytest.importorskip("transformers.models.qwen3_next.modeling_qwen3_next",
                              reason="this transformers has no Qwen3-Next")
    for name in FALLBACKS:
        monkeypatch.setattr(mod, name, inspect.unwrap(getattr(mod, name)))
    return mod


def hf_layer(hf, layer: GatedDeltaNet, cfg: ModelConfig):
    """A Qwen3NextGatedDeltaNet holding `layer`'s weights, and its config.

    HF groups in_proj_qkvz per key head, [q_g | k_g | v_g | z_g] with v_g, z_g the r = Hv / Hk value
    heads that key head serves, and in_proj_ba per key head as [b_g | a_g]; anatomy keeps each part
    contiguous. The conv channels (q | k | v, heads in order) and everything else map one to one.
    """
    from transformers import Qwen3NextConfig

    Hk, Hv, hd = cfg.gdn_shape
    d, r = cfg.d_model, Hv // Hk
    hc = Qwen3NextConfig(hidden_size=d, num_hidden_layers=1, layer_types=["linear_attention"],
                         linear_num_key_heads=Hk, linear_num_value_heads=Hv, linear_key_head_dim=hd,
                         linear_value_head_dim=hd, linear_conv_kernel_dim=cfg.gdn_conv,
                         rms_norm_eps=cfg.norm_eps, hidden_act="silu", num_attention_heads=cfg.n_head,
                         num_key_value_heads=cfg.n_kv_head, vocab_size=cfg.vocab_size)
    ref = hf.Qwen3NextGatedDeltaNet(hc, 0).eval()
    q, k, v, z = layer.in_proj.weight.split((Hk * hd, Hk * hd, Hv * hd, Hv * hd))
    b, a = layer.ba.weight.split(Hv)
    with torch.no_grad():
        ref.in_proj_qkvz.weight.copy_(torch.cat([q.view(Hk, hd, d), k.view(Hk, hd, d), v.view(Hk, r * hd, d),
                                                 z.view(Hk, r * hd, d)], 1).reshape(-1, d))
        ref.in_proj_ba.weight.copy_(torch.cat([b.view(Hk, r, d), a.view(Hk, r, d)], 1).reshape(-1, d))
        ref.conv1d.weight.copy_(layer.conv)
        ref.dt_bias.copy_(layer.dt_bias)
        ref.A_log.copy_(layer.A_log)
        ref.norm.weight.copy_(layer.norm_weight)
        ref.out_proj.weight.copy_(layer.out.weight)
    return ref, hc


SHAPES = {  # (key heads, value heads, head dim) as Qwen3-Next's 1:2, equal heads, and 1:4
    "default": {},
    "equal": {"gdn_key_heads": 4},
    "quarter": {"gdn_key_heads": 1, "gdn_head_dim": 16},
}


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("chunk", [64, 8, 6])  # one chunk; several; several with a ragged end (T = 20)
def test_layer_equals_qwen3_next_prefill(hf, shape, chunk):
    cfg = gdn_config(**SHAPES[shape])
    layer = scrambled_layer(cfg)
    layer.CHUNK = chunk
    ref, _ = hf_layer(hf, layer, cfg)
    x = torch.randn(2, 20, 32, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ours, theirs = layer(x), ref(x)
    assert theirs.abs().max() > 0.5  # O(1) outputs: the tolerance below is meaningful
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=0)


def test_layer_equals_qwen3_next_in_fp64(hf):
    """HF's fallback kernels compute the recurrence in fp32 whatever the input dtype, so fp64 parity is
    bounded by fp32 rounding of that part; ours in fp64 is checked against itself far tighter below."""
    cfg = gdn_config()
    layer = scrambled_layer(cfg).double()
    ref, _ = hf_layer(hf, layer, cfg)
    ref = ref.double()
    x = torch.randn(2, 20, 32, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(layer(x), ref(x), atol=5e-6, rtol=0)


@pytest.mark.parametrize("prefill", [1, 7])
def test_layer_decode_equals_qwen3_next_decode(hf, prefill):
    """Prefill (chunked form) then single tokens (recurrent form), both sides through their state."""
    from transformers import DynamicCache

    cfg = gdn_config()
    layer = scrambled_layer(cfg)
    ref, hc = hf_layer(hf, layer, cfg)
    x = torch.randn(2, 16, 32, generator=torch.Generator().manual_seed(2))
    cache, state = DynamicCache(config=hc), layer.new_state(2)
    with torch.no_grad():
        steps = range(prefill, 16)
        theirs = [ref(x[:, :prefill], cache=cache)] + [ref(x[:, t : t + 1], cache=cache) for t in steps]
        ours = [layer(x[:, :prefill], state)] + [layer(x[:, t : t + 1], state) for t in steps]
        full = layer(x)
    torch.testing.assert_close(torch.cat(ours, 1), torch.cat(theirs, 1), atol=1e-5, rtol=0)
    torch.testing.assert_close(torch.cat(ours, 1), full, atol=1e-5, rtol=0)
    torch.testing.assert_close(state.memory, cache.get_recurrent_state(0).float(), atol=1e-5, rtol=0)


# ------------------------------------------------------------------------- the two forms


def delta_inputs(B=2, H=3, T=24, dk=8, dv=5, seed=0, dtype=torch.float64):
    gen = torch.Generator().manual_seed(seed)
    q = l2norm(torch.randn(B, H, T, dk, generator=gen, dtype=dtype)) / math.sqrt(dk)
    k = l2norm(torch.randn(B, H, T, dk, generator=gen, dtype=dtype))
    v = torch.randn(B, H, T, dv, generator=gen, dtype=dtype)
    g = -torch.rand(B, H, T, generator=gen, dtype=dtype) * 2  # decays exp(g) in (0.13, 1)
    beta = torch.rand(B, H, T, generator=gen, dtype=dtype)
    return q, k, v, g, beta


@pytest.mark.parametrize("chunk", [1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 24, 32])
def test_chunked_equals_recurrent_for_every_chunk(chunk):
    """Every chunk size gives the recurrence (divisors of T = 24 and not: 5, 7, 16 pad the end), with
    and without a start memory, fp64 to rounding."""
    q, k, v, g, beta = delta_inputs()
    start = torch.randn(2, 3, 8, 5, generator=torch.Generator().manual_seed(9), dtype=torch.float64)
    for memory in (None, start):
        o_ref, m_ref = recurrent_delta_rule(q, k, v, g, beta, memory)
        o, m = chunked_delta_rule(q, k, v, g, beta, memory, chunk)
        torch.testing.assert_close(o, o_ref, atol=1e-12, rtol=0)
        torch.testing.assert_close(m, m_ref, atol=1e-12, rtol=0)


def test_recurrence_is_the_delta_rule():
    """One step by the formula: S = a S + beta k (v - a S^T k)^T, o = S^T q, with a = exp(g)."""
    q, k, v, g, beta = delta_inputs(B=1, H=1, T=1)
    S = torch.randn(1, 1, 8, 5, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    a, kk, vv, qq, bb = g.exp().item(), k[0, 0, 0], v[0, 0, 0], q[0, 0, 0], beta.item()
    S_new = a * S[0, 0] + bb * torch.outer(kk, vv - a * S[0, 0].T @ kk)
    o, m = recurrent_delta_rule(q, k, v, g, beta, S)
    torch.testing.assert_close(m[0, 0], S_new, atol=1e-14, rtol=0)
    torch.testing.assert_close(o[0, 0, 0], S_new.T @ qq, atol=1e-14, rtol=0)
    # the delta rule recalls: with beta = 1, no decay and a unit key, the memory now maps k to v exactly
    unit = k / k.norm(dim=-1, keepdim=True)
    _, m1 = recurrent_delta_rule(q, unit, v, torch.zeros_like(g), torch.ones_like(beta), S)
    torch.testing.assert_close(m1[0, 0].T @ unit[0, 0, 0], vv, atol=1e-12, rtol=0)

"""Gated DeltaNet (gdn): the layer against transformers' Qwen3-Next layer, its two forms against each
other, and the hybrid model's parameter count, causality and stateful decode beyond the component
row (test_rows.py checks the row, DDDA at both ends: counts, causality, decode, determinism).

The reference is Qwen3NextGatedDeltaNet on its PyTorch fallback path: the four functions that
transformers would swap for fla / causal-conv1d kernels are unwrapped to their torch bodies, so the
test compares against the reference code even where those packages are installed.
"""

from __future__ import annotations

import inspect
import json
import math
import re
import shutil
from pathlib import Path

import pytest
import torch
from helpers import LLAMA_MHA
from lm_checks import assert_causal, decode_in_chunks, tokens
from toy_data import write_corpus
from typer.testing import CliRunner

from anatomy_cli.cli.main import app
from anatomy_cli.model import LM
from anatomy_cli.model.attention import CausalSelfAttention
from anatomy_cli.model.gdn import GatedDeltaNet, chunked_delta_rule, l2norm, recurrent_delta_rule
from anatomy_cli.model.generate import generate
from anatomy_cli.model.kv_cache import KVCache
from anatomy_cli.spec.config import ConfigError, ModelConfig, RunConfig, validate
from anatomy_cli.store import runs
from anatomy_cli.training.run import train

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


def hf_config(cfg: ModelConfig):
    """Qwen3NextConfig of the same sizes: dense MLPs (num_experts 0), rotary over cfg.rope_fraction of
    each head (Qwen3-Next's partial_rotary_factor, 0.25 by default), layer_types from anatomy's kinds."""
    from transformers import Qwen3NextConfig

    Hk, Hv, hd = cfg.gdn_shape
    hc = Qwen3NextConfig(
        vocab_size=cfg.vocab_size, hidden_size=cfg.d_model, intermediate_size=cfg.ffn_hidden,
        num_hidden_layers=cfg.n_layer, num_attention_heads=cfg.n_head, num_key_value_heads=cfg.n_kv_head,
        head_dim=cfg.head_dim, hidden_act="silu", rms_norm_eps=cfg.norm_eps, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_base,
                         "partial_rotary_factor": cfg.rope_fraction},
        linear_num_key_heads=Hk, linear_num_value_heads=Hv, linear_key_head_dim=hd, linear_value_head_dim=hd,
        linear_conv_kernel_dim=cfg.gdn_conv, num_experts=0, max_position_embeddings=4 * cfg.ctx_len,
        layer_types=["linear_attention" if kind == "gdn" else "full_attention" for kind in cfg.layer_kinds])
    hc._attn_implementation = "eager"
    return hc


@torch.no_grad()
def copy_gdn(ref, layer: GatedDeltaNet, cfg: ModelConfig) -> None:
    """anatomy's GDN weights into a Qwen3NextGatedDeltaNet.

    HF groups in_proj_qkvz per key head, [q_g | k_g | v_g | z_g] with v_g, z_g the r = Hv / Hk value
    heads that key head serves, and in_proj_ba per key head as [b_g | a_g]; anatomy keeps each part
    contiguous. The conv channels (q | k | v, heads in order) and everything else map one to one.
    """
    Hk, Hv, hd = cfg.gdn_shape
    d, r = cfg.d_model, Hv // Hk
    q, k, v, z = layer.in_proj.weight.split((Hk * hd, Hk * hd, Hv * hd, Hv * hd))
    b, a = layer.ba.weight.split(Hv)
    ref.in_proj_qkvz.weight.copy_(torch.cat([q.view(Hk, hd, d), k.view(Hk, hd, d), v.view(Hk, r * hd, d),
                                             z.view(Hk, r * hd, d)], 1).reshape(-1, d))
    ref.in_proj_ba.weight.copy_(torch.cat([b.view(Hk, r, d), a.view(Hk, r, d)], 1).reshape(-1, d))
    ref.conv1d.weight.copy_(layer.conv)
    ref.dt_bias.copy_(layer.dt_bias)
    ref.A_log.copy_(layer.A_log)
    ref.norm.weight.copy_(layer.norm_weight)
    ref.out_proj.weight.copy_(layer.out.weight)


def hf_layer(hf, layer: GatedDeltaNet, cfg: ModelConfig):
    """A Qwen3NextGatedDeltaNet holding `layer`'s weights, and its config."""
    hc = hf_config(cfg.model_copy(update={"n_layer": 1, "gdn_pattern": "D"}))
    ref = hf.Qwen3NextGatedDeltaNet(hc, 0).eval()
    copy_gdn(ref, layer, cfg)
    return ref, hc


@torch.no_grad()
def hf_model(hf, lm: LM):
    """Qwen3NextForCausalLM holding the weights of a LLaMA-end hybrid with Qwen3-Next's attention parts
    (QK-norm, gated output, partial rotary). Every part maps exactly: zero-centred RMSNorms (weight 1 + w:
    w = ours - 1); q_proj is our gated Q rows as they are (per head [q_h | gate_h], the same layout)."""
    cfg = lm.cfg
    assert cfg.qk_norm and cfg.attn_gate, "Qwen3-Next's attention always has QK-norm and the output gate"
    ref = hf.Qwen3NextForCausalLM(hf_config(cfg)).eval()
    ref.model.embed_tokens.weight.copy_(lm.tok.weight)
    ref.lm_head.weight.copy_(lm.head.weight)
    ref.model.norm.weight.copy_(lm.final_norm.weight - 1)
    for block, layer in zip(lm.blocks, ref.model.layers):
        layer.input_layernorm.weight.copy_(block.norm1.weight - 1)
        layer.post_attention_layernorm.weight.copy_(block.norm2.weight - 1)
        for name in ("gate", "up", "down"):
            getattr(layer.mlp, f"{name}_proj").weight.copy_(getattr(block.ffn, name).weight)
        if isinstance(block.attn, GatedDeltaNet):
            copy_gdn(layer.linear_attn, block.attn, cfg)
            continue
        attn, ours = layer.self_attn, block.attn
        q, k, v = ours.qkv.weight.split(ours.split)
        attn.q_proj.weight.copy_(q)
        attn.k_proj.weight.copy_(k)
        attn.v_proj.weight.copy_(v)
        attn.o_proj.weight.copy_(ours.out.weight)
        attn.q_norm.weight.copy_(ours.q_norm.weight - 1)
        attn.k_norm.weight.copy_(ours.k_norm.weight - 1)
    return ref


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
    cache, ours_cache = DynamicCache(config=hc), KVCache([layer.new_state(2, 16)])
    with torch.no_grad():
        steps = range(prefill, 16)
        theirs = [ref(x[:, :prefill], cache=cache)] + [ref(x[:, t : t + 1], cache=cache) for t in steps]
        ours = [layer(x[:, :prefill], cache=ours_cache)]
        ours += [layer(x[:, t : t + 1], cache=ours_cache) for t in steps]
        full = layer(x)
    torch.testing.assert_close(torch.cat(ours, 1), torch.cat(theirs, 1), atol=1e-5, rtol=0)
    torch.testing.assert_close(torch.cat(ours, 1), full, atol=1e-5, rtol=0)
    torch.testing.assert_close(ours_cache[0].memory, cache.get_recurrent_state(0), atol=1e-5, rtol=0)


@pytest.mark.parametrize("pattern", ["DDDA", "DADA"])
def test_hybrid_model_equals_qwen3_next(hf, make_lm, pattern):
    """Whole-model logits, and prefill + single-token decode through both caches: Qwen3-Next's attention
    as it is, its sigmoid output gate and a quarter of each head rotated (2 of 8 dims). fp32 logits up
    to ~5 through four layers and a chunked delta rule: the kernel path moves them (4.7e-5 on the
    native path here, 1.7e-4 under ATen's default capability), so 1e-3, ten times under the smallest
    planted mistake below (> 1e-2); the layers are compared at 1e-5 / fp64 above."""
    from transformers import DynamicCache

    lm = make_lm(**{**MODELS["llama+gqa+qknorm"], **QWEN3_NEXT_ATTENTION, "gdn_pattern": pattern, "norm_eps": 1e-6})
    ref = hf_model(hf, lm)
    idx = tokens(2, 20, seed=6)
    with torch.no_grad():
        ours, theirs = lm(idx)[0], ref(idx).logits
        assert theirs.abs().max() > 1.0
        torch.testing.assert_close(ours, theirs, atol=1e-3, rtol=0)
        cache, hf_cache = lm.new_cache(2, 20), DynamicCache(config=ref.config)
        steps = [(0, 8)] + [(t, t + 1) for t in range(8, 20)]
        ours = torch.cat([lm(idx[:, a:b], cache=cache)[0] for a, b in steps], 1)
        theirs = torch.cat([ref(idx[:, a:b], cache=hf_cache, use_cache=True).logits for a, b in steps], 1)
    torch.testing.assert_close(ours, theirs, atol=1e-3, rtol=0)


@pytest.mark.parametrize("mistake", ["gate not applied", "full rotary"])
def test_hybrid_parity_fails_on_a_planted_mistake(hf, make_lm, mistake):
    """The whole-model comparison above sees each Qwen3-Next attention part: our attention layers with
    the gate dropped, or rotating whole heads, no longer give Qwen3-Next's logits."""
    from anatomy_cli.model.positions import RoPE

    lm = make_lm(**{**MODELS["llama+gqa+qknorm"], **QWEN3_NEXT_ATTENTION, "norm_eps": 1e-6})
    ref = hf_model(hf, lm)
    if mistake == "gate not applied":
        for attn in (b.attn for b in lm.blocks if isinstance(b.attn, CausalSelfAttention)):
            attn.gated = False  # the gate rows are still computed, and dropped
    else:
        lm.positions = RoPE(lm.cfg.model_copy(update={"rope_fraction": 1.0}))
    idx = tokens(2, 20, seed=6)
    with torch.no_grad():
        assert (lm(idx)[0] - ref(idx).logits).abs().max() > 1e-2


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


# ------------------------------------------------------------------------- the hybrid model

HYBRID = {"n_layer": 4, "gdn_pattern": "DDDA"}
MODELS = {  # the attention layers alone, with GQA and QK-norm, and a stack with no attention at all
    "llama": {**HYBRID, **LLAMA_MHA},
    "llama+gqa+qknorm": {**HYBRID, **LLAMA_MHA, "n_kv_head": 2, "qk_norm": True},
    "all-gdn": {**LLAMA_MHA, "gdn_pattern": "D"},
}
QWEN3_NEXT_ATTENTION = {"attn_gate": True, "rope_fraction": 0.25}  # its gated output and partial rotary
BEYOND_THE_ROW = pytest.mark.parametrize("model", ["llama+gqa+qknorm", "all-gdn"])  # test_rows has the ends


def test_layer_kinds_follow_the_pattern():
    assert gdn_config().layer_kinds == ("gdn", "gdn", "gdn", "attn")
    assert gdn_config(n_layer=8, gdn_pattern="DA").layer_kinds == ("gdn", "attn") * 4
    assert gdn_config(gdn_pattern="D").layer_kinds == ("gdn",) * 4
    assert gdn_config(gdn_pattern="").layer_kinds == ("attn",) * 4


def test_param_count_is_exact_at_the_published_size():
    """d 128, 4 heads: value heads 4 x 32, key heads 2 x 32. in_proj 128 x (64 + 64 + 128 + 128),
    b and a 128 x 8, conv 256 x 4, dt_bias and A_log 4 each, gated norm 32, out 128 x 128."""
    cfg = ModelConfig(vocab_size=1719, d_model=128, n_layer=4, n_head=4, ctx_len=64, gdn_pattern="DDDA",
                      **LLAMA_MHA)
    assert cfg.gdn_shape == (2, 4, 32)
    gdn = 128 * 384 + 128 * 8 + 256 * 4 + 4 + 4 + 32 + 128 * 128
    assert cfg.mixer_params("gdn") == gdn == 67_624
    assert cfg.mixer_params("attn") == 4 * 128 * 128  # MHA: 2,088 fewer (3.1%)
    plain = ModelConfig(**{**cfg.model_dump(), "gdn_pattern": ""})
    assert cfg.num_params() - plain.num_params() == 3 * (gdn - 4 * 128 * 128)
    assert cfg.active_params() == cfg.num_params()


@pytest.mark.parametrize("shape", [{}, *SHAPES.values(), {"gdn_conv": 2, "gdn_heads": 2, "qk_norm": True},
                                   {"gdn_conv": 1, "n_kv_head": 1, "tie_embeddings": True}])
@pytest.mark.parametrize("pattern", ["DDDA", "DA", "D", "ADDA"])
def test_param_formula_equals_the_modules(shape, pattern):
    cfg = gdn_config(gdn_pattern=pattern, **shape)
    model = LM(cfg)
    for layer, block in enumerate(model.blocks):
        kind = cfg.layer_kinds[layer]
        assert type(block.attn) is (GatedDeltaNet if kind == "gdn" else CausalSelfAttention)
        assert sum(p.numel() for p in block.attn.parameters()) == cfg.mixer_params(kind)
    assert cfg.num_params() == model.num_params()


def test_off_fields_stay_out_of_the_run_id():
    """At their off values the gdn fields do not enter the hash, so every existing run keeps its id."""
    data = RunConfig(model={"vocab_size": 50}).model_dump(mode="json")
    older = {**data, "model": {k: v for k, v in data["model"].items() if not k.startswith("gdn_")}}
    assert runs.config_hash(data) == runs.config_hash(older)
    on = {**data, "model": {**data["model"], "gdn_pattern": "DDDA"}}
    assert runs.config_hash(on) != runs.config_hash(data)


@pytest.mark.parametrize("overrides, message", [
    ({"gdn_pattern": "DDA"}, "gdn_pattern='DDA' has 3 letters, which must divide n_layer=4"),
    ({"gdn_pattern": "DDXA"}, "gdn_pattern='DDXA': use only the letters D, A"),
    ({"gdn_pattern": "AA"}, "gdn_pattern='AA' has no D"),
    ({"gdn_heads": 6, "gdn_key_heads": 4}, "gdn_key_heads=4 must divide gdn_heads=6"),
    ({"gdn_conv": 0}, "gdn_conv"),
])
def test_bad_settings_are_one_line(overrides, message):
    with pytest.raises(ConfigError, match=re.escape(message)) as err:
        validate(ModelConfig, {"n_layer": 4, **overrides})
    assert "\n" not in str(err.value)


def test_a_pattern_that_does_not_divide_n_layer_exits_2(tmp_path):
    corpus = write_corpus(tmp_path)
    result = CliRunner().invoke(app, ["train", "--set", f"data.source={corpus}", "--set", "model.n_layer=3",
                                      "--set", "model.gdn_pattern=DDDA", "--out", str(tmp_path / "o")])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "must divide n_layer=3" in lines[0], result.stderr
    assert not (tmp_path / "o").exists()


@BEYOND_THE_ROW
def test_causality(make_lm, model):
    lm = make_lm(**MODELS[model])
    with torch.no_grad():  # decay ~0.9 a step: the scrambled A (~e) forgets a token within ~10 steps
        for block in lm.blocks:
            if isinstance(block.attn, GatedDeltaNet):
                block.attn.A_log.fill_(math.log(0.05))
    assert_causal(lm)


@BEYOND_THE_ROW
@pytest.mark.parametrize("chunks", [[6] + [1] * 10, [5, 3, 1, 4, 1, 2], [1] * 16],
                         ids=["prefill", "mixed", "steps"])
def test_stateful_decode_equals_full_forward(make_lm, model, chunks):
    """fp64 to rounding (the two forms are one function); fp32 within its rounding through 4 layers."""
    lm = make_lm(**MODELS[model])
    idx = tokens(2, 16, seed=1)
    with torch.no_grad():
        full, _ = lm(idx)
        decoded, cache = decode_in_chunks(lm, idx, chunks)
        torch.testing.assert_close(decoded, full, atol=1e-4, rtol=0)
        lm.double()
        full, _ = lm(idx)
        decoded, cache = decode_in_chunks(lm, idx, chunks)
    assert cache.past_len == 16 and cache[0].memory.dtype == torch.float64
    torch.testing.assert_close(decoded, full, atol=1e-10, rtol=0)


def test_decode_continues_past_ctx_len(make_lm):
    """RoPE attention layers plus GDN layers: no length limit anywhere; decode == full at 40 > 24."""
    lm = make_lm(**MODELS["llama"]).double()
    idx = tokens(1, 40, seed=4)
    with torch.no_grad():
        full, _ = lm(idx)
        decoded, cache = decode_in_chunks(lm, idx, [30] + [1] * 10)
    torch.testing.assert_close(decoded, full, atol=1e-10, rtol=0)


def test_greedy_generation_cached_equals_uncached_across_context_shifts(make_lm):
    """generate's context shift resets the cache: the GDN memory must be forgotten with it."""
    lm = make_lm(**MODELS["llama+gqa+qknorm"], ctx_len=16)
    prefix = tokens(1, 5, seed=2)[0].tolist()
    cached = list(generate(lm, prefix, 40, temp=0, use_cache=True))
    assert cached == list(generate(lm, prefix, 40, temp=0, use_cache=False))


def test_gdn_layers_read_no_positions(make_lm):
    """Every layer GDN: shifting every position id changes nothing, RoPE or not (order is the recurrence)."""
    lm = make_lm(**MODELS["all-gdn"])
    idx = tokens(2, 10)
    with torch.no_grad():
        torch.testing.assert_close(lm(idx, pos=torch.arange(7, 17))[0], lm(idx)[0], atol=0, rtol=0)


@pytest.mark.parametrize("chunk", [1, 3, 4, 7, 16, 64])
def test_model_logits_do_not_depend_on_the_chunk(make_lm, chunk, monkeypatch):
    lm = make_lm(**MODELS["llama"]).double()
    idx = tokens(2, 20, seed=5)
    with torch.no_grad():
        ref, _ = lm(idx)
        monkeypatch.setattr(GatedDeltaNet, "CHUNK", chunk)
        torch.testing.assert_close(lm(idx)[0], ref, atol=1e-10, rtol=0)


# ------------------------------------------------------------------------- the decode state


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_state_bytes_are_the_formula_and_do_not_grow(make_lm, dtype):
    lm = make_lm(**MODELS["llama+gqa+qknorm"])
    elem = torch.tensor([], dtype=dtype).element_size()
    short, long = lm.new_cache(2, 16, dtype=dtype), lm.new_cache(2, 4096, dtype=dtype)
    Hk, Hv, hd = lm.cfg.gdn_shape
    gdn = 2 * ((4 - 1) * (2 * Hk + Hv) * hd * elem + Hv * hd * hd * 4)  # conv tail + fp32 memory
    for layer, kind in enumerate(lm.cfg.layer_kinds):
        assert short.layer_bytes()[layer] == lm.cfg.state_bytes(kind, 2, 16, elem)
        assert long.layer_bytes()[layer] == lm.cfg.state_bytes(kind, 2, 4096, elem)
        if kind == "gdn":
            assert short[layer].memory.dtype == torch.float32 and short[layer].conv.dtype == dtype
            assert short.layer_bytes()[layer] == long.layer_bytes()[layer] == gdn
        else:
            assert long.layer_bytes()[layer] == 256 * short.layer_bytes()[layer]
    assert short.capacity == 16  # the attention layer's KV bounds it; the GDN states do not


def test_all_gdn_cache_has_no_capacity(make_lm):
    lm = make_lm(**MODELS["all-gdn"])
    cache = lm.new_cache(1, 4)
    assert cache.capacity is None
    with torch.no_grad():
        lm(tokens(1, 9), cache=cache)  # more than max_len: nothing bounds a recurrent state
    assert cache.past_len == 9


def test_reset_forgets_the_memory(make_lm):
    lm = make_lm(**MODELS["llama"])
    idx = tokens(1, 8)
    with torch.no_grad():
        cache = lm.new_cache(1, 16)
        lm(tokens(1, 8, seed=9), cache=cache)
        cache.reset()
        assert all(float(cache[i].memory.abs().sum()) == 0 for i in range(3))
        torch.testing.assert_close(lm(idx, cache=cache)[0], lm(idx)[0], atol=1e-5, rtol=1e-5)


# ------------------------------------------------------------------------- training


def test_every_parameter_gets_a_gradient(make_lm):
    lm = make_lm(**MODELS["llama"]).train()
    _, loss = lm(tokens(2, 12), tokens(2, 12, seed=1))
    loss.backward()
    for name, p in lm.named_parameters():
        assert p.grad is not None and p.grad.abs().max() > 0, name


def test_bf16_autocast_keeps_the_recurrence_in_fp32():
    """Under autocast the delta rule still multiplies in fp32: exactly the fp32 result of its inputs."""
    layer = GatedDeltaNet(gdn_config())
    q, k, v, g, beta = (t.to(torch.bfloat16) for t in delta_inputs(H=4, dk=8, dv=8, dtype=torch.float32))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        o = layer.delta_rule(q, k, v, g, beta, None)
    ref, _ = chunked_delta_rule(*(t.float() for t in (q, k, v, g, beta)), chunk=layer.CHUNK)
    assert o.dtype == torch.float32
    torch.testing.assert_close(o, ref, atol=0, rtol=0)


# ------------------------------------------------------------------------- a trained run: exams, export


@pytest.fixture(scope="module")
def gdn_run(tmp_path_factory) -> Path:
    """A tiny trained hybrid (RoPE in its attention layer), ctx_len 16."""
    root = tmp_path_factory.mktemp("gdn")
    corpus = write_corpus(root, 4000)
    cfg = RunConfig.model_validate({
        "name": "gdn", "seed": 1,
        "model": {"d_model": 32, "n_layer": 2, "n_head": 4, "ctx_len": 16, "gdn_pattern": "DA", **LLAMA_MHA},
        "train": {"steps": 6, "batch_size": 4, "lr": 3e-3, "warmup": 1, "eval_interval": 3, "eval_batches": 2,
                  "log_interval": 3, "sample_len": 0, "device": "cpu", "threads": 1},
        "data": {"source": str(corpus)},
    })
    before = torch.get_num_threads()
    assert train(cfg, root / "run")["status"] == runs.COMPLETED
    torch.set_num_threads(before)
    return root / "run"


def invoke(*args) -> object:
    return CliRunner().invoke(app, [str(a) for a in args])


def test_eval_extrapolates_a_gdn_run(gdn_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(gdn_run, run)
    result = invoke("eval", run, "--ctx", "1x,2x,4x", "--json")
    assert result.exit_code == 0, result.output
    losses = json.loads(result.stdout)["runs"][0]["val_loss_by_ctx"]
    assert set(losses) == {"16", "32", "64"} and all(math.isfinite(v) for v in losses.values())
    summary = json.loads((run / runs.SUMMARY).read_text())
    assert losses["16"] == pytest.approx(summary["best_val_loss"], abs=1e-5)  # 1x is the run's own loss


def test_bench_decode_reports_constant_gdn_state_against_a_growing_kv_cache(gdn_run):
    result = invoke("bench-decode", gdn_run, "--new", 4, "--prefix-len", 20, "--kv-heads", "4", "--json")
    assert result.exit_code == 0, result.output
    row = json.loads(result.stdout)["rows"][0]
    cfg = ModelConfig.model_validate(json.loads((gdn_run / runs.CONFIG).read_text())["model"])
    assert row["same_output"] and row["weights"] == "trained (run)"
    assert row["kv_cache_bytes"] == row["kv_formula_bytes"] == cfg.cache_bytes(1, 24, 4)
    at4k, at32k = row["long_context"]
    assert (at4k["positions"], at32k["positions"]) == (4096, 32768)
    assert at4k["layers"] == {"gdn": 1, "attn": 1}
    gdn = (3 * (2 * 2 + 4) * 8 + 4 * 8 * 8) * 4  # conv tail 3 x 64 channels + memory 4 x 8 x 8, fp32
    assert at4k["per_layer"]["gdn"] == at32k["per_layer"]["gdn"] == gdn  # constant
    kv = 2 * 4 * 8 * 4  # K and V, 4 heads of 8, fp32: per position
    assert (at4k["per_layer"]["attn"], at32k["per_layer"]["attn"]) == (4096 * kv, 32768 * kv)
    assert at32k["total"] == gdn + 32768 * kv and at32k["all_attention"] == 2 * 32768 * kv
    table = invoke("bench-decode", gdn_run, "--new", 2, "--prefix-len", 4, "--kv-heads", "4")
    assert table.exit_code == 0 and "decode state at long contexts" in table.stdout


def test_export_refuses_gdn_by_name(gdn_run, tmp_path):
    result = invoke("export", gdn_run, tmp_path / "hf")
    assert result.exit_code == 2, result.output
    assert "Gated DeltaNet hybrid (gdn) has no Llama equivalent" in " ".join(result.output.split())
    assert not (tmp_path / "hf").exists()

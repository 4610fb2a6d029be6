"""Three parts of softmax attention (issue 29), each against its Hugging Face implementation:
attention sinks (sinks: gpt-oss's GptOssAttention), the gated attention output (gattn) and partial
rotary (partrope, model.rope_fraction), both Qwen3-Next's Qwen3NextAttention. Beyond the rows
(test_rows.py checks each at both ends: counts, causality, decode, determinism, export refusal):
the layers equal transformers' through a prefill and single-token decode against its own cache,
fp32 and fp64, and each parity check is shown to fail on a planted mistake.

The references are layers, not models: gpt-oss's model has MoE FFNs with clamped SwiGLU and
Qwen3-Next's has Gated DeltaNet layers (its whole hybrid is tests/model/test_gdn.py's, with the real gate
and partial rotary). gpt-oss's checkpoints have biased q/k/v/o projections; anatomy's have none,
so the reference is built with attention_bias=False (the same code path without the bias adds).
fp32 runs transformers as it is (its own RoPE tables, computed in fp32); fp64 computes its tables
from its own rotary width and base in float64 rounded to fp32, as anatomy's are (test_rows.py does
the same for Llama), and lifts Qwen3-Next's two fp32 casts (RMSNorm, eager softmax), so everything
else compares to rounding.
"""

from __future__ import annotations

import math
import re

import pytest
import torch
from helpers import scramble_with_sinks
from lm_checks import assert_causal, assert_decodes_like_full, tokens
from toy_data import write_corpus
from typer.testing import CliRunner

from anatomy_cli.cli.main import app
from anatomy_cli.exams.export import ExportError, check_llama_shaped
from anatomy_cli.model import LM, attention
from anatomy_cli.model.attention import CausalSelfAttention, sink_attention, visible
from anatomy_cli.model.kv_cache import KVCache
from anatomy_cli.model.positions import RoPE
from anatomy_cli.spec import components
from anatomy_cli.spec.config import ConfigError, ModelConfig, RunConfig, validate
from anatomy_cli.store import runs

pytestmark = [pytest.mark.usefixtures("single_thread")]

LLAMA = {"norm_type": "rmsnorm", "norm_pos": "pre", "pos_type": "rope", "ffn_type": "swiglu"}
# d 64, 4 query heads of 16, 2 K/V heads (GQA); RoPE base and eps away from both libraries' defaults
LAYER = {"vocab_size": 50, "d_model": 64, "n_head": 4, "n_kv_head": 2, "n_layer": 2, "ctx_len": 32,
         "rope_base": 500.0, "norm_eps": 1e-4, **LLAMA}
T = 20
PLANS = {"full": None, "decode": [7] + [1] * (T - 7)}  # one pass; prefill 7, then single tokens
ATOL = {torch.float32: 1e-5, torch.float64: 1e-12}
DTYPES = pytest.mark.parametrize("dtype", list(ATOL), ids=["fp32", "fp64"])


def layer_config(**overrides) -> ModelConfig:
    return ModelConfig(**{**LAYER, **overrides})


def scrambled(cfg: ModelConfig, window: int = 0, seed: int = 0) -> CausalSelfAttention:
    """Unit-gain weights (matrices 1/sqrt(fan_in)), QK-norm weights around 1, sinks around 0.5 with
    spread 1 (exp(sink) as large as a key's share), so every part moves the output."""
    torch.manual_seed(seed)
    layer = CausalSelfAttention(cfg, window).eval()
    scramble_with_sinks(layer)
    return layer


def inputs(dtype, seed: int = 1) -> torch.Tensor:
    return torch.randn(2, T, LAYER["d_model"], generator=torch.Generator().manual_seed(seed), dtype=dtype)


def tables_in_float64(rotary, half: bool):
    """transformers' RoPE tables from its own rotary module's width (2 x len(inv_freq): the rotated dims R
    its partial_rotary_factor leaves) and base, with float64 angles rounded to fp32 as anatomy's are
    (transformers computes them in fp32). cos and sin of [1, T, R] (Qwen3-Next: cat(c, c)), or of
    [1, T, R/2] (gpt-oss: `half`, its _apply_rotary_emb splits x itself)."""
    dim, base = 2 * rotary.inv_freq.shape[0], rotary.config.rope_parameters["rope_theta"]
    inv_freq = 1.0 / base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)

    def tables(x, pos):
        angles = pos[..., None].double() * inv_freq  # [1, T, R/2]
        emb = angles if half else torch.cat((angles, angles), -1)
        return emb.cos().float().to(x.dtype), emb.sin().float().to(x.dtype)
    return tables


def outputs(layer, cfg, ref, hc, x, plan, tables, mask_fn):
    """anatomy's layer and transformers' on x: one full pass (plan None), or chunks of the plan's sizes
    through each side's own cache (KVCache / DynamicCache). Returns both outputs, [B, T, d] each."""
    from transformers import DynamicCache

    B, n_pos, _ = x.shape
    rotate = RoPE(cfg).rotate
    cache = KVCache([layer.new_state(B, n_pos, dtype=x.dtype)]) if plan else None
    hf_cache = DynamicCache(config=hc) if plan else None
    ours, theirs, t = [], [], 0
    for n in plan or [n_pos]:
        chunk, pos = x[:, t : t + n], torch.arange(t, t + n)
        ours.append(layer(chunk, pos, t + n, rotate, cache, 0))
        mask = mask_fn(config=hc, inputs_embeds=chunk, attention_mask=None, cache=hf_cache, position_ids=pos[None])
        theirs.append(ref(chunk, position_embeddings=tables(chunk, pos[None]), attention_mask=mask, cache=hf_cache)[0])
        if cache is not None:
            cache.advance(n)
        t += n
    return torch.cat(ours, 1), torch.cat(theirs, 1)


# ------------------------------------------------------------------------- sinks: gpt-oss


@pytest.fixture
def gpt_oss():
    pytest.importorskip("transformers", reason="transformers is not installed")
    return pytest.importorskip("transformers.models.gpt_oss.modeling_gpt_oss",
                               reason="this transformers has no gpt-oss")


@torch.no_grad()
def gpt_oss_layer(mod, layer: CausalSelfAttention, cfg: ModelConfig, window: int):
    """A GptOssAttention (eager: its sink-aware softmax) holding `layer`'s weights, and its config.
    q/k/v are row blocks of anatomy's qkv; o_proj is out; sinks map one to one."""
    from transformers import GptOssConfig

    hc = GptOssConfig(vocab_size=cfg.vocab_size, hidden_size=cfg.d_model, intermediate_size=cfg.d_model,
                      num_hidden_layers=1, num_attention_heads=cfg.n_head, num_key_value_heads=cfg.n_kv_head,
                      head_dim=cfg.head_dim, attention_bias=False, sliding_window=window or 4,
                      layer_types=["sliding_attention" if window else "full_attention"], num_local_experts=2,
                      num_experts_per_tok=1, max_position_embeddings=4 * cfg.ctx_len,
                      rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_base})
    hc._attn_implementation = "eager"
    ref = mod.GptOssAttention(hc, 0).eval().to(layer.qkv.weight.dtype)
    q, k, v = layer.qkv.weight.split(layer.split)
    for proj, w in ((ref.q_proj, q), (ref.k_proj, k), (ref.v_proj, v), (ref.o_proj, layer.out.weight)):
        proj.weight.copy_(w)
    ref.sinks.copy_(layer.sinks)
    return ref, hc


def sinks_diff(mod, dtype, window: int, plan) -> float:
    """max |anatomy - gpt-oss| of one sinks layer (GQA 4:2), full pass or decode; asserts O(1) outputs."""
    from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask

    cfg = layer_config(attn_sinks=True)
    layer = scrambled(cfg, window).to(dtype)
    ref, hc = gpt_oss_layer(mod, layer, cfg, window)
    tables = mod.GptOssRotaryEmbedding(hc)
    if dtype == torch.float64:
        tables = tables_in_float64(tables, half=True)
    mask_fn = create_sliding_window_causal_mask if window else create_causal_mask
    with torch.no_grad():
        ours, theirs = outputs(layer, cfg, ref, hc, inputs(dtype), plan, tables, mask_fn)
    assert theirs.abs().max() > 0.3, "outputs too small for the tolerance to mean anything"
    return float((ours - theirs).abs().max())


@DTYPES
@pytest.mark.parametrize("window", [0, 5], ids=["global", "window5"])
@pytest.mark.parametrize("plan", list(PLANS))
def test_sinks_layer_equals_gpt_oss(gpt_oss, dtype, window, plan):
    """gpt-oss's sink attention (full and sliding layers, GQA), prefill and decode through its cache."""
    assert sinks_diff(gpt_oss, dtype, window, PLANS[plan]) < ATOL[dtype]


def test_sinks_parity_fails_with_the_sink_out_of_the_denominator(gpt_oss, monkeypatch):
    """Planted: the sink's logit no longer joins the softmax (plain attention); the parity fails."""
    monkeypatch.setattr(attention, "sink_attention",
                        lambda q, k, v, sinks, mask: sink_attention(q, k, v, torch.full_like(sinks, -math.inf), mask))
    assert sinks_diff(gpt_oss, torch.float64, 0, None) > 1e-2


def test_sinks_parity_fails_with_a_sink_that_adds_a_value(gpt_oss, monkeypatch):
    """Planted: the sink's weight goes to the last key's value instead of nowhere (a softmax without the
    sink column dropped, renormalised over the keys); the parity fails."""
    def keeps_weight(q, k, v, sinks, mask):
        return attention.F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    monkeypatch.setattr(attention, "sink_attention", keeps_weight)
    assert sinks_diff(gpt_oss, torch.float64, 0, None) > 1e-2


def test_sink_attention_is_sdpa_scaled_by_the_sinks_share():
    """softmax with a sink = plain attention times Z / (Z + e^s) = sigmoid(logsumexp(scores) - s), per
    query; with s = -inf it is plain SDPA, and a huge sink silences the head."""
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, n, 6, 8, generator=gen, dtype=torch.float64) for n in (4, 2, 2))
    sinks = torch.randn(4, generator=gen, dtype=torch.float64)
    mask = visible(0, 6, 6, 3, "cpu")  # a window of 3
    plain = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    scores = (q @ k.repeat_interleave(2, 1).transpose(-1, -2) / math.sqrt(8)).masked_fill(~mask, -math.inf)
    share = torch.sigmoid(scores.logsumexp(-1, keepdim=True) - sinks.view(1, 4, 1, 1))  # [B, H, T, 1]
    torch.testing.assert_close(sink_attention(q, k, v, sinks, mask), plain * share, atol=1e-14, rtol=0)
    torch.testing.assert_close(sink_attention(q, k, v, torch.full_like(sinks, -math.inf), mask), plain,
                               atol=1e-14, rtol=0)
    assert sink_attention(q, k, v, torch.full_like(sinks, 1e3), mask).abs().max() == 0


# ------------------------------------------------------------------------- gate and partial rotary: Qwen3-Next


@pytest.fixture
def qwen3_next():
    pytest.importorskip("transformers", reason="transformers is not installed")
    return pytest.importorskip("transformers.models.qwen3_next.modeling_qwen3_next",
                               reason="this transformers has no Qwen3-Next")


def rms_norm_in_input_dtype(self, x):
    """Qwen3NextRMSNorm without its cast to fp32 (which caps an fp64 comparison at ~1e-7)."""
    return self._norm(x) * (1.0 + self.weight)


def eager_in_input_dtype(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
    """qwen3_next's eager_attention_forward line for line, its softmax in the input's dtype (not fp32)."""
    from transformers.models.qwen3_next.modeling_qwen3_next import repeat_kv

    key, value = repeat_kv(key, module.num_key_value_groups), repeat_kv(value, module.num_key_value_groups)
    weights = query @ key.transpose(2, 3) * scaling
    if attention_mask is not None:
        weights = weights + attention_mask
    weights = weights.softmax(dim=-1)
    return (weights @ value).transpose(1, 2).contiguous(), weights


@torch.no_grad()
def qwen3_next_layer(mod, layer: CausalSelfAttention, cfg: ModelConfig, layout: str = "interleaved"):
    """A Qwen3NextAttention holding `layer`'s weights. Its q_proj is anatomy's gated Q rows as they are
    (per head [query_h | gate_h]); its zero-centred q/k norms hold (ours - 1). `layout="blocked"` (a
    planted mistake) copies them as [all queries | all gates] instead."""
    from transformers import Qwen3NextConfig

    hc = Qwen3NextConfig(vocab_size=cfg.vocab_size, hidden_size=cfg.d_model, intermediate_size=cfg.d_model,
                         num_hidden_layers=1, num_attention_heads=cfg.n_head, num_key_value_heads=cfg.n_kv_head,
                         head_dim=cfg.head_dim, rms_norm_eps=cfg.norm_eps, num_experts=0,
                         max_position_embeddings=4 * cfg.ctx_len, layer_types=["full_attention"],
                         rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_base,
                                          "partial_rotary_factor": cfg.rope_fraction})
    hc._attn_implementation = "eager"
    ref = mod.Qwen3NextAttention(hc, 0).eval().to(layer.qkv.weight.dtype)
    q, k, v = layer.qkv.weight.split(layer.split)
    if layout == "blocked":
        H, hd, d = cfg.n_head, cfg.head_dim, cfg.d_model
        q = q.view(H, 2, hd, d).transpose(0, 1).reshape(-1, d)
    for proj, w in ((ref.q_proj, q), (ref.k_proj, k), (ref.v_proj, v), (ref.o_proj, layer.out.weight)):
        proj.weight.copy_(w)
    ref.q_norm.weight.copy_(layer.q_norm.weight - 1)
    ref.k_norm.weight.copy_(layer.k_norm.weight - 1)
    return ref, hc


def qwen3_next_diff(mod, dtype, fraction: float, plan, layout: str = "interleaved", mutate=None) -> float:
    """max |anatomy - Qwen3-Next| of one gated, QK-normed attention layer (GQA 4:2) rotating `fraction`
    of each head; `mutate(layer)` plants a mistake in anatomy's layer first."""
    from transformers.masking_utils import create_causal_mask

    cfg = layer_config(attn_gate=True, qk_norm=True, rope_fraction=fraction)
    layer = scrambled(cfg).to(dtype)
    ref, hc = qwen3_next_layer(mod, layer, cfg, layout)
    if mutate is not None:
        mutate(layer)
    tables = mod.Qwen3NextRotaryEmbedding(hc)
    with pytest.MonkeyPatch.context() as mp, torch.no_grad():
        if dtype == torch.float64:
            mp.setattr(mod.Qwen3NextRMSNorm, "forward", rms_norm_in_input_dtype)
            mp.setattr(mod, "eager_attention_forward", eager_in_input_dtype)
            tables = tables_in_float64(tables, half=False)
        ours, theirs = outputs(layer, cfg, ref, hc, inputs(dtype), plan, tables, create_causal_mask)
    assert theirs.abs().max() > 0.3, "outputs too small for the tolerance to mean anything"
    return float((ours - theirs).abs().max())


@DTYPES
@pytest.mark.parametrize("fraction", [1.0, 0.25])
@pytest.mark.parametrize("plan", list(PLANS))
def test_gated_layer_equals_qwen3_next(qwen3_next, dtype, fraction, plan):
    """Qwen3-Next's attention: gate from q_proj, QK-norm, full and partial (0.25: 4 of 16 dims) rotary."""
    assert qwen3_next_diff(qwen3_next, dtype, fraction, PLANS[plan]) < ATOL[dtype]


def ungate(layer: CausalSelfAttention) -> None:
    layer.gated = False  # the gate rows are still computed, and dropped


@pytest.mark.parametrize("mistake, kwargs", [
    ("gate not applied", {"mutate": ungate}),
    ("gate rows blocked, not per head", {"layout": "blocked"}),
])
def test_gate_parity_fails_on_a_planted_mistake(qwen3_next, mistake, kwargs):
    assert qwen3_next_diff(qwen3_next, torch.float64, 1.0, None, **kwargs) > 1e-2, mistake


def frequencies_over_head_dim(self, n: int, interleaved: bool) -> torch.Tensor:
    """Planted: partial rotary's inverse frequencies spread over head_dim (16), not the rotated 4 dims."""
    R, hd = self.head_dim, 16
    inv_freq = 1.0 / self.base ** (torch.arange(0, R, 2).double() / hd)
    angles = torch.outer(torch.arange(n).double(), inv_freq)
    return torch.cat((angles, angles), -1)


def last_dims_rotate(rotate_one):
    """Planted: partial rotary turns the last R dims of each head instead of the first R."""
    def wrong(self, x, pos, end, start=None, interleaved=False):
        R = self.head_dim
        if x.shape[-1] > R:
            return torch.cat((x[..., :-R], rotate_one(self, x[..., -R:], pos, end, start, interleaved)), dim=-1)
        return rotate_one(self, x, pos, end, start, interleaved)
    return wrong


@pytest.mark.parametrize("mistake", ["frequencies over head_dim", "last dims rotate"])
def test_partial_rotary_parity_fails_on_a_planted_mistake(qwen3_next, monkeypatch, mistake):
    if mistake == "frequencies over head_dim":
        monkeypatch.setattr(RoPE, "_angles", frequencies_over_head_dim)
    else:
        monkeypatch.setattr(RoPE, "rotate_one", last_dims_rotate(RoPE.rotate_one))
    assert qwen3_next_diff(qwen3_next, torch.float64, 0.25, None) > 1e-2, mistake


def test_partial_rotary_turns_the_first_dims_and_passes_the_rest():
    """rope_fraction 0.25 at head_dim 16: dims 0-3 are RoPE of width 4 (pairs (0, 2), (1, 3)), bit for
    bit; dims 4-15 pass unchanged."""
    cfg = layer_config(rope_fraction=0.25)
    gen = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 4, 9, 16, generator=gen), torch.randn(2, 2, 9, 16, generator=gen)
    pos = torch.arange(3, 12)
    rq, rk = RoPE(cfg).rotate(q, k, pos, 12)
    four = RoPE(cfg, head_dim=4)
    for ours, x in ((rq, q), (rk, k)):
        assert torch.equal(ours[..., 4:], x[..., 4:])
        assert torch.equal(ours[..., :4], four.rotate_one(x[..., :4].contiguous(), pos, 12))
        assert not torch.equal(ours[..., :4], x[..., :4])


# ------------------------------------------------------------------------- the model: counts, causality, decode

ALL = {"attn_sinks": True, "attn_gate": True, "rope_fraction": 0.5}
MODELS = {  # beyond the rows' toy ends: GQA, sliding windows (local layers), QK-norm, all three at once
    "sinks+gqa+swa": {**LLAMA, "attn_sinks": True, "n_kv_head": 2, "window": 5, "window_pattern": "LG"},
    "gattn+gqa+qknorm": {**LLAMA, "attn_gate": True, "n_kv_head": 1, "qk_norm": True},
    "partial+swa": {**LLAMA, "rope_fraction": 0.25, "window": 5, "window_pattern": "LG"},
    "all+gqa+swa": {**LLAMA, **ALL, "n_kv_head": 2, "window": 5, "window_pattern": "LG", "qk_norm": True},
    "all+gdn": {**LLAMA, **ALL, "gdn_pattern": "DA"},
}


def test_param_terms_at_the_published_size():
    """d 128, 4 heads of 32: the gate is a second d x d of q_proj per attention layer, the sinks 4 numbers;
    partial rotary has no parameters."""
    base = ModelConfig(vocab_size=1719, d_model=128, n_head=4, ctx_len=64, **LLAMA)
    assert base.mixer_params("attn") == 4 * 128 * 128
    assert ModelConfig(**{**base.model_dump(), "attn_gate": True}).mixer_params("attn") == 5 * 128 * 128
    assert ModelConfig(**{**base.model_dump(), "attn_sinks": True}).mixer_params("local") == 4 * 128 * 128 + 4
    both = ModelConfig(**{**base.model_dump(), "attn_gate": True, "attn_sinks": True, "n_kv_head": 2})
    assert both.mixer_params("attn") == 128 * (128 + 128 + 2 * 2 * 32) + 128 * 128 + 4
    assert both.num_params() - ModelConfig(**{**base.model_dump(), "n_kv_head": 2}).num_params() == 4 * (128 * 128 + 4)
    assert ModelConfig(**{**base.model_dump(), "rope_fraction": 0.25}).num_params() == base.num_params()
    assert both.active_params() == both.num_params()


@pytest.mark.parametrize("model", list(MODELS))
def test_param_formula_equals_the_modules(make_lm, model):
    lm = make_lm(**MODELS[model], n_layer=2)
    for kind, block in zip(lm.cfg.layer_kinds, lm.blocks):
        assert sum(p.numel() for p in block.attn.parameters()) == lm.cfg.mixer_params(kind), kind
    assert lm.num_params() == lm.cfg.num_params()


@pytest.mark.parametrize("model", list(MODELS))
def test_causality(make_lm, model):
    assert_causal(make_lm(**MODELS[model]), T=16)


@pytest.mark.parametrize("model", list(MODELS))
def test_cached_decode_equals_full_forward(make_lm, model):
    """Prefill then single tokens, ragged chunks, single tokens: == the full forward, fp32 and fp64,
    24 positions against windows of 5 (the window's state rolls)."""
    lm = make_lm(**MODELS[model])
    assert_decodes_like_full(lm, tokens(2, 24, seed=1), [[8] + [1] * 16, [5, 3, 1, 4, 1, 2, 5, 3], [1] * 24])


def test_sinks_start_at_zero_and_draw_no_random_numbers():
    """The same seed gives the same weights with and without sinks; the sinks themselves are zeros."""
    cfg = ModelConfig(**{**LAYER, "window": 5, "window_pattern": "LG"})
    torch.manual_seed(3)
    off = LM(cfg).state_dict()
    torch.manual_seed(3)
    on = LM(ModelConfig(**{**cfg.model_dump(), "attn_sinks": True})).state_dict()
    assert set(on) - set(off) == {f"blocks.{i}.attn.sinks" for i in range(2)}
    assert all(torch.equal(off[name], on[name]) for name in off)
    assert all(not on[f"blocks.{i}.attn.sinks"].any() for i in range(2))


def test_a_rope_fraction_of_one_is_the_old_rope_bit_for_bit(make_lm):
    lm = make_lm(**LLAMA)
    idx = tokens(2, 16)
    with torch.no_grad():
        before = lm(idx)[0]
        lm.positions = RoPE(ModelConfig(**{**lm.cfg.model_dump(), "rope_fraction": 1.0}))
        assert torch.equal(lm(idx)[0], before)


def test_bf16_autocast_takes_the_softmax_in_fp32():
    """Under bf16 autocast the sink's logit joins scores in fp32 (cat promotes), as the fp32 result."""
    layer = scrambled(layer_config(attn_sinks=True))
    x = inputs(torch.float32)
    with torch.autocast("cpu", dtype=torch.bfloat16), torch.no_grad():
        y = layer(x, torch.arange(T), T, RoPE(layer_config()).rotate)
    with torch.no_grad():
        ref = layer(x, torch.arange(T), T, RoPE(layer_config()).rotate)
    assert torch.isfinite(y).all()
    torch.testing.assert_close(y.float(), ref, atol=0.1, rtol=0.05)


# ------------------------------------------------------------------------- configs, run ids, refusals


def test_off_fields_stay_out_of_the_run_id():
    data = RunConfig(model={"vocab_size": 50}).model_dump(mode="json")
    fields = ("attn_sinks", "attn_gate", "rope_fraction")
    older = {**data, "model": {k: v for k, v in data["model"].items() if k not in fields}}
    assert runs.config_hash(data) == runs.config_hash(older)
    for field, value in (("attn_sinks", True), ("attn_gate", True), ("rope_fraction", 0.5)):
        on = {**data, "model": {**data["model"], field: value, "pos_type": "rope"}}
        assert runs.config_hash(on) != runs.config_hash({**data, "model": {**data["model"], "pos_type": "rope"}})


@pytest.mark.parametrize("overrides, message", [
    ({"d_model": 64, "rope_fraction": 0.3}, "rope_fraction=0.3 of head_dim=16 rotates 4.8 dims: it must be a whole "
                                             "even number"),
    ({"d_model": 64, "rope_fraction": 0.3125}, "rope_fraction=0.3125 of head_dim=16 rotates 5 dims"),
    ({"pos_type": "nope", "rope_fraction": 0.5}, "rope_fraction=0.5 needs pos_type='rope'"),
    ({"pos_type": "learned", "rope_fraction": 0.5}, "rope_fraction=0.5 needs pos_type='rope'"),
    ({"rope_fraction": 0.0}, "rope_fraction"),
    ({"rope_fraction": 1.5}, "rope_fraction"),
    ({"attn_type": "mla", "rope_fraction": 0.5}, "rope_fraction is a setting of softmax attention"),
])
def test_bad_settings_are_one_line(overrides, message):
    with pytest.raises(ConfigError, match=re.escape(message)) as err:
        validate(ModelConfig, {"n_head": 4, "pos_type": "rope", **overrides})
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("sets, message", [
    (["model.pos_type=rope", "model.d_model=64", "model.rope_fraction=0.3"], "rotates 4.8 dims"),
    (["model.pos_type=nope", "model.rope_fraction=0.25"], "needs pos_type='rope'"),
])
def test_bad_rope_fraction_exits_2_with_one_line(tmp_path, sets, message):
    corpus = write_corpus(tmp_path)
    args = ["train", "--set", f"data.source={corpus}", "--out", str(tmp_path / "o")]
    for s in sets:
        args += ["--set", s]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], result.stderr
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("setting, part", [
    ({"attn_sinks": True}, "attention sinks (sinks)"),
    ({"attn_gate": True}, "gated attention output (gattn)"),
    ({"rope_fraction": 0.25}, "partial RoPE (partrope)"),
    ({"rope_fraction": 0.5}, "partial RoPE (partrope)"),  # not the row's 0.25: still no Llama
])
def test_export_refuses_each_part_by_name(setting, part):
    cfg = ModelConfig(vocab_size=50, n_kv_head=2, **LLAMA, **setting)
    with pytest.raises(ExportError, match=re.escape(part)):
        check_llama_shaped(cfg)
    check_llama_shaped(ModelConfig(vocab_size=50, n_kv_head=2, **LLAMA))  # the same without the part: a Llama


def test_rows_read_back_their_states():
    llama = ModelConfig(**LLAMA)
    assert components.on_names(ModelConfig(**LLAMA, attn_sinks=True, attn_gate=True, rope_fraction=0.25)) == (
        *components.FIVE[:4], "sinks", "gattn", "partrope")
    assert components.states(ModelConfig(**LLAMA, rope_fraction=0.5))["partrope"] is None  # neither end
    assert components.label(ModelConfig(**LLAMA, n_kv_head=2, attn_gate=True)) == "llama+gattn"
    assert all(components.states(llama)[n] is False for n in ("sinks", "gattn", "partrope"))

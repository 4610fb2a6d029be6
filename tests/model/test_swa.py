"""swa: sliding-window attention (Mistral; Gemma 2/3's local:global interleaving).

The convention (transformers' sliding_window_overlay, Mistral's sliding_window): a local query at q
sees keys q - W < k <= q, W keys including itself. Pinned here by the mask against transformers'
own mask function, by which inputs a local layer's output depends on, by the receptive field of a
stack, and by logits against MistralForCausalLM (all layers local), MinistralForCausalLM (local and
global layers interleaved) and Qwen3ForCausalLM (interleaved, with QK-norm). Plus the tests every
part has: exact parameters, causality, cached decode == full forward (past the window, past ctx_len,
with GQA/MQA and QK-norm), O(window) decode state, determinism, and bad input as one line.
"""

from __future__ import annotations

import json
import math
import os
import re

import pytest
import torch
from helpers import LLAMA, one_error_line
from lm_checks import decode_in_chunks, tokens, train_losses, trainer
from typer.testing import CliRunner

from anatomy_cli.cli.main import app
from anatomy_cli.exams.export import ExportError, check_llama_shaped, decoder_config, rename_to_hf
from anatomy_cli.model import LM
from anatomy_cli.model.attention import CausalSelfAttention, attention_mask
from anatomy_cli.model.generate import generate
from anatomy_cli.model.kv_cache import KV, WindowKV
from anatomy_cli.model.positions import RoPE
from anatomy_cli.spec import components
from anatomy_cli.spec.config import ConfigError, ModelConfig, RunConfig, validate
from anatomy_cli.store import runs

pytestmark = [pytest.mark.filterwarnings("error"), pytest.mark.usefixtures("single_thread")]

W = 4
BASES = {"2017": {}, "llama": LLAMA}
PATTERNS = ("L", "LG", "GL")
BASE = pytest.mark.parametrize("base", list(BASES))
PATTERN = pytest.mark.parametrize("pattern", PATTERNS)


def swa(pattern: str = "L", window: int = W, **parts) -> dict:
    return {"window": window, "window_pattern": pattern, **parts}


# ------------------------------------------------------------------------- config and parameters


def test_layer_kinds_follow_the_pattern_and_window_zero_is_all_global():
    gemma_like = ModelConfig(n_layer=6, window=4, window_pattern="LLG")
    assert gemma_like.layer_kinds == ("local", "local", "attn") * 2
    assert ModelConfig(n_layer=4, window=4).layer_kinds == ("local",) * 4  # "L": Mistral
    assert ModelConfig(n_layer=4, window=0, window_pattern="LG").layer_kinds == ("attn",) * 4


@PATTERN
@BASE
def test_param_count_exact_and_unchanged_by_the_window(make_config, pattern, base):
    with_swa = make_config(**BASES[base], **swa(pattern))
    without = make_config(**BASES[base])
    assert with_swa.num_params() == LM(with_swa).num_params() == without.num_params()
    assert with_swa.active_params() == with_swa.num_params()


def test_flops_count_window_keys_for_local_layers(make_config):
    local, glob = make_config(**swa("LG")), make_config()
    assert glob.flops_per_token() - local.flops_per_token() == 6 * (glob.ctx_len - W) * glob.d_model


@pytest.mark.parametrize("settings,message", [
    ({"window": 100, "ctx_len": 64}, "window=100 is larger than ctx_len=64"),
    ({"window": -1}, "model.window: Input should be greater than or equal to 0"),
    ({"window": 4, "window_pattern": "LLG"}, "'LLG' has 3 letters, which must divide n_layer=4"),
    ({"window": 4, "window_pattern": "LXG"}, "window_pattern='LXG': use only the letters L, G"),
    ({"window": 4, "window_pattern": ""}, "window_pattern='': use only the letters L, G"),
])
def test_bad_settings_are_one_line(settings, message):
    with pytest.raises(ConfigError, match=message) as err:
        validate(RunConfig, {"model": settings})
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("settings,fragment", [
    (["model.window=200"], "window=200 is larger than ctx_len=128"),
    (["model.window=8", "model.window_pattern=LLG"], "has 3 letters, which must divide n_layer=4"),
])
def test_bad_window_through_the_cli_is_exit_2(settings, fragment):
    sets = [arg for setting in settings for arg in ("--set", setting)]
    result = CliRunner().invoke(app, ["train", *sets, "--steps", "1"])
    one_error_line(result, fragment)


# ------------------------------------------------------------------------- the mask convention


def test_band_mask_is_transformers_sliding_window_mask():
    from_hf = pytest.importorskip("transformers.masking_utils").sliding_window_causal_mask_function
    for window in (1, 2, 3, 5):
        hf = from_hf(window)
        for past, T, S in ((0, 7, 7), (5, 3, 8), (9, 4, 4 + window - 1), (9, 1, window), (0, 2, 2)):
            ours = attention_mask(past, T, S, window, "cpu")
            q = torch.arange(past, past + T)[:, None]
            k = torch.arange(past + T - S, past + T)[None, :]
            theirs = hf(0, 0, q, k)  # [T, S]; our None means causal with no key past the window
            assert torch.equal(ours if ours is not None else k <= q, theirs)


def test_band_mask_reads_like_the_picture():
    # window 3 over 5 positions: each query sees itself and the two before it
    expected = torch.tensor([[1, 0, 0, 0, 0],
                             [1, 1, 0, 0, 0],
                             [1, 1, 1, 0, 0],
                             [0, 1, 1, 1, 0],
                             [0, 0, 1, 1, 1]], dtype=torch.bool)
    assert torch.equal(attention_mask(0, 5, 5, 3, "cpu"), expected)
    assert attention_mask(0, 3, 3, 3, "cpu") is None  # shorter than the window: plain causal
    assert attention_mask(20, 1, 3, 3, "cpu") is None  # one query, window - 1 kept keys + itself


# ------------------------------------------------------------------------- what a position sees


def attention_dependence(window: int, T: int = 12) -> torch.Tensor:
    """dep[t, s] = True when one attention layer's output at t changes with its input at s."""
    torch.manual_seed(0)
    cfg = ModelConfig(d_model=32, n_head=4, n_kv_head=2, pos_type="rope", ctx_len=T)
    attn = CausalSelfAttention(cfg, window=window).eval()
    rotate, pos = RoPE(cfg).rotate, torch.arange(T)
    x = torch.randn(1, T, 32, generator=torch.Generator().manual_seed(1))
    dep = torch.zeros(T, T, dtype=torch.bool)
    with torch.no_grad():
        ref = attn(x, pos, T, rotate)
        for s in range(T):
            x2 = x.clone()
            x2[0, s] += 1.0
            dep[:, s] = (attn(x2, pos, T, rotate) - ref)[0].abs().amax(-1) > 1e-6
    return dep


def test_a_local_layer_sees_exactly_its_window():
    """Output at t depends on input at s exactly when t - W < s <= t (W inputs, itself included)."""
    t, s = torch.arange(12)[:, None], torch.arange(12)[None, :]
    assert torch.equal(attention_dependence(W), (s <= t) & (s > t - W))
    assert torch.equal(attention_dependence(0), s <= t)  # a global layer sees the whole past


def token_dependence(model, T: int = 20) -> torch.Tensor:
    """dep[t, s] = True when changing the token at s changes the logits at t."""
    idx = tokens(2, T, seed=5)
    dep = torch.zeros(T, T, dtype=torch.bool)
    with torch.no_grad():
        ref, _ = model(idx)
        for s in range(T):
            changed = idx.clone()
            changed[:, s] = (changed[:, s] + 1) % 50
            dep[:, s] = (model(changed)[0] - ref).abs().amax(dim=(0, 2)) > 1e-6
    return dep


@PATTERN
@BASE
def test_causal_and_reaching_back_n_layer_times_window_minus_one(make_lm, pattern, base):
    """Logits at t see tokens s <= t only; through two local layers of window 4 exactly those with
    s >= t - 2 * 3, and through any global layer all of them."""
    model = make_lm(**BASES[base], **swa(pattern))
    t, s = torch.arange(20)[:, None], torch.arange(20)[None, :]
    reach = s >= t - 2 * (W - 1) if pattern == "L" else torch.ones(20, 20, dtype=torch.bool)
    assert torch.equal(token_dependence(model), (s <= t) & reach)


# ------------------------------------------------------------------------- the decode state


COMBOS = {"mha": {"n_kv_head": 4}, "gqa": {"n_kv_head": 2}, "mqa": {"n_kv_head": 1},
          "gqa+qknorm": {"n_kv_head": 2, "qk_norm": True}}


@pytest.mark.parametrize("combo", list(COMBOS))
@PATTERN
@BASE
def test_cached_decode_equals_full_forward(make_lm, pattern, base, combo):
    model = make_lm(**{**BASES[base], **COMBOS[combo]}, **swa(pattern))
    idx = tokens(2, 24, seed=1)  # 24 = ctx_len: 6 windows
    with torch.no_grad():
        full, _ = model(idx)
        singles, _ = decode_in_chunks(model, idx, [6] + [1] * 18)  # a prefill longer than the window
        chunked, _ = decode_in_chunks(model, idx, [2, 3, 1, 7, 1, 5, 5])  # chunks shorter and longer
        one_by_one, _ = decode_in_chunks(model, idx, [1] * 24)
    for cached in (singles, chunked, one_by_one):
        torch.testing.assert_close(cached, full, atol=1e-5, rtol=1e-5)


@PATTERN
def test_decode_past_ctx_len_with_rope(make_lm, pattern):
    model = make_lm(**LLAMA, **swa(pattern), ctx_len=12)
    idx = tokens(1, 40, seed=4)  # more than three times the training length
    with torch.no_grad():
        full, _ = model(idx)
        cached, cache = decode_in_chunks(model, idx, [10] + [1] * 30)
    assert cache.past_len == 40
    torch.testing.assert_close(cached, full, atol=1e-5, rtol=1e-5)
    if pattern == "L":  # every layer local: nothing limits the positions, O(window) memory
        assert cache.capacity is None


def test_an_all_local_cache_never_fills(make_lm):
    model = make_lm(**LLAMA, **swa("L"))
    idx = tokens(1, 30, seed=6)
    with torch.no_grad():
        full, _ = model(idx)
        cached, cache = decode_in_chunks(model, idx, [5] + [1] * 25, max_len=8)  # allocated for 8
    torch.testing.assert_close(cached, full, atol=1e-5, rtol=1e-5)
    assert all(isinstance(s, WindowKV) for s in cache.states)


def test_a_gdn_hybrid_with_a_local_attention_layer_decodes_without_bound(make_lm):
    """gdn's recurrent states and a window's buffer in one cache: no layer limits the positions."""
    model = make_lm(**LLAMA, n_layer=4, gdn_pattern="DDDA", window=W)
    assert model.cfg.layer_kinds == ("gdn", "gdn", "gdn", "local")  # the window's L reaches attention only
    idx = tokens(1, 30, seed=9)
    with torch.no_grad():
        full, _ = model(idx)
        cached, cache = decode_in_chunks(model, idx, [7, 5] + [1] * 18, max_len=8)
    assert cache.capacity is None
    torch.testing.assert_close(cached, full, atol=1e-4, rtol=1e-4)


@PATTERN
def test_local_state_is_bounded_by_the_window(make_lm, pattern):
    model = make_lm(**LLAMA, **swa(pattern))
    cfg, B, hd = model.cfg, 2, model.cfg.head_dim
    small, large = model.new_cache(B, 8), model.new_cache(B, 400)
    for layer, kind in enumerate(cfg.layer_kinds):
        state = large[layer]
        assert isinstance(state, WindowKV if kind == "local" else KV)
        if kind == "local":  # K and V of W - 1 positions, whatever the length
            assert state.k.shape == state.v.shape == (B, cfg.n_kv_head, W - 1, hd)
            assert state.nbytes() == small[layer].nbytes() == 2 * B * cfg.n_kv_head * (W - 1) * hd * 4
        else:
            assert state.nbytes() == 50 * small[layer].nbytes()
        assert state.nbytes() == cfg.state_bytes(kind, B, 400, 4)
    assert large.cache_bytes() == cfg.cache_bytes(B, 400, 4)
    with torch.no_grad():
        model(tokens(B, 20), cache=large)
    assert large.cache_bytes() == cfg.cache_bytes(B, 400, 4)  # decoding allocates nothing new


def test_the_buffer_holds_the_latest_positions_oldest_first():
    state = WindowKV(1, 1, 4, 2)  # keeps 3
    seen = []
    for past, n in ((0, 2), (2, 1), (3, 4), (7, 1)):
        k = torch.arange(past, past + n, dtype=torch.float32).view(1, 1, n, 1).expand(1, 1, n, 2)
        keys, _ = state.update(k, k.clone(), past)
        seen.append(keys[0, 0, :, 0].tolist())
    assert seen == [[0, 1], [0, 1, 2], [0, 1, 2, 3, 4, 5, 6], [4, 5, 6, 7]]
    assert state.k[0, 0, :, 0].tolist() == [5, 6, 7]


@PATTERN
def test_greedy_generation_cached_equals_uncached(make_lm, pattern):
    model = make_lm(**LLAMA, **swa(pattern), ctx_len=16)
    prefix = tokens(1, 5, seed=2)[0].tolist()
    cached = list(generate(model, prefix, 40, temp=0, use_cache=True))  # several context shifts
    assert cached == list(generate(model, prefix, 40, temp=0, use_cache=False))


def test_bf16_window_state_on_an_fp32_model(make_lm):
    model = make_lm(**LLAMA, **swa("LG"))
    idx = tokens(1, 12, seed=7)
    with torch.no_grad():
        full, _ = model(idx)
        cache = model.new_cache(1, 12, dtype=torch.bfloat16)
        model(idx[:, :8], cache=cache)
        step, _ = model(idx[:, 8:9], cache=cache)
    assert cache[0].k.dtype == torch.bfloat16 and step.dtype == torch.float32
    torch.testing.assert_close(step[:, 0], full[:, 8], atol=0.1, rtol=0.05)


# ------------------------------------------------------------------------- training and the table


def test_same_seed_same_training_losses(tmp_path):
    a = train_losses(trainer(tmp_path, "a", swa("LG")))
    b = train_losses(trainer(tmp_path, "b", swa("LG")))
    plain = train_losses(trainer(tmp_path, "plain"))
    assert a == b and a != plain and all(math.isfinite(v) for v in a)


def test_the_component_row_and_its_settings():
    c = components.BY_NAME["swa"]
    assert c.on == {"model.window": 16, "model.window_pattern": "LLLG"} and c.llama == "off"
    on = ModelConfig(ctx_len=64, **{k.removeprefix("model."): v for k, v in c.on.items()})
    assert on.layer_kinds == ("local", "local", "local", "attn")  # the default study's 4 layers
    assert components.states(on)["swa"] is True and components.states(ModelConfig())["swa"] is False
    assert components.label(ModelConfig(ctx_len=64, **LLAMA, window=16, window_pattern="LLLG")) == "llama+swa"


def test_export_refuses_swa_by_name():
    cfg = ModelConfig(vocab_size=50, ctx_len=64, **LLAMA, window=16, window_pattern="LLLG")
    with pytest.raises(ExportError, match=r"sliding-window attention \(swa\) has no Llama equivalent"):
        check_llama_shaped(cfg)


def test_run_ids_do_not_move():
    """The new fields at their off value stay out of the hash: a default config keeps its id."""
    dumped = RunConfig().model_dump(mode="json")
    assert dumped["model"]["window"] == 0 and dumped["model"]["window_pattern"] == "L"
    without = {**dumped, "model": {k: v for k, v in dumped["model"].items() if not k.startswith("window")}}
    assert runs.config_hash(dumped) == runs.config_hash(without)
    on = {**dumped, "model": {**dumped["model"], "window": 16}}
    assert runs.config_hash(on) != runs.config_hash(dumped)


# ------------------------------------------------------------------------- parity with transformers


def hf_model(cls_name: str, model: LM, dtype, **config):
    """transformers' `cls_name` with anatomy's weights, in `dtype`."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    transformers = pytest.importorskip("transformers")
    if not hasattr(transformers, cls_name):
        pytest.skip(f"transformers {transformers.__version__} has no {cls_name}")
    fields = {k: v for k, v in decoder_config(model.cfg).items() if k not in ("architectures", "model_type")}
    cls = getattr(transformers, cls_name)
    hf = cls(getattr(transformers, cls_name.replace("ForCausalLM", "Config"))(**fields, **config))
    missing, unexpected = hf.load_state_dict(rename_to_hf(model.state_dict(), model.cfg), strict=False)
    assert not unexpected and not missing  # every weight mapped, both ways
    return hf.to(dtype).eval()


SLIDING, FULL = "sliding_attention", "full_attention"
PARITY = {  # HF class, anatomy parts, HF config beyond the shared decoder fields (written out, not derived)
    "mistral-all-local": ("MistralForCausalLM", swa("LL"), {"sliding_window": W}),
    "ministral-LG": ("MinistralForCausalLM", swa("LG"),
                     {"sliding_window": W, "layer_types": [SLIDING, FULL]}),
    "qwen3-GL-qknorm": ("Qwen3ForCausalLM", swa("GL", qk_norm=True),
                        {"use_sliding_window": True, "sliding_window": W, "layer_types": [FULL, SLIDING]}),
}


def use_hf_rope_tables(model: LM, hf) -> None:
    """Give anatomy the RoPE tables transformers computes. Its angles are fp32 products (~1e-6 off
    at position 23); anatomy's are float64 rounded to fp32. That difference belongs to RoPE, not to
    the window, and would hide everything below 1e-6 in an fp64 comparison."""
    T = model.positions.cos.shape[0]
    cos, sin = hf.model.rotary_emb(torch.zeros(1, dtype=torch.float32), torch.arange(T)[None])  # [1, T, hd]
    half = sin.shape[-1] // 2
    model.positions.cos = cos[0].clone()
    model.positions.signed_sin = torch.cat((-sin[0, :, :half], sin[0, :, half:]), dim=-1)  # see turn_half


def parity_pair(case: str, make_lm, dtype=torch.float32, **change):
    cls_name, parts, extra = PARITY[case]
    model = make_lm(**LLAMA, **parts, ctx_len=24, norm_eps=1e-6, rope_base=500.0)
    hf = hf_model(cls_name, model, dtype, **extra)
    if change:  # the same weights, a different wiring on anatomy's side
        model = make_lm(**LLAMA, **{**parts, **change}, ctx_len=24, norm_eps=1e-6, rope_base=500.0)
    return model.to(dtype), hf


@pytest.mark.parametrize("case", list(PARITY))
def test_logits_match_transformers(make_lm, case):
    model, hf = parity_pair(case, make_lm)
    idx = tokens(2, 24, seed=8)  # six windows: the band decides
    with torch.no_grad():
        ours, _ = model(idx)
        theirs = hf(idx).logits
    diff = (ours - theirs).abs().max().item()
    assert diff <= 1e-4, f"{case}: max |anatomy - HF| = {diff:.3g}"
    assert ours.std() > 0.1  # scrambled weights: logits of O(1), so a wrong mask shows


def attention_io(hf, idx) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
    """Each HF attention layer's input (after its own norm) and output, from one forward of idx."""
    seen, handles = {}, []
    for i, layer in enumerate(hf.model.layers):
        def hook(module, args, kwargs, output, i=i):
            seen[i] = (kwargs["hidden_states"], output[0])
        handles.append(layer.self_attn.register_forward_hook(hook, with_kwargs=True))
    with torch.no_grad():
        hf(idx)
    for h in handles:
        h.remove()
    return seen


@pytest.mark.parametrize("case", ["mistral-all-local", "ministral-LG"])  # Qwen3's QK-norms compute in fp32
def test_attention_layers_match_transformers_in_fp64(make_lm, case):
    """fp64, layer by layer: HF's RMSNorms compute in fp32 whatever the dtype, so the whole model
    cannot agree past ~1e-7; each attention layer, given HF's own input, masks and RoPE tables, can."""
    model, hf = parity_pair(case, make_lm, torch.float64)
    use_hf_rope_tables(model, hf)
    T = 24
    seen = attention_io(hf, tokens(2, T, seed=8))
    assert len(seen) == model.cfg.n_layer
    with torch.no_grad():
        for layer, (x, theirs) in seen.items():
            ours = model.blocks[layer].attn(x, torch.arange(T), T, model.positions.rotate)
            diff = (ours - theirs).abs().max().item()
            assert diff <= 1e-10, f"{case} layer {layer}: max |anatomy - HF| = {diff:.3g}"


@pytest.mark.parametrize("case", list(PARITY))
def test_a_window_off_by_one_is_caught_by_the_parity(make_lm, case):
    """The same comparison with anatomy's window one wider, or one narrower, fails."""
    idx = tokens(2, 24, seed=8)
    for window in (W + 1, W - 1):
        model, hf = parity_pair(case, make_lm, window=window)
        with torch.no_grad():
            assert (model(idx)[0] - hf(idx).logits).abs().max() > 1e-2


# ------------------------------------------------------------------------- bench-decode and kv-budget


TOY_BENCH = ["bench-decode", "--d-model", "32", "--n-layer", "2", "--n-head", "4", "--ctx", "64"]


def test_bench_decode_measures_a_local_layers_bytes_next_to_mha_gqa_mqa():
    result = CliRunner().invoke(app, [*TOY_BENCH, "--new", "6", "--prefix-len", "10", "--windows", "0,4",
                                      "--window-pattern", "LG", "--kv-heads", "4,2,1", "--json"])  # mla: test_mla.py
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    T, hd = out["window"], 8  # 16 positions
    rows = {(r["attention"], r["sliding_window"]): r for r in out["rows"]}
    assert list(rows) == [(a, w) for a in ("MHA", "GQA", "MQA") for w in (0, 4)]
    for (_, w), r in rows.items():
        G = r["n_kv_head"]
        assert r["same_output"] and r["kv_cache_bytes"] == r["kv_formula_bytes"]
        kv = 2 * G * hd * 4  # K and V of one position, fp32
        assert r["layer_states"]["attn"] == {"layers": 1 if w else 2, "bytes": kv * T, "bounded": False}
        if w:  # one local layer: K and V of window - 1 positions, whatever T
            assert r["window_pattern"] == "LG"
            assert r["layer_states"]["local"] == {"layers": 1, "bytes": kv * (w - 1), "bounded": True}
            assert r["kv_cache_bytes"] == kv * (T + w - 1)
    one = ["--new", "4", "--prefix-len", "4", "--kv-heads", "2", "--windows", "4"]
    table = CliRunner().invoke(app, [*TOY_BENCH, *one], env={"COLUMNS": "200"})
    assert table.exit_code == 0 and "GQA G=2 SWA 4 L" in table.stdout and "local 384 B" in table.stdout


def kv_budget_json(*args) -> dict:
    result = CliRunner().invoke(app, ["kv-budget", *map(str, args), "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


GEMMA3_ISH = {"model_type": "gemma3_text", "num_hidden_layers": 12, "num_attention_heads": 8,
              "num_key_value_heads": 4, "head_dim": 256, "sliding_window": 512}


@pytest.mark.parametrize("layout", [{"sliding_window_pattern": 6},
                                    {"layer_types": (["sliding_attention"] * 5 + ["full_attention"]) * 2}],
                         ids=["sliding_window_pattern", "layer_types"])
def test_kv_budget_bounds_the_configs_local_layers(tmp_path, layout):
    (tmp_path / "config.json").write_text(json.dumps({**GEMMA3_ISH, **layout}))
    out = kv_budget_json("--config", tmp_path, "--seq", 32768, "--dtype", "bf16")
    assert (out["window"], out["local_layers"]) == (512, 10)
    gqa = next(r for r in out["rows"] if r["is_config"])
    per_layer_token = 2 * 4 * 256 * 2
    assert gqa["global_layer_bytes_per_token"] == per_layer_token
    assert gqa["local_layer_bytes"] == per_layer_token * 511
    assert gqa["bytes"] == 2 * per_layer_token * 32768 + 10 * per_layer_token * 511
    assert gqa["bytes_all_global"] == 12 * per_layer_token * 32768
    short = kv_budget_json("--config", tmp_path, "--seq", 100)  # shorter than the window: no saving
    assert all(r["bytes"] == r["bytes_all_global"] for r in short["rows"])


def test_kv_budget_window_options_and_unused_windows(tmp_path):
    llama = ["--layers", 4, "--heads", 4, "--kv-heads", 2, "--head-dim", 8, "--seq", 64, "--dtype", "fp32"]
    assert kv_budget_json(*llama)["local_layers"] == 0
    out = kv_budget_json(*llama, "--window", 16, "--window-pattern", "LLLG")
    gqa = next(r for r in out["rows"] if r["is_config"])
    assert out["local_layers"] == 3 and gqa["bytes"] == 2 * 2 * 8 * 4 * (64 + 3 * 15)
    qwen = tmp_path / "qwen.json"  # Qwen ships a sliding_window it does not use
    qwen.write_text(json.dumps({**GEMMA3_ISH, "model_type": "qwen3", "use_sliding_window": False}))
    assert kv_budget_json("--config", qwen)["local_layers"] == 0
    mistral = tmp_path / "mistral.json"  # Mistral 7B v0.1: every layer local
    mistral.write_text(json.dumps({**GEMMA3_ISH, "model_type": "mistral"}))
    assert kv_budget_json("--config", mistral)["local_layers"] == 12
    assert kv_budget_json("--config", mistral, "--window", 0)["local_layers"] == 0


@pytest.mark.parametrize("args,fragment", [
    (["--window", "16", "--window-pattern", "LLG"], "must divide n_layer=4"),
    (["--window", "-2"], "window=-2"),
    (["--window", "16", "--window-pattern", "LX"], "use only the letters L, G"),
])
def test_kv_budget_bad_window_is_exit_2(args, fragment):
    result = CliRunner().invoke(app, ["kv-budget", "--layers", "4", "--heads", "4", "--head-dim", "8", *args])
    one_error_line(result, fragment)


def test_the_summary_names_the_kernel_of_the_local_layers():
    from anatomy_cli.training.devices import sdpa_kernel

    cpu = torch.device("cpu")
    both = sdpa_kernel(ModelConfig(ctx_len=64, window=16, window_pattern="LLLG"), 4, cpu, "float32")
    assert re.fullmatch(r"\w+, local: \w+", both), both
    assert re.fullmatch(r"local: \w+", sdpa_kernel(ModelConfig(ctx_len=64, window=16), 4, cpu, "float32"))
    assert "local" not in sdpa_kernel(ModelConfig(ctx_len=64), 4, cpu, "float32")

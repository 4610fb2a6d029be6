"""Multi-head latent attention (mla): its sizes and refusals, exact parameters, the layer and the whole
model against Hugging Face's DeepSeek-V3, causality and cached decode == full forward at given sizes,
the cache holding only the latent and the shared RoPE key, and mla next to gdn and sliding windows.
test_rows.py checks the component row at both ends (derived sizes: counts, causality, decode,
determinism, the export's refusal)."""

from __future__ import annotations

import json
import math
import re

import pytest
import torch
from helpers import LLAMA, deepseek_base_state
from lm_checks import assert_cached_decode, assert_causal, decode_in_chunks, tokens
from typer.testing import CliRunner

from anatomy_cli.cli.main import app
from anatomy_cli.exams.export import ExportError, check_llama_shaped
from anatomy_cli.model.mla import LATENT_EPS, LatentAttention
from anatomy_cli.spec import components as comp
from anatomy_cli.spec.config import MLA_SIZES, ConfigError, ModelConfig, RunConfig, validate

pytestmark = [pytest.mark.filterwarnings("error"), pytest.mark.usefixtures("single_thread")]

# toy sizes with every MLA width distinct, so a swapped split cannot line up by accident
SIZES = {"q_lora_rank": 24, "kv_lora_rank": 20, "qk_rope_head_dim": 6, "qk_nope_head_dim": 10, "v_head_dim": 12}


def mla_config(**overrides) -> ModelConfig:
    return ModelConfig(**{"vocab_size": 50, "d_model": 32, "n_layer": 2, "n_head": 4, "n_kv_head": 4, "ctx_len": 24,
                          "attn_type": "mla", **overrides})


def scrambled(module: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Matrices at 1/sqrt(fan_in), norm weights around 1: every weight shows in the output."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.normal_(0.0, 1 / math.sqrt(p.shape[-1])) if p.dim() == 2 else p.normal_(1.0, 0.3)
    return module.eval()


# ------------------------------------------------------------------------- sizes and refusals


def test_default_sizes_at_the_default_study():
    m = ModelConfig(attn_type="mla").mla_dims  # d 128, 4 heads of 32
    assert tuple(m) == (64, 64, 16, 32, 32)
    assert ModelConfig(attn_type="mla", **SIZES).mla_dims._asdict() == SIZES  # given sizes win


@pytest.mark.parametrize("overrides, message", [
    ({"kv_lora_rank": 33}, "kv_lora_rank=33 must not exceed d_model=32"),
    ({"q_lora_rank": 64}, "q_lora_rank=64 must not exceed d_model=32"),
    ({"qk_rope_head_dim": 5, "pos_type": "rope"}, "RoPE needs an even qk_rope_head_dim, got 5"),
    ({"kv_lora_rank": 0}, "kv_lora_rank: Input should be greater than 0"),
    ({"v_head_dim": -1}, "v_head_dim: Input should be greater than 0"),
    ({"qk_norm": True}, "qk_norm does not combine with attn_type='mla'"),
    ({"attn_type": "softmax", "kv_lora_rank": 16}, "kv_lora_rank is an mla setting: it needs attn_type='mla'"),
    ({"attn_type": "latent"}, "attn_type='latent' is no mixer part: choose 'softmax', 'mla'"),
])
def test_bad_sizes_are_refused_in_one_line(overrides, message):
    base = {"vocab_size": 50, "d_model": 32, "n_head": 4, "n_kv_head": 4, "attn_type": "mla"}
    with pytest.raises(ConfigError, match=message) as err:
        validate(ModelConfig, {**base, **overrides}, prefix="model.")
    assert "\n" not in str(err.value)


def test_off_value_stays_out_of_the_run_id():
    from anatomy_cli.store import runs

    plain = RunConfig().model_dump(mode="json")
    before = {**plain, "model": {k: v for k, v in plain["model"].items()
                                 if k not in ("attn_type", *MLA_SIZES)}}  # a config written before mla existed
    assert runs.config_hash(plain) == runs.config_hash(before)
    on = RunConfig(model={"attn_type": "mla"}).model_dump(mode="json")
    assert runs.config_hash(on) != runs.config_hash(plain)


def test_component_row():
    c = comp.BY_NAME["mla"]
    assert (c.on, c.off, c.llama) == ({"model.attn_type": "mla"}, {"model.attn_type": "softmax"}, "off")
    assert "DeepSeek-V2" in c.source and "n_kv_head" in c.about
    llama_mla = ModelConfig(**LLAMA, attn_type="mla")  # the frontier study's add-one run validates
    assert comp.label(llama_mla) == "llama+mla"


def test_export_refuses_mla_by_name():
    with pytest.raises(ExportError) as err:
        check_llama_shaped(ModelConfig(vocab_size=50, **LLAMA, attn_type="mla"))
    assert str(err.value) == "cannot export to Llama: latent attention (mla) has no Llama equivalent"


@pytest.mark.parametrize("setting, message", [
    ("model.kv_lora_rank=200", "kv_lora_rank=200 must not exceed d_model=128"),
    ("model.q_lora_rank=0", "q_lora_rank: Input should be greater than 0"),
])
def test_cli_refuses_a_bad_rank_in_one_line(tmp_path, setting, message):
    result = CliRunner().invoke(app, ["train", "--set", "model.attn_type=mla", "--set", setting, "--steps", "1",
                                      "--out", str(tmp_path / "run")])
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and not (tmp_path / "run").exists()


def test_odd_rope_part_is_fine_without_rope_and_n_kv_head_is_unused():
    assert mla_config(qk_rope_head_dim=5, pos_type="nope").mla_dims.qk_rope_head_dim == 5
    gqa, mha = mla_config(n_kv_head=2), mla_config(n_kv_head=4)
    assert gqa.num_params() == mha.num_params()  # the latent replaces the K/V heads


# ------------------------------------------------------------------------- parameters


def mla_params(d: int, H: int, rq: int, r: int, p: int, n: int, v: int) -> int:
    """Written out: q_down, q_norm, q_up; kv_down (latent + rope key), kv_norm, kv_up; out."""
    return (d * rq + rq + rq * H * (n + p)) + (d * (r + p) + r + r * H * (n + v)) + H * v * d


@pytest.mark.parametrize("overrides",
                         [{}, SIZES, {"d_model": 64, "n_head": 8}, {"d_model": 48, "n_head": 3, "n_kv_head": 1}])
def test_attention_param_count_is_exact(overrides):
    cfg = mla_config(**overrides)
    m, H, d = cfg.mla_dims, cfg.n_head, cfg.d_model
    module = sum(p.numel() for p in LatentAttention(cfg).parameters())
    assert cfg.mixer_params("mla") == module == mla_params(d, H, *m)


def test_default_study_attention_is_within_three_percent_of_mha():
    mla, mha = ModelConfig(attn_type="mla").mixer_params("mla"), ModelConfig().mixer_params("attn")
    assert (mla, mha) == (63616, 65536)


# ------------------------------------------------------------------------- the model: causality, cache, seeds

BASES = {"2017": {}, "llama": LLAMA}  # n_kv_head 2 at the LLaMA end: mla does not use it
BASE = pytest.mark.parametrize("base", list(BASES))


def mla_lm(seed: int = 0, **overrides):
    from anatomy_cli.model import LM

    torch.manual_seed(seed)
    return scrambled(LM(mla_config(**overrides)), seed)


@BASE
def test_model_param_count_is_exact_at_given_sizes(base):  # test_rows.py: the derived ones
    from anatomy_cli.model import LM

    cfg = mla_config(**BASES[base], **SIZES)
    assert cfg.num_params() == LM(cfg).num_params()
    softmax = ModelConfig(**{**cfg.model_dump(), "attn_type": "softmax", **dict.fromkeys(MLA_SIZES)})
    assert (cfg.num_params() - softmax.num_params()
            == cfg.n_layer * (cfg.mixer_params("mla") - softmax.mixer_params("attn")))


@BASE
def test_causality(base):
    assert_causal(mla_lm(**BASES[base], **SIZES))


@BASE
@pytest.mark.parametrize("extra", [{}, {"parallel_block": True}, {"pos_type": "nope"}],
                         ids=["plain", "parallel", "nope"])
def test_cached_decode_equals_full_forward(base, extra):
    assert_cached_decode(mla_lm(**{**BASES[base], **SIZES, **extra}))


def test_mla_in_the_attention_layers_of_a_gdn_hybrid():
    """gdn_pattern picks the Gated DeltaNet layers; the rest are mla (as Kimi Linear pairs KDA with MLA)."""
    model = mla_lm(**LLAMA, **SIZES, n_layer=4, gdn_pattern="DA")
    cfg = model.cfg
    assert cfg.layer_kinds == ("gdn", "mla", "gdn", "mla") and cfg.num_params() == model.num_params()
    assert_cached_decode(model)
    cache = model.new_cache(1, 8)
    assert cache.layer_bytes()[1::2] == [cfg.state_bytes("mla", 1, 8, 4)] * 2 == [8 * 26 * 4] * 2


def test_cache_holds_only_the_latent_and_the_rope_key():
    """Per layer: the normed latent and the rotated shared key, [B, T, r] and [B, T, p], nothing per
    head; its bytes are the formula's, (r + p) x T x B x 4 per layer, against 2 G hd for softmax."""
    model = mla_lm(**LLAMA, **SIZES)
    cfg, (B, T) = model.cfg, (2, 10)
    idx = tokens(B, T)
    cache = model.new_cache(B, T)
    with torch.no_grad():
        model(idx, cache=cache)
    r, p = SIZES["kv_lora_rank"], SIZES["qk_rope_head_dim"]
    assert cache.layer_bytes() == [cfg.state_bytes("mla", B, T, 4)] * cfg.n_layer == [(r + p) * T * B * 4] * 2
    assert cache.cache_bytes() == cfg.cache_bytes(B, T, 4)
    # what layer 0 stored is kv_norm(latent) and RoPE(rope key) of its input, recomputed here
    block = model.blocks[0]
    with torch.no_grad():
        h = block.norm1(model.tok(idx))
        latent, k_rope = block.attn.kv_down(h).split((r, p), dim=-1)
        k_rope = block.attn.rope.rotate_one(k_rope.unsqueeze(1), torch.arange(T), T).squeeze(1)
    state = cache[0]
    assert (state.latent.shape, state.k_rope.shape) == ((B, T, r), (B, T, p))
    torch.testing.assert_close(state.latent, block.attn.kv_norm(latent), atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(state.k_rope, k_rope, atol=1e-6, rtol=1e-6)


def test_scores_depend_on_relative_positions_only():
    """Q's and K's rope parts turn by the same angles, so shifting every position changes nothing;
    a rotation on one side only (or on different halves) would see the shift."""
    model = mla_lm(**LLAMA, **SIZES)
    idx = tokens(2, 12)
    with torch.no_grad():
        at0, _ = model(idx)
        at7, _ = model(idx, pos=torch.arange(7, 19))
        nope, _ = mla_lm(**{**LLAMA, **SIZES, "pos_type": "nope"})(idx)  # same weights, no rotation
    torch.testing.assert_close(at7, at0, atol=1e-4, rtol=1e-4)
    assert (at0[:, 1:] - nope[:, 1:]).abs().max() > 1e-2  # and the rotation does matter


def test_every_layer_is_an_mla_layer_with_its_own_formulas():
    cfg = mla_config(**LLAMA, **SIZES)
    assert cfg.layer_kinds == ("mla", "mla") and ModelConfig(**LLAMA).layer_kinds == ("attn",) * 4
    m = cfg.mla_dims
    softmax_width = cfg.n_head * (m.qk_nope_head_dim + m.qk_rope_head_dim + m.v_head_dim)  # Q.K plus A.V
    assert cfg.context_flops("mla") == 3 * cfg.ctx_len * softmax_width  # the attn term is 3 ctx (d + d)
    assert ModelConfig(**LLAMA).context_flops("attn") == 3 * 128 * (128 + 128)


def test_a_window_leaves_mla_layers_global():
    """window turns softmax layers local; mla layers (and a hybrid's gdn ones) stay as they are, and
    the model computes exactly what it computes without the window."""
    sizes = {**LLAMA, **SIZES, "n_layer": 4, "ctx_len": 24}
    windowed = mla_lm(**sizes, window=4, window_pattern="LLLG")
    assert windowed.cfg.layer_kinds == ("mla",) * 4
    assert mla_config(**sizes, gdn_pattern="DA", window=4, window_pattern="LG").layer_kinds == ("gdn", "mla") * 2
    plain = mla_lm(**sizes)
    plain.load_state_dict(windowed.state_dict())
    idx = tokens(2, 24, seed=3)  # longer than the window
    with torch.no_grad():
        torch.testing.assert_close(windowed(idx)[0], plain(idx)[0], atol=0, rtol=0)
    assert all(state.capacity == 24 for state in windowed.new_cache(1, 24).states)  # every layer grows


def test_sdpa_kernel_asks_with_mla_shapes():
    from anatomy_cli.training.devices import sdpa_kernel

    cpu = torch.device("cpu")
    for cfg in (mla_config(**LLAMA, **SIZES), mla_config(**LLAMA, **SIZES, n_layer=4, window=4, window_pattern="LG")):
        assert re.fullmatch(r"mla: \w+", sdpa_kernel(cfg, 2, cpu, "float32")), cfg
    assert "mla" not in sdpa_kernel(ModelConfig(**LLAMA), 2, cpu, "float32")


def test_bf16_cache_holds_half_the_bytes_and_decodes():
    model = mla_lm(**LLAMA, **SIZES)
    idx = tokens(1, 8)
    cache = model.new_cache(1, 8, dtype=torch.bfloat16)
    assert cache.cache_bytes() == model.cfg.cache_bytes(1, 8, 2) == 2 * 8 * 26 * 2
    with torch.no_grad():
        full, _ = model(idx)
        stepped, _ = decode_in_chunks(model, idx, [4, 1, 1, 1, 1])
        model(idx, cache=cache)
    assert cache[0].latent.dtype == torch.bfloat16
    torch.testing.assert_close(stepped, full, atol=1e-5, rtol=1e-5)


# ------------------------------------------------------------------------- bench-decode


def test_bench_decode_measures_mla_next_to_mha_gqa_mqa():
    result = CliRunner().invoke(app,
                                ["bench-decode", "--d-model", "32", "--n-layer", "2", "--n-head", "4", "--ctx", "64",
                                      "--new", "4", "--prefix-len", "8", "--json"])
    assert result.exit_code == 0, result.output
    rows = {r["attention"]: r for r in json.loads(result.stdout)["rows"]}
    assert list(rows) == ["MHA", "GQA", "MQA", "MLA", "DSA", "MHA+sinks", "MHA+gattn", "MHA+partrope"]  # default
    L, T, nbytes = 2, 12, 4
    r, p = 16, 4  # d/2 and hd/2 at d 32, hd 8
    mla = rows["MLA"]
    assert (mla["latent"], mla["n_kv_head"]) == (f"{r}+{p}", None)
    assert mla["kv_cache_bytes"] == mla["kv_formula_bytes"] == L * T * (r + p) * nbytes  # measured == formula
    assert mla["kv_bytes_per_token"] == L * (r + p) * nbytes == 160
    assert [rows[a]["kv_bytes_per_token"] for a in ("MHA", "GQA", "MQA")] == [512, 256, 128]  # 2 L G hd x 4
    assert mla["same_output"]  # cached greedy decode == uncached
    table = CliRunner().invoke(app,
                               ["bench-decode", "--d-model", "32", "--n-layer", "2", "--n-head", "4", "--ctx", "64",
                                     "--new", "2", "--prefix-len", "4", "--kv-heads", "2,mla"])
    assert table.exit_code == 0, table.output
    assert "MLA" in table.stdout and "r+p=16+4" in table.stdout  # rich may wrap the label in a cell


def test_bench_decode_of_an_mla_config_keeps_its_sizes():
    from anatomy_cli.exams import decode

    cfg = mla_config(**LLAMA, **SIZES)
    out = decode.bench_decode(cfg, kv_heads=decode.kv_head_list(4, "mla,2"), new=2, prefix_len=4)
    mla, gqa = out["rows"]
    assert mla["kv_bytes_per_token"] == 2 * (20 + 6) * 4 and gqa["kv_bytes_per_token"] == 2 * 2 * 2 * 8 * 4
    with pytest.raises(ConfigError, match="positive integers or mla"):
        decode.kv_head_list(4, "2,gqa")


def test_bench_decode_takes_mla_once_next_to_sliding_windows():
    """--windows multiplies the softmax rows; MLA is one global row (a window leaves it be)."""
    args = ["bench-decode", "--d-model", "32", "--n-layer", "2", "--n-head", "4", "--ctx", "64", "--new", "2",
            "--prefix-len", "8", "--kv-heads", "2,mla", "--windows", "0,4", "--window-pattern", "LG"]
    result = CliRunner().invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)["rows"]
    assert [(r["attention"], r["sliding_window"]) for r in rows] == [("GQA", 0), ("GQA", 4), ("MLA", 0)]
    gqa, swa, mla = rows
    assert list(mla["layer_states"]) == ["mla"] and list(swa["layer_states"]) == ["local", "attn"]
    assert mla["kv_bytes_per_token"] == 2 * (16 + 4) * 4 and swa["layer_states"]["local"]["bytes"] == 2 * 2 * 3 * 8 * 4
    table = CliRunner().invoke(app, args)  # the long-context table takes rows of different kinds
    assert table.exit_code == 0, table.output
    assert "SWA 4 LG" in table.stdout and "r+p=16+4" in table.stdout


# ------------------------------------------------------------------------- kv-budget (no torch)


def kv_rows(*args) -> dict[str, dict]:
    result = CliRunner().invoke(app, ["kv-budget", *map(str, args), "--json"])
    assert result.exit_code == 0, result.output
    return {r["attention"]: r for r in json.loads(result.stdout)["rows"]}


def test_kv_budget_adds_mla_at_the_default_study():
    rows = kv_rows("--layers", 4, "--heads", 4, "--kv-heads", 2, "--head-dim", 32, "--kv-lora-rank", 64,
                   "--rope-dim", 16, "--seq", 64, "--dtype", "fp32")
    per_token = {name: r["bytes_per_token"] for name, r in rows.items()}
    assert per_token == {"MHA": 4 * 2 * 4 * 32 * 4, "GQA": 4 * 2 * 2 * 32 * 4, "MQA": 4 * 2 * 32 * 4, "MLA": 4 * 80 * 4}
    assert rows["MLA"]["is_config"] and not rows["GQA"]["is_config"] and rows["MLA"]["kv_heads"] is None
    assert rows["MLA"]["bytes"] == 64 * 4 * 80 * 4 and rows["MLA"]["ratio_to_mha"] == 80 / 256


def test_kv_budget_sliding_layers_bound_softmax_rows_not_mla():
    rows = kv_rows("--layers", 4, "--heads", 4, "--kv-heads", 2, "--head-dim", 32, "--kv-lora-rank", 64,
                   "--rope-dim", 16, "--window", 16, "--window-pattern", "LLLG", "--seq", 64, "--dtype", "fp32")
    kept = 1 * 64 + 3 * 15  # one global layer of 64 positions, three local of window - 1
    assert {name: r["bytes"] for name, r in rows.items()} == {
        "MHA": kept * 2 * 4 * 32 * 4, "GQA": kept * 2 * 2 * 32 * 4, "MQA": kept * 2 * 32 * 4, "MLA": 4 * 64 * 80 * 4}
    assert rows["MLA"]["local_layer_bytes"] is None and rows["GQA"]["local_layer_bytes"] == 15 * 2 * 2 * 32 * 4
    assert rows["MLA"]["ratio_to_mha"] == rows["MLA"]["bytes"] / rows["MHA"]["bytes"]
    assert rows["GQA"]["ratio_to_mha"] == 0.5


def test_kv_budget_reads_a_deepseek_config(tmp_path):
    path = tmp_path / "config.json"  # DeepSeek-V3's published sizes
    path.write_text(json.dumps({"num_hidden_layers": 61, "num_attention_heads": 128, "num_key_value_heads": 128,
                                "hidden_size": 7168, "kv_lora_rank": 512, "qk_rope_head_dim": 64,
                                "qk_nope_head_dim": 128, "v_head_dim": 128}))
    rows = kv_rows("--config", path, "--dtype", "bf16")
    assert rows["MLA"]["bytes_per_token"] == 61 * (512 + 64) * 2  # 70,272 B
    # heads of qk_nope_head_dim, as DeepSeek-V2 compares
    assert rows["MHA"]["bytes_per_token"] == 2 * 61 * 128 * 128 * 2
    assert round(rows["MLA"]["mha_over"], 1) == 56.9


def test_kv_budget_mla_needs_both_sizes():
    result = CliRunner().invoke(app, ["kv-budget", "--layers", "2", "--heads", "2", "--head-dim", "8",
                                      "--kv-lora-rank", "4"])
    assert result.exit_code == 2
    assert result.stderr.strip().splitlines() == ["error: options: MLA needs both --kv-lora-rank and --rope-dim "
                                                  "(kv_lora_rank, qk_rope_head_dim)"]


# ------------------------------------------------------------------------- the layer against HF


try:
    import transformers
    from transformers.models.deepseek_v3 import modeling_deepseek_v3 as hf_ds
except ImportError:  # transformers is in the hf/dev extras; an older one lacks DeepSeek-V3
    transformers = hf_ds = None
NEEDS_HF = pytest.mark.skipif(hf_ds is None, reason="the installed transformers has no DeepSeek-V3 model")

HF_NAMES = {  # anatomy's LatentAttention -> DeepseekV3Attention (see model/mla.py)
    "q_down": "q_a_proj", "q_norm": "q_a_layernorm", "q_up": "q_b_proj",
    "kv_down": "kv_a_proj_with_mqa", "kv_norm": "kv_a_layernorm", "kv_up": "kv_b_proj", "out": "o_proj",
}


def hf_config(cfg: ModelConfig, interleave: bool, attn: str = "eager", **extra):
    m = cfg.mla_dims
    hc = transformers.DeepseekV3Config(
        vocab_size=cfg.vocab_size, hidden_size=cfg.d_model, num_attention_heads=cfg.n_head,
        num_key_value_heads=cfg.n_head, q_lora_rank=m.q_lora_rank, kv_lora_rank=m.kv_lora_rank,
        qk_rope_head_dim=m.qk_rope_head_dim, qk_nope_head_dim=m.qk_nope_head_dim, v_head_dim=m.v_head_dim,
        rope_interleave=interleave, rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_base},
        attention_bias=False, max_position_embeddings=cfg.ctx_len, **extra)
    # eager: the written-out softmax(QK^T) V, whose softmax runs in fp32; sdpa keeps fp64 end to end
    hc._attn_implementation = attn
    return hc


def interleave_rows(w: torch.Tensor, p: int) -> torch.Tensor:
    """Rope rows from anatomy's half-split pairing (i, i + p/2) to DeepSeek's (2i, 2i + 1)."""
    order = torch.stack((torch.arange(p // 2), torch.arange(p // 2) + p // 2), dim=-1).flatten()
    return w[order]


def hf_attention_state(ours: LatentAttention, cfg: ModelConfig, interleave: bool) -> dict[str, torch.Tensor]:
    m, H = cfg.mla_dims, cfg.n_head
    state = {f"{HF_NAMES[k.split('.')[0]]}.weight": v.detach().clone() for k, v in ours.state_dict().items()}
    if interleave:
        n, p, r = m.qk_nope_head_dim, m.qk_rope_head_dim, m.kv_lora_rank
        q = state["q_b_proj.weight"].view(H, n + p, -1)  # head-major, each head (nope | rope)
        q = torch.cat((q[:, :n], torch.stack([interleave_rows(h, p) for h in q[:, n:]])), dim=1)
        state["q_b_proj.weight"] = q.reshape(H * (n + p), -1)
        kv = state["kv_a_proj_with_mqa.weight"]  # (latent | rope key)
        state["kv_a_proj_with_mqa.weight"] = torch.cat((kv[:r], interleave_rows(kv[r:], p)))
    return state


def hf_rope(self, x, position_ids):
    """HF's (cos, sin) layout, cat(freqs, freqs), from float64 angles rounded to fp32 like anatomy's
    tables (HF's own rotary module computes its angles in fp32), so fp64 compares the rest exactly."""
    p, base = self.config.qk_rope_head_dim, self.config.rope_parameters["rope_theta"]
    inv_freq = 1.0 / base ** (torch.arange(0, p, 2, dtype=torch.float64) / p)
    angles = position_ids[..., None].double() * inv_freq  # [B, T, p/2]
    emb = torch.cat((angles, angles), dim=-1)
    return emb.cos().float().to(x.dtype), emb.sin().float().to(x.dtype)


def layer_outputs(cfg: ModelConfig, interleave: bool, dtype, map_interleave: bool | None = None):
    ours = scrambled(LatentAttention(cfg)).to(dtype)
    attn = "sdpa" if dtype == torch.float64 else "eager"
    theirs = hf_ds.DeepseekV3Attention(hf_config(cfg, interleave, attn), layer_idx=0).to(dtype).eval()
    theirs.load_state_dict(hf_attention_state(ours, cfg, interleave if map_interleave is None else map_interleave))
    T = 12
    x = torch.randn(2, T, cfg.d_model, generator=torch.Generator().manual_seed(1), dtype=torch.float64).to(dtype)
    mask = torch.full((T, T), float("-inf"), dtype=dtype).triu(1)[None, None]  # additive causal mask
    with torch.no_grad():
        a = ours(x, torch.arange(T), T)
        b, _ = theirs(x, hf_rope(theirs, x, torch.arange(T)[None]), mask)
    return a, b


def rms_norm_in_input_dtype(self, x):
    """HF's DeepseekV3RMSNorm formula without its cast to fp32 (which caps fp64 at ~1e-7)."""
    return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon))


@pytest.fixture
def hf_fp64(monkeypatch):
    monkeypatch.setattr(hf_ds.DeepseekV3RMSNorm, "forward", rms_norm_in_input_dtype)
    monkeypatch.setattr(hf_ds.DeepseekV3RotaryEmbedding, "forward", hf_rope)


@NEEDS_HF
@pytest.mark.parametrize("interleave", [False, True], ids=["half-split", "rope_interleave"])
@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.float64, 1e-12)], ids=["fp32", "fp64"])
def test_layer_equals_deepseek_v3_attention(interleave, dtype, tol, request):
    if dtype == torch.float64:
        request.getfixturevalue("hf_fp64")
    cfg = mla_config(pos_type="rope", **SIZES)
    a, b = layer_outputs(cfg, interleave, dtype)
    assert a.abs().max() > 0.1  # a real signal, not two near-zero outputs
    assert (a - b).abs().max() <= tol


@NEEDS_HF
def test_rope_layout_matters():
    """The same weights without the row permutation under rope_interleave: the rope part pairs
    other dimensions and the outputs differ (so the parity above is not blind to the layout)."""
    a, b = layer_outputs(mla_config(pos_type="rope", **SIZES), True, torch.float64, map_interleave=False)
    assert (a - b).abs().max() > 1e-2


def test_latent_norms_use_deepseeks_eps_whatever_norm_eps_says():
    module = LatentAttention(mla_config(norm_eps=1e-3))
    assert module.q_norm.eps == module.kv_norm.eps == LATENT_EPS == 1e-6


# ------------------------------------------------------------------------- the model against HF


def hf_model_state(lm, cfg: ModelConfig, interleave: bool) -> dict[str, torch.Tensor]:
    """anatomy's LLaMA-end + mla LM -> DeepseekV3ForCausalLM with every layer dense."""
    out = deepseek_base_state(lm, dense_mlp=True)
    for i, block in enumerate(lm.blocks):
        pre = f"model.layers.{i}."
        out |= {pre + "self_attn." + k: v for k, v in hf_attention_state(block.attn, cfg, interleave).items()}
    return {k: v.detach().clone() for k, v in out.items()}


def model_logits(dtype, seed: int = 0):
    from anatomy_cli.model import LM

    cfg = mla_config(**LLAMA, **SIZES, n_layer=3, norm_eps=1e-5)  # n_kv_head 2: unused by mla
    torch.manual_seed(seed)
    lm = scrambled(LM(cfg), seed).to(dtype)
    hc = hf_config(cfg, interleave=True, attn="sdpa" if dtype == torch.float64 else "eager",
                   num_hidden_layers=cfg.n_layer, first_k_dense_replace=cfg.n_layer, intermediate_size=cfg.ffn_hidden,
                   rms_norm_eps=cfg.norm_eps, tie_word_embeddings=False, hidden_act="silu")
    hf = transformers.DeepseekV3ForCausalLM(hc).to(dtype).eval()
    hf.load_state_dict(hf_model_state(lm, cfg, interleave=True))
    idx = torch.randint(0, cfg.vocab_size, (2, 20), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        return lm(idx)[0], hf(idx).logits


@NEEDS_HF
def test_model_equals_deepseek_v3_fp32():
    ours, theirs = model_logits(torch.float32)
    assert ours.std() > 0.5  # scrambled weights: logits far from uniform
    assert (ours - theirs).abs().max() <= 1e-4


@NEEDS_HF
@pytest.mark.usefixtures("hf_fp64")
def test_model_equals_deepseek_v3_fp64():
    ours, theirs = model_logits(torch.float64)
    assert (ours - theirs).abs().max() <= 1e-10

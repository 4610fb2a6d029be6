"""The deepseek router (model.moe_router="deepseek", model/moe.py): exact total and active counts
(the selection bias is a buffer), bad settings, causality and cached decode, parity with
transformers' DeepseekV3MoE layer and DeepseekV3ForCausalLM (fp32 and fp64, a non-zero bias and a
binding group limit), planted mutations that the parity catches, the aux-loss-free bias update,
and a resumed run equal to one trained straight through.
"""

from __future__ import annotations

import json
import os

import pytest
import torch
import torch.nn.functional as F
from conftest import scramble
from helpers import LLAMA, deepseek_base_state, one_error_line
from lm_checks import assert_causal, assert_decodes_like_full, tokens, trainer
from safetensors.torch import load_file
from toy_data import TINY_MODEL, TINY_TRAIN, write_corpus
from typer.testing import CliRunner

from anatomy_cli.cli.main import app
from anatomy_cli.model import LM, moe
from anatomy_cli.model.moe import MoE, update_biases
from anatomy_cli.spec.config import ConfigError, ModelConfig, RunConfig, validate
from anatomy_cli.store import runs
from anatomy_cli.training import checkpoint
from anatomy_cli.training.run import resume, train

pytestmark = [pytest.mark.filterwarnings("error"), pytest.mark.usefixtures("single_thread")]

DEEPSEEK = {"moe": True, "moe_router": "deepseek"}
GROUPED = {**DEEPSEEK, "moe_n_group": 4, "moe_topk_group": 2, "moe_routed_scaling_factor": 2.5}  # V3's shape
VARIANTS = {
    "plain": DEEPSEEK,
    "shared": {**DEEPSEEK, "moe_shared": True},
    "grouped-shared": {**GROUPED, "moe_shared": True},
    "top1-4x40": {**DEEPSEEK, "moe_top_k": 1, "moe_experts": 4, "moe_hidden": 40, "moe_n_group": 2},
}
VARIANT = pytest.mark.parametrize("variant", list(VARIANTS))
BASES = {"2017": {}, "llama": LLAMA}
BASE = pytest.mark.parametrize("base", list(BASES))


def with_bias(model: LM, seed: int = 7, scale: float = 0.3) -> LM:
    """Every layer's selection bias drawn non-zero (training moves it; at 0 the bias is invisible)."""
    g = torch.Generator().manual_seed(seed)
    for m in model.modules():
        if isinstance(m, MoE) and m.deepseek:
            m.select_bias.copy_(scale * torch.randn(m.select_bias.shape, generator=g))
    return model


# ------------------------------------------------------------------------- parameter counts


@VARIANT
@BASE
def test_total_and_active_counts_are_exact(base, variant):
    """The shared expert is ungated (no 1 x d gate); the bias is a buffer: in the state dict, not a parameter."""
    cfg = ModelConfig(vocab_size=67, d_model=64, n_layer=3, ctx_len=24, **BASES[base], **VARIANTS[variant])
    model = LM(cfg)
    assert cfg.num_params() == model.num_params()
    d, L, E, k, h = 64, 3, cfg.moe_experts, cfg.moe_top_k, cfg.moe_expert_hidden
    mats = 3 if base == "llama" else 2
    shared = mats * d * h if cfg.moe_shared else 0
    ffn = model.blocks[0].ffn
    assert sum(p.numel() for p in ffn.parameters()) == E * mats * d * h + E * d + shared == cfg.ffn_params()
    assert cfg.active_params() == cfg.num_params() - L * (E - k) * mats * d * h
    assert ffn.shared_gate is None and "select_bias" not in dict(ffn.named_parameters())
    assert ffn.select_bias.shape == (E,) and not ffn.select_bias.requires_grad
    assert "blocks.0.ffn.select_bias" in model.state_dict()
    qwen = ModelConfig(**{**cfg.model_dump(), "moe_router": "softmax-topk", "moe_n_group": 1, "moe_topk_group": 1,
                          "moe_routed_scaling_factor": 1.0})
    assert cfg.num_params() == qwen.num_params() - (L * d if cfg.moe_shared else 0)  # the gates, nothing else
    assert "blocks.0.ffn.select_bias" not in LM(qwen).state_dict()


# ------------------------------------------------------------------------- validation


@pytest.mark.parametrize("settings, fragment", [
    ({"moe_router": "deepseek"}, "moe_router='deepseek' routes a mixture of experts: it needs moe=true"),
    ({"moe_n_group": 2}, "moe_n_group is a setting of the deepseek router"),
    ({"moe": True, "moe_topk_group": 2}, "moe_topk_group is a setting of the deepseek router"),
    ({"moe": True, "moe_routed_scaling_factor": 2.5}, "moe_routed_scaling_factor is a setting"),
    ({**DEEPSEEK, "moe_n_group": 2, "moe_topk_group": 3}, "moe_topk_group=3 must not exceed moe_n_group=2"),
    ({**DEEPSEEK, "moe_n_group": 3}, "moe_n_group=3 must divide moe_experts=8"),
    ({**DEEPSEEK, "moe_n_group": 8}, "into groups of at least 2"),  # a group is scored by its top 2
    ({**DEEPSEEK, "moe_n_group": 4, "moe_topk_group": 1, "moe_top_k": 3}, "moe_top_k=3 exceeds the 2 experts"),
    ({**DEEPSEEK, "moe_routed_scaling_factor": 0}, "moe_routed_scaling_factor"),
    ({**DEEPSEEK, "moe_router": "sigmoid"}, "moe_router"),
])
def test_bad_router_settings_are_one_line(settings, fragment):
    with pytest.raises(ConfigError) as err:
        validate(ModelConfig, settings)
    assert fragment in str(err.value) and "\n" not in str(err.value)


def test_the_deepseek_router_takes_no_balance_loss():
    """It balances by its bias: a balance-loss coefficient goes unused, so one set (not the default nobody
    set, issue 37) is refused as a knob that does nothing."""
    validate(RunConfig, {"model": DEEPSEEK})
    with pytest.raises(ConfigError) as err:
        validate(RunConfig, {"model": DEEPSEEK, "train": {"moe_aux_loss": 0.01}})
    assert "moe_aux_loss=0.01 does nothing here" in str(err.value) and "\n" not in str(err.value)
    cfg = validate(RunConfig, {"model": GROUPED, "train": {"moe_aux_loss": 0, "moe_bias_rate": 0.01}})
    assert (cfg.model.moe_n_group, cfg.train.moe_bias_rate) == (4, 0.01)
    with pytest.raises(ConfigError, match="moe_bias_rate"):
        validate(RunConfig, {"train": {"moe_bias_rate": -1}})


@pytest.mark.parametrize("sets, fragment", [
    (["model.moe_router=deepseek"], "it needs moe=true"),
    (["model.moe_n_group=2"], "moe_n_group is a setting of the deepseek router"),
    (["model.moe=true", "model.moe_router=deepseek", "train.moe_aux_loss=0", "model.moe_n_group=2",
      "model.moe_topk_group=4"], "moe_topk_group=4 must not exceed moe_n_group=2"),
    (["model.moe=true", "model.moe_router=deepseek", "train.moe_aux_loss=0", "model.moe_n_group=3"],
     "must divide moe_experts=8"),
    (["model.moe=true", "model.moe_router=deepseek", "train.moe_aux_loss=0", "model.moe_n_group=4",
      "model.moe_top_k=3"], "moe_top_k=3 exceeds"),
    (["model.moe=true", "model.moe_router=deepseek", "train.moe_aux_loss=0.01"], "moe_aux_loss=0.01 does nothing"),
])
def test_bad_router_settings_exit_2_on_the_cli(sets, fragment):
    args = ["train", "--steps", "1"] + [a for s in sets for a in ("--set", s)]
    one_error_line(CliRunner().invoke(app, args), fragment)


def test_new_fields_at_their_defaults_keep_run_ids():
    today = RunConfig(model={"vocab_size": 50, "moe": True}).model_dump(mode="json")
    before = json.loads(json.dumps(today))
    for key in ("moe_router", "moe_n_group", "moe_topk_group", "moe_routed_scaling_factor"):
        del before["model"][key]
    del before["train"]["moe_bias_rate"]
    assert runs.config_hash(today) == runs.config_hash(before)
    on = RunConfig(model={"vocab_size": 50, **DEEPSEEK}, train={"moe_aux_loss": 0}).model_dump(mode="json")
    assert runs.config_hash(on) != runs.config_hash(today)


# ------------------------------------------------------------------------- the routing


@torch.no_grad()
def manual_route(ffn: MoE, v: torch.Tensor) -> dict[int, float]:
    """One token, written out: {expert: weight} of the deepseek router, in float64."""
    n_group, topk_group, scale = ffn.routing
    s = torch.sigmoid(ffn.router.weight.double() @ v.double())  # [E]
    b = s + ffn.select_bias.double()
    size = len(s) // n_group
    group_score = [float(b[g * size:(g + 1) * size].topk(2).values.sum()) for g in range(n_group)]
    kept = sorted(range(n_group), key=lambda g: -group_score[g])[:topk_group]
    allowed = [e for e in range(len(s)) if e // size in kept]
    chosen = sorted(allowed, key=lambda e: -float(b[e]))[: ffn.k]
    total = float(s[chosen].sum())
    return {e: float(s[e]) / total * scale for e in chosen}


def test_routing_equals_the_rule_written_out(make_lm):
    """The bias picks, the unbiased sigmoid weighs, groups limit; and each of the three binds here."""
    model = with_bias(make_lm(**GROUPED, **LLAMA))
    ffn = model.blocks[0].ffn
    x = torch.randn(40, 32, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        logits = F.linear(x, ffn.router.weight)
    weight, expert = moe.deepseek_topk(logits, ffn.select_bias, ffn.k, *ffn.routing)
    for n in range(40):
        ref = manual_route(ffn, x[n])
        assert set(expert[n].tolist()) == set(ref)
        for w, e in zip(weight[n].tolist(), expert[n].tolist()):
            assert w == pytest.approx(ref[e], abs=1e-6)
    unbiased = moe.deepseek_topk(logits, torch.zeros(8), ffn.k, *ffn.routing)[1]
    ungrouped = moe.deepseek_topk(logits, ffn.select_bias, ffn.k, 4, 4, 2.5)[1]
    for other in (unbiased, ungrouped):
        assert (other.sort(-1).values != expert.sort(-1).values).any(-1).sum() >= 3
    torch.testing.assert_close(weight.sum(-1), torch.full((40,), 2.5))  # renormalised, times the factor


@BASE
def test_causality(make_lm, base):
    assert_causal(with_bias(make_lm(**GROUPED, moe_shared=True, **BASES[base])))


@pytest.mark.parametrize("parts", [{}, {"moe_shared": True}, {"n_kv_head": 1, **GROUPED}], ids=str)
@BASE
def test_cached_decode_equals_full_forward(make_lm, base, parts):
    model = with_bias(make_lm(**{**DEEPSEEK, **BASES[base], **parts}))
    assert_decodes_like_full(model, tokens(2, 16, seed=1), [[6] + [1] * 10, [5, 3, 1, 4, 1, 2]])


def test_the_cross_entropy_reaches_only_the_chosen_experts_and_never_the_bias(make_lm):
    model = with_bias(make_lm(**GROUPED, moe_shared=True, **LLAMA)).train()
    _, loss, aux = model(tokens(1, 1), tokens(1, 1, seed=1), aux=True)
    assert set(aux) == {"expert_counts"}  # no balance loss
    loss.backward()
    for block in model.blocks:
        ffn = block.ffn
        assert ffn.select_bias.grad is None
        touched = sum(int((p.grad != 0).sum()) for n, p in ffn.named_parameters() if n != "router.weight")
        assert touched == ffn.k * ffn.down.weight[0].numel() * 3 + sum(p.numel() for p in ffn.shared.parameters())
        assert int((ffn.router.weight.grad.abs().sum(-1) > 0).sum()) == ffn.k  # sigmoid: the chosen rows only


# ------------------------------------------------------------------------- Hugging Face parity


try:
    import transformers
    from transformers.models.deepseek_v3 import modeling_deepseek_v3 as hf_ds
except ImportError:  # transformers is in the hf/dev extras; an older one lacks DeepSeek-V3
    transformers = hf_ds = None
NEEDS_HF = pytest.mark.skipif(hf_ds is None, reason="the installed transformers has no DeepSeek-V3 model")
PARITY = {"d_model": 32, "n_head": 4, "n_kv_head": 4, "ctx_len": 24, "vocab_size": 61, "norm_type": "rmsnorm",
          "norm_pos": "pre", "pos_type": "rope", "ffn_type": "swiglu", "moe_hidden": 24, "moe_shared": True,
          "norm_eps": 1e-5, **GROUPED}
MLA = {"attn_type": "mla", "q_lora_rank": 24, "kv_lora_rank": 20, "qk_rope_head_dim": 6, "qk_nope_head_dim": 10,
       "v_head_dim": 12}
DTYPES = pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.float64, 1e-12)], ids=["fp32", "fp64"])


def hf_config(cfg: ModelConfig, attn: str = "eager", **extra):
    """DeepseekV3Config of anatomy's sizes: every layer MoE, norm_topk_prob, one shared expert."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    m = cfg.mla_dims
    hc = transformers.DeepseekV3Config(
        vocab_size=cfg.vocab_size, hidden_size=cfg.d_model, num_hidden_layers=cfg.n_layer,
        num_attention_heads=cfg.n_head, num_key_value_heads=cfg.n_head, q_lora_rank=m.q_lora_rank,
        kv_lora_rank=m.kv_lora_rank, qk_rope_head_dim=m.qk_rope_head_dim, qk_nope_head_dim=m.qk_nope_head_dim,
        v_head_dim=m.v_head_dim, rope_interleave=True, attention_bias=False, max_position_embeddings=cfg.ctx_len,
        rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_base}, rms_norm_eps=cfg.norm_eps,
        tie_word_embeddings=False, hidden_act="silu", intermediate_size=cfg.ffn_hidden, first_k_dense_replace=0,
        n_routed_experts=cfg.moe_experts, num_experts_per_tok=cfg.moe_top_k,
        moe_intermediate_size=cfg.moe_expert_hidden, n_shared_experts=1, n_group=cfg.moe_n_group,
        topk_group=cfg.moe_topk_group, routed_scaling_factor=cfg.moe_routed_scaling_factor, norm_topk_prob=True,
        experts_implementation="eager", **extra)
    hc._attn_implementation = attn  # eager's softmax runs in fp32; sdpa keeps fp64 end to end (test_mla.py)
    return hc


def hf_moe_state(ffn: MoE) -> dict[str, torch.Tensor]:
    """anatomy's MoE -> DeepseekV3MoE's state dict."""
    sd = ffn.state_dict()
    out = {"gate.weight": sd["router.weight"], "gate.e_score_correction_bias": sd["select_bias"],
           "experts.gate_up_proj": sd["up.weight"], "experts.down_proj": sd["down.weight"]}
    out |= {f"shared_experts.{m}_proj.weight": sd[f"shared.{m}.weight"] for m in ("gate", "up", "down")}
    return {k: v.detach().clone() for k, v in out.items()}


def layer_pair(dtype):
    """A scrambled anatomy deepseek MoE layer with a non-zero bias, and DeepseekV3MoE holding its weights."""
    cfg = ModelConfig(n_layer=1, **PARITY)
    torch.manual_seed(0)
    ours = with_bias(scramble(LM(cfg))).blocks[0].ffn.to(dtype).eval()
    theirs = hf_ds.DeepseekV3MoE(hf_config(cfg)).to(dtype).eval()
    theirs.load_state_dict(hf_moe_state(ours), strict=True)
    return ours, theirs


def router_in_input_dtype(self, hidden_states):
    """transformers' DeepseekV3TopkRouter.forward, line for line, with its logits in the input's dtype:
    its cast to fp32 caps fp64 at ~1e-7 (anatomy's router keeps fp64, and rounds only below fp32)."""
    hidden_states = hidden_states.view(-1, self.hidden_dim)
    router_logits = F.linear(hidden_states, self.weight)  # was: both cast to torch.float32
    scores = router_logits.sigmoid()
    scores_for_choice = scores + self.e_score_correction_bias
    group_scores = (
        scores_for_choice.view(-1, self.num_group, self.num_experts // self.num_group).topk(2, dim=-1)[0].sum(dim=-1)
    )
    group_idx = torch.topk(group_scores, k=self.topk_group, dim=-1, sorted=False)[1]
    group_mask = torch.zeros_like(group_scores)
    group_mask.scatter_(1, group_idx, 1)
    score_mask = (
        group_mask.unsqueeze(-1).expand(-1, self.num_group, self.num_experts // self.num_group)
        .reshape(-1, self.num_experts)
    )
    scores_for_choice = scores_for_choice.masked_fill(~score_mask.bool(), float("-inf"))
    topk_indices = torch.topk(scores_for_choice, k=self.top_k, dim=-1, sorted=False)[1]
    topk_weights = scores.gather(1, topk_indices)
    if self.norm_topk_prob:
        denominator = topk_weights.sum(dim=-1, keepdim=True) + 1e-20
        topk_weights /= denominator
    topk_weights = topk_weights * self.routed_scaling_factor
    return router_logits, topk_weights, topk_indices


@pytest.fixture
def hf_fp64(monkeypatch):
    """HF's fp32 casts off (router, RMSNorm) and its rotary tables as anatomy's, for fp64 comparisons."""
    monkeypatch.setattr(hf_ds.DeepseekV3TopkRouter, "forward", router_in_input_dtype)
    monkeypatch.setattr(hf_ds.DeepseekV3RMSNorm, "forward", rms_norm_in_input_dtype)
    monkeypatch.setattr(hf_ds.DeepseekV3RotaryEmbedding, "forward", hf_rope)


def layer_diff(dtype) -> float:
    ours, theirs = layer_pair(dtype)
    x = torch.randn(3, 20, 32, generator=torch.Generator().manual_seed(2), dtype=torch.float64).to(dtype)
    with torch.no_grad():
        a = ours(x)
        assert a.abs().max() > 0.1  # a real signal
        return float((a - theirs(x)).abs().max())


@NEEDS_HF
@DTYPES
def test_moe_layer_equals_deepseek_v3_moe(dtype, tol, request):
    """Router, bias, groups, scaling, ungated shared expert: only summation order differs. fp32 is
    transformers' own code; fp64 turns off its router's cast to fp32 (hf_fp64)."""
    if dtype == torch.float64:
        request.getfixturevalue("hf_fp64")
    assert layer_diff(dtype) <= tol


def bias_in_the_weights(logits, bias, k, n_group, topk_group, scale):
    """Mutation: the bias added to the weights as well as to the choice."""
    weight, expert = REAL_ROUTE(logits, bias, k, n_group, topk_group, scale)
    biased = (logits.sigmoid() + bias).gather(1, expert)
    return biased / biased.sum(dim=-1, keepdim=True) * scale, expert


def no_group_limit(logits, bias, k, n_group, topk_group, scale):
    """Mutation: every group kept."""
    return REAL_ROUTE(logits, bias, k, n_group, n_group, scale)


def no_bias(logits, bias, k, n_group, topk_group, scale):
    """Mutation: the bias never applied."""
    return REAL_ROUTE(logits, torch.zeros_like(bias), k, n_group, topk_group, scale)


REAL_ROUTE = moe.deepseek_topk


@NEEDS_HF
@pytest.mark.parametrize("mutant", [bias_in_the_weights, no_group_limit, no_bias], ids=lambda f: f.__name__)
@pytest.mark.usefixtures("hf_fp64")
def test_planted_mutations_fail_the_parity(mutant, monkeypatch):
    monkeypatch.setattr(moe, "deepseek_topk", mutant)
    assert layer_diff(torch.float64) > 1e-3


# ------------------------------------------------------------------------- the whole model against HF


def rms_norm_in_input_dtype(self, x):
    """HF's DeepseekV3RMSNorm formula without its cast to fp32 (which caps fp64 at ~1e-7)."""
    return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon))


def hf_rope(self, x, position_ids):
    """HF's (cos, sin) layout from float64 angles rounded to fp32, like anatomy's tables (test_mla.py)."""
    p, base = self.config.qk_rope_head_dim, self.config.rope_parameters["rope_theta"]
    inv_freq = 1.0 / base ** (torch.arange(0, p, 2, dtype=torch.float64) / p)
    angles = position_ids[..., None].double() * inv_freq  # [B, T, p/2]
    emb = torch.cat((angles, angles), dim=-1)
    return emb.cos().float().to(x.dtype), emb.sin().float().to(x.dtype)


def interleave_rows(w: torch.Tensor, p: int) -> torch.Tensor:
    """Rope rows from anatomy's half-split pairing (i, i + p/2) to DeepSeek's (2i, 2i + 1)."""
    order = torch.stack((torch.arange(p // 2), torch.arange(p // 2) + p // 2), dim=-1).flatten()
    return w[order]


def hf_model_state(lm: LM) -> dict[str, torch.Tensor]:
    """anatomy's LLaMA-end + mla + deepseek-routed LM -> DeepseekV3ForCausalLM (rope_interleave)."""
    cfg, names = lm.cfg, {"q_down": "q_a_proj", "q_norm": "q_a_layernorm", "q_up": "q_b_proj",
                          "kv_down": "kv_a_proj_with_mqa", "kv_norm": "kv_a_layernorm", "kv_up": "kv_b_proj",
                          "out": "o_proj"}
    m, H = cfg.mla_dims, cfg.n_head
    n, p, r = m.qk_nope_head_dim, m.qk_rope_head_dim, m.kv_lora_rank
    out = deepseek_base_state(lm, dense_mlp=False)
    for i, block in enumerate(lm.blocks):
        pre = f"model.layers.{i}."
        attn = {f"{names[k.split('.')[0]]}.weight": v for k, v in block.attn.state_dict().items()}
        q = attn["q_b_proj.weight"].view(H, n + p, -1)  # head-major, each head (nope | rope)
        q = torch.cat((q[:, :n], torch.stack([interleave_rows(h, p) for h in q[:, n:]])), dim=1)
        kv = attn["kv_a_proj_with_mqa.weight"]  # (latent | rope key)
        attn |= {"q_b_proj.weight": q.reshape(H * (n + p), -1),
                 "kv_a_proj_with_mqa.weight": torch.cat((kv[:r], interleave_rows(kv[r:], p)))}
        out |= {pre + "self_attn." + k: v for k, v in attn.items()}
        out |= {pre + "mlp." + k: v for k, v in hf_moe_state(block.ffn).items()}
    return {k: v.detach().clone() for k, v in out.items()}


@NEEDS_HF
@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-4), (torch.float64, 1e-10)], ids=["fp32", "fp64"])
def test_model_equals_deepseek_v3(dtype, tol, request):
    """anatomy's LLaMA end with mla and the deepseek router is DeepseekV3ForCausalLM with every layer
    MoE (first_k_dense_replace=0). fp64: HF's fp32 casts off and its rotary tables as anatomy's (hf_fp64)."""
    if dtype == torch.float64:
        request.getfixturevalue("hf_fp64")
    cfg = ModelConfig(n_layer=3, **PARITY, **MLA)
    torch.manual_seed(0)
    lm = with_bias(scramble(LM(cfg))).to(dtype).eval()
    hf = transformers.DeepseekV3ForCausalLM(hf_config(cfg, "sdpa" if dtype == torch.float64 else "eager"))
    hf = hf.to(dtype).eval()
    hf.load_state_dict(hf_model_state(lm), strict=True)
    idx = torch.randint(0, cfg.vocab_size, (2, 20), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ours, theirs = lm(idx)[0], hf(idx).logits
    assert ours.std() > 0.5
    assert (ours - theirs).abs().max() <= tol


# ------------------------------------------------------------------------- the bias update


def test_update_moves_each_bias_by_the_rate_toward_balance():
    cfg = ModelConfig(vocab_size=50, d_model=32, n_layer=2, n_head=4, moe_experts=4, **DEEPSEEK)
    model = LM(cfg)
    counts = torch.tensor([[5.0, 3.0, 4.0, 4.0], [0.0, 8.0, 8.0, 0.0]])  # mean 4 each
    update_biases(model, counts, 0.01)
    update_biases(model, counts, 0.01)
    assert model.blocks[0].ffn.select_bias.tolist() == pytest.approx([-0.02, 0.02, 0.0, 0.0])
    assert model.blocks[1].ffn.select_bias.tolist() == pytest.approx([0.02, -0.02, -0.02, 0.02])
    qwen = LM(ModelConfig(vocab_size=50, d_model=32, n_layer=2, n_head=4, moe=True))
    before = {k: v.clone() for k, v in qwen.state_dict().items()}
    update_biases(qwen, counts, 0.01)  # no deepseek layers: nothing moves
    assert all(torch.equal(v, before[k]) for k, v in qwen.state_dict().items())


def max_violation(counts: torch.Tensor) -> float:
    """Wang et al. 2024's MaxVio: the most loaded expert's excess over the mean load, worst layer."""
    return float((counts.amax(-1) / counts.mean(-1) - 1).max())


def test_repeated_updates_balance_a_skewed_router(make_lm):
    """Fixed weights and batch, a skewed router: the bias alone brings the load near even."""
    model = make_lm(**DEEPSEEK, **LLAMA)
    for block in model.blocks:
        block.ffn.router.weight.data[:2] += 0.5 * block.ffn.router.weight.data[2:4]  # experts 0, 1 echo 2, 3
    idx = tokens(4, 24, seed=2)
    with torch.no_grad():
        start = model(idx, aux=True)[2]["expert_counts"]
        for _ in range(300):
            update_biases(model, model(idx, aux=True)[2]["expert_counts"], 0.01)
        end = model(idx, aux=True)[2]["expert_counts"]
    assert max_violation(start) > 0.5 and max_violation(end) < 0.25


def test_a_training_step_updates_the_bias_from_its_own_batch_off_the_loss(tmp_path):
    rate = 0.003
    tr = trainer(tmp_path, "ds", {**LLAMA, **GROUPED, "moe_shared": True}, moe_aux_loss=0, moe_bias_rate=rate)
    params = {id(p) for group in tr.opt.param_groups for p in group["params"]}
    biases = [b.ffn.select_bias for b in tr.model.blocks]
    assert all(id(b) not in params and not b.requires_grad for b in biases)  # the optimizer never sees it
    state = tr.sampler.state()
    x, y = tr.sampler.next()
    tr.sampler.set_state(state)  # train_step draws this same batch
    with torch.no_grad():
        _, _, aux = tr.model(x, y, aux=True)  # the weights train_step's forward sees
    rec = tr.train_step()
    assert set(rec.terms) == set()  # no balance term in the loss or the metrics
    expect = rate * torch.sign(aux["expert_counts"].mean(-1, keepdim=True) - aux["expert_counts"])
    torch.testing.assert_close(torch.stack(biases), expect, atol=0, rtol=0)
    assert all(b.grad is None for b in biases) and expect.abs().sum() > 0


# ------------------------------------------------------------------------- a run and its resume


def same_weights(a, b) -> bool:
    wa, wb = load_file(str(a)), load_file(str(b))
    return wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


def strip(run_dir) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in runs.TIMING_KEYS} for r in runs.read_metrics(run_dir)]


def test_a_resumed_run_equals_one_trained_straight_through(tmp_path):
    """The bias lives in the weights (state dict, resume.pt, best.safetensors), so a run stopped at
    step 4 and resumed ends bit for bit where the straight run does; and the routing it records."""
    corpus = write_corpus(tmp_path)
    cfg = validate(RunConfig, {"model": {**TINY_MODEL, **LLAMA, **DEEPSEEK, "moe_experts": 4, "moe_n_group": 2},
                               "data": {"source": str(corpus)},
                               "train": {**TINY_TRAIN, "sample_len": 0, "device": "cpu", "eval_interval": 3,
                                         "log_interval": 1, "moe_aux_loss": 0, "moe_bias_rate": 0.01}})
    straight = train(cfg, tmp_path / "straight")
    run, seen = tmp_path / "run", {"step": 0}
    stopped = train(cfg, run, progress=lambda p: seen.update(step=p["step"]), stop=lambda: seen["step"] >= 4)
    assert stopped["status"] == runs.INTERRUPTED
    saved = checkpoint.load_checkpoint(run / runs.RESUME)["model"]
    assert sum(saved[f"blocks.{i}.ffn.select_bias"].abs().sum() for i in (0, 1)) > 0  # 4 steps of updates
    resumed = resume(run)
    assert straight["status"] == resumed["status"] == runs.COMPLETED
    assert strip(run) == strip(tmp_path / "straight")
    assert same_weights(run / runs.LAST, tmp_path / "straight" / runs.LAST)
    assert same_weights(run / runs.BEST, tmp_path / "straight" / runs.BEST)
    assert resumed["expert_load"] == straight["expert_load"] and len(straight["expert_load"]) == 2
    assert all(sum(row) == pytest.approx(1.0) for row in straight["expert_load"])
    assert not any("moe_aux_loss" in r for r in runs.read_metrics(run))
    final = load_file(str(run / runs.LAST))["blocks.1.ffn.select_bias"]
    assert final.abs().max() > 0 and straight["params"] == cfg.model.model_copy(
        update={"vocab_size": straight_vocab(tmp_path)}).num_params()


def straight_vocab(tmp_path) -> int:
    return json.loads((tmp_path / "straight" / runs.CONFIG).read_text())["model"]["vocab_size"]


def test_export_names_the_router_beside_the_experts():
    from anatomy_cli.exams.export import ExportError, check_llama_shaped

    cfg = ModelConfig(vocab_size=50, **LLAMA, moe=True, moe_router="deepseek")
    with pytest.raises(ExportError) as err:
        check_llama_shaped(cfg)
    assert str(err.value) == ("cannot export to Llama: mixture of experts (moe), DeepSeek-V3's router "
                              "(moe_router 'deepseek') have no Llama equivalent")
    with pytest.raises(ExportError) as err:  # Qwen3-MoE's router: the experts alone are named
        check_llama_shaped(ModelConfig(vocab_size=50, **LLAMA, moe=True))
    assert "router" not in str(err.value)

"""The mixture of experts (moe): exact total and active counts, the routing written out by hand,
causality, cached decode, determinism, the load-balancing loss, training and the run summary, bad
input, and parity with Hugging Face's Qwen3-MoE (every layer MoE) and Qwen2-MoE (gated shared expert).
"""

from __future__ import annotations

import json
import math
import os

import pytest
import torch
import torch.nn.functional as F
from conftest import scramble
from helpers import LLAMA, one_error_line
from lm_checks import assert_causal, assert_decodes_like_full, tokens, train_losses, trainer
from toy_data import TINY_MODEL, TINY_TRAIN, write_corpus
from typer.testing import CliRunner

from anatomy_cli.cli.main import app
from anatomy_cli.model import LM
from anatomy_cli.model.moe import MoE, balance
from anatomy_cli.report import frames, write
from anatomy_cli.report.build import build_report
from anatomy_cli.spec import components
from anatomy_cli.spec.config import ConfigError, ModelConfig, RunConfig, validate
from anatomy_cli.store import runs
from anatomy_cli.training import tensorboard as tb_events
from anatomy_cli.training.run import train

pytestmark = [pytest.mark.filterwarnings("error"), pytest.mark.usefixtures("single_thread")]

BASES = {"2017": {}, "llama": LLAMA}
BASE = pytest.mark.parametrize("base", list(BASES))
VARIANTS = {  # MoE settings beyond the defaults (8 experts, top-2, half the dense hidden each)
    "default": {},
    "shared": {"moe_shared": True},
    "top1-4x40": {"moe_top_k": 1, "moe_experts": 4, "moe_hidden": 40},
    "top3-shared": {"moe_top_k": 3, "moe_shared": True},
}
VARIANT = pytest.mark.parametrize("variant", list(VARIANTS))


# ------------------------------------------------------------------------- parameter counts


@VARIANT
@BASE
def test_total_and_active_counts_are_exact(base, variant):
    cfg = ModelConfig(vocab_size=67, d_model=64, n_layer=3, ctx_len=24, moe=True, **BASES[base], **VARIANTS[variant])
    dense = ModelConfig(**{**cfg.model_dump(), "moe": False})
    model = LM(cfg)
    assert cfg.num_params() == model.num_params()
    d, L, E, k, h = 64, 3, cfg.moe_experts, cfg.moe_top_k, cfg.moe_expert_hidden
    mats = 3 if base == "llama" else 2  # SwiGLU experts: gate, up, down; GELU experts: up, down
    shared = (mats * d * h + d) if cfg.moe_shared else 0  # the shared expert and its 1 x d gate
    router = E * d
    assert cfg.num_params() - dense.num_params() == L * (E * mats * d * h + router + shared - mats * d * cfg.ffn_hidden)
    assert cfg.active_params() == cfg.num_params() - L * (E - k) * mats * d * h
    ffn = model.blocks[0].ffn
    assert isinstance(ffn, MoE) and sum(p.numel() for p in ffn.parameters()) == E * mats * d * h + router + shared
    assert dense.active_params() == dense.num_params()  # a dense model uses all of it


def test_published_size_counts():
    """At the README's size (vocab 1719, d 128, 4 layers, LLaMA end with 2 K/V heads: 1,178,496), the
    defaults give 8 SwiGLU experts of hidden 176 (half of 352) per layer, top-2."""
    cfg = ModelConfig(vocab_size=1719, d_model=128, n_layer=4, n_head=4, ctx_len=128, moe=True, **LLAMA)
    assert cfg.moe_expert_hidden == 176 and cfg.ffn_hidden == 352
    # per layer: 8 x 3 x 128 x 176 = 540,672 expert weights + 1,024 router, instead of 135,168
    assert cfg.num_params() == 1_178_496 + 4 * (540_672 + 1_024 - 135_168) == 2_804_608
    assert cfg.active_params() == 1_178_496 + 4 * 1_024 == 1_182_592  # the router is all a token adds


@BASE
def test_default_active_ffn_equals_the_dense_ffn(base):
    """8 experts of half the hidden, top-2: a token's expert weights are the dense FFN's count, the
    experts together 4x it (the router is extra)."""
    for d in (32, 128, 256):
        cfg = ModelConfig(vocab_size=50, d_model=d, n_head=4, moe=True, **BASES[base])
        total, active = cfg.ffn_params(), cfg.ffn_params(active=True)
        dense = cfg.dense_ffn_params(cfg.ffn_hidden)
        assert active - 8 * d == dense and total - 8 * d == 4 * dense


def test_a_tokens_gradient_reaches_exactly_the_active_experts(make_lm):
    """One token's loss: in every MoE layer the gradient reaches k experts and the shared expert with
    its gate, nothing else; the router (all E rows: every logit is computed) makes up the rest of the
    active count. Renormalised top-k weights depend only on the chosen logits, so the cross-entropy
    reaches just k router rows; the balance loss trains the others."""
    model = make_lm(moe=True, moe_shared=True, **LLAMA).train()
    cfg = model.cfg
    _, loss = model(tokens(1, 1), tokens(1, 1, seed=1))
    loss.backward()
    total, active = cfg.ffn_params(), cfg.ffn_params(active=True)
    for block in model.blocks:
        touched = sum(int((p.grad != 0).sum()) for n, p in block.ffn.named_parameters() if n != "router.weight")
        assert touched + block.ffn.router.weight.numel() == active < total


# ------------------------------------------------------------------------- validation


@pytest.mark.parametrize("settings, fragment", [
    ({"moe_top_k": 9}, "moe_top_k=9 must not exceed moe_experts=8"),
    ({"moe_top_k": 0}, "moe_top_k"),
    ({"moe_experts": 1}, "moe_experts"),
    ({"moe_hidden": 0}, "moe_hidden"),
    ({"d_model": 1, "n_head": 1, "n_kv_head": 1, "moe_top_k": 5}, "set model.moe_hidden"),  # GELU hidden 4 / 5
])
def test_bad_moe_settings_are_one_line(settings, fragment):
    with pytest.raises(ConfigError) as err:
        validate(ModelConfig, {"moe": True, **settings})
    assert fragment in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("setting", ["model.moe_top_k=9", "model.moe_top_k=0", "model.moe_experts=1",
                                     "model.moe_hidden=0"])
def test_bad_moe_settings_exit_2_on_the_cli(setting):
    result = CliRunner().invoke(app, ["train", "--set", "model.moe=true", "--set", setting, "--steps", "1"])
    one_error_line(result, setting.split("=")[0].removeprefix("model."))


def test_new_fields_at_their_defaults_keep_run_ids():
    """Configs written before moe existed (without its fields) hash as today's configs do."""
    today = RunConfig(model={"vocab_size": 50}).model_dump(mode="json")
    before = json.loads(json.dumps(today))
    for key in ("moe", "moe_experts", "moe_top_k", "moe_hidden", "moe_shared"):
        del before["model"][key]
    del before["train"]["moe_aux_loss"]
    assert runs.config_hash(today) == runs.config_hash(before)
    on = RunConfig(model={"vocab_size": 50, "moe": True}).model_dump(mode="json")
    assert runs.config_hash(on) != runs.config_hash(today)


def test_components_command_shows_total_and_active_change():
    result = CliRunner().invoke(app, ["components", "--json"])
    assert result.exit_code == 0, result.output
    row = next(r for r in json.loads(result.output)["components"] if r["name"] == "moe")
    # LLaMA end, per layer: 8 x 3 x 128 x 176 + 1,024 router - 3 x 128 x 352; active: the router alone
    assert (row["params_from_llama"], row["active_from_llama"]) == (4 * 406_528, 4 * 1_024)
    # 2017 end, GELU experts: 8 x 2 x 128 x 256 + 1,024 - 2 x 128 x 512
    assert (row["params_from_2017"], row["active_from_2017"]) == (4 * 394_240, 4 * 1_024)
    rope = next(r for r in json.loads(result.output)["components"] if r["name"] == "rope")
    assert rope["active_from_2017"] == rope["params_from_2017"]  # a dense part: every parameter is active
    table = CliRunner().invoke(app, ["components", "--wide"]).output
    assert "+1,626,112" in table and "(active +4,096)" in table


def test_the_component_row():
    row = components.BY_NAME["moe"]
    assert row.llama == "off" and row.source and dict(row.on) == {"model.moe": True}
    assert components.label(ModelConfig(moe=True, **LLAMA)) == "llama+moe"
    assert components.states(ModelConfig(**LLAMA))["moe"] is False


# ------------------------------------------------------------------------- the routing, by hand


def manual_moe(ffn: MoE, x: torch.Tensor) -> torch.Tensor:
    """Token by token in float64: softmax over all experts, the k largest, renormalised, the weighted
    sum of those experts' SwiGLU, plus sigmoid(g . x) times the shared expert."""
    ffn = ffn.double()
    out = torch.zeros_like(x, dtype=torch.float64)
    for n, v in enumerate(x.double().reshape(-1, x.shape[-1])):
        p = torch.softmax(ffn.router.weight @ v, dim=0)
        top = sorted(range(len(p)), key=lambda e: -float(p[e]))[: ffn.k]
        for e in top:
            gate, up = (ffn.up.weight[e] @ v).chunk(2)
            out.view(-1, x.shape[-1])[n] += p[e] / p[top].sum() * (ffn.down.weight[e] @ (F.silu(gate) * up))
        if ffn.shared is not None:
            s = ffn.shared
            shared = s.down.weight @ (F.silu(s.gate.weight @ v) * (s.up.weight @ v))
            out.view(-1, x.shape[-1])[n] += torch.sigmoid(ffn.shared_gate.weight @ v)[0] * shared
    return out


@pytest.mark.parametrize("shared", [False, True])
def test_moe_equals_the_routing_written_out(make_lm, shared):
    model = make_lm(moe=True, moe_shared=shared, **LLAMA)
    ffn = model.blocks[0].ffn
    x = torch.randn(2, 7, 32, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        ours = ffn(x)
        ref = manual_moe(ffn, x)
    torch.testing.assert_close(ours.double(), ref, atol=1e-5, rtol=1e-5)


def test_a_token_depends_only_on_its_top_k_experts(make_lm):
    """Zeroing an expert a token did not choose leaves that token's output unchanged; zeroing one it
    chose changes it. Every expert is chosen by some tokens and passed over by others."""
    model = make_lm(moe=True, **LLAMA)
    ffn = model.blocks[0].ffn
    x = torch.randn(1, 40, 32, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        ref = ffn(x)[0]  # [T, C]
        chosen = F.softmax(ffn.router(x[0]), dim=-1).topk(ffn.k, dim=-1).indices  # [T, k]
        for e in range(ffn.router.out_features):
            picked = (chosen == e).any(dim=-1)  # [T]
            assert 0 < int(picked.sum()) < 40
            saved = ffn.down.weight[e].clone()
            ffn.down.weight[e] = 0
            out = ffn(x)[0]
            ffn.down.weight[e] = saved
            torch.testing.assert_close(out[~picked], ref[~picked], atol=0, rtol=0)
            assert (out[picked] - ref[picked]).abs().amax(dim=-1).min() > 1e-4


def test_gelu_experts_are_gelu_ffns(make_lm):
    """From the 2017 end an expert is the GELU MLP: with every expert holding the same weights, the
    mixture is that one GELU FFN (the renormalised weights sum to 1)."""
    model = make_lm(moe=True)
    ffn = model.blocks[0].ffn
    assert ffn.up.weight.shape == (8, 64, 32)  # GELU hidden 4d = 128, halved; one up matrix per expert
    with torch.no_grad():
        ffn.up.weight[:] = ffn.up.weight[0]
        ffn.down.weight[:] = ffn.down.weight[0]
        x = torch.randn(2, 5, 32, generator=torch.Generator().manual_seed(1))
        one = F.gelu(x @ ffn.up.weight[0].T) @ ffn.down.weight[0].T
        torch.testing.assert_close(ffn(x), one, atol=1e-5, rtol=1e-5)


# ------------------------------------------------------------------------- causality and the cache


@BASE
def test_causality(make_lm, base):
    assert_causal(make_lm(moe=True, **BASES[base]))


@pytest.mark.parametrize("parts", [{}, {"n_kv_head": 1}, {"qk_norm": True}, {"moe_shared": True},
                                   {"qk_norm": True, "parallel_block": True}, {"gdn_pattern": "DA"}], ids=str)
@BASE
def test_cached_decode_equals_full_forward(make_lm, base, parts):
    model = make_lm(moe=True, **{**BASES[base], **parts})
    assert_decodes_like_full(model, tokens(2, 16, seed=1), [[6] + [1] * 10, [5, 3, 1, 4, 1, 2]])


# ------------------------------------------------------------------------- the balance loss


def test_balance_is_switchs_loss_pooled_over_layers():
    """E * sum_e f_e P_e with f (top-k assignments per token) and P (mean probability) pooled over
    layers, as transformers' load_balancing_loss_func; balanced routing gives k."""
    E, N = 4, 6
    probs = [torch.softmax(torch.randn(N, E, generator=torch.Generator().manual_seed(s)), -1) for s in (0, 1)]
    counts = [torch.bincount(p.topk(2, -1).indices.reshape(-1), minlength=E).float() for p in probs]
    out = balance([(c, p.sum(0)) for c, p in zip(counts, probs)], N)
    f = (counts[0] + counts[1]) / (2 * N)
    P = (probs[0].sum(0) + probs[1].sum(0)) / (2 * N)
    torch.testing.assert_close(out["moe_aux_loss"], E * (f * P).sum())
    assert torch.equal(out["expert_counts"], torch.stack(counts))
    per_layer = sum(E * (c / N * p.mean(0)).sum() for c, p in zip(counts, probs)) / 2  # not what is pooled
    assert abs(float(out["moe_aux_loss"] - per_layer)) > 1e-4
    even = balance([(torch.full((E,), 2.0 * N / E), torch.full((E,), N / E))], N)  # uniform router, top-2
    assert float(even["moe_aux_loss"]) == pytest.approx(2.0)
    assert balance([], N) == {}


def test_forward_returns_aux_only_when_asked(make_lm):
    moe, dense = make_lm(moe=True, **LLAMA), make_lm(**LLAMA)
    idx = tokens(2, 8)
    assert len(moe(idx)) == 2 and len(moe(idx, idx, aux=True)) == 3
    assert dense(idx, aux=True)[2] == {}
    logits, loss, aux = moe(idx, idx, aux=True)
    assert aux["expert_counts"].shape == (2, 8) and torch.all(aux["expert_counts"].sum(-1) == 2 * 16)
    torch.testing.assert_close(moe(idx, idx)[1], loss, atol=0, rtol=0)  # the CE is the same either way
    aux["moe_aux_loss"].backward()  # through P only: the routers and what feeds them (earlier layers)
    reached = {n for n, p in moe.named_parameters() if p.grad is not None and p.grad.abs().max() > 0}
    assert {"blocks.0.ffn.router.weight", "blocks.1.ffn.router.weight", "blocks.0.ffn.up.weight"} <= reached
    assert not reached & {"blocks.1.ffn.up.weight", "blocks.1.ffn.down.weight", "final_norm.weight", "head.weight"}


# ------------------------------------------------------------------------- training and the summary


def test_training_loss_is_ce_plus_coef_times_balance_and_eval_is_ce(tmp_path):
    coef = 0.5
    tr = trainer(tmp_path, "moe", {**LLAMA, "moe": True}, moe_aux_loss=coef, z_loss=0.01)
    x, y = tr.sampler.next()
    total, ce, terms = tr.losses(x, y)
    logits, ref_ce, aux = tr.model(x, y, aux=True)
    z = 0.01 * logits.logsumexp(-1).square().mean()
    torch.testing.assert_close(ce, ref_ce)
    torch.testing.assert_close(terms["moe_aux_loss"], aux["moe_aux_loss"])
    torch.testing.assert_close(total, ref_ce + z + coef * aux["moe_aux_loss"])
    assert set(terms) == {"z_loss", "moe_aux_loss"} and float(terms["moe_aux_loss"].detach()) > 1.5  # ~k = 2
    with torch.no_grad():  # validation is the plain cross-entropy
        ref_val = sum(float(tr.model(vx, vy)[1]) for vx, vy in tr.val) / len(tr.val)
    assert tr.evaluate() == pytest.approx(ref_val, rel=1e-6)


def test_the_balance_term_moves_the_routers_gradient(tmp_path):
    grads = {}
    for coef in (0.0, 1.0):
        tr = trainer(tmp_path, f"c{coef}", {**LLAMA, "moe": True}, moe_aux_loss=coef)
        x, y = tr.sampler.next()
        tr.losses(x, y)[0].backward()
        grads[coef] = {n: p.grad.clone() for n, p in tr.model.named_parameters()}
    router = "blocks.0.ffn.router.weight"
    assert (grads[1.0][router] - grads[0.0][router]).abs().max() > 1e-4
    for name in ("head.weight", "blocks.1.ffn.down.weight"):  # nothing after the last router moves
        torch.testing.assert_close(grads[1.0][name], grads[0.0][name], atol=0, rtol=0)


def test_same_seed_same_training_losses(tmp_path):
    moe = {**LLAMA, "moe": True, "moe_shared": True}
    a, b = (train_losses(trainer(tmp_path, name, moe)) for name in "ab")
    dense = train_losses(trainer(tmp_path, "dense", LLAMA))
    assert a == b and a != dense and all(math.isfinite(v) for v in a)


def test_a_moe_run_records_its_metrics_and_routing(tmp_path):
    corpus = write_corpus(tmp_path)
    cfgs = {name: validate(RunConfig, {"model": {**TINY_MODEL, **LLAMA, **model}, "data": {"source": str(corpus)},
                                       "train": {**TINY_TRAIN, "sample_len": 0, "device": "cpu"}})
            for name, model in (("dense", {}), ("moe", {"moe": True, "moe_experts": 4}))}
    summaries = {name: train(cfg, tmp_path / name) for name, cfg in cfgs.items()}
    moe, dense = summaries["moe"], summaries["dense"]
    assert moe["status"] == runs.COMPLETED and moe["label"] == "llama+moe"
    assert moe["params"] == cfgs["moe"].model.model_copy(update={"vocab_size": moe_vocab(tmp_path)}).num_params()
    assert moe["active_params"] < moe["params"] and dense["active_params"] == dense["params"]
    load = moe["expert_load"]
    assert len(load) == 2 and all(len(row) == 4 for row in load)  # [layer][expert]
    assert all(sum(row) == pytest.approx(1.0) for row in load) and "expert_load" not in dense
    assert runs.read_summary(tmp_path / "moe")["expert_load"] == load
    rows = [r for r in runs.read_metrics(tmp_path / "moe") if "train_loss" in r]
    assert rows and all(r["moe_aux_loss"] >= 1.0 for r in rows)  # >= 1 for top-2 of 4 (k when balanced)
    assert not any("moe_aux_loss" in r for r in runs.read_metrics(tmp_path / "dense"))
    if tb_events.available():  # the balance loss is a TensorBoard scalar too
        from tests.training.test_tensorboard import read_events

        tb = [e.value for e in read_events(tmp_path / "moe").Scalars("loss/moe_aux")]
        assert tb == pytest.approx([r["moe_aux_loss"] for r in rows])
    # the report: both counts in the runs table, and the routing figure for the MoE run only
    paths = write.write_report(build_report(tmp_path), formats=("md", "json"))
    assert write.expert_loads(frames.load_runs(tmp_path)[0]) == [("llama+moe · seed 1337", load)]
    assert paths["expert-load.png"].stat().st_size > 10_000
    md = paths["report.md"].read_text()
    assert "## Routing" in md and "expert-load.png" in md
    row = next(line for line in md.splitlines() if line.startswith("| moe "))
    assert [c.strip() for c in row.split("|")][5:7] == [f"{moe['params']:,}", f"{moe['active_params']:,}"]
    table = {r["run_id"]: r for r in json.loads(paths["report.json"].read_text())["runs"]}
    assert table["moe"]["active_params"] == moe["active_params"] and table["dense"]["active_params"] == dense["params"]


def moe_vocab(tmp_path) -> int:
    return json.loads((tmp_path / "moe" / runs.CONFIG).read_text())["model"]["vocab_size"]


@pytest.mark.parametrize("bad", [[0.5, 0.5], [[0.5, "x"]], [[0.5], [0.2, 0.8]], [], "load"])
def test_a_malformed_expert_load_is_a_corrupt_summary(tmp_path, bad):
    (tmp_path / runs.SUMMARY).write_text(json.dumps({"status": "completed", "expert_load": bad}))
    with pytest.raises(runs.RunError, match="expert_load"):
        runs.read_summary(tmp_path)


# ------------------------------------------------------------------------- Hugging Face parity


def hf_model(cfg: ModelConfig, shared: bool):
    """Qwen3MoeForCausalLM (QK-norm, no shared expert) or Qwen2MoeForCausalLM (gated shared expert)
    of anatomy's sizes, every layer MoE, top-k weights renormalised, the reference expert loop."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    transformers = pytest.importorskip("transformers")
    common = dict(vocab_size=cfg.vocab_size, hidden_size=cfg.d_model, intermediate_size=cfg.ffn_hidden,
                  num_hidden_layers=cfg.n_layer, num_attention_heads=cfg.n_head, num_key_value_heads=cfg.n_kv_head,
                  head_dim=cfg.head_dim, rms_norm_eps=cfg.norm_eps, max_position_embeddings=cfg.ctx_len,
                  rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_base}, tie_word_embeddings=False,
                  moe_intermediate_size=cfg.moe_expert_hidden, num_experts=cfg.moe_experts,
                  num_experts_per_tok=cfg.moe_top_k, norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[],
                  use_sliding_window=False, attn_implementation="eager", experts_implementation="eager")
    if shared:
        hc = transformers.Qwen2MoeConfig(**common, shared_expert_intermediate_size=cfg.moe_expert_hidden,
                                         qkv_bias=False)
        return transformers.Qwen2MoeForCausalLM(hc).eval()
    return transformers.Qwen3MoeForCausalLM(transformers.Qwen3MoeConfig(**common)).eval()


def moe_renames(shared: bool) -> dict[str, str]:
    """anatomy's MoE weights -> the HF sparse MoE block's."""
    out = {"router.weight": "gate.weight", "up.weight": "experts.gate_up_proj", "down.weight": "experts.down_proj"}
    if shared:
        out |= {f"shared.{m}.weight": f"shared_expert.{m}_proj.weight" for m in ("gate", "up", "down")}
        out["shared_gate.weight"] = "shared_expert_gate.weight"
    return out


def hf_state(model: LM, shared: bool) -> dict[str, torch.Tensor]:
    cfg, sd = model.cfg, model.state_dict()
    q, kv = cfg.n_head * cfg.head_dim, cfg.n_kv_head * cfg.head_dim
    out = {"model.embed_tokens.weight": sd["tok.weight"], "model.norm.weight": sd["final_norm.weight"],
           "lm_head.weight": sd["head.weight"]}
    for i in range(cfg.n_layer):
        a, o = f"blocks.{i}.", f"model.layers.{i}."
        qkv = sd[a + "attn.qkv.weight"].split([q, kv, kv])
        out |= dict(zip((o + f"self_attn.{p}_proj.weight" for p in "qkv"), qkv))
        out |= {o + "self_attn.o_proj.weight": sd[a + "attn.out.weight"],
                o + "input_layernorm.weight": sd[a + "norm1.weight"],
                o + "post_attention_layernorm.weight": sd[a + "norm2.weight"]}
        if cfg.qk_norm:
            out |= {o + f"self_attn.{p}_norm.weight": sd[a + f"attn.{p}_norm.weight"] for p in "qk"}
        out |= {o + "mlp." + theirs: sd[a + "ffn." + ours] for ours, theirs in moe_renames(shared).items()}
    return out


def parity_pair(shared: bool):
    """A scrambled anatomy LLaMA-end MoE (QK-norm for Qwen3) and the HF model holding its weights."""
    cfg = ModelConfig(vocab_size=61, d_model=32, n_layer=2, n_head=4, n_kv_head=2, ctx_len=24, norm_type="rmsnorm",
                      norm_pos="pre", pos_type="rope", ffn_type="swiglu", qk_norm=not shared, moe=True,
                      moe_shared=shared, rope_base=500.0, norm_eps=1e-5)  # base and eps off both defaults
    torch.manual_seed(0)
    model = scramble(LM(cfg)).eval()
    hf = hf_model(cfg, shared)
    hf.load_state_dict(hf_state(model, shared), strict=True)
    return model, hf


@pytest.mark.parametrize("shared", [False, True], ids=["qwen3-moe", "qwen2-moe-shared"])
def test_logits_and_balance_loss_match_hugging_face(shared):
    model, hf = parity_pair(shared)
    idx = tokens(3, 20, vocab=61)
    with torch.no_grad():
        ours, _, aux = model(idx, aux=True)
        theirs = hf(idx, output_router_logits=True)
    assert (ours - theirs.logits).abs().max() <= 1e-4
    torch.testing.assert_close(aux["moe_aux_loss"], theirs.aux_loss, atol=1e-6, rtol=1e-6)
    assert float(aux["moe_aux_loss"]) > 2.0  # scrambled routers are unbalanced: the test sees f and P


@pytest.mark.parametrize("shared", [False, True], ids=["qwen3-moe", "qwen2-moe-shared"])
def test_moe_layer_matches_hugging_face_in_float64(shared):
    """The MoE layer alone in fp64 (HF's decoder layers norm in fp32 even in fp64, so the whole model
    cannot show this): only summation order differs. The router's softmax is fp32 on both sides."""
    model, hf = parity_pair(shared)
    ours, theirs = model.blocks[1].ffn.double(), hf.model.layers[1].mlp.double()
    x = torch.randn(3, 20, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        assert (ours(x) - theirs(x)).abs().max() <= 1e-12

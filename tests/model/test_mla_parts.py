"""Attention sinks (sinks) and the gated attention output (gattn) on latent attention (mla) and DeepSeek
sparse attention (dsa, MLA plus the indexer): the sink in MLA's and DSA's softmax against an explicit
computation in fp64 (a sink left out of the denominator must fail it), the gate against its explicit
form, causality and cached decode == full forward (fp32 and fp64) for mla+sinks, mla+gate and
dsa+sinks+gate, sinks at zero init without random draws, the gate drawn as the other matrices, exact
parameter formulas, and `anatomy ablate --flip dsa,gattn,sinks` planned and trained end to end.
Neither part is in a published MLA model, so there is no Hugging Face reference here: MLA's and DSA's
own parity tests (test_mla.py, test_dsa.py) pin everything else, with both parts off."""

from __future__ import annotations

import json
import math
import warnings

import pytest
import torch
from helpers import LLAMA, invoke, scramble_with_sinks
from lm_checks import assert_causal, assert_decodes_like_full, tokens, train_losses, trainer
from toy_data import write_spec

from anatomy_cli.model import LM
from anatomy_cli.model import mla as mla_module
from anatomy_cli.model.attention import sink_attention, visible
from anatomy_cli.model.dsa import SparseLatentAttention, dsa_loss
from anatomy_cli.model.mla import LatentAttention
from anatomy_cli.spec.config import ModelConfig
from anatomy_cli.store import runs
from tests.model.test_mla import mla_params, scrambled

pytestmark = [pytest.mark.filterwarnings("error"), pytest.mark.usefixtures("single_thread")]

# toy sizes with every width distinct (test_mla.py's and test_dsa.py's), so a swapped split cannot line up
MLA = {"q_lora_rank": 24, "kv_lora_rank": 20, "qk_rope_head_dim": 6, "qk_nope_head_dim": 10, "v_head_dim": 12}
DSA = {"dsa": True, "dsa_top_k": 5, "dsa_index_heads": 3, "dsa_index_head_dim": 14}
T = 20  # longer than top_k: most dsa queries read 5 of their keys
PARTS = {"mla+sinks": {"attn_sinks": True}, "mla+gate": {"attn_gate": True},
         "mla+sinks+gate": {"attn_sinks": True, "attn_gate": True},
         "dsa+sinks+gate": {**DSA, "attn_sinks": True, "attn_gate": True}}
BASES = {"2017": {}, "llama": LLAMA}


def config(**overrides) -> ModelConfig:
    return ModelConfig(**{"vocab_size": 50, "d_model": 32, "n_layer": 2, "n_head": 4, "n_kv_head": 4, "ctx_len": 24,
                          "attn_type": "mla", **MLA, **overrides})


def model(seed: int = 0, **overrides) -> LM:
    """A scrambled LM: matrices at 1/sqrt(fan_in), vectors (norms, sinks) around 1, so every part shows."""
    torch.manual_seed(seed)
    return scrambled(LM(config(**overrides)), seed)


def layer(cls=LatentAttention, seed: int = 0, **overrides):
    """One scrambled layer in fp64 (RoPE over its rope dims), sinks spread around 0.5 (exp(sink) as large as
    a key's share, and some far below it)."""
    torch.manual_seed(seed)
    mod = cls(config(**{**LLAMA, **overrides})).double().eval()
    scramble_with_sinks(mod)
    return mod


def layer_input(seed: int = 1) -> torch.Tensor:
    return torch.randn(2, T, 32, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


# ------------------------------------------------------------------------- the sink and the gate, by hand


def by_hand(mod, x: torch.Tensor, read: torch.Tensor) -> torch.Tensor:
    """The layer's output written out: p[h, t, s] = exp(l[h, t, s]) / (exp(sink_h) + sum over the keys t reads
    of exp(l)), l = q.k / sqrt(n + p); y = sum_s p v_s (the sink takes no value); times sigmoid(x W_gate) per
    head and dim when gated; then `out`. read: bool [B, 1, T, S] or [T, S], the keys each query reads."""
    B, H, v_dim = x.shape[0], mod.n_head, mod.v_dim
    q, k, v, _, _ = mod.project(x, torch.arange(T), T)
    logits = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])  # [B, H, T, S]
    top = logits.masked_fill(~read, float("-inf")).amax(dim=-1, keepdim=True)
    if mod.sinks is not None:
        top = torch.maximum(top, mod.sinks.view(1, H, 1, 1))
    weights = torch.exp(logits - top).masked_fill(~read, 0.0)  # [B, H, T, S]
    denominator = weights.sum(dim=-1, keepdim=True)
    if mod.sinks is not None:
        denominator = denominator + torch.exp(mod.sinks.view(1, H, 1, 1) - top)
    y = ((weights / denominator) @ v).transpose(1, 2)  # [B, T, H, v]
    if mod.gate is not None:
        y = y * torch.sigmoid(x @ mod.gate.weight.T).view(B, T, H, v_dim)
    return mod.out(y.reshape(B, T, H * v_dim))


def dsa_read(mod, x: torch.Tensor) -> torch.Tensor:
    """The keys the indexer picks, bool [B, 1, T, T]."""
    q_latent = mod.project(x, torch.arange(T), T)[3]
    return mod.indexer(x, q_latent, torch.arange(T), T, mod.rope)


def sink_out_of_the_denominator(q, k, v, sinks, mask, scale=None):
    """A planted mistake: the sink's logit at -inf, so it never joins the softmax (plain attention)."""
    return sink_attention(q, k, v, torch.full_like(sinks, float("-inf")), mask, scale)


CASES = {"mla+sinks": (LatentAttention, {"attn_sinks": True}),
         "mla+sinks+gate": (LatentAttention, {"attn_sinks": True, "attn_gate": True}),
         "dsa+sinks": (SparseLatentAttention, {**DSA, "attn_sinks": True}),
         "dsa+sinks+gate": (SparseLatentAttention, {**DSA, "attn_sinks": True, "attn_gate": True})}


def hand_diff(case: str) -> float:
    cls, overrides = CASES[case]
    mod, x = layer(cls, **overrides), layer_input()
    read = dsa_read(mod, x) if cls is SparseLatentAttention else visible(0, T, T, 0, x.device)
    with torch.no_grad():
        return float((mod(x, torch.arange(T), T) - by_hand(mod, x, read)).abs().max())


@pytest.mark.parametrize("case", list(CASES))
def test_the_layer_equals_the_sink_and_gate_written_out(case):
    assert hand_diff(case) < 1e-12


@pytest.mark.parametrize("case", list(CASES))
def test_a_sink_out_of_the_denominator_fails_the_hand_check(case, monkeypatch):
    monkeypatch.setattr(mla_module, "sink_attention", sink_out_of_the_denominator)
    assert hand_diff(case) > 1e-3


def test_the_sparse_layer_reads_top_k_keys_so_the_sink_joins_a_smaller_softmax():
    """The hand check's dsa case is not dense: most queries read 5 of their keys, and reading all of them
    gives another output."""
    mod, x = layer(SparseLatentAttention, **DSA, attn_sinks=True), layer_input()
    read = dsa_read(mod, x)
    assert torch.equal(read.sum(-1).squeeze(1), torch.arange(1, T + 1).clamp(max=5).expand(2, T))
    with torch.no_grad():
        dense = by_hand(mod, x, visible(0, T, T, 0, x.device))
        assert (mod(x, torch.arange(T), T) - dense).abs().max() > 1e-3


def test_a_zero_gate_halves_the_ungated_output():
    """sigmoid(0) = 1/2 on every head and dim before the (linear) output projection."""
    gated, x = layer(attn_gate=True, attn_sinks=True), layer_input()
    plain = LatentAttention(config(**LLAMA, attn_sinks=True)).double().eval()
    plain.load_state_dict({k: v for k, v in gated.state_dict().items() if not k.startswith("gate.")})
    with torch.no_grad():
        gated.gate.weight.zero_()
        torch.testing.assert_close(gated(x, torch.arange(T), T), plain(x, torch.arange(T), T) / 2,
                                   atol=1e-14, rtol=0)


def test_sinks_take_their_share_and_no_value():
    """A sink far below every logit is no sink (dense MLA); a sink far above takes all the weight (output 0)."""
    mod, x = layer(attn_sinks=True), layer_input()
    plain = LatentAttention(config(**LLAMA)).double().eval()
    plain.load_state_dict({k: v for k, v in mod.state_dict().items() if k != "sinks"})
    with torch.no_grad():
        mod.sinks.fill_(-1e4)
        torch.testing.assert_close(mod(x, torch.arange(T), T), plain(x, torch.arange(T), T), atol=1e-12, rtol=0)
        mod.sinks.fill_(1e4)
        assert mod(x, torch.arange(T), T).abs().max() < 1e-12


def test_the_indexer_loss_weighs_heads_by_the_share_they_give_keys():
    """dsa_loss with sinks: the target is the attention's own probabilities (the sink's column dropped),
    head-summed and renormalised, written out here; a sink at -inf is the sinkless loss."""
    torch.manual_seed(0)
    B, H, S, dim = 2, 4, 7, 5
    q, k = torch.randn(B, H, S, dim, dtype=torch.float64), torch.randn(B, H, S, dim, dtype=torch.float64)
    index, sinks = torch.randn(B, S, S, dtype=torch.float64), torch.randn(H, dtype=torch.float64)
    read = visible(0, S, S, 0, "cpu").expand(B, 1, S, S)
    logits = (q @ k.transpose(-1, -2) * 0.3).masked_fill(~read, float("-inf"))
    a = logits.exp() / (logits.exp().sum(-1, keepdim=True) + sinks.exp().view(1, H, 1, 1))
    p = a.sum(1) / a.sum(1).sum(-1, keepdim=True)  # [B, S, S]
    log_q = index.masked_fill(~read[:, 0], float("-inf")).log_softmax(-1)
    want = torch.where(p > 0, p * (p.log() - log_q), 0.0).sum(-1).mean()
    torch.testing.assert_close(dsa_loss(q, k, read, index, 0.3, sinks), want, atol=1e-12, rtol=0)
    none = torch.full_like(sinks, float("-inf"))
    torch.testing.assert_close(dsa_loss(q, k, read, index, 0.3, none), dsa_loss(q, k, read, index, 0.3),
                               atol=1e-12, rtol=0)
    assert abs(float(dsa_loss(q, k, read, index, 0.3, sinks) - dsa_loss(q, k, read, index, 0.3))) > 1e-4


# ------------------------------------------------------------------------- causality, decode, training


@pytest.mark.parametrize("base", list(BASES))
@pytest.mark.parametrize("parts", ["mla+sinks", "mla+gate", "dsa+sinks+gate"])
def test_causal_and_cached_decode_equals_full_forward(base, parts):
    lm = model(**BASES[base], **PARTS[parts])
    assert_causal(lm, T=T)
    assert_decodes_like_full(lm, tokens(2, T, seed=1), [[6] + [1] * 14, [5, 3, 1, 4, 1, 2, 4], [1] * T])


def test_bf16_autocast_runs_the_sink_softmax_in_fp32():
    """Dense mla (under bf16 dsa's top-k may pick other keys on near-ties, and moves logits by more)."""
    lm, idx = model(**LLAMA, **PARTS["mla+sinks+gate"]), tokens(2, T)
    with torch.no_grad():
        ref = lm(idx)[0]
        with torch.autocast("cpu", dtype=torch.bfloat16), warnings.catch_warnings():
            warnings.filterwarnings("ignore", "Mismatch dtype between input and weight")  # MLA's latent RMSNorms
            y = lm(idx)[0]
    assert torch.isfinite(y).all()
    torch.testing.assert_close(y.float(), ref, atol=0.25, rtol=0.05)


def test_a_training_step_moves_the_sinks_and_the_gate_and_the_indexer_learns(tmp_path):
    tr = trainer(tmp_path, "run", {**LLAMA, "n_kv_head": 4, "attn_type": "mla", "attn_sinks": True,
                                   "attn_gate": True, "dsa": True}, dsa_indexer_loss=1.0)
    attn = tr.model.blocks[0].attn
    before = {n: p.detach().clone() for n, p in attn.named_parameters()}
    losses = train_losses(tr, 2)
    assert all(math.isfinite(v) for v in losses)
    for name in ("sinks", "gate.weight", "indexer.wq.weight"):
        assert not torch.equal(dict(attn.named_parameters())[name], before[name]), name


# ------------------------------------------------------------------------- init and parameters


@pytest.mark.parametrize("dsa", [False, True], ids=["mla", "dsa"])
def test_sinks_start_at_zero_and_draw_no_random_numbers(dsa):
    """The same seed gives the same weights with and without sinks; the sinks themselves are zeros."""
    extra = DSA if dsa else {}
    torch.manual_seed(3)
    off = LM(config(**extra)).state_dict()
    torch.manual_seed(3)
    on = LM(config(**extra, attn_sinks=True)).state_dict()
    assert set(on) - set(off) == {f"blocks.{i}.attn.sinks" for i in range(2)}
    assert all(torch.equal(off[name], on[name]) for name in off)
    assert all(not on[f"blocks.{i}.attn.sinks"].any() for i in range(2))


def test_the_gate_is_drawn_like_the_other_matrices():
    """reset_parameters draws it N(0, 0.02), no residual scaling (it is not an output projection)."""
    off = LM(config(d_model=64)).state_dict()
    on = LM(config(d_model=64, attn_gate=True)).state_dict()
    assert set(on) - set(off) == {f"blocks.{i}.attn.gate.weight" for i in range(2)}
    gate = torch.cat([on[f"blocks.{i}.attn.gate.weight"].flatten() for i in range(2)])
    assert gate.shape == (2 * 64 * 4 * 12,)
    assert abs(float(gate.std()) - 0.02) < 0.001 and abs(float(gate.mean())) < 0.001


def written_out(cfg: ModelConfig, sinks: bool, gate: bool, dsa: bool) -> int:
    """One mixer: MLA's (test_mla.mla_params), plus the gate d H v and the sinks H, plus the indexer's
    wq (r_q Hi D), wk (d D), LayerNorm (2 D) and w (d Hi)."""
    d, H, m = cfg.d_model, cfg.n_head, cfg.mla_dims
    total = mla_params(d, H, *m) + (d * H * m.v_head_dim if gate else 0) + (H if sinks else 0)
    if dsa:
        _, Hi, D = cfg.dsa_dims
        total += m.q_lora_rank * Hi * D + d * D + 2 * D + d * Hi
    return total


@pytest.mark.parametrize("base", list(BASES))
@pytest.mark.parametrize("sizes", ["given", "derived"])
@pytest.mark.parametrize("parts", list(PARTS))
def test_parameter_formulas_equal_the_modules(base, sizes, parts):
    overrides = {**BASES[base], **PARTS[parts]}
    cfg = config(**overrides) if sizes == "given" else config(**overrides, **dict.fromkeys(MLA))
    lm = LM(cfg)
    kind = "dsa" if cfg.dsa else "mla"
    want = written_out(cfg, cfg.attn_sinks, cfg.attn_gate, cfg.dsa)
    assert cfg.layer_kinds == (kind, kind)
    for block in lm.blocks:
        assert sum(p.numel() for p in block.attn.parameters()) == cfg.mixer_params(kind) == want
    assert lm.num_params() == cfg.num_params() == cfg.active_params()
    bare = config(**{**overrides, "attn_sinks": False, "attn_gate": False},
                  **({} if sizes == "given" else dict.fromkeys(MLA)))
    assert cfg.num_params() - bare.num_params() == 2 * (written_out(cfg, cfg.attn_sinks, cfg.attn_gate, False)
                                                        - written_out(cfg, False, False, False))


def test_the_terms_at_the_default_study_size():
    """d 128, 4 heads, v_head_dim 32: the gate is d x H v = 128 x 128 per layer, the sinks 4 numbers."""
    base = ModelConfig(vocab_size=1719, attn_type="mla", ctx_len=64)
    both = ModelConfig(**{**base.model_dump(), "attn_sinks": True, "attn_gate": True})
    assert both.mixer_params("mla") - base.mixer_params("mla") == 128 * 4 * 32 + 4
    assert both.num_params() - base.num_params() == base.n_layer * (128 * 128 + 4)
    assert both.state_bytes("mla", 2, 64, 4) == base.state_bytes("mla", 2, 64, 4)  # the cache is unchanged


def test_partial_rotary_is_still_refused_with_mla():
    from anatomy_cli.spec.config import ConfigError, validate

    with pytest.raises(ConfigError, match="rope_fraction is a setting of softmax attention"):
        validate(ModelConfig, {"pos_type": "rope", "attn_type": "mla", "rope_fraction": 0.5})
    for part in ({"attn_sinks": True}, {"attn_gate": True}, {**DSA, "attn_sinks": True, "attn_gate": True}):
        validate(ModelConfig, {"pos_type": "rope", "attn_type": "mla", "ctx_len": 24, **MLA, **part})


# ------------------------------------------------------------------------- the CLI


def test_ablate_plans_dsa_gattn_sinks(tmp_path, monkeypatch):
    """Issue 29's flip set on the default study: planned (every config valid), nothing created. --json:
    the same plan without the table's time estimates (those calibrate in a spawned worker)."""
    monkeypatch.chdir(tmp_path)  # not the checkout: the spec shipped with anatomy
    result = invoke("ablate", "--flip", "dsa,gattn,sinks", "--dry-run", "--json", "--runs-dir", tmp_path / "runs")
    assert result.exit_code == 0, result.output
    plan = json.loads(result.output)
    roles = {f"{r['role']}:{r['flip']}" if r["flip"] else r["role"]: r["config"]["model"] for r in plan["runs"]}
    assert {"reference", "all-on", "remove-one:sinks", "add-one:dsa"} <= set(roles)
    on = roles["all-on"]
    assert (on["attn_type"], on["dsa"], on["attn_sinks"], on["attn_gate"]) == ("mla", True, True, True)
    assert not (tmp_path / "runs").exists()


@pytest.mark.slow
@pytest.mark.process  # the plan's time estimates calibrate in a spawned worker (sweep/calibrate.py)
def test_ablate_dsa_gattn_sinks_trains_end_to_end(tmp_path):
    """A one-seed toy ablation of the three, trained in this process (--workers 1): 8 runs, all completed,
    the all-on end an mla model with dsa, sinks and the gate, its indexer loss recorded."""
    spec = write_spec(tmp_path, model=LLAMA, train={"steps": 6, "eval_interval": 3, "sample_len": 8})
    result = invoke("ablate", spec, "--flip", "dsa,gattn,sinks", "--workers", "1", "--seeds", "1",
                    "--runs-dir", tmp_path / "runs", "--no-report")
    assert result.exit_code == 0, result.output
    dirs = [d for d in (tmp_path / "runs" / "toy").iterdir() if (d / runs.SUMMARY).exists()]
    summaries = {d.name: runs.read_summary(d) for d in dirs}
    assert len(summaries) == 8 and all(s["status"] == runs.COMPLETED for s in summaries.values()), summaries
    all_on = next(d for d in dirs if d.name.startswith("all-on-s"))
    metrics = runs.read_metrics(all_on)
    assert all(math.isfinite(m["train_loss"]) and "dsa_indexer_loss" in m for m in metrics if "train_loss" in m)

"""The six post-LLaMA parts: QK-norm, tied embeddings, parallel blocks, z-loss, logit soft-capping, NoPE.

For each: its parameter delta against the same config without it, and one property that fails when
the part is wired wrong. References are written out here, in fp32, eval(). What every row of the
component table must satisfy (formula == module count, causality, cached decode, determinism, export)
is checked for these parts too, at both ends, in test_rows.py.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from lm_checks import tokens, trainer
from toy_data import TINY_MODEL, TINY_TRAIN, write_corpus

from anatomy_cli.model import LM
from anatomy_cli.model.attention import CausalSelfAttention
from anatomy_cli.model.positions import NoPositions, RoPE
from anatomy_cli.spec.config import ConfigError, ModelConfig, RunConfig, TrainConfig, validate
from anatomy_cli.spec.parts import REGISTRY, resolve
from anatomy_cli.store import runs
from anatomy_cli.training.checkpoint import load_weights, save_weights
from anatomy_cli.training.run import train
from anatomy_cli.training.trainer import Trainer

pytestmark = [pytest.mark.filterwarnings("error"), pytest.mark.usefixtures("single_thread")]

CAP = 1.0  # small enough that the scrambled toy models' logits (a few units) are really capped
# model-side parts as config overrides; zloss is a TrainConfig option and has no model override
PARTS = {
    "qknorm": {"qk_norm": True},
    "tied": {"tie_embeddings": True},
    "parallel": {"parallel_block": True},
    "softcap": {"logit_softcap": CAP},
    "nope": {"pos_type": "nope"},
}
BASES = {
    "2017": {},
    "llama": {"norm_type": "rmsnorm", "norm_pos": "pre", "pos_type": "rope", "ffn_type": "swiglu", "n_kv_head": 2},
}
MODEL_PART = pytest.mark.parametrize("part", list(PARTS))
BASE = pytest.mark.parametrize("base", list(BASES))


# ------------------------------------------------------------------------- parameter counts


def expected_delta(part: str, cfg: ModelConfig) -> int:
    """Parameters the part adds (negative: removes) against the same config without it."""
    d, L, V = cfg.d_model, cfg.n_layer, cfg.vocab_size
    norm = d * (2 if cfg.norm_type == "layernorm" else 1)
    return {
        "qknorm": 2 * cfg.head_dim * L,  # one head_dim weight for Q and one for K per layer
        "tied": -V * d,  # the head matrix is the embedding
        "parallel": -norm * L,  # one norm per block instead of two
        "softcap": 0,
        "nope": 0,  # against the base's own pos_type; see test_nope_has_no_position_parameters
    }[part]


@MODEL_PART
@BASE
def test_param_count_exact_and_delta(part, base):
    overrides = {**BASES[base], "vocab_size": 67, "d_model": 64, "ctx_len": 24}
    without = ModelConfig(**{**overrides, **({"pos_type": "rope"} if part == "nope" else {})})
    with_part = ModelConfig(**{**overrides, **PARTS[part]})
    assert with_part.num_params() - without.num_params() == expected_delta(part, with_part)


def test_zloss_changes_no_parameter_and_no_flop():
    a = RunConfig(model={"vocab_size": 50})
    b = RunConfig(model={"vocab_size": 50}, train={"z_loss": 1e-4})
    assert a.model == b.model and a.model.num_params() == b.model.num_params()


def test_nope_has_no_position_parameters():
    cfg = ModelConfig(vocab_size=50, d_model=32, n_layer=2, ctx_len=24, pos_type="nope")
    model = LM(cfg)
    assert isinstance(model.positions, NoPositions) and resolve(REGISTRY["nope"].build) is NoPositions
    assert not list(model.positions.parameters()) and not list(model.positions.buffers())
    assert not [k for k in model.state_dict() if k.startswith("positions.")]
    learned = ModelConfig(**{**cfg.model_dump(), "pos_type": "learned"})
    assert learned.num_params() - cfg.num_params() == 24 * 32


@pytest.mark.parametrize("tied", [False, True])
def test_flops_count_the_head_matmul_tied_or_not(tied):
    cfg = ModelConfig(vocab_size=50, d_model=32, n_layer=2, ctx_len=24, tie_embeddings=tied)
    blocks = sum(p.numel() for p in LM(cfg).blocks.parameters())
    head, attn_scores = 50 * 32, 2 * 24 * 32  # the head matmul is done either way; lookups are free
    assert cfg.flops_per_token() == 6 * (blocks + head) + 6 * attn_scores


# ------------------------------------------------------------------------- validation


def test_bad_settings_are_refused():
    with pytest.raises(ConfigError, match="logit_softcap"):
        validate(ModelConfig, {"logit_softcap": -1.0})
    with pytest.raises(ConfigError, match="z_loss"):
        validate(TrainConfig, {"z_loss": -1e-4})
    with pytest.raises(ConfigError, match="rope_variant='q_only' needs pos_type='rope'"):
        validate(ModelConfig, {"pos_type": "nope", "rope_variant": "q_only"})
    with pytest.raises(ConfigError, match="pos_type"):
        validate(ModelConfig, {"pos_type": "alibi"})
    # odd head_dim: fine without RoPE
    assert ModelConfig(pos_type="nope", d_model=30, n_head=10, n_kv_head=10).head_dim == 3


def test_defaults_are_off():
    cfg = ModelConfig()
    assert (cfg.qk_norm, cfg.tie_embeddings, cfg.parallel_block, cfg.logit_softcap) == (False, False, False, 0.0)
    assert TrainConfig().z_loss == 0.0 and cfg.pos_type == "learned"


# ------------------------------------------------------------------------- qk-norm


def ref_rope(x: torch.Tensor, pos: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
    """Half-split RoPE with an explicit 2x2 rotation per pair (i, i + hd/2), in float64."""
    hd = x.shape[-1]
    half = hd // 2
    theta = torch.tensor([base ** (-2 * i / hd) for i in range(half)], dtype=torch.float64)
    ang = pos.double()[:, None] * theta  # [T, half]
    cos, sin = ang.cos(), ang.sin()
    a, b = x[..., :half].double(), x[..., half:].double()
    return torch.cat((a * cos - b * sin, a * sin + b * cos), dim=-1).float()


def qknorm_attention(seed: int = 0):
    torch.manual_seed(seed)
    cfg = ModelConfig(vocab_size=50, d_model=64, n_head=4, n_kv_head=2, pos_type="rope", qk_norm=True,
                      norm_eps=1e-5)
    attn = CausalSelfAttention(cfg).eval()
    with torch.no_grad():
        for p in attn.parameters():  # matrices 1/sqrt(fan_in); the two hd-sized norm weights around 1
            p.normal_(0, 1 / math.sqrt(p.shape[-1])) if p.dim() == 2 else p.normal_(1.0, 0.3)
    return cfg, attn


def manual_qknorm_attention(attn, x: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    """Project, RMS-normalise every head's q and k over hd (then x w), RoPE, causal softmax, GQA."""
    B, T, _ = x.shape
    H, G, hd = 4, 2, 16
    W = attn.qkv.weight
    q = (x @ W[: H * hd].T).view(B, T, H, hd).transpose(1, 2)
    k = (x @ W[H * hd : (H + G) * hd].T).view(B, T, G, hd).transpose(1, 2)
    v = (x @ W[(H + G) * hd :].T).view(B, T, G, hd).transpose(1, 2)
    q = q / torch.sqrt(q.pow(2).mean(-1, keepdim=True) + eps) * attn.q_norm.weight
    k = k / torch.sqrt(k.pow(2).mean(-1, keepdim=True) + eps) * attn.k_norm.weight
    pos = torch.arange(T)
    q, k = ref_rope(q, pos), ref_rope(k, pos)  # after the norm
    k, v = k.repeat_interleave(H // G, dim=1), v.repeat_interleave(H // G, dim=1)
    s = q @ k.transpose(-1, -2) / math.sqrt(hd)
    s = s.masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool), 1), float("-inf"))
    y = torch.softmax(s, dim=-1) @ v
    return y.transpose(1, 2).reshape(B, T, H * hd) @ attn.out.weight.T


def test_qknorm_equals_manual_attention():
    cfg, attn = qknorm_attention()
    assert attn.q_norm.weight.shape == attn.k_norm.weight.shape == (16,)  # head_dim, shared by heads
    x = torch.randn(2, 10, 64, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ours = attn(x, torch.arange(10), 10, RoPE(cfg).rotate)
        torch.testing.assert_close(ours, manual_qknorm_attention(attn, x), atol=1e-5, rtol=1e-5)


def test_qknorm_makes_attention_blind_to_qk_scale(make_lm):
    """Scaling W_q by 10 and W_k by 3 in every layer changes nothing once Q and K are RMS-normalised."""
    model = make_lm(qk_norm=True, **BASES["llama"])
    idx = tokens(2, 12)
    with torch.no_grad():
        ref, _ = model(idx)
        for block in model.blocks:
            W, H, G, hd = block.attn.qkv.weight, 4, 2, 8
            W[: H * hd] *= 10.0
            W[H * hd : (H + G) * hd] *= 3.0
        scaled, _ = model(idx)
    torch.testing.assert_close(scaled, ref, atol=1e-4, rtol=1e-4)


def test_qknorm_normalises_k_before_the_cache(make_lm):
    """With unit norm weights every cached key has RMS 1 over head_dim (RoPE keeps the norm)."""
    model = make_lm(pos_type="rope", n_kv_head=2, qk_norm=True)
    with torch.no_grad():
        for block in model.blocks:
            block.attn.k_norm.weight.fill_(1.0)
    cache = model.new_cache(2, 10)
    with torch.no_grad():
        model(tokens(2, 10), cache=cache)
    for k in (state.k for state in cache.states):  # [B, G, T, hd]
        rms = k.pow(2).mean(-1).sqrt()
        torch.testing.assert_close(rms, torch.ones_like(rms), atol=1e-3, rtol=0)


# ------------------------------------------------------------------------- tied embeddings


def test_tied_head_is_the_embedding_and_one_step_moves_both(make_config):
    torch.manual_seed(0)
    model = LM(make_config(tie_embeddings=True))
    assert model.head.weight is model.tok.weight
    assert [n for n, _ in model.named_parameters()].count("tok.weight") == 1
    assert "head.weight" not in dict(model.named_parameters())
    before = model.tok.weight.detach().clone()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    idx = tokens(2, 8)
    _, loss = model(idx, tokens(2, 8, seed=1))
    loss.backward()
    opt.step()
    assert (model.tok.weight - before).abs().max() > 0
    assert model.head.weight is model.tok.weight  # still one tensor after the step


def test_tied_gradient_is_the_sum_of_both_uses(make_lm):
    """The tied matrix's gradient = the untied embedding's + the untied head's, at the same values."""
    tied = make_lm(tie_embeddings=True).train()
    untied = make_lm().train()
    state = tied.state_dict()  # holds tok.weight and head.weight: the same tensor twice
    untied.load_state_dict(state)
    idx, targets = tokens(2, 8), tokens(2, 8, seed=1)
    for m in (tied, untied):
        _, loss = m(idx, targets)
        loss.backward()
    torch.testing.assert_close(tied.tok.weight.grad, untied.tok.weight.grad + untied.head.weight.grad,
                               atol=1e-6, rtol=1e-5)
    assert untied.head.weight.grad.abs().max() > 1e-4 and untied.tok.weight.grad.abs().max() > 1e-4


def test_tied_init_draws_once_and_untied_init_is_unchanged(make_config):
    def weights(**kw):
        torch.manual_seed(0)
        return LM(make_config(**kw)).state_dict()

    untied, tied = weights(), weights(tie_embeddings=True)
    assert tied["head.weight"] is tied["tok.weight"] or torch.equal(tied["head.weight"], tied["tok.weight"])
    assert 0.015 < float(tied["tok.weight"].std()) < 0.025  # N(0, 0.02), drawn once
    # the head is drawn last, so every other tensor comes from the same stream as the untied model's
    assert all(torch.equal(untied[name], tied[name]) for name in untied if name != "head.weight")


def test_tied_weights_save_and_load(tmp_path, make_lm):
    model = make_lm(tie_embeddings=True)
    save_weights(model, tmp_path / "w.safetensors")
    back = make_lm(seed=1, tie_embeddings=True)
    load_weights(back, tmp_path / "w.safetensors")
    assert back.head.weight is back.tok.weight and torch.equal(back.tok.weight, model.tok.weight)
    idx = tokens(1, 8)
    with torch.no_grad():
        torch.testing.assert_close(back(idx)[0], model(idx)[0], atol=0, rtol=0)


# ------------------------------------------------------------------------- parallel block


@pytest.mark.parametrize("norm_pos", ["pre", "post"])
def test_parallel_block_equals_the_formula(make_lm, norm_pos):
    model = make_lm(parallel_block=True, norm_pos=norm_pos, pos_type="rope", norm_type="rmsnorm")
    block = model.blocks[0]
    assert isinstance(block.norm2, torch.nn.Identity)  # one norm per block
    x = torch.randn(2, 9, 32, generator=torch.Generator().manual_seed(2))
    pos, rotate = torch.arange(9), model.positions.rotate
    n1, attn, ffn = block.norm1, block.attn, block.ffn
    with torch.no_grad():
        ours = block(x, pos, 9, rotate)
        if norm_pos == "pre":  # x + attn(n1(x)) + ffn(n1(x))
            ref = x + attn(n1(x), pos, 9, rotate) + ffn(n1(x))
        else:  # n1(x + attn(x) + ffn(x))
            ref = n1(x + attn(x, pos, 9, rotate) + ffn(x))
        # the serial block's wiring (ffn reads the attention output) gives something else
        h = x + attn(n1(x), pos, 9, rotate) if norm_pos == "pre" else n1(x + attn(x, pos, 9, rotate))
        serial = h + ffn(h) if norm_pos == "pre" else n1(h + ffn(h))
    torch.testing.assert_close(ours, ref, atol=1e-6, rtol=1e-6)
    assert (ours - serial).abs().max() > 1e-2


# ------------------------------------------------------------------------- z-loss


def test_zloss_is_added_to_the_training_loss_only(tmp_path):
    coef = 0.05
    tr = trainer(tmp_path, "z", z_loss=coef)
    x, y = tr.sampler.next()
    with torch.no_grad():
        total, ce, terms = tr.losses(x, y)
        logits, _ = tr.model(x)
    z = terms["z_loss"]
    ref_ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
    ref_z = coef * torch.logsumexp(logits, dim=-1).pow(2).mean()
    torch.testing.assert_close(ce, ref_ce)
    torch.testing.assert_close(z, ref_z)
    torch.testing.assert_close(total, ref_ce + ref_z)
    assert float(z) > 1e-2  # large enough to matter
    # evaluation is the plain cross-entropy
    with torch.no_grad():
        ref_val = sum(float(F.cross_entropy(tr.model(vx)[0].reshape(-1, logits.shape[-1]), vy.reshape(-1)))
                      for vx, vy in tr.val) / len(tr.val)
    assert tr.evaluate() == pytest.approx(ref_val, rel=1e-6)
    # the zero setting keeps the loss untouched
    tr0 = trainer(tmp_path, "plain")
    total0, ce0, terms0 = tr0.losses(x, y)
    assert terms0 == {} and total0 is ce0


def grads_at_first_step(tr: Trainer) -> dict[str, torch.Tensor]:
    """The gradients the optimizer sees at train_step (recorded just before opt.step)."""
    seen, step = {}, tr.opt.step

    def spy(*args, **kwargs):
        seen.update({n: p.grad.clone() for n, p in tr.model.named_parameters()})
        return step(*args, **kwargs)

    tr.opt.step = spy
    tr.train_step()
    return seen


def test_train_step_minimises_cross_entropy_plus_z(tmp_path):
    coef = 0.5
    seen = grads_at_first_step(trainer(tmp_path, "z", z_loss=coef, grad_clip=0))
    ref = trainer(tmp_path, "ref", grad_clip=0)  # same seed: same init, same first batch
    x, y = ref.sampler.next()
    logits, ce = ref.model(x, y)
    (ce + coef * logits.logsumexp(-1).pow(2).mean()).backward()
    for name, p in ref.model.named_parameters():
        torch.testing.assert_close(seen[name], p.grad, atol=1e-6, rtol=1e-5, msg=name)
    plain = grads_at_first_step(trainer(tmp_path, "plain", grad_clip=0))
    assert (plain["tok.weight"] - seen["tok.weight"]).abs().max() > 1e-5  # the z term is in there


def test_zloss_metrics_keep_train_loss_as_cross_entropy(tmp_path):
    corpus = write_corpus(tmp_path)
    cfgs = {name: validate(RunConfig, {"model": TINY_MODEL, "data": {"source": str(corpus)},
                                       "train": {**TINY_TRAIN, "sample_len": 0, "steps": 4, "eval_interval": 4,
                                                 "device": "cpu", "z_loss": z}})
            for name, z in (("plain", 0.0), ("z", 0.1))}
    rows = {}
    for name, cfg in cfgs.items():
        assert train(cfg, tmp_path / name)["status"] == runs.COMPLETED
        rows[name] = [r for r in runs.read_metrics(tmp_path / name) if "train_loss" in r]
    assert len(rows["z"]) == 4 and all("z_loss" in r for r in rows["z"])
    assert not any("z_loss" in r for r in rows["plain"])
    assert all(r["z_loss"] > 0 for r in rows["z"])
    # step 1 runs on the same init and batch, so its cross-entropy is the plain run's
    assert rows["z"][0]["train_loss"] == rows["plain"][0]["train_loss"]


# ------------------------------------------------------------------------- logit soft-capping


@pytest.mark.parametrize("vocab", [50, 64])  # padded to 64 columns; already a multiple of 64
def test_softcap_bounds_logits_and_keeps_padding_out(make_lm, vocab):
    capped = make_lm(vocab_size=vocab, logit_softcap=CAP).train()
    raw = make_lm(vocab_size=vocab).train()  # same seed: the same weights, no cap
    idx, targets = tokens(2, 8, vocab=vocab), tokens(2, 8, seed=1, vocab=vocab)
    with torch.no_grad():
        raw_logits, _ = raw(idx)
        gen_logits, _ = capped(idx)  # the generation path (no targets)
    assert raw_logits.abs().max() > 2 * CAP  # the cap really bites
    assert gen_logits.abs().max() <= CAP
    torch.testing.assert_close(gen_logits, CAP * torch.tanh(raw_logits / CAP), atol=1e-6, rtol=1e-6)
    logits, loss = capped(idx, targets)  # the padded training/eval path
    ref = F.cross_entropy(CAP * torch.tanh(raw(idx)[0] / CAP).reshape(16, vocab), targets.reshape(16))
    torch.testing.assert_close(logits, gen_logits, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(loss, ref, atol=1e-6, rtol=1e-6)  # padded columns still get probability 0
    # and the gradients are the unpadded reference's
    loss.backward()
    plain = make_lm(vocab_size=vocab, logit_softcap=CAP).train()
    F.cross_entropy(plain(idx)[0].reshape(16, vocab), targets.reshape(16)).backward()
    for (name, p), q in zip(capped.named_parameters(), plain.parameters()):
        torch.testing.assert_close(p.grad, q.grad, atol=1e-6, rtol=1e-5, msg=name)


# ------------------------------------------------------------------------- NoPE


@BASE
def test_nope_output_does_not_depend_on_absolute_position(make_lm, base):
    model = make_lm(**{**BASES[base], "pos_type": "nope"})
    idx = tokens(2, 10)
    with torch.no_grad():
        at0, _ = model(idx)
        at5, _ = model(idx, pos=torch.arange(5, 15))
        cache = model.new_cache(2, 10)  # cached at positions 5..14 via explicit pos, then one more
        model(idx[:, :9], cache=cache, pos=torch.arange(5, 14))
        step, _ = model(idx[:, 9:], cache=cache, pos=torch.tensor([14]))
    torch.testing.assert_close(at5, at0, atol=0, rtol=0)
    torch.testing.assert_close(step[:, -1], at0[:, -1], atol=1e-5, rtol=1e-5)
    learned = make_lm(**{**BASES[base], "pos_type": "learned"})  # the control: a table does depend on it
    with torch.no_grad():
        assert (learned(idx, pos=torch.arange(5, 15))[0] - learned(idx)[0]).abs().max() > 1e-2


def test_nope_runs_past_ctx_len(make_lm):
    model = make_lm(pos_type="nope", ctx_len=12)
    idx = tokens(2, 36)
    with torch.no_grad():
        logits, _ = model(idx)
        head, _ = model(idx[:, :12])
    assert logits.shape == (2, 36, 50) and torch.isfinite(logits).all()
    torch.testing.assert_close(logits[:, :12], head, atol=1e-5, rtol=1e-5)


def test_nope_samples_and_decodes_past_ctx_len(make_lm):
    from anatomy_cli.exams.decode import decode_lengths
    from anatomy_cli.exams.lengths import length_problem
    from anatomy_cli.model.generate import generate

    model = make_lm(pos_type="nope", ctx_len=8)
    cfg = model.cfg
    assert length_problem(cfg, 32, 1000) is None  # evaluated past ctx_len, like RoPE
    assert decode_lengths(cfg, 20, 20) == (20, 20, None)  # no cap at ctx_len
    out = list(generate(model, [1, 2, 3], 20, temp=0, window=24))  # a window past ctx_len is allowed
    assert out == list(generate(model, [1, 2, 3], 20, temp=0, window=24, use_cache=False))

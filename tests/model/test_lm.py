"""The model's math at toy sizes: parameter counts, RoPE, norms, GQA, causality, position limits.

Every reference here is written independently of the code under test (explicit pair rotations,
manual softmax attention, the norm formulas), in fp32 with eval() and no_grad.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from helpers import LLAMA
from lm_checks import assert_causal
from pydantic import ValidationError
from torch import nn

from anatomy_cli.model import LM
from anatomy_cli.model.attention import CausalSelfAttention
from anatomy_cli.model.norms import LayerNorm, RMSNorm
from anatomy_cli.model.positions import LearnedPositions, PositionError, RoPE, turn_half
from anatomy_cli.spec.components import label
from anatomy_cli.spec.config import ConfigError, ModelConfig, validate

pytestmark = [pytest.mark.filterwarnings("error"), pytest.mark.usefixtures("single_thread")]


# ------------------------------------------------------------------------- parameter counts


def test_param_count_2017_exact():
    cfg = ModelConfig(vocab_size=1719, d_model=128, n_layer=4, n_head=4, ctx_len=128)
    assert label(cfg) == "2017"
    assert cfg.num_params() == 1_244_928
    assert LM(cfg).num_params() == 1_244_928


def test_param_count_llama_exact():
    cfg = ModelConfig(vocab_size=1719, d_model=128, n_layer=4, n_head=4, ctx_len=128, **LLAMA)
    assert label(cfg) == "llama"
    assert cfg.num_params() == 1_178_496
    assert LM(cfg).num_params() == 1_178_496


# the post-LLaMA parts (tests/model/test_modern.py), one at a time and all together
MODERN = [{}, {"qk_norm": True}, {"tie_embeddings": True}, {"parallel_block": True}, {"logit_softcap": 30.0},
          {"pos_type": "nope"},
          {"qk_norm": True, "tie_embeddings": True, "parallel_block": True, "logit_softcap": 30.0}]


@pytest.mark.parametrize("modern", MODERN, ids=lambda m: "+".join(m) or "none")
@pytest.mark.parametrize("n_kv_head", [4, 2])
def test_param_count_formula_matches_model(components, n_kv_head, modern):
    # d=64: SwiGLU hidden int(2/3*256)=170 -> 192, so the rounding is exercised too
    cfg = ModelConfig(vocab_size=67, d_model=64, n_layer=2, n_head=4, n_kv_head=n_kv_head, ctx_len=24,
                      **{**components, **modern})
    assert cfg.num_params() == LM(cfg).num_params()


def test_swiglu_hidden_is_two_thirds_rounded_to_32():
    cfg = ModelConfig(vocab_size=50, d_model=128, ffn_type="swiglu")
    assert int(2 / 3 * 512) == 341
    assert cfg.ffn_hidden == 352
    ffn = LM(cfg).blocks[0].ffn
    for name in ("gate", "up"):
        assert getattr(ffn, name).weight.shape == (352, 128)
    assert ffn.down.weight.shape == (128, 352)
    assert ModelConfig(vocab_size=50, d_model=128).ffn_hidden == 512  # GELU: 4d


def test_no_linear_has_a_bias(components):
    model = LM(ModelConfig(vocab_size=50, d_model=32, n_layer=2, n_kv_head=2, **components))
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    assert len(linears) == 2 * 2 + 1 + 2 * (3 if components["ffn_type"] == "swiglu" else 2)
    assert all(m.bias is None for m in linears)


def test_embedding_and_head_are_untied():
    model = LM(ModelConfig(vocab_size=50, d_model=32, n_layer=2))
    assert model.tok.weight is not model.head.weight
    assert model.tok.weight.data_ptr() != model.head.weight.data_ptr()
    with torch.no_grad():
        model.head.weight.zero_()
    assert model.tok.weight.abs().sum() > 0  # writing one leaves the other alone


@pytest.mark.parametrize("norm_type,cls", [("layernorm", LayerNorm), ("rmsnorm", RMSNorm)])
def test_final_norm_only_for_prenorm(norm_type, cls):
    pre = LM(ModelConfig(vocab_size=50, d_model=32, n_layer=2, norm_type=norm_type, norm_pos="pre"))
    post = LM(ModelConfig(vocab_size=50, d_model=32, n_layer=2, norm_type=norm_type, norm_pos="post"))
    assert isinstance(pre.final_norm, cls)
    assert isinstance(post.final_norm, nn.Identity)
    assert pre.num_params() - post.num_params() == 32 * (2 if norm_type == "layernorm" else 1)


# ------------------------------------------------------------------------------------ RoPE


def ref_rope(x: torch.Tensor, pos: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
    """Independent half-split RoPE: rotate each pair (x_i, x_{i+hd/2}) by pos * base^(-2i/hd).

    x: [B, H, T, hd]; pos: [T] or [B, T]. Computed in float64 with an explicit 2x2 rotation.
    """
    hd = x.shape[-1]
    half = hd // 2
    theta = torch.tensor([base ** (-2 * i / hd) for i in range(half)], dtype=torch.float64)
    ang = pos.double()[..., None] * theta  # [T, half] or [B, T, half]
    if pos.dim() == 2:
        ang = ang[:, None]  # [B, 1, T, half]: same angle for every head
    cos, sin = ang.cos(), ang.sin()
    a, b = x[..., :half].double(), x[..., half:].double()
    return torch.cat((a * cos - b * sin, a * sin + b * cos), dim=-1).float()


def rope_for(variant: str = "standard", d_model: int = 64, n_head: int = 4, base: float = 10000.0) -> RoPE:
    return RoPE(ModelConfig(vocab_size=50, d_model=d_model, n_head=n_head, n_kv_head=n_head, pos_type="rope",
                            rope_variant=variant, rope_base=base))


def qk(B=2, H=4, G=4, T=12, hd=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(B, H, T, hd, generator=g), torch.randn(B, G, T, hd, generator=g)


def scores(q, k):
    return q @ k.transpose(-1, -2)  # [B, H, T, T]


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """HF Llama's half-split pairing, the form turn_half replaces: (x1, x2) -> (-x2, x1)."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def test_turn_half_is_the_rotate_half_formula_bit_for_bit():
    """The roll + signed-sin form is exact, values and gradients, so it moved no baseline."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 7, 6, 16, generator=g)
    ang = torch.randn(7, 1, 8, generator=g).repeat(1, 1, 2)  # half-split: both halves share angles
    cos, sin = ang.cos(), ang.sin()
    signed = torch.cat((-sin[..., :8], sin[..., 8:]), -1)
    a, b = x.clone().requires_grad_(), x.clone().requires_grad_()
    ya, yb = turn_half(a, cos, signed), b * cos + rotate_half(b) * sin
    assert torch.equal(ya, yb)
    gy = torch.randn(ya.shape, generator=g)
    ya.backward(gy)
    yb.backward(gy)
    assert torch.equal(a.grad, b.grad)


def test_rope_keeps_shape_and_norms():
    rope = rope_for()
    q, k = qk(H=4, G=2)
    pos = torch.arange(3, 15)
    qr, kr = rope.rotate(q, k, pos, 15)
    assert qr.shape == q.shape and kr.shape == k.shape
    torch.testing.assert_close(qr.norm(dim=-1), q.norm(dim=-1), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(kr.norm(dim=-1), k.norm(dim=-1), atol=1e-5, rtol=1e-5)
    assert (qr - q).abs().max() > 0.1  # it did rotate


@pytest.mark.parametrize("base", [10000.0, 500.0])
def test_rope_matches_half_split_reference(base):
    rope = rope_for(base=base)
    q, k = qk()
    pos = torch.arange(0, 12) * 3
    qr, kr = rope.rotate(q, k, pos, int(pos.max()) + 1)
    torch.testing.assert_close(qr, ref_rope(q, pos, base), atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(kr, ref_rope(k, pos, base), atol=2e-5, rtol=1e-5)


def test_rope_position_zero_is_identity():
    rope = rope_for()
    q, k = qk(T=1)
    qr, kr = rope.rotate(q, k, torch.zeros(1, dtype=torch.long), 1)
    torch.testing.assert_close(qr, q)
    torch.testing.assert_close(kr, k)


def test_rope_relative_position_invariance():
    rope = rope_for()
    q, k = qk(T=16)
    pos = torch.arange(16)
    base_scores = scores(*rope.rotate(q, k, pos, 16))
    for shift in (7, 100):
        shifted = scores(*rope.rotate(q, k, pos + shift, 16 + shift))
        torch.testing.assert_close(shifted, base_scores, atol=1e-4, rtol=1e-4)
    # the scores do depend on the relative offset: pairing q_m with k at other positions changes them
    spread = scores(*rope.rotate(q, k, pos * 2, 32))
    assert (spread - base_scores).abs().max() > 1.0


@pytest.mark.parametrize("variant", ["q_only", "k_interleaved"])
def test_broken_rope_variants_fail_shift_invariance(variant):
    q, k = qk(T=16)
    pos = torch.arange(16)
    for name, expect_invariant in (("standard", True), (variant, False)):
        rope = rope_for(name)
        diff = (scores(*rope.rotate(q, k, pos, 16)) - scores(*rope.rotate(q, k, pos + 7, 23))).abs().max()
        if expect_invariant:
            assert diff < 1e-4, name
        else:
            assert diff > 1.0, f"{variant}: shift changed scores by only {diff:.2e}"


def test_rope_same_position_same_result():
    rope = rope_for()
    q, k = qk(T=3)
    q[:, :, 2], k[:, :, 2] = q[:, :, 0], k[:, :, 0]
    pos = torch.tensor([5, 9, 5])
    qr, kr = rope.rotate(q, k, pos, 10)
    torch.testing.assert_close(qr[:, :, 2], qr[:, :, 0], atol=0, rtol=0)
    torch.testing.assert_close(kr[:, :, 2], kr[:, :, 0], atol=0, rtol=0)
    # after the cos/sin tables grow, the same ids still give the same result
    rope.rotate(q, k, torch.tensor([150, 190, 199]), 200)
    qr2, kr2 = rope.rotate(q, k, pos, 10)
    torch.testing.assert_close(qr2, qr, atol=1e-6, rtol=0)
    torch.testing.assert_close(kr2, kr, atol=1e-6, rtol=0)


def test_rope_batched_positions():
    rope = rope_for()
    q, k = qk(B=2, H=4, G=2, T=8)
    pos = torch.stack((torch.arange(8), torch.arange(8) + 13))  # [B, T]
    qr, kr = rope.rotate(q, k, pos, 21)
    torch.testing.assert_close(qr, ref_rope(q, pos), atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(kr, ref_rope(k, pos), atol=2e-5, rtol=1e-5)
    for b in range(2):  # row b equals rotating row b alone with its [T] positions
        qb, kb = rope.rotate(q[b : b + 1], k[b : b + 1], pos[b], 21)
        torch.testing.assert_close(qr[b : b + 1], qb, atol=1e-6, rtol=0)
        torch.testing.assert_close(kr[b : b + 1], kb, atol=1e-6, rtol=0)


@pytest.mark.parametrize("pos_type", ["learned", "rope"])
def test_lm_accepts_batched_positions(make_lm, pos_type):
    model = make_lm(pos_type=pos_type)
    idx = torch.randint(0, 50, (2, 8), generator=torch.Generator().manual_seed(1))
    pos = torch.stack((torch.arange(8), torch.arange(8) + 9))  # [B, T]
    with torch.no_grad():
        logits, _ = model(idx, pos=pos)
        for b in range(2):
            row, _ = model(idx[b : b + 1], pos=pos[b])
            torch.testing.assert_close(logits[b : b + 1], row, atol=1e-5, rtol=1e-5)
        shifted, _ = model(idx[:1], pos=pos[0] + 3)
    if pos_type == "learned":  # absolute positions change the output; RoPE only sees offsets
        assert (shifted - logits[:1]).abs().max() > 1e-2
    else:
        torch.testing.assert_close(shifted, logits[:1], atol=1e-4, rtol=1e-4)


def manual_attention(attn: CausalSelfAttention, x: torch.Tensor, rope: bool = False, tile: bool = False):
    """softmax(Q K^T / sqrt(hd) + causal mask) V with attn's own weights; K/V repeated to H heads.

    x: [B, T, C] -> [B, T, C]. tile=True repeats K/V heads in the wrong order (h -> h % G) to show
    the test can tell.
    """
    B, T, C = x.shape
    H, G, hd = attn.n_head, attn.n_kv_head, attn.head_dim
    W = attn.qkv.weight  # [(H + 2G) hd, C]: rows Q, then K, then V
    q = (x @ W[: H * hd].T).view(B, T, H, hd).transpose(1, 2)
    k = (x @ W[H * hd : (H + G) * hd].T).view(B, T, G, hd).transpose(1, 2)
    v = (x @ W[(H + G) * hd :].T).view(B, T, G, hd).transpose(1, 2)
    if rope:  # Q and K only, half-split, positions 0..T-1
        pos = torch.arange(T)
        q, k = ref_rope(q, pos), ref_rope(k, pos)
    if tile:
        k, v = k.repeat(1, H // G, 1, 1), v.repeat(1, H // G, 1, 1)
    else:
        k, v = k.repeat_interleave(H // G, dim=1), v.repeat_interleave(H // G, dim=1)
    s = q @ k.transpose(-1, -2) / math.sqrt(hd)
    s = s.masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool), 1), float("-inf"))
    y = torch.softmax(s, dim=-1) @ v  # [B, H, T, hd]
    return y.transpose(1, 2).reshape(B, T, H * hd) @ attn.out.weight.T


def attention(n_kv_head: int, pos_type: str = "learned", seed: int = 0):
    torch.manual_seed(seed)
    cfg = ModelConfig(vocab_size=50, d_model=64, n_head=4, n_kv_head=n_kv_head, pos_type=pos_type)
    attn = CausalSelfAttention(cfg).eval()
    with torch.no_grad():
        for p in attn.parameters():
            p.normal_(0, 1 / math.sqrt(p.shape[-1]))
    positions = RoPE(cfg) if pos_type == "rope" else LearnedPositions(cfg)
    return attn, positions


def run_attention(attn, positions, x):
    T = x.shape[1]
    return attn(x, torch.arange(T), T, positions.rotate)


def test_mha_equals_manual_attention():
    attn, positions = attention(n_kv_head=4)
    x = torch.randn(2, 10, 64, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(run_attention(attn, positions, x), manual_attention(attn, x),
                                   atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("n_kv_head", [2, 1])
def test_gqa_equals_repeat_interleave_reference(n_kv_head):
    attn, positions = attention(n_kv_head=n_kv_head)
    assert attn.qkv.weight.shape == ((4 + 2 * n_kv_head) * 16, 64)
    x = torch.randn(2, 10, 64, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ours = run_attention(attn, positions, x)
        torch.testing.assert_close(ours, manual_attention(attn, x), atol=1e-5, rtol=1e-5)
        if n_kv_head > 1:  # query head h uses kv head h // (H/G), not h % G
            assert (ours - manual_attention(attn, x, tile=True)).abs().max() > 1e-2


def test_gqa_equals_mha_with_duplicated_kv_heads():
    gqa, positions = attention(n_kv_head=2, pos_type="rope")
    mha, _ = attention(n_kv_head=4, pos_type="rope")
    hd = 16
    with torch.no_grad():
        Wq, Wk, Wv = gqa.qkv.weight.split((4 * hd, 2 * hd, 2 * hd))
        dup = lambda w: w.view(2, 1, hd, 64).expand(2, 2, hd, 64).reshape(4 * hd, 64)  # noqa: E731
        mha.qkv.weight.copy_(torch.cat((Wq, dup(Wk), dup(Wv))))
        mha.out.weight.copy_(gqa.out.weight)
        x = torch.randn(2, 10, 64, generator=torch.Generator().manual_seed(1))
        torch.testing.assert_close(run_attention(gqa, positions, x), run_attention(mha, positions, x),
                                   atol=1e-5, rtol=1e-5)


def test_rope_rotates_q_and_k_but_not_v():
    attn, positions = attention(n_kv_head=2, pos_type="rope")
    seen = []

    def spy(q, k, pos, end):
        seen.append((q.shape, k.shape))
        return positions.rotate(q, k, pos, end)

    x = torch.randn(2, 10, 64, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ours = attn(x, torch.arange(10), 10, spy)
        torch.testing.assert_close(ours, manual_attention(attn, x, rope=True), atol=1e-5, rtol=1e-5)
        # a model that also rotated V would differ from the reference
        assert (ours - manual_attention(attn, x)).abs().max() > 1e-2
    assert seen == [((2, 4, 10, 16), (2, 2, 10, 16))]  # exactly q [B, H, T, hd] and k [B, G, T, hd]


# ----------------------------------------------------------------------------------- norms


def test_rmsnorm_matches_formula():
    torch.manual_seed(0)
    norm = RMSNorm(32, eps=1e-5)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(32))
    x = torch.randn(3, 7, 32) * 3 + 1
    ref = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * norm.weight
    with torch.no_grad():
        torch.testing.assert_close(norm(x), ref, atol=1e-5, rtol=1e-5)
        # RMSNorm does not centre: adding a constant changes more than a LayerNorm would allow
        assert (norm(x + 5) - norm(x)).abs().max() > 1e-2
    assert [n for n, _ in norm.named_parameters()] == ["weight"]


def test_rmsnorm_uses_config_eps():
    norm = RMSNorm(8, eps=0.5)
    x = torch.full((1, 8), 0.1)
    with torch.no_grad():  # mean(x^2) = 0.01, so eps dominates: 0.1 / sqrt(0.51)
        torch.testing.assert_close(norm(x), torch.full((1, 8), 0.1 / math.sqrt(0.51)))


def test_layernorm_matches_torch():
    torch.manual_seed(0)
    ours, ref = LayerNorm(32, eps=1e-5), nn.LayerNorm(32, eps=1e-5)
    with torch.no_grad():
        ours.weight.copy_(torch.randn(32))
        ours.bias.copy_(torch.randn(32))
        ref.weight.copy_(ours.weight)
        ref.bias.copy_(ours.bias)
        x = torch.randn(3, 7, 32) * 3 + 1
        torch.testing.assert_close(ours(x), ref(x), atol=1e-5, rtol=1e-5)


# ------------------------------------------------------------------------------- validation


def test_config_rejects_kv_heads_not_dividing_heads():
    with pytest.raises(ValidationError) as err:
        ModelConfig(n_head=4, n_kv_head=3)
    assert "n_kv_head=3" in str(err.value) and "n_head=4" in str(err.value)


def test_config_rejects_heads_not_dividing_d_model():
    with pytest.raises(ValidationError) as err:
        ModelConfig(d_model=30, n_head=4, n_kv_head=4)
    assert "n_head=4" in str(err.value) and "d_model=30" in str(err.value)


def test_config_rejects_odd_head_dim_with_rope():
    ModelConfig(d_model=36, n_head=4, n_kv_head=4)  # head_dim 9 is fine with learned positions
    with pytest.raises(ValidationError, match="even head_dim"):
        ModelConfig(d_model=36, n_head=4, n_kv_head=4, pos_type="rope")


def test_config_rejects_unknown_keys():
    with pytest.raises(ValidationError) as err:
        ModelConfig(n_heads=4)
    assert err.value.errors()[0]["type"] == "extra_forbidden"
    with pytest.raises(ConfigError, match="n_heads: unknown key"):
        validate(ModelConfig, {"n_heads": 4})


def test_config_rejects_rope_variant_without_rope():
    with pytest.raises(ValidationError, match="rope_variant"):
        ModelConfig(rope_variant="q_only")


# ------------------------------------------------------------------------------- causality


@pytest.mark.parametrize("n_kv_head", [4, 2])
def test_causality(make_lm, components, n_kv_head):
    assert_causal(make_lm(n_kv_head=n_kv_head, **components))


def test_loss_is_cross_entropy(make_lm):
    model = make_lm()
    g = torch.Generator().manual_seed(0)
    idx, targets = torch.randint(0, 50, (2, 8), generator=g), torch.randint(0, 50, (2, 8), generator=g)
    with torch.no_grad():
        logits, loss = model(idx, targets)
    assert logits.shape == (2, 8, 50)
    torch.testing.assert_close(loss, F.cross_entropy(logits.reshape(16, 50), targets.reshape(16)))


@pytest.mark.parametrize("vocab", [50, 64])  # padded to 64 columns; already a multiple of 64
def test_padded_head_gives_the_plain_heads_loss_and_gradients(make_lm, vocab):
    """The loss's head runs on the vocabulary padded to 64 with -inf logits: same loss, same grads."""
    model = make_lm(vocab_size=vocab)
    assert model.head_mask.shape == (64,) and model.head.weight.shape[0] == vocab
    g = torch.Generator().manual_seed(1)
    idx, targets = torch.randint(0, vocab, (2, 8), generator=g), torch.randint(0, vocab, (2, 8), generator=g)

    def grads(loss):
        model.zero_grad(set_to_none=True)
        loss.backward()
        return {n: p.grad.clone() for n, p in model.named_parameters()}

    logits, loss = model(idx, targets)
    padded = grads(loss)
    plain_logits, _ = model(idx)  # no targets: the plain [V, C] head
    plain_loss = F.cross_entropy(plain_logits.reshape(16, vocab), targets.reshape(16))
    plain = grads(plain_loss)
    torch.testing.assert_close(loss, plain_loss, atol=1e-6, rtol=0)
    torch.testing.assert_close(logits, plain_logits, atol=1e-6, rtol=0)
    for name in plain:
        torch.testing.assert_close(padded[name], plain[name], atol=1e-6, rtol=1e-5, msg=name)


# ------------------------------------------------------------------------- position limits


def test_learned_positions_raise_past_ctx_len(make_lm):
    model = make_lm(pos_type="learned", ctx_len=16)
    with torch.no_grad():
        logits, _ = model(torch.zeros(1, 16, dtype=torch.long))  # exactly ctx_len is fine
        assert logits.shape == (1, 16, 50)
        with pytest.raises(PositionError, match="ctx_len"):
            model(torch.zeros(1, 17, dtype=torch.long))
        with pytest.raises(PositionError, match="ctx_len"):  # also when explicit positions run past it
            model(torch.zeros(1, 4, dtype=torch.long), pos=torch.arange(14, 18))


@pytest.mark.parametrize("factor", [2, 4])
def test_rope_runs_past_ctx_len(make_lm, factor):
    model = make_lm(pos_type="rope", ctx_len=12, norm_pos="pre", norm_type="rmsnorm")
    T = 12 * factor
    idx = torch.randint(0, 50, (2, T), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logits, _ = model(idx)
        head, _ = model(idx[:, :12])
    assert logits.shape == (2, T, 50)
    assert torch.isfinite(logits).all()
    torch.testing.assert_close(logits[:, :12], head, atol=1e-5, rtol=1e-5)  # causal past the window


def test_broken_rope_variants_are_labelled():
    assert "BROKEN rope:q_only" in label(ModelConfig(pos_type="rope", rope_variant="q_only"))
    assert "BROKEN rope:k_interleaved" in label(ModelConfig(pos_type="rope", rope_variant="k_interleaved"))
    assert "BROKEN" not in label(ModelConfig(pos_type="rope"))

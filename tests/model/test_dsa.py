"""DeepSeek sparse attention (dsa): its sizes and refusals, exact parameters, decode-state bytes and FLOP
terms, the keys each query reads (top-k, all of them below k), causality and cached decode == full
forward with the sparsity binding, training (the indexer learns by its own KL loss alone, checked against
a hand computation; the LM loss never reaches it; at coefficient 0 it stays at its init), and the whole
model against Hugging Face's DeepseekV32ForCausalLM in fp32 and fp64, through HF's own cache too,
with planted mutations (top-k off by one, an indexer that sees the future) that must fail.
test_rows.py checks the component row at both ends."""

from __future__ import annotations

import math

import pytest
import torch
from helpers import LLAMA, deepseek_base_state
from lm_checks import assert_causal, assert_decodes_like_full, decode_in_chunks, tokens, train_losses, trainer

from anatomy_cli.exams.export import ExportError, check_llama_shaped
from anatomy_cli.model import dsa as dsa_module
from anatomy_cli.model.dsa import INDEX_EPS, SparseLatentAttention
from anatomy_cli.spec import components as comp
from anatomy_cli.spec.config import DSA_SIZES, MLA_SIZES, ConfigError, ModelConfig, RunConfig, TrainConfig, validate
from anatomy_cli.training.trainer import add_terms
from tests.model.test_mla import hf_rope, interleave_rows, rms_norm_in_input_dtype, scrambled

pytestmark = [pytest.mark.filterwarnings("error"), pytest.mark.usefixtures("single_thread")]

# toy sizes with every width distinct (MLA's as in test_mla.py), so a swapped split cannot line up
MLA = {"q_lora_rank": 24, "kv_lora_rank": 20, "qk_rope_head_dim": 6, "qk_nope_head_dim": 10, "v_head_dim": 12}
DSA = {"dsa_top_k": 5, "dsa_index_heads": 3, "dsa_index_head_dim": 14}
T = 20  # longer than top_k: most queries read 5 of their keys


def dsa_config(**overrides) -> ModelConfig:
    return ModelConfig(**{"vocab_size": 50, "d_model": 32, "n_layer": 2, "n_head": 4, "n_kv_head": 4, "ctx_len": 24,
                          "attn_type": "mla", "dsa": True, **overrides})


def dsa_lm(seed: int = 0, **overrides):
    from anatomy_cli.model import LM

    torch.manual_seed(seed)
    return scrambled(LM(dsa_config(**overrides)), seed)


# ------------------------------------------------------------------------- sizes and refusals


def test_default_sizes():
    s = ModelConfig(attn_type="mla", dsa=True, ctx_len=64).dsa_dims  # d 128, 4 heads of 32, rope part 16
    assert tuple(s) == (16, 8, 32)  # a quarter of the context's keys; half of n_head, at least 8; head_dim
    assert ModelConfig(attn_type="mla", dsa=True, **DSA).dsa_dims == (5, 3, 14)  # given sizes win
    assert dsa_config(d_model=8, n_head=8, ctx_len=3).dsa_dims == (1, 8, 2)  # at least 1 key, head >= rope part
    assert dsa_config().layer_kinds == ("dsa", "dsa") and dsa_config(dsa=False).layer_kinds == ("mla", "mla")


@pytest.mark.parametrize("overrides, message", [
    ({"dsa_top_k": 25}, "dsa_top_k=25 is larger than ctx_len=24"),
    ({"dsa_top_k": 0}, "dsa_top_k: Input should be greater than 0"),
    ({"dsa_index_heads": 0}, "dsa_index_heads: Input should be greater than 0"),
    ({"dsa": False, "dsa_top_k": 4}, "dsa_top_k is a dsa setting: it needs dsa=true"),
    ({"dsa": False, "dsa_index_head_dim": 8}, "dsa_index_head_dim is a dsa setting: it needs dsa=true"),
    ({"attn_type": "softmax"}, "dsa needs attn_type='mla'"),
    ({"pos_type": "rope", "qk_rope_head_dim": 8, "dsa_index_head_dim": 6},
     "dsa_index_head_dim=6 must be at least qk_rope_head_dim=8"),
])
def test_bad_settings_are_refused_in_one_line(overrides, message):
    base = {"vocab_size": 50, "d_model": 32, "n_head": 4, "ctx_len": 24, "attn_type": "mla", "dsa": True}
    with pytest.raises(ConfigError, match=message) as err:
        validate(ModelConfig, {**base, **overrides}, prefix="model.")
    assert "\n" not in str(err.value)


def test_top_k_of_the_whole_context_and_a_small_index_head_without_rope_are_fine():
    assert dsa_config(dsa_top_k=24).dsa_dims.top_k == 24
    assert dsa_config(qk_rope_head_dim=8, dsa_index_head_dim=6, pos_type="nope").dsa_dims.index_head_dim == 6


def test_off_values_stay_out_of_the_run_id():
    from anatomy_cli.store import runs

    plain = RunConfig().model_dump(mode="json")
    before = {**plain, "model": {k: v for k, v in plain["model"].items() if k not in ("dsa", *DSA_SIZES)}}
    assert runs.config_hash(plain) == runs.config_hash(before)
    mla = RunConfig(model={"attn_type": "mla"}).model_dump(mode="json")
    on = RunConfig(model={"attn_type": "mla", "dsa": True}).model_dump(mode="json")
    assert len({runs.config_hash(plain), runs.config_hash(mla), runs.config_hash(on)}) == 3
    # the indexer loss's coefficient at its default keeps every earlier id, dsa's too; another value is a new run
    for cfg in (plain, on):
        assert runs.config_hash(cfg) == runs.config_hash({**cfg, "train": {
            k: v for k, v in cfg["train"].items() if k != "dsa_indexer_loss"}})
    off = RunConfig(model={"attn_type": "mla", "dsa": True}, train={"dsa_indexer_loss": 0}).model_dump(mode="json")
    assert runs.config_hash(off) != runs.config_hash(on)
    assert TrainConfig().dsa_indexer_loss == 1.0
    with pytest.raises(ConfigError, match="dsa_indexer_loss"):
        validate(TrainConfig, {"dsa_indexer_loss": -1})


def test_component_row_and_export_refusal():
    c = comp.BY_NAME["dsa"]
    assert (c.on, c.off, c.llama) == ({"model.attn_type": "mla", "model.dsa": True}, {"model.dsa": False}, "off")
    flat = comp.flat_config(RunConfig(model={"attn_type": "mla"}))
    assert comp.BY_NAME["mla"].state(flat) is True and c.state(flat) is False  # plain mla: dsa off
    assert "DeepSeek-V3.2" in c.source and "16 of 64" in c.about and "own KL loss" in c.about
    cfg = ModelConfig(vocab_size=50, **LLAMA, attn_type="mla", dsa=True)
    assert comp.label(cfg) == "llama+mla+dsa"  # dsa sits on latent attention
    with pytest.raises(ExportError, match=r"sparse latent attention \(dsa\)"):
        check_llama_shaped(cfg)


# ------------------------------------------------------------------------- parameters, state, FLOPs


def dsa_params(d: int, H: int, rq: int, r: int, p: int, n: int, v: int, Hi: int, D: int) -> int:
    """Written out: MLA's (test_mla.mla_params), then the indexer's wq, wk, LayerNorm (weight, bias), w."""
    mla = (d * rq + rq + rq * H * (n + p)) + (d * (r + p) + r + r * H * (n + v)) + H * v * d
    return mla + rq * Hi * D + d * D + 2 * D + d * Hi


@pytest.mark.parametrize("overrides", [{}, {**MLA, **DSA}, {"d_model": 64, "n_head": 8}])
def test_attention_param_count_is_exact(overrides):
    cfg = dsa_config(**overrides)
    module = sum(p.numel() for p in SparseLatentAttention(cfg).parameters())
    assert cfg.mixer_params("dsa") == module == dsa_params(cfg.d_model, cfg.n_head, *cfg.mla_dims, *cfg.dsa_dims[1:])


@pytest.mark.parametrize("base", [{}, LLAMA], ids=["2017", "llama"])
def test_model_param_count_is_exact(base):
    from anatomy_cli.model import LM

    cfg = dsa_config(**base, **MLA, **DSA)
    assert cfg.num_params() == LM(cfg).num_params() == cfg.active_params()
    mla = ModelConfig(**{**cfg.model_dump(), "dsa": False, **dict.fromkeys(DSA_SIZES)})
    assert cfg.num_params() - mla.num_params() == 2 * (24 * 3 * 14 + 32 * 14 + 2 * 14 + 32 * 3)


def test_cache_holds_the_latent_the_rope_key_and_the_index_key():
    model = dsa_lm(**LLAMA, **MLA, **DSA)
    cfg, B = model.cfg, 2
    cache = model.new_cache(B, T)
    with torch.no_grad():
        model(tokens(B, T), cache=cache)
    per_token = MLA["kv_lora_rank"] + MLA["qk_rope_head_dim"] + DSA["dsa_index_head_dim"]  # r + p + D
    assert cache.layer_bytes() == [cfg.state_bytes("dsa", B, T, 4)] * 2 == [B * T * per_token * 4] * 2
    assert cache.cache_bytes() == cfg.cache_bytes(B, T, 4)
    assert cache[0].index_k.shape == (B, T, DSA["dsa_index_head_dim"]) and cache[0].index_k.abs().sum() > 0


def test_flops_count_the_keys_read_and_the_indexer():
    cfg = dsa_config(**MLA, **DSA)
    read = 3 * 5 * 4 * (10 + 6 + 12)  # mla's term over top_k keys instead of ctx_len
    assert cfg.context_flops("dsa") == read + 2 * 24 * 3 * (14 + 1)
    assert cfg.context_flops("mla") == 3 * 24 * 4 * (10 + 6 + 12)


# ------------------------------------------------------------------------- which keys, causality, decode

BASES = {"2017": {}, "llama": LLAMA}
BASE = pytest.mark.parametrize("base", list(BASES))


def captured(model, idx, module_of, pre: bool = False, pick=lambda got: got) -> list:
    """pick(what module_of(block) got) for each block in a no-grad forward of idx: its output (a forward
    hook), or with `pre` its positional inputs (a forward pre-hook)."""
    seen = []
    if pre:
        hooks = [module_of(b).register_forward_pre_hook(lambda m, args: seen.append(pick(args)))
                 for b in model.blocks]
    else:
        hooks = [module_of(b).register_forward_hook(lambda m, args, out: seen.append(pick(out)))
                 for b in model.blocks]
    try:
        with torch.no_grad():
            model(idx)
    finally:
        for h in hooks:
            h.remove()
    return seen


def keys_read(model, idx) -> list[torch.Tensor]:
    """Each layer's bool [B, 1, T, S] of keys its attention reads, from the indexer."""
    return captured(model, idx, lambda b: b.attn.indexer)


@BASE
def test_each_query_reads_its_top_k_earlier_keys_or_all_of_them(base):
    model = dsa_lm(**BASES[base], **MLA, **DSA)
    for read in keys_read(model, tokens(2, T)):
        counts = read.sum(-1).squeeze(1)  # [B, T]
        want = torch.arange(1, T + 1).clamp(max=5).expand(2, T)
        assert torch.equal(counts, want)
        assert not read[:, 0].triu(1).any()  # causal: no key after its query


def test_reading_every_key_is_dense_mla():
    """top_k = the context: every query reads all its keys, and the model is MLA with the same weights;
    at top_k 5 it is not."""
    from anatomy_cli.model import LM

    idx = tokens(2, 24)
    mla = scrambled(LM(dsa_config(**LLAMA, **MLA, dsa=False)))
    outs = []
    for k in (24, 5):
        sparse = LM(dsa_config(**LLAMA, **MLA, dsa_top_k=k)).eval()
        sparse.load_state_dict(mla.state_dict(), strict=False)  # the indexer keeps its own init
        with torch.no_grad():
            outs.append(sparse(idx)[0])
    with torch.no_grad():
        dense = mla(idx)[0]
    torch.testing.assert_close(outs[0], dense, atol=1e-6, rtol=0)
    assert (outs[1] - dense).abs().max() > 1e-2


@BASE
@pytest.mark.parametrize("extra", [{}, {"parallel_block": True}, {"pos_type": "nope"}],
                         ids=["plain", "parallel", "nope"])
def test_causal_and_cached_decode_equals_full_forward(base, extra):
    model = dsa_lm(**{**BASES[base], **MLA, **DSA, **extra})
    assert_causal(model, T=T)
    assert_decodes_like_full(model, tokens(2, T, seed=1), [[6] + [1] * 14, [5, 3, 1, 4, 1, 2, 4], [1] * T])


def test_an_indexer_that_sees_the_future_fails_causality(monkeypatch):
    """The whole mask peeks (scores and attention): a later token moves earlier logits."""
    model = dsa_lm(**LLAMA, **MLA, **DSA)
    monkeypatch.setattr(dsa_module, "visible", lambda past, T, S, window, device: torch.ones(T, S, dtype=torch.bool))
    with pytest.raises(AssertionError):
        assert_causal(model, T=T)


def test_a_cache_without_the_index_keys_fails_decode(monkeypatch):
    """Index keys of earlier chunks lost (zeros): decode no longer equals the full forward."""
    model = dsa_lm(**LLAMA, **MLA, **DSA)

    def forget(self, k, past):
        self.index_k.zero_()
        end = past + k.shape[1]
        self.index_k[:, past:end] = k
        return self.index_k[:, :end].to(k.dtype)
    monkeypatch.setattr(dsa_module.DsaKV, "update_index", forget)
    with pytest.raises(AssertionError):
        assert_decodes_like_full(model, tokens(2, T, seed=1), [[6] + [1] * 14])


def test_ties_go_to_the_earlier_key_in_every_chunking():
    """Index weights of zero score every key 0: each query reads its top_k EARLIEST keys, whether the
    positions come in one forward or one at a time."""
    model = dsa_lm(**LLAMA, **MLA, **DSA)
    with torch.no_grad():
        for b in model.blocks:
            b.attn.indexer.w.weight.zero_()
    read = keys_read(model, tokens(1, T))[0][0, 0]  # [T, S]
    assert torch.equal(read, torch.ones(T, T, dtype=torch.bool).tril() & (torch.arange(T) < 5))
    idx = tokens(2, T, seed=1)
    with torch.no_grad():
        torch.testing.assert_close(decode_in_chunks(model, idx, [1] * T)[0], model(idx)[0], atol=1e-4, rtol=0)


# ------------------------------------------------------------------------- training


def hand_indexer_loss(attn, x, pos, end) -> float:
    """One dsa layer's indexer loss written out, query by query in Python floats: the keys read (top_k
    of the indexer's scores among the causal ones, ties to the earlier key), p = the attention's per-head
    softmax over them summed over heads / H, q = softmax of the scores over them, KL(p || q); the mean
    over queries. Q, K and the scores come from the layer's own parts (pinned against HF below)."""
    q, k, _, q_latent, _ = attn.project(x, pos, end)
    index, _ = attn.indexer.scores(x, q_latent, pos, end, attn.rope)
    q, k, index = q.tolist(), k.tolist(), index.tolist()
    H, top_k = len(q[0]), attn.indexer.top_k
    kls = []
    for b in range(len(q)):
        for t in range(len(q[0][0])):
            read = sorted(range(t + 1), key=lambda s: (-index[b][t][s], s))[:top_k]
            p = dict.fromkeys(read, 0.0)
            for h in range(H):
                logit = {s: attn.scale * sum(a * c for a, c in zip(q[b][h][t], k[b][h][s])) for s in read}
                z = sum(math.exp(v) for v in logit.values())
                for s in read:
                    p[s] += math.exp(logit[s]) / z / H
            z = sum(math.exp(index[b][t][s]) for s in read)
            kls.append(sum(p[s] * math.log(p[s] / (math.exp(index[b][t][s]) / z)) for s in read))
    return sum(kls) / len(kls)


def layer_inputs(model, idx) -> list[tuple]:
    """(x, pos, end) each dsa layer's attention got in a plain forward of idx."""
    return captured(model, idx, lambda b: b.attn, pre=True, pick=lambda args: args[:3])


@BASE
def test_indexer_loss_equals_a_hand_computation_fp64(base):
    """aux's dsa_indexer_loss = the mean over layers of each layer's KL, written out (fp64), and > 0:
    a random indexer does not rank keys as the attention weighs them."""
    model = dsa_lm(**BASES[base], **MLA, **DSA).double()
    idx = tokens(2, T)
    with torch.no_grad():
        _, _, aux = model(idx, idx, aux=True)
        hand = [hand_indexer_loss(b.attn, *args) for b, args in zip(model.blocks, layer_inputs(model, idx))]
    assert float(aux["dsa_indexer_loss"]) == pytest.approx(sum(hand) / len(hand), rel=1e-12, abs=0)
    assert min(hand) > 1e-2 and hand[0] != hand[1]


def test_the_loss_forward_reads_the_same_keys():
    """A training forward (aux, gradient on) gives the same logits, bit for bit, as a plain one: the
    selection is the same; a model without dsa returns no indexer loss."""
    model = dsa_lm(**LLAMA, **MLA, **DSA).train()
    idx = tokens(2, T, seed=2)
    logits, _, aux = model(idx, idx, aux=True)
    with torch.no_grad():
        assert torch.equal(logits, model(idx)[0])
    assert set(aux) == {"dsa_indexer_loss"} and aux["dsa_indexer_loss"].requires_grad
    assert "dsa_indexer_loss" not in dsa_lm(**LLAMA, **MLA, dsa=False)(idx, idx, aux=True)[2]


def grads(model, total) -> dict[str, torch.Tensor | None]:
    model.zero_grad(set_to_none=True)
    total.backward()
    return {n: None if p.grad is None else p.grad.clone() for n, p in model.named_parameters()}


def test_the_indexer_learns_from_its_loss_and_only_from_it():
    """The LM loss gives the indexer no gradient; the indexer loss gives it one (every indexer weight)
    and gives the rest of the model none: with coefficient 0 and 1 the rest's gradients are identical."""
    model = dsa_lm(**LLAMA, **MLA, **DSA).double().train()
    idx, y = tokens(2, T, seed=4), tokens(2, T, seed=5)

    def step(**train):
        logits, loss, aux = model(idx, y, aux=True)
        total, ce, terms = add_terms(TrainConfig(**train), logits, loss, aux)
        assert set(terms) == {"dsa_indexer_loss"} and torch.equal(ce, loss)
        return grads(model, total), float((total - loss).detach()), float(aux["dsa_indexer_loss"].detach())

    lm_only, added0, _ = step(dsa_indexer_loss=0)
    both, added1, kl = step()  # the default coefficient, 1
    _, added3, _ = step(dsa_indexer_loss=3)
    assert added0 == 0 and added1 == pytest.approx(kl, rel=1e-12) and added3 == pytest.approx(3 * kl, rel=1e-12)
    indexer = [n for n in both if ".indexer." in n]
    assert len(indexer) == 2 * 5  # wq, wk, k_norm (weight, bias), w in each layer
    for n in both:
        if ".indexer." in n:
            assert lm_only[n] is None and both[n] is not None and both[n].abs().min() > 0, n
        else:  # q_down, q_up, kv_down, kv_up, ... : the same bits with and without the term
            assert both[n] is not None and torch.equal(both[n], lm_only[n]), n
    _, _, aux = model(idx, y, aux=True)
    alone = grads(model, aux["dsa_indexer_loss"])
    assert [n for n, g in alone.items() if g is not None] == indexer


def test_its_loss_falls_when_the_indexer_alone_is_trained():
    """Adam on the indexer's weights alone, one batch: the KL to the (fixed) attention falls."""
    model = dsa_lm(**LLAMA, **MLA, **DSA).train()
    idx = tokens(2, T, seed=6)
    opt = torch.optim.Adam([p for n, p in model.named_parameters() if ".indexer." in n], lr=1e-2)
    seen = []
    for _ in range(30):
        kl = model(idx, idx, aux=True)[2]["dsa_indexer_loss"]
        seen.append(float(kl.detach()))
        opt.zero_grad()
        kl.backward()
        opt.step()
    assert seen[-1] < 0.5 * seen[0], seen


@pytest.mark.parametrize("coef", [1.0, 0.0])
def test_training_moves_the_indexer_by_its_loss_and_never_at_zero(tmp_path, coef):
    """A short toy run: every weight moves, the indexer's too, at coefficient 1; at 0 the indexer gets no
    gradient and AdamW leaves it at its init (no step, no weight decay) while the rest moves. The
    unscaled term is recorded in metrics.jsonl either way (as moe_aux_loss is)."""
    tr = trainer(tmp_path, "dsa", {"attn_type": "mla", "dsa": True, "dsa_top_k": 4}, dsa_indexer_loss=coef)
    before = {n: p.detach().clone() for n, p in tr.model.named_parameters()}
    losses = train_losses(tr, 3)
    assert all(math.isfinite(v) for v in losses) and losses[-1] < losses[0]
    for n, p in tr.model.named_parameters():
        moved = not torch.equal(p, before[n])
        assert moved == (coef > 0 or ".indexer." not in n), n
    tr.log.pending.append(tr.train_step())
    tr.log.flush(tr.step)
    from anatomy_cli.store import runs
    row = runs.read_metrics(tmp_path / "dsa")[-1]
    assert row["step"] == 4 and row["dsa_indexer_loss"] > 0 and "moe_aux_loss" not in row


# ------------------------------------------------------------------------- the whole model against HF


try:
    import transformers
    from transformers.models.deepseek_v32 import modeling_deepseek_v32 as hf_ds
except ImportError:  # transformers is in the hf/dev extras; an older one lacks DeepSeek-V3.2
    transformers = hf_ds = None
NEEDS_HF = pytest.mark.skipif(hf_ds is None, reason="the installed transformers has no DeepSeek-V3.2 model")

HF_NAMES = {  # anatomy's SparseLatentAttention -> DeepseekV32Attention (see model/dsa.py, model/mla.py)
    "q_down": "q_a_proj", "q_norm": "q_a_layernorm", "q_up": "q_b_proj", "kv_down": "kv_a_proj_with_mqa",
    "kv_norm": "kv_a_layernorm", "kv_up": "kv_b_proj", "out": "o_proj",
    "indexer.wq": "indexer.wq_b", "indexer.wk": "indexer.wk", "indexer.k_norm": "indexer.k_norm",
    "indexer.w": "indexer.weights_proj",
}


def hf_config(cfg: ModelConfig, dtype):
    m, s = cfg.mla_dims, cfg.dsa_dims
    hc = transformers.DeepseekV32Config(
        vocab_size=cfg.vocab_size, hidden_size=cfg.d_model, num_attention_heads=cfg.n_head,
        num_key_value_heads=cfg.n_head, q_lora_rank=m.q_lora_rank, kv_lora_rank=m.kv_lora_rank,
        qk_rope_head_dim=m.qk_rope_head_dim, qk_nope_head_dim=m.qk_nope_head_dim, v_head_dim=m.v_head_dim,
        index_topk=s.top_k, index_n_heads=s.index_n_heads, index_head_dim=s.index_head_dim,
        rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_base}, attention_bias=False,
        max_position_embeddings=cfg.ctx_len, num_hidden_layers=cfg.n_layer, first_k_dense_replace=cfg.n_layer,
        intermediate_size=cfg.ffn_hidden, rms_norm_eps=cfg.norm_eps, tie_word_embeddings=False, hidden_act="silu")
    # eager: the written-out softmax(QK^T) V, whose softmax runs in fp32; sdpa keeps fp64 end to end
    hc._attn_implementation = "sdpa" if dtype == torch.float64 else "eager"
    return hc


def hf_state(lm, cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """anatomy's LLaMA-end + dsa LM -> DeepseekV32ForCausalLM, every layer dense; MLA's rope rows
    permuted to HF's interleaved pairs (DeepseekV32Attention always interleaves), the indexer's not."""
    m, H = cfg.mla_dims, cfg.n_head
    n, p, r = m.qk_nope_head_dim, m.qk_rope_head_dim, m.kv_lora_rank
    out = deepseek_base_state(lm, dense_mlp=True)
    for i, block in enumerate(lm.blocks):
        pre = f"model.layers.{i}."
        attn = {}
        for k, v in block.attn.state_dict().items():
            module, leaf = k.rsplit(".", 1)
            attn[f"{HF_NAMES[module]}.{leaf}"] = v
        q = attn["q_b_proj.weight"].view(H, n + p, -1)  # head-major, each head (nope | rope)
        q = torch.cat((q[:, :n], torch.stack([interleave_rows(h, p) for h in q[:, n:]])), dim=1)
        attn["q_b_proj.weight"] = q.reshape(H * (n + p), -1)
        kv = attn["kv_a_proj_with_mqa.weight"]  # (latent | rope key)
        attn["kv_a_proj_with_mqa.weight"] = torch.cat((kv[:r], interleave_rows(kv[r:], p)))
        out |= {pre + "self_attn." + k: v for k, v in attn.items()}
    return {k: v.detach().clone() for k, v in out.items()}


@pytest.fixture
def hf_fp64(monkeypatch):
    """HF's RMSNorm without its fp32 cast and its RoPE tables from float64 angles (test_mla.py's)."""
    monkeypatch.setattr(hf_ds.DeepseekV32RMSNorm, "forward", rms_norm_in_input_dtype)
    monkeypatch.setattr(hf_ds.DeepseekV32RotaryEmbedding, "forward", hf_rope)


def boundary_ties(lm, idx) -> int:
    """Queries whose k-th and (k+1)-th best causal keys score exactly the same (ReLU zeroing every
    indexer head of two keys): anatomy gives such a tie to the earlier key, HF's torch.topk to whichever
    its kernel returns, so a parity over them compares two arbitrary choices."""
    found, top_k_keys = [], dsa_module.top_k_keys

    def spy(index, causal, k):
        best = index.masked_fill(~causal, float("-inf")).sort(-1, descending=True).values  # [B, T, S]
        more = causal.sum(-1) > k  # [T]: queries with more than k keys
        found.append(int(((best[..., k - 1] == best[..., k]) & more).sum()))
        return top_k_keys(index, causal, k)
    with pytest.MonkeyPatch.context() as mp, torch.no_grad():
        mp.setattr(dsa_module, "top_k_keys", spy)
        lm(idx)
    return sum(found)


def pair(dtype, seed: int = 0, **overrides):
    """(anatomy's LM, the HF model with its weights, the config), in dtype. Eight indexer heads: with
    three, a key's score is exactly 0 (every head's ReLU at 0) one time in 8, and ties at the top-k
    boundary, which the two libraries break differently (boundary_ties), come up in every batch; with
    eight, one key in 256."""
    from anatomy_cli.model import LM

    cfg = dsa_config(**{**LLAMA, **MLA, **DSA, "dsa_index_heads": 8, "n_layer": 3, "norm_eps": 1e-5,
                        "rope_base": 500.0, **overrides})
    torch.manual_seed(seed)
    lm = scrambled(LM(cfg), seed).to(dtype)
    hf = transformers.DeepseekV32ForCausalLM(hf_config(cfg, dtype)).to(dtype).eval()
    hf.load_state_dict(hf_state(lm, cfg))
    return lm, hf, cfg


def hf_keys_read(hf, idx) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """HF's logits and each layer's top-k indices as a bool [B, 1, T, S] of the causal keys read."""
    picked = []
    hooks = [layer.self_attn.indexer.register_forward_hook(lambda m, a, out: picked.append(out))
             for layer in hf.model.layers]
    try:
        with torch.no_grad():
            logits = hf(idx).logits
    finally:
        for h in hooks:
            h.remove()
    S = idx.shape[1]
    causal = torch.ones(S, S, dtype=torch.bool).tril()
    masks = [torch.zeros(*i.shape[:2], S, dtype=torch.bool).scatter(-1, i.long(), True).unsqueeze(1) & causal
             for i in picked]
    return logits, masks


def parity(dtype, lm, hf, seed: int = 0) -> float:
    """max |logit difference| over a [2, T] batch, after checking both read the same keys."""
    idx = tokens(2, T, seed=seed)
    assert boundary_ties(lm, idx) == 0  # the comparison is not decided by how each breaks a tie
    theirs, hf_read = hf_keys_read(hf, idx)
    ours_read = keys_read(lm, idx)
    with torch.no_grad():
        ours = lm(idx)[0]
    assert ours.std() > 0.5  # scrambled weights: logits far from uniform
    same_keys = all(torch.equal(a, b) for a, b in zip(ours_read, hf_read, strict=True))
    diff = float((ours - theirs).abs().max())
    return diff if same_keys else max(diff, float("inf"))


@NEEDS_HF
def test_model_equals_deepseek_v32_fp32():
    lm, hf, _ = pair(torch.float32)
    assert parity(torch.float32, lm, hf) <= 1e-5  # 2.1e-6 seen


@NEEDS_HF
@pytest.mark.usefixtures("hf_fp64")
def test_model_equals_deepseek_v32_fp64():
    lm, hf, _ = pair(torch.float64)
    assert parity(torch.float64, lm, hf) <= 1e-12  # 2.7e-15 seen


@NEEDS_HF
@pytest.mark.usefixtures("hf_fp64")
@pytest.mark.parametrize("off_by", [1, -1])
def test_top_k_off_by_one_breaks_parity(off_by):
    lm, hf, _ = pair(torch.float64)
    for block in lm.blocks:
        block.attn.indexer.top_k += off_by
    idx = tokens(2, T)
    with torch.no_grad():
        assert (lm(idx)[0] - hf(idx).logits).abs().max() > 1e-3


@NEEDS_HF
@pytest.mark.usefixtures("hf_fp64")
def test_an_indexer_that_sees_the_future_breaks_parity(monkeypatch):
    """Scores of later keys not masked before the top-k: those picks are then dropped by the causal
    mask, so queries read fewer than k keys and the logits leave HF's."""
    lm, hf, _ = pair(torch.float64)
    top_k_keys = dsa_module.top_k_keys
    monkeypatch.setattr(dsa_module, "top_k_keys", lambda index, causal, k: top_k_keys(index, causal | True, k) & causal)
    idx = tokens(2, T)
    with torch.no_grad():
        assert (lm(idx)[0] - hf(idx).logits).abs().max() > 1e-3


@NEEDS_HF
@pytest.mark.parametrize("dtype, atol", [(torch.float32, 1e-5), (torch.float64, 1e-12)], ids=["fp32", "fp64"])
def test_decode_equals_deepseek_v32_with_its_cache(dtype, atol, request):
    """A prefill, then single tokens and a chunk, through anatomy's cache and HF's DynamicCache (which
    keeps the indexer keys in its DynamicIndexedLayer): the logits of every step agree."""
    if dtype == torch.float64:
        request.getfixturevalue("hf_fp64")
    lm, hf, _ = pair(dtype)
    idx, chunks = tokens(2, T, seed=1), [7, 1, 1, 4, 1, 1, 5]
    assert boundary_ties(lm, idx) == 0
    ours, _ = decode_in_chunks(lm, idx, chunks)
    cache, theirs, t = transformers.DynamicCache(config=hf.config), [], 0
    assert isinstance(cache.layers[0], transformers.cache_utils.DynamicIndexedLayer)
    with torch.no_grad():
        for n in chunks:
            theirs.append(hf(idx[:, t : t + n], cache=cache, use_cache=True).logits)
            t += n
    assert cache.layers[0].indexer_keys.shape == (2, T, DSA["dsa_index_head_dim"])
    assert (ours - torch.cat(theirs, dim=1)).abs().max() <= atol


def test_index_key_norm_uses_deepseeks_eps():
    assert SparseLatentAttention(dsa_config()).indexer.k_norm.eps == INDEX_EPS == 1e-6


def test_mla_sizes_and_dsa_sizes_are_separate_fields():
    assert not set(MLA_SIZES) & set(DSA_SIZES)

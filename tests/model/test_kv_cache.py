"""Cached decoding equals the full forward, for every component combination and MHA/GQA/MQA.

Also: greedy generation with and without the cache (across the context shift), cache shapes and
byte counts, overflow, and RoPE positions continuing from past_len.
"""

from __future__ import annotations

import pytest
import torch
from lm_checks import decode_in_chunks, tokens

from anatomy_cli.model.attention import attention_mask
from anatomy_cli.model.generate import generate
from anatomy_cli.model.kv_cache import KV, CacheFullError
from anatomy_cli.spec.config import ModelConfig

pytestmark = [pytest.mark.filterwarnings("error"), pytest.mark.usefixtures("single_thread")]

HEADS = pytest.mark.parametrize("n_kv_head", [4, 2, 1], ids=["mha", "gqa2", "mqa"])


@HEADS
def test_prefill_then_single_steps_equal_full_forward(make_lm, components, n_kv_head):
    model = make_lm(n_kv_head=n_kv_head, **components)
    idx = tokens(2, 16)
    with torch.no_grad():
        full, _ = model(idx)
        cached, cache = decode_in_chunks(model, idx, [6] + [1] * 10)
    assert cache.past_len == 16
    torch.testing.assert_close(cached, full, atol=1e-5, rtol=1e-5)


@HEADS
def test_chunked_decode_equals_full_forward(make_lm, components, n_kv_head):
    # the 3-token chunk after a prefix has more keys than queries: the non-square mask
    model = make_lm(n_kv_head=n_kv_head, **components)
    idx = tokens(2, 12, seed=1)
    with torch.no_grad():
        full, _ = model(idx)
        cached, _ = decode_in_chunks(model, idx, [5, 3, 1, 1, 1, 1])
    torch.testing.assert_close(cached, full, atol=1e-5, rtol=1e-5)


def test_non_square_mask_shape_and_content():
    assert attention_mask(0, 5, 5, 0, "cpu") is None  # plain causal
    assert attention_mask(7, 1, 8, 0, "cpu") is None  # one new token sees every key
    mask = attention_mask(5, 3, 8, 0, "cpu")
    expected = torch.tensor([[1, 1, 1, 1, 1, 1, 0, 0],
                             [1, 1, 1, 1, 1, 1, 1, 0],
                             [1, 1, 1, 1, 1, 1, 1, 1]], dtype=torch.bool)  # [T, past + T]
    assert torch.equal(mask, expected)


@HEADS
def test_greedy_generation_cached_equals_uncached(make_lm, components, n_kv_head):
    model = make_lm(n_kv_head=n_kv_head, ctx_len=16, **components)
    prefix = tokens(1, 5, seed=2)[0].tolist()
    cached = list(generate(model, prefix, 40, temp=0, use_cache=True))
    uncached = list(generate(model, prefix, 40, temp=0, use_cache=False))
    assert len(cached) == 40  # 45 tokens through a 16-token window: several context shifts
    assert cached == uncached


def test_generation_follows_context_shift_rule(make_lm):
    """Uncached greedy generation conditions on the documented window: drop the oldest half."""
    model = make_lm(ctx_len=8)
    prefix = tokens(1, 11, seed=3)[0].tolist()  # longer than the window: starts at len - window
    out = list(generate(model, prefix, 20, temp=0, use_cache=False))
    ids, start = list(prefix), len(prefix) - 8
    with torch.no_grad():
        for expected in out:
            logits, _ = model(torch.tensor([ids[start:]]))
            assert int(logits[0, -1].argmax()) == expected
            ids.append(expected)
            if len(ids) - start > 8:
                start = len(ids) - 4
    assert list(generate(model, prefix, 20, temp=0, use_cache=True)) == out


def test_cache_shapes(make_lm):
    model = make_lm(n_kv_head=2)  # d 32, 4 heads: head_dim 8
    cache = model.new_cache(3, 20)
    assert len(cache) == 2 and all(isinstance(s, KV) for s in cache.states)
    for t in [t for s in cache.states for t in (s.k, s.v)]:
        assert t.shape == (3, 2, 20, 8)  # (B, n_kv_head, T_max, head_dim)
        assert t.dtype == torch.float32
    with torch.no_grad():
        model(tokens(3, 7), cache=cache)
    assert cache.past_len == 7
    assert cache[0].k[:, :, :7].abs().sum() > 0 and cache[0].k[:, :, 7:].abs().sum() == 0


@pytest.mark.parametrize("dtype,nbytes", [(torch.float32, 4), (torch.bfloat16, 2)])
def test_cache_bytes(make_lm, dtype, nbytes):
    L, B, G, T, hd = 2, 3, 2, 20, 8
    cache = make_lm(n_kv_head=G).new_cache(B, T, dtype=dtype)  # d 32, 4 heads: head_dim 8
    assert cache.cache_bytes() == 2 * L * B * G * T * hd * nbytes
    assert cache.cache_bytes() == ModelConfig(d_model=32, n_layer=L, n_kv_head=G).cache_bytes(B, T, nbytes)


def test_kv_cache_bytes_llama_scale():
    llama = {"d_model": 4096, "n_layer": 32, "n_head": 32}  # head_dim 128
    gqa = ModelConfig(**llama, n_kv_head=8).cache_bytes(1, 4096, 2)
    assert gqa == 536_870_912  # 512 MiB
    assert ModelConfig(**llama, n_kv_head=32).cache_bytes(1, 4096, 2) == 4 * gqa


def test_cache_bytes_scale_with_kv_heads(make_lm):
    sizes = {g: make_lm(n_kv_head=g).new_cache(1, 16).cache_bytes() for g in (4, 2, 1)}
    assert sizes[4] == 2 * sizes[2] == 4 * sizes[1]


def test_cache_overflow_raises(make_lm):
    model = make_lm(pos_type="rope")
    cache = model.new_cache(1, 8)
    with torch.no_grad():
        model(tokens(1, 6), cache=cache)
        with pytest.raises(CacheFullError, match="8 positions"):
            model(tokens(1, 3), cache=cache)
        assert cache.past_len == 6  # the failed call wrote nothing
        model(tokens(1, 2), cache=cache)  # exactly full is fine
        with pytest.raises(CacheFullError):
            model(tokens(1, 1), cache=cache)


def test_rope_decode_continues_from_past_len(make_lm):
    model = make_lm(pos_type="rope", ctx_len=16, norm_pos="pre", norm_type="rmsnorm", ffn_type="swiglu",
                    n_kv_head=2)
    idx = tokens(1, 21, seed=4)
    with torch.no_grad():
        full, _ = model(idx)  # 21 tokens, past ctx_len: fine for RoPE
        cache = model.new_cache(1, 24)
        model(idx[:, :20], cache=cache)
        assert cache.past_len == 20
        step, _ = model(idx[:, 20:], cache=cache)  # decodes position 20
        torch.testing.assert_close(step[:, -1], full[:, -1], atol=1e-5, rtol=1e-5)
        # the position matters: the same token and keys, rotated as if at position 0, differ
        cache.past_len = 20
        wrong, _ = model(idx[:, 20:], cache=cache, pos=torch.tensor([0]))
    assert (wrong[:, -1] - full[:, -1]).abs().max() > 1e-2


def test_bf16_cache_on_fp32_model_decodes():
    from anatomy_cli.model import LM
    from anatomy_cli.spec.config import ModelConfig

    model = LM(ModelConfig(vocab_size=20, d_model=16, n_layer=1, n_head=2, n_kv_head=1, ctx_len=8,
                           pos_type="rope")).eval()
    cache = model.new_cache(1, 8, dtype=torch.bfloat16)
    with torch.no_grad():
        logits, _ = model(torch.tensor([[1, 2, 3]]), cache=cache)
        step, _ = model(torch.tensor([[4]]), cache=cache)
    assert cache[0].k.dtype == torch.bfloat16 and step.dtype == torch.float32 and cache.past_len == 4

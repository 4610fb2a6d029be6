"""The mixer interface: layer kinds as data, one mixer table, per-layer decode states in one cache.

What every token mixer (attention today; sliding-window, MLA and Gated DeltaNet layers plug into the
same table) must satisfy: the block gets it from the table by the layer's kind, the LM's cache holds
the state each mixer made, the config's formulas (parameters, state bytes) equal what the modules
allocate, and the container treats every state alike (capacity, nbytes, reset).
"""

from __future__ import annotations

import pytest
import torch
from helpers import LLAMA

from anatomy_cli.model import LM, KVCache
from anatomy_cli.model.kv_cache import CacheFullError
from anatomy_cli.model.mixers import MIXERS, make_mixer
from anatomy_cli.spec.config import ModelConfig, check_pattern, repeat_pattern

pytestmark = [pytest.mark.filterwarnings("error"), pytest.mark.usefixtures("single_thread")]


def test_layer_kinds_default_to_global_attention():
    cfg = ModelConfig(n_layer=6)
    assert cfg.layer_kinds == ("attn",) * 6


@pytest.mark.parametrize("parts", [LLAMA, {**LLAMA, "window": 4, "window_pattern": "GL"}], ids=["attn", "GL"])
def test_each_block_holds_the_mixer_its_kind_names(make_lm, parts):
    model = make_lm(**parts)
    for layer, block in enumerate(model.blocks):
        made = MIXERS[model.cfg.layer_kinds[layer]](model.cfg)
        assert repr(block.attn) == repr(made) == repr(make_mixer(model.cfg, layer))
    assert [b.attn.window for b in model.blocks] == ([0] * 2 if "window" not in parts else [0, 4])


@pytest.mark.parametrize("parts", [{}, LLAMA, {**LLAMA, "qk_norm": True, "parallel_block": True}],
                         ids=["2017", "llama", "llama+qknorm+parallel"])
def test_param_formula_is_a_sum_over_layer_kinds(make_config, parts):
    cfg = make_config(**parts)
    model = LM(cfg)
    for layer, block in enumerate(model.blocks):
        kind = cfg.layer_kinds[layer]
        assert sum(p.numel() for p in block.attn.parameters()) == cfg.mixer_params(kind)
        assert sum(p.numel() for p in block.ffn.parameters()) == cfg.ffn_params()
        assert sum(p.numel() for p in block.parameters()) == cfg.layer_params(kind)
    assert cfg.num_params() == model.num_params()
    assert cfg.active_params() == cfg.num_params()  # dense: every parameter is used by every token


def test_published_counts_hold_for_total_and_active():
    size = {"vocab_size": 1719, "d_model": 128, "n_layer": 4, "n_head": 4, "ctx_len": 128}
    for parts, count in (({}, 1_244_928), (LLAMA, 1_178_496)):
        cfg = ModelConfig(**size, **parts)
        assert cfg.num_params() == cfg.active_params() == count


def test_flops_per_token_sums_each_layers_context_term(make_config):
    cfg = make_config(**LLAMA)
    matmul = cfg.active_params() - cfg.vocab_size * cfg.d_model  # untied: the token table is a lookup
    assert cfg.flops_per_token() == 6 * matmul + 6 * cfg.n_layer * cfg.ctx_len * cfg.d_model


def test_an_unknown_kind_has_no_formula(make_config):
    cfg = make_config()
    for formula in (cfg.mixer_params, cfg.context_flops):
        with pytest.raises(ValueError, match="'nope'"):
            formula("nope")
    with pytest.raises(ValueError, match="'nope'"):
        cfg.state_bytes("nope", 1, 8, 4)


# ------------------------------------------------------------------------- the cache container


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_each_state_is_made_by_its_mixer_and_its_bytes_match_the_formula(make_lm, dtype):
    model = make_lm(**LLAMA)
    cache = model.new_cache(2, 12, dtype=dtype)
    elem = torch.tensor([], dtype=dtype).element_size()
    assert len(cache) == model.cfg.n_layer
    for layer, block in enumerate(model.blocks):
        state = cache[layer]
        assert type(state) is type(block.attn.new_state(2, 12))
        assert cache.layer_bytes()[layer] == state.nbytes() == model.cfg.state_bytes(
            model.cfg.layer_kinds[layer], 2, 12, elem)
    assert cache.cache_bytes() == model.cfg.cache_bytes(2, 12, elem)


class Counter:
    """The smallest state the container accepts: a capacity, bytes, and a reset (a recurrent
    mixer's state looks like this: a fixed-size tensor, any number of positions)."""

    def __init__(self, capacity):
        self.capacity, self.t, self.resets = capacity, torch.zeros(3), 0

    def nbytes(self) -> int:
        return self.t.numel() * self.t.element_size()

    def reset(self) -> None:
        self.resets += 1


def test_container_capacity_is_the_smallest_bounded_state():
    cache = KVCache([Counter(None), Counter(8), Counter(5)])
    assert cache.capacity == 5 and cache.cache_bytes() == 3 * 12
    cache.check_room(5)
    with pytest.raises(CacheFullError, match="5 positions; 0 used, 6 more asked"):
        cache.check_room(6)
    unbounded = KVCache([Counter(None), Counter(None)])
    assert unbounded.capacity is None
    unbounded.advance(10**9)
    unbounded.check_room(10**9)  # nothing limits it


def test_reset_rewinds_past_len_and_resets_every_state():
    states = [Counter(None), Counter(4)]
    cache = KVCache(states)
    cache.advance(3)
    cache.reset()
    assert cache.past_len == 0 and [s.resets for s in states] == [1, 1]


def test_reset_cache_decodes_like_a_fresh_one(make_lm):
    model = make_lm(**LLAMA)
    idx = torch.randint(0, 50, (1, 10), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        cache = model.new_cache(1, 10)
        model(idx[:, :7].flip(1), cache=cache)  # something else first
        cache.reset()
        reused = torch.cat([model(idx[:, :6], cache=cache)[0], model(idx[:, 6:], cache=cache)[0]], 1)
        full, _ = model(idx)
    torch.testing.assert_close(reused, full, atol=1e-5, rtol=1e-5)


# ------------------------------------------------------------------------- layer patterns


def test_repeat_pattern_spells_out_every_layer():
    assert repeat_pattern("LLG", 6) == "LLGLLG"
    assert repeat_pattern("L", 4) == "LLLL"


@pytest.mark.parametrize("pattern,message", [
    ("LLG", "'LLG' has 3 letters, which must divide n_layer=4"),
    ("LXG", "'LXG': use only the letters L, G"),
    ("", "'': use only the letters L, G"),
])
def test_a_bad_pattern_is_one_line(pattern, message):
    with pytest.raises(ValueError, match=message):
        check_pattern("window_pattern", pattern, "LG", 4)


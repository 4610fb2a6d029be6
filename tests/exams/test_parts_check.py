"""The parts battery (exams/parts_check.py): the worked plugins pass it at both ends, and a part broken in
one way fails the check named for that way, with its first failing case, while the others pass.
(tests/model/test_rows.py runs the same battery over every row of anatomy's own table.)"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from anatomy_cli.exams import parts_check as pc
from anatomy_cli.spec import parts as registry
from anatomy_cli.spec.config import RunConfig, validate

pytestmark = [pytest.mark.usefixtures("single_thread")]
EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "parts"

HEAD = textwrap.dedent('''
    import itertools
    import torch
    import torch.nn.functional as F
    from torch import nn
    from anatomy_cli.model.parts import KV, part, visible
    ''')
FFN = textwrap.dedent('''
    @part("broken", slot="ffn", params=lambda cfg, o: 2 * cfg.d_model * 64 + EXTRA(cfg))
    class Broken(nn.Module):
        def __init__(self, cfg):
            super().__init__()
            self.up, self.down = nn.Linear(cfg.d_model, 64, bias=False), nn.Linear(64, cfg.d_model, bias=False)
            INIT
        def forward(self, x, stats=None):
            h = self.up(x).relu()
            BODY
            return self.down(h)
    ''')
ATTENTION = textwrap.dedent('''
    @part("broken", slot="mixer", params=lambda cfg, o: 4 * cfg.d_model * cfg.d_model)
    class Broken(nn.Module):
        """Softmax attention, MHA, whose cached path forgets the cache: each chunk attends to itself only."""
        def __init__(self, cfg):
            super().__init__()
            self.h, self.hd = cfg.n_head, cfg.head_dim
            self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model, bias=False)
            self.out = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        def new_state(self, batch, max_len, device=None, dtype=torch.float32):
            return KV(batch, self.h, max_len, self.hd, device, dtype)
        def forward(self, x, pos, end, rotate, cache=None, layer=0):
            B, T, C = x.shape
            q, k, v = (t.view(B, T, self.h, self.hd).transpose(1, 2) for t in self.qkv(x).split(C, dim=-1))
            q, k = rotate(q, k, pos, end)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=T > 1)  # never reads cache[layer]
            return self.out(y.transpose(1, 2).reshape(B, T, C))
    ''')


def broken_ffn(init: str = "pass", body: str = "pass", extra: str = "0") -> str:
    return HEAD + f"EXTRA = lambda cfg: {extra}\n" + FFN.replace("INIT", init).replace("BODY", body)


BROKEN = {
    # name: (plugin text, the check it must fail, with words of its first failing case)
    "reads the future": (broken_ffn(body="h = h + h.roll(-1, dims=1)  # position t reads t + 1"), "causal",
                         "moved a logit before it"),
    "cache disagrees": (HEAD + ATTENTION, "decode", "differs from the full forward"),
    "dead parameter": (broken_ffn(init="self.spare = nn.Linear(cfg.d_model, cfg.d_model, bias=False)",
                                  extra="cfg.d_model ** 2"), "gradients",
                       "no gradient reaches blocks.0.ffn.spare.weight"),
    "miscounted": (broken_ffn(extra="1"), "params", "broken (ffn) declares 4,097 parameters, its module has 4,096"),
    "not deterministic": (HEAD + "DRAWS = itertools.count()\n" + broken_ffn(
        init="self.scale = nn.Parameter(torch.full((cfg.d_model,), float(next(DRAWS))))", body="h = h",
        extra="cfg.d_model").replace("return self.down(h)", "return self.down(h) * self.scale"),
        "determinism", "differs between two builds under one seed"),
    "breaks in bf16": (broken_ffn(body="h = h * 50 if h.dtype == torch.bfloat16 else h"), "bf16",
                       "bf16 logits are a median"),
}


def load(tmp_path: Path, text: str) -> str:
    path = tmp_path / "broken_part.py"
    path.write_text(text, encoding="utf-8")
    return registry.load_plugins([path])[0].parts[0]


@pytest.mark.parametrize("name", ["relu2", "ssmax"])
def test_the_worked_plugins_pass_every_check_at_both_ends(name):
    done = pc.check_file(EXAMPLES / f"{name}.py")
    results = done.results[name]
    assert not done.failures, done.failures
    assert {(r.check, r.end) for r in results} == {(c, e) for c in pc.CHECKS for e in pc.ENDS}
    assert all(r.status == pc.PASS for r in results), [r for r in results if r.status != pc.PASS]


@pytest.mark.parametrize("case", list(BROKEN))
def test_a_broken_part_fails_the_check_named_for_its_fault(tmp_path, case):
    text, check, words = BROKEN[case]
    results = pc.check_part(load(tmp_path, text))
    failed = {r.check for r in pc.failed(results)}
    assert check in failed, results
    first = next(r for r in pc.failed(results) if r.check == check)
    assert words in first.detail, first
    if case != "reads the future":  # a leak also breaks decoding (a cache cannot hold the future)
        assert failed == {check}, results


def test_a_mixer_without_a_cache_decodes_by_the_full_forward_and_says_so(tmp_path):
    text = (HEAD + ATTENTION).replace('slot="mixer",', 'slot="mixer", cache=False,')
    text = text.replace("    def new_state", "    def _no_state")
    assert "_no_state" in text
    results = pc.check_part(load(tmp_path, text))
    decode = [r for r in results if r.check == "decode"]
    assert [r.status for r in decode] == [pc.NOTE, pc.NOTE] and "no cache declared" in decode[0].detail
    assert not pc.failed(results)
    from anatomy_cli.model.generate import generate

    model = pc.seeded_lm(pc.end_config(registry.REGISTRY["broken"], "llama"))
    assert not model.can_cache and len(list(generate(model, [1, 2, 3], 20, temp=0))) == 20  # past the window too


def test_a_part_that_says_it_cannot_stack_is_a_note(tmp_path):
    text = broken_ffn().replace('slot="ffn",', 'slot="ffn", stack="it reads a host value per token",')
    results = pc.check_part(load(tmp_path, text))
    stack = [r for r in results if r.check == "stack"]
    assert all(r.status == pc.NOTE and "cannot stack: it reads a host value per token" in r.detail for r in stack)


def test_a_part_that_does_not_build_fails_shapes_at_each_end(tmp_path):
    text = broken_ffn(init="assert cfg.pos_type == 'alibi', 'needs alibi positions'")
    results = pc.check_part(load(tmp_path, text))
    assert [r.check for r in pc.failed(results)] == ["shapes", "shapes"]
    assert "the model does not build: AssertionError: needs alibi positions" in pc.failed(results)[0].detail


def test_ablate_s_refusal_names_the_part_and_its_first_failure(tmp_path):
    name = load(tmp_path, BROKEN["reads the future"][0])
    cfg = validate(RunConfig, {"model": {"ffn_type": name, "d_model": 32, "n_head": 4, "ctx_len": 16}})
    with pytest.raises(registry.PartError, match=r"broken \(ffn, from .*broken_part\.py\) fails the causal check, so "
                                                 r"the study would measure a broken part: changing token"):
        pc.refuse_broken([cfg, RunConfig()])
    pc.refuse_broken([RunConfig(), validate(RunConfig, {"model": {"ffn_type": "silu"}})])  # anatomy's own: nothing


def test_a_part_whose_forward_returns_the_wrong_shape_is_refused_when_built(tmp_path):
    name = load(tmp_path, broken_ffn().replace("return self.down(h)", "return h"))
    with pytest.raises(registry.PartError, match=r"part broken \(ffn, from .*\): its forward returned \[1, 3, 64\] for "
                                                 r"a \[1, 3, 32\] input \(a part returns its input's shape\)"):
        pc.seeded_lm(pc.end_config(registry.REGISTRY[name], "2017"))
    results = pc.check_part(name)
    assert pc.failed(results)[0].check == "shapes" and "its forward returned" in pc.failed(results)[0].detail

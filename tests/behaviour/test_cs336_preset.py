"""The CS336 preset (experiments/cs336.toml): the handout's low-resource TinyStories model and its four
ablations, planned as the handout states them, and a shortened run of it on local text (no network here)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import invoke

from anatomy_cli.sweep.plan import load_plan

SPEC = Path(__file__).parents[2] / "experiments" / "cs336.toml"
IDS = [  # the plan's run ids, pinned: a change that moves them moves every result of the preset
    "reference-s1337-f3e2fdb9", "reference-s1338-cea4f0b0", "reference-s1339-2c668323",
    "reference+nonorm-s1337-a675840f", "reference+nonorm-s1338-37d129b0", "reference+nonorm-s1339-a2e16d7a",
    "reference+postnorm-s1337-eeb16ab1", "reference+postnorm-s1338-802c4f86", "reference+postnorm-s1339-8dc72dcb",
    "reference+nope-s1337-c783088c", "reference+nope-s1338-1df9705b", "reference+nope-s1339-b32e5663",
    "reference+silu-s1337-1dc6b150", "reference+silu-s1338-814697a3", "reference+silu-s1339-981d2c3e",
]


def test_the_preset_plans_the_handouts_model_and_its_four_ablations():
    spec, plan = load_plan(SPEC)
    assert [p.run_id for p in plan] == IDS
    base = plan[0].config
    m, t, d = base.model, base.train, base.data
    assert (m.n_layer, m.d_model, m.ffn_hidden, m.n_head, m.n_kv_head, m.ctx_len) == (4, 512, 1344, 16, 16, 256)
    assert (m.norm_type, m.norm_pos, m.pos_type, m.ffn_type) == ("rmsnorm", "pre", "rope", "swiglu")
    assert d.tokenizer == "bpe:10000" and t.batch_size * t.steps * m.ctx_len == 32 * 5000 * 256
    ablated = {p.flip: p.config.model for p in plan if p.flip}
    assert set(ablated) == {"nonorm", "postnorm", "nope", "silu"}
    assert ablated["nonorm"].norm_type == "none" and ablated["postnorm"].norm_pos == "post"
    assert ablated["nope"].pos_type == "nope" and ablated["silu"].ffn_type == "silu"
    for flip, model in ablated.items():  # each ablation changes its own part, nothing else
        changed = {k for k, v in model.model_dump().items() if v != m.model_dump()[k]}
        assert changed == {"nonorm": {"norm_type"}, "postnorm": {"norm_pos"}, "nope": {"pos_type"},
                           "silu": {"ffn_type"}}[flip]
    assert ablated["silu"].ffn_hidden == 2016  # 3/2 of d_ff: SiLU's two matrices hold SwiGLU's three's weights
    silu = ablated["silu"].model_copy(update={"vocab_size": 10000})
    assert silu.num_params() == m.model_copy(update={"vocab_size": 10000}).num_params()


@pytest.mark.slow
def test_a_shortened_run_of_the_preset_on_local_text(tmp_path):
    """The preset as it is, its data a local text and its sizes cut to toy ones by --set: every ablation trains
    at bpe:300 and the report judges it in bits per byte."""
    text = tmp_path / "stories.txt"
    words = "once upon a time there was a little girl named lily she liked to play with her dog".split()
    text.write_text("\n\n".join(" ".join(words[(i * 7 + j) % len(words)] for j in range(50)) for i in range(150)))
    sets = {"base.data.source": text, "base.data.tokenizer": "bpe:300", "base.model.d_model": 32,
            "base.model.n_head": 2, "base.model.n_kv_head": 2, "base.model.d_ff": 64, "base.model.ctx_len": 32,
            "base.train.batch_size": 4, "base.train.warmup": 2, "base.train.eval_interval": 3,
            "base.train.eval_batches": 2, "base.train.sample_len": 0}
    args = [a for k, v in sets.items() for a in ("--set", f"{k}={v}")]
    result = invoke("ablate", SPEC, *args, "--steps", 6, "--seeds", 1, "--workers", 1, "--runs-dir", tmp_path / "runs")
    assert result.exit_code == 0, result.output
    runs = sorted((tmp_path / "runs" / "cs336").glob("reference*/summary.json"))
    assert sorted(p.parent.name.rsplit("-s", 1)[0] for p in runs) == [
        "reference", "reference+nonorm", "reference+nope", "reference+postnorm", "reference+silu"]
    for path in runs:
        summary = json.loads(path.read_text())
        assert summary["status"] == "completed" and summary["best_val_bpb"] > 0
        config = json.loads((path.parent / "config.json").read_text())
        assert config["data"]["tokenizer"] == "bpe:300" and config["model"]["d_ff"] == 64

"""Acceptance checks of the 2025 parts through the CLI (issue 29): sinks, gattn, partrope, dsa and
DeepSeek-V3's router (model.moe_router = "deepseek", inside the moe row).

  components      lists each part with its parameter delta, in the table and in --json
  bench-decode    a row per part, its decode state at 4k and 32k positions = ModelConfig.state_bytes
                  (dsa's holds the indexer's keys on top of MLA's latent and rope key)
  train/sample    a tiny trained run of each part samples, cached == uncached (greedy)
  export          refuses each part by name, in one line, exit 2, writing nothing
  bad input       one line, exit 2: dsa_top_k > ctx_len, rope_fraction leaving an odd rotated count

Checked elsewhere, not repeated here: the same bad settings at validate() (tests/model/test_dsa.py
test_bad_settings_are_refused_in_one_line, tests/model/test_attention.py test_bad_settings_are_one_line),
a non-whole rope_fraction on the CLI (tests/model/test_attention.py
test_bad_rope_fraction_exits_2_with_one_line) and moe_router on a dense model on the CLI
(tests/model/test_moe_router.py test_bad_router_settings_exit_2_on_the_cli); check_llama_shaped's refusals
(tests/model/test_attention.py test_export_refuses_each_part_by_name, tests/model/test_dsa.py
test_component_row_and_export_refusal).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import LLAMA, flat, invoke, one_error_line
from toy_data import TINY_MODEL, TINY_TRAIN, write_corpus

from anatomy_cli.spec.config import ModelConfig

NEW_PARTS = ("sinks", "gattn", "partrope", "dsa")
# Each tiny run: the LLaMA end (GQA 4 -> 2) with one part on. The deepseek router needs moe and no balance loss.
RUNS = {
    "sinks": {"model.attn_sinks": True},
    "gattn": {"model.attn_gate": True},
    "partrope": {"model.rope_fraction": 0.25},  # head_dim 8: 2 dims rotate
    "dsa": {"model.attn_type": "mla", "model.dsa": True},  # top-k ctx/4 = 4 of 16
    "deepseek": {"model.moe": True, "model.moe_router": "deepseek", "train.moe_aux_loss": 0.0},
}
REFUSED = {"sinks": "attention sinks (sinks)", "gattn": "gated attention output (gattn)",
           "partrope": "partial RoPE (partrope)", "dsa": "sparse latent attention (dsa)",
           "deepseek": "mixture of experts (moe)"}  # the router is a setting of the moe row


def sets(corpus: Path, settings: dict) -> list[str]:
    """--set options: the tiny LLaMA end on `corpus`, a few steps, `settings` over it."""
    train = {**TINY_TRAIN, "steps": 4, "eval_interval": 2, "sample_len": 0, "threads": 1}
    merged = {"data.source": str(corpus), **{f"model.{k}": v for k, v in {**TINY_MODEL, **LLAMA}.items()},
              **{f"train.{k}": v for k, v in train.items()}, **settings}
    return [f"--set={k}={json.dumps(v)}" for k, v in merged.items()]


@pytest.fixture(scope="module")
def part_runs(tmp_path_factory) -> dict[str, Path]:
    """One tiny trained run per part, through `anatomy train`."""
    root = tmp_path_factory.mktemp("parts")
    corpus = write_corpus(root, 3000)
    out = {}
    for name, settings in RUNS.items():
        result = invoke("train", *sets(corpus, settings), "--out", root / name)
        assert result.exit_code == 0, result.output
        out[name] = root / name
    return out


# --------------------------------------------------------------------------- components


def test_components_lists_each_new_part_with_its_parameter_delta():
    result = invoke("components", "--json")
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    rows = {r["name"]: r for r in out["components"]}
    size = out["reference_size"]
    llama = ModelConfig(**{**size, **LLAMA})  # GQA: 2 of its 4 heads
    L, H, d = size["n_layer"], size["n_head"], size["d_model"]
    expected = {"sinks": L * H, "gattn": L * d * d, "partrope": 0,  # a logit per head; q_proj's gate half; no weights
                "dsa": ModelConfig(**{**llama.model_dump(), "attn_type": "mla", "dsa": True}).num_params()
                - llama.num_params()}
    for name in NEW_PARTS:
        assert rows[name]["params_from_llama"] == expected[name], name
        assert rows[name]["active_from_llama"] == expected[name], name
    assert expected["dsa"] > ModelConfig(**{**llama.model_dump(), "attn_type": "mla"}).num_params() - llama.num_params()
    table = invoke("components", "--wide")
    assert table.exit_code == 0, table.output
    text = flat(table.stdout)
    for name in NEW_PARTS:
        assert f"{name} " in text and f"{rows[name]['params_from_2017']:+,}" in text, name


# --------------------------------------------------------------------------- bench-decode

TOY_BENCH = ["bench-decode", "--d-model", 32, "--n-layer", 2, "--n-head", 4, "--ctx", 64, "--new", 2,
             "--prefix-len", 4]


def test_bench_decode_has_a_row_per_part_with_its_state_at_4k_and_32k(single_thread):
    result = invoke(*TOY_BENCH, "--kv-heads", "mla,dsa,sinks,gattn,partrope", "--json")
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    rows = {r["attention"]: r for r in out["rows"]}
    assert list(rows) == ["MLA", "DSA", "MHA+sinks", "MHA+gattn", "MHA+partrope"]
    base = {"vocab_size": 96, "d_model": 32, "n_layer": 2, "n_head": 4, "ctx_len": 64, **LLAMA, "n_kv_head": 4}
    configs = {"MLA": {"attn_type": "mla"}, "DSA": {"attn_type": "mla", "dsa": True},
               "MHA+sinks": {"attn_sinks": True}, "MHA+gattn": {"attn_gate": True},
               "MHA+partrope": {"rope_fraction": 0.25}}
    T = out["window"]
    for name, r in rows.items():
        cfg = ModelConfig(**base, **configs[name])
        assert r["same_output"], name  # cached greedy decode == uncached
        assert r["kv_cache_bytes"] == r["kv_formula_bytes"] == cfg.cache_bytes(1, T, 4), name  # measured == formula
        assert [at["positions"] for at in r["long_context"]] == [4096, 32768]
        for at in r["long_context"]:
            kind = cfg.layer_kinds[0]
            assert at["per_layer"] == {kind: cfg.state_bytes(kind, 1, at["positions"], 4)}, name
            assert at["total"] == cfg.cache_bytes(1, at["positions"], 4) == 2 * at["per_layer"][kind], name
    r, p, D = 16, 4, 8  # latent d/2, rope key hd/2, indexer key head_dim
    assert rows["DSA"]["latent"] == f"{r}+{p}+{D}" and rows["DSA"]["top_k"] == 16
    assert rows["DSA"]["kv_bytes_per_token"] == 2 * (r + p + D) * 4  # MLA's latent and rope key + the indexer's key
    assert rows["DSA"]["kv_bytes_per_token"] - rows["MLA"]["kv_bytes_per_token"] == 2 * D * 4
    at32k = rows["DSA"]["long_context"][1]
    assert at32k["per_layer"]["dsa"] == 32768 * (r + p + D) * 4
    for part in ("sinks", "gattn", "partrope"):  # none of the three changes the decode state
        assert rows[f"MHA+{part}"]["part"] == part
        assert rows[f"MHA+{part}"]["kv_bytes_per_token"] == 2 * 2 * 4 * 8 * 4
    table = invoke(*TOY_BENCH, "--kv-heads", "dsa,sinks")
    assert table.exit_code == 0, table.output
    assert "DSA" in table.stdout and "top-k 16" in flat(table.stdout) and "MHA+sinks" in flat(table.stdout)


def test_bench_decode_default_rows_leave_out_a_part_the_sizes_cannot_take(single_thread):
    """At head_dim 4 a quarter is 1 dim, which RoPE cannot turn: the default list notes it; asked by
    name, it is an error."""
    args = ["bench-decode", "--d-model", 16, "--n-layer", 1, "--n-head", 4, "--ctx", 16, "--new", 1,
            "--prefix-len", 2]
    result = invoke(*args, "--json")
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert [r["attention"] for r in out["rows"]] == ["MHA", "GQA", "MQA", "MLA", "DSA", "MHA+sinks", "MHA+gattn"]
    assert "no partrope row" in out["note"] and "rotates 1 dims" in out["note"]
    one_error_line(invoke(*args, "--kv-heads", "partrope"), "--kv-heads partrope: ", alone=True)


# --------------------------------------------------------------------------- trained runs


@pytest.mark.slow
def test_bench_decode_of_a_dsa_run_keeps_its_weights_and_sizes(part_runs, single_thread):
    result = invoke("bench-decode", part_runs["dsa"], "--new", 2, "--prefix-len", 4, "--kv-heads", "2,mla,dsa",
                    "--json")
    assert result.exit_code == 0, result.output
    gqa, mla, dsa = json.loads(result.stdout)["rows"]
    assert [r["weights"] for r in (gqa, mla, dsa)] == ["untrained (same sizes)"] * 2 + ["trained (run)"]
    assert (gqa["attention"], mla["attention"], dsa["attention"]) == ("GQA", "MLA", "DSA")
    assert dsa["top_k"] == 4 and all(r["same_output"] for r in (gqa, mla, dsa))
    assert dsa["kv_bytes_per_token"] - mla["kv_bytes_per_token"] == 2 * 8 * 4  # the indexer's key, 2 layers


@pytest.mark.slow
@pytest.mark.parametrize("name", list(RUNS))
def test_sample_works_on_a_tiny_run_of_each_part(part_runs, name):
    cached = invoke("sample", part_runs[name], "--temp", 0, "--max-new", 12, "--prefix", "the ", "--threads", 1)
    assert cached.exit_code == 0, cached.output
    uncached = invoke("sample", part_runs[name], "--temp", 0, "--max-new", 12, "--prefix", "the ", "--threads", 1,
                      "--no-cache")
    assert uncached.exit_code == 0, uncached.output
    assert cached.stdout.strip() and cached.stdout == uncached.stdout


@pytest.mark.slow
@pytest.mark.parametrize("name", list(RUNS))
def test_export_refuses_each_part_by_name(part_runs, name, tmp_path):
    result = invoke("export", part_runs[name], "--to", "hf", tmp_path / "hf")
    one_error_line(result, REFUSED[name], alone=True)
    assert not (tmp_path / "hf").exists()


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("settings, message", [
    ({"model.attn_type": "mla", "model.dsa": True, "model.dsa_top_k": 17}, "dsa_top_k=17 is larger than ctx_len=16"),
    # head_dim 16 (d 64): a sixteenth rotates 1 dim, a whole but odd number
    ({"model.d_model": 64, "model.rope_fraction": 0.0625}, "rotates 1 dims: it must be a whole even number"),
])
def test_bad_part_settings_exit_2_in_one_line(tmp_path, settings, message):
    corpus = write_corpus(tmp_path, 1000)
    result = invoke("train", *sets(corpus, settings), "--out", tmp_path / "o")
    one_error_line(result, message, alone=True)
    assert not (tmp_path / "o").exists()

"""Exams at toy sizes: length extrapolation, depth stability, decode cost and KV budgets.

Two tiny runs (learned positions and RoPE, ctx_len 16, 10 steps) are trained once per module on
a synthetic corpus; tests that write eval.json work on copies so they stay order-independent.
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import PATIENCE, invoke, one_error_line

from anatomy_cli.exams import decode, kv_budget, lengths, stability
from anatomy_cli.model.positions import PositionError
from anatomy_cli.report.frames import load_runs
from anatomy_cli.spec.components import label
from anatomy_cli.spec.config import AblationSpec, ConfigError, ModelConfig, RunConfig, load_toml, validate
from anatomy_cli.store import runs
from anatomy_cli.sweep.plan import execute, expand
from anatomy_cli.training.run import train

SPEC = Path(__file__).resolve().parents[2] / "experiments" / "depth-stability.toml"
CTX = 16
GQA_BYTES = 536_870_912  # 2 x 32 layers x B 1 x G 8 x T 4096 x hd 128 x 2 bytes (bf16)
LLAMA_ISH = {"num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
             "hidden_size": 4096, "head_dim": 128}


@pytest.fixture(scope="module")
def threads_1():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    words = ["norm", "rope", "gate", "head", "cache", "layer", "token", "loss"]
    text = "\n".join(f"the {words[i % 8]} of {words[(3 * i) % 8]} is {i % 13}." for i in range(900))
    path = tmp_path_factory.mktemp("corpus") / "text.txt"
    path.write_text(text, encoding="utf-8")
    return path


def tiny_config(corpus: Path, name: str, **model) -> RunConfig:
    return RunConfig.model_validate({
        "name": name, "seed": 1,
        "model": {"d_model": 32, "n_layer": 2, "n_head": 4, "n_kv_head": 4, "ctx_len": CTX, **model},
        "train": {"steps": 10, "batch_size": 8, "lr": 3e-3, "warmup": 2, "eval_interval": 5, "eval_batches": 2,
                  "log_interval": 5, "sample_len": 0, "device": "cpu", "threads": 1},
        "data": {"source": str(corpus)},
    })


@pytest.fixture(scope="module")
def trained(tmp_path_factory, corpus, threads_1) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("runs")
    out = {}
    for pos in ("learned", "rope"):
        summary = train(tiny_config(corpus, pos, pos_type=pos), root / pos)
        assert summary["status"] == runs.COMPLETED
        out[pos] = root / pos
    return out


@pytest.fixture
def run_copy(trained, tmp_path):
    def copy(pos: str, dest: Path | None = None) -> Path:
        return Path(shutil.copytree(trained[pos], dest or tmp_path / pos))

    return copy


# --------------------------------------------------------------------------- 1. length extrapolation


def test_parse_ctx_list():
    assert lengths.parse_ctx_list("128, 256,512") == [(128, False), (256, False), (512, False)]
    assert lengths.parse_ctx_list("1x,2X,4x") == [(1, True), (2, True), (4, True)]
    assert lengths.resolve_lengths(lengths.parse_ctx_list("1x,32,2x"), 16) == [16, 32]


@pytest.mark.parametrize("bad", ["abc", "0", "", "128,,256", "-4", "2.5x", "0x", "x"])
def test_parse_ctx_list_rejects(bad):
    with pytest.raises(ConfigError, match="--ctx expects"):
        lengths.parse_ctx_list(bad)


def test_learned_positions_refuse_past_ctx_len(trained):
    result = lengths.eval_lengths(trained["learned"], lengths.parse_ctx_list("16,32,64"))
    losses, notes = result["val_loss_by_ctx"], result["notes"]
    assert math.isfinite(losses["16"])
    assert losses["32"] is None and losses["64"] is None
    assert notes["32"] == notes["64"] == "n/a (learned table ends at ctx_len=16)"
    assert "16" not in notes and result["pos_type"] == "learned" and result["ctx_len"] == CTX


def test_learned_positions_raise_in_the_library(trained):
    from anatomy_cli.training.checkpoint import load_run

    cfg, _, model = load_run(trained["learned"])
    corpus = lengths.run_corpus(cfg, trained["learned"])
    with pytest.raises(PositionError, match="ctx_len=16"):
        lengths.val_loss_at(model, corpus.val, 2 * CTX, 2, 1)


def test_rope_evaluates_at_2x_and_4x(trained):
    result = lengths.eval_lengths(trained["rope"], lengths.parse_ctx_list("1x,2x,4x"))
    losses = result["val_loss_by_ctx"]
    assert list(losses) == ["16", "32", "64"]
    assert all(v is not None and math.isfinite(v) for v in losses.values()), losses
    assert result["notes"] == {}


@pytest.mark.parametrize("pos", ["learned", "rope"])
def test_loss_at_ctx_len_reproduces_best_val_loss(trained, pos):
    # same fixed windows, batch size and batch count as training's evaluation, best weights
    result = lengths.eval_lengths(trained[pos], [(1, True)])
    best = runs.read_summary(trained[pos])["best_val_loss"]
    assert result["val_loss_by_ctx"]["16"] == pytest.approx(best, abs=1e-5)


def test_val_split_too_short_is_a_note_not_a_crop(trained):
    n_val = len(lengths.run_corpus(RunConfig.model_validate(runs.read_json(trained["rope"] / "config.json")),
                                 trained["rope"]).val)
    result = lengths.eval_lengths(trained["rope"], [(16, False), (n_val, False)])
    assert math.isfinite(result["val_loss_by_ctx"]["16"])
    assert result["val_loss_by_ctx"][str(n_val)] is None
    assert f"val split has {n_val:,} ids" in result["notes"][str(n_val)]


def test_eval_cli_writes_eval_json_and_the_report_column(run_copy):
    run = run_copy("learned")
    result = invoke("eval", run, "--ctx", "16,32", "--json")
    assert result.exit_code == 0, result.output
    printed = json.loads(result.stdout)["runs"][0]
    saved = json.loads((run / "eval.json").read_text())
    assert saved["val_loss_by_ctx"]["32"] is None and math.isfinite(saved["val_loss_by_ctx"]["16"])
    assert saved["ctx_len"] == CTX and saved["pos_type"] == "learned"
    assert saved["notes"]["32"].startswith("n/a (learned table ends at ctx_len")
    assert printed["val_loss_by_ctx"] == saved["val_loss_by_ctx"]
    frame, _ = load_runs(run)
    assert math.isfinite(frame["val_loss_ctx_16"].iloc[0]) and math.isnan(frame["val_loss_ctx_32"].iloc[0])
    table = invoke("eval", run, "--ctx", "16,32")
    assert table.exit_code == 0 and "n/a (learned table ends" in " ".join(table.stdout.split())


def test_eval_json_merges_lengths_measured_with_the_same_settings(run_copy):
    run = run_copy("rope")
    assert invoke("eval", run, "--ctx", "16").exit_code == 0
    assert invoke("eval", run, "--ctx", "64").exit_code == 0
    assert list(json.loads((run / "eval.json").read_text())["val_loss_by_ctx"]) == ["16", "64"]
    assert invoke("eval", run, "--ctx", "32", "--batches", "1").exit_code == 0  # other settings: replaced
    assert list(json.loads((run / "eval.json").read_text())["val_loss_by_ctx"]) == ["32"]


def test_eval_a_sweep_dir_gives_a_report_column_per_length(run_copy, tmp_path):
    sweep = tmp_path / "sweep"
    run_copy("learned", sweep / "learned")
    run_copy("rope", sweep / "rope")
    failed = sweep / "failed"
    failed.mkdir()
    runs.atomic_write_json(failed / "config.json", runs.read_json(sweep / "rope" / "config.json"))
    runs.atomic_write_json(failed / "summary.json", {"status": "failed"})
    result = invoke("eval", sweep, "--ctx", "1x,2x,4x", "--json")
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert sorted(Path(r["run_dir"]).name for r in out["runs"]) == ["learned", "rope"]
    assert out["skipped"] == [{"run_dir": str(failed), "status": "failed"}]
    frame, _ = load_runs(sweep)
    frame = frame.set_index("run_id")
    assert {"val_loss_ctx_16", "val_loss_ctx_32", "val_loss_ctx_64"} <= set(frame.columns)
    assert frame.loc["rope", ["val_loss_ctx_32", "val_loss_ctx_64"]].notna().all()
    assert frame.loc["learned", ["val_loss_ctx_32", "val_loss_ctx_64"]].isna().all()


@pytest.mark.parametrize("ctx", ["abc", "0", "16,-1"])
def test_eval_bad_ctx_exits_2(trained, ctx):
    one_error_line(invoke("eval", trained["rope"], "--ctx", ctx), "--ctx expects", alone=True)


def test_eval_missing_run_dir_exits_2(tmp_path):
    one_error_line(invoke("eval", tmp_path / "nope"), "not found", alone=True)
    one_error_line(invoke("eval", tmp_path), "no runs under", alone=True)


# --------------------------------------------------------------------------- 2. depth stability


def test_depth_stability_spec_flips_only_the_norm_position():
    spec = validate(AblationSpec, load_toml(SPEC))
    base = spec.base
    assert spec.design == "list" and len(spec.seed_list) == 3
    assert base.model.n_layer == 12 and base.train.warmup == 0 and base.train.grad_clip == 0
    assert label(base) == "2017"  # every other part at its 2017 value
    plan = expand(spec)
    assert len(plan) == 6
    assert {label(p.config) for p in plan} == {"2017", "prenorm"}
    assert {p.config.model.norm_pos for p in plan} == {"post", "pre"}
    without_norm_pos = {json.dumps({**p.config.model.model_dump(), "norm_pos": None}) for p in plan}
    assert len(without_norm_pos) == 1


def test_depth_stability_tiny_sweep_gives_grad_norms_and_a_table(corpus, tmp_path, threads_1):
    data = load_toml(SPEC)
    data["base"]["model"] |= {"d_model": 16, "ctx_len": 16}
    data["base"]["train"] |= {"batch_size": 4, "eval_interval": 4, "eval_batches": 1, "log_interval": 4,
                              "sample_len": 0, "device": "cpu", "threads": 1, "steps": 8}
    data["base"]["data"] = {"source": str(corpus)}
    plan = expand(validate(AblationSpec, data))
    try:
        execute(plan, tmp_path / "sweep", workers=1)
    finally:
        torch.set_num_threads(1)
    for p in plan:
        metrics = runs.read_metrics(tmp_path / "sweep" / p.run_id)
        norms = [m["grad_norm"] for m in metrics if "grad_norm" in m]
        assert len(norms) == 8 and all(n > 0 for n in norms)
    table = stability.stability_table(load_runs(tmp_path / "sweep")[0])
    assert list(table.columns) == stability.STABILITY_COLUMNS
    assert sorted(table["label"]) == ["2017", "prenorm"]
    assert table["n_runs"].tolist() == [3, 3]
    assert (table["max_grad_norm"] > 0).all()
    result = invoke("stability", tmp_path / "sweep", "--json")
    assert result.exit_code == 0, result.output
    assert {r["label"] for r in json.loads(result.stdout)["stability"]} == {"2017", "prenorm"}
    assert invoke("stability", tmp_path / "sweep").exit_code == 0


def test_stability_table_counts_by_label():
    import pandas as pd

    frame = pd.DataFrame({
        "label": ["2017", "2017", "prenorm"], "status": ["completed", "diverged", "completed"],
        "loss_spikes": pd.array([1, 5, 0], dtype="Int64"), "max_grad_norm": [3.0, 90.0, 1.5],
        "best_val_loss": [2.0, 1.0, 1.8],
    })
    table = stability.stability_table(frame).set_index("label")
    assert table.loc["2017", "diverged"] == 1 and table.loc["prenorm", "diverged"] == 0
    assert table.loc["2017", "loss_spikes_mean"] == 3.0 and table.loc["2017", "max_grad_norm"] == 90.0
    assert table.loc["2017", "best_val_loss_mean"] == 2.0  # completed runs only


def test_stability_missing_dir_exits_2(tmp_path):
    one_error_line(invoke("stability", tmp_path / "nope"), alone=True)


# --------------------------------------------------------------------------- 3. decode cost


def test_bench_decode_cache_bytes_match_the_formula(threads_1):
    result = invoke("bench-decode", "--d-model", 32, "--n-layer", 2, "--n-head", 4, "--ctx", 64,
                    "--new", 6, "--prefix-len", 10, "--kv-heads", "4,2,1", "--json")  # mla: tests/model/test_mla.py
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["note"] is None and out["window"] == 16
    assert [(r["attention"], r["n_kv_head"]) for r in out["rows"]] == [("MHA", 4), ("GQA", 2), ("MQA", 1)]
    L, B, T, hd, nbytes = 2, 1, 16, 8, 4
    for r in out["rows"]:
        assert r["kv_cache_bytes"] == r["kv_formula_bytes"] == 2 * L * B * r["n_kv_head"] * T * hd * nbytes
        assert r["kv_bytes_per_token"] == 2 * L * r["n_kv_head"] * hd * nbytes
        assert r["same_output"] and r["weights"] == "untrained (same sizes)"
        assert r["decode_tok_s_cached"] > 0 and r["decode_tok_s_uncached"] > 0 and r["prefill_tok_s"] > 0
        assert r["model_cache_bytes"] == r["param_bytes"] + r["kv_cache_bytes"] and r["peak_rss_bytes"] > 0


def test_bench_decode_run_dir_caps_learned_positions(trained, threads_1):
    result = invoke("bench-decode", trained["learned"], "--new", 40, "--prefix-len", 64, "--kv-heads", "4,1", "--json")
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["window"] <= CTX and "capped at ctx_len=16" in out["note"]
    assert [r["weights"] for r in out["rows"]] == ["trained (run)", "untrained (same sizes)"]
    table = invoke("bench-decode", trained["rope"], "--new", 4, "--prefix-len", 40)  # RoPE: past ctx_len, no cap
    assert table.exit_code == 0 and "note:" not in table.stdout


@pytest.mark.parametrize("args, message", [
    (["--kv-heads", "3"], "must divide n_head"),
    (["--kv-heads", "abc"], "--kv-heads expects"),
    (["--new", "0"], "must be >= 1"),
    (["--parts", "gpt"], "--parts must be"),
    (["--n-head", "3"], "n_head=3 must divide"),
])
def test_bench_decode_bad_options_exit_2(args, message):
    one_error_line(invoke("bench-decode", "--d-model", 32, "--n-layer", 1, *args), message, alone=True)


def test_bench_decode_bad_run_dir_exits_2(trained, tmp_path):
    one_error_line(invoke("bench-decode", tmp_path / "nope"), "not found", alone=True)
    one_error_line(invoke("bench-decode", trained["rope"], "--d-model", 64), "size options", alone=True)


# --------------------------------------------------------------------------- 4. KV budget


def check_worked_example(out: dict) -> None:
    rows = {r["attention"]: r for r in out["rows"]}
    assert rows["GQA"]["bytes"] == GQA_BYTES and rows["GQA"]["is_config"]
    assert rows["MHA"]["bytes"] == 4 * GQA_BYTES == 2 * 1024**3
    assert rows["MQA"]["bytes"] * 8 == GQA_BYTES
    assert rows["GQA"]["human"] == "512.0 MiB" and rows["MHA"]["human"] == "2.00 GiB"
    assert rows["GQA"]["ratio_to_mha"] == 0.25


def test_kv_budget_worked_example_via_options():
    result = invoke("kv-budget", "--layers", 32, "--heads", 32, "--kv-heads", 8, "--head-dim", 128,
                    "--seq", 4096, "--batch", 1, "--dtype", "bf16", "--json")
    assert result.exit_code == 0, result.output
    check_worked_example(json.loads(result.stdout))
    table = invoke("kv-budget", "--layers", 32, "--heads", 32, "--kv-heads", 8, "--head-dim", 128)
    assert "536,870,912" in table.stdout and "2,147,483,648" in table.stdout


def test_kv_budget_worked_example_via_config_json(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(LLAMA_ISH))
    for path in (tmp_path / "config.json", tmp_path):  # the file or its folder
        result = invoke("kv-budget", "--config", path, "--seq", 4096, "--dtype", "bf16", "--json")
        assert result.exit_code == 0, result.output
        check_worked_example(json.loads(result.stdout))


def test_kv_budget_config_defaults_and_overrides(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 64}))
    shape = kv_budget.attn_shape(path)
    assert (shape.kv_heads, shape.head_dim) == (4, 16)  # kv heads default to heads, head_dim to hidden/heads
    assert kv_budget.attn_shape(path, kv_heads=2).kv_heads == 2
    nested = tmp_path / "mm.json"
    nested.write_text(json.dumps({"model_type": "x", "text_config": LLAMA_ISH}))
    assert kv_budget.attn_shape(nested).kv_heads == 8
    fp8 = kv_budget.kv_budget(kv_budget.attn_shape(tmp_path / "mm.json"), 4096, 1, "fp8")
    assert [r["bytes"] for r in fp8["rows"]] == [GQA_BYTES * 2, GQA_BYTES // 2, GQA_BYTES // 16]


@pytest.mark.parametrize("content, message", [
    ("{not json", "not a valid JSON config"),
    ("[1, 2]", "expected a JSON object"),
    ('{"num_attention_heads": 32, "hidden_size": 4096}', "missing --layers"),
    ('{"num_hidden_layers": 2, "num_attention_heads": "32", "hidden_size": 64}', "must be an integer"),
    ('{"num_hidden_layers": 2, "num_attention_heads": 32, "num_key_value_heads": 5, "head_dim": 8}', "must divide"),
])
def test_kv_budget_corrupt_config_exits_2(tmp_path, content, message):
    path = tmp_path / "config.json"
    path.write_text(content)
    one_error_line(invoke("kv-budget", "--config", path), message, alone=True)


def test_kv_budget_bad_inputs_exit_2(tmp_path):
    one_error_line(invoke("kv-budget", "--config", tmp_path / "none.json"), "config not found", alone=True)
    one_error_line(invoke("kv-budget", "--layers", 2), "missing", alone=True)
    one_error_line(invoke("kv-budget", "--layers", 2, "--heads", 2, "--head-dim", 8, "--dtype", "int4"),
                   "--dtype must be", alone=True)


@pytest.mark.process
def test_kv_budget_never_imports_torch(tmp_path):
    code = ("import sys; from typer.testing import CliRunner; from anatomy_cli.cli.main import app; "
            "r = CliRunner().invoke(app, ['kv-budget', '--layers', '32', '--heads', '32', '--kv-heads', '8', "
            "'--head-dim', '128', '--json']); assert r.exit_code == 0, r.output; "
            "print(sorted(m for m in ('torch', 'pandas') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=PATIENCE)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("pos_type", ["learned", "rope", "nope"])
def test_every_position_limit_is_model_max_positions(pos_type):
    """Sampling windows, eval lengths and decode lengths all ask ModelConfig.max_positions: a learned
    table ends at ctx_len, RoPE and NoPE do not end (None)."""
    from anatomy_cli.model.generate import SampleError, check_options

    cfg = ModelConfig(vocab_size=50, d_model=32, n_head=4, n_kv_head=4, ctx_len=16, pos_type=pos_type)
    bounded = pos_type == "learned"
    assert cfg.max_positions == (16 if bounded else None)
    assert (lengths.length_problem(cfg, 17, 10_000) is not None) is bounded
    assert lengths.length_problem(cfg, 16, 10_000) is None
    assert (decode.decode_lengths(cfg, 10, 10)[2] is not None) is bounded
    if bounded:
        with pytest.raises(SampleError, match="ends at ctx_len=16"):
            check_options(cfg, 0.8, None, 17)
    else:
        assert check_options(cfg, 0.8, None, 17) == 17

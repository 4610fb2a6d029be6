"""What a study pairs (issue 37, causes 2, 3 and 10): a study never mixes corpora, a flip that changes nothing is not
measured, and one policy for knobs that do nothing (a default is never the reason for a refusal).

Each test failed on the code before its fix."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from helpers import LLAMA, invoke, one_error_line, run_sets
from toy_data import TINY_MODEL, TINY_TRAIN, write_corpus, write_spec

from anatomy_cli.report import effects as effects_mod
from anatomy_cli.report import stats
from anatomy_cli.report.frames import load_runs
from anatomy_cli.spec.config import ConfigError, RunConfig, validate
from anatomy_cli.store import runs
from anatomy_cli.sweep import plan as plan_mod

VOCAB = 24


def fake_run(folder: Path, name: str, model: dict, seed: int, loss: float, sha: str | None,
             source: str | None = None) -> Path:
    """A completed run folder written by hand: config.json, a short metrics.jsonl, summary.json."""
    cfg = validate(RunConfig, {"model": {**TINY_MODEL, "vocab_size": VOCAB, **model}, "seed": seed,
                               "train": {"steps": 4}, "data": {"source": source}})
    run_dir = folder / name
    run_dir.mkdir(parents=True)
    runs.atomic_write_json(run_dir / runs.CONFIG, cfg.model_dump(mode="json"))
    (run_dir / runs.METRICS).write_text(json.dumps({"step": 4, "train_loss": loss, "grad_norm": 1.0,
                                                    "val_loss": loss, "tokens": 64}) + "\n")
    summary = {"status": runs.COMPLETED, "seed": seed, "best_val_loss": loss, "best_val_bpb": loss, "best_step": 4,
               "final_val_loss": loss, "params": 1000, "steps_done": 4}
    runs.atomic_write_json(run_dir / runs.SUMMARY, summary | ({"corpus_sha256": sha} if sha else {}))
    return run_dir


# ------------------------------------------------------------------------- cause 2: corpora


def test_report_never_pairs_runs_trained_on_different_corpora(tmp_path):
    """Seed 1337 trained on one corpus, 1338-1339 on an edited one: each effect pairs runs of one corpus."""
    sweep = tmp_path / "toy"
    for seed, sha in ((1337, "a" * 64), (1338, "b" * 64), (1339, "b" * 64)):
        fake_run(sweep, f"ref-s{seed}", {}, seed, 3.0 + seed % 7 * 0.01, sha)
        fake_run(sweep, f"rope-s{seed}", {"pos_type": "rope"}, seed, 2.9 + seed % 5 * 0.01, sha)
    frame, _ = load_runs(sweep)
    for _, members in effects_mod.groups(frame[frame["role"] != ""]):
        shas = {(runs.read_summary(Path(p)) or {}).get("corpus_sha256") for p in members["path"]}
        assert len(shas) == 1, members[["run_id", "seed"]]
    effects = effects_mod.component_effects(frame)
    assert sorted(effects["n_pairs"]) == [1, 2]
    assert all("corpus=" in g for g in effects["group"]), effects["group"]


def test_report_keeps_one_group_when_one_run_has_no_fingerprint(tmp_path):
    """A run without a recorded fingerprint (an older summary) joins the group of the one corpus it can be."""
    sweep = tmp_path / "toy"
    for seed in (1337, 1338, 1339):
        fake_run(sweep, f"ref-s{seed}", {}, seed, 3.0 + seed % 7 * 0.01, "a" * 64)
        fake_run(sweep, f"rope-s{seed}", {"pos_type": "rope"}, seed, 2.9, None if seed == 1338 else "a" * 64)
    frame, _ = load_runs(sweep)
    effects = effects_mod.component_effects(frame)
    assert list(effects["n_pairs"]) == [3] and list(effects["group"]) == [""]


def _rope_spec(folder: Path, corpus: Path) -> Path:
    return write_spec(folder, corpus=corpus, top={"flips": ["rope"], "directions": ["add-one"], "seeds": 1})


def test_ablate_refuses_seeds_on_a_sweep_whose_runs_trained_on_another_corpus(tmp_path):
    corpus = write_corpus(tmp_path)
    spec = _rope_spec(tmp_path, corpus)
    _, plan = plan_mod.load_plan(spec)
    sweep = tmp_path / "runs" / "toy"
    done = plan[0]
    fake_run(sweep, done.run_id, {}, done.config.seed, 3.0, "0" * 64, source=str(corpus))
    result = invoke("ablate", spec, "--runs-dir", tmp_path / "runs", "--seeds", 2, "--dry-run")
    line = one_error_line(result, done.run_id)
    assert str(corpus) in line and "corpus" in line


def test_ablate_refuses_a_sweep_folder_inside_its_own_corpus_folder(tmp_path):
    folder = tmp_path / "notes"
    folder.mkdir()
    write_corpus(folder)
    spec = _rope_spec(tmp_path, folder)
    result = invoke("ablate", spec, "--runs-dir", folder / "runs", "--dry-run")
    one_error_line(result, "inside the corpus")
    assert not (folder / "runs").exists()


def test_train_refuses_out_inside_its_own_corpus_folder(tmp_path):
    folder = tmp_path / "notes"
    folder.mkdir()
    write_corpus(folder)
    result = invoke("train", *run_sets(folder), "--out", folder / "run")
    one_error_line(result, "inside the corpus")
    assert not (folder / "run").exists()


def test_train_refuses_a_corpus_that_is_a_sweep_folder(tmp_path):
    sweep = tmp_path / "runs" / "toy"
    fake_run(sweep, "ref-s1337", {}, 1337, 3.0, "a" * 64)
    runs.atomic_write_json(sweep / runs.SWEEP, {"components": []})
    (sweep / "report.md").write_text("# anatomy report\n" * 50)
    result = invoke("train", *run_sets(sweep), "--out", tmp_path / "out")
    one_error_line(result, "sweep directory")
    assert not (tmp_path / "out").exists()


# ------------------------------------------------------------------ cause 3: a flip that does nothing


def _plan(tmp_path: Path, flips: list[str], **model) -> list:
    spec = write_spec(tmp_path, top={"flips": flips, "seeds": 1}, model={"n_layer": 4, **model})
    return plan_mod.load_plan(spec)[1]


@pytest.mark.parametrize("other", ["gdn", "mla"])
def test_a_window_that_leaves_no_local_layer_is_refused_naming_what_cancels_it(tmp_path, other):
    with pytest.raises(ConfigError) as err:
        _plan(tmp_path, ["swa", other])
    text = str(err.value)
    assert "window=16" in text and ("gdn_pattern='DDDA'" in text or "attn_type='mla'" in text), text


def test_a_flip_that_builds_the_same_model_at_an_end_is_refused(tmp_path):
    """Under latent attention n_kv_head is unused: the LLaMA end minus gqa is the LLaMA end."""
    with pytest.raises(ConfigError) as err:
        _plan(tmp_path, ["rmsnorm", "prenorm", "rope", "swiglu", "gqa", "mla"])
    text = str(err.value)
    assert "all-on-gqa" in text and "same model" in text and "n_kv_head" in text, text


def test_configs_the_check_calls_the_same_build_the_same_model():
    """The normalisation is honest: n_kv_head 2 and 4 under mla build the same parameters and logits."""
    from anatomy_cli.model.lm import LM
    from anatomy_cli.spec import components as comp

    outs, shapes = [], []
    for kv in (2, 4):
        cfg = validate(RunConfig, {"model": {**TINY_MODEL, **LLAMA, "n_kv_head": kv, "attn_type": "mla",
                                             "vocab_size": VOCAB}})
        torch.manual_seed(0)
        model = LM(cfg.model).eval()
        shapes.append({k: tuple(v.shape) for k, v in model.state_dict().items()})
        outs.append(model(torch.arange(16).remainder(VOCAB)[None])[0])
    assert shapes[0] == shapes[1] and torch.equal(outs[0], outs[1])
    same = [validate(RunConfig, {"model": {**TINY_MODEL, **LLAMA, "n_kv_head": kv, "attn_type": "mla"}})
            for kv in (2, 4)]
    assert comp.built_model(same[0]) == comp.built_model(same[1])
    assert comp.built_model(validate(RunConfig, {"model": {**TINY_MODEL, "n_kv_head": 2}})) \
        != comp.built_model(validate(RunConfig, {"model": TINY_MODEL}))


def test_the_report_makes_no_call_on_a_model_against_itself(tmp_path):
    """Runs by hand: 2017 + mla with and without gqa are one model; gqa's add-one effect gets no call."""
    sweep = tmp_path / "toy"
    for seed in (1337, 1338, 1339):
        fake_run(sweep, f"ref-s{seed}", {"attn_type": "mla"}, seed, 3.0 + seed % 7 * 0.01, "a" * 64)
        fake_run(sweep, f"gqa-s{seed}", {"attn_type": "mla", "n_kv_head": 2}, seed, 3.0 + seed % 3 * 0.01, "a" * 64)
        fake_run(sweep, f"rope-s{seed}", {"attn_type": "mla", "pos_type": "rope"}, seed, 2.9, "a" * 64)
    frame, _ = load_runs(sweep)
    effects = effects_mod.component_effects(frame)
    gqa = effects[effects["flip"] == "gqa"]
    assert not gqa["call"].isin(stats.CALLS).any(), gqa
    assert effects.loc[effects["flip"] == "rope", "call"].isin(stats.CALLS).all()
    assert any("gqa" in line and "same model" in line for line in effects_mod.same_model_lines(frame))


# ------------------------------------------------------------------------ cause 10: knobs


def _cfg(model: dict | None = None, train: dict | None = None) -> RunConfig:
    return validate(RunConfig, {"model": {**TINY_MODEL, "n_layer": 4, **(model or {})}, "train": train or {}})


def test_the_deepseek_router_takes_the_default_aux_loss_the_user_never_set():
    _cfg({"moe": True, "moe_router": "deepseek"})  # refused before: train.moe_aux_loss=0.001 is the default
    _cfg({"moe": True, "moe_router": "deepseek"}, {"moe_aux_loss": 0.0})  # as shipped specs set it


@pytest.mark.parametrize("model,train,knob", [
    ({}, {"moe_bias_rate": 0.01}, "train.moe_bias_rate=0.01"),
    ({"moe": True}, {"moe_bias_rate": 0.01}, "train.moe_bias_rate=0.01"),
    ({}, {"dsa_indexer_loss": 0.5}, "train.dsa_indexer_loss=0.5"),
    ({"attn_type": "mla"}, {"dsa_indexer_loss": 0.5}, "train.dsa_indexer_loss=0.5"),
    ({"attn_type": "mla", "window": 8, "window_pattern": "LLLG"}, {}, "window=8"),
    ({"moe": True, "moe_router": "deepseek"}, {"moe_aux_loss": 0.01}, "train.moe_aux_loss=0.01"),
    ({}, {"moe_aux_loss": 0.01}, "train.moe_aux_loss=0.01"),
    ({"window_pattern": "LLLG"}, {}, "window_pattern='LLLG'"),
])
def test_a_knob_set_where_it_does_nothing_is_refused(model, train, knob):
    with pytest.raises(ConfigError) as err:
        _cfg(model, train)
    assert knob in str(err.value) and "does nothing" in str(err.value), str(err.value)


def test_defaults_and_knobs_that_act_are_accepted():
    _cfg()
    _cfg({"moe": True}, {"moe_aux_loss": 0.01})
    _cfg({"moe": True, "moe_router": "deepseek"}, {"moe_bias_rate": 0.01, "moe_aux_loss": 0.0})
    _cfg({"attn_type": "mla", "dsa": True}, {"dsa_indexer_loss": 0.5})
    _cfg({"window": 8, "window_pattern": "LLLG"})
    _cfg({"attn_type": "mla"}, {"dsa_indexer_loss": 1.0, "moe_bias_rate": 0.001})  # defaults, unused: fine


def test_set_moe_with_the_deepseek_router_trains(tmp_path):
    corpus = write_corpus(tmp_path)
    result = invoke("train", *run_sets(corpus), "--set", "model.moe=true", "--set", "model.moe_router=deepseek",
                    "--set", "train.steps=1", "--set", "train.eval_interval=1", "--out", tmp_path / "run")
    assert result.exit_code == 0, result.output


@pytest.mark.slow
def test_a_run_that_learns_nothing_is_flagged(tmp_path):
    """moe_routed_scaling_factor = 1e30 (pre-norm: the final norm tames it): every gradient 0, the loss flat at
    ln V, yet 'completed' before with no word."""
    from anatomy_cli.training import run as training

    corpus = write_corpus(tmp_path)
    cfg = validate(RunConfig, {"model": {**TINY_MODEL, "norm_type": "rmsnorm", "norm_pos": "pre", "moe": True,
                                         "moe_router": "deepseek",
                                         "moe_routed_scaling_factor": 1e30},
                               "train": {**TINY_TRAIN, "steps": 6, "eval_interval": 3},
                               "data": {"source": str(corpus)}})
    summary = training.train(cfg, tmp_path / "run")
    assert summary["status"] == runs.COMPLETED
    assert "did not learn" in (summary.get("warning") or ""), summary
    frame, _ = load_runs(tmp_path / "run")
    assert "did not learn" in frame["warning"].iloc[0]
    healthy = training.train(cfg.model_copy(update={"model": cfg.model.model_copy(
        update={"moe_routed_scaling_factor": 1.0})}), tmp_path / "ok")
    assert healthy.get("warning") is None and not math.isnan(healthy["best_val_loss"])

"""Run ids do not move: the id of every run a shipped spec plans is pinned here, and every config
field added after the first hashed set must carry the config.NEW mark (config.new(...): left out of
the hash at its default) or, when it never changes results, the config.NO_RESULT mark
(config.no_result(...): left out at any value), so that a new field cannot silently rename every finished run (and a
rerun retrain them all).

When a change is MEANT to move ids (a default changed, so the trained model changes), update the
pins in the same commit and say why.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import BaseModel

from anatomy_cli import runs
from anatomy_cli.components import label
from anatomy_cli.config import ANY, NEW, NO_RESULT, DataConfig, ModelConfig, RunConfig, TrainConfig, hash_neutral, load_run_config
from anatomy_cli.sweep import expand, load_spec

EXPERIMENTS = Path(__file__).resolve().parents[1] / "experiments"

# The fields that have always been in the hash (at any value). Every other field must be NEW-marked.
HASHED = {
    "": {"name", "seed"},
    "model": {"vocab_size", "d_model", "n_layer", "n_head", "n_kv_head", "ctx_len", "norm_type", "norm_pos",
              "pos_type", "ffn_type", "rope_base", "norm_eps", "rope_variant"},
    "train": {"steps", "batch_size", "lr", "min_lr_frac", "schedule", "warmup", "weight_decay", "beta1", "beta2",
              "grad_clip", "eval_interval", "eval_batches", "log_interval", "diverge_factor", "device", "dtype",
              "compile", "compile_mode", "threads", "sample_prefix", "sample_temp", "sample_len"},
    "data": {"source", "val_frac"},
}
SECTIONS = {"": RunConfig, "model": ModelConfig, "train": TrainConfig, "data": DataConfig}

PINNED_IDS = {
    "ci-regression": [
        "2017+gqa-s1337-adee5096", "2017+prenorm-s1337-1c827b70", "2017+rmsnorm-s1337-25e5d07a",
        "2017+rope-s1337-71730bb9", "2017+swiglu-s1337-a2d66acc", "2017-s1337-01654518",
        "llama-gqa-s1337-d9440539", "llama-prenorm-s1337-0f519a5e", "llama-rmsnorm-s1337-bcc988c6",
        "llama-rope-s1337-af0e84d5", "llama-s1337-9ee2439b", "llama-swiglu-s1337-702f9da8",
    ],
    "depth-stability": [
        "post-norm-s1337-17c13f33", "post-norm-s1338-7e6ffede", "post-norm-s1339-0f15bd10",
        "pre-norm-s1337-6d736339", "pre-norm-s1338-48cb9a98", "pre-norm-s1339-1b2168ca",
    ],
    "five-flips-seed": [
        "2017+gqa-s1337-05efd8a7", "2017+prenorm-s1337-eb624f56", "2017+rmsnorm-s1337-a36e5628",
        "2017+rope-s1337-b45db6dd", "2017+swiglu-s1337-e67fe45c", "2017-s1337-aa29626e",
        "llama-gqa-s1337-7ee6188a", "llama-prenorm-s1337-df5582c2", "llama-rmsnorm-s1337-1ec625e3",
        "llama-rope-s1337-592207f1", "llama-s1337-012c6e87", "llama-swiglu-s1337-a4fed945",
    ],
    "five-flips": [
        "2017+gqa-s1337-f163aa07", "2017+prenorm-s1337-90dd7a7c", "2017+rmsnorm-s1337-912d2bd0",
        "2017+rope-s1337-b2375d72", "2017+swiglu-s1337-59c09043", "2017-s1337-46b897f2",
        "llama-gqa-s1337-5b14c2f0", "llama-prenorm-s1337-1fca8d95", "llama-rmsnorm-s1337-d8408cf9",
        "llama-rope-s1337-53666033", "llama-s1337-56118034", "llama-swiglu-s1337-42e4e50d",
    ],
    "modern": [
        "reference+nope-s1337-a833906e", "reference+nope-s1338-2de69002", "reference+nope-s1339-0ca37b26",
        "reference+parallel-s1337-4d0a0bab", "reference+parallel-s1338-b1c521aa",
        "reference+parallel-s1339-9cf326a2", "reference+qknorm-s1337-2f589f45",
        "reference+qknorm-s1338-0baa4cd1", "reference+qknorm-s1339-0f5e33e8",
        "reference+softcap-s1337-c537cab5", "reference+softcap-s1338-b9d07633",
        "reference+softcap-s1339-60a59229", "reference+tied-s1337-5ccb8192", "reference+tied-s1338-08255927",
        "reference+tied-s1339-d7d0e0aa", "reference+zloss-s1337-0fdec345", "reference+zloss-s1338-a6fae1b7",
        "reference+zloss-s1339-c4eceb41", "reference-s1337-61c67967", "reference-s1338-c1673dd4",
        "reference-s1339-b6f1d65b",
    ],
    "seed-protocol": [
        "2017-s1337-7aea066c", "llama-s1337-8f0d88ce",
    ],
    "train-default": [
        "run-2017-s1337-68ea5046",
    ],
}

def planned_ids() -> dict[str, list[str]]:
    out = {path.stem: sorted(p.run_id for p in expand(load_spec(path))) for path in sorted(EXPERIMENTS.glob("*.toml"))}
    cfg = load_run_config(None, [])  # `anatomy train` with no spec
    out["train-default"] = [runs.run_id(f"{cfg.name}-{label(cfg)}", cfg.seed, cfg.model_dump(mode="json"))]
    return out


def test_every_shipped_spec_plans_the_pinned_run_ids():
    assert planned_ids() == PINNED_IDS
    assert "2017-s1337-01654518" in PINNED_IDS["ci-regression"]


@pytest.mark.parametrize("section", list(SECTIONS))
def test_every_field_added_after_the_hashed_set_is_marked_new(section):
    fields = {name for name, info in SECTIONS[section].model_fields.items()
              if not (isinstance(info.annotation, type) and issubclass(info.annotation, BaseModel))}
    unmarked = {name for name in fields - HASHED[section]
                if SECTIONS[section].model_fields[name].json_schema_extra not in (NEW, NO_RESULT)}
    assert not unmarked, (f"{section or 'run'} fields {sorted(unmarked)} are not in the first hashed set: mark each "
                          f"config.new(<the default that reproduces today's model>, **bounds)")
    marked = {name for name in fields if SECTIONS[section].model_fields[name].json_schema_extra in (NEW, NO_RESULT)}
    assert not marked & HASHED[section], "a field that was always hashed cannot become neutral: its ids would move"
    assert set(hash_neutral().get(section, {}) if section else
               {k for k, v in hash_neutral().items() if not isinstance(v, dict)}) == marked


def test_a_marked_field_changes_the_id_only_off_its_default():
    cfg = RunConfig().model_dump(mode="json")
    base = runs.config_hash(cfg)
    for section, fields in hash_neutral().items():
        for name, default in fields.items():
            assert runs.config_hash({**cfg, section: {**cfg[section], name: default}}) == base
            dropped = {**cfg, section: {k: v for k, v in cfg[section].items() if k != name}}
            assert runs.config_hash(dropped) == base  # a config.json written before the field existed
    on = {**cfg, "model": {**cfg["model"], "qk_norm": True}}
    assert runs.config_hash(on) != base
    often = {**cfg, "train": {**cfg["train"], "checkpoint_every": 7, "checkpoint_minutes": 0.5}}
    assert hash_neutral()["train"]["checkpoint_every"] == ANY and runs.config_hash(often) == base

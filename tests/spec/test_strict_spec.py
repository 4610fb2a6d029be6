"""A spec is read as strictly as `--set` (issue 37, cause 5): in a TOML spec a bool is not an integer,
a string is not a number and a float is not an integer (an integer is a number: `lr = 1` is fine).
Each refusal is one line, exit 2, naming the key; every reader of the spec refuses alike."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import invoke, one_error_line
from toy_data import TINY_MODEL, TINY_TRAIN, toml_value, write_corpus, write_spec

from anatomy_cli.spec.config import load_run_config
from anatomy_cli.sweep.plan import load_plan


def run_spec(folder: Path, model: dict | None = None, train: dict | None = None) -> Path:
    """A run spec (model, train, data) at toy sizes."""
    corpus = write_corpus(folder)
    lines = ["[model]"] + [f"{k} = {toml_value(v)}" for k, v in {**TINY_MODEL, **(model or {})}.items()]
    lines += ["[train]"] + [f"{k} = {toml_value(v)}" for k, v in {**TINY_TRAIN, **(train or {})}.items()]
    lines += ["[data]", f'source = "{corpus}"']
    path = folder / "run.toml"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


# (id, the setting in a run spec: section, key, value; the fragment of the error line)
RUN_CASES = [
    ("bool-steps", "train", "steps", True, "train.steps: Input should be a valid integer, got true"),
    ("str-d_model", "model", "d_model", "32", 'model.d_model: Input should be a valid integer, got "32"'),
    ("float-d_model", "model", "d_model", 32.0, "model.d_model: Input should be a valid integer, got 32.0"),
    ("str-lr", "train", "lr", "0.01", 'train.lr: Input should be a valid number, got "0.01"'),
    ("int-bool", "model", "qk_norm", 1, "model.qk_norm: Input should be a valid boolean, got 1"),
    ("str-bool", "model", "qk_norm", "yes", 'model.qk_norm: Input should be a valid boolean, got "yes"'),
]


@pytest.mark.parametrize("case", RUN_CASES, ids=[c[0] for c in RUN_CASES])
def test_a_run_spec_is_typed_strictly(tmp_path, case):
    _, section, key, value, fragment = case
    spec = run_spec(tmp_path, **{section: {key: value}})
    result = invoke("train", spec, "--runs-dir", tmp_path / "runs")
    one_error_line(result, fragment)
    assert not (tmp_path / "runs").exists()


def test_an_integer_is_a_number_in_a_spec(tmp_path):
    cfg = load_run_config(run_spec(tmp_path, train={"lr": 1, "weight_decay": 0}))
    assert cfg.train.lr == 1.0 and isinstance(cfg.train.lr, float)
    assert cfg.train.weight_decay == 0.0 and isinstance(cfg.train.weight_decay, float)


# (id, top-level keys, base.model, base.train, extra TOML, the fragment of the error line)
ABLATION_CASES = [
    ("bool-steps", {}, {}, {"steps": True}, "", "base.train.steps: Input should be a valid integer, got true"),
    ("str-d_model", {}, {"d_model": "32"}, {}, "", 'base.model.d_model: Input should be a valid integer, got "32"'),
    ("float-d_model", {}, {"d_model": 32.0}, {}, "", "base.model.d_model: Input should be a valid integer, got 32.0"),
    ("str-min_effect", {"min_effect": "0.02"}, {}, {}, "", 'min_effect: Input should be a valid number, got "0.02"'),
    ("str-max_seeds", {}, {}, {}, '[decide]\nmax_seeds = "5"\n',
     'decide.max_seeds: Input should be a valid integer, got "5"'),
    ("bool-seeds", {"seeds": True}, {}, {}, "", "seeds"),
    ("component-str-bool", {"flips": ["c"]}, {}, {}, '[components.c]\non = {"model.qk_norm" = "yes"}\n',
     'components.c.on.model.qk_norm: Input should be a valid boolean, got "yes"'),
    ("component-float-int", {"flips": ["c"]}, {}, {}, '[components.c]\non = {"model.n_kv_head" = 2.0}\n',
     "components.c.on.model.n_kv_head: Input should be a valid integer, got 2.0"),
    ("axis-str", {"axes": {"model.d_model": [32, "64"]}}, {}, {}, "",
     'd_model: Input should be a valid integer, got "64"'),
]


@pytest.mark.parametrize("case", ABLATION_CASES, ids=[c[0] for c in ABLATION_CASES])
def test_an_ablation_spec_is_typed_strictly(tmp_path, case):
    _, top, model, train, extra, fragment = case
    spec = write_spec(tmp_path, top=top, model=model, train=train)
    spec.write_text(spec.read_text() + extra, encoding="utf-8")
    for args in (["components", spec], ["ablate", spec, "--dry-run", "--runs-dir", tmp_path / "runs"]):
        result = invoke(*args)
        line = one_error_line(result, fragment)
        assert result.output.strip() == line.strip(), result.output  # the error line alone
    assert not (tmp_path / "runs").exists()


def test_an_integer_is_a_number_in_an_ablation_spec(tmp_path):
    spec = write_spec(tmp_path, top={"min_effect": 1}, train={"lr": 1})
    loaded, plan = load_plan(spec)
    assert isinstance(loaded.margin, float) and plan[0].config.train.lr == 1.0  # min_effect: margin's older name

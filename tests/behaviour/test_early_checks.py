"""Issue #30, classes 6 and 7: every constraint a run will hit is checked when the spec is read, and
options are parsed strictly. A refusal is one line starting 'error:', exit 2, nothing written and no
progress bar before it (one_error_line(..., alone=True): the error line is all of stderr)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from helpers import invoke, one_error_line
from toy_data import TINY_MODEL, TINY_TRAIN, toml_value, write_corpus, write_spec
from typer.testing import CliRunner

from anatomy_cli.cli.main import app

runner = CliRunner()


def run_spec(folder: Path, train: dict | None = None) -> Path:
    """A run spec (sections model, train, data) at toy sizes on the tiny corpus."""
    corpus = write_corpus(folder)
    lines = ["[model]"] + [f"{k} = {toml_value(v)}" for k, v in TINY_MODEL.items()]
    lines += ["[train]"] + [f"{k} = {toml_value(v)}" for k, v in {**TINY_TRAIN, **(train or {})}.items()]
    lines += ["[data]", f'source = "{corpus}"']
    path = Path(folder) / "run.toml"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def refused_train(tmp_path: Path, *args, fragment: str) -> str:
    """`train RUN_SPEC *args` is refused in one line holding `fragment`, before any run directory exists."""
    out = tmp_path / "run"
    line = one_error_line(invoke("train", run_spec(tmp_path), *args, "--out", out), fragment, alone=True)
    assert not out.exists()
    return line


# ------------------------------------------------------------------------------ class 6: checked late


def test_ctx_len_1_is_refused_when_the_spec_is_read_naming_the_field(tmp_path):
    line = refused_train(tmp_path, "--set", "model.ctx_len=1", fragment="model.ctx_len")
    assert "--window" not in line  # an option nobody passed


def test_a_ladder_size_with_ctx_len_1_is_refused_by_a_dry_run(tmp_path):
    spec = write_spec(tmp_path)
    spec.write_text(spec.read_text() + '[[sizes]]\nname = "S"\nmodel = { ctx_len = 1 }\n', encoding="utf-8")
    result = invoke("ablate", spec, "--dry-run", "--runs-dir", tmp_path / "r")
    one_error_line(result, "sizes.S.model.ctx_len", alone=True)
    assert not (tmp_path / "r").exists()


def test_a_size_longer_than_the_corpus_is_refused_by_name_before_anything_is_measured(tmp_path, monkeypatch):
    """A size's ctx_len the corpus's splits cannot hold: named by the size, before the short-run warning
    and the calibration (it was 'corpus too short' after both, naming no size; issue 48)."""
    monkeypatch.setenv("ANATOMY_CACHE", str(tmp_path / "cache"))
    spec = write_spec(tmp_path, train={"steps": 4, "warmup": 10, "eval_interval": 2})  # a warning, were it reached
    spec.write_text(spec.read_text() + '[[sizes]]\nname = "S"\nmodel = { d_model = 32 }\n'
                    '[[sizes]]\nname = "huge"\nmodel = { ctx_len = 100000 }\n', encoding="utf-8")
    result = invoke("ablate", spec, "--runs-dir", tmp_path / "r")
    line = one_error_line(result, "size huge: ctx_len=100,000 needs more than 100,000 ids in each split", alone=True)
    assert "train / " in line and "val" in line
    assert not (tmp_path / "r").exists() and not (tmp_path / "cache").exists()


def test_bench_decode_names_its_own_size_option(tmp_path):
    """--ctx 1 is refused as --ctx, the option typed, not as the field it sets (model.ctx_len)."""
    line = one_error_line(invoke("bench-decode", "--ctx", 1, "--new", 2), "--ctx: ctx_len=1 is too short", alone=True)
    assert "model.ctx_len" not in line


def test_a_run_shorter_than_its_warmup_is_warned_about(tmp_path):
    out = tmp_path / "run"
    result = invoke("train", run_spec(tmp_path, {"steps": 2, "warmup": 10, "eval_interval": 2}), "--out", out)
    assert result.exit_code == 0, result.output
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1, result.stderr
    assert "train.steps=2" in warnings[0] and "train.warmup=10" in warnings[0], warnings[0]


# ------------------------------------------------------------------------------ class 7: option parsing


@pytest.mark.parametrize("value", ["²", "0", "-1", "1.5", "two"])
def test_stack_takes_auto_off_or_a_positive_count(tmp_path, value):
    result = invoke("ablate", write_spec(tmp_path), "--stack", value, "--dry-run", "--runs-dir", tmp_path / "r")
    one_error_line(result, "--stack must be auto, off or", alone=True)
    assert not (tmp_path / "r").exists()


def test_executor_is_a_choice(tmp_path):
    result = invoke("ablate", write_spec(tmp_path), "--executor", "nope", "--dry-run", "--runs-dir", tmp_path / "r")
    one_error_line(result, "--executor must be local or dask, got 'nope'", alone=True)


@pytest.mark.parametrize("command", ["train", "ablate"])
def test_dtype_is_a_choice(tmp_path, command):
    args = ["train", run_spec(tmp_path)] if command == "train" else ["ablate", write_spec(tmp_path), "--dry-run"]
    result = invoke(*args, "--dtype", "float8", "--runs-dir", tmp_path / "r")
    one_error_line(result, "--dtype: Input should be 'float32' or 'bfloat16'", alone=True)
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("command", ["eval", "bench-decode"])
def test_device_of_an_exam_is_a_choice(tmp_path, command):
    args = [command, tmp_path] if command == "eval" else [command]
    one_error_line(invoke(*args, "--device", "tpu"), "--device must be one of auto, cpu, cuda, mps", alone=True)


@pytest.mark.parametrize("setting, fragment", [
    ("train.steps=true", "--set train.steps: expected an integer, got true"),
    ("train.steps=1.5", "--set train.steps: expected an integer, got 1.5"),
    ('train.steps="12"', "--set train.steps: expected an integer, got \"12\""),
    ("model.norm_type=3", "--set model.norm_type: expected one of 'layernorm', 'rmsnorm', 'none', got 3"),
    ("model.qk_norm=yes", "--set model.qk_norm: expected true or false, got yes"),
    ("model.qk_norm=1", "--set model.qk_norm: expected true or false, got 1"),
])
def test_set_values_are_strict_for_their_field_s_type(tmp_path, setting, fragment):
    refused_train(tmp_path, "--set", setting, fragment=fragment)


def test_set_values_of_the_right_type_still_pass(tmp_path):
    """An integer is a number (train.lr=1), bounds are still checked by the config, and a flag is a bool."""
    refused_train(tmp_path, "--set", "train.lr=1", "--set", "train.steps=0",
                  fragment="train.steps: Input should be greater than 0")


def test_an_unknown_set_key_gets_a_did_you_mean(tmp_path):
    refused_train(tmp_path, "--set", "model.pos=rope", fragment="--set model.pos: unknown key; did you mean "
                                                                 "model.pos_type?")


def test_an_unknown_spec_key_gets_a_did_you_mean(tmp_path):
    spec = tmp_path / "typo.toml"
    spec.write_text("[model]\nd_modle = 32\n", encoding="utf-8")
    one_error_line(invoke("train", spec, "--out", tmp_path / "run"), "model.d_modle: unknown key; did you mean "
                                                                     "model.d_model?", alone=True)


def test_an_ablation_spec_given_to_train_says_so_in_one_line(tmp_path):
    spec = write_spec(tmp_path)
    line = one_error_line(invoke("train", spec, "--out", tmp_path / "run"),
                          f"{spec} is an ablation spec: run it with `anatomy ablate {spec}`", alone=True)
    assert "unknown key" not in line and not (tmp_path / "run").exists()


# ------------------------------------------------------------------------------ --help


@pytest.mark.parametrize("command", ["train", "ablate", "sample", "report", "check", "export", "components"])
def test_help_shows_no_type_for_a_flag(command):
    result = invoke(command, "--help")
    assert result.exit_code == 0 and "<bool>" not in result.output, result.output


def test_sample_help_shows_no_twenty_digit_seed_range():
    result = invoke("sample", "--help")  # the range, when shown, wraps at any width: look at the type instead
    assert result.exit_code == 0 and re.search(r"--seed\s+<int>\s", result.output), result.output
    assert "int range> [-9223372036854775808" not in result.output


def test_an_absurd_token_budget_is_refused_before_planning(tmp_path):
    """tokens_per_param = 1e30 planned a step count past 2**64: refused when the spec is read, and a
    size whose budget still needs more steps than a run can count is refused naming tokens_per_param."""
    spec = write_spec(tmp_path, top={"design": "one-at-a-time", "flips": ["rope"], "budget": "tokens-per-param",
                                     "tokens_per_param": 1e30, "sizes": [{"name": "S"}]})
    result = CliRunner().invoke(app, ["ablate", str(spec), "--dry-run", "--runs-dir", str(tmp_path / "r")])
    one_error_line(result, "tokens_per_param")
    assert not (tmp_path / "r").exists()


@pytest.mark.process  # ablate calibrates its estimate in a spawned worker
def test_a_flip_subset_into_a_folder_with_more_runs_says_what_its_report_covers(tmp_path):
    """ablate --flip rope into the folder of a wider study: the closing report reads the whole folder,
    so the command says its verdict covers the earlier runs too."""
    spec = write_spec(tmp_path, top={"design": "one-at-a-time", "flips": ["rope", "swiglu"]},
                      train={"steps": 2, "eval_interval": 2})
    base = ["ablate", str(spec), "--runs-dir", str(tmp_path / "r"), "--workers", "1"]
    wide = CliRunner().invoke(app, base)
    assert wide.exit_code == 0, wide.output
    assert "note: the report covers" not in wide.output
    narrow = CliRunner().invoke(app, [*base, "--flip", "rope"])
    assert narrow.exit_code == 0, narrow.output
    assert "note: the report covers every run" in " ".join(narrow.output.split())

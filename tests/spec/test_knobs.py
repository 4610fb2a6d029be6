"""spec/knobs.py: every study knob is a key of the study spec, reached by --set KEY=VALUE, and the older flags are
aliases from one table (what ablate parses, what its --help and docs/specs.md list, what the report's advice says)."""

from __future__ import annotations

from pathlib import Path

import pytest

from anatomy_cli.spec import config, knobs
from anatomy_cli.spec.config import AblationSpec, ConfigError, validate

ROOT = Path(__file__).resolve().parents[2]

STUDY_KEYS = [  # every key of the study spec --set reaches on ablate, besides base.SECTION.KEY: a new one is named here
    "name", "seeds", "design", "flips", "only", "components", "directions", "gqa_kv_head", "configs", "axes", "sizes",
    "tokenizers", "budget", "tokens_per_param", "margin", "worth_margin", "budgets", "budgets.steps", "decide",
    "decide.max_seeds", "decide.step", "decide.budget",
    "tune", "tune.points", "tune.factor", "tune.extend", "tune.seeds", "tune.shared", "timing", "timing.steps",
    "timing.rounds"]
ALIASES = {"--flip": "only", "--seeds": "seeds", "--steps": "base.train.steps", "--device": "base.train.device",
           "--compile": "base.train.compile", "--dtype": "base.train.dtype", "--margin": "margin",
           "--min-effect": "margin", "--max-seeds": "decide.max_seeds", "--decide-step": "decide.step",
           "--budget": "decide.budget", "--tune-points": "tune.points", "--tune-factor": "tune.factor",
           "--tune-extend": "tune.extend", "--tune-seeds": "tune.seeds", "--tune-shared": "tune.shared",
           "--no-tune-shared": "tune.shared", "--plugin": "base.plugins",
           "--time-steps": "timing.steps", "--time-rounds": "timing.rounds"}


def test_every_study_key_reachable_by_set_and_every_alias():
    keys = knobs.study_keys()
    assert [k for k in keys if not k.startswith("base.")] == STUDY_KEYS
    assert {"base.model.d_model", "base.train.steps", "base.data.source", "base.seed"} <= set(keys)
    assert {a.flag: a.key for a in knobs.ALIASES} == ALIASES
    for key in keys:  # each key names a field of the study spec (or a mode table, which takes true or false)
        knobs.checked(knobs.Setting(key, True, f"--set {key}=true"), "") if key in knobs.TABLES else knobs._leaf(key)


def test_docs_and_help_list_every_alias_with_its_key():
    page = (ROOT / "docs" / "specs.md").read_text(encoding="utf-8")
    for a in knobs.ALIASES:
        assert f"| `{a.flag}{' ' + a.metavar if a.metavar else ''}` | `{a.key}`" in page, a.flag
    assert all(a.flag in knobs.alias_help() for a in knobs.ALIASES)


def test_an_alias_is_its_key_set_alike():
    data = {"name": "x", "seeds": 3}
    by_alias = knobs.apply_settings(data, knobs.read_args(["--seeds=6", "--steps", "300", "--flip", "rope,swiglu"])[1])
    by_set = knobs.apply_settings(data, [knobs.parse_set("seeds=6"), knobs.parse_set("base.train.steps=300"),
                                         knobs.parse_set('only=["rope", "swiglu"]')])
    want = {"name": "x", "seeds": 6, "base": {"train": {"steps": 300}}, "only": ["rope", "swiglu"]}
    assert by_alias == by_set == want
    assert validate(AblationSpec, by_alias).base.train.steps == 300


@pytest.mark.parametrize("words, fragment", [
    (["--sedes", "3"], "no such option: --sedes (did you mean --seeds?)"),
    (["--seeds"], "--seeds needs a value"),
    (["--compile=yes"], "--compile is a flag and takes no value"),
    (["--seeds", "2.5"], "--seeds: expected a list of integers or an integer, got 2.5"),
    (["--steps", "0"], "--steps: Input should be greater than 0"),
    (["--margin", "inf"], "--margin: must be a finite number of bits per byte above 0 and at most 10"),
    (["--margin", "0"], "--margin: must be a finite number of bits per byte above 0"),
    (["--margin", "11"], "--margin: must be a finite number of bits per byte above 0 and at most 10"),
    (["--budget", "-5m"], "--budget: '-5m' is not a time: give one such as 30m, 2h, 90s or 600 (seconds)"),
    (["--tune-seeds", "x"], "--tune-seeds takes a count or a comma-separated list of seeds"),
    (["--dtype", "float8"], "--dtype: Input should be 'float32' or 'bfloat16'"),
])
def test_a_bad_alias_is_one_line_naming_it(words, fragment):
    with pytest.raises(ConfigError) as err:
        knobs.read_args(words)
    assert fragment in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("text, fragment", [
    ("seeds", "--set expects key=value"),
    ("sedes=3", "--set sedes: unknown key; did you mean seeds?"),
    ("decide.maxseeds=3", "did you mean decide.max_seeds?"),
    ("seeds.x=3", "--set seeds.x: unknown key"),
    ("decide=3", "decide is a table: true turns it on at its defaults, false off"),
    ("base.train.device=\"gpu\"", "--set base.train.device: Input should be 'auto', 'cpu', 'cuda' or 'mps'"),
])
def test_a_bad_set_is_one_line_naming_its_key(text, fragment):
    with pytest.raises(ConfigError, match=None) as err:
        knobs.parse_set(text)
    assert fragment in str(err.value)


@pytest.mark.parametrize("given, seconds", [("--budget 600", 600.0), ("--set decide.budget=600", 600.0),
                                            ("--budget 90s", 90.0)])
def test_a_budget_in_bare_seconds_is_a_budget(given, seconds):
    """The help's own example: 600 = seconds (a bare number is read as a number, then taken as seconds)."""
    flag, value = given.split(" ")
    settings = [knobs.parse_set(value)] if flag == "--set" else knobs.read_args([flag, value])[1]
    spec = knobs.apply_settings({"name": "x", "decide": {}}, settings)
    assert config.budget_seconds(config.DecideSpec(**spec["decide"]).budget) == seconds


def test_a_mode_table_turns_on_and_off_and_a_key_inside_an_absent_one_is_refused():
    spec = {"name": "x", "decide": {"max_seeds": 4}}
    assert "decide" not in knobs.apply_settings(spec, [knobs.parse_set("decide=false")])
    assert knobs.apply_settings({"name": "x"}, [knobs.parse_set("decide=true")])["decide"] == {}
    assert knobs.apply_settings(spec, [knobs.parse_set("decide=true")])["decide"] == {"max_seeds": 4}  # kept
    on = knobs.apply_settings({"name": "x"}, [knobs.Setting("tune", True, "--tune-lr"),
                                              knobs.parse_set("tune.points=3")])
    assert on["tune"] == {"points": 3}
    with pytest.raises(ConfigError, match=r"--max-seeds 6 sets the \[decide\] table, which the spec does not have: add "
                                          r"--decide"):
        knobs.apply_settings({"name": "x"}, knobs.read_args(["--max-seeds", "6"])[1])


def test_a_key_set_over_its_older_name_in_the_file_replaces_it():
    out = knobs.apply_settings({"name": "x", "min_effect": 0.05}, knobs.read_args(["--margin", "0.1"])[1])
    assert out == {"name": "x", "margin": 0.1} and validate(AblationSpec, out).margin == 0.1
    assert validate(AblationSpec, {"name": "x", "min_effect": 0.05}).margin == 0.05  # the older name reads alike


def test_settings_render_back_as_the_shortest_command():
    settings = knobs.read_args(["--seeds", "6", "--tune-seeds", "7,", "--no-tune-shared", "--compile"])[1]
    settings += [knobs.parse_set("base.model.d_model=64"), knobs.Setting("decide", True, "--decide")]
    assert knobs.command_args(settings) == ["--seeds", "6", "--tune-seeds", "7,", "--no-tune-shared", "--compile",
                                            "--set", "base.model.d_model=64", "--decide"]
    again = knobs.read_args([w for w in knobs.command_args(settings) if w not in ("--set", "--decide")
                             and not w.startswith("base.")])[1]
    assert [(s.key, s.value) for s in again] == [(s.key, s.value) for s in settings[:4]]


def test_a_count_of_seeds_means_these_seeds_in_one_place():
    from anatomy_cli.spec.config import seeds_of

    assert seeds_of(3, 1337) == [1337, 1338, 1339] and seeds_of(2, 1337, below=True) == [1336, 1335]
    assert seeds_of([7, 9], 1337) == [7, 9] == seeds_of([7, 9], 1337, below=True)
    assert validate(AblationSpec, {"name": "x", "seeds": 2, "base": {"seed": 5}}).seed_list == [5, 6]

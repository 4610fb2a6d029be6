"""Every spec is validated before it is used, by one function (sweep.load_plan) that `components
SPEC`, `ablate`, `ablate --dry-run`, `ablate --time` and `check` share: a bad spec is one line and
exit 2 from each of them, before anything is written; a good one means the same to all of them."""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path

import pytest
from helpers import invoke, one_error_line
from toy_data import toml_value, write_corpus, write_spec
from typer.testing import CliRunner

from anatomy_cli.cli.main import app
from anatomy_cli.spec import components as comp
from anatomy_cli.spec.config import ConfigError
from anatomy_cli.sweep.plan import MAX_PLAN_RUNS, load_plan

runner = CliRunner()


def component_spec(tmp_path: Path, body: str, name: str = "c", flips: list[str] | None = None, base: str = "") -> Path:
    """A toy spec whose [components.NAME] table is `body` (TOML lines)."""
    flips = flips if flips is not None else [name]
    path = write_spec(tmp_path, top={"flips": flips})
    text = path.read_text() + base + f"[components.{name}]\n{body}\n"
    path.write_text(text, encoding="utf-8")
    return path


def readers(spec: Path, tmp: Path) -> dict[str, list]:
    """Every command that reads an ablation spec."""
    r = tmp / "runs"
    return {"components": ["components", spec], "dry-run": ["ablate", spec, "--dry-run", "--runs-dir", r],
            "time": ["ablate", spec, "--time", "--runs-dir", r], "ablate": ["ablate", spec, "--runs-dir", r],
            "check": ["check", spec, "--baseline", tmp / "baseline.json", "--runs-dir", r]}


# (id, component table body or None, flips, extra base lines, message fragment)
BAD_SPECS = [
    ("bool-not-bool", 'on = {"model.qk_norm" = "maybe"}', None, "",
     "components.c.on.model.qk_norm: Input should be a valid boolean"),
    ("literal-schedule", 'on = {"train.schedule" = "linear"}', None, "",
     "components.c.on.train.schedule: Input should be 'constant', 'cosine' or 'wsd'"),
    ("literal-device", 'on = {"train.device" = "tpu"}', None, "",
     "components.c.on.train.device: Input should be 'auto', 'cpu', 'cuda' or 'mps'"),
    ("str-source", 'on = {"data.source" = 5}', None, "", "components.c.on.data.source: Input should be a valid string"),
    ("optional-threads", 'on = {"train.threads" = 0}', None, "",
     "components.c.on.train.threads: Input should be greater than 0"),
    ("off-wrong-type", 'on = {"model.qk_norm" = true}\noff = {"model.qk_norm" = 2}', None, "",
     "components.c.off.model.qk_norm: Input should be a valid boolean"),
    ("inf", 'on = {"model.rope_base" = inf}', None, "",
     "components.c.on.model.rope_base: Input should be a finite number"),
    ("nan", 'on = {"train.lr" = nan}', None, "", "components.c.on.train.lr: Input should be a finite number"),
    ("not-a-field", 'on = {"model.alibi" = true}', None, "", "'model.alibi' is not a field of model, train or data"),
    # a Literal field without bounds used to crash before the conflict check could run
    ("pos-type-conflict", 'on = {"model.pos_type" = "nope"}', ["rope", "c"], "",
     "components rope and c both set model.pos_type"),
    ("bad-shape-in-plan", 'on = {"model.n_head" = 3}', None, "", "invalid configs in the plan"),
    ("bad-shape-in-base", 'on = {"model.qk_norm" = true}', None, "[base.model]\nn_head = 3\n",
     "base.model: n_head=3 must divide d_model=128"),
    ("base-inf", 'on = {"model.qk_norm" = true}', None, "[base.model]\nrope_base = inf\n",
     "base.model.rope_base: Input should be a finite number"),
]


@pytest.mark.parametrize("case", BAD_SPECS, ids=[c[0] for c in BAD_SPECS])
def test_a_bad_spec_is_one_line_and_exit_2_from_every_reader(tmp_path, case):
    _, body, flips, base, fragment = case
    if base:  # a base section is given twice in TOML: write the spec by hand
        spec = tmp_path / "s.toml"
        spec.write_text(f'name = "s"\nflips = ["c"]\n{base}[components.c]\n{body}\n')
    else:
        spec = component_spec(tmp_path, body, flips=flips)
    for reader, args in readers(spec, tmp_path).items():
        result = invoke(*args)
        line = one_error_line(result, fragment)
        assert result.output.strip() == line.strip(), (reader, result.output)  # the error line alone
    assert not (tmp_path / "runs").exists()  # nothing was created


@pytest.mark.parametrize("body, field, value", [
    ('on = {"model.qk_norm" = true}', "model.qk_norm", True),
    ('on = {"train.schedule" = "constant"}', "train.schedule", "constant"),
    ('on = {"train.device" = "cpu"}', "train.device", "cpu"),
    ('on = {"train.threads" = 1}', "train.threads", 1),
    ('on = {"train.weight_decay" = 0}\noff = {}', "train.weight_decay", 0.0),  # off = {}: the base's values
])
def test_a_component_on_any_field_type_plans_and_lists(tmp_path, body, field, value):
    spec = component_spec(tmp_path, body)
    listed = invoke("components", spec, "--json")
    assert listed.exit_code == 0, listed.output
    row = {r["name"]: r for r in json.loads(listed.stdout)["components"]}["c"]
    assert row["on"] == {field: value}
    assert invoke("components", spec).exit_code == 0  # the table, off = {} included
    _, plan = load_plan(spec)
    on = next(p for p in plan if p.slug == "reference+c")
    section, key = field.split(".")
    assert getattr(getattr(on.config, section), key) == value
    assert comp.on_names(on.config, comp.table(load_plan(spec)[0].components).values())[-1] == "c"


def test_a_relative_data_source_in_a_component_is_the_spec_folders(tmp_path):
    folder = tmp_path / "specs"
    folder.mkdir()
    write_corpus(folder).rename(folder / "other.txt")
    spec = component_spec(folder, 'on = {"data.source" = "other.txt"}')  # the base reads specs/tiny.txt
    _, plan = load_plan(spec)
    on = next(p for p in plan if p.slug == "reference+c")
    assert on.config.data.source == str((folder / "other.txt").resolve())


def test_user_text_is_never_read_as_markup(tmp_path):
    spec = component_spec(tmp_path, 'about = "[/bold] closes nothing [red]:x:"\non = {"train.weight_decay" = 0.0}')
    result = runner.invoke(app, ["components", str(spec)], env={"COLUMNS": "400"})  # no wrapping
    assert result.exit_code == 0, result.output
    assert "[/bold] closes nothing [red]:x:" in result.output


def test_a_factorial_too_large_is_refused_before_its_points_are_built(tmp_path):
    settings = {"train.lr": 0.5, "train.min_lr_frac": 0.5, "train.weight_decay": 0.5, "train.beta1": 0.5,
                "train.beta2": 0.5, "train.grad_clip": 0.5, "train.z_loss": 0.5, "train.diverge_factor": 2.0,
                "train.sample_temp": 0.5, "train.warmup": 5, "train.eval_batches": 5, "train.log_interval": 5,
                "train.sample_len": 5, "model.qk_norm": True, "model.tie_embeddings": True,
                "model.parallel_block": True, "model.logit_softcap": 5.0}
    assert len(settings) == 17 and 2**17 > MAX_PLAN_RUNS
    lines = ['name = "big"', 'design = "factorial"', f"flips = {toml_value([f'c{i}' for i in range(17)])}"]
    for i, (key, value) in enumerate(settings.items()):
        lines += [f"[components.c{i}]", f'on = {{"{key}" = {toml_value(value)}}}']
    spec = tmp_path / "big.toml"
    spec.write_text("\n".join(lines) + "\n")
    tracemalloc.start()
    try:
        with pytest.raises(ConfigError,
                           match=r"the plan has 131,072 runs \(131,072 configs x 1 axis values x 1 seeds\)"):
            load_plan(spec)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20  # building the 131,072 points first took ~200 MB; 2^24 of them, all memory


def test_a_spec_saved_with_a_byte_order_mark_reads_as_without(tmp_path):
    """Windows editors save UTF-8 with a BOM; tomllib alone calls that 'invalid TOML' at line 1."""
    spec = component_spec(tmp_path, 'on = {"train.lr" = 0.01}')
    plain = invoke("components", spec, "--json")
    spec.write_bytes(b"\xef\xbb\xbf" + spec.read_bytes())
    marked = invoke("components", spec, "--json")
    assert plain.exit_code == 0 and marked.exit_code == 0, marked.output
    assert marked.stdout == plain.stdout

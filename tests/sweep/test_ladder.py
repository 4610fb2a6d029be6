"""Size ladders in specs ([[sizes]]): the plan per size, its budget rule, bad input (one line, exit
2), `anatomy scale-plan` and `ablate --dry-run` per size, and a tiny sized study end to end."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from helpers import invoke, one_error_line
from toy_data import TINY_TRAIN, toml_value, write_spec
from typer.testing import CliRunner

from anatomy_cli.data.load import load_corpus
from anatomy_cli.model import LM
from anatomy_cli.spec.config import ConfigError, ModelConfig
from anatomy_cli.store import runs
from anatomy_cli.sweep.plan import expand, load_spec

runner = CliRunner()
LADDER = {"S": {"d_model": 16, "n_head": 2}, "M": {"d_model": 32, "n_layer": 2}}


def sized_spec(folder: Path, sizes: dict | None = None, top: dict | None = None, extra: str = "", **kw) -> Path:
    """A toy spec with a [[sizes]] entry per item of `sizes` ({name: model settings} or {name: {"model":
    ..., "train": ...}}) and `extra` TOML lines after them."""
    path = write_spec(folder, top=top or {"seeds": 2}, **kw)
    lines = []
    for name, body in (LADDER if sizes is None else sizes).items():
        tables = body if {"model", "train"} >= set(body) and body else {"model": body}
        lines += ["[[sizes]]", f'name = "{name}"'] + [f"{k} = {toml_value(v)}" for k, v in tables.items()]
    path.write_text(path.read_text().replace("[base.model]", "\n".join([extra, "[base.model]"]), 1)
                    + "\n".join(lines) + "\n", encoding="utf-8")
    return path


# ------------------------------------------------------------------------------------------ plan


def test_the_design_runs_at_every_size_paired_on_the_same_seeds(tmp_path):
    plan = expand(load_spec(sized_spec(tmp_path)))
    by_size = {}
    for p in plan:
        by_size.setdefault(p.size.name, []).append(p)
    assert list(by_size) == ["S", "M"] and len(plan) == 2 * 12 * 2  # sizes x the five flips' 12 configs x seeds
    for name, members in by_size.items():
        assert all(p.slug.startswith(f"{name}_") and p.config.name.startswith(f"toy/{name}_") for p in members)
        assert sorted({p.config.seed for p in members}) == [1337, 1338]
    small = by_size["S"][0].config.model
    assert (small.d_model, small.n_head, small.n_kv_head, small.n_layer) == (16, 2, 2, 2)  # MHA base stays MHA
    gqa = next(p for p in by_size["S"] if p.slug == "S_2017+gqa").config.model
    assert gqa.n_kv_head == 1  # gqa still sets its own: half the size's heads
    assert {p.config.train.steps for p in plan} == {TINY_TRAIN["steps"]}  # same-steps, the default
    assert len({p.run_id for p in plan}) == len(plan)


def test_a_spec_without_sizes_plans_exactly_as_before(tmp_path):
    spec = load_spec(write_spec(tmp_path))
    plan = expand(spec)
    assert all(p.size is None and "_" not in p.slug for p in plan)
    for p in plan:  # the id is the slug, the seed and the hash of the config, as it always was
        assert p.run_id == runs.run_id(p.slug, p.config.seed, p.config.model_dump(mode="json"))
    five = expand(load_spec(Path(__file__).resolve().parents[2] / "experiments" / "five-flips.toml"))
    assert "2017-s1337-46b897f2" in {p.run_id for p in five}  # a pinned id of the default study


def test_tokens_per_param_budget_sets_each_sizes_steps_from_its_non_embedding_params(tmp_path):
    spec = load_spec(sized_spec(tmp_path, extra='budget = "tokens-per-param"\ntokens_per_param = 20'))
    plan = expand(spec)
    batch, ctx = TINY_TRAIN["batch_size"], 16
    for name, settings in LADDER.items():
        base = (spec.base.model.model_dump() | settings
                | ({"n_kv_head": settings["n_head"]} if "n_head" in settings else {}))
        n = ModelConfig(**base).non_embedding_params()
        want = math.ceil(20 * n / (batch * ctx))
        assert {p.config.train.steps for p in plan if p.size.name == name} == {want}
    steps = {p.size.name: p.config.train.steps for p in plan}
    assert steps["M"] > steps["S"]
    result = invoke("ablate", sized_spec(tmp_path, extra='budget = "tokens-per-param"\ntokens_per_param = 20'),
                    "--steps", "5", "--dry-run", "--runs-dir", tmp_path / "r")
    one_error_line(result, "--steps 5 sets one budget for every size")


def test_non_embedding_params_are_the_model_less_its_tables():
    for cfg in (ModelConfig(vocab_size=50, d_model=32, n_layer=2, n_head=4, ctx_len=24),
                ModelConfig(vocab_size=50, d_model=32, n_layer=3, n_head=4, n_kv_head=2, norm_pos="pre",
                            pos_type="rope", ffn_type="swiglu", tie_embeddings=True)):
        model = LM(cfg)
        tables = {id(p) for m in model.modules() if isinstance(m, torch.nn.Embedding) for p in m.parameters()}
        tables |= {id(model.head.weight)}
        n = sum(p.numel() for p in model.parameters() if id(p) not in tables)
        assert cfg.non_embedding_params() == n
        assert (cfg.num_params()
                == n + cfg.vocab_size * cfg.d_model * (1 if cfg.tie_embeddings else 2) + cfg.position_params)


def test_a_run_names_exactly_its_size_even_when_one_size_sets_less_than_another(tmp_path):
    from anatomy_cli.report.frames import _size_of
    from anatomy_cli.spec import components as comp

    plan = expand(load_spec(sized_spec(tmp_path, {"S": {"d_model": 16}, "M": {"d_model": 16, "n_layer": 3}})))
    records = [s.record() for s in dict.fromkeys(p.size for p in plan)]
    assert records[0]["settings"] == {"model.d_model": 16, "model.n_layer": 2}  # the base's n_layer, said
    for p in plan:
        assert _size_of(comp.flat_config(p.config), records, p.design.components) == p.size.name


# ------------------------------------------------------------------------------------ bad input


BAD = [
    ("repeated name", {"S": {"d_model": 16, "n_head": 2}, "S ": {}}, "", None),
    ("heads", {"S": {"d_model": 20, "n_head": 3}}, "", "sizes.S.model: n_head=3 must divide d_model=20"),
    ("unknown model key", {"S": {"d_modle": 16}}, "", "sizes.S.model.d_modle: unknown key"),
    ("unknown train key", {"S": {"model": {"d_model": 16}, "train": {"lr_max": 1}}}, "",
     "sizes.S.train.lr_max: unknown key"),
    ("contradicts a role", {"S": {"pos_type": "rope"}}, "", "sizes.S.model.pos_type: component rope of this study"),
    ("ratio <= 0", LADDER, 'budget = "tokens-per-param"\ntokens_per_param = 0',
     "tokens_per_param: Input should be greater than 0"),
    ("ratio missing", LADDER, 'budget = "tokens-per-param"',
     "budget 'tokens-per-param' needs [[sizes]] and tokens_per_param"),
    ("ratio unused", LADDER, "tokens_per_param = 20", "tokens_per_param is only used by budget"),
    ("size sets steps", {"S": {"model": {"d_model": 16}, "train": {"steps": 5}}}, "",
     "sizes.S.train.steps: the budget rule"),
    ("same settings", {"S": {"d_model": 16, "n_head": 2}, "T": {"n_head": 2, "d_model": 16}}, "",
     "sizes.T: the same settings as sizes.S"),
    ("size and axis", {"S": {"n_layer": 1}, "M": {"n_layer": 2}}, 'axes = { n_layer = [1, 2] }',
     "sizes.S.model.n_layer: also an axis"),
    ("plan too large", LADDER, "", "x 500 seeds x 2 sizes); more than 10,000"),
    ("bad name", {"S/M": {"d_model": 16}}, "", "sizes.0.name: String should match pattern"),
]


@pytest.mark.parametrize("what, sizes, extra, fragment", BAD, ids=[b[0] for b in BAD])
def test_bad_ladders_are_one_line_and_exit_2(tmp_path, what, sizes, extra, fragment):
    if what == "repeated name":
        sizes, fragment = {"S": {"d_model": 16, "n_head": 2}}, "sizes: the name 'S' is used by two sizes"
        spec = sized_spec(tmp_path, sizes)
        spec.write_text(spec.read_text() + '[[sizes]]\nname = "S"\nmodel = { d_model = 64 }\n')
    else:
        top = {"seeds": 500} if what == "plan too large" else None  # 500 seeds x 12 configs x 2 sizes
        spec = sized_spec(tmp_path, sizes, top=top, extra=extra)
    for args in (["ablate", spec, "--dry-run", "--runs-dir", tmp_path / "r"], ["scale-plan", spec, "--no-estimate"]):
        one_error_line(invoke(*args), fragment)
    with pytest.raises(ConfigError):
        expand(load_spec(spec))


def test_a_size_redefined_in_a_sweep_directory_is_refused(tmp_path):
    from anatomy_cli.sweep.plan import record_design

    plan = expand(load_spec(sized_spec(tmp_path)))
    (tmp_path / "sweep").mkdir()
    record_design(tmp_path / "sweep", plan[0].design, [plan[0].size])
    sweep = json.loads((tmp_path / "sweep" / "sweep.json").read_text())
    assert sweep["sizes"] == [{"name": "S", "settings": {"model.d_model": 16, "model.n_head": 2, "model.n_layer": 2,
                                                         "model.n_kv_head": 2}, "budget": "same-steps"}]
    (tmp_path / "b").mkdir()
    other = expand(load_spec(sized_spec(tmp_path / "b", {"S": {"d_model": 8, "n_head": 2}})))
    with pytest.raises(ConfigError, match="size S was defined differently"):
        record_design(tmp_path / "sweep", other[0].design, [other[0].size])


# ---------------------------------------------------------------------------------- scale-plan


def test_scale_plan_per_size_numbers(tmp_path):
    spec = sized_spec(tmp_path, top={"seeds": 3})
    result = invoke("scale-plan", spec, "--no-estimate", "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    rows = {r["size"]: r for r in doc["sizes"]}
    assert list(rows) == ["S", "M"] and doc["budget"] == "same-steps" and doc["no_estimate"] == "--no-estimate"
    corpus = load_corpus(str(tmp_path / "tiny.txt"))
    for name in rows:
        plan = [p for p in expand(load_spec(spec)) if p.size.name == name]
        r, cfg = rows[name], plan[0].config
        model = cfg.model.model_copy(update={"vocab_size": len(corpus.vocab)})
        tokens = cfg.train.steps * cfg.train.batch_size * cfg.model.ctx_len
        assert r["runs"] == len(plan) == 36 and r["tokens"] == tokens
        assert (r["params"], r["non_embedding_params"]) == (model.num_params(), model.non_embedding_params())
        assert r["flops"] == model.flops_per_token() * tokens
        assert r["corpus_tokens"] == len(corpus.train) and r["epochs"] == pytest.approx(tokens / len(corpus.train))
        assert r["corpus_tokens_per_param"] == pytest.approx(len(corpus.train) / r["non_embedding_params"])
        assert r["warnings"] == [] and r["est_s"] is None


def test_scale_plan_warns_when_a_size_would_overfit_its_corpus(tmp_path):
    spec = sized_spec(tmp_path, train={"steps": 2000})  # 2000 x 4 x 16 tokens over 5,400: 24 epochs
    result = invoke("scale-plan", spec, "--no-estimate")
    assert result.exit_code == 0, result.output
    assert result.output.count("overfit risk: 24 epochs over its corpus (> 10)") == 2
    data = json.loads(invoke("scale-plan", spec, "--no-estimate", "--json").output)
    assert all(r["warnings"] == ["overfit risk: 24 epochs over its corpus (> 10)"] for r in data["sizes"])
    # without the corpus: a vocabulary to assume, and the corpus columns unknown
    spec.write_text(spec.read_text().replace(str(tmp_path / "tiny.txt"), str(tmp_path / "missing.txt")))
    one_error_line(invoke("scale-plan", spec, "--no-estimate"), "corpus not found")
    data = json.loads(invoke("scale-plan", spec, "--no-estimate", "--vocab", "100", "--json").output)
    assert all(r["corpus_tokens"] is None and r["warnings"] == [] for r in data["sizes"])
    assert data["sizes"][0]["params"] == data["sizes"][0]["non_embedding_params"] + 2 * 100 * 16 + 16 * 16


@pytest.mark.slow
@pytest.mark.process
def test_scale_plan_estimates_from_this_machines_calibration_and_dry_run_shows_sizes(tmp_path):
    spec = sized_spec(tmp_path)
    data = json.loads(invoke("scale-plan", spec, "--workers", "1", "--json").output)
    assert all(r["est_s"] > 0 for r in data["sizes"]) and data["total_s"] >= max(r["est_s"] for r in data["sizes"])
    result = invoke("ablate", spec, "--dry-run", "--workers", "1", "--runs-dir", tmp_path / "r")
    assert result.exit_code == 0, result.output
    assert "per size (budget same-steps):" in result.output and "tokens/run" in result.output
    assert all(f"{name}_2017" in result.output for name in LADDER)


# ---------------------------------------------------------------------------------- end to end


@pytest.mark.slow
@pytest.mark.process
def test_a_tiny_sized_study_end_to_end(tmp_path):
    """Two sizes of one spec component, add-one only, three seeds: 12 runs of 12 steps."""
    extra = ('flips = ["lr3"]\ndirections = ["add-one"]\n'
             '[components.lr3]\nabout = "a larger learning rate"\non = { "train.lr" = 1e-2 }\n')
    spec = sized_spec(tmp_path, {"S": {"d_model": 16, "n_head": 2}, "M": {"d_model": 32}}, top={"seeds": 3},
                      extra=extra)
    result = invoke("ablate", spec, "--workers", "2", "--runs-dir", tmp_path / "runs")
    assert result.exit_code == 0, result.output
    assert "Across sizes" in result.output and "lr3: added" in result.output
    sweep = json.loads((tmp_path / "runs" / "toy" / "sweep.json").read_text())
    assert [s["name"] for s in sweep["sizes"]] == ["S", "M"]
    report = tmp_path / "runs" / "toy" / "report"
    doc = json.loads((report / "report.json").read_text())
    assert {r["size"] for r in doc["runs"]} == {"S", "M"} and len(doc["runs"]) == 12
    assert [s["size"] for s in doc["scale"]["sizes"]] == ["S", "M"]
    assert (report / "scale.png").read_bytes()[:4] == b"\x89PNG" and (report / "effects-by-size.csv").is_file()
    assert "## Effects across scale" in (report / "report.md").read_text()

"""The component table as data: built-ins, spec components, plans and roles derived from it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from toy_data import write_spec
from typer.testing import CliRunner

from anatomy_cli.cli.main import app
from anatomy_cli.report import effects as effects_mod
from anatomy_cli.report import frames, write
from anatomy_cli.report.build import build_report
from anatomy_cli.spec import components as comp
from anatomy_cli.spec.config import AblationSpec, ConfigError, ModelConfig, RunConfig, validate
from anatomy_cli.sweep.plan import design_of, execute, expand, load_spec, spec_table

runner = CliRunner()
MODERN = ("qknorm", "tied", "parallel", "zloss", "softcap", "nope", "gdn", "swa", "moe", "mla", "sinks", "gattn",
          "partrope", "dsa")
CS336 = ("silu", "nonorm")  # CS336's two ablations, declared through the parts API (spec/parts.py)
LLAMA_BASE = {"norm_type": "rmsnorm", "norm_pos": "pre", "pos_type": "rope", "ffn_type": "swiglu", "n_kv_head": 2}
WD0 = {"about": "no weight decay", "off": {"train.weight_decay": 0.1}, "on": {"train.weight_decay": 0.0}}


def spec(**kw) -> AblationSpec:
    return validate(AblationSpec, {"name": "t", **kw})


# ------------------------------------------------------------------------------ the table


def test_table_holds_the_five_then_six_modern_parts_with_sources():
    assert comp.FIVE == ("rmsnorm", "prenorm", "rope", "swiglu", "gqa")
    assert comp.BUILTIN_NAMES == comp.FIVE + MODERN + CS336
    for c in comp.BUILTINS:
        assert c.about and c.source and c.on, c.name
        assert all(k.split(".")[0] in comp.SECTIONS for k in c.keys), c.name


def test_states_of_the_two_ends_and_labels():
    cfg_2017 = ModelConfig()
    cfg_llama = ModelConfig(**LLAMA_BASE)
    assert comp.on_names(cfg_2017) == ()
    assert comp.on_names(cfg_llama) == comp.FIVE
    assert comp.label(cfg_2017) == "2017" and comp.label(cfg_llama) == "llama"
    assert comp.label(ModelConfig(**LLAMA_BASE, qk_norm=True)) == "llama+qknorm"
    assert comp.label(ModelConfig(pos_type="rope", ffn_type="swiglu")) == "rope+swiglu"
    zl = validate(RunConfig, {"model": LLAMA_BASE, "train": {"z_loss": 1e-4}})
    assert comp.label(zl) == "llama+zloss"
    # NoPE: neither learned nor RoPE, so rope is off and nope on
    assert comp.states(ModelConfig(pos_type="nope"))["rope"] is None
    assert comp.on_names(ModelConfig(pos_type="nope")) == ("nope",)


def test_gqa_state_is_the_relation_not_a_value():
    gqa = comp.BY_NAME["gqa"]
    for n_head, n_kv, on in ((4, 4, False), (4, 2, True), (4, 1, True), (8, 8, False), (8, 4, True)):
        assert gqa.state(comp.flat_config(ModelConfig(d_model=64, n_head=n_head, n_kv_head=n_kv))) is on


def test_components_command_lists_the_table_as_json():
    result = runner.invoke(app, ["components", "--json"])
    assert result.exit_code == 0, result.output
    rows = {r["name"]: r for r in json.loads(result.stdout)["components"]}
    assert set(comp.BUILTIN_NAMES) <= set(rows)
    assert rows["rope"]["off"] == {"model.pos_type": "learned"} and rows["rope"]["on"] == {"model.pos_type": "rope"}
    assert rows["nope"]["off"] is None  # the base's positions
    # parameters each part adds at the published size, from the two ends
    assert rows["rope"]["params_from_2017"] == -128 * 128  # the learned table goes
    assert rows["gqa"]["params_from_2017"] == -4 * 2 * 2 * 32 * 128  # K and V lose 2 of 4 heads per layer
    assert rows["rmsnorm"]["params_from_llama"] == -9 * 128  # 8 block norms + the final norm lose their bias
    assert rows["zloss"]["params_from_2017"] is None  # a training option
    table = runner.invoke(app, ["components"])
    assert table.exit_code == 0 and "qknorm" in table.output and "-16,384" in table.output


# ------------------------------------------------------------------------------ plans


def test_five_flips_plan_keeps_its_slugs_roles_and_states():
    plan = expand(load_spec(Path(__file__).resolve().parents[2] / "experiments" / "five-flips.toml"))
    assert [p.slug for p in plan] == ["2017", *(f"2017+{f}" for f in comp.FIVE), "llama",
                                      *(f"llama-{f}" for f in comp.FIVE)]
    for p in plan:
        on = set(comp.on_names(p.config))
        want = {"reference": set(), "all-on": set(comp.FIVE), "add-one": {p.flip},
                "remove-one": set(comp.FIVE) - {p.flip}}[p.role]
        assert on == want, p.slug


def test_run_ids_of_existing_studies_do_not_change():
    """Fields added at their old-behaviour default stay out of the id: finished runs are still skipped."""
    ci = expand(load_spec(Path(__file__).resolve().parents[2] / "experiments" / "ci-regression.toml"))
    ids = {p.slug: p.run_id for p in ci}
    assert ids["2017"] == "2017-s1337-01654518" and ids["llama-gqa"] == "llama-gqa-s1337-d9440539"
    tied = expand(spec(flips=["tied"]))
    assert len({p.run_id.rsplit("-", 1)[1] for p in tied}) == len(tied)  # switched on, it is hashed


def test_a_subset_of_the_five_still_compares_against_the_2017_and_llama_ends():
    plan = expand(spec(flips=["rope"]))
    assert [p.slug for p in plan] == ["2017", "2017+rope", "llama", "llama-rope"]
    assert comp.on_names(plan[2].config) == comp.FIVE


def test_n_head_axis_plans_gqa_against_each_runs_own_n_head():
    """The gqa settings follow the axis value (the bug: they came from the base n_head)."""
    plan = expand(spec(base={"model": {"d_model": 64}}, axes={"n_head": [2, 4, 8]}))
    assert len(plan) == 12 * 3
    for p in plan:
        m = p.config.model
        gqa_on = "gqa" in comp.on_names(p.config)
        planned_on = {"reference": False, "all-on": True, "add-one": p.flip == "gqa",
                      "remove-one": p.flip != "gqa"}[p.role]
        assert gqa_on == planned_on, p.slug
        assert m.n_kv_head == (m.n_head // 2 if gqa_on else m.n_head), p.slug


def test_an_axis_that_contradicts_a_role_is_refused():
    with pytest.raises(ConfigError, match=r"2017_n_kv_head=1: planned \(reference\) with gqa off, but "
                                          r"model.n_kv_head=1 \(set by axes.n_kv_head\) makes it on"):
        expand(spec(axes={"n_kv_head": [1, 2]}))
    with pytest.raises(ConfigError, match=r"planned \(add-one\) with gqa on, but model.n_kv_head=1"):
        expand(spec(gqa_kv_head=1, axes={"n_head": [1]}, base={"model": {"n_kv_head": 1}}))


def test_a_base_that_already_has_a_component_on_is_refused():
    with pytest.raises(ConfigError, match=r"reference\) with nope off, but model.pos_type='nope' \(the base's value\)"):
        expand(spec(flips=["nope"], base={"model": {"pos_type": "nope"}}))


def test_two_components_setting_one_field_are_refused_naming_both():
    with pytest.raises(ConfigError, match="components rope and nope both set model.pos_type"):
        design_of(spec(flips=["rope", "nope"]))
    with pytest.raises(ConfigError, match="components rope and nope both set model.pos_type"):
        expand(spec(only=["nope"]))  # --flip nope on the five-flips design


def test_modern_spec_adds_each_of_the_six_to_the_llama_end():
    s = load_spec(Path(__file__).resolve().parents[2] / "experiments" / "modern.toml")
    plan = expand(s)
    assert len(s.seed_list) == 3 and len(plan) == 7 * 3
    ref = [p for p in plan if p.role == "reference"]
    assert {comp.label(p.config) for p in ref} == {"llama"}
    assert {p.config.model.n_kv_head for p in plan} == {2}
    for p in plan:
        if p.role == "add-one":
            assert comp.on_names(p.config) == (*(f for f in comp.FIVE if not (p.flip == "nope" and f == "rope")),
                                               p.flip), p.slug
            assert p.slug == f"reference+{p.flip}"


# ------------------------------------------------------------------------------ spec components


def test_spec_component_expands_against_the_base():
    s = spec(components={"wd0": WD0}, flips=["rope", "wd0"])
    d = design_of(s)
    assert d.names == (*comp.FIVE, "wd0") and d.ends == ("reference", "all-on")
    plan = {p.slug: p for p in expand(s)}
    assert set(plan) == {"reference", "reference+rope", "reference+wd0", "all-on", "all-on-rope", "all-on-wd0"}
    assert plan["reference"].config.train.weight_decay == 0.1 and plan["reference+wd0"].config.train.weight_decay == 0.0
    assert comp.label(plan["reference+wd0"].config, spec_table(s).values()) == "2017+wd0"
    assert comp.on_names(plan["all-on"].config) == comp.FIVE


def test_flip_option_takes_a_spec_component(tmp_path):
    plan = expand(spec(components={"wd0": WD0}, flips=["rope"], only=["wd0"]))  # --flip wd0
    assert {p.flip for p in plan if p.flip} == {"wd0"}
    with pytest.raises(ConfigError, match=r"only \(--flip\): unknown component\(s\) wd1"):
        expand(spec(components={"wd0": WD0}, flips=["rope"], only=["wd1"]))


@pytest.mark.parametrize("declared, message", [
    ({"rope": WD0}, "components.rope: a built-in component has this name"),
    ({"wd0": {"on": {"train.wd": 0.0}}}, r"components.wd0.on: 'train.wd' is not a field of model, train or data"),
    ({"wd0": {"on": {"weight_decay": 0.0}}}, "is not a field of model, train or data"),
    ({"wd0": {"on": {"train.weight_decay": -1.0}}}, r"components.wd0.on.train.weight_decay: Input should be greater"),
    ({"wd0": {"on": {"train.weight_decay": "none"}}},
     r"components.wd0.on.train.weight_decay: Input should be a valid number"),
    ({"wd0": {"on": {"train.weight_decay": 0.1}, "off": {"train.weight_decay": 0.1}}}, "on and off are the same"),
    ({"wd0": {"on": {}}}, "give at least one dotted setting"),
])
def test_bad_spec_components_are_one_line_errors(declared, message):
    with pytest.raises(ConfigError, match=message):
        expand(spec(components=declared, flips=list(declared)))


def test_bad_component_name_is_refused():
    with pytest.raises(ConfigError, match="a name is lower-case letters"):
        spec(components={"Wd-0": WD0})


def test_ablate_dry_run_json_prints_the_plan(tmp_path):
    path = write_spec(tmp_path, top={"flips": ["wd0"], "components": {"wd0": WD0}, "seeds": 2})
    result = runner.invoke(app, ["ablate", str(path), "--dry-run", "--json", "--runs-dir", str(tmp_path / "runs")])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert [c["name"] for c in doc["components"]] == ["wd0"]
    assert [(r["slug"], r["role"], r["seed"]) for r in doc["runs"]] == [
        ("reference", "reference", 1337), ("reference", "reference", 1338),
        ("reference+wd0", "add-one", 1337), ("reference+wd0", "add-one", 1338)]  # the ends are these two
    assert doc["runs"][2]["config"]["train"]["weight_decay"] == 0.0 and doc["runs"][2]["status"] == "pending"
    assert not (tmp_path / "runs").exists()  # a dry run writes nothing
    bad = runner.invoke(app, ["ablate", str(path), "--json"])
    assert bad.exit_code == 2 and "--json prints the plan" in bad.output


@pytest.mark.slow
def test_spec_component_runs_and_reports_its_effect_with_a_ci(tmp_path):
    path = write_spec(tmp_path, top={"flips": ["wd0"], "components": {"wd0": WD0}, "seeds": 3,
                                     "directions": ["add-one"]},
                      train={"steps": 8, "eval_interval": 4, "weight_decay": 0.1, "lr": 3e-2})
    plan = expand(load_spec(path))
    assert len(plan) == 6
    execute(plan, tmp_path / "runs" / "t", workers=1)
    sweep = json.loads((tmp_path / "runs" / "t" / "sweep.json").read_text())
    assert [c["name"] for c in sweep["components"]] == ["wd0"]
    runs_df, _ = frames.load_runs(tmp_path / "runs" / "t")
    assert sorted(runs_df["role"]) == ["+wd0"] * 3 + ["reference"] * 3
    assert runs_df["wd0"].sum() == 3
    effects = effects_mod.component_effects(runs_df)
    row = effects[(effects["flip"] == "wd0") & (effects["direction"] == "add-one")].iloc[0]
    assert row["n_pairs"] == 3 and row["against"] == "reference end"
    assert row["family"] == 1 and row["raw_low"] < row["gain"] < row["raw_high"]
    assert (row["adj_low"], row["adj_high"]) == pytest.approx((row["raw_low"], row["raw_high"]), rel=1e-12)  # m = 1
    paths = write.write_report(build_report(tmp_path / "runs" / "t"))
    assert "wd0" in paths["report.md"].read_text()


def test_report_pairs_gqa_under_an_n_head_axis(tmp_path):
    """Runs written from an n_head-axis plan: roles come out as planned, and each n_head is a group."""
    s = spec(base={"model": {"d_model": 64}}, axes={"n_head": [2, 4]}, flips=["gqa"], seeds=2)
    plan = expand(s)
    for p in plan:
        run = tmp_path / p.run_id
        run.mkdir()
        cfg = p.config.model_dump(mode="json")
        cfg["model"]["vocab_size"] = 50
        (run / "config.json").write_text(json.dumps(cfg))
        best = 2.0 - 0.1 * (p.role in ("all-on", "remove-one")) + 0.01 * (p.flip == "gqa") * p.config.model.n_head
        (run / "summary.json").write_text(json.dumps({"status": "completed", "best_val_loss": best,
                                                      "best_val_bpb": best}))
    runs_df, _ = frames.load_runs(tmp_path)
    assert (runs_df["role"] != "").all()
    effects = effects_mod.component_effects(runs_df)
    add = effects[(effects["flip"] == "gqa") & (effects["direction"] == "add-one")].set_index("group")
    assert add.loc["n_head=2", "gain"] == pytest.approx(-0.02)
    assert add.loc["n_head=4", "gain"] == pytest.approx(-0.04)
    assert (add["n_pairs"] == 2).all() and set(add["against"]) == {"2017 end"}


def test_two_component_study_pairs_both_directions(tmp_path):
    """With two components the run with only A on is both A's add-one and B's remove-one."""
    s = spec(components={"wd0": WD0, "lr2": {"on": {"train.lr": 2e-3}, "off": {"train.lr": 1e-3}}},
             flips=["wd0", "lr2"], base={"train": {"lr": 1e-3}})
    (tmp_path / "sweep.json").write_text(json.dumps({"components": [comp.record(c) for c in design_of(s).components]}))
    loss = {"reference": 2.0, "reference+wd0": 1.9, "reference+lr2": 1.7, "all-on": 1.5}
    plan = expand(s)
    assert {p.slug for p in plan} == set(loss)  # all-on-wd0 is reference+lr2: planned once
    for p in plan:
        if p.slug in loss:
            run = tmp_path / p.run_id
            run.mkdir()
            (run / "config.json").write_text(json.dumps(p.config.model_dump(mode="json")
                                                        | {"model": {**p.config.model.model_dump(mode="json"),
                                                                     "vocab_size": 50}}))
            (run / "summary.json").write_text(json.dumps({"status": "completed", "best_val_loss": loss[p.slug],
                                                                        "best_val_bpb": loss[p.slug]}))
    effects = effects_mod.component_effects(frames.load_runs(tmp_path)[0]).set_index(["flip", "direction"])
    assert effects.loc[("wd0", "add-one"), "gain"] == pytest.approx(0.1)
    assert effects.loc[("lr2", "add-one"), "gain"] == pytest.approx(0.3)
    assert effects.loc[("wd0", "remove-one"), "gain"] == pytest.approx(0.2)  # lr2 alone - all-on
    assert effects.loc[("lr2", "remove-one"), "gain"] == pytest.approx(0.4)  # wd0 alone - all-on
    assert set(effects["against"]) == {"reference end", "all-on end"}


def test_a_built_in_row_must_say_what_a_llama_export_does_with_it():
    """No default: a row that forgets `llama` fails at import, instead of exporting a Llama that
    silently ignores the part."""
    with pytest.raises(TypeError, match="llama"):
        comp.Component("x", "about", "source", on={"model.qk_norm": True})
    with pytest.raises(ValueError, match="llama must be one of on, off, either"):
        comp.Component("x", "about", "source", on={"model.qk_norm": True}, llama="maybe")
    assert {c.llama for c in comp.BUILTINS} <= set(comp.LLAMA_STATES)

"""The parts registry (spec/parts.py): anatomy's own parts declared in it, plugin files and installed
packages loaded into it, and what a config does with a part: its slot field, its options, its code in
the run id. Bad input is one line naming the file, the part or the key (PartError, ConfigError)."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest
from toy_data import write_spec

from anatomy_cli.spec import components
from anatomy_cli.spec import parts as registry
from anatomy_cli.spec.config import ConfigError, ModelConfig, RunConfig, check_setting, hash_neutral, validate
from anatomy_cli.store import runs
from anatomy_cli.sweep.plan import expand, load_spec

ROOT = Path(__file__).resolve().parents[2]
RELU2 = ROOT / "examples" / "parts" / "relu2.py"

HEAD = "from torch import nn\nfrom anatomy_cli.model.parts import Options, part\n"
FFN = HEAD + textwrap.dedent('''
    @part("{name}", slot="{slot}", params=lambda cfg, o: 2 * cfg.d_model * 64)
    class Part(nn.Module):
        def __init__(self, cfg):
            super().__init__()
            self.up, self.down = nn.Linear(cfg.d_model, 64, bias=False), nn.Linear(64, cfg.d_model, bias=False)

        def forward(self, x, stats=None):
            return self.down(self.up(x).relu())
''')


def plugin(tmp_path: Path, text: str, name: str = "mine.py") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def ffn(tmp_path: Path, name: str = "wide", slot: str = "ffn", file: str = "mine.py") -> Path:
    return plugin(tmp_path, FFN.format(name=name, slot=slot), file)


# ------------------------------------------------------------------------------ anatomy's own parts


def test_anatomy_s_own_ffns_norms_and_positions_are_parts_of_the_registry():
    assert registry.names("ffn") == ("gelu", "swiglu", "silu")
    assert registry.names("norm") == ("layernorm", "rmsnorm", "none")
    assert registry.names("positions") == ("learned", "rope", "nope")
    assert registry.names("mixer") == ("softmax", "mla")  # the block's own kinds, outside the registry
    assert all(not p.plugin and isinstance(p.build, str) for p in registry.REGISTRY.values())  # dotted: no torch


def test_a_slot_field_names_a_part_and_says_the_choices():
    with pytest.raises(ConfigError, match=r"ffn_type='relu3' is no ffn part: choose 'gelu', 'swiglu', 'silu'"):
        validate(ModelConfig, {"ffn_type": "relu3"})
    with pytest.raises(ConfigError, match=r"norm_type='rope' is no norm part.*'rope' is a positions part"):
        validate(ModelConfig, {"norm_type": "rope"})


def test_silu_holds_swiglu_s_parameters_exactly_and_no_norm_none():
    for d in (32, 64, 96, 128, 200):
        swiglu, silu = ModelConfig(d_model=d, n_head=4, ffn_type="swiglu"), ModelConfig(d_model=d, n_head=4,
                                                                                         ffn_type="silu")
        assert silu.ffn_params() == swiglu.ffn_params() and silu.ffn_hidden == 3 * swiglu.ffn_hidden // 2
    assert ModelConfig(ffn_type="silu").ffn_hidden == 528  # d 128: SwiGLU's 352 (ceil(8/3 d, 32)) x 3/2
    assert ModelConfig(norm_type="none").norm_params == 0


# ------------------------------------------------------------------------------ loading plugins


def test_a_plugin_file_registers_its_part_with_its_file_and_hash(tmp_path):
    path = ffn(tmp_path)
    loaded = registry.load_plugins([path])[0]
    part = registry.REGISTRY["wide"]
    assert loaded.parts == ["wide"] and part.slot == "ffn" and part.origin == str(path.resolve())
    assert part.sha256 == registry.sha256_text(path.read_text()) and part.plugin
    assert registry.names("ffn")[-1] == "wide"
    assert "wide" in [c.name for c in components.rows()]  # a component like any other
    assert registry.load_plugins([path])[0] is loaded  # the same content: loaded once


def test_an_edited_plugin_replaces_its_parts(tmp_path):
    path = ffn(tmp_path)
    first = registry.load_plugins([path])[0].sha256
    path.write_text(path.read_text() + "\n# edited\n")
    assert registry.load_plugins([path])[0].sha256 != first == registry.sha256_text(FFN.format(name="wide",
                                                                                                slot="ffn"))
    assert registry.REGISTRY["wide"].sha256 != first


@pytest.mark.parametrize("text, fragment", [
    ("import torch\nraise RuntimeError('no such weights')\n",
     "does not import: RuntimeError: no such weights"),
    ("def broken(:\n", "does not import: SyntaxError: invalid syntax (line 1)"),
    (HEAD + "x = undefined_name\n", "does not import: NameError: name 'undefined_name' is not defined"),
    (FFN.format(name="gelu", slot="ffn"), "part 'gelu' (FILE) shadows a built-in part of that name"),
    (FFN.format(name="moe", slot="ffn"), "part 'moe' (FILE) shadows a built-in component of that name"),
    (FFN.format(name="softmax", slot="mixer"), "part 'softmax' (FILE) shadows anatomy's own mixer of that name"),
    (FFN.format(name="wide", slot="attention"), "slot 'attention' does not exist; the slots are mixer, ffn, norm, "
                                                "positions"),
    (FFN.format(name="Wide", slot="ffn"), "a name is lower-case letters, digits and _"),
    (FFN.format(name="wide", slot="ffn") + FFN.format(name="wide", slot="ffn").replace(HEAD, ""),
     "two parts named 'wide'"),
    ("import math\n", "declares no part"),
])
def test_a_plugin_that_cannot_be_used_is_one_line_naming_it(tmp_path, text, fragment):
    path = plugin(tmp_path, text)
    with pytest.raises(registry.PartError) as err:
        registry.load_plugins([path])
    message = str(err.value)
    assert fragment.replace("FILE", str(path.resolve())) in message and "\n" not in message
    assert str(path.resolve()) in message
    assert not [p for p in registry.REGISTRY.values() if p.plugin]  # nothing of it is left registered


def test_two_files_may_not_declare_one_name(tmp_path):
    registry.load_plugins([ffn(tmp_path, file="a.py")])
    other = plugin(tmp_path, FFN.format(name="wide", slot="ffn") + "\n# another file's code\n", "b.py")
    with pytest.raises(registry.PartError, match=r"two parts named 'wide': .*a\.py and .*b\.py"):
        registry.load_plugins([other])
    assert registry.REGISTRY["wide"].origin.endswith("a.py")  # the first one still works


def test_a_missing_plugin_file_is_one_line(tmp_path):
    with pytest.raises(registry.PartError, match="plugin not found: .*nowhere.py"):
        registry.load_plugins([tmp_path / "nowhere.py"])


def write_package(site: Path, name: str, module_text: str, entry: str) -> None:
    """A distribution installed in `site` (a path entry): its module and its entry point in anatomy.parts."""
    (site / f"{name}.py").write_text(module_text, encoding="utf-8")
    info = site / f"{name}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n", encoding="utf-8")
    (info / "entry_points.txt").write_text(f"[anatomy.parts]\n{entry}\n", encoding="utf-8")


def test_installed_packages_declare_parts_and_one_that_fails_is_a_warning(tmp_path, monkeypatch):
    site = tmp_path / "site"
    site.mkdir()
    write_package(site, "goodparts", FFN.format(name="pkgffn", slot="ffn"), "pkgffn = goodparts")
    write_package(site, "badparts", "raise ImportError('needs triton')\n", "broken = badparts")
    monkeypatch.syspath_prepend(str(site))
    try:
        warnings = registry.reread_entry_points()
        assert "pkgffn" in registry.REGISTRY and registry.REGISTRY["pkgffn"].origin.startswith("entry point pkgffn")
        assert registry.REGISTRY["pkgffn"].sha256 == registry.sha256_text((site / "goodparts.py").read_bytes())
        assert warnings == ["entry point broken (badparts) of anatomy.parts does not load: ImportError: needs "
                            "triton; its parts are left out"]
        validate(ModelConfig, {"ffn_type": "pkgffn"})  # usable as any part
    finally:
        for name in ("goodparts", "badparts"):
            sys.modules.pop(name, None)
        monkeypatch.undo()
        registry.reread_entry_points()


# ------------------------------------------------------------------------------ options and --set


def test_options_are_filled_in_for_the_part_a_model_uses_and_typed_strictly():
    registry.load_plugins([RELU2])
    cfg = validate(ModelConfig, {"ffn_type": "relu2"})
    assert cfg.part_options == {"relu2": {"hidden": None}} and set(cfg.part_code) == {"relu2"}
    assert cfg.ffn_params() == 2 * 128 * 512
    wider = validate(ModelConfig, {"ffn_type": "relu2", "part_options": {"relu2": {"hidden": 528}}})
    assert wider.ffn_params() == ModelConfig(ffn_type="swiglu").ffn_params()  # matched to SwiGLU exactly
    with pytest.raises(ConfigError, match=r"part_options\.relu2\.hidden: Input should be a valid integer, got 1\.5"):
        validate(ModelConfig, {"ffn_type": "relu2", "part_options": {"relu2": {"hidden": 1.5}}})
    with pytest.raises(ConfigError, match=r"part_options\.relu2\.width: unknown key"):
        validate(ModelConfig, {"ffn_type": "relu2", "part_options": {"relu2": {"width": 3}}})
    with pytest.raises(ConfigError, match=r"part_options\.nothing: no part of that name is loaded"):
        validate(ModelConfig, {"part_options": {"nothing": {}}})
    assert validate(ModelConfig, {}).part_options is None  # a model without such parts holds no table


def test_set_reaches_a_part_s_options_strictly():
    registry.load_plugins([RELU2])
    check_setting("model.part_options.relu2.hidden", 256, "256")
    with pytest.raises(ConfigError, match=r"--set model\.part_options\.relu2\.hidden: expected an integer, got x"):
        check_setting("model.part_options.relu2.hidden", "x", "x")
    with pytest.raises(ConfigError, match=r"did you mean model\.part_options\.relu2\.hidden\?"):
        check_setting("model.part_options.relu2.hiden", 3, "3")
    with pytest.raises(ConfigError, match=r"'nope2' is no part that is loaded"):
        check_setting("model.part_options.nope2.x", 3, "3")


# ------------------------------------------------------------------------------ the run id


def test_a_plugin_part_s_code_and_options_enter_the_run_id_and_nothing_else_does(tmp_path):
    path = tmp_path / "relu2.py"
    path.write_text(RELU2.read_text())
    data = {"plugins": [str(path)], "model": {"ffn_type": "relu2"}}
    cfg = validate(RunConfig, data)
    first = runs.config_hash(cfg.model_dump(mode="json"))
    wider = validate(RunConfig, {**data, "model": {**data["model"], "part_options": {"relu2": {"hidden": 256}}}})
    assert runs.config_hash(wider.model_dump(mode="json")) != first
    path.write_text(path.read_text() + "\n# an edit\n")
    registry.load_plugins([path])  # read afresh, as a new command does
    edited = validate(RunConfig, data)
    assert edited.model.part_code != cfg.model.part_code and runs.config_hash(edited.model_dump(mode="json")) != first
    # a run that does not use the part keeps the id it has without the plugin, whatever the plugin holds
    plain = RunConfig().model_dump(mode="json")
    listed = validate(RunConfig, {"plugins": [str(path)]}).model_dump(mode="json")
    with_options = {**listed, "model": {**listed["model"], "part_options": {"relu2": {"hidden": 256}},
                                        "part_code": {"relu2": "0" * 64}}}
    assert runs.config_hash(listed) == runs.config_hash(with_options) == runs.config_hash(plain)
    assert hash_neutral()["plugins"] == "any value"


def test_a_shipped_spec_with_a_plugin_listed_keeps_its_pinned_ids(tmp_path):
    """ci-regression with relu2.py in base.plugins: no run uses relu2, so every id is the pinned one."""
    from tests.spec.test_config import PINNED_IDS

    spec = tmp_path / "ci-regression.toml"
    text = (ROOT / "experiments" / "ci-regression.toml").read_text()
    spec.write_text(text.replace("[base]\n", f"[base]\nplugins = [\"{RELU2}\"]\n", 1))
    assert "plugins" in spec.read_text()
    assert sorted(p.run_id for p in expand(load_spec(spec))) == PINNED_IDS["ci-regression"]


def test_a_spec_s_plugins_resolve_against_its_folder_and_plan_the_part(tmp_path):
    (tmp_path / "parts").mkdir()
    (tmp_path / "parts" / "relu2.py").write_text(RELU2.read_text())
    spec = write_spec(tmp_path, top={"flips": ["relu2"], "directions": ["add-one"]},
                      model={"norm_type": "rmsnorm", "norm_pos": "pre", "pos_type": "rope", "ffn_type": "swiglu"})
    spec.write_text(spec.read_text().replace("[base.model]", '[base]\nplugins = ["parts/relu2.py"]\n[base.model]'))
    plan = expand(load_spec(spec))
    assert [p.slug for p in plan] == ["reference", "reference+relu2"]
    assert plan[0].config.plugins == [str((tmp_path / "parts" / "relu2.py").resolve())]
    assert plan[1].config.model.ffn_type == "relu2" and plan[0].config.model.part_code is None

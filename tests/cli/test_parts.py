"""`anatomy components` (the table, with plugins) and `anatomy components check FILE` (the battery) through
CliRunner: what each prints, its exit codes, and bad input in one line (exit 2)."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from helpers import flat, invoke, one_error_line

from anatomy_cli.spec import parts as registry

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "parts"
LEAKY = textwrap.dedent('''
    from torch import nn
    from anatomy_cli.model.parts import part

    @part("leaky", slot="ffn", params=lambda cfg, o: 2 * cfg.d_model * 64)
    class Leaky(nn.Module):
        def __init__(self, cfg):
            super().__init__()
            self.up, self.down = nn.Linear(cfg.d_model, 64, bias=False), nn.Linear(64, cfg.d_model, bias=False)

        def forward(self, x, stats=None):
            h = self.up(x).relu()
            return self.down(h + h.roll(-1, dims=1))  # position t reads t + 1
    ''')


def test_bare_components_still_lists_the_table_and_a_plugin_s_part_joins_it():
    bare = invoke("components", "--json")
    assert bare.exit_code == 0 and "relu2" not in bare.stdout
    result = invoke("components", "--plugin", EXAMPLES / "relu2.py", "--json")
    assert result.exit_code == 0, result.output
    rows = {r["name"]: r for r in json.loads(result.stdout)["components"]}
    relu2 = rows["relu2"]
    assert relu2["slot"] == "ffn" and relu2["on"] == {"model.ffn_type": "relu2"} and relu2["off"] is None
    assert relu2["origin"] == str((EXAMPLES / "relu2.py").resolve()) and len(relu2["sha256"]) == 64
    assert relu2["options"] == {"hidden": None}
    # counted from the built models at the reference size: GELU's parameters exactly from the 2017 end, and
    # 4 layers x (3 x 128 x 352 - 2 x 128 x 512) fewer than SwiGLU's from the LLaMA end
    assert relu2["params_from_2017"] == 0 and relu2["params_from_llama"] == -4 * (3 * 128 * 352 - 2 * 128 * 512)
    assert rows["silu"]["params_from_llama"] == 0 and rows["nonorm"]["params_from_llama"] == -9 * 128
    table = invoke("components", "--plugin", EXAMPLES / "relu2.py", "--wide")
    assert table.exit_code == 0 and "relu2" in table.stdout and "So et al. 2021 (Primer)" in table.stdout


@pytest.mark.parametrize("name", ["relu2", "ssmax"])
def test_check_passes_a_worked_plugin_with_its_table(name):
    result = invoke("components", "check", EXAMPLES / f"{name}.py")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].startswith(f"{name} (") and "sha256" in lines[0]
    assert any(line.split() == ["causal", "pass", "pass"] for line in lines)
    assert f"{name}: passes every check at 2017 and llama" in result.stdout


def test_check_fails_a_leaky_part_with_exit_1_and_its_first_failing_case(tmp_path):
    path = tmp_path / "leaky.py"
    path.write_text(LEAKY, encoding="utf-8")
    result = invoke("components", "check", path)
    assert result.exit_code == 1, result.output
    assert any(line.split() == ["causal", "FAIL", "FAIL"] for line in result.stdout.splitlines())
    assert "FAIL: causal (2017): changing token 6 moved a logit before it by" in flat(result.stdout)
    assert "leaky: 4 checks failed" in result.stdout  # causal and decode, at each end
    doc = json.loads(invoke("components", "check", path, "--json").stdout)
    assert {r["check"] for r in doc["leaky"] if r["status"] == "FAIL"} == {"causal", "decode"}


def test_check_one_part_of_a_file_and_refuse_one_it_lacks(tmp_path):
    both = tmp_path / "both.py"
    both.write_text((EXAMPLES / "relu2.py").read_text() + LEAKY.replace("from torch import nn", ""), encoding="utf-8")
    assert invoke("components", "check", both, "--part", "relu2").exit_code == 0
    one_error_line(invoke("components", "check", both, "--part", "gelu2"),
                   f"{both} declares no part named 'gelu2'; it declares relu2, leaky")


@pytest.mark.parametrize("text, fragment", [
    ("import torch\nraise ValueError('bad weights')\n", "does not import: ValueError: bad weights"),
    (LEAKY.replace('slot="ffn"', 'slot="attn"'), "slot 'attn' does not exist"),
    (LEAKY.replace('"leaky"', '"rope"'), "part 'rope' ("),
])
def test_a_plugin_that_cannot_load_is_one_line_and_exit_2(tmp_path, text, fragment):
    path = tmp_path / "bad.py"
    path.write_text(text, encoding="utf-8")
    for args in (["components", "check", path], ["components", "--plugin", path],
                 ["train", "--plugin", path, "--steps", "1", "--out", tmp_path / "run"]):
        one_error_line(invoke(*args), fragment)
    assert not (tmp_path / "run").exists()
    one_error_line(invoke("components", "check", tmp_path / "absent.py"), "plugin not found:")


def test_a_part_s_options_of_the_wrong_type_are_one_line(tmp_path):
    result = invoke("train", "--plugin", EXAMPLES / "relu2.py", "--set", "model.ffn_type=relu2",
                    "--set", "model.part_options.relu2.hidden=1.5", "--out", tmp_path / "run")
    one_error_line(result, "--set model.part_options.relu2.hidden: expected an integer, got 1.5")
    spec = tmp_path / "run.toml"
    spec.write_text(f'plugins = ["{EXAMPLES / "relu2.py"}"]\n[model]\nffn_type = "relu2"\n'
                    f'[model.part_options.relu2]\nhidden = "wide"\n', encoding="utf-8")
    one_error_line(invoke("train", spec, "--out", tmp_path / "run"),
                   "model.part_options.relu2.hidden: Input should be a valid integer, got 'wide'")
    assert not (tmp_path / "run").exists()
    registry.REGISTRY.pop("relu2", None)  # a new command starts without it


def test_an_installed_package_whose_parts_fail_to_load_is_a_warning_and_the_rest_still_list(tmp_path, monkeypatch):
    import sys

    from anatomy_cli.cli.app import STATE
    from tests.spec.test_parts import FFN, write_package

    site = tmp_path / "site"
    site.mkdir()
    write_package(site, "fineparts", FFN.format(name="fineffn", slot="ffn"), "fine = fineparts")
    write_package(site, "brokenparts", "import no_such_module\n", "broken = brokenparts")
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setitem(STATE, "warned", [])
    registry._ENTRY_POINTS_READ.clear()  # a new process: its entry points not read yet
    registry.WARNINGS.clear()
    try:
        result = invoke("components", "--json")
        assert result.exit_code == 0, result.output
        assert "fineffn" in {r["name"] for r in json.loads(result.stdout)["components"]}
        assert ("warning: entry point broken (brokenparts) of anatomy.parts does not load: ModuleNotFoundError: No "
                "module named 'no_such_module'; its parts are left out") in flat(result.stderr)
    finally:
        for name in ("fineparts", "brokenparts"):
            sys.modules.pop(name, None)
        monkeypatch.undo()
        registry.reread_entry_points()

"""The terminal verdict explains its own words (issue 38): where --decide came from, the margin and each
call defined in one line, both directions of a component side by side, and the ends' losses that give a
gain its scale (sections.verdict_text on hand-written run folders; no torch, no training)."""

from __future__ import annotations

import json
from pathlib import Path

from anatomy_cli.report import sections
from anatomy_cli.report.build import build_report
from anatomy_cli.report.verdict import noise_floor
from anatomy_cli.spec import components as comp
from tests.report.test_rule_words import decided_study


def terminal(root: Path, width: int | None = 100) -> str:
    return sections.verdict_text(build_report(root), width)


def invoked(root: Path, spec: Path | None) -> None:
    how = {"spec": None if spec is None else str(spec), "flip": None, "steps": None}
    design = {"components": [comp.record(comp.BY_NAME[n]) for n in comp.FIVE], "invocation": how}
    (root / "sweep.json").write_text(json.dumps(design))


def test_the_verdict_says_where_decide_came_from(tmp_path):
    root = decided_study(tmp_path / "study")
    spec = tmp_path / "mine.toml"
    spec.write_text('name = "study"\n[decide]\nmax_seeds = 5\n')
    invoked(root, spec)
    assert f"--decide (turned on by {spec}'s [decide] table)" in " ".join(terminal(root, None).split())
    spec.write_text('name = "study"\n')  # no table: the flag did it
    assert "--decide (turned on by the --decide flag)" in terminal(root, None)


def test_the_verdict_defines_its_words_one_line_each(tmp_path):
    text = terminal(decided_study(tmp_path / "study"))
    lines = text.splitlines()
    for word in ("margin", "helps", "hurts", "negligible", "below margin", "undecided", "look"):
        line = next((x for x in lines if x.startswith(f"  {word}  ")), None)
        assert line is not None, (word, text)
    margin = next(x for x in lines if x.startswith("  margin "))
    assert "0.020 bits/byte: the smallest gain that matters" in margin


def test_both_directions_side_by_side_and_the_ends_losses(tmp_path):
    root = decided_study(tmp_path / "study")
    text = terminal(root)
    lines = text.splitlines()
    head = next(x for x in lines if x.startswith("component"))
    assert "added to the 2017 end" in head and "removed from the LLaMA end" in head
    rope = next(x for x in lines if x.startswith("rope "))
    assert rope.count("[") == 2 and rope.count("helps") == 2  # added | removed on one row
    floor = noise_floor(build_report(root).runs)
    ref, top = floor["reference"][2], floor["all-on"][2]
    assert f"the 2017 end reaches {ref:.3f} bits/byte, the LLaMA end {top:.3f}" in " ".join(text.split())
    narrow = terminal(root, 60)  # too narrow for both: one table per direction, every line fits
    assert "added to the 2017 end:" in narrow and "removed from the LLaMA end:" in narrow
    assert all(len(x) <= 60 for x in narrow.splitlines())

"""What a newcomer reads is true (issue 38): every `anatomy ablate ...` command demo.toml's comments
advise runs on a demo already decided (its dry run is not refused), the components' counts the
README and docs/components.md say are the component table's, no page names an issue number or an
unnamed article, and a removal reads as what the component does."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from helpers import invoke

from anatomy_cli.report import decide
from anatomy_cli.store import records
from anatomy_cli.sweep import calibrate

ROOT = Path(__file__).resolve().parents[2]


def _advised(spec: Path) -> list[list[str]]:
    """The `anatomy ablate ...` commands in a spec's comments (backquoted), as argument lists."""
    comments = " ".join(line.lstrip("#").strip() for line in spec.read_text().splitlines() if line.startswith("#"))
    return [shlex.split(cmd)[2:] for cmd in re.findall(r"`(anatomy ablate[^`]*)`", comments)]


@pytest.fixture
def decided_demo(tmp_path, monkeypatch):
    """A checkout's cwd whose runs/demo was decided at the demo's looks (3 and 4 seeds)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "experiments").mkdir()
    (tmp_path / "experiments" / "demo.toml").write_text((ROOT / "experiments" / "demo.toml").read_text())
    records.write_decide(tmp_path / "runs" / "demo", records.DecideRecord(looks=[3, 4], alpha=decide.alpha([3, 4]),
                                                                        by="spec"))
    monkeypatch.setenv("ANATOMY_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(calibrate, "busy", lambda: None)
    monkeypatch.setattr(calibrate, "_measure", lambda configs, threads: [
        {"step_s": 0.01, "eval_s": 0.1, "run_s": 1.0, "startup_s": 2.0, "when": "2024-01-01 00:00:00"}
        for _ in configs])
    return tmp_path


def test_every_command_demo_toml_advises_runs_on_a_decided_demo(decided_demo):
    advised = _advised(decided_demo / "experiments" / "demo.toml")
    assert any("--max-seeds" in args for args in advised), advised  # how to go past the cap is said
    for args in advised:
        result = invoke("ablate", *args, "--dry-run")
        assert result.exit_code == 0, (args, result.output)


WORDS = {n: w for n, w in enumerate(["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine",
                                     "ten", "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen",
                                     "seventeen", "eighteen", "nineteen", "twenty", "twenty-one", "twenty-two",
                                     "twenty-three", "twenty-four", "twenty-five"])}


def _counts() -> tuple[int, int, int, int]:
    """(today's, 2024-2026's, CS336's, all) in the component table: today's are modern.toml's flips,
    CS336's the rows its assignment's ablations name (their source says CS336), 2024-2026's the rest
    after the five parts from 2017 to LLaMA."""
    import tomllib

    from anatomy_cli.spec import components

    today = tomllib.loads((ROOT / "experiments" / "modern.toml").read_text())["flips"]
    names = [c.name for c in components.BUILTINS]
    assert names[len(components.FIVE):len(components.FIVE) + len(today)] == today  # the table's order
    cs336 = [c.name for c in components.BUILTINS if "CS336" in c.source]
    assert names[-len(cs336):] == cs336  # the table's last rows
    return len(today), len(names) - len(components.FIVE) - len(today) - len(cs336), len(cs336), len(names)


def _flat(path: Path) -> str:
    return " ".join(path.read_text().split())


def test_the_readme_and_docs_count_the_component_table():
    today, recent, cs336, total = _counts()
    readme, docs = _flat(ROOT / "README.md"), _flat(ROOT / "docs" / "components.md")
    assert f"{WORDS[today]} of today's models, {WORDS[recent]} of 2024-2026 models, {WORDS[cs336]} of CS336's" in docs
    assert f"All {WORDS[total]} are rows of one table" in docs
    assert (f"{WORDS[today].capitalize()} parts of today's models, {WORDS[recent]} of 2024-2026 models and "
            f"{WORDS[cs336]} of CS336's ablations are measured the same way: {WORDS[total]} components in all") \
        in readme


def _pages() -> dict[str, str]:
    """What a reader sees of README, docs and the shipped specs' comments: link targets left out."""
    paths = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "experiments").glob("*.toml"))]
    return {p.name: re.sub(r"\]\([^)]*\)", "]", _flat(p)) for p in paths}


def test_no_page_names_an_issue_number_or_an_unnamed_article():
    for name, text in _pages().items():
        assert not re.search(r"issue #?2\d\b|#2\d\b", text), name  # plain words say what the change was
        assert "seed article" not in text, name  # named: the corpus's own articles


def test_a_removal_reads_as_what_the_component_does():
    for name, text in _pages().items():
        assert not re.search(r"[Rr]emoving [^.;]* helps", text), name  # it means the component helps

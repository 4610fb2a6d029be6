"""One wording of the rule everywhere (issue 38): the terminal verdict, report.md, its speed section and
the README's and docs' rendered blocks all state each interval's level, the family, the looks and the
family-wise error they add up to through stats.rule_text, so the pages cannot drift (no torch, no
training: hand-written run folders)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from report_runs import make_run

from anatomy_cli.report import results_blocks, results_build, results_file, sections, stats, write
from anatomy_cli.report.build import build_report
from anatomy_cli.spec.components import FIVE

ROOT = Path(__file__).resolve().parents[2]
GAINS = {"rope": 0.4, "prenorm": 0.15, "swiglu": 0.1, "rmsnorm": 0.0, "gqa": -0.01}
NOISE = (0.01, -0.02, 0.015)


def decided_study(root: Path, timed: bool = False) -> Path:
    """The five flips both ways at 3 seeds, judged at the first of two planned looks (decide.json);
    timed: with a timing pass of two add-one configs (timing.json)."""
    for k, seed in enumerate((1, 2, 3)):
        ref, top = 3.8 + NOISE[k], 2.85 - NOISE[k]
        make_run(root, f"2017-s{seed}", (), seed, ref)
        make_run(root, f"llama-s{seed}", FIVE, seed, top)
        for i, flip in enumerate(FIVE):
            wobble = NOISE[(k + i) % 3]
            make_run(root, f"2017+{flip}-s{seed}", (flip,), seed, ref - GAINS[flip] + wobble)
            make_run(root, f"llama-{flip}-s{seed}", tuple(f for f in FIVE if f != flip), seed,
                     top + GAINS[flip] - wobble)
    (root / "decide.json").write_text(json.dumps({"looks": [3, 5], "alpha": 0.025, "rounds": [
        {"seeds": 3, "trained": 36, "seconds": 1.0, "open": [], "futile": []}], "stopped": "every effect decided"}))
    if timed:
        configs = [{"slug": "a", "role": "reference", "flip": None}, {"slug": "b", "role": "add-one", "flip": "rope"},
                   {"slug": "c", "role": "add-one", "flip": "swiglu"}]
        rounds = [{"a": 1000.0 + 9 * r, "b": 900.0 + 5 * r, "c": 1010.0 - 7 * r} for r in range(5)]
        (root / "timing.json").write_text(json.dumps({"steps": 20, "warmup": 5, "rounds": 5, "threads": 1,
                                                      "ends": ["2017", "llama"], "configs": configs,
                                                      "rounds_data": rounds}))
    return root


def flat(text: str) -> str:
    return " ".join(text.split())


def test_rule_text_adds_the_looks_and_the_family_up_to_the_family_wise_error():
    assert stats.rule_text(0.9975, 10, 2) == (
        "each interval at 99.75 % (Bonferroni: 0.05 split over 2 looks and the 10 effects), so all 10, at every "
        "look, hold together with 95 % confidence")
    assert stats.rule_text(0.995, 10) == ("each interval at 99.5 % (Bonferroni: 0.05 split over the 10 effects), so "
                                          "all 10 hold together with 95 % confidence")
    # 99.75 % over 10 effects and one look is 97.5 %, not the 95 % the report used to claim
    assert "97.5 % confidence" in stats.rule_text(0.9975, 10)
    assert "of a group" in stats.rule_text(0.995, 10, groups=3)

    # alpha spent late over the looks (decide.json's spending): this look's share of the whole
    late = stats.rule_text(0.997, 10, [0.002, 0.004, 0.006, 0.008, 0.03])
    assert late == ("each interval at 99.7 % (Bonferroni: this look's 0.03 of the 0.05 spent over 5 looks, split "
                    "over the 10 effects), so all 10, at every look, hold together with 95 % confidence")
    assert stats.rule_text(0.9975, 10, [0.025, 0.025]) == stats.rule_text(0.9975, 10, 2)  # equal: as before


@pytest.mark.slow  # writes a whole report with figures: seconds
@pytest.mark.filterwarnings("ignore:No artists with labels:UserWarning")
def test_terminal_report_speed_and_results_state_the_rule_in_one_wording(tmp_path):
    root = decided_study(tmp_path / "study", timed=True)
    r = build_report(root)
    loss = r.effects[r.effects["metric"] == "best_val_bpb"]
    speed = r.effects[r.effects["metric"] == "tokens_per_s"]
    level, m = float(loss["adj_level"].min()), int(loss["family"].max())
    assert (m, round(level, 6)) == (10, 0.9975)  # 0.05 over 2 looks and 10 effects
    want = stats.rule_text(level, m, looks=2)

    terminal = flat(sections.verdict_text(r, 80))
    md = write.write_report(r, formats=("md",))["report.md"].read_text()
    verdict_md = md[md.index("## Verdict"):md.index("## Curves")]
    speed_md = md[md.index("## Speed"):md.index("## Runs")]
    doc = results_file.load(results_build.write_results(tmp_path / "results" / "study.json", r))
    assert want in terminal and want in flat(verdict_md)
    assert results_blocks.render(doc, "family") == want
    assert results_blocks.render(doc, "rule").strip().startswith(want[0].upper() + want[1:] + ";")

    # the timing pass is judged once: its family keeps the whole 0.05, in the report as on the terminal
    assert set(speed["adj_level"]) == {1 - 0.05 / 2}
    speed_want = stats.rule_text(1 - 0.05 / 2, 2)
    assert speed_want in flat(speed_md) and "looks" not in speed_md
    record = json.loads((root / "timing.json").read_text())
    assert speed_want in flat(sections.speed_text(record, 80))
    assert "round-to-round spread of tokens/s as the smallest effect that matters" not in speed_md


def family_of(doc: dict) -> str:
    """stats.rule_text from a results file's numbers, read here apart from results.py."""
    tested = [e for e in doc["effects"] if e["metric"] == "best_val_bpb" and e["family"]]
    decided = doc.get("decide") or {}  # each look's alpha where the study spent it unequally, else their count
    looks = decided.get("spending") or (len(decided["looks"]) if decided else 1)
    return stats.rule_text(min(e["adj_level"] for e in tested), max(e["family"] for e in tested), looks,
                           len({e["group"] for e in tested}))


@pytest.mark.parametrize("page", ["docs/statistics.md", "docs/results.md"])  # the README leaves the rule to them
def test_the_pages_rule_blocks_are_rule_text_of_their_results_file(page):
    text = (ROOT / page).read_text(encoding="utf-8")
    marks = list(results_blocks.MARK.finditer(text))
    ruled = [m for m in marks if m["what"] in ("rule", "family")]
    assert ruled, f"{page} states no rule from a results file"
    for m in ruled:
        want = family_of(results_file.load(ROOT / results_blocks.RESULTS_DIR / f"{m['study']}.json"))
        body = m["body"].strip()
        assert body == want if m["what"] == "family" else body.startswith(want[0].upper() + want[1:] + ";"), m[0]


def test_no_page_types_an_interval_level_by_hand():
    """Outside the rendered blocks, no README or docs line states a simultaneous level or the family's
    confidence as a number (the raw 95 % intervals of the effect details are not the rule's)."""
    typed = re.compile(r"simultaneous\s+\d|\d+(\.\d+)?\s?%\s+(simultaneous|intervals?\b(?! of))|all hold at once")
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        prose = results_blocks.MARK.sub("", page.read_text(encoding="utf-8"))
        hits = [line for line in prose.splitlines() if typed.search(line) and "raw 95" not in line]
        assert not hits, f"{page.name}: {hits}"

"""Calls across tokenizers: each tokenizer's runs are a family of their own, paired within it, and the report
sets the calls side by side (holds, moves, open)."""

from __future__ import annotations

import json
from pathlib import Path

from report_runs import make_run

from anatomy_cli.report import across_tokenizers as across
from anatomy_cli.report import sections, stats
from anatomy_cli.report.build import build_report
from anatomy_cli.report.results_blocks import render
from anatomy_cli.report.results_build import build

# best val bpb per seed: characters around 3.0 with rope worth 0.3, the BPE around 2.0 with rope worth nothing
RUNS = {("char", ()): [3.00, 3.05, 2.95], ("char", ("rope",)): [2.70, 2.74, 2.66],
        ("bpe:512", ()): [2.000, 2.040, 1.960], ("bpe:512", ("rope",)): [2.001, 2.039, 1.962]}


def two_tokenizers(root: Path) -> Path:
    for (tok, flips), values in RUNS.items():
        for seed, best in enumerate(values, start=1):
            name = f"{tok.replace(':', '')}_{'2017+rope' if flips else '2017'}-s{seed}"
            run = make_run(root, name, flips, seed=seed, best=best)
            config = json.loads((run / "config.json").read_text())
            config["data"]["tokenizer"] = tok
            (run / "config.json").write_text(json.dumps(config))
            summary = json.loads((run / "summary.json").read_text())  # each tokenizer's windows: its bytes
            summary |= {"val_tokens": 1024, "val_bytes": 1400 if tok == "char" else 2900}
            (run / "summary.json").write_text(json.dumps(summary))
    return root


def test_each_tokenizer_is_its_own_family_and_the_report_sets_their_calls_side_by_side(tmp_path):
    r = build_report(two_tokenizers(tmp_path / "study"))
    loss = r.loss[r.loss["flip"] == "rope"].set_index("group")
    assert set(loss.index) == {"data.tokenizer=char", "data.tokenizer=bpe:512"}  # never one family of both
    assert (loss["n_pairs"] == 3).all()
    assert abs(loss.loc["data.tokenizer=char", "gain"] - 0.3) < 1e-9  # paired within characters: 0.30, not ~1.3
    assert abs(loss.loc["data.tokenizer=bpe:512", "gain"] - (-0.001 + 0.001 - 0.002) / 3) < 1e-9
    (row,) = [x for x in r.tokenizers if x["flip"] == "rope"]
    assert row["calls"] == {"bpe:512": stats.NEGLIGIBLE, "char": stats.HELPS} and row["across"] == across.MOVES
    said = " ".join(sections.verdict_text(r, None).split())
    assert "Across tokenizers (holds:" in said
    assert "rope: added moves (negligible -0.001 at bpe:512, helps +0.300 at char)" in said
    doc = build(r)
    assert r.runs["val_bytes"].nunique() == 2 and "per_byte" not in doc  # two sets of windows: no one constant
    table = render(doc, "tokenizers")
    assert ("| rope | added to 2017 | −0.001 [−0.004, +0.003] negligible | +0.300 [+0.275, +0.325] helps "
            "| moves |") in table
    assert "another call with the tokenizer: rope added (negligible at bpe:512, helps at char)" in render(doc, "across")


def test_a_study_of_one_tokenizer_has_no_calls_across(tmp_path):
    root = tmp_path / "one"
    for (tok, flips), values in RUNS.items():
        for seed, best in enumerate(values if tok == "char" else [], start=1):
            make_run(root, f"{'2017+rope' if flips else '2017'}-s{seed}", flips, seed=seed, best=best)
    r = build_report(root)
    assert not r.tokenizers and "tokenizers" not in build(r)


def test_what_the_calls_say_together():
    h, n, u, s = stats.HELPS, stats.NEGLIGIBLE, stats.UNDECIDED, stats.SMALL
    assert across.verdict([h, h]) == across.verdict([n, n]) == across.verdict([s, s]) == across.HOLDS
    assert across.verdict([h, n]) == across.verdict([h, stats.HURTS, u]) == across.MOVES
    assert across.verdict([u, u]) == across.verdict([h, u]) == across.verdict([stats.TOO_FEW] * 2) == across.OPEN
    assert across.verdict([h, s]) == across.OPEN  # below the margin is not a claim that differs from helps

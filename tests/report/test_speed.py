"""Only a timing pass calls speed (issue 37, cause 9): the training runs' tokens/s shared the CPU with
whichever runs overlapped them, so their speed effects keep gain and interval but get the call
stats.NOT_TIMED, with a note saying why, in report.json, effects.csv and the results file's parts table;
a timing pass's (timing.json) are judged and called as before. Synthetic run folders (no torch)."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from report_runs import make_run, timing_record

from anatomy_cli.report import effects as effects_mod
from anatomy_cli.report import results_blocks, stats, write
from anatomy_cli.report.build import build_report
from anatomy_cli.store import records

pytestmark = pytest.mark.filterwarnings("error")


def fast_gqa_sweep(root):
    """gqa 35 % faster on every seed, as a loaded machine can make any flip look (issue 37: a weight-decay
    flip called helps +35 %), and no better in loss."""
    for i, seed in enumerate((1, 2, 3)):
        make_run(root, f"base-s{seed}", seed=seed, best=2.0 + 0.01 * i, tokens_per_s=1000.0 + 10 * i)
        make_run(root, f"gqa-s{seed}", flips=("gqa",), seed=seed, best=2.0 + 0.01 * i, tokens_per_s=1350.0 + 5 * i)


def speed_rows(rows):
    return [r for r in rows if r["metric"] == "tokens_per_s"]


def test_training_runs_tokens_per_s_get_no_call(tmp_path):
    fast_gqa_sweep(tmp_path)
    r = build_report(tmp_path)
    effects = r.effects
    (row,) = speed_rows(effects.to_dict("records"))
    assert row["gain"] == pytest.approx(34.16, abs=0.01)  # the gain and its interval stay, for what they are
    assert row["call"] == stats.NOT_TIMED and stats.NOT_TIMED not in stats.CALLS
    assert effects_mod.OVERLAP_NOTE in row["note"] and "--time" in row["note"] and results_blocks.UNFAIR in row["note"]
    paths = write.write_report(build_report(tmp_path), formats=("json", "csv"))
    doc = json.loads(paths["report.json"].read_text())
    for rows in (doc["effects"], pd.read_csv(paths["effects.csv"], keep_default_na=False).to_dict("records")):
        (row,) = speed_rows(rows)
        assert row["call"] == stats.NOT_TIMED and "--time" in row["note"]
    loss = [r for r in doc["effects"] if r["metric"] == "best_val_bpb"]
    assert [r["call"] for r in loss] == [stats.NEGLIGIBLE]  # loss effects are judged as before


def test_a_timing_pass_still_calls_speed(tmp_path):

    fast_gqa_sweep(tmp_path)
    records.write_timing(tmp_path, timing_record())
    r = build_report(tmp_path)
    effects = r.effects
    rows = {r["direction"]: r for r in speed_rows(effects.to_dict("records"))}
    assert rows["add-one"]["call"] in stats.CALLS and rows["add-one"]["note"].startswith("timing pass")


def parts_doc(note: str | None, call: str) -> dict:
    loss = {"metric": "best_val_bpb", "unit": "abs", "flip": "gqa", "direction": "add-one", "group": "",
            "gain": 0.1, "adj_low": 0.05, "adj_high": 0.15, "call": "helps", "note": None}
    speed = loss | {"metric": "tokens_per_s", "unit": "%", "gain": 35.0, "adj_low": 9.0, "adj_high": 61.0,
                    "call": call, "note": note}
    return {"study": "toy", "effects": [loss, speed], "configs": [], "ends": {}}


@pytest.mark.parametrize("note, call, shown", [
    (effects_mod.OVERLAP_NOTE, "helps", "not timed"),  # a results file written before NOT_TIMED
    (effects_mod.OVERLAP_NOTE + "; no call", "not timed", "not timed"),  # stats.NOT_TIMED
    (None, "helps", "+35.0 % [+9.0, +61.0] helps"),  # a timing pass's row as older files keep it
    ("timing pass: 5 rounds x 10 steps, 1 thread(s), paired within rounds", "helps", "+35.0 % [+9.0, +61.0] helps"),
])
def test_the_parts_table_calls_speed_only_from_a_timing_pass(note, call, shown):
    row = results_blocks.render(parts_doc(note, call), "parts").splitlines()[3]
    assert row.split(" | ")[2] == shown

"""report/plateau.py: runs left on the unigram plateau, flagged by name in the terminal verdict, report.md/html,
report.json and the effects they enter; and the forest plot's axis, which covers the informative intervals
and marks the ones that run off it (no torch, no training: run folders written by hand)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from report_runs import make_run

from anatomy_cli.data.corpus import build_corpus, unigram_loss
from anatomy_cli.report import figures, plateau, write
from anatomy_cli.report.build import build_report
from anatomy_cli.report.sections import verdict_text
from anatomy_cli.report.verdict import verdict_frame
from anatomy_cli.spec.components import FIVE

pytestmark = pytest.mark.filterwarnings("error")

U = 4.476  # the embedded corpus's unigram loss (nats/char), as the demo's runs meet it
STEPS = list(range(0, 301, 30))  # 11 evaluations, as demo.toml's 300 steps at eval_interval 30


def curve(left_at: int | None, best: float) -> list[tuple[int, float]]:
    """A val curve: ln V at step 0, on the plateau (just above U) until `left_at`, then down to `best` at the
    last evaluation (None: never leaves, ends at `best` near U)."""
    out = []
    for s in STEPS:
        if s == 0:
            v = 6.8
        elif left_at is None or s < left_at:
            v = U + 0.02 if left_at is not None or s < STEPS[-1] else best
        else:
            v = U - 0.15 - (U - 0.15 - best) * (s - left_at + 30) / (STEPS[-1] - left_at + 30)
        out.append((s, v))
    return out


# ------------------------------------------------------------------------------- the rule


def test_a_run_that_never_leaves_the_plateau_is_flagged():
    why = plateau.plateau_reason(curve(None, 4.43), U)
    assert why.startswith("ended on the unigram plateau") and "4.430" in why and "4.476" in why


def test_a_run_above_the_unigram_loss_is_flagged_too_but_not_as_on_the_plateau():  # collapsed to ln V
    why = plateau.plateau_reason([(s, 6.8) for s in STEPS], U)
    assert why.startswith("never reached the unigram loss: best val loss 6.800, 2.324 above the unigram loss 4.476")
    assert "ended on" not in why  # 'ended on the unigram plateau' only near it (issue 48)
    assert plateau.plateau_reason([(s, U + 0.05) for s in STEPS], U).startswith("ended on")  # within tol: on it


def test_a_run_that_left_early_is_not_flagged():
    assert plateau.plateau_reason(curve(90, 2.3), U) is None
    assert plateau.plateau_reason(curve(210, 3.4), U) is None  # the 8th of 11 evaluations: before the last 3


@pytest.mark.parametrize("left_at, said", [(240, "in its last 3 of 11 evaluations"),
                                           (270, "in its last 2 of 11 evaluations"),
                                           (300, "its last evaluation")])
def test_a_run_that_left_only_in_its_last_fifth_of_evaluations_is_flagged(left_at, said):
    why = plateau.plateau_reason(curve(left_at, 3.9), U)
    assert why.startswith(f"left the unigram plateau only at step {left_at}") and said in why


def test_the_rule_needs_a_unigram_loss_and_a_few_evaluations():
    assert plateau.plateau_reason(curve(None, 4.45), None) is None  # unknown: not checked
    assert plateau.plateau_reason([(0, 6.8), (10, 2.0)], U) is None  # two evaluations say nothing of when
    assert plateau.plateau_reason([(10, 4.47)], U).startswith("ended on")  # but one on the plateau is on it
    assert plateau.plateau_reason([(0, math.nan), (10, math.inf)], U) is None


def test_the_tolerance_and_the_late_share_are_the_rules_parameters():
    assert "its last evaluation" in plateau.plateau_reason(curve(None, U - 0.15), U)  # 0.15 below at the end only
    flat = [(s, U - 0.05) for s in STEPS]
    assert plateau.plateau_reason(flat, U) is not None
    assert plateau.plateau_reason(flat, U, tol=0.01) is None
    assert plateau.plateau_reason(curve(210, 3.4), U, late=0.4) is not None


# ------------------------------------------------------------------------------- the unigram loss


def test_unigram_loss_is_the_train_frequencies_cross_entropy_on_val():
    corpus = build_corpus("aaab" * 9 + "abcc", "toy", val_frac=0.1)  # 40 chars: train 36 'aaab' x 9, val 'abcc'
    p = {"a": (27 + 1) / (36 + 3), "b": (9 + 1) / (36 + 3), "c": (0 + 1) / (36 + 3)}
    expected = -(math.log(p["a"]) + math.log(p["b"]) + 2 * math.log(p["c"])) / 4
    assert unigram_loss(corpus) == pytest.approx(expected)


def write_summary(run, **fields):
    summary = json.loads((run / "summary.json").read_text()) | fields
    (run / "summary.json").write_text(json.dumps(summary))


def test_unigram_of_reads_the_summary_else_the_corpus_it_trained_on(tmp_path):
    from anatomy_cli.data.load import load_corpus

    text = tmp_path / "corpus.txt"
    text.write_text("the cat sat on the mat. " * 40, encoding="utf-8")
    corpus = load_corpus(str(text), 0.1)
    recorded = make_run(tmp_path, "recorded")
    write_summary(recorded, unigram_loss=3.25)
    assert plateau.unigram_of(recorded) == 3.25
    old = make_run(tmp_path, "old")  # from before the field: read from its corpus, when it is the same one
    config = json.loads((old / "config.json").read_text())
    config["data"]["source"] = str(text)
    (old / "config.json").write_text(json.dumps(config))
    write_summary(old, corpus_sha256=corpus.meta["sha256"])
    assert plateau.unigram_of(old) == pytest.approx(unigram_loss(corpus))
    write_summary(old, corpus_sha256="0" * 64)  # the corpus changed since: unknown
    assert plateau.unigram_of(old) is None
    assert plateau.unigram_of(make_run(tmp_path, "unfingerprinted")) is None
    config["data"]["source"] = "hf:someone/something"
    (old / "config.json").write_text(json.dumps(config))
    write_summary(old, corpus_sha256=corpus.meta["sha256"])
    assert plateau.unigram_of(old) is None  # never downloaded by a report


# ------------------------------------------------------------------------------- a study


def plateau_run(root, name, flips, seed, left_at, best):
    points = curve(left_at, best)
    metrics = [{"step": s, "train_loss": v, "grad_norm": 1.0, "lr": 1e-3, "tokens": 1024 * s, "val_loss": v}
               for s, v in points]
    run = make_run(root, name, flips=flips, seed=seed, best=min(v for _, v in points), metrics=metrics)
    config = json.loads((run / "config.json").read_text())
    config["train"] |= {"steps": STEPS[-1], "eval_interval": 30}
    (run / "config.json").write_text(json.dumps(config))
    write_summary(run, unigram_loss=U, best_step=STEPS[-1])
    return run


def study(root, stuck: bool = True):
    """rope and gqa, added to the 2017 end and removed from the LLaMA end, 3 seeds; with `stuck`, the run of
    gqa added at seed 1 never leaves the plateau (the demo's 2017+gqa-s1337)."""
    noise = {1: 0.0, 2: 0.03, 3: -0.02}
    for seed, e in noise.items():
        plateau_run(root, f"2017-s{seed}", (), seed, 120, 2.40 + e)
        plateau_run(root, f"2017+rope-s{seed}", ("rope",), seed, 120, 2.20 + e + 0.01 * seed)
        if stuck and seed == 1:
            plateau_run(root, "2017+gqa-s1", ("gqa",), seed, None, 4.43)
        else:
            plateau_run(root, f"2017+gqa-s{seed}", ("gqa",), seed, 120, 2.42 + e - 0.01 * seed)
        plateau_run(root, f"llama-s{seed}", FIVE, seed, 60, 2.00 + e)
        without = {f: tuple(c for c in FIVE if c != f) for f in ("rope", "gqa")}
        plateau_run(root, f"llama-rope-s{seed}", without["rope"], seed, 60, 2.15 + e + 0.01 * seed)
        plateau_run(root, f"llama-gqa-s{seed}", without["gqa"], seed, 60, 1.99 + e - 0.01 * seed)
    return root


def loss_verdict(effects):
    return verdict_frame(effects[effects["metric"] == "best_val_bpb"])


def test_a_run_left_on_the_plateau_is_named_in_terminal_report_and_json(tmp_path):
    root = study(tmp_path / "study")
    r = build_report(root)
    runs, effects = r.runs, r.effects
    stuck = runs.set_index("run_id").loc["2017+gqa-s1"]
    assert stuck["plateau"].startswith("ended on the unigram plateau") and stuck["unigram_loss"] == U
    assert stuck["plateau_effects"] == "gqa added to the 2017 end"
    assert runs.loc[runs["run_id"] != "2017+gqa-s1", "plateau"].isna().all()

    loss = effects[effects["metric"] == "best_val_bpb"].set_index(["flip", "direction"])
    assert loss.loc[("gqa", "add-one"), "note"].startswith(f"{plateau.NOTE_HEAD}: 2017+gqa-s1.")
    assert (loss.drop(("gqa", "add-one"))["note"] == "").all()  # the effects it does not enter: no note

    line = ("1 of 3 runs of config 2017+gqa left the unigram plateau late: the effects through 2017+gqa measure "
            "escape time as well")
    text = verdict_text(r, 100)
    flat = " ".join(text.split())
    assert f"unigram plateau: {line}" in flat and flat.count("unigram plateau:") == 1  # one line, not one per run
    assert "2017+gqa-s1 ended" not in flat  # the per-run detail is the effect details'

    paths = write.write_report(r)
    md = paths["report.md"].read_text()
    verdict_part = md.split("## Verdict")[1].split("## ")[0]
    assert "**Unigram plateau**: 1 of 3 runs of config **2017+gqa** left the unigram plateau late" in verdict_part
    assert "2017+gqa-s1" not in verdict_part
    details = md.split("## Effect details")[1].split("## ")[0]
    assert "pairs a run still on the unigram plateau: 2017+gqa-s1" in details  # the effect's note
    assert "- **2017+gqa-s1** ended on the unigram plateau" in details
    assert "it enters gqa added to the 2017 end" in details
    html = paths["report.html"].read_text()
    assert "<strong>Unigram plateau</strong>: 1 of 3 runs of config <strong>2017+gqa</strong>" in html

    doc = json.loads(paths["report.json"].read_text())
    assert [r["run_id"] for r in doc["plateau"]["runs"]] == ["2017+gqa-s1"]
    assert doc["plateau"]["runs"][0]["effects"] == "gqa added to the 2017 end"
    assert doc["plateau"]["configs"] == [{"config": "2017+gqa", "late": 1, "runs": 3}]
    assert doc["plateau"]["unknown"] == [] and doc["plateau"]["tolerance"] == plateau.PLATEAU_TOL
    by_id = {r["run_id"]: r for r in doc["runs"]}
    assert by_id["2017+gqa-s1"]["plateau"].startswith("ended on") and by_id["2017-s1"]["plateau"] is None


def test_every_call_resting_on_a_plateau_run_is_marked_in_all_four_outputs(tmp_path):
    r = build_report(study(tmp_path / "study"))
    mark = plateau.MARK
    marks = {(v.flip, v.direction): v.plateau for v in r.verdict.itertuples()}
    assert marks == {("gqa", "add-one"): "2017+gqa-s1", ("rope", "add-one"): "", ("gqa", "remove-one"): "",
                     ("rope", "remove-one"): ""}
    rows = {line.split()[0]: line for line in verdict_text(r, None).splitlines() if line.startswith(("gqa", "rope"))}
    assert rows["gqa"].count(mark) == 1 and mark not in rows["rope"]  # the row: gqa | added | removed | seeds
    gqa_add = r.verdict.set_index(["flip", "direction"]).loc[("gqa", "add-one")]
    assert f"{gqa_add['call']} {mark}" in rows["gqa"].split("]")[1]  # after the added cell's interval

    paths = write.write_report(r)
    md_verdict = paths["report.md"].read_text().split("## Verdict")[1].split("## ")[0]
    md_rows = {line.split("|")[1].strip(): line for line in md_verdict.splitlines() if line.startswith("| ")}
    assert md_rows["gqa"].count(mark) == 1 and mark not in md_rows["rope"]
    html_verdict = paths["report.html"].read_text().split('id="verdict"')[1].split("<h2")[0]
    html_rows = {row.split("</td>")[0].rsplit(">", 1)[-1]: row.split("</tr>")[0]
                 for row in html_verdict.split("<tr>")[2:]}
    assert html_rows["gqa"].count(mark) == 1 and mark not in html_rows["rope"]
    doc = json.loads(paths["report.json"].read_text())
    assert {(v["flip"], v["direction"]): v["plateau"] for v in doc["verdict"]} == marks
    assert doc["plateau"]["mark"] == mark


def test_a_plateau_line_per_config_counts_its_late_runs(tmp_path):
    root = study(tmp_path / "study")
    import shutil

    shutil.rmtree(root / "2017+gqa-s2")
    plateau_run(root, "2017+gqa-s2", ("gqa",), 2, 270, 3.9)  # a second late run of the same config
    lines = plateau.plateau_lines(build_report(root).runs, bold=False)
    assert lines == [f"unigram plateau: 2 of 3 runs of config 2017+gqa left the unigram plateau late: the effects "
                     f"through 2017+gqa measure escape time as well (their calls are marked {plateau.MARK})."]
    assert plateau.config_name("2017+gqa-s1337-5e4f20ff") == "2017+gqa" and plateau.config_name("base") == "base"


def test_the_forest_axis_leaves_out_the_plateau_intervals_far_ends_and_marks_them(tmp_path):
    verdict = loss_verdict(build_report(study(tmp_path / "study")).effects)
    wide = verdict.set_index(["flip", "direction"]).loc[("gqa", "add-one")]
    assert wide["adj_high"] - wide["adj_low"] > 3  # the plateau run's 8-nat interval of the demo, in small
    fig = figures.forest_figure(verdict)
    ax = fig.axes[0]
    lo, hi = ax.get_xlim()
    assert lo > wide["adj_low"] and hi < wide["adj_high"]  # both far ends off the axis
    others = verdict[(verdict["flip"] != "gqa") | (verdict["direction"] != "add-one")]
    assert lo <= others["adj_low"].min() and hi >= others["adj_high"].max()  # every informative interval on it
    margin = float(verdict["margin"].iloc[0])
    assert lo < -margin < margin < hi  # the band on the axis
    marks = {t.get_gid(): t.get_text() for t in ax.texts if (t.get_gid() or "").startswith("off-axis:")}
    assert marks == {"off-axis:gqa:add-one": f"interval [{wide['adj_low']:+.3f}, {wide['adj_high']:+.3f}] runs off "
                                              f"the axis"}
    arrows = [c.get_gid() for c in ax.get_children() if (c.get_gid() or "").startswith("off-axis-arrow:")]
    assert arrows == ["off-axis-arrow:gqa:add-one"] * 2  # one at each edge it crosses


def test_a_study_with_no_run_on_the_plateau_says_nothing_of_it(tmp_path):
    root = study(tmp_path / "study", stuck=False)
    r = build_report(root)
    runs, effects = r.runs, r.effects
    assert runs["plateau"].isna().all()
    assert (effects.loc[effects["metric"] == "best_val_bpb", "note"] == "").all()
    assert "plateau" not in verdict_text(r, 100)
    assert plateau.plateau_lines(runs) == [] and plateau.detail_lines(runs) == []
    assert (r.verdict["plateau"] == "").all() and plateau.MARK not in verdict_text(r, 100)
    ax = figures.forest_figure(loss_verdict(effects)).axes[0]
    assert not [t for t in ax.texts if (t.get_gid() or "").startswith("off-axis")]


def test_runs_without_a_unigram_loss_are_listed_as_unknown(tmp_path):
    make_run(tmp_path, "base")
    r = build_report(tmp_path)
    runs = r.runs
    assert runs["unigram_loss"].isna().all() and runs["plateau"].isna().all()
    assert plateau.plateau_record(runs)["unknown"] == ["base"]


# ------------------------------------------------------------------------------- the axis rule


def forest_rows(intervals, n_pairs=3, margin=0.02):
    return pd.DataFrame([{"flip": f"c{i}", "direction": "add-one", "against": "2017 end", "group": "",
                          "n_pairs": n_pairs, "gain": (a + b) / 2, "adj_low": a, "adj_high": b, "margin": margin,
                          "call": "undecided"} for i, (a, b) in enumerate(intervals)])


def test_forest_limits_cover_the_informative_intervals_zero_and_the_margin():
    rows = forest_rows([(0.10, 0.30), (0.05, 0.25), (0.20, 0.50), (-4.0, 3.7)])
    lo, hi = figures.forest_limits(rows, 0.02)
    assert -4.0 < lo < -0.02 and 0.5 < hi < 3.7
    assert hi - lo < 1.0  # the 7.7-wide interval does not set the scale
    lo, hi = figures.forest_limits(forest_rows([(0.10, 0.30), (0.05, 0.25), (0.20, 0.50)]), 0.02)
    assert lo < -0.02 and lo > -0.1 and hi == pytest.approx(0.50 + 0.08 * 0.52)  # all informative: all on it
    lo, hi = figures.forest_limits(forest_rows([(0.01, 0.011), (0.012, 0.013), (0.0, 0.1)]), 0.02)
    assert hi > 0.1  # narrow intervals: one a few margins wide still counts


def test_forest_limits_with_no_finite_interval_still_hold_zero_and_the_margin():
    rows = forest_rows([(math.nan, math.nan)], n_pairs=1)
    rows["gain"] = 0.3
    lo, hi = figures.forest_limits(rows, 0.02)
    assert lo < -0.02 and hi > 0.3 and np.isfinite([lo, hi]).all()


# ------------------------------------------------------------------------------- the results file


def test_the_results_file_records_the_step_each_run_left_the_plateau_at(tmp_path):
    from anatomy_cli.report import results_build, results_file

    r = build_report(study(tmp_path / "study"))
    path = results_build.write_results(tmp_path / "toy.json", r)
    doc = results_file.load(path)  # checked against the schema
    assert doc["plateau"]["tolerance"] == plateau.PLATEAU_TOL
    by_id = {x["run_id"]: x for x in doc["plateau"]["runs"]}
    assert len(by_id) == 18 and by_id["2017+gqa-s1"]["left_at"] is None  # never left
    assert by_id["2017-s1"] == {"config": "2017", "run_id": "2017-s1", "seed": 1, "steps": 300, "left_at": 120}
    assert by_id["llama-s2"]["left_at"] == 60 and by_id["2017+rope-s3"]["left_at"] == 120
    assert plateau.left_at(curve(240, 3.9), U) == 240 and plateau.left_at(curve(None, 4.43), U) is None
    assert plateau.left_at(curve(90, 2.3), None) is None  # the unigram loss unknown


SHIPPED = Path(__file__).resolve().parents[2] / "experiments" / "results" / "demo.json"


@pytest.mark.skipif("plateau" not in json.loads(SHIPPED.read_text()),
                    reason="experiments/results/demo.json predates its plateau record: regenerate it (make demo, then "
                           "anatomy report runs/demo --results experiments/results/demo.json)")
def test_every_shipped_demo_run_left_the_plateau_before_the_last_third():
    runs = json.loads(SHIPPED.read_text())["plateau"]["runs"]
    late = [(x["run_id"], x["left_at"]) for x in runs if x["left_at"] is None or x["left_at"] >= 2 * x["steps"] / 3]
    assert runs and not late, late

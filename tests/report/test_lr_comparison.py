"""report/lr_comparison.py on a tuned folder written by a fake trainer (no training): the verdict
reads the study's runs at their frozen LRs only, the shared-LR runs are judged as a family of their own
beside it, and an effect the shared LR makes is flagged LR-confounded, in report.md, report.json and the
figure."""

from __future__ import annotations

import json
import math

import pytest
from helpers import asked
from toy_data import write_spec

from anatomy_cli.report import lr_allowance, lr_comparison, stats, write
from anatomy_cli.report.build import build_report
from anatomy_cli.store import records, runs
from anatomy_cli.study import ablation
from anatomy_cli.study.ablation import Ask, plan_study

OPTIMUM = {"2017": 6e-3, "2017+rope": 3e-3}  # rope moves the best LR down a factor; equal best losses


def fake_train(root, optimum=None):
    """Each run: best val loss 2.5 + 0.1 (log2 lr/optimum)^2 + a little noise of its own (no true gain)."""
    optimum = optimum or OPTIMUM

    def train(todo):
        for p in todo:
            run_dir = root / p.run_id
            if runs.run_status(run_dir) in runs.DONE_STATES:
                continue
            loss = 2.5 + 0.1 * math.log2(p.config.train.lr / optimum[p.slug]) ** 2
            loss += 0.003 * math.sin(1.7 * p.config.seed + len(p.slug))
            run_dir.mkdir(parents=True, exist_ok=True)
            (run_dir / runs.CONFIG).write_text(json.dumps(p.config.model_dump(mode="json")))
            (run_dir / runs.SUMMARY).write_text(json.dumps({"status": "completed", "best_val_loss": loss,
                                                            "best_val_bpb": loss,
                                                            "best_step": 12, "final_val_loss": loss}))
        return [runs.COMPLETED] * len(todo)
    return train


def tuned_folder(tmp_path, optimum=None):
    spec = write_spec(tmp_path, top={"seeds": 5, "flips": ["rope"], "directions": ["add-one"]})
    study = ablation.size_study(plan_study(asked(spec, "--tune-points", "3", "--tune-extend", "1",
                                                 runs_dir=tmp_path / "runs", tune_lr=True, stack="off")))
    ablation.run_study(study, fake_train(study.sweep_dir, optimum))
    return study.sweep_dir


def test_the_shared_lr_makes_a_call_the_tuned_lrs_do_not_and_it_is_flagged(tmp_path):
    root = tuned_folder(tmp_path)
    r = build_report(root)
    runs_df = r.runs
    assert set(runs_df["seed"]) == {1337, 1338, 1339, 1340, 1341} and len(runs_df) == 10  # no selection run
    # each config at its own LR: the LR is no setting the configs are grouped by (no string stands in for it)
    assert not runs_df["settings"].map(lambda s: "train.lr" in json.loads(s)).any() and runs_df["tuned"].all()
    assert set(runs_df["lr"]) == {6e-3, 3e-3}
    tuned = r.tuning
    row = tuned.comparison.iloc[0]
    assert (row.flip, row.call, row.n_pairs, row.shared_n_pairs) == ("rope", stats.NEGLIGIBLE, 5, 5)
    assert row.shared_call == stats.HELPS and math.isclose(row.shared_gain, 0.1, abs_tol=0.01)
    assert row.confounded and (row.end_lr, row.variant_lr) == (6e-3, 3e-3)
    assert lr_comparison.lines(tuned)[1].startswith("LR-confounded: rope added: negligible at its own LRs, helps at "
                                              "the shared LR")
    paths = write.write_report(build_report(root))
    md = paths["report.md"].read_text()
    assert "## Fair learning rates" in md and "**LR-confounded**: rope added is negligible" in md
    assert paths["lr-sensitivity.png"].is_file()
    doc = json.loads(paths["report.json"].read_text())
    assert doc["tuning"]["comparison"][0]["confounded"] is True and doc["tuning"]["seeds"] == [1336]
    assert [a["lr"] for a in doc["tuning"]["arms"]] == [6e-3, 3e-3]


def test_a_folder_not_tuned_reads_as_before(tmp_path):
    spec = write_spec(tmp_path, top={"seeds": 3, "flips": ["rope"], "directions": ["add-one"]})
    study = ablation.size_study(plan_study(Ask(spec=spec, runs_dir=tmp_path / "runs", stack="off")))
    ablation.run_study(study, fake_train(study.sweep_dir))
    r = build_report(study.sweep_dir)
    runs_df = r.runs
    assert len(runs_df) == 6 and r.tuning is None and "tuned" not in runs_df
    assert lr_allowance.rerun_flags(r.rules.tune) == []


def test_the_advice_command_goes_on_with_the_grid(tmp_path):
    root = tuned_folder(tmp_path)
    assert lr_allowance.rerun_flags(records.read_tune(root)) == ["--tune-lr", "--tune-points", "3", "--tune-extend",
                                                                 "1"]


def test_a_tuned_report_floors_each_allowance_at_the_groups_median_sd(tmp_path):
    spec = write_spec(tmp_path, top={"seeds": 5, "flips": ["rope", "swiglu", "gqa"], "directions": ["add-one"]})
    study = ablation.size_study(plan_study(asked(spec, "--tune-points", "3", "--tune-extend", "1",
                                                 runs_dir=tmp_path / "runs", tune_lr=True, stack="off")))
    half = {"2017": 6e-3 * 2 ** 0.5, "2017+rope": 3e-3 * 2 ** 0.5, "2017+swiglu": 6e-3 * 2 ** 0.5,
            "2017+gqa": 3e-3 * 2 ** 0.5}  # each best between two grid points: the runner-up part counts
    ablation.run_study(study, fake_train(study.sweep_dir, half))
    record = records.read_tune(study.sweep_dir)
    r = build_report(study.sweep_dir)
    effects = r.effects
    rows = effects[effects["metric"] == "best_val_bpb"]
    floor = lr_allowance.family_sd(rows["sd"])
    low, high = rows.loc[rows["sd"].idxmin()], rows.loc[rows["sd"].idxmax()]
    assert low["sd"] < floor <= high["sd"]  # the family's smallest own sd, and one its floor leaves alone

    def crit(row, sd, floor):  # the critical t the interval was built with, given the allowance
        allowed = lr_allowance.allowance(record, "2017", f"2017+{row['flip']}", True, sd, floor)
        return (row["gain"] - row["adj_low"] - allowed["allow_low"]) / row["se"]

    t = crit(high, high["sd"], math.nan)  # every effect of the family is judged at one level, with one df
    assert crit(low, low["sd"], floor) == pytest.approx(t)
    assert crit(low, low["sd"], math.nan) > t + 0.1  # its own sd alone would have allowed less


def test_judge_widens_the_interval_and_the_mde_by_the_allowance():
    plain = stats.paired([0.30, 0.31, 0.29, 0.30])
    bare, = stats.judge([plain], 0.02)
    wide, = stats.judge([plain | {"allow_low": 0.3, "allow_high": 0.05}], 0.02)
    assert wide["adj_low"] == pytest.approx(bare["adj_low"] - 0.3)
    assert wide["adj_high"] == pytest.approx(bare["adj_high"] + 0.05)
    assert bare["call"] == stats.HELPS and wide["call"] != stats.HELPS and wide["p_value"] == bare["p_value"]
    assert 0.3 < wide["mde"] < 0.3 + bare["mde"]  # the gain must pass crit x se + the allowance
    nan, = stats.judge([plain | {"allow_low": math.nan, "allow_high": math.nan}], 0.02)
    assert nan["adj_low"] == bare["adj_low"]


# ------------------------------------------------------------- [tune] shared = false: no shared-LR runs


def study_alone_folder(tmp_path, optimum=None):
    """tuned_folder's study planned with --no-tune-shared: the selection and the study's runs, none beside."""
    spec = write_spec(tmp_path, top={"seeds": 5, "flips": ["rope"], "directions": ["add-one"]})
    study = ablation.size_study(plan_study(asked(spec, "--tune-points", "3", "--tune-extend", "1", "--no-tune-shared",
                                                 runs_dir=tmp_path / "runs", tune_lr=True, stack="off")))
    ablation.run_study(study, fake_train(study.sweep_dir, optimum))
    return study.sweep_dir


def test_a_study_without_shared_lr_runs_lists_its_tuned_effects_unflagged(tmp_path):
    root = study_alone_folder(tmp_path)
    r = build_report(root)
    runs_df = r.runs
    assert len(runs_df) == 10  # the study's runs only, as with the shared-LR runs beside
    tuned = r.tuning
    row = tuned.comparison.iloc[0]
    assert (row.flip, row.call, row.n_pairs, row.shared_n_pairs, row.shared_call) == ("rope", stats.NEGLIGIBLE, 5, 0,
                                                                                     stats.NONE)
    assert math.isnan(row.shared_gain) and math.isnan(row.shared_low) and not row.confounded
    assert (row.end_arm, row.variant_arm, row.end_lr, row.variant_lr) == ("2017", "2017+rope", 6e-3, 3e-3)
    assert tuned.panels == [{"flip": "rope", "direction": "add-one", "end": "2017", "variant": "2017+rope",
                             "title": "+rope vs 2017"}]
    assert lr_comparison.lines(tuned)[1] == ("the shared-LR comparison was not trained ([tune] shared = false): no "
                                             "call is checked for LR confounding")
    assert lr_allowance.rerun_flags(r.rules.tune) == ["--tune-lr", "--tune-points", "3", "--tune-extend", "1",
                                                    "--no-tune-shared"]
    paths = write.write_report(r)
    md = paths["report.md"].read_text()
    assert "## Fair learning rates" in md and "LR-confounded**:" not in md and "shared call" not in md
    assert "The shared-LR comparison was not trained ([tune] shared = false)" in md and "Beside it" not in md
    assert "widened by its two configs' regret bounds" in md
    assert paths["lr-sensitivity.png"].is_file()
    doc = json.loads(paths["report.json"].read_text())
    assert doc["tuning"]["shared"] is False and doc["tuning"]["comparison"][0]["confounded"] is False
    assert doc["tuning"]["comparison"][0]["shared_call"] == stats.NONE


def test_without_shared_lr_runs_a_config_not_tuned_has_an_effect_with_no_call(tmp_path):
    root = study_alone_folder(tmp_path, {"2017": 6e-3, "2017+rope": 1e-1})  # rope's best far past the top edge
    r = build_report(root)
    runs_df = r.runs
    assert set(runs_df["config"]) == {"2017"}  # 2017+rope trained only its selection
    tuned = r.tuning
    row, = tuned.comparison.itertuples()
    assert (row.flip, row.against, row.call, row.shared_call, row.confounded) == (
        "rope", "2017 end", lr_comparison.NOT_TUNED, stats.NONE, False)
    assert (row.end_lr, row.variant_lr) == (6e-3, None) and [p["variant"] for p in tuned.panels] == ["2017+rope"]
    paths = write.write_report(build_report(root))
    assert "its effects get no tuned call, and no shared-LR one" in paths["report.md"].read_text()
    assert paths["lr-sensitivity.png"].is_file()

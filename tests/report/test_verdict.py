"""report/verdict.py: the ranked verdict, its words, and one rule in the words, markers, json and csv alike."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
from report_runs import (
    CALLED,
    ONE_SEED,
    called_sweep,
    five_sweep_json,
    make_run,
)

from anatomy_cli.report import effects as effects_mod
from anatomy_cli.report import figures, frames, stats, verdict, write
from anatomy_cli.report.build import build_report

pytestmark = pytest.mark.filterwarnings("error")  # the report must be warnings-free



def test_verdict_one_seed(tmp_path):
    root = tmp_path / "runs" / "five-flips"
    five_sweep_json(root, spec="experiments/five-flips.toml", flip=None, steps=20)
    for name, (flips, best) in ONE_SEED.items():
        make_run(root, name, flips=flips, best=best, seed=1337)
    runs = frames.load_runs(root)[0]
    v = verdict.verdict_frame(effects_mod.component_effects(runs))
    # gain = loss without - loss with: added to 2017 and removed from LLaMA alike; largest first
    assert list(zip(v["flip"], v["direction"])) == [("rope", "add-one"), ("rope", "remove-one"),
                                                    ("swiglu", "add-one"), ("gqa", "add-one")]
    assert v["gain"].tolist() == pytest.approx([0.4, 0.3, 0.1, -0.05])
    assert v["rank"].tolist() == [1, 2, 3, 4] and (v["call"] == "too few seeds").all()
    assert v["adj_low"].isna().all()

    md = write.write_report(build_report(root))["report.md"].read_text()
    assert (md.index("## Verdict") < md.index("## Curves") < md.index("## Speed") < md.index("## Runs")
            < md.index("## Samples"))
    top = md[md.index("## Verdict"):md.index("## Curves")]
    assert top.index("| rope ") < top.index("| swiglu ") < top.index("| gqa ")
    assert "+0.400" in top and "too few seeds" in top and "One seed: each effect is a point estimate" in top
    cmd = f"anatomy ablate experiments/five-flips.toml --steps 20 --seeds 3 --runs-dir {tmp_path / 'runs'}"
    assert f"```bash\n{cmd}\n```" in top and "(est. " in top
    assert "20 training steps (5,120 tokens: batch 4 x ctx 64)" in top
    assert "the 2017 end reaches 2.900 and the LLaMA end 2.300 (+0.600 apart)" in top
    assert "Noise floor**: unknown with one seed" in top


def test_verdict_three_seeds(tmp_path):
    bases, rope, swiglu = (2.0, 2.1, 2.2), (-0.2, -0.25, -0.3), (0.1, -0.1, 0.1)
    for i, seed in enumerate((1, 2, 3)):
        make_run(tmp_path, f"base-s{seed}", seed=seed, best=bases[i])
        make_run(tmp_path, f"rope-s{seed}", flips=("rope",), seed=seed, best=bases[i] + rope[i])
        make_run(tmp_path, f"swiglu-s{seed}", flips=("swiglu",), seed=seed, best=bases[i] + swiglu[i])
    runs = frames.load_runs(tmp_path)[0]
    effects = effects_mod.component_effects(runs)
    v = verdict.verdict_frame(effects)
    assert v["flip"].tolist() == ["rope", "swiglu"]
    q = 1 - 0.05 / 2  # simultaneous over the 2 effects; df 2: P(|T| < t) = t / sqrt(2 + t^2) = q
    # rope's gain is past the margin: its sd (0.05) is judged at the family's median, the mean of 0.05 and
    # swiglu's 0.1155 (stats.sd_floor, skewed noise: issue 48), so +0.25 is not yet called at 3 seeds
    floor = (0.05 + float(np.std([0.1, -0.1, 0.1], ddof=1))) / 2
    half = q * math.sqrt(2 / (1 - q * q)) * floor / math.sqrt(3)
    assert v.loc[0, "gain"] == pytest.approx(0.25)
    assert (v.loc[0, "adj_low"], v.loc[0, "adj_high"]) == pytest.approx((0.25 - half, 0.25 + half))  # two: no squeeze
    assert v.loc[0, "call"] == "undecided" and v.loc[1, "call"] == "undecided"
    assert v.loc[1, "gain"] == pytest.approx(-0.1 / 3)
    assert verdict.noise_floor(runs)["reference"] == pytest.approx((0.1, 3, 2.1))  # sd of 2.0, 2.1, 2.2

    md = write.write_report(build_report(tmp_path))["report.md"].read_text()
    top = md[md.index("## Verdict"):md.index("## Curves")]
    assert f"[{0.25 - half:+.3f}, {0.25 + half:+.3f}]" in top and "one seed" not in top
    assert "2017 end sd 0.1000 over 3 seeds" in top
    assert "**The rule**: each interval at 97.5 % (Bonferroni: 0.05 split over the 2 effects), so all 2 hold" in top
    assert "larger than the margin, 0.020 bits/byte (the default, fixed before the data)" in top
    assert "80 % of the time" in top  # the family's minimum detectable effect, said up front
    assert md.index("## Effects over training") < md.index("## Speed") < md.index("## Runs")


def test_words_markers_json_and_csv_follow_one_rule(tmp_path):
    called_sweep(tmp_path)
    r = build_report(tmp_path)
    effects = r.effects
    v = verdict.verdict_frame(effects[effects["metric"] == "best_val_bpb"])
    want = {flip: call for flip, (_, call) in CALLED.items()}
    assert dict(zip(v["flip"], v["call"])) == want
    assert v["margin"].tolist() == pytest.approx([0.02] * 5) and (v["family"] == 5).all()
    assert v["noise"].tolist() == pytest.approx([0.01] * 5)  # the 2017 end's sd, beside the margin

    fig = figures.forest_figure(v)  # the markers, read back from the figure's artists
    marks = [line for line in fig.axes[0].get_lines() if (line.get_gid() or "").startswith("call:")]
    assert [m.get_gid().removeprefix("call:") for m in marks] == v["call"].tolist()
    for m, call in zip(marks, v["call"]):
        shape, filled = figures.CALL_MARKERS[call]
        assert m.get_marker() == shape and (m.get_markerfacecolor() != "white") == filled
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert set(want.values()) <= set(legend) and any("smaller effects do not matter" in t for t in legend)
    band = [p for p in fig.axes[0].patches]  # the +-margin band
    assert len(band) == 1 and band[0].get_x() == pytest.approx(-0.02) and band[0].get_width() == pytest.approx(0.04)

    paths = write.write_report(r)
    md = paths["report.md"].read_text()
    table = md[md.index("## Verdict"):md.index("## Curves")]
    signs = {"helps": "**▲ helps**", "hurts": "**▼ hurts**", "negligible": "**= negligible**"}
    for flip, call in want.items():  # each verdict row says the same call beside its adjusted interval
        row = next(line for line in table.splitlines() if line.startswith("|") and f" {flip} " in line)
        cells = [c.strip() for c in row.strip().strip("|").split("|")]
        e = v[v["flip"] == flip].iloc[0]  # the component | added to the 2017 end | seeds
        assert cells[1] == f"{e.gain:+.3f} [{e.adj_low:+.3f}, {e.adj_high:+.3f}] {signs.get(call, call)}"
    doc = json.loads(paths["report.json"].read_text())
    for rows in (doc["effects"], pd.read_csv(paths["effects.csv"]).to_dict("records")):
        loss = {r["flip"]: r for r in rows if r["metric"] == "best_val_bpb"}
        assert {f: r["call"] for f, r in loss.items()} == want
        for f, r in loss.items():
            assert r["threshold"] == pytest.approx(0.02) and r["threshold_basis"] == "default"  # files keep the name
            assert {"adj_low", "adj_high", "raw_low", "raw_high", "gain"} <= set(r)


def test_min_effect_moves_the_practical_part(tmp_path):
    from typer.testing import CliRunner

    from anatomy_cli.cli.main import app

    called_sweep(tmp_path / "s")
    result = CliRunner().invoke(app, ["report", str(tmp_path / "s"), "--min-effect", "0.5", "--json"])
    assert result.exit_code == 0, result.output
    loss = {e["flip"]: e for e in json.loads(result.stdout)["effects"] if e["metric"] == "best_val_bpb"}
    # rope's +0.305 [+0.26, +0.35] is now confidently smaller than 0.5; gqa's -0.205 too
    assert loss["rope"]["call"] == "negligible" and loss["gqa"]["call"] == "negligible"
    # a margin given after the runs is a view of them, and the files say so (no sweep.json: the default's study)
    assert loss["rope"]["threshold"] == 0.5
    assert loss["rope"]["threshold_basis"] == f"{stats.AFTER} (the study's: 0.020, the default)"
    bad = CliRunner().invoke(app, ["report", str(tmp_path / "s"), "--min-effect", "-1"])
    assert bad.exit_code == 2

"""A study's alpha and margin belong to the study: a report of its parent folder judges it by the study's
own decide.json and sweep.json; folders of studies judged by different rules are refused, naming them;
a margin given after the runs says so."""

from __future__ import annotations

import json

import pytest
from helpers import invoke, one_error_line
from report_runs import make_run

from anatomy_cli.report import decide, stats
from anatomy_cli.report.build import build_report
from anatomy_cli.spec import components
from anatomy_cli.store import records
from anatomy_cli.store import runs as runs_mod

GAINS = (0.119, 0.130, 0.141)  # rope added, per seed: +0.13 on average, tight


def study(root, looks=(3, 5, 7, 9, 10), margin=0.04):
    """The issue's synthetic study: rope added gains +0.119/+0.130/+0.141 over 3 seeds, looks 3..10, margin
    0.04 recorded when it started."""
    for seed, gain in zip((1, 2, 3), GAINS):
        make_run(root, f"ref-s{seed}", (), seed=seed, best=3.0 + 0.01 * seed)
        make_run(root, f"rope-s{seed}", ("rope",), seed=seed, best=3.0 + 0.01 * seed - gain)
    five = [components.record(components.BY_NAME[n]) for n in components.FIVE]
    (root / runs_mod.SWEEP).write_text(json.dumps({"components": five, "margin": margin}))
    if looks:
        records.write_decide(root, records.DecideRecord(looks=list(looks), alpha=decide.alpha(list(looks))))
    return root


def rope(effects):
    loss = effects[(effects["metric"] == "best_val_bpb") & (effects["flip"] == "rope")]
    return loss.iloc[0]


def test_a_report_of_the_parent_judges_the_study_by_its_own_alpha_and_margin(tmp_path):
    root = study(tmp_path / "runs" / "demo")
    own = rope(build_report(root).effects)
    parent = rope(build_report(tmp_path / "runs").effects)
    assert own["margin"] == parent["margin"] == 0.04
    assert own["adj_level"] == parent["adj_level"] == pytest.approx(1 - 0.01)  # 0.05 / 5 looks, one effect
    assert own["call"] == parent["call"]
    assert (own["adj_low"], own["adj_high"]) == (parent["adj_low"], parent["adj_high"])


def test_studies_judged_by_different_rules_are_not_judged_as_one(tmp_path):
    study(tmp_path / "runs" / "a")
    study(tmp_path / "runs" / "b", looks=None, margin=0.02)
    with pytest.raises(runs_mod.RunError, match="holds studies judged by different rules: .*a \\(alpha 0.01"):
        build_report(tmp_path / "runs")
    one_error_line(invoke("report", tmp_path / "runs"), "report each study's folder")


def test_a_margin_given_after_the_runs_says_so(tmp_path):
    root = study(tmp_path / "demo", looks=None)
    effects = build_report(root, margin=0.2).effects
    assert rope(effects)["margin"] == 0.2
    assert rope(effects)["margin_basis"] == f"{stats.AFTER} (the study's: 0.040)"
    assert rope(build_report(root, margin=0.04).effects)["margin_basis"] == stats.GIVEN  # the same
    result = invoke("report", root, "--min-effect", "0.2", "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    bases = {e["threshold_basis"] for e in doc["effects"] if e["metric"] == "best_val_bpb"}
    assert bases == {f"{stats.AFTER} (the study's: 0.040)"}


def test_trends_are_judged_at_the_studys_alpha():
    """A --decide study's trends use its looks' alpha, as its size effects do (they used 0.05). Each seed's slope
    differs (0.1 + 0.01 seed): with one slope for every seed the interval has no width, and whether the two
    levels' bounds differ then rests on one CPU's rounding of the fit (equal on an AMD EPYC)."""
    import pandas as pd

    from anatomy_cli.report import scale

    gains = pd.DataFrame([{"series": "", "flip": "rope", "direction": "add-one", "against": "2017 end", "seed": s,
                           "size": size, "gain": 0.1 * i + 0.01 * s * (1 + i), "non_embedding_params": n}
                          for s in (1, 2, 3) for i, (size, n) in enumerate((("S", 1e5), ("M", 1e6)))])
    placed = pd.DataFrame(columns=["series", "flip", "direction", "call"])
    wide, narrow = (scale.trends(gains, placed, 0.02, alpha=a).iloc[0] for a in (0.05, 0.01))
    assert narrow["adj_level"] == pytest.approx(0.99) and wide["adj_level"] == pytest.approx(0.95)
    assert narrow["slope_adj_low"] < wide["slope_adj_low"]

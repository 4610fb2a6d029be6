"""A study's ladder in the report (report/ladder.py) through `anatomy report` on hand-written toy ladders: the
multipliers lead the terminal, report.md/.html, report.json and the results file; the figures exist; a ladder
no law fits is one line in the report, or refused (exit 2) where the multipliers are asked for."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from anatomy_cli.report import ladder, stats, worth
from anatomy_cli.report.build import build_report
from anatomy_cli.report.results_file import load
from anatomy_cli.spec import components as comp
from anatomy_cli.spec.config import ModelConfig
from tests.helpers import flat, invoke, one_error_line
from tests.report_runs import PNG_MAGIC

pytestmark = pytest.mark.filterwarnings("error")

RUNGS = {"XS": 1, "S": 2, "M": 4, "L": 8}  # name -> n_layer: four tiny rungs, compute doubling
SEED_OFFSET = (0.0, 0.004, -0.004)
MULT = {"rope": 1.6, "swiglu": 1.0}  # the compute multiplier each part is built to have, added to the 2017 end


def model(flips, n_layer):
    flips = set(flips)
    return {"vocab_size": 65, "d_model": 32, "n_layer": n_layer, "n_head": 4, "n_kv_head": 4, "ctx_len": 64,
            "norm_type": "layernorm", "norm_pos": "post", "pos_type": "rope" if "rope" in flips else "learned",
            "ffn_type": "swiglu" if "swiglu" in flips else "gelu"}


def flops(flips, n_layer) -> float:
    return ModelConfig.model_validate(model(flips, n_layer)).flops_per_token() * 20 * 4 * 64


def law(c: float, c0: float) -> float:
    return 1.2 + 1.5 * (c / c0) ** -0.4


def run(root: Path, name: str, flips, n_layer: int, seed: int, best: float, lr: float = 1e-3) -> None:
    d = root / name
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps({
        "name": name, "seed": seed, "model": model(flips, n_layer),
        "train": {"steps": 20, "batch_size": 4, "lr": lr, "warmup": 2}, "data": {"source": None}}))
    metrics = [{"step": s, "train_loss": 3.0, "val_loss": best + (0.1 if s < 20 else 0), "tokens": 256 * s}
               for s in (0, 10, 20)]
    (d / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))
    (d / "summary.json").write_text(json.dumps({"status": "completed", "best_val_loss": best, "best_val_bpb": best,
                                                "best_step": 20, "final_val_loss": best, "params": 1}))


def study(root: Path, rungs=RUNGS, mult=MULT, falls: bool = True, worth_margin: float | None = None) -> Path:
    """The 2017 end at every rung on a known law, each part added to it at its built multiplier (the end's
    loss at mult x the arm's compute), three seeds; sweep.json naming the rungs as sizes."""
    c0 = flops((), 1)
    for size, n_layer in rungs.items():
        n_layer, lr = n_layer if isinstance(n_layer, tuple) else (n_layer, 1e-3)
        for seed, off in zip((1, 2, 3), SEED_OFFSET):
            c = flops((), n_layer)
            ref = law(c, c0) if falls else 2.0 + 0.01 * math.log(c / c0)
            run(root, f"{size}_2017-s{seed}", (), n_layer, seed, ref + off, lr)
            for flip, m in mult.items():
                arm = law(m * flops((flip,), n_layer), c0) if falls else ref
                run(root, f"{size}_2017+{flip}-s{seed}", (flip,), n_layer, seed, arm + off + 0.001 * (seed - 2), lr)
    sizes = [{"name": n, "settings": {"model.n_layer": k} if isinstance(k, int) else
              {"model.n_layer": k[0], "train.lr": k[1]}, "budget": "same-steps"} for n, k in rungs.items()]
    record = {"components": [comp.record(comp.BY_NAME[n]) for n in comp.FIVE], "sizes": sizes}
    (root / "sweep.json").write_text(json.dumps(record | ({"worth_margin": worth_margin} if worth_margin else {})))
    return root


def test_a_ladder_of_four_rungs_leads_every_output_with_its_multipliers(tmp_path):
    root = study(tmp_path / "study")
    res = invoke("report", str(root), "--results", str(tmp_path / "r.json"))
    assert res.exit_code == 0, res.output
    out = res.output
    assert out.index("worth in compute") < out.index("verdict: gain")  # the multipliers lead the terminal
    assert "rope added to the the" not in out
    w = json.loads((root / "report" / "report.json").read_text())["worth"]
    assert w["axis"] == "compute" and w["rungs"] == list(RUNGS) and w["margin"] == worth.WORTH_MARGIN
    rope = {m["rung"]: m for m in w["multipliers"] if m["flip"] == "rope"}
    swiglu = {m["rung"]: m for m in w["multipliers"] if m["flip"] == "swiglu"}
    assert set(rope) == set(RUNGS)
    for rung in ("S", "M"):  # inside the ladder: the built multipliers back, called
        assert rope[rung]["multiplier"] == pytest.approx(1.6, rel=0.02) and rope[rung]["call"] == stats.HELPS
        assert swiglu[rung]["multiplier"] == pytest.approx(1.0, abs=0.02)
        assert swiglu[rung]["call"] in (stats.NEGLIGIBLE, stats.SMALL)
    assert rope["L"]["call"] == worth.EXTRAPOLATED  # 1.6x the largest rung's compute: beyond the ladder
    assert {t["flip"] for t in w["trends"]} == {"rope", "swiglu"} and len(w["laws"]) == 1
    md = (root / "report" / "report.md").read_text()
    assert md.index("What each part is worth in compute") < md.index("## Verdict")
    assert "worth.png" in md and "law.png" in md
    html = (root / "report" / "report.html").read_text()
    assert html.index("What each part is worth in compute") < html.index("Verdict")
    for fig in ("worth.png", "law.png"):
        assert (root / "report" / fig).read_bytes()[:8] == PNG_MAGIC
    doc = load(tmp_path / "r.json")  # the typed model takes it
    assert doc["worth"]["multipliers"][0]["flip"] == "rope"
    assert {m["rung"] for m in doc["worth"]["multipliers"]} == set(RUNGS)


def test_three_rungs_are_one_line_in_the_report_and_the_rest_is_unchanged(tmp_path):
    three = {k: v for k, v in RUNGS.items() if k != "L"}
    root = study(tmp_path / "study", rungs=three)
    res = invoke("report", str(root), "--results", str(tmp_path / "r.json"))
    assert res.exit_code == 0, res.output
    out = flat(res.output)
    assert out.count("No compute multipliers") == 1
    note = out[out.index("No compute multipliers"):].split(").")[0] + ")."
    assert "4 rungs or more" in note and "has 3 (XS, S, M)" in note
    md = (root / "report" / "report.md").read_text()
    assert md.count("No compute multipliers") == 1 and "What each part is worth in compute" not in md
    assert not (root / "report" / "worth.png").exists()
    assert load(tmp_path / "r.json")["worth"] == {"axis": "compute", "rungs": list(three),
                                                  "note": note}
    r = build_report(root)
    assert r.ladder.worth is None and r.scale is not None  # the sizes section stands as it was


@pytest.mark.parametrize("case, args, fragment", [
    ("three", ("--worth-margin", "1.05"), "4 rungs or more"),
    ("four", ("--worth-margin", "1.0"), "multiplier above 1"),
    ("four", ("--worth-margin", "0.5"), "multiplier above 1"),
    ("flat", ("--worth-margin", "1.05"), "does not fall"),
    ("same", ("--worth-margin", "1.05"), "share one compute"),
    ("recorded", (), "4 rungs or more"),
])
def test_a_ladder_no_law_fits_is_refused_in_one_line_where_asked_for(tmp_path, case, args, fragment):
    three = {k: v for k, v in RUNGS.items() if k != "L"}
    root = {"three": lambda: study(tmp_path / "s", rungs=three), "four": lambda: study(tmp_path / "s"),
            "flat": lambda: study(tmp_path / "s", falls=False),
            "same": lambda: study(tmp_path / "s", rungs={"XS": 1, "S": 2, "M2": (4, 2e-3), "M": (4, 1e-3)}),
            "recorded": lambda: study(tmp_path / "s", rungs=three, worth_margin=1.05)}[case]()
    res = invoke("report", str(root), *args)
    one_error_line(res, fragment, code=2)
    assert not (root / "report").exists()  # refused before anything is written


def test_a_worth_margin_judges_the_calls_and_is_recorded(tmp_path):
    wide = study(tmp_path / "s", worth_margin=2.0)
    r = build_report(wide)
    m = r.ladder.worth.multipliers
    assert r.ladder.worth.margin == 2.0
    assert set(m.loc[(m["flip"] == "rope") & ~m["extrapolated"], "call"]) <= {stats.SMALL, stats.NEGLIGIBLE,
                                                                             stats.UNDECIDED}
    assert ladder.rung_column(r.runs) == "size"


def test_the_results_block_renders_each_multiplier_beside_its_gain(tmp_path):
    from anatomy_cli.report.results_blocks import render
    from anatomy_cli.report.results_file import ResultsError

    root = study(tmp_path / "study")
    assert invoke("report", str(root), "--results", str(tmp_path / "r.json")).exit_code == 0
    doc = load(tmp_path / "r.json")
    block = render(doc, "worth")
    rope = next(line for line in block.splitlines() if line.startswith("| rope |"))
    cells = [c.strip() for c in rope.strip("|").split("|")]
    assert cells[1] == "added to 2017" and cells[2].endswith("helps")  # the loss call at L beside the multipliers
    assert cells[3].startswith("1.60x [") and cells[3].endswith("helps") and cells[6].endswith("extrapolated")
    assert "The law each compute multiplier inverts: 2017 end: L = 1.2 + " in block
    assert render(doc, "multiplier rope add-one S") == cells[4]
    with pytest.raises(ResultsError, match="no multiplier for rope add-one at 'XL'"):
        render(doc, "multiplier rope add-one XL")
    three = study(tmp_path / "three", rungs={k: v for k, v in RUNGS.items() if k != "L"})
    assert invoke("report", str(three), "--results", str(tmp_path / "t.json")).exit_code == 0
    with pytest.raises(ResultsError, match="no multipliers \\(No compute multipliers: a law needs 4 rungs"):
        render(load(tmp_path / "t.json"), "worth")

"""Effects across sizes (scale.py) on hand-written sized studies: the call rule, the flags, the files.

The synthetic study: the 2017 end and each of the five parts added to it, at three sizes (n_layer
1, 2, 4) over three seeds, with gains built to have each call; no torch, no training.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from anatomy_cli.report import figures, results_blocks, results_build, results_file, scale, stats, write
from anatomy_cli.report.build import build_report
from anatomy_cli.spec import components as comp

pytestmark = pytest.mark.filterwarnings("error")

SIZES = {"S": 1, "M": 2, "L": 4}  # name -> n_layer (d_model 32: 12,416 non-embedding parameters per layer)
REF_OFFSET = (0.0, 0.01, -0.01)  # the 2017 end's loss per seed: sd 0.01, its noise
# Per component: (gain per size and seed, the call it is built to have).
BUILT = {
    "rope": ([[0.102, 0.099, 0.100], [0.201, 0.203, 0.197], [0.300, 0.298, 0.303]], scale.GROWS),
    "prenorm": ([[0.301, 0.297, 0.300], [0.199, 0.202, 0.200], [0.101, 0.099, 0.098]], scale.SHRINKS),
    "swiglu": ([[0.204, 0.196, 0.200], [0.197, 0.203, 0.200], [0.201, 0.199, 0.200]], scale.HOLDS),
    "gqa": ([[0.202, 0.199, 0.200], [0.001, -0.002, 0.000], [-0.199, -0.201, -0.203]], scale.REVERSES),
    "rmsnorm": ([[0.10, -0.10, 0.0], [-0.10, 0.10, 0.0], [0.05, -0.05, 0.0]], scale.NOISE_ALL),  # noisy and flat
}


def model(flips, n_layer):
    flips = set(flips)
    return {"vocab_size": 65, "d_model": 32, "n_layer": n_layer, "n_head": 4, "n_kv_head": 2 if "gqa" in flips else 4,
            "ctx_len": 64, "norm_type": "rmsnorm" if "rmsnorm" in flips else "layernorm",
            "norm_pos": "pre" if "prenorm" in flips else "post", "pos_type": "rope" if "rope" in flips else "learned",
            "ffn_type": "swiglu" if "swiglu" in flips else "gelu"}


def sized_run(root: Path, name: str, flips, n_layer: int, seed: int, best: float, best_step: int = 20) -> None:
    """A completed run of 20 steps evaluated at 0, 5, 10, 20, its best val loss at best_step."""
    run = root / name
    run.mkdir(parents=True)
    config = {"name": name, "seed": seed, "model": model(flips, n_layer),
              "train": {"steps": 20, "batch_size": 4, "lr": 1e-3, "warmup": 2}, "data": {"source": None}}
    (run / "config.json").write_text(json.dumps(config))
    metrics = [{"step": s, "train_loss": 3.0, "val_loss": best if s == best_step else best + 0.1, "tokens": 256 * s}
               for s in (0, 5, 10, 20)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))
    (run / "summary.json").write_text(json.dumps({"status": "completed", "best_val_loss": best, "best_val_bpb": best,
                                                  "best_step": best_step,
                                                  "final_val_loss": best + 0.1 * (best_step != 20), "params": 1}))


def sized_study(root: Path, built=BUILT, seeds=(1, 2, 3), overfit: dict[str, int] | None = None) -> Path:
    """Every size's 2017 end and add-one runs, and sweep.json naming the sizes (by n_layer)."""
    for size, n_layer in SIZES.items():
        for i, seed in enumerate(seeds):
            ref = 2.5 + REF_OFFSET[i]
            late = i < (overfit or {}).get(size, 0)  # the first k seeds' runs of this size peak at step 5 of 20
            sized_run(root, f"{size}_2017-s{seed}", (), n_layer, seed, ref, 5 if late else 20)
            for flip, (gains, _) in built.items():
                g = gains[list(SIZES).index(size)][i]
                sized_run(root, f"{size}_2017+{flip}-s{seed}", (flip,), n_layer, seed, ref - g, 5 if late else 20)
    sizes = [{"name": n, "settings": {"model.n_layer": k}, "budget": "same-steps"} for n, k in SIZES.items()]
    (root / "sweep.json").write_text(json.dumps({"components": [comp.record(comp.BY_NAME[n]) for n in comp.FIVE],
                                                 "sizes": sizes}))
    return root


def test_each_call_comes_from_effects_built_to_have_it(tmp_path):
    r = build_report(sized_study(tmp_path))
    runs, curves, effects = r.runs, r.curves, r.effects
    assert dict(zip(runs["run_id"], runs["size"]))["M_2017+rope-s2"] == "M"
    assert set(runs["size"]) == set(SIZES)
    across = scale.scale_frames(runs, curves, effects)
    got = dict(zip(across.trends["flip"], across.trends["call"]))
    assert got == {flip: call for flip, (_, call) in BUILT.items()}
    t = across.trends.set_index("flip")
    # the slope is the mean over seeds of each seed's OLS slope of gain on log10 N
    x = np.log10([12416 * k for k in SIZES.values()])
    gains = np.array(BUILT["rope"][0])  # [size][seed]
    slopes = [np.polyfit(x, gains[:, i], 1)[0] for i in range(3)]
    assert t.loc["rope", "slope"] == pytest.approx(np.mean(slopes))
    assert t.loc["rope", "slope_low"] == pytest.approx(stats.paired(slopes)["raw_low"])  # the raw interval: plain t
    assert t["p_holm"].tolist() == pytest.approx(stats.holm(t["p_value"]).tolist(), nan_ok=True)  # Holm over the five
    assert (t["n_seeds"] == 3).all() and (t["sizes"] == 3).all()
    # each size's effect is the verdict's: the same gain, interval and call
    loss = effects[effects["metric"] == "best_val_bpb"]
    for r in across.by_size.itertuples():
        e = loss[(loss["flip"] == r.flip) & (loss["group"] == f"size {r.size}")].iloc[0]
        assert (r.gain, r.adj_low, r.call) == (e.gain, e.adj_low, e.call)
    assert set(loss["group"]) == {"size S", "size M", "size L"}  # groups named by size, not by n_layer


def test_a_noisy_trend_and_a_trend_too_small_to_matter_are_no_trend():
    sizes = pd.DataFrame({"size": ["S", "M", "L"], "non_embedding_params": [1e4, 1e5, 1e6]})

    def call(per_size, margin=0.01):  # per_size[size][seed] gains -> (the call, the trend row)
        rows = [{"series": "", "flip": "f", "direction": "add-one", "against": "2017 end", "seed": seed,
                 "size": s, "non_embedding_params": n, "gain": per_size[j][seed]}
                for j, (s, n) in enumerate(zip(sizes["size"], sizes["non_embedding_params"]))
                for seed in range(len(per_size[0]))]
        gains = pd.DataFrame(rows)
        cells = [stats.paired(gains[gains["size"] == s]["gain"]) | {"size": s} for s in sizes["size"]]
        judged = pd.DataFrame(stats.judge(cells, margin)).assign(series="", flip="f", direction="add-one")
        t = scale.trends(gains, judged, margin)
        return t["call"].iloc[0], t.iloc[0]

    # a mean that climbs 0 -> 0.2, but each seed's line goes its own way: no size helps, no trend
    got, t = call([[0.3, -0.3, 0.0], [-0.2, 0.4, 0.1], [0.6, -0.3, 0.3]])
    assert got == scale.NOISE_ALL and t.p_holm > 0.05
    # a slope every seed agrees on, 0.004 across the ladder: inside the 0.01 margin, flat: holds
    got, t = call([[0.200, 0.201, 0.202], [0.202, 0.203, 0.204], [0.204, 0.205, 0.206]])
    assert got == scale.HOLDS and t.p_value < 0.05 and abs(t.change) < 0.01
    assert call([[0.1, 0.1], [0.2, 0.2], [0.3, 0.3]])[0] == stats.TOO_FEW  # two seeds: no call


SURE, UNSURE, BELOW = (0.05, 0.2), (-0.01, 0.3), (-0.3, -0.05)  # a slope's simultaneous interval


FLAT = (-0.002, 0.003)  # x 2 decades: every change it allows is inside the 0.01 margin


@pytest.mark.parametrize("calls, slope, fit, want", [
    ([stats.HELPS, stats.UNDECIDED, stats.HURTS], UNSURE, (0.2, -0.2), scale.REVERSES),
    ([stats.HELPS, stats.UNDECIDED, stats.UNDECIDED], BELOW, (0.1, -0.1), scale.REVERSES),  # the line crosses 0
    ([stats.HELPS, stats.HELPS, stats.HELPS], SURE, (0.1, 0.3), scale.GROWS),
    ([stats.HURTS, stats.HURTS, stats.HURTS], BELOW, (-0.1, -0.3), scale.GROWS),  # hurts more: grows
    ([stats.HELPS, stats.HELPS, stats.UNDECIDED], BELOW, (0.3, 0.05), scale.SHRINKS),
    ([stats.HELPS, stats.UNDECIDED, stats.NEGLIGIBLE], UNSURE, (0.2, 0.1), scale.NO_TREND),
    ([stats.UNDECIDED, stats.NEGLIGIBLE, stats.UNDECIDED], UNSURE, (0.0, 0.01), scale.NOISE_ALL),
    ([stats.UNDECIDED, stats.UNDECIDED, stats.UNDECIDED], SURE, (0.0, 0.2), scale.GROWS),  # the trend decides
    ([stats.HELPS, stats.HELPS, stats.HELPS], UNSURE, (0.1, 0.3), scale.NO_TREND),  # holds 0, but not flat
    ([stats.HELPS, stats.HELPS, stats.HELPS], SURE, (0.1, 0.105), scale.NO_TREND),  # a change below 0.01, not flat
    ([stats.HELPS, stats.HELPS, stats.HELPS], FLAT, (0.1, 0.101), scale.HOLDS),  # flat: the equivalence test
    ([stats.HELPS, stats.HELPS, stats.HELPS], (float("nan"),) * 2, (0.1, 0.3), scale.NO_TREND),  # no interval
])
def test_the_rule_on_one_components_numbers(calls, slope, fit, want):
    assert scale.scale_call(calls, 3, 3, slope, fit, 0.01, 2.0) == want
    assert scale.scale_call(calls, 3, 1, slope, fit, 0.01, 2.0) == stats.TOO_FEW  # one size: no trend to call


def test_holds_needs_the_flat_trend_that_todays_rule_never_asked_for():
    """Before issue 28 'holds' meant 'no trend detected': a trend whose interval allows a change of 8x the
    margin across the ladder was called holds. Now it is 'no trend detected'; holds needs flatness."""
    wide = (-0.05, 0.4)  # x 2 decades: anything from -0.1 to +0.8 across the ladder
    assert scale.scale_call([stats.HELPS] * 3, 3, 3, wide, (0.1, 0.2), 0.01, 2.0) == scale.NO_TREND
    assert scale.scale_call([stats.HELPS] * 3, 3, 3, FLAT, (0.1, 0.1), 0.01, 2.0) == scale.HOLDS


def test_a_trend_is_called_from_the_simultaneous_interval_it_shows(tmp_path):
    """The call and the interval beside it never disagree: a trend counts exactly when its Bonferroni
    interval over the study's trends excludes 0 (and the change matters), even where Holm's p alone
    would have called it."""
    r = build_report(sized_study(tmp_path))
    runs, curves, effects = r.runs, r.curves, r.effects
    t = scale.scale_frames(runs, curves, effects).trends
    m = int(t["p_value"].notna().sum())
    assert t["adj_level"].tolist() == pytest.approx([1 - 0.05 / m] * len(t))
    for r in t.itertuples():
        assert r.slope_adj_low <= r.slope_low <= r.slope <= r.slope_high <= r.slope_adj_high
        trend = (r.slope_adj_low > 0 or r.slope_adj_high < 0) and abs(r.change) > r.margin
        assert (r.call in (scale.GROWS, scale.SHRINKS)) == trend or r.call == scale.REVERSES  # sign first

    # Two trends: a sure one, and one whose per-seed slopes (0.13, 0.20, 0.27) give p = 0.039. Holm
    # compares the second-smallest p with 0.05 / 1 and would call it; its 97.5% interval holds 0.
    sizes = pd.DataFrame({"size": ["S", "M", "L"], "non_embedding_params": [1e4, 1e5, 1e6]})
    slopes = {"sure": (0.20, 0.201, 0.202), "borderline": (0.13, 0.20, 0.27)}
    gains = pd.DataFrame([{"series": "", "flip": f, "direction": "add-one", "against": "2017 end", "seed": i,
                           "size": sz, "non_embedding_params": n, "gain": 0.1 + k * per_seed[i]}
                          for f, per_seed in slopes.items() for i in range(3)
                          for k, (sz, n) in enumerate(zip(sizes["size"], sizes["non_embedding_params"]))])
    judged = pd.DataFrame([{"series": "", "flip": f, "direction": "add-one", "size": sz, "call": stats.HELPS}
                           for f in slopes for sz in sizes["size"]])
    t = scale.trends(gains, judged, 0.01).set_index("flip")
    assert t.loc["borderline", "p_value"] == pytest.approx(0.039, abs=0.001)
    assert t.loc["borderline", "p_holm"] < 0.05 < 2 * t.loc["borderline", "p_value"]  # Holm yes, Bonferroni no
    assert t.loc["borderline", "slope_adj_low"] < 0 < t.loc["borderline", "slope_low"]
    assert t.loc["borderline", "call"] == scale.NO_TREND and t.loc["sure", "call"] == scale.GROWS


def test_flags_still_improving_and_overfit_per_size(tmp_path):
    r = build_report(sized_study(tmp_path, overfit={"L": 2}))
    runs, curves, effects = r.runs, r.curves, r.effects
    sizes = scale.scale_frames(runs, curves, effects).sizes.set_index("size")
    n = 6  # the 2017 end and five add-one runs per seed
    assert sizes.loc["S", "still_improving"] == 3 * n and sizes.loc["S", "overfit"] == 0
    assert sizes.loc["L", "still_improving"] == n and sizes.loc["L", "overfit"] == 2 * n
    assert sizes.loc["S", "flags"] == f"still improving ({3 * n} of {3 * n} runs)"
    assert sizes.loc["L", "flags"] == f"still improving ({n} of {3 * n} runs); overfit ({2 * n} of {3 * n} runs)"
    assert sizes.loc["M", "non_embedding_params"] == 2 * 12416 and sizes.loc["M", "steps"] == 20
    assert sizes.loc["M", "tokens"] == 20 * 4 * 64


def test_a_sizes_parameters_are_its_reference_ends_as_scale_plan_prints_them(tmp_path):
    """With +swiglu and +prenorm (both larger than the 2017 end) the median over a size's runs is
    +prenorm's count; the size is the 2017 end's, the number scale-plan shows for it."""
    from anatomy_cli.spec.config import ModelConfig

    built = {f: BUILT[f] for f in ("swiglu", "prenorm")}
    r = build_report(sized_study(tmp_path, built=built))
    runs, curves, effects = r.runs, r.curves, r.effects
    sizes = scale.scale_frames(runs, curves, effects).sizes.set_index("size")
    for size, n_layer in SIZES.items():
        ref = ModelConfig(**model((), n_layer)).non_embedding_params()
        assert sizes.loc[size, "non_embedding_params"] == ref
        assert runs.loc[runs["size"] == size, "non_embedding_params"].median() > ref  # the median is not


@pytest.mark.slow  # writes whole reports with figures: seconds each
def test_report_files_carry_the_scale_section_csv_json_and_figure(tmp_path):
    root = sized_study(tmp_path / "study", overfit={"L": 1})
    paths = write.write_report(build_report(root))
    md = paths["report.md"].read_text()
    section = md[md.index("## Effects across scale"):md.index("## Curves")]
    assert "**The rule across sizes**" in section and "the same 20 steps at every size" in section
    assert "overfit (6 of 18 runs)" in section and "![scale](scale.png)" in section
    verdict = md[md.index("## Verdict"):md.index("## Effects across scale")]
    for flip, (_, call) in BUILT.items():
        assert f"**{flip}**: added {call}" in verdict  # a line per component in the verdict
    csv = pd.read_csv(paths["effects-by-size.csv"])
    assert len(csv) == 5 * 3 and set(csv["size"]) == set(SIZES)
    assert dict(csv.drop_duplicates("flip")[["flip", "scale_call"]].values) == {f: c for f, (_, c) in BUILT.items()}
    assert csv.loc[csv["size"] == "L", "flags"].str.contains("overfit").all()
    doc = json.loads(paths["report.json"].read_text())
    assert {t["flip"]: t["call"] for t in doc["scale"]["trends"]} == {f: c for f, (_, c) in BUILT.items()}
    assert [s["size"] for s in doc["scale"]["sizes"]] == ["S", "M", "L"] and doc["scale"]["budget"] == {
        "budget": "same-steps"}
    assert "report.html" in paths and "Effects across scale" in paths["report.html"].read_text()


def test_small_multiples_share_one_parameter_axis_whose_ticks_are_the_sizes(tmp_path):
    r = build_report(sized_study(tmp_path))
    runs, curves, effects = r.runs, r.curves, r.effects
    across = scale.scale_frames(runs, curves, effects)
    fig = figures.scale_figure(across.by_size, across.trends)
    panels = [ax for ax in fig.axes if ax.axison]
    assert len(panels) == 5
    ticks = [12416.0, 24832.0, 49664.0]
    for ax in panels:
        assert ax.get_xscale() == "log" and ax.get_xlim() == panels[0].get_xlim()
        assert list(ax.get_xticks()) == ticks
    # the sizes are named under each column's lowest panel (3 across: two panels on the second row)
    named = [[t.get_text() for t in ax.get_xticklabels()] for ax in panels]
    assert named == [[], []] + [["S\n12.4k", "M\n24.8k", "L\n49.7k"]] * 3
    titles = {ax.get_title().split("\n")[0]: ax.get_title() for ax in panels}
    assert titles["rope"].endswith("added: grows") and titles["gqa"].endswith("added: reverses sign")


@pytest.mark.slow  # writes whole reports with figures: seconds each
def test_no_scale_section_without_two_sizes(tmp_path):
    root = sized_study(tmp_path)
    design = json.loads((root / "sweep.json").read_text())
    (root / "sweep.json").write_text(json.dumps({"components": design["components"]}))
    r = build_report(root)
    runs, curves, effects = r.runs, r.curves, r.effects
    assert (runs["size"] == "").all() and scale.scale_frames(runs, curves, effects) is None
    assert "Effects across scale" not in write.write_report(build_report(root))["report.md"].read_text()


def test_results_file_carries_the_scale_numbers_for_readme_blocks(tmp_path):

    root = sized_study(tmp_path / "runs" / "study")
    path = results_build.write_results(tmp_path / "experiments" / "results" / "study.json", build_report(root))
    doc = results_file.load(path)
    assert {t["flip"]: t["call"] for t in doc["scale"]["trends"]} == {f: c for f, (_, c) in BUILT.items()}
    block = results_blocks.render(doc, "scale")
    assert "| component | change | S (12,416) | M (24,832) | L (49,664) | slope per 10x | call |" in block
    rope = next(e for e in doc["scale"]["effects"] if e["flip"] == "rope" and e["size"] == "L")
    assert "| rope | added to 2017 | " in block and f"{rope['gain']:+.3f}".replace("-", "−") in block
    assert results_blocks.render(doc, "trend gqa add-one") == "reverses sign"
    with pytest.raises(results_file.ResultsError, match="no trend across sizes for gqa remove-one"):
        results_blocks.render(doc, "trend gqa remove-one")


def test_groups_are_named_by_size_and_by_what_varies_within_a_size():
    keys = pd.Series([f"rope|{json.dumps({'model.d_model': d, 'train.lr': lr})}"
                      for d in (16, 32) for lr in (1e-3, 3e-3)])
    sizes = pd.Series(["S", "S", "M", "M"])
    names = comp.group_names(keys, sizes)
    assert list(names.values()) == ["size S, train.lr=0.001", "size S, train.lr=0.003", "size M, train.lr=0.001",
                                    "size M, train.lr=0.003"]
    assert scale.series_of("size M, train.lr=0.003", "M") == "train.lr=0.003"
    assert list(comp.group_names(keys).values())[0] == "d_model=16, train.lr=0.001"  # no sizes: the settings


def test_a_sizes_calls_do_not_change_when_other_sizes_join(tmp_path):
    """Issue 28: one family per question. Before, every effect of the folder was one Bonferroni family,
    so a ladder turned m from 5 to 15 and moved the L size's intervals and calls on identical data."""
    full = sized_study(tmp_path / "ladder")
    alone = tmp_path / "alone"
    alone.mkdir()
    for run in full.glob("L_*"):
        shutil.copytree(run, alone / run.name)
    (alone / "sweep.json").write_text(json.dumps({**json.loads((full / "sweep.json").read_text()),
                                                  "sizes": [{"name": "L", "settings": {"model.n_layer": 4},
                                                             "budget": "same-steps"}]}))
    cols = ["flip", "direction", "gain", "adj_low", "adj_high", "call", "family", "mde"]

    def size_l(root):
        effects = build_report(root).effects
        return effects[(effects["group"] == "size L") & (effects["metric"] == "best_val_bpb")][cols].reset_index(
            drop=True)

    pd.testing.assert_frame_equal(size_l(full), size_l(alone))
    assert (size_l(full)["family"] == len(BUILT)).all()


def test_each_groups_noise_is_its_own_and_the_margin_is_fixed(tmp_path):
    """Issue 28: the margin of a multi-group study was the sd of whichever reference end sorted first
    (the most seeds, then the settings' JSON), so one size's noise judged every size. Now the margin is
    fixed before the data and each group shows its own end's sd beside it."""
    root = sized_study(tmp_path, seeds=(1, 2, 3))
    for seed, offset in ((4, 0.05), (5, -0.05)):  # S gets two more, noisier seeds: it sorts first by count
        sized_run(root, f"S_2017-s{seed}", (), SIZES["S"], seed, 2.5 + offset)
    effects = build_report(root).effects
    loss = effects[effects["metric"] == "best_val_bpb"]
    assert (loss["margin"] == stats.DEFAULT_MARGIN).all() and (loss["margin_basis"] == stats.DEFAULT).all()
    noise = loss.groupby("group")["noise"].first()
    assert noise["size S"] == pytest.approx(np.std([2.5, 2.51, 2.49, 2.55, 2.45], ddof=1))
    assert noise["size M"] == pytest.approx(0.01) and noise["size L"] == pytest.approx(0.01)

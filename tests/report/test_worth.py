"""Compute and data multipliers (report/worth.py) on ladders built from known laws: the fit, the inversion,
the jackknife interval, the calls at 1x, the refusals, the trends, the runs-frame adapter. No torch."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats as sps

from anatomy_cli.report import stats, worth
from anatomy_cli.spec.config import ModelConfig
from anatomy_cli.spec.errors import InputError
from anatomy_cli.spec.roles import ADD_ONE, REMOVE_ONE

pytestmark = pytest.mark.filterwarnings("error")

C0 = 1e12
LAW = {ADD_ONE: (1.3, 2.2, 0.15), REMOVE_ONE: (1.1, 1.8, 0.18)}  # (floor, scale at C0, alpha)


def true_loss(direction: str, c) -> np.ndarray:
    e, a, alpha = LAW[direction]
    return e + a * (np.asarray(c, dtype=float) / C0) ** -alpha


def ladder(arms: dict, rungs: int = 5, seeds: int = 3, noise: float = 0.0, seed_sd: float = 0.0, rng_seed: int = 0,
           cheap: dict | None = None, speed: dict | None = None, law=true_loss, column: str = "flops") -> pd.DataFrame:
    """LADDER_COLUMNS: each direction's end and its arms {(direction, flip): multiplier, or a list of one per
    rung} at `rungs` rungs of compute C0 x 2^k; cheap: {(direction, flip): FLOPs per token relative to the
    end}; speed: {(direction, flip): tokens/s relative to the end} (the end at 1000 tokens/s)."""
    rng = np.random.default_rng(rng_seed)
    cheap, speed = cheap or {}, speed or {}
    rows = []
    for direction in {d for d, _ in arms} | {ADD_ONE}:
        shift = rng.normal(0, seed_sd, seeds)  # a seed's offset, shared by its configs and rungs
        configs = [("", 1.0)] + [(f, m) for (d, f), m in arms.items() if d == direction]
        for k in range(rungs):
            c = C0 * 2.0**k
            for flip, m in configs:
                m_k = m[k] if isinstance(m, (list, tuple)) else m
                cost = c * cheap.get((direction, flip), 1.0)
                tps = 1000.0 * speed.get((direction, flip), 1.0) if speed else math.nan
                for s in range(seeds):
                    loss = float(law(direction, m_k * cost)) + shift[s] + rng.normal(0, noise)
                    rows.append({"series": "", "rung": f"r{k}", "direction": direction, "flip": flip, "against": "",
                                 "seed": s, "loss": loss, "flops": cost, "tokens": c if column == "flops" else cost,
                                 "tokens_per_s": tps})
    return pd.DataFrame(rows, columns=worth.LADDER_COLUMNS)


def row(w: worth.Worth, flip: str, rung: str, direction: str = ADD_ONE) -> pd.Series:
    m = w.multipliers
    return m[(m["flip"] == flip) & (m["rung"] == rung) & (m["direction"] == direction)].iloc[0]


# ------------------------------------------------------------------------------- the law


@pytest.mark.parametrize("floor, alpha", [(1.3, 0.15), (0.0, 0.3), (2.5, 0.6), (0.4, 1.5)])
def test_fit_law_recovers_a_known_law_from_its_rungs(floor, alpha):
    c = C0 * 2.0 ** np.arange(6)
    y = floor + 0.8 * (c / C0) ** -alpha
    law = worth.fit_law(c, y)
    assert law.floor == pytest.approx(floor, abs=1e-6)
    assert law.alpha == pytest.approx(alpha, rel=1e-5)
    assert np.allclose(law.loss(c), y, atol=1e-9)
    assert np.allclose(law.needed(y), c, rtol=1e-6)  # the inverse


def test_fit_law_with_its_floor_given_fits_scale_and_exponent_alone():
    c = C0 * 2.0 ** np.arange(5)
    law = worth.fit_law(c, 1.3 + 2.2 * (c / C0) ** -0.15, floor=1.3)
    assert law.fixed_floor and law.floor == 1.3
    assert law.alpha == pytest.approx(0.15, rel=1e-6)
    wrong = worth.fit_law(c, 1.3 + 2.2 * (c / C0) ** -0.15, floor=1.3 * 4 / 3)  # a floor a third too high
    assert wrong.rss > 1e-8 and wrong.alpha > 0.15  # it misses, and bends harder to reach the rungs


def test_law_needed_is_infinite_at_or_below_the_floor():
    law = worth.fit_law(C0 * 2.0 ** np.arange(4), 1.0 + (2.0 ** np.arange(4)) ** -0.5)
    assert np.isinf(law.needed([law.floor, law.floor - 0.1])).all()


# ------------------------------------------------------------------------------- the inversion


def test_inversion_is_exact_on_noise_free_data_both_directions_and_a_cheaper_arm():
    arms = {(ADD_ONE, "rope"): 2.0, (ADD_ONE, "swiglu"): 1.2, (ADD_ONE, "gqa"): 0.8, (ADD_ONE, "rmsnorm"): 1.0,
            (REMOVE_ONE, "rope"): 0.5, (REMOVE_ONE, "gqa"): 1.25}
    w = worth.compute_worth(ladder(arms, rungs=6), trends=False)
    m = w.multipliers
    truth = np.array([arms[(d, f)] for d, f in zip(m["direction"], m["flip"])])
    assert np.allclose(m["multiplier"], truth, rtol=1e-6)
    cheap = worth.compute_worth(ladder(arms, rungs=6, cheap={(ADD_ONE, "gqa"): 0.9}), trends=False)
    r = row(cheap, "gqa", "r2")
    assert r["multiplier"] == pytest.approx(0.8, rel=1e-6)  # FLOPs the reference needs / FLOPs the arm used
    assert r["needed"] == pytest.approx(0.8 * 0.9 * C0 * 4, rel=1e-6) and r["cost"] == pytest.approx(0.9 * C0 * 4)


def test_an_arm_identical_to_its_end_is_worth_exactly_one_even_where_the_law_misses():
    def bent(direction, c):  # a curve the law cannot follow: the anchored inversion must not care at 1x
        x = np.log(np.asarray(c, dtype=float) / C0)
        return 1.3 + 2.2 * np.exp(-0.15 * (0.5 * x + x**2 / 8))

    w = worth.compute_worth(ladder({(ADD_ONE, "rope"): 1.0}, rungs=5, law=bent, noise=0.0), trends=False)
    assert np.allclose(w.multipliers["multiplier"], 1.0, atol=1e-9)


def test_remove_one_of_a_part_that_helps_is_below_one_and_called_helps():
    arms = {(ADD_ONE, "rope"): 2.0, (REMOVE_ONE, "rope"): 0.5}
    w = worth.compute_worth(ladder(arms, rungs=6, seeds=5, noise=0.002), trends=False)
    add, rem = row(w, "rope", "r2"), row(w, "rope", "r2", REMOVE_ONE)
    assert add["multiplier"] > 1.8 and rem["multiplier"] < 0.56
    assert add["call"] == rem["call"] == stats.HELPS
    assert rem["worth"] == pytest.approx(-math.log(rem["multiplier"]))  # positive: the part helps
    assert rem["low"] < rem["multiplier"] < rem["high"] < 1


# ------------------------------------------------------------------------------- the interval and the calls


def test_the_interval_is_the_jackknife_over_seeds_through_the_refitted_law():
    lad = ladder({(ADD_ONE, "rope"): 1.6}, rungs=5, seeds=4, noise=0.01, seed_sd=0.02, rng_seed=3)
    full = row(worth.compute_worth(lad, trends=False), "rope", "r2")
    left = [math.log(row(worth.compute_worth(lad[lad["seed"] != s], trends=False), "rope", "r2")["multiplier"])
            for s in range(4)]
    n = 4
    jack_se = math.sqrt((n - 1) / n * sum((v - np.mean(left)) ** 2 for v in left))
    assert full["se"] == pytest.approx(jack_se, rel=1e-6)
    crit = float(sps.t.ppf(1 - stats.ALPHA / (2 * full["family"]), n - 1))
    assert math.log(full["high"]) == pytest.approx(math.log(full["multiplier"]) + crit * jack_se, rel=1e-6)


def test_calls_at_one_x_helps_hurts_negligible_undecided():
    arms = {(ADD_ONE, "rope"): 2.0, (ADD_ONE, "gqa"): 0.6, (ADD_ONE, "rmsnorm"): 1.0}
    quiet = worth.compute_worth(ladder(arms, rungs=6, seeds=5, noise=0.0005, rng_seed=1), trends=False)
    assert row(quiet, "rope", "r2")["call"] == stats.HELPS
    assert row(quiet, "gqa", "r2")["call"] == stats.HURTS
    assert row(quiet, "rmsnorm", "r2")["call"] == stats.NEGLIGIBLE  # inside 1/1.05..1.05, confidently
    noisy = worth.compute_worth(ladder(arms, rungs=6, seeds=3, noise=0.05, rng_seed=1), trends=False)
    assert row(noisy, "rmsnorm", "r2")["call"] == stats.UNDECIDED
    wide = worth.compute_worth(ladder(arms, rungs=6, seeds=5, noise=0.0005, rng_seed=1), margin=2.5, trends=False)
    assert row(wide, "rope", "r2")["call"] == stats.NEGLIGIBLE  # 2x is confidently inside a 2.5x margin
    assert set(quiet.multipliers["family"]) == {3}  # one family per rung: its three multipliers


def test_each_rung_is_one_family_judged_by_stats_call_on_log_worth():
    arms = {(ADD_ONE, f): 1.0 for f in ("rmsnorm", "prenorm", "rope", "swiglu", "gqa")} | {(REMOVE_ONE, "rope"): 0.7}
    w = worth.compute_worth(ladder(arms, rungs=5, seeds=3, noise=0.02, rng_seed=7), alpha=0.1, trends=False)
    m = w.multipliers
    assert np.allclose(m["adj_level"], 1 - 0.1 / 6) and set(m["family"]) == {6}  # Bonferroni over the rung's six
    for r in m[~m["extrapolated"]].itertuples():
        sign = 1.0 if r.direction == ADD_ONE else -1.0
        low, high = sorted((sign * math.log(r.low), sign * math.log(r.high)))
        assert r.call == stats.call(r.n_pairs, r.worth, low, high, math.log(worth.WORTH_MARGIN))
        assert r.worth == pytest.approx(sign * math.log(r.multiplier))


def test_a_multiplier_beyond_the_ladder_is_extrapolated_and_not_called():
    w = worth.compute_worth(ladder({(ADD_ONE, "rope"): 2.0}, rungs=5, seeds=5, noise=0.001), trends=False)
    top, mid = row(w, "rope", "r4"), row(w, "rope", "r2")
    assert top["extrapolated"] and top["call"] == worth.EXTRAPOLATED and "largest rung" in top["note"]
    assert math.isfinite(top["low"]) and top["low"] < top["multiplier"] < top["high"]  # shown, not called
    assert not mid["extrapolated"] and mid["call"] == stats.HELPS


def test_an_arm_below_the_laws_floor_is_extrapolated():
    lad = ladder({(ADD_ONE, "rope"): 1.0}, rungs=4, seeds=3)
    lad.loc[lad["flip"] == "rope", "loss"] = 0.5  # far below the floor of 1.3
    r = row(worth.compute_worth(lad, trends=False), "rope", "r1")
    assert r["call"] == worth.EXTRAPOLATED and "floor" in r["note"] and math.isinf(r["needed"])


def test_the_wall_clock_multiplier_counts_throughput():
    arms = {(ADD_ONE, "gqa"): 0.8, (ADD_ONE, "swiglu"): 1.2}
    lad = ladder(arms, rungs=5, cheap={(ADD_ONE, "gqa"): 0.9}, speed={(ADD_ONE, "gqa"): 1.5, (ADD_ONE, "swiglu"): 0.8})
    w = worth.compute_worth(lad, trends=False)
    # seconds the reference needs / seconds the arm used = Sc x (arm FLOPs/s) / (reference FLOPs/s)
    assert row(w, "gqa", "r2")["wall_multiplier"] == pytest.approx(0.8 * 0.9 * 1.5, rel=1e-6)
    assert row(w, "swiglu", "r2")["wall_multiplier"] == pytest.approx(1.2 * 0.8, rel=1e-6)
    untimed = worth.compute_worth(ladder(arms, rungs=5), trends=False)
    assert untimed.multipliers["wall_multiplier"].isna().all() and (untimed.multipliers["wall_call"] == "").all()


def test_lack_of_fit_flags_a_bent_curve_and_not_a_law():
    def bent(direction, c):
        x = np.log(np.asarray(c, dtype=float) / C0)
        return 1.3 + 2.2 * np.exp(-0.3 * (0.2 * x + 0.8 * x**2 / 4))

    right = worth.compute_worth(ladder({}, rungs=7, seeds=4, noise=0.005, rng_seed=2), trends=False).laws.iloc[0]
    bent_law = worth.compute_worth(ladder({}, rungs=7, seeds=4, noise=0.005, rng_seed=2, law=bent),
                                   trends=False).laws.iloc[0]
    assert right["lack_of_fit_p"] > worth.LACK_OF_FIT_P and right["note"] == ""
    assert bent_law["lack_of_fit_p"] < worth.LACK_OF_FIT_P and "misses its rungs" in bent_law["note"]


# ------------------------------------------------------------------------------- refusals


@pytest.mark.parametrize("margin", [1.0, 0.95, -2.0, math.nan, math.inf])
def test_a_margin_that_is_not_a_multiplier_above_one_is_refused(margin):
    with pytest.raises(worth.LadderError, match="multiplier above 1"):
        worth.compute_worth(ladder({(ADD_ONE, "rope"): 2.0}), margin=margin)


def test_fewer_than_four_rungs_are_refused():
    with pytest.raises(worth.LadderError, match="4 rungs or more .* has 3 \\(r0, r1, r2\\)"):
        worth.compute_worth(ladder({(ADD_ONE, "rope"): 2.0}, rungs=3))


def test_rungs_of_one_compute_are_refused():
    lad = ladder({(ADD_ONE, "rope"): 2.0}, rungs=4)
    lad.loc[lad["rung"] == "r3", "flops"] = lad.loc[lad["rung"] == "r2", "flops"].iloc[0]
    with pytest.raises(worth.LadderError, match="rungs r2 and r3 .* share one compute"):
        worth.compute_worth(lad)


def test_a_reference_that_does_not_improve_is_refused():
    lad = ladder({(ADD_ONE, "rope"): 2.0}, rungs=4, law=lambda d, c: 3.0 + 1e-14 * np.asarray(c))
    with pytest.raises(worth.LadderError, match="does not fall with compute"):
        worth.compute_worth(lad)
    assert issubclass(worth.LadderError, InputError)
    with pytest.raises(worth.LadderError) as err:
        worth.compute_worth(lad)
    assert "\n" not in str(err.value)


# ------------------------------------------------------------------------------- trends, data, runs


def test_trends_across_rungs_use_the_report_trend_rule():
    growing = [1.1, 1.3, 1.7, 2.2, 3.0, 4.0, 5.0]
    arms = {(ADD_ONE, "rope"): growing, (ADD_ONE, "swiglu"): 1.5}
    w = worth.compute_worth(ladder(arms, rungs=7, seeds=4, noise=0.0005, rng_seed=5))
    t = w.trends.set_index("flip")
    assert t.loc["rope", "call"] == "grows" and t.loc["swiglu", "call"] == "holds"
    assert t.loc["swiglu", "multiplier_smallest"] == pytest.approx(1.5, rel=0.02)
    assert t.loc["rope", "sizes"] == 7  # every rung, the extrapolated ones named
    assert t.loc["rope", "extrapolated_rungs"] == "r5, r6" and t.loc["swiglu", "extrapolated_rungs"] == "r6"


def test_data_worth_inverts_tokens():
    arms = {(ADD_ONE, "rope"): 1.5, (ADD_ONE, "gqa"): 0.9}
    lad = ladder(arms, rungs=5, column="tokens", cheap={(ADD_ONE, "gqa"): 1.0})
    lad["flops"] *= np.where(lad["flip"] == "gqa", 0.7, 1.0)  # FLOPs do not enter the data multiplier
    w = worth.data_worth(lad, trends=False)
    assert w.axis == worth.DATA and w.laws["axis"].iloc[0] == worth.DATA
    assert row(w, "rope", "r2")["multiplier"] == pytest.approx(1.5, rel=1e-6)
    assert row(w, "gqa", "r2")["multiplier"] == pytest.approx(0.9, rel=1e-6)


def test_ladder_from_runs_reads_costs_from_each_runs_config(tmp_path):
    rows = []
    for k, d in enumerate((32, 48, 64, 96)):
        for role, kv in (("reference", 4), ("+gqa", 2)):
            for seed in (1, 2):
                run = tmp_path / f"{role}-{k}-{seed}"
                run.mkdir()
                model = {"vocab_size": 65, "d_model": d, "n_layer": 2, "n_head": 4, "n_kv_head": kv, "ctx_len": 32}
                cfg = {"seed": seed, "model": model, "train": {"steps": 100, "batch_size": 4}}
                (run / "config.json").write_text(json.dumps(cfg))
                rows.append({"role": role, "status": "completed", "seed": seed, "size": f"s{k}", "path": str(run),
                             "design": "rmsnorm+prenorm+rope+swiglu+gqa",
                             "best_val_bpb": 3.0 - 0.2 * k - 0.05 * (role == "+gqa")})
    runs = pd.DataFrame(rows)
    lad = worth.ladder_from_runs(runs)
    first = lad[(lad["rung"] == "s0") & (lad["flip"] == "gqa")].iloc[0]
    fpt = ModelConfig(vocab_size=65, d_model=32, n_layer=2, n_head=4, n_kv_head=2, ctx_len=32).flops_per_token()
    assert first["direction"] == ADD_ONE and first["tokens"] == 100 * 4 * 32
    assert first["flops"] == fpt * 100 * 4 * 32
    assert set(lad.loc[lad["flip"] == "", "direction"]) == {ADD_ONE} and set(lad["against"]) == {"2017 end"}
    w = worth.compute_worth(lad, trends=False)
    assert len(w.multipliers) == 4 and (w.multipliers["n_pairs"] == 2).all()


def test_the_worth_figures_draw_every_multiplier_on_a_log_axis_and_each_ends_law(tmp_path):
    from anatomy_cli.report import figures

    lad = ladder({(ADD_ONE, "rope"): 2.0, (REMOVE_ONE, "rope"): 0.5}, rungs=4, seeds=3, noise=0.002)
    w = worth.compute_worth(lad, trends=False)
    fig = figures.worth_forest_figure(w.multipliers)
    ax = fig.axes[0]
    assert ax.get_xscale() == "log" and len(ax.get_yticks()) == len(w.multipliers)
    calls = [line.get_gid() for line in ax.get_lines() if (line.get_gid() or "").startswith("call:")]
    assert sorted(calls) == sorted(f"call:{c}" for c in w.multipliers["call"])
    law = figures.law_figure(w.laws, lad)
    assert len(law.axes) == 2 and all(a.get_xscale() == "log" for a in law.axes)
    assert figures.save(fig, tmp_path / "worth.png").stat().st_size > 0


def test_the_calibration_harness_truths_are_what_the_real_code_recovers_without_noise():
    """benchmarks/calibrate_worth.py's ladders, noise off: every multiplier inside the ladder is its truth,
    through compute_worth and data_worth, with the right law and (bent) with a law the fit cannot follow."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import calibrate_worth as cw

    cw.NOISE["off"] = (0.0, 0.0, 0.0)
    for setting in (cw.Setting("right", "off", 5, 3), cw.Setting("right", "off", 4, 3, worth.DATA)):
        w = cw.judged(setting, cw.simulate(np.random.default_rng(0), setting, "mixed", 2), {ADD_ONE: None,
                                                                                          REMOVE_ONE: None})
        m = w.multipliers
        assert np.allclose(m["multiplier"], cw._truth_of(m, "mixed"), rtol=1e-5)
    bent = cw.Setting("bend 1", "off", 6, 3)
    m = cw.judged(bent, cw.simulate(np.random.default_rng(0), bent, "null", 1), {ADD_ONE: None,
                                                                                  REMOVE_ONE: None}).multipliers
    same_cost = m["flip"] != cw.FLIPS[cw.CHEAP]
    assert np.allclose(m.loc[same_cost, "multiplier"], 1.0)  # anchored: 1x whatever the law

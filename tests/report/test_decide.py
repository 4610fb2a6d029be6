"""`anatomy ablate --decide`: rounds of seeds that go only where an effect is still open, with alpha
split over the planned looks (report/decide.py), resumable, and bad input as one line."""

from __future__ import annotations

import json

import numpy as np
import pytest
from helpers import invoke, one_error_line
from toy_data import write_spec

from anatomy_cli.report import decide, stats
from anatomy_cli.report.build import build_report
from anatomy_cli.report.frames import load_runs
from anatomy_cli.spec.errors import InputError
from anatomy_cli.store import records

# A component that changes nothing the loss sees (how often train-loss lines are flushed): same seed,
# same losses, so its paired gains are exactly 0 and it is negligible as soon as it has 3 seeds.
NOOP = {"noop": {"about": "a flush interval", "on": {"train.log_interval": 5}, "off": {"train.log_interval": 10}}}


def test_schedule_alpha_and_budget():
    assert decide.schedule(3, 10) == [3, 5, 7, 9, 10] and decide.schedule(3, 3) == [3]
    assert decide.schedule(2, 6, 1) == [2, 3, 4, 5, 6]
    assert decide.alpha([3, 5, 7, 9, 10]) == pytest.approx(0.01)  # 0.05 split over five looks
    # late spending, the default: most of 0.05 at the final look, the earlier looks in proportion to their order
    assert decide.spending([3, 5, 7, 9, 10]) == pytest.approx([0.002, 0.004, 0.006, 0.008, 0.03])
    assert decide.spending([3, 4]) == pytest.approx([0.02, 0.03]) and decide.spending([3]) == [0.05]
    assert decide.spending([3, 5, 7], "equal") == pytest.approx([0.05 / 3] * 3)
    assert [decide.parse_budget(t) for t in ("30m", "2h", "90s", "600", None)] == [1800, 7200, 90, 600, None]
    for bad in ("soon", "-5m", "0", "1e9999h"):
        with pytest.raises(InputError, match=f"^--budget {bad}: '{bad}' is not a time"):
            decide.parse_budget(bad, f"--budget {bad}")
    with pytest.raises(InputError, match="decide.max_seeds: a cap of 4 seeds is below the 5 the study starts with"):
        decide.schedule(5, 4)


def test_open_calls_are_the_undecided_ones():
    """No completed pairs is open too: it was never decided (a study whose runs all diverged is not done)."""
    assert set(decide.OPEN) == {stats.UNDECIDED, stats.SMALL, stats.TOO_FEW, stats.NONE}
    assert not {stats.HELPS, stats.HURTS, stats.NEGLIGIBLE} & set(decide.OPEN)


@pytest.mark.parametrize("args, fragment", [
    (["--max-seeds", "5"], "add --decide"),
    (["--budget", "10m"], "add --decide"),
    (["--decide", "--budget", "soon"], "--budget: 'soon' is not a time"),
    (["--decide", "--max-seeds", "2"], "--max-seeds: a cap of 2 seeds is below the 3 the study starts with"),
    (["--decide", "--time"], "--decide trains; --time times"),
])
def test_bad_decide_options_are_one_line(tmp_path, args, fragment):
    spec = write_spec(tmp_path, top={"seeds": 3, "flips": ["rope"], "directions": ["add-one"]})
    one_error_line(invoke("ablate", spec, "--runs-dir", tmp_path / "runs", *args), fragment)
    assert not (tmp_path / "runs").exists()  # refused before anything is written


def test_a_seed_list_is_refused_with_decide(tmp_path):
    spec = write_spec(tmp_path, top={"seeds": [1, 2, 3], "flips": ["rope"], "directions": ["add-one"]})
    one_error_line(invoke("ablate", spec, "--runs-dir", tmp_path / "runs", "--decide"), "seeds as a count")


@pytest.mark.slow  # trains a dozen toy runs
def test_decide_gives_seeds_only_to_open_effects_and_resumes_to_the_same_decisions(tmp_path):
    spec = write_spec(tmp_path, top={"seeds": 3, "flips": ["noop", "rope"], "directions": ["add-one"],
                                     "components": NOOP})
    args = ["ablate", spec, "--runs-dir", tmp_path / "runs", "--workers", "1", "--decide", "--max-seeds", "5",
            "--decide-step", "1", "--stack", "off"]
    result = invoke(*args)
    assert result.exit_code == 0, result.output
    root = tmp_path / "runs" / "toy"
    record = json.loads((root / records.DECIDE).read_text())
    assert record["looks"] == [3, 4, 5] and record["spending"] == pytest.approx(records.late_spending([3, 4, 5]))
    assert record["rounds"][0]["seeds"] == 3 and record["rounds"][0]["trained"] == 9
    assert "noop add-one" not in record["rounds"][0]["open"]  # exactly zero: negligible at its first look
    runs = load_runs(root)[0]
    seeds = runs.groupby("role")["seed"].nunique().to_dict()
    assert seeds["+noop"] == 3  # decided: no more seeds
    first = record["rounds"][0]
    rope_open = "rope add-one" in first["open"] and "rope add-one" not in first["futile"]
    assert seeds["+rope"] == seeds["reference"] == (3 + len(record["rounds"]) - 1)
    assert (len(record["rounds"]) > 1) == rope_open
    assert record["stopped"] in ("every effect decided", "the seed cap (5) reached with 1 effect open",
                                 "1 effect open, none of which 5 seeds would decide at the noise measured")
    # the report judges every family at the alpha of the latest look the study made
    effects = build_report(root).effects
    noop = effects[(effects["flip"] == "noop") & (effects["metric"] == "best_val_bpb")].iloc[0]
    now = record["spending"][len(record["rounds"]) - 1]
    assert noop["call"] == stats.NEGLIGIBLE and noop["adj_level"] == pytest.approx(1 - now / 2)
    assert "--decide:" in result.output and record["stopped"] in result.output
    # the same command again trains nothing and takes the same decisions (each look reads its own seeds)
    again = invoke(*args)
    assert again.exit_code == 0, again.output
    assert json.loads((root / records.DECIDE).read_text())["rounds"] == [
        r | {"seconds": r2["seconds"]} for r, r2 in zip(record["rounds"], json.loads(
            (root / records.DECIDE).read_text())["rounds"])]
    assert len(load_runs(root)[0]) == len(runs)
    # a new plan after seeing the data would spend alpha twice: refused
    other = invoke(*args[:-4], "--max-seeds", "8", "--stack", "off")
    one_error_line(other, "was decided with looks at 3, 4, 5 seeds")


@pytest.mark.slow  # trains six toy runs
def test_dry_run_on_earlier_runs_says_the_seeds_the_margin_needs(tmp_path):
    spec = write_spec(tmp_path, top={"seeds": 3, "flips": ["rope", "noop"], "directions": ["add-one"],
                                     "components": NOOP})
    for margin in (0.02, 5.0):  # a study's margin is fixed when it starts: one folder each
        base = ["ablate", spec, "--runs-dir", tmp_path / f"runs{margin}", "--workers", "1", "--stack", "off",
                "--margin", margin]
        assert invoke(*base, "--no-report").exit_code == 0
        effects = build_report(tmp_path / f"runs{margin}" / "toy").effects
        loss = effects[effects["metric"] == "best_val_bpb"]
        sd = float(np.median(loss["se"] * np.sqrt(loss["n_pairs"])))
        # the seeds at which twice the margin is called helps 80 % of the time (the margin itself: at most half)
        need = stats.seeds_for(sd, len(loss), 2 * margin, margin=margin)
        out = invoke(*base, "--dry-run").output
        line = " ".join(next(x for x in out.split("power: ")[1:]).split())
        assert f"the plan's {len(loss)} effects' median paired sd is {sd:.3f} bits/byte" in line
        if need is None:
            assert "needs more seeds than anatomy runs" in line
        elif need > 3:
            assert f"needs {need} seeds" in line and f"--seeds {need}" in line
        else:
            assert "twice the margin" in line and "included" in line
    assert "power:" not in invoke("ablate", spec, "--runs-dir", tmp_path / "other", "--dry-run").output


def _open(flip: str, call: str, n: int, gain: float, se: float) -> dict:
    return {"metric": "best_val_bpb", "flip": flip, "direction": "add-one", "group": "", "call": call,
            "n_pairs": n, "gain": gain, "se": se, "df": n - 1.0 if n > 1 else float("nan"),
            "adj_level": 1 - 0.025 / 10, "margin": 0.02}


def test_futile_effects_are_the_open_ones_the_cap_could_not_decide():
    import pandas as pd

    effects = pd.DataFrame([
        _open("wide", stats.UNDECIDED, 3, 0.1, 0.02),    # helps at 10 seeds, still open at 4
        _open("small", stats.SMALL, 3, 0.01, 0.006),     # negligible at 10 seeds only if the gain is a se smaller
        _open("few", stats.TOO_FEW, 2, 0.5, float("nan")),  # no interval yet: never futile
        _open("done", stats.HELPS, 3, 0.5, 0.01),        # decided: not open at all
        _open("hopeless", stats.UNDECIDED, 3, 0.0, 0.5),  # nothing within a se of 0 decides at 10 seeds
    ])
    assert decide.names(decide.futile(effects, 4)) == ["wide add-one", "small add-one", "hopeless add-one"]
    assert decide.names(decide.futile(effects, 10)) == ["hopeless add-one"]
    assert decide.futile(effects, 3).empty  # no seeds beyond the look: nothing to withhold
    # the configs of a futile effect get no seeds; an open one's still do
    runs = pd.DataFrame({"role": ["reference", "+wide", "+hopeless", "+few"], "run_id": ["r", "w", "h", "f"]})
    assert decide.open_runs([("", runs)], effects) == {"r", "w", "h", "f"}
    assert decide.open_runs([("", runs)], effects, cap=10) == {"r", "w", "f"}


def test_futility_is_judged_at_the_final_look_s_level():
    """Late spending gives an early look a small alpha: judged at its own level (0.002 over 10 effects) an
    effect the cap's level (0.03) would call looks hopeless, and the seeds that decide it are withheld."""
    import pandas as pd

    effect = _open("late", stats.UNDECIDED, 3, 0.07, 0.04) | {"adj_level": 1 - 0.002 / 10, "family": 10}
    effects = pd.DataFrame([effect])
    assert decide.names(decide.futile(effects, 10)) == ["late add-one"]  # at its own look's level: given up
    assert decide.futile(effects, 10, final_alpha=0.03).empty  # at the final look's: worth the seeds


def test_futility_counts_a_tuned_effect_s_allowance_which_seeds_do_not_shrink():
    """An effect whose interval the LR selection's allowance widens by 0.3 below cannot be called helps at any
    cap when its gain is 0.1: futile; without the allowance the same effect is worth the seeds."""
    import pandas as pd

    plain = _open("tuned", stats.UNDECIDED, 3, 0.1, 0.02) | {"family": 10}
    assert decide.futile(pd.DataFrame([plain]), 10, final_alpha=0.05).empty
    tuned = plain | {"allow_low": 0.3, "allow_high": 0.3}
    assert decide.names(decide.futile(pd.DataFrame([tuned]), 10, final_alpha=0.05)) == ["tuned add-one"]
    hurts = tuned | {"gain": -0.1}  # mirrored: the allowance above widens a hurting gain's side toward zero
    assert decide.names(decide.futile(pd.DataFrame([hurts | {"allow_low": 0.0}]), 10, 0.05)) == ["tuned add-one"]
    assert decide.futile(pd.DataFrame([hurts | {"allow_high": 0.0}]), 10, 0.05).empty


def test_the_stop_line_names_the_effects_given_up_on_once():
    a, b, c = "a add-one", "b add-one", "c add-one"
    rounds = [{"seeds": 3, "trained": 9, "seconds": 9.0, "open": [a, b, c], "futile": [a]},
              {"seeds": 4, "trained": 4, "seconds": 4.0, "open": [a, b], "futile": [a, b]},
              {"seeds": 5, "trained": 0, "seconds": 0.0, "open": [a, b], "futile": []}]
    record = records.DecideRecord(looks=[3, 4, 5], alpha=0.05 / 3, rounds=rounds,
                                 stopped="the seed cap (5) reached with 2 effects open")
    text = decide.stop_text(record)
    assert text.endswith("seeds withheld as futile (the cap would not decide them): a add-one at 3, b add-one at 4")
    assert "each look at family-wise alpha 0.01667 (0.05 split over the looks)" in text  # a file from before spending
    late = record.model_copy(update={"alpha": None, "spending": [0.01, 0.015, 0.025]})
    assert "family-wise alpha 0.01, 0.015, 0.025 at its looks (0.05 in all, spent late)" in decide.stop_text(late)


def test_seeds_for_is_the_first_count_whose_mde_reaches_the_effect():
    """seeds_for: the first n whose call_mde (the power of the call, margin included, each effect's own
    variance on n - 1 df) reaches the effect."""
    from scipy import stats as sps

    def mde(k, margin=0.0):
        return stats.call_mde(0.05 / np.sqrt(k), k - 1, float(sps.t.ppf(1 - 0.0025, k - 1)), margin)

    n = stats.seeds_for(0.05, 10, 0.05)
    assert n > 3 and mde(n - 1) > 0.05 >= mde(n)
    n = stats.seeds_for(0.05, 10, 0.05, margin=0.02)
    assert mde(n - 1, 0.02) > 0.05 >= mde(n, 0.02)
    assert stats.seeds_for(0.05, 10, 0.0) is None and stats.seeds_for(1.0, 10, 1e-6, most=50) is None
    assert stats.seeds_for(0.05, 10, 0.02, margin=0.02) is None  # a gain at the margin: half the time at most
    # a tuned study's allowance does not shrink with seeds: an effect within it is out of any seed count's reach
    assert stats.seeds_for(0.05, 10, 0.04, margin=0.02, allow=0.3) is None
    wide = stats.seeds_for(0.05, 10, 0.1, margin=0.02, allow=0.05)
    assert wide > stats.seeds_for(0.05, 10, 0.1, margin=0.02)


def test_the_printed_mde_is_the_power_of_the_call():
    """A true effect of the printed mde is called helps 80 % of the time (simulated: the gain and the
    variance estimate drawn as a normal sample's), at own-variance and pooled df, with and without a margin;
    the interval's power formula, (t_crit + t_0.8) x se, is called less often once the margin counts."""
    from scipy import stats as sps

    rng = np.random.default_rng(0)
    for df, margin in ((2.0, 0.02), (2.0, 0.0), (12.0, 0.02), (12.0, 0.05)):
        se = 0.04 / np.sqrt(3)
        crit = float(sps.t.ppf(1 - 0.05 / 20, df))
        mde = stats.call_mde(se, df, crit, margin)
        gain, se_hat = rng.normal(mde, se, 100_000), se * np.sqrt(rng.chisquare(df, 100_000) / df)
        called = (gain - crit * se_hat > 0) & (gain > margin)
        assert called.mean() == pytest.approx(0.8, abs=0.006)
        assert stats.call_power(mde, se, df, crit, margin) == pytest.approx(0.8, abs=1e-6)
    assert stats.call_power(0.02, 0.001, 2.0, 1.0, 0.02) == pytest.approx(0.5, abs=0.01)  # at the margin: half


def test_a_specs_decide_table_plans_the_rounds_and_options_override_it(tmp_path):
    spec = write_spec(tmp_path, top={"seeds": 3, "flips": ["rope"], "directions": ["add-one"],
                                     "decide": {"max_seeds": 4, "step": 1}})
    out = invoke("ablate", spec, "--runs-dir", tmp_path / "runs", "--dry-run")
    assert out.exit_code == 0, out.output
    assert ("--decide: looks at 3, 4 seeds, family-wise alpha 0.02, 0.03 at its looks (0.05 in all, spent late)"
            in " ".join(out.output.split()))
    out = invoke("ablate", spec, "--runs-dir", tmp_path / "runs", "--dry-run", "--max-seeds", "7", "--decide-step", "2")
    assert "--decide: looks at 3, 5, 7 seeds" in " ".join(out.output.split())
    bad = write_spec(tmp_path, name="bad", top={"seeds": 3, "flips": ["rope"], "decide": {"budget": "soon"}})
    one_error_line(invoke("ablate", bad, "--runs-dir", tmp_path / "runs", "--dry-run"), "decide.budget")


@pytest.mark.slow  # trains nine toy runs
def test_a_resumed_decide_prices_its_next_round_from_the_calibrated_step_times(tmp_path, monkeypatch):
    """The first round found done (a resumed study) took no time; the next round's cost must still be
    estimated (this machine's step times), so a budget it cannot meet stops the study before it trains.
    Toy rope is futile at any cap (its gain is noise), so futility is switched off here: this is about price."""
    monkeypatch.setattr(decide, "futile", lambda effects, cap, final_alpha=None: effects.iloc[0:0])
    spec = write_spec(tmp_path, top={"seeds": 3, "flips": ["rope"], "directions": ["add-one"]})
    base = ["ablate", spec, "--runs-dir", tmp_path / "runs", "--workers", "1", "--stack", "off"]
    assert invoke(*base, "--no-report").exit_code == 0
    result = invoke(*base, "--decide", "--max-seeds", "10", "--decide-step", "1", "--budget", "1s", "--no-report")
    assert result.exit_code == 0, result.output
    record = json.loads((tmp_path / "runs" / "toy" / records.DECIDE).read_text())
    first = record["rounds"][0]
    assert first["trained"] == 6 and first["open"] == ["rope add-one"] and first["futile"] == []
    assert record["stopped"] == "the budget (1s) would be overrun by the next round"
    assert load_runs(tmp_path / "runs" / "toy")[0]["seed"].nunique() == 3  # nothing trained past the plan

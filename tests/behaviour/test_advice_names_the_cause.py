"""Advice that names the real cause (issue #30, class 5), on hand-written run folders (no training).

A study with three seeds whose sizes share one parameter count, or whose size has no completed runs,
is not short of seeds; a size whose runs all diverged is not fixed by the seeds it already has; a
study still running is not to be topped up with seeds; a ladder that cannot form a trend is said so
by scale-plan before anything trains. Each test builds the situation and checks the words: the cause
named, the wrong one ("too few seeds", an `--seeds` command that trains nothing, "add seeds" while a
sweep runs) absent.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from report_runs import make_run

from anatomy_cli.report import results_blocks, results_build, results_file, sections, write
from anatomy_cli.report.build import build_report
from anatomy_cli.spec import components as comp
from anatomy_cli.store import lockfile
from tests.report.test_scale import BUILT, REF_OFFSET, model

# figures.py warns about an empty legend on a panel whose size has no points (not this issue's)
pytestmark = pytest.mark.filterwarnings("ignore:No artists with labels:UserWarning")

FLIPS = ("rope", "swiglu")
SEEDS = (1, 2, 3)


def run(root: Path, name: str, flips, size_model: dict, seed: int, best: float, status: str = "completed",
        lr: float = 1e-3, warmup: int = 2) -> None:
    """A run of 20 steps as train.py leaves it; a diverged one stops at step 7, a failed one at step 5."""
    folder = root / name
    folder.mkdir(parents=True)
    config = {"name": name, "seed": seed, "model": model(flips, 2) | size_model,
              "train": {"steps": 20, "batch_size": 4, "lr": lr, "warmup": warmup}, "data": {"source": None}}
    (folder / "config.json").write_text(json.dumps(config))
    done = status == "completed"
    steps = (0, 5, 10, 20) if done else (0, 5)
    metrics = [{"step": s, "train_loss": 3.0, "val_loss": best + (0 if s == steps[-1] else 0.1), "tokens": 256 * s}
               for s in steps]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))
    (folder / "summary.json").write_text(json.dumps({
        "status": status, "best_val_loss": best if done else None, "best_val_bpb": best if done else None,
        "best_step": steps[-1],
        "final_val_loss": best if done else None, "params": 1, "wall_s": 1.0,
        "diverged_at": 7 if status == "diverged" else None}))


def study(root: Path, sizes: dict[str, dict], status=lambda size, seed: "completed") -> Path:
    """The 2017 end and +rope, +swiglu at every size over three seeds; sweep.json names the sizes."""
    for i, (size, size_model) in enumerate(sizes.items()):
        for k, seed in enumerate(SEEDS):
            ref = 2.5 + REF_OFFSET[k]
            run(root, f"{size}_2017-s{seed}", (), size_model, seed, ref, status(size, seed))
            for flip in FLIPS:
                gain = BUILT[flip][0][min(i, 2)][k]
                run(root, f"{size}_2017+{flip}-s{seed}", (flip,), size_model, seed, ref - gain, status(size, seed))
    ladder = [{"name": n, "settings": {f"model.{k}": v for k, v in m.items()}, "budget": "same-steps"}
              for n, m in sizes.items()]
    (root / "sweep.json").write_text(json.dumps({"components": [comp.record(comp.BY_NAME[n]) for n in comp.FIVE],
                                                 "sizes": ladder}))
    return root


def report(root: Path) -> tuple[dict, str, str, str]:
    """(trend calls by flip, the report's Verdict and scale sections as markdown, the README's scale block,
    the terminal verdict)."""
    r = build_report(root)
    across = r.scale
    md = write.write_report(r, formats=("md",))["report.md"].read_text()
    doc = results_file.load(results_build.write_results(root.parent / "results" / f"{root.name}.json", r))
    text = sections.verdict_text(r, None)
    return (dict(zip(across.trends["flip"], across.trends["call"])), md[:md.index("## Curves")],
            results_blocks.render(doc, "scale"), text)


def call_lines(text: str) -> str:
    """The lines a call across sizes sits on: the verdict's lines across sizes (markdown or terminal) and
    the trend table's rows (the verdict table's per-size calls follow stats.py's rule, not these: its rows name
    their size, 'rope [size M]')."""
    pattern = r"- \*\*(rope|swiglu)\*\*|\| (rope|swiglu) +\| |(rope|swiglu): "
    return "\n".join(line for line in text.splitlines() if re.match(pattern, line))


def no_seed_command(text: str) -> None:
    assert "--seeds" not in text and "To add seeds" not in text and "Fewer than 3 seeds" not in text


# ---------------------------------------------------------------------------- calls across sizes


@pytest.mark.slow  # writes whole reports with figures: seconds each
def test_sizes_sharing_one_parameter_count_are_named_not_too_few_seeds(tmp_path):
    """S and M differ in ctx_len only: the position table, which non-embedding parameters leave out."""
    root = study(tmp_path / "study", {"S": {"ctx_len": 64}, "M": {"ctx_len": 128}})
    calls, md, block, text = report(root)
    assert set(calls.values()) == {"one parameter count: no trend"}
    for said in (call_lines(md), block, call_lines(text)):
        assert "one parameter count: no trend" in said and "too few seeds" not in said
    assert "share one non-embedding parameter count" in md  # the scale section says which sizes, and the fix


def test_a_size_without_completed_runs_is_named_not_too_few_seeds(tmp_path):
    root = study(tmp_path / "study", {"S": {"n_layer": 1}, "M": {"n_layer": 2}},
                 status=lambda size, seed: "failed" if size == "M" else "completed")
    calls, md, block, text = report(root)
    assert set(calls.values()) == {"size M has no completed runs"}
    for said in (call_lines(md), block, call_lines(text)):
        assert "size M has no completed runs" in said and "too few seeds" not in said
    assert "Fewer than 3 seeds" not in md and "9 runs did not finish (9 failed)" in md  # retrained by the command


@pytest.mark.slow  # writes whole reports with figures: seconds each
def test_a_size_whose_runs_all_diverged_asks_for_no_seeds_it_has(tmp_path):
    root = study(tmp_path / "study", {"S": {"n_layer": 1}, "M": {"n_layer": 2}},
                 status=lambda size, seed: "diverged" if size == "M" else "completed")
    calls, md, block, text = report(root)
    assert set(calls.values()) == {"size M diverged: no trend"}
    for said in (call_lines(md), block, call_lines(text)):
        assert "size M diverged: no trend" in said and "too few seeds" not in said
    for said in (md, text):
        no_seed_command(said)  # every seed exists: --seeds 3 would train nothing
        assert "diverged" in said and "lower train.lr" in said
    assert "9 runs diverged at size M (at step 7 of 20; lr 0.001, warmup 2)" in md


@pytest.mark.slow  # writes whole reports with figures: seconds each
def test_a_size_where_some_seeds_diverged_is_not_short_of_seeds(tmp_path):
    root = study(tmp_path / "study", {"S": {"n_layer": 1}, "M": {"n_layer": 2}, "L": {"n_layer": 4}},
                 status=lambda size, seed: "diverged" if (size, seed) == ("L", 3) else "completed")
    calls, md, block, text = report(root)
    assert set(calls.values()) == {"2 seeds with every size: runs diverged at L"}
    for said in (call_lines(md), block, call_lines(text)):
        assert "too few seeds" not in said
    no_seed_command(md)
    no_seed_command(text)


# ---------------------------------------------------------------------------- a study still running


def test_a_study_still_running_says_so_instead_of_add_seeds(tmp_path):
    """Seed 3's runs train now (a live owner in their summaries): the verdict has two seeds for now."""
    for seed in SEEDS:
        make_run(tmp_path, f"base-s{seed}", seed=seed, best=2.0 + 0.01 * seed,
                 status="running" if seed == 3 else "completed")
        make_run(tmp_path, f"rope-s{seed}", flips=("rope",), seed=seed, best=1.8 + 0.01 * seed,
                 status="running" if seed == 3 else "completed")
    for folder in (tmp_path / "base-s3", tmp_path / "rope-s3"):
        summary = json.loads((folder / "summary.json").read_text())
        (folder / "summary.json").write_text(json.dumps(summary | {"owner": lockfile.identity()}))
    top, text = verdict_and_text(tmp_path)
    for said in (top, text):
        no_seed_command(said)
        assert "still running" in said and "2 runs running" in said


def test_a_live_sweep_lock_says_still_running_instead_of_add_seeds(tmp_path):
    """The sweep's lock names a live process (this test's parent); seed 3 has not started yet."""
    for seed in (1, 2):
        make_run(tmp_path, f"base-s{seed}", seed=seed, best=2.0 + 0.01 * seed)
        make_run(tmp_path, f"rope-s{seed}", flips=("rope",), seed=seed, best=1.8 + 0.01 * seed)
    (tmp_path / lockfile.LOCK).write_text(json.dumps(lockfile.identity(os.getppid())))
    top, text = verdict_and_text(tmp_path)
    for said in (top, text):
        no_seed_command(said)
        assert "still running" in said and f"pid {os.getppid()}" in said


def verdict_and_text(root: Path) -> tuple[str, str]:
    r = build_report(root)
    md = write.write_report(r, formats=("md",))["report.md"].read_text()
    text = sections.verdict_text(r, None)
    return md[md.index("## Verdict"):md.index("## Curves")], text


# ---------------------------------------------------------------------------- scale-plan


@pytest.mark.parametrize("sizes, extra, warning", [
    ({"S": {"ctx_len": 16}, "M": {"ctx_len": 32}}, "",
     "no trend across sizes: every size has 24.8k non-embedding parameters (S, M)"),
    ({"S": {"d_model": 16, "n_head": 2}}, "", "no trend across sizes: one size (S)"),
    ({"S": {"d_model": 16, "n_head": 2}, "M": {"d_model": 32}}, 'budget = "tokens-per-param"\ntokens_per_param = 0.001',
     "no trend across sizes: no size trains (its budget rounds up from under one step to 1)"),
], ids=["one parameter count", "one size", "zero steps"])
def test_scale_plan_warns_when_a_ladder_cannot_form_a_trend(tmp_path, sizes, extra, warning):
    from tests.sweep.test_ladder import invoke, sized_spec

    spec = sized_spec(tmp_path, sizes, top={"seeds": 3}, extra=extra)
    result = invoke("scale-plan", spec, "--no-estimate")
    assert result.exit_code == 0, result.output
    assert f"warning: {warning}" in result.output
    doc = json.loads(invoke("scale-plan", spec, "--no-estimate", "--json").output)
    assert [w for w in doc["warnings"] if w.startswith(warning)] == doc["warnings"] != []  # with its fix after


def test_scale_plan_names_a_size_that_repeats_anothers_count_or_trains_no_step(tmp_path):
    from tests.sweep.test_ladder import invoke, sized_spec

    ladder = {"S": {"d_model": 16, "n_head": 2}, "M": {"ctx_len": 32}, "M2": {"ctx_len": 64}, "L": {"n_layer": 4}}
    doc = json.loads(invoke("scale-plan", sized_spec(tmp_path, ladder, top={"seeds": 3}), "--no-estimate",
                            "--json").output)
    rows = {r["size"]: r for r in doc["sizes"]}
    assert [rows[n]["warnings"] for n in ("S", "M", "L")] == [[], [], []] and doc["warnings"] == []
    assert rows["M2"]["warnings"] == ["same parameters as M: 24.8k non-embedding (no trend between them)"]
    (tmp_path / "b").mkdir()
    spec = sized_spec(tmp_path / "b", {"S": {"d_model": 16, "n_head": 2}, "L": {"n_layer": 8}}, top={"seeds": 3},
                      extra='budget = "tokens-per-param"\ntokens_per_param = 0.005')
    result = invoke("scale-plan", spec, "--no-estimate")
    assert result.exit_code == 0 and "S: 0 steps: the budget gives 0.49 steps" in result.output
    doc = json.loads(invoke("scale-plan", spec, "--no-estimate", "--json").output)
    rows = {r["size"]: r for r in doc["sizes"]}
    assert rows["S"]["steps"] == 1 and rows["S"]["warnings"][0].startswith("0 steps: the budget gives 0.49 steps")
    assert rows["L"]["steps"] == 8 and rows["L"]["warnings"] == []
    assert doc["warnings"] == ["no trend across sizes: only L trains (the other sizes' budgets round up from under "
                               "one step to 1); raise tokens_per_param"]

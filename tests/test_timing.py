"""The paired timing pass on a toy plan (one spawned worker, a few steps; torch in the worker)."""

from __future__ import annotations

import pytest
from toy_data import write_spec

from anatomy_cli import timing
from anatomy_cli.sweep import expand, load_spec


@pytest.mark.slow
def test_time_plan_times_every_config_in_rounds(tmp_path):
    spec = load_spec(write_spec(tmp_path, top={"flips": ["rope", "swiglu", "rmsnorm", "prenorm", "gqa"],
                                               "seeds": 2, "gqa_kv_head": 2}))
    plan = expand(spec, ["rope"])
    assert len(plan) == 8  # 4 configs x 2 seeds: timed once per config, not per seed
    rounds = []
    record = timing.time_plan(plan, steps=2, rounds=2, warmup=1, on_round=lambda r, n: rounds.append((r, n)))
    assert rounds == [(1, 2), (2, 2)]
    slugs = [c["slug"] for c in record["configs"]]
    assert sorted(slugs) == ["2017", "2017+rope", "llama", "llama-rope"]
    assert all(set(r) == set(slugs) and min(r.values()) > 0 for r in record["rounds_data"])
    rows = timing.timing_effects(record)
    assert {(r["flip"], r["direction"], r["n_pairs"]) for r in rows} == {("rope", "add-one", 2), ("rope", "remove-one", 2)}
    path = timing.write_timing(tmp_path / "sweep", record)
    assert timing.read_timing(path.parent) == record

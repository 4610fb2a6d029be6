"""report/results_bpb.py: a results file written in nats per character, in bits per byte: every loss number times
its study's one constant, counted again from its spec and corpus; its calls judged again at today's margin by
`anatomy rejudge`; the same numbers as a report of the study's runs gives today."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
from helpers import invoke
from report_runs import called_sweep

from anatomy_cli.report import results_bpb, stats
from anatomy_cli.report.build import build_report
from anatomy_cli.report.results_build import build
from anatomy_cli.report.results_file import unit_of

ROOT = Path(__file__).resolve().parents[2]


def in_nats(doc: dict) -> dict:
    """A results document as files were written before bits per byte (no unit, no per_byte, the nats metric)."""
    old = {k: v for k, v in doc.items() if k not in ("unit", "per_byte")}
    old["effects"] = [e | ({"metric": "best_val_loss"} if e["metric"] == "best_val_bpb" else {})
                      for e in doc["effects"]]
    return old


def test_every_loss_number_is_scaled_by_the_windows_constant_and_the_calls_kept_at_the_margin(tmp_path):
    called_sweep(tmp_path / "s")
    doc = build(build_report(tmp_path / "s"))
    assert doc["unit"] == "bits/byte" and unit_of(in_nats(doc)) == "nats/char"
    counts = (1000, 1445)  # 1.445 bytes a token, as the embedded corpus's characters
    k = counts[0] / (math.log(2) * counts[1])
    new = results_bpb.in_bits_per_byte(in_nats(doc), counts)
    assert new["unit"] == "bits/byte" and list(new)[:4] == ["format", "version", "study", "unit"]
    assert new["per_byte"] == {"val_tokens": 1000, "val_bytes": 1445}
    for old, e in zip(doc["effects"], new["effects"]):
        assert e["metric"] == old["metric"]  # back to best_val_bpb, speed left alone
        if e["metric"] != "best_val_bpb":
            assert e == old
            continue
        for key in ("gain", "adj_low", "adj_high", "raw_low", "raw_high", "mde", "noise"):
            if old[key] is not None:
                assert e[key] == pytest.approx(old[key] * k, abs=1e-6), key
        assert e["threshold"] == stats.DEFAULT_MARGIN
    assert new["ends"]["reference"]["mean"] == pytest.approx(doc["ends"]["reference"]["mean"] * k, abs=1e-6)
    assert not results_bpb.in_nats(new)


def test_rejudge_converts_a_file_in_nats_from_its_spec_and_a_file_in_bits_is_left(tmp_path):
    """The shipped demo's file as it was written (in nats): converted with the demo's windows, each call kept."""
    (tmp_path / "experiments" / "results").mkdir(parents=True)
    shutil.copy(ROOT / "experiments" / "demo.toml", tmp_path / "experiments" / "demo.toml")
    today = json.loads((ROOT / "experiments" / "results" / "demo.json").read_text())
    path = tmp_path / "experiments" / "results" / "demo.json"
    k = today["per_byte"]["val_tokens"] / (math.log(2) * today["per_byte"]["val_bytes"])
    old = in_nats(today)
    old["effects"] = [e | ({k2: e[k2] / k for k2 in ("gain", "raw_low", "raw_high") if e[k2] is not None}
                           if e["metric"] == "best_val_loss" else {}) for e in old["effects"]]
    path.write_text(json.dumps(old, indent=1))
    done = invoke("rejudge", path)
    assert done.exit_code == 0 and "no call changes" in done.stdout, done.output
    new = json.loads(path.read_text())
    assert new["per_byte"] == today["per_byte"] and new["unit"] == "bits/byte"
    assert [e["call"] for e in new["effects"]] == [e["call"] for e in today["effects"]]
    assert [e["gain"] for e in new["effects"]] == pytest.approx([e["gain"] for e in today["effects"]], abs=2e-6)
    again = path.read_text()
    assert invoke("rejudge", path, "--check").exit_code == 0 and path.read_text() == again  # bits: not converted again


def test_a_file_in_nats_without_its_spec_is_refused_in_one_line(tmp_path):
    from helpers import one_error_line

    (tmp_path / "experiments" / "results").mkdir(parents=True)
    doc = in_nats(json.loads((ROOT / "experiments" / "results" / "demo.json").read_text()))
    path = tmp_path / "experiments" / "results" / "demo.json"
    path.write_text(json.dumps(doc))
    one_error_line(invoke("rejudge", path), "its study's spec")
    assert json.loads(path.read_text()) == doc

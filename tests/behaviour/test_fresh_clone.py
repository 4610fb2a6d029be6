"""The acceptance path of tokens (#45), through the CLI as a fresh clone runs it: prepare a text with
`--tokenizer bpe:512` into a folder, ablate a spec whose data is that folder, then report, sample, eval and
`export --to hf`; the verdict is in bits per byte. Toy sizes, real tokenizer, real training."""

from __future__ import annotations

import json

import pytest
from helpers import invoke
from toy_data import write_spec

from anatomy_cli.data.corpus import default_corpus_path

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("single_thread")]


def test_prepare_ablate_report_sample_eval_export_on_a_bpe_folder(tmp_path):
    text = tmp_path / "text.md"  # English and Chinese: characters are not bytes
    text.write_text(default_corpus_path().read_text(encoding="utf-8")[:20000], encoding="utf-8")
    data = tmp_path / "D"
    prepared = invoke("prepare", text, "--tokenizer", "bpe:512", "--out", data, "--ctx-len", 16, "--json")
    assert prepared.exit_code == 0, prepared.output
    assert json.loads(prepared.stdout)["vocab_size"] == 512 and (data / "tokenizer.json").is_file()

    spec = write_spec(tmp_path, name="fresh", corpus=data, top={"flips": ["rope"], "seeds": 3},
                      train={"sample_len": 0})
    spec.write_text(spec.read_text() + 'tokenizer = "bpe:512"\n')  # under [base.data]: the folder's tokenizer
    runs_dir = tmp_path / "runs"
    ablated = invoke("ablate", spec, "--workers", 1, "--runs-dir", runs_dir, "--no-report")
    assert ablated.exit_code == 0, ablated.output
    sweep = runs_dir / "fresh"

    results = tmp_path / "fresh.json"
    reported = invoke("report", sweep, "--json", "--results", results)
    assert reported.exit_code == 0, reported.output
    doc = json.loads(results.read_text())
    assert doc["unit"] == "bits/byte" and doc["per_byte"]["val_bytes"] > doc["per_byte"]["val_tokens"]
    loss = [e for e in doc["effects"] if e["flip"] == "rope" and e["metric"] != "tokens_per_s"]  # speed aside
    assert len(loss) == 2 and {e["metric"] for e in loss} == {"best_val_bpb"}  # added and removed: in bits/byte
    assert all(e["call"] in ("helps", "hurts", "negligible", "below margin", "undecided") for e in loss)

    llama = next(d for d in sweep.iterdir() if d.name.startswith("llama-s1337"))
    summary = json.loads((llama / "summary.json").read_text())
    assert summary["best_val_bpb"] > 0 and summary["val_bytes"] > summary["val_tokens"]
    sampled = invoke("sample", llama, "--prefix", "The model", "--max-new", 24, "--temp", 0)
    assert sampled.exit_code == 0, sampled.output
    assert sampled.stdout.startswith("The model") and "\ufffd" not in sampled.stdout
    evaluated = invoke("eval", llama, "--ctx", 16)
    assert evaluated.exit_code == 0, evaluated.output
    out = tmp_path / "hf"
    exported = invoke("export", llama, "--to", "hf", out)
    assert exported.exit_code == 0, exported.output
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in out.iterdir()}

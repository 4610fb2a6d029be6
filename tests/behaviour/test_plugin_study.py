"""Acceptance of issue 46, through the CLI (CliRunner) at toy size: a user writes a part in a file outside
anatomy, checks it, ablates it against the LLaMA end from a spec's `plugins`, and reads its effect in
the report, without touching anatomy's source. Then editing the file moves the ids of the runs that use
the part and no other, an interrupted run cannot resume with the edited file (one line), and the run
keeps the code it trained with (parts.json, the summary's `parts`). Spawned workers and stacked seeds
train the part from the code shipped with their jobs (the Dask executor: tests/sweep/test_dask_exec.py).
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from helpers import LLAMA, fake_calibration, invoke, one_error_line
from toy_data import write_spec

from anatomy_cli.spec import parts as registry
from anatomy_cli.store import runs

PART = textwrap.dedent('''
    """My own FFN: squared ReLU (So et al. 2021), written outside anatomy."""
    import torch.nn.functional as F
    from torch import nn
    from anatomy_cli.model.parts import Options, part


    class Opts(Options):
        hidden: int = 48


    @part("myrelu", slot="ffn", options=Opts, params=lambda cfg, o: 2 * cfg.d_model * o.hidden,
          about="squared ReLU FFN", source="So et al. 2021")
    class MyRelu(nn.Module):
        def __init__(self, cfg, opts):
            super().__init__()
            self.up = nn.Linear(cfg.d_model, opts.hidden, bias=False)
            self.down = nn.Linear(opts.hidden, cfg.d_model, bias=False)

        def forward(self, x, stats=None):
            return self.down(F.relu(self.up(x)).square())
    ''')
CAL = {"step_s": 0.01, "eval_s": 0.01, "run_s": 0.1, "startup_s": 0.1, "when": "2024-01-01 00:00:00"}


@pytest.fixture
def study(tmp_path, monkeypatch):
    """A plugin file in a folder of its own, and a spec beside the corpus naming it relative to the spec:
    the LLaMA end at toy size with the part added alone, 2 seeds, 6 steps."""
    fake_calibration(tmp_path, monkeypatch, CAL)
    (tmp_path / "mine").mkdir()
    plugin = tmp_path / "mine" / "my_parts.py"
    plugin.write_text(PART, encoding="utf-8")
    spec = write_spec(tmp_path, name="mine", top={"flips": ["myrelu"], "directions": ["add-one"], "seeds": 2},
                      model=LLAMA, train={"steps": 6, "eval_interval": 3, "sample_len": 0, "threads": 1})
    spec.write_text(spec.read_text().replace("[base.model]", '[base]\nplugins = ["mine/my_parts.py"]\n[base.model]'),
                    encoding="utf-8")
    return spec, plugin, tmp_path / "runs"


def planned(spec: Path, runs_dir: Path) -> dict[str, str]:
    result = invoke("ablate", spec, "--dry-run", "--json", "--runs-dir", runs_dir)
    assert result.exit_code == 0, result.output
    return {r["run_id"].rsplit("-", 1)[0]: r["run_id"] for r in json.loads(result.stdout)["runs"]}


def forget_plugins() -> None:
    """What a new `anatomy` process starts from: no plugin part registered."""
    for name in [n for n, p in registry.REGISTRY.items() if p.plugin]:
        del registry.REGISTRY[name]
    registry.LOADED.clear()


def test_a_part_of_one_s_own_is_checked_ablated_and_reported_without_touching_anatomy(study):
    spec, plugin, runs_dir = study
    checked = invoke("components", "check", plugin)
    assert checked.exit_code == 0 and "myrelu: passes every check at 2017 and llama" in checked.stdout
    forget_plugins()
    done = invoke("ablate", spec, "--runs-dir", runs_dir, "--workers", "1")
    assert done.exit_code == 0, done.output
    sweep = runs_dir / "mine"
    effects = [row for row in (sweep / "report" / "effects.csv").read_text().splitlines()
               if row.startswith("best_val_bpb,myrelu,add-one")]
    assert len(effects) == 1 and effects[0].split(",")[5] == "2"  # paired over both seeds
    variant = next(d for d in sweep.iterdir() if d.name.startswith("reference+myrelu-s1337"))
    summary = runs.read_summary(variant)
    sha = registry.sha256_text(PART)
    assert summary["parts"] == {"myrelu": {"slot": "ffn", "origin": str(plugin.resolve()), "sha256": sha,
                                           "options": {"hidden": 48}}}
    assert "rmsnorm+prenorm+rope+gqa+myrelu" == summary["label"]
    record = json.loads((variant / runs.PARTS).read_text())
    assert record["myrelu"]["text"] == PART and record["myrelu"]["sha256"] == sha
    config = json.loads((variant / runs.CONFIG).read_text())
    assert config["model"]["part_code"] == {"myrelu": sha} and config["plugins"] == [str(plugin.resolve())]
    reference = next(d for d in sweep.iterdir() if d.name.startswith("reference-s1337"))
    assert not (reference / runs.PARTS).exists() and "parts" not in runs.read_summary(reference)
    forget_plugins()  # a later `anatomy report` reads the part's formulas from the file the runs recorded
    report = invoke("report", sweep, "--format", "csv")
    assert report.exit_code == 0, report.output
    assert "myrelu" in report.stdout


def test_editing_the_plugin_moves_only_the_ids_of_the_runs_that_use_it(study):
    spec, plugin, runs_dir = study
    before = planned(spec, runs_dir)
    plugin.write_text(PART.replace("hidden: int = 48", "hidden: int = 40"), encoding="utf-8")
    after = planned(spec, runs_dir)
    assert set(before) == set(after) == {"reference-s1337", "reference-s1338", "reference+myrelu-s1337",
                                         "reference+myrelu-s1338"}
    for slug in before:
        assert (before[slug] == after[slug]) is slug.startswith("reference-"), slug
    plugin.write_text(PART + "\n# a comment only: other code all the same\n", encoding="utf-8")
    assert planned(spec, runs_dir)["reference+myrelu-s1337"] not in (before["reference+myrelu-s1337"],
                                                                       after["reference+myrelu-s1337"])


def test_an_interrupted_run_does_not_resume_with_an_edited_plugin(study, tmp_path):
    from anatomy_cli.spec.config import load_run_config
    from anatomy_cli.training.run import resume, train

    spec, plugin, _ = study
    run_spec = tmp_path / "run.toml"
    corpus = json.loads(json.dumps(str(tmp_path / "tiny.txt")))
    run_spec.write_text(f'plugins = ["mine/my_parts.py"]\n[model]\nffn_type = "myrelu"\nd_model = 32\nn_head = 4\n'
                        f'ctx_len = 16\n[train]\nsteps = 6\nbatch_size = 4\neval_interval = 3\neval_batches = 2\n'
                        f'sample_len = 0\nwarmup = 2\n[data]\nsource = "{corpus}"\n', encoding="utf-8")
    run_dir = tmp_path / "run"
    summary = train(load_run_config(run_spec), run_dir, stop=lambda: True)  # stopped at its first step
    assert summary["status"] == runs.INTERRUPTED
    plugin.write_text(PART.replace("F.relu(self.up(x)).square()", "F.relu(self.up(x))"), encoding="utf-8")
    forget_plugins()
    line = one_error_line(invoke("train", "--resume", run_dir),
                          f"{run_dir}: {plugin.resolve()} changed since the run started (sha256 "
                          f"{registry.sha256_text(PART)[:12]}... is now")
    assert "resuming would train other code" in line
    with pytest.raises(runs.RunError, match="changed since the run started"):  # the library refuses it too
        resume(run_dir)  # (a sweep's worker resumes through it)
    assert runs.run_status(run_dir) == runs.INTERRUPTED  # left as it was
    plugin.write_text(PART, encoding="utf-8")  # the file restored: the run goes on
    forget_plugins()
    resumed = invoke("train", "--resume", run_dir)
    assert resumed.exit_code == 0, resumed.output
    assert runs.run_status(run_dir) == runs.COMPLETED


@pytest.mark.slow
@pytest.mark.process
def test_spawned_workers_and_stacked_seeds_train_the_part_from_its_shipped_code(study):
    spec, _, runs_dir = study
    forget_plugins()
    spawned = invoke("ablate", spec, "--runs-dir", runs_dir / "spawned", "--workers", "2", "--no-report")
    assert spawned.exit_code == 0, spawned.output
    stacked = invoke("ablate", spec, "--runs-dir", runs_dir / "stacked", "--workers", "1", "--stack", "2",
                     "--no-report")
    assert stacked.exit_code == 0, stacked.output
    for mode in ("spawned", "stacked"):
        done = [runs.read_summary(d) for d in (runs_dir / mode / "mine").iterdir() if runs.holds_run(d)]
        assert len(done) == 4 and all(s["status"] == runs.COMPLETED for s in done), done
    stacks = [runs.read_summary(d).get("stacked") for d in (runs_dir / "stacked" / "mine").iterdir()
              if runs.holds_run(d)]
    assert stacks == [2, 2, 2, 2]  # the part vmaps: its seeds trained as one stacked model


def test_plugin_on_the_command_line_joins_the_spec_s_plugins_and_plans_the_same_runs(study, tmp_path, monkeypatch):
    """--plugin FILE (against the working folder, not the spec's) is the spec's base.plugins given on the
    command line: the same runs, the same ids; the study records it as typed."""
    spec, plugin, runs_dir = study
    with_key = planned(spec, runs_dir)
    spec.write_text(spec.read_text().replace('plugins = ["mine/my_parts.py"]\n', ""), encoding="utf-8")
    forget_plugins()
    refused = invoke("ablate", spec, "--dry-run", "--runs-dir", runs_dir)
    assert refused.exit_code != 0 and "myrelu" in refused.output  # without the file the part is unknown
    monkeypatch.chdir(plugin.parent)
    forget_plugins()
    given = invoke("ablate", spec, "--plugin", "my_parts.py", "--dry-run", "--json", "--runs-dir", runs_dir)
    assert given.exit_code == 0, given.output
    assert {r["run_id"].rsplit("-", 1)[0]: r["run_id"] for r in json.loads(given.stdout)["runs"]} == with_key


def test_a_study_of_a_part_that_sees_the_future_is_refused_before_it_trains(study):
    """The battery's shape and causality checks run before a study trains a plugin part: a part that
    mixes in later positions is one line naming it and the check, and nothing is written."""
    spec, plugin, runs_dir = study
    plugin.write_text(PART.replace("return self.down(F.relu(self.up(x)).square())",
                                   "return self.down(F.relu(self.up(x)).square()) + x.flip(1)"), encoding="utf-8")
    forget_plugins()
    line = one_error_line(invoke("ablate", spec, "--runs-dir", runs_dir, "--workers", "1"), "myrelu (ffn, from ")
    assert "fails the causal check" in line and "anatomy components check" in line
    assert not runs_dir.exists() or not any(runs_dir.rglob("summary.json"))

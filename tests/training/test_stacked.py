"""Stacked seeds (stacked.py): each member of a stack equals the run trained alone, writes the same
files, is masked when it diverges, and resumes; parts that cannot stack train alone and say why."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from helpers import LLAMA, PATIENCE
from toy_data import TINY_MODEL, write_corpus, write_spec
from typer.testing import CliRunner

from anatomy_cli.cli.main import app
from anatomy_cli.data.load import load_corpus
from anatomy_cli.spec.config import ConfigError, RunConfig, validate
from anatomy_cli.store import runs
from anatomy_cli.sweep.jobs import Job, group_jobs, run_group
from anatomy_cli.sweep.plan import STACK_AUTO, stack_size
from anatomy_cli.training import stacked
from anatomy_cli.training.run import resolve_config, train
from anatomy_cli.training.stacked import clip_members, stack_problem, train_group
from anatomy_cli.training.trainer import Trainer

runner = CliRunner()

TRAIN = {"steps": 16, "batch_size": 4, "eval_interval": 8, "log_interval": 4, "eval_batches": 2, "warmup": 2,
         "lr": 3e-3, "sample_len": 12, "device": "cpu", "threads": 1}
ENDS = {
    "2017": {},
    "llama": LLAMA,
    "mixed": {"norm_type": "rmsnorm", "pos_type": "rope"},
    "modern": {**LLAMA, "qk_norm": True, "tie_embeddings": True, "logit_softcap": 30.0, "parallel_block": True},
    "gdn": {**LLAMA, "gdn_pattern": "DA"},
    "swa": {**LLAMA, "window": 8, "window_pattern": "LG"},
    "mla": {**LLAMA, "attn_type": "mla"},
    "keyed": {**LLAMA, "init_key": "name"},  # keyed init (model.init_key): each slice is its lone run's too
}
TIMING = set(runs.TIMING_KEYS)


def cfgs(corpus: Path, seeds=(0, 1, 2), model: dict | None = None, **train_kw) -> list[RunConfig]:
    return [validate(RunConfig, {"seed": s, "model": {**TINY_MODEL, **(model or {})},
                                 "train": {**TRAIN, **train_kw}, "data": {"source": str(corpus)}}) for s in seeds]


def metrics(run_dir: Path) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in TIMING} for r in runs.read_metrics(run_dir)]


def assert_close_runs(a: Path, b: Path, tol: float = 1e-4) -> None:
    ma, mb = metrics(a), metrics(b)
    assert [sorted(r) for r in ma] == [sorted(r) for r in mb]
    for ra, rb in zip(ma, mb):
        for k in ra:
            assert ra[k] == pytest.approx(rb[k], abs=tol, rel=tol), (k, ra, rb)
    sa, sb = runs.read_summary(a), runs.read_summary(b)
    assert sa["status"] == sb["status"]
    assert abs(sa["best_val_loss"] - sb["best_val_loss"]) < tol
    assert sa["best_step"] == sb["best_step"] and sa["params"] == sb["params"]


def files(run_dir: Path) -> list[str]:
    """The run's file names, TensorBoard's (named by time and host) as one kind."""
    return sorted("events" if p.name.startswith("events.out") else p.name for p in run_dir.iterdir())


@pytest.mark.parametrize("end", list(ENDS))
def test_each_member_equals_its_run_alone(tmp_path, end):
    corpus = write_corpus(tmp_path)
    group = cfgs(corpus, model=ENDS[end])
    stacked = [tmp_path / "stack" / f"s{c.seed}" for c in group]
    summaries = train_group(group, stacked)
    assert [s["stacked"] for s in summaries] == [3, 3, 3]
    for c, d in zip(group, stacked):
        alone = tmp_path / "alone" / f"s{c.seed}"
        train(c, alone)
        assert_close_runs(d, alone)
        assert runs.read_summary(alone).get("stacked") is None
        # the same files as a lone run (no resume.pt once completed)
        assert files(d) == files(alone)


@pytest.mark.parametrize("model", [{**LLAMA, "init_key": "name"}, {**LLAMA, "gdn_pattern": "DA", "init_key": "name"},
                                   LLAMA], ids=["keyed", "keyed-gdn", "order"])
def test_each_stacked_slice_starts_from_its_lone_runs_weights(tmp_path, model):
    """Before any step: slice i of every stacked parameter is, bit for bit, the weights Trainer builds
    for seed i alone (keyed: from (seed, name); order: from the seed's stream)."""
    path = write_corpus(tmp_path)
    corpus = load_corpus(str(path), 0.1, TINY_MODEL["ctx_len"])
    group = [resolve_config(c, corpus) for c in cfgs(path, seeds=(4, 9), model=model)]
    stack = stacked.StackedTrainer(group, [tmp_path / f"s{c.seed}" for c in group], corpus)
    for i, c in enumerate(group):
        alone = Trainer(c, tmp_path / "alone" / f"s{c.seed}", corpus).model
        for name, p in alone.named_parameters():
            assert torch.equal(stack.params[name][i], p), (c.seed, name)


# ------------------------------------------------------------------ divergence: masked, recorded
def test_a_diverged_member_is_masked_and_recorded_while_the_others_finish(tmp_path, monkeypatch):
    corpus = write_corpus(tmp_path)
    group = cfgs(corpus, model=LLAMA)

    class Poisoned(stacked.Member):  # seed 1's init is corrupted: its loss is NaN from step 1
        def __init__(self, cfg, *args):
            super().__init__(cfg, *args)
            if cfg.seed == 1:
                with torch.no_grad():
                    self.model.tok.weight.fill_(math.nan)

    retired = []
    monkeypatch.setattr(stacked, "Member", Poisoned)
    monkeypatch.setattr(stacked.StackedTrainer, "retire",
                        lambda self, gone, f=stacked.StackedTrainer.retire: (retired.append(len(self.members)),
                                                                             f(self, gone),
                                                                             retired.append(len(self.members))))
    dirs = [tmp_path / "stack" / f"s{c.seed}" for c in group]
    summaries = train_group(group, dirs)
    bad = summaries[1]
    assert bad["status"] == runs.DIVERGED and bad["diverged_at"] == 0 and bad["steps_done"] == TRAIN["log_interval"]
    assert [s["stacked"] for s in summaries] == [3, 3, 3]  # which path trained each, the diverged one too
    assert math.isnan(runs.read_metrics(dirs[1])[0]["val_loss"])  # its books say what happened
    assert not (dirs[1] / runs.RESUME).exists() and (dirs[1] / runs.LAST).exists()
    assert retired == [3, 2]  # dropped from the stack at its log point: it costs nothing afterwards
    for i in (0, 2):
        alone = tmp_path / "alone" / f"s{group[i].seed}"
        train(group[i], alone)
        assert_close_runs(dirs[i], alone)  # the others are untouched by the NaN member


def test_clip_members_uses_each_members_own_norm():
    torch.manual_seed(0)
    grads = [torch.randn(3, 4, 5), torch.randn(3, 7)]
    params = [torch.zeros_like(g, requires_grad=True) for g in grads]
    for p, g in zip(params, grads):
        p.grad = g.clone()
    norms = clip_members(params, 1.0)
    for i in range(3):
        lone = [g[i].clone().requires_grad_() for g in grads]
        for p, g in zip(lone, grads):
            p.grad = g[i].clone()
        want = torch.nn.utils.clip_grad_norm_(lone, 1.0)
        assert norms[i].item() == pytest.approx(want.item(), rel=1e-6)
        for p, q in zip(params, lone):
            torch.testing.assert_close(p.grad[i], q.grad)


# ------------------------------------------------------------------ resume
def test_stopped_stack_resumes_per_member_equal_to_uninterrupted(tmp_path):
    corpus = write_corpus(tmp_path)
    group = cfgs(corpus, model=LLAMA)
    dirs = [tmp_path / "stack" / f"s{c.seed}" for c in group]
    seen = {"step": 0}
    summaries = train_group(group, dirs, progress=lambda p: seen.update(step=p["step"]), stop=lambda: seen["step"] >= 8)
    assert [s["status"] for s in summaries] == [runs.INTERRUPTED] * 3
    assert all((d / runs.RESUME).exists() for d in dirs)
    jobs = [Job(d.name, c.model_dump(mode="json"), str(d)) for c, d in zip(group, dirs)]
    done = run_group(jobs)
    assert [s["status"] for s in done] == [runs.COMPLETED] * 3 and [s["stacked"] for s in done] == [3] * 3
    for c, d in zip(group, dirs):
        alone = tmp_path / "alone" / f"s{c.seed}"
        train(c, alone)
        assert_close_runs(d, alone)


def test_mixed_states_rerun_completes_each_from_where_it_stands(tmp_path):
    """Seed 0 completed, seeds 1-2 stopped at step 8 in a stack, seed 3 killed before any checkpoint:
    a rerun of the group resumes 1-2 as one stack, trains 3 alone, and leaves 0 alone."""
    corpus = write_corpus(tmp_path)
    group = cfgs(corpus, seeds=(0, 1, 2, 3), model=LLAMA)
    dirs = [tmp_path / "stack" / f"s{c.seed}" for c in group]
    train(group[0], dirs[0])
    seen = {"step": 0}
    train_group(group[1:3], dirs[1:3], progress=lambda p: seen.update(step=p["step"]), stop=lambda: seen["step"] >= 8)
    dirs[3].mkdir(parents=True)
    runs.atomic_write_json(dirs[3] / runs.CONFIG, group[3].model_dump(mode="json"))
    runs.atomic_write_json(dirs[3] / runs.SUMMARY, {"status": runs.INTERRUPTED})
    jobs = [Job(d.name, c.model_dump(mode="json"), str(d)) for c, d in zip(group, dirs)][1:]
    done = run_group(jobs)
    assert [s["status"] for s in done] == [runs.COMPLETED] * 3
    assert [s.get("stacked") for s in done] == [2, 2, None]  # 1-2 resumed together; 3 alone (another step)
    for c, d in zip(group, dirs):
        alone = tmp_path / "alone" / f"s{c.seed}"
        train(c, alone)
        assert_close_runs(d, alone)


# ------------------------------------------------------------------ cannot stack -> alone, and says why
def test_a_part_that_cannot_stack_trains_alone_and_its_summary_says_why(tmp_path):
    """A mixture of experts routes with data-dependent shapes (bincount), which vmap cannot batch:
    its seeds train alone, each summary says why, and the results are the lone runs'."""
    corpus = write_corpus(tmp_path)
    group = cfgs(corpus, seeds=(0, 1), model={"moe": True}, steps=8, eval_interval=4)
    assert stack_problem(cfgs(corpus, seeds=(0,))[0]) is None
    why = stack_problem(group[0])
    assert why and why.startswith("cannot train stacked")
    jobs = [Job(f"s{c.seed}", c.model_dump(mode="json"), str(tmp_path / f"s{c.seed}")) for c in group]
    done = run_group(jobs)
    assert [s["status"] for s in done] == [runs.COMPLETED] * 2
    assert all(s["stack_note"] == why and s.get("stacked") is None for s in done)
    assert runs.read_summary(tmp_path / "s0")["stack_note"] == why
    train(group[0], tmp_path / "alone")
    assert metrics(tmp_path / "s0") == metrics(tmp_path / "alone")  # alone is alone: bit for bit


# ------------------------------------------------------------------ the CLI
@pytest.mark.process
def test_ablate_stack_option(tmp_path):
    spec = write_spec(tmp_path, top={"flips": ["rope"], "seeds": 2}, train={"steps": 6, "eval_interval": 3,
                                                                             "sample_len": 0})
    out = runner.invoke(app, ["ablate", str(spec), "--runs-dir", str(tmp_path / "runs"), "--stack", "2",
                              "--workers", "1", "--no-report"])
    assert out.exit_code == 0, out.output
    summaries = [runs.read_summary(d) for d in (tmp_path / "runs" / "toy").glob("*/") if (d / runs.SUMMARY).exists()]
    assert len(summaries) == 8 and all(s["stacked"] == 2 for s in summaries)  # 4 configs x 2 seeds
    bad = runner.invoke(app, ["ablate", str(spec), "--runs-dir", str(tmp_path / "runs"), "--stack", "two"])
    assert bad.exit_code == 2 and "--stack must be auto, off or a number" in " ".join(bad.output.split())
    assert "Traceback" not in bad.output


def test_stack_size_choices():
    assert stack_size("off", "cuda") == 1 and stack_size("4", "cpu") == 4
    assert stack_size("auto", "cpu") == STACK_AUTO["cpu"] and stack_size("auto", "cuda") == STACK_AUTO["cuda"]
    for bad in ("0", "-1", "x", ""):
        with pytest.raises(ConfigError):
            stack_size(bad, "cpu")


def test_group_jobs_groups_seeds_of_one_config_in_chunks():
    def job(name, seed, d=32):
        return Job(f"{name}-{seed}", {"seed": seed, "model": {"d_model": d}}, f"/x/{name}-{seed}")

    jobs = [job("a", 0), job("b", 0, 64), job("a", 1), job("a", 2), job("b", 1, 64)]
    assert [[j.run_id for j in g] for g in group_jobs(jobs, 2)] == [["a-0", "a-1"], ["a-2"], ["b-0", "b-1"]]
    assert [[j.run_id for j in g] for g in group_jobs(jobs, 1)] == [[j.run_id] for j in jobs]


# ------------------------------------------------------------------ real signals on a stacked sweep
@pytest.mark.slow
@pytest.mark.process
def test_stacked_sweep_resumes_after_sigint_and_after_sigkill(tmp_path):
    import os
    import signal
    import subprocess
    import sys

    from helpers import wait_for

    from anatomy_cli.training.checkpoint import load_checkpoint, load_run_config
    from tests.behaviour.test_signals import CLI, ENV

    spec = write_spec(tmp_path, top={"design": "list", "configs": [{"name": "c0"}], "seeds": 2},
                      train={"steps": 240, "eval_interval": 20, "log_interval": 10, "sample_len": 0})
    cmd = CLI + ["ablate", str(spec), "--runs-dir", str(tmp_path / "runs"), "--stack", "2", "--workers", "1",
                 "--no-report"]
    sweep = tmp_path / "runs" / "toy"

    def checkpointed_past(step: int) -> bool:
        dirs = [d for d in sweep.glob("*/") if (d / runs.RESUME).exists()]
        return len(dirs) == 2 and all(max((r["step"] for r in runs.read_metrics(d)), default=0) > step for d in dirs)

    for sig in (signal.SIGINT, signal.SIGKILL):
        past = max((r["step"] for d in sweep.glob("*/") for r in runs.read_metrics(d)), default=0)
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV,
                                start_new_session=True)
        wait_for(lambda: checkpointed_past(past + 20) or proc.poll() is not None, what="both runs checkpointed")
        assert proc.poll() is None, proc.communicate()[1]
        os.killpg(proc.pid, sig) if sig == signal.SIGKILL else proc.send_signal(sig)
        proc.communicate(timeout=PATIENCE)
        assert proc.returncode == (130 if sig == signal.SIGINT else -signal.SIGKILL)
        assert {runs.run_status(d) for d in sweep.glob("*/")} == {runs.INTERRUPTED}
    # A stack writes its members' checkpoints one after the other: a SIGKILL between two leaves them at
    # different steps, and the rerun then continues each alone. Either way each equals its lone run;
    # stacked again exactly when the kill left them at one step.
    saved = {load_checkpoint(d / runs.RESUME)["step"] for d in sweep.glob("*/")}
    done = subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=PATIENCE)
    assert done.returncode == 0, done.stderr
    for d in sorted(sweep.glob("*/")):
        assert runs.read_summary(d).get("stacked") == (2 if len(saved) == 1 else None), saved
        assert len(runs.read_summary(d)["resumed_at"]) == 2  # resumed after the SIGINT and after the SIGKILL
        alone = tmp_path / "alone" / d.name
        train(load_run_config(d), alone)
        assert_close_runs(d, alone)
    assert sys.executable  # the subprocesses ran this interpreter


def test_a_plugin_part_that_says_it_cannot_stack_trains_alone_with_its_reason(tmp_path):
    """A part vmap could batch but that declares stack="why" (its own reason) is not stacked; one that says
    nothing stacks (examples/parts/relu2.py)."""
    from anatomy_cli.spec import parts as registry

    relu2 = Path(__file__).resolve().parents[2] / "examples" / "parts" / "relu2.py"
    registry.load_plugins([relu2])
    assert stack_problem(validate(RunConfig, {"model": {**TINY_MODEL, "vocab_size": 50, "ffn_type": "relu2"}})) is None
    said = tmp_path / "lonely.py"
    said.write_text(relu2.read_text().replace('@part("relu2", slot="ffn",', '@part("lonely", slot="ffn", stack="its '
                                                                          'statistics are per run",'))
    registry.load_plugins([said])
    cfg = validate(RunConfig, {"model": {**TINY_MODEL, "vocab_size": 50, "ffn_type": "lonely"}})
    assert stack_problem(cfg) == "cannot train stacked: the part lonely says its statistics are per run"

"""Every device first-class: training, evaluation and sampling keep every tensor on the model's
device (checked on a fake accelerator, tests/fake_device.py), summaries record the precision that
really ran, eval reproduces a bf16 run's best_val_loss, and sweeps run N at once on one device."""

from __future__ import annotations

import json
import os

import pytest
import torch
from fake_device import DEVICE, FakeDevice, OnDevice
from helpers import LLAMA, PATIENCE
from toy_data import TINY_MODEL, TINY_TRAIN, write_corpus, write_spec

from anatomy_cli.data.batches import BatchSampler
from anatomy_cli.data.load import load_corpus
from anatomy_cli.exams import lengths
from anatomy_cli.model.generate import generate
from anatomy_cli.spec.config import RunConfig, validate
from anatomy_cli.store import runs
from anatomy_cli.training import devices, trainer
from anatomy_cli.training import run as training
from anatomy_cli.training.checkpoint import load_run


def run_cfg(tmp_path, model=None, **train) -> RunConfig:
    corpus = write_corpus(tmp_path)
    return validate(RunConfig, {"model": {**TINY_MODEL, **(model or {})}, "train": {**TINY_TRAIN, **train},
                                "data": {"source": str(corpus)}})


def test_auto_picks_mps_on_a_mac_and_batches_follow_any_device(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    assert devices.resolve_device("auto") == torch.device("mps")
    corpus = load_corpus(None, 0.1, 16)
    with FakeDevice() as fd:
        x, y = BatchSampler(corpus.train, 2, 16, 0, DEVICE).next()
    assert isinstance(x, OnDevice) and isinstance(y, OnDevice) and x.device == DEVICE, "batch left on the host"
    assert fd.problems == []


@pytest.mark.slow  # trains, evaluates and samples a whole run twice: seconds each
@pytest.mark.parametrize("model", [LLAMA, {}], ids=["llama-rope", "2017-learned"])
def test_train_eval_and_sample_leave_no_tensor_behind(tmp_path, monkeypatch, model):
    """The whole run on a fake accelerator: no op mixes host and device tensors, none makes float64 on
    the device (MPS), and the numbers equal the CPU's (the fake device computes on the CPU)."""
    cfg = run_cfg(tmp_path, model, sample_len=40)
    on_cpu = training.train(cfg, tmp_path / "cpu")
    for module in (training, trainer):
        monkeypatch.setattr(module, "resolve_device", lambda name: DEVICE)

    def left_behind(phase: str) -> str:
        return f"{phase}: " + "\n".join(dict.fromkeys(fd.problems))

    with FakeDevice() as fd:
        summary = training.train(cfg, tmp_path / "dev")  # train steps, evals, and samples.txt
        assert fd.problems == [], left_behind("train")
        ctx = [(1, True), (2, True)]  # 2x: RoPE grows its tables past ctx_len
        evaluated = lengths.eval_lengths(tmp_path / "dev", ctx, device=DEVICE)
        assert fd.problems == [], left_behind("eval")
        _, vocab, lm = load_run(tmp_path / "dev", device=DEVICE)
        window = 2 * cfg.model.ctx_len if cfg.model.pos_type == "rope" else None
        for use_cache in (True, False):
            ids = list(generate(lm, vocab.encode("The "), 40, temp=0.8, seed=1, use_cache=use_cache, window=window))
            assert len(ids) == 40
        assert fd.problems == [], left_behind("sample")
    assert fd.device_ops > 1000 and summary["device"] == "meta" and summary["status"] == runs.COMPLETED
    assert isinstance(lm.head.weight, OnDevice)
    # The same weights and windows through other kernels (the fake device's tensors may take another
    # SDPA/matmul path; the exam sums its batches apart from training's eval): equal to fp32 rounding
    # of a mean of O(1) losses, 1.5e-7 apart seen on an Intel AVX-512 path. A moved window, a stale
    # weight or a lost batch moves the loss by 1e-3 or more.
    assert summary["best_val_loss"] == pytest.approx(on_cpu["best_val_loss"], rel=1e-6)
    assert evaluated["val_loss_by_ctx"][str(cfg.model.ctx_len)] == pytest.approx(summary["best_val_loss"], rel=1e-6)
    assert (tmp_path / "dev" / runs.SAMPLES).read_text() == (tmp_path / "cpu" / runs.SAMPLES).read_text()


def test_rope_tables_grow_in_float64_on_the_host_then_move():
    """Past ctx_len RoPE rebuilds its tables: in float64 on the CPU, cast to fp32, then moved (MPS has
    no float64); the grown tables equal a CPU model's bit for bit."""
    from anatomy_cli.model import LM
    from anatomy_cli.spec.config import ModelConfig

    cfg = ModelConfig(vocab_size=50, d_model=32, n_layer=2, n_head=4, pos_type="rope", ctx_len=8)
    torch.manual_seed(0)
    cpu = LM(cfg).eval()
    idx = torch.randint(cfg.vocab_size, (1, 20))
    with FakeDevice() as fd, torch.no_grad():
        lm = LM(cfg).to(DEVICE).eval()
        lm.load_state_dict(cpu.state_dict())
        logits, _ = lm(idx.to(DEVICE))  # 20 > ctx_len: the tables grow
    assert fd.problems == [], "\n".join(dict.fromkeys(fd.problems))
    cpu(idx)
    assert isinstance(lm.positions.cos, OnDevice) and lm.positions.cos.shape[0] >= 20
    assert torch.equal(lm.positions.cos.inner, cpu.positions.cos)
    assert torch.equal(lm.positions.signed_sin.inner, cpu.positions.signed_sin)


def test_fake_device_catches_what_a_gpu_would_refuse():
    """The harness itself: a host tensor meeting a device tensor, and float64 on the device, are caught."""
    with FakeDevice() as fd:
        a = torch.ones(3, device=DEVICE)
        _ = a + torch.ones(3)  # host tensor left behind
        _ = torch.arange(4, device=DEVICE).double()  # float64 on an MPS-like device
        _ = a * torch.tensor(2.0)  # a host scalar is fine (CUDA and MPS take those)
    assert len(fd.problems) == 2 and "host tensor" in fd.problems[0] and "float64" in fd.problems[1]


# ------------------------------------------------------------------------------- honest numerics


def test_summary_records_matmul_precision_and_sdpa_kernel(tmp_path):
    s = training.train(run_cfg(tmp_path, LLAMA, sample_len=0, steps=2), tmp_path / "fp32")
    assert s["dtype"] == "float32" and s["matmul_precision"] == "fp32"
    assert s["sdpa_kernel"] in ("flash", "math")  # the CPU has a flash kernel and the math fallback
    saved = runs.read_summary(tmp_path / "fp32")
    assert saved["matmul_precision"] == "fp32" and saved["sdpa_kernel"] == s["sdpa_kernel"]


def test_tf32_on_cuda_is_recorded_as_tf32():
    """Trainer turns TF32 on for CUDA (devices.configure); the record must say so, not 'float32'.
    The CUDA flags are plain process state, settable on a CPU-only build."""
    cuda = torch.device("cuda")
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = False
        assert devices.matmul_precision(cuda, "float32") == "fp32"
        devices.configure(cuda)
        assert devices.matmul_precision(cuda, "float32") == "tf32"
        assert devices.matmul_precision(cuda, "bfloat16") == "bf16-autocast"
        assert devices.matmul_precision(torch.device("cpu"), "float32") == "fp32"  # CPU matmuls untouched
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


def test_eval_of_a_bf16_run_reproduces_its_best_val_loss(tmp_path):
    cfg = run_cfg(tmp_path, LLAMA, sample_len=0, dtype="bfloat16")
    s = training.train(cfg, tmp_path / "bf16")
    out = lengths.eval_lengths(tmp_path / "bf16", [(1, True)])
    assert out["val_loss_by_ctx"][str(cfg.model.ctx_len)] == s["best_val_loss"]
    assert out["dtype"] == "bfloat16" and s["matmul_precision"] == "bf16-autocast"


# ------------------------------------------------------------------------------- N runs on one device


def test_device_workers_on_cuda_come_from_free_memory(tmp_path, monkeypatch):
    cfg = run_cfg(tmp_path, {"d_model": 128, "n_layer": 4, "ctx_len": 128}, batch_size=32)
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    per_run = devices.run_bytes(cfg, 1719) + devices.PROCESS_BYTES
    cuda = torch.device("cuda")
    for free, expect in ((130 * 2**30, 12), (4 * per_run, 3), (per_run // 2, 1)):
        monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None, f=free: (f, 141 * 2**30))
        assert devices.device_workers(cuda, [cfg] * 12, {cfg.data.corpus_key: 1719}, 12) == expect
    assert devices.device_workers(torch.device("cpu"), [cfg], {}, 12) == 12
    assert devices.device_workers(torch.device("mps"), [cfg], {}, 12) == 1


def test_compile_cache_is_shared_by_every_worker_of_a_sweep(tmp_path, monkeypatch):
    for key in ("TORCHINDUCTOR_CACHE_DIR", "TORCHINDUCTOR_FX_GRAPH_CACHE", "TORCHINDUCTOR_AUTOGRAD_CACHE",
                "TORCHINDUCTOR_COMPILE_THREADS"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    path = devices.share_compile_cache(tmp_path / "sweep", workers=8)
    assert path.is_dir() and os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(path.resolve())
    assert os.environ["TORCHINDUCTOR_FX_GRAPH_CACHE"] == "1" and os.environ["TORCHINDUCTOR_AUTOGRAD_CACHE"] == "1"
    assert os.environ["TORCHINDUCTOR_COMPILE_THREADS"] == "2"  # 16 cores / 8 workers
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    assert cache_dir() == str(path.resolve())  # read per call: spawned workers inherit the variable


@pytest.mark.slow
@pytest.mark.process
def test_ablate_device_workers_n_equals_workers_1(tmp_path):
    """`ablate --device cpu --workers 2` (the code path of --device cuda --workers N) gives the same
    metrics as --workers 1, and --device/--dtype/--compile land in every run's config."""
    from typer.testing import CliRunner

    from anatomy_cli.cli.main import app

    spec = write_spec(tmp_path, top={"flips": ["rope"], "seeds": 1}, train={"steps": 6, "sample_len": 0})
    results = {}
    for n in (1, 2):
        out = tmp_path / f"w{n}"
        r = CliRunner().invoke(app, ["ablate", str(spec), "--device", "cpu", "--dtype", "float32", "--workers",
                                     str(n), "--runs-dir", str(out), "--no-report"])
        assert r.exit_code == 0, r.output
        found = runs.find_runs(out / "toy")
        assert len(found) == 4
        for d in found:
            assert json.loads((d / runs.CONFIG).read_text())["train"]["device"] == "cpu"
        results[n] = {d.name: (runs.read_summary(d)["best_val_loss"], metrics_without_time(d)) for d in found}
    assert results[1] == results[2]  # bit-identical on the CPU: same best losses, same metric lines


def metrics_without_time(run_dir):
    return [{k: v for k, v in r.items() if k not in runs.TIMING_KEYS} for r in runs.read_metrics(run_dir)]


@pytest.mark.process
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU path")
def test_gpu_sweep_fails_cleanly_without_cuda():
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_sweep.sh"
    result = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=PATIENCE,
                            env={**os.environ, "PYTHON": sys.executable})
    assert result.returncode == 2, result.stdout + result.stderr
    assert "no CUDA device" in result.stderr and "Traceback" not in result.stderr

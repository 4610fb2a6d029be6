"""anatomy on a CUDA machine: correctness, seed-config step times, and MFU at GPT-2-small size.

Run through benchmarks/gpu_check.sh, which puts src/ on PYTHONPATH, installs carried pydantic
wheels if needed and bounds the whole run with `timeout`. Sub-commands:

    python benchmarks/gpu_check.py preflight         # imports + CUDA; exit 3 / 2 with a clear message
    python benchmarks/gpu_check.py run [options]      # the checks (budget-bounded, < 5 minutes)
    python benchmarks/gpu_check.py run --device cpu --tiny   # CPU smoke test of every code path

Sections of `run`, each bounded (fixed step counts, and skipped when the time budget is short):
  1. correctness: cached vs full logits (fp32, TF32 off; also bf16 autocast, looser), anatomy vs the
     hand-written reference; which SDPA kernels accept anatomy's MHA / GQA calls in fp32 and bf16
     (GQA uses enable_gqa, which on CUDA only flash (fp16/bf16) and math accept); and one short
     training run through anatomy_cli.training.run.train
  2. seed config (B 32, T 128, d 128, L 4, H 4, V 1719) step time through Trainer.train_step (the
     product's own step): eager fp32 (TF32), eager bf16, compiled bf16, compiled bf16
     mode="reduce-overhead" (CUDA graphs, with the Trainer's own step boundaries)
  3. MFU of a GPT-2-small-sized char model (d 768, L 12, H 12, T 1024, V 256), bf16 + compile, batch
     sized from measured memory per sample, against --peak-tflops (790: H200 bf16 dense)

Exit status: 0 all passed, 1 a check failed, 2 no CUDA device, 3 missing Python packages.
Imports of torch and anatomy happen inside functions so that `preflight` can explain what is missing.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
if str(HERE.parent / "src") not in sys.path:
    sys.path.append(str(HERE.parent / "src"))

EXIT_FAILED, EXIT_NO_CUDA, EXIT_MISSING = 1, 2, 3
# (module, why it is needed); anatomy's own modules are imported last, so a missing dependency is named.
REQUIRED = [
    ("torch", "runs the model"),
    ("numpy", "anatomy_cli.data.batches turns id arrays into tensors with it"),
    ("safetensors", "anatomy_cli.training.checkpoint writes weights with it"),
    ("pydantic", "anatomy_cli.spec.config validates every spec with it"),
    ("anatomy_cli.spec.config", "anatomy, from src/ on PYTHONPATH"),
    ("anatomy_cli.model", "anatomy, from src/ on PYTHONPATH"),
    ("anatomy_cli.training.run", "anatomy, from src/ on PYTHONPATH"),
]
WHEELS_HINT = """\
pydantic is not importable. anatomy's config.py needs pydantic>=2.6,<3 (with pydantic-core,
annotated-types, typing-inspection). On a machine with a package registry, in the repo root:
    python3 -m pip download --only-binary=:all: --platform manylinux2014_x86_64 \\
        --python-version 3.12 --implementation cp -d .whl "pydantic>=2.6,<3"
(match --python-version to this machine's python3), carry .whl/ along, and rerun gpu_check.sh:
it installs them from .whl/ with pip --no-index."""


def hide_modules() -> None:
    """ANATOMY_GPU_CHECK_HIDE=pydantic,... makes those imports fail (tests the missing-package path)."""
    for name in filter(None, os.environ.get("ANATOMY_GPU_CHECK_HIDE", "").split(",")):
        sys.modules[name.strip()] = None  # type: ignore[assignment]


def missing_modules() -> list[tuple[str, str, str]]:
    hide_modules()
    missing = []
    for name, why in REQUIRED:
        try:
            importlib.import_module(name)
        except Exception as err:  # ImportError, or anything a broken package raises on import
            missing.append((name, why, f"{err.__class__.__name__}: {err}"))
    return missing


def preflight(device: str = "cuda", quiet: bool = False) -> int:
    missing = missing_modules()
    if missing:
        print("gpu_check: missing Python packages:", file=sys.stderr)
        for name, why, err in missing:
            print(f"  - {name}: {err}  [{why}]", file=sys.stderr)
        if any(name == "pydantic" for name, _, _ in missing):
            print(WHEELS_HINT, file=sys.stderr)
        return EXIT_MISSING
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        cuda = torch.version.cuda or "no"
        print(f"gpu_check: no CUDA device (torch {torch.__version__}, CUDA build: {cuda}); nothing to check."
              "\nFor a CPU smoke test of this script: gpu_check.py run --device cpu --tiny",
              file=sys.stderr)
        return EXIT_NO_CUDA
    name = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    if not quiet:
        print(f"gpu_check preflight ok: torch {torch.__version__}, device {name}")
    return 0


# ------------------------------------------------------------------------------------------ checks


class Report:
    """Collects check results and timing rows; each section runs even if an earlier one failed."""

    def __init__(self, budget_s: float):
        self.start, self.budget = time.perf_counter(), budget_s
        self.checks: list[dict] = []
        self.rows: list[dict] = []

    def left(self) -> float:
        return self.budget - (time.perf_counter() - self.start)

    def check(self, name: str, ok: bool, detail: str) -> None:
        self.checks.append({"check": name, "ok": bool(ok), "detail": detail})
        print(f"  [{'PASS' if ok else 'FAIL'}] {name}: {detail}", flush=True)

    def skip(self, name: str, why: str) -> None:
        self.checks.append({"check": name, "ok": None, "detail": f"skipped: {why}"})
        print(f"  [SKIP] {name}: {why}", flush=True)

    def section(self, title: str, fn, need_s: float, *args) -> None:
        print(f"\n== {title} ({self.left():.0f} s of budget left)", flush=True)
        if self.left() < need_s:
            self.skip(title, f"needs ~{need_s:.0f} s, {self.left():.0f} s left")
            return
        try:
            fn(self, *args)
        except KeyboardInterrupt:
            raise
        except Exception as err:
            traceback.print_exc()
            self.check(title, False, f"raised {err.__class__.__name__}: {err}")

    @property
    def failed(self) -> bool:
        return any(c["ok"] is False for c in self.checks)


def small_configs(vocab: int = 97):
    from anatomy_cli.spec.config import ModelConfig

    base = dict(vocab_size=vocab, d_model=64, n_layer=2, n_head=4, ctx_len=64)
    llama = dict(norm_type="rmsnorm", norm_pos="pre", pos_type="rope", ffn_type="swiglu")
    return {"2017": ModelConfig(**base), "llama": ModelConfig(**base, **llama, n_kv_head=2),
            "llama-mqa": ModelConfig(**base, **llama, n_kv_head=1)}


def cached_vs_full(model, idx, prefix: int, chunk: int, dtype=None):
    """max |full logits - cached logits| over all positions: prefill `prefix`, one `chunk`, then 1 by 1."""
    import torch

    T = idx.shape[1]
    with torch.no_grad(), torch.autocast(idx.device.type, dtype=torch.bfloat16, enabled=dtype is not None):
        full, _ = model(idx)
        cache = model.new_cache(1, T)
        parts = [model(idx[:, :prefix], cache=cache)[0], model(idx[:, prefix:prefix + chunk], cache=cache)[0]]
        parts += [model(idx[:, t:t + 1], cache=cache)[0] for t in range(prefix + chunk, T)]
    return (full.float() - torch.cat(parts, dim=1).float()).abs().max().item()


def check_correctness(rep: Report, args) -> None:
    import reference
    import torch

    from anatomy_cli.model import LM

    dev = torch.device(args.device)
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False  # exact fp32 for the comparisons
    try:
        for name, cfg in small_configs().items():
            torch.manual_seed(0)
            model = LM(cfg).to(dev).eval()
            idx = torch.randint(cfg.vocab_size, (1, 48), device=dev)
            d = cached_vs_full(model, idx, prefix=16, chunk=8)
            rep.check(f"cached == full logits fp32 ({name})", d < args.atol,
                      f"max diff {d:.2e} (tol {args.atol:g})")
            d = cached_vs_full(model, idx, prefix=16, chunk=8, dtype=torch.bfloat16)
            rep.check(f"cached ~ full logits bf16 autocast ({name})", d < args.bf16_atol,
                      f"max diff {d:.2e} (tol {args.bf16_atol:g})")
            ref = reference.copy_from_anatomy(reference.RefLM(cfg), model.cpu()).to(dev).eval()
            model.to(dev)
            with torch.no_grad():
                d = (model(idx)[0] - ref(idx)[0]).abs().max().item()
            same = ref.num_params() == model.num_params() == cfg.num_params()
            rep.check(f"anatomy == reference logits ({name})", d < args.atol and same,
                      f"max diff {d:.2e}, params {model.num_params():,} equal: {same}")
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32


def sdpa_backends(q, k, v, **kw) -> list[str]:
    """Which SDPA backends accept this call (each tried alone); PyTorch picks the first in its order."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    ok = []
    for b in (SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION, SDPBackend.EFFICIENT_ATTENTION,
              SDPBackend.MATH):
        try:
            with sdpa_kernel(b), torch.no_grad():
                F.scaled_dot_product_attention(q, k, v, **kw)
            ok.append(b.name.lower().replace("_attention", ""))
        except RuntimeError:
            pass
    return ok


def check_sdpa(rep: Report, args) -> None:
    """anatomy passes enable_gqa=True for GQA; on CUDA only flash (fp16/bf16) and math accept it."""
    import warnings

    import torch

    B, H, hd, T = 8, 4, 32, 128  # the seed config's attention shapes
    for dtype in (torch.float32, torch.bfloat16):
        for label, G in (("MHA", H), ("GQA", H // 2)):
            q = torch.randn(B, H, T, hd, device=args.device, dtype=dtype)
            k, v = (torch.randn(B, G, T, hd, device=args.device, dtype=dtype) for _ in range(2))
            gqa = {"enable_gqa": True} if G != H else {}
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # each refusing backend warns why
                train = sdpa_backends(q, k, v, is_causal=True, **gqa)
                decode = sdpa_backends(q[:, :, -1:], k, v, **gqa)
            fast = train and train[0] != "math"
            rep.check(f"SDPA backends {label} {str(dtype).removeprefix('torch.')}", True,
                      f"causal T={T}: {', '.join(train) or 'none'}; decode q=1: {', '.join(decode) or 'none'}"
                      + ("" if fast else "  <- only the math kernel: T x T scores materialised"))


def generated_text(n_chars: int, seed: int = 0) -> str:
    """Deterministic toy English from a tiny grammar: learnable in a few hundred steps."""
    import random

    rng = random.Random(seed)
    subj = ["the cat", "a dog", "the model", "my friend", "the old king", "a small bird", "the teacher"]
    verb = ["sees", "likes", "trains", "reads", "follows", "finds", "writes"]
    obj = ["the ball", "a book", "the river", "some tokens", "the long road", "a red apple", "the garden"]
    tail = [".", " today.", " again.", " at night.", " with care.", "!", "?"]
    out, n = [], 0
    while n < n_chars:
        s = f"{rng.choice(subj)} {rng.choice(verb)} {rng.choice(obj)}{rng.choice(tail)}"
        s = s[0].upper() + s[1:] + ("\n" if rng.random() < 0.2 else " ")
        out.append(s)
        n += len(s)
    return "".join(out)


def check_training(rep: Report, args) -> None:
    from anatomy_cli.spec.config import DataConfig, ModelConfig, RunConfig, TrainConfig
    from anatomy_cli.store.runs import read_metrics
    from anatomy_cli.training.run import train

    with tempfile.TemporaryDirectory() as tmp:
        text = Path(tmp) / "toy.txt"
        text.write_text(generated_text(60_000 if args.tiny else 200_000), encoding="utf-8")
        steps, tiny = (20, True) if args.tiny else (150, False)
        m = ModelConfig(d_model=64 if tiny else 128, n_layer=2 if tiny else 4, n_head=4, n_kv_head=2,
                        ctx_len=64 if tiny else 128, norm_type="rmsnorm", norm_pos="pre", pos_type="rope",
                        ffn_type="swiglu")
        t = TrainConfig(steps=steps, batch_size=16 if tiny else 32, lr=3e-3, warmup=10,
                        eval_interval=steps // 2,
                        eval_batches=4, device=args.device, dtype=args.train_dtype, sample_len=64,
                        compile=args.train_compile)
        cfg = RunConfig(name="gpu-check", seed=0, model=m, train=t, data=DataConfig(source=str(text)))
        t0 = time.perf_counter()
        summary = train(cfg, Path(tmp) / "run")
        secs = time.perf_counter() - t0
        vals = [r["val_loss"] for r in read_metrics(Path(tmp) / "run") if "val_loss" in r]
        first, best = vals[0], summary["best_val_loss"]
        target = (0.999 if tiny else 0.8) * first  # the tiny CPU run only has to move
        ok = summary["status"] == "completed" and best is not None and best < target
        rep.check("train() on " + args.device, ok,
                  f"{summary['status']}, {steps} steps in {secs:.1f} s "
                  f"({summary['step_time_ms']:.1f} ms/step, "
                  f"{summary['dtype']}, matmul {summary.get('matmul_precision')}, sdpa {summary.get('sdpa_kernel')}, "
                  f"compile={summary['compiled']}), val loss {first:.3f} -> {best:.3f}, "
                  f"device {summary['device']} ({summary['hardware']})")
        sample = Path(tmp) / "run" / "samples.txt"
        rep.check("samples written", sample.is_file(),
                  repr(sample.read_text()[-60:]) if sample.is_file() else "missing")


def seed_config(name: str, tiny: bool):
    from anatomy_cli.spec.components import model_settings
    from anatomy_cli.spec.config import ModelConfig

    extra = {k: v for k, v in model_settings().items() if k != "n_kv_head"} if name == "llama" else {}
    kv = 2 if name == "llama" else 4
    if tiny:
        return ModelConfig(vocab_size=97, d_model=64, n_layer=2, n_head=4, n_kv_head=kv, ctx_len=32, **extra)
    return ModelConfig(vocab_size=1719, d_model=128, n_layer=4, n_head=4, n_kv_head=kv, ctx_len=128, **extra)


def step_variant(cfg, batch: int, device, dtype, compile_mode: str | None):
    """A step fn for one fresh model: Trainer.train_step itself (the product's step: its sampler,
    clipping, AdamW, and under reduce-overhead its CUDA-graph step boundaries and cloned records);
    compile_mode None = eager. The corpus is generated toy text, its vocabulary padded to cfg's."""
    from array import array

    import torch

    from anatomy_cli.data.corpus import CharVocab, Corpus, id_typecode
    from anatomy_cli.spec.config import RunConfig
    from anatomy_cli.training.trainer import Trainer

    text = generated_text(max(20_000, 4 * batch * (cfg.ctx_len + 1)))
    chars = sorted(set(text)) + [chr(0x4E00 + i) for i in range(cfg.vocab_size)]  # pad to vocab_size
    vocab = CharVocab(chars[: cfg.vocab_size])
    ids = array(id_typecode(cfg.vocab_size), vocab.encode(text))
    corpus = Corpus(vocab=vocab, train=ids, val=ids[: 4 * batch * (cfg.ctx_len + 1)], meta={})
    train = {"batch_size": batch, "device": str(device), "dtype": "bfloat16" if dtype is torch.bfloat16 else "float32",
             "compile": compile_mode is not None, "compile_mode": compile_mode or "default", "eval_batches": 1,
             "lr": 3e-4, "warmup": 0}
    run = RunConfig.model_validate({"seed": 0, "model": cfg.model_dump(), "train": train})
    tmp = tempfile.mkdtemp(prefix="gpu-check-step-")
    return Trainer(run, Path(tmp), corpus).train_step


def time_variants(rep: Report, variants: dict, cfgs: dict, batch: int, args, peak_flops: float) -> None:
    import common

    fns = {}
    for key, (cfg_name, dtype, mode) in variants.items():
        if mode is not None and rep.left() < args.compile_need_s:
            rep.skip(key, f"{rep.left():.0f} s left, compiling needs ~{args.compile_need_s:.0f} s")
            continue
        t0 = time.perf_counter()
        fn = step_variant(cfgs[cfg_name], batch, args.device, dtype, mode)
        for _ in range(args.warmup + (3 if mode is not None else 0)):  # compiled: compile + graph capture
            fn()
        common._sync(args.device)
        fns[key] = fn
        print(f"  built + warmed {key} in {time.perf_counter() - t0:.1f} s", flush=True)
    if not fns:
        return
    samples = common.time_interleaved(fns, warmup=0, repeats=args.repeats, inner=args.inner,
                                      device=args.device, budget_s=min(20.0, max(1.0, rep.left() / 4)))
    for key, secs in samples.items():
        cfg = cfgs[variants[key][0]]
        s = common.median(secs)
        tok_s = batch * cfg.ctx_len / s
        mfu = cfg.flops_per_token() * tok_s / peak_flops
        row = {"variant": key, "ms_per_step": 1000 * s, "spread": common.spread(secs), "tokens_per_s": tok_s,
               "tflops": cfg.flops_per_token() * tok_s / 1e12, "mfu": mfu, "batch": batch, "T": cfg.ctx_len}
        rep.rows.append(row)
        print(f"  {key:34s} {1000 * s:8.2f} ms/step  ±{100 * row['spread']:.0f}%  {tok_s:12,.0f} tok/s  "
              f"{row['tflops']:7.2f} TFLOP/s  MFU {100 * mfu:5.2f}%", flush=True)


def check_seed_speed(rep: Report, args) -> None:
    import torch

    cfgs = {name: seed_config(name, args.tiny) for name in ("2017", "llama")}
    bf16 = torch.bfloat16
    variants = {}
    for name in cfgs:
        variants[f"{name} eager fp32+tf32"] = (name, None, None)
        variants[f"{name} eager bf16"] = (name, bf16, None)
    compiled = list(cfgs) if args.compile_configs == "all" else [args.compile_configs]
    if args.device != "cuda" and not args.cpu_compile:
        rep.skip("compiled variants", "not on CPU unless --cpu-compile")
        compiled = []
    for name in compiled:
        variants[f"{name} compiled bf16"] = (name, bf16, "default")
        if args.device == "cuda":
            variants[f"{name} compiled bf16 reduce-overhead"] = (name, bf16, "reduce-overhead")
    time_variants(rep, variants, cfgs, 4 if args.tiny else 32, args, args.peak_tflops * 1e12)


def step_peak_bytes(cfg, batch: int) -> int:
    """Peak CUDA memory of two eager bf16 steps (model, Adam state and activations) at `batch`."""
    import torch

    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    step = step_variant(cfg, batch, "cuda", torch.bfloat16, None)
    step()
    step()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    del step
    torch.cuda.empty_cache()
    return peak


def choose_batch(cfg, args) -> tuple[int, str]:
    """Largest batch whose eager bf16 step fits in --mfu-fill of free memory (compiled needs less)."""
    import torch

    if args.mfu_batch:
        return args.mfu_batch, "--mfu-batch"
    if args.device != "cuda":
        return 2, "cpu smoke test"
    p2, p4 = step_peak_bytes(cfg, 2), step_peak_bytes(cfg, 4)
    per_sample = max((p4 - p2) / 2, 1.0)  # the slope: activations per sample
    fixed = max(p2 - 2 * per_sample, 0.0)  # weights, grads, Adam state
    free, _ = torch.cuda.mem_get_info()
    batch = max(1, min(args.mfu_max_batch, int((args.mfu_fill * free - fixed) / per_sample)))
    batch = batch - batch % 8 if batch >= 8 else batch
    return batch, (f"eager bf16: {per_sample / 2**30:.2f} GiB/sample + {fixed / 2**30:.1f} GiB fixed, "
                   f"{free / 2**30:.0f} GiB free, fill {args.mfu_fill:g}")


def check_mfu(rep: Report, args) -> None:
    import torch

    from anatomy_cli.spec.components import model_settings
    from anatomy_cli.spec.config import ModelConfig

    extra = {k: v for k, v in model_settings().items() if k != "n_kv_head"} if args.mfu_config == "llama" else {}
    heads = 4 if args.tiny else 12
    kv = (args.mfu_kv_heads or heads // 2) if args.mfu_config == "llama" else heads
    cfg = ModelConfig(vocab_size=256, d_model=64 if args.tiny else 768, n_layer=2 if args.tiny else 12,
                      n_head=heads, n_kv_head=kv, ctx_len=64 if args.tiny else 1024, **extra)
    batch, why = choose_batch(cfg, args)
    print(f"  {args.mfu_config} d={cfg.d_model} L={cfg.n_layer} H={cfg.n_head} G={cfg.n_kv_head} "
          f"T={cfg.ctx_len} V=256, {cfg.num_params() / 1e6:.1f} M params, batch {batch} ({why})", flush=True)
    mode = None if (args.device != "cuda" and not args.cpu_compile) else args.mfu_mode
    if args.device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    key = f"mfu {args.mfu_config} {'compiled ' + mode if mode else 'eager'} bf16"
    time_variants(rep, {key: (args.mfu_config, torch.bfloat16, mode)}, {args.mfu_config: cfg}, batch, args,
                  args.peak_tflops * 1e12)
    rows = [r for r in rep.rows if r["variant"] == key]
    if rows:
        r = rows[0]
        attn = 6 * cfg.n_layer * cfg.ctx_len * cfg.d_model  # PaLM counts QK^T and AV: twice this
        palm = r["mfu"] * (cfg.flops_per_token() + attn) / cfg.flops_per_token()
        mem = ""
        if args.device == "cuda":
            mem = f", peak mem {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB"
        rep.check("MFU measured", r["mfu"] > 0, f"{100 * r['mfu']:.1f}% of {args.peak_tflops:g} TFLOP/s "
                  f"(ModelConfig.flops_per_token; PaLM-style 12·L·T·d attention: {100 * palm:.1f}%){mem}")


# ------------------------------------------------------------------------------------------ main


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    pre = sub.add_parser("preflight", help="check imports and the CUDA device")
    pre.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    r = sub.add_parser("run", help="run the checks")
    r.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    r.add_argument("--tiny", action="store_true", help="toy sizes everywhere (CPU smoke test)")
    r.add_argument("--budget", type=float, default=270.0, help="seconds; sections that don't fit are skipped")
    r.add_argument("--peak-tflops", type=float, default=790.0, help="bf16 dense peak (H200: 790)")
    r.add_argument("--atol", type=float, default=1e-4, help="fp32 logits tolerance")
    r.add_argument("--bf16-atol", type=float, default=5e-2, help="bf16 autocast logits tolerance")
    r.add_argument("--train-dtype", default="float32", choices=["float32", "bfloat16"])
    r.add_argument("--train-compile", action="store_true", help="the training run uses torch.compile")
    r.add_argument("--compile-configs", default="llama", choices=["llama", "2017", "all"],
                   help="seed configs timed under torch.compile (each compile costs ~30 s)")
    r.add_argument("--cpu-compile", action="store_true", help="also compile on CPU (slow)")
    r.add_argument("--compile-need-s", type=float, default=45.0, help="skip a compile with less budget left")
    r.add_argument("--warmup", type=int, default=3)
    r.add_argument("--repeats", type=int, default=10)
    r.add_argument("--inner", type=int, default=5, help="steps per timed sample")
    r.add_argument("--mfu-config", default="llama", choices=["llama", "2017"])
    r.add_argument("--mfu-kv-heads", type=int, default=None, help="llama n_kv_head (default n_head/2)")
    r.add_argument("--mfu-batch", type=int, default=None, help="fixed batch (default: fill memory)")
    r.add_argument("--mfu-max-batch", type=int, default=128)
    r.add_argument("--mfu-fill", type=float, default=0.5, help="fraction of free memory the batch may use")
    r.add_argument("--mfu-mode", default="default", choices=["default", "max-autotune-no-cudagraphs"])
    r.add_argument("--sections", nargs="+", default=["correctness", "sdpa", "train", "seed", "mfu"],
                   choices=["correctness", "sdpa", "train", "seed", "mfu"])
    r.add_argument("--json", type=Path, default=None, help="also write the results as JSON here")
    return p.parse_args(argv)


def run(args) -> int:
    code = preflight(args.device, quiet=True)
    if code:
        return code
    import common
    import torch

    if args.device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True  # as Trainer sets it
        torch.backends.cudnn.allow_tf32 = True
    rep = Report(args.budget)
    print(common.describe())
    sections = [("correctness", "1a. cached vs full, anatomy vs reference", check_correctness, 5),
                ("sdpa", "1b. which SDPA kernels anatomy's attention calls can use", check_sdpa, 2),
                ("train", "1c. short training through anatomy_cli.training.run.train", check_training, 20),
                ("seed", "2. seed-config step time", check_seed_speed, 10),
                ("mfu", "3. MFU, GPT-2-small-sized char model", check_mfu, 90)]
    try:
        for key, title, fn, need in sections:
            if key in args.sections:
                rep.section(title, fn, need, args)
    except KeyboardInterrupt:  # gpu_check.sh's timeout sends SIGINT: report what is done
        rep.check("finished within the time limit", False, "interrupted")
    counts = [sum(c["ok"] is v for c in rep.checks) for v in (True, False, None)]
    print(f"\n{counts[0]} passed, {counts[1]} failed, {counts[2]} skipped "
          f"in {time.perf_counter() - rep.start:.0f} s")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        result = {"machine": common.machine(), "checks": rep.checks, "timings": rep.rows}
        args.json.write_text(json.dumps(result, indent=1, default=str))
    return EXIT_FAILED if rep.failed else 0


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.cmd == "preflight":
        return preflight(args.device)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())

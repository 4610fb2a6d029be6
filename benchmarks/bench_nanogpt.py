"""Training at a BPE vocabulary: `anatomy train` against nanoGPT's train.py on the same train.bin/val.bin (issue 45).

`anatomy prepare --tokenizer bpe:V` writes one prepared folder; nanoGPT reads it as it is (uint16 ids
through np.memmap, vocab_size from meta.pkl), linked into NANOGPT/data/anatomy-bench/ (nanoGPT reads
data/<dataset>/ relative to its checkout: the links live in the checkout, which is never committed here).
Both train nanoGPT's README CPU model (shakespeare-char settings: 4 layers, 4 heads, n_embd 128,
block_size 64, batch 12, dropout 0, no compile, fp32) for the same number of steps, each in its own
process with the same thread count:

  nanoGPT  python train.py config/train_shakespeare_char.py --device=cpu --compile=False --dtype=float32 ...
  anatomy  python -m anatomy_cli train --set data.source=FOLDER --set data.tokenizer=bpe:V ... (its own
           Trainer: pre-norm LayerNorm, learned positions, GELU, tied embeddings: nanoGPT's GPT)

Time per step: nanoGPT's printed `time` of each iteration after the first (iteration 0 holds its first
evaluation), averaged; anatomy's summary step_time_ms (its train loop's time inside the steps, evaluations
and logging left out). Rounds interleave the two in alternating order; the ratio anatomy / nanoGPT is
paired per round, then the median (target <= 1.1). Parameter counts are printed: nanoGPT's LayerNorms
have no bias (bias=False), anatomy's do (2 x d_model per norm), the one difference in the model.

    python benchmarks/bench_nanogpt.py --nanogpt PATH [--vocab 4096] [--mb 20] [--steps 200] [--rounds 5]
    python benchmarks/bench_nanogpt.py --nanogpt PATH --vocab 512 --mb 1 --steps 5 --rounds 1 --no-append
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench_tokenize import write_text
from common import REPO_ROOT, publish, table

DATASET = "anatomy-bench"
# nanoGPT README's CPU run of shakespeare-char, as flags of its configurator
NANOGPT_CPU = {"device": "cpu", "compile": "False", "dtype": "float32", "block_size": 64, "batch_size": 12,
               "n_layer": 4, "n_head": 4, "n_embd": 128, "dropout": 0.0, "eval_iters": 1, "log_interval": 1,
               "always_save_checkpoint": "False", "gradient_accumulation_steps": 1, "warmup_iters": 10}
ITER = re.compile(r"^iter (\d+): loss [\d.]+, time ([\d.]+)ms")


def anatomy_sets(folder: Path, vocab: int, steps: int, threads: int) -> list[str]:
    sets = {"data.source": str(folder), "data.tokenizer": f"bpe:{vocab}", "model.d_model": 128, "model.n_layer": 4,
            "model.n_head": 4, "model.n_kv_head": 4, "model.ctx_len": 64, "model.norm_type": "layernorm",
            "model.norm_pos": "pre", "model.pos_type": "learned", "model.ffn_type": "gelu",
            "model.tie_embeddings": True, "train.batch_size": 12, "train.steps": steps, "train.warmup": 10,
            "train.lr": 1e-3, "train.eval_interval": steps, "train.eval_batches": 1, "train.log_interval": steps,
            "train.sample_len": 0, "train.threads": threads, "train.device": "cpu"}
    return [f"--set={k}={json.dumps(v) if isinstance(v, str) else str(v).lower() if isinstance(v, bool) else v}"
            for k, v in sets.items()]


def run_nanogpt(checkout: Path, out: Path, steps: int, threads: int) -> tuple[float, int]:
    """(mean ms per iteration after the first, parameters) of one nanoGPT run."""
    flags = {**NANOGPT_CPU, "dataset": DATASET, "max_iters": steps, "lr_decay_iters": steps,
             "eval_interval": 10 * steps, "out_dir": str(out)}
    cmd = [sys.executable, "train.py", "config/train_shakespeare_char.py", *(f"--{k}={v}" for k, v in flags.items())]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    proc = subprocess.run(cmd, cwd=checkout, env=env, capture_output=True, text=True)
    if proc.returncode:
        sys.exit(f"nanoGPT failed ({proc.returncode}): {proc.stderr[-2000:]}")
    times = [float(m.group(2)) for line in proc.stdout.splitlines() if (m := ITER.match(line)) and int(m.group(1)) > 0]
    params = int(float(re.search(r"number of parameters: ([\d.]+)M", proc.stdout).group(1)) * 1e6)
    return statistics.fmean(times), params


def run_anatomy(folder: Path, out: Path, vocab: int, steps: int, threads: int) -> tuple[float, int]:
    """(step_time_ms, parameters) of one `anatomy train` run."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT / "src"), "OMP_NUM_THREADS": str(threads)}
    cmd = [sys.executable, "-m", "anatomy_cli", "train", *anatomy_sets(folder, vocab, steps, threads),
           "--out", str(out)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode:
        sys.exit(f"anatomy failed ({proc.returncode}): {proc.stderr[-2000:]}")
    summary = json.loads((out / "summary.json").read_text())
    return summary["step_time_ms"], summary["params"]


def link_dataset(checkout: Path, folder: Path) -> Path:
    """NANOGPT/data/anatomy-bench/{train,val}.bin and meta.pkl as links to the prepared folder's files."""
    target = checkout / "data" / DATASET
    target.mkdir(parents=True, exist_ok=True)
    for name in ("train.bin", "val.bin", "meta.pkl"):
        (target / name).unlink(missing_ok=True)
        (target / name).symlink_to(folder / name)
    return target


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nanogpt", type=Path, required=True, help="a nanoGPT checkout (github karpathy/nanoGPT)")
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--mb", type=int, default=20, help="MB of generated text to prepare")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-append", action="store_true")
    a = ap.parse_args()
    checkout = a.nanogpt.resolve()
    if not (checkout / "train.py").is_file():
        sys.exit(f"{checkout} is not a nanoGPT checkout (no train.py)")
    rows, ratios = [], []
    with tempfile.TemporaryDirectory(prefix="anatomy-nanogpt-") as tmp:
        text, folder = Path(tmp) / "text.txt", Path(tmp) / "prepared"
        write_text(text, a.mb * 1_000_000)
        env = {**os.environ, "PYTHONPATH": str(REPO_ROOT / "src")}
        subprocess.run([sys.executable, "-m", "anatomy_cli", "prepare", str(text), "--tokenizer", f"bpe:{a.vocab}",
                        "--out", str(folder), "--ctx-len", "64"], env=env, check=True, stdout=subprocess.DEVNULL)
        linked = link_dataset(checkout, folder)
        try:
            for r in range(a.rounds):
                sides = {"anatomy": lambda: run_anatomy(folder, Path(tmp) / f"a{r}", a.vocab, a.steps, a.threads),
                         "nanoGPT": lambda: run_nanogpt(checkout, Path(tmp) / f"n{r}", a.steps, a.threads)}
                order = list(sides) if r % 2 == 0 else list(sides)[::-1]
                got = {name: sides[name]() for name in order}
                ratios.append(got["anatomy"][0] / got["nanoGPT"][0])
                rows.append([r, " -> ".join(order), f"{got['anatomy'][0]:.2f}", f"{got['nanoGPT'][0]:.2f}",
                             f"{ratios[-1]:.3f}"])
                print(rows[-1], flush=True)
        finally:
            for name in ("train.bin", "val.bin", "meta.pkl"):
                (linked / name).unlink(missing_ok=True)
            linked.rmdir()
    lines = [f"- nanoGPT {checkout} (README CPU settings: L4 H4 d128 T64 B12, fp32, no compile); bpe:{a.vocab} on "
             f"{a.mb} MB of generated text; {a.steps} steps, {a.threads} threads; params anatomy "
             f"{got['anatomy'][1]:,}, nanoGPT {got['nanoGPT'][1]:,}", "",
             *table(["round", "order", "anatomy ms/step", "nanoGPT ms/step", "ratio"], rows),
             "", f"- median ratio anatomy / nanoGPT: {statistics.median(ratios):.3f} (target <= 1.1)"]
    publish("anatomy train against nanoGPT's train.py at a BPE vocabulary (bench_nanogpt.py)", lines,
            not a.no_append)


if __name__ == "__main__":
    main()

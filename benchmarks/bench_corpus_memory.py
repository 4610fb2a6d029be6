"""Peak resident memory of `anatomy prepare` and `anatomy train` on a generated large corpus.

Each command runs as its own process at toy model size for a few steps; its peak RSS comes from
os.wait4's rusage (ru_maxrss) and is reported as a ratio to the corpus size in bytes (issue 5: a
200 MB corpus must train under 4x its size). The same text is also written as JSON Lines, one
document per line (issue 21: preparing it must not grow with its size: compare --mb 50 and 200).
`--src` measures another checkout's src/ folder; `--only prepare` runs the cases whose name starts with it.

    python benchmarks/bench_corpus_memory.py [--mb 200] [--src PATH] [--only TEXT] [--append]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TOY = {"model.d_model": 32, "model.n_layer": 2, "model.n_head": 4, "model.n_kv_head": 4, "model.ctx_len": 64,
       "train.steps": 3, "train.batch_size": 4, "train.eval_interval": 3, "train.eval_batches": 2,
       "train.sample_len": 0, "train.warmup": 1, "train.threads": 1}


def write_corpus(path: Path, n_bytes: int) -> None:
    """Markdown-ish prose, mostly ASCII with a few accented words, cut on a character boundary."""
    rng = random.Random(0)
    words = ("the model reads a token and predicts the next one while the norm keeps the scale steady and "
             "rope turns queries and keys by their position so attention sees distance café naïve").split()
    lines = [" ".join(rng.choice(words) for _ in range(rng.randint(4, 14))) for _ in range(20000)]
    block = ("\n".join(("## " + s.title()) if rng.random() < 0.1 else s.capitalize() + "." for s in lines)
             + "\n").encode()
    with open(path, "wb") as f:  # block by block: this process stays small, and a child's ru_maxrss
        for _ in range(n_bytes // len(block)):  # counts the image it was forked from
            f.write(block)
        f.write(block[: n_bytes % len(block)].decode("utf-8", errors="ignore").encode())


def write_jsonl(text: Path, path: Path, doc_chars: int = 1000) -> None:
    """The text as JSON Lines {"text": ...}, one document per about doc_chars characters, cut at line ends."""
    with open(text, encoding="utf-8") as src, open(path, "w", encoding="utf-8") as out:
        doc: list[str] = []
        for line in src:
            doc.append(line)
            if sum(map(len, doc)) >= doc_chars:
                out.write(json.dumps({"text": "".join(doc).rstrip("\n")}) + "\n")
                doc = []
        if doc:
            out.write(json.dumps({"text": "".join(doc).rstrip("\n")}) + "\n")


def peak_rss(args: list[str], src: Path) -> tuple[int, int]:
    """(exit code, peak RSS in bytes) of `python -m anatomy_cli ARGS` with src on the path."""
    env = {**os.environ, "PYTHONPATH": str(src), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "anatomy_cli", *args], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    return os.waitstatus_to_exitcode(status), usage.ru_maxrss * 1024  # Linux: KiB


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=200)
    ap.add_argument("--src", type=Path, default=REPO / "src")
    ap.add_argument("--only", default="", help="run only the cases whose name starts with this")
    ap.add_argument("--append", action="store_true", help="append the table to benchmarks/RESULTS.md")
    a = ap.parse_args()
    sets = [f"--set={k}={v}" for k, v in TOY.items()]
    with tempfile.TemporaryDirectory(prefix="anatomy-mem-") as tmp:
        corpus, prepared, jsonl = Path(tmp) / "big.txt", Path(tmp) / "prepared", Path(tmp) / "big.jsonl"
        write_corpus(corpus, a.mb * 1_000_000)
        write_jsonl(corpus, jsonl)
        size, jsonl_size = corpus.stat().st_size, jsonl.stat().st_size
        cases = {
            "train (default corpus: torch + model only)": ["train", *sets, "--out", f"{tmp}/r0"],
            "train from the text file": ["train", *sets, f'--set=data.source="{corpus}"', "--out", f"{tmp}/r1"],
            "prepare": ["prepare", str(corpus), "--out", str(prepared), "--ctx-len", "64"],
            "train from the prepared folder": ["train", *sets, f'--set=data.source="{prepared}"', "--out", f"{tmp}/r2"],
            "prepare from JSON Lines": ["prepare", str(jsonl), "--out", f"{tmp}/pj", "--ctx-len", "64"],
        }
        rows = ["| command | exit | peak RSS | / corpus bytes |", "|---|---|---|---|"]
        for name, args in ((n, c) for n, c in cases.items() if n.startswith(a.only)):
            code, rss = peak_rss(args, a.src)
            rows.append(f"| {name} | {code} | {rss / 2**20:,.0f} MiB | {rss / size:.2f}x |")
            print(rows[-1], flush=True)
    text = (f"\n## Corpus memory (bench_corpus_memory.py)\n\n- corpus: {size:,} bytes ({jsonl_size:,} as JSON Lines), "
            f"src: {a.src}\n\n"
            + "\n".join(rows) + "\n")
    if a.append:
        with open(REPO / "benchmarks" / "RESULTS.md", "a", encoding="utf-8") as f:
            f.write(text)


if __name__ == "__main__":
    main()

"""`anatomy prepare --tokenizer bpe:N` against the `tokenizers` library alone doing the same work (issue 45).

Both sides train a byte-level BPE of N tokens (ByteLevel pre-tokenizer and decoder, one special, the 256
bytes as the initial alphabet) on the first 90 % of a generated text (English prose with Chinese
sentences: bytes are not characters) and encode both splits into uint16 train.bin / val.bin. anatomy
adds what a prepared folder holds beyond that: the first pass (length, sha256, characters seen), the byte
check of every piece, the fingerprint, meta.json and meta.pkl. Each side runs as its own process
(`python -m anatomy_cli prepare` / `python -c REFERENCE`), timed by wall clock, its peak RSS from
os.wait4; rounds interleave the two in alternating order, and the ratio anatomy / library is paired per
round (target: within 1.25x at 100 MB). The reference's files must equal anatomy's byte for byte (the
same tokenizer, the same ids): a speed-up that changed the output would not count.

Peak memory: `--mb 100,400` prepares both sizes; anatomy's memory must not grow with the corpus (its
tokenizer training holds the word-count table, not the text).

    python benchmarks/bench_tokenize.py [--mb 100,400] [--vocab 8192] [--rounds 3] [--threads 2] [--no-append]
    python benchmarks/bench_tokenize.py --mb 2 --rounds 1 --vocab 1024 --no-append     # toy size: proves it runs
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]  # common.py (torch) is imported only to publish: a child
# process's ru_maxrss counts the image it was forked from, and this one stays small until then

# The library alone: the same trainer, splits and files, read in lines (what a user of tokenizers writes).
REFERENCE = r"""
import sys, numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
text_path, out, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
with open(text_path, encoding="utf-8") as f:
    chars = sum(len(line) for line in f)
boundary = chars - int(chars * 0.1)

def split(part):  # the lines of the train (0) or val (1) split, the straddling line cut at the boundary
    seen = 0
    with open(text_path, encoding="utf-8") as f:
        for line in f:
            lo, hi = seen, seen + len(line)
            seen = hi
            piece = line[max(0, boundary - lo):] if part else line[: max(0, boundary - lo)]
            if piece:
                yield piece

tok = Tokenizer(models.BPE())
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
tok.decoder = decoders.ByteLevel()
trainer = trainers.BpeTrainer(vocab_size=n, special_tokens=["<|endoftext|>"], show_progress=False,
                              initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
tok.train_from_iterator(split(0), trainer)
tok.encode_special_tokens = True
for part, name in ((0, "train.bin"), (1, "val.bin")):
    with open(f"{out}/{name}", "wb") as f:
        batch = []
        for line in split(part):
            batch.append(line)
            if len(batch) == 4096:
                np.array([i for e in tok.encode_batch_fast(batch, add_special_tokens=False) for i in e.ids],
                         dtype=np.uint16).tofile(f)
                batch = []
        if batch:
            np.array([i for e in tok.encode_batch_fast(batch, add_special_tokens=False) for i in e.ids],
                     dtype=np.uint16).tofile(f)
tok.save(f"{out}/tokenizer.json")
"""

SYLLABLES = "ka to ri mo na se lu pe di ra vo ne shi ten ar el ing ost qu am".split()
HANZI = "".join(chr(0x4E00 + i) for i in range(0, 2000, 4))  # 500 CJK ideographs, 3 UTF-8 bytes each


def write_text(path: Path, n_bytes: int, seed: int = 0) -> None:
    """Prose over a Zipf-distributed vocabulary of made-up words (so a BPE of thousands of tokens has pairs to
    merge), one line in five Chinese; written block by block and cut on a character boundary."""
    rng = random.Random(seed)
    words = ["".join(rng.choice(SYLLABLES) for _ in range(rng.randint(1, 4))) for _ in range(30000)]
    weights = [1 / (i + 1) for i in range(len(words))]
    lines = []
    for _ in range(20000):
        if rng.random() < 0.2:
            lines.append("".join(rng.choice(HANZI) for _ in range(rng.randint(8, 40))) + "。")
        else:
            line = " ".join(rng.choices(words, weights, k=rng.randint(4, 16)))
            lines.append(line.capitalize() + rng.choice([".", ",", "?", " 42.", " (café)."]))
    block = ("\n".join(lines) + "\n").encode()
    with open(path, "wb") as f:
        for _ in range(n_bytes // len(block)):
            f.write(block)
        f.write(block[: n_bytes % len(block)].decode("utf-8", errors="ignore").encode())


def run(cmd: list[str], threads: int) -> tuple[float, int, int]:
    """(wall seconds, peak RSS bytes, exit code) of one process."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT / "src"), "OMP_NUM_THREADS": str(threads),
           "RAYON_NUM_THREADS": str(threads), "TOKENIZERS_PARALLELISM": "true"}
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    code = os.waitstatus_to_exitcode(status)
    if code:
        sys.exit(f"{cmd[:4]} failed ({code}): {proc.stderr.read().decode()[-2000:]}")
    return wall, usage.ru_maxrss * 1024, code


def same_files(a: Path, b: Path) -> bool:
    return all((a / n).read_bytes() == (b / n).read_bytes() for n in ("train.bin", "val.bin"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", default="100,400", help="corpus sizes in MB; the first is timed against the library")
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-append", action="store_true")
    a = ap.parse_args()
    sizes = [int(x) for x in a.mb.split(",")]
    rows, ratios, memory = [], [], []
    with tempfile.TemporaryDirectory(prefix="anatomy-tok-") as tmp:
        for k, mb in enumerate(sizes):
            text = Path(tmp) / f"text{mb}.txt"
            write_text(text, mb * 1_000_000)
            ours = [sys.executable, "-m", "anatomy_cli", "prepare", str(text), "--tokenizer", f"bpe:{a.vocab}",
                    "--ctx-len", "64"]
            lib = [sys.executable, "-c", REFERENCE, str(text)]
            for r in range(a.rounds if k == 0 else 1):
                out_a, out_b = Path(tmp) / f"a{mb}-{r}", Path(tmp) / f"b{mb}-{r}"
                out_b.mkdir()
                sides = {"anatomy": ours + ["--out", str(out_a)], "tokenizers": lib + [str(out_b), str(a.vocab)]}
                order = list(sides) if r % 2 == 0 else list(sides)[::-1]
                got = {name: run(sides[name], a.threads) for name in (order if k == 0 else ["anatomy"])}
                if k == 0:
                    if not same_files(out_a, out_b):
                        sys.exit("anatomy's ids differ from the library's: the comparison would not be fair")
                    ratios.append(got["anatomy"][0] / got["tokenizers"][0])
                    rows.append([mb, r, f"{got['anatomy'][0]:.1f}", f"{got['tokenizers'][0]:.1f}",
                                 f"{ratios[-1]:.3f}", f"{got['anatomy'][1] / 2**20:,.0f}",
                                 f"{got['tokenizers'][1] / 2**20:,.0f}"])
                memory.append([mb, f"{got['anatomy'][1] / 2**20:,.0f}", f"{got['anatomy'][0]:.1f}"])
                for out in (out_a, out_b):
                    subprocess.run(["rm", "-rf", str(out)], check=True)
            text.unlink()
    from common import publish, table

    lines = [f"- byte-level BPE of {a.vocab} tokens, {a.threads} threads; rounds interleaved, order alternating; "
             f"the two sides' train.bin/val.bin equal byte for byte", "",
             *table(["MB", "round", "anatomy s", "tokenizers s", "ratio", "anatomy MiB", "tokenizers MiB"], rows),
             "", f"- median ratio anatomy / tokenizers: {statistics.median(ratios):.3f} (target <= 1.25)", "",
             *table(["MB", "anatomy peak RSS MiB", "anatomy s"], memory)]
    publish("prepare --tokenizer bpe:N against the tokenizers library (bench_tokenize.py)", lines, not a.no_append)


if __name__ == "__main__":
    main()

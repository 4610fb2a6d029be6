"""Red team: hostile inputs and faults against the CLI, each a small shell-level case run as a
subprocess (with a timeout, in a fresh temp dir), against one or more builds of anatomy.

Each target is LABEL=PYTHON[:PYTHONPATH]; the same cases run against each, and a markdown table
(case | target | target ...) is printed. A cell reads `ok`/`BAD`, the exit code, the first stderr
line (truncated), the wall time, and what made it bad (a traceback, "internal error", exit 1, a
multi-line error, a process left behind, a lock left, a check of the case's own).

    python benchmarks/hostile.py \
        --target before=/work/main/.venv/bin/python:/work/frozen/src \
        --target after=.venv/bin/python:src [--only SUBSTRING] [--json out.json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

WORDS = ("the model reads a token and predicts the next one while the norm keeps the scale steady "
         "and rope turns queries and keys by their position so attention sees distance").split()
TINY = ["model.d_model=32", "model.n_layer=2", "model.n_head=4", "model.ctx_len=32", "train.batch_size=4",
        "train.eval_interval=4", "train.eval_batches=2", "train.sample_len=0", "train.warmup=1", "train.steps=8"]


def text(n: int = 8000) -> str:
    rng = random.Random(0)
    return " ".join(rng.choice(WORDS) for _ in range(n // 5))[:n]


@dataclass
class Target:
    label: str
    python: str
    pythonpath: str

    def cli(self) -> list[str]:
        return [self.python, "-m", "anatomy_cli"]

    def env(self) -> dict:
        env = {**os.environ, "COLUMNS": "200", "PYTHONUNBUFFERED": "1"}
        if self.pythonpath:
            env["PYTHONPATH"] = self.pythonpath
        return env


@dataclass
class Ctx:
    """What a case sees: its temp dir, the target, and a helper to run the CLI there."""
    tmp: Path
    target: Target
    notes: list[str] = field(default_factory=list)

    def corpus(self, n: int = 8000) -> Path:
        p = self.tmp / "tiny.txt"
        if not p.exists():
            p.write_text(text(n), encoding="utf-8")
        return p

    def sets(self, *extra: str, steps: int | None = None) -> list[str]:
        out = [f"--set=data.source={json.dumps(str(self.corpus()))}"]
        out += [f"--set={s}" for s in TINY + list(extra)]
        return out + ([f"--set=train.steps={steps}"] if steps else [])

    def spec(self, body: str = "", flips: list[str] | None = None, top: str = "", name: str = "s") -> Path:
        lines = [f'name = "{name}"', f"flips = {json.dumps(flips or [])}" if flips is not None else "", top,
                 "[base.model]", "d_model = 32", "n_layer = 2", "n_head = 4", "ctx_len = 32",
                 "[base.train]", "steps = 4", "batch_size = 4", "eval_interval = 2", "eval_batches = 1",
                 "sample_len = 0", "warmup = 1", "[base.data]", f'source = "{self.corpus()}"', body]
        p = self.tmp / f"{name}.toml"
        p.write_text("\n".join(lines) + "\n", encoding="utf-8")
        return p

    def run(self, *args, timeout: float = 120, prefix: str = "") -> subprocess.CompletedProcess:
        """The CLI (or `prefix` shell + the CLI) in the case's dir; returns the finished process."""
        cmd = self.target.cli() + [str(a) for a in args]
        if prefix:
            cmd = ["sh", "-c", prefix + ' "$@"', "sh"] + cmd
        return subprocess.run(cmd, cwd=self.tmp, env=self.target.env(), capture_output=True, text=True,
                              timeout=timeout, errors="replace")

    def start(self, *args) -> subprocess.Popen:
        return subprocess.Popen(self.target.cli() + [str(a) for a in args], cwd=self.tmp, env=self.target.env(),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, errors="replace",
                                start_new_session=True)

    def train_run(self, out: str = "run", *extra: str, steps: int = 8, timeout: float = 300) -> Path:
        r = self.run("train", *self.sets(*extra, steps=steps), "--out", self.tmp / out, timeout=timeout)
        if r.returncode:
            raise RuntimeError(f"setup train failed: {r.stderr.strip()[:200]}")
        return self.tmp / out


def wait_for(cond: Callable[[], bool], timeout: float = 120, every: float = 0.05) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(every)
    return False


def group_alive(pgid: int) -> list[str]:
    """Processes still in a process group (what a signalled command left behind)."""
    out = subprocess.run(["ps", "-o", "pid=,stat=,args=", "-g", str(pgid)], capture_output=True, text=True).stdout
    return [line.strip()[:80] for line in out.splitlines() if line.strip() and " Z" not in line[:20]]


# --------------------------------------------------------------------------- cases
# A case returns a CompletedProcess-like (returncode, stderr) and may append problems to ctx.notes
# (something lost, a process left, a wrong flag named); `want` is the exit codes that are right.

CASES: list[tuple[str, Callable[[Ctx], subprocess.CompletedProcess], tuple[int, ...]]] = []


def case(name: str, want: tuple[int, ...] = (2,)):
    def deco(fn):
        CASES.append((name, fn, want))
        return fn
    return deco


def comp_case(name: str, body: str, cmd: str = "components", top: str = "", flips=("c",), want=(2,)):
    def fn(c: Ctx):
        spec = c.spec(f"[components.c]\n{body}", flips=list(flips), top=top)
        args = {"components": ["components", spec], "dry-run": ["ablate", spec, "--dry-run", "--runs-dir", "runs"]}[cmd]
        return c.run(*args)
    case(name, want)(fn)


# issue 18 causes 1-4 (components and ablate --dry-run)
comp_case("c1 on model.qk_norm=\"maybe\" (bool) / components", 'on = {"model.qk_norm" = "maybe"}')
comp_case("c1 on model.qk_norm=true (bool) / ablate --dry-run", 'on = {"model.qk_norm" = true}', cmd="dry-run",
          want=(0,))
comp_case("c1 on train.schedule=\"steep\" (Literal)", 'on = {"train.schedule" = "steep"}')
comp_case("c1 on model.pos_type=\"learned\" with rope (conflict)", 'on = {"model.pos_type" = "learned"}',
          cmd="dry-run", flips=("c", "rope"))
comp_case("c1 on data.source=5 (str)", 'on = {"data.source" = 5}', cmd="dry-run")
comp_case("c1 qk_norm = \"yes\" (pydantic reads it as true)", 'on = {"model.qk_norm" = "yes"}', want=(0, 2))
comp_case("c2 off = {} / components", 'off = {}\non = {"train.lr" = 0.01}', want=(0,))
comp_case("c3 n_head = 3 (d_model 32) / components", 'on = {"model.n_head" = 3}')
comp_case("c3 rope_base = inf / components", 'on = {"model.rope_base" = inf}')
comp_case("c4 about = \"[/bold] ...\"", 'on = {"train.lr" = 0.01}\nabout = "[/bold] oops [red"', want=(0,))


@case("c5 factorial over 24 components, ulimit -v 4000000")
def _(c: Ctx):
    keys = ["train.lr=0.002", "train.min_lr_frac=0.2", "train.warmup=2", "train.weight_decay=0.0",
            "train.grad_clip=0.5",
            "train.z_loss=0.0001", "train.eval_interval=3", "train.eval_batches=2", "train.log_interval=3",
            "train.diverge_factor=4.0", "train.threads=1", "train.sample_temp=0.5", "train.sample_len=1",
            "train.batch_size=2", "train.steps=3", "train.beta1=0.8", "train.beta2=0.9",
            "model.rope_base=500.0", "model.norm_eps=1e-6", "model.logit_softcap=30.0", "model.n_head=2",
            "model.n_kv_head=2", "model.d_model=64", "data.val_frac=0.2"]
    body = "\n".join(f'[components.c{i}]\non = {{"{k.split("=")[0]}" = {k.split("=")[1]}}}' for i, k in enumerate(keys))
    spec = c.spec(body, flips=[f"c{i}" for i in range(24)], top='design = "factorial"')
    return c.run("ablate", spec, "--dry-run", "--runs-dir", "runs", prefix="ulimit -v 4000000;", timeout=120)


def signalled_time(c: Ctx, sig: int) -> subprocess.CompletedProcess:
    """`ablate --time`, a signal once a timing worker is seen, then: a process left? the lock left?"""
    runs = c.tmp / "runs"
    args = ["ablate", c.spec(flips=["rope", "swiglu"]), "--time", "--time-steps", "50", "--time-rounds", "20",
            "--runs-dir", runs]
    r = signalled(c, sig, args, lambda p: len(group_alive(p.pid)) > 1)
    if runs.exists() and list(runs.rglob(".lock")):
        c.notes.append("lock left")
    return r


case("c6 ablate --time then SIGTERM", (130,))(lambda c: signalled_time(c, signal.SIGTERM))
case("c6 ablate --time then SIGHUP", (130,))(lambda c: signalled_time(c, signal.SIGHUP))
case("c6 ablate --time then SIGINT", (130,))(lambda c: signalled_time(c, signal.SIGINT))


def interrupted_run(c: Ctx, source: str, steps: int = 200) -> Path:
    """A train run SIGTERMed once it has logged an evaluation (so it is resumable)."""
    out = c.tmp / "run"
    args = [a if not a.startswith("--set=data.source=") else f"--set=data.source={json.dumps(source)}"
            for a in c.sets(steps=steps)]
    p = c.start("train", *args, "--out", out)
    wait_for(lambda: (out / "metrics.jsonl").exists() and (out / "metrics.jsonl").stat().st_size > 0
             or p.poll() is not None, 120)
    p.send_signal(signal.SIGTERM)
    p.communicate(timeout=60)
    return out


@case("c7 resume after editing a prepared corpus's train.bin")
def _(c: Ctx):
    data = c.tmp / "prep"
    r = c.run("prepare", c.corpus(), "--out", data, "--ctx-len", "32")
    if r.returncode:
        return r
    run = interrupted_run(c, str(data), steps=200)
    b = bytearray((data / "train.bin").read_bytes())
    b[10], b[11] = b[11], b[10] if b[10] != b[11] else (b[10] ^ 1)
    b[20:40] = b[40:60]
    (data / "train.bin").write_bytes(bytes(b))
    return c.run("train", "--resume", run, timeout=40)  # a timeout: it trains on with the edited data


# weak cases from the issue
@case("w resume with --steps/--set it would ignore")
def _(c: Ctx):
    run = interrupted_run(c, str(c.corpus()))
    return c.run("train", "--resume", run, "--steps", "99", "--set", "model.d_model=64", timeout=40)


@case("w resume with --device cpu (ignored?)")
def _(c: Ctx):
    run = interrupted_run(c, str(c.corpus()))
    return c.run("train", "--resume", run, "--device", "cpu", timeout=40)


def tmpfs_ok() -> bool:
    try:
        return subprocess.run(["unshare", "-rm", "sh", "-c", "mount -t tmpfs -o size=4k tmpfs /mnt"],
                              capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@case("w full disk (64 KiB tmpfs) during train")
def _(c: Ctx):
    if not tmpfs_ok():
        c.notes.append("SKIP: cannot mount a tmpfs (unshare -rm)")
        return subprocess.CompletedProcess([], 2, "", "skipped")
    mnt = c.tmp / "mnt"
    mnt.mkdir()
    cmd = " ".join(f"'{a}'" for a in c.target.cli() + ["train", *c.sets(steps=8), "--out", str(mnt / "run")])
    env = c.target.env()
    return subprocess.run(["unshare", "-rm", "sh", "-c", f"mount -t tmpfs -o size=64k tmpfs {mnt} && {cmd}"],
                          cwd=c.tmp, env=env, capture_output=True, text=True, timeout=120, errors="replace")


@case("w warnings on stderr (a plain train)", (0,))
def _(c: Ctx):
    r = c.run("train", *c.sets(steps=4), "--out", c.tmp / "run")
    if "Warning" in r.stderr or "warn" in r.stderr.lower():
        c.notes.append("a warning on stderr")
    return r


@case("w run folder inside a run folder (--out RUN/sub)")
def _(c: Ctx):
    run = c.train_run("run", steps=2)
    return c.run("train", *c.sets(steps=2), "--out", run / "sub")


@case("w --runs-dir inside a run folder (ablate)")
def _(c: Ctx):
    run = c.train_run("run", steps=2)
    return c.run("ablate", c.spec(flips=["rope"]), "--runs-dir", run, "--steps", "2", "--seeds", "1")


def names_flag(flag: str):
    def check(c: Ctx, r):
        if flag not in r.stderr:
            c.notes.append(f"does not name {flag}")
        return r
    return check


def flag_case(name: str, flag: str, args_fn):
    def fn(c: Ctx):
        return names_flag(flag)(c, c.run(*args_fn(c)))
    case(name)(fn)


flag_case("w train --steps -3 names --steps", "--steps", lambda c: ["train", *c.sets(), "--steps", "-3", "--out", "r"])
flag_case("w train --dtype float16 names --dtype", "--dtype", lambda c: ["train", *c.sets(), "--dtype", "float16"])
flag_case("w ablate --steps 0 names --steps", "--steps",
          lambda c: ["ablate", c.spec(flips=["rope"]), "--steps", "0", "--dry-run"])
flag_case("w ablate --device tpu names --device", "--device",
          lambda c: ["ablate", c.spec(flips=["rope"]), "--device", "tpu", "--dry-run"])
flag_case("w train --device cuda (no GPU) names --device", "--device:",
          lambda c: ["train", *c.sets(), "--device", "cuda", "--out", "r"])
flag_case("w ablate --flip nosuch names --flip", "--flip",
          lambda c: ["ablate", c.spec(flips=["rope"]), "--flip", "nosuch", "--dry-run"])


# our own
@case("o d_model = 10**9")
def _(c: Ctx):
    return c.run("train", *c.sets("model.d_model=1000000000"), "--out", "r", prefix="ulimit -v 8000000;")


@case("o n_layer = 10**6, ctx_len 10**7")
def _(c: Ctx):
    return c.run("train", *c.sets("model.n_layer=1000000", "model.ctx_len=10000000"), "--out", "r",
                 prefix="ulimit -v 8000000;")


@case("o train.seed = -1", (0, 2))
def _(c: Ctx):
    return c.run("train", *c.sets("train.seed=-1", steps=2), "--out", "r")


@case("o train --steps 0")
def _(c: Ctx):
    return c.run("train", *c.sets(), "--steps", "0", "--out", "r")


@case("o ablate --seeds 0")
def _(c: Ctx):
    return c.run("ablate", c.spec(flips=["rope"]), "--seeds", "0", "--dry-run")


@case("o spec that is not TOML")
def _(c: Ctx):
    (c.tmp / "bad.toml").write_text("name = [unclosed\n[[[x\n")
    return c.run("ablate", "bad.toml", "--dry-run")


@case("o spec that is not UTF-8")
def _(c: Ctx):
    (c.tmp / "bad.toml").write_bytes(b'name = "\xff\xfe caf\xe9"\n')
    return c.run("components", "bad.toml")


@case("o spec saved with a UTF-8 BOM", (0,))
def _(c: Ctx):
    spec = c.spec(flips=["rope"])
    spec.write_bytes(b"\xef\xbb\xbf" + spec.read_bytes())
    return c.run("components", spec)


@case("o moe_experts = 10**6 at d_model 32 (names the field)")
def _(c: Ctx):
    r = c.run("train", *c.sets("model.moe=true", "model.moe_experts=1000000"), "--out", "r")
    return names_flag("moe_experts=1000000")(c, r)


@case("o spec is a directory")
def _(c: Ctx):
    (c.tmp / "d.toml").mkdir()
    return c.run("ablate", "d.toml", "--dry-run")


@case("o train spec is a directory")
def _(c: Ctx):
    (c.tmp / "d.toml").mkdir()
    return c.run("train", "d.toml")


@case("o spec missing")
def _(c: Ctx):
    return c.run("components", "nope.toml")


@case("o --runs-dir is a file (ablate)")
def _(c: Ctx):
    (c.tmp / "runsfile").write_text("x")
    return c.run("ablate", c.spec(flips=["rope"]), "--runs-dir", "runsfile", "--steps", "2", "--seeds", "1")


@case("o --runs-dir is a file (train)")
def _(c: Ctx):
    (c.tmp / "runsfile").write_text("x")
    return c.run("train", *c.sets(steps=2), "--runs-dir", "runsfile")


@case("o report on an empty dir", (1, 2))
def _(c: Ctx):
    (c.tmp / "empty").mkdir()
    return c.run("report", "empty")


@case("o report on a missing dir")
def _(c: Ctx):
    return c.run("report", "missing")


@case("o report on a file")
def _(c: Ctx):
    (c.tmp / "f").write_text("x")
    return c.run("report", "f")


@case("o report --format xml")
def _(c: Ctx):
    (c.tmp / "empty").mkdir()
    return c.run("report", "empty", "--format", "xml")


@case("o sample --window 10**12", (0, 2))
def _(c: Ctx):
    run = c.train_run("run", steps=2)
    return c.run("sample", run, "--window", str(10**12), "--max-new", "5", prefix="ulimit -v 8000000;")


@case("o sample --window 0 / -1")
def _(c: Ctx):
    run = c.train_run("run", steps=2)
    r = c.run("sample", run, "--window", "-1", "--max-new", "5")
    return names_flag("--window")(c, r)


@case("o sample --max-new -5 / --top-k 0")
def _(c: Ctx):
    run = c.train_run("run", steps=2)
    r = c.run("sample", run, "--top-k", "0", "--max-new", "5")
    return names_flag("--top-k")(c, r)


@case("o sample --temp nan")
def _(c: Ctx):
    run = c.train_run("run", steps=2)
    return names_flag("--temp")(c, c.run("sample", run, "--temp", "nan", "--max-new", "5"))


@case("o sample on a folder that is not a run")
def _(c: Ctx):
    (c.tmp / "notrun").mkdir()
    return c.run("sample", "notrun")


@case("o prepare a binary file")
def _(c: Ctx):
    (c.tmp / "bin").write_bytes(bytes(range(256)) * 100)
    return c.run("prepare", "bin", "--out", "p", "--ctx-len", "8")


@case("o prepare an empty file")
def _(c: Ctx):
    (c.tmp / "empty.txt").write_text("")
    return c.run("prepare", "empty.txt", "--out", "p")


@case("o prepare a missing file")
def _(c: Ctx):
    return c.run("prepare", "missing.txt", "--out", "p")


@case("o prepare --out is an existing file")
def _(c: Ctx):
    (c.tmp / "pfile").write_text("x")
    return c.run("prepare", c.corpus(), "--out", "pfile", "--ctx-len", "8")


@case("o two train --resume of one run at once", (3,))  # the cell shows the loser: 'in use', exit 3
def _(c: Ctx):
    run = interrupted_run(c, str(c.corpus()), steps=60)
    a, b = c.start("train", "--resume", run), c.start("train", "--resume", run)
    (_, ae), (_, be) = a.communicate(timeout=300), b.communicate(timeout=300)
    codes = sorted([a.returncode, b.returncode])
    if codes != [0, 3] and codes != [0, 2]:
        c.notes.append(f"exit codes {codes} (want one winner: 0 and 'in use')")
    loser = ae if a.returncode else be
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    steps = [rec.get("step") for rec in lines if "val_loss" in rec]
    if len(steps) != len(set(steps)):
        c.notes.append("duplicate metrics lines")
    return subprocess.CompletedProcess([], codes[-1] if codes[0] == 0 else codes[0], "", loser or ae)


@case("o SIGKILL mid-run then resume == uninterrupted", (0,))
def _(c: Ctx):
    steps = 60
    ref = c.train_run("ref", "train.eval_interval=10", steps=steps, timeout=600)
    out = c.tmp / "run"
    p = c.start("train", *c.sets("train.eval_interval=10", steps=steps), "--out", out)
    m = out / "metrics.jsonl"
    wait_for(lambda: m.exists() and m.read_text().count("val_loss") >= 3 or p.poll() is not None, 120)
    os.killpg(p.pid, signal.SIGKILL)
    p.communicate()
    r = c.run("train", "--resume", out, timeout=600)

    def vals(d):
        return [(rec["step"], rec.get("val_loss"))
                for rec in map(json.loads, (d / "metrics.jsonl").read_text().splitlines()) if "val_loss" in rec]
    if r.returncode == 0 and vals(ref) != vals(out):
        c.notes.append("metrics differ from an uninterrupted run")
    sm = json.loads((out / "summary.json").read_text()) if (out / "summary.json").exists() else {}
    c.notes.append(f"resumed from step {sm.get('resumed_from', sm.get('resumed_at', '?'))}")
    return r


@case("o swa window > ctx_len")
def _(c: Ctx):
    return c.run("train", *c.sets("model.window=64"), "--out", "r")


@case("o window_pattern LLG with n_layer 2")
def _(c: Ctx):
    return c.run("train", *c.sets("model.window=8", 'model.window_pattern="LLG"'), "--out", "r")


@case("o gdn_pattern DDA with n_layer 2")
def _(c: Ctx):
    return c.run("train", *c.sets('model.gdn_pattern="DDA"'), "--out", "r")


@case("o --set model.nosuch=1")
def _(c: Ctx):
    return c.run("train", *c.sets("model.nosuch=1"), "--out", "r")


@case("o --set without =")
def _(c: Ctx):
    return c.run("train", *c.sets("model.d_model"), "--out", "r")


@case("o ctx_len longer than the corpus")
def _(c: Ctx):
    return c.run("train", *c.sets("model.ctx_len=100000"), "--out", "r")


@case("o data.source a directory that is not prepared")
def _(c: Ctx):
    (c.tmp / "notprep").mkdir()
    return c.run("train", *c.sets(f'data.source="{c.tmp / "notprep"}"'), "--out", "r")


@case("o components | head -1 (closed pipe)", (0, 141))
def _(c: Ctx):
    return subprocess.run(["bash", "-c", " ".join(c.target.cli()) + " components | head -c 10 >/dev/null"],
                          cwd=c.tmp, env=c.target.env(), capture_output=True, text=True, timeout=60)


@case("o train --out an existing finished run")
def _(c: Ctx):
    run = c.train_run("run", steps=2)
    return c.run("train", *c.sets(steps=2), "--out", run)


@case("o export a run with learned positions")
def _(c: Ctx):
    run = c.train_run("run", 'model.pos_type="learned"', steps=2)
    return c.run("export", run, "hf")


@case("o train.lr = nan")
def _(c: Ctx):
    return c.run("train", *c.sets("train.lr=NaN"), "--out", "r")


@case("o moe top_k 4 > 2 experts")
def _(c: Ctx):
    return c.run("train", *c.sets("model.moe=true", "model.moe_experts=2", "model.moe_top_k=4"), "--out", "r")


@case("o mla kv_lora_rank 1000 > d_model 32")
def _(c: Ctx):
    return c.run("train", *c.sets('model.attn_type="mla"', "model.kv_lora_rank=1000"), "--out", "r")


def started_for(seconds: float) -> Callable[[subprocess.Popen], bool]:
    """Ready once the command has run `seconds` (a benchmark, not a test: no state to watch for)."""
    t0 = time.monotonic()
    return lambda p: time.monotonic() > t0 + seconds


def signalled(c: Ctx, sig: int, args: list, ready: Callable[[subprocess.Popen], bool]) -> subprocess.CompletedProcess:
    """A long command, a signal once `ready(process)` holds, then: exited? a process left behind?"""
    p = c.start(*args)
    if not wait_for(lambda: ready(p) or p.poll() is not None, 120) or p.poll() is not None:
        c.notes.append("not ready before it ended")
    os.kill(p.pid, sig)
    try:
        out, err = p.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        c.notes.append("did not exit in 60 s")
    wait_for(lambda: not group_alive(p.pid), 5)
    if left := group_alive(p.pid):
        c.notes.append(f"{len(left)} process(es) left")
        os.killpg(p.pid, signal.SIGKILL)
    return subprocess.CompletedProcess(p.args, p.returncode, out, err)


@case("o sample --max-new 10**6 then SIGTERM", (130,))
def _(c: Ctx):
    run = c.train_run("run", steps=2)
    return signalled(c, signal.SIGTERM, ["sample", run, "--max-new", str(10**6)],
                     started_for(5))


@case("o bench-decode then SIGHUP", (130,))
def _(c: Ctx):
    return signalled(c, signal.SIGHUP, ["bench-decode", "--new", "100000", "--ctx", "200000", "--d-model", "32",
                                        "--n-layer", "2"], started_for(5))


@case("o train then SIGHUP, then resume", (0,))
def _(c: Ctx):
    out = c.tmp / "run"
    m = out / "metrics.jsonl"
    r = signalled(c, signal.SIGHUP, ["train", *c.sets(steps=400), "--out", out],
                  lambda p: m.exists() and m.stat().st_size > 0)
    if r.returncode != 130:
        c.notes.append(f"SIGHUP exit {r.returncode}")
    return c.run("train", "--resume", out, timeout=200) if r.returncode == 130 else r


# --------------------------------------------------------------------------- running and the table


def run_case(fn, want, target: Target, timeout: float) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix="hostile-"))
    ctx = Ctx(tmp, target)
    t0 = time.perf_counter()
    try:
        r = fn(ctx)
        code, err = r.returncode, r.stderr or ""
    except subprocess.TimeoutExpired:
        code, err = "timeout", ""
        ctx.notes.append("timed out")
    except Exception as e:  # the harness' own failure is data too
        code, err = "harness", f"{type(e).__name__}: {e}"
        ctx.notes.append("harness error")
    wall = time.perf_counter() - t0
    shutil.rmtree(tmp, ignore_errors=True)
    lines = [line for line in err.strip().splitlines() if line.strip()]
    errors = [line for line in lines if line.lower().startswith(("error", "usage", "interrupted", "warning"))]
    progress = [line for line in lines if "-:--:--" in line or "%" in line and "━" in line]
    problems = [n for n in ctx.notes if not n.startswith(("resumed", "SKIP"))]
    if "Traceback" in err:
        problems.append("traceback")
    if "internal error" in err:
        problems.append("internal error")
    if code == 1:
        problems.append("exit 1")
    if code not in want and code not in ("timeout", "harness") and not any(n.startswith("SKIP") for n in ctx.notes):
        problems.append(f"want {'/'.join(map(str, want))}")
    lines = [line for line in lines if line not in progress]
    usage = code == 2 and lines and lines[0].startswith("Usage:")  # click's usage box: names the option
    if (code not in (0, "timeout") and len(lines) > 1 and not usage
            and not (errors and len(lines) <= 3 and "Traceback" not in err)):
        problems.append(f"{len(lines)}-line stderr")
    skip = any(n.startswith("SKIP") for n in ctx.notes)
    return {"code": code, "first": ((errors or [line for line in lines if line not in progress] or [""])[0])[:90],
            "wall": round(wall, 1),
            "problems": problems, "notes": ctx.notes, "verdict": "skip" if skip else ("BAD" if problems else "ok")}


def cell(r: dict) -> str:
    extra = "; ".join(r["problems"] or [n for n in r["notes"]])
    first = r["first"].replace("|", "\\|").replace("`", "'")
    return f"**{r['verdict']}** {r['code']} {r['wall']}s `{first}`" + (f" ({extra})" if extra else "")


# --------------------------------------------------------------------------- round four (issue #30)
def unchanged(c: Ctx, path: Path, before: bytes, r):
    if not path.exists() or path.read_bytes() != before:
        c.notes.append(f"{path.name} changed")
    return r


@case("r4-1 report --results RUN/summary.json")
def _(c: Ctx):
    run = c.train_run("sweep/run", steps=2)
    before = (run / "summary.json").read_bytes()
    return unchanged(c, run / "summary.json", before, c.run("report", c.tmp / "sweep", "--format", "md",
                                                            "--results", run / "summary.json"))


@case("r4-1 report --results DIR/ (a folder, typed with /)")
def _(c: Ctx):
    c.train_run("sweep/run", steps=2)
    r = c.run("report", c.tmp / "sweep", "--format", "md", "--results", f"{c.tmp / 'out'}/")
    if (c.tmp / "out").is_file():
        c.notes.append("wrote a file named out")
    return r


@case("r4-1 export --overwrite into another run")
def _(c: Ctx):
    src = c.train_run("src", "model.norm_type=rmsnorm", "model.norm_pos=pre", "model.pos_type=rope",
                      "model.ffn_type=swiglu", steps=2)
    other = c.train_run("other", steps=2)
    before = (other / "config.json").read_bytes()
    return unchanged(c, other / "config.json", before, c.run("export", src, other, "--overwrite"))


def jsonl_case(name: str, body: bytes, needle: str):
    def fn(c: Ctx):
        (c.tmp / "d.jsonl").write_bytes(body)
        r = c.run("prepare", c.tmp / "d.jsonl", "--out", c.tmp / "p")
        if needle not in r.stderr:
            c.notes.append(f"does not say {needle!r}")
        if (c.tmp / "p").exists():
            c.notes.append("--out written")
        return r
    case(name)(fn)


jsonl_case("r4-2 JSON Lines: a lone surrogate", b'{"text": "ok"}\n{"text": "a\\ud800b"}\n', "line 2")
jsonl_case("r4-2 JSON Lines: 100,000 nested arrays", b'{"text": "ok"}\n' + b"[" * 100000 + b"]" * 100000 + b"\n",
           "line 2")
jsonl_case("r4-2 JSON Lines: a non-UTF-8 byte on line 7",
           b"".join(b'{"text": "line %d"}\n' % i for i in range(6)) + b'{"text": "caf\xe9"}\n', "line 7")


@case("r4-5 scale-plan: two sizes of one parameter count", (0,))
def _(c: Ctx):
    spec = c.spec(flips=["rope"], top='seeds = 3', name="ladder")
    spec.write_text(spec.read_text() + '[[sizes]]\nname = "S"\n[sizes.model]\nctx_len = 16\n'
                    '[[sizes]]\nname = "M"\n[sizes.model]\nctx_len = 32\n', encoding="utf-8")
    r = c.run("scale-plan", spec, "--no-estimate")
    if "no trend" not in r.stdout + r.stderr:
        c.notes.append("no word that no trend can form")
    return r


@case("r4-6 --set model.ctx_len=1: refused before training")
def _(c: Ctx):
    r = c.run("train", *c.sets("model.ctx_len=1"), "--out", "r")
    if (c.tmp / "r" / "metrics.jsonl").exists():
        c.notes.append("trained first")
    return names_flag("ctx_len")(c, r)


flag_case("r4-7 ablate --stack ² names --stack", "--stack",
          lambda c: ["ablate", c.spec(flips=["rope"]), "--stack", "²", "--dry-run"])


@case("r4-7 --set train.steps=true (a bool for an int)")
def _(c: Ctx):
    return names_flag("train.steps")(c, c.run("train", *c.sets("train.steps=true"), "--out", "r"))


@case("r4-4 SIGKILL of scale-plan while it calibrates leaves no process", (-9,))
def _(c: Ctx):
    spec = c.spec(flips=["rope"], name="cal")
    env_cache = c.tmp / "cache"
    proc = subprocess.Popen(c.target.cli() + ["scale-plan", str(spec)], cwd=c.tmp,
                            env={**c.target.env(), "ANATOMY_CACHE": str(env_cache)},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)

    def child() -> bool:
        try:
            return bool(Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split())
        except OSError:
            return False
    wait_for(lambda: child() or proc.poll() is not None)
    proc.kill()  # the parent alone, as the OOM killer does
    proc.wait()
    if not wait_for(lambda: not group_alive(proc.pid), timeout=30):
        c.notes.append(f"left behind: {group_alive(proc.pid)}")
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    return subprocess.CompletedProcess(proc.args, proc.returncode, "", "")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", action="append", help="LABEL=PYTHON[:PYTHONPATH] (repeatable)")
    ap.add_argument("--python", help="one target's python (with --pythonpath / --cwd)")
    ap.add_argument("--pythonpath", "--cwd", default="", help="its PYTHONPATH (the src folder of a checkout)")
    ap.add_argument("--only", default="", help="run cases whose name contains one of these (comma-separated)")
    ap.add_argument("--json", type=Path, help="also write the results as JSON here")
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--start", type=int, default=0, help="skip the first START cases (to finish a stopped run)")
    ap.add_argument("--stop", type=int, default=None, help="run cases before index STOP only")
    args = ap.parse_args()
    targets = []
    for t in args.target or []:
        label, _, rest = t.partition("=")
        py, _, pp = rest.partition(":")
        targets.append(Target(label, str(Path(py).absolute()), str(Path(pp).resolve()) if pp else ""))
    if args.python:
        targets.append(Target("run", str(Path(args.python).absolute()),
                              str(Path(args.pythonpath).resolve()) if args.pythonpath else ""))
    if not targets:
        sys.exit("give --target LABEL=PYTHON[:PYTHONPATH] or --python")
    results = {}
    for name, fn, want in CASES[args.start:args.stop]:
        if args.only and not any(part in name for part in args.only.split(",")):
            continue
        results[name] = {}
        for t in targets:
            results[name][t.label] = run_case(fn, want, t, args.timeout)
            print(f"{name} [{t.label}]: {cell(results[name][t.label])}", file=sys.stderr, flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    print("| case | " + " | ".join(t.label for t in targets) + " |")
    print("|---|" + "---|" * len(targets))
    for name, row in results.items():
        print(f"| {name} | " + " | ".join(cell(row[t.label]) for t in targets) + " |")
    for t in targets:
        bad = sum(r[t.label]["verdict"] == "BAD" for r in results.values())
        print(f"\n{t.label}: {bad} bad of {len(results)}", end="")
    print()


if __name__ == "__main__":
    main()

"""Power from the design (#35, item 2): the paired sd of every effect with today's init against keyed init.

Today a run seeds the global generator and builds its model (model.init_key = "order"), so a part built
early (a position table) shifts every later parameter's draw: the two arms of a pair share batches but not
initial weights. Keyed init ("name") draws each parameter from a generator keyed by (seed, its name), so
the arms share every parameter they have in common. This script measures what that buys, through the
product's own path: `anatomy ablate` trains the study twice at the same seeds, once as it is and once with
init_key = "name" in [base.model], and `anatomy report --json` reads each study's effects. Per effect it
prints the paired sd (the sd over seeds of the per-seed gain) today and keyed, their ratio, the seed
factor (sd_today / sd_keyed)^2 (how many of today's seeds one keyed seed is worth for that effect's
interval), and each arm's mean gain; then the same as a markdown table, appended to RESULTS.md.

The spec's two copies are written into RUNS_DIR (today.toml, keyed.toml): its [decide] table is dropped,
so both studies train exactly --seeds seeds (rounds would add seeds where an effect is open, differently
in each), and a relative data source is made absolute. Each study lives in RUNS_DIR/today/<name> and
RUNS_DIR/keyed/<name>; today's runs have the spec's own run ids. Rerunning resumes (ablate skips finished
runs); --reuse skips training and only reads the folders.

    python benchmarks/keyed_init.py --runs-dir runs/keyed-init             # the demo: 2 x 36 runs
    python benchmarks/keyed_init.py --runs-dir /tmp/k --steps 20 --no-append   # a toy check
    python benchmarks/keyed_init.py --runs-dir runs/keyed-init --reuse     # read the tables again
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import tomllib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

DEMO = common.REPO_ROOT / "experiments" / "demo.toml"
ARMS = {"today": "order", "keyed": "name"}  # arm -> model.init_key
LOSS = "best_val_loss"


# ------------------------------------------------------------------ the two specs


def toml_key(key: str) -> str:
    return key if key.replace("_", "").replace("-", "").isalnum() else json.dumps(key)


def toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float, str)):
        return json.dumps(v) if isinstance(v, str) else repr(v)
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{toml_key(k)} = {toml_value(x)}" for k, x in v.items()) + " }"
    raise TypeError(f"no TOML for {v!r}")


def to_toml(data: dict, table: str = "") -> str:
    """A spec dict as TOML: scalars first, then each sub-table (tomllib reads it back equal)."""
    lines = [f"[{table}]"] if table else []
    lines += [f"{toml_key(k)} = {toml_value(v)}" for k, v in data.items() if not isinstance(v, dict)]
    text = "\n".join(lines) + "\n"
    for k, v in data.items():
        if isinstance(v, dict):
            text += "\n" + to_toml(v, f"{table}.{toml_key(k)}" if table else toml_key(k))
    return text


def arm_spec(spec: Path, init_key: str) -> dict:
    """The spec as it trains in one arm: no [decide] rounds, init_key in [base.model], data made absolute."""
    data = tomllib.loads(spec.read_text(encoding="utf-8"))
    data.pop("decide", None)
    base = data.setdefault("base", {})
    if init_key != "order":  # today's arm is the spec itself: its run ids are the shipped ones
        base.setdefault("model", {})["init_key"] = init_key
    source = base.get("data", {}).get("source")
    if isinstance(source, str) and ":" not in source and (spec.parent / source).exists():
        base["data"]["source"] = str((spec.parent / source).resolve())
    return data


# ------------------------------------------------------------------ train, read


def anatomy(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "anatomy_cli", *args], cwd=common.REPO_ROOT,
                          capture_output=True, text=True)


def train(spec_file: Path, runs_dir: Path, args) -> None:
    cmd = ["ablate", str(spec_file), "--runs-dir", str(runs_dir), "--seeds", str(args.seeds)]
    cmd += ["--steps", str(args.steps)] if args.steps else []
    cmd += ["--flip", args.flip] if args.flip else []
    cmd += ["--workers", str(args.workers)] if args.workers else []
    print(f"anatomy {' '.join(cmd)}", file=sys.stderr, flush=True)
    done = subprocess.run([sys.executable, "-m", "anatomy_cli", *cmd], cwd=common.REPO_ROOT)
    if done.returncode:
        sys.exit(f"anatomy ablate failed ({done.returncode}) on {spec_file}")


def report(sweep_dir: Path) -> dict:
    """`anatomy report SWEEP_DIR --json`: report.json's document (effects, plateau, ...)."""
    done = anatomy("report", str(sweep_dir), "--json")
    if done.returncode:
        sys.exit(f"anatomy report {sweep_dir} failed:\n{done.stderr}")
    return json.loads(done.stdout)


def loss_effects(document: dict) -> dict[tuple[str, str], dict]:
    return {(e["flip"], e["direction"]): e for e in document["effects"] if e["metric"] == LOSS}


# ------------------------------------------------------------------ the tables


def rows(today: dict, keyed: dict) -> list[dict]:
    out = []
    for key in sorted(today.keys() & keyed.keys()):
        t, k = today[key], keyed[key]
        sd_t, sd_k = t.get("sd"), k.get("sd")
        ratio = sd_k / sd_t if _finite(sd_t, sd_k) and sd_t > 0 else math.nan
        out.append({"flip": key[0], "direction": key[1], "pairs": f"{t['n_pairs']}/{k['n_pairs']}",
                    "sd_today": sd_t, "sd_keyed": sd_k, "ratio": ratio,
                    "seeds_x": 1 / ratio**2 if _finite(ratio) and ratio > 0 else math.nan,
                    "gain_today": t.get("gain"), "gain_keyed": k.get("gain"),
                    "call_today": t.get("call"), "call_keyed": k.get("call")})
    return out


def _finite(*xs) -> bool:
    return all(isinstance(x, (int, float)) and math.isfinite(x) for x in xs)


def _f(x, fmt: str = ".4f") -> str:
    return format(x, fmt) if _finite(x) else "n/a"


COLUMNS = [("effect", lambda r: f"{r['flip']} {r['direction']}"), ("pairs", lambda r: r["pairs"]),
           ("sd today", lambda r: _f(r["sd_today"])), ("sd keyed", lambda r: _f(r["sd_keyed"])),
           ("keyed/today", lambda r: _f(r["ratio"], ".2f")), ("seeds x", lambda r: _f(r["seeds_x"], ".2f")),
           ("gain today", lambda r: _f(r["gain_today"], "+.4f")), ("gain keyed", lambda r: _f(r["gain_keyed"], "+.4f")),
           ("call today", lambda r: r["call_today"] or ""), ("call keyed", lambda r: r["call_keyed"] or "")]


def text_table(table: list[dict]) -> list[str]:
    cells = [[name for name, _ in COLUMNS]] + [[get(r) for _, get in COLUMNS] for r in table]
    widths = [max(len(row[i]) for row in cells) for i in range(len(COLUMNS))]
    return ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths)))
            for row in cells]


def markdown(table: list[dict]) -> list[str]:
    lines = ["| " + " | ".join(name for name, _ in COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    return lines + ["| " + " | ".join(get(r) for _, get in COLUMNS) + " |" for r in table]


def summary(table: list[dict], plateaus: dict[str, int]) -> list[str]:
    ratios = [r["ratio"] for r in table if _finite(r["ratio"]) and r["ratio"] > 0]
    if not ratios:
        return ["no effect has a paired sd in both arms"]
    geo = math.exp(statistics.fmean(math.log(x) for x in ratios))
    narrower = sum(x < 1 for x in ratios)
    return [f"paired sd keyed/today over {len(ratios)} effects: geometric mean {geo:.2f}, median "
            f"{statistics.median(ratios):.2f}, narrower in {narrower}, wider in {len(ratios) - narrower}",
            "runs on the unigram plateau (report.json's plateau): "
            + ", ".join(f"{arm} {n}" for arm, n in plateaus.items())]


# ------------------------------------------------------------------ main


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("spec", nargs="?", type=Path, default=DEMO, help="the study (default experiments/demo.toml)")
    ap.add_argument("--runs-dir", type=Path, default=Path("runs/keyed-init"),
                    help="both studies go under it: RUNS_DIR/today, RUNS_DIR/keyed (default runs/keyed-init)")
    ap.add_argument("--seeds", type=int, default=3, help="seeds, the same in both arms (default 3)")
    ap.add_argument("--steps", type=int, default=None, help="training steps per run (default: the spec's)")
    ap.add_argument("--flip", default=None, help="only these flips, e.g. rope,swiglu (ablate --flip)")
    ap.add_argument("--workers", type=int, default=None, help="ablate --workers (default: ablate's)")
    ap.add_argument("--reuse", action="store_true", help="do not train: read the studies already in RUNS_DIR")
    ap.add_argument("--no-append", action="store_true", help="print only; do not add a section to RESULTS.md")
    args = ap.parse_args(argv)
    spec = args.spec.resolve()
    runs_dir = args.runs_dir if args.runs_dir.is_absolute() else Path.cwd() / args.runs_dir
    runs_dir.mkdir(parents=True, exist_ok=True)
    effects, plateaus = {}, {}
    for arm, init_key in ARMS.items():
        data = arm_spec(spec, init_key)
        spec_file = runs_dir / f"{arm}.toml"
        spec_file.write_text(f"# {spec} for benchmarks/keyed_init.py: model.init_key = {init_key!r}, no [decide]\n"
                             + to_toml(data), encoding="utf-8")
        sweep = runs_dir / arm / data["name"]
        if not (args.reuse and sweep.is_dir()):
            train(spec_file, runs_dir / arm, args)
        document = report(sweep)
        effects[arm], plateaus[arm] = loss_effects(document), len((document.get("plateau") or {}).get("runs", []))
    table = rows(effects["today"], effects["keyed"])
    print("\n".join(text_table(table)), file=sys.stderr)
    lines = [f"{spec.name}, {args.seeds} seeds each, steps {args.steps or 'as the spec'}"
             f"{', flips ' + args.flip if args.flip else ''}; studies in {args.runs_dir}/today and /keyed. "
             "sd: the paired sd over seeds of each effect's per-seed gain in best val loss (nats/char); "
             "seeds x = (sd today / sd keyed)^2.", "", *markdown(table), "", *summary(table, plateaus)]
    common.publish("Keyed init: paired sds, today's init against keyed (keyed_init.py, #35 item 2)", lines,
                   append=not args.no_append)


if __name__ == "__main__":
    main()

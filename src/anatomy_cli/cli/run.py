"""Single-run commands registered on the app: prepare, train and sample."""

from __future__ import annotations

import functools
import json
import shlex
from pathlib import Path
from typing import Annotated, Optional

import typer

from anatomy_cli.cli.app import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    JsonOut,
    Plugins,
    RunsDir,
    Sets,
    StopFlag,
    app,
    console,
    err_console,
    handle_errors,
    load_parts,
    on_interrupt,
    styled,
    warn,
    write_out,
)
from anatomy_cli.spec.components import label
from anatomy_cli.spec.config import SEED_MAX, SEED_MIN, ConfigError
from anatomy_cli.store import runs

# ----------------------------------------------------------------------------------- prepare


@app.command()
@handle_errors
def prepare(
    source: Annotated[Optional[str], typer.Argument(
        help="A UTF-8 text file, a folder of .md/.txt, a .jsonl or .parquet file, a datasets save_to_disk folder, or "
        "hf:NAME[:CONFIG], a Hugging Face dataset streamed from the Hub (needs pip install 'anatomy-cli\\[data]'); "
        "default: the embedded corpus.", show_default=False)] = None,
    out: Annotated[Path, typer.Option("--out", help="Output directory.")] = Path("data/default"),
    val_frac: Annotated[float, typer.Option(
        min=0.01, max=0.5, help="Fraction held out for validation: the end of a text; whole documents at the end of a "
        "dataset (the one that straddles the boundary included).")] = 0.1,
    ctx_len: Annotated[int, typer.Option(min=1, help="Each split must be longer than this.")] = 128,
    field: Annotated[Optional[str], typer.Option(
        help="Datasets (.jsonl, .parquet, save_to_disk, hf:): the field that holds the text \\[default: text].",
        show_default=False)] = None,
    split: Annotated[Optional[str], typer.Option(
        help="hf: and save_to_disk datasets with splits: the split to read \\[default: train].",
        show_default=False)] = None,
    max_chars: Annotated[Optional[int], typer.Option(
        help="Datasets: take whole documents, in order, while they hold at most this many characters (50000000: 50 MB "
        "of English); meta.json says whether it cut the stream.", show_default=False)] = None,
    tokenizer: Annotated[str, typer.Option(
        help="char (one id per character); bpe:N, a byte-level BPE of N tokens (<|endoftext|> and the 256 bytes "
        "included) trained on the train split; the path of a tokenizer.json (or of a folder holding one); or "
        "hf:NAME, a tokenizer on the Hugging Face Hub. Not char: uint16 ids and meta.pkl, as nanoGPT reads them.")
    ] = "char",
    json_out: JsonOut = False,
):
    """Corpus -> vocabulary (characters, or a tokenizer) + compact train/val ids + meta.json (with the files'
    fingerprint).

    Streams: memory does not grow with the corpus. Documents are joined with a blank line.
    """
    from anatomy_cli.data.corpus import META
    from anatomy_cli.data.load import open_source
    from anatomy_cli.data.prepared import WRITTEN, check_rewrite
    from anatomy_cli.data.prepared import prepare as write_prepared
    from anatomy_cli.data.tokenizer import check_spec
    from anatomy_cli.spec.config import parse_tokenizer

    tokenizer = parse_tokenizer(tokenizer, "--tokenizer")
    # Not in a run or a sweep; an existing folder only if it is a prepared corpus or holds nothing else (its
    # meta.json would turn a folder of text a run trains on into a prepared corpus).
    runs.refuse_inside_runs(out, "--out", "prepared corpus directory")
    runs.refuse_foreign(out, "--out", "prepared corpus", lambda folder: (folder / META).is_file(),
                        WRITTEN.__contains__, only=True)
    check_rewrite(out, tokenizer)  # a folder of another tokenizer's ids is not replaced
    check_spec(tokenizer)  # a tokenizer.json that is not there or is corrupt, before reading the corpus
    src = open_source(source, field, split)
    with StopFlag(graceful=False), PrepareProgress() as progress:  # SIGTERM/SIGHUP unwind: temp files removed
        meta = write_prepared(src, out, val_frac, ctx_len, max_chars, progress, tokenizer)
    info = {k: v for k, v in meta.items() if k != "char_counts"} | {"out": str(out)}
    if json_out:
        console.print_json(json.dumps(info))
        return
    for key, value in info.items():
        if key != "fingerprint":
            shown = json.dumps(value) if key == "separator" else value
            console.print(styled(f"{key:>13}", "bold", f"  {shown}"), highlight=False, soft_wrap=True)  # paths whole


class PrepareProgress:
    """prepare's progress on stderr: a rich bar per pass on a terminal, else a line every PLAIN_S seconds."""

    PLAIN_S = 10.0
    PHASES = {"read": "read", "encode": "write ids"}

    def __enter__(self) -> PrepareProgress:
        import time

        self.clock, self.last, self.tasks = time.monotonic, time.monotonic(), {}
        self.bar = None
        if err_console.is_terminal:
            from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

            self.bar = Progress(TextColumn("[bold]{task.description:>9}"), BarColumn(),
                                TextColumn("{task.fields[info]}"), TimeElapsedColumn(), console=err_console)
            self.bar.start()
        return self

    def __call__(self, p: dict) -> None:
        name = self.PHASES[p["phase"]]
        documents = f", {p['documents']:,} documents" if p["documents"] is not None else ""
        info = f"{p['chars']:,} characters{documents}"
        if self.bar is not None:
            if name not in self.tasks:
                self.tasks[name] = self.bar.add_task(name, total=p["total"], info="")
            self.bar.update(self.tasks[name], completed=p["chars"], info=info)
        elif self.clock() - self.last >= self.PLAIN_S:
            self.last = self.clock()
            err_console.print(f"{name}: {info}", highlight=False)

    def __exit__(self, *exc) -> None:
        if self.bar is not None:
            self.bar.stop()


# ----------------------------------------------------------------------------------- train


def train_progress(get_time=None):
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    return Progress(
        TextColumn("train", style="bold"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[losses]}"),
        remaining_column(), console=err_console, transient=False, get_time=get_time,
    )


def remaining_column():
    """The time left, never blank (rich's own column shows -:--:-- once steps come further apart than its
    speed window): the estimate (the task's `estimate` field, seconds) until a step is done, then the elapsed
    time per step done times the steps left."""
    from rich.progress import ProgressColumn
    from rich.text import Text

    class Remaining(ProgressColumn):
        def render(self, task) -> Text:
            if task.finished:
                left = 0.0
            elif task.completed and task.elapsed:
                left = task.elapsed / task.completed * max(0.0, (task.total or 0) - task.completed)
            else:
                left = task.fields.get("estimate")
            return Text("eta ?" if left is None else f"eta {clock(left)}", style="progress.remaining")

    return Remaining()


def clock(seconds: float) -> str:
    """'0:04:05' for 245 s."""
    s = int(round(seconds))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


def train_estimate(cfg) -> float | None:
    """`anatomy train`'s estimate of its run (seconds), said on stderr before its first step, from this
    machine's measured step times as `ablate`'s plan line (sweep.calibrate: cached, else a short run measured
    now); None where it cannot be made (a corpus not readable yet, a device the calibration cannot use)."""
    import os

    from anatomy_cli.data.load import load_corpus
    from anatomy_cli.sweep import calibrate

    say = functools.partial(err_console.print, highlight=False, soft_wrap=True)
    d = cfg.data
    try:
        vocab = cfg.model.vocab_size or len(load_corpus(d.source, d.val_frac, cfg.model.ctx_len, d.tokenizer).vocab)
        seconds = calibrate.run_estimate(cfg, vocab, cfg.train.threads or os.cpu_count() or 1, say)
    except Exception:  # an estimate is a courtesy: training says what is wrong, in its own words
        return None
    load = calibrate.busy()
    say(f"est. {calibrate.fmt_seconds(seconds)} for {cfg.train.steps:,} steps, from step times measured on this "
        f"machine" + (f"; the machine is busy now (load average {load[0]:.1f} on {load[1]} cores): expect longer"
                      if load else ""))
    return seconds


def default_run() -> str:
    """What `anatomy train` trains when no SPEC or --set says otherwise, from the config's defaults: 'the
    2017 end (layernorm post-norm, learned positions, gelu; 4 heads, 4 K/V heads) at d_model 128, 4 layers,
    ctx_len 128, batch 32, 2000 steps, on the embedded corpus'."""
    from anatomy_cli.spec.config import RunConfig

    cfg = RunConfig()
    m, t = cfg.model, cfg.train
    return (f"the {label(cfg)} end ({m.norm_type} {m.norm_pos}-norm, {m.pos_type} positions, {m.ffn_type}; "
            f"{m.n_head} heads, {m.n_kv_head} K/V heads) at d_model {m.d_model}, {m.n_layer} layers, ctx_len "
            f"{m.ctx_len}, batch {t.batch_size}, {t.steps} steps, on the embedded corpus")


TRAIN_HELP = (f"Train one model and write config, metrics, weights, samples and summary to its run directory.\n\n"
              f"Every setting SPEC and --set leave out is the default; with neither: {default_run()} (the demo's "
              f"runs are smaller: experiments/demo.toml).")


@app.command(help=TRAIN_HELP)
@handle_errors
def train(
    spec: Annotated[Optional[Path], typer.Argument(help="TOML run spec (sections model, train, data).")] = None,
    sets: Sets = None,
    steps: Annotated[Optional[int], typer.Option(help="Training steps (overrides train.steps).")] = None,
    device: Annotated[Optional[str], typer.Option(help="auto | cpu | cuda | mps")] = None,
    compile: Annotated[bool, typer.Option("--compile", help="torch.compile the model for training.")] = False,
    dtype: Annotated[Optional[str], typer.Option(help="float32 | bfloat16 (autocast; weights stay fp32).")] = None,
    out: Annotated[Optional[Path], typer.Option(
        "--out", help="Run directory (default: RUNS_DIR/train/<run id>).")] = None,
    runs_dir: RunsDir = Path("runs"),
    resume: Annotated[Optional[Path], typer.Option(
        "--resume", help="Continue an interrupted (or killed) run directory.")] = None,
    overwrite: Annotated[bool, typer.Option(
        "--overwrite", help="Replace the run (or other files) already in the run directory.")] = False,
    plugin: Plugins = None,
):
    """Train one model into its run directory (--help: TRAIN_HELP, which says the default run)."""
    from anatomy_cli.spec.config import load_run_config, validate_field

    load_parts(None)  # installed packages' parts; --plugin files join the run's plugins below

    options = {"--steps": ("train.steps", steps), "--device": ("train.device", device),
               "--compile": ("train.compile", compile or None), "--dtype": ("train.dtype", dtype)}
    if resume is not None:
        given = [name for name, (_, value) in options.items() if value is not None]
        given += [name for name, value in (("SPEC", spec), ("--set", sets or None), ("--out", out),
                                           ("--overwrite", overwrite or None)) if value is not None]
        given += ["--runs-dir"] if runs_dir != Path("runs") else []
        if given:
            raise ConfigError(f"{', '.join(given)}: a resumed run continues with the config it started with "
                              f"({resume / runs.CONFIG}); resume with --resume alone, or train a new run")
        load_parts(plugin)  # the file a run's parts come from, where it is not (or no longer) the recorded one
        return _train_resume(resume)
    overrides = {key: validate_field(key, value, name) for name, (key, value) in options.items() if value is not None}
    cfg = load_run_config(spec, [*(sets or []), *(f"{k}={json.dumps(v)}" for k, v in overrides.items())],
                          plugins=plugin or [])
    if device not in (None, "auto", "cpu"):  # named as typed, before training names it train.device
        from anatomy_cli.training.devices import resolve_device

        resolve_device(device, "--device")
    run_dir = out or runs.runs_folder(runs_dir) / "train" / runs.run_id(f"{cfg.name}-{label(cfg)}", cfg.seed,
                                                                  cfg.model_dump(mode="json"))
    runs.refuse_inside_runs(run_dir, "--out" if out else "--runs-dir", "run directory", itself="run")
    runs.refuse_corpus_overlap([cfg.data.source], run_dir, "--out" if out else "--runs-dir")
    runs.check_replace(run_dir, overwrite)  # training checks again under the lock; here, before the warning
    from anatomy_cli.data.load import check_source

    check_source(cfg.data.source, cfg.data.tokenizer)  # a missing corpus or tokenizer, before the warning below
    if cfg.train.warmup_note:  # after the refusals above: a warning never comes before an error of its command
        warn(cfg.train.warmup_note)
    from anatomy_cli.training import run as training

    _run_train(functools.partial(training.train, cfg, run_dir, overwrite=overwrite), run_dir, cfg.train.steps,
               train_estimate(cfg))


def _train_resume(run_dir: Path) -> None:
    from anatomy_cli.training import run as training
    from anatomy_cli.training.checkpoint import load_run_config

    cfg = load_run_config(run_dir)
    training.check_code(run_dir, cfg)  # before the progress bar: other plugin code than the run started with
    status = runs.run_status(run_dir)
    if status not in (runs.INTERRUPTED, runs.RUNNING):  # before any progress bar; resume() checks again under
        # the lock, where a run another live process is training is RunBusy (exit 3)
        raise runs.RunError(f"{run_dir} is {status or 'not a finished or interrupted run'}; only interrupted runs "
                            f"can be resumed")
    if runs.run_status(run_dir) == runs.INTERRUPTED and not training.has_checkpoint(run_dir):
        err_console.print(f"{run_dir} was killed before it could save a checkpoint: training it again from step 0",
                          highlight=False, soft_wrap=True)
    note = functools.partial(err_console.print, highlight=False, soft_wrap=True)  # 'resuming RUN at step N of M (...)'
    _run_train(functools.partial(training.resume, run_dir, note=note), run_dir, cfg.train.steps)


def _run_train(fn, run_dir: Path, total: int, estimate: float | None = None) -> None:
    on_interrupt(lambda: resume_hint(run_dir))  # a second signal may land anywhere from here on
    with StopFlag() as stop, train_progress() as bar:
        task = bar.add_task("train", total=total, losses="", estimate=estimate)

        started = []

        def on_progress(p: dict) -> None:
            started.append(True)
            bar.update(task, completed=p["step"], losses=f"train {p['train_loss']:.3f}  val {p['val_loss']:.3f}")

        try:
            summary = fn(progress=on_progress, stop=stop)
        except BaseException:  # refused before its first step (a corpus empty or too short): no bar at 0/N
            if not started:
                bar.remove_task(task)
            raise
    status = summary["status"]
    if status == runs.INTERRUPTED:
        err_console.print(f"interrupted at step {summary['steps_done']}; {resume_hint(run_dir)}", highlight=False,
                          soft_wrap=True)
        raise typer.Exit(EXIT_INTERRUPTED)
    render_summary(summary, run_dir)
    if summary.get("warning"):
        warn(f"{run_dir} {summary['warning']}")
    if status != runs.COMPLETED:
        raise typer.Exit(EXIT_FAILED)


def resume_hint(run_dir: Path) -> str | None:
    """'resume with: anatomy train --resume RUN' while the run can be resumed (interrupted, or still
    'running' under this very process, which is about to exit); None before it exists or once done."""
    try:
        summary = runs.read_summary(run_dir) or {}
    except runs.RunError:
        return None
    if summary.get("status") not in (runs.INTERRUPTED, runs.RUNNING):
        return None
    return f"resume with: anatomy train --resume {shlex.quote(str(run_dir))}"


def render_summary(s: dict, run_dir: Path) -> None:
    """'run: PATH' on one line, never wrapped (it is copied into `sample` and `--resume`), then the summary."""
    from rich.table import Table

    console.print(f"run: {run_dir}", highlight=False, soft_wrap=True)
    table = Table(show_header=False)
    for key in ("status", "label", "params", "best_val_loss", "best_step", "final_val_loss", "bits_per_char",
                "tokens_seen", "tokens_per_s", "wall_s", "device", "error"):
        value = s.get(key)
        if value is None:
            continue
        table.add_row(key, summary_value(key, value))
    console.print(table)


SUMMARY_FORMATS = {"tokens_per_s": "{:,.0f}", "wall_s": "{:,.1f}"}  # a rate and seconds: no 1,439.8211


def summary_value(key: str, value) -> str:
    """A summary field as the train command prints it: losses to 4 decimals, tokens/s whole, seconds to 0.1."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    return SUMMARY_FORMATS.get(key, "{:,.4f}").format(value)


# ----------------------------------------------------------------------------------- sample


@app.command()
@handle_errors
def sample(
    run_dir: Annotated[Path, typer.Argument(help="A run directory written by train or ablate.")],
    prefix: Annotated[str, typer.Option(help="Text to continue.")] = "## ",
    temp: Annotated[float, typer.Option(help="Temperature; 0 = greedy.")] = 0.8,
    max_new: Annotated[int, typer.Option(help="Tokens to generate (characters, for a char run).")] = 500,
    top_k: Annotated[Optional[int], typer.Option(help="Sample only from the k most likely tokens.")] = None,
    seed: Annotated[int, typer.Option(help="Sampling seed (any 64-bit integer).")] = 0,
    no_cache: Annotated[bool, typer.Option("--no-cache", help="Recompute the whole context every step.")] = False,
    weights: Annotated[str, typer.Option(help="best | last")] = "best",
    window: Annotated[Optional[int], typer.Option(help="Context window (default ctx_len; RoPE may go beyond).")] = None,
    threads: Annotated[int, typer.Option(min=1, max=4096, help="CPU threads. One sequence is a chain of small "
                                         "matmuls that gain little from threads and stall when a core is busy "
                                         "(benchmarks/RESULTS.md).")] = 1,
    plugin: Plugins = None,
):
    """Stream text from a trained run: prefill the prefix (encoded with the run's tokenizer), then one token per
    step via the KV cache, printed once it completes a character."""
    if weights not in ("best", "last"):
        raise ConfigError(f"--weights must be best or last, got {weights!r}")
    if not SEED_MIN <= seed <= SEED_MAX:  # checked here: as an option range, --help printed all 20 digits
        raise ConfigError(f"--seed must be a 64-bit integer, from -2**63 to 2**64-1; got {seed}")
    if max_new < 0:
        raise ConfigError(f"--max-new must be >= 0, got {max_new}")
    import torch

    from anatomy_cli.model.generate import check_options, generate, window_bytes
    from anatomy_cli.training.checkpoint import load_run
    from anatomy_cli.training.devices import require_memory

    torch.set_num_threads(threads)  # batch-1 decode is small matmuls: more threads wait on each other
    load_parts(plugin)
    run_dir = runs.by_prefix(run_dir)  # a unique prefix of a run id names that run
    cfg, vocab, model = load_run(run_dir, weights)
    window = check_options(cfg.model, temp, top_k, window)
    # the KV cache and position tables of the window, before generate allocates them
    require_memory(window_bytes(cfg.model, window), next(model.parameters()).device, f"--window {window}")
    from anatomy_cli.data.tokenizer import StreamDecoder

    ids = vocab.encode(prefix)
    write_out(prefix)
    text = StreamDecoder(vocab, ids)  # a token that ends inside a character waits for the rest of it
    for i in generate(model, ids, max_new, temp, top_k, seed, use_cache=not no_cache, window=window):
        write_out(text.push(i))
    write_out(text.flush() + "\n")

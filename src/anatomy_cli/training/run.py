"""One training run's lifecycle: RunConfig + run directory -> config.json, metrics.jsonl, weights,
summary.json; resuming an interrupted run. The step loop is trainer.Trainer's; the summary's schema
is summary.RunSummary. Progress goes to a callback; this module never prints.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable
from pathlib import Path

import torch

from anatomy_cli.data.batches import run_eval_counts
from anatomy_cli.data.corpus import Corpus, unigram_loss
from anatomy_cli.data.load import run_corpus
from anatomy_cli.data.tokenizer import spec_of
from anatomy_cli.model.generate import generate
from anatomy_cli.spec import components
from anatomy_cli.spec import parts as registry
from anatomy_cli.spec.config import ConfigError, RunConfig
from anatomy_cli.store import runs
from anatomy_cli.store.lockfile import identity
from anatomy_cli.store.summary import RunSummary
from anatomy_cli.training.checkpoint import load_run_config, load_weights, save_weights
from anatomy_cli.training.devices import (
    available_bytes,
    cpu_capability,
    hardware,
    matmul_precision,
    peak_memory,
    resolve_device,
    sdpa_kernel,
)
from anatomy_cli.training.trainer import Progress, Trainer


def resolve_config(cfg: RunConfig, corpus: Corpus) -> RunConfig:
    """Fill model.vocab_size from the data (or check it matches)."""
    n = len(corpus.vocab)
    if cfg.model.vocab_size not in (None, n):
        what = "distinct characters" if spec_of(corpus.vocab) == "char" else f"tokens ({spec_of(corpus.vocab)})"
        raise ConfigError(f"model.vocab_size={cfg.model.vocab_size} but the corpus has {n} {what}")
    return cfg.model_copy(update={"model": cfg.model.model_copy(update={"vocab_size": n})})


def sample_prefix(vocab, prefix: str) -> str:
    """The prefix samples.txt starts from: a char vocabulary keeps the characters it has (else its first);
    a tokenizer encodes any text (a byte-level BPE has every byte), so the prefix stays as it is."""
    if spec_of(vocab) != "char":
        return prefix or "\n"
    return "".join(c for c in prefix if c in vocab.index) or vocab.chars[0]


def write_samples(tr: Trainer) -> str:
    t = tr.cfg.train
    if t.sample_len == 0 or tr.log.best_step < 0:
        return ""
    load_weights(tr.model, tr.run_dir / runs.BEST)
    tr.model.eval()
    vocab = tr.corpus.vocab
    prefix = sample_prefix(vocab, t.sample_prefix)
    prompt = vocab.encode(prefix)
    ids = list(generate(tr.model, prompt, t.sample_len, t.sample_temp, seed=tr.cfg.seed))
    text = prefix + vocab.decode(ids) if spec_of(vocab) == "char" else vocab.decode(prompt + ids)
    header = f"# prefix={prefix!r} temp={t.sample_temp} seed={tr.cfg.seed} weights=best\n"
    runs.atomic_write_text(tr.run_dir / runs.SAMPLES, header + text + "\n")
    return text


@torch.no_grad()
def expert_load(tr: Trainer) -> list[list[float]] | None:
    """Per MoE layer, the fraction of routed slots each expert got (each row sums to 1; a balanced
    router gives 1/E; none can pass 1/k, as a token picks k different experts), over the fixed
    validation windows with the best weights (best.safetensors): the router the run's result comes
    from, so a collapse late in training shows (a tally over training would average it away). None
    for a dense model or a run without best weights."""
    if not tr.cfg.model.moe or tr.log.best_step < 0:
        return None
    load_weights(tr.model, tr.run_dir / runs.BEST)
    tr.model.eval()
    counts = 0
    for x, y in tr.val:
        with tr.autocast:
            counts = counts + tr.fwd(x, y, aux=True)[2]["expert_counts"]  # [L, E]
    return (counts / counts.sum(dim=-1, keepdim=True)).tolist()


def check_fits(cfg: RunConfig, device: torch.device, copies: int = 1) -> None:
    """Refuse, with the estimate, a model whose training step cannot fit (instead of an allocator crash).
    copies: runs trained as one stack (stacked.py), each with its own weights, state and batch."""
    t = cfg.train
    val_windows = 8 * t.batch_size * t.eval_batches * (cfg.model.ctx_len + 1)  # int64, held for the whole run
    need, have = copies * cfg.model.train_bytes(t.batch_size) + val_windows, available_bytes(device)
    if have is not None and need > have:
        m = cfg.model
        # the base sizes, then every other size the spec moved off its default (moe_experts, ...)
        sizes = {"d_model": m.d_model, "n_layer": m.n_layer, "ctx_len": m.ctx_len}
        sizes |= {k: v for k, v in m if type(v) is int and k != "vocab_size" and v != type(m).model_fields[k].default}
        sizes |= {"batch_size": t.batch_size, "eval_batches": t.eval_batches}
        raise ConfigError(f"run too large for this machine: {', '.join(f'{k}={v}' for k, v in sizes.items())} "
                          f"need about {need / 2**30:,.1f} GiB "
                          f"for one training step ({m.num_params():,} parameters); {have / 2**30:,.1f} GiB is "
                          f"available on {device}")


def summarize(tr: Trainer, status: str, diverged_at: int | None, carried: dict,
              load: list[list[float]] | None = None) -> RunSummary:
    t, steps, log = tr.cfg.train, tr.step, tr.log
    tokens = log.tokens(steps)
    best = log.best if math.isfinite(log.best) else None
    return RunSummary(
        status=status,
        **carried,
        label=components.label(tr.cfg),
        components=list(components.on_names(tr.cfg)),
        seed=tr.cfg.seed,
        params=tr.model.num_params(),
        active_params=tr.cfg.model.active_params(),  # per token: a mixture's unrouted experts left out
        best_val_loss=best,
        best_step=log.best_step if best is not None else None,
        final_val_loss=log.last_val if math.isfinite(log.last_val) else None,
        bits_per_char=best / math.log(2) if best is not None else None,  # per token: the char runs' name
        best_val_bpb=log.bpb(best) if best is not None else None,
        final_val_bpb=log.bpb(log.last_val) if math.isfinite(log.last_val) else None,
        steps_done=steps,
        tokens_seen=tokens,
        tokens_per_s=tokens / tr.train_time if tr.train_time > 0 else None,
        step_time_ms=1000 * tr.train_time / steps if steps else None,
        wall_s=round(tr.elapsed, 3),
        peak_mem_bytes=peak_memory(tr.device),
        device=str(tr.device),
        hardware=hardware(tr.device),
        cpu_capability=cpu_capability(),
        threads=torch.get_num_threads(),
        torch_version=torch.__version__,
        dtype=t.dtype,
        matmul_precision=matmul_precision(tr.device, t.dtype),  # what "float32" really ran at
        sdpa_kernel=sdpa_kernel(tr.cfg.model, t.batch_size, tr.device, t.dtype),
        compiled=t.compile,
        diverged_at=diverged_at,
        error=f"diverged at step {diverged_at}" if diverged_at is not None else None,
        **({"expert_load": load} if load else {}),  # a mixture of experts only
    )


def train(cfg: RunConfig, run_dir: Path, progress: Progress | None = None,
          stop: Callable[[], bool] | None = None, extra_summary: dict | None = None,
          overwrite: bool = True) -> dict:
    """Train one run from scratch into run_dir (emptied of a previous attempt first).

    Holds run_dir/.lock throughout (RunBusy if a live process trains it). overwrite=False refuses a
    folder that is not empty; a folder of other runs is always refused (runs.check_replace).
    """
    corpus = run_corpus(cfg)
    cfg = resolve_config(cfg, corpus)
    check_fits(cfg, resolve_device(cfg.train.device))
    run_dir = Path(run_dir)
    runs.check_replace(run_dir, overwrite)
    run_dir.mkdir(parents=True, exist_ok=True)
    with runs.RunLock(run_dir):
        runs.check_replace(run_dir, overwrite)  # again, now that no one else can write here
        return _from_scratch(cfg, run_dir, corpus, progress, stop, RunSummary(**(extra_summary or {})).carried())


def _from_scratch(cfg: RunConfig, run_dir: Path, corpus: Corpus, progress, stop, carried: dict) -> dict:
    carried = prepare_fresh(cfg, run_dir, corpus, carried)
    with recorded(run_dir, carried):
        return _finish(Trainer(cfg, run_dir, corpus, progress), stop, carried)


def prepare_fresh(cfg: RunConfig, run_dir: Path, corpus: Corpus, carried: dict) -> dict:
    """Empty run_dir of a previous attempt, write config.json (first) and the vocabulary (vocab.json, or
    tokenizer.json); the carried summary fields with this run's id and corpus fingerprint."""
    for name in runs.RUN_FILES:
        if name != runs.CONFIG:
            (run_dir / name).unlink(missing_ok=True)
    for kept in runs.kept_checkpoints(run_dir):  # a previous attempt's branch points
        kept.unlink()
    runs.drop_temp_files(run_dir)
    runs.atomic_write_json(run_dir / runs.CONFIG, cfg.model_dump(mode="json"))  # first
    corpus.vocab.save(run_dir / corpus.vocab.file)  # vocab.json (char) or tokenizer.json
    record = plugin_record(cfg)
    if record:  # the code of its plugin parts travels with the run
        runs.atomic_write_json(run_dir / runs.PARTS, record)
    parts = {name: {k: v for k, v in row.items() if k != "text"} for name, row in record.items()}
    return {**started_in(cfg), **carried, "run_id": run_dir.name, **corpus_identity(corpus, cfg),
            **({"parts": parts} if parts else {})}


def plugin_record(cfg: RunConfig) -> dict:
    """{part: {slot, origin, sha256, options, text}} of each plugin part cfg's model uses, its file's text as
    loaded (what parts.json holds; the summary keeps all but the text)."""
    out = {}
    for name, part in registry.used(cfg.model.model_dump(), {}).items():
        if not part.plugin:
            continue
        loaded = registry.LOADED.get(part.origin)
        out[name] = {"slot": part.slot, "origin": part.origin, "sha256": (cfg.model.part_code or {}).get(name),
                     "options": (cfg.model.part_options or {}).get(name),
                     "text": loaded.text if loaded is not None and loaded.sha256 == part.sha256 else None}
    return out


def check_code(run_dir: Path, cfg: RunConfig) -> None:
    """A run goes on only with the code it started with: each plugin part its model uses must come from a
    file whose sha256 is the one config.json records, else one line naming the file and both hashes."""
    for name, want in (cfg.model.part_code or {}).items():
        part = registry.REGISTRY.get(name)
        if part is not None and part.sha256 != want:
            raise runs.RunError(f"{run_dir}: {part.origin} changed since the run started (sha256 {want[:12]}... is now "
                                f"{str(part.sha256)[:12]}...); resuming would train other code than the run's: restore "
                                f"the file (its text is in {run_dir / runs.PARTS}), or train a new run")


def started_in(cfg: RunConfig) -> dict:
    """{'started_in': the working folder} for a run whose data.source is relative (else {}): where a
    resume resolves it (data_source). config.json keeps the source as given: the run id hashes it."""
    src = cfg.data.source
    return {"started_in": str(Path.cwd())} if src is not None and not Path(src).is_absolute() else {}


def data_source(cfg: RunConfig, summary: RunSummary) -> str | None:
    """cfg's data.source, a relative one resolved against the folder the run started in (when recorded)."""
    src = cfg.data.source
    if src is None or Path(src).is_absolute() or summary.started_in is None:
        return src
    return str(Path(summary.started_in) / src)


def resume(run_dir: Path, progress: Progress | None = None, stop: Callable[[], bool] | None = None,
           note: Callable[[str], None] | None = None) -> dict:
    """Continue an interrupted run; metrics equal an uninterrupted run's.

    'Interrupted' includes a run whose process died (SIGKILL, power loss, out of memory): its
    summary still says 'running' but names a dead owner. With a checkpoint (resume.pt: written at
    every evaluation by default, and when a run is stopped) training continues from its step;
    without one (killed before the first) the run starts again from step 0 with its recorded config
    and seed, which gives the same metrics an uninterrupted run would. Either way the corpus must be
    the one the run started on (a relative data.source is read from the folder the run started in).

    note: hears one line, 'resuming RUN at step N of M (checkpoint written ...)', once the checkpoint
    is restored; the summary's resumed_at gains the step (0 without a checkpoint).
    """
    run_dir = Path(run_dir)
    cfg = load_run_config(run_dir)
    with runs.RunLock(run_dir):
        corpus, carried = resume_preamble(run_dir, cfg)
        if not has_checkpoint(run_dir):
            return _from_scratch(cfg, run_dir, corpus, progress, stop, resumed_at(carried, 0))
        written = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime((run_dir / runs.RESUME).stat().st_mtime))
        tr = Trainer(cfg, run_dir, corpus, progress)
        tr.restore()  # a bad checkpoint raises here and leaves the run as it was
        drop_stale(run_dir)
        carried = resumed_at(carried, tr.step)
        if note is not None:
            note(f"resuming {run_dir.name} at step {tr.step} of {cfg.train.steps} (checkpoint written {written})")
        with recorded(run_dir, carried):
            return _finish(tr, stop, carried)


def resumed_at(carried: dict, step: int) -> dict:
    """carried with `step` appended to its resumed_at (the steps this run was resumed from)."""
    return {**carried, "resumed_at": [*(carried.get("resumed_at") or []), step]}


def resume_preamble(run_dir: Path, cfg: RunConfig, corpus: Corpus | None = None) -> tuple[Corpus, dict]:
    """Whether an interrupted run may go on, checked under its lock (a finished rival is seen
    finished): one error line for a run that is not interrupted, or whose corpus changed since it
    started. Returns the corpus (cfg's, read only once the status passed, when none is given: a
    stack reads its one corpus first) and the summary fields the resumed run carries, with its id
    and corpus fingerprint. resume() and stacked.train_group both start with it."""
    status = runs.run_status(run_dir)
    if status != runs.INTERRUPTED:
        raise runs.RunError(f"{run_dir} is {status or 'not a run'}; only interrupted runs can be resumed")
    before = RunSummary.model_validate(runs.read_summary(run_dir) or {})
    check_code(run_dir, cfg)
    if corpus is None:
        corpus = run_corpus(cfg, data_source(cfg, before))
    check_corpus(run_dir, cfg, before, corpus)
    return corpus, {**before.carried(), "run_id": run_dir.name, **corpus_identity(corpus, cfg)}


def drop_stale(run_dir: Path) -> None:
    """Once a checkpoint is restored: the last weights (of where the run stopped) are stale from
    here on, and a killed write's temp files go."""
    (run_dir / runs.LAST).unlink(missing_ok=True)
    runs.drop_temp_files(run_dir)


def has_checkpoint(run_dir: Path) -> bool:
    """Whether resume() continues from a saved step (else it trains again from step 0)."""
    return (Path(run_dir) / runs.RESUME).is_file()


def corpus_identity(corpus: Corpus, cfg: RunConfig) -> dict:
    """What a summary records of its corpus: the sha256 of its text and, for a prepared folder, its
    files' fingerprint (data/prepared.py), so a resume can tell other data from the same; its tokenizer
    (spec and sha256: a resume refuses another); its unigram loss (data.corpus.unigram_loss), the plateau
    a report measures each run's curve against; and the val windows' tokens and bytes (bits per byte)."""
    files = corpus.meta.get("fingerprint")
    tokens, n_bytes = run_eval_counts(corpus, cfg)
    return ({"corpus_sha256": corpus.meta.get("sha256")} | ({"corpus_files": files} if files else {})
            | {"tokenizer": spec_of(corpus.vocab), "tokenizer_sha256": getattr(corpus.vocab, "sha256", None),
               "unigram_loss": unigram_loss(corpus), "val_tokens": tokens, "val_bytes": n_bytes})


def check_corpus(run_dir: Path, cfg: RunConfig, before: RunSummary, corpus: Corpus) -> None:
    """Refuse to continue a run on other data than it started on (fingerprints, else vocabulary size)."""
    from anatomy_cli.data.prepared import changed_file

    was, now = before.corpus_sha256, corpus.meta.get("sha256")
    if was and now and was != now:
        raise runs.RunError(f"{run_dir}: the corpus changed since the run started (sha256 {was[:12]}... is now "
                            f"{now[:12]}...); resuming would train on other data")
    name = changed_file(before.corpus_files, corpus.meta.get("fingerprint"))
    if name is not None:
        raise runs.RunError(f"{run_dir}: {name} of the prepared corpus {cfg.data.source} changed since the run "
                            f"started; resuming would train on other data")
    was, now = before.tokenizer_sha256, getattr(corpus.vocab, "sha256", None)
    if was and now != was:
        raise runs.RunError(f"{run_dir}: the tokenizer changed since the run started (tokenizer.json's sha256 "
                            f"{was[:12]}... is now {str(now)[:12]}...); resuming would train on other ids")
    if len(corpus.vocab) != cfg.model.vocab_size:
        raise runs.RunError(f"{run_dir}: the corpus changed since the run started (vocabulary size differs)")


@contextlib.contextmanager
def recorded(run_dir: Path, carried: dict):
    """While training, the summary says 'running', owned by this process (runs.run_status checks that
    it lives). Whatever ends training early leaves the run 'failed' (an exception: out of memory, a
    bug) or 'interrupted' (a second Ctrl-C, SystemExit) with the error, never 'running'."""
    running = RunSummary(status=runs.RUNNING, owner=identity(), **carried)
    runs.atomic_write_json(run_dir / runs.SUMMARY, running.record())
    try:
        yield
    except BaseException as err:
        status = runs.FAILED if isinstance(err, Exception) else runs.INTERRUPTED
        error = f"{err.__class__.__name__}: {err}".rstrip(": ")
        with contextlib.suppress(OSError, runs.RunError):
            # a run that finished before the error (a stacked member that diverged) keeps its summary
            if (runs.read_summary(run_dir) or {}).get("status") == runs.RUNNING:
                runs.atomic_write_json(run_dir / runs.SUMMARY,
                                       RunSummary(status=status, **carried, error=error).record())
        raise


def _finish(tr: Trainer, stop, carried: dict) -> dict:
    status, diverged_at = tr.run(stop)  # a stopped run has saved its checkpoint
    return finalize(tr, status, diverged_at, carried)


FLAT_LOSS = 1e-4  # nats: a train loss this close to ln V predicts uniformly (an initialised model is ~1e-2 off)


def learned_nothing(metrics: list[dict], vocab_size: int | None) -> str | None:
    """Why a finished run learned nothing, or None: every logged gradient norm is 0 (no weight moved), or every
    train loss is ln V (uniform predictions at every step), over two logged steps or more. Numbers only read:
    the run trained as it did."""
    rows = [m for m in metrics if m.get("train_loss") is not None]
    if len(rows) < 2:
        return None
    if all(m.get("grad_norm") == 0 for m in rows):
        return f"did not learn: the gradient norm was 0 at every one of {len(rows)} steps (no weight moved)"
    uniform = math.log(vocab_size) if vocab_size else None
    if uniform is not None and all(abs(m["train_loss"] - uniform) < FLAT_LOSS for m in rows):
        return f"did not learn: the train loss stayed at ln V = {uniform:.4f} (uniform predictions) at every step"
    return None


def finalize(tr, status: str, diverged_at: int | None, carried: dict) -> dict:
    """Last weights, samples, and summary.json (last) of a run that has stopped training; tr is a
    Trainer or a stacked member (stacked.Member), which hold the same attributes."""
    save_weights(tr.model, tr.run_dir / runs.LAST)
    if status == runs.COMPLETED:
        write_samples(tr)
    load = expert_load(tr) if status != runs.INTERRUPTED else None  # a resumed run measures it at its end
    tr.log.close()
    summary = summarize(tr, status, diverged_at, carried, load).record()
    warning = learned_nothing(runs.read_metrics(tr.run_dir), tr.cfg.model.vocab_size) if status == runs.COMPLETED \
        else None
    summary |= {"warning": warning} if warning else {}
    runs.atomic_write_json(tr.run_dir / runs.SUMMARY, summary)  # last
    if status != runs.INTERRUPTED:  # only now: a kill before the summary still resumes from the checkpoint
        (tr.run_dir / runs.RESUME).unlink(missing_ok=True)
    return summary

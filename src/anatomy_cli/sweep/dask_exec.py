"""Run a sweep's jobs on an existing dask.distributed cluster (`--executor dask --address ...`).

Workers need no shared filesystem: each job ships its corpus with it (unless it is the packaged
default corpus) as the files `anatomy prepare` writes, built on the client by the same loader the
local executor uses, so every source the local executor accepts (a text file, a folder of .md/.txt,
a prepared folder) trains on identical ids. The worker trains into a temporary folder and returns
every run file as bytes; the client writes them under runs/ exactly as the local executor would
(into a temporary folder, then renamed into place), so resume/skip works the same.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

from anatomy_cli.spec.config import ConfigError
from anatomy_cli.spec.errors import InputError
from anatomy_cli.store import runs
from anatomy_cli.sweep.jobs import Job, run_job

CorpusFiles = dict[str, bytes]  # file name -> bytes of a prepared corpus folder


class ExecutorError(InputError):
    """The cluster cannot be reached or a worker lacks anatomy."""


def corpus_files(source: str, val_frac: float, ctx_len: int, tokenizer: str | None = None) -> CorpusFiles:
    """The corpus of `source` as a prepared folder's files: what local training would read, as bytes."""
    from anatomy_cli.data.load import load_corpus
    from anatomy_cli.data.prepared import save_corpus

    corpus = load_corpus(source, val_frac, ctx_len, tokenizer)
    with tempfile.TemporaryDirectory(prefix="anatomy-ship-") as tmp:
        save_corpus(corpus, Path(tmp))
        return {p.name: p.read_bytes() for p in Path(tmp).iterdir() if p.is_file()}


def _ship(job: Job, shipped: dict | None = None) -> tuple[Job, CorpusFiles | None]:
    """Attach the corpus files so the worker reads nothing from our disk (`shipped` caches them per source).

    Each run gets one torch thread: a dask worker's task slots are its parallelism.
    """
    data = job.config["data"]
    files = None
    if data["source"] is not None:
        key = (data["source"], data["val_frac"], data.get("tokenizer"))
        shipped = {} if shipped is None else shipped
        if key not in shipped:
            shipped[key] = corpus_files(data["source"], data["val_frac"], job.config["model"]["ctx_len"], key[2])
        files = shipped[key]
    return job.at(job.run_dir, threads=job.config["train"]["threads"] or 1), files


def remote_run(shipped: tuple[Job, CorpusFiles | None]) -> tuple[dict, dict[str, bytes]]:
    """On a worker: train in a temp folder, return (summary, {file name: bytes})."""
    job, files = shipped
    with tempfile.TemporaryDirectory(prefix="anatomy-") as tmp:
        local_cfg = job.config
        if files is not None:
            corpus = Path(tmp) / "corpus"
            corpus.mkdir()
            for name, blob in files.items():
                (corpus / runs.safe_child(corpus, name).name).write_bytes(blob)
            local_cfg = {**job.config, "data": {**job.config["data"], "source": str(corpus)}}
        run_dir = Path(tmp) / job.run_id
        summary = run_job(job.at(run_dir, local_cfg))
        files = {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file() and not p.name.startswith(".")}
    return summary, files


def write_returned(run_dir: Path, cfg: dict, files: dict[str, bytes]) -> None:
    """Write a run's files atomically: a sibling temp folder renamed over the run directory."""
    run_dir = Path(run_dir)
    tmp = Path(tempfile.mkdtemp(dir=run_dir.parent, prefix=f".{run_dir.name}."))
    try:
        runs.normal_mode(tmp, directory=True)  # mkdtemp makes 0700; a run directory is an ordinary folder
        for name, blob in files.items():
            if name == runs.CONFIG:  # the worker saw its own corpus path: restore ours
                worker_cfg = json.loads(blob)
                worker_cfg["data"]["source"] = cfg["data"]["source"]
                blob = (json.dumps(worker_cfg, indent=2, ensure_ascii=False) + "\n").encode()
            (tmp / runs.safe_child(tmp, name).name).write_bytes(blob)
        if run_dir.exists():
            shutil.rmtree(run_dir)
        tmp.rename(run_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def execute_dask(jobs: list[Job], address: str | None, emit) -> None:
    try:
        from distributed import Client, as_completed
    except ImportError:
        raise ConfigError("--executor dask needs dask.distributed: pip install 'anatomy-cli[dask]'") from None
    if not address:
        raise ConfigError("--executor dask needs --address tcp://HOST:PORT of a running scheduler")
    try:
        client = Client(address, timeout="10s")
    except (OSError, TimeoutError) as err:
        raise ExecutorError(f"cannot reach the dask scheduler at {address}: {err}") from None
    with client:
        futures, shipped = {}, {}
        for job in jobs:
            emit({"event": "start", "run_id": job.run_id, "steps": job.steps})
            futures[client.submit(remote_run, _ship(job, shipped), key=f"anatomy-{job.run_id}", pure=False)] = job
        for future in as_completed(futures):
            job = futures[future]
            summary, files = future.result()
            write_returned(Path(job.run_dir), job.config, files)
            emit({"event": "done", "run_id": job.run_id, "summary": summary})

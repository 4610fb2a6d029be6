"""summary.json's schema: one typed record that `train` writes and `runs` and `report` read (no torch).

Every field is optional: a run writes a short summary while it trains ('running': status, owner and
the CARRIED fields), a short one when it fails, and the whole record when it completes, diverges or
is stopped. Summaries written by older versions (a field missing, or one this version no longer
writes, such as 'flips') and by newer ones (fields this version does not know) validate: unknown
fields are kept as they are (extra="allow"), so a reader passes them through untouched. Types are
strict (an integer field refuses 3.5 and true; a number field takes 3 and NaN), so a corrupt file is
one line naming its field, never a crash in arithmetic later.

Markers on fields (json_schema_extra), read by code instead of lists kept elsewhere:
  carried   kept through 'running', 'failed' and 'interrupted' summaries and a resume
  column    a column of report's runs table (its type gives the column's dtype)
"""

from __future__ import annotations

import json
from typing import Any, get_origin

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

CARRIED = "carried"
COLUMN = "column"


def _field(*markers: str) -> Any:
    return Field(default=None, json_schema_extra=dict.fromkeys(markers, True))


class RunSummary(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True, frozen=True)

    status: str | None = None  # runs.COMPLETED, DIVERGED, FAILED, INTERRUPTED or RUNNING
    run_id: str | None = _field(CARRIED)
    owner: dict | None = None  # lockfile.identity() of the process training it ('running' only)
    sweep: str | None = _field(CARRIED)  # set by a sweep (jobs.Job.planned): its name, and the run's
    role: str | None = _field(CARRIED)  # role in the design ('reference', 'add-one', ...)
    flip: str | None = _field(CARRIED)  # and the component it flips (None for the ends)
    label: str | None = None
    components: list[str] | None = None
    seed: int | None = None
    params: int | None = _field(COLUMN)
    active_params: int | None = _field(COLUMN)  # per token: a mixture's unrouted experts left out
    best_val_loss: float | None = _field(COLUMN)
    best_step: int | None = _field(COLUMN)
    final_val_loss: float | None = _field(COLUMN)
    bits_per_char: float | None = _field(COLUMN)
    steps_done: int | None = None
    tokens_seen: int | None = None
    tokens_per_s: float | None = _field(COLUMN)
    step_time_ms: float | None = _field(COLUMN)
    wall_s: float | None = _field(COLUMN)
    peak_mem_bytes: int | None = None
    device: str | None = None
    hardware: str | None = None  # accelerator name, or CPU model name and threads
    cpu_capability: str | None = None  # torch.backends.cpu.get_cpu_capability(): AVX2, AVX512, ...
    threads: int | None = None
    torch_version: str | None = None
    dtype: str | None = None
    matmul_precision: str | None = None
    sdpa_kernel: str | None = None
    compiled: bool | None = None
    diverged_at: int | None = _field(COLUMN)
    # Stacked seeds (training/stacked.py): how many runs trained as one batched model in this run's last
    # leg (None: alone), and why a run trained alone where stacking was asked (None: it did not).
    stacked: int | None = _field(COLUMN)
    stack_note: str | None = _field(CARRIED)
    error: str | None = None
    # A completed run that learned nothing (every gradient norm 0, or the train loss at ln V at every
    # step: training.run.learned_nothing): flagged here, in the terminal and in the report.
    warning: str | None = None
    corpus_sha256: str | None = _field(CARRIED)
    corpus_files: dict | None = _field(CARRIED)  # a prepared folder's files' fingerprint (data/prepared.py)
    # The val loss of the corpus's character frequencies alone (data.corpus.unigram_loss, nats/char): where a
    # run that learned nothing else sits (report/plateau.py flags a run that ends there).
    unigram_loss: float | None = _field(CARRIED)
    # The tokenizer (data.tokenizer's spec, e.g. "char", "bpe:4096") and the sha256 of its tokenizer.json
    # (None for char: vocab.json and corpus_sha256 say it): a resume refuses another.
    tokenizer: str | None = _field(CARRIED)
    tokenizer_sha256: str | None = _field(CARRIED)
    # Bits per byte (data/batches.py): the fixed val windows' targets (val_tokens) and the UTF-8 bytes they
    # stand for (val_bytes), constants of the corpus, tokenizer and eval settings; best_val_bpb and
    # final_val_bpb are best_val_loss and final_val_loss x val_tokens / (ln 2 x val_bytes).
    val_tokens: int | None = _field(CARRIED, COLUMN)
    val_bytes: int | None = _field(CARRIED, COLUMN)
    best_val_bpb: float | None = _field(COLUMN)
    final_val_bpb: float | None = _field(COLUMN)
    # Resumes (training.run.resume): the step each one continued from, in order (0: killed before its
    # first checkpoint, trained again from the start). None: never resumed.
    resumed_at: list[int] | None = _field(CARRIED)
    # The working folder the run started in, recorded when data.source is relative: a resume reads the
    # corpus relative to it, not to its own folder (config.json, and so the run id, keep the source as given).
    started_in: str | None = _field(CARRIED)
    # A decay branched from another run's stable phase (training/branch.py): {"run": the parent's folder,
    # "run_id": its id, "step": the step its kept checkpoint holds}; steps up to it are the parent's.
    branched_from: dict | None = _field(CARRIED)
    # A mixture of experts: [layer][expert] fractions of routed tokens (train.expert_load).
    expert_load: list[list[float]] | None = None
    # The plugin parts the model uses (spec/parts.py): {name: {slot, origin (the file), sha256, options}}; their
    # source text is in the run's parts.json (training.run.plugin_record).
    parts: dict | None = _field(CARRIED)

    @field_validator("best_val_loss", "final_val_loss", "bits_per_char", "unigram_loss", "best_val_bpb",
                     "final_val_bpb")
    @classmethod
    def _a_loss(cls, loss: float | None) -> float | None:
        if loss is not None and loss < 0:  # NaN (a diverged run's) compares false and passes
            raise ValueError("a loss (a cross-entropy is never negative)")
        return loss

    @field_validator("expert_load")
    @classmethod
    def _load_table(cls, load: list[list[float]] | None) -> list[list[float]] | None:
        if load is not None and (not load or not all(load) or len({len(row) for row in load}) != 1):
            raise ValueError("a [layer][expert] table of fractions")
        return load

    @classmethod
    def marked(cls, marker: str) -> tuple[str, ...]:
        return tuple(k for k, f in cls.model_fields.items() if (f.json_schema_extra or {}).get(marker))

    @classmethod
    def kind(cls, name: str) -> type:
        """int, float, str, bool, list or dict: the type a field holds besides None."""
        annotation = cls.model_fields[name].annotation
        kind = next(t for t in getattr(annotation, "__args__", (annotation,)) if t is not type(None))
        return get_origin(kind) or kind

    @classmethod
    def check(cls, data: Any) -> str | None:
        """None when `data` is a valid summary, else 'params is 3.5, not an integer' (the first problem)."""
        if not isinstance(data, dict):
            return "not a JSON object"
        try:
            cls.model_validate(data)
        except ValidationError as err:
            e = err.errors()[0]
            name = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in e["loc"]).lstrip(".") or "summary"
            what = KINDS.get(e["type"].removesuffix("_type"), e["type"])
            if e["type"] == "value_error":  # a field validator's own words
                what = str(e["ctx"]["error"])
            return f"{name} is {json.dumps(e['input'], default=str)[:40]}, not {what}"
        return None

    def record(self) -> dict:
        """The JSON object summary.json holds: the fields that were set (None ones too), extras last."""
        return self.model_dump(exclude_unset=True)

    def carried(self) -> dict:
        """The CARRIED fields that are set: what 'running' and 'failed' summaries and a resume keep."""
        return {k: v for k, v in self.record().items() if k in CARRIED_FIELDS}


KINDS = {"int": "an integer", "float": "a number", "string": "a string", "bool": "true or false",
         "list": "a list", "dict": "an object"}
CARRIED_FIELDS = RunSummary.marked(CARRIED)
COLUMNS = RunSummary.marked(COLUMN)

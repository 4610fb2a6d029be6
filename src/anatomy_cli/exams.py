"""Exams for models: length extrapolation, depth stability, decode cost, and KV-cache budgets.

  parse_ctx_list   '128,256' or '1x,2x,4x' -> [(n, is_multiple)]; bad text is a ConfigError
  eval_lengths     one run dir -> best-weights val loss at each context length
  eval_tree        a run dir or a sweep dir -> eval_lengths for each completed run, eval.json written
  stability_table  report.load_runs frame -> per label: runs, diverged, spikes, grad norm, loss
  bench_decode     a model's sizes -> prefill/decode tokens/s, KV bytes (each layer's state, measured),
                   memory, for MHA/GQA/MQA, each with or without a sliding window, and MLA; and
                   every layer's decode-state bytes at 4k and 32k positions
  kv_budget        sizes (from a Hugging Face config.json or options) -> KV bytes, MHA vs GQA vs MQA
                   (vs MLA's latent cache where a kv_lora_rank is known), with the config's
                   sliding-window layers bounded by their window

Length extrapolation is measured, never faked: a learned position table has no row past ctx_len,
so those lengths are "n/a" (null in eval.json), not silently cropped; RoPE simply rotates by
larger angles and NoPE has nothing that ends, so both are evaluated as is. A val split too short for a length is also n/a, with a note
saying so (skipped, not an error: in a sweep, one impossible length must not stop the others).

Library code: returns data, never prints or exits; bad input raises ConfigError, RunError or
DataError with a one-line message. torch and pandas are imported inside the functions that need
them, so `anatomy kv-budget` (kv_budget, read_hf_config) never imports torch.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from . import runs
from . import components
from .config import MLA_SIZES, ConfigError, ModelConfig, check_pattern, repeat_pattern, validate

EVAL = "eval.json"  # the file report.load_runs reads val_loss_ctx_<N> columns from
LEARNED_NA = "n/a (learned table ends at ctx_len={})"


# ------------------------------------------------------------------------- 1. length extrapolation


def parse_ctx_list(text: str) -> list[tuple[int, bool]]:
    """'128,256' -> [(128, False), (256, False)]; '1x,4x' -> multiples of each run's ctx_len."""
    items = []
    for part in text.split(","):
        part = part.strip().lower()
        multiple = part.endswith("x")
        digits = part[:-1] if multiple else part
        if not digits.isdecimal() or int(digits) <= 0:
            raise ConfigError(f"--ctx expects positive lengths or multiples of ctx_len, e.g. 128,256,512 "
                              f"or 1x,2x,4x; got {text!r}")
        items.append((int(digits), multiple))
    return items


def resolve_lengths(items: list[tuple[int, bool]], ctx_len: int) -> list[int]:
    return sorted({n * ctx_len if multiple else n for n, multiple in items})


def length_problem(cfg: ModelConfig, n: int, n_val: int) -> str | None:
    """Why length n cannot be measured for this model and val split, or None if it can."""
    if cfg.max_positions is not None and n > cfg.max_positions:
        return LEARNED_NA.format(cfg.max_positions)
    if n_val < n + 1:  # a window of n inputs needs n + 1 ids (the targets are shifted by one)
        return f"n/a (val split has {n_val:,} ids; a window of {n:,} needs {n + 1:,})"
    return None


def eval_bytes(cfg: ModelConfig, n: int, batch_size: int, batches: int) -> int:
    """Bytes an evaluation at length n holds: every window's ids (int64, made up front) plus one
    batch's forward, bounded by what a training step at that length would need."""
    return 8 * batches * batch_size * (n + 1) + cfg.model_copy(update={"ctx_len": n}).train_bytes(batch_size)


def val_loss_at(model, val_ids, n: int, batch_size: int, batches: int, dtype: str = "float32") -> float:
    """Mean loss over data.fixed_windows of length n (raises PositionError past a learned table).

    Same windows, batching, averaging and dtype (bf16 autocast or fp32) as Trainer.evaluate, so at
    n = ctx_len with the run's batch_size, eval_batches and dtype, on the device it was trained on,
    this reproduces the run's best_val_loss (exactly for an eager run).
    """
    import torch

    from .data import fixed_windows
    from .devices import autocast

    device = next(model.parameters()).device
    total = torch.zeros((), device=device)
    windows = fixed_windows(val_ids, batch_size, n, batches, device)
    with torch.no_grad(), autocast(device, dtype):
        for x, y in windows:  # x, y: [B, n]
            _, loss = model(x, y)
            total += loss.float()
    return float(total) / len(windows)


def run_corpus(cfg, run_dir: Path, cache: dict | None = None):
    """The run's corpus (one read per source), checked against the run's vocab.json."""
    from .data import CharVocab, DataError, load_corpus

    cache = {} if cache is None else cache
    key = (cfg.data.source, cfg.data.val_frac)
    if key not in cache:
        cache[key] = load_corpus(cfg.data.source, cfg.data.val_frac, 1)
    corpus = cache[key]
    try:
        vocab = CharVocab.load(Path(run_dir) / runs.VOCAB)
    except DataError as err:
        raise runs.RunError(str(err)) from None
    if vocab.chars != corpus.vocab.chars:
        raise runs.RunError(f"{run_dir}: the corpus changed since the run was trained (vocabulary differs)")
    return corpus


def eval_lengths(run_dir: Path, ctx: list[tuple[int, bool]], batches: int | None = None,
                 batch_size: int | None = None, device: str = "cpu", corpus_cache: dict | None = None) -> dict:
    """{"val_loss_by_ctx": {"64": 1.9, "256": None}, "ctx_len", "pos_type", "notes", ...} for a run."""
    from .checkpoint import load_run
    from .devices import require_memory

    cfg, _, model = load_run(run_dir, "best", device)
    corpus = run_corpus(cfg, run_dir, corpus_cache)
    bs, nb = batch_size or cfg.train.batch_size, batches or cfg.train.eval_batches
    losses: dict[str, float | None] = {}
    notes: dict[str, str] = {}
    for n in resolve_lengths(ctx, cfg.model.ctx_len):
        problem = length_problem(cfg.model, n, len(corpus.val))
        if problem:
            losses[str(n)], notes[str(n)] = None, problem
        else:
            require_memory(eval_bytes(cfg.model, n, bs, nb), device,
                           f"{run_dir}: --batches {nb} x --batch-size {bs} windows of {n} characters")
            losses[str(n)] = val_loss_at(model, corpus.val, n, bs, nb, cfg.train.dtype)  # the run's own dtype
    return {"val_loss_by_ctx": losses, "ctx_len": cfg.model.ctx_len, "pos_type": cfg.model.pos_type,
            "notes": notes, "label": components.label(cfg), "weights": "best", "batch_size": bs, "batches": nb,
            "dtype": cfg.train.dtype}


MERGE_KEYS = ("weights", "batch_size", "batches", "dtype")


def write_eval(run_dir: Path, result: dict) -> dict:
    """Write eval.json atomically; lengths measured earlier with the same settings are kept."""
    path = Path(run_dir) / EVAL
    old: dict = {}
    if path.exists():
        try:
            runs.read_ctx_losses(path)  # checks the losses table
            old = runs.read_json(path)
        except runs.RunError:
            old = {}  # a corrupt eval.json is replaced, not merged
    if isinstance(old, dict):
        old.setdefault("dtype", "float32")  # written before eval ran in the run's dtype: always fp32
    same = (isinstance(old, dict) and isinstance(old.get("notes", {}), dict)
            and all(old.get(k) == result.get(k) for k in MERGE_KEYS))
    losses = {**(old.get("val_loss_by_ctx", {}) if same else {}), **result["val_loss_by_ctx"]}
    losses = dict(sorted(losses.items(), key=lambda kv: int(kv[0])))
    notes = {**(old.get("notes", {}) if same else {}), **result["notes"]}
    merged = {**result, "val_loss_by_ctx": losses, "notes": {k: v for k, v in notes.items() if losses.get(k) is None}}
    runs.atomic_write_json(path, merged)
    return merged


def eval_tree(root: Path, ctx: list[tuple[int, bool]], batches: int | None = None, batch_size: int | None = None,
              device: str = "cpu", on_run: Callable[[Path, dict], None] | None = None) -> dict:
    """Evaluate a run dir, or every completed run under a sweep dir; returns {"runs", "skipped"}."""
    root = Path(root)
    if not root.exists():
        raise runs.RunError(f"run or sweep directory not found: {root}")
    if runs.is_run_dir(root):
        targets, skipped = [root], []
    else:
        found = runs.find_runs(root)
        if not found:
            raise runs.RunError(f"no runs under {root} (no run directory with a {runs.CONFIG})")
        targets = [d for d in found if runs.run_status(d) == runs.COMPLETED]
        skipped = [{"run_dir": str(d), "status": runs.run_status(d) or "incomplete"} for d in found if d not in targets]
    done, corpora = [], {}
    for run_dir in targets:
        result = write_eval(run_dir, eval_lengths(run_dir, ctx, batches, batch_size, device, corpora))
        done.append({"run_dir": str(run_dir), **result})
        if on_run:
            on_run(run_dir, result)
    return {"runs": done, "skipped": skipped}


# ------------------------------------------------------------------------------ 2. depth stability

STABILITY_COLUMNS = ["label", "n_runs", "diverged", "loss_spikes_mean", "max_grad_norm", "best_val_loss_mean"]


def stability_table(runs_df):
    """One row per label (in order of appearance) from a report.load_runs frame.

    diverged counts runs whose status is 'diverged'; max_grad_norm is the largest logged
    (pre-clip) gradient norm of any run of the label; best_val_loss_mean averages completed runs
    only (a diverged run's best loss is from before it blew up, so it would flatter the label).
    """
    import pandas as pd

    rows = []
    for label, g in runs_df.groupby("label", sort=False):
        completed = g[g["status"] == runs.COMPLETED]
        rows.append({
            "label": label,
            "n_runs": len(g),
            "diverged": int((g["status"] == runs.DIVERGED).sum()),
            "loss_spikes_mean": float(g["loss_spikes"].astype(float).mean()),
            "max_grad_norm": float(g["max_grad_norm"].max()),
            "best_val_loss_mean": float(completed["best_val_loss"].mean()) if len(completed) else math.nan,
        })
    return pd.DataFrame(rows, columns=STABILITY_COLUMNS)


def stability(sweep_dir: Path):
    """(stability table, runs frame) of every run under sweep_dir."""
    from .report import load_runs

    frame, _ = load_runs(Path(sweep_dir))
    return stability_table(frame), frame


# ------------------------------------------------------------------------------ 3. decode cost


def attention_name(n_head: int, n_kv_head: int) -> str:
    return "MHA" if n_kv_head == n_head else "MQA" if n_kv_head == 1 else "GQA"


def window_list(text: str | None, default: int) -> list[int]:
    """Default: [the model's own window]; else a comma list of window sizes, 0 = global attention."""
    if text is None:
        return [default]
    parts = [p.strip() for p in text.split(",")]
    if not all(p.isdecimal() for p in parts):
        raise ConfigError(f"--windows expects window sizes >= 0 (0 = global), e.g. 0,16; got {text!r}")
    return list(dict.fromkeys(int(p) for p in parts))


def kv_head_list(n_head: int, text: str | None = None) -> list[int | str]:
    """Default H, H/2, 1 (duplicates and non-divisors dropped), then "mla" (latent attention);
    else a comma list of K/V head counts, each dividing H, and/or mla."""
    if text is None:
        return [g for g in dict.fromkeys((n_head, n_head // 2, 1)) if g > 0 and n_head % g == 0] + ["mla"]
    parts = [p.strip().lower() for p in text.split(",")]
    if not all(p == "mla" or (p.isdecimal() and int(p) > 0) for p in parts):
        raise ConfigError(f"--kv-heads expects positive integers or mla, e.g. {n_head},{max(1, n_head // 2)},1,mla; "
                          f"got {text!r}")
    bad = [p for p in parts if p != "mla" and n_head % int(p)]
    if bad:
        raise ConfigError(f"--kv-heads {', '.join(bad)}: each must divide n_head={n_head}")
    return list(dict.fromkeys(p if p == "mla" else int(p) for p in parts))


def decode_lengths(cfg: ModelConfig, prefix_len: int, new: int) -> tuple[int, int, str | None]:
    """(prefix, new, note): RoPE and NoPE keep both (window = prefix + new, no context shift); a
    learned table caps prefix + new at ctx_len, with a note saying so."""
    if prefix_len < 1 or new < 1:
        raise ConfigError(f"--prefix-len and --new must be >= 1, got {prefix_len} and {new}")
    limit = cfg.max_positions
    if limit is None or prefix_len + new <= limit:
        return prefix_len, new, None
    p = min(prefix_len, limit // 2)
    n = min(new, limit - p)
    return p, n, (f"learned positions: prefix+new capped at ctx_len={limit} "
                  f"(prefix {p}, new {n}; asked {prefix_len}+{new})")


def fresh_model(cfg: ModelConfig, device, dtype, seed: int = 0):
    """An untrained LM of these sizes, initialised without touching the global RNG."""
    import torch

    from .model import LM

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LM(cfg)
    return model.to(device=device, dtype=dtype).eval()


def time_prefill(model, prefix: list[int], window: int, repeats: int = 3) -> float:
    """Median seconds of one prefill forward of the prefix into a fresh cache."""
    import torch

    idx = torch.tensor([prefix], device=next(model.parameters()).device)
    times = []
    with torch.no_grad():
        for _ in range(repeats):
            cache = model.new_cache(1, window)
            t0 = time.perf_counter()
            logits, _ = model(idx, cache=cache)
            float(logits[0, -1, 0])  # wait for the device
            times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def time_decode(model, prefix: list[int], new: int, window: int, use_cache: bool) -> tuple[list[int], float]:
    """Greedy sample.generate; seconds from the first token to the end = `new` decode forwards.

    The first next() runs the prefill (timed separately); after each yielded token generate runs
    one forward (the last one after the final token), so the timed part holds exactly `new`.
    """
    from .sample import generate

    it = generate(model, prefix, new, temp=0.0, use_cache=use_cache, window=window)
    ids = [next(it)]
    t0 = time.perf_counter()
    ids += list(it)
    return ids, time.perf_counter() - t0


def memory_fields(model, cache_bytes: int, device) -> dict:
    """CUDA: the allocator's peak. CPU: model + cache bytes, and the process peak RSS so far."""
    import torch

    from .devices import peak_rss_bytes

    param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    out = {"param_bytes": param_bytes, "model_cache_bytes": param_bytes + cache_bytes}
    if torch.device(device).type == "cuda":
        out["peak_cuda_bytes"] = int(torch.cuda.max_memory_allocated(device))
    else:
        out["peak_rss_bytes"] = peak_rss_bytes()
    return out


def bench_one(model, cfg: ModelConfig, prefix_len: int, new: int, device, seed: int = 0) -> dict:
    """Prefill and decode speed (cached and uncached), KV bytes and memory for one model."""
    import torch

    window = prefix_len + new
    prefix = torch.randint(cfg.vocab_size, (prefix_len,), generator=torch.Generator().manual_seed(seed)).tolist()
    if torch.device(device).type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    time_decode(model, prefix, min(new, 4), window, True)  # warm-up: kernels, RoPE tables
    prefill_s = time_prefill(model, prefix, window)
    cached, cached_s = time_decode(model, prefix, new, window, True)
    uncached, uncached_s = time_decode(model, prefix, new, window, False)
    cache = model.new_cache(1, window)  # what generate allocates: batch 1, window positions
    elem = next(model.parameters()).element_size()  # the cache takes the weights' dtype
    total = cache.cache_bytes()  # measured from every layer's state tensors
    return {
        "layer_states": layer_states(cache, cfg.layer_kinds),
        "prefill_tok_s": prefix_len / prefill_s,
        "decode_tok_s_cached": new / cached_s,
        "decode_tok_s_uncached": new / uncached_s,
        "speedup": uncached_s / cached_s,
        "same_output": cached == uncached,
        "kv_bytes_per_token": total // window,
        "kv_cache_bytes": total,
        "kv_formula_bytes": cfg.cache_bytes(1, window, elem),
        "bytes_per_elem": elem,
        "long_context": long_context_bytes(cfg, elem),
        **memory_fields(model, total, device),
    }


LONG_CONTEXTS = (4096, 32768)


def long_context_bytes(cfg: ModelConfig, elem: int) -> list[dict]:
    """Decode-state bytes at 4k and 32k positions (B=1, from ModelConfig.state_bytes, which the tests
    pin to the allocated tensors): per layer of each kind, in all, and what softmax attention in
    every layer would hold. A recurrent layer's (gdn) stays constant; a KV cache grows with T."""
    kinds = dict.fromkeys(cfg.layer_kinds)
    return [{"positions": T, "per_layer": {k: cfg.state_bytes(k, 1, T, elem) for k in kinds},
             "layers": {k: cfg.layer_kinds.count(k) for k in kinds}, "total": cfg.cache_bytes(1, T, elem),
             "all_attention": cfg.n_layer * cfg.state_bytes("attn", 1, T, elem)} for T in LONG_CONTEXTS]


DTYPES = ("float32", "bfloat16", "float16")


def layer_states(cache, kinds: tuple[str, ...]) -> dict[str, dict]:
    """One layer of each kind, measured: {kind: {layers, bytes, bounded}}. bounded: its state does
    not grow with the positions (a window's buffer, a recurrent state), so bytes is all it ever holds."""
    out: dict[str, dict] = {}
    for kind, state, nbytes in zip(kinds, cache.states, cache.layer_bytes()):
        row = out.setdefault(kind, {"layers": 0, "bytes": nbytes, "bounded": state.capacity is None})
        row["layers"] += 1
    return out


def bench_decode(cfg: ModelConfig, trained=None, kv_heads: list[int | str] | None = None, new: int = 200,
                 prefix_len: int = 64, device: str = "cpu", dtype: str = "float32",
                 on_row: Callable[[dict], None] | None = None, windows: list[int] | None = None,
                 window_pattern: str | None = None) -> dict:
    """One row per n_kv_head of softmax attention and window (default: the model's own;
    window_pattern, if given, for every windowed row), and one for "mla" (latent attention at its
    default sizes, or the run's; global, since a window leaves mla layers be, and without QK-norm,
    which it does not take): the trained model where the config is the run's, else an untrained one."""
    import torch

    from .devices import require_memory
    from .sample import window_bytes

    if dtype not in DTYPES:
        raise ConfigError(f"--dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    torch_dtype = getattr(torch, dtype)
    prefix_len, new, note = decode_lengths(cfg, prefix_len, new)
    window = prefix_len + new
    elem = torch.tensor([], dtype=torch_dtype).element_size()
    mha = cfg.model_copy(update={"n_kv_head": cfg.n_head, "attn_type": "softmax"})  # the largest cache of the rows
    require_memory((window_bytes(mha, window) + 4 * mha.num_params()) * elem // 4 + 8 * window, device,
                   f"d_model={cfg.d_model}, n_layer={cfg.n_layer}, --prefix-len {prefix_len} + --new {new} (model, "
                   f"KV cache and position tables in {dtype})")
    rows = []
    softmax = {**cfg.model_dump(), "attn_type": "softmax", **dict.fromkeys(MLA_SIZES)}
    pattern = {"window_pattern": window_pattern} if window_pattern else {}
    variants = [(g, 0 if g == "mla" else w) for g in kv_heads or kv_head_list(cfg.n_head)
                for w in ([None] if g == "mla" else windows or [cfg.window])]
    for g, w in variants:
        if g == "mla":
            c = cfg if cfg.attn_type == "mla" else validate(
                ModelConfig, {**softmax, "attn_type": "mla", "qk_norm": False, "window": 0}, prefix="model.")
            m = c.mla_dims
            head = {"n_kv_head": None, "attention": "MLA", "latent": f"{m.kv_lora_rank}+{m.qk_rope_head_dim}"}
        else:
            c = validate(ModelConfig, {**softmax, "n_kv_head": g, "window": w, **pattern}, prefix="model.")
            head = {"n_kv_head": g, "attention": attention_name(c.n_head, g), "latent": None}
        is_trained = trained is not None and c == cfg
        model = trained.to(dtype=torch_dtype) if is_trained else fresh_model(c, device, torch_dtype)
        row = head | {"sliding_window": w, "window_pattern": c.window_pattern if w else None,
                      "weights": "trained (run)" if is_trained else "untrained (same sizes)"}
        row |= bench_one(model, c, prefix_len, new, device)
        rows.append(row)
        if on_row:
            on_row(row)
    sizes = {k: getattr(cfg, k) for k in ("vocab_size", "d_model", "n_layer", "n_head", "ctx_len", "pos_type")}
    return {"model": sizes | {"head_dim": cfg.head_dim}, "prefix_len": prefix_len, "new": new,
            "window": prefix_len + new, "device": str(device), "dtype": dtype, "note": note, "rows": rows}


# ------------------------------------------------------------------------------ 4. KV budget (no torch)

DTYPE_BYTES = {"fp32": 4, "float32": 4, "fp16": 2, "float16": 2, "bf16": 2, "bfloat16": 2, "fp8": 1,
               "float8": 1, "int8": 1}
MAX_CONFIG_BYTES = 16 << 20  # the largest Hugging Face config.json is tens of KB
HF_KEYS = {"layers": "num_hidden_layers", "heads": "num_attention_heads", "kv_heads": "num_key_value_heads",
           "head_dim": "head_dim", "hidden": "hidden_size",
           # MLA (DeepSeek-V2/V3 config.json): the cached latent and rope key; MHA's head is the nope part
           "kv_lora_rank": "kv_lora_rank", "rope_dim": "qk_rope_head_dim", "nope_dim": "qk_nope_head_dim"}


@dataclass(frozen=True)
class AttnShape:
    """What a KV cache's size depends on: L layers, H query heads, G K/V heads, hd per head, and
    how many layers are sliding-window (local) ones with which window (0: none); for MLA, the
    latent (kv_lora_rank) and shared rope key (rope_dim) cached per token per layer."""

    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    hidden: int | None
    source: str
    window: int = 0
    local_layers: int = 0
    kv_lora_rank: int | None = None
    rope_dim: int | None = None


def read_hf_config(path: Path) -> dict[str, int | None]:
    """{layers, heads, kv_heads, head_dim, hidden} from a Hugging Face config.json (None = absent).

    A directory means its config.json; multimodal configs are read from their text_config.
    """
    path = Path(path)
    path = path / "config.json" if path.is_dir() else path
    if path.exists() and not path.is_file():  # /dev/zero, a FIFO: would be read forever
        raise ConfigError(f"config is not a regular file: {path}")
    if path.is_file() and path.stat().st_size > MAX_CONFIG_BYTES:
        raise ConfigError(f"{path}: {path.stat().st_size:,} bytes is not a model config (> {MAX_CONFIG_BYTES:,})")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"config not found: {path}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ConfigError(f"{path}: not a valid JSON config ({str(err).splitlines()[0]})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a JSON object, got {type(data).__name__}")
    if HF_KEYS["layers"] not in data and isinstance(data.get("text_config"), dict):
        data = data["text_config"]
    out = {}
    for name, key in {**HF_KEYS, "window": "sliding_window", "every": "sliding_window_pattern"}.items():
        value = data.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise ConfigError(f"{path}: {key} must be an integer, got {value!r}")
        out[name] = value
    out["window_pattern"] = hf_window_pattern(data, out.pop("every"))
    if out["window_pattern"] is None:
        out["window"] = None
    return out


def hf_window_pattern(data: dict, every: int | None) -> str | None:
    """The sliding-window layers of an HF config as L (local) / G (global) per layer, or None.

    layer_types where given (transformers writes it for Gemma 2/3, Ministral, Qwen2/3, gpt-oss),
    else Gemma 3's older sliding_window_pattern k (every k-th layer global), else a Mistral's
    sliding_window (every layer). Qwen's sliding_window without use_sliding_window is unused.
    """
    if not data.get("sliding_window") or data.get("use_sliding_window") is False:
        return None
    types = data.get("layer_types")
    if isinstance(types, list):
        pattern = "".join("L" if t == "sliding_attention" else "G" for t in types)
        return pattern if "L" in pattern else None
    if every:
        return "L" * (every - 1) + "G"
    return "L" if data.get("model_type") in ("mistral", "mixtral") else None


def attn_shape(config: Path | None = None, **options: int | str | None) -> AttnShape:
    """Sizes from config.json, overridden by any option given; kv_heads defaults to heads,
    head_dim to a DeepSeek config's qk_nope_head_dim (its MHA baseline, DeepSeek-V2 Table 1) or
    hidden / heads. kv_lora_rank and rope_dim come together (MLA) or not at all."""
    sizes = read_hf_config(config) if config is not None else dict.fromkeys(HF_KEYS)
    sizes |= {k: v for k, v in options.items() if v is not None}
    where = str(config) if config is not None else "options"
    missing = [f"--{k} ({HF_KEYS[k]})" for k in ("layers", "heads") if sizes[k] is None]
    if sizes["head_dim"] is None and sizes["hidden"] is None:
        missing.append("--head-dim or --hidden (head_dim / hidden_size)")
    if missing:
        raise ConfigError(f"{where}: missing {', '.join(missing)}")
    bad = [f"{k}={v}" for k, v in sizes.items()
           if isinstance(v, int) and (v < 0 if k == "window" else v <= 0)]  # window 0: none
    if bad:
        raise ConfigError(f"{where}: sizes must be positive, got {', '.join(bad)}")
    heads, kv = sizes["heads"], sizes["kv_heads"] or sizes["heads"]
    if heads % kv:
        raise ConfigError(f"{where}: num_key_value_heads={kv} must divide num_attention_heads={heads}")
    if (sizes["kv_lora_rank"] is None) != (sizes["rope_dim"] is None):
        raise ConfigError(f"{where}: MLA needs both --kv-lora-rank and --rope-dim (kv_lora_rank, qk_rope_head_dim)")
    head_dim = sizes["head_dim"] or sizes["nope_dim"] or _divide(sizes["hidden"], heads, where)
    window, local = _local_layers(sizes, where)
    return AttnShape(sizes["layers"], heads, kv, head_dim, sizes["hidden"], where, window, local,
                     sizes["kv_lora_rank"], sizes["rope_dim"])


def _local_layers(sizes: dict, where: str) -> tuple[int, int]:
    """(window, local layers) from a window and an L/G pattern (default every layer local)."""
    window, pattern = sizes.get("window") or 0, sizes.get("window_pattern") or "L"
    if not window:
        return 0, 0
    try:
        check_pattern("window pattern", pattern, "LG", sizes["layers"])
    except ValueError as err:
        raise ConfigError(f"{where}: {err}") from None
    return window, repeat_pattern(pattern, sizes["layers"]).count("L")


def _divide(hidden: int, heads: int, where: str) -> int:
    if hidden % heads:
        raise ConfigError(f"{where}: hidden_size={hidden} is not a multiple of num_attention_heads={heads}; "
                          f"give head_dim")
    return hidden // heads


def fmt_bytes(n: int) -> str:
    """Binary units: 536870912 -> '512.0 MiB'."""
    value, unit = float(n), "B"
    for next_unit in ("KiB", "MiB", "GiB", "TiB", "PiB"):
        if value < 1024:
            break
        value, unit = value / 1024, next_unit
    return f"{n} B" if unit == "B" else f"{value:,.2f} {unit}" if value < 10 else f"{value:,.1f} {unit}"


def kv_budget(shape: AttnShape, seq: int, batch: int = 1, dtype: str = "bf16") -> dict:
    """KV bytes = 2 (K and V) x L x B x G x T x hd x bytes, for G = H (MHA), the config's G, 1 (MQA);
    with a kv_lora_rank, MLA's L x B x (kv_lora_rank + rope_dim) x T x bytes too (then the config's).

    A local (sliding-window) layer of softmax attention holds min(T, window - 1) positions instead
    of T (anatomy's WindowKV, as transformers' dynamic sliding cache; a static one allocates
    window); a window leaves MLA layers global, so the MLA row is global in every layer."""
    if dtype not in DTYPE_BYTES:
        raise ConfigError(f"--dtype must be one of {', '.join(DTYPE_BYTES)}, got {dtype!r}")
    if seq <= 0 or batch <= 0:
        raise ConfigError(f"--seq and --batch must be positive, got {seq} and {batch}")
    nbytes, mla = DTYPE_BYTES[dtype], shape.kv_lora_rank is not None
    kept = min(seq, shape.window - 1) if shape.local_layers else seq  # positions a local layer holds
    # (name, kv heads, values one layer caches per position, local layers)
    variants = [(attention_name(shape.heads, g), g, 2 * g * shape.head_dim, shape.local_layers)
                for g in dict.fromkeys((shape.heads, shape.kv_heads, 1))]
    if mla:  # one latent + one rope key, no heads
        variants.append(("MLA", None, shape.kv_lora_rank + shape.rope_dim, 0))
    rows = []
    for name, g, width, local in variants:
        layer_token = width * nbytes  # one layer, one position
        all_global = shape.layers * layer_token * batch * seq
        total = all_global - local * layer_token * batch * (seq - kept)
        rows.append({"attention": name, "kv_heads": g, "is_config": name == "MLA" if mla else g == shape.kv_heads,
                     "bytes": total, "human": fmt_bytes(total), "bytes_per_token": total // (batch * seq),
                     "global_layer_bytes_per_token": layer_token,
                     "local_layer_bytes": layer_token * batch * kept if local else None,
                     "bytes_all_global": all_global})
    for r in rows:  # rows[0] is MHA
        r["ratio_to_mha"], r["mha_over"] = r["bytes"] / rows[0]["bytes"], rows[0]["bytes"] / r["bytes"]
    formula = "2 x layers x batch x kv_heads x seq x head_dim x bytes"
    formula += "; MLA: layers x batch x (kv_lora_rank + rope_dim) x seq x bytes" if mla else ""
    if shape.local_layers:
        formula += f"; the {shape.local_layers} local layers hold min(seq, window - 1) = {kept} positions, not seq"
    return {**asdict(shape), "seq": seq, "batch": batch, "dtype": dtype, "bytes_per_elem": nbytes,
            "formula": formula, "rows": rows}


def jsonable(obj: Any) -> Any:
    """NaN/inf -> None so --json output is strict JSON."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [jsonable(v) for v in obj]
    return obj

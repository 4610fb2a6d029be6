"""Decode cost: prefill and decode tokens/s, KV bytes and memory of a model's sizes.

  bench_decode     a model's sizes -> prefill/decode tokens/s, KV bytes (each layer's state, measured),
                   memory, for MHA/GQA/MQA, each with or without a sliding window, MLA and DSA (MLA
                   plus its indexer's keys), and the model's own attention with each of sinks, gattn
                   and partrope on; and every layer's decode-state bytes at 4k and 32k positions

Library code: returns data, never prints or exits; torch is imported inside the functions that
need it.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from anatomy_cli.exams.kv_budget import attention_name
from anatomy_cli.spec.config import (
    DSA_SIZES,
    MLA_SIZES,
    ConfigError,
    ModelConfig,
    validate,
)


def window_list(text: str | None, default: int) -> list[int]:
    """Default: [the model's own window]; else a comma list of window sizes, 0 = global attention."""
    if text is None:
        return [default]
    parts = [p.strip() for p in text.split(",")]
    if not all(p.isdecimal() for p in parts):
        raise ConfigError(f"--windows expects window sizes >= 0 (0 = global), e.g. 0,16; got {text!r}")
    return list(dict.fromkeys(int(p) for p in parts))


LATENT_ROWS = ("mla", "dsa")  # latent attention, and DeepSeek sparse attention on it (MLA + indexer keys)
PART_ROWS = ("sinks", "gattn", "partrope")  # parts of softmax attention: the model's own, that part on
NAMED_ROWS = LATENT_ROWS + PART_ROWS


def kv_head_list(n_head: int, text: str | None = None) -> list[int | str]:
    """Default H, H/2, 1 (duplicates and non-divisors dropped), then "mla" and "dsa" (latent
    attention, and sparse latent attention), then "sinks", "gattn" and "partrope" (the model's own
    softmax attention with that part on); else a comma list of K/V head counts, each dividing H,
    and/or any of those names."""
    if text is None:
        return [g for g in dict.fromkeys((n_head, n_head // 2, 1)) if g > 0 and n_head % g == 0] + list(NAMED_ROWS)
    parts = [p.strip().lower() for p in text.split(",")]
    if not all(p in NAMED_ROWS or (p.isdecimal() and int(p) > 0) for p in parts):
        raise ConfigError(f"--kv-heads expects positive integers or mla, {', '.join(NAMED_ROWS[1:])}, e.g. "
                          f"{n_head},{max(1, n_head // 2)},1,mla,dsa; got {text!r}")
    bad = [p for p in parts if p not in NAMED_ROWS and n_head % int(p)]
    if bad:
        raise ConfigError(f"--kv-heads {', '.join(bad)}: each must divide n_head={n_head}")
    return list(dict.fromkeys(p if p in NAMED_ROWS else int(p) for p in parts))


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

    from anatomy_cli.model import LM

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
    from anatomy_cli.model.generate import generate

    it = generate(model, prefix, new, temp=0.0, use_cache=use_cache, window=window)
    ids = [next(it)]
    t0 = time.perf_counter()
    ids += list(it)
    return ids, time.perf_counter() - t0


def memory_fields(model, cache_bytes: int, device) -> dict:
    """CUDA: the allocator's peak. CPU: model + cache bytes, and the process peak RSS so far."""
    import torch

    from anatomy_cli.training.devices import peak_rss_bytes

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
    window_pattern, if given, for every windowed row); one for "mla" (latent attention at its
    default sizes, or the run's; global, since a window leaves mla layers be, and without QK-norm,
    sinks, the output gate or partial RoPE, which it does not take) and one for "dsa" (the same
    with DeepSeek's indexer: its keys join the cache); and one for each of "sinks", "gattn" and
    "partrope": the model's own softmax attention (its n_kv_head and window) with that part on. The
    trained model where the config is the run's, else an untrained one. kv_heads None: the default
    list (kv_head_list), leaving out, with a note, a part these sizes cannot take (partrope where a
    quarter of head_dim is not a whole even number); asked for by name, such a row is an error."""
    import torch

    from anatomy_cli.model.generate import window_bytes
    from anatomy_cli.training.devices import require_memory

    if dtype not in DTYPES:
        raise ConfigError(f"--dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    torch_dtype = getattr(torch, dtype)
    prefix_len, new, note = decode_lengths(cfg, prefix_len, new)
    notes = [note] if note else []
    window = prefix_len + new
    elem = torch.tensor([], dtype=torch_dtype).element_size()
    mha = cfg.model_copy(update={"n_kv_head": cfg.n_head, "attn_type": "softmax", "dsa": False})  # the largest cache
    require_memory((window_bytes(mha, window) + 4 * mha.num_params()) * elem // 4 + 8 * window, device,
                   f"d_model={cfg.d_model}, n_layer={cfg.n_layer}, --prefix-len {prefix_len} + --new {new} (model, "
                   f"KV cache and position tables in {dtype})")
    rows = []
    asked = kv_heads is not None
    pattern = {"window_pattern": window_pattern} if window_pattern else {}
    variants = [(g, 0 if g in LATENT_ROWS else None if g in PART_ROWS else w)
                for g in kv_heads or kv_head_list(cfg.n_head)
                for w in ([None] if g in NAMED_ROWS else windows or [cfg.window])]
    for g, w in variants:
        try:
            c, head = row_config(cfg, g, w, pattern)
        except ConfigError as err:
            if asked:
                raise ConfigError(f"--kv-heads {g}: {err}") from None
            notes.append(f"no {g} row: {err}")
            continue
        is_trained = trained is not None and c == cfg
        model = trained.to(dtype=torch_dtype) if is_trained else fresh_model(c, device, torch_dtype)
        w = c.window if g in PART_ROWS else w
        row = head | {"sliding_window": w, "window_pattern": c.window_pattern if w else None,
                      "weights": "trained (run)" if is_trained else "untrained (same sizes)"}
        row |= bench_one(model, c, prefix_len, new, device)
        rows.append(row)
        if on_row:
            on_row(row)
    sizes = {k: getattr(cfg, k) for k in ("vocab_size", "d_model", "n_layer", "n_head", "ctx_len", "pos_type")}
    return {"model": sizes | {"head_dim": cfg.head_dim}, "prefix_len": prefix_len, "new": new,
            "window": prefix_len + new, "device": str(device), "dtype": dtype, "note": "; ".join(notes) or None,
            "rows": rows}


def row_config(cfg: ModelConfig, g: int | str, w: int | None, pattern: dict) -> tuple[ModelConfig, dict]:
    """(the config of one bench-decode row, its label fields): see bench_decode."""
    from anatomy_cli.spec.components import BY_NAME

    # softmax attention of the model's sizes: no latent or sparse-attention settings
    softmax = {**cfg.model_dump(), "attn_type": "softmax", **dict.fromkeys(MLA_SIZES), "dsa": False,
               **dict.fromkeys(DSA_SIZES)}
    if g in LATENT_ROWS:
        latent = cfg.model_dump() if cfg.attn_type == "mla" else {
            **softmax, "attn_type": "mla", "qk_norm": False, "window": 0, "attn_sinks": False, "attn_gate": False,
            "rope_fraction": 1.0}
        if g == "mla":  # a dsa run's mla row: the same latent attention, dense
            latent |= {"dsa": False, **dict.fromkeys(DSA_SIZES)}
        c = validate(ModelConfig, latent | {"dsa": g == "dsa"}, prefix="model.")
        m = c.mla_dims
        if g == "mla":
            return c, {"n_kv_head": None, "attention": "MLA", "part": None,
                       "latent": f"{m.kv_lora_rank}+{m.qk_rope_head_dim}"}
        s = c.dsa_dims
        return c, {"n_kv_head": None, "attention": "DSA", "part": None, "top_k": s.top_k,
                   "latent": f"{m.kv_lora_rank}+{m.qk_rope_head_dim}+{s.index_head_dim}"}
    if g in PART_ROWS:  # the model's own softmax attention (n_kv_head, window) with this part on
        on = {k.removeprefix("model."): v for k, v in BY_NAME[g].on.items()}
        c = validate(ModelConfig, softmax | on, prefix="model.")
        name = attention_name(c.n_head, c.n_kv_head)
        return c, {"n_kv_head": c.n_kv_head, "attention": f"{name}+{g}", "part": g, "latent": None}
    c = validate(ModelConfig, {**softmax, "n_kv_head": g, "window": w, **pattern}, prefix="model.")
    return c, {"n_kv_head": g, "attention": attention_name(c.n_head, g), "part": None, "latent": None}

"""KV-cache budgets from sizes alone (no torch): what a model's decode state costs at a length.

  attn_shape       sizes (from a Hugging Face config.json or options) -> AttnShape
  kv_budget        AttnShape -> KV bytes, MHA vs GQA vs MQA (vs MLA's latent cache where a
                   kv_lora_rank is known), with the config's sliding-window layers bounded by their window
  fmt_bytes / attention_name / jsonable   what the exam commands print

`anatomy kv-budget` never imports torch.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from anatomy_cli.spec.config import (
    ConfigError,
    check_pattern,
    repeat_pattern,
)

# ------------------------------------------------------------------------------ 3. decode cost


def attention_name(n_head: int, n_kv_head: int) -> str:
    return "MHA" if n_kv_head == n_head else "MQA" if n_kv_head == 1 else "GQA"


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

"""The model, one module per component axis; `LM` assembles them from a ModelConfig."""

from .kv_cache import KVCache, kv_cache_bytes
from .lm import LM

__all__ = ["LM", "KVCache", "kv_cache_bytes"]

"""The model, one module per component axis; `LM` assembles them from a ModelConfig."""

from .kv_cache import KVCache
from .lm import LM

__all__ = ["LM", "KVCache"]

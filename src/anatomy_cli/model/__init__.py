"""The model, one module per component axis; `LM` assembles them from a ModelConfig.

  lm         the LM: embeddings, blocks, head; one forward for training and decoding
  block      pre/post/parallel wiring: one token mixer and one channel mixer per layer
  mixers     which mixer each layer holds, as one table (layer kinds; make_ffn: dense or MoE)
  attention / mla / dsa / gdn / moe / ffn / norms / positions   one file per component axis
  kv_cache   every mixer's decode state in one cache
  generate   text generation through the cache
  parts      the public parts API: the slots a part fills, the `part` decorator, build (a plugin's
             part, or anatomy's own FFNs, norms and positions, declared in spec/parts.py)

Imports: spec.
"""

from anatomy_cli.model.kv_cache import KVCache
from anatomy_cli.model.lm import LM

__all__ = ["LM", "KVCache"]

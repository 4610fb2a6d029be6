"""Token mixers: which module mixes information across positions in each layer, as one table.

ModelConfig.layer_kinds says what layer i is ("attn": global causal softmax attention; "gdn":
Gated DeltaNet, gdn.py; "local": softmax attention within a sliding window; "mla": multi-head
latent attention, mla.py; "dsa": mla reading only the keys an indexer picks, dsa.py; or a plugin
mixer's name, built by its registration: parts.build); MIXERS maps a kind to a constructor of its
module. The block holds one token mixer and one channel mixer (make_ffn) and never asks which.
Every token mixer has the same two methods (model/parts.py states them for a plugin's):

    forward(x [B, T, C], pos, end, rotate, cache=None, layer=0) -> [B, T, C]
        pos [T] | [B, T], end (last position + 1) and rotate (q, k, pos, end) -> (q, k) are the
        positions as the LM hands them (positions.py: RoPE rotates, a learned table or NoPE
        leaves q, k alone). cache is the KVCache: cache[layer] is this mixer's own state and
        cache.past_len the positions decoded before x (the LM advances it after the last layer).
    new_state(batch, max_len, device, dtype) -> this mixer's decode state (see kv_cache.py:
        capacity, nbytes(), reset(), and whatever update the mixer itself calls)

A mixer with a training loss of its own (class attribute own_loss = True: dsa's indexer) also takes
forward(..., terms=list) in a training forward and appends that loss to it (block.py, lm.py).

The rest of a kind is data in ModelConfig: mixer_params (exact parameters), state_bytes (its
decode state), context_flops (FLOPs beyond its matmuls). A mixer's output projection is named
`out`, so LM.reset_parameters scales its init by 1/sqrt(2 n_layer) like every residual branch.
The block keeps the attribute name `attn` for whichever mixer it holds: checkpoint keys
(blocks.{i}.attn.*) and the Llama export stay as they were.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

from anatomy_cli.model.attention import CausalSelfAttention
from anatomy_cli.model.dsa import SparseLatentAttention
from anatomy_cli.model.gdn import GatedDeltaNet
from anatomy_cli.model.mla import LatentAttention
from anatomy_cli.model.moe import MoE
from anatomy_cli.model.parts import build


def local_attention(cfg) -> nn.Module:
    return CausalSelfAttention(cfg, window=cfg.window)


MIXERS: dict[str, Callable[..., nn.Module]] = {"attn": CausalSelfAttention, "gdn": GatedDeltaNet,
                                               "local": local_attention, "mla": LatentAttention,
                                               "dsa": SparseLatentAttention}


def make_mixer(cfg, layer: int) -> nn.Module:
    """Layer `layer`'s token mixer: one of anatomy's own kinds, or the plugin mixer attn_type names."""
    kind = cfg.layer_kinds[layer]
    return MIXERS[kind](cfg) if kind in MIXERS else build(cfg, "mixer")


def make_ffn(cfg) -> nn.Module:
    """The block's channel mixer: the part cfg.ffn_type names, or (cfg.moe) a routed mixture of its FFNs."""
    return MoE(cfg) if cfg.moe else build(cfg, "ffn")

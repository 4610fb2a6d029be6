"""The public parts API: what a file outside anatomy imports to add a part without forking it.

    import torch.nn.functional as F
    from torch import nn
    from anatomy_cli.model.parts import Options, part

    class Relu2Options(Options):
        hidden: int | None = None  # None: 4 d_model

    @part("relu2", slot="ffn", options=Relu2Options, about="ReLU^2 FFN", source="So et al. 2021 (Primer)",
          params=lambda cfg, o: 2 * cfg.d_model * (o.hidden or 4 * cfg.d_model))
    class Relu2(nn.Module):
        def __init__(self, cfg, opts):
            super().__init__()
            hidden = opts.hidden or 4 * cfg.d_model
            self.up = nn.Linear(cfg.d_model, hidden, bias=False)
            self.down = nn.Linear(hidden, cfg.d_model, bias=False)

        def forward(self, x, stats=None):
            return self.down(F.relu(self.up(x)).square())

A spec lists the file (`plugins = ["examples/parts/relu2.py"]`, under [base] in an ablation spec; or
--plugin FILE), names the part in its slot's field (`model.ffn_type = "relu2"`, or `--flip relu2`: every
plugin part is a component) and sets its options as [model.part_options.relu2] keys. `anatomy
components check FILE` runs the battery anatomy's own parts pass (exams/parts_check.py) on it. A part is
built as cls(cfg), or cls(cfg, opts) when it declares options; cfg is the ModelConfig (d_model, n_head,
head_dim, n_kv_head, ctx_len, norm_eps, ... as plain attributes).

The slots, as the block calls them (x [B, T, C], C = cfg.d_model; every output has x's shape):

  mixer      forward(x, pos, end, rotate, cache=None, layer=0) -> [B, T, C]
             pos: [T] or [B, T] position ids; end: the last position + 1 (a host int); rotate(q, k, pos,
             end) -> (q, k): the model's positions on [B, heads, T, head_dim] queries and keys (RoPE
             rotates them; a learned table and NoPE leave them be); cache: None in training, else a
             KVCache whose cache[layer] is this layer's state and cache.past_len the positions before x.
             new_state(batch, max_len, device, dtype) -> the layer's decode state: KV (below) or one of
             its own with capacity (positions it holds, or None), nbytes() and reset(); a part declared
             cache=False has none and decoding runs the full forward over the window.
             A causal mixer: a query at position t reads positions <= t only (the battery checks it).
  ffn        forward(x, stats=None) -> [B, T, C] (`stats`: a mixture's routing statistics; ignore it)
  norm       forward(x) -> [B, T, C], of width cfg.d_model: every norm of the block and the final one
  positions  embed(x, pos, end) -> [B, T, C] (x plus a position signal, or x); rotate(q, k, pos, end,
             start=None) -> (q, k) (start given: pos is start..end-1)

Init: LM.reset_parameters draws every matrix (2-d or more) N(0, 0.02), scaled by 1/sqrt(2 n_layer) for a
weight named `out.weight` or `down.weight` (a residual branch's output: name a mixer's output
projection `out`, an FFN's `down`); vectors keep what the part's __init__ gave them.

The names this module exports (its public surface, tests/model/test_parts.py): part, Options, Part,
SLOTS, PartError, KV, WindowKV, visible, build, load_plugins.
"""

from __future__ import annotations

import torch
from torch import nn

from anatomy_cli.model.kv_cache import KV, WindowKV
from anatomy_cli.spec import components  # noqa: F401  (the built-in component names are reserved on import)
from anatomy_cli.spec.parts import SLOTS, Options, Part, PartError, load_plugins, part, resolve

__all__ = ["part", "Options", "Part", "SLOTS", "PartError", "KV", "WindowKV", "visible", "build", "load_plugins"]


def build(cfg, slot: str) -> nn.Module:
    """The module of the part cfg's `slot` field names, built by its registration: cls(cfg), or cls(cfg,
    opts) with its options. PartError when the part's code is not what cfg records (check_code)."""
    part_, opts = cfg.slot_part(slot)
    check_code(cfg, part_)
    impl = resolve(part_.build)
    module = impl(cfg) if part_.options is None else impl(cfg, opts)
    if part_.plugin:
        probe(module, part_, cfg)
    return module


def probe(module: nn.Module, part_: Part, cfg) -> None:
    """A plugin part's forward on a tiny input [1, 3, C] (no gradient, its own generator: the global stream
    stays as it was) must return its input's shape, else PartError in one line."""
    if not isinstance(module, nn.Module):
        raise PartError(f"part {part_.where()}: its build returned {type(module).__name__}, not a torch.nn.Module")
    T, gen = 3, torch.Generator().manual_seed(0)
    x, pos = torch.randn(1, T, cfg.d_model, generator=gen), torch.arange(T)
    q = torch.randn(1, cfg.n_head, T, cfg.head_dim, generator=gen)
    k = torch.randn(1, cfg.n_kv_head, T, cfg.head_dim, generator=gen)
    with torch.no_grad():
        try:
            if part_.slot == "mixer":
                got = [(module(x, pos, T, lambda q, k, pos, end, start=None: (q, k)), x)]
            elif part_.slot == "positions":
                got = [(module.embed(x, pos, T), x), *zip(module.rotate(q, k, pos, T), (q, k))]
            else:
                got = [(module(x), x)]
        except Exception as err:  # noqa: BLE001 - the part's own code: its last line
            raise PartError(f"part {part_.where()}: its forward on a {list(x.shape)} input raised "
                            f"{err.__class__.__name__}: {' '.join(str(err).split())[:160]}") from None
    for out, want in got:
        shape = list(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        if shape != list(want.shape):
            raise PartError(f"part {part_.where()}: its forward returned {shape} for a {list(want.shape)} input "
                            f"(a part returns its input's shape)")


def check_code(cfg, part_: Part) -> None:
    """A plugin part's loaded code must be the code cfg was resolved with (model.part_code): else one line
    naming the file and both hashes (the run trained other code than the file now holds)."""
    want = (cfg.part_code or {}).get(part_.name)
    if part_.plugin and want is not None and want != part_.sha256:
        raise PartError(f"part {part_.name}: the config records the code of {part_.origin} at sha256 {want[:12]}..., "
                        f"but the file loaded now is {part_.sha256[:12]}...: it changed since; restore it, or give "
                        f"--plugin the file as it was")


def visible(past: int, T: int, S: int, window: int, device) -> torch.Tensor:
    """Queries at positions past..past+T-1, S keys ending at the last query (positions
    past+T-S..past+T-1): a bool [T, S] mask (True = may attend), causal, and with a window W > 0
    also k > q - W. Softmax attention's own mask (attention.py), for a mixer that reads a cache."""
    q_pos = torch.arange(past, past + T, device=device)[:, None]  # [T, 1]
    k_pos = torch.arange(past + T - S, past + T, device=device)[None, :]  # [1, S]
    mask = k_pos <= q_pos  # [T, S]
    return mask & (k_pos > q_pos - window) if window else mask

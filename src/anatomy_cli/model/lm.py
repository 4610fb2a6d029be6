"""The language model: token embedding -> (positions) -> blocks -> final norm (pre only) -> head.

One forward serves training, evaluation and cached decoding:
    forward(idx [B, T], targets [B, T] | None, cache: KVCache | None, pos [T] | [B, T] | None,
            last_only=False, aux=False) -> (logits, loss), or (logits, loss, aux dict) with aux=True
Positions default to past_len .. past_len + T - 1, so decoding continues where the cache stopped.
aux=True also returns what the Trainer adds or records besides the loss, as data: {} for a dense
model; with a mixture of experts (cfg.moe) "moe_aux_loss" (the load-balancing loss) and
"expert_counts" ([L, E] tokens routed per expert per layer), see moe.balance; with sparse attention
(cfg.dsa) "dsa_indexer_loss" (the indexer's KL loss, mean over dsa layers, dsa.py). Nothing is kept on
the modules between calls, so the forward stays a pure function of weights and inputs.
No linear layer has a bias. Embedding and head are untied unless cfg.tie_embeddings, where the head
reuses the token table (Press & Wolf 2017; GPT-2, Gemma): V * d fewer parameters, one init draw.
cfg.logit_softcap = c > 0 caps every logit to c * tanh(logits / c) (Gemma 2, Gemma Team 2024, c = 30;
Bello et al. 2016 for attention logits), in training, evaluation and generation alike.
Init (reset_parameters) draws from the global stream in parameter order (cfg.init_key "order"), or each
parameter from a generator keyed by (seed, its name) ("name"): then two models share every parameter of
the same name and shape, so a paired comparison starts both arms from the same weights.
"""

from __future__ import annotations

import functools
import hashlib
import math

import torch
import torch.nn.functional as F
from torch import nn

from anatomy_cli.model.block import Block
from anatomy_cli.model.dsa import indexer_terms
from anatomy_cli.model.gdn import decay_log
from anatomy_cli.model.kv_cache import KVCache
from anatomy_cli.model.moe import balance
from anatomy_cli.model.norms import make_norm
from anatomy_cli.model.positions import make_positions
from anatomy_cli.spec.parts import PartError

HEAD_PAD = 64  # the loss's head matmul pads the vocabulary to a multiple of this


# The 1-d parameters drawn at random, by their last name (every other vector is ones or zeros): keyed
# init redraws each from its own generator. tests/model/test_keyed_init.py fails for one left out.
DRAWN_VECTORS = {"A_log": decay_log}


def keyed_generator(seed: int, name: str) -> torch.Generator:
    """A CPU generator seeded by (seed, a parameter's qualified name): the first 63 bits of
    sha256("seed:name"), stable across processes and versions (Python's hash() is salted per process).
    The seed is taken as torch.manual_seed takes it (mod 2^64), so -1 and 2^64 - 1 are one key."""
    digest = hashlib.sha256(f"{seed % 2**64}:{name}".encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "big") >> 1)


class LM(nn.Module):
    def __init__(self, cfg, seed: int | None = None):
        """seed: the run's, keyed init's key (cfg.init_key "name"); None: torch.initial_seed()."""
        super().__init__()
        if cfg.vocab_size is None:
            raise ValueError("model.vocab_size is not set (it is filled in from the data)")
        self.cfg = cfg
        self.tok = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.positions = make_positions(cfg)
        self.blocks = nn.ModuleList(Block(cfg, layer) for layer in range(cfg.n_layer))
        self.final_norm = make_norm(cfg) if cfg.norm_pos == "pre" else nn.Identity()
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:  # one shared [V, C] Parameter; named_parameters lists it once, as tok.weight
            self.head.weight = self.tok.weight
        self.softcap = SoftCap(cfg.logit_softcap) if cfg.logit_softcap > 0 else nn.Identity()
        # The loss's head matmul runs on the vocabulary padded to a multiple of 64 (compute only: the
        # parameter stays [V, C]). MKL's sgemm is ~1.7x slower at width 1719 than at 1728 (109 vs 183
        # GFLOP/s on the 2-core dev machine): padding makes the seed-size step ~3-4% faster, measured
        # paired against the unpadded head. The padded columns get zero weight rows
        # and a -inf "bias", so softmax gives them probability 0 and the loss and gradients are unchanged.
        # With a soft cap the -inf is added after the cap: tanh(-inf / c) = -1 would give them weight.
        padded = -(-cfg.vocab_size // HEAD_PAD) * HEAD_PAD
        mask = torch.zeros(padded)
        mask[cfg.vocab_size :] = float("-inf")
        self.register_buffer("head_mask", mask, persistent=False)
        self.reset_parameters(seed)

    @torch.no_grad()
    def reset_parameters(self, seed: int | None = None) -> None:
        """GPT-2 init: N(0, 0.02), residual output projections scaled by 1/sqrt(2L); vectors as built
        (norm weights and dt_bias ones, biases and sinks zeros, DRAWN_VECTORS at random).

        cfg.init_key "order": the matrices in turn from the global generator (seeded before building).
        "name": every random parameter from keyed_generator(seed, its name), the same distribution;
        seed None is torch.initial_seed(), the seed the global generator was last given."""
        keyed = self.cfg.init_key == "name"
        seed = torch.initial_seed() if seed is None else seed
        for name, p in self.named_parameters():
            gen = keyed_generator(seed, name) if keyed else None
            if p.dim() < 2:
                draw = DRAWN_VECTORS.get(name.rpartition(".")[2])
                if keyed and draw is not None:
                    p.copy_(draw(p.numel(), gen))
                continue  # the rest are ones or zeros: no random draw
            std = 0.02 / math.sqrt(2 * self.cfg.n_layer) if name.endswith(("out.weight", "down.weight")) else 0.02
            if keyed:  # drawn on the host: the same tensor on every device
                p.copy_(torch.empty(p.shape, device=gen.device).normal_(0.0, std, generator=gen))
            else:
                nn.init.normal_(p, mean=0.0, std=std)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    @property
    def can_cache(self) -> bool:
        """Whether every layer's mixer keeps a decode state (a plugin mixer may declare none: cache=False)."""
        return all(callable(getattr(b.attn, "new_state", None)) for b in self.blocks)

    def new_cache(self, batch: int, max_len: int, dtype=None) -> KVCache:
        """Every layer's decode state, each made by its own mixer, for up to max_len positions."""
        if not self.can_cache:
            no = next(b.attn for b in self.blocks if not callable(getattr(b.attn, "new_state", None)))
            raise PartError(f"the token mixer {type(no).__name__} keeps no decode state (declared cache=False): "
                            f"decode by the full forward (generate does, uncached)")
        p = self.head.weight
        return KVCache([b.attn.new_state(batch, max_len, p.device, dtype or p.dtype) for b in self.blocks])

    def forward(self, idx, targets=None, cache: KVCache | None = None, pos=None, last_only: bool = False,
                aux: bool = False):
        """last_only: logits for the last position only ([B, 1, V]), all generation needs.
        aux: also return the channel mixers' outputs besides the loss (see the module docstring)."""
        B, T = idx.shape
        past = cache.past_len if cache is not None else 0
        if cache is not None:
            cache.check_room(T)
        rotate = self.positions.rotate
        if pos is None:  # the usual case: positions past..past+T-1, known on the host
            pos, end = torch.arange(past, past + T, device=idx.device), past + T
            rotate = functools.partial(rotate, start=past)
        else:
            end = int(pos.max()) + 1  # explicit positions: one host read
        x = self.positions.embed(self.tok(idx), pos, end)  # [B, T, C]
        stats = [] if aux else None  # each MoE layer appends its routing statistics
        terms = [] if aux else None  # each dsa layer appends its indexer loss
        for layer, block in enumerate(self.blocks):
            x = block(x, pos, end, rotate, cache, layer, stats, terms)
        if cache is not None:
            cache.advance(T)
        logits, loss = self.logits_and_loss(x, targets, last_only)
        return (logits, loss, balance(stats, B * T) | indexer_terms(terms)) if aux else (logits, loss)

    def logits_and_loss(self, x, targets, last_only: bool):
        """x: [B, T, C] after the last block -> (logits [B, T or 1, V], cross-entropy or None)."""
        B, T, _ = x.shape
        if last_only:
            x = x[:, -1:]  # [B, 1, C]
        x = self.final_norm(x)
        if targets is None:
            return self.softcap(self.head(x)), None  # [B, T, V]
        w = self.head.weight
        pad = self.head_mask.shape[0] - w.shape[0]
        # [B, T, V_padded]; a vocabulary that is already a multiple of 64 needs no mask
        if not pad:
            logits = self.softcap(F.linear(x, w))
        elif isinstance(self.softcap, SoftCap):  # cap first, then mask (see __init__)
            logits = self.softcap(F.linear(x, F.pad(w, (0, 0, 0, pad)))) + self.head_mask
        else:
            logits = F.linear(x, F.pad(w, (0, 0, 0, pad)), self.head_mask)
        loss = F.cross_entropy(logits.float().view(B * T, -1), targets.reshape(B * T))
        return logits[..., : w.shape[0]], loss


class SoftCap(nn.Module):
    """c * tanh(x / c): smooth, monotone, |out| < c (Gemma 2's final-logit soft-capping, c = 30)."""

    def __init__(self, cap: float):
        super().__init__()
        self.cap = cap

    def forward(self, x):
        return self.cap * torch.tanh(x / self.cap)

"""One transformer block: the only place where pre-norm vs post-norm (and serial vs parallel) is wired.

    post-norm (2017, Vaswani et al.)         pre-norm (GPT-2, LLaMA)
    x ─┬─ attn ─(+)─ norm1 ─┬─ ffn ─(+)─ norm2    x ─┬─ norm1 ─ attn ─(+)─┬─ norm2 ─ ffn ─(+)
       └────────┘           └───────┘              └──────────────────┘   └──────────────────┘

    parallel, pre-norm (GPT-J, PaLM)         parallel, post-norm
    x ─┬─ norm1 ─┬─ attn ─(+)                  x ─┬─ attn ─(+)─ norm1
       │         └─ ffn ──(+)                     ├─ ffn ──(+)
       └──────────────────┘                       └────────┘

Post-norm normalises the residual stream itself after every sub-layer, so gradients to early layers
pass through every norm; pre-norm leaves an identity path from input to output (Xiong et al. 2020),
which is why it trains deep stacks without warmup. The LM adds a final norm only for pre-norm.

Parallel (cfg.parallel_block): attention and FFN read the same input and their outputs are added to
the residual together, x + attn(n1(x)) + ffn(n1(x)) (Wang & Komatsuzaki 2021, GPT-J; Chowdhery et al.
2022, PaLM: ~15% faster at scale, the two input matmuls can be fused). One norm per block: norm2 is
absent (nn.Identity).

The token mixer (`attn`) is whatever layer_kinds says this layer is (mixers.py); the channel mixer
(`ffn`) whatever ffn_type and moe say (ffn.py: a dense GELU or SwiGLU FFN, or moe.py: a routed
mixture of them). The wiring above is the same for every pair. The block calls ffn(h, stats) and
never asks which FFN it holds; `stats` (None, or a list the LM reads back) carries a mixture's
routing statistics up to the LM.
"""

from __future__ import annotations

from torch import nn

from anatomy_cli.model.mixers import make_ffn, make_mixer
from anatomy_cli.model.norms import make_norm


class Block(nn.Module):
    def __init__(self, cfg, layer: int):
        super().__init__()
        self.pre, self.parallel = cfg.norm_pos == "pre", cfg.parallel_block
        self.norm1, self.attn = make_norm(cfg), make_mixer(cfg, layer)  # attn: this layer's token mixer
        self.norm2, self.ffn = nn.Identity() if self.parallel else make_norm(cfg), make_ffn(cfg)
        self.own_loss = getattr(self.attn, "own_loss", False)  # a mixer with a training loss of its own (dsa)

    def forward(self, x, pos, end, rotate, cache=None, layer: int = 0, stats: list | None = None,
                terms: list | None = None):
        """terms: None, or a list a mixer with a loss of its own (own_loss: dsa's indexer) appends it to."""
        own = {"terms": terms} if terms is not None and self.own_loss else {}
        if self.parallel:
            if self.pre:
                h = self.norm1(x)  # one normed input feeds both branches
                return x + self.attn(h, pos, end, rotate, cache, layer, **own) + self.ffn(h, stats)
            return self.norm1(x + self.attn(x, pos, end, rotate, cache, layer, **own) + self.ffn(x, stats))
        if self.pre:
            x = x + self.attn(self.norm1(x), pos, end, rotate, cache, layer, **own)
            return x + self.ffn(self.norm2(x), stats)
        x = self.norm1(x + self.attn(x, pos, end, rotate, cache, layer, **own))
        return self.norm2(x + self.ffn(x, stats))

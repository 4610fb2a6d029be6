"""A routed mixture of experts in place of the dense FFN (Shazeer et al. 2017; Switch, Fedus et al.
2022; Mixtral; Qwen3-MoE; DeepSeek V3): a channel mixer with the dense FFN's interface.

    x [N, C] ─ router (C -> E, no bias) ─ softmax over E (fp32) ─ top k ─ renormalise ─ w [N, k]
       ├─ expert e_1 .. e_k: each a dense FFN of cfg.ffn_type, hidden h ─ y = Σ_j w_j · expert_{e_j}(x)
       └─ (moe_shared) y += sigmoid(g · x) · shared(x)   an always-on expert, gated per token

Routing is Qwen3-MoE's with norm_topk_prob=True: softmax over all E experts first, then the top k,
whose weights are divided by their sum. No capacity and no dropping: every token reaches its k
experts and its output depends on that token alone, so cached decode needs no state of its own.
The shared expert is Qwen2-MoE's, Qwen3-Next's and Qwen3.5's (sigmoid gate, a 1 x C weight);
DeepSeek V3 adds its shared expert ungated.

Dispatch: the N * k (token, choice) slots are sorted by expert and each expert runs one matmul chain
on its contiguous slice. The slice sizes depend on the data (one host read of E counts per layer),
so torch.func.vmap cannot batch this module and torch.compile breaks its graph there. Both
fixed-shape forms were measured at d_model 128, 8 experts, 1024 tokens (benchmarks/bench_moe.py,
whole training steps, paired): every expert on every token, masked, costs E/k = 4x the expert FLOPs
and took 2x as long; torch's grouped_mm (offsets on the device) was as fast, but on CPU it needs
16-byte aligned sizes and, under torch.compile, bf16. Slots go to the experts and back by
permutations (a gather and its inverse), so no two gradient contributions are scatter-added into
one place (index_add_'s are, in an order a GPU does not fix).

Load balancing (`balance`): Switch's E · Σ_e f_e · P_e with f_e the top-k assignments per token to
expert e and P_e its mean router probability, both pooled over every MoE layer's tokens before the
product, as transformers' load_balancing_loss_func does (Qwen3-MoE, Mixtral). Balanced routing
gives k. The Trainer adds train.moe_aux_loss times it to the training loss; evaluation never does.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from anatomy_cli.model.ffn import FFNS


class Stacked(nn.Module):
    """E weight matrices as one [E, out, in] tensor (named `weight`, so LM's init treats it as a matrix)."""

    def __init__(self, n: int, out_features: int, in_features: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n, out_features, in_features))


def activate(h: torch.Tensor, ffn_type: str) -> torch.Tensor:
    """An expert's hidden activation: SwiGLU's silu(gate) * up (rows [gate; up]) or GELU's gelu(up)."""
    if ffn_type == "swiglu":
        gate, up = h.chunk(2, dim=-1)
        return F.silu(gate) * up
    return F.gelu(h)


class MoE(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        E, C, h = cfg.moe_experts, cfg.d_model, cfg.moe_expert_hidden
        self.k, self.ffn_type = cfg.moe_top_k, cfg.ffn_type
        self.router = nn.Linear(C, E, bias=False)
        self.up = Stacked(E, (2 if cfg.ffn_type == "swiglu" else 1) * h, C)  # SwiGLU: gate rows, then up rows
        self.down = Stacked(E, C, h)
        self.shared = FFNS[cfg.ffn_type](cfg, h) if cfg.moe_shared else None
        self.shared_gate = nn.Linear(C, 1, bias=False) if cfg.moe_shared else None

    def forward(self, x: torch.Tensor, stats: list | None = None) -> torch.Tensor:
        """x: [B, T, C] -> [B, T, C]. `stats`, when a list, gets this layer's (counts [E], probability sums [E])."""
        B, T, C = x.shape
        flat = x.reshape(B * T, C)  # [N, C]
        probs = F.softmax(self.router(flat).float(), dim=-1)  # [N, E], fp32 as in transformers
        weight, expert = probs.topk(self.k, dim=-1)  # [N, k], best first
        weight = (weight / weight.sum(dim=-1, keepdim=True)).to(x.dtype)  # renormalised over the k chosen
        slots = expert.reshape(-1)  # [N k]: slot s is token s // k's choice s % k
        counts = torch.bincount(slots, minlength=self.router.out_features)  # [E] slots per expert
        y = self.experts(flat, slots, counts).view(B * T, self.k, C)  # [N, k, C], slot order
        y = (y * weight.unsqueeze(-1)).sum(dim=1)  # [N, C]
        if self.shared is not None:
            y = y + torch.sigmoid(self.shared_gate(flat)) * self.shared(flat)
        if stats is not None:
            stats.append((counts.float(), probs.sum(dim=0)))
        return y.view(B, T, C)

    def experts(self, flat: torch.Tensor, slots: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """Every slot through its expert: [N, C] tokens, [N k] expert ids -> [N k, C] outputs in slot order."""
        N, C = flat.shape
        order = slots.argsort(stable=True)  # [N k] slot ids grouped by expert
        xs = flat.unsqueeze(1).expand(N, self.k, C).reshape(N * self.k, C)[order]  # [N k, C], by expert
        outs = []
        for e, chunk in enumerate(xs.split(counts.tolist())):  # the host read: E slice sizes
            h = activate(F.linear(chunk, self.up.weight[e]), self.ffn_type)  # [n_e, h]
            outs.append(F.linear(h, self.down.weight[e]))  # [n_e, C]
        return torch.cat(outs)[order.argsort()]  # back from expert order to slot order


def balance(stats: list, n_tokens: int) -> dict[str, torch.Tensor]:
    """The MoE layers' outputs for the Trainer ({} when there are none).

    moe_aux_loss: E · Σ_e f_e · P_e over this forward's tokens, f and P pooled over the layers (see
    the module docstring); differentiable through P. expert_counts: [L, E] slots routed to each expert
    in each MoE layer (k per token), for the routing fractions a run records.
    """
    if not stats:
        return {}
    counts = torch.stack([c for c, _ in stats])  # [L, E]
    probs = torch.stack([p for _, p in stats])  # [L, E]
    L, E = counts.shape
    f = counts.sum(dim=0) / (L * n_tokens)  # [E], sums to k
    p = probs.sum(dim=0) / (L * n_tokens)  # [E], sums to 1
    return {"moe_aux_loss": E * (f * p).sum(), "expert_counts": counts}

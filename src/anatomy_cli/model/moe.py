"""A routed mixture of experts in place of the dense FFN (Shazeer et al. 2017; Switch, Fedus et al.
2022; Mixtral; Qwen3-MoE; DeepSeek V3): a channel mixer with the dense FFN's interface.

    x [N, C] ─ router (C -> E, no bias) ─ moe_router: softmax_topk | deepseek_topk ─ w [N, k], experts [N, k]
       ├─ expert e_1 .. e_k: each a dense FFN of cfg.ffn_type, hidden h ─ y = Σ_j w_j · expert_{e_j}(x)
       └─ (moe_shared) y += g(x) · shared(x)   an always-on expert; g = sigmoid(w_g · x), or 1 (deepseek)

Two routers (moe_router), both on the same C -> E logits:
  softmax-topk  Qwen3-MoE's with norm_topk_prob=True: softmax over all E experts first, then the top
                k, whose weights are divided by their sum. Balanced by Switch's loss (`balance`).
  deepseek      DeepSeek-V3's (sec. 2.1.2 of its report; transformers' DeepseekV3TopkRouter): sigmoid
                affinities s; experts chosen on s + b, b a per-expert bias (`select_bias`, a buffer:
                no gradient, not a parameter) that only picks; the E experts fall into moe_n_group
                groups, each scored by the sum of its top-2 biased affinities, and only the
                moe_topk_group best groups' experts may be chosen; the weights are the chosen
                *unbiased* s, divided by their sum, times moe_routed_scaling_factor. No balance
                loss: after each training step the Trainer moves b toward balance (`update_biases`,
                Wang et al. 2024's aux-loss-free balancing). The shared expert is ungated.
No capacity and no dropping: every token reaches its k experts and its output depends on that token
alone, so cached decode needs no state of its own. The gated shared expert is Qwen2-MoE's,
Qwen3-Next's and Qwen3.5's (a 1 x C weight); DeepSeek V3 adds its shared expert ungated.

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
The deepseek router has no such loss (its layers report counts only); `update_biases` balances it.
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
    """An expert's hidden activation: SwiGLU's silu(gate) * up (rows [gate; up]), GELU's gelu(up), SiLU's silu(up)."""
    if ffn_type == "swiglu":
        gate, up = h.chunk(2, dim=-1)
        return F.silu(gate) * up
    return F.silu(h) if ffn_type == "silu" else F.gelu(h)


def softmax_topk(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Qwen3-MoE's router: logits [N, E] -> (weights [N, k] fp32, experts [N, k], probabilities [N, E])."""
    probs = F.softmax(logits.float(), dim=-1)  # [N, E], fp32 as in transformers
    weight, expert = probs.topk(k, dim=-1)  # [N, k], best first
    return weight / weight.sum(dim=-1, keepdim=True), expert, probs  # renormalised over the k chosen


def deepseek_topk(logits: torch.Tensor, bias: torch.Tensor, k: int, n_group: int, topk_group: int,
                  scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepSeek-V3's router: logits [N, E] (fp32), selection bias [E] -> (weights [N, k], experts [N, k]).
    The bias decides which experts; the weights are the unbiased sigmoid affinities of those experts."""
    scores = logits.sigmoid()  # [N, E] affinities s
    choice = scores + bias  # [N, E] s + b: for choosing only
    N, E = choice.shape
    if topk_group < n_group:  # group-limited: the topk_group groups with the largest top-2 sums
        groups = choice.view(N, n_group, E // n_group)  # [N, G, E/G]
        kept = groups.topk(2, dim=-1).values.sum(dim=-1).topk(topk_group, dim=-1).indices  # [N, topk_group]
        mask = torch.zeros(N, n_group, dtype=torch.bool, device=choice.device).scatter_(1, kept, True)  # [N, G]
        choice = groups.masked_fill(~mask.unsqueeze(-1), float("-inf")).view(N, E)
    expert = choice.topk(k, dim=-1).indices  # [N, k]
    weight = scores.gather(1, expert)  # [N, k] unbiased
    return weight / (weight.sum(dim=-1, keepdim=True) + 1e-20) * scale, expert  # 1e-20 as in transformers


class MoE(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        E, C, h = cfg.moe_experts, cfg.d_model, cfg.moe_expert_hidden
        self.k, self.ffn_type = cfg.moe_top_k, cfg.ffn_type
        self.router = nn.Linear(C, E, bias=False)
        self.up = Stacked(E, (2 if cfg.ffn_type == "swiglu" else 1) * h, C)  # SwiGLU: gate rows, then up rows
        self.down = Stacked(E, C, h)
        self.shared = FFNS[cfg.ffn_type](cfg, h) if cfg.moe_shared else None
        self.deepseek = cfg.moe_router == "deepseek"
        self.shared_gate = nn.Linear(C, 1, bias=False) if cfg.moe_shared and not self.deepseek else None
        if self.deepseek:  # a buffer: in the state dict and checkpoints, moved by update_biases, never by a gradient
            self.register_buffer("select_bias", torch.zeros(E))
            self.routing = (cfg.moe_n_group, cfg.moe_topk_group, cfg.moe_routed_scaling_factor)

    def forward(self, x: torch.Tensor, stats: list | None = None) -> torch.Tensor:
        """x: [B, T, C] -> [B, T, C]. `stats`, when a list, gets this layer's (counts [E], probability
        sums [E], or None for the deepseek router)."""
        B, T, C = x.shape
        flat = x.reshape(B * T, C)  # [N, C]
        if self.deepseek:  # logits in at least fp32, as transformers' DeepseekV3TopkRouter (fp64 stays fp64)
            dtype = torch.promote_types(x.dtype, torch.float32)
            logits = F.linear(flat.to(dtype), self.router.weight.to(dtype)).to(dtype)  # [N, E]
            weight, expert = deepseek_topk(logits, self.select_bias, self.k, *self.routing)
            probs = None
        else:
            weight, expert, probs = softmax_topk(self.router(flat), self.k)
        weight = weight.to(x.dtype)  # [N, k]
        slots = expert.reshape(-1)  # [N k]: slot s is token s // k's choice s % k
        counts = torch.bincount(slots, minlength=self.router.out_features)  # [E] slots per expert
        y = self.experts(flat, slots, counts).view(B * T, self.k, C)  # [N, k, C], slot order
        y = (y * weight.unsqueeze(-1)).sum(dim=1)  # [N, C]
        if self.shared_gate is not None:
            y = y + torch.sigmoid(self.shared_gate(flat)) * self.shared(flat)
        elif self.shared is not None:  # deepseek: ungated
            y = y + self.shared(flat)
        if stats is not None:
            stats.append((counts.float(), None if probs is None else probs.sum(dim=0)))
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
    in each MoE layer (k per token), for the routing fractions a run records and update_biases.
    """
    if not stats:
        return {}
    counts = torch.stack([c for c, _ in stats])  # [L, E]
    if stats[0][1] is None:  # the deepseek router: no balance loss (update_biases balances it)
        return {"expert_counts": counts}
    probs = torch.stack([p for _, p in stats])  # [L, E]
    L, E = counts.shape
    f = counts.sum(dim=0) / (L * n_tokens)  # [E], sums to k
    p = probs.sum(dim=0) / (L * n_tokens)  # [E], sums to 1
    return {"moe_aux_loss": E * (f * p).sum(), "expert_counts": counts}


@torch.no_grad()
def update_biases(model: nn.Module, counts: torch.Tensor, rate: float) -> None:
    """Aux-loss-free balancing (Wang et al. 2024; DeepSeek-V3 report sec. 2.1.2), after a training step:
    every deepseek MoE layer's selection bias b_e += rate * sign(mean load - load_e), the load being the
    slots routed to each expert in that step's batch (counts [L, E], balance's expert_counts). An
    overloaded expert's bias falls by rate, an underloaded one's rises, an exactly average one's stays.
    Off the loss: no gradient, the optimizer never sees b. A model without such layers is left alone."""
    layers = [m for m in model.modules() if isinstance(m, MoE) and m.deepseek]
    if not layers:
        return
    assert len(layers) == counts.shape[0], (len(layers), counts.shape)
    step = rate * torch.sign(counts.mean(dim=-1, keepdim=True) - counts)  # [L, E]
    for layer, delta in zip(layers, step):
        layer.select_bias += delta.to(layer.select_bias.dtype)

"""DeepSeek sparse attention (DSA, DeepSeek-AI 2025: DeepSeek-V3.2-Exp, sec. 2.1): MLA (mla.py) whose
queries each read only the top-k earlier keys a small "lightning indexer" picks.

The indexer scores every earlier key s for each query t with its own few heads (I heads of size D,
sizes ModelConfig.dsa_dims) and ONE key per token, shared by its heads as MLA's rope key is:

    q_latent [B, T, r_q] (MLA's normed query latent) ─ wq ─> q_I [B, I, T, D]   first p dims rotated
    x [B, T, d] ─ wk ─ LayerNorm ─> k_I [B, 1, S, D]                             first p dims rotated  <- cached
    x ─ w ─> w [B, T, I] * I^-1/2
    score[t, s] = sum_h w[t, h] ReLU(q_I[h, t] . k_I[s] / sqrt(D))     (-inf for s > t: causal)

Attention (MLA's, unchanged) then reads the k keys of highest score per query and nothing else; a
query with k or fewer earlier keys (itself included) reads all of them. Equal scores go to the
earlier key (a stable sort), so the full forward and cached decode pick the same keys even where
ReLU zeroes every head of several keys; HF's torch.topk leaves such ties to the kernel, so the two
match where no tie sits at the top-k boundary. With the default of at least 8 indexer heads such ties
are rare (0.0-0.3 % of the queries where top-k binds at init; with 2 heads a quarter: issue 37,
benchmarks/dsa_ties.py, tests/model/test_dsa_ties.py). In training
the selection is a bool mask over the dense scores, so the FLOPs are MLA's; the saving is DeepSeek's
kernel reading only k keys, which anatomy does not model (context_flops counts the k keys read).

Training: the indexer's own loss (DeepSeek-V3.2, continued pre-training, sparse stage). Top-k
selection is not differentiable, so the language-model loss gives the indexer no gradient (HF's
DeepseekV32Indexer runs under torch.no_grad, as the plain forward here does). A training forward
(LM.forward(..., aux=True), with `terms` a list) also returns, per layer, the KL divergence of the
indexer's distribution from the main attention's, over the keys each query read:

    p_t = sum_h A[h, t, :] / H         the main attention's probabilities of query t, summed over its H
                                       heads and L1-normalised; detached. A is the softmax over the keys
                                       S_t the query reads, so p_t lives on S_t (restricted and
                                       renormalised there by construction)
    q_t = softmax_{s in S_t} score[t, s]     the indexer's scores, with gradient, from DETACHED x, q_latent
    loss = mean over the B * T queries of KL(p_t || q_t) = sum_{s in S_t} p_t[s] (log p_t[s] - log q_t[s])

so the indexer learns from this loss alone and the rest of the model from the LM loss alone. LM
averages it over the dsa layers (aux["dsa_indexer_loss"]); the Trainer adds train.dsa_indexer_loss
times it to the training loss (0: the indexer stays at its init, as HF's forward leaves it) and
evaluation never does. The selection is the same either way (the same scores, then the same stable
sort), so a training forward reads the keys a plain forward or cached decode reads. Not modelled:
DeepSeek's dense warm-up stage (the indexer trained alone, over all keys, the main model frozen).

Sinks and the output gate (cfg.attn_sinks, cfg.attn_gate) are MLA's (mla.py): the sink joins each
query's softmax over the keys it reads, and with sinks A above is that softmax, the sink's column
dropped (rows summing to under 1), so p_t weighs a head by the share it gives keys (dsa_loss).

Decode state: MLA's latent and rope key plus the indexer's key per position (DsaKV), r + p + D
values per token per layer (ModelConfig.state_bytes).

Mapping onto Hugging Face's DeepseekV32Attention (transformers 5.x), pinned by tests/model/test_dsa.py:
MLA's weights as in mla.py (DeepseekV32Attention always uses rope_interleave: the rope rows are
permuted as tests/model/test_mla.py does), and the indexer's
    wq = indexer.wq_b   wk = indexer.wk   k_norm = indexer.k_norm (LayerNorm, eps 1e-6)   w = indexer.weights_proj
  - the indexer's rope part is the FIRST p dims of each q_I and k_I (HF: (rot | pass)), half-split
    pairing (HF's indexer uses non-interleaved RoPE), the same angles as MLA's rope part.
  - HF skips DeepSeek's Hadamard rotation and FP8 scoring (an orthogonal map and a precision trick).
"""

from __future__ import annotations

import torch
from torch import nn

from anatomy_cli.model.attention import visible
from anatomy_cli.model.kv_cache import tensor_bytes
from anatomy_cli.model.mla import LatentAttention, LatentKV

INDEX_EPS = 1e-6  # the indexer key's LayerNorm eps (HF: nn.LayerNorm(index_head_dim, eps=1e-6))


class DsaKV(LatentKV):
    """One DSA layer's decode state: MLA's (LatentKV) plus the indexer key [B, max_len, D] of every position."""

    def __init__(self, batch: int, max_len: int, kv_lora_rank: int, rope_dim: int, index_dim: int, device=None,
                 dtype=torch.float32):
        super().__init__(batch, max_len, kv_lora_rank, rope_dim, device, dtype)
        self.index_k = torch.zeros(batch, max_len, index_dim, device=device, dtype=dtype)

    def update_index(self, k: torch.Tensor, past: int) -> torch.Tensor:
        """Write indexer keys [B, T, D] at past..past+T-1; return those of 0..past+T-1 [B, past + T, D]."""
        end = past + k.shape[1]
        self.index_k[:, past:end] = k
        return self.index_k[:, :end].to(k.dtype)

    def nbytes(self) -> int:
        return super().nbytes() + tensor_bytes(self.index_k)


class Indexer(nn.Module):
    """The lightning indexer: which k earlier keys each query's attention reads."""

    def __init__(self, cfg):
        super().__init__()
        m, s = cfg.mla_dims, cfg.dsa_dims
        self.n_head, self.head_dim, self.top_k = s.index_n_heads, s.index_head_dim, s.top_k
        self.rope_dim = m.qk_rope_head_dim
        self.wq = nn.Linear(m.q_lora_rank, self.n_head * self.head_dim, bias=False)
        self.wk = nn.Linear(cfg.d_model, self.head_dim, bias=False)
        self.k_norm = nn.LayerNorm(self.head_dim, eps=INDEX_EPS)
        self.w = nn.Linear(cfg.d_model, self.n_head, bias=False)

    @torch.no_grad()  # as HF's: the LM loss reaches no indexer weight (its own loss: scores, dsa_loss)
    def forward(self, x, q_latent, pos, end, rope=None, state=None, past: int = 0) -> torch.Tensor:
        """x [B, T, d], q_latent [B, T, r_q] -> bool [B, 1, T, S] (True = attention may read the key):
        causal and, per query, the top_k keys by score. rope: MLA's rotation over p dims (None: learned
        positions or NoPE leave the indexer unrotated too); state: this layer's DsaKV (S = past + T)."""
        return top_k_keys(*self.scores(x, q_latent, pos, end, rope, state, past), self.top_k).unsqueeze(1)

    def scores(self, x, q_latent, pos, end, rope=None, state=None, past: int = 0):
        """(index scores [B, T, S], causal [T, S]) of forward's arguments, with gradient when it is on."""
        B, T, _ = x.shape
        q = self.wq(q_latent).view(B, T, self.n_head, self.head_dim).transpose(1, 2)  # [B, I, T, D]
        k = self.k_norm(self.wk(x)).unsqueeze(1)  # [B, 1, T, D]
        if rope is not None:  # the first p dims of each, half-split (HF: non-interleaved)
            p = self.rope_dim
            q_rot, k_rot = rope.rotate(q[..., :p], k[..., :p], pos, end)
            q, k = torch.cat((q_rot, q[..., p:]), dim=-1), torch.cat((k_rot, k[..., p:]), dim=-1)
        k = k.squeeze(1)  # [B, T, D]
        if state is not None:
            k = state.update_index(k, past)  # [B, S, D]
        S = k.shape[1]
        scores = torch.relu(q @ k.unsqueeze(1).transpose(-1, -2) * self.head_dim**-0.5)  # [B, I, T, S]
        w = self.w(x) * self.n_head**-0.5  # [B, T, I]
        index = torch.einsum("bth,bhts->bts", w, scores)  # [B, T, S]
        return index, visible(past, T, S, 0, x.device)


def top_k_keys(index: torch.Tensor, causal: torch.Tensor, k: int) -> torch.Tensor:
    """index [B, T, S] scores, causal [T, S] (True = an earlier key or the query's own) -> bool [B, T, S]:
    the k causal keys of highest score per query, or all of them when it has k or fewer."""
    index = index.masked_fill(~causal, float("-inf"))  # later keys are never picked over earlier ones
    # top-k by a stable sort: equal scores go to the earlier key, identically in every chunking
    order = torch.sort(index, dim=-1, descending=True, stable=True).indices[..., :k]  # [B, T, k]
    chosen = torch.zeros_like(index, dtype=torch.bool).scatter_(-1, order, True)
    return chosen & causal  # fewer than k earlier keys: the -inf picks are dropped here


def dsa_loss(q, k, read, index, scale: float, sinks=None) -> torch.Tensor:
    """The indexer's loss of one layer (see the module docstring): mean over queries of KL(p_t || q_t).
    q [B, H, T, n + p], k [B, H, S, n + p]: the main attention's queries and keys; read: bool [B, 1, T, S],
    the keys it reads; index [B, T, S]: the indexer's scores; scale: the attention's softmax scale;
    sinks: None, or the attention's sink logits [H] (cfg.attn_sinks): A is then the attention's own
    probabilities, the sink's column dropped, so a head resting on its sink weighs less in p_t.
    Only `index` carries gradient. In at least fp32 (bf16 autocast inputs are upcast)."""
    dtype = torch.promote_types(index.dtype, torch.float32)
    with torch.no_grad():  # the target: the attention's probabilities over the keys read, head-summed
        logits = (q.to(dtype) @ k.to(dtype).transpose(-1, -2)) * scale  # [B, H, T, S]
        logits = logits.masked_fill(~read, float("-inf"))
        if sinks is None:
            p = logits.softmax(dim=-1).sum(dim=1)  # [B, T, S]
        else:  # the sink joins each softmax as one more column, dropped after it (attention.sink_attention)
            sink = sinks.to(dtype).view(1, -1, 1, 1).expand(*logits.shape[:3], 1)  # [B, H, T, 1]
            p = torch.cat((logits, sink), dim=-1).softmax(dim=-1)[..., :-1].sum(dim=1)  # [B, T, S]
        p = p / p.sum(dim=-1, keepdim=True)
    read = read.squeeze(1)  # [B, T, S]; every query reads at least its own key
    log_q = index.to(dtype).masked_fill(~read, float("-inf")).log_softmax(dim=-1).masked_fill(~read, 0.0)
    return (torch.xlogy(p, p) - p * log_q).sum(dim=-1).mean()  # xlogy: 0 log 0 = 0 (an underflowed p)


def indexer_terms(losses: list) -> dict[str, torch.Tensor]:
    """The dsa layers' outputs for the Trainer ({} when there are none): dsa_indexer_loss, their mean."""
    return {"dsa_indexer_loss": torch.stack(losses).mean()} if losses else {}


class SparseLatentAttention(LatentAttention):
    """MLA reading, per query, only the keys the indexer picks (see the module docstring)."""

    own_loss = True  # Block hands forward `terms` in a training forward (its indexer loss)

    def __init__(self, cfg):
        super().__init__(cfg)
        self.indexer = Indexer(cfg)
        self.index_dim = cfg.dsa_dims.index_head_dim

    def new_state(self, batch: int, max_len: int, device=None, dtype=torch.float32) -> DsaKV:
        return DsaKV(batch, max_len, self.kv_rank, self.rope_dim, self.index_dim, device, dtype)

    def forward(self, x, pos, end, rotate=None, cache=None, layer: int = 0, terms: list | None = None):
        """As LatentAttention.forward; cache[layer] is this layer's DsaKV. terms: None, or a list that
        gets this layer's indexer loss (dsa_loss; the keys read are the same)."""
        q, k, v, q_latent, past = self.project(x, pos, end, cache, layer)
        state = cache[layer] if cache is not None else None
        if terms is None:
            mask = self.indexer(x, q_latent, pos, end, self.rope, state, past)
        else:  # the indexer's input detached: its loss trains it alone, and nothing else
            index, causal = self.indexer.scores(x.detach(), q_latent.detach(), pos, end, self.rope, state, past)
            mask = top_k_keys(index.detach(), causal, self.indexer.top_k).unsqueeze(1)
            sinks = None if self.sinks is None else self.sinks.detach()
            terms.append(dsa_loss(q.detach(), k.detach(), mask, index, self.scale, sinks))
        return self.attend(q, k, v, mask, x)  # [B, T, d]; sinks and gate as MLA's (mla.py)

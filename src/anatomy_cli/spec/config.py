"""Pydantic specs for models, training, data, runs and ablation sweeps (no torch import).

Validated once at the boundary (TOML or CLI options), then read as plain attributes. Every model
is frozen and rejects unknown keys, so a typo in a spec is an error, not a silently ignored knob.
"""

from __future__ import annotations

import difflib
import functools
import json
import math
import re
import tomllib
import types
from pathlib import Path
from typing import Annotated, Any, Literal, NamedTuple, Union, get_args, get_origin

from pydantic import (
    AfterValidator,
    AliasChoices,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    field_validator,
    model_validator,
)

from anatomy_cli.spec import parts as registry
from anatomy_cli.spec.errors import InputError
from anatomy_cli.spec.roles import ADD_ONE, REMOVE_ONE, Direction

NormPos = Literal["post", "pre"]
# The article's "break it" exercises (issue 4): deliberately wrong RoPE wirings, labelled as such.
RopeVariant = Literal["standard", "q_only", "k_interleaved"]


# Gated DeltaNet's chunk width in training (model/gdn.py): changes the arithmetic order, not the
# function; 16 gave the fastest train step on the 2-core CPU at ctx 64 (paired against 32 and 64).
GDN_CHUNK = 16

# Upper bound of every size: past it torch's int32 indexing overflows (a C++ error, not a message);
# sizes below it that still cannot fit in memory are refused by ModelConfig.train_bytes's estimate.
MAX_SIZE = 2**31 - 1
# The shortest context a model can generate with: generation's context shift keeps the newest half of
# its window (model/generate.py), so a window of 1 would keep nothing.
MIN_CTX = 2


class ConfigError(InputError):
    """A spec or option that does not validate; the message is one line per problem."""


def choose(value: str, option: str, choices: tuple[str, ...]) -> str:
    """A choice option's value, or a one-line refusal naming the option and its choices."""
    if value not in choices:
        listed = " or ".join(choices) if len(choices) == 2 else ", ".join(choices)
        raise ConfigError(f"{option} must be {'' if len(choices) == 2 else 'one of '}{listed}, got {value!r}")
    return value


class _Frozen(BaseModel):
    # allow_inf_nan=False: `lr = inf` or `rope_base = nan` is a typo or an attack, never a setting.
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


# The mark of a field added after runs already existed (every field not in the first set of the
# run-id hash): at its default, which must reproduce the earlier model exactly, the field stays out
# of the hash (runs.config_hash), so a finished run keeps its id and a rerun skips it. Set on the
# field itself: `name: type = new(default, **bounds)`. tests/spec/test_config.py fails for a new field
# without it, and pins the ids of every shipped spec.
NEW = {"hash": "omit-at-default"}
# The mark of a field that never changes a run's results (when to checkpoint): out of the hash at any value.
NO_RESULT = {"hash": "omit"}
ANY = "any value"  # hash_neutral's entry for a NO_RESULT field


def new(default: Any, **bounds: Any) -> Any:
    """Field(default, **bounds) with the NEW mark: `qk_norm: bool = new(False)`."""
    return Field(default=default, json_schema_extra=NEW, **bounds)


def no_result(default: Any, **bounds: Any) -> Any:
    """Field(default, **bounds) with the NO_RESULT mark: `checkpoint_every: int | None = no_result(None)`."""
    return Field(default=default, json_schema_extra=NO_RESULT, **bounds)


@functools.cache
def hash_neutral(cls: type[BaseModel] | None = None) -> dict[str, Any]:
    """{section: {field: default}} of the NEW-marked fields of RunConfig (or of `cls`), read from the
    config classes: the fields runs.config_hash leaves out while they hold their default (ANY for the
    NO_RESULT-marked ones, left out at every value)."""
    out: dict[str, Any] = {}
    for name, info in (cls or RunConfig).model_fields.items():
        if isinstance(info.annotation, type) and issubclass(info.annotation, BaseModel):
            out[name] = hash_neutral(info.annotation)
        elif info.json_schema_extra == NEW:
            out[name] = info.default
        elif info.json_schema_extra == NO_RESULT:
            out[name] = ANY
    return {k: v for k, v in out.items() if v != {}}


def hash_resolved(config: dict) -> dict:
    """A resolved config (a RunConfig dump) as runs.config_hash hashes it: each derived size whose rule
    changed after runs existed written out at its value, so those runs' ids move with their model and
    no other id does. dsa_index_heads (None: n_head // 2 before issue 37, dsa_index_heads_for since) of a
    dsa model; a config that gives the size, or has no dsa, is hashed as it is. The options and code of
    parts the model does not use (a study's base sets a plugin part's options for the runs that flip it
    on) are left out, so a run that uses no plugin part keeps the id it has without the plugin."""
    model = config.get("model") if isinstance(config, dict) else None
    if isinstance(model, dict) and (model.get("part_options") or model.get("part_code")):
        slots = {model.get(f) for f in registry.SLOT_OF_FIELD}
        model = {**model, **{k: {n: v for n, v in model[k].items() if n in slots} or None
                             for k in ("part_options", "part_code") if isinstance(model.get(k), dict)}}
        config = {**config, "model": model}
    if not (isinstance(model, dict) and model.get("dsa") is True and model.get("dsa_index_heads") is None):
        return config
    n_head = model.get("n_head", ModelConfig.model_fields["n_head"].default)
    if not isinstance(n_head, int) or isinstance(n_head, bool):
        return config
    return {**config, "model": {**model, "dsa_index_heads": dsa_index_heads_for(n_head)}}


# Every seed torch.manual_seed accepts; past these it raises an overflow deep inside a run.
SEED_MIN, SEED_MAX = -(2**63), 2**64 - 1
Seed = Annotated[int, Field(ge=SEED_MIN, le=SEED_MAX)]
MAX_SEEDS = 1000  # a seed count beyond this is a typo (each seed is a full set of runs)
ALPHA = 0.05  # the family-wise error every family of calls is held to (report/stats.py's rule)
# The one bound of a margin (the smallest loss effect that matters), wherever it is given: a spec's margin,
# --margin (--min-effect) on ablate and report, a study record (sweep.json, decide.json). A finite number of bits
# per byte above 0 and at most this: a uniform guess over the bytes costs 8 bits a byte, so a margin past 10 is
# no effect any model here can show (and 1e308 drew figures with infinite axes).
MAX_MARGIN = 10.0
MARGIN_RULE = (f"a finite number of bits per byte above 0 and at most {MAX_MARGIN:g} (the smallest loss effect "
               f"that matters)")


def _margin_in_range(value: float) -> float:
    if not (math.isfinite(value) and 0 < value <= MAX_MARGIN):
        raise ValueError(f"must be {MARGIN_RULE}, got {value:g}")
    return value


# The margin's type, the one place its bound is checked: a spec key, an option's value and a record's field all
# refuse with the same words. Infinity and NaN reach the check (allow_inf_nan) so they are told the same rule.
Margin = Annotated[float, Field(allow_inf_nan=True), AfterValidator(_margin_in_range)]
_MARGIN = TypeAdapter(Margin, config=ConfigDict(strict=True))


def check_margin(value: Any, name: str = "margin") -> float:
    """A margin as given (an option, a key) checked against its type, Margin: returned as a float, or one line
    naming `name` (ConfigError: exit 2)."""
    try:
        return float(_MARGIN.validate_python(value))
    except ValidationError as err:
        raise ConfigError(f"{name}: {error_text(err.errors()[0])}") from None


def seeds_of(given: int | list[int], base: int, below: bool = False) -> list[int]:
    """The seeds a spec's `seeds` means: a list as it is; a count n, the n seeds from `base` up (base, base + 1,
    ...), or with `below` the n seeds just under it (base - 1, base - 2, ...: a tuned study's selection seeds,
    which no count of study seeds ever reaches). The one place a count of seeds becomes seeds."""
    if not isinstance(given, int):
        return list(given)
    return [base - 1 - i for i in range(given)] if below else [base + i for i in range(given)]


def ceil_to(n: int, multiple: int) -> int:
    return multiple * math.ceil(n / multiple)


def check_pattern(field: str, pattern: str, letters: str, n_layer: int) -> None:
    """A layer pattern is a string of `letters`, one per layer, repeated over the stack; its length
    must divide n_layer (Gemma 3's 5 local : 1 global is "LLLLLG" over 6k layers). ValueError if not."""
    bad = sorted(set(pattern) - set(letters))
    if not pattern or bad:
        raise ValueError(f"{field}={pattern!r}: use only the letters {', '.join(letters)} (one per layer)")
    if n_layer % len(pattern):
        raise ValueError(f"{field}={pattern!r} has {len(pattern)} letters, which must divide "
                         f"n_layer={n_layer}")


def repeat_pattern(pattern: str, n_layer: int) -> str:
    """('LLG', 6) -> 'LLGLLG': a (checked) layer pattern spelled out for every layer."""
    return pattern * (n_layer // len(pattern))


class MlaDims(NamedTuple):
    """Resolved MLA sizes (ModelConfig.mla_dims), named as in HF's DeepseekV3Config."""

    q_lora_rank: int
    kv_lora_rank: int
    qk_rope_head_dim: int
    qk_nope_head_dim: int
    v_head_dim: int


MLA_SIZES: tuple[str, ...] = MlaDims._fields


class DsaDims(NamedTuple):
    """Resolved DSA sizes (ModelConfig.dsa_dims): HF DeepseekV32Config's index_topk, index_n_heads,
    index_head_dim."""

    top_k: int
    index_n_heads: int
    index_head_dim: int


DSA_SIZES = ("dsa_top_k", "dsa_index_heads", "dsa_index_head_dim")  # the fields behind DsaDims, in order
# The fewest indexer heads a derived dsa_index_heads has (issue 37). A key's index score is exactly 0 when
# every head's ReLU is 0, and keys tied at the top-k boundary are read by a tie rule, not by their
# scores: with n_head / 2 = 2 heads a quarter of the queries where top-k binds had such a tie at the
# default study's shape, with 8 almost none (benchmarks/dsa_ties.py, RESULTS.md). DeepSeek-V3.2 has 64.
MIN_INDEX_HEADS = 8


def dsa_index_heads_for(n_head: int) -> int:
    """The derived dsa_index_heads: DeepSeek-V3.2's half of n_head (64 of 128), at least MIN_INDEX_HEADS."""
    return max(MIN_INDEX_HEADS, n_head // 2)


ROUTER_SETTINGS = ("moe_n_group", "moe_topk_group", "moe_routed_scaling_factor")  # the deepseek router's
FFN_EXPERTS = ("gelu", "swiglu", "silu")  # the FFNs a mixture's experts are made of (model/moe.py)


class ModelConfig(_Frozen):
    """Sizes and the component switches (see components.py). Defaults are the 2017 Transformer's parts.

    The switches after rope_variant are post-LLaMA parts, each off by default (off = today's model
    exactly): qk_norm (RMSNorm of each head's Q and K, Qwen3 / Gemma 3; OLMo 2 norms the whole Q and
    K projections instead), tie_embeddings (head = token embedding, GPT-2 / Gemma), parallel_block
    (attention and FFN side by side, GPT-J / PaLM), logit_softcap (c * tanh(logits / c), Gemma 2) and
    window (sliding-window attention, Mistral / Gemma 2-3). pos_type="nope" is NoPE (no positions at all).
    moe swaps every FFN for a routed mixture of experts of the same type (DeepSeek V3, Qwen3-MoE).
    """

    vocab_size: int | None = Field(default=None, gt=0, le=MAX_SIZE)  # None: taken from the data at train time
    d_model: int = Field(default=128, gt=0, le=MAX_SIZE)
    n_layer: int = Field(default=4, gt=0, le=MAX_SIZE)
    n_head: int = Field(default=4, gt=0, le=MAX_SIZE)
    n_kv_head: int = Field(default=4, gt=0, le=MAX_SIZE)
    ctx_len: int = Field(default=128, gt=0, le=MAX_SIZE)
    # The four slot fields name a part of the parts registry (spec/parts.py): anatomy's own (below) or a
    # plugin's. norm: layernorm, rmsnorm, none (every norm an identity). positions: learned, rope, nope (no
    # position signal, Kazemnejad et al. 2023). ffn: gelu, swiglu, silu (SwiGLU's parameters, no gate).
    norm_type: str = "layernorm"
    norm_pos: NormPos = "post"
    pos_type: str = "learned"
    ffn_type: str = "gelu"
    rope_base: float = Field(default=10000.0, gt=0)
    # SwiGLU's hidden size where a recipe fixes it (CS336: d_ff = 1344 at d_model 512); None: 2/3 of 4d rounded up
    # to 32 (ffn_hidden). GELU and SiLU then take 3/2 of it, so every FFN holds the same parameters.
    d_ff: int | None = new(None, gt=0, le=MAX_SIZE)
    norm_eps: float = Field(default=1e-5, gt=0)
    rope_variant: RopeVariant = "standard"
    qk_norm: bool = new(False)  # RMSNorm over head_dim on Q and K before RoPE (qknorm)
    tie_embeddings: bool = new(False)  # the LM head shares the embedding matrix (tied)
    parallel_block: bool = new(False)  # attention and FFN read one normed input (parallel)
    logit_softcap: float = new(0.0, ge=0)  # c * tanh(logits / c); 0 = off (softcap)
    # Gated DeltaNet hybrid (gdn, model/gdn.py): "" = attention everywhere; else one letter per layer,
    # D Gated DeltaNet, A softmax attention, repeated over the stack ("DDDA": Qwen3-Next's 3 : 1).
    # The head sizes default from the attention's (see gdn_shape); gdn_conv is the short conv's kernel.
    gdn_pattern: str = new("", max_length=1024)
    gdn_heads: int | None = new(None, gt=0, le=MAX_SIZE)  # value heads; None: n_head
    gdn_key_heads: int | None = new(None, gt=0, le=MAX_SIZE)  # None: gdn_heads / 2 when even
    gdn_head_dim: int | None = new(None, gt=0, le=MAX_SIZE)  # d_k = d_v; None: head_dim
    gdn_conv: int = new(4, gt=0, le=64)
    # Sliding-window attention (swa): a local layer's query sees its `window` latest positions,
    # itself included (Mistral's sliding_window; transformers' mask keeps kv > q - window). 0 = off:
    # every layer global, and window_pattern is not used. window_pattern: one letter per layer,
    # L local, G global, repeated over the stack ("L": Mistral; "LLLLLG": Gemma 3; "LG": Gemma 2).
    window: int = new(0, ge=0, le=MAX_SIZE)
    window_pattern: str = new("L", max_length=1024)
    # Mixture of experts (moe, model/moe.py): every block's FFN becomes moe_experts copies of the
    # ffn_type FFN, each token routed to its moe_top_k best. Expert hidden size: moe_hidden, or by
    # default the dense hidden split over the active experts (moe_expert_hidden), so active FFN
    # parameters per token equal the dense FFN's. moe_shared adds one always-on expert of that size,
    # gated by sigmoid(w . x) as in Qwen2-MoE / Qwen3-Next (ungated with the deepseek router, as DeepSeek V3's).
    moe: bool = new(False)
    moe_experts: int = new(8, ge=2, le=MAX_SIZE)
    moe_top_k: int = new(2, ge=1, le=MAX_SIZE)
    moe_hidden: int | None = new(None, gt=0, le=MAX_SIZE)  # None: see moe_expert_hidden
    moe_shared: bool = new(False)
    # The router (model/moe.py): "softmax-topk" is Qwen3-MoE's, balanced by train.moe_aux_loss; "deepseek" is
    # DeepSeek-V3's: sigmoid affinities, a selection-only bias balanced without a loss (train.moe_bias_rate),
    # top-k within the moe_topk_group best of moe_n_group expert groups, weights renormalised times
    # moe_routed_scaling_factor, and an ungated shared expert. The three are deepseek-only settings
    # (DeepSeek-V3: 256 experts in 8 groups, 4 kept, top-8, factor 2.5; 1 group here: no group limit).
    moe_router: Literal["softmax-topk", "deepseek"] = new("softmax-topk")
    moe_n_group: int = new(1, ge=1, le=MAX_SIZE)
    moe_topk_group: int = new(1, ge=1, le=MAX_SIZE)
    moe_routed_scaling_factor: float = new(1.0, gt=0)
    # Multi-head latent attention (mla). Its five sizes keep HF DeepseekV3Config's names; None (the
    # default) derives each from d_model and head_dim (see mla_dims), and they are mla-only settings.
    attn_type: str = new("softmax")  # the mixer slot: softmax, mla (DeepSeek-V2, model/mla.py), or a plugin's
    q_lora_rank: int | None = new(None, gt=0, le=MAX_SIZE)
    kv_lora_rank: int | None = new(None, gt=0, le=MAX_SIZE)
    qk_rope_head_dim: int | None = new(None, gt=0, le=MAX_SIZE)
    qk_nope_head_dim: int | None = new(None, gt=0, le=MAX_SIZE)
    v_head_dim: int | None = new(None, gt=0, le=MAX_SIZE)
    # Parts of softmax attention from 2025 (model/attention.py), each off by default; the first two also
    # apply to latent attention (model/mla.py, its gate a projection of its own from x). attn_sinks: a
    # learned logit per query head joins every softmax's denominator and adds no value (gpt-oss).
    # attn_gate: q_proj also emits a per-head gate, out = o_proj(attn * sigmoid(gate)) (Qwen3-Next).
    # rope_fraction: the share of each head's dims RoPE rotates, the first ones (Qwen3-Next's
    # partial_rotary_factor 0.25); the rest carry no position.
    attn_sinks: bool = new(False)
    attn_gate: bool = new(False)
    rope_fraction: float = new(1.0, gt=0, le=1)
    # DeepSeek sparse attention (dsa, model/dsa.py; DeepSeek-V3.2): latent attention (attn_type='mla')
    # whose queries each read only the dsa_top_k earlier keys a small indexer scores highest (its
    # dsa_index_heads heads of dsa_index_head_dim). None derives each (see dsa_dims); dsa-only settings.
    dsa: bool = new(False)
    dsa_top_k: int | None = new(None, gt=0, le=MAX_SIZE)
    dsa_index_heads: int | None = new(None, gt=0, le=MAX_SIZE)
    dsa_index_head_dim: int | None = new(None, gt=0, le=MAX_SIZE)
    # How the initial weights are drawn from the run's seed (LM.reset_parameters; the distributions are
    # the same either way). "order": one stream, every parameter in turn after torch.manual_seed(seed), so
    # a part added early (a position table) shifts every later draw. "name": each parameter from its own
    # generator keyed by (seed, its qualified name), so two models that share a parameter's name and
    # shape start from the identical tensor: the two arms of a pair share batches and initial weights.
    init_key: Literal["order", "name"] = new("order")
    # Parts of the parts API (spec/parts.py): the options of each part by name (a spec's [model.part_options.NAME]
    # table, --set model.part_options.NAME.KEY=V), filled in with the part's defaults for every part the model
    # uses; and the sha256 of the plugin file each plugin part it uses comes from, recorded when the config
    # is first resolved, so editing the file moves the run id and building with other code is refused.
    # None when there is nothing to hold (no table is written, and the run id is the one without parts).
    part_options: dict[str, dict[str, Any]] | None = new(None)
    part_code: dict[str, str] | None = new(None)

    @field_validator("norm_type", "pos_type", "ffn_type", "attn_type")
    @classmethod
    def _a_part(cls, value: str, info) -> str:
        return registry.check_name(registry.SLOT_OF_FIELD[info.field_name], value)

    @model_validator(mode="before")
    @classmethod
    def _fill_parts(cls, data: Any) -> Any:
        """Each part's options validated (strictly, by the part's own model) and filled in with its
        defaults for the parts the model uses; each plugin part the model uses gets its file's sha256
        unless the config already records one (a run's config.json keeps what it trained with)."""
        if not isinstance(data, dict) or not isinstance(data.get("part_options") or {}, dict) \
                or not isinstance(data.get("part_code") or {}, dict):
            return data  # not a table: the fields' own type checks say so
        used = registry.used(data, {f: cls.model_fields[f].default for f in registry.SLOT_OF_FIELD})
        filled = {}
        for name, given in (data.get("part_options") or {}).items():
            part = registry.REGISTRY.get(name) if isinstance(name, str) else None
            if part is None:
                raise ValueError(f"part_options.{name}: no part of that name is loaded (a plugin's part needs its "
                                 f"file: plugins = [\"FILE\"] in the spec, or --plugin FILE)")
            if not isinstance(given, dict):
                raise ValueError(f"part_options.{name}: a table of {name}'s options, got {given!r}")
            filled[name] = given
        for name, part in used.items():
            filled.setdefault(name, {})
        for name in list(filled):
            opts = registry.options(registry.REGISTRY[name], filled[name])
            if opts is None:
                del filled[name]  # a part without options has no table
            else:
                filled[name] = opts.model_dump(mode="json")
        code = {name: part.sha256 for name, part in used.items() if part.plugin} | (data.get("part_code") or {})
        return {**data, "part_options": filled or None, "part_code": code or None}

    @field_validator("ctx_len")
    @classmethod
    def _check_ctx_len(cls, ctx_len: int) -> int:
        # generation (the samples every run writes at its end, `anatomy sample`) keeps the newest half of
        # its window when the window fills (model/generate.py): a window of 1 keeps nothing
        if ctx_len < MIN_CTX:
            raise ValueError(f"ctx_len={ctx_len} is too short: generating text (the samples a run writes, "
                             f"`anatomy sample`) needs a context of at least {MIN_CTX}")
        return ctx_len

    @model_validator(mode="after")
    def _check_shapes(self) -> ModelConfig:
        if self.d_model % self.n_head:
            raise ValueError(f"n_head={self.n_head} must divide d_model={self.d_model}")
        if self.n_head % self.n_kv_head:
            raise ValueError(f"n_kv_head={self.n_kv_head} must divide n_head={self.n_head}")
        if self.pos_type == "rope" and self.head_dim % 2:
            raise ValueError(f"RoPE needs an even head_dim, got d_model/n_head={self.head_dim}")
        if self.rope_variant != "standard" and self.pos_type != "rope":
            raise ValueError(f"rope_variant={self.rope_variant!r} needs pos_type='rope'")
        if self.gdn_pattern:
            check_pattern("gdn_pattern", self.gdn_pattern, "DA", self.n_layer)
            if "D" not in self.gdn_pattern:
                raise ValueError(f"gdn_pattern={self.gdn_pattern!r} has no D ('' is attention everywhere)")
        k_heads, v_heads, _ = self.gdn_shape
        if v_heads % k_heads:
            raise ValueError(f"gdn_key_heads={k_heads} must divide gdn_heads={v_heads}")
        check_pattern("window_pattern", self.window_pattern, "LG", self.n_layer)
        if self.window > self.ctx_len:
            raise ValueError(f"window={self.window} is larger than ctx_len={self.ctx_len}: it would never "
                             f"bind in training (window=0 is global attention)")
        if self.moe_top_k > self.moe_experts:
            raise ValueError(f"moe_top_k={self.moe_top_k} must not exceed moe_experts={self.moe_experts}")
        if self.moe and self.ffn_type not in FFN_EXPERTS:
            raise ValueError(f"moe=true builds its experts as ffn_type's FFN, one of {', '.join(FFN_EXPERTS)}: "
                             f"ffn_type={self.ffn_type!r} is a plugin part")
        if self.attn_type == "mla" and self.slot_part("positions")[0].plugin:
            raise ValueError(f"pos_type={self.pos_type!r} is a plugin part: latent attention (attn_type='mla') "
                             f"rotates its keys with rope only")
        if self.moe and self.moe_expert_hidden < 1:
            raise ValueError(f"the dense hidden size {self.ffn_hidden} split over {self.moe_active_experts} active "
                             f"experts leaves none per expert; set model.moe_hidden")
        self._check_mla()
        self._check_dsa()
        self._check_attention_parts()
        self._check_router()
        return self

    def _check_attention_parts(self) -> None:
        # sinks and the output gate combine with mla (model/mla.py); partial rotary does not
        if self.attn_type == "mla" and self.rope_fraction != 1.0:
            raise ValueError("rope_fraction is a setting of softmax attention: it does not combine with "
                             "attn_type='mla' (which rotates qk_rope_head_dim of each head)")
        if self.rope_fraction == 1.0:
            return
        if self.pos_type != "rope":
            raise ValueError(f"rope_fraction={self.rope_fraction:g} needs pos_type='rope' (it is the share of each "
                             f"head that RoPE rotates)")
        dims = self.head_dim * self.rope_fraction
        if dims != self.rope_dims or dims % 2:
            raise ValueError(f"rope_fraction={self.rope_fraction:g} of head_dim={self.head_dim} rotates {dims:g} dims: "
                             f"it must be a whole even number (RoPE turns pairs of dims)")

    def _check_router(self) -> None:
        grouped = [f for f in ROUTER_SETTINGS if getattr(self, f) != type(self).model_fields[f].default]
        if self.moe_router != "deepseek":
            if grouped:
                raise ValueError(f"{grouped[0]} is a setting of the deepseek router: it needs moe_router='deepseek'")
            return
        if not self.moe:
            raise ValueError("moe_router='deepseek' routes a mixture of experts: it needs moe=true")
        E, G, kept = self.moe_experts, self.moe_n_group, self.moe_topk_group
        if kept > G:
            raise ValueError(f"moe_topk_group={kept} must not exceed moe_n_group={G}")
        if E % G or E // G < 2:  # a group is scored by its top 2 (DeepSeek-V3)
            raise ValueError(f"moe_n_group={G} must divide moe_experts={E} into groups of at least 2")
        if self.moe_top_k > kept * (E // G):
            raise ValueError(f"moe_top_k={self.moe_top_k} exceeds the {kept * (E // G)} experts of the "
                             f"moe_topk_group={kept} groups kept")

    def _check_mla(self) -> None:
        given = [f for f in MLA_SIZES if getattr(self, f) is not None]
        if self.attn_type != "mla":
            if given:
                raise ValueError(f"{given[0]} is an mla setting: it needs attn_type='mla'")
            return
        if self.qk_norm:
            raise ValueError("qk_norm does not combine with attn_type='mla' (the latent RMSNorms of Q and KV "
                             "take its place, DeepSeek-V2)")
        m = self.mla_dims
        for f in ("q_lora_rank", "kv_lora_rank"):
            if getattr(m, f) > self.d_model:
                raise ValueError(f"{f}={getattr(m, f)} must not exceed d_model={self.d_model} (a low-rank "
                                 f"compression of the d_model input)")
        if self.pos_type == "rope" and m.qk_rope_head_dim % 2:
            raise ValueError(f"RoPE needs an even qk_rope_head_dim, got {m.qk_rope_head_dim}")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_head

    @property
    def rope_dims(self) -> int:
        """The dims of each head RoPE rotates, the first ones: int(head_dim * rope_fraction), as
        transformers computes Qwen3-Next's rotary dim (its inverse frequencies span these dims)."""
        return int(self.head_dim * self.rope_fraction)

    @property
    def gdn_shape(self) -> tuple[int, int, int]:
        """(key heads, value heads, head dim) of a Gated DeltaNet layer. By default the value side is
        the attention's (n_head heads of head_dim) and the key side half of it, as in Qwen3-Next's
        16 key : 32 value heads of 128: the in and out projections then hold 4 d^2 weights, MHA's
        count, and b, a, the conv, the gates and the norm add 2 Hv d + 2 d K + 2 Hv + hd."""
        v_heads = self.gdn_heads or self.n_head
        k_heads = self.gdn_key_heads or (v_heads // 2 if v_heads % 2 == 0 else v_heads)
        return k_heads, v_heads, self.gdn_head_dim or self.head_dim

    @property
    def mla_dims(self) -> MlaDims:
        """The MLA sizes, each the field when given, else derived for the default study's shape.

        DeepSeek-V3 (d 7168, 128 heads of 128): kv_lora_rank 512 = 4 heads' worth, qk_rope_head_dim
        64 = head/2, q_lora_rank 1536 ~ d/5. At anatomy's 4 heads, 4 heads' worth of latent would be
        no compression at all, so the latent is d/2 (64 at d 128 = 2 heads): the cache holds
        d/2 + hd/2 = 80 values per token per layer, against MHA's 256, GQA-2's 128 and MQA's 64, and
        the attention's parameters stay within 3% of MHA's. q_lora_rank d/2 likewise; the rope part is
        half a head (rounded down to even, at least 2), the nope and V parts a whole head.
        """
        hd = self.head_dim
        derived = {"q_lora_rank": max(1, self.d_model // 2), "kv_lora_rank": max(1, self.d_model // 2),
                   "qk_rope_head_dim": max(2, hd // 4 * 2), "qk_nope_head_dim": hd, "v_head_dim": hd}
        return MlaDims(**{f: getattr(self, f) or derived[f] for f in MLA_SIZES})

    def _check_dsa(self) -> None:
        given = [f for f in DSA_SIZES if getattr(self, f) is not None]
        if not self.dsa:
            if given:
                raise ValueError(f"{given[0]} is a dsa setting: it needs dsa=true")
            return
        if self.attn_type != "mla":
            raise ValueError("dsa needs attn_type='mla' (DeepSeek-V3.2's indexer picks the keys of latent attention)")
        s, p = self.dsa_dims, self.mla_dims.qk_rope_head_dim
        if s.top_k > self.ctx_len:
            raise ValueError(f"dsa_top_k={s.top_k} is larger than ctx_len={self.ctx_len}: every query would read every "
                             f"key (dsa=false is dense latent attention)")
        if self.pos_type == "rope" and s.index_head_dim < p:
            raise ValueError(f"dsa_index_head_dim={s.index_head_dim} must be at least qk_rope_head_dim={p} (the "
                             f"indexer rotates its first qk_rope_head_dim dims)")

    @property
    def dsa_dims(self) -> DsaDims:
        """The DSA sizes, each the field when given, else derived for anatomy's contexts.

        DeepSeek-V3.2 reads 2048 keys of a 128K context (1/64) through 64 indexer heads of 128 (half
        its 128 attention heads; 64 dims rotated, its qk_rope_head_dim). At contexts of 64-256 a
        1/64 share would be one key, so top_k is a quarter of ctx_len (16 of the default study's 64),
        well below the context yet more than a handful; the indexer has dsa_index_heads_for(n_head)
        heads (half of n_head, at least 8) of head_dim (at least the rope part, which it rotates).
        """
        derived = {"dsa_top_k": max(1, self.ctx_len // 4), "dsa_index_heads": dsa_index_heads_for(self.n_head),
                   "dsa_index_head_dim": max(self.head_dim, self.mla_dims.qk_rope_head_dim)}
        return DsaDims(*(getattr(self, f) or derived[f] for f in DSA_SIZES))

    @property
    def ffn_hidden(self) -> int:
        """GELU (and a plugin FFN's default): 4d. SwiGLU: 2/3 of that (three matrices instead of two),
        rounded up to 32. SiLU: 3/2 of SwiGLU's, so its two matrices hold exactly SwiGLU's parameters
        (CS336's SiLU at d_ff = 4d matches SwiGLU's 8/3 d only before SwiGLU's rounding). d_ff, where given, is
        SwiGLU's, and every other FFN's is 3/2 of it: the same parameters."""
        if self.d_ff is not None:
            return self.d_ff if self.ffn_type == "swiglu" else 3 * self.d_ff // 2
        swiglu = ceil_to(int(2 / 3 * 4 * self.d_model), 32)
        return {"swiglu": swiglu, "silu": 3 * swiglu // 2}.get(self.ffn_type, 4 * self.d_model)

    def slot_part(self, slot: str) -> tuple[registry.Part, Any]:
        """(the registered part this config's `slot` field names, its validated options or None)."""
        name = getattr(self, registry.SLOTS[slot].field)
        part = registry.find(slot, name)
        if part is None:
            raise ValueError(f"{slot} {name!r} is not a part of the registry")
        return part, registry.options(part, (self.part_options or {}).get(name))

    @property
    def layer_kinds(self) -> tuple[str, ...]:
        """What layer i's token mixer is, as data: one kind per layer (model/mixers.py maps a kind to
        its module, mixer_params to its parameters, state_bytes to its decode state).

        "attn": global causal softmax attention (MHA/GQA/MQA by n_kv_head), or "mla" in its place
        (attn_type='mla', model/mla.py), "dsa" with dsa=true (model/dsa.py); "gdn": Gated DeltaNet
        where gdn_pattern says D; "local": softmax attention within a sliding window where
        window_pattern says L (swa; a window leaves mla and dsa layers global). A part that changes
        what a layer is adds its kind here, decided by its own fields (a layer pattern, see
        repeat_pattern), and one entry in each of those three tables.
        """
        own = {"mla": "dsa" if self.dsa else "mla", "softmax": "attn"}  # else a plugin mixer: its name
        kinds = [own.get(self.attn_type, self.attn_type)] * self.n_layer
        if self.gdn_pattern:
            pattern = repeat_pattern(self.gdn_pattern, self.n_layer)
            kinds = ["gdn" if letter == "D" else kind for letter, kind in zip(pattern, kinds)]
        if self.window:  # swa: softmax attention turns local where the pattern says L
            pattern = repeat_pattern(self.window_pattern, self.n_layer)
            kinds = ["local" if letter == "L" and kind == "attn" else kind
                     for letter, kind in zip(pattern, kinds)]
        return tuple(kinds)

    def num_params(self) -> int:
        """Total parameter count from the sizes alone (no torch); tests pin it to LM.num_params()."""
        return self._params(active=False)

    def active_params(self) -> int:
        """Parameters one token's forward uses: the total for a dense model (a routed FFN counts
        only what a token is sent to, see ffn_params). FLOPs per token follow this count."""
        return self._params(active=True)

    def non_embedding_params(self, active: bool = False) -> int:
        """Every parameter but the token table, the LM head and the position table: the blocks and the
        final norm, Kaplan et al. (2020)'s N, what grows with width and depth (and needs no vocab).
        Size ladders are placed, and token-per-parameter budgets computed, by this count."""
        layers = sum(self.layer_params(kind, active) for kind in self.layer_kinds)
        return layers + (self.norm_params if self.norm_pos == "pre" else 0)

    def _params(self, active: bool) -> int:
        if self.vocab_size is None:
            raise ConfigError("model.vocab_size is not set")
        embeddings = (1 if self.tie_embeddings else 2) * self.vocab_size * self.d_model  # token table (+head)
        return embeddings + self.position_params + self.non_embedding_params(active)

    def layer_params(self, kind: str, active: bool = False) -> int:
        """One block: its token mixer of `kind`, its channel mixer and its norms (one when parallel)."""
        norms = (1 if self.parallel_block else 2) * self.norm_params
        return self.mixer_params(kind) + self.ffn_params(active) + norms

    def mixer_params(self, kind: str) -> int:
        """One token mixer of `kind` (see layer_kinds): each kind's exact term."""
        if kind in ("attn", "local"):  # a window changes which keys a query sees, not the weights
            d, hd = self.d_model, self.head_dim
            qkv_out = d * (self.n_head + 2 * self.n_kv_head) * hd + self.n_head * hd * d
            qk_norm = 2 * hd if self.qk_norm else 0  # one RMSNorm weight for Q, one for K, shared by heads
            gate = d * self.n_head * hd if self.attn_gate else 0  # q_proj's second half: a gate per output
            sinks = self.n_head if self.attn_sinks else 0  # one logit per query head
            return qkv_out + qk_norm + gate + sinks
        if kind == "gdn":  # model/gdn.py: in_proj (q|k|v|z), ba, conv, dt_bias + A_log, gated norm, out
            Hk, Hv, hd = self.gdn_shape
            conv_dim, value = 2 * Hk * hd + Hv * hd, Hv * hd
            d = self.d_model
            return d * (conv_dim + value + 2 * Hv) + conv_dim * self.gdn_conv + 2 * Hv + hd + value * d
        if kind == "mla":  # down, norm, up for Q and for KV (kv_down also makes the rope key); out
            d, H, m = self.d_model, self.n_head, self.mla_dims
            q = d * m.q_lora_rank + m.q_lora_rank + m.q_lora_rank * H * (m.qk_nope_head_dim + m.qk_rope_head_dim)
            kv = d * (m.kv_lora_rank + m.qk_rope_head_dim) + m.kv_lora_rank
            kv += m.kv_lora_rank * H * (m.qk_nope_head_dim + m.v_head_dim)
            gate = d * H * m.v_head_dim if self.attn_gate else 0  # its own projection from x (model/mla.py)
            sinks = H if self.attn_sinks else 0  # one logit per query head
            return q + kv + H * m.v_head_dim * d + gate + sinks
        if kind == "dsa":  # mla's, plus the indexer: wq (r_q -> Hi D), wk (d -> D), its LayerNorm, w (d -> Hi)
            r_q, (_, Hi, D) = self.mla_dims.q_lora_rank, self.dsa_dims
            return self.mixer_params("mla") + r_q * Hi * D + self.d_model * D + 2 * D + self.d_model * Hi
        part, opts = self.mixer_part(kind)
        return part.params(self, opts)

    def mixer_part(self, kind: str) -> tuple[registry.Part, Any]:
        """A plugin mixer's part and options, for a layer kind that is none of anatomy's own."""
        if kind != self.attn_type or registry.find("mixer", kind) is None:
            raise ValueError(f"no layer kind {kind!r}")
        return self.slot_part("mixer")

    def ffn_params(self, active: bool = False) -> int:
        """One channel mixer (model/ffn.py); active: the part one token uses (all of a dense FFN).

        A mixture of experts (model/moe.py): E experts, the router (E x d) and the shared expert with its
        gate (d; the deepseek router's shared expert has none); a token uses its k experts, and all of
        router, shared expert and gate. The deepseek router's selection bias (E) is a buffer, not a parameter."""
        if not self.moe:
            part, opts = self.slot_part("ffn")
            return (part.active if active and part.active else part.params)(self, opts)
        expert, E, k = self.dense_ffn_params(self.moe_expert_hidden), self.moe_experts, self.moe_top_k
        gate = 0 if self.moe_router == "deepseek" else self.d_model
        always = E * self.d_model + ((expert + gate) if self.moe_shared else 0)  # router, shared + gate
        return (k if active else E) * expert + always

    def dense_ffn_params(self, hidden: int) -> int:
        """One dense FFN of this hidden size: GELU or SiLU up/down, or SwiGLU gate/up/down."""
        return (3 if self.ffn_type == "swiglu" else 2) * self.d_model * hidden

    @property
    def moe_active_experts(self) -> int:
        """Experts a token passes through: its top k, plus the shared one."""
        return self.moe_top_k + (1 if self.moe_shared else 0)

    @property
    def moe_expert_hidden(self) -> int:
        """One expert's hidden size: moe_hidden, else ffn_hidden // active experts (8 experts, top-2:
        half the dense hidden each, so a token's active FFN matches the dense one)."""
        return self.moe_hidden or self.ffn_hidden // self.moe_active_experts

    @property
    def active_hidden(self) -> int:
        """FFN hidden units a token passes through: ffn_hidden, or an expert's times the active experts."""
        return self.moe_expert_hidden * self.moe_active_experts if self.moe else self.ffn_hidden

    @property
    def norm_params(self) -> int:
        """One norm of width d_model: LayerNorm 2d, RMSNorm d, none 0 (the norm part's formula)."""
        part, opts = self.slot_part("norm")
        return part.params(self, opts)

    @property
    def max_positions(self) -> int | None:
        """The longest sequence the model has positions for: a learned table ends at ctx_len; RoPE
        and NoPE have nothing that ends (None = unbounded; how well they do past ctx_len is eval's)."""
        part, opts = self.slot_part("positions")
        return part.max_positions(self, opts) if part.max_positions else None

    @property
    def position_params(self) -> int:
        part, opts = self.slot_part("positions")  # a learned table ctx_len x d; RoPE, NoPE: none
        return part.params(self, opts)

    def state_bytes(self, kind: str, batch: int, max_len: int, bytes_per_elem: int) -> int:
        """Decode-state bytes of one layer of `kind` for `max_len` positions (tests pin it to the
        tensors new_state allocates). attn: K and V of every position, 2 B G T hd. local: of the
        window - 1 latest only (the query itself is the window's last key), whatever max_len. gdn:
        whatever max_len, the conv's last K-1 inputs and the memory [Hv, hd, hd], kept in fp32 at least."""
        kept = {"attn": max_len, "local": self.window - 1}
        if kind in kept:
            return 2 * batch * self.n_kv_head * kept[kind] * self.head_dim * bytes_per_elem
        if kind == "gdn":
            Hk, Hv, hd = self.gdn_shape
            conv = (self.gdn_conv - 1) * (2 * Hk + Hv) * hd * bytes_per_elem
            return batch * (conv + Hv * hd * hd * max(bytes_per_elem, 4))
        if kind == "mla":  # the latent and the shared rope key, nothing per head: B T (r + p)
            m = self.mla_dims
            return batch * max_len * (m.kv_lora_rank + m.qk_rope_head_dim) * bytes_per_elem
        if kind == "dsa":  # mla's, plus the indexer's one key per position: B T (r + p + D)
            m, D = self.mla_dims, self.dsa_dims.index_head_dim
            return batch * max_len * (m.kv_lora_rank + m.qk_rope_head_dim + D) * bytes_per_elem
        part, opts = self.mixer_part(kind)  # a plugin mixer: its formula, else attention's K and V, or none
        if part.state_bytes is not None:
            return part.state_bytes(self, opts, batch, max_len, bytes_per_elem)
        return 2 * batch * self.n_kv_head * max_len * self.head_dim * bytes_per_elem if part.cache else 0

    def cache_bytes(self, batch: int, max_len: int, bytes_per_elem: int) -> int:
        """The whole decode cache (every layer's state) for max_len positions, from the sizes alone."""
        return sum(self.state_bytes(kind, batch, max_len, bytes_per_elem) for kind in self.layer_kinds)

    def context_flops(self, kind: str) -> int:
        """Training FLOPs per token of a mixer beyond its weight matmuls: attention's scores and
        weighted sum over ctx_len keys, 6 ctx d (the 2 n_ctx d_attn of Kaplan et al. 2020, x3); a
        local layer's query reads window keys at most.
        gdn, per value head and chunk width C: the three C-wide products (k.k, q.k, scores.u), the
        triangular solve (C/2 rows of d_k + d_v) and the memory's read, correction and write."""
        keys = {"attn": self.ctx_len, "local": self.window}
        if kind in keys:
            return 6 * keys[kind] * self.d_model
        if kind == "gdn":
            _, Hv, hd = self.gdn_shape
            C = min(GDN_CHUNK, self.ctx_len)
            return 6 * Hv * (3 * C * hd + C * hd + 3 * hd * hd)
        if kind == "mla":  # the same, at Q.K's width H (n + p) and A.V's H v instead of d and d
            m = self.mla_dims
            return 3 * self.ctx_len * self.n_head * (m.qk_nope_head_dim + m.qk_rope_head_dim + m.v_head_dim)
        if kind == "dsa":  # mla's over the top_k keys read, plus the indexer's scores over ctx_len keys
            m, (k, Hi, D) = self.mla_dims, self.dsa_dims  # (Hi heads of D, and the weighted sum; forward only)
            read = 3 * k * self.n_head * (m.qk_nope_head_dim + m.qk_rope_head_dim + m.v_head_dim)
            return read + 2 * self.ctx_len * Hi * (D + 1)
        part, opts = self.mixer_part(kind)  # a plugin mixer: its formula, else attention's
        return part.flops(self, opts) if part.flops is not None else 6 * self.ctx_len * self.d_model

    def train_bytes(self, batch_size: int) -> int:
        """Rough fp32 bytes of one training step, to refuse before allocating what cannot fit.

        16 B per parameter (weights, grads, AdamW's two moments) plus what backward keeps per token:
        per layer ~16 d + 3 active_hidden floats and n_head x ctx_len attention probabilities, and the
        logits three times over (logits, softmax, their grad).
        """
        per_token = self.n_layer * (16 * self.d_model + 3 * self.active_hidden + self.n_head * self.ctx_len)
        per_token += 3 * self.vocab_size
        return 16 * self.num_params() + 4 * batch_size * self.ctx_len * per_token

    def flops_per_token(self) -> int:
        """Training FLOPs per token: 6 per active matmul weight (fwd + bwd) plus each mixer's
        context term (Kaplan 2020). Lookups are free: the position table, and the token table unless
        it is also the (tied) head, whose matmul is done either way.
        """
        matmul = self.active_params() - self.position_params
        matmul -= 0 if self.tie_embeddings else self.vocab_size * self.d_model
        return 6 * matmul + sum(self.context_flops(kind) for kind in self.layer_kinds)


# Steps as a tuple (a frozen config stays hashable), read from the list TOML, --set and config.json write
Steps = Annotated[tuple[int, ...], BeforeValidator(lambda v: tuple(v) if isinstance(v, list) else v)]


class TrainConfig(_Frozen):
    steps: int = Field(default=2000, gt=0, le=MAX_SIZE)
    batch_size: int = Field(default=32, gt=0, le=MAX_SIZE)
    lr: float = Field(default=3e-4, gt=0)
    min_lr_frac: float = Field(default=0.1, ge=0, le=1)
    # wsd: warmup-stable-decay (Hägele et al. 2024, arXiv 2405.18392): warmup, the peak LR held, then a decay
    # over the last decay_frac of the steps to lr * min_lr_frac, shaped linear or 1-sqrt (their best, sec. 3).
    # The stable phase does not depend on train.steps, so a run's checkpoint there starts a decay to any
    # shorter budget (training/branch.py): the loss at several budgets from one run.
    schedule: Literal["constant", "cosine", "wsd"] = "cosine"
    decay_frac: float = new(0.2, gt=0, lt=1)  # wsd only: their 20 % cooldown matches cosine (sec. 3.1)
    decay_shape: Literal["linear", "1-sqrt"] = new("1-sqrt")  # wsd only
    warmup: int = Field(default=100, ge=0)
    weight_decay: float = Field(default=0.1, ge=0)
    beta1: float = Field(default=0.9, ge=0, lt=1)
    beta2: float = Field(default=0.95, ge=0, lt=1)
    grad_clip: float = Field(default=1.0, ge=0)  # 0 disables clipping (the norm is still logged)
    # PaLM's auxiliary z-loss (Chowdhery et al. 2022 used 1e-4): + z_loss * mean(logsumexp(logits)^2)
    # on the training loss only; 0 = off. Keeps log Z near 0 so the softmax stays well-conditioned.
    z_loss: float = new(0.0, ge=0)
    # Load-balancing loss coefficient of a mixture of experts (model.moe; Switch / Qwen3-MoE's
    # router_aux_loss_coef, 0.001): + moe_aux_loss * E * sum_e f_e P_e on the training loss only.
    moe_aux_loss: float = new(0.001, ge=0)
    # The deepseek router's bias update speed gamma (model.moe_router; DeepSeek-V3 report sec. 4.2: 0.001,
    # Wang et al. 2024's u = 0.001): after each step b_e += gamma * sign(mean load - load_e), off the loss.
    moe_bias_rate: float = new(0.001, ge=0)
    # Coefficient of a dsa model's indexer loss (model.dsa; DeepSeek-V3.2: KL(main attention || indexer)
    # over the keys read, the indexer's input detached, model/dsa.py): + dsa_indexer_loss * KL on the
    # training loss only; 0 = the indexer gets no gradient and stays at its init (HF's forward).
    dsa_indexer_loss: float = new(1.0, ge=0)
    eval_interval: int = Field(default=100, gt=0)
    eval_batches: int = Field(default=8, gt=0, le=MAX_SIZE)
    log_interval: int = Field(default=10, gt=0)  # train-loss/grad-norm lines are flushed this often
    diverge_factor: float = Field(default=3.0, gt=1)  # loss above factor x initial loss = diverged
    device: Literal["auto", "cpu", "cuda", "mps"] = "auto"
    dtype: Literal["float32", "bfloat16"] = "float32"  # bfloat16 = autocast; weights stay fp32
    compile: bool = False
    # torch.compile mode: "reduce-overhead" captures CUDA graphs (small models on a GPU are launch-bound)
    compile_mode: Literal["default", "reduce-overhead", "max-autotune"] = "default"
    threads: int | None = Field(default=None, gt=0, le=4096)  # torch intra-op threads; None = torch default
    # Checkpoints (resume.pt) every N steps and/or every M minutes; with neither, at every evaluation.
    # A killed run resumes from the last one. They never change results, so they never change a run id.
    checkpoint_every: int | None = no_result(None, gt=0)
    checkpoint_minutes: float | None = no_result(None, gt=0)
    # Steps whose checkpoint is kept (kept-<step>.pt, beside resume.pt, never removed): where a budget
    # ladder's decays branch from this run's stable phase (training/branch.py). Results never move.
    keep_checkpoints: Steps = no_result(())
    sample_prefix: str = "## "
    sample_temp: float = Field(default=0.8, ge=0)
    sample_len: int = Field(default=300, ge=0)

    @field_validator("keep_checkpoints")
    @classmethod
    def _kept_steps(cls, steps: tuple[int, ...]) -> tuple[int, ...]:
        if any(s <= 0 for s in steps) or list(steps) != sorted(set(steps)):
            raise ValueError(f"keep_checkpoints={list(steps)}: steps above 0, increasing, each once")
        return steps

    @model_validator(mode="after")
    def _kept_inside(self) -> TrainConfig:
        if self.keep_checkpoints and self.keep_checkpoints[-1] >= self.steps:
            raise ValueError(f"keep_checkpoints={list(self.keep_checkpoints)}: each step below steps={self.steps} "
                             f"(the last step's weights are the run's own)")
        return self

    @property
    def decay_steps(self) -> int:
        """A wsd run's decay length: round(decay_frac x steps), at least 1 (0 for other schedules)."""
        return max(1, round(self.decay_frac * self.steps)) if self.schedule == "wsd" else 0

    @property
    def decay_start(self) -> int:
        """The first step of a wsd run's decay (steps for other schedules: none)."""
        return self.steps - self.decay_steps

    @property
    def warmup_note(self) -> str | None:
        """Why a run that ends inside its warmup is worth a word (None when it does not): a warning,
        not a refusal, since short smoke runs (`--steps 1` on a spec with warmup 100) are on purpose."""
        if self.steps >= self.warmup:
            return None
        peak = self.lr * self.steps / self.warmup  # lr_at(steps - 1): the last step's learning rate
        return (f"train.steps={self.steps} ends inside train.warmup={self.warmup}: the learning rate peaks at "
                f"{peak:.3g}, short of train.lr={self.lr:g}, and the {self.schedule} schedule never starts; set "
                f"train.warmup below train.steps for a full schedule")


# Tokenizers (data/tokenizer.py). A byte-level BPE holds the 256 bytes, its specials and its merges, so
# bpe:N needs N >= 256 + the specials. One special, END_OF_TEXT, is reserved (id 0) and never inserted by
# prepare: a BPE corpus encodes the same text as a char corpus (documents joined by a blank line), so the
# two count the same bytes; it is there for exports and for a user who joins documents with it.
END_OF_TEXT = "<|endoftext|>"
BPE_SPECIALS = (END_OF_TEXT,)
BPE_MIN_VOCAB = 256 + len(BPE_SPECIALS)
BPE_MAX_VOCAB = 1 << 32  # ids are stored as uint32 past 65,536


def tokenizer_problem(value: str) -> str | None:
    """Why a tokenizer spec is refused, or None. A spec is "char", "bpe:N" (N between BPE_MIN_VOCAB and
    BPE_MAX_VOCAB), "hf:NAME" (a tokenizer on the Hugging Face Hub), or a path (a tokenizer.json, or a
    folder holding one, as transformers' save_pretrained writes); whether a path or a name exists is
    the data room's to say (data/tokenizer.py)."""
    if not value.strip():
        return "empty: give char, bpe:N, hf:NAME or the path of a tokenizer.json"
    if value.startswith("hf:") and not value[3:].strip():
        return "hf: needs a tokenizer's name on the Hub, e.g. hf:gpt2"
    n = value[4:] if value.startswith("bpe:") else None
    if n is not None and (not n.isdecimal() or not BPE_MIN_VOCAB <= int(n) <= BPE_MAX_VOCAB):
        return (f"a byte-level BPE needs a vocabulary of at least {BPE_MIN_VOCAB} tokens (256 bytes + "
                f"{len(BPE_SPECIALS)} special, {END_OF_TEXT}) and at most {BPE_MAX_VOCAB:,}, e.g. bpe:4096")
    return None


def parse_tokenizer(value: str, option: str = "data.tokenizer") -> str:
    """A tokenizer spec checked (tokenizer_problem) and in its one spelling: bpe:04096 is bpe:4096."""
    problem = tokenizer_problem(value)
    if problem:
        raise ConfigError(f"{option} {value}: {problem}")
    return f"bpe:{int(value[4:])}" if value.startswith("bpe:") else value


class DataConfig(_Frozen):
    # A UTF-8 text file, a directory of .md/.txt files, a directory written by `anatomy prepare`,
    # or None for the embedded default corpus. Relative paths resolve against the spec's folder.
    source: str | None = Field(default=None, min_length=1)  # "" would read the working directory
    val_frac: float = Field(default=0.1, gt=0, lt=1)
    # How text becomes ids (parse_tokenizer): "char" (one id per character, every study before tokens),
    # "bpe:N" (a byte-level BPE of N tokens trained on the train split), a tokenizer.json path, or hf:NAME.
    # A prepared folder's tokenizer must be the one named here (data/load.py refuses another).
    tokenizer: str = new("char", min_length=1)

    @field_validator("tokenizer")
    @classmethod
    def _tokenizer(cls, value: str) -> str:
        problem = tokenizer_problem(value)
        if problem:
            raise ValueError(f"{value} is refused: {problem}")
        return parse_tokenizer(value)

    @property
    def corpus_key(self) -> tuple[str | None, str]:
        """(source, tokenizer): one corpus as a run reads it, ids and vocabulary; two tokenizers of one text
        are two corpora (their vocabularies, token counts and val windows differ)."""
        return self.source, self.tokenizer


# Settings a config may carry where they do nothing without a refusal: n_kv_head is the attention's head
# layout the base sets for every config of a study (gqa switches it), not a knob of one part; under
# latent attention it is unused, which components.built_model (a study's same-model check) accounts for.
NOT_KNOBS = ("model.n_kv_head",)


class RunConfig(_Frozen):
    name: str = "run"
    seed: Seed = 1337
    model: ModelConfig = ModelConfig()
    train: TrainConfig = TrainConfig()
    data: DataConfig = DataConfig()
    # Plugin files whose parts the model may use (spec/parts.py): loaded when the config is validated, before
    # its model; recorded absolute (a spec's relative paths resolve against its folder). Out of the run id at
    # any value: what a plugin changes is the code of the parts a model uses, which model.part_code holds.
    plugins: list[str] = no_result([])

    @model_validator(mode="before")
    @classmethod
    def _load_plugins(cls, data: Any) -> Any:
        if not isinstance(data, dict) or not isinstance(data.get("plugins"), list) \
                or not all(isinstance(p, str) for p in data["plugins"]):
            return data  # nothing to load, or the field's own type check says what is wrong
        paths = list(dict.fromkeys(registry.plugin_path(p) for p in data["plugins"]))
        model = data.get("model")
        registry.load_for(paths, model if isinstance(model, dict) else None)
        return {**data, "plugins": paths}

    @model_validator(mode="after")
    def _check_knobs(self) -> RunConfig:
        # One policy for a knob that does nothing here (as for the mla, dsa and router sizes above): set to
        # a value other than its default or 0 it is refused, so a default nobody set never is (issue 37)
        for key, why in self.unused_settings().items():
            section, name = key.split(".")
            part = getattr(self, section)
            value, default = getattr(part, name), type(part).model_fields[name].default
            if key not in NOT_KNOBS and value != default and value != 0:
                shown = f"{value:g}" if isinstance(value, float) else repr(value)
                raise ValueError(f"{key.removeprefix('model.')}={shown} does nothing here: {why}; leave it out "
                                 f"(its default is {default!r})")
        return self

    def unused_settings(self) -> dict[str, str]:
        """{dotted field: why} of the settings this config's model and training do nothing with, at any
        value: what components.built_model normalises, and (knobs only) what _check_knobs refuses."""
        m = self.model
        kinds = m.layer_kinds
        out = {}
        if "local" not in kinds:
            softmax = [i + 1 for i, k in enumerate(kinds) if k == "attn"]
            why = ("window=0: every layer is global" if not m.window
                   else f"attn_type={m.attn_type!r}: a window leaves latent attention global" if m.attn_type == "mla"
                   and not softmax else f"attn_type={m.attn_type!r}: a window is softmax attention's, and a plugin "
                   f"mixer's layers stay as they are" if m.attn_type != "softmax"
                   else f"gdn_pattern={m.gdn_pattern!r} leaves softmax attention in layer "
                   f"{', '.join(map(str, softmax)) or 'none'} only, which window_pattern={m.window_pattern!r} makes "
                   f"global" if m.gdn_pattern else f"window_pattern={m.window_pattern!r} makes every layer global")
            out |= {"model.window": why, "model.window_pattern": why}
        if not set(kinds) - {"gdn", "mla", "dsa"}:  # softmax attention and plugin mixers read n_kv_head
            out["model.n_kv_head"] = ("no layer is softmax attention (latent attention and Gated DeltaNet have no "
                                      "K/V heads)")
        router = "no router (model.moe=false)" if not m.moe else f"the {m.moe_router} router"
        if not m.moe or m.moe_router != "softmax-topk":
            out["train.moe_aux_loss"] = (f"it is the softmax-topk router's balance loss, and the model has {router}"
                                         + (" (which balances by train.moe_bias_rate)" if m.moe else ""))
        if m.moe_router != "deepseek":
            out["train.moe_bias_rate"] = f"it moves the deepseek router's selection bias, and the model has {router}"
        if not m.dsa:
            out["train.dsa_indexer_loss"] = "it trains the dsa indexer, and the model has dsa=false"
        if self.train.schedule != "wsd":
            why = f"it shapes the warmup-stable-decay schedule's decay, and train.schedule={self.train.schedule!r}"
            out |= {"train.decay_frac": why, "train.decay_shape": why}
        return out


class NamedConfig(_Frozen):
    """One entry of a `list` design: a name plus dotted overrides of the base run."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.+-]*$", max_length=64)
    set: dict[str, Any] = {}


class ComponentSpec(_Frozen):
    """A spec's own component ([components.NAME]); checked against the model/train/data fields by
    components.from_spec. `off` left out means "whatever the spec's base has"."""

    about: str = ""
    source: str = ""
    on: dict[str, Any]
    off: dict[str, Any] | None = None


BUDGET = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([smh]?)\s*")


def budget_seconds(text: str) -> float:
    """'30m' | '2h' | '90s' | '45' (seconds) -> seconds; ValueError (one line) for anything else."""
    m = BUDGET.fullmatch(text)
    if not m or float(m.group(1)) <= 0 or not math.isfinite(float(m.group(1))):
        raise ValueError(f"{text!r} is not a time: give one such as 30m, 2h, 90s or 600 (seconds)")
    return float(m.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600}[m.group(2)]


def _check_budget(text: str) -> str:
    budget_seconds(text)
    return text


def _seconds_as_text(value: Any) -> Any:
    """A bare number of seconds (--budget 600, budget = 600 in a spec) is the budget '600'."""
    return f"{value:g}" if isinstance(value, (int, float)) and not isinstance(value, bool) else value


Budget = Annotated[str, BeforeValidator(_seconds_as_text), AfterValidator(_check_budget)]


class DecideSpec(_Frozen):
    """`[decide]`: train in rounds, seeds only where an effect is still open (`anatomy ablate --decide`,
    report/decide.py). A setting `--set decide.max_seeds=6` (or its alias: spec/knobs.py) sets one; `--set decide=false`
    turns the table off."""

    max_seeds: int | None = Field(default=None, ge=2, le=MAX_SEEDS)  # None: 10, or the first look's seeds if more
    step: int = Field(default=2, ge=1, le=MAX_SEEDS)
    budget: Budget | None = None  # 30m, 2h, 90s, 600 (seconds)


class TuneSpec(_Frozen):
    """`[tune]`: fair learning rates (`anatomy ablate --tune-lr`, study/lr_study.py): every config of the plan
    trains a log-spaced grid of `points` LRs, a factor `factor` apart around base.train.lr (up to `extend`
    more past an edge its best lands on), on selection seeds of its own; its LR is frozen at the grid's
    best, and the study's seeds then train each config at its own. seeds: a count (the seeds just below
    base.seed: base.seed - 1, base.seed - 2, ..., which no count of study seeds ever reaches) or a list.
    shared: also train the study's seeds at the shared LR (base.train.lr) where a config's LR moved, for
    the report's shared-LR comparison (false: only the selection and the study train, and no call is
    checked for LR confounding). `--set tune.points=7` (or its alias: spec/knobs.py) sets one; `--set
    tune=false` turns the table off."""

    points: int = Field(default=5, ge=1, le=31)  # odd and at least 3: study/lr_selection.py's Grid says why
    factor: float = Field(default=2.0, gt=0)  # above 1: Grid refuses the rest in one line
    extend: int = Field(default=2, ge=0, le=16)
    seeds: Annotated[list[Seed], Field(min_length=1, max_length=MAX_SEEDS)] | Annotated[
        int, Field(ge=1, le=MAX_SEEDS)] = 1
    shared: bool = True  # strict, as every spec field: `shared = 0` or "no" is refused in one line


class TimingSpec(_Frozen):
    """`[timing]`: the timing pass (`anatomy ablate --time`): `steps` timed steps per config and round, over
    `rounds` rounds (the speed interval is over rounds; a call needs 3)."""

    steps: int = Field(default=20, ge=1, le=MAX_SIZE)
    rounds: int = Field(default=5, ge=3, le=MAX_SEEDS)


class BudgetsSpec(_Frozen):
    """`[budgets]`: a budget ladder at one size (study/ and training/budgets.py): `steps` the train steps of
    each budget, increasing; each arm's stable phase trains once to the largest and every smaller budget
    is a decay branched from it. It asks for the data multipliers (report/worth.py), so it needs
    MIN_BUDGETS budgets or more, and base.train.schedule = "wsd"."""

    steps: Annotated[list[Annotated[int, Field(gt=0, le=MAX_SIZE)]], Field(max_length=64)]


MIN_BUDGETS = 4  # the data multipliers' law needs 4 rungs (report/worth.py MIN_RUNGS)
COMPONENT_NAME = r"^[a-z][a-z0-9_]{0,31}$"


class SizeSpec(_Frozen):
    """One rung of a size ladder (`[[sizes]]`): model settings (and, where it must differ, train
    settings) laid over the base. The study's whole design runs at every size (AblationSpec.sizes).
    A size that sets n_head but not n_kv_head keeps the base's ratio of query to K/V heads (an MHA
    base stays MHA); a component that switches n_kv_head (gqa) still sets its own."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9.+-]*$", max_length=32)
    model: dict[str, Any] = {}
    train: dict[str, Any] = {}

    def resolved(self, base: RunConfig) -> tuple[ModelConfig, TrainConfig]:
        """The base's model and train sections with this size's settings; ConfigError naming the size."""
        for section, cls, given in (("model", ModelConfig, self.model), ("train", TrainConfig, self.train)):
            unknown = [k for k in given if k not in cls.model_fields]
            if unknown:
                close = difflib.get_close_matches(unknown[0], list(cls.model_fields), n=1)
                hint = f"; did you mean sizes.{self.name}.{section}.{close[0]}?" if close else ""
                raise ConfigError(f"sizes.{self.name}.{section}.{unknown[0]}: unknown key (not a {section} field)"
                                  f"{hint}")
        dumped = base.model_dump(mode="json")
        model = {**dumped["model"], **self.model}
        if "n_head" in self.model and "n_kv_head" not in self.model:
            ratio = base.model.n_head // base.model.n_kv_head  # validated: n_kv_head divides n_head
            if isinstance(model["n_head"], int) and model["n_head"] % ratio == 0:
                model["n_kv_head"] = model["n_head"] // ratio
            else:
                raise ConfigError(f"sizes.{self.name}.model: n_head={model['n_head']!r} keeps no whole ratio to the "
                                  f"base's {base.model.n_head}:{base.model.n_kv_head} query:K/V heads; set n_kv_head")
        return (validate(ModelConfig, model, f"sizes.{self.name}.model."),
                validate(TrainConfig, {**dumped["train"], **self.train}, f"sizes.{self.name}.train."))


class AblationSpec(_Frozen):
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.+-]*$", max_length=64)
    base: RunConfig = RunConfig()
    seeds: Annotated[list[Seed], Field(max_length=MAX_SEEDS)] | Annotated[int, Field(le=MAX_SEEDS)] = 1
    design: Literal["one-at-a-time", "factorial", "list"] = "one-at-a-time"
    # The design's components (built-in or declared below); default: the five 2017 -> LLaMA parts
    # plus every component the spec declares.
    flips: list[str] | None = None
    # Which of them get runs of their own (add-one, remove-one, factorial); the rest stay at the ends.
    # Named here, they also join the components (`--flip rope,swiglu` is its alias). Default: all.
    only: list[str] | None = None
    components: dict[str, ComponentSpec] = {}
    # one-at-a-time: add each flip to the reference end, remove each from the all-on end, or both
    directions: list[Direction] = [ADD_ONE, REMOVE_ONE]
    gqa_kv_head: int | None = Field(default=None, gt=0)  # n_kv_head the gqa flip uses
    configs: list[NamedConfig] = []  # the `list` design's entries
    axes: dict[str, list[Any]] = {}  # dotted key -> values, crossed with the design
    # A size ladder: the design runs at every size, each size paired on its own seeds (sweep.plan.expand).
    # budget: every size trains base.train.steps ("same-steps"), or tokens_per_param tokens per
    # non-embedding parameter (Chinchilla-style, "tokens-per-param"; sweep.plan.size_steps).
    sizes: Annotated[list[SizeSpec], Field(max_length=64)] = []
    # Tokenizers (data.tokenizer's values): the whole design (every size) runs at each, each tokenizer its own
    # family, paired within itself (runs of two tokenizers are never paired); the report says which calls
    # hold across them. Empty: base.data.tokenizer alone, and no run id moves.
    tokenizers: Annotated[list[str], Field(max_length=8)] = []
    budget: Literal["same-steps", "tokens-per-param"] = "same-steps"
    # Chinchilla-optimal is ~20; a million per parameter is already beyond any study here (1e30 planned
    # a step count past 2^64).
    tokens_per_param: float | None = Field(default=None, gt=0, le=1e6)
    # The smallest loss effect that matters (bits per byte), fixed before the data: a call's practical part and
    # the margin "negligible" is tested against (report/stats.py; default stats.DEFAULT_MARGIN). `min_effect`
    # is its older name, read as it.
    margin: Margin | None = Field(default=None, validation_alias=AliasChoices("margin", "min_effect"))
    # The multipliers' margin (report/worth.py): a compute or data multiplier within 1/m..m is negligible,
    # fixed before the data. Set, it asks for the multipliers: a ladder no law fits is refused (exit 2).
    worth_margin: float | None = Field(default=None, gt=1, le=MAX_MARGIN)
    budgets: BudgetsSpec | None = None  # present: a budget ladder (each arm's decays branched from one run)
    decide: DecideSpec | None = None  # present: `ablate` trains in rounds (report/decide.py)
    tune: TuneSpec | None = None  # present: `ablate` tunes each config's LR first (study/lr_study.py)
    timing: TimingSpec = TimingSpec()  # the timing pass's steps and rounds (`ablate --time`)

    @model_validator(mode="after")
    def _check_design(self) -> AblationSpec:
        if isinstance(self.seeds, int) and self.seeds < 1:
            raise ValueError("seeds must be a positive count or a non-empty list")
        if isinstance(self.seeds, list) and (not self.seeds or len(set(self.seeds)) != len(self.seeds)):
            raise ValueError("seeds must be a non-empty list of distinct integers")
        for name in ("flips", "only"):
            names = getattr(self, name)
            if names is not None and (not names or len(set(names)) != len(names)):
                raise ValueError(f"{name} must be a non-empty list without repeats")
        if not self.directions or len(set(self.directions)) != len(self.directions):
            raise ValueError("directions must be a non-empty list without repeats")
        for name in self.components:
            if not re.match(COMPONENT_NAME, name):
                raise ValueError(f"components.{name}: a name is lower-case letters, digits and _ (<= 32)")
        if self.design == "list" and not self.configs:
            raise ValueError("design 'list' needs at least one [[configs]] entry")
        if self.design != "list" and self.configs:
            raise ValueError(f"[[configs]] entries are only used by design 'list', not {self.design!r}")
        for key, values in self.axes.items():
            if not values:
                raise ValueError(f"axes.{key} must list at least one value")
        self._check_sizes()
        self._check_tokenizers()
        self._check_budgets()
        return self

    def _check_budgets(self) -> None:
        if self.budgets is None:
            return
        steps = self.budgets.steps
        if any(b <= a for a, b in zip(steps, steps[1:])):
            raise ValueError(f"budgets.steps must increase: got {', '.join(map(str, steps))}")
        if len(steps) < MIN_BUDGETS:
            raise ValueError(f"budgets.steps: the data multipliers need {MIN_BUDGETS} budgets or more (a law of 3 "
                             f"parameters and a residual); got {len(steps)}")
        if self.sizes:
            raise ValueError("budgets and [[sizes]] do not combine: a budget ladder is one size")
        if self.base.train.schedule != "wsd":
            raise ValueError(f"budgets: a budget ladder branches decays off a stable phase: set base.train.schedule "
                             f"= \"wsd\" (got {self.base.train.schedule!r})")

    def _check_tokenizers(self) -> None:
        if not self.tokenizers:
            return
        for value in self.tokenizers:
            problem = tokenizer_problem(value)
            if problem:
                raise ValueError(f"tokenizers: {value} is refused: {problem}")
        named = [parse_tokenizer(v) for v in self.tokenizers]
        twice = next((t for t in named if named.count(t) > 1), None)
        if twice:
            raise ValueError(f"tokenizers: {twice} is named twice")
        if "tokenizer" in self.base.data.model_fields_set:
            raise ValueError("base.data.tokenizer and tokenizers both name the tokenizer: give the tokenizers "
                             "alone (each is its own family)")
        if "data.tokenizer" in self.axes:
            raise ValueError("axes.data.tokenizer and tokenizers both vary the tokenizer: give the tokenizers "
                             "alone")

    @property
    def tokenizer_list(self) -> list[str | None]:
        """The tokenizers each run of the design is planned at, in their one spelling ([None]: the base's)."""
        return [parse_tokenizer(v) for v in self.tokenizers] or [None]

    def _check_sizes(self) -> None:
        names = [s.name for s in self.sizes]
        twice = next((n for n in names if names.count(n) > 1), None)
        if twice:
            raise ValueError(f"sizes: the name {twice!r} is used by two sizes")
        if self.budget == "tokens-per-param" and (not self.sizes or self.tokens_per_param is None):
            raise ValueError("budget 'tokens-per-param' needs [[sizes]] and tokens_per_param (e.g. 20)")
        if self.budget != "tokens-per-param" and self.tokens_per_param is not None:
            raise ValueError("tokens_per_param is only used by budget = 'tokens-per-param'")
        seen: dict[str, str] = {}
        for size in self.sizes:
            if "steps" in size.train:
                raise ValueError(f"sizes.{size.name}.train.steps: the budget rule sets every size's steps "
                                 f"(budget = 'same-steps': base.train.steps; 'tokens-per-param': computed)")
            model, train = size.resolved(self.base)
            key = model.model_dump_json() + train.model_dump_json()
            if key in seen:
                raise ValueError(f"sizes.{size.name}: the same settings as sizes.{seen[key]} (a size that repeats "
                                 f"another)")
            seen[key] = size.name

    @property
    def seed_list(self) -> list[int]:
        return seeds_of(self.seeds, self.base.seed)


# --------------------------------------------------------------------------------- helpers


def format_validation_error(err: ValidationError, prefix: str = "", cls: type[BaseModel] | None = None) -> str:
    """'model.n_head: n_head=3 must divide d_model=128' style lines, one per problem. With the class
    validated (`cls`), an unknown key gets the closest known one: 'model.pos: unknown key; did you
    mean model.pos_type?'."""
    lines = []
    for e in err.errors():
        parts = tuple(p for p in e["loc"] if not str(p).startswith("function-after"))
        loc = ".".join(str(p) for p in parts)
        loc = f"{prefix}{loc}" if loc else prefix.rstrip(".")
        msg = error_text(e)
        if e["type"] == "extra_forbidden":
            close = closest_key(cls, parts) if cls is not None else None
            where = prefix if prefix.endswith(".") else ""  # 'config.json: ' is not part of a key
            msg = "unknown key" + (f"; did you mean {where}{close}?" if close else "")
        key, sep, rest = msg.partition(": ")
        if sep and key.split(".")[0] in PART_TABLES:  # a part's option, named by the model's validator
            loc, msg = f"{loc}{key}" if not loc or loc.endswith(" ") else f"{loc}.{key}", rest
        lines.append(f"{loc}: {msg}" if loc else msg)
    return "; ".join(lines)


def error_text(e: dict) -> str:
    """One pydantic error's message without its 'Value error, ' prefix; a value of the wrong type is
    shown as TOML writes it ('Input should be a valid integer, got 32.0': strictness explained)."""
    msg = e["msg"].removeprefix("Value error, ")
    given = e.get("input")
    wrong_type = e["type"] in ("int_type", "float_type", "bool_type", "string_type")
    if wrong_type and isinstance(given, (bool, int, float, str)):
        return f"{msg}, got {json.dumps(given)}"
    return msg


def closest_key(cls: type[BaseModel], loc: tuple) -> str | None:
    """The dotted key most like the unknown one at `loc` ('model.pos' -> 'model.pos_type'), among the
    fields of the (nested) config class that holds it; None when none is close or the place holds no
    fields (a dict of components, a list of sizes)."""
    node: Any = cls
    for part in loc[:-1]:
        info = node.model_fields.get(part) if isinstance(part, str) else None
        node = info.annotation if info is not None else None
        if not (isinstance(node, type) and issubclass(node, BaseModel)):
            return None
    close = difflib.get_close_matches(str(loc[-1]), list(node.model_fields), n=1)
    return ".".join([*map(str, loc[:-1]), close[0]]) if close else None


def setting_keys() -> list[str]:
    """Every dotted key of a run's config a `--set` can name: name, seed, model.d_model, ..."""
    keys = []
    for name in RunConfig.model_fields:
        section = SECTIONS.get(name)
        keys += [f"{name}.{f}" for f in section.model_fields if f not in PART_TABLES] if section else [name]
    return keys + [f"model.part_options.{p.name}.{k}" for p in registry.REGISTRY.values() if p.options
                   for k in p.options.model_fields]


PART_TABLES = ("part_options", "part_code")  # ModelConfig's tables by part: keys model.part_options.NAME.KEY


PLURAL = {"an integer": "integers", "a number": "numbers", "a string": "strings", "true or false": "true or false"}


def describe_type(annotation: Any) -> str:
    """A field's type in words: 'an integer', 'true or false', "one of 'learned', 'rope', 'nope'"."""
    origin = get_origin(annotation)
    if origin is Annotated:  # a bounded type: its bounds are the config's to state
        return describe_type(get_args(annotation)[0])
    if origin is list:
        inner = describe_type(get_args(annotation)[0]) if get_args(annotation) else "a value"
        return f"a list of {PLURAL.get(inner, 'values: ' + inner)}"
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in get_args(annotation))
    if origin in (Union, types.UnionType):  # `int | None`: None is the default, never typed (TOML has no null)
        return " or ".join(describe_type(a) for a in get_args(annotation) if a is not type(None))
    words = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}
    return words.get(annotation, getattr(annotation, "__name__", str(annotation)))


def check_setting(key: str, value: Any, raw: str, option: str = "--set") -> None:
    """One `--set KEY=VALUE`, before it meets the config: KEY names a setting (else the closest one is
    offered) and VALUE has its field's type, strictly (pydantic's strict mode: true is not the integer
    1, 1.5 and "12" are not integers, "yes" and 1 are not booleans; an integer is a number). Bounds and
    cross-field checks stay with the config's own validation, which names the key as a spec would."""
    section = SECTIONS.get(key)
    if section is not None:  # a whole section as a TOML table: each of its settings checked alike
        if not isinstance(value, dict):
            raise ConfigError(f"{option} {key}: a section, not a setting; set one of its keys, e.g. "
                              f"{key}.{next(iter(section.model_fields))}=...")
        for k, v in value.items():
            check_setting(f"{key}.{k}", v, str(v), option)
        return
    head, _, fld = key.partition(".")
    if head == "model" and fld.startswith("part_options."):
        return check_part_setting(key, value, raw, option)
    fields = SECTIONS[head].model_fields if head in SECTIONS else RunConfig.model_fields if not fld else {}
    info = fields.get(fld or head)
    if info is None:
        close = difflib.get_close_matches(key, setting_keys(), n=1)
        sections = ", ".join(f"{x}.KEY" for x in SECTIONS)
        hint = f"; did you mean {close[0]}?" if close else f" (settings are name, seed, {sections})"
        raise ConfigError(f"{option} {key}: unknown key{hint}")
    slot = registry.SLOT_OF_FIELD.get(fld) if head == "model" else None
    expected = ("one of " + ", ".join(map(repr, registry.names(slot)))) if slot else describe_type(info.annotation)
    try:
        TypeAdapter(info.annotation, config=ConfigDict(strict=True)).validate_python(value)
    except ValidationError:
        raise ConfigError(f"{option} {key}: expected {expected}, got {raw}") from None


def check_part_setting(key: str, value: Any, raw: str, option: str = "--set") -> None:
    """`--set model.part_options.NAME.KEY=V` (or model.part_options.NAME={...}): NAME a loaded part, KEY one of its
    options, V of that option's type (strictly, as check_setting)."""
    name, _, opt = key.removeprefix("model.part_options.").partition(".")
    part = registry.REGISTRY.get(name)
    if part is None or part.options is None:
        why = "takes no options" if part is not None else ("is no part that is loaded (a plugin's part needs its "
                                                            "file: plugins = [\"FILE\"], or --plugin FILE)")
        raise ConfigError(f"{option} {key}: {name!r} {why}")
    if not opt:
        if not isinstance(value, dict):
            raise ConfigError(f"{option} {key}: a part's options, not a setting; set one, e.g. "
                              f"{key}.{next(iter(part.options.model_fields), 'KEY')}=...")
        for k, v in value.items():
            check_part_setting(f"{key}.{k}", v, str(v), option)
        return
    info = part.options.model_fields.get(opt)
    if info is None:
        close = difflib.get_close_matches(opt, list(part.options.model_fields), n=1)
        hint = f"; did you mean model.part_options.{name}.{close[0]}?" if close else (
            f" ({name}'s options: {', '.join(part.options.model_fields)})")
        raise ConfigError(f"{option} {key}: unknown key{hint}")
    try:
        TypeAdapter(info.annotation, config=ConfigDict(strict=True)).validate_python(value)
    except ValidationError:
        raise ConfigError(f"{option} {key}: expected {describe_type(info.annotation)}, got {raw}") from None


SECTIONS: dict[str, type[_Frozen]] = {"model": ModelConfig, "train": TrainConfig, "data": DataConfig}


def validate_field(key: str, value: Any, name: str | None = None) -> Any:
    """One setting ('train.device') checked against its field's own type and bounds alone (cross-field
    checks need the whole config); returns the value as the config holds it (JSON form). An error
    names `name`: the option or spec key the user wrote ('--device', 'components.x.on.train.device')."""
    section, _, fld = key.partition(".")
    info = SECTIONS[section].model_fields[fld]
    # The FieldInfo carries the bounds (none for a bool or a Literal); the section's config says
    # whether inf/nan are numbers (they are not, for every section). Strict, as `validate` is.
    allow = SECTIONS[section].model_config.get("allow_inf_nan", True)
    adapter = TypeAdapter(Annotated[info.annotation, info], config=ConfigDict(allow_inf_nan=allow, strict=True))
    try:
        return adapter.dump_python(adapter.validate_python(value), mode="json")
    except ValidationError as err:
        raise ConfigError(f"{name or key}: {error_text(err.errors()[0])}") from None


def validate(cls: type[_Frozen], data: dict, prefix: str = "") -> Any:
    """`data` (a spec, a run's config.json, a planned config) as `cls`, read as strictly as `--set` is
    (check_setting): true is not 1, "32" and 32.0 are not integers, "0.02" is not a number; an integer
    is a number (`lr = 1` is 1.0). ConfigError with one line per problem, each naming its key."""
    try:
        return cls.model_validate(data, strict=True)
    except ValidationError as err:
        raise ConfigError(format_validation_error(err, prefix, cls)) from None


def load_toml(path: Path) -> dict:
    try:
        return tomllib.loads(Path(path).read_text(encoding="utf-8-sig"))  # -sig: a BOM (Windows editors) is not TOML
    except FileNotFoundError:
        raise ConfigError(f"spec not found: {path}") from None
    except IsADirectoryError:
        raise ConfigError(f"spec is a directory, not a TOML file: {path}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"spec is not UTF-8 text: {path}") from None
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"{path}: invalid TOML: {err}") from None


def parse_value(text: str) -> Any:
    """CLI override values: TOML scalars/arrays when they parse as such, else the raw string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def set_dotted(data: dict, key: str, value: Any) -> dict:
    """Return a copy of nested `data` with `key` ('model.pos_type') set to `value`."""
    head, _, rest = key.partition(".")
    out = dict(data)
    if rest:
        sub = out.get(head, {})
        if not isinstance(sub, dict):
            raise ConfigError(f"{key}: {head} is not a section")
        out[head] = set_dotted(sub, rest, value)
    else:
        out[head] = value
    return out


def apply_overrides(data: dict, overrides: list[str] | dict[str, Any]) -> dict:
    """Apply `--set key=value` strings (or a {key: value} dict) to a nested config dict."""
    items = overrides.items() if isinstance(overrides, dict) else [_split_override(o)[:2] for o in overrides]
    for key, value in items:
        data = set_dotted(data, key, value)
    return data


def _split_override(text: str) -> tuple[str, Any, str]:
    """'model.ctx_len=64' -> (key, parsed value, the value as typed)."""
    key, eq, value = text.partition("=")
    if not eq or not key.strip():
        raise ConfigError(f"--set expects key=value (e.g. model.pos_type=rope), got {text!r}")
    if key.count(".") > 8:  # no spec is this deep; set_dotted would recurse until Python gives up
        raise ConfigError(f"--set key {key[:60]!r}... is nested deeper than any spec section")
    return key.strip(), parse_value(value.strip()), value.strip()


def refuse_ablation_spec(data: dict, spec: Path) -> None:
    """A spec with an ablation's keys (base, design, seeds, sizes, ...) and none of a run's sections,
    given where a run spec goes: one line saying which command runs it, not an unknown key per key."""
    ablation = set(AblationSpec.model_fields) - set(RunConfig.model_fields)
    if ablation & set(data) and not set(SECTIONS) & set(data):
        raise ConfigError(f"{spec} is an ablation spec: run it with `anatomy ablate {spec}`")


def resolve_source(data: dict, base_dir: Path, section: str = "data") -> dict:
    """Make a relative data.source (or base.data.source), and a tokenizer given as a path, relative to
    the spec file's folder."""
    node = data
    for part in section.split("."):
        node = node.get(part, {}) if isinstance(node, dict) else {}
    for key in ("source", "tokenizer"):
        src = node.get(key) if isinstance(node, dict) else None
        if key == "tokenizer" and isinstance(src, str) and (src == "char" or src.startswith(("bpe:", "hf:"))):
            continue
        if isinstance(src, str) and src and not Path(src).is_absolute() and not Path(src).exists():
            candidate = base_dir / src
            if candidate.exists():
                data = set_dotted(data, f"{section}.{key}", str(candidate.resolve()))
    return data


def resolve_plugins(data: dict, base_dir: Path | None, section: str = "", more: list | tuple = ()) -> dict:
    """A spec's `plugins` (or base.plugins) as absolute paths, a relative one against the spec's folder,
    with `more` (--plugin FILE, against the working folder) added, each file loaded now (read afresh:
    an edited file replaces its parts). PartError, one line, for a file that is missing or does not run."""
    node = data.get(section, {}) if section else data
    if not isinstance(node, dict):
        return data
    given = node.get("plugins", [])
    if not isinstance(given, list) or not all(isinstance(p, str) for p in given):
        return data  # the field's own type check says what is wrong
    paths = list(dict.fromkeys([*(registry.plugin_path(p, base_dir) for p in given),
                                *(registry.plugin_path(p) for p in more)]))
    registry.load_plugins(paths)
    if not paths:
        return data
    node = {**node, "plugins": paths}
    return {**data, section: node} if section else node


def load_run_config(spec: Path | None = None, overrides: list[str] | None = None,
                    plugins: list | tuple = ()) -> RunConfig:
    """A run spec (or none) with --set overrides and --plugin files (`plugins`), validated."""
    data: dict = {}
    if spec is not None:
        data = load_toml(spec)
        refuse_ablation_spec(data, spec)
        data = resolve_source(data, Path(spec).parent)
    data = resolve_plugins(data, Path(spec).parent if spec is not None else None, more=plugins)
    sets = [_split_override(o) for o in overrides or []]
    for key, value, raw in sets:
        check_setting(key, value, raw)
    for key, value, _ in sets:
        data = set_dotted(data, key, value)
    return validate(RunConfig, data)

"""The component table: every part anatomy can switch, declared once as data (no torch import).

A component is a name, a one-line description, its source, and two states given as dotted
settings of a run config: `off` (the reference part) and `on`. `off` may be None, meaning
"whatever the spec's base has" (NoPE compares against learned positions from the 2017 end and
against RoPE from the LLaMA end). Everything that knows about components reads this table:

  state / label       which components a config has                 (train summaries, reports)
  sweep.plan.expand   the ends, add-one, remove-one, factorial runs; the role check
  role / settings_key / group_names
                      a run's role in its design and the group it is compared in (report, timing)
  report              effects, colours per component
  export              which parts Hugging Face's LlamaForCausalLM can express
  `anatomy components` the table, printed

A spec adds its own components (`[components.NAME]` with about/source/off/on), validated like
built-ins: a setting must name a field of model, train or data. Every part a plugin declares
(spec/parts.py) is a component too, made from its registration (part_row): on = its slot's field
set to its name, off = the base's, so `--flip NAME` plans it and the report judges it like any row.

Adding a built-in component = its model code, one row in BUILTINS, its tests.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from anatomy_cli.spec import parts as registry
from anatomy_cli.spec.config import SECTIONS, ConfigError, ModelConfig, validate_field
from anatomy_cli.spec.roles import ADD_ONE, ALL_ON, REFERENCE, REMOVE_ONE, variant


@dataclass(frozen=True)
class Follows:
    """A setting relative to another field of the same config (gqa: n_kv_head against n_head).

    less=False: equal to `key`'s value. less=True: fewer than it; planned as `value` when the spec
    gives one (gqa_kv_head), else half of it. A state test asks the relation, not the value, so any
    n_kv_head < n_head counts as GQA, whatever axis or base put it there.
    """

    key: str
    less: bool = False
    value: int | None = None

    def resolve(self, flat: Mapping[str, Any]) -> Any:
        other = flat[self.key]
        if not self.less:
            return other
        return self.value if self.value is not None else max(1, other // 2)

    def holds(self, value: Any, flat: Mapping[str, Any]) -> bool:
        other = flat[self.key]
        return value < other if self.less else value == other

    def __str__(self) -> str:
        short = self.key.split(".")[-1]
        if not self.less:
            return f"= {short}"
        return f"{self.value} (< {short})" if self.value is not None else f"{short}/2"


LLAMA_STATES = ("on", "off", "either")


@dataclass(frozen=True)
class Component:
    name: str
    about: str
    source: str
    on: Mapping[str, Any]
    off: Mapping[str, Any] | None = None  # None: the base's values
    family: str = ""  # "llama": one of the five parts of the 2017 -> LLaMA question
    origin: str = "built-in"  # or the spec file that declared it
    parts: tuple[str, str] = ("", "")  # human names of the off and on parts, for messages
    # In an HF LlamaForCausalLM this part must be "on" | "off" | "either". Required, with no default:
    # a row that forgot it would export a Llama that silently ignores the part (exams/export.py reads it).
    llama: str = field(kw_only=True)

    def __post_init__(self) -> None:
        if self.llama not in LLAMA_STATES:
            raise ValueError(f"component {self.name}: llama must be one of {', '.join(LLAMA_STATES)}, "
                             f"got {self.llama!r}")

    @property
    def keys(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys([*self.on, *(self.off or {})]))

    def settings(self, on: bool, flat: Mapping[str, Any]) -> dict[str, Any]:
        """Dotted settings that put a config (flattened as `flat`) into this component's state."""
        chosen = self.on if on else self.off or {}
        return {k: v.resolve(flat) if isinstance(v, Follows) else v for k, v in chosen.items()}

    def state(self, flat: Mapping[str, Any]) -> bool | None:
        """True (on), False (off) or None (neither: a config this component cannot place)."""
        if _matches(self.on, flat):
            return True
        if self.off is None or _matches(self.off, flat):
            return False
        return None

    def describe(self, which: str) -> str:
        chosen = self.on if which == "on" else self.off
        if not chosen:  # None or {}: off is whatever the base has
            return "(the base's)"
        return ", ".join(f"{k.removeprefix('model.')}={_show(v)}" for k, v in chosen.items())


def _matches(settings: Mapping[str, Any], flat: Mapping[str, Any]) -> bool:
    for key, want in settings.items():
        if key not in flat:
            return False
        have = flat[key]
        if isinstance(want, Follows):
            if not want.holds(have, flat):
                return False
        elif have != want:
            return False
    return True


def _show(v: Any) -> str:
    return str(v) if isinstance(v, Follows) else repr(v) if isinstance(v, str) else f"{v}"


# The five parts of the 2017 -> LLaMA question first (their order is the canonical flip order),
# then six parts of today's dense models, then the eight parts of 2024-2026 models (gdn to dsa), then
# the two parts of CS336's ablations anatomy's own parts API declares (spec/parts.py: silu, none).
BUILTINS: tuple[Component, ...] = (
    Component("rmsnorm", "RMSNorm instead of LayerNorm: scale only, no mean, no bias",
              "Zhang & Sennrich 2019; LLaMA", on={"model.norm_type": "rmsnorm"},
              off={"model.norm_type": "layernorm"}, family="llama", llama="on", parts=("LayerNorm", "RMSNorm")),
    Component("prenorm", "pre-norm blocks plus a final norm instead of post-norm",
              "Xiong et al. 2020; GPT-2, LLaMA", on={"model.norm_pos": "pre"},
              off={"model.norm_pos": "post"}, family="llama", llama="on", parts=("post-norm", "pre-norm")),
    Component("rope", "rotary positions on Q and K (half-split pairing) instead of a learned table",
              "Su et al. 2021; LLaMA", on={"model.pos_type": "rope"}, off={"model.pos_type": "learned"},
              family="llama", llama="on", parts=("learned positions", "RoPE")),
    Component("swiglu", "SwiGLU FFN at 2/3 of the hidden size instead of GELU at 4d",
              "Shazeer 2020; LLaMA", on={"model.ffn_type": "swiglu"}, off={"model.ffn_type": "gelu"},
              family="llama", llama="on", parts=("GELU FFN", "SwiGLU")),
    Component("gqa", "grouped-query attention: fewer K/V heads than query heads",
              "Ainslie et al. 2023; LLaMA 2", on={"model.n_kv_head": Follows("model.n_head", less=True)},
              off={"model.n_kv_head": Follows("model.n_head")}, family="llama", llama="either",
              parts=("MHA", "GQA")),
    Component("qknorm", "RMSNorm over head_dim on Q and K of every head, before RoPE",
              "Qwen3; Gemma 3 (OLMo 2 norms the whole Q and K projections instead)", on={"model.qk_norm": True},
              off={"model.qk_norm": False}, llama="off", parts=("no QK-norm", "QK-norm")),
    Component("tied", "the LM head shares the embedding matrix", "GPT-2 (Radford et al. 2019); Gemma",
              on={"model.tie_embeddings": True}, off={"model.tie_embeddings": False}, llama="either",
              parts=("untied head", "tied embeddings")),
    Component("parallel", "attention and FFN read one normed input and add to the residual together",
              "GPT-J (Wang & Komatsuzaki 2021); PaLM (Chowdhery et al. 2022)", on={"model.parallel_block": True},
              off={"model.parallel_block": False}, llama="off", parts=("sequential block", "parallel block")),
    Component("zloss", "auxiliary z-loss 1e-4 * log^2 Z on the softmax normaliser (training only)",
              "PaLM (Chowdhery et al. 2022)", on={"train.z_loss": 1e-4}, off={"train.z_loss": 0.0}, llama="either",
              parts=("no z-loss", "z-loss")),
    Component("softcap", "final-logit soft-capping 30 * tanh(logits / 30)", "Gemma 2 (2024)",
              on={"model.logit_softcap": 30.0}, off={"model.logit_softcap": 0.0}, llama="off",
              parts=("uncapped logits", "soft-capped logits")),
    Component("nope", "no position information at all (causal attention alone)",
              "Kazemnejad et al. 2023", on={"model.pos_type": "nope"}, llama="off",
              parts=("positions", "NoPE")),
    Component("gdn", "Gated DeltaNet in 3 of every 4 layers (DDDA): a gated delta-rule memory, no softmax, "
              "no positions", "Yang, Kautz & Hatamizadeh 2025 (ICLR); Qwen3-Next",
              on={"model.gdn_pattern": "DDDA"}, off={"model.gdn_pattern": ""}, llama="off",
              parts=("attention in every layer", "Gated DeltaNet hybrid")),
    # window 16 of the default study's ctx 64; 3 local : 1 global, the global layer last in its group
    # as in Gemma 3's 5 : 1 (4 layers take no 5 : 1), so one layer still reads the whole context
    Component("swa", "sliding-window attention: 3 of 4 layers see only their 16 latest positions",
              "Beltagy et al. 2020; Mistral 7B (Jiang et al. 2023); Gemma 2, Gemma 3",
              on={"model.window": 16, "model.window_pattern": "LLLG"},
              off={"model.window": 0, "model.window_pattern": "L"}, llama="off",
              parts=("global attention", "sliding-window attention")),
    Component("moe", "every FFN becomes routed experts, top-k per token, sized so active FFN params = dense",
              "Shazeer et al. 2017; Switch (Fedus et al. 2022); Mixtral; Qwen3-MoE; DeepSeek V3",
              on={"model.moe": True}, off={"model.moe": False}, llama="off",
              parts=("dense FFN", "mixture of experts")),
    Component("mla", "multi-head latent attention: K and V rebuilt from a cached d/2 latent plus one shared "
              "RoPE key (replaces the K/V heads, so n_kv_head is unused)", "DeepSeek-V2 (2024); DeepSeek-V3",
              on={"model.attn_type": "mla"}, off={"model.attn_type": "softmax"}, llama="off",
              parts=("softmax attention", "latent attention")),
    Component("sinks", "attention sinks: a learned logit per query head joins every softmax's denominator and "
              "takes no value (init 0)", "gpt-oss (OpenAI 2025); after StreamingLLM's sink tokens (Xiao et al. 2024)",
              on={"model.attn_sinks": True}, off={"model.attn_sinks": False}, llama="off",
              parts=("softmax attention", "attention sinks")),
    Component("gattn", "gated attention output: Q's projection also emits a gate per head and dim (under mla, "
              "a gate projection of its own from the layer input), out = o_proj(attn * sigmoid(gate))",
              "Qiu et al. 2025 (NeurIPS); Qwen3-Next, Qwen3.5",
              on={"model.attn_gate": True}, off={"model.attn_gate": False}, llama="off",
              parts=("ungated attention output", "gated attention output")),
    # pos_type too, so the 2017 end (learned positions) can turn it on; a design cannot hold it with rope
    Component("partrope", "partial RoPE: only the first quarter of each head's dims rotate, the rest carry "
              "no position", "GPT-NeoX-20B (rotary_pct 0.25, Black et al. 2022); Qwen3-Next (partial_rotary_factor)",
              on={"model.pos_type": "rope", "model.rope_fraction": 0.25}, off={"model.rope_fraction": 1.0},
              llama="off", parts=("full RoPE", "partial RoPE")),
    # on latent attention, as in DeepSeek-V3.2 (so the whole model maps onto DeepseekV32ForCausalLM). off
    # is dsa=false on the attention the config has, so a plain mla model reads as dsa off: added to a
    # softmax reference it brings mla along; removed from an end with mla on, it leaves dense MLA
    Component("dsa", "DeepSeek sparse attention: latent attention (mla) where each query reads only the quarter "
              "of the context's keys (16 of 64) a small ReLU indexer scores highest; the indexer learns by its "
              "own KL loss toward the attention's distribution (train.dsa_indexer_loss)",
              "DeepSeek-V3.2-Exp (DeepSeek-AI 2025)", on={"model.attn_type": "mla", "model.dsa": True},
              off={"model.dsa": False}, llama="off", parts=("dense attention", "sparse latent attention")),
    # CS336 (Stanford, 2025) assignment 1's swiglu_ablation: "SwiGLU vs SiLU, approximately matched parameter
    # counts" (its SiLU at d_ff = 4 d_model against SwiGLU's 8/3 d_model); here SwiGLU's hidden is rounded up
    # to 32, so SiLU's is 3/2 of it and the parameters match exactly (ModelConfig.ffn_hidden)
    Component("silu", "SiLU MLP: two matrices, no gate, hidden 3/2 of SwiGLU's (its parameters exactly)",
              "Elfwing et al. 2018 (SiLU); CS336 (2025) assignment 1, swiglu_ablation", on={"model.ffn_type": "silu"},
              llama="off", parts=("the base's FFN", "SiLU FFN")),
    # CS336's layer_norm_ablation: "remove all of the RMSNorms"; every norm of norm_type (each block's and the
    # final one) becomes an identity; QK-norm is a part of its own (qknorm) and stays as set
    Component("nonorm", "no norm: every norm of the blocks, and the final one, an identity",
              "CS336 (2025) assignment 1, layer_norm_ablation", on={"model.norm_type": "none"}, llama="off",
              parts=("the base's norm", "no norm")),
)
BUILTIN_NAMES: tuple[str, ...] = tuple(c.name for c in BUILTINS)
registry.reserve(BUILTIN_NAMES, "a built-in component")
FIVE: tuple[str, ...] = tuple(c.name for c in BUILTINS if c.family == "llama")
BY_NAME: dict[str, Component] = {c.name: c for c in BUILTINS}


# ------------------------------------------------------------------------------ configs


def flatten(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """{'model': {'d_model': 64}} -> {'model.d_model': 64}."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, Mapping):
            out |= flatten(value, f"{prefix}{key}.")
        else:
            out[f"{prefix}{key}"] = value
    return out


def flat_config(cfg: Any) -> dict[str, Any]:
    """A RunConfig, ModelConfig or config dict as dotted settings; a model-only one gets the
    defaults of train and data (so a train-side component reads as off)."""
    if isinstance(cfg, ModelConfig):
        cfg = {"model": cfg.model_dump(mode="json")}
    elif hasattr(cfg, "model_dump"):
        cfg = cfg.model_dump(mode="json")
    defaults = {f"{s}.{k}": f.default for s, cls in SECTIONS.items() for k, f in cls.model_fields.items()
                if s != "model"}
    return defaults | flatten(cfg)


def part_row(p: registry.Part) -> Component:
    """A plugin's part as a component: on sets its slot's field to its name, off is the base's (as nope's).
    Export can express it when it declares a Hugging Face mapping (llama 'either'), else not ('off')."""
    field_ = f"model.{registry.SLOTS[p.slot].field}"
    return Component(p.name, p.about or f"plugin {p.slot} part", p.source, on={field_: p.name}, origin=p.origin,
                     llama="either" if p.hf is not None else "off",
                     parts=(f"the base's {p.slot}", f"{p.name} (plugin)"))


def rows() -> tuple[Component, ...]:
    """Every component a config can be read against: the built-ins, then each plugin part loaded."""
    return BUILTINS + tuple(part_row(p) for p in registry.plugin_parts())


def states(cfg: Any, components: Iterable[Component] | None = None) -> dict[str, bool | None]:
    flat = flat_config(cfg)
    return {c.name: c.state(flat) for c in (rows() if components is None else components)}


def on_names(cfg: Any, components: Iterable[Component] | None = None) -> tuple[str, ...]:
    return tuple(name for name, on in states(cfg, components).items() if on)


def label(cfg: Any, components: Iterable[Component] | None = None) -> str:
    """'2017', 'llama', the five-part flips present ('rope+swiglu'), then any other part on
    ('llama+qknorm'); the article's deliberately broken RoPE variants say so."""
    on = on_names(cfg, components)
    five = [n for n in FIVE if n in on]
    name = "2017" if not five else "llama" if len(five) == len(FIVE) else "+".join(five)
    name = "+".join([name, *(n for n in on if n not in FIVE)])
    variant = flat_config(cfg).get("model.rope_variant", "standard")
    if variant != "standard":
        name += f" [BROKEN rope:{variant}]"  # the article's break-it exercise, not a real part
    return name


# ------------------------------------------------------------------------------ spec components


def from_spec(name: str, spec: Mapping[str, Any], origin: str) -> Component:
    """A component declared in a spec's [components.NAME] table, validated like a built-in.

    Each value is checked against its field's own type (strictly, as `--set`: `qk_norm = "yes"` is
    refused) and bounds, and kept as that field holds it (`weight_decay = 0` as 0.0), so states
    compare like with like. `off = {}` means what leaving `off` out means: the base's values.
    """
    if name in BY_NAME:
        raise ConfigError(f"components.{name}: a built-in component has this name; choose another")
    if name in registry.REGISTRY:
        raise ConfigError(f"components.{name}: the part {registry.REGISTRY[name].where()} has this name; choose "
                          f"another")
    on, off = dict(spec.get("on") or {}), spec.get("off")
    if not on:
        raise ConfigError(f"components.{name}.on: give at least one dotted setting, e.g. \"train.weight_decay\" = 0.0")
    on = {key: check_setting(f"components.{name}.on", key, value) for key, value in on.items()}
    if off is not None:
        off = {key: check_setting(f"components.{name}.off", key, value) for key, value in off.items()}
    if off is not None and off == on:
        raise ConfigError(f"components.{name}: on and off are the same settings")
    return Component(name, spec.get("about") or "", spec.get("source") or "", on, off, origin=origin, llama="either")


def check_setting(where: str, key: str, value: Any) -> Any:
    """A dotted key must name a field of model, train or data, and the value must validate against
    that field's own type and bounds (cross-field checks run when the plan validates each run).
    Returns the value as the config holds it (JSON form)."""
    section, _, fld = key.partition(".")
    if section not in SECTIONS or fld not in SECTIONS[section].model_fields:
        raise ConfigError(f"{where}: {key!r} is not a field of model, train or data (e.g. model.qk_norm)")
    return validate_field(key, value, f"{where}.{key}")


def table(declared: Mapping[str, Any] | None = None, origin: str = "spec", gqa_kv_head: int | None = None
          ) -> dict[str, Component]:
    """Built-ins (gqa planned at gqa_kv_head K/V heads when given), each plugin part loaded, then a spec's
    own components."""
    out = {c.name: c for c in rows()}
    if gqa_kv_head is not None:
        gqa = BY_NAME["gqa"]
        out["gqa"] = Component(**{**gqa.__dict__,
                                  "on": {"model.n_kv_head": Follows("model.n_head", True, gqa_kv_head)}})
    for name, spec in (declared or {}).items():
        out[name] = from_spec(name, spec if isinstance(spec, Mapping) else spec.model_dump(), origin)
    return out


def check_conflicts(design: Iterable[Component]) -> None:
    """Two components that set the same field cannot share a design (rope and nope both set pos_type)."""
    owner: dict[str, str] = {}
    for c in design:
        for key in c.keys:
            if key in owner:
                raise ConfigError(f"components {owner[key]} and {c.name} both set {key}: they cannot be in one "
                                  f"design (drop one from flips)")
            owner[key] = c.name


def end_names(names: Iterable[str]) -> tuple[str, str]:
    """('2017', 'llama') for the five parts of the article's question, else ('reference', 'all-on')."""
    return ("2017", "llama") if set(names) == set(FIVE) else (REFERENCE, ALL_ON)


def record(c: Component) -> dict[str, Any]:
    """A JSON-able row (for `anatomy components --json` and a sweep's sweep.json)."""
    return {"name": c.name, "about": c.about, "source": c.source, "origin": c.origin,
            "off": None if c.off is None else {k: _plain(v) for k, v in c.off.items()},
            "on": {k: _plain(v) for k, v in c.on.items()}, "family": c.family, "llama": c.llama}


def _plain(v: Any) -> Any:
    return str(v) if isinstance(v, Follows) else v


# ------------------------------------------------------------------------------ the same model

UNUSED = "(unused)"


def built_model(cfg: Any) -> str:
    """What a run config trains, as JSON: every setting but name and seed, those the model and training do
    nothing with (RunConfig.unused_settings: a window no layer takes, K/V heads latent attention has not,
    a router's loss another router ignores) replaced by UNUSED. Two configs with the same built_model
    build the same parameters (names and shapes), the same mixer per layer and train them alike: their
    runs at one seed are the same run (tests check this against the built modules)."""
    flat = {k: v for k, v in flat_config(cfg).items() if k not in ("name", "seed")}
    flat |= dict.fromkeys(cfg.unused_settings(), UNUSED)
    flat["layers"] = list(cfg.model.layer_kinds)
    return json.dumps(flat, sort_keys=True, default=str)


def same_models(configs: Iterable[tuple[str, Any]]) -> list[str]:
    """One line per planned config (slug, RunConfig) that builds the same model as an earlier one at the
    same seed while its settings differ: a flip another flip cancels there, which no run can measure."""
    first: dict[tuple[str, int], tuple[str, Any]] = {}
    out = []
    for slug, cfg in configs:
        key = (built_model(cfg), cfg.seed)
        if key not in first:
            first[key] = (slug, cfg)
            continue
        other_slug, other = first[key]
        a, b = flat_config(other), flat_config(cfg)
        differ = [k for k in a if k not in ("name", "seed") and a[k] != b.get(k)]
        if not differ or slug == other_slug:
            continue
        why = cfg.unused_settings()
        shown = ", ".join(f"{k.removeprefix('model.')} ({b[k]!r} here, {a[k]!r} there)" for k in differ)
        reasons = "; ".join(dict.fromkeys(why[k] for k in differ if k in why))
        out.append(f"{slug} builds the same model as {other_slug}: they differ only in {shown}, which "
                   f"{'does' if len(differ) == 1 else 'do'} nothing here ({reasons}); a flip that changes nothing "
                   f"cannot be measured: drop it, or the flip that cancels it, from flips")
    return out


def from_record(row: Mapping[str, Any]) -> Component:
    """The inverse of record() for a spec's component (built-ins are looked up by name)."""
    if row.get("origin", "built-in") == "built-in" and row["name"] in BY_NAME:
        return BY_NAME[row["name"]]
    return Component(row["name"], row.get("about", ""), row.get("source", ""), dict(row["on"]),
                     None if row.get("off") is None else dict(row["off"]), origin=row.get("origin", "spec"),
                     llama="either")  # export reads built-in rows only


@dataclass(frozen=True)
class Design:
    """The components of one study: which define its ends, which get their own runs."""

    components: tuple[Component, ...]
    varied: tuple[str, ...] = field(default=())  # add-one / remove-one runs for these

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.components)

    @property
    def ends(self) -> tuple[str, str]:
        return end_names(self.names)


def model_settings(names: Iterable[str] = FIVE, on: bool = True, model: Mapping[str, Any] | None = None
                   ) -> dict[str, Any]:
    """Model fields that turn the named built-ins on (or off) in a model config (default sizes when
    `model` is None): {'norm_type': 'rmsnorm', ...}. Train-side settings are left out."""
    flat = flatten({"model": ModelConfig.model_construct().model_dump(mode="json") | dict(model or {})})
    out: dict[str, Any] = {}
    for name in names:
        out |= BY_NAME[name].settings(on, flat)
    return {k.removeprefix("model."): v for k, v in out.items() if k.startswith("model.")}


# ------------------------------------------------------------------------------ roles in a design


PART_TABLES = ("model.part_options", "model.part_code")  # ModelConfig's tables by part name


def settings_key(flat: dict, design: tuple[Component, ...]) -> str:
    """JSON of the flattened config minus name, seed, kept checkpoints and every setting the study's components
    switch; the options and code of a part a component switches to travel with it (a run with relu2 on records them,
    the reference without it none), so they are left out too, as is an empty table of them."""
    switched = {k for c in design for k in c.keys}
    named = {v for c in design for v in [*c.on.values(), *(c.off or {}).values()] if isinstance(v, str)}

    def part_of(key: str) -> str | None:
        table = next((t for t in PART_TABLES if key == t or key.startswith(t + ".")), None)
        return None if table is None else key.removeprefix(table).lstrip(".").split(".")[0]

    # train.keep_checkpoints: a budget ladder's stable run keeps checkpoints its decays branch from; it never
    # moves a result, so it never tells two groups apart
    kept = {k: v for k, v in flat.items() if k not in switched and k not in ("name", "seed", "train.keep_checkpoints")
            and not (part_of(k) is not None and (part_of(k) in named or (part_of(k) == "" and v is None)))}
    return json.dumps(kept, sort_keys=True, default=str)


def role(states: dict[str, bool | None], names: list[str]) -> str:
    """'reference' | 'all-on' | '+f' (add-one) | '-f' (remove-one); '' for any other mix or a
    component the run's config cannot place (neither its on nor its off settings)."""
    if any(v is None for v in states.values()):
        return ""
    on = [n for n in names if states[n]]
    if not on:
        return REFERENCE
    if len(on) == 1:  # before all-on: with one component, its add-one run is also the all-on end
        return variant(on[0], ADD_ONE)
    if len(on) == len(names):
        return ALL_ON
    if len(on) == len(names) - 1:
        return variant(next(n for n in names if n not in on), REMOVE_ONE)
    return ""


def group_names(keys: Iterable[str], sizes: Iterable[str] | None = None) -> dict[str, str]:
    """'n_layer=12, train.lr=0.001' per group key ('study|settings_key'): only the settings (and studies)
    that differ between groups. When every group has a size, the size's name says the settings only
    sizes vary: 'size M, train.lr=0.001'."""
    keys = list(keys)
    parsed = {s: {"study": s.split("|", 1)[0], **json.loads(s.split("|", 1)[1])} for s in dict.fromkeys(keys)}
    fields = sorted(set().union(*parsed.values())) if parsed else []
    varying = [k for k in fields if len({json.dumps(p.get(k)) for p in parsed.values()}) > 1]
    if "data.tokenizer" in varying:  # the vocabulary is the tokenizer's: naming both says one thing twice
        varying = [k for k in varying if k != "model.vocab_size"]
    size_of = dict(zip(keys, sizes)) if sizes is not None else {}
    if parsed and all(size_of.get(s) for s in parsed):  # keep what varies within a size, not only across
        values = {(k, size_of[s], json.dumps(p.get(k))) for s, p in parsed.items() for k in varying}
        varying = [k for k in varying if len({n for key, n, _ in values if key == k})
                   < len([1 for key, _, _ in values if key == k])]
    return {s: ", ".join(([f"size {size_of[s]}"] if size_of.get(s) else [])
                         + [f"{k.removeprefix('model.')}={p.get(k)}" for k in varying if k in p])  # absent: a
            for s, p in parsed.items()}  # tuned study's runs leave train.lr out (each config has its own)

"""The parts registry: what each slot of the block can hold, by name, as data (no torch import).

A part fills one slot of the model as the block already calls it (model/parts.py states each
slot's signatures); the slot's ModelConfig field names the part:

    slot       field       what it is                      anatomy's own
    mixer      attn_type   token mixer (attention)          softmax, mla (the block's own kinds)
    ffn        ffn_type    channel mixer (FFN)              gelu, swiglu, silu
    norm       norm_type   every norm of the block          layernorm, rmsnorm, none
    positions  pos_type    where a token is                 learned, rope, nope

A Part is a name, its slot, the code that builds it (the class itself, or "module:attr", so this
module imports no torch), its typed options (a pydantic model; a spec sets them as
[model.part_options.NAME] keys, --set model.part_options.NAME.KEY=V) and its parameter count as a formula of the
config and the options, which ModelConfig's counts sum and the battery (exams/parts_check.py)
compares with the module's. anatomy's own FFNs, norms and positions are declared below (BUILTIN)
as the same records, built by the same code (model/parts.build); a plugin adds its own with the
`part` decorator, in a file a spec lists (`plugins = ["examples/parts/relu2.py"]`, `--plugin FILE`:
load_plugins) or in an installed package's entry point of the group `anatomy.parts`
(load_entry_points). A plugin part is identified by its name and by the sha256 of the file that
declares it: ModelConfig records it (part_code), so it enters the run id, and a build with other
code than recorded is refused in one line (model/parts.build).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import re
import sys
import traceback
import types
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from anatomy_cli.spec.errors import InputError

ENTRY_POINTS = "anatomy.parts"  # the entry-point group installed packages declare their parts in
NAME = re.compile(r"^[a-z][a-z0-9_]{0,31}$")  # a part's name is also its component's (config.COMPONENT_NAME)


class PartError(InputError):
    """A plugin or part that cannot be used: one line naming the file, part or key at fault."""


@dataclass(frozen=True)
class Slot:
    """A place in the model a part can fill: the ModelConfig field that names its part, and the values of
    that field anatomy handles itself outside the registry (the mixer kinds of ModelConfig.layer_kinds)."""

    name: str
    field: str
    about: str
    own: tuple[str, ...] = ()


SLOTS: dict[str, Slot] = {s.name: s for s in (
    Slot("mixer", "attn_type", "token mixer: forward(x, pos, end, rotate, cache=None, layer=0) -> x's shape, "
         "new_state(batch, max_len, device, dtype) unless cache=False", ("softmax", "mla")),
    Slot("ffn", "ffn_type", "channel mixer: forward(x, stats=None) -> x's shape"),
    Slot("norm", "norm_type", "every norm of the block (and the final one): forward(x) -> x's shape"),
    Slot("positions", "pos_type", "embed(x, pos, end) -> x's shape, rotate(q, k, pos, end, start=None) -> (q, k)"),
)}
SLOT_OF_FIELD: dict[str, str] = {s.field: s.name for s in SLOTS.values()}


class Options(BaseModel):
    """The base of a part's options: frozen, unknown keys refused, no inf/nan (as every spec section)."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


Formula = Callable[..., Any]


@dataclass(frozen=True)
class Part:
    """One part a slot can hold (see the module docstring). Formulas take (cfg: ModelConfig, opts), opts
    the validated options (None for a part without options):

      params        parameters of one instance: one layer's mixer, one FFN, one norm of width d_model,
                    the positions module                                        (required)
      active        ffn: parameters one token uses (default: params)
      state_bytes   mixer: (cfg, opts, batch, max_len, bytes_per_elem) -> decode-state bytes of one layer
                    (default: softmax attention's K and V, 2 B n_kv_head max_len head_dim bytes; 0 with
                    cache=False)
      flops         mixer: training FLOPs per token beyond its matmuls (default attention's 6 ctx_len d)
      max_positions positions: the longest sequence it has positions for (default None: unbounded)

    cache: a mixer keeps a decode state (new_state); False declares it has none, and decoding runs the
    full forward over the window instead. stack: None where its forward can be vmapped (stacked seeds,
    training/stacked.py), else why not. hf: how its parameters map onto a Hugging Face Llama layer's
    ({its parameter name: the Llama layer's, e.g. "w1.weight": "mlp.gate_proj.weight"}): a part that
    declares one exports as the Llama part of its slot; without one, `export` refuses it by name.
    """

    name: str
    slot: str
    build: Any  # the class (or factory) itself, or "module:attr"; called (cfg) or, with options, (cfg, opts)
    params: Formula
    about: str = ""
    source: str = ""
    options: type[BaseModel] | None = None
    active: Formula | None = None
    cache: bool = True
    state_bytes: Formula | None = None
    flops: Formula | None = None
    max_positions: Formula | None = None
    stack: str | None = None
    hf: Mapping[str, str] | None = None
    origin: str = "built-in"  # the plugin file (or entry point) that declared it
    sha256: str | None = None  # of that file: None for anatomy's own parts (versioned with anatomy)

    @property
    def plugin(self) -> bool:
        return self.sha256 is not None

    def where(self) -> str:
        """'relu2 (ffn, from /x/my_parts.py)'."""
        return f"{self.name} ({self.slot}, from {self.origin})"


@dataclass
class Plugin:
    """A plugin file as loaded: its path, content and the parts it declared."""

    path: str
    sha256: str
    text: str
    parts: list[str] = field(default_factory=list)


REGISTRY: dict[str, Part] = {}
LOADED: dict[str, Plugin] = {}  # resolved path -> the plugin loaded from it
RESERVED: dict[str, str] = {}  # name -> what has it (components.py adds the built-in component names)
WARNINGS: list[str] = []  # entry points that failed to load, one line each (the CLI shows them)
_CONTEXT: list[dict] = []  # the plugin being loaded (origin, sha256), innermost last
_ENTRY_POINTS_READ: list[bool] = []


def reserve(names: Iterable[str], what: str) -> None:
    """Names no part may take: `what` has them (a built-in component)."""
    for name in names:
        RESERVED.setdefault(name, what)


def sha256_text(text: str | bytes) -> str:
    return hashlib.sha256(text.encode() if isinstance(text, str) else text).hexdigest()


def register(part_: Part) -> Part:
    """Add a part, refusing in one line what cannot be one. A part declared again by the same file with the
    same code (a plugin loaded twice) replaces itself."""
    if part_.slot not in SLOTS:
        raise PartError(f"part {part_.name!r} ({part_.origin}): slot {part_.slot!r} does not exist; the slots are "
                        f"{', '.join(SLOTS)}")
    if not isinstance(part_.name, str) or not NAME.match(part_.name):
        raise PartError(f"part {part_.name!r} ({part_.origin}): a name is lower-case letters, digits and _ "
                        f"(<= 32, starting with a letter)")
    own = {v: f"anatomy's own {s.name}" for s in SLOTS.values() for v in s.own}
    taken = RESERVED.get(part_.name) or own.get(part_.name)
    old = REGISTRY.get(part_.name)
    if taken or (old is not None and not old.plugin and part_.plugin):
        raise PartError(f"part {part_.name!r} ({part_.origin}) shadows {taken or 'a built-in part'} of that name; "
                        f"choose another name")
    if old is not None and (old.origin, old.sha256) != (part_.origin, part_.sha256) and old.sha256 != part_.sha256:
        raise PartError(f"two parts named {part_.name!r}: {old.origin} and {part_.origin}; rename one")
    if not callable(part_.params):
        raise PartError(f"part {part_.name!r} ({part_.origin}): params must be a formula (cfg, opts) -> int")
    if part_.options is not None and not (isinstance(part_.options, type) and issubclass(part_.options, BaseModel)):
        raise PartError(f"part {part_.name!r} ({part_.origin}): options must be a pydantic model (subclass Options)")
    REGISTRY[part_.name] = part_
    return part_


def part(name: str, *, slot: str, params: Formula, about: str = "", source: str = "",
         options: type[BaseModel] | None = None, active: Formula | None = None, cache: bool = True,
         state_bytes: Formula | None = None, flops: Formula | None = None, max_positions: Formula | None = None,
         stack: str | None = None, hf: Mapping[str, str] | None = None) -> Callable[[Any], Any]:
    """The registration: `@part("relu2", slot="ffn", params=lambda cfg, o: 8 * cfg.d_model ** 2)` on a class
    (or a factory) registers it under `name` (see Part for each argument) and returns it unchanged."""
    def register_class(cls):
        origin, sha = _origin(cls)
        if _CONTEXT and name in _CONTEXT[-1]["parts"]:
            raise PartError(f"two parts named {name!r} in {origin}; rename one")
        register(Part(name, slot, cls, params, about, source, options, active, cache, state_bytes, flops,
                      max_positions, stack, dict(hf) if hf is not None else None, origin, sha))
        if _CONTEXT:
            _CONTEXT[-1]["parts"].append(name)
        return cls
    return register_class


def _origin(cls) -> tuple[str, str | None]:
    """(origin, sha256) of a class being registered: the plugin being loaded, else the file that defines it."""
    if _CONTEXT and _CONTEXT[-1]["sha256"] is not None:
        return _CONTEXT[-1]["origin"], _CONTEXT[-1]["sha256"]
    module = sys.modules.get(getattr(cls, "__module__", ""), None)
    path = getattr(module, "__file__", None)
    sha = sha256_text(Path(path).read_bytes()) if path and Path(path).is_file() else sha256_text(repr(cls))
    origin = _CONTEXT[-1]["origin"] if _CONTEXT else (path or getattr(cls, "__module__", "?"))
    return origin, sha


# ------------------------------------------------------------------------------ lookups


def find(slot: str, name: str) -> Part | None:
    """The registered part `name` of `slot` (an installed package's, loaded on the first miss)."""
    got = REGISTRY.get(name)
    if got is None and name not in SLOTS[slot].own:
        load_entry_points()
        got = REGISTRY.get(name)
    return got if got is not None and got.slot == slot else None


def names(slot: str) -> tuple[str, ...]:
    """Every value the slot's field takes: anatomy's own, then the registered parts, in order."""
    return SLOTS[slot].own + tuple(n for n, p in REGISTRY.items() if p.slot == slot)


def plugin_parts() -> list[Part]:
    """The parts plugins declared (files and installed packages), in registration order."""
    load_entry_points()
    return [p for p in REGISTRY.values() if p.plugin]


def check_name(slot: str, value: str) -> str:
    """A slot field's value, or ValueError naming the choices (and how a plugin's part gets loaded)."""
    if value in SLOTS[slot].own or find(slot, value) is not None:
        return value
    other = REGISTRY.get(value)
    where = f"; {value!r} is a {other.slot} part" if other is not None else (
        "; a plugin's part needs its file loaded (plugins = [\"FILE\"] in the spec, or --plugin FILE)")
    raise ValueError(f"{SLOTS[slot].field}={value!r} is no {slot} part: choose "
                     f"{', '.join(map(repr, names(slot)))}{where}")


def used(model: Mapping[str, Any], defaults: Mapping[str, Any]) -> dict[str, Part]:
    """{name: Part} of the registered parts a model config (a dict, fields as given over `defaults`) uses."""
    out = {}
    for fld, slot in SLOT_OF_FIELD.items():
        value = model.get(fld, defaults.get(fld))
        if isinstance(value, str):
            got = find(slot, value)
            if got is not None:
                out[value] = got
    return out


def options(part_: Part, given: Mapping[str, Any] | None, where: str = "") -> BaseModel | None:
    """The part's options validated from `given` as strictly as any spec key (None: it has none).
    PartError 'part_options.relu2.hidden: Input should be a valid integer, got 1.5'."""
    if part_.options is None:
        if given:
            raise PartError(f"{where}part_options.{part_.name}: {part_.where()} takes no options")
        return None
    try:
        return part_.options.model_validate(dict(given or {}), strict=True)
    except ValidationError as err:
        e = err.errors()[0]
        key = ".".join(str(p) for p in e["loc"])
        text = "unknown key" if e["type"] == "extra_forbidden" else e["msg"].removeprefix("Value error, ")
        given_value = e.get("input")
        if e["type"].endswith("_type") and isinstance(given_value, (bool, int, float, str)):
            text += f", got {given_value!r}"
        raise PartError(f"{where}part_options.{part_.name}.{key}: {text}") from None


def resolve(build: Any) -> Any:
    """A part's build: the object itself, or the attribute a "module:attr" path names (imported now)."""
    if not isinstance(build, str):
        return build
    module, _, attr = build.partition(":")
    return getattr(importlib.import_module(module), attr)


# ------------------------------------------------------------------------------ loading plugins


@contextlib.contextmanager
def _loading(origin: str, sha: str | None):
    ctx = {"origin": origin, "sha256": sha, "parts": []}
    _CONTEXT.append(ctx)
    try:
        yield ctx
    finally:
        _CONTEXT.pop()


def last_line(err: BaseException) -> str:
    """An exception as the last line of its traceback ('NameError: name 'x' is not defined'); a syntax
    error with its line."""
    if isinstance(err, SyntaxError):
        return f"{err.__class__.__name__}: {err.msg} (line {err.lineno})"
    return " ".join(traceback.format_exception_only(err)[-1].split())


def load_source(path: str, text: str) -> Plugin:
    """Run a plugin's source as the module of `path` and register its parts (what the file at `path`
    holds, or held when a run was planned: a worker loads the shipped text). A plugin declared again
    with other content first drops the parts its old content declared. PartError, one line, for a
    plugin that does not run or declares no part; its parts are then all left out."""
    sha = sha256_text(text)
    old = LOADED.get(path)
    if old is not None and old.sha256 == sha:
        return old
    for name in old.parts if old is not None else ():
        REGISTRY.pop(name, None)
    module = types.ModuleType(f"anatomy_plugin_{re.sub(r'[^A-Za-z0-9_]', '_', Path(path).stem)}_{sha[:12]}")
    module.__file__ = path
    sys.modules[module.__name__] = module  # classes pickle by reference to it (spawned workers rebuild it)
    with _loading(path, sha) as ctx:
        try:
            exec(compile(text, path, "exec"), module.__dict__)  # noqa: S102 - the user's own plugin file
        except PartError:  # a registration refused (two parts of a name, a slot that does not exist): it names
            _drop(ctx["parts"], module)  # the file, as the part's origin
            raise
        except Exception as err:  # noqa: BLE001 - any error of the plugin's own code: its last line
            _drop(ctx["parts"], module)
            raise PartError(f"plugin {path} does not import: {last_line(err)}") from None
    if not ctx["parts"]:
        _drop((), module)
        raise PartError(f"plugin {path} declares no part (decorate a class with "
                        f"@part(NAME, slot=..., params=...) from anatomy_cli.model.parts)")
    LOADED[path] = Plugin(path, sha, text, list(ctx["parts"]))
    return LOADED[path]


def _drop(names: Iterable[str], module: types.ModuleType) -> None:
    for name in names:
        REGISTRY.pop(name, None)
    sys.modules.pop(module.__name__, None)


def plugin_path(path: str | Path, base: Path | None = None) -> str:
    """A plugin's path as configs record it: absolute, a relative one against `base` (a spec's folder) when
    the file is there, else against the working folder."""
    p = Path(path).expanduser()
    if not p.is_absolute() and base is not None and (base / p).exists():
        p = base / p
    return str(p.resolve())


def load_plugins(paths: Iterable[str | Path], fresh: bool = True) -> list[Plugin]:
    """Load plugin files (each read now: an edited file replaces its parts); fresh=False keeps a path
    already loaded as it was (a worker keeps the code its run was planned with)."""
    out = []
    for raw in paths:
        path = plugin_path(raw)
        if not fresh and path in LOADED:
            out.append(LOADED[path])
            continue
        try:
            data = Path(path).read_bytes()
        except FileNotFoundError:
            raise PartError(f"plugin not found: {raw}") from None
        except IsADirectoryError:
            raise PartError(f"plugin is a directory, not a Python file: {raw}") from None
        try:
            text = data.decode("utf-8-sig")
        except UnicodeDecodeError:
            raise PartError(f"plugin is not UTF-8 text: {raw}") from None
        out.append(load_source(path, text))
    return out


def load_for(paths: Iterable[str], model: Mapping[str, Any] | None) -> None:
    """The plugins a run config lists, loaded for validating it, when its model needs them: nothing when
    every part it names is registered already with the code it records (a worker's shipped code, --plugin
    given the file a run trained with); else each listed file not loaded yet. A file that is not there (a
    worker on another machine, a run whose file moved) is refused only while a part the model names is
    still unknown. A spec's plugins are loaded before it is validated (config.resolve_plugins), whatever
    its base uses, so a study's table has their parts."""
    if _resolvable(model or {}):
        return
    missing = []
    for path in paths:
        if Path(path).is_file():
            load_plugins([path], fresh=False)
        else:
            missing.append(path)
    if missing and not _known(model or {}):
        raise PartError(f"plugin not found: {missing[0]} (its parts are not loaded; give the file with --plugin "
                        f"FILE)")


def _wanted(model: Mapping[str, Any]) -> list[str]:
    """The part names a model config (a dict) uses or gives options to."""
    wanted = [model.get(f) for f in SLOT_OF_FIELD if isinstance(model.get(f), str)]
    options = model.get("part_options")
    return wanted + (list(options) if isinstance(options, dict) else [])


def _known(model: Mapping[str, Any]) -> bool:
    own = {v for s in SLOTS.values() for v in s.own}
    return all(name in own or name in REGISTRY for name in _wanted(model))


def _resolvable(model: Mapping[str, Any]) -> bool:
    """Every part the model names is known, each plugin one with the code the config records (if it does)."""
    code = model.get("part_code") if isinstance(model.get("part_code"), dict) else {}
    return _known(model) and all(REGISTRY[n].sha256 == sha for n, sha in code.items() if n in REGISTRY)


def preload(sources: Mapping[str, str]) -> None:
    """Register shipped plugin sources ({path: text}, sources() of the planning process) before a run's
    config is validated, so a worker builds exactly the code its run was planned with."""
    for path, text in sources.items():
        load_source(path, text)


def sources(paths: Iterable[str]) -> dict[str, str]:
    """{path: text} of loaded plugins, as a job ships them (a path not loaded is left out)."""
    return {p: LOADED[p].text for p in paths if p in LOADED}


def load_entry_points() -> list[str]:
    """Load the parts installed packages declare (entry-point group `anatomy.parts`), once per process.
    An entry point that fails to load is left out with one warning line (WARNINGS); the others still
    load. Returns the warnings."""
    if _ENTRY_POINTS_READ:
        return WARNINGS
    _ENTRY_POINTS_READ.append(True)
    from importlib.metadata import entry_points

    for ep in entry_points(group=ENTRY_POINTS):
        with _loading(f"entry point {ep.name} ({ep.value})", None) as ctx:
            try:
                ep.load()
            except Exception as err:  # noqa: BLE001 - one warning, the other plugins go on
                for name in ctx["parts"]:
                    REGISTRY.pop(name, None)
                WARNINGS.append(f"entry point {ep.name} ({ep.value}) of {ENTRY_POINTS} does not load: "
                                f"{last_line(err)}; its parts are left out")
    return WARNINGS


def reread_entry_points() -> list[str]:
    """Read the entry points again (after installing a package in this process; tests)."""
    _ENTRY_POINTS_READ.clear()
    WARNINGS.clear()
    return load_entry_points()


# ------------------------------------------------------------------------------ anatomy's own parts
# Declared through the same records a plugin's decorator makes, built by the same model/parts.build.
# Their formulas read ModelConfig's sizes (ffn_hidden: the hidden size rule of each FFN).

def _dense(cfg, opts) -> int:
    return cfg.dense_ffn_params(cfg.ffn_hidden)


BUILTIN: tuple[Part, ...] = (
    Part("gelu", "ffn", "anatomy_cli.model.ffn:GeluMLP", _dense, "GELU MLP, hidden 4d",
         "Vaswani et al. 2017 (ReLU); GPT-2 (GELU, Hendrycks & Gimpel 2016)"),
    Part("swiglu", "ffn", "anatomy_cli.model.ffn:SwiGLU", _dense, "SwiGLU, hidden 2/3 of 4d rounded up to 32",
         "Shazeer 2020; LLaMA", hf={"gate.weight": "mlp.gate_proj.weight", "up.weight": "mlp.up_proj.weight",
                                   "down.weight": "mlp.down_proj.weight"}),
    Part("silu", "ffn", "anatomy_cli.model.ffn:SiLUMLP", _dense,
         "SiLU MLP (two matrices, no gate), hidden 3/2 of SwiGLU's: SwiGLU's parameters exactly",
         "Elfwing et al. 2018; CS336 (2025) assignment 1, swiglu_ablation"),
    Part("layernorm", "norm", "anatomy_cli.model.norms:layer_norm", lambda cfg, o: 2 * cfg.d_model,
         "LayerNorm: centre and scale, weight and bias", "Ba et al. 2016"),
    Part("rmsnorm", "norm", "anatomy_cli.model.norms:rms_norm", lambda cfg, o: cfg.d_model,
         "RMSNorm: scale only", "Zhang & Sennrich 2019; LLaMA", hf={"weight": "weight"}),
    Part("none", "norm", "anatomy_cli.model.norms:NoNorm", lambda cfg, o: 0,
         "no norm: every norm of the block, and the final one, an identity",
         "CS336 (2025) assignment 1, layer_norm_ablation"),
    Part("learned", "positions", "anatomy_cli.model.positions:LearnedPositions",
         lambda cfg, o: cfg.ctx_len * cfg.d_model,
         "a learned table of ctx_len positions added to the embeddings", "Vaswani et al. 2017; GPT-2",
         max_positions=lambda cfg, o: cfg.ctx_len),
    Part("rope", "positions", "anatomy_cli.model.positions:RoPE", lambda cfg, o: 0,
         "rotary positions on Q and K (half-split pairing)", "Su et al. 2021; LLaMA"),
    Part("nope", "positions", "anatomy_cli.model.positions:NoPositions", lambda cfg, o: 0,
         "no positions: the causal mask alone", "Kazemnejad et al. 2023"),
)
for _p in BUILTIN:
    register(_p)

"""A study's knobs, spelled once (no torch): every setting of `anatomy ablate` that is not a mode or where to
run is a key of the study spec (AblationSpec), set over the spec file with `--set KEY=VALUE`, and the older
flags are aliases read from one table, ALIASES. The report's advice ("add seeds with ...") is written from
the same table, so a flag, its key and the command the report prints never disagree.

  Alias / ALIASES   flag -> spec key, and how the flag's text becomes the key's value
  Setting           one setting as the user gave it: key, value, and how it was typed (for messages)
  parse_set         `--set KEY=VALUE` text -> a Setting, its key and value's type checked
  from_alias        an alias flag and its text -> a Setting
  apply_settings    the settings laid over a spec's data (a table switched on with true, off with false)
  study_keys        every dotted key `--set` reaches on ablate (the layout of AblationSpec)
  command_args      settings back into command-line words, each by its alias where it has one

Tables. `decide` and `tune` are tables whose presence turns a mode on (rounds, fair learning rates):
`--set decide=false` drops the spec's table, `--set decide=true` adds one at its defaults, and setting
one of its keys (`--set decide.max_seeds=6`, or `--max-seeds 6`) adds it too. The mode flags --decide
and --tune-lr are `decide=true` and `tune=true`.
"""

from __future__ import annotations

import difflib
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError

from anatomy_cli.spec.config import (
    AblationSpec,
    ConfigError,
    RunConfig,
    describe_type,
    error_text,
    parse_value,
    set_dotted,
    setting_keys,
)

TABLES = ("decide", "tune")  # tables whose presence is a mode: true adds one at its defaults, false drops it


@dataclass(frozen=True)
class Alias:
    """An older flag of `ablate` that sets one spec key. kind: how its text becomes the value: "value" (a
    TOML scalar, else the text), "names" (comma-separated names), "seeds" (a count, or seeds 'A,B'; one
    seed: 'A,'), "on"/"off" (a flag: true/false), "append" (repeatable: files, each against the working
    folder, added to the key's list in the spec)."""

    flag: str
    key: str
    kind: str = "value"
    metavar: str = "VALUE"
    help: str = ""

    @property
    def is_flag(self) -> bool:
        return self.kind in ("on", "off")


ALIASES: tuple[Alias, ...] = (
    Alias("--flip", "only", "names", "NAMES", "Only these components get runs of their own, e.g. rope,swiglu."),
    Alias("--seeds", "seeds", metavar="N", help="Seeds per config (a count from base.seed up)."),
    Alias("--steps", "base.train.steps", metavar="N", help="Training steps per run."),
    Alias("--device", "base.train.device", metavar="NAME", help="auto | cpu | cuda | mps."),
    Alias("--compile", "base.train.compile", "on", "", "torch.compile every run."),
    Alias("--dtype", "base.train.dtype", metavar="NAME", help="float32 | bfloat16 (autocast)."),
    Alias("--margin", "margin", metavar="X", help="The smallest gain in best val loss that matters (bits per "
          "byte), fixed before the data (default 0.02)."),
    Alias("--min-effect", "margin", metavar="X", help="The older name of --margin."),
    Alias("--max-seeds", "decide.max_seeds", metavar="N", help="Rounds: the most seeds a config gets (default 10)."),
    Alias("--decide-step", "decide.step", metavar="N", help="Rounds: seeds added a round (default 2)."),
    Alias("--budget", "decide.budget", metavar="TIME", help="Rounds: stop before a round that would overrun this "
          "time (30m, 2h, 600 = seconds)."),
    Alias("--tune-points", "tune.points", metavar="N", help="Fair LRs: LRs in the grid, odd (default 5)."),
    Alias("--tune-factor", "tune.factor", metavar="X", help="Fair LRs: the ratio of neighbouring LRs (default 2)."),
    Alias("--tune-extend", "tune.extend", metavar="N", help="Fair LRs: LRs added past the grid's edge (default 2)."),
    Alias("--tune-seeds", "tune.seeds", "seeds", "SEEDS", "Fair LRs: selection seeds, a count (just below "
          "base.seed) or a list such as 7,9 (default 1)."),
    Alias("--tune-shared", "tune.shared", "on", "", "Fair LRs: also train the study's seeds at train.lr where an "
          "LR moved (the default)."),
    Alias("--no-tune-shared", "tune.shared", "off", "", "Fair LRs: no shared-LR runs (cheaper; no LR-confounding "
          "check)."),
    Alias("--plugin", "base.plugins", "append", "FILE", "A Python file of parts (@part from "
          "anatomy_cli.model.parts), added to the spec's base.plugins; repeatable."),
    Alias("--time-steps", "timing.steps", metavar="N", help="--time: timed steps per config and round (default 20)."),
    Alias("--time-rounds", "timing.rounds", metavar="N", help="--time: rounds, at least 3 (default 5)."),
)
BY_FLAG = {a.flag: a for a in ALIASES}


@dataclass(frozen=True)
class Setting:
    """One study setting as given: its dotted key, its value, and how the user typed it ('--seeds 3',
    '--set seeds=3', '--decide'), which every message about it names."""

    key: str
    value: Any
    typed: str
    extend: bool = False  # the value is added to the spec's list at `key` (--plugin), not put in its place

    @property
    def option(self) -> str:
        """The option as a message names it: '--seeds', '--set seeds', '--decide' (the value left out)."""
        head = self.typed.split("=")[0] if self.typed.startswith("--set ") else self.typed.split(" ")[0]
        return head or self.key

    @property
    def table(self) -> str | None:
        """The mode table this setting turns on or off ('decide', 'tune'), if it is one or inside one."""
        head = self.key.partition(".")[0]
        return head if head in TABLES else None


def _model_of(annotation: Any) -> type[BaseModel] | None:
    """The model class an annotation holds (`DecideSpec`, `DecideSpec | None`), else None."""
    options = get_args(annotation) if get_origin(annotation) in (Union, types.UnionType) else (annotation,)
    return next((a for a in options if isinstance(a, type) and issubclass(a, BaseModel)), None)


def _leaf(key: str) -> Any:
    """The FieldInfo of the AblationSpec field `key` names (a dotted path through nested models), or None
    for a key inside a free-form table (components, axes, sizes, configs: their own validation names it);
    raises KeyError for a key that names no field."""
    node: type[BaseModel] = AblationSpec
    parts = key.split(".")
    for i, part in enumerate(parts):
        if part not in node.model_fields:
            raise KeyError(key)
        info = node.model_fields[part]
        annotation = info.annotation
        if i == len(parts) - 1:
            return info
        model = _model_of(annotation)
        if model is None:
            if get_origin(annotation) in (dict, list):  # components.x.on, axes.n_layer: checked by the spec
                return None
            raise KeyError(key)
        node = model
    return None


def study_keys() -> list[str]:
    """Every dotted key `--set` reaches on ablate: each field of AblationSpec, its tables' fields, and every
    run setting under base (base.model.d_model, ...)."""
    keys = []
    for name, info in AblationSpec.model_fields.items():
        if name == "base":
            keys += [f"base.{k}" for k in setting_keys()]
            continue
        keys.append(name)
        table = _model_of(info.annotation)
        keys += [f"{name}.{f}" for f in table.model_fields] if table is not None else []
    return keys


def parse_set(text: str) -> Setting:
    """`--set KEY=VALUE` (VALUE a TOML value, else the text) as a Setting, KEY and VALUE checked."""
    key, eq, raw = text.partition("=")
    key, raw = key.strip(), raw.strip()
    if not eq or not key:
        raise ConfigError(f"--set expects key=value (e.g. seeds=3 or base.train.steps=300), got {text!r}")
    if key.count(".") > 8:  # no spec is this deep; set_dotted would recurse until Python gives up
        raise ConfigError(f"--set key {key[:60]!r}... is nested deeper than any spec section")
    return checked(Setting(key, parse_value(raw), f"--set {key}={raw}"), raw)


def from_alias(flag: str, text: Any) -> Setting:
    """An alias flag as given (its text; True for a flag; a list for a repeatable one) -> its Setting."""
    alias = BY_FLAG[flag]
    if alias.kind in ("on", "off"):
        return checked(Setting(alias.key, alias.kind == "on", flag), "")
    if alias.kind == "names":
        names = [n.strip() for n in str(text).split(",") if n.strip()]
        if not names:
            raise ConfigError(f"{flag} expects component names, e.g. rope,swiglu, got {text!r}")
        return checked(Setting(alias.key, list(dict.fromkeys(names)), f"{flag} {text}"), str(text))
    if alias.kind == "seeds":
        return checked(Setting(alias.key, _seeds(flag, str(text)), f"{flag} {text}"), str(text))
    if alias.kind == "append":  # files named on the command line: against the working folder, not the spec's
        files = [str(Path(t).absolute()) for t in text]
        return checked(Setting(alias.key, files, " ".join(f"{flag} {t}" for t in text), extend=True), str(text))
    return checked(Setting(alias.key, parse_value(str(text).strip()), f"{flag} {text}"), str(text))


def read_args(tokens: list[str]) -> tuple[list[str], list[Setting]]:
    """The arguments and alias flags of a command line, in order (what click left: ctx.args) -> (the positional
    arguments, the settings the aliases give). '--seeds 3' and '--seeds=3' alike; a flag takes no value; a
    repeatable one gathers its values. An unknown option is refused with the closest alias or option named."""
    args, settings, gathered, i = [], [], {}, 0
    while i < len(tokens):
        token = tokens[i]
        i += 1
        if not token.startswith("--") or token == "--":
            args.append(token)
            continue
        flag, eq, text = token.partition("=")
        alias = BY_FLAG.get(flag)
        if alias is None:
            close = difflib.get_close_matches(flag, [*BY_FLAG, *OTHER_OPTIONS], n=1)
            raise ConfigError(f"no such option: {flag}" + (f" (did you mean {close[0]}?)" if close else ""))
        if alias.is_flag:
            if eq:
                raise ConfigError(f"{flag} is a flag and takes no value, got {token!r}")
            settings.append(from_alias(flag, True))
            continue
        if not eq:
            if i >= len(tokens):
                raise ConfigError(f"{flag} needs a value ({alias.metavar})")
            text, i = tokens[i], i + 1
        if alias.kind == "append":
            gathered.setdefault(flag, []).append(text)
        else:
            settings.append(from_alias(flag, text))
    return args, settings + [from_alias(flag, values) for flag, values in gathered.items()]


# The options of `ablate` itself (a typo of one gets its name back too).
OTHER_OPTIONS = ("--set", "--dry-run", "--json", "--time", "--decide", "--tune-lr", "--runs-dir", "--workers",
                 "--executor", "--address", "--stack", "--no-report", "--help")


def alias_help() -> str:
    """The aliases as --help lists them: '--seeds N (seeds): Seeds per config ...', one per line."""
    return "\n".join(f"{a.flag}{' ' + a.metavar if a.metavar else ''} = {a.key}{' (true)' if a.kind == 'on' else ''}"
                     f"{' (false)' if a.kind == 'off' else ''}: {a.help}" for a in ALIASES)


def _seeds(flag: str, text: str) -> int | list[int]:
    """'3' -> 3 (a count); '7,9' -> [7, 9]; '7,' -> [7] (one seed)."""
    parts = [t.strip() for t in text.split(",")]
    parts = parts[:-1] if len(parts) == 2 and not parts[1] else parts
    try:
        numbers = [int(t) for t in parts]
    except ValueError:
        raise ConfigError(f"{flag} takes a count or a comma-separated list of seeds (one seed: '7,'), got "
                          f"{text!r}") from None
    return numbers if "," in text else numbers[0]


def checked(setting: Setting, raw: str) -> Setting:
    """The setting, its key a field of the study spec and its value of the field's type (strictly, as a
    spec file is read: true is not 1, "12" is not 12); bounds and cross-field checks stay with the spec's
    own validation. A mode table takes true (on, at its defaults) or false (off)."""
    key = setting.key
    if key in TABLES:
        if not isinstance(setting.value, bool):
            raise ConfigError(f"{setting.typed}: {key} is a table: true turns it on at its defaults, false off")
        return setting
    try:
        info = _leaf(key)
    except KeyError:
        close = difflib.get_close_matches(key, study_keys(), n=1)
        hint = f"; did you mean {close[0]}?" if close else " (see `anatomy ablate --help` for the study's keys)"
        raise ConfigError(f"{setting.option}: unknown key{hint}") from None
    if info is not None and key not in ("base", "components", "axes", "sizes", "configs"):
        bounded = Annotated[(info.annotation, *info.metadata)] if info.metadata else info.annotation
        adapter = TypeAdapter(bounded, config=ConfigDict(strict=True, allow_inf_nan=False))
        try:
            adapter.validate_python(setting.value)
        except ValidationError as err:  # a bound the value breaks, else (of a union: every member) its type
            bounds = [e for e in err.errors() if "_type" not in e["type"]]
            if not bounds:
                shown = raw if raw else repr(setting.value)
                raise ConfigError(f"{setting.option}: expected {describe_type(info.annotation)}, got {shown}") from None
            raise ConfigError(f"{setting.option}: {error_text(bounds[0])}") from None
    return setting


def apply_settings(data: dict, settings: list[Setting]) -> dict:
    """`data` (a spec file's TOML, or a validated spec dumped) with every setting laid over it, in order: a
    mode table set true is added at its defaults where absent, set false is dropped. A key inside a mode table
    the spec does not have (and no earlier setting turned on) is refused: `--max-seeds 6` on a spec without
    [decide] would silently turn rounds on, so the mode says so itself (--decide)."""
    for s in settings:
        table = s.table
        if table is not None and s.key != table and not isinstance(data.get(table), dict):
            raise ConfigError(f"{s.typed} sets the [{table}] table, which the spec does not have: add "
                              f"{MODE_FLAGS[table]} (or --set {table}=true) to turn it on")
        if s.key in TABLES:
            data = {**data, s.key: data.get(s.key) or {}} if s.value else {k: v for k, v in data.items()
                                                                           if k != s.key}
        elif s.extend:
            given = _dotted(data, s.key)
            data = set_dotted(data, s.key, [*(given if isinstance(given, list) else []), *s.value])
        else:  # a key set over an older name of it in the file (min_effect for margin) replaces it
            data = set_dotted({k: v for k, v in data.items() if k not in OLDER_NAMES.get(s.key, ())}, s.key, s.value)
    return data


def _dotted(data: dict, key: str) -> Any:
    """The value at a dotted key of nested `data`, or None where a section on the way is absent."""
    for part in key.split("."):
        data = data.get(part) if isinstance(data, dict) else None
    return data


def _older_names() -> dict[str, tuple[str, ...]]:
    """{spec key: the older names a spec file may still give it} (a field's validation_alias choices)."""
    out = {}
    for name, info in AblationSpec.model_fields.items():
        choices = getattr(info.validation_alias, "choices", ())
        out[name] = tuple(c for c in choices if isinstance(c, str) and c != name)
    return {k: v for k, v in out.items() if v}


OLDER_NAMES = _older_names()


def command_args(settings: list[Setting]) -> list[str]:
    """The settings as command-line words, each by its first alias where it has one ('--seeds', '6'), a
    mode table by its flag ('--decide', '--tune-lr') or '--set decide=false', else '--set KEY=VALUE'."""
    words: list[str] = []
    for s in settings:
        if s.key in TABLES:
            words += [MODE_FLAGS[s.key]] if s.value else ["--set", f"{s.key}=false"]
            continue
        alias = next((a for a in ALIASES if a.key == s.key and (not a.is_flag or (a.kind == "on") == s.value)), None)
        if alias is None:
            words += ["--set", f"{s.key}={_toml(s.value)}"]
        elif alias.is_flag:
            words.append(alias.flag)
        elif alias.kind == "append":
            words += [w for v in s.value for w in (alias.flag, str(v))]
        else:
            words += [alias.flag, _text(s.value, alias.kind)]
    return words


MODE_FLAGS = {"decide": "--decide", "tune": "--tune-lr"}


def _text(value: Any, kind: str) -> str:
    if isinstance(value, list):
        return ",".join(map(str, value)) + ("," if kind == "seeds" and len(value) == 1 else "")
    return f"{value:g}" if isinstance(value, float) else str(value)


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, str):
        return value if value and value.replace("_", "").replace("-", "").isalnum() else repr(value)
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def run_keys() -> set[str]:
    """The run settings a study spec's base holds (base.model.d_model, ...)."""
    return {f"base.{k}" for k in setting_keys()} | {f"base.{s}" for s in RunConfig.model_fields}

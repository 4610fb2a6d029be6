"""The map inside the rooms is true: every module or name of the package that a docstring or a comment
in src/anatomy_cli names exists, so a move or a rename cannot leave a stale reference behind.

A reference is `anatomy_cli.report.stats.judge`, `report.stats` / `report.gain_of` (a room and what it
holds), `stats.judge` (a module's stem and a name it defines: any module of that stem will do),
`report/stats.py`, or a bare `stats.py`, which must be a module of the room the text is in (another
room's module is written room/module.py). Not references: settings (`model.n_layer`), file names
(`sweep.json`), other libraries' names (`np.mean`, `tensorboard.summary`), a spec's tables and their
keys (`components.NAME`, `decide.budget`). The package is read from its source (ast for docstrings and
the names a module binds, tokenize for comments): nothing of it is imported but the spec's tables.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

import anatomy_cli
from anatomy_cli.spec.config import ComponentSpec, DecideSpec, SizeSpec

PKG = Path(anatomy_cli.__file__).parent
ROOT = PKG.parents[1]
ROOMS = sorted(p.name for p in PKG.iterdir() if (p / "__init__.py").is_file())
FILES = {".".join(p.relative_to(PKG).with_suffix("").parts): p for p in sorted(PKG.rglob("*.py"))}
MODULES = {name.removesuffix(".__init__").removesuffix("__init__"): p for name, p in FILES.items()}
BY_STEM: dict[str, list[str]] = {}  # 'stats' -> ['report.stats']; a room is its own stem
for _name in MODULES:
    if _name:
        BY_STEM.setdefault(_name.rpartition(".")[2], []).append(_name)
PLACEHOLDERS = ("NAME", "x")  # components.NAME, components.x.on: a spec's tables, as docs write them
TABLES = {"components": ComponentSpec, "decide": DecideSpec, "sizes": SizeSpec}  # decide.budget: a spec's key
LIBRARIES = ("tensorboard",)  # libraries named like a module of the package (training/tensorboard.py)
SETTINGS = ("model", "train", "data")  # config sections: model.n_layer is a setting, not a module
FILE_SUFFIXES = ("json", "toml", "md", "csv", "png", "txt", "html", "pt", "yaml", "yml", "log", "jsonl", "lock",
                 "bin", "safetensors", "npy", "tar", "gz", "pkl", "sh", "cfg", "ini", "zip")
# `anatomy_cli.x.y`, `x/y.py` or `x.py`, and `a.b(.c)` dotted words (not part of a longer dotted or path name)
DOTTED = re.compile(r"(?<![\w./-])((?:anatomy_cli\.)?[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+)(?![\w/-]|\.\w)")
PATH = re.compile(r"(?<![\w./-])((?:[A-Za-z_]\w*/)*[A-Za-z_]\w*\.py)\b")


def defined(path: Path) -> set[str]:
    """The names a module binds at its top level, and Class.member for the members of its classes."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out: set[str] = set()

    def bind(node: ast.AST, prefix: str = "") -> None:
        for n in getattr(node, "body", []):
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                out.add(prefix + n.name)
                if isinstance(n, ast.ClassDef) and not prefix:
                    bind(n, n.name + ".")
            elif isinstance(n, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                targets = n.targets if isinstance(n, ast.Assign) else [n.target]
                out.update(prefix + t.id for tg in targets for t in ast.walk(tg) if isinstance(t, ast.Name))
            elif isinstance(n, (ast.Import, ast.ImportFrom)):
                out.update(prefix + (a.asname or a.name).split(".")[0] for a in n.names)
            elif isinstance(n, (ast.If, ast.Try, ast.With)) and not prefix:
                bind(n)
                for h in getattr(n, "handlers", []) + [ast.Module(body=getattr(n, "orelse", []))]:
                    bind(h)
    bind(tree)
    return out


DEFINED = {name: defined(path) for name, path in MODULES.items()}


def texts(path: Path) -> list[tuple[int, str]]:
    """(first line, text) of every docstring (module, class, function) and comment of a source file."""
    source = path.read_text(encoding="utf-8")
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                    and isinstance(body[0].value.value, str):
                out.append((body[0].lineno, body[0].value.value))
    out += [(t.start[0], t.string) for t in tokenize.generate_tokens(io.StringIO(source).readline)
            if t.type == tokenize.COMMENT]
    return out


def resolves_module(module: str, rest: list[str]) -> bool:
    """Whether `rest` (attribute path) names something inside anatomy_cli.<module>."""
    if not rest:
        return True
    if f"{module}.{rest[0]}".lstrip(".") in MODULES:
        return resolves_module(f"{module}.{rest[0]}".lstrip("."), rest[1:])
    names = DEFINED[module]
    return ".".join(rest[:2]) in names or rest[0] in names


def problem(ref: str, room: str = "") -> str | None:
    """Why a dotted or path reference in a docstring or comment does not resolve, or None (it does, or
    it names nothing of the package's: numpy's np.x, a setting model.n_layer, a file sweep.json)."""
    if ref.endswith(".py"):
        parts = ref.removesuffix(".py").split("/")
        if parts[0] in ("src", "tests", "benchmarks", "docs", "examples", "scripts", "experiments"):
            return None if (ROOT / ref).exists() or parts[0] == "tests" else f"{ref}: no such file"
        parts = parts[1:] if parts[0] == "anatomy_cli" else parts
        if len(parts) == 1:  # x.py: a module of the room the text is in, or a file at the top
            here = room.split(".")[0]
            if f"{here}.{parts[0]}" in MODULES or (ROOT / ref).exists():
                return None
            elsewhere = [m.replace(".", "/") + ".py" for m in BY_STEM.get(parts[0], []) if "." in m]
            hint = f" (another room's: {', '.join(elsewhere)})" if elsewhere else ""
            return f"{ref}: no module {here}/{ref}{hint}"
        return None if ".".join(parts) in MODULES else f"{ref}: no such module"
    parts = ref.split(".")
    if parts[-1] in FILE_SUFFIXES:
        return None
    if parts[0] == "anatomy_cli":
        rest = parts[1:]
        for i in range(len(rest), 0, -1):  # the longest module prefix, then attributes
            if ".".join(rest[:i]) in MODULES:
                return None if resolves_module(".".join(rest[:i]), rest[i:]) else f"{ref}: no such name"
        return f"{ref}: no such module"
    head = parts[0]
    if head not in BY_STEM or head in LIBRARIES:
        return None  # not the package's (np.mean, torch.nn), or a library's that shares a stem
    if head in SETTINGS and f"{head}.{parts[1]}" not in MODULES and parts[1] not in DEFINED[head]:
        return None  # model.n_layer, data.source: a setting; model.norm.weight: a tensor of a state dict
    if parts[1] in PLACEHOLDERS or (head in TABLES and parts[1] in TABLES[head].model_fields):
        return None  # components.NAME, decide.budget: a spec's table and key
    if any(resolves_module(m, parts[1:]) for m in BY_STEM[head]):
        return None
    return f"{ref}: not a module or name of {' / '.join('anatomy_cli.' + m for m in BY_STEM[head])}"


def stale(name: str) -> list[str]:
    """'src/anatomy_cli/room/module.py:LINE: why' for each reference of a module's texts that does not resolve."""
    path, out = FILES[name], []
    for first, text in texts(path):
        for m in [*DOTTED.finditer(text), *PATH.finditer(text)]:
            why, at = problem(m[1].rstrip("."), name), first + text.count("\n", 0, m.start())
            line = f"{path.relative_to(ROOT)}:{at}: {why}"
            if why and line not in out:
                out.append(line)
    return sorted(out, key=lambda line: int(line.split(":")[1]))


@pytest.mark.parametrize("name", sorted(FILES))
def test_docstrings_and_comments_name_modules_that_exist(name):
    assert not stale(name), "stale references:\n" + "\n".join(stale(name))


if __name__ == "__main__":  # every stale reference, one a line
    print(*(line for n in sorted(FILES) for line in stale(n)), sep="\n")

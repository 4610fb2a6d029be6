"""The package's layout holds: a few rooms at the top, imports one way between them, no circles, and
docs/layout.md says what the package's own docstrings say, and tests/ mirrors the rooms
(tests/ROOM/test_MODULE.py; suites across rooms in tests/behaviour/).

Every import of anatomy_cli is read from the source (inside functions too: an import hidden in a
function to dodge a circle is a circle), so nothing here depends on what a test happened to import.
"""

from __future__ import annotations

import ast
import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

import anatomy_cli

PKG = Path(anatomy_cli.__file__).parent
ROOT = PKG.parents[1]
# Top to bottom: a subpackage may import those below it, never one above it or beside it.
ORDER = ["cli", "study", "report", "sweep", "exams", "training", ("model", "data"), "store", "spec"]
RANK = {name: len(ORDER) - i for i, names in enumerate(ORDER) for name in ((names,) if isinstance(names, str)
                                                                            else names)}
SUBPACKAGES = sorted(RANK)
TORCH_FREE = ("spec", "store", "report", "study")  # --help, --dry-run and report stay instant


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PKG.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PKG.rglob("*.py"))}


def imports(name: str) -> list[tuple[str, int, bool]]:
    """(imported module, line, at module level) for every anatomy_cli import in a module."""
    path = MODULES[name]
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    top = {id(node) for node in tree.body}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
        elif isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        else:
            continue
        out += [(t, node.lineno, id(node) in top) for t in targets if t.startswith("anatomy_cli.") and t in MODULES]
    return out


def room(name: str) -> str | None:
    """The subpackage a module lives in (None: the package's own __init__/__main__)."""
    parts = name.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and parts[1] in RANK) else None


def test_at_most_ten_rooms_at_the_top_and_no_loose_module():
    entries = sorted(p.name for p in PKG.iterdir() if p.name != "__pycache__" and not p.name.startswith("."))
    rooms = [e for e in entries if (PKG / e).is_dir()]
    assert len(rooms) <= 10, rooms
    assert set(rooms) == set(SUBPACKAGES)
    assert set(entries) - set(rooms) <= {"__init__.py", "__main__.py"}, "a module at the top belongs in a room"


def test_no_import_runs_against_the_direction():
    bad = []
    for name in MODULES:
        here = room(name)
        for target, line, _ in imports(name):
            there = room(target)
            if here and there and here != there and RANK[here] <= RANK[there]:
                bad.append(f"{name}:{line} imports {target} ({here} may not import {there})")
    assert not bad, "\n".join(bad)


def find_circle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle of the graph, or None (depth-first search, iterative)."""
    state: dict[str, int] = {}
    for start in graph:
        if state.get(start):
            continue
        stack = [(start, iter(sorted(graph[start])))]
        path = [start]
        state[start] = 1
        while stack:
            node, children = stack[-1]
            child = next(children, None)
            if child is None:
                state[node] = 2
                stack.pop()
                path.pop()
            elif state.get(child) == 1:
                return path[path.index(child):] + [child]
            elif not state.get(child):
                state[child] = 1
                path.append(child)
                stack.append((child, iter(sorted(graph.get(child, ())))))
    return None


def test_no_import_circle_between_modules_inside_functions_included():
    graph = {name: {t for t, _, _ in imports(name) if t != name} for name in MODULES}
    # a package's __init__ is imported with each of its modules: only its own imports count, as edges
    circle = find_circle(graph)
    assert circle is None, " -> ".join(circle)


def test_the_circle_check_finds_a_circle():
    assert find_circle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_circle({"a": {"b"}, "b": set()}) is None


@pytest.mark.process
@pytest.mark.parametrize("package", SUBPACKAGES)
def test_each_subpackage_imports_alone_in_a_fresh_interpreter(package):
    """`python -c "import anatomy_cli.PKG"`: nothing it needs is left for another module to import first."""
    subprocess.run([sys.executable, "-c", f"import anatomy_cli.{package}"], capture_output=True, text=True,
                   check=True)


@pytest.mark.parametrize("package", SUBPACKAGES)
def test_each_subpackage_says_what_lives_there(package):
    module = importlib.import_module(f"anatomy_cli.{package}")
    doc = module.__doc__ or ""
    assert "Imports:" in doc, f"anatomy_cli/{package}/__init__.py must say what it may import"
    heads = [re.split(r"\s{2,}", line.strip())[0] for line in doc.splitlines() if re.match(r"^  \S", line)]
    listed = {word.strip() for head in heads for word in head.split("/")}
    own = {p.stem for p in (PKG / package).glob("*.py") if p.stem != "__init__"}
    assert own <= listed | {"__init__"}, f"{package}: modules its docstring does not name: {sorted(own - listed)}"


@pytest.mark.process
@pytest.mark.parametrize("package", TORCH_FREE)
def test_light_rooms_never_import_torch(package):
    names = [n for n in MODULES if room(n) == package]
    code = f"import sys; import {', '.join(names)}; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False", f"importing anatomy_cli.{package} imported torch"


def test_docs_layout_page_lists_each_subpackage_as_its_docstring_says():
    """docs/layout.md holds each subpackage's docstring between markers, so the page cannot drift:
    `anatomy results docs/layout.md` is not it; tests/test_layout.py checks it
    against the code, and python tests/test_layout.py rewrites it."""
    page = (ROOT / "docs" / "layout.md").read_text(encoding="utf-8")
    assert page == layout_page(page), ("docs/layout.md differs from the package's docstrings: "
                                       "python tests/test_layout.py")


TESTS = Path(__file__).resolve().parent
HOUSE_TESTS = {"test_layout.py", "test_docs.py", "test_docstring_names.py"}  # the house's own (its layout, its
# docs, the names its docstrings give) stay at the top


def misplaced_tests(tests: Path, rooms: set[str]) -> list[str]:
    """Where tests/ stops mirroring the package: a folder that is neither a room (a subpackage) nor
    behaviour/ (the suites that span rooms), a folder without __init__.py or below a room, a test
    file at the top other than the house's own. The test of anatomy_cli/ROOM/MOD.py is tests/ROOM/test_MOD.py."""
    bad = []
    for path in sorted(tests.rglob("*")):
        rel = path.relative_to(tests)
        if "__pycache__" in rel.parts or any(part.startswith(".") for part in rel.parts):
            continue
        if path.is_dir():
            if len(rel.parts) > 1 or rel.name not in rooms | {"behaviour"}:
                bad.append(f"tests/{rel.as_posix()}/: neither a subpackage of anatomy_cli nor behaviour/")
            elif not (path / "__init__.py").is_file():
                bad.append(f"tests/{rel.as_posix()}/: no __init__.py")
        elif len(rel.parts) == 1 and path.name.startswith("test_") and path.name not in HOUSE_TESTS:
            bad.append(f"tests/{rel.as_posix()}: a module's test lives in tests/ROOM/, a suite across rooms in "
                       "tests/behaviour/")
    return bad


# Modules whose tests live elsewhere (in a suite of the room, or across rooms in behaviour/) rather than in
# tests/ROOM/test_MODULE.py. The list only shrinks: a new module comes with its own test file, and a module that
# gains one leaves the list (the test below fails on a name listed here that has its file now).
WITHOUT_OWN_TEST = {
    "cli/app", "cli/exams", "cli/run", "cli/scale_plan", "cli/sweep", "cli/tools", "data/batches", "data/load",
    "data/prepared", "exams/decode", "exams/kv_budget", "exams/lengths", "exams/stability", "model/block", "model/ffn",
    "model/generate", "model/norms", "model/positions", "report/figures", "report/page", "report/results_blocks",
    "report/results_build", "report/results_file", "report/sections", "report/textable", "spec/errors",
    "spec/reference", "spec/roles", "store/summary", "study/sizes", "sweep/jobs", "sweep/worker",
}


def modules_without_own_test(pkg: Path, tests: Path) -> set[str]:
    """ROOM/MODULE of each module of the package with no tests/ROOM/test_MODULE.py."""
    out = set()
    for path in sorted(pkg.rglob("*.py")):
        rel = path.relative_to(pkg)
        if len(rel.parts) == 2 and path.stem not in ("__init__", "__main__"):
            if not (tests / rel.parts[0] / f"test_{path.stem}.py").is_file():
                out.add(f"{rel.parts[0]}/{path.stem}")
    return out


def test_every_module_has_a_test_file_named_after_it_but_a_shrinking_few():
    missing = modules_without_own_test(PKG, TESTS)
    assert missing <= WITHOUT_OWN_TEST, f"no tests/ROOM/test_MODULE.py: {sorted(missing - WITHOUT_OWN_TEST)}"
    assert WITHOUT_OWN_TEST <= missing, f"these have their test file now: drop them from WITHOUT_OWN_TEST: " \
        f"{sorted(WITHOUT_OWN_TEST - missing)}"


def test_tests_mirror_the_rooms():
    rooms = {p.name for p in PKG.iterdir() if (p / "__init__.py").is_file()}
    bad = misplaced_tests(TESTS, rooms)
    assert not bad, "\n".join(bad)


def test_the_mirror_check_finds_a_stray_folder_a_deeper_one_and_a_test_at_the_top(tmp_path):
    for folder in ("model", "behaviour", "tools", "model/deeper", "cli"):
        (tmp_path / folder).mkdir()
    for file in ("model/__init__.py", "behaviour/__init__.py", "conftest.py", "helpers.py", "test_layout.py",
                 "test_mla.py"):
        (tmp_path / file).touch()
    assert misplaced_tests(tmp_path, {"model", "cli"}) == [
        "tests/cli/: no __init__.py",
        "tests/model/deeper/: neither a subpackage of anatomy_cli nor behaviour/",
        "tests/test_mla.py: a module's test lives in tests/ROOM/, a suite across rooms in tests/behaviour/",
        "tests/tools/: neither a subpackage of anatomy_cli nor behaviour/",
    ]
    for file in ("cli/__init__.py",):
        (tmp_path / file).touch()
    (tmp_path / "test_mla.py").unlink()
    (tmp_path / "model" / "deeper").rmdir()
    (tmp_path / "tools").rmdir()
    assert misplaced_tests(tmp_path, {"model", "cli"}) == []


MARK = re.compile(r"(<!-- layout (?P<pkg>\w+) -->\n)(?P<body>.*?)(<!-- /layout -->)", re.DOTALL)


def layout_page(page: str) -> str:
    """The page with every `<!-- layout PKG -->` block rewritten from anatomy_cli/PKG's docstring."""
    def block(m: re.Match) -> str:
        doc = importlib.import_module(f"anatomy_cli.{m['pkg']}").__doc__.strip("\n")
        return f"{m.group(1)}```\nanatomy_cli/{m['pkg']}/\n{doc}\n```\n{m.group(4)}"
    found = {m["pkg"] for m in MARK.finditer(page)}
    assert found == set(SUBPACKAGES), f"docs/layout.md blocks: missing {sorted(set(SUBPACKAGES) - found)}"
    return MARK.sub(block, page)


if __name__ == "__main__":  # rewrite docs/layout.md's blocks from the docstrings
    path = ROOT / "docs" / "layout.md"
    path.write_text(layout_page(path.read_text(encoding="utf-8")), encoding="utf-8")

"""The layout of `lmcore/`: imports run downward only, with no circle, not even through an import
inside a function; no module reaches the package root for its version; files stay readable.

The import graph is read from the source with `ast`, never by importing: an edge is every
`import` statement of a module, wherever it sits (function bodies included), except under
`if TYPE_CHECKING:`. Two edges Python adds by itself are counted too: importing `a.b.c` first
runs the packages `a` and `a.b`, and a name taken from a lazy package (`lmcore.data`,
`lmcore.hf`, ... whose `lmcore.lazy.attach` imports it on first use) comes from the module that
package's `TYPE_CHECKING` block names for it.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from lmcore.lazy import listed

ROOT = Path(__file__).resolve().parents[1] / "lmcore"

# Each room of the house and its floor: a module may import rooms on its own floor and below,
# never above (and, by the circle test, never in a circle).
FLOORS: dict[str, int] = {
    "lmcore": 0,  # the package root: its lazy public names are exempt (the API, not a dependency)
    "lmcore.errors": 0,
    "lmcore.atomic": 0,
    "lmcore.jsonfile": 0,
    "lmcore.lazy": 0,
    "lmcore.locks": 0,
    "lmcore.runfiles": 0,  # file names and paths: where runs, checkpoints and tokenizers lie
    "lmcore.version": 0,
    "lmcore.spec": 1,
    "lmcore.syntax": 1,
    "lmcore.components": 1,
    "lmcore.interfaces": 1,
    "lmcore.hookspecs": 1,
    "lmcore.tokenizer": 1,
    "lmcore.registry": 2,
    "lmcore.blueprint": 2,
    "lmcore.parts": 2,
    "lmcore.data": 3,
    "lmcore.model": 3,
    "lmcore.describe": 4,
    "lmcore.checkpoint": 4,
    "lmcore.hf": 5,
    "lmcore.gguf": 5,
    "lmcore.sources": 5,  # what a command's model argument names (it reads Hugging Face configs)
    "lmcore.train": 6,
    "lmcore.testing": 6,
    "lmcore.eval": 6,
    "lmcore.cli": 7,
    "lmcore.__main__": 8,
}
MAX_LINES = 950
MAX_CLI_LINES = 400


@dataclass(frozen=True)
class Module:
    name: str
    path: Path
    tree: ast.Module

    @property
    def is_package(self) -> bool:
        return self.path.name == "__init__.py"


@functools.cache
def modules(root: Path = ROOT) -> dict[str, Module]:
    found = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = Module(name, path, ast.parse(path.read_text(encoding="utf-8")))
    return found


def _is_type_checking(node: ast.If) -> bool:
    return "TYPE_CHECKING" in ast.unparse(node.test)


def _imports(node: ast.AST, *, type_checking: bool) -> Iterator[ast.Import | ast.ImportFrom]:
    """Import statements under `node`; those under `if TYPE_CHECKING:` only when asked for."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and _is_type_checking(child):
            if type_checking:
                for inner in child.body:
                    yield from _imports(
                        ast.Module(body=[inner], type_ignores=[]), type_checking=True
                    )
            continue
        if isinstance(child, (ast.Import, ast.ImportFrom)):
            yield child
        yield from _imports(child, type_checking=type_checking)


def _absolute(module: Module, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.name.split(".")
    if not module.is_package:
        base = base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, *([node.module] if node.module else [])])


def _lazy_names(package: Module, mods: dict[str, Module]) -> dict[str, str]:
    """{name: defining module} of a package that imports its names on first use: one that
    calls `lmcore.lazy.attach`, its names read from its `TYPE_CHECKING` block as `attach`
    reads them."""
    attaches = any(
        isinstance(n, ast.Assign) and isinstance(n.value, ast.Call)
        and isinstance(n.value.func, ast.Name) and n.value.func.id == "attach"
        for n in package.tree.body
    )  # fmt: skip
    if not (package.is_package and attaches):
        return {}
    source = package.path.read_text(encoding="utf-8")
    where = {name: module for name, (module, _) in listed(source, package.name).items()}
    return {k: v for k, v in where.items() if v in mods}


@dataclass(frozen=True)
class Edge:
    source: str
    target: str
    line: int
    how: str  # "import", "parent package", "lazy name"


def edges(mods: dict[str, Module]) -> list[Edge]:
    lazy = {name: _lazy_names(m, mods) for name, m in mods.items()}
    out: list[Edge] = []

    def add(source: str, target: str, line: int, how: str) -> None:
        if target in mods and target != source:
            out.append(Edge(source, target, line, how))
        parts = target.split(".")
        for n in range(1, len(parts)):  # importing a.b.c runs a and a.b first
            parent = ".".join(parts[:n])
            if parent in mods and parent != source and not source.startswith(parent + "."):
                out.append(Edge(source, parent, line, "parent package"))

    for name, m in mods.items():
        for stmt in _imports(m.tree, type_checking=False):
            if isinstance(stmt, ast.Import):
                for a in stmt.names:
                    if a.name.split(".")[0] == "lmcore":
                        add(name, a.name, stmt.lineno, "import")
                continue
            base = _absolute(m, stmt)
            if base.split(".")[0] != "lmcore":
                continue
            for a in stmt.names:
                sub = f"{base}.{a.name}"
                if sub in mods:
                    add(name, sub, stmt.lineno, "import")
                elif a.name in lazy.get(base, {}):
                    add(name, base, stmt.lineno, "import")
                    add(name, lazy[base][a.name], stmt.lineno, "lazy name")
                else:
                    add(name, base, stmt.lineno, "import")
        for target in lazy[name].values():  # a lazy package imports its names when asked
            out.append(Edge(name, target, 0, "lazy name"))
    return out


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected set of more than one module, each as one circle through it."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(_circle_through(sorted(group), graph))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _circle_through(group: list[str], graph: dict[str, set[str]]) -> list[str]:
    """A shortest path from the group's first module back to itself, inside the group."""
    start, members = group[0], set(group)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph.get(v, ())):
                if w == start:
                    return [*paths[v], start]
                if w in members and w not in paths:
                    paths[w] = [*paths[v], w]
                    nxt.append(w)
        frontier = nxt
    return group


def graph_of(found: list[Edge]) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for e in found:
        graph.setdefault(e.source, set()).add(e.target)
    return graph


def room(name: str) -> str:
    parts = name.split(".")
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in FLOORS:
            return ".".join(parts[:n])
    raise KeyError(name)


# ------------------------------------------------------------------------------ the tests


def test_no_import_circle_among_lmcores_modules() -> None:
    found = circles(graph_of(edges(modules())))
    assert not found, "import circles: " + "; ".join(" → ".join(c) for c in found)


def test_the_circle_finder_names_a_circle_through_a_function_level_import(tmp_path: Path) -> None:
    pkg = tmp_path / "lmcore"
    (pkg / "model").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "model" / "__init__.py").write_text('"""A package with no imports."""\n')
    (pkg / "model" / "net.py").write_text(
        "from lmcore.counting import check\n\ndef build():\n    return check()\n"
    )
    (pkg / "counting.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from lmcore.model.net import x\n"
        "def check():\n    from lmcore.model.net import build\n    return build\n"
    )
    (pkg / "other.py").write_text("from lmcore.counting import check\n")
    found = circles(graph_of(edges(modules(pkg))))
    assert found == [["lmcore.counting", "lmcore.model.net", "lmcore.counting"]]


def test_imports_run_down_the_floors_of_the_house() -> None:
    mods = modules()
    assert set(map(room, mods)) <= set(FLOORS)
    upward = {
        f"{e.source} (floor {FLOORS[room(e.source)]}) imports {e.target} (floor "
        f"{FLOORS[room(e.target)]}) at line {e.line}"
        for e in edges(mods)
        if e.source != "lmcore"  # the root's lazy names are the public API
        and FLOORS[room(e.target)] > FLOORS[room(e.source)]
    }
    assert not upward, "imports that run up:\n" + "\n".join(sorted(upward))


def test_no_module_imports_the_package_root() -> None:
    mods = modules()
    found = []
    for name, m in mods.items():
        for stmt in _imports(m.tree, type_checking=True):
            if isinstance(stmt, ast.Import) and any(a.name == "lmcore" for a in stmt.names):
                found.append(f"{name}:{stmt.lineno}: import lmcore")
            if isinstance(stmt, ast.ImportFrom) and _absolute(m, stmt) == "lmcore":
                names = [a.name for a in stmt.names if f"lmcore.{a.name}" not in mods]
                if names:
                    found.append(f"{name}:{stmt.lineno}: from lmcore import {', '.join(names)}")
    assert not found, "modules reaching the package root (import from lmcore.version etc.):\n" + (
        "\n".join(found)
    )


def test_the_model_imports_nothing_above_it() -> None:
    above = [
        f"{e.source} imports {e.target} (line {e.line})"
        for e in edges(modules())
        if e.source.startswith("lmcore.model")
        and FLOORS[room(e.target)] > FLOORS["lmcore.registry"]
        and not e.target.startswith("lmcore.model")
    ]
    assert not above, "\n".join(above)


def test_no_file_is_too_long_to_read() -> None:
    long = []
    for name, m in modules().items():
        n = len(m.path.read_text(encoding="utf-8").splitlines())
        limit = MAX_CLI_LINES if name.startswith("lmcore.cli") else MAX_LINES
        if n > limit:
            long.append(f"{m.path.relative_to(ROOT.parent)}: {n} lines (limit {limit})")
    assert not long, "\n".join(long)


@pytest.mark.parametrize("name", sorted(modules()))
def test_every_module_says_what_it_is_for(name: str) -> None:
    m = modules()[name]
    doc = ast.get_docstring(m.tree)
    assert doc and doc.strip(), f"{m.path}: no docstring saying what the module is for"


def test_every_top_level_room_is_listed_with_its_floor() -> None:
    top = {
        p.stem if p.is_file() else p.name
        for p in ROOT.iterdir()
        if p.suffix == ".py" or (p.is_dir() and (p / "__init__.py").is_file())
    }
    rooms = {("lmcore" if t == "__init__" else f"lmcore.{t}") for t in top}
    assert rooms == set(FLOORS)

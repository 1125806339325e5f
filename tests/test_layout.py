"""The layout of `lmcore/`: imports run downward only, with no circle, not even through an import
inside a function or for a type; each room has its floor and every file is named in the
layout table of docs/contributing.md; no module reaches the package root for its version;
files stay readable.

The import graph is read from the source with `ast`, never by importing: an edge is every
`import` statement of a module, wherever it sits (function bodies and `if TYPE_CHECKING:`
blocks included: a circle of annotations is a circle of the design). Two edges Python adds by itself are counted too: importing `a.b.c` first
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
    "lmcore.blueprint": 3,
    "lmcore.parts": 3,
    "lmcore.data": 4,
    "lmcore.model": 5,
    "lmcore.describe": 6,
    "lmcore.checkpoint": 6,
    "lmcore.hf": 7,
    "lmcore.sources": 8,  # what a command's model argument names (it reads Hugging Face configs)
    "lmcore.quantizing": 6,  # a float model to a quantized one: builds it (lmcore.model)
    "lmcore.adapting": 8,  # adapters on checkpoints: it loads bases (lmcore.sources)
    "lmcore.gguf": 9,
    "lmcore.train": 10,
    "lmcore.testing": 11,  # above train: the kit builds optimizers and schedules as it does
    "lmcore.ladder": 12,  # above train and the kit: a ladder's runs are a sweep's; its fits
    "lmcore.eval": 13,
    "lmcore.cli": 14,
    "lmcore.__main__": 15,
}
# Imports under `if TYPE_CHECKING:` count like any other: a type-level circle is a circle.
TYPE_CHECKING_TOO = True
MAX_LINES = 700
MAX_CLI_LINES = 400
# Files allowed past MAX_LINES for now, and why.
LONG_FOR_NOW = {
    "lmcore/train/trainer.py": "the trainer is reshaped when optimizers and schedules become kinds",
}


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
        for stmt in _imports(m.tree, type_checking=TYPE_CHECKING_TOO):
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


def test_the_circle_finder_counts_imports_made_for_types(tmp_path: Path) -> None:
    pkg = tmp_path / "lmcore"
    (pkg / "model").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "model" / "__init__.py").write_text('"""A package with no imports."""\n')
    (pkg / "model" / "cache.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
        "    from lmcore.model.transformer import TransformerLM\n"
    )
    (pkg / "model" / "transformer.py").write_text("from lmcore.model.cache import KVCache\n")
    found = circles(graph_of(edges(modules(pkg))))
    assert found == [["lmcore.model.cache", "lmcore.model.transformer", "lmcore.model.cache"]]


def test_each_subpackage_has_a_floor_of_its_own() -> None:
    packages = [r for r in FLOORS if (ROOT.parent / r.replace(".", "/") / "__init__.py").is_file()]
    floors = [FLOORS[p] for p in packages if p != "lmcore"]
    shared = {f: [p for p in packages if FLOORS[p] == f] for f in floors if floors.count(f) > 1}
    assert not shared, f"subpackages sharing a floor: {shared}"


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
        and FLOORS[room(e.target)] > FLOORS["lmcore.blueprint"]
        and not e.target.startswith("lmcore.model")
    ]
    assert not above, "\n".join(above)


@pytest.mark.parametrize("module", ["spec.py", "syntax.py"])
def test_spec_modules_are_grammar_only(module: str) -> None:
    source = (ROOT / module).read_text(encoding="utf-8")
    imported = {
        node.module
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.ImportFrom) and node.module
    }
    assert not {m for m in imported if m.startswith(("lmcore.registry", "lmcore.blueprint"))}
    # The grammar of keys, nested components and layer selections, and the canonical form.
    assert len(source.splitlines()) < 600


def test_no_file_is_too_long_to_read() -> None:
    long = []
    for name, m in modules().items():
        n = len(m.path.read_text(encoding="utf-8").splitlines())
        limit = MAX_CLI_LINES if name.startswith("lmcore.cli") else MAX_LINES
        where = m.path.relative_to(ROOT.parent).as_posix()
        if n > limit and where not in LONG_FOR_NOW:
            long.append(f"{where}: {n} lines (limit {limit})")
    assert not long, "\n".join(long)


def test_the_files_allowed_to_be_long_are_still_long() -> None:
    stale = [
        f for f in LONG_FOR_NOW if len((ROOT.parent / f).read_text().splitlines()) <= MAX_LINES
    ]
    assert not stale, f"no longer past {MAX_LINES} lines, drop from LONG_FOR_NOW: {stale}"


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


LAYOUT_PAGE = ROOT.parent / "docs" / "contributing.md"


def _layout_rows() -> list[tuple[str, str]]:
    """(path cell, whole row) of each row of the layout table under the page's "Layout" heading."""
    text = LAYOUT_PAGE.read_text(encoding="utf-8")
    section = text.split("\n## Layout\n", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        if line.startswith("| `"):
            rows.append((line.split(" | ")[0], line))
    return rows


def named_in_layout(path: str, rows: list[tuple[str, str]]) -> bool:
    """Whether the layout table names `path` (relative to the repository): in a path cell, as
    `lmcore/a/b.py`, or as `b.py` in the row of its directory `lmcore/a/` (a package's
    `__init__.py` is named by its directory's row)."""
    folder, _, file = path.rpartition("/")
    for cell, row in rows:
        if f"`{path}`" in cell:
            return True
        if f"`{folder}/`" in cell and (file == "__init__.py" or f"`{file}`" in row):
            return True
        # a cell naming siblings: `lmcore/errors.py`, `atomic.py`
        if f"`{folder}/" in cell and f"`{file}`" in cell:
            return True
    return False


def test_every_file_of_lmcore_is_named_in_the_layout_table() -> None:
    rows = _layout_rows()
    paths = sorted(m.path.relative_to(ROOT.parent).as_posix() for m in modules().values())
    unnamed = [p for p in paths if not named_in_layout(p, rows)]
    assert not unnamed, f"files {LAYOUT_PAGE.name}'s layout table does not name: {unnamed}"


def test_the_layout_check_needs_the_file_itself_named() -> None:
    rows = [
        ("| `lmcore/hf/`", "| `lmcore/hf/` | families: `llama.py`, `mistral.py` |"),
        ("| `lmcore/errors.py`, `atomic.py`", "| `lmcore/errors.py`, `atomic.py` | ... |"),
    ]
    assert named_in_layout("lmcore/hf/llama.py", rows)
    assert named_in_layout("lmcore/hf/__init__.py", rows)
    assert named_in_layout("lmcore/atomic.py", rows)
    assert not named_in_layout("lmcore/hf/gemma.py", rows)
    assert not named_in_layout("lmcore/jsonfile.py", rows)


def test_every_room_is_in_the_readmes_layout_table() -> None:
    text = (ROOT.parent / "README.md").read_text(encoding="utf-8")
    section = text.split("\n## Layout\n", 1)[1].split("\n## ", 1)[0]
    cells = [line.split(" | ")[0] for line in section.splitlines() if line.startswith("| `")]
    missing = []
    for name in sorted(FLOORS):
        path = "lmcore/__init__.py" if name == "lmcore" else name.replace(".", "/")
        is_package = (ROOT.parent / path / "__init__.py").is_file()
        rows = [
            c
            for c in cells
            if (f"`{path}/`" if is_package else f"{path.rpartition('/')[2]}.py`") in c
        ]
        if not rows and name != "lmcore":
            missing.append(name)
    assert not missing, f"rooms README.md's layout table does not name: {missing}"
